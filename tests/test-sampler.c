/* test-sampler.c — tests for engine/sampler (greedy, temperature, top_k, top_p, min_p, seeds,
 * logprobs, parameter validation, speed on a 128k vocabulary) and engine/stop (stop strings over
 * streamed text). Statistical checks use fixed seeds and 3-sigma bounds. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common.h"
#include "sampler.h"
#include "stop.h"
#include "testutil.h"

/* ---------- helpers ---------- */

static uint64_t lcg_state = 12345;
static double lcg_uniform(void) { /* test-side randomness, independent of the sampler */
    lcg_state = lcg_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(lcg_state >> 11) * 0x1.0p-53;
}

static void random_logits(float *l, int n, double scale) {
    for (int i = 0; i < n; i++) l[i] = (float)((lcg_uniform() + lcg_uniform() + lcg_uniform() - 1.5) * scale);
}

static void log_softmax_ref(const float *l, int n, double t, double *out) {
    double m = -INFINITY;
    for (int i = 0; i < n; i++) m = fmax(m, l[i] / t);
    double s = 0;
    for (int i = 0; i < n; i++) s += exp(l[i] / t - m);
    for (int i = 0; i < n; i++) out[i] = l[i] / t - m - log(s);
}

static int argmax_ref(const float *l, int n) {
    int a = 0;
    for (int i = 1; i < n; i++)
        if (l[i] > l[a]) a = i;
    return a;
}

static zs_sampler *mk(float t, float top_p, int top_k, uint64_t seed, int n) {
    zs_sampler_params p;
    zs_sampler_params_default(&p);
    p.temperature = t;
    p.top_p = top_p;
    p.top_k = top_k;
    p.seed = seed;
    zs_sampler *s = NULL;
    int rc = zs_sampler_new(&p, n, &s);
    CHECK(rc == 0 && s, "zs_sampler_new: %s", zs_errmsg());
    return s;
}

/* Draws N tokens and checks the counts against expected probabilities (3 sigma). */
static void check_empirical(zs_sampler *s, const float *l, int n, const double *prob, int N,
                            const char *what) {
    long counts[64] = {0};
    for (int i = 0; i < N; i++) {
        int tok = -1;
        int rc = zs_sampler_sample(s, l, &tok, NULL);
        if (rc != 0 || tok < 0 || tok >= n) {
            CHECK(0, "%s: sample rc %d tok %d", what, rc, tok);
            return;
        }
        counts[tok]++;
    }
    for (int i = 0; i < n; i++) {
        double e = N * prob[i], sigma = sqrt(N * prob[i] * (1 - prob[i]));
        if (prob[i] == 0)
            CHECK(counts[i] == 0, "%s: token %d has p=0 but was drawn %ld times", what, i,
                  counts[i]);
        else
            CHECK(fabs(counts[i] - e) <= 3 * sigma, "%s: token %d count %ld expected %.1f +- %.1f",
                  what, i, counts[i], e, 3 * sigma);
    }
}

/* ---------- sampler tests ---------- */

static void test_params(void) {
    zs_sampler_params p;
    zs_sampler_params_default(&p);
    CHECK(p.temperature == 1.0f && p.top_p == 1.0f && p.top_k == 0 && p.seed == 0 &&
              p.min_p == 0.0f,
          "defaults");
    CHECK(zs_sampler_params_check(&p) == 0, "defaults valid: %s", zs_errmsg());
    p.temperature = 0;
    CHECK(zs_sampler_params_check(&p) == 0, "temperature 0 valid");
    p.temperature = 100;
    CHECK(zs_sampler_params_check(&p) == 0, "temperature 100 valid");

    struct {
        float t, top_p;
        int top_k;
        float min_p;
        const char *field;
    } bad[] = {
        {-0.5f, 1, 0, 0, "temperature"}, {NAN, 1, 0, 0, "temperature"},
        {INFINITY, 1, 0, 0, "temperature"}, {100.5f, 1, 0, 0, "temperature"},
        {1, 0, 0, 0, "top_p"},           {1, 1.5f, 0, 0, "top_p"},
        {1, NAN, 0, 0, "top_p"},         {1, -0.1f, 0, 0, "top_p"},
        {1, 1, -1, 0, "top_k"},          {1, 1, 0, 1.0f, "min_p"},
        {1, 1, 0, -0.1f, "min_p"},       {1, 1, 0, NAN, "min_p"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        zs_sampler_params_default(&p);
        p.temperature = bad[i].t;
        p.top_p = bad[i].top_p;
        p.top_k = bad[i].top_k;
        p.min_p = bad[i].min_p;
        int rc = zs_sampler_params_check(&p);
        CHECK(rc == ZS_EINVAL || rc == ZS_ERANGE, "case %zu rc %d", i, rc);
        CHECK_ERR(rc, bad[i].field);
        zs_sampler *s = (zs_sampler *)&p; /* sentinel: must stay untouched */
        rc = zs_sampler_new(&p, 10, &s);
        CHECK_ERR(rc, bad[i].field);
        CHECK(s == (zs_sampler *)&p, "out set on failure");
    }
    zs_sampler_params_default(&p);
    p.temperature = -1;
    CHECK_ERR(zs_sampler_params_check(&p), "temperature must be between 0 and 100");
    CHECK_ERR(zs_sampler_params_check(NULL), "params");
    zs_sampler_params_default(&p);
    zs_sampler *s = NULL;
    CHECK_ERR(zs_sampler_new(&p, 0, &s), "vocab_size");
    CHECK_ERR(zs_sampler_new(&p, -5, &s), "vocab_size");
    CHECK(s == NULL, "out set on failure");
    zs_sampler_free(NULL);
}

static void test_greedy(void) {
    float l[] = {1.0f, 5.0f, 3.0f, 5.0f, 2.0f, -7.0f};
    int n = 6;
    double ref[6];
    log_softmax_ref(l, n, 1, ref);
    for (uint64_t seed = 0; seed < 5; seed++) {
        zs_sampler *s = mk(0, 1, 0, seed, n);
        for (int i = 0; i < 100; i++) {
            int tok = -1;
            float lp = 0;
            CHECK(zs_sampler_sample(s, l, &tok, &lp) == 0, "%s", zs_errmsg());
            CHECK(tok == 1, "greedy with ties picks lowest id, got %d", tok);
            CHECK(fabs(lp - ref[1]) < 1e-6, "greedy logprob %g vs %g", lp, ref[1]);
        }
        zs_sampler_free(s);
    }
    /* greedy == argmax on random logits; greedy ignores top_p/top_k */
    float r[1000];
    zs_sampler *s = mk(0, 0.5f, 7, 99, 1000);
    for (int t = 0; t < 50; t++) {
        random_logits(r, 1000, 4);
        int tok;
        CHECK(zs_sampler_sample(s, r, &tok, NULL) == 0, "%s", zs_errmsg());
        CHECK(tok == argmax_ref(r, 1000), "greedy != argmax");
    }
    zs_sampler_free(s);
}

static void test_tiny_temperature_topk1_topp(void) {
    enum { N = 500 };
    float l[N];
    zs_sampler *g = mk(0, 1, 0, 1, N), *tiny = mk(1e-4f, 1, 0, 2, N);
    for (int t = 0; t < 50; t++) {
        random_logits(l, N, 3);
        int a, b;
        CHECK(zs_sampler_sample(g, l, &a, NULL) == 0 && zs_sampler_sample(tiny, l, &b, NULL) == 0,
              "%s", zs_errmsg());
        CHECK(a == b, "temperature 0 (%d) vs 1e-4 (%d)", a, b);
    }
    zs_sampler_free(g);
    zs_sampler_free(tiny);

    for (uint64_t seed = 0; seed < 20; seed++) {
        zs_sampler *k1 = mk(1.5f, 1, 1, seed, N), *tp = mk(1.0f, 1e-6f, 0, seed, N);
        zs_sampler *both = mk(2.0f, 1e-6f, 40, seed, N);
        for (int t = 0; t < 10; t++) {
            random_logits(l, N, 2);
            if (t % 3 == 0) { /* a tie at the maximum: lowest id must win */
                int am = argmax_ref(l, N);
                l[N - 1] = l[am];
                l[am / 2] = l[am];
            }
            int want = argmax_ref(l, N), a, b, c;
            CHECK(zs_sampler_sample(k1, l, &a, NULL) == 0, "%s", zs_errmsg());
            CHECK(zs_sampler_sample(tp, l, &b, NULL) == 0, "%s", zs_errmsg());
            CHECK(zs_sampler_sample(both, l, &c, NULL) == 0, "%s", zs_errmsg());
            CHECK(a == want, "top_k=1 seed %llu: %d vs %d", (unsigned long long)seed, a, want);
            CHECK(b == want, "top_p tiny seed %llu: %d vs %d", (unsigned long long)seed, b, want);
            CHECK(c == want, "top_k+top_p tiny: %d vs %d", c, want);
        }
        zs_sampler_free(k1);
        zs_sampler_free(tp);
        zs_sampler_free(both);
    }
}

static void test_seeds(void) {
    enum { V = 300, D = 1000 };
    static float seq[D][V];
    for (int i = 0; i < D; i++) random_logits(seq[i], V, 2);
    static int a[D], b[D], c[D];
    const float tps[] = {1.0f, 0.9f, 1.0f};
    const int tks[] = {0, 0, 50};
    for (int cfg = 0; cfg < 3; cfg++) {
        zs_sampler *s1 = mk(1, tps[cfg], tks[cfg], 42, V), *s2 = mk(1, tps[cfg], tks[cfg], 42, V),
                   *s3 = mk(1, tps[cfg], tks[cfg], 43, V);
        for (int i = 0; i < D; i++) {
            CHECK(zs_sampler_sample(s1, seq[i], &a[i], NULL) == 0, "%s", zs_errmsg());
            CHECK(zs_sampler_sample(s2, seq[i], &b[i], NULL) == 0, "%s", zs_errmsg());
            CHECK(zs_sampler_sample(s3, seq[i], &c[i], NULL) == 0, "%s", zs_errmsg());
        }
        int same = 1, diff = 0;
        for (int i = 0; i < D; i++) {
            same &= a[i] == b[i];
            diff += a[i] != c[i];
        }
        CHECK(same, "cfg %d: same seed gave different sequences", cfg);
        CHECK(diff > D / 2, "cfg %d: different seeds differ in only %d of %d draws", cfg, diff, D);
        zs_sampler_free(s1);
        zs_sampler_free(s2);
        zs_sampler_free(s3);
    }
    /* a failed call draws nothing: the sequence depends only on successful calls */
    float bad[V];
    memcpy(bad, seq[0], sizeof bad);
    bad[7] = NAN;
    zs_sampler *s1 = mk(1, 1, 0, 7, V), *s2 = mk(1, 1, 0, 7, V);
    int x = -1;
    CHECK(zs_sampler_sample(s1, seq[0], &a[0], NULL) == 0, "ok");
    CHECK_ERR(zs_sampler_sample(s1, bad, &x, NULL), "logits[7]", "not finite");
    CHECK(x == -1, "token set on failure");
    CHECK(zs_sampler_sample(s1, seq[1], &a[1], NULL) == 0, "ok");
    CHECK(zs_sampler_sample(s2, seq[0], &b[0], NULL) == 0, "ok");
    CHECK(zs_sampler_sample(s2, seq[1], &b[1], NULL) == 0, "ok");
    CHECK(a[0] == b[0] && a[1] == b[1], "error consumed a draw");
    zs_sampler_free(s1);
    zs_sampler_free(s2);
}

static void test_distributions(void) {
    const int N = 200000;
    /* temperature 1, 5 logits */
    float l[5] = {1.0f, 2.0f, 0.5f, -1.0f, 1.5f};
    double lp[5], p[5];
    log_softmax_ref(l, 5, 1, lp);
    for (int i = 0; i < 5; i++) p[i] = exp(lp[i]);
    zs_sampler *s = mk(1, 1, 0, 2024, 5);
    check_empirical(s, l, 5, p, N, "temperature 1");
    zs_sampler_free(s);

    /* temperature 2 flattens */
    float l3[3] = {2.0f, 1.0f, 0.0f};
    double p1[3], p2[3];
    log_softmax_ref(l3, 3, 1, p1);
    log_softmax_ref(l3, 3, 2, p2);
    for (int i = 0; i < 3; i++) {
        p1[i] = exp(p1[i]);
        p2[i] = exp(p2[i]);
    }
    CHECK(p2[0] < p1[0] && p2[2] > p1[2], "reference flattening");
    s = mk(2, 1, 0, 5, 3);
    long c0 = 0;
    for (int i = 0; i < N; i++) {
        int tok;
        CHECK(zs_sampler_sample(s, l3, &tok, NULL) == 0, "%s", zs_errmsg());
        c0 += tok == 0;
    }
    CHECK(c0 < N * p1[0] - 3 * sqrt(N * p1[0] * (1 - p1[0])),
          "temperature 2 should flatten: top token %ld of %d (T=1 expects %.0f)", c0, N, N * p1[0]);
    zs_sampler_free(s);
    s = mk(2, 1, 0, 6, 3);
    check_empirical(s, l3, 3, p2, N, "temperature 2");
    zs_sampler_free(s);
    s = mk(0.5f, 1, 0, 6, 3);
    double ph[3];
    log_softmax_ref(l3, 3, 0.5, ph);
    for (int i = 0; i < 3; i++) ph[i] = exp(ph[i]);
    check_empirical(s, l3, 3, ph, N, "temperature 0.5");
    zs_sampler_free(s);

    /* top_k = 2: only the two best, renormalised */
    float lk[5] = {2.0f, 1.0f, 0.5f, 1.8f, -1.0f};
    double pk[5] = {0};
    double z = exp(2.0) + exp(1.8);
    pk[0] = exp(2.0) / z;
    pk[3] = exp(1.8) / z;
    s = mk(1, 1, 2, 77, 5);
    check_empirical(s, lk, 5, pk, N, "top_k 2");
    zs_sampler_free(s);
    /* top_k with temperature: scaling happens before truncation, renormalised over the two */
    z = exp(2.0 / 3) + exp(1.8 / 3);
    pk[0] = exp(2.0 / 3) / z;
    pk[3] = exp(1.8 / 3) / z;
    s = mk(3, 1, 2, 78, 5);
    check_empirical(s, lk, 5, pk, N, "top_k 2 temperature 3");
    zs_sampler_free(s);

    /* top_p = 0.9 on probabilities (ids shuffled) 0.15, 0.5, 0.05, 0.3: the minimal prefix is
     * {0.5, 0.3, 0.15} (0.8 < 0.9 <= 0.95) */
    float lp4[4] = {logf(0.15f), logf(0.5f), logf(0.05f), logf(0.3f)};
    double pp[4] = {0.15 / 0.95, 0.5 / 0.95, 0, 0.3 / 0.95};
    s = mk(1, 0.9f, 0, 31, 4);
    check_empirical(s, lp4, 4, pp, N, "top_p 0.9");
    zs_sampler_free(s);
    s = mk(1, 0.9f, 3, 32, 4); /* same through the top_k (sorted) path */
    check_empirical(s, lp4, 4, pp, N, "top_p 0.9 + top_k 3");
    zs_sampler_free(s);
    /* top_p 0.75: {0.5, 0.3} */
    double pp2[4] = {0, 0.5 / 0.8, 0, 0.3 / 0.8};
    s = mk(1, 0.75f, 0, 33, 4);
    check_empirical(s, lp4, 4, pp2, N, "top_p 0.75");
    zs_sampler_free(s);

    /* min_p 0.2: keep p >= 0.1 => {0.5, 0.3, 0.15} */
    zs_sampler_params prm;
    zs_sampler_params_default(&prm);
    prm.min_p = 0.2f;
    prm.seed = 34;
    CHECK(zs_sampler_new(&prm, 4, &s) == 0, "%s", zs_errmsg());
    check_empirical(s, lp4, 4, pp, N, "min_p 0.2");
    zs_sampler_free(s);
}

/* top_p on a larger vocabulary: the kept set must be exactly the minimal prefix in
 * (probability desc, id asc) order; checked against a full-sort reference. */
static const float *g_ref_l;
static int cmp_desc_ref_q(const void *a, const void *b) {
    int i = *(const int *)a, j = *(const int *)b;
    if (g_ref_l[i] != g_ref_l[j]) return g_ref_l[i] > g_ref_l[j] ? -1 : 1;
    return i - j;
}

static void test_top_p_prefix(void) {
    enum { V = 2000, D = 20000 };
    static float l[V];
    static int order[V], inset[V];
    static long counts[V];
    const float temps[] = {1.0f, 0.7f, 1.3f};
    const int topks[] = {0, 0, 500};
    for (int cfg = 0; cfg < 3; cfg++) {
        float T = temps[cfg], top_p = 0.9f;
        random_logits(l, V, 3);
        l[11] = l[12]; /* some ties */
        l[100] = l[101];
        for (int i = 0; i < V; i++) order[i] = i;
        g_ref_l = l;
        qsort(order, V, sizeof(int), cmp_desc_ref_q);
        int m = topks[cfg] ? topks[cfg] : V;
        double w[V], tot = 0;
        for (int j = 0; j < m; j++) tot += w[j] = exp((l[order[j]] - l[order[0]]) / (double)T);
        double cum = 0;
        int keep = 0;
        while (keep < m && cum < top_p * tot) cum += w[keep++];
        memset(inset, 0, sizeof inset);
        memset(counts, 0, sizeof counts);
        for (int j = 0; j < keep; j++) inset[order[j]] = 1;
        zs_sampler *s = mk(T, top_p, topks[cfg], 1000 + cfg, V);
        int outside = 0;
        for (int i = 0; i < D; i++) {
            int tok;
            CHECK(zs_sampler_sample(s, l, &tok, NULL) == 0, "%s", zs_errmsg());
            outside += !inset[tok];
            counts[tok]++;
        }
        CHECK(outside == 0, "cfg %d: %d draws outside the top_p prefix (size %d)", cfg, outside,
              keep);
        /* the last (least likely) member of the prefix is reachable when likely enough */
        double plast = w[keep - 1] / cum;
        if (plast * D > 30)
            CHECK(counts[order[keep - 1]] > 0, "cfg %d: last prefix member never drawn", cfg);
        /* frequencies of the top few match the renormalised reference */
        for (int j = 0; j < 3; j++) {
            double pj = w[j] / cum, e = D * pj, sg = sqrt(D * pj * (1 - pj));
            CHECK(fabs(counts[order[j]] - e) <= 3 * sg + 1, "cfg %d rank %d: %ld vs %.1f", cfg, j,
                  counts[order[j]], e);
        }
        printf("top_p prefix cfg %d: vocab %d, kept %d\n", cfg, V, keep);
        zs_sampler_free(s);
    }
}

static void test_logprobs(void) {
    enum { V = 1000 };
    static float l[V];
    static double ref[V];
    random_logits(l, V, 5);
    log_softmax_ref(l, V, 1, ref);
    zs_sampler *s = mk(2.0f, 0.8f, 30, 3, V); /* logprob ignores temperature and truncation */
    for (int i = 0; i < 200; i++) {
        int tok;
        float lp;
        CHECK(zs_sampler_sample(s, l, &tok, &lp) == 0, "%s", zs_errmsg());
        CHECK(tu_close(lp, ref[tok], 1e-5, 1e-5), "logprob %g vs %g", lp, ref[tok]);
    }
    zs_sampler_free(s);
    s = mk(1.0f, 1.0f, 0, 3, V); /* temperature-1 path reuses the exp pass */
    for (int i = 0; i < 200; i++) {
        int tok;
        float lp;
        CHECK(zs_sampler_sample(s, l, &tok, &lp) == 0, "%s", zs_errmsg());
        CHECK(tu_close(lp, ref[tok], 1e-5, 1e-5), "logprob %g vs %g", lp, ref[tok]);
    }
    zs_sampler_free(s);

    /* top_logprobs: order, ties by lower id, values */
    float t[8] = {0.5f, 3.0f, -1.0f, 3.0f, 2.0f, 0.5f, 2.5f, -4.0f};
    double tr[8];
    log_softmax_ref(t, 8, 1, tr);
    int ids[20];
    float lps[20];
    CHECK(zs_sampler_top_logprobs(t, 8, 8, ids, lps) == 0, "%s", zs_errmsg());
    int want[8] = {1, 3, 6, 4, 0, 5, 2, 7};
    for (int i = 0; i < 8; i++) {
        CHECK(ids[i] == want[i], "top_logprobs[%d] id %d want %d", i, ids[i], want[i]);
        CHECK(fabs(lps[i] - tr[want[i]]) < 1e-6, "top_logprobs[%d] %g vs %g", i, lps[i],
              tr[want[i]]);
    }
    CHECK(zs_sampler_top_logprobs(t, 8, 3, ids, lps) == 0, "%s", zs_errmsg());
    CHECK(ids[0] == 1 && ids[1] == 3 && ids[2] == 6, "top 3: %d %d %d", ids[0], ids[1], ids[2]);
    CHECK(zs_sampler_top_logprobs(t, 8, 0, NULL, NULL) == 0, "k=0");
    /* against a full-sort reference on a large vocabulary with k = 20 */
    static int order[V];
    for (int i = 0; i < V; i++) order[i] = i;
    l[500] = l[argmax_ref(l, V)]; /* a tie at the top */
    log_softmax_ref(l, V, 1, ref);
    g_ref_l = l;
    qsort(order, V, sizeof(int), cmp_desc_ref_q);
    CHECK(zs_sampler_top_logprobs(l, V, 20, ids, lps) == 0, "%s", zs_errmsg());
    for (int i = 0; i < 20; i++) {
        CHECK(ids[i] == order[i], "top20[%d] id %d want %d", i, ids[i], order[i]);
        CHECK(tu_close(lps[i], ref[order[i]], 1e-5, 1e-5), "top20[%d] value", i);
    }
    int sentinel = -123;
    ids[0] = sentinel;
    CHECK_ERR(zs_sampler_top_logprobs(t, 8, 21, ids, lps), "top_logprobs");
    CHECK_ERR(zs_sampler_top_logprobs(t, 8, -1, ids, lps), "top_logprobs");
    CHECK_ERR(zs_sampler_top_logprobs(t, 4, 5, ids, lps), "top_logprobs");
    t[4] = INFINITY;
    CHECK_ERR(zs_sampler_top_logprobs(t, 8, 3, ids, lps), "logits[4]");
    CHECK(ids[0] == sentinel, "ids written on failure");
}

static void test_bad_logits(void) {
    float l[6] = {1, 2, 3, NAN, 0, 1};
    zs_sampler *s = mk(1, 1, 0, 0, 6);
    int tok = -1;
    float lp = 42;
    CHECK_ERR(zs_sampler_sample(s, l, &tok, &lp), "logits[3]");
    l[3] = -INFINITY;
    CHECK_ERR(zs_sampler_sample(s, l, &tok, &lp), "logits[3]");
    l[3] = INFINITY;
    CHECK_ERR(zs_sampler_sample(s, l, &tok, &lp), "logits[3]");
    CHECK(tok == -1 && lp == 42, "outputs written on failure");
    CHECK_ERR(zs_sampler_sample(s, NULL, &tok, &lp), "logits");
    CHECK_ERR(zs_sampler_sample(s, l, NULL, &lp), "token");
    CHECK_ERR(zs_sampler_sample(NULL, l, &tok, &lp), "sampler");
    zs_sampler_free(s);
    /* extreme but finite logits */
    float e[4] = {-3e38f, 3e38f, 3e38f, -3e38f};
    s = mk(1e-3f, 0.5f, 0, 0, 4);
    CHECK(zs_sampler_sample(s, e, &tok, &lp) == 0, "%s", zs_errmsg());
    CHECK(tok == 1 || tok == 2, "extreme logits token %d", tok);
    CHECK(isfinite(lp), "extreme logits logprob %g", lp);
    zs_sampler_free(s);
}

static void test_speed(void) {
    enum { V = 128256, R = 50 };
    float *l = malloc(sizeof(float) * V);
    CHECK(l != NULL, "malloc");
    if (!l) return;
    random_logits(l, V, 4);
    struct {
        const char *name;
        float t, top_p;
        int top_k;
    } cfgs[] = {
        {"greedy", 0, 1, 0},
        {"temperature 0.8", 0.8f, 1, 0},
        {"temperature 0.8 top_p 0.95", 0.8f, 0.95f, 0},
        {"temperature 1 top_p 0.95", 1.0f, 0.95f, 0},
        {"temperature 0.8 top_k 50", 0.8f, 1, 50},
        {"temperature 0.7 top_k 40 top_p 0.9", 0.7f, 0.9f, 40},
    };
    for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
        zs_sampler *s = mk(cfgs[c].t, cfgs[c].top_p, cfgs[c].top_k, 1, V);
        double t0 = zs_now();
        long sum = 0;
        for (int r = 0; r < R; r++) {
            int tok;
            float lp;
            CHECK(zs_sampler_sample(s, l, &tok, &lp) == 0, "%s", zs_errmsg());
            sum += tok;
        }
        double dt = (zs_now() - t0) / R;
        printf("vocab %d, %-36s: %.3f ms/sample (with logprob)\n", V, cfgs[c].name, dt * 1e3);
        zs_sampler_free(s);
        (void)sum;
    }
    double t0 = zs_now();
    int ids[20];
    float lps[20];
    for (int r = 0; r < R; r++) CHECK(zs_sampler_top_logprobs(l, V, 20, ids, lps) == 0, "tlp");
    printf("vocab %d, top_logprobs 20: %.3f ms\n", V, (zs_now() - t0) / R * 1e3);
    free(l);
}

/* ---------- stop tests ---------- */

/* Pushes chunks and accumulates the emitted text; then flushes. Returns stopped. */
static int run_stop(zs_stop *st, const char *const *chunks, int n, char *acc, size_t *acc_n,
                    int flush) {
    size_t an = 0;
    int stopped = 0;
    for (int i = 0; i < n; i++) {
        char out[1024];
        size_t no = 99;
        int stp = -1;
        int rc = zs_stop_push(st, chunks[i], strlen(chunks[i]), out, sizeof out, &no, &stp);
        CHECK(rc == 0, "push: %s", zs_errmsg());
        if (rc) break;
        memcpy(acc + an, out, no);
        an += no;
        if (stp) stopped = 1;
    }
    if (flush) {
        char out[1024];
        size_t no = 99;
        CHECK(zs_stop_flush(st, out, sizeof out, &no) == 0, "flush: %s", zs_errmsg());
        memcpy(acc + an, out, no);
        an += no;
    }
    acc[an] = 0;
    *acc_n = an;
    return stopped;
}

static zs_stop *mkstop(const char *const *stops, int n) {
    zs_stop *st = NULL;
    CHECK(zs_stop_new(stops, n, &st) == 0 && st, "zs_stop_new: %s", zs_errmsg());
    return st;
}

static void expect_stop(const char *const *stops, int ns, const char *const *chunks, int nc,
                        const char *want, int want_stopped, const char *what) {
    zs_stop *st = mkstop(stops, ns);
    if (!st) return;
    char acc[4096];
    size_t an;
    int stopped = run_stop(st, chunks, nc, acc, &an, 1);
    CHECK(strcmp(acc, want) == 0, "%s: got \"%s\" want \"%s\"", what, acc, want);
    CHECK(stopped == want_stopped, "%s: stopped %d want %d", what, stopped, want_stopped);
    zs_stop_free(st);
}

static void test_stop(void) {
    {
        const char *s[] = {"END"};
        const char *c[] = {"hello END world"};
        expect_stop(s, 1, c, 1, "hello ", 1, "single push");
        const char *c2[] = {"END"};
        expect_stop(s, 1, c2, 1, "", 1, "stop at start");
    }
    { /* spanning pushes */
        const char *s[] = {"Hello"};
        zs_stop *st = mkstop(s, 1);
        char out[64];
        size_t no;
        int stp;
        CHECK(zs_stop_push(st, "Hel", 3, out, sizeof out, &no, &stp) == 0, "%s", zs_errmsg());
        CHECK(no == 0 && stp == 0 && zs_stop_held(st) == 3, "Hel: no %zu stp %d held %zu", no,
              stp, zs_stop_held(st));
        CHECK(zs_stop_push(st, "lo", 2, out, sizeof out, &no, &stp) == 0, "%s", zs_errmsg());
        CHECK(no == 0 && stp == 1, "lo: no %zu stp %d", no, stp);
        /* after a stop: nothing more */
        CHECK(zs_stop_push(st, "more", 4, out, sizeof out, &no, &stp) == 0 && no == 0 && stp == 1,
              "after stop");
        CHECK(zs_stop_flush(st, out, sizeof out, &no) == 0 && no == 0, "flush after stop");
        zs_stop_free(st);
        const char *c[] = {"say Hel", "lo there"};
        expect_stop(s, 1, c, 2, "say ", 1, "spanning with text");
        const char *c2[] = {"H", "e", "l", "l", "o", "!"};
        expect_stop(s, 1, c2, 6, "", 1, "byte by byte");
        const char *c3[] = {"Hel", "p me"};
        expect_stop(s, 1, c3, 2, "Help me", 0, "false start released");
    }
    { /* the held part is released as soon as it cannot match */
        const char *s[] = {"Hello"};
        zs_stop *st = mkstop(s, 1);
        char out[64];
        size_t no;
        int stp;
        CHECK(zs_stop_push(st, "ab He", 5, out, sizeof out, &no, &stp) == 0, "%s", zs_errmsg());
        CHECK(no == 3 && memcmp(out, "ab ", 3) == 0 && zs_stop_held(st) == 2, "partial hold");
        CHECK(zs_stop_push(st, "y", 1, out, sizeof out, &no, &stp) == 0, "%s", zs_errmsg());
        CHECK(no == 3 && memcmp(out, "Hey", 3) == 0 && zs_stop_held(st) == 0, "release");
        zs_stop_free(st);
    }
    { /* prefix overlap */
        const char *s[] = {"aab"};
        const char *c[] = {"aaab"};
        expect_stop(s, 1, c, 1, "a", 1, "aab in aaab, one push");
        const char *c2[] = {"a", "a", "a", "b"};
        expect_stop(s, 1, c2, 4, "a", 1, "aab in aaab, byte pushes");
        const char *c3[] = {"aa", "ab"};
        expect_stop(s, 1, c3, 2, "a", 1, "aab in aa|ab");
        const char *c4[] = {"xaaaa", "a", "c"};
        expect_stop(s, 1, c4, 3, "xaaaaac", 0, "aab never completes");
        const char *s2[] = {"abab"};
        const char *c5[] = {"ab", "aba", "b"};
        expect_stop(s2, 1, c5, 3, "", 1, "abab in ababab");
        const char *c6[] = {"xab", "aba", "b"};
        expect_stop(s2, 1, c6, 3, "x", 1, "abab in xababab");
    }
    { /* several stops: earliest wins */
        const char *s[] = {"world", "lo"};
        const char *c[] = {"hello world"};
        expect_stop(s, 2, c, 1, "hel", 1, "earliest of two");
        const char *s2[] = {"abcde", "bcd"}; /* bcd completes first */
        const char *c2[] = {"xabcdef"};
        expect_stop(s2, 2, c2, 1, "xa", 1, "earliest completion");
        const char *c2b[] = {"xa", "b", "c", "d", "ef"};
        expect_stop(s2, 2, c2b, 5, "xa", 1, "earliest completion, chunked");
        const char *s3[] = {"cd", "bcd"}; /* same end: the longer (earlier start) wins */
        const char *c3[] = {"abcd"};
        expect_stop(s3, 2, c3, 1, "a", 1, "same end");
        const char *s4[] = {"zzz", "yy", "END"};
        const char *c4[] = {"one y", "y END"};
        expect_stop(s4, 3, c4, 2, "one ", 1, "third of three spanning");
    }
    { /* flush releases held text */
        const char *s[] = {"xyz"};
        const char *c[] = {"abcx"};
        zs_stop *st = mkstop(s, 1);
        char acc[64];
        size_t an;
        run_stop(st, c, 1, acc, &an, 0);
        CHECK(strcmp(acc, "abc") == 0 && zs_stop_held(st) == 1, "held x: \"%s\"", acc);
        char out[8];
        size_t no;
        CHECK_ERR(zs_stop_flush(st, out, 0, &no), "stop"); /* ENOSPC, state unchanged */
        CHECK(zs_stop_flush(st, out, sizeof out, &no) == 0 && no == 1 && out[0] == 'x',
              "flush x");
        CHECK(zs_stop_held(st) == 0, "held after flush");
        zs_stop_free(st);
        const char *c2[] = {"ab", "xy"};
        expect_stop(s, 1, c2, 2, "abxy", 0, "flush xy");
    }
    { /* no stop strings: pass-through */
        const char *c[] = {"abc", "", "def"};
        expect_stop(NULL, 0, c, 3, "abcdef", 0, "no stops");
    }
    { /* UTF-8 */
        const char *s[] = {"世界"};
        const char *c[] = {"你好世", "界!"};
        expect_stop(s, 1, c, 2, "你好", 1, "utf8 spanning");
        const char *c2[] = {"你好世", "人"};
        expect_stop(s, 1, c2, 2, "你好世人", 0, "utf8 false start");
        const char *s2[] = {"é!"};
        zs_stop *st = mkstop(s2, 1);
        char out[64];
        size_t no;
        int stp;
        CHECK(zs_stop_push(st, "café", strlen("café"), out, sizeof out, &no, &stp) == 0, "push");
        CHECK(no == 3 && memcmp(out, "caf", 3) == 0, "utf8 hold: %zu", no);
        CHECK(zs_stop_push(st, "!", 1, out, sizeof out, &no, &stp) == 0 && stp == 1 && no == 0,
              "utf8 stop");
        zs_stop_free(st);
        /* a stop string starting with a continuation byte must not split a character */
        const char *s3[] = {"\xa9x"};
        st = mkstop(s3, 1);
        CHECK(zs_stop_push(st, "caf\xc3\xa9", 5, out, sizeof out, &no, &stp) == 0, "push");
        CHECK(no == 3 && memcmp(out, "caf", 3) == 0 && zs_stop_held(st) == 2,
              "no split: no %zu held %zu", no, zs_stop_held(st));
        CHECK(zs_stop_push(st, "y", 1, out, sizeof out, &no, &stp) == 0, "push");
        CHECK(no == 3 && memcmp(out, "\xc3\xa9y", 3) == 0 && stp == 0, "release é");
        zs_stop_free(st);
    }
    { /* chunking never changes the result */
        const char *s[] = {"</s>", "\n\nUser:", "ss", "世界"};
        const char *text = "Some text </ with \n\nUse and 世 but then s</s</ and \n\nUser: tail";
        size_t L = strlen(text);
        char want[512], got[512];
        size_t wn, gn;
        zs_stop *st = mkstop(s, 4);
        const char *one[] = {text};
        int ws = run_stop(st, one, 1, want, &wn, 1);
        zs_stop_free(st);
        CHECK(ws == 1 && strcmp(want, "Some text </ with \n\nUse and 世 but then s</s</ and ") == 0,
              "reference \"%s\"", want);
        for (int trial = 0; trial < 300; trial++) {
            st = mkstop(s, 4);
            size_t pos = 0, an = 0;
            int stopped = 0;
            while (pos < L) {
                size_t k = 1 + (size_t)(lcg_uniform() * 6);
                if (pos + k > L) k = L - pos;
                /* keep chunks on UTF-8 boundaries (input is complete characters) */
                while (pos + k < L && ((unsigned char)text[pos + k] & 0xC0) == 0x80) k++;
                char out[512];
                size_t no;
                int stp;
                CHECK(zs_stop_push(st, text + pos, k, out, sizeof out, &no, &stp) == 0, "push");
                /* released text never ends with a lead byte (would split a character) */
                if (no) CHECK(((unsigned char)out[no - 1] & 0xC0) != 0xC0, "split lead byte");
                memcpy(got + an, out, no);
                an += no;
                stopped |= stp;
                pos += k;
            }
            char out[512];
            size_t no;
            CHECK(zs_stop_flush(st, out, sizeof out, &no) == 0, "flush");
            memcpy(got + an, out, no);
            gn = an + no;
            got[gn] = 0;
            CHECK(stopped == ws && gn == wn && strcmp(got, want) == 0,
                  "trial %d: \"%s\" vs \"%s\"", trial, got, want);
            zs_stop_free(st);
        }
    }
    { /* ENOSPC leaves the state unchanged */
        const char *s[] = {"STOP"};
        zs_stop *st = mkstop(s, 1);
        char out[64];
        size_t no = 77;
        int stp = 5;
        CHECK_ERR(zs_stop_push(st, "abcdefST", 8, out, 3, &no, &stp), "stop", "bytes");
        CHECK(no == 77 && stp == 5, "outputs written on failure");
        CHECK(zs_stop_push(st, "abcdefST", 8, out, sizeof out, &no, &stp) == 0 && no == 6 &&
                  memcmp(out, "abcdef", 6) == 0,
              "retry after ENOSPC");
        CHECK(zs_stop_push(st, "OP", 2, out, sizeof out, &no, &stp) == 0 && no == 0 && stp == 1,
              "stop after retry");
        zs_stop_free(st);
    }
    { /* invalid arguments */
        zs_stop *st = (zs_stop *)&st;
        const char *many[17];
        for (int i = 0; i < 17; i++) many[i] = "x";
        CHECK_ERR(zs_stop_new(many, 17, &st), "stop", "16");
        CHECK(zs_stop_new(many, 16, &st) == 0, "16 stops ok");
        zs_stop_free(st);
        st = (zs_stop *)&st;
        const char *empty[] = {"a", ""};
        CHECK_ERR(zs_stop_new(empty, 2, &st), "stop[1]", "empty");
        const char *nul[] = {NULL};
        CHECK_ERR(zs_stop_new(nul, 1, &st), "stop[0]");
        CHECK_ERR(zs_stop_new(NULL, 2, &st), "stop");
        CHECK_ERR(zs_stop_new(many, -1, &st), "stop");
        char longs[300];
        memset(longs, 'a', 257);
        longs[257] = 0;
        const char *lg[] = {longs};
        CHECK_ERR(zs_stop_new(lg, 1, &st), "stop[0]", "256");
        CHECK(st == (zs_stop *)&st, "out set on failure");
        longs[256] = 0;
        CHECK(zs_stop_new(lg, 1, &st) == 0, "256 bytes ok");
        /* a 256-byte stop split across many pushes */
        char acc[1024];
        size_t an = 0;
        for (int i = 0; i < 256; i += 16) {
            char out[512];
            size_t no;
            int stp;
            CHECK(zs_stop_push(st, longs + i, 16, out, sizeof out, &no, &stp) == 0, "push");
            memcpy(acc + an, out, no);
            an += no;
            if (i + 16 < 256) CHECK(stp == 0, "early stop");
            else CHECK(stp == 1, "long stop completes");
        }
        CHECK(an == 0, "long stop emitted %zu bytes", an);
        size_t no;
        int stp;
        CHECK_ERR(zs_stop_push(NULL, "a", 1, acc, sizeof acc, &no, &stp), "stop");
        CHECK_ERR(zs_stop_push(st, NULL, 1, acc, sizeof acc, &no, &stp), "text");
        CHECK_ERR(zs_stop_push(st, "a", 1, NULL, 4, &no, &stp), "out");
        CHECK_ERR(zs_stop_push(st, "a", 1, acc, sizeof acc, NULL, &stp), "n_out");
        CHECK_ERR(zs_stop_flush(NULL, acc, sizeof acc, &no), "stop");
        zs_stop_free(st);
        zs_stop_free(NULL);
    }
}

int main(void) {
    test_params();
    test_greedy();
    test_tiny_temperature_topk1_topp();
    test_seeds();
    test_distributions();
    test_top_p_prefix();
    test_logprobs();
    test_bad_logits();
    test_speed();
    test_stop();
    return tu_finish("test-sampler");
}
