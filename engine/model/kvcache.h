/* kvcache.h — paged key/value cache: fixed-size blocks of ZS_KV_BLOCK token positions, shared by
 * all sequences, with a block table per sequence (DESIGN.md §4).
 *
 * Memory: for each layer one pool of n_blocks blocks; a block holds K and V for ZS_KV_BLOCK
 * positions of all kv heads, in the cache's element type: f32 (the default), or f16 / bf16
 * (half the bytes; zs_kv_write rounds each value to nearest even, as PyTorch's .half() and
 * .to(torch.bfloat16) do, and the attention kernels widen them exactly when they read them).
 * Ownership: the cache owns its pools and sequence tables (and, with prefix caching, the
 * blocks' reference counts: a block may be in several sequences' tables at once).
 * Thread-safety: none; the engine thread that runs steps owns the cache (the scheduler
 * publishes block counts for metrics through zs_kv_used_blocks, which only reads an int). */
#ifndef ZS_KVCACHE_H
#define ZS_KVCACHE_H

#include <stddef.h>
#include <stdint.h>

#include "tensor.h"

#define ZS_KV_BLOCK 16

typedef struct zs_kvcache zs_kvcache;

/* kv_dim = n_kv_heads * head_dim. max_seqs sequence slots, each up to max_len positions. f32. */
int  zs_kv_init(int n_layers, int kv_dim, int n_blocks, int max_seqs, int max_len, zs_kvcache **out);
/* The same in element type dtype (ZS_F32, ZS_F16 or ZS_BF16; anything else is ZS_EINVAL), and
 * with host_data = 0 block tables only, no host K/V pools (the data live on a device,
 * engine/forward-cuda.c, in the same layout and dtype); zs_kv_k / zs_kv_v then return NULL. */
int  zs_kv_init_ex(int n_layers, int kv_dim, int n_blocks, int max_seqs, int max_len, zs_dtype dtype,
                   int host_data, zs_kvcache **out);
void zs_kv_free(zs_kvcache *kv);
/* Blocks that fit in bytes of cache memory, and the bytes of one block (K and V of ZS_KV_BLOCK
 * positions, every layer), for elements of dtype (2 bytes for f16/bf16: twice the blocks). */
int  zs_kv_blocks_for_bytes(int n_layers, int kv_dim, zs_dtype dtype, size_t bytes);
size_t zs_kv_block_bytes(int n_layers, int kv_dim, zs_dtype dtype);
zs_dtype zs_kv_dtype(const zs_kvcache *kv);

/* Sequence slots. open gives a free slot (ZS_EBUSY if none). */
int  zs_kv_seq_open(zs_kvcache *kv, int *seq);
void zs_kv_seq_close(zs_kvcache *kv, int seq);          /* frees its blocks at once */
int  zs_kv_seq_len(const zs_kvcache *kv, int seq);
/* Makes room for positions [0, new_len): allocates blocks as needed (ZS_ENOSPC when the pool is
 * exhausted, leaving the sequence unchanged) and records new_len as the length. */
int  zs_kv_seq_reserve(zs_kvcache *kv, int seq, int new_len);
/* Truncate the sequence to len positions (frees blocks beyond; with a window, only truncating to 0
 * gives blocks back, and positions older than the window are gone). */
void zs_kv_seq_truncate(zs_kvcache *kv, int seq, int len);
/* A sliding window for a model whose every layer attends through one (Mistral, Phi-3): a sequence
 * then needs only the last `window` positions, so it owns at most a ring of
 * ceil((window + max_chunk - 1) / ZS_KV_BLOCK) + 1 blocks and table index j uses ring block j % ring
 * (zs_kv_seq_blocks lists them per index as before). max_chunk: the most tokens of one sequence in
 * one forward call (the forward refuses more). Positions older than window are overwritten, so
 * the attention must never read them (zs_att_params.window). Set before any sequence opens; no-op
 * when the ring would not be smaller than a whole sequence. ZS_EINVAL / ZS_EBUSY / ZS_ENOMEM. */
int  zs_kv_set_window(zs_kvcache *kv, int window, int max_chunk);
/* Blocks per sequence with a window (0: none). */
int  zs_kv_ring(const zs_kvcache *kv);
/* 1 when tokens at positions p0..p1 of one sequence can run in one call: every position they read
 * (from p0 - window + 1) and write is in a distinct ring block (always 1 without a window). */
int  zs_kv_span_ok(const zs_kvcache *kv, int p0, int p1);

/* Pointers to K (or V) of (layer, seq, pos): kv_dim elements of zs_kv_dtype (float for f32,
 * uint16_t bits for f16/bf16); rows of one block follow each other. pos must be < seq length. */
void *zs_kv_k(zs_kvcache *kv, int layer, int seq, int pos);
void *zs_kv_v(zs_kvcache *kv, int layer, int seq, int pos);
/* Stores the kv_dim f32 values of k and of v at (layer, seq, pos), rounded to the cache's dtype
 * (nearest even; f32: copied). No-op without host pools. */
void zs_kv_write(zs_kvcache *kv, int layer, int seq, int pos, const float *k, const float *v);

/* A copy of one position's K and V to another position of the same sequence: speculative
 * decoding moves the entries of an accepted tree path to consecutive positions (zs_batch.moves). */
typedef struct {
    int32_t seq, from, to;
} zs_kv_move;
/* Copies K and V of (layer, seq, from) to (layer, seq, to) as stored (bit for bit). Both must be
 * < the sequence's length; from == to does nothing. No-op without host pools. */
void zs_kv_copy(zs_kvcache *kv, int layer, int seq, int from, int to);

/* The block ids of a sequence's positions [0, len) in order (ceil(len / ZS_KV_BLOCK) of them). */
const int *zs_kv_seq_blocks(const zs_kvcache *kv, int seq);
int zs_kv_max_seqs(const zs_kvcache *kv);

/* The blocks that hold a sequence's K/V, each once: its table's blocks, or with a window its ring
 * (table index j in units[j % ring]); *units points into the cache (valid until the sequence
 * changes). Returns how many. Swapping (kvswap.h) saves and restores them in this order. */
int zs_kv_seq_units(const zs_kvcache *kv, int seq, const int **units);
/* Layer layer's K and V of memory block b (2 * ZS_KV_BLOCK * kv_dim elements: K rows, then V
 * rows), and its bytes; NULL without host pools or for a stage block. */
void *zs_kv_block_data(zs_kvcache *kv, int layer, int b);
size_t zs_kv_block_layer_bytes(const zs_kvcache *kv);
int zs_kv_layers(const zs_kvcache *kv);
/* Blocks a reserve can take now: free ones and cached ones nobody holds. */
int zs_kv_avail_blocks(const zs_kvcache *kv);

/* Blocks held by open sequences (cached blocks nobody holds are not counted). */
int zs_kv_used_blocks(const zs_kvcache *kv);
int zs_kv_total_blocks(const zs_kvcache *kv);
int zs_kv_max_len(const zs_kvcache *kv);

/* Prefix caching (the scheduler's sched-prefix.c): blocks get reference counts, and a full block
 * whose content is published stays in the cache after its sequences let go of it, addressed by
 * the hash of its whole token prefix, until a sequence needs its room (least recently released first).
 * zs_kv_prefix_enable switches it on (before or after sequences open; ZS_EINVAL with a window
 * ring, whose blocks are overwritten; ZS_ENOMEM). Without it the functions below find nothing. */
int zs_kv_prefix_enable(zs_kvcache *kv);
/* The hash of a block of ZS_KV_BLOCK tokens after the blocks whose hash is parent (0 for the
 * first block); salt separates what else decides the values (the adapter). Never 0. */
uint64_t zs_kv_prefix_hash(uint64_t parent, uint64_t salt, const int32_t *tok);
/* How many of the leading hashes[0..n) are cached (no side effects). */
int zs_kv_prefix_lookup(const zs_kvcache *kv, const uint64_t *hashes, int n);
/* An open, empty sequence takes over the cached blocks of its leading hashes (a reference each);
 * its length becomes k * ZS_KV_BLOCK. Returns k (0 when it is not empty or nothing matches).
 * The shared blocks must never be written: the sequence writes only positions >= its length. */
int zs_kv_seq_share(zs_kvcache *kv, int seq, const uint64_t *hashes, int n);
/* Block index j of seq (full, written) is cached under hash (no-op when already cached, or when
 * hash is there already with another block). */
void zs_kv_seq_publish(zs_kvcache *kv, int seq, int j, uint64_t hash);
/* Called with a cached block and its prefix hash just before the cache evicts it (forgets it to
 * give its room to a sequence): the block's K/V are still there to be kept lower down
 * (kvprefix.h). NULL fn: none. */
typedef void (*zs_kv_evict_fn)(void *ud, int block, uint64_t hash);
void zs_kv_set_evict_hook(zs_kvcache *kv, zs_kv_evict_fn fn, void *ud);
/* Cached blocks no sequence holds (evictable), and blocks evicted so far. */
int zs_kv_cached_blocks(const zs_kvcache *kv);
uint64_t zs_kv_evictions(const zs_kvcache *kv);

/* Stage blocks: a layer-streamed sequence (kvstream.h) keeps its K/V in a tier, and each step
 * brings one layer of it at a time into a stage block. A memory block lent to the stage holds
 * n_layers / 2 stage blocks, each with two buffers (even and odd layers), so a streamed block costs
 * 2 / n_layers of a block in memory. Stage block ids follow the pool's (zs_kv_total_blocks() +
 * sb) in the tables; zs_kv_k / zs_kv_v / zs_kv_write address the buffer of the layer's parity,
 * whose content is the caller's to load before the layer (zs_kv_layer). A memory block is lent
 * when a stage block is taken and none is free, and given back when its last one is released.
 * zs_kv_stage_enable: ZS_EUNSUPPORTED without host pools, with a window ring, or with one layer. */
int  zs_kv_stage_enable(zs_kvcache *kv);
int  zs_kv_stage_per_block(const zs_kvcache *kv); /* n_layers / 2; 0 before enable */
/* Stage blocks a streamed reserve can take now (free ones, and per for each block it may lend). */
int  zs_kv_stage_avail(const zs_kvcache *kv);
int  zs_kv_stage_used(const zs_kvcache *kv);
int  zs_kv_stage_blocks(const zs_kvcache *kv); /* ids there can be: sb in [0, this) */
/* Counts the takes of stage block sb: a record saved under another generation is another
 * sequence's (or an older use's), never this one's. */
unsigned zs_kv_stage_gen(const zs_kvcache *kv, int sb);
/* From now on reserve gives seq stage blocks when memory has too few (until it closes); its
 * memory blocks stay. */
void zs_kv_seq_set_streamed(zs_kvcache *kv, int seq);
int  zs_kv_seq_streamed(const zs_kvcache *kv, int seq);
/* 1 when memory block b belongs to one sequence only and is not in the prefix cache. */
int  zs_kv_block_movable(const zs_kvcache *kv, int b);
/* Table index j of seq (a movable memory block) takes a stage block instead; the memory block is
 * released first (its K/V must be saved before). Returns the new id (total_blocks + sb). */
int  zs_kv_seq_to_stage(zs_kvcache *kv, int seq, int j);
/* Table index j of seq (a movable memory block, *old) takes a stage block while the memory block
 * stays as it is, the caller's, until it is saved: then zs_kv_block_let_go(old), or on failure
 * zs_kv_seq_stage_undo puts it back. -1 when the stage has no room without lending a block that
 * is not free (nothing changed). Returns the new id. */
int  zs_kv_seq_stage_keep(zs_kvcache *kv, int seq, int j, int *old);
void zs_kv_seq_stage_undo(zs_kvcache *kv, int seq, int j, int old);
void zs_kv_block_let_go(zs_kvcache *kv, int b);
/* Undoes zs_kv_seq_to_stage on table index j right after it (nothing else taken meanwhile): a
 * memory block again (returned: its K/V are the caller's to restore), and the streamed flag as
 * given. */
int  zs_kv_seq_from_stage(zs_kvcache *kv, int seq, int j, int streamed);
/* Stage block sb's buffer for layer's parity (2 * ZS_KV_BLOCK * kv_dim elements), or NULL. */
void *zs_kv_stage_data(zs_kvcache *kv, int layer, int sb);
/* Stage blocks written (zs_kv_write, zs_kv_copy) since the last clear, each once. */
int  zs_kv_stage_dirty(const zs_kvcache *kv, const int **sb);
void zs_kv_stage_dirty_clear(zs_kvcache *kv);
/* The forward calls zs_kv_layer before (end 0) and after (end 1) each layer, with the batch
 * rows' sequences (seqs[0..n)); it calls the hook when stage blocks are in use (returns 0
 * otherwise). A negative return fails the forward. */
typedef int (*zs_kv_layer_fn)(void *ud, int layer, int end, const int32_t *seqs, int n);
void zs_kv_set_layer_hook(zs_kvcache *kv, zs_kv_layer_fn fn, void *ud);
int  zs_kv_layer(zs_kvcache *kv, int layer, int end, const int32_t *seqs, int n);

#endif
