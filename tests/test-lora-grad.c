/* test-lora-grad.c — one LoRA training step (engine/train/lora-train.h) against PEFT's own: the base
 * of tests/ref/lora-peft (regenerated with its init-model flags) loaded as an inference model
 * (embed_lookup 1) in a world of 1 rank (both sequences in one micro-batch) and of 2 ranks (one
 * sequence each), tier none, PEFT's adapter (nonzero B) trained for one AdamW step on the batch of
 * tests/ref/lora-grad (B=2, T=16, 5 targets masked; tests/ref/make_lora_grad_ref.py):
 *   - the loss (mean cross-entropy over the counted targets) within LOSS_TOL of PEFT's;
 *   - zs_lora_training_grad within GRAD_RTOL · max|grad| of PEFT's gradients, every element;
 *   - the adapter after the step within what that gradient tolerance allows of torch.optim.AdamW's:
 *     the first Adam step moves p by lr·g/(|g| + eps) (about lr·sign(g)), whose change for a
 *     gradient error e is at most lr·e/(|g| + eps), so element i may differ by
 *     STEP_TOL + min(2·lr, lr·e/(|g_i| + eps)) with e = GRAD_RTOL · max|g| (a tight bound where
 *     |g_i| is large, none where g_i is as small as the rounding error and its sign is not
 *     determined);
 *   - the loss of the batch after the step (zs_lora_training_eval) within LOSS_TOL of PEFT's;
 *   - 2 ranks give the 1-rank loss within 2e-6 and gradients within 5e-6 of max|g| (the sums run
 *     in another order, so not bit for bit). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "device.h"
#include "lora-train.h"
#include "lora.h"
#include "model.h"
#include "ref.h"
#include "testutil.h"
#include "world.h"

#define PEFT "tests/ref/lora-peft"
#define REF "tests/ref/lora-grad"
#define LOSS_TOL 2e-5
#define GRAD_RTOL 1e-5
#define STEP_TOL 2e-6

static char tmp[4096];
static int B, T;
static int32_t tok[2][16], tgt[2][16];
static zs_adamw_params adam;

static const char *make_base(json_t *ref) {
    static char out[4200];
    snprintf(out, sizeof out, "%s/base", tmp);
    return tu_ref_lora_base(ref, out, NULL, NULL) < 0 ? NULL : out;
}

typedef struct {
    float loss, loss_after;
    zs_lora *grad, *after; /* copies */
} result;

/* one step with `ranks` ranks from PEFT's adapter; 0 or the error */
static int run(const char *base, int ranks, result *res) {
    memset(res, 0, sizeof *res);
    zs_model_opts mo;
    zs_model_opts_default(&mo);
    mo.embed_lookup = 1; /* the served (inference) layout */
    zs_model *m = NULL;
    zs_world *w = NULL;
    zs_lora *l = NULL;
    zs_lora_training *t = NULL;
    int rc = zs_model_open(base, &mo, &m);
    if (rc == 0) {
        const zs_model_config *c = zs_model_config_get(m);
        int blocks = (c->max_seq + ZS_KV_BLOCK - 1) / ZS_KV_BLOCK;
        zs_world_opts wo;
        memset(&wo, 0, sizeof wo);
        wo.ranks = ranks;
        wo.gather.tier = ZS_OFFLOAD_NONE;
        wo.max_tokens = 64;
        wo.kv_blocks = blocks;
        wo.max_seqs = 1;
        wo.context = c->max_seq;
        wo.device = ZS_DEVICE_CPU;
        wo.kv_dtype = ZS_F32;
        rc = zs_world_open(m, &wo, &w);
    }
    if (rc == 0) rc = zs_lora_load(PEFT, m, &l);
    zs_train_opts to;
    memset(&to, 0, sizeof to);
    to.micro_batch = B / ranks;
    to.seq_len = T;
    to.grad_accum = 1;
    to.grad_clip = 0.0f; /* PEFT's step is not clipped */
    to.adam = adam;
    to.lr.type = ZS_LR_CONSTANT;
    to.lr.lr = adam.lr;
    to.lr.warmup_min_ratio = 1.0f;
    if (rc == 0) rc = zs_lora_training_begin(w, l, &to, 0, &t);
    int32_t both_t[32], both_g[32];
    memcpy(both_t, tok, sizeof tok);
    memcpy(both_g, tgt, sizeof tgt);
    const int32_t *TK[2] = {ranks == 1 ? both_t : tok[0], tok[1]}, *TG[2] = {ranks == 1 ? both_g : tgt[0], tgt[1]};
    if (rc == 0) rc = zs_lora_training_step(t, TK, TG, 1, &res->loss);
    if (rc == 0) {
        const zs_lora *g = zs_lora_training_grad(t);
        rc = g ? 0 : zs_err(ZS_EINVAL, "zs_lora_training_grad is NULL after a step");
        if (rc == 0) rc = zs_lora_new_like(g, &res->grad);
        if (rc == 0) rc = zs_lora_copy(res->grad, g);
    }
    if (rc == 0) rc = zs_lora_new_like(l, &res->after);
    if (rc == 0) rc = zs_lora_copy(res->after, l);
    if (rc == 0) rc = zs_lora_training_eval(t, TK, TG, &res->loss_after);
    if (t) zs_lora_training_end(t);
    zs_world_free(w);
    zs_lora_free(l);
    zs_model_free(m);
    return rc;
}

static double max_abs(const float *a, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i]));
    return m;
}

static double max_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - (double)b[i]));
    return m;
}

/* one run against PEFT's references */
/* the matrices of an adapter, each A and B of every layer and target: pointer and length */
static int matrices(const zs_lora *l, const float **p, size_t *len, int cap) {
    int k = 0, r = zs_lora_get_params(l)->r;
    for (int layer = 0; layer < zs_lora_n_layers(l); layer++)
        for (int t = 0; t < ZS_LORA_NT; t++) {
            int in, out;
            if (!zs_lora_A_const(l, layer, t) || k + 2 > cap) continue;
            zs_lora_dims(l, t, &in, &out);
            p[k] = zs_lora_A_const(l, layer, t);
            len[k++] = (size_t)r * in;
            p[k] = zs_lora_B_const(l, layer, t);
            len[k++] = (size_t)out * r;
        }
    return k;
}

/* one run against PEFT's references */
static void check_peft(const char *what, const result *r, double loss, double loss_after, const zs_lora *gref,
                       const zs_lora *aref) {
    enum { CAP = 2 * ZS_LORA_NT * 64 };
    static const float *g[CAP], *gr[CAP], *a[CAP], *ar[CAP];
    static size_t len[CAP], len2[CAP];
    int nm = matrices(r->grad, g, len, CAP), nm2 = matrices(gref, gr, len2, CAP);
    matrices(r->after, a, len, CAP);
    matrices(aref, ar, len2, CAP);
    size_t n, n2;
    zs_lora_data_const(r->grad, &n);
    zs_lora_data_const(gref, &n2);
    CHECK(n == n2 && nm == nm2 && nm > 0 && !memcmp(len, len2, (size_t)nm * sizeof *len), "%s: adapter shapes", what);
    if (n != n2 || nm != nm2 || nm == 0) return;
    double dl = fabs((double)r->loss - loss), dla = fabs((double)r->loss_after - loss_after);
    double gmax = max_abs(zs_lora_data_const(gref, NULL), n);
    double dg = max_diff(zs_lora_data_const(r->grad, NULL), zs_lora_data_const(gref, NULL), n);
    double worst_mat = 0, worst_step = 0, step_all = 0;
    size_t loose = 0; /* elements whose step bound is not tight (the gradient within 100 e of zero) */
    for (int k = 0; k < nm; k++) {
        double mmax = max_abs(gr[k], len[k]), e = GRAD_RTOL * mmax;
        worst_mat = fmax(worst_mat, max_diff(g[k], gr[k], len[k]) / mmax);
        for (size_t i = 0; i < len[k]; i++) {
            double lr = adam.lr, gi = fabs((double)gr[k][i]), d = fabs((double)a[k][i] - (double)ar[k][i]);
            double allowed = STEP_TOL + fmin(2 * lr, lr * e / (gi + adam.eps));
            worst_step = fmax(worst_step, d / allowed);
            step_all = fmax(step_all, d);
            loose += gi < 100 * e;
        }
    }
    fprintf(stderr, "%s: loss %.7f (PEFT %.7f, |diff| %.2g); grad max |diff| %.3g = %.3g of max |grad| %.3g, at most "
            "%.3g of its matrix's max; after the step max |diff| %.3g, at most %.3g of its bound (%zu of %zu bounds "
            "loose); loss after %.7f (PEFT %.7f, |diff| %.2g)\n", what, r->loss, loss, dl, dg, dg / gmax, gmax,
            worst_mat, step_all, worst_step, loose, n, r->loss_after, loss_after, dla);
    CHECK(dl <= LOSS_TOL, "%s: loss within %g of PEFT's (%.3g)", what, LOSS_TOL, dl);
    CHECK(gmax > 0 && worst_mat <= GRAD_RTOL, "%s: every matrix's gradient within %g of its max |grad| (%.3g)", what,
          GRAD_RTOL, worst_mat);
    CHECK(worst_step <= 1, "%s: adapter after the step within its bound of torch's AdamW everywhere (%.3g of it)", what,
          worst_step);
    CHECK(loose < n / 50, "%s: the bound is tight for almost every element (%zu loose)", what, loose);
    CHECK(dla <= LOSS_TOL, "%s: loss after the step within %g of PEFT's (%.3g)", what, LOSS_TOL, dla);
}

int main(void) {
    if (tu_tmpdir(tmp, sizeof tmp, "lora-grad") != 0) return 1;
    json_t *ref = json_load_file(REF "/reference.json", 0, NULL);
    CHECK(ref != NULL, REF "/reference.json");
    if (!ref) return tu_finish("test-lora-grad");
    B = (int)json_integer_value(json_object_get(ref, "B"));
    T = (int)json_integer_value(json_object_get(ref, "T"));
    CHECK(B == 2 && T == 16, "the batch is 2 x 16");
    tu_ref_rows(json_object_get(ref, "tokens"), 2, 16, &tok[0][0]);
    tu_ref_rows(json_object_get(ref, "targets"), 2, 16, &tgt[0][0]);
    tu_ref_adamw(json_object_get(ref, "adamw"), &adam);
    double loss = json_number_value(json_object_get(ref, "loss")), loss_after = json_number_value(json_object_get(ref, "loss_after"));

    const char *base = make_base(ref);
    CHECK(base != NULL, "base model");
    zs_model *m = NULL;
    zs_lora *gref = NULL, *aref = NULL;
    CHECK(base && zs_model_open(base, NULL, &m) == 0, "open the base: %s", zs_errmsg());
    CHECK(m && zs_lora_load(REF "/grad", m, &gref) == 0, "PEFT's gradients: %s", zs_errmsg());
    CHECK(m && zs_lora_load(REF "/after-step", m, &aref) == 0, "torch's adapter after the step: %s", zs_errmsg());
    if (!gref || !aref) return tu_finish("test-lora-grad");

    result r1, r2;
    int rc = run(base, 1, &r1);
    CHECK(rc == 0, "1 rank: %s", zs_errmsg());
    if (rc == 0) check_peft("1 rank", &r1, loss, loss_after, gref, aref);
    rc = run(base, 2, &r2);
    CHECK(rc == 0, "2 ranks: %s", zs_errmsg());
    if (rc == 0) check_peft("2 ranks", &r2, loss, loss_after, gref, aref);
    if (r1.grad && r2.grad) {
        size_t n;
        const float *g1 = zs_lora_data_const(r1.grad, &n), *g2 = zs_lora_data_const(r2.grad, NULL);
        double gm = max_abs(g1, n), dg = max_diff(g1, g2, n);
        double da = max_diff(zs_lora_data_const(r1.after, NULL), zs_lora_data_const(r2.after, NULL), n);
        fprintf(stderr, "2 ranks vs 1: loss |diff| %.2g, grad %.3g of max, after the step %.3g\n",
                fabs((double)r1.loss - r2.loss), dg / gm, da);
        CHECK(fabs((double)r1.loss - r2.loss) <= 2e-6, "2 ranks: the 1-rank loss");
        CHECK(dg <= 5e-6 * gm, "2 ranks: the 1-rank gradients (%.3g of max)", dg / gm);
    }
    zs_lora_free(r1.grad);
    zs_lora_free(r1.after);
    zs_lora_free(r2.grad);
    zs_lora_free(r2.after);
    zs_lora_free(gref);
    zs_lora_free(aref);
    zs_model_free(m);
    json_decref(ref);
    tu_rmdir(tmp);
    return tu_finish("test-lora-grad");
}
