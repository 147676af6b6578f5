/* forward.c — the forward pass of a batch of tokens through every bucket (embeddings, each
 * transformer block, final norm and LM head), for Llama-family models (with the pieces of Qwen3,
 * Gemma 2/3, Phi-3 and Mistral: q/k norms, sandwich norms, GeGLU, soft-capping, sliding windows,
 * scaled RoPE) and GPT-2 models, on the CPU; the
 * embedding rows come from the host lookup tables of an inference model (model.h) or from the
 * gathered embedding bucket. Attention runs in kernels/cpu/attention.c over block tables of the
 * paged cache, whose K/V elements are f32, f16 or bf16 (kvcache.h); before and after each layer
 * the cache's layer hook runs (zs_kv_layer: layer-streamed sequences' K/V arrive in stage blocks
 * and go back, kvstream.h). zs_batch.hidden, when set,
 * gets every token's final-normed hidden state (the rows embeddings pool).
 *
 * LoRA (zs_batch.lora): each adapted projection's output (q, k, v before the q/k norms and RoPE,
 * o and down before the post-norms, gate and up before the activation: PEFT's nn.Linear output,
 * bias included) gets scale·B·A·x added for every row that has an adapter. The rows of each
 * distinct adapter are grouped once per call (packed into scratch when they are not one
 * consecutive run), so an adapter's matrices are read once per projection and step and the base
 * weights once for the whole batch; every product is the batch-invariant zs_op_matmul, so a row's
 * result does not depend on the other rows or their adapters.
 *
 * Mixtures of experts (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE; zs_config_layer_moe), as transformers
 * computes the sparse block: router logits x·routerᵀ, softmax in f32, the top k (equal
 * probabilities: the lower expert id first), renormalised to sum 1 when norm_topk_prob; the
 * source agrees on the union of the experts over ranks (zs_weight_source.experts); then each
 * expert of the union, in increasing id order, is acquired, runs its SwiGLU MLP over the rows
 * routed to it (packed together; none when only other ranks' rows use it) and is released; row i
 * gets weight·output of its experts added in increasing expert id order (the order of
 * transformers' index_add_ loop), so its bits depend neither on the other rows nor on the rank
 * count. Qwen2-MoE then adds sigmoid(x·shared_gateᵀ)·SwiGLU_shared(x). OLMoE's q_norm / k_norm are
 * RMSNorms over the whole q and k rows, and clip_qkv clamps q, k (after those norms) and v, before
 * RoPE. LoRA adapters of the attention projections work on MoE models; MLP targets on a model with
 * MoE layers are refused by zs_lora_check_base (the experts have no adapter slots). */
#include <math.h>
#include <string.h>

#include "attention.h"
#include "common.h"
#include "lora.h"
#include "model.h"
#include "ops.h"
#include "rope.h"

struct zs_forward {
    const zs_model *m;
    int max_tokens;
    /* RoPE frequencies of the position-independent kinds: [0] global layers, [1] Gemma 3's local
     * ones (rope.h); position-dependent types (dynamic, longrope): one row per token of the call in
     * freq_tok [max_tokens * head_dim/2] with its factor in tok_af, made once per call */
    float *freq[2], freq_af[2], *freq_tok, *tok_af;
    int pos_layer; /* zs_rope_pos_layer */
    float *x, *xn, *q, *k, *v, *att, *h1, *h2;
    /* mixtures of experts (models with MoE layers only): router probabilities rl [n, E], each row's
     * experts sel and weights wt [n, k] in top-k order, the rows of each expert erow / ewt (ascending)
     * from estart[e] to estart[e + 1], a fill cursor ecur [E], the packed rows of one expert xe [n, d],
     * its output ye [n, d], and the block's output mo [n, d] */
    float *rl, *wt, *ewt, *xe, *ye, *mo;
    int *sel, *erow, *estart, *ecur;
    /* the attention's view of the cache: per sequence slot, its block tables (grown on use) */
    zs_att_seq *views;
    unsigned *view_stamp; /* the call that last filled a slot's view */
    const void **ptrs;
    int n_views, n_ptrs;
    unsigned stamp;
    /* LoRA, made on the first call with adapters: the call's distinct adapters as groups
     * lg[0..n_lgrp), each with its rows lrows[lstart[g] .. lstart[g+1]) (ascending; rows NULL in
     * the group when they are one consecutive run); lscr: the products' u, sum over the groups of
     * rows * r floats, grown as needed */
    const zs_lora **lgrp;
    zs_lora_rows *lg;
    int *lrows, *lstart, *lcnt, *lgi, n_lgrp;
    float *lscr;
    size_t n_lscr;
};

int zs_forward_new(const zs_model *m, int max_tokens, zs_forward **out) {
    const zs_model_config *c = zs_model_config_get(m);
    if (max_tokens <= 0) return zs_err(ZS_EINVAL, "forward: max_tokens must be positive");
    zs_forward *f = calloc(1, sizeof *f);
    if (!f) return zs_err(ZS_ENOMEM, "out of memory");
    f->m = m;
    f->max_tokens = max_tokens;
    size_t n = (size_t)max_tokens, qd = (size_t)c->n_heads * (size_t)c->head_dim;
    size_t kvd = (size_t)c->n_kv_heads * (size_t)c->head_dim;
    size_t wide = ZS_MAX((size_t)c->ffn_dim, ZS_MAX(qd, (size_t)c->dim));
    int moe = 0;
    for (int l = 0; l < c->n_layers; l++) moe |= zs_config_layer_moe(c, l);
    if (moe) wide = ZS_MAX(wide, (size_t)ZS_MAX(c->moe_ffn_dim, c->shared_ffn_dim));
    f->x = zs_aligned_alloc(64, n * (size_t)c->dim * 4);
    f->xn = zs_aligned_alloc(64, n * ZS_MAX((size_t)c->dim, qd) * 4);
    f->q = zs_aligned_alloc(64, n * qd * 4);
    f->k = zs_aligned_alloc(64, n * kvd * 4);
    f->v = zs_aligned_alloc(64, n * kvd * 4);
    f->att = zs_aligned_alloc(64, n * qd * 4);
    f->h1 = zs_aligned_alloc(64, n * wide * 4);
    f->h2 = zs_aligned_alloc(64, n * wide * 4);
    if (moe) {
        size_t ne = (size_t)c->n_experts, nk = n * (size_t)c->n_experts_used;
        f->rl = zs_aligned_alloc(64, n * ne * 4);
        f->wt = malloc(nk * sizeof(float));
        f->ewt = malloc(nk * sizeof(float));
        f->sel = malloc(nk * sizeof(int));
        f->erow = malloc(nk * sizeof(int));
        f->estart = malloc((ne + 1) * sizeof(int));
        f->ecur = malloc(ne * sizeof(int));
        f->xe = zs_aligned_alloc(64, n * (size_t)c->dim * 4);
        f->ye = zs_aligned_alloc(64, n * (size_t)c->dim * 4);
        f->mo = zs_aligned_alloc(64, n * (size_t)c->dim * 4);
        if (!f->rl || !f->wt || !f->ewt || !f->sel || !f->erow || !f->estart || !f->ecur || !f->xe || !f->ye ||
            !f->mo) {
            zs_forward_free(f);
            return zs_err(ZS_ENOMEM, "forward: cannot allocate the experts' scratch for %d tokens", max_tokens);
        }
    }
    size_t half = (size_t)ZS_MAX(c->head_dim / 2, 1);
    f->freq[0] = malloc(half * sizeof(float));
    f->freq[1] = malloc(half * sizeof(float));
    f->pos_layer = zs_rope_pos_layer(c);
    f->freq_tok = malloc((f->pos_layer >= 0 ? n * half : 1) * sizeof(float));
    f->tok_af = malloc((f->pos_layer >= 0 ? n : 1) * sizeof(float));
    if (f->freq[0] && f->freq[1] && c->arch != ZS_ARCH_GPT2) {
        /* layer kinds: the first layer of each kind gives its table (position 0: the kinds here do
         * not depend on it) */
        for (int l = c->n_layers - 1; l >= 0; l--) {
            int k = zs_rope_layer_local(c, l);
            zs_rope_freqs(c, l, 0, f->freq[k], &f->freq_af[k]);
        }
    }
    if (!f->x || !f->xn || !f->q || !f->k || !f->v || !f->att || !f->h1 || !f->h2 || !f->freq[0] || !f->freq[1] ||
        !f->freq_tok || !f->tok_af) {
        zs_forward_free(f);
        return zs_err(ZS_ENOMEM, "forward: cannot allocate scratch for %d tokens", max_tokens);
    }
    *out = f;
    return 0;
}

void zs_forward_free(zs_forward *f) {
    if (!f) return;
    free(f->x); free(f->xn); free(f->q); free(f->k); free(f->v);
    free(f->att); free(f->h1); free(f->h2);
    free(f->freq[0]); free(f->freq[1]); free(f->freq_tok); free(f->tok_af);
    free(f->views); free(f->view_stamp); free(f->ptrs);
    free(f->lgrp); free(f->lg); free(f->lrows); free(f->lscr);
    free(f->rl); free(f->wt); free(f->ewt); free(f->sel); free(f->erow); free(f->estart); free(f->ecur);
    free(f->xe); free(f->ye); free(f->mo);
    free(f);
}

/* Pointer of a role's tensor in a bucket given the two base pointers. */
static inline const void *W(const zs_bucket_layout *L, int role, const void *data, const void *res) {
    const zs_slot *s = &L->slot[role];
    if (!s->present) return NULL;
    return (const char *)(s->resident ? res : data) + s->offset;
}
#define WF(L, role, data, res) ((const float *)W(L, role, data, res))

static void norm(const zs_model_config *c, float *y, const float *x, const float *w, const float *b, int n) {
    if (c->arch == ZS_ARCH_GPT2) zs_op_layernorm(y, x, w, b, n, c->dim, c->norm_eps);
    else zs_op_rmsnorm_off(y, x, w, n, c->dim, c->norm_eps, c->norm_offset);
}

/* Attention of the batch over the cache (kernels/cpu/attention.c): the kernel sees each
 * sequence of the batch through its table of block pointers, built here per layer. */
static int attention(zs_forward *f, zs_kvcache *kv, int layer, const zs_batch *b) {
    const zs_model_config *c = zs_model_config_get(f->m);
    /* Gemma's scale and soft-cap, the window of a sliding layer */
    zs_att_params ap = {zs_config_att_scale(c), c->attn_softcap, zs_config_layer_window(c, layer)};
    int ns = zs_kv_max_seqs(kv), nblk = zs_kv_total_blocks(kv);
    /* with prefix caching a block may be in several sequences' tables: room for every slot's
     * longest table when that is more than the pool's blocks */
    {
        long most = (long)ns * ((zs_kv_max_len(kv) + ZS_KV_BLOCK - 1) / ZS_KV_BLOCK);
        if (most > nblk) nblk = (int)ZS_MIN(most, 1L << 28);
    }
    if (ns > f->n_views || nblk > f->n_ptrs) {
        zs_att_seq *v = realloc(f->views, (size_t)ns * sizeof *v);
        if (v) f->views = v;
        unsigned *st = v ? realloc(f->view_stamp, (size_t)ns * sizeof *st) : NULL;
        if (st) f->view_stamp = st;
        const void **p = st ? realloc(f->ptrs, (size_t)nblk * 2 * sizeof *p) : NULL;
        if (!p) return zs_err(ZS_ENOMEM, "forward: out of memory for the attention tables");
        f->ptrs = p;
        for (int s = f->n_views; s < ns; s++) f->view_stamp[s] = 0;
        f->n_views = ns;
        f->n_ptrs = nblk;
    }
    /* every sequence of the batch once: its blocks' K and V rows (2 * nblk pointers hold them) */
    if (++f->stamp == 0) { /* wrapped: forget every slot */
        memset(f->view_stamp, 0, (size_t)f->n_views * sizeof *f->view_stamp);
        f->stamp = 1;
    }
    unsigned stamp = f->stamp;
    int used = 0;
    for (int i = 0; i < b->n; i++) {
        int s = b->seq[i];
        if (f->view_stamp[s] == stamp) continue;
        f->view_stamp[s] = stamp;
        int n = (zs_kv_seq_len(kv, s) + ZS_KV_BLOCK - 1) / ZS_KV_BLOCK;
        const void **kp = f->ptrs + used, **vp = kp + n;
        for (int j = 0; j < n; j++) {
            kp[j] = zs_kv_k(kv, layer, s, j * ZS_KV_BLOCK);
            vp[j] = zs_kv_v(kv, layer, s, j * ZS_KV_BLOCK);
        }
        used += 2 * n;
        f->views[s] = (zs_att_seq){kp, vp};
    }
    const int32_t *par = b->tree ? b->tree->parent : NULL;
    zs_att_tree tree = {b->tree ? b->tree->slot : NULL, par};
    return zs_op_attention_tree(f->att, f->q, b->n, b->seq, b->pos, f->views, c->n_heads, c->n_kv_heads, c->head_dim,
                                c->n_kv_heads * c->head_dim, ZS_KV_BLOCK, zs_kv_dtype(kv), ZS_ATT_AUTO, &ap,
                                par ? &tree : NULL);
}

/* Groups the rows of b by adapter and sizes the scratch (before anything is acquired). */
static int lora_prepare(zs_forward *f, const zs_batch *b) {
    size_t nt = (size_t)f->max_tokens;
    f->n_lgrp = 0;
    if (!b->lora) return 0;
    if (!f->lgrp) {
        f->lgrp = malloc(nt * sizeof *f->lgrp);
        f->lg = malloc(nt * sizeof *f->lg);
        f->lrows = malloc((4 * nt + 1) * sizeof *f->lrows);
        if (!f->lgrp || !f->lg || !f->lrows) {
            free(f->lgrp); free(f->lg); free(f->lrows);
            f->lgrp = NULL; f->lg = NULL; f->lrows = NULL;
            return zs_err(ZS_ENOMEM, "forward: out of memory for the LoRA rows of %d tokens", f->max_tokens);
        }
        f->lstart = f->lrows + nt;
        f->lcnt = f->lstart + nt + 1;
        f->lgi = f->lcnt + nt;
    }
    int n = b->n, ng = 0;
    int *cnt = f->lcnt;
    for (int i = 0; i < n; i++) {
        const zs_lora *l = b->lora[i];
        int g = -1;
        if (!l) {
            f->lgi[i] = -1;
            continue;
        }
        if (i > 0 && b->lora[i - 1] == l) g = f->lgi[i - 1];
        for (int k = 0; g < 0 && k < ng; k++)
            if (f->lgrp[k] == l) g = k;
        if (g < 0) {
            ZS_CHECK(zs_lora_check_base(l, f->m)); /* the loader checks it against its base; this catches another base's
                                                      (and MLP targets on a mixture of experts) */
            g = ng++;
            f->lgrp[g] = l;
            cnt[g] = 0;
        }
        f->lgi[i] = g;
        cnt[g]++;
    }
    size_t need = 0;
    f->lstart[0] = 0;
    for (int g = 0; g < ng; g++) {
        need += zs_lora_apply_scratch(f->lgrp[g], cnt[g]);
        f->lstart[g + 1] = f->lstart[g] + cnt[g];
        cnt[g] = f->lstart[g]; /* fill cursor */
    }
    for (int i = 0; i < n; i++)
        if (f->lgi[i] >= 0) f->lrows[cnt[f->lgi[i]]++] = i;
    for (int g = 0; g < ng; g++) {
        const int *rows = f->lrows + f->lstart[g];
        int k = f->lstart[g + 1] - f->lstart[g], run = rows[k - 1] - rows[0] == k - 1;
        f->lg[g] = (zs_lora_rows){f->lgrp[g], run ? NULL : rows, run ? rows[0] : 0, k};
    }
    if (need > f->n_lscr) {
        float *p = zs_aligned_alloc(64, need * sizeof(float));
        if (!p) return zs_err(ZS_ENOMEM, "forward: out of memory for LoRA scratch (%zu floats)", need);
        free(f->lscr);
        f->lscr = p;
        f->n_lscr = need;
    }
    f->n_lgrp = ng;
    return 0;
}

/* y[n, out] (the output of projection t of layer `layer` for input x[n, in]) += each row's
 * adapter's scale·B·A·x: every adapter of the call in one zs_lora_apply_rows (each adapter's
 * matrices read once per step, whatever its rows). */
static int lora_add(zs_forward *f, int layer, int t, float *y, int out, const float *x, int in) {
    return zs_lora_apply_rows(f->lg, f->n_lgrp, layer, t, y, out, x, in, f->lscr);
}

#define LORA_ADD(...)                                 \
    do {                                              \
        int lrc_ = lora_add(__VA_ARGS__);             \
        if (lrc_ < 0) return lrc_;                    \
    } while (0)

/* The sparse block of MoE layer l over xn [n, d] (the MLP's normed input) into f->mo [n, d]; L,
 * data, res: the layer bucket (router, shared expert), held by the caller throughout. */
static int moe_block(zs_forward *f, zs_weight_source *src, int l, int n, const zs_bucket_layout *L,
                     const void *data, const void *res) {
    const zs_model *m = f->m;
    const zs_model_config *c = zs_model_config_get(m);
    int d = c->dim, ne = c->n_experts, k = c->n_experts_used, mf = c->moe_ffn_dim, sf = c->shared_ffn_dim, rc;
    /* routing: probabilities in f32, the k largest (ties: lower id), renormalised when asked */
    zs_op_matmul(f->rl, f->xn, n, d, W(L, ZS_R_ROUTER, data, res), L->slot[ZS_R_ROUTER].dtype, ne, NULL);
    uint64_t mask[ZS_EXPERT_WORDS] = {0}, agreed[ZS_EXPERT_WORDS] = {0};
    for (int i = 0; i < n; i++) {
        float *p = f->rl + (size_t)i * ne, *w = f->wt + (size_t)i * k;
        int *s = f->sel + (size_t)i * k;
        uint64_t taken[ZS_EXPERT_WORDS] = {0};
        zs_op_softmax(p, ne);
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < ne; e++)
                if (!(taken[e >> 6] >> (e & 63) & 1) && (best < 0 || p[e] > p[best])) best = e;
            taken[best >> 6] |= 1ull << (best & 63);
            s[j] = best;
            w[j] = p[best];
        }
        if (c->norm_topk_prob) {
            float sum = 0.0f;
            for (int j = 0; j < k; j++) sum += w[j];
            for (int j = 0; j < k; j++) w[j] /= sum;
        }
        for (int w8 = 0; w8 < ZS_EXPERT_WORDS; w8++) mask[w8] |= taken[w8];
    }
    if (src->experts) {
        if ((rc = src->experts(src->ctx, l, mask, agreed)) < 0) return rc;
    } else {
        memcpy(agreed, mask, sizeof agreed);
    }
    for (int w8 = 0; w8 < ZS_EXPERT_WORDS; w8++)
        if (mask[w8] & ~agreed[w8])
            return zs_err(ZS_EINVAL, "forward: layer %d: the agreed experts lack expert %d that this rank's tokens "
                          "selected", l, w8 * 64 + __builtin_ctzll(mask[w8] & ~agreed[w8]));
    /* each expert's rows, ascending */
    memset(f->estart, 0, (size_t)(ne + 1) * sizeof *f->estart);
    for (int i = 0; i < n * k; i++) f->estart[f->sel[i] + 1]++;
    for (int e = 0; e < ne; e++) {
        f->estart[e + 1] += f->estart[e];
        f->ecur[e] = f->estart[e];
    }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < k; j++) {
            int e = f->sel[(size_t)i * k + j], at = f->ecur[e]++;
            f->erow[at] = i;
            f->ewt[at] = f->wt[(size_t)i * k + j];
        }
    memset(f->mo, 0, (size_t)n * d * sizeof(float));
    for (int e = 0; e < ne; e++) {
        if (!(agreed[e >> 6] >> (e & 63) & 1)) continue;
        int eb = zs_bucket_expert(m, l, e), cnt = f->estart[e + 1] - f->estart[e];
        const void *xd;
        if (eb < 0) return zs_err(ZS_EINVAL, "forward: layer %d has no expert %d", l, e);
        if ((rc = src->acquire(src->ctx, eb, &xd)) < 0) return rc;
        const zs_bucket_layout *X = zs_model_layout(m, eb);
        const void *xr = zs_model_bucket_resident(m, eb);
        const int *rows = f->erow + f->estart[e];
        const float *wts = f->ewt + f->estart[e];
        if (cnt > 0) {
            for (int j = 0; j < cnt; j++)
                memcpy(f->xe + (size_t)j * d, f->xn + (size_t)rows[j] * d, (size_t)d * sizeof(float));
            zs_op_matmul(f->h1, f->xe, cnt, d, W(X, ZS_R_W_GATE, xd, xr), X->slot[ZS_R_W_GATE].dtype, mf, NULL);
            zs_op_matmul(f->h2, f->xe, cnt, d, W(X, ZS_R_W_UP, xd, xr), X->slot[ZS_R_W_UP].dtype, mf, NULL);
            zs_op_swiglu(f->h1, f->h1, f->h2, (size_t)cnt * mf);
            zs_op_matmul(f->ye, f->h1, cnt, mf, W(X, ZS_R_W_DOWN, xd, xr), X->slot[ZS_R_W_DOWN].dtype, d, NULL);
            for (int j = 0; j < cnt; j++) { /* transformers: out.index_add_(rows, expert(x) * weight) */
                float *o = f->mo + (size_t)rows[j] * d, wj = wts[j];
                const float *y = f->ye + (size_t)j * d;
                for (int t = 0; t < d; t++) o[t] += y[t] * wj;
            }
        }
        src->release(src->ctx, eb);
    }
    if (sf > 0) { /* Qwen2-MoE: + sigmoid(x·shared_gateᵀ) * shared_expert(x) */
        zs_op_matmul(f->h1, f->xn, n, d, W(L, ZS_R_W_GATE, data, res), L->slot[ZS_R_W_GATE].dtype, sf, NULL);
        zs_op_matmul(f->h2, f->xn, n, d, W(L, ZS_R_W_UP, data, res), L->slot[ZS_R_W_UP].dtype, sf, NULL);
        zs_op_swiglu(f->h1, f->h1, f->h2, (size_t)n * sf);
        zs_op_matmul(f->ye, f->h1, n, sf, W(L, ZS_R_W_DOWN, data, res), L->slot[ZS_R_W_DOWN].dtype, d, NULL);
        zs_op_matmul(f->rl, f->xn, n, d, W(L, ZS_R_SHARED_GATE, data, res), L->slot[ZS_R_SHARED_GATE].dtype, 1, NULL);
        for (int i = 0; i < n; i++) {
            float g = 1.0f / (1.0f + expf(-f->rl[i]));
            float *o = f->mo + (size_t)i * d;
            const float *y = f->ye + (size_t)i * d;
            for (int t = 0; t < d; t++) o[t] += g * y[t];
        }
    }
    return 0;
}

static int layer_forward(zs_forward *f, zs_weight_source *src, zs_kvcache *kv, int l, const zs_batch *b,
                         const void *data, const void *res) {
    const zs_model *m = f->m;
    const zs_model_config *c = zs_model_config_get(m);
    const zs_bucket_layout *L = zs_model_layout(m, zs_bucket_layer(l));
    int n = b->n, d = c->dim, ff = c->ffn_dim;
    int qd = c->n_heads * c->head_dim, kvd = c->n_kv_heads * c->head_dim;
#define WD(r) L->slot[r].dtype /* per matrix: a quantized model keeps rows not a multiple of 32 in f16 */

    /* a verified tree's accepted entries to their positions, before this layer's writes */
    for (int i = 0; b->tree && i < b->tree->n_moves; i++) {
        const zs_kv_move *mv = &b->tree->moves[i];
        zs_kv_copy(kv, l, mv->seq, mv->from, mv->to);
    }
    norm(c, f->xn, f->x, WF(L, ZS_R_ATTN_NORM_W, data, res), WF(L, ZS_R_ATTN_NORM_B, data, res), n);
    zs_op_matmul(f->q, f->xn, n, d, W(L, ZS_R_WQ, data, res), WD(ZS_R_WQ), qd, WF(L, ZS_R_BQ, data, res));
    zs_op_matmul(f->k, f->xn, n, d, W(L, ZS_R_WK, data, res), WD(ZS_R_WK), kvd, WF(L, ZS_R_BK, data, res));
    zs_op_matmul(f->v, f->xn, n, d, W(L, ZS_R_WV, data, res), WD(ZS_R_WV), kvd, WF(L, ZS_R_BV, data, res));
    if (f->n_lgrp) {
        LORA_ADD(f, l, ZS_LORA_Q, f->q, qd, f->xn, d);
        LORA_ADD(f, l, ZS_LORA_K, f->k, kvd, f->xn, d);
        LORA_ADD(f, l, ZS_LORA_V, f->v, kvd, f->xn, d);
    }
    if (c->qk_norm) { /* Qwen3, Gemma 3: RMSNorm over each head of q and k */
        zs_op_rmsnorm_off(f->q, f->q, WF(L, ZS_R_Q_NORM, data, res), n * c->n_heads, c->head_dim, c->norm_eps,
                          c->norm_offset);
        zs_op_rmsnorm_off(f->k, f->k, WF(L, ZS_R_K_NORM, data, res), n * c->n_kv_heads, c->head_dim, c->norm_eps,
                          c->norm_offset);
    } else if (c->qk_norm_full) { /* OLMoE: RMSNorm over the whole q and k rows */
        zs_op_rmsnorm_off(f->q, f->q, WF(L, ZS_R_Q_NORM, data, res), n, qd, c->norm_eps, c->norm_offset);
        zs_op_rmsnorm_off(f->k, f->k, WF(L, ZS_R_K_NORM, data, res), n, kvd, c->norm_eps, c->norm_offset);
    }
    if (c->clip_qkv > 0) { /* OLMoE: q, k, v clamped (after the norms, before RoPE; NaN stays NaN) */
        float lim = c->clip_qkv;
        float *const vec[3] = {f->q, f->k, f->v};
        const size_t len[3] = {(size_t)n * qd, (size_t)n * kvd, (size_t)n * kvd};
        for (int t = 0; t < 3; t++)
            for (size_t i = 0; i < len[t]; i++) {
                float x = vec[t][i];
                vec[t][i] = x < -lim ? -lim : x > lim ? lim : x;
            }
    }
    int kind = zs_rope_layer_local(c, l), per_tok = zs_rope_pos_dependent(c, l);
    const int32_t *slot = b->tree ? b->tree->slot : NULL;
    size_t half = (size_t)(c->head_dim / 2);
    for (int i = 0; i < n; i++) {
        float *q = f->q + (size_t)i * qd, *k = f->k + (size_t)i * kvd;
        if (c->arch != ZS_ARCH_GPT2) {
            const float *fr = per_tok ? f->freq_tok + (size_t)i * half : f->freq[kind];
            float af = per_tok ? f->tok_af[i] : f->freq_af[kind];
            zs_op_rope_freq(q, c->n_heads, c->head_dim, b->pos[i], fr, af);
            zs_op_rope_freq(k, c->n_kv_heads, c->head_dim, b->pos[i], fr, af);
        }
        /* into the cache in its element type (16-bit: rounded to nearest even), at its slot */
        zs_kv_write(kv, l, b->seq[i], slot ? slot[i] : b->pos[i], k, f->v + (size_t)i * kvd);
    }
    int rc = attention(f, kv, l, b);
    if (rc < 0) return rc;
    zs_op_matmul(f->xn, f->att, n, qd, W(L, ZS_R_WO, data, res), WD(ZS_R_WO), d, WF(L, ZS_R_BO, data, res));
    if (f->n_lgrp) LORA_ADD(f, l, ZS_LORA_O, f->xn, d, f->att, qd);
    if (c->post_norms) norm(c, f->xn, f->xn, WF(L, ZS_R_POST_ATTN_NORM, data, res), NULL, n);
    zs_op_add(f->x, f->xn, (size_t)n * d);

    norm(c, f->xn, f->x, WF(L, ZS_R_FFN_NORM_W, data, res), WF(L, ZS_R_FFN_NORM_B, data, res), n);
    if (zs_config_layer_moe(c, l)) { /* the sparse block (no LoRA targets here: zs_lora_check_base) */
        if ((rc = moe_block(f, src, l, n, L, data, res)) < 0) return rc;
        if (c->post_norms) norm(c, f->mo, f->mo, WF(L, ZS_R_POST_FFN_NORM, data, res), NULL, n);
        zs_op_add(f->x, f->mo, (size_t)n * d);
        return 0;
    }
    if (c->arch == ZS_ARCH_GPT2) {
        zs_op_matmul(f->h1, f->xn, n, d, W(L, ZS_R_W_UP, data, res), WD(ZS_R_W_UP), ff, WF(L, ZS_R_B_UP, data, res));
        zs_op_gelu(f->h1, (size_t)n * ff);
    } else {
        zs_op_matmul(f->h1, f->xn, n, d, W(L, ZS_R_W_GATE, data, res), WD(ZS_R_W_GATE), ff, WF(L, ZS_R_B_GATE, data, res));
        zs_op_matmul(f->h2, f->xn, n, d, W(L, ZS_R_W_UP, data, res), WD(ZS_R_W_UP), ff, WF(L, ZS_R_B_UP, data, res));
        if (f->n_lgrp) {
            LORA_ADD(f, l, ZS_LORA_GATE, f->h1, ff, f->xn, d);
            LORA_ADD(f, l, ZS_LORA_UP, f->h2, ff, f->xn, d);
        }
        if (c->act) zs_op_geglu(f->h1, f->h1, f->h2, (size_t)n * ff); /* Gemma */
        else zs_op_swiglu(f->h1, f->h1, f->h2, (size_t)n * ff);
    }
    zs_op_matmul(f->xn, f->h1, n, ff, W(L, ZS_R_W_DOWN, data, res), WD(ZS_R_W_DOWN), d, WF(L, ZS_R_B_DOWN, data, res));
    if (f->n_lgrp) LORA_ADD(f, l, ZS_LORA_DOWN, f->xn, d, f->h1, ff);
    if (c->post_norms) norm(c, f->xn, f->xn, WF(L, ZS_R_POST_FFN_NORM, data, res), NULL, n);
    zs_op_add(f->x, f->xn, (size_t)n * d);
#undef WD
    return 0;
}

int zs_forward_run(zs_forward *f, zs_weight_source *src, zs_kvcache *kv, const zs_batch *b,
                   float *logits) {
    const zs_model *m = f->m;
    const zs_model_config *c = zs_model_config_get(m);
    if (b->n <= 0 || b->n > f->max_tokens)
        return zs_err(ZS_EINVAL, "forward: batch of %d tokens (limit %d)", b->n, f->max_tokens);
    ZS_CHECK(zs_batch_check(b, kv, c->max_seq));
    for (int i = 0; i < b->n; i++) {
        if (b->tokens[i] < 0 || b->tokens[i] >= c->vocab_size)
            return zs_err(ZS_ERANGE, "token id %d is out of range [0, %d)", b->tokens[i], c->vocab_size);
        /* a windowed cache's ring must hold every position the sequence's tokens here read and
         * write (a tree: from its root's position to its last slot) */
        if ((i == 0 || b->seq[i - 1] != b->seq[i]) && zs_kv_ring(kv)) {
            const int32_t *slot = b->tree ? b->tree->slot : NULL;
            int j = i, p0 = b->pos[i], p1 = slot ? slot[i] : b->pos[i];
            while (j + 1 < b->n && b->seq[j + 1] == b->seq[i]) {
                j++;
                p0 = ZS_MIN(p0, b->pos[j]);
                p1 = ZS_MAX(p1, slot ? slot[j] : b->pos[j]);
            }
            if (!zs_kv_span_ok(kv, p0, p1))
                return zs_err(ZS_EINVAL, "forward: %d tokens of one sequence in one call are more than the "
                              "windowed KV cache's ring holds", j - i + 1);
        }
    }
    int d = c->dim, rc;
    const void *data = NULL;
    if ((rc = lora_prepare(f, b)) < 0) return rc; /* before anything is acquired */
    if (f->pos_layer >= 0) /* position-dependent RoPE: each token's row, once for every layer */
        for (int i = 0; i < b->n; i++)
            zs_rope_freqs(c, f->pos_layer, b->pos[i], f->freq_tok + (size_t)i * (size_t)(c->head_dim / 2), &f->tok_af[i]);

    /* embeddings: rows of the host lookup tables (embed_lookup: nothing acquired), or of the
     * gathered bucket 0 */
    int eb = zs_bucket_embed(), lookup = zs_model_embed_lookup(m);
    const zs_bucket_layout *E = zs_model_layout(m, eb);
    const void *eres = zs_model_bucket_resident(m, eb);
    if (!lookup && (rc = src->acquire(src->ctx, eb, &data)) < 0) return rc;
    const void *tok_tab = lookup ? zs_model_embed_table(m, ZS_R_TOK_EMB) : W(E, ZS_R_TOK_EMB, data, eres);
    const void *pos_tab = lookup ? zs_model_embed_table(m, ZS_R_POS_EMB) : W(E, ZS_R_POS_EMB, data, eres);
    if (!tok_tab) {
        if (!lookup) src->release(src->ctx, eb);
        return zs_err(ZS_EINVAL, "forward: the embedding table is not loaded");
    }
    for (int i = 0; i < b->n; i++) {
        float *x = f->x + (size_t)i * d;
        zs_op_embed(x, tok_tab, E->slot[ZS_R_TOK_EMB].dtype, d, b->tokens[i]);
        if (pos_tab) {
            zs_op_embed(f->xn, pos_tab, E->slot[ZS_R_POS_EMB].dtype, d, b->pos[i]);
            zs_op_add(x, f->xn, (size_t)d);
        }
        if (c->embed_scale > 0) /* Gemma: times sqrt(hidden) */
            for (int e = 0; e < d; e++) x[e] *= c->embed_scale;
    }
    if (!lookup) src->release(src->ctx, eb);

    for (int l = 0; l < c->n_layers; l++) {
        int lb = zs_bucket_layer(l);
        if ((rc = src->acquire(src->ctx, lb, &data)) < 0) return rc;
        /* layer-streamed sequences: their layer-l K/V arrive before, and go back after (kvstream.h) */
        if ((rc = zs_kv_layer(kv, l, 0, b->seq, b->n)) == 0) {
            rc = layer_forward(f, src, kv, l, b, data, zs_model_bucket_resident(m, lb)); /* + its experts */
            int rc2 = zs_kv_layer(kv, l, 1, b->seq, b->n);
            if (rc == 0) rc = rc2;
        }
        src->release(src->ctx, lb);
        if (rc < 0) return rc;
    }

    /* final norm + LM head for the rows that want logits; a tied head reads the embedding
     * bucket after the head bucket (zs_model_pass_order) */
    int hb = zs_bucket_head(m);
    const zs_bucket_layout *H = zs_model_layout(m, hb);
    const void *hres = zs_model_bucket_resident(m, hb);
    if ((rc = src->acquire(src->ctx, hb, &data)) < 0) return rc;
    for (int i = 0; i < b->n; i++) {
        if (b->logits_idx[i] < 0) continue;
        norm(c, f->xn + (size_t)b->logits_idx[i] * d, f->x + (size_t)i * d, WF(H, ZS_R_OUT_NORM_W, data, hres),
             WF(H, ZS_R_OUT_NORM_B, data, hres), 1);
    }
    if (b->hidden) /* every token's final-normed row, one row at a time like the logits rows above */
        for (int i = 0; i < b->n; i++)
            norm(c, b->hidden + (size_t)i * d, f->x + (size_t)i * d, WF(H, ZS_R_OUT_NORM_W, data, hres),
                 WF(H, ZS_R_OUT_NORM_B, data, hres), 1);
    if (!c->tied_embeddings && b->n_logits > 0)
        zs_op_matmul(logits, f->xn, b->n_logits, d, W(H, ZS_R_LM_HEAD, data, hres),
                     H->slot[ZS_R_LM_HEAD].dtype, c->vocab_size, NULL);
    src->release(src->ctx, hb);
    if (c->tied_embeddings) {
        if ((rc = src->acquire(src->ctx, eb, &data)) < 0) return rc;
        if (b->n_logits > 0)
            zs_op_matmul(logits, f->xn, b->n_logits, d, W(E, ZS_R_TOK_EMB, data, eres),
                         E->slot[ZS_R_TOK_EMB].dtype, c->vocab_size, NULL);
        src->release(src->ctx, eb);
    }
    if (c->final_softcap > 0 && b->n_logits > 0) /* Gemma 2 */
        zs_op_softcap(logits, (size_t)b->n_logits * (size_t)c->vocab_size, c->final_softcap);
    return 0;
}
