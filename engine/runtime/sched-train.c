/* sched-train.c — background work on the engine thread (zs_sched_run_work): a fine-tuning job's
 * training in slices, with a share of the engine's time (DESIGN.md §10, issue 31).
 *   - A caller queues its work (on its own stack) and waits; works run one at a time, in order.
 *   - While no request is queued or running, the work has the engine to itself, still in slices,
 *     so a request that arrives waits for one slice at most.
 *   - While serving has work, the work runs when its share of the recent busy time (both sums
 *     decay with a 10 s time constant) is below its share; a share of 0 leaves it only the idle
 *     time (the policy before issue 31).
 *   - When it is the work's turn just before a serving step, its next piece may ride that step
 *     (ride: a LoRA micro-batch's forward on the step's buckets), or the pass its next slice
 *     begins with is declared to the gathers during the step and the slice runs right after it.
 * The loop's side is a few calls (sched-impl.h) made by engine_main; the caller's side is
 * zs_sched_run_work / zs_sched_run_idle. */
#include <math.h>
#include <time.h>

#include "common.h"
#include "sched-impl.h"

#define TRAIN_TAU_S 10.0

/* A zs_sched_run_work call waiting for (or in) its turn; lives on the caller's stack. */
struct zs_train_job {
    zs_sched_work w;              /* the work (a copy) */
    int state;                    /* JOB_* */
    int rc;                       /* its result, once JOB_DONE */
    int in_slice;                 /* mu: a slice (or a ride) of it is running */
    struct zs_train_job *next;    /* the queue (zs_sched.tq) */
};
enum { JOB_PENDING = 0, JOB_RUNNING = 1, JOB_DONE = 2 };

void zs_sched_train_init(zs_sched *s, const zs_sched_opts *o) {
    s->tr_share = o && o->train_share > 0 ? ZS_MIN(o->train_share, 1.0) : 0.0;
    s->tr_slice_s = (o && o->train_slice_ms > 0 ? o->train_slice_ms : 10.0) / 1000.0;
    s->st.train_share_target = s->tr_share;
}

/* The queue's head, which runs (under mu). */
static zs_train_job *head_job(zs_sched *s) { return s->draining || s->stop ? NULL : s->tq; }

int zs_sched_train_pending(zs_sched *s) { return head_job(s) != NULL; }

static double job_share(const zs_sched *s, const zs_train_job *j) { return j->w.share > 0 ? ZS_MIN(j->w.share, 1.0) : s->tr_share; }

/* Ends the head job with rc (under mu). */
static void end_job(zs_sched *s, zs_train_job *j, int rc) {
    s->tq = j->next;
    if (!s->tq) s->tq_tail = NULL;
    j->rc = rc;
    j->state = JOB_DONE;
    j->in_slice = 0;
    if (rc == 0) s->st.train_tokens += j->w.tokens;
    pthread_cond_broadcast(&s->cv_job);
}

/* Takes the head job for a slice (under mu). */
static zs_train_job *take_job(zs_sched *s) {
    zs_train_job *j = head_job(s);
    if (!j) return NULL;
    j->state = JOB_RUNNING;
    j->in_slice = 1;
    return j;
}

/* dt seconds of work (train or serve) while serving had work: both sums decay, then it counts. */
static void account(zs_sched *s, double train_dt, double serve_dt) {
    double d = exp(-(train_dt + serve_dt) / TRAIN_TAU_S);
    s->tr_acc = s->tr_acc * d + train_dt;
    s->sv_acc = s->sv_acc * d + serve_dt;
}

static int due(const zs_sched *s, double share) {
    if (share <= 0) return 0;
    double tot = s->tr_acc + s->sv_acc;
    return tot <= 0 || s->tr_acc < share * tot;
}

int zs_sched_train_turn(zs_sched *s, int serving) {
    pthread_mutex_lock(&s->mu);
    zs_train_job *j = head_job(s);
    int turn = j && (!serving || due(s, job_share(s, j)));
    pthread_mutex_unlock(&s->mu);
    return turn;
}

/* The earliest arrival of a request still in the inbox (0: none). Under mu. */
static double inbox_arrival(const zs_sched *s) {
    double t = 0;
    for (const zs_request *r = s->inbox; r; r = r->next)
        if (t == 0 || r->t_submit < t) t = r->t_submit;
    return t;
}

static void publish(zs_sched *s, double dt, double wait) {
    s->st.train_slices++;
    s->st.train_s += dt;
    s->st.train_wait_s += wait;
    double tot = s->tr_acc + s->sv_acc;
    s->st.train_share = tot > 0 ? s->tr_acc / tot : 0;
}

void zs_sched_train_slice(zs_sched *s, int serving) {
    pthread_mutex_lock(&s->mu);
    zs_train_job *j = take_job(s);
    int then_more = !serving && !s->inbox;
    if (j) s->st.train_share_target = job_share(s, j);
    pthread_mutex_unlock(&s->mu);
    if (!j) return;
    uint64_t b0 = j->w.pass_bytes ? j->w.pass_bytes(j->w.ud) : 0;
    double t0 = zs_now();
    int rc = j->w.slice(j->w.ud, s->tr_slice_s, then_more);
    double t1 = zs_now(), dt = t1 - t0;
    uint64_t b1 = j->w.pass_bytes ? j->w.pass_bytes(j->w.ud) : 0;
    pthread_mutex_lock(&s->mu);
    s->st.train_pass_bytes += b1 - b0;
    double arr = inbox_arrival(s), wait = serving ? dt : arr > 0 ? t1 - ZS_MAX(arr, t0) : 0;
    if (serving) account(s, dt, 0);
    publish(s, dt, wait);
    if (rc <= 0) end_job(s, j, rc);
    else j->in_slice = 0;
    pthread_mutex_unlock(&s->mu);
}

const zs_world_rider *zs_sched_train_plan(zs_sched *s, zs_pass_range *next, int *declared, int *after, int hold) {
    *declared = *after = 0;
    pthread_mutex_lock(&s->mu);
    zs_train_job *j = head_job(s);
    int turn = j && !hold && due(s, job_share(s, j));
    if (turn) j = take_job(s);
    pthread_mutex_unlock(&s->mu);
    if (!turn || !j) return NULL;
    const zs_world_rider *rd = s->tr_fuse && j->w.ride ? j->w.ride(j->w.ud, s->tr_slice_s) : NULL;
    if (rd) {
        s->tr_riding = j;
        return rd;
    }
    *after = 1; /* its own slice, right after the step */
    if (j->w.next_pass && j->w.next_pass(j->w.ud, s->tr_slice_s, next) > 0) *declared = 1;
    pthread_mutex_lock(&s->mu);
    j->in_slice = 0;
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* While background work is queued the gathers stop guessing: a guessed inference pass that a
 * training slice follows instead (the engine went idle between requests) would be consumed whole,
 * a pass of weights streamed for nothing. Serving steps then declare the next pass themselves:
 * the work's, when it comes next, or another inference pass when one surely follows. */
static void spec_job(void *ud, int rank) {
    zs_sched *s = ud;
    zs_gather_set_speculation(zs_world_gather(s->w, rank), !s->tr_nospec);
}

void zs_sched_train_speculation(zs_sched *s) {
    if (zs_world_led(s->w)) return; /* no background work there (followers could not repeat it) */
    pthread_mutex_lock(&s->mu);
    int want = s->tq != NULL;
    pthread_mutex_unlock(&s->mu);
    if (want == s->tr_nospec) return;
    s->tr_nospec = want;
    zs_world_run(s->w, spec_job, s);
}

int zs_sched_train_declares(const zs_sched *s) { return s->tr_nospec; }

double zs_sched_train_after_step(zs_sched *s, double dt, int rc) {
    zs_train_job *j = s->tr_riding;
    double ride_s = 0;
    if (j) {
        s->tr_riding = NULL;
        ride_s = j->w.ride_end ? j->w.ride_end(j->w.ud, rc) : 0;
        ride_s = ZS_MIN(ride_s, dt);
    }
    pthread_mutex_lock(&s->mu);
    account(s, ride_s, dt - ride_s);
    if (j) {
        s->st.train_fused++;
        publish(s, ride_s, ride_s); /* the step's requests waited for the ride */
        j->in_slice = 0;
    } else {
        double tot = s->tr_acc + s->sv_acc;
        s->st.train_share = tot > 0 ? s->tr_acc / tot : 0;
    }
    pthread_mutex_unlock(&s->mu);
    return ride_s;
}

void zs_sched_train_wait_callers(zs_sched *s) {
    while (s->n_train_callers > 0) {
        pthread_cond_broadcast(&s->cv_job);
        pthread_cond_wait(&s->cv_job, &s->mu);
    }
}

/* An absolute CLOCK_REALTIME deadline ms milliseconds from now. */
static struct timespec deadline_ms(int ms) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += (long)ms * 1000000L;
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    return ts;
}

/* Takes j out of the queue (it is not the one in a slice). Under mu. */
static void unlink_job(zs_sched *s, zs_train_job *j) {
    zs_train_job *prev = NULL;
    for (zs_train_job *x = s->tq; x; prev = x, x = x->next)
        if (x == j) {
            if (prev) prev->next = j->next;
            else s->tq = j->next;
            if (s->tq_tail == j) s->tq_tail = prev;
            return;
        }
}

int zs_sched_run_work(zs_sched *s, const zs_sched_work *w, int (*cancelled)(void *ud), void *cancel_ud) {
    if (!w || !w->slice) return zs_err(ZS_EINVAL, "zs_sched_run_work: no slice function");
    if (s->started && pthread_equal(pthread_self(), s->th))
        return zs_err(ZS_EINVAL, "zs_sched_run_work: called from the engine thread (it would wait for itself)");
    zs_train_job j = {*w, JOB_PENDING, 0, 0, NULL};
    pthread_mutex_lock(&s->mu);
    if (s->stop || s->draining || !s->started) {
        pthread_mutex_unlock(&s->mu);
        return zs_err(ZS_ECANCELLED, "the scheduler is stopping");
    }
    if (s->tq_tail) s->tq_tail->next = &j;
    else s->tq = &j;
    s->tq_tail = &j;
    s->n_train_callers++;
    pthread_cond_signal(&s->cv);
    int rc = 0;
    for (;;) {
        if (j.state == JOB_DONE) {
            rc = j.rc;
            break;
        }
        if (!j.in_slice) {
            int gone = s->stop || s->draining;
            if (!gone && cancelled) { /* the caller's predicate runs without mu */
                pthread_mutex_unlock(&s->mu);
                gone = cancelled(cancel_ud) != 0;
                pthread_mutex_lock(&s->mu);
            }
            if (gone && j.state != JOB_DONE && !j.in_slice) {
                unlink_job(s, &j);
                rc = zs_err(ZS_ECANCELLED, s->stop || s->draining ? "the scheduler is stopping" : "cancelled");
                break;
            }
        }
        /* polled every 5 ms (cancelled, stop, drain); woken at once when the work ends */
        struct timespec ts = deadline_ms(5);
        pthread_cond_timedwait(&s->cv_job, &s->mu, &ts);
    }
    s->n_train_callers--;
    pthread_cond_broadcast(&s->cv_job);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* zs_sched_run_idle: fn as a work of one slice; its value comes back as it was. */
typedef struct {
    int (*fn)(void *ud);
    void *ud;
    int rc;
} once_t;

static int once_slice(void *ud, double budget_s, int then_more) {
    once_t *o = ud;
    (void)budget_s;
    (void)then_more;
    o->rc = o->fn(o->ud);
    return o->rc < 0 ? o->rc : 0;
}

int zs_sched_run_idle(zs_sched *s, int (*fn)(void *ud), void *ud, int (*cancelled)(void *ud)) {
    if (!fn) return zs_err(ZS_EINVAL, "zs_sched_run_idle: no function");
    once_t o = {fn, ud, 0};
    zs_sched_work w = {once_slice, NULL, NULL, NULL, NULL, 0, 0, &o};
    int rc = zs_sched_run_work(s, &w, cancelled, ud);
    return rc < 0 ? rc : o.rc;
}
