/* matmul-avx2.c — the batch-invariant matmul kernel compiled for AVX2 + FMA (selected at run
 * time when the CPU has them). */
#pragma GCC target("avx2,fma")
#define KERN_NAME(x) zs_kern_avx2_##x
#include "matmul-kern.h"

void zs_matmul_block_avx2(float *y, int ldy, const float *x, int T, int in, const float *W, int R);
void zs_matmul_block_avx2(float *y, int ldy, const float *x, int T, int in, const float *W, int R) {
    zs_kern_avx2_block(y, ldy, x, T, in, W, R);
}
