/* ckpt.c — training checkpoints (ckpt.h): per-rank files of fp32 master/m/v slices, a JSON
 * manifest, the atomic save (tmp directory, fsyncs, rename, `latest`, pruning; the data handed
 * out whole by get or pulled in chunks by read, same bytes either way) and the validating,
 * re-partitioning reader (read-only mappings of the rank files). */
#define _GNU_SOURCE
#include "ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cluster.h"
#include "common.h"
#include "fileio.h"
#include "pool.h"
#include "store.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "ckpt.c: checkpoint files are little-endian; big-endian hosts are not supported"
#endif

#define CKPT_FORMAT "zeroserve-checkpoint"
#define CKPT_VERSION 1
#define CKPT_MAGIC "ZSCKPTv1"
#define CKPT_ALIGN 64       /* bytes: alignment of every region in a rank file */
#define CKPT_MAX_RANKS 65536
#define CKPT_MAX_MANIFEST ((size_t)256 << 20)

/* The first 64 bytes of every rank file. */
typedef struct {
    char magic[8];
    uint32_t version, rank, ranks, n_buckets;
    uint64_t step, bytes;
    uint32_t n_regions, reserved0;
    uint64_t reserved1;
    uint64_t checksum; /* XXH64 of the 56 bytes before it */
} ckpt_header;
_Static_assert(sizeof(ckpt_header) == 64, "rank file header is 64 bytes");

/* One bucket slice in a rank file: master at off, m at off_m, v at off_v. */
typedef struct {
    int bucket;
    size_t start, elems;
    size_t off, off_m, off_v;
    uint64_t sum[3]; /* master, m, v */
} region;

static const char *const region_names[3] = {"master", "m", "v"};

/* ---------- small helpers ---------- */





/* rm -rf of path (a file or a directory tree); 0 when gone (or never there), else -errno. */
static int rm_tree_at(int at, const char *name) {
    if (unlinkat(at, name, 0) == 0 || errno == ENOENT) return 0;
    if (errno != EISDIR && errno != EPERM) return -errno;
    int fd = openat(at, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return -errno;
    DIR *d = fdopendir(fd);
    if (!d) {
        int e = errno;
        close(fd);
        return -e;
    }
    int rc = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        int r = rm_tree_at(dirfd(d), de->d_name);
        if (r < 0 && rc == 0) rc = r;
    }
    closedir(d);
    if (unlinkat(at, name, AT_REMOVEDIR) != 0 && errno != ENOENT && rc == 0) rc = -errno;
    return rc;
}

static int rm_tree(const char *path) { return rm_tree_at(AT_FDCWD, path); }

/* "step-<digits>" -> step (>= 0), else -1. */
static long parse_step_name(const char *name) {
    if (strncmp(name, "step-", 5) != 0 || !name[5]) return -1;
    long v = 0;
    for (const char *p = name + 5; *p; p++) {
        if (*p < '0' || *p > '9') return -1;
        if (v > (LONG_MAX - 9) / 10) return -1;
        v = v * 10 + (*p - '0');
    }
    return v;
}

static int is_leftover_tmp(const char *name) {
    size_t n = strlen(name);
    return (strncmp(name, "step-", 5) == 0 && n > 9 && !strcmp(name + n - 4, ".tmp")) ||
           !strcmp(name, "latest.tmp");
}

static int file_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static void hex16(char out[17], uint64_t v) { snprintf(out, 17, "%016llx", (unsigned long long)v); }

static int parse_hex16(const char *s, uint64_t *out) {
    if (!s || strlen(s) != 16) return -1;
    uint64_t v = 0;
    for (int i = 0; i < 16; i++) {
        int c = s[i], d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return -1;
        v = v << 4 | (uint64_t)d;
    }
    *out = v;
    return 0;
}

/* ---------- partition ---------- */

static int layout_check(const zs_ckpt_layout *L) {
    if (!L || L->n_buckets < 1 || !L->bucket_elems)
        return zs_err(ZS_EINVAL, "checkpoint layout: need at least one bucket");
    if (L->ranks < 1 || L->ranks > CKPT_MAX_RANKS)
        return zs_err(ZS_EINVAL, "checkpoint layout: rank count %d out of range", L->ranks);
    for (int b = 0; b < L->n_buckets; b++) {
        size_t e = L->bucket_elems[b], tot;
        if (e > SIZE_MAX / 4 / 4) return zs_err(ZS_EINVAL, "checkpoint layout: bucket %d too large", b);
        if (L->replicated && L->replicated[b]) continue;
        if (L->shard_elems && e > 0 &&
            (zs_mul_size(L->shard_elems[b], (size_t)L->ranks, &tot) != 0 || tot < e))
            return zs_err(ZS_EINVAL, "checkpoint layout: bucket %d: %d shards of %zu elements "
                          "cannot hold %zu", b, L->ranks, L->shard_elems[b], e);
    }
    return 0;
}

static size_t shard_of(const zs_ckpt_layout *L, int b) {
    size_t e = L->bucket_elems[b];
    if (L->replicated && L->replicated[b]) return e;
    if (L->shard_elems) return L->shard_elems[b];
    if (e == 0) return 0;
    return ZS_ALIGN_UP((e + (size_t)L->ranks - 1) / (size_t)L->ranks, ZS_CKPT_SHARD_ALIGN);
}

static void range_of(const zs_ckpt_layout *L, int b, int r, size_t *start, size_t *len) {
    size_t e = L->bucket_elems[b];
    if (L->replicated && L->replicated[b]) {
        *start = 0;
        *len = r == 0 ? e : 0;
        return;
    }
    size_t s = shard_of(L, b);
    size_t lo = ZS_MIN((size_t)r * s, e);
    *start = lo;
    *len = ZS_MIN(s, e - lo);
}

int zs_ckpt_shard_range(const zs_ckpt_layout *L, int bucket, int rank, size_t *start, size_t *len) {
    ZS_CHECK(layout_check(L));
    if (bucket < 0 || bucket >= L->n_buckets || rank < 0 || rank >= L->ranks)
        return zs_err(ZS_EINVAL, "checkpoint: bucket %d / rank %d out of range", bucket, rank);
    range_of(L, bucket, rank, start, len);
    return 0;
}

/* The regions of rank r's file and its size. regs has room for n_buckets entries. */
static int plan_rank(const zs_ckpt_layout *L, int r, region *regs, size_t *bytes) {
    int n = 0;
    size_t cur = sizeof(ckpt_header);
    for (int b = 0; b < L->n_buckets; b++) {
        size_t start, len;
        range_of(L, b, r, &start, &len);
        if (len == 0) continue;
        region *g = &regs[n++];
        memset(g, 0, sizeof *g);
        g->bucket = b;
        g->start = start;
        g->elems = len;
        size_t a = ZS_ALIGN_UP(len * 4, CKPT_ALIGN);
        g->off = ZS_ALIGN_UP(cur, CKPT_ALIGN);
        g->off_m = g->off + a;
        g->off_v = g->off_m + a;
        cur = g->off_v + len * 4;
    }
    *bytes = cur;
    return n;
}

static void header_fill(ckpt_header *h, int rank, int ranks, int n_buckets, long step, size_t bytes,
                        int n_regions) {
    memset(h, 0, sizeof *h);
    memcpy(h->magic, CKPT_MAGIC, 8);
    h->version = CKPT_VERSION;
    h->rank = (uint32_t)rank;
    h->ranks = (uint32_t)ranks;
    h->n_buckets = (uint32_t)n_buckets;
    h->step = (uint64_t)step;
    h->bytes = bytes;
    h->n_regions = (uint32_t)n_regions;
    h->checksum = zs_checksum64(h, offsetof(ckpt_header, checksum));
}

/* XXH64 of the header followed by the region checksums. */
static uint64_t file_checksum(const ckpt_header *h, const region *regs, int n) {
    size_t len = sizeof *h + (size_t)n * 3 * 8;
    unsigned char *buf = malloc(len);
    if (!buf) return 0;
    memcpy(buf, h, sizeof *h);
    for (int i = 0; i < n; i++) memcpy(buf + sizeof *h + (size_t)i * 24, regs[i].sum, 24);
    uint64_t s = zs_checksum64(buf, len);
    free(buf);
    return s;
}

/* ---------- save ---------- */

typedef int (*ckpt_read_fn)(void *ud, int rank, int bucket, int which, size_t off, size_t n,
                            float *dst);

/* Streams region g of rank r (its master, m and v) from rd through chunk (ZS_CKPT_CHUNK
 * floats) into fd, each chunk at its offset, and sets g->sum. *e: errno of a failed write. */
static int stream_region(int fd, int r, long step, region *g, ckpt_read_fn rd, void *ud,
                         float *chunk, int *e) {
    size_t offs[3] = {g->off, g->off_m, g->off_v};
    for (int k = 0; k < 3; k++) {
        zs_checksum64_state st;
        zs_checksum64_init(&st);
        for (size_t at = 0; at < g->elems;) {
            size_t n = ZS_MIN((size_t)ZS_CKPT_CHUNK, g->elems - at);
            int rc = rd(ud, r, g->bucket, k, at, n, chunk);
            if (rc < 0)
                return zs_err_prefix(rc, "checkpoint step %ld: rank %d bucket %d %s (elements "
                                     "%zu..%zu of the slice)", step, r, g->bucket,
                                     region_names[k], at, at + n - 1);
            zs_checksum64_update(&st, chunk, n * 4);
            if ((*e = -zs_pwrite_all(fd, chunk, n * 4, (off_t)(offs[k] + at * 4))) != 0) return 1;
            at += n;
        }
        g->sum[k] = zs_checksum64_final(&st);
    }
    return 0;
}

/* Writes rank r's file into tmpdir; fills regs/n/bytes/file sum for the manifest. The data
 * comes from rd (zs_ckpt_save_opts.read; chunk: its buffer) when set, else from get. */
static int save_rank(const char *tmpdir, int r, long step, const zs_ckpt_layout *L,
                     zs_ckpt_get_fn get, ckpt_read_fn rd, float *chunk, void *ud, region *regs,
                     int *n_out, size_t *bytes_out, uint64_t *fsum) {
    size_t bytes;
    int n = plan_rank(L, r, regs, &bytes);
    char *path = zs_str_printf("%s/rank%d.bin", tmpdir, r);
    if (!path) return zs_err(ZS_ENOMEM, "checkpoint: out of memory");
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        int e = errno;
        int rc = zs_err(zs_errno_code(e), "%s: cannot create: %s", path, strerror(e));
        free(path);
        return rc;
    }
    int rc = 0, e = 0;
    ckpt_header h;
    header_fill(&h, r, L->ranks, L->n_buckets, step, bytes, n);
    if ((e = -zs_pwrite_all(fd, &h, sizeof h, 0)) != 0) goto io_fail;
    for (int i = 0; i < n && rc == 0; i++) {
        region *g = &regs[i];
        if (rd) {
            rc = stream_region(fd, r, step, g, rd, ud, chunk, &e);
            if (rc > 0) goto io_fail;
            continue;
        }
        const float *a[3] = {NULL, NULL, NULL};
        size_t have = 0;
        rc = get(ud, r, g->bucket, &a[0], &a[1], &a[2], &have);
        if (rc < 0) {
            zs_err_prefix(rc, "checkpoint step %ld: rank %d bucket %d", step, r, g->bucket);
            break;
        }
        if (!a[0] || !a[1] || !a[2] || have < g->elems) {
            rc = zs_err(ZS_EINVAL, "checkpoint step %ld: rank %d bucket %d: the callback gave %zu "
                        "elements%s, need %zu", step, r, g->bucket, have,
                        (!a[0] || !a[1] || !a[2]) ? " (NULL array)" : "", g->elems);
            break;
        }
        size_t offs[3] = {g->off, g->off_m, g->off_v};
        for (int k = 0; k < 3; k++) {
            g->sum[k] = zs_checksum64(a[k], g->elems * 4);
            if ((e = -zs_pwrite_all(fd, a[k], g->elems * 4, (off_t)offs[k])) != 0) goto io_fail;
        }
    }
    if (rc == 0) {
        if (ftruncate(fd, (off_t)bytes) != 0 || fsync(fd) != 0) {
            e = errno;
            goto io_fail;
        }
        *n_out = n;
        *bytes_out = bytes;
        *fsum = file_checksum(&h, regs, n);
    }
    close(fd);
    free(path);
    return rc;
io_fail:
    rc = zs_err(zs_errno_code(e), "%s: write failed: %s", path, strerror(e));
    close(fd);
    free(path);
    return rc;
}

static json_t *manifest_build(long step, const zs_ckpt_layout *L, const zs_ckpt_save_opts *o,
                              json_t *meta, region **regs, const int *nreg, const size_t *bytes,
                              const uint64_t *fsum) {
    json_t *j = json_object();
    json_object_set_new(j, "format", json_string(CKPT_FORMAT));
    json_object_set_new(j, "version", json_integer(CKPT_VERSION));
    json_object_set_new(j, "step", json_integer(step));
    json_object_set_new(j, "ranks", json_integer(L->ranks));
    json_object_set_new(j, "checksum", json_string("xxh64"));
    json_t *model = json_object();
    json_object_set_new(model, "dir", o->model_dir ? json_string(o->model_dir) : json_null());
    json_object_set_new(model, "fingerprint",
                        o->model_fingerprint ? json_string(o->model_fingerprint) : json_null());
    json_object_set_new(j, "model", model);
    json_t *bk = json_array();
    for (int b = 0; b < L->n_buckets; b++) {
        json_t *x = json_object();
        json_object_set_new(x, "elems", json_integer((json_int_t)L->bucket_elems[b]));
        json_object_set_new(x, "replicated", json_boolean(L->replicated && L->replicated[b]));
        json_object_set_new(x, "shard", json_integer((json_int_t)shard_of(L, b)));
        json_array_append_new(bk, x);
    }
    json_object_set_new(j, "buckets", bk);
    json_t *files = json_array();
    char hx[17];
    for (int r = 0; r < L->ranks; r++) {
        json_t *f = json_object();
        char name[32];
        snprintf(name, sizeof name, "rank%d.bin", r);
        json_object_set_new(f, "rank", json_integer(r));
        json_object_set_new(f, "name", json_string(name));
        json_object_set_new(f, "bytes", json_integer((json_int_t)bytes[r]));
        hex16(hx, fsum[r]);
        json_object_set_new(f, "checksum", json_string(hx));
        json_t *ra = json_array();
        for (int i = 0; i < nreg[r]; i++) {
            const region *g = &regs[r][i];
            json_t *x = json_object();
            json_object_set_new(x, "bucket", json_integer(g->bucket));
            json_object_set_new(x, "start", json_integer((json_int_t)g->start));
            json_object_set_new(x, "elems", json_integer((json_int_t)g->elems));
            json_object_set_new(x, "offset", json_integer((json_int_t)g->off));
            for (int k = 0; k < 3; k++) {
                hex16(hx, g->sum[k]);
                json_object_set_new(x, region_names[k], json_string(hx));
            }
            json_array_append_new(ra, x);
        }
        json_object_set_new(f, "regions", ra);
        json_array_append_new(files, f);
    }
    json_object_set_new(j, "files", files);
    json_object_set(j, "meta", meta);
    return j;
}

/* Writes text to path (created, fsync'd). */
static int write_text(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        int e = errno;
        return zs_err(zs_errno_code(e), "%s: cannot create: %s", path, strerror(e));
    }
    int e = -zs_pwrite_all(fd, text, strlen(text), 0);
    if (e == 0 && fsync(fd) != 0) e = errno;
    close(fd);
    if (e) return zs_err(zs_errno_code(e), "%s: write failed: %s", path, strerror(e));
    return 0;
}

typedef struct {
    long step;
    char name[64];
} step_ent;

static int step_cmp_desc(const void *a, const void *b) {
    long x = ((const step_ent *)a)->step, y = ((const step_ent *)b)->step;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Complete step directories of dir (name step-N holding a manifest), newest first. */
static int list_steps(const char *dir, step_ent **out, int *count) {
    *out = NULL;
    *count = 0;
    DIR *d = opendir(dir);
    if (!d) {
        int e = errno;
        return zs_err(zs_errno_code(e), "%s: cannot list: %s", dir, strerror(e));
    }
    step_ent *v = NULL;
    int n = 0, cap = 0, rc = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        long s = parse_step_name(de->d_name);
        if (s < 0 || strlen(de->d_name) >= sizeof v->name) continue;
        char *mp = zs_str_printf("%s/%s/manifest.json", dir, de->d_name);
        int ok = mp && file_exists(mp);
        free(mp);
        if (!ok) continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            step_ent *nv = realloc(v, (size_t)cap * sizeof *v);
            if (!nv) { rc = zs_err(ZS_ENOMEM, "checkpoint: out of memory"); break; }
            v = nv;
        }
        v[n].step = s;
        snprintf(v[n].name, sizeof v[n].name, "%s", de->d_name);
        n++;
    }
    closedir(d);
    if (rc < 0) { free(v); return rc; }
    if (n) qsort(v, (size_t)n, sizeof *v, step_cmp_desc);
    *out = v;
    *count = n;
    return 0;
}

/* Removes leftovers of interrupted saves (step-*.tmp, latest.tmp). */
static void clean_leftovers(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!is_leftover_tmp(de->d_name)) continue;
        int r = rm_tree_at(dirfd(d), de->d_name);
        if (r < 0) zs_log_warn("%s/%s: cannot remove leftover of an interrupted save: %s", dir,
                               de->d_name, strerror(-r));
        else zs_log_info("%s/%s: removed leftover of an interrupted save", dir, de->d_name);
    }
    closedir(d);
}

/* Deletes complete checkpoints beyond keep, never the one named just_saved. */
static void prune(const char *dir, int keep, const char *just_saved) {
    step_ent *v;
    int n;
    if (list_steps(dir, &v, &n) < 0) {
        zs_log_warn("%s: cannot prune old checkpoints: %s", dir, zs_errmsg());
        return;
    }
    int kept = 1; /* just_saved */
    for (int i = 0; i < n; i++) {
        if (!strcmp(v[i].name, just_saved)) continue;
        if (kept < keep) { kept++; continue; }
        char *p = zs_str_printf("%s/%s", dir, v[i].name);
        if (!p) break;
        /* manifest first: a half-deleted directory is never taken for a checkpoint */
        char *mp = zs_str_printf("%s/manifest.json", p);
        if (mp) unlink(mp);
        free(mp);
        int r = rm_tree(p);
        if (r < 0) zs_log_warn("%s: cannot delete old checkpoint: %s", p, strerror(-r));
        else zs_log_info("%s: deleted (keeping %d checkpoints)", p, keep);
        free(p);
    }
    free(v);
    zs_fsync_dir(dir);
}

/* Several processes: every one reaches each agreement point with its status, and all leave with
 * the worst (a failure elsewhere gets a message saying so). */
static int agree(int multi, int rc, const char *what) {
    if (!multi) return rc;
    int all = rc;
    int arc = zs_cluster_min_int(rc, &all);
    if (rc < 0) return rc;
    if (arc < 0) return arc;
    if (all < 0) return zs_err(all, "checkpoint: another process failed %s (see its log)", what);
    return 0;
}

/* Several processes: the checksums of every rank's file go to process 0 for the manifest.
 * Per rank: status, file bytes, file checksum, then master/m/v checksums of each region. */
static int exchange_sums(const zs_ckpt_layout *L, int r0, int nl, int rc, region **regs, int *nreg, size_t *bytes,
                         uint64_t *fsum) {
    size_t K = 3 + (size_t)L->n_buckets * 3;
    int P = zs_cluster_size();
    uint64_t *mine = calloc((size_t)nl * K, 8), *all = calloc((size_t)P * (size_t)nl * K, 8);
    if (!mine || !all) {
        free(mine);
        free(all);
        return zs_err(ZS_ENOMEM, "checkpoint: out of memory");
    }
    for (int i = 0; i < nl; i++) {
        uint64_t *x = mine + (size_t)i * K;
        int r = r0 + i;
        x[0] = (uint64_t)(int64_t)rc;
        x[1] = bytes[r];
        x[2] = fsum[r];
        for (int k = 0; rc == 0 && k < nreg[r]; k++)
            for (int j = 0; j < 3; j++) x[3 + (size_t)k * 3 + (size_t)j] = regs[r][k].sum[j];
    }
    int xrc = zs_cluster_all_gather(mine, all, (size_t)nl * K * 8);
    for (int r = 0; xrc == 0 && r < L->ranks; r++) {
        const uint64_t *x = all + (size_t)r * K;
        int st = (int)(int64_t)x[0];
        if (st < 0) {
            if (rc == 0) rc = zs_err(st, "checkpoint: rank %d could not write its file (see process %d's log)", r, r / nl);
            continue;
        }
        if (r >= r0 && r < r0 + nl) continue;
        size_t b;
        nreg[r] = plan_rank(L, r, regs[r], &b);
        bytes[r] = x[1];
        fsum[r] = x[2];
        for (int k = 0; k < nreg[r]; k++)
            for (int j = 0; j < 3; j++) regs[r][k].sum[j] = x[3 + (size_t)k * 3 + (size_t)j];
    }
    free(mine);
    free(all);
    return xrc < 0 ? xrc : rc;
}

int zs_ckpt_save(const char *dir, long step, const zs_ckpt_layout *L, zs_ckpt_get_fn get, void *ud,
                 const zs_ckpt_save_opts *o) {
    zs_ckpt_save_opts dflt = {0};
    if (!o) o = &dflt;
    if (!dir || !*dir) return zs_err(ZS_EINVAL, "checkpoint: no directory");
    if (step < 0) return zs_err(ZS_EINVAL, "checkpoint: step %ld must be >= 0", step);
    if (!get && !o->read) return zs_err(ZS_EINVAL, "checkpoint: no callback (get or read)");
    if (o->keep < 0) return zs_err(ZS_EINVAL, "checkpoint: keep %d must be >= 1", o->keep);
    ZS_CHECK(layout_check(L));
    int keep = o->keep ? o->keep : ZS_CKPT_KEEP_DEFAULT;

    json_error_t je;
    json_t *meta = o->meta_json ? json_loads(o->meta_json, JSON_REJECT_DUPLICATES, &je) : json_object();
    if (!meta)
        return zs_err(ZS_EINVAL, "checkpoint meta: not JSON: line %d column %d: %s", je.line,
                      je.column, je.text);
    if (!json_is_object(meta)) {
        json_decref(meta);
        return zs_err(ZS_EINVAL, "checkpoint meta: must be a JSON object");
    }

    int rc = 0;
    char *final = NULL, *tmp = NULL, *old = NULL, *man = NULL, *latest_tmp = NULL, *latest = NULL;
    char *text = NULL;
    float *chunk = o->read ? malloc((size_t)ZS_CKPT_CHUNK * sizeof *chunk) : NULL;
    region **regs = calloc((size_t)L->ranks, sizeof *regs);
    int *nreg = calloc((size_t)L->ranks, sizeof *nreg);
    size_t *bytes = calloc((size_t)L->ranks, sizeof *bytes);
    uint64_t *fsum = calloc((size_t)L->ranks, sizeof *fsum);
    json_t *j = NULL;
    char base[64];
    snprintf(base, sizeof base, "step-%06ld", step);
    final = zs_str_printf("%s/%s", dir, base);
    tmp = zs_str_printf("%s/%s.tmp", dir, base);
    old = zs_str_printf("%s/%s.old.tmp", dir, base);
    man = zs_str_printf("%s/%s.tmp/manifest.json", dir, base);
    latest_tmp = zs_str_printf("%s/latest.tmp", dir);
    latest = zs_str_printf("%s/latest", dir);
    int made_tmp = 0, moved_old = 0;
    int multi = o->local_ranks > 0 && zs_cluster_size() > 1;
    int r0 = multi ? o->first_rank : 0, r1 = multi ? o->first_rank + o->local_ranks : L->ranks;
    int lead = !multi || zs_cluster_rank() == 0;
    if (multi && (r0 < 0 || r1 > L->ranks)) rc = zs_err(ZS_EINVAL, "checkpoint: ranks %d..%d of %d", r0, r1 - 1, L->ranks);
    if (rc == 0 && (!regs || !nreg || !bytes || !fsum || !final || !tmp || !old || !man || !latest_tmp || !latest ||
                    (o->read && !chunk)))
        rc = zs_err(ZS_ENOMEM, "checkpoint: out of memory");
    for (int r = 0; rc == 0 && r < L->ranks; r++)
        if (!(regs[r] = calloc((size_t)L->n_buckets, sizeof **regs))) rc = zs_err(ZS_ENOMEM, "checkpoint: out of memory");

    if (rc == 0 && lead && mkdir(dir, 0755) != 0 && errno != EEXIST) {
        int e = errno;
        rc = zs_err(zs_errno_code(e), "%s: cannot create checkpoint directory: %s", dir, strerror(e));
    }
    if (rc == 0 && lead && !is_dir(dir)) rc = zs_err(ZS_EINVAL, "%s: not a directory", dir);
    if (rc == 0 && lead) {
        clean_leftovers(dir);
        if (mkdir(tmp, 0755) != 0) {
            int e = errno;
            rc = zs_err(zs_errno_code(e), "%s: cannot create: %s", tmp, strerror(e));
        } else {
            made_tmp = 1;
        }
    }
    if ((rc = agree(multi, rc, "preparing the checkpoint directory")) < 0) goto done;
    double t0 = zs_now();
    size_t total = 0;
    for (int r = r0; r < r1 && rc == 0; r++)
        rc = save_rank(tmp, r, step, L, get, o->read, chunk, ud, regs[r], &nreg[r], &bytes[r], &fsum[r]);
    if (multi) rc = exchange_sums(L, r0, r1 - r0, rc, regs, nreg, bytes, fsum);
    if (rc < 0) goto done;
    for (int r = 0; r < L->ranks; r++) total += bytes[r];
    if (!lead) goto done; /* process 0 finishes the checkpoint; the agreement below waits for it */
    j = manifest_build(step, L, o, meta, regs, nreg, bytes, fsum);
    text = j ? json_dumps(j, JSON_INDENT(1)) : NULL;
    if (!text) {
        rc = zs_err(ZS_ENOMEM, "checkpoint: cannot build the manifest");
        goto done;
    }
    size_t tl = strlen(text);
    char *t2 = realloc(text, tl + 2);
    if (!t2) {
        rc = zs_err(ZS_ENOMEM, "checkpoint: out of memory");
        goto done;
    }
    text = t2;
    memcpy(text + tl, "\n", 2);
    if ((rc = write_text(man, text)) < 0) goto done;
    if ((rc = zs_fsync_dir(tmp)) < 0) goto done;
    /* the step may exist already (saved again after a resume): move it aside first */
    if (is_dir(final)) {
        if (rename(final, old) != 0) {
            int e = errno;
            rc = zs_err(zs_errno_code(e), "%s: cannot move aside the previous copy: %s", final,
                        strerror(e));
            goto done;
        }
        moved_old = 1;
    }
    if (rename(tmp, final) != 0) {
        int e = errno;
        rc = zs_err(zs_errno_code(e), "%s: cannot rename to %s: %s", tmp, final, strerror(e));
        goto done;
    }
    made_tmp = 0;
    if ((rc = zs_fsync_dir(dir)) < 0) goto done;
    if (moved_old) {
        int r = rm_tree(old);
        if (r < 0) zs_log_warn("%s: cannot delete: %s", old, strerror(-r));
        moved_old = 0;
    }
    /* latest, atomically */
    char line[80];
    snprintf(line, sizeof line, "%s\n", base);
    if ((rc = write_text(latest_tmp, line)) < 0) goto done;
    if (rename(latest_tmp, latest) != 0) {
        int e = errno;
        rc = zs_err(zs_errno_code(e), "%s: cannot rename to %s: %s", latest_tmp, latest, strerror(e));
        unlink(latest_tmp);
        goto done;
    }
    if ((rc = zs_fsync_dir(dir)) < 0) goto done;
    zs_log_info("%s: checkpoint of step %ld saved (%d ranks, %.1f MiB, %.2f s)", final, step,
                L->ranks, (double)total / (1 << 20), zs_now() - t0);
    prune(dir, keep, base);
done:
    if (multi && rc != ZS_ECANCELLED) rc = agree(multi, rc, "finishing the checkpoint");
    if (made_tmp) {
        int r = rm_tree(tmp);
        if (r < 0) zs_log_warn("%s: cannot remove after a failed save: %s", tmp, strerror(-r));
    }
    if (moved_old && !is_dir(final) && rename(old, final) != 0)
        zs_log_warn("%s: could not restore the previous copy from %s", final, old);
    if (regs)
        for (int r = 0; r < L->ranks; r++) free(regs[r]);
    free(regs);
    free(nreg);
    free(bytes);
    free(fsum);
    free(chunk);
    free(text);
    json_decref(j);
    json_decref(meta);
    free(final);
    free(tmp);
    free(old);
    free(man);
    free(latest_tmp);
    free(latest);
    return rc;
}

/* ---------- open / read ---------- */

typedef struct {
    size_t start, elems;
    const float *p[3]; /* master, m, v inside a mapping */
} piece;

typedef struct {
    size_t elems, shard;
    int replicated;
    int n_pieces;
    piece *pieces;
} ckpt_bucket;

typedef struct {
    void *addr;
    size_t len;
} mapping;

struct zs_ckpt {
    char *path;
    long step;
    int ranks, n_buckets;
    ckpt_bucket *b;
    char *meta, *model_dir, *model_fp;
    mapping *maps;
};

void zs_ckpt_close(zs_ckpt *c) {
    if (!c) return;
    if (c->maps)
        for (int r = 0; r < c->ranks; r++)
            if (c->maps[r].addr) munmap(c->maps[r].addr, c->maps[r].len);
    if (c->b)
        for (int i = 0; i < c->n_buckets; i++) free(c->b[i].pieces);
    free(c->b);
    free(c->maps);
    free(c->path);
    free(c->meta);
    free(c->model_dir);
    free(c->model_fp);
    free(c);
}

/* Non-negative integer member; -1 (with an error) when missing or wrong. */
static int get_size(json_t *o, const char *key, const char *ctx, const char *mpath, size_t *out) {
    json_t *x = json_object_get(o, key);
    if (!json_is_integer(x) || json_integer_value(x) < 0)
        return zs_err(ZS_EFORMAT, "%s: %s%s: expected a non-negative integer", mpath, ctx, key);
    *out = (size_t)json_integer_value(x);
    return 0;
}

/* Picks the step directory of dir (see zs_ckpt_open). */
static int resolve_dir(const char *dir, char **out) {
    *out = NULL;
    struct stat st;
    if (stat(dir, &st) != 0) {
        int e = errno;
        return zs_err(zs_errno_code(e), "%s: cannot open checkpoint: %s", dir, strerror(e));
    }
    if (!S_ISDIR(st.st_mode)) return zs_err(ZS_EINVAL, "%s: not a directory", dir);
    char *mp = zs_str_printf("%s/manifest.json", dir);
    if (!mp) return zs_err(ZS_ENOMEM, "checkpoint: out of memory");
    int has_manifest = file_exists(mp);
    free(mp);
    char trimmed[256] = "";
    size_t dl = strlen(dir);
    while (dl > 1 && dir[dl - 1] == '/') dl--;
    size_t bs = dl;
    while (bs > 0 && dir[bs - 1] != '/') bs--;
    if (dl - bs < sizeof trimmed) memcpy(trimmed, dir + bs, dl - bs), trimmed[dl - bs] = 0;
    if (has_manifest || parse_step_name(trimmed) >= 0 || is_leftover_tmp(trimmed)) {
        /* a step directory (if its manifest is missing, the load says so) */
        *out = strdup(dir);
        return *out ? 0 : zs_err(ZS_ENOMEM, "checkpoint: out of memory");
    }
    char *lp = zs_str_printf("%s/latest", dir);
    if (!lp) return zs_err(ZS_ENOMEM, "checkpoint: out of memory");
    FILE *f = fopen(lp, "r");
    char name[256] = "";
    if (f) {
        if (!fgets(name, sizeof name, f)) name[0] = 0;
        fclose(f);
        name[strcspn(name, "\r\n")] = 0;
        if (parse_step_name(name) < 0) {
            int rc = zs_err(ZS_EFORMAT, "%s: does not name a step directory: \"%s\"", lp, name);
            free(lp);
            return rc;
        }
        char *sd = zs_str_printf("%s/%s", dir, name);
        if (sd && is_dir(sd)) {
            free(lp);
            *out = sd;
            return 0;
        }
        free(sd);
        zs_log_warn("%s: names %s, which does not exist; looking for the newest checkpoint", lp, name);
    }
    free(lp);
    step_ent *v;
    int n;
    ZS_CHECK(list_steps(dir, &v, &n));
    if (n == 0) {
        free(v);
        return zs_err(ZS_ENOTFOUND, "%s: no checkpoint here (no manifest.json, no latest, no "
                      "complete step-* directory)", dir);
    }
    if (f) zs_log_warn("%s: using %s", dir, v[0].name);
    *out = zs_str_printf("%s/%s", dir, v[0].name);
    free(v);
    return *out ? 0 : zs_err(ZS_ENOMEM, "checkpoint: out of memory");
}

static json_t *load_manifest(const char *mpath, int *rc) {
    struct stat st;
    if (stat(mpath, &st) != 0) {
        int e = errno;
        *rc = zs_err(zs_errno_code(e), "%s: %s (incomplete checkpoint?)", mpath,
                     e == ENOENT ? "missing" : strerror(e));
        return NULL;
    }
    if ((size_t)st.st_size > CKPT_MAX_MANIFEST) {
        *rc = zs_err(ZS_EFORMAT, "%s: manifest too large (%lld bytes)", mpath, (long long)st.st_size);
        return NULL;
    }
    json_error_t je;
    json_t *j = json_load_file(mpath, JSON_REJECT_DUPLICATES, &je);
    if (!j) {
        *rc = zs_err(ZS_EFORMAT, "%s: not valid JSON: line %d column %d: %s", mpath, je.line,
                     je.column, je.text);
        return NULL;
    }
    if (!json_is_object(j)) {
        json_decref(j);
        *rc = zs_err(ZS_EFORMAT, "%s: not a JSON object", mpath);
        return NULL;
    }
    return j;
}

typedef struct {
    const unsigned char *base;
    const region *g;
    uint64_t got[3];
} verify_task;

static void verify_fn(void *arg, int i) {
    verify_task *t = &((verify_task *)arg)[i / 3];
    int k = i % 3;
    size_t off = k == 0 ? t->g->off : k == 1 ? t->g->off_m : t->g->off_v;
    t->got[k] = zs_checksum64(t->base + off, t->g->elems * 4);
}

/* Maps and validates rank r's file against the manifest's record f. */
static int open_rank(zs_ckpt *c, const zs_ckpt_layout *L, int r, json_t *f, const char *mpath,
                     region *regs) {
    char ctx[64];
    snprintf(ctx, sizeof ctx, "files[%d].", r);
    json_t *jr = json_object_get(f, "rank");
    const char *name = json_string_value(json_object_get(f, "name"));
    char want[32];
    snprintf(want, sizeof want, "rank%d.bin", r);
    if (!json_is_integer(jr) || json_integer_value(jr) != r || !name || strcmp(name, want) != 0)
        return zs_err(ZS_EFORMAT, "%s: files[%d]: expected rank %d in \"%s\"", mpath, r, r, want);
    size_t bytes, plan_bytes;
    ZS_CHECK(get_size(f, "bytes", ctx, mpath, &bytes));
    uint64_t fsum;
    if (parse_hex16(json_string_value(json_object_get(f, "checksum")), &fsum) != 0)
        return zs_err(ZS_EFORMAT, "%s: %schecksum: expected 16 hex digits", mpath, ctx);
    int n = plan_rank(L, r, regs, &plan_bytes);
    json_t *ra = json_object_get(f, "regions");
    if (!json_is_array(ra) || json_array_size(ra) != (size_t)n)
        return zs_err(ZS_EFORMAT, "%s: %sregions: expected %d regions for this partition", mpath,
                      ctx, n);
    for (int i = 0; i < n; i++) {
        json_t *x = json_array_get(ra, i);
        size_t bk, start, elems, off;
        char rctx[96];
        snprintf(rctx, sizeof rctx, "%sregions[%d].", ctx, i);
        ZS_CHECK(get_size(x, "bucket", rctx, mpath, &bk));
        ZS_CHECK(get_size(x, "start", rctx, mpath, &start));
        ZS_CHECK(get_size(x, "elems", rctx, mpath, &elems));
        ZS_CHECK(get_size(x, "offset", rctx, mpath, &off));
        if (bk != (size_t)regs[i].bucket || start != regs[i].start || elems != regs[i].elems ||
            off != regs[i].off)
            return zs_err(ZS_EFORMAT, "%s: %s bucket %zu [%zu, +%zu) at %zu does not match the "
                          "partition (bucket %d [%zu, +%zu) at %zu)", mpath, rctx, bk, start, elems,
                          off, regs[i].bucket, regs[i].start, regs[i].elems, regs[i].off);
        for (int k = 0; k < 3; k++)
            if (parse_hex16(json_string_value(json_object_get(x, region_names[k])), &regs[i].sum[k]))
                return zs_err(ZS_EFORMAT, "%s: %s%s: expected 16 hex digits", mpath, rctx,
                              region_names[k]);
    }
    if (bytes != plan_bytes)
        return zs_err(ZS_EFORMAT, "%s: %sbytes: %zu, but the partition needs %zu", mpath, ctx, bytes,
                      plan_bytes);

    char *path = zs_str_printf("%s/%s", c->path, name);
    if (!path) return zs_err(ZS_ENOMEM, "checkpoint: out of memory");
    int rc = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0) {
        int e = errno;
        rc = zs_err(zs_errno_code(e), "%s: %s", path, e == ENOENT ? "missing" : strerror(e));
        goto out;
    }
    if (fstat(fd, &st) != 0) {
        int e = errno;
        rc = zs_err(zs_errno_code(e), "%s: %s", path, strerror(e));
        goto out;
    }
    if ((size_t)st.st_size != bytes) {
        rc = zs_err(ZS_EFORMAT, "%s: %lld bytes, manifest says %zu (%s)", path,
                    (long long)st.st_size, bytes,
                    (size_t)st.st_size < bytes ? "truncated?" : "trailing data?");
        goto out;
    }
    void *a = mmap(NULL, bytes, PROT_READ, MAP_SHARED, fd, 0);
    if (a == MAP_FAILED) {
        int e = errno;
        rc = zs_err(zs_errno_code(e), "%s: cannot map: %s", path, strerror(e));
        goto out;
    }
    c->maps[r].addr = a;
    c->maps[r].len = bytes;
    madvise(a, bytes, MADV_SEQUENTIAL);
    ckpt_header h, want_h;
    memcpy(&h, a, sizeof h);
    header_fill(&want_h, r, L->ranks, L->n_buckets, c->step, bytes, n);
    if (memcmp(&h, &want_h, sizeof h) != 0) {
        rc = zs_err(ZS_EFORMAT, "%s: bad header (not rank %d of %d ranks at step %ld, %zu bytes, "
                    "format v%d?)", path, r, L->ranks, c->step, bytes, CKPT_VERSION);
        goto out;
    }
    if (file_checksum(&h, regs, n) != fsum) {
        rc = zs_err(ZS_ECHECKSUM, "%s: file checksum does not match the manifest's region "
                    "checksums (manifest edited?)", path);
        goto out;
    }
    verify_task *vt = calloc((size_t)(n ? n : 1), sizeof *vt);
    if (!vt) {
        rc = zs_err(ZS_ENOMEM, "checkpoint: out of memory");
        goto out;
    }
    for (int i = 0; i < n; i++) {
        vt[i].base = a;
        vt[i].g = &regs[i];
    }
    zs_pool_run(verify_fn, vt, 3 * n);
    for (int i = 0; i < n && rc == 0; i++)
        for (int k = 0; k < 3; k++)
            if (vt[i].got[k] != regs[i].sum[k]) {
                rc = zs_err(ZS_ECHECKSUM, "%s: bucket %d %s (elements %zu..%zu): checksum mismatch "
                            "(manifest %016llx, data %016llx)", path, regs[i].bucket,
                            region_names[k], regs[i].start, regs[i].start + regs[i].elems - 1,
                            (unsigned long long)regs[i].sum[k], (unsigned long long)vt[i].got[k]);
                break;
            }
    free(vt);
    if (rc < 0) goto out;
    for (int i = 0; i < n; i++) {
        ckpt_bucket *b = &c->b[regs[i].bucket];
        piece *p = &b->pieces[b->n_pieces++];
        p->start = regs[i].start;
        p->elems = regs[i].elems;
        const unsigned char *base = a;
        p->p[0] = (const float *)(base + regs[i].off);
        p->p[1] = (const float *)(base + regs[i].off_m);
        p->p[2] = (const float *)(base + regs[i].off_v);
    }
out:
    if (fd >= 0) close(fd);
    free(path);
    return rc;
}

int zs_ckpt_open(const char *dir, zs_ckpt **out) {
    if (!dir || !out) return zs_err(ZS_EINVAL, "checkpoint: no directory");
    zs_ckpt *c = calloc(1, sizeof *c);
    if (!c) return zs_err(ZS_ENOMEM, "checkpoint: out of memory");
    int rc = resolve_dir(dir, &c->path);
    json_t *j = NULL;
    char *mpath = NULL;
    size_t *elems = NULL, *shard = NULL;
    unsigned char *repl = NULL;
    region *regs = NULL;
    if (rc < 0) goto fail;
    mpath = zs_str_printf("%s/manifest.json", c->path);
    if (!mpath) { rc = zs_err(ZS_ENOMEM, "checkpoint: out of memory"); goto fail; }
    if (!(j = load_manifest(mpath, &rc))) goto fail;

    const char *fmt = json_string_value(json_object_get(j, "format"));
    if (!fmt || strcmp(fmt, CKPT_FORMAT) != 0) {
        rc = zs_err(ZS_EFORMAT, "%s: format: expected \"%s\"", mpath, CKPT_FORMAT);
        goto fail;
    }
    json_t *ver = json_object_get(j, "version");
    if (!json_is_integer(ver) || json_integer_value(ver) != CKPT_VERSION) {
        rc = zs_err(ZS_EUNSUPPORTED, "%s: version: only version %d is supported", mpath, CKPT_VERSION);
        goto fail;
    }
    const char *alg = json_string_value(json_object_get(j, "checksum"));
    if (!alg || strcmp(alg, "xxh64") != 0) {
        rc = zs_err(ZS_EUNSUPPORTED, "%s: checksum: expected \"xxh64\"", mpath);
        goto fail;
    }
    size_t step, ranks;
    if ((rc = get_size(j, "step", "", mpath, &step)) < 0) goto fail;
    if ((rc = get_size(j, "ranks", "", mpath, &ranks)) < 0) goto fail;
    if (ranks < 1 || ranks > CKPT_MAX_RANKS || step > (size_t)LONG_MAX) {
        rc = zs_err(ZS_EFORMAT, "%s: ranks %zu / step %zu out of range", mpath, ranks, step);
        goto fail;
    }
    c->step = (long)step;
    c->ranks = (int)ranks;
    json_t *bk = json_object_get(j, "buckets");
    if (!json_is_array(bk) || json_array_size(bk) < 1 || json_array_size(bk) > INT_MAX / 2) {
        rc = zs_err(ZS_EFORMAT, "%s: buckets: expected a non-empty array", mpath);
        goto fail;
    }
    c->n_buckets = (int)json_array_size(bk);
    elems = calloc((size_t)c->n_buckets, sizeof *elems);
    shard = calloc((size_t)c->n_buckets, sizeof *shard);
    repl = calloc((size_t)c->n_buckets, 1);
    c->b = calloc((size_t)c->n_buckets, sizeof *c->b);
    c->maps = calloc((size_t)c->ranks, sizeof *c->maps);
    regs = calloc((size_t)c->n_buckets, sizeof *regs);
    if (!elems || !shard || !repl || !c->b || !c->maps || !regs) {
        rc = zs_err(ZS_ENOMEM, "checkpoint: out of memory");
        goto fail;
    }
    for (int b = 0; b < c->n_buckets; b++) {
        json_t *x = json_array_get(bk, (size_t)b);
        char ctx[48];
        snprintf(ctx, sizeof ctx, "buckets[%d].", b);
        if ((rc = get_size(x, "elems", ctx, mpath, &elems[b])) < 0) goto fail;
        if ((rc = get_size(x, "shard", ctx, mpath, &shard[b])) < 0) goto fail;
        json_t *rp = json_object_get(x, "replicated");
        if (!json_is_boolean(rp)) {
            rc = zs_err(ZS_EFORMAT, "%s: %sreplicated: expected true or false", mpath, ctx);
            goto fail;
        }
        repl[b] = json_is_true(rp);
        c->b[b].elems = elems[b];
        c->b[b].shard = shard[b];
        c->b[b].replicated = repl[b];
        c->b[b].pieces = calloc(repl[b] ? 1 : (size_t)c->ranks, sizeof(piece));
        if (!c->b[b].pieces) {
            rc = zs_err(ZS_ENOMEM, "checkpoint: out of memory");
            goto fail;
        }
    }
    zs_ckpt_layout L = {.n_buckets = c->n_buckets, .bucket_elems = elems, .shard_elems = shard,
                        .replicated = repl, .ranks = c->ranks};
    if ((rc = layout_check(&L)) < 0) {
        zs_err_prefix(ZS_EFORMAT, "%s", mpath);
        rc = ZS_EFORMAT;
        goto fail;
    }
    json_t *model = json_object_get(j, "model");
    const char *md = json_string_value(json_object_get(model, "dir"));
    const char *mf = json_string_value(json_object_get(model, "fingerprint"));
    if ((md && !(c->model_dir = strdup(md))) || (mf && !(c->model_fp = strdup(mf)))) {
        rc = zs_err(ZS_ENOMEM, "checkpoint: out of memory");
        goto fail;
    }
    json_t *meta = json_object_get(j, "meta");
    if (meta && !json_is_object(meta)) {
        rc = zs_err(ZS_EFORMAT, "%s: meta: expected a JSON object", mpath);
        goto fail;
    }
    c->meta = meta ? json_dumps(meta, JSON_COMPACT) : strdup("{}");
    if (!c->meta) {
        rc = zs_err(ZS_ENOMEM, "checkpoint: out of memory");
        goto fail;
    }
    json_t *files = json_object_get(j, "files");
    if (!json_is_array(files) || json_array_size(files) != ranks) {
        rc = zs_err(ZS_EFORMAT, "%s: files: expected an array of %zu entries (one per rank)", mpath,
                    ranks);
        goto fail;
    }
    for (int r = 0; r < c->ranks; r++)
        if ((rc = open_rank(c, &L, r, json_array_get(files, (size_t)r), mpath, regs)) < 0) goto fail;
    json_decref(j);
    free(mpath);
    free(elems);
    free(shard);
    free(repl);
    free(regs);
    zs_log_info("%s: checkpoint of step %ld opened (%d ranks, %d buckets, checksums verified)",
                c->path, c->step, c->ranks, c->n_buckets);
    *out = c;
    return 0;
fail:
    json_decref(j);
    free(mpath);
    free(elems);
    free(shard);
    free(repl);
    free(regs);
    zs_ckpt_close(c);
    return rc;
}

long zs_ckpt_step(const zs_ckpt *c) { return c->step; }
const char *zs_ckpt_path(const zs_ckpt *c) { return c->path; }
const char *zs_ckpt_meta(const zs_ckpt *c) { return c->meta; }
const char *zs_ckpt_model_dir(const zs_ckpt *c) { return c->model_dir; }
const char *zs_ckpt_model_fingerprint(const zs_ckpt *c) { return c->model_fp; }
int zs_ckpt_ranks(const zs_ckpt *c) { return c->ranks; }
int zs_ckpt_n_buckets(const zs_ckpt *c) { return c->n_buckets; }

size_t zs_ckpt_bucket_elems(const zs_ckpt *c, int bucket) {
    return bucket >= 0 && bucket < c->n_buckets ? c->b[bucket].elems : 0;
}

int zs_ckpt_bucket_replicated(const zs_ckpt *c, int bucket) {
    return bucket >= 0 && bucket < c->n_buckets ? c->b[bucket].replicated : 0;
}

int zs_ckpt_read(const zs_ckpt *c, int bucket, size_t offset, size_t n, float *master, float *m,
                 float *v) {
    if (!c || bucket < 0 || bucket >= c->n_buckets)
        return zs_err(ZS_EINVAL, "checkpoint: bucket %d out of range", bucket);
    const ckpt_bucket *b = &c->b[bucket];
    if (offset > b->elems || n > b->elems - offset)
        return zs_err(ZS_ERANGE, "%s: bucket %d: elements [%zu, %zu) beyond its %zu", c->path,
                      bucket, offset, offset + n, b->elems);
    float *dst[3] = {master, m, v};
    size_t end = offset + n;
    for (int i = 0; i < b->n_pieces; i++) {
        const piece *p = &b->pieces[i];
        size_t lo = ZS_MAX(offset, p->start), hi = ZS_MIN(end, p->start + p->elems);
        if (lo >= hi) continue;
        for (int k = 0; k < 3; k++)
            if (dst[k]) memcpy(dst[k] + (lo - offset), p->p[k] + (lo - p->start), (hi - lo) * 4);
    }
    return 0;
}
