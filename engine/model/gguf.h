/* gguf.h — reader of GGUF files (llama.cpp's model format, versions 2 and 3, little-endian):
 * the header, the metadata key/values, the tensor infos and a pointer to each tensor's data.
 *
 * zs_gguf_open mmaps the file read-only (MAP_PRIVATE, PROT_READ) and validates everything at
 * open: magic, version, every string and array length against the bytes left in the file
 * (before allocating anything for it), value types, duplicate keys and tensor names,
 * general.alignment (a u32 power of two, default 32), each tensor's n_dims (0..4), dims
 * (positive, product without overflow), ggml type, row length (a multiple of the type's block
 * size), offset (aligned, inside the file) and that no two tensors overlap. Tensor data is
 * never copied or converted. Any failure is a negative ZS_E* code with a zs_errmsg() message
 * that names the file and the problem; nothing is left allocated or mapped.
 *
 * Ownership: the zs_gguf owns the mapping, every key, string value and tensor name (copied,
 * NUL-terminated; a string value may also contain NULs, so its length is given too). Every
 * pointer returned by these functions stays valid until zs_gguf_close. zs_gguf_open_mem
 * parses a caller-owned buffer in place: that buffer must outlive the zs_gguf.
 *
 * Thread-safety: an open zs_gguf is immutable; every getter may be called from any number of
 * threads at once (the error message of a failing call is per thread). zs_gguf_close must not
 * race with any of them. The type-table functions are pure.
 *
 * Conventions: out-parameters are set only on success. Missing key -> ZS_ENOTFOUND; a value of
 * the wrong type -> ZS_EINVAL naming the key and both types; an integer that does not fit the
 * requested type -> ZS_ERANGE. */
#ifndef ZS_GGUF_H
#define ZS_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---------- GGUF metadata value types (ids as stored in the file) ---------- */
typedef enum {
    ZS_GGUF_U8 = 0,
    ZS_GGUF_I8 = 1,
    ZS_GGUF_U16 = 2,
    ZS_GGUF_I16 = 3,
    ZS_GGUF_U32 = 4,
    ZS_GGUF_I32 = 5,
    ZS_GGUF_F32 = 6,
    ZS_GGUF_BOOL = 7,
    ZS_GGUF_STR = 8,
    ZS_GGUF_ARR = 9,
    ZS_GGUF_U64 = 10,
    ZS_GGUF_I64 = 11,
    ZS_GGUF_F64 = 12,
    ZS_GGUF_VTYPE_COUNT
} zs_gguf_vtype;

/* "u8", "i8", ..., "string", "array", "f64"; "unknown" for other ids. */
const char *zs_gguf_vtype_name(int vtype);

/* ---------- ggml tensor types (ids as stored in the file) ---------- */
typedef enum {
    ZS_GGML_F32 = 0,
    ZS_GGML_F16 = 1,
    ZS_GGML_Q4_0 = 2,
    ZS_GGML_Q4_1 = 3,
    /* 4, 5: Q4_2, Q4_3 (removed from ggml; rejected) */
    ZS_GGML_Q5_0 = 6,
    ZS_GGML_Q5_1 = 7,
    ZS_GGML_Q8_0 = 8,
    ZS_GGML_Q8_1 = 9,
    ZS_GGML_Q2_K = 10,
    ZS_GGML_Q3_K = 11,
    ZS_GGML_Q4_K = 12,
    ZS_GGML_Q5_K = 13,
    ZS_GGML_Q6_K = 14,
    ZS_GGML_Q8_K = 15,
    ZS_GGML_IQ2_XXS = 16,
    ZS_GGML_IQ2_XS = 17,
    ZS_GGML_IQ3_XXS = 18,
    ZS_GGML_IQ1_S = 19,
    ZS_GGML_IQ4_NL = 20,
    ZS_GGML_IQ3_S = 21,
    ZS_GGML_IQ2_S = 22,
    ZS_GGML_IQ4_XS = 23,
    ZS_GGML_I8 = 24,
    ZS_GGML_I16 = 25,
    ZS_GGML_I32 = 26,
    ZS_GGML_I64 = 27,
    ZS_GGML_F64 = 28,
    ZS_GGML_IQ1_M = 29,
    ZS_GGML_BF16 = 30,
    /* 31..33: Q4_0_4_4, Q4_0_4_8, Q4_0_8_8 (removed from ggml; rejected) */
    ZS_GGML_TQ1_0 = 34,
    ZS_GGML_TQ2_0 = 35,
    /* 36..38: IQ4_NL_4_4, IQ4_NL_4_8, IQ4_NL_8_8 (removed from ggml; rejected) */
    ZS_GGML_MXFP4 = 39,
    ZS_GGML_NVFP4 = 40,
    ZS_GGML_Q1_0 = 41,
    ZS_GGML_TYPE_COUNT
} zs_ggml_type;

/* "F32", "Q8_0", "IQ2_XXS", ...; NULL for an id this reader does not know. */
const char *zs_gguf_type_name(int type);
/* Elements per block and bytes per block of a type (F32: 1 and 4; Q8_0: 32 and 34; Q4_K: 256
 * and 144). ZS_EUNSUPPORTED for an unknown id. */
int zs_gguf_type_block(int type, uint32_t *block_elems, uint32_t *block_bytes);
/* Bytes of a tensor of this type and dims (ne[0] is the contiguous dimension; n_dims 0..4,
 * dims beyond n_dims are ignored). ZS_EUNSUPPORTED: unknown type; ZS_EINVAL: n_dims > 4, a dim
 * < 1, or ne[0] not a multiple of the block size; ZS_ERANGE: overflow of the element count
 * (int64) or the byte size. The message names no file or tensor (zs_gguf_open prefixes them). */
int zs_gguf_tensor_nbytes(int type, int n_dims, const int64_t *ne, size_t *out);

/* ---------- the file ---------- */
typedef struct zs_gguf zs_gguf;

#define ZS_GGUF_MAX_DIMS 4
#define ZS_GGUF_DEFAULT_ALIGNMENT 32
#define ZS_GGUF_MAX_NESTING 8 /* arrays of arrays deeper than this are rejected */

typedef struct {
    const char *name;    /* NUL-terminated, owned by the zs_gguf */
    int n_dims;          /* 0..4 */
    int64_t ne[4];       /* GGUF order: ne[0] is the contiguous dimension; unused dims are 1 */
    zs_ggml_type type;
    uint64_t offset;     /* from the start of the data section (a multiple of the alignment) */
    size_t nbytes;
    const void *data;    /* into the read-only mapping; aligned to the alignment relative to
                            the start of the file (so page-aligned mmap => aligned pointer) */
} zs_gguf_tensor;

/* Opens and validates a GGUF file (see the top of this file). Errors: ZS_ENOTFOUND (no such
 * file), ZS_EIO, ZS_ENOMEM, ZS_EFORMAT (malformed), ZS_EUNSUPPORTED (version, big-endian,
 * tensor type). */
int zs_gguf_open(const char *path, zs_gguf **out);
/* Parses size bytes at data (not copied: the buffer must outlive the zs_gguf); name is used in
 * messages (NULL: "<memory>"). Same validation and errors as zs_gguf_open. */
int zs_gguf_open_mem(const void *data, size_t size, const char *name, zs_gguf **out);
/* Unmaps and frees everything (NULL is fine). */
void zs_gguf_close(zs_gguf *g);

/* (These and the count/at/find functions below return 0 / NULL for a NULL g.) */
uint32_t zs_gguf_version(const zs_gguf *g);     /* 2 or 3 */
size_t zs_gguf_alignment(const zs_gguf *g);     /* general.alignment or 32 */
size_t zs_gguf_data_offset(const zs_gguf *g);   /* file offset of the data section */
const char *zs_gguf_path(const zs_gguf *g);     /* path (or name) it was opened with */

/* ---------- metadata ---------- */
size_t zs_gguf_kv_count(const zs_gguf *g);
/* Key and value type of the i-th key/value in file order (NULL / -1 when i >= count). */
const char *zs_gguf_kv_key(const zs_gguf *g, size_t i);
int zs_gguf_kv_type(const zs_gguf *g, size_t i);
/* Index of key, or -1 when absent (records no error; hash lookup). */
long zs_gguf_find_key(const zs_gguf *g, const char *key);

/* Typed scalar getters. Integers convert between integer types when the value fits (else
 * ZS_ERANGE); f32 accepts f32 and 8/16-bit integers; f64 accepts f32, f64 and integers of up
 * to 32 bits; bool only bool; str only string. Nothing else converts. */
int zs_gguf_get_u32(const zs_gguf *g, const char *key, uint32_t *out);
int zs_gguf_get_i32(const zs_gguf *g, const char *key, int32_t *out);
int zs_gguf_get_u64(const zs_gguf *g, const char *key, uint64_t *out);
int zs_gguf_get_i64(const zs_gguf *g, const char *key, int64_t *out);
int zs_gguf_get_f32(const zs_gguf *g, const char *key, float *out);
int zs_gguf_get_f64(const zs_gguf *g, const char *key, double *out);
int zs_gguf_get_bool(const zs_gguf *g, const char *key, bool *out);
/* *s is NUL-terminated; len (may be NULL) gets its length (the string may contain NULs). */
int zs_gguf_get_str(const zs_gguf *g, const char *key, const char **s, size_t *len);

/* Arrays: element type and count (elem_type or n may be NULL); ZS_EINVAL if not an array. */
int zs_gguf_get_arr(const zs_gguf *g, const char *key, int *elem_type, size_t *n);
/* Element i of an array (ZS_ERANGE when i >= n), with the same conversions as the scalar
 * getters (ZS_EINVAL when the element type does not convert). */
int zs_gguf_arr_str(const zs_gguf *g, const char *key, size_t i, const char **s, size_t *len);
int zs_gguf_arr_u32(const zs_gguf *g, const char *key, size_t i, uint32_t *out);
int zs_gguf_arr_i32(const zs_gguf *g, const char *key, size_t i, int32_t *out);
int zs_gguf_arr_i64(const zs_gguf *g, const char *key, size_t i, int64_t *out);
int zs_gguf_arr_f32(const zs_gguf *g, const char *key, size_t i, float *out);
int zs_gguf_arr_f64(const zs_gguf *g, const char *key, size_t i, double *out);
/* Whole numeric arrays at once (tokenizer scores and token types): n must equal the array's
 * length (ZS_ESHAPE otherwise); same conversions per element. Unlike the other getters, a
 * failure part way (an element that does not convert) may leave dst partly written. */
int zs_gguf_arr_copy_f32(const zs_gguf *g, const char *key, float *dst, size_t n);
int zs_gguf_arr_copy_i32(const zs_gguf *g, const char *key, int32_t *dst, size_t n);
/* Element i of an array of arrays: that inner array's element type and count. (Inner arrays
 * are parsed and validated; their elements are not exposed beyond this.) */
int zs_gguf_arr_arr(const zs_gguf *g, const char *key, size_t i, int *elem_type, size_t *n);

/* ---------- tensors ---------- */
size_t zs_gguf_tensor_count(const zs_gguf *g);
/* i-th tensor in file order (NULL when i >= count). */
const zs_gguf_tensor *zs_gguf_tensor_at(const zs_gguf *g, size_t i);
/* Tensor by name, NULL if absent (hash lookup). */
const zs_gguf_tensor *zs_gguf_find_tensor(const zs_gguf *g, const char *name);

#endif
