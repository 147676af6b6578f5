/* matmul-bwd-avx2.c — the training backward's fixed-order multiply-add kernel
 * (matmul-bwd-kern.h) compiled for AVX2 + FMA (selected at run time when the CPU has them). */
#pragma GCC target("avx2,fma")
#include <immintrin.h>
#include <stddef.h>

/* the kernel's helpers are static, so the vector-return ABI note does not apply */
#pragma GCC diagnostic ignored "-Wpsabi"
#define KERN_NAME(x) zs_bkern_avx2_##x
#define KERN_VFMA(a, b, c) ((zs_bv8)_mm256_fmadd_ps((__m256)(a), (__m256)(b), (__m256)(c)))
#include "matmul-bwd-kern.h"

void zs_matmul_bwd_block_avx2(float *y, ptrdiff_t ldy, const float *a, ptrdiff_t ars, ptrdiff_t acs,
                              const float *b, ptrdiff_t ldb, int M, int N, int K, float *pa, float *pb);
void zs_matmul_bwd_block_avx2(float *y, ptrdiff_t ldy, const float *a, ptrdiff_t ars, ptrdiff_t acs,
                              const float *b, ptrdiff_t ldb, int M, int N, int K, float *pa, float *pb) {
    zs_bkern_avx2_block(y, ldy, a, ars, acs, b, ldb, M, N, K, pa, pb);
}
