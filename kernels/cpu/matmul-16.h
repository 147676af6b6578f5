/* matmul-16.h — the block kernels behind zs_op_matmul, declared for matmul.c, matmul-avx2.c and
 * the tests that compare the builds with each other and with a scalar loop. Each computes
 * y[t*ldy + j] = Σ_k W[j*in + k]·x[t*in + k] for t < T, j < R in the order its kernel header
 * documents (matmul-kern.h for f32, matmul-16-kern.h for bf16 and f16: one order for both
 * builds). The _avx2 kernels need AVX2 + FMA (and F16C for f16); zs_matmul_pick16 says which
 * kernel zs_op_matmul runs for a 16-bit dtype on this CPU. The Q8_0 and Q4_0 kernels
 * (matmul-quant-kern.h) take W as rows of in/32 ggml blocks (in a multiple of 32);
 * zs_matmul_pick_quant says which one runs here. Not a public header. */
#ifndef ZS_MATMUL_16_H
#define ZS_MATMUL_16_H

#include <stdint.h>
#include <string.h>

#include "tensor.h"

/* one bf16 widened: its 16 bits are the high half of the f32 (exact) */
static inline float zs_matmul_bf16_widen(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

typedef void (*zs_matmul_block16_fn)(float *y, int ldy, const float *x, int T, int in, const uint16_t *W, int R);

void zs_matmul_block_avx2(float *y, int ldy, const float *x, int T, int in, const float *W, int R);
void zs_matmul_block_bf16_generic(float *y, int ldy, const float *x, int T, int in, const uint16_t *W, int R);
void zs_matmul_block_f16_generic(float *y, int ldy, const float *x, int T, int in, const uint16_t *W, int R);
void zs_matmul_block_bf16_avx2(float *y, int ldy, const float *x, int T, int in, const uint16_t *W, int R);
void zs_matmul_block_f16_avx2(float *y, int ldy, const float *x, int T, int in, const uint16_t *W, int R);

typedef void (*zs_matmul_blockq8_fn)(float *y, int ldy, const float *x, int T, int in, const uint8_t *W, int R);
void zs_matmul_block_q8_0_generic(float *y, int ldy, const float *x, int T, int in, const uint8_t *W, int R);
void zs_matmul_block_q8_0_avx2(float *y, int ldy, const float *x, int T, int in, const uint8_t *W, int R);
void zs_matmul_block_q4_0_generic(float *y, int ldy, const float *x, int T, int in, const uint8_t *W, int R);
void zs_matmul_block_q4_0_avx2(float *y, int ldy, const float *x, int T, int in, const uint8_t *W, int R);
/* the kernel zs_op_matmul uses for Q8_0 or Q4_0 weights here; NULL for other dtypes */
zs_matmul_blockq8_fn zs_matmul_pick_quant(zs_dtype wdt);

/* the kernel zs_op_matmul uses for bf16 or f16 weights here (the AVX2 one when the CPU has it) */
zs_matmul_block16_fn zs_matmul_pick16(zs_dtype wdt);

#endif
