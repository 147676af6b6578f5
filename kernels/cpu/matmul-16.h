/* matmul-16.h — the block kernels behind zs_op_matmul, declared for matmul.c, matmul-avx2.c and
 * the tests that compare the builds with each other and with a scalar loop. Each computes
 * y[t*ldy + j] = Σ_k W[j*in + k]·x[t*in + k] for t < T, j < R in the order its kernel header
 * documents (matmul-kern.h for f32, matmul-16-kern.h for bf16 and f16: one order for both
 * builds). The _avx2 kernels need AVX2 + FMA (and F16C for f16); zs_matmul_pick16 says which
 * kernel zs_op_matmul runs for a 16-bit dtype on this CPU. The Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1
 * kernels (matmul-quant-kern.h) take W as rows of in/32 ggml blocks (in a multiple of 32), the
 * K-quant ones (Q4_K, Q5_K, Q6_K, Q3_K, Q2_K) rows of in/256 super-blocks;
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
void zs_matmul_block_avx512(float *y, int ldy, const float *x, int T, int in, const float *W, int R);
void zs_matmul_block_bf16_avx512(float *y, int ldy, const float *x, int T, int in, const uint16_t *W, int R);
void zs_matmul_block_f16_avx512(float *y, int ldy, const float *x, int T, int in, const uint16_t *W, int R);
/* the CPU has AVX-512F/VL/BW besides AVX2+FMA+F16C (the avx512 builds run) */
int zs_matmul_has_avx512(void);

/* ZS_NOFUSE(v): v (a float or a vector of floats) passes through an empty asm, so a product
 * rounded into v is never contracted with the addition that follows (Q4_1/Q5_1's d·q + m) */
#if defined(__x86_64__) || defined(__i386__)
#define ZS_NOFUSE(v) __asm__("" : "+x"(v))
#elif defined(__aarch64__)
#define ZS_NOFUSE(v) __asm__("" : "+w"(v))
#else
#define ZS_NOFUSE(v) __asm__("" : "+m"(v))
#endif

/* the vector types of matmul-quant-kern.h (defined once, here or there) */
#ifndef ZS_MATMUL_QUANT_TYPES
#define ZS_MATMUL_QUANT_TYPES
#pragma GCC diagnostic ignored "-Wpsabi" /* static helpers pass these: the ABI note does not apply */
typedef float zs_q8v __attribute__((vector_size(32)));
typedef float zs_q8vu __attribute__((vector_size(32), aligned(4), may_alias)); /* unaligned loads */
typedef struct { zs_q8v d, m; } zs_q8dm; /* a group's scale and min (or second scale), broadcast */
#endif

typedef void (*zs_matmul_blockq8_fn)(float *y, int ldy, const float *x, int T, int in, const uint8_t *W, int R);
void zs_matmul_block_q8_0_generic(float *y, int ldy, const float *x, int T, int in, const uint8_t *W, int R);
void zs_matmul_block_q8_0_avx2(float *y, int ldy, const float *x, int T, int in, const uint8_t *W, int R);
void zs_matmul_block_q4_0_generic(float *y, int ldy, const float *x, int T, int in, const uint8_t *W, int R);
void zs_matmul_block_q4_0_avx2(float *y, int ldy, const float *x, int T, int in, const uint8_t *W, int R);
void zs_matmul_block_q4_1_generic(float *y, int ldy, const float *x, int T, int in, const uint8_t *W, int R);
void zs_matmul_block_q4_1_avx2(float *y, int ldy, const float *x, int T, int in, const uint8_t *W, int R);
void zs_matmul_block_q5_0_generic(float *y, int ldy, const float *x, int T, int in, const uint8_t *W, int R);
void zs_matmul_block_q5_0_avx2(float *y, int ldy, const float *x, int T, int in, const uint8_t *W, int R);
void zs_matmul_block_q5_1_generic(float *y, int ldy, const float *x, int T, int in, const uint8_t *W, int R);
void zs_matmul_block_q5_1_avx2(float *y, int ldy, const float *x, int T, int in, const uint8_t *W, int R);
void zs_matmul_block_q4_k_generic(float *y, int ldy, const float *x, int T, int in, const uint8_t *W, int R);
void zs_matmul_block_q4_k_avx2(float *y, int ldy, const float *x, int T, int in, const uint8_t *W, int R);
void zs_matmul_block_q6_k_generic(float *y, int ldy, const float *x, int T, int in, const uint8_t *W, int R);
void zs_matmul_block_q6_k_avx2(float *y, int ldy, const float *x, int T, int in, const uint8_t *W, int R);
void zs_matmul_block_q5_k_generic(float *y, int ldy, const float *x, int T, int in, const uint8_t *W, int R);
void zs_matmul_block_q5_k_avx2(float *y, int ldy, const float *x, int T, int in, const uint8_t *W, int R);
void zs_matmul_block_q3_k_generic(float *y, int ldy, const float *x, int T, int in, const uint8_t *W, int R);
void zs_matmul_block_q3_k_avx2(float *y, int ldy, const float *x, int T, int in, const uint8_t *W, int R);
void zs_matmul_block_q2_k_generic(float *y, int ldy, const float *x, int T, int in, const uint8_t *W, int R);
void zs_matmul_block_q2_k_avx2(float *y, int ldy, const float *x, int T, int in, const uint8_t *W, int R);
/* the kernel zs_op_matmul uses for block weights (Q8_0 .. Q5_1, Q2_K .. Q6_K) here; NULL for
 * other dtypes (K-quants: in a multiple of 256) */
zs_matmul_blockq8_fn zs_matmul_pick_quant(zs_dtype wdt);

/* the kernel zs_op_matmul uses for bf16 or f16 weights here (the AVX2 one when the CPU has it) */
zs_matmul_block16_fn zs_matmul_pick16(zs_dtype wdt);

#endif
