/* test-model.c — the forward pass against the reference outputs of the real fixtures
 * (stories260K: Llama with GQA, RoPE, tied head; gpt2-bytes: GPT-2 with biases, LayerNorm,
 * learned positions): logits of the first positions within 1e-4, 64 greedy ids exact, the KV
 * cache path equal to a full prefill, several sequences in one batch, f16/bf16 weights, and
 * model files that are wrong in ways the loader must name (missing tensor, wrong shape). */
#include <float.h>

#include "common.h"
#include "model.h"
#include "ref.h"
#include "safetensors.h"
#include "testutil.h"

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[b]) b = i;
    return b;
}

typedef struct {
    zs_model *m;
    zs_kvcache *kv;
    zs_forward *f;
    zs_weight_source src;
    int vocab;
} rig;

static int rig_open(rig *r, const char *dir, zs_dtype wdt) {
    zs_model_opts o;
    zs_model_opts_default(&o);
    o.weight_dtype = wdt;
    memset(r, 0, sizeof *r);
    int rc = zs_model_open(dir, &o, &r->m);
    if (rc < 0) return rc;
    const zs_model_config *c = zs_model_config_get(r->m);
    if ((rc = zs_model_load_resident(r->m)) < 0) return rc;
    zs_model_close_checkpoint(r->m);
    if ((rc = zs_kv_init(c->n_layers, c->n_kv_heads * c->head_dim, 64, 4, c->max_seq, &r->kv)) < 0) return rc;
    if ((rc = zs_forward_new(r->m, 256, &r->f)) < 0) return rc;
    r->src = zs_model_resident_source(r->m);
    r->vocab = c->vocab_size;
    return 0;
}

static void rig_close(rig *r) {
    zs_forward_free(r->f);
    zs_kv_free(r->kv);
    zs_model_free(r->m);
}

/* Runs ids[0..n) of a fresh sequence at once; logits of every position into out[n*vocab]. */
static int prefill_all(rig *r, const int32_t *ids, int n, float *out) {
    int seq, rc;
    if ((rc = zs_kv_seq_open(r->kv, &seq)) < 0) return rc;
    int32_t pos[256], sq[256], li[256];
    for (int i = 0; i < n; i++) { pos[i] = i; sq[i] = seq; li[i] = i; }
    zs_batch b = {n, ids, pos, sq, li, n, NULL, NULL, NULL};
    rc = zs_kv_seq_reserve(r->kv, seq, n);
    if (rc == 0) rc = zs_forward_run(r->f, &r->src, r->kv, &b, out);
    zs_kv_seq_close(r->kv, seq);
    return rc;
}

/* Prefill the prompt, then greedy decode n_new tokens one by one. */
static int greedy(rig *r, const int32_t *prompt, int np, int n_new, int32_t *out_ids, float *last_prompt_logits,
                  float *all_logits /* (np+n_new-1) rows via decode path, may be NULL */) {
    int seq, rc;
    if ((rc = zs_kv_seq_open(r->kv, &seq)) < 0) return rc;
    float *lg = malloc((size_t)r->vocab * 4);
    int32_t pos[256], sq[256], li[256];
    for (int i = 0; i < np; i++) { pos[i] = i; sq[i] = seq; li[i] = -1; }
    li[np - 1] = 0;
    zs_batch b = {np, prompt, pos, sq, li, 1, NULL, NULL, NULL};
    rc = zs_kv_seq_reserve(r->kv, seq, np);
    if (rc == 0) rc = zs_forward_run(r->f, &r->src, r->kv, &b, lg);
    if (rc == 0 && last_prompt_logits) memcpy(last_prompt_logits, lg, (size_t)r->vocab * 4);
    for (int t = 0; rc == 0 && t < n_new; t++) {
        if (all_logits) memcpy(all_logits + (size_t)(np - 1 + t) * r->vocab, lg, (size_t)r->vocab * 4);
        int32_t tok = argmax(lg, r->vocab), p = np + t, s = seq, l0 = 0;
        out_ids[t] = tok;
        if (t + 1 == n_new) break;
        zs_batch d = {1, &tok, &p, &s, &l0, 1, NULL, NULL, NULL};
        rc = zs_kv_seq_reserve(r->kv, seq, p + 1);
        if (rc == 0) rc = zs_forward_run(r->f, &r->src, r->kv, &d, lg);
    }
    free(lg);
    zs_kv_seq_close(r->kv, seq);
    return rc;
}

static void check_model(const char *name) {
    char dir[4096];
    tu_model_dir(dir, sizeof dir, name);
    json_t *ref = tu_load_reference(dir);
    CHECK(ref != NULL, "%s: reference.json", name);
    if (!ref) return;
    rig r;
    int rc = rig_open(&r, dir, ZS_DTYPE_COUNT);
    CHECK(rc == 0, "%s: open: %s", name, zs_errmsg());
    if (rc < 0) { json_decref(ref); return; }
    json_t *cases = json_object_get(ref, "cases");
    size_t ci;
    json_t *cs;
    json_array_foreach(cases, ci, cs) {
        int32_t prompt[256], want[256], all[512], got[256];
        int np = tu_ref_ids(json_object_get(cs, "prompt_ids"), prompt, 256);
        int nn = tu_ref_ids(json_object_get(cs, "new_ids"), want, 256);
        int na = tu_ref_ids(json_object_get(cs, "all_ids"), all, 512);
        float *lp = malloc((size_t)r.vocab * 4);
        float *full = malloc((size_t)na * r.vocab * 4);
        float *dec = malloc((size_t)na * r.vocab * 4);
        /* greedy ids */
        rc = greedy(&r, prompt, np, nn, got, lp, dec);
        CHECK(rc == 0, "%s case %zu: greedy: %s", name, ci, zs_errmsg());
        int same = 1;
        for (int i = 0; i < nn; i++) if (got[i] != want[i]) { same = 0; fprintf(stderr, "  %s case %zu: step %d: got %d want %d\n", name, ci, i, got[i], want[i]); break; }
        CHECK(same, "%s case %zu: 64 greedy ids equal the reference", name, ci);
        /* logits of the first positions (full causal forward over all_ids) */
        int nfull = na < 256 ? na : 256;
        rc = prefill_all(&r, all, nfull, full);
        CHECK(rc == 0, "%s: prefill: %s", name, zs_errmsg());
        json_t *lg = json_object_get(cs, "logits");
        double maxd = 0;
        for (size_t p = 0; p < json_array_size(lg); p++) {
            json_t *row = json_array_get(lg, p);
            for (int v = 0; v < r.vocab; v++) {
                double d = fabs(full[p * r.vocab + v] - json_real_value(json_array_get(row, v)));
                if (d > maxd) maxd = d;
            }
        }
        fprintf(stderr, "%s case %zu: max |logit - ref| over positions 0-3: %.3g\n", name, ci, maxd);
        CHECK(maxd <= 1e-4, "%s case %zu: logits within 1e-4 (got %.3g)", name, ci, maxd);
        json_t *lr = json_object_get(cs, "logits_last_prompt_position");
        double maxl = 0;
        for (int v = 0; v < r.vocab; v++) {
            double d = fabs(lp[v] - json_real_value(json_array_get(lr, v)));
            if (d > maxl) maxl = d;
        }
        CHECK(maxl <= 1e-4, "%s case %zu: last prompt position logits within 1e-4 (got %.3g)", name, ci, maxl);
        /* the KV-cache decode path agrees with the full forward at every position */
        double maxk = 0;
        for (int p = np - 1; p < na - 1 && p < nfull; p++)
            for (int v = 0; v < r.vocab; v++) {
                double d = fabs(dec[(size_t)p * r.vocab + v] - full[(size_t)p * r.vocab + v]);
                if (d > maxk) maxk = d;
            }
        CHECK(maxk <= 1e-4, "%s case %zu: decode path equals full forward (max diff %.3g)", name, ci, maxk);
        free(lp);
        free(full);
        free(dec);
    }

    /* two sequences in one batch: the same logits as alone */
    {
        json_t *c0 = json_array_get(cases, 0);
        int32_t ids[256];
        int n = tu_ref_ids(json_object_get(c0, "all_ids"), ids, 256);
        if (n > 12) n = 12;
        float *solo = malloc((size_t)n * r.vocab * 4), *both = malloc((size_t)2 * n * r.vocab * 4);
        prefill_all(&r, ids, n, solo);
        int s0, s1;
        zs_kv_seq_open(r.kv, &s0);
        zs_kv_seq_open(r.kv, &s1);
        zs_kv_seq_reserve(r.kv, s0, n);
        zs_kv_seq_reserve(r.kv, s1, 3);
        int32_t tk[256], pos[256], sq[256], li[256];
        for (int i = 0; i < 3; i++) { tk[i] = ids[i]; pos[i] = i; sq[i] = s1; li[i] = -1; }
        for (int i = 0; i < n; i++) { tk[3 + i] = ids[i]; pos[3 + i] = i; sq[3 + i] = s0; li[3 + i] = i; }
        zs_batch b = {n + 3, tk, pos, sq, li, n, NULL, NULL, NULL};
        rc = zs_forward_run(r.f, &r.src, r.kv, &b, both);
        CHECK(rc == 0, "%s: mixed batch: %s", name, zs_errmsg());
        CHECK(memcmp(both, solo, (size_t)n * r.vocab * 4) == 0,
              "%s: a sequence in a mixed batch gets its solo logits, bit for bit", name);
        zs_kv_seq_close(r.kv, s0);
        zs_kv_seq_close(r.kv, s1);
        free(solo);
        free(both);
    }
    rig_close(&r);

    /* half-precision weights: close to f32 (report argmax differences) */
    for (int dt = ZS_F16; dt <= ZS_BF16; dt++) {
        rc = rig_open(&r, dir, (zs_dtype)dt);
        CHECK(rc == 0, "%s %s: open: %s", name, zs_dtype_name(dt), zs_errmsg());
        if (rc < 0) continue;
        json_t *c0 = json_array_get(cases, 0);
        int32_t all[512];
        int na = tu_ref_ids(json_object_get(c0, "all_ids"), all, 512);
        if (na > 256) na = 256;
        float *full = malloc((size_t)na * r.vocab * 4);
        rc = prefill_all(&r, all, na, full);
        CHECK(rc == 0, "%s %s: prefill", name, zs_dtype_name(dt));
        json_t *lg = json_object_get(c0, "logits");
        double maxd = 0;
        for (size_t p = 0; p < json_array_size(lg); p++)
            for (int v = 0; v < r.vocab; v++)
                maxd = fmax(maxd, fabs(full[p * r.vocab + v] - json_real_value(json_array_get(json_array_get(lg, p), v))));
        int diff = 0;
        for (int p = 0; p + 1 < na; p++) diff += argmax(full + (size_t)p * r.vocab, r.vocab) != all[p + 1] && p + 1 >= (int)json_array_size(json_object_get(c0, "prompt_ids"));
        fprintf(stderr, "%s %s weights: max |logit - ref| (positions 0-3) %.3g, greedy argmax differs at %d of %d positions\n",
                name, zs_dtype_name(dt), maxd, diff, na - 1);
        CHECK(maxd < 0.15, "%s %s: logits close to the reference (%.3g)", name, zs_dtype_name(dt), maxd);
        free(full);
        rig_close(&r);
    }
    json_decref(ref);
}

/* Copies config.json and writes model.safetensors with the fixture's tensors, but with
 * `drop` left out and `reshape` declared with a different shape. */
static int write_variant(const char *src_dir, const char *dst, const char *drop, const char *reshape) {
    char p[4200];
    zs_st_set *s;
    if (zs_st_open_dir(src_dir, &s) < 0) return -1;
    size_t n = zs_st_count(s);
    zs_st_decl *d = calloc(n, sizeof *d);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const zs_st_tensor *t = zs_st_at(s, i);
        if (drop && !strcmp(t->name, drop)) continue;
        d[k] = (zs_st_decl){t->name, t->dtype, t->ndim, {0}};
        memcpy(d[k].shape, t->shape, sizeof t->shape);
        if (reshape && !strcmp(t->name, reshape)) { d[k].shape[0] = t->shape[1]; d[k].shape[1] = t->shape[0]; }
        k++;
    }
    snprintf(p, sizeof p, "%s/model.safetensors", dst);
    zs_st_writer *w;
    int rc = zs_st_writer_open(p, d, k, NULL, &w);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        const zs_st_tensor *t = zs_st_at(s, i);
        if (drop && !strcmp(t->name, drop)) continue;
        rc = zs_st_writer_write(w, t->data, t->nbytes);
    }
    if (rc == 0) rc = zs_st_writer_close(w);
    free(d);
    zs_st_close(s);
    char cmd[8800];
    snprintf(cmd, sizeof cmd, "cp '%s/config.json' '%s/'", src_dir, dst);
    return rc == 0 && system(cmd) == 0 ? 0 : -1;
}

static void check_bad_models(void) {
    char src[4096], tmp[4096];
    tu_model_dir(src, sizeof src, "stories260K");
    if (tu_tmpdir(tmp, sizeof tmp, "model") != 0) { CHECK(0, "tmpdir"); return; }
    zs_model *m = NULL;
    CHECK(write_variant(src, tmp, "model.layers.2.mlp.up_proj.weight", NULL) == 0, "write variant");
    CHECK_ERR(zs_model_open(tmp, NULL, &m), "model.layers.2.mlp.up_proj.weight", "not found");
    CHECK(write_variant(src, tmp, NULL, "model.layers.1.self_attn.k_proj.weight") == 0, "write variant");
    CHECK_ERR(zs_model_open(tmp, NULL, &m), "model.layers.1.self_attn.k_proj.weight", "shape", "model.safetensors");
    /* untied config without lm_head.weight */
    char cmd[8400];
    CHECK(write_variant(src, tmp, NULL, NULL) == 0, "write variant");
    snprintf(cmd, sizeof cmd, "sed -i 's/\"tie_word_embeddings\": true/\"tie_word_embeddings\": false/' '%s/config.json'", tmp);
    CHECK(system(cmd) == 0, "sed");
    CHECK_ERR(zs_model_open(tmp, NULL, &m), "lm_head.weight");
    /* a config whose sizes disagree with the tensors */
    snprintf(cmd, sizeof cmd, "sed -i 's/\"intermediate_size\": 172/\"intermediate_size\": 171/; s/\"tie_word_embeddings\": false/\"tie_word_embeddings\": true/' '%s/config.json'", tmp);
    CHECK(system(cmd) == 0, "sed");
    CHECK_ERR(zs_model_open(tmp, NULL, &m), "shape");
    tu_rmdir(tmp);
}

int main(void) {
    check_model("stories260K");
    check_model("gpt2-bytes");
    check_bad_models();
    return tu_finish("test-model");
}
