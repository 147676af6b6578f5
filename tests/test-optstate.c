/* test-optstate.c — tests of the optimizer state placement (engine/train/optstate.c): cpu arrays
 * and the nvme file (O_DIRECT io_uring under /tmp, the pread/pwrite fallback under /dev/shm with
 * ZS_STORE_NO_DIRECT and under /tmp with ZS_STORE_PREAD) over several bucket sizes, sub-group
 * sizes and buffer counts. Each configuration is filled with zs_optstate_write from a known
 * pattern, stepped twice with an element-wise update (once with a skipped bucket), read back and
 * compared BIT FOR BIT with the same update on plain arrays; the callback's (b, off, n, last)
 * sequence is checked against the sub-group order of optstate.h. Also: callback errors and I/O
 * errors (a missing directory, a file truncated behind the state's back) stop the step with a
 * message naming the problem, range errors, stats (nvme host memory = buffer_count sub-groups,
 * whatever the model size), the file's layout size, replacement of a leftover file and its
 * removal at close. Scratch files go under $TMPDIR (or /tmp) and /dev/shm. */
#define _GNU_SOURCE
#include "common.h"
#include "dsconfig.h"
#include "optstate.h"
#include "testutil.h"

#include <fcntl.h>
#include <stdint.h>

#define NB 5
static const size_t SIZES[NB] = {0, 1, 1000, 5000, ((size_t)1 << 20) + 3};

/* ------------------------------------------------------------------ helpers ---- */

static uint32_t hash3(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t h = a * 0x9E3779B1u ^ (b + 0x7F4A7C15u) * 0x85EBCA77u ^ c * 0xC2B2AE3Du;
    h ^= h >> 15;
    h *= 0x2C1B3C6Du;
    h ^= h >> 12;
    h *= 0x297A2D39u;
    h ^= h >> 15;
    return h;
}

/* A value with a varied mantissa and exponent, so that rounding differences would show. */
static float pattern(int r, int b, size_t i) {
    uint32_t h = hash3((uint32_t)r, (uint32_t)b, (uint32_t)i);
    float x = (float)((int32_t)(h % 2000001u) - 1000000) * 1e-6f;
    return ldexpf(x, (int)((h >> 24) % 9) - 4);
}

/* The update under test: identical code for the state (through the callback) and the reference. */
static void update(float *master, float *m, float *v, size_t n) {
    for (size_t i = 0; i < n; i++) {
        master[i] += 0.5f * m[i] - v[i];
        m[i] *= 1.25f;
        v[i] += 1.0f;
    }
}

typedef struct {
    int b, last;
    size_t off, n;
} visit;

typedef struct {
    visit *log;
    size_t count, cap;
    long fail_at; /* -1: never; else return ZS_ECANCELLED at this call (before updating) */
    int aligned;  /* every pointer handed over was 4-byte aligned and distinct */
} cb_state;

static int cb(void *ud, int b, size_t off, size_t n, float *master, float *m, float *v, int last) {
    cb_state *c = ud;
    if (c->fail_at >= 0 && (long)c->count == c->fail_at)
        return zs_err(ZS_ECANCELLED, "test callback refuses sub-group %zu", c->count);
    if (c->count == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 256;
        c->log = realloc(c->log, c->cap * sizeof *c->log);
    }
    c->log[c->count++] = (visit){b, last, off, n};
    if (!master || !m || !v || master == m || m == v) c->aligned = 0;
    update(master, m, v, n);
    return 0;
}

/* The expected visiting order of a step. */
static size_t expected_visits(const size_t *elems, int nb, size_t sg, const unsigned char *skip,
                              visit *out) {
    size_t c = 0;
    for (int b = 0; b < nb; b++) {
        if (elems[b] == 0 || (skip && skip[b])) continue;
        for (size_t off = 0; off < elems[b]; off += sg) {
            size_t n = ZS_MIN(sg, elems[b] - off);
            if (out) out[c] = (visit){b, off + n == elems[b], off, n};
            c++;
        }
    }
    return c;
}

static int check_visits(const cb_state *c, const size_t *elems, int nb, size_t sg,
                        const unsigned char *skip, const char *what) {
    size_t ne = expected_visits(elems, nb, sg, skip, NULL);
    visit *ex = malloc((ne ? ne : 1) * sizeof *ex);
    expected_visits(elems, nb, sg, skip, ex);
    int ok = c->count == ne;
    CHECK(c->count == ne, "%s: %zu callback calls, expected %zu", what, c->count, ne);
    for (size_t i = 0; ok && i < ne; i++) {
        const visit *a = &c->log[i], *e = &ex[i];
        if (a->b != e->b || a->off != e->off || a->n != e->n || a->last != e->last) {
            ok = 0;
            CHECK(0,
                  "%s: call %zu was (b %d, off %zu, n %zu, last %d), expected (%d, %zu, %zu, %d)",
                  what, i, a->b, a->off, a->n, a->last, e->b, e->off, e->n, e->last);
        }
    }
    free(ex);
    return ok;
}

static size_t rbytes(size_t n) { return ZS_ALIGN_UP(n * 4, (size_t)4096); }

/* File size of the layout of optstate.h. */
static size_t layout_bytes(const size_t *elems, int nb, size_t sg) {
    size_t t = 0;
    for (int b = 0; b < nb; b++)
        for (size_t off = 0; off < elems[b]; off += sg)
            t += 3 * rbytes(ZS_MIN(sg, elems[b] - off));
    return t;
}

static size_t max_sub_group(const size_t *elems, int nb, size_t sg) {
    size_t m = 0;
    for (int b = 0; b < nb; b++)
        m = ZS_MAX(m, ZS_MIN(sg, elems[b]));
    return m;
}

static int file_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

typedef struct {
    float *a[3][NB];
} ref_state;

static void ref_init(ref_state *R) {
    for (int r = 0; r < 3; r++)
        for (int b = 0; b < NB; b++) {
            R->a[r][b] = malloc((SIZES[b] ? SIZES[b] : 1) * sizeof(float));
            for (size_t i = 0; i < SIZES[b]; i++)
                R->a[r][b][i] = pattern(r, b, i);
        }
}

static void ref_free(ref_state *R) {
    for (int r = 0; r < 3; r++)
        for (int b = 0; b < NB; b++)
            free(R->a[r][b]);
}

/* ref += one step over the buckets not skipped (and, with limit >= 0, only the first limit
 * sub-groups of that step). */
static void ref_step(ref_state *R, size_t sg, const unsigned char *skip, long limit) {
    long g = 0;
    for (int b = 0; b < NB; b++) {
        if (skip && skip[b]) continue;
        for (size_t off = 0; off < SIZES[b]; off += sg, g++) {
            if (limit >= 0 && g >= limit) return;
            size_t n = ZS_MIN(sg, SIZES[b] - off);
            update(R->a[0][b] + off, R->a[1][b] + off, R->a[2][b] + off, n);
        }
    }
}

/* Fills the state from R with unaligned pieces: master alone first, then m and v together. */
static int fill(zs_optstate *s, ref_state *R) {
    for (int b = 0; b < NB; b++) {
        size_t e = SIZES[b];
        size_t c1[4] = {0, ZS_MIN(e, e / 3 + 1), ZS_MIN(e, 2 * e / 3 + 5), e};
        for (int k = 0; k < 3; k++) {
            size_t lo = c1[k], hi = ZS_MAX(c1[k], c1[k + 1]);
            if (zs_optstate_write(s, b, lo, hi - lo, R->a[0][b] + lo, NULL, NULL) < 0) return -1;
        }
        size_t mid = ZS_MIN(e, e / 2 + 7);
        if (zs_optstate_write(s, b, 0, mid, NULL, R->a[1][b], R->a[2][b]) < 0) return -1;
        if (zs_optstate_write(s, b, mid, e - mid, NULL, R->a[1][b] + mid, R->a[2][b] + mid) < 0)
            return -1;
    }
    return 0;
}

/* Reads everything back and compares bit for bit; then a few odd ranges with a NULL array. */
static void compare(zs_optstate *s, ref_state *R, const char *what) {
    for (int b = 0; b < NB; b++) {
        size_t e = SIZES[b];
        float *got[3];
        for (int r = 0; r < 3; r++)
            got[r] = malloc((e ? e : 1) * sizeof(float));
        int rc = zs_optstate_read(s, b, 0, e, got[0], got[1], got[2]);
        CHECK(rc == 0, "%s: read bucket %d: %s", what, b, zs_errmsg());
        for (int r = 0; r < 3 && rc == 0; r++) {
            size_t bad = e;
            for (size_t i = 0; i < e && bad == e; i++)
                if (memcmp(&got[r][i], &R->a[r][b][i], sizeof(float)) != 0) bad = i;
            CHECK(bad == e, "%s: bucket %d array %d differs first at element %zu (%a vs %a)", what,
                  b, r, bad, bad < e ? got[r][bad] : 0.0, bad < e ? R->a[r][b][bad] : 0.0);
        }
        if (e > 10) { /* an odd range crossing sub-group and page borders, v not asked for */
            size_t lo = e / 7 + 3, n = ZS_MIN(e - lo, (size_t)4099);
            float *mm = calloc(n, sizeof(float)), *ma = calloc(n, sizeof(float));
            rc = zs_optstate_read(s, b, lo, n, ma, mm, NULL);
            CHECK(rc == 0 && !memcmp(ma, R->a[0][b] + lo, n * 4) &&
                      !memcmp(mm, R->a[1][b] + lo, n * 4),
                  "%s: range read of bucket %d [%zu, %zu) (rc %d)", what, b, lo, lo + n, rc);
            free(mm);
            free(ma);
        }
        for (int r = 0; r < 3; r++)
            free(got[r]);
    }
}

/* ------------------------------------------------------------------ the matrix ---- */

typedef struct {
    int device;
    const char *dir;
    const char *env;   /* environment knob set for this run, or NULL */
    int expect_direct; /* 1: must be O_DIRECT io_uring, 0: must be the fallback, -1: either */
} placement;

static void run_config(const placement *P, size_t sg_opt, int nbuf, int qd, int rank) {
    char what[256];
    snprintf(what, sizeof what, "%s%s%s sub_group %zu buffers %d queue depth %d",
             P->device == ZS_OFFLOAD_CPU ? "cpu" : "nvme ",
             P->device == ZS_OFFLOAD_CPU ? "" : P->dir, P->env ? " (fallback forced)" : "", sg_opt,
             nbuf, qd);
    size_t sg = sg_opt ? sg_opt : 1000000000;
    if (P->env) setenv(P->env, "1", 1);
    zs_optstate_opts o = {.device = P->device,
                          .dir = P->dir,
                          .rank = rank,
                          .sub_group = sg_opt,
                          .buffer_count = nbuf,
                          .pin_memory = 0,
                          .queue_depth = qd};
    zs_optstate *s = NULL;
    int rc = zs_optstate_open(&o, NB, SIZES, &s);
    if (P->env) unsetenv(P->env);
    CHECK(rc == 0, "%s: open: %s", what, zs_errmsg());
    if (rc < 0) return;
    char path[600];
    snprintf(path, sizeof path, "%s/zs-optimizer-rank%d.bin", P->dir ? P->dir : "", rank);
    if (P->device == ZS_OFFLOAD_NVME) {
        struct stat st;
        CHECK(stat(path, &st) == 0 && (size_t)st.st_size == layout_bytes(SIZES, NB, sg),
              "%s: %s should exist with %zu bytes", what, path, layout_bytes(SIZES, NB, sg));
    }

    ref_state R;
    ref_init(&R);
    CHECK(fill(s, &R) == 0, "%s: fill: %s", what, zs_errmsg());
    compare(s, &R, what);

    cb_state c = {.fail_at = -1, .aligned = 1};
    rc = zs_optstate_step(s, NULL, cb, &c);
    CHECK(rc == 0, "%s: step 1: %s", what, zs_errmsg());
    check_visits(&c, SIZES, NB, sg, NULL, what);
    ref_step(&R, sg, NULL, -1);

    unsigned char skip[NB] = {0, 0, 1, 0, 0};
    c.count = 0;
    rc = zs_optstate_step(s, skip, cb, &c);
    CHECK(rc == 0, "%s: step 2: %s", what, zs_errmsg());
    check_visits(&c, SIZES, NB, sg, skip, what);
    CHECK(c.aligned, "%s: the callback got NULL or aliased arrays", what);
    ref_step(&R, sg, skip, -1);
    compare(s, &R, what);

    zs_optstate_stats st;
    zs_optstate_stats_get(s, &st);
    size_t sum = 0;
    for (int b = 0; b < NB; b++)
        sum += SIZES[b];
    if (P->device == ZS_OFFLOAD_CPU) {
        CHECK(st.host_bytes == 3 * sum * 4 && st.file_bytes == 0 && st.bytes_read == 0 &&
                  st.direct == 0,
              "%s: stats host %zu file %zu read %llu direct %d", what, st.host_bytes, st.file_bytes,
              (unsigned long long)st.bytes_read, st.direct);
        float *ma, *mm, *mv;
        CHECK(zs_optstate_arrays(s, 4, &ma, &mm, &mv) == 0 && ma && mm && mv &&
                  (uintptr_t)ma % 64 == 0 && !memcmp(ma, R.a[0][4], SIZES[4] * 4) &&
                  !memcmp(mv, R.a[2][4], SIZES[4] * 4),
              "%s: arrays of bucket 4", what);
        CHECK(zs_optstate_arrays(s, 0, &ma, &mm, &mv) == 0 && !ma && !mm && !mv,
              "%s: arrays of empty bucket 0", what);
    } else {
        size_t slot = 3 * rbytes(max_sub_group(SIZES, NB, sg));
        size_t moved = 3 * (sum + (sum - SIZES[2])) * 4; /* two steps, at least the elements */
        CHECK(st.host_bytes == (size_t)nbuf * slot, "%s: host_bytes %zu, expected %d x %zu", what,
              st.host_bytes, nbuf, slot);
        CHECK(st.file_bytes == layout_bytes(SIZES, NB, sg), "%s: file_bytes %zu", what,
              st.file_bytes);
        CHECK(st.bytes_read >= moved && st.bytes_written >= moved && st.io_wait_s >= 0,
              "%s: bytes read %llu written %llu (at least %zu)", what,
              (unsigned long long)st.bytes_read, (unsigned long long)st.bytes_written, moved);
        CHECK(P->expect_direct < 0 || st.direct == P->expect_direct, "%s: direct %d, expected %d",
              what, st.direct, P->expect_direct);
        if (P->expect_direct < 0 && !st.direct && sg_opt == 1000 && nbuf == 1)
            fprintf(stderr,
                    "note: %s: no O_DIRECT io_uring here; the fallback was tested instead\n", what);
        float *ma;
        CHECK_ERR(zs_optstate_arrays(s, 1, &ma, NULL, NULL), "nvme");
    }
    zs_optstate_close(s);
    if (P->device == ZS_OFFLOAD_NVME)
        CHECK(!file_exists(path), "%s: %s left behind by close", what, path);
    free(c.log);
    ref_free(&R);
}

/* ------------------------------------------------------------------ error paths ---- */

/* A callback error at the k-th sub-group: the step returns it; earlier sub-groups are updated,
 * later ones are the old state. */
static void test_callback_error(const placement *P) {
    char what[200];
    snprintf(what, sizeof what, "callback error (%s%s)", P->dir ? P->dir : "cpu",
             P->env ? ", fallback" : "");
    if (P->env) setenv(P->env, "1", 1);
    zs_optstate_opts o = {
        .device = P->device, .dir = P->dir, .rank = 1, .sub_group = 1000, .buffer_count = 3};
    zs_optstate *s = NULL;
    int rc = zs_optstate_open(&o, NB, SIZES, &s);
    if (P->env) unsetenv(P->env);
    CHECK(rc == 0, "%s: open: %s", what, zs_errmsg());
    if (rc < 0) return;
    ref_state R;
    ref_init(&R);
    CHECK(fill(s, &R) == 0, "%s: fill: %s", what, zs_errmsg());
    cb_state c = {.fail_at = 9, .aligned = 1};
    rc = zs_optstate_step(s, NULL, cb, &c);
    CHECK(rc == ZS_ECANCELLED, "%s: step returned %d", what, rc);
    CHECK_ERR(rc, "test callback refuses sub-group 9");
    CHECK(c.count == 9, "%s: %zu sub-groups updated before the error", what, c.count);
    ref_step(&R, 1000, NULL, 9);
    compare(s, &R, what);
    /* the state is still usable: a full step afterwards */
    c.fail_at = -1;
    c.count = 0;
    rc = zs_optstate_step(s, NULL, cb, &c);
    CHECK(rc == 0, "%s: step after the error: %s", what, zs_errmsg());
    ref_step(&R, 1000, NULL, -1);
    compare(s, &R, what);
    zs_optstate_close(s);
    free(c.log);
    ref_free(&R);
}

/* The file loses its second half behind the state's back: the step fails naming the file, the
 * offset and the sub-group, after waiting for its writes. */
static void test_io_error(const char *dir, const char *env) {
    if (env) setenv(env, "1", 1);
    zs_optstate_opts o = {
        .device = ZS_OFFLOAD_NVME, .dir = dir, .rank = 2, .sub_group = 4096, .buffer_count = 4};
    zs_optstate *s = NULL;
    int rc = zs_optstate_open(&o, NB, SIZES, &s);
    if (env) unsetenv(env);
    CHECK(rc == 0, "io error: open: %s", zs_errmsg());
    if (rc < 0) return;
    char path[600];
    snprintf(path, sizeof path, "%s/zs-optimizer-rank2.bin", dir);
    zs_optstate_stats st;
    zs_optstate_stats_get(s, &st);
    CHECK(truncate(path, (off_t)(st.file_bytes / 2 + 100)) == 0, "truncate %s", path);
    cb_state c = {.fail_at = -1, .aligned = 1};
    rc = zs_optstate_step(s, NULL, cb, &c);
    CHECK(rc == ZS_EIO, "io error (%s%s): step returned %d: %s", dir, env ? ", fallback" : "", rc,
          zs_errmsg());
    CHECK_ERR(rc, path, "offset", "sub-group", "end of file");
    CHECK(c.count > 0 && c.count < expected_visits(SIZES, NB, 4096, NULL, NULL),
          "io error: %zu sub-groups updated before the error", c.count);
    zs_optstate_close(s);
    CHECK(!file_exists(path), "io error: %s left behind", path);
    free(c.log);
}

static void test_open_and_range_errors(const char *dir) {
    zs_optstate *s = NULL;
    char missing[600];
    snprintf(missing, sizeof missing, "%s/no-such-dir", dir);
    zs_optstate_opts o = {.device = ZS_OFFLOAD_NVME, .dir = missing};
    int rc = zs_optstate_open(&o, NB, SIZES, &s);
    CHECK(rc == ZS_ENOTFOUND && !s, "missing directory: rc %d", rc);
    CHECK_ERR(rc, missing, "does not exist");
    o.dir = NULL;
    CHECK_ERR(zs_optstate_open(&o, NB, SIZES, &s), "directory");
    zs_optstate_opts bad = {.device = 7};
    CHECK_ERR(zs_optstate_open(&bad, NB, SIZES, &s), "device 7");
    bad = (zs_optstate_opts){.device = ZS_OFFLOAD_CPU, .buffer_count = -1};
    CHECK_ERR(zs_optstate_open(&bad, NB, SIZES, &s), "buffer_count");
    bad.buffer_count = 0;
    CHECK_ERR(zs_optstate_open(&bad, 0, SIZES, &s), "bucket");

    for (int dev = ZS_OFFLOAD_NONE; dev <= ZS_OFFLOAD_NVME; dev++) {
        zs_optstate_opts ok = {.device = dev, .dir = dir, .sub_group = 100};
        size_t el[3] = {10, 0, 250};
        rc = zs_optstate_open(&ok, 3, el, &s);
        CHECK(rc == 0, "range test open (device %d): %s", dev, zs_errmsg());
        if (rc < 0) continue;
        float buf[300] = {0};
        CHECK(zs_optstate_read(s, 3, 0, 1, buf, NULL, NULL) == ZS_ERANGE, "bucket 3 of 3");
        CHECK_ERR(zs_optstate_read(s, 3, 0, 1, buf, NULL, NULL), "bucket 3");
        CHECK(zs_optstate_write(s, -1, 0, 1, buf, NULL, NULL) == ZS_ERANGE, "bucket -1");
        CHECK(zs_optstate_read(s, 0, 5, 6, buf, buf, buf) == ZS_ERANGE, "[5, 11) of 10");
        CHECK_ERR(zs_optstate_write(s, 2, 200, 51, buf, NULL, NULL), "exceed", "250");
        CHECK(zs_optstate_read(s, 0, 11, 0, buf, NULL, NULL) == ZS_ERANGE, "off 11 of 10");
        CHECK(zs_optstate_read(s, 0, 10, 0, buf, NULL, NULL) == 0, "empty range at the end");
        CHECK(zs_optstate_read(s, 1, 0, 0, buf, NULL, NULL) == 0, "empty range of an empty bucket");
        CHECK(zs_optstate_read(s, 1, 0, 1, buf, NULL, NULL) == ZS_ERANGE, "empty bucket");
        /* a fresh state is all zero */
        for (int i = 0; i < 300; i++)
            buf[i] = 1.0f;
        CHECK(zs_optstate_read(s, 2, 0, 250, NULL, NULL, buf) == 0 && buf[0] == 0.0f &&
                  buf[249] == 0.0f && buf[250] == 1.0f,
              "fresh state reads zero (device %d)", dev);
        CHECK(zs_optstate_step(s, NULL, NULL, NULL) == ZS_EINVAL, "step without a callback");
        zs_optstate_close(s);
    }
    zs_optstate_close(NULL);
}

/* Host memory of nvme is buffer_count sub-groups whatever the model size; a leftover file is
 * replaced; an all-empty state works; pin_memory works (or warns). */
static void test_stats_and_files(const char *dir) {
    size_t small[1] = {5000}, big[3] = {5000, ((size_t)1 << 20) + 3, 77777};
    zs_optstate_opts o = {.device = ZS_OFFLOAD_NVME,
                          .dir = dir,
                          .rank = 3,
                          .sub_group = 1000,
                          .buffer_count = 2,
                          .pin_memory = 1};
    char path[600];
    snprintf(path, sizeof path, "%s/zs-optimizer-rank3.bin", dir);
    char junk[10000];
    memset(junk, 0x7f, sizeof junk);
    CHECK(tu_write_file(path, junk, sizeof junk) == 0, "write leftover %s", path);
    zs_optstate *s1 = NULL, *s2 = NULL;
    CHECK(zs_optstate_open(&o, 1, small, &s1) == 0, "open small: %s", zs_errmsg());
    if (s1) {
        float v[5000];
        CHECK(zs_optstate_read(s1, 0, 0, 5000, v, NULL, NULL) == 0 && v[0] == 0.0f &&
                  v[2600] == 0.0f && v[4999] == 0.0f,
              "a leftover file is replaced by zeros");
        struct stat st;
        CHECK(stat(path, &st) == 0 && (size_t)st.st_size == layout_bytes(small, 1, 1000),
              "leftover size %lld", (long long)st.st_size);
    }
    o.rank = 4;
    CHECK(zs_optstate_open(&o, 3, big, &s2) == 0, "open big: %s", zs_errmsg());
    if (s1 && s2) {
        zs_optstate_stats a, b;
        zs_optstate_stats_get(s1, &a);
        zs_optstate_stats_get(s2, &b);
        CHECK(a.host_bytes == 2 * 3 * 4096 && b.host_bytes == a.host_bytes,
              "host_bytes %zu / %zu, expected %d", a.host_bytes, b.host_bytes, 2 * 3 * 4096);
        CHECK(a.file_bytes == layout_bytes(small, 1, 1000) &&
                  b.file_bytes == layout_bytes(big, 3, 1000),
              "file_bytes %zu / %zu", a.file_bytes, b.file_bytes);
        CHECK(a.bytes_read > 0 && a.bytes_written == 0, "read/write counters %llu %llu",
              (unsigned long long)a.bytes_read, (unsigned long long)a.bytes_written);
    }
    zs_optstate_close(s1);
    zs_optstate_close(s2);
    CHECK(!file_exists(path), "close removes %s", path);

    size_t none[2] = {0, 0};
    zs_optstate *s = NULL;
    o.rank = 5;
    CHECK(zs_optstate_open(&o, 2, none, &s) == 0, "all-empty state: %s", zs_errmsg());
    if (s) {
        cb_state c = {.fail_at = -1, .aligned = 1};
        CHECK(zs_optstate_step(s, NULL, cb, &c) == 0 && c.count == 0, "all-empty step");
        zs_optstate_stats st;
        zs_optstate_stats_get(s, &st);
        CHECK(st.host_bytes == 0 && st.file_bytes == 0, "all-empty stats %zu %zu", st.host_bytes,
              st.file_bytes);
        zs_optstate_close(s);
        free(c.log);
    }
}

int main(void) {
    char tdir[512], sdir[512] = "";
    if (tu_tmpdir(tdir, sizeof tdir, "optstate") != 0) {
        fprintf(stderr, "cannot create a scratch directory\n");
        return 1;
    }
    snprintf(sdir, sizeof sdir, "/dev/shm/zs-optstate-XXXXXX");
    int have_shm = mkdtemp(sdir) != NULL;
    if (!have_shm) fprintf(stderr, "note: no /dev/shm; the tmpfs fallback runs under %s\n", tdir);
    const char *fdir = have_shm ? sdir : tdir;

    placement cpu = {ZS_OFFLOAD_CPU, NULL, NULL, 0};
    placement nv = {ZS_OFFLOAD_NVME, tdir, NULL, -1};
    placement nvfb = {ZS_OFFLOAD_NVME, fdir, "ZS_STORE_NO_DIRECT", 0};
    placement nvpread = {ZS_OFFLOAD_NVME, tdir, "ZS_STORE_PREAD", 0};
    const size_t sgs[4] = {1000, 4096, 1000000, 0};
    const int nbufs[3] = {1, 2, 4};
    double t0 = zs_now();
    for (int i = 0; i < 4; i++) {
        run_config(&cpu, sgs[i], 0, 0, 0);
        for (int j = 0; j < 3; j++) {
            run_config(&nv, sgs[i], nbufs[j], 0, j);
            run_config(&nvfb, sgs[i], nbufs[j], 0, j);
        }
    }
    run_config(&nvpread, 4096, 2, 0, 7);
    /* one request in flight: 1 MiB chunks of several transfers queue behind each other */
    run_config(&nv, 1000000, 3, 1, 8);
    run_config(&nv, 5000, 4, 2, 9);
    fprintf(stderr, "matrix: %.2f s\n", zs_now() - t0);

    test_callback_error(&cpu);
    test_callback_error(&nv);
    test_callback_error(&nvfb);
    test_io_error(tdir, NULL);
    test_io_error(fdir, "ZS_STORE_NO_DIRECT");
    test_open_and_range_errors(tdir);
    test_stats_and_files(tdir);
    fprintf(stderr, "total: %.2f s\n", zs_now() - t0);

    tu_rmdir(tdir);
    if (have_shm) tu_rmdir(sdir);
    return tu_finish("test-optstate");
}
