/* comm-group.c — the in-process group of ranks shared by comm-local.c and comm-mpi.c: slots,
 * the abortable generation-counted barrier (with an optional watch while waiting) and the
 * comparison of the ranks' calls. See comm-group.h. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm-group.h"
#include "comm-impl.h"
#include "common.h"

#define WATCH_NS 2000000L /* period of the watch in an abortable barrier */

int zs_comm_group_init(zs_comm_group *g, int n, void (*watch)(void *), void *watch_arg,
                       const char *name) {
    memset(g, 0, sizeof *g);
    g->n = g->refs = n;
    atomic_init(&g->aborted, 0);
    g->watch = watch;
    g->watch_arg = watch_arg;
    g->slots = zs_aligned_alloc(64, (size_t)n * sizeof(zs_comm_slot));
    if (!g->slots) return zs_err(ZS_ENOMEM, "comm %s: out of memory", name);
    memset(g->slots, 0, (size_t)n * sizeof(zs_comm_slot));
    pthread_condattr_t ca;
    int ok = pthread_condattr_init(&ca) == 0;
    if (ok) {
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* for the watch's timed waits */
        ok = pthread_cond_init(&g->cv, &ca) == 0;
        pthread_condattr_destroy(&ca);
    }
    if (ok && pthread_mutex_init(&g->mu, NULL)) {
        pthread_cond_destroy(&g->cv);
        ok = 0;
    }
    if (!ok) {
        free(g->slots);
        return zs_err(ZS_EIO, "comm %s: cannot initialize the group's barrier", name);
    }
    return 0;
}

void zs_comm_group_destroy(zs_comm_group *g) {
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g->slots);
}

int zs_comm_group_release(zs_comm_group *g) {
    pthread_mutex_lock(&g->mu);
    int last = --g->refs == 0;
    pthread_mutex_unlock(&g->mu);
    return last;
}

/* One slice of an abortable wait with a watch: a timed wait, then (on timeout) the watch,
 * outside the lock. Called and returns with g->mu held. */
static void wait_watching(zs_comm_group *g) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += WATCH_NS;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    if (pthread_cond_timedwait(&g->cv, &g->mu, &ts) == ETIMEDOUT) {
        pthread_mutex_unlock(&g->mu);
        g->watch(g->watch_arg);
        pthread_mutex_lock(&g->mu);
    }
}

int zs_comm_group_sync(zs_comm_group *g, int abortable) {
    int rc = 0;
    pthread_mutex_lock(&g->mu);
    if (abortable && atomic_load(&g->aborted)) {
        pthread_mutex_unlock(&g->mu);
        return ZS_ECANCELLED;
    }
    unsigned long my = g->gen;
    if (++g->arrived == g->n) {
        g->arrived = 0;
        g->gen++;
        pthread_cond_broadcast(&g->cv);
    } else {
        while (g->gen == my && !(abortable && atomic_load(&g->aborted))) {
            if (abortable && g->watch) wait_watching(g);
            else pthread_cond_wait(&g->cv, &g->mu);
        }
        if (g->gen == my) { /* aborted before everyone arrived: leave this generation */
            g->arrived--;
            rc = ZS_ECANCELLED;
        }
    }
    pthread_mutex_unlock(&g->mu);
    return rc;
}

int zs_comm_group_abort(zs_comm_group *g) {
    pthread_mutex_lock(&g->mu);
    int first = !atomic_exchange(&g->aborted, 1);
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    return first;
}

int zs_comm_group_aborted(zs_comm_group *g) { return atomic_load(&g->aborted); }

int zs_comm_group_enter(zs_comm_group *g, int li, const zs_comm_slot *mine) {
    g->slots[li] = *mine;
    return zs_comm_group_sync(g, 1);
}

int zs_comm_group_check(const zs_comm_group *g, const char *name, int base) {
    const zs_comm_slot *s0 = &g->slots[0];
    for (int r = 1; r < g->n; r++) {
        const zs_comm_slot *s = &g->slots[r];
        if (s->kind != s0->kind || s->size != s0->size || s->dt != s0->dt || s->op != s0->op ||
            s->root != s0->root) {
            char a[96], b[96];
            zs_comm_group_describe(s0->kind, s0->size, s0->dt, s0->op, s0->root, a, sizeof a);
            zs_comm_group_describe(s->kind, s->size, s->dt, s->op, s->root, b, sizeof b);
            return zs_err(ZS_EINVAL, "comm %s: ranks disagree on the collective: rank %d called "
                          "%s, rank %d called %s", name, base, a, base + r, b);
        }
    }
    return 0;
}

int zs_comm_group_worst(const zs_comm_group *g) {
    int worst = 0;
    for (int r = 0; r < g->n; r++) worst = ZS_MIN(worst, g->slots[r].status);
    return worst;
}

zs_comm_slot zs_comm_group_slot(int kind, size_t size, const void *send, void *recv) {
    zs_comm_slot s;
    memset(&s, 0, sizeof s);
    s.kind = kind;
    s.size = size;
    s.send = send;
    s.recv = recv;
    s.dt = s.op = s.root = -1;
    return s;
}

void zs_comm_group_part(size_t count, int n, int r, size_t *lo, size_t *hi) {
    size_t q = count / (size_t)n, rem = count % (size_t)n;
    *lo = (size_t)r * q + ZS_MIN((size_t)r, rem);
    *hi = *lo + q + ((size_t)r < rem);
}

void zs_comm_group_gather_parts(const zs_comm_group *g, int li, void *buf, size_t count,
                                size_t es) {
    for (int t = 1; t < g->n; t++) {
        int k = (li + t) % g->n;
        size_t lo, hi;
        zs_comm_group_part(count, g->n, k, &lo, &hi);
        if (hi > lo)
            memcpy((char *)buf + lo * es, (const char *)g->slots[k].recv + lo * es,
                   (hi - lo) * es);
    }
}

const char *zs_comm_group_kind_name(int kind) {
    static const char *names[] = {"all_gather", "reduce_scatter", "all_reduce", "broadcast",
                                  "barrier",    "agree",          "failed collective"};
    return kind >= 0 && kind <= ZS_COLL_BAD ? names[kind] : "?";
}

void zs_comm_group_describe(int kind, size_t size, int dt, int op, int root, char *buf,
                            size_t n) {
    switch (kind) {
    case ZS_COLL_ALL_GATHER:
        snprintf(buf, n, "all_gather(bytes_per_rank=%zu)", size);
        break;
    case ZS_COLL_REDUCE_SCATTER:
    case ZS_COLL_ALL_REDUCE:
        snprintf(buf, n, "%s(count=%zu, %s, %s)", zs_comm_group_kind_name(kind), size,
                 zs_dtype_name((zs_dtype)dt), zs_comm_redop_name((zs_redop)op));
        break;
    case ZS_COLL_BROADCAST:
        snprintf(buf, n, "broadcast(bytes=%zu, root=%d)", size, root);
        break;
    default:
        snprintf(buf, n, "%s()", zs_comm_group_kind_name(kind));
    }
}
