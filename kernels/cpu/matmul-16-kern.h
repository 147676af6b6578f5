/* matmul-16-kern.h — the inner kernel of the batch-invariant matrix product over 16-bit weights
 * (bf16, f16), included by matmul.c (generic build) and matmul-avx2.c (AVX2+FMA+F16C), once per
 * dtype. The weights are read as stored (2 bytes each) and widened in registers — exactly, since
 * every bf16 and f16 value is an f32 value — and never written back to memory as f32.
 *
 * The accumulation order of one output element y[t][j] = Σ_k W[j][k]·x[t][k], in every build:
 *   k8 = in rounded down to a multiple of 8;
 *   lane l = 0..7: a_l = 0, then for k = l, l+8, l+16, … < k8 in order: a_l = fma(W[j][k], x[t][k], a_l)
 *   s = ((a_0 + a_1) + (a_2 + a_3)) + ((a_4 + a_5) + (a_6 + a_7))
 *   for k = k8 … in-1 in order: s = fma(W[j][k], x[t][k], s)
 * with fma rounded once (fused) everywhere, lanes included, so the generic and the AVX2 builds
 * give the same bits. It is the order of the f32 kernel (matmul-kern.h) as its AVX2 build runs
 * it, so a 16-bit product equals that f32 product over the widened weights bit for bit.
 * Micro-tiles (8 weight rows × 1 token when T = 1, the decode case, so that 8 chains of fused
 * multiply-adds are in flight; else 4 rows × 2 tokens, the widened weights of a k step serving
 * both tokens, then 4 × 1 and 1 × 1 for what is left) only interleave independent accumulators,
 * so an element's value never depends on T, on which rows or tokens share the call, or on the
 * thread that runs its block. KERN16_T4 (a build with 32 vector registers) adds tiles of 4 rows ×
 * 4 tokens with k in chunks (matmul-kc4.h). Not a public header.
 *
 * The including file defines, then #undefs after each inclusion:
 *   KERN16_NAME(x)     the name of the kernel's functions
 *   KERN16_W8(p)       the 8 weights at p (const uint16_t *) widened, as a zs_v8
 *   KERN16_W1(p)       the weight at p widened, as a float
 *   KERN16_FMA8(a,b,c) lane-wise a·b + c rounded once, as a zs_v8 */
#include <stddef.h>
#include <stdint.h>

typedef float zs_v8 __attribute__((vector_size(32)));
typedef float zs_v8u __attribute__((vector_size(32), aligned(4), may_alias)); /* unaligned loads */

static inline float KERN16_NAME(hsum)(zs_v8 a) {
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

static inline zs_v8 KERN16_NAME(ldx)(const float *p) { return *(const zs_v8u *)p; }

#ifdef KERN16_T4
#define KC_NAME KERN16_NAME(kc4)
#define KC_WT uint16_t
#define KC_W8(p) KERN16_W8(p)
#define KC_W1(p) KERN16_W1(p)
#define KC_X8(p) KERN16_NAME(ldx)(p)
#define KC_ACC(w, x, a) KERN16_FMA8((w), (x), (a))
#define KC_MADD(w, x, s) __builtin_fmaf((w), (x), (s))
#define KC_HSUM(v) KERN16_NAME(hsum)(v)
#include "matmul-kc4.h"
#undef KC_NAME
#undef KC_WT
#undef KC_W8
#undef KC_W1
#undef KC_X8
#undef KC_ACC
#undef KC_MADD
#undef KC_HSUM
#endif

/* y[t*ldy + j] = dot(W[j*in ..], x[t*in ..]) for t < T, j < R. */
static void KERN16_NAME(block)(float *y, int ldy, const float *x, int T, int in, const uint16_t *W, int R) {
    int k8 = in & ~7;
    int j = 0, t4 = 0, r4 = 0;
#ifdef KERN16_T4
    if (T >= 4 && R >= 4 && KERN16_NAME(kc4)(y, ldy, x, T & ~3, in, W, R & ~3)) t4 = T & ~3, r4 = R & ~3;
#endif
    /* one token (decode): 8 weight rows per pass, so 8 accumulator chains are in flight */
    for (; T == 1 && j + 8 <= R; j += 8) {
        const uint16_t *w0 = W + (size_t)j * in, *w1 = w0 + in, *w2 = w1 + in, *w3 = w2 + in;
        const uint16_t *w4 = w3 + in, *w5 = w4 + in, *w6 = w5 + in, *w7 = w6 + in;
        zs_v8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, a4 = {0}, a5 = {0}, a6 = {0}, a7 = {0};
        for (int k = 0; k < k8; k += 8) {
            zs_v8 va = KERN16_NAME(ldx)(x + k);
            a0 = KERN16_FMA8(KERN16_W8(w0 + k), va, a0); a1 = KERN16_FMA8(KERN16_W8(w1 + k), va, a1);
            a2 = KERN16_FMA8(KERN16_W8(w2 + k), va, a2); a3 = KERN16_FMA8(KERN16_W8(w3 + k), va, a3);
            a4 = KERN16_FMA8(KERN16_W8(w4 + k), va, a4); a5 = KERN16_FMA8(KERN16_W8(w5 + k), va, a5);
            a6 = KERN16_FMA8(KERN16_W8(w6 + k), va, a6); a7 = KERN16_FMA8(KERN16_W8(w7 + k), va, a7);
        }
        float s[8] = {KERN16_NAME(hsum)(a0), KERN16_NAME(hsum)(a1), KERN16_NAME(hsum)(a2), KERN16_NAME(hsum)(a3),
                      KERN16_NAME(hsum)(a4), KERN16_NAME(hsum)(a5), KERN16_NAME(hsum)(a6), KERN16_NAME(hsum)(a7)};
        for (int r = 0; r < 8; r++) {
            const uint16_t *wr = w0 + (size_t)r * in;
            for (int k = k8; k < in; k++) s[r] = __builtin_fmaf(KERN16_W1(wr + k), x[k], s[r]);
            y[j + r] = s[r];
        }
    }
    for (; j + 4 <= R; j += 4) {
        const uint16_t *w0 = W + (size_t)j * in, *w1 = w0 + in, *w2 = w1 + in, *w3 = w2 + in;
        int t = j < r4 ? t4 : 0;
        for (; t + 2 <= T; t += 2) {
            const float *xa = x + (size_t)t * in, *xb = xa + in;
            zs_v8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, b0 = {0}, b1 = {0}, b2 = {0}, b3 = {0};
            for (int k = 0; k < k8; k += 8) {
                zs_v8 va = KERN16_NAME(ldx)(xa + k), vb = KERN16_NAME(ldx)(xb + k), u;
                u = KERN16_W8(w0 + k); a0 = KERN16_FMA8(u, va, a0); b0 = KERN16_FMA8(u, vb, b0);
                u = KERN16_W8(w1 + k); a1 = KERN16_FMA8(u, va, a1); b1 = KERN16_FMA8(u, vb, b1);
                u = KERN16_W8(w2 + k); a2 = KERN16_FMA8(u, va, a2); b2 = KERN16_FMA8(u, vb, b2);
                u = KERN16_W8(w3 + k); a3 = KERN16_FMA8(u, va, a3); b3 = KERN16_FMA8(u, vb, b3);
            }
            float s[8] = {KERN16_NAME(hsum)(a0), KERN16_NAME(hsum)(a1), KERN16_NAME(hsum)(a2),
                          KERN16_NAME(hsum)(a3), KERN16_NAME(hsum)(b0), KERN16_NAME(hsum)(b1),
                          KERN16_NAME(hsum)(b2), KERN16_NAME(hsum)(b3)};
            for (int k = k8; k < in; k++) {
                float u0 = KERN16_W1(w0 + k), u1 = KERN16_W1(w1 + k), u2 = KERN16_W1(w2 + k), u3 = KERN16_W1(w3 + k);
                s[0] = __builtin_fmaf(u0, xa[k], s[0]); s[1] = __builtin_fmaf(u1, xa[k], s[1]);
                s[2] = __builtin_fmaf(u2, xa[k], s[2]); s[3] = __builtin_fmaf(u3, xa[k], s[3]);
                s[4] = __builtin_fmaf(u0, xb[k], s[4]); s[5] = __builtin_fmaf(u1, xb[k], s[5]);
                s[6] = __builtin_fmaf(u2, xb[k], s[6]); s[7] = __builtin_fmaf(u3, xb[k], s[7]);
            }
            float *ya = y + (size_t)t * ldy + j, *yb = ya + ldy;
            ya[0] = s[0]; ya[1] = s[1]; ya[2] = s[2]; ya[3] = s[3];
            yb[0] = s[4]; yb[1] = s[5]; yb[2] = s[6]; yb[3] = s[7];
        }
        for (; t < T; t++) {
            const float *xa = x + (size_t)t * in;
            zs_v8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
            for (int k = 0; k < k8; k += 8) {
                zs_v8 va = KERN16_NAME(ldx)(xa + k);
                a0 = KERN16_FMA8(KERN16_W8(w0 + k), va, a0); a1 = KERN16_FMA8(KERN16_W8(w1 + k), va, a1);
                a2 = KERN16_FMA8(KERN16_W8(w2 + k), va, a2); a3 = KERN16_FMA8(KERN16_W8(w3 + k), va, a3);
            }
            float s[4] = {KERN16_NAME(hsum)(a0), KERN16_NAME(hsum)(a1), KERN16_NAME(hsum)(a2), KERN16_NAME(hsum)(a3)};
            for (int k = k8; k < in; k++) {
                s[0] = __builtin_fmaf(KERN16_W1(w0 + k), xa[k], s[0]); s[1] = __builtin_fmaf(KERN16_W1(w1 + k), xa[k], s[1]);
                s[2] = __builtin_fmaf(KERN16_W1(w2 + k), xa[k], s[2]); s[3] = __builtin_fmaf(KERN16_W1(w3 + k), xa[k], s[3]);
            }
            float *ya = y + (size_t)t * ldy + j;
            ya[0] = s[0]; ya[1] = s[1]; ya[2] = s[2]; ya[3] = s[3];
        }
    }
    for (; j < R; j++) {
        const uint16_t *w0 = W + (size_t)j * in;
        for (int t = 0; t < T; t++) {
            const float *xa = x + (size_t)t * in;
            zs_v8 a0 = {0};
            for (int k = 0; k < k8; k += 8) a0 = KERN16_FMA8(KERN16_W8(w0 + k), KERN16_NAME(ldx)(xa + k), a0);
            float s = KERN16_NAME(hsum)(a0);
            for (int k = k8; k < in; k++) s = __builtin_fmaf(KERN16_W1(w0 + k), xa[k], s);
            y[(size_t)t * ldy + j] = s;
        }
    }
}
