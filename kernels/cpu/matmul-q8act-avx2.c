/* matmul-q8act-avx2.c — the integer matmul kernels (matmul-q8act-kern.h) compiled for AVX2 +
 * FMA + F16C, selected at run time by zs_q8a_pick: the weight blocks are unpacked to 32 bytes
 * in registers and multiplied with the 8-bit activations by _mm256_maddubs_epi16 (signed
 * weights through _mm256_sign_epi8, as llama.cpp does) and _mm256_madd_epi16 with the pair
 * scales. Integer sums are exact, so these give the generic build's bits. */
#include "matmul-q8act.h"

#include <string.h>

#pragma GCC diagnostic ignored "-Wpsabi"
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

static inline __attribute__((always_inline)) zs_ka_i32 zs_aka_dot(zs_ka_i8 w, zs_ka_i8 x, zs_ka_i16 sc, int sgn) {
    __m256i wv = (__m256i)w, xv = (__m256i)x, p;
    if (sgn) p = _mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv));
    else p = _mm256_maddubs_epi16(wv, xv);
    return (zs_ka_i32)_mm256_madd_epi16(p, (__m256i)sc);
}
/* 16 bytes of nibbles at q: weights 0..15 the low nibbles, 16..31 the high ones */
static inline __attribute__((always_inline)) __m256i zs_aka_nib(const uint8_t *q) {
    __m128i t = _mm_loadu_si128((const __m128i *)q);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), _mm256_set1_epi8(15));
}
/* the 32 bits at p spread to bytes: 0xFF where bit i is set, else 0 */
static inline __attribute__((always_inline)) __m256i zs_aka_bits(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)v), shuf);
    b = _mm256_or_si256(b, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_cmpeq_epi8(b, _mm256_set1_epi64x(-1));
}
static inline __attribute__((always_inline)) zs_ka_i8 zs_aka_q8_0(const uint8_t *b) {
    return (zs_ka_i8)_mm256_loadu_si256((const __m256i *)(b + 2));
}
static inline __attribute__((always_inline)) zs_ka_i8 zs_aka_q4_0(const uint8_t *b) {
    return (zs_ka_i8)_mm256_sub_epi8(zs_aka_nib(b + 2), _mm256_set1_epi8(8));
}
static inline __attribute__((always_inline)) zs_ka_i8 zs_aka_q4_1(const uint8_t *b) { return (zs_ka_i8)zs_aka_nib(b + 4); }
/* Q5_0: q - 16 = the nibble where the fifth bit is set, the nibble | 0xF0 where it is not */
static inline __attribute__((always_inline)) zs_ka_i8 zs_aka_q5_0(const uint8_t *b) {
    return (zs_ka_i8)_mm256_or_si256(zs_aka_nib(b + 6), _mm256_andnot_si256(zs_aka_bits(b + 2), _mm256_set1_epi8((char)0xF0)));
}
static inline __attribute__((always_inline)) zs_ka_i8 zs_aka_q5_1(const uint8_t *b) {
    return (zs_ka_i8)_mm256_or_si256(zs_aka_nib(b + 8), _mm256_and_si256(zs_aka_bits(b + 4), _mm256_set1_epi8(0x10)));
}
static inline __attribute__((always_inline)) zs_ka_i8 zs_aka_q4k(const uint8_t *b, int g) {
    __m256i q = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * (g >> 1)));
    if (g & 1) q = _mm256_srli_epi16(q, 4);
    return (zs_ka_i8)_mm256_and_si256(q, _mm256_set1_epi8(15));
}
static inline __attribute__((always_inline)) zs_ka_i8 zs_aka_q6k(const uint8_t *b, int g) {
    int hn = g >> 2, gg = g & 3;
    __m256i l = _mm256_loadu_si256((const __m256i *)(b + 64 * hn + 32 * (gg & 1)));
    __m256i h = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * hn));
    if (gg >> 1) l = _mm256_srli_epi16(l, 4);
    l = _mm256_and_si256(l, _mm256_set1_epi8(15));
    h = _mm256_and_si256(_mm256_srli_epi16(h, 2 * gg), _mm256_set1_epi8(3));
    return (zs_ka_i8)_mm256_sub_epi8(_mm256_or_si256(l, _mm256_slli_epi16(h, 4)), _mm256_set1_epi8(32));
}

#define KA_D(h) _cvtsh_ss(h)
#define KA_DOT(w, x, sc) zs_aka_dot((w), (x), (sc), KA_SIGNED)
#define KA_FMA8(a, b, c) ((zs_ka_f32)_mm256_fmadd_ps((__m256)(a), (__m256)(b), (__m256)(c)))
#define KA_NAME(x) zs_ka_avx2_q8_0_##x
#define KA_FMT ZS_KA_Q8_0
#define KA_W(b, g) zs_aka_q8_0(b)
#include "matmul-q8act-kern.h"
#undef KA_NAME
#undef KA_FMT
#undef KA_W
#define KA_NAME(x) zs_ka_avx2_q4_0_##x
#define KA_FMT ZS_KA_Q4_0
#define KA_W(b, g) zs_aka_q4_0(b)
#include "matmul-q8act-kern.h"
#undef KA_NAME
#undef KA_FMT
#undef KA_W
#define KA_NAME(x) zs_ka_avx2_q4_1_##x
#define KA_FMT ZS_KA_Q4_1
#define KA_W(b, g) zs_aka_q4_1(b)
#include "matmul-q8act-kern.h"
#undef KA_NAME
#undef KA_FMT
#undef KA_W
#define KA_NAME(x) zs_ka_avx2_q5_0_##x
#define KA_FMT ZS_KA_Q5_0
#define KA_W(b, g) zs_aka_q5_0(b)
#include "matmul-q8act-kern.h"
#undef KA_NAME
#undef KA_FMT
#undef KA_W
#define KA_NAME(x) zs_ka_avx2_q5_1_##x
#define KA_FMT ZS_KA_Q5_1
#define KA_W(b, g) zs_aka_q5_1(b)
#include "matmul-q8act-kern.h"
#undef KA_NAME
#undef KA_FMT
#undef KA_W
#define KA_NAME(x) zs_ka_avx2_q4_k_##x
#define KA_FMT ZS_KA_Q4_K
#define KA_W(b, g) zs_aka_q4k((b), (g))
#include "matmul-q8act-kern.h"
#undef KA_NAME
#undef KA_FMT
#undef KA_W
#define KA_NAME(x) zs_ka_avx2_q6_k_##x
#define KA_FMT ZS_KA_Q6_K
#define KA_W(b, g) zs_aka_q6k((b), (g))
#include "matmul-q8act-kern.h"
#undef KA_NAME
#undef KA_FMT
#undef KA_W
#undef KA_D
#undef KA_DOT
#undef KA_FMA8

#define ZS_KA_WRAP(f)                                                                                 \
    void zs_q8a_block_##f##_avx2(float *y, int ldy, const zs_q8a *a, int t0, int T, const uint8_t *W, int R) { \
        zs_ka_avx2_##f##_block(y, ldy, a, t0, T, W, R);                                                \
    }
ZS_KA_WRAP(q8_0)
ZS_KA_WRAP(q4_0)
ZS_KA_WRAP(q4_1)
ZS_KA_WRAP(q5_0)
ZS_KA_WRAP(q5_1)
ZS_KA_WRAP(q4_k)
ZS_KA_WRAP(q6_k)
#undef ZS_KA_WRAP
#pragma GCC pop_options
