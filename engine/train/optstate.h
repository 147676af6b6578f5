/* optstate.h — where one rank's optimizer state lives (DESIGN.md §5, DeepSpeed's
 * offload_optimizer): the fp32 master copy and the two AdamW moments (m, v) of this rank's
 * shard of every bucket, either in host memory (device "cpu", ZeRO-Offload) or in a file on NVMe
 * (device "nvme", ZeRO-Infinity), streamed through a few pinned buffers during the optimizer step.
 *
 * The state is n_buckets arrays of elems[b] floats each for master, m and v. The optimizer step
 * visits it in SUB-GROUPS: bucket by bucket in increasing order, each bucket cut into pieces of
 * at most sub_group elements ([0, sg), [sg, 2sg), ... of the bucket; a bucket never shares a
 * sub-group with another). zs_optstate_step hands every sub-group to a callback that updates it
 * in place.
 *
 *  - cpu: three arrays per bucket in host memory (64-byte aligned, zeroed). The step's callback
 *    gets pointers into them; nothing is copied. zs_optstate_arrays gives direct access.
 *  - nvme: one file per rank, DIR/zs-optimizer-rank<rank>.bin, created (replacing a leftover one)
 *    at open and removed at close: scratch, not a checkpoint (checkpoints copy out of it, a
 *    resume refills it). For each sub-group in order: its master, m and v, each region at a
 *    4096-byte-aligned offset, so that O_DIRECT io_uring reads and writes move whole sub-groups.
 *    Host memory: buffer_count staging buffers of one sub-group (master + m + v) each, page
 *    aligned (pinned with mlock when pin_memory; registered with io_uring as fixed buffers), and
 *    nothing else of the state. During zs_optstate_step the reads run ahead (up to buffer_count - 1
 *    sub-groups beyond the one being updated, fewer when writes still hold buffers) and each
 *    updated sub-group is written back behind the update; the step returns once every write has
 *    completed. Without O_DIRECT (tmpfs) or io_uring, pread/pwrite on the same layout (logged once).
 *    buffer_count 1 works (no overlap).
 *
 * Bitwise: the callback sees the same values in both devices, so an element-wise update gives
 * bitwise the same state whatever the device, sub-group size or buffer count.
 *
 * Errors: ZS_EIO / ZS_ENOSPC naming the file and the offset; the message says which sub-group.
 * After a failed step the state of the sub-groups not yet written back is the old one; the ones
 * written are updated (a caller treats a failed step as fatal for the run, as DeepSpeed does).
 *
 * Ownership: the state owns its memory / file. Thread safety: one thread at a time per state
 * (each rank has its own); the step runs the callback on the calling thread. */
#ifndef ZS_OPTSTATE_H
#define ZS_OPTSTATE_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    int device;          /* ZS_OFFLOAD_CPU or ZS_OFFLOAD_NVME (dsconfig.h); NONE is taken as CPU */
    const char *dir;     /* nvme: directory of the file (must exist) */
    int rank;            /* world rank: names the file */
    size_t sub_group;    /* elements per sub-group, >= 1 (0: 1e9, DeepSpeed's default) */
    int buffer_count;    /* nvme: staging buffers, >= 1 (0: 4, DeepSpeed's default) */
    int pin_memory;      /* nvme: lock the staging buffers in memory (0/1) */
    int queue_depth;     /* nvme: io_uring entries (0: 32) */
} zs_optstate_opts;

typedef struct zs_optstate zs_optstate;

/* n_buckets >= 1 arrays of elems[b] floats (0 allowed) of master, m and v, all zero. */
int  zs_optstate_open(const zs_optstate_opts *o, int n_buckets, const size_t *elems, zs_optstate **out);
void zs_optstate_close(zs_optstate *s); /* NULL is a no-op; removes the nvme file */

/* cpu: bucket b's arrays (may be NULL for elems 0); nvme: ZS_EUNSUPPORTED (use read / write). */
int zs_optstate_arrays(zs_optstate *s, int b, float **master, float **m, float **v);

/* Copies elements [off, off + n) of bucket b out of (read) or into (write) the state; any of
 * master / m / v may be NULL: that array is skipped (write: left as it is). nvme: through a
 * staging buffer, any alignment (read-modify-write of partial 4096-byte pages). ZS_ERANGE when the
 * range exceeds the bucket. */
int zs_optstate_read(zs_optstate *s, int b, size_t off, size_t n, float *master, float *m, float *v);
int zs_optstate_write(zs_optstate *s, int b, size_t off, size_t n, const float *master, const float *m,
                      const float *v);

/* The callback of a step: sub-group [off, off + n) of bucket b, updated in place. last: 1 when
 * it is the bucket's last sub-group. A negative return stops the step (after the writes already
 * submitted have completed) and is returned by zs_optstate_step. */
typedef int (*zs_optstate_fn)(void *ud, int b, size_t off, size_t n, float *master, float *m, float *v,
                              int last);
/* Visits every sub-group of every bucket with elems > 0 and skip[b] == 0 (skip may be NULL), in
 * order, writing each back (nvme) after the callback. */
int zs_optstate_step(zs_optstate *s, const unsigned char *skip, zs_optstate_fn fn, void *ud);

typedef struct {
    size_t host_bytes;    /* host memory held for the state: cpu the arrays, nvme the staging buffers */
    size_t file_bytes;    /* nvme: the file's size (0 for cpu) */
    uint64_t bytes_read, bytes_written; /* nvme: moved by steps and read/write since open */
    double io_wait_s;     /* nvme: time steps spent waiting for I/O (not hidden by the updates) */
    int direct;           /* nvme: 1 O_DIRECT io_uring, 0 the pread/pwrite fallback */
} zs_optstate_stats;
void zs_optstate_stats_get(const zs_optstate *s, zs_optstate_stats *out);

#endif
