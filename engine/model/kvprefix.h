/* kvprefix.h — the prefix cache's tier below memory (--kv-offload): a full prompt block that the
 * KV cache evicts (kvcache.h's least recently released first) moves down to a tier (kvtier.h)
 * instead of being forgotten, and a later prompt with the same prefix takes it back into memory
 * instead of prefilling it. With write_through (the NVMe tier, a file kept across restarts) every
 * block published to the cache is also written down at once, so after a restart a long system
 * prompt is warm again; its records are keyed in the file by what decides the K/V values (the
 * engine's model fingerprint and dtypes), and a record whose payload fails its checksum (a write
 * torn by kill -9) is dropped and prefilled instead. The tier holds at most cap blocks, least
 * recently used out first.
 * Ownership: a zs_kvprefix borrows the cache and the tier (both outlive it) and installs itself
 * as the cache's evict hook until freed. Thread-safety: the cache's (the engine thread). */
#ifndef ZS_KVPREFIX_H
#define ZS_KVPREFIX_H

#include <stdint.h>

#include "kvcache.h"
#include "kvtier.h"

typedef struct zs_kvprefix zs_kvprefix;

/* The records already in t (a persistent file's) are indexed by their tags. cap >= 1. */
int  zs_kvprefix_open(zs_kvcache *kv, zs_kvtier *t, int cap, int write_through, zs_kvprefix **out);
void zs_kvprefix_free(zs_kvprefix *p);
/* How many of hashes[0..n) are in the tier, leading ones (no side effects). */
int  zs_kvprefix_lookup(const zs_kvprefix *p, const uint64_t *hashes, int n);
/* Sequence seq holds exactly its first k full blocks (k = its length / ZS_KV_BLOCK, taken from
 * the cache or none): it takes hashes[k], hashes[k+1], .. from the tier while they are there and
 * the cache has room, each read into a fresh block and published. Returns how many it took; a
 * record that fails its checksum is dropped and ends the run. */
int  zs_kvprefix_take(zs_kvprefix *p, int seq, const uint64_t *hashes, int n);
/* Block j of seq was just published under hash: with write_through it goes down too. */
void zs_kvprefix_publish(zs_kvprefix *p, int seq, int j, uint64_t hash);

typedef struct {
    uint64_t stored;    /* blocks written down (evicted, or written through) */
    uint64_t taken;     /* blocks taken back into memory (prefix hits from the tier) */
    uint64_t dropped;   /* records dropped: a failed checksum or read */
    uint64_t put_errors; /* blocks the tier could not take (a full disk) */
    int held;           /* blocks in the tier now */
    int restored;       /* blocks a persistent file brought back at open */
} zs_kvprefix_stats;
void zs_kvprefix_stats_get(const zs_kvprefix *p, zs_kvprefix_stats *out);

#endif
