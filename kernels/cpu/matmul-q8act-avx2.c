/* matmul-q8act-avx2.c — the integer matmul kernels (matmul-q8act-x86.h) compiled for AVX2 +
 * FMA + F16C, selected at run time by zs_q8a_pick; they give the generic build's bits. */
#include "matmul-q8act.h"

#pragma GCC diagnostic ignored "-Wpsabi"
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
/* 16 registers: 2 rows × 4 tokens fits for the blocks of 32; a K-quant keeps its integer sums
 * across 8 groups, so 2 × 2 */
#define ZS_AKA(x) zs_ka_avx2_##x
#define ZS_AKA_VNNI 0
#define ZS_AKA_TR32 2
#define ZS_AKA_TT32 4
#define ZS_AKA_TRK 2
#define ZS_AKA_TTK 2
#define ZS_AKA_DR 1
#define ZS_AKA_PT 2 /* packed kernel: 2 panels × this many tokens */
#include "matmul-q8act-x86.h"

#define ZS_KA_WRAP(f)                                                                                 \
    void zs_q8a_block_##f##_avx2(float *y, int ldy, const zs_q8a *a, int t0, int T, const uint8_t *W, int R) { \
        zs_ka_avx2_##f##_block(y, ldy, a, t0, T, W, R);                                                \
    }
ZS_KA_FORMATS(ZS_KA_WRAP)
#undef ZS_KA_WRAP
#pragma GCC pop_options
