/* comm-nccl.c — the NCCL communicator: n ranks in this process, one CUDA device each, created
 * with a single ncclCommInitAll call; or, across the processes of a cluster (cluster.h), one
 * NCCL world whose unique id process 0 broadcasts over MPI, joined with ncclCommInitRank for
 * each local device inside one NCCL group call (the nccl-tests pattern). Collectives are enqueued on the caller's stream (device
 * buffers); zs_comm_agree and zs_comm_barrier run on a small internal stream per rank and wait
 * for it by polling, so zs_comm_abort can release them. Built only with -DZS_CUDA=1; the
 * CUDA/NCCL headers stay inside this file.
 *
 * Abort: zs_comm_abort sets a flag of the group (any thread). Later calls return
 * ZS_ECANCELLED, and a rank waiting in agree/barrier stops waiting. Kernels already queued that
 * wait for a peer which never comes stay queued on the device until the handle is freed:
 * freeing a handle of an aborted group uses ncclCommAbort (which tears them down) instead of
 * ncclCommDestroy. Callers must not block on such streams themselves after an abort.
 *
 * Thread-safety: as in comm.h — one thread per handle; zs_comm_abort from anywhere. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "cluster.h"
#include "comm-impl.h"
#include "common.h"

typedef struct {
    int n;
    atomic_int aborted;
    pthread_mutex_t mu;
    int refs;
} ngroup;

typedef struct {
    zs_comm base;
    ngroup *g;
    ncclComm_t nc;
    int dev;
    cudaStream_t stream;   /* internal: agree, barrier */
    int32_t *d_buf;        /* device: [0] agree, [1] barrier (always 0) */
    int32_t *h_buf;        /* pinned host: agree result */
} nccl_comm;

static const zs_comm_ops nccl_ops;

static int nccl_fail(ncclResult_t r, const char *what, const nccl_comm *c) {
    int code = (r == ncclInvalidArgument || r == ncclInvalidUsage) ? ZS_EINVAL : ZS_EDEVICE;
    if (c)
        return zs_err(code, "comm nccl %s (rank %d of %d, device %d): %s", what, c->base.rank,
                      c->base.size, c->dev, ncclGetErrorString(r));
    return zs_err(code, "comm nccl %s: %s", what, ncclGetErrorString(r));
}

static int cuda_fail(cudaError_t e, const char *what, const nccl_comm *c) {
    if (c)
        return zs_err(ZS_EDEVICE, "comm nccl %s (rank %d of %d, device %d): %s", what,
                      c->base.rank, c->base.size, c->dev, cudaGetErrorString(e));
    return zs_err(ZS_EDEVICE, "comm nccl %s: %s", what, cudaGetErrorString(e));
}

static int map_dtype(zs_dtype dt, ncclDataType_t *out) {
    switch (dt) {
    case ZS_F32: *out = ncclFloat32; return 0;
    case ZS_F16: *out = ncclFloat16; return 0;
    case ZS_BF16: *out = ncclBfloat16; return 0;
    default: return zs_err(ZS_EUNSUPPORTED, "comm nccl: unsupported dtype %d", (int)dt);
    }
}

static ncclRedOp_t map_op(zs_redop op) { return op == ZS_RED_MAX ? ncclMax : ncclSum; }

/* Common prologue of every call: not aborted, and the rank's device is current. */
static int begin(nccl_comm *c, const char *what) {
    if (atomic_load(&c->g->aborted))
        return zs_err(ZS_ECANCELLED, "comm nccl %s (rank %d of %d): group aborted", what,
                      c->base.rank, c->base.size);
    cudaError_t e = cudaSetDevice(c->dev);
    if (e != cudaSuccess) return cuda_fail(e, "cudaSetDevice", c);
    return 0;
}

/* Waits for the internal stream, polling so that an abort or an asynchronous NCCL error ends
 * the wait. */
static int wait_stream(nccl_comm *c, const char *what) {
    for (unsigned long it = 0;; it++) {
        cudaError_t e = cudaStreamQuery(c->stream);
        if (e == cudaSuccess) return 0;
        if (e != cudaErrorNotReady) return cuda_fail(e, what, c);
        ncclResult_t ar = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(c->nc, &ar);
        if (r != ncclSuccess) return nccl_fail(r, "ncclCommGetAsyncError", c);
        if (ar != ncclSuccess && ar != ncclInProgress) return nccl_fail(ar, what, c);
        if (atomic_load(&c->g->aborted))
            return zs_err(ZS_ECANCELLED, "comm nccl %s (rank %d of %d): group aborted", what,
                          c->base.rank, c->base.size);
        if (it < 1000) {
            sched_yield();
        } else {
            struct timespec ts = {0, 50 * 1000};
            nanosleep(&ts, NULL);
        }
    }
}

static int nccl_all_gather(zs_comm *zc, const void *send, void *recv, size_t bytes,
                           void *stream) {
    nccl_comm *c = (nccl_comm *)zc;
    ZS_CHECK(begin(c, "all_gather"));
    ncclResult_t r = ncclAllGather(send, recv, bytes, ncclInt8, c->nc, (cudaStream_t)stream);
    return r == ncclSuccess ? 0 : nccl_fail(r, "ncclAllGather", c);
}

static int nccl_reduce_scatter(zs_comm *zc, const void *send, void *recv, size_t count,
                               zs_dtype dt, zs_redop op, void *stream) {
    nccl_comm *c = (nccl_comm *)zc;
    ncclDataType_t t = ncclFloat32;
    ZS_CHECK(begin(c, "reduce_scatter"));
    ZS_CHECK(map_dtype(dt, &t));
    ncclResult_t r =
        ncclReduceScatter(send, recv, count, t, map_op(op), c->nc, (cudaStream_t)stream);
    return r == ncclSuccess ? 0 : nccl_fail(r, "ncclReduceScatter", c);
}

static int nccl_all_reduce(zs_comm *zc, const void *send, void *recv, size_t count, zs_dtype dt,
                           zs_redop op, void *stream) {
    nccl_comm *c = (nccl_comm *)zc;
    ncclDataType_t t = ncclFloat32;
    ZS_CHECK(begin(c, "all_reduce"));
    ZS_CHECK(map_dtype(dt, &t));
    ncclResult_t r = ncclAllReduce(send, recv, count, t, map_op(op), c->nc, (cudaStream_t)stream);
    return r == ncclSuccess ? 0 : nccl_fail(r, "ncclAllReduce", c);
}

static int nccl_broadcast(zs_comm *zc, void *buf, size_t bytes, int root, void *stream) {
    nccl_comm *c = (nccl_comm *)zc;
    ZS_CHECK(begin(c, "broadcast"));
    ncclResult_t r = ncclBroadcast(buf, buf, bytes, ncclInt8, root, c->nc, (cudaStream_t)stream);
    return r == ncclSuccess ? 0 : nccl_fail(r, "ncclBroadcast", c);
}

static int nccl_barrier(zs_comm *zc) {
    nccl_comm *c = (nccl_comm *)zc;
    ZS_CHECK(begin(c, "barrier"));
    /* d_buf[1] is 0 on every rank, so its sum stays 0 */
    ncclResult_t r =
        ncclAllReduce(c->d_buf + 1, c->d_buf + 1, 1, ncclInt32, ncclSum, c->nc, c->stream);
    if (r != ncclSuccess) return nccl_fail(r, "ncclAllReduce (barrier)", c);
    return wait_stream(c, "barrier");
}

static int nccl_agree(zs_comm *zc, int local_status, int *global_status) {
    nccl_comm *c = (nccl_comm *)zc;
    ZS_CHECK(begin(c, "agree"));
    /* the previous agree on this handle finished (we waited for it), so h_buf is free */
    *c->h_buf = (int32_t)local_status;
    cudaError_t e =
        cudaMemcpyAsync(c->d_buf, c->h_buf, sizeof(int32_t), cudaMemcpyHostToDevice, c->stream);
    if (e != cudaSuccess) return cuda_fail(e, "cudaMemcpyAsync (agree)", c);
    ncclResult_t r = ncclAllReduce(c->d_buf, c->d_buf, 1, ncclInt32, ncclMin, c->nc, c->stream);
    if (r != ncclSuccess) return nccl_fail(r, "ncclAllReduce (agree)", c);
    e = cudaMemcpyAsync(c->h_buf, c->d_buf, sizeof(int32_t), cudaMemcpyDeviceToHost, c->stream);
    if (e != cudaSuccess) return cuda_fail(e, "cudaMemcpyAsync (agree)", c);
    ZS_CHECK(wait_stream(c, "agree"));
    *global_status = (int)*c->h_buf;
    return 0;
}

static void nccl_abort(zs_comm *zc) {
    nccl_comm *c = (nccl_comm *)zc;
    atomic_store(&c->g->aborted, 1);
}

/* Releases one rank's resources (any of them may be missing after a failed create). */
static void release_rank(nccl_comm *c, int aborted) {
    int prev = -1;
    cudaGetDevice(&prev);
    cudaSetDevice(c->dev);
    if (c->nc) {
        ncclResult_t r = aborted ? ncclCommAbort(c->nc) : ncclCommDestroy(c->nc);
        if (r != ncclSuccess)
            zs_log_warn("comm nccl: releasing rank %d: %s", c->base.rank, ncclGetErrorString(r));
    }
    if (c->stream) cudaStreamDestroy(c->stream);
    if (c->d_buf) cudaFree(c->d_buf);
    if (c->h_buf) cudaFreeHost(c->h_buf);
    if (prev >= 0) cudaSetDevice(prev);
    free(c);
}

static void group_release(ngroup *g) {
    pthread_mutex_lock(&g->mu);
    int last = --g->refs == 0;
    pthread_mutex_unlock(&g->mu);
    if (last) {
        pthread_mutex_destroy(&g->mu);
        free(g);
    }
}

static void nccl_free(zs_comm *zc) {
    nccl_comm *c = (nccl_comm *)zc;
    ngroup *g = c->g;
    release_rank(c, atomic_load(&g->aborted));
    group_release(g);
}

static const zs_comm_ops nccl_ops = {
    .name = "nccl",
    .all_gather = nccl_all_gather,
    .reduce_scatter = nccl_reduce_scatter,
    .all_reduce = nccl_all_reduce,
    .broadcast = nccl_broadcast,
    .barrier = nccl_barrier,
    .agree = nccl_agree,
    .abort = nccl_abort,
    .free = nccl_free,
};

/* Per-rank stream and buffers on the rank's device (current device set by the caller). */
static int setup_rank(nccl_comm *c) {
    cudaError_t e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        c->stream = NULL;
        return cuda_fail(e, "cudaStreamCreate", c);
    }
    e = cudaMalloc((void **)&c->d_buf, 2 * sizeof(int32_t));
    if (e != cudaSuccess) {
        c->d_buf = NULL;
        return cuda_fail(e, "cudaMalloc", c);
    }
    e = cudaMemset(c->d_buf, 0, 2 * sizeof(int32_t));
    if (e != cudaSuccess) return cuda_fail(e, "cudaMemset", c);
    e = cudaMallocHost((void **)&c->h_buf, sizeof(int32_t));
    if (e != cudaSuccess) {
        c->h_buf = NULL;
        return cuda_fail(e, "cudaMallocHost", c);
    }
    e = cudaDeviceSynchronize(); /* the memset is done before any rank's first collective */
    if (e != cudaSuccess) return cuda_fail(e, "cudaDeviceSynchronize", c);
    return 0;
}

/* uid NULL: ncclCommInitAll over this process's devices; else world ranks first..first+n-1 of
 * a world of `world` ranks through ncclCommInitRank. */
static int create_group(int n, const int *devs, zs_comm **comms, int world, int first, const ncclUniqueId *uid) {
    if (n < 1) return zs_err(ZS_EINVAL, "comm nccl: group size %d must be at least 1", n);
    if (!devs || !comms) return zs_err(ZS_EINVAL, "comm nccl: NULL device list or output array");
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess)
        return zs_err(ZS_EDEVICE, "comm nccl: no usable CUDA device: %s", cudaGetErrorString(e));
    for (int i = 0; i < n; i++) {
        if (devs[i] < 0 || devs[i] >= ndev)
            return zs_err(ZS_EINVAL, "comm nccl: rank %d: device %d does not exist (%d visible)",
                          i, devs[i], ndev);
        for (int j = 0; j < i; j++)
            if (devs[j] == devs[i])
                return zs_err(ZS_EINVAL, "comm nccl: ranks %d and %d both use device %d", j, i,
                              devs[i]);
    }

    int prev = 0;
    cudaGetDevice(&prev);
    ngroup *g = calloc(1, sizeof *g);
    ncclComm_t *ncs = calloc((size_t)n, sizeof *ncs);
    nccl_comm **cs = calloc((size_t)n, sizeof *cs);
    int rc = 0;
    if (!g || !ncs || !cs) {
        free(g);
        free(ncs);
        free(cs);
        return zs_err(ZS_ENOMEM, "comm nccl: out of memory");
    }
    g->n = n;
    atomic_init(&g->aborted, 0);
    if (pthread_mutex_init(&g->mu, NULL)) {
        free(g);
        free(ncs);
        free(cs);
        return zs_err(ZS_EIO, "comm nccl: pthread_mutex_init failed");
    }

    /* one call, from this thread, for all ranks of the process */
    ncclResult_t r;
    if (!uid) {
        r = ncclCommInitAll(ncs, n, devs);
    } else {
        r = ncclGroupStart();
        for (int i = 0; r == ncclSuccess && i < n; i++) {
            cudaSetDevice(devs[i]);
            r = ncclCommInitRank(&ncs[i], world, *uid, first + i);
        }
        ncclResult_t r2 = ncclGroupEnd();
        if (r == ncclSuccess) r = r2;
    }
    if (r != ncclSuccess) {
        rc = nccl_fail(r, uid ? "ncclCommInitRank" : "ncclCommInitAll", NULL);
        for (int i = 0; uid && i < n; i++)
            if (ncs[i]) ncclCommAbort(ncs[i]);
        memset(ncs, 0, (size_t)n * sizeof *ncs);
    }
    for (int i = 0; rc == 0 && i < n; i++) {
        cs[i] = calloc(1, sizeof **cs);
        if (!cs[i]) {
            rc = zs_err(ZS_ENOMEM, "comm nccl: out of memory");
            break;
        }
        cs[i]->base.ops = &nccl_ops;
        cs[i]->base.rank = first + i;
        cs[i]->base.size = world;
        cs[i]->g = g;
        cs[i]->nc = ncs[i];
        cs[i]->dev = devs[i];
        ncs[i] = NULL; /* owned by cs[i] now */
        e = cudaSetDevice(devs[i]);
        rc = e != cudaSuccess ? cuda_fail(e, "cudaSetDevice", cs[i]) : setup_rank(cs[i]);
    }
    if (rc < 0) {
        for (int i = 0; i < n; i++) {
            if (cs[i]) release_rank(cs[i], 1);
            else if (ncs[i]) ncclCommAbort(ncs[i]);
        }
        pthread_mutex_destroy(&g->mu);
        free(g);
        free(ncs);
        free(cs);
        cudaSetDevice(prev);
        return rc;
    }
    g->refs = n;
    for (int i = 0; i < n; i++) comms[i] = &cs[i]->base;
    free(ncs);
    free(cs);
    cudaSetDevice(prev);
    int ver = 0;
    ncclGetVersion(&ver);
    zs_log_debug("comm nccl: %d of %d ranks, NCCL %d", n, world, ver);
    return 0;
}

int zs_comm_nccl_create(int n, const int *devs, zs_comm **comms) {
    return create_group(n, devs, comms, n, 0, NULL);
}

int zs_comm_nccl_create_cluster(int n, const int *devs, zs_comm **comms) {
    int P = zs_cluster_size(), me = zs_cluster_rank();
    if (P == 1) return zs_comm_nccl_create(n, devs, comms);
    /* process 0 makes the id; a failure there still sends (zeros) so that nobody waits, and the
     * status travels with it */
    struct { ncclUniqueId id; int32_t status; } u;
    memset(&u, 0, sizeof u);
    if (me == 0) {
        ncclResult_t r = ncclGetUniqueId(&u.id);
        u.status = r == ncclSuccess ? 0 : ZS_EDEVICE;
        if (r != ncclSuccess) nccl_fail(r, "ncclGetUniqueId", NULL);
    }
    ZS_CHECK(zs_cluster_bcast(&u, sizeof u, 0));
    if (u.status < 0)
        return me == 0 ? u.status : zs_err(u.status, "comm nccl: process 0 could not create the NCCL unique id");
    return create_group(n, devs, comms, n * P, me * n, &u.id);
}
