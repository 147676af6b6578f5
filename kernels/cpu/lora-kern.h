/* lora-kern.h — the row kernels of LoRA's y += scale·B·A·x over the transposed serving copies of
 * A and B (lora.h, zs_lora_freeze: f32, or bf16 widened exactly on load), included by ops-lora.c
 * (generic build) and lora-avx2.c (compiled for AVX2+FMA). Each output element is ONE chain of
 * fused multiply-adds in a fixed order from zero:
 *   down: u[k] = s * (sum over j = 0 .. in-1 of x[j]·At[j, k])      (At = Aᵀ, [in, r])
 *   up:   y[o] = y[o] + (sum over k = 0 .. r-1 of u[k]·Bt[k, o])    (Bt = Bᵀ, [r, out])
 * Vector lanes are separate elements (no horizontal sums), so both builds give the same bits
 * (the generic one fuses lane by lane with fmaf) and a row's result depends on that row alone;
 * down takes up to 4 rows per call so that At is read once for them. lora-kern-body.h holds the
 * kernels, instantiated here once per element type. Not a public header. */
#include <stddef.h>
#include <stdint.h>

#ifndef ZS_LKERN_TYPES
#define ZS_LKERN_TYPES
typedef float zs_lv8 __attribute__((vector_size(32)));
typedef float zs_lv8u __attribute__((vector_size(32), aligned(4), may_alias));
typedef uint32_t zs_lu8 __attribute__((vector_size(32)));
#endif

#ifndef LKERN_VFMA
static inline zs_lv8 LKERN_NAME(vfma)(zs_lv8 a, zs_lv8 b, zs_lv8 c) {
    zs_lv8 r;
    for (int l = 0; l < 8; l++) r[l] = __builtin_fmaf(a[l], b[l], c[l]);
    return r;
}
#define LKERN_VFMA(a, b, c) LKERN_NAME(vfma)(a, b, c)
#endif

static inline zs_lv8 LKERN_NAME(splat)(float s) { return (zs_lv8){s, s, s, s, s, s, s, s}; }
static inline zs_lv8 LKERN_NAME(ld_f32)(const float *p) { return *(const zs_lv8u *)p; }
static inline float LKERN_NAME(el_f32)(const float *p) { return *p; }
static inline zs_lv8 LKERN_NAME(ld_bf16)(const uint16_t *p) {
#ifdef LKERN_LD_BF16
    return LKERN_LD_BF16(p);
#else
    zs_lu8 w = {0};
    for (int l = 0; l < 8; l++) w[l] = (uint32_t)p[l] << 16; /* bf16 -> f32 is exact */
    return (zs_lv8)w;
#endif
}
static inline float LKERN_NAME(el_bf16)(const uint16_t *p) {
    uint32_t w = (uint32_t)*p << 16;
    float f;
    __builtin_memcpy(&f, &w, 4);
    return f;
}

#define LKERN_E float
#define LKERN_S f32
#include "lora-kern-body.h"
#undef LKERN_E
#undef LKERN_S
#define LKERN_E uint16_t
#define LKERN_S bf16
#include "lora-kern-body.h"
#undef LKERN_E
#undef LKERN_S
