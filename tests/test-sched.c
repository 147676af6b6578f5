/* test-sched.c — the scheduler on stories260K: greedy requests give the reference tokens, 32
 * concurrent seeded requests each give exactly their solo tokens (continuous batching is
 * batch-invariant) with 1 and 2 ranks, stop strings and EOS end requests, cancellation frees the
 * KV blocks, a full queue answers ZS_EBUSY, and bad parameters are refused at submit. */
#include <pthread.h>

#include "common.h"
#include "sched.h"
#include "testutil.h"

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done, finish, n_tok;
    int32_t toks[600];
    char text[8192];
    size_t len;
    int cancel_after;
    zs_sched *s;
    zs_request *r;
} req_t;

static void on_token(void *ud, int32_t tok, const char *t, size_t n, float lp, const int32_t *ti,
                     const float *tl, int nt) {
    (void)lp; (void)ti; (void)tl; (void)nt;
    req_t *q = ud;
    pthread_mutex_lock(&q->mu);
    if (q->n_tok < 600) q->toks[q->n_tok++] = tok;
    if (q->len + n < sizeof q->text) { memcpy(q->text + q->len, t, n); q->len += n; }
    int cancel = q->cancel_after && q->n_tok == q->cancel_after;
    pthread_mutex_unlock(&q->mu);
    if (cancel) zs_sched_cancel(q->s, q->r);
}

static void on_done(void *ud, int finish, const char *t, size_t n, int np, int ng, int err, const char *msg) {
    (void)np; (void)ng; (void)err; (void)msg;
    req_t *q = ud;
    pthread_mutex_lock(&q->mu);
    if (q->len + n < sizeof q->text) { memcpy(q->text + q->len, t, n); q->len += n; }
    q->text[q->len] = 0;
    q->finish = finish;
    q->done = 1;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

static void req_init(req_t *q, zs_sched *s) {
    memset(q, 0, sizeof *q);
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    q->s = s;
}

static void req_wait(req_t *q) {
    pthread_mutex_lock(&q->mu);
    while (!q->done) pthread_cond_wait(&q->cv, &q->mu);
    pthread_mutex_unlock(&q->mu);
}

static int submit(zs_sched *s, req_t *q, const int32_t *p, int np, int max, float temp, uint64_t seed,
                  const char *stop) {
    zs_req_params rp;
    memset(&rp, 0, sizeof rp);
    rp.prompt = p;
    rp.n_prompt = np;
    rp.max_tokens = max;
    zs_sampler_params_default(&rp.sampling);
    rp.sampling.temperature = temp;
    rp.sampling.seed = seed;
    rp.top_logprobs = 2;
    rp.ignore_eos = 1;
    if (stop) { rp.stop = &stop; rp.n_stop = 1; }
    zs_req_sink sink = {on_token, on_done, q};
    return zs_sched_submit(s, &rp, &sink, &q->r);
}

static void run(int ranks) {
    char dir[4096];
    tu_model_dir(dir, sizeof dir, "stories260K");
    zs_engine_opts eo;
    zs_engine_opts_default(&eo);
    eo.model_dir = dir;
    eo.max_seqs = 32;
    eo.ranks = ranks;
    zs_engine *e;
    int rc = zs_engine_open(&eo, &e);
    CHECK(rc == 0, "engine: %s", zs_errmsg());
    if (rc < 0) return;
    zs_sched_opts so = {32, 64, 4};
    zs_sched *s;
    CHECK(zs_sched_new(e, &so, &s) == 0, "sched: %s", zs_errmsg());
    int32_t p1[] = {1, 403, 407, 261, 378};
    int32_t ref1[] = {432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338, 401, 396, 267, 337};
    static req_t q[40];

    /* greedy = the reference */
    req_init(&q[0], s);
    CHECK(submit(s, &q[0], p1, 5, 16, 0, 0, NULL) == 0, "submit: %s", zs_errmsg());
    req_wait(&q[0]);
    CHECK(q[0].finish == ZS_DONE_LENGTH && q[0].n_tok == 16 && !memcmp(q[0].toks, ref1, sizeof ref1),
          "ranks %d: greedy tokens equal the reference", ranks);
    CHECK(!strncmp(q[0].text, ", there was a little girl named Lily.", 37), "text: %s", q[0].text);

    /* an end-of-turn id (a chat template's) ends the answer as EOS does: greedy's 4th token here */
    {
        req_t qe;
        req_init(&qe, s);
        zs_req_params rp;
        memset(&rp, 0, sizeof rp);
        rp.prompt = p1;
        rp.n_prompt = 5;
        rp.max_tokens = 16;
        zs_sampler_params_default(&rp.sampling);
        rp.sampling.temperature = 0;
        rp.top_logprobs = -1;
        rp.end_ids[0] = 99999; /* not a token: never produced */
        rp.end_ids[1] = ref1[3];
        rp.n_end_ids = 2;
        zs_req_sink sink = {on_token, on_done, &qe};
        CHECK(zs_sched_submit(s, &rp, &sink, &qe.r) == 0, "submit with end ids: %s", zs_errmsg());
        req_wait(&qe);
        CHECK(qe.finish == ZS_DONE_STOP && qe.n_tok == 3 && !memcmp(qe.toks, ref1, 3 * sizeof(int32_t)),
              "ranks %d: stopped at the end-of-turn id after 3 tokens (finish %d, %d tokens)", ranks, qe.finish, qe.n_tok);
        req_init(&qe, s);
        rp.ignore_eos = 1;
        CHECK(zs_sched_submit(s, &rp, &sink, &qe.r) == 0, "submit with end ids, ignore_eos");
        req_wait(&qe);
        CHECK(qe.finish == ZS_DONE_LENGTH && qe.n_tok == 16, "ignore_eos ignores the end-of-turn ids too");
    }

    /* 32 seeded requests: solo, then all at once */
    int32_t prompts[32][8];
    static req_t solo[32];
    for (int i = 0; i < 32; i++) {
        for (int k = 0; k < 8; k++) prompts[i][k] = k == 0 ? 1 : 259 + (i * 7 + k * 13) % 250;
        req_init(&solo[i], s);
        CHECK(submit(s, &solo[i], prompts[i], 3 + i % 6, 24, 0.8f, 1000 + i, NULL) == 0, "submit");
        req_wait(&solo[i]);
    }
    /* the queue holds 4: submit in waves that the engine drains */
    for (int i = 0; i < 32; i++) {
        req_init(&q[i], s);
        while ((rc = submit(s, &q[i], prompts[i], 3 + i % 6, 24, 0.8f, 1000 + i, NULL)) == ZS_EBUSY) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
        CHECK(rc == 0, "submit %d: %s", i, zs_errmsg());
    }
    int same = 0;
    for (int i = 0; i < 32; i++) {
        req_wait(&q[i]);
        same += q[i].n_tok == solo[i].n_tok && !memcmp(q[i].toks, solo[i].toks, sizeof(int32_t) * (size_t)q[i].n_tok);
    }
    CHECK(same == 32, "ranks %d: %d of 32 concurrent requests equal their solo run", ranks, same);

    /* stop string */
    req_init(&q[0], s);
    submit(s, &q[0], p1, 5, 40, 0, 0, "Lily");
    req_wait(&q[0]);
    CHECK(q[0].finish == ZS_DONE_STOP && !strcmp(q[0].text, ", there was a little girl named "), "stop: '%s'", q[0].text);

    /* cancellation frees the blocks */
    req_init(&q[0], s);
    q[0].cancel_after = 3;
    submit(s, &q[0], p1, 5, 400, 0.5f, 1, NULL);
    req_wait(&q[0]);
    CHECK(q[0].finish == ZS_DONE_CANCELLED && q[0].n_tok >= 3 && q[0].n_tok < 400, "cancelled after %d tokens", q[0].n_tok);
    zs_sched_stats st;
    double t0 = zs_now();
    do zs_sched_stats_get(s, &st);
    while (st.kv_used != 0 && zs_now() - t0 < 1.0);
    CHECK(st.kv_used == 0 && st.running == 0, "KV blocks freed (%d used, %d running)", st.kv_used, st.running);
    CHECK(st.steps > 0 && st.generated_tokens > 0 && st.ttft_count > 0, "counters move");

    /* bad parameters */
    req_init(&q[1], s);
    CHECK_ERR(submit(s, &q[1], p1, 5, 600, 0, 0, NULL), "max_tokens", "context");
    int32_t bad[] = {1, 9999};
    CHECK_ERR(submit(s, &q[1], bad, 2, 4, 0, 0, NULL), "token id 9999");
    CHECK_ERR(submit(s, &q[1], p1, 5, 4, -1, 0, NULL), "temperature");
    CHECK_ERR(submit(s, &q[1], p1, 0, 4, 0, 0, NULL), "empty");

    zs_sched_free(s);
    zs_engine_free(e);
}

int main(void) {
    run(1);
    run(2);
    return tu_finish("test-sched");
}
