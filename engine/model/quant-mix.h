/* quant-mix.h — per-tensor block formats of llama.cpp's mixed quantization types: which dtype
 * each matrix of a model gets under Q4_K_M (llama-quantize's LLAMA_FTYPE_MOSTLY_Q4_K_M without an
 * importance matrix, llama_tensor_get_type as of llama-cpp-python 0.3.36's llama.cpp). Used by
 * the loader (--weight-dtype q4_k_m, model.c)
 * and by whoever writes such a GGUF file, so both make the same choice for every tensor.
 * Pure functions of their arguments, thread-safe. */
#ifndef ZS_QUANT_MIX_H
#define ZS_QUANT_MIX_H

#include <stdint.h>

#include "tensor.h"

/* zs_model_opts.quant_mix: none, or the Q4_K_M mix (with weight_dtype ZS_Q4_K) */
enum { ZS_QUANT_MIX_NONE = 0, ZS_QUANT_MIX_Q4_K_M = 1 };

/* flags of zs_quant_mix_q4_k_m */
enum {
    ZS_QMIX_TIED = 1,      /* the token table is also the LM head (there is no output.weight) */
    ZS_QMIX_FUSED_QKV = 2, /* Q, K and V are one tensor in the file (GPT-2's and Phi-3's attn_qkv) */
    ZS_QMIX_EXPERTS8 = 4,  /* a mixture of exactly 8 experts (llama-quantize's n_expert == 8 rules) */
    ZS_QMIX_70B = 8,       /* llama.cpp takes the model for a 70B one (zs_quant_mix_is_70b) */
};

/* 1 when llama.cpp's loader gives the model LLM_TYPE_70B, the one size its quantizer has a rule
 * for: llama's architecture (the llama, mistral and mixtral families) with 80 layers, fewer KV
 * heads than heads and not exactly 8 experts (those are sized as Mixtrals), or qwen2 with 80
 * layers (family: config.h's zs_family) */
int zs_quant_mix_is_70b(int family, int n_layers, int n_heads, int n_kv_heads, int n_experts);

/* llama.cpp's use_more_bits(i, n): layer i of n gets more bits under the _M mixes — the first
 * eighth, the last eighth, and every third layer between: i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2
 * (integer division) */
int zs_quant_mix_more_bits(int layer, int n_layers);

/* The dtype of one tensor under Q4_K_M. The tensor is named by model.h's role in its bucket:
 * layer -1 the embedding bucket (ZS_R_TOK_EMB, ZS_R_POS_EMB), 0..n_layers-1 a transformer block
 * (ZS_R_WQ .. ZS_R_B_DOWN), n_layers the head bucket (ZS_R_OUT_NORM_W/B, ZS_R_LM_HEAD); row_len
 * is its row length (GGUF ne[0]; the `in` of an [out, in] matrix). The choice, as llama.cpp's:
 *   - LM head (output.weight), and the token table of a tied model: Q6_K (Q8_0 when row_len is
 *     not a multiple of 256; F16 when not even of 32, where llama-quantize gives up);
 *   - attention V (attn_v) and FFN down (ffn_down): Q6_K in the layers zs_quant_mix_more_bits
 *     picks, Q4_K in the others; with ZS_QMIX_70B attn_v Q5_K instead of Q4_K;
 *   - a fused attn_qkv (ZS_QMIX_FUSED_QKV: GPT-2's and Phi-3's, its Q, K and V roles): attn_v's
 *     rule (llama.cpp counts attn_qkv among the attn_v-like tensors, and that rule comes first; its
 *     own Q5_K rule for attn_qkv is never reached);
 *   - every other matrix (attn_q, attn_k, attn_output, ffn_gate, ffn_up, an untied token_embd): Q4_K;
 *   - mixtures of experts: an expert's matrices (its bucket's ZS_R_W_GATE / W_UP / W_DOWN; pass the
 *     expert's layer) and Qwen2-MoE's shared expert (the layer bucket's W_GATE / W_UP / W_DOWN) follow
 *     ffn_gate / ffn_up / ffn_down's rules (llama-quantize matches ffn_down_exps and ffn_down_shexp as
 *     "ffn_down", with the layer read from the name); the router (ZS_R_ROUTER, ffn_gate_inp) and the
 *     shared expert's gate (ZS_R_SHARED_GATE, one row: 1-D to llama-quantize) are not quantized;
 *     with ZS_QMIX_EXPERTS8 (exactly 8 experts, as Mixtral) attn_v, attn_k (and a fused attn_qkv)
 *     are Q8_0 and attn_output Q5_K;
 *   - rows that are not a multiple of 256 fall back as llama-quantize does: Q4_K -> Q5_0,
 *     Q5_K -> Q5_1, Q6_K -> Q8_0, and F16 when row_len is not a multiple of 32 either (also for a
 *     Q8_0 choice, which llama-quantize refuses then);
 *   - not quantized (norms, biases, GPT-2's position table, llama.cpp's pos_embd, the routers): ZS_F32.
 * Not covered (no such models here): Falcon's rules. ZS_DTYPE_COUNT for a role or layer outside
 * those ranges. */
zs_dtype zs_quant_mix_q4_k_m(int layer, int role, int n_layers, int64_t row_len, unsigned flags);

#endif
