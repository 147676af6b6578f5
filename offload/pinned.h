/* pinned.h — a pool of page-aligned host "slots" used as staging buffers between the NVMe store
 * and the devices (ZeRO-3 parameter shards on their way NVMe -> host -> device).
 *
 * The pool is ONE anonymous mmap'd region (4096-aligned, slots back to back, each slot rounded up
 * to a multiple of 4096 bytes). When a device backend has installed registration hooks
 * (zs_pinned_set_hooks, e.g. cudaHostRegister / cudaHostUnregister), the whole region is
 * registered once at init and unregistered at free; the same memory is what the shard reader
 * registers with io_uring as fixed buffers (pass zs_pinned_slot(p, i) for every i).
 *
 * Ownership: the pool owns the region; zs_pinned_slot() pointers are valid until zs_pinned_free.
 * Thread safety: zs_pinned_acquire / zs_pinned_release / zs_pinned_free_count are thread-safe
 * (mutex + condition variable). zs_pinned_count / zs_pinned_slot_bytes / zs_pinned_slot are
 * read-only and safe from any thread. zs_pinned_init / zs_pinned_free are not concurrent with
 * anything else on the same pool. zs_pinned_set_hooks is thread-safe and applies to pools
 * created afterwards (each pool remembers the hooks it was registered with). */
#ifndef ZS_PINNED_H
#define ZS_PINNED_H

#include <stddef.h>

typedef struct zs_pinned zs_pinned;

/* Allocates n_slots (>= 1) slots of slot_bytes (>= 1, rounded up to 4096) each. The region is
 * mapped MAP_ANONYMOUS|MAP_PRIVATE|MAP_POPULATE (pages are faulted in up front; set the
 * environment variable ZS_PINNED_NO_POPULATE=1 to skip that). If a registration hook is set
 * and fails, init fails with that hook's code (ZS_EDEVICE if the hook returned a positive value)
 * and its message. */
int zs_pinned_init(size_t slot_bytes, int n_slots, zs_pinned **out);
/* Unregisters (hook) and unmaps the region. NULL is a no-op. Slots still acquired are freed too. */
void zs_pinned_free(zs_pinned *p);

int zs_pinned_count(const zs_pinned *p);
size_t zs_pinned_slot_bytes(const zs_pinned *p);
/* Address of slot i (0 <= i < count), 4096-aligned; NULL if i is out of range. */
void *zs_pinned_slot(const zs_pinned *p, int i);

/* Takes a free slot and sets *slot to its index. wait=1 blocks until one is released;
 * wait=0 returns ZS_EBUSY at once when none is free. */
int zs_pinned_acquire(zs_pinned *p, int wait, int *slot);
/* Gives back a slot obtained by zs_pinned_acquire. Releasing a slot that is not held is a
 * broken invariant (abort). */
void zs_pinned_release(zs_pinned *p, int slot);
/* Number of slots currently free. */
int zs_pinned_free_count(zs_pinned *p);

/* Optional hooks set by a device backend (e.g. CUDA) so this file needs no CUDA headers.
 * reg returns 0 on success or a negative ZS_E* code (setting a zs_err message). */
typedef struct {
    int (*reg)(void *ptr, size_t bytes);
    void (*unreg)(void *ptr);
} zs_pinned_hooks;
/* Installs hooks for pools created from now on; NULL removes them. The struct is copied. */
void zs_pinned_set_hooks(const zs_pinned_hooks *h);

#endif
