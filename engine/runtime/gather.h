/* gather.h — the ZeRO-3 coordinator of one rank (DESIGN.md §3): it keeps this rank's shard of
 * every bucket in its tier (device memory, pinned host memory, or an NVMe shard file), and
 * during each forward pass hands out full buckets: NVMe -> pinned slot (io_uring) -> device ->
 * all_gather across ranks -> full-bucket buffer. A prefetch thread runs this pipeline ahead of
 * the compute thread, in pass order, bounded by max_live_bytes (full buffers resident at once)
 * and by the free pinned slots; acquire() only waits for work already in flight.
 *
 * Training writes updated shards back between passes (zs_gather_write_shard): into the shard
 * buffer, or in place into the NVMe shard file with its new checksum.
 *
 * A read that fails on any rank fails that bucket on every rank (the ranks agree on a status
 * before the all_gather), so the pass fails everywhere together; a shard found truncated or
 * corrupt is rewritten from the checkpoint before it is read again.
 *
 * Ownership: the coordinator owns its shards, slots, reader, shard file and full buffers; the
 * model and the communicator are borrowed. Thread-safety: acquire/release/pass_* come from one
 * compute thread; stats may be read from any thread. */
#ifndef ZS_GATHER_H
#define ZS_GATHER_H

#include <stddef.h>
#include <stdint.h>

#include "comm.h"
#include "dsconfig.h"
#include "model.h"

/* Device operations of a rank whose device is a GPU (engine/device.h fills them; NULL in
 * zs_gather_opts.dev keeps everything in host memory, the CPU device). With them, tier-none
 * shards and full-bucket buffers are device memory, and each bucket is assembled on the device:
 * `gather` copies this rank's shard (src: device memory, or pinned host memory that stays valid
 * (cpu tier) or that is released when it returns (an NVMe read slot)) into its place in `full`
 * on the copy queue and all_gathers the rest (NCCL on the comm queue, or device-to-device copies
 * when the ranks share a device through the local communicator), after the compute queue's last
 * use of `full` (retire) and before the event that `ready` makes the compute queue wait for. */
enum { ZS_GSRC_DEVICE = 0, ZS_GSRC_HOST = 1, ZS_GSRC_HOST_TRANSIENT = 2 };
typedef struct zs_gather_dev {
    void *ctx;
    void *(*alloc)(void *ctx, size_t bytes);   /* NULL (message set) when out of memory */
    void (*free)(void *ctx, void *p);          /* after its pending device work */
    int (*upload)(void *ctx, void *dst, const void *src, size_t bytes);   /* host -> device */
    int (*gather)(void *ctx, zs_comm *comm, const void *src, int src_kind, void *full,
                  size_t shard_bytes);
    void (*ready)(void *ctx, const void *full);  /* compute queue waits for the gather of full */
    void (*retire)(void *ctx, const void *full); /* compute queue is done with full after the
                                                    work queued so far */
} zs_gather_dev;

typedef struct {
    int tier;               /* ZS_OFFLOAD_NONE | ZS_OFFLOAD_CPU | ZS_OFFLOAD_NVME */
    size_t max_live_bytes;  /* full-bucket bytes resident at once; 0 = 4 x the largest bucket */
    int buffer_count;       /* pinned slots for NVMe reads (default 4) */
    int queue_depth;        /* io_uring queue depth (default 32) */
    size_t block_size;      /* bytes per read request (default 1 MiB) */
    int verify;             /* check each shard's checksum on every read */
    const zs_gather_dev *dev; /* NULL: the CPU device; else the rank's GPU (copied at new) */
    int replicate;          /* ZeRO stages 1 and 2: every rank holds every bucket whole (no
                               gathers); the "shard" of a bucket is then the whole bucket, padded to
                               nranks partitions (tiers none and cpu, CPU device) */
    /* Mixtures of experts (see "Experts" below) */
    size_t expert_cache_bytes; /* full expert buckets held at once (in use, cached, speculated): part of
                                  max_live_bytes, the rest bounds the other buckets; 0: two layers' worth
                                  of experts (or what max_live_bytes leaves over two of the largest other
                                  buckets, when that is given) */
    int expert_gather_all;     /* the baseline: every expert of a MoE layer gathered in every pass (a
                                  whole-block gather, as DeepSpeed ZeRO-3 does), nothing cached */
    int expert_no_speculate;   /* no speculative expert gathers */
} zs_gather_opts;

typedef struct {
    uint64_t bytes_nvme;      /* read from the shard file */
    uint64_t bytes_host;      /* moved host -> device (cpu tier) */
    uint64_t bytes_gathered;  /* received through all_gather */
    double stall_s;           /* time acquire() waited for a bucket */
    int max_depth;            /* most buckets ready beyond the one being computed */
    size_t live_bytes;        /* full-bucket bytes resident now */
    size_t max_live_bytes;    /* the most ever resident */
    size_t live_limit;        /* the bound in force */
    long items;               /* buckets gathered */
    long read_errors, repairs;
    /* mixtures of experts */
    long expert_layers;       /* MoE layer passes (agreements) */
    long expert_selected;     /* agreed experts, summed over those */
    long expert_hits, expert_misses; /* agreed experts found in the cache / gathered for the layer */
    long expert_spec, expert_spec_used; /* gathered speculatively / of those, used before evicted */
    uint64_t expert_bytes;    /* full expert bytes gathered (misses and speculation) */
    uint64_t expert_block_bytes; /* what gathering every expert of each of those layers would have moved */
    size_t expert_cache_used, expert_cache_limit; /* full expert bytes held now / the bound */
    long passes;              /* passes begun */
    long passes_adopted;      /* passes that took over a speculated or declared pass of another length */
    long passes_wasted;       /* declared or speculated passes consumed unused (a different pass came) */
} zs_gather_stats;

/* Shard sizes: every bucket's data part is split into nranks equal shards of this many bytes
 * (a multiple of 4096; 0 for an empty bucket). */
size_t zs_partition_shard_bytes(const zs_model *m, int bucket, int nranks);

typedef struct zs_gather zs_gather;

int  zs_gather_new(const zs_model *m, int rank, int nranks, zs_comm *comm,
                   const zs_gather_opts *o, zs_gather **out);
/* none/cpu tiers: where this rank's shard of bucket b is to be stored (shard_bytes long; device
 * memory for tier none on a GPU). */
void *zs_gather_shard_buffer(zs_gather *g, int b);
/* Stores this rank's shard of bucket b (none/cpu tiers) from host memory: a memcpy, or an
 * upload to the device. */
int  zs_gather_put_shard(zs_gather *g, int b, const void *src);
/* Reads this rank's shard of bucket b (shard_bytes long) into host memory dst: a memcpy (none/cpu
 * tiers on the CPU device), a download of the device shard (tier none on a GPU), or a pread of the
 * shard file with checksum verification (nvme).
 * Safe while the prefetcher runs (it only reads the file too). */
int  zs_gather_read_shard(zs_gather *g, int b, void *dst);
/* Writes new content for this rank's shard of bucket b from host memory (shard_bytes long; the
 * optimizer's write-back): none/cpu tiers as zs_gather_put_shard; nvme: zs_shard_file_update
 * (pwrite + fsync + manifest with the new checksum and the "-trained" fingerprint) and the new
 * checksum handed to the reader. Precondition (nvme, asserted): speculation is off, the caller
 * is between passes (after pass_end, before the next pass_begin) and no next pass is known (none
 * declared at the last begin, nothing speculated left: a pass begun since speculation was turned
 * off, or zs_gather_settle), so no read of any shard is in flight; call it from the thread that
 * drives the passes (or while none runs). */
int  zs_gather_write_shard(zs_gather *g, int b, const void *src);
/* nvme tier: the committed shard file of this rank (ownership passes to the coordinator). */
int  zs_gather_attach_file(zs_gather *g, void *shard_file /* zs_shard_file* */);
/* Starts the prefetch thread (after the shards are in place). */
int  zs_gather_start(zs_gather *g);
void zs_gather_free(zs_gather *g);   /* stops the thread; call after zs_comm_abort on shutdown */

/* Experts (mixtures of experts). Each expert is a bucket of its own, stored in its tier like any
 * other; only the experts a pass routes to are gathered. At a layer's ZS_PASS_EXPERTS mark
 * (model.h) the prefetch thread first gathers, speculatively, the experts that layer used in the
 * previous pass that are not cached (only while speculation has been right for that layer at
 * least half the time, only into room that no expert of this pass holds, never evicting one of
 * this pass), then takes the compute thread's bitmask, agrees on the union (an all-reduce of the
 * mask), and gathers the union's uncached experts in increasing order while the compute thread
 * uses them. Every decision (hit, miss, eviction victim, speculation) depends only on the agreed
 * masks and the sizes, so every rank issues the same gathers in the same order; a victim still
 * in use is waited for, never skipped. Released experts stay cached (least recently used out
 * first) within expert_cache_bytes. Direct mode (one rank, nothing to move) hands out the shards
 * themselves; several replicated ranks (ZeRO 1/2) agree on the compute thread. */

/* The weight source that a forward pass reads through. */
zs_weight_source zs_gather_source(zs_gather *g);
/* Every rank runs exactly one full pass per engine step: pass_begin, then the forward (whose
 * acquires may stop early on an error), then pass_end, which releases what is still held and
 * takes part in the remaining gathers of the pass. A rank with nothing to compute calls just
 * begin and end. */
enum { ZS_PASS_INFER = 0, ZS_PASS_TRAIN = 1 };
/* kind ZS_PASS_INFER: zs_model_pass_order (embeddings, layers, head (+ embeddings for a tied
 * head); an inference model with host lookup tables skips the first embeddings);
 * ZS_PASS_TRAIN: the same, then the layers in reverse (backward); ZS_PASS_BWD: the layers in
 * reverse alone (a backward whose forward rode an inference pass). */
enum { ZS_PASS_BWD = 2 };
void zs_gather_pass_begin(zs_gather *g, int kind);
void zs_gather_pass_end(zs_gather *g);

/* Passes over any part of the training order (slices of a training step, issue 31). The training
 * order is the inference order followed by the layers in reverse, each MoE layer's bucket
 * followed by its ZS_PASS_EXPERTS mark: zs_gather_order returns it (owned by g) and its length,
 * and *n_infer, the length of its inference prefix. A range is items [first, first + count) of it
 * (count >= 1); INFER is {0, n_infer}, TRAIN {0, n}, BWD {n_infer, n - n_infer}. A range never
 * separates a layer's bucket from its mark. */
typedef struct { int first, count; } zs_pass_range;
int  zs_gather_order(const zs_gather *g, const int **order, int *n_infer);
zs_pass_range zs_gather_kind_range(const zs_gather *g, int kind);
/* Begins a pass over cur. next declares the pass that follows it, so the prefetcher may run into
 * that one while this one is computed (NULL: speculation decides: the inference pass when on,
 * nothing when off). Every rank must begin the same ranges with the same declarations.
 * When the pass the prefetcher may already be in (declared, or speculated) is not cur:
 *   - adopted when it starts where cur starts and cur is at least as long (a training pass after
 *     a speculated inference pass: the forward's buckets already fetched are used);
 *   - otherwise consumed whole first (its gathers complete on every rank) and counted as wasted.
 * zs_gather_pass_begin(g, kind) is zs_gather_pass_begin_range(g, zs_gather_kind_range(g, kind), NULL). */
void zs_gather_pass_begin_range(zs_gather *g, zs_pass_range cur, const zs_pass_range *next);
/* Speculation (on at start): every coming pass not declared otherwise is an inference pass, so
 * the prefetcher runs into the next one before it begins. Off: only declared passes are run into
 * (a full fine-tune turns it off to write shards between passes). Every rank must switch it at the
 * same step. Turning it off does not discard what was speculated: the next pass begun adopts it
 * or consumes it (zs_gather_pass_begin_range). */
void zs_gather_set_speculation(zs_gather *g, int on);
/* Between passes: consumes the next pass the prefetcher may already be in (declared at the last
 * begin, or speculated), if any, as a wasted pass (its gathers complete on every rank). With
 * speculation off nothing is read after it before the next begin: shards may be written, and no
 * collective is left half done. Every rank must call it at the same step. */
void zs_gather_settle(zs_gather *g);

/* The first failure of the current pass (a failure of this rank's own read preferred over one
 * caused by another rank's): its code (0 if none), *remote and the message. */
int  zs_gather_pass_error(const zs_gather *g, int *remote, const char **msg);

void zs_gather_stats_get(zs_gather *g, zs_gather_stats *s);
void zs_gather_stats_reset_peaks(zs_gather *g);

#endif
