/* kvswap.h — a whole KV sequence moved out of the cache's memory into a tier (kvtier.h) and
 * back, bit for bit: the scheduler's preemption (engine/runtime/sched.c). Out, each block of the
 * sequence (every layer's K and V) becomes one record of the tier and the sequence is closed, so
 * its blocks are free (shared prefix blocks only lose a reference); in, a free sequence slot
 * takes fresh blocks for the same length and the records are read back into them.
 * Ownership: a zs_kv_swapped owns its records until swapped in or freed. Thread-safety: that of
 * the cache and the tier (the engine thread). Needs host pools (zs_kv_init_ex host_data = 1). */
#ifndef ZS_KVSWAP_H
#define ZS_KVSWAP_H

#include "kvcache.h"
#include "kvtier.h"

typedef struct zs_kv_swapped zs_kv_swapped;

/* The record size a tier needs for kv's blocks. */
size_t zs_kv_swap_rec_bytes(const zs_kvcache *kv);
/* Moves sequence seq out to t and closes it. On error (the tier is full: ZS_ENOSPC, ZS_ENOMEM;
 * ZS_EIO; ZS_EUNSUPPORTED without host pools) nothing changed: the sequence is still open and
 * whole, and no record is left in t. */
int  zs_kv_swap_out(zs_kvcache *kv, int seq, zs_kvtier *t, zs_kv_swapped **out);
/* Blocks sw needs back in memory. */
int  zs_kv_swapped_blocks(const zs_kv_swapped *sw);
/* Opens a sequence holding sw's K/V again (*seq; its length as it was). ZS_EBUSY (no free slot)
 * or ZS_ENOSPC (not enough blocks): nothing changed, try later. A read error or a record that
 * fails its checksum (ZS_EIO, ZS_ECHECKSUM): the sequence is not opened and sw stays as it was
 * (free it: that KV is lost). On success sw is freed and its records dropped. */
int  zs_kv_swap_in(zs_kvcache *kv, zs_kv_swapped *sw, zs_kvtier *t, int *seq);
/* Drops sw's records and frees it (NULL is fine). */
void zs_kv_swapped_free(zs_kv_swapped *sw, zs_kvtier *t);

#endif
