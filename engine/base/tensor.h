/* tensor.h — weight types and their conversions, plus a plain tensor view: a pointer into memory
 * someone else owns, a dtype and a shape (row-major, up to 4 dims). A dtype is a block format:
 * zs_dtype_block elements stored in zs_dtype_size bytes. f32/f16/bf16 are element types (blocks
 * of 1); Q8_0 and Q4_0 are ggml's blocks of 32 weights: Q8_0 an f16 scale d, then 32 int8 q
 * (value d·q; 34 bytes); Q4_0 an f16 d, then 16 bytes whose low nibbles are weights 0..15 and
 * high nibbles 16..31 (value d·(q - 8); 18 bytes); Q4_1 an f16 d, an f16 m, then Q4_0's nibbles
 * (value d·q + m; 20 bytes); Q5_0 an f16 d, 4 bytes qh (bit k: the fifth bit of weight k, as a
 * little-endian uint32), then Q4_0's nibbles as the low 4 bits (value d·(q - 16); 22 bytes);
 * Q5_1 an f16 d, an f16 m, qh, the nibbles (value d·q + m; 24 bytes). Q4_K and Q6_K are ggml's
 * super-blocks of 256 in 8 groups of 32: Q4_K an f16 d, an f16 dmin, 12 bytes of 6-bit scales
 * sc[g] and mins m[g] (get_scale_min_k4), then 128 bytes of nibbles (group 2i low nibbles, 2i+1
 * high nibbles of bytes 32i..32i+31; value (d·sc)·q - (dmin·m); 144 bytes); Q6_K 128 bytes ql
 * of low nibbles, 64 bytes qh of 2-bit highs, 16 int8 scales (one per 16 weights), then an f16
 * d (value (d·sc)·(q - 32); 210 bytes). Every block format is made by a quantizer with ggml's
 * reference bytes (the K-quants' in quant-k.c). Block formats are storage formats only:
 * arithmetic (reductions, optimizer outputs) takes element types alone.
 * Views never own memory. All functions are pure and thread-safe. */
#ifndef ZS_TENSOR_H
#define ZS_TENSOR_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    ZS_F32 = 0, ZS_F16 = 1, ZS_BF16 = 2, ZS_Q8_0 = 3, ZS_Q4_0 = 4, ZS_Q4_1 = 5, ZS_Q5_0 = 6, ZS_Q5_1 = 7,
    ZS_Q4_K = 8, ZS_Q6_K = 9, ZS_DTYPE_COUNT
} zs_dtype;
#define ZS_DTYPE_ELEM_COUNT 3 /* dtypes below this are element types (f32, f16, bf16) */
#define ZS_Q8_0_BLOCK 32      /* weights per Q8_0 block */
#define ZS_Q8_0_BYTES 34      /* bytes per Q8_0 block: f16 d, int8 qs[32] */
#define ZS_Q4_0_BYTES 18      /* bytes per Q4_0 block (32 weights): f16 d, uint8 qs[16] */
#define ZS_Q4_1_BYTES 20      /* bytes per Q4_1 block: f16 d, f16 m, uint8 qs[16] */
#define ZS_Q5_0_BYTES 22      /* bytes per Q5_0 block: f16 d, uint8 qh[4], uint8 qs[16] */
#define ZS_Q5_1_BYTES 24      /* bytes per Q5_1 block: f16 d, f16 m, uint8 qh[4], uint8 qs[16] */
#define ZS_QK_K 256           /* weights per K-quant super-block */
#define ZS_Q4_K_BYTES 144     /* f16 d, f16 dmin, uint8 scales[12], uint8 qs[128] */
#define ZS_Q6_K_BYTES 210     /* uint8 ql[128], uint8 qh[64], int8 scales[16], f16 d */
#define ZS_DTYPE_MAX_BLOCK 256 /* the largest zs_dtype_block */

#define ZS_MAX_DIMS 4

typedef struct {
    void *data;
    zs_dtype dtype;
    int ndim;
    int64_t shape[ZS_MAX_DIMS];
} zs_tensor;

size_t zs_dtype_size(zs_dtype t);   /* bytes of one block (of one element for f32/f16/bf16); 0 if invalid */
int zs_dtype_block(zs_dtype t);     /* elements per block: 1, 32 for Q8_0/Q4_0/Q4_1/Q5_0/Q5_1, 256 for Q4_K/Q6_K; 0 if invalid */
int zs_dtype_is_quant(zs_dtype t);  /* a block format (Q8_0 .. Q5_1, Q4_K, Q6_K) rather than an element type */
/* bytes of n elements: n / block whole blocks (n must be a multiple of zs_dtype_block) */
size_t zs_dtype_bytes(zs_dtype t, size_t n);
const char *zs_dtype_name(zs_dtype t);             /* "F32", "F16", "BF16" (safetensors names), "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q6_K" */
int zs_dtype_parse(const char *name, zs_dtype *out); /* 0, or ZS_EUNSUPPORTED; q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q6_k (either case) */
int64_t zs_tensor_numel(const zs_tensor *t);

float zs_f16_to_f32(uint16_t h);
uint16_t zs_f32_to_f16(float f);   /* round to nearest even */
float zs_bf16_to_f32(uint16_t h);
uint16_t zs_f32_to_bf16(float f);  /* round to nearest even, NaN kept */

/* Convert n elements between dtypes (src and dst must not overlap unless same dtype). Into a
 * block format this quantizes (zs_quantize_*), out of it dequantizes; n must then be a multiple
 * of the block. */
int zs_dtype_can_quantize(zs_dtype t); /* zs_quantize makes this block format (every one: Q8_0 .. Q6_K) */
void zs_convert(void *dst, zs_dtype dt, const void *src, zs_dtype st, size_t n);
/* Convert n elements of dtype st to f32 (blocks: n a multiple of 32; Q8_0 value = f32(d) * q,
 * Q4_0 value = f32(d) * (q - 8), Q5_0 value = f32(d) * (q - 16), one rounded f32 product each;
 * Q4_1 and Q5_1 value = (f32(d) * q) + f32(m), the product rounded, then the sum: two roundings,
 * never fused, as ggml's dequantize_row_q4_1/q5_1 write it (x*d + m, no fmaf) and the gguf
 * package computes it; Q4_K value = (f32(d) * sc) * q - (f32(dmin) * m) and Q6_K value =
 * (f32(d) * sc) * (q - 32), each product rounded, the difference rounded, never fused:
 * dequantize_row_q4_K/q6_K). */
void zs_to_f32(float *dst, const void *src, zs_dtype st, size_t n);
/* n (a multiple of 32) f32 values to n/32 Q8_0 blocks, the bytes of ggml's reference quantizer
 * (quantize_row_q8_0_ref): amax = max|x|, d = amax/127, id = d ? 1/d : 0, q = roundf(x·id)
 * (half away from zero), stored d = fp16(d) rounded to nearest even. */
void zs_quantize_q8_0(void *dst, const float *src, size_t n);
/* n (a multiple of 32) f32 values to n/32 Q4_0 blocks, the bytes of ggml's quantize_row_q4_0_ref:
 * max = the first x of largest |x|, d = max / -8, id = d ? 1/d : 0,
 * q = min(15, (int8)(x·id + 8.5)) (truncated), stored d = fp16(d). */
void zs_quantize_q4_0(void *dst, const float *src, size_t n);
/* n (a multiple of 32) f32 values to Q4_1 / Q5_1 blocks, the bytes of quantize_row_q4_1_ref /
 * q5_1_ref: min and max of the block, d = (max - min) / 15 (Q5_1: / 31), id = d ? 1/d : 0,
 * q = min(15 (31), (int8)((x - min)·id + 0.5)) (each operation rounded, truncated), stored
 * d = fp16(d), m = fp16(min); Q5_1's fifth bits go to qh bit k for weight k. */
void zs_quantize_q4_1(void *dst, const float *src, size_t n);
void zs_quantize_q5_1(void *dst, const float *src, size_t n);
/* n (a multiple of 32) f32 values to Q5_0 blocks (quantize_row_q5_0_ref): max = the first x of
 * largest |x|, d = max / -16, id = d ? 1/d : 0, q = min(31, (int8)(x·id + 16.5)), d = fp16(d). */
void zs_quantize_q5_0(void *dst, const float *src, size_t n);
/* n (a multiple of 256) f32 values to n/256 Q4_K / Q6_K super-blocks (quant-k.c), the bytes of
 * ggml's quantize_row_q4_K_ref / quantize_row_q6_K_ref (no importance matrix). Q4_K: per group of
 * 32, ggml's make_qkx2_quants (weights rms(group) + |x|; levels 0..15 with a scale and a min, the
 * best of 21 least-squares refits), the 8 scales and mins as 6-bit multiples of d = fp16(max
 * scale / 63) and dmin = fp16(max min / 63), then the levels again against those. Q6_K: per 16,
 * make_qx_quants (levels -32..31, weights x², the best of 19 grids), the 16 scales as int8
 * multiples of d = fp16(max_scale / -128), then the levels again. Every operation an f32 one
 * rounded in ggml's order, none fused; rounding with ggml's nearest_int. */
void zs_quantize_q4_k(void *dst, const float *src, size_t n);
void zs_quantize_q6_k(void *dst, const float *src, size_t n);
/* quantize n values into the block format dt (Q8_0 .. Q5_1: n a multiple of 32; Q4_K, Q6_K: of
 * 256); 0, or ZS_EINVAL for another dtype or an n that is not a whole number of blocks */
int zs_quantize(zs_dtype dt, void *dst, const float *src, size_t n);

#endif
