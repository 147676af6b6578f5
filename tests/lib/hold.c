/* hold.c — holding a scheduler's engine thread from a test (hold.h). */
#include "hold.h"

#include <string.h>

static int hold_job(void *ud) {
    tu_hold *h = ud;
    pthread_mutex_lock(&h->mu);
    h->entered = 1;
    pthread_cond_broadcast(&h->cv);
    while (!h->release) pthread_cond_wait(&h->cv, &h->mu);
    pthread_mutex_unlock(&h->mu);
    return TU_HOLD_VALUE;
}

static void *hold_main(void *arg) {
    tu_hold *h = arg;
    int rc = zs_sched_run_idle(h->s, hold_job, h, NULL);
    pthread_mutex_lock(&h->mu);
    h->rc = rc;
    h->returned = 1;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

void tu_hold_start(tu_hold *h, zs_sched *s) {
    memset(h, 0, sizeof *h);
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    h->s = s;
    pthread_create(&h->th, NULL, hold_main, h);
    pthread_mutex_lock(&h->mu);
    while (!h->entered && !h->returned) pthread_cond_wait(&h->cv, &h->mu);
    pthread_mutex_unlock(&h->mu);
}

void tu_hold_end(tu_hold *h) {
    pthread_mutex_lock(&h->mu);
    h->release = 1;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    pthread_join(h->th, NULL);
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->cv);
}
