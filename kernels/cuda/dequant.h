/* dequant.h — one weight of a ggml block row (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q6_K, Q5_K,
 * Q3_K, Q2_K; the layouts of engine/base/tensor.h) as f32, with the arithmetic of zs_to_f32 and of
 * the CPU kernels (kernels/cpu/matmul-quant-kern.h): one rounded product d·q (Q8_0, Q4_0 with
 * q - 8, Q5_0 with q - 16); (d·q) + m, the product rounded and then the sum, never fused (Q4_1,
 * Q5_1); Q4_K/Q5_K (d1·q) + (-m1) with d1 = d·sc and m1 = dmin·m rounded products of the group,
 * Q2_K the same with the d1 and m1 of the weight's 16; Q6_K ds·(q - 32) and Q3_K ds·q (q -4..3)
 * with ds = d·sc of the weight's 16. f16 fields are read byte by byte, little-endian (blocks sit
 * at any byte offset: a Q8_0 row is 34 bytes a block).
 *
 * Shared, as plain C, by the device code of matmul-quant.cu and embed.cu (compiled by nvcc:
 * __device__ functions, CUDA's f16 conversion and _rn intrinsics, so nothing is contracted) and by
 * tests/test-cuda-dequant.c, which checks these functions on the host (gcc: zs_f16_to_f32, and
 * products and sums stored through volatile, so nothing is contracted there either) bit for bit
 * against zs_to_f32 and zs_op_matmul in every build, a GPU or not. Not a public header.
 *
 * Indexing: a row of `in` weights (a multiple of 32, and of 256 for the K-quants) is in/32 groups
 * of 32; group kb is group kb % G of stored block kb / G (G = 8 for the K-quants, else 1); weight
 * j = 8·s + l of the group (s = 0..3, l = 0..7) is the row's weight 32·kb + 8·s + l, the one that
 * lane l of the CPU kernel's 8 lanes multiplies in its step s of group kb. */
#ifndef ZS_CUDA_DEQUANT_H
#define ZS_CUDA_DEQUANT_H

#include <stddef.h>
#include <stdint.h>

#include "tensor.h"

#if defined(__CUDACC__) || defined(ZS_EMU) /* nvcc, or the emulated device of the tests */
#include <cuda_fp16.h>
#define ZS_DQ_FN static __device__ __forceinline__
#define ZS_DQ_HD static __host__ __device__ __forceinline__ /* the sizes: launchers check with them */
#define ZS_DQ_F16(h) __half2float(__ushort_as_half(h))
#define ZS_DQ_MUL(a, b) __fmul_rn((a), (b))
#define ZS_DQ_ADD(a, b) __fadd_rn((a), (b))
#else
#define ZS_DQ_FN static inline
#define ZS_DQ_HD static inline
#define ZS_DQ_F16(h) zs_f16_to_f32(h)
static inline float zs_dq_mul_host(float a, float b) {
    volatile float p = a * b; /* rounded here: never fused with a later add */
    return p;
}
static inline float zs_dq_add_host(float a, float b) {
    volatile float p = a + b;
    return p;
}
#define ZS_DQ_MUL(a, b) zs_dq_mul_host((a), (b))
#define ZS_DQ_ADD(a, b) zs_dq_add_host((a), (b))
#endif

/* matmul-quant.cu's decode kernel: blocks of this many threads, 8 lanes per row, so block b
 * computes rows 16·b .. 16·b + 15 (thread i: row 16·b + i/8, lane i % 8); the host emulation of
 * tests/test-cuda-dequant.c walks the same mapping */
#define ZS_DQ_GEMV_THREADS 128

/* bytes of one stored block of dt (0 for a dtype that is not a block format) */
ZS_DQ_HD int zs_dq_block_bytes(int dt) {
    switch (dt) {
    case ZS_Q8_0: return ZS_Q8_0_BYTES;
    case ZS_Q4_0: return ZS_Q4_0_BYTES;
    case ZS_Q4_1: return ZS_Q4_1_BYTES;
    case ZS_Q5_0: return ZS_Q5_0_BYTES;
    case ZS_Q5_1: return ZS_Q5_1_BYTES;
    case ZS_Q4_K: return ZS_Q4_K_BYTES;
    case ZS_Q6_K: return ZS_Q6_K_BYTES;
    case ZS_Q5_K: return ZS_Q5_K_BYTES;
    case ZS_Q3_K: return ZS_Q3_K_BYTES;
    case ZS_Q2_K: return ZS_Q2_K_BYTES;
    default: return 0;
    }
}

/* groups of 32 weights per stored block */
ZS_DQ_HD int zs_dq_groups(int dt) {
    return dt == ZS_Q4_K || dt == ZS_Q6_K || dt == ZS_Q5_K || dt == ZS_Q3_K || dt == ZS_Q2_K ? 8 : 1;
}

/* bytes of a row of `in` weights (in a multiple of 32·zs_dq_groups) */
ZS_DQ_HD size_t zs_dq_row_bytes(int dt, int in) {
    return (size_t)(in / (32 * zs_dq_groups(dt))) * (size_t)zs_dq_block_bytes(dt);
}

ZS_DQ_FN uint16_t zs_dq_u16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
ZS_DQ_FN uint32_t zs_dq_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* the 4-bit q of weight j (0..31) of a block of 32 whose nibbles start at qs: j < 16 the low
 * nibble of qs[j], else the high nibble of qs[j - 16] */
ZS_DQ_FN int zs_dq_nib(const uint8_t *qs, int j) { return qs[j & 15] >> (j >> 4 << 2) & 15; }

/* Group kb of a row, read once for its 32 weights: where its quants are, and its scales as the
 * CPU kernel makes them once per group (its KQ8_DVG): d (and m) of a block of 32; Q4_K/Q5_K d1
 * and -m1; Q6_K/Q3_K the two d·sc of its 16s in d and m; Q2_K d1 and -m1 of its first 16 in d
 * and m, of its second in d2 and m2. */
typedef struct {
    const uint8_t *b; /* the stored block */
    int g;            /* the group in it (K-quants), else 0 */
    uint32_t qh;      /* Q5_0/Q5_1: the fifth bits */
    float d, m, d2, m2;
} zs_dq_group_t;

/* Q4_K/Q5_K's 6-bit scale and min of group g (ggml's get_scale_min_k4) of the 12 bytes at sm */
ZS_DQ_FN void zs_dq_scale_min_k4(const uint8_t *sm, int g, int *sc, int *m) {
    if (g < 4) {
        *sc = sm[g] & 63;
        *m = sm[g + 4] & 63;
    } else {
        *sc = (sm[g + 4] & 0xF) | (sm[g - 4] >> 6) << 4;
        *m = (sm[g + 4] >> 4) | (sm[g] >> 6) << 4;
    }
}

/* Q3_K's scale i (0..15) of the 12 bytes at q, -32..31 */
ZS_DQ_FN int zs_dq_scale_q3k(const uint8_t *q, int i) {
    int lo = i < 8 ? q[i] & 0xF : q[i - 8] >> 4, hi = (q[8 + (i & 3)] >> (2 * (i >> 2))) & 3;
    return (lo | hi << 4) - 32;
}

ZS_DQ_FN zs_dq_group_t zs_dq_group(int dt, const uint8_t *row, int kb) {
    zs_dq_group_t G;
    G.g = 0;
    G.qh = 0;
    G.m = 0.0f;
    G.d2 = 0.0f;
    G.m2 = 0.0f;
    switch (dt) {
    case ZS_Q8_0:
    case ZS_Q4_0:
    case ZS_Q5_0:
        G.b = row + (size_t)kb * (size_t)zs_dq_block_bytes(dt);
        G.d = ZS_DQ_F16(zs_dq_u16(G.b));
        if (dt == ZS_Q5_0) G.qh = zs_dq_u32(G.b + 2);
        break;
    case ZS_Q4_1:
    case ZS_Q5_1:
        G.b = row + (size_t)kb * (size_t)zs_dq_block_bytes(dt);
        G.d = ZS_DQ_F16(zs_dq_u16(G.b));
        G.m = ZS_DQ_F16(zs_dq_u16(G.b + 2));
        if (dt == ZS_Q5_1) G.qh = zs_dq_u32(G.b + 4);
        break;
    case ZS_Q4_K:
    case ZS_Q5_K: {
        G.b = row + (size_t)(kb >> 3) * (size_t)zs_dq_block_bytes(dt);
        G.g = kb & 7;
        int sc, m;
        zs_dq_scale_min_k4(G.b + 4, G.g, &sc, &m);
        G.d = ZS_DQ_MUL(ZS_DQ_F16(zs_dq_u16(G.b)), (float)sc);
        G.m = -ZS_DQ_MUL(ZS_DQ_F16(zs_dq_u16(G.b + 2)), (float)m); /* the kernel adds -m1 */
        break;
    }
    case ZS_Q3_K: {
        G.b = row + (size_t)(kb >> 3) * ZS_Q3_K_BYTES;
        G.g = kb & 7;
        float d = ZS_DQ_F16(zs_dq_u16(G.b + 108));
        G.d = ZS_DQ_MUL(d, (float)zs_dq_scale_q3k(G.b + 96, 2 * G.g));     /* weights 0..15 of the group */
        G.m = ZS_DQ_MUL(d, (float)zs_dq_scale_q3k(G.b + 96, 2 * G.g + 1)); /* weights 16..31 */
        break;
    }
    case ZS_Q2_K: {
        G.b = row + (size_t)(kb >> 3) * ZS_Q2_K_BYTES;
        G.g = kb & 7;
        float d = ZS_DQ_F16(zs_dq_u16(G.b + 80)), dmin = ZS_DQ_F16(zs_dq_u16(G.b + 82));
        int s0 = G.b[2 * G.g], s1 = G.b[2 * G.g + 1];
        G.d = ZS_DQ_MUL(d, (float)(s0 & 0xF));
        G.m = -ZS_DQ_MUL(dmin, (float)(s0 >> 4));
        G.d2 = ZS_DQ_MUL(d, (float)(s1 & 0xF));
        G.m2 = -ZS_DQ_MUL(dmin, (float)(s1 >> 4));
        break;
    }
    case ZS_Q6_K: {
        G.b = row + (size_t)(kb >> 3) * ZS_Q6_K_BYTES;
        G.g = kb & 7;
        const int8_t *sc = (const int8_t *)(G.b + 192) + 8 * (G.g >> 2) + 2 * (G.g & 3);
        float d = ZS_DQ_F16(zs_dq_u16(G.b + 208));
        G.d = ZS_DQ_MUL(d, (float)sc[0]); /* weights 0..15 of the group */
        G.m = ZS_DQ_MUL(d, (float)sc[1]); /* weights 16..31 */
        break;
    }
    default:
        G.b = row;
        G.d = 0.0f;
        break;
    }
    return G;
}

/* weight j (0..31) of group G */
ZS_DQ_FN float zs_dq_weight(int dt, const zs_dq_group_t *G, int j) {
    const uint8_t *b = G->b;
    switch (dt) {
    case ZS_Q8_0: return ZS_DQ_MUL(G->d, (float)(int8_t)b[2 + j]);
    case ZS_Q4_0: return ZS_DQ_MUL(G->d, (float)(zs_dq_nib(b + 2, j) - 8));
    case ZS_Q4_1: return ZS_DQ_ADD(ZS_DQ_MUL(G->d, (float)zs_dq_nib(b + 4, j)), G->m);
    case ZS_Q5_0: {
        int q = zs_dq_nib(b + 6, j) | (int)(G->qh >> j & 1u) << 4;
        return ZS_DQ_MUL(G->d, (float)(q - 16));
    }
    case ZS_Q5_1: {
        int q = zs_dq_nib(b + 8, j) | (int)(G->qh >> j & 1u) << 4;
        return ZS_DQ_ADD(ZS_DQ_MUL(G->d, (float)q), G->m);
    }
    case ZS_Q4_K: {
        int q = b[16 + 32 * (G->g >> 1) + j] >> (4 * (G->g & 1)) & 15;
        return ZS_DQ_ADD(ZS_DQ_MUL(G->d, (float)q), G->m);
    }
    case ZS_Q6_K: {
        int hn = G->g >> 2, gg = G->g & 3;
        int ql = b[64 * hn + 32 * (gg & 1) + j], qh = b[128 + 32 * hn + j];
        int q = (ql >> (4 * (gg >> 1)) & 15) | (qh >> (2 * gg) & 3) << 4;
        return ZS_DQ_MUL(j < 16 ? G->d : G->m, (float)(q - 32));
    }
    case ZS_Q5_K: {
        int q = (b[48 + 32 * (G->g >> 1) + j] >> (4 * (G->g & 1)) & 15) | (b[16 + j] >> G->g & 1) << 4;
        return ZS_DQ_ADD(ZS_DQ_MUL(G->d, (float)q), G->m);
    }
    case ZS_Q3_K: { /* half g/4, quarter g%4: bits 2·quarter of qs, bit 4·half + quarter of hmask */
        int hn = G->g >> 2, jj = G->g & 3;
        int q = (b[32 + 32 * hn + j] >> (2 * jj) & 3) - ((b[j] >> (4 * hn + jj) & 1) ? 0 : 4);
        return ZS_DQ_MUL(j < 16 ? G->d : G->m, (float)q);
    }
    case ZS_Q2_K: {
        int q = b[16 + 32 * (G->g >> 2) + j] >> (2 * (G->g & 3)) & 3;
        return j < 16 ? ZS_DQ_ADD(ZS_DQ_MUL(G->d, (float)q), G->m) : ZS_DQ_ADD(ZS_DQ_MUL(G->d2, (float)q), G->m2);
    }
    default: return 0.0f;
    }
}

/* weight 8·s + l of group kb of the row at `row` (see the top of this file) */
ZS_DQ_FN float zs_dq_w(int dt, const uint8_t *row, int kb, int s, int l) {
    zs_dq_group_t G = zs_dq_group(dt, row, kb);
    return zs_dq_weight(dt, &G, 8 * s + l);
}

/* weight k (0 <= k < in) of the row */
ZS_DQ_FN float zs_dq_at(int dt, const uint8_t *row, int k) { return zs_dq_w(dt, row, k >> 5, (k >> 3) & 3, k & 7); }

#endif
