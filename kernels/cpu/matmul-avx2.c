/* matmul-avx2.c — the batch-invariant matmul kernels compiled for AVX2 + FMA (selected at run
 * time when the CPU has them): f32 (matmul-kern.h), and bf16 and f16 (matmul-16-kern.h, with
 * F16C for f16), which load the 16-bit weights and widen them in registers; Q8_0 and
 * Q4_0 (matmul-quant-kern.h), which dequantize ggml's blocks in registers. */
#include "matmul-16.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define KERN_NAME(x) zs_kern_avx2_##x
#include "matmul-kern.h"

void zs_matmul_block_avx2(float *y, int ldy, const float *x, int T, int in, const float *W, int R) {
    zs_kern_avx2_block(y, ldy, x, T, in, W, R);
}
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

/* bf16 → f32: the 16 bits become the high half of the f32 (exact). The 8 values are loaded into
 * both 128-bit halves and one byte shuffle puts values 0-3 (low half) and 4-7 (high half) into
 * the high bytes of the f32 lanes, zeros below. */
static inline __m256 zs_bf16x8_avx2(const uint16_t *p) {
    const __m256i m = _mm256_setr_epi8(-128, -128, 0, 1, -128, -128, 2, 3, -128, -128, 4, 5, -128, -128, 6, 7,
                                       -128, -128, 8, 9, -128, -128, 10, 11, -128, -128, 12, 13, -128, -128, 14, 15);
    return _mm256_castsi256_ps(_mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p)), m));
}
#define KERN16_NAME(x) zs_kern16_avx2_bf16_##x
#define KERN16_W8(p) ((zs_v8)zs_bf16x8_avx2(p))
#define KERN16_W1(p) zs_matmul_bf16_widen(*(p))
#define KERN16_FMA8(a, b, c) ((zs_v8)_mm256_fmadd_ps((__m256)(a), (__m256)(b), (__m256)(c)))
#include "matmul-16-kern.h"
#undef KERN16_NAME
#undef KERN16_W8
#undef KERN16_W1

/* f16 → f32 with F16C (exact) */
#define KERN16_NAME(x) zs_kern16_avx2_f16_##x
#define KERN16_W8(p) ((zs_v8)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p))))
#define KERN16_W1(p) _cvtsh_ss(*(p))
#include "matmul-16-kern.h"
#undef KERN16_NAME
#undef KERN16_W8
#undef KERN16_W1

/* Q8_0: 8 int8 sign-extended to i32, converted (exact), times the broadcast scale; Q4_0: 8
 * bytes of nibbles (low for s < 2, high after), minus 8, converted, times the scale */
static inline __m256 zs_q8x8_avx2(const uint8_t *b, int s, __m256 dv) {
    __m128i v = _mm_loadl_epi64((const __m128i *)(b + 2 + 8 * s));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)), dv);
}
static inline __m256 zs_q4x8_avx2(const uint8_t *b, int s, __m256 dv) {
    __m128i v = _mm_loadl_epi64((const __m128i *)(b + 2 + 8 * (s & 1)));
    if (s >= 2) v = _mm_srli_epi16(v, 4);
    v = _mm_and_si128(v, _mm_set1_epi8(15));
    __m256i q = _mm256_sub_epi32(_mm256_cvtepu8_epi32(v), _mm256_set1_epi32(8));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(q), dv);
}
#define KQ8_D(h) _cvtsh_ss(h)
#define KQ8_FMA8(a, b, c) ((zs_v8)_mm256_fmadd_ps((__m256)(a), (__m256)(b), (__m256)(c)))
#define KQ8_NAME(x) zs_kq8_avx2_##x
#define KQ8_BYTES 34
#define KQ8_W8(b, s, dv) ((zs_v8)zs_q8x8_avx2((b), (s), (__m256)(dv)))
#include "matmul-quant-kern.h"
#undef KQ8_NAME
#undef KQ8_BYTES
#undef KQ8_W8
#define KQ8_NAME(x) zs_kq4_avx2_##x
#define KQ8_BYTES 18
#define KQ8_W8(b, s, dv) ((zs_v8)zs_q4x8_avx2((b), (s), (__m256)(dv)))
#include "matmul-quant-kern.h"
#undef KQ8_NAME
#undef KQ8_BYTES
#undef KQ8_W8
#undef KQ8_D
#undef KQ8_FMA8
#undef KERN16_FMA8

void zs_matmul_block_q8_0_avx2(float *y, int ldy, const float *x, int T, int in, const uint8_t *W, int R) {
    zs_kq8_avx2_block(y, ldy, x, T, in, W, R);
}
void zs_matmul_block_q4_0_avx2(float *y, int ldy, const float *x, int T, int in, const uint8_t *W, int R) {
    zs_kq4_avx2_block(y, ldy, x, T, in, W, R);
}

void zs_matmul_block_bf16_avx2(float *y, int ldy, const float *x, int T, int in, const uint16_t *W, int R) {
    zs_kern16_avx2_bf16_block(y, ldy, x, T, in, W, R);
}
void zs_matmul_block_f16_avx2(float *y, int ldy, const float *x, int T, int in, const uint16_t *W, int R) {
    zs_kern16_avx2_f16_block(y, ldy, x, T, in, W, R);
}
#pragma GCC pop_options
