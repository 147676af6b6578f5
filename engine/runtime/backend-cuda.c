/* backend-cuda.c — the CUDA backend's device queries and a kernel round trip (built only when
 * nvcc was found). The binary links the CUDA runtime statically, so it starts on machines
 * without a driver; cudaGetDeviceCount then fails and the engine runs on the CPU. */
#include <cuda_runtime.h>
#include <pthread.h>

#include "backend.h"
#include "common.h"

/* kernels/cuda/convert.cu, launch.cu (kernels.h) */
int zs_cuda_launch_bf16_to_f32(const unsigned short *src, float *dst, size_t n, void *stream);
const char *zs_cuda_take_error(void);

static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;
static int cuda_count;

static void cuda_probe(void) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        zs_log_info("no CUDA device usable (%s); running on the CPU", cudaGetErrorString(e));
        n = 0;
    }
    cuda_count = n;
}

int zs_backend_cuda_built(void) { return 1; }

int zs_backend_cuda_devices(void) {
    pthread_once(&cuda_once, cuda_probe);
    return cuda_count;
}

int zs_backend_cuda_describe(int i, char *buf, size_t cap) {
    if (i < 0 || i >= zs_backend_cuda_devices())
        return zs_err(ZS_ENOTFOUND, "CUDA device %d not present (%d visible)", i, zs_backend_cuda_devices());
    struct cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, i);
    if (e != cudaSuccess) return zs_err(ZS_EDEVICE, "CUDA device %d: %s", i, cudaGetErrorString(e));
    snprintf(buf, cap, "%s, %.1f GiB, sm_%d%d", p.name, (double)p.totalGlobalMem / (1 << 30), p.major, p.minor);
    return 0;
}

int zs_backend_cuda_bf16_to_f32(int dev, const unsigned short *src, float *dst, size_t n) {
    if (dev < 0 || dev >= zs_backend_cuda_devices())
        return zs_err(ZS_ENOTFOUND, "CUDA device %d not present", dev);
    void *ds = NULL, *dd = NULL;
    cudaError_t e = cudaSetDevice(dev);
    if (e == cudaSuccess) e = cudaMalloc(&ds, n * 2);
    if (e == cudaSuccess) e = cudaMalloc(&dd, n * 4);
    if (e == cudaSuccess) e = cudaMemcpy(ds, src, n * 2, cudaMemcpyHostToDevice);
    const char *lerr = NULL; /* the launcher read (and cleared) the CUDA error: take its copy */
    if (e == cudaSuccess && zs_cuda_launch_bf16_to_f32(ds, dd, n, NULL) != 0) {
        lerr = zs_cuda_take_error();
        if (!lerr) lerr = "launch failed (no CUDA error recorded)";
    }
    if (e == cudaSuccess && !lerr) e = cudaMemcpy(dst, dd, n * 4, cudaMemcpyDeviceToHost);
    cudaFree(ds);
    cudaFree(dd);
    if (lerr) return zs_err(ZS_EDEVICE, "CUDA device %d: bf16 -> f32 kernel: %s", dev, lerr);
    if (e != cudaSuccess) return zs_err(ZS_EDEVICE, "CUDA device %d: %s", dev, cudaGetErrorString(e));
    return 0;
}

/* ---- the device context of a rank (device.h) ---- */

#include <string.h>

#include "device-impl.h"
#include "kernels/cuda/kernels.h"
#include "pinned.h"

/* The reason is read once: a launcher (kernels.h) has already taken the CUDA error with
 * cudaGetLastError and kept its text (zs_cuda_take_error); a failed runtime call left it in
 * cudaGetLastError. Both are taken (cleared). */
int zs_dev_error(const char *what) {
    const char *launch = zs_cuda_take_error();
    cudaError_t e = cudaGetLastError();
    if (launch && e != cudaSuccess)
        return zs_err(ZS_EDEVICE, "%s: %s (and then %s)", what, launch, cudaGetErrorString(e));
    if (launch) return zs_err(ZS_EDEVICE, "%s: %s", what, launch);
    if (e != cudaSuccess) return zs_err(ZS_EDEVICE, "%s: %s", what, cudaGetErrorString(e));
    return zs_err(ZS_EDEVICE, "%s: failed (no CUDA error recorded)", what);
}

static int cuda_err(cudaError_t e, const char *what, int dev) {
    return zs_err(ZS_EDEVICE, "CUDA device %d: %s: %s", dev, what, cudaGetErrorString(e));
}

static int blas_err(cublasStatus_t s, const char *what, int dev) {
    return zs_err(ZS_EDEVICE, "CUDA device %d: %s: cuBLAS status %d", dev, what, (int)s);
}

int zs_dev_open(int cuda_device, zs_dev **out) {
    if (cuda_device < 0 || cuda_device >= zs_backend_cuda_devices())
        return zs_err(ZS_ENOTFOUND, "CUDA device %d not present (%d visible)", cuda_device, zs_backend_cuda_devices());
    zs_dev *d = calloc(1, sizeof *d);
    if (!d) return zs_err(ZS_ENOMEM, "out of memory");
    d->id = cuda_device;
    pthread_mutex_init(&d->mu, NULL);
    pthread_mutex_init(&d->qmu, NULL);
    cudaError_t e = cudaSetDevice(cuda_device);
    int rc = 0;
    if (e != cudaSuccess) rc = cuda_err(e, "cudaSetDevice", cuda_device);
    for (int i = 0; rc == 0 && i < 3; i++) {
        e = cudaStreamCreateWithFlags(&d->q[i], cudaStreamNonBlocking);
        if (e != cudaSuccess) { d->q[i] = NULL; rc = cuda_err(e, "cudaStreamCreate", cuda_device); }
    }
    if (rc == 0) {
        cublasStatus_t s = cublasCreate(&d->blas);
        if (s != CUBLAS_STATUS_SUCCESS) { d->blas = NULL; rc = blas_err(s, "cublasCreate", cuda_device); }
    }
    if (rc == 0) {
        cublasStatus_t s = cublasSetStream(d->blas, d->q[ZS_Q_COMPUTE]);
        if (s != CUBLAS_STATUS_SUCCESS) rc = blas_err(s, "cublasSetStream", cuda_device);
    }
    if (rc < 0) { zs_dev_free(d); return rc; }
    *out = d;
    return 0;
}

void zs_dev_free(zs_dev *d) {
    if (!d) return;
    cudaSetDevice(d->id);
    for (int i = 0; i < 3; i++)
        if (d->q[i]) cudaStreamSynchronize(d->q[i]);
    if (d->blas) cublasDestroy(d->blas);
    for (int i = 0; i < 3; i++)
        if (d->q[i]) cudaStreamDestroy(d->q[i]);
    for (int i = 0; i < d->n_ev; i++) {
        cudaEventDestroy(d->ev[i].copied);
        cudaEventDestroy(d->ev[i].ready);
        cudaEventDestroy(d->ev[i].retired);
    }
    for (int i = 0; i < d->n_blocks; i++) cudaFree(d->blocks[i].p);
    free(d->blocks);
    free(d->ev);
    pthread_mutex_destroy(&d->mu);
    pthread_mutex_destroy(&d->qmu);
    free(d);
}

int zs_dev_id(const zs_dev *d) { return d->id; }
void *zs_dev_stream(zs_dev *d, int queue) { return d->q[queue]; }

int zs_dev_set_current(zs_dev *d) {
    cudaError_t e = cudaSetDevice(d->id);
    return e == cudaSuccess ? 0 : cuda_err(e, "cudaSetDevice", d->id);
}

/* The pool: blocks are cudaMalloc'ed once and reused by best fit (a free block is reused when it
 * is at most twice the request, so small requests do not pin large blocks). When cudaMalloc
 * fails, free blocks go back to the device and it is tried once more. */
void *zs_dev_alloc(zs_dev *d, size_t bytes) {
    if (bytes == 0) bytes = 256;
    bytes = ZS_ALIGN_UP(bytes, (size_t)256);
    pthread_mutex_lock(&d->mu);
    int best = -1;
    for (int i = 0; i < d->n_blocks; i++) {
        zs_dev_block *b = &d->blocks[i];
        if (!b->used && b->cap >= bytes && b->cap / 2 <= bytes && (best < 0 || b->cap < d->blocks[best].cap)) best = i;
    }
    if (best >= 0) {
        d->blocks[best].used = 1;
        void *p = d->blocks[best].p;
        pthread_mutex_unlock(&d->mu);
        return p;
    }
    if (d->n_blocks == d->cap_blocks) {
        int nc = d->cap_blocks ? 2 * d->cap_blocks : 64;
        zs_dev_block *nb = realloc(d->blocks, (size_t)nc * sizeof *nb);
        if (!nb) {
            pthread_mutex_unlock(&d->mu);
            zs_err(ZS_ENOMEM, "out of memory");
            return NULL;
        }
        d->blocks = nb;
        d->cap_blocks = nc;
    }
    cudaSetDevice(d->id);
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        cudaGetLastError();
        int k = 0;
        for (int i = 0; i < d->n_blocks; i++) {
            if (d->blocks[i].used) { d->blocks[k++] = d->blocks[i]; continue; }
            cudaFree(d->blocks[i].p);
            d->pool_bytes -= d->blocks[i].cap;
        }
        d->n_blocks = k;
        e = cudaMalloc(&p, bytes);
    }
    if (e != cudaSuccess) {
        cudaGetLastError();
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        pthread_mutex_unlock(&d->mu);
        zs_err(ZS_ENOMEM, "CUDA device %d: cannot allocate %zu MiB of device memory (%zu MiB free of %zu MiB): %s",
               d->id, bytes >> 20, fr >> 20, tot >> 20, cudaGetErrorString(e));
        return NULL;
    }
    d->blocks[d->n_blocks++] = (zs_dev_block){p, bytes, 1};
    d->pool_bytes += bytes;
    pthread_mutex_unlock(&d->mu);
    return p;
}

void zs_dev_release(zs_dev *d, void *p) {
    if (!p) return;
    pthread_mutex_lock(&d->mu);
    int found = 0;
    for (int i = 0; i < d->n_blocks; i++)
        if (d->blocks[i].p == p) {
            ZS_ASSERT(d->blocks[i].used);
            d->blocks[i].used = 0;
            found = 1;
            break;
        }
    pthread_mutex_unlock(&d->mu);
    ZS_ASSERT(found); /* not from this pool: a caller bug */
}

size_t zs_dev_pool_bytes(zs_dev *d) {
    pthread_mutex_lock(&d->mu);
    size_t n = d->pool_bytes;
    pthread_mutex_unlock(&d->mu);
    return n;
}

int zs_dev_upload(zs_dev *d, void *dst, const void *src, size_t bytes) {
    ZS_CHECK(zs_dev_set_current(d));
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, d->q[ZS_Q_COPY]);
    if (e == cudaSuccess) e = cudaStreamSynchronize(d->q[ZS_Q_COPY]);
    return e == cudaSuccess ? 0 : cuda_err(e, "upload", d->id);
}

int zs_dev_download(zs_dev *d, void *dst, const void *src, size_t bytes) {
    ZS_CHECK(zs_dev_set_current(d));
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, d->q[ZS_Q_COPY]);
    if (e == cudaSuccess) e = cudaStreamSynchronize(d->q[ZS_Q_COPY]);
    return e == cudaSuccess ? 0 : cuda_err(e, "download", d->id);
}

int zs_dev_sync(zs_dev *d) {
    ZS_CHECK(zs_dev_set_current(d));
    for (int i = 0; i < 3; i++) {
        cudaError_t e = cudaStreamSynchronize(d->q[i]);
        if (e != cudaSuccess) return cuda_err(e, "cudaStreamSynchronize", d->id);
    }
    return 0;
}

zs_dev_bufev *zs_dev_buf_events(zs_dev *d, const void *buf) {
    pthread_mutex_lock(&d->mu);
    for (int i = 0; i < d->n_ev; i++)
        if (d->ev[i].buf == buf) {
            zs_dev_bufev *r = &d->ev[i];
            pthread_mutex_unlock(&d->mu);
            return r;
        }
    /* the table only grows (entries stay valid): reserve generously up front */
    if (d->n_ev == d->cap_ev) {
        if (d->cap_ev) {
            /* entries handed out must not move: a full table is an error */
            pthread_mutex_unlock(&d->mu);
            zs_err(ZS_ENOMEM, "CUDA device %d: more than %d full-bucket buffers", d->id, d->cap_ev);
            return NULL;
        }
        d->ev = calloc(1024, sizeof *d->ev);
        if (!d->ev) {
            pthread_mutex_unlock(&d->mu);
            zs_err(ZS_ENOMEM, "out of memory");
            return NULL;
        }
        d->cap_ev = 1024;
    }
    zs_dev_bufev *r = &d->ev[d->n_ev];
    cudaSetDevice(d->id);
    cudaError_t e = cudaEventCreateWithFlags(&r->copied, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&r->ready, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&r->retired, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        pthread_mutex_unlock(&d->mu);
        cuda_err(e, "cudaEventCreate", d->id);
        return NULL;
    }
    r->buf = buf;
    d->n_ev++;
    pthread_mutex_unlock(&d->mu);
    return r;
}

/* Bytes of bf16 weights dequantized per cuBLAS call of a block-format prefill: large enough that
 * each GEMM is efficient, small enough that an LM head of 150k rows needs no GiB of scratch. */
#define QCHUNK_BYTES ((size_t)64 << 20)

/* The prefill scratch (device-impl.h) holds at least need bytes; called under qmu. A smaller one
 * is given back to the pool only once the compute queue is done with it. */
static int qscratch(zs_dev *d, size_t need) {
    if (d->qs_cap >= need) return 0;
    if (d->qs) {
        cudaError_t e = cudaStreamSynchronize(d->q[ZS_Q_COMPUTE]);
        if (e != cudaSuccess) return cuda_err(e, "cudaStreamSynchronize (growing the prefill scratch)", d->id);
        zs_dev_release(d, d->qs);
        d->qs = NULL;
        d->qs_cap = 0;
    }
    if (!(d->qs = zs_dev_alloc(d, need)))
        return zs_err_prefix(ZS_ENOMEM, "CUDA device %d: scratch of quantized prefill", d->id);
    d->qs_cap = need;
    return 0;
}

/* y = x W^T + beta y over block-format W (x f32): the fused kernel for a few tokens (the bits
 * of the CPU product), else x and W rounded to bf16 and multiplied by cuBLAS (fp32 accumulation),
 * W dequantized QCHUNK_BYTES at a time into the scratch. */
static int gemm_quant(zs_dev *d, float *y, const float *x, int T, int in, const void *W, zs_dtype wdt, int out,
                      float beta) {
    cudaStream_t s = d->q[ZS_Q_COMPUTE];
    int blk = zs_dtype_block(wdt);
    if (in <= 0 || in % blk)
        return zs_err(ZS_EINVAL, "CUDA device %d: %s matrix with rows of %d weights (not whole blocks of %d)", d->id,
                      zs_dtype_name(wdt), in, blk);
    if (T <= ZS_CUDA_QGEMV_MAX_T)
        return zs_cuda_qgemv(y, out, x, T, in, W, wdt, out, beta, s) == 0 ? 0 : zs_dev_error("quantized matmul kernel");
    size_t row16 = (size_t)in * 2, xb = ZS_ALIGN_UP((size_t)T * row16, (size_t)256);
    int chunk = (int)ZS_MIN((size_t)out, ZS_MAX(QCHUNK_BYTES / row16, (size_t)1));
    const float alpha = 1.0f;
    pthread_mutex_lock(&d->qmu);
    int rc = qscratch(d, xb + (size_t)chunk * row16);
    if (rc == 0 && zs_cuda_convert(d->qs, ZS_BF16, x, ZS_F32, (size_t)T * in, s) != 0)
        rc = zs_dev_error("quantized prefill: activations to bf16");
    void *wb = (char *)d->qs + xb;
    for (int j0 = 0; rc == 0 && j0 < out; j0 += chunk) {
        int rows = ZS_MIN(chunk, out - j0);
        const char *wj = (const char *)W + zs_dtype_bytes(wdt, (size_t)j0 * (size_t)in);
        if (zs_cuda_dequant(wb, ZS_BF16, wj, wdt, rows, in, s) != 0) {
            rc = zs_dev_error("quantized prefill: weights to bf16");
            break;
        }
        /* rows j0 .. j0+rows of W give columns j0 .. of row-major y: y + j0, row stride out */
        cublasStatus_t st = cublasGemmEx(d->blas, CUBLAS_OP_T, CUBLAS_OP_N, rows, T, in, &alpha, wb, CUDA_R_16BF, in,
                                         d->qs, CUDA_R_16BF, in, &beta, y + j0, CUDA_R_32F, out, CUBLAS_COMPUTE_32F,
                                         CUBLAS_GEMM_DEFAULT);
        if (st != CUBLAS_STATUS_SUCCESS) rc = blas_err(st, "cublasGemmEx (quantized prefill)", d->id);
    }
    pthread_mutex_unlock(&d->qmu);
    return rc;
}

int zs_dev_gemm(zs_dev *d, float *y, const void *x, int T, int in, const void *W, zs_dtype wdt, int out,
                float beta) {
    if (T <= 0 || out <= 0) return 0;
    if (zs_dtype_is_quant(wdt)) return gemm_quant(d, y, x, T, in, W, wdt, out, beta);
    cudaDataType_t t = wdt == ZS_F32 ? CUDA_R_32F : wdt == ZS_F16 ? CUDA_R_16F : CUDA_R_16BF;
    const float alpha = 1.0f;
    /* row-major y[T,out] = x[T,in] W[out,in]^T is column-major y'[out,T] = W'^T x' */
    cublasStatus_t s = cublasGemmEx(d->blas, CUBLAS_OP_T, CUBLAS_OP_N, out, T, in, &alpha, W, t, in, x, t, in,
                                    &beta, y, CUDA_R_32F, out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    return s == CUBLAS_STATUS_SUCCESS ? 0 : blas_err(s, "cublasGemmEx", d->id);
}

/* ---- pinned host registration ---- */

static int pin_reg(void *ptr, size_t bytes) {
    cudaError_t e = cudaHostRegister(ptr, bytes, cudaHostRegisterPortable);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return zs_err(ZS_EDEVICE, "cudaHostRegister of %zu MiB: %s", bytes >> 20, cudaGetErrorString(e));
    }
    return 0;
}

static void pin_unreg(void *ptr) {
    if (cudaHostUnregister(ptr) != cudaSuccess) cudaGetLastError();
}

void zs_dev_install_pinned_hooks(void) {
    static const zs_pinned_hooks h = {pin_reg, pin_unreg};
    zs_pinned_set_hooks(&h);
}

/* ---- probes for benchmarks ---- */

static int cmp_dbl(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median_of(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_dbl);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Times fn(arg) on stream s with events; seconds. */
static int time_on(zs_dev *d, cudaStream_t s, int (*fn)(zs_dev *, void *), void *arg, double *sec) {
    cudaEvent_t a, b;
    if (cudaEventCreate(&a) != cudaSuccess) return zs_dev_error("cudaEventCreate");
    if (cudaEventCreate(&b) != cudaSuccess) { cudaEventDestroy(a); return zs_dev_error("cudaEventCreate"); }
    cudaError_t e = cudaEventRecord(a, s);
    int rc = e == cudaSuccess ? fn(d, arg) : cuda_err(e, "cudaEventRecord (probe start)", d->id);
    if (rc == 0 && (e = cudaEventRecord(b, s)) != cudaSuccess) rc = cuda_err(e, "cudaEventRecord (probe end)", d->id);
    if (rc == 0 && (e = cudaEventSynchronize(b)) != cudaSuccess) rc = cuda_err(e, "probe", d->id);
    float ms = 0;
    if (rc == 0 && (e = cudaEventElapsedTime(&ms, a, b)) != cudaSuccess) rc = cuda_err(e, "cudaEventElapsedTime", d->id);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    *sec = ms / 1e3;
    return rc;
}

typedef struct { void *dst; const void *src; size_t n; unsigned *sink; int gemm_n; void *A, *B; float *C; } probe_arg;

static int h2d_fn(zs_dev *d, void *a) {
    probe_arg *p = a;
    cudaError_t e = cudaMemcpyAsync(p->dst, p->src, p->n, cudaMemcpyHostToDevice, d->q[ZS_Q_COPY]);
    return e == cudaSuccess ? 0 : cuda_err(e, "cudaMemcpyAsync", d->id);
}

int zs_dev_h2d_gbps(zs_dev *d, size_t bytes, int runs, double *gbps) {
    ZS_CHECK(zs_dev_set_current(d));
    if (runs <= 0) runs = 5;
    void *h = NULL, *dv = zs_dev_alloc(d, bytes);
    if (!dv) return ZS_ENOMEM;
    cudaError_t e = cudaMallocHost(&h, bytes);
    if (e != cudaSuccess) { zs_dev_release(d, dv); return cuda_err(e, "cudaMallocHost", d->id); }
    memset(h, 1, bytes);
    double v[64];
    if (runs > 64) runs = 64;
    probe_arg a = {dv, h, bytes, NULL, 0, NULL, NULL, NULL};
    int rc = 0;
    for (int r = 0; r <= runs && rc == 0; r++) {
        double t;
        rc = time_on(d, d->q[ZS_Q_COPY], h2d_fn, &a, &t);
        if (r > 0) v[r - 1] = (double)bytes / t / 1e9;
    }
    if (rc == 0) *gbps = median_of(v, runs);
    cudaFreeHost(h);
    zs_dev_release(d, dv);
    return rc;
}

static int read_fn(zs_dev *d, void *a) {
    probe_arg *p = a;
    return zs_cuda_read_probe(p->src, p->n, p->sink, d->q[ZS_Q_COMPUTE]) == 0 ? 0 : zs_dev_error("read probe");
}

int zs_dev_read_gbps(zs_dev *d, size_t bytes, int runs, double *gbps) {
    ZS_CHECK(zs_dev_set_current(d));
    if (runs <= 0) runs = 5;
    if (runs > 64) runs = 64;
    bytes &= ~(size_t)15;
    void *dv = zs_dev_alloc(d, bytes + 256);
    if (!dv) return ZS_ENOMEM;
    cudaMemsetAsync(dv, 1, bytes + 256, d->q[ZS_Q_COMPUTE]);
    probe_arg a = {NULL, dv, bytes, (unsigned *)((char *)dv + bytes), 0, NULL, NULL, NULL};
    double v[64];
    int rc = 0;
    for (int r = 0; r <= runs && rc == 0; r++) {
        double t;
        rc = time_on(d, d->q[ZS_Q_COMPUTE], read_fn, &a, &t);
        if (r > 0) v[r - 1] = (double)bytes / t / 1e9;
    }
    if (rc == 0) *gbps = median_of(v, runs);
    zs_dev_release(d, dv);
    return rc;
}

static int gemm_fn(zs_dev *d, void *a) {
    probe_arg *p = a;
    return zs_dev_gemm(d, p->C, p->B, p->gemm_n, p->gemm_n, p->A, ZS_BF16, p->gemm_n, 0.0f);
}

int zs_dev_gemm_tflops(zs_dev *d, int n, int runs, double *tflops) {
    ZS_CHECK(zs_dev_set_current(d));
    if (runs <= 0) runs = 5;
    if (runs > 64) runs = 64;
    size_t nn = (size_t)n * n;
    void *A = zs_dev_alloc(d, nn * 2), *B = zs_dev_alloc(d, nn * 2);
    float *C = zs_dev_alloc(d, nn * 4);
    int rc = 0;
    if (!A || !B || !C) rc = ZS_ENOMEM;
    if (rc == 0) {
        /* small random-ish values: bf16 bit patterns of numbers in [-1, 1) */
        cudaMemsetAsync(A, 0x3c, nn * 2, d->q[ZS_Q_COMPUTE]);
        cudaMemsetAsync(B, 0x3c, nn * 2, d->q[ZS_Q_COMPUTE]);
    }
    probe_arg a = {NULL, NULL, 0, NULL, n, A, B, C};
    double v[64];
    for (int r = 0; r <= runs && rc == 0; r++) {
        double t;
        rc = time_on(d, d->q[ZS_Q_COMPUTE], gemm_fn, &a, &t);
        if (r > 0) v[r - 1] = 2.0 * (double)n * (double)n * (double)n / t / 1e12;
    }
    if (rc == 0) *tflops = median_of(v, runs);
    cudaStreamSynchronize(d->q[ZS_Q_COMPUTE]);
    zs_dev_release(d, A);
    zs_dev_release(d, B);
    zs_dev_release(d, C);
    return rc;
}
