/* matmul-quant-kern.h — the inner kernel of the batch-invariant matrix product over ggml block
 * weights (blocks of 32 with an f16 scale d first: Q8_0, 34 bytes, 32 int8 q; Q4_0, 18 bytes,
 * 16 bytes of nibbles, weights 0..15 low, 16..31 high; Q4_1, 20 bytes, d, an f16 min m, the
 * nibbles; Q5_0, 22 bytes, d, a uint32 qh of fifth bits, the nibbles; Q5_1, 24 bytes, d, m, qh,
 * the nibbles; K-quant super-blocks of 8 groups of 32: Q4_K, 144 bytes, group g scaled by
 * d·sc[g] with min dmin·m[g]; Q5_K, 176 bytes, the same with a fifth bit; Q6_K, 210 bytes, and
 * Q3_K, 110 bytes, two scales d·sc per group, one per 16 weights; Q2_K, 84 bytes, two scales
 * and two mins per group, one per 16 weights),
 * included by matmul.c (generic build) and
 * matmul-avx2.c (AVX2+FMA+F16C), once per format. The blocks are read as stored and dequantized
 * in registers, never written back to memory as f32.
 *
 * Each weight is widened as w = f32(d) · f32(q) (Q4_0: f32(d) · f32(q - 8), Q5_0: f32(d) ·
 * f32(q - 16)), one rounded f32 product; Q4_1/Q5_1: w = (f32(d) · f32(q)) + f32(m), the product
 * rounded and then the sum, never fused (ggml's dequantize_row_q4_1/q5_1: x*d + m) — what
 * zs_to_f32 gives for the tensor in every case. Q4_K/Q5_K/Q2_K: w = (d1 · f32(q)) - m1, Q6_K:
 * w = d1 · f32(q - 32), Q3_K: w = d1 · f32(q) (q -4..3), where d1 = f32(d)·sc and m1 =
 * f32(dmin)·m are rounded products made once per group or 16 (dequantize_row_q*_K's order; the
 * kernel adds -m1, which is the same bits). The accumulation order of y[t][j] = Σ_k w[j][k]·x[t][k] (in a multiple of
 * 32, so there is no tail) is that of matmul-16-kern.h:
 *   lane l = 0..7: a_l = 0, then for k = l, l+8, l+16, … < in in order: a_l = fma(w[j][k], x[t][k], a_l)
 *   y = ((a_0 + a_1) + (a_2 + a_3)) + ((a_4 + a_5) + (a_6 + a_7))
 * with fma fused everywhere, so both builds give the same bits, and a quantized product equals
 * the f32 product over the dequantized weights bit for bit. Micro-tiles (8 rows × 1 token for
 * decode, 4 rows × 2 tokens, 4 × 1, 1 × 1) only interleave independent accumulators: an element
 * never depends on T, on its neighbours in the call, or on the thread that runs its block.
 * Not a public header.
 *
 * The including file defines, then #undefs after the inclusion:
 *   KQ8_NAME(x)        the name of the kernel's functions
 *   KQ8_BYTES          bytes per stored block (34, 18, 20, 22, 24; Q4_K 144, Q5_K 176, Q6_K 210,
 *                      Q3_K 110, Q2_K 84)
 *   KQ8_SUB            (optional, default 1) groups of 32 weights per stored block (K-quants: 8)
 *   KQ8_DVG(b, g)      (optional) the zs_q8dm of group g of the block at b; default: the f16 d
 *                      at bytes 0..1 (and the min at 2..3 with KQ8_HAS_MIN), broadcast
 *   KQ8_CTX, KQ8_PREP(b), KQ8_DVC(c, g)  (optional, together) a block's scales worked out once:
 *                      KQ8_PREP(b) gives a KQ8_CTX for the stored block at b (before its groups
 *                      are read), KQ8_DVC(c, g) the zs_q8dm of its group g from it; default: the
 *                      block pointer, and KQ8_DVG(b, g) per group. Only where the values are
 *                      computed, never their order: the scales are the same rounded products.
 *   KQ8_UNROLL         (optional, default 2) how many groups of a block one loop pass handles
 *                      (constant group numbers let the weight decoding use immediate shifts)
 *   KQ8_D(h)           the f16 scale bits h (uint16_t) as a float (exact)
 *   KQ8_HAS_MIN        (optional, 0 or 1) the block has an f16 min m at bytes 2..3 (Q4_1, Q5_1)
 *   KQ8_W8(b, g, s, dv) weights 8s..8s+7 (s = 0..3) of group g of the block at b (const uint8_t *) as f32,
 *                      dv a zs_q8dm: multiplied lane-wise by dv.d (then dv.m added, for the
 *                      formats with a min), as a zs_q8v
 *   KQ8_FMA8(a,b,c)    lane-wise a·b + c rounded once, as a zs_q8v */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifndef ZS_MATMUL_QUANT_TYPES
#define ZS_MATMUL_QUANT_TYPES
typedef float zs_q8v __attribute__((vector_size(32)));
typedef float zs_q8vu __attribute__((vector_size(32), aligned(4), may_alias)); /* unaligned loads */
typedef struct { zs_q8v d, m; } zs_q8dm; /* a block's scale and min (0 without one), broadcast */
#endif
#ifndef KQ8_HAS_MIN
#define KQ8_HAS_MIN 0
#endif
#ifndef KQ8_SUB
#define KQ8_SUB 1
#endif
/* the group loop is unrolled KQ8_UNROLL times (default 2: a group's parity is then a constant) */
#ifndef KQ8_UNROLL
#define KQ8_UNROLL 2
#endif
#define KQ8_STR2(x) #x
#define KQ8_STR(x) KQ8_STR2(x)
#define KQ8_UNROLL_GROUPS _Pragma(KQ8_STR(GCC unroll KQ8_UNROLL))
#ifndef KQ8_PREP
#define KQ8_CTX const uint8_t *
#define KQ8_PREP(b) (b)
#define KQ8_DVC(c, g) KQ8_DVG((c), (g))
#endif

static inline float KQ8_NAME(hsum)(zs_q8v a) {
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

static inline zs_q8v KQ8_NAME(ldx)(const float *p) { return *(const zs_q8vu *)p; }

static inline zs_q8dm KQ8_NAME(dv)(const uint8_t *blk) {
    uint16_t h, hm = 0;
    memcpy(&h, blk, 2);
    if (KQ8_HAS_MIN) memcpy(&hm, blk + 2, 2);
    float d = KQ8_D(h), m = KQ8_HAS_MIN ? KQ8_D(hm) : 0.0f;
    zs_q8dm v = {{d, d, d, d, d, d, d, d}, {m, m, m, m, m, m, m, m}};
    return v;
}
#ifndef KQ8_DVG
#define KQ8_DVG(b, g) KQ8_NAME(dv)(b)
#endif

/* one group of one row against one token: 4 steps of 8 lanes */
static inline __attribute__((always_inline)) zs_q8v KQ8_NAME(blk1)(const uint8_t *blk, int g, zs_q8dm dv, const float *x, zs_q8v a) {
    (void)g;
    a = KQ8_FMA8(KQ8_W8(blk, g, 0, dv), KQ8_NAME(ldx)(x), a);
    a = KQ8_FMA8(KQ8_W8(blk, g, 1, dv), KQ8_NAME(ldx)(x + 8), a);
    a = KQ8_FMA8(KQ8_W8(blk, g, 2, dv), KQ8_NAME(ldx)(x + 16), a);
    a = KQ8_FMA8(KQ8_W8(blk, g, 3, dv), KQ8_NAME(ldx)(x + 24), a);
    return a;
}

/* one group of one row against two tokens, the widened weights shared */
static inline __attribute__((always_inline)) void KQ8_NAME(blk2)(const uint8_t *blk, int g, zs_q8dm dv, const float *xa, const float *xb, zs_q8v *a, zs_q8v *b) {
    (void)g;
    zs_q8v u;
    for (int s = 0; s < 4; s++) {
        u = KQ8_W8(blk, g, s, dv);
        *a = KQ8_FMA8(u, KQ8_NAME(ldx)(xa + 8 * s), *a);
        *b = KQ8_FMA8(u, KQ8_NAME(ldx)(xb + 8 * s), *b);
    }
}

/* y[t*ldy + j] = dot(row j of W, x[t*in ..]) for t < T, j < R; W holds R rows of in/32 groups
 * (nsb = in/(32·KQ8_SUB) stored blocks). The loops walk the stored blocks of a row, and the groups
 * of each in order (k ascending, as the order above requires). */
static void KQ8_NAME(block)(float *y, int ldy, const float *x, int T, int in, const uint8_t *W, int R) {
    int nsb = in / (32 * KQ8_SUB);
    size_t rb = (size_t)nsb * KQ8_BYTES; /* bytes per row */
    int j = 0;
    for (; T == 1 && j + 8 <= R; j += 8) {
        const uint8_t *w0 = W + (size_t)j * rb, *w1 = w0 + rb, *w2 = w1 + rb, *w3 = w2 + rb;
        const uint8_t *w4 = w3 + rb, *w5 = w4 + rb, *w6 = w5 + rb, *w7 = w6 + rb;
        zs_q8v a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, a4 = {0}, a5 = {0}, a6 = {0}, a7 = {0};
        for (int sb = 0; sb < nsb; sb++) {
            size_t o = (size_t)sb * KQ8_BYTES;
            KQ8_CTX c0 = KQ8_PREP(w0 + o);
            KQ8_CTX c1 = KQ8_PREP(w1 + o);
            KQ8_CTX c2 = KQ8_PREP(w2 + o);
            KQ8_CTX c3 = KQ8_PREP(w3 + o);
            KQ8_CTX c4 = KQ8_PREP(w4 + o);
            KQ8_CTX c5 = KQ8_PREP(w5 + o);
            KQ8_CTX c6 = KQ8_PREP(w6 + o);
            KQ8_CTX c7 = KQ8_PREP(w7 + o);
KQ8_UNROLL_GROUPS
            for (int g = 0; g < KQ8_SUB; g++) {
                const float *xk = x + ((size_t)sb * KQ8_SUB + g) * 32;
                a0 = KQ8_NAME(blk1)(w0 + o, g, KQ8_DVC(c0, g), xk, a0);
                a1 = KQ8_NAME(blk1)(w1 + o, g, KQ8_DVC(c1, g), xk, a1);
                a2 = KQ8_NAME(blk1)(w2 + o, g, KQ8_DVC(c2, g), xk, a2);
                a3 = KQ8_NAME(blk1)(w3 + o, g, KQ8_DVC(c3, g), xk, a3);
                a4 = KQ8_NAME(blk1)(w4 + o, g, KQ8_DVC(c4, g), xk, a4);
                a5 = KQ8_NAME(blk1)(w5 + o, g, KQ8_DVC(c5, g), xk, a5);
                a6 = KQ8_NAME(blk1)(w6 + o, g, KQ8_DVC(c6, g), xk, a6);
                a7 = KQ8_NAME(blk1)(w7 + o, g, KQ8_DVC(c7, g), xk, a7);
            }
        }
        y[j + 0] = KQ8_NAME(hsum)(a0); y[j + 1] = KQ8_NAME(hsum)(a1);
        y[j + 2] = KQ8_NAME(hsum)(a2); y[j + 3] = KQ8_NAME(hsum)(a3);
        y[j + 4] = KQ8_NAME(hsum)(a4); y[j + 5] = KQ8_NAME(hsum)(a5);
        y[j + 6] = KQ8_NAME(hsum)(a6); y[j + 7] = KQ8_NAME(hsum)(a7);
    }
    for (; j + 4 <= R; j += 4) {
        const uint8_t *w0 = W + (size_t)j * rb, *w1 = w0 + rb, *w2 = w1 + rb, *w3 = w2 + rb;
        int t = 0;
        for (; t + 2 <= T; t += 2) {
            const float *xa = x + (size_t)t * in, *xb = xa + in;
            zs_q8v a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, b0 = {0}, b1 = {0}, b2 = {0}, b3 = {0};
            for (int sb = 0; sb < nsb; sb++) {
                size_t o = (size_t)sb * KQ8_BYTES;
                KQ8_CTX c0 = KQ8_PREP(w0 + o);
                KQ8_CTX c1 = KQ8_PREP(w1 + o);
                KQ8_CTX c2 = KQ8_PREP(w2 + o);
                KQ8_CTX c3 = KQ8_PREP(w3 + o);
KQ8_UNROLL_GROUPS
                for (int g = 0; g < KQ8_SUB; g++) {
                    size_t k = ((size_t)sb * KQ8_SUB + g) * 32;
                    KQ8_NAME(blk2)(w0 + o, g, KQ8_DVC(c0, g), xa + k, xb + k, &a0, &b0);
                    KQ8_NAME(blk2)(w1 + o, g, KQ8_DVC(c1, g), xa + k, xb + k, &a1, &b1);
                    KQ8_NAME(blk2)(w2 + o, g, KQ8_DVC(c2, g), xa + k, xb + k, &a2, &b2);
                    KQ8_NAME(blk2)(w3 + o, g, KQ8_DVC(c3, g), xa + k, xb + k, &a3, &b3);
                }
            }
            float *ya = y + (size_t)t * ldy + j, *yb = ya + ldy;
            ya[0] = KQ8_NAME(hsum)(a0); ya[1] = KQ8_NAME(hsum)(a1); ya[2] = KQ8_NAME(hsum)(a2); ya[3] = KQ8_NAME(hsum)(a3);
            yb[0] = KQ8_NAME(hsum)(b0); yb[1] = KQ8_NAME(hsum)(b1); yb[2] = KQ8_NAME(hsum)(b2); yb[3] = KQ8_NAME(hsum)(b3);
        }
        for (; t < T; t++) {
            const float *xa = x + (size_t)t * in;
            zs_q8v a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
            for (int sb = 0; sb < nsb; sb++) {
                size_t o = (size_t)sb * KQ8_BYTES;
                KQ8_CTX c0 = KQ8_PREP(w0 + o);
                KQ8_CTX c1 = KQ8_PREP(w1 + o);
                KQ8_CTX c2 = KQ8_PREP(w2 + o);
                KQ8_CTX c3 = KQ8_PREP(w3 + o);
KQ8_UNROLL_GROUPS
                for (int g = 0; g < KQ8_SUB; g++) {
                    const float *xk = xa + ((size_t)sb * KQ8_SUB + g) * 32;
                    a0 = KQ8_NAME(blk1)(w0 + o, g, KQ8_DVC(c0, g), xk, a0);
                    a1 = KQ8_NAME(blk1)(w1 + o, g, KQ8_DVC(c1, g), xk, a1);
                    a2 = KQ8_NAME(blk1)(w2 + o, g, KQ8_DVC(c2, g), xk, a2);
                    a3 = KQ8_NAME(blk1)(w3 + o, g, KQ8_DVC(c3, g), xk, a3);
                }
            }
            float *ya = y + (size_t)t * ldy + j;
            ya[0] = KQ8_NAME(hsum)(a0); ya[1] = KQ8_NAME(hsum)(a1); ya[2] = KQ8_NAME(hsum)(a2); ya[3] = KQ8_NAME(hsum)(a3);
        }
    }
    for (; j < R; j++) {
        const uint8_t *w0 = W + (size_t)j * rb;
        for (int t = 0; t < T; t++) {
            const float *xa = x + (size_t)t * in;
            zs_q8v a0 = {0};
            for (int sb = 0; sb < nsb; sb++) {
                size_t o = (size_t)sb * KQ8_BYTES;
                KQ8_CTX c0 = KQ8_PREP(w0 + o);
KQ8_UNROLL_GROUPS
                for (int g = 0; g < KQ8_SUB; g++)
                    a0 = KQ8_NAME(blk1)(w0 + o, g, KQ8_DVC(c0, g), xa + ((size_t)sb * KQ8_SUB + g) * 32, a0);
            }
            y[(size_t)t * ldy + j] = KQ8_NAME(hsum)(a0);
        }
    }
}
#undef KQ8_HAS_MIN
#undef KQ8_SUB
#undef KQ8_DVG
#undef KQ8_CTX
#undef KQ8_PREP
#undef KQ8_DVC
#undef KQ8_UNROLL
#undef KQ8_UNROLL_GROUPS
#undef KQ8_STR
#undef KQ8_STR2
