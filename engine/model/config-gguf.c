/* config-gguf.c — zs_model_config from a GGUF file's metadata (llama.cpp's <arch>.* keys, and the
 * RoPE factor tensors), the reading side of gguf-convert.c's hyperparameters: llama (Llama, Mistral,
 * and Mixtral when it has experts), qwen2, qwen3, gemma2, gemma3, phi3, gpt2 and the mixtures of
 * experts qwen2moe, qwen3moe and olmoe, with what llama.cpp hard-codes per architecture (Gemma's
 * attention scale, sliding-layer pattern, local RoPE base, embedding scale; the experts' top-k
 * renormalisation). See config.h. */
#include "config.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common.h"
#include "gguf.h"
#include "model.h" /* ZS_MAX_EXPERTS */

/* Names <arch>.<key> in k and looks it up: 1 present, 0 absent (and not required), or
 * ZS_ENOTFOUND when a required key is missing. */
static int gg_key(const zs_gguf *g, const char *arch, const char *key, int required, char *k, size_t cap) {
    snprintf(k, cap, "%s.%s", arch, key);
    if (zs_gguf_find_key(g, k) >= 0) return 1;
    return required ? zs_err(ZS_ENOTFOUND, "%s: required key '%s' is missing", zs_gguf_path(g), k) : 0;
}

/* <arch>.<key> as a positive int: absent -> def (or ZS_ENOTFOUND when required). */
static int gg_int(const zs_gguf *g, const char *arch, const char *key, int required, int def,
                  int *out) {
    char k[160];
    int rc = gg_key(g, arch, key, required, k, sizeof k);
    if (rc <= 0) {
        if (rc == 0) *out = def;
        return rc;
    }
    int64_t v;
    ZS_CHECK(zs_gguf_get_i64(g, k, &v));
    if (v < 1 || v > INT_MAX)
        return zs_err(ZS_EINVAL, "%s: '%s' is %lld; it must be a positive integer", zs_gguf_path(g),
                      k, (long long)v);
    *out = (int)v;
    return 0;
}

/* <arch>.<key> as a positive finite float: absent -> def (or ZS_ENOTFOUND when required). */
static int gg_float(const zs_gguf *g, const char *arch, const char *key, int required, float def,
                    float *out) {
    char k[160];
    int rc = gg_key(g, arch, key, required, k, sizeof k);
    if (rc <= 0) {
        if (rc == 0) *out = def;
        return rc;
    }
    double d;
    ZS_CHECK(zs_gguf_get_f64(g, k, &d));
    float f = (float)d;
    if (!(d > 0) || !isfinite(f) || f == 0)
        return zs_err(ZS_EINVAL, "%s: '%s' is %g, must be a positive float", zs_gguf_path(g), k, d);
    *out = f;
    return 0;
}

static int gg_token(const zs_gguf *g, const char *key, int *out) {
    *out = -1;
    if (zs_gguf_find_key(g, key) < 0) return 0;
    uint32_t v;
    ZS_CHECK(zs_gguf_get_u32(g, key, &v));
    if (v > INT_MAX) return zs_err(ZS_ERANGE, "%s: '%s' is out of range", zs_gguf_path(g), key);
    *out = (int)v;
    return 0;
}

/* <arch>.<key> as a float of any sign: 1 found (in *out), 0 absent. */
static int gg_num(const zs_gguf *g, const char *arch, const char *key, float *out) {
    char k[160];
    if (gg_key(g, arch, key, 0, k, sizeof k) == 0) return 0;
    double d;
    ZS_CHECK(zs_gguf_get_f64(g, k, &d));
    if (!isfinite((float)d)) return zs_err(ZS_EINVAL, "%s: '%s' is %g, not a finite float", zs_gguf_path(g), k, d);
    *out = (float)d;
    return 1;
}

/* A 1-D F32 tensor of n positive values (rope_freqs, rope_factors_*): 1 copied into dst, 0 absent. */
static int gg_factors(const zs_gguf *g, const char *name, int n, float *dst) {
    const zs_gguf_tensor *t = zs_gguf_find_tensor(g, name);
    if (!t) return 0;
    if (t->type != ZS_GGML_F32 || t->n_dims != 1 || t->ne[0] != n)
        return zs_err(ZS_ESHAPE, "%s: tensor '%s' must be F32 of %d values (head_dim / 2)", zs_gguf_path(g), name, n);
    memcpy(dst, t->data, (size_t)n * sizeof(float));
    for (int i = 0; i < n; i++)
        if (!(dst[i] > 0) || !isfinite(dst[i]))
            return zs_err(ZS_EINVAL, "%s: tensor '%s'[%d] is %g, not a positive factor", zs_gguf_path(g), name, i,
                          (double)dst[i]);
    return 1;
}

static const struct {
    const char *arch, *cls;
    int family;
} gg_archs[] = {
    {"llama", "LlamaForCausalLM", ZS_FAM_LLAMA},     {"qwen2", "Qwen2ForCausalLM", ZS_FAM_QWEN2},
    {"qwen3", "Qwen3ForCausalLM", ZS_FAM_QWEN3},     {"gemma2", "Gemma2ForCausalLM", ZS_FAM_GEMMA2},
    {"gemma3", "Gemma3ForCausalLM", ZS_FAM_GEMMA3},  {"phi3", "Phi3ForCausalLM", ZS_FAM_PHI3},
    {"gpt2", "GPT2LMHeadModel", ZS_FAM_GPT2},
    /* mixtures of experts (llama with <arch>.expert_count > 0 is Mixtral) */
    {"qwen2moe", "Qwen2MoeForCausalLM", ZS_FAM_QWEN2MOE}, {"qwen3moe", "Qwen3MoeForCausalLM", ZS_FAM_QWEN3MOE},
    {"olmoe", "OlmoeForCausalLM", ZS_FAM_OLMOE},
};

/* RoPE scaling as llama.cpp reads it: rope.scaling.type linear / yarn (none and absent: no scaling),
 * a llama rope_freqs tensor (Llama 3's divisors), phi3's rope_factors_long / _short. The per-frequency
 * tensors are held as LongRoPE factors (rope.h: inv_freq = 1 / (factor * base^(2i/d))), which is
 * llama.cpp's arithmetic; for rope_freqs long = short and no attention factor. */
static int gg_rope(const zs_gguf *g, const char *arch, zs_model_config *c) {
    const char *path = zs_gguf_path(g);
    zs_rope_scaling *r = &c->rope;
    memset(r, 0, sizeof *r);
    char k[160];
    const char *st = "none";
    if (gg_key(g, arch, "rope.scaling.type", 0, k, sizeof k)) ZS_CHECK(zs_gguf_get_str(g, k, &st, NULL));
    float factor = 0, af = 0, ylm = 0;
    int rc = gg_num(g, arch, "rope.scaling.factor", &factor);
    if (rc == 0) rc = gg_num(g, arch, "rope.scale_linear", &factor); /* the older key */
    ZS_CHECK(rc);
    int has_af;
    ZS_CHECK(has_af = gg_num(g, arch, "rope.scaling.attn_factor", &af));
    int orig = 0;
    ZS_CHECK(gg_int(g, arch, "rope.scaling.original_context_length", 0, 0, &orig));
    ZS_CHECK(rc = gg_num(g, arch, "rope.scaling.yarn_log_multiplier", &ylm));
    if (rc > 0 && ylm != 0)
        return zs_err(ZS_EUNSUPPORTED, "%s: '%s.rope.scaling.yarn_log_multiplier' (DeepSeek's YaRN) is not supported",
                      path, arch);
    int half = c->head_dim / 2;
    if (half > ZS_ROPE_MAX_FACTORS) return zs_err(ZS_EINVAL, "%s: head_dim %d is too large", path, c->head_dim);
    int has_freqs = 0, has_long = 0, has_short = 0;
    if (c->family == ZS_FAM_LLAMA || c->family == ZS_FAM_MIXTRAL)
        ZS_CHECK(has_freqs = gg_factors(g, "rope_freqs.weight", half, r->long_factor));
    if (c->family == ZS_FAM_PHI3) {
        ZS_CHECK(has_long = gg_factors(g, "rope_factors_long.weight", half, r->long_factor));
        ZS_CHECK(has_short = gg_factors(g, "rope_factors_short.weight", half, r->short_factor));
        if (has_long != has_short)
            return zs_err(ZS_EFORMAT, "%s: 'rope_factors_%s.weight' without 'rope_factors_%s.weight'", path,
                          has_long ? "long" : "short", has_long ? "short" : "long");
    }
    int linear = !strcmp(st, "linear"), yarn = !strcmp(st, "yarn");
    if (strcmp(st, "none") && !linear && !yarn)
        return zs_err(ZS_EUNSUPPORTED, "%s: '%s' is '%.40s' (supported: none, linear, yarn)", path, k, st);
    if (yarn && !(factor > 0))
        return zs_err(ZS_EINVAL, "%s: yarn RoPE scaling without a positive '%s.rope.scaling.factor'", path, arch);
    int scaled = (linear || yarn) && factor > 0 && factor != 1.0f;
    if ((has_freqs || has_long) && scaled)
        return zs_err(ZS_EUNSUPPORTED, "%s: RoPE frequency factors together with %s scaling are not supported", path, st);
    if (has_freqs && has_long)
        return zs_err(ZS_EUNSUPPORTED, "%s: both rope_freqs and rope_factors_long", path);
    if (has_freqs) { /* llama.cpp: angle / rope_freqs[i], the same for every position */
        r->type = ZS_ROPE_LONGROPE;
        r->n_factors = half;
        memcpy(r->short_factor, r->long_factor, (size_t)half * sizeof(float));
        r->attention_factor = has_af ? af : 1.0f;
        r->orig_max_pos = c->max_seq;
    } else if (has_long) { /* phi3: long factors past the original context */
        r->type = ZS_ROPE_LONGROPE;
        r->n_factors = half;
        r->orig_max_pos = orig > 0 ? orig : c->max_seq;
        r->attention_factor = has_af ? af : 1.0f; /* llama.cpp's default: 1 */
    } else if (yarn) {
        r->type = ZS_ROPE_YARN;
        r->factor = factor;
        r->orig_max_pos = orig;
        r->truncate = 1;
        /* llama.cpp: cos, sin times attn_factor * (1 + 0.1 ln factor) */
        if (has_af) r->attention_factor = (float)((double)af * (1.0 + 0.1 * log((double)factor)));
    } else if (scaled && linear) {
        r->type = ZS_ROPE_LINEAR;
        r->factor = factor;
    } else if (has_af && af != 1.0f) {
        return zs_err(ZS_EUNSUPPORTED, "%s: '%s.rope.scaling.attn_factor' %g without YaRN or LongRoPE is not supported",
                      path, arch, (double)af);
    }
    return 0;
}

/* <arch>.<key> as an integer >= 0: 1 found (in *out), 0 absent. */
static int gg_count(const zs_gguf *g, const char *arch, const char *key, int *out) {
    char k[160];
    if (gg_key(g, arch, key, 0, k, sizeof k) == 0) return 0;
    int64_t v;
    ZS_CHECK(zs_gguf_get_i64(g, k, &v));
    if (v < 0 || v > INT_MAX)
        return zs_err(ZS_EINVAL, "%s: '%s' is %lld; it must be a non-negative integer", zs_gguf_path(g), k, (long long)v);
    *out = (int)v;
    return 1;
}

/* The experts as llama.cpp reads them: <arch>.expert_count, expert_used_count, the experts' width
 * expert_feed_forward_length (qwen2moe, qwen3moe; absent: feed_forward_length / expert_used_count) or
 * feed_forward_length itself (llama, olmoe), qwen2moe's shared expert expert_shared_feed_forward_length
 * (absent: feed_forward_length), and the renormalisation of the top-k weights that llama.cpp's graphs
 * hard-code (llama and qwen3moe: yes; qwen2moe and olmoe: no). Every layer routes, as llama.cpp has
 * it; for qwen2moe / qwen3moe a layer with a dense ffn_up and no ffn_gate_inp (what an mlp_only_layers
 * checkpoint converts to) is dense. A llama file with experts becomes Mixtral. */
static int gg_moe(const zs_gguf *g, const char *arch, zs_model_config *c) {
    const char *path = zs_gguf_path(g);
    int fam = c->family, n = 0, k = 0, has_n, has_k;
    ZS_CHECK(has_n = gg_count(g, arch, "expert_count", &n));
    ZS_CHECK(has_k = gg_count(g, arch, "expert_used_count", &k));
    if (fam == ZS_FAM_LLAMA && n > 0) {
        fam = c->family = ZS_FAM_MIXTRAL;
        snprintf(c->arch_name, sizeof c->arch_name, "MixtralForCausalLM");
    }
    int moe = fam == ZS_FAM_MIXTRAL || fam == ZS_FAM_QWEN2MOE || fam == ZS_FAM_QWEN3MOE || fam == ZS_FAM_OLMOE;
    if (!moe) {
        if (has_n && n > 0)
            return zs_err(ZS_EUNSUPPORTED, "%s: '%s.expert_count' is %d; %s has no mixture of experts", path, arch, n,
                          arch);
        return 0;
    }
    if (!has_n || n < 1)
        return zs_err(has_n ? ZS_EINVAL : ZS_ENOTFOUND, "%s: '%s.expert_count' %s; %s needs at least one expert",
                      path, arch, has_n ? "is 0" : "is missing", arch);
    if (n > ZS_MAX_EXPERTS)
        return zs_err(ZS_EUNSUPPORTED, "%s: '%s.expert_count' is %d; at most %d experts are supported", path, arch, n,
                      ZS_MAX_EXPERTS);
    if (!has_k || k < 1 || k > n)
        return zs_err(has_k ? ZS_EINVAL : ZS_ENOTFOUND, "%s: '%s.expert_used_count' %s; it must be from 1 to "
                      "'%s.expert_count' (%d)", path, arch, has_k ? "is out of range" : "is missing", arch, n);
    c->n_experts = n;
    c->n_experts_used = k;
    int qwen = fam == ZS_FAM_QWEN2MOE || fam == ZS_FAM_QWEN3MOE;
    c->moe_ffn_dim = c->ffn_dim;
    if (qwen) ZS_CHECK(gg_int(g, arch, "expert_feed_forward_length", 0, c->ffn_dim / k, &c->moe_ffn_dim));
    if (c->moe_ffn_dim < 1)
        return zs_err(ZS_EINVAL, "%s: the experts' width (%s.feed_forward_length / expert_used_count) is 0", path, arch);
    int sh = 0, has_sh;
    ZS_CHECK(has_sh = gg_count(g, arch, "expert_shared_feed_forward_length", &sh));
    if (fam == ZS_FAM_QWEN2MOE) {
        c->shared_ffn_dim = has_sh && sh > 0 ? sh : c->ffn_dim;
    } else if (has_sh && sh > 0) {
        return zs_err(ZS_EUNSUPPORTED, "%s: '%s.expert_shared_feed_forward_length' is %d; only qwen2moe's shared "
                      "expert is supported", path, arch, sh);
    }
    c->norm_topk_prob = fam == ZS_FAM_MIXTRAL || fam == ZS_FAM_QWEN3MOE;
    c->router_aux_loss_coef = fam == ZS_FAM_OLMOE ? 0.01f : 0.001f; /* not in GGUF: transformers' defaults */
    c->output_router_logits = 0;
    /* the gating llama.cpp uses for these is softmax whatever the file says; say so when it differs */
    char key[160];
    int gf = 0;
    ZS_CHECK(gg_count(g, arch, "expert_gating_func", &gf));
    if (gf > 1) zs_log_info("%s: '%s.expert_gating_func' %d is ignored (softmax), as llama.cpp does for %s", path, arch, gf, arch);
    if (gg_key(g, arch, "expert_weights_norm", 0, key, sizeof key) > 0)
        zs_log_info("%s: '%s' is ignored (%s renormalises the top-k weights %s), as llama.cpp does", path, key, arch,
                    c->norm_topk_prob ? "always" : "never");
    if (fam == ZS_FAM_OLMOE) {
        c->qk_norm_full = 1;
        float clip = 0;
        int rc;
        ZS_CHECK(rc = gg_num(g, arch, "attention.clamp_kqv", &clip));
        if (rc > 0 && clip < 0)
            return zs_err(ZS_EINVAL, "%s: '%s.attention.clamp_kqv' is %g; it must be positive", path, arch, (double)clip);
        c->clip_qkv = clip;
    }
    for (int l = 0; l < c->n_layers; l++) {
        char t[96];
        snprintf(t, sizeof t, "blk.%d.ffn_gate_inp.weight", l);
        int dense = 0;
        if (qwen && !zs_gguf_find_tensor(g, t)) {
            snprintf(t, sizeof t, "blk.%d.ffn_up.weight", l);
            dense = zs_gguf_find_tensor(g, t) != NULL;
        }
        c->layer_moe[l] = !dense;
    }
    return 0;
}

int zs_config_from_gguf(const zs_gguf *g, zs_model_config *out) {
    if (!g || !out) return zs_err(ZS_EINVAL, "zs_config_from_gguf: NULL argument");
    const char *path = zs_gguf_path(g), *arch;
    if (zs_gguf_find_key(g, "general.architecture") < 0)
        return zs_err(ZS_ENOTFOUND, "%s: required key 'general.architecture' is missing", path);
    ZS_CHECK(zs_gguf_get_str(g, "general.architecture", &arch, NULL));
    zs_model_config c;
    memset(&c, 0, sizeof c);
    size_t ai = 0, na = sizeof gg_archs / sizeof gg_archs[0];
    while (ai < na && strcmp(arch, gg_archs[ai].arch)) ai++;
    if (ai == na)
        return zs_err(ZS_EUNSUPPORTED, "%s: general.architecture '%.60s' is not supported (supported: "
                      "llama, qwen2, qwen3, gemma2, gemma3, phi3, gpt2, qwen2moe, qwen3moe, olmoe)", path, arch);
    int fam = gg_archs[ai].family, gpt2 = fam == ZS_FAM_GPT2, qwen2 = fam == ZS_FAM_QWEN2;
    int gemma = fam == ZS_FAM_GEMMA2 || fam == ZS_FAM_GEMMA3;
    c.arch = gpt2 ? ZS_ARCH_GPT2 : ZS_ARCH_LLAMA;
    c.family = fam;
    snprintf(c.arch_name, sizeof c.arch_name, "%s", gg_archs[ai].cls);
    ZS_CHECK(gg_int(g, arch, "context_length", 1, 0, &c.max_seq));
    ZS_CHECK(gg_int(g, arch, "embedding_length", 1, 0, &c.dim));
    ZS_CHECK(gg_int(g, arch, "block_count", 1, 0, &c.n_layers));
    ZS_CHECK(gg_int(g, arch, "feed_forward_length", 1, 0, &c.ffn_dim));
    ZS_CHECK(gg_int(g, arch, "attention.head_count", 1, 0, &c.n_heads));
    ZS_CHECK(gg_int(g, arch, "attention.head_count_kv", 0, c.n_heads, &c.n_kv_heads));
    if (c.n_layers > ZS_MAX_LAYERS)
        return zs_err(ZS_EINVAL, "%s: '%s.block_count' is %d; at most %d are supported", path, arch, c.n_layers,
                      ZS_MAX_LAYERS);
    /* vocab: the token list when there is one, else <arch>.vocab_size */
    size_t nv = 0;
    if (zs_gguf_find_key(g, "tokenizer.ggml.tokens") >= 0) {
        ZS_CHECK(zs_gguf_get_arr(g, "tokenizer.ggml.tokens", NULL, &nv));
        if (nv < 1 || nv > INT_MAX)
            return zs_err(ZS_EINVAL, "%s: 'tokenizer.ggml.tokens' has %zu entries", path, nv);
        c.vocab_size = (int)nv;
    } else {
        ZS_CHECK(gg_int(g, arch, "vocab_size", 1, 0, &c.vocab_size));
    }
    ZS_CHECK(gg_token(g, "tokenizer.ggml.bos_token_id", &c.bos_id));
    ZS_CHECK(gg_token(g, "tokenizer.ggml.eos_token_id", &c.eos_id));
    /* llama.cpp's gemma2 always takes the embedding as the head */
    c.tied_embeddings = fam == ZS_FAM_GEMMA2 || zs_gguf_find_tensor(g, "output.weight") == NULL;
    const zs_gguf_tensor *te = zs_gguf_find_tensor(g, "token_embd.weight");
    c.dtype = te && te->type == ZS_GGML_F16 ? ZS_F16 : te && te->type == ZS_GGML_BF16 ? ZS_BF16 : ZS_F32;
    if (gpt2) {
        ZS_CHECK(gg_float(g, arch, "attention.layer_norm_epsilon", 1, 0, &c.norm_eps));
        if (c.dim % c.n_heads)
            return zs_err(ZS_EINVAL, "%s: 'gpt2.attention.head_count' (%d) does not divide "
                          "'gpt2.embedding_length' (%d)", path, c.n_heads, c.dim);
        c.n_kv_heads = c.n_heads;
        c.head_dim = c.dim / c.n_heads;
        c.rope_theta = 0;
        c.qkv_bias = c.o_bias = c.mlp_bias = 1;
        c.act = 1;
        *out = c;
        return 0;
    }
    char k[160];
    ZS_CHECK(gg_float(g, arch, "attention.layer_norm_rms_epsilon", 1, 0, &c.norm_eps));
    ZS_CHECK(gg_float(g, arch, "rope.freq_base", 0, 10000.0f, &c.rope_theta));
    if (c.dim % c.n_heads && gg_key(g, arch, "attention.key_length", 0, k, sizeof k) == 0)
        return zs_err(ZS_EINVAL, "%s: '%s.attention.head_count' (%d) does not divide "
                      "'%s.embedding_length' (%d)", path, arch, c.n_heads, arch, c.dim);
    ZS_CHECK(gg_int(g, arch, "attention.key_length", 0, c.dim / c.n_heads, &c.head_dim));
    int vl, rd;
    ZS_CHECK(gg_int(g, arch, "attention.value_length", 0, c.head_dim, &vl));
    ZS_CHECK(gg_int(g, arch, "rope.dimension_count", 0, c.head_dim, &rd));
    if (vl != c.head_dim)
        return zs_err(ZS_EUNSUPPORTED, "%s: '%s.attention.value_length' (%d) differs from the key "
                      "length (%d)", path, arch, vl, c.head_dim);
    if (rd != c.head_dim)
        return zs_err(ZS_EUNSUPPORTED, "%s: '%s.rope.dimension_count' is %d; RoPE over part of a "
                      "head (head_dim %d) is not supported", path, arch, rd, c.head_dim);
    if (c.head_dim % 2)
        return zs_err(ZS_EINVAL, "%s: head_dim (%d) must be even for RoPE", path, c.head_dim);
    if (c.n_kv_heads > c.n_heads || c.n_heads % c.n_kv_heads)
        return zs_err(ZS_EINVAL, "%s: '%s.attention.head_count' (%d) is not a multiple of "
                      "'%s.attention.head_count_kv' (%d)", path, arch, c.n_heads, arch, c.n_kv_heads);
    ZS_CHECK(gg_moe(g, arch, &c));
    ZS_CHECK(gg_rope(g, arch, &c));
    /* biases: Qwen2 q, k, v always; the others when the file has them */
    c.qkv_bias = qwen2 || zs_gguf_find_tensor(g, "blk.0.attn_q.bias") != NULL;
    c.o_bias = !qwen2 && zs_gguf_find_tensor(g, "blk.0.attn_output.bias") != NULL;
    c.act = gemma;
    c.qk_norm = fam == ZS_FAM_QWEN3 || fam == ZS_FAM_GEMMA3 || fam == ZS_FAM_QWEN3MOE;
    /* sliding window: gemma2 (default 4096), gemma3 (required) every layer but each second / sixth; phi3
     * every layer (which llama.cpp itself leaves unapplied: a checkpoint's window is kept here) */
    int window = 0;
    if (gemma || fam == ZS_FAM_PHI3) {
        int64_t w = fam == ZS_FAM_GEMMA2 ? 4096 : 0;
        int rc;
        ZS_CHECK(rc = gg_key(g, arch, "attention.sliding_window", fam == ZS_FAM_GEMMA3, k, sizeof k));
        if (rc > 0) ZS_CHECK(zs_gguf_get_i64(g, k, &w));
        if (w < 0 || w > c.max_seq)
            return zs_err(ZS_EINVAL, "%s: '%s' is %lld; it must be from 0 to the context length %d", path, k,
                          (long long)w, c.max_seq);
        window = (int)w;
    }
    if (window) {
        c.sliding_window = window;
        c.swa_pattern = fam == ZS_FAM_GEMMA2 ? 2 : fam == ZS_FAM_GEMMA3 ? 6 : 0;
        for (int l = 0; l < c.n_layers; l++) c.layer_sliding[l] = c.swa_pattern ? (l + 1) % c.swa_pattern != 0 : 1;
    }
    if (gemma) {
        /* the norms hold 1 + w already (the converter adds it); the rest is what llama.cpp hard-codes */
        c.norm_offset = 0;
        c.post_norms = 1;
        c.embed_scale = sqrtf((float)c.dim);
        int big = c.n_layers == (fam == ZS_FAM_GEMMA2 ? 46 : 62); /* the 27B sizes */
        c.query_pre_attn_scalar = (float)(big ? c.dim / c.n_heads : c.head_dim);
        if (fam == ZS_FAM_GEMMA2) {
            ZS_CHECK(gg_float(g, arch, "attn_logit_softcapping", 0, 50.0f, &c.attn_softcap));
            ZS_CHECK(gg_float(g, arch, "final_logit_softcapping", 0, 30.0f, &c.final_softcap));
        } else {
            c.rope_local_theta = 10000.0f;
        }
    }
    ZS_CHECK(zs_config_check_rope(&c, path));
    *out = c;
    return 0;
}
