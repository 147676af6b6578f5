/* pool.c — worker threads shared by the CPU kernels (started on first use, never torn down).
 * A decoded token runs a hundred or more short jobs, so waking sleeping workers through a
 * condition variable for each one costs more than some of the jobs: workers and the caller
 * spin for a short while (ZS_POOL_SPIN_US, default 200 µs) on the job counter before they sleep. */
#include "pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static pthread_once_t pool_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t job_lock = PTHREAD_MUTEX_INITIALIZER; /* one job at a time */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;       /* sleepers and their wake-ups */
static pthread_cond_t cv_work = PTHREAD_COND_INITIALIZER, cv_done = PTHREAD_COND_INITIALIZER;
static int n_threads = 1;
static long spin_ns = 200000;
static atomic_long generation; /* bumped under mu when a job is published */
static int sleepers;           /* workers waiting on cv_work, under mu */
static zs_pool_fn job_fn;
static void *job_arg;
static int job_n;
static atomic_int next_task;
static atomic_int busy_workers;

static void run_tasks(void) {
    for (;;) {
        int t = atomic_fetch_add(&next_task, 1);
        if (t >= job_n) break;
        job_fn(job_arg, t);
    }
}

static long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* spins until *v differs from (differ) or equals (!differ) x, for at most spin_ns; returns 1 if so */
static int spin_until(atomic_long *lv, atomic_int *iv, long x, int differ) {
    long t0 = 0;
    for (unsigned i = 0;; i++) {
        long v = lv ? atomic_load_explicit(lv, memory_order_acquire) : atomic_load_explicit(iv, memory_order_acquire);
        if ((v != x) == differ) return 1;
        if ((i & 63) == 63) {
            long t = now_ns();
            if (!t0) t0 = t;
            else if (t - t0 > spin_ns) return 0;
            sched_yield(); /* on a busy machine, lets the thread waited for have this CPU */
        }
        cpu_relax();
    }
}

static void *worker(void *p) {
    (void)p;
    long seen = 0;
    for (;;) {
        if (!spin_until(&generation, NULL, seen, 1)) {
            pthread_mutex_lock(&mu);
            sleepers++;
            while (atomic_load(&generation) == seen) pthread_cond_wait(&cv_work, &mu);
            sleepers--;
            pthread_mutex_unlock(&mu);
        }
        seen = atomic_load(&generation);
        run_tasks();
        if (atomic_fetch_sub(&busy_workers, 1) == 1) {
            pthread_mutex_lock(&mu);
            pthread_cond_signal(&cv_done);
            pthread_mutex_unlock(&mu);
        }
    }
    return NULL;
}

static void pool_init(void) {
    const char *e = getenv("ZS_THREADS");
    long n = e ? strtol(e, NULL, 10) : sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) n = 1;
    if (n > 256) n = 256;
    const char *s = getenv("ZS_POOL_SPIN_US");
    if (s && *s) {
        long us = strtol(s, NULL, 10);
        spin_ns = us < 0 ? 0 : us > 100000 ? 100000000L : us * 1000;
    }
    n_threads = (int)n;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    for (int i = 1; i < n_threads; i++) {
        pthread_t t;
        if (pthread_create(&t, &a, worker, NULL) != 0) { n_threads = i; break; }
    }
    pthread_attr_destroy(&a);
}

int zs_pool_threads(void) {
    pthread_once(&pool_once, pool_init);
    return n_threads;
}

void zs_pool_run(zs_pool_fn fn, void *arg, int n) {
    if (n <= 0) return;
    if (n == 1 || zs_pool_threads() == 1) {
        for (int t = 0; t < n; t++) fn(arg, t);
        return;
    }
    pthread_mutex_lock(&job_lock);
    job_fn = fn;
    job_arg = arg;
    job_n = n;
    atomic_store(&next_task, 0);
    atomic_store(&busy_workers, n_threads - 1);
    pthread_mutex_lock(&mu);
    atomic_fetch_add_explicit(&generation, 1, memory_order_release);
    if (sleepers) pthread_cond_broadcast(&cv_work);
    pthread_mutex_unlock(&mu);
    run_tasks();
    if (!spin_until(NULL, &busy_workers, 0, 0)) {
        pthread_mutex_lock(&mu);
        while (atomic_load(&busy_workers) > 0) pthread_cond_wait(&cv_done, &mu);
        pthread_mutex_unlock(&mu);
    }
    pthread_mutex_unlock(&job_lock);
}
