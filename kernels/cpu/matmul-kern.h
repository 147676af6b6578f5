/* matmul-kern.h — the inner kernel of the batch-invariant matrix product, included by
 * matmul.c (generic build) and matmul-avx2.c (compiled for AVX2+FMA). Every output element is
 * one dot product with its own 8-lane accumulator, advanced over k in steps of 8 in order, then
 * summed lane by lane in a fixed order, then the k tail added in order. Micro-tiles only
 * interleave independent accumulators, so an element's value never depends on which other rows
 * or tokens share the call. KERN_T4 (defined by a build with 32 vector registers) adds tiles of
 * 4 rows × 4 tokens with k in chunks (matmul-kc4.h). Not a public header. */
#include <stddef.h>

typedef float zs_v8 __attribute__((vector_size(32)));
typedef float zs_v8u __attribute__((vector_size(32), aligned(4), may_alias)); /* unaligned loads */

static inline float KERN_NAME(hsum)(zs_v8 a) {
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

/* one multiply-add of the k tail, fused in every build so that all tiles round alike */
static inline float KERN_NAME(madd)(float a, float b, float c) { return __builtin_fmaf(a, b, c); }

static inline zs_v8 KERN_NAME(ld)(const float *p) { return *(const zs_v8u *)p; }

#ifdef KERN_T4
#define KC_NAME KERN_NAME(kc4)
#define KC_WT float
#define KC_W8(p) KERN_NAME(ld)(p)
#define KC_W1(p) (*(p))
#define KC_X8(p) KERN_NAME(ld)(p)
#define KC_ACC(w, x, a) ((a) + (w) * (x))
#define KC_MADD(w, x, s) KERN_NAME(madd)((w), (x), (s))
#define KC_HSUM(v) KERN_NAME(hsum)(v)
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
static void KERN_NAME(block)(float *y, int ldy, const float *x, int T, int in, const float *W, int R) {
    int k8 = in & ~7;
    int j = 0, t4 = 0, r4 = 0;
#ifdef KERN_T4
    if (T >= 4 && R >= 4 && KERN_NAME(kc4)(y, ldy, x, T & ~3, in, W, R & ~3)) t4 = T & ~3, r4 = R & ~3;
#endif
    for (; j + 4 <= R; j += 4) {
        const float *w0 = W + (size_t)j * in, *w1 = w0 + in, *w2 = w1 + in, *w3 = w2 + in;
        int t = j < r4 ? t4 : 0;
        for (; t + 2 <= T; t += 2) {
            const float *xa = x + (size_t)t * in, *xb = xa + in;
            zs_v8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, b0 = {0}, b1 = {0}, b2 = {0}, b3 = {0};
            for (int k = 0; k < k8; k += 8) {
                zs_v8 va = KERN_NAME(ld)(xa + k), vb = KERN_NAME(ld)(xb + k);
                zs_v8 u0 = KERN_NAME(ld)(w0 + k), u1 = KERN_NAME(ld)(w1 + k);
                zs_v8 u2 = KERN_NAME(ld)(w2 + k), u3 = KERN_NAME(ld)(w3 + k);
                a0 += u0 * va; a1 += u1 * va; a2 += u2 * va; a3 += u3 * va;
                b0 += u0 * vb; b1 += u1 * vb; b2 += u2 * vb; b3 += u3 * vb;
            }
            float s[8] = {KERN_NAME(hsum)(a0), KERN_NAME(hsum)(a1), KERN_NAME(hsum)(a2), KERN_NAME(hsum)(a3),
                          KERN_NAME(hsum)(b0), KERN_NAME(hsum)(b1), KERN_NAME(hsum)(b2), KERN_NAME(hsum)(b3)};
            for (int k = k8; k < in; k++) {
                s[0] = KERN_NAME(madd)(w0[k], xa[k], s[0]); s[1] = KERN_NAME(madd)(w1[k], xa[k], s[1]);
                s[2] = KERN_NAME(madd)(w2[k], xa[k], s[2]); s[3] = KERN_NAME(madd)(w3[k], xa[k], s[3]);
                s[4] = KERN_NAME(madd)(w0[k], xb[k], s[4]); s[5] = KERN_NAME(madd)(w1[k], xb[k], s[5]);
                s[6] = KERN_NAME(madd)(w2[k], xb[k], s[6]); s[7] = KERN_NAME(madd)(w3[k], xb[k], s[7]);
            }
            float *ya = y + (size_t)t * ldy + j, *yb = ya + ldy;
            ya[0] = s[0]; ya[1] = s[1]; ya[2] = s[2]; ya[3] = s[3];
            yb[0] = s[4]; yb[1] = s[5]; yb[2] = s[6]; yb[3] = s[7];
        }
        for (; t < T; t++) {
            const float *xa = x + (size_t)t * in;
            zs_v8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
            for (int k = 0; k < k8; k += 8) {
                zs_v8 va = KERN_NAME(ld)(xa + k);
                a0 += KERN_NAME(ld)(w0 + k) * va; a1 += KERN_NAME(ld)(w1 + k) * va;
                a2 += KERN_NAME(ld)(w2 + k) * va; a3 += KERN_NAME(ld)(w3 + k) * va;
            }
            float s[4] = {KERN_NAME(hsum)(a0), KERN_NAME(hsum)(a1), KERN_NAME(hsum)(a2), KERN_NAME(hsum)(a3)};
            for (int k = k8; k < in; k++) {
                s[0] = KERN_NAME(madd)(w0[k], xa[k], s[0]); s[1] = KERN_NAME(madd)(w1[k], xa[k], s[1]);
                s[2] = KERN_NAME(madd)(w2[k], xa[k], s[2]); s[3] = KERN_NAME(madd)(w3[k], xa[k], s[3]);
            }
            float *ya = y + (size_t)t * ldy + j;
            ya[0] = s[0]; ya[1] = s[1]; ya[2] = s[2]; ya[3] = s[3];
        }
    }
    for (; j < R; j++) {
        const float *w0 = W + (size_t)j * in;
        for (int t = 0; t < T; t++) {
            const float *xa = x + (size_t)t * in;
            zs_v8 a0 = {0};
            for (int k = 0; k < k8; k += 8) a0 += KERN_NAME(ld)(w0 + k) * KERN_NAME(ld)(xa + k);
            float s = KERN_NAME(hsum)(a0);
            for (int k = k8; k < in; k++) s = KERN_NAME(madd)(w0[k], xa[k], s);
            y[(size_t)t * ldy + j] = s;
        }
    }
}
