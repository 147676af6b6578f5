/* sched-idle.c — background work on the engine thread (zs_sched_run_idle): a LoRA fine-tuning
 * job's training steps over the served base run as jobs between serving steps. A caller queues
 * its job (on its own stack) and waits; the engine thread runs the jobs one at a time, in the
 * order they came, without mu (fn may drive the engine's world, zs_world_run), at a moment when
 * no request is queued or running; requests submitted while a job runs wait for it (one training
 * step). A job that has not started leaves the queue when the scheduler stops or drains, or when
 * the caller's cancelled(ud) says so (polled every 5 ms while it waits).
 * The loop's side is one call, zs_sched_idle_run_next, made while the engine thread would
 * otherwise sleep; the policy of when a job may run (now: only when idle and not draining) lives
 * here, so that jobs can become training slices with a share of the stream without changing the
 * loop beyond where it makes that call. */
#include <time.h>

#include "common.h"
#include "sched-impl.h"

/* A zs_sched_run_idle call waiting for (or in) its turn; lives on the caller's stack. */
struct zs_idle_job {
    int (*fn)(void *ud);          /* the work */
    void *ud;                     /* its argument */
    int state;                    /* IDLE_* */
    int rc;                       /* fn's result, once IDLE_DONE */
    struct zs_idle_job *next;     /* the queue (zs_sched.idle) */
};
enum { IDLE_PENDING = 0, IDLE_RUNNING = 1, IDLE_DONE = 2 };

int zs_sched_idle_run_next(zs_sched *s) {
    if (!s->idle || s->draining) return 0;
    zs_idle_job *j = s->idle;
    s->idle = j->next;
    if (!s->idle) s->idle_tail = NULL;
    j->state = IDLE_RUNNING;
    pthread_mutex_unlock(&s->mu);
    int jrc = j->fn(j->ud);
    pthread_mutex_lock(&s->mu);
    j->rc = jrc;
    j->state = IDLE_DONE;
    pthread_cond_broadcast(&s->cv_job);
    return 1;
}

void zs_sched_idle_wait_callers(zs_sched *s) {
    while (s->n_idle_callers > 0) {
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

/* Takes j out of the queue of idle jobs (it has not started). Under mu. */
static void unlink_job(zs_sched *s, zs_idle_job *j) {
    zs_idle_job *prev = NULL;
    for (zs_idle_job *x = s->idle; x; prev = x, x = x->next)
        if (x == j) {
            if (prev) prev->next = j->next;
            else s->idle = j->next;
            if (s->idle_tail == j) s->idle_tail = prev;
            return;
        }
}

int zs_sched_run_idle(zs_sched *s, int (*fn)(void *ud), void *ud, int (*cancelled)(void *ud)) {
    if (!fn) return zs_err(ZS_EINVAL, "zs_sched_run_idle: no function");
    if (s->started && pthread_equal(pthread_self(), s->th))
        return zs_err(ZS_EINVAL, "zs_sched_run_idle: called from the engine thread (it would wait for itself)");
    zs_idle_job j = {fn, ud, IDLE_PENDING, 0, NULL};
    pthread_mutex_lock(&s->mu);
    if (s->stop || s->draining || !s->started) {
        pthread_mutex_unlock(&s->mu);
        return zs_err(ZS_ECANCELLED, "the scheduler is stopping");
    }
    if (s->idle_tail) s->idle_tail->next = &j;
    else s->idle = &j;
    s->idle_tail = &j;
    s->n_idle_callers++;
    pthread_cond_signal(&s->cv);
    int rc = 0;
    for (;;) {
        if (j.state == IDLE_DONE) {
            rc = j.rc;
            break;
        }
        if (j.state == IDLE_PENDING) {
            int gone = s->stop || s->draining;
            if (!gone && cancelled) { /* the caller's predicate runs without mu */
                pthread_mutex_unlock(&s->mu);
                gone = cancelled(ud) != 0;
                pthread_mutex_lock(&s->mu);
            }
            if (gone && j.state == IDLE_PENDING) {
                unlink_job(s, &j);
                rc = zs_err(ZS_ECANCELLED, s->stop || s->draining ? "the scheduler is stopping" : "cancelled");
                break;
            }
            if (j.state != IDLE_PENDING) continue;
        }
        /* polled every 5 ms while waiting (cancelled, stop, drain); woken at once when a job ends */
        struct timespec ts = deadline_ms(5);
        pthread_cond_timedwait(&s->cv_job, &s->mu, &ts);
    }
    s->n_idle_callers--;
    pthread_cond_broadcast(&s->cv_job);
    pthread_mutex_unlock(&s->mu);
    return rc;
}
