/* comm-mpi.c — the "mpi" communicator (comm.h): ranks are threads of the processes of the
 * cluster (cluster.h), buffers are host memory. Process p runs world ranks p*n .. p*n+n-1 on n
 * threads; the threads of one process exchange through shared memory (published pointers in
 * the slots of comm-group.c, as in comm-local.c), the processes through MPI. Results are
 * bitwise those of comm-local.c with as many ranks: copies are exact, and every reduction goes
 * through zs_comm_host_reduce over the world's ranks in the order 0..size-1.
 *
 * MPI communicators: the group holds n of them (zs_cluster_new_mpi_comm), one per local
 * thread index i: thread i of every process talks over comm i only, so no two threads ever
 * share a communicator and MPI_THREAD_MULTIPLE lets them run concurrently. Every MPI call is
 * non-blocking and polled (MPI_Test, a short spin then sleeps of 20-100 us, so oversubscribed
 * runs stay fast) while watching the group's abort flag and zs_cluster_lost(): nothing blocks
 * forever. MPI counts are int, so transfers go in chunks of at most 1 GiB (environment
 * ZS_COMM_MPI_CHUNK=bytes overrides, for tests), one chunk in flight per thread at a time.
 *
 * Every collective has the same shape:
 *   1. the rank publishes its arguments in its slot; in-process barrier (abortable); the slots
 *      of the process's ranks are compared (a mismatch fails every rank alike);
 *   2. (several processes) thread i exchanges a small header (kind, size, dtype, op, root,
 *      status) with thread i of every process over comm i (MPI_Iallgather): the processes are
 *      compared, so a mismatch anywhere fails every rank of the world with ZS_EINVAL and the
 *      group stays usable, as in comm-local.c. A process whose own ranks disagree sends a
 *      "bad" header, so the others fail too instead of waiting. For barrier and agree this
 *      exchange is the whole work (an all-gather completes only once everybody entered);
 *   3. the data moves (one MPI collective per thread over its comm), then an in-process
 *      barrier settles the outcome: if any local thread failed (abort, lost cluster, MPI
 *      error) every local rank fails, otherwise the local ranks read each other's results:
 *      all_gather     thread i gathers only the blocks of local index i of every process
 *                     (strided datatype) into its recv; the other columns are copied from the
 *                     other threads' recv;
 *      reduce_scatter MPI all-to-all: thread i of process p' sends it blocks p*n..p*n+n-1 of
 *                     its send, into a scratch buffer; rank j then reduces its block over the
 *                     N = P*n sources (scratch of thread i, part p', sub-block j) in world
 *                     rank order;
 *      all_reduce     MPI all-gather of the whole send buffers into scratch (P*count per
 *                     thread); local rank j reduces part j of the elements over the N
 *                     sources in world rank order, barrier, the parts are copied between the
 *                     local ranks (as comm-local.c does its all_reduce);
 *      broadcast      thread i broadcasts part i of the buffer over comm i from the root's
 *                     process (reading the root's buffer there), then the parts are copied
 *                     between the local ranks; in the root's process the root's buffer is
 *                     copied;
 *   4. in-process barrier (not abortable: every local rank passed step 1 and each MPI wait
 *      ends on abort), after which no rank reads another's buffers or scratch any more.
 * With one process (no mpirun) no MPI is used at all: the group is comm-local with the same
 * checks.
 *
 * Abort: zs_comm_abort marks the group aborted and sends a notice (8 bytes, the group's token,
 * a point-to-point message on comm 0) to every other process; each process keeps a receive
 * for it posted and polls it while waiting, so a rank aborted in one process cancels the ranks
 * waiting in the others. The token (made by process 0 at creation) tells a stale notice of an
 * earlier group whose communicator id was reused from a real one. MPI cannot cancel a
 * collective: after an abort the request of a thread that gave up is left pending, and the
 * handle memory it uses (headers, scratch, datatype) and its communicator are deliberately
 * leaked at free; a user buffer it was writing may still be written if the peers complete it
 * later (the process is expected to go away after an abort). An MPI error (MPI_ERRORS_RETURN
 * on our communicators) becomes ZS_EIO and also aborts the group.
 *
 * Thread-safety: as in comm.h — one thread per handle; zs_comm_abort from anywhere. */
#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cluster.h"
#include "comm-group.h"
#include "comm-impl.h"
#include "common.h"

#define MPI_MAX_LOCAL 4096       /* ranks per process, as comm-local.c */
#define MPI_MAX_RANKS (1 << 20)  /* ranks of the world */
#define DEFAULT_CHUNK ((size_t)1 << 30)
#define TAG_ABORT 4242           /* point-to-point tag of abort notices on comm 0 */
#define SPIN_POLLS 64            /* polls before the first sleep */
#define SHORT_SLEEPS 1000        /* sleeps of 20 us before they grow to 100 us */

/* What thread i tells thread i of the other processes (step 2). */
typedef struct {
    int32_t kind, dt, op, root;
    int32_t status; /* agree: the process's worst status; ZS_COLL_BAD: the error code */
    int32_t pad;
    uint64_t size;
} hdr;

typedef struct {
    zs_comm_group lg; /* the n local ranks: slots, barrier, abort flag (comm-group.h) */
    int n, nproc, proc, size; /* local ranks, processes, this process, world ranks */
    size_t chunk; /* bytes per MPI call */
    /* several processes only */
    int *handles;     /* n communicators (zs_cluster_new_mpi_comm), -1 when none */
    MPI_Comm *comms;
    char *keep;       /* keep[i]: comm i has a request left pending, never free it */
    uint64_t token;   /* the group's identity in abort notices */
    pthread_mutex_t amu; /* guards the notice receive (one MPI_Test at a time) */
    MPI_Request notice_rq;
    uint64_t notice_in, notice_out;
    MPI_Request *notice_sends; /* nproc; sent by this process's abort */
    atomic_int notified;
} group;

typedef struct {
    zs_comm base;
    group *g;
    int li;            /* local thread index: the communicator this rank talks over */
    const void **srcs; /* scratch: world-size source pointers for the reductions */
    void *scratch;
    size_t scratch_cap;
    hdr hsend; /* MPI buffers live with the handle (a pending request may still use them) */
    hdr *hrecv;
    MPI_Request rq;    /* the request in flight */
    MPI_Datatype type; /* its datatype, MPI_DATATYPE_NULL when none */
    int pending;       /* rq was left pending after a cancel: never free what it uses */
} mpi_comm;

static const zs_comm_ops mpi_ops;

static int mpi_down(void) {
    int fin = 0;
    MPI_Finalized(&fin);
    return fin;
}

/* ---- abort ------------------------------------------------------------------------------- */

static void post_notice_recv(group *g) {
    if (MPI_Irecv(&g->notice_in, (int)sizeof g->notice_in, MPI_BYTE, MPI_ANY_SOURCE, TAG_ABORT,
                  g->comms[0], &g->notice_rq) != MPI_SUCCESS)
        g->notice_rq = MPI_REQUEST_NULL;
}

/* Tells the other processes (once, by the first abort of this process). */
static void send_notices(group *g) {
    if (g->nproc == 1 || zs_cluster_lost(NULL, 0) || mpi_down()) return;
    g->notice_out = g->token;
    for (int p = 0; p < g->nproc; p++) {
        g->notice_sends[p] = MPI_REQUEST_NULL;
        if (p != g->proc)
            MPI_Isend(&g->notice_out, (int)sizeof g->notice_out, MPI_BYTE, p, TAG_ABORT,
                      g->comms[0], &g->notice_sends[p]);
    }
    atomic_store(&g->notified, 1);
}

/* Marks the group aborted and wakes the local ranks; notify: also tell the other processes
 * (not for a notice received from them, nor for a lost cluster). */
static void group_abort(group *g, int notify) {
    if (zs_comm_group_abort(&g->lg) && notify) send_notices(g);
}

/* Polls the notice receive (when no other thread does): a notice of this group aborts it. */
static void poll_notice(group *g) {
    if (g->nproc == 1 || zs_comm_group_aborted(&g->lg)) return;
    if (pthread_mutex_trylock(&g->amu)) return;
    int hit = 0, done = 0;
    if (g->notice_rq != MPI_REQUEST_NULL &&
        MPI_Test(&g->notice_rq, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done) {
        if (g->notice_in == g->token) hit = 1;
        else post_notice_recv(g); /* a stale notice of an earlier group: listen on */
    }
    pthread_mutex_unlock(&g->amu);
    if (hit) group_abort(g, 0);
}

/* Watches for an abort notice or a lost cluster; 1 when the group is aborted. */
static int watch(group *g) {
    poll_notice(g);
    if (!zs_comm_group_aborted(&g->lg) && zs_cluster_lost(NULL, 0)) group_abort(g, 0);
    return zs_comm_group_aborted(&g->lg);
}

/* The watch of the in-process barrier (several processes). */
static void watch_barrier(void *g) { watch(g); }

static void mpi_abort(zs_comm *c) { group_abort(((mpi_comm *)c)->g, 1); }

/* ZS_ECANCELLED with the reason (lost cluster or abort). */
static int cancelled(mpi_comm *mc, const char *what) {
    char lost[400];
    if (mc->g->nproc > 1 && zs_cluster_lost(lost, sizeof lost))
        return zs_err(ZS_ECANCELLED, "comm mpi %s (rank %d of %d): cluster lost: %s", what,
                      mc->base.rank, mc->base.size, lost);
    return zs_err(ZS_ECANCELLED, "comm mpi %s (rank %d of %d): group aborted", what,
                  mc->base.rank, mc->base.size);
}

/* ---- MPI requests ------------------------------------------------------------------------ */

static void backoff(long *polls) {
    long k = ++*polls;
    if (k <= SPIN_POLLS) return;
    struct timespec ts = {0, k <= SPIN_POLLS + SHORT_SLEEPS ? 20000 : 100000};
    nanosleep(&ts, NULL);
}

/* An MPI failure: ZS_EIO with MPI's text; the group is aborted (the peers would wait). */
static int mpi_failed(mpi_comm *mc, int e, const char *what, const char *call) {
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(e, s, &len) != MPI_SUCCESS)
        len = snprintf(s, sizeof s, "MPI error %d", e);
    group_abort(mc->g, 1);
    return zs_err(ZS_EIO, "comm mpi %s (rank %d of %d): %s failed: %.*s (group aborted)", what,
                  mc->base.rank, mc->base.size, call, len, s);
}

static void drop_type(mpi_comm *mc) {
    if (mc->type != MPI_DATATYPE_NULL) MPI_Type_free(&mc->type);
    mc->type = MPI_DATATYPE_NULL;
}

/* Completes the request just started by `call` (e is its return code). Polls it while watching
 * for abort and loss; a request given up is left pending (mc->pending). */
static int finish(mpi_comm *mc, int e, const char *what, const char *call) {
    if (e != MPI_SUCCESS) {
        drop_type(mc);
        mc->rq = MPI_REQUEST_NULL;
        return mpi_failed(mc, e, what, call);
    }
    long polls = 0;
    for (;;) {
        int done = 0;
        e = MPI_Test(&mc->rq, &done, MPI_STATUS_IGNORE);
        if (e != MPI_SUCCESS) {
            mc->pending = 1;
            return mpi_failed(mc, e, what, call);
        }
        if (done) {
            drop_type(mc);
            return 0;
        }
        if ((polls & 7) == 0 && watch(mc->g)) {
            mc->pending = 1;
            return cancelled(mc, what);
        }
        backoff(&polls);
    }
}

/* A block of len bytes repeated every `extent` bytes (one element per process). */
static int block_type(mpi_comm *mc, size_t len, size_t extent, const char *what) {
    MPI_Datatype t;
    int e = MPI_Type_contiguous((int)len, MPI_BYTE, &t);
    if (e != MPI_SUCCESS) return mpi_failed(mc, e, what, "MPI_Type_contiguous");
    e = MPI_Type_create_resized(t, 0, (MPI_Aint)extent, &mc->type);
    MPI_Type_free(&t);
    if (e != MPI_SUCCESS) {
        mc->type = MPI_DATATYPE_NULL;
        return mpi_failed(mc, e, what, "MPI_Type_create_resized");
    }
    if ((e = MPI_Type_commit(&mc->type)) != MPI_SUCCESS) {
        drop_type(mc);
        return mpi_failed(mc, e, what, "MPI_Type_commit");
    }
    return 0;
}

static MPI_Comm my_comm(mpi_comm *mc) { return mc->g->comms[mc->li]; }

/* All-gather over this thread's communicator: process p's blk bytes land at base + p*stride.
 * send NULL: in place (this process's block is already at base + proc*stride). */
static int gather_blocks(mpi_comm *mc, const void *send, char *base, size_t blk, size_t stride,
                         const char *what) {
    for (size_t off = 0; off < blk;) {
        size_t len = ZS_MIN(mc->g->chunk, blk - off);
        MPI_Datatype t = MPI_BYTE;
        int cnt = (int)len;
        if (stride != len) {
            ZS_CHECK(block_type(mc, len, stride, what));
            t = mc->type;
            cnt = 1;
        }
        int e = MPI_Iallgather(send ? (const char *)send + off : MPI_IN_PLACE, (int)len,
                               MPI_BYTE, base + off, cnt, t, my_comm(mc), &mc->rq);
        ZS_CHECK(finish(mc, e, what, "MPI_Iallgather"));
        off += len;
    }
    return 0;
}

/* All-to-all over this thread's communicator: block p (blk bytes at send + p*blk) goes to
 * process p, process p's block for us lands at recv + p*blk. */
static int all_to_all(mpi_comm *mc, const void *send, char *recv, size_t blk,
                      const char *what) {
    for (size_t off = 0; off < blk;) {
        size_t len = ZS_MIN(mc->g->chunk, blk - off);
        MPI_Datatype t = MPI_BYTE;
        int cnt = (int)len;
        if (blk != len) {
            ZS_CHECK(block_type(mc, len, blk, what));
            t = mc->type;
            cnt = 1;
        }
        int e = MPI_Ialltoall((const char *)send + off, cnt, t, recv + off, cnt, t, my_comm(mc),
                              &mc->rq);
        ZS_CHECK(finish(mc, e, what, "MPI_Ialltoall"));
        off += len;
    }
    return 0;
}

static int bcast_bytes(mpi_comm *mc, char *buf, size_t bytes, int root, const char *what) {
    for (size_t off = 0; off < bytes;) {
        size_t len = ZS_MIN(mc->g->chunk, bytes - off);
        int e = MPI_Ibcast(buf + off, (int)len, MPI_BYTE, root, my_comm(mc), &mc->rq);
        ZS_CHECK(finish(mc, e, what, "MPI_Ibcast"));
        off += len;
    }
    return 0;
}

/* ---- the common steps -------------------------------------------------------------------- */

/* The local ranks' verdict, the same on each of them (they see the same slots): 0, or an
 * error code with the message set. */
static int local_verdict(mpi_comm *mc) {
    group *g = mc->g;
    int base = g->proc * g->n;
    const zs_comm_slot *s = g->lg.slots;
    ZS_CHECK(zs_comm_group_check(&g->lg, "mpi", base));
    for (int r = 0; r < g->n; r++)
        if (s[r].prep < 0)
            return zs_err(s[r].prep, "comm mpi %s: rank %d cannot take part: out of memory for "
                          "its scratch buffer", zs_comm_group_kind_name(s[0].kind), base + r);
    return 0;
}

/* Step 2: exchanges headers with the other processes. Returns 0 when they agree, else an
 * error code, the same on every rank of the world when each exchange completed. *worst: the
 * minimum status (agree). */
static int exchange(mpi_comm *mc, int verdict, int *worst) {
    group *g = mc->g;
    const zs_comm_slot *s = &g->lg.slots[0];
    const char *what = zs_comm_group_kind_name(s->kind);
    hdr *h = &mc->hsend;
    memset(h, 0, sizeof *h);
    h->kind = verdict < 0 ? ZS_COLL_BAD : s->kind;
    h->dt = s->dt;
    h->op = s->op;
    h->root = s->root;
    h->size = s->size;
    h->status = verdict;
    if (verdict == 0 && s->kind == ZS_COLL_AGREE) h->status = zs_comm_group_worst(&g->lg);
    int e = MPI_Iallgather(h, (int)sizeof *h, MPI_BYTE, mc->hrecv, (int)sizeof *h, MPI_BYTE,
                           my_comm(mc), &mc->rq);
    int rc = finish(mc, e, what, "MPI_Iallgather (header)");
    if (rc < 0 || verdict < 0) return rc < 0 ? rc : verdict; /* keep our own message */
    const hdr *h0 = &mc->hrecv[0];
    int w = 0;
    for (int p = 0; p < g->nproc; p++) {
        const hdr *hp = &mc->hrecv[p];
        if (hp->kind == ZS_COLL_BAD)
            return zs_err(hp->status < 0 ? hp->status : ZS_EINVAL,
                          "comm mpi %s (rank %d of %d): process %d failed the collective (its "
                          "ranks disagree or cannot take part; see its log)", what,
                          mc->base.rank, mc->base.size, p);
        if (hp->kind != h0->kind || hp->size != h0->size || hp->dt != h0->dt ||
            hp->op != h0->op || hp->root != h0->root) {
            char a[96], b[96];
            zs_comm_group_describe(h0->kind, (size_t)h0->size, h0->dt, h0->op, h0->root, a,
                                   sizeof a);
            zs_comm_group_describe(hp->kind, (size_t)hp->size, hp->dt, hp->op, hp->root, b,
                                   sizeof b);
            return zs_err(ZS_EINVAL, "comm mpi: processes disagree on the collective: process "
                          "0 called %s, process %d called %s", a, p, b);
        }
        w = ZS_MIN(w, hp->status);
    }
    if (worst) *worst = w;
    return 0;
}

/* In-process barrier that settles the outcome of the MPI step: 0 when every local rank
 * succeeded; else this rank's own error, or ZS_ECANCELLED when another local rank failed. */
static int settle(mpi_comm *mc, int rc, const char *what) {
    group *g = mc->g;
    g->lg.slots[mc->li].work = rc;
    zs_comm_group_sync(&g->lg, 0);
    if (rc < 0) return rc;
    for (int r = 0; r < g->n; r++)
        if (g->lg.slots[r].work < 0)
            return zs_err(ZS_ECANCELLED, "comm mpi %s (rank %d of %d): rank %d failed (group "
                          "aborted)", what, mc->base.rank, mc->base.size, g->proc * g->n + r);
    return 0;
}

/* Steps 1-2. Returns ZS_ECANCELLED (message set) when the in-process barrier was aborted: the
 * caller returns at once. Otherwise 0 with *verdict: 0 to do the work, or the error every
 * local rank returns after leave(); the barriers that follow are the same on every local rank
 * whatever its verdict. */
static int enter(mpi_comm *mc, const zs_comm_slot *mine, int *verdict, int *worst) {
    group *g = mc->g;
    if (zs_comm_group_enter(&g->lg, mc->li, mine) < 0)
        return cancelled(mc, zs_comm_group_kind_name(mine->kind));
    int v = local_verdict(mc);
    if (worst && v == 0) *worst = zs_comm_group_worst(&g->lg);
    if (g->nproc > 1) v = exchange(mc, v, worst);
    *verdict = v;
    return 0;
}

/* Step 4 and the result. */
static int leave(mpi_comm *mc, int rc) {
    zs_comm_group_sync(&mc->g->lg, 0);
    return rc;
}

/* Grows the handle's scratch to `bytes` (kept between calls). */
static int need_scratch(mpi_comm *mc, size_t bytes) {
    if (bytes <= mc->scratch_cap) return 0;
    void *p = zs_aligned_alloc(64, bytes);
    if (!p) return ZS_ENOMEM;
    free(mc->scratch);
    mc->scratch = p;
    mc->scratch_cap = bytes;
    return 0;
}

/* The world's ranks as reduction sources, in rank order, each off bytes into its data: world
 * rank p*n + k is part p (blk bytes a part) of local rank k's scratch with several processes,
 * local rank k's send with one. */
static void world_sources(mpi_comm *mc, size_t blk, size_t off) {
    group *g = mc->g;
    for (int p = 0; p < g->nproc; p++)
        for (int k = 0; k < g->n; k++) {
            const zs_comm_slot *s = &g->lg.slots[k];
            const char *src =
                g->nproc > 1 ? (const char *)s->scratch + (size_t)p * blk : (const char *)s->send;
            mc->srcs[p * g->n + k] = src + off;
        }
}

/* ---- the collectives --------------------------------------------------------------------- */

static int mpi_all_gather(zs_comm *c, const void *send, void *recv, size_t bytes,
                          void *stream) {
    (void)stream;
    mpi_comm *mc = (mpi_comm *)c;
    group *g = mc->g;
    int n = g->n, li = mc->li, v;
    zs_comm_slot me = zs_comm_group_slot(ZS_COLL_ALL_GATHER, bytes, send, recv);
    if (enter(mc, &me, &v, NULL) < 0) return ZS_ECANCELLED;
    if (g->nproc > 1) {
        int rc = v;
        if (rc == 0 && bytes) {
            /* column li: the blocks of local index li of every process, n*bytes apart */
            char *col = (char *)recv + (size_t)li * bytes;
            int inplace = send == (char *)recv + (size_t)c->rank * bytes;
            rc = gather_blocks(mc, inplace ? NULL : send, col, bytes, (size_t)n * bytes,
                               "all_gather");
        }
        v = settle(mc, rc, "all_gather");
    }
    if (v == 0 && bytes) {
        /* start at our own index so the ranks do not all read one buffer at once */
        for (int t = g->nproc > 1; t < n; t++) {
            int k = (li + t) % n;
            for (int p = 0; p < g->nproc; p++) {
                size_t off = ((size_t)p * n + k) * bytes;
                char *dst = (char *)recv + off;
                const char *src = g->nproc > 1 ? (const char *)g->lg.slots[k].recv + off
                                               : (const char *)g->lg.slots[k].send;
                if (src != dst) memcpy(dst, src, bytes);
            }
        }
    }
    return leave(mc, v);
}

static int mpi_reduce_scatter(zs_comm *c, const void *send, void *recv, size_t count,
                              zs_dtype dt, zs_redop op, void *stream) {
    (void)stream;
    mpi_comm *mc = (mpi_comm *)c;
    group *g = mc->g;
    int n = g->n, li = mc->li, v;
    size_t es = zs_dtype_size(dt), sub = count * es, blk = (size_t)n * sub; /* per process */
    zs_comm_slot me = zs_comm_group_slot(ZS_COLL_REDUCE_SCATTER, count, send, recv);
    me.dt = dt;
    me.op = op;
    if (g->nproc > 1 && count) {
        me.prep = need_scratch(mc, (size_t)g->nproc * blk);
        me.scratch = mc->scratch;
    }
    if (enter(mc, &me, &v, NULL) < 0) return ZS_ECANCELLED;
    if (g->nproc > 1) {
        int rc = v;
        if (rc == 0 && count) rc = all_to_all(mc, send, mc->scratch, blk, "reduce_scatter");
        v = settle(mc, rc, "reduce_scatter");
    }
    if (v == 0 && count) {
        /* world rank q = p*n + k sent its block for us to thread k of our process, part p */
        world_sources(mc, blk, (size_t)li * sub);
        /* in place, recv is our own send block, which only we read (MPI has read it already
         * with several processes); the reduction writes each chunk after reading it */
        zs_comm_host_reduce(recv, mc->srcs, c->size, count, dt, op);
    }
    return leave(mc, v);
}

static int mpi_all_reduce(zs_comm *c, const void *send, void *recv, size_t count, zs_dtype dt,
                          zs_redop op, void *stream) {
    (void)stream;
    mpi_comm *mc = (mpi_comm *)c;
    group *g = mc->g;
    int n = g->n, li = mc->li, v;
    size_t es = zs_dtype_size(dt), blk = count * es;
    zs_comm_slot me = zs_comm_group_slot(ZS_COLL_ALL_REDUCE, count, send, recv);
    me.dt = dt;
    me.op = op;
    if (g->nproc > 1 && count) {
        me.prep = need_scratch(mc, (size_t)g->nproc * blk);
        me.scratch = mc->scratch;
    }
    if (enter(mc, &me, &v, NULL) < 0) return ZS_ECANCELLED;
    if (g->nproc > 1) {
        int rc = v;
        if (rc == 0 && count)
            rc = gather_blocks(mc, send, mc->scratch, blk, blk, "all_reduce");
        v = settle(mc, rc, "all_reduce");
    }
    if (v == 0) {
        /* reduce part li over every world rank, in rank order */
        size_t lo, hi;
        zs_comm_group_part(count, n, li, &lo, &hi);
        if (hi > lo) {
            world_sources(mc, blk, lo * es);
            zs_comm_host_reduce((char *)recv + lo * es, mc->srcs, c->size, hi - lo, dt, op);
        }
        /* every part is final, and no rank reads a send buffer any more */
        if (n > 1) zs_comm_group_sync(&g->lg, 0);
        zs_comm_group_gather_parts(&g->lg, li, recv, count, es);
    }
    return leave(mc, v);
}

static int mpi_broadcast(zs_comm *c, void *buf, size_t bytes, int root, void *stream) {
    (void)stream;
    mpi_comm *mc = (mpi_comm *)c;
    group *g = mc->g;
    int n = g->n, li = mc->li, v;
    int rproc = root / n, rli = root % n;
    zs_comm_slot me = zs_comm_group_slot(ZS_COLL_BROADCAST, bytes, buf, buf);
    me.root = root;
    if (enter(mc, &me, &v, NULL) < 0) return ZS_ECANCELLED;
    const char *rbuf = g->lg.slots[rli].send; /* the root's buffer, in the root's process */
    size_t lo, hi;
    if (g->nproc > 1) {
        int rc = v;
        zs_comm_group_part(bytes, n, li, &lo, &hi);
        if (rc == 0 && hi > lo) {
            char *b = g->proc == rproc ? (char *)rbuf : (char *)buf;
            rc = bcast_bytes(mc, b + lo, hi - lo, rproc, "broadcast");
        }
        v = settle(mc, rc, "broadcast");
    }
    if (v == 0 && bytes) {
        if (g->proc == rproc) {
            if (c->rank != root && rbuf != buf) memcpy(buf, rbuf, bytes);
        } else {
            zs_comm_group_gather_parts(&g->lg, li, buf, bytes, 1); /* recv == send == buf */
        }
    }
    return leave(mc, v);
}

static int mpi_barrier(zs_comm *c) {
    mpi_comm *mc = (mpi_comm *)c;
    int v;
    zs_comm_slot me = zs_comm_group_slot(ZS_COLL_BARRIER, 0, NULL, NULL);
    if (enter(mc, &me, &v, NULL) < 0) return ZS_ECANCELLED;
    if (mc->g->nproc > 1) v = settle(mc, v, "barrier");
    return leave(mc, v);
}

static int mpi_agree(zs_comm *c, int local_status, int *global_status) {
    mpi_comm *mc = (mpi_comm *)c;
    int v, worst = 0;
    zs_comm_slot me = zs_comm_group_slot(ZS_COLL_AGREE, 0, NULL, NULL);
    me.status = local_status;
    if (enter(mc, &me, &v, &worst) < 0) return ZS_ECANCELLED;
    if (mc->g->nproc > 1) v = settle(mc, v, "agree");
    v = leave(mc, v);
    if (v == 0) *global_status = worst;
    return v;
}

/* ---- lifetime ---------------------------------------------------------------------------- */

/* Frees what is left of the group (the last handle is gone). Communicators with a request
 * left pending, and the group itself while an abort notice may still be in flight, are
 * deliberately leaked: MPI may still use them. */
static void group_destroy(group *g) {
    int mpi_ok = g->nproc > 1 && g->comms && !zs_cluster_lost(NULL, 0) && !mpi_down();
    int leak = 0;
    if (mpi_ok) {
        pthread_mutex_lock(&g->amu);
        if (g->notice_rq != MPI_REQUEST_NULL) {
            MPI_Cancel(&g->notice_rq);
            MPI_Wait(&g->notice_rq, MPI_STATUS_IGNORE);
        }
        pthread_mutex_unlock(&g->amu);
        if (atomic_load(&g->notified)) { /* 8-byte sends: give them a moment */
            int done = 0;
            for (int i = 0; i < 2000 && !done; i++) {
                if (MPI_Testall(g->nproc, g->notice_sends, &done, MPI_STATUSES_IGNORE) !=
                    MPI_SUCCESS)
                    break;
                if (!done) {
                    struct timespec ts = {0, 500000};
                    nanosleep(&ts, NULL);
                }
            }
            leak = !done;
        }
        if (!leak)
            for (int i = 0; i < g->n; i++)
                if (g->handles[i] >= 0 && !g->keep[i]) zs_cluster_free_mpi_comm(g->handles[i]);
    } else if (g->nproc > 1) {
        leak = 1; /* a lost cluster or MPI finalized: leave MPI's state alone */
    }
    if (leak) return;
    zs_comm_group_destroy(&g->lg);
    pthread_mutex_destroy(&g->amu);
    free(g->handles);
    free(g->comms);
    free(g->keep);
    free(g->notice_sends);
    free(g);
}

/* A request given up on (mc->pending): poll it to completion for up to timeout_s, so that its
 * buffers can be freed. The peers' halves of the collective progress in their own MPI calls. */
static int mpi_settle(zs_comm *c, double timeout_s) {
    mpi_comm *mc = (mpi_comm *)c;
    if (!mc->pending) return 0;
    if (zs_cluster_lost(NULL, 0) || mpi_down()) return 1;
    double t0 = zs_now();
    long polls = 0;
    while (zs_now() - t0 < timeout_s && !zs_cluster_lost(NULL, 0)) {
        int done = 0;
        if (MPI_Test(&mc->rq, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return 1;
        if (done) {
            drop_type(mc);
            mc->pending = 0;
            return 0;
        }
        backoff(&polls);
    }
    return 1;
}

static void free_handle(mpi_comm *mc) {
    free(mc->srcs);
    free(mc->scratch);
    free(mc->hrecv);
    free(mc);
}

static void mpi_free(zs_comm *c) {
    mpi_comm *mc = (mpi_comm *)c;
    group *g = mc->g;
    if (mc->pending) g->keep[mc->li] = 1; /* read by the last one after the release */
    int last = zs_comm_group_release(&g->lg);
    if (!mc->pending) free_handle(mc); /* else MPI may still write its buffers: leak it */
    if (last) group_destroy(g);
}

static const zs_comm_ops mpi_ops = {
    .name = "mpi",
    .all_gather = mpi_all_gather,
    .reduce_scatter = mpi_reduce_scatter,
    .all_reduce = mpi_all_reduce,
    .broadcast = mpi_broadcast,
    .barrier = mpi_barrier,
    .agree = mpi_agree,
    .abort = mpi_abort,
    .free = mpi_free,
    .settle = mpi_settle,
};

static size_t chunk_bytes(void) {
    const char *s = getenv("ZS_COMM_MPI_CHUNK");
    if (s && *s) {
        char *end;
        unsigned long long v = strtoull(s, &end, 10);
        if (*end == '\0' && v >= 1 && v <= INT32_MAX) return (size_t)v;
        zs_log_warn("comm mpi: ignoring ZS_COMM_MPI_CHUNK=%s (want bytes in [1, %d])", s,
                    INT32_MAX);
    }
    return DEFAULT_CHUNK;
}

/* Polls a request of the creation (no group to abort yet; a lost cluster cancels). */
static int wait_create(MPI_Request *rq, const char *call) {
    long polls = 0;
    for (;;) {
        int done = 0, e = MPI_Test(rq, &done, MPI_STATUS_IGNORE);
        if (e != MPI_SUCCESS) {
            char s[MPI_MAX_ERROR_STRING];
            int len = 0;
            MPI_Error_string(e, s, &len);
            return zs_err(ZS_EIO, "comm mpi create: %s failed: %.*s", call, len, s);
        }
        if (done) return 0;
        char lost[400];
        if (zs_cluster_lost(lost, sizeof lost))
            return zs_err(ZS_ECANCELLED, "comm mpi create: cluster lost: %s", lost);
        backoff(&polls);
    }
}

/* Several processes: n communicators, then a handshake on comm 0 that checks n everywhere,
 * agrees on every process's status and takes process 0's token. st: this process's status so
 * far (a failure still takes part, so that the others fail too instead of waiting; its message
 * is kept). *leak: an MPI request may still be pending, leave the communicators alone. */
typedef struct {
    int32_t n, status;
    uint64_t token;
} handshake;

static int join(group *g, int st, int *leak) {
    for (int i = 0; i < g->n; i++) {
        int rc = zs_cluster_new_mpi_comm(&g->handles[i]);
        if (rc < 0) { /* the peers may wait in theirs: a lost cluster ends that */
            g->handles[i] = -1;
            return rc;
        }
        g->comms[i] = MPI_Comm_f2c((MPI_Fint)g->handles[i]);
        MPI_Comm_set_errhandler(g->comms[i], MPI_ERRORS_RETURN);
    }
    static atomic_uint serial;
    /* all[nproc] is what we send; the buffers go to MPI, so they are heap (leaked on a loss) */
    handshake *all = calloc((size_t)g->nproc + 1, sizeof *all), *me = all + g->nproc;
    if (!all) return zs_err(ZS_ENOMEM, "comm mpi create: out of memory");
    *me = (handshake){g->n, st, ((uint64_t)getpid() << 32) | (atomic_fetch_add(&serial, 1) + 1)};
    MPI_Request rq;
    int e = MPI_Iallgather(me, (int)sizeof *me, MPI_BYTE, all, (int)sizeof *me, MPI_BYTE,
                           g->comms[0], &rq);
    int rc = e != MPI_SUCCESS ? zs_err(ZS_EIO, "comm mpi create: MPI_Iallgather failed")
                              : wait_create(&rq, "MPI_Iallgather");
    if (rc < 0) {
        *leak = 1;
        return rc;
    }
    g->token = all[0].token;
    for (int p = 0; p < g->nproc && rc == 0; p++) {
        if (all[p].status < 0)
            rc = st < 0 ? st
                        : zs_err(all[p].status, "comm mpi create: process %d failed (%s)", p,
                                 zs_strerror(all[p].status));
        else if (all[p].n != g->n)
            rc = zs_err(ZS_EINVAL, "comm mpi create: processes disagree on the ranks per "
                        "process: process %d has %d, process %d has %d", g->proc, g->n, p,
                        all[p].n);
    }
    free(all);
    if (rc == 0) post_notice_recv(g);
    return rc;
}

static void group_free_early(group *g) {
    if (g->handles)
        for (int i = 0; i < g->n; i++)
            if (g->handles[i] >= 0) zs_cluster_free_mpi_comm(g->handles[i]);
    pthread_mutex_destroy(&g->amu);
    zs_comm_group_destroy(&g->lg);
    free(g->handles);
    free(g->comms);
    free(g->keep);
    free(g->notice_sends);
    free(g);
}

int zs_comm_mpi_create(int n, zs_comm **comms) {
    if (n < 1 || n > MPI_MAX_LOCAL)
        return zs_err(ZS_EINVAL, "comm mpi: ranks per process %d out of range [1, %d]", n,
                      MPI_MAX_LOCAL);
    if (!comms) return zs_err(ZS_EINVAL, "comm mpi: NULL output array");
    int nproc = zs_cluster_size(), proc = zs_cluster_rank();
    if ((long long)n * nproc > MPI_MAX_RANKS)
        return zs_err(ZS_EINVAL, "comm mpi: %d processes x %d ranks exceed %d ranks", nproc, n,
                      MPI_MAX_RANKS);
    group *g = calloc(1, sizeof *g);
    if (!g) return zs_err(ZS_ENOMEM, "comm mpi: out of memory");
    g->n = n;
    g->nproc = nproc;
    g->proc = proc;
    g->size = n * nproc;
    g->chunk = chunk_bytes();
    g->notice_rq = MPI_REQUEST_NULL;
    int rc = zs_comm_group_init(&g->lg, n, nproc > 1 ? watch_barrier : NULL, g, "mpi");
    if (rc < 0) {
        free(g);
        return rc;
    }
    pthread_mutex_init(&g->amu, NULL);
    g->handles = malloc((size_t)n * sizeof *g->handles);
    g->comms = calloc((size_t)n, sizeof *g->comms);
    g->keep = calloc((size_t)n, 1);
    g->notice_sends = calloc((size_t)nproc, sizeof *g->notice_sends);
    if (!g->handles || !g->comms || !g->keep || !g->notice_sends) {
        free(g->handles); /* no communicator yet */
        g->handles = NULL;
        group_free_early(g);
        return zs_err(ZS_ENOMEM, "comm mpi: out of memory");
    }
    for (int i = 0; i < n; i++) {
        g->handles[i] = -1;
        g->comms[i] = MPI_COMM_NULL;
    }
    for (int p = 0; p < nproc; p++) g->notice_sends[p] = MPI_REQUEST_NULL;

    mpi_comm **mcs = calloc((size_t)n, sizeof *mcs);
    int st = mcs ? 0 : ZS_ENOMEM;
    for (int i = 0; st == 0 && i < n; i++) {
        mpi_comm *mc = mcs[i] = calloc(1, sizeof **mcs);
        if (!mc || !(mc->srcs = calloc((size_t)g->size, sizeof(void *))) ||
            !(mc->hrecv = calloc((size_t)nproc, sizeof(hdr)))) {
            st = ZS_ENOMEM;
            break;
        }
        mc->base.ops = &mpi_ops;
        mc->base.rank = proc * n + i;
        mc->base.size = g->size;
        mc->g = g;
        mc->li = i;
        mc->rq = MPI_REQUEST_NULL;
        mc->type = MPI_DATATYPE_NULL;
    }
    int leak = 0;
    rc = st < 0 ? zs_err(st, "comm mpi: out of memory") : 0;
    if (nproc > 1) rc = join(g, st, &leak);
    if (rc < 0) {
        for (int i = 0; mcs && i < n; i++)
            if (mcs[i]) free_handle(mcs[i]);
        free(mcs);
        if (!leak) group_free_early(g); /* else MPI may still use the group's communicators */
        return rc;
    }
    for (int i = 0; i < n; i++) comms[i] = &mcs[i]->base;
    free(mcs);
    return 0;
}
