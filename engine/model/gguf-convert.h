/* gguf-convert.h — a Hugging Face model directory (config.json + safetensors, an architecture the
 * engine loads: Llama/Mistral, Qwen2, GPT-2) as the hyperparameters and tensors of a GGUF file
 * for llama.cpp, the way its convert_hf_to_gguf.py (f32, f16, bf16, q8_0) and, from an f32
 * conversion, llama-quantize (q4_0, q4_1, q5_0, q5_1, q4_k_m) write them. The tokenizer is not
 * here (engine/text has it as arrays; the caller adds its keys).
 *
 * Tensors: llama.cpp's names (token_embd.weight, blk.N.attn_q.weight, ..., output_norm.weight,
 * output.weight — absent when the head is tied) in GGUF dim order (ne[0] = the row length).
 * Llama's Q and K rows (and biases) are permuted per head from Hugging Face's rotate_half order
 * to the interleaved order, as convert_hf_to_gguf.py's LlamaModel.permute does (model.c undoes it
 * when loading); Qwen2 is stored unpermuted; GPT-2's Conv1D weights are transposed and its q, k,
 * v fused into attn_qkv.
 *
 * Types: 1-D tensors (norms, biases) and GPT-2's position table stay F32. Matrices take the file
 * type's block format, except
 *   - q4_0 .. q5_1 and q4_k_m: output.weight, or token_embd.weight of a tied model, is Q6_K (Q8_0
 *     when its rows are not a multiple of 256), as llama-quantize does;
 *   - q4_k_m: llama-quantize's mix (quant-mix.h, the loader's too) — Q6_K for attn_v and ffn_down
 *     of the layers use_more_bits picks (the first and last eighth and every third between), Q4_K
 *     elsewhere; GPT-2's fused attn_qkv Q6_K (llama-quantize: Q5_K, which is not made here);
 *   - rows that are not a multiple of the block: q8_0 .. q5_1 fall back to F16 (convert_hf_to_gguf
 *     .py's rule for q8_0; llama-quantize refuses such tensors for these types); K-quants as
 *     llama-quantize does, Q4_K -> Q5_0 and Q6_K -> Q8_0, then F16.
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
    int n_dims;         /* 1 or 2 */
    int64_t ne[2];      /* GGUF order */
    const char *note;   /* why the type is not the file type's, or NULL (a static string) */
} zs_gguf_conv_tensor;

typedef struct zs_gguf_conv zs_gguf_conv;

/* Reads and validates the directory (config.json and every tensor, as zs_model_open does) and
 * chooses each output tensor's type; reads no weight data. Errors of zs_model_open, and
 * ZS_EUNSUPPORTED for what cannot be converted (a GGUF file as input; Llama MLP biases, which
 * zeroserve's GGUF reader does not read back). */
int zs_gguf_conv_open(const char *dir, zs_llama_ftype ftype, zs_gguf_conv **out);
void zs_gguf_conv_close(zs_gguf_conv *c);

const zs_model_config *zs_gguf_conv_config(const zs_gguf_conv *c);
const char *zs_gguf_conv_arch(const zs_gguf_conv *c); /* general.architecture: llama, qwen2, gpt2 */
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
