/* tensor.h — weight types (dtypes) and their conversions, and a plain tensor view: a pointer into
 * memory someone else owns, a dtype and a shape (row-major, up to 4 dims). A dtype is a block
 * format, zs_dtype_block elements in zs_dtype_size bytes: f32/f16/bf16 are element types (blocks
 * of 1), the others ggml's quantized blocks, made and read with ggml's reference bytes. Block
 * formats are storage only: arithmetic (reductions, optimizer outputs) takes element types alone.
 * Defined in tensor.c (over f16.c and quant-k.c), where each block's layout and each quantizer's
 * arithmetic are described. Views never own memory; every function is pure and thread-safe. */
#ifndef ZS_TENSOR_H
#define ZS_TENSOR_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    ZS_F32 = 0, ZS_F16 = 1, ZS_BF16 = 2, ZS_Q8_0 = 3, ZS_Q4_0 = 4, ZS_Q4_1 = 5, ZS_Q5_0 = 6, ZS_Q5_1 = 7,
    ZS_Q4_K = 8, ZS_Q6_K = 9, ZS_Q5_K = 10, ZS_Q3_K = 11, ZS_Q2_K = 12, ZS_DTYPE_COUNT
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
#define ZS_Q5_K_BYTES 176     /* f16 d, f16 dmin, uint8 scales[12], uint8 qh[32], uint8 qs[128] */
#define ZS_Q3_K_BYTES 110     /* uint8 hmask[32], uint8 qs[64], uint8 scales[12], f16 d */
#define ZS_Q2_K_BYTES 84      /* uint8 scales[16], uint8 qs[64], f16 d, f16 dmin */
#define ZS_DTYPE_MAX_BLOCK 256 /* the largest zs_dtype_block */

#define ZS_MAX_DIMS 4

typedef struct {
    void *data;                 /* not owned */
    zs_dtype dtype;
    int ndim;                   /* 1 .. ZS_MAX_DIMS */
    int64_t shape[ZS_MAX_DIMS]; /* row-major: shape[ndim - 1] is the contiguous one */
} zs_tensor;

/* dtypes */
size_t zs_dtype_size(zs_dtype t);  /* bytes of one block (of one element for f32/f16/bf16); 0 if invalid */
int zs_dtype_block(zs_dtype t);    /* elements per block: 1, 32 (Q8_0 .. Q5_1), 256 (the K-quants Q2_K .. Q6_K); 0 if invalid */
int zs_dtype_is_quant(zs_dtype t); /* a block format (Q8_0 .. Q5_1, Q2_K .. Q6_K) rather than an element type */
int zs_dtype_can_quantize(zs_dtype t);       /* zs_quantize makes this block format (every one) */
size_t zs_dtype_bytes(zs_dtype t, size_t n); /* bytes of n elements (n a multiple of zs_dtype_block) */
const char *zs_dtype_name(zs_dtype t);       /* "F32", "F16", "BF16" (safetensors names), "Q8_0" .. "Q2_K" */
int zs_dtype_parse(const char *name, zs_dtype *out); /* 0, or ZS_EUNSUPPORTED; the names above in either case, float32 ... */
int64_t zs_tensor_numel(const zs_tensor *t);

/* one value; to f16/bf16 rounds to nearest even (bf16 keeps NaN) */
float zs_f16_to_f32(uint16_t h);  /* f16.c */
uint16_t zs_f32_to_f16(float f);  /* f16.c */
float zs_bf16_to_f32(uint16_t h);
uint16_t zs_f32_to_bf16(float f);

/* n elements; for a block format n is a multiple of its block */
void zs_convert(void *dst, zs_dtype dt, const void *src, zs_dtype st, size_t n); /* any to any (no overlap unless dt == st) */
void zs_to_f32(float *dst, const void *src, zs_dtype st, size_t n);             /* ggml's dequantize_row_* bits */
int zs_quantize(zs_dtype dt, void *dst, const float *src, size_t n);             /* 0, or ZS_EINVAL: not a block format or not whole blocks */
/* f32 to blocks, the bytes of ggml's reference quantizers (quantize_row_*_ref, no importance matrix) */
void zs_quantize_q8_0(void *dst, const float *src, size_t n);
void zs_quantize_q4_0(void *dst, const float *src, size_t n);
void zs_quantize_q4_1(void *dst, const float *src, size_t n);
void zs_quantize_q5_0(void *dst, const float *src, size_t n);
void zs_quantize_q5_1(void *dst, const float *src, size_t n);
void zs_quantize_q4_k(void *dst, const float *src, size_t n); /* quant-k.c */
void zs_quantize_q6_k(void *dst, const float *src, size_t n); /* quant-k.c */
void zs_quantize_q5_k(void *dst, const float *src, size_t n); /* quant-k.c */
void zs_quantize_q3_k(void *dst, const float *src, size_t n); /* quant-k.c */
void zs_quantize_q2_k(void *dst, const float *src, size_t n); /* quant-k.c */

#endif
