// convert.cu — dtype conversion kernels (any of f32/f16/bf16 to any) and a read-bandwidth probe,
// launched through C entry points (kernels.h).
#include <stddef.h>

#include "dtype.cuh"
#include "kernels.h"

__global__ static void bf16_to_f32_kernel(const unsigned short *src, float *dst, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (; i < n; i += stride) dst[i] = __uint_as_float((unsigned)src[i] << 16);
}

extern "C" int zs_cuda_launch_bf16_to_f32(const unsigned short *src, float *dst, size_t n, void *stream) {
    if (n == 0) return 0;
    size_t blocks = (n + 255) / 256;
    if (blocks > 65535) blocks = 65535;
    ZS_LAUNCH(bf16_to_f32_kernel, (unsigned)blocks, 256, 0, (cudaStream_t)stream, src, dst, n);
    return zs_launch_ok();
}

__global__ static void convert_kernel(void *dst, int ddt, const void *src, int sdt, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        zs_st(dst, ddt, i, zs_ld(src, sdt, i));
}

extern "C" int zs_cuda_convert(void *dst, int ddt, const void *src, int sdt, size_t n, void *stream) {
    if (n == 0) return 0;
    ZS_LAUNCH(convert_kernel, zs_grid(n, 256), 256, 0, (cudaStream_t)stream, dst, ddt, src, sdt, n);
    return zs_launch_ok();
}

__global__ static void read_probe_kernel(const uint4 *src, size_t n, unsigned *sink) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    unsigned acc = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        uint4 v = __ldcs(src + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9e3779b9u) *sink = acc; // practically never: keeps the loads alive
}

extern "C" int zs_cuda_read_probe(const void *src, size_t bytes, unsigned *sink, void *stream) {
    size_t n = bytes / 16;
    if (n == 0) return 0;
    int dev = 0, sms = 132;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    ZS_LAUNCH(read_probe_kernel, (unsigned)sms * 8, 512, 0, (cudaStream_t)stream, (const uint4 *)src, n, sink);
    return zs_launch_ok();
}
