/* backend-cuda.c — the CUDA backend's device queries and a kernel round trip (built only when
 * nvcc was found). The binary links the CUDA runtime statically, so it starts on machines
 * without a driver; cudaGetDeviceCount then fails and the engine runs on the CPU. */
#include <cuda_runtime.h>
#include <pthread.h>

#include "backend.h"
#include "common.h"

/* kernels/cuda/convert.cu */
int zs_cuda_launch_bf16_to_f32(const unsigned short *src, float *dst, size_t n, void *stream);

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
    if (e == cudaSuccess && zs_cuda_launch_bf16_to_f32(ds, dd, n, NULL) != 0) e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaMemcpy(dst, dd, n * 4, cudaMemcpyDeviceToHost);
    cudaFree(ds);
    cudaFree(dd);
    if (e != cudaSuccess) return zs_err(ZS_EDEVICE, "CUDA device %d: %s", dev, cudaGetErrorString(e));
    return 0;
}
