/* test-ckpt.c — training checkpoints (engine/ckpt.h): save with 2 ranks and read back the full
 * arrays; save with 3 ranks and read a 2-rank partition; replicated buckets and caller-given
 * shard sizes; `latest`, keep (pruning), re-saving a step, leftover .tmp directories, a failing
 * callback, and the errors of a corrupt, truncated, manifest-less or badly formed checkpoint.
 * The chunked save (zs_ckpt_save_opts.read): byte-identical files, manifest and `latest` to the
 * get path's (the manifest has no timestamp), with buckets larger than ZS_CKPT_CHUNK so that
 * regions really go in several chunks, the order and sizes of the chunks asked for, and a
 * failing read aborting the save without a trace. */
#include <errno.h>
#include <jansson.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt.h"
#include "common.h"
#include "testutil.h"

#define NB 5
static const size_t ELEMS[NB] = {5000, 0, 1, 3000, 70001};
static const unsigned char REPL[NB] = {0, 0, 0, 1, 0};

typedef struct {
    float *a[NB][3]; /* full master, m, v per bucket */
    const zs_ckpt_layout *L;
    int calls, fail_at; /* fail_at > 0: the fail_at-th call returns an error */
} state;

static uint64_t rs = 88172645463325252ull;
static float frand(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (float)((double)(rs >> 11) / 9007199254740992.0 * 2 - 1);
}

static void state_fill(state *s, float bias) {
    for (int b = 0; b < NB; b++)
        for (int k = 0; k < 3; k++) {
            s->a[b][k] = malloc((ELEMS[b] ? ELEMS[b] : 1) * sizeof(float));
            for (size_t i = 0; i < ELEMS[b]; i++) s->a[b][k][i] = frand() + bias;
        }
}

static void state_free(state *s) {
    for (int b = 0; b < NB; b++)
        for (int k = 0; k < 3; k++) free(s->a[b][k]);
}

static int get_cb(void *ud, int rank, int bucket, const float **master, const float **m,
                  const float **v, size_t *n) {
    state *s = ud;
    if (++s->calls == s->fail_at) return zs_err(ZS_EIO, "injected failure");
    size_t start, len;
    int rc = zs_ckpt_shard_range(s->L, bucket, rank, &start, &len);
    if (rc < 0) return rc;
    *master = s->a[bucket][0] + start;
    *m = s->a[bucket][1] + start;
    *v = s->a[bucket][2] + start;
    *n = len;
    return 0;
}

static zs_ckpt_layout layout(int ranks) {
    return (zs_ckpt_layout){.n_buckets = NB, .bucket_elems = ELEMS, .replicated = REPL, .ranks = ranks};
}

static int save(const char *dir, long step, state *s, int ranks, int keep) {
    zs_ckpt_layout L = layout(ranks);
    s->L = &L;
    s->calls = 0;
    char meta[256];
    snprintf(meta, sizeof meta, "{\"epoch\":2,\"index\":%ld,\"rng\":[1,18446744073709551],"
             "\"config\":{\"lr\":0.001,\"name\":\"t\"}}", step * 10);
    zs_ckpt_save_opts o = {.model_dir = "/models/x", .model_fingerprint = "0123456789abcdef",
                           .meta_json = meta, .keep = keep};
    return zs_ckpt_save(dir, step, &L, get_cb, s, &o);
}

/* Reads every bucket through a partition of `ranks` shards and compares with s. */
static int read_matches(zs_ckpt *c, state *s, int ranks) {
    zs_ckpt_layout L = layout(ranks);
    int ok = 1;
    for (int b = 0; b < NB; b++) {
        if (zs_ckpt_bucket_elems(c, b) != ELEMS[b]) ok = 0;
        for (int r = 0; r < ranks; r++) {
            size_t start, len;
            if (zs_ckpt_shard_range(&L, b, r, &start, &len) < 0) return 0;
            if (REPL[b]) { start = 0; len = ELEMS[b]; } /* every rank reads it in full */
            float *buf[3];
            for (int k = 0; k < 3; k++) buf[k] = malloc((len ? len : 1) * 4);
            if (zs_ckpt_read(c, b, start, len, buf[0], buf[1], buf[2]) < 0) ok = 0;
            for (int k = 0; k < 3; k++) {
                if (memcmp(buf[k], s->a[b][k] + start, len * 4) != 0) ok = 0;
                free(buf[k]);
            }
        }
    }
    return ok;
}

static char *pathf(char *buf, size_t n, const char *dir, const char *rel) {
    if (snprintf(buf, n, "%s/%s", dir, rel) >= (int)n) {
        fprintf(stderr, "path too long\n");
        exit(1);
    }
    return buf;
}

static int exists(const char *dir, const char *rel) {
    char p[4200];
    struct stat st;
    return stat(pathf(p, sizeof p, dir, rel), &st) == 0;
}

static int copy_file(const char *from, const char *to) {
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    int ok = a && b;
    char buf[65536];
    size_t n;
    while (ok && (n = fread(buf, 1, sizeof buf, a)) > 0) ok = fwrite(buf, 1, n, b) == n;
    if (a) fclose(a);
    if (b && fclose(b) != 0) ok = 0;
    return ok ? 0 : -1;
}

/* Offset in rankR.bin of region `what` (master/m/v) of bucket b, from the manifest. */
static long region_offset(const char *stepdir, int rank, int bucket, const char *what) {
    char p[4200];
    json_t *j = json_load_file(pathf(p, sizeof p, stepdir, "manifest.json"), 0, NULL);
    if (!j) return -1;
    json_t *regs = json_object_get(json_array_get(json_object_get(j, "files"), (size_t)rank), "regions");
    long off = -1;
    for (size_t i = 0; i < json_array_size(regs); i++) {
        json_t *x = json_array_get(regs, i);
        if (json_integer_value(json_object_get(x, "bucket")) != bucket) continue;
        long elems = (long)json_integer_value(json_object_get(x, "elems"));
        long base = (long)json_integer_value(json_object_get(x, "offset"));
        long a = (elems * 4 + 63) / 64 * 64;
        off = base + (strcmp(what, "master") == 0 ? 0 : strcmp(what, "m") == 0 ? a : 2 * a) + 5;
    }
    json_decref(j);
    return off;
}

static void flip_byte(const char *path, long off) {
    FILE *f = fopen(path, "r+b");
    if (!f) return;
    fseek(f, off, SEEK_SET);
    int c = fgetc(f);
    fseek(f, off, SEEK_SET);
    fputc(c ^ 0x40, f);
    fclose(f);
}

/* ---- the chunked save (zs_ckpt_save_opts.read) ---- */

/* Full master/m/v arrays of nb buckets, served through get or read; read checks the order and
 * the sizes of what it is asked for. */
typedef struct {
    int nb;
    float *const *a; /* a[b * 3 + k] */
    const zs_ckpt_layout *L;
    int calls, fail_at;
    size_t max_n;
    int bad;              /* a call out of order / out of range */
    char why[200];
    int last_r, last_b, last_k;
    size_t next_off, last_len;
} src;

static void src_reset(src *x, const zs_ckpt_layout *L) {
    x->L = L;
    x->calls = 0;
    x->max_n = 0;
    x->bad = 0;
    x->why[0] = 0;
    x->last_r = x->last_b = x->last_k = -1;
    x->next_off = x->last_len = 0;
}

static int src_get(void *ud, int rank, int bucket, const float **master, const float **m,
                   const float **v, size_t *n) {
    src *x = ud;
    if (++x->calls == x->fail_at) return zs_err(ZS_EIO, "injected failure");
    size_t start, len;
    int rc = zs_ckpt_shard_range(x->L, bucket, rank, &start, &len);
    if (rc < 0) return rc;
    *master = x->a[bucket * 3 + 0] + start;
    *m = x->a[bucket * 3 + 1] + start;
    *v = x->a[bucket * 3 + 2] + start;
    *n = len;
    return 0;
}

static void src_bad(src *x, const char *what, int rank, int bucket, int which, size_t off, size_t n) {
    if (!x->bad)
        snprintf(x->why, sizeof x->why, "%s: rank %d bucket %d which %d [%zu, +%zu) after rank %d "
                 "bucket %d which %d up to %zu of %zu", what, rank, bucket, which, off, n, x->last_r,
                 x->last_b, x->last_k, x->next_off, x->last_len);
    x->bad = 1;
}

static int src_read(void *ud, int rank, int bucket, int which, size_t off, size_t n, float *dst) {
    src *x = ud;
    if (++x->calls == x->fail_at) return zs_err(ZS_EIO, "injected failure");
    size_t start, len;
    int rc = zs_ckpt_shard_range(x->L, bucket, rank, &start, &len);
    if (rc < 0) return rc;
    if (which < 0 || which > 2 || n == 0 || n > ZS_CKPT_CHUNK || off > len || n > len - off) {
        src_bad(x, "bad chunk", rank, bucket, which, off, n);
        return zs_err(ZS_EINVAL, "test: bad chunk");
    }
    int same = rank == x->last_r && bucket == x->last_b && which == x->last_k;
    int later = rank > x->last_r || (rank == x->last_r && (bucket > x->last_b ||
                                    (bucket == x->last_b && which > x->last_k)));
    if (same ? off != x->next_off
             : (!later || off != 0 || (x->last_r >= 0 && x->next_off != x->last_len) ||
                (x->last_r == rank && x->last_b == bucket && which != x->last_k + 1)))
        src_bad(x, "out of order", rank, bucket, which, off, n);
    x->last_r = rank;
    x->last_b = bucket;
    x->last_k = which;
    x->next_off = off + n;
    x->last_len = len;
    if (n > x->max_n) x->max_n = n;
    memcpy(dst, x->a[bucket * 3 + which] + start + off, n * 4);
    return 0;
}

/* Chunks a save through read asks for: 3 * ceil(len / ZS_CKPT_CHUNK) per non-empty slice. */
static int chunks_expected(const zs_ckpt_layout *L) {
    int n = 0;
    for (int r = 0; r < L->ranks; r++)
        for (int b = 0; b < L->n_buckets; b++) {
            size_t start, len;
            if (zs_ckpt_shard_range(L, b, r, &start, &len) < 0) return -1;
            n += 3 * (int)((len + ZS_CKPT_CHUNK - 1) / ZS_CKPT_CHUNK);
        }
    return n;
}

static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(len > 0 ? (size_t)len : 1);
    *n = b && len >= 0 && fread(b, 1, (size_t)len, f) == (size_t)len ? (size_t)len : (size_t)-1;
    fclose(f);
    return b;
}

/* 1 when dirA/rel and dirB/rel exist and hold the same bytes. */
static int same_file(const char *a, const char *b, const char *rel) {
    char p[4200], q[4200];
    size_t na, nb;
    unsigned char *x = slurp(pathf(p, sizeof p, a, rel), &na), *y = slurp(pathf(q, sizeof q, b, rel), &nb);
    int ok = x && y && na != (size_t)-1 && na == nb && memcmp(x, y, na) == 0;
    if (!ok) fprintf(stderr, "%s vs %s: %s differs (%zu / %zu bytes)\n", a, b, rel, x ? na : 0, y ? nb : 0);
    free(x);
    free(y);
    return ok;
}

/* The full arrays of every bucket read back from the checkpoint at dir equal x's. */
static int src_matches(const char *dir, const src *x) {
    zs_ckpt *c = NULL;
    if (zs_ckpt_open(dir, &c) < 0) {
        fprintf(stderr, "open %s: %s\n", dir, zs_errmsg());
        return 0;
    }
    int ok = zs_ckpt_n_buckets(c) == x->nb;
    for (int b = 0; ok && b < x->nb; b++) {
        size_t e = zs_ckpt_bucket_elems(c, b);
        float *buf = malloc((e ? e : 1) * 4);
        for (int k = 0; ok && k < 3; k++) {
            float *d[3] = {NULL, NULL, NULL};
            d[k] = buf;
            ok = buf && zs_ckpt_read(c, b, 0, e, d[0], d[1], d[2]) == 0 &&
                 memcmp(buf, x->a[b * 3 + k], e * 4) == 0;
        }
        free(buf);
    }
    zs_ckpt_close(c);
    return ok;
}

/* Saves x under L as step `step` into base/get-<tag> (through get) and base/read-<tag>
 * (through read, get NULL), and checks that every file is byte-identical, the chunks were asked
 * for in order and in the expected number, and both read back equal. 1 when all holds. */
static int save_both_ways(const char *base, const char *tag, long step, src *x, const zs_ckpt_layout *L) {
    char g[4200], r[4200], sd[64], rel[128];
    snprintf(g, sizeof g, "%s/get-%s", base, tag);
    snprintf(r, sizeof r, "%s/read-%s", base, tag);
    snprintf(sd, sizeof sd, "step-%06ld", step);
    const char *meta = "{\"epoch\":3,\"rng\":\"00000000deadbeef\"}";
    zs_ckpt_save_opts o = {.model_dir = "/models/y", .model_fingerprint = "fp", .meta_json = meta};
    src_reset(x, L);
    int rc = zs_ckpt_save(g, step, L, src_get, x, &o);
    CHECK(rc == 0, "%s: save through get: %s", tag, zs_errmsg());
    src_reset(x, L);
    o.read = src_read;
    rc = zs_ckpt_save(r, step, L, NULL, x, &o);
    CHECK(rc == 0, "%s: save through read: %s", tag, zs_errmsg());
    if (rc < 0) return 0;
    int ok = 1;
    CHECK(!x->bad, "%s: read asked %s", tag, x->why);
    CHECK(x->calls == chunks_expected(L), "%s: %d chunks asked for, expected %d", tag, x->calls,
          chunks_expected(L));
    CHECK(x->last_r < 0 || x->next_off == x->last_len, "%s: the last region was read in full", tag);
    ok &= !x->bad && x->calls == chunks_expected(L);
    for (int i = 0; i < L->ranks; i++) {
        snprintf(rel, sizeof rel, "%s/rank%d.bin", sd, i);
        ok &= same_file(g, r, rel);
    }
    snprintf(rel, sizeof rel, "%s/manifest.json", sd);
    ok &= same_file(g, r, rel);
    ok &= same_file(g, r, "latest");
    CHECK(ok, "%s: get and read write the same bytes", tag);
    int mg = src_matches(g, x), mr = src_matches(r, x);
    CHECK(mg && mr, "%s: both read back equal (get %d, read %d)", tag, mg, mr);
    return ok && mg && mr;
}

static int get_never_calls;
static int get_never(void *ud, int rank, int bucket, const float **master, const float **m,
                     const float **v, size_t *n) {
    (void)ud, (void)rank, (void)bucket, (void)master, (void)m, (void)v, (void)n;
    get_never_calls++;
    return zs_err(ZS_EIO, "get called");
}

static void test_read_path(const char *dir, state *s1) {
    /* the main test's layout: replicated, empty and 1-element buckets, 1..3 ranks */
    float *a[NB * 3];
    for (int b = 0; b < NB; b++)
        for (int k = 0; k < 3; k++) a[b * 3 + k] = s1->a[b][k];
    src x = {.nb = NB, .a = a};
    for (int ranks = 1; ranks <= 3; ranks++) {
        zs_ckpt_layout L = layout(ranks);
        char tag[32];
        snprintf(tag, sizeof tag, "small%d", ranks);
        save_both_ways(dir, tag, 5, &x, &L);
        CHECK(x.max_n <= ZS_CKPT_CHUNK, "chunks of at most ZS_CKPT_CHUNK");
    }

    /* buckets beyond one chunk: 2.5 chunks (+7, a tail that is no whole 32-byte stripe) */
    enum { BB = 3 };
    const size_t big_elems[BB] = {(size_t)ZS_CKPT_CHUNK * 5 / 2 + 7, 3000, (size_t)ZS_CKPT_CHUNK};
    float *ba[BB * 3];
    for (int i = 0; i < BB * 3; i++) {
        size_t e = big_elems[i / 3];
        ba[i] = malloc(e * 4);
        for (size_t j = 0; j < e; j++) ba[i][j] = frand() + (float)i;
    }
    src y = {.nb = BB, .a = ba};
    zs_ckpt_layout L1 = {.n_buckets = BB, .bucket_elems = big_elems, .ranks = 1};
    save_both_ways(dir, "big1", 6, &y, &L1);
    CHECK(y.max_n == ZS_CKPT_CHUNK && y.calls == 3 * (3 + 1 + 1), "1 rank: 2.5-chunk bucket in 3 "
          "chunks per array (%d calls, largest %zu)", y.calls, y.max_n);
    /* 2 ranks: rank 1's offsets count from its slice's start */
    zs_ckpt_layout L2 = {.n_buckets = BB, .bucket_elems = big_elems, .ranks = 2};
    save_both_ways(dir, "big2", 6, &y, &L2);
    CHECK(y.calls > 3 * 2 * BB, "2 ranks: some slices in several chunks (%d calls)", y.calls);

    /* a failing read (bucket 0's m, its 2nd chunk) aborts the save without a trace */
    char run[4200];
    snprintf(run, sizeof run, "%s/read-big1", dir);
    zs_ckpt_save_opts o = {.read = src_read};
    src_reset(&y, &L1);
    y.fail_at = 5;
    int rc = zs_ckpt_save(run, 7, &L1, NULL, &y, &o);
    CHECK_ERR(rc, "injected failure", "checkpoint step 7", "rank 0 bucket 0", "m (elements 1048576..");
    CHECK(rc == ZS_EIO, "the callback's code: %d", rc);
    CHECK(!exists(run, "step-000007") && !exists(run, "step-000007.tmp"), "a failed read leaves no step 7");
    /* on rank 1, after rank 0's file is written */
    snprintf(run, sizeof run, "%s/read-big2", dir);
    src_reset(&y, &L2);
    y.fail_at = chunks_expected(&L2); /* the last chunk: rank 1's bucket 2 v */
    rc = zs_ckpt_save(run, 7, &L2, NULL, &y, &o);
    CHECK_ERR(rc, "injected failure", "checkpoint step 7", "rank 1 bucket 2", "v");
    CHECK(!exists(run, "step-000007") && !exists(run, "step-000007.tmp"), "a failed read on rank 1 "
          "leaves no step 7");
    y.fail_at = 0;
    zs_ckpt *c = NULL;
    rc = zs_ckpt_open(run, &c);
    CHECK(rc == 0 && zs_ckpt_step(c) == 6, "still step 6 after the failed saves: %s", zs_errmsg());
    zs_ckpt_close(c);

    /* read wins over get: get (which fails) is never called */
    zs_ckpt_layout L = layout(2);
    src_reset(&x, &L);
    get_never_calls = 0;
    snprintf(run, sizeof run, "%s/both", dir);
    rc = zs_ckpt_save(run, 1, &L, get_never, &x, &o);
    CHECK(rc == 0 && get_never_calls == 0 && x.calls == chunks_expected(&L),
          "with read set, get is never called (rc %d, %d get calls, %d reads): %s", rc,
          get_never_calls, x.calls, zs_errmsg());
    CHECK_ERR(zs_ckpt_save(run, 2, &L, NULL, &x, NULL), "no callback");
    CHECK(!exists(run, "step-000002"), "no step 2 without a callback");

    for (int i = 0; i < BB * 3; i++) free(ba[i]);
}

int main(void) {
    char dir[4096], p[4200], q[4200];
    if (tu_tmpdir(dir, sizeof dir, "ckpt") != 0) { perror("mkdtemp"); return 1; }
    char run[4200];
    snprintf(run, sizeof run, "%s/run", dir); /* created by the first save */
    state s1 = {0}, s2 = {0}, s3 = {0};
    state_fill(&s1, 0);
    state_fill(&s2, 10);
    state_fill(&s3, 20);
    zs_ckpt *c = NULL;
    int rc;

    /* ---- 2 ranks, read back in full ---- */
    rc = save(run, 1, &s1, 2, 2);
    CHECK(rc == 0, "save 2 ranks: %s", zs_errmsg());
    CHECK(exists(run, "step-000001/rank0.bin") && exists(run, "step-000001/rank1.bin") &&
          exists(run, "step-000001/manifest.json") && !exists(run, "step-000001/rank2.bin"),
          "files of step 1");
    rc = zs_ckpt_open(run, &c);
    CHECK(rc == 0, "open: %s", zs_errmsg());
    if (rc == 0) {
        CHECK(zs_ckpt_step(c) == 1 && zs_ckpt_ranks(c) == 2 && zs_ckpt_n_buckets(c) == NB, "header");
        CHECK(zs_ckpt_model_dir(c) && !strcmp(zs_ckpt_model_dir(c), "/models/x"), "model dir");
        CHECK(zs_ckpt_model_fingerprint(c) && !strcmp(zs_ckpt_model_fingerprint(c), "0123456789abcdef"),
              "fingerprint");
        CHECK(strstr(zs_ckpt_meta(c), "\"index\":10") && strstr(zs_ckpt_meta(c), "18446744073709551") &&
              strstr(zs_ckpt_meta(c), "\"config\":{\"lr\":0.001"), "meta %s", zs_ckpt_meta(c));
        CHECK(zs_ckpt_bucket_replicated(c, 3) == 1 && zs_ckpt_bucket_replicated(c, 0) == 0, "replicated");
        CHECK(read_matches(c, &s1, 1), "full arrays read back equal");
        CHECK(read_matches(c, &s1, 2), "same partition");
        CHECK(read_matches(c, &s1, 7), "7-rank partition");
        float x[3];
        /* a range across the saved shard boundary (2 ranks: S = 3072 for 5000 elements) */
        float *buf = malloc(100 * 4);
        CHECK(zs_ckpt_read(c, 0, 3030, 100, buf, NULL, NULL) == 0 &&
              !memcmp(buf, s1.a[0][0] + 3030, 400), "read across the shard boundary");
        CHECK(zs_ckpt_read(c, 0, 3030, 100, NULL, buf, NULL) == 0 &&
              !memcmp(buf, s1.a[0][1] + 3030, 400), "m only");
        free(buf);
        CHECK(zs_ckpt_read(c, 2, 0, 1, x, x + 1, x + 2) == 0 && x[2] == s1.a[2][2][0], "1-element bucket");
        CHECK(zs_ckpt_read(c, 1, 0, 0, x, x, x) == 0, "empty bucket");
        CHECK_ERR(zs_ckpt_read(c, 0, 4990, 11, x, NULL, NULL), "beyond");
        CHECK_ERR(zs_ckpt_read(c, NB, 0, 1, x, NULL, NULL), "bucket 5 out of range");
        zs_ckpt_close(c);
    }

    /* ---- 3 ranks, read with a 2-rank partition ---- */
    rc = save(run, 2, &s2, 3, 2);
    CHECK(rc == 0, "save 3 ranks: %s", zs_errmsg());
    FILE *f = fopen(pathf(p, sizeof p, run, "latest"), "r");
    char line[64] = "";
    if (f) { if (!fgets(line, sizeof line, f)) line[0] = 0; fclose(f); }
    CHECK(!strcmp(line, "step-000002\n"), "latest names step 2: \"%s\"", line);
    rc = zs_ckpt_open(run, &c);
    CHECK(rc == 0, "open 3-rank: %s", zs_errmsg());
    if (rc == 0) {
        CHECK(zs_ckpt_step(c) == 2 && zs_ckpt_ranks(c) == 3, "3-rank header");
        CHECK(read_matches(c, &s2, 2), "3 ranks saved, 2-rank partition read");
        CHECK(read_matches(c, &s2, 3), "3 ranks saved, 3-rank partition read");
        zs_ckpt_close(c);
    }
    /* a step directory opened directly */
    rc = zs_ckpt_open(pathf(p, sizeof p, run, "step-000001"), &c);
    CHECK(rc == 0 && zs_ckpt_step(c) == 1 && read_matches(c, &s1, 3), "open step dir: %s", zs_errmsg());
    zs_ckpt_close(c);
    c = NULL;
    rc = zs_ckpt_open(pathf(p, sizeof p, run, "step-000002/"), &c);
    CHECK(rc == 0 && zs_ckpt_step(c) == 2, "open step dir with a trailing slash: %s", zs_errmsg());
    zs_ckpt_close(c);
    c = NULL;

    /* ---- keep = 2: step 3 removes step 1 ---- */
    rc = save(run, 3, &s3, 2, 2);
    CHECK(rc == 0, "save step 3: %s", zs_errmsg());
    CHECK(!exists(run, "step-000001") && exists(run, "step-000002") && exists(run, "step-000003"),
          "keep 2: step 1 deleted, 2 and 3 kept");

    /* ---- leftovers of an interrupted save are ignored, then cleaned ---- */
    mkdir(pathf(p, sizeof p, run, "step-000009.tmp"), 0755);
    tu_write_file(pathf(p, sizeof p, run, "step-000009.tmp/rank0.bin"), "junk", 4);
    tu_write_file(pathf(p, sizeof p, run, "latest.tmp"), "step-000009\n", 12);
    rc = zs_ckpt_open(run, &c);
    CHECK(rc == 0 && zs_ckpt_step(c) == 3, "leftover .tmp ignored by open: %s", zs_errmsg());
    zs_ckpt_close(c);
    c = NULL;
    /* latest missing: the newest complete step, not the .tmp */
    rename(pathf(p, sizeof p, run, "latest"), pathf(q, sizeof q, run, "latest.bak"));
    rc = zs_ckpt_open(run, &c);
    CHECK(rc == 0 && zs_ckpt_step(c) == 3, "no latest: newest complete step: %s", zs_errmsg());
    zs_ckpt_close(c);
    c = NULL;
    rename(q, p);
    /* a failing callback: nothing of step 4 remains, earlier checkpoints intact */
    s1.fail_at = 4;
    rc = save(run, 4, &s1, 2, 2);
    s1.fail_at = 0;
    CHECK_ERR(rc, "injected failure", "rank");
    CHECK(!exists(run, "step-000004") && !exists(run, "step-000004.tmp") &&
          exists(run, "step-000002") && exists(run, "step-000003"), "failed save leaves no trace");
    CHECK(!exists(run, "step-000009.tmp") && !exists(run, "latest.tmp"), "leftovers cleaned by the next save");
    rc = zs_ckpt_open(run, &c);
    CHECK(rc == 0 && zs_ckpt_step(c) == 3, "still step 3 after the failed save");
    zs_ckpt_close(c);
    c = NULL;

    /* ---- saving an existing step again replaces it ---- */
    rc = save(run, 3, &s1, 3, 2);
    CHECK(rc == 0, "re-save step 3: %s", zs_errmsg());
    rc = zs_ckpt_open(run, &c);
    CHECK(rc == 0 && zs_ckpt_ranks(c) == 3 && read_matches(c, &s1, 2), "re-saved step 3 has new data");
    zs_ckpt_close(c);
    c = NULL;
    CHECK(exists(run, "step-000002") && !exists(run, "step-000003.old.tmp"), "re-save cleaned up");

    /* ---- bad arguments ---- */
    {
        zs_ckpt_layout L = layout(2);
        s1.L = &L;
        zs_ckpt_save_opts o = {.meta_json = "[1,2]"};
        CHECK_ERR(zs_ckpt_save(run, 5, &L, get_cb, &s1, &o), "meta", "object");
        o.meta_json = "{bad";
        CHECK_ERR(zs_ckpt_save(run, 5, &L, get_cb, &s1, &o), "meta", "not JSON");
        CHECK_ERR(zs_ckpt_save(run, -1, &L, get_cb, &s1, NULL), "step");
        size_t sh[NB] = {100, 0, 1, 0, 4096};
        L.shard_elems = sh;
        CHECK_ERR(zs_ckpt_save(run, 5, &L, get_cb, &s1, NULL), "bucket 0", "cannot hold");
        CHECK(!exists(run, "step-000005"), "no step 5");
    }

    /* ---- caller-given shard sizes (e.g. 2048-element shards of a bf16 storage partition) ---- */
    {
        char run2[4200];
        snprintf(run2, sizeof run2, "%s/run2", dir);
        size_t sh[NB] = {2048, 0, 2048, 0, 18432};
        zs_ckpt_layout L = layout(4);
        L.shard_elems = sh;
        s2.L = &L;
        s2.calls = 0;
        rc = zs_ckpt_save(run2, 7, &L, get_cb, &s2, NULL);
        CHECK(rc == 0, "save with shard sizes: %s", zs_errmsg());
        rc = zs_ckpt_open(run2, &c);
        CHECK(rc == 0 && !strcmp(zs_ckpt_meta(c), "{}") && !zs_ckpt_model_dir(c), "defaults: %s",
              zs_errmsg());
        CHECK(rc == 0 && read_matches(c, &s2, 3), "custom shards, 3-rank read");
        zs_ckpt_close(c);
        c = NULL;
    }

    /* ---- corruption, truncation, missing / bad manifest ---- */
    char sd[4200], rf[4400], bak[4400];
    pathf(sd, sizeof sd, run, "step-000003");
    snprintf(rf, sizeof rf, "%s/rank1.bin", sd);
    snprintf(bak, sizeof bak, "%s/rank1.bak", dir);
    copy_file(rf, bak);
    long off = region_offset(sd, 1, 4, "m");
    CHECK(off > 0, "found the region");
    flip_byte(rf, off);
    rc = zs_ckpt_open(run, &c);
    CHECK(rc == ZS_ECHECKSUM, "corrupt: rc %d", rc);
    CHECK_ERR(rc, "rank1.bin", "bucket 4 m", "checksum mismatch");
    fprintf(stderr, "corrupt: %s\n", zs_errmsg());
    copy_file(bak, rf);
    CHECK(truncate(rf, 4096) == 0, "truncate");
    rc = zs_ckpt_open(run, &c);
    CHECK(rc == ZS_EFORMAT, "truncated: rc %d", rc);
    CHECK_ERR(rc, "rank1.bin", "truncated");
    fprintf(stderr, "truncated: %s\n", zs_errmsg());
    copy_file(bak, rf);
    /* header damage (outside every region) */
    flip_byte(rf, 20);
    rc = zs_ckpt_open(run, &c);
    CHECK_ERR(rc, "rank1.bin", "bad header");
    copy_file(bak, rf);
    unlink(pathf(p, sizeof p, dir, "rank1.bak"));
    rc = zs_ckpt_open(run, &c);
    CHECK(rc == 0, "restored: %s", zs_errmsg());
    zs_ckpt_close(c);
    c = NULL;

    char man[4400], manbak[4400];
    snprintf(man, sizeof man, "%s/manifest.json", sd);
    snprintf(manbak, sizeof manbak, "%s/manifest.bak", dir);
    rename(man, manbak);
    rc = zs_ckpt_open(sd, &c);
    CHECK(rc == ZS_ENOTFOUND, "missing manifest: rc %d", rc);
    CHECK_ERR(rc, "step-000003/manifest.json", "missing");
    fprintf(stderr, "missing manifest: %s\n", zs_errmsg());
    rc = zs_ckpt_open(run, &c); /* latest names step 3, which has no manifest */
    CHECK_ERR(rc, "manifest.json", "missing");
    tu_write_file(man, "{\"format\": \"zeroserve-checkpoint\", \"version\": 1,", 48);
    rc = zs_ckpt_open(sd, &c);
    CHECK(rc == ZS_EFORMAT, "bad JSON: rc %d", rc);
    CHECK_ERR(rc, "manifest.json", "not valid JSON", "line");
    fprintf(stderr, "bad JSON: %s\n", zs_errmsg());
    tu_write_file(man, "{\"format\": \"other\"}", 19);
    CHECK_ERR(zs_ckpt_open(sd, &c), "manifest.json", "format");
    rename(manbak, man);
    /* a manifest whose partition was edited */
    {
        json_t *j = json_load_file(man, 0, NULL);
        json_object_set_new(json_array_get(json_object_get(j, "buckets"), 0), "shard", json_integer(3072));
        json_dump_file(j, man, 0);
        json_decref(j);
        CHECK_ERR(zs_ckpt_open(sd, &c), "manifest.json", "does not match the partition");
    }
    CHECK(c == NULL, "out untouched on errors");
    zs_ckpt_close(c);
    c = NULL;
    CHECK_ERR(zs_ckpt_open(pathf(p, sizeof p, dir, "nowhere"), &c), "nowhere");
    mkdir(pathf(p, sizeof p, dir, "empty"), 0755);
    CHECK_ERR(zs_ckpt_open(p, &c), "no checkpoint");

    test_read_path(dir, &s1);

    state_free(&s1);
    state_free(&s2);
    state_free(&s3);
    tu_rmdir(dir);
    return tu_finish("test-ckpt");
}
