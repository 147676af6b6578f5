/* tensor.h — element types (f32, f16, bf16) and their conversions, plus a plain tensor view:
 * a pointer into memory someone else owns, a dtype and a shape (row-major, up to 4 dims).
 * Views never own memory. All functions are pure and thread-safe. */
#ifndef ZS_TENSOR_H
#define ZS_TENSOR_H

#include <stddef.h>
#include <stdint.h>

typedef enum { ZS_F32 = 0, ZS_F16 = 1, ZS_BF16 = 2, ZS_DTYPE_COUNT } zs_dtype;

#define ZS_MAX_DIMS 4

typedef struct {
    void *data;
    zs_dtype dtype;
    int ndim;
    int64_t shape[ZS_MAX_DIMS];
} zs_tensor;

size_t zs_dtype_size(zs_dtype t);
const char *zs_dtype_name(zs_dtype t);             /* "F32", "F16", "BF16" (safetensors names) */
int zs_dtype_parse(const char *name, zs_dtype *out); /* 0, or ZS_EUNSUPPORTED */
int64_t zs_tensor_numel(const zs_tensor *t);

float zs_f16_to_f32(uint16_t h);
uint16_t zs_f32_to_f16(float f);   /* round to nearest even */
float zs_bf16_to_f32(uint16_t h);
uint16_t zs_f32_to_bf16(float f);  /* round to nearest even, NaN kept */

/* Convert n elements between dtypes (src and dst must not overlap unless same dtype). */
void zs_convert(void *dst, zs_dtype dt, const void *src, zs_dtype st, size_t n);
/* Convert n elements of dtype st to f32. */
void zs_to_f32(float *dst, const void *src, zs_dtype st, size_t n);

#endif
