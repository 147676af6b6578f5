/* store.h — the NVMe offload tier: one shard file per rank holding that rank's shard of every
 * bucket (one bucket per transformer layer, plus embeddings / final norm / LM head), with a JSON
 * manifest, a checksum per shard, atomic commit, reuse across restarts, and an asynchronous
 * reader (io_uring + O_DIRECT into registered pinned buffers, pread fallback).
 *
 * Files for rank r under dir:
 *   <dir>/rank<r>.shards   shards back to back at 4096-aligned offsets (every size % 4096 == 0)
 *   <dir>/rank<r>.json     manifest: format, version, rank, fingerprint, checksum algorithm,
 *                          total_bytes, and per shard {offset, bytes, checksum (16 hex digits),
 *                          label (if set)}
 * While writing, data goes to rank<r>.shards.tmp and the manifest to rank<r>.json.tmp.
 *
 * Checksum: zs_checksum64 is XXH64 (seed 0), implemented in store.c (no external library):
 * several GB/s per core, fast enough to verify shards as they stream in. zs_checksum64_state
 * computes the same value over input that arrives in pieces (e.g. a checkpoint region written
 * chunk by chunk).
 *
 * Training updates shards of a committed file in place (zs_shard_file_update); the manifest then
 * carries the fingerprint "<fingerprint>-trained" and the new checksums, so the base checkpoint
 * never reuses it.
 *
 * Ownership: a zs_shard_file owns its paths, sizes and labels; a zs_shard_reader copies what it
 * needs at open (paths, offsets, sizes, checksums, labels), so labels must be set before the
 * reader is opened (checksums changed later are passed with zs_shard_reader_set_checksum), and
 * the shard file may be closed while the reader lives. The reader does not
 * own the buffers it registers; they must outlive it.
 *
 * Thread safety: a zs_shard_file and a zs_shard_reader are each used by one thread at a time
 * (no internal locking; different objects may be used from different threads concurrently).
 * zs_checksum64, zs_shard_dir_check, zs_store_raw_read_gbps are thread-safe; a
 * zs_checksum64_state is used by one thread at a time.
 * zs_store_inject_read_error / zs_store_force_pread are process-wide (atomic) test knobs. */
#ifndef ZS_STORE_H
#define ZS_STORE_H

#include <stddef.h>
#include <stdint.h>

#define ZS_STORE_ALIGN 4096

typedef struct zs_shard_file zs_shard_file;

/* Checks before anything is written that dir exists (ZS_ENOTFOUND), is a directory
 * (ZS_ENOTFOUND), is writable: access(W_OK) and a real (empty) probe file created and removed
 * (ZS_EPERM), and that the filesystem has room for total_bytes plus a margin of
 * max(64 MiB, 1%) (ZS_ENOSPC, message with the path and the numbers). Space held by a stale
 * shard file that zs_shard_file_open would delete is counted as used. */
int zs_shard_dir_check(const char *dir, size_t total_bytes);

/* Opens rank `rank`'s shard file under dir for a layout of n shards (n >= 1) with the given
 * byte sizes (each a multiple of 4096, zero allowed), laid out back to back.
 * If <dir>/rank<r>.json and <dir>/rank<r>.shards exist, the manifest parses and its
 * fingerprint, rank, shard count, sizes and offsets match, and the data file size equals the
 * layout total, the file is reused: *reused = 1, nothing is touched (mtime unchanged).
 * Otherwise (with an info/warning log saying why, e.g. a truncated data file) it removes the
 * stale pair (manifest first, so its space is free for the new file), creates
 * <dir>/rank<r>.shards.tmp (preallocated to the total size; ZS_ENOSPC if the disk is too small)
 * and sets *reused = 0; the caller writes every shard with zs_shard_file_write and then calls
 * zs_shard_file_commit. Not safe against two processes writing the same rank in the same dir at
 * once. */
int zs_shard_file_open(const char *dir, int rank, const char *fingerprint, int n,
                       const size_t *shard_bytes, int *reused, zs_shard_file **out);
/* Writes shard `shard` (data is shard_bytes[shard] long, any alignment) and records its
 * checksum. Shards may be written in any order; each must be written before commit (writing one
 * twice overwrites it). ZS_EINVAL on a reused/committed file. */
int zs_shard_file_write(zs_shard_file *f, int shard, const void *data);
/* fsync the data, write the manifest to a tmp file + fsync, remove any old manifest, rename the
 * data tmp to its final name, fsync the dir, rename the manifest to its final name, fsync the
 * dir. A crash at any point leaves either a complete valid pair or no valid pair (a data file
 * without manifest is never reused), never a manifest describing other data. After commit the
 * file can be read (zs_shard_reader_open). */
int zs_shard_file_commit(zs_shard_file *f);
/* Frees f; if it was being written and not committed, removes the tmp files. NULL is a no-op. */
void zs_shard_file_close(zs_shard_file *f);

/* Rewrites one shard of a committed file in place (pwrite + fsync), e.g. after a read found it
 * truncated or corrupt; data must match the shard's recorded checksum. */
int zs_shard_file_repair(zs_shard_file *f, int shard, const void *data);
/* Gives one shard of a committed file new content (training's write-back): data is
 * shard_bytes[shard] long. The first update of a file first rewrites the manifest with the
 * fingerprint "<fingerprint>-trained", so that from then on (crash included) a later
 * zs_shard_file_open with the base checkpoint's fingerprint does not reuse the file but rewrites
 * it. Then pwrite + fdatasync of the shard, the in-memory checksum updated, and the manifest
 * replaced atomically with the new checksum (tmp + fsync + rename + dir fsync). A crash between
 * the data write and the manifest leaves a checksum mismatch that readers report. A reader
 * opened earlier keeps the old checksum: pass the new one with zs_shard_reader_set_checksum.
 * The caller ensures that no read of this shard is in flight. */
int zs_shard_file_update(zs_shard_file *f, int shard, const void *data);
/* Reads one shard of a committed file into buf (shard_bytes[shard] long, any alignment) with
 * pread and verifies its checksum (ZS_ECHECKSUM; ZS_EFORMAT if the file ends early). */
int zs_shard_file_read(const zs_shard_file *f, int shard, void *buf);
/* Data file path: the final name once reused/committed, the .tmp name while being written. */
const char *zs_shard_file_path(const zs_shard_file *f);
int zs_shard_file_count(const zs_shard_file *f);
size_t zs_shard_file_bytes(const zs_shard_file *f, int shard);  /* 0 if out of range */
size_t zs_shard_file_offset(const zs_shard_file *f, int shard); /* 0 if out of range */
size_t zs_shard_file_total_bytes(const zs_shard_file *f);
/* Checksum of a shard (from the manifest when reused, else as written; 0 if unknown). */
uint64_t zs_shard_file_checksum(const zs_shard_file *f, int shard);
/* 1 when the file is readable (reused or committed), else 0. */
int zs_shard_file_is_readable(const zs_shard_file *f);
/* Optional label per shard used in messages, e.g. "layer 3" -> "...: shard 5 (layer 3): ...".
 * Also stored in the manifest when set before commit. */
int zs_shard_file_set_label(zs_shard_file *f, int shard, const char *label);
/* The label of a shard, or NULL. */
const char *zs_shard_file_label(const zs_shard_file *f, int shard);

/* XXH64 (seed 0) of n bytes. */
uint64_t zs_checksum64(const void *data, size_t n);

/* Streaming XXH64 (seed 0): init, then update with the input in pieces of any sizes (0
 * allowed), then final, which equals zs_checksum64 of the concatenated pieces and leaves the
 * state as it was (more updates may follow). A state is owned by one thread at a time; the
 * caller owns its memory (a plain struct, no resources). */
typedef struct {
    uint64_t v[4];          /* the four lanes */
    uint64_t total;         /* bytes seen */
    unsigned char buf[32];  /* an incomplete stripe */
    uint32_t buflen;        /* its bytes, < 32 */
} zs_checksum64_state;
void zs_checksum64_init(zs_checksum64_state *s);
void zs_checksum64_update(zs_checksum64_state *s, const void *data, size_t n);
uint64_t zs_checksum64_final(const zs_checksum64_state *s);

/* ---- reader (store-uring.c) ---- */

typedef struct zs_shard_reader zs_shard_reader;
/* queue_depth: block requests in flight (default 32); block_size: bytes per request (default
 * 1 MiB, rounded up to 4096); verify: check each shard's checksum after it is read. */
typedef struct {
    int queue_depth;
    size_t block_size;
    int verify;
} zs_reader_opts;

/* Opens a readable shard file with O_DIRECT (without O_DIRECT, logged once, if the filesystem
 * refuses it at open or at the first read, or if env ZS_STORE_NO_DIRECT=1), creates an io_uring of queue_depth entries and
 * registers bufs[0..n_bufs) (each 4096-aligned, buf_bytes[i] long) once as fixed buffers. If
 * io_uring is not permitted (ENOSYS/EPERM, e.g. seccomp) or forced off (zs_store_force_pread or
 * env ZS_STORE_PREAD=1), all reads use pread(2) (logged once). If registration fails (e.g.
 * RLIMIT_MEMLOCK), plain (non-fixed) io_uring reads are used (logged once). A data file
 * smaller than the layout is a ZS_EFORMAT error here. o may be NULL (defaults). */
int zs_shard_reader_open(const zs_shard_file *f, const zs_reader_opts *o, void *const *bufs,
                         const size_t *buf_bytes, int n_bufs, zs_shard_reader **out);
/* Waits for reads still in flight (their results are dropped), unregisters, closes. */
void zs_shard_reader_close(zs_shard_reader *r);
/* Starts reading shard `shard` into buffer `buf` (offset 0). Non-blocking; several shard reads
 * may be in flight (each must use a different buffer). tag is returned by poll. */
int zs_shard_reader_submit(zs_shard_reader *r, int shard, int buf, uint64_t tag);
/* Reaps completions. Returns 1 when a shard read finished, with *tag and *status (0, or a
 * negative ZS_E* whose message is recorded on the calling thread with zs_err, naming the file,
 * the shard and its label: "…: shard 3 (layer 2): read failed at offset N: Input/output error",
 * "…: checksum mismatch", "…: unexpected end of file … (truncated?)"). wait=1 blocks until one
 * finishes; returns 0 when none finished (wait=0) or nothing is in flight. Negative only for a
 * failure of the reader itself. In pread mode the reading happens inside poll (one shard per
 * call, also with wait=0). */
int zs_shard_reader_poll(zs_shard_reader *r, int wait, uint64_t *tag, int *status);
/* Shard reads submitted and not yet returned by poll. */
int zs_shard_reader_inflight(const zs_shard_reader *r);
/* Sets the checksum that reads of shard `shard` are verified against (after
 * zs_shard_file_update; no read of that shard may be in flight). */
int zs_shard_reader_set_checksum(zs_shard_reader *r, int shard, uint64_t sum);
/* 1 if this reader uses io_uring, 0 if pread; *direct: 1 if O_DIRECT is in use. */
int zs_shard_reader_mode(const zs_shard_reader *r, int *direct);

/* Test-only fault hook: make the Nth (1-based, counted process-wide from now) block read return
 * -EIO. 0 disables. */
void zs_store_inject_read_error(long nth);
/* Test/ops knob: 1 forces the pread path for readers opened afterwards; 0 restores io_uring. */
void zs_store_force_pread(int on);

/* Raw sequential read bandwidth (GB/s, 1e9 bytes/s) of path with io_uring + O_DIRECT into
 * registered buffers (pread/buffered fallbacks as for the reader): reads `bytes` (the whole file
 * if 0; ZS_ERANGE if larger than the file) with queue_depth requests of block_size in flight,
 * after dropping the file's page cache with posix_fadvise(DONTNEED). */
int zs_store_raw_read_gbps(const char *path, size_t bytes, int queue_depth, size_t block_size,
                           double *gbps);

#endif
