/* test-embeddings.c — embedding requests of the scheduler (sched.h: zs_req_params.embed) on
 * stories260K against transformers (tests/ref/embed-ref.json, made by tests/ref/make_embed_ref.py:
 * LlamaModel's last_hidden_state, after the final norm, mean- and last-pooled, and L2-normalised):
 * the normalised vectors within 1e-5 absolute (measured 5.6e-7), the pooled ones within 1e-5 of
 * their largest entry (measured 9.3e-7); the vectors bitwise the same alone, all
 * together, chunked by a small token budget, beside generation requests, and over 2 ranks; the
 * generation requests beside them still give their solo (reference) tokens; the prompt tokens
 * counted in the stats; bad inputs refused at submit. */
#include <math.h>
#include <pthread.h>

#include "common.h"
#include "sched.h"
#include "testutil.h"

#define MAXD 512

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done, finish, n_tok, got_vec, dim;
    int32_t toks[64];
    float vec[MAXD];
} rq;

static void on_token(void *ud, int32_t tok, const char *t, size_t n, float lp, const int32_t *ti, const float *tl, int nt) {
    (void)t; (void)n; (void)lp; (void)ti; (void)tl; (void)nt;
    rq *q = ud;
    pthread_mutex_lock(&q->mu);
    if (q->n_tok < 64) q->toks[q->n_tok++] = tok;
    pthread_mutex_unlock(&q->mu);
}

static void on_vec(void *ud, const float *v, int dim) {
    rq *q = ud;
    pthread_mutex_lock(&q->mu);
    q->dim = dim;
    if (dim <= MAXD) memcpy(q->vec, v, (size_t)dim * sizeof(float));
    q->got_vec++;
    pthread_mutex_unlock(&q->mu);
}

static void on_done(void *ud, int finish, const char *t, size_t n, int np, int ng, int err, const char *msg) {
    (void)t; (void)n; (void)np; (void)ng; (void)err; (void)msg;
    rq *q = ud;
    pthread_mutex_lock(&q->mu);
    q->finish = finish;
    q->done = 1;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

static void rq_init(rq *q) {
    memset(q, 0, sizeof *q);
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
}

static void rq_wait(rq *q) {
    pthread_mutex_lock(&q->mu);
    while (!q->done) pthread_cond_wait(&q->cv, &q->mu);
    pthread_mutex_unlock(&q->mu);
}

static int submit_embed(zs_sched *s, rq *q, const int32_t *ids, int n, int pooling) {
    zs_req_params rp;
    memset(&rp, 0, sizeof rp);
    rp.prompt = ids;
    rp.n_prompt = n;
    rp.embed = 1;
    rp.pooling = pooling;
    zs_req_sink sink = {on_token, on_done, q, on_vec};
    return zs_sched_submit(s, &rp, &sink, NULL);
}

static int submit_gen(zs_sched *s, rq *q, const int32_t *ids, int n, int max) {
    zs_req_params rp;
    memset(&rp, 0, sizeof rp);
    rp.prompt = ids;
    rp.n_prompt = n;
    rp.max_tokens = max;
    zs_sampler_params_default(&rp.sampling);
    rp.sampling.temperature = 0;
    rp.top_logprobs = -1;
    rp.ignore_eos = 1;
    zs_req_sink sink = {on_token, on_done, q, NULL};
    return zs_sched_submit(s, &rp, &sink, NULL);
}

#define NCASE 3
static int32_t ids[NCASE][64];
static int nids[NCASE];
static double ref[NCASE][2][2][MAXD]; /* [case][mean,last][raw,normalised] */
static float solo[NCASE][2][MAXD];    /* the vectors of the first, one-at-a-time run */
static int dim;

static int load_ref(void) {
    char p[256];
    snprintf(p, sizeof p, "tests/ref/embed-ref.json");
    json_error_t je;
    json_t *j = json_load_file(p, 0, &je);
    if (!j) {
        fprintf(stderr, "cannot load %s: %s\n", p, je.text);
        return -1;
    }
    dim = (int)json_integer_value(json_object_get(j, "dim"));
    json_t *cases = json_object_get(j, "cases");
    const char *keys[2][2] = {{"mean", "mean_normalized"}, {"last", "last_normalized"}};
    for (int c = 0; c < NCASE; c++) {
        json_t *cs = json_array_get(cases, (size_t)c), *id = json_object_get(cs, "ids");
        nids[c] = (int)json_array_size(id);
        for (int i = 0; i < nids[c] && i < 64; i++) ids[c][i] = (int32_t)json_integer_value(json_array_get(id, (size_t)i));
        for (int pl = 0; pl < 2; pl++)
            for (int nz = 0; nz < 2; nz++) {
                json_t *v = json_object_get(cs, keys[pl][nz]);
                for (int t = 0; t < dim && t < MAXD; t++) ref[c][pl][nz][t] = json_real_value(json_array_get(v, (size_t)t));
            }
    }
    json_decref(j);
    return dim > 0 && dim <= MAXD ? 0 : -1;
}

/* Max |got - ref| of the raw pooled vector (over its largest |entry|, at least 1: the hidden rows
 * reach |x| ~ 4) and of its L2-normalised form (normalised as the server does, absolute). */
static void errs(const float *v, int c, int pl, double *raw, double *nrm) {
    double ss = 0, big = 1;
    *raw = *nrm = 0;
    for (int t = 0; t < dim; t++) ss += (double)v[t] * v[t];
    for (int t = 0; t < dim; t++) big = fmax(big, fabs(ref[c][pl][0][t]));
    double n = sqrt(ss);
    for (int t = 0; t < dim; t++) {
        *raw = fmax(*raw, fabs(v[t] - ref[c][pl][0][t]) / big); /* relative to the vector's largest entry (>= 1) */
        *nrm = fmax(*nrm, fabs((float)(v[t] / n) - ref[c][pl][1][t]));
    }
}

static zs_engine *open_engine(int ranks) {
    char dir[4096];
    tu_model_dir(dir, sizeof dir, "stories260K");
    zs_engine_opts eo;
    zs_engine_opts_default(&eo);
    eo.model_dir = dir;
    eo.max_seqs = 16;
    eo.ranks = ranks;
    zs_engine *e = NULL;
    int rc = zs_engine_open(&eo, &e);
    CHECK(rc == 0, "engine (%d ranks): %s", ranks, rc ? zs_errmsg() : "");
    return rc ? NULL : e;
}

/* Everything at once (both poolings of every case) beside two generation requests, with a token
 * budget of max_batch: the vectors must be solo's bits, the generations the reference tokens. */
static void together(zs_sched *s, const char *what) {
    static rq q[NCASE][2], g[2];
    int32_t p1[] = {1, 403, 407, 261, 378};
    int32_t ref1[] = {432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338, 401, 396, 267, 337};
    for (int k = 0; k < 2; k++) {
        rq_init(&g[k]);
        CHECK(submit_gen(s, &g[k], p1, 5, 16) == 0, "%s: generation submit: %s", what, zs_errmsg());
    }
    for (int c = 0; c < NCASE; c++)
        for (int pl = 0; pl < 2; pl++) {
            rq_init(&q[c][pl]);
            CHECK(submit_embed(s, &q[c][pl], ids[c], nids[c], pl) == 0, "%s: embed submit: %s", what, zs_errmsg());
        }
    int same = 1;
    for (int c = 0; c < NCASE; c++)
        for (int pl = 0; pl < 2; pl++) {
            rq_wait(&q[c][pl]);
            same &= q[c][pl].finish == ZS_DONE_STOP && q[c][pl].got_vec == 1 &&
                    !memcmp(q[c][pl].vec, solo[c][pl], (size_t)dim * sizeof(float));
        }
    CHECK(same, "%s: every vector bitwise the same as alone", what);
    for (int k = 0; k < 2; k++) {
        rq_wait(&g[k]);
        CHECK(g[k].n_tok == 16 && !memcmp(g[k].toks, ref1, sizeof ref1), "%s: generation %d gives its solo tokens", what, k);
    }
}

int main(void) {
    if (load_ref() < 0) {
        CHECK(0, "reference tests/ref/embed-ref.json");
        return tu_finish("test-embeddings");
    }
    zs_engine *e = open_engine(1);
    if (!e) return tu_finish("test-embeddings");
    zs_sched_opts so = {16, 64, 64, 0, 0, 0, 0, 0, 0, 0, 0};
    zs_sched *s = NULL;
    CHECK(zs_sched_new(e, &so, &s) == 0, "sched: %s", zs_errmsg());

    /* alone, one at a time: against transformers */
    double worst_raw = 0, worst_nrm = 0;
    zs_sched_stats st0, st1;
    zs_sched_stats_get(s, &st0);
    int ntok = 0;
    for (int c = 0; c < NCASE; c++)
        for (int pl = 0; pl < 2; pl++) {
            rq q;
            rq_init(&q);
            CHECK(submit_embed(s, &q, ids[c], nids[c], pl) == 0, "submit: %s", zs_errmsg());
            rq_wait(&q);
            ntok += nids[c];
            CHECK(q.finish == ZS_DONE_STOP && q.got_vec == 1 && q.dim == dim && q.n_tok == 0,
                  "case %d %s: one vector of %d, nothing sampled (finish %d, %d vectors, dim %d)", c, pl ? "last" : "mean",
                  dim, q.finish, q.got_vec, q.dim);
            memcpy(solo[c][pl], q.vec, (size_t)dim * sizeof(float));
            double er, en;
            errs(q.vec, c, pl, &er, &en);
            worst_raw = fmax(worst_raw, er);
            worst_nrm = fmax(worst_nrm, en);
            CHECK(er < 1e-5 && en < 1e-5, "case %d %s pooling vs transformers: max relative error %.3g, normalised max abs error %.3g (< 1e-5)", c,
                  pl ? "last" : "mean", er, en);
        }
    fprintf(stderr, "# max error vs transformers: pooled (relative) %.3g, normalised (absolute) %.3g\n", worst_raw, worst_nrm);
    zs_sched_stats_get(s, &st1);
    CHECK(st1.prompt_tokens - st0.prompt_tokens == (uint64_t)ntok && st1.generated_tokens == st0.generated_tokens,
          "the inputs count as prompt tokens (%llu of %d), none generated",
          (unsigned long long)(st1.prompt_tokens - st0.prompt_tokens), ntok);

    /* bad inputs */
    rq bad;
    rq_init(&bad);
    int32_t big[600], oob[2] = {1, 1 << 20};
    for (int i = 0; i < 600; i++) big[i] = 5;
    CHECK(submit_embed(s, &bad, ids[0], 0, 0) == ZS_EINVAL, "an empty input is refused");
    CHECK(submit_embed(s, &bad, big, 600, 0) == ZS_ERANGE && strstr(zs_errmsg(), "context"), "an input over the context: %s",
          zs_errmsg());
    CHECK(submit_embed(s, &bad, oob, 2, 0) == ZS_ERANGE && strstr(zs_errmsg(), "out of range"), "an id out of range: %s",
          zs_errmsg());
    CHECK(submit_embed(s, &bad, ids[0], 3, 7) == ZS_EINVAL, "an unknown pooling is refused");

    together(s, "1 rank, 64-token steps");
    zs_sched_free(s);
    zs_sched_opts small = {16, 5, 64, 0, 0, 0, 0, 0, 0, 0, 0}; /* 5-token steps: every input chunked, differently */
    CHECK(zs_sched_new(e, &small, &s) == 0, "sched: %s", zs_errmsg());
    together(s, "1 rank, 5-token steps");
    zs_sched_free(s);
    zs_engine_free(e);

    e = open_engine(2);
    if (e) {
        CHECK(zs_sched_new(e, &so, &s) == 0, "sched: %s", zs_errmsg());
        together(s, "2 ranks");
        zs_sched_free(s);
        zs_engine_free(e);
    }
    return tu_finish("test-embeddings");
}
