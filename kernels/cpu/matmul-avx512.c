/* matmul-avx512.c — the f32, bf16 and f16 matmul kernels (matmul-kern.h, matmul-16-kern.h)
 * compiled for AVX-512F/VL on 256-bit vectors: the same instructions and per-element order as
 * the AVX2 build (so the same bits), with 32 registers, which fit the 4-row × 4-token tile.
 * Selected at run time when the CPU has AVX-512VL. */
#include "matmul-16.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512vl,avx512bw")
#include <immintrin.h>

#define KERN_T4 1
#define KERN_NAME(x) zs_kern_avx512_##x
#include "matmul-kern.h"
#undef KERN_NAME
#undef KERN_T4

void zs_matmul_block_avx512(float *y, int ldy, const float *x, int T, int in, const float *W, int R) {
    zs_kern_avx512_block(y, ldy, x, T, in, W, R);
}

/* bf16 → f32: the 16 bits become the high half of the f32 (exact) */
static inline __m256 zs_bf16x8_avx512(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
#define KERN16_T4 1
#define KERN16_NAME(x) zs_kern16_avx512_bf16_##x
#define KERN16_W8(p) ((zs_v8)zs_bf16x8_avx512(p))
#define KERN16_W1(p) zs_matmul_bf16_widen(*(p))
#define KERN16_FMA8(a, b, c) ((zs_v8)_mm256_fmadd_ps((__m256)(a), (__m256)(b), (__m256)(c)))
#include "matmul-16-kern.h"
#undef KERN16_NAME
#undef KERN16_W8
#undef KERN16_W1

#define KERN16_NAME(x) zs_kern16_avx512_f16_##x
#define KERN16_W8(p) ((zs_v8)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p))))
#define KERN16_W1(p) _cvtsh_ss(*(p))
#include "matmul-16-kern.h"
#undef KERN16_NAME
#undef KERN16_W8
#undef KERN16_W1
#undef KERN16_FMA8
#undef KERN16_T4

void zs_matmul_block_bf16_avx512(float *y, int ldy, const float *x, int T, int in, const uint16_t *W, int R) {
    zs_kern16_avx512_bf16_block(y, ldy, x, T, in, W, R);
}
void zs_matmul_block_f16_avx512(float *y, int ldy, const float *x, int T, int in, const uint16_t *W, int R) {
    zs_kern16_avx512_f16_block(y, ldy, x, T, in, W, R);
}
#pragma GCC pop_options
