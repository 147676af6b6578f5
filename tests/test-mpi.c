/* test-mpi.c — tests of the "mpi" communicator (engine/comm-mpi.c) against the "local" one:
 * every collective (f32/f16/bf16, sum/max, in place and not, sizes 0, 1, odd and over 1 MB,
 * broadcast roots in other processes) runs on the mpi group of this process's n threads and on
 * a local group that simulates all P*n ranks of the world in each process, with the same
 * deterministic data; the results must be bitwise equal. Also agree, barrier (it waits for the
 * other processes), disagreements within and across processes, and abort (one rank aborts while
 * the others wait; another thread aborts while every rank loops large collectives): every rank
 * gets ZS_ECANCELLED, nothing hangs.
 *
 * Started plainly (as `make test` does), it runs the suite in-process (a cluster of one: no
 * MPI at all), then re-runs itself under `mpirun -np 2` and `-np 3` (oversubscribed; the run
 * with 3 uses small MPI chunks, ZS_COMM_MPI_CHUNK, to cover the chunked transfers); exit 77
 * when mpirun is missing. Under mpirun (OMPI_COMM_WORLD_SIZE set) it is one process of the
 * world; process 0 prints the summary. A watchdog alarm turns a hang into a failure. */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cluster.h"
#include "comm.h"
#include "common.h"
#include "tensor.h"
#include "testutil.h"


static int P = 1, me = 0; /* processes, this process */

static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "FAIL test-mpi: watchdog timeout (a collective hung)\n";
    if (write(2, msg, sizeof msg - 1) < 0) _exit(1);
    _exit(1);
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---- deterministic data ------------------------------------------------------------------ */

static uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static void fill_bytes(void *p, size_t n, uint64_t seed) {
    unsigned char *c = p;
    for (size_t i = 0; i < n; i++) {
        if (i % 8 == 0) seed = mix(seed);
        c[i] = (unsigned char)(seed >> (8 * (i % 8)));
    }
}

/* Values of assorted magnitudes (so that the summation order shows in the rounding), some
 * exact zeros; converted to dt. */
static void fill_vals(void *p, zs_dtype dt, size_t n, uint64_t seed) {
    float *f = malloc(ZS_MAX(n, (size_t)1) * sizeof *f);
    if (!f) abort();
    for (size_t i = 0; i < n; i++) {
        uint64_t r = mix(seed + i);
        float u = (float)(r >> 40) / (float)(1 << 24) * 2.0f - 1.0f;
        f[i] = (r & 31) == 0 ? 0.0f : ldexpf(u, (int)(r % 17) - 8);
    }
    zs_convert(p, dt, f, ZS_F32, n);
    free(f);
}

/* ---- one collective on every rank of a group --------------------------------------------- */

enum { OP_AG, OP_RS, OP_AR, OP_BC };
static const char *op_names[] = {"all_gather", "reduce_scatter", "all_reduce", "broadcast"};

typedef struct {
    int kind;
    zs_dtype dt;
    zs_redop op;
    size_t count; /* all_gather/broadcast: bytes (per rank); reduce_scatter: elements per rank;
                     all_reduce: elements */
    int inplace;
    int root;
    unsigned id;
} tcase;

/* A rank's memory: everything the collective reads or writes, compared as a whole. */
typedef struct {
    char *mem;
    size_t bytes;
    void *send, *recv;
    int rc;
    char err[256];
} rbuf;

static void describe(const tcase *t, int N, char *buf, size_t cap) {
    snprintf(buf, cap, "%s(count=%zu, %s, %s, %s, root=%d) with %d ranks", op_names[t->kind],
             t->count, zs_dtype_name(t->dt), t->op == ZS_RED_MAX ? "max" : "sum",
             t->inplace ? "in place" : "out of place", t->root, N);
}

/* Lays out and fills world rank g's memory for case t (N ranks): the same in every process. */
static void setup(const tcase *t, int N, int g, rbuf *b) {
    size_t es = zs_dtype_size(t->dt), c = t->count;
    uint64_t seed = mix(((uint64_t)t->id << 32) ^ (uint64_t)N << 20 ^ (uint64_t)g);
    size_t send_b = 0, recv_b = 0;
    switch (t->kind) {
    case OP_AG: send_b = c, recv_b = (size_t)N * c; break;
    case OP_RS: send_b = (size_t)N * c * es, recv_b = c * es; break;
    case OP_AR: send_b = recv_b = c * es; break;
    default: recv_b = c;
    }
    int inplace = t->inplace && t->kind != OP_BC;
    b->bytes = t->kind == OP_BC ? recv_b
             : inplace         ? ZS_MAX(send_b, recv_b)
                               : send_b + recv_b;
    b->mem = malloc(ZS_MAX(b->bytes, (size_t)1));
    if (!b->mem) abort();
    fill_bytes(b->mem, b->bytes, seed ^ 0x5555); /* garbage where results go */
    b->rc = -999;
    b->err[0] = 0;
    switch (t->kind) {
    case OP_AG:
        b->recv = inplace ? b->mem : b->mem + send_b;
        b->send = inplace ? b->mem + (size_t)g * c : b->mem;
        fill_bytes(b->send, c, seed);
        break;
    case OP_RS:
        b->send = b->mem;
        b->recv = inplace ? b->mem + (size_t)g * c * es : b->mem + send_b;
        fill_vals(b->send, t->dt, (size_t)N * c, seed);
        break;
    case OP_AR:
        b->send = b->mem;
        b->recv = inplace ? b->mem : b->mem + send_b;
        fill_vals(b->send, t->dt, c, seed);
        break;
    default:
        b->send = b->recv = b->mem;
        if (g == t->root) fill_bytes(b->mem, c, seed);
    }
}

typedef struct {
    zs_comm *c;
    const tcase *t;
    rbuf *b;
} job;

static void *job_main(void *p) {
    job *j = p;
    const tcase *t = j->t;
    rbuf *b = j->b;
    switch (t->kind) {
    case OP_AG: b->rc = zs_comm_all_gather(j->c, b->send, b->recv, t->count, NULL); break;
    case OP_RS:
        b->rc = zs_comm_reduce_scatter(j->c, b->send, b->recv, t->count, t->dt, t->op, NULL);
        break;
    case OP_AR:
        b->rc = zs_comm_all_reduce(j->c, b->send, b->recv, t->count, t->dt, t->op, NULL);
        break;
    default: b->rc = zs_comm_broadcast(j->c, b->recv, t->count, t->root, NULL);
    }
    if (b->rc) snprintf(b->err, sizeof b->err, "%s", zs_errmsg());
    return NULL;
}

static void run_group(zs_comm **cs, int cnt, const tcase *t, rbuf *bufs) {
    pthread_t th[64];
    job jobs[64];
    for (int i = 0; i < cnt; i++) {
        jobs[i] = (job){cs[i], t, &bufs[i]};
        if (pthread_create(&th[i], NULL, job_main, &jobs[i])) abort();
    }
    for (int i = 0; i < cnt; i++) pthread_join(th[i], NULL);
}

/* Runs case t on the mpi group (this process's n ranks) and on the local group simulating
 * the world; compares this process's ranks bitwise. */
static void run_case(zs_comm **mpi, int n, zs_comm **loc, const tcase *t) {
    int N = P * n;
    rbuf L[64], M[16];
    for (int g = 0; g < N; g++) setup(t, N, g, &L[g]);
    for (int i = 0; i < n; i++) setup(t, N, me * n + i, &M[i]);
    run_group(loc, N, t, L);
    run_group(mpi, n, t, M);
    char d[160];
    describe(t, N, d, sizeof d);
    for (int i = 0; i < n; i++) {
        int g = me * n + i;
        CHECK(L[g].rc == 0, "local %s rank %d: %s", d, g, L[g].err);
        CHECK(M[i].rc == 0, "mpi %s rank %d: %s", d, g, M[i].err);
        size_t at = 0;
        while (at < M[i].bytes && M[i].mem[at] == L[g].mem[at]) at++;
        CHECK(at == M[i].bytes, "%s rank %d: mpi result differs from local at byte %zu of %zu",
              d, g, at, M[i].bytes);
    }
    for (int g = 0; g < N; g++) free(L[g].mem);
    for (int i = 0; i < n; i++) free(M[i].mem);
}

static int add_case(tcase *cs, int k, int kind, zs_dtype dt, zs_redop op, size_t count,
                    int inplace, int root) {
    cs[k] = (tcase){kind, dt, op, count, inplace, root, (unsigned)k + 1};
    return k + 1;
}

/* Every collective compared with the local group; returns the number of cases. */
static int compare_all(zs_comm **mpi, int n, zs_comm **loc) {
    static tcase cs[256];
    static const size_t small[] = {0, 1, 7, 1001};
    const zs_dtype dts[] = {ZS_F32, ZS_F16, ZS_BF16};
    int N = P * n, k = 0;
    int roots[3] = {0, P > 1 ? n : N - 1, N - 1}; /* n: the first rank of process 1 */
    for (int s = 0; s < 4; s++) {
        for (int ip = 0; ip < 2; ip++) k = add_case(cs, k, OP_AG, ZS_F32, 0, small[s], ip, 0);
        for (int d = 0; d < 3; d++)
            for (int op = 0; op < 2; op++)
                for (int ip = 0; ip < 2; ip++) {
                    k = add_case(cs, k, OP_RS, dts[d], (zs_redop)op, small[s], ip, 0);
                    k = add_case(cs, k, OP_AR, dts[d], (zs_redop)op, small[s], ip, 0);
                }
        for (int r = 0; r < 3; r++) k = add_case(cs, k, OP_BC, ZS_F32, 0, small[s], 0, roots[r]);
    }
    /* over 1 MB per rank */
    k = add_case(cs, k, OP_AG, ZS_F32, 0, ((size_t)1 << 20) + 4099, 0, 0);
    k = add_case(cs, k, OP_AG, ZS_F32, 0, ((size_t)1 << 20) + 4099, 1, 0);
    k = add_case(cs, k, OP_RS, ZS_F32, ZS_RED_SUM, 150001, 1, 0);
    k = add_case(cs, k, OP_RS, ZS_BF16, ZS_RED_MAX, 150001, 0, 0);
    k = add_case(cs, k, OP_RS, ZS_F16, ZS_RED_SUM, 300007, 0, 0);
    k = add_case(cs, k, OP_AR, ZS_F32, ZS_RED_SUM, 300007, 0, 0);
    k = add_case(cs, k, OP_AR, ZS_F16, ZS_RED_SUM, 600011, 1, 0);
    k = add_case(cs, k, OP_AR, ZS_BF16, ZS_RED_MAX, 600011, 0, 0);
    k = add_case(cs, k, OP_BC, ZS_F32, 0, 3 * ((size_t)1 << 19) + 3, 0, N - 1);
    k = add_case(cs, k, OP_BC, ZS_F32, 0, 3 * ((size_t)1 << 19) + 3, 0, roots[1]);
    for (int i = 0; i < k; i++) run_case(mpi, n, loc, &cs[i]);
    return k;
}

/* ---- the other tests: one function per rank thread --------------------------------------- */

typedef void (*rank_fn)(zs_comm *c, void *arg);
typedef struct {
    zs_comm *c;
    rank_fn fn;
    void *arg;
} rank_ctx;

static void *rank_main(void *p) {
    rank_ctx *r = p;
    r->fn(r->c, r->arg);
    return NULL;
}

static void run_ranks(zs_comm **cs, int n, rank_fn fn, void *arg) {
    pthread_t th[16];
    rank_ctx ctx[16];
    for (int i = 0; i < n; i++) {
        ctx[i] = (rank_ctx){cs[i], fn, arg};
        if (pthread_create(&th[i], NULL, rank_main, &ctx[i])) abort();
    }
    for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
}

static int agree_status(int variant, int g, int N) {
    switch (variant) {
    case 0: return 0;
    case 1: return g == N / 2 ? -5 : (g % 2 ? -2 : 0);
    default: return 7; /* positive counts as 0 */
    }
}

static void agree_rank(zs_comm *c, void *arg) {
    (void)arg;
    int g = zs_comm_rank(c), N = zs_comm_size(c);
    for (int v = 0; v < 3; v++) {
        int want = 0;
        for (int r = 0; r < N; r++) want = ZS_MIN(want, agree_status(v, r, N));
        if (v == 2) want = 0;
        int got = 1, rc = zs_comm_agree(c, agree_status(v, g, N), &got);
        TCHECK(rc == 0 && got == want, "agree variant %d rank %d: rc %d (%s), got %d, want %d",
               v, g, rc, zs_errmsg(), got, want);
    }
}

/* The last rank arrives late at a barrier: everyone else must wait for it. */
static void barrier_rank(zs_comm *c, void *arg) {
    (void)arg;
    int g = zs_comm_rank(c), N = zs_comm_size(c);
    int rc = zs_comm_barrier(c);
    TCHECK(rc == 0, "barrier rank %d: %s", g, zs_errmsg());
    double t0 = zs_now();
    if (g == N - 1) sleep_ms(200);
    rc = zs_comm_barrier(c);
    double dt = zs_now() - t0;
    TCHECK(rc == 0, "barrier rank %d: %s", g, zs_errmsg());
    TCHECK(g == N - 1 || dt > 0.1, "barrier rank %d returned after %.3f s, before the last "
           "rank arrived", g, dt);
}

/* Disagreements: every rank of the world gets ZS_EINVAL, the group stays usable. */
static void mismatch_rank(zs_comm *c, void *arg) {
    int n = *(int *)arg;
    int g = zs_comm_rank(c), N = zs_comm_size(c), proc = g / n;
    char *buf = calloc((size_t)N * 32, 1);
    if (!buf) abort();
    int rc, st = 0;
    if (P > 1) { /* across processes: the last process gathers more */
        rc = zs_comm_all_gather(c, buf, buf + (size_t)N * 16, proc == P - 1 ? 16 : 8, NULL);
        TCHECK(rc == ZS_EINVAL && strstr(zs_errmsg(), "disagree"),
               "size mismatch across processes, rank %d: rc %d: %s", g, rc, zs_errmsg());
        TCHECK(zs_comm_barrier(c) == 0, "barrier after a mismatch, rank %d: %s", g, zs_errmsg());
        /* different collectives */
        rc = proc == 0 ? zs_comm_barrier(c) : zs_comm_agree(c, 0, &st);
        TCHECK(rc == ZS_EINVAL, "kind mismatch across processes, rank %d: rc %d: %s", g, rc,
               zs_errmsg());
        TCHECK(zs_comm_agree(c, 0, &st) == 0 && st == 0, "agree after a mismatch, rank %d: %s",
               g, zs_errmsg());
    }
    if (n > 1) { /* within process 0: its rank 0 broadcasts, everyone else gathers */
        if (g == 0) rc = zs_comm_broadcast(c, buf, 8, 0, NULL);
        else rc = zs_comm_all_gather(c, buf, buf + 8, 8, NULL);
        TCHECK(rc == ZS_EINVAL, "mismatch within a process, rank %d: rc %d: %s", g, rc,
               zs_errmsg());
        TCHECK(zs_comm_barrier(c) == 0, "barrier after a mismatch, rank %d: %s", g, zs_errmsg());
    }
    free(buf);
}

/* The last rank aborts instead of joining an all_reduce the others wait in. The buffers are
 * static, never reused: an abandoned MPI request may still point into them. */
static float abort_bufs[4][16][1000];

static void abort_rank(zs_comm *c, void *arg) {
    int n = *(int *)arg;
    int g = zs_comm_rank(c), N = zs_comm_size(c);
    if (g == N - 1) {
        sleep_ms(150);
        zs_comm_abort(c);
        TCHECK(zs_comm_barrier(c) == ZS_ECANCELLED, "barrier after own abort");
    } else {
        float *buf = abort_bufs[n][g % n];
        double t0 = zs_now();
        int rc = zs_comm_all_reduce(c, buf, buf, 1000, ZS_F32, ZS_RED_SUM, NULL);
        TCHECK(rc == ZS_ECANCELLED, "all_reduce during abort, rank %d: rc %d", g, rc);
        TCHECK(strstr(zs_errmsg(), "aborted") != NULL, "message: %s", zs_errmsg());
        TCHECK(zs_now() - t0 < 10, "cancel took %.1f s", zs_now() - t0);
    }
    int st;
    TCHECK(zs_comm_agree(c, 0, &st) == ZS_ECANCELLED, "agree after abort, rank %d", g);
    TCHECK(zs_comm_barrier(c) == ZS_ECANCELLED, "barrier after abort, rank %d", g);
}

/* Every rank loops all_reduce and all_gather on large buffers until another thread of
 * process 0 aborts the group at some point: the ranks of every process stop with
 * ZS_ECANCELLED (the abort reaches the others by its notice), mid-transfer or not. Static
 * buffers, as above. */
#define LOOP_COUNT (1 << 16)
static float loop_bufs[4][16][2 * LOOP_COUNT];

typedef struct {
    int n;
    zs_comm *c;
} loop_arg;

static void abort_loop_rank(zs_comm *c, void *arg) {
    loop_arg *a = arg;
    int g = zs_comm_rank(c), N = zs_comm_size(c);
    float *buf = loop_bufs[a->n][g % a->n];
    int rc = 0, it;
    double t0 = zs_now();
    for (it = 0; it < 1000000 && rc == 0 && zs_now() - t0 < 30; it++) {
        if (it % 2) rc = zs_comm_all_reduce(c, buf, buf, LOOP_COUNT, ZS_F32, ZS_RED_SUM, NULL);
        else rc = zs_comm_all_gather(c, buf, buf + LOOP_COUNT, LOOP_COUNT / N * 4, NULL);
    }
    TCHECK(rc == ZS_ECANCELLED, "rank %d: loop ended with rc %d after %d calls: %s", g, rc, it,
           zs_errmsg());
    TCHECK(zs_comm_barrier(c) == ZS_ECANCELLED, "barrier after abort, rank %d", g);
}

static void *loop_aborter(void *p) {
    loop_arg *a = p;
    sleep_ms(300);
    zs_comm_abort(a->c);
    return NULL;
}

/* ---- one process of the world ------------------------------------------------------------ */

static int suite(void) {
    double t0 = zs_now();
    int cases = 0;
    zs_comm *mpi[16], *loc[64], *one;
    CHECK(zs_comm_mpi_create(0, mpi) == ZS_EINVAL, "n = 0 refused");
    for (int n = 1; n <= 3; n++) {
        int N = P * n;
        int rc = zs_comm_mpi_create(n, mpi);
        CHECK(rc == 0, "mpi_create(%d): %s", n, zs_errmsg());
        if (rc) return 1;
        rc = zs_comm_local_create(N, loc);
        CHECK(rc == 0, "local_create(%d): %s", N, zs_errmsg());
        if (rc) return 1;
        for (int i = 0; i < n; i++) {
            CHECK(zs_comm_rank(mpi[i]) == me * n + i && zs_comm_size(mpi[i]) == N,
                  "rank %d size %d", zs_comm_rank(mpi[i]), zs_comm_size(mpi[i]));
            CHECK(!strcmp(zs_comm_name(mpi[i]), "mpi"), "name %s", zs_comm_name(mpi[i]));
        }
        cases += compare_all(mpi, n, loc);
        run_ranks(mpi, n, agree_rank, NULL);
        run_ranks(mpi, n, barrier_rank, NULL);
        run_ranks(mpi, n, mismatch_rank, &n);
        /* the group still works after the mismatches */
        tcase t = {OP_AR, ZS_F32, ZS_RED_SUM, 4097, 0, 0, 999};
        run_case(mpi, n, loc, &t);
        for (int i = 0; i < n; i++) zs_comm_free(mpi[i]);
        for (int r = 0; r < N; r++) zs_comm_free(loc[r]);

        rc = zs_comm_mpi_create(n, mpi);
        CHECK(rc == 0, "mpi_create(%d): %s", n, zs_errmsg());
        if (rc) return 1;
        run_ranks(mpi, n, abort_rank, &n);
        for (int i = 0; i < n; i++) zs_comm_free(mpi[i]);

        rc = zs_comm_mpi_create(n, mpi);
        CHECK(rc == 0, "mpi_create(%d): %s", n, zs_errmsg());
        if (rc) return 1;
        loop_arg la = {n, mpi[0]};
        pthread_t ab;
        if (me == 0 && pthread_create(&ab, NULL, loop_aborter, &la)) abort();
        run_ranks(mpi, n, abort_loop_rank, &la);
        if (me == 0) pthread_join(ab, NULL);
        for (int i = 0; i < n; i++) zs_comm_free(mpi[i]);
    }
    /* a group made after an aborted one is not disturbed by its notices */
    CHECK(zs_comm_mpi_create(1, &one) == 0, "mpi_create: %s", zs_errmsg());
    int st = 1;
    CHECK(zs_comm_agree(one, -3 * (me == 0), &st) == 0 && st == -3, "agree %d: %s", st,
          zs_errmsg());
    zs_comm_free(one);

    int fails[64] = {0}, mine = tu_failures, total = 0;
    if (P > 1 && zs_cluster_all_gather(&mine, fails, sizeof mine) == 0) {
        for (int q = 0; q < P; q++) total += fails[q];
    } else {
        total = mine;
    }
    if (me == 0)
        printf("test-mpi: %d process(es) x 1..3 ranks: %d cases compared bitwise with local, "
               "%d checks here, %d failed in all processes (%.1f s)\n", P, cases, tu_checks,
               total, zs_now() - t0);
    fflush(stdout);
    return tu_failures ? 1 : 0;
}

/* ---- launcher ---------------------------------------------------------------------------- */

static int in_path(const char *name) {
    const char *path = getenv("PATH");
    char buf[4096];
    while (path && *path) {
        const char *e = strchr(path, ':');
        size_t len = e ? (size_t)(e - path) : strlen(path);
        snprintf(buf, sizeof buf, "%.*s/%s", (int)len, path, name);
        if (len && access(buf, X_OK) == 0) return 1;
        path = e ? e + 1 : NULL;
    }
    return 0;
}

/* Runs this program under mpirun with np processes; returns its exit status. */
static int launch(const char *self, int np, const char *chunk) {
    double t0 = zs_now();
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
        setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
        /* OpenMPI leaks at init: no leak check in the processes of the world */
        const char *a = getenv("ASAN_OPTIONS");
        char asan[1024];
        snprintf(asan, sizeof asan, "%s%sdetect_leaks=0", a && *a ? a : "", a && *a ? ":" : "");
        setenv("ASAN_OPTIONS", asan, 1);
        char nps[16], env[64];
        snprintf(nps, sizeof nps, "%d", np);
        snprintf(env, sizeof env, "ZS_COMM_MPI_CHUNK=%s", chunk ? chunk : "");
        const char *argv[24];
        int k = 0;
        argv[k++] = "timeout";
        argv[k++] = "120";
        argv[k++] = "mpirun";
        argv[k++] = "--oversubscribe";
        argv[k++] = "--bind-to";
        argv[k++] = "none";
        argv[k++] = "--mca";
        argv[k++] = "btl";
        argv[k++] = "self,vader,tcp";
        argv[k++] = "-np";
        argv[k++] = nps;
        if (chunk) {
            argv[k++] = "-x";
            argv[k++] = env;
        }
        argv[k++] = self;
        argv[k] = NULL;
        execvp("timeout", (char *const *)argv);
        _exit(127);
    }
    int status = 0;
    if (waitpid(pid, &status, 0) < 0) return -1;
    int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    fprintf(stderr, "test-mpi: mpirun -np %d%s%s: exit %d (%.1f s)\n", np,
            chunk ? " with ZS_COMM_MPI_CHUNK=" : "", chunk ? chunk : "", rc, zs_now() - t0);
    return rc;
}

int main(int argc, char **argv) {
    signal(SIGALRM, on_alarm);
    int child = getenv("OMPI_COMM_WORLD_SIZE") != NULL;
    alarm(child ? 90 : 120);
    int rc = zs_cluster_init(&argc, &argv);
    if (rc) {
        fprintf(stderr, "FAIL test-mpi: cluster init: %s\n", zs_errmsg());
        return 1;
    }
    P = zs_cluster_size();
    me = zs_cluster_rank();
    snprintf(tu_fail_tag, sizeof tu_fail_tag, "[process %d] ", me);
    if (child && P < 2) {
        fprintf(stderr, "test-mpi: started by mpirun with one process\n");
    }
    int fail = suite();
    if (child) {
        zs_cluster_finalize();
        return fail;
    }
    /* the plain start: the suite above ran as a cluster of one; now the real worlds */
    alarm(0);
    if (!in_path("mpirun") || !in_path("timeout")) {
        fprintf(stderr, "test-mpi: mpirun (or timeout) not found: multi-process runs skipped\n");
        return fail ? 1 : 77;
    }
    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) {
        fprintf(stderr, "FAIL test-mpi: cannot find my own executable\n");
        return 1;
    }
    self[len] = 0;
    int r2 = launch(self, 2, NULL);
    int r3 = launch(self, 3, "65521");
    CHECK(r2 == 0, "mpirun -np 2 failed (exit %d)", r2);
    CHECK(r3 == 0, "mpirun -np 3 failed (exit %d)", r3);
    return tu_finish("test-mpi");
}
