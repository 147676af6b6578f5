// norm.cu — RMSNorm and LayerNorm over rows of f32 activations (one block per row, fp32
// reductions), writing f32, f16 or bf16 (the input dtype of the next matrix product).
#include "dtype.cuh"
#include "kernels.h"

__global__ static void rmsnorm_kernel(void *y, int ydt, const float *x, const float *w,
                                      const int32_t *rows, int d, float eps) {
    __shared__ float sh[33];
    int r = blockIdx.x;
    const float *xr = x + (size_t)(rows ? rows[r] : r) * d;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) ss += xr[i] * xr[i];
    ss = zs_block_sum(ss, sh);
    float s = 1.0f / sqrtf(ss / (float)d + eps);
    size_t o = (size_t)r * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) zs_st(y, ydt, o + i, xr[i] * s * w[i]);
}

__global__ static void layernorm_kernel(void *y, int ydt, const float *x, const float *w,
                                        const float *b, const int32_t *rows, int d, float eps) {
    __shared__ float sh[33];
    int r = blockIdx.x;
    const float *xr = x + (size_t)(rows ? rows[r] : r) * d;
    float m = 0.0f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) m += xr[i];
    m = zs_block_sum(m, sh) / (float)d;
    float v = 0.0f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float c = xr[i] - m;
        v += c * c;
    }
    v = zs_block_sum(v, sh) / (float)d;
    float s = 1.0f / sqrtf(v + eps);
    size_t o = (size_t)r * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x)
        zs_st(y, ydt, o + i, (xr[i] - m) * s * w[i] + (b ? b[i] : 0.0f));
}

static unsigned norm_threads(int d) { return d >= 1024 ? 1024 : d >= 256 ? 256 : 64; }

extern "C" int zs_cuda_rmsnorm(void *y, int ydt, const float *x, const float *w, const int32_t *rows, int R,
                               int d, float eps, void *stream) {
    if (R <= 0) return 0;
    rmsnorm_kernel<<<R, norm_threads(d), 0, (cudaStream_t)stream>>>(y, ydt, x, w, rows, d, eps);
    return zs_launch_ok();
}

extern "C" int zs_cuda_layernorm(void *y, int ydt, const float *x, const float *w, const float *b,
                                 const int32_t *rows, int R, int d, float eps, void *stream) {
    if (R <= 0) return 0;
    layernorm_kernel<<<R, norm_threads(d), 0, (cudaStream_t)stream>>>(y, ydt, x, w, b, rows, d, eps);
    return zs_launch_ok();
}
