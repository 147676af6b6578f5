/* lora-avx2.c — LoRA's row kernels (lora-kern.h) compiled for AVX2 + FMA (selected at run time
 * when the CPU has them; the same bits as the generic build in ops-lora.c). */
#pragma GCC target("avx2,fma")
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#pragma GCC diagnostic ignored "-Wpsabi"
#define LKERN_NAME(x) zs_lkern_avx2_##x
#define LKERN_VFMA(a, b, c) ((zs_lv8)_mm256_fmadd_ps((__m256)(a), (__m256)(b), (__m256)(c)))
/* bf16 -> f32: widen to 32 bits and shift into the high half (exact) */
#define LKERN_LD_BF16(p) \
    ((zs_lv8)_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16)))
#include "lora-kern.h"

void zs_lora_down4_avx2(float *const *u, const float *const *x, int n, const void *At, int bf16, int in, int r, float s);
void zs_lora_up_avx2(float *y, const float *u, const void *Bt, int bf16, int r, int out, int o0, int o1);
void zs_lora_down4_avx2(float *const *u, const float *const *x, int n, const void *At, int bf16, int in, int r, float s) {
    if (bf16) zs_lkern_avx2_down4_bf16(u, x, n, At, in, r, s);
    else zs_lkern_avx2_down4_f32(u, x, n, At, in, r, s);
}
void zs_lora_up_avx2(float *y, const float *u, const void *Bt, int bf16, int r, int out, int o0, int o1) {
    if (bf16) zs_lkern_avx2_up_bf16(y, u, Bt, r, out, o0, o1);
    else zs_lkern_avx2_up_f32(y, u, Bt, r, out, o0, o1);
}
