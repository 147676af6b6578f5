// attention.cu — the paged KV cache on the device (blocks of 16 positions, the host zs_kvcache
// layout, in f32, f16 or bf16: kv_store rounds to nearest even, the kernels widen each value as
// they load it and compute in f32 alike) and causal attention over it for prefill and decode
// alike, with GQA. Two kernels compute the same thing (kernels.h: zs_cuda_attention_impl):
//
// simple — one block per (query token, kv head, subgroup of up to GT query heads sharing that kv
// head): its warps split the positions 0..pos[t] of the token's sequence, each keeping an online
// softmax (running max, sum and weighted V) for its GT heads; K and V rows are read from global
// memory once per warp for all GT heads. The warps' partial results are merged in shared memory
// at the end. Good for decode (one token of a sequence: nothing to share); every token reads its
// whole prefix again, so a prefill of n tokens reads ~n^2/2 K/V rows.
//
// tiled — flash-attention style: one block per (tile of bq consecutive batch tokens, kv head,
// subgroup of gq query heads): its TL_R = 32 query rows (bq tokens x gq heads) are split over 4
// warps (8 rows each). The tile's tokens are taken a segment at a time (a run of tokens with the
// same block table, i.e. one sequence); for each segment, the K/V rows of its positions
// 0..max pos are staged in shared memory TL_BK = 32 positions at a time and used by every query
// row of the segment: lane j scores key j against the warp's 8 rows (K stored XOR-swizzled so
// that the lanes' column reads hit distinct banks), each row keeps an online softmax in fp32
// (running max m, sum l, and the unnormalised output o: D/32 columns per lane), and P.V
// broadcasts each key's weight with a shuffle. Causal: row (t, h) counts key j only if
// j <= pos[t], exactly the CPU op's mask.
//
// Model-family parameters (zs_cuda_attention_ex, zs_cuda_att_params): the scale multiplies q as
// it is loaded (as before); a soft-cap (Gemma 2) maps each scaled score s to cap * tanhf(s / cap)
// before the softmax; a sliding window (Mistral, Gemma, Phi-3) limits row (t, h) to keys
// pos[t]-window+1 .. pos[t]: simple starts its key loop there, tiled starts a segment's tiles at
// the lowest first key of its rows (nothing before it is loaded, nor its block-table entry) and
// masks each row to its own window (a template flag: the kernel without a window is unchanged).
//
// Token trees (zs_cuda_attention_tree; speculative decoding): the simple kernel's key loop runs over
// positions j0..pos[t] as before, and key j is read at cache position j below the token's tree base
// and at its path's slot from there (path[poff[t] + j - base[t]]): the same keys in the same order
// as the token decoded alone over its path, so the same bits. The tiled kernel has no tree mask (it
// shares a sequence's keys between the rows of a tile): every token of a sequence with tree rows
// takes simple, in every mode; the other sequences' tokens go as without a tree.
// kv_copy applies the tree's KV moves.
//
// Which kernel runs (zs_cuda_attention): ZS_CUDA_ATTN=simple -> simple for every token,
// ZS_CUDA_ATTN=tiled -> tiled for every token, otherwise (auto) tiled for the tokens that share
// their sequence with a neighbouring batch token (prefill, chunks) and simple for the others
// (decode), two launches writing disjoint rows.
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.cuh"
#include "kernels.h"

#define ZS_KV_BLK 16
#define ATT_WARPS 4

__global__ static void kv_store_kernel(void *pool, int kdt, const float *k, int ldk, const float *v, int ldv,
                                       const int64_t *off, int kvd) {
    int t = blockIdx.x;
    size_t kd = (size_t)off[t], vd = kd + (size_t)ZS_KV_BLK * kvd;
    const float *ks = k + (size_t)t * ldk, *vs = v + (size_t)t * ldv;
    for (int i = threadIdx.x; i < kvd; i += blockDim.x) {
        zs_st(pool, kdt, kd + i, ks[i]);
        zs_st(pool, kdt, vd + i, vs[i]);
    }
}

static bool kv_dt_ok(int dt) { return dt == ZS_DT_F32 || dt == ZS_DT_F16 || dt == ZS_DT_BF16; }

extern "C" int zs_cuda_kv_store_dt(void *pool, int kvdt, const float *k, int ldk, const float *v, int ldv,
                                   const int64_t *off, int T, int kvd, void *stream) {
    if (!kv_dt_ok(kvdt)) return zs_cuda_refuse("kv store: cache element type %d (f32, f16 or bf16)", kvdt);
    if (T <= 0) return 0;
    ZS_LAUNCH(kv_store_kernel, T, 256, 0, (cudaStream_t)stream, pool, kvdt, k, ldk, v, ldv, off, kvd);
    return zs_launch_ok();
}

extern "C" int zs_cuda_kv_store(float *pool, const float *k, int ldk, const float *v, int ldv,
                                const int64_t *off, int T, int kvd, void *stream) {
    return zs_cuda_kv_store_dt(pool, ZS_DT_F32, k, ldk, v, ldv, off, T, kvd, stream);
}

// The KV moves of a verified tree (zs_kv_copy's, in order: a later move may read an earlier one's
// destination): one block, a barrier between moves. Bits as stored (2- or 4-byte elements).
__global__ static void kv_copy_kernel(void *pool, int esz, const int64_t *from, const int64_t *to, int n, int kvd) {
    for (int m = 0; m < n; m++) {
        size_t f = (size_t)from[m], d = (size_t)to[m];
        for (int i = threadIdx.x; i < 2 * kvd; i += blockDim.x) {
            size_t o = i < kvd ? (size_t)i : (size_t)ZS_KV_BLK * kvd + (size_t)(i - kvd); // K row, then V row
            if (esz == 4) ((uint32_t *)pool)[d + o] = ((const uint32_t *)pool)[f + o];
            else ((uint16_t *)pool)[d + o] = ((const uint16_t *)pool)[f + o];
        }
        __syncthreads();
    }
}

extern "C" int zs_cuda_kv_copy(void *pool, int kvdt, const int64_t *from, const int64_t *to, int n, int kvd,
                               void *stream) {
    if (!kv_dt_ok(kvdt)) return zs_cuda_refuse("kv copy: cache element type %d (f32, f16 or bf16)", kvdt);
    if (n <= 0) return 0;
    ZS_LAUNCH(kv_copy_kernel, 1, 256, 0, (cudaStream_t)stream, pool, kvdt == ZS_DT_F32 ? 4 : 2, from, to, n, kvd);
    return zs_launch_ok();
}

// Token t shares its block table (its sequence) with a neighbouring token of the batch: the
// tokens of the tiled kernel in auto mode; the others are the simple kernel's.
// Token t is of a sequence with tree rows in the call (zs_cuda_att_tree_plan: base >= 0): the
// simple kernel's, whatever the mode; rows of other sequences go as before.
static __device__ __forceinline__ bool att_tree_row(const int32_t *tbase, int t) { return tbase && tbase[t] >= 0; }

static __device__ __forceinline__ bool att_in_run(const int32_t *tab, int t, int T) {
    int b = tab[t];
    return (t > 0 && tab[t - 1] == b) || (t + 1 < T && tab[t + 1] == b);
}

// The scores' parameters resolved (zs_cuda_att_params): scale, cap (0: none), window (0: none).
struct att_args {
    float scale, cap;
    int window;
    const zs_cuda_att_tree *tree; // a token tree (simple kernel only), or NULL
};

// ---- simple ----

template <int R, int GT>
__global__ static void __launch_bounds__(ATT_WARPS * 32)
attn_kernel(void *out, int odt, const float *q, int ldq, const void *pool, int kdt, const int32_t *tables,
            const int32_t *tab, const int32_t *pos, int T, int nh, int nkv, int hd, float scale, float cap,
            int window, int group, int nsub, int only_single, const int32_t *tbase, const int32_t *tpoff,
            const int32_t *tpath) {
    __shared__ float s_acc[ATT_WARPS][GT][R * 32];
    __shared__ float s_m[ATT_WARPS][GT], s_l[ATT_WARPS][GT];
    // the token in x (up to 2^31 - 1 blocks), (kv head, subgroup) in y
    int t = blockIdx.x, kh = blockIdx.y / nsub, sub = blockIdx.y % nsub;
    // only_single 1 (auto): the tiled kernel's tokens are left to it; 2: the tree's tokens only
    // (block-uniform)
    if (only_single == 1 && att_in_run(tab, t, T) && !att_tree_row(tbase, t)) return;
    if (only_single == 2 && !att_tree_row(tbase, t)) return;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int kvd = nkv * hd, p = pos[t];
    const int32_t *bt = tables + tab[t];
    // a token tree: keys from tb on are the slots of the token's path (tp[0] its root's); else none
    const int tb = att_tree_row(tbase, t) ? tbase[t] : INT_MAX;
    const int32_t *tp = tbase ? tpath + tpoff[t] : NULL;
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
    // the first key: 0, or the window's (warps with no key keep l = 0 and drop out of the merge)
    const int j0 = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
    for (int j = j0 + warp; j <= p; j += ATT_WARPS) {
        // key j in the order of positions; a tree token's path keys live at their slots
        const int js = j < tb ? j : tp[j - tb];
        size_t kb = ((size_t)bt[js / ZS_KV_BLK] * 2 * ZS_KV_BLK + (js % ZS_KV_BLK)) * kvd + (size_t)kh * hd;
        size_t vb = kb + (size_t)ZS_KV_BLK * kvd;
        float kr[R], vr[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            int d = lane + 32 * r;
            kr[r] = d < hd ? zs_ld(pool, kdt, kb + d) : 0.0f;
            vr[r] = d < hd ? zs_ld(pool, kdt, vb + d) : 0.0f;
        }
#pragma unroll
        for (int g = 0; g < GT; g++) {
            float s = 0.0f;
#pragma unroll
            for (int r = 0; r < R; r++) s += qr[g][r] * kr[r];
            s = zs_warp_sum(s);
            if (cap > 0.0f) s = cap * tanhf(s / cap);
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
                        const void *pool, int kdt, const int32_t *tables, const int32_t *tab, const int32_t *pos,
                        int T, int nh, int nkv, int hd, const att_args &a, int group, int nsub, int only_single) {
    const zs_cuda_att_tree *tr = a.tree;
    ZS_LAUNCH((attn_kernel<R, GT>), grid, ATT_WARPS * 32, 0, s, out, odt, q, ldq, pool, kdt, tables, tab, pos, T,
              nh, nkv, hd, a.scale, a.cap, a.window, group, nsub, only_single, tr ? tr->base : NULL,
              tr ? tr->poff : NULL, tr ? tr->path : NULL);
}

template <int GT>
static int attn_dispatch_r(dim3 grid, cudaStream_t s, void *out, int odt, const float *q, int ldq,
                           const void *pool, int kdt, const int32_t *tables, const int32_t *tab, const int32_t *pos,
                           int T, int nh, int nkv, int hd, const att_args &a, int group, int nsub, int only_single) {
    if (hd <= 32) attn_launch<1, GT>(grid, s, out, odt, q, ldq, pool, kdt, tables, tab, pos, T, nh, nkv, hd, a, group, nsub, only_single);
    else if (hd <= 64) attn_launch<2, GT>(grid, s, out, odt, q, ldq, pool, kdt, tables, tab, pos, T, nh, nkv, hd, a, group, nsub, only_single);
    else if (hd <= 128) attn_launch<4, GT>(grid, s, out, odt, q, ldq, pool, kdt, tables, tab, pos, T, nh, nkv, hd, a, group, nsub, only_single);
    else if (hd <= 256) attn_launch<8, GT>(grid, s, out, odt, q, ldq, pool, kdt, tables, tab, pos, T, nh, nkv, hd, a, group, nsub, only_single);
    else return zs_cuda_refuse("attention: head_dim %d (at most 256)", hd);
    return zs_launch_ok();
}

static int attn_simple(void *out, int odt, const float *q, int ldq, const void *pool, int kdt,
                       const int32_t *tables, const int32_t *tab, const int32_t *pos, int T, int n_heads,
                       int n_kv_heads, int hd, const att_args &a, int only_single, cudaStream_t s) {
    int group = n_heads / n_kv_heads;
    int gt = group >= 4 ? 4 : group; // 1, 2 or 4 heads per block; a larger group is split
    int nsub = (group + gt - 1) / gt;
    long long gy = (long long)n_kv_heads * nsub;
    if (gy > 65535)
        return zs_cuda_refuse("attention (simple): %d kv heads x %d head subgroups = %lld blocks in grid y (limit 65535)",
                              n_kv_heads, nsub, gy);
    dim3 grid((unsigned)T, (unsigned)gy); // T <= INT_MAX < 2^31: within the grid's x limit
    if (gt == 1) return attn_dispatch_r<1>(grid, s, out, odt, q, ldq, pool, kdt, tables, tab, pos, T, n_heads, n_kv_heads, hd, a, group, nsub, only_single);
    if (gt == 2) return attn_dispatch_r<2>(grid, s, out, odt, q, ldq, pool, kdt, tables, tab, pos, T, n_heads, n_kv_heads, hd, a, group, nsub, only_single);
    return attn_dispatch_r<4>(grid, s, out, odt, q, ldq, pool, kdt, tables, tab, pos, T, n_heads, n_kv_heads, hd, a, group, nsub, only_single);
}

// ---- tiled ----

#define TL_WARPS 4
#define TL_ROWS 8                  // query rows per warp
#define TL_R (TL_WARPS * TL_ROWS)  // query rows per block
#define TL_BK 32                   // positions per shared-memory K/V tile: one per lane

// dynamic shared memory of the tiled kernel for padded head dim D: Q rows, K tile, V tile
static size_t tl_smem_bytes(int D) { return (size_t)(TL_R * D + 2 * TL_BK * D) * sizeof(float); }

// D: the head dim padded to 32, 64, 128 or 256 (columns hd..D-1 are zeros). Row r of the block
// (warp r / TL_ROWS) is token t0 + r / gq and query head kh*group + sub*gq + r % gq.
// WIN: a sliding window of `window` keys (else window is ignored: the original kernel).
template <int D, bool WIN>
__global__ static void __launch_bounds__(TL_WARPS * 32)
attn_tiled_kernel(void *out, int odt, const float *q, int ldq, const void *pool, int kdt, const int32_t *tables,
                  const int32_t *tab, const int32_t *pos, int T, int nh, int nkv, int hd, float scale,
                  float cap, int window, int group, int gq, int nsub, int bq, int only_runs, const int32_t *tbase) {
    constexpr int C = D / 32; // output columns per lane
    ZS_EXTERN_SHARED(float4, tl_smem4); // float4: 16-byte alignment for the Q reads
    float *sQ = (float *)tl_smem4;       // [TL_R][D] query rows, scaled; each warp owns its 8 rows
    float *sK = sQ + TL_R * D;           // [TL_BK][D], column d of key jj at jj*D + (d ^ jj)
    float *sV = sK + TL_BK * D;          // [TL_BK][D]
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int kh = blockIdx.y / nsub, sub = blockIdx.y % nsub;
    const int t0 = blockIdx.x * bq, t1 = min(t0 + bq, T);
    const int kvd = nkv * hd;
    auto row_head = [&](int i) { return kh * group + sub * gq + (warp * TL_ROWS + i) % gq; };

    // this warp's rows: token (-1 when idle) and position; softmax state and output. The head of
    // row i is row_head(i) (recomputed where needed: fewer live registers)
    int rt[TL_ROWS], rp[TL_ROWS];
    float m[TL_ROWS], l[TL_ROWS], o[TL_ROWS][C];
#pragma unroll
    for (int i = 0; i < TL_ROWS; i++) {
        int r = warp * TL_ROWS + i, tq = r / gq, hg = sub * gq + r % gq, t = t0 + tq;
        bool ok = tq < bq && t < t1 && hg < group && (!only_runs || att_in_run(tab, t, T)) && !att_tree_row(tbase, t);
        rt[i] = ok ? t : -1;
        rp[i] = ok ? pos[t] : -1;
        m[i] = -INFINITY;
        l[i] = 0.0f;
#pragma unroll
        for (int c = 0; c < C; c++) o[i][c] = 0.0f;
    }

    for (int s0 = t0; s0 < t1;) {
        // the segment s0..s1-1: tokens with the block table tab[s0]; every thread computes the
        // same bounds and key range from global memory (block-uniform)
        const int tb = tab[s0];
        int s1 = s0 + 1;
        while (s1 < t1 && tab[s1] == tb) s1++;
        // keys kvlo .. kvlen-1: up to the last row's position, from 0 or (window) the lowest first
        // key of the segment's rows
        int kvlen = 0, kvlo = INT_MAX;
        for (int t = s0; t < s1; t++)
            if ((!only_runs || att_in_run(tab, t, T)) && !att_tree_row(tbase, t)) {
                kvlen = max(kvlen, pos[t] + 1);
                if (WIN) kvlo = min(kvlo, max(0, pos[t] - window + 1));
            }
        if (!WIN) kvlo = 0;
        if (kvlen == 0) { // no token of the segment is this kernel's
            s0 = s1;
            continue;
        }
        // the warp's query rows of this segment into its part of sQ (0 for the other rows)
        float *qw = sQ + warp * TL_ROWS * D;
        __syncwarp();
#pragma unroll
        for (int i = 0; i < TL_ROWS; i++) {
            bool in = rt[i] >= s0 && rt[i] < s1;
            const float *qs = q + (size_t)(in ? rt[i] : 0) * ldq + (size_t)row_head(i) * hd;
            for (int d = lane; d < D; d += 32) qw[i * D + d] = in && d < hd ? qs[d] * scale : 0.0f;
        }
        __syncwarp();
        const int32_t *bt = tables + tb;
        for (int j0 = kvlo; j0 < kvlen; j0 += TL_BK) {
            __syncthreads(); // every warp is done with the previous tile
            for (int idx = threadIdx.x; idx < TL_BK * D; idx += TL_WARPS * 32) {
                int jj = idx / D, d = idx % D, j = j0 + jj;
                float kv = 0.0f, vv = 0.0f;
                if (j < kvlen && d < hd) {
                    size_t kb = ((size_t)bt[j / ZS_KV_BLK] * 2 * ZS_KV_BLK + (j % ZS_KV_BLK)) * kvd + (size_t)kh * hd;
                    kv = zs_ld(pool, kdt, kb + d);
                    vv = zs_ld(pool, kdt, kb + (size_t)ZS_KV_BLK * kvd + d);
                }
                sK[jj * D + (d ^ jj)] = kv; // D is a multiple of 32: d ^ jj stays in d's 32-column chunk
                sV[idx] = vv;
            }
            __syncthreads();
            // does any row of this warp see a key of this tile? (warp-uniform)
            bool any = false;
#pragma unroll
            for (int i = 0; i < TL_ROWS; i++)
                any |= rt[i] >= s0 && rt[i] < s1 && rp[i] >= j0 && (!WIN || rp[i] - window < j0 + TL_BK - 1);
            if (!any) continue;
            // scores: lane = key j0 + lane, against each of the warp's rows
            float s[TL_ROWS];
#pragma unroll
            for (int i = 0; i < TL_ROWS; i++) s[i] = 0.0f;
            const float *kr = sK + lane * D;
#pragma unroll 4
            for (int d = 0; d < D; d += 4) {
                float k0 = kr[(d + 0) ^ lane], k1 = kr[(d + 1) ^ lane];
                float k2 = kr[(d + 2) ^ lane], k3 = kr[(d + 3) ^ lane];
#pragma unroll
                for (int i = 0; i < TL_ROWS; i++) {
                    float4 qv = *(const float4 *)(qw + i * D + d); // the same address in every lane
                    s[i] += qv.x * k0;
                    s[i] += qv.y * k1;
                    s[i] += qv.z * k2;
                    s[i] += qv.w * k3;
                }
            }
            // online softmax; p = the unnormalised weight of key j0 + lane
            float p[TL_ROWS];
            const int j = j0 + lane;
#pragma unroll
            for (int i = 0; i < TL_ROWS; i++) {
                bool valid = rt[i] >= s0 && rt[i] < s1 && j <= rp[i] && (!WIN || j > rp[i] - window);
                float sc = valid ? s[i] : -INFINITY;
                if (cap > 0.0f && valid) sc = cap * tanhf(sc / cap);
                float mn = fmaxf(m[i], zs_warp_max(sc));
                float corr = mn == -INFINITY ? 1.0f : expf(m[i] - mn);
                p[i] = valid ? expf(sc - mn) : 0.0f;
                l[i] = l[i] * corr + zs_warp_sum(p[i]);
#pragma unroll
                for (int c = 0; c < C; c++) o[i][c] *= corr;
                m[i] = mn;
            }
            // o += P.V: column lane + 32c of each key, its weight broadcast from its lane. Row i
            // takes keys jj <= lim[i] only (warp-uniform): a V row it must not see is never
            // multiplied in, so not even a NaN there (uninitialised cache) can reach it
            int lim[TL_ROWS];
#pragma unroll
            for (int i = 0; i < TL_ROWS; i++) lim[i] = rt[i] >= s0 && rt[i] < s1 ? rp[i] - j0 : -1;
            // window: row i takes keys j0 + jj > rp[i] - window only (wj = window + j0)
            const int wj = WIN ? window + j0 : 0;
            const int nk = min(TL_BK, kvlen - j0);
            for (int jj = 0; jj < nk; jj++) {
                float vv[C];
#pragma unroll
                for (int c = 0; c < C; c++) vv[c] = sV[jj * D + lane + 32 * c];
#pragma unroll
                for (int i = 0; i < TL_ROWS; i++) {
                    float pj = __shfl_sync(0xffffffffu, p[i], jj);
                    if (jj <= lim[i] && (!WIN || jj + wj > rp[i])) {
#pragma unroll
                        for (int c = 0; c < C; c++) o[i][c] += pj * vv[c];
                    }
                }
            }
        }
        // this segment's rows are complete (the key at the row's own position is always visible,
        // so l >= 1)
#pragma unroll
        for (int i = 0; i < TL_ROWS; i++) {
            if (!(rt[i] >= s0 && rt[i] < s1)) continue;
            size_t ob = (size_t)rt[i] * nh * hd + (size_t)row_head(i) * hd;
#pragma unroll
            for (int c = 0; c < C; c++) {
                int d = lane + 32 * c;
                if (d < hd) zs_st(out, odt, ob + d, o[i][c] / l[i]);
            }
        }
        s0 = s1;
    }
}

template <int D, bool WIN>
static int tiled_launch_w(dim3 grid, cudaStream_t s, void *out, int odt, const float *q, int ldq,
                          const void *pool, int kdt, const int32_t *tables, const int32_t *tab, const int32_t *pos,
                          int T, int nh, int nkv, int hd, const att_args &a, int group, int gq, int nsub, int bq,
                          int only_runs) {
    size_t smem = tl_smem_bytes(D);
    if (smem > 48 * 1024) {
        // above the default 48 KiB: opt in (per device, so on every call; cheap)
        void (*kfn)(void *, int, const float *, int, const void *, int, const int32_t *, const int32_t *,
                    const int32_t *, int, int, int, int, float, float, int, int, int, int, int, int, const int32_t *) =
            attn_tiled_kernel<D, WIN>;
        cudaError_t e = cudaFuncSetAttribute((const void *)kfn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) {
            cudaGetLastError();
            return zs_cuda_refuse("attention (tiled): %zu bytes of shared memory for head_dim %d: %s", smem, hd,
                                  cudaGetErrorString(e));
        }
    }
    ZS_LAUNCH((attn_tiled_kernel<D, WIN>), grid, TL_WARPS * 32, smem, s, out, odt, q, ldq, pool, kdt, tables, tab,
              pos, T, nh, nkv, hd, a.scale, a.cap, a.window, group, gq, nsub, bq, only_runs,
              a.tree ? a.tree->base : NULL);
    return zs_launch_ok();
}

template <int D>
static int tiled_launch(dim3 grid, cudaStream_t s, void *out, int odt, const float *q, int ldq,
                        const void *pool, int kdt, const int32_t *tables, const int32_t *tab, const int32_t *pos,
                        int T, int nh, int nkv, int hd, const att_args &a, int group, int gq, int nsub, int bq,
                        int only_runs) {
    if (a.window > 0)
        return tiled_launch_w<D, true>(grid, s, out, odt, q, ldq, pool, kdt, tables, tab, pos, T, nh, nkv, hd, a, group,
                                       gq, nsub, bq, only_runs);
    return tiled_launch_w<D, false>(grid, s, out, odt, q, ldq, pool, kdt, tables, tab, pos, T, nh, nkv, hd, a, group,
                                    gq, nsub, bq, only_runs);
}

static int attn_tiled(void *out, int odt, const float *q, int ldq, const void *pool, int kdt,
                      const int32_t *tables, const int32_t *tab, const int32_t *pos, int T, int n_heads,
                      int n_kv_heads, int hd, const att_args &a, int only_runs, cudaStream_t s) {
    int group = n_heads / n_kv_heads;
    int gq = group < TL_R ? group : TL_R; // query heads per block; a larger group is split
    int nsub = (group + gq - 1) / gq;
    int bq = TL_R / gq;                   // tokens per block
    long long gy = (long long)n_kv_heads * nsub;
    if (gy > 65535)
        return zs_cuda_refuse("attention (tiled): %d kv heads x %d head subgroups = %lld blocks in grid y (limit 65535)",
                              n_kv_heads, nsub, gy);
    dim3 grid((unsigned)(((long long)T + bq - 1) / bq), (unsigned)gy);
    if (hd <= 32) return tiled_launch<32>(grid, s, out, odt, q, ldq, pool, kdt, tables, tab, pos, T, n_heads, n_kv_heads, hd, a, group, gq, nsub, bq, only_runs);
    if (hd <= 64) return tiled_launch<64>(grid, s, out, odt, q, ldq, pool, kdt, tables, tab, pos, T, n_heads, n_kv_heads, hd, a, group, gq, nsub, bq, only_runs);
    if (hd <= 128) return tiled_launch<128>(grid, s, out, odt, q, ldq, pool, kdt, tables, tab, pos, T, n_heads, n_kv_heads, hd, a, group, gq, nsub, bq, only_runs);
    return tiled_launch<256>(grid, s, out, odt, q, ldq, pool, kdt, tables, tab, pos, T, n_heads, n_kv_heads, hd, a, group, gq, nsub, bq, only_runs);
}

// ---- entry points ----

static int read_mode(void) {
    const char *e = getenv("ZS_CUDA_ATTN");
    if (e && !strcmp(e, "simple")) return ZS_CUDA_ATTN_SIMPLE;
    if (e && !strcmp(e, "tiled")) return ZS_CUDA_ATTN_TILED;
    return ZS_CUDA_ATTN_AUTO;
}

extern "C" int zs_cuda_attention_mode(void) {
    static const int mode = read_mode(); // read once (thread-safe static initialisation)
    return mode;
}

extern "C" const char *zs_cuda_attention_mode_name(int mode) {
    return mode == ZS_CUDA_ATTN_SIMPLE ? "simple" : mode == ZS_CUDA_ATTN_TILED ? "tiled" : "auto";
}

// The CPU's resolution of zs_att_params (kernels/cpu/ops-backward.c, attention.c): scale 0 ->
// 1/sqrtf(hd), a cap or window that is not positive -> none. A window of 2^30 positions or more
// covers every position a cache holds: none as well (the tiled kernel adds window to positions).
static att_args att_resolve(const zs_cuda_att_params *ap, int hd) {
    att_args a;
    a.scale = ap && ap->scale != 0.0f ? ap->scale : 1.0f / sqrtf((float)hd);
    a.cap = ap && ap->softcap > 0.0f ? ap->softcap : 0.0f;
    a.window = ap && ap->window > 0 && ap->window < (1 << 30) ? ap->window : 0;
    a.tree = NULL;
    return a;
}

static int attn_run(int impl, void *out, int odt, const float *q, int ldq, const void *pool, int kvdt,
                    const int32_t *tables, const int32_t *tab, const int32_t *pos, int T, int n_heads, int n_kv_heads,
                    int hd, const att_args &a, void *stream) {
    if (T <= 0) return 0;
    if (isinf(a.cap)) return zs_cuda_refuse("attention: soft-cap %g (a finite number)", (double)a.cap);
    if (n_heads <= 0 || n_kv_heads <= 0 || n_heads % n_kv_heads || hd <= 0 || hd > 256)
        return zs_cuda_refuse("attention: %d heads / %d kv heads, head_dim %d (heads must be a multiple of kv heads, "
                              "head_dim 1..256)", n_heads, n_kv_heads, hd);
    if (!kv_dt_ok(kvdt)) return zs_cuda_refuse("attention: KV cache element type %d (f32, f16 or bf16)", kvdt);
    cudaStream_t s = (cudaStream_t)stream;
    if (impl == ZS_CUDA_ATTN_SIMPLE)
        return attn_simple(out, odt, q, ldq, pool, kvdt, tables, tab, pos, T, n_heads, n_kv_heads, hd, a, 0, s);
    // a tree: its sequences' tokens take the simple kernel whatever the mode (the tiled one shares
    // a sequence's keys between its rows, a tree's branches do not), so a tree row gets the decode
    // kernel's bits; the tiled kernel skips them
    if (impl == ZS_CUDA_ATTN_TILED) {
        int rc = a.tree ? attn_simple(out, odt, q, ldq, pool, kvdt, tables, tab, pos, T, n_heads, n_kv_heads, hd, a, 2, s)
                        : 0;
        if (rc == 0) rc = attn_tiled(out, odt, q, ldq, pool, kvdt, tables, tab, pos, T, n_heads, n_kv_heads, hd, a, 0, s);
        return rc;
    }
    // auto: each token is exactly one kernel's (att_in_run decides the same way in both)
    int rc = attn_simple(out, odt, q, ldq, pool, kvdt, tables, tab, pos, T, n_heads, n_kv_heads, hd, a, 1, s);
    if (rc == 0 && T > 1)
        rc = attn_tiled(out, odt, q, ldq, pool, kvdt, tables, tab, pos, T, n_heads, n_kv_heads, hd, a, 1, s);
    return rc;
}

extern "C" int zs_cuda_attention_dt(int impl, void *out, int odt, const float *q, int ldq, const void *pool,
                                    int kvdt, const int32_t *tables, const int32_t *tab, const int32_t *pos, int T,
                                    int n_heads, int n_kv_heads, int hd, float scale, void *stream) {
    att_args a = {scale, 0.0f, 0, NULL};
    return attn_run(impl, out, odt, q, ldq, pool, kvdt, tables, tab, pos, T, n_heads, n_kv_heads, hd, a, stream);
}

extern "C" int zs_cuda_attention_ex(int impl, void *out, int odt, const float *q, int ldq, const void *pool,
                                    int kvdt, const int32_t *tables, const int32_t *tab, const int32_t *pos, int T,
                                    int n_heads, int n_kv_heads, int hd, const zs_cuda_att_params *ap,
                                    void *stream) {
    att_args a = att_resolve(ap, hd);
    return attn_run(impl, out, odt, q, ldq, pool, kvdt, tables, tab, pos, T, n_heads, n_kv_heads, hd, a, stream);
}

extern "C" int zs_cuda_attention_tree(int impl, void *out, int odt, const float *q, int ldq, const void *pool,
                                      int kvdt, const int32_t *tables, const int32_t *tab, const int32_t *pos, int T,
                                      int n_heads, int n_kv_heads, int hd, const zs_cuda_att_params *ap,
                                      const zs_cuda_att_tree *tree, void *stream) {
    att_args a = att_resolve(ap, hd);
    if (tree && (!tree->base || !tree->poff || !tree->path))
        return zs_cuda_refuse("attention: a token tree needs base, poff and path");
    a.tree = tree;
    return attn_run(impl, out, odt, q, ldq, pool, kvdt, tables, tab, pos, T, n_heads, n_kv_heads, hd, a, stream);
}

// The host plan of a tree (kernels.h): walks each tree token's parents once.
extern "C" int zs_cuda_att_tree_plan(const int32_t *seq, const int32_t *pos, const int32_t *slot,
                                     const int32_t *parent, int T, int32_t *base, int32_t *poff, int32_t *path) {
    int n = 0;
    for (int a = 0, b = 0; a < T; a = b) {
        // a sequence's run a..b-1: does it hold a tree row? (no: base -1, any kernel)
        int tree = 0;
        for (b = a; b < T && seq[b] == seq[a]; b++) tree |= parent && parent[b] >= 0;
        for (int t = a; t < b; t++) {
            if (!parent || parent[t] < 0) { // causal: every key at its own position
                if (base) {
                    base[t] = tree ? pos[t] + 1 : -1;
                    poff[t] = 0;
                }
                continue;
            }
            int r = t, depth = 0;
            while (parent[r] >= 0) {
                if (parent[r] >= r) return zs_cuda_refuse("attention tree: row %d has parent %d", r, parent[r]);
                r = parent[r];
                depth++;
            }
            if (base) {
                base[t] = pos[r];
                poff[t] = n;
                for (int x = t, i = depth; i >= 0; i--, x = parent[x]) path[n + i] = slot[x]; // root first
            }
            n += depth + 1;
        }
    }
    return n;
}

extern "C" int zs_cuda_attention_impl(int impl, void *out, int odt, const float *q, int ldq, const float *pool,
                                      const int32_t *tables, const int32_t *tab, const int32_t *pos, int T,
                                      int n_heads, int n_kv_heads, int hd, float scale, void *stream) {
    return zs_cuda_attention_dt(impl, out, odt, q, ldq, pool, ZS_DT_F32, tables, tab, pos, T, n_heads, n_kv_heads,
                                hd, scale, stream);
}

extern "C" int zs_cuda_attention(void *out, int odt, const float *q, int ldq, const float *pool,
                                 const int32_t *tables, const int32_t *tab, const int32_t *pos, int T,
                                 int n_heads, int n_kv_heads, int hd, float scale, void *stream) {
    return zs_cuda_attention_impl(zs_cuda_attention_mode(), out, odt, q, ldq, pool, tables, tab, pos, T, n_heads,
                                  n_kv_heads, hd, scale, stream);
}
