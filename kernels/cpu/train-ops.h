/* train-ops.h — the CPU operations that training adds to the forward ops of ops.h: the backward
 * of every forward op (matmul, RMSNorm, LayerNorm, RoPE, causal attention with GQA, SwiGLU,
 * GELU tanh, embedding, residual add) and next-token cross-entropy with a mask, plus the
 * training forward of causal attention over one whole sequence (no KV cache).
 * Implemented in kernels/cpu/ops-backward.c. Activations and gradients are f32; weights may be
 * f32, f16 or bf16 (zs_op_matmul_bwd's dx also reads the block formats: LoRA over a quantized base).
 *
 * Conventions. Gradients of inputs and parameters ACCUMULATE (+=) into the caller's buffers
 * unless a function says it writes (=): the caller zeroes what must start from zero. This is
 * what lets a residual stream, several consumers of one tensor (q, k and v all read the normed
 * x; a tied head and the embedding share one table) and micro-batch accumulation add up.
 * Outputs never alias inputs unless stated. All functions are thread-safe; none allocates on the
 * hot path (the matrix products keep one packing buffer per thread, made on its first use).
 *
 * Determinism: every result is a fixed function of the inputs, the same bits whatever the
 * thread count (ZS_THREADS, OPENBLAS_NUM_THREADS), the core affinity or the process layout;
 * no op uses BLAS. The matrix products run on the kernel pool with our own fixed-order kernel
 * (kernels/cpu/matmul-bwd-kern.h); every other sum here runs on one thread in a fixed order. */
#ifndef ZS_TRAIN_OPS_H
#define ZS_TRAIN_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "attention.h" /* zs_att_params: scale, soft-cap and sliding window, as the inference attention */
#include "tensor.h"

/* Rows of W converted per block when W is not f32 (f16/bf16, or a block format Q8_0 .. Q2_K, whose
 * rows are whole blocks: in a multiple of the block): a scratch of ZS_MATMUL_BWD_BLOCK * in floats
 * is needed then (none for f32 weights). */
#define ZS_MATMUL_BWD_BLOCK 256

/* Backward of y[T,out] = x[T,in]·W[out,in]ᵀ + b:
 *   dx[T,in]   += dy·W      (skipped when dx is NULL)
 *   dW[out,in] += dyᵀ·x     (f32; skipped when dW is NULL)
 *   db[out]    += Σ_t dy    (skipped when db is NULL)
 * W is in dtype wdt (any dtype: block formats are dequantized with zs_to_f32, so dx is the product
 * with the dequantized weights; dW is f32 and meaningful only to callers that train W);
 * wscratch (ZS_MATMUL_BWD_BLOCK * in floats) is used only when wdt != f32.
 * The order of the sums is fixed (tests/test-matmul-bwd.c checks it bit for bit): an element
 * of dx (sum over o) or dW (sum over t) adds, in order, one float partial sum per block of 256
 * consecutive k from k = 0, each a chain s = fmaf(a_k, b_k, s) from s = 0 in k order;
 * db[o] += (float)(the double sum over t in order). */
void zs_op_matmul_bwd(float *dx, float *dW, float *db, const float *dy, const float *x, const void *W,
                      zs_dtype wdt, int T, int in, int out, float *wscratch);

/* Backward of zs_op_rmsnorm (y = x / rms(x) * w), recomputing the statistics from x:
 * dx[T,d] += ∂L/∂x, dw[d] += Σ_t dy·x/rms (dw may be NULL). */
void zs_op_rmsnorm_bwd(float *dx, float *dw, const float *dy, const float *x, const float *w, int T, int d,
                       float eps);

/* Backward of zs_op_rmsnorm_off (y = x / rms(x) * (off + w)): as zs_op_rmsnorm_bwd with the
 * weight (off + w); dw[d] += Σ_t dy·x/rms (dw may be NULL). */
void zs_op_rmsnorm_off_bwd(float *dx, float *dw, const float *dy, const float *x, const float *w, int T, int d,
                           float eps, float off);

/* Backward of zs_op_layernorm (y = (x-mean)/sqrt(var+eps)·w + b), recomputing the statistics:
 * dx += ∂L/∂x, dw += Σ_t dy·x̂, db += Σ_t dy (dw, db may be NULL). */
void zs_op_layernorm_bwd(float *dx, float *dw, float *db, const float *dy, const float *x, const float *w,
                         int T, int d, float eps);

/* Backward of zs_op_rope for one token at position pos (rotate_half pairs i, i+hd/2): turns the
 * gradient with respect to the rotated vector into the gradient with respect to the input, IN
 * PLACE (the transpose of a rotation is the rotation by -angle). */
void zs_op_rope_bwd(float *dx, int n_heads, int head_dim, int pos, float theta);

/* Backward of zs_op_rope_freq (the same frequencies and factor), IN PLACE: dx ← Rᵀ dx, where R is
 * the forward's map (a rotation scaled by attn_factor). */
void zs_op_rope_freq_bwd(float *dx, int n_heads, int head_dim, int pos, const float *inv_freq, float attn_factor);

/* Backward of zs_op_softcap given its OUTPUT y (y = cap·tanh(x/cap)): WRITES dx[i] = dy[i]·(1 - (y/cap)²).
 * dx may alias dy. */
void zs_op_softcap_bwd(float *dx, const float *dy, const float *y, size_t n, float cap);

/* Backward of zs_op_geglu (out = gelu_tanh(gate)·up): WRITES dgate = dy·up·gelu'(gate) and
 * dup = dy·gelu(gate). dgate/dup may alias dy (not each other). */
void zs_op_geglu_bwd(float *dgate, float *dup, const float *dy, const float *gate, const float *up, size_t n);

/* Training forward of causal self-attention over ONE sequence of T tokens (positions 0..T-1):
 * q[T, nh*hd], k/v[T, nkv*hd], query head h uses kv head h / (nh/nkv); out[T, nh*hd] is
 * WRITTEN. Scalar (scale 1/sqrt(hd) after the dot product, zs_op_softmax, weighted sum in key
 * order), the same math as the inference attention (attention.h) but not its SIMD order: no
 * test ties training logits to inference ones bit for bit. ap (NULL: plain): the scale, soft-cap
 * and sliding window of zs_att_params, with the same meaning. scratch: T floats. */
void zs_op_attention_fwd(float *out, const float *q, const float *k, const float *v, int T, int nh, int nkv,
                         int hd, float *scratch, const zs_att_params *ap);
/* Its backward: dq, dk, dv += (same shapes as q, k, v). The probabilities are recomputed row by
 * row from q and k (nothing of size T² is stored). scratch: 2*T floats. */
void zs_op_attention_bwd(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                         const float *v, int T, int nh, int nkv, int hd, float *scratch, const zs_att_params *ap);

/* Backward of zs_op_swiglu (out = silu(gate)·up): WRITES dgate[i] = dy·up·silu'(gate) and
 * dup[i] = dy·silu(gate). dgate/dup may alias dy (not each other). */
void zs_op_swiglu_bwd(float *dgate, float *dup, const float *dy, const float *gate, const float *up, size_t n);

/* Backward of zs_op_gelu (tanh approximation), x = the pre-activation input: WRITES
 * dx[i] = dy[i]·gelu'(x[i]). dx may alias dy. */
void zs_op_gelu_bwd(float *dx, const float *dy, const float *x, size_t n);

/* Backward of a residual add y = x + f(x): the incoming gradient flows unchanged to both
 * branches, so dx[i] += dy[i] (the same arithmetic as zs_op_add). */
void zs_op_add_bwd(float *dx, const float *dy, size_t n);

/* Backward of zs_op_embed over T rows: dtable[ids[t], :] += dy[t, :] (scatter-add; ids must be
 * in range, rows may repeat). */
void zs_op_embed_bwd(float *dtable, const float *dy, const int32_t *ids, int T, int d);

/* Next-token cross-entropy of T rows of logits[T, V] against targets[T] (a negative target
 * masks its row). Returns Σ over counted rows of (logsumexp(row) - row[target]), in double.
 * When dlogits is not NULL it is WRITTEN with scale·(softmax(row) - onehot(target)) for counted
 * rows and 0 for masked ones (for a mean loss, scale = 1/number of counted targets of the whole
 * batch). dlogits may alias logits. Targets must be < V. */
double zs_op_cross_entropy(float *dlogits, const float *logits, const int32_t *targets, int T, int V,
                           float scale);

#endif
