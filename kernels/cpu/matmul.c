/* matmul.c — y = x · Wᵀ (+ bias) on the CPU, batch-invariant: a token's output row is the same
 * bits whatever other tokens share the call (OpenBLAS sgemm picks different kernels and blockings
 * by shape, so its rows change with the batch size; continuous batching needs them not to).
 * Weight rows are split into blocks that stay in cache while every token passes over them, and
 * the blocks are spread over the pool's threads. f16/bf16 rows are read as stored and widened in
 * registers by their own kernels (matmul-16-kern.h), so a 16-bit product reads half the bytes of
 * an f32 one; each element's order is fixed there, the same in the generic and AVX2 builds.
 * Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 rows (ggml's 34-, 18-, 20-, 22- and 24-byte blocks of 32) and
 * K-quant rows (Q4_K, Q5_K, Q6_K, Q3_K, Q2_K: 144-, 176-, 210-, 110- and 84-byte super-blocks of
 * 256) are dequantized in registers by
 * matmul-quant-kern.h in the same order, so such a product equals the f32 product over its
 * dequantized weights. */
#include "common.h"
#include "matmul-16.h"
#include "matmul-q8act.h"
#include "ops.h"
#include "pool.h"

/* the kernel's helpers are static, so the vector-return ABI note does not apply */
#pragma GCC diagnostic ignored "-Wpsabi"
#define KERN_NAME(x) zs_kern_generic_##x
#include "matmul-kern.h"

/* the 16-bit kernels without AVX2: the same order, lanes fused one by one (fmaf is exact, so
 * these give the bits of the AVX2 build) */
static inline zs_v8 zs_g16_bf16x8(const uint16_t *p) {
    zs_v8 r;
    for (int i = 0; i < 8; i++) r[i] = zs_matmul_bf16_widen(p[i]);
    return r;
}
static inline zs_v8 zs_g16_f16x8(const uint16_t *p) {
    zs_v8 r;
    for (int i = 0; i < 8; i++) r[i] = zs_f16_to_f32(p[i]);
    return r;
}
#define KERN16_FMA8(a, b, c)                                                   \
    ({                                                                         \
        zs_v8 fa_ = (a), fb_ = (b), fc_ = (c), fr_;                            \
        for (int fi_ = 0; fi_ < 8; fi_++) fr_[fi_] = __builtin_fmaf(fa_[fi_], fb_[fi_], fc_[fi_]); \
        fr_;                                                                   \
    })
#define KERN16_NAME(x) zs_kern16_generic_bf16_##x
#define KERN16_W8(p) zs_g16_bf16x8(p)
#define KERN16_W1(p) zs_matmul_bf16_widen(*(p))
#include "matmul-16-kern.h"
#undef KERN16_NAME
#undef KERN16_W8
#undef KERN16_W1
#define KERN16_NAME(x) zs_kern16_generic_f16_##x
#define KERN16_W8(p) zs_g16_f16x8(p)
#define KERN16_W1(p) zs_f16_to_f32(*(p))
#include "matmul-16-kern.h"
#undef KERN16_NAME
#undef KERN16_W8
#undef KERN16_W1
#undef KERN16_FMA8

/* the block formats without AVX2: the same order, lane by lane */
static inline zs_v8 zs_gq8_w8(const uint8_t *b, int s, zs_v8 dv) {
    const int8_t *q = (const int8_t *)(b + 2 + 8 * s);
    zs_v8 r;
    for (int i = 0; i < 8; i++) r[i] = dv[i] * (float)q[i];
    return r;
}
static inline zs_v8 zs_gq4_w8(const uint8_t *b, int s, zs_v8 dv) {
    const uint8_t *q = b + 2 + 8 * (s & 1);
    int sh = s >= 2 ? 4 : 0;
    zs_v8 r;
    for (int i = 0; i < 8; i++) r[i] = dv[i] * (float)((q[i] >> sh & 15) - 8);
    return r;
}
/* Q4_1 (the nibbles at 4) and Q5_0/Q5_1 (qh at 2 or 4, the nibbles at 6 or 8): weight 8s + i */
static inline int zs_gq5_q(const uint8_t *qs, uint32_t qh, int s, int i) {
    return (qs[8 * (s & 1) + i] >> (s >= 2 ? 4 : 0) & 15) | (int)(qh >> (8 * s + i) & 1) << 4;
}
static inline zs_v8 zs_gq41_w8(const uint8_t *b, int s, zs_v8 dv, zs_v8 mv) {
    zs_v8 r;
    for (int i = 0; i < 8; i++) {
        float p = dv[i] * (float)zs_gq5_q(b + 4, 0, s, i);
        ZS_NOFUSE(p);
        r[i] = p + mv[i];
    }
    return r;
}
static inline zs_v8 zs_gq50_w8(const uint8_t *b, int s, zs_v8 dv) {
    uint32_t qh;
    memcpy(&qh, b + 2, 4);
    zs_v8 r;
    for (int i = 0; i < 8; i++) r[i] = dv[i] * (float)(zs_gq5_q(b + 6, qh, s, i) - 16);
    return r;
}
static inline zs_v8 zs_gq51_w8(const uint8_t *b, int s, zs_v8 dv, zs_v8 mv) {
    uint32_t qh;
    memcpy(&qh, b + 4, 4);
    zs_v8 r;
    for (int i = 0; i < 8; i++) {
        float p = dv[i] * (float)zs_gq5_q(b + 8, qh, s, i);
        ZS_NOFUSE(p);
        r[i] = p + mv[i];
    }
    return r;
}
/* Q4_K (and Q5_K, the same scales) and Q6_K: the group's scales (once per group of 32), then its weights */
static inline void zs_q4k_sm(const uint8_t *q, int j, int *sc, int *m) { /* get_scale_min_k4 */
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}
static inline __attribute__((always_inline)) zs_q8dm zs_gq4k_dv(const uint8_t *b, int g) {
    uint16_t h, hm;
    memcpy(&h, b, 2);
    memcpy(&hm, b + 2, 2);
    int sc, m;
    zs_q4k_sm(b + 4, g, &sc, &m);
    float d1 = zs_f16_to_f32(h) * (float)sc, m1 = zs_f16_to_f32(hm) * (float)m;
    zs_q8dm v = {{d1, d1, d1, d1, d1, d1, d1, d1}, {-m1, -m1, -m1, -m1, -m1, -m1, -m1, -m1}};
    return v;
}
static inline __attribute__((always_inline)) zs_v8 zs_gq4k_w8(const uint8_t *b, int g, int s, zs_v8 dv, zs_v8 mv) {
    const uint8_t *q = b + 16 + 32 * (g >> 1) + 8 * s;
    zs_v8 r;
    for (int i = 0; i < 8; i++) {
        float p = dv[i] * (float)((q[i] >> (4 * (g & 1))) & 15);
        ZS_NOFUSE(p);
        r[i] = p + mv[i];
    }
    return r;
}
/* Q6_K: d·sc of the group's first 16 weights in .d, of its last 16 in .m */
static inline __attribute__((always_inline)) zs_q8dm zs_gq6k_dv(const uint8_t *b, int g) {
    uint16_t h;
    memcpy(&h, b + 208, 2);
    const int8_t *sc = (const int8_t *)(b + 192) + 8 * (g >> 2) + 2 * (g & 3);
    float d = zs_f16_to_f32(h), d0 = d * (float)sc[0], d1 = d * (float)sc[1];
    zs_q8dm v = {{d0, d0, d0, d0, d0, d0, d0, d0}, {d1, d1, d1, d1, d1, d1, d1, d1}};
    return v;
}
static inline __attribute__((always_inline)) zs_v8 zs_gq6k_w8(const uint8_t *b, int g, int s, zs_v8 d0, zs_v8 d1) {
    int hn = g >> 2, gg = g & 3;
    const uint8_t *ql = b + 64 * hn + 32 * (gg & 1) + 8 * s, *qh = b + 128 + 32 * hn + 8 * s;
    zs_v8 r;
    for (int i = 0; i < 8; i++) {
        int q = ((ql[i] >> (4 * (gg >> 1))) & 15) | ((qh[i] >> (2 * gg)) & 3) << 4;
        r[i] = (s < 2 ? d0[i] : d1[i]) * (float)(q - 32);
    }
    return r;
}
/* Q5_K: Q4_K's scales (the same layout), its nibbles at 48 and the fifth bits at 16 (bit g of
 * qh[l] for weight l of group g) */
static inline __attribute__((always_inline)) zs_v8 zs_gq5k_w8(const uint8_t *b, int g, int s, zs_v8 dv, zs_v8 mv) {
    const uint8_t *q = b + 48 + 32 * (g >> 1) + 8 * s, *qh = b + 16 + 8 * s;
    zs_v8 r;
    for (int i = 0; i < 8; i++) {
        float p = dv[i] * (float)(((q[i] >> (4 * (g & 1))) & 15) | ((qh[i] >> g) & 1) << 4);
        ZS_NOFUSE(p);
        r[i] = p + mv[i];
    }
    return r;
}
/* Q3_K: d·(sc - 32) of the group's first 16 weights in .d, of its last 16 in .m (scales 2g, 2g + 1) */
static inline int zs_q3k_sc(const uint8_t *q, int i) { /* scale i of the 12 bytes, -32..31 */
    int lo = i < 8 ? q[i] & 0xF : q[i - 8] >> 4, hi = (q[8 + i % 4] >> (2 * (i / 4))) & 3;
    return (lo | hi << 4) - 32;
}
static inline __attribute__((always_inline)) zs_q8dm zs_gq3k_dv(const uint8_t *b, int g) {
    uint16_t h;
    memcpy(&h, b + 108, 2);
    float d = zs_f16_to_f32(h), d0 = d * (float)zs_q3k_sc(b + 96, 2 * g), d1 = d * (float)zs_q3k_sc(b + 96, 2 * g + 1);
    zs_q8dm v = {{d0, d0, d0, d0, d0, d0, d0, d0}, {d1, d1, d1, d1, d1, d1, d1, d1}};
    return v;
}
/* weight 8s + i of group g (half g/4, quarter g%4): 2 bits of qs, the third of hmask, -4..3 */
static inline __attribute__((always_inline)) zs_v8 zs_gq3k_w8(const uint8_t *b, int g, int s, zs_v8 d0, zs_v8 d1) {
    int hn = g >> 2, j = g & 3;
    const uint8_t *qs = b + 32 + 32 * hn + 8 * s, *hm = b + 8 * s;
    zs_v8 r;
    for (int i = 0; i < 8; i++) {
        int q = ((qs[i] >> (2 * j)) & 3) - (((hm[i] >> (4 * hn + j)) & 1) ? 0 : 4);
        r[i] = (s < 2 ? d0[i] : d1[i]) * (float)q;
    }
    return r;
}
/* Q2_K: a scale and a min per 16: .d lanes 0-3 d·sc of the group's first 16, lanes 4-7 of its
 * last 16; .m the same of -(dmin·m) */
static inline __attribute__((always_inline)) zs_q8dm zs_gq2k_dv(const uint8_t *b, int g) {
    uint16_t h, hm;
    memcpy(&h, b + 80, 2);
    memcpy(&hm, b + 82, 2);
    float d = zs_f16_to_f32(h), dmin = zs_f16_to_f32(hm);
    const uint8_t *sc = b + 2 * g;
    float a0 = d * (float)(sc[0] & 0xF), a1 = d * (float)(sc[1] & 0xF);
    float m0 = -(dmin * (float)(sc[0] >> 4)), m1 = -(dmin * (float)(sc[1] >> 4));
    zs_q8dm v = {{a0, a0, a0, a0, a1, a1, a1, a1}, {m0, m0, m0, m0, m1, m1, m1, m1}};
    return v;
}
static inline __attribute__((always_inline)) zs_v8 zs_gq2k_w8(const uint8_t *b, int g, int s, zs_v8 dv, zs_v8 mv) {
    int hn = g >> 2, j = g & 3, k = s < 2 ? 0 : 4;
    const uint8_t *qs = b + 16 + 32 * hn + 8 * s;
    zs_v8 r;
    for (int i = 0; i < 8; i++) {
        float p = dv[k] * (float)((qs[i] >> (2 * j)) & 3);
        ZS_NOFUSE(p);
        r[i] = p + mv[k];
    }
    return r;
}
#define KQ8_D(h) zs_f16_to_f32(h)
#define KQ8_FMA8(a, b, c)                                                      \
    ({                                                                         \
        zs_v8 fa_ = (a), fb_ = (b), fc_ = (c), fr_;                            \
        for (int fi_ = 0; fi_ < 8; fi_++) fr_[fi_] = __builtin_fmaf(fa_[fi_], fb_[fi_], fc_[fi_]); \
        fr_;                                                                   \
    })
#define KQ8_NAME(x) zs_kq8_generic_##x
#define KQ8_BYTES ZS_Q8_0_BYTES
#define KQ8_W8(b, g, s, dv) zs_gq8_w8((b), (s), (dv).d)
#include "matmul-quant-kern.h"
#undef KQ8_NAME
#undef KQ8_BYTES
#undef KQ8_W8
#define KQ8_NAME(x) zs_kq4_generic_##x
#define KQ8_BYTES ZS_Q4_0_BYTES
#define KQ8_W8(b, g, s, dv) zs_gq4_w8((b), (s), (dv).d)
#include "matmul-quant-kern.h"
#undef KQ8_NAME
#undef KQ8_BYTES
#undef KQ8_W8
#define KQ8_NAME(x) zs_kq41_generic_##x
#define KQ8_BYTES ZS_Q4_1_BYTES
#define KQ8_HAS_MIN 1
#define KQ8_W8(b, g, s, dv) zs_gq41_w8((b), (s), (dv).d, (dv).m)
#include "matmul-quant-kern.h"
#undef KQ8_NAME
#undef KQ8_BYTES
#undef KQ8_W8
#define KQ8_NAME(x) zs_kq50_generic_##x
#define KQ8_BYTES ZS_Q5_0_BYTES
#define KQ8_W8(b, g, s, dv) zs_gq50_w8((b), (s), (dv).d)
#include "matmul-quant-kern.h"
#undef KQ8_NAME
#undef KQ8_BYTES
#undef KQ8_W8
#define KQ8_NAME(x) zs_kq51_generic_##x
#define KQ8_BYTES ZS_Q5_1_BYTES
#define KQ8_HAS_MIN 1
#define KQ8_W8(b, g, s, dv) zs_gq51_w8((b), (s), (dv).d, (dv).m)
#include "matmul-quant-kern.h"
#undef KQ8_NAME
#undef KQ8_BYTES
#undef KQ8_W8
#define KQ8_NAME(x) zs_kq4k_generic_##x
#define KQ8_BYTES ZS_Q4_K_BYTES
#define KQ8_SUB 8
#define KQ8_DVG(b, g) zs_gq4k_dv((b), (g))
#define KQ8_W8(b, g, s, dv) zs_gq4k_w8((b), (g), (s), (dv).d, (dv).m)
#include "matmul-quant-kern.h"
#undef KQ8_NAME
#undef KQ8_BYTES
#undef KQ8_W8
#define KQ8_NAME(x) zs_kq6k_generic_##x
#define KQ8_BYTES ZS_Q6_K_BYTES
#define KQ8_SUB 8
#define KQ8_DVG(b, g) zs_gq6k_dv((b), (g))
#define KQ8_W8(b, g, s, dv) zs_gq6k_w8((b), (g), (s), (dv).d, (dv).m)
#include "matmul-quant-kern.h"
#undef KQ8_NAME
#undef KQ8_BYTES
#undef KQ8_W8
#define KQ8_NAME(x) zs_kq5k_generic_##x
#define KQ8_BYTES ZS_Q5_K_BYTES
#define KQ8_SUB 8
#define KQ8_DVG(b, g) zs_gq4k_dv((b), (g))
#define KQ8_W8(b, g, s, dv) zs_gq5k_w8((b), (g), (s), (dv).d, (dv).m)
#include "matmul-quant-kern.h"
#undef KQ8_NAME
#undef KQ8_BYTES
#undef KQ8_W8
#define KQ8_NAME(x) zs_kq3k_generic_##x
#define KQ8_BYTES ZS_Q3_K_BYTES
#define KQ8_SUB 8
#define KQ8_DVG(b, g) zs_gq3k_dv((b), (g))
#define KQ8_W8(b, g, s, dv) zs_gq3k_w8((b), (g), (s), (dv).d, (dv).m)
#include "matmul-quant-kern.h"
#undef KQ8_NAME
#undef KQ8_BYTES
#undef KQ8_W8
#define KQ8_NAME(x) zs_kq2k_generic_##x
#define KQ8_BYTES ZS_Q2_K_BYTES
#define KQ8_SUB 8
#define KQ8_DVG(b, g) zs_gq2k_dv((b), (g))
#define KQ8_W8(b, g, s, dv) zs_gq2k_w8((b), (g), (s), (dv).d, (dv).m)
#include "matmul-quant-kern.h"
#undef KQ8_NAME
#undef KQ8_BYTES
#undef KQ8_W8
#undef KQ8_D
#undef KQ8_FMA8

void zs_matmul_block_q4_k_generic(float *y, int ldy, const float *x, int T, int in, const uint8_t *W, int R) {
    zs_kq4k_generic_block(y, ldy, x, T, in, W, R);
}
void zs_matmul_block_q6_k_generic(float *y, int ldy, const float *x, int T, int in, const uint8_t *W, int R) {
    zs_kq6k_generic_block(y, ldy, x, T, in, W, R);
}
void zs_matmul_block_q5_k_generic(float *y, int ldy, const float *x, int T, int in, const uint8_t *W, int R) {
    zs_kq5k_generic_block(y, ldy, x, T, in, W, R);
}
void zs_matmul_block_q3_k_generic(float *y, int ldy, const float *x, int T, int in, const uint8_t *W, int R) {
    zs_kq3k_generic_block(y, ldy, x, T, in, W, R);
}
void zs_matmul_block_q2_k_generic(float *y, int ldy, const float *x, int T, int in, const uint8_t *W, int R) {
    zs_kq2k_generic_block(y, ldy, x, T, in, W, R);
}
void zs_matmul_block_q8_0_generic(float *y, int ldy, const float *x, int T, int in, const uint8_t *W, int R) {
    zs_kq8_generic_block(y, ldy, x, T, in, W, R);
}
void zs_matmul_block_q4_0_generic(float *y, int ldy, const float *x, int T, int in, const uint8_t *W, int R) {
    zs_kq4_generic_block(y, ldy, x, T, in, W, R);
}
void zs_matmul_block_q4_1_generic(float *y, int ldy, const float *x, int T, int in, const uint8_t *W, int R) {
    zs_kq41_generic_block(y, ldy, x, T, in, W, R);
}
void zs_matmul_block_q5_0_generic(float *y, int ldy, const float *x, int T, int in, const uint8_t *W, int R) {
    zs_kq50_generic_block(y, ldy, x, T, in, W, R);
}
void zs_matmul_block_q5_1_generic(float *y, int ldy, const float *x, int T, int in, const uint8_t *W, int R) {
    zs_kq51_generic_block(y, ldy, x, T, in, W, R);
}

zs_matmul_blockq8_fn zs_matmul_pick_quant(zs_dtype wdt) {
    __builtin_cpu_init();
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    if (wdt == ZS_Q8_0) return avx2 ? zs_matmul_block_q8_0_avx2 : zs_matmul_block_q8_0_generic;
    if (wdt == ZS_Q4_0) return avx2 ? zs_matmul_block_q4_0_avx2 : zs_matmul_block_q4_0_generic;
    if (wdt == ZS_Q4_1) return avx2 ? zs_matmul_block_q4_1_avx2 : zs_matmul_block_q4_1_generic;
    if (wdt == ZS_Q5_0) return avx2 ? zs_matmul_block_q5_0_avx2 : zs_matmul_block_q5_0_generic;
    if (wdt == ZS_Q5_1) return avx2 ? zs_matmul_block_q5_1_avx2 : zs_matmul_block_q5_1_generic;
    if (wdt == ZS_Q4_K) return avx2 ? zs_matmul_block_q4_k_avx2 : zs_matmul_block_q4_k_generic;
    if (wdt == ZS_Q6_K) return avx2 ? zs_matmul_block_q6_k_avx2 : zs_matmul_block_q6_k_generic;
    if (wdt == ZS_Q5_K) return avx2 ? zs_matmul_block_q5_k_avx2 : zs_matmul_block_q5_k_generic;
    if (wdt == ZS_Q3_K) return avx2 ? zs_matmul_block_q3_k_avx2 : zs_matmul_block_q3_k_generic;
    if (wdt == ZS_Q2_K) return avx2 ? zs_matmul_block_q2_k_avx2 : zs_matmul_block_q2_k_generic;
    return NULL;
}

void zs_matmul_block_bf16_generic(float *y, int ldy, const float *x, int T, int in, const uint16_t *W, int R) {
    zs_kern16_generic_bf16_block(y, ldy, x, T, in, W, R);
}
void zs_matmul_block_f16_generic(float *y, int ldy, const float *x, int T, int in, const uint16_t *W, int R) {
    zs_kern16_generic_f16_block(y, ldy, x, T, in, W, R);
}

typedef void (*block_fn)(float *y, int ldy, const float *x, int T, int in, const float *W, int R);

int zs_matmul_has_avx512(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c") &&
           __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw");
}

static block_fn pick_kernel(void) {
    static block_fn fn;
    if (!fn) {
        __builtin_cpu_init();
        fn = zs_matmul_has_avx512()                                            ? zs_matmul_block_avx512
             : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? zs_matmul_block_avx2
                                                                               : zs_kern_generic_block;
    }
    return fn;
}

zs_matmul_block16_fn zs_matmul_pick16(zs_dtype wdt) {
    /* no cached pointers: the feature checks are cheap, and nothing can be seen half set */
    __builtin_cpu_init();
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"), wide = zs_matmul_has_avx512();
    if (wdt == ZS_BF16)
        return wide ? zs_matmul_block_bf16_avx512 : avx2 ? zs_matmul_block_bf16_avx2 : zs_matmul_block_bf16_generic;
    if (wdt == ZS_F16)
        return wide                                     ? zs_matmul_block_f16_avx512
               : avx2 && __builtin_cpu_supports("f16c") ? zs_matmul_block_f16_avx2
                                                        : zs_matmul_block_f16_generic;
    return NULL;
}

typedef struct {
    float *y;
    const float *x;
    int T, in, out, rows_per_task, tok_tile;
    const void *W;
    zs_dtype wdt;
    block_fn fn;                /* f32 weights */
    zs_matmul_block16_fn fn16;  /* bf16 and f16 weights */
    zs_matmul_blockq8_fn fnq8;  /* block weights (Q8_0 .. Q5_1) */
} mm_job;

static void mm_task(void *arg, int task) {
    mm_job *j = arg;
    int r0 = task * j->rows_per_task, R = ZS_MIN(j->rows_per_task, j->out - r0);
    /* tokens in tiles, so the x rows of a tile stay in L1 while the weight block is reused */
    for (int t0 = 0; t0 < j->T; t0 += j->tok_tile) {
        int tn = ZS_MIN(j->tok_tile, j->T - t0);
        float *y = j->y + (size_t)t0 * j->out + r0;
        const float *x = j->x + (size_t)t0 * j->in;
        if (j->fnq8)
            j->fnq8(y, j->out, x, tn, j->in, (const uint8_t *)j->W + zs_dtype_bytes(j->wdt, (size_t)r0 * j->in), R);
        else if (j->fn16)
            j->fn16(y, j->out, x, tn, j->in, (const uint16_t *)j->W + (size_t)r0 * j->in, R);
        else
            j->fn(y, j->out, x, tn, j->in, (const float *)j->W + (size_t)r0 * j->in, R);
    }
}

void zs_op_matmul(float *y, const float *x, int T, int in, const void *W, zs_dtype wdt, int out,
                  const float *bias) {
    /* block weights: the integer path over 8-bit activations unless ZS_QUANT_ACT=f32
     * (matmul-q8act.h); the exact f32-activation kernels below otherwise */
    if (zs_dtype_is_quant(wdt) && zs_op_matmul_quant_act(-1) == ZS_QUANT_ACT_Q8 &&
        zs_matmul_q8act(y, x, T, in, W, wdt, out) == 0) {
        if (bias)
            for (int t = 0; t < T; t++) zs_op_add(y + (size_t)t * out, bias, (size_t)out);
        return;
    }
    mm_job j = {y, x, T, in, out, 0, 0, W, wdt, pick_kernel(), zs_matmul_pick16(wdt),
                zs_matmul_pick_quant(wdt)};
    /* weight blocks of ~64 KiB as stored, a multiple of 4 rows (the blocking never changes an
     * element's arithmetic, only which thread computes it and when) */
    int rows = (int)((64 * 1024) / ZS_MAX(zs_dtype_bytes(wdt, (size_t)in), (size_t)1));
    rows = ZS_MAX(4, rows & ~3);
    /* but enough blocks to keep every thread busy on small matrices */
    int threads = zs_pool_threads();
    while (rows > 4 && (out + rows - 1) / rows < 4 * threads) rows = ZS_MAX(4, (rows / 2) & ~3);
    j.tok_tile = ZS_MAX(4, (int)((16 * 1024 / 4) / (size_t)ZS_MAX(in, 1)) & ~3);
    /* the AVX-512 f32/16-bit kernels block k themselves (kc4): give them 16+ rows and up to 64
     * tokens a call, so that a 4-row tile's weights are reused from L1 by 16 token tiles */
    if (T >= 4 && !j.fnq8 && zs_matmul_has_avx512()) {
        rows = ZS_MAX(16, rows & ~3);
        j.tok_tile = ZS_MIN(64, T & ~3);
    }
    j.rows_per_task = rows;
    int tasks = (out + rows - 1) / rows;
    /* small products are done here: waking the pool would cost more than the work */
    if ((size_t)out * (size_t)in * (size_t)T < ((size_t)1 << 20))
        for (int t = 0; t < tasks; t++) mm_task(&j, t);
    else
        zs_pool_run(mm_task, &j, tasks);
    if (bias)
        for (int t = 0; t < T; t++) zs_op_add(y + (size_t)t * out, bias, (size_t)out);
}
