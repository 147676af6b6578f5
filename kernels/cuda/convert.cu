// convert.cu — dtype conversion kernels (bf16 -> f32), launched through a C entry point.
#include <cuda_runtime.h>
#include <stddef.h>

__global__ static void bf16_to_f32_kernel(const unsigned short *src, float *dst, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (; i < n; i += stride) dst[i] = __uint_as_float((unsigned)src[i] << 16);
}

extern "C" int zs_cuda_launch_bf16_to_f32(const unsigned short *src, float *dst, size_t n, void *stream) {
    if (n == 0) return 0;
    size_t blocks = (n + 255) / 256;
    if (blocks > 65535) blocks = 65535;
    bf16_to_f32_kernel<<<(unsigned)blocks, 256, 0, (cudaStream_t)stream>>>(src, dst, n);
    return cudaGetLastError() == cudaSuccess ? 0 : -1;
}
