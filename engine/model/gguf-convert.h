/* gguf-convert.h — a Hugging Face model directory (config.json + safetensors, an architecture the
 * engine loads: Llama/Mistral, Qwen2, Qwen3, Gemma 2, Gemma 3, Phi-3, GPT-2, and the mixtures of
 * experts Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE) as the hyperparameters and tensors of a GGUF file for
 * llama.cpp, the way its convert_hf_to_gguf.py (f32, f16, bf16, q8_0) and, from an f32 conversion,
 * llama-quantize (q4_0, q4_1, q5_0, q5_1, q4_k_m) write them. The tokenizer is not here (engine/text
 * has it as arrays; the caller adds its keys).
 *
 * Architectures (general.architecture): llama (Llama, Mistral, and Mixtral: llama with experts),
 * qwen2, qwen3, gemma2, gemma3, phi3, gpt2, qwen2moe, qwen3moe, olmoe. Tensors: llama.cpp's names
 * (token_embd.weight, blk.N.attn_q.weight, ..., output_norm.weight, output.weight — absent when the
 * head is tied) in GGUF dim order (ne[0] = the row length).
 * Llama's Q and K rows (and biases) are permuted per head from Hugging Face's rotate_half order
 * to the interleaved order, as convert_hf_to_gguf.py's LlamaModel.permute does (model.c undoes it
 * when loading); the other architectures are stored unpermuted; GPT-2's Conv1D weights are
 * transposed and its q, k, v fused into attn_qkv. Per family, as the converter's model classes:
 *   - Qwen3, Gemma 3: blk.N.attn_q_norm / attn_k_norm; Gemma 2/3: post_attention_norm, ffn_norm (the
 *     pre-feedforward norm), post_ffw_norm, and every norm weight written + 1 (in f16 for an F16
 *     checkpoint, else in f32, as torch adds it), Gemma 2 always tied (lm_head dropped);
 *   - Phi-3: qkv_proj and gate_up_proj kept fused (blk.N.attn_qkv, blk.N.ffn_up of 2 x ffn rows);
 *   - mixtures of experts (every layer sparse; see below): blk.N.ffn_gate_inp.weight (the router,
 *     [dim, n_experts]), blk.N.ffn_{gate,up,down}_exps.weight (the experts stacked: ne [dim, moe_ffn,
 *     n_experts] for gate and up, [moe_ffn, dim, n_experts] for down; numpy's [n_experts, out, in], as
 *     the converter's torch.stack); Qwen2-MoE's shared expert blk.N.ffn_{gate,up,down}_shexp.weight and
 *     its gate blk.N.ffn_gate_inp_shexp.weight (ne [dim, 1], HF's [1, dim]); OLMoE's attn_q_norm /
 *     attn_k_norm over the whole projection ([n_heads * head_dim]); Mixtral's Q and K permuted as
 *     Llama's. Qwen2-MoE and OLMoE with a tied head get output.weight as a copy of the token table
 *     (llama.cpp's qwen2moe and olmoe require one; the converter would write a file it cannot load);
 *   - Llama 3 RoPE: rope_freqs.weight (per-frequency divisors, LlamaModel.generate_extra_tensors, from
 *     rope_scaling's original_max_position_embeddings); LongRoPE (Phi-3): rope_factors_long/short.weight.
 * Keys: <arch>.context_length, embedding_length, block_count, feed_forward_length,
 * attention.head_count, head_count_kv, layer_norm_rms_epsilon, rope.freq_base, key/value_length
 * (Phi-3: only when not dim / heads), rope.dimension_count and vocab_size (llama; phi3 the former);
 * Gemma 2 attn_logit_softcapping, final_logit_softcapping; Gemma 2/3 and Phi-3
 * attention.sliding_window; RoPE scaling: linear (rope.scaling.type, factor), yarn (type, factor,
 * original_context_length, and attn_factor when the checkpoint's attention factor is not YaRN's
 * default), Phi-3 rope.scaling.original_context_length and attn_factor; mixtures of experts:
 * expert_count, expert_used_count (all four), expert_feed_forward_length (qwen2moe, qwen3moe),
 * expert_shared_feed_forward_length (qwen2moe), and feed_forward_length the expert size for llama
 * and olmoe (their loaders shape the experts by it), intermediate_size for qwen2moe / qwen3moe (as
 * the converters write them); no expert_weights_norm or gating keys: llama.cpp 0.3.16 hard-codes
 * softmax routing and the renormalisation per architecture (llama, qwen3moe: on; qwen2moe, olmoe:
 * off). OLMoE's layer_norm_rms_epsilon is the checkpoint's (OlmoeModel writes 1e-5, OLMoE's
 * default, whatever the checkpoint says). llama.cpp reads the rope.scaling keys for every
 * architecture; its converter writes them only for some (linear: llama, gemma3; yarn: qwen2/3):
 * here for every one, so that a scaling is not lost (and Gemma 2's rope.freq_base, which its
 * converter leaves to llama.cpp's default 10000). What llama.cpp (llama-cpp-python 0.3.16's) cannot
 * represent is refused (ZS_EUNSUPPORTED, naming it): dynamic NTK; llama3 scaling outside llama,
 * LongRoPE outside phi3, YaRN on gemma3/phi3 or with beta_fast/beta_slow/truncate other than
 * 32/1/true; attention biases outside llama/qwen2 (qwen2moe: q, k and v ones); Gemma's
 * query_pre_attn_scalar other than llama.cpp's hard-coded head_dim (dim / heads for the 27B sizes),
 * no sliding window or layers other than its every-2nd / every-6th full one; Gemma 2 untied or
 * without both softcaps; Gemma 3 with softcapping, a local RoPE base other than 10000, or
 * non-linear scaling; mixtures of experts with a dense layer (decoder_sparse_step, mlp_only_layers:
 * llama.cpp's loaders make every layer sparse), more than 384 experts (LLAMA_MAX_EXPERTS), a
 * renormalisation (norm_topk_prob) other than the architecture's hard-coded one, Qwen2-MoE without
 * a shared expert or with an output-projection bias, Qwen3-MoE or OLMoE with attention biases,
 * OLMoE with clip_qkv or fewer KV heads than heads (llama.cpp's olmoe k_norm is [dim]), Qwen2-MoE /
 * OLMoE with heads x head_dim other than dim (their attn_q / attn_output are [dim, dim] there).
 * A sliding window of llama (Mistral, Mixtral), qwen2, qwen3, qwen2moe or qwen3moe shorter than the
 * context is dropped with a warning, as convert_hf_to_gguf.py does (llama.cpp's architectures have
 * none).
 *
 * Types: 1-D tensors (norms, biases, RoPE factors), GPT-2's position table and the MoE routers
 * (ffn_gate_inp) stay F32. Matrices (the stacked experts too: they are quantized row by row) take
 * the file type's block format, except
 *   - Qwen2-MoE's shared-expert gate ffn_gate_inp_shexp ([dim, 1]): the file type's for f16, bf16,
 *     q8_0 (convert_hf_to_gguf.py quantizes it as a matrix), F32 for the llama-quantize types (a
 *     tensor of one row is 1-D to llama-quantize, which leaves it as the f32 conversion has it);
 *   - llama-quantize types with exactly 8 experts (its Mixtral rules): attn_v, attn_k (and a fused
 *     attn_qkv) Q8_0, and under q4_k_m attn_output Q5_K (Q5_1 where llama-quantize falls back);
 *   - q4_0 .. q5_1 and q4_k_m: output.weight, or token_embd.weight of a tied model, is Q6_K (Q8_0
 *     when its rows are not a multiple of 256), as llama-quantize does;
 *   - q4_k_m: llama-quantize's mix (quant-mix.h, the loader's too; llama-cpp-python 0.3.36's
 *     llama.cpp) — Q6_K for attn_v and ffn_down of the layers use_more_bits picks (the first and
 *     last eighth and every third between), Q4_K elsewhere (attn_v Q5_K there for what llama.cpp
 *     takes for a 70B model); ffn_down_exps and ffn_down_shexp as ffn_down (llama-quantize matches
 *     "ffn_down" and takes the layer from the name), the other expert matrices Q4_K; GPT-2's and
 *     Phi-3's fused attn_qkv as attn_v (llama-quantize counts it among the attn_v-like tensors);
 *   - rows that are not a multiple of the block: q8_0 .. q5_1 fall back to F16 (convert_hf_to_gguf
 *     .py's rule for q8_0; llama-quantize refuses such tensors for these types); K-quants as
 *     llama-quantize does, Q4_K -> Q5_0, Q5_K -> Q5_1 and Q6_K -> Q8_0, then F16.
 * Values are read as f32 from the checkpoint (F32, F16 or BF16) and converted once: quantizing
 * from the checkpoint's own values, as llama-quantize does from an f32 conversion.
 *
 * Ownership: a zs_gguf_conv keeps the checkpoint mapped (read only, pages released tensor by
 * tensor as they are written) until zs_gguf_conv_close. Used by one thread at a time (writing
 * converts chunks of rows on the CPU worker pool, kernels/cpu/pool.h; rows are independent, so
 * the bytes do not depend on the thread count). */
#ifndef ZS_GGUF_CONVERT_H
#define ZS_GGUF_CONVERT_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "gguf-write.h"
#include "gguf.h"

/* llama.cpp's llama_ftype numbers (general.file_type). */
typedef enum {
    ZS_FTYPE_ALL_F32 = 0,
    ZS_FTYPE_MOSTLY_F16 = 1,
    ZS_FTYPE_MOSTLY_Q4_0 = 2,
    ZS_FTYPE_MOSTLY_Q4_1 = 3,
    ZS_FTYPE_MOSTLY_Q8_0 = 7,
    ZS_FTYPE_MOSTLY_Q5_0 = 8,
    ZS_FTYPE_MOSTLY_Q5_1 = 9,
    ZS_FTYPE_MOSTLY_Q4_K_M = 15,
    ZS_FTYPE_MOSTLY_BF16 = 32,
} zs_llama_ftype;

/* "f32" "f16" "bf16" "q8_0" "q4_0" "q4_1" "q5_0" "q5_1" "q4_k_m" (either case) -> ftype;
 * ZS_EINVAL naming the accepted names otherwise. */
int zs_llama_ftype_parse(const char *name, zs_llama_ftype *out);
const char *zs_llama_ftype_name(zs_llama_ftype f); /* "f32", ..., "q4_k_m"; "?" for others */

typedef struct {
    char name[64];
    zs_ggml_type type;
    int n_dims;         /* 1, 2, or 3 (stacked experts: ne[2] = n_experts) */
    int64_t ne[3];      /* GGUF order */
    const char *note;   /* why the type is not the file type's, or NULL (a static string) */
} zs_gguf_conv_tensor;

typedef struct zs_gguf_conv zs_gguf_conv;

/* Reads and validates the directory (config.json and every tensor, as zs_model_open does) and
 * chooses each output tensor's type; reads no weight data. Errors of zs_model_open, and
 * ZS_EUNSUPPORTED for what cannot be converted (a GGUF file as input; Llama MLP biases, which
 * zeroserve's GGUF reader does not read back; what llama.cpp cannot represent, above). */
int zs_gguf_conv_open(const char *dir, zs_llama_ftype ftype, zs_gguf_conv **out);
void zs_gguf_conv_close(zs_gguf_conv *c);

const zs_model_config *zs_gguf_conv_config(const zs_gguf_conv *c);
/* general.architecture: llama (Llama, Mistral, Mixtral), qwen2, qwen3, gemma2, gemma3, phi3, gpt2,
 * qwen2moe, qwen3moe, olmoe */
const char *zs_gguf_conv_arch(const zs_gguf_conv *c);
size_t zs_gguf_conv_count(const zs_gguf_conv *c);
const zs_gguf_conv_tensor *zs_gguf_conv_at(const zs_gguf_conv *c, size_t i);
/* Total bytes of tensor data (unpadded). */
uint64_t zs_gguf_conv_data_bytes(const zs_gguf_conv *c);

/* Adds general.architecture, general.type, general.name (name; NULL: the directory's base name),
 * general.file_type, general.quantization_version, general.alignment and the <arch>.* keys. */
int zs_gguf_conv_put_meta(const zs_gguf_conv *c, zs_gguf_writer *w, const char *name);
/* Declares every tensor, then streams their data (8 MiB of rows at a time; never a whole tensor
 * in memory). */
int zs_gguf_conv_put_tensors(zs_gguf_conv *c, zs_gguf_writer *w);

#endif
