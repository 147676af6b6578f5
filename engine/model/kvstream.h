/* kvstream.h — layer-streamed KV: sequences whose K/V live in a tier (kvtier.h) below the cache's
 * memory and still run in every step. Each of their blocks is one record per layer in the tier;
 * the forward (zs_kv_layer) brings layer l of every streamed block of the batch into the cache's
 * stage blocks (kvcache.h) before layer l, while layer l - 1 computes (an I/O thread loads layer
 * l + 1 into the other parity's buffers), and writes the blocks the layer changed back to the tier
 * behind it. So a streamed sequence costs 2 / n_layers of its K/V in memory, and attention reads
 * the same bits as from memory.
 *
 * Between steps the I/O thread is idle (the last layer waits for its writes): the cache and the
 * tier are the engine thread's again. A write that fails (a full disk) marks the sequences that
 * held the block lost (zs_kvstream_seq_lost) and stops further streaming (zs_kvstream_ok); the
 * caller recomputes them from memory. A record that fails its checksum fails the step.
 *
 * Ownership: the stream owns its tier and thread, not the cache (which must outlive it).
 * Thread-safety: the engine thread calls everything; the stream's own thread touches only the
 * tier and stage buffers, during a step. */
#ifndef ZS_KVSTREAM_H
#define ZS_KVSTREAM_H

#include <stdint.h>

#include "kvcache.h"

typedef struct zs_kvstream zs_kvstream;

/* Enables kv's stage blocks, opens a tier of kind ZS_KVTIER_CPU or _NVME (dir for NVMe) with
 * one record per block and layer, starts the I/O thread and hooks the cache's layers. */
int  zs_kvstream_open(zs_kvcache *kv, int kind, const char *dir, zs_kvstream **out);
void zs_kvstream_free(zs_kvstream *st);
/* 0 after a write failed: no sequence should be streamed any more. */
int  zs_kvstream_ok(const zs_kvstream *st);
/* Saves every movable memory block of open sequence seq to the tier (all layers) and moves it to
 * a stage block; seq is streamed from now on (its shared prefix blocks stay in memory). On error
 * (the tier is full: ZS_ENOSPC, ZS_EIO) nothing changed. */
int  zs_kvstream_convert(zs_kvstream *st, int seq);
/* Between steps: the full blocks of the streamed sequences seqs[0..n) that are in memory (their
 * last block grows there while memory has room: the stream does not rewrite it at every step) go
 * to the tier and to stage blocks, written by the I/O threads in parallel. written[i]: the
 * positions of seqs[i] that hold K/V now (the blocks below it are full and no longer change).
 * Returns the blocks moved; a block whose write fails stays in memory. */
int  zs_kvstream_settle(zs_kvstream *st, const int *seqs, const int *written, int n);
/* 1 when a block of seq could not be written to the tier: its K/V are gone (recompute it). */
int  zs_kvstream_seq_lost(const zs_kvstream *st, int seq);

typedef struct {
    uint64_t converted;           /* sequences moved from memory to streaming */
    uint64_t settled;             /* full blocks a streamed sequence grew in memory, moved to the tier */
    uint64_t loads, stores;       /* block-layer records read and written */
    uint64_t bytes_in, bytes_out;
    uint64_t write_errors;
    double wait_s;                /* the engine thread waiting for loads and the last writes */
} zs_kvstream_stats;
void zs_kvstream_stats_get(const zs_kvstream *st, zs_kvstream_stats *out);

#endif
