/* test-spec.c — speculative decoding (spec.h, sched-spec.c, zs_sampler_verify).
 *   - Prompt lookup (spec-ngram.c) proposes the continuation of the latest earlier occurrence of
 *     the longest suffix, and nothing without one.
 *   - zs_sampler_verify keeps the target's distribution: 200,000 draws with a draft (likely,
 *     unlikely, outside top_k) against 200,000 of zs_sampler_sample, chi-square; greedy: the bits
 *     and the generator of zs_sampler_sample.
 *   - Greedy outputs with speculation are those of plain decoding (one token per sequence and
 *     step, no jump-forward) bit for bit — tokens, logprob bits, finish — for 300 mixed requests
 *     on stories260K: copying and looping prompts, real text, stop strings, EOS, max_tokens inside
 *     accepted runs, top logprobs, LoRA adapters, constrained requests (their forced tokens go in
 *     as drafts: jump-forward); with drafts per sequence chosen from the measured costs and fixed
 *     at 4 and 16; with 1 rank, 2 ranks, and 2 ranks over NVMe shards. And for a random Qwen3-MoE
 *     model. Speculation must have happened (drafts accepted, more than one token per pass).
 *   - Sampled outputs: the distributions of the second, third and fourth tokens under speculation
 *     equal plain sampling's (3,000 seeds each, chi-square). */
#include <math.h>
#include <pthread.h>
#include <unistd.h>

#include "common.h"
#include "config.h"
#include "init-model.h"
#include "jsonschema.h"
#include "lora.h"
#include "model.h"
#include "sampler.h"
#include "sched.h"
#include "spec.h"
#include "testutil.h"

/* ---------- prompt lookup ---------- */

static void test_ngram(void) {
    zs_spec *p = NULL;
    CHECK(zs_spec_ngram_new(2, 4, &p) == 0, "ngram: %s", zs_errmsg());
    CHECK(zs_spec_ngram_new(0, 4, &(zs_spec *){NULL}) == ZS_ERANGE, "min 0 refused");
    if (!p) return;
    int32_t a[] = {1, 5, 6, 7, 8, 9, 2, 5, 6, 7}, d[8];
    zs_spec_req q = {1, a, 10, 3, d, 0};
    CHECK(zs_spec_propose(p, &q, 1) == 0 && q.n_draft == 3 && d[0] == 8 && d[1] == 9 && d[2] == 2,
          "5 6 7 seen before: 8 9 2 proposed (%d: %d %d %d)", q.n_draft, d[0], d[1], d[2]);
    int32_t b[] = {1, 4, 5, 9, 4, 5, 8, 3, 4, 5};
    q = (zs_spec_req){2, b, 10, 5, d, 0};
    CHECK(zs_spec_propose(p, &q, 1) == 0 && q.n_draft == 4 && d[0] == 8 && d[1] == 3 && d[2] == 4 && d[3] == 5,
          "the most recent occurrence of 4 5: 8 3 4 5, up to the end (%d: %d %d %d %d)", q.n_draft, d[0], d[1], d[2],
          d[3]);
    int32_t c[] = {1, 2, 3, 4, 5, 6};
    q = (zs_spec_req){3, c, 6, 4, d, 0};
    CHECK(zs_spec_propose(p, &q, 1) == 0 && q.n_draft == 0, "no repeated n-gram: nothing proposed");
    int32_t e2[] = {7, 7};
    q = (zs_spec_req){4, e2, 2, 4, d, 0};
    CHECK(zs_spec_propose(p, &q, 1) == 0 && q.n_draft == 0, "too short for a 2-gram: nothing");
    CHECK(!strcmp(zs_spec_name(p), "ngram"), "name");
    zs_spec_free(p);
}

/* ---------- the verification rule ---------- */

/* chi-square critical value at significance 0.001 for df degrees (Wilson-Hilferty) */
static double chi2_crit(int df) {
    double z = 3.0902, h = 2.0 / (9.0 * df);
    return df * pow(1 - h + z * sqrt(h), 3);
}

/* two-sample chi-square over the categories where the pooled count is >= 10 (the rest pooled);
 * 1 when the samples look alike at 0.001 */
static int same_dist(const long *a, const long *b, int n, long na, long nb, double *stat, int *dfo) {
    double x = 0, ra = 0, rb = 0;
    int df = -1;
    double k1 = sqrt((double)nb / na), k2 = sqrt((double)na / nb);
    for (int i = 0; i < n; i++) {
        if (a[i] + b[i] < 10) {
            ra += a[i];
            rb += b[i];
            continue;
        }
        double d = k1 * a[i] - k2 * b[i];
        x += d * d / (double)(a[i] + b[i]);
        df++;
    }
    if (ra + rb >= 10) {
        double d = k1 * ra - k2 * rb;
        x += d * d / (ra + rb);
        df++;
    }
    *stat = x;
    *dfo = df;
    return df < 1 || x < chi2_crit(df);
}

static void test_verify(void) {
    enum { V = 60, N = 200000 };
    float lg[V];
    uint64_t z = 99;
    for (int i = 0; i < V; i++) {
        z = z * 6364136223846793005ull + 1442695040888963407ull;
        lg[i] = (float)((double)(z >> 40) / (1 << 24) * 6.0 - 3.0);
    }
    int argmax = 0, low = 0;
    for (int i = 1; i < V; i++) {
        if (lg[i] > lg[argmax]) argmax = i;
        if (lg[i] < lg[low]) low = i;
    }
    struct { float t, top_p; int top_k; int draft; const char *what; } cases[] = {
        {1.0f, 1.0f, 0, argmax, "temperature 1, the likeliest draft"},
        {0.7f, 1.0f, 0, low, "temperature 0.7, the least likely draft"},
        {1.3f, 0.9f, 10, low, "top_k 10, top_p 0.9, a draft outside them"},
        {0.9f, 1.0f, 5, argmax, "top_k 5, the likeliest draft"},
    };
    static long ca[V], cb[V];
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        zs_sampler_params sp;
        zs_sampler_params_default(&sp);
        sp.temperature = cases[c].t;
        sp.top_p = cases[c].top_p;
        sp.top_k = cases[c].top_k;
        zs_sampler *s1 = NULL, *s2 = NULL;
        sp.seed = 1;
        CHECK(zs_sampler_new(&sp, V, &s1) == 0, "sampler");
        sp.seed = 2;
        CHECK(zs_sampler_new(&sp, V, &s2) == 0, "sampler");
        if (!s1 || !s2) return;
        memset(ca, 0, sizeof ca);
        memset(cb, 0, sizeof cb);
        long acc = 0;
        int bad = 0;
        for (int i = 0; i < N; i++) {
            int t = 0, a = 0;
            bad |= zs_sampler_verify(s1, lg, cases[c].draft, &t, &a, NULL) != 0 || a != (t == cases[c].draft);
            ca[t]++;
            acc += a;
            bad |= zs_sampler_sample(s2, lg, &t, NULL) != 0;
            cb[t]++;
        }
        double x;
        int df;
        CHECK(!bad, "%s: the calls worked and accepted says whether the token is the draft", cases[c].what);
        CHECK(same_dist(ca, cb, V, N, N, &x, &df), "%s: verified tokens follow the target (chi-square %.1f, %d df, "
              "critical %.1f)", cases[c].what, x, df, chi2_crit(df));
        fprintf(stderr, "verify: %s: %.3f accepted, chi-square %.1f on %d df\n", cases[c].what, (double)acc / N, x, df);
        zs_sampler_free(s1);
        zs_sampler_free(s2);
    }
    /* greedy: zs_sampler_sample's token, logprob bits and generator */
    zs_sampler_params sp;
    zs_sampler_params_default(&sp);
    sp.temperature = 0.0f;
    zs_sampler *s1 = NULL, *s2 = NULL;
    CHECK(zs_sampler_new(&sp, V, &s1) == 0 && zs_sampler_new(&sp, V, &s2) == 0, "greedy samplers");
    int t1, t2, a;
    float l1, l2;
    CHECK(zs_sampler_verify(s1, lg, low, &t1, &a, &l1) == 0 && zs_sampler_sample(s2, lg, &t2, &l2) == 0 &&
              t1 == t2 && t1 == argmax && !a && !memcmp(&l1, &l2, 4),
          "greedy: the argmax with sample's logprob bits, the draft rejected");
    CHECK(zs_sampler_verify(s1, lg, argmax, &t1, &a, &l1) == 0 && a && t1 == argmax, "greedy: the argmax draft holds");
    CHECK(zs_sampler_verify(s1, lg, V, &t1, &a, &l1) == ZS_ERANGE, "a draft outside the vocabulary is refused");
    zs_sampler_free(s1);
    zs_sampler_free(s2);

    /* jump-forward's forced token: the grammar's mask allows it alone (the others far below, as
     * sched-constrain.c masks them), so it holds whatever the logits said, here the least likely
     * token; with plain sampling's token, logprob bits and one draw (the generators stay level) */
    float masked[V];
    for (int i = 0; i < V; i++) masked[i] = i == low ? lg[i] : -1e30f;
    struct { float t, top_p, min_p; int top_k; } mp[] = {{0.0f, 1.0f, 0.0f, 0}, {1.0f, 1.0f, 0.0f, 0},
                                                         {0.3f, 0.5f, 0.2f, 3}, {2.0f, 0.9f, 0.0f, 1}};
    for (size_t c = 0; c < sizeof mp / sizeof *mp; c++) {
        zs_sampler_params_default(&sp);
        sp.temperature = mp[c].t;
        sp.top_p = mp[c].top_p;
        sp.min_p = mp[c].min_p;
        sp.top_k = mp[c].top_k;
        sp.seed = 5;
        s1 = s2 = NULL;
        CHECK(zs_sampler_new(&sp, V, &s1) == 0 && zs_sampler_new(&sp, V, &s2) == 0, "samplers");
        if (!s1 || !s2) break;
        int held = 0, same = 0;
        for (int i = 0; i < 2000; i++) {
            int tv = -1, ts = -2, acc = 0;
            float lv = 1, ls = 2;
            if (zs_sampler_verify(s1, masked, low, &tv, &acc, &lv) == 0 && acc && tv == low) held++;
            if (zs_sampler_sample(s2, masked, &ts, &ls) == 0 && ts == tv && !memcmp(&lv, &ls, 4)) same++;
        }
        int level = 1;
        for (int i = 0; i < 20; i++) { /* the generators drew alike: the next tokens agree */
            int tv = -1, ts = -2;
            zs_sampler_sample(s1, lg, &tv, NULL);
            zs_sampler_sample(s2, lg, &ts, NULL);
            level &= tv == ts;
        }
        CHECK(held == 2000 && same == 2000 && level, "a token the mask allows alone holds whatever the logits "
              "(temperature %.1f, top_p %.1f, min_p %.1f, top_k %d): %d of 2000, plain's token and logprob %d, "
              "generators level %d", mp[c].t, mp[c].top_p, mp[c].min_p, mp[c].top_k, held, same, level);
        zs_sampler_free(s1);
        zs_sampler_free(s2);
    }
}

/* ---------- requests through the scheduler ---------- */

#define MAXT 256
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done, finish, n_tok;
    int32_t toks[MAXT];
    uint32_t lp[MAXT];
} req_t;

static void on_token(void *ud, int32_t tok, const char *t, size_t n, float lp, const int32_t *ti, const float *tl,
                     int nt) {
    (void)t; (void)n; (void)ti; (void)tl; (void)nt;
    req_t *q = ud;
    pthread_mutex_lock(&q->mu);
    if (q->n_tok < MAXT) {
        memcpy(&q->lp[q->n_tok], &lp, 4);
        q->toks[q->n_tok++] = tok;
    }
    pthread_mutex_unlock(&q->mu);
}

static void on_done(void *ud, int finish, const char *t, size_t n, int np, int ng, int err, const char *msg) {
    (void)t; (void)n; (void)np; (void)ng; (void)err; (void)msg;
    req_t *q = ud;
    pthread_mutex_lock(&q->mu);
    q->finish = finish;
    q->done = 1;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

static void req_wait(req_t *q) {
    pthread_mutex_lock(&q->mu);
    while (!q->done) pthread_cond_wait(&q->cv, &q->mu);
    pthread_mutex_unlock(&q->mu);
}

typedef struct {
    int ranks;
    int nvme;            /* parameters as NVMe shards */
    const char *dir;     /* the model (NULL: stories260K) */
} eng_cfg;

static zs_engine *open_engine(const eng_cfg *c, const char *nvme_dir) {
    char dir[4096];
    if (c->dir) snprintf(dir, sizeof dir, "%s", c->dir);
    else tu_model_dir(dir, sizeof dir, "stories260K");
    zs_engine_opts eo;
    zs_engine_opts_default(&eo);
    eo.model_dir = dir;
    eo.max_seqs = 16;
    eo.ranks = c->ranks;
    eo.max_context = 256;
    if (c->nvme) {
        eo.gather.tier = ZS_OFFLOAD_NVME;
        eo.nvme_path = nvme_dir;
    }
    zs_engine *e = NULL;
    int rc = zs_engine_open(&eo, &e);
    CHECK(rc == 0, "engine: %s", zs_errmsg());
    return rc == 0 ? e : NULL;
}

#define N_REQ 300
#define WAVE 24

typedef struct {
    int32_t toks[N_REQ][MAXT];
    uint32_t lp[N_REQ][MAXT];
    int n[N_REQ], finish[N_REQ];
    zs_sched_stats st;
    uint64_t fixed;      /* forced prefix and suffix tokens of the constrained requests, at most */
    int triggered;       /* trigger requests whose output holds the forced prefix (the trigger fired) */
} run_out;

/* What a request of the mix is: its prompt (into p), and its parameters. */
typedef struct {
    const zs_tokenizer *tk;
    zs_lora *lora;
    const zs_req_constraint *con;   /* forced prefix, a JSON value, forced suffix */
    const zs_req_constraint *con2;  /* a JSON value with longer forced runs (const, enums, nesting) */
    const zs_req_constraint *con3;  /* any JSON object (json_object) */
    const zs_req_constraint *con4;  /* con after a trigger text (a tool call in free text) */
    int vocab;
} mix_ctx;

static int make_req(const mix_ctx *m, int i, int32_t *p, zs_req_params *rp) {
    static const char *const stops[] = {".", " the"};
    memset(rp, 0, sizeof *rp);
    int n = 0, kind = i % 6;
    p[n++] = 1;
    if (kind == 0) { /* a passage, then its start again: the model may copy it */
        int len = 20 + i % 17;
        for (int t = 0; t < len; t++) p[n++] = 5 + (t * 31 + i * 7) % (m->vocab - 10);
        for (int t = 0; t < 8; t++) p[n++] = p[1 + t];
    } else if (kind == 1) { /* random tokens */
        int len = 10 + i % 40;
        for (int t = 0; t < len; t++) p[n++] = 5 + (t * 37 + i * 101) % (m->vocab - 10);
    } else if (kind == 2) { /* a short loop */
        int per = 2 + i % 5;
        for (int t = 0; t < 30; t++) p[n++] = 5 + ((t % per) * 53 + i) % (m->vocab - 10);
    } else { /* real text */
        static const char *texts[] = {"Once upon a time, there was a little girl named Lily. She loved to play",
                                      "Tom had a red ball. He liked to kick the ball. One day, the ball",
                                      "The sun was hot. The cat sat on the mat and"};
        const char *t = texts[i % 3];
        int32_t *ids = NULL;
        size_t k = 0;
        if (zs_tokenizer_encode(m->tk, t, strlen(t), 0, &ids, &k) == 0)
            for (size_t j = 0; j < k && n < 120; j++) p[n++] = ids[j];
        free(ids);
    }
    rp->prompt = p;
    rp->n_prompt = n;
    rp->max_tokens = 1 + (i * 13) % 40;
    zs_sampler_params_default(&rp->sampling);
    rp->sampling.temperature = 0.0f;
    rp->top_logprobs = i % 5 == 0 ? 2 : i % 5 == 1 ? -1 : 0;
    rp->ignore_eos = i % 4 != 0;
    if (i % 7 == 0) {
        rp->stop = &stops[i % 2];
        rp->n_stop = 1;
    }
    if (kind == 4 && m->lora) rp->lora = m->lora;
    if (kind == 5 && m->con && i % 2) { /* constrained: forced prefix, a JSON value, forced suffix */
        rp->constraint = m->con;
        rp->max_tokens = 60;
        rp->n_stop = 0;
    }
    if ((kind == 3 && m->con2 && i % 4 == 1) || (kind == 1 && m->con3 && i % 4 == 3)) { /* a value alone */
        rp->constraint = kind == 3 ? m->con2 : m->con3;
        rp->max_tokens = 60;
        rp->n_stop = 0;
    }
    if (kind == 3 && m->con4 && i % 4 == 3) { /* free text until the trigger, then con's parts */
        rp->constraint = m->con4;
        rp->max_tokens = 60;
        rp->n_stop = 0;
    }
    return 0;
}

static void run_mix(const eng_cfg *c, const char *nvme, int no_drafts, zs_spec *spec, int k, run_out *o,
                    int with_lora, int with_con, int nreq) {
    zs_engine *e = open_engine(c, nvme);
    if (!e) return;
    mix_ctx m = {zs_engine_tokenizer(e), NULL, NULL, NULL, NULL, NULL, zs_model_config_get(zs_engine_model(e))->vocab_size};
    zs_jschema *g = NULL, *g2 = NULL, *g3 = NULL;
    zs_jschema_masks *mk = NULL, *mk2 = NULL, *mk3 = NULL;
    int32_t pre[3] = {0}, suf[2] = {0};
    int np = 0;
    zs_req_constraint con, con2, con3, con4;
    if (with_lora) {
        zs_lora_params lp = {8, 16.0f, 0, 0.0f, 1u << ZS_LORA_Q | 1u << ZS_LORA_V | 1u << ZS_LORA_DOWN};
        if (zs_lora_new(zs_engine_model(e), &lp, &m.lora) == 0) {
            size_t n;
            float *d = zs_lora_data(m.lora, &n);
            uint64_t z = 5;
            for (size_t i = 0; i < n; i++) {
                z = z * 6364136223846793005ull + 1442695040888963407ull;
                d[i] = ((float)(z >> 40) / (1 << 24) * 2 - 1) * 0.05f;
            }
            CHECK(zs_lora_freeze(m.lora, 0) == 0, "lora freeze");
        }
    }
    if (with_con) {
        const char *schema = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"enum\":[\"Lily\",\"Tom\"]},"
                             "\"age\":{\"type\":\"integer\"}},\"required\":[\"name\",\"age\"],\"additionalProperties\":false}";
        CHECK(zs_jschema_compile(schema, &g) == 0 && zs_jschema_mask_new(g, m.tk, &mk) == 0, "grammar: %s", zs_errmsg());
        int32_t *ids = NULL;
        size_t n = 0;
        if (zs_tokenizer_encode(m.tk, "Data is", 7, 0, &ids, &n) == 0)
            for (size_t j = 0; j < n && j < 3; j++) pre[j] = ids[j];
        np = (int)ZS_MIN(n, 3);
        free(ids);
        if (zs_tokenizer_encode(m.tk, " end", 4, 0, &ids, &n) == 0)
            for (size_t j = 0; j < n && j < 2; j++) suf[j] = ids[j];
        int ns = (int)ZS_MIN(n, 2);
        free(ids);
        con = (zs_req_constraint){g, mk, pre, np, suf, ns, NULL};
        con4 = (zs_req_constraint){g, mk, pre, np, suf, ns, " the"};
        if (mk) m.con = &con, m.con4 = &con4;
        for (int i = 0; i < nreq; i++)
            o->fixed += (i % 6 == 5 && i % 2) || i % 12 == 3 ? (uint64_t)(np + ns) : 0;
        const char *schema2 =
            "{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"pet\"},\"name\":{\"enum\":[\"Lily\",\"Tom\","
            "\"Tim\"]},\"age\":{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"big\","
            "\"small\"]},\"maxItems\":2},\"owner\":{\"type\":\"object\",\"properties\":{\"ok\":{\"type\":\"boolean\"},"
            "\"n\":{\"type\":\"null\"}},\"required\":[\"ok\",\"n\"],\"additionalProperties\":false},\"note\":{\"type\":"
            "\"string\"}},\"required\":[\"kind\",\"name\",\"age\",\"tags\",\"owner\"],\"additionalProperties\":false}";
        CHECK(zs_jschema_compile(schema2, &g2) == 0 && zs_jschema_mask_new(g2, m.tk, &mk2) == 0, "grammar 2: %s",
              zs_errmsg());
        CHECK(zs_jschema_any_object(&g3) == 0 && zs_jschema_mask_new(g3, m.tk, &mk3) == 0, "grammar 3: %s",
              zs_errmsg());
        con2 = (zs_req_constraint){g2, mk2, NULL, 0, NULL, 0, NULL};
        con3 = (zs_req_constraint){g3, mk3, NULL, 0, NULL, 0, NULL};
        if (mk2) m.con2 = &con2;
        if (mk3) m.con3 = &con3;
    }
    zs_sched_opts so = {16, 64, 512, 0, spec, k, no_drafts};
    zs_sched *s = NULL;
    if (zs_sched_new(e, &so, &s) < 0) {
        CHECK(0, "sched: %s", zs_errmsg());
        goto out;
    }
    static req_t q[WAVE];
    int32_t p[160];
    for (int w0 = 0; w0 < nreq; w0 += WAVE) {
        int nw = ZS_MIN(WAVE, nreq - w0);
        for (int j = 0; j < nw; j++) {
            int i = w0 + j;
            memset(&q[j], 0, sizeof q[j]);
            pthread_mutex_init(&q[j].mu, NULL);
            pthread_cond_init(&q[j].cv, NULL);
            zs_req_params rp;
            make_req(&m, i, p, &rp);
            zs_req_sink sink = {on_token, on_done, &q[j], NULL};
            int rc = zs_sched_submit(s, &rp, &sink, NULL);
            CHECK(rc == 0, "submit %d: %s", i, zs_errmsg());
            if (rc < 0) q[j].done = 1;
        }
        for (int j = 0; j < nw; j++) {
            int i = w0 + j;
            req_wait(&q[j]);
            o->n[i] = q[j].n_tok;
            o->finish[i] = q[j].finish;
            memcpy(o->toks[i], q[j].toks, sizeof o->toks[i]);
            memcpy(o->lp[i], q[j].lp, sizeof o->lp[i]);
            for (int t = 0; m.con4 && i % 12 == 3 && np > 0 && t + np <= q[j].n_tok; t++)
                if (!memcmp(q[j].toks + t, pre, (size_t)np * sizeof *pre)) {
                    o->triggered++;
                    break;
                }
        }
    }
    zs_sched_stats_get(s, &o->st);
    zs_sched_free(s);
out:
    zs_lora_free(m.lora);
    zs_jschema_mask_free(mk);
    zs_jschema_mask_free(mk2);
    zs_jschema_mask_free(mk3);
    zs_jschema_free(g);
    zs_jschema_free(g2);
    zs_jschema_free(g3);
    zs_engine_free(e);
}

static int compare(const run_out *a, const run_out *b, int nreq, int *first) {
    int same = 0;
    *first = -1;
    for (int i = 0; i < nreq; i++) {
        int ok = a->n[i] == b->n[i] && a->finish[i] == b->finish[i] &&
                 !memcmp(a->toks[i], b->toks[i], sizeof a->toks[i]) && !memcmp(a->lp[i], b->lp[i], sizeof a->lp[i]);
        same += ok;
        if (!ok && *first < 0) *first = i;
    }
    return same;
}

static void test_greedy(const eng_cfg *c, const char *label, int with_lora, int with_con, int nreq) {
    static run_out plain, spec_auto, spec4, spec16;
    char nvme[4096] = "";
    if (c->nvme) tu_tmpdir(nvme, sizeof nvme, "spec-nvme");
    zs_spec *ng = NULL;
    CHECK(zs_spec_ngram_new(ZS_SPEC_NGRAM_MIN, ZS_SPEC_NGRAM_MAX, &ng) == 0, "ngram");
    memset(&plain, 0, sizeof plain);
    memset(&spec_auto, 0, sizeof spec_auto);
    memset(&spec4, 0, sizeof spec4);
    memset(&spec16, 0, sizeof spec16);
    run_mix(c, nvme, 1, NULL, 0, &plain, with_lora, with_con, nreq);
    run_mix(c, nvme, 0, ng, 0, &spec_auto, with_lora, with_con, nreq);
    run_mix(c, nvme, 0, ng, 4, &spec4, with_lora, with_con, nreq);
    run_mix(c, nvme, 0, ng, 16, &spec16, with_lora, with_con, nreq);
    int f1, f2, f3;
    int s1 = compare(&plain, &spec_auto, nreq, &f1), s2 = compare(&plain, &spec4, nreq, &f2),
        s3 = compare(&plain, &spec16, nreq, &f3);
    CHECK(s1 == nreq, "%s: greedy with speculation (drafts chosen from costs) = plain decoding, %d/%d (first "
          "differing: %d)", label, s1, nreq, f1);
    CHECK(s2 == nreq, "%s: with 4 drafts = plain, %d/%d (first differing: %d)", label, s2, nreq, f2);
    CHECK(s3 == nreq, "%s: with 16 drafts = plain, %d/%d (first differing: %d)", label, s3, nreq, f3);
    const zs_sched_stats *a = &spec4.st, *p = &plain.st;
    fprintf(stderr, "%s: plain %llu passes; 4 drafts: %llu passes, %llu drafted, %llu accepted, %llu forced, "
                    "%.2f tokens per pass (plain %.2f); auto: %llu passes, %llu drafted, %llu accepted\n",
            label, (unsigned long long)p->passes, (unsigned long long)a->passes, (unsigned long long)a->spec_drafted,
            (unsigned long long)a->spec_accepted, (unsigned long long)a->spec_forced,
            (double)a->pass_tokens / (double)(a->passes ? a->passes : 1),
            (double)p->pass_tokens / (double)(p->passes ? p->passes : 1), (unsigned long long)spec_auto.st.passes,
            (unsigned long long)spec_auto.st.spec_drafted, (unsigned long long)spec_auto.st.spec_accepted);
    CHECK(p->spec_drafted == 0 && p->spec_forced == 0 && p->spec_forced_drafted == 0, "%s: plain decoding drafts nothing",
          label);
    CHECK(a->spec_accepted > 0 && a->spec_accepted <= a->spec_drafted, "%s: drafts were accepted (%llu of %llu)", label,
          (unsigned long long)a->spec_accepted, (unsigned long long)a->spec_drafted);
    CHECK(a->passes < p->passes, "%s: fewer passes with speculation (%llu < %llu)", label,
          (unsigned long long)a->passes, (unsigned long long)p->passes);
    CHECK(a->generated_tokens == p->generated_tokens, "%s: the same tokens generated", label);
    uint64_t hist = 0;
    for (int i = 0; i <= ZS_SPEC_MAX_TOKENS; i++) hist += a->spec_accept_hist[i];
    CHECK(hist > 0, "%s: the acceptance histogram counts verifications", label);
    if (with_con) {
        /* the grammar's forced bytes went in as drafts beyond the forced prefix and suffix; some
         * were spelled otherwise by the model, and the outputs still equal plain decoding's */
        const run_out *runs[3] = {&spec_auto, &spec4, &spec16};
        for (int r = 0; r < 3; r++) {
            const zs_sched_stats *x = &runs[r]->st;
            CHECK(x->spec_forced > runs[r]->fixed && x->spec_forced_drafted > x->spec_forced,
                  "%s: jump-forward in the value: %llu forced tokens held (prefix and suffix: at most %llu), %llu "
                  "drafted", label, (unsigned long long)x->spec_forced, (unsigned long long)runs[r]->fixed,
                  (unsigned long long)x->spec_forced_drafted);
        }
        CHECK(plain.triggered > 0, "%s: some trigger requests reached their constrained part (%d)", label,
              plain.triggered);
        fprintf(stderr, "%s: jump-forward (4 drafts): %llu forced tokens drafted, %llu held (prefix and suffix: at "
                "most %llu); %d trigger requests fired\n", label, (unsigned long long)a->spec_forced_drafted,
                (unsigned long long)a->spec_forced, (unsigned long long)spec4.fixed, plain.triggered);
    }
    zs_spec_free(ng);
    if (c->nvme) tu_rmdir(nvme);
}

/* ---------- sampled outputs keep the target's distribution ---------- */

static void test_sampled(void) {
    enum { NS = 3000 };
    eng_cfg c = {1, 0, NULL};
    zs_spec *ng = NULL;
    CHECK(zs_spec_ngram_new(1, 3, &ng) == 0, "ngram");
    static long cnt[2][3][512];
    zs_sched_stats st[2];
    for (int mode = 0; mode < 2; mode++) {
        zs_engine *e = open_engine(&c, NULL);
        if (!e) return;
        zs_sched_opts so = {16, 64, 4096, 0, mode ? ng : NULL, mode ? 4 : 0, !mode};
        zs_sched *s = NULL;
        if (zs_sched_new(e, &so, &s) < 0) {
            zs_engine_free(e);
            CHECK(0, "sched: %s", zs_errmsg());
            return;
        }
        /* a text that repeats itself: prompt lookup proposes its continuation */
        static const char *text = "Lily and Tom went to the park. Lily and Tom went to the park. Lily and";
        int32_t p[64], *ids = NULL;
        size_t np = 0;
        p[0] = 1;
        if (zs_tokenizer_encode(zs_engine_tokenizer(e), text, strlen(text), 0, &ids, &np) < 0) np = 0;
        np = ZS_MIN(np, 60);
        memcpy(p + 1, ids, np * sizeof *p);
        free(ids);
        static req_t q[WAVE];
        for (int w0 = 0; w0 < NS; w0 += WAVE) {
            for (int j = 0; j < WAVE; j++) {
                memset(&q[j], 0, sizeof q[j]);
                pthread_mutex_init(&q[j].mu, NULL);
                pthread_cond_init(&q[j].cv, NULL);
                zs_req_params rp;
                memset(&rp, 0, sizeof rp);
                rp.prompt = p;
                rp.n_prompt = (int)np + 1;
                rp.max_tokens = 4;
                zs_sampler_params_default(&rp.sampling);
                rp.sampling.temperature = 1.0f;
                rp.sampling.seed = 7000 + (uint64_t)(w0 + j) * 2 + (uint64_t)mode;
                rp.top_logprobs = -1;
                rp.ignore_eos = 1;
                zs_req_sink sink = {on_token, on_done, &q[j], NULL};
                if (zs_sched_submit(s, &rp, &sink, NULL) < 0) q[j].done = 1;
            }
            for (int j = 0; j < WAVE; j++) {
                req_wait(&q[j]);
                for (int t = 1; t < 4 && t < q[j].n_tok; t++) cnt[mode][t - 1][q[j].toks[t] & 511]++;
            }
        }
        zs_sched_stats_get(s, &st[mode]);
        zs_sched_free(s);
        zs_engine_free(e);
    }
    CHECK(st[1].spec_drafted > 0 && st[1].spec_accepted > 0 && st[1].spec_accepted < st[1].spec_drafted,
          "sampled: drafts were proposed, some accepted and some not (%llu of %llu)",
          (unsigned long long)st[1].spec_accepted, (unsigned long long)st[1].spec_drafted);
    for (int t = 0; t < 3; t++) {
        double x;
        int df;
        CHECK(same_dist(cnt[1][t], cnt[0][t], 512, NS, NS, &x, &df),
              "sampled: token %d with speculation follows plain sampling (chi-square %.1f, %d df, critical %.1f)", t + 2,
              x, df, chi2_crit(df));
        fprintf(stderr, "sampled: token %d: chi-square %.1f on %d df\n", t + 2, x, df);
    }
    zs_spec_free(ng);
}

/* Greedy, a schema with long keys and no proposer: jump-forward alone (the forced bytes as drafts)
 * gives plain decoding's tokens and logprob bits with fewer passes per generated token. One
 * request at a time, so that passes count that request's steps only. */
static void test_long_keys(void) {
    enum { NR = 12, NT = 230 };
    eng_cfg c = {1, 0, NULL};
    static req_t q[2][NR];
    zs_sched_stats st[2];
    const char *schema = "{\"type\":\"object\",\"properties\":{\"customer_full_name\":{\"enum\":[\"Lily\",\"Tom\"]},"
                         "\"shipping_address_postcode\":{\"enum\":[12345,67890]},\"requires_signature_on_delivery\":"
                         "{\"type\":\"boolean\"},\"preferred_delivery_window\":{\"enum\":[\"morning_before_noon\","
                         "\"afternoon_after_lunch\"]}},\"required\":[\"customer_full_name\",\"shipping_address_postcode\","
                         "\"requires_signature_on_delivery\",\"preferred_delivery_window\"],\"additionalProperties\":false}";
    static const char *texts[] = {"Once upon a time", "Tom had a red ball", "The sun was hot", "Lily"};
    for (int mode = 0; mode < 2; mode++) {
        zs_engine *e = open_engine(&c, NULL);
        if (!e) return;
        zs_jschema *g = NULL;
        zs_jschema_masks *mk = NULL;
        CHECK(zs_jschema_compile(schema, &g) == 0 && zs_jschema_mask_new(g, zs_engine_tokenizer(e), &mk) == 0,
              "grammar: %s", zs_errmsg());
        zs_req_constraint con = {g, mk, NULL, 0, NULL, 0, NULL};
        zs_sched_opts so = {16, 64, 4096, 0, NULL, 0, !mode};
        zs_sched *s = NULL;
        if (!mk || zs_sched_new(e, &so, &s) < 0) {
            CHECK(0, "sched: %s", zs_errmsg());
            zs_jschema_mask_free(mk);
            zs_jschema_free(g);
            zs_engine_free(e);
            return;
        }
        for (int i = 0; i < NR; i++) {
            int32_t p[64], *ids = NULL;
            size_t np = 0;
            p[0] = 1;
            const char *t = texts[i % 4];
            if (zs_tokenizer_encode(zs_engine_tokenizer(e), t, strlen(t), 0, &ids, &np) < 0) np = 0;
            np = ZS_MIN(np, 60);
            memcpy(p + 1, ids, np * sizeof *p);
            free(ids);
            req_t *r = &q[mode][i];
            memset(r, 0, sizeof *r);
            pthread_mutex_init(&r->mu, NULL);
            pthread_cond_init(&r->cv, NULL);
            zs_req_params rp;
            memset(&rp, 0, sizeof rp);
            rp.prompt = p;
            rp.n_prompt = (int)np + 1;
            rp.max_tokens = NT;
            zs_sampler_params_default(&rp.sampling);
            rp.sampling.temperature = 0.0f;
            rp.top_logprobs = i % 2 ? 0 : 2;
            rp.constraint = &con;
            zs_req_sink sink = {on_token, on_done, r, NULL};
            if (zs_sched_submit(s, &rp, &sink, NULL) < 0) r->done = 1;
            req_wait(r);
        }
        zs_sched_stats_get(s, &st[mode]);
        zs_sched_free(s);
        zs_jschema_mask_free(mk);
        zs_jschema_free(g);
        zs_engine_free(e);
    }
    int same = 0, stop = 0;
    for (int i = 0; i < NR; i++) stop += q[0][i].finish == ZS_DONE_STOP;
    for (int i = 0; i < NR; i++)
        same += q[0][i].n_tok == q[1][i].n_tok && q[0][i].finish == q[1][i].finish &&
                !memcmp(q[0][i].toks, q[1][i].toks, (size_t)q[0][i].n_tok * sizeof(int32_t)) &&
                !memcmp(q[0][i].lp, q[1][i].lp, (size_t)q[0][i].n_tok * sizeof(uint32_t));
    double ppt0 = (double)st[0].passes / (double)(st[0].generated_tokens ? st[0].generated_tokens : 1),
           ppt1 = (double)st[1].passes / (double)(st[1].generated_tokens ? st[1].generated_tokens : 1);
    CHECK(same == NR && stop == NR, "long keys: greedy with jump-forward = plain decoding (tokens, logprob bits, "
          "finish), %d/%d, %d complete", same, NR, stop);
    CHECK(st[0].spec_forced_drafted == 0 && st[1].spec_forced > 0 && st[1].spec_drafted == 0,
          "long keys: jump-forward's drafts alone (%llu forced held, %llu drafted by a proposer)",
          (unsigned long long)st[1].spec_forced, (unsigned long long)st[1].spec_drafted);
    CHECK(st[0].generated_tokens == st[1].generated_tokens && ppt1 < 0.6 * ppt0,
          "long keys: passes per generated token %.3f with jump-forward, %.3f without", ppt1, ppt0);
    fprintf(stderr, "long keys: %llu tokens; passes per token %.3f with jump-forward (%llu passes, %llu of %llu forced "
            "drafts held), %.3f without (%llu passes)\n", (unsigned long long)st[1].generated_tokens, ppt1,
            (unsigned long long)st[1].passes, (unsigned long long)st[1].spec_forced,
            (unsigned long long)st[1].spec_forced_drafted, ppt0, (unsigned long long)st[0].passes);
}

/* Constrained and sampled: jump-forward's drafts (the grammar's forced bytes, spelled in tokens
 * the model may spell otherwise) keep plain sampling's distribution at every place. */
static void test_sampled_constrained(void) {
    enum { NS = 3000, NT = 16 };
    eng_cfg c = {1, 0, NULL};
    static long cnt[2][NT][512];
    zs_sched_stats st[2];
    for (int mode = 0; mode < 2; mode++) {
        zs_engine *e = open_engine(&c, NULL);
        if (!e) return;
        zs_jschema *g = NULL;
        zs_jschema_masks *mk = NULL;
        const char *schema = "{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"pet\"},\"name\":{\"enum\":"
                             "[\"Lily\",\"Tom\",\"Tim\"]},\"age\":{\"type\":\"integer\"}},\"required\":[\"kind\",\"name\","
                             "\"age\"],\"additionalProperties\":false}";
        CHECK(zs_jschema_compile(schema, &g) == 0 && zs_jschema_mask_new(g, zs_engine_tokenizer(e), &mk) == 0,
              "grammar: %s", zs_errmsg());
        zs_req_constraint con = {g, mk, NULL, 0, NULL, 0, NULL};
        zs_sched_opts so = {16, 64, 4096, 0, NULL, 0, !mode};
        zs_sched *s = NULL;
        if (!mk || zs_sched_new(e, &so, &s) < 0) {
            CHECK(0, "sched: %s", zs_errmsg());
            zs_jschema_mask_free(mk);
            zs_jschema_free(g);
            zs_engine_free(e);
            return;
        }
        int32_t p[64], *ids = NULL;
        size_t np = 0;
        p[0] = 1;
        if (zs_tokenizer_encode(zs_engine_tokenizer(e), "Tom has a pet", 13, 0, &ids, &np) < 0) np = 0;
        np = ZS_MIN(np, 60);
        memcpy(p + 1, ids, np * sizeof *p);
        free(ids);
        static req_t q[WAVE];
        for (int w0 = 0; w0 < NS; w0 += WAVE) {
            for (int j = 0; j < WAVE; j++) {
                memset(&q[j], 0, sizeof q[j]);
                pthread_mutex_init(&q[j].mu, NULL);
                pthread_cond_init(&q[j].cv, NULL);
                zs_req_params rp;
                memset(&rp, 0, sizeof rp);
                rp.prompt = p;
                rp.n_prompt = (int)np + 1;
                rp.max_tokens = NT;
                zs_sampler_params_default(&rp.sampling);
                rp.sampling.temperature = 1.0f;
                rp.sampling.seed = 9000 + (uint64_t)(w0 + j) * 2 + (uint64_t)mode;
                rp.top_logprobs = -1;
                rp.constraint = &con;
                zs_req_sink sink = {on_token, on_done, &q[j], NULL};
                if (zs_sched_submit(s, &rp, &sink, NULL) < 0) q[j].done = 1;
            }
            for (int j = 0; j < WAVE; j++) {
                req_wait(&q[j]);
                for (int t = 0; t < NT && t < q[j].n_tok; t++) cnt[mode][t][q[j].toks[t] & 511]++;
            }
        }
        zs_sched_stats_get(s, &st[mode]);
        zs_sched_free(s);
        zs_jschema_mask_free(mk);
        zs_jschema_free(g);
        zs_engine_free(e);
    }
    CHECK(st[0].spec_forced_drafted == 0 && st[1].spec_forced > 0 && st[1].spec_forced < st[1].spec_forced_drafted &&
              st[1].passes < st[0].passes,
          "sampled, constrained: forced drafts went in, most held, some were spelled otherwise (%llu of %llu held), "
          "fewer passes (%llu, plain %llu)", (unsigned long long)st[1].spec_forced,
          (unsigned long long)st[1].spec_forced_drafted, (unsigned long long)st[1].passes,
          (unsigned long long)st[0].passes);
    int bad = 0, varied = 0;
    for (int t = 0; t < NT; t++) {
        double x;
        int df;
        long n0 = 0, n1 = 0;
        for (int i = 0; i < 512; i++) n0 += cnt[0][t][i], n1 += cnt[1][t][i];
        if (!same_dist(cnt[1][t], cnt[0][t], 512, n1 ? n1 : 1, n0 ? n0 : 1, &x, &df)) {
            CHECK(0, "sampled, constrained: token %d with jump-forward follows plain sampling (chi-square %.1f, %d df, "
                  "critical %.1f)", t + 1, x, df, chi2_crit(df));
            bad++;
        }
        varied += df >= 1;
    }
    CHECK(varied >= 4, "sampled, constrained: %d of %d places vary", varied, NT);
    fprintf(stderr, "sampled, constrained: %d places, %d vary, %d differ; %llu of %llu forced drafts held, %llu passes "
            "(plain %llu)\n", NT, varied, bad, (unsigned long long)st[1].spec_forced,
            (unsigned long long)st[1].spec_forced_drafted, (unsigned long long)st[1].passes,
            (unsigned long long)st[0].passes);
}

/* ---------- a mixture of experts ---------- */

static int make_moe(const char *dir) {
    zs_init_opts io;
    int rc = zs_init_opts_default("qwen3moe", &io);
    if (rc < 0) return rc;
    zs_model_config *c = &io.cfg;
    c->n_layers = 2;
    c->dim = 64;
    c->n_heads = 4;
    c->n_kv_heads = 2;
    c->head_dim = 16;
    c->vocab_size = 300;
    c->max_seq = 256;
    c->n_experts = 16;
    c->n_experts_used = 4;
    c->moe_ffn_dim = 32;
    c->ffn_dim = 96;
    io.seed = 11;
    io.random_norms = 1;
    io.init_std = 0.2f;
    if ((rc = zs_config_override(c, "{}", "test-spec")) < 0) return rc;
    return zs_init_model_write(&io, dir);
}

int main(void) {
    test_ngram();
    test_verify();
    eng_cfg one = {1, 0, NULL}, two = {2, 0, NULL}, two_nvme = {2, 1, NULL};
    test_greedy(&one, "stories260K, 1 rank", 1, 1, N_REQ);
    test_greedy(&two, "stories260K, 2 ranks", 0, 1, 120);
    test_greedy(&two_nvme, "stories260K, 2 ranks over NVMe", 0, 0, 60);
    char moe[4096];
    tu_tmpdir(moe, sizeof moe, "spec-moe");
    if (make_moe(moe) == 0) {
        eng_cfg m = {1, 0, moe};
        test_greedy(&m, "Qwen3-MoE (random)", 0, 0, 60);
    } else {
        CHECK(0, "moe model: %s", zs_errmsg());
    }
    tu_rmdir(moe);
    test_sampled();
    test_sampled_constrained();
    test_long_keys();
    return tu_finish("test-spec");
}
