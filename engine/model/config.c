/* config.c — Hugging Face config.json <-> zs_model_config: strict parsing (types, ranges,
 * supported architectures and options, with messages that name the file and the key; the defaults
 * of transformers 4.57's config classes for absent keys, the mixtures of experts' included) and an
 * atomic writer whose output reads back equal. See config.h. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "model.h" /* ZS_MAX_EXPERTS */

#define CFG_MAX_FILE ((off_t)64 * 1024 * 1024)

typedef struct {
    const char *cls;        /* architectures[0] */
    const char *model_type; /* model_type written back */
    zs_arch arch;
    int family;
    int max_seq_default;
} cfg_arch;

static const cfg_arch cfg_archs[] = {
    {"LlamaForCausalLM", "llama", ZS_ARCH_LLAMA, ZS_FAM_LLAMA, 2048},
    {"MistralForCausalLM", "mistral", ZS_ARCH_LLAMA, ZS_FAM_MISTRAL, 131072},
    {"Qwen2ForCausalLM", "qwen2", ZS_ARCH_LLAMA, ZS_FAM_QWEN2, 32768},
    {"Qwen3ForCausalLM", "qwen3", ZS_ARCH_LLAMA, ZS_FAM_QWEN3, 32768},
    {"Gemma2ForCausalLM", "gemma2", ZS_ARCH_LLAMA, ZS_FAM_GEMMA2, 8192},
    {"Gemma3ForCausalLM", "gemma3_text", ZS_ARCH_LLAMA, ZS_FAM_GEMMA3, 131072},
    {"Phi3ForCausalLM", "phi3", ZS_ARCH_LLAMA, ZS_FAM_PHI3, 4096},
    {"GPT2LMHeadModel", "gpt2", ZS_ARCH_GPT2, ZS_FAM_GPT2, 1024},
    {"MixtralForCausalLM", "mixtral", ZS_ARCH_LLAMA, ZS_FAM_MIXTRAL, 131072},
    {"Qwen2MoeForCausalLM", "qwen2_moe", ZS_ARCH_LLAMA, ZS_FAM_QWEN2MOE, 32768},
    {"Qwen3MoeForCausalLM", "qwen3_moe", ZS_ARCH_LLAMA, ZS_FAM_QWEN3MOE, 32768},
    {"OlmoeForCausalLM", "olmoe", ZS_ARCH_LLAMA, ZS_FAM_OLMOE, 4096},
};
#define CFG_NARCH (sizeof cfg_archs / sizeof cfg_archs[0])
#define CFG_SUPPORTED "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, " \
                      "Gemma2ForCausalLM, Gemma3ForCausalLM, Phi3ForCausalLM, GPT2LMHeadModel, " \
                      "MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM, OlmoeForCausalLM"

const char *zs_family_name(int f) {
    /* the init-model --arch names; the MoE ones are also llama.cpp's general.architecture, except
     * Mixtral's (llama.cpp calls it "llama", as it does Mistral) */
    static const char *n[] = {"llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "gpt2",
                              "mixtral", "qwen2moe", "qwen3moe", "olmoe"};
    return f >= 0 && f < (int)(sizeof n / sizeof n[0]) ? n[f] : "?";
}

static const char *cfg_type(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a float";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "?";
}

/* Integer key >= min. Absent or null: def, unless required (absent -> ZS_ENOTFOUND). */
static int cfg_int(const char *origin, json_t *root, const char *key, int required, int def,
                   int min, int *out) {
    json_t *v = json_object_get(root, key);
    if (!v || (json_is_null(v) && !required)) {
        if (required) return zs_err(ZS_ENOTFOUND, "%s: required key '%s' is missing", origin, key);
        *out = def;
        return 0;
    }
    if (!json_is_integer(v))
        return zs_err(ZS_EINVAL, "%s: '%s' must be an integer, got %s", origin, key, cfg_type(v));
    json_int_t x = json_integer_value(v);
    if (x < min || x > INT_MAX)
        return zs_err(ZS_EINVAL, "%s: '%s' is %lld; it must be %s integer from %d to %d", origin,
                      key, (long long)x, min > 0 ? "a positive" : "an", min, INT_MAX);
    *out = (int)x;
    return 0;
}

/* A finite number (integer or float) under key of obj, named `shown` in messages (e.g.
 * "rope_scaling.factor"). Absent or null: def. */
static int cfg_num(const char *origin, json_t *obj, const char *key, const char *shown, float def, float *out) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_number(v))
        return zs_err(ZS_EINVAL, "%s: '%s' must be a number, got %s", origin, shown, cfg_type(v));
    double d = json_number_value(v);
    if (!isfinite(d) || !isfinite((float)d))
        return zs_err(ZS_EINVAL, "%s: '%s' is %g, not a finite float", origin, shown, d);
    *out = (float)d;
    return 0;
}

/* Positive finite number (integer or float). Absent or null: def. */
static int cfg_float(const char *origin, json_t *root, const char *key, float def, float *out) {
    float f;
    ZS_CHECK(cfg_num(origin, root, key, key, def, &f));
    if (json_object_get(root, key) && !json_is_null(json_object_get(root, key)) && !(f > 0))
        return zs_err(ZS_EINVAL, "%s: '%s' is %g, must be a positive float", origin, key, (double)f);
    *out = f;
    return 0;
}

static int cfg_bool(const char *origin, json_t *root, const char *key, int def, int *out) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_boolean(v))
        return zs_err(ZS_EINVAL, "%s: '%s' must be true or false, got %s", origin, key,
                      cfg_type(v));
    *out = json_is_true(v);
    return 0;
}

/* Token id: null/absent -> -1; integer >= 0; a list -> its first element (empty -> -1). */
static int cfg_token(const char *origin, json_t *root, const char *key, int *out) {
    json_t *v = json_object_get(root, key);
    if (json_is_array(v)) v = json_array_size(v) ? json_array_get(v, 0) : NULL;
    if (!v || json_is_null(v)) {
        *out = -1;
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT_MAX)
        return zs_err(ZS_EINVAL, "%s: '%s' must be a non-negative integer, a list of them or null",
                      origin, key);
    *out = (int)json_integer_value(v);
    return 0;
}

/* Optional string key: NULL when absent or null. */
static int cfg_str(const char *origin, json_t *root, const char *key, const char **out) {
    json_t *v = json_object_get(root, key);
    *out = NULL;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v))
        return zs_err(ZS_EINVAL, "%s: '%s' must be a string, got %s", origin, key, cfg_type(v));
    *out = json_string_value(v);
    return 0;
}

/* rope_scaling (or rope_parameters): the type under 'rope_type' or the older 'type', and its fields. */
static int cfg_rope(const char *origin, json_t *root, zs_model_config *c, float *theta) {
    const char *key = "rope_scaling";
    json_t *rs = json_object_get(root, key);
    json_t *rp = json_object_get(root, "rope_parameters"); /* newer transformers */
    if ((!rs || json_is_null(rs)) && rp && !json_is_null(rp)) {
        rs = rp;
        key = "rope_parameters";
    }
    if (!rs || json_is_null(rs)) return 0;
    if (!json_is_object(rs)) return zs_err(ZS_EINVAL, "%s: '%s' must be an object or null", origin, key);
    char k[64];
    if (rs == rp) ZS_CHECK(cfg_float(origin, rs, "rope_theta", *theta, theta)); /* rope_parameters.rope_theta */
    const char *t = NULL;
    ZS_CHECK(cfg_str(origin, rs, "rope_type", &t));
    if (!t) ZS_CHECK(cfg_str(origin, rs, "type", &t));
    if (!t) return zs_err(ZS_EINVAL, "%s: '%s' has neither 'rope_type' nor 'type'", origin, key);
    zs_rope_scaling *r = &c->rope;
    memset(r, 0, sizeof *r);
    if (c->family == ZS_FAM_PHI3 && !strcmp(t, "yarn")) r->type = ZS_ROPE_LONGROPE; /* Phi3Config: "su", "yarn" are longrope */
    else if (!strcmp(t, "default")) r->type = ZS_ROPE_DEFAULT;
    else if (!strcmp(t, "linear")) r->type = ZS_ROPE_LINEAR;
    else if (!strcmp(t, "dynamic")) r->type = ZS_ROPE_DYNAMIC;
    else if (!strcmp(t, "llama3")) r->type = ZS_ROPE_LLAMA3;
    else if (!strcmp(t, "yarn")) r->type = ZS_ROPE_YARN;
    else if (!strcmp(t, "longrope") || !strcmp(t, "su")) r->type = ZS_ROPE_LONGROPE;
    else
        return zs_err(ZS_EUNSUPPORTED, "%s: '%s' type '%s' is not supported (supported: default, linear, "
                      "dynamic, llama3, yarn, longrope)", origin, key, t);
    /* every field named in messages as rope_scaling.<field> */
#define RF(field, def, dst)                                                        \
    do {                                                                           \
        snprintf(k, sizeof k, "%s.%s", key, field);                                \
        ZS_CHECK(cfg_num(origin, rs, field, k, def, dst));                         \
    } while (0)
    float f;
    if (r->type != ZS_ROPE_DEFAULT) {
        RF("factor", 0, &r->factor);
        if (r->type != ZS_ROPE_LONGROPE && !json_object_get(rs, "factor"))
            return zs_err(ZS_EINVAL, "%s: '%s.factor' is missing (needed by %s)", origin, key, t);
        if (json_object_get(rs, "factor") && !json_is_null(json_object_get(rs, "factor")) && !(r->factor > 0))
            return zs_err(ZS_EINVAL, "%s: '%s.factor' is %g; it must be > 0", origin, key, (double)r->factor);
    }
    if (r->type == ZS_ROPE_LLAMA3) {
        RF("low_freq_factor", 0, &r->low_freq_factor);
        RF("high_freq_factor", 0, &r->high_freq_factor);
        RF("original_max_position_embeddings", 0, &f);
        r->orig_max_pos = (int)f;
        if (!(f >= 1) || f != (float)r->orig_max_pos)
            return zs_err(ZS_EINVAL, "%s: '%s.original_max_position_embeddings' must be a positive integer", origin, key);
        if (!(r->low_freq_factor > 0) || !(r->high_freq_factor > 0))
            return zs_err(ZS_EINVAL, "%s: '%s.low_freq_factor' and '%s.high_freq_factor' must be > 0", origin, key, key);
    }
    if (r->type == ZS_ROPE_YARN) {
        RF("beta_fast", 0, &r->beta_fast);
        RF("beta_slow", 0, &r->beta_slow);
        RF("mscale", 0, &r->mscale);
        RF("mscale_all_dim", 0, &r->mscale_all_dim);
        RF("attention_factor", 0, &r->attention_factor);
        RF("original_max_position_embeddings", 0, &f);
        r->orig_max_pos = (int)f;
        if (f < 0 || f != (float)r->orig_max_pos)
            return zs_err(ZS_EINVAL, "%s: '%s.original_max_position_embeddings' must be a positive integer", origin, key);
        if (json_object_get(rs, "attention_factor") && !json_is_null(json_object_get(rs, "attention_factor")) &&
            !(r->attention_factor > 0))
            return zs_err(ZS_EINVAL, "%s: '%s.attention_factor' is %g; it must be > 0", origin, key,
                          (double)r->attention_factor);
        r->truncate = 1;
        ZS_CHECK(cfg_bool(origin, rs, "truncate", 1, &r->truncate));
    }
    if (r->type == ZS_ROPE_LONGROPE) {
        RF("attention_factor", 0, &r->attention_factor);
        const char *names[2] = {"short_factor", "long_factor"};
        float *dst[2] = {r->short_factor, r->long_factor};
        size_t n[2];
        for (int w = 0; w < 2; w++) {
            json_t *arr = json_object_get(rs, names[w]);
            if (!json_is_array(arr))
                return zs_err(ZS_EINVAL, "%s: '%s.%s' must be a list of numbers (longrope)", origin, key, names[w]);
            n[w] = json_array_size(arr);
            if (n[w] > ZS_ROPE_MAX_FACTORS)
                return zs_err(ZS_EINVAL, "%s: '%s.%s' has %zu entries (at most %d)", origin, key, names[w], n[w],
                              ZS_ROPE_MAX_FACTORS);
            for (size_t e = 0; e < n[w]; e++) {
                json_t *x = json_array_get(arr, e);
                if (!json_is_number(x) || !(json_number_value(x) > 0) || !isfinite((float)json_number_value(x)))
                    return zs_err(ZS_EINVAL, "%s: '%s.%s[%zu]' must be a positive number", origin, key, names[w], e);
                dst[w][e] = (float)json_number_value(x);
            }
        }
        if (n[0] != n[1])
            return zs_err(ZS_EINVAL, "%s: '%s.short_factor' has %zu entries but 'long_factor' %zu", origin, key,
                          n[0], n[1]);
        r->n_factors = (int)n[0];
        /* transformers takes the original length from the top-level key (Phi-3 always has one) */
        int om = c->family == ZS_FAM_PHI3 ? 4096 : 0;
        ZS_CHECK(cfg_int(origin, root, "original_max_position_embeddings", 0, om, 1, &om));
        r->orig_max_pos = om;
    }
#undef RF
    return 0;
}

/* See config.h; rope.c computes the frequencies from what passes. */
int zs_config_check_rope(const zs_model_config *c, const char *o) {
    const zs_rope_scaling *r = &c->rope;
    if (r->type == ZS_ROPE_DEFAULT) return 0;
    if (c->rope_theta <= 0)
        return zs_err(ZS_EINVAL, "%s: 'rope_scaling' is set but the model has no RoPE", o);
    if (r->type != ZS_ROPE_LONGROPE && !(r->factor > 0 && isfinite(r->factor)))
        return zs_err(ZS_EINVAL, "%s: 'rope_scaling.factor' is %g; it must be a positive number", o,
                      (double)r->factor);
    if (r->type == ZS_ROPE_DYNAMIC && c->head_dim <= 2)
        return zs_err(ZS_EINVAL, "%s: dynamic RoPE needs head_dim > 2 (it is %d)", o, c->head_dim);
    if (r->type == ZS_ROPE_LLAMA3) {
        if (!(r->low_freq_factor > 0) || !(r->high_freq_factor > 0))
            return zs_err(ZS_EINVAL, "%s: 'rope_scaling.low_freq_factor' and 'high_freq_factor' must be positive", o);
        if (r->high_freq_factor == r->low_freq_factor)
            return zs_err(ZS_EINVAL, "%s: 'rope_scaling.high_freq_factor' equals 'low_freq_factor' (%g): the "
                          "smoothing divides by their difference", o, (double)r->low_freq_factor);
        if (r->orig_max_pos <= 0)
            return zs_err(ZS_EINVAL, "%s: 'rope_scaling.original_max_position_embeddings' must be a positive integer", o);
    }
    if (r->type == ZS_ROPE_YARN) {
        if (r->attention_factor < 0)
            return zs_err(ZS_EINVAL, "%s: 'rope_scaling.attention_factor' is %g; it must be positive", o,
                          (double)r->attention_factor);
        if (r->beta_fast < 0 || r->beta_slow < 0)
            return zs_err(ZS_EINVAL, "%s: 'rope_scaling.beta_fast' / 'beta_slow' must be positive", o);
    }
    if (r->type == ZS_ROPE_LONGROPE) {
        if (r->n_factors != c->head_dim / 2)
            return zs_err(ZS_EINVAL, "%s: 'rope_scaling.short_factor' / 'long_factor' have %d entries; head_dim %d "
                          "needs %d", o, r->n_factors, c->head_dim, c->head_dim / 2);
        for (int i = 0; i < r->n_factors; i++)
            if (!(r->short_factor[i] > 0) || !(r->long_factor[i] > 0) || !isfinite(r->short_factor[i]) ||
                !isfinite(r->long_factor[i]))
                return zs_err(ZS_EINVAL, "%s: 'rope_scaling' %s_factor[%d] is not a positive number", o,
                              !(r->short_factor[i] > 0) || !isfinite(r->short_factor[i]) ? "short" : "long", i);
        if (r->orig_max_pos <= 0 && !(r->factor > 0) && !(r->attention_factor > 0))
            return zs_err(ZS_EINVAL, "%s: longrope needs 'original_max_position_embeddings', "
                          "'rope_scaling.factor' or 'rope_scaling.attention_factor'", o);
        if (r->orig_max_pos > c->max_seq)
            return zs_err(ZS_EINVAL, "%s: 'original_max_position_embeddings' (%d) exceeds "
                          "'max_position_embeddings' (%d)", o, r->orig_max_pos, c->max_seq);
    }
    return 0;
}

/* The sliding layers: layer_types when given, else the family's rule. */
static int cfg_layer_types(const char *origin, json_t *root, zs_model_config *c, int window_by_default) {
    json_t *lt = json_object_get(root, "layer_types");
    if (lt && !json_is_null(lt)) {
        if (!json_is_array(lt) || (int)json_array_size(lt) != c->n_layers)
            return zs_err(ZS_EINVAL, "%s: 'layer_types' must be a list of %d strings (one per layer)", origin,
                          c->n_layers);
        c->swa_pattern = 0;
        for (int l = 0; l < c->n_layers; l++) {
            const char *t = json_string_value(json_array_get(lt, l));
            if (t && !strcmp(t, "sliding_attention")) c->layer_sliding[l] = 1;
            else if (t && !strcmp(t, "full_attention")) c->layer_sliding[l] = 0;
            else
                return zs_err(ZS_EINVAL, "%s: 'layer_types[%d]' must be \"sliding_attention\" or \"full_attention\"",
                              origin, l);
        }
        return 0;
    }
    for (int l = 0; l < c->n_layers; l++)
        c->layer_sliding[l] = c->swa_pattern > 0 ? ((l + 1) % c->swa_pattern != 0) : window_by_default;
    return 0;
}

/* A list of layer indices (mlp_only_layers): flags[l] = 1 for each listed l < n_layers (transformers
 * never matches the others). */
static int cfg_layer_list(const char *origin, json_t *root, const char *key, int n_layers, unsigned char *flags) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_array(v))
        return zs_err(ZS_EINVAL, "%s: '%s' must be a list of layer indices, got %s", origin, key, cfg_type(v));
    for (size_t i = 0; i < json_array_size(v); i++) {
        json_t *x = json_array_get(v, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0)
            return zs_err(ZS_EINVAL, "%s: '%s[%zu]' must be a non-negative integer (a layer index)", origin, key, i);
        if (json_integer_value(x) < n_layers) flags[json_integer_value(x)] = 1;
    }
    return 0;
}

/* The mixture-of-experts keys of Mixtral, Qwen2-MoE, Qwen3-MoE and OLMoE with their config classes'
 * defaults (transformers 4.57), and which layers are sparse. */
static int cfg_moe(const char *origin, json_t *root, int fam, zs_model_config *c) {
    int qwen = fam == ZS_FAM_QWEN2MOE || fam == ZS_FAM_QWEN3MOE;
    const char *nkey = fam == ZS_FAM_MIXTRAL ? "num_local_experts" : "num_experts";
    int n_def = fam == ZS_FAM_MIXTRAL ? 8 : fam == ZS_FAM_QWEN2MOE ? 60 : fam == ZS_FAM_QWEN3MOE ? 128 : 64;
    int k_def = fam == ZS_FAM_MIXTRAL ? 2 : fam == ZS_FAM_OLMOE || fam == ZS_FAM_QWEN3MOE ? 8 : 4;
    /* Qwen: num_experts 0 makes every layer dense; Mixtral and OLMoE always route */
    ZS_CHECK(cfg_int(origin, root, nkey, 0, n_def, qwen ? 0 : 1, &c->n_experts));
    if (c->n_experts > ZS_MAX_EXPERTS)
        return zs_err(ZS_EUNSUPPORTED, "%s: '%s' is %d; at most %d experts are supported", origin, nkey, c->n_experts,
                      ZS_MAX_EXPERTS);
    ZS_CHECK(cfg_int(origin, root, "num_experts_per_tok", 0, k_def, 1, &c->n_experts_used));
    if (c->n_experts > 0 && c->n_experts_used > c->n_experts)
        return zs_err(ZS_EINVAL, "%s: 'num_experts_per_tok' (%d) is larger than '%s' (%d)", origin, c->n_experts_used,
                      nkey, c->n_experts);
    if (qwen) {
        ZS_CHECK(cfg_int(origin, root, "moe_intermediate_size", 0, fam == ZS_FAM_QWEN2MOE ? 1408 : 768, 1,
                         &c->moe_ffn_dim));
    } else {
        c->moe_ffn_dim = c->ffn_dim; /* the experts are intermediate_size wide; no dense MLP */
    }
    c->shared_ffn_dim = 0;
    if (fam == ZS_FAM_QWEN2MOE)
        ZS_CHECK(cfg_int(origin, root, "shared_expert_intermediate_size", 0, 5632, 1, &c->shared_ffn_dim));
    if (fam == ZS_FAM_MIXTRAL) {
        c->norm_topk_prob = 1; /* MixtralSparseMoeBlock always renormalises the top-k weights */
        float jitter;
        ZS_CHECK(cfg_num(origin, root, "router_jitter_noise", "router_jitter_noise", 0, &jitter));
        if (jitter != 0)
            return zs_err(ZS_EUNSUPPORTED, "%s: 'router_jitter_noise' is %g; the router's random input jitter in "
                          "training is not supported (0 is)", origin, (double)jitter);
    } else {
        ZS_CHECK(cfg_bool(origin, root, "norm_topk_prob", 0, &c->norm_topk_prob));
    }
    ZS_CHECK(cfg_num(origin, root, "router_aux_loss_coef", "router_aux_loss_coef", fam == ZS_FAM_OLMOE ? 0.01f : 0.001f,
                     &c->router_aux_loss_coef));
    if (c->router_aux_loss_coef < 0)
        return zs_err(ZS_EINVAL, "%s: 'router_aux_loss_coef' is %g; it must not be negative", origin,
                      (double)c->router_aux_loss_coef);
    ZS_CHECK(cfg_bool(origin, root, "output_router_logits", 0, &c->output_router_logits));
    c->qk_norm_full = fam == ZS_FAM_OLMOE;
    c->clip_qkv = 0;
    if (fam == ZS_FAM_OLMOE) ZS_CHECK(cfg_float(origin, root, "clip_qkv", 0, &c->clip_qkv)); /* null: none */
    /* the sparse layers: Mixtral and OLMoE every one; Qwen: (l + 1) % decoder_sparse_step == 0 and not in
     * mlp_only_layers */
    memset(c->layer_moe, 0, sizeof c->layer_moe);
    int step = 1;
    unsigned char dense[ZS_MAX_LAYERS] = {0};
    if (qwen) {
        ZS_CHECK(cfg_int(origin, root, "decoder_sparse_step", 0, 1, 1, &step));
        ZS_CHECK(cfg_layer_list(origin, root, "mlp_only_layers", c->n_layers, dense));
    }
    for (int l = 0; l < c->n_layers; l++) c->layer_moe[l] = c->n_experts > 0 && !dense[l] && (l + 1) % step == 0;
    if (c->n_experts == 0) { /* a dense model: the routing fields are all 0 */
        c->n_experts_used = c->moe_ffn_dim = c->shared_ffn_dim = c->norm_topk_prob = c->output_router_logits = 0;
        c->router_aux_loss_coef = 0;
    }
    return 0;
}

/* The llama family (Llama, Mistral, Qwen2, Qwen3, Gemma 2, Gemma 3, Phi-3, and the mixtures of experts
 * Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE) after the sizes: activation, biases, RoPE and its scaling,
 * sliding window, and the families' own pieces (cfg_moe: the experts). */
static int cfg_llama_family(const char *origin, json_t *root, const cfg_arch *a, zs_model_config *cp) {
    zs_model_config c = *cp;
    const char *s;
    int fam = a->family, gemma = fam == ZS_FAM_GEMMA2 || fam == ZS_FAM_GEMMA3;
    if (c.n_layers > ZS_MAX_LAYERS)
        return zs_err(ZS_EINVAL, "%s: 'num_hidden_layers' is %d; at most %d are supported", origin, c.n_layers,
                      ZS_MAX_LAYERS);
    if (c.head_dim > 2 * ZS_ROPE_MAX_FACTORS)
        return zs_err(ZS_EINVAL, "%s: 'head_dim' is %d; at most %d is supported", origin, c.head_dim,
                      2 * ZS_ROPE_MAX_FACTORS);
    /* activation: hidden_act (Gemma: hidden_activation, which wins when both are there) */
    const char *akey = gemma && json_object_get(root, "hidden_activation") ? "hidden_activation" : "hidden_act";
    ZS_CHECK(cfg_str(origin, root, akey, &s));
    if (gemma) {
        if (s && strcmp(s, "gelu_pytorch_tanh") && strcmp(s, "gelu_tanh"))
            return zs_err(ZS_EUNSUPPORTED, "%s: '%s' is '%s' (supported for Gemma: gelu_pytorch_tanh)", origin, akey, s);
        c.act = 1;
    } else {
        if (s && strcmp(s, "silu") && strcmp(s, "swish"))
            return zs_err(ZS_EUNSUPPORTED, "%s: '%s' is '%s' (supported: silu)", origin, akey, s);
        c.act = 0;
    }
    /* biases */
    int ab;
    switch (fam) {
    case ZS_FAM_QWEN2: c.qkv_bias = 1; break; /* q, k, v have biases, o_proj and the MLP do not */
    case ZS_FAM_QWEN2MOE: ZS_CHECK(cfg_bool(origin, root, "qkv_bias", 1, &c.qkv_bias)); break; /* q, k, v only */
    case ZS_FAM_MISTRAL:
    case ZS_FAM_MIXTRAL:
    case ZS_FAM_PHI3: break; /* no biases whatever the config says */
    case ZS_FAM_LLAMA:
        ZS_CHECK(cfg_bool(origin, root, "attention_bias", 0, &ab));
        c.qkv_bias = c.o_bias = ab;
        ZS_CHECK(cfg_bool(origin, root, "mlp_bias", 0, &c.mlp_bias));
        break;
    default: /* Qwen3, Qwen3-MoE, OLMoE, Gemma: attention_bias on q, k, v and o */
        ZS_CHECK(cfg_bool(origin, root, "attention_bias", 0, &ab));
        c.qkv_bias = c.o_bias = ab;
    }
    /* RoPE: rope_theta, rope_scaling / rope_parameters */
    float theta = fam == ZS_FAM_GEMMA3 || fam == ZS_FAM_MIXTRAL ? 1000000.0f : 10000.0f;
    memset(&c.rope, 0, sizeof c.rope);
    ZS_CHECK(cfg_rope(origin, root, &c, &theta));
    ZS_CHECK(cfg_float(origin, root, "rope_theta", theta, &c.rope_theta));
    if (fam == ZS_FAM_PHI3) {
        float prf;
        ZS_CHECK(cfg_float(origin, root, "partial_rotary_factor", 1.0f, &prf));
        if (prf != 1.0f)
            return zs_err(ZS_EUNSUPPORTED, "%s: 'partial_rotary_factor' is %g; RoPE over part of a head is not "
                          "supported", origin, (double)prf);
    }
    if (c.rope.type == ZS_ROPE_DYNAMIC) {
        /* dynamic NTK scales the base past max_position_embeddings: the context is factor times it */
        double ext = (double)c.max_seq * (c.rope.factor > 1 ? c.rope.factor : 1.0);
        c.rope.orig_max_pos = c.max_seq;
        c.max_seq = ext > INT_MAX / 2 ? INT_MAX / 2 : (int)ext;
    }
    ZS_CHECK(zs_config_check_rope(&c, origin));
    /* sliding window */
    json_t *sw = json_object_get(root, "sliding_window");
    int window = 0, by_default = 0;
    if (sw && !json_is_null(sw)) ZS_CHECK(cfg_int(origin, root, "sliding_window", 1, 0, 1, &window));
    switch (fam) {
    case ZS_FAM_MISTRAL: /* every layer; transformers' MistralConfig defaults to 4096 */
        if (!sw) window = 4096;
        by_default = 1;
        break;
    case ZS_FAM_PHI3: by_default = 1; break; /* every layer */
    case ZS_FAM_MIXTRAL: by_default = 1; break; /* every layer; MixtralConfig defaults to none */
    case ZS_FAM_QWEN2MOE: {
        /* its eager/sdpa mask windows every layer but its flash attention only layers >= max_window_layers */
        int use;
        ZS_CHECK(cfg_bool(origin, root, "use_sliding_window", 0, &use));
        if (use)
            return zs_err(ZS_EUNSUPPORTED, "%s: 'use_sliding_window' true is not supported for Qwen2-MoE (transformers' "
                          "attention implementations disagree on which layers it windows)", origin);
        window = 0;
        break;
    }
    case ZS_FAM_QWEN3MOE: { /* every layer when use_sliding_window (no max_window_layers) */
        int use;
        ZS_CHECK(cfg_bool(origin, root, "use_sliding_window", 0, &use));
        if (!use) window = 0;
        else if (!sw) window = 4096;
        by_default = 1;
        break;
    }
    case ZS_FAM_QWEN2:
    case ZS_FAM_QWEN3: {
        int use, mwl;
        ZS_CHECK(cfg_bool(origin, root, "use_sliding_window", 0, &use));
        ZS_CHECK(cfg_int(origin, root, "max_window_layers", 0, 28, 0, &mwl));
        if (!use) window = 0;
        if (window && !json_object_get(root, "layer_types"))
            for (int l = 0; l < c.n_layers; l++) c.layer_sliding[l] = l >= mwl;
        break;
    }
    case ZS_FAM_GEMMA2:
    case ZS_FAM_GEMMA3:
        if (!sw) window = 4096;
        c.swa_pattern = fam == ZS_FAM_GEMMA2 ? 2 : 6;
        if (fam == ZS_FAM_GEMMA3)
            ZS_CHECK(cfg_int(origin, root, "sliding_window_pattern", 0, 6, 1, &c.swa_pattern));
        break;
    default: window = 0; /* Llama has no sliding window */
    }
    /* a default window (the key absent) at least as long as the context changes nothing: none;
     * Phi-3's own 128k configs set sliding_window 262144 over a 131072 context: accepted as none */
    if (!sw && window >= c.max_seq) window = 0;
    if (fam == ZS_FAM_PHI3 && window > c.max_seq) {
        zs_log_info("%s: sliding_window %d is longer than the context (%d), as Phi-3's 128k configs have it: "
                    "no window", origin, window, c.max_seq);
        window = 0;
    }
    int moe_fam = fam == ZS_FAM_MIXTRAL || fam == ZS_FAM_QWEN2MOE || fam == ZS_FAM_QWEN3MOE || fam == ZS_FAM_OLMOE;
    if (window) {
        int keep_q = fam == ZS_FAM_QWEN2 || fam == ZS_FAM_QWEN3;
        if (moe_fam) /* their config classes have no layer_types: every layer */
            for (int l = 0; l < c.n_layers; l++) c.layer_sliding[l] = 1;
        else if (!keep_q || json_object_get(root, "layer_types")) ZS_CHECK(cfg_layer_types(origin, root, &c, by_default));
        if (window > c.max_seq)
            return zs_err(ZS_EINVAL, "%s: 'sliding_window' (%d) is larger than the context "
                          "'max_position_embeddings' (%d)", origin, window, c.max_seq);
    } else {
        memset(c.layer_sliding, 0, sizeof c.layer_sliding);
        c.swa_pattern = 0;
    }
    c.sliding_window = window;
    /* the families' own pieces */
    c.qk_norm = fam == ZS_FAM_QWEN3 || fam == ZS_FAM_GEMMA3 || fam == ZS_FAM_QWEN3MOE;
    if (moe_fam) ZS_CHECK(cfg_moe(origin, root, fam, &c));
    if (gemma) {
        c.norm_offset = 1.0f;
        c.post_norms = 1;
        float e = (float)sqrt((double)c.dim);
        c.embed_scale = c.dtype == ZS_BF16 ? zs_bf16_to_f32(zs_f32_to_bf16(e))
                        : c.dtype == ZS_F16 ? zs_f16_to_f32(zs_f32_to_f16(e)) : e;
        ZS_CHECK(cfg_float(origin, root, "query_pre_attn_scalar", 256.0f, &c.query_pre_attn_scalar));
        json_t *ac = json_object_get(root, "attn_logit_softcapping"), *fc = json_object_get(root, "final_logit_softcapping");
        float dflt_a = fam == ZS_FAM_GEMMA2 ? 50.0f : 0, dflt_f = fam == ZS_FAM_GEMMA2 ? 30.0f : 0;
        if (ac && json_is_null(ac)) c.attn_softcap = 0;
        else ZS_CHECK(cfg_float(origin, root, "attn_logit_softcapping", dflt_a, &c.attn_softcap));
        if (fc && json_is_null(fc)) c.final_softcap = 0;
        else ZS_CHECK(cfg_float(origin, root, "final_logit_softcapping", dflt_f, &c.final_softcap));
        if (!ac && !dflt_a) c.attn_softcap = 0;
        if (!fc && !dflt_f) c.final_softcap = 0;
        if (fam == ZS_FAM_GEMMA3) {
            ZS_CHECK(cfg_float(origin, root, "rope_local_base_freq", 10000.0f, &c.rope_local_theta));
            int bidi;
            ZS_CHECK(cfg_bool(origin, root, "use_bidirectional_attention", 0, &bidi));
            if (bidi)
                return zs_err(ZS_EUNSUPPORTED, "%s: 'use_bidirectional_attention' true is not supported (a causal "
                              "language model is)", origin);
        }
    }
    *cp = c;
    return 0;
}

static int cfg_parse_root(json_t *root, const char *origin, zs_model_config *out) {
    zs_model_config c;
    memset(&c, 0, sizeof c);
    const char *model_type, *s;
    ZS_CHECK(cfg_str(origin, root, "model_type", &model_type));

    /* architecture: architectures[0], else model_type */
    const cfg_arch *a = NULL;
    json_t *av = json_object_get(root, "architectures");
    if (av && !json_is_null(av)) {
        if (!json_is_array(av) || !json_array_size(av) || !json_is_string(json_array_get(av, 0)))
            return zs_err(ZS_EINVAL, "%s: 'architectures' must be a non-empty list of strings",
                          origin);
        const char *name = json_string_value(json_array_get(av, 0));
        for (size_t i = 0; i < CFG_NARCH; i++)
            if (!strcmp(name, cfg_archs[i].cls)) a = &cfg_archs[i];
        if (!a)
            return zs_err(ZS_EUNSUPPORTED,
                          "%s: unsupported architecture '%s' (supported: " CFG_SUPPORTED ")",
                          origin, name);
    } else if (model_type) {
        for (size_t i = 0; i < CFG_NARCH; i++)
            if (!strcmp(model_type, cfg_archs[i].model_type)) a = &cfg_archs[i];
        if (!a)
            return zs_err(ZS_EUNSUPPORTED,
                          "%s: no 'architectures' and unsupported model_type '%s' (supported: "
                          CFG_SUPPORTED ")", origin, model_type);
    } else {
        return zs_err(ZS_ENOTFOUND, "%s: required key 'architectures' is missing", origin);
    }
    c.arch = a->arch;
    c.family = a->family;
    snprintf(c.arch_name, sizeof c.arch_name, "%s", a->cls);

    /* dtype: torch_dtype, or "dtype" (newer transformers) */
    const char *dkey = json_object_get(root, "torch_dtype") ? "torch_dtype" : "dtype";
    ZS_CHECK(cfg_str(origin, root, dkey, &s));
    c.dtype = ZS_F32;
    if (s) {
        if (!strcmp(s, "float32")) c.dtype = ZS_F32;
        else if (!strcmp(s, "float16")) c.dtype = ZS_F16;
        else if (!strcmp(s, "bfloat16")) c.dtype = ZS_BF16;
        else
            return zs_err(ZS_EUNSUPPORTED,
                          "%s: '%s' is '%s' (supported: float32, float16, bfloat16)", origin, dkey,
                          s);
    }
    ZS_CHECK(cfg_token(origin, root, "bos_token_id", &c.bos_id));
    ZS_CHECK(cfg_token(origin, root, "eos_token_id", &c.eos_id));
    ZS_CHECK(cfg_int(origin, root, "vocab_size", 1, 0, 1, &c.vocab_size));

    if (a->arch == ZS_ARCH_GPT2) {
        ZS_CHECK(cfg_int(origin, root, "n_embd", 1, 0, 1, &c.dim));
        ZS_CHECK(cfg_int(origin, root, "n_layer", 1, 0, 1, &c.n_layers));
        ZS_CHECK(cfg_int(origin, root, "n_head", 1, 0, 1, &c.n_heads));
        if (c.dim > INT_MAX / 4) return zs_err(ZS_EINVAL, "%s: 'n_embd' is too large", origin);
        ZS_CHECK(cfg_int(origin, root, "n_inner", 0, 4 * c.dim, 1, &c.ffn_dim));
        ZS_CHECK(cfg_int(origin, root, "n_positions", 0, a->max_seq_default, 1, &c.max_seq));
        ZS_CHECK(cfg_float(origin, root, "layer_norm_epsilon", 1e-5f, &c.norm_eps));
        ZS_CHECK(cfg_bool(origin, root, "tie_word_embeddings", 1, &c.tied_embeddings));
        ZS_CHECK(cfg_str(origin, root, "activation_function", &s));
        if (s && strcmp(s, "gelu_new") && strcmp(s, "gelu_pytorch_tanh"))
            return zs_err(ZS_EUNSUPPORTED,
                          "%s: 'activation_function' is '%s' (supported: gelu_new, "
                          "gelu_pytorch_tanh)", origin, s);
        int flag;
        ZS_CHECK(cfg_bool(origin, root, "scale_attn_weights", 1, &flag));
        if (!flag)
            return zs_err(ZS_EUNSUPPORTED, "%s: 'scale_attn_weights' false is not supported",
                          origin);
        ZS_CHECK(cfg_bool(origin, root, "scale_attn_by_inverse_layer_idx", 0, &flag));
        if (flag)
            return zs_err(ZS_EUNSUPPORTED,
                          "%s: 'scale_attn_by_inverse_layer_idx' true is not supported", origin);
        if (c.dim % c.n_heads)
            return zs_err(ZS_EINVAL, "%s: 'n_head' (%d) does not divide 'n_embd' (%d)", origin,
                          c.n_heads, c.dim);
        c.n_kv_heads = c.n_heads;
        c.head_dim = c.dim / c.n_heads;
        c.rope_theta = 0;
        c.qkv_bias = c.o_bias = c.mlp_bias = 1;
        c.act = 1;
    } else {
        ZS_CHECK(cfg_int(origin, root, "hidden_size", 1, 0, 1, &c.dim));
        ZS_CHECK(cfg_int(origin, root, "num_hidden_layers", 1, 0, 1, &c.n_layers));
        ZS_CHECK(cfg_int(origin, root, "num_attention_heads", 1, 0, 1, &c.n_heads));
        /* num_key_value_heads: null = num_attention_heads; absent = the config class's default */
        int fam = a->family, kv_def = c.n_heads;
        if (!json_object_get(root, "num_key_value_heads"))
            kv_def = fam == ZS_FAM_MIXTRAL ? 8 : fam == ZS_FAM_QWEN2MOE ? 16 : fam == ZS_FAM_QWEN3MOE ? 4 : c.n_heads;
        ZS_CHECK(cfg_int(origin, root, "num_key_value_heads", 0, kv_def, 1, &c.n_kv_heads));
        ZS_CHECK(cfg_int(origin, root, "intermediate_size", 1, 0, 1, &c.ffn_dim));
        ZS_CHECK(cfg_int(origin, root, "max_position_embeddings", 0, a->max_seq_default, 1,
                         &c.max_seq));
        float eps_def = fam == ZS_FAM_PHI3 || fam == ZS_FAM_MIXTRAL || fam == ZS_FAM_OLMOE ? 1e-5f : 1e-6f;
        ZS_CHECK(cfg_float(origin, root, "rms_norm_eps", eps_def, &c.norm_eps));
        int gemma = a->family == ZS_FAM_GEMMA2 || a->family == ZS_FAM_GEMMA3;
        ZS_CHECK(cfg_bool(origin, root, "tie_word_embeddings", gemma, &c.tied_embeddings));
        json_t *hd = json_object_get(root, "head_dim");
        if (fam == ZS_FAM_OLMOE) hd = NULL; /* OlmoeAttention: always hidden_size / num_attention_heads */
        if (hd && !json_is_null(hd)) {
            ZS_CHECK(cfg_int(origin, root, "head_dim", 1, 0, 1, &c.head_dim));
        } else if (a->family == ZS_FAM_QWEN3 || gemma) { /* the config classes' own defaults */
            c.head_dim = gemma ? 256 : 128;
        } else {
            if (c.dim % c.n_heads)
                return zs_err(ZS_EINVAL,
                              "%s: 'num_attention_heads' (%d) does not divide 'hidden_size' (%d)",
                              origin, c.n_heads, c.dim);
            c.head_dim = c.dim / c.n_heads;
        }
        if (fam == ZS_FAM_QWEN2MOE && (int64_t)c.head_dim * c.n_heads != c.dim) /* Qwen2MoeAttention raises */
            return zs_err(ZS_EINVAL, "%s: 'head_dim' (%d) times 'num_attention_heads' (%d) must be 'hidden_size' "
                          "(%d) for Qwen2-MoE", origin, c.head_dim, c.n_heads, c.dim);
        if (c.head_dim % 2)
            return zs_err(ZS_EINVAL, "%s: 'head_dim' (%d) must be even for RoPE", origin,
                          c.head_dim);
        if (c.n_heads % c.n_kv_heads)
            return zs_err(ZS_EINVAL,
                          "%s: 'num_attention_heads' (%d) is not a multiple of "
                          "'num_key_value_heads' (%d)", origin, c.n_heads, c.n_kv_heads);
        ZS_CHECK(cfg_llama_family(origin, root, a, &c));
    }
    *out = c;
    return 0;
}

int zs_config_parse(const char *json_text, const char *origin, zs_model_config *out) {
    if (!origin) origin = "config.json";
    if (!json_text || !out) return zs_err(ZS_EINVAL, "%s: zs_config_parse: NULL argument", origin);
    json_error_t je;
    json_t *root = json_loads(json_text, 0, &je);
    if (!root)
        return zs_err(ZS_EFORMAT, "%s: not valid JSON (line %d, column %d: %s)", origin, je.line,
                      je.column, je.text);
    int rc;
    if (!json_is_object(root)) rc = zs_err(ZS_EFORMAT, "%s: not a JSON object", origin);
    else rc = cfg_parse_root(root, origin, out);
    json_decref(root);
    return rc;
}

static char *cfg_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    size_t k = a;
    if (a && dir[a - 1] != '/') p[k++] = '/';
    memcpy(p + k, name, b + 1);
    return p;
}

int zs_config_load(const char *dir, zs_model_config *out) {
    if (!dir || !out) return zs_err(ZS_EINVAL, "zs_config_load: NULL argument");
    char *path = cfg_join(dir, "config.json");
    if (!path) return zs_err(ZS_ENOMEM, "out of memory");
    int rc = 0;
    char *text = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0) {
        rc = zs_err(errno == ENOENT || errno == ENOTDIR ? ZS_ENOTFOUND : ZS_EIO,
                    "%s: cannot open: %s", path, strerror(errno));
    } else if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        rc = zs_err(ZS_EIO, "%s: not a readable regular file", path);
    } else if (st.st_size > CFG_MAX_FILE) {
        rc = zs_err(ZS_EFORMAT, "%s: absurdly large (%lld bytes)", path, (long long)st.st_size);
    } else if (!(text = malloc((size_t)st.st_size + 1))) {
        rc = zs_err(ZS_ENOMEM, "%s: out of memory", path);
    } else {
        size_t got = 0, want = (size_t)st.st_size;
        while (got < want) {
            ssize_t r = read(fd, text + got, want - got);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) break;
            got += (size_t)r;
        }
        if (got != want) rc = zs_err(ZS_EIO, "%s: read failed", path);
        text[got] = 0;
        if (rc == 0 && strlen(text) != got)
            rc = zs_err(ZS_EFORMAT, "%s: not valid JSON (contains a NUL byte)", path);
        if (rc == 0) rc = zs_config_parse(text, path, out);
    }
    if (fd >= 0) close(fd);
    free(text);
    free(path);
    return rc;
}

/* The double with the fewest significant digits that rounds back to f. */
static double cfg_short(float f) {
    char buf[32];
    for (int p = 1; p <= 9; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, (double)f);
        if (strtof(buf, NULL) == f) return strtod(buf, NULL);
    }
    return (double)f;
}

static int cfg_set(json_t *o, const char *k, json_t *v) { return json_object_set_new(o, k, v); }

/* rope_scaling as transformers writes it (null for the default). */
static json_t *cfg_rope_json(const zs_model_config *c) {
    const zs_rope_scaling *r = &c->rope;
    static const char *names[] = {"default", "linear", "dynamic", "llama3", "yarn", "longrope"};
    if (r->type == ZS_ROPE_DEFAULT || r->type < 0 || r->type > ZS_ROPE_LONGROPE) return json_null();
    json_t *o = json_object();
    if (c->family == ZS_FAM_PHI3 && r->type == ZS_ROPE_LONGROPE) {
        /* Phi3Config takes exactly {type, short_factor, long_factor} (the factor follows from the lengths) */
        json_t *sf = json_array(), *lf = json_array();
        for (int i = 0; i < r->n_factors; i++) {
            json_array_append_new(sf, json_real(cfg_short(r->short_factor[i])));
            json_array_append_new(lf, json_real(cfg_short(r->long_factor[i])));
        }
        cfg_set(o, "type", json_string("longrope"));
        cfg_set(o, "short_factor", sf);
        cfg_set(o, "long_factor", lf);
        return o;
    }
    cfg_set(o, "rope_type", json_string(names[r->type]));
    if (r->factor > 0) cfg_set(o, "factor", json_real(cfg_short(r->factor)));
    if (r->type == ZS_ROPE_LLAMA3) {
        cfg_set(o, "low_freq_factor", json_real(cfg_short(r->low_freq_factor)));
        cfg_set(o, "high_freq_factor", json_real(cfg_short(r->high_freq_factor)));
        cfg_set(o, "original_max_position_embeddings", json_integer(r->orig_max_pos));
    }
    if (r->type == ZS_ROPE_YARN) {
        if (r->orig_max_pos > 0) cfg_set(o, "original_max_position_embeddings", json_integer(r->orig_max_pos));
        if (r->beta_fast > 0) cfg_set(o, "beta_fast", json_real(cfg_short(r->beta_fast)));
        if (r->beta_slow > 0) cfg_set(o, "beta_slow", json_real(cfg_short(r->beta_slow)));
        if (r->mscale > 0) cfg_set(o, "mscale", json_real(cfg_short(r->mscale)));
        if (r->mscale_all_dim > 0) cfg_set(o, "mscale_all_dim", json_real(cfg_short(r->mscale_all_dim)));
        if (!r->truncate) cfg_set(o, "truncate", json_false());
    }
    if ((r->type == ZS_ROPE_YARN || r->type == ZS_ROPE_LONGROPE) && r->attention_factor > 0)
        cfg_set(o, "attention_factor", json_real(cfg_short(r->attention_factor)));
    if (r->type == ZS_ROPE_LONGROPE) {
        json_t *sf = json_array(), *lf = json_array();
        for (int i = 0; i < r->n_factors; i++) {
            json_array_append_new(sf, json_real(cfg_short(r->short_factor[i])));
            json_array_append_new(lf, json_real(cfg_short(r->long_factor[i])));
        }
        cfg_set(o, "short_factor", sf);
        cfg_set(o, "long_factor", lf);
    }
    return o;
}

static json_t *cfg_id(int id) { return id < 0 ? json_null() : json_integer(id); }

/* The mixture-of-experts keys of c into r (the other keys already there). */
static void cfg_moe_json(const zs_model_config *c, json_t *r) {
    int fam = c->family, qwen = fam == ZS_FAM_QWEN2MOE || fam == ZS_FAM_QWEN3MOE;
    cfg_set(r, fam == ZS_FAM_MIXTRAL ? "num_local_experts" : "num_experts", json_integer(c->n_experts));
    if (fam == ZS_FAM_OLMOE) cfg_set(r, "clip_qkv", c->clip_qkv > 0 ? json_real(cfg_short(c->clip_qkv)) : json_null());
    if (c->n_experts == 0) { /* Qwen's all-dense model: the other keys keep their defaults */
        if (qwen) cfg_set(r, "mlp_only_layers", json_array());
        return;
    }
    cfg_set(r, "num_experts_per_tok", json_integer(c->n_experts_used));
    if (qwen) cfg_set(r, "moe_intermediate_size", json_integer(c->moe_ffn_dim));
    if (fam == ZS_FAM_QWEN2MOE) cfg_set(r, "shared_expert_intermediate_size", json_integer(c->shared_ffn_dim));
    if (fam != ZS_FAM_MIXTRAL) cfg_set(r, "norm_topk_prob", json_boolean(c->norm_topk_prob));
    else cfg_set(r, "router_jitter_noise", json_real(0));
    cfg_set(r, "router_aux_loss_coef", json_real(cfg_short(c->router_aux_loss_coef)));
    cfg_set(r, "output_router_logits", json_boolean(c->output_router_logits));
    if (qwen) {
        /* the largest step that puts every sparse layer on (l + 1) % step == 0, the rest listed as dense */
        int L = c->n_layers < ZS_MAX_LAYERS ? c->n_layers : ZS_MAX_LAYERS, step = 1, any = 0;
        for (int l = 0; l < L; l++) any |= c->layer_moe[l];
        for (int s = any ? L : 1; s > 1; s--) {
            int ok = 1;
            for (int l = 0; l < L && ok; l++)
                if (c->layer_moe[l] && (l + 1) % s) ok = 0;
            if (ok) {
                step = s;
                break;
            }
        }
        json_t *only = json_array();
        for (int l = 0; l < L; l++)
            if ((l + 1) % step == 0 && !c->layer_moe[l]) json_array_append_new(only, json_integer(l));
        cfg_set(r, "decoder_sparse_step", json_integer(step));
        cfg_set(r, "mlp_only_layers", only);
    }
}

/* c as a config.json object (*out, owned by the caller); a = its architecture entry. */
static int cfg_build(const zs_model_config *c, const char *path, json_t **out, const cfg_arch **ap) {
    const cfg_arch *a = NULL;
    for (size_t i = 0; i < CFG_NARCH; i++)
        if (!strcmp(c->arch_name, cfg_archs[i].cls)) a = &cfg_archs[i];
    if (!a || a->arch != c->arch)
        return zs_err(ZS_EINVAL, "%s: cannot write config: architecture '%.63s' (arch %d) is not "
                      "one of " CFG_SUPPORTED, path, c->arch_name, (int)c->arch);
    if (!isfinite(c->norm_eps) || !isfinite(c->rope_theta) || (unsigned)c->dtype >= ZS_DTYPE_ELEM_COUNT)
        return zs_err(ZS_EINVAL, "%s: cannot write config: invalid norm_eps, rope_theta or dtype",
                      path);
    static const char *dnames[] = {"float32", "float16", "bfloat16"};
    json_t *r = json_object(), *arr = json_array();
    if (!r || !arr) {
        json_decref(r);
        json_decref(arr);
        return zs_err(ZS_ENOMEM, "out of memory");
    }
    json_array_append_new(arr, json_string(a->cls));
    cfg_set(r, "architectures", arr);
    cfg_set(r, "model_type", json_string(a->model_type));
    cfg_set(r, "vocab_size", json_integer(c->vocab_size));
    if (c->arch == ZS_ARCH_GPT2) {
        cfg_set(r, "activation_function", json_string("gelu_new"));
        cfg_set(r, "n_positions", json_integer(c->max_seq));
        cfg_set(r, "n_ctx", json_integer(c->max_seq));
        cfg_set(r, "n_embd", json_integer(c->dim));
        cfg_set(r, "n_layer", json_integer(c->n_layers));
        cfg_set(r, "n_head", json_integer(c->n_heads));
        cfg_set(r, "n_inner", json_integer(c->ffn_dim));
        cfg_set(r, "layer_norm_epsilon", json_real(cfg_short(c->norm_eps)));
    } else {
        cfg_set(r, "hidden_size", json_integer(c->dim));
        cfg_set(r, "intermediate_size", json_integer(c->ffn_dim));
        cfg_set(r, "num_hidden_layers", json_integer(c->n_layers));
        cfg_set(r, "num_attention_heads", json_integer(c->n_heads));
        cfg_set(r, "num_key_value_heads", json_integer(c->n_kv_heads));
        cfg_set(r, "head_dim", json_integer(c->head_dim));
        cfg_set(r, "max_position_embeddings",
                json_integer(c->rope.type == ZS_ROPE_DYNAMIC && c->rope.orig_max_pos > 0 ? c->rope.orig_max_pos : c->max_seq));
        cfg_set(r, "rms_norm_eps", json_real(cfg_short(c->norm_eps)));
        cfg_set(r, "rope_theta", json_real(cfg_short(c->rope_theta)));
        cfg_set(r, "rope_scaling", cfg_rope_json(c));
        int fam = c->family, gemma = fam == ZS_FAM_GEMMA2 || fam == ZS_FAM_GEMMA3;
        cfg_set(r, gemma ? "hidden_activation" : "hidden_act", json_string(c->act ? "gelu_pytorch_tanh" : "silu"));
        if (fam == ZS_FAM_LLAMA) { /* only plain llama has configurable MLP biases */
            cfg_set(r, "attention_bias", json_boolean(c->qkv_bias));
            cfg_set(r, "mlp_bias", json_boolean(c->mlp_bias));
        } else if (fam == ZS_FAM_QWEN3 || fam == ZS_FAM_QWEN3MOE || fam == ZS_FAM_OLMOE || gemma) {
            cfg_set(r, "attention_bias", json_boolean(c->qkv_bias));
        } else if (fam == ZS_FAM_QWEN2MOE) {
            cfg_set(r, "qkv_bias", json_boolean(c->qkv_bias));
        }
        if (c->rope.type == ZS_ROPE_LONGROPE && c->rope.orig_max_pos > 0)
            cfg_set(r, "original_max_position_embeddings", json_integer(c->rope.orig_max_pos));
        if (fam == ZS_FAM_PHI3) /* its config class defaults to 32000, past a small vocabulary */
            cfg_set(r, "pad_token_id", c->eos_id >= 0 ? json_integer(c->eos_id) : json_null());
        int moe_fam = fam == ZS_FAM_MIXTRAL || fam == ZS_FAM_QWEN2MOE || fam == ZS_FAM_QWEN3MOE || fam == ZS_FAM_OLMOE;
        if (fam == ZS_FAM_QWEN2 || fam == ZS_FAM_QWEN3 || fam == ZS_FAM_QWEN2MOE || fam == ZS_FAM_QWEN3MOE)
            cfg_set(r, "use_sliding_window", json_boolean(c->sliding_window > 0));
        if (fam != ZS_FAM_LLAMA && fam != ZS_FAM_OLMOE)
            cfg_set(r, "sliding_window", c->sliding_window ? json_integer(c->sliding_window) : json_null());
        if (c->sliding_window && fam != ZS_FAM_MISTRAL && fam != ZS_FAM_PHI3 && !moe_fam) {
            json_t *lt = json_array();
            for (int l = 0; l < c->n_layers; l++)
                json_array_append_new(lt, json_string(c->layer_sliding[l] ? "sliding_attention" : "full_attention"));
            cfg_set(r, "layer_types", lt);
        }
        if (gemma) {
            cfg_set(r, "query_pre_attn_scalar", json_real(cfg_short(c->query_pre_attn_scalar)));
            cfg_set(r, "attn_logit_softcapping", c->attn_softcap > 0 ? json_real(cfg_short(c->attn_softcap)) : json_null());
            cfg_set(r, "final_logit_softcapping", c->final_softcap > 0 ? json_real(cfg_short(c->final_softcap)) : json_null());
            if (fam == ZS_FAM_GEMMA3) {
                cfg_set(r, "rope_local_base_freq", json_real(cfg_short(c->rope_local_theta)));
                cfg_set(r, "sliding_window_pattern", json_integer(c->swa_pattern > 0 ? c->swa_pattern : 6));
            }
        }
        if (moe_fam) cfg_moe_json(c, r);
    }
    cfg_set(r, "tie_word_embeddings", json_boolean(c->tied_embeddings));
    cfg_set(r, "bos_token_id", cfg_id(c->bos_id));
    cfg_set(r, "eos_token_id", cfg_id(c->eos_id));
    cfg_set(r, "torch_dtype", json_string(dnames[c->dtype]));
    *out = r;
    *ap = a;
    return 0;
}

int zs_config_override(zs_model_config *c, const char *json_text, const char *origin) {
    if (!c || !json_text) return zs_err(ZS_EINVAL, "zs_config_override: NULL argument");
    if (!origin) origin = "overrides";
    json_error_t je;
    json_t *ov = json_loads(json_text, 0, &je);
    if (!ov) return zs_err(ZS_EFORMAT, "%s: not valid JSON (line %d, column %d: %s)", origin, je.line, je.column, je.text);
    if (!json_is_object(ov)) {
        json_decref(ov);
        return zs_err(ZS_EFORMAT, "%s: not a JSON object", origin);
    }
    json_t *r;
    const cfg_arch *a;
    int rc = cfg_build(c, origin, &r, &a);
    if (rc == 0 && json_object_update(r, ov) != 0) rc = zs_err(ZS_ENOMEM, "out of memory");
    json_decref(ov);
    if (rc < 0) {
        json_decref(r);
        return rc;
    }
    zs_model_config b;
    rc = cfg_parse_root(r, origin, &b);
    json_decref(r);
    if (rc == 0) *c = b;
    return rc;
}

int zs_config_write(const zs_model_config *c, const char *path) {
    if (!c || !path) return zs_err(ZS_EINVAL, "zs_config_write: NULL argument");
    json_t *r;
    const cfg_arch *a;
    ZS_CHECK(cfg_build(c, path, &r, &a));
    char *text = json_dumps(r, JSON_INDENT(2) | JSON_REAL_PRECISION(9));
    json_decref(r);
    if (!text) return zs_err(ZS_ENOMEM, "out of memory");

    /* Whatever is written must read back equal: parse it and compare field by field. */
    zs_model_config b;
    int rc = zs_config_parse(text, path, &b);
    if (rc < 0) {
        free(text);
        return zs_err_prefix(ZS_EINVAL, "cannot write config");
    }
#define CFG_SAME(f)                                                                         \
    if (rc == 0 && b.f != c->f)                                                             \
        rc = zs_err(ZS_EINVAL, "%s: cannot write config: field '" #f "' is not expressible " \
                    "for %s (it would read back differently)", path, a->cls);
    CFG_SAME(arch) CFG_SAME(n_layers) CFG_SAME(dim) CFG_SAME(n_heads) CFG_SAME(n_kv_heads)
    CFG_SAME(head_dim) CFG_SAME(ffn_dim) CFG_SAME(vocab_size) CFG_SAME(max_seq)
    CFG_SAME(norm_eps) CFG_SAME(rope_theta) CFG_SAME(tied_embeddings) CFG_SAME(qkv_bias)
    CFG_SAME(o_bias) CFG_SAME(mlp_bias) CFG_SAME(bos_id) CFG_SAME(eos_id) CFG_SAME(dtype)
    CFG_SAME(act) CFG_SAME(family) CFG_SAME(rope_local_theta) CFG_SAME(qk_norm) CFG_SAME(norm_offset)
    CFG_SAME(post_norms) CFG_SAME(embed_scale) CFG_SAME(attn_softcap) CFG_SAME(final_softcap)
    CFG_SAME(query_pre_attn_scalar) CFG_SAME(sliding_window)
    CFG_SAME(n_experts) CFG_SAME(n_experts_used) CFG_SAME(moe_ffn_dim) CFG_SAME(shared_ffn_dim)
    CFG_SAME(norm_topk_prob) CFG_SAME(router_aux_loss_coef) CFG_SAME(output_router_logits)
    CFG_SAME(qk_norm_full) CFG_SAME(clip_qkv)
#undef CFG_SAME
    if (rc == 0 && memcmp(&b.rope, &c->rope, sizeof b.rope))
        rc = zs_err(ZS_EINVAL, "%s: cannot write config: the RoPE scaling is not expressible for %s (it would "
                    "read back differently)", path, a->cls);
    if (rc == 0 && c->sliding_window && memcmp(b.layer_sliding, c->layer_sliding, (size_t)c->n_layers))
        rc = zs_err(ZS_EINVAL, "%s: cannot write config: the sliding layers are not expressible for %s", path, a->cls);
    if (rc == 0 && c->n_experts > 0 && memcmp(b.layer_moe, c->layer_moe, (size_t)c->n_layers))
        rc = zs_err(ZS_EINVAL, "%s: cannot write config: the sparse (mixture-of-experts) layers are not expressible "
                    "for %s", path, a->cls);
    if (rc < 0) {
        free(text);
        return rc;
    }

    size_t pl = strlen(path), tl = strlen(text);
    char *tmp = malloc(pl + 5);
    if (!tmp) {
        free(text);
        return zs_err(ZS_ENOMEM, "out of memory");
    }
    memcpy(tmp, path, pl);
    memcpy(tmp + pl, ".tmp", 5);
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        rc = zs_err(ZS_EIO, "%s: cannot create: %s", tmp, strerror(errno));
    } else {
        int ok = fwrite(text, 1, tl, f) == tl && fputc('\n', f) != EOF && fflush(f) == 0 &&
                 fsync(fileno(f)) == 0;
        int e = errno;
        if (fclose(f) != 0 && ok) {
            ok = 0;
            e = errno;
        }
        if (!ok) rc = zs_err(e == ENOSPC ? ZS_ENOSPC : ZS_EIO, "%s: cannot write: %s", tmp,
                             strerror(e));
        else if (rename(tmp, path) != 0)
            rc = zs_err(ZS_EIO, "%s: cannot rename into place: %s", path, strerror(errno));
        if (rc < 0) unlink(tmp);
    }
    free(tmp);
    free(text);
    return rc;
}
