/* forward-cuda.c — the forward pass on a CUDA device: the same computation as forward.c
 * (embeddings, per layer norm -> q/k/v -> RoPE -> paged KV cache -> causal attention -> output
 * projection -> residual -> norm -> MLP -> residual, then final norm and LM head; Llama family
 * with the pieces of Qwen3, Gemma 2/3, Phi-3 and Mistral, and GPT-2), with weights handed out as
 * device pointers by the weight source, activations and the KV cache in device memory, matrix
 * products in cuBLAS (tensor cores for f16/bf16 weights, fp32 accumulation) or, for block-format
 * weights (Q8_0 .. Q2_K, as stored), zs_dev_gemm's fused kernel (decode) and bf16 cuBLAS path
 * (prefill), and every other op a kernel of kernels/cuda. A batch with a LoRA adapter on any row
 * (zs_batch.lora) is refused with ZS_EUNSUPPORTED: adapters run on the CPU forward only, so far; so
 * is the hidden-state output (zs_batch.hidden: embeddings run on the CPU device for now).
 * Everything is queued on the rank's compute queue; a run ends by copying the logits rows to the
 * host and waiting for the queue (the step inputs and logits are then free for the next run).
 *
 * Activations: the residual stream, q/k/v and matrix outputs are f32, the KV cache is the host
 * cache's element type (zs_kv_dtype: f32, or f16 / bf16 rounded to nearest even); the inputs
 * of a matrix product (normed rows, attention output, MLP activation) are stored in the weight
 * dtype, as cuBLAS wants both operands in one type; in f32 in a layer (or head) with a matrix in a
 * block format, whose products take f32 inputs (a matrix of an element type in such a layer, e.g.
 * one kept in f16 because its rows are not whole blocks, gets its input converted into xc).
 * RoPE reads frequency tables made on the host with the CPU's formulas (engine/model/rope.h): one
 * per layer kind made once (global layers; Gemma 3's local ones), or, for the position-dependent
 * scalings (dynamic NTK, LongRoPE), one row per token made per run and sent with the step inputs;
 * cos and sin times the scaling's attention factor. Attention is zs_cuda_attention_ex (tiled for
 * prefill, simple for decode; ZS_CUDA_ATTN=simple|tiled forces one) with the family's score scale
 * (query_pre_attn_scalar), soft-cap and the layer's sliding window.
 * The family pieces, as forward.c: RMSNorm weight offset (Gemma), per-head q/k RMSNorm (Qwen3,
 * Gemma 3), post-attention / post-MLP norms (Gemma), the embedding scale, GeGLU (act 1 in a
 * gated MLP), the final logit soft-cap.
 * A failure of the gather's device hooks (gather-cuda.h) fails the step like a failed acquire.
 * Token trees (zs_batch.tree, model.h): K and V go to each token's slot, the attention takes the
 * tree mask (zs_cuda_attention_tree: a node sees the positions before its root and its own path, in
 * the order of positions; the tree's sequences then take the simple kernel), and the KV moves are copied
 * on the device in every layer before its writes (zs_cuda_kv_copy, zs_kv_copy's bits).
 *
 * Embeddings of an inference model (embed_lookup, model.h): the lookup tables stay in host
 * memory (never uploaded whole); each run copies the T rows of its tokens (and positions) into
 * the pinned step-input buffer, they go to the device with the step inputs in one copy, and the
 * embedding kernel reads them with indices 0..T-1. A tied head still gets the whole table from
 * the gathered embedding bucket, once per pass, after the head bucket. */
#include <math.h>
#include <string.h>

#include "common.h"
#include "device-impl.h"
#include "gather-cuda.h"
#include "kernels/cuda/kernels.h"
#include "rope.h"

struct zs_forward_cuda {
    const zs_model *m;
    zs_dev *dev;
    int max_tokens, n_layers, d, qd, kvd, ff, vocab, n_blocks;
    zs_dtype kv_dtype;   /* the K/V pools' elements (the host cache's zs_kv_dtype) */
    float *x, *q, *k, *v, *h1, *h2, *y, *logits;
    void *xn, *att, *act;
    void *xc;            /* a matrix input converted to that matrix's dtype (layers whose matrices
                            are not all of the activations' dtype); NULL when no layer needs it */
    void **res;          /* device copies of the buckets' resident parts (not bucket 0's with
                            embed_lookup: the lookup tables stay on the host) */
    int lookup;          /* zs_model_embed_lookup */
    size_t tok_row, pos_row; /* bytes of one row of the token / position table (lookup) */
    void **kv;           /* [n_layers] K/V pools, host zs_kvcache layout and dtype */
    float *freq;         /* RoPE frequencies of the position-independent layer kinds, [2][head_dim/2]:
                            [0] global layers, [1] Gemma 3's local ones (rope.h), made on the host
                            once; NULL for GPT-2 */
    float freq_af[2];    /* their attention factors */
    int rope_tok;        /* some layer's frequencies depend on the position: per-token rows */
    size_t freq_row;     /* bytes of a per-token row (rope_tok), else 0 */
    float tok_af;        /* the per-token rows' attention factor (the run's; one for all tokens) */
    /* step inputs: staged in pinned host memory, one copy per run */
    char *in_h, *in_d;
    size_t in_cap;
};

#define DCHK(call, what)                                                                    \
    do {                                                                                    \
        if ((call) != 0) return zs_dev_error(what);                                         \
    } while (0)

/* the matrices of a layer */
static const int LAYER_MATS[] = {ZS_R_WQ, ZS_R_WK, ZS_R_WV, ZS_R_WO, ZS_R_W_GATE, ZS_R_W_UP, ZS_R_W_DOWN};
#define N_LAYER_MATS (sizeof LAYER_MATS / sizeof LAYER_MATS[0])

/* The dtype a layer's matrix inputs are stored in: f32 when one of its matrices is in a block
 * format (those products take f32), else WQ's dtype (cuBLAS: both operands in one type). */
static zs_dtype layer_adt(const zs_bucket_layout *L) {
    for (size_t i = 0; i < N_LAYER_MATS; i++)
        if (L->slot[LAYER_MATS[i]].present && zs_dtype_is_quant(L->slot[LAYER_MATS[i]].dtype)) return ZS_F32;
    return L->slot[ZS_R_WQ].dtype;
}

/* 1 when some layer has a matrix of an element type other than its inputs' (linear converts) */
static int needs_xc(const zs_model *m) {
    for (int l = 0; l < zs_model_config_get(m)->n_layers; l++) {
        const zs_bucket_layout *L = zs_model_layout(m, zs_bucket_layer(l));
        zs_dtype adt = layer_adt(L);
        for (size_t i = 0; i < N_LAYER_MATS; i++) {
            const zs_slot *sl = &L->slot[LAYER_MATS[i]];
            if (sl->present && !zs_dtype_is_quant(sl->dtype) && sl->dtype != adt) return 1;
        }
    }
    return 0;
}

void zs_forward_cuda_free(zs_forward_cuda *f) {
    if (!f) return;
    zs_dev *d = f->dev;
    zs_dev_sync(d);
    float *bufs[] = {f->x, f->q, f->k, f->v, f->h1, f->h2, f->y, f->logits};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) zs_dev_release(d, bufs[i]);
    zs_dev_release(d, f->xn);
    zs_dev_release(d, f->att);
    zs_dev_release(d, f->act);
    zs_dev_release(d, f->xc);
    if (f->res)
        for (int b = 0; b < zs_model_n_buckets(f->m); b++) zs_dev_release(d, f->res[b]);
    if (f->kv)
        for (int l = 0; l < f->n_layers; l++) zs_dev_release(d, f->kv[l]);
    zs_dev_release(d, f->in_d);
    zs_dev_release(d, f->freq);
    if (f->in_h) cudaFreeHost(f->in_h);
    free(f->res);
    free(f->kv);
    free(f);
}

int zs_forward_cuda_new(const zs_model *m, int max_tokens, zs_dev *d, const zs_kvcache *kv,
                        zs_forward_cuda **out) {
    const zs_model_config *c = zs_model_config_get(m);
    if (max_tokens <= 0) return zs_err(ZS_EINVAL, "forward: max_tokens must be positive");
    if (c->head_dim > 256 || c->head_dim % 2)
        return zs_err(ZS_EUNSUPPORTED, "CUDA forward: head_dim %d (at most 256, even)", c->head_dim);
    if (c->n_experts > 0)
        return zs_err(ZS_EUNSUPPORTED, "CUDA forward: %s is a mixture of experts, which runs on the CPU device only "
                      "for now (--device cpu)", c->arch_name);
    ZS_CHECK(zs_dev_set_current(d));
    zs_forward_cuda *f = calloc(1, sizeof *f);
    if (!f) return zs_err(ZS_ENOMEM, "out of memory");
    f->m = m;
    f->dev = d;
    f->max_tokens = max_tokens;
    f->n_layers = c->n_layers;
    f->d = c->dim;
    f->qd = c->n_heads * c->head_dim;
    f->kvd = c->n_kv_heads * c->head_dim;
    f->ff = c->ffn_dim;
    f->vocab = c->vocab_size;
    f->n_blocks = zs_kv_total_blocks(kv);
    f->kv_dtype = zs_kv_dtype(kv);
    size_t n = (size_t)max_tokens, wide = (size_t)ZS_MAX(f->d, f->qd);
    int ok = 1;
#define A(ptr, bytes) ok = ok && ((ptr) = zs_dev_alloc(d, (bytes))) != NULL
    A(f->x, n * f->d * 4);
    A(f->q, n * f->qd * 4);
    A(f->k, n * f->kvd * 4);
    A(f->v, n * f->kvd * 4);
    A(f->h1, n * f->ff * 4);
    A(f->h2, n * f->ff * 4);
    A(f->y, n * f->d * 4);
    A(f->logits, n * f->vocab * 4);
    A(f->xn, n * wide * 4);
    A(f->att, n * f->qd * 4);
    A(f->act, n * f->ff * 4);
    if (needs_xc(m)) A(f->xc, n * ZS_MAX(wide, (size_t)f->ff) * 4);
    int nb = zs_model_n_buckets(m);
    f->res = calloc((size_t)nb, sizeof(void *));
    f->kv = calloc((size_t)f->n_layers, sizeof(void *));
    if (!f->res || !f->kv) ok = 0;
    f->lookup = zs_model_embed_lookup(m);
    if (f->lookup) {
        const zs_bucket_layout *E = zs_model_layout(m, zs_bucket_embed());
        f->tok_row = zs_dtype_bytes(E->slot[ZS_R_TOK_EMB].dtype, (size_t)f->d); /* a block format: whole blocks */
        f->pos_row = E->slot[ZS_R_POS_EMB].present ? zs_dtype_bytes(E->slot[ZS_R_POS_EMB].dtype, (size_t)f->d) : 0;
        if (!zs_model_embed_table(m, ZS_R_TOK_EMB)) {
            zs_forward_cuda_free(f);
            return zs_err(ZS_EINVAL, "CUDA forward: the embedding lookup table is not loaded");
        }
    }
    for (int b = 0; ok && b < nb; b++) {
        size_t rb = zs_model_layout(m, b)->resident_bytes;
        const void *hr = zs_model_bucket_resident(m, b);
        /* with embed_lookup bucket 0's resident part holds only lookup tables, whose rows go up per
         * run; unless a tied token table is resident (--persist-threshold): the head reads it whole */
        const zs_slot *ts = &zs_model_layout(m, b)->slot[ZS_R_TOK_EMB];
        if (!rb || (f->lookup && b == zs_bucket_embed() && !(c->tied_embeddings && ts->resident))) continue;
        A(f->res[b], rb);
        if (ok && hr && zs_dev_upload(d, f->res[b], hr, rb) < 0) {
            zs_forward_cuda_free(f);
            return ZS_EDEVICE;
        }
    }
    size_t per_layer = (size_t)f->n_blocks * 2 * ZS_KV_BLOCK * (size_t)f->kvd * zs_dtype_size(f->kv_dtype);
    for (int l = 0; ok && l < f->n_layers; l++) A(f->kv[l], per_layer);
    if (ok && c->arch != ZS_ARCH_GPT2) {
        /* the CPU's frequencies, bit for bit (the device powf is not glibc's): per layer kind, the
         * first layer of the kind gives its table (position 0: these kinds do not depend on it), as
         * forward.c makes them; the default RoPE gives zs_cuda_rope_inv_freq's table */
        size_t half = (size_t)ZS_MAX(c->head_dim / 2, 1);
        float *h = calloc(2 * half, sizeof(float));
        A(f->freq, 2 * half * sizeof(float));
        if (!h) ok = 0;
        f->freq_af[0] = f->freq_af[1] = 1.0f;
        for (int l = c->n_layers - 1; ok && l >= 0; l--) {
            int k = zs_rope_layer_local(c, l);
            zs_rope_freqs(c, l, 0, h + (size_t)k * half, &f->freq_af[k]);
            if (zs_rope_pos_dependent(c, l)) f->rope_tok = 1;
        }
        f->freq_row = f->rope_tok ? (size_t)(c->head_dim / 2) * sizeof(float) : 0;
        if (ok && zs_dev_upload(d, f->freq, h, 2 * half * sizeof(float)) < 0) {
            free(h);
            zs_forward_cuda_free(f);
            return ZS_EDEVICE;
        }
        free(h);
    }
#undef A
    if (!ok) {
        int rc = zs_err_prefix(ZS_ENOMEM, "CUDA forward for %d tokens (KV cache %d blocks)", max_tokens, f->n_blocks);
        zs_forward_cuda_free(f);
        return rc;
    }
    zs_log_debug("CUDA forward on device %d: attention kernel %s (ZS_CUDA_ATTN)", d->id,
                 zs_cuda_attention_mode_name(zs_cuda_attention_mode()));
    *out = f;
    return 0;
}

/* Pointer of a role's tensor (device) given the two device base pointers. */
static inline const void *W(const zs_bucket_layout *L, int role, const void *data, const void *res) {
    const zs_slot *s = &L->slot[role];
    if (!s->present) return NULL;
    return (const char *)(s->resident ? res : data) + s->offset;
}
#define WF(L, role, data, res) ((const float *)W(L, role, data, res))

typedef struct {
    int32_t *tokens, *pos, *tab, *sel, *tables;
    int64_t *off;
    int64_t *mv_from, *mv_to; /* zs_batch.tree's KV moves: element offsets of the K rows */
    int32_t *tbase, *tpoff, *tpath; /* a token tree's plan (zs_cuda_att_tree), else NULL */
    int32_t *iota;           /* 0..T-1: the row indices of the staged embedding rows */
    char *tok_rows, *pos_rows; /* embed_lookup: the T rows of the token / position table */
    float *freq_tok;         /* position-dependent RoPE: the T rows of frequencies, else NULL */
} step_in;

/* Lays out the step inputs in buffer base (host or device) and returns the bytes used; with
 * tok_row > 0 also T staged rows of tok_row (and of pos_row) bytes, with freq_row > 0 T rows of
 * RoPE frequencies, with nmv > 0 the moves' offsets, with npath >= 0 a tree's plan of a path of
 * npath slots (npath < 0: no tree), 256-byte aligned. */
static size_t layout_inputs(char *base, int T, int nl, int ntab, size_t tok_row, size_t pos_row, size_t freq_row,
                            int nmv, int npath, step_in *s) {
    size_t tr = npath >= 0 ? (size_t)T * 4 : 0;
    size_t sz[15] = {(size_t)T * 8, (size_t)T * 4, (size_t)T * 4, (size_t)T * 4, (size_t)(nl > 0 ? nl : 1) * 4,
                     (size_t)(ntab > 0 ? ntab : 1) * 4, tok_row ? (size_t)T * 4 : 0, (size_t)T * tok_row,
                     (size_t)T * pos_row, (size_t)T * freq_row, (size_t)nmv * 8, (size_t)nmv * 8, tr, tr,
                     npath >= 0 ? (size_t)ZS_MAX(npath, 1) * 4 : 0};
    size_t at[15], o = 0;
    for (int i = 0; i < 15; i++) {
        if (i >= 7) o = ZS_ALIGN_UP(o, (size_t)256);
        at[i] = o;
        o += sz[i];
    }
    if (base) {
        s->off = (int64_t *)(base + at[0]);
        s->tokens = (int32_t *)(base + at[1]);
        s->pos = (int32_t *)(base + at[2]);
        s->tab = (int32_t *)(base + at[3]);
        s->sel = (int32_t *)(base + at[4]);
        s->tables = (int32_t *)(base + at[5]);
        s->iota = sz[6] ? (int32_t *)(base + at[6]) : NULL;
        s->tok_rows = sz[7] ? base + at[7] : NULL;
        s->pos_rows = sz[8] ? base + at[8] : NULL;
        s->freq_tok = sz[9] ? (float *)(base + at[9]) : NULL;
        s->mv_from = sz[10] ? (int64_t *)(base + at[10]) : NULL;
        s->mv_to = sz[11] ? (int64_t *)(base + at[11]) : NULL;
        s->tbase = tr ? (int32_t *)(base + at[12]) : NULL;
        s->tpoff = tr ? (int32_t *)(base + at[13]) : NULL;
        s->tpath = tr ? (int32_t *)(base + at[14]) : NULL;
    }
    return ZS_ALIGN_UP(o, (size_t)256);
}

static int grow_inputs(zs_forward_cuda *f, size_t need) {
    if (need <= f->in_cap) return 0;
    size_t cap = ZS_MAX(need, 2 * f->in_cap);
    if (f->in_h) cudaFreeHost(f->in_h);
    zs_dev_release(f->dev, f->in_d);
    f->in_h = NULL;
    f->in_d = NULL;
    f->in_cap = 0;
    if (cudaMallocHost((void **)&f->in_h, cap) != cudaSuccess) {
        f->in_h = NULL;
        return zs_dev_error("cudaMallocHost (step inputs)");
    }
    if (!(f->in_d = zs_dev_alloc(f->dev, cap))) return ZS_ENOMEM;
    f->in_cap = cap;
    return 0;
}

/* The weight source's acquire and release, plus what gather-cuda.c's ready/retire hooks could
 * not return (gather-cuda.h): a failed wait of the compute queue for the bucket, or a failed
 * record of its last use, fails the step here. On a failed acquire (either way) the bucket is
 * not released here: the caller's pass_end does that, as for any failed acquire. */
static int acquire(zs_weight_source *src, int b, const void **data) {
    int rc = src->acquire(src->ctx, b, data);
    int dev = zs_dev_gather_take_error();
    return rc < 0 ? rc : dev;
}

static int release(zs_weight_source *src, int b) {
    src->release(src->ctx, b);
    return zs_dev_gather_take_error();
}

/* y = norm(x) over R rows of dim (GPT-2: LayerNorm; else RMSNorm with the weight offset); y may be x
 * (in place) when ydt is f32 and rows is NULL */
static int norm(zs_forward_cuda *f, void *y, zs_dtype ydt, const float *x, const float *w, const float *b,
                const int32_t *rows, int R, void *s) {
    const zs_model_config *c = zs_model_config_get(f->m);
    if (!w) return zs_err(ZS_EINVAL, "CUDA forward: a norm weight is missing from the model");
    int r = c->arch == ZS_ARCH_GPT2 ? zs_cuda_layernorm(y, ydt, x, w, b, rows, R, c->dim, c->norm_eps, s)
                                    : zs_cuda_rmsnorm_off(y, ydt, x, w, c->norm_offset, rows, R, c->dim, c->norm_eps, s);
    return r == 0 ? 0 : zs_dev_error("norm kernel");
}

/* the per-head RMSNorm of q or k (qk_norm): rows of head_dim, in place */
static int head_norm(zs_forward_cuda *f, float *x, const float *w, int rows, void *s) {
    const zs_model_config *c = zs_model_config_get(f->m);
    if (!w) return zs_err(ZS_EINVAL, "CUDA forward: qk_norm without its q_norm / k_norm weights");
    DCHK(zs_cuda_rmsnorm_off(x, ZS_F32, x, w, c->norm_offset, NULL, rows, c->head_dim, c->norm_eps, s),
         "q/k norm kernel");
    return 0;
}

/* y = x W^T (+ bias) */
static int linear(zs_forward_cuda *f, float *y, const void *x, zs_dtype adt, int T, int in, const void *Wt,
                  zs_dtype wdt, int out, const float *bias, void *s) {
    /* x is stored in adt: a block-format W takes f32 (layer_adt made it so), an element-type W
     * of another dtype gets x converted to its own first */
    if (zs_dtype_is_quant(wdt) ? adt != ZS_F32 : wdt != adt) {
        if (zs_dtype_is_quant(wdt) || !f->xc)
            return zs_err(ZS_EINVAL, "CUDA forward: a %s matrix with inputs in %s", zs_dtype_name(wdt), zs_dtype_name(adt));
        DCHK(zs_cuda_convert(f->xc, wdt, x, adt, (size_t)T * in, s), "matrix input conversion kernel");
        x = f->xc;
    }
    ZS_CHECK(zs_dev_gemm(f->dev, y, x, T, in, Wt, wdt, out, 0.0f));
    if (bias) DCHK(zs_cuda_add(y, NULL, bias, T, out, s), "bias kernel");
    return 0;
}

static int layer_forward(zs_forward_cuda *f, int l, int T, int nmv, const step_in *in, const void *data,
                         const void *res) {
    const zs_model_config *c = zs_model_config_get(f->m);
    const zs_bucket_layout *L = zs_model_layout(f->m, zs_bucket_layer(l));
    void *s = f->dev->q[ZS_Q_COMPUTE];
    int d = f->d, ff = f->ff, qd = f->qd, kvd = f->kvd;
    zs_dtype wd = layer_adt(L); /* the matrix inputs' dtype */
#define MAT(role) W(L, role, data, res), L->slot[role].dtype

    ZS_CHECK(norm(f, f->xn, wd, f->x, WF(L, ZS_R_ATTN_NORM_W, data, res), WF(L, ZS_R_ATTN_NORM_B, data, res), NULL, T, s));
    ZS_CHECK(linear(f, f->q, f->xn, wd, T, d, MAT(ZS_R_WQ), qd, WF(L, ZS_R_BQ, data, res), s));
    ZS_CHECK(linear(f, f->k, f->xn, wd, T, d, MAT(ZS_R_WK), kvd, WF(L, ZS_R_BK, data, res), s));
    ZS_CHECK(linear(f, f->v, f->xn, wd, T, d, MAT(ZS_R_WV), kvd, WF(L, ZS_R_BV, data, res), s));
    if (c->qk_norm) { /* Qwen3, Gemma 3: RMSNorm over each head of q and k */
        ZS_CHECK(head_norm(f, f->q, WF(L, ZS_R_Q_NORM, data, res), T * c->n_heads, s));
        ZS_CHECK(head_norm(f, f->k, WF(L, ZS_R_K_NORM, data, res), T * c->n_kv_heads, s));
    }
    if (c->arch != ZS_ARCH_GPT2) {
        /* the layer kind's table, or the run's per-token rows (position-dependent scaling) */
        int kind = zs_rope_layer_local(c, l), per_tok = zs_rope_pos_dependent(c, l);
        const float *fr = per_tok ? in->freq_tok : f->freq + (size_t)kind * (size_t)ZS_MAX(c->head_dim / 2, 1);
        float af = per_tok ? f->tok_af : f->freq_af[kind];
        if (per_tok && !fr) return zs_err(ZS_EINVAL, "CUDA forward: no per-token RoPE frequencies");
        DCHK(zs_cuda_rope_freq(f->q, T, qd, c->n_heads, c->head_dim, in->pos, fr, per_tok, af, s), "rope kernel");
        DCHK(zs_cuda_rope_freq(f->k, T, kvd, c->n_kv_heads, c->head_dim, in->pos, fr, per_tok, af, s), "rope kernel");
    }
    /* a verified tree's accepted entries to their positions before this layer's writes (forward.c) */
    if (nmv > 0)
        DCHK(zs_cuda_kv_copy(f->kv[l], f->kv_dtype, in->mv_from, in->mv_to, nmv, kvd, s), "kv copy kernel");
    DCHK(zs_cuda_kv_store_dt(f->kv[l], f->kv_dtype, f->k, kvd, f->v, kvd, in->off, T, kvd, s), "kv store kernel");
    /* Gemma's scale and soft-cap, the window of a sliding layer (scale 0: 1/sqrtf(head_dim)) */
    zs_cuda_att_params ap = {zs_config_att_scale(c), c->attn_softcap, zs_config_layer_window(c, l)};
    zs_cuda_att_tree tree = {in->tbase, in->tpoff, in->tpath};
    DCHK(zs_cuda_attention_tree(zs_cuda_attention_mode(), f->att, wd, f->q, qd, f->kv[l], f->kv_dtype, in->tables,
                                in->tab, in->pos, T, c->n_heads, c->n_kv_heads, c->head_dim, &ap,
                                in->tbase ? &tree : NULL, s),
         "attention kernel");
    ZS_CHECK(linear(f, f->y, f->att, wd, T, qd, MAT(ZS_R_WO), d, WF(L, ZS_R_BO, data, res), s));
    if (c->post_norms) ZS_CHECK(norm(f, f->y, ZS_F32, f->y, WF(L, ZS_R_POST_ATTN_NORM, data, res), NULL, NULL, T, s));
    DCHK(zs_cuda_add(f->x, f->y, NULL, T, d, s), "residual kernel");

    ZS_CHECK(norm(f, f->xn, wd, f->x, WF(L, ZS_R_FFN_NORM_W, data, res), WF(L, ZS_R_FFN_NORM_B, data, res), NULL, T, s));
    if (c->arch == ZS_ARCH_GPT2) {
        ZS_CHECK(linear(f, f->h1, f->xn, wd, T, d, MAT(ZS_R_W_UP), ff, WF(L, ZS_R_B_UP, data, res), s));
        DCHK(zs_cuda_gelu(f->act, wd, f->h1, (size_t)T * ff, s), "gelu kernel");
    } else {
        ZS_CHECK(linear(f, f->h1, f->xn, wd, T, d, MAT(ZS_R_W_GATE), ff, WF(L, ZS_R_B_GATE, data, res), s));
        ZS_CHECK(linear(f, f->h2, f->xn, wd, T, d, MAT(ZS_R_W_UP), ff, WF(L, ZS_R_B_UP, data, res), s));
        if (c->act) DCHK(zs_cuda_geglu(f->act, wd, f->h1, f->h2, (size_t)T * ff, s), "geglu kernel"); /* Gemma */
        else DCHK(zs_cuda_swiglu(f->act, wd, f->h1, f->h2, (size_t)T * ff, s), "swiglu kernel");
    }
    ZS_CHECK(linear(f, f->y, f->act, wd, T, ff, MAT(ZS_R_W_DOWN), d, WF(L, ZS_R_B_DOWN, data, res), s));
#undef MAT
    if (c->post_norms) ZS_CHECK(norm(f, f->y, ZS_F32, f->y, WF(L, ZS_R_POST_FFN_NORM, data, res), NULL, NULL, T, s));
    DCHK(zs_cuda_add(f->x, f->y, NULL, T, d, s), "residual kernel");
    return 0;
}

int zs_forward_cuda_run(zs_forward_cuda *f, zs_weight_source *src, zs_kvcache *kv, const zs_batch *b,
                        float *logits) {
    const zs_model *m = f->m;
    const zs_model_config *c = zs_model_config_get(m);
    int T = b->n;
    if (T <= 0 || T > f->max_tokens)
        return zs_err(ZS_EINVAL, "forward: batch of %d tokens (limit %d)", T, f->max_tokens);
    if (b->n_logits < 0 || b->n_logits > T) return zs_err(ZS_EINVAL, "forward: %d logits rows for %d tokens", b->n_logits, T);
    for (int i = 0; b->lora && i < T; i++)
        if (b->lora[i]) return zs_err(ZS_EUNSUPPORTED, "LoRA adapters are not supported on the CUDA device yet");
    if (b->hidden) return zs_err(ZS_EUNSUPPORTED, "embeddings run on the CPU device for now (zs_batch.hidden)");
    ZS_CHECK(zs_batch_check(b, kv, c->max_seq));
    /* a token tree (zs_batch.tree): K/V at the slots, the tree mask in the attention */
    const int32_t *slot = b->tree && b->tree->parent ? b->tree->slot : NULL;
    int nmv = b->tree ? b->tree->n_moves : 0, npath = -1;
    if (slot && (npath = zs_cuda_att_tree_plan(b->seq, b->pos, slot, b->tree->parent, T, NULL, NULL, NULL)) < 0)
        return zs_err(ZS_EINVAL, "CUDA forward: %s", zs_cuda_take_error());
    int ntab = 0;
    for (int i = 0; i < T; i++) {
        if (b->tokens[i] < 0 || b->tokens[i] >= c->vocab_size)
            return zs_err(ZS_ERANGE, "token id %d is out of range [0, %d)", b->tokens[i], c->vocab_size);
        if (b->logits_idx[i] >= b->n_logits)
            return zs_err(ZS_EINVAL, "forward: logits row %d of %d", b->logits_idx[i], b->n_logits);
        if (i == 0 || b->seq[i] != b->seq[i - 1]) {
            ntab += (zs_kv_seq_len(kv, b->seq[i]) + ZS_KV_BLOCK - 1) / ZS_KV_BLOCK;
            /* a windowed cache's ring must hold every position read and written (forward.c) */
            int j = i, p0 = b->pos[i], p1 = slot ? slot[i] : b->pos[i];
            while (zs_kv_ring(kv) && j + 1 < T && b->seq[j + 1] == b->seq[i]) {
                j++;
                p0 = ZS_MIN(p0, b->pos[j]);
                p1 = ZS_MAX(p1, slot ? slot[j] : b->pos[j]);
            }
            if (zs_kv_ring(kv) && !zs_kv_span_ok(kv, p0, p1))
                return zs_err(ZS_EINVAL, "forward: %d tokens of one sequence in one call are more than the "
                              "windowed KV cache's ring holds", j - i + 1);
        }
    }
    ZS_CHECK(zs_dev_set_current(f->dev));
    /* a run that failed part-way may have left work queued that reads the step inputs */
    cudaError_t se = cudaStreamSynchronize(f->dev->q[ZS_Q_COMPUTE]);
    if (se != cudaSuccess) return zs_err(ZS_EDEVICE, "CUDA device %d: %s", f->dev->id, cudaGetErrorString(se));
    step_in h, dv;
    size_t tr = f->lookup ? f->tok_row : 0, pr = f->lookup ? f->pos_row : 0;
    size_t need = layout_inputs(NULL, T, b->n_logits, ntab, tr, pr, f->freq_row, nmv, npath, &h);
    ZS_CHECK(grow_inputs(f, need));
    layout_inputs(f->in_h, T, b->n_logits, ntab, tr, pr, f->freq_row, nmv, npath, &h);
    layout_inputs(f->in_d, T, b->n_logits, ntab, tr, pr, f->freq_row, nmv, npath, &dv);
    if (slot) zs_cuda_att_tree_plan(b->seq, b->pos, slot, b->tree->parent, T, h.tbase, h.tpoff, h.tpath);
    for (int i = 0; i < nmv; i++) { /* zs_kv_copy's positions as element offsets of the K rows */
        const zs_kv_move *mv = &b->tree->moves[i];
        const int *bl = zs_kv_seq_blocks(kv, mv->seq);
        h.mv_from[i] = (((int64_t)bl[mv->from / ZS_KV_BLOCK] * 2) * ZS_KV_BLOCK + mv->from % ZS_KV_BLOCK) * (int64_t)f->kvd;
        h.mv_to[i] = (((int64_t)bl[mv->to / ZS_KV_BLOCK] * 2) * ZS_KV_BLOCK + mv->to % ZS_KV_BLOCK) * (int64_t)f->kvd;
    }
    memset(h.sel, 0, (size_t)(b->n_logits > 0 ? b->n_logits : 1) * 4);
    /* block tables: one copy per run of consecutive tokens of a sequence */
    int nt = 0, cur = 0;
    for (int i = 0; i < T; i++) {
        int sq = b->seq[i];
        if (i == 0 || sq != b->seq[i - 1]) {
            int nblk = (zs_kv_seq_len(kv, sq) + ZS_KV_BLOCK - 1) / ZS_KV_BLOCK;
            const int *bl = zs_kv_seq_blocks(kv, sq);
            cur = nt;
            for (int j = 0; j < nblk; j++) h.tables[nt++] = bl[j];
        }
        int p = slot ? slot[i] : b->pos[i]; /* where its K and V go */
        int blk = h.tables[cur + p / ZS_KV_BLOCK];
        h.off[i] = (((int64_t)blk * 2) * ZS_KV_BLOCK + p % ZS_KV_BLOCK) * (int64_t)f->kvd;
        h.tokens[i] = b->tokens[i];
        h.pos[i] = b->pos[i];
        h.tab[i] = cur;
        if (b->logits_idx[i] >= 0) h.sel[b->logits_idx[i]] = i;
    }
    if (f->lookup) {
        /* the batch's rows of the host lookup tables, as stored (the kernel converts them as it
         * converts a gathered table's) */
        const char *tt = zs_model_embed_table(m, ZS_R_TOK_EMB), *pt = zs_model_embed_table(m, ZS_R_POS_EMB);
        for (int i = 0; i < T; i++) {
            h.iota[i] = i;
            memcpy(h.tok_rows + (size_t)i * f->tok_row, tt + (size_t)b->tokens[i] * f->tok_row, f->tok_row);
            if (pt) memcpy(h.pos_rows + (size_t)i * f->pos_row, pt + (size_t)b->pos[i] * f->pos_row, f->pos_row);
        }
    }
    if (f->rope_tok) {
        /* position-dependent RoPE (dynamic NTK, LongRoPE): each token's frequencies from its own
         * position (rope.h), as forward.c computes them. zs_rope_freqs depends on the layer only
         * through zs_rope_layer_local, and no local layer is position-dependent: one set of rows
         * serves every such layer. The kernel takes one attention factor per call: it must be the
         * same for every token (it is for every scaling rope.c knows) */
        int pl = zs_rope_pos_layer(c);
        size_t half = (size_t)(c->head_dim / 2);
        for (int i = 0; i < T; i++) {
            float af;
            zs_rope_freqs(c, pl, b->pos[i], h.freq_tok + (size_t)i * half, &af);
            if (i == 0) f->tok_af = af;
            else if (af != f->tok_af)
                return zs_err(ZS_EUNSUPPORTED, "CUDA forward: the RoPE attention factor differs between positions "
                              "%d and %d of one batch", b->pos[0], b->pos[i]);
        }
    }
    void *s = f->dev->q[ZS_Q_COMPUTE];
    if (cudaMemcpyAsync(f->in_d, f->in_h, need, cudaMemcpyHostToDevice, s) != cudaSuccess)
        return zs_dev_error("step inputs copy");

    int rc, rrc;
    const void *data;
    int eb = zs_bucket_embed();
    const zs_bucket_layout *E = zs_model_layout(m, eb);
    const void *eres = f->res[eb];
    if (f->lookup) {
        /* the staged rows, indices 0..T-1; no bucket acquired */
        rc = zs_cuda_embed(f->x, dv.tok_rows, E->slot[ZS_R_TOK_EMB].dtype, dv.iota, dv.pos_rows,
                           E->slot[ZS_R_POS_EMB].dtype, dv.iota, T, f->d, s) == 0
                 ? 0 : zs_dev_error("embedding kernel");
        if (rc < 0) return rc;
    } else {
        if ((rc = acquire(src, eb, &data)) < 0) return rc;
        rc = zs_cuda_embed(f->x, W(E, ZS_R_TOK_EMB, data, eres), E->slot[ZS_R_TOK_EMB].dtype, dv.tokens,
                           W(E, ZS_R_POS_EMB, data, eres), E->slot[ZS_R_POS_EMB].dtype, dv.pos, T, f->d, s) == 0
                 ? 0 : zs_dev_error("embedding kernel");
        rrc = release(src, eb);
        if (rc < 0) return rc;
        if (rrc < 0) return rrc;
    }
    if (c->embed_scale > 0) /* Gemma: times sqrt(hidden) */
        DCHK(zs_cuda_scale(f->x, (size_t)T * f->d, c->embed_scale, s), "embedding scale kernel");

    for (int l = 0; l < c->n_layers; l++) {
        int lb = zs_bucket_layer(l);
        if ((rc = acquire(src, lb, &data)) < 0) return rc;
        rc = layer_forward(f, l, T, nmv, &dv, data, f->res[lb]);
        rrc = release(src, lb);
        if (rc < 0) return rc;
        if (rrc < 0) return rrc;
    }

    int hb = zs_bucket_head(m), nl = b->n_logits;
    const zs_bucket_layout *H = zs_model_layout(m, hb);
    const void *hres = f->res[hb];
    zs_dtype hdt = c->tied_embeddings ? E->slot[ZS_R_TOK_EMB].dtype : H->slot[ZS_R_LM_HEAD].dtype;
    if ((rc = acquire(src, hb, &data)) < 0) return rc;
    /* the head's input: f32 for a block-format head (zs_dev_gemm takes f32 x with it) */
    rc = norm(f, f->xn, zs_dtype_is_quant(hdt) ? ZS_F32 : hdt, f->x, WF(H, ZS_R_OUT_NORM_W, data, hres),
              WF(H, ZS_R_OUT_NORM_B, data, hres), dv.sel, nl, s);
    if (rc == 0 && !c->tied_embeddings && nl > 0)
        rc = zs_dev_gemm(f->dev, f->logits, f->xn, nl, f->d, W(H, ZS_R_LM_HEAD, data, hres), hdt, f->vocab, 0.0f);
    rrc = release(src, hb);
    if (rc < 0) return rc;
    if (rrc < 0) return rrc;
    if (c->tied_embeddings) {
        if ((rc = acquire(src, eb, &data)) < 0) return rc;
        if (nl > 0) rc = zs_dev_gemm(f->dev, f->logits, f->xn, nl, f->d, W(E, ZS_R_TOK_EMB, data, eres), hdt, f->vocab, 0.0f);
        rrc = release(src, eb);
        if (rc < 0) return rc;
        if (rrc < 0) return rrc;
    }
    if (c->final_softcap > 0 && nl > 0) /* Gemma 2 */
        DCHK(zs_cuda_softcap(f->logits, (size_t)nl * f->vocab, c->final_softcap, s), "logit soft-cap kernel");
    /* sampling runs on the host: the logits rows go there */
    if (nl > 0 && logits &&
        cudaMemcpyAsync(logits, f->logits, (size_t)nl * f->vocab * 4, cudaMemcpyDeviceToHost, s) != cudaSuccess)
        return zs_dev_error("logits copy");
    cudaError_t e = cudaStreamSynchronize(s);
    if (e != cudaSuccess) return zs_err(ZS_EDEVICE, "CUDA device %d: forward pass: %s", f->dev->id, cudaGetErrorString(e));
    return 0;
}
