/* hold.h — holds a scheduler's engine thread from a test: an idle job (zs_sched_run_idle) that waits
 * until released, so that what the test submits meanwhile is all in the inbox at the next step.
 * Ownership: the caller owns the tu_hold (on its stack is fine) from start to end. Not thread-safe:
 * one thread starts and ends a hold. */
#ifndef ZS_TEST_HOLD_H
#define ZS_TEST_HOLD_H

#include <pthread.h>

#include "sched.h"

#define TU_HOLD_VALUE 7 /* what the holding job returns: rc after tu_hold_end when it ran */

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int entered, returned, release;
    int rc; /* zs_sched_run_idle's value, after tu_hold_end */
    zs_sched *s;
    pthread_t th;
} tu_hold;

/* Returns once the job holds the engine thread (or run_idle refused it: h->rc then says why). */
void tu_hold_start(tu_hold *h, zs_sched *s);
/* Lets the engine thread go and joins the holding thread. */
void tu_hold_end(tu_hold *h);

#endif
