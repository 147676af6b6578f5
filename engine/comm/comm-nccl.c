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
 * libnccl.so.2 is not linked: it is loaded with dlopen on the first create (the binary starts
 * without it; on a GPU machine it often lives only inside a Python venv), and every function is
 * called through a table resolved with dlsym (nccl.h's declarations give the types). Where it is
 * looked for, in order: $ZS_NCCL_LIB (a file), libnccl.so.2 (the loader's search path,
 * LD_LIBRARY_PATH), $CUDA_HOME/lib64, /usr/local/cuda/lib64, and the nvidia/nccl/lib directory
 * of the Python venvs and system packages (nccl_load_once lists the glob patterns). Without
 * it, creating a communicator fails with ZS_EDEVICE naming what was tried (world.c then uses
 * the in-process communicator; ranks sharing one GPU never need NCCL).
 *
 * Thread-safety: as in comm.h — one thread per handle; zs_comm_abort from anywhere. Loading the
 * library is once per process (pthread_once); the table is read-only afterwards. */
#define _GNU_SOURCE /* dladdr */
#include <dlfcn.h>
#include <glob.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "cluster.h"
#include "comm-impl.h"
#include "common.h"

/* ---- libnccl.so.2, loaded at run time ---- */

#define NCCL_FUNCS(X)                                                                             \
    X(ncclGetVersion) X(ncclGetUniqueId) X(ncclCommInitRank) X(ncclCommInitAll) X(ncclCommDestroy) \
    X(ncclCommAbort) X(ncclCommGetAsyncError) X(ncclGetErrorString) X(ncclGroupStart)             \
    X(ncclGroupEnd) X(ncclAllGather) X(ncclReduceScatter) X(ncclAllReduce) X(ncclBroadcast)

/* the functions of the loaded library, typed as nccl.h declares them (no link-time reference) */
static struct {
#define NCCL_PTR(name) __typeof__(name) *name;
    NCCL_FUNCS(NCCL_PTR)
#undef NCCL_PTR
} nc;

static pthread_once_t nccl_once = PTHREAD_ONCE_INIT;
static int nccl_loaded;          /* every function resolved */
static char nccl_tried[640];     /* what was tried and why it failed, for the error */

static void tried(const char *what, const char *why) {
    size_t n = strlen(nccl_tried);
    if (n + 8 >= sizeof nccl_tried) return;
    snprintf(nccl_tried + n, sizeof nccl_tried - n, "%s%s (%.120s)", n ? "; " : "", what, why);
}

/* Opens path and resolves the table; 1 on success, else 0 with the reason noted. */
static int try_open(const char *path) {
    if (strchr(path, '/') && access(path, F_OK) != 0) {
        tried(path, "absent");
        return 0;
    }
    dlerror();
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        tried(path, e ? e : "dlopen failed");
        return 0;
    }
    void *sym;
#define NCCL_SYM(name)                                                                            \
    if (!(sym = dlsym(h, #name))) {                                                               \
        tried(path, "no " #name);                                                                 \
        memset(&nc, 0, sizeof nc);                                                                \
        dlclose(h);                                                                               \
        return 0;                                                                                 \
    }                                                                                             \
    nc.name = (__typeof__(nc.name))sym;
    NCCL_FUNCS(NCCL_SYM)
#undef NCCL_SYM
    /* the file the loader picked (a bare name resolves through the search path) */
    Dl_info di;
    const char *file = dladdr(sym, &di) && di.dli_fname ? di.dli_fname : path;
    int v = 0;
    if (nc.ncclGetVersion(&v) != ncclSuccess) v = 0;
    /* NCCL_VERSION: X*1000 + Y*100 + Z up to 2.8, X*10000 + Y*100 + Z from 2.9 */
    int major = v >= 10000 ? v / 10000 : v / 1000, minor = v >= 10000 ? v / 100 % 100 : v / 100 % 10;
    zs_log_info("comm nccl: loaded %s (NCCL %d.%d.%d)", file, major, minor, v % 100);
    return 1;
}

static int try_glob(const char *pattern) {
    glob_t g;
    int r = glob(pattern, 0, NULL, &g), ok = 0; /* glob initialises g even when it fails */
    if (r != 0) tried(pattern, r == GLOB_NOMATCH ? "no match" : "glob failed");
    for (size_t i = 0; r == 0 && !ok && i < g.gl_pathc; i++) ok = try_open(g.gl_pathv[i]);
    globfree(&g);
    return ok;
}

static void nccl_load_once(void) {
    char p[PATH_MAX];
    const char *env = getenv("ZS_NCCL_LIB"), *cuda = getenv("CUDA_HOME");
    int ok = 0;
    if (env && *env) {
        if (!(ok = try_open(env))) zs_log_warn("comm nccl: ZS_NCCL_LIB=%s does not load; trying the usual places", env);
    }
    if (!ok) ok = try_open("libnccl.so.2");
    if (!ok && cuda && *cuda && strcmp(cuda, "/usr/local/cuda") && strcmp(cuda, "/usr/local/cuda/")) {
        snprintf(p, sizeof p, "%s/lib64/libnccl.so.2", cuda);
        ok = try_open(p);
    }
    if (!ok) ok = try_open("/usr/local/cuda/lib64/libnccl.so.2");
    if (!ok) ok = try_glob("/opt/*/.venv/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2");
    if (!ok) ok = try_glob("/usr/local/lib/python3*/dist-packages/nvidia/nccl/lib/libnccl.so.2");
    if (!ok) ok = try_open("/usr/lib/python3/dist-packages/nvidia/nccl/lib/libnccl.so.2");
    nccl_loaded = ok;
}

/* 0 once the library is loaded (the first call loads it), else ZS_EDEVICE saying where it was
 * looked for. */
static int nccl_load(void) {
    pthread_once(&nccl_once, nccl_load_once);
    if (nccl_loaded) return 0;
    return zs_err(ZS_EDEVICE,
                  "comm nccl: cannot load libnccl.so.2 (tried: %s); set ZS_NCCL_LIB to the file. One GPU needs "
                  "no NCCL: ranks that share one GPU use the in-process communicator",
                  nccl_tried);
}

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
                      c->base.size, c->dev, nc.ncclGetErrorString(r));
    return zs_err(code, "comm nccl %s: %s", what, nc.ncclGetErrorString(r));
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

/* Waits for a stream (the internal one, or a caller's with this rank's collectives on it),
 * polling so that an abort or an asynchronous NCCL error ends the wait. */
static int wait_on(nccl_comm *c, cudaStream_t s, const char *what) {
    for (unsigned long it = 0;; it++) {
        cudaError_t e = cudaStreamQuery(s);
        if (e == cudaSuccess) return 0;
        if (e != cudaErrorNotReady) return cuda_fail(e, what, c);
        ncclResult_t ar = ncclSuccess;
        ncclResult_t r = nc.ncclCommGetAsyncError(c->nc, &ar);
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
    ncclResult_t r = nc.ncclAllGather(send, recv, bytes, ncclInt8, c->nc, (cudaStream_t)stream);
    return r == ncclSuccess ? 0 : nccl_fail(r, "ncclAllGather", c);
}

static int nccl_reduce_scatter(zs_comm *zc, const void *send, void *recv, size_t count,
                               zs_dtype dt, zs_redop op, void *stream) {
    nccl_comm *c = (nccl_comm *)zc;
    ncclDataType_t t = ncclFloat32;
    ZS_CHECK(begin(c, "reduce_scatter"));
    ZS_CHECK(map_dtype(dt, &t));
    ncclResult_t r =
        nc.ncclReduceScatter(send, recv, count, t, map_op(op), c->nc, (cudaStream_t)stream);
    return r == ncclSuccess ? 0 : nccl_fail(r, "ncclReduceScatter", c);
}

static int nccl_all_reduce(zs_comm *zc, const void *send, void *recv, size_t count, zs_dtype dt,
                           zs_redop op, void *stream) {
    nccl_comm *c = (nccl_comm *)zc;
    ncclDataType_t t = ncclFloat32;
    ZS_CHECK(begin(c, "all_reduce"));
    ZS_CHECK(map_dtype(dt, &t));
    ncclResult_t r = nc.ncclAllReduce(send, recv, count, t, map_op(op), c->nc, (cudaStream_t)stream);
    return r == ncclSuccess ? 0 : nccl_fail(r, "ncclAllReduce", c);
}

static int nccl_broadcast(zs_comm *zc, void *buf, size_t bytes, int root, void *stream) {
    nccl_comm *c = (nccl_comm *)zc;
    ZS_CHECK(begin(c, "broadcast"));
    ncclResult_t r = nc.ncclBroadcast(buf, buf, bytes, ncclInt8, root, c->nc, (cudaStream_t)stream);
    return r == ncclSuccess ? 0 : nccl_fail(r, "ncclBroadcast", c);
}

static int nccl_barrier(zs_comm *zc) {
    nccl_comm *c = (nccl_comm *)zc;
    ZS_CHECK(begin(c, "barrier"));
    /* d_buf[1] is 0 on every rank, so its sum stays 0 */
    ncclResult_t r =
        nc.ncclAllReduce(c->d_buf + 1, c->d_buf + 1, 1, ncclInt32, ncclSum, c->nc, c->stream);
    if (r != ncclSuccess) return nccl_fail(r, "ncclAllReduce (barrier)", c);
    return wait_on(c, c->stream, "barrier");
}

static int nccl_agree(zs_comm *zc, int local_status, int *global_status) {
    nccl_comm *c = (nccl_comm *)zc;
    ZS_CHECK(begin(c, "agree"));
    /* the previous agree on this handle finished (we waited for it), so h_buf is free */
    *c->h_buf = (int32_t)local_status;
    cudaError_t e =
        cudaMemcpyAsync(c->d_buf, c->h_buf, sizeof(int32_t), cudaMemcpyHostToDevice, c->stream);
    if (e != cudaSuccess) return cuda_fail(e, "cudaMemcpyAsync (agree)", c);
    ncclResult_t r = nc.ncclAllReduce(c->d_buf, c->d_buf, 1, ncclInt32, ncclMin, c->nc, c->stream);
    if (r != ncclSuccess) return nccl_fail(r, "ncclAllReduce (agree)", c);
    e = cudaMemcpyAsync(c->h_buf, c->d_buf, sizeof(int32_t), cudaMemcpyDeviceToHost, c->stream);
    if (e != cudaSuccess) return cuda_fail(e, "cudaMemcpyAsync (agree)", c);
    ZS_CHECK(wait_on(c, c->stream, "agree"));
    *global_status = (int)*c->h_buf;
    return 0;
}

static int nccl_wait(zs_comm *zc, void *stream) {
    return wait_on((nccl_comm *)zc, (cudaStream_t)stream, "waiting for a collective");
}

/* After an abort, a collective this rank queued may wait on the device for a peer that gave up:
 * tearing the rank's communicator down now (ncclCommAbort) ends it, so the stream moves on and
 * the buffers it uses can be freed. */
static int nccl_settle(zs_comm *zc, double timeout_s) {
    (void)timeout_s;
    nccl_comm *c = (nccl_comm *)zc;
    if (!atomic_load(&c->g->aborted) || !c->nc) return 0;
    int prev = -1;
    cudaGetDevice(&prev);
    cudaSetDevice(c->dev);
    ncclResult_t r = nc.ncclCommAbort(c->nc);
    if (r != ncclSuccess) zs_log_warn("comm nccl: aborting rank %d: %s", c->base.rank, nc.ncclGetErrorString(r));
    c->nc = NULL;
    if (prev >= 0) cudaSetDevice(prev);
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
        ncclResult_t r = aborted ? nc.ncclCommAbort(c->nc) : nc.ncclCommDestroy(c->nc);
        if (r != ncclSuccess)
            zs_log_warn("comm nccl: releasing rank %d: %s", c->base.rank, nc.ncclGetErrorString(r));
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
    .wait = nccl_wait,
    .settle = nccl_settle,
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
    ZS_CHECK(nccl_load());
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
        r = nc.ncclCommInitAll(ncs, n, devs);
    } else {
        r = nc.ncclGroupStart();
        for (int i = 0; r == ncclSuccess && i < n; i++) {
            cudaSetDevice(devs[i]);
            r = nc.ncclCommInitRank(&ncs[i], world, *uid, first + i);
        }
        ncclResult_t r2 = nc.ncclGroupEnd();
        if (r == ncclSuccess) r = r2;
    }
    if (r != ncclSuccess) {
        rc = nccl_fail(r, uid ? "ncclCommInitRank" : "ncclCommInitAll", NULL);
        for (int i = 0; uid && i < n; i++)
            if (ncs[i]) nc.ncclCommAbort(ncs[i]);
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
            else if (ncs[i]) nc.ncclCommAbort(ncs[i]);
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
    nc.ncclGetVersion(&ver);
    zs_log_debug("comm nccl: %d of %d ranks, NCCL %d", n, world, ver);
    return 0;
}

int zs_comm_nccl_create(int n, const int *devs, zs_comm **comms) {
    return create_group(n, devs, comms, n, 0, NULL);
}

int zs_comm_nccl_create_cluster(int n, const int *devs, zs_comm **comms) {
    int P = zs_cluster_size(), me = zs_cluster_rank();
    if (P == 1) return zs_comm_nccl_create(n, devs, comms);
    /* every process needs the library: agree on it before anyone joins (no one waits alone) */
    int lrc = nccl_load(), grc = 0;
    ZS_CHECK(zs_cluster_min_int(lrc, &grc));
    if (lrc < 0) return lrc;
    if (grc < 0) return zs_err(grc, "comm nccl: another process of the cluster cannot load libnccl.so.2");
    /* process 0 makes the id; a failure there still sends (zeros) so that nobody waits, and the
     * status travels with it */
    struct { ncclUniqueId id; int32_t status; } u;
    memset(&u, 0, sizeof u);
    if (me == 0) {
        ncclResult_t r = nc.ncclGetUniqueId(&u.id);
        u.status = r == ncclSuccess ? 0 : ZS_EDEVICE;
        if (r != ncclSuccess) nccl_fail(r, "ncclGetUniqueId", NULL);
    }
    ZS_CHECK(zs_cluster_bcast(&u, sizeof u, 0));
    if (u.status < 0)
        return me == 0 ? u.status : zs_err(u.status, "comm nccl: process 0 could not create the NCCL unique id");
    return create_group(n, devs, comms, n * P, me * n, &u.id);
}
