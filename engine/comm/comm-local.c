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
 * The slots, the barrier (generation counted, abortable) and the comparison are the group of
 * comm-group.c, shared with comm-mpi.c. Reductions go through
 * zs_comm_host_reduce, which combines the ranks in the fixed order 0..n-1 element by element
 * (f32 accumulation, one rounding for F16/BF16): results are bitwise reproducible and equal to
 * a sequential loop over the ranks, whatever the thread timing and whichever rank computes
 * which part.
 *
 * Thread-safety: as in comm.h — one thread per handle; zs_comm_abort from anywhere. */
#include <string.h>

#include "comm-group.h"
#include "comm-impl.h"
#include "common.h"

typedef struct {
    zs_comm base;
    zs_comm_group *g;
    const void **srcs; /* scratch: n source pointers for the reductions */
} local_comm;

static const zs_comm_ops local_ops;

/* Steps 1-2: publish, wait for everyone, compare. Returns ZS_ECANCELLED (message set) when
 * the group was aborted: the caller returns at once. Otherwise 0 with *verdict: 0 to do the
 * work, or ZS_EINVAL when the ranks disagree (every rank sees the same slots, so every rank
 * gets it; the message is set), which leave() returns. */
static int enter(local_comm *lc, const zs_comm_slot *mine, int *verdict) {
    zs_comm_group *g = lc->g;
    if (zs_comm_group_enter(g, lc->base.rank, mine) < 0)
        return zs_err(ZS_ECANCELLED, "comm local %s (rank %d of %d): group aborted",
                      zs_comm_group_kind_name(mine->kind), lc->base.rank, g->n);
    *verdict = zs_comm_group_check(g, "local", 0);
    return 0;
}

/* Step 4 and the result. */
static int leave(local_comm *lc, int verdict) {
    zs_comm_group_sync(lc->g, 0);
    return verdict;
}

static int local_all_gather(zs_comm *c, const void *send, void *recv, size_t bytes,
                            void *stream) {
    (void)stream;
    local_comm *lc = (local_comm *)c;
    zs_comm_group *g = lc->g;
    int v;
    zs_comm_slot me = zs_comm_group_slot(ZS_COLL_ALL_GATHER, bytes, send, recv);
    if (enter(lc, &me, &v) < 0) return ZS_ECANCELLED;
    if (v == 0) {
        /* start at our own block so the ranks do not all read rank 0's buffer at once */
        for (int t = 0; t < g->n; t++) {
            int j = (c->rank + t) % g->n;
            char *dst = (char *)recv + (size_t)j * bytes;
            const void *src = g->slots[j].send;
            if (src != dst && bytes) memcpy(dst, src, bytes);
        }
    }
    return leave(lc, v);
}

static int local_reduce_scatter(zs_comm *c, const void *send, void *recv, size_t count,
                                zs_dtype dt, zs_redop op, void *stream) {
    (void)stream;
    local_comm *lc = (local_comm *)c;
    zs_comm_group *g = lc->g;
    int v;
    zs_comm_slot me = zs_comm_group_slot(ZS_COLL_REDUCE_SCATTER, count, send, recv);
    me.dt = dt;
    me.op = op;
    if (enter(lc, &me, &v) < 0) return ZS_ECANCELLED;
    if (v == 0 && count) {
        size_t off = (size_t)c->rank * count * zs_dtype_size(dt);
        for (int k = 0; k < g->n; k++) lc->srcs[k] = (const char *)g->slots[k].send + off;
        /* in place, recv is our own send block `rank`, which only we read: the reduction
         * writes each chunk after reading it from every source */
        zs_comm_host_reduce(recv, lc->srcs, g->n, count, dt, op);
    }
    return leave(lc, v);
}

static int local_all_reduce(zs_comm *c, const void *send, void *recv, size_t count, zs_dtype dt,
                            zs_redop op, void *stream) {
    (void)stream;
    local_comm *lc = (local_comm *)c;
    zs_comm_group *g = lc->g;
    size_t es = zs_dtype_size(dt);
    int v;
    zs_comm_slot me = zs_comm_group_slot(ZS_COLL_ALL_REDUCE, count, send, recv);
    me.dt = dt;
    me.op = op;
    if (enter(lc, &me, &v) < 0) return ZS_ECANCELLED;
    if (v == 0) {
        /* reduce-scatter half: rank r reduces part r of every send into part r of its recv */
        size_t lo, hi;
        zs_comm_group_part(count, g->n, c->rank, &lo, &hi);
        if (hi > lo) {
            for (int k = 0; k < g->n; k++)
                lc->srcs[k] = (const char *)g->slots[k].send + lo * es;
            zs_comm_host_reduce((char *)recv + lo * es, lc->srcs, g->n, hi - lo, dt, op);
        }
        /* every part is final, and no rank reads a send buffer any more (in place, the parts
         * we are about to overwrite were other ranks' inputs) */
        if (g->n > 1) zs_comm_group_sync(g, 0);
        /* all-gather half: copy part j from rank j's recv */
        zs_comm_group_gather_parts(g, c->rank, recv, count, es);
    }
    return leave(lc, v);
}

static int local_broadcast(zs_comm *c, void *buf, size_t bytes, int root, void *stream) {
    (void)stream;
    local_comm *lc = (local_comm *)c;
    zs_comm_group *g = lc->g;
    int v;
    zs_comm_slot me = zs_comm_group_slot(ZS_COLL_BROADCAST, bytes, buf, buf);
    me.root = root;
    if (enter(lc, &me, &v) < 0) return ZS_ECANCELLED;
    if (v == 0 && c->rank != root && bytes && g->slots[root].send != buf)
        memcpy(buf, g->slots[root].send, bytes);
    return leave(lc, v);
}

static int local_barrier(zs_comm *c) {
    local_comm *lc = (local_comm *)c;
    int v;
    zs_comm_slot me = zs_comm_group_slot(ZS_COLL_BARRIER, 0, NULL, NULL);
    if (enter(lc, &me, &v) < 0) return ZS_ECANCELLED;
    return leave(lc, v);
}

static int local_agree(zs_comm *c, int local_status, int *global_status) {
    local_comm *lc = (local_comm *)c;
    int v;
    zs_comm_slot me = zs_comm_group_slot(ZS_COLL_AGREE, 0, NULL, NULL);
    me.status = local_status;
    if (enter(lc, &me, &v) < 0) return ZS_ECANCELLED;
    int worst = v == 0 ? zs_comm_group_worst(lc->g) : 0;
    v = leave(lc, v);
    if (v == 0) *global_status = worst;
    return v;
}

static void local_abort(zs_comm *c) { zs_comm_group_abort(((local_comm *)c)->g); }

static void group_free(zs_comm_group *g) {
    zs_comm_group_destroy(g);
    free(g);
}

static void local_free(zs_comm *c) {
    local_comm *lc = (local_comm *)c;
    if (zs_comm_group_release(lc->g)) group_free(lc->g);
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
    zs_comm_group *g = malloc(sizeof *g);
    if (!g) return zs_err(ZS_ENOMEM, "comm local: out of memory");
    int rc = zs_comm_group_init(g, n, NULL, NULL, "local");
    if (rc < 0) {
        free(g);
        return rc;
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
        group_free(g);
        return zs_err(ZS_ENOMEM, "comm local: out of memory");
    }
    for (int r = 0; r < n; r++) comms[r] = &lcs[r]->base;
    free(lcs);
    return 0;
}
