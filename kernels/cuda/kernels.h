/* kernels.h — the CUDA kernels of the forward pass behind a C API (no CUDA types: a stream is a
 * cudaStream_t passed as void*, NULL = the legacy default stream). Every pointer argument is
 * device memory unless it says otherwise. Storage dtypes are ZS_F32, ZS_F16 and ZS_BF16
 * (zs_dtype values), and for weights the block formats where a function says so (embed.cu,
 * matmul-quant.cu); arithmetic is fp32. Each launcher returns 0, or -1 when the launch failed
 * or an argument was refused; the reason (the CUDA error, read once with cudaGetLastError, or the
 * refused argument) is kept per thread and zs_cuda_take_error hands it over (zs_dev_error puts
 * it in the error message). Launchers are thread-safe; the work is ordered only by the stream.
 * One file per family: convert.cu (casts), embed.cu, norm.cu (RMSNorm with Gemma's weight offset,
 * LayerNorm), rope.cu (default, given and per-token frequencies, attention factor), act.cu (GELU,
 * SwiGLU, GeGLU, soft-capping, scaling, add, bias, softmax, argmax), attention.cu (paged KV store
 * and causal attention with GQA, a score scale, soft-capping, a sliding window and token trees),
 * matmul-quant.cu (products over ggml block weights, ZS_Q8_0 .. ZS_Q2_K),
 * backward.cu (the backward of all of these for training), launch.cu (the per-thread launch
 * error). */
#ifndef ZS_CUDA_KERNELS_H
#define ZS_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* launch.cu: why this thread's last launcher call returned -1 ("out of memory
 * (cudaErrorMemoryAllocation)", "attention: head_dim 300 ..."), or NULL when the last call
 * succeeded or the reason was already taken; taking it forgets it. The string is thread-local
 * storage, valid until this thread's next launcher call. */
const char *zs_cuda_take_error(void);

/* convert.cu: dst[i] = (ddt) src[i] for n elements (any pair of f32/f16/bf16; round to nearest
 * even). bf16_to_f32 is the original entry point kept for backend-cuda.c. */
int zs_cuda_launch_bf16_to_f32(const unsigned short *src, float *dst, size_t n, void *stream);
int zs_cuda_convert(void *dst, int ddt, const void *src, int sdt, size_t n, void *stream);
/* Streams `bytes` of src (16-byte aligned, bytes a multiple of 16) through the SMs and writes
 * one word to *sink: a read-bandwidth probe. */
int zs_cuda_read_probe(const void *src, size_t bytes, unsigned *sink, void *stream);

/* embed.cu: out[t, :] = tok[ids[t], :] (+ pos_tab[pos[t], :] when pos_tab != NULL), as f32;
 * tables in dtype tdt / pdt, rows of d elements: f32/f16/bf16, or a block format (ZS_Q8_0 ..
 * ZS_Q2_K; d whole blocks), dequantized with zs_to_f32's arithmetic (dequant.h). */
int zs_cuda_embed(float *out, const void *tok, int tdt, const int32_t *ids, const void *pos_tab,
                  int pdt, const int32_t *pos, int T, int d, void *stream);

/* norm.cu: y[r, :] = norm(x[rows ? rows[r] : r, :]) for r < R, y in dtype ydt, x and the
 * weights in f32 (bias may be NULL). RMSNorm: x / sqrt(mean(x^2) + eps) * w. LayerNorm:
 * (x - mean) / sqrt(var + eps) * w + b. */
int zs_cuda_rmsnorm(void *y, int ydt, const float *x, const float *w, const int32_t *rows, int R,
                    int d, float eps, void *stream);
int zs_cuda_layernorm(void *y, int ydt, const float *x, const float *w, const float *b,
                      const int32_t *rows, int R, int d, float eps, void *stream);
/* RMSNorm with a weight offset (Gemma): x / sqrt(mean(x^2) + eps) * (off + w) (zs_op_rmsnorm_off;
 * off 0: zs_cuda_rmsnorm's arithmetic exactly). The per-head norm of q and k (qk_norm) is this
 * over T * n_heads rows of head_dim. y may alias x when ydt is f32 and rows is NULL. */
int zs_cuda_rmsnorm_off(void *y, int ydt, const float *x, const float *w, float off, const int32_t *rows, int R,
                        int d, float eps, void *stream);

/* rope.cu: rotary embedding in place, HF rotate_half convention (dims i and i + hd/2 pair),
 * x is [T, n_heads * head_dim] f32 with row stride ld (elements), token t at position pos[t].
 * inv_freq: device table of head_dim/2 frequencies made by zs_cuda_rope_inv_freq (host) and
 * uploaded by the caller, who keeps it (one per head_dim and theta, e.g. per model). */
int zs_cuda_rope(float *x, int T, int ld, int n_heads, int head_dim, const int32_t *pos,
                 const float *inv_freq, void *stream);
/* Fills inv_freq[0 .. head_dim/2) (HOST memory) with 1 / theta^(2i/head_dim), computed with the
 * C library's powf exactly as the CPU ops (zs_op_rope, zs_op_rope_bwd) do. */
void zs_cuda_rope_inv_freq(float *inv_freq, int head_dim, float theta);
/* RoPE with given frequencies (zs_op_rope_freq; rope_scaling, engine/model/rope.h makes them on the
 * host): per_token 0: inv_freq is one table of head_dim/2 shared by every token (zs_cuda_rope's);
 * per_token 1: inv_freq is [T, head_dim/2], row t for token t (dynamic NTK, LongRoPE: frequencies
 * that depend on the position). cos and sin are each multiplied by attn_factor (1: exactly
 * zs_cuda_rope's arithmetic). */
int zs_cuda_rope_freq(float *x, int T, int ld, int n_heads, int head_dim, const int32_t *pos,
                      const float *inv_freq, int per_token, float attn_factor, void *stream);

/* act.cu */
/* out[i] = gelu_tanh(x[i]), out in odt, x f32 (out may alias x when odt is f32). */
int zs_cuda_gelu(void *out, int odt, const float *x, size_t n, void *stream);
/* out[i] = silu(gate[i]) * up[i], out in odt (may alias gate when odt is f32). */
int zs_cuda_swiglu(void *out, int odt, const float *gate, const float *up, size_t n, void *stream);
/* out[i] = gelu_tanh(gate[i]) * up[i] (Gemma's GeGLU, zs_op_geglu; gelu_tanh as zs_cuda_gelu), out
 * in odt (may alias gate when odt is f32). */
int zs_cuda_geglu(void *out, int odt, const float *gate, const float *up, size_t n, void *stream);
/* x[i] = cap * tanhf(x[i] / cap) in place (Gemma 2's final logit soft-capping, zs_op_softcap); cap
 * must be > 0. */
int zs_cuda_softcap(float *x, size_t n, float cap, void *stream);
/* x[i] *= s in place (Gemma's embedding scale). */
int zs_cuda_scale(float *x, size_t n, float s, void *stream);
/* y[t, i] += x[t, i] (x may be NULL) + bias[i] (bias may be NULL), for T rows of d. */
int zs_cuda_add(float *y, const float *x, const float *bias, int T, int d, void *stream);
/* In-place softmax of each of R rows of n f32 values. */
int zs_cuda_softmax(float *x, int R, int n, void *stream);
/* idx[r] = argmax of row r of x[R, n] (f32; the first index of the maximum): greedy sampling
 * on the device. */
int zs_cuda_argmax(int32_t *idx, const float *x, int R, int n, void *stream);

/* attention.cu — the paged KV cache of one layer: pool holds elements of kvdt (ZS_F32, ZS_F16 or
 * ZS_BF16), block b holds K of 16 positions at element (b*2)*16*kvd and V at (b*2+1)*16*kvd
 * (the host zs_kvcache layout). kv_store writes k[t], v[t] (f32 rows of kvd, row strides
 * ldk/ldv) at element off[t] of the pool (the K row; the V row is 16*kvd further), rounded to
 * nearest even into a 16-bit kvdt (as the host's zs_kv_write). zs_cuda_kv_store is kvdt f32. */
int zs_cuda_kv_store(float *pool, const float *k, int ldk, const float *v, int ldv,
                     const int64_t *off, int T, int kvd, void *stream);
int zs_cuda_kv_store_dt(void *pool, int kvdt, const float *k, int ldk, const float *v, int ldv,
                        const int64_t *off, int T, int kvd, void *stream);
/* Causal attention over the cache for T query tokens: token t (query row q + t*ldq, n_heads
 * heads of hd) attends positions 0..pos[t] of its sequence, whose block table is
 * tables[tab[t] ...] (block ids); tokens with the same tab[t] are of one sequence (the batch
 * keeps a sequence's tokens consecutive, as zs_batch does). GQA: query head h reads kv head
 * h / (n_heads / n_kv_heads). out[t, h*hd + i] in dtype odt, row stride n_heads*hd. scale
 * multiplies q.k. hd <= 256, n_heads a multiple of n_kv_heads, and n_kv_heads times the head
 * subgroups of a block at most 65535 (else -1 with the reason); any T.
 * Two kernels (attention.cu): impl ZS_CUDA_ATTN_SIMPLE (one block per token and kv head; the
 * original kernel), ZS_CUDA_ATTN_TILED (flash-attention style: K/V tiles in shared memory
 * shared by the queries of one sequence and kv head, online softmax in fp32), or
 * ZS_CUDA_ATTN_AUTO (tiled for tokens whose sequence has another token next to them in the
 * batch, simple for the rest: decode). zs_cuda_attention uses zs_cuda_attention_mode(): the
 * environment variable ZS_CUDA_ATTN ("simple", "tiled"; anything else or unset: auto), read
 * once per process. */
enum { ZS_CUDA_ATTN_AUTO = 0, ZS_CUDA_ATTN_SIMPLE = 1, ZS_CUDA_ATTN_TILED = 2 };
/* What a model family changes in the scores, as zs_att_params (kernels/cpu/attention.h) means it:
 *   scale:   the scores' multiplier (Gemma: query_pre_attn_scalar^-0.5); 0: 1/sqrtf(head_dim);
 *   softcap: > 0: score = softcap * tanhf(score / softcap) after the scaling (Gemma 2); else none;
 *            an infinite one is refused (-1 with the reason);
 *   window:  > 0: a sliding window, query position p sees keys p-window+1 .. p only (Mistral,
 *            Gemma, Phi-3); the K/V of positions before every window of a sequence's tokens in the
 *            call are never read (nor their block-table entries: a ring of blocks may reuse them,
 *            kvcache.h zs_kv_set_window). Else (or 2^30 and more, past every position) keys 0 .. p. */
typedef struct {
    float scale;
    float softcap;
    int window;
} zs_cuda_att_params;
int zs_cuda_attention(void *out, int odt, const float *q, int ldq, const float *pool,
                      const int32_t *tables, const int32_t *tab, const int32_t *pos, int T,
                      int n_heads, int n_kv_heads, int hd, float scale, void *stream);
int zs_cuda_attention_impl(int impl, void *out, int odt, const float *q, int ldq, const float *pool,
                           const int32_t *tables, const int32_t *tab, const int32_t *pos, int T,
                           int n_heads, int n_kv_heads, int hd, float scale, void *stream);
/* The same over a pool of kvdt elements (ZS_F32, ZS_F16, ZS_BF16; else -1 with the reason):
 * each K/V value is widened to f32 as it is loaded (exactly), then the arithmetic is the f32
 * pool's, so a 16-bit pool gives what an f32 pool of the widened values gives. */
int zs_cuda_attention_dt(int impl, void *out, int odt, const float *q, int ldq, const void *pool, int kvdt,
                         const int32_t *tables, const int32_t *tab, const int32_t *pos, int T,
                         int n_heads, int n_kv_heads, int hd, float scale, void *stream);
/* zs_cuda_attention_dt with the scale, soft-cap and window of ap (NULL: scale 1/sqrtf(hd), no cap,
 * no window). With softcap and window off it is zs_cuda_attention_dt's arithmetic exactly. */
int zs_cuda_attention_ex(int impl, void *out, int odt, const float *q, int ldq, const void *pool, int kvdt,
                         const int32_t *tables, const int32_t *tab, const int32_t *pos, int T,
                         int n_heads, int n_kv_heads, int hd, const zs_cuda_att_params *ap, void *stream);
/* Token trees (speculative decoding; the CPU's zs_att_tree, kernels/cpu/attention.h, whose mask
 * this is): per query token t, device arrays: keys at positions j < base[t] are read at cache
 * position j; keys base[t] <= j <= pos[t] at cache position path[poff[t] + j - base[t]], the slots
 * of its path (root, ..., itself). A causal token of a sequence with tree rows in the call has
 * base[t] = pos[t] + 1, one of another sequence -1. The window counts positions (j), not slots.
 * zs_cuda_attention_tree is zs_cuda_attention_ex with a tree (NULL: the same exactly); with one,
 * the tokens with base >= 0 take the simple kernel whatever impl (the tiled kernel shares a
 * sequence's keys between its rows, a tree's branches do not), so a tree row gets the bits the
 * simple kernel gives the same token decoded alone over its path; the others go as impl says.
 * zs_cuda_att_tree_plan fills base, poff, path on the host from the batch's seq and zs_batch.tree's
 * slot and parent (parent NULL or -1: causal; a sequence's tokens consecutive) and returns path's
 * length; base NULL: only the length. -1 with the reason when a parent is not an earlier row. */
typedef struct {
    const int32_t *base, *poff, *path;
} zs_cuda_att_tree;
int zs_cuda_attention_tree(int impl, void *out, int odt, const float *q, int ldq, const void *pool, int kvdt,
                           const int32_t *tables, const int32_t *tab, const int32_t *pos, int T, int n_heads,
                           int n_kv_heads, int hd, const zs_cuda_att_params *ap, const zs_cuda_att_tree *tree,
                           void *stream);
int zs_cuda_att_tree_plan(const int32_t *seq, const int32_t *pos, const int32_t *slot, const int32_t *parent, int T,
                          int32_t *base, int32_t *poff, int32_t *path);
/* The KV moves of zs_batch.tree on one layer's pool (zs_kv_copy): n moves in order, the K and V
 * rows at element offset from[i] (the K row's, as kv_store's off) copied bit for bit to to[i]. */
int zs_cuda_kv_copy(void *pool, int kvdt, const int64_t *from, const int64_t *to, int n, int kvd, void *stream);
int zs_cuda_attention_mode(void);
const char *zs_cuda_attention_mode_name(int mode); /* "auto", "simple", "tiled" */

/* matmul-quant.cu — y = x . W^T over W[R, in] in a block format wdt (ZS_Q8_0, ZS_Q4_0, ZS_Q4_1,
 * ZS_Q5_0, ZS_Q5_1: blocks of 32; the K-quants ZS_Q4_K, ZS_Q6_K, ZS_Q5_K, ZS_Q3_K, ZS_Q2_K:
 * super-blocks of 256; in whole blocks), the
 * bytes as stored (tensor.h), rows of zs_dtype_bytes(wdt, in) bytes back to back at any byte
 * alignment.
 * zs_cuda_qgemv: the fused kernel for a few tokens (1 <= T <= ZS_CUDA_QGEMV_MAX_T): x [T, in] f32
 * (row stride in), y[t*ldy + j] = dot(row j, x[t]) (+ beta * y[t*ldy + j], read only when beta
 * != 0) for j < R, the bits of zs_op_matmul (the CPU kernel's order and dequantization; the same
 * whatever T and whatever rows are in the call).
 * zs_cuda_dequant: out [R, in] in odt (f32, f16, bf16; round to nearest even) = the weights as f32
 * (zs_to_f32's values) rounded to odt: what prefill multiplies with cuBLAS. */
#define ZS_CUDA_QGEMV_MAX_T 8
int zs_cuda_qgemv(float *y, int ldy, const float *x, int T, int in, const void *W, int wdt, int R,
                  float beta, void *stream);
int zs_cuda_dequant(void *out, int odt, const void *W, int wdt, int R, int in, void *stream);

/* backward.cu — the backward of the forward ops for training, matching the CPU ops of
 * kernels/cpu/train-ops.h (the reference: same formulas, same conventions). All f32. Gradients of
 * inputs and parameters ACCUMULATE (+=) unless a function says it WRITES (=). Every kernel is
 * deterministic (no atomics: each output has one writer, reductions run in a fixed order). */

/* RMSNorm backward over T contiguous rows of d, recomputing the statistics from x:
 * dx += dL/dx; dw += sum_t dy*x*rstd (dw may be NULL). stats: 2*T floats of device scratch,
 * needed only when dw is not NULL (else it may be NULL). */
int zs_cuda_rmsnorm_bwd(float *dx, float *dw, const float *dy, const float *x, const float *w, int T,
                        int d, float eps, float *stats, void *stream);
/* Backward of zs_cuda_rmsnorm_off (zs_op_rmsnorm_off_bwd): dx as zs_cuda_rmsnorm_bwd with the weight
 * (off + w) (off 0: exactly zs_cuda_rmsnorm_bwd); dw += sum_t dy*x*rstd. */
int zs_cuda_rmsnorm_off_bwd(float *dx, float *dw, const float *dy, const float *x, const float *w, float off,
                            int T, int d, float eps, float *stats, void *stream);
/* LayerNorm backward: dx += dL/dx; dw += sum_t dy*xhat, db += sum_t dy (dw, db may be NULL;
 * stats as for RMSNorm, needed when dw is not NULL). */
int zs_cuda_layernorm_bwd(float *dx, float *dw, float *db, const float *dy, const float *x,
                          const float *w, int T, int d, float eps, float *stats, void *stream);
/* RoPE backward in place (the rotation by -angle), the layout and inv_freq table of
 * zs_cuda_rope. */
int zs_cuda_rope_bwd(float *dx, int T, int ld, int n_heads, int head_dim, const int32_t *pos,
                     const float *inv_freq, void *stream);
/* Backward of zs_cuda_rope_freq (zs_op_rope_freq_bwd) in place: dx <- R^T dx, R the forward's map (the
 * rotation with cos and sin times attn_factor); inv_freq and per_token as zs_cuda_rope_freq's. */
int zs_cuda_rope_freq_bwd(float *dx, int T, int ld, int n_heads, int head_dim, const int32_t *pos,
                          const float *inv_freq, int per_token, float attn_factor, void *stream);
/* SwiGLU backward: WRITES dgate = dy*up*silu'(gate), dup = dy*silu(gate) (either may alias dy,
 * not each other). */
int zs_cuda_swiglu_bwd(float *dgate, float *dup, const float *dy, const float *gate, const float *up,
                       size_t n, void *stream);
/* GELU (tanh) backward, x the pre-activation: WRITES dx = dy*gelu'(x) (dx may alias dy). */
int zs_cuda_gelu_bwd(float *dx, const float *dy, const float *x, size_t n, void *stream);
/* GeGLU backward (zs_op_geglu_bwd): WRITES dgate = dy*up*gelu'(gate), dup = dy*gelu(gate) (either may
 * alias dy, not each other). */
int zs_cuda_geglu_bwd(float *dgate, float *dup, const float *dy, const float *gate, const float *up,
                      size_t n, void *stream);
/* Soft-cap backward from the forward's OUTPUT y = cap*tanh(x/cap) (zs_op_softcap_bwd): WRITES
 * dx = dy*(1 - (y/cap)^2) (dx may alias dy); cap > 0. */
int zs_cuda_softcap_bwd(float *dx, const float *dy, const float *y, size_t n, float cap, void *stream);
/* Residual add backward: dx[i] += dy[i]. */
int zs_cuda_add_bwd(float *dx, const float *dy, size_t n, void *stream);
/* Embedding backward: dtable[ids[t], :] += dy[t, :] for t < T (ids in range, may repeat), in
 * token order per row (deterministic; O(T^2) id comparisons, one block per token). */
int zs_cuda_embed_bwd(float *dtable, const float *dy, const int32_t *ids, int T, int d, void *stream);
/* Next-token cross-entropy of logits[T, V] against targets[T] (negative = masked row).
 * WRITES row_loss[t] = logsumexp(row) - row[target] (0 for masked rows; T floats, required),
 * *loss = sum of row_loss in double when loss is not NULL (device memory), and, when dlogits is
 * not NULL, dlogits = scale*(softmax(row) - onehot(target)), 0 on masked rows (may alias
 * logits). Targets must be < V. */
int zs_cuda_cross_entropy(float *dlogits, float *row_loss, double *loss, const float *logits,
                          const int32_t *targets, int T, int V, float scale, void *stream);
/* Causal self-attention backward over ONE sequence of T tokens (zs_op_attention_bwd): q, dout
 * [T, n_heads*hd], k, v [T, n_kv_heads*hd], scale 1/sqrt(hd); dq, dk, dv += (same shapes). The
 * probabilities are recomputed from q and k. stats: 3*T*n_heads floats of device scratch.
 * hd <= 256, n_heads a multiple of n_kv_heads (else -1). */
int zs_cuda_attention_bwd(float *dq, float *dk, float *dv, const float *dout, const float *q,
                          const float *k, const float *v, int T, int n_heads, int n_kv_heads, int hd,
                          float *stats, void *stream);
/* The same with the scale, soft-cap and sliding window of ap (zs_op_attention_bwd with zs_att_params;
 * NULL or all zero: zs_cuda_attention_bwd exactly). Through the soft-cap, ds is multiplied by
 * 1 - tanh^2 of the scaled score. */
int zs_cuda_attention_bwd_ex(float *dq, float *dk, float *dv, const float *dout, const float *q,
                             const float *k, const float *v, int T, int n_heads, int n_kv_heads, int hd,
                             const zs_cuda_att_params *ap, float *stats, void *stream);
/* Matrix product backward of y[T,out] = x[T,in]*W[out,in]^T + b through cuBLAS (fp32 compute,
 * no TF32): dx += dy*W (skipped when dx is NULL), dW += dy^T*x (f32; skipped when NULL),
 * db += column sums of dy (skipped when NULL). W in wdt; when wdt is f16/bf16 and dx is wanted,
 * W is converted ZS_CUDA_MATMUL_BWD_ROWS rows at a time into wscratch
 * (ZS_CUDA_MATMUL_BWD_ROWS * in floats; unused for f32). cublas is a cublasHandle_t that must
 * already be bound to stream (cublasSetStream; -1 otherwise). */
#define ZS_CUDA_MATMUL_BWD_ROWS 2048
int zs_cuda_matmul_bwd(void *cublas, float *dx, float *dW, float *db, const float *dy, const float *x,
                       const void *W, int wdt, int T, int in, int out, float *wscratch, void *stream);

#ifdef __cplusplus
}
#endif

#endif
