/* matmul-avx2.c — the batch-invariant matmul kernels compiled for AVX2 + FMA (selected at run
 * time when the CPU has them): f32 (matmul-kern.h), and bf16 and f16 (matmul-16-kern.h, with
 * F16C for f16), which load the 16-bit weights and widen them in registers; Q8_0, Q4_0,
 * Q4_1, Q5_0, Q5_1 and the K-quants Q4_K, Q5_K, Q6_K, Q3_K, Q2_K (matmul-quant-kern.h), which
 * dequantize ggml's blocks in registers. */
#include "matmul-16.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define KERN_NAME(x) zs_kern_avx2_##x
#include "matmul-kern.h"

void zs_matmul_block_avx2(float *y, int ldy, const float *x, int T, int in, const float *W, int R) {
    zs_kern_avx2_block(y, ldy, x, T, in, W, R);
}
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

/* bf16 → f32: the 16 bits become the high half of the f32 (exact). The 8 values are loaded into
 * both 128-bit halves and one byte shuffle puts values 0-3 (low half) and 4-7 (high half) into
 * the high bytes of the f32 lanes, zeros below. */
static inline __m256 zs_bf16x8_avx2(const uint16_t *p) {
    const __m256i m = _mm256_setr_epi8(-128, -128, 0, 1, -128, -128, 2, 3, -128, -128, 4, 5, -128, -128, 6, 7,
                                       -128, -128, 8, 9, -128, -128, 10, 11, -128, -128, 12, 13, -128, -128, 14, 15);
    return _mm256_castsi256_ps(_mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p)), m));
}
#define KERN16_NAME(x) zs_kern16_avx2_bf16_##x
#define KERN16_W8(p) ((zs_v8)zs_bf16x8_avx2(p))
#define KERN16_W1(p) zs_matmul_bf16_widen(*(p))
#define KERN16_FMA8(a, b, c) ((zs_v8)_mm256_fmadd_ps((__m256)(a), (__m256)(b), (__m256)(c)))
#include "matmul-16-kern.h"
#undef KERN16_NAME
#undef KERN16_W8
#undef KERN16_W1

/* f16 → f32 with F16C (exact) */
#define KERN16_NAME(x) zs_kern16_avx2_f16_##x
#define KERN16_W8(p) ((zs_v8)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p))))
#define KERN16_W1(p) _cvtsh_ss(*(p))
#include "matmul-16-kern.h"
#undef KERN16_NAME
#undef KERN16_W8
#undef KERN16_W1

/* Q8_0: 8 int8 sign-extended to i32, converted (exact), times the broadcast scale; Q4_0: 8
 * bytes of nibbles (low for s < 2, high after), minus 8, converted, times the scale */
static inline __m256 zs_q8x8_avx2(const uint8_t *b, int s, __m256 dv) {
    __m128i v = _mm_loadl_epi64((const __m128i *)(b + 2 + 8 * s));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)), dv);
}
static inline __m256 zs_q4x8_avx2(const uint8_t *b, int s, __m256 dv) {
    __m128i v = _mm_loadl_epi64((const __m128i *)(b + 2 + 8 * (s & 1)));
    if (s >= 2) v = _mm_srli_epi16(v, 4);
    v = _mm_and_si128(v, _mm_set1_epi8(15));
    __m256i q = _mm256_sub_epi32(_mm256_cvtepu8_epi32(v), _mm256_set1_epi32(8));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(q), dv);
}
/* Q4_1/Q5_0/Q5_1: the 8 nibbles of weights 8s..8s+7 (qs at the block's nibbles) as i32, and
 * their fifth bits (bit 8s+i of qh) as 16 or 0 */
static inline __m256i zs_nib8_avx2(const uint8_t *qs, int s) {
    __m128i v = _mm_loadl_epi64((const __m128i *)(qs + 8 * (s & 1)));
    if (s >= 2) v = _mm_srli_epi16(v, 4);
    return _mm256_cvtepu8_epi32(_mm_and_si128(v, _mm_set1_epi8(15)));
}
static inline __m256i zs_hi8_avx2(const uint8_t *qhp, int s) {
    uint32_t qh;
    memcpy(&qh, qhp, 4);
    const __m256i bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    __m256i h = _mm256_and_si256(_mm256_set1_epi32((int)(qh >> (8 * s) & 0xffu)), bits);
    return _mm256_and_si256(_mm256_cmpeq_epi32(h, bits), _mm256_set1_epi32(16));
}
/* d·q rounded, then + m rounded: the barrier keeps the compiler from fusing them */
static inline __m256 zs_dqm_avx2(__m256i q, __m256 dv, __m256 mv) {
    __m256 p = _mm256_mul_ps(_mm256_cvtepi32_ps(q), dv);
    ZS_NOFUSE(p);
    return _mm256_add_ps(p, mv);
}
static inline __m256 zs_q41x8_avx2(const uint8_t *b, int s, __m256 dv, __m256 mv) {
    return zs_dqm_avx2(zs_nib8_avx2(b + 4, s), dv, mv);
}
static inline __m256 zs_q50x8_avx2(const uint8_t *b, int s, __m256 dv) {
    __m256i q = _mm256_or_si256(zs_nib8_avx2(b + 6, s), zs_hi8_avx2(b + 2, s));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q, _mm256_set1_epi32(16))), dv);
}
static inline __m256 zs_q51x8_avx2(const uint8_t *b, int s, __m256 dv, __m256 mv) {
    return zs_dqm_avx2(_mm256_or_si256(zs_nib8_avx2(b + 8, s), zs_hi8_avx2(b + 4, s)), dv, mv);
}
/* Q4_K: group g's nibbles (low for even g, high for odd) of bytes 32(g/2).., d1·q + (-m1). The
 * bytes of weights 16(s/2).. are unpacked 16 at a time (steps s and s+1 compute the same vector;
 * the compiler keeps one), then the 8 of step s widened. */
static inline __m256 zs_q4kx8_avx2(const uint8_t *b, int g, int s, __m256 dv, __m256 mv) {
    __m128i v = _mm_loadu_si128((const __m128i *)(b + 16 + 32 * (g >> 1) + 16 * (s >> 1)));
    if (g & 1) v = _mm_srli_epi16(v, 4);
    v = _mm_and_si128(v, _mm_set1_epi8(15));
    if (s & 1) v = _mm_srli_si128(v, 8);
    return zs_dqm_avx2(_mm256_cvtepu8_epi32(v), dv, mv);
}
/* Q6_K: the low nibble of ql and the 2 bits of qh of weights 8s.. of group g, minus 32, times
 * the scale of their 16 (d0 for s < 2, d1 after); unpacked 16 at a time as Q4_K's */
static inline __m256 zs_q6kx8_avx2(const uint8_t *b, int g, int s, __m256 d0, __m256 d1) {
    int hn = g >> 2, gg = g & 3;
    __m128i lo = _mm_loadu_si128((const __m128i *)(b + 64 * hn + 32 * (gg & 1) + 16 * (s >> 1)));
    __m128i hi = _mm_loadu_si128((const __m128i *)(b + 128 + 32 * hn + 16 * (s >> 1)));
    lo = _mm_and_si128(_mm_srli_epi16(lo, 4 * (gg >> 1)), _mm_set1_epi8(15));
    hi = _mm_and_si128(_mm_srli_epi16(hi, 2 * gg), _mm_set1_epi8(3));
    __m128i q = _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), _mm_set1_epi8(32));
    if (s & 1) q = _mm_srli_si128(q, 8);
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), s < 2 ? d0 : d1);
}
/* Q5_K: Q4_K's nibbles (at 48) with the fifth bits of qh (at 16: bit g of qh[l] for weight l of
 * group g) as 16 */
static inline __m256 zs_q5kx8_avx2(const uint8_t *b, int g, int s, __m256 dv, __m256 mv) {
    __m128i v = _mm_loadu_si128((const __m128i *)(b + 48 + 32 * (g >> 1) + 16 * (s >> 1)));
    __m128i h = _mm_loadu_si128((const __m128i *)(b + 16 + 16 * (s >> 1)));
    if (g & 1) v = _mm_srli_epi16(v, 4);
    v = _mm_and_si128(v, _mm_set1_epi8(15));
    h = _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(h, g), _mm_set1_epi8(1)), 4);
    v = _mm_or_si128(v, h);
    if (s & 1) v = _mm_srli_si128(v, 8);
    return zs_dqm_avx2(_mm256_cvtepu8_epi32(v), dv, mv);
}
/* Q3_K: the 2 bits of qs and the third bit of hmask of weights 8s.. of group g (half g/4,
 * quarter j = g%4: bits 2j of qs, bit 4·half + j of hmask), q = low + 4·high - 4, times the scale
 * of their 16; unpacked 16 at a time as Q4_K's */
static inline __m256 zs_q3kx8_avx2(const uint8_t *b, int g, int s, __m256 d0, __m256 d1) {
    int hn = g >> 2, j = g & 3;
    __m128i lo = _mm_loadu_si128((const __m128i *)(b + 32 + 32 * hn + 16 * (s >> 1)));
    __m128i hi = _mm_loadu_si128((const __m128i *)(b + 16 * (s >> 1)));
    lo = _mm_and_si128(_mm_srli_epi16(lo, 2 * j), _mm_set1_epi8(3));
    hi = _mm_and_si128(_mm_srli_epi16(hi, 4 * hn + j), _mm_set1_epi8(1));
    __m128i q = _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(hi, 2)), _mm_set1_epi8(4));
    if (s & 1) q = _mm_srli_si128(q, 8);
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), s < 2 ? d0 : d1);
}
/* Q2_K: the 2 bits of weights 8s.. of group g, times d·sc of their 16, plus -(dmin·m): dv and mv
 * hold the first 16's in lanes 0-3, the second's in lanes 4-7 (both halves broadcast here) */
static inline __m256 zs_q2kx8_avx2(const uint8_t *b, int g, int s, __m256 dv, __m256 mv) {
    int hn = g >> 2, j = g & 3;
    __m128i v = _mm_loadu_si128((const __m128i *)(b + 16 + 32 * hn + 16 * (s >> 1)));
    v = _mm_and_si128(_mm_srli_epi16(v, 2 * j), _mm_set1_epi8(3));
    if (s & 1) v = _mm_srli_si128(v, 8);
    __m256 d = s < 2 ? _mm256_permute2f128_ps(dv, dv, 0x00) : _mm256_permute2f128_ps(dv, dv, 0x11);
    __m256 m = s < 2 ? _mm256_permute2f128_ps(mv, mv, 0x00) : _mm256_permute2f128_ps(mv, mv, 0x11);
    return zs_dqm_avx2(_mm256_cvtepu8_epi32(v), d, m);
}
/* Once per super-block: the 8 groups' d1 = f32(d)·sc and -m1 = -(f32(dmin)·m) (Q4_K), or the 16
 * scales d·sc of Q6_K, as vectors (the same rounded products as per group), kept for the group
 * loop to broadcast from */
typedef struct { float v[16]; } zs_qk_ctx;
static inline zs_qk_ctx zs_q4k_prep_avx2(const uint8_t *b) {
    uint16_t h, hm;
    memcpy(&h, b, 2);
    memcpy(&hm, b + 2, 2);
    /* get_scale_min_k4 for j = 0..7 on the three little-endian words of the 12 scale bytes: bytes
     * 0-3 sc[0..3] (low 6 bits; their top 2 bits are sc[4..7]'s high bits), 4-7 m[0..3] (top 2 bits:
     * m[4..7]'s), 8-11 the low nibbles of sc[4..7] and the high nibbles of m[4..7] */
    uint32_t u[3], sc[2], mn[2];
    memcpy(u, b + 4, 12);
    sc[0] = u[0] & 0x3f3f3f3fu;
    mn[0] = u[1] & 0x3f3f3f3fu;
    sc[1] = (u[2] & 0x0f0f0f0fu) | ((u[0] >> 2) & 0x30303030u);
    mn[1] = ((u[2] >> 4) & 0x0f0f0f0fu) | ((u[1] >> 2) & 0x30303030u);
    __m256 s = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)sc)));
    __m256 m = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)mn)));
    zs_qk_ctx c;
    _mm256_storeu_ps(c.v, _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(h)), s));
    _mm256_storeu_ps(c.v + 8, _mm256_xor_ps(_mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(hm)), m), _mm256_set1_ps(-0.0f)));
    return c;
}
/* Q3_K: the 16 scales d·(sc - 32), as Q6_K's */
static inline zs_qk_ctx zs_q3k_prep_avx2(const uint8_t *b) {
    uint16_t h;
    memcpy(&h, b + 108, 2);
    const uint8_t *q = b + 96;
    int8_t sc[16];
    for (int i = 0; i < 16; i++) {
        int lo = i < 8 ? q[i] & 0xF : q[i - 8] >> 4, hi = (q[8 + i % 4] >> (2 * (i / 4))) & 3;
        sc[i] = (int8_t)((lo | hi << 4) - 32);
    }
    __m256 d = _mm256_set1_ps(_cvtsh_ss(h));
    __m128i v = _mm_loadu_si128((const __m128i *)sc);
    zs_qk_ctx c;
    _mm256_storeu_ps(c.v, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v))));
    _mm256_storeu_ps(c.v + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v, 8)))));
    return c;
}
/* Q2_K: the 16 d·sc and the 16 -(dmin·m) of the 16s */
typedef struct { float d[16], m[16]; } zs_q2k_ctx;
static inline zs_q2k_ctx zs_q2k_prep_avx2(const uint8_t *b) {
    uint16_t h, hm;
    memcpy(&h, b + 80, 2);
    memcpy(&hm, b + 82, 2);
    __m128i v = _mm_loadu_si128((const __m128i *)b);
    __m128i s = _mm_and_si128(v, _mm_set1_epi8(15)), m = _mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(15));
    __m256 d = _mm256_set1_ps(_cvtsh_ss(h)), dm = _mm256_set1_ps(_cvtsh_ss(hm)), neg = _mm256_set1_ps(-0.0f);
    zs_q2k_ctx c;
    _mm256_storeu_ps(c.d, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(s))));
    _mm256_storeu_ps(c.d + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(s, 8)))));
    _mm256_storeu_ps(c.m, _mm256_xor_ps(_mm256_mul_ps(dm, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(m))), neg));
    _mm256_storeu_ps(c.m + 8,
                     _mm256_xor_ps(_mm256_mul_ps(dm, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(m, 8)))), neg));
    return c;
}
static inline zs_q8dm zs_q2k_dvc_avx2(const zs_q2k_ctx *c, int g) {
    zs_q8dm v = {(zs_q8v)_mm256_set_m128(_mm_set1_ps(c->d[2 * g + 1]), _mm_set1_ps(c->d[2 * g])),
                 (zs_q8v)_mm256_set_m128(_mm_set1_ps(c->m[2 * g + 1]), _mm_set1_ps(c->m[2 * g]))};
    return v;
}
static inline zs_qk_ctx zs_q6k_prep_avx2(const uint8_t *b) {
    uint16_t h;
    memcpy(&h, b + 208, 2);
    __m256 d = _mm256_set1_ps(_cvtsh_ss(h));
    __m128i sc = _mm_loadu_si128((const __m128i *)(b + 192));
    zs_qk_ctx c;
    _mm256_storeu_ps(c.v, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc))));
    _mm256_storeu_ps(c.v + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8)))));
    return c;
}
/* group g: Q4_K (d1[g], -m1[g]); Q6_K the scales of its two 16s, 2g and 2g + 1 */
static inline zs_q8dm zs_q4k_dvc_avx2(const zs_qk_ctx *c, int g) {
    zs_q8dm v = {(zs_q8v)_mm256_broadcast_ss(c->v + g), (zs_q8v)_mm256_broadcast_ss(c->v + 8 + g)};
    return v;
}
static inline zs_q8dm zs_q6k_dvc_avx2(const zs_qk_ctx *c, int g) {
    zs_q8dm v = {(zs_q8v)_mm256_broadcast_ss(c->v + 2 * g), (zs_q8v)_mm256_broadcast_ss(c->v + 2 * g + 1)};
    return v;
}
#define KQ8_D(h) _cvtsh_ss(h)
#define KQ8_FMA8(a, b, c) ((zs_v8)_mm256_fmadd_ps((__m256)(a), (__m256)(b), (__m256)(c)))
#define KQ8_NAME(x) zs_kq8_avx2_##x
#define KQ8_BYTES 34
#define KQ8_W8(b, g, s, dv) ((zs_v8)zs_q8x8_avx2((b), (s), (__m256)(dv).d))
#include "matmul-quant-kern.h"
#undef KQ8_NAME
#undef KQ8_BYTES
#undef KQ8_W8
#define KQ8_NAME(x) zs_kq4_avx2_##x
#define KQ8_BYTES 18
#define KQ8_W8(b, g, s, dv) ((zs_v8)zs_q4x8_avx2((b), (s), (__m256)(dv).d))
#include "matmul-quant-kern.h"
#undef KQ8_NAME
#undef KQ8_BYTES
#undef KQ8_W8
#define KQ8_NAME(x) zs_kq41_avx2_##x
#define KQ8_BYTES 20
#define KQ8_HAS_MIN 1
#define KQ8_W8(b, g, s, dv) ((zs_v8)zs_q41x8_avx2((b), (s), (__m256)(dv).d, (__m256)(dv).m))
#include "matmul-quant-kern.h"
#undef KQ8_NAME
#undef KQ8_BYTES
#undef KQ8_W8
#define KQ8_NAME(x) zs_kq50_avx2_##x
#define KQ8_BYTES 22
#define KQ8_W8(b, g, s, dv) ((zs_v8)zs_q50x8_avx2((b), (s), (__m256)(dv).d))
#include "matmul-quant-kern.h"
#undef KQ8_NAME
#undef KQ8_BYTES
#undef KQ8_W8
#define KQ8_NAME(x) zs_kq51_avx2_##x
#define KQ8_BYTES 24
#define KQ8_HAS_MIN 1
#define KQ8_W8(b, g, s, dv) ((zs_v8)zs_q51x8_avx2((b), (s), (__m256)(dv).d, (__m256)(dv).m))
#include "matmul-quant-kern.h"
#undef KQ8_NAME
#undef KQ8_BYTES
#undef KQ8_W8
#define KQ8_NAME(x) zs_kq4k_avx2_##x
#define KQ8_BYTES 144
#define KQ8_SUB 8
#define KQ8_CTX zs_qk_ctx
#define KQ8_PREP(b) zs_q4k_prep_avx2(b)
#define KQ8_DVC(c, g) zs_q4k_dvc_avx2(&(c), (g))
#define KQ8_W8(b, g, s, dv) ((zs_v8)zs_q4kx8_avx2((b), (g), (s), (__m256)(dv).d, (__m256)(dv).m))
#include "matmul-quant-kern.h"
#undef KQ8_NAME
#undef KQ8_BYTES
#undef KQ8_W8
#define KQ8_NAME(x) zs_kq6k_avx2_##x
#define KQ8_BYTES 210
#define KQ8_SUB 8
#define KQ8_CTX zs_qk_ctx
#define KQ8_PREP(b) zs_q6k_prep_avx2(b)
#define KQ8_UNROLL 4 /* the shifts of a group (g & 3) become constants */
#define KQ8_DVC(c, g) zs_q6k_dvc_avx2(&(c), (g))
#define KQ8_W8(b, g, s, dv) ((zs_v8)zs_q6kx8_avx2((b), (g), (s), (__m256)(dv).d, (__m256)(dv).m))
#include "matmul-quant-kern.h"
#undef KQ8_NAME
#undef KQ8_BYTES
#undef KQ8_W8
#define KQ8_NAME(x) zs_kq5k_avx2_##x
#define KQ8_BYTES 176
#define KQ8_SUB 8
#define KQ8_CTX zs_qk_ctx
#define KQ8_PREP(b) zs_q4k_prep_avx2(b) /* Q4_K's d, dmin and scales, at the same offsets */
#define KQ8_DVC(c, g) zs_q4k_dvc_avx2(&(c), (g))
#define KQ8_W8(b, g, s, dv) ((zs_v8)zs_q5kx8_avx2((b), (g), (s), (__m256)(dv).d, (__m256)(dv).m))
#include "matmul-quant-kern.h"
#undef KQ8_NAME
#undef KQ8_BYTES
#undef KQ8_W8
#define KQ8_NAME(x) zs_kq3k_avx2_##x
#define KQ8_BYTES 110
#define KQ8_SUB 8
#define KQ8_CTX zs_qk_ctx
#define KQ8_PREP(b) zs_q3k_prep_avx2(b)
#define KQ8_UNROLL 4
#define KQ8_DVC(c, g) zs_q6k_dvc_avx2(&(c), (g))
#define KQ8_W8(b, g, s, dv) ((zs_v8)zs_q3kx8_avx2((b), (g), (s), (__m256)(dv).d, (__m256)(dv).m))
#include "matmul-quant-kern.h"
#undef KQ8_NAME
#undef KQ8_BYTES
#undef KQ8_W8
#define KQ8_NAME(x) zs_kq2k_avx2_##x
#define KQ8_BYTES 84
#define KQ8_SUB 8
#define KQ8_CTX zs_q2k_ctx
#define KQ8_PREP(b) zs_q2k_prep_avx2(b)
#define KQ8_UNROLL 4
#define KQ8_DVC(c, g) zs_q2k_dvc_avx2(&(c), (g))
#define KQ8_W8(b, g, s, dv) ((zs_v8)zs_q2kx8_avx2((b), (g), (s), (__m256)(dv).d, (__m256)(dv).m))
#include "matmul-quant-kern.h"
#undef KQ8_NAME
#undef KQ8_BYTES
#undef KQ8_W8
#undef KQ8_D
#undef KQ8_FMA8
#undef KERN16_FMA8

void zs_matmul_block_q4_k_avx2(float *y, int ldy, const float *x, int T, int in, const uint8_t *W, int R) {
    zs_kq4k_avx2_block(y, ldy, x, T, in, W, R);
}
void zs_matmul_block_q6_k_avx2(float *y, int ldy, const float *x, int T, int in, const uint8_t *W, int R) {
    zs_kq6k_avx2_block(y, ldy, x, T, in, W, R);
}
void zs_matmul_block_q5_k_avx2(float *y, int ldy, const float *x, int T, int in, const uint8_t *W, int R) {
    zs_kq5k_avx2_block(y, ldy, x, T, in, W, R);
}
void zs_matmul_block_q3_k_avx2(float *y, int ldy, const float *x, int T, int in, const uint8_t *W, int R) {
    zs_kq3k_avx2_block(y, ldy, x, T, in, W, R);
}
void zs_matmul_block_q2_k_avx2(float *y, int ldy, const float *x, int T, int in, const uint8_t *W, int R) {
    zs_kq2k_avx2_block(y, ldy, x, T, in, W, R);
}

void zs_matmul_block_q8_0_avx2(float *y, int ldy, const float *x, int T, int in, const uint8_t *W, int R) {
    zs_kq8_avx2_block(y, ldy, x, T, in, W, R);
}
void zs_matmul_block_q4_0_avx2(float *y, int ldy, const float *x, int T, int in, const uint8_t *W, int R) {
    zs_kq4_avx2_block(y, ldy, x, T, in, W, R);
}
void zs_matmul_block_q4_1_avx2(float *y, int ldy, const float *x, int T, int in, const uint8_t *W, int R) {
    zs_kq41_avx2_block(y, ldy, x, T, in, W, R);
}
void zs_matmul_block_q5_0_avx2(float *y, int ldy, const float *x, int T, int in, const uint8_t *W, int R) {
    zs_kq50_avx2_block(y, ldy, x, T, in, W, R);
}
void zs_matmul_block_q5_1_avx2(float *y, int ldy, const float *x, int T, int in, const uint8_t *W, int R) {
    zs_kq51_avx2_block(y, ldy, x, T, in, W, R);
}

void zs_matmul_block_bf16_avx2(float *y, int ldy, const float *x, int T, int in, const uint16_t *W, int R) {
    zs_kern16_avx2_bf16_block(y, ldy, x, T, in, W, R);
}
void zs_matmul_block_f16_avx2(float *y, int ldy, const float *x, int T, int in, const uint16_t *W, int R) {
    zs_kern16_avx2_f16_block(y, ldy, x, T, in, W, R);
}
#pragma GCC pop_options
