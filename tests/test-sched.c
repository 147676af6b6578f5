/* test-sched.c — the scheduler on stories260K: greedy requests give the reference tokens, 32
 * concurrent seeded requests each give exactly their solo tokens (continuous batching is
 * batch-invariant) with 1 and 2 ranks, stop strings and EOS end requests, cancellation frees the
 * KV blocks, a full queue answers ZS_EBUSY, bad parameters are refused at submit, and
 * zs_sched_run_idle runs its job on the engine thread only when no request is queued or running
 * (requests submitted meanwhile wait for it), returns the job's value, and returns ZS_ECANCELLED
 * without running it when cancelled() says so or the scheduler drains. */
#include <pthread.h>

#include "common.h"
#include "hold.h"
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
    zs_req_sink sink = {on_token, on_done, q, NULL};
    return zs_sched_submit(s, &rp, &sink, &q->r);
}

/* --- zs_sched_run_idle --- */

typedef struct {
    zs_sched *s;
    pthread_t caller;
    int ran, other_thread, queued, running, req_done;
    req_t *watch; /* a request that must have finished before the job runs */
} idle_t;

static int idle_fn(void *ud) {
    idle_t *d = ud;
    d->ran++;
    d->other_thread = !pthread_equal(pthread_self(), d->caller);
    zs_sched_stats st;
    zs_sched_stats_get(d->s, &st); /* takes the scheduler's lock: the job runs without it */
    d->queued = st.queued;
    d->running = st.running;
    if (d->watch) {
        pthread_mutex_lock(&d->watch->mu);
        d->req_done = d->watch->done;
        pthread_mutex_unlock(&d->watch->mu);
    }
    return 42;
}

static int never_fn(void *ud) {
    (*(int *)ud)++;
    return 1;
}

typedef struct {
    int ran, polls, after;
} cancel_t;

static int cancel_fn(void *ud) {
    ((cancel_t *)ud)->ran++;
    return 1;
}

static int cancel_after(void *ud) {
    cancel_t *c = ud;
    return ++c->polls >= c->after;
}

typedef struct {
    zs_sched *s;
    int rc, ran;
} never_t;

static void *never_thread(void *arg) {
    never_t *w = arg;
    w->rc = zs_sched_run_idle(w->s, never_fn, &w->ran, NULL);
    return NULL;
}

/* ends with the scheduler drained */
static void test_idle(zs_sched *s, const int32_t *p1, const int32_t *ref1) {
    idle_t d = {s, pthread_self(), 0, 0, -1, -1, 0, NULL};
    CHECK(zs_sched_run_idle(s, idle_fn, &d, NULL) == 42 && d.ran == 1, "run_idle ran the job once and returned its value");
    CHECK(d.other_thread && d.queued == 0 && d.running == 0, "on the engine thread, with nothing queued or running (%d, %d)",
          d.queued, d.running);
    /* a running request finishes before the job runs */
    static req_t q;
    req_init(&q, s);
    CHECK(submit(s, &q, p1, 5, 40, 0, 0, NULL) == 0, "submit");
    for (;;) {
        pthread_mutex_lock(&q.mu);
        int k = q.n_tok, done = q.done;
        pthread_mutex_unlock(&q.mu);
        if (k > 0 || done) break;
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    memset(&d, 0, sizeof d);
    d.s = s;
    d.caller = pthread_self();
    d.watch = &q;
    CHECK(zs_sched_run_idle(s, idle_fn, &d, NULL) == 42 && d.ran == 1 && d.req_done == 1,
          "the job ran after the running request had finished (done %d)", d.req_done);
    req_wait(&q);
    /* requests submitted while a job runs wait for it */
    tu_hold h;
    tu_hold_start(&h, s);
    req_init(&q, s);
    CHECK(submit(s, &q, p1, 5, 16, 0, 0, NULL) == 0, "submit while a job runs");
    struct timespec ts = {0, 20000000};
    nanosleep(&ts, NULL);
    pthread_mutex_lock(&q.mu);
    int early = q.n_tok;
    pthread_mutex_unlock(&q.mu);
    CHECK(early == 0, "no token while the job runs (%d)", early);
    /* cancelled() while waiting behind the running job: ZS_ECANCELLED, the job never runs */
    cancel_t c = {0, 0, 10};
    double t0 = zs_now();
    int rc = zs_sched_run_idle(s, cancel_fn, &c, cancel_after);
    double dt = zs_now() - t0;
    CHECK(rc == ZS_ECANCELLED && c.ran == 0 && c.polls == 10, "cancelled: ZS_ECANCELLED without running (rc %d, ran %d, %d polls)",
          rc, c.ran, c.polls);
    CHECK(dt >= 0.03 && dt < 5, "polled every few milliseconds (10 polls in %.3f s)", dt);
    tu_hold_end(&h);
    CHECK(h.rc == TU_HOLD_VALUE, "the holding job's value");
    req_wait(&q);
    CHECK(q.n_tok == 16 && !memcmp(q.toks, ref1, 16 * sizeof(int32_t)), "the request waited, then gave the reference tokens");
    /* drain: a waiting job is cancelled, later calls too */
    tu_hold_start(&h, s);
    never_t w = {s, 0, 0};
    pthread_t tw;
    pthread_create(&tw, NULL, never_thread, &w);
    nanosleep(&ts, NULL);
    zs_sched_drain(s, 1.0);
    pthread_join(tw, NULL);
    CHECK(w.rc == ZS_ECANCELLED && w.ran == 0, "drain: the waiting job is cancelled without running (rc %d)", w.rc);
    tu_hold_end(&h);
    CHECK(h.rc == TU_HOLD_VALUE, "the job that was running when the drain began finished");
    int ran = 0;
    CHECK(zs_sched_run_idle(s, never_fn, &ran, NULL) == ZS_ECANCELLED && ran == 0, "after a drain: ZS_ECANCELLED");
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
    zs_sched_opts so = {32, 64, 4, 0, 0, 0, 0, 0, 0, 0, 0};
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
        zs_req_sink sink = {on_token, on_done, &qe, NULL};
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

    test_idle(s, p1, ref1);
    zs_sched_free(s);
    zs_engine_free(e);
}

int main(void) {
    run(1);
    run(2);
    return tu_finish("test-sched");
}
