// backward.cu — the backward of the forward kernels for training (kernels/cpu/train-ops.h is the CPU
// reference): RMSNorm (with Gemma's weight offset), LayerNorm, RoPE (default or given frequencies,
// attention factor), SwiGLU, GELU (tanh), GeGLU, soft-capping, residual add, embedding
// (deterministic scatter-add), causal GQA attention over one sequence (probabilities recomputed
// row by row, fp32; score scale, soft-cap and sliding window), masked next-token cross-entropy,
// and the matrix product through cuBLAS.
// Every kernel is deterministic: each output element is written by one thread, and every
// reduction runs in a fixed order (no atomics).
#include <cublas_v2.h>

#include "dtype.cuh"
#include "kernels.h"

// ---- norms ----

// One block per row: dx[t, :] += ∂L/∂x; stats[t] = mean (LayerNorm only) and stats[T + t] = rstd
// for the column pass that makes dw / db (stats may be NULL when they are not needed).
// The weight of RMSNorm element i as the forward sees it: w (off 0: the original arithmetic) or
// off + w (Gemma).
static __device__ __forceinline__ float rms_w(const float *w, float off, int i) {
    return off == 0.0f ? w[i] : off + w[i];
}

__global__ static void rmsnorm_bwd_kernel(float *dx, float *stats, const float *dy, const float *x,
                                          const float *w, float off, int T, int d, float eps) {
    __shared__ float sh[33];
    int t = blockIdx.x;
    const float *xr = x + (size_t)t * d, *gr = dy + (size_t)t * d;
    float *dr = dx + (size_t)t * d;
    float ss = 0.0f, dot = 0.0f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        ss += xr[i] * xr[i];
        dot += gr[i] * rms_w(w, off, i) * xr[i];
    }
    ss = zs_block_sum(ss, sh);
    dot = zs_block_sum(dot, sh);
    float r = 1.0f / sqrtf(ss / (float)d + eps);
    float c = dot * r * r * r / (float)d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) dr[i] += r * rms_w(w, off, i) * gr[i] - c * xr[i];
    if (stats && threadIdx.x == 0) stats[T + t] = r;
}

__global__ static void layernorm_bwd_kernel(float *dx, float *stats, const float *dy, const float *x,
                                            const float *w, int T, int d, float eps) {
    __shared__ float sh[33];
    int t = blockIdx.x;
    const float *xr = x + (size_t)t * d, *gr = dy + (size_t)t * d;
    float *dr = dx + (size_t)t * d;
    float m = 0.0f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) m += xr[i];
    m = zs_block_sum(m, sh) / (float)d;
    float v = 0.0f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float c = xr[i] - m;
        v += c * c;
    }
    v = zs_block_sum(v, sh) / (float)d;
    float r = 1.0f / sqrtf(v + eps);
    float sg = 0.0f, sgx = 0.0f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float g = gr[i] * w[i];
        sg += g;
        sgx += g * ((xr[i] - m) * r);
    }
    sg = zs_block_sum(sg, sh);
    sgx = zs_block_sum(sgx, sh);
    float mg = sg / (float)d, mgx = sgx / (float)d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float xh = (xr[i] - m) * r;
        dr[i] += r * (gr[i] * w[i] - mg - xh * mgx);
    }
    if (stats && threadIdx.x == 0) {
        stats[t] = m;
        stats[T + t] = r;
    }
}

// Column sums over the T rows, 32 columns per block, CR_Y row slices reduced in a fixed order:
// dw[i] += Σ_t dy[t,i]·(x[t,i] - mean[t])·rstd[t] (mean = 0 when mean is NULL: RMSNorm),
// db[i] += Σ_t dy[t,i]. x may be NULL when dw is (the bias sum of the matmul backward).
#define CR_Y 16
__global__ static void colsum_kernel(float *dw, float *db, const float *dy, const float *x,
                                     const float *mean, const float *rstd, int T, int d) {
    __shared__ float sw[CR_Y][33], sb[CR_Y][33];
    int i = blockIdx.x * 32 + threadIdx.x;
    float aw = 0.0f, ab = 0.0f;
    if (i < d) {
        for (int t = threadIdx.y; t < T; t += CR_Y) {
            float g = dy[(size_t)t * d + i];
            if (dw) {
                float xv = x[(size_t)t * d + i];
                float xh = mean ? (xv - mean[t]) * rstd[t] : xv * rstd[t];
                aw += g * xh;
            }
            ab += g;
        }
    }
    sw[threadIdx.y][threadIdx.x] = aw;
    sb[threadIdx.y][threadIdx.x] = ab;
    __syncthreads();
    if (threadIdx.y == 0 && i < d) {
        float w = 0.0f, b = 0.0f;
        for (int y = 0; y < CR_Y; y++) {
            w += sw[y][threadIdx.x];
            b += sb[y][threadIdx.x];
        }
        if (dw) dw[i] += w;
        if (db) db[i] += b;
    }
}

static unsigned norm_threads(int d) { return d >= 1024 ? 1024 : d >= 256 ? 256 : 64; }

static int colsum(float *dw, float *db, const float *dy, const float *x, const float *mean, const float *rstd,
                  int T, int d, cudaStream_t s) {
    if (!dw && !db) return 0;
    dim3 blk(32, CR_Y);
    ZS_LAUNCH(colsum_kernel, (unsigned)((d + 31) / 32), blk, 0, s, dw, db, dy, x, mean, rstd, T, d);
    return zs_launch_ok();
}

extern "C" int zs_cuda_rmsnorm_off_bwd(float *dx, float *dw, const float *dy, const float *x, const float *w,
                                       float off, int T, int d, float eps, float *stats, void *stream) {
    if (T <= 0 || d <= 0) return 0;
    cudaStream_t s = (cudaStream_t)stream;
    float *st = dw ? stats : NULL;
    if (dw && !stats) return zs_cuda_refuse("rmsnorm_bwd: dw without stats scratch");
    ZS_LAUNCH(rmsnorm_bwd_kernel, T, norm_threads(d), 0, s, dx, st, dy, x, w, off, T, d, eps);
    if (zs_launch_ok() < 0) return -1;
    return colsum(dw, NULL, dy, x, NULL, st ? st + T : NULL, T, d, s);
}

extern "C" int zs_cuda_rmsnorm_bwd(float *dx, float *dw, const float *dy, const float *x, const float *w,
                                   int T, int d, float eps, float *stats, void *stream) {
    return zs_cuda_rmsnorm_off_bwd(dx, dw, dy, x, w, 0.0f, T, d, eps, stats, stream);
}

extern "C" int zs_cuda_layernorm_bwd(float *dx, float *dw, float *db, const float *dy, const float *x,
                                     const float *w, int T, int d, float eps, float *stats, void *stream) {
    if (T <= 0 || d <= 0) return 0;
    cudaStream_t s = (cudaStream_t)stream;
    float *st = dw ? stats : NULL;
    if (dw && !stats) return zs_cuda_refuse("layernorm_bwd: dw without stats scratch");
    ZS_LAUNCH(layernorm_bwd_kernel, T, norm_threads(d), 0, s, dx, st, dy, x, w, T, d, eps);
    if (zs_launch_ok() < 0) return -1;
    return colsum(dw, db, dy, x, st, st ? st + T : NULL, T, d, s);
}

// ---- RoPE: the transpose of the forward's map, the rotation by -angle times the attention factor
// (inv_freq: the host-made table(s) of rope.cu; fst 0: shared, half: a row per token) ----

__global__ static void rope_bwd_kernel(float *x, int T, int ld, int nh, int hd, const int32_t *pos,
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
        v[i] = a * c + b * s;
        v[i + half] = b * c - a * s;
    }
}

extern "C" int zs_cuda_rope_freq_bwd(float *dx, int T, int ld, int n_heads, int head_dim, const int32_t *pos,
                                     const float *inv_freq, int per_token, float attn_factor, void *stream) {
    size_t n = (size_t)T * n_heads * (head_dim / 2);
    if (n == 0) return 0;
    if (!inv_freq) return zs_cuda_refuse("rope_bwd: no inv_freq table");
    ZS_LAUNCH(rope_bwd_kernel, zs_grid(n, 256), 256, 0, (cudaStream_t)stream, dx, T, ld, n_heads, head_dim, pos,
              inv_freq, per_token ? head_dim / 2 : 0, attn_factor);
    return zs_launch_ok();
}

extern "C" int zs_cuda_rope_bwd(float *dx, int T, int ld, int n_heads, int head_dim, const int32_t *pos,
                                const float *inv_freq, void *stream) {
    return zs_cuda_rope_freq_bwd(dx, T, ld, n_heads, head_dim, pos, inv_freq, 0, 1.0f, stream);
}

// ---- element-wise ----

__global__ static void swiglu_bwd_kernel(float *dgate, float *dup, const float *dy, const float *gate,
                                         const float *up, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float g = gate[i], u = up[i], y = dy[i];
        float sig = 1.0f / (1.0f + expf(-g));
        float silu = g * sig;
        dgate[i] = y * u * sig * (1.0f + g * (1.0f - sig));
        dup[i] = y * silu;
    }
}

__global__ static void gelu_bwd_kernel(float *dx, const float *dy, const float *x, size_t n) {
    const float k = 0.7978845608028654f;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float v = x[i];
        float th = tanhf(k * (v + 0.044715f * v * v * v));
        float d = 0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * k * (1.0f + 3.0f * 0.044715f * v * v);
        dx[i] = dy[i] * d;
    }
}

// zs_op_geglu_bwd's formula: gelu'(v) as gelu_bwd_kernel, gelu(v) = 0.5·v·(1 + tanh)
__global__ static void geglu_bwd_kernel(float *dgate, float *dup, const float *dy, const float *gate,
                                        const float *up, size_t n) {
    const float k = 0.7978845608028654f;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float v = gate[i], u = up[i], y = dy[i];
        float th = tanhf(k * (v + 0.044715f * v * v * v));
        float d = 0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * k * (1.0f + 3.0f * 0.044715f * v * v);
        dgate[i] = y * u * d;
        dup[i] = y * (0.5f * v * (1.0f + th));
    }
}

// from the forward's output y = cap·tanh(x/cap): dx = dy·(1 - (y/cap)²)
__global__ static void softcap_bwd_kernel(float *dx, const float *dy, const float *y, size_t n, float cap) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float t = y[i] / cap;
        dx[i] = dy[i] * (1.0f - t * t);
    }
}

__global__ static void add_bwd_kernel(float *dx, const float *dy, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) dx[i] += dy[i];
}

extern "C" int zs_cuda_swiglu_bwd(float *dgate, float *dup, const float *dy, const float *gate,
                                  const float *up, size_t n, void *stream) {
    if (n == 0) return 0;
    ZS_LAUNCH(swiglu_bwd_kernel, zs_grid(n, 256), 256, 0, (cudaStream_t)stream, dgate, dup, dy, gate, up, n);
    return zs_launch_ok();
}

extern "C" int zs_cuda_gelu_bwd(float *dx, const float *dy, const float *x, size_t n, void *stream) {
    if (n == 0) return 0;
    ZS_LAUNCH(gelu_bwd_kernel, zs_grid(n, 256), 256, 0, (cudaStream_t)stream, dx, dy, x, n);
    return zs_launch_ok();
}

extern "C" int zs_cuda_geglu_bwd(float *dgate, float *dup, const float *dy, const float *gate,
                                 const float *up, size_t n, void *stream) {
    if (n == 0) return 0;
    ZS_LAUNCH(geglu_bwd_kernel, zs_grid(n, 256), 256, 0, (cudaStream_t)stream, dgate, dup, dy, gate, up, n);
    return zs_launch_ok();
}

extern "C" int zs_cuda_softcap_bwd(float *dx, const float *dy, const float *y, size_t n, float cap, void *stream) {
    if (!(cap > 0.0f) || isinf(cap)) return zs_cuda_refuse("softcap_bwd: cap %g (a positive finite number)", (double)cap);
    if (n == 0) return 0;
    ZS_LAUNCH(softcap_bwd_kernel, zs_grid(n, 256), 256, 0, (cudaStream_t)stream, dx, dy, y, n, cap);
    return zs_launch_ok();
}

extern "C" int zs_cuda_add_bwd(float *dx, const float *dy, size_t n, void *stream) {
    if (n == 0) return 0;
    ZS_LAUNCH(add_bwd_kernel, zs_grid(n, 256), 256, 0, (cudaStream_t)stream, dx, dy, n);
    return zs_launch_ok();
}

// ---- embedding: deterministic scatter-add ----

// One block per token t. The block whose token is the FIRST occurrence of its id sums, for each
// column, the rows of every token with that id in token order onto the table row (the CPU
// order: ((row + dy[t0]) + dy[t1]) + ...); the other blocks exit. O(T²) id comparisons.
__global__ static void embed_bwd_kernel(float *dtable, const float *dy, const int32_t *ids, int T, int d) {
    int t = blockIdx.x;
    int id = ids[t];
    int dup = 0;
    for (int j = threadIdx.x; j < t; j += blockDim.x)
        if (ids[j] == id) dup = 1;
    if (__syncthreads_or(dup)) return;
    float *row = dtable + (size_t)id * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float acc = row[i];
        for (int u = t; u < T; u++)
            if (ids[u] == id) acc += dy[(size_t)u * d + i];
        row[i] = acc;
    }
}

extern "C" int zs_cuda_embed_bwd(float *dtable, const float *dy, const int32_t *ids, int T, int d,
                                 void *stream) {
    if (T <= 0 || d <= 0) return 0;
    ZS_LAUNCH(embed_bwd_kernel, T, 256, 0, (cudaStream_t)stream, dtable, dy, ids, T, d);
    return zs_launch_ok();
}

// ---- cross-entropy ----

// One block per row: row_loss[t] = logsumexp - x[target] (0 for a masked row); dlogits (may
// alias logits) = scale·(softmax - onehot), 0 on masked rows.
__global__ static void xent_kernel(float *dlogits, float *row_loss, const float *logits,
                                   const int32_t *targets, int V, float scale) {
    __shared__ float sh[33];
    int t = blockIdx.x;
    const float *x = logits + (size_t)t * V;
    float *g = dlogits ? dlogits + (size_t)t * V : NULL;
    int tg = targets[t];
    if (tg < 0) {
        if (g)
            for (int j = threadIdx.x; j < V; j += blockDim.x) g[j] = 0.0f;
        if (threadIdx.x == 0) row_loss[t] = 0.0f;
        return;
    }
    float m = -INFINITY;
    for (int j = threadIdx.x; j < V; j += blockDim.x) m = fmaxf(m, x[j]);
    m = zs_block_max(m, sh);
    float s = 0.0f;
    for (int j = threadIdx.x; j < V; j += blockDim.x) s += expf(x[j] - m);
    s = zs_block_sum(s, sh);
    float lse = m + logf(s);
    float xt = x[tg];
    __syncthreads(); // every thread has read x[tg] before anyone writes g (g may alias x)
    if (threadIdx.x == 0) row_loss[t] = lse - xt;
    if (g)
        for (int j = threadIdx.x; j < V; j += blockDim.x) {
            float v = expf(x[j] - lse) * scale;
            if (j == tg) v -= scale;
            g[j] = v;
        }
}

// One block: *loss = Σ row_loss in double, in a fixed order.
__global__ static void sum_rows_kernel(double *loss, const float *row_loss, int T) {
    __shared__ double sd[256];
    double a = 0.0;
    for (int t = threadIdx.x; t < T; t += blockDim.x) a += (double)row_loss[t];
    sd[threadIdx.x] = a;
    __syncthreads();
    if (threadIdx.x == 0) {
        double s = 0.0;
        for (int i = 0; i < (int)blockDim.x; i++) s += sd[i];
        *loss = s;
    }
}

extern "C" int zs_cuda_cross_entropy(float *dlogits, float *row_loss, double *loss, const float *logits,
                                     const int32_t *targets, int T, int V, float scale, void *stream) {
    cudaStream_t s = (cudaStream_t)stream;
    if (T <= 0 || V <= 0) return 0;
    ZS_LAUNCH(xent_kernel, T, 1024, 0, s, dlogits, row_loss, logits, targets, V, scale);
    if (zs_launch_ok() < 0) return -1;
    if (!loss) return 0;
    ZS_LAUNCH(sum_rows_kernel, 1, 256, 0, s, loss, row_loss, T);
    return zs_launch_ok();
}

// ---- causal attention with GQA over one sequence ----

#define ATT_WARPS 4
#define ATT_HD_MAX 256
#define ATT_PER_LANE (ATT_HD_MAX / 32)

// The scores of zs_op_attention_bwd: s = (q·k)·scale, then with a soft-cap (cap > 0) s = cap·t,
// t = tanhf(s / cap), whose derivative multiplies ds by 1 - t² (the CPU's order: p·(dp - D), times
// 1 - t², times scale). With a window (> 0) query i sees keys max(0, i-window+1) .. i.
static __device__ __forceinline__ float att_cap(float s, float cap, float *t) {
    if (cap > 0.0f) {
        *t = tanhf(s / cap);
        return cap * *t;
    }
    return s;
}

// Pass A: one block per (query row i, head h). Recomputes the row's softmax (online max/sum over
// the keys, warp j-strided), D = Σ_j p_j·(dout_i·v_j), then dq_i += Σ_j ds_j·k_j with
// ds_j = p_j·(dp_j - D)·scale (·(1 - t²) through a soft-cap). Writes
// stats[(i*nh + h)*3 + {0,1,2}] = max, 1/sum, D.
__global__ static void att_bwd_q_kernel(float *dq, float *stats, const float *dout, const float *q,
                                        const float *k, const float *v, int nh, int nkv, int hd,
                                        float scale, float cap, int window) {
    __shared__ float sm[ATT_WARPS], sl[ATT_WARPS], sdd[ATT_WARPS];
    __shared__ float sacc[ATT_WARPS][ATT_HD_MAX];
    int i = blockIdx.x / nh, h = blockIdx.x % nh;
    int kh = h / (nh / nkv);
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    size_t qd = (size_t)nh * hd, kvd = (size_t)nkv * hd;
    const float *qi = q + (size_t)i * qd + (size_t)h * hd;
    const float *go = dout + (size_t)i * qd + (size_t)h * hd;
    float qr[ATT_PER_LANE], gr[ATT_PER_LANE], acc[ATT_PER_LANE];
#pragma unroll
    for (int c = 0; c < ATT_PER_LANE; c++) {
        int e = lane + 32 * c;
        qr[c] = e < hd ? qi[e] : 0.0f;
        gr[c] = e < hd ? go[e] : 0.0f;
        acc[c] = 0.0f;
    }
    // pass 1: online max, sum of exp and Σ exp·dp per warp (keys lo..i)
    const int lo = window > 0 && i - window + 1 > 0 ? i - window + 1 : 0;
    float m = -INFINITY, l = 0.0f, dd = 0.0f;
    for (int j = lo + w; j <= i; j += ATT_WARPS) {
        const float *kr = k + (size_t)j * kvd + (size_t)kh * hd;
        const float *vr = v + (size_t)j * kvd + (size_t)kh * hd;
        float s = 0.0f, dp = 0.0f;
#pragma unroll
        for (int c = 0; c < ATT_PER_LANE; c++) {
            int e = lane + 32 * c;
            if (e < hd) {
                s += qr[c] * kr[e];
                dp += gr[c] * vr[e];
            }
        }
        s = zs_warp_sum(s) * scale;
        dp = zs_warp_sum(dp);
        float t = 0.0f;
        s = att_cap(s, cap, &t);
        float mn = fmaxf(m, s);
        float r = expf(m - mn); // m = -inf at the first key: r = 0
        float p = expf(s - mn);
        l = l * r + p;
        dd = dd * r + p * dp;
        m = mn;
    }
    if (lane == 0) { sm[w] = m; sl[w] = l; sdd[w] = dd; }
    __syncthreads();
    float M = -INFINITY;
    for (int u = 0; u < ATT_WARPS; u++) M = fmaxf(M, sm[u]);
    float L = 0.0f, DD = 0.0f;
    for (int u = 0; u < ATT_WARPS; u++) {
        if (sm[u] == -INFINITY) continue; // a warp with no keys
        float r = expf(sm[u] - M);
        L += sl[u] * r;
        DD += sdd[u] * r;
    }
    float inv = 1.0f / L, D = DD * inv;
    // pass 2: dq
    for (int j = lo + w; j <= i; j += ATT_WARPS) {
        const float *kr = k + (size_t)j * kvd + (size_t)kh * hd;
        const float *vr = v + (size_t)j * kvd + (size_t)kh * hd;
        float s = 0.0f, dp = 0.0f;
#pragma unroll
        for (int c = 0; c < ATT_PER_LANE; c++) {
            int e = lane + 32 * c;
            if (e < hd) {
                s += qr[c] * kr[e];
                dp += gr[c] * vr[e];
            }
        }
        s = zs_warp_sum(s) * scale;
        dp = zs_warp_sum(dp);
        float t = 0.0f;
        s = att_cap(s, cap, &t);
        float p = expf(s - M) * inv;
        float ds = p * (dp - D);
        if (cap > 0.0f) ds *= 1.0f - t * t;
        ds *= scale;
#pragma unroll
        for (int c = 0; c < ATT_PER_LANE; c++) {
            int e = lane + 32 * c;
            if (e < hd) acc[c] += ds * kr[e];
        }
    }
#pragma unroll
    for (int c = 0; c < ATT_PER_LANE; c++) {
        int e = lane + 32 * c;
        if (e < hd) sacc[w][e] = acc[c];
    }
    __syncthreads();
    float *dqi = dq + (size_t)i * qd + (size_t)h * hd;
    for (int e = threadIdx.x; e < hd; e += blockDim.x) {
        float a = 0.0f;
        for (int u = 0; u < ATT_WARPS; u++) a += sacc[u][e];
        dqi[e] += a;
    }
    if (threadIdx.x == 0) {
        float *st = stats + (size_t)blockIdx.x * 3;
        st[0] = M;
        st[1] = inv;
        st[2] = D;
    }
}

// Pass B: one block per (key row j, kv head kh): over the query rows i >= j that see it (i <
// j + window with a window) and the heads h of the group (warp-strided), dk_j += Σ ds·q_i and
// dv_j += Σ p·dout_i with p, ds from the stats.
__global__ static void att_bwd_kv_kernel(float *dk, float *dv, const float *stats, const float *dout,
                                         const float *q, const float *k, const float *v, int T, int nh,
                                         int nkv, int hd, float scale, float cap, int window) {
    __shared__ float sk[ATT_WARPS][ATT_HD_MAX], sv[ATT_WARPS][ATT_HD_MAX];
    int j = blockIdx.x / nkv, kh = blockIdx.x % nkv;
    int group = nh / nkv;
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    size_t qd = (size_t)nh * hd, kvd = (size_t)nkv * hd;
    const float *kj = k + (size_t)j * kvd + (size_t)kh * hd;
    const float *vj = v + (size_t)j * kvd + (size_t)kh * hd;
    float kr[ATT_PER_LANE], vr[ATT_PER_LANE], ak[ATT_PER_LANE], av[ATT_PER_LANE];
#pragma unroll
    for (int c = 0; c < ATT_PER_LANE; c++) {
        int e = lane + 32 * c;
        kr[c] = e < hd ? kj[e] : 0.0f;
        vr[c] = e < hd ? vj[e] : 0.0f;
        ak[c] = 0.0f;
        av[c] = 0.0f;
    }
    const int hi = window > 0 && window < T - j ? j + window : T; // query rows j .. hi-1
    int n = (hi - j) * group;
    for (int u = w; u < n; u += ATT_WARPS) {
        int i = j + u / group, h = kh * group + u % group;
        const float *qi = q + (size_t)i * qd + (size_t)h * hd;
        const float *go = dout + (size_t)i * qd + (size_t)h * hd;
        float s = 0.0f, dp = 0.0f;
#pragma unroll
        for (int c = 0; c < ATT_PER_LANE; c++) {
            int e = lane + 32 * c;
            if (e < hd) {
                s += qi[e] * kr[c];
                dp += go[e] * vr[c];
            }
        }
        s = zs_warp_sum(s) * scale;
        dp = zs_warp_sum(dp);
        float t = 0.0f;
        s = att_cap(s, cap, &t);
        const float *st = stats + ((size_t)i * nh + h) * 3;
        float p = expf(s - st[0]) * st[1];
        float ds = p * (dp - st[2]);
        if (cap > 0.0f) ds *= 1.0f - t * t;
        ds *= scale;
#pragma unroll
        for (int c = 0; c < ATT_PER_LANE; c++) {
            int e = lane + 32 * c;
            if (e < hd) {
                ak[c] += ds * qi[e];
                av[c] += p * go[e];
            }
        }
    }
#pragma unroll
    for (int c = 0; c < ATT_PER_LANE; c++) {
        int e = lane + 32 * c;
        if (e < hd) {
            sk[w][e] = ak[c];
            sv[w][e] = av[c];
        }
    }
    __syncthreads();
    float *dkj = dk + (size_t)j * kvd + (size_t)kh * hd;
    float *dvj = dv + (size_t)j * kvd + (size_t)kh * hd;
    for (int e = threadIdx.x; e < hd; e += blockDim.x) {
        float a = 0.0f, b = 0.0f;
        for (int u = 0; u < ATT_WARPS; u++) {
            a += sk[u][e];
            b += sv[u][e];
        }
        dkj[e] += a;
        dvj[e] += b;
    }
}

extern "C" int zs_cuda_attention_bwd_ex(float *dq, float *dk, float *dv, const float *dout, const float *q,
                                        const float *k, const float *v, int T, int n_heads, int n_kv_heads,
                                        int hd, const zs_cuda_att_params *ap, float *stats, void *stream) {
    if (T <= 0) return 0;
    if (hd <= 0 || hd > ATT_HD_MAX || n_kv_heads <= 0 || n_heads % n_kv_heads != 0)
        return zs_cuda_refuse("attention_bwd: %d heads / %d kv heads x %d (head_dim 1..%d, heads a multiple of kv heads)",
                              n_heads, n_kv_heads, hd, ATT_HD_MAX);
    cudaStream_t s = (cudaStream_t)stream;
    // zs_att_params resolved as the CPU op does: scale 0 -> 1/sqrt(hd), cap / window <= 0 -> none
    float scale = ap && ap->scale != 0.0f ? ap->scale : 1.0f / sqrtf((float)hd);
    float cap = ap && ap->softcap > 0.0f ? ap->softcap : 0.0f;
    int window = ap && ap->window > 0 ? ap->window : 0;
    if (isinf(cap)) return zs_cuda_refuse("attention_bwd: soft-cap %g (a finite number)", (double)cap);
    ZS_LAUNCH(att_bwd_q_kernel, (unsigned)((size_t)T * n_heads), 32 * ATT_WARPS, 0, s, dq, stats, dout, q, k, v,
              n_heads, n_kv_heads, hd, scale, cap, window);
    if (zs_launch_ok() < 0) return -1;
    ZS_LAUNCH(att_bwd_kv_kernel, (unsigned)((size_t)T * n_kv_heads), 32 * ATT_WARPS, 0, s, dk, dv, stats, dout, q,
              k, v, T, n_heads, n_kv_heads, hd, scale, cap, window);
    return zs_launch_ok();
}

extern "C" int zs_cuda_attention_bwd(float *dq, float *dk, float *dv, const float *dout, const float *q,
                                     const float *k, const float *v, int T, int n_heads, int n_kv_heads,
                                     int hd, float *stats, void *stream) {
    return zs_cuda_attention_bwd_ex(dq, dk, dv, dout, q, k, v, T, n_heads, n_kv_heads, hd, NULL, stats, stream);
}

// ---- matrix product through cuBLAS ----

extern "C" int zs_cuda_matmul_bwd(void *cublas, float *dx, float *dW, float *db, const float *dy,
                                  const float *x, const void *W, int wdt, int T, int in, int out,
                                  float *wscratch, void *stream) {
    if (T <= 0 || in <= 0 || out <= 0) return 0;
    cublasHandle_t h = (cublasHandle_t)cublas;
    cudaStream_t s = (cudaStream_t)stream;
    cudaStream_t hs = NULL;
    if (cublasGetStream(h, &hs) != CUBLAS_STATUS_SUCCESS || hs != s)
        return zs_cuda_refuse("matmul_bwd: the cuBLAS handle is not bound to the stream");
    const float one = 1.0f;
    if (dx) {
        // row-major dx[T,in] += dy[T,out]·W[out,in] is column-major dx'[in,T] += W'[in,out]·dy'[out,T]
        if (wdt == ZS_DT_F32) {
            if (cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, in, T, out, &one, W, CUDA_R_32F, in, dy, CUDA_R_32F,
                             out, &one, dx, CUDA_R_32F, in, CUBLAS_COMPUTE_32F,
                             CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
                return zs_cuda_refuse("matmul_bwd: cublasGemmEx (dx) failed");
        } else {
            // blocks of W rows converted to f32: dx += dy[:, r0:r0+R]·W[r0:r0+R, :]
            size_t esz = 2;
            for (int r0 = 0; r0 < out; r0 += ZS_CUDA_MATMUL_BWD_ROWS) {
                int R = out - r0 < ZS_CUDA_MATMUL_BWD_ROWS ? out - r0 : ZS_CUDA_MATMUL_BWD_ROWS;
                if (zs_cuda_convert(wscratch, ZS_DT_F32, (const char *)W + (size_t)r0 * (size_t)in * esz, wdt,
                                    (size_t)R * (size_t)in, stream) < 0)
                    return -1;
                if (cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, in, T, R, &one, wscratch, CUDA_R_32F, in, dy + r0,
                                 CUDA_R_32F, out, &one, dx, CUDA_R_32F, in, CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
                    return zs_cuda_refuse("matmul_bwd: cublasGemmEx (dx, converted rows) failed");
            }
        }
    }
    if (dW) {
        // row-major dW[out,in] += dyᵀ·x is column-major dW'[in,out] += x'[in,T]·(dy'[out,T])ᵀ
        if (cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_T, in, out, T, &one, x, CUDA_R_32F, in, dy, CUDA_R_32F, out,
                         &one, dW, CUDA_R_32F, in, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
            return zs_cuda_refuse("matmul_bwd: cublasGemmEx (dW) failed");
    }
    if (db) return colsum(NULL, db, dy, NULL, NULL, NULL, T, out, s);
    return 0;
}
