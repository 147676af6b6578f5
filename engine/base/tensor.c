/* tensor.c — dtype sizes and names, bf16 <-> f32 conversion, Q8_0/Q4_0/Q4_1/Q5_0/Q5_1
 * quantization and dequantization, K-quant (Q2_K .. Q6_K) dequantization (ggml's reference
 * arithmetic), and
 * conversion between any two dtypes. The f16 scalars are in f16.c and the K-quant quantizers in
 * quant-k.c, both below this file: it calls them, they call nothing here.
 *
 * The block formats, ggml's: Q8_0 and Q4_0 are blocks of 32 weights: Q8_0 an f16 scale d, then 32
 * int8 q (value d·q; 34 bytes); Q4_0 an f16 d, then 16 bytes whose low nibbles are weights 0..15
 * and high nibbles 16..31 (value d·(q - 8); 18 bytes); Q4_1 an f16 d, an f16 m, then Q4_0's
 * nibbles (value d·q + m; 20 bytes); Q5_0 an f16 d, 4 bytes qh (bit k: the fifth bit of weight k,
 * as a little-endian uint32), then Q4_0's nibbles as the low 4 bits (value d·(q - 16); 22 bytes);
 * Q5_1 an f16 d, an f16 m, qh, the nibbles (value d·q + m; 24 bytes). Q4_K and Q6_K are ggml's
 * super-blocks of 256 in 8 groups of 32: Q4_K an f16 d, an f16 dmin, 12 bytes of 6-bit scales
 * sc[g] and mins m[g] (get_scale_min_k4), then 128 bytes of nibbles (group 2i low nibbles, 2i+1
 * high nibbles of bytes 32i..32i+31; value (d·sc)·q - (dmin·m); 144 bytes); Q6_K 128 bytes ql
 * of low nibbles, 64 bytes qh of 2-bit highs, 16 int8 scales (one per 16 weights), then an f16
 * d (value (d·sc)·(q - 32); 210 bytes); Q5_K is Q4_K with a fifth bit: d, dmin, the 12 scale
 * bytes, 32 bytes qh (bit g of qh[l]: the fifth bit of weight l of group g), then Q4_K's nibbles
 * (value (d·sc)·q - (dmin·m), q 0..31; 176 bytes). Q3_K and Q2_K have 16 groups of 16, laid out
 * in two halves of 128: weight 128h + 32j + l (j = 0..3, l = 0..31) has its 2 low bits at bits
 * 2j of qs[32h + l] and scale number 8h + 2j + l/16. Q3_K: 32 bytes hmask (bit 4h + j of
 * hmask[l]: the third bit of that weight), 64 bytes qs, 12 bytes of 16 6-bit scales (scale i: low
 * nibble of byte i for i < 8, else the high nibble of byte i - 8; high 2 bits at bits 2(i/4) of
 * byte 8 + i%4; stored + 32), an f16 d (value (d·(sc - 32))·(q - 4 + 4·hbit); 110 bytes). Q2_K:
 * 16 bytes of scales (low nibble the scale, high nibble the min of each 16), 64 bytes qs, f16 d,
 * f16 dmin (value (d·sc)·q - (dmin·m), q 0..3; 84 bytes). Every block format is made by a
 * quantizer with ggml's reference bytes (the K-quants' in quant-k.c). */
#include <math.h>
#include "tensor.h"

#include <string.h>

#include "common.h"

size_t zs_dtype_size(zs_dtype t) {
    switch (t) {
    case ZS_F32: return 4;
    case ZS_F16: return 2;
    case ZS_BF16: return 2;
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

int zs_dtype_block(zs_dtype t) {
    if (t >= ZS_Q4_K && t <= ZS_Q2_K) return ZS_QK_K; /* Q4_K, Q6_K, Q5_K, Q3_K, Q2_K */
    if (zs_dtype_is_quant(t)) return ZS_Q8_0_BLOCK;
    return (unsigned)t < ZS_DTYPE_COUNT ? 1 : 0;
}

int zs_dtype_is_quant(zs_dtype t) { return t >= ZS_Q8_0 && t < ZS_DTYPE_COUNT; }

int zs_dtype_can_quantize(zs_dtype t) { return zs_dtype_is_quant(t); }

size_t zs_dtype_bytes(zs_dtype t, size_t n) {
    int b = zs_dtype_block(t);
    return b ? n / (size_t)b * zs_dtype_size(t) : 0;
}

const char *zs_dtype_name(zs_dtype t) {
    switch (t) {
    case ZS_F32: return "F32";
    case ZS_F16: return "F16";
    case ZS_BF16: return "BF16";
    case ZS_Q8_0: return "Q8_0";
    case ZS_Q4_0: return "Q4_0";
    case ZS_Q4_1: return "Q4_1";
    case ZS_Q5_0: return "Q5_0";
    case ZS_Q5_1: return "Q5_1";
    case ZS_Q4_K: return "Q4_K";
    case ZS_Q6_K: return "Q6_K";
    case ZS_Q5_K: return "Q5_K";
    case ZS_Q3_K: return "Q3_K";
    case ZS_Q2_K: return "Q2_K";
    default: return "?";
    }
}

int zs_dtype_parse(const char *name, zs_dtype *out) {
    if (!strcmp(name, "F32") || !strcmp(name, "f32") || !strcmp(name, "float32")) *out = ZS_F32;
    else if (!strcmp(name, "F16") || !strcmp(name, "f16") || !strcmp(name, "float16")) *out = ZS_F16;
    else if (!strcmp(name, "BF16") || !strcmp(name, "bf16") || !strcmp(name, "bfloat16")) *out = ZS_BF16;
    else if (!strcmp(name, "Q8_0") || !strcmp(name, "q8_0")) *out = ZS_Q8_0;
    else if (!strcmp(name, "Q4_0") || !strcmp(name, "q4_0")) *out = ZS_Q4_0;
    else if (!strcmp(name, "Q4_1") || !strcmp(name, "q4_1")) *out = ZS_Q4_1;
    else if (!strcmp(name, "Q5_0") || !strcmp(name, "q5_0")) *out = ZS_Q5_0;
    else if (!strcmp(name, "Q5_1") || !strcmp(name, "q5_1")) *out = ZS_Q5_1;
    else if (!strcmp(name, "Q4_K") || !strcmp(name, "q4_k")) *out = ZS_Q4_K;
    else if (!strcmp(name, "Q6_K") || !strcmp(name, "q6_k")) *out = ZS_Q6_K;
    else if (!strcmp(name, "Q5_K") || !strcmp(name, "q5_k")) *out = ZS_Q5_K;
    else if (!strcmp(name, "Q3_K") || !strcmp(name, "q3_k")) *out = ZS_Q3_K;
    else if (!strcmp(name, "Q2_K") || !strcmp(name, "q2_k")) *out = ZS_Q2_K;
    else return ZS_EUNSUPPORTED;
    return 0;
}

int64_t zs_tensor_numel(const zs_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

static inline uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

float zs_bf16_to_f32(uint16_t h) { return u2f((uint32_t)h << 16); }

uint16_t zs_f32_to_bf16(float f) {
    uint32_t u = f2u(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* n (a multiple of 32) f32 values to n/32 Q8_0 blocks, the bytes of ggml's reference quantizer
 * (quantize_row_q8_0_ref): amax = max|x|, d = amax/127, id = d ? 1/d : 0, q = roundf(x·id)
 * (half away from zero), stored d = fp16(d) rounded to nearest even. */
void zs_quantize_q8_0(void *dst, const float *src, size_t n) {
    uint8_t *o = dst;
    for (size_t b = 0; b < n / ZS_Q8_0_BLOCK; b++, o += ZS_Q8_0_BYTES) {
        const float *x = src + b * ZS_Q8_0_BLOCK;
        float amax = 0.0f;
        for (int j = 0; j < ZS_Q8_0_BLOCK; j++) amax = fmaxf(amax, fabsf(x[j]));
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        uint16_t h = zs_f32_to_f16(d);
        memcpy(o, &h, 2); /* little-endian, as ggml writes it */
        for (int j = 0; j < ZS_Q8_0_BLOCK; j++) o[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
    }
}

/* The element of largest magnitude of a block of 32, with its sign (the first one on ties), as
 * ggml's Q4_0/Q5_0 reference quantizers pick it. */
static float signed_absmax32(const float *x) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; j++)
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    return max;
}

/* n (a multiple of 32) f32 values to n/32 Q4_0 blocks, the bytes of ggml's quantize_row_q4_0_ref:
 * max = the first x of largest |x|, d = max / -8, id = d ? 1/d : 0,
 * q = min(15, (int8)(x·id + 8.5)) (truncated), stored d = fp16(d). x·id and + 8.5 are rounded
 * separately, as ggml does: no fused multiply-add here. */
__attribute__((optimize("fp-contract=off"))) void zs_quantize_q4_0(void *dst, const float *src, size_t n) {
    uint8_t *o = dst;
    for (size_t b = 0; b < n / 32; b++, o += ZS_Q4_0_BYTES) {
        const float *x = src + b * 32;
        float max = signed_absmax32(x);
        float d = max / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        uint16_t h = zs_f32_to_f16(d);
        memcpy(o, &h, 2);
        for (int j = 0; j < 16; j++) {
            int q0 = (int8_t)(x[j] * id + 8.5f), q1 = (int8_t)(x[16 + j] * id + 8.5f);
            q0 = q0 < 15 ? q0 : 15;
            q1 = q1 < 15 ? q1 : 15;
            o[2 + j] = (uint8_t)(q0 | q1 << 4);
        }
    }
}

/* n (a multiple of 32) f32 values to Q4_1 / Q5_1 blocks, the bytes of quantize_row_q4_1_ref /
 * q5_1_ref: min and max of the block, d = (max - min) / 15 (Q5_1: / 31), id = d ? 1/d : 0,
 * q = min(15 (31), (int8)((x - min)·id + 0.5)) (each operation rounded, truncated), stored
 * d = fp16(d), m = fp16(min); Q5_1's fifth bits go to qh bit k for weight k. Q4_1 and Q5_1
 * (bits 4 or 5, nmax 15 or 31): (x - min)·id and + 0.5 rounded separately, as ggml does: no fused
 * multiply-add here. */
__attribute__((optimize("fp-contract=off"))) static void quantize_min(uint8_t *o, const float *src, size_t n,
                                                                      int five) {
    size_t bb = five ? ZS_Q5_1_BYTES : ZS_Q4_1_BYTES;
    int nmax = five ? 31 : 15;
    for (size_t b = 0; b < n / 32; b++, o += bb) {
        const float *x = src + b * 32;
        float min = 3.402823466e+38f, max = -3.402823466e+38f;
        for (int j = 0; j < 32; j++) {
            if (x[j] < min) min = x[j];
            if (x[j] > max) max = x[j];
        }
        float d = (max - min) / (float)nmax, id = d != 0.0f ? 1.0f / d : 0.0f;
        uint16_t h = zs_f32_to_f16(d), hm = zs_f32_to_f16(min);
        memcpy(o, &h, 2);
        memcpy(o + 2, &hm, 2);
        uint8_t *qs = o + (five ? 8 : 4);
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            float x0 = (x[j] - min) * id, x1 = (x[16 + j] - min) * id;
            int q0 = (int8_t)(x0 + 0.5f), q1 = (int8_t)(x1 + 0.5f);
            q0 = q0 < nmax ? q0 : nmax;
            q1 = q1 < nmax ? q1 : nmax;
            qs[j] = (uint8_t)((q0 & 15) | (q1 & 15) << 4);
            qh |= (uint32_t)(q0 >> 4 & 1) << j | (uint32_t)(q1 >> 4 & 1) << (j + 16);
        }
        if (five) memcpy(o + 4, &qh, 4); /* little-endian, as ggml writes it */
    }
}

void zs_quantize_q4_1(void *dst, const float *src, size_t n) { quantize_min(dst, src, n, 0); }
void zs_quantize_q5_1(void *dst, const float *src, size_t n) { quantize_min(dst, src, n, 1); }

/* n (a multiple of 32) f32 values to Q5_0 blocks (quantize_row_q5_0_ref): max = the first x of
 * largest |x|, d = max / -16, id = d ? 1/d : 0, q = min(31, (int8)(x·id + 16.5)), d = fp16(d). */
__attribute__((optimize("fp-contract=off"))) void zs_quantize_q5_0(void *dst, const float *src, size_t n) {
    uint8_t *o = dst;
    for (size_t b = 0; b < n / 32; b++, o += ZS_Q5_0_BYTES) {
        const float *x = src + b * 32;
        float max = signed_absmax32(x);
        float d = max / -16.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        uint16_t h = zs_f32_to_f16(d);
        memcpy(o, &h, 2);
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            int q0 = (int8_t)(x[j] * id + 16.5f), q1 = (int8_t)(x[16 + j] * id + 16.5f);
            q0 = q0 < 31 ? q0 : 31;
            q1 = q1 < 31 ? q1 : 31;
            o[6 + j] = (uint8_t)((q0 & 15) | (q1 & 15) << 4);
            qh |= (uint32_t)(q0 >> 4 & 1) << j | (uint32_t)(q1 >> 4 & 1) << (j + 16);
        }
        memcpy(o + 2, &qh, 4);
    }
}

/* quantize n values into the block format dt (Q8_0 .. Q5_1: n a multiple of 32; the K-quants: of
 * 256); 0, or ZS_EINVAL for another dtype or an n that is not a whole number of blocks */
int zs_quantize(zs_dtype dt, void *dst, const float *src, size_t n) {
    if (zs_dtype_is_quant(dt) && n % (size_t)zs_dtype_block(dt) != 0)
        return zs_err(ZS_EINVAL, "quantize: %zu values are not whole %s blocks of %d", n, zs_dtype_name(dt),
                      zs_dtype_block(dt));
    switch (dt) {
    case ZS_Q8_0: zs_quantize_q8_0(dst, src, n); return 0;
    case ZS_Q4_0: zs_quantize_q4_0(dst, src, n); return 0;
    case ZS_Q4_1: zs_quantize_q4_1(dst, src, n); return 0;
    case ZS_Q5_0: zs_quantize_q5_0(dst, src, n); return 0;
    case ZS_Q5_1: zs_quantize_q5_1(dst, src, n); return 0;
    case ZS_Q4_K: zs_quantize_q4_k(dst, src, n); return 0;
    case ZS_Q6_K: zs_quantize_q6_k(dst, src, n); return 0;
    case ZS_Q5_K: zs_quantize_q5_k(dst, src, n); return 0;
    case ZS_Q3_K: zs_quantize_q3_k(dst, src, n); return 0;
    case ZS_Q2_K: zs_quantize_q2_k(dst, src, n); return 0;
    default: return zs_err(ZS_EINVAL, "quantize: dtype %s (%d) is not a block format", zs_dtype_name(dt), (int)dt);
    }
}

/* Q4_1, Q5_0, Q5_1 blocks to f32, ggml's dequantize_row_*: weight k's q is its nibble (k < 16:
 * low nibble of qs[k], else high nibble of qs[k - 16]) plus, for Q5, bit k of qh as 16;
 * Q5_0 value = d * (q - 16) (one rounding), Q4_1/Q5_1 value = (d * q) + m (two roundings,
 * never contracted into an fma) */
__attribute__((optimize("fp-contract=off"))) static void q45_to_f32(float *dst, const uint8_t *s, size_t n, zs_dtype st) {
    size_t bb = zs_dtype_size(st);
    int has_m = st != ZS_Q5_0, five = st != ZS_Q4_1;
    size_t qo = (size_t)(2 + 2 * has_m + 4 * five);
    for (size_t b = 0; b < n / 32; b++, s += bb) {
        uint16_t h, hm = 0;
        uint32_t qh = 0;
        memcpy(&h, s, 2);
        if (has_m) memcpy(&hm, s + 2, 2);
        if (five) memcpy(&qh, s + 2 + 2 * has_m, 4);
        float d = zs_f16_to_f32(h), m = zs_f16_to_f32(hm);
        for (int k = 0; k < 32; k++) {
            int q = (k < 16 ? s[qo + k] & 15 : s[qo + k - 16] >> 4) | (int)(qh >> k & 1) << 4;
            if (!has_m) {
                dst[b * 32 + k] = d * (float)(q - 16);
            } else {
                float p = d * (float)q;
                dst[b * 32 + k] = p + m;
            }
        }
    }
}

/* Q4_K's 6-bit scale and min of group j (0..7): ggml's get_scale_min_k4 */
static inline void scale_min_k4(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Q3_K's scale i (0..15), -32..31, from its 12 packed bytes */
static inline int scale_q3k(int i, const uint8_t *q) {
    int lo = i < 8 ? q[i] & 0xF : q[i - 8] >> 4, hi = (q[8 + i % 4] >> (2 * (i / 4))) & 3;
    return (lo | hi << 4) - 32;
}

/* K-quant super-blocks to f32, ggml's dequantize_row_q4_K/q6_K/q5_K/q3_K/q2_K: group g of 32;
 * Q4_K/Q5_K (d·sc)·q - (dmin·m), Q6_K (d·sc)·(q - 32), Q3_K (d·sc)·q with q -4..3, Q2_K
 * (d·sc)·q - (dmin·m) per 16; each operation rounded, none fused */
__attribute__((optimize("fp-contract=off"))) static void qk_to_f32(float *dst, const uint8_t *s, size_t n, zs_dtype st) {
    size_t bb = zs_dtype_size(st);
    for (size_t b = 0; b < n / ZS_QK_K; b++) {
        float *y = dst + b * ZS_QK_K;
        const uint8_t *blk = s + b * bb;
        uint16_t h;
        if (st == ZS_Q4_K || st == ZS_Q5_K) {
            uint16_t hm;
            memcpy(&h, blk, 2);
            memcpy(&hm, blk + 2, 2);
            float d = zs_f16_to_f32(h), dmin = zs_f16_to_f32(hm);
            int five = st == ZS_Q5_K;
            const uint8_t *qh = blk + 16, *qs = blk + (five ? 48 : 16);
            for (int g = 0; g < 8; g++) {
                int sc, m;
                scale_min_k4(g, blk + 4, &sc, &m);
                float d1 = d * (float)sc, m1 = dmin * (float)m;
                const uint8_t *q = qs + 32 * (g >> 1);
                for (int l = 0; l < 32; l++) {
                    int v = ((q[l] >> (4 * (g & 1))) & 15) | (five ? ((qh[l] >> g) & 1) << 4 : 0);
                    float p = d1 * (float)v;
                    y[32 * g + l] = p - m1;
                }
            }
        } else if (st == ZS_Q3_K || st == ZS_Q2_K) {
            int three = st == ZS_Q3_K;
            const uint8_t *qs = blk + (three ? 32 : 16);
            float d, dmin = 0;
            memcpy(&h, blk + (three ? 108 : 80), 2);
            d = zs_f16_to_f32(h);
            if (!three) {
                memcpy(&h, blk + 82, 2);
                dmin = zs_f16_to_f32(h);
            }
            for (int k = 0; k < ZS_QK_K; k++) {
                int hh = k >> 7, j = (k >> 5) & 3, l = k & 31, is = 8 * hh + 2 * j + (l >> 4);
                int q = (qs[32 * hh + l] >> (2 * j)) & 3;
                if (three) {
                    q -= (blk[l] >> (4 * hh + j)) & 1 ? 0 : 4;
                    float dl = d * (float)scale_q3k(is, blk + 96);
                    y[k] = dl * (float)q;
                } else {
                    float dl = d * (float)(blk[is] & 0xF), ml = dmin * (float)(blk[is] >> 4);
                    float p = dl * (float)q;
                    y[k] = p - ml;
                }
            }
        } else {
            memcpy(&h, blk + 208, 2);
            float d = zs_f16_to_f32(h);
            for (int g = 0; g < 8; g++) {
                int hn = g >> 2, gg = g & 3;
                const uint8_t *ql = blk + 64 * hn + 32 * (gg & 1), *qh = blk + 128 + 32 * hn;
                const int8_t *sc = (const int8_t *)(blk + 192) + 8 * hn + 2 * gg;
                for (int l = 0; l < 32; l++) {
                    int q = ((ql[l] >> (4 * (gg >> 1))) & 15) | ((qh[l] >> (2 * gg)) & 3) << 4;
                    float ds = d * (float)sc[l / 16];
                    y[32 * g + l] = ds * (float)(q - 32);
                }
            }
        }
    }
}

static void q4_0_to_f32(float *dst, const uint8_t *s, size_t n) {
    for (size_t b = 0; b < n / 32; b++, s += ZS_Q4_0_BYTES) {
        uint16_t h;
        memcpy(&h, s, 2);
        float d = zs_f16_to_f32(h);
        for (int j = 0; j < 16; j++) {
            dst[b * 32 + j] = d * (float)((s[2 + j] & 15) - 8);
            dst[b * 32 + 16 + j] = d * (float)((s[2 + j] >> 4) - 8);
        }
    }
}

/* Q8_0 blocks to f32: each value is f32(d) * q, one rounding (the kernels widen the same way) */
static void q8_0_to_f32(float *dst, const uint8_t *s, size_t n) {
    for (size_t b = 0; b < n / ZS_Q8_0_BLOCK; b++, s += ZS_Q8_0_BYTES) {
        uint16_t h;
        memcpy(&h, s, 2);
        float d = zs_f16_to_f32(h);
        for (int j = 0; j < ZS_Q8_0_BLOCK; j++) dst[b * ZS_Q8_0_BLOCK + j] = d * (float)(int8_t)s[2 + j];
    }
}

/* Convert n elements of dtype st to f32 (blocks: n a multiple of 32; Q8_0 value = f32(d) * q,
 * Q4_0 value = f32(d) * (q - 8), Q5_0 value = f32(d) * (q - 16), one rounded f32 product each;
 * Q4_1 and Q5_1 value = (f32(d) * q) + f32(m), the product rounded, then the sum: two roundings,
 * never fused, as ggml's dequantize_row_q4_1/q5_1 write it (x*d + m, no fmaf) and the gguf
 * package computes it; Q4_K/Q5_K/Q2_K value = (f32(d) * sc) * q - (f32(dmin) * m), Q6_K value =
 * (f32(d) * sc) * (q - 32) and Q3_K value = (f32(d) * (sc - 32)) * q, each product rounded, the
 * difference rounded, never fused: dequantize_row_q4_K/q5_K/q2_K/q6_K/q3_K). */
void zs_to_f32(float *dst, const void *src, zs_dtype st, size_t n) {
    if (st == ZS_Q8_0) {
        q8_0_to_f32(dst, src, n);
    } else if (st == ZS_Q4_0) {
        q4_0_to_f32(dst, src, n);
    } else if (st == ZS_Q4_1 || st == ZS_Q5_0 || st == ZS_Q5_1) {
        q45_to_f32(dst, src, n, st);
    } else if (zs_dtype_block(st) == ZS_QK_K) {
        qk_to_f32(dst, src, n, st);
    } else if (st == ZS_F32) {
        memmove(dst, src, n * 4);
    } else if (st == ZS_BF16) {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++) dst[i] = u2f((uint32_t)s[i] << 16);
    } else {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++) dst[i] = zs_f16_to_f32(s[i]);
    }
}

/* Convert n elements between dtypes (src and dst must not overlap unless same dtype). Into a
 * block format this quantizes (zs_quantize_*), out of it dequantizes; n must then be a multiple
 * of the block. */
void zs_convert(void *dst, zs_dtype dt, const void *src, zs_dtype st, size_t n) {
    if (zs_dtype_is_quant(dt) && st == ZS_F32) { zs_quantize(dt, dst, src, n); return; }
    if (dt == st) { memmove(dst, src, zs_dtype_bytes(dt, n)); return; }
    if (dt == ZS_F32) { zs_to_f32(dst, src, st, n); return; }
    if (zs_dtype_is_quant(dt) || zs_dtype_is_quant(st)) { /* through f32, a (larger) block at a time */
        float f[ZS_DTYPE_MAX_BLOCK];
        size_t c = (size_t)(zs_dtype_block(st) > zs_dtype_block(dt) ? zs_dtype_block(st) : zs_dtype_block(dt));
        for (size_t i = 0; i < n / c; i++) {
            zs_to_f32(f, (const char *)src + zs_dtype_bytes(st, i * c), st, c);
            zs_convert((char *)dst + zs_dtype_bytes(dt, i * c), dt, f, ZS_F32, c);
        }
        return;
    }
    uint16_t *d = dst;
    for (size_t i = 0; i < n; i++) {
        float f;
        if (st == ZS_F32) f = ((const float *)src)[i];
        else if (st == ZS_BF16) f = zs_bf16_to_f32(((const uint16_t *)src)[i]);
        else f = zs_f16_to_f32(((const uint16_t *)src)[i]);
        d[i] = dt == ZS_BF16 ? zs_f32_to_bf16(f) : zs_f32_to_f16(f);
    }
}
