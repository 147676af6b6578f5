// embed.cu — embedding lookup: token rows (plus learned position rows for GPT-2) as f32.
#include "dtype.cuh"
#include "kernels.h"

__global__ static void embed_kernel(float *out, const void *tok, int tdt, const int32_t *ids,
                                    const void *pos_tab, int pdt, const int32_t *pos, int d) {
    int t = blockIdx.x;
    size_t row = (size_t)ids[t] * (size_t)d, prow = pos_tab ? (size_t)pos[t] * (size_t)d : 0;
    float *o = out + (size_t)t * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float v = zs_ld(tok, tdt, row + i);
        if (pos_tab) v += zs_ld(pos_tab, pdt, prow + i);
        o[i] = v;
    }
}

extern "C" int zs_cuda_embed(float *out, const void *tok, int tdt, const int32_t *ids, const void *pos_tab,
                             int pdt, const int32_t *pos, int T, int d, void *stream) {
    if (T <= 0) return 0;
    embed_kernel<<<T, 256, 0, (cudaStream_t)stream>>>(out, tok, tdt, ids, pos_tab, pdt, pos, d);
    return zs_launch_ok();
}
