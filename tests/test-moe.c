/* test-moe.c — mixtures of experts (Mixtral, Qwen2-MoE with its shared expert and a dense layer,
 * Qwen3-MoE with a dense layer, OLMoE with clip_qkv) against Hugging Face transformers, from the
 * reference tests/ref/moe/make_moe_ref.py recorded (no torch needed here).
 *
 * Per case it regenerates the model exactly as `zeroserve init-model <args>` does (the CLI's own
 * parser, server/init-cmd.c; the safetensors checksum must equal the reference's), opens it as
 * an inference model and checks:
 *   - the layout: one bucket per expert after the head (zs_bucket_expert / zs_bucket_is_expert),
 *     the router / shared expert / dense MLP slots of each layer, the experts' slots, the pass
 *     order's ZS_PASS_EXPERTS marks, the parameter count (transformers'), the fingerprint;
 *   - the logits of a 40-token sequence in one prefill against transformers' within
 *     LOGIT_TOL x the case's logit scale, through a weight source that wraps the resident one and
 *     checks the protocol of model.h: experts() is called once per MoE layer while its bucket is
 *     held, with a mask that is exactly the union of the experts transformers routed the call's
 *     tokens to; every agreed expert is acquired once, in increasing order, before the layer is
 *     released, and no other;
 *   - the same sequence prefilled in chunks then token by token, while experts() adds experts no
 *     token here selected (as other ranks' tokens would): every logit bit for bit the one-prefill's,
 *     a decode step's mask exactly its token's k experts;
 *   - the sequence in one batch after another sequence: its rows bit for bit;
 *   - a source whose agreement lacks a selected expert, or whose expert fails to load: an error,
 *     and the next pass is bit for bit the first;
 *   - experts kept resident (persist threshold above their size): bit for bit; quantized at load
 *     (Q8_0, and the Q4_K_M mix: routers stay f32, the shared gate Q8_0 / f32 as llama.cpp's tools make
 *     it, experts follow quant-mix.h's ffn rules, each expert's bytes its f32 slot converted): logits
 *     within a relative RMS error of the reference;
 *   - a LoRA adapter of q and v on the MoE model changes its rows only (other rows bit for bit);
 *     one of gate/up/down is refused;
 *   - GGUF (llama.cpp's names: ffn_gate_inp, stacked ffn_*_exps cut into one slice per expert,
 *     qwen2moe's *_shexp, olmoe's whole-projection q/k norms, Mixtral's permuted Q/K), for models
 *     llama.cpp can represent (every layer sparse, OLMoE without clip_qkv and with as many KV heads
 *     as heads), written by `zeroserve convert` (zs_convert_run): f32 gives the Hugging Face
 *     directory's logits bit for bit; q8_0 keeps its routers f32 and its experts Q8_0 as stored,
 *     (and Qwen2-MoE's shared-expert gate Q8_0, as convert_hf_to_gguf.py writes it), and gives the
 *     logits of the directory quantized at load (Q8_0) bit for bit.
 * Prints "case: logits max|d| = X (scale S)" per case. Skips (77) only without ../shared. */
#include <float.h>

#include "common.h"
#include "convert.h"
#include "init-cmd.h"
#include "init-model.h"
#include "lora.h"
#include "model.h"
#include "quant-mix.h"
#include "ref.h"
#include "testmodel.h"
#include "testutil.h"

#define REF_JSON "tests/ref/moe/moe-ref.json"
#define LOGIT_TOL 1e-5 /* relative to the case's largest |logit| (~3); the code meets ~7e-7 */
/* quantized at load, the logits' relative RMS error against transformers' f32 ones (random weights of
 * std 0.1 and top-k gaps of 1e-4: some tokens take other experts): Q8_0 meets ~0.03, the Q4_K_M mix
 * (Q5_0 / Q8_0 at these row lengths) ~0.19. The exact part: each expert's packed bytes are the f32
 * slot converted (zs_convert). */
#define QUANT_Q8_RMS 0.06
#define QUANT_Q4KM_RMS 0.35
#define MAXT 128
#define SEQ_MAX 64

/* ---- the checking weight source ---- */

#define NW ZS_EXPERT_WORDS
typedef struct {
    zs_weight_source in;
    const zs_model *m;
    int L, ne;
    int held, experts_done, last_e, n_acq; /* the layer bucket held now and its experts so far */
    uint64_t agreed[NW];
    uint64_t mask[ZS_MAX_LAYERS][NW];       /* per layer: the mask experts() saw this call */
    int called[ZS_MAX_LAYERS];
    long expert_acq;                       /* expert acquisitions this call */
    int extra;                             /* experts() adds experts (as other ranks' tokens would) */
    int drop;                              /* experts() leaves out the mask's first expert */
    int fail_e;                            /* acquire of expert fail_e fails (-1: none) */
    int broke;                             /* an injected failure happened (skip the release checks) */
    int violations;
    char why[256];
} csrc;

static void violate(csrc *s, const char *fmt, int a, int b) {
    if (!s->violations++) snprintf(s->why, sizeof s->why, fmt, a, b);
}

static int bit(const uint64_t *m, int e) { return (int)(m[e >> 6] >> (e & 63) & 1); }
static int popcnt(const uint64_t *m) {
    int n = 0;
    for (int i = 0; i < NW; i++) n += __builtin_popcountll(m[i]);
    return n;
}

static int cs_acquire(void *ctx, int b, const void **data) {
    csrc *s = ctx;
    int l, e;
    if (zs_bucket_is_expert(s->m, b, &l, &e)) {
        if (s->held != l || !s->experts_done) violate(s, "expert %d of layer %d acquired outside its layer's mark", e, l);
        else if (!bit(s->agreed, e)) violate(s, "expert %d of layer %d acquired but not agreed", e, l);
        else if (e <= s->last_e) violate(s, "expert %d acquired after expert %d (not increasing)", e, s->last_e);
        s->last_e = e;
        s->n_acq++;
        s->expert_acq++;
        if (e == s->fail_e) {
            s->broke = 1;
            return zs_err(ZS_EIO, "test: expert %d of layer %d is unavailable", e, l);
        }
    } else if (b >= 1 && b <= s->L) {
        if (s->held >= 0) violate(s, "layer %d acquired while layer %d is held", b - 1, s->held);
        s->held = b - 1;
        s->experts_done = 0;
        s->last_e = -1;
        s->n_acq = 0;
    }
    return s->in.acquire(s->in.ctx, b, data);
}

static void cs_release(void *ctx, int b) {
    csrc *s = ctx;
    if (b >= 1 && b <= s->L && !zs_bucket_is_expert(s->m, b, NULL, NULL)) {
        int l = b - 1;
        if (!s->broke && zs_config_layer_moe(zs_model_config_get(s->m), l)) {
            if (!s->experts_done) violate(s, "layer %d released without its experts mark (%d)", l, 0);
            else if (s->n_acq != popcnt(s->agreed))
                violate(s, "layer %d released after %d experts", l, s->n_acq);
        }
        s->held = -1;
    }
    s->in.release(s->in.ctx, b);
}

static int cs_experts(void *ctx, int layer, const uint64_t *mask, uint64_t *agreed) {
    csrc *s = ctx;
    if (s->held != layer) violate(s, "experts() of layer %d while layer %d is held", layer, s->held);
    if (s->called[layer]++) violate(s, "experts() of layer %d called twice in one pass", layer, 0);
    memcpy(s->mask[layer], mask, sizeof s->mask[layer]);
    for (int i = 0; i < NW; i++) agreed[i] = mask[i];
    for (int e = 0; s->extra && e < s->ne; e++)
        if ((e * 5 + layer) % 3 == 0) agreed[e >> 6] |= 1ull << (e & 63);
    if (s->drop)
        for (int i = 0; i < NW; i++)
            if (mask[i]) {
                agreed[i] &= ~(mask[i] & -mask[i]);
                s->broke = 1;
                break;
            }
    memcpy(s->agreed, agreed, sizeof s->agreed);
    s->experts_done = 1;
    return 0;
}

static void cs_init(csrc *s, zs_model *m) {
    memset(s, 0, sizeof *s);
    s->in = zs_model_resident_source(m);
    s->m = m;
    s->L = zs_model_config_get(m)->n_layers;
    s->ne = zs_model_config_get(m)->n_experts;
    s->held = -1;
    s->fail_e = -1;
}

static void cs_call_reset(csrc *s) {
    memset(s->mask, 0, sizeof s->mask);
    memset(s->called, 0, sizeof s->called);
    s->expert_acq = 0;
    s->held = -1;
    s->broke = 0;
}

static zs_weight_source cs_source(csrc *s) { return (zs_weight_source){cs_acquire, cs_release, s, cs_experts}; }

/* ---- a model and its forward ---- */

typedef struct {
    zs_model *m;
    const zs_model_config *c;
    zs_kvcache *kv;
    zs_forward *f;
} rig;

static int rig_open(rig *r, const char *dir, const zs_model_opts *o) {
    memset(r, 0, sizeof *r);
    int rc = zs_model_open(dir, o, &r->m);
    if (rc < 0) return rc;
    r->c = zs_model_config_get(r->m);
    if ((rc = zs_model_load_resident(r->m)) < 0) return rc;
    zs_model_close_checkpoint(r->m);
    if ((rc = zs_kv_init(r->c->n_layers, r->c->n_kv_heads * r->c->head_dim, 64, 4, r->c->max_seq, &r->kv)) < 0)
        return rc;
    return zs_forward_new(r->m, MAXT, &r->f);
}

static void rig_close(rig *r) {
    zs_forward_free(r->f);
    zs_kv_free(r->kv);
    zs_model_free(r->m);
}

/* One call: n tokens of the sequences seqs[i] at positions pos[i], logits of every row into out
 * [n x vocab]; lora per row or NULL. */
static int call(rig *r, zs_weight_source *src, int n, const int32_t *ids, const int32_t *pos, const int32_t *seq,
                const zs_lora *const *lora, float *out) {
    int32_t li[MAXT];
    for (int i = 0; i < n; i++) li[i] = i;
    for (int i = 0; i < n; i++) {
        int rc = zs_kv_seq_reserve(r->kv, seq[i], pos[i] + 1);
        if (rc < 0) return rc;
    }
    zs_batch b = {n, ids, pos, seq, li, n, lora, NULL, NULL};
    return zs_forward_run(r->f, src, r->kv, &b, out);
}

/* A fresh sequence's tokens ids[0..n) in chunks ending at cuts[] (then one token per call); every
 * position's logits into out [n x vocab]. check(k0, k1) runs after each call (the call's
 * positions). */
typedef void (*after_call)(void *ctx, int p0, int p1);
static int run_seq(rig *r, zs_weight_source *src, const int32_t *ids, int n, const int *cuts, int ncuts, float *out,
                   after_call cb, void *ctx) {
    int seq, rc, V = r->c->vocab_size;
    if ((rc = zs_kv_seq_open(r->kv, &seq)) < 0) return rc;
    int32_t pos[MAXT], sq[MAXT];
    int start = 0, k = 0;
    while (rc == 0 && start < n) {
        int end = k < ncuts ? cuts[k++] : start + 1;
        if (end > n) end = n;
        for (int i = start; i < end; i++) {
            pos[i - start] = i;
            sq[i - start] = seq;
        }
        rc = call(r, src, end - start, ids + start, pos, sq, NULL, out + (size_t)start * V);
        if (rc == 0 && cb) cb(ctx, start, end);
        start = end;
    }
    zs_kv_seq_close(r->kv, seq);
    return rc;
}

/* ---- one case ---- */

typedef struct {
    const char *name;
    rig *r;
    csrc *s;
    json_t *routes;   /* [layer] -> null | [pos][k] */
    int k;
    int bad;          /* mask mismatches */
    char why[256];
} route_check;

/* the union of the reference's experts of positions [p0, p1) in layer l */
static void ref_union(json_t *routes, int l, int p0, int p1, uint64_t *u) {
    memset(u, 0, sizeof(uint64_t) * NW);
    json_t *rl = json_array_get(routes, (size_t)l);
    for (int p = p0; p < p1; p++) {
        json_t *row = json_array_get(rl, (size_t)p);
        for (size_t j = 0; j < json_array_size(row); j++) {
            int e = (int)json_integer_value(json_array_get(row, j));
            u[e >> 6] |= 1ull << (e & 63);
        }
    }
}

static void after_check(void *ctx, int p0, int p1) {
    route_check *rc = ctx;
    const zs_model_config *c = rc->r->c;
    for (int l = 0; l < c->n_layers; l++) {
        int moe = zs_config_layer_moe(c, l);
        if (rc->s->called[l] != moe) {
            if (!rc->bad++) snprintf(rc->why, sizeof rc->why, "layer %d: experts() called %d times (sparse: %d)", l,
                                     rc->s->called[l], moe);
            continue;
        }
        if (!moe) continue;
        uint64_t u[NW];
        ref_union(rc->routes, l, p0, p1, u);
        if (memcmp(u, rc->s->mask[l], sizeof u) || (p1 - p0 == 1 && popcnt(u) != rc->k)) {
            if (!rc->bad++)
                snprintf(rc->why, sizeof rc->why, "layer %d, positions %d..%d: mask %016llx, transformers routed %016llx",
                         l, p0, p1 - 1, (unsigned long long)rc->s->mask[l][0], (unsigned long long)u[0]);
        }
    }
    cs_call_reset(rc->s);
}

static double max_diff_at(const float *ours, const float *ref, json_t *want, int V, int *worst_pos) {
    double worst = 0;
    for (size_t w = 0; w < json_array_size(want); w++) {
        int p = (int)json_integer_value(json_array_get(want, w));
        for (int v = 0; v < V; v++) {
            double d = fabs((double)ours[(size_t)p * V + v] - ref[w * V + v]);
            if (!(d <= worst)) {
                worst = d; /* NaN counts as worst */
                if (worst_pos) *worst_pos = p;
            }
        }
    }
    return worst;
}

static void check_layout(const char *name, rig *r, json_t *cs) {
    const zs_model *m = r->m;
    const zs_model_config *c = r->c;
    int L = c->n_layers, ne = c->n_experts, n_moe = 0, head = zs_bucket_head(m);
    for (int l = 0; l < L; l++) n_moe += zs_config_layer_moe(c, l);
    CHECK(n_moe > 0 && zs_model_n_buckets(m) == L + 2 + n_moe * ne && head == L + 1, "%s: %d buckets, head %d", name,
          zs_model_n_buckets(m), head);
    CHECK(zs_model_param_count(m) == (size_t)json_integer_value(json_object_get(cs, "n_params")),
          "%s: %zu parameters, transformers has %lld", name, zs_model_param_count(m),
          (long long)json_integer_value(json_object_get(cs, "n_params")));
    CHECK(strstr(zs_model_fingerprint(m), "-x1") != NULL, "%s: fingerprint %s", name, zs_model_fingerprint(m));
    int next = head + 1;
    size_t xb = 0;
    for (int l = 0; l < L; l++) {
        const zs_bucket_layout *B = zs_model_layout(m, zs_bucket_layer(l));
        int moe = zs_config_layer_moe(c, l), sf = c->shared_ffn_dim;
        if (!moe) {
            CHECK(zs_bucket_expert(m, l, 0) == -1, "%s: dense layer %d has experts", name, l);
            CHECK(B->slot[ZS_R_W_GATE].present && B->slot[ZS_R_W_GATE].shape[0] == c->ffn_dim &&
                  !B->slot[ZS_R_ROUTER].present, "%s: dense layer %d's MLP", name, l);
            continue;
        }
        CHECK(B->slot[ZS_R_ROUTER].present && B->slot[ZS_R_ROUTER].shape[0] == ne && B->slot[ZS_R_ROUTER].shape[1] == c->dim,
              "%s: layer %d router", name, l);
        CHECK(B->slot[ZS_R_W_GATE].present == (sf > 0) && B->slot[ZS_R_SHARED_GATE].present == (sf > 0) &&
              (sf == 0 || (B->slot[ZS_R_W_DOWN].shape[1] == sf && B->slot[ZS_R_SHARED_GATE].shape[0] == 1)),
              "%s: layer %d shared expert", name, l);
        CHECK(zs_bucket_expert(m, l, -1) == -1 && zs_bucket_expert(m, l, ne) == -1, "%s: expert range", name);
        {
            zs_slot_source ss;
            char hfn[160];
            snprintf(hfn, sizeof hfn, "model.layers.%d.%s.gate.weight", l,
                     c->family == ZS_FAM_MIXTRAL ? "block_sparse_moe" : "mlp");
            CHECK(zs_model_slot_source(m, zs_bucket_layer(l), ZS_R_ROUTER, &ss) == 0 && !strcmp(ss.name, hfn),
                  "%s: layer %d router's source", name, l);
            snprintf(hfn, sizeof hfn, "model.layers.%d.mlp.shared_expert_gate.weight", l);
            CHECK(sf == 0 || (zs_model_slot_source(m, zs_bucket_layer(l), ZS_R_SHARED_GATE, &ss) == 0 &&
                              !strcmp(ss.name, hfn) && ss.shape[0] == 1 && ss.shape[1] == c->dim),
                  "%s: layer %d shared gate's source", name, l);
        }
        for (int e = 0; e < ne; e++) {
            int b = zs_bucket_expert(m, l, e), xl = -1, xe = -1;
            CHECK(b == next++, "%s: layer %d expert %d is bucket %d", name, l, e, b);
            CHECK(zs_bucket_is_expert(m, b, &xl, &xe) && xl == l && xe == e, "%s: bucket %d is (%d, %d)", name, b, xl, xe);
            const zs_bucket_layout *X = zs_model_layout(m, b), *G = zs_model_grad_layout(m, b);
            int ok = X->slot[ZS_R_W_GATE].present && X->slot[ZS_R_W_UP].present && X->slot[ZS_R_W_DOWN].present &&
                     X->slot[ZS_R_W_GATE].shape[0] == c->moe_ffn_dim && X->slot[ZS_R_W_DOWN].shape[1] == c->moe_ffn_dim &&
                     G->slot[ZS_R_W_DOWN].present && G->slot[ZS_R_W_DOWN].dtype == ZS_F32;
            for (int s = 0; s < X->n_roles; s++)
                if (s != ZS_R_W_GATE && s != ZS_R_W_UP && s != ZS_R_W_DOWN) ok &= !X->slot[s].present;
            CHECK(ok, "%s: expert bucket %d's slots", name, b);
            /* where export finds it: transformers' name of this expert's down projection */
            zs_slot_source ss;
            char hfn[160];
            if (c->family == ZS_FAM_MIXTRAL) snprintf(hfn, sizeof hfn, "model.layers.%d.block_sparse_moe.experts.%d.w2.weight", l, e);
            else snprintf(hfn, sizeof hfn, "model.layers.%d.mlp.experts.%d.down_proj.weight", l, e);
            CHECK(zs_model_slot_source(m, b, ZS_R_W_DOWN, &ss) == 0 && !strcmp(ss.name, hfn) && ss.kind == ZS_SRC_COPY &&
                  ss.shape[0] == c->dim && ss.shape[1] == c->moe_ffn_dim, "%s: expert %d/%d's source %s", name, l, e,
                  zs_model_slot_source(m, b, ZS_R_W_DOWN, &ss) == 0 ? ss.name : zs_errmsg());
            xb = ZS_MAX(xb, X->data_bytes);
        }
    }
    CHECK(!zs_bucket_is_expert(m, head, NULL, NULL) && !zs_bucket_is_expert(m, 1, NULL, NULL) &&
          !zs_bucket_is_expert(m, zs_model_n_buckets(m), NULL, NULL), "%s: zs_bucket_is_expert of non-experts", name);
    CHECK(xb > 0 && zs_model_expert_bytes(m) == xb, "%s: expert bytes %zu (largest %zu)", name, zs_model_expert_bytes(m), xb);
    int order[2 * ZS_MAX_LAYERS + 8], n = zs_model_pass_order(m, order), want = 0;
    CHECK(n <= zs_model_pass_order_max(m), "%s: pass order of %d > max %d", name, n, zs_model_pass_order_max(m));
    order[n] = 0;
    for (int l = 0; l < L; l++) {
        CHECK(want < n && order[want] == zs_bucket_layer(l), "%s: pass order [%d] = %d", name, want, order[want]);
        want++;
        if (zs_config_layer_moe(c, l)) {
            CHECK(zs_pass_is_experts(order[want]) && zs_pass_experts_layer(order[want]) == l, "%s: no mark after layer %d",
                  name, l);
            want++;
        }
    }
    CHECK(want < n && order[want] == head && n == want + 1 + c->tied_embeddings, "%s: pass order ends %d of %d", name,
          want, n);
}

static void lcg_ids(int32_t *ids, int n, int V, uint64_t s) {
    for (int i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int32_t)((s >> 33) % (uint64_t)V);
    }
}

static int same_rows(const float *a, const float *b, int n, int V) {
    return memcmp(a, b, sizeof(float) * (size_t)n * V) == 0;
}

static void check_case(const char *name, const char *dir, json_t *cs, const float *ref, double *worst_out) {
    rig r;
    zs_model_opts o;
    zs_model_opts_default(&o);
    o.embed_lookup = 1;
    int rc = rig_open(&r, dir, &o);
    CHECK(rc == 0, "%s: open: %s", name, zs_errmsg());
    if (rc < 0) return;
    int V = r.c->vocab_size, n = 0;
    json_t *jt = json_object_get(cs, "tokens"), *want = json_object_get(cs, "logit_positions");
    int32_t ids[SEQ_MAX];
    for (size_t i = 0; i < json_array_size(jt) && i < SEQ_MAX; i++) ids[n++] = (int32_t)json_integer_value(json_array_get(jt, i));
    double scale = json_real_value(json_object_get(cs, "logit_scale")), tol = LOGIT_TOL * ZS_MAX(scale, 1.0);
    CHECK(V == (int)json_integer_value(json_object_get(cs, "vocab")) && n == (int)json_array_size(jt) && n + 24 <= MAXT,
          "%s: reference sizes", name);
    check_layout(name, &r, cs);

    csrc s;
    cs_init(&s, r.m);
    zs_weight_source src = cs_source(&s);
    route_check chk = {name, &r, &s, json_object_get(cs, "routes"), (int)json_integer_value(json_object_get(cs, "n_experts_used")), 0, ""};
    float *one = tu_xcalloc(sizeof(float) * MAXT * V), *lg = tu_xcalloc(sizeof(float) * MAXT * V);

    /* (1) one prefill, against transformers; the masks are transformers' routes */
    int whole[] = {n};
    rc = run_seq(&r, &src, ids, n, whole, 1, one, after_check, &chk);
    CHECK(rc == 0, "%s: prefill: %s", name, zs_errmsg());
    int wp = -1;
    double d = max_diff_at(one, ref, want, V, &wp);
    CHECK(d <= tol, "%s: logits max |d| %.3g at position %d > %.2g", name, d, wp, tol);
    *worst_out = d;
    fprintf(stderr, "%s: one prefill: logits max |d| %.3g (at position %d; scale %.3f)\n", name, d, wp, scale);

    /* (2) chunks, then token by token, with experts agreed that no token here selected */
    s.extra = 1;
    const int cuts[] = {5, 17, 30};
    rc = run_seq(&r, &src, ids, n, cuts, 3, lg, after_check, &chk);
    CHECK(rc == 0, "%s: chunked: %s", name, zs_errmsg());
    CHECK(same_rows(lg, one, n, V), "%s: chunked prefill + decode with more experts agreed != one prefill", name);
    s.extra = 0;
    CHECK(chk.bad == 0, "%s: routing masks (%d wrong): %s", name, chk.bad, chk.why);
    CHECK(s.violations == 0, "%s: weight source protocol (%d): %s", name, s.violations, s.why);

    /* (3) after another sequence in the same call: the rows bit for bit */
    {
        int32_t all[MAXT], pos[MAXT], sq[MAXT];
        int ny = 24, sx, sy;
        lcg_ids(all, ny, V, 99);
        memcpy(all + ny, ids, sizeof(int32_t) * (size_t)n);
        CHECK(zs_kv_seq_open(r.kv, &sy) == 0 && zs_kv_seq_open(r.kv, &sx) == 0, "%s: sequences", name);
        for (int i = 0; i < ny + n; i++) {
            pos[i] = i < ny ? i : i - ny;
            sq[i] = i < ny ? sy : sx;
        }
        rc = call(&r, &src, ny + n, all, pos, sq, NULL, lg);
        CHECK(rc == 0, "%s: batch of two sequences: %s", name, zs_errmsg());
        CHECK(same_rows(lg + (size_t)ny * V, one, n, V), "%s: the sequence's rows after another's differ", name);
        for (int l = 0; l < r.c->n_layers; l++) {
            uint64_t u[NW];
            if (!zs_config_layer_moe(r.c, l)) continue;
            ref_union(chk.routes, l, 0, n, u);
            int sup = 1;
            for (int i = 0; i < NW; i++) sup &= (u[i] & ~s.mask[l][i]) == 0;
            CHECK(sup, "%s: layer %d: the batch's mask lacks the sequence's experts", name, l);
        }
        cs_call_reset(&s);
        zs_kv_seq_close(r.kv, sx);
        zs_kv_seq_close(r.kv, sy);
    }

    /* (4) a broken agreement and a failing expert: errors; then the first pass again, bit for bit */
    s.drop = 1;
    rc = run_seq(&r, &src, ids, n, whole, 1, lg, NULL, NULL);
    CHECK_ERR(rc, "agreed experts lack expert");
    s.drop = 0;
    cs_call_reset(&s);
    for (int l = r.c->n_layers - 1; l >= 0; l--) /* the first expert of token 0 in the first sparse layer */
        if (zs_config_layer_moe(r.c, l))
            s.fail_e = (int)json_integer_value(json_array_get(json_array_get(json_array_get(chk.routes, (size_t)l), 0), 0));
    rc = run_seq(&r, &src, ids, n, whole, 1, lg, NULL, NULL);
    CHECK_ERR(rc, "is unavailable");
    s.fail_e = -1;
    cs_call_reset(&s);
    s.violations = 0;
    rc = run_seq(&r, &src, ids, n, whole, 1, lg, NULL, NULL);
    CHECK(rc == 0 && same_rows(lg, one, n, V) && s.violations == 0, "%s: the pass after the errors: %s", name,
          rc ? zs_errmsg() : s.why);

    /* (5) LoRA: q and v adapted rows change, the others stay; gate/up/down refused */
    {
        zs_lora_params lp = {4, 8.0f, 0, 0.0f, 1u << ZS_LORA_Q | 1u << ZS_LORA_V};
        zs_lora *la = NULL;
        rc = zs_lora_new(r.m, &lp, &la);
        CHECK(rc == 0, "%s: q/v adapter on a MoE model: %s", name, zs_errmsg());
        if (rc == 0) {
            size_t nf;
            float *p = zs_lora_data(la, &nf);
            uint64_t z = 7;
            for (size_t i = 0; i < nf; i++) {
                z = z * 6364136223846793005ull + 1442695040888963407ull;
                p[i] = ((float)(z >> 40) / (float)(1 << 24) * 2.0f - 1.0f) * 0.2f;
            }
            int32_t all[MAXT], pos[MAXT], sq[MAXT];
            const zs_lora *per[MAXT];
            int sa, sb;
            CHECK(zs_kv_seq_open(r.kv, &sa) == 0 && zs_kv_seq_open(r.kv, &sb) == 0, "%s: sequences", name);
            for (int i = 0; i < 2 * n; i++) {
                all[i] = ids[i % n];
                pos[i] = i % n;
                sq[i] = i < n ? sa : sb;
                per[i] = i < n ? la : NULL;
            }
            rc = call(&r, &src, 2 * n, all, pos, sq, per, lg);
            CHECK(rc == 0, "%s: batch with an adapter: %s", name, zs_errmsg());
            CHECK(same_rows(lg + (size_t)n * V, one, n, V), "%s: the rows without the adapter changed", name);
            double dl = 0;
            for (size_t i = 0; i < (size_t)n * V; i++) dl = ZS_MAX(dl, fabs((double)lg[i] - one[i]));
            CHECK(dl > 1e-3, "%s: the adapter changed the logits by %.3g only", name, dl);
            zs_kv_seq_close(r.kv, sa);
            zs_kv_seq_close(r.kv, sb);
            cs_call_reset(&s);
            zs_lora_free(la);
        }
        lp.targets = 1u << ZS_LORA_Q | 1u << ZS_LORA_DOWN;
        la = NULL;
        rc = zs_lora_new(r.m, &lp, &la);
        CHECK(rc < 0, "%s: a down_proj adapter on a mixture of experts was accepted", name);
        zs_lora_free(la);
    }
    free(lg);

    /* (6) experts resident (persist threshold over their size): bit for bit */
    {
        rig q;
        zs_model_opts po = o;
        po.persist_threshold = 1 << 20;
        rc = rig_open(&q, dir, &po);
        CHECK(rc == 0, "%s: open with persist threshold: %s", name, zs_errmsg());
        if (rc == 0) {
            int eb = zs_bucket_expert(q.m, zs_config_layer_moe(q.c, 0) ? 0 : 1, 0);
            const zs_bucket_layout *X = zs_model_layout(q.m, eb);
            CHECK(X->slot[ZS_R_W_DOWN].resident && X->data_bytes == 0, "%s: resident expert layout", name);
            float *lq = tu_xcalloc(sizeof(float) * MAXT * V);
            zs_weight_source rs = zs_model_resident_source(q.m);
            rc = run_seq(&q, &rs, ids, n, whole, 1, lq, NULL, NULL);
            CHECK(rc == 0 && same_rows(lq, one, n, V), "%s: resident experts: %s", name, rc ? zs_errmsg() : "logits differ");
            free(lq);
            rig_close(&q);
        }
    }

    /* (7) quantized at load: Q8_0, and the Q4_K_M mix */
    for (int qk = 0; qk < 2; qk++) {
        rig q;
        zs_model_opts qo = o;
        qo.weight_dtype = qk ? ZS_Q4_K : ZS_Q8_0;
        qo.quant_mix = qk ? ZS_QUANT_MIX_Q4_K_M : ZS_QUANT_MIX_NONE;
        const char *qn = qk ? "Q4_K_M" : "Q8_0";
        rc = rig_open(&q, dir, &qo);
        CHECK(rc == 0, "%s: open %s: %s", name, qn, zs_errmsg());
        if (rc < 0) continue;
        unsigned fl = (q.c->tied_embeddings ? ZS_QMIX_TIED : 0u) | (q.c->n_experts == 8 ? ZS_QMIX_EXPERTS8 : 0u);
        for (int l = 0; l < q.c->n_layers; l++) {
            if (!zs_config_layer_moe(q.c, l)) continue;
            const zs_bucket_layout *B = zs_model_layout(q.m, zs_bucket_layer(l));
            CHECK(B->slot[ZS_R_ROUTER].dtype == ZS_F32 &&
                  (!B->slot[ZS_R_SHARED_GATE].present || B->slot[ZS_R_SHARED_GATE].dtype == (qk ? ZS_F32 : ZS_Q8_0)),
                  "%s %s: layer %d router %s", name, qn, l, zs_dtype_name(B->slot[ZS_R_ROUTER].dtype));
            for (int e = 0; e < q.c->n_experts; e++) {
                const zs_bucket_layout *X = zs_model_layout(q.m, zs_bucket_expert(q.m, l, e));
                static const int roles[3] = {ZS_R_W_GATE, ZS_R_W_UP, ZS_R_W_DOWN};
                for (int k3 = 0; k3 < 3; k3++) {
                    int role = roles[k3];
                    const zs_slot *sl = &X->slot[role];
                    zs_dtype w = qk ? zs_quant_mix_q4_k_m(l, role, q.c->n_layers, sl->shape[1], fl) : ZS_Q8_0;
                    CHECK(sl->dtype == w, "%s %s: layer %d expert %d role %d is %s, not %s", name, qn, l, e, role,
                          zs_dtype_name(sl->dtype), zs_dtype_name(w));
                    /* its bytes: the f32 model's slot converted */
                    int xb = zs_bucket_expert(q.m, l, e);
                    const zs_slot *fs = &zs_model_layout(r.m, xb)->slot[role];
                    size_t cnt = (size_t)(sl->shape[0] * sl->shape[1]), nb = zs_dtype_bytes(sl->dtype, cnt);
                    void *conv = tu_xcalloc(nb);
                    zs_convert(conv, sl->dtype, (const char *)zs_model_bucket_data(r.m, xb) + fs->offset, ZS_F32, cnt);
                    CHECK(!fs->resident && !sl->resident && sl->nbytes == nb &&
                          !memcmp(conv, (const char *)zs_model_bucket_data(q.m, xb) + sl->offset, nb),
                          "%s %s: layer %d expert %d role %d: packed bytes", name, qn, l, e, role);
                    free(conv);
                }
            }
        }
        float *lq = tu_xcalloc(sizeof(float) * MAXT * V);
        zs_weight_source rs = zs_model_resident_source(q.m);
        rc = run_seq(&q, &rs, ids, n, whole, 1, lq, NULL, NULL);
        double se = 0, sr = 0, lim = qk ? QUANT_Q4KM_RMS : QUANT_Q8_RMS;
        for (size_t w = 0; rc == 0 && w < json_array_size(want); w++) {
            int pp = (int)json_integer_value(json_array_get(want, w));
            for (int v = 0; v < V; v++) {
                double e = (double)lq[(size_t)pp * V + v] - ref[w * V + v];
                se += e * e;
                sr += (double)ref[w * V + v] * ref[w * V + v];
            }
        }
        double dq = rc == 0 ? sqrt(se / sr) : INFINITY;
        CHECK(rc == 0 && dq <= lim, "%s: %s logits: relative RMS error %.3g > %.2g (%s)", name, qn, dq, lim,
              rc ? zs_errmsg() : "");
        fprintf(stderr, "%s: %s at load: logits relative RMS error %.3g\n", name, qn, dq);
        free(lq);
        rig_close(&q);
    }
    free(one);
    rig_close(&r);
}

/* ---- GGUF ---- */

static const char *const gguf_cases[][2] = {
    {"mixtral", "--arch mixtral --layers 2 --ffn 32 --kv-heads 2 --experts-used 2 --seed 51"},
    {"qwen2moe", "--arch qwen2moe --layers 2 --ffn 96 --kv-heads 2 --experts-used 2 --moe-ffn 32 --shared-ffn 64 --seed 52"},
    {"qwen3moe", "--arch qwen3moe --layers 2 --ffn 96 --kv-heads 2 --head-dim 16 --experts-used 3 --moe-ffn 32 --seed 53"},
    {"olmoe", "--arch olmoe --layers 2 --ffn 32 --kv-heads 4 --experts-used 2 --seed 54"},
};

static int regen_words(const char *words, const char *out) {
    const char *common = "--dim 64 --heads 4 --vocab 300 --context 64 --experts 8 --init-std 0.1 --random-norms";
    char buf[1024];
    snprintf(buf, sizeof buf, "%s %s", words, common);
    json_t *a = json_array();
    for (char *t = strtok(buf, " "); t; t = strtok(NULL, " ")) json_array_append_new(a, json_string(t));
    int rc = tu_regen_model(a, out);
    json_decref(a);
    return rc;
}

static int logits_of(const char *path, const zs_model_opts *o, const int32_t *ids, int n, float *out, rig *keep) {
    rig r;
    int rc = rig_open(&r, path, o);
    if (rc == 0) {
        zs_weight_source src = zs_model_resident_source(r.m);
        int whole[] = {n};
        rc = run_seq(&r, &src, ids, n, whole, 1, out, NULL, NULL);
    }
    if (keep && rc == 0) *keep = r;
    else rig_close(&r);
    return rc;
}

static void check_gguf(const char *tmp) {
    for (size_t k = 0; k < sizeof gguf_cases / sizeof gguf_cases[0]; k++) {
        const char *name = gguf_cases[k][0];
        char dir[4200], path[4300];
        snprintf(dir, sizeof dir, "%s/gguf-%s", tmp, name);
        int rc = regen_words(gguf_cases[k][1], dir);
        CHECK(rc == 0, "gguf %s: init-model: %s", name, zs_errmsg());
        if (rc < 0) continue;
        int V = 300, n = 33;
        int32_t ids[MAXT];
        lcg_ids(ids, n, V, 1000 + k);
        zs_model_opts o, o8;
        zs_model_opts_default(&o);
        o.embed_lookup = 1;
        o8 = o;
        o8.weight_dtype = ZS_Q8_0;
        float *hf = tu_xcalloc(sizeof(float) * MAXT * V), *hf8 = tu_xcalloc(sizeof(float) * MAXT * V);
        float *gg = tu_xcalloc(sizeof(float) * MAXT * V);
        rc = logits_of(dir, &o, ids, n, hf, NULL);
        CHECK(rc == 0, "gguf %s: the directory: %s", name, zs_errmsg());
        rc = rc ? rc : logits_of(dir, &o8, ids, n, hf8, NULL);
        CHECK(rc == 0, "gguf %s: the directory at Q8_0: %s", name, zs_errmsg());
        for (int t = 0; rc == 0 && t < 2; t++) {
            const char *tn = t ? "q8_0" : "f32";
            snprintf(path, sizeof path, "%s/%s-%s.gguf", tmp, name, tn);
            zs_convert_opts co = {.model_dir = dir, .out_path = path, .ftype = t ? ZS_FTYPE_MOSTLY_Q8_0 : ZS_FTYPE_ALL_F32};
            zs_convert_result cr;
            int crc = zs_convert_run(&co, &cr);
            CHECK(crc == 0, "gguf %s: convert %s: %s", name, tn, zs_errmsg());
            if (crc < 0) continue;
            zs_gguf_conv_close(cr.plan);
            rig g;
            crc = logits_of(path, &o, ids, n, gg, &g);
            CHECK(crc == 0, "gguf %s %s: open and run: %s", name, tn, zs_errmsg());
            if (crc < 0) continue;
            const zs_model_config *c = g.c;
            int sparse = 1;
            for (int l = 0; l < c->n_layers; l++) sparse &= zs_config_layer_moe(c, l);
            CHECK(sparse && c->n_experts == 8 && zs_model_n_buckets(g.m) == c->n_layers * 9 + 2,
                  "gguf %s %s: read as %d experts, %d buckets", name, tn, c->n_experts, zs_model_n_buckets(g.m));
            const zs_bucket_layout *B = zs_model_layout(g.m, zs_bucket_layer(0));
            const zs_bucket_layout *X = zs_model_layout(g.m, zs_bucket_expert(g.m, 0, 5));
            CHECK(B->slot[ZS_R_ROUTER].dtype == ZS_F32 && X->slot[ZS_R_W_UP].dtype == (t ? ZS_Q8_0 : ZS_F32) &&
                  X->slot[ZS_R_W_DOWN].dtype == (t ? ZS_Q8_0 : ZS_F32),
                  "gguf %s %s: router %s, expert %s", name, tn, zs_dtype_name(B->slot[ZS_R_ROUTER].dtype),
                  zs_dtype_name(X->slot[ZS_R_W_UP].dtype));
            const float *want = t ? hf8 : hf;
            double d = 0;
            for (size_t i = 0; i < (size_t)n * V; i++) d = ZS_MAX(d, fabs((double)gg[i] - want[i]));
            CHECK(same_rows(gg, want, n, V), "gguf %s %s: logits max |d| %.3g from the directory's%s",
                  name, tn, d, t ? " at Q8_0" : "");
            fprintf(stderr, "gguf %s %s: logits max |d| %.3g from the directory's\n", name, tn, d);
            rig_close(&g);
        }
        free(hf);
        free(hf8);
        free(gg);
    }
}

static void moe_case(tu_ref_case *c, void *ctx) {
    (void)ctx;
    long off = (long)json_integer_value(json_object_get(c->cs, "logits_offset"));
    int V = (int)json_integer_value(json_object_get(c->cs, "vocab"));
    long nw = (long)json_array_size(json_object_get(c->cs, "logit_positions"));
    if (off < 0 || off + nw * V > c->ref->nbin) {
        CHECK(0, "%s: reference offsets", c->name);
        return;
    }
    double worst = -1;
    check_case(c->name, c->dir, c->cs, c->ref->bin + off, &worst);
    snprintf(c->line, sizeof c->line, "%s: logits max|d| = %.2e (scale %.2f)", c->name, worst,
             json_real_value(json_object_get(c->cs, "logit_scale")));
}

int main(void) {
    struct stat st;
    if (stat(tu_shared(), &st) != 0) {
        fprintf(stderr, "test-moe: skipped (no %s)\n", tu_shared());
        return 77;
    }
    if (tu_ref_run(REF_JSON, NULL, "moe", "tests/ref/moe/make_moe_ref.py", NULL, moe_case, NULL) < 0) return 1;
    fprintf(stderr, "(tolerance: logits %.0e x the logit scale)\n", LOGIT_TOL);
    char tmp[4096];
    if (tu_tmpdir(tmp, sizeof tmp, "moe-gguf") != 0) { fprintf(stderr, "no temp dir\n"); return 1; }
    check_gguf(tmp);
    tu_rmdir(tmp);
    return tu_finish("test-moe");
}
