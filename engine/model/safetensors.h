/* safetensors.h — reading and writing Hugging Face safetensors checkpoints.
 *
 * Reader: a zs_st_set is one checkpoint (a single file, or the shards of a sharded directory
 * with its model.safetensors.index.json). Every file is mmap'd read-only (MAP_PRIVATE,
 * PROT_READ) and fully validated at open; tensor data is never copied. Only dtypes F32, F16
 * and BF16 are accepted; a file with any other dtype is rejected at open, naming the tensor.
 *
 * Ownership: the set owns every name, path and mapping; zs_st_tensor pointers and the data
 * they point to stay valid until zs_st_close. Tensor data is little-endian, row-major and read
 * only; it is aligned to its element size when the producer aligned it (Hugging Face files and
 * zs_st_writer do), which safetensors itself does not guarantee, so copy with memcpy when
 * alignment matters.
 *
 * Thread-safety: an open set is immutable. zs_st_count/at/find/get/release/fingerprint may be
 * called from any number of threads at once; zs_st_close must not race with any of them.
 *
 * Writer: zs_st_writer streams one file (header, then tensor data in declaration order) to
 * <path>.tmp and renames it into place on close. A writer is used by one thread at a time. */
#ifndef ZS_SAFETENSORS_H
#define ZS_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "tensor.h"

/* ---------- reader ---------- */

typedef struct {
    const char *name;     /* owned by the set */
    zs_dtype dtype;
    int ndim;             /* 0..4 (0 = scalar) */
    int64_t shape[4];     /* unused dims are 0 */
    const void *data;     /* points into the read-only mmap; valid until zs_st_close */
    size_t nbytes;
    const char *file;     /* path of the file that holds it (owned by the set) */
} zs_st_tensor;

typedef struct zs_st_set zs_st_set;

/* Opens a model directory: <dir>/model.safetensors, or <dir>/model.safetensors.index.json with
 * its shard files, or, when neither exists, the single *.safetensors file present (several
 * without an index is an error). Tensors are ordered by shard, then by data offset. Errors:
 * ZS_ENOTFOUND (no checkpoint, missing shard), ZS_EFORMAT (malformed file or index),
 * ZS_EUNSUPPORTED (dtype), ZS_EIO, ZS_ENOMEM; the message names the file and the problem. */
int zs_st_open_dir(const char *dir, zs_st_set **out);
/* Opens one .safetensors file as a set. */
int zs_st_open_file(const char *path, zs_st_set **out);
/* Unmaps everything and frees the set (NULL is fine). */
void zs_st_close(zs_st_set *s);

size_t zs_st_count(const zs_st_set *s);
/* i-th tensor (NULL when i >= count). */
const zs_st_tensor *zs_st_at(const zs_st_set *s, size_t i);
/* Tensor by name, NULL if absent (hash lookup). */
const zs_st_tensor *zs_st_find(const zs_st_set *s, const char *name);
/* Finds name and checks its shape (shape may be NULL to skip the check, then ndim is ignored):
 * missing -> ZS_ENOTFOUND "<dir>: tensor 'x' not found";
 * wrong shape -> ZS_ESHAPE "<file>: tensor 'x' has shape [a, b], expected [c, d]". */
int zs_st_get(const zs_st_set *s, const char *name, int ndim, const int64_t *shape,
              const zs_st_tensor **out);
/* Tells the kernel the tensor's pages are no longer needed (madvise MADV_DONTNEED) once it has
 * been converted; the data stays readable (pages are re-read from the file on access). */
void zs_st_release(const zs_st_set *s, const zs_st_tensor *t);
/* Fingerprint of the set: a 64-bit hash of file names, sizes, mtimes and header bytes, as 16
 * lowercase hex digits + NUL into buf (cap >= 17, else ZS_EINVAL). Cheap: tensor data is not
 * hashed, so a rewrite that keeps size, mtime and header is not detected. */
int zs_st_fingerprint(const zs_st_set *s, char *buf, size_t cap);

/* ---------- writer ---------- */

typedef struct {
    const char *name;
    zs_dtype dtype;
    int ndim;            /* 0..4 */
    int64_t shape[4];
} zs_st_decl;

typedef struct zs_st_writer zs_st_writer;

/* Creates <path>.tmp and writes the header: JSON (tensors in the given order, contiguous,
 * padded with spaces so the data starts on a multiple of 8 bytes). The format allows no holes
 * between tensors, so a tensor is aligned to its element size only if those before it keep it
 * so: declare larger dtypes (or sizes that are multiples of 4 bytes) first. metadata_json may be NULL or
 * a JSON object of string -> string, stored as "__metadata__". decls is copied. Names must be
 * unique, non-empty and not "__metadata__". */
int zs_st_writer_open(const char *path, const zs_st_decl *decls, size_t n,
                      const char *metadata_json, zs_st_writer **out);
/* Appends nbytes of tensor data (any split across calls); ZS_EINVAL if that would exceed the
 * declared total. After any error the writer is failed: call zs_st_writer_abort. */
int zs_st_writer_write(zs_st_writer *w, const void *data, size_t nbytes);
/* Checks every declared byte was written, then fflush + fsync + rename to path (atomic) and
 * fsync of the directory. Always frees w; on error the tmp file is removed and path untouched. */
int zs_st_writer_close(zs_st_writer *w);
/* Frees w and removes the tmp file (NULL is fine). */
void zs_st_writer_abort(zs_st_writer *w);

#endif
