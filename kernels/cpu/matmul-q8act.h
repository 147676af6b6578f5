/* matmul-q8act.h — the integer path of zs_op_matmul over block weights: the activations of
 * each row are quantized to 8-bit blocks as llama.cpp quantizes them (Q8_0 for Q8_0/Q4_0/Q5_0
 * weights, Q8_1 for Q4_1/Q5_1, Q8_K for the K-quants Q4_K/Q5_K/Q6_K/Q3_K/Q2_K), each weight
 * block is dotted with its
 * activation block in integers, and the blocks are scaled and summed in f32 in a fixed order
 * (matmul-q8act-kern.h documents it), so a row's result never depends on T, on the other rows
 * or on the thread count. Declared for matmul.c (the dispatch), matmul-q8act.c (generic build
 * and the driver), matmul-q8act-avx2.c (AVX2) and the tests. Not a public header.
 *
 * Mode: ZS_QUANT_ACT=f32 in the environment (read once, on the first product) keeps the exact
 * path (activations in f32, weights dequantized in registers, matmul-quant-kern.h); anything
 * else but "q8" (the default) is warned about and ignored. zs_op_matmul_quant_act() changes it
 * for the process (tests); it is an atomic, safe to call from any thread, but a product already
 * running keeps the mode it started with. */
#ifndef ZS_MATMUL_Q8ACT_H
#define ZS_MATMUL_Q8ACT_H

#include <stddef.h>
#include <stdint.h>

#include "tensor.h"

/* the vector types of matmul-q8act-kern.h (GCC vector extensions) */
#ifndef ZS_KA_TYPES
#define ZS_KA_TYPES
#pragma GCC diagnostic ignored "-Wpsabi" /* static helpers pass these: the ABI note does not apply */
typedef int8_t zs_ka_i8 __attribute__((vector_size(32)));
typedef int8_t zs_ka_i8u __attribute__((vector_size(32), aligned(1), may_alias));
typedef int16_t zs_ka_i16 __attribute__((vector_size(32)));
typedef int32_t zs_ka_i32 __attribute__((vector_size(32)));
typedef float zs_ka_f32 __attribute__((vector_size(32)));
/* the formats, as KA_FMT (macros, so that #if can test them) */
#define ZS_KA_Q8_0 1
#define ZS_KA_Q4_0 2
#define ZS_KA_Q4_1 3
#define ZS_KA_Q5_0 4
#define ZS_KA_Q5_1 5
#define ZS_KA_Q4_K 6
#define ZS_KA_Q6_K 7
#define ZS_KA_Q5_K 8
#define ZS_KA_Q3_K 9
#define ZS_KA_Q2_K 10
/* the eight chains of an output summed pairwise (matmul-q8act-kern.h) */
static inline float zs_ka_tree(const float *a) {
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}
static inline float zs_ka_hsum(zs_ka_f32 a) {
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}
#endif

enum { ZS_QUANT_ACT_Q8 = 0, ZS_QUANT_ACT_F32 = 1 };

/* sets the mode when mode is ZS_QUANT_ACT_Q8 or ZS_QUANT_ACT_F32 (anything else: no change);
 * returns the mode in force before the call (the environment's on the first call) */
int zs_op_matmul_quant_act(int mode);

/* the weight formats with an integer kernel (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q6_K, Q5_K, Q3_K, Q2_K) */
int zs_matmul_q8act_supports(zs_dtype wdt);

/* y[T,out] = x[T,in] · Wᵀ by the integer path (no bias). Returns 0, or ZS_EINVAL (nothing
 * written) when wdt has no integer kernel or in is not a whole number of its blocks. The
 * quantized activations live in a per-calling-thread scratch buffer that grows and is reused
 * (freed when the thread exits). Thread-safe. */
int zs_matmul_q8act(float *y, const float *x, int T, int in, const void *W, zs_dtype wdt, int out);

/* T rows of quantized activations, blocks of 32 (Q8_0, Q8_1) or 256 (Q8_K), nb per row */
typedef struct {
    int8_t *q;    /* T × in: the 8-bit values */
    float *d;     /* T × nb: the block's scale (Q8_0/Q8_1: f32 of the stored fp16 d; Q8_K: f32 d) */
    float *s;     /* Q8_1 only, T × nb: f32 of the stored fp16 s = fp16(d · Σq) */
    int16_t *bs;  /* Q8_K only, T × in/16: the sums of 16 values */
    int in, nb;
    int32_t *qsum; /* Q8_0/Q8_1, optional (NULL: not kept), T × nb: each block's Σq */
} zs_q8a;

enum { ZS_Q8A_Q8_0 = 0, ZS_Q8A_Q8_1 = 1, ZS_Q8A_Q8_K = 2 };

/* the activation format a weight format is dotted with (-1: none) */
int zs_q8a_kind(zs_dtype wdt);

/* quantize row x (in values) into row t of a, as quantize_row_q8_0 / q8_1 (llama.cpp's x86
 * build: d = amax/127, stored fp16 (round to nearest even); q = rint(x·(127/amax)), ties to
 * even; Q8_1 s = fp16(d·Σq) with the f32 d) or quantize_row_q8_K_ref (the first value of
 * largest magnitude max, iscale = -127/max, q = min(127, rint(iscale·x)), d = 1/iscale, the
 * sums of 16; an all-zero block: d = 0, q = 0, sums 0). Both builds give the same bytes. */
void zs_q8a_quantize_row(zs_q8a *a, int kind, int t, const float *x);

/* the block kernels: y[t*ldy + j] = dot(row j of W, row t0 + t of a) for t < T, j < R, W rows of
 * a->in weights as stored */
typedef void (*zs_q8a_fn)(float *y, int ldy, const zs_q8a *a, int t0, int T, const uint8_t *W, int R);
/* the formats with a kernel, for the lists below */
#define ZS_KA_FORMATS(X) X(q8_0) X(q4_0) X(q4_1) X(q5_0) X(q5_1) X(q4_k) X(q6_k) X(q5_k) X(q3_k) X(q2_k)
#define ZS_KA_DECL(f)                                                                                 \
    void zs_q8a_block_##f##_generic(float *y, int ldy, const zs_q8a *a, int t0, int T, const uint8_t *W, int R); \
    void zs_q8a_block_##f##_avx2(float *y, int ldy, const zs_q8a *a, int t0, int T, const uint8_t *W, int R);    \
    void zs_q8a_block_##f##_avx512(float *y, int ldy, const zs_q8a *a, int t0, int T, const uint8_t *W, int R);
ZS_KA_FORMATS(ZS_KA_DECL)
#undef ZS_KA_DECL
/* the kernel zs_matmul_q8act runs for wdt on this CPU (AVX-512VL/BW+VNNI, else AVX2+FMA+F16C,
 * when present); NULL if none */
zs_q8a_fn zs_q8a_pick(zs_dtype wdt);

#endif
