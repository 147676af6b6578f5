/* config.h — model configuration: reads a Hugging Face config.json into zs_model_config (llama
 * family: Llama, Mistral, Qwen2; and GPT-2) and writes one back (init-model).
 * The struct is plain data owned by the caller; every function is thread-safe (no globals). */
#ifndef ZS_CONFIG_H
#define ZS_CONFIG_H

#include "tensor.h"

typedef enum { ZS_ARCH_LLAMA = 0, ZS_ARCH_GPT2 = 1 } zs_arch;

typedef struct {
    zs_arch arch;
    char arch_name[64];   /* e.g. "LlamaForCausalLM" */
    int n_layers, dim, n_heads, n_kv_heads, head_dim, ffn_dim, vocab_size, max_seq;
    float norm_eps, rope_theta; /* rope_theta is 0 for GPT-2 (learned positions) */
    int tied_embeddings;  /* lm_head shares the embedding */
    int qkv_bias;         /* llama attention_bias; Qwen2 always (q, k, v only); GPT-2 always */
    int o_bias;           /* llama attention_bias (not Qwen2); GPT-2 always */
    int mlp_bias;         /* llama mlp_bias; GPT-2 always */
    int bos_id, eos_id;   /* -1 if null/absent; if eos_token_id is a list, the first */
    zs_dtype dtype;       /* torch_dtype (or dtype): float32/float16/bfloat16; F32 if absent */
    int act;              /* 0 = silu (llama), 1 = gelu tanh approximation (gpt2) */
} zs_model_config;

/* Reads <dir>/config.json. Errors: ZS_ENOTFOUND (no file, missing required key),
 * ZS_EFORMAT (not JSON / not an object), ZS_EINVAL (wrong type or value, naming the key),
 * ZS_EUNSUPPORTED (architecture, activation, rope_scaling, dtype). */
int zs_config_load(const char *dir, zs_model_config *out);
/* Parses config.json text; origin names it in messages (e.g. the file path). */
int zs_config_parse(const char *json_text, const char *origin, zs_model_config *out);
/* The same configuration from a GGUF file's metadata (general.architecture llama | qwen2 | gpt2,
 * llama.cpp's <arch>.* keys; vocab size from tokenizer.ggml.tokens; tied when output.weight is
 * absent; dtype from token_embd.weight). Errors as zs_config_load's, naming the file and key. */
struct zs_gguf;
int zs_config_from_gguf(const struct zs_gguf *g, zs_model_config *out);
/* Writes an HF config.json atomically (path.tmp, fsync, rename) that zs_config_load reads back
 * equal. ZS_EINVAL if c cannot be expressed as a config.json (e.g. Qwen2 without qkv bias). */
int zs_config_write(const zs_model_config *c, const char *path);

#endif
