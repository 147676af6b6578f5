/* test-comm.c — tests of the communicator (engine/comm.h): the in-process "local" backend with
 * 1..4 rank threads (all_gather, reduce_scatter, all_reduce, broadcast, barrier, agree, abort,
 * argument and mismatch errors, a long mixed stress run), results compared bitwise with a
 * sequential reference; and the NCCL backend: a clean failure without a GPU, a small smoke
 * run with one. A watchdog alarm turns a hang into a failure. */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm.h"
#include "common.h"
#include "tensor.h"
#include "testutil.h"

#ifdef ZS_CUDA
#include <cuda_runtime_api.h>
#endif


static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "FAIL test-comm: watchdog timeout (a collective hung)\n";
    if (write(2, msg, sizeof msg - 1) < 0) _exit(1);
    _exit(1);
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---- harness: one thread per rank ------------------------------------------------------- */

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

/* Runs fn on n rank threads of a fresh local group (or of comms when given). */
static void run_ranks(int n, zs_comm **given, rank_fn fn, void *arg) {
    zs_comm *cs[8];
    pthread_t th[8];
    rank_ctx ctx[8];
    if (given) memcpy(cs, given, (size_t)n * sizeof *cs);
    else {
        int rc = zs_comm_local_create(n, cs);
        CHECK(rc == 0, "local_create(%d): %s", n, zs_errmsg());
        if (rc) return;
    }
    for (int i = 0; i < n; i++) {
        ctx[i] = (rank_ctx){cs[i], fn, arg};
        TCHECK(pthread_create(&th[i], NULL, rank_main, &ctx[i]) == 0, "pthread_create");
    }
    for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
    if (!given)
        for (int i = 0; i < n; i++) zs_comm_free(cs[i]);
}

/* ---- data and sequential references ----------------------------------------------------- */

static uint8_t byte_of(int rank, size_t i, unsigned seed) {
    return (uint8_t)((rank * 131u + i * 7u + seed * 17u + (i >> 8) * 3u) & 0xffu);
}

/* A value where the summation order matters: one rank holds a huge value per element, the
 * others small ones that round away differently depending on when they are added. */
static float fval(int rank, int n, size_t e, unsigned seed) {
    if ((size_t)(rank + seed) % (size_t)n == e % (size_t)n) return (e & 1) ? -1e8f : 1e8f;
    return 0.37f * (float)(rank + 1) + 1.13f * (float)((e + seed) % 7) - 2.5f;
}

/* F16/BF16 values near a magnitude where their ulp is 2: also order-sensitive in f16. */
static uint16_t hval(zs_dtype dt, int rank, int n, size_t e, unsigned seed) {
    float base = dt == ZS_F16 ? 2048.f : 256.f;
    float v = fval(rank, n, e, seed);
    if (v > 1e7f || v < -1e7f) v = (e & 1) ? -base : base;
    return dt == ZS_F16 ? zs_f32_to_f16(v) : zs_f32_to_bf16(v);
}

static float to_f32(zs_dtype dt, const void *p, size_t e) {
    if (dt == ZS_F32) return ((const float *)p)[e];
    uint16_t h = ((const uint16_t *)p)[e];
    return dt == ZS_F16 ? zs_f16_to_f32(h) : zs_bf16_to_f32(h);
}

static void fill(zs_dtype dt, void *buf, int rank, int n, size_t count, unsigned seed,
                 size_t e0) {
    for (size_t i = 0; i < count; i++) {
        if (dt == ZS_F32) ((float *)buf)[i] = fval(rank, n, e0 + i, seed);
        else ((uint16_t *)buf)[i] = hval(dt, rank, n, e0 + i, seed);
    }
}

/* Reference: ranks 0..n-1 in order, f32 accumulation, one rounding. */
static void reference(zs_dtype dt, zs_redop op, void *out, int n, size_t count, unsigned seed,
                      size_t e0) {
    size_t es = zs_dtype_size(dt);
    uint8_t one[4];
    for (size_t i = 0; i < count; i++) {
        float acc = 0;
        for (int r = 0; r < n; r++) {
            fill(dt, one, r, n, 1, seed, e0 + i);
            float v = to_f32(dt, one, 0);
            if (r == 0) acc = v;
            else if (op == ZS_RED_SUM) acc = acc + v;
            else acc = (v > acc || v != v) ? v : acc;
        }
        zs_convert((char *)out + i * es, dt, &acc, ZS_F32, 1);
    }
}

/* ---- all_gather -------------------------------------------------------------------------- */

static const size_t ag_sizes[] = {0, 1, 3, 7, 1000, 65537};

static void ag_rank(zs_comm *c, void *arg) {
    (void)arg;
    int n = zs_comm_size(c), rank = zs_comm_rank(c);
    for (size_t si = 0; si < sizeof ag_sizes / sizeof *ag_sizes; si++) {
        size_t b = ag_sizes[si];
        uint8_t *send = malloc(b + 1), *recv = malloc(n * b + 1);
        for (int inplace = 0; inplace < 2; inplace++) {
            unsigned seed = (unsigned)(si * 2 + inplace);
            memset(recv, 0xee, n * b + 1);
            uint8_t *src = inplace ? recv + (size_t)rank * b : send;
            for (size_t i = 0; i < b; i++) src[i] = byte_of(rank, i, seed);
            int rc = zs_comm_all_gather(c, src, recv, b, NULL);
            TCHECK(rc == 0, "all_gather n=%d b=%zu: %s", n, b, zs_errmsg());
            int bad = 0;
            for (int r = 0; r < n; r++)
                for (size_t i = 0; i < b; i++) bad += recv[(size_t)r * b + i] != byte_of(r, i, seed);
            TCHECK(bad == 0, "all_gather n=%d rank=%d b=%zu inplace=%d: %d wrong bytes", n, rank,
                   b, inplace, bad);
            TCHECK(recv[n * b] == 0xee, "all_gather wrote past the end");
        }
        free(send);
        free(recv);
    }
}

/* ---- reduce_scatter and all_reduce ------------------------------------------------------- */

static const size_t red_counts[] = {0, 1, 3, 5, 1023, 1500, 3001};

static void red_rank(zs_comm *c, void *arg) {
    (void)arg;
    int n = zs_comm_size(c), rank = zs_comm_rank(c);
    for (int dt = 0; dt < ZS_DTYPE_ELEM_COUNT; dt++) {
        size_t es = zs_dtype_size((zs_dtype)dt);
        for (int op = 0; op < 2; op++) {
            for (size_t ci = 0; ci < sizeof red_counts / sizeof *red_counts; ci++) {
                size_t cnt = red_counts[ci];
                for (int inplace = 0; inplace < 2; inplace++) {
                    unsigned seed = (unsigned)(ci * 5 + op * 2 + inplace + dt * 11);
                    /* reduce_scatter: block i of the send is elements [i*cnt, (i+1)*cnt) */
                    char *send = malloc(n * cnt * es + 4), *recv = malloc(cnt * es + 4),
                         *ref = malloc(n * cnt * es + 4);
                    fill((zs_dtype)dt, send, rank, n, n * cnt, seed, 0);
                    reference((zs_dtype)dt, (zs_redop)op, ref, n, n * cnt, seed, 0);
                    void *out = inplace ? send + (size_t)rank * cnt * es : recv;
                    int rc = zs_comm_reduce_scatter(c, send, out, cnt, (zs_dtype)dt, (zs_redop)op,
                                                    NULL);
                    TCHECK(rc == 0, "reduce_scatter: %s", zs_errmsg());
                    TCHECK(memcmp(out, ref + (size_t)rank * cnt * es, cnt * es) == 0,
                           "reduce_scatter n=%d rank=%d %s %s count=%zu inplace=%d differs from "
                           "the sequential reference",
                           n, rank, zs_dtype_name((zs_dtype)dt), op ? "max" : "sum", cnt, inplace);
                    free(send);
                    free(recv);
                    free(ref);

                    /* all_reduce */
                    send = malloc(cnt * es + 4);
                    recv = malloc(cnt * es + 4);
                    ref = malloc(cnt * es + 4);
                    fill((zs_dtype)dt, send, rank, n, cnt, seed + 100, 0);
                    reference((zs_dtype)dt, (zs_redop)op, ref, n, cnt, seed + 100, 0);
                    out = inplace ? send : recv;
                    rc = zs_comm_all_reduce(c, send, out, cnt, (zs_dtype)dt, (zs_redop)op, NULL);
                    TCHECK(rc == 0, "all_reduce: %s", zs_errmsg());
                    TCHECK(memcmp(out, ref, cnt * es) == 0,
                           "all_reduce n=%d rank=%d %s %s count=%zu inplace=%d differs from the "
                           "sequential reference",
                           n, rank, zs_dtype_name((zs_dtype)dt), op ? "max" : "sum", cnt, inplace);
                    free(send);
                    free(recv);
                    free(ref);
                }
            }
        }
    }
}

/* The reference really is order-sensitive (otherwise the bitwise checks prove little). */
static void test_order_sensitive(void) {
    float fwd = 1e8f, bwd = 0;
    float small[3] = {3.f, 3.f, 3.f};
    for (int i = 0; i < 3; i++) fwd += small[i];
    for (int i = 2; i >= 0; i--) bwd += small[i];
    bwd += 1e8f;
    CHECK(fwd != bwd, "test data is not order-sensitive (%g vs %g)", fwd, bwd);
}

/* ---- broadcast, barrier, agree ----------------------------------------------------------- */

static void bc_rank(zs_comm *c, void *arg) {
    (void)arg;
    int n = zs_comm_size(c), rank = zs_comm_rank(c);
    size_t sizes[] = {0, 1, 13, 4097};
    for (int root = 0; root < n; root++) {
        for (size_t si = 0; si < 4; si++) {
            size_t b = sizes[si];
            uint8_t *buf = malloc(b + 1);
            for (size_t i = 0; i < b; i++) buf[i] = byte_of(rank, i, (unsigned)si);
            int rc = zs_comm_broadcast(c, buf, b, root, NULL);
            TCHECK(rc == 0, "broadcast: %s", zs_errmsg());
            int bad = 0;
            for (size_t i = 0; i < b; i++) bad += buf[i] != byte_of(root, i, (unsigned)si);
            TCHECK(bad == 0, "broadcast n=%d root=%d rank=%d bytes=%zu: %d wrong", n, root, rank,
                   b, bad);
            free(buf);
        }
    }
    TCHECK(zs_comm_barrier(c) == 0, "barrier: %s", zs_errmsg());
}

static void agree_rank(zs_comm *c, void *arg) {
    (void)arg;
    int n = zs_comm_size(c), rank = zs_comm_rank(c);
    int g = 1;
    int rc = zs_comm_agree(c, 0, &g);
    TCHECK(rc == 0 && g == 0, "agree all ok: rc=%d g=%d", rc, g);
    /* the last rank fails its "shard read" */
    rc = zs_comm_agree(c, rank == n - 1 ? ZS_EIO : 0, &g);
    TCHECK(rc == 0 && g == ZS_EIO, "agree one failing: rc=%d g=%d", rc, g);
    /* two failures: the worst (most negative) wins */
    int mine = rank == 0 ? ZS_ENOMEM : rank == n - 1 ? ZS_EDEVICE : 0;
    rc = zs_comm_agree(c, mine, &g);
    TCHECK(rc == 0 && g == (n > 1 ? ZS_EDEVICE : ZS_ENOMEM), "agree worst: rc=%d g=%d", rc, g);
    rc = zs_comm_agree(c, 0, &g);
    TCHECK(rc == 0 && g == 0, "agree ok again: rc=%d g=%d", rc, g);
}

/* ---- stress: many mixed collectives back to back ---------------------------------------- */

static unsigned lcg(unsigned *s) {
    *s = *s * 1103515245u + 12345u;
    return (*s >> 8) & 0xffffffu;
}

#define STRESS_ITERS 2000
#define STRESS_MAXC 700

static void stress_rank(zs_comm *c, void *arg) {
    (void)arg;
    int n = zs_comm_size(c), rank = zs_comm_rank(c);
    unsigned s = 12345; /* same sequence on every rank */
    char *send = malloc((size_t)STRESS_MAXC * 4 * 4), *recv = malloc((size_t)STRESS_MAXC * 4 * 4);
    char *ref = malloc((size_t)STRESS_MAXC * 4 * 4);
    int bad = 0, errs = 0;
    for (int it = 0; it < STRESS_ITERS && errs == 0; it++) {
        unsigned kind = lcg(&s) % 6, seed = (unsigned)it;
        size_t cnt = lcg(&s) % STRESS_MAXC;
        zs_dtype dt = (zs_dtype)(lcg(&s) % 3);
        zs_redop op = (zs_redop)(lcg(&s) % 2);
        int inplace = lcg(&s) % 2, root = (int)(lcg(&s) % (unsigned)n);
        size_t es = zs_dtype_size(dt);
        int rc = 0;
        switch (kind) {
        case 0: { /* all_gather */
            char *src = inplace ? recv + (size_t)rank * cnt : send;
            for (size_t i = 0; i < cnt; i++) src[i] = (char)byte_of(rank, i, seed);
            rc = zs_comm_all_gather(c, src, recv, cnt, NULL);
            for (int r = 0; r < n; r++)
                for (size_t i = 0; i < cnt; i++)
                    bad += (uint8_t)recv[(size_t)r * cnt + i] != byte_of(r, i, seed);
            break;
        }
        case 1: { /* reduce_scatter */
            size_t per = cnt / (size_t)n;
            fill(dt, send, rank, n, per * n, seed, 0);
            void *out = inplace ? send + (size_t)rank * per * es : recv;
            rc = zs_comm_reduce_scatter(c, send, out, per, dt, op, NULL);
            reference(dt, op, ref, n, per, seed, (size_t)rank * per);
            bad += memcmp(out, ref, per * es) != 0;
            break;
        }
        case 2: { /* all_reduce */
            fill(dt, send, rank, n, cnt, seed, 0);
            void *out = inplace ? send : recv;
            rc = zs_comm_all_reduce(c, send, out, cnt, dt, op, NULL);
            reference(dt, op, ref, n, cnt, seed, 0);
            bad += memcmp(out, ref, cnt * es) != 0;
            break;
        }
        case 3: /* broadcast */
            for (size_t i = 0; i < cnt; i++) send[i] = (char)byte_of(rank, i, seed);
            rc = zs_comm_broadcast(c, send, cnt, root, NULL);
            for (size_t i = 0; i < cnt; i++) bad += (uint8_t)send[i] != byte_of(root, i, seed);
            break;
        case 4: { /* agree */
            int g = 1, failer = (int)(cnt % (size_t)(n + 1)); /* n: nobody fails */
            rc = zs_comm_agree(c, rank == failer ? ZS_EIO : 0, &g);
            bad += rc == 0 && g != (failer < n ? ZS_EIO : 0);
            break;
        }
        default: rc = zs_comm_barrier(c);
        }
        if (rc) {
            errs++;
            TCHECK(rc == 0, "stress it=%d kind=%u: %s", it, kind, zs_errmsg());
        }
        if (bad) {
            TCHECK(bad == 0, "stress n=%d rank=%d it=%d kind=%u cnt=%zu dt=%s op=%d inplace=%d: "
                   "wrong result", n, rank, it, kind, cnt, zs_dtype_name(dt), op, inplace);
            bad = 0;
            errs++;
        }
    }
    /* A rank that stopped early would leave the others waiting in their next collective
     * (a failure would show up as a watchdog hang): abort so they stop too. */
    if (errs) zs_comm_abort(c);
    free(send);
    free(recv);
    free(ref);
}

/* ---- abort ------------------------------------------------------------------------------- */

/* Rank n-1 aborts instead of joining; the others are blocked in a collective. */
static void abort_by_rank(zs_comm *c, void *arg) {
    (void)arg;
    int n = zs_comm_size(c), rank = zs_comm_rank(c);
    char buf[64] = {0}, out[64 * 4];
    if (rank == n - 1) {
        sleep_ms(100);
        zs_comm_abort(c);
    } else {
        int rc = rank % 2 ? zs_comm_barrier(c) : zs_comm_all_gather(c, buf, out, 64, NULL);
        TCHECK(rc == ZS_ECANCELLED, "blocked rank %d got %d, not ZS_ECANCELLED", rank, rc);
        TCHECK(strstr(zs_errmsg(), "aborted") != NULL, "message: %s", zs_errmsg());
    }
    /* everything afterwards fails fast */
    int g = 0;
    TCHECK(zs_comm_all_reduce(c, buf, buf, 4, ZS_F32, ZS_RED_SUM, NULL) == ZS_ECANCELLED,
           "after abort");
    TCHECK(zs_comm_agree(c, 0, &g) == ZS_ECANCELLED, "agree after abort");
    TCHECK(zs_comm_barrier(c) == ZS_ECANCELLED, "barrier after abort");
}

/* Every rank loops collectives on large buffers until another thread aborts at a random time:
 * each must end with ZS_ECANCELLED (and ASan must see no reads of freed buffers). */
static void abort_loop_rank(zs_comm *c, void *arg) {
    (void)arg;
    int n = zs_comm_size(c), rank = zs_comm_rank(c);
    size_t cnt = 1 << 15;
    for (int it = 0;; it++) {
        float *a = malloc(cnt * 4), *b = malloc(cnt * 4 * n);
        fill(ZS_F32, a, rank, n, cnt, (unsigned)it, 0);
        int rc;
        switch (it % 3) {
        case 0: rc = zs_comm_all_reduce(c, a, a, cnt, ZS_F32, ZS_RED_SUM, NULL); break;
        case 1: rc = zs_comm_all_gather(c, a, b, cnt * 4, NULL); break;
        default: rc = zs_comm_reduce_scatter(c, b, a, cnt / (size_t)n, ZS_F32, ZS_RED_MAX, NULL);
        }
        free(a);
        free(b);
        if (rc) {
            TCHECK(rc == ZS_ECANCELLED, "loop rank %d it %d: %d (%s)", rank, it, rc, zs_errmsg());
            break;
        }
        if (it > 1000000) {
            TCHECK(0, "abort never arrived");
            break;
        }
    }
}

typedef struct {
    zs_comm *c;
    int ms;
} aborter_arg;

static void *aborter(void *p) {
    aborter_arg *a = p;
    sleep_ms(a->ms);
    zs_comm_abort(a->c);
    return NULL;
}

/* Abort from a thread that is not a rank, while ranks 0..n-2 wait in a barrier and rank n-1
 * never comes. */
static void abort_waiting(zs_comm *c, void *arg) {
    (void)arg;
    if (zs_comm_rank(c) == zs_comm_size(c) - 1) return;
    int rc = zs_comm_barrier(c);
    TCHECK(rc == ZS_ECANCELLED, "barrier waiting for an absent rank returned %d", rc);
}

static void test_abort(void) {
    for (int n = 2; n <= 4; n++) run_ranks(n, NULL, abort_by_rank, NULL);

    for (int n = 2; n <= 4; n++) {
        zs_comm *cs[4];
        CHECK(zs_comm_local_create(n, cs) == 0, "create");
        pthread_t t;
        aborter_arg a = {cs[0], 100};
        pthread_create(&t, NULL, aborter, &a);
        run_ranks(n, cs, abort_waiting, NULL);
        pthread_join(t, NULL);
        for (int i = 0; i < n; i++) zs_comm_free(cs[i]);
    }

    for (int trial = 0; trial < 6; trial++) {
        int n = 2 + trial % 3;
        zs_comm *cs[4];
        CHECK(zs_comm_local_create(n, cs) == 0, "create");
        pthread_t t;
        aborter_arg a = {cs[trial % n], 5 + 17 * trial};
        pthread_create(&t, NULL, aborter, &a);
        run_ranks(n, cs, abort_loop_rank, NULL);
        pthread_join(t, NULL);
        for (int i = 0; i < n; i++) zs_comm_free(cs[i]);
    }
}

/* ---- mismatches and bad arguments -------------------------------------------------------- */

static void mismatch_rank(zs_comm *c, void *arg) {
    (void)arg;
    int rank = zs_comm_rank(c);
    char buf[64] = {0}, out[128];
    int rc = zs_comm_all_gather(c, buf, out, rank ? 20 : 10, NULL);
    TCHECK(rc == ZS_EINVAL, "size mismatch gave %d", rc);
    TCHECK(strstr(zs_errmsg(), "disagree") && strstr(zs_errmsg(), "bytes_per_rank=20"),
           "message: %s", zs_errmsg());
    rc = rank ? zs_comm_barrier(c) : zs_comm_broadcast(c, buf, 8, 0, NULL);
    TCHECK(rc == ZS_EINVAL, "kind mismatch gave %d", rc);
    TCHECK(strstr(zs_errmsg(), "broadcast") && strstr(zs_errmsg(), "barrier"), "message: %s",
           zs_errmsg());
    /* the group still works afterwards */
    int g = 1;
    rc = zs_comm_agree(c, 0, &g);
    TCHECK(rc == 0 && g == 0, "agree after mismatch: %d %s", rc, zs_errmsg());
}

static void test_errors(void) {
    zs_comm *cs[4];
    CHECK_ERR(zs_comm_local_create(0, cs), "group size");
    CHECK_ERR(zs_comm_local_create(2, NULL), "NULL");
    CHECK_ERR(zs_comm_all_gather(NULL, NULL, NULL, 0, NULL), "NULL communicator");

    CHECK(zs_comm_local_create(3, cs) == 0, "create");
    CHECK(zs_comm_size(cs[1]) == 3 && zs_comm_rank(cs[1]) == 1, "rank/size");
    CHECK(strcmp(zs_comm_name(cs[2]), "local") == 0, "name");
    zs_comm_free(cs[0]);
    zs_comm_free(cs[2]);
    zs_comm_free(cs[1]);

    /* a bad argument on one rank aborts the group (the others would wait forever) */
    CHECK(zs_comm_local_create(1, cs) == 0, "create");
    float x = 1;
    int g;
    CHECK_ERR(zs_comm_broadcast(cs[0], &x, 4, 1, NULL), "root out of range", "aborted");
    CHECK(zs_comm_barrier(cs[0]) == ZS_ECANCELLED, "group should be aborted");
    zs_comm_free(cs[0]);
    CHECK(zs_comm_local_create(1, cs) == 0, "create");
    CHECK_ERR(zs_comm_all_reduce(cs[0], NULL, &x, 1, ZS_F32, ZS_RED_SUM, NULL), "NULL buffer");
    zs_comm_free(cs[0]);
    CHECK(zs_comm_local_create(1, cs) == 0, "create");
    CHECK_ERR(zs_comm_all_reduce(cs[0], &x, &x, 1, (zs_dtype)7, ZS_RED_SUM, NULL), "dtype");
    zs_comm_free(cs[0]);
    CHECK(zs_comm_local_create(1, cs) == 0, "create");
    CHECK_ERR(zs_comm_reduce_scatter(cs[0], &x, &x, 1, ZS_F32, (zs_redop)5, NULL), "op");
    zs_comm_free(cs[0]);
    CHECK(zs_comm_local_create(2, cs) == 0, "create"); /* fails before waiting for rank 1 */
    CHECK_ERR(zs_comm_all_gather(cs[0], &x, &x, SIZE_MAX / 2 + 2, NULL), "overflow");
    CHECK(zs_comm_barrier(cs[1]) == ZS_ECANCELLED, "the other rank must not wait");
    zs_comm_free(cs[0]);
    zs_comm_free(cs[1]);
    CHECK(zs_comm_local_create(1, cs) == 0, "create");
    CHECK_ERR(zs_comm_agree(cs[0], 0, NULL), "NULL");
    zs_comm_free(cs[0]);

    /* n = 1 is plain copies, and agree returns the own status */
    CHECK(zs_comm_local_create(1, cs) == 0, "create");
    CHECK(zs_comm_agree(cs[0], ZS_ENOSPC, &g) == 0 && g == ZS_ENOSPC, "agree n=1");
    zs_comm_free(cs[0]);
    zs_comm_free(NULL);
    zs_comm_abort(NULL);

    for (int n = 2; n <= 3; n++) run_ranks(n, NULL, mismatch_rank, NULL);
}

/* ---- NCCL ---------------------------------------------------------------------------------- */

#ifdef ZS_CUDA
#define CU(x)                                                                              \
    do {                                                                                   \
        cudaError_t e_ = (x);                                                              \
        TCHECK(e_ == cudaSuccess, "%s: %s", #x, cudaGetErrorString(e_));                    \
    } while (0)

static int nccl_devs[8];

static void nccl_rank(zs_comm *c, void *arg) {
    (void)arg;
    int n = zs_comm_size(c), rank = zs_comm_rank(c);
    CU(cudaSetDevice(nccl_devs[rank]));
    cudaStream_t st;
    CU(cudaStreamCreate(&st));
    size_t cnt = 4099, es = 4;
    float *h = malloc(cnt * n * es), *hr = malloc(cnt * n * es);
    void *d_send = NULL, *d_recv = NULL;
    CU(cudaMalloc(&d_send, cnt * n * es));
    CU(cudaMalloc(&d_recv, cnt * n * es));
    /* small integers: sums are exact in any order */
    for (size_t i = 0; i < cnt * n; i++) h[i] = (float)((rank * 7 + (int)i) % 13 - 6);
    CU(cudaMemcpy(d_send, h, cnt * n * es, cudaMemcpyHostToDevice));

    /* all_gather */
    TCHECK(zs_comm_all_gather(c, d_send, d_recv, cnt * es, st) == 0, "%s", zs_errmsg());
    CU(cudaStreamSynchronize(st));
    CU(cudaMemcpy(hr, d_recv, cnt * n * es, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int r = 0; r < n; r++)
        for (size_t i = 0; i < cnt; i++) bad += hr[r * cnt + i] != (float)((r * 7 + (int)i) % 13 - 6);
    TCHECK(bad == 0, "nccl all_gather: %d wrong", bad);

    /* all_reduce sum, in place */
    CU(cudaMemcpy(d_recv, h, cnt * es, cudaMemcpyHostToDevice));
    TCHECK(zs_comm_all_reduce(c, d_recv, d_recv, cnt, ZS_F32, ZS_RED_SUM, st) == 0, "%s",
           zs_errmsg());
    CU(cudaStreamSynchronize(st));
    CU(cudaMemcpy(hr, d_recv, cnt * es, cudaMemcpyDeviceToHost));
    bad = 0;
    for (size_t i = 0; i < cnt; i++) {
        float s = 0;
        for (int r = 0; r < n; r++) s += (float)((r * 7 + (int)i) % 13 - 6);
        bad += hr[i] != s;
    }
    TCHECK(bad == 0, "nccl all_reduce: %d wrong", bad);

    /* reduce_scatter max */
    TCHECK(zs_comm_reduce_scatter(c, d_send, d_recv, cnt, ZS_F32, ZS_RED_MAX, st) == 0, "%s",
           zs_errmsg());
    CU(cudaStreamSynchronize(st));
    CU(cudaMemcpy(hr, d_recv, cnt * es, cudaMemcpyDeviceToHost));
    bad = 0;
    for (size_t i = 0; i < cnt; i++) {
        size_t e = (size_t)rank * cnt + i;
        float m = -1e30f;
        for (int r = 0; r < n; r++) m = ZS_MAX(m, (float)((r * 7 + (int)e) % 13 - 6));
        bad += hr[i] != m;
    }
    TCHECK(bad == 0, "nccl reduce_scatter: %d wrong", bad);

    /* bf16 all_reduce sum of small integers (exact) */
    uint16_t *hb = malloc(cnt * 2);
    for (size_t i = 0; i < cnt; i++) hb[i] = zs_f32_to_bf16((float)(rank + (int)(i % 5)));
    CU(cudaMemcpy(d_send, hb, cnt * 2, cudaMemcpyHostToDevice));
    TCHECK(zs_comm_all_reduce(c, d_send, d_recv, cnt, ZS_BF16, ZS_RED_SUM, st) == 0, "%s",
           zs_errmsg());
    CU(cudaStreamSynchronize(st));
    CU(cudaMemcpy(hb, d_recv, cnt * 2, cudaMemcpyDeviceToHost));
    bad = 0;
    for (size_t i = 0; i < cnt; i++)
        bad += zs_bf16_to_f32(hb[i]) != (float)(n * (n - 1) / 2 + n * (int)(i % 5));
    TCHECK(bad == 0, "nccl bf16 all_reduce: %d wrong", bad);
    free(hb);

    /* broadcast from the last rank */
    for (size_t i = 0; i < cnt; i++) h[i] = (float)(rank * 1000 + (int)i);
    CU(cudaMemcpy(d_send, h, cnt * es, cudaMemcpyHostToDevice));
    TCHECK(zs_comm_broadcast(c, d_send, cnt * es, n - 1, st) == 0, "%s", zs_errmsg());
    CU(cudaStreamSynchronize(st));
    CU(cudaMemcpy(hr, d_send, cnt * es, cudaMemcpyDeviceToHost));
    bad = 0;
    for (size_t i = 0; i < cnt; i++) bad += hr[i] != (float)((n - 1) * 1000 + (int)i);
    TCHECK(bad == 0, "nccl broadcast: %d wrong", bad);

    int g = 1;
    TCHECK(zs_comm_agree(c, rank == 0 ? ZS_EIO : 0, &g) == 0 && g == ZS_EIO, "nccl agree: %s",
           zs_errmsg());
    TCHECK(zs_comm_barrier(c) == 0, "nccl barrier: %s", zs_errmsg());
    for (int i = 0; i < 200; i++)
        TCHECK(zs_comm_agree(c, 0, &g) == 0 && g == 0, "nccl agree loop: %s", zs_errmsg());
    cudaFree(d_send);
    cudaFree(d_recv);
    cudaStreamDestroy(st);
    free(h);
    free(hr);
}

static void test_nccl(void) {
    int ndev = 0;
    zs_comm *cs[8];
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        int dev0 = 0;
        int rc = zs_comm_nccl_create(1, &dev0, cs);
        CHECK_ERR(rc, "comm nccl");
        fprintf(stderr, "test-comm: no GPU, NCCL create failed cleanly: %s\n", zs_errmsg());
        return;
    }
    int n = ZS_MIN(ndev, 4);
    for (int i = 0; i < n; i++) nccl_devs[i] = i;
    int dup[2] = {0, 0};
    if (ndev >= 1) CHECK_ERR(zs_comm_nccl_create(2, dup, cs), "both use device");
    int rc = zs_comm_nccl_create(n, nccl_devs, cs);
    CHECK(rc == 0, "nccl create on %d devices: %s", n, zs_errmsg());
    if (rc) return;
    CHECK(strcmp(zs_comm_name(cs[0]), "nccl") == 0, "name");
    run_ranks(n, cs, nccl_rank, NULL);
    for (int i = 0; i < n; i++) zs_comm_free(cs[i]);

    /* abort while a rank waits in a barrier for absent ranks */
    if (n >= 2) {
        CHECK(zs_comm_nccl_create(n, nccl_devs, cs) == 0, "%s", zs_errmsg());
        pthread_t t;
        aborter_arg a = {cs[0], 300};
        pthread_create(&t, NULL, aborter, &a);
        run_ranks(n, cs, abort_waiting, NULL);
        pthread_join(t, NULL);
        for (int i = 0; i < n; i++) zs_comm_free(cs[i]);
    }
    fprintf(stderr, "test-comm: NCCL smoke test on %d device(s) done\n", n);
}
#else
static void test_nccl(void) {
    zs_comm *cs[1];
    int dev0 = 0;
    int rc = zs_comm_nccl_create(1, &dev0, cs);
    CHECK(rc == ZS_EUNSUPPORTED, "nccl create without CUDA: %d", rc);
    CHECK(strstr(zs_errmsg(), "without CUDA") != NULL, "message: %s", zs_errmsg());
}
#endif

int main(void) {
    signal(SIGALRM, on_alarm);
    alarm(getenv("ZS_ASAN") ? 600 : 300);
    double t0 = zs_now();
    test_order_sensitive();
    for (int n = 1; n <= 4; n++) {
        run_ranks(n, NULL, ag_rank, NULL);
        run_ranks(n, NULL, red_rank, NULL);
        run_ranks(n, NULL, bc_rank, NULL);
        run_ranks(n, NULL, agree_rank, NULL);
    }
    double t1 = zs_now();
    for (int n = 1; n <= 4; n++) run_ranks(n, NULL, stress_rank, NULL);
    double t2 = zs_now();
    test_abort();
    test_errors();
    test_nccl();
    fprintf(stderr, "test-comm: basic %.2fs, stress (%d mixed collectives x n=1..4) %.2fs\n",
            t1 - t0, STRESS_ITERS, t2 - t1);
    return tu_finish("test-comm");
}
