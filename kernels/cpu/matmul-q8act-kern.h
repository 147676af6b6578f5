/* matmul-q8act-kern.h — the tiled loop of the integer matmul path (matmul-q8act.h), included
 * by matmul-q8act.c (generic build) and matmul-q8act-avx2.c (AVX2+FMA+F16C), once per weight
 * format; the including file supplies how a format's blocks are unpacked and how 32 byte pairs
 * are multiplied. Not a public header.
 *
 * The arithmetic of one output y[t][j] (row j of W, activation row t), over the stored blocks
 * sb = 0, 1, … of the row in order (a block of 32 weights, or a K-quant super-block of 8 groups
 * of 32, against the activation block of the same 32 or 256 values):
 *   lanes l = 0..7 of int32: s_l = Σ_g Σ_{h=0,1} sc[g][2l+h] · (w[32g+4l+2h]·q[32g+4l+2h] +
 *                                                               w[32g+4l+2h+1]·q[32g+4l+2h+1])
 *     (exact integers: w the block's integer weight, q8 the activation's 8-bit value, sc the
 *     int16 scale of each pair: 1 for the blocks of 32, the 6-bit group scale for Q4_K, the
 *     int8 scale of each 16 for Q6_K);
 *   a_l = fma(f32(dw) · d_x, f32(s_l), a_l)      (dw · d_x one rounded product)
 *   m   = fma(coef, val, m)                      (formats with a min only: Q4_1/Q5_1 coef = f32(m_w),
 *                                                 val = the activation block's s; Q4_K coef =
 *                                                 -(f32(dmin)·d_x), val = f32(Σ_g mn[g]·(bsum[2g] +
 *                                                 bsum[2g+1])))
 *   y = (((a_0 + a_1) + (a_2 + a_3)) + ((a_4 + a_5) + (a_6 + a_7))) (+ m with a min)
 * with a_l and m starting at 0. Micro-tiles (1 row × 1 activation row for decode, 2 × 4, 2 × 1,
 * 1 × 1) only interleave independent accumulators, so an element never depends on T, on its
 * neighbours, or on the thread running its rows.
 *
 * The including file defines, then #undefs after the inclusion:
 *   KA_NAME(x)        the kernel's function names
 *   KA_FMT            the weight format, one of ZS_KA_Q8_0 .. ZS_KA_Q6_K below (this header
 *                     derives KA_BYTES, KA_NG (groups of 32 per stored block), KA_MIN (a min
 *                     term), KA_SIGNED (signed integer weights, else unsigned bytes) from it,
 *                     and reads the scales and mins)
 *   KA_D(h)           the f16 bits h as a float (exact)
 *   KA_W(b, g)        group g's 32 integer weights of the stored block at b as a zs_ka_i8
 *   KA_DOT(w, x, sc)  the 8 int32 lanes of s above for one group (w as KA_SIGNED says)
 *   KA_FMA8(a, b, c)  lane-wise a·b + c rounded once */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "matmul-q8act.h"

/* decode (T = 1) walks one weight row at a time: a single sequential stream, measured faster than
 * 2 or 4 interleaved rows (80 against 57 tokens/s at q4_0 on the 233M bench model, 2 cores) */
#ifndef ZS_KA_DEC_NR
#define ZS_KA_DEC_NR 1
#endif




#define KA_BYTES (KA_FMT == ZS_KA_Q8_0 ? 34 : KA_FMT == ZS_KA_Q4_0 ? 18 : KA_FMT == ZS_KA_Q4_1 ? 20 : \
                  KA_FMT == ZS_KA_Q5_0 ? 22 : KA_FMT == ZS_KA_Q5_1 ? 24 : KA_FMT == ZS_KA_Q4_K ? 144 : 210)
#define KA_NG (KA_FMT == ZS_KA_Q4_K || KA_FMT == ZS_KA_Q6_K ? 8 : 1)
#define KA_MIN (KA_FMT == ZS_KA_Q4_1 || KA_FMT == ZS_KA_Q5_1 || KA_FMT == ZS_KA_Q4_K)
#define KA_SIGNED (KA_FMT == ZS_KA_Q8_0 || KA_FMT == ZS_KA_Q4_0 || KA_FMT == ZS_KA_Q5_0 || KA_FMT == ZS_KA_Q6_K)

static inline __attribute__((always_inline)) void KA_NAME(prep)(const uint8_t *b, zs_ka_ctx *c) {
    uint16_t h;
    if (KA_FMT == ZS_KA_Q6_K) {
        memcpy(&h, b + 208, 2);
        c->d = KA_D(h);
        c->s6 = (const int8_t *)(b + 192);
        return;
    }
    memcpy(&h, b, 2);
    c->d = KA_D(h);
    if (KA_MIN) {
        memcpy(&h, b + 2, 2);
        c->m = KA_D(h);
    }
    if (KA_FMT == ZS_KA_Q4_K) { /* get_scale_min_k4 */
        const uint8_t *q = b + 4;
        for (int j = 0; j < 8; j++)
            if (j < 4) {
                c->sc[j] = q[j] & 63;
                c->mn[j] = q[j + 4] & 63;
            } else {
                c->sc[j] = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
                c->mn[j] = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
            }
    }
}

/* group g's pair scales: 1; Q4_K the group's scale; Q6_K scales[2g] for its first 16, [2g+1] after */
static inline __attribute__((always_inline)) zs_ka_i16 KA_NAME(sc)(const zs_ka_ctx *c, int g) {
    zs_ka_i16 z = {0};
    if (KA_FMT == ZS_KA_Q4_K) return z + (int16_t)c->sc[g];
    if (KA_FMT == ZS_KA_Q6_K) {
        zs_ka_i16 lo = z + (int16_t)c->s6[2 * g], hi = z + (int16_t)c->s6[2 * g + 1];
        const zs_ka_i16 half = {0, 0, 0, 0, 0, 0, 0, 0, -1, -1, -1, -1, -1, -1, -1, -1};
        return (lo & ~half) | (hi & half);
    }
    return z + 1;
}

static inline __attribute__((always_inline)) float KA_NAME(mterm)(const zs_ka_ctx *c, const zs_q8a *a, int row,
                                                                  int sb, float m) {
    if (KA_FMT == ZS_KA_Q4_K) {
        const int16_t *bs = a->bs + (size_t)row * (a->in / 16) + (size_t)sb * 16;
        int s = 0;
        for (int g = 0; g < 8; g++) s += (int)c->mn[g] * (bs[2 * g] + bs[2 * g + 1]);
        float coef = -(c->m * a->d[(size_t)row * a->nb + sb]);
        return __builtin_fmaf(coef, (float)s, m);
    }
    return __builtin_fmaf(c->m, a->s[(size_t)row * a->nb + sb], m);
}

/* NR weight rows × NT activation rows (NR, NT constants at every call) */
static inline __attribute__((always_inline)) void KA_NAME(tile)(float *y, int ldy, const zs_q8a *a, int t,
                                                                const uint8_t *w, size_t rb, int nsb,
                                                                const int NR, const int NT) {
    zs_ka_f32 acc[4][4];
    float mac[4][4];
    const int8_t *xq[4];
    const float *xd[4];
#pragma GCC unroll 4
    for (int u = 0; u < NT; u++) {
        xq[u] = a->q + (size_t)(t + u) * a->in;
        xd[u] = a->d + (size_t)(t + u) * a->nb;
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            acc[r][u] = (zs_ka_f32){0};
            mac[r][u] = 0.0f;
        }
    }
    for (int sb = 0; sb < nsb; sb++) {
        zs_ka_ctx c[4];
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) KA_NAME(prep)(w + (size_t)r * rb + (size_t)sb * KA_BYTES, &c[r]);
        zs_ka_i32 is[4][4];
#pragma GCC unroll 4
        for (int u = 0; u < NT; u++)
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) is[r][u] = (zs_ka_i32){0};
#pragma GCC unroll 8
        for (int g = 0; g < KA_NG; g++) {
            zs_ka_i8 wv[4];
            zs_ka_i16 sc[4];
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) {
                wv[r] = KA_W(w + (size_t)r * rb + (size_t)sb * KA_BYTES, g);
                sc[r] = KA_NAME(sc)(&c[r], g);
            }
#pragma GCC unroll 4
            for (int u = 0; u < NT; u++) {
                zs_ka_i8 xv = *(const zs_ka_i8u *)(xq[u] + ((size_t)sb * KA_NG + g) * 32);
#pragma GCC unroll 4
                for (int r = 0; r < NR; r++) is[r][u] += KA_DOT(wv[r], xv, sc[r]);
            }
        }
#pragma GCC unroll 4
        for (int u = 0; u < NT; u++)
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) {
                float d = c[r].d * xd[u][sb];
                zs_ka_f32 dv = {d, d, d, d, d, d, d, d};
                acc[r][u] = KA_FMA8(dv, __builtin_convertvector(is[r][u], zs_ka_f32), acc[r][u]);
#if KA_MIN
                mac[r][u] = KA_NAME(mterm)(&c[r], a, t + u, sb, mac[r][u]);
#endif
            }
    }
#pragma GCC unroll 4
    for (int u = 0; u < NT; u++)
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            float v = zs_ka_hsum(acc[r][u]);
#if KA_MIN
            v = v + mac[r][u];
#endif
            y[(size_t)u * ldy + r] = v;
        }
    (void)mac;
}

static void KA_NAME(block)(float *y, int ldy, const zs_q8a *a, int t0, int T, const uint8_t *W, int R) {
    int nsb = a->nb;
    size_t rb = (size_t)nsb * KA_BYTES;
    int j = 0;
    if (T == 1)
        for (; j + ZS_KA_DEC_NR <= R; j += ZS_KA_DEC_NR) KA_NAME(tile)(y + j, ldy, a, t0, W + (size_t)j * rb, rb, nsb, ZS_KA_DEC_NR, 1);
    else
        for (; j + 2 <= R; j += 2) {
            int t = 0;
            for (; t + 4 <= T; t += 4)
                KA_NAME(tile)(y + (size_t)t * ldy + j, ldy, a, t0 + t, W + (size_t)j * rb, rb, nsb, 2, 4);
            for (; t < T; t++)
                KA_NAME(tile)(y + (size_t)t * ldy + j, ldy, a, t0 + t, W + (size_t)j * rb, rb, nsb, 2, 1);
        }
    for (; j < R; j++)
        for (int t = 0; t < T; t++)
            KA_NAME(tile)(y + (size_t)t * ldy + j, ldy, a, t0 + t, W + (size_t)j * rb, rb, nsb, 1, 1);
}
#undef KA_BYTES
#undef KA_NG
#undef KA_MIN
#undef KA_SIGNED
