// attention.cu — the paged KV cache on the device (f32 blocks of 16 positions, the host
// zs_kvcache layout) and causal attention over it for prefill and decode alike, with GQA.
//
// One block per (query token, kv head, subgroup of up to GT query heads sharing that kv head):
// its warps split the positions 0..pos[t] of the token's sequence, each keeping an online
// softmax (running max, sum and weighted V) for its GT heads; K and V rows are read once per
// warp for all GT heads. The warps' partial results are merged in shared memory at the end.
#include "dtype.cuh"
#include "kernels.h"

#define ZS_KV_BLK 16
#define ATT_WARPS 4

__global__ static void kv_store_kernel(float *pool, const float *k, int ldk, const float *v, int ldv,
                                       const int64_t *off, int kvd) {
    int t = blockIdx.x;
    float *kd = pool + off[t], *vd = kd + (size_t)ZS_KV_BLK * kvd;
    const float *ks = k + (size_t)t * ldk, *vs = v + (size_t)t * ldv;
    for (int i = threadIdx.x; i < kvd; i += blockDim.x) {
        kd[i] = ks[i];
        vd[i] = vs[i];
    }
}

extern "C" int zs_cuda_kv_store(float *pool, const float *k, int ldk, const float *v, int ldv,
                                const int64_t *off, int T, int kvd, void *stream) {
    if (T <= 0) return 0;
    kv_store_kernel<<<T, 256, 0, (cudaStream_t)stream>>>(pool, k, ldk, v, ldv, off, kvd);
    return zs_launch_ok();
}

template <int R, int GT>
__global__ static void __launch_bounds__(ATT_WARPS * 32)
attn_kernel(void *out, int odt, const float *q, int ldq, const float *pool, const int32_t *tables,
            const int32_t *tab, const int32_t *pos, int nh, int nkv, int hd, float scale, int group,
            int nsub) {
    __shared__ float s_acc[ATT_WARPS][GT][R * 32];
    __shared__ float s_m[ATT_WARPS][GT], s_l[ATT_WARPS][GT];
    int t = blockIdx.y, kh = blockIdx.x / nsub, sub = blockIdx.x % nsub;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int kvd = nkv * hd, p = pos[t];
    const int32_t *bt = tables + tab[t];
    float qr[GT][R], acc[GT][R], m[GT], l[GT];
#pragma unroll
    for (int g = 0; g < GT; g++) {
        int hg = sub * GT + g;
        int h = kh * group + hg;
#pragma unroll
        for (int r = 0; r < R; r++) {
            int d = lane + 32 * r;
            qr[g][r] = (hg < group && d < hd) ? q[(size_t)t * ldq + (size_t)h * hd + d] * scale : 0.0f;
            acc[g][r] = 0.0f;
        }
        m[g] = -INFINITY;
        l[g] = 0.0f;
    }
    for (int j = warp; j <= p; j += ATT_WARPS) {
        const float *kb = pool + ((size_t)bt[j / ZS_KV_BLK] * 2 * ZS_KV_BLK + (j % ZS_KV_BLK)) * kvd + (size_t)kh * hd;
        const float *vb = kb + (size_t)ZS_KV_BLK * kvd;
        float kr[R], vr[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            int d = lane + 32 * r;
            kr[r] = d < hd ? kb[d] : 0.0f;
            vr[r] = d < hd ? vb[d] : 0.0f;
        }
#pragma unroll
        for (int g = 0; g < GT; g++) {
            float s = 0.0f;
#pragma unroll
            for (int r = 0; r < R; r++) s += qr[g][r] * kr[r];
            s = zs_warp_sum(s);
            float mn = fmaxf(m[g], s);
            float corr = expf(m[g] - mn), e = expf(s - mn);
            l[g] = l[g] * corr + e;
#pragma unroll
            for (int r = 0; r < R; r++) acc[g][r] = acc[g][r] * corr + e * vr[r];
            m[g] = mn;
        }
    }
#pragma unroll
    for (int g = 0; g < GT; g++) {
#pragma unroll
        for (int r = 0; r < R; r++) s_acc[warp][g][lane + 32 * r] = acc[g][r];
        if (lane == 0) {
            s_m[warp][g] = m[g];
            s_l[warp][g] = l[g];
        }
    }
    __syncthreads();
    for (int k = threadIdx.x; k < GT * hd; k += blockDim.x) {
        int g = k / hd, d = k % hd, hg = sub * GT + g;
        if (hg >= group) continue;
        float M = -INFINITY;
        for (int w = 0; w < ATT_WARPS; w++) M = fmaxf(M, s_m[w][g]);
        float L = 0.0f, O = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++) {
            float f = s_l[w][g] > 0.0f ? expf(s_m[w][g] - M) : 0.0f;
            L += s_l[w][g] * f;
            O += s_acc[w][g][d] * f;
        }
        int h = kh * group + hg;
        zs_st(out, odt, (size_t)t * nh * hd + (size_t)h * hd + d, O / L);
    }
}

template <int R, int GT>
static void attn_launch(dim3 grid, cudaStream_t s, void *out, int odt, const float *q, int ldq,
                        const float *pool, const int32_t *tables, const int32_t *tab, const int32_t *pos,
                        int nh, int nkv, int hd, float scale, int group, int nsub) {
    attn_kernel<R, GT><<<grid, ATT_WARPS * 32, 0, s>>>(out, odt, q, ldq, pool, tables, tab, pos, nh, nkv, hd,
                                                       scale, group, nsub);
}

template <int GT>
static int attn_dispatch_r(dim3 grid, cudaStream_t s, void *out, int odt, const float *q, int ldq,
                           const float *pool, const int32_t *tables, const int32_t *tab, const int32_t *pos,
                           int nh, int nkv, int hd, float scale, int group, int nsub) {
    if (hd <= 32) attn_launch<1, GT>(grid, s, out, odt, q, ldq, pool, tables, tab, pos, nh, nkv, hd, scale, group, nsub);
    else if (hd <= 64) attn_launch<2, GT>(grid, s, out, odt, q, ldq, pool, tables, tab, pos, nh, nkv, hd, scale, group, nsub);
    else if (hd <= 128) attn_launch<4, GT>(grid, s, out, odt, q, ldq, pool, tables, tab, pos, nh, nkv, hd, scale, group, nsub);
    else if (hd <= 256) attn_launch<8, GT>(grid, s, out, odt, q, ldq, pool, tables, tab, pos, nh, nkv, hd, scale, group, nsub);
    else return -1;
    return zs_launch_ok();
}

extern "C" int zs_cuda_attention(void *out, int odt, const float *q, int ldq, const float *pool,
                                 const int32_t *tables, const int32_t *tab, const int32_t *pos, int T,
                                 int n_heads, int n_kv_heads, int hd, float scale, void *stream) {
    if (T <= 0) return 0;
    if (n_kv_heads <= 0 || n_heads % n_kv_heads || hd <= 0 || hd > 256) return -1;
    int group = n_heads / n_kv_heads;
    int gt = group >= 4 ? 4 : group; // 1, 2 or 4 heads per block; a larger group is split
    int nsub = (group + gt - 1) / gt;
    dim3 grid((unsigned)(n_kv_heads * nsub), (unsigned)T);
    cudaStream_t s = (cudaStream_t)stream;
    if (gt == 1) return attn_dispatch_r<1>(grid, s, out, odt, q, ldq, pool, tables, tab, pos, n_heads, n_kv_heads, hd, scale, group, nsub);
    if (gt == 2) return attn_dispatch_r<2>(grid, s, out, odt, q, ldq, pool, tables, tab, pos, n_heads, n_kv_heads, hd, scale, group, nsub);
    return attn_dispatch_r<4>(grid, s, out, odt, q, ldq, pool, tables, tab, pos, n_heads, n_kv_heads, hd, scale, group, nsub);
}
