/* test-export16.c — the streamed Hugging Face export (engine/train/export.c) in F32, F16, BF16 and
 * the base checkpoint's own dtype:
 *  - stories260K and gpt2-bytes opened for training (zs_training_begin) with 1 and 2 ranks, the
 *    weights taken from every rank's storage shard: the F32 file's tensors equal the base
 *    checkpoint's bit for bit (GPT-2: transposed column slices of c_attn, bias slices), F16 and BF16
 *    are their round-to-nearest-even conversions bit for bit, 1 and 2 ranks write the same bytes,
 *    a tiny conversion chunk writes the same bytes, ZS_DTYPE_COUNT is the base's dtype;
 *  - a BF16 copy of stories260K (2 ranks, 2-byte storage elements): ZS_DTYPE_COUNT writes it back bit
 *    for bit, F32 widens it exactly;
 *  - every family init-model makes (phi3's fused rows, qwen2's biases, Gemma's norms, GPT-2's fused
 *    c_attn, the mixtures of experts), in F32, F16 or BF16, from the resident model: every tensor
 *    back bit for bit in the checkpoint's own dtype;
 *  - config.json copied byte for byte when the dtype is kept, else torch_dtype rewritten with every
 *    other key kept in order; the metadata; the files load back (an F32 export gives the base's
 *    logits bit for bit on a 3-token forward; BF16 within 2e-2 of them);
 *  - memory: the peak bytes held are exactly one bucket of fp32 plus the conversion scratch (these
 *    models have no tensor spanning buckets), not the model;
 *  - errors: an unwritable directory, a failing bucket source (the previous export stays, no .tmp),
 *    a quantized dtype, a GGUF model; a non-writer only takes part in the gathers;
 *  - zs_train_export_base_dtype: the majority of the matrices' bytes. */
#include "common.h"
#include "device.h"
#include "engine.h"
#include "export.h"
#include "gather.h"
#include "init-model.h"
#include "safetensors.h"
#include "train.h"
#include "testutil.h"

static char tmp[4096];

/* ---- weight sources ---- */

typedef struct {
    zs_world *w;       /* a training world: every rank's shard; NULL: the resident model's buckets */
    zs_model *m;
    zs_dtype wdt;
    size_t dsize;
    int ranks;
    void *shard;       /* one shard (nvme-style read) */
    int fail_at;       /* -1, or the bucket whose get fails */
    int calls;
} src_ctx;

static int get_bucket(void *ud, int b, float *full) {
    src_ctx *c = ud;
    c->calls++;
    if (b == c->fail_at) return zs_err(ZS_EIO, "test: bucket %d failed on purpose", b);
    if (!c->w) {
        size_t n = zs_model_layout(c->m, b)->data_bytes / c->dsize;
        if (n) zs_to_f32(full, zs_model_bucket_data(c->m, b), c->wdt, n);
        return 0;
    }
    size_t se = zs_partition_shard_bytes(c->m, b, c->ranks) / c->dsize;
    for (int r = 0; r < c->ranks && se > 0; r++) {
        zs_gather *g = zs_world_gather(c->w, r);
        const void *sh = zs_gather_shard_buffer(g, b);
        if (!sh) {
            ZS_CHECK(zs_gather_read_shard(g, b, c->shard));
            sh = c->shard;
        }
        zs_to_f32(full + (size_t)r * se, sh, c->wdt, se);
    }
    return 0;
}

typedef struct {
    src_ctx c;
    zs_export_src s;
    float **rm;
} source;

static void source_init(source *S, zs_model *m, zs_world *w, int ranks) {
    memset(S, 0, sizeof *S);
    int nb = zs_model_n_buckets(m);
    S->c.w = w;
    S->c.m = m;
    S->c.ranks = ranks;
    S->c.wdt = zs_model_layout(m, zs_bucket_layer(0))->slot[ZS_R_WQ].dtype;
    S->c.dsize = zs_dtype_size(S->c.wdt);
    S->c.fail_at = -1;
    S->rm = calloc((size_t)nb, sizeof(float *));
    size_t max_full = 0;
    for (int b = 0; b < nb; b++) {
        const zs_bucket_layout *L = zs_model_layout(m, b), *G = zs_model_grad_layout(m, b);
        size_t full = w ? zs_partition_shard_bytes(m, b, ranks) / S->c.dsize * (size_t)ranks : L->data_bytes / S->c.dsize;
        max_full = ZS_MAX(max_full, full);
        if (G->resident_bytes == 0) continue;
        S->rm[b] = calloc(G->resident_bytes / 4, sizeof(float));
        const char *res = zs_model_bucket_resident(m, b);
        for (int s = 0; s < L->n_roles; s++)
            if (L->slot[s].present && L->slot[s].resident)
                zs_to_f32(S->rm[b] + G->slot[s].offset / 4, res + L->slot[s].offset, L->slot[s].dtype,
                          (size_t)(L->slot[s].shape[0] * L->slot[s].shape[1]));
    }
    S->c.shard = calloc(max_full / (size_t)ranks + 16, sizeof(float));
    S->s = (zs_export_src){m, nb, max_full, S->c.dsize, (const float *const *)S->rm, get_bucket, &S->c, 1, 0};
}

static void source_free(source *S) {
    for (int b = 0; S->rm && b < S->s.n_buckets; b++) free(S->rm[b]);
    free(S->rm);
    free(S->c.shard);
}

/* ---- checks of an export ---- */

static int exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0;
}

static char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) { free(b); b = NULL; }
    fclose(f);
    if (b) { b[n] = 0; *len = (size_t)n; }
    return b;
}

static int same_file(const char *a, const char *b) {
    size_t na = 0, nb = 0;
    char *x = read_all(a, &na), *y = read_all(b, &nb);
    int same = x && y && na == nb && memcmp(x, y, na) == 0;
    free(x);
    free(y);
    return same;
}

/* Every tensor of out equals base's converted to dt (round to nearest even) bit for bit; the same set. */
static void check_tensors(const char *what, const char *out, const char *base, zs_dtype dt) {
    zs_st_set *o = NULL, *s = NULL;
    int rc = zs_st_open_dir(out, &o);
    CHECK(rc == 0, "%s: the export opens: %s", what, zs_errmsg());
    CHECK(zs_st_open_dir(base, &s) == 0, "%s: base opens: %s", what, zs_errmsg());
    if (!o || !s) { zs_st_close(o); zs_st_close(s); return; }
    CHECK(zs_st_count(o) == zs_st_count(s), "%s: %zu tensors, the base has %zu", what, zs_st_count(o), zs_st_count(s));
    size_t bad = 0, dts = 0;
    for (size_t i = 0; i < zs_st_count(o); i++) {
        const zs_st_tensor *x = zs_st_at(o, i), *y = zs_st_find(s, x->name);
        if (!y || x->ndim != y->ndim || memcmp(x->shape, y->shape, sizeof x->shape)) {
            CHECK(0, "%s: tensor %s is not in the base with that shape", what, x->name);
            continue;
        }
        dts += x->dtype != dt;
        size_t n = y->nbytes / zs_dtype_size(y->dtype);
        float *f = malloc(n * sizeof(float));
        void *want = malloc(n * 4);
        zs_to_f32(f, y->data, y->dtype, n);
        zs_convert(want, dt, f, ZS_F32, n);
        if (x->nbytes != n * zs_dtype_size(dt) || memcmp(x->data, want, x->nbytes)) {
            if (bad++ < 3) fprintf(stderr, "%s: %s differs\n", what, x->name);
        }
        free(f);
        free(want);
    }
    CHECK(dts == 0, "%s: %zu tensors not in %s", what, dts, zs_dtype_name(dt));
    CHECK(bad == 0, "%s: %zu tensors differ from the base's (as %s, round to nearest even)", what, bad, zs_dtype_name(dt));
    zs_st_close(o);
    zs_st_close(s);
}

/* The file's __metadata__. */
static json_t *st_metadata(const char *dir) {
    char p[4300];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    FILE *f = fopen(p, "rb");
    if (!f) return NULL;
    uint64_t n = 0;
    json_t *m = NULL;
    if (fread(&n, 8, 1, f) == 1 && n < (1u << 24)) {
        char *h = malloc(n + 1);
        if (h && fread(h, 1, n, f) == n) {
            h[n] = 0;
            json_t *j = json_loads(h, 0, NULL);
            m = json_incref(json_object_get(j, "__metadata__"));
            json_decref(j);
        }
        free(h);
    }
    fclose(f);
    return m;
}

/* config.json of out: byte for byte base's when base's dtype is kept, else every key of the base in its
 * order with the same value, torch_dtype the one asked. */
static void check_config(const char *what, const char *out, const char *base, const char *torch, int copied) {
    char a[4300], b[4300];
    snprintf(a, sizeof a, "%s/config.json", out);
    snprintf(b, sizeof b, "%s/config.json", base);
    if (copied) {
        CHECK(same_file(a, b), "%s: config.json is the base's byte for byte", what);
        return;
    }
    json_t *x = json_load_file(a, 0, NULL), *y = json_load_file(b, 0, NULL);
    CHECK(x && y, "%s: config.json loads", what);
    if (x && y) {
        CHECK(json_object_size(x) == json_object_size(y), "%s: %zu keys, the base %zu", what, json_object_size(x),
              json_object_size(y));
        void *ix = json_object_iter(x), *iy = json_object_iter(y);
        int order = 1, values = 1;
        for (; ix && iy; ix = json_object_iter_next(x, ix), iy = json_object_iter_next(y, iy)) {
            const char *k = json_object_iter_key(ix);
            order &= !strcmp(k, json_object_iter_key(iy));
            if (strcmp(k, "torch_dtype")) values &= json_equal(json_object_iter_value(ix), json_object_iter_value(iy));
        }
        CHECK(order, "%s: config.json keeps the key order", what);
        CHECK(values, "%s: config.json keeps every other value", what);
        const char *td = json_string_value(json_object_get(x, "torch_dtype"));
        CHECK(td && !strcmp(td, torch), "%s: torch_dtype %s, expected %s", what, td ? td : "(none)", torch);
    }
    json_decref(x);
    json_decref(y);
}

static void check_meta(const char *what, const char *out, const char *torch) {
    json_t *m = st_metadata(out);
    const char *f = json_string_value(json_object_get(m, "format")), *z = json_string_value(json_object_get(m, "zeroserve")),
               *d = json_string_value(json_object_get(m, "dtype"));
    CHECK(f && !strcmp(f, "pt") && z && !strcmp(z, "fine-tuned") && d && !strcmp(d, torch),
          "%s: metadata format %s zeroserve %s dtype %s (expected pt, fine-tuned, %s)", what, f ? f : "-", z ? z : "-",
          d ? d : "-", torch);
    json_decref(m);
}

/* The logits of the last of 3 tokens through a resident model of dir (NULL when it does not load). */
static float *forward3(const char *dir, int *vocab) {
    zs_model *m = NULL;
    zs_kvcache *kv = NULL;
    zs_forward *f = NULL;
    float *out = NULL;
    int seq;
    if (zs_model_open(dir, NULL, &m) < 0 || zs_model_load_resident(m) < 0) {
        fprintf(stderr, "%s: %s\n", dir, zs_errmsg());
        zs_model_free(m);
        return NULL;
    }
    const zs_model_config *c = zs_model_config_get(m);
    int32_t tok[3] = {1, 5, 9}, pos[3] = {0, 1, 2}, sq[3], li[3] = {-1, -1, 0};
    *vocab = c->vocab_size;
    if (zs_kv_init(c->n_layers, c->n_kv_heads * c->head_dim, 16, 1, c->max_seq, &kv) == 0 &&
        zs_forward_new(m, 8, &f) == 0 && zs_kv_seq_open(kv, &seq) == 0 && zs_kv_seq_reserve(kv, seq, 3) == 0) {
        for (int i = 0; i < 3; i++) sq[i] = seq;
        zs_batch b = {3, tok, pos, sq, li, 1, NULL, NULL, NULL};
        zs_weight_source src = zs_model_resident_source(m);
        out = malloc((size_t)c->vocab_size * sizeof(float));
        if (zs_forward_run(f, &src, kv, &b, out) < 0) {
            fprintf(stderr, "%s: forward: %s\n", dir, zs_errmsg());
            free(out);
            out = NULL;
        }
    }
    zs_forward_free(f);
    zs_kv_free(kv);
    zs_model_free(m);
    return out;
}

/* ---- a training engine ---- */

typedef struct {
    zs_engine *e;
    zs_training *t;
    source S;
} trained;

static int open_trained(const char *dir, int ranks, trained *T) {
    memset(T, 0, sizeof *T);
    zs_engine_opts eo;
    zs_engine_opts_default(&eo);
    eo.model_dir = dir;
    eo.max_seqs = 1;
    eo.ranks = ranks;
    eo.model.embed_lookup = 0;
    eo.device = ZS_DEVICE_CPU;
    int rc = zs_engine_open(&eo, &T->e);
    if (rc < 0) return rc;
    zs_train_opts to;
    memset(&to, 0, sizeof to);
    to.micro_batch = 1;
    to.seq_len = 8;
    to.grad_accum = 1;
    to.adam.lr = 1e-3f;
    to.lr.type = ZS_LR_CONSTANT;
    to.lr.lr = 1e-3f;
    to.lr.warmup_min_ratio = 1.0f;
    if ((rc = zs_training_begin(zs_engine_world(T->e), &to, &T->t)) < 0) {
        zs_engine_free(T->e);
        T->e = NULL;
        return rc;
    }
    source_init(&T->S, zs_engine_model(T->e), zs_engine_world(T->e), ranks);
    return 0;
}

static void close_trained(trained *T) {
    source_free(&T->S);
    zs_training_end(T->t);
    zs_engine_free(T->e);
}

/* out = <tmp>/<name>; exports, checks tensors, metadata and config, and the peak */
static int export_checked(const char *what, source *S, const char *base, const char *name, zs_dtype ask,
                          zs_dtype expect, int config_copied, char *out, size_t cap) {
    snprintf(out, cap, "%s/%s", tmp, name);
    S->c.calls = 0;
    int rc = zs_train_export_write(&S->s, out, ask);
    CHECK(rc == 0, "%s: export: %s", what, zs_errmsg());
    if (rc < 0) return rc;
    char t[4300];
    snprintf(t, sizeof t, "%s.tmp", out);
    CHECK(!exists(t), "%s: no %s left", what, t);
    CHECK(S->c.calls == S->s.n_buckets, "%s: %d bucket fetches for %d buckets", what, S->c.calls, S->s.n_buckets);
    const char *torch = expect == ZS_F16 ? "float16" : expect == ZS_BF16 ? "bfloat16" : "float32";
    check_tensors(what, out, base, expect);
    check_meta(what, out, torch);
    check_config(what, out, base, torch, config_copied);
    /* memory: one bucket of fp32 and the scratch (no tensor of these models spans buckets) */
    size_t peak = zs_train_export_peak_bytes(), want = S->s.max_full * 4 + zs_train_export_scratch_bytes();
    CHECK(peak == want, "%s: peak %zu bytes, expected one bucket (%zu floats) + scratch = %zu", what, peak,
          S->s.max_full, want);
    return 0;
}

/* ---- the tests ---- */

static void test_stories(void) {
    char base[4096], out[4300], f32_1[4300], bf_1[4300];
    tu_model_dir(base, sizeof base, "stories260K");
    trained T;
    int rc = open_trained(base, 1, &T);
    CHECK(rc == 0, "stories260K opens for training: %s", zs_errmsg());
    if (rc < 0) return;
    size_t model_floats = zs_model_param_count(zs_engine_model(T.e));
    export_checked("stories f32", &T.S, base, "st-f32", ZS_F32, ZS_F32, 1, f32_1, sizeof f32_1);
    CHECK(model_floats > 3 * T.S.s.max_full, "the model (%zu floats) is much more than a bucket (%zu)",
          model_floats, T.S.s.max_full);
    export_checked("stories own dtype", &T.S, base, "st-own", ZS_DTYPE_COUNT, ZS_F32, 1, out, sizeof out);
    {
        char a[4400], b[4400];
        snprintf(a, sizeof a, "%s/model.safetensors", f32_1);
        snprintf(b, sizeof b, "%s/model.safetensors", out);
        CHECK(same_file(a, b), "stories: ZS_DTYPE_COUNT writes the F32 file");
    }
    export_checked("stories bf16", &T.S, base, "st-bf16", ZS_BF16, ZS_BF16, 0, bf_1, sizeof bf_1);
    export_checked("stories f16", &T.S, base, "st-f16", ZS_F16, ZS_F16, 0, out, sizeof out);

    /* the tensors in completion order: the embeddings first, the final norm last */
    {
        zs_st_set *s = NULL;
        char p[4400];
        snprintf(p, sizeof p, "%s/model.safetensors", f32_1);
        if (zs_st_open_file(p, &s) == 0) {
            CHECK(!strcmp(zs_st_at(s, 0)->name, "model.embed_tokens.weight"), "first tensor %s", zs_st_at(s, 0)->name);
            CHECK(!strcmp(zs_st_at(s, zs_st_count(s) - 1)->name, "model.norm.weight"), "last tensor %s",
                  zs_st_at(s, zs_st_count(s) - 1)->name);
            zs_st_close(s);
        }
    }

    /* loads back: F32 gives the base's logits bit for bit, BF16 close to them */
    int v0 = 0, v1 = 0, v2 = 0;
    float *l0 = forward3(base, &v0), *l1 = forward3(f32_1, &v1), *l2 = forward3(bf_1, &v2);
    CHECK(l0 && l1 && l2 && v0 == v1 && v0 == v2, "the exports load and run a forward");
    if (l0 && l1 && l2) {
        CHECK(memcmp(l0, l1, (size_t)v0 * sizeof(float)) == 0, "the F32 export's logits are the base's bit for bit");
        double d = 0, mx = 0;
        for (int i = 0; i < v0; i++) {
            d = fmax(d, fabs(l0[i] - l2[i]));
            mx = fmax(mx, fabs(l0[i]));
        }
        CHECK(d <= 2e-2 * mx && isfinite(d), "the BF16 export's logits within 2e-2 of max |logit| (%g): %g", mx, d);
    }
    free(l0);
    free(l1);
    free(l2);

    /* a non-writer takes part in every gather and writes nothing */
    snprintf(out, sizeof out, "%s/st-nonwriter", tmp);
    T.S.s.writer = 0;
    T.S.s.collective = 1;
    T.S.c.calls = 0;
    CHECK(zs_train_export_write(&T.S.s, out, ZS_BF16) == 0, "non-writer: %s", zs_errmsg());
    CHECK(T.S.c.calls == T.S.s.n_buckets && !exists(out), "non-writer: %d fetches, nothing written", T.S.c.calls);
    CHECK(zs_train_export_peak_bytes() == T.S.s.max_full * 4, "non-writer holds one bucket: %zu",
          zs_train_export_peak_bytes());
    T.S.s.writer = 1;

    /* errors: a directory under a regular file; before any fetch, also in a collective export */
    snprintf(out, sizeof out, "%s/a-file/out", tmp);
    {
        char f[4300];
        snprintf(f, sizeof f, "%s/a-file", tmp);
        CHECK(tu_write_file(f, "x", 1) == 0, "a file");
    }
    for (int coll = 0; coll < 2; coll++) {
        T.S.s.collective = coll;
        T.S.c.calls = 0;
        rc = zs_train_export_write(&T.S.s, out, ZS_F32);
        CHECK_ERR(rc, "cannot create", "a-file/out.tmp");
        CHECK(T.S.c.calls == 0, "collective %d: no fetch after a set-up failure (%d)", coll, T.S.c.calls);
    }
    T.S.s.collective = 0;
    /* a failing fetch: the previous export stays as it was, no .tmp is left */
    char keep[4400], t[4400];
    snprintf(keep, sizeof keep, "%s/model.safetensors", bf_1);
    size_t klen = 0;
    char *before = read_all(keep, &klen);
    T.S.c.fail_at = 2;
    rc = zs_train_export_write(&T.S.s, bf_1, ZS_F32);
    CHECK_ERR(rc, "bucket 2 failed on purpose");
    T.S.c.fail_at = -1;
    snprintf(t, sizeof t, "%s.tmp", bf_1);
    CHECK(!exists(t), "no %s after a failure", t);
    size_t alen = 0;
    char *after = read_all(keep, &alen);
    CHECK(before && after && alen == klen && !memcmp(before, after, klen), "the previous export is untouched");
    free(before);
    free(after);
    /* a successful export replaces it, leaving nothing aside */
    CHECK(zs_train_export_write(&T.S.s, bf_1, ZS_F16) == 0, "re-export: %s", zs_errmsg());
    check_tensors("re-export", bf_1, base, ZS_F16);
    snprintf(t, sizeof t, "%s.tmp-old", bf_1);
    CHECK(!exists(t), "no %s after a re-export", t);
    CHECK(zs_train_export_write(&T.S.s, bf_1, ZS_BF16) == 0, "re-export: %s", zs_errmsg());
    CHECK_ERR(zs_train_export_write(&T.S.s, out, ZS_Q8_0), "Q8_0");
    close_trained(&T);

    /* 2 ranks write the same bytes */
    rc = open_trained(base, 2, &T);
    CHECK(rc == 0, "stories260K opens with 2 ranks: %s", zs_errmsg());
    if (rc < 0) return;
    char f32_2[4300], bf_2[4300];
    export_checked("stories f32 2 ranks", &T.S, base, "st-f32-2", ZS_F32, ZS_F32, 1, f32_2, sizeof f32_2);
    export_checked("stories bf16 2 ranks", &T.S, base, "st-bf16-2", ZS_BF16, ZS_BF16, 0, bf_2, sizeof bf_2);
    char a[4400], b[4400];
    snprintf(a, sizeof a, "%s/model.safetensors", f32_1);
    snprintf(b, sizeof b, "%s/model.safetensors", f32_2);
    CHECK(same_file(a, b), "F32: 1 and 2 ranks write the same file");
    snprintf(a, sizeof a, "%s/model.safetensors", bf_1);
    snprintf(b, sizeof b, "%s/model.safetensors", bf_2);
    CHECK(same_file(a, b), "BF16: 1 and 2 ranks write the same file");
    close_trained(&T);
}

/* stories260K as BF16 (round to nearest even), torch_dtype bfloat16 */
static int make_bf16_base(const char *src, const char *dst) {
    char p[4400];
    if (mkdir(dst, 0777) != 0) return -1;
    zs_st_set *s = NULL;
    ZS_CHECK(zs_st_open_dir(src, &s));
    size_t n = zs_st_count(s);
    zs_st_decl *d = calloc(n, sizeof *d);
    for (size_t i = 0; i < n; i++) {
        const zs_st_tensor *t = zs_st_at(s, i);
        d[i].name = t->name;
        d[i].dtype = ZS_BF16;
        d[i].ndim = t->ndim;
        memcpy(d[i].shape, t->shape, sizeof d[i].shape);
    }
    snprintf(p, sizeof p, "%s/model.safetensors", dst);
    zs_st_writer *w = NULL;
    int rc = zs_st_writer_open(p, d, n, "{\"format\":\"pt\"}", &w);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        const zs_st_tensor *t = zs_st_at(s, i);
        size_t k = t->nbytes / 4;
        uint16_t *h = malloc(k * 2);
        zs_convert(h, ZS_BF16, t->data, ZS_F32, k);
        rc = zs_st_writer_write(w, h, k * 2);
        free(h);
    }
    rc = rc == 0 ? zs_st_writer_close(w) : (zs_st_writer_abort(w), rc);
    free(d);
    zs_st_close(s);
    if (rc < 0) return rc;
    snprintf(p, sizeof p, "%s/config.json", src);
    json_t *c = json_load_file(p, 0, NULL);
    json_object_set_new(c, "torch_dtype", json_string("bfloat16"));
    snprintf(p, sizeof p, "%s/config.json", dst);
    rc = json_dump_file(c, p, JSON_INDENT(2));
    json_decref(c);
    static const char *files[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"};
    for (int i = 0; rc == 0 && i < 3; i++) {
        char a[4400];
        size_t len = 0;
        snprintf(a, sizeof a, "%s/%s", src, files[i]);
        char *x = read_all(a, &len);
        snprintf(a, sizeof a, "%s/%s", dst, files[i]);
        rc = x && tu_write_file(a, x, len) == 0 ? 0 : -1;
        free(x);
    }
    return rc;
}

static void test_bf16_base(void) {
    char src[4096], base[4300], out[4300];
    tu_model_dir(src, sizeof src, "stories260K");
    snprintf(base, sizeof base, "%s/stories-bf16", tmp);
    int rc = make_bf16_base(src, base);
    CHECK(rc == 0, "a BF16 stories260K: %s", zs_errmsg());
    if (rc < 0) return;
    zs_dtype dt = ZS_DTYPE_COUNT;
    CHECK(zs_train_export_base_dtype(base, &dt) == 0 && dt == ZS_BF16, "the BF16 base's dtype: %s", zs_dtype_name(dt));
    trained T;
    rc = open_trained(base, 2, &T);
    CHECK(rc == 0, "the BF16 base opens for training: %s", zs_errmsg());
    if (rc < 0) return;
    CHECK(T.S.s.dsize == 2, "BF16 storage: %zu-byte elements", T.S.s.dsize);
    export_checked("bf16 base own dtype", &T.S, base, "bfb-own", ZS_DTYPE_COUNT, ZS_BF16, 1, out, sizeof out);
    char a[4400], b[4400];
    snprintf(a, sizeof a, "%s/model.safetensors", out);
    snprintf(b, sizeof b, "%s/model.safetensors", base);
    zs_st_set *x = NULL, *y = NULL;
    if (zs_st_open_file(a, &x) == 0 && zs_st_open_file(b, &y) == 0) {
        int same = zs_st_count(x) == zs_st_count(y);
        for (size_t i = 0; same && i < zs_st_count(x); i++) {
            const zs_st_tensor *p = zs_st_at(x, i), *q = zs_st_find(y, p->name);
            same = q && p->nbytes == q->nbytes && !memcmp(p->data, q->data, p->nbytes);
        }
        CHECK(same, "the BF16 base comes back bit for bit");
    }
    zs_st_close(x);
    zs_st_close(y);
    export_checked("bf16 base f32", &T.S, base, "bfb-f32", ZS_F32, ZS_F32, 0, out, sizeof out);
    int v = 0;
    float *l = forward3(out, &v);
    CHECK(l != NULL, "the F32 export of a BF16 base loads and runs");
    free(l);
    close_trained(&T);
}

static void test_gpt2(void) {
    char base[4096], out[4300], small[4300];
    tu_model_dir(base, sizeof base, "gpt2-bytes");
    trained T;
    int rc = open_trained(base, 2, &T);
    CHECK(rc == 0, "gpt2-bytes opens for training: %s", zs_errmsg());
    if (rc < 0) return;
    export_checked("gpt2 f32", &T.S, base, "g-f32", ZS_F32, ZS_F32, 1, out, sizeof out);
    export_checked("gpt2 f16", &T.S, base, "g-f16", ZS_F16, ZS_F16, 0, out, sizeof out);
    /* a chunk that divides nothing: the same bytes */
    zs_train_export_set_chunk(1000);
    export_checked("gpt2 f16 chunk 1000", &T.S, base, "g-f16-small", ZS_F16, ZS_F16, 0, small, sizeof small);
    zs_train_export_set_chunk(0);
    char a[4400], b[4400];
    snprintf(a, sizeof a, "%s/model.safetensors", out);
    snprintf(b, sizeof b, "%s/model.safetensors", small);
    CHECK(same_file(a, b), "gpt2: a 1000-element chunk writes the same file");
    /* every tensor through an fp32 buffer, as one spanning buckets would be: the same bytes, more memory */
    size_t streamed = T.S.s.max_full * 4 + zs_train_export_scratch_bytes();
    snprintf(small, sizeof small, "%s/g-f16-buffered", tmp);
    snprintf(b, sizeof b, "%s/model.safetensors", small);
    zs_train_export_set_buffered(1);
    CHECK(zs_train_export_write(&T.S.s, small, ZS_F16) == 0, "gpt2 buffered: %s", zs_errmsg());
    zs_train_export_set_buffered(0);
    CHECK(same_file(a, b), "gpt2: the buffered path writes the same file");
    CHECK(zs_train_export_peak_bytes() > streamed, "gpt2 buffered: the buffers are counted (%zu, streamed %zu)",
          zs_train_export_peak_bytes(), streamed);
    int v0 = 0, v1 = 0;
    snprintf(out, sizeof out, "%s/g-f32", tmp);
    float *l0 = forward3(base, &v0), *l1 = forward3(out, &v1);
    CHECK(l0 && l1 && v0 == v1 && !memcmp(l0, l1, (size_t)v0 * sizeof(float)), "gpt2: the F32 export's logits are the base's");
    free(l0);
    free(l1);
    close_trained(&T);
}

/* init-model families, small, with random norms and biases, from the resident model */
static void test_families(void) {
    static const struct { const char *arch; zs_dtype dt; } F[] = {
        {"llama", ZS_F32}, {"mistral", ZS_BF16}, {"qwen2", ZS_BF16}, {"qwen3", ZS_F16}, {"gemma2", ZS_BF16},
        {"gemma3", ZS_F32}, {"phi3", ZS_F32}, {"gpt2", ZS_F16}, {"mixtral", ZS_F32}, {"qwen2moe", ZS_BF16},
        {"qwen3moe", ZS_F32}, {"olmoe", ZS_BF16},
    };
    for (size_t i = 0; i < sizeof F / sizeof F[0]; i++) {
        char dir[4300], out[4300], what[64];
        snprintf(dir, sizeof dir, "%s/fam-%s", tmp, F[i].arch);
        snprintf(what, sizeof what, "%s", F[i].arch);
        zs_init_opts io;
        int rc = zs_init_opts_default(F[i].arch, &io);
        zs_model_config *c = &io.cfg;
        c->n_layers = 2;
        c->dim = 64;
        c->n_heads = 4;
        c->n_kv_heads = c->arch == ZS_ARCH_GPT2 ? 4 : 2;
        c->head_dim = 16;
        c->ffn_dim = 96;
        c->vocab_size = 300;
        c->max_seq = 64;
        if (c->sliding_window > 32) c->sliding_window = 32;
        c->dtype = F[i].dt;
        if (c->n_experts > 0) {
            c->n_experts = 4;
            c->n_experts_used = 2;
            c->moe_ffn_dim = c->family == ZS_FAM_MIXTRAL ? c->ffn_dim : 32; /* Mixtral's is intermediate_size */
            if (c->shared_ffn_dim > 0) c->shared_ffn_dim = 48;
        }
        io.random_norms = 1;
        io.seed = 7 + i;
        if (rc == 0) rc = zs_config_override(c, "{}", what); /* what follows from the sizes (Gemma's embed_scale) */
        if (rc == 0) rc = zs_init_model_write(&io, dir);
        CHECK(rc == 0, "%s: init-model: %s", what, zs_errmsg());
        if (rc < 0) continue;
        zs_model *m = NULL;
        rc = zs_model_open(dir, NULL, &m);
        if (rc == 0) rc = zs_model_load_resident(m);
        CHECK(rc == 0, "%s: opens: %s", what, zs_errmsg());
        if (rc == 0) {
            source S;
            source_init(&S, m, NULL, 1);
            export_checked(what, &S, dir, F[i].arch, ZS_DTYPE_COUNT, F[i].dt, 1, out, sizeof out);
            source_free(&S);
        }
        zs_model_free(m);
    }
}

static void test_gguf(void) {
    char p[4300];
    tu_model_dir(p, sizeof p, "stories260K/stories260K.gguf");
    zs_model *m = NULL;
    if (zs_model_open(p, NULL, &m) < 0 || zs_model_load_resident(m) < 0) {
        CHECK(0, "the GGUF opens: %s", zs_errmsg());
        zs_model_free(m);
        return;
    }
    source S;
    source_init(&S, m, NULL, 1);
    S.s.dsize = 4;
    char out[4300];
    snprintf(out, sizeof out, "%s/gguf-out", tmp);
    CHECK_ERR(zs_train_export_write(&S.s, out, ZS_F32), "GGUF");
    CHECK(S.c.calls == 0 && !exists(out), "a GGUF model: nothing fetched or written");
    source_free(&S);
    zs_model_free(m);
}

static int write_st(const char *dir, const zs_st_decl *d, size_t n) {
    char p[4300];
    mkdir(dir, 0777);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    zs_st_writer *w = NULL;
    ZS_CHECK(zs_st_writer_open(p, d, n, NULL, &w));
    static char zero[65536];
    for (size_t i = 0; i < n; i++) {
        size_t k = zs_dtype_size(d[i].dtype);
        for (int j = 0; j < d[i].ndim; j++) k *= (size_t)d[i].shape[j];
        int rc = zs_st_writer_write(w, zero, k);
        if (rc < 0) { zs_st_writer_abort(w); return rc; }
    }
    return zs_st_writer_close(w);
}

static void test_base_dtype(void) {
    char dir[4300];
    zs_dtype dt = ZS_DTYPE_COUNT;
    /* matrices: 8 KiB of BF16 against 4 KiB of F32; a 40 KB F32 vector does not count */
    zs_st_decl a[] = {{"a", ZS_BF16, 2, {64, 64}}, {"b", ZS_F32, 2, {32, 32}}, {"c", ZS_F32, 1, {10000}}};
    snprintf(dir, sizeof dir, "%s/mixed", tmp);
    CHECK(write_st(dir, a, 3) == 0, "mixed file: %s", zs_errmsg());
    CHECK(zs_train_export_base_dtype(dir, &dt) == 0 && dt == ZS_BF16, "mixed: the matrices' majority, BF16: %s",
          zs_dtype_name(dt));
    /* no matrices: every tensor counts */
    zs_st_decl b[] = {{"a", ZS_F16, 1, {100}}, {"b", ZS_F32, 1, {10}}};
    snprintf(dir, sizeof dir, "%s/vectors", tmp);
    CHECK(write_st(dir, b, 2) == 0, "vector file: %s", zs_errmsg());
    CHECK(zs_train_export_base_dtype(dir, &dt) == 0 && dt == ZS_F16, "vectors only: F16: %s", zs_dtype_name(dt));
    /* a tie goes to the wider type */
    zs_st_decl c[] = {{"a", ZS_F16, 2, {8, 8}}, {"b", ZS_BF16, 2, {8, 8}}};
    snprintf(dir, sizeof dir, "%s/tie", tmp);
    CHECK(write_st(dir, c, 2) == 0, "tie file: %s", zs_errmsg());
    CHECK(zs_train_export_base_dtype(dir, &dt) == 0 && dt == ZS_BF16, "a tie: BF16: %s", zs_dtype_name(dt));
    snprintf(dir, sizeof dir, "%s/none", tmp);
    CHECK_ERR(zs_train_export_base_dtype(dir, &dt), "none");
}

int main(void) {
    if (tu_tmpdir(tmp, sizeof tmp, "export16") != 0) {
        fprintf(stderr, "cannot create a scratch directory\n");
        return 1;
    }
    test_base_dtype();
    test_stories();
    test_bf16_base();
    test_gpt2();
    test_families();
    test_gguf();
    tu_rmdir(tmp);
    return tu_finish("test-export16");
}
