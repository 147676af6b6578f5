/* config.h — model configuration: reads a Hugging Face config.json into zs_model_config (the
 * llama family: Llama (with RoPE scaling), Mistral (sliding window), Qwen2, Qwen3, Gemma 2,
 * Gemma 3 (text), Phi-3; the mixtures of experts Mixtral, Qwen2-MoE, Qwen3-MoE and OLMoE; and
 * GPT-2) and writes one back (init-model).
 * The struct is plain data owned by the caller; every function is thread-safe (no globals). */
#ifndef ZS_CONFIG_H
#define ZS_CONFIG_H

#include <math.h>

#include "tensor.h"

typedef enum { ZS_ARCH_LLAMA = 0, ZS_ARCH_GPT2 = 1 } zs_arch;

/* The model family within an architecture: which checkpoint layout and which extra pieces
 * (zs_model_config's flags below follow from it and from config.json). */
typedef enum {
    ZS_FAM_LLAMA = 0, ZS_FAM_MISTRAL, ZS_FAM_QWEN2, ZS_FAM_QWEN3, ZS_FAM_GEMMA2, ZS_FAM_GEMMA3,
    ZS_FAM_PHI3, ZS_FAM_GPT2,
    /* mixtures of experts (n_experts > 0 below) */
    ZS_FAM_MIXTRAL, ZS_FAM_QWEN2MOE, ZS_FAM_QWEN3MOE, ZS_FAM_OLMOE
} zs_family;

/* RoPE scaling, as transformers' modeling_rope_utils.py defines each type (rope.h computes the
 * frequencies). */
typedef enum {
    ZS_ROPE_DEFAULT = 0, ZS_ROPE_LINEAR, ZS_ROPE_DYNAMIC, ZS_ROPE_LLAMA3, ZS_ROPE_YARN, ZS_ROPE_LONGROPE
} zs_rope_type;

#define ZS_ROPE_MAX_FACTORS 256  /* longrope factor lists: head_dim / 2 entries */
#define ZS_MAX_LAYERS 1024

typedef struct {
    int type;                 /* zs_rope_type */
    float factor;             /* linear, dynamic, llama3, yarn (> 0); longrope: the one given, or 0 */
    float low_freq_factor, high_freq_factor; /* llama3 */
    int orig_max_pos;         /* llama3 / yarn: rope_scaling.original_max_position_embeddings (yarn: 0 =
                                 max_position_embeddings); longrope: the top-level
                                 original_max_position_embeddings (0 = max_position_embeddings);
                                 dynamic: max_position_embeddings as read (max_seq is factor times it:
                                 the base grows past it) */
    float beta_fast, beta_slow; /* yarn (as given; 0 = absent: 32 and 1) */
    float mscale, mscale_all_dim; /* yarn (as given; 0 = absent) */
    int truncate;             /* yarn (default 1) */
    float attention_factor;   /* as given in the config (yarn, longrope); 0 = absent (derived) */
    int n_factors;            /* longrope: entries of short_factor and long_factor (= head_dim / 2) */
    float short_factor[ZS_ROPE_MAX_FACTORS], long_factor[ZS_ROPE_MAX_FACTORS];
} zs_rope_scaling;

typedef struct {
    zs_arch arch;
    int family;           /* zs_family */
    char arch_name[64];   /* e.g. "LlamaForCausalLM" */
    int n_layers, dim, n_heads, n_kv_heads, head_dim, ffn_dim, vocab_size, max_seq;
    float norm_eps, rope_theta; /* rope_theta is 0 for GPT-2 (learned positions) */
    int tied_embeddings;  /* lm_head shares the embedding */
    int qkv_bias;         /* llama attention_bias; Qwen2 always (q, k, v only); GPT-2 always */
    int o_bias;           /* llama attention_bias (not Qwen2); GPT-2 always */
    int mlp_bias;         /* llama mlp_bias; GPT-2 always */
    int bos_id, eos_id;   /* -1 if null/absent; if eos_token_id is a list, the first */
    zs_dtype dtype;       /* torch_dtype (or dtype): float32/float16/bfloat16; F32 if absent */
    int act;              /* 0 = silu (llama), 1 = gelu tanh approximation (gpt2; Gemma's gated GeGLU) */
    /* --- the pieces of newer families (all 0 for Llama, Mistral without a window, Qwen2, GPT-2) --- */
    zs_rope_scaling rope; /* rope_scaling (global layers of Gemma 3) */
    float rope_local_theta; /* Gemma 3: rope_local_base_freq of the sliding layers (default RoPE, no
                               scaling); 0: every layer uses rope_theta and rope */
    int qk_norm;          /* Qwen3, Gemma 3: RMSNorm over each head of q and of k before RoPE */
    float norm_offset;    /* Gemma: every RMSNorm multiplies by (norm_offset + w): 1 for a Hugging Face
                             checkpoint, 0 for a GGUF one (llama.cpp's converter adds the 1 to w) */
    int post_norms;       /* Gemma 2/3: RMSNorms on the attention and MLP outputs before the residual adds */
    float embed_scale;    /* Gemma: embeddings times sqrt(hidden) (rounded to dtype, as transformers
                             does); 0: none */
    float attn_softcap;   /* Gemma 2: scores = cap * tanh(scores / cap); 0: none */
    float final_softcap;  /* Gemma 2: the same on the logits; 0: none */
    float query_pre_attn_scalar; /* Gemma: scores scaled by this ^ -0.5; 0: head_dim ^ -0.5 */
    int sliding_window;   /* attention of a sliding layer sees the last sliding_window positions (the
                             token's own included); 0: no sliding layers */
    int swa_pattern;      /* Gemma 2 (2), Gemma 3 (6): layer l is full iff (l + 1) % swa_pattern == 0;
                             0: every layer of layer_sliding below as read */
    unsigned char layer_sliding[ZS_MAX_LAYERS]; /* 1: layer l is a sliding layer (uses the window and,
                                                   for Gemma 3, the local RoPE) */
    /* --- mixtures of experts (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE; all 0 for a dense model) --- */
    int n_experts;        /* num_local_experts (Mixtral) / num_experts; 0: dense */
    int n_experts_used;   /* num_experts_per_tok (top-k) */
    int moe_ffn_dim;      /* each expert's intermediate size (moe_intermediate_size; Mixtral: intermediate_size) */
    int shared_ffn_dim;   /* Qwen2-MoE: shared_expert_intermediate_size of the shared expert, whose output is
                             scaled by sigmoid(shared_expert_gate(x)) (a [1, dim] weight); 0: none */
    int norm_topk_prob;   /* routing: softmax over all experts (f32), top-k, then the k weights divided by their sum
                             when set (Mixtral: always; the others: norm_topk_prob) */
    float router_aux_loss_coef; /* training: loss += coef * load_balancing_loss when output_router_logits */
    int output_router_logits;   /* config.json's output_router_logits (transformers adds the aux loss only then) */
    int qk_norm_full;     /* OLMoE: q_norm / k_norm are RMSNorms over the whole q [n_heads*head_dim] and k
                             [n_kv_heads*head_dim] projections (not per head), before RoPE */
    float clip_qkv;       /* OLMoE: q, k, v clamped to [-clip_qkv, clip_qkv]; 0: none */
    unsigned char layer_moe[ZS_MAX_LAYERS]; /* 1: layer l's MLP is the sparse block (decoder_sparse_step,
                                               mlp_only_layers); 0: a dense MLP of ffn_dim */
} zs_model_config;

/* 1 when layer l's MLP is a mixture of experts. */
static inline int zs_config_layer_moe(const zs_model_config *c, int l) {
    return c->n_experts > 0 && l >= 0 && l < ZS_MAX_LAYERS && c->layer_moe[l];
}

/* 1 when layer l attends through the sliding window. */
static inline int zs_config_layer_sliding(const zs_model_config *c, int l) {
    return c->sliding_window > 0 && l >= 0 && l < ZS_MAX_LAYERS && c->layer_sliding[l];
}
/* The attention scores' multiplier: query_pre_attn_scalar ^ -0.5 (Gemma, as transformers' python
 * double rounded to float), or 0 for the default 1 / sqrt(head_dim) of the attention kernels. */
static inline float zs_config_att_scale(const zs_model_config *c) {
    return c->query_pre_attn_scalar > 0 ? (float)(1.0 / sqrt((double)c->query_pre_attn_scalar)) : 0.0f;
}
/* The window of layer l's attention (0: the whole context). */
static inline int zs_config_layer_window(const zs_model_config *c, int l) {
    return zs_config_layer_sliding(c, l) ? c->sliding_window : 0;
}
/* The family's display name ("llama", "qwen3", "gemma2", ...; GGUF general.architecture). */
const char *zs_family_name(int family);

/* Reads <dir>/config.json. Errors: ZS_ENOTFOUND (no file, missing required key),
 * ZS_EFORMAT (not JSON / not an object), ZS_EINVAL (wrong type or value, naming the key),
 * ZS_EUNSUPPORTED (architecture, activation, rope_scaling, dtype). */
int zs_config_load(const char *dir, zs_model_config *out);
/* Parses config.json text; origin names it in messages (e.g. the file path). */
int zs_config_parse(const char *json_text, const char *origin, zs_model_config *out);
/* The same configuration from a GGUF file's metadata (general.architecture llama (with
 * <arch>.expert_count > 0: Mixtral) | qwen2 | qwen3 | gemma2 | gemma3 | phi3 | gpt2 | qwen2moe |
 * qwen3moe | olmoe, llama.cpp's <arch>.* keys, the RoPE scaling keys and factor tensors
 * (rope_freqs, rope_factors_long/short); vocab size from tokenizer.ggml.tokens; tied when
 * output.weight is absent; dtype from token_embd.weight; Gemma's norm weights already hold the + 1,
 * so norm_offset is 0). Errors as zs_config_load's, naming the file and key. In config-gguf.c. */
struct zs_gguf;
int zs_config_from_gguf(const struct zs_gguf *g, zs_model_config *out);
/* Sets config.json keys on c: c as config.json, the keys of the JSON object json_text put over it, read
 * back (e.g. {"rope_scaling": {...}, "sliding_window": 64}); the parser's errors, naming origin. */
int zs_config_override(zs_model_config *c, const char *json_text, const char *origin);
/* Checks c's RoPE scaling against the rest of the configuration (factor > 0, factor lists of
 * head_dim / 2 entries, ...), as both readers do; origin names the file in messages. ZS_EINVAL
 * naming the key. */
int zs_config_check_rope(const zs_model_config *c, const char *origin);
/* Writes an HF config.json atomically (path.tmp, fsync, rename) that zs_config_load reads back
 * equal. ZS_EINVAL if c cannot be expressed as a config.json (e.g. Qwen2 without qkv bias). */
int zs_config_write(const zs_model_config *c, const char *path);

#endif
