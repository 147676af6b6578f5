/* comm-local.c — the in-process communicator: ranks are threads of this process and buffers
 * are host memory. Used on CPU-only machines and as the reference for the other backends.
 *
 * Every collective has the same shape:
 *   1. the rank publishes its arguments (pointers, sizes) in its own slot of the group;
 *   2. barrier (abortable): after it every rank's slot is visible and every rank is inside
 *      the same collective — the slots are compared, and a mismatch fails every rank alike;
 *   3. each rank does its own part of the copying/reducing, in parallel, without any lock,
 *      reading the other ranks' buffers through their published pointers;
 *   4. barrier (not abortable — every rank passed step 2, so every rank gets here in finite
 *      time): after it no rank reads another rank's buffers any more, so the caller may reuse
 *      them and the slots may be overwritten by the next collective.
 * all_reduce adds one barrier between its reduce-scatter and all-gather halves.
 *
 * The barrier is generation counted (mutex + condition variable). Reductions go through
 * zs_comm_host_reduce, which combines the ranks in the fixed order 0..n-1 element by element
 * (f32 accumulation, one rounding for F16/BF16): results are bitwise reproducible and equal to
 * a sequential loop over the ranks, whatever the thread timing and whichever rank computes
 * which part.
 *
 * Thread-safety: as in comm.h — one thread per handle; zs_comm_abort from anywhere. */
#include <pthread.h>
#include <string.h>

#include "comm-impl.h"
#include "common.h"

enum { K_ALL_GATHER, K_REDUCE_SCATTER, K_ALL_REDUCE, K_BROADCAST, K_BARRIER, K_AGREE };

static const char *kind_name(int k) {
    static const char *names[] = {"all_gather", "reduce_scatter", "all_reduce",
                                  "broadcast",  "barrier",        "agree"};
    return k >= 0 && k <= K_AGREE ? names[k] : "?";
}

/* One rank's published arguments; a cache line each so ranks do not false-share. */
typedef struct {
    int kind;
    int dt, op, root; /* -1 where not meaningful */
    size_t size;      /* bytes or elements, as the collective takes them */
    const void *send;
    void *recv;
    int status;
} __attribute__((aligned(64))) slot;

typedef struct {
    int n;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived;       /* ranks waiting in the current barrier generation */
    unsigned long gen; /* barrier generation */
    int aborted;
    int refs; /* live handles */
    slot *slots;
} group;

typedef struct {
    zs_comm base;
    group *g;
    const void **srcs; /* scratch: n source pointers for the reductions */
} local_comm;

static const zs_comm_ops local_ops;

/* Waits until all n ranks have arrived. An abortable wait returns ZS_ECANCELLED when the group
 * is (or becomes) aborted before the generation completes; a non-abortable one always waits
 * for the generation, which is only used once every rank is known to be on its way. */
static int sync_ranks(group *g, int abortable) {
    int rc = 0;
    pthread_mutex_lock(&g->mu);
    if (abortable && g->aborted) {
        pthread_mutex_unlock(&g->mu);
        return ZS_ECANCELLED;
    }
    unsigned long my = g->gen;
    if (++g->arrived == g->n) {
        g->arrived = 0;
        g->gen++;
        pthread_cond_broadcast(&g->cv);
    } else {
        while (g->gen == my && !(abortable && g->aborted)) pthread_cond_wait(&g->cv, &g->mu);
        if (g->gen == my) { /* aborted before everyone arrived: leave this generation */
            g->arrived--;
            rc = ZS_ECANCELLED;
        }
    }
    pthread_mutex_unlock(&g->mu);
    return rc;
}

static void describe(const slot *s, char *buf, size_t n) {
    switch (s->kind) {
    case K_ALL_GATHER:
        snprintf(buf, n, "all_gather(bytes_per_rank=%zu)", s->size);
        break;
    case K_REDUCE_SCATTER:
    case K_ALL_REDUCE:
        snprintf(buf, n, "%s(count=%zu, %s, %s)", kind_name(s->kind), s->size,
                 zs_dtype_name((zs_dtype)s->dt), zs_comm_redop_name((zs_redop)s->op));
        break;
    case K_BROADCAST:
        snprintf(buf, n, "broadcast(bytes=%zu, root=%d)", s->size, s->root);
        break;
    default:
        snprintf(buf, n, "%s()", kind_name(s->kind));
    }
}

/* Steps 1-2: publish, wait for everyone, compare. Returns 0 when the work may proceed, 1 when
 * the ranks disagree (every rank sees the same slots, so every rank gets 1; the message is
 * set), or ZS_ECANCELLED (message set). */
static int enter(local_comm *lc, const slot *mine) {
    group *g = lc->g;
    g->slots[lc->base.rank] = *mine;
    if (sync_ranks(g, 1) < 0)
        return zs_err(ZS_ECANCELLED, "comm local %s (rank %d of %d): group aborted",
                      kind_name(mine->kind), lc->base.rank, g->n);
    const slot *s0 = &g->slots[0];
    for (int r = 1; r < g->n; r++) {
        const slot *s = &g->slots[r];
        if (s->kind != s0->kind || s->size != s0->size || s->dt != s0->dt || s->op != s0->op ||
            s->root != s0->root) {
            char a[96], b[96];
            describe(s0, a, sizeof a);
            describe(s, b, sizeof b);
            zs_err(ZS_EINVAL, "comm local: ranks disagree on the collective: rank 0 called %s, "
                   "rank %d called %s", a, r, b);
            return 1;
        }
    }
    return 0;
}

/* Step 4 and the result: mismatch (1) becomes ZS_EINVAL on every rank. */
static int leave(local_comm *lc, int mismatch) {
    sync_ranks(lc->g, 0);
    return mismatch ? ZS_EINVAL : 0;
}

static slot make_slot(int kind, size_t size, const void *send, void *recv) {
    slot s;
    memset(&s, 0, sizeof s);
    s.kind = kind;
    s.size = size;
    s.send = send;
    s.recv = recv;
    s.dt = s.op = s.root = -1;
    return s;
}

static int local_all_gather(zs_comm *c, const void *send, void *recv, size_t bytes,
                            void *stream) {
    (void)stream;
    local_comm *lc = (local_comm *)c;
    group *g = lc->g;
    slot me = make_slot(K_ALL_GATHER, bytes, send, recv);
    int rc = enter(lc, &me);
    if (rc < 0) return rc;
    if (rc == 0) {
        /* start at our own block so the ranks do not all read rank 0's buffer at once */
        for (int t = 0; t < g->n; t++) {
            int j = (c->rank + t) % g->n;
            char *dst = (char *)recv + (size_t)j * bytes;
            const void *src = g->slots[j].send;
            if (src != dst && bytes) memcpy(dst, src, bytes);
        }
    }
    return leave(lc, rc);
}

static int local_reduce_scatter(zs_comm *c, const void *send, void *recv, size_t count,
                                zs_dtype dt, zs_redop op, void *stream) {
    (void)stream;
    local_comm *lc = (local_comm *)c;
    group *g = lc->g;
    slot me = make_slot(K_REDUCE_SCATTER, count, send, recv);
    me.dt = dt;
    me.op = op;
    int rc = enter(lc, &me);
    if (rc < 0) return rc;
    if (rc == 0 && count) {
        size_t off = (size_t)c->rank * count * zs_dtype_size(dt);
        for (int k = 0; k < g->n; k++) lc->srcs[k] = (const char *)g->slots[k].send + off;
        /* in place, recv is our own send block `rank`, which only we read: the reduction
         * writes each chunk after reading it from every source */
        zs_comm_host_reduce(recv, lc->srcs, g->n, count, dt, op);
    }
    return leave(lc, rc);
}

/* Balanced split of count elements into n parts: part r is [lo, hi). */
static void part(size_t count, int n, int r, size_t *lo, size_t *hi) {
    size_t q = count / (size_t)n, rem = count % (size_t)n;
    *lo = (size_t)r * q + ZS_MIN((size_t)r, rem);
    *hi = *lo + q + ((size_t)r < rem);
}

static int local_all_reduce(zs_comm *c, const void *send, void *recv, size_t count, zs_dtype dt,
                            zs_redop op, void *stream) {
    (void)stream;
    local_comm *lc = (local_comm *)c;
    group *g = lc->g;
    size_t es = zs_dtype_size(dt);
    slot me = make_slot(K_ALL_REDUCE, count, send, recv);
    me.dt = dt;
    me.op = op;
    int rc = enter(lc, &me);
    if (rc < 0) return rc;
    if (rc == 0) {
        /* reduce-scatter half: rank r reduces part r of every send into part r of its recv */
        size_t lo, hi;
        part(count, g->n, c->rank, &lo, &hi);
        if (hi > lo) {
            for (int k = 0; k < g->n; k++)
                lc->srcs[k] = (const char *)g->slots[k].send + lo * es;
            zs_comm_host_reduce((char *)recv + lo * es, lc->srcs, g->n, hi - lo, dt, op);
        }
        /* every part is final, and no rank reads a send buffer any more (in place, the parts
         * we are about to overwrite were other ranks' inputs) */
        if (g->n > 1) sync_ranks(g, 0);
        /* all-gather half: copy part j from rank j's recv */
        for (int t = 1; t < g->n; t++) {
            int j = (c->rank + t) % g->n;
            part(count, g->n, j, &lo, &hi);
            if (hi > lo)
                memcpy((char *)recv + lo * es, (const char *)g->slots[j].recv + lo * es,
                       (hi - lo) * es);
        }
    }
    return leave(lc, rc);
}

static int local_broadcast(zs_comm *c, void *buf, size_t bytes, int root, void *stream) {
    (void)stream;
    local_comm *lc = (local_comm *)c;
    group *g = lc->g;
    slot me = make_slot(K_BROADCAST, bytes, buf, buf);
    me.root = root;
    int rc = enter(lc, &me);
    if (rc < 0) return rc;
    if (rc == 0 && c->rank != root && bytes && g->slots[root].send != buf)
        memcpy(buf, g->slots[root].send, bytes);
    return leave(lc, rc);
}

static int local_barrier(zs_comm *c) {
    local_comm *lc = (local_comm *)c;
    slot me = make_slot(K_BARRIER, 0, NULL, NULL);
    int rc = enter(lc, &me);
    if (rc < 0) return rc;
    return leave(lc, rc);
}

static int local_agree(zs_comm *c, int local_status, int *global_status) {
    local_comm *lc = (local_comm *)c;
    group *g = lc->g;
    slot me = make_slot(K_AGREE, 0, NULL, NULL);
    me.status = local_status;
    int rc = enter(lc, &me);
    if (rc < 0) return rc;
    int worst = 0;
    if (rc == 0)
        for (int r = 0; r < g->n; r++) worst = ZS_MIN(worst, g->slots[r].status);
    rc = leave(lc, rc);
    if (rc == 0) *global_status = worst;
    return rc;
}

static void local_abort(zs_comm *c) {
    group *g = ((local_comm *)c)->g;
    pthread_mutex_lock(&g->mu);
    g->aborted = 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static void group_destroy(group *g) {
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g->slots);
    free(g);
}

static void local_free(zs_comm *c) {
    local_comm *lc = (local_comm *)c;
    group *g = lc->g;
    pthread_mutex_lock(&g->mu);
    int last = --g->refs == 0;
    pthread_mutex_unlock(&g->mu);
    if (last) group_destroy(g);
    free(lc->srcs);
    free(lc);
}

static const zs_comm_ops local_ops = {
    .name = "local",
    .all_gather = local_all_gather,
    .reduce_scatter = local_reduce_scatter,
    .all_reduce = local_all_reduce,
    .broadcast = local_broadcast,
    .barrier = local_barrier,
    .agree = local_agree,
    .abort = local_abort,
    .free = local_free,
};

#define LOCAL_MAX_RANKS 4096

int zs_comm_local_create(int n, zs_comm **comms) {
    if (n < 1 || n > LOCAL_MAX_RANKS)
        return zs_err(ZS_EINVAL, "comm local: group size %d out of range [1, %d]", n,
                      LOCAL_MAX_RANKS);
    if (!comms) return zs_err(ZS_EINVAL, "comm local: NULL output array");
    group *g = calloc(1, sizeof *g);
    if (!g) return zs_err(ZS_ENOMEM, "comm local: out of memory");
    g->n = n;
    g->slots = zs_aligned_alloc(64, (size_t)n * sizeof(slot));
    if (!g->slots) {
        free(g);
        return zs_err(ZS_ENOMEM, "comm local: out of memory");
    }
    memset(g->slots, 0, (size_t)n * sizeof(slot));
    if (pthread_mutex_init(&g->mu, NULL)) {
        free(g->slots);
        free(g);
        return zs_err(ZS_EIO, "comm local: pthread_mutex_init failed");
    }
    if (pthread_cond_init(&g->cv, NULL)) {
        pthread_mutex_destroy(&g->mu);
        free(g->slots);
        free(g);
        return zs_err(ZS_EIO, "comm local: pthread_cond_init failed");
    }
    local_comm **lcs = calloc((size_t)n, sizeof *lcs);
    int ok = lcs != NULL;
    for (int r = 0; ok && r < n; r++) {
        lcs[r] = calloc(1, sizeof **lcs);
        if (!lcs[r] || !(lcs[r]->srcs = calloc((size_t)n, sizeof(void *)))) ok = 0;
        else {
            lcs[r]->base.ops = &local_ops;
            lcs[r]->base.rank = r;
            lcs[r]->base.size = n;
            lcs[r]->g = g;
        }
    }
    if (!ok) {
        for (int r = 0; lcs && r < n; r++)
            if (lcs[r]) {
                free(lcs[r]->srcs);
                free(lcs[r]);
            }
        free(lcs);
        group_destroy(g);
        return zs_err(ZS_ENOMEM, "comm local: out of memory");
    }
    g->refs = n;
    for (int r = 0; r < n; r++) comms[r] = &lcs[r]->base;
    free(lcs);
    return 0;
}
