/* tensor.h — weight types and their conversions, plus a plain tensor view: a pointer into memory
 * someone else owns, a dtype and a shape (row-major, up to 4 dims). A dtype is a block format:
 * zs_dtype_block elements stored in zs_dtype_size bytes. f32/f16/bf16 are element types (blocks
 * of 1); Q8_0 and Q4_0 are ggml's blocks of 32 weights: Q8_0 an f16 scale d, then 32 int8 q
 * (value d·q; 34 bytes); Q4_0 an f16 d, then 16 bytes whose low nibbles are weights 0..15 and
 * high nibbles 16..31 (value d·(q - 8); 18 bytes). Block formats are storage formats only:
 * arithmetic (reductions, optimizer outputs) takes element types alone.
 * Views never own memory. All functions are pure and thread-safe. */
#ifndef ZS_TENSOR_H
#define ZS_TENSOR_H

#include <stddef.h>
#include <stdint.h>

typedef enum { ZS_F32 = 0, ZS_F16 = 1, ZS_BF16 = 2, ZS_Q8_0 = 3, ZS_Q4_0 = 4, ZS_DTYPE_COUNT } zs_dtype;
#define ZS_DTYPE_ELEM_COUNT 3 /* dtypes below this are element types (f32, f16, bf16) */
#define ZS_Q8_0_BLOCK 32      /* weights per Q8_0 block */
#define ZS_Q8_0_BYTES 34      /* bytes per Q8_0 block: f16 d, int8 qs[32] */
#define ZS_Q4_0_BYTES 18      /* bytes per Q4_0 block (32 weights): f16 d, uint8 qs[16] */

#define ZS_MAX_DIMS 4

typedef struct {
    void *data;
    zs_dtype dtype;
    int ndim;
    int64_t shape[ZS_MAX_DIMS];
} zs_tensor;

size_t zs_dtype_size(zs_dtype t);   /* bytes of one block (of one element for f32/f16/bf16); 0 if invalid */
int zs_dtype_block(zs_dtype t);     /* elements per block: 1, or 32 for Q8_0/Q4_0; 0 if invalid */
int zs_dtype_is_quant(zs_dtype t);  /* a block format (Q8_0, Q4_0) rather than an element type */
/* bytes of n elements: n / block whole blocks (n must be a multiple of zs_dtype_block) */
size_t zs_dtype_bytes(zs_dtype t, size_t n);
const char *zs_dtype_name(zs_dtype t);             /* "F32", "F16", "BF16" (safetensors names), "Q8_0", "Q4_0" */
int zs_dtype_parse(const char *name, zs_dtype *out); /* 0, or ZS_EUNSUPPORTED; q8_0, q4_0 (either case) included */
int64_t zs_tensor_numel(const zs_tensor *t);

float zs_f16_to_f32(uint16_t h);
uint16_t zs_f32_to_f16(float f);   /* round to nearest even */
float zs_bf16_to_f32(uint16_t h);
uint16_t zs_f32_to_bf16(float f);  /* round to nearest even, NaN kept */

/* Convert n elements between dtypes (src and dst must not overlap unless same dtype). Into a
 * block format this quantizes (zs_quantize_*), out of it dequantizes; n must then be a multiple
 * of 32. */
void zs_convert(void *dst, zs_dtype dt, const void *src, zs_dtype st, size_t n);
/* Convert n elements of dtype st to f32 (blocks: n a multiple of 32; Q8_0 value = f32(d) * q,
 * Q4_0 value = f32(d) * (q - 8), one rounded f32 product each). */
void zs_to_f32(float *dst, const void *src, zs_dtype st, size_t n);
/* n (a multiple of 32) f32 values to n/32 Q8_0 blocks, the bytes of ggml's reference quantizer
 * (quantize_row_q8_0_ref): amax = max|x|, d = amax/127, id = d ? 1/d : 0, q = roundf(x·id)
 * (half away from zero), stored d = fp16(d) rounded to nearest even. */
void zs_quantize_q8_0(void *dst, const float *src, size_t n);
/* n (a multiple of 32) f32 values to n/32 Q4_0 blocks, the bytes of ggml's quantize_row_q4_0_ref:
 * max = the first x of largest |x|, d = max / -8, id = d ? 1/d : 0,
 * q = min(15, (int8)(x·id + 8.5)) (truncated), stored d = fp16(d). */
void zs_quantize_q4_0(void *dst, const float *src, size_t n);

#endif
