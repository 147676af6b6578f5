/* test-moe-train.c — training mixtures of experts (issue 15) against transformers 4.57.3 itself, from
 * the reference tests/ref/moe-grad/make_moe_grad_ref.py recorded (no torch needed here), on small
 * random Mixtral, Qwen2-MoE (a dense layer, the shared expert and its gate), Qwen3-MoE (q/k norms,
 * renormalised top-k) and OLMoE (whole-projection q/k norms, clip_qkv) models, each regenerated
 * exactly as `zeroserve init-model <args>` makes it (server/init-cmd.c's parser; the safetensors
 * checksum must equal the reference's):
 *   (a) one training pass (zs_trainer over the model's resident buffers and the resident weight
 *       source: experts() NULL, agreed = mask), output_router_logits and router_aux_loss_coef 0.25:
 *       the loss CE + coef·aux within 1e-5 relative, and the gradient of every Hugging Face
 *       parameter (routers, experts, shared expert and gate, attention, norms) within GRAD_TOL
 *       relative: its L2 norm, its largest element and 32 sampled elements, and every element of the
 *       routers, the shared expert gates and one expert's gate projection (Mixtral again with every
 *       matrix, the experts' included, in the resident areas: a persist threshold);
 *   (b) 3 AdamW steps through zs_training (1 rank, offload none) on a batch where experts go
 *       without tokens (torch: grad None, AdamW skips them and their step count; OLMoE: zero
 *       gradients, updated): the losses within STEP_TOL relative (Mixtral also with resident experts);
 *   (c) the expert protocol: a recording weight source sees, per MoE layer, one experts() call and
 *       an acquire/release of every agreed expert (other ranks' experts included) in increasing
 *       order, forward and backward; a failed expert acquire and a failed layer call still complete
 *       the layer's protocol (zs_trainer_experts_sync: the all-zero agreement, the remaining
 *       experts); an expert other ranks chose gets no gradient callback here;
 *   (d) LoRA over a frozen MoE base (q, k, v, o; router and experts frozen, dx through them): the
 *       loss and the adapter gradient of one step against PEFT 0.17.1's (1e-5, GRAD_TOL), the loss
 *       falls over steps, and gate_proj / up_proj / down_proj targets are refused naming the target;
 *   (e) over ranks (Mixtral): 1 rank x 2 micro-steps and 2 ranks x 1 (ZeRO-3 with offload none, cpu
 *       and nvme; ZeRO-2) give the same losses and exported weights bit for bit; a LoRA job likewise
 *       (Qwen2-MoE: the same adapter bits); a checkpoint after step 1 resumed on 2 ranks gives the
 *       uninterrupted run's bits (the experts' own AdamW step counts travel in the checkpoint); a
 *       rank that fails (an out-of-range token) still lets the others finish (every rank fails the
 *       step together, nobody hangs).
 * ZS_MOE_CASE=name runs one case ((c) and (e) go with the first, Mixtral).
 * Prints "case: loss rel X, worst gradient rel Y (tensor)" per case. */
#include <float.h>

#include "backward.h"
#include "common.h"
#include "engine.h"
#include "lora-train.h"
#include "lora.h"
#include "model.h"
#include "ref.h"
#include "testmodel.h"
#include "testutil.h"
#include "train.h"

#define REF_DIR "tests/ref/moe-grad"
#define GRAD_TOL 1e-4 /* relative (norms; L2 over the sampled / full elements) */
#define STEP_TOL 1e-4 /* relative, the losses of AdamW steps (the routing of later steps follows the
                         updated weights: errors of 1e-7 in them move the losses by ~1e-6) */

static char tmp[4096];

/* ---- (a) one pass over the resident model ---- */

typedef struct {
    zs_model *m;
    const zs_model_config *c;
    int nb;
    float **gd, **gr;
    int calls[ZS_MAX_EXPERTS]; /* egrad calls per expert (of the layer being backpropagated) */
} rig;

static float *egrad_of(void *ctx, int layer, int e) {
    rig *r = ctx;
    if (e >= 0 && e < ZS_MAX_EXPERTS) r->calls[e]++;
    return r->gd[zs_bucket_expert(r->m, layer, e)];
}

static int rig_open_x(rig *r, const char *dir, int64_t persist) {
    memset(r, 0, sizeof *r);
    zs_model_opts o;
    zs_model_opts_default(&o);
    o.persist_threshold = persist;
    int rc = zs_model_open(dir, &o, &r->m);
    if (rc == 0) rc = zs_model_load_resident(r->m);
    if (rc < 0) return rc;
    zs_model_close_checkpoint(r->m);
    r->c = zs_model_config_get(r->m);
    r->nb = zs_model_n_buckets(r->m);
    r->gd = tu_xcalloc(sizeof(float *) * (size_t)r->nb);
    r->gr = tu_xcalloc(sizeof(float *) * (size_t)r->nb);
    for (int b = 0; b < r->nb; b++) {
        const zs_bucket_layout *GL = zs_model_grad_layout(r->m, b);
        if (zs_bucket_is_expert(r->m, b, NULL, NULL)) { /* egrad's area: data, then resident (backward.h) */
            r->gd[b] = tu_xcalloc(GL->data_bytes + GL->resident_bytes);
            r->gr[b] = r->gd[b] + GL->data_bytes / sizeof(float);
        } else {
            r->gd[b] = tu_xcalloc(GL->data_bytes);
            r->gr[b] = tu_xcalloc(GL->resident_bytes);
        }
    }
    return 0;
}

static int rig_open(rig *r, const char *dir) { return rig_open_x(r, dir, 0); }

static void rig_close(rig *r) {
    for (int b = 0; b < r->nb; b++) {
        if (!zs_bucket_is_expert(r->m, b, NULL, NULL)) free(r->gr[b]);
        free(r->gd[b]);
    }
    free(r->gd); free(r->gr);
    zs_model_free(r->m);
}

/* One pass (forward, head, backward) with the layer buckets handed over here and the experts
 * through src. */
static int train_pass(rig *r, zs_trainer *t, const int32_t *tok, const int32_t *tgt, float *loss) {
    int L = r->c->n_layers, h = zs_bucket_head(r->m), rc;
#define PD(b) zs_model_bucket_data(r->m, b)
#define PR(b) zs_model_bucket_resident(r->m, b)
    if ((rc = zs_train_embed_fwd(t, PD(0), PR(0), tok)) < 0) return rc;
    for (int l = 0; l < L; l++)
        if ((rc = zs_train_layer_fwd(t, l, PD(1 + l), PR(1 + l))) < 0) return rc;
    if ((rc = zs_train_head(t, PD(h), PR(h), PD(0), PR(0), tgt, loss, r->gd[h], r->gr[h], r->gd[0], r->gr[0])) < 0)
        return rc;
    for (int l = L - 1; l >= 0; l--)
        if ((rc = zs_train_layer_bwd(t, l, PD(1 + l), PR(1 + l), r->gd[1 + l], r->gr[1 + l])) < 0) return rc;
    return zs_train_embed_bwd(t, NULL, NULL, r->gd[0], r->gr[0]);
#undef PD
#undef PR
}

/* Our gradient of one Hugging Face tensor (the slots whose source is that name, put in place);
 * its element count, or -1 (a tu_grad_fn over a rig). */
static long hf_grad(void *ctx, const char *name, float *out, long cap) {
    const rig *r = ctx;
    long filled = 0;
    for (int b = 0; b < r->nb; b++) {
        const zs_bucket_layout *GL = zs_model_grad_layout(r->m, b);
        for (int role = 0; role < GL->n_roles; role++) {
            zs_slot_source src;
            if (!GL->slot[role].present || zs_model_slot_source(r->m, b, role, &src) < 0 || strcmp(src.name, name)) continue;
            const zs_slot *s = &GL->slot[role];
            long n = (long)(s->shape[0] * (s->ndim > 1 ? s->shape[1] : 1)), at = 0;
            if (src.kind == ZS_SRC_ROW_SLICE) at = (long)src.col0 * (long)s->shape[1];
            else if (src.kind == ZS_SRC_VEC_SLICE) at = (long)src.col0;
            else if (src.kind != ZS_SRC_COPY) return -1;
            if (at + n > cap) return -1;
            const float *g = (const float *)(const void *)((const char *)(s->resident ? r->gr[b] : r->gd[b]) + s->offset);
            memcpy(out + at, g, sizeof(float) * (size_t)n);
            filled += n;
        }
    }
    return filled ? filled : -1;
}

/* persist > 0: the model opened with that persist threshold (every matrix of fewer elements, the
 * experts' included, in the buckets' resident areas) */
static void grad_case(json_t *cs, const char *dir, const float *bin, long nbin, int64_t persist) {
    char label[128];
    snprintf(label, sizeof label, "%s%s", json_string_value(json_object_get(cs, "name")),
             persist ? " (resident experts)" : "");
    const char *name = label;
    json_t *tr = json_object_get(cs, "train");
    int B = (int)json_integer_value(json_object_get(tr, "B")), T = (int)json_integer_value(json_object_get(tr, "T"));
    int ns = (int)json_integer_value(json_object_get(tr, "n_sample"));
    int32_t *tok = tu_xcalloc(sizeof(int32_t) * (size_t)(B * T)), *tgt = tu_xcalloc(sizeof(int32_t) * (size_t)(B * T));
    tu_ref_rows(json_object_get(tr, "tokens"), B, T, tok);
    tu_ref_rows(json_object_get(tr, "targets"), B, T, tgt);
    rig r;
    int rc = rig_open_x(&r, dir, persist);
    CHECK(rc == 0, "%s: open: %s", name, zs_errmsg());
    if (rc < 0) { free(tok); free(tgt); return; }
    if (persist) {
        int eb = zs_bucket_expert(r.m, 0, 0);
        CHECK(eb >= 0 && zs_model_layout(r.m, eb)->slot[ZS_R_W_GATE].resident, "%s: the experts are resident", name);
    }
    CHECK(r.c->n_experts == (int)json_integer_value(json_object_get(cs, "n_experts")) &&
          r.c->output_router_logits && r.c->router_aux_loss_coef > 0, "%s: the config as recorded", name);
    zs_trainer *t = NULL;
    CHECK((rc = zs_trainer_new(r.m, B, T, &t)) == 0, "%s: trainer: %s", name, zs_errmsg());
    zs_weight_source src = zs_model_resident_source(r.m);
    float loss = 0;
    if (rc == 0) {
        zs_trainer_set_experts(t, &src, egrad_of, &r);
        /* a MoE layer without an expert source is refused */
        zs_trainer_set_experts(t, NULL, NULL, NULL);
        int l0 = 0;
        while (!zs_config_layer_moe(r.c, l0)) l0++;
        float dummy;
        int rc2 = train_pass(&r, t, tok, tgt, &dummy);
        CHECK_ERR(rc2, "mixture of experts", "expert source");
        zs_trainer_set_experts(t, &src, egrad_of, &r);
        for (int b = 0; b < r.nb; b++) { /* the refused pass may have accumulated its dense part */
            memset(r.gd[b], 0, zs_model_grad_layout(r.m, b)->data_bytes);
            memset(r.gr[b], 0, zs_model_grad_layout(r.m, b)->resident_bytes);
        }
        rc = train_pass(&r, t, tok, tgt, &loss);
        CHECK(rc == 0, "%s: training pass: %s", name, zs_errmsg());
    }
    double want = json_real_value(json_object_get(tr, "loss"));
    double loss_rel = fabs(loss - want) / fabs(want);
    CHECK(loss_rel <= 1e-5, "%s: loss %.8f vs transformers %.8f (ce %.6f + coef x aux %.6f; rel %.2e)", name, loss, want,
          json_real_value(json_object_get(tr, "ce")), json_real_value(json_object_get(tr, "aux")), loss_rel);
    tu_grad_sum gs = {0, "", 0};
    if (rc == 0) tu_ref_grads(name, json_object_get(tr, "tensors"), ns, bin, nbin, hf_grad, &r, GRAD_TOL, &gs);
    CHECK(rc != 0 || gs.total == (long)zs_model_param_count(r.m), "%s: compared %ld of %zu parameters", name, gs.total,
          zs_model_param_count(r.m));
    fprintf(stderr, "%s: loss %.7f (transformers %.7f, rel %.2e); worst gradient rel %.2e (%s)\n", name, loss, want,
            loss_rel, gs.worst, gs.worst_name);
    zs_trainer_free(t);
    rig_close(&r);
    free(tok);
    free(tgt);
}

/* ---- (b) AdamW steps through zs_training ---- */

static zs_engine *open_engine_x(const char *dir, int ranks, int tier, int stage, int64_t persist) {
    zs_engine_opts eo;
    zs_engine_opts_default(&eo);
    eo.model_dir = dir;
    eo.max_seqs = 1;
    eo.ranks = ranks;
    eo.gather.tier = tier;
    eo.zero_stage = stage;
    eo.model.persist_threshold = persist;
    char nv[4200];
    if (tier == ZS_OFFLOAD_NVME) {
        snprintf(nv, sizeof nv, "%s/nvme", tmp);
        mkdir(nv, 0755);
        eo.nvme_path = nv;
        eo.gather.verify = 1; /* every read checked against the updated checksums */
    }
    zs_engine *e = NULL;
    if (zs_engine_open(&eo, &e) < 0) {
        fprintf(stderr, "open %s (%d ranks): %s\n", dir, ranks, zs_errmsg());
        return NULL;
    }
    return e;
}

static zs_engine *open_engine(const char *dir, int ranks, int tier) { return open_engine_x(dir, ranks, tier, 0, 0); }

static zs_train_opts train_opts(json_t *adamw, int B, int T, int accum) {
    zs_train_opts o;
    memset(&o, 0, sizeof o);
    o.micro_batch = B;
    o.seq_len = T;
    o.grad_accum = accum;
    tu_ref_adamw(adamw, &o.adam);
    o.lr.type = ZS_LR_CONSTANT;
    o.lr.lr = o.adam.lr;
    o.lr.warmup_min_ratio = 1.0f;
    return o;
}

static void steps_case(json_t *cs, const char *dir, int64_t persist) {
    char label[128];
    snprintf(label, sizeof label, "%s%s", json_string_value(json_object_get(cs, "name")),
             persist ? " (resident experts)" : "");
    const char *name = label;
    json_t *st = json_object_get(cs, "steps"), *want = json_object_get(st, "losses");
    int B = (int)json_integer_value(json_object_get(st, "B")), T = (int)json_integer_value(json_object_get(st, "T"));
    int n = (int)json_array_size(want) - 1;
    int32_t tok[64], tgt[64];
    if (B * T > 64 || n < 1 || n > 8) { CHECK(0, "%s: steps sizes", name); return; }
    tu_ref_rows(json_object_get(st, "tokens"), B, T, tok);
    tu_ref_rows(json_object_get(st, "targets"), B, T, tgt);
    zs_engine *e = open_engine_x(dir, 1, ZS_OFFLOAD_NONE, 0, persist);
    if (!e) { CHECK(0, "%s: engine", name); return; }
    zs_train_opts o = train_opts(json_object_get(st, "adamw"), B, T, 1);
    zs_training *t = NULL;
    int rc = zs_training_begin(zs_engine_world(e), &o, &t);
    CHECK(rc == 0, "%s: begin: %s", name, zs_errmsg());
    const int32_t *TK[1] = {tok}, *TG[1] = {tgt};
    float got[9] = {0};
    for (int s = 1; rc == 0 && s <= n; s++) rc = zs_training_step(t, TK, TG, s, &got[s - 1]);
    if (rc == 0) rc = zs_training_eval(t, TK, TG, &got[n]);
    CHECK(rc == 0, "%s: steps: %s", name, zs_errmsg());
    double worst = 0;
    for (int k = 0; rc == 0 && k <= n; k++) {
        double w = json_real_value(json_array_get(want, (size_t)k)), rel = fabs(got[k] - w) / fabs(w);
        CHECK(rel <= STEP_TOL, "%s: loss after %d AdamW steps %.7f vs torch %.7f (rel %.2e)", name, k, got[k], w, rel);
        worst = fmax(worst, rel);
    }
    int unused = 0;
    for (size_t k = 0; k < json_array_size(json_object_get(st, "unused")); k++)
        unused += (int)json_array_size(json_array_get(json_object_get(st, "unused"), k));
    fprintf(stderr, "%s: %d AdamW steps (%d parameter-steps without a gradient in torch): losses", name, n, unused);
    for (int k = 0; k <= n; k++) fprintf(stderr, " %.6f", got[k]);
    fprintf(stderr, ", worst rel %.2e\n", worst);
    if (t) zs_training_end(t);
    zs_engine_free(e);
}

/* ---- (c) the expert protocol ---- */

typedef struct {
    const zs_model *m;
    int fail_bucket;           /* acquire fails for this bucket (-1: none) */
    uint64_t extra;            /* experts "another rank" adds to the union (bits of word 0) */
    int n;
    char ev[4096][3];          /* 'x' layer (experts call), 'a'/'r' expert bucket events */
    int arg[4096];
    uint64_t mask0[64];        /* word 0 of each experts() call's mask */
    int nx;
    int held;                  /* acquired and not released */
} rec_src;

static void rec(rec_src *s, char c, int a) {
    if (s->n < 4096) {
        s->ev[s->n][0] = c;
        s->arg[s->n] = a;
    }
    s->n++;
}

static int rec_acquire(void *ctx, int b, const void **d) {
    rec_src *s = ctx;
    rec(s, 'a', b);
    s->held++;
    *d = zs_model_bucket_data(s->m, b);
    return b == s->fail_bucket ? zs_err(ZS_EIO, "test: reading bucket %d failed", b) : 0;
}

static void rec_release(void *ctx, int b) {
    rec_src *s = ctx;
    rec(s, 'r', b);
    s->held--;
}

static int rec_experts(void *ctx, int layer, const uint64_t *mask, uint64_t *agreed) {
    rec_src *s = ctx;
    rec(s, 'x', layer);
    if (s->nx < 64) s->mask0[s->nx] = mask[0];
    s->nx++;
    for (int w = 0; w < ZS_EXPERT_WORDS; w++) agreed[w] = mask[w] | (w == 0 ? s->extra : 0);
    return 0;
}

/* The events from position *pos for MoE layer l: [an experts() call], then acquire/release pairs
 * of exactly the experts of `agreed`, increasing. Advances *pos. */
static int expect_layer(rec_src *s, int *pos, int l, int with_x, const uint64_t *agreed, const char *what) {
    int p = *pos, ok = 1;
    if (with_x) ok &= p < s->n && s->ev[p][0] == 'x' && s->arg[p] == l, p++;
    for (int e = 0; e < zs_model_config_get(s->m)->n_experts; e++) {
        if (!(agreed[e >> 6] >> (e & 63) & 1)) continue;
        int b = zs_bucket_expert(s->m, l, e);
        ok &= p + 1 < s->n && s->ev[p][0] == 'a' && s->arg[p] == b && s->ev[p + 1][0] == 'r' && s->arg[p + 1] == b;
        p += 2;
    }
    CHECK(ok, "protocol: %s of layer %d: events %d.. are not %s the agreed experts' acquire/release pairs", what, l, *pos,
          with_x ? "one experts() call and" : "");
    *pos = p;
    return ok;
}

static void protocol_case(const char *dir) {
    rig r;
    int rc = rig_open(&r, dir);
    CHECK(rc == 0, "protocol: open: %s", zs_errmsg());
    if (rc < 0) return;
    const zs_model_config *c = r.c;
    int L = c->n_layers, E = c->n_experts, h = zs_bucket_head(r.m), B = 1, T = 6;
    int32_t tok[6] = {3, 17, 250, 41, 99, 7}, tgt[6] = {17, 250, 41, 99, 7, -1};
    zs_trainer *t = NULL;
    CHECK((rc = zs_trainer_new(r.m, B, T, &t)) == 0, "protocol: trainer: %s", zs_errmsg());
    if (rc < 0) { rig_close(&r); return; }
    rec_src s = {r.m, -1, 0, 0, {{0}}, {0}, {0}, 0, 0};
    zs_weight_source src = {rec_acquire, rec_release, &s, rec_experts};
    zs_trainer_set_experts(t, &src, egrad_of, &r);
    uint64_t ag[ZS_MAX_LAYERS][ZS_EXPERT_WORDS];
#define PD(b) zs_model_bucket_data(r.m, b)
#define PR(b) zs_model_bucket_resident(r.m, b)
    /* 1: a whole pass; "another rank" adds the last expert to every layer's union */
    s.extra = 1ull << (E - 1);
    float loss;
    rc = zs_train_embed_fwd(t, PD(0), PR(0), tok);
    int pos = 0, ok = 1;
    for (int l = 0; rc == 0 && l < L; l++) {
        int n0 = s.n;
        rc = zs_train_layer_fwd(t, l, PD(1 + l), PR(1 + l));
        memcpy(ag[l], zs_trainer_experts_used(t, l), sizeof ag[l]);
        if (zs_config_layer_moe(c, l)) {
            CHECK(ag[l][0] >> (E - 1) & 1, "protocol: layer %d: the other rank's expert is in the agreement", l);
            ok &= expect_layer(&s, &pos, l, 1, ag[l], "forward");
        } else {
            CHECK(s.n == n0, "protocol: dense layer %d touched the expert source", l);
        }
    }
    if (rc == 0) rc = zs_train_head(t, PD(h), PR(h), PD(0), PR(0), tgt, &loss, r.gd[h], r.gr[h], r.gd[0], r.gr[0]);
    for (int l = L - 1; rc == 0 && l >= 0; l--) {
        memset(r.calls, 0, sizeof r.calls);
        rc = zs_train_layer_bwd(t, l, PD(1 + l), PR(1 + l), r.gd[1 + l], r.gr[1 + l]);
        if (!zs_config_layer_moe(c, l)) continue;
        ok &= expect_layer(&s, &pos, l, 0, ag[l], "backward");
        /* the gradient callback: once per expert this rank's tokens chose, never for the others */
        int calls_ok = 1;
        for (int e = 0; e < E; e++) {
            int agreed = (int)(ag[l][e >> 6] >> (e & 63) & 1);
            calls_ok &= r.calls[e] <= 1 && (r.calls[e] == 0 || agreed);
        }
        CHECK(calls_ok, "protocol: layer %d: egrad called only once for this rank's own experts", l);
    }
    if (rc == 0) rc = zs_train_embed_bwd(t, NULL, NULL, r.gd[0], r.gr[0]);
    CHECK(rc == 0, "protocol: pass: %s", zs_errmsg());
    CHECK(ok && pos == s.n && s.held == 0, "protocol: %d events, %d matched, %d held", s.n, pos, s.held);

    /* 2: an expert acquire fails in the forward of the last MoE layer: that call still acquires and
     * releases every agreed expert, then the caller drives the rest of the pass */
    int lm = L - 1;
    while (!zs_config_layer_moe(c, lm)) lm--;
    s = (rec_src){r.m, -1, 1ull << (E - 1), 0, {{0}}, {0}, {0}, 0, 0};
    rc = zs_train_embed_fwd(t, PD(0), PR(0), tok);
    for (int l = 0; rc == 0 && l < lm; l++) rc = zs_train_layer_fwd(t, l, PD(1 + l), PR(1 + l));
    CHECK(rc == 0, "protocol: forward: %s", zs_errmsg());
    s.fail_bucket = zs_bucket_expert(r.m, lm, E - 1); /* the last one: the others come first */
    int mark = s.n, n_x = s.nx;
    int frc = zs_train_layer_fwd(t, lm, PD(1 + lm), PR(1 + lm));
    CHECK_ERR(frc, "reading bucket");
    memcpy(ag[lm], zs_trainer_experts_used(t, lm), sizeof ag[lm]);
    pos = mark;
    expect_layer(&s, &pos, lm, 1, ag[lm], "failed forward");
    CHECK(zs_trainer_experts_sync(t, lm, 0) == 0 && s.n == pos && s.nx == n_x + 1,
          "protocol: sync after a complete failed call drives nothing more");
    for (int l = lm + 1; l < L; l++) zs_trainer_experts_sync(t, l, 0); /* (dense: nothing) */
    /* the backward of the failed pass, driven only */
    s.fail_bucket = -1;
    for (int l = L - 1; l >= 0; l--) {
        int p0 = s.n;
        CHECK(zs_trainer_experts_sync(t, l, 1) == 0, "protocol: sync backward %d", l);
        if (zs_config_layer_moe(c, l)) {
            pos = p0;
            uint64_t want[ZS_EXPERT_WORDS];
            memcpy(want, zs_trainer_experts_used(t, l), sizeof want);
            expect_layer(&s, &pos, l, 0, want, "driven backward");
            CHECK(pos == s.n, "protocol: driven backward of layer %d: nothing else", l);
        } else {
            CHECK(s.n == p0, "protocol: dense layer %d driven", l);
        }
    }
    CHECK(s.held == 0, "protocol: %d buckets still held", s.held);

    /* 3: the layer call fails before its agreement (a NULL data area): sync makes the all-zero one */
    s = (rec_src){r.m, -1, 1ull << (E - 1), 0, {{0}}, {0}, {0}, 0, 0};
    rc = zs_train_embed_fwd(t, PD(0), PR(0), tok);
    int lf = 0;
    for (; !zs_config_layer_moe(c, lf); lf++) rc |= zs_train_layer_fwd(t, lf, PD(1 + lf), PR(1 + lf));
    frc = zs_train_layer_fwd(t, lf, NULL, PR(1 + lf));
    CHECK_ERR(frc, "NULL");
    CHECK(s.n == 0, "protocol: nothing acquired before the agreement");
    CHECK(zs_trainer_experts_sync(t, lf, 0) == 0, "protocol: sync: %s", zs_errmsg());
    CHECK(s.nx == 1 && s.mask0[0] == 0, "protocol: the failed rank agrees with an all-zero mask (mask %llx)",
          (unsigned long long)s.mask0[0]);
    pos = 0;
    uint64_t only[ZS_EXPERT_WORDS] = {1ull << (E - 1)};
    expect_layer(&s, &pos, lf, 1, only, "driven forward");
    CHECK(pos == s.n && s.held == 0, "protocol: driven forward: %d events, %d matched", s.n, pos);
#undef PD
#undef PR
    zs_trainer_free(t);
    rig_close(&r);
}

/* ---- (d) LoRA over a frozen MoE base ---- */

static void lora_case(json_t *cs, const char *dir) {
    const char *name = json_string_value(json_object_get(cs, "name"));
    json_t *lj = json_object_get(cs, "lora"), *tr = json_object_get(cs, "train");
    int B = (int)json_integer_value(json_object_get(tr, "B")), T = (int)json_integer_value(json_object_get(tr, "T"));
    int32_t *tok = tu_xcalloc(sizeof(int32_t) * (size_t)(B * T)), *tgt = tu_xcalloc(sizeof(int32_t) * (size_t)(B * T));
    tu_ref_rows(json_object_get(tr, "tokens"), B, T, tok);
    tu_ref_rows(json_object_get(tr, "targets"), B, T, tgt);
    char ad[4200], gd[4200];
    snprintf(ad, sizeof ad, REF_DIR "/%s/adapter", json_string_value(json_object_get(lj, "dir")));
    snprintf(gd, sizeof gd, REF_DIR "/%s/grad", json_string_value(json_object_get(lj, "dir")));
    zs_engine *e = open_engine(dir, 1, ZS_OFFLOAD_NONE);
    if (!e) { CHECK(0, "%s: lora engine", name); free(tok); free(tgt); return; }
    zs_model *m = zs_engine_model(e);
    /* the MLP targets are refused on a model with MoE layers, naming the target */
    zs_lora *bad = NULL;
    zs_lora_params bp = {4, 8.0f, 0, 0.0f, 1u << ZS_LORA_UP | 1u << ZS_LORA_Q};
    int rc = zs_lora_new(m, &bp, &bad);
    CHECK_ERR(rc, "up_proj", "mixture of experts");
    zs_lora *a = NULL, *want = NULL;
    CHECK((rc = zs_lora_load(ad, m, &a)) == 0, "%s: PEFT adapter: %s", name, zs_errmsg());
    if (rc == 0) CHECK((rc = zs_lora_load(gd, m, &want)) == 0, "%s: PEFT gradient: %s", name, zs_errmsg());
    zs_train_opts o;
    memset(&o, 0, sizeof o);
    o.micro_batch = B;
    o.seq_len = T;
    o.grad_accum = 1;
    zs_adamw_params_default(&o.adam);
    o.adam.lr = 2e-2f;
    o.lr.type = ZS_LR_CONSTANT;
    o.lr.lr = o.adam.lr;
    o.lr.warmup_min_ratio = 1.0f;
    zs_lora_training *lt = NULL;
    if (rc == 0) CHECK((rc = zs_lora_training_begin(zs_engine_world(e), a, &o, 1, &lt)) == 0, "%s: lora begin: %s", name,
                       zs_errmsg());
    const int32_t *TK[1] = {tok}, *TG[1] = {tgt};
    float l0 = 0, l = 0;
    if (rc == 0) rc = zs_lora_training_step(lt, TK, TG, 1, &l0);
    CHECK(rc == 0, "%s: lora step: %s", name, zs_errmsg());
    double wl = json_real_value(json_object_get(lj, "loss"));
    CHECK(rc != 0 || fabs(l0 - wl) <= 1e-5 * fabs(wl), "%s: LoRA loss %.7f vs PEFT %.7f", name, l0, wl);
    if (rc == 0) {
        size_t n1, n2;
        const float *g = zs_lora_data_const(zs_lora_training_grad(lt), &n1), *w = zs_lora_data_const(want, &n2);
        double num = 0, den = 0, mx = 0;
        for (size_t i = 0; i < n1 && n1 == n2; i++) {
            double d = (double)g[i] - w[i];
            num += d * d;
            den += (double)w[i] * w[i];
            mx = fmax(mx, fabs(d));
        }
        double rel = sqrt(num) / sqrt(den);
        CHECK(n1 == n2 && rel <= GRAD_TOL, "%s: LoRA gradient vs PEFT: rel L2 %.2e (max |d| %.2e)", name, rel, mx);
        fprintf(stderr, "%s LoRA (q, k, v, o over frozen experts): loss %.7f (PEFT %.7f), gradient rel L2 %.2e\n", name,
                l0, wl, rel);
    }
    for (int s = 2; rc == 0 && s <= 6; s++) rc = zs_lora_training_step(lt, TK, TG, s, &l);
    if (rc == 0) rc = zs_lora_training_eval(lt, TK, TG, &l);
    CHECK(rc == 0 && l < l0 - 0.05f, "%s: LoRA loss %.5f -> %.5f after 5 steps (%s)", name, l0, l, rc ? zs_errmsg() : "");
    zs_lora_training_end(lt);
    zs_lora_free(a);
    zs_lora_free(want);
    zs_engine_free(e);

    /* the same global batch as 1 rank x 2 micro-steps and as 2 ranks: the same adapter bits */
    zs_lora *ax[2] = {NULL, NULL};
    float ll[2][2] = {{0}};
    for (int k = 0; k < 2; k++) {
        zs_engine *ek = open_engine(dir, k ? 2 : 1, ZS_OFFLOAD_NONE);
        if (!ek) { CHECK(0, "%s: lora engine %d", name, k); break; }
        zs_train_opts ok = o;
        ok.micro_batch = 1;
        ok.grad_accum = k ? 1 : 2;
        zs_lora_training *lk = NULL;
        rc = zs_lora_load(ad, zs_engine_model(ek), &ax[k]);
        if (rc == 0) rc = zs_lora_training_begin(zs_engine_world(ek), ax[k], &ok, 1, &lk);
        const int32_t *T2[2] = {tok, tok + T}, *G2[2] = {tgt, tgt + T};
        for (int s = 1; rc == 0 && s <= 2; s++) rc = zs_lora_training_step(lk, T2, G2, s, &ll[k][s - 1]);
        CHECK(rc == 0, "%s: LoRA over %d rank(s): %s", name, k ? 2 : 1, zs_errmsg());
        zs_lora_training_end(lk);
        zs_engine_free(ek);
    }
    if (ax[0] && ax[1]) {
        size_t n1, n2;
        const float *x = zs_lora_data_const(ax[0], &n1), *y = zs_lora_data_const(ax[1], &n2);
        CHECK(n1 == n2 && !memcmp(x, y, n1 * sizeof(float)) && !memcmp(ll[0], ll[1], sizeof ll[0]),
              "%s: LoRA: 2 ranks give other adapter bits or losses than 1 rank x 2 micro-steps (%.9g %.9g vs %.9g %.9g)",
              name, ll[1][0], ll[1][1], ll[0][0], ll[0][1]);
    }
    zs_lora_free(ax[0]);
    zs_lora_free(ax[1]);
    free(tok);
    free(tgt);
}

/* ---- (e) ranks ---- */

/* 3 steps of the global batch of 2 sequences as `ranks` x `accum` micro-batches of one; the
 * losses, then the weights exported into out (NULL: not exported). bad >= 0: sequence `bad` holds
 * an out-of-range token (that rank fails). */
static int run_ranks(const char *dir, json_t *adamw, const int32_t *tok, const int32_t *tgt, int T, int ranks, int tier,
                     int stage, int accum, float *losses, const char *out, int bad) {
    zs_engine *e = open_engine_x(dir, ranks, tier, stage, 0);
    if (!e) return ZS_EINVAL;
    zs_train_opts o = train_opts(adamw, 1, T, accum);
    zs_training *t = NULL;
    int rc = zs_training_begin(zs_engine_world(e), &o, &t);
    int32_t badtok[64];
    const int32_t *TK[2] = {tok, tok + T}, *TG[2] = {tgt, tgt + T};
    if (bad >= 0) {
        memcpy(badtok, tok + bad * T, sizeof(int32_t) * (size_t)T);
        badtok[T / 2] = 1 << 20;
        TK[bad] = badtok;
    }
    for (int s = 1; rc == 0 && s <= 3; s++) rc = zs_training_step(t, TK, TG, s, &losses[s - 1]);
    if (rc == 0 && out) rc = zs_training_export(t, out);
    if (t) zs_training_end(t);
    zs_engine_free(e);
    return rc;
}

/* The same 3 steps with a checkpoint after step 1: saved, the run ended, a new run on a new engine
 * loads it and goes on with steps 2 and 3 (losses[1..2], weights into out). */
static int run_resume(const char *dir, json_t *adamw, const int32_t *tok, const int32_t *tgt, int T, int ranks, int tier,
                      float *losses, const char *ck, const char *out) {
    const int32_t *TK[2] = {tok, tok + T}, *TG[2] = {tgt, tgt + T};
    int rc = 0;
    for (int half = 0; half < 2 && rc == 0; half++) {
        zs_engine *e = open_engine_x(dir, ranks, tier, 0, 0);
        if (!e) return ZS_EINVAL;
        zs_train_opts o = train_opts(adamw, 1, T, 2 / ranks);
        zs_training *t = NULL;
        rc = zs_training_begin(zs_engine_world(e), &o, &t);
        if (half == 0) {
            if (rc == 0) rc = zs_training_step(t, TK, TG, 1, &losses[0]);
            if (rc == 0) rc = zs_training_save(t, ck, 1, "{\"data\":{\"index\":2}}", 2);
        } else {
            long step = 0;
            char *meta = NULL;
            if (rc == 0) rc = zs_training_load(t, ck, &step, &meta);
            if (rc == 0 && (step != 1 || !meta || strcmp(meta, "{\"data\":{\"index\":2}}")))
                rc = zs_err(ZS_EINVAL, "resume: step %ld, meta %s: not what was saved", step, meta ? meta : "(none)");
            free(meta);
            for (int s = 2; rc == 0 && s <= 3; s++) rc = zs_training_step(t, TK, TG, s, &losses[s - 1]);
            if (rc == 0) rc = zs_training_export(t, out);
        }
        if (t) zs_training_end(t);
        zs_engine_free(e);
    }
    return rc;
}

static int same_file(const char *a, const char *b) {
    char cmd[9000];
    snprintf(cmd, sizeof cmd, "cmp -s '%.4400s' '%.4400s'", a, b);
    return system(cmd) == 0;
}

static void ranks_case(json_t *cs, const char *dir) {
    const char *name = json_string_value(json_object_get(cs, "name"));
    json_t *st = json_object_get(cs, "steps");
    int T = (int)json_integer_value(json_object_get(st, "T"));
    int32_t tok[2 * 32], tgt[2 * 32];
    if (T > 32) { CHECK(0, "ranks sizes"); return; }
    tu_ref_rows(json_object_get(st, "tokens"), 1, T, tok);
    tu_ref_rows(json_object_get(st, "targets"), 1, T, tgt);
    for (int i = 0; i < T; i++) { /* a second sequence */
        tok[T + i] = (tok[i] * 7 + 13) % 300;
        tgt[T + i] = i + 1 < T ? (tok[i + 1] * 7 + 13) % 300 : -1;
    }
    json_t *adamw = json_object_get(st, "adamw");
    struct { int ranks, tier, stage, accum; const char *what; } runs[] = {
        {1, ZS_OFFLOAD_NONE, 0, 2, "1 rank x 2 micro-steps"},
        {2, ZS_OFFLOAD_NONE, 0, 1, "2 ranks, offload none"},
        {2, ZS_OFFLOAD_CPU, 0, 1, "2 ranks, offload cpu"},
        {2, ZS_OFFLOAD_NVME, 0, 1, "2 ranks, offload nvme"},
        {2, ZS_OFFLOAD_NONE, 2, 1, "2 ranks, ZeRO stage 2"},
    };
    enum { NR = sizeof runs / sizeof runs[0] };
    float loss[NR][3];
    char out[NR][4300], file[NR][4400];
    if (strlen(tmp) > 4000) return;
    int same = 1;
    for (int k = 0; k < NR; k++) {
        snprintf(out[k], sizeof out[k], "%.4000s/%.100s-ranks-%d", tmp, name, k);
        snprintf(file[k], sizeof file[k], "%.4300s/model.safetensors", out[k]);
        int rc = run_ranks(dir, adamw, tok, tgt, T, runs[k].ranks, runs[k].tier, runs[k].stage, runs[k].accum, loss[k],
                           out[k], -1);
        CHECK(rc == 0, "%s: %s: %s", name, runs[k].what, zs_errmsg());
        if (rc < 0) return;
        if (k == 0) continue;
        int sl = !memcmp(loss[k], loss[0], sizeof loss[0]), sf = same_file(file[k], file[0]);
        CHECK(sl, "%s: %s: losses %.9g %.9g %.9g vs %.9g %.9g %.9g", name, runs[k].what, loss[k][0], loss[k][1],
              loss[k][2], loss[0][0], loss[0][1], loss[0][2]);
        CHECK(sf, "%s: %s: the exported weights differ from %s's", name, runs[k].what, runs[0].what);
        same &= sl && sf;
    }
    if (same)
        fprintf(stderr, "%s: 1 rank x 2 micro-steps = 2 ranks (offload none, cpu, nvme; ZeRO 2) bit for bit: losses "
                "%.7f %.7f %.7f\n", name, loss[0][0], loss[0][1], loss[0][2]);
    /* a checkpoint after step 1 and a resume (on 2 ranks over cpu): the experts that skipped
     * steps keep their own AdamW counts, so the run is bit for bit the uninterrupted one */
    {
        char ck[4300], ro[4300], rf[4400];
        float lr[3];
        snprintf(ck, sizeof ck, "%.4000s/%.100s-ck", tmp, name);
        snprintf(ro, sizeof ro, "%.4000s/%.100s-resumed", tmp, name);
        snprintf(rf, sizeof rf, "%.4300s/model.safetensors", ro);
        int rc = run_resume(dir, adamw, tok, tgt, T, 2, ZS_OFFLOAD_CPU, lr, ck, ro);
        CHECK(rc == 0, "%s: resume: %s", name, zs_errmsg());
        if (rc == 0)
            CHECK(!memcmp(lr, loss[0], sizeof lr) && same_file(rf, file[0]),
                  "%s: a run resumed after step 1 is bit for bit the uninterrupted one (losses %.9g %.9g %.9g vs %.9g "
                  "%.9g %.9g)", name, lr[0], lr[1], lr[2], loss[0][0], loss[0][1], loss[0][2]);
    }
    /* a rank that fails (an out-of-range token) fails the step on every rank; nobody hangs */
    float lb[3];
    int rc = run_ranks(dir, adamw, tok, tgt, T, 2, ZS_OFFLOAD_NONE, 0, 1, lb, NULL, 1);
    CHECK_ERR(rc, "out of range");
    rc = run_ranks(dir, adamw, tok, tgt, T, 2, ZS_OFFLOAD_CPU, 0, 1, lb, NULL, 0);
    CHECK_ERR(rc, "out of range");
}

static void moe_train_case(tu_ref_case *c, void *ctx) {
    (void)ctx;
    grad_case(c->cs, c->dir, c->ref->bin, c->ref->nbin, 0);
    steps_case(c->cs, c->dir, 0);
    if (c->index == 0) {
        grad_case(c->cs, c->dir, c->ref->bin, c->ref->nbin, 1 << 20);
        steps_case(c->cs, c->dir, 1 << 20);
        protocol_case(c->dir);
        ranks_case(c->cs, c->dir);
    }
    if (json_object_get(c->cs, "lora")) lora_case(c->cs, c->dir);
}

int main(void) {
    zs_log_set_level(ZS_LOG_WARN);
    if (tu_tmpdir(tmp, sizeof tmp, "moe-train") < 0) { fprintf(stderr, "no scratch directory\n"); return 1; }
    int rc = tu_ref_run(REF_DIR "/reference.json", REF_DIR "/reference.bin", "moe-train-models",
                        "tests/ref/moe-grad/make_moe_grad_ref.py", getenv("ZS_MOE_CASE"), moe_train_case, NULL);
    tu_rmdir(tmp);
    return rc < 0 ? 1 : tu_finish("test-moe-train");
}
