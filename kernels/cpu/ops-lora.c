/* ops-lora.c — LoRA's row kernels (ops.h: zs_op_lora_down4 / zs_op_lora_up): the generic build of
 * lora-kern.h and the run-time choice of the AVX2+FMA build (lora-avx2.c), which gives the same
 * bits. */
#include <stddef.h>
#include <stdint.h>

#include "ops.h"

#pragma GCC diagnostic ignored "-Wpsabi"
#define LKERN_NAME(x) zs_lkern_generic_##x
#include "lora-kern.h"

void zs_lora_down4_avx2(float *const *u, const float *const *x, int n, const void *At, int bf16, int in, int r, float s);
void zs_lora_up_avx2(float *y, const float *u, const void *Bt, int bf16, int r, int out, int o0, int o1);

static int use_avx2(void) {
    static int v = -1; /* benign race: every thread computes the same value */
    int x = __atomic_load_n(&v, __ATOMIC_RELAXED);
    if (x < 0) {
        __builtin_cpu_init();
        x = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
        __atomic_store_n(&v, x, __ATOMIC_RELAXED);
    }
    return x;
}

void zs_op_lora_down4(float *const *u, const float *const *x, int n, const void *At, int bf16, int in, int r, float s) {
    if (use_avx2()) zs_lora_down4_avx2(u, x, n, At, bf16, in, r, s);
    else if (bf16) zs_lkern_generic_down4_bf16(u, x, n, At, in, r, s);
    else zs_lkern_generic_down4_f32(u, x, n, At, in, r, s);
}

void zs_op_lora_up(float *y, const float *u, const void *Bt, int bf16, int r, int out, int o0, int o1) {
    if (use_avx2()) zs_lora_up_avx2(y, u, Bt, bf16, r, out, o0, o1);
    else if (bf16) zs_lkern_generic_up_bf16(y, u, Bt, r, out, o0, o1);
    else zs_lkern_generic_up_f32(y, u, Bt, r, out, o0, o1);
}
