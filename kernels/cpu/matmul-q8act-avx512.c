/* matmul-q8act-avx512.c — the integer matmul kernels (matmul-q8act-x86.h) compiled for
 * AVX-512F/VL/BW + VNNI (on 256-bit vectors: the 32 registers and vpdpbusd/vpdpwssd, not the
 * width), selected at run time by zs_q8a_pick; they give the generic build's bits. */
#include "matmul-q8act.h"

#pragma GCC diagnostic ignored "-Wpsabi"
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512dq,avx512vnni")
#define ZS_AKA(x) zs_ka_avx512_##x
#define ZS_AKA_VNNI 1
#define ZS_AKA_TR32 4
#define ZS_AKA_TT32 4
#define ZS_AKA_TRK 2
#define ZS_AKA_TTK 4
#define ZS_AKA_DR 1
#define ZS_AKA_PT 4 /* packed kernel: 2 panels × this many tokens */
#include "matmul-q8act-x86.h"

#define ZS_KA_WRAP(f)                                                                                   \
    void zs_q8a_block_##f##_avx512(float *y, int ldy, const zs_q8a *a, int t0, int T, const uint8_t *W, int R) { \
        zs_ka_avx512_##f##_block(y, ldy, a, t0, T, W, R);                                                \
    }
ZS_KA_FORMATS(ZS_KA_WRAP)
#undef ZS_KA_WRAP
#pragma GCC pop_options
