/* test-lora-forward.c — LoRA adapters in the forward pass and the scheduler (zs_batch.lora,
 * zs_req_params.lora): PEFT's adapter (tests/ref/lora-peft, made by tests/ref/make_lora_ref.py)
 * gives PEFT's logits within 1e-5 through zs_forward_run, and the base alone does not; a batch
 * mixing sequences of two adapters and the base (one adapter's rows scattered) gives every
 * sequence its solo logits bit for bit, in prefill and decode; a sequence decoded token by token
 * with its adapter agrees with its prefill; an adapter of another shape is refused by name; and
 * through zs_sched, concurrent requests of different adapters and the base give their solo greedy
 * tokens, and zs_sched_fail_lora fails the requests of one adapter only. */
#include <pthread.h>

#include "common.h"
#include "device.h"
#include "hold.h"
#include "lora.h"
#include "model.h"
#include "ref.h"
#include "sched.h"
#include "testutil.h"

#define REF "tests/ref/lora-peft"
#define MAXT 256

static char tmp[4096];

/* the base from reference.json's init-model flags (dim overrides its --dim when > 0); its
 * directory into dir */
static zs_model *make_base(json_t *ref, const char *name, int dim, char *dir, size_t cap) {
    char dimbuf[16];
    snprintf(dimbuf, sizeof dimbuf, "%d", dim);
    snprintf(dir, cap, "%s/%s", tmp, name);
    return tu_ref_lora_base_open(ref, dir, dim > 0 ? "--dim" : NULL, dimbuf, 1);
}

typedef struct {
    zs_model *m;
    zs_kvcache *kv;
    zs_forward *f;
    zs_weight_source src;
    int vocab;
} rig;

static int rig_open(rig *r, zs_model *m) {
    const zs_model_config *c = zs_model_config_get(m);
    memset(r, 0, sizeof *r);
    r->m = m;
    r->vocab = c->vocab_size;
    r->src = zs_model_resident_source(m);
    ZS_CHECK(zs_kv_init(c->n_layers, c->n_kv_heads * c->head_dim, 64, 8, c->max_seq, &r->kv));
    return zs_forward_new(m, MAXT, &r->f);
}

static void rig_close(rig *r) {
    zs_forward_free(r->f);
    zs_kv_free(r->kv);
}

/* One sequence of a batch: its ids, its adapter (NULL: the base) and its kv slot. */
typedef struct {
    const int32_t *ids;
    int n;
    const zs_lora *lora;
    int seq;
} seqspec;

/* Prefills the sequences sq[0..ns) in ONE forward call (each on a fresh kv slot, kept open);
 * logits of every position, sequence after sequence, into out. lora_array 0: b.lora stays NULL
 * (only valid when no sequence has an adapter). */
static int prefill(rig *r, seqspec *sq, int ns, int lora_array, float *out) {
    int32_t tok[MAXT], pos[MAXT], seq[MAXT], li[MAXT];
    const zs_lora *lo[MAXT];
    int n = 0;
    for (int s = 0; s < ns; s++) {
        ZS_CHECK(zs_kv_seq_open(r->kv, &sq[s].seq));
        ZS_CHECK(zs_kv_seq_reserve(r->kv, sq[s].seq, sq[s].n + 8));
        for (int i = 0; i < sq[s].n; i++, n++) {
            tok[n] = sq[s].ids[i];
            pos[n] = i;
            seq[n] = sq[s].seq;
            li[n] = n;
            lo[n] = sq[s].lora;
        }
    }
    zs_batch b = {n, tok, pos, seq, li, n, lora_array ? lo : NULL, NULL, NULL};
    return zs_forward_run(r->f, &r->src, r->kv, &b, out);
}

/* One decode step of sequences sq[0..ns) (token toks[s] at position sq[s].n + step) in one call. */
static int decode(rig *r, seqspec *sq, int ns, const int32_t *toks, int step, float *out) {
    int32_t pos[16], seq[16], li[16];
    const zs_lora *lo[16];
    for (int s = 0; s < ns; s++) {
        pos[s] = sq[s].n + step;
        seq[s] = sq[s].seq;
        li[s] = s;
        lo[s] = sq[s].lora;
    }
    zs_batch b = {ns, toks, pos, seq, li, ns, lo, NULL, NULL};
    return zs_forward_run(r->f, &r->src, r->kv, &b, out);
}

static void close_seqs(rig *r, seqspec *sq, int ns) {
    for (int s = 0; s < ns; s++) zs_kv_seq_close(r->kv, sq[s].seq);
}

static double maxdiff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - (double)b[i]));
    return m;
}

/* deterministic values in [-a, a] */
static void fill_random(float *x, size_t n, uint64_t seed, float a) {
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) {
        z = z * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = ((float)(z >> 40) / (float)(1 << 24) * 2.0f - 1.0f) * a;
    }
}

/* adapter B: r 8, alpha 16, on q, v, up and down only, random A and B */
static zs_lora *make_second(const zs_model *m) {
    zs_lora_params p = {8, 16.0f, 0, 0.0f, 1u << ZS_LORA_Q | 1u << ZS_LORA_V | 1u << ZS_LORA_UP | 1u << ZS_LORA_DOWN};
    zs_lora *l = NULL;
    if (zs_lora_new(m, &p, &l) < 0) return NULL;
    size_t n;
    float *d = zs_lora_data(l, &n);
    fill_random(d, n, 77, 0.08f);
    return l;
}

static void test_forward(json_t *ref, zs_model *base, zs_lora *A, zs_lora *B) {
    rig r;
    CHECK(rig_open(&r, base) == 0, "rig: %s", zs_errmsg());
    int V = r.vocab;
    int32_t ids[64];
    json_t *jid = json_object_get(ref, "ids"), *jpos = json_object_get(ref, "positions"), *jlg = json_object_get(ref, "logits");
    int n = (int)json_array_size(jid);
    for (int i = 0; i < n && i < 64; i++) ids[i] = (int32_t)json_integer_value(json_array_get(jid, i));
    float *lg = malloc((size_t)MAXT * V * sizeof(float)), *lg2 = malloc((size_t)MAXT * V * sizeof(float));
    float *solo = malloc((size_t)MAXT * V * sizeof(float));

    /* (a) PEFT's logits */
    seqspec one = {ids, n, A, 0};
    CHECK(prefill(&r, &one, 1, 1, lg) == 0, "prefill with PEFT's adapter: %s", zs_errmsg());
    close_seqs(&r, &one, 1);
    one.lora = NULL;
    CHECK(prefill(&r, &one, 1, 0, lg2) == 0, "prefill of the base: %s", zs_errmsg());
    close_seqs(&r, &one, 1);
    double dl = 0, db = 0;
    for (size_t k = 0; k < json_array_size(jpos); k++) {
        int p = (int)json_integer_value(json_array_get(jpos, k));
        json_t *row = json_array_get(jlg, k);
        for (int v = 0; v < V; v++) {
            double want = json_number_value(json_array_get(row, (size_t)v));
            dl = fmax(dl, fabs(lg[(size_t)p * V + v] - want));
            db = fmax(db, fabs(lg2[(size_t)p * V + v] - want));
        }
    }
    CHECK(dl <= 1e-5, "PEFT's adapter gives PEFT's logits within 1e-5 (max abs diff %.3g)", dl);
    CHECK(db > 1e-2, "the base alone does not (max abs diff %.3g)", db);
    fprintf(stderr, "  PEFT logits: adapter max diff %.3g, base alone %.3g\n", dl, db);

    /* b.lora set with every entry NULL: the base's bits */
    one.lora = NULL;
    CHECK(prefill(&r, &one, 1, 1, lg) == 0, "prefill, lora array of NULLs");
    close_seqs(&r, &one, 1);
    CHECK(!memcmp(lg, lg2, (size_t)n * V * sizeof(float)), "a lora array of NULL entries gives the base's bits");

    /* (b) a mixed batch: A, base, B, A again (A's rows are not one run), each bit for bit its solo run */
    int32_t ids2[20], ids3[14], ids4[9];
    for (int i = 0; i < 20; i++) ids2[i] = (i * 53 + 7) % 299;
    for (int i = 0; i < 14; i++) ids3[i] = (i * 71 + 3) % 299;
    for (int i = 0; i < 9; i++) ids4[i] = (i * 29 + 101) % 299;
    seqspec mix[4] = {{ids, n, A, 0}, {ids2, 20, NULL, 0}, {ids3, 14, B, 0}, {ids4, 9, A, 0}};
    CHECK(prefill(&r, mix, 4, 1, lg) == 0, "mixed prefill: %s", zs_errmsg());
    size_t off = 0;
    int same = 0;
    for (int s = 0; s < 4; s++) {
        seqspec alone = mix[s];
        CHECK(prefill(&r, &alone, 1, 1, solo) == 0, "solo prefill %d", s);
        close_seqs(&r, &alone, 1);
        same += !memcmp(lg + off * V, solo, (size_t)mix[s].n * V * sizeof(float));
        off += (size_t)mix[s].n;
    }
    CHECK(same == 4, "mixed prefill (A, base, B, A): %d of 4 sequences bit for bit their solo logits", same);
    /* decode steps of the four in one batch (greedy from the prefill) against each decoded alone */
    int32_t next[4], nsolo[4][6];
    float *dmix = malloc((size_t)6 * 4 * V * sizeof(float)), *dsolo = malloc((size_t)6 * V * sizeof(float));
    off = 0;
    for (int s = 0; s < 4; s++) {
        const float *last = lg + (off + (size_t)mix[s].n - 1) * V;
        int bst = 0;
        for (int v = 1; v < V; v++) if (last[v] > last[bst]) bst = v;
        next[s] = bst;
        off += (size_t)mix[s].n;
    }
    int32_t first[4];
    memcpy(first, next, sizeof first);
    int rc = 0;
    for (int t = 0; t < 6 && rc == 0; t++) {
        rc = decode(&r, mix, 4, next, t, dmix + (size_t)t * 4 * V);
        for (int s = 0; s < 4; s++) {
            const float *x = dmix + ((size_t)t * 4 + s) * V;
            int bst = 0;
            for (int v = 1; v < V; v++) if (x[v] > x[bst]) bst = v;
            next[s] = bst;
        }
    }
    CHECK(rc == 0, "mixed decode: %s", zs_errmsg());
    close_seqs(&r, mix, 4);
    same = 0;
    int dec_prefill_ok = 1;
    double dmax = 0;
    for (int s = 0; s < 4; s++) {
        seqspec alone = mix[s];
        CHECK(prefill(&r, &alone, 1, 1, solo) == 0, "solo prefill %d", s);
        int32_t tk = first[s];
        int ok = 1;
        for (int t = 0; t < 6; t++) {
            CHECK(decode(&r, &alone, 1, &tk, t, dsolo + (size_t)t * V) == 0, "solo decode");
            ok &= !memcmp(dsolo + (size_t)t * V, dmix + ((size_t)t * 4 + s) * V, (size_t)V * sizeof(float));
            int bst = 0;
            for (int v = 1; v < V; v++) if (dsolo[(size_t)t * V + v] > dsolo[(size_t)t * V + bst]) bst = v;
            nsolo[s][t] = tk = bst;
        }
        same += ok;
        close_seqs(&r, &alone, 1);
        /* (c) the decoded sequence's logits against one prefill of prompt + decoded tokens */
        int32_t full[64];
        memcpy(full, mix[s].ids, (size_t)mix[s].n * sizeof(int32_t));
        full[mix[s].n] = first[s];
        for (int t = 0; t < 5; t++) full[mix[s].n + 1 + t] = nsolo[s][t];
        seqspec whole = {full, mix[s].n + 6, mix[s].lora, 0};
        CHECK(prefill(&r, &whole, 1, 1, solo) == 0, "prefill of the decoded sequence");
        close_seqs(&r, &whole, 1);
        for (int t = 0; t < 6; t++) {
            double d = maxdiff(solo + (size_t)(mix[s].n + t) * V, dsolo + (size_t)t * V, (size_t)V);
            dmax = fmax(dmax, d);
            dec_prefill_ok &= d <= 1e-4;
        }
    }
    CHECK(same == 4, "mixed decode, 6 steps: %d of 4 sequences bit for bit their solo decode", same);
    CHECK(dec_prefill_ok, "decode token by token with the adapters equals the prefill within 1e-4 (max %.3g)", dmax);
    fprintf(stderr, "  decode vs prefill: max diff %.3g\n", dmax);

    /* an adapter of another shape is refused by name, before anything runs */
    char od[4200];
    zs_model *other = make_base(ref, "other", 128, od, sizeof od);
    CHECK(other != NULL, "a base of dim 128");
    if (other) {
        zs_lora *x = NULL;
        zs_lora_params p = {4, 8.0f, 0, 0.0f, ZS_LORA_ALL};
        CHECK(zs_lora_new(other, &p, &x) == 0, "adapter for the other base");
        seqspec bad = {ids, 4, x, 0};
        CHECK_ERR(prefill(&r, &bad, 1, 1, lg), "q_proj", "128");
        close_seqs(&r, &bad, 1);
        CHECK(zs_kv_used_blocks(r.kv) == 0, "nothing left in the cache");
        zs_lora_free(x);
        zs_model_free(other);
    }
    free(dmix);
    free(dsolo);
    free(lg);
    free(lg2);
    free(solo);
    rig_close(&r);
}

/* --- through the scheduler --- */

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done, finish, err, n_tok, delay_us; /* delay_us: on_token sleeps that long (keeps a request running) */
    int32_t toks[64];
    char msg[256];
    zs_request *r;
} req_t;

static void on_token(void *ud, int32_t tok, const char *t, size_t n, float lp, const int32_t *ti, const float *tl, int nt) {
    (void)t; (void)n; (void)lp; (void)ti; (void)tl; (void)nt;
    req_t *q = ud;
    pthread_mutex_lock(&q->mu);
    if (q->n_tok < 64) q->toks[q->n_tok++] = tok;
    pthread_mutex_unlock(&q->mu);
    if (q->delay_us) {
        struct timespec ts = {0, q->delay_us * 1000L};
        nanosleep(&ts, NULL);
    }
}

static void on_done(void *ud, int finish, const char *t, size_t n, int np, int ng, int err, const char *msg) {
    (void)t; (void)n; (void)np; (void)ng;
    req_t *q = ud;
    pthread_mutex_lock(&q->mu);
    q->finish = finish;
    q->err = err;
    snprintf(q->msg, sizeof q->msg, "%s", msg ? msg : "");
    q->done = 1;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

static void req_init(req_t *q) {
    memset(q, 0, sizeof *q);
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
}

static void req_wait(req_t *q) {
    pthread_mutex_lock(&q->mu);
    while (!q->done) pthread_cond_wait(&q->cv, &q->mu);
    pthread_mutex_unlock(&q->mu);
}

static int submit(zs_sched *s, req_t *q, const int32_t *p, int np, int max, const zs_lora *l) {
    zs_req_params rp;
    memset(&rp, 0, sizeof rp);
    rp.prompt = p;
    rp.n_prompt = np;
    rp.max_tokens = max;
    zs_sampler_params_default(&rp.sampling);
    rp.sampling.temperature = 0;
    rp.top_logprobs = -1;
    rp.ignore_eos = 1;
    rp.lora = l;
    zs_req_sink sink = {on_token, on_done, q, NULL};
    return zs_sched_submit(s, &rp, &sink, &q->r);
}

static void test_sched(const char *dir) {
    zs_engine_opts eo;
    zs_engine_opts_default(&eo);
    eo.model_dir = dir;
    eo.max_seqs = 8;
    eo.device = ZS_DEVICE_CPU;
    zs_engine *e = NULL;
    int rc = zs_engine_open(&eo, &e);
    CHECK(rc == 0, "engine: %s", zs_errmsg());
    if (rc < 0) return;
    zs_lora *A = NULL, *B = make_second(zs_engine_model(e));
    CHECK(zs_lora_load(REF, zs_engine_model(e), &A) == 0 && B, "adapters for the engine's model: %s", zs_errmsg());
    zs_sched_opts so = {8, 64, 16, 0, 0, 0, 0, 0, 0, 0, 0};
    zs_sched *s = NULL;
    CHECK(zs_sched_new(e, &so, &s) == 0, "sched: %s", zs_errmsg());
    if (!s || !A || !B) goto out;

    int32_t p[3][8] = {{1, 40, 80, 120, 160, 200}, {1, 33, 66, 99}, {1, 250, 12, 77, 140}};
    int np[3] = {6, 4, 5};
    const zs_lora *lo[3] = {A, NULL, B};
    static req_t solo[3], q[3], qb;
    for (int i = 0; i < 3; i++) {
        req_init(&solo[i]);
        CHECK(submit(s, &solo[i], p[i], np[i], 20, lo[i]) == 0, "submit solo %d: %s", i, zs_errmsg());
        req_wait(&solo[i]);
        CHECK(solo[i].finish == ZS_DONE_LENGTH && solo[i].n_tok == 20, "solo %d: 20 tokens (finish %d, %s)", i, solo[i].finish,
              solo[i].msg);
    }
    /* the adapters matter: the same prompt through the base gives other tokens */
    req_init(&qb);
    CHECK(submit(s, &qb, p[0], np[0], 20, NULL) == 0, "submit base");
    req_wait(&qb);
    CHECK(memcmp(qb.toks, solo[0].toks, sizeof qb.toks), "adapter A's greedy tokens differ from the base's");
    /* all three at once: their solo tokens (held at the start so that they share every step) */
    tu_hold h;
    tu_hold_start(&h, s);
    for (int i = 0; i < 3; i++) {
        req_init(&q[i]);
        CHECK(submit(s, &q[i], p[i], np[i], 20, lo[i]) == 0, "submit %d", i);
    }
    tu_hold_end(&h);
    CHECK(h.rc == TU_HOLD_VALUE, "run_idle returned the job's value (%d)", h.rc);
    int same = 0;
    for (int i = 0; i < 3; i++) {
        req_wait(&q[i]);
        same += q[i].n_tok == 20 && !memcmp(q[i].toks, solo[i].toks, sizeof q[i].toks);
    }
    CHECK(same == 3, "A, base and B concurrently: %d of 3 give their solo greedy tokens", same);

    /* zs_sched_fail_lora: the requests of A (one running, one queued) fail, the others finish */
    static req_t f[4];
    tu_hold h2;
    tu_hold_start(&h2, s);
    const zs_lora *fl[4] = {A, NULL, B, A};
    for (int i = 0; i < 4; i++) {
        req_init(&f[i]);
        CHECK(submit(s, &f[i], p[i % 3], np[i % 3], 20, fl[i]) == 0, "submit %d", i);
    }
    int marked = zs_sched_fail_lora(s, A, "adapter A was unloaded");
    CHECK(marked == 2, "fail_lora marked the 2 requests of A (%d)", marked);
    tu_hold_end(&h2);
    for (int i = 0; i < 4; i++) req_wait(&f[i]);
    CHECK(f[0].finish == ZS_DONE_ERROR && f[3].finish == ZS_DONE_ERROR && f[0].err == ZS_ECANCELLED &&
              !strcmp(f[0].msg, "adapter A was unloaded"),
          "A's requests: ZS_DONE_ERROR, ZS_ECANCELLED, the message (finish %d/%d, '%s')", f[0].finish, f[3].finish, f[0].msg);
    CHECK(f[1].finish == ZS_DONE_LENGTH && !memcmp(f[1].toks, solo[1].toks, sizeof f[1].toks) &&
              f[2].finish == ZS_DONE_LENGTH && !memcmp(f[2].toks, solo[2].toks, sizeof f[2].toks),
          "the base's and B's requests finish with their solo tokens");
    CHECK(zs_sched_fail_lora(s, A, "again") == 0, "no request of A is left");
    /* a running request of B fails within a step */
    req_init(&f[0]);
    f[0].delay_us = 2000;
    CHECK(submit(s, &f[0], p[2], np[2], 50, B) == 0, "submit B");
    while (1) {
        pthread_mutex_lock(&f[0].mu);
        int k = f[0].n_tok, d = f[0].done;
        pthread_mutex_unlock(&f[0].mu);
        if (k > 0 || d) break;
        struct timespec ts = {0, 200000};
        nanosleep(&ts, NULL);
    }
    CHECK(zs_sched_fail_lora(s, B, "B is gone") == 1, "fail_lora marked the running request of B");
    req_wait(&f[0]);
    CHECK(f[0].finish == ZS_DONE_ERROR && f[0].n_tok < 50 && !strcmp(f[0].msg, "B is gone"),
          "a running request of B fails within a step (finish %d after %d tokens)", f[0].finish, f[0].n_tok);
    zs_sched_stats st;
    double t0 = zs_now();
    do zs_sched_stats_get(s, &st);
    while (st.kv_used != 0 && zs_now() - t0 < 1.0);
    CHECK(st.kv_used == 0 && st.running == 0, "KV blocks freed");
out:
    zs_sched_free(s);
    zs_lora_free(A);
    zs_lora_free(B);
    zs_engine_free(e);
}

int main(void) {
    if (tu_tmpdir(tmp, sizeof tmp, "lorafwd") != 0) return 1;
    json_t *ref = json_load_file(REF "/reference.json", 0, NULL);
    CHECK(ref != NULL, "reference.json");
    if (!ref) return tu_finish("test-lora-forward");
    char dir[4200];
    zs_model *base = make_base(ref, "base", 0, dir, sizeof dir);
    CHECK(base != NULL, "base model");
    zs_lora *A = NULL, *B = NULL;
    if (base) {
        CHECK(zs_lora_load(REF, base, &A) == 0, "load PEFT's adapter: %s", zs_errmsg());
        B = make_second(base);
        CHECK(B != NULL, "adapter B: %s", zs_errmsg());
    }
    if (A && B) test_forward(ref, base, A, B);
    zs_lora_free(A);
    zs_lora_free(B);
    zs_model_free(base);
    if (base) test_sched(dir);
    json_decref(ref);
    tu_rmdir(tmp);
    return tu_finish("test-lora-forward");
}
