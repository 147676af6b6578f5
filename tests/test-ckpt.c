/* test-ckpt.c — training checkpoints (engine/ckpt.h): save with 2 ranks and read back the full
 * arrays; save with 3 ranks and read a 2-rank partition; replicated buckets and caller-given
 * shard sizes; `latest`, keep (pruning), re-saving a step, leftover .tmp directories, a failing
 * callback, and the errors of a corrupt, truncated, manifest-less or badly formed checkpoint. */
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

    state_free(&s1);
    state_free(&s2);
    state_free(&s3);
    tu_rmdir(dir);
    return tu_finish("test-ckpt");
}
