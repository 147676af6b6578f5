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
 *     equal plain sampling's (3,000 seeds each, chi-square), with prompt lookup and with a draft
 *     model.
 *   - The draft model proposer (spec-draft.c): called directly, its drafts are the greedy
 *     continuation; a sequence rolled back after a rejection feeds only the new token and drafts
 *     what a fresh sequence does; catch-up in chunks, several sequences in one call, slots taken
 *     back least recently used, no drafts past the context or beyond its slots, release gives
 *     every KV block back; a sliding-window model's ring (a rollback the ring no longer holds
 *     starts over). Through the scheduler, greedy = plain decoding bit for bit (drafts from the
 *     costs, 4 and 16): the same model as draft (every draft holds when nothing ends a request
 *     early), a q8_0 draft of the f32 model with LoRA and constrained requests, a bf16 draft on 2
 *     ranks, the sliding-window model; acceptance rates within bounds, fewer passes, and the
 *     draft's KV back to 0 blocks after all requests. Refused at start, by name: another
 *     vocabulary (gpt2-bytes: 256 tokens; a random 512-token byte-level one: the first token that
 *     differs), a path that does not load. */
#include <math.h>
#include <pthread.h>
#include <unistd.h>

#include "common.h"
#include "config.h"
#include "hold.h"
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
    zs_spec_req q = {1, a, 10, 3, d, 0, NULL, NULL};
    CHECK(zs_spec_propose(p, &q, 1) == 0 && q.n_draft == 3 && d[0] == 8 && d[1] == 9 && d[2] == 2,
          "5 6 7 seen before: 8 9 2 proposed (%d: %d %d %d)", q.n_draft, d[0], d[1], d[2]);
    int32_t b[] = {1, 4, 5, 9, 4, 5, 8, 3, 4, 5};
    q = (zs_spec_req){2, b, 10, 5, d, 0, NULL, NULL};
    CHECK(zs_spec_propose(p, &q, 1) == 0 && q.n_draft == 4 && d[0] == 8 && d[1] == 3 && d[2] == 4 && d[3] == 5,
          "the most recent occurrence of 4 5: 8 3 4 5, up to the end (%d: %d %d %d %d)", q.n_draft, d[0], d[1], d[2],
          d[3]);
    int32_t c[] = {1, 2, 3, 4, 5, 6};
    q = (zs_spec_req){3, c, 6, 4, d, 0, NULL, NULL};
    CHECK(zs_spec_propose(p, &q, 1) == 0 && q.n_draft == 0, "no repeated n-gram: nothing proposed");
    int32_t e2[] = {7, 7};
    q = (zs_spec_req){4, e2, 2, 4, d, 0, NULL, NULL};
    CHECK(zs_spec_propose(p, &q, 1) == 0 && q.n_draft == 0, "too short for a 2-gram: nothing");
    CHECK(!strcmp(zs_spec_name(p), "ngram"), "name");
    /* trees: 5 6 7 was followed by 8 1 .. and (more recently) by 3 2 ..: both branches, the
     * recent one first, each with half the weight; a level deeper costs more than a sibling */
    int32_t t1[] = {9, 5, 6, 7, 8, 1, 5, 6, 7, 3, 2, 5, 6, 7}, par[8];
    float sh[8];
    q = (zs_spec_req){5, t1, 14, 4, d, 0, par, sh};
    CHECK(zs_spec_propose(p, &q, 1) == 0 && q.n_draft == 4 && d[0] == 3 && d[1] == 8 && d[2] == 2 && d[3] == 1 &&
              par[0] == -1 && par[1] == -1 && par[2] == 0 && par[3] == 1 && sh[0] == 0.5f && sh[1] == 0.5f &&
              sh[2] == 1.0f && sh[3] == 1.0f,
          "tree: two continuations of 5 6 7 (%d: %d %d %d %d, parents %d %d %d %d, shares %g %g %g %g)", q.n_draft, d[0],
          d[1], d[2], d[3], par[0], par[1], par[2], par[3], (double)sh[0], (double)sh[1], (double)sh[2], (double)sh[3]);
    /* the 3-token suffix 4 5 6 (weight 2) was followed by 9 3, the 2-token 5 6 (weight 1) by 2 */
    int32_t t2[] = {4, 5, 6, 9, 3, 5, 6, 2, 4, 5, 6};
    q = (zs_spec_req){6, t2, 11, 3, d, 0, par, sh};
    CHECK(zs_spec_propose(p, &q, 1) == 0 && q.n_draft == 3 && d[0] == 9 && d[1] == 3 && d[2] == 2 && par[0] == -1 &&
              par[1] == 0 && par[2] == -1 && fabsf(sh[0] - 2.0f / 3) < 1e-6f && sh[1] == 1.0f &&
              fabsf(sh[2] - 1.0f / 3) < 1e-6f,
          "tree: the longer match weighs more (%d: %d %d %d, parents %d %d %d, shares %g %g %g)", q.n_draft, d[0], d[1],
          d[2], par[0], par[1], par[2], (double)sh[0], (double)sh[1], (double)sh[2]);
    /* one continuation: the chain, shares 1 */
    q = (zs_spec_req){7, a, 10, 3, d, 0, par, sh};
    CHECK(zs_spec_propose(p, &q, 1) == 0 && q.n_draft == 3 && d[0] == 8 && d[1] == 9 && d[2] == 2 && par[0] == -1 &&
              par[1] == 0 && par[2] == 1 && sh[0] == 1.0f && sh[2] == 1.0f,
          "tree: a single continuation is the chain");
    q = (zs_spec_req){8, c, 6, 4, d, 0, par, sh};
    CHECK(zs_spec_propose(p, &q, 1) == 0 && q.n_draft == 0, "tree: nothing without a repeated n-gram");
    zs_spec_free(p);
    /* 64-token n-grams: a match that long weighs 2^63 (no integer shift); the text repeats with
     * period 70, so the tree is the one continuation, a chain */
    CHECK(zs_spec_ngram_new(1, 64, &p) == 0, "ngram 1..64");
    if (!p) return;
    int32_t lng[200];
    for (int i = 0; i < 200; i++) lng[i] = 3 + i % 70;
    q = (zs_spec_req){9, lng, 200, 8, d, 0, par, sh};
    int chain = zs_spec_propose(p, &q, 1) == 0 && q.n_draft == 8;
    for (int j = 0; chain && j < 8; j++) chain = d[j] == 3 + (200 + j) % 70 && par[j] == j - 1 && sh[j] == 1.0f;
    CHECK(chain, "tree with 64-token n-grams: the continuation of the period (%d drafts)", q.n_draft);
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

/* Several drafts at one node (a tree's children): the token still follows the target; one draft
 * is zs_sampler_verify draw for draw; greedy picks the argmax's draft. */
static void test_verify_multi(void) {
    enum { V = 40, N = 200000 };
    float lg[V];
    uint64_t z = 7;
    for (int i = 0; i < V; i++) {
        z = z * 6364136223846793005ull + 1442695040888963407ull;
        lg[i] = (float)((double)(z >> 40) / (1 << 24) * 5.0 - 2.5);
    }
    int ord[V]; /* ids by logit, descending */
    for (int i = 0; i < V; i++) ord[i] = i;
    for (int i = 0; i < V; i++)
        for (int j = i + 1; j < V; j++)
            if (lg[ord[j]] > lg[ord[i]]) { int t = ord[i]; ord[i] = ord[j]; ord[j] = t; }
    struct { float t, top_p; int top_k; int n, d[4]; const char *what; } cases[] = {
        {1.0f, 1.0f, 0, 3, {ord[0], ord[1], ord[2]}, "temperature 1, the three likeliest"},
        {0.8f, 1.0f, 0, 4, {ord[30], ord[1], ord[30], ord[5]}, "temperature 0.8, an unlikely one, repeated"},
        {1.2f, 0.9f, 6, 3, {ord[20], ord[3], ord[0]}, "top_k 6, top_p 0.9, one outside them"},
        {1.0f, 1.0f, 2, 2, {ord[1], ord[0]}, "top_k 2, the drafts hold all the mass"},
    };
    static long ca[V], cb[V];
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        zs_sampler_params sp;
        zs_sampler_params_default(&sp);
        sp.temperature = cases[c].t;
        sp.top_p = cases[c].top_p;
        sp.top_k = cases[c].top_k;
        zs_sampler *s1 = NULL, *s2 = NULL;
        sp.seed = 3;
        CHECK(zs_sampler_new(&sp, V, &s1) == 0, "sampler");
        sp.seed = 4;
        CHECK(zs_sampler_new(&sp, V, &s2) == 0, "sampler");
        if (!s1 || !s2) return;
        memset(ca, 0, sizeof ca);
        memset(cb, 0, sizeof cb);
        long acc[4] = {0};
        int bad = 0;
        for (int i = 0; i < N; i++) {
            int t = 0, w = -2;
            bad |= zs_sampler_verify_multi(s1, lg, cases[c].d, cases[c].n, &t, &w, NULL) != 0;
            bad |= w >= 0 ? cases[c].d[w] != t : w != -1;
            for (int k = 0; k < (w >= 0 ? w : cases[c].n); k++) bad |= cases[c].d[k] == t; /* none before it */
            ca[t]++;
            if (w >= 0) acc[w]++;
            bad |= zs_sampler_sample(s2, lg, &t, NULL) != 0;
            cb[t]++;
        }
        double x;
        int df;
        CHECK(!bad, "%s: the calls worked and which names the accepted draft", cases[c].what);
        CHECK(same_dist(ca, cb, V, N, N, &x, &df), "%s: tokens after several drafts follow the target (chi-square "
              "%.1f, %d df, critical %.1f)", cases[c].what, x, df, chi2_crit(df));
        fprintf(stderr, "verify several: %s: accepted %.3f %.3f %.3f %.3f, chi-square %.1f on %d df\n", cases[c].what,
                (double)acc[0] / N, (double)acc[1] / N, (double)acc[2] / N, (double)acc[3] / N, x, df);
        if (c == 1) CHECK(acc[2] == 0, "a repeated draft never holds in its second place");
        zs_sampler_free(s1);
        zs_sampler_free(s2);
    }
    /* one draft = zs_sampler_verify, draw for draw */
    zs_sampler_params sp;
    zs_sampler_params_default(&sp);
    sp.temperature = 0.9f;
    sp.top_k = 12;
    zs_sampler *s1 = NULL, *s2 = NULL;
    CHECK(zs_sampler_new(&sp, V, &s1) == 0 && zs_sampler_new(&sp, V, &s2) == 0, "samplers");
    int same = 1;
    for (int i = 0; i < 5000 && s1 && s2; i++) {
        int d = ord[i % 15], t1, t2, a, w;
        float l1, l2;
        same &= zs_sampler_verify(s1, lg, d, &t1, &a, &l1) == 0 && zs_sampler_verify_multi(s2, lg, &d, 1, &t2, &w, &l2) == 0 &&
                t1 == t2 && a == (w == 0) && !memcmp(&l1, &l2, 4);
    }
    CHECK(same, "one draft: zs_sampler_verify_multi = zs_sampler_verify, draw for draw");
    zs_sampler_free(s1);
    zs_sampler_free(s2);
    /* greedy: the argmax, its draft's index */
    sp.temperature = 0.0f;
    CHECK(zs_sampler_new(&sp, V, &s1) == 0, "greedy sampler");
    int d3[3] = {ord[2], ord[0], ord[1]}, t, w;
    CHECK(s1 && zs_sampler_verify_multi(s1, lg, d3, 3, &t, &w, NULL) == 0 && t == ord[0] && w == 1,
          "greedy: the argmax's draft holds (%d, %d)", t, w);
    CHECK(s1 && zs_sampler_verify_multi(s1, lg, d3, 0, &t, &w, NULL) == ZS_ERANGE, "no drafts is refused");
    zs_sampler_free(s1);
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
    zs_spec_draft_stats dst;   /* the draft model's, after the scheduler has ended */
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
    int simple;   /* no EOS, no stop strings: every request runs to max_tokens */
} mix_ctx;

static int make_req(const mix_ctx *m, int i, int32_t *p, zs_req_params *rp) {
    static const char *const stops[] = {".", " the"};
    memset(rp, 0, sizeof *rp);
    int n = 0, kind = i % 6;
    p[n++] = 1;
    if (kind == 0) { /* a passage, then its start again: the model may copy it */
        int len = 20 + i % 17;
        for (int t = 0; t < len; t++) p[n++] = 5 + (t * 31 + i * 7) % (m->vocab - 10);
        if (i % 12 == 6) { /* its first tokens once more with another continuation: two branches */
            for (int t = 0; t < 4; t++) p[n++] = p[1 + t];
            for (int t = 0; t < 10; t++) p[n++] = 5 + (t * 17 + i * 3 + 1) % (m->vocab - 10);
        }
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
    rp->ignore_eos = m->simple || i % 4 != 0;
    if (i % 7 == 0 && !m->simple) {
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

/* A draft model proposer opened over each run's target engine. */
typedef struct {
    const char *dir;     /* the draft model (NULL: stories260K) */
    zs_dtype dtype;      /* its weight dtype (ZS_DTYPE_COUNT: as stored) */
    int batch;           /* its tokens per forward call (0: 64) */
} draft_cfg;

static const char *model_path(const eng_cfg *c, char *buf, size_t n) {
    if (c->dir) snprintf(buf, n, "%s", c->dir);
    else tu_model_dir(buf, n, "stories260K");
    return buf;
}

static zs_spec *open_draft(const draft_cfg *dc, zs_engine *target, const char *target_dir, int max_seqs) {
    char dir[4096];
    if (dc->dir) snprintf(dir, sizeof dir, "%s", dc->dir);
    else tu_model_dir(dir, sizeof dir, "stories260K");
    zs_engine_opts eo;
    zs_engine_opts_default(&eo);
    eo.model_dir = dir;
    eo.model.weight_dtype = dc->dtype;
    eo.max_seqs = max_seqs;
    eo.max_batch_tokens = dc->batch > 0 ? dc->batch : 64;
    zs_spec *p = NULL;
    int rc = zs_spec_draft_new(&eo, target, target_dir, &p);
    CHECK(rc == 0, "draft model %s: %s", dir, zs_errmsg());
    return rc == 0 ? p : NULL;
}

static void run_mix_ex(const eng_cfg *c, const char *nvme, int no_drafts, zs_spec *spec, int k, int tree, run_out *o,
                       int with_lora, int with_con, int nreq, const draft_cfg *dc, int simple) {
    zs_engine *e = open_engine(c, nvme);
    if (!e) return;
    mix_ctx m = {zs_engine_tokenizer(e), NULL, NULL, NULL, NULL, NULL, zs_model_config_get(zs_engine_model(e))->vocab_size,
                 simple};
    char tdir[4096];
    zs_spec *dp = dc && !no_drafts ? open_draft(dc, e, model_path(c, tdir, sizeof tdir), 16) : NULL;
    if (dp) spec = dp;
    else if (dc && !no_drafts) {
        zs_engine_free(e);
        return;
    }
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
    zs_sched_opts so = {16, 64, 512, 0, spec, k, no_drafts, tree, 0, 0, 0};
    zs_sched *s = NULL;
    if (zs_sched_new(e, &so, &s) < 0) {
        CHECK(0, "sched: %s", zs_errmsg());
        goto out;
    }
    static req_t q[WAVE];
    int32_t p[160];
    for (int w0 = 0; w0 < nreq; w0 += WAVE) {
        int nw = ZS_MIN(WAVE, nreq - w0);
        tu_hold gate; /* the whole wave in the inbox at the first step: passes then do not depend on how fast we submit */
        tu_hold_start(&gate, s);
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
        tu_hold_end(&gate);
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
    if (dp) CHECK(zs_spec_draft_stats_get(dp, &o->dst) == 0, "draft stats");
out:
    zs_spec_free(dp);
    zs_lora_free(m.lora);
    zs_jschema_mask_free(mk);
    zs_jschema_mask_free(mk2);
    zs_jschema_mask_free(mk3);
    zs_jschema_free(g);
    zs_jschema_free(g2);
    zs_jschema_free(g3);
    zs_engine_free(e);
}

static void run_mix(const eng_cfg *c, const char *nvme, int no_drafts, zs_spec *spec, int k, int tree, run_out *o,
                    int with_lora, int with_con, int nreq) {
    run_mix_ex(c, nvme, no_drafts, spec, k, tree, o, with_lora, with_con, nreq, NULL, 0);
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

static void report(const char *label, const char *what, const run_out *p, const run_out *a) {
    fprintf(stderr, "%s, %s: %llu passes (plain %llu), %llu drafted, %llu accepted, %llu forced, %llu trees, %llu "
                    "accepted off the first branch, %llu KV moves, %.2f tokens per pass (plain %.2f)\n",
            label, what, (unsigned long long)a->st.passes, (unsigned long long)p->st.passes,
            (unsigned long long)a->st.spec_drafted, (unsigned long long)a->st.spec_accepted,
            (unsigned long long)a->st.spec_forced, (unsigned long long)a->st.spec_trees,
            (unsigned long long)a->st.spec_side_accepted, (unsigned long long)a->st.spec_kv_moves,
            (double)a->st.pass_tokens / (double)(a->st.passes ? a->st.passes : 1),
            (double)p->st.pass_tokens / (double)(p->st.passes ? p->st.passes : 1));
}

static uint64_t greedy_moves; /* KV entries moved after trees in all greedy runs */

/* A proposer that makes every accepted tree path a side branch that must be moved: asked for a
 * tree, it puts a decoy (the first draft of prompt lookup's chain, minus one) first at the root
 * and the chain as the root's second child, so whenever the chain holds, the first child failed
 * and the path sits one slot past its positions. */
typedef struct {
    zs_spec base;
    zs_spec *inner;
} decoy_spec;

static int decoy_propose(zs_spec *p, zs_spec_req *reqs, int n) {
    decoy_spec *d = (decoy_spec *)p;
    for (int i = 0; i < n; i++) {
        zs_spec_req *q = &reqs[i];
        if (!q->parent || q->k < 2) {
            ZS_CHECK(zs_spec_propose(d->inner, q, 1));
            continue;
        }
        int32_t chain[ZS_SPEC_MAX_TOKENS];
        zs_spec_req c = {q->key, q->tokens, q->n, q->k - 1, chain, 0, NULL, NULL};
        ZS_CHECK(zs_spec_propose(d->inner, &c, 1));
        q->n_draft = c.n_draft ? c.n_draft + 1 : 0;
        for (int j = 0; j < c.n_draft; j++) {
            q->draft[j + 1] = chain[j];
            q->parent[j + 1] = j == 0 ? -1 : j;
            q->share[j + 1] = j == 0 ? 0.5f : 1.0f;
        }
        if (c.n_draft) {
            q->draft[0] = chain[0] > 0 ? chain[0] - 1 : chain[0] + 1;
            q->parent[0] = -1;
            q->share[0] = 0.5f;
        }
    }
    return 0;
}

static void decoy_free(zs_spec *p) { (void)p; }

static const zs_spec_ops decoy_ops = {"decoy", decoy_propose, NULL, decoy_free};

/* Greedy with speculation, chains and trees, drafts chosen from the costs and fixed at 4 and 16, then
 * trees whose accepted paths are always side branches (decoy_spec),
 * against plain decoding: the same tokens, logprob bits and finish for every request. */
static void test_greedy(const eng_cfg *c, const char *label, int with_lora, int with_con, int nreq) {
    static run_out plain, runs[6];
    static const struct { int k, tree; const char *what; } cfg[6] = {
        {0, 0, "chains from costs"}, {4, 0, "4-token chains"}, {16, 0, "16-token chains"},
        {0, 1, "trees from costs"},  {4, 1, "4-node trees"},   {16, 1, "16-node trees"}};
    char nvme[4096] = "";
    if (c->nvme) tu_tmpdir(nvme, sizeof nvme, "spec-nvme");
    zs_spec *ng = NULL;
    CHECK(zs_spec_ngram_new(ZS_SPEC_NGRAM_MIN, ZS_SPEC_NGRAM_MAX, &ng) == 0, "ngram");
    memset(&plain, 0, sizeof plain);
    run_mix(c, nvme, 1, NULL, 0, 0, &plain, with_lora, with_con, nreq);
    const zs_sched_stats *p = &plain.st;
    CHECK(p->spec_drafted == 0 && p->spec_forced == 0 && p->spec_forced_drafted == 0, "%s: plain decoding drafts nothing",
          label);
    if (with_con)
        CHECK(plain.triggered > 0, "%s: some trigger requests reached their constrained part (%d)", label, plain.triggered);
    for (int k = 0; k < 6; k++) {
        memset(&runs[k], 0, sizeof runs[k]);
        run_mix(c, nvme, 0, ng, cfg[k].k, cfg[k].tree, &runs[k], with_lora, with_con, nreq);
        int f, same = compare(&plain, &runs[k], nreq, &f);
        CHECK(same == nreq, "%s: greedy with %s = plain decoding, %d/%d (first differing: %d)", label, cfg[k].what, same,
              nreq, f);
        report(label, cfg[k].what, &plain, &runs[k]);
        const zs_sched_stats *a = &runs[k].st;
        CHECK(a->generated_tokens == p->generated_tokens, "%s, %s: the same tokens generated", label, cfg[k].what);
        CHECK(a->spec_accepted <= a->spec_drafted, "%s, %s: accepted <= drafted", label, cfg[k].what);
        CHECK(cfg[k].tree || (a->spec_trees == 0 && a->spec_side_accepted == 0 && a->spec_kv_moves == 0),
              "%s, %s: chains never branch nor move", label, cfg[k].what);
        if (cfg[k].k != 4) continue;
        /* the fixed 4: speculation must have happened */
        CHECK(a->spec_accepted > 0, "%s, %s: drafts were accepted (%llu of %llu)", label, cfg[k].what,
              (unsigned long long)a->spec_accepted, (unsigned long long)a->spec_drafted);
        CHECK(a->passes < p->passes, "%s, %s: fewer passes with speculation (%llu < %llu)", label, cfg[k].what,
              (unsigned long long)a->passes, (unsigned long long)p->passes);
        uint64_t hist = 0;
        for (int i = 0; i <= ZS_SPEC_MAX_TOKENS; i++) hist += a->spec_accept_hist[i];
        CHECK(hist > 0, "%s, %s: the acceptance histogram counts verifications", label, cfg[k].what);
        if (with_con) /* the grammar's forced bytes went in as drafts beyond the forced prefix and suffix;
                       * some were spelled otherwise by the model, and the outputs still equal plain's */
            CHECK(a->spec_forced > runs[k].fixed && a->spec_forced_drafted > a->spec_forced,
                  "%s, %s: jump-forward in the value: %llu forced tokens held (prefix and suffix: at most %llu), "
                  "%llu drafted", label, cfg[k].what, (unsigned long long)a->spec_forced,
                  (unsigned long long)runs[k].fixed, (unsigned long long)a->spec_forced_drafted);
        if (cfg[k].tree) CHECK(a->spec_trees > 0, "%s, %s: drafts branched", label, cfg[k].what);
    }
    for (int k = 0; k < 6; k++) greedy_moves += runs[k].st.spec_kv_moves;
    /* every accepted path off the first branch and moved: still plain decoding's bits */
    decoy_spec dc = {{&decoy_ops}, ng};
    memset(&runs[0], 0, sizeof runs[0]);
    run_mix(c, nvme, 0, &dc.base, 8, 1, &runs[0], with_lora, with_con, nreq);
    int f, same = compare(&plain, &runs[0], nreq, &f);
    CHECK(same == nreq, "%s: greedy with decoy-first trees = plain decoding, %d/%d (first differing: %d)", label, same,
          nreq, f);
    report(label, "decoy-first trees", &plain, &runs[0]);
    CHECK(runs[0].st.spec_side_accepted > 0 && runs[0].st.spec_kv_moves > 0,
          "%s, decoy-first trees: side branches held (%llu) and were moved (%llu entries)", label,
          (unsigned long long)runs[0].st.spec_side_accepted, (unsigned long long)runs[0].st.spec_kv_moves);
    zs_spec_free(ng);
    if (c->nvme) tu_rmdir(nvme);
}

/* ---------- sampled outputs keep the target's distribution ---------- */

/* With prompt lookup, or (dc) a draft model. */
static void test_sampled(const draft_cfg *dc, const char *label, const char *text, int tree) {
    enum { NS = 3000 };
    eng_cfg c = {1, 0, NULL};
    zs_spec *ng = NULL;
    CHECK(zs_spec_ngram_new(1, 3, &ng) == 0, "ngram");
    static long cnt[2][3][512];
    memset(cnt, 0, sizeof cnt);
    zs_sched_stats st[2];
    for (int mode = 0; mode < 2; mode++) {
        zs_engine *e = open_engine(&c, NULL);
        if (!e) return;
        char tdir[4096];
        zs_spec *dp = mode && dc ? open_draft(dc, e, model_path(&c, tdir, sizeof tdir), 16) : NULL;
        zs_sched_opts so = {16, 64, 4096, 0, mode ? (dp ? dp : ng) : NULL, mode ? (tree ? 8 : 4) : 0, !mode, tree, 0, 0, 0};
        zs_sched *s = NULL;
        if (zs_sched_new(e, &so, &s) < 0) {
            zs_spec_free(dp);
            zs_engine_free(e);
            CHECK(0, "sched: %s", zs_errmsg());
            return;
        }
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
                rp.max_tokens = tree ? 8 : 4; /* trees: room for a few nodes at once */
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
        zs_spec_free(dp);
        zs_engine_free(e);
    }
    CHECK(st[1].spec_drafted > 0 && st[1].spec_accepted > 0 && st[1].spec_accepted < st[1].spec_drafted,
          "%s: drafts were proposed, some accepted and some not (%llu of %llu)", label,
          (unsigned long long)st[1].spec_accepted, (unsigned long long)st[1].spec_drafted);
    fprintf(stderr, "%s: %llu drafted, %llu accepted, %llu trees, %llu accepted off the first branch, %llu KV moves\n",
            label, (unsigned long long)st[1].spec_drafted, (unsigned long long)st[1].spec_accepted,
            (unsigned long long)st[1].spec_trees, (unsigned long long)st[1].spec_side_accepted,
            (unsigned long long)st[1].spec_kv_moves);
    if (tree)
        CHECK(st[1].spec_trees > 0 && st[1].spec_side_accepted > 0 && st[1].spec_kv_moves > 0,
              "%s: drafts branched (%llu trees), branches other than the first held (%llu drafts), accepted paths "
              "were moved (%llu entries)", label, (unsigned long long)st[1].spec_trees,
              (unsigned long long)st[1].spec_side_accepted, (unsigned long long)st[1].spec_kv_moves);
    for (int t = 0; t < 3; t++) {
        double x;
        int df;
        CHECK(same_dist(cnt[1][t], cnt[0][t], 512, NS, NS, &x, &df),
              "%s: token %d with speculation follows plain sampling (chi-square %.1f, %d df, critical %.1f)", label,
              t + 2, x, df, chi2_crit(df));
        fprintf(stderr, "%s: token %d: chi-square %.1f on %d df\n", label, t + 2, x, df);
    }
    zs_spec_free(ng);
}

/* ---------- the draft model proposer (spec-draft.c) ---------- */

static double acc_rate(const zs_sched_stats *st) {
    return st->spec_drafted ? (double)st->spec_accepted / (double)st->spec_drafted : 0.0;
}
static double per_pass(const zs_sched_stats *st) { return (double)st->pass_tokens / (double)(st->passes ? st->passes : 1); }

/* Greedy with a draft model = plain decoding bit for bit (drafts from the costs, 4 and 16 per
 * sequence); its acceptance rate within [lo, hi] with fixed drafts; its KV given back. */
static void test_draft_greedy(const eng_cfg *c, const draft_cfg *dc, const char *label, int with_lora, int with_con,
                              int nreq, int simple, double lo, double hi) {
    static run_out plain, r;
    static const int ks[3] = {0, 4, 16};
    memset(&plain, 0, sizeof plain);
    run_mix_ex(c, NULL, 1, NULL, 0, 0, &plain, with_lora, with_con, nreq, NULL, simple);
    for (int j = 0; j < 3; j++) {
        memset(&r, 0, sizeof r);
        run_mix_ex(c, NULL, 0, NULL, ks[j], 0, &r, with_lora, with_con, nreq, dc, simple);
        int first, same = compare(&plain, &r, nreq, &first);
        const zs_sched_stats *a = &r.st;
        CHECK(same == nreq, "%s, %s drafts: greedy with the draft model = plain decoding, %d/%d (first differing: %d)",
              label, j ? (j == 1 ? "4" : "16") : "auto", same, nreq, first);
        CHECK(a->generated_tokens == plain.st.generated_tokens, "%s: the same tokens generated", label);
        CHECK(r.dst.kv_used == 0 && r.dst.seqs == 0, "%s: every request's draft KV given back (%d blocks, %d sequences "
              "held after %d requests)", label, r.dst.kv_used, r.dst.seqs, nreq);
        fprintf(stderr, "%s, %s drafts: %llu drafted, %llu accepted (%.3f), %llu passes (plain %llu), %.2f tokens per "
                "pass (plain %.2f); draft: %llu calls, %llu tokens fed, %llu rolled back, %.2f s\n", label,
                j ? (j == 1 ? "4" : "16") : "auto", (unsigned long long)a->spec_drafted,
                (unsigned long long)a->spec_accepted, acc_rate(a), (unsigned long long)a->passes,
                (unsigned long long)plain.st.passes, per_pass(a), per_pass(&plain.st), (unsigned long long)r.dst.passes,
                (unsigned long long)r.dst.fed, (unsigned long long)r.dst.rolled, r.dst.seconds);
        if (j == 0) continue;
        CHECK(a->spec_drafted > 0 && r.dst.passes > 0, "%s: the draft model proposed", label);
        CHECK(acc_rate(a) >= lo && acc_rate(a) <= hi, "%s, %d drafts: acceptance %.3f within [%.2f, %.2f]", label, ks[j],
              acc_rate(a), lo, hi);
        CHECK(a->passes < plain.st.passes, "%s, %d drafts: fewer passes (%llu < %llu)", label, ks[j],
              (unsigned long long)a->passes, (unsigned long long)plain.st.passes);
    }
}

/* The proposer called directly: drafts are the greedy continuation, a rolled-back sequence
 * drafts what a fresh one does, chunked catch-up, the context and slot limits, release. */
static void test_draft_calls(void) {
    eng_cfg c = {1, 0, NULL};
    zs_engine *e = open_engine(&c, NULL);
    if (!e) return;
    char tdir[4096];
    draft_cfg dc = {NULL, ZS_DTYPE_COUNT, 16}; /* 16 tokens a call: catch-up in chunks */
    zs_spec *p = open_draft(&dc, e, model_path(&c, tdir, sizeof tdir), 2);
    if (!p) {
        zs_engine_free(e);
        return;
    }
    CHECK(!strcmp(zs_spec_name(p), "draft"), "name");
    int32_t t[300], ref[40];
    int32_t *ids = NULL;
    size_t n = 0;
    t[0] = 1;
    const char *text = "Once upon a time, there was a little girl named Lily.";
    CHECK(zs_tokenizer_encode(zs_engine_tokenizer(e), text, strlen(text), 0, &ids, &n) == 0 && n > 4 && n < 40, "encode");
    memcpy(t + 1, ids, n * sizeof *t);
    free(ids);
    int nt = (int)n + 1;
    /* the reference: plain greedy generation of the target (the same weights) */
    zs_gen_params gp;
    memset(&gp, 0, sizeof gp);
    zs_sampler_params_default(&gp.sampling);
    gp.sampling.temperature = 0;
    gp.max_tokens = 30;
    gp.ignore_eos = 1;
    zs_gen_result res;
    memset(&res, 0, sizeof res);
    CHECK(zs_engine_generate(e, t, nt, &gp, NULL, NULL, &res) == 0 && res.n_generated == 30, "generate: %s", zs_errmsg());
    if (res.ids) memcpy(ref, res.ids, 30 * sizeof *ref);
    free(res.ids);

    int32_t d1[ZS_SPEC_MAX_TOKENS], d2[ZS_SPEC_MAX_TOKENS], d3[ZS_SPEC_MAX_TOKENS];
    zs_spec_req q[3];
    q[0] = (zs_spec_req){11, t, nt, 8, d1, 0, NULL, NULL};
    CHECK(zs_spec_propose(p, q, 1) == 0 && q[0].n_draft == 8 && !memcmp(d1, ref, 8 * sizeof *d1),
          "the drafts are the greedy continuation (%d drafts)", q[0].n_draft);
    /* four drafts accepted, then a token the draft did not propose: rolled back to it */
    int32_t u[300];
    memcpy(u, t, (size_t)nt * sizeof *u);
    memcpy(u + nt, d1, 4 * sizeof *u);
    u[nt + 4] = d1[4] == 300 ? 301 : 300;
    zs_spec_draft_stats st0, st1;
    zs_spec_draft_stats_get(p, &st0);
    q[0] = (zs_spec_req){11, u, nt + 5, 6, d2, 0, NULL, NULL};
    CHECK(zs_spec_propose(p, q, 1) == 0 && q[0].n_draft == 6, "after a rejection: %d drafts", q[0].n_draft);
    zs_spec_draft_stats_get(p, &st1);
    CHECK(st1.rolled == st0.rolled + 3, "the 3 stale draft positions rolled back (%llu)",
          (unsigned long long)(st1.rolled - st0.rolled));
    CHECK(st1.fed - st0.fed == 1 + 5, "only the new token fed (the accepted drafts are in the KV), then 5 drafts (%llu)",
          (unsigned long long)(st1.fed - st0.fed));
    q[0] = (zs_spec_req){12, u, nt + 5, 6, d3, 0, NULL, NULL};
    CHECK(zs_spec_propose(p, q, 1) == 0 && q[0].n_draft == 6 && !memcmp(d2, d3, 6 * sizeof *d2),
          "a rolled-back sequence drafts what a fresh one does");
    /* two sequences in one call, one with a long prompt (catch-up in chunks of 16); key 12's
     * slot is reused, key 11's taken back (least recently used) for key 13 */
    for (int i = 0; i < 200; i++) t[i] = 5 + (i * 37) % 500;
    q[0] = (zs_spec_req){12, u, nt + 6, 4, d2, 0, NULL, NULL};
    u[nt + 5] = d3[0];
    q[1] = (zs_spec_req){13, t, 200, 5, d1, 0, NULL, NULL};
    CHECK(zs_spec_propose(p, q, 2) == 0 && q[0].n_draft == 4 && q[1].n_draft == 5, "two sequences: %d and %d drafts",
          q[0].n_draft, q[1].n_draft);
    CHECK(!memcmp(d2, d3 + 1, 3 * sizeof *d2), "the accepted draft fed: the drafts go on where they were");
    q[2] = (zs_spec_req){14, t, 200, 5, d3, 0, NULL, NULL};
    CHECK(zs_spec_propose(p, &q[2], 1) == 0 && q[2].n_draft == 5 && !memcmp(d1, d3, 5 * sizeof *d1),
          "a third sequence takes the least recently used slot; batched drafts = drafts alone");
    /* more sequences in one call than the draft keeps: the rest get none, no error */
    q[0] = (zs_spec_req){21, t, 50, 3, d1, 0, NULL, NULL};
    q[1] = (zs_spec_req){22, t, 60, 3, d2, 0, NULL, NULL};
    q[2] = (zs_spec_req){23, t, 70, 3, d3, 0, NULL, NULL};
    CHECK(zs_spec_propose(p, q, 3) == 0 && q[0].n_draft == 3 && q[1].n_draft == 3 && q[2].n_draft == 0,
          "2 slots: drafts for 2 of 3 sequences (%d %d %d)", q[0].n_draft, q[1].n_draft, q[2].n_draft);
    /* the context (256): drafts stop at its end; a sequence past it gets none */
    for (int i = 200; i < 300; i++) t[i] = 5 + (i * 41) % 500;
    q[0] = (zs_spec_req){21, t, 254, 8, d1, 0, NULL, NULL};
    q[1] = (zs_spec_req){22, t, 260, 8, d2, 0, NULL, NULL};
    CHECK(zs_spec_propose(p, q, 2) == 0 && q[0].n_draft == 3 && q[1].n_draft == 0,
          "context 256: 3 drafts after 254 tokens, none after 260 (%d, %d)", q[0].n_draft, q[1].n_draft);
    zs_spec_draft_stats_get(p, &st0);
    CHECK(st0.seqs == 2 && st0.kv_used > 0, "two sequences held (%d, %d blocks)", st0.seqs, st0.kv_used);
    zs_spec_release(p, 21);
    zs_spec_release(p, 22);
    zs_spec_release(p, 99); /* unknown: nothing */
    zs_spec_draft_stats_get(p, &st0);
    CHECK(st0.seqs == 0 && st0.kv_used == 0, "released: no sequence, no block held (%d, %d)", st0.seqs, st0.kv_used);
    zs_spec *ng = NULL;
    CHECK(zs_spec_ngram_new(2, 3, &ng) == 0 && zs_spec_draft_stats_get(ng, &st0) == ZS_EINVAL, "not a draft: refused");
    zs_spec_free(ng);
    zs_spec_free(p);
    zs_engine_free(e);
}

/* A model whose every layer has a sliding window (a ring of KV blocks per sequence): a rollback
 * into positions the ring has overwritten starts the sequence over, and drafts stay those of a
 * fresh sequence. */
static void test_draft_window(const char *dir) {
    eng_cfg c = {1, 0, dir};
    zs_engine *e = open_engine(&c, NULL);
    if (!e) return;
    draft_cfg dc = {dir, ZS_DTYPE_COUNT, 16};
    zs_spec *p = open_draft(&dc, e, dir, 2);
    if (p) {
        int32_t t[200], d1[8] = {0}, d2[8] = {0};
        for (int i = 0; i < 200; i++) t[i] = (i * 53 + i * i % 7) % 250;
        zs_spec_req q = {1, t, 150, 6, d1, 0, NULL, NULL};
        CHECK(zs_spec_propose(p, &q, 1) == 0 && q.n_draft == 6, "window: 6 drafts");
        /* back to 40 tokens: the ring (window 16, 16 tokens a call) no longer holds them */
        zs_spec_draft_stats st0, st1;
        zs_spec_draft_stats_get(p, &st0);
        q = (zs_spec_req){1, t, 41, 6, d1, 0, NULL, NULL};
        CHECK(zs_spec_propose(p, &q, 1) == 0 && q.n_draft == 6, "window, rolled back far: 6 drafts");
        zs_spec_draft_stats_get(p, &st1);
        CHECK(st1.rolled - st0.rolled == 155, "the whole sequence started over (%llu positions rolled back)",
              (unsigned long long)(st1.rolled - st0.rolled));
        zs_spec_req q2 = {2, t, 41, 6, d2, 0, NULL, NULL};
        CHECK(zs_spec_propose(p, &q2, 1) == 0 && q2.n_draft == 6 && !memcmp(d1, d2, 6 * sizeof *d1),
              "window: the same drafts as a fresh sequence");
        /* a short rollback the ring still holds: no restart */
        int32_t u[200];
        memcpy(u, t, sizeof u);
        memcpy(u + 41, d2, 2 * sizeof *u);
        u[43] = d2[2] == 7 ? 8 : 7;
        zs_spec_draft_stats_get(p, &st0);
        q2 = (zs_spec_req){2, u, 44, 6, d2, 0, NULL, NULL};
        zs_spec_req q3 = {3, u, 44, 6, d1, 0, NULL, NULL};
        CHECK(zs_spec_propose(p, &q2, 1) == 0 && zs_spec_propose(p, &q3, 1) == 0 && q2.n_draft == 6 &&
                  q3.n_draft == 6 && !memcmp(d1, d2, 6 * sizeof *d1), "window, a short rollback: the drafts of a fresh sequence");
        zs_spec_draft_stats_get(p, &st1);
        CHECK(st1.rolled - st0.rolled == 3 + 0, "window, a short rollback: only the stale drafts rolled back (%llu)",
              (unsigned long long)(st1.rolled - st0.rolled));
        zs_spec_free(p);
    }
    zs_engine_free(e);
}

/* What cannot be a draft is refused at the start, by name. */
static void test_draft_refusals(const char *random512) {
    eng_cfg c = {1, 0, NULL};
    zs_engine *e = open_engine(&c, NULL);
    if (!e) return;
    char tdir[4096], gdir[4096];
    model_path(&c, tdir, sizeof tdir);
    tu_model_dir(gdir, sizeof gdir, "gpt2-bytes");
    zs_engine_opts eo;
    zs_engine_opts_default(&eo);
    zs_spec *p = NULL;
    eo.model_dir = gdir;
    CHECK_ERR(zs_spec_draft_new(&eo, e, tdir, &p), "--draft-model", gdir, tdir, "(256 tokens)", "(512 tokens)");
    fprintf(stderr, "refused: %s\n", zs_errmsg());
    eo.model_dir = random512; /* 512 tokens, byte-level: not the same tokens */
    CHECK_ERR(zs_spec_draft_new(&eo, e, tdir, &p), "--draft-model", random512, tdir, "at token 0");
    fprintf(stderr, "refused: %s\n", zs_errmsg());
    eo.model_dir = "/nonexistent/draft";
    CHECK_ERR(zs_spec_draft_new(&eo, e, tdir, &p), "--draft-model /nonexistent/draft: ");
    fprintf(stderr, "refused: %s\n", zs_errmsg());
    eo.model_dir = tdir;
    eo.max_seqs = 0;
    CHECK_ERR(zs_spec_draft_new(&eo, e, tdir, &p), "--draft-model", "sequences");
    CHECK(p == NULL, "nothing made");
    zs_engine_free(e);
}

static int make_random(const char *arch, int vocab, int window, const char *dir) {
    zs_init_opts io;
    int rc = zs_init_opts_default(arch, &io);
    if (rc < 0) return rc;
    io.cfg.n_layers = 2;
    io.cfg.vocab_size = vocab;
    io.cfg.max_seq = 512;
    io.seed = 3;
    io.random_norms = 1;
    io.init_std = 0.3f;
    char ov[64] = "{}";
    if (window) snprintf(ov, sizeof ov, "{\"sliding_window\": %d}", window);
    if ((rc = zs_config_override(&io.cfg, ov, "test-spec")) < 0) return rc;
    return zs_init_model_write(&io, dir);
}

static int copy_file(const char *from, const char *to) {
    FILE *f = fopen(from, "rb");
    if (!f) return -1;
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf, f);
    int full = !feof(f);
    fclose(f);
    return full ? -1 : tu_write_file(to, buf, n);
}

/* A target whose model has more rows (600) than the shared tokenizer's ids (520), and a draft
 * with 520: a sequence holding an id the draft has no row for gets no drafts, the others do. */
static void test_draft_padded(const char *dir) {
    char a[4200], b[4200], f1[4300], f2[4300];
    snprintf(a, sizeof a, "%s/v520", dir);
    snprintf(b, sizeof b, "%s/v600", dir);
    int ok = make_random("llama", 520, 0, a) == 0 && make_random("llama", 600, 0, b) == 0;
    static const char *files[] = {"tokenizer.json", "tokenizer_config.json", "generation_config.json"};
    for (int i = 0; ok && i < 3; i++) {
        snprintf(f1, sizeof f1, "%s/%s", a, files[i]);
        snprintf(f2, sizeof f2, "%s/%s", b, files[i]);
        ok = copy_file(f1, f2) == 0;
    }
    /* the target's config.json names the shared tokenizer's BOS/EOS */
    snprintf(f2, sizeof f2, "%s/config.json", b);
    json_t *cj = ok ? json_load_file(f2, 0, NULL) : NULL;
    ok = cj && json_object_set_new(cj, "bos_token_id", json_integer(519)) == 0 &&
         json_object_set_new(cj, "eos_token_id", json_integer(519)) == 0 && json_dump_file(cj, f2, JSON_INDENT(2)) == 0;
    json_decref(cj);
    CHECK(ok, "padded models: %s", zs_errmsg());
    if (!ok) return;
    eng_cfg c = {1, 0, b};
    zs_engine *e = open_engine(&c, NULL);
    if (!e) return;
    draft_cfg dc = {a, ZS_DTYPE_COUNT, 16};
    zs_spec *p = open_draft(&dc, e, b, 4);
    if (p) {
        int32_t t[40], u[40], d1[4], d2[4];
        for (int i = 0; i < 40; i++) t[i] = u[i] = (i * 31) % 500;
        u[20] = 550; /* a row of the target's model, past the tokenizer and the draft */
        zs_spec_req q[2] = {{1, t, 40, 4, d1, 0, NULL, NULL}, {2, u, 40, 4, d2, 0, NULL, NULL}};
        CHECK(zs_spec_propose(p, q, 2) == 0 && q[0].n_draft == 4 && q[1].n_draft == 0,
              "an id past the draft's rows: no drafts for that sequence, the other has its own (%d, %d)", q[0].n_draft,
              q[1].n_draft);
        for (int i = 0; i < 4; i++) CHECK(d1[i] >= 0 && d1[i] < 520, "drafts within the shared tokenizer's ids (%d)", d1[i]);
        zs_spec_free(p);
    }
    zs_engine_free(e);
}

static void test_draft(void) {
    eng_cfg one = {1, 0, NULL}, two = {2, 0, NULL};
    draft_cfg same = {NULL, ZS_DTYPE_COUNT, 0}, q8 = {NULL, ZS_Q8_0, 0}, bf16 = {NULL, ZS_BF16, 0};
    test_draft_calls();
    test_sampled(&q8, "sampled, a q8_0 draft model", "Lily and Tom went to the park. Lily and Tom went to the park. Lily and", 0);
    /* the same weights and dtype: every greedy draft holds */
    test_draft_greedy(&one, &same, "draft = target (f32), no EOS or stops", 0, 0, 120, 1, 1.0, 1.0);
    test_draft_greedy(&one, &same, "draft = target (f32), mixed", 1, 1, N_REQ, 0, 0.5, 1.0);
    /* another dtype: most drafts hold, not all */
    test_draft_greedy(&one, &q8, "draft q8_0, target f32, mixed", 1, 1, N_REQ, 0, 0.5, 0.999);
    test_draft_greedy(&two, &bf16, "draft bf16, target f32 on 2 ranks", 0, 0, 120, 0, 0.5, 0.999);
    char dir[4096];
    tu_tmpdir(dir, sizeof dir, "spec-draft");
    char win[4200], r512[4200];
    snprintf(win, sizeof win, "%s/mistral", dir);
    snprintf(r512, sizeof r512, "%s/llama512", dir);
    if (make_random("mistral", 300, 16, win) == 0) {
        eng_cfg w = {1, 0, win};
        draft_cfg wd = {win, ZS_DTYPE_COUNT, 16};
        test_draft_window(win);
        test_draft_greedy(&w, &wd, "sliding window 16 (random Mistral), draft = target", 0, 0, 60, 1, 1.0, 1.0);
    } else {
        CHECK(0, "mistral model: %s", zs_errmsg());
    }
    if (make_random("llama", 512, 0, r512) == 0) test_draft_refusals(r512);
    else CHECK(0, "llama model: %s", zs_errmsg());
    test_draft_padded(dir);
    tu_rmdir(dir);
}

/* ---------- jump-forward ---------- */

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
        zs_sched_opts so = {16, 64, 4096, 0, NULL, 0, !mode, 0, 0, 0, 0};
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
        zs_sched_opts so = {16, 64, 4096, 0, NULL, 0, !mode, 0, 0, 0, 0};
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
    test_verify_multi();
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
    CHECK(greedy_moves > 0, "greedy: accepted tree paths were moved (%llu entries) and the outputs stayed plain decoding's",
          (unsigned long long)greedy_moves);
    /* a text that repeats itself: prompt lookup proposes its continuation */
    test_sampled(NULL, "sampled, chains", "Lily and Tom went to the park. Lily and Tom went to the park. Lily and", 0);
    /* its continuations differ: trees */
    test_sampled(NULL, "sampled, trees", "Lily and Tom went to the park. Lily and Sue went to the shop. Lily and Tom went home. "
                 "Lily and Sue went", 1);
    test_draft();
    test_sampled_constrained();
    test_long_keys();
    return tu_finish("test-spec");
}
