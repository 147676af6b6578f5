/* ops.h — the numeric operations of the forward pass on the CPU (fp32 activations).
 * Matrix products (matmul.c) are batch-invariant and multi-threaded; weights may be f32, f16 or
 * bf16 (converted block by block into a per-thread scratch buffer). All functions are
 * thread-safe and do not allocate on the hot path after the first call. */
#ifndef ZS_OPS_H
#define ZS_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "tensor.h"

/* y[T,out] = x[T,in] · W[out,in]^T (+ bias[out] when bias != NULL). W in dtype wdt (a block
 * format, Q8_0/Q4_0/Q4_1/Q5_0/Q5_1: rows of in/32 blocks, in a multiple of 32). Row t of y depends only on row
 * t of x (bit for bit), never on T or the other rows. */
void zs_op_matmul(float *y, const float *x, int T, int in, const void *W, zs_dtype wdt, int out,
                  const float *bias);
/* LoRA's row kernels over transposed adapter matrices (lora-kern.h; AVX2+FMA or generic, the same
 * bits), At = Aᵀ [in, r] and Bt = Bᵀ [r, out] in f32, or bf16 when bf16 is set (widened exactly):
 * u[i][k] = s · Σ_j x[i][j]·At[j*r + k] for k < r and n <= 4 rows, and y[o] += Σ_k u[k]·Bt[k*out + o]
 * for o in [o0, o1); each element one fused multiply-add chain in index order. */
void zs_op_lora_down4(float *const *u, const float *const *x, int n, const void *At, int bf16, int in, int r, float s);
void zs_op_lora_up(float *y, const float *u, const void *Bt, int bf16, int r, int out, int o0, int o1);
/* y[T,d] = x / rms(x) * w, per row (w in f32). y may alias x. */
void zs_op_rmsnorm(float *y, const float *x, const float *w, int T, int d, float eps);
/* The same with the weight offset of Gemma's RMSNorm: y = x / rms(x) * (off + w) (off 0: bit for bit
 * zs_op_rmsnorm). y may alias x. */
void zs_op_rmsnorm_off(float *y, const float *x, const float *w, int T, int d, float eps, float off);
/* y[T,d] = (x - mean) / sqrt(var + eps) * w + b, per row. y may alias x. */
/* The statistics of one LayerNorm row: its mean and 1/sqrt(variance + eps) (the forward and
 * the backward share them, so both see the same bits). */
void zs_op_layernorm_stats(const float *x, int d, float eps, float *mean, float *rstd);
void zs_op_layernorm(float *y, const float *x, const float *w, const float *b, int T, int d,
                     float eps);
/* Rotary embedding, Hugging Face rotate_half convention: dims i and i+hd/2 form a pair.
 * x is [n_heads * head_dim] for one token at position pos. */
void zs_op_rope(float *x, int n_heads, int head_dim, int pos, float theta);
/* RoPE with given frequencies (rope.h: zs_rope_freqs): the pair (i, i + hd/2) of every head
 * rotated by angle pos·inv_freq[i] (a float product), cos and sin (cosf, sinf) each multiplied by
 * attn_factor (1: bit for bit zs_op_rope when inv_freq is the default table). */
void zs_op_rope_freq(float *x, int n_heads, int head_dim, int pos, const float *inv_freq, float attn_factor);
/* x[i] = cap · tanhf(x[i] / cap) (Gemma 2's logit soft-capping) */
void zs_op_softcap(float *x, size_t n, float cap);
/* out[i] = gelu_tanh(gate[i]) * up[i] (Gemma's GeGLU; gelu_tanh as zs_op_gelu); out may alias gate */
void zs_op_geglu(float *out, const float *gate, const float *up, size_t n);
/* x[i] = gelu_tanh(x[i]) */
void zs_op_gelu(float *x, size_t n);
/* out[i] = silu(gate[i]) * up[i] */
void zs_op_swiglu(float *out, const float *gate, const float *up, size_t n);
/* y[i] += x[i] */
void zs_op_add(float *y, const float *x, size_t n);
/* In-place softmax over n values. */
void zs_op_softmax(float *x, int n);
/* out[d] = row `id` of table[rows, d] (any dtype; a block format needs d a multiple of 32),
 * converted (dequantized) to f32. */
void zs_op_embed(float *out, const void *table, zs_dtype dt, int d, int id);

#endif
