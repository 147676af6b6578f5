// rope.cu — rotary position embedding in the Hugging Face rotate_half convention, with the same
// float32 arithmetic as the CPU ops (zs_op_rope, zs_op_rope_freq). The frequencies come from a
// table made on the host: the default inv_freq[i] = 1 / theta^(2i/d) by zs_cuda_rope_inv_freq
// (with the C library's powf, as the CPU op computes them: the device powf differs from glibc's
// by an ulp for some exponents, and at theta = 500000 that is an angle error of ~1e-4 radians at
// position 4000), or the rope_scaling ones by zs_rope_freqs (engine/model/rope.h), either one
// table for every token or one row per token (dynamic NTK, LongRoPE). cos and sin are multiplied
// by the attention factor (YaRN, LongRoPE; 1 is exact). The angles use the accurate device
// cosf/sinf (full range reduction). The backward (backward.cu) reads the same tables.
#include <math.h>

#include "dtype.cuh"
#include "kernels.h"

extern "C" void zs_cuda_rope_inv_freq(float *inv_freq, int head_dim, float theta) {
    // the formula of zs_op_rope (kernels/cpu/ops.c) and zs_op_rope_bwd (ops-backward.c)
    for (int i = 0; i < head_dim / 2; i++) inv_freq[i] = 1.0f / powf(theta, (float)(2 * i) / (float)head_dim);
}

// fst: the frequency row stride per token (0: one shared table, half: a row per token)
__global__ static void rope_kernel(float *x, int T, int ld, int nh, int hd, const int32_t *pos,
                                   const float *inv_freq, int fst, float af) {
    int half = hd / 2;
    size_t n = (size_t)T * nh * half;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < n; k += stride) {
        int i = (int)(k % half);
        size_t th = k / half;
        int h = (int)(th % nh), t = (int)(th / nh);
        float ang = (float)pos[t] * inv_freq[(size_t)t * fst + i];
        float c = cosf(ang) * af, s = sinf(ang) * af; // af 1: c and s unchanged
        float *v = x + (size_t)t * ld + (size_t)h * hd;
        float a = v[i], b = v[i + half];
        v[i] = a * c - b * s;
        v[i + half] = b * c + a * s;
    }
}

extern "C" int zs_cuda_rope_freq(float *x, int T, int ld, int n_heads, int head_dim, const int32_t *pos,
                                 const float *inv_freq, int per_token, float attn_factor, void *stream) {
    size_t n = (size_t)T * n_heads * (head_dim / 2);
    if (n == 0) return 0;
    if (!inv_freq) return zs_cuda_refuse("rope: no inv_freq table");
    ZS_LAUNCH(rope_kernel, zs_grid(n, 256), 256, 0, (cudaStream_t)stream, x, T, ld, n_heads, head_dim, pos,
              inv_freq, per_token ? head_dim / 2 : 0, attn_factor);
    return zs_launch_ok();
}

extern "C" int zs_cuda_rope(float *x, int T, int ld, int n_heads, int head_dim, const int32_t *pos,
                            const float *inv_freq, void *stream) {
    return zs_cuda_rope_freq(x, T, ld, n_heads, head_dim, pos, inv_freq, 0, 1.0f, stream);
}
