// rope.cu — rotary position embedding in the Hugging Face rotate_half convention, with the same
// float32 arithmetic as the CPU op (inv_freq = 1 / theta^(2i/d), accurate powf/cosf/sinf).
#include "dtype.cuh"
#include "kernels.h"

__global__ static void rope_kernel(float *x, int T, int ld, int nh, int hd, const int32_t *pos, float theta) {
    int half = hd / 2;
    size_t n = (size_t)T * nh * half;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < n; k += stride) {
        int i = (int)(k % half);
        size_t th = k / half;
        int h = (int)(th % nh), t = (int)(th / nh);
        float inv_freq = 1.0f / powf(theta, (float)(2 * i) / (float)hd);
        float ang = (float)pos[t] * inv_freq;
        float c = cosf(ang), s = sinf(ang);
        float *v = x + (size_t)t * ld + (size_t)h * hd;
        float a = v[i], b = v[i + half];
        v[i] = a * c - b * s;
        v[i + half] = b * c + a * s;
    }
}

extern "C" int zs_cuda_rope(float *x, int T, int ld, int n_heads, int head_dim, const int32_t *pos,
                            float theta, void *stream) {
    size_t n = (size_t)T * n_heads * (head_dim / 2);
    if (n == 0) return 0;
    rope_kernel<<<zs_grid(n, 256), 256, 0, (cudaStream_t)stream>>>(x, T, ld, n_heads, head_dim, pos, theta);
    return zs_launch_ok();
}
