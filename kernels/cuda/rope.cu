// rope.cu — rotary position embedding in the Hugging Face rotate_half convention, with the same
// float32 arithmetic as the CPU op. The frequencies inv_freq[i] = 1 / theta^(2i/d) come from a
// table made on the host (zs_cuda_rope_inv_freq, with the C library's powf, as the CPU op computes
// them): the device powf differs from glibc's by an ulp for some exponents, and at theta = 500000
// that is an angle error of ~1e-4 radians at position 4000. The angles use the accurate device
// cosf/sinf (full range reduction). zs_cuda_rope_bwd (backward.cu) reads the same table.
#include <math.h>

#include "dtype.cuh"
#include "kernels.h"

extern "C" void zs_cuda_rope_inv_freq(float *inv_freq, int head_dim, float theta) {
    // the formula of zs_op_rope (kernels/cpu/ops.c) and zs_op_rope_bwd (ops-backward.c)
    for (int i = 0; i < head_dim / 2; i++) inv_freq[i] = 1.0f / powf(theta, (float)(2 * i) / (float)head_dim);
}

__global__ static void rope_kernel(float *x, int T, int ld, int nh, int hd, const int32_t *pos,
                                   const float *inv_freq) {
    int half = hd / 2;
    size_t n = (size_t)T * nh * half;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < n; k += stride) {
        int i = (int)(k % half);
        size_t th = k / half;
        int h = (int)(th % nh), t = (int)(th / nh);
        float ang = (float)pos[t] * inv_freq[i];
        float c = cosf(ang), s = sinf(ang);
        float *v = x + (size_t)t * ld + (size_t)h * hd;
        float a = v[i], b = v[i + half];
        v[i] = a * c - b * s;
        v[i + half] = b * c + a * s;
    }
}

extern "C" int zs_cuda_rope(float *x, int T, int ld, int n_heads, int head_dim, const int32_t *pos,
                            const float *inv_freq, void *stream) {
    size_t n = (size_t)T * n_heads * (head_dim / 2);
    if (n == 0) return 0;
    if (!inv_freq) return zs_cuda_refuse("rope: no inv_freq table");
    rope_kernel<<<zs_grid(n, 256), 256, 0, (cudaStream_t)stream>>>(x, T, ld, n_heads, head_dim, pos, inv_freq);
    return zs_launch_ok();
}
