/* ckpt.h — checkpoints of a ZeRO training run (DESIGN.md §5): every rank's fp32 master shard and
 * AdamW moments (m, v) of every bucket, plus a JSON manifest; saved with N ranks, resumable with
 * any M ranks. The module deals only in per-bucket float arrays and their partition, nothing of
 * the engine: the caller maps its buckets (and their resident parts) onto checkpoint buckets.
 * The storage-dtype weights are not stored: they are re-derived from the master copy.
 *
 * On disk, under a run directory DIR:
 *   DIR/step-000123/rank<r>.bin   rank r's file (r = 0..N-1): a 64-byte header, then for every
 *                                 bucket this rank holds a part of, its master, m and v slices
 *                                 (f32, little-endian), each region at a 64-byte-aligned offset
 *   DIR/step-000123/manifest.json written last; names everything below
 *   DIR/latest                    one line: the name of the newest complete step directory
 * Step directories are named step-%06ld (more digits past 999999).
 *
 * The manifest (format "zeroserve-checkpoint", version 1): step; ranks; checksum algorithm
 * ("xxh64", zs_checksum64); model {dir, fingerprint} (as given, null if not); buckets: per bucket
 * {elems (unpadded), replicated, shard (elements per rank)}; files: per rank {rank, name, bytes,
 * checksum, regions: [{bucket, start, elems, offset, master, m, v}]} where start/elems are the
 * slice of the full bucket, offset is where master begins in the file (m and v follow at the
 * next 64-byte boundaries) and master/m/v are the XXH64 of each region as 16 hex digits; the
 * file checksum is the XXH64 of the 64-byte header followed by every region checksum (u64 LE) in
 * order, so it covers the whole file without a second pass over the data; meta: the caller's
 * JSON object, stored as is (data position, RNG state, training config, ...).
 *
 * Partition: bucket b of E elements saved with N ranks is cut into shards of S elements, S given
 * by the caller (zs_ckpt_layout.shard_elems) or, by default, ceil(E/N) rounded up to a multiple
 * of 1024; rank r holds [r*S, min((r+1)*S, E)) (empty when r*S >= E). A bucket marked
 * replicated (e.g. the small resident area that every rank keeps in full) is stored once, whole,
 * in rank 0's file. Reading never depends on the saved partition: zs_ckpt_read returns any
 * element range of the full arrays.
 *
 * Atomicity: zs_ckpt_save writes DIR/step-XXXXXX.tmp/ (rank files, fsync each; manifest last,
 * fsync; fsync the directory), renames it to DIR/step-XXXXXX, fsyncs DIR, then rewrites
 * DIR/latest (latest.tmp, fsync, rename, fsync DIR), and only then deletes older complete step
 * directories beyond `keep`. A crash leaves the previous checkpoint intact; a leftover *.tmp
 * directory is ignored by zs_ckpt_open and removed by the next save. Saving a step whose
 * directory already exists replaces it (old one moved aside, then deleted). One saver per DIR at
 * a time (no locking).
 *
 * Meta JSON: stored and returned as JSON; note that JSON integers here are signed 64-bit
 * (jansson), so a full u64 (an RNG state) belongs in a string, e.g. 16 hex digits.
 *
 * Ownership: zs_ckpt_save copies nothing it keeps; the arrays handed out by the callback must
 * stay valid for the duration of that callback's use (until the next callback or the return);
 * with zs_ckpt_save_opts.read, dst belongs to zs_ckpt_save and is valid only during the call.
 * A zs_ckpt owns its manifest, its strings and a read-only mapping of every rank file; strings
 * it returns live until zs_ckpt_close.
 * Thread safety: zs_ckpt_save is reentrant for different DIRs. An open zs_ckpt is read-only:
 * zs_ckpt_read and the accessors may be called from several threads at once. zs_ckpt_open
 * verifies on the kernel thread pool, so it must not be called from inside a pool task.
 * An open checkpoint stays readable if a later save prunes it (its files stay mapped).
 * Byte order: host order, and only little-endian hosts are supported (checked at build time). */
#ifndef ZS_CKPT_H
#define ZS_CKPT_H

#include <stddef.h>
#include <stdint.h>

#define ZS_CKPT_SHARD_ALIGN 1024 /* elements: default shard sizes are multiples of this */
#define ZS_CKPT_KEEP_DEFAULT 2

typedef struct {
    int n_buckets;                   /* >= 1 */
    const size_t *bucket_elems;      /* unpadded f32 elements of each bucket (0 allowed) */
    const size_t *shard_elems;       /* S per bucket (S * ranks >= elems), or NULL: default */
    const unsigned char *replicated; /* per bucket 1: stored once, whole, by rank 0; NULL: none */
    int ranks;                       /* N >= 1 */
} zs_ckpt_layout;

/* Hands out rank r's slice of bucket b: *master, *m, *v point to at least *n floats holding the
 * elements [start, start + len) of the full bucket (len as given by zs_ckpt_shard_range; for a
 * replicated bucket, rank 0 and the whole bucket); *n may be larger (padded shards): only the
 * first len elements are written. Called once per (rank, bucket) with len > 0, in order.
 * Return 0, or a negative ZS_E* code (with zs_err) to abort the save. */
typedef int (*zs_ckpt_get_fn)(void *ud, int rank, int bucket, const float **master,
                              const float **m, const float **v, size_t *n);

typedef struct {
    const char *model_dir;         /* recorded in the manifest; NULL: none */
    const char *model_fingerprint; /* recorded; NULL: none */
    const char *meta_json;         /* the caller's state: a JSON object (data position, RNG
                                      state, training config...); NULL: {} */
    int keep;                      /* complete checkpoints to keep, >= 1; 0: default 2 */
    /* Several processes saving one checkpoint together (cluster.h; every process calls
     * zs_ckpt_save with the same arguments): this process writes the rank files first_rank ..
     * first_rank+local_ranks-1 (the callback is asked for those only), process 0 prepares the
     * directory and writes the manifest and `latest` once every file is written; all return
     * the same status. 0 local_ranks: one process writes everything. DIR must be shared. */
    int first_rank, local_ranks;
    /* Instead of get (which may then be NULL): copies elements [off, off + n) of rank r's slice of
     * bucket b's array `which` (0 master, 1 m, 2 v; off counts from the slice's start) into dst.
     * Called in order, in chunks of at most ZS_CKPT_CHUNK elements. In order means: rank by
     * rank (this process's ranks), bucket by bucket (those with a slice of len > 0 on that rank),
     * within a bucket its master, then m, then v, each from off 0 upward in consecutive chunks
     * covering [0, len). When read is set, get is never called. Return 0, or a negative ZS_E*
     * code (with zs_err) to abort the save. The files, manifest and checksums are byte-identical
     * to what get would write for the same data; host memory: one buffer of ZS_CKPT_CHUNK floats
     * per save, whatever the shard sizes (for state that lives in a file, optstate.h). */
    int (*read)(void *ud, int rank, int bucket, int which, size_t off, size_t n, float *dst);
} zs_ckpt_save_opts;

#define ZS_CKPT_CHUNK (1 << 20) /* elements: the largest piece asked of zs_ckpt_save_opts.read */

/* The slice of bucket b that rank r holds under layout L: *start and *len (elements). For a
 * replicated bucket, rank 0 holds everything and the others nothing. ZS_EINVAL on a bad
 * layout/rank/bucket (the same checks as zs_ckpt_save). */
int zs_ckpt_shard_range(const zs_ckpt_layout *L, int bucket, int rank, size_t *start, size_t *len);

/* Saves checkpoint `step` (>= 0) of every rank under the run directory dir (created if missing;
 * its parent must exist). o may be NULL. The data comes from get, or, when o->read is set, from
 * o->read in chunks (get may then be NULL). Errors: ZS_EINVAL (layout, step, meta not a JSON
 * object, no callback, callback handing out too few elements), ZS_EIO/ZS_ENOSPC/ZS_EPERM (file
 * system, message names the path), or the callback's code (its message prefixed with
 * "checkpoint step S: rank R bucket B"). On error nothing of this step remains and earlier
 * checkpoints are untouched. */
int zs_ckpt_save(const char *dir, long step, const zs_ckpt_layout *L, zs_ckpt_get_fn get, void *ud,
                 const zs_ckpt_save_opts *o);

typedef struct zs_ckpt zs_ckpt;

/* Opens a checkpoint: dir is a step directory (it holds manifest.json) or a run directory (the
 * step named by DIR/latest; if latest is missing, or names a directory that does not exist, the
 * highest-numbered step directory that has a manifest, with a warning). Validates the manifest
 * (format, version, the partition it records, offsets and sizes), every rank file's size and
 * header, and every region's checksum (files are mapped and read once). Errors name the file and
 * the region: ZS_ENOTFOUND (no checkpoint, missing manifest or rank file), ZS_EFORMAT (bad
 * manifest, "…/rank1.bin: 4096 bytes, manifest says 8448 (truncated?)", bad header),
 * ZS_ECHECKSUM ("…/rank1.bin: bucket 2 m (elements 1024..2047): checksum mismatch"), ZS_EIO. */
int zs_ckpt_open(const char *dir, zs_ckpt **out);
void zs_ckpt_close(zs_ckpt *c); /* NULL is a no-op */

long zs_ckpt_step(const zs_ckpt *c);
const char *zs_ckpt_path(const zs_ckpt *c);  /* the step directory */
const char *zs_ckpt_meta(const zs_ckpt *c);  /* the caller's meta JSON, compact ("{}" if none) */
const char *zs_ckpt_model_dir(const zs_ckpt *c);         /* NULL if not recorded */
const char *zs_ckpt_model_fingerprint(const zs_ckpt *c); /* NULL if not recorded */
int zs_ckpt_ranks(const zs_ckpt *c);       /* the rank count it was saved with */
int zs_ckpt_n_buckets(const zs_ckpt *c);
size_t zs_ckpt_bucket_elems(const zs_ckpt *c, int bucket); /* 0 if out of range */
int zs_ckpt_bucket_replicated(const zs_ckpt *c, int bucket);

/* Copies elements [offset, offset + n) of bucket b's full (unpadded) master, m and v arrays
 * into the given buffers (any may be NULL to skip it), whatever partition it was saved with;
 * e.g. the slice of a new partition with a different rank count. ZS_ERANGE if the range
 * exceeds the bucket, ZS_EINVAL for a bad bucket. */
int zs_ckpt_read(const zs_ckpt *c, int bucket, size_t offset, size_t n, float *master, float *m,
                 float *v);

#endif
