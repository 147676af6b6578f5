/* model.c — opening a checkpoint as a model: the bucket layout of each architecture (with the
 * host embedding lookup tables of inference models; the experts of a mixture of experts each a
 * bucket of their own), the mapping from Hugging Face tensor names (a safetensors directory) or
 * llama.cpp tensor names (a GGUF file with F32/F16/BF16 tensors, Q8_0/Q4_0/Q4_1/Q5_0/Q5_1 and K-quant (Q2_K .. Q6_K)
 * matrices, each kept as stored; stacked expert tensors cut into one slice per expert) to roles,
 * validation of every tensor, packing buckets, and the pass order. */
#include "model.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "gguf.h"
#include "quant-mix.h"
#include "safetensors.h"


typedef struct {
    const zs_st_tensor *t; /* validated source tensor (valid while the checkpoint is open) */
    int kind;
    int64_t col0;          /* first source column (TRANSPOSE_COLS) or element (VEC_SLICE) */
    char name[128];        /* the HF tensor name and shape, kept for export */
    int ndim;
    int64_t shape[2];
    int rope_heads;        /* GGUF llama Q/K: rows are in the interleaved RoPE order of this many
                              heads; packing puts them back in rotate_half order (0: as stored) */
    int64_t elem0;         /* COPY: first source element (GGUF gpt2's fused attn_qkv) */
} src_ref;

struct zs_model {
    char *dir;
    zs_model_config cfg;
    zs_model_opts opts;
    zs_st_set *st;
    zs_gguf *gg;              /* a GGUF checkpoint instead of st */
    zs_st_tensor *gt;         /* [tensor count of gg] its tensors described as safetensors ones
                                 (HF dim order; dtype ZS_DTYPE_COUNT for a type we cannot load) */
    int n_buckets;
    int head;                 /* the head bucket: n_layers + 1 (the expert buckets follow it) */
    int *moe_base;            /* [n_layers] first expert bucket of a MoE layer, or -1 (dense) */
    int *exp_layer;           /* [n_moe_layers] the layer of each MoE layer's experts, in order */
    int as_stored;            /* layouts rebuilt "as stored": a matrix whose source is a block format keeps it */
    zs_bucket_layout *layout; /* [n_buckets] */
    zs_bucket_layout *glayout; /* [n_buckets] the same slots, every tensor f32 (gradients, master weights) */
    src_ref *src;             /* [n_buckets * ZS_MAX_ROLES] */
    void **data;              /* [n_buckets] resident copies (or NULL) */
    void **res;               /* [n_buckets] */
    void *tok_lookup;         /* embed_lookup with a sharded token table (tied head): its host copy */
    char fingerprint[96];
    char gfp[24];             /* GGUF: fingerprint of the file */
    size_t n_params;
};

void zs_model_opts_default(zs_model_opts *o) {
    o->weight_dtype = ZS_DTYPE_COUNT;
    o->quant_mix = ZS_QUANT_MIX_NONE;
    o->persist_threshold = 0;
    o->embed_lookup = 0;
}

int zs_model_n_buckets(const zs_model *m) { return m->n_buckets; }
int zs_bucket_head(const zs_model *m) { return m->head; }

int zs_bucket_expert(const zs_model *m, int layer, int e) {
    if (layer < 0 || layer >= m->cfg.n_layers || e < 0 || e >= m->cfg.n_experts || m->moe_base[layer] < 0)
        return -1;
    return m->moe_base[layer] + e;
}

int zs_bucket_is_expert(const zs_model *m, int b, int *layer, int *e) {
    int first = m->head + 1, ne = m->cfg.n_experts;
    if (b < first || b >= m->n_buckets || ne <= 0) return 0;
    if (layer) *layer = m->exp_layer[(b - first) / ne];
    if (e) *e = (b - first) % ne;
    return 1;
}

const char *zs_bucket_label(const zs_model *m, int b, char *buf, size_t cap) {
    int l, e;
    if (b == zs_bucket_embed()) snprintf(buf, cap, "embeddings");
    else if (b == zs_bucket_head(m)) snprintf(buf, cap, "head");
    else if (zs_bucket_is_expert(m, b, &l, &e)) snprintf(buf, cap, "layer %d expert %d", l, e);
    else snprintf(buf, cap, "layer %d", b - 1);
    return buf;
}

size_t zs_model_expert_bytes(const zs_model *m) {
    size_t mx = 0;
    for (int b = m->head + 1; b < m->n_buckets; b++) mx = ZS_MAX(mx, m->layout[b].data_bytes);
    return mx;
}
const zs_model_config *zs_model_config_get(const zs_model *m) { return &m->cfg; }
const zs_bucket_layout *zs_model_layout(const zs_model *m, int b) { return &m->layout[b]; }
const zs_bucket_layout *zs_model_grad_layout(const zs_model *m, int b) { return &m->glayout[b]; }
const char *zs_model_dir(const zs_model *m) { return m->dir; }
const char *zs_model_fingerprint(const zs_model *m) { return m->fingerprint; }
size_t zs_model_param_count(const zs_model *m) { return m->n_params; }
const void *zs_model_bucket_data(const zs_model *m, int b) { return m->data ? m->data[b] : NULL; }
const void *zs_model_bucket_resident(const zs_model *m, int b) { return m->res ? m->res[b] : NULL; }
void *zs_model_bucket_resident_mut(zs_model *m, int b) { return m->res ? m->res[b] : NULL; }

size_t zs_model_weight_bytes(const zs_model *m) {
    size_t s = 0;
    for (int b = 0; b < m->n_buckets; b++) s += m->layout[b].data_bytes + m->layout[b].resident_bytes;
    return s;
}

zs_dtype zs_model_quant_dtype(const zs_model *m) {
    for (int b = 0; b < m->n_buckets; b++)
        for (int r = 0; r < m->layout[b].n_roles; r++)
            if (m->layout[b].slot[r].present && zs_dtype_is_quant(m->layout[b].slot[r].dtype))
                return m->layout[b].slot[r].dtype;
    return ZS_DTYPE_COUNT;
}

/* ---- layout ---- */

static void slot_set(zs_bucket_layout *L, int role, zs_dtype dt, int ndim, int64_t d0, int64_t d1) {
    zs_slot *s = &L->slot[role];
    /* a block format needs whole blocks per row: other matrices stay 16-bit (as llama.cpp does) */
    if (zs_dtype_block(dt) > 1 && (ndim < 2 || d1 % zs_dtype_block(dt) != 0)) dt = ZS_F16; /* as llama.cpp's converter and quantizer fall back */
    s->present = 1;
    s->dtype = dt;
    s->ndim = ndim;
    s->shape[0] = d0;
    s->shape[1] = ndim > 1 ? d1 : 1;
}

/* Assigns areas and offsets to the present slots: 64-byte aligned, data part padded to 4 KiB.
 * The roles in the bit mask `force` are resident whatever their size (lookup tables). */
static void layout_finish(zs_bucket_layout *L, int64_t threshold, unsigned force) {
    size_t off_d = 0, off_r = 0;
    for (int r = 0; r < L->n_roles; r++) {
        zs_slot *s = &L->slot[r];
        if (!s->present) continue;
        int64_t n = s->shape[0] * s->shape[1];
        s->nbytes = zs_dtype_bytes(s->dtype, (size_t)n);
        s->resident = n < threshold || s->ndim == 1 || (force >> r & 1u);
        size_t *off = s->resident ? &off_r : &off_d;
        s->offset = *off;
        *off = ZS_ALIGN_UP(*off + s->nbytes, 64);
    }
    L->data_bytes = ZS_ALIGN_UP(off_d, 4096);
    L->resident_bytes = off_r;
}

/* the storage dtype of matrix `role` of bucket b: wd, or as stored (a checkpoint of mixed formats,
 * e.g. Q4_K_M's Q4_K, Q5_K and Q6_K with fallbacks, keeps each matrix's own: "as stored" never
 * converts at load; without a source tensor, wd when that is a block of 32, else bf16) */
static zs_dtype matrix_dtype(const zs_model *m, int b, int role, zs_dtype wd) {
    if (!m->as_stored) return wd;
    const zs_st_tensor *t = m->src[b * ZS_MAX_ROLES + role].t;
    if (t && t->dtype < ZS_DTYPE_COUNT) return t->dtype;
    return zs_dtype_block(wd) == ZS_QK_K ? ZS_BF16 : wd;
}

/* the storage dtype of a MoE router: as stored when that is an element type (a GGUF file's f32 router
 * stays f32 in an f16 model, as llama.cpp computes it; a block format only "as stored"), whatever the
 * weight dtype; never made a block format at load (convert_hf_to_gguf.py keeps ffn_gate_inp f32 and
 * llama-quantize leaves it alone: a quantized router would pick other experts). Before the checkpoint
 * is mapped: the weight dtype, f32 for a block one (zs_model_open lays a MoE model out again once it
 * knows the sources). */
static zs_dtype router_dtype(const zs_model *m, int b, zs_dtype wd) {
    const zs_st_tensor *t = m->src[b * ZS_MAX_ROLES + ZS_R_ROUTER].t;
    if (t && t->dtype < ZS_DTYPE_COUNT && (m->as_stored || !zs_dtype_is_quant(t->dtype))) return t->dtype;
    return zs_dtype_block(wd) > 1 ? ZS_F32 : wd;
}

/* Qwen2-MoE's shared-expert gate [1, dim]: a matrix under the weight dtypes convert_hf_to_gguf.py
 * writes (f32, f16, bf16, q8_0: it quantizes the one-row tensor too), f32 under the 4- and 5-bit
 * ones, which llama-quantize makes and which leave a one-row tensor as the f32 conversion has it (the
 * Q4_K_M mix says the same: quant-mix.h); as stored when a checkpoint of block formats is kept so. */
static zs_dtype shared_gate_dtype(const zs_model *m, int b, zs_dtype wd) {
    zs_dtype dt = matrix_dtype(m, b, ZS_R_SHARED_GATE, wd);
    if (m->as_stored) return dt;
    return zs_dtype_is_quant(dt) && dt != ZS_Q8_0 ? ZS_F32 : dt;
}

static void build_layouts(zs_model *m) {
    const zs_model_config *c = &m->cfg;
    zs_dtype wd0 = m->opts.weight_dtype;
#define WD(b, role) matrix_dtype(m, (b), (role), wd0)
    int64_t d = c->dim, q = (int64_t)c->n_heads * c->head_dim, kvd = (int64_t)c->n_kv_heads * c->head_dim;
    int64_t f = c->ffn_dim, mf = c->moe_ffn_dim, sf = c->shared_ffn_dim;
    int gpt2 = c->arch == ZS_ARCH_GPT2;

    zs_bucket_layout *E = &m->layout[0];
    E->n_roles = ZS_R_EMB_COUNT;
    slot_set(E, ZS_R_TOK_EMB, WD(0, ZS_R_TOK_EMB), 2, c->vocab_size, d);
    if (gpt2) slot_set(E, ZS_R_POS_EMB, WD(0, ZS_R_POS_EMB), 2, c->max_seq, d);

    for (int l = 0; l < c->n_layers; l++) {
        zs_bucket_layout *L = &m->layout[1 + l];
        int moe = zs_config_layer_moe(c, l);
        L->n_roles = ZS_R_LAYER_COUNT;
        slot_set(L, ZS_R_ATTN_NORM_W, ZS_F32, 1, d, 1);
        slot_set(L, ZS_R_WQ, WD(1 + l, ZS_R_WQ), 2, q, d);
        slot_set(L, ZS_R_WK, WD(1 + l, ZS_R_WK), 2, kvd, d);
        slot_set(L, ZS_R_WV, WD(1 + l, ZS_R_WV), 2, kvd, d);
        slot_set(L, ZS_R_WO, WD(1 + l, ZS_R_WO), 2, d, q);
        slot_set(L, ZS_R_FFN_NORM_W, ZS_F32, 1, d, 1);
        if (moe) { /* router (+ the shared expert and its gate); the experts are buckets of their own */
            slot_set(L, ZS_R_ROUTER, router_dtype(m, 1 + l, wd0), 2, c->n_experts, d);
            if (sf > 0) {
                slot_set(L, ZS_R_W_GATE, WD(1 + l, ZS_R_W_GATE), 2, sf, d);
                slot_set(L, ZS_R_W_UP, WD(1 + l, ZS_R_W_UP), 2, sf, d);
                slot_set(L, ZS_R_W_DOWN, WD(1 + l, ZS_R_W_DOWN), 2, d, sf);
                slot_set(L, ZS_R_SHARED_GATE, shared_gate_dtype(m, 1 + l, wd0), 2, 1, d);
            }
            for (int e = 0; e < c->n_experts; e++) {
                int eb = m->moe_base[l] + e;
                zs_bucket_layout *X = &m->layout[eb];
                X->n_roles = ZS_R_LAYER_COUNT;
                slot_set(X, ZS_R_W_GATE, WD(eb, ZS_R_W_GATE), 2, mf, d);
                slot_set(X, ZS_R_W_UP, WD(eb, ZS_R_W_UP), 2, mf, d);
                slot_set(X, ZS_R_W_DOWN, WD(eb, ZS_R_W_DOWN), 2, d, mf);
            }
        } else {
            if (!gpt2) slot_set(L, ZS_R_W_GATE, WD(1 + l, ZS_R_W_GATE), 2, f, d);
            slot_set(L, ZS_R_W_UP, WD(1 + l, ZS_R_W_UP), 2, f, d);
            slot_set(L, ZS_R_W_DOWN, WD(1 + l, ZS_R_W_DOWN), 2, d, f);
        }
        if (gpt2) {
            slot_set(L, ZS_R_ATTN_NORM_B, ZS_F32, 1, d, 1);
            slot_set(L, ZS_R_FFN_NORM_B, ZS_F32, 1, d, 1);
        }
        if (gpt2 || c->qkv_bias) {
            slot_set(L, ZS_R_BQ, ZS_F32, 1, q, 1);
            slot_set(L, ZS_R_BK, ZS_F32, 1, kvd, 1);
            slot_set(L, ZS_R_BV, ZS_F32, 1, kvd, 1);
        }
        if (gpt2 || c->o_bias) slot_set(L, ZS_R_BO, ZS_F32, 1, d, 1);
        if (c->qk_norm) {
            slot_set(L, ZS_R_Q_NORM, ZS_F32, 1, c->head_dim, 1);
            slot_set(L, ZS_R_K_NORM, ZS_F32, 1, c->head_dim, 1);
        } else if (c->qk_norm_full) { /* OLMoE: over the whole q and k rows */
            slot_set(L, ZS_R_Q_NORM, ZS_F32, 1, q, 1);
            slot_set(L, ZS_R_K_NORM, ZS_F32, 1, kvd, 1);
        }
        if (c->post_norms) {
            slot_set(L, ZS_R_POST_ATTN_NORM, ZS_F32, 1, d, 1);
            slot_set(L, ZS_R_POST_FFN_NORM, ZS_F32, 1, d, 1);
        }
        if ((gpt2 || c->mlp_bias) && !moe) {
            if (!gpt2) slot_set(L, ZS_R_B_GATE, ZS_F32, 1, f, 1);
            slot_set(L, ZS_R_B_UP, ZS_F32, 1, f, 1);
            slot_set(L, ZS_R_B_DOWN, ZS_F32, 1, d, 1);
        }
    }
    zs_bucket_layout *H = &m->layout[m->head];
    H->n_roles = ZS_R_HEAD_COUNT;
    slot_set(H, ZS_R_OUT_NORM_W, ZS_F32, 1, d, 1);
    if (gpt2) slot_set(H, ZS_R_OUT_NORM_B, ZS_F32, 1, d, 1);
    if (!c->tied_embeddings) slot_set(H, ZS_R_LM_HEAD, WD(m->head, ZS_R_LM_HEAD), 2, c->vocab_size, d);
    if (m->opts.quant_mix == ZS_QUANT_MIX_Q4_K_M) { /* llama.cpp's Q4_K_M: each matrix its own format */
        /* GPT-2's and Phi-3's q, k and v are one attn_qkv tensor in llama.cpp's files */
        unsigned fl = (c->tied_embeddings ? ZS_QMIX_TIED : 0u) |
                      (gpt2 || c->family == ZS_FAM_PHI3 ? ZS_QMIX_FUSED_QKV : 0u) |
                      (c->n_experts == 8 ? ZS_QMIX_EXPERTS8 : 0u) |
                      (zs_quant_mix_is_70b(c->family, c->n_layers, c->n_heads, c->n_kv_heads, c->n_experts)
                           ? ZS_QMIX_70B : 0u);
        for (int b = 0; b < m->n_buckets; b++) {
            /* quant-mix.h's layer: -1 embeddings, the block, n_layers the head; an expert is its layer's
             * gate / up / down (as llama.cpp's ffn_*_exps); the router is not in the mix (kept) */
            int xl, layer = b == m->head ? c->n_layers : b - 1;
            if (zs_bucket_is_expert(m, b, &xl, NULL)) layer = xl;
            for (int r = 0; r < m->layout[b].n_roles; r++) {
                zs_slot *s = &m->layout[b].slot[r];
                if (!s->present || s->ndim != 2) continue;
                zs_dtype dt = zs_quant_mix_q4_k_m(layer, r, c->n_layers, s->shape[1], fl);
                s->dtype = dt < ZS_DTYPE_COUNT ? dt : s->dtype;
            }
        }
    }

    /* inference models: the tables that are only looked up are host-resident (model.h); a tied
     * token table stays sharded (it is the LM head too) */
    unsigned lookup = 0;
    if (m->opts.embed_lookup) lookup = (c->tied_embeddings ? 0u : 1u << ZS_R_TOK_EMB) | 1u << ZS_R_POS_EMB;
    for (int b = 0; b < m->n_buckets; b++) {
        unsigned force = b == zs_bucket_embed() ? lookup : 0;
        layout_finish(&m->layout[b], m->opts.persist_threshold, force);
        for (int r = 0; r < m->layout[b].n_roles; r++)
            if (m->layout[b].slot[r].present)
                m->n_params += (size_t)(m->layout[b].slot[r].shape[0] * m->layout[b].slot[r].shape[1]);
        /* the f32 twin: same slots and areas (they depend on shapes only), f32 offsets */
        m->glayout[b] = m->layout[b];
        for (int r = 0; r < m->glayout[b].n_roles; r++) m->glayout[b].slot[r].dtype = ZS_F32;
        layout_finish(&m->glayout[b], m->opts.persist_threshold, force);
    }
#undef WD
}

/* ---- name mapping and validation ---- */

/* A GGUF tensor by llama.cpp name, checked against our [out, in] shape (GGUF's ne[] is the
 * reverse: ne[0] = in) and for a loadable type. */
static int find_gguf(zs_model *m, const char *name, int ndim, const int64_t *shape,
                     const zs_st_tensor **out) {
    const char *path = zs_gguf_path(m->gg);
    const zs_gguf_tensor *g = zs_gguf_find_tensor(m->gg, name);
    if (!g) return zs_err(ZS_ENOTFOUND, "%s: tensor '%s' not found", path, name);
    const zs_st_tensor *t = &m->gt[g - zs_gguf_tensor_at(m->gg, 0)];
    if (t->dtype >= ZS_DTYPE_COUNT) {
        const char *tn = zs_gguf_type_name((int)g->type);
        uint32_t be = 0, bb = 0;
        int quant = zs_gguf_type_block((int)g->type, &be, &bb) == 0 && be > 1;
        if (quant)
            return zs_err(ZS_EUNSUPPORTED, "%s: tensor '%s' has type %s: quantized GGUF tensors are "
                          "not supported yet (only F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)", path, name, tn ? tn : "?");
        return zs_err(ZS_EUNSUPPORTED, "%s: tensor '%s' has type %s, which cannot hold weights "
                      "(only F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)", path, name, tn ? tn : "?");
    }
    /* quantized blocks must be whole rows of a matrix (packing reads rows, never single elements; a
     * stacked expert tensor [n_expert, out, in] is rows too) */
    if (zs_dtype_is_quant(t->dtype) &&
        (ndim < 2 || t->ndim != ndim || t->shape[ndim - 1] % zs_dtype_block(t->dtype)))
        return zs_err(ZS_EUNSUPPORTED, "%s: tensor '%s' is %s but is not a matrix with rows of a multiple of %d "
                      "(only matrices can be quantized)", path, name, zs_dtype_name(t->dtype), zs_dtype_block(t->dtype));
    int ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = t->shape[i] == shape[i];
    if (!ok) {
        char have[96] = "", want[96] = "";
        for (int i = 0; i < g->n_dims; i++)
            snprintf(have + strlen(have), sizeof have - strlen(have), "%s%lld", i ? ", " : "",
                     (long long)g->ne[i]);
        for (int i = 0; i < ndim; i++)
            snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", i ? ", " : "",
                     (long long)shape[ndim - 1 - i]);
        return zs_err(ZS_ESHAPE, "%s: tensor '%s' has ne [%s], expected [%s] (from the "
                      "hyperparameters)", path, name, have, want);
    }
    *out = t;
    return 0;
}

static int find_src(zs_model *m, const char *name, int ndim, int64_t d0, int64_t d1,
                    const zs_st_tensor **out) {
    int64_t shape[2] = {d0, d1};
    if (m->gg) return find_gguf(m, name, ndim, shape, out);
    return zs_st_get(m->st, name, ndim, shape, out);
}

/* GPT-2 checkpoints exist with and without the "transformer." prefix. */
static const char *gpt2_prefix(const zs_model *m) {
    return zs_st_find(m->st, "transformer.wte.weight") || !zs_st_find(m->st, "wte.weight")
               ? "transformer."
               : "";
}

#define GET(b, role, nd, a0, a1, ...)                                                      \
    do {                                                                                   \
        snprintf(nm, sizeof nm, __VA_ARGS__);                                              \
        ZS_CHECK(find_src(m, nm, nd, a0, a1, &S[(b)*ZS_MAX_ROLES + (role)].t));            \
        S[(b)*ZS_MAX_ROLES + (role)].kind = ZS_SRC_COPY;                                      \
    } while (0)

/* The sparse block of MoE layer l by Hugging Face names: the router (Mixtral
 * block_sparse_moe.gate, the others mlp.gate), Qwen2-MoE's shared expert and its gate, and every
 * expert's gate / up / down (Mixtral's w1 / w3 / w2) into its own bucket. */
static int map_moe_hf(zs_model *m, int l) {
    const zs_model_config *c = &m->cfg;
    int64_t d = c->dim, mf = c->moe_ffn_dim, sf = c->shared_ffn_dim;
    int b = zs_bucket_layer(l), mixtral = c->family == ZS_FAM_MIXTRAL;
    const char *p = "model.layers", *blk = mixtral ? "block_sparse_moe" : "mlp";
    char nm[256];
    src_ref *S = m->src;
    GET(b, ZS_R_ROUTER, 2, c->n_experts, d, "%s.%d.%s.gate.weight", p, l, blk);
    if (sf > 0) {
        GET(b, ZS_R_W_GATE, 2, sf, d, "%s.%d.mlp.shared_expert.gate_proj.weight", p, l);
        GET(b, ZS_R_W_UP, 2, sf, d, "%s.%d.mlp.shared_expert.up_proj.weight", p, l);
        GET(b, ZS_R_W_DOWN, 2, d, sf, "%s.%d.mlp.shared_expert.down_proj.weight", p, l);
        GET(b, ZS_R_SHARED_GATE, 2, 1, d, "%s.%d.mlp.shared_expert_gate.weight", p, l);
    }
    for (int e = 0; e < c->n_experts; e++) {
        int eb = zs_bucket_expert(m, l, e);
        if (mixtral) {
            GET(eb, ZS_R_W_GATE, 2, mf, d, "%s.%d.%s.experts.%d.w1.weight", p, l, blk, e);
            GET(eb, ZS_R_W_UP, 2, mf, d, "%s.%d.%s.experts.%d.w3.weight", p, l, blk, e);
            GET(eb, ZS_R_W_DOWN, 2, d, mf, "%s.%d.%s.experts.%d.w2.weight", p, l, blk, e);
        } else {
            GET(eb, ZS_R_W_GATE, 2, mf, d, "%s.%d.mlp.experts.%d.gate_proj.weight", p, l, e);
            GET(eb, ZS_R_W_UP, 2, mf, d, "%s.%d.mlp.experts.%d.up_proj.weight", p, l, e);
            GET(eb, ZS_R_W_DOWN, 2, d, mf, "%s.%d.mlp.experts.%d.down_proj.weight", p, l, e);
        }
    }
    return 0;
}

static int map_llama(zs_model *m) {
    const zs_model_config *c = &m->cfg;
    int64_t d = c->dim, q = (int64_t)c->n_heads * c->head_dim, kvd = (int64_t)c->n_kv_heads * c->head_dim;
    int64_t f = c->ffn_dim;
    char nm[256];
    src_ref *S = m->src;
    int phi3 = c->family == ZS_FAM_PHI3, gemma = c->post_norms;
    GET(0, ZS_R_TOK_EMB, 2, c->vocab_size, d, "model.embed_tokens.weight");
    for (int l = 0; l < c->n_layers; l++) {
        int b = 1 + l;
        const char *p = "model.layers";
        src_ref *R = &S[b * ZS_MAX_ROLES];
        GET(b, ZS_R_ATTN_NORM_W, 1, d, 0, "%s.%d.input_layernorm.weight", p, l);
        if (phi3) { /* fused [q; k; v] and [gate; up] rows, split here */
            GET(b, ZS_R_WQ, 2, q + 2 * kvd, d, "%s.%d.self_attn.qkv_proj.weight", p, l);
            R[ZS_R_WK] = R[ZS_R_WV] = R[ZS_R_WQ];
            R[ZS_R_WQ].kind = R[ZS_R_WK].kind = R[ZS_R_WV].kind = ZS_SRC_ROW_SLICE;
            R[ZS_R_WK].col0 = q;
            R[ZS_R_WV].col0 = q + kvd;
            GET(b, ZS_R_W_GATE, 2, 2 * f, d, "%s.%d.mlp.gate_up_proj.weight", p, l);
            R[ZS_R_W_UP] = R[ZS_R_W_GATE];
            R[ZS_R_W_GATE].kind = R[ZS_R_W_UP].kind = ZS_SRC_ROW_SLICE;
            R[ZS_R_W_UP].col0 = f;
        } else {
            int rc = 0;
            snprintf(nm, sizeof nm, "%s.%d.self_attn.q_proj.weight", p, l);
            if ((rc = find_src(m, nm, 2, q, d, &R[ZS_R_WQ].t)) == ZS_ESHAPE)
                return zs_err_prefix(ZS_ESHAPE, "'num_attention_heads' (%d) x 'head_dim' (%d) = %lld rows do not "
                                     "match q_proj", c->n_heads, c->head_dim, (long long)q);
            ZS_CHECK(rc);
            R[ZS_R_WQ].kind = ZS_SRC_COPY;
            GET(b, ZS_R_WK, 2, kvd, d, "%s.%d.self_attn.k_proj.weight", p, l);
            GET(b, ZS_R_WV, 2, kvd, d, "%s.%d.self_attn.v_proj.weight", p, l);
            if (!zs_config_layer_moe(c, l)) {
                GET(b, ZS_R_W_GATE, 2, f, d, "%s.%d.mlp.gate_proj.weight", p, l);
                GET(b, ZS_R_W_UP, 2, f, d, "%s.%d.mlp.up_proj.weight", p, l);
            }
        }
        GET(b, ZS_R_WO, 2, d, q, "%s.%d.self_attn.o_proj.weight", p, l);
        if (gemma) { /* Gemma: the MLP's input norm is pre_feedforward_layernorm */
            GET(b, ZS_R_FFN_NORM_W, 1, d, 0, "%s.%d.pre_feedforward_layernorm.weight", p, l);
            GET(b, ZS_R_POST_ATTN_NORM, 1, d, 0, "%s.%d.post_attention_layernorm.weight", p, l);
            GET(b, ZS_R_POST_FFN_NORM, 1, d, 0, "%s.%d.post_feedforward_layernorm.weight", p, l);
        } else {
            GET(b, ZS_R_FFN_NORM_W, 1, d, 0, "%s.%d.post_attention_layernorm.weight", p, l);
        }
        if (c->qk_norm || c->qk_norm_full) { /* per head (Qwen3), or over the whole q / k (OLMoE) */
            int64_t nq = c->qk_norm ? c->head_dim : q, nk = c->qk_norm ? c->head_dim : kvd;
            GET(b, ZS_R_Q_NORM, 1, nq, 0, "%s.%d.self_attn.q_norm.weight", p, l);
            GET(b, ZS_R_K_NORM, 1, nk, 0, "%s.%d.self_attn.k_norm.weight", p, l);
        }
        if (zs_config_layer_moe(c, l)) {
            ZS_CHECK(map_moe_hf(m, l));
        } else {
            GET(b, ZS_R_W_DOWN, 2, d, f, "%s.%d.mlp.down_proj.weight", p, l);
            if (c->mlp_bias) {
                GET(b, ZS_R_B_GATE, 1, f, 0, "%s.%d.mlp.gate_proj.bias", p, l);
                GET(b, ZS_R_B_UP, 1, f, 0, "%s.%d.mlp.up_proj.bias", p, l);
                GET(b, ZS_R_B_DOWN, 1, d, 0, "%s.%d.mlp.down_proj.bias", p, l);
            }
        }
        if (c->qkv_bias) {
            GET(b, ZS_R_BQ, 1, q, 0, "%s.%d.self_attn.q_proj.bias", p, l);
            GET(b, ZS_R_BK, 1, kvd, 0, "%s.%d.self_attn.k_proj.bias", p, l);
            GET(b, ZS_R_BV, 1, kvd, 0, "%s.%d.self_attn.v_proj.bias", p, l);
        }
        if (c->o_bias) GET(b, ZS_R_BO, 1, d, 0, "%s.%d.self_attn.o_proj.bias", p, l);
    }
    int h = m->head;
    GET(h, ZS_R_OUT_NORM_W, 1, d, 0, "model.norm.weight");
    if (!c->tied_embeddings) GET(h, ZS_R_LM_HEAD, 2, c->vocab_size, d, "lm_head.weight");
    return 0;
}

static int map_gpt2(zs_model *m) {
    const zs_model_config *c = &m->cfg;
    int64_t d = c->dim, f = c->ffn_dim;
    const char *pre = gpt2_prefix(m);
    char nm[256];
    src_ref *S = m->src;
    GET(0, ZS_R_TOK_EMB, 2, c->vocab_size, d, "%swte.weight", pre);
    GET(0, ZS_R_POS_EMB, 2, c->max_seq, d, "%swpe.weight", pre);
    for (int l = 0; l < c->n_layers; l++) {
        int b = 1 + l;
        src_ref *R = &S[b * ZS_MAX_ROLES];
        GET(b, ZS_R_ATTN_NORM_W, 1, d, 0, "%sh.%d.ln_1.weight", pre, l);
        GET(b, ZS_R_ATTN_NORM_B, 1, d, 0, "%sh.%d.ln_1.bias", pre, l);
        GET(b, ZS_R_FFN_NORM_W, 1, d, 0, "%sh.%d.ln_2.weight", pre, l);
        GET(b, ZS_R_FFN_NORM_B, 1, d, 0, "%sh.%d.ln_2.bias", pre, l);
        /* c_attn: Conv1D [in, 3*d]: q, k, v are column blocks */
        GET(b, ZS_R_WQ, 2, d, 3 * d, "%sh.%d.attn.c_attn.weight", pre, l);
        GET(b, ZS_R_BQ, 1, 3 * d, 0, "%sh.%d.attn.c_attn.bias", pre, l);
        for (int k = 0; k < 3; k++) {
            R[ZS_R_WQ + k] = (src_ref){.t = R[ZS_R_WQ].t, .kind = ZS_SRC_TRANSPOSE_COLS, .col0 = k * d};
            R[ZS_R_BQ + k] = (src_ref){.t = R[ZS_R_BQ].t, .kind = ZS_SRC_VEC_SLICE, .col0 = k * d};
        }
        GET(b, ZS_R_WO, 2, d, d, "%sh.%d.attn.c_proj.weight", pre, l);
        R[ZS_R_WO].kind = ZS_SRC_TRANSPOSE_COLS;
        GET(b, ZS_R_BO, 1, d, 0, "%sh.%d.attn.c_proj.bias", pre, l);
        GET(b, ZS_R_W_UP, 2, d, f, "%sh.%d.mlp.c_fc.weight", pre, l);
        R[ZS_R_W_UP].kind = ZS_SRC_TRANSPOSE_COLS;
        GET(b, ZS_R_B_UP, 1, f, 0, "%sh.%d.mlp.c_fc.bias", pre, l);
        GET(b, ZS_R_W_DOWN, 2, f, d, "%sh.%d.mlp.c_proj.weight", pre, l);
        R[ZS_R_W_DOWN].kind = ZS_SRC_TRANSPOSE_COLS;
        GET(b, ZS_R_B_DOWN, 1, d, 0, "%sh.%d.mlp.c_proj.bias", pre, l);
    }
    int h = m->head;
    GET(h, ZS_R_OUT_NORM_W, 1, d, 0, "%sln_f.weight", pre);
    GET(h, ZS_R_OUT_NORM_B, 1, d, 0, "%sln_f.bias", pre);
    if (!c->tied_embeddings) GET(h, ZS_R_LM_HEAD, 2, c->vocab_size, d, "lm_head.weight");
    return 0;
}

/* The sparse block of MoE layer l by llama.cpp's names: the router ffn_gate_inp, the experts' stacked
 * ffn_{gate,up,down}_exps (ne [in, out, n_expert], i.e. [n_expert, out, in]: expert e is rows
 * [e*out, (e+1)*out) of it viewed as [n_expert*out, in]; the files of one tensor per expert that
 * llama.cpp no longer loads are not read either), and qwen2moe's shared expert ffn_{gate,up,down}_shexp with
 * its gate ffn_gate_inp_shexp (a [dim] vector; [1, dim] also taken). */
static int map_moe_gguf(zs_model *m, int l) {
    const zs_model_config *c = &m->cfg;
    int64_t d = c->dim, mf = c->moe_ffn_dim, sf = c->shared_ffn_dim, ne = c->n_experts;
    int b = zs_bucket_layer(l);
    char nm[256];
    src_ref *S = m->src;
    GET(b, ZS_R_ROUTER, 2, ne, d, "blk.%d.ffn_gate_inp.weight", l);
    if (sf > 0) {
        GET(b, ZS_R_W_GATE, 2, sf, d, "blk.%d.ffn_gate_shexp.weight", l);
        GET(b, ZS_R_W_UP, 2, sf, d, "blk.%d.ffn_up_shexp.weight", l);
        GET(b, ZS_R_W_DOWN, 2, d, sf, "blk.%d.ffn_down_shexp.weight", l);
        snprintf(nm, sizeof nm, "blk.%d.ffn_gate_inp_shexp.weight", l);
        const zs_gguf_tensor *g = zs_gguf_find_tensor(m->gg, nm);
        if (g && g->n_dims == 2) GET(b, ZS_R_SHARED_GATE, 2, 1, d, "blk.%d.ffn_gate_inp_shexp.weight", l);
        else GET(b, ZS_R_SHARED_GATE, 1, d, 0, "blk.%d.ffn_gate_inp_shexp.weight", l);
    }
    static const char *const part[3] = {"gate", "up", "down"};
    static const int role[3] = {ZS_R_W_GATE, ZS_R_W_UP, ZS_R_W_DOWN};
    for (int k = 0; k < 3; k++) {
        int64_t out = k == 2 ? d : mf, in = k == 2 ? mf : d;
        snprintf(nm, sizeof nm, "blk.%d.ffn_%s_exps.weight", l, part[k]);
        const zs_st_tensor *t;
        int64_t shape[3] = {ne, out, in};
        ZS_CHECK(find_gguf(m, nm, 3, shape, &t));
        for (int e = 0; e < ne; e++)
            S[zs_bucket_expert(m, l, e) * ZS_MAX_ROLES + role[k]] =
                (src_ref){.t = t, .kind = ZS_SRC_ROW_SLICE, .col0 = e * out};
    }
    return 0;
}

/* llama.cpp's names (llama, qwen2, qwen3, gemma2, gemma3, phi3, gpt2; the mixtures llama with experts
 * (Mixtral), qwen2moe, qwen3moe, olmoe). A GGUF [ne0 = in, ne1 = out]
 * matrix is laid out as our [out, in], so every weight is a copy, except: llama's Q and K rows (and
 * biases) are per head in the interleaved RoPE order (convert_hf_to_gguf.py permutes them; the other
 * architectures are stored in rotate_half order), gpt2's q, k, v are row blocks of one fused
 * attn_qkv, and phi3's q, k, v rows of attn_qkv and gate, up rows of ffn_up (llama.cpp keeps
 * Phi-3's fused tensors). Gemma's norms hold 1 + w (config: norm_offset 0). */
static int map_gguf(zs_model *m) {
    const zs_model_config *c = &m->cfg;
    int64_t d = c->dim, q = (int64_t)c->n_heads * c->head_dim, kvd = (int64_t)c->n_kv_heads * c->head_dim;
    int64_t f = c->ffn_dim;
    int gpt2 = c->arch == ZS_ARCH_GPT2, phi3 = c->family == ZS_FAM_PHI3;
    int perm = !gpt2 && (c->family == ZS_FAM_LLAMA || c->family == ZS_FAM_MIXTRAL); /* llama.cpp's `llama` */
    char nm[256];
    src_ref *S = m->src;
    GET(0, ZS_R_TOK_EMB, 2, c->vocab_size, d, "token_embd.weight");
    if (gpt2) GET(0, ZS_R_POS_EMB, 2, c->max_seq, d, "position_embd.weight");
    for (int l = 0; l < c->n_layers; l++) {
        int b = 1 + l;
        src_ref *R = &S[b * ZS_MAX_ROLES];
        GET(b, ZS_R_ATTN_NORM_W, 1, d, 0, "blk.%d.attn_norm.weight", l);
        GET(b, ZS_R_FFN_NORM_W, 1, d, 0, "blk.%d.ffn_norm.weight", l);
        GET(b, ZS_R_WO, 2, d, q, "blk.%d.attn_output.weight", l);
        int moe = zs_config_layer_moe(c, l);
        if (moe) ZS_CHECK(map_moe_gguf(m, l));
        else GET(b, ZS_R_W_DOWN, 2, d, f, "blk.%d.ffn_down.weight", l);
        if (gpt2) {
            GET(b, ZS_R_W_UP, 2, f, d, "blk.%d.ffn_up.weight", l);
            GET(b, ZS_R_ATTN_NORM_B, 1, d, 0, "blk.%d.attn_norm.bias", l);
            GET(b, ZS_R_FFN_NORM_B, 1, d, 0, "blk.%d.ffn_norm.bias", l);
            GET(b, ZS_R_WQ, 2, 3 * d, d, "blk.%d.attn_qkv.weight", l);
            GET(b, ZS_R_BQ, 1, 3 * d, 0, "blk.%d.attn_qkv.bias", l);
            for (int k = 0; k < 3; k++) {
                R[ZS_R_WQ + k] = (src_ref){.t = R[ZS_R_WQ].t, .kind = ZS_SRC_COPY, .elem0 = k * d * d};
                R[ZS_R_BQ + k] = (src_ref){.t = R[ZS_R_BQ].t, .kind = ZS_SRC_VEC_SLICE, .col0 = k * d};
            }
            GET(b, ZS_R_BO, 1, d, 0, "blk.%d.attn_output.bias", l);
            GET(b, ZS_R_B_UP, 1, f, 0, "blk.%d.ffn_up.bias", l);
            GET(b, ZS_R_B_DOWN, 1, d, 0, "blk.%d.ffn_down.bias", l);
            continue;
        }
        snprintf(nm, sizeof nm, "blk.%d.attn_qkv.weight", l);
        if (phi3 && zs_gguf_find_tensor(m->gg, nm)) { /* [q; k; v] rows (llama.cpp also takes them apart) */
            GET(b, ZS_R_WQ, 2, q + 2 * kvd, d, "blk.%d.attn_qkv.weight", l);
            R[ZS_R_WK] = R[ZS_R_WV] = R[ZS_R_WQ];
            R[ZS_R_WQ].kind = R[ZS_R_WK].kind = R[ZS_R_WV].kind = ZS_SRC_ROW_SLICE;
            R[ZS_R_WK].col0 = q;
            R[ZS_R_WV].col0 = q + kvd;
        } else {
            GET(b, ZS_R_WQ, 2, q, d, "blk.%d.attn_q.weight", l);
            GET(b, ZS_R_WK, 2, kvd, d, "blk.%d.attn_k.weight", l);
            GET(b, ZS_R_WV, 2, kvd, d, "blk.%d.attn_v.weight", l);
        }
        if (phi3 && !moe) { /* ffn_up: [gate; up] rows, no ffn_gate */
            GET(b, ZS_R_W_GATE, 2, 2 * f, d, "blk.%d.ffn_up.weight", l);
            R[ZS_R_W_UP] = R[ZS_R_W_GATE];
            R[ZS_R_W_GATE].kind = R[ZS_R_W_UP].kind = ZS_SRC_ROW_SLICE;
            R[ZS_R_W_UP].col0 = f;
        } else if (!moe) { /* (a MoE layer's sparse block: map_moe_gguf above) */
            GET(b, ZS_R_W_GATE, 2, f, d, "blk.%d.ffn_gate.weight", l);
            GET(b, ZS_R_W_UP, 2, f, d, "blk.%d.ffn_up.weight", l);
        }
        if (c->qk_norm) {
            GET(b, ZS_R_Q_NORM, 1, c->head_dim, 0, "blk.%d.attn_q_norm.weight", l);
            GET(b, ZS_R_K_NORM, 1, c->head_dim, 0, "blk.%d.attn_k_norm.weight", l);
        } else if (c->qk_norm_full) { /* olmoe */
            GET(b, ZS_R_Q_NORM, 1, q, 0, "blk.%d.attn_q_norm.weight", l);
            GET(b, ZS_R_K_NORM, 1, kvd, 0, "blk.%d.attn_k_norm.weight", l);
        }
        if (c->post_norms) {
            GET(b, ZS_R_POST_ATTN_NORM, 1, d, 0, "blk.%d.post_attention_norm.weight", l);
            GET(b, ZS_R_POST_FFN_NORM, 1, d, 0, "blk.%d.post_ffw_norm.weight", l);
        }
        if (c->qkv_bias) {
            GET(b, ZS_R_BQ, 1, q, 0, "blk.%d.attn_q.bias", l);
            GET(b, ZS_R_BK, 1, kvd, 0, "blk.%d.attn_k.bias", l);
            GET(b, ZS_R_BV, 1, kvd, 0, "blk.%d.attn_v.bias", l);
        }
        if (c->o_bias) GET(b, ZS_R_BO, 1, d, 0, "blk.%d.attn_output.bias", l);
        if (perm) {
            R[ZS_R_WQ].rope_heads = R[ZS_R_BQ].rope_heads = c->n_heads;
            R[ZS_R_WK].rope_heads = R[ZS_R_BK].rope_heads = c->n_kv_heads;
        }
    }
    int h = m->head;
    GET(h, ZS_R_OUT_NORM_W, 1, d, 0, "output_norm.weight");
    if (gpt2) GET(h, ZS_R_OUT_NORM_B, 1, d, 0, "output_norm.bias");
    if (!c->tied_embeddings) GET(h, ZS_R_LM_HEAD, 2, c->vocab_size, d, "output.weight");
#undef GET
    return 0;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* Opens the GGUF file: its tensors as zs_st_tensor views, its configuration, and whether an
 * output.weight equal to token_embd.weight byte for byte is really a tied head. */
static int open_gguf(zs_model *m, const char *path) {
    ZS_CHECK(zs_gguf_open(path, &m->gg));
    size_t nt = zs_gguf_tensor_count(m->gg);
    m->gt = calloc(nt ? nt : 1, sizeof *m->gt);
    if (!m->gt) return zs_err(ZS_ENOMEM, "out of memory");
    for (size_t i = 0; i < nt; i++) {
        const zs_gguf_tensor *g = zs_gguf_tensor_at(m->gg, i);
        zs_st_tensor *t = &m->gt[i];
        t->name = g->name;
        t->dtype = g->type == ZS_GGML_F32 ? ZS_F32 : g->type == ZS_GGML_F16 ? ZS_F16
                 : g->type == ZS_GGML_BF16 ? ZS_BF16 : g->type == ZS_GGML_Q8_0 ? ZS_Q8_0
                 : g->type == ZS_GGML_Q4_0 ? ZS_Q4_0 : g->type == ZS_GGML_Q4_1 ? ZS_Q4_1
                 : g->type == ZS_GGML_Q5_0 ? ZS_Q5_0 : g->type == ZS_GGML_Q5_1 ? ZS_Q5_1
                 : g->type == ZS_GGML_Q4_K ? ZS_Q4_K : g->type == ZS_GGML_Q6_K ? ZS_Q6_K
                 : g->type == ZS_GGML_Q5_K ? ZS_Q5_K : g->type == ZS_GGML_Q3_K ? ZS_Q3_K
                 : g->type == ZS_GGML_Q2_K ? ZS_Q2_K : ZS_DTYPE_COUNT;
        t->ndim = g->n_dims;
        for (int k = 0; k < g->n_dims; k++) t->shape[k] = g->ne[g->n_dims - 1 - k];
        t->data = g->data;
        t->nbytes = g->nbytes;
        t->file = zs_gguf_path(m->gg);
    }
    ZS_CHECK(zs_config_from_gguf(m->gg, &m->cfg));
    const zs_gguf_tensor *e = zs_gguf_find_tensor(m->gg, "token_embd.weight");
    const zs_gguf_tensor *o = zs_gguf_find_tensor(m->gg, "output.weight");
    if (e && o && e->type == o->type && e->nbytes == o->nbytes && e->n_dims == o->n_dims &&
        !memcmp(e->ne, o->ne, sizeof e->ne) && !memcmp(e->data, o->data, e->nbytes))
        m->cfg.tied_embeddings = 1;
    /* fingerprint: file name, size, mtime and the header bytes (metadata and tensor infos) */
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        if (fd >= 0) close(fd);
        return zs_err(ZS_EIO, "%s: cannot stat: %s", path, strerror(errno));
    }
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    uint64_t h = fnv(1469598103934665603ull, "gguf", 4);
    h = fnv(h, base, strlen(base) + 1);
    int64_t v[3] = {(int64_t)st.st_size, (int64_t)st.st_mtim.tv_sec, (int64_t)st.st_mtim.tv_nsec};
    h = fnv(h, v, sizeof v);
    size_t hl = zs_gguf_data_offset(m->gg);
    char *buf = malloc(65536);
    int rc = buf ? 0 : zs_err(ZS_ENOMEM, "out of memory");
    for (size_t off = 0; rc == 0 && off < hl;) {
        ssize_t r = pread(fd, buf, ZS_MIN((size_t)65536, hl - off), (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) rc = zs_err(ZS_EIO, "%s: cannot read the header: %s", path, r < 0 ? strerror(errno) : "short file");
        else h = fnv(h, buf, (size_t)r), off += (size_t)r;
    }
    free(buf);
    close(fd);
    snprintf(m->gfp, sizeof m->gfp, "%016" PRIx64, h);
    return rc;
}

/* Bucket ids: embed, the L layers, the head, then the experts of each MoE layer in layer order (checks
 * the expert counts the forward pass relies on). */
static int bucket_numbering(zs_model *m) {
    const zs_model_config *c = &m->cfg;
    int L = c->n_layers, n_moe = 0;
    m->head = L + 1;
    m->moe_base = malloc((size_t)(L > 0 ? L : 1) * sizeof *m->moe_base);
    m->exp_layer = malloc((size_t)(L > 0 ? L : 1) * sizeof *m->exp_layer);
    if (!m->moe_base || !m->exp_layer) return zs_err(ZS_ENOMEM, "out of memory");
    for (int l = 0; l < L; l++) n_moe += zs_config_layer_moe(c, l);
    if (n_moe > 0) {
        if (c->arch != ZS_ARCH_LLAMA || c->n_experts > ZS_MAX_EXPERTS || c->n_experts_used < 1 ||
            c->n_experts_used > c->n_experts || c->moe_ffn_dim < 1 || c->shared_ffn_dim < 0)
            return zs_err(ZS_EUNSUPPORTED, "%s: a mixture of %d experts with %d per token and expert size %d (the "
                          "engine takes 1..%d experts, 1..n_experts per token, of a llama-family block)", m->dir,
                          c->n_experts, c->n_experts_used, c->moe_ffn_dim, ZS_MAX_EXPERTS);
        if ((int64_t)n_moe * c->n_experts > INT32_MAX / 2 - L)
            return zs_err(ZS_EUNSUPPORTED, "%s: %d MoE layers of %d experts are too many buckets", m->dir, n_moe,
                          c->n_experts);
    }
    int next = L + 2, k = 0;
    for (int l = 0; l < L; l++) {
        m->moe_base[l] = -1;
        if (!zs_config_layer_moe(c, l)) continue;
        m->moe_base[l] = next;
        m->exp_layer[k++] = l;
        next += c->n_experts;
    }
    m->n_buckets = next;
    return 0;
}

int zs_model_open(const char *dir, const zs_model_opts *o, zs_model **out) {
    zs_model *m = calloc(1, sizeof *m);
    if (!m) return zs_err(ZS_ENOMEM, "out of memory");
    int rc;
    m->dir = strdup(dir);
    if (o) m->opts = *o;
    else zs_model_opts_default(&m->opts);
    m->opts.embed_lookup = !!m->opts.embed_lookup;
    if (!m->dir) { rc = zs_err(ZS_ENOMEM, "out of memory"); goto fail; }
    if (m->opts.quant_mix != ZS_QUANT_MIX_NONE &&
        (m->opts.quant_mix != ZS_QUANT_MIX_Q4_K_M || m->opts.weight_dtype != ZS_Q4_K)) {
        rc = zs_err(ZS_EINVAL, "%s: quantization mix %d with weight dtype %s: the only mix is Q4_K_M (%d), with "
                    "weight dtype Q4_K", dir, m->opts.quant_mix, zs_dtype_name(m->opts.weight_dtype), ZS_QUANT_MIX_Q4_K_M);
        goto fail;
    }
    struct stat sb;
    if (stat(dir, &sb) == 0 && S_ISREG(sb.st_mode)) { /* a file: GGUF */
        if ((rc = open_gguf(m, dir)) < 0) goto fail;
        if (m->opts.weight_dtype >= ZS_DTYPE_COUNT) m->opts.weight_dtype = m->cfg.dtype;
    } else {
        if ((rc = zs_config_load(dir, &m->cfg)) < 0) goto fail;
        if (m->opts.weight_dtype >= ZS_DTYPE_COUNT) m->opts.weight_dtype = m->cfg.dtype;
        if ((rc = zs_st_open_dir(dir, &m->st)) < 0) goto fail;
    }
    if ((rc = bucket_numbering(m)) < 0) goto fail;
    m->layout = calloc((size_t)m->n_buckets, sizeof *m->layout);
    m->glayout = calloc((size_t)m->n_buckets, sizeof *m->glayout);
    m->src = calloc((size_t)m->n_buckets * ZS_MAX_ROLES, sizeof *m->src);
    if (!m->layout || !m->glayout || !m->src) { rc = zs_err(ZS_ENOMEM, "out of memory"); goto fail; }
    build_layouts(m);
    rc = m->gg ? map_gguf(m) : m->cfg.arch == ZS_ARCH_GPT2 ? map_gpt2(m) : map_llama(m);
    if (rc < 0) goto fail;
    for (int i = 0; i < m->n_buckets * ZS_MAX_ROLES; i++) {
        src_ref *r = &m->src[i];
        if (!r->t) continue;
        snprintf(r->name, sizeof r->name, "%s", r->t->name);
        r->ndim = r->t->ndim;
        r->shape[0] = r->t->ndim > 0 ? r->t->shape[0] : 1;
        r->shape[1] = r->t->ndim > 1 ? r->t->shape[1] : 1;
    }
    /* When the checkpoint's dtype is not the one config.json says, store as the checkpoint has it
     * (and with block formats, each matrix in its own: matrix_dtype). A MoE model is laid out again
     * in any case: its routers keep their sources' dtype (router_dtype). */
    int relayout = m->n_buckets > m->head + 1;
    if (!o || o->weight_dtype >= ZS_DTYPE_COUNT) {
        zs_dtype st_dt = m->src[ZS_R_TOK_EMB].t->dtype;
        int any_quant = 0;
        for (int i = 0; i < m->n_buckets * ZS_MAX_ROLES; i++)
            any_quant |= m->src[i].t && zs_dtype_is_quant(m->src[i].t->dtype);
        if (st_dt != m->opts.weight_dtype || any_quant) {
            m->opts.weight_dtype = st_dt;
            m->as_stored = any_quant;
            relayout = 1;
        }
    }
    if (relayout) {
        memset(m->layout, 0, (size_t)m->n_buckets * sizeof *m->layout);
        memset(m->glayout, 0, (size_t)m->n_buckets * sizeof *m->glayout);
        m->n_params = 0;
        build_layouts(m);
    }
    char fp[64];
    if (m->gg) snprintf(fp, sizeof fp, "gguf-%s", m->gfp);
    else if ((rc = zs_st_fingerprint(m->st, fp, sizeof fp)) < 0) goto fail;
    /* everything that changes what a shard holds: the dtype, the resident split, and whether the
     * lookup tables are host-resident (e1: inference layout, e0: training layout) */
    snprintf(m->fingerprint, sizeof m->fingerprint, "%s-%s-p%lld-e%d-v2%s", fp,
             m->opts.quant_mix ? "Q4_K_M" : zs_dtype_name(m->opts.weight_dtype), (long long)m->opts.persist_threshold,
             m->opts.embed_lookup, m->n_buckets > m->head + 1 ? "-x1" : ""); /* x1: one bucket per expert */
    *out = m;
    return 0;
fail:
    zs_model_free(m);
    return rc;
}

/* ---- packing ---- */

static int pack_one(const zs_slot *s, const src_ref *r, void *dst) {
    const zs_st_tensor *t = r->t;
    /* byte offsets of element counts that are whole rows (or whole blocks): block-aware */
#define esz_src_at(n) zs_dtype_bytes(t->dtype, (size_t)(n))
#define esz_dst_at(n) zs_dtype_bytes(s->dtype, (size_t)(n))
    if (r->kind == ZS_SRC_COPY && r->rope_heads > 0) {
        /* interleaved RoPE rows (pairs 2i, 2i+1) -> rotate_half rows (pairs i, i + hd/2): per
         * head, row j*hd/2 + i of ours is row 2i + j of the source */
        int64_t rows = s->shape[0], cols = s->shape[1], hd = rows / r->rope_heads, half = hd / 2;
        for (int64_t o = 0; o < rows; o++) {
            int64_t hb = o - o % hd, k = o % hd, src = hb + 2 * (k % half) + k / half;
            zs_convert((char *)dst + esz_dst_at(o * cols), s->dtype,
                       (const char *)t->data + esz_src_at(src * cols), t->dtype, (size_t)cols);
        }
    } else if (r->kind == ZS_SRC_COPY) {
        zs_convert(dst, s->dtype, (const char *)t->data + esz_src_at(r->elem0), t->dtype,
                   (size_t)(s->shape[0] * s->shape[1]));
    } else if (r->kind == ZS_SRC_VEC_SLICE) {
        zs_convert(dst, s->dtype, (const char *)t->data + esz_src_at(r->col0), t->dtype,
                   (size_t)s->shape[0]);
    } else if (r->kind == ZS_SRC_ROW_SLICE) { /* rows [col0, col0 + out) of an [rows, in] tensor */
        zs_convert(dst, s->dtype, (const char *)t->data + esz_src_at(r->col0 * s->shape[1]), t->dtype,
                   (size_t)(s->shape[0] * s->shape[1]));
    } else { /* transpose columns [col0, col0+out) of a [in, cols] source into [out, in] */
        int64_t out_rows = s->shape[0], in = s->shape[1], cols = t->shape[1];
        float *row = malloc((size_t)in * sizeof(float));
        if (!row) return zs_err(ZS_ENOMEM, "out of memory packing %s", t->name);
        for (int64_t o = 0; o < out_rows; o++) {
            for (int64_t i = 0; i < in; i++)
                zs_to_f32(&row[i], (const char *)t->data + esz_src_at(i * cols + r->col0 + o),
                          t->dtype, 1);
            zs_convert((char *)dst + esz_dst_at(o * in), s->dtype, row, ZS_F32, (size_t)in);
        }
        free(row);
    }
#undef esz_src_at
#undef esz_dst_at
    return 0;
}

/* Drops the pages of a converted source tensor (see zs_st_release). */
static void release_src(const zs_model *m, const zs_st_tensor *t) {
    if (m->st) {
        zs_st_release(m->st, t);
        return;
    }
    if (!t || !t->nbytes) return;
    long pg = sysconf(_SC_PAGESIZE);
    uintptr_t mask = (uintptr_t)(pg > 0 ? pg : 4096) - 1, p = (uintptr_t)t->data;
    uintptr_t a = p & ~mask, e = p + t->nbytes;
    madvise((void *)a, e - a, MADV_DONTNEED); /* private read-only file pages: re-read on access */
}

int zs_model_pack_bucket(const zs_model *m, int b, void *dst, void *rdst) {
    if (!m->st && !m->gg) return zs_err(ZS_EINVAL, "%s: checkpoint already closed", m->dir);
    const zs_bucket_layout *L = &m->layout[b];
    if (dst) memset(dst, 0, L->data_bytes);
    if (rdst) memset(rdst, 0, L->resident_bytes);
    for (int r = 0; r < L->n_roles; r++) {
        const zs_slot *s = &L->slot[r];
        if (!s->present) continue;
        void *base = s->resident ? rdst : dst;
        if (!base) continue;
        const src_ref *src = &m->src[b * ZS_MAX_ROLES + r];
        ZS_CHECK(pack_one(s, src, (char *)base + s->offset));
    }
    /* all of this bucket's source tensors are converted: let the kernel drop their pages */
    for (int r = 0; r < L->n_roles; r++)
        if (L->slot[r].present && (dst || rdst)) release_src(m, m->src[b * ZS_MAX_ROLES + r].t);
    return 0;
}

int zs_model_load_resident_parts(zs_model *m) {
    if (!m->res) {
        m->res = calloc((size_t)m->n_buckets, sizeof(void *));
        if (!m->res) return zs_err(ZS_ENOMEM, "out of memory");
    }
    /* the host copy of a sharded token table (tied head) for the lookup, packed as the bucket
     * packs the slot: same dtype, same conversion */
    const zs_slot *ts = &m->layout[zs_bucket_embed()].slot[ZS_R_TOK_EMB];
    if (m->opts.embed_lookup && !ts->resident && !m->tok_lookup) {
        if (!m->st && !m->gg) return zs_err(ZS_EINVAL, "%s: checkpoint already closed", m->dir);
        m->tok_lookup = zs_aligned_alloc(64, ts->nbytes);
        if (!m->tok_lookup)
            return zs_err(ZS_ENOMEM, "out of memory for the embedding lookup table (%zu bytes)", ts->nbytes);
        int rc = pack_one(ts, &m->src[ZS_R_TOK_EMB], m->tok_lookup);
        if (rc < 0) {
            free(m->tok_lookup);
            m->tok_lookup = NULL;
            return rc;
        }
    }
    for (int b = 0; b < m->n_buckets; b++) {
        if (m->res[b]) continue;
        m->res[b] = zs_aligned_alloc(64, m->layout[b].resident_bytes);
        if (!m->res[b]) return zs_err(ZS_ENOMEM, "out of memory for resident parameters");
        ZS_CHECK(zs_model_pack_bucket(m, b, NULL, m->res[b]));
    }
    return 0;
}

int zs_model_embed_lookup(const zs_model *m) { return m->opts.embed_lookup; }

const void *zs_model_embed_table(const zs_model *m, int role) {
    if (!m->opts.embed_lookup || (role != ZS_R_TOK_EMB && role != ZS_R_POS_EMB)) return NULL;
    const zs_slot *s = &m->layout[zs_bucket_embed()].slot[role];
    if (!s->present) return NULL;
    if (!s->resident) return m->tok_lookup;
    return m->res && m->res[zs_bucket_embed()] ? (const char *)m->res[zs_bucket_embed()] + s->offset : NULL;
}

size_t zs_model_embed_table_bytes(const zs_model *m) {
    if (!m->opts.embed_lookup) return 0;
    const zs_bucket_layout *E = &m->layout[zs_bucket_embed()];
    size_t n = 0;
    for (int r = 0; r < E->n_roles; r++)
        if (E->slot[r].present) n += E->slot[r].nbytes; /* resident, or copied when sharded */
    return n;
}

int zs_model_load_resident(zs_model *m) {
    ZS_CHECK(zs_model_load_resident_parts(m));
    if (!m->data) {
        m->data = calloc((size_t)m->n_buckets, sizeof(void *));
        if (!m->data) return zs_err(ZS_ENOMEM, "out of memory");
    }
    for (int b = 0; b < m->n_buckets; b++) {
        if (m->data[b]) continue;
        m->data[b] = zs_aligned_alloc(4096, m->layout[b].data_bytes);
        if (!m->data[b])
            return zs_err(ZS_ENOMEM, "out of memory for bucket %d (%zu bytes)", b, m->layout[b].data_bytes);
        ZS_CHECK(zs_model_pack_bucket(m, b, m->data[b], NULL));
    }
    return 0;
}

void zs_model_close_checkpoint(zs_model *m) {
    if (m->st) zs_st_close(m->st);
    m->st = NULL;
    zs_gguf_close(m->gg);
    m->gg = NULL;
    free(m->gt);
    m->gt = NULL;
}

void zs_model_free(zs_model *m) {
    if (!m) return;
    zs_model_close_checkpoint(m);
    for (int b = 0; m->data && b < m->n_buckets; b++) free(m->data[b]);
    for (int b = 0; m->res && b < m->n_buckets; b++) free(m->res[b]);
    free(m->data);
    free(m->res);
    free(m->tok_lookup);
    free(m->layout);
    free(m->glayout);
    free(m->moe_base);
    free(m->exp_layer);
    free(m->src);
    free(m->dir);
    free(m);
}

static int resident_acquire(void *ctx, int b, const void **data) {
    zs_model *m = ctx;
    if (!m->data || !m->data[b]) return zs_err(ZS_EINVAL, "bucket %d is not loaded", b);
    *data = m->data[b];
    return 0;
}
static void resident_release(void *ctx, int b) { (void)ctx; (void)b; }

zs_weight_source zs_model_resident_source(zs_model *m) {
    return (zs_weight_source){resident_acquire, resident_release, m, NULL}; /* experts: agreed = mask */
}

/* Without embed_lookup: embed, layers (each MoE layer followed by its ZS_PASS_EXPERTS mark), head
 * (+ embed for a tied head). With it the lookup reads
 * the host tables, so bucket 0 is acquired only by a tied head, once, after the head bucket: an
 * untied pass is layers, head; a tied one layers, head, embed. (Holding a tied bucket 0 from the
 * lookup to the head instead would keep the largest bucket live through the whole pass, beyond a
 * --max-live-bytes of a few layers.) */
int zs_model_pass_order(const zs_model *m, int *order) {
    int n = 0;
    if (!m->opts.embed_lookup) order[n++] = zs_bucket_embed();
    for (int l = 0; l < m->cfg.n_layers; l++) {
        order[n++] = zs_bucket_layer(l);
        if (m->moe_base[l] >= 0) order[n++] = ZS_PASS_EXPERTS(l); /* the experts, chosen by routing */
    }
    order[n++] = m->head;
    if (m->cfg.tied_embeddings) order[n++] = zs_bucket_embed();
    return n;
}

int zs_model_pass_order_max(const zs_model *m) {
    int n = 1 + m->cfg.n_layers + 1 + 1; /* embed, layers, head, tied embed */
    for (int l = 0; l < m->cfg.n_layers; l++) n += m->moe_base[l] >= 0;
    return n;
}

int zs_model_slot_source(const zs_model *m, int b, int role, zs_slot_source *out) {
    const src_ref *r = &m->src[b * ZS_MAX_ROLES + role];
    if (!zs_model_layout(m, b)->slot[role].present || !r->name[0]) return ZS_ENOTFOUND;
    if (r->rope_heads || r->elem0 || m->gfp[0])
        return zs_err(ZS_EUNSUPPORTED, "%s: exporting a model loaded from GGUF as Hugging Face tensors "
                      "is not supported", m->dir);
    out->name = r->name;
    out->kind = r->kind;
    out->col0 = r->col0;
    out->ndim = r->ndim;
    out->shape[0] = r->shape[0];
    out->shape[1] = r->shape[1];
    return 0;
}
