/* test-grad.c — the training forward/backward (engine/backward.c, kernels/cpu/ops-backward.c)
 * against PyTorch reference data recorded by tests/ref/make_train_ref.py (no torch needed here):
 * for stories260K (Llama: RMSNorm, RoPE, GQA, SwiGLU, tied head) and gpt2-bytes (GPT-2:
 * LayerNorm, GELU, biases, learned positions, Conv1D weights, tied head) on a fixed masked batch:
 *   - the loss within 1e-5 relative, the gradient of EVERY parameter within 1e-4 relative L2
 *     (our [out,in] slots mapped back to the Hugging Face tensors: GPT-2 Conv1D transposed,
 *     c_attn = q|k|v);
 *   - the losses of 5 AdamW steps (an AdamW written here, the torch.optim.AdamW update rule, on
 *     f32 copies of the weights);
 *   - central finite differences on chosen coordinates (independent of the reference);
 *   - accumulation (+=) over two passes, everything-resident layout, f16/bf16 weights, errors. */
#include "backward.h"
#include "common.h"
#include "model.h"
#include "ref.h"
#include "testmodel.h"
#include "testutil.h"

#define REF_DIR "tests/ref"

typedef struct {
    zs_model *m;
    const zs_model_config *c;
    int nb;
    void **pd, **pr;    /* weights: data / resident area of each bucket */
    float **gd, **gr;   /* gradients, grad layout */
    int own_weights;    /* pd/pr are our f32 copies (else the model's buffers) */
} rig;

/* Opens a model; own = 1 copies its (f32) weights into mutable buffers. */
static int rig_open(rig *r, const char *dir, zs_dtype wdt, int64_t threshold, int own) {
    memset(r, 0, sizeof *r);
    zs_model_opts o;
    zs_model_opts_default(&o);
    o.weight_dtype = wdt;
    o.persist_threshold = threshold;
    int rc = zs_model_open(dir, &o, &r->m);
    if (rc < 0) return rc;
    if ((rc = zs_model_load_resident(r->m)) < 0) return rc;
    zs_model_close_checkpoint(r->m);
    r->c = zs_model_config_get(r->m);
    r->nb = zs_model_n_buckets(r->m);
    r->pd = tu_xcalloc(sizeof(void *) * (size_t)r->nb);
    r->pr = tu_xcalloc(sizeof(void *) * (size_t)r->nb);
    r->gd = tu_xcalloc(sizeof(float *) * (size_t)r->nb);
    r->gr = tu_xcalloc(sizeof(float *) * (size_t)r->nb);
    r->own_weights = own;
    for (int b = 0; b < r->nb; b++) {
        const zs_bucket_layout *L = zs_model_layout(r->m, b), *GL = zs_model_grad_layout(r->m, b);
        if (own) {
            /* f32 weights: the storage layout is the grad layout, so the copies double as masters */
            if (L->data_bytes != GL->data_bytes || L->resident_bytes != GL->resident_bytes) return ZS_EINVAL;
            r->pd[b] = tu_xcalloc(L->data_bytes);
            r->pr[b] = tu_xcalloc(L->resident_bytes);
            memcpy(r->pd[b], zs_model_bucket_data(r->m, b), L->data_bytes);
            memcpy(r->pr[b], zs_model_bucket_resident(r->m, b), L->resident_bytes);
        } else {
            r->pd[b] = (void *)zs_model_bucket_data(r->m, b);
            r->pr[b] = (void *)zs_model_bucket_resident(r->m, b);
        }
        r->gd[b] = tu_xcalloc(GL->data_bytes);
        r->gr[b] = tu_xcalloc(GL->resident_bytes);
    }
    return 0;
}

static void rig_zero_grads(rig *r) {
    for (int b = 0; b < r->nb; b++) {
        const zs_bucket_layout *GL = zs_model_grad_layout(r->m, b);
        memset(r->gd[b], 0, GL->data_bytes);
        memset(r->gr[b], 0, GL->resident_bytes);
    }
}

static void rig_close(rig *r) {
    for (int b = 0; b < r->nb; b++) {
        if (r->own_weights) { free(r->pd[b]); free(r->pr[b]); }
        free(r->gd[b]);
        free(r->gr[b]);
    }
    free(r->pd); free(r->pr); free(r->gd); free(r->gr);
    zs_model_free(r->m);
}

/* One micro-batch: forward, head, and (backward != 0) the backward, accumulating into r's grads. */
static int run_pass(rig *r, zs_trainer *t, const int32_t *tok, const int32_t *tgt, float *loss, int backward) {
    int L = r->c->n_layers, h = zs_bucket_head(r->m), rc;
    if ((rc = zs_train_embed_fwd(t, r->pd[0], r->pr[0], tok)) < 0) return rc;
    for (int l = 0; l < L; l++)
        if ((rc = zs_train_layer_fwd(t, l, r->pd[1 + l], r->pr[1 + l])) < 0) return rc;
    if (!backward) /* evaluation: loss only, no gradient touched */
        return zs_train_head(t, r->pd[h], r->pr[h], r->pd[0], r->pr[0], tgt, loss, NULL, NULL, NULL, NULL);
    if ((rc = zs_train_head(t, r->pd[h], r->pr[h], r->pd[0], r->pr[0], tgt, loss, r->gd[h], r->gr[h], r->gd[0],
                            r->gr[0])) < 0)
        return rc;
    for (int l = L - 1; l >= 0; l--)
        if ((rc = zs_train_layer_bwd(t, l, r->pd[1 + l], r->pr[1 + l], r->gd[1 + l], r->gr[1 + l])) < 0) return rc;
    return zs_train_embed_bwd(t, NULL, NULL, r->gd[0], r->gr[0]);
}

/* ---- HF name -> our slots ---- */

typedef struct {
    int bucket, nparts, roles[3];
    int transpose; /* HF [in, nparts*out] (Conv1D) from our [out, in] parts; else flat concatenation */
} hf_map;

static int map_name(const rig *r, const char *name, hf_map *mp) {
    int l, h = zs_bucket_head(r->m);
    char rest[128];
    memset(mp, 0, sizeof *mp);
    mp->nparts = 1;
#define ONE(b, role) do { mp->bucket = (b); mp->roles[0] = (role); return 0; } while (0)
    if (r->c->arch == ZS_ARCH_GPT2) {
        if (!strcmp(name, "transformer.wte.weight")) ONE(0, ZS_R_TOK_EMB);
        if (!strcmp(name, "transformer.wpe.weight")) ONE(0, ZS_R_POS_EMB);
        if (!strcmp(name, "transformer.ln_f.weight")) ONE(h, ZS_R_OUT_NORM_W);
        if (!strcmp(name, "transformer.ln_f.bias")) ONE(h, ZS_R_OUT_NORM_B);
        if (sscanf(name, "transformer.h.%d.%127s", &l, rest) != 2) return -1;
        int b = zs_bucket_layer(l);
        if (!strcmp(rest, "ln_1.weight")) ONE(b, ZS_R_ATTN_NORM_W);
        if (!strcmp(rest, "ln_1.bias")) ONE(b, ZS_R_ATTN_NORM_B);
        if (!strcmp(rest, "ln_2.weight")) ONE(b, ZS_R_FFN_NORM_W);
        if (!strcmp(rest, "ln_2.bias")) ONE(b, ZS_R_FFN_NORM_B);
        mp->bucket = b;
        if (!strcmp(rest, "attn.c_attn.weight") || !strcmp(rest, "attn.c_attn.bias")) {
            int w = !strcmp(rest, "attn.c_attn.weight");
            mp->nparts = 3;
            mp->transpose = w;
            mp->roles[0] = w ? ZS_R_WQ : ZS_R_BQ;
            mp->roles[1] = w ? ZS_R_WK : ZS_R_BK;
            mp->roles[2] = w ? ZS_R_WV : ZS_R_BV;
            return 0;
        }
        mp->transpose = 1;
        if (!strcmp(rest, "attn.c_proj.weight")) ONE(b, ZS_R_WO);
        if (!strcmp(rest, "mlp.c_fc.weight")) ONE(b, ZS_R_W_UP);
        if (!strcmp(rest, "mlp.c_proj.weight")) ONE(b, ZS_R_W_DOWN);
        mp->transpose = 0;
        if (!strcmp(rest, "attn.c_proj.bias")) ONE(b, ZS_R_BO);
        if (!strcmp(rest, "mlp.c_fc.bias")) ONE(b, ZS_R_B_UP);
        if (!strcmp(rest, "mlp.c_proj.bias")) ONE(b, ZS_R_B_DOWN);
        return -1;
    }
    if (!strcmp(name, "model.embed_tokens.weight")) ONE(0, ZS_R_TOK_EMB);
    if (!strcmp(name, "model.norm.weight")) ONE(h, ZS_R_OUT_NORM_W);
    if (!strcmp(name, "lm_head.weight")) ONE(h, ZS_R_LM_HEAD);
    if (sscanf(name, "model.layers.%d.%127s", &l, rest) != 2) return -1;
    int b = zs_bucket_layer(l);
    static const struct { const char *n; int role; } tab[] = {
        {"input_layernorm.weight", ZS_R_ATTN_NORM_W}, {"post_attention_layernorm.weight", ZS_R_FFN_NORM_W},
        {"self_attn.q_proj.weight", ZS_R_WQ},        {"self_attn.k_proj.weight", ZS_R_WK},
        {"self_attn.v_proj.weight", ZS_R_WV},        {"self_attn.o_proj.weight", ZS_R_WO},
        {"mlp.gate_proj.weight", ZS_R_W_GATE},       {"mlp.up_proj.weight", ZS_R_W_UP},
        {"mlp.down_proj.weight", ZS_R_W_DOWN}};
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
        if (!strcmp(rest, tab[i].n)) ONE(b, tab[i].role);
#undef ONE
    return -1;
}

/* A slot's f32 values in an area pair (grads, or the f32 weight copies). */
static float *slot_ptr(const rig *r, int b, int role, void **data, void **res) {
    const zs_slot *s = &zs_model_grad_layout(r->m, b)->slot[role];
    return (float *)(void *)((char *)(s->resident ? res[b] : data[b]) + s->offset);
}

/* Our gradient of one HF tensor, in HF layout, into out[numel]; returns numel or -1. */
static long hf_grad(const rig *r, const char *name, float *out, long cap) {
    hf_map mp;
    if (map_name(r, name, &mp) < 0) return -1;
    long n = 0;
    for (int p = 0; p < mp.nparts; p++) {
        const zs_slot *s = &zs_model_grad_layout(r->m, mp.bucket)->slot[mp.roles[p]];
        if (!s->present) return -1;
        n += (long)(s->shape[0] * s->shape[1]);
    }
    if (n > cap) return -1;
    long off = 0;
    for (int p = 0; p < mp.nparts; p++) {
        const zs_slot *s = &zs_model_grad_layout(r->m, mp.bucket)->slot[mp.roles[p]];
        const float *g = slot_ptr(r, mp.bucket, mp.roles[p], (void **)r->gd, (void **)r->gr);
        long rows = (long)s->shape[0], cols = (long)s->shape[1];
        if (mp.transpose) { /* HF [in=cols, nparts*rows]: hf[i][p*rows + o] = ours[o][i] */
            for (long o = 0; o < rows; o++)
                for (long i = 0; i < cols; i++) out[i * (mp.nparts * rows) + p * rows + o] = g[o * cols + i];
        } else {
            memcpy(out + off, g, (size_t)(rows * cols) * sizeof(float));
        }
        off += rows * cols;
    }
    return n;
}

/* ---- reference ---- */

typedef struct {
    tu_ref r; /* the document (j) and its floats (bin, nfloats) */
    json_t *j;
    float *bin;
    long nfloats;
    int B, T;
    int32_t *tok, *tgt;
    float loss;
    double adam_losses[16];
    int n_adam;
    zs_adamw_params adam;
} ref;

static int ref_load(ref *f, const char *model) {
    char p[512];
    memset(f, 0, sizeof *f);
    snprintf(p, sizeof p, REF_DIR "/%s-train.json", model);
    if (tu_ref_load(&f->r, p, NULL) < 0) return -1;
    f->j = f->r.doc;
    f->bin = f->r.bin;
    f->nfloats = f->r.nbin;
    f->B = (int)json_integer_value(json_object_get(f->j, "B"));
    f->T = (int)json_integer_value(json_object_get(f->j, "T"));
    f->loss = (float)json_real_value(json_object_get(f->j, "loss"));
    f->tok = tu_xcalloc(sizeof(int32_t) * (size_t)(f->B * f->T));
    f->tgt = tu_xcalloc(sizeof(int32_t) * (size_t)(f->B * f->T));
    tu_ref_rows(json_object_get(f->j, "tokens"), f->B, f->T, f->tok);
    tu_ref_rows(json_object_get(f->j, "targets"), f->B, f->T, f->tgt);
    json_t *a = json_object_get(f->j, "adamw");
    tu_ref_adamw(a, &f->adam);
    json_t *ls = json_object_get(a, "losses");
    f->n_adam = (int)json_array_size(ls);
    if (f->n_adam > 16) f->n_adam = 16;
    for (int i = 0; i < f->n_adam; i++) f->adam_losses[i] = json_real_value(json_array_get(ls, i));
    return 0;
}

static void ref_free(ref *f) {
    tu_ref_free(&f->r);
    free(f->tok); free(f->tgt);
}

/* Compares every tensor's gradient; returns the worst relative L2 error (-1 on a mapping error). */
static double compare_grads(const rig *r, const ref *f, double tol, const char *tag, int verbose) {
    json_t *ts = json_object_get(f->j, "tensors");
    float *buf = tu_xcalloc(sizeof(float) * (size_t)f->nfloats);
    double worst = 0.0;
    long total = 0;
    for (size_t i = 0; i < json_array_size(ts); i++) {
        json_t *e = json_array_get(ts, i);
        const char *name = json_string_value(json_object_get(e, "name"));
        long off = (long)json_integer_value(json_object_get(e, "offset"));
        long numel = (long)json_integer_value(json_object_get(e, "numel"));
        long n = hf_grad(r, name, buf, f->nfloats);
        CHECK(n == numel, "%s: %s maps to %ld values, reference has %ld", tag, name, n, numel);
        if (n != numel) { worst = -1; continue; }
        total += n;
        double num = 0, den = 0;
        for (long k = 0; k < n; k++) {
            double dlt = (double)buf[k] - f->bin[off + k];
            num += dlt * dlt;
            den += (double)f->bin[off + k] * f->bin[off + k];
        }
        double rel = sqrt(num) / (sqrt(den) > 0 ? sqrt(den) : 1.0);
        if (verbose) fprintf(stderr, "  %-45s |g| %.4e  rel L2 err %.2e\n", name, sqrt(den), rel);
        CHECK(rel <= tol, "%s: gradient of %s: relative L2 error %.3e > %.1e", tag, name, rel, tol);
        if (rel > worst) worst = rel;
    }
    CHECK(total == (long)zs_model_param_count(r->m), "%s: compared %ld of %zu parameters", tag, total,
          zs_model_param_count(r->m));
    free(buf);
    return worst;
}

/* AdamW (torch.optim.AdamW rule) over every f32 weight of every bucket, step s (1-based). */
typedef struct { float **md, **mr, **vd, **vr; } adam_state;

static void adam_area(float *p, const float *g, float *m, float *v, size_t n, const ref *f, int s) {
    float lr = f->adam.lr, b1 = f->adam.beta1, b2 = f->adam.beta2, eps = f->adam.eps, wd = f->adam.weight_decay;
    float bc1 = 1.0f - powf(b1, (float)s), bc2 = 1.0f - powf(b2, (float)s);
    float step = lr / bc1, sq2 = sqrtf(bc2);
    for (size_t i = 0; i < n; i++) {
        p[i] *= 1.0f - lr * wd;
        m[i] = m[i] * b1 + g[i] * (1.0f - b1);
        v[i] = v[i] * b2 + g[i] * g[i] * (1.0f - b2);
        p[i] -= step * m[i] / (sqrtf(v[i]) / sq2 + eps);
    }
}

static void test_adamw(rig *r, zs_trainer *t, const ref *f, const char *tag) {
    adam_state a;
    a.md = tu_xcalloc(sizeof(float *) * (size_t)r->nb); a.mr = tu_xcalloc(sizeof(float *) * (size_t)r->nb);
    a.vd = tu_xcalloc(sizeof(float *) * (size_t)r->nb); a.vr = tu_xcalloc(sizeof(float *) * (size_t)r->nb);
    for (int b = 0; b < r->nb; b++) {
        const zs_bucket_layout *GL = zs_model_grad_layout(r->m, b);
        a.md[b] = tu_xcalloc(GL->data_bytes); a.vd[b] = tu_xcalloc(GL->data_bytes);
        a.mr[b] = tu_xcalloc(GL->resident_bytes); a.vr[b] = tu_xcalloc(GL->resident_bytes);
    }
    double worst = 0;
    for (int s = 0; s < f->n_adam; s++) {
        float loss = 0;
        rig_zero_grads(r);
        int rc = run_pass(r, t, f->tok, f->tgt, &loss, s + 1 < f->n_adam);
        CHECK(rc == 0, "%s: pass %d: %s", tag, s, zs_errmsg());
        double rel = fabs(loss - f->adam_losses[s]) / fabs(f->adam_losses[s]);
        fprintf(stderr, "%s: AdamW loss after %d steps %.7f (torch %.7f, rel err %.2e)\n", tag, s, loss,
                f->adam_losses[s], rel);
        CHECK(rel <= 1e-5, "%s: loss after %d AdamW steps %.8f vs %.8f (rel %.2e)", tag, s, loss,
              f->adam_losses[s], rel);
        if (rel > worst) worst = rel;
        if (s + 1 == f->n_adam) break;
        for (int b = 0; b < r->nb; b++) {
            const zs_bucket_layout *GL = zs_model_grad_layout(r->m, b);
            adam_area(r->pd[b], r->gd[b], a.md[b], a.vd[b], GL->data_bytes / 4, f, s + 1);
            adam_area(r->pr[b], r->gr[b], a.mr[b], a.vr[b], GL->resident_bytes / 4, f, s + 1);
        }
    }
    for (int b = 0; b < r->nb; b++) { free(a.md[b]); free(a.vd[b]); free(a.mr[b]); free(a.vr[b]); }
    free(a.md); free(a.mr); free(a.vd); free(a.vr);
}

/* Central finite differences at chosen coordinates of a few tensors (grads already in r). */
static void test_fd(rig *r, zs_trainer *t, const ref *f, const char *tag) {
    int h = zs_bucket_head(r->m), Lr = r->c->n_layers - 1;
    struct { int b, role; } pick[] = {
        {0, ZS_R_TOK_EMB}, {0, ZS_R_POS_EMB}, {1, ZS_R_ATTN_NORM_W}, {1, ZS_R_WQ}, {1, ZS_R_WK},
        {1 + Lr / 2, ZS_R_WV}, {1 + Lr, ZS_R_WO}, {1 + Lr, ZS_R_W_GATE}, {1 + Lr / 2, ZS_R_W_UP},
        {1, ZS_R_W_DOWN}, {1 + Lr, ZS_R_FFN_NORM_W}, {1, ZS_R_ATTN_NORM_B}, {1 + Lr, ZS_R_BQ}, {1, ZS_R_BK},
        {1 + Lr, ZS_R_B_UP}, {1, ZS_R_B_DOWN}, {h, ZS_R_OUT_NORM_W}, {h, ZS_R_OUT_NORM_B}};
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    int n_checked = 0;
    for (size_t i = 0; i < sizeof pick / sizeof pick[0]; i++) {
        const zs_slot *s = &zs_model_grad_layout(r->m, pick[i].b)->slot[pick[i].role];
        if (!s->present) continue;
        long n = (long)(s->shape[0] * s->shape[1]);
        float *g = slot_ptr(r, pick[i].b, pick[i].role, (void **)r->gd, (void **)r->gr);
        float *p = slot_ptr(r, pick[i].b, pick[i].role, r->pd, r->pr);
        long best = 0;
        for (long k = 1; k < n; k++) if (fabsf(g[k]) > fabsf(g[best])) best = k;
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        long coords[2] = {best, (long)((rng >> 33) % (uint64_t)n)};
        for (int c = 0; c < 2; c++) {
            long k = coords[c];
            /* a smaller step where the loss moves fast (the curvature term grows with it) */
            float g0 = g[k], p0 = p[k], eps = fabsf(g0) > 1.0f ? 1e-3f : 1e-2f, lp = 0, lm = 0;
            p[k] = p0 + eps;
            int rc = run_pass(r, t, f->tok, f->tgt, &lp, 0);
            p[k] = p0 - eps;
            rc |= run_pass(r, t, f->tok, f->tgt, &lm, 0);
            p[k] = p0;
            double fd = ((double)lp - lm) / (2.0 * eps);
            int ok = rc == 0 && fabs(fd - g0) <= 3e-2 * fabs(g0) + 3e-4;
            if (!ok || c == 0)
                fprintf(stderr, "%s: finite difference bucket %d role %d [%ld]: fd %.6e grad %.6e\n", tag,
                        pick[i].b, pick[i].role, k, fd, (double)g0);
            CHECK(ok, "%s: finite difference at bucket %d role %d [%ld]: %.6e vs gradient %.6e", tag, pick[i].b,
                  pick[i].role, k, fd, (double)g0);
            n_checked++;
        }
    }
    CHECK(n_checked >= 16, "%s: only %d coordinates checked", tag, n_checked);
}

static void test_model(const char *name) {
    char dir[512];
    tu_model_dir(dir, sizeof dir, name);
    ref f;
    if (ref_load(&f, name) < 0) { CHECK(0, "%s: no reference data", name); ref_free(&f); return; }
    rig r;
    int rc = rig_open(&r, dir, ZS_F32, 0, 1);
    CHECK(rc == 0, "%s: open: %s", name, zs_errmsg());
    if (rc < 0) { ref_free(&f); return; }
    zs_trainer *t = NULL;
    rc = zs_trainer_new(r.m, f.B, f.T, &t);
    CHECK(rc == 0, "%s: trainer: %s", name, zs_errmsg());
    if (rc < 0) { rig_close(&r); ref_free(&f); return; }
    fprintf(stderr, "%s: trainer scratch %zu bytes\n", name, zs_trainer_bytes(t));

    /* loss and every gradient */
    float loss = 0;
    rc = run_pass(&r, t, f.tok, f.tgt, &loss, 1);
    CHECK(rc == 0, "%s: pass: %s", name, zs_errmsg());
    double lrel = fabs(loss - f.loss) / fabs(f.loss);
    fprintf(stderr, "%s: loss %.7f (torch %.7f, rel err %.2e)\n", name, loss, f.loss, lrel);
    CHECK(lrel <= 1e-5, "%s: loss %.8f vs %.8f", name, loss, f.loss);
    double worst = compare_grads(&r, &f, 1e-4, name, getenv("ZS_VERBOSE") != NULL);
    fprintf(stderr, "%s: worst gradient relative L2 error %.2e over %zu parameters\n", name, worst,
            zs_model_param_count(r.m));

    /* accumulation: a second pass on the same grads doubles them */
    {
        rig r2;
        CHECK(rig_open(&r2, dir, ZS_F32, 0, 1) == 0, "%s: reopen", name);
        float l1 = 0, l2 = 0;
        CHECK(run_pass(&r2, t, f.tok, f.tgt, &l1, 1) == 0 && run_pass(&r2, t, f.tok, f.tgt, &l2, 1) == 0,
              "%s: two passes: %s", name, zs_errmsg());
        CHECK(l1 == loss && l2 == loss, "%s: losses of repeated passes %.9g %.9g vs %.9g", name, l1, l2, loss);
        double num = 0, den = 0;
        for (int b = 0; b < r.nb; b++) {
            const zs_bucket_layout *GL = zs_model_grad_layout(r.m, b);
            for (size_t k = 0; k < GL->data_bytes / 4; k++) {
                double dd = (double)r2.gd[b][k] - 2.0 * r.gd[b][k];
                num += dd * dd; den += 4.0 * r.gd[b][k] * r.gd[b][k];
            }
            for (size_t k = 0; k < GL->resident_bytes / 4; k++) {
                double dd = (double)r2.gr[b][k] - 2.0 * r.gr[b][k];
                num += dd * dd; den += 4.0 * r.gr[b][k] * r.gr[b][k];
            }
        }
        CHECK(sqrt(num) <= 1e-6 * sqrt(den), "%s: two accumulated passes != 2x one pass (rel %.2e)", name,
              sqrt(num / den));
        rig_close(&r2);
    }

    /* every tensor resident (a different area split): the same gradients */
    {
        rig r3;
        zs_trainer *t3 = NULL;
        rc = rig_open(&r3, dir, ZS_F32, (int64_t)1 << 40, 1);
        CHECK(rc == 0, "%s: open resident: %s", name, zs_errmsg());
        if (rc == 0 && zs_trainer_new(r3.m, f.B, f.T, &t3) == 0) {
            float l3 = 0;
            CHECK(run_pass(&r3, t3, f.tok, f.tgt, &l3, 1) == 0, "%s: resident pass: %s", name, zs_errmsg());
            CHECK(l3 == loss, "%s: resident loss %.9g vs %.9g", name, l3, loss);
            double w3 = compare_grads(&r3, &f, 1e-4, "all-resident", 0);
            CHECK(fabs(w3 - worst) <= 1e-6, "%s: all-resident errors %.3e vs %.3e", name, w3, worst);
        }
        zs_trainer_free(t3);
        rig_close(&r3);
    }

    /* f16 / bf16 weights: the function itself changes, so loose tolerances */
    for (int k = 0; k < 2; k++) {
        zs_dtype dt = k ? ZS_BF16 : ZS_F16;
        double tol = k ? 0.1 : 0.02;
        rig r4;
        zs_trainer *t4 = NULL;
        rc = rig_open(&r4, dir, dt, 0, 0);
        CHECK(rc == 0, "%s: open %s: %s", name, zs_dtype_name(dt), zs_errmsg());
        if (rc == 0 && zs_trainer_new(r4.m, f.B, f.T, &t4) == 0) {
            float l4 = 0;
            CHECK(run_pass(&r4, t4, f.tok, f.tgt, &l4, 1) == 0, "%s: %s pass: %s", name, zs_dtype_name(dt),
                  zs_errmsg());
            /* worst per-tensor relative L2 error against the f32 torch gradients */
            json_t *ts = json_object_get(f.j, "tensors");
            float *buf = tu_xcalloc(sizeof(float) * (size_t)f.nfloats);
            double w4 = 0;
            for (size_t i = 0; i < json_array_size(ts); i++) {
                json_t *e = json_array_get(ts, i);
                long off = (long)json_integer_value(json_object_get(e, "offset"));
                long n = hf_grad(&r4, json_string_value(json_object_get(e, "name")), buf, f.nfloats);
                double num = 0, den = 0;
                for (long j = 0; j < n; j++) {
                    double dd = (double)buf[j] - f.bin[off + j];
                    num += dd * dd; den += (double)f.bin[off + j] * f.bin[off + j];
                }
                if (n > 0 && den > 0 && sqrt(num / den) > w4) w4 = sqrt(num / den);
            }
            free(buf);
            fprintf(stderr, "%s: %s weights: loss %.6f (f32 torch %.6f), worst gradient rel L2 %.2e\n", name,
                    zs_dtype_name(dt), l4, f.loss, w4);
            CHECK(fabs(l4 - f.loss) <= 0.01 * f.loss, "%s: %s loss %.6f vs %.6f", name, zs_dtype_name(dt), l4,
                  f.loss);
            CHECK(w4 <= tol, "%s: %s gradient error %.3e > %.2f", name, zs_dtype_name(dt), w4, tol);
        }
        zs_trainer_free(t4);
        rig_close(&r4);
    }

    /* finite differences (grads of the original weights are in r) */
    test_fd(&r, t, &f, name);

    /* errors: out of order, bad ids, too long */
    {
        float l = 0;
        int L = r.c->n_layers;
        CHECK_ERR(zs_train_layer_fwd(t, 0, r.pd[1], r.pr[1]), "out of order");
        CHECK(zs_train_embed_fwd(t, r.pd[0], r.pr[0], f.tok) == 0, "embed fwd");
        CHECK_ERR(zs_train_layer_fwd(t, 1, r.pd[2], r.pr[2]), "out of order");
        CHECK_ERR(zs_train_layer_bwd(t, L - 1, r.pd[L], r.pr[L], r.gd[L], r.gr[L]), "out of order");
        int32_t *bad = tu_xcalloc(sizeof(int32_t) * (size_t)(f.B * f.T));
        memcpy(bad, f.tok, sizeof(int32_t) * (size_t)(f.B * f.T));
        bad[3] = r.c->vocab_size;
        CHECK_ERR(zs_train_embed_fwd(t, r.pd[0], r.pr[0], bad), "token id", "out of range");
        CHECK(zs_train_embed_fwd(t, r.pd[0], r.pr[0], f.tok) == 0, "embed fwd");
        for (int k = 0; k < L; k++) zs_train_layer_fwd(t, k, r.pd[1 + k], r.pr[1 + k]);
        memcpy(bad, f.tgt, sizeof(int32_t) * (size_t)(f.B * f.T));
        bad[5] = r.c->vocab_size + 3;
        int h = zs_bucket_head(r.m);
        CHECK_ERR(zs_train_head(t, r.pd[h], r.pr[h], r.pd[0], r.pr[0], bad, &l, r.gd[h], r.gr[h], r.gd[0], r.gr[0]),
                  "target id", "out of range");
        CHECK_ERR(zs_train_head(t, r.pd[h], r.pr[h], r.pd[0], r.pr[0], f.tgt, &l, r.gd[h], r.gr[h], NULL, NULL),
                  "NULL");
        CHECK_ERR(zs_train_layer_bwd(t, L - 1, r.pd[L], r.pr[L], r.gd[L], r.gr[L]), "out of order");
        /* every target masked: loss 0, no gradient */
        for (int k = 0; k < f.B * f.T; k++) bad[k] = -1;
        rig_zero_grads(&r);
        CHECK(zs_train_head(t, r.pd[h], r.pr[h], r.pd[0], r.pr[0], bad, &l, r.gd[h], r.gr[h], r.gd[0], r.gr[0]) == 0,
              "masked head: %s", zs_errmsg());
        CHECK(l == 0.0f, "all-masked loss %g", l);
        float mx = 0;
        const zs_bucket_layout *GE = zs_model_grad_layout(r.m, 0);
        for (size_t k = 0; k < GE->data_bytes / 4; k++) mx = fmaxf(mx, fabsf(r.gd[0][k]));
        CHECK(mx == 0.0f, "all-masked head gradient %g", mx);
        free(bad);
        zs_trainer *tt = NULL;
        CHECK_ERR(zs_trainer_new(r.m, 1, r.c->max_seq + 1, &tt), "exceeds");
        CHECK_ERR(zs_trainer_new(r.m, 0, 4, &tt), "positive");
    }

    /* 5 AdamW steps (changes r's weights: last) */
    test_adamw(&r, t, &f, name);

    zs_trainer_free(t);
    rig_close(&r);
    ref_free(&f);
}

int main(void) {
    test_model("stories260K");
    test_model("gpt2-bytes");
    return tu_finish("test-grad");
}
