/* matmul-q8act-x86.h — the x86 builds of the integer matmul kernels (matmul-q8act-kern.h),
 * included by matmul-q8act-avx2.c (AVX2+FMA+F16C) and matmul-q8act-avx512.c (AVX-512VL/BW +
 * VNNI on the same 256-bit vectors: 32 registers, four-byte dot products in one instruction),
 * each under its own target pragma. The including file defines ZS_AKA(x) (the names), ZS_AKA_VNNI
 * (0 or 1) and the tile shapes ZS_AKA_TR32/TT32 (blocks of 32), ZS_AKA_TRK/TTK (K-quants) and
 * ZS_AKA_DR (decode rows). Weight blocks are unpacked to 32 bytes in registers and multiplied with
 * the 8-bit activations by _mm256_maddubs_epi16 (signed weights through _mm256_sign_epi8, as
 * llama.cpp does) and _mm256_madd_epi16 with the pair scales, or by vpdpbusd / vpdpwssd. Integer
 * sums are exact, so every build gives the generic build's bits. Not a public header. */
#include <immintrin.h>
#include <string.h>

#include "matmul-q8act.h"
#include "scratch.h"

static inline __attribute__((always_inline)) zs_ka_i32 ZS_AKA(dot)(zs_ka_i32 acc, zs_ka_i8 w, zs_ka_i8 x, zs_ka_i16 sc,
                                                                   int sgn, int scaled) {
    __m256i wv = (__m256i)w, xv = (__m256i)x, a = (__m256i)acc;
    if (sgn) {
        xv = _mm256_sign_epi8(xv, wv);
        wv = _mm256_sign_epi8(wv, wv);
    }
#if ZS_AKA_VNNI
    if (!scaled) return (zs_ka_i32)_mm256_dpbusd_epi32(a, wv, xv);
    return (zs_ka_i32)_mm256_dpwssd_epi32(a, _mm256_maddubs_epi16(wv, xv), (__m256i)sc);
#else
    (void)scaled;
    return (zs_ka_i32)_mm256_add_epi32(a, _mm256_madd_epi16(_mm256_maddubs_epi16(wv, xv), (__m256i)sc));
#endif
}
/* acc + the 8 int32 lanes of four products of unsigned u and signed x bytes (no sum here can
 * saturate maddubs: the packed u are at most 63 in the AVX2 build) */
static inline __attribute__((always_inline)) __m256i ZS_AKA(dpbusd)(__m256i acc, __m256i u, __m256i x) {
#if ZS_AKA_VNNI
    return _mm256_dpbusd_epi32(acc, u, x);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1)));
#endif
}
static inline __attribute__((always_inline)) zs_ka_i32 ZS_AKA(xsum)(zs_ka_i8 x) {
#if ZS_AKA_VNNI
    return (zs_ka_i32)_mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(1), (__m256i)x);
#else
    return (zs_ka_i32)_mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), (__m256i)x), _mm256_set1_epi16(1));
#endif
}
static inline __attribute__((always_inline)) zs_ka_i16 ZS_AKA(scv_k4)(const uint8_t *p) {
    return (zs_ka_i16)_mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)p)));
}
static inline __attribute__((always_inline)) zs_ka_i16 ZS_AKA(scv_k6)(const uint8_t *p) {
    __m128i s = _mm_loadu_si128((const __m128i *)p);
    s = _mm_shuffle_epi8(s, _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15));
    return (zs_ka_i16)_mm256_cvtepi8_epi16(s);
}
static inline __attribute__((always_inline)) zs_ka_i16 ZS_AKA(pick)(zs_ka_i16 v, int g) {
    return (zs_ka_i16)_mm256_shuffle_epi8((__m256i)v, _mm256_set1_epi16((short)(0x0100 + 0x0202 * g)));
}
static inline __attribute__((always_inline)) zs_ka_i16 ZS_AKA(mn2)(const uint8_t *p) {
    __m128i m = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)p));
    return (zs_ka_i16)_mm256_set_m128i(_mm_unpackhi_epi16(m, m), _mm_unpacklo_epi16(m, m));
}
static inline __attribute__((always_inline)) int ZS_AKA(isum)(zs_ka_i32 v) {
    __m256i p = (__m256i)v;
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}
static inline __attribute__((always_inline)) int ZS_AKA(msum)(zs_ka_i16 v, const int16_t *bs) {
    return ZS_AKA(isum)((zs_ka_i32)_mm256_madd_epi16((__m256i)v, _mm256_loadu_si256((const __m256i *)bs)));
}
/* the eight chains of 8 outputs summed pairwise, as zs_ka_tree */
static inline __attribute__((always_inline)) __m256 ZS_AKA(tree)(const __m256 *a) {
    return _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3])),
                         _mm256_add_ps(_mm256_add_ps(a[4], a[5]), _mm256_add_ps(a[6], a[7])));
}
/* the lane sums of 8 vectors: lane r = Σ of v[r]'s lanes */
static inline __attribute__((always_inline)) __m256i ZS_AKA(isum8)(const zs_ka_i32 *v) {
    __m256i h01 = _mm256_hadd_epi32((__m256i)v[0], (__m256i)v[1]), h23 = _mm256_hadd_epi32((__m256i)v[2], (__m256i)v[3]);
    __m256i h45 = _mm256_hadd_epi32((__m256i)v[4], (__m256i)v[5]), h67 = _mm256_hadd_epi32((__m256i)v[6], (__m256i)v[7]);
    __m256i a = _mm256_hadd_epi32(h01, h23), b = _mm256_hadd_epi32(h45, h67);
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

/* 16 bytes of nibbles at q: weights 0..15 the low nibbles, 16..31 the high ones */
static inline __attribute__((always_inline)) __m256i ZS_AKA(nib)(const uint8_t *q) {
    __m128i t = _mm_loadu_si128((const __m128i *)q);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), _mm256_set1_epi8(15));
}
/* the 32 bits at p spread to bytes: 0x10 where bit i is set, else 0 */
static inline __attribute__((always_inline)) __m256i ZS_AKA(bit4)(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)v), shuf);
    b = _mm256_or_si256(b, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_and_si256(_mm256_cmpeq_epi8(b, _mm256_set1_epi64x(-1)), _mm256_set1_epi8(0x10));
}
static inline __attribute__((always_inline)) zs_ka_i8 ZS_AKA(q8_0)(const uint8_t *b) {
    return (zs_ka_i8)_mm256_loadu_si256((const __m256i *)(b + 2));
}
static inline __attribute__((always_inline)) zs_ka_i8 ZS_AKA(q5)(const uint8_t *q, const uint8_t *qh) {
    return (zs_ka_i8)_mm256_or_si256(ZS_AKA(nib)(q), ZS_AKA(bit4)(qh));
}
static inline __attribute__((always_inline)) zs_ka_i8 ZS_AKA(q4k)(const uint8_t *b, int g) {
    __m256i q = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * (g >> 1)));
    if (g & 1) q = _mm256_srli_epi16(q, 4);
    return (zs_ka_i8)_mm256_and_si256(q, _mm256_set1_epi8(15));
}
static inline __attribute__((always_inline)) zs_ka_i8 ZS_AKA(q6k)(const uint8_t *b, int g) {
    int hn = g >> 2, gg = g & 3;
    __m256i l = _mm256_loadu_si256((const __m256i *)(b + 64 * hn + 32 * (gg & 1)));
    __m256i h = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * hn));
    if (gg >> 1) l = _mm256_srli_epi16(l, 4);
    l = _mm256_and_si256(l, _mm256_set1_epi8(15));
    h = _mm256_and_si256(_mm256_srli_epi16(h, 2 * gg), _mm256_set1_epi8(3));
    return (zs_ka_i8)_mm256_sub_epi8(_mm256_or_si256(l, _mm256_slli_epi16(h, 4)), _mm256_set1_epi8(32));
}
/* Q5_K: Q4_K's nibbles (at 48) | the fifth bits (bit g of the qh bytes at 16) as 16 */
static inline __attribute__((always_inline)) zs_ka_i8 ZS_AKA(q5k)(const uint8_t *b, int g) {
    __m256i q = _mm256_loadu_si256((const __m256i *)(b + 48 + 32 * (g >> 1)));
    __m256i h = _mm256_loadu_si256((const __m256i *)(b + 16));
    if (g & 1) q = _mm256_srli_epi16(q, 4);
    q = _mm256_and_si256(q, _mm256_set1_epi8(15));
    h = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, g), _mm256_set1_epi8(1)), 4);
    return (zs_ka_i8)_mm256_or_si256(q, h);
}
/* Q3_K: (bits 2j of qs | bit 4·half + j of hmask as 4) - 4 */
static inline __attribute__((always_inline)) zs_ka_i8 ZS_AKA(q3k)(const uint8_t *b, int g) {
    int hn = g >> 2, j = g & 3;
    __m256i l = _mm256_loadu_si256((const __m256i *)(b + 32 + 32 * hn));
    __m256i h = _mm256_loadu_si256((const __m256i *)b);
    l = _mm256_and_si256(_mm256_srli_epi16(l, 2 * j), _mm256_set1_epi8(3));
    h = _mm256_and_si256(_mm256_srli_epi16(h, 4 * hn + j), _mm256_set1_epi8(1));
    return (zs_ka_i8)_mm256_sub_epi8(_mm256_or_si256(l, _mm256_slli_epi16(h, 2)), _mm256_set1_epi8(4));
}
/* Q2_K: bits 2j of qs (at 16) */
static inline __attribute__((always_inline)) zs_ka_i8 ZS_AKA(q2k)(const uint8_t *b, int g) {
    __m256i q = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * (g >> 2)));
    return (zs_ka_i8)_mm256_and_si256(_mm256_srli_epi16(q, 2 * (g & 3)), _mm256_set1_epi8(3));
}

#define KA_D(h) _cvtsh_ss(h)
#define KA_DOT(acc, w, x, sc) ZS_AKA(dot)((acc), (w), (x), (sc), KA_SIGNED, KA_SCALED)
#define KA_XSUM(x) ZS_AKA(xsum)(x)
#define KA_SCV_K4(p) ZS_AKA(scv_k4)(p)
#define KA_SCV_K6(p) ZS_AKA(scv_k6)(p)
#define KA_PICK(v, g) ZS_AKA(pick)((v), (g))
#define KA_MN2(p) ZS_AKA(mn2)(p)
#define KA_MSUM(v, bs) ZS_AKA(msum)((v), (bs))
#define KA_ISUM(v) ZS_AKA(isum)(v)
#define KA_DR ZS_AKA_DR
#define KA_PT ZS_AKA_PT
#define KA_DEC 1
#define KA_TR ZS_AKA_TR32
#define KA_TT ZS_AKA_TT32
#define KA_PACK ZS_AKA_VNNI /* u + 128 would saturate maddubs */
#define KA_NAME(x) ZS_AKA(q8_0_##x)
#define KA_FMT ZS_KA_Q8_0
#define KA_W(b, g) ZS_AKA(q8_0)(b)
#include "matmul-q8act-kern.h"
#include "matmul-q8act-pack.h"
#undef KA_NAME
#undef KA_FMT
#undef KA_W
#undef KA_PACK
#define KA_PACK 1
#define KA_NAME(x) ZS_AKA(q4_0_##x)
#define KA_FMT ZS_KA_Q4_0
#define KA_W(b, g) ((zs_ka_i8)ZS_AKA(nib)((b) + 2))
#include "matmul-q8act-kern.h"
#include "matmul-q8act-pack.h"
#undef KA_NAME
#undef KA_FMT
#undef KA_W
#define KA_NAME(x) ZS_AKA(q4_1_##x)
#define KA_FMT ZS_KA_Q4_1
#define KA_W(b, g) ((zs_ka_i8)ZS_AKA(nib)((b) + 4))
#include "matmul-q8act-kern.h"
#include "matmul-q8act-pack.h"
#undef KA_NAME
#undef KA_FMT
#undef KA_W
#define KA_NAME(x) ZS_AKA(q5_0_##x)
#define KA_FMT ZS_KA_Q5_0
#define KA_W(b, g) ZS_AKA(q5)((b) + 6, (b) + 2)
#include "matmul-q8act-kern.h"
#include "matmul-q8act-pack.h"
#undef KA_NAME
#undef KA_FMT
#undef KA_W
#define KA_NAME(x) ZS_AKA(q5_1_##x)
#define KA_FMT ZS_KA_Q5_1
#define KA_W(b, g) ZS_AKA(q5)((b) + 8, (b) + 4)
#include "matmul-q8act-kern.h"
#include "matmul-q8act-pack.h"
#undef KA_NAME
#undef KA_FMT
#undef KA_W
#undef KA_TR
#undef KA_TT
#define KA_TR ZS_AKA_TRK
#define KA_TT ZS_AKA_TTK
#define KA_NAME(x) ZS_AKA(q4_k_##x)
#define KA_FMT ZS_KA_Q4_K
#define KA_W(b, g) ZS_AKA(q4k)((b), (g))
#include "matmul-q8act-kern.h"
#include "matmul-q8act-pack.h"
#undef KA_NAME
#undef KA_FMT
#undef KA_W
#define KA_NAME(x) ZS_AKA(q6_k_##x)
#define KA_FMT ZS_KA_Q6_K
#define KA_W(b, g) ZS_AKA(q6k)((b), (g))
#include "matmul-q8act-kern.h"
#include "matmul-q8act-pack.h"
#undef KA_NAME
#undef KA_FMT
#undef KA_W
/* Q5_K, Q3_K, Q2_K: the row kernel alone (no packed prefill or decode kernel for them yet) */
#undef KA_PACK
#undef KA_DEC
#define KA_PACK 0
#define KA_DEC 0
#define KA_NAME(x) ZS_AKA(q5_k_##x)
#define KA_FMT ZS_KA_Q5_K
#define KA_W(b, g) ZS_AKA(q5k)((b), (g))
#include "matmul-q8act-kern.h"
#undef KA_NAME
#undef KA_FMT
#undef KA_W
#define KA_NAME(x) ZS_AKA(q3_k_##x)
#define KA_FMT ZS_KA_Q3_K
#define KA_W(b, g) ZS_AKA(q3k)((b), (g))
#include "matmul-q8act-kern.h"
#undef KA_NAME
#undef KA_FMT
#undef KA_W
#define KA_NAME(x) ZS_AKA(q2_k_##x)
#define KA_FMT ZS_KA_Q2_K
#define KA_W(b, g) ZS_AKA(q2k)((b), (g))
#include "matmul-q8act-kern.h"
#undef KA_NAME
#undef KA_FMT
#undef KA_W
#undef KA_D
#undef KA_DOT
#undef KA_XSUM
#undef KA_SCV_K4
#undef KA_SCV_K6
#undef KA_PICK
#undef KA_MN2
#undef KA_MSUM
#undef KA_ISUM
#undef KA_TR
#undef KA_TT
#undef KA_DR
#undef KA_PT
#undef KA_DEC
#undef KA_PACK
