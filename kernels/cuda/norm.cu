// norm.cu — RMSNorm (with Gemma's weight offset: x/rms * (off + w)) and LayerNorm over rows of f32
// activations (one block per row, fp32 reductions), writing f32, f16 or bf16 (the input dtype of
// the next matrix product). The per-head norm of q and k (qk_norm) is RMSNorm over rows of
// head_dim, in place.
#include "dtype.cuh"
#include "kernels.h"

// off 0: x * s * w[i], the original arithmetic (also for a weight of -0); else x * s * (off + w[i])
__global__ static void rmsnorm_kernel(void *y, int ydt, const float *x, const float *w, float off,
                                      const int32_t *rows, int d, float eps) {
    __shared__ float sh[33];
    int r = blockIdx.x;
    const float *xr = x + (size_t)(rows ? rows[r] : r) * d;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) ss += xr[i] * xr[i];
    ss = zs_block_sum(ss, sh);
    float s = 1.0f / sqrtf(ss / (float)d + eps);
    size_t o = (size_t)r * d;
    // each thread writes only the elements it read (y may alias x): in place is safe
    if (off == 0.0f)
        for (int i = threadIdx.x; i < d; i += blockDim.x) zs_st(y, ydt, o + i, xr[i] * s * w[i]);
    else
        for (int i = threadIdx.x; i < d; i += blockDim.x) zs_st(y, ydt, o + i, xr[i] * s * (off + w[i]));
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

extern "C" int zs_cuda_rmsnorm_off(void *y, int ydt, const float *x, const float *w, float off,
                                   const int32_t *rows, int R, int d, float eps, void *stream) {
    if (R <= 0) return 0;
    ZS_LAUNCH(rmsnorm_kernel, R, norm_threads(d), 0, (cudaStream_t)stream, y, ydt, x, w, off, rows, d, eps);
    return zs_launch_ok();
}

extern "C" int zs_cuda_rmsnorm(void *y, int ydt, const float *x, const float *w, const int32_t *rows, int R,
                               int d, float eps, void *stream) {
    return zs_cuda_rmsnorm_off(y, ydt, x, w, 0.0f, rows, R, d, eps, stream);
}

extern "C" int zs_cuda_layernorm(void *y, int ydt, const float *x, const float *w, const float *b,
                                 const int32_t *rows, int R, int d, float eps, void *stream) {
    if (R <= 0) return 0;
    ZS_LAUNCH(layernorm_kernel, R, norm_threads(d), 0, (cudaStream_t)stream, y, ydt, x, w, b, rows, d, eps);
    return zs_launch_ok();
}
