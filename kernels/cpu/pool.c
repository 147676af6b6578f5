/* pool.c — worker threads shared by the CPU kernels (started on first use, never torn down). */
#include "pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

static pthread_once_t pool_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t job_lock = PTHREAD_MUTEX_INITIALIZER; /* one job at a time */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv_work = PTHREAD_COND_INITIALIZER, cv_done = PTHREAD_COND_INITIALIZER;
static int n_threads = 1;
static long generation;
static zs_pool_fn job_fn;
static void *job_arg;
static int job_n;
static atomic_int next_task;
static int busy_workers;

static void run_tasks(void) {
    for (;;) {
        int t = atomic_fetch_add(&next_task, 1);
        if (t >= job_n) break;
        job_fn(job_arg, t);
    }
}

static void *worker(void *p) {
    (void)p;
    long seen = 0;
    for (;;) {
        pthread_mutex_lock(&mu);
        while (generation == seen) pthread_cond_wait(&cv_work, &mu);
        seen = generation;
        pthread_mutex_unlock(&mu);
        run_tasks();
        pthread_mutex_lock(&mu);
        if (--busy_workers == 0) pthread_cond_signal(&cv_done);
        pthread_mutex_unlock(&mu);
    }
    return NULL;
}

static void pool_init(void) {
    const char *e = getenv("ZS_THREADS");
    long n = e ? strtol(e, NULL, 10) : sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) n = 1;
    if (n > 256) n = 256;
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
    pthread_mutex_lock(&mu);
    job_fn = fn;
    job_arg = arg;
    job_n = n;
    atomic_store(&next_task, 0);
    busy_workers = n_threads - 1;
    generation++;
    pthread_cond_broadcast(&cv_work);
    pthread_mutex_unlock(&mu);
    run_tasks();
    pthread_mutex_lock(&mu);
    while (busy_workers > 0) pthread_cond_wait(&cv_done, &mu);
    pthread_mutex_unlock(&mu);
    pthread_mutex_unlock(&job_lock);
}
