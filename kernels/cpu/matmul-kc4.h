/* matmul-kc4.h — the 4-row × 4-token tile of the f32 and 16-bit matmul kernels with k in chunks,
 * included by matmul-kern.h and matmul-16-kern.h in a build with 32 vector registers (their
 * KERN_T4 / KERN16_T4). Rows 0..R4-1 × tokens 0..T4-1 (multiples of 4) run in 4 × 4 tiles, k in
 * chunks of 512 so that a tile's weights stay in L1 while every token tile passes; the
 * accumulators wait in a per-thread scratch buffer between chunks. A store and a load change no
 * value, so each element's order and bits are the including kernel's. Not a public header.
 *
 * The including file defines, then #undefs:
 *   KC_NAME           the function's name
 *   KC_WT             the weight element type
 *   KC_W8(p), KC_W1(p)  8 weights at p widened (a zs_v8), one weight widened (a float)
 *   KC_X8(p)          8 activations at p (a zs_v8)
 *   KC_ACC(w, x, a)   the kernel's lane update of a by w·x
 *   KC_MADD(w, x, s)  the kernel's k-tail step
 *   KC_HSUM(v)        the kernel's lane sum */
#include "scratch.h"

/* returns 0 when no scratch buffer can be had (nothing written) */
static int KC_NAME(float *y, int ldy, const float *x, int T4, int in, const KC_WT *W, int R4) {
    int k8 = in & ~7, nt = T4 / 4, nr = R4 / 4;
    zs_v8 *A = zs_scratch_get(ZS_SCRATCH_MM, (size_t)nr * nt * 16 * sizeof(zs_v8));
    if (!A) return 0;
    for (int kc = 0; kc < k8; kc += 512) {
        int ke = kc + 512 < k8 ? kc + 512 : k8;
        for (int jr = 0; jr < nr; jr++) {
            const KC_WT *wr[4];
            for (int r = 0; r < 4; r++) wr[r] = W + (size_t)(4 * jr + r) * in;
            for (int tt = 0; tt < nt; tt++) {
                zs_v8 *At = A + ((size_t)jr * nt + tt) * 16, acc[4][4];
                const float *xr[4];
#pragma GCC unroll 4
                for (int u = 0; u < 4; u++) {
                    xr[u] = x + (size_t)(4 * tt + u) * in;
#pragma GCC unroll 4
                    for (int r = 0; r < 4; r++) acc[r][u] = kc ? At[4 * r + u] : (zs_v8){0};
                }
                for (int k = kc; k < ke; k += 8) {
                    zs_v8 wv[4];
#pragma GCC unroll 4
                    for (int r = 0; r < 4; r++) wv[r] = KC_W8(wr[r] + k);
#pragma GCC unroll 4
                    for (int u = 0; u < 4; u++) {
                        zs_v8 xv = KC_X8(xr[u] + k);
#pragma GCC unroll 4
                        for (int r = 0; r < 4; r++) acc[r][u] = KC_ACC(wv[r], xv, acc[r][u]);
                    }
                }
#pragma GCC unroll 4
                for (int u = 0; u < 4; u++)
#pragma GCC unroll 4
                    for (int r = 0; r < 4; r++) At[4 * r + u] = acc[r][u];
            }
        }
    }
    for (int jr = 0; jr < nr; jr++)
        for (int tt = 0; tt < nt; tt++)
            for (int r = 0; r < 4; r++) {
                const KC_WT *w = W + (size_t)(4 * jr + r) * in;
                for (int u = 0; u < 4; u++) {
                    const float *xu = x + (size_t)(4 * tt + u) * in;
                    float s = KC_HSUM(k8 ? A[((size_t)jr * nt + tt) * 16 + 4 * r + u] : (zs_v8){0});
                    for (int k = k8; k < in; k++) s = KC_MADD(KC_W1(w + k), xu[k], s);
                    y[(size_t)(4 * tt + u) * ldy + 4 * jr + r] = s;
                }
            }
    return 1;
}
