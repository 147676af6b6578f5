// embed.cu — embedding lookup: token rows (plus learned position rows for GPT-2) as f32, from
// tables in f32/f16/bf16 or a ggml block format (dequantized as zs_to_f32 does: dequant.h).
#include "dequant.h"
#include "dtype.cuh"
#include "kernels.h"

// element i of row r of a table of rows of d elements in dtype dt
static __device__ __forceinline__ float ld_row(const void *tab, int dt, size_t r, int d, int i) {
    if (dt < ZS_DTYPE_ELEM_COUNT) return zs_ld(tab, dt, r * (size_t)d + i);
    return zs_dq_at(dt, (const uint8_t *)tab + r * zs_dq_row_bytes(dt, d), i);
}

__global__ static void embed_kernel(float *out, const void *tok, int tdt, const int32_t *ids,
                                    const void *pos_tab, int pdt, const int32_t *pos, int d) {
    int t = blockIdx.x;
    size_t row = (size_t)ids[t], prow = pos_tab ? (size_t)pos[t] : 0;
    float *o = out + (size_t)t * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float v = ld_row(tok, tdt, row, d, i);
        if (pos_tab) v += ld_row(pos_tab, pdt, prow, d, i);
        o[i] = v;
    }
}

static int table_ok(const char *what, int dt, int d) {
    if (dt < 0 || dt >= ZS_DTYPE_COUNT) return zs_cuda_refuse("embed: %s table dtype %d", what, dt);
    if (dt >= ZS_DTYPE_ELEM_COUNT && d % (32 * zs_dq_groups(dt)))
        return zs_cuda_refuse("embed: %s rows of %d are not whole blocks of %d", what, d, 32 * zs_dq_groups(dt));
    return 0;
}

extern "C" int zs_cuda_embed(float *out, const void *tok, int tdt, const int32_t *ids, const void *pos_tab,
                             int pdt, const int32_t *pos, int T, int d, void *stream) {
    if (T <= 0) return 0;
    if (table_ok("token", tdt, d) < 0 || (pos_tab && table_ok("position", pdt, d) < 0)) return -1;
    ZS_LAUNCH(embed_kernel, T, 256, 0, (cudaStream_t)stream, out, tok, tdt, ids, pos_tab, pdt, pos, d);
    return zs_launch_ok();
}
