/* world.h — the ranks of one world (DESIGN.md §1): N rank threads in this process, each bound to
 * a device (a CPU device here) with its own communicator handle, gather coordinator, KV cache and
 * forward executor. Rank 0 runs in the caller's thread; ranks 1..N-1 are worker threads. Every
 * engine step is one step plan: a batch for each rank (possibly empty) that all ranks execute in
 * lockstep, so every rank takes part in every gather.
 *
 * Several processes (cluster.h, `mpirun -np P`): the world has P*N ranks, this process's ranks
 * are world ranks first..first+N-1 (first = process * N), the parameters are split P*N ways and
 * the communicators span the processes. Two ways to drive it:
 *   led   (default) process 0 drives: each zs_world_step there broadcasts a step plan and the
 *         followers, inside zs_world_follow, run it with empty batches (they take part in every
 *         gather; process 0's ranks hold every sequence). zs_world_free on process 0 ends the
 *         followers' loop. zs_world_run is not available (it needs every process's state).
 *   spmd  every process makes the same calls in the same order (training: each process reads
 *         the same data and runs its own ranks' share of every step).
 * Functions taking a rank take this process's rank index 0..N-1.
 *
 * zs_world_open also places the parameters: each bucket is packed once from the checkpoint and
 * its N shards go to their ranks' tiers (device memory, pinned host memory, or one NVMe shard
 * file per rank, written atomically and reused on the next start when the checkpoint and the
 * layout are unchanged). The model's resident parts (norms, biases and, for an inference model,
 * the embedding lookup tables: model.h) are one copy in the model, which every rank thread of
 * the process reads. Ownership: the world owns its ranks; the model is borrowed and must
 * outlive it. Thread-safety: one thread drives a world (open, step, free). */
#ifndef ZS_WORLD_H
#define ZS_WORLD_H

#include "gather.h"
#include "kvcache.h"
#include "model.h"

typedef struct {
    int ranks;             /* >= 1 */
    const char *nvme_path; /* directory of the shard files (tier nvme) */
    zs_gather_opts gather; /* tier, live budget, slots, aio, verify */
    int max_tokens;        /* tokens per forward call and rank */
    int kv_blocks, max_seqs, context; /* KV cache of each rank */
    int device;            /* ZS_DEVICE_CUDA (device.h): rank r on CUDA device r % visible, its
                              shards, buffers, KV cache and forward pass on the GPU; anything
                              else: the CPU device */
    int spmd;              /* several processes: every process drives the world (see above) */
    zs_dtype kv_dtype;     /* KV cache elements (host or device): ZS_F32 (0), ZS_F16, ZS_BF16 */
    int local;             /* 1: this process's ranks alone, whatever the cluster (spec-draft.c's
                              draft model, which only process 0 runs) */
} zs_world_opts;

typedef struct zs_world zs_world;

int  zs_world_open(zs_model *m, const zs_world_opts *o, zs_world **out);
void zs_world_free(zs_world *w);
int  zs_world_ranks(const zs_world *w);      /* ranks of this process */
int  zs_world_size(const zs_world *w);       /* ranks of the whole world (all processes) */
int  zs_world_first_rank(const zs_world *w); /* world rank of this process's rank 0 */
/* 1 when the world spans several processes and is led by process 0 (not spmd). */
int  zs_world_led(const zs_world *w);

/* A follower's life (led worlds, processes > 0): runs the step plans process 0 broadcasts until
 * it frees its world. Returns 0 then, or an error when the cluster is lost. */
int  zs_world_follow(zs_world *w);
zs_kvcache *zs_world_kv(zs_world *w, int rank);
/* 1 when the shard files of this start were reused rather than written. */
int  zs_world_reused_shards(const zs_world *w);

/* One step: rank r runs batches[r] (n == 0: takes part in the gathers only) and writes its
 * logits to logits[r]. Returns 0, or the first failing rank's error (message set). */
int  zs_world_step(zs_world *w, const zs_batch *batches, float **logits);

/* A step with more to it (issue 31: training slices riding serving steps). rider: a passenger of
 * the step's pass on every rank: the rank's forward reads through wrap(ud, rank, inner) instead of
 * the gather's source (the passenger computes on each bucket while it is held); a rank with no rows
 * calls walk(ud, rank, src), which acquires and releases the inference pass's buckets itself;
 * done(ud, rank) ends the passenger's part of the step on that rank (after the forward, before
 * pass_end). The three run on every rank's thread at once (each with its own rank's state).
 * next: the pass after this step's, declared to the gathers (NULL: speculation). Both are this
 * process's: a led multi-process world refuses them (ZS_EUNSUPPORTED). */
typedef struct {
    zs_weight_source (*wrap)(void *ud, int rank, zs_weight_source inner);
    void (*walk)(void *ud, int rank, zs_weight_source src);
    void (*done)(void *ud, int rank);
    void *ud;
} zs_world_rider;
typedef struct {
    const zs_world_rider *rider;  /* or NULL */
    const zs_pass_range *next;    /* or NULL */
} zs_world_step_opts;
int  zs_world_step_ex(zs_world *w, const zs_batch *batches, float **logits, const zs_world_step_opts *o);

/* Runs fn(ud, r) on every rank's thread (rank 0 on the caller's), in lockstep with nothing else:
 * the building block of training steps. In a led multi-process world only process 0's ranks
 * would run it: callers check zs_world_led first. */
void zs_world_run(zs_world *w, void (*fn)(void *ud, int rank), void *ud);
zs_model *zs_world_model(zs_world *w);
zs_gather *zs_world_gather(zs_world *w, int rank);
/* A second communicator group, for gradient reductions from the compute threads (the first one
 * belongs to the prefetch threads). */
zs_comm *zs_world_grad_comm(zs_world *w, int rank);
int zs_world_is_cuda(const zs_world *w);
/* The rank's CUDA device (a zs_dev*, device.h; the trainer's zs_trainer_new_device takes it), or
 * NULL on the CPU device. Borrowed: the world owns it. */
void *zs_world_dev(zs_world *w, int rank);
/* 1 when every rank holds every bucket whole (ZeRO stages 1 and 2). */
int zs_world_replicated(const zs_world *w);

/* Counters of all ranks: bytes summed, stall summed, depth and live bytes the maximum. */
void zs_world_stats(zs_world *w, zs_gather_stats *out);
void zs_world_reset_peaks(zs_world *w);

#endif
