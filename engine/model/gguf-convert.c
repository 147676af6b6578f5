/* gguf-convert.c — Hugging Face checkpoint -> GGUF tensors and hyperparameters for llama.cpp: the
 * tensor plan (names, types, sources from model.c's slot sources, the computed RoPE factor tensors,
 * the experts of a mixture stacked into one 3-D tensor per layer and matrix),
 * llama-quantize's type rules, what llama.cpp can represent per architecture, the metadata keys, and
 * the data stream (chunks of rows converted on the CPU worker pool). See gguf-convert.h. */
#include "gguf-convert.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "common.h"
#include "model.h"
#include "pool.h"
#include "quant-mix.h"
#include "safetensors.h"
#include "tensor.h"

typedef struct {
    const zs_st_tensor *t;
    int kind;       /* ZS_SRC_* */
    int64_t col0;
    int64_t n;      /* rows (2-D) or elements (1-D) this part gives */
    int rope_heads; /* > 0: rows (elements) in rotate_half order of this many heads -> interleaved */
    int add_one;    /* Gemma's norms: w + 1 (in the checkpoint's f16, or in f32), as Gemma*Model.modify_tensors */
} cv_part;

typedef struct {
    zs_gguf_conv_tensor pub;
    cv_part part[3];
    cv_part *xpart;     /* stacked experts: n_parts parts of xrows rows each (owned); else NULL, part[] */
    int n_parts;
    int vec;            /* 1-D in the checkpoint: its parts are element ranges (part_vec), not rows */
    int64_t xrows;
    int64_t rows, cols; /* rows x cols of row length cols (1-D: one row; stacked: n_experts x xrows rows) */
    float *fixed;       /* a computed 1-D tensor (rope_freqs, rope_factors_*): its values; owned */
} cv_tensor;

static const cv_part *parts_of(const cv_tensor *t) { return t->xpart ? t->xpart : t->part; }

struct zs_gguf_conv {
    char *dir;
    zs_model_config cfg;
    const char *arch;
    zs_llama_ftype ftype;
    int head_copy;      /* a tied model whose architecture needs output.weight: the token table copied */
    zs_st_set *st;
    cv_tensor *t;
    size_t n, cap;
};

/* ---------------------------------------------------------------- file types */

static const struct {
    const char *name;
    zs_llama_ftype f;
} ftypes[] = {
    {"f32", ZS_FTYPE_ALL_F32},     {"f16", ZS_FTYPE_MOSTLY_F16},   {"bf16", ZS_FTYPE_MOSTLY_BF16},
    {"q8_0", ZS_FTYPE_MOSTLY_Q8_0}, {"q4_0", ZS_FTYPE_MOSTLY_Q4_0}, {"q4_1", ZS_FTYPE_MOSTLY_Q4_1},
    {"q5_0", ZS_FTYPE_MOSTLY_Q5_0}, {"q5_1", ZS_FTYPE_MOSTLY_Q5_1}, {"q4_k_m", ZS_FTYPE_MOSTLY_Q4_K_M},
};
#define N_FTYPES (sizeof ftypes / sizeof ftypes[0])

int zs_llama_ftype_parse(const char *name, zs_llama_ftype *out) {
    for (size_t i = 0; name && i < N_FTYPES; i++)
        if (!strcasecmp(name, ftypes[i].name)) {
            *out = ftypes[i].f;
            return 0;
        }
    return zs_err(ZS_EINVAL, "'%s' is not a GGUF file type (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k_m)",
                  name ? name : "(null)");
}

const char *zs_llama_ftype_name(zs_llama_ftype f) {
    for (size_t i = 0; i < N_FTYPES; i++)
        if (ftypes[i].f == f) return ftypes[i].name;
    return "?";
}

/* ---------------------------------------------------------------- types */

static zs_dtype dtype_of(zs_ggml_type t) {
    switch (t) {
    case ZS_GGML_F32: return ZS_F32;
    case ZS_GGML_F16: return ZS_F16;
    case ZS_GGML_BF16: return ZS_BF16;
    case ZS_GGML_Q8_0: return ZS_Q8_0;
    case ZS_GGML_Q4_0: return ZS_Q4_0;
    case ZS_GGML_Q4_1: return ZS_Q4_1;
    case ZS_GGML_Q5_0: return ZS_Q5_0;
    case ZS_GGML_Q5_1: return ZS_Q5_1;
    case ZS_GGML_Q4_K: return ZS_Q4_K;
    case ZS_GGML_Q6_K: return ZS_Q6_K;
    case ZS_GGML_Q5_K: return ZS_Q5_K;
    case ZS_GGML_Q3_K: return ZS_Q3_K;
    case ZS_GGML_Q2_K: return ZS_Q2_K;
    default: return ZS_DTYPE_COUNT;
    }
}

static int64_t blck(zs_ggml_type t) {
    uint32_t b = 1;
    zs_gguf_type_block((int)t, &b, NULL);
    return b;
}

/* What a matrix is, for the type rules. */
enum {
    M_TOKEN, M_OUTPUT, M_ATTN_V, M_FFN_DOWN, M_ATTN_QKV, M_OTHER,
    M_ROUTER,      /* ffn_gate_inp: F32 for every file type */
    M_SHEXP_GATE,  /* ffn_gate_inp_shexp [dim, 1]: a matrix to the converter, 1-D to llama-quantize */
    V_F32          /* 1-D or position table */
};

static zs_ggml_type ggml_of(zs_dtype d) {
    static const zs_ggml_type map[ZS_DTYPE_COUNT] = {
        [ZS_F32] = ZS_GGML_F32,   [ZS_F16] = ZS_GGML_F16,   [ZS_BF16] = ZS_GGML_BF16, [ZS_Q8_0] = ZS_GGML_Q8_0,
        [ZS_Q4_0] = ZS_GGML_Q4_0, [ZS_Q4_1] = ZS_GGML_Q4_1, [ZS_Q5_0] = ZS_GGML_Q5_0, [ZS_Q5_1] = ZS_GGML_Q5_1,
        [ZS_Q4_K] = ZS_GGML_Q4_K, [ZS_Q6_K] = ZS_GGML_Q6_K, [ZS_Q5_K] = ZS_GGML_Q5_K, [ZS_Q3_K] = ZS_GGML_Q3_K,
        [ZS_Q2_K] = ZS_GGML_Q2_K,
    };
    return (unsigned)d < ZS_DTYPE_COUNT ? map[d] : ZS_GGML_TYPE_COUNT;
}

/* 1: llama.cpp makes the file type with llama-quantize from an f32 conversion (0: convert_hf_to_gguf.py
 * writes it) */
static int by_llama_quantize(zs_llama_ftype f) {
    return f != ZS_FTYPE_ALL_F32 && f != ZS_FTYPE_MOSTLY_F16 && f != ZS_FTYPE_MOSTLY_BF16 && f != ZS_FTYPE_MOSTLY_Q8_0;
}

/* The type of a tensor (what: M_* / V_F32; layer: quant-mix.h's -1 embeddings, 0.. blocks,
 * n_layers head; role: model.h's; cols: the row length). */
static zs_ggml_type pick_type(const zs_gguf_conv *c, int what, int layer, int role, int64_t cols, const char **note) {
    *note = NULL;
    if (what == V_F32) return ZS_GGML_F32;
    zs_llama_ftype f = c->ftype;
    int tied = c->cfg.tied_embeddings && !c->head_copy; /* the token table is the output tensor */
    if (what == M_ROUTER) { /* convert_hf_to_gguf.py: FFN_GATE_INP always F32; llama-quantize: never quantized */
        if (f != ZS_FTYPE_ALL_F32) *note = "the router (ffn_gate_inp): F32 (convert_hf_to_gguf.py and llama-quantize)";
        return ZS_GGML_F32;
    }
    if (what == M_SHEXP_GATE && by_llama_quantize(f)) {
        *note = "the shared expert's gate: F32 (one row: 1-D to llama-quantize, which leaves it unquantized)";
        return ZS_GGML_F32;
    }
    /* llama-quantize's rules for exactly 8 experts (Mixtral 8x7B / 8x22B) */
    int x8 = c->cfg.n_experts == 8 && layer >= 0 && layer < c->cfg.n_layers;
    switch (f) {
    case ZS_FTYPE_ALL_F32: return ZS_GGML_F32;
    case ZS_FTYPE_MOSTLY_F16: return ZS_GGML_F16;
    case ZS_FTYPE_MOSTLY_BF16: return ZS_GGML_BF16;
    case ZS_FTYPE_MOSTLY_Q8_0: /* convert_hf_to_gguf.py: Q8_0, F16 for rows that are not whole blocks */
        if (cols % 32) {
            *note = "rows are not a multiple of 32: F16 (as convert_hf_to_gguf.py falls back)";
            return ZS_GGML_F16;
        }
        return ZS_GGML_Q8_0;
    case ZS_FTYPE_MOSTLY_Q4_K_M: { /* llama-quantize's mix, shared with the loader (quant-mix.h) */
        const zs_model_config *g = &c->cfg;
        unsigned fl = (tied ? ZS_QMIX_TIED : 0) | (what == M_ATTN_QKV ? ZS_QMIX_FUSED_QKV : 0) |
                      (g->n_experts == 8 ? ZS_QMIX_EXPERTS8 : 0) |
                      (zs_quant_mix_is_70b(g->family, g->n_layers, g->n_heads, g->n_kv_heads, g->n_experts) ? ZS_QMIX_70B
                                                                                                            : 0);
        zs_ggml_type t = ggml_of(zs_quant_mix_q4_k_m(layer, role, c->cfg.n_layers, cols, fl));
        int head = what == M_OUTPUT || (what == M_TOKEN && tied);
        if (t == ZS_GGML_F16) *note = "rows are not a multiple of 32: F16 (llama-quantize's last fallback)";
        else if (t == ZS_GGML_Q5_0) *note = "rows are not a multiple of 256: Q5_0 instead of Q4_K (llama-quantize's fallback)";
        else if (t == ZS_GGML_Q5_1)
            *note = x8 && role == ZS_R_WO ? "8 experts: attn_output Q5_1 (llama-quantize's fallback for Q5_K)"
                                          : "rows are not a multiple of 256: Q5_1 instead of Q5_K (llama-quantize's fallback)";
        else if (head) *note = t == ZS_GGML_Q6_K ? "the output tensor: Q6_K (Q4_K_M mix)"
                                                 : "the output tensor: Q8_0 (Q4_K_M mix; rows are not a multiple of 256)";
        else if (x8 && role == ZS_R_WO) *note = "8 experts: attn_output Q5_K (llama-quantize's rule)";
        else if (x8 && (role == ZS_R_WK || role == ZS_R_WV || what == M_ATTN_QKV) && t == ZS_GGML_Q8_0)
            *note = "8 experts: Q8_0 (llama-quantize's rule for attn_k, attn_v and attn_qkv)";
        else if (t == ZS_GGML_Q5_K) *note = "a 70B model: Q5_K (llama-quantize's attn_v rule)";
        else if (t == ZS_GGML_Q6_K)
            *note = what == M_ATTN_QKV ? "Q4_K_M mix: Q6_K in this layer (llama-quantize's attn_v rule, which takes attn_qkv)"
                                       : "Q4_K_M mix: Q6_K in this layer";
        else if (t == ZS_GGML_Q8_0) *note = "rows are not a multiple of 256: Q8_0 instead of Q6_K (llama-quantize's fallback)";
        return t;
    }
    default: break;
    }
    zs_ggml_type t = f == ZS_FTYPE_MOSTLY_Q4_0 ? ZS_GGML_Q4_0 : f == ZS_FTYPE_MOSTLY_Q4_1 ? ZS_GGML_Q4_1
                   : f == ZS_FTYPE_MOSTLY_Q5_0 ? ZS_GGML_Q5_0 : ZS_GGML_Q5_1;
    if (what == M_OUTPUT || (what == M_TOKEN && tied)) {
        /* llama-quantize: the output tensor (a tied token table is it) gets Q6_K, Q8_0 when its rows are not 256s */
        t = cols % 256 ? ZS_GGML_Q8_0 : ZS_GGML_Q6_K;
        *note = cols % 256 ? "the output tensor: Q8_0 (rows are not a multiple of 256; llama-quantize's rule)"
                           : "the output tensor: Q6_K (llama-quantize's rule)";
    } else if (x8 && (role == ZS_R_WK || role == ZS_R_WV || what == M_ATTN_QKV)) {
        t = ZS_GGML_Q8_0; /* llama-quantize: "for the 8-expert model, bumping this to Q8_0" (attn_qkv is attn_v-like) */
        *note = "8 experts: Q8_0 (llama-quantize's rule for attn_k, attn_v and attn_qkv)";
    }
    if (cols % blck(t)) {
        t = ZS_GGML_F16;
        *note = "rows are not a multiple of 32: F16 (llama-quantize refuses them; convert_hf_to_gguf.py's fallback)";
    }
    return t;
}

/* ---------------------------------------------------------------- the plan */

enum { T_ADD_ONE = 1 }; /* add_tensor flags */

static cv_tensor *new_tensor(zs_gguf_conv *c, const char *name) {
    if (c->n == c->cap) {
        size_t nc = c->cap ? c->cap * 2 : 64;
        cv_tensor *nt = realloc(c->t, nc * sizeof *nt);
        if (!nt) return NULL;
        c->t = nt;
        c->cap = nc;
    }
    cv_tensor *t = &c->t[c->n];
    memset(t, 0, sizeof *t);
    snprintf(t->pub.name, sizeof t->pub.name, "%s", name);
    return t;
}

/* Chooses the type of tensor t (c->t[c->n], its shape set) and adds it to the plan. */
static int finish_tensor(zs_gguf_conv *c, cv_tensor *t, int what, int mix_layer, int mix_role) {
    t->pub.type = pick_type(c, what, mix_layer, mix_role, t->cols, &t->pub.note);
    /* llama-quantize writes a tensor of one row as the 1-D tensor ggml_n_dims says it is */
    if (what == M_SHEXP_GATE && by_llama_quantize(c->ftype)) t->pub.n_dims = 1;
    c->n++;
    zs_dtype od = dtype_of(t->pub.type);
    if (od == ZS_DTYPE_COUNT || (zs_dtype_is_quant(od) && !zs_dtype_can_quantize(od)))
        return zs_err(ZS_EUNSUPPORTED, "%s: %s would be %s, which this build cannot quantize into", c->dir, t->pub.name,
                      zs_gguf_type_name((int)t->pub.type));
    return 0;
}

static int add_tensor(zs_gguf_conv *c, zs_model *m, const char *name, int b, const int *roles, int n_roles,
                      int what, int rope_heads, unsigned flags) {
    zs_slot_source src;
    if (zs_model_slot_source(m, b, roles[0], &src) != 0) return 0; /* absent in this model */
    cv_tensor *t = new_tensor(c, name);
    if (!t) return zs_err(ZS_ENOMEM, "out of memory");
    const zs_slot *s0 = &zs_model_layout(m, b)->slot[roles[0]];
    int two_d = s0->ndim == 2;
    for (int k = 0; k < n_roles; k++) {
        const zs_slot *s = &zs_model_layout(m, b)->slot[roles[k]];
        if (k && zs_model_slot_source(m, b, roles[k], &src) != 0)
            return zs_err(ZS_EINVAL, "%s: %s: a part is missing", c->dir, name);
        cv_part *p = &t->part[k];
        p->t = zs_st_find(c->st, src.name);
        if (!p->t) return zs_err(ZS_ENOTFOUND, "%s: tensor '%s' not found", c->dir, src.name);
        p->kind = src.kind;
        p->col0 = src.col0;
        p->n = s->shape[0];
        p->rope_heads = rope_heads;
        p->add_one = !!(flags & T_ADD_ONE);
        if (two_d) {
            t->rows += s->shape[0];
            t->cols = s->shape[1];
        } else {
            t->rows = 1;
            t->cols += s->shape[0];
        }
    }
    t->n_parts = n_roles;
    t->vec = !two_d;
    t->pub.n_dims = two_d ? 2 : 1;
    t->pub.ne[0] = t->cols;
    t->pub.ne[1] = two_d ? t->rows : 1;
    t->pub.ne[2] = 1;
    int mix_layer = b == zs_bucket_embed() ? -1 : b == zs_bucket_head(m) ? c->cfg.n_layers : b - 1, mix_role = roles[0];
    if (what == M_OUTPUT) mix_layer = c->cfg.n_layers, mix_role = ZS_R_LM_HEAD; /* also the token table's copy */
    return finish_tensor(c, t, two_d ? what : V_F32, mix_layer, mix_role);
}

/* Layer l's experts' matrix of role (ZS_R_W_GATE / W_UP / W_DOWN of each expert bucket) as one 3-D
 * tensor, ne [in, out, n_experts]: expert e's [out, in] rows, e = 0 .. n_experts-1 (torch.stack). */
static int add_experts(zs_gguf_conv *c, zs_model *m, const char *name, int l, int role, int what) {
    int ne = c->cfg.n_experts;
    cv_tensor *t = new_tensor(c, name);
    if (!t || !(t->xpart = calloc((size_t)ne, sizeof *t->xpart))) return zs_err(ZS_ENOMEM, "out of memory");
    c->n++; /* in the plan from here, so that a failure below frees xpart with it; finish_tensor re-adds it */
    t->n_parts = ne;
    for (int e = 0; e < ne; e++) {
        int eb = zs_bucket_expert(m, l, e);
        zs_slot_source src;
        if (eb < 0 || zs_model_slot_source(m, eb, role, &src) != 0)
            return zs_err(ZS_EINVAL, "%s: %s: expert %d of layer %d has no source tensor", c->dir, name, e, l);
        const zs_slot *s = &zs_model_layout(m, eb)->slot[role];
        cv_part *p = &t->xpart[e];
        if (!(p->t = zs_st_find(c->st, src.name))) return zs_err(ZS_ENOTFOUND, "%s: tensor '%s' not found", c->dir, src.name);
        p->kind = src.kind;
        p->col0 = src.col0;
        p->n = s->shape[0];
        if (e == 0) t->xrows = s->shape[0], t->cols = s->shape[1];
        else if (s->shape[0] != t->xrows || s->shape[1] != t->cols)
            return zs_err(ZS_EINVAL, "%s: %s: expert %d is [%lld, %lld], expert 0 [%lld, %lld]", c->dir, name, e,
                          (long long)s->shape[0], (long long)s->shape[1], (long long)t->xrows, (long long)t->cols);
    }
    t->rows = (int64_t)ne * t->xrows;
    t->pub.n_dims = 3;
    t->pub.ne[0] = t->cols;
    t->pub.ne[1] = t->xrows;
    t->pub.ne[2] = ne;
    c->n--;
    return finish_tensor(c, t, what, l, role);
}

/* A computed F32 vector (convert_hf_to_gguf.py's generate_extra_tensors). */
static int add_fixed(zs_gguf_conv *c, const char *name, const float *v, int n, const char *note) {
    cv_tensor *t = new_tensor(c, name);
    if (!t || !(t->fixed = malloc((size_t)n * sizeof(float)))) return zs_err(ZS_ENOMEM, "out of memory");
    memcpy(t->fixed, v, (size_t)n * sizeof(float));
    t->rows = 1;
    t->cols = n;
    t->pub.n_dims = 1;
    t->pub.ne[0] = n;
    t->pub.ne[1] = 1;
    t->pub.ne[2] = 1;
    t->pub.type = ZS_GGML_F32;
    t->pub.note = note;
    c->n++;
    return 0;
}

/* Llama 3.1's RoPE as llama.cpp applies it: per frequency, the divisor of its angle (rope_freqs), as
 * LlamaModel.generate_extra_tensors computes it in float32 (1 for the high frequencies, factor for
 * the low ones, smoothed between), with the original context of rope_scaling (the converter reads
 * a top-level original_max_position_embeddings, default 8192: the same value for Llama 3.x). */
static void llama3_factors(const zs_model_config *g, float *out) {
    const zs_rope_scaling *r = &g->rope;
    int dim = g->head_dim;
    float lw = (float)((double)r->orig_max_pos / r->low_freq_factor);
    float hw = (float)((double)r->orig_max_pos / r->high_freq_factor);
    for (int i = 0; i < dim / 2; i++) {
        float freq = 1.0f / powf(g->rope_theta, (float)(2 * i) / (float)dim);
        float wl = (float)(2 * M_PI) / freq;
        if (wl < hw) out[i] = 1.0f;
        else if (wl > lw) out[i] = r->factor;
        else {
            float sm = ((float)r->orig_max_pos / wl - r->low_freq_factor) /
                       (float)((double)r->high_freq_factor - (double)r->low_freq_factor);
            out[i] = 1.0f / ((1.0f - sm) / r->factor + sm);
        }
    }
}

static int plan(zs_gguf_conv *c, zs_model *m) {
    const zs_model_config *g = &c->cfg;
    int gpt2 = g->arch == ZS_ARCH_GPT2, perm = !strcmp(c->arch, "llama");
    int phi3 = g->family == ZS_FAM_PHI3, gemma = g->family == ZS_FAM_GEMMA2 || g->family == ZS_FAM_GEMMA3;
    unsigned nf = gemma ? T_ADD_ONE : 0; /* Gemma's norms are written + 1 */
    char nm[64];
#define ADD(b, what, rope, fl, ...)                                                                           \
    do {                                                                                                      \
        const int roles_[] = {__VA_ARGS__};                                                                   \
        ZS_CHECK(add_tensor(c, m, nm, (b), roles_, (int)(sizeof roles_ / sizeof roles_[0]), (what), (rope), (fl))); \
    } while (0)
#define NAME(...) snprintf(nm, sizeof nm, __VA_ARGS__)
    /* the computed tensors first, as the converter yields them */
    if (g->rope.type == ZS_ROPE_LLAMA3) {
        float f[ZS_ROPE_MAX_FACTORS];
        llama3_factors(g, f);
        ZS_CHECK(add_fixed(c, "rope_freqs.weight", f, g->head_dim / 2, "Llama 3 RoPE scaling as per-frequency divisors"));
    }
    if (g->rope.type == ZS_ROPE_LONGROPE) {
        ZS_CHECK(add_fixed(c, "rope_factors_long.weight", g->rope.long_factor, g->rope.n_factors, "LongRoPE long_factor"));
        ZS_CHECK(add_fixed(c, "rope_factors_short.weight", g->rope.short_factor, g->rope.n_factors, "LongRoPE short_factor"));
    }
    NAME("token_embd.weight");
    ADD(0, M_TOKEN, 0, 0, ZS_R_TOK_EMB);
    NAME("position_embd.weight");
    ADD(0, V_F32, 0, 0, ZS_R_POS_EMB); /* GPT-2's learned positions: F32 (convert_hf_to_gguf.py) */
    for (int l = 0; l < g->n_layers; l++) {
        int b = zs_bucket_layer(l);
        NAME("blk.%d.attn_norm.weight", l);
        ADD(b, V_F32, 0, nf, ZS_R_ATTN_NORM_W);
        NAME("blk.%d.attn_norm.bias", l);
        ADD(b, V_F32, 0, 0, ZS_R_ATTN_NORM_B);
        if (gpt2) {
            NAME("blk.%d.attn_qkv.weight", l);
            ADD(b, M_ATTN_QKV, 0, 0, ZS_R_WQ, ZS_R_WK, ZS_R_WV);
            NAME("blk.%d.attn_qkv.bias", l);
            ADD(b, V_F32, 0, 0, ZS_R_BQ, ZS_R_BK, ZS_R_BV);
        } else if (phi3) { /* llama.cpp keeps Phi-3's fused qkv_proj */
            NAME("blk.%d.attn_qkv.weight", l);
            ADD(b, M_ATTN_QKV, 0, 0, ZS_R_WQ, ZS_R_WK, ZS_R_WV);
        } else {
            NAME("blk.%d.attn_q.weight", l);
            ADD(b, M_OTHER, perm ? g->n_heads : 0, 0, ZS_R_WQ);
            NAME("blk.%d.attn_k.weight", l);
            ADD(b, M_OTHER, perm ? g->n_kv_heads : 0, 0, ZS_R_WK);
            NAME("blk.%d.attn_v.weight", l);
            ADD(b, M_ATTN_V, 0, 0, ZS_R_WV);
            NAME("blk.%d.attn_q.bias", l);
            ADD(b, V_F32, perm ? g->n_heads : 0, 0, ZS_R_BQ);
            NAME("blk.%d.attn_k.bias", l);
            ADD(b, V_F32, perm ? g->n_kv_heads : 0, 0, ZS_R_BK);
            NAME("blk.%d.attn_v.bias", l);
            ADD(b, V_F32, 0, 0, ZS_R_BV);
        }
        NAME("blk.%d.attn_q_norm.weight", l); /* Qwen3, Gemma 3 */
        ADD(b, V_F32, 0, nf, ZS_R_Q_NORM);
        NAME("blk.%d.attn_k_norm.weight", l);
        ADD(b, V_F32, 0, nf, ZS_R_K_NORM);
        NAME("blk.%d.attn_output.weight", l);
        ADD(b, M_OTHER, 0, 0, ZS_R_WO);
        NAME("blk.%d.attn_output.bias", l);
        ADD(b, V_F32, 0, 0, ZS_R_BO);
        NAME("blk.%d.post_attention_norm.weight", l); /* Gemma 2/3 */
        ADD(b, V_F32, 0, nf, ZS_R_POST_ATTN_NORM);
        NAME("blk.%d.ffn_norm.weight", l); /* Gemma: pre_feedforward_layernorm */
        ADD(b, V_F32, 0, nf, ZS_R_FFN_NORM_W);
        NAME("blk.%d.ffn_norm.bias", l);
        ADD(b, V_F32, 0, 0, ZS_R_FFN_NORM_B);
        NAME("blk.%d.post_ffw_norm.weight", l);
        ADD(b, V_F32, 0, nf, ZS_R_POST_FFN_NORM);
        if (zs_config_layer_moe(g, l)) { /* the sparse block (conv_check: every layer is one) */
            size_t n0 = c->n;
            NAME("blk.%d.ffn_gate_inp.weight", l);
            ADD(b, M_ROUTER, 0, 0, ZS_R_ROUTER);
            if (c->n == n0) return zs_err(ZS_EINVAL, "%s: layer %d is a mixture of experts without a router", c->dir, l);
            NAME("blk.%d.ffn_gate_exps.weight", l);
            ZS_CHECK(add_experts(c, m, nm, l, ZS_R_W_GATE, M_OTHER));
            NAME("blk.%d.ffn_up_exps.weight", l);
            ZS_CHECK(add_experts(c, m, nm, l, ZS_R_W_UP, M_OTHER));
            NAME("blk.%d.ffn_down_exps.weight", l);
            ZS_CHECK(add_experts(c, m, nm, l, ZS_R_W_DOWN, M_FFN_DOWN));
            if (g->shared_ffn_dim > 0) { /* Qwen2-MoE's shared expert: the layer bucket's MLP roles */
                n0 = c->n;
                NAME("blk.%d.ffn_gate_inp_shexp.weight", l);
                ADD(b, M_SHEXP_GATE, 0, 0, ZS_R_SHARED_GATE);
                NAME("blk.%d.ffn_gate_shexp.weight", l);
                ADD(b, M_OTHER, 0, 0, ZS_R_W_GATE);
                NAME("blk.%d.ffn_up_shexp.weight", l);
                ADD(b, M_OTHER, 0, 0, ZS_R_W_UP);
                NAME("blk.%d.ffn_down_shexp.weight", l);
                ADD(b, M_FFN_DOWN, 0, 0, ZS_R_W_DOWN);
                if (c->n != n0 + 4)
                    return zs_err(ZS_EINVAL, "%s: layer %d: the shared expert or its gate is missing", c->dir, l);
            }
            continue;
        }
        if (phi3) { /* and its fused gate_up_proj: rows of the gate, then of up */
            NAME("blk.%d.ffn_up.weight", l);
            ADD(b, M_OTHER, 0, 0, ZS_R_W_GATE, ZS_R_W_UP);
        } else {
            NAME("blk.%d.ffn_gate.weight", l);
            ADD(b, M_OTHER, 0, 0, ZS_R_W_GATE);
            NAME("blk.%d.ffn_up.weight", l);
            ADD(b, M_OTHER, 0, 0, ZS_R_W_UP);
        }
        NAME("blk.%d.ffn_up.bias", l);
        ADD(b, V_F32, 0, 0, ZS_R_B_UP);
        NAME("blk.%d.ffn_down.weight", l);
        ADD(b, M_FFN_DOWN, 0, 0, ZS_R_W_DOWN);
        NAME("blk.%d.ffn_down.bias", l);
        ADD(b, V_F32, 0, 0, ZS_R_B_DOWN);
    }
    int h = zs_bucket_head(m);
    NAME("output_norm.weight");
    ADD(h, V_F32, 0, nf, ZS_R_OUT_NORM_W);
    NAME("output_norm.bias");
    ADD(h, V_F32, 0, 0, ZS_R_OUT_NORM_B);
    NAME("output.weight");
    if (c->head_copy) { /* qwen2moe, olmoe: always a head */
        ADD(zs_bucket_embed(), M_OUTPUT, 0, 0, ZS_R_TOK_EMB);
        if (!c->t[c->n - 1].pub.note)
            c->t[c->n - 1].pub.note = "the tied token table, copied (llama.cpp's qwen2moe and olmoe require output.weight)";
    } else
        ADD(h, M_OUTPUT, 0, 0, ZS_R_LM_HEAD);
#undef ADD
#undef NAME
    return 0;
}

/* ---------------------------------------------------------------- what llama.cpp can represent */

/* HF's YaRN attention factor (rope.c's). */
static double yarn_attn(const zs_rope_scaling *r) {
    if (r->attention_factor > 0) return r->attention_factor;
#define MS(s, k) ((s) <= 1 ? 1.0 : 0.1 * (k) * log(s) + 1.0)
    if (r->mscale > 0 && r->mscale_all_dim > 0) return MS(r->factor, r->mscale) / MS(r->factor, r->mscale_all_dim);
    return MS(r->factor, 1.0);
#undef MS
}

/* LongRoPE's attention factor (rope.c's). */
static double longrope_attn(const zs_model_config *g) {
    const zs_rope_scaling *r = &g->rope;
    int orig = r->orig_max_pos > 0 ? r->orig_max_pos : g->max_seq;
    double factor = r->orig_max_pos > 0 ? (double)g->max_seq / r->orig_max_pos : r->factor;
    if (r->attention_factor > 0) return r->attention_factor;
    return factor <= 1.0 ? 1.0 : sqrt(1 + log(factor) / log((double)orig));
}

/* A mixture of experts against llama.cpp 0.3.16's loaders and graphs (src/llama-model.cpp): every
 * layer sparse, softmax routing, the top-k weights renormalised or not as the architecture hard-codes
 * it (build_moe_ffn's norm_w: llama and qwen3moe true, qwen2moe and olmoe false), and each
 * architecture's fixed tensor shapes. */
static int moe_check(const zs_gguf_conv *c) {
    const zs_model_config *g = &c->cfg;
    const char *d = c->dir, *a = c->arch;
    int fam = g->family;
    if (fam != ZS_FAM_MIXTRAL && fam != ZS_FAM_QWEN2MOE && fam != ZS_FAM_QWEN3MOE && fam != ZS_FAM_OLMOE)
        return zs_err(ZS_EUNSUPPORTED, "%s: %s with experts: not a mixture llama.cpp's converter writes (Mixtral, "
                      "Qwen2-MoE, Qwen3-MoE, OLMoE)", d, g->arch_name);
    if (g->n_experts > 384)
        return zs_err(ZS_EUNSUPPORTED, "%s: %d experts: llama.cpp 0.3.16 loads at most 384 (LLAMA_MAX_EXPERTS)", d,
                      g->n_experts);
    for (int l = 0; l < g->n_layers; l++)
        if (!zs_config_layer_moe(g, l))
            return zs_err(ZS_EUNSUPPORTED, "%s: layer %d has a dense MLP (decoder_sparse_step / mlp_only_layers): "
                          "llama.cpp's '%s' makes every layer a mixture of experts, a GGUF file cannot hold a dense "
                          "layer among them", d, l, a);
    int norm = fam == ZS_FAM_MIXTRAL || fam == ZS_FAM_QWEN3MOE; /* llama.cpp's norm_w for the architecture */
    if (!!g->norm_topk_prob != norm)
        return zs_err(ZS_EUNSUPPORTED, "%s: norm_topk_prob %s: llama.cpp's '%s' %s renormalises the top-%d routing "
                      "weights (a GGUF file cannot say otherwise)", d, g->norm_topk_prob ? "true" : "false", a,
                      norm ? "always" : "never", g->n_experts_used);
    if ((g->shared_ffn_dim > 0) != (fam == ZS_FAM_QWEN2MOE))
        return zs_err(ZS_EUNSUPPORTED, "%s: %s: llama.cpp's '%s' %s", d,
                      g->shared_ffn_dim > 0 ? "a shared expert" : "no shared expert (shared_expert_intermediate_size 0)", a,
                      fam == ZS_FAM_QWEN2MOE ? "requires the shared expert and its gate" : "has no shared expert");
    if ((fam == ZS_FAM_QWEN2MOE || fam == ZS_FAM_OLMOE) && (int64_t)g->n_heads * g->head_dim != g->dim)
        return zs_err(ZS_EUNSUPPORTED, "%s: %d heads of %d (head_dim) are not hidden_size %d: llama.cpp's '%s' shapes "
                      "attn_q and attn_output [dim, dim]", d, g->n_heads, g->head_dim, g->dim, a);
    if (fam == ZS_FAM_OLMOE) {
        if (g->clip_qkv > 0)
            return zs_err(ZS_EUNSUPPORTED, "%s: clip_qkv %g: llama.cpp's 'olmoe' does not clamp q, k and v", d,
                          (double)g->clip_qkv);
        if (g->n_kv_heads != g->n_heads)
            return zs_err(ZS_EUNSUPPORTED, "%s: %d KV heads of %d heads: llama.cpp's 'olmoe' shapes k_norm [dim] "
                          "(no grouped-query attention)", d, g->n_kv_heads, g->n_heads);
    }
    return 0;
}

/* The configuration against what llama.cpp (llama-cpp-python 0.3.16's) reads for the architecture
 * and what it hard-codes: ZS_EUNSUPPORTED naming what a GGUF file cannot say, rather than a file
 * that llama.cpp would run differently. */
static int conv_check(const zs_gguf_conv *c) {
    const zs_model_config *g = &c->cfg;
    const zs_rope_scaling *r = &g->rope;
    const char *d = c->dir, *a = c->arch;
    int fam = g->family, gemma = fam == ZS_FAM_GEMMA2 || fam == ZS_FAM_GEMMA3;
    if (g->arch == ZS_ARCH_GPT2) return 0;
    if (g->mlp_bias)
        return zs_err(ZS_EUNSUPPORTED, "%s: MLP biases (mlp_bias) cannot be converted yet: zeroserve's GGUF reader "
                      "does not read them back", d);
    if ((g->qkv_bias || g->o_bias) && fam != ZS_FAM_LLAMA && fam != ZS_FAM_QWEN2 &&
        !(fam == ZS_FAM_QWEN2MOE && !g->o_bias))
        return zs_err(ZS_EUNSUPPORTED, "%s: attention biases (%s) of %s: llama.cpp's '%s' architecture has "
                      "%s", d, fam == ZS_FAM_QWEN2MOE ? "of the output projection" : "attention_bias", g->arch_name, a,
                      fam == ZS_FAM_QWEN2MOE ? "q, k and v biases only" : "none");
    if (g->n_experts > 0) ZS_CHECK(moe_check(c));
    /* RoPE scaling: llama.cpp reads rope.scaling.{type,factor,original_context_length,attn_factor} for every
     * architecture, per-frequency divisors (rope_freqs) for llama, LongRoPE factors for phi3 */
    switch (r->type) {
    case ZS_ROPE_DEFAULT: break;
    case ZS_ROPE_LINEAR:
        break;
    case ZS_ROPE_DYNAMIC:
        return zs_err(ZS_EUNSUPPORTED, "%s: rope_scaling type 'dynamic' (dynamic NTK): llama.cpp has no dynamic NTK "
                      "RoPE scaling, a GGUF file cannot express it", d);
    case ZS_ROPE_LLAMA3:
        if (strcmp(a, "llama"))
            return zs_err(ZS_EUNSUPPORTED, "%s: rope_scaling type 'llama3' with %s: llama.cpp reads its rope_freqs "
                          "tensor only for the llama architecture", d, g->arch_name);
        break;
    case ZS_ROPE_YARN:
        if (fam == ZS_FAM_GEMMA3 || fam == ZS_FAM_PHI3) /* gemma3: YaRN's attention factor would reach the local layers */
            return zs_err(ZS_EUNSUPPORTED, "%s: rope_scaling type 'yarn' with %s is not supported by llama.cpp's '%s' "
                          "(%s)", d, g->arch_name, a, fam == ZS_FAM_PHI3 ? "it reads LongRoPE factors" :
                          "its converter scales the global layers only linearly");
        if ((r->beta_fast > 0 && r->beta_fast != 32) || (r->beta_slow > 0 && r->beta_slow != 1))
            return zs_err(ZS_EUNSUPPORTED, "%s: rope_scaling.beta_fast %g / beta_slow %g: llama.cpp reads no such key from "
                          "a GGUF file (it uses 32 and 1)", d, r->beta_fast > 0 ? (double)r->beta_fast : 32.0,
                          r->beta_slow > 0 ? (double)r->beta_slow : 1.0);
        if (!r->truncate)
            return zs_err(ZS_EUNSUPPORTED, "%s: rope_scaling.truncate false: llama.cpp always rounds YaRN's "
                          "correction range to whole dimensions", d);
        break;
    case ZS_ROPE_LONGROPE:
        if (fam != ZS_FAM_PHI3)
            return zs_err(ZS_EUNSUPPORTED, "%s: rope_scaling type 'longrope' with %s: llama.cpp reads LongRoPE factors "
                          "only for the phi3 architecture", d, g->arch_name);
        break;
    default:
        return zs_err(ZS_EUNSUPPORTED, "%s: rope_scaling type %d", d, r->type);
    }
    if (fam == ZS_FAM_PHI3 && r->type != ZS_ROPE_DEFAULT && r->type != ZS_ROPE_LONGROPE && r->type != ZS_ROPE_LINEAR)
        return zs_err(ZS_EUNSUPPORTED, "%s: Phi-3 RoPE scaling other than longrope or linear", d);
    if (gemma) {
        /* llama.cpp: the embedding is always the head for gemma2; the attention scale is head_dim^-0.5, or
         * (dim / heads)^-0.5 for the 27B sizes (46 layers for Gemma 2, 62 for Gemma 3) */
        int big = g->n_layers == (fam == ZS_FAM_GEMMA2 ? 46 : 62);
        int want = big ? g->dim / g->n_heads : g->head_dim, pat = fam == ZS_FAM_GEMMA2 ? 2 : 6;
        if (g->query_pre_attn_scalar != (float)want)
            return zs_err(ZS_EUNSUPPORTED, "%s: query_pre_attn_scalar is %g; llama.cpp's '%s' hard-codes %d for %d layers "
                          "(%s)", d, (double)g->query_pre_attn_scalar, a, want, g->n_layers,
                          big ? "hidden_size / num_attention_heads" : "head_dim");
        if (!g->sliding_window)
            return zs_err(ZS_EUNSUPPORTED, "%s: %s without a sliding window: llama.cpp's '%s' always has sliding layers",
                          d, g->arch_name, a);
        for (int l = 0; l < g->n_layers; l++)
            if (!!g->layer_sliding[l] != ((l + 1) % pat != 0))
                return zs_err(ZS_EUNSUPPORTED, "%s: layer %d is %s: llama.cpp's '%s' hard-codes every %s layer as the full one",
                              d, l, g->layer_sliding[l] ? "sliding" : "full", a, pat == 2 ? "second" : "sixth");
    }
    if (fam == ZS_FAM_GEMMA2) {
        if (!g->tied_embeddings)
            return zs_err(ZS_EUNSUPPORTED, "%s: Gemma 2 with a separate lm_head: llama.cpp's 'gemma2' always uses the "
                          "embedding as the head (its converter drops lm_head.weight)", d);
        if (!(g->attn_softcap > 0) || !(g->final_softcap > 0))
            return zs_err(ZS_EUNSUPPORTED, "%s: Gemma 2 without %s softcapping: llama.cpp's 'gemma2' always caps", d,
                          g->attn_softcap > 0 ? "final logit" : "attention logit");
    }
    if (fam == ZS_FAM_GEMMA3) {
        if (g->attn_softcap > 0 || g->final_softcap > 0)
            return zs_err(ZS_EUNSUPPORTED, "%s: Gemma 3 with %s softcapping: llama.cpp's 'gemma3' has none", d,
                          g->attn_softcap > 0 ? "attention logit" : "final logit");
        if (g->rope_local_theta != 10000.0f)
            return zs_err(ZS_EUNSUPPORTED, "%s: rope_local_base_freq is %g: llama.cpp's 'gemma3' hard-codes 10000 for the "
                          "sliding layers", d, (double)g->rope_local_theta);
        if (r->type != ZS_ROPE_DEFAULT && r->type != ZS_ROPE_LINEAR)
            return zs_err(ZS_EUNSUPPORTED, "%s: Gemma 3 RoPE scaling other than linear", d);
    }
    if (g->sliding_window > 0 && g->sliding_window < g->max_seq &&
        (!strcmp(a, "llama") || !strcmp(a, "qwen2") || !strcmp(a, "qwen3") || !strcmp(a, "qwen2moe") ||
         !strcmp(a, "qwen3moe") || !strcmp(a, "olmoe")))
        zs_log_warn("%s: sliding_window %d: llama.cpp's '%s' architecture has no sliding window (convert_hf_to_gguf.py "
                    "drops it): the GGUF file attends to the whole context, so outputs differ from the checkpoint's "
                    "past %d tokens", d, g->sliding_window, a, g->sliding_window);
    return 0;
}

static const char *arch_of(const zs_model_config *g) {
    switch (g->family) {
    case ZS_FAM_GPT2: return "gpt2";
    case ZS_FAM_QWEN2: return "qwen2";
    case ZS_FAM_QWEN3: return "qwen3";
    case ZS_FAM_GEMMA2: return "gemma2";
    case ZS_FAM_GEMMA3: return "gemma3";
    case ZS_FAM_PHI3: return "phi3";
    case ZS_FAM_QWEN2MOE: return "qwen2moe";
    case ZS_FAM_QWEN3MOE: return "qwen3moe";
    case ZS_FAM_OLMOE: return "olmoe";
    default: return g->arch == ZS_ARCH_GPT2 ? "gpt2" : "llama"; /* llama, mistral, mixtral (llama with experts) */
    }
}

int zs_gguf_conv_open(const char *dir, zs_llama_ftype ftype, zs_gguf_conv **out) {
    if (!dir || !out) return zs_err(ZS_EINVAL, "zs_gguf_conv_open: NULL argument");
    struct stat sb;
    if (stat(dir, &sb) != 0) return zs_err(ZS_ENOTFOUND, "%s: no such model directory", dir);
    if (!S_ISDIR(sb.st_mode))
        return zs_err(ZS_EUNSUPPORTED, "%s: not a directory (convert reads a Hugging Face model directory: config.json, "
                      "*.safetensors, tokenizer.json)", dir);
    if (!strcmp(zs_llama_ftype_name(ftype), "?")) return zs_err(ZS_EINVAL, "convert: unknown file type %d", (int)ftype);
    zs_gguf_conv *c = calloc(1, sizeof *c);
    if (!c) return zs_err(ZS_ENOMEM, "out of memory");
    c->ftype = ftype;
    zs_model *m = NULL;
    zs_model_opts o;
    zs_model_opts_default(&o);
    o.weight_dtype = ZS_F32; /* only the validation and the slot sources are used */
    int rc = (c->dir = strdup(dir)) ? 0 : zs_err(ZS_ENOMEM, "out of memory");
    if (rc == 0) rc = zs_model_open(dir, &o, &m);
    if (rc == 0) {
        c->cfg = *zs_model_config_get(m);
        c->arch = arch_of(&c->cfg);
        /* llama.cpp's qwen2moe and olmoe require output.weight: a tied head is written as a copy */
        c->head_copy = c->cfg.tied_embeddings && (c->cfg.family == ZS_FAM_QWEN2MOE || c->cfg.family == ZS_FAM_OLMOE);
        zs_model_close_checkpoint(m);
        rc = conv_check(c);
    }
    if (rc == 0) rc = zs_st_open_dir(dir, &c->st);
    if (rc == 0) rc = plan(c, m);
    zs_model_free(m);
    if (rc < 0) {
        zs_gguf_conv_close(c);
        return rc;
    }
    *out = c;
    return 0;
}

void zs_gguf_conv_close(zs_gguf_conv *c) {
    if (!c) return;
    zs_st_close(c->st);
    for (size_t i = 0; i < c->n; i++) {
        free(c->t[i].fixed);
        free(c->t[i].xpart);
    }
    free(c->t);
    free(c->dir);
    free(c);
}

const zs_model_config *zs_gguf_conv_config(const zs_gguf_conv *c) { return &c->cfg; }
const char *zs_gguf_conv_arch(const zs_gguf_conv *c) { return c->arch; }
size_t zs_gguf_conv_count(const zs_gguf_conv *c) { return c->n; }
const zs_gguf_conv_tensor *zs_gguf_conv_at(const zs_gguf_conv *c, size_t i) { return i < c->n ? &c->t[i].pub : NULL; }

uint64_t zs_gguf_conv_data_bytes(const zs_gguf_conv *c) {
    uint64_t s = 0;
    for (size_t i = 0; i < c->n; i++) {
        size_t b = 0;
        zs_gguf_tensor_nbytes((int)c->t[i].pub.type, c->t[i].pub.n_dims, c->t[i].pub.ne, &b);
        s += b;
    }
    return s;
}

/* ---------------------------------------------------------------- metadata */

int zs_gguf_conv_put_meta(const zs_gguf_conv *c, zs_gguf_writer *w, const char *name) {
    const zs_model_config *g = &c->cfg;
    const zs_rope_scaling *r = &g->rope;
    const char *a = c->arch;
    char base[256];
    if (!name) {
        size_t l = strlen(c->dir);
        while (l > 1 && c->dir[l - 1] == '/') l--;
        size_t s = l;
        while (s > 0 && c->dir[s - 1] != '/') s--;
        snprintf(base, sizeof base, "%.*s", (int)(l - s), c->dir + s);
        name = base;
    }
    int fam = g->family, gemma = fam == ZS_FAM_GEMMA2 || fam == ZS_FAM_GEMMA3, phi3 = fam == ZS_FAM_PHI3;
    char k[128];
#define K(key) (snprintf(k, sizeof k, "%s." key, a), k)
    ZS_CHECK(zs_gguf_writer_kv_str(w, "general.architecture", a));
    ZS_CHECK(zs_gguf_writer_kv_str(w, "general.type", "model"));
    ZS_CHECK(zs_gguf_writer_kv_str(w, "general.name", name));
    ZS_CHECK(zs_gguf_writer_kv_u32(w, "general.file_type", (uint32_t)c->ftype));
    ZS_CHECK(zs_gguf_writer_kv_u32(w, "general.quantization_version", 2));
    ZS_CHECK(zs_gguf_writer_kv_u32(w, "general.alignment", ZS_GGUF_DEFAULT_ALIGNMENT));
    ZS_CHECK(zs_gguf_writer_kv_u32(w, K("block_count"), (uint32_t)g->n_layers));
    ZS_CHECK(zs_gguf_writer_kv_u32(w, K("context_length"), (uint32_t)g->max_seq));
    ZS_CHECK(zs_gguf_writer_kv_u32(w, K("embedding_length"), (uint32_t)g->dim));
    /* a mixture: llama and olmoe shape the experts by feed_forward_length (Mixtral's and OLMoE's
     * intermediate_size is the expert size); qwen2moe / qwen3moe write intermediate_size and take the
     * expert sizes from their own keys */
    int ff = g->n_experts > 0 && (!strcmp(a, "llama") || !strcmp(a, "olmoe") || g->ffn_dim <= 0) ? g->moe_ffn_dim
                                                                                                 : g->ffn_dim;
    ZS_CHECK(zs_gguf_writer_kv_u32(w, K("feed_forward_length"), (uint32_t)ff));
    ZS_CHECK(zs_gguf_writer_kv_u32(w, K("attention.head_count"), (uint32_t)g->n_heads));
    if (g->arch == ZS_ARCH_GPT2) {
        ZS_CHECK(zs_gguf_writer_kv_f32(w, K("attention.layer_norm_epsilon"), g->norm_eps));
        return 0;
    }
    ZS_CHECK(zs_gguf_writer_kv_u32(w, K("attention.head_count_kv"), (uint32_t)g->n_kv_heads));
    /* (Gemma 2's converter leaves rope.freq_base out, llama.cpp's default 10000; written here so that
     * another base is not lost: llama.cpp reads the key for every architecture) */
    ZS_CHECK(zs_gguf_writer_kv_f32(w, K("rope.freq_base"), g->rope_theta));
    /* (OlmoeModel writes 1e-5 whatever the checkpoint's; llama.cpp reads the key: the checkpoint's here) */
    ZS_CHECK(zs_gguf_writer_kv_f32(w, K("attention.layer_norm_rms_epsilon"), g->norm_eps));
    if (g->n_experts > 0) { /* TextModel / Qwen2MoeModel / OlmoeModel.set_gguf_parameters */
        ZS_CHECK(zs_gguf_writer_kv_u32(w, K("expert_count"), (uint32_t)g->n_experts));
        ZS_CHECK(zs_gguf_writer_kv_u32(w, K("expert_used_count"), (uint32_t)g->n_experts_used));
        if (!strcmp(a, "qwen2moe") || !strcmp(a, "qwen3moe"))
            ZS_CHECK(zs_gguf_writer_kv_u32(w, K("expert_feed_forward_length"), (uint32_t)g->moe_ffn_dim));
        if (g->shared_ffn_dim > 0)
            ZS_CHECK(zs_gguf_writer_kv_u32(w, K("expert_shared_feed_forward_length"), (uint32_t)g->shared_ffn_dim));
    }
    /* Phi3MiniModel writes no key/value length (llama.cpp takes dim / heads): only when they differ */
    if (!phi3 || g->head_dim * g->n_heads != g->dim) {
        ZS_CHECK(zs_gguf_writer_kv_u32(w, K("attention.key_length"), (uint32_t)g->head_dim));
        ZS_CHECK(zs_gguf_writer_kv_u32(w, K("attention.value_length"), (uint32_t)g->head_dim));
    }
    /* LlamaModel and Phi3MiniModel write the rotary dimensions, LlamaModel the vocabulary size (the
     * others leave them to llama.cpp's defaults: head_dim, the token list) */
    if (!strcmp(a, "llama") || phi3) ZS_CHECK(zs_gguf_writer_kv_u32(w, K("rope.dimension_count"), (uint32_t)g->head_dim));
    if (!strcmp(a, "llama")) ZS_CHECK(zs_gguf_writer_kv_u32(w, K("vocab_size"), (uint32_t)g->vocab_size));
    /* RoPE scaling (llama.cpp reads these keys for every architecture; llama3 and longrope are tensors) */
    if (r->type == ZS_ROPE_LINEAR) {
        ZS_CHECK(zs_gguf_writer_kv_str(w, K("rope.scaling.type"), "linear"));
        ZS_CHECK(zs_gguf_writer_kv_f32(w, K("rope.scaling.factor"), r->factor));
    } else if (r->type == ZS_ROPE_YARN) {
        ZS_CHECK(zs_gguf_writer_kv_str(w, K("rope.scaling.type"), "yarn"));
        ZS_CHECK(zs_gguf_writer_kv_f32(w, K("rope.scaling.factor"), r->factor));
        ZS_CHECK(zs_gguf_writer_kv_u32(w, K("rope.scaling.original_context_length"),
                                       (uint32_t)(r->orig_max_pos > 0 ? r->orig_max_pos : g->max_seq)));
        /* llama.cpp multiplies cos and sin by attn_factor * (1 + 0.1 ln factor); the converter writes no
         * attn_factor (right for the default): here only when the checkpoint's factor is another */
        double af = yarn_attn(r) / (1.0 + 0.1 * log((double)r->factor));
        if (fabs(af - 1.0) > 1e-6) ZS_CHECK(zs_gguf_writer_kv_f32(w, K("rope.scaling.attn_factor"), (float)af));
    }
    if (phi3) {
        ZS_CHECK(zs_gguf_writer_kv_u32(w, K("rope.scaling.original_context_length"),
                                       (uint32_t)(r->type == ZS_ROPE_LONGROPE && r->orig_max_pos > 0 ? r->orig_max_pos
                                                                                                     : g->max_seq)));
        if (r->type == ZS_ROPE_LONGROPE) ZS_CHECK(zs_gguf_writer_kv_f32(w, K("rope.scaling.attn_factor"), (float)longrope_attn(g)));
        ZS_CHECK(zs_gguf_writer_kv_u32(w, K("attention.sliding_window"), (uint32_t)g->sliding_window));
    }
    if (gemma) {
        if (fam == ZS_FAM_GEMMA2) {
            ZS_CHECK(zs_gguf_writer_kv_f32(w, K("attn_logit_softcapping"), g->attn_softcap));
            ZS_CHECK(zs_gguf_writer_kv_f32(w, K("final_logit_softcapping"), g->final_softcap));
        }
        ZS_CHECK(zs_gguf_writer_kv_u32(w, K("attention.sliding_window"), (uint32_t)g->sliding_window));
    }
#undef K
    return 0;
}

/* ---------------------------------------------------------------- data */

/* Hugging Face row (or element) of interleaved row o: per head, pairs (i, i + hd/2) become
 * (2i, 2i + 1) (LlamaModel.permute). */
static int64_t rope_src(int64_t o, int64_t n, int heads) {
    int64_t hd = n / heads, half = hd / 2, hb = o - o % hd, k = o % hd;
    return hb + (k % 2) * half + k / 2;
}

static void part_row(const cv_part *p, int64_t r, int64_t cols, float *dst) {
    const zs_st_tensor *t = p->t;
    size_t es = zs_dtype_size(t->dtype);
    const char *d = t->data;
    if (p->kind == ZS_SRC_TRANSPOSE_COLS) { /* column col0 + r of an [in, tcols] Conv1D weight */
        int64_t tc = t->shape[1];
        for (int64_t i = 0; i < cols; i++) zs_to_f32(&dst[i], d + (size_t)(i * tc + p->col0 + r) * es, t->dtype, 1);
        return;
    }
    /* ROW_SLICE: rows from col0 of a fused [rows, in] tensor (Phi-3's qkv_proj, gate_up_proj) */
    int64_t rr = p->rope_heads ? rope_src(r, p->n, p->rope_heads) : r;
    if (p->kind == ZS_SRC_ROW_SLICE) rr += p->col0;
    zs_to_f32(dst, d + (size_t)(rr * cols) * es, t->dtype, (size_t)cols);
}

/* Gemma's w + 1: torch adds in the checkpoint's dtype when it is f16 (the converter turns bf16 into
 * f32 first), in f32 otherwise. */
static void add_one(float *v, int64_t n, zs_dtype src) {
    for (int64_t i = 0; i < n; i++) {
        float x = v[i] + 1.0f;
        v[i] = src == ZS_F16 ? zs_f16_to_f32(zs_f32_to_f16(x)) : x;
    }
}

static void part_vec(const cv_part *p, float *dst) {
    const zs_st_tensor *t = p->t;
    size_t es = zs_dtype_size(t->dtype);
    const char *d = (const char *)t->data + (p->kind == ZS_SRC_VEC_SLICE ? (size_t)p->col0 * es : 0);
    if (!p->rope_heads) zs_to_f32(dst, d, t->dtype, (size_t)p->n);
    else
        for (int64_t o = 0; o < p->n; o++) zs_to_f32(&dst[o], d + (size_t)rope_src(o, p->n, p->rope_heads) * es, t->dtype, 1);
    if (p->add_one) add_one(dst, p->n, t->dtype);
}

/* One chunk of rows [r0, r0 + n) of a matrix, converted by the worker pool: task i reads row
 * r0 + i into its own f32 slice and writes its own output row (rows are independent, so the bytes
 * do not depend on the thread count). */
typedef struct {
    const cv_tensor *t;
    int64_t r0;
    float *f;     /* [n][cols] */
    char *o;      /* [n][rb] */
    size_t rb;
    zs_dtype od;
} cv_chunk;

static void row_task(void *arg, int task) {
    const cv_chunk *j = arg;
    const cv_tensor *t = j->t;
    int64_t r = j->r0 + task;
    const cv_part *p = parts_of(t);
    if (t->xpart) p += r / t->xrows, r %= t->xrows; /* stacked experts: expert r / xrows's rows */
    else
        while (r >= p->n) r -= p->n, p++; /* GPT-2's attn_qkv: rows of q, then k, then v */
    float *f = j->f + (size_t)task * (size_t)t->cols;
    part_row(p, r, t->cols, f);
    zs_convert(j->o + (size_t)task * j->rb, j->od, f, ZS_F32, (size_t)t->cols); /* quantizes into a block format */
}

static int put_one(zs_gguf_writer *w, const cv_tensor *t, float *f, char *obuf, size_t fcap) {
    zs_dtype od = dtype_of(t->pub.type);
    size_t rb = 0;
    int64_t one = t->cols;
    ZS_CHECK(zs_gguf_tensor_nbytes((int)t->pub.type, 1, &one, &rb));
    if (t->fixed) {
        zs_convert(obuf, od, t->fixed, ZS_F32, (size_t)t->cols);
        return zs_gguf_writer_write(w, obuf, rb);
    }
    if (t->vec) {
        float *v = f;
        for (int k = 0; k < t->n_parts; k++) {
            part_vec(&t->part[k], v);
            v += t->part[k].n;
        }
        zs_convert(obuf, od, f, ZS_F32, (size_t)t->cols);
        return zs_gguf_writer_write(w, obuf, rb);
    }
    int64_t per = ZS_MAX((int64_t)1, (int64_t)(fcap / ((size_t)t->cols * sizeof(float))));
    for (int64_t r0 = 0; r0 < t->rows; r0 += per) {
        int n = (int)ZS_MIN(per, t->rows - r0);
        cv_chunk j = {t, r0, f, obuf, rb, od};
        zs_pool_run(row_task, &j, n);
        ZS_CHECK(zs_gguf_writer_write(w, obuf, (size_t)n * rb));
    }
    return 0;
}

int zs_gguf_conv_put_tensors(zs_gguf_conv *c, zs_gguf_writer *w) {
    for (size_t i = 0; i < c->n; i++)
        ZS_CHECK(zs_gguf_writer_add_tensor(w, c->t[i].pub.name, c->t[i].pub.type, c->t[i].pub.n_dims, c->t[i].pub.ne));
    /* a chunk of rows: 8 MiB of f32 (at least one row, or one whole 1-D tensor) and its output */
    int64_t maxc = 1;
    for (size_t i = 0; i < c->n; i++) maxc = ZS_MAX(maxc, c->t[i].cols);
    size_t fcap = ZS_MAX((size_t)8 << 20, (size_t)maxc * sizeof(float));
    float *f = malloc(fcap);
    char *obuf = malloc(fcap); /* no output type takes more than 4 bytes a value */
    int rc = f && obuf ? 0 : zs_err(ZS_ENOMEM, "out of memory for the conversion buffers (%zu bytes)", 2 * fcap);
    for (size_t i = 0; rc == 0 && i < c->n; i++) {
        const cv_tensor *t = &c->t[i];
        rc = put_one(w, t, f, obuf, fcap);
        if (rc < 0) zs_err_prefix(rc, "while writing %s", t->pub.name);
        for (int k = 0; k < t->n_parts; k++) zs_st_release(c->st, parts_of(t)[k].t); /* its pages are not needed again */
        zs_log_debug("convert: %-28s %-5s [%lld, %lld, %lld]%s%s", t->pub.name, zs_gguf_type_name((int)t->pub.type),
                     (long long)t->pub.ne[0], (long long)t->pub.ne[1], (long long)t->pub.ne[2],
                     t->pub.note ? " — " : "", t->pub.note ? t->pub.note : "");
    }
    free(f);
    free(obuf);
    return rc;
}
