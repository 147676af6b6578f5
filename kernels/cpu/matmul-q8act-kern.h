/* matmul-q8act-kern.h — the tiled loop of the integer matmul path (matmul-q8act.h), included
 * by matmul-q8act.c (generic build), matmul-q8act-avx2.c (AVX2+FMA+F16C) and
 * matmul-q8act-avx512.c (the same 256-bit vectors with AVX-512VL's 32 registers and VNNI), once
 * per weight format; the including file supplies how a format's blocks are unpacked and how 32
 * byte pairs are multiplied. Not a public header.
 *
 * The arithmetic of one output y[t][j] (row j of W, activation row t), over the stored blocks
 * sb = 0, 1, … of the row in order (a block of 32 weights, or a K-quant super-block of 8 groups
 * of 32, against the activation block of the same 32 or 256 values):
 *   S   = Σ_i sc_i · w_i · q_i over the block's values, an exact integer (w the block's integer
 *         weight, q the activation's 8-bit value, sc the integer scale of w's group: 1 for the
 *         blocks of 32, the 6-bit group scale for Q4_K/Q5_K, the scale of each 16 for Q6_K (int8),
 *         Q3_K (6-bit signed) and Q2_K (4-bit));
 *   l   = sb mod 8 (eight chains, the blocks dealt to them in turn)
 *   a_l = fma(f32(dw) · d_x, f32(S), a_l)        (dw · d_x one rounded product; f32(S) rounded to
 *                                                 nearest even)
 *   m_l = fma(coef, val, m_l)                    (formats with a min only: Q4_1/Q5_1 coef = f32(m_w),
 *                                                 val = the activation block's s; Q4_K coef =
 *                                                 -(f32(dmin)·d_x), val = f32(Σ_g mn[g]·(bsum[2g] +
 *                                                 bsum[2g+1])), Q5_K the same; Q2_K coef the same,
 *                                                 val = f32(Σ_j mn[j]·bsum[j]) over its 16 mins)
 *   y   = (((a_0 + a_1) + (a_2 + a_3)) + ((a_4 + a_5) + (a_6 + a_7)))
 *         (+ (((m_0 + m_1) + (m_2 + m_3)) + ((m_4 + m_5) + (m_6 + m_7))) with a min)
 * with every a_l and m_l starting at 0: eight chains, so that a vector of 8 blocks' S advances
 * them in one instruction, and no chain waits on the one before. The integer part may be formed
 * in any order.
 * Here the 32 values of a group are summed in 8 int32 lanes of four (Q4_0 and Q5_0 multiply the
 * unsigned stored values and subtract 8 (16) times the activation's lane sums, KA_OFF; a VNNI
 * build sums four products per lane at once), then across lanes. Micro-tiles (KA_TR rows × KA_TT
 * activation rows, KA_DR rows for decode, and their edges) only interleave independent chains, so
 * an element never depends on T, on its neighbours, or on the thread running its rows. The packed
 * prefill kernels (matmul-q8act-pack.h) compute the same S and the same chain.
 *
 * The including file defines, then #undefs after the inclusion:
 *   KA_NAME(x)        the kernel's function names
 *   KA_FMT            the weight format, one of ZS_KA_Q8_0 .. ZS_KA_Q2_K (this header derives
 *                     KA_BYTES, KA_NG (groups of 32 per stored block), KA_MIN (a min term),
 *                     KA_SIGNED (signed integer weights, else unsigned bytes) and KA_OFF from it)
 *   KA_D(h)           the f16 bits h as a float (exact)
 *   KA_W(b, g)        group g's 32 integer weights of the stored block at b as a zs_ka_i8
 *                     (Q4_0/Q5_0: the unsigned stored values, before the offset)
 *   KA_DOT(acc, w, x, sc)  acc + the 8 int32 lanes of s above for one group (w as KA_SIGNED
 *                     says; sc is all ones for the blocks of 32)
 *   KA_XSUM(x)        the 8 int32 lane sums of x's four bytes (formats with KA_OFF)
 *   KA_ISUM(v)        the sum of the 8 int32 lanes of v (an exact int)
 *   KA_SCV_K4(p)      the 8 bytes at p as int16, in both 128-bit halves
 *   KA_SCV_K6(p)      the 16 int8 at p as int16: the even ones in the low half, the odd high
 *   KA_PICK(v, g)     int16 element g of each 128-bit half of v, broadcast within the half
 *   KA_MN2(p)         the 8 bytes at p as int16, each twice: m0 m0 m1 m1 … m7 m7
 *   KA_MSUM(v, bs)    Σ_i v[i] · bs[i] over 16 int16 (an exact int)
 *   KA_TR, KA_TT, KA_DR  the tile shapes (at most 4 × 4)
 *   KA_PACK           1: rows in whole panels of 8 go to the packed kernel (matmul-q8act-pack.h,
 *                     included next) when T >= 4
 *   KA_DEC            1: decode (T = 1) runs matmul-q8act-pack.h's kernel (a row at a time, 8
 *                     blocks at once) */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "matmul-q8act.h"

#define KA_BYTES (KA_FMT == ZS_KA_Q8_0 ? 34 : KA_FMT == ZS_KA_Q4_0 ? 18 : KA_FMT == ZS_KA_Q4_1 ? 20 : \
                  KA_FMT == ZS_KA_Q5_0 ? 22 : KA_FMT == ZS_KA_Q5_1 ? 24 : KA_FMT == ZS_KA_Q4_K ? 144 : \
                  KA_FMT == ZS_KA_Q5_K ? 176 : KA_FMT == ZS_KA_Q3_K ? 110 : KA_FMT == ZS_KA_Q2_K ? 84 : 210)
#define KA_NG (KA_FMT >= ZS_KA_Q4_K ? 8 : 1) /* the K-quants: 8 groups of 32 */
#define KA_MIN (KA_FMT == ZS_KA_Q4_1 || KA_FMT == ZS_KA_Q5_1 || KA_KMIN)
#define KA_KMIN (KA_FMT == ZS_KA_Q4_K || KA_FMT == ZS_KA_Q5_K || KA_FMT == ZS_KA_Q2_K) /* a min from the bsums */
#define KA_SIGNED (KA_FMT == ZS_KA_Q8_0 || KA_FMT == ZS_KA_Q6_K || KA_FMT == ZS_KA_Q3_K)
#define KA_OFF (KA_FMT == ZS_KA_Q4_0 ? 8 : KA_FMT == ZS_KA_Q5_0 ? 16 : 0)
#define KA_SCALED (KA_FMT >= ZS_KA_Q4_K)

/* a stored block's scales, read once per block and row */
typedef struct {
    float d, m;      /* f32 of d; of m (Q4_1/Q5_1) or dmin (Q4_K/Q5_K/Q2_K) */
    zs_ka_i16 scv;   /* the group scales (KA_SCV_K4 / KA_SCV_K6; Q3_K/Q2_K as Q6_K's) */
    zs_ka_i16 mn2;   /* Q4_K/Q5_K: the group mins, each twice (KA_MN2); Q2_K: its 16 mins in order */
} KA_NAME(ctx);

static inline __attribute__((always_inline)) void KA_NAME(prep)(const uint8_t *b, KA_NAME(ctx) *c) {
    uint16_t h;
    if (KA_FMT == ZS_KA_Q6_K) {
        memcpy(&h, b + 208, 2);
        c->d = KA_D(h);
        c->scv = KA_SCV_K6(b + 192);
        return;
    }
    if (KA_FMT == ZS_KA_Q3_K) { /* the 16 6-bit scales (stored + 32), then as Q6_K's */
        int8_t s[16];
        const uint8_t *q = b + 96;
        for (int i = 0; i < 16; i++) {
            int lo = i < 8 ? q[i] & 0xF : q[i - 8] >> 4, hi = (q[8 + i % 4] >> (2 * (i / 4))) & 3;
            s[i] = (int8_t)((lo | hi << 4) - 32);
        }
        memcpy(&h, b + 108, 2);
        c->d = KA_D(h);
        c->scv = KA_SCV_K6((const uint8_t *)s);
        return;
    }
    if (KA_FMT == ZS_KA_Q2_K) { /* a scale (low nibble) and a min (high nibble) per 16 */
        uint8_t s[16], m[16];
        for (int i = 0; i < 8; i++) { /* m arranged so that KA_SCV_K6 gives m0 .. m15 in order */
            s[2 * i] = b[2 * i] & 0xF, s[2 * i + 1] = b[2 * i + 1] & 0xF;
            m[2 * i] = b[i] >> 4, m[2 * i + 1] = b[8 + i] >> 4;
        }
        memcpy(&h, b + 80, 2);
        c->d = KA_D(h);
        memcpy(&h, b + 82, 2);
        c->m = KA_D(h);
        c->scv = KA_SCV_K6(s);
        c->mn2 = KA_SCV_K6(m);
        return;
    }
    memcpy(&h, b, 2);
    c->d = KA_D(h);
    if (KA_MIN) {
        memcpy(&h, b + 2, 2);
        c->m = KA_D(h);
    }
    if (KA_FMT == ZS_KA_Q4_K || KA_FMT == ZS_KA_Q5_K) { /* get_scale_min_k4 for all 8 groups at once, in 32-bit words */
        uint32_t u[3], s[2], m[2];
        memcpy(u, b + 4, 12);
        s[0] = u[0] & 0x3f3f3f3fu;
        s[1] = (u[2] & 0x0f0f0f0fu) | ((u[0] >> 6 & 0x03030303u) << 4);
        m[0] = u[1] & 0x3f3f3f3fu;
        m[1] = (u[2] >> 4 & 0x0f0f0f0fu) | ((u[1] >> 6 & 0x03030303u) << 4);
        c->scv = KA_SCV_K4((const uint8_t *)s);
        c->mn2 = KA_MN2((const uint8_t *)m);
    }
}

/* NR weight rows × NT activation rows (NR, NT constants at every call) */
static inline __attribute__((always_inline)) void KA_NAME(tile)(float *y, int ldy, const zs_q8a *a, int t,
                                                                const uint8_t *w, size_t rb, int nsb,
                                                                const int NR, const int NT) {
    float acc[4][4][8], mac[4][4][8];
    const int8_t *xq[4];
    const float *xd[4];
#pragma GCC unroll 4
    for (int u = 0; u < NT; u++) {
        xq[u] = a->q + (size_t)(t + u) * a->in;
        xd[u] = a->d + (size_t)(t + u) * a->nb;
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++)
            for (int l = 0; l < 8; l++) acc[r][u][l] = mac[r][u][l] = 0.0f;
    }
    const zs_ka_i16 one = (zs_ka_i16){0} + 1;
    for (int sb = 0; sb < nsb; sb++) {
        KA_NAME(ctx) c[4];
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) KA_NAME(prep)(w + (size_t)r * rb + (size_t)sb * KA_BYTES, &c[r]);
        zs_ka_i32 is[4][4];
#pragma GCC unroll 4
        for (int u = 0; u < NT; u++) {
            zs_ka_i32 z = {0};
#if KA_OFF
            z = -KA_OFF * KA_XSUM(*(const zs_ka_i8u *)(xq[u] + (size_t)sb * 32));
#endif
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) is[r][u] = z;
        }
#pragma GCC unroll 8
        for (int g = 0; g < KA_NG; g++) {
            zs_ka_i8 wv[4];
            zs_ka_i16 sc[4];
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) {
                wv[r] = KA_W(w + (size_t)r * rb + (size_t)sb * KA_BYTES, g);
                sc[r] = KA_SCALED ? KA_PICK(c[r].scv, g) : one;
            }
#pragma GCC unroll 4
            for (int u = 0; u < NT; u++) {
                zs_ka_i8 xv = *(const zs_ka_i8u *)(xq[u] + ((size_t)sb * KA_NG + g) * 32);
#pragma GCC unroll 4
                for (int r = 0; r < NR; r++) is[r][u] = KA_DOT(is[r][u], wv[r], xv, sc[r]);
            }
        }
#pragma GCC unroll 4
        for (int u = 0; u < NT; u++) {
#if KA_KMIN
            const int16_t *bs = a->bs + (size_t)(t + u) * (a->in / 16) + (size_t)sb * 16;
#endif
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) {
                float d = c[r].d * xd[u][sb];
                float *al = &acc[r][u][sb & 7], *ml = &mac[r][u][sb & 7];
                *al = __builtin_fmaf(d, (float)KA_ISUM(is[r][u]), *al);
#if KA_KMIN
                float coef = -(c[r].m * xd[u][sb]);
                *ml = __builtin_fmaf(coef, (float)KA_MSUM(c[r].mn2, bs), *ml);
#elif KA_MIN
                *ml = __builtin_fmaf(c[r].m, a->s[(size_t)(t + u) * a->nb + sb], *ml);
#endif
                (void)ml;
            }
        }
    }
#pragma GCC unroll 4
    for (int u = 0; u < NT; u++)
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            float v = zs_ka_tree(acc[r][u]);
#if KA_MIN
            v = v + zs_ka_tree(mac[r][u]);
#endif
            y[(size_t)u * ldy + r] = v;
        }
    (void)mac;
    (void)one;
}

/* the rows j0.. of tile height NR over every activation row, tokens in tiles of KA_TT */
#define KA_ROWS(NR)                                                                                          \
    do {                                                                                                     \
        int t_ = 0;                                                                                          \
        for (; t_ + KA_TT <= T; t_ += KA_TT)                                                                 \
            KA_NAME(tile)(y + (size_t)t_ * ldy + j, ldy, a, t0 + t_, W + (size_t)j * rb, rb, nsb, NR, KA_TT); \
        for (; t_ < T; t_++)                                                                                 \
            KA_NAME(tile)(y + (size_t)t_ * ldy + j, ldy, a, t0 + t_, W + (size_t)j * rb, rb, nsb, NR, 1);     \
    } while (0)

#if KA_PACK
static int KA_NAME(packed)(float *y, int ldy, const zs_q8a *a, int t0, int T, const uint8_t *W, int R);
#endif
#if KA_DEC
static int KA_NAME(dec)(float *y, const zs_q8a *a, int t, const uint8_t *W, int R);
#endif

static void KA_NAME(block)(float *y, int ldy, const zs_q8a *a, int t0, int T, const uint8_t *W, int R) {
    int nsb = a->nb;
    size_t rb = (size_t)nsb * KA_BYTES;
    int j = 0;
#if KA_PACK
    if (T >= 4) j = KA_NAME(packed)(y, ldy, a, t0, T, W, R);
#endif
    if (T == 1) {
#if KA_DEC
        j = KA_NAME(dec)(y, a, t0, W, R);
#endif
        for (; j + KA_DR <= R; j += KA_DR) KA_NAME(tile)(y + j, ldy, a, t0, W + (size_t)j * rb, rb, nsb, KA_DR, 1);
        for (; j < R; j++) KA_NAME(tile)(y + j, ldy, a, t0, W + (size_t)j * rb, rb, nsb, 1, 1);
        return;
    }
    for (; j + KA_TR <= R; j += KA_TR) KA_ROWS(KA_TR);
    for (; j < R; j++) KA_ROWS(1);
}
#undef KA_ROWS
#undef KA_BYTES
#undef KA_NG
#undef KA_MIN
#undef KA_KMIN
#undef KA_SIGNED
#undef KA_OFF
#undef KA_SCALED
