/* device.h — a rank's CUDA device (DESIGN.md §1, §3) without CUDA types: one device, three
 * queues (compute, copy, comm) ordered only by events, a cuBLAS handle on the compute queue, and
 * a caching pool of device buffers (cudaMalloc only when the pool has no free block that fits,
 * so after the first pass nothing is allocated on the hot path). Also the device forward pass
 * (forward-cuda.c, the same computation as forward.c with activations, weights and the paged KV
 * cache in device memory) and the device side of the gather coordinator (gather-cuda.c).
 *
 * Built with CUDA: backend-cuda.c, gather-cuda.c, forward-cuda.c. Without CUDA (device.c) every
 * call fails with ZS_EUNSUPPORTED, so callers need no #ifdef.
 *
 * Ownership: a zs_dev owns its streams, events, handle and pool; zs_dev_free releases them
 * (buffers still allocated from the pool go with it). Thread-safety: a zs_dev is used by its
 * rank thread (compute) and its gather prefetch thread (copy, comm); the pool, the event table
 * and every call here are thread-safe; each call makes the device current on the calling
 * thread. */
#ifndef ZS_DEVICE_H
#define ZS_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "gather.h"
#include "kvcache.h"
#include "model.h"
#include "tensor.h"

/* Device selection (zs_engine_opts.device): AUTO is CUDA when a device is visible. */
enum { ZS_DEVICE_AUTO = 0, ZS_DEVICE_CPU = 1, ZS_DEVICE_CUDA = 2 };
/* "cpu" | "cuda" | "auto" -> ZS_DEVICE_*; ZS_EINVAL naming the value otherwise. */
int zs_device_parse(const char *s, int *out);
const char *zs_device_name(int device);
/* Resolves AUTO (and the ZS_DEVICE environment variable, which overrides AUTO) to CPU or CUDA.
 * CUDA requested without a device is ZS_EDEVICE with a message; AUTO without one is CPU (the
 * backend says once, at info level, why no device is usable). */
int zs_device_resolve(int requested, int *out);

enum { ZS_Q_COMPUTE = 0, ZS_Q_COPY = 1, ZS_Q_COMM = 2 };

typedef struct zs_dev zs_dev;

int  zs_dev_open(int cuda_device, zs_dev **out);
void zs_dev_free(zs_dev *d);
int  zs_dev_id(const zs_dev *d);
void *zs_dev_stream(zs_dev *d, int queue);          /* cudaStream_t */
int  zs_dev_set_current(zs_dev *d);
/* Device buffer from the pool (256-byte aligned); NULL with a message when the device is out
 * of memory. zs_dev_release returns it to the pool: the caller guarantees that no queued work
 * still uses it (zs_dev_sync, or an event it waited for). */
void *zs_dev_alloc(zs_dev *d, size_t bytes);
void zs_dev_release(zs_dev *d, void *p);
size_t zs_dev_pool_bytes(zs_dev *d);                /* bytes the pool holds from the device */
/* Synchronous copies (the copy queue) and a wait for all three queues. */
int  zs_dev_upload(zs_dev *d, void *dst, const void *src, size_t bytes);
int  zs_dev_download(zs_dev *d, void *dst, const void *src, size_t bytes);
int  zs_dev_sync(zs_dev *d);
/* ZS_EDEVICE with the message of the last CUDA error of this thread (clearing it), prefixed. */
int  zs_dev_error(const char *what);

/* y[T,out] (f32) = x[T,in] . W[out,in]^T + beta * y, on the compute queue; x and W in wdt
 * (f32: fp32 math, no TF32; f16/bf16: tensor cores with fp32 accumulation). A block format wdt
 * (ZS_Q8_0 .. ZS_Q2_K, the bytes as stored; in whole blocks) takes x in f32: for T <= 8
 * (ZS_CUDA_QGEMV_MAX_T) a fused kernel dequantizes each weight in registers and gives the bits of
 * zs_op_matmul, whatever T; for larger T, x and the dequantized weights are rounded to bf16 and
 * multiplied by cuBLAS with fp32 accumulation (the weights a chunk of rows at a time, into a
 * scratch the device keeps; not bit-equal to the CPU, and not across the two paths). */
int  zs_dev_gemm(zs_dev *d, float *y, const void *x, int T, int in, const void *W, zs_dtype wdt,
                 int out, float beta);

/* Registers the pinned pool's regions with CUDA (cudaHostRegister, portable) for pools created
 * from now on (zs_pinned_set_hooks); idempotent. */
void zs_dev_install_pinned_hooks(void);

/* The gather coordinator's device operations for this device (gather.h). */
void zs_dev_gather_ops(zs_dev *d, zs_gather_dev *ops);

/* The forward pass on the device. The weight source must hand out device pointers (the gather
 * coordinator with device ops does); the resident parts of every bucket are copied to the
 * device at creation. kv is the host cache of this rank, used for its block tables only (open
 * it with zs_kv_init_ex(..., host_data = 0)); the K/V data live in device pools of the same
 * block layout and element type (zs_kv_dtype), allocated here. Logits rows are copied to host memory (logits) at the end of
 * each run: sampling runs on the host. */
typedef struct zs_forward_cuda zs_forward_cuda;
int  zs_forward_cuda_new(const zs_model *m, int max_tokens, zs_dev *d, const zs_kvcache *kv,
                         zs_forward_cuda **out);
void zs_forward_cuda_free(zs_forward_cuda *f);
int  zs_forward_cuda_run(zs_forward_cuda *f, zs_weight_source *src, zs_kvcache *kv,
                         const zs_batch *b, float *logits);

/* Probes for benchmarks (each blocks): pinned host -> device cudaMemcpyAsync GB/s (median of
 * runs), device memory read GB/s, and the dense bf16 tensor-core rate of cublasGemmEx on
 * n x n x n (TFLOP/s). */
int  zs_dev_h2d_gbps(zs_dev *d, size_t bytes, int runs, double *gbps);
int  zs_dev_read_gbps(zs_dev *d, size_t bytes, int runs, double *gbps);
int  zs_dev_gemm_tflops(zs_dev *d, int n, int runs, double *tflops);

#endif
