// act.cu — element-wise activations (tanh-GELU, SwiGLU, GeGLU), soft-capping and scaling,
// residual/bias add, row softmax and row argmax (greedy sampling on the device).
#include <math.h>

#include "dtype.cuh"
#include "kernels.h"

// gelu_tanh(v), the CPU op's formula (gelu1 in kernels/cpu/ops.c); shared by GELU and GeGLU
static __device__ __forceinline__ float gelu_tanh(float v) {
    const float k = 0.7978845608028654f;
    return 0.5f * v * (1.0f + tanhf(k * (v + 0.044715f * v * v * v)));
}

__global__ static void gelu_kernel(void *out, int odt, const float *x, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) zs_st(out, odt, i, gelu_tanh(x[i]));
}

__global__ static void geglu_kernel(void *out, int odt, const float *g, const float *u, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        zs_st(out, odt, i, gelu_tanh(g[i]) * u[i]);
}

// the division, not a product with 1/cap, as zs_op_softcap (transformers: x / cap, tanh, * cap)
__global__ static void softcap_kernel(float *x, size_t n, float cap) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) x[i] = cap * tanhf(x[i] / cap);
}

__global__ static void scale_kernel(float *x, size_t n, float s) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) x[i] *= s;
}

__global__ static void swiglu_kernel(void *out, int odt, const float *g, const float *u, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float v = g[i];
        zs_st(out, odt, i, v / (1.0f + expf(-v)) * u[i]);
    }
}

__global__ static void add_kernel(float *y, const float *x, const float *b, int d, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float v = y[i];
        if (x) v += x[i];
        if (b) v += b[i % d];
        y[i] = v;
    }
}

__global__ static void softmax_kernel(float *x, int n) {
    __shared__ float sh[33];
    float *r = x + (size_t)blockIdx.x * n;
    float m = -INFINITY;
    for (int i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, r[i]);
    m = zs_block_max(m, sh);
    float s = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float e = expf(r[i] - m);
        r[i] = e;
        s += e;
    }
    s = zs_block_sum(s, sh);
    float inv = 1.0f / s;
    for (int i = threadIdx.x; i < n; i += blockDim.x) r[i] *= inv;
}

__global__ static void argmax_kernel(int32_t *idx, const float *x, int n) {
    __shared__ float sv[32];
    __shared__ int si[32];
    const float *r = x + (size_t)blockIdx.x * n;
    float bv = -INFINITY;
    int bi = n; // sentinel: larger than any index
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        if (r[i] > bv || (r[i] == bv && i < bi)) { bv = r[i]; bi = i; }
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
    }
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane == 0) { sv[w] = bv; si[w] = bi; }
    __syncthreads();
    if (w == 0) {
        bv = lane < nw ? sv[lane] : -INFINITY;
        bi = lane < nw ? si[lane] : n;
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
        }
        if (lane == 0) idx[blockIdx.x] = bi < n ? bi : 0; // an all-NaN row gives 0
    }
}

extern "C" int zs_cuda_gelu(void *out, int odt, const float *x, size_t n, void *stream) {
    if (n == 0) return 0;
    ZS_LAUNCH(gelu_kernel, zs_grid(n, 256), 256, 0, (cudaStream_t)stream, out, odt, x, n);
    return zs_launch_ok();
}

extern "C" int zs_cuda_swiglu(void *out, int odt, const float *gate, const float *up, size_t n, void *stream) {
    if (n == 0) return 0;
    ZS_LAUNCH(swiglu_kernel, zs_grid(n, 256), 256, 0, (cudaStream_t)stream, out, odt, gate, up, n);
    return zs_launch_ok();
}

extern "C" int zs_cuda_geglu(void *out, int odt, const float *gate, const float *up, size_t n, void *stream) {
    if (n == 0) return 0;
    ZS_LAUNCH(geglu_kernel, zs_grid(n, 256), 256, 0, (cudaStream_t)stream, out, odt, gate, up, n);
    return zs_launch_ok();
}

extern "C" int zs_cuda_softcap(float *x, size_t n, float cap, void *stream) {
    if (!(cap > 0.0f) || isinf(cap)) return zs_cuda_refuse("softcap: cap %g (a positive finite number)", (double)cap);
    if (n == 0) return 0;
    ZS_LAUNCH(softcap_kernel, zs_grid(n, 256), 256, 0, (cudaStream_t)stream, x, n, cap);
    return zs_launch_ok();
}

extern "C" int zs_cuda_scale(float *x, size_t n, float s, void *stream) {
    if (n == 0) return 0;
    ZS_LAUNCH(scale_kernel, zs_grid(n, 256), 256, 0, (cudaStream_t)stream, x, n, s);
    return zs_launch_ok();
}

extern "C" int zs_cuda_add(float *y, const float *x, const float *bias, int T, int d, void *stream) {
    size_t n = (size_t)T * d;
    if (n == 0 || (!x && !bias)) return 0;
    ZS_LAUNCH(add_kernel, zs_grid(n, 256), 256, 0, (cudaStream_t)stream, y, x, bias, d, n);
    return zs_launch_ok();
}

extern "C" int zs_cuda_softmax(float *x, int R, int n, void *stream) {
    if (R <= 0 || n <= 0) return 0;
    ZS_LAUNCH(softmax_kernel, R, 256, 0, (cudaStream_t)stream, x, n);
    return zs_launch_ok();
}

extern "C" int zs_cuda_argmax(int32_t *idx, const float *x, int R, int n, void *stream) {
    if (R <= 0 || n <= 0) return 0;
    ZS_LAUNCH(argmax_kernel, R, 256, 0, (cudaStream_t)stream, idx, x, n);
    return zs_launch_ok();
}
