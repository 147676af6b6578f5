/* scratch.h — per-thread scratch buffers of the CPU kernels: one buffer per calling thread and
 * slot, 64-byte aligned, grown on demand and reused, freed when the thread exits. A kernel owns
 * its slot's buffer only until it returns. Thread-safe (each thread has its own). */
#ifndef ZS_SCRATCH_H
#define ZS_SCRATCH_H

#include <stddef.h>

enum {
    ZS_SCRATCH_Q8A = 0,  /* the quantized activations of zs_matmul_q8act */
    ZS_SCRATCH_PACK = 1, /* the packed panels and activation sums of its kernels */
    ZS_SCRATCH_MM = 2,   /* the f32/bf16/f16 kernels' accumulators between chunks of k */
    ZS_SCRATCH_SLOTS
};

/* at least n bytes (contents undefined), or NULL when they cannot be had */
void *zs_scratch_get(int slot, size_t n);

#endif
