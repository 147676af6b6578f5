/* test-families.c — the model families and RoPE scalings against Hugging Face transformers (the
 * definition), from the reference data tests/ref/make_family_ref.py recorded (no torch needed
 * here): Llama with llama3 / linear / dynamic RoPE, Qwen2 with YaRN (qkv biases), Qwen3 (qk norm),
 * Gemma 2 (softcaps, alternating sliding window, GeGLU, post norms, 1 + w norms, embedding
 * scale), Gemma 3 (5 local layers with their own RoPE base + 1 global with linear x8, qk norm),
 * Phi-3 (fused qkv / gate_up split at load, LongRoPE, sliding window) and Mistral (sliding
 * window, head_dim 128).
 *
 * Per case it regenerates the model exactly as `zeroserve init-model <args>` does (the library
 * calls of server/main.c's cmd_init_model; the safetensors checksum must equal the reference's),
 * then:
 *   - logits of a 192-token sequence at 8 positions (past the RoPE scaling's original length and
 *     the sliding window) through the KV cache, prefilled in chunks then token by token, and again
 *     as one prefill of the whole sequence, against transformers' token-by-token logits: max
 *     |d| <= LOGIT_TOL;
 *   - one training pass (zs_trainer, B=2 sequences of T > window tokens, 3 targets masked): the
 *     loss within 1e-5 relative, and the gradient of every Hugging Face parameter (our slots put
 *     back together: Phi-3's qkv_proj = q|k|v rows, gate_up_proj = gate|up): its L2 norm, its
 *     largest element and 64 sampled elements within GRAD_TOL relative.
 * Prints "family: logits max|d| = X, grads max rel = Y" per case. */
#include <float.h>

#include "backward.h"
#include "cli.h"
#include "common.h"
#include "init-cmd.h"
#include "init-model.h"
#include "model.h"
#include "ref.h"
#include "testmodel.h"
#include "testutil.h"

#define REF_JSON "tests/ref/family-ref.json"
#define LOGIT_TOL 1e-5   /* absolute (logits of magnitude ~1; the code meets ~1e-6) */
#define GRAD_TOL 1e-4    /* relative (norms; L2 over the sampled elements; the code meets ~3e-6) */

/* ---- the model: init-model's flags, through the CLI's own parser (server/init-cmd.c) ---- */

/* ---- inference ---- */

typedef struct {
    zs_model *m;
    zs_kvcache *kv;
    zs_forward *f;
    zs_weight_source src;
    const zs_model_config *c;
} infer_rig;

static int infer_open(infer_rig *r, const char *dir, int max_tokens) {
    memset(r, 0, sizeof *r);
    zs_model_opts o;
    zs_model_opts_default(&o);
    o.embed_lookup = 1; /* as generate / serve open it */
    int rc = zs_model_open(dir, &o, &r->m);
    if (rc < 0) return rc;
    r->c = zs_model_config_get(r->m);
    if ((rc = zs_model_load_resident(r->m)) < 0) return rc;
    zs_model_close_checkpoint(r->m);
    if ((rc = zs_kv_init(r->c->n_layers, r->c->n_kv_heads * r->c->head_dim, 64, 2, r->c->max_seq, &r->kv)) < 0)
        return rc;
    if ((rc = zs_forward_new(r->m, max_tokens, &r->f)) < 0) return rc;
    r->src = zs_model_resident_source(r->m);
    return 0;
}

static void infer_close(infer_rig *r) {
    zs_forward_free(r->f);
    zs_kv_free(r->kv);
    zs_model_free(r->m);
}

/* Runs ids[0..n) of a fresh sequence in chunks that end at the offsets in cuts[] (then one token
 * per call after the last cut); the logits of positions want[0..nw) into out[nw * vocab]. */
static int run_sequence(infer_rig *r, const int32_t *ids, int n, const int *cuts, int ncuts, const int *want,
                        int nw, float *out) {
    int seq, rc, V = r->c->vocab_size;
    if ((rc = zs_kv_seq_open(r->kv, &seq)) < 0) return rc;
    int32_t *pos = tu_xcalloc(sizeof(int32_t) * (size_t)n), *sq = tu_xcalloc(sizeof(int32_t) * (size_t)n);
    int32_t *li = tu_xcalloc(sizeof(int32_t) * (size_t)n);
    float *lg = tu_xcalloc(sizeof(float) * (size_t)n * V);
    int start = 0, k = 0;
    while (rc == 0 && start < n) {
        int end = k < ncuts ? cuts[k++] : start + 1;
        if (end > n) end = n;
        int nl = 0, cnt = end - start;
        for (int i = 0; i < cnt; i++) {
            pos[i] = start + i;
            sq[i] = seq;
            li[i] = -1;
            for (int w = 0; w < nw; w++)
                if (want[w] == start + i) li[i] = nl++;
        }
        zs_batch b = {cnt, ids + start, pos, sq, li, nl, NULL, NULL, NULL};
        rc = zs_kv_seq_reserve(r->kv, seq, end);
        if (rc == 0) rc = zs_forward_run(r->f, &r->src, r->kv, &b, lg);
        for (int i = 0; rc == 0 && i < cnt; i++)
            for (int w = 0; w < nw; w++)
                if (want[w] == start + i) memcpy(out + (size_t)w * V, lg + (size_t)li[i] * V, sizeof(float) * V);
        start = end;
    }
    zs_kv_seq_close(r->kv, seq);
    free(pos); free(sq); free(li); free(lg);
    return rc;
}

/* ---- training: HF parameter name -> our slots ---- */

typedef struct { int bucket, nparts, roles[3]; } hf_map;

static int map_name(const zs_model *m, const zs_model_config *c, const char *name, hf_map *mp) {
    int l, h = zs_bucket_head(m), gemma = c->post_norms;
    char rest[128];
    memset(mp, 0, sizeof *mp);
    mp->nparts = 1;
#define ONE(b, role) do { mp->bucket = (b); mp->roles[0] = (role); return 0; } while (0)
    if (!strcmp(name, "model.embed_tokens.weight")) ONE(0, ZS_R_TOK_EMB);
    if (!strcmp(name, "model.norm.weight")) ONE(h, ZS_R_OUT_NORM_W);
    if (!strcmp(name, "lm_head.weight")) ONE(h, ZS_R_LM_HEAD);
    if (sscanf(name, "model.layers.%d.%127s", &l, rest) != 2 || l < 0 || l >= c->n_layers) return -1;
    int b = zs_bucket_layer(l);
    if (!strcmp(rest, "post_attention_layernorm.weight")) ONE(b, gemma ? ZS_R_POST_ATTN_NORM : ZS_R_FFN_NORM_W);
    if (!strcmp(rest, "pre_feedforward_layernorm.weight") && gemma) ONE(b, ZS_R_FFN_NORM_W);
    if (!strcmp(rest, "post_feedforward_layernorm.weight") && gemma) ONE(b, ZS_R_POST_FFN_NORM);
    static const struct { const char *n; int role; } tab[] = {
        {"input_layernorm.weight", ZS_R_ATTN_NORM_W},
        {"self_attn.q_proj.weight", ZS_R_WQ}, {"self_attn.k_proj.weight", ZS_R_WK},
        {"self_attn.v_proj.weight", ZS_R_WV}, {"self_attn.o_proj.weight", ZS_R_WO},
        {"self_attn.q_proj.bias", ZS_R_BQ},   {"self_attn.k_proj.bias", ZS_R_BK},
        {"self_attn.v_proj.bias", ZS_R_BV},   {"self_attn.o_proj.bias", ZS_R_BO},
        {"self_attn.q_norm.weight", ZS_R_Q_NORM}, {"self_attn.k_norm.weight", ZS_R_K_NORM},
        {"mlp.gate_proj.weight", ZS_R_W_GATE}, {"mlp.up_proj.weight", ZS_R_W_UP},
        {"mlp.down_proj.weight", ZS_R_W_DOWN}};
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
        if (!strcmp(rest, tab[i].n)) ONE(b, tab[i].role);
#undef ONE
    mp->bucket = b;
    if (!strcmp(rest, "self_attn.qkv_proj.weight")) { /* Phi-3: rows q | k | v */
        mp->nparts = 3;
        mp->roles[0] = ZS_R_WQ; mp->roles[1] = ZS_R_WK; mp->roles[2] = ZS_R_WV;
        return 0;
    }
    if (!strcmp(rest, "mlp.gate_up_proj.weight")) { /* Phi-3: rows gate | up */
        mp->nparts = 2;
        mp->roles[0] = ZS_R_W_GATE; mp->roles[1] = ZS_R_W_UP;
        return 0;
    }
    return -1;
}

typedef struct {
    zs_model *m;
    const zs_model_config *c;
    int nb;
    float **gd, **gr;
} train_rig;

/* Our gradient of one HF tensor in HF layout (row concatenation of [out, in] parts); numel or -1
 * (a tu_grad_fn over a train_rig). */
static long hf_grad(void *ctx, const char *name, float *out, long cap) {
    const train_rig *r = ctx;
    hf_map mp;
    if (map_name(r->m, r->c, name, &mp) < 0) return -1;
    long off = 0;
    for (int p = 0; p < mp.nparts; p++) {
        const zs_slot *s = &zs_model_grad_layout(r->m, mp.bucket)->slot[mp.roles[p]];
        if (!s->present) return -1;
        long n = (long)(s->shape[0] * (s->ndim > 1 ? s->shape[1] : 1));
        if (off + n > cap) return -1;
        const float *g = (const float *)(const void *)((const char *)(s->resident ? r->gr[mp.bucket]
                                                                                : r->gd[mp.bucket]) + s->offset);
        memcpy(out + off, g, sizeof(float) * (size_t)n);
        off += n;
    }
    return off;
}

static int train_pass(train_rig *r, zs_trainer *t, const int32_t *tok, const int32_t *tgt, float *loss) {
    int L = r->c->n_layers, h = zs_bucket_head(r->m), rc;
    const void *pd[ZS_MAX_LAYERS + 2], *pr[ZS_MAX_LAYERS + 2];
    for (int b = 0; b < r->nb; b++) {
        pd[b] = zs_model_bucket_data(r->m, b);
        pr[b] = zs_model_bucket_resident(r->m, b);
    }
    if ((rc = zs_train_embed_fwd(t, pd[0], pr[0], tok)) < 0) return rc;
    for (int l = 0; l < L; l++)
        if ((rc = zs_train_layer_fwd(t, l, pd[1 + l], pr[1 + l])) < 0) return rc;
    if ((rc = zs_train_head(t, pd[h], pr[h], pd[0], pr[0], tgt, loss, r->gd[h], r->gr[h], r->gd[0], r->gr[0])) < 0)
        return rc;
    for (int l = L - 1; l >= 0; l--)
        if ((rc = zs_train_layer_bwd(t, l, pd[1 + l], pr[1 + l], r->gd[1 + l], r->gr[1 + l])) < 0) return rc;
    return zs_train_embed_bwd(t, NULL, NULL, r->gd[0], r->gr[0]);
}

/* ---- one case ---- */

typedef struct { double logit_d, grad_rel, loss_rel; } figures;

static void check_logits(const char *name, const char *dir, json_t *cs, const float *bin, long nbin, figures *fg) {
    infer_rig r;
    int rc = infer_open(&r, dir, 256);
    CHECK(rc == 0, "%s: open: %s", name, zs_errmsg());
    if (rc < 0) return;
    int V = r.c->vocab_size;
    int32_t ids[1024];
    int n = tu_ref_ids(json_object_get(cs, "tokens"), ids, 1024);
    int want[64];
    json_t *wp = json_object_get(cs, "logit_positions");
    int nw = (int)json_array_size(wp);
    if (nw > 64) nw = 64;
    for (int i = 0; i < nw; i++) want[i] = (int)json_integer_value(json_array_get(wp, i));
    long off = (long)json_integer_value(json_object_get(cs, "logits_offset"));
    CHECK(V == (int)json_integer_value(json_object_get(cs, "vocab")) && off + (long)nw * V <= nbin && n <= 1024,
          "%s: reference sizes", name);
    if (V != (int)json_integer_value(json_object_get(cs, "vocab")) || off + (long)nw * V > nbin) {
        infer_close(&r);
        return;
    }
    const float *ref = bin + off;
    float *out = tu_xcalloc(sizeof(float) * (size_t)nw * V);
    /* chunked prefill (cuts inside the window and across the original context), then token by token;
     * and one prefill of everything */
    const int cuts_a[] = {37, 60, 101}, cuts_b[] = {n};
    const struct { const char *what; const int *cuts; int ncuts; } runs[] = {
        {"chunks 37/23/41 then token by token", cuts_a, 3}, {"one prefill", cuts_b, 1}};
    for (int k = 0; k < 2; k++) {
        memset(out, 0, sizeof(float) * (size_t)nw * V);
        rc = run_sequence(&r, ids, n, runs[k].cuts, runs[k].ncuts, want, nw, out);
        CHECK(rc == 0, "%s: %s: %s", name, runs[k].what, zs_errmsg());
        double worst = 0;
        int wpos = 0;
        for (int w = 0; w < nw; w++) {
            double dw = 0;
            for (int v = 0; v < V; v++) {
                double d = fabs((double)out[(size_t)w * V + v] - ref[(size_t)w * V + v]);
                if (!(d <= dw)) dw = d; /* NaN counts as worst */
            }
            if (!(dw <= worst)) { worst = dw; wpos = want[w]; }
            CHECK(dw <= LOGIT_TOL, "%s: %s: logits at position %d: max |d| %.3g > %.0e", name, runs[k].what,
                  want[w], dw, LOGIT_TOL);
        }
        fprintf(stderr, "%s: %s: logits max |d| %.3g (at position %d)\n", name, runs[k].what, worst, wpos);
        if (!(worst <= fg->logit_d)) fg->logit_d = worst;
    }
    free(out);
    infer_close(&r);
}

static void check_grads(const char *name, const char *dir, json_t *cs, const float *bin, long nbin, figures *fg) {
    json_t *tr = json_object_get(cs, "train");
    int B = (int)json_integer_value(json_object_get(tr, "B")), T = (int)json_integer_value(json_object_get(tr, "T"));
    int ns = (int)json_integer_value(json_object_get(tr, "n_sample"));
    if (B <= 0 || T <= 0 || B * T > 4096 || ns < 0 || ns > 4096) { CHECK(0, "%s: train sizes", name); return; }
    int32_t *tok = tu_xcalloc(sizeof(int32_t) * (size_t)(B * T)), *tgt = tu_xcalloc(sizeof(int32_t) * (size_t)(B * T));
    tu_ref_rows(json_object_get(tr, "tokens"), B, T, tok);
    tu_ref_rows(json_object_get(tr, "targets"), B, T, tgt);
    train_rig r;
    memset(&r, 0, sizeof r);
    zs_model_opts o;
    zs_model_opts_default(&o);
    int rc = zs_model_open(dir, &o, &r.m);
    if (rc == 0) rc = zs_model_load_resident(r.m);
    CHECK(rc == 0, "%s: open for training: %s", name, zs_errmsg());
    if (rc < 0) { zs_model_free(r.m); free(tok); free(tgt); return; }
    zs_model_close_checkpoint(r.m);
    r.c = zs_model_config_get(r.m);
    r.nb = zs_model_n_buckets(r.m);
    r.gd = tu_xcalloc(sizeof(float *) * (size_t)r.nb);
    r.gr = tu_xcalloc(sizeof(float *) * (size_t)r.nb);
    for (int b = 0; b < r.nb; b++) {
        const zs_bucket_layout *GL = zs_model_grad_layout(r.m, b);
        r.gd[b] = tu_xcalloc(GL->data_bytes);
        r.gr[b] = tu_xcalloc(GL->resident_bytes);
    }
    zs_trainer *t = NULL;
    rc = zs_trainer_new(r.m, B, T, &t);
    CHECK(rc == 0, "%s: trainer: %s", name, zs_errmsg());
    float loss = 0;
    if (rc == 0) rc = train_pass(&r, t, tok, tgt, &loss);
    CHECK(rc == 0, "%s: training pass: %s", name, zs_errmsg());
    double want_loss = json_real_value(json_object_get(tr, "loss"));
    fg->loss_rel = fabs(loss - want_loss) / fabs(want_loss);
    CHECK(fg->loss_rel <= 1e-5, "%s: loss %.8f vs transformers %.8f (rel %.2e)", name, loss, want_loss, fg->loss_rel);
    tu_grad_sum gs = {0, "", 0};
    if (rc == 0) tu_ref_grads(name, json_object_get(tr, "tensors"), ns, bin, nbin, hf_grad, &r, GRAD_TOL, &gs);
    fg->grad_rel = gs.worst;
    CHECK(rc != 0 || gs.total == (long)zs_model_param_count(r.m), "%s: compared %ld of %zu parameters", name, gs.total,
          zs_model_param_count(r.m));
    fprintf(stderr, "%s: loss %.7f (transformers %.7f, rel %.2e); worst gradient rel %.2e (%s)\n", name, loss,
            want_loss, fg->loss_rel, fg->grad_rel, gs.worst_name);
    zs_trainer_free(t);
    for (int b = 0; b < r.nb; b++) { free(r.gd[b]); free(r.gr[b]); }
    free(r.gd); free(r.gr);
    zs_model_free(r.m);
    free(tok); free(tgt);
}

static void family_case(tu_ref_case *c, void *ctx) {
    (void)ctx;
    figures fg = {0, 0, 0};
    check_logits(c->name, c->dir, c->cs, c->ref->bin, c->ref->nbin, &fg);
    check_grads(c->name, c->dir, c->cs, c->ref->bin, c->ref->nbin, &fg);
    snprintf(c->line, sizeof c->line, "%s: logits max|d| = %.2e, grads max rel = %.2e (loss rel %.1e)", c->name,
             fg.logit_d, fg.grad_rel, fg.loss_rel);
}

int main(int argc, char **argv) {
    const char *only = argc > 1 ? argv[1] : NULL; /* test-families [CASE]: one case */
    if (tu_ref_run(REF_JSON, NULL, "families", "tests/ref/make_family_ref.py", only, family_case, NULL) < 0) return 1;
    fprintf(stderr, "(tolerances: logits %.0e absolute, gradients %.0e relative)\n", LOGIT_TOL, GRAD_TOL);
    return tu_finish("test-families");
}
