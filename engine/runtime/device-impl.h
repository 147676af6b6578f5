/* device-impl.h — the inside of a zs_dev, shared by backend-cuda.c, gather-cuda.c, forward-cuda.c
 * and engine/train/backward-cuda.c only (it includes CUDA headers; nothing else may include it). */
#ifndef ZS_DEVICE_IMPL_H
#define ZS_DEVICE_IMPL_H

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <pthread.h>

#include "device.h"

typedef struct {
    void *p;
    size_t cap;
    int used;
} zs_dev_block;

/* events that order the queues around one full-bucket buffer */
typedef struct {
    const void *buf;
    cudaEvent_t copied;  /* copy queue: this rank's shard is in place */
    cudaEvent_t ready;   /* the whole bucket is in place */
    cudaEvent_t retired; /* compute queue: last use */
} zs_dev_bufev;

struct zs_dev {
    int id;
    cudaStream_t q[3];
    cublasHandle_t blas;
    pthread_mutex_t mu;          /* pool and event table */
    zs_dev_block *blocks;
    int n_blocks, cap_blocks;
    size_t pool_bytes;
    zs_dev_bufev *ev;
    int n_ev, cap_ev;
    /* prefill over block-format weights (zs_dev_gemm): x rounded to bf16, then the weights
     * dequantized to bf16 a chunk of rows at a time, for cuBLAS; used by the compute queue only,
     * under qmu from the first enqueue to the last (two threads' products must not interleave
     * in it); grown on demand, kept until zs_dev_free */
    pthread_mutex_t qmu;
    void *qs;
    size_t qs_cap;
};

/* The buffer's events (created on first use); NULL with a message on failure. */
zs_dev_bufev *zs_dev_buf_events(zs_dev *d, const void *buf);

#endif
