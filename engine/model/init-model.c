/* init-model.c — random-initialised models in Hugging Face layout, with a byte-level tokenizer:
 * 256 byte tokens, filler tokens up to vocab_size-1, and <|endoftext|> as BOS/EOS. */
#include "init-model.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <string.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "model.h" /* ZS_MAX_EXPERTS */
#include "safetensors.h"
#include "tensor.h"

int zs_init_opts_default(const char *arch, zs_init_opts *o) {
    memset(o, 0, sizeof *o);
    zs_model_config *c = &o->cfg;
    o->seed = 1234;
    o->init_std = 0.02f;
    c->dtype = ZS_F32;
    c->bos_id = c->eos_id = -1;
    if (!strcmp(arch, "llama")) {
        c->arch = ZS_ARCH_LLAMA;
        snprintf(c->arch_name, sizeof c->arch_name, "LlamaForCausalLM");
        c->n_layers = 4; c->dim = 256; c->n_heads = 8; c->n_kv_heads = 4; c->head_dim = 32;
        c->ffn_dim = 688; c->vocab_size = 512; c->max_seq = 1024;
        c->norm_eps = 1e-5f; c->rope_theta = 10000.0f; c->tied_embeddings = 0;
    } else if (!strcmp(arch, "gpt2")) {
        c->arch = ZS_ARCH_GPT2;
        snprintf(c->arch_name, sizeof c->arch_name, "GPT2LMHeadModel");
        c->n_layers = 4; c->dim = 256; c->n_heads = 8; c->n_kv_heads = 8; c->head_dim = 32;
        c->ffn_dim = 1024; c->vocab_size = 512; c->max_seq = 1024;
        c->norm_eps = 1e-5f; c->tied_embeddings = 1; c->act = 1;
        c->qkv_bias = c->o_bias = c->mlp_bias = 1;
    } else {
        /* the newer llama-family checkpoints: small, with their real ratios (GQA, head_dim 128 / 256
         * independent of dim / heads where the family has it) */
        static const struct {
            const char *name, *cls;
            int fam, layers, dim, heads, kv, hd, ffn, ctx, tied;
            float eps, theta;
        } F[] = {
            {"mistral", "MistralForCausalLM", ZS_FAM_MISTRAL, 4, 256, 4, 1, 128, 688, 1024, 0, 1e-5f, 10000.0f},
            {"qwen2", "Qwen2ForCausalLM", ZS_FAM_QWEN2, 4, 256, 4, 2, 64, 688, 1024, 0, 1e-6f, 1000000.0f},
            {"qwen3", "Qwen3ForCausalLM", ZS_FAM_QWEN3, 4, 256, 4, 2, 128, 688, 1024, 1, 1e-6f, 1000000.0f},
            {"gemma2", "Gemma2ForCausalLM", ZS_FAM_GEMMA2, 4, 256, 2, 1, 256, 1024, 1024, 1, 1e-6f, 10000.0f},
            {"gemma3", "Gemma3ForCausalLM", ZS_FAM_GEMMA3, 6, 256, 2, 1, 256, 1024, 1024, 1, 1e-6f, 1000000.0f},
            {"phi3", "Phi3ForCausalLM", ZS_FAM_PHI3, 4, 256, 4, 2, 64, 688, 1024, 0, 1e-5f, 10000.0f},
            /* mixtures of experts (the experts' sizes below); Mixtral's and OLMoE's ffn is the experts' */
            {"mixtral", "MixtralForCausalLM", ZS_FAM_MIXTRAL, 4, 256, 8, 2, 32, 256, 1024, 0, 1e-5f, 1000000.0f},
            {"qwen2moe", "Qwen2MoeForCausalLM", ZS_FAM_QWEN2MOE, 4, 256, 4, 4, 64, 688, 1024, 0, 1e-6f, 1000000.0f},
            {"qwen3moe", "Qwen3MoeForCausalLM", ZS_FAM_QWEN3MOE, 4, 256, 4, 2, 128, 688, 1024, 0, 1e-6f, 1000000.0f},
            {"olmoe", "OlmoeForCausalLM", ZS_FAM_OLMOE, 4, 256, 4, 4, 64, 128, 1024, 0, 1e-5f, 10000.0f},
        };
        size_t i = 0;
        while (i < sizeof F / sizeof F[0] && strcmp(arch, F[i].name)) i++;
        if (i == sizeof F / sizeof F[0])
            return zs_err(ZS_EUNSUPPORTED, "init-model: unknown --arch '%s' (llama, mistral, qwen2, qwen3, gemma2, "
                          "gemma3, phi3, gpt2, mixtral, qwen2moe, qwen3moe or olmoe)", arch);
        c->arch = ZS_ARCH_LLAMA;
        c->family = F[i].fam;
        snprintf(c->arch_name, sizeof c->arch_name, "%s", F[i].cls);
        c->n_layers = F[i].layers; c->dim = F[i].dim; c->n_heads = F[i].heads; c->n_kv_heads = F[i].kv;
        c->head_dim = F[i].hd; c->ffn_dim = F[i].ffn; c->vocab_size = 512; c->max_seq = F[i].ctx;
        c->norm_eps = F[i].eps; c->rope_theta = F[i].theta; c->tied_embeddings = F[i].tied;
        if (c->family == ZS_FAM_QWEN2) c->qkv_bias = 1;
        if (c->family == ZS_FAM_GEMMA2 || c->family == ZS_FAM_GEMMA3) {
            c->act = 1; /* GeGLU */
            c->query_pre_attn_scalar = (float)c->head_dim;
            c->sliding_window = 128;
            c->swa_pattern = c->family == ZS_FAM_GEMMA2 ? 2 : 6;
            for (int l = 0; l < c->n_layers; l++) c->layer_sliding[l] = (l + 1) % c->swa_pattern != 0;
            if (c->family == ZS_FAM_GEMMA2) {
                c->attn_softcap = 50.0f;
                c->final_softcap = 30.0f;
            } else {
                c->rope_local_theta = 10000.0f;
            }
        }
        /* mixtures of experts: Mixtral 8 experts top-2; Qwen2-MoE 16 top-4 with a shared expert 4 experts
         * wide; Qwen3-MoE 16 top-4 renormalised (as Qwen3-30B-A3B); OLMoE 16 top-4; every layer sparse */
        switch (c->family) {
        case ZS_FAM_MIXTRAL: c->n_experts = 8; c->n_experts_used = 2; c->moe_ffn_dim = c->ffn_dim; break;
        case ZS_FAM_QWEN2MOE:
            c->n_experts = 16; c->n_experts_used = 4; c->moe_ffn_dim = 128; c->shared_ffn_dim = 512;
            c->qkv_bias = 1;
            break;
        case ZS_FAM_QWEN3MOE: c->n_experts = 16; c->n_experts_used = 4; c->moe_ffn_dim = 128; c->norm_topk_prob = 1; break;
        case ZS_FAM_OLMOE: c->n_experts = 16; c->n_experts_used = 4; c->moe_ffn_dim = c->ffn_dim; break;
        }
        if (c->n_experts) {
            c->router_aux_loss_coef = c->family == ZS_FAM_OLMOE ? 0.01f : 0.001f;
            for (int l = 0; l < c->n_layers; l++) c->layer_moe[l] = 1;
        }
        /* the families' fixed pieces, as the config parser sets them */
        return zs_config_override(c, "{}", "init-model");
    }
    c->family = c->arch == ZS_ARCH_GPT2 ? ZS_FAM_GPT2 : ZS_FAM_LLAMA;
    return 0;
}

typedef struct { uint64_t s; int have; float spare; } rng_t;

static uint64_t splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float rng_normal(rng_t *r) {
    if (r->have) { r->have = 0; return r->spare; }
    double u1 = ((splitmix(&r->s) >> 11) + 1.0) * 0x1.0p-53, u2 = (splitmix(&r->s) >> 11) * 0x1.0p-53;
    double rad = sqrt(-2.0 * log(u1));
    r->spare = (float)(rad * sin(2 * M_PI * u2));
    r->have = 1;
    return (float)(rad * cos(2 * M_PI * u2));
}

/* NORM: a norm's weight (1, or 0 where the model multiplies by 1 + w); BIAS: 0. With random_norms
 * both get noise (base + 0.1·N(0,1), 0.02·N(0,1)) so that a reference check sees every one. */
enum { INIT_NORMAL, INIT_ONES, INIT_ZEROS, INIT_NORM, INIT_BIAS };

typedef struct { zs_st_decl d; int init; char name[128]; } tdesc;

static void add(tdesc *t, int *n, int init, int ndim, int64_t a, int64_t b, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));
static void add(tdesc *t, int *n, int init, int ndim, int64_t a, int64_t b, const char *fmt, ...) {
    tdesc *x = &t[(*n)++];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(x->name, sizeof x->name, fmt, ap);
    va_end(ap);
    x->init = init;
    x->d.ndim = ndim;
    x->d.shape[0] = a;
    x->d.shape[1] = b;
}

/* Layer l's sparse MLP under transformers' names: the router, each expert's three projections, and
 * Qwen2-MoE's shared expert with its gate. */
static void list_moe(const zs_model_config *c, int l, tdesc *t, int *n) {
    int64_t d = c->dim, F = c->moe_ffn_dim, S = c->shared_ffn_dim, E = c->n_experts;
    if (c->family == ZS_FAM_MIXTRAL) {
        add(t, n, INIT_NORMAL, 2, E, d, "model.layers.%d.block_sparse_moe.gate.weight", l);
        for (int e = 0; e < E; e++) {
            add(t, n, INIT_NORMAL, 2, F, d, "model.layers.%d.block_sparse_moe.experts.%d.w1.weight", l, e);
            add(t, n, INIT_NORMAL, 2, d, F, "model.layers.%d.block_sparse_moe.experts.%d.w2.weight", l, e);
            add(t, n, INIT_NORMAL, 2, F, d, "model.layers.%d.block_sparse_moe.experts.%d.w3.weight", l, e);
        }
        return;
    }
    add(t, n, INIT_NORMAL, 2, E, d, "model.layers.%d.mlp.gate.weight", l);
    for (int e = 0; e < E; e++) {
        add(t, n, INIT_NORMAL, 2, F, d, "model.layers.%d.mlp.experts.%d.gate_proj.weight", l, e);
        add(t, n, INIT_NORMAL, 2, F, d, "model.layers.%d.mlp.experts.%d.up_proj.weight", l, e);
        add(t, n, INIT_NORMAL, 2, d, F, "model.layers.%d.mlp.experts.%d.down_proj.weight", l, e);
    }
    if (S > 0) {
        add(t, n, INIT_NORMAL, 2, S, d, "model.layers.%d.mlp.shared_expert.gate_proj.weight", l);
        add(t, n, INIT_NORMAL, 2, S, d, "model.layers.%d.mlp.shared_expert.up_proj.weight", l);
        add(t, n, INIT_NORMAL, 2, d, S, "model.layers.%d.mlp.shared_expert.down_proj.weight", l);
        add(t, n, INIT_NORMAL, 2, 1, d, "model.layers.%d.mlp.shared_expert_gate.weight", l);
    }
}

static int list_tensors(const zs_model_config *c, tdesc *t) {
    int n = 0;
    int64_t d = c->dim, q = (int64_t)c->n_heads * c->head_dim, kv = (int64_t)c->n_kv_heads * c->head_dim;
    int64_t f = c->ffn_dim, V = c->vocab_size;
    if (c->arch == ZS_ARCH_GPT2) {
        add(t, &n, INIT_NORMAL, 2, V, d, "transformer.wte.weight");
        add(t, &n, INIT_NORMAL, 2, c->max_seq, d, "transformer.wpe.weight");
        for (int l = 0; l < c->n_layers; l++) {
            add(t, &n, INIT_NORM, 1, d, 0, "transformer.h.%d.ln_1.weight", l);
            add(t, &n, INIT_BIAS, 1, d, 0, "transformer.h.%d.ln_1.bias", l);
            add(t, &n, INIT_NORMAL, 2, d, 3 * d, "transformer.h.%d.attn.c_attn.weight", l);
            add(t, &n, INIT_BIAS, 1, 3 * d, 0, "transformer.h.%d.attn.c_attn.bias", l);
            add(t, &n, INIT_NORMAL, 2, d, d, "transformer.h.%d.attn.c_proj.weight", l);
            add(t, &n, INIT_BIAS, 1, d, 0, "transformer.h.%d.attn.c_proj.bias", l);
            add(t, &n, INIT_NORM, 1, d, 0, "transformer.h.%d.ln_2.weight", l);
            add(t, &n, INIT_BIAS, 1, d, 0, "transformer.h.%d.ln_2.bias", l);
            add(t, &n, INIT_NORMAL, 2, d, f, "transformer.h.%d.mlp.c_fc.weight", l);
            add(t, &n, INIT_BIAS, 1, f, 0, "transformer.h.%d.mlp.c_fc.bias", l);
            add(t, &n, INIT_NORMAL, 2, f, d, "transformer.h.%d.mlp.c_proj.weight", l);
            add(t, &n, INIT_BIAS, 1, d, 0, "transformer.h.%d.mlp.c_proj.bias", l);
        }
        add(t, &n, INIT_NORM, 1, d, 0, "transformer.ln_f.weight");
        add(t, &n, INIT_BIAS, 1, d, 0, "transformer.ln_f.bias");
        if (!c->tied_embeddings) add(t, &n, INIT_NORMAL, 2, V, d, "lm_head.weight"); /* --untied */
    } else {
        int phi3 = c->family == ZS_FAM_PHI3, gemma = c->post_norms;
        add(t, &n, INIT_NORMAL, 2, V, d, "model.embed_tokens.weight");
        for (int l = 0; l < c->n_layers; l++) {
            const char *p = "model.layers";
            add(t, &n, INIT_NORM, 1, d, 0, "%s.%d.input_layernorm.weight", p, l);
            if (phi3) {
                add(t, &n, INIT_NORMAL, 2, q + 2 * kv, d, "%s.%d.self_attn.qkv_proj.weight", p, l);
            } else {
                add(t, &n, INIT_NORMAL, 2, q, d, "%s.%d.self_attn.q_proj.weight", p, l);
                add(t, &n, INIT_NORMAL, 2, kv, d, "%s.%d.self_attn.k_proj.weight", p, l);
                add(t, &n, INIT_NORMAL, 2, kv, d, "%s.%d.self_attn.v_proj.weight", p, l);
            }
            if (c->qkv_bias) {
                add(t, &n, INIT_BIAS, 1, q, 0, "%s.%d.self_attn.q_proj.bias", p, l);
                add(t, &n, INIT_BIAS, 1, kv, 0, "%s.%d.self_attn.k_proj.bias", p, l);
                add(t, &n, INIT_BIAS, 1, kv, 0, "%s.%d.self_attn.v_proj.bias", p, l);
            }
            if (c->qk_norm) {
                add(t, &n, INIT_NORM, 1, c->head_dim, 0, "%s.%d.self_attn.q_norm.weight", p, l);
                add(t, &n, INIT_NORM, 1, c->head_dim, 0, "%s.%d.self_attn.k_norm.weight", p, l);
            }
            if (c->qk_norm_full) { /* OLMoE: over the whole projections */
                add(t, &n, INIT_NORM, 1, q, 0, "%s.%d.self_attn.q_norm.weight", p, l);
                add(t, &n, INIT_NORM, 1, kv, 0, "%s.%d.self_attn.k_norm.weight", p, l);
            }
            add(t, &n, INIT_NORMAL, 2, d, q, "%s.%d.self_attn.o_proj.weight", p, l);
            if (c->o_bias) add(t, &n, INIT_BIAS, 1, d, 0, "%s.%d.self_attn.o_proj.bias", p, l);
            add(t, &n, INIT_NORM, 1, d, 0, "%s.%d.post_attention_layernorm.weight", p, l);
            if (gemma) {
                add(t, &n, INIT_NORM, 1, d, 0, "%s.%d.pre_feedforward_layernorm.weight", p, l);
                add(t, &n, INIT_NORM, 1, d, 0, "%s.%d.post_feedforward_layernorm.weight", p, l);
            }
            if (zs_config_layer_moe(c, l)) {
                list_moe(c, l, t, &n);
                continue;
            }
            if (phi3) {
                add(t, &n, INIT_NORMAL, 2, 2 * f, d, "%s.%d.mlp.gate_up_proj.weight", p, l);
            } else {
                add(t, &n, INIT_NORMAL, 2, f, d, "%s.%d.mlp.gate_proj.weight", p, l);
                add(t, &n, INIT_NORMAL, 2, f, d, "%s.%d.mlp.up_proj.weight", p, l);
            }
            add(t, &n, INIT_NORMAL, 2, d, f, "%s.%d.mlp.down_proj.weight", p, l);
            if (c->mlp_bias) {
                add(t, &n, INIT_BIAS, 1, f, 0, "%s.%d.mlp.gate_proj.bias", p, l);
                add(t, &n, INIT_BIAS, 1, f, 0, "%s.%d.mlp.up_proj.bias", p, l);
                add(t, &n, INIT_BIAS, 1, d, 0, "%s.%d.mlp.down_proj.bias", p, l);
            }
        }
        add(t, &n, INIT_NORM, 1, d, 0, "model.norm.weight");
        if (!c->tied_embeddings) add(t, &n, INIT_NORMAL, 2, V, d, "lm_head.weight");
    }
    return n;
}

/* GPT-2 byte -> printable unicode map (the byte-level BPE alphabet). */
static void byte_char(int b, char out[8]) {
    int cp;
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) cp = b;
    else {
        int n = 0;
        for (int x = 0; x < b; x++)
            if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) n++;
        cp = 256 + n;
    }
    if (cp < 0x80) { out[0] = (char)cp; out[1] = 0; }
    else { out[0] = (char)(0xc0 | (cp >> 6)); out[1] = (char)(0x80 | (cp & 0x3f)); out[2] = 0; }
}

static int write_json(json_t *j, const char *dir, const char *name) {
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int rc = json_dump_file(j, tmp, JSON_INDENT(2) | JSON_ENSURE_ASCII);
    json_decref(j);
    if (rc != 0 || rename(tmp, path) != 0) {
        unlink(tmp);
        return zs_err(ZS_EIO, "%s: cannot write: %s", path, strerror(errno));
    }
    return 0;
}

static int write_tokenizer(const zs_model_config *c, const char *dir) {
    int V = c->vocab_size, eos = V - 1;
    json_t *vocab = json_object();
    char ch[8], nm[64];
    for (int b = 0; b < 256; b++) {
        byte_char(b, ch);
        json_object_set_new(vocab, ch, json_integer(b));
    }
    for (int i = 256; i < eos; i++) {
        snprintf(nm, sizeof nm, "<|extra_%d|>", i);
        json_object_set_new(vocab, nm, json_integer(i));
    }
    json_object_set_new(vocab, "<|endoftext|>", json_integer(eos));
    json_t *tok = json_object();
    json_t *added = json_object();
    json_object_set_new(added, "id", json_integer(eos));
    json_object_set_new(added, "content", json_string("<|endoftext|>"));
    json_object_set_new(added, "single_word", json_false());
    json_object_set_new(added, "lstrip", json_false());
    json_object_set_new(added, "rstrip", json_false());
    json_object_set_new(added, "normalized", json_false());
    json_object_set_new(added, "special", json_true());
    json_t *added_list = json_array();
    json_array_append_new(added_list, added);
    json_t *bl = json_object();
    json_object_set_new(bl, "type", json_string("ByteLevel"));
    json_object_set_new(bl, "add_prefix_space", json_false());
    json_object_set_new(bl, "trim_offsets", json_true());
    json_object_set_new(bl, "use_regex", json_true());
    json_t *model = json_object();
    json_object_set_new(model, "type", json_string("BPE"));
    json_object_set_new(model, "dropout", json_null());
    json_object_set_new(model, "unk_token", json_null());
    json_object_set_new(model, "continuing_subword_prefix", json_null());
    json_object_set_new(model, "end_of_word_suffix", json_null());
    json_object_set_new(model, "fuse_unk", json_false());
    json_object_set_new(model, "byte_fallback", json_false());
    json_object_set_new(model, "vocab", vocab);
    json_object_set_new(model, "merges", json_array());
    json_object_set_new(tok, "version", json_string("1.0"));
    json_object_set_new(tok, "truncation", json_null());
    json_object_set_new(tok, "padding", json_null());
    json_object_set_new(tok, "added_tokens", added_list);
    json_object_set_new(tok, "normalizer", json_null());
    json_object_set_new(tok, "pre_tokenizer", json_deep_copy(bl));
    json_object_set_new(tok, "post_processor", json_deep_copy(bl));
    json_object_set_new(tok, "decoder", bl);
    json_object_set_new(tok, "model", model);
    ZS_CHECK(write_json(tok, dir, "tokenizer.json"));
    json_t *tc = json_pack("{s:s, s:b, s:b, s:s, s:s, s:i, s:s}", "tokenizer_class",
                           "PreTrainedTokenizerFast", "add_bos_token", 0, "add_eos_token", 0,
                           "bos_token", "<|endoftext|>", "eos_token", "<|endoftext|>",
                           "model_max_length", c->max_seq, "note",
                           "random-initialised model written by zeroserve init-model");
    ZS_CHECK(write_json(tc, dir, "tokenizer_config.json"));
    json_t *gc = json_pack("{s:i, s:i}", "bos_token_id", eos, "eos_token_id", eos);
    return write_json(gc, dir, "generation_config.json");
}

/* mkdir -p */
static int mkdir_p(const char *dir) {
    char p[4096];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p) return zs_err(ZS_EINVAL, "init-model: path too long");
    for (char *s = p + 1; *s; s++)
        if (*s == '/') {
            *s = 0;
            if (mkdir(p, 0755) != 0 && errno != EEXIST)
                return zs_err(ZS_EIO, "init-model: cannot create %s: %s", p, strerror(errno));
            *s = '/';
        }
    if (mkdir(p, 0755) != 0 && errno != EEXIST)
        return zs_err(ZS_EIO, "init-model: cannot create %s: %s", p, strerror(errno));
    return 0;
}

int zs_init_model_write(const zs_init_opts *o, const char *dir) {
    zs_model_config c = o->cfg;
    if (c.vocab_size < 257)
        return zs_err(ZS_EINVAL, "init-model: vocab size %d is too small (at least 257: 256 bytes + <|endoftext|>)",
                      c.vocab_size);
    if (c.n_layers <= 0 || c.dim <= 0 || c.n_heads <= 0 || c.n_kv_heads <= 0 || c.head_dim <= 0 ||
        c.ffn_dim <= 0 || c.max_seq <= 0 || c.n_heads % c.n_kv_heads)
        return zs_err(ZS_EINVAL, "init-model: invalid sizes (layers %d, dim %d, heads %d, kv heads %d, "
                      "head dim %d, ffn %d, context %d)", c.n_layers, c.dim, c.n_heads, c.n_kv_heads,
                      c.head_dim, c.ffn_dim, c.max_seq);
    if (c.arch == ZS_ARCH_GPT2 && (c.head_dim * c.n_heads != c.dim || c.n_kv_heads != c.n_heads))
        return zs_err(ZS_EINVAL, "init-model: gpt2 needs heads * head_dim == dim and no grouped kv heads");
    if (c.head_dim % 2) return zs_err(ZS_EINVAL, "init-model: head dim must be even (RoPE)");
    if (c.n_experts < 0 || c.n_experts > ZS_MAX_EXPERTS ||
        (c.n_experts > 0 && (c.n_experts_used < 1 || c.n_experts_used > c.n_experts || c.moe_ffn_dim <= 0 ||
                             c.shared_ffn_dim < 0)))
        return zs_err(ZS_EINVAL, "init-model: invalid experts (%d experts, %d used per token, each %d wide, shared %d; "
                      "at most %d experts)", c.n_experts, c.n_experts_used, c.moe_ffn_dim, c.shared_ffn_dim,
                      ZS_MAX_EXPERTS);
    c.bos_id = c.eos_id = c.vocab_size - 1;
    ZS_CHECK(mkdir_p(dir));

    size_t max_t = 8 + (size_t)c.n_layers * (24 + 8 + 3 * (size_t)(c.n_experts > 0 ? c.n_experts : 0));
    tdesc *t = calloc(max_t, sizeof *t);
    zs_st_decl *decls = calloc(max_t, sizeof *decls);
    float *buf = malloc((size_t)1 << 22);
    uint16_t *buf16 = malloc((size_t)1 << 21);
    zs_st_writer *w = NULL;
    int rc = 0;
    if (!t || !decls || !buf || !buf16) { rc = zs_err(ZS_ENOMEM, "out of memory"); goto done; }
    int n = list_tensors(&c, t);
    for (int i = 0; i < n; i++) {
        decls[i] = t[i].d;
        decls[i].name = t[i].name;
        decls[i].dtype = c.dtype;
    }
    char path[4096], meta[256];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    snprintf(meta, sizeof meta, "{\"format\":\"pt\",\"zeroserve\":\"random init, seed %llu\"}",
             (unsigned long long)o->seed);
    if ((rc = zs_st_writer_open(path, decls, (size_t)n, meta, &w)) < 0) goto done;
    rng_t rng = {o->seed, 0, 0};
    const size_t chunk = ((size_t)1 << 20);
    for (int i = 0; i < n && rc == 0; i++) {
        size_t total = (size_t)t[i].d.shape[0] * (size_t)(t[i].d.ndim > 1 ? t[i].d.shape[1] : 1);
        for (size_t done = 0; done < total && rc == 0; done += chunk) {
            size_t m = ZS_MIN(chunk, total - done);
            float nb = c.norm_offset != 0 ? 0.0f : 1.0f; /* Gemma: 1 + w */
            for (size_t k = 0; k < m; k++) {
                int it = t[i].init;
                buf[k] = it == INIT_NORMAL ? rng_normal(&rng) * o->init_std
                         : it == INIT_ONES ? 1.0f
                         : it == INIT_NORM ? (o->random_norms ? nb + 0.1f * rng_normal(&rng) : nb)
                         : it == INIT_BIAS && o->random_norms ? 0.02f * rng_normal(&rng) : 0.0f;
            }
            if (c.dtype == ZS_F32) rc = zs_st_writer_write(w, buf, m * 4);
            else {
                zs_convert(buf16, c.dtype, buf, ZS_F32, m);
                rc = zs_st_writer_write(w, buf16, m * 2);
            }
        }
    }
    if (rc < 0) { zs_st_writer_abort(w); w = NULL; goto done; }
    rc = zs_st_writer_close(w);
    w = NULL;
    if (rc < 0) goto done;
    snprintf(path, sizeof path, "%s/config.json", dir);
    if ((rc = zs_config_write(&c, path)) < 0) goto done;
    rc = write_tokenizer(&c, dir);
done:
    free(t);
    free(decls);
    free(buf);
    free(buf16);
    return rc;
}
