/* gguf-write.h — writer of GGUF v3 files (llama.cpp's model format, little-endian): the header,
 * metadata key/values (strings, integers, floats, bools and arrays of them), tensor infos, and
 * tensor data streamed in declaration order, each tensor padded to the alignment.
 *
 * Use: zs_gguf_writer_open creates <path>.tmp at once (so an unwritable path fails before any
 * work); add every key/value and declare every tensor (zs_gguf_writer_kv_*, _add_tensor, in any
 * mix); then stream the data of the tensors in the order they were declared with
 * zs_gguf_writer_write (any split across calls). The first write puts the header, the metadata
 * and the tensor infos on disk; after it no key or tensor may be added. zs_gguf_writer_close
 * checks that every declared byte came, pads, flushes, fsyncs, renames <path>.tmp to path and
 * fsyncs the directory: a failure anywhere (disk full, a short write, a wrong byte count) removes
 * the temporary file and leaves path as it was. Only the metadata and the tensor infos are held
 * in memory, never tensor data.
 *
 * general.alignment: 32 unless the caller sets the key (a u32 power of two) before declaring any
 * tensor; tensor offsets and the data section follow it.
 *
 * Limits checked (each a ZS_EINVAL naming the key or tensor): keys non-empty and unique, tensor
 * names 1..63 bytes (ggml's GGML_MAX_NAME) and unique, 1..4 dims, positive dims, ne[0] a multiple
 * of the type's block size, a ggml type this build knows (gguf.h).
 *
 * Ownership: the writer copies every key, string and name it is given. A writer is used by one
 * thread at a time; different writers are independent. After any failed call the writer is
 * failed: every later call returns an error; call zs_gguf_writer_close (which then cleans up and
 * returns the error) or zs_gguf_writer_abort. */
#ifndef ZS_GGUF_WRITE_H
#define ZS_GGUF_WRITE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gguf.h"

typedef struct zs_gguf_writer zs_gguf_writer;

/* Creates <path>.tmp (truncating a stale one). Errors: ZS_ENOTFOUND (no such directory),
 * ZS_EPERM, ZS_EIO, ZS_ENOMEM; the message names path. */
int zs_gguf_writer_open(const char *path, zs_gguf_writer **out);
/* The temporary file's path (for a caller that must remove it from a signal handler). */
const char *zs_gguf_writer_tmp_path(const zs_gguf_writer *w);

/* ---- metadata (before the first zs_gguf_writer_write) ---- */
int zs_gguf_writer_kv_str(zs_gguf_writer *w, const char *key, const char *s); /* NUL-terminated */
int zs_gguf_writer_kv_strn(zs_gguf_writer *w, const char *key, const char *s, size_t len);
int zs_gguf_writer_kv_u32(zs_gguf_writer *w, const char *key, uint32_t v);
int zs_gguf_writer_kv_i32(zs_gguf_writer *w, const char *key, int32_t v);
int zs_gguf_writer_kv_u64(zs_gguf_writer *w, const char *key, uint64_t v);
int zs_gguf_writer_kv_f32(zs_gguf_writer *w, const char *key, float v);
int zs_gguf_writer_kv_bool(zs_gguf_writer *w, const char *key, bool v);
/* An array of n numbers of value type elem (ZS_GGUF_U8 .. ZS_GGUF_BOOL, U64, I64, F64; not STR or
 * ARR), packed little-endian at data (bools one byte each, 0 or 1). n may be 0. */
int zs_gguf_writer_kv_arr(zs_gguf_writer *w, const char *key, int elem, const void *data, size_t n);
/* An array of n strings; len may be NULL (then each is NUL-terminated). */
int zs_gguf_writer_kv_arr_str(zs_gguf_writer *w, const char *key, const char *const *s,
                              const size_t *len, size_t n);

/* ---- tensors ---- */
/* Declares a tensor: GGUF dim order (ne[0] contiguous), n_dims 1..4. Its data comes after the
 * data of every tensor declared before it. */
int zs_gguf_writer_add_tensor(zs_gguf_writer *w, const char *name, zs_ggml_type type, int n_dims,
                              const int64_t *ne);
size_t zs_gguf_writer_tensor_count(const zs_gguf_writer *w);
/* Bytes of tensor data (with padding) declared so far. */
uint64_t zs_gguf_writer_data_bytes(const zs_gguf_writer *w);

/* Appends n bytes of tensor data; ZS_EINVAL past the declared total. Errors of the file system:
 * ZS_ENOSPC (disk full, file too large), ZS_EIO, naming the file. */
int zs_gguf_writer_write(zs_gguf_writer *w, const void *data, size_t n);
/* Finishes the file (see the top); always frees w. 0, or the error (the file is then absent). */
int zs_gguf_writer_close(zs_gguf_writer *w);
/* Frees w and removes the temporary file (NULL is fine). */
void zs_gguf_writer_abort(zs_gguf_writer *w);

#endif
