/* store.c — per-rank shard files of the NVMe offload tier: directory checks (existence,
 * writability, free space), layout, reuse by checkpoint fingerprint, writing with checksums,
 * the JSON manifest, the atomic commit (tmp + fsync + rename + dir fsync), in-place repair,
 * training's in-place update of a shard (new checksum, manifest replaced atomically, fingerprint
 * marked "-trained"), and a verified synchronous read of one shard.
 * The asynchronous reader lives in store-uring.c. */
#define _GNU_SOURCE
#include "store.h"

#include "common.h"
#include "fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define ZS_MANIFEST_FORMAT "zeroserve-shards"
#define ZS_MANIFEST_VERSION 1
#define ZS_MIN_MARGIN ((size_t)64 << 20)

/* ---------------------------------------------------------------- checksum (XXH64) ---- */
/* XXH64 by Yann Collet (BSD-2), re-implemented from the public specification: four 64-bit
 * lanes over 32-byte stripes, then 8/4/1-byte tails and a final avalanche. Seed 0. Input is read
 * little-endian (memcpy, so any alignment). */

#define XXP1 0x9E3779B185EBCA87ULL
#define XXP2 0xC2B2AE3D27D4EB4FULL
#define XXP3 0x165667B19E3779F9ULL
#define XXP4 0x85EBCA77C2B2AE63ULL
#define XXP5 0x27D4EB2F165667C5ULL

static inline uint64_t xx_rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
static inline uint64_t xx_rd64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}
static inline uint32_t xx_rd32(const unsigned char *p) {
    uint32_t v;
    memcpy(&v, p, 4);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    return v;
}
static inline uint64_t xx_round(uint64_t acc, uint64_t in) {
    acc += in * XXP2;
    acc = xx_rotl(acc, 31);
    return acc * XXP1;
}
static inline uint64_t xx_merge(uint64_t acc, uint64_t v) {
    acc ^= xx_round(0, v);
    return acc * XXP1 + XXP4;
}

static inline uint64_t xx_lanes(const uint64_t v[4]) {
    uint64_t h = xx_rotl(v[0], 1) + xx_rotl(v[1], 7) + xx_rotl(v[2], 12) + xx_rotl(v[3], 18);
    for (int i = 0; i < 4; i++) h = xx_merge(h, v[i]);
    return h;
}

static inline void xx_stripe(uint64_t v[4], const unsigned char *p) {
    v[0] = xx_round(v[0], xx_rd64(p));
    v[1] = xx_round(v[1], xx_rd64(p + 8));
    v[2] = xx_round(v[2], xx_rd64(p + 16));
    v[3] = xx_round(v[3], xx_rd64(p + 24));
}

static inline void xx_lanes_init(uint64_t v[4]) {
    v[0] = XXP1 + XXP2;
    v[1] = XXP2;
    v[2] = 0;
    v[3] = (uint64_t)0 - XXP1;
}

/* The tail (fewer than 32 bytes in [p, end)) and the final avalanche; h already holds the
 * lanes' merge (or XXP5 for short input) plus the total length. */
static uint64_t xx_finish(uint64_t h, const unsigned char *p, const unsigned char *end) {
    while (p + 8 <= end) {
        h ^= xx_round(0, xx_rd64(p));
        h = xx_rotl(h, 27) * XXP1 + XXP4;
        p += 8;
    }
    if (p + 4 <= end) {
        h ^= (uint64_t)xx_rd32(p) * XXP1;
        h = xx_rotl(h, 23) * XXP2 + XXP3;
        p += 4;
    }
    while (p < end) {
        h ^= (uint64_t)(*p) * XXP5;
        h = xx_rotl(h, 11) * XXP1;
        p++;
    }
    h ^= h >> 33;
    h *= XXP2;
    h ^= h >> 29;
    h *= XXP3;
    h ^= h >> 32;
    return h;
}

uint64_t zs_checksum64(const void *data, size_t n) {
    const unsigned char *p = data, *end = p + n;
    uint64_t h;
    if (n >= 32) {
        uint64_t v[4];
        xx_lanes_init(v);
        const unsigned char *lim = end - 32;
        do {
            xx_stripe(v, p);
            p += 32;
        } while (p <= lim);
        h = xx_lanes(v);
    } else {
        h = XXP5;
    }
    return xx_finish(h + (uint64_t)n, p, end);
}

/* Streaming: whole 32-byte stripes go through the lanes as soon as they are complete (a partial
 * one waits in buf), so any split of the input gives the one-shot value. */
void zs_checksum64_init(zs_checksum64_state *s) {
    memset(s, 0, sizeof *s);
    xx_lanes_init(s->v);
}

void zs_checksum64_update(zs_checksum64_state *s, const void *data, size_t n) {
    const unsigned char *p = data;
    if (n == 0) return;
    s->total += (uint64_t)n;
    if (s->buflen) {
        size_t take = ZS_MIN(n, 32 - (size_t)s->buflen);
        memcpy(s->buf + s->buflen, p, take);
        s->buflen += (uint32_t)take;
        p += take;
        n -= take;
        if (s->buflen < 32) return;
        xx_stripe(s->v, s->buf);
        s->buflen = 0;
    }
    for (; n >= 32; p += 32, n -= 32) xx_stripe(s->v, p);
    if (n) {
        memcpy(s->buf, p, n);
        s->buflen = (uint32_t)n;
    }
}

uint64_t zs_checksum64_final(const zs_checksum64_state *s) {
    uint64_t h = s->total >= 32 ? xx_lanes(s->v) : XXP5;
    return xx_finish(h + s->total, s->buf, s->buf + s->buflen);
}

/* ---------------------------------------------------------------- helpers ---- */



static double gib(unsigned long long b) { return (double)b / (double)(1ULL << 30); }



/* ---------------------------------------------------------------- dir check ---- */

int zs_shard_dir_check(const char *dir, size_t total_bytes) {
    if (!dir || !*dir) return zs_err(ZS_EINVAL, "shard directory: empty path");
    struct stat st;
    if (stat(dir, &st) != 0) {
        int e = errno;
        if (e == ENOENT)
            return zs_err(ZS_ENOTFOUND, "shard directory %s does not exist", dir);
        if (e == ENOTDIR)
            return zs_err(ZS_ENOTFOUND,
                          "shard directory %s: a component of the path is not a directory", dir);
        return zs_err(zs_errno_code(e), "shard directory %s: cannot stat: %s", dir, strerror(e));
    }
    if (!S_ISDIR(st.st_mode))
        return zs_err(ZS_ENOTFOUND, "shard directory %s is not a directory", dir);

    if (access(dir, W_OK | X_OK) != 0) {
        int e = errno;
        return zs_err(e == EROFS || e == EACCES || e == EPERM ? ZS_EPERM : ZS_EIO,
                      "shard directory %s is not writable: %s", dir, strerror(e));
    }
    /* access() says yes for root even on chmod 0555 dirs and knows nothing of some read-only
     * mounts or LSMs: really create a file. */
    char *probe = zs_str_printf("%s/.zs-probe-XXXXXX", dir);
    if (!probe) return zs_err(ZS_ENOMEM, "out of memory");
    int fd = mkstemp(probe);
    if (fd < 0) {
        int e = errno;
        int code = zs_errno_code(e);
        if (code == ZS_ENOTFOUND) code = ZS_EPERM;
        zs_err(code, "shard directory %s is not writable: cannot create a file in it: %s", dir,
               strerror(e));
        free(probe);
        return code;
    }
    close(fd);
    unlink(probe);
    free(probe);
    /* Space: checked before any shard byte is written (the probe above is empty and removed). */
    struct statvfs vs;
    if (statvfs(dir, &vs) != 0) {
        int e = errno;
        return zs_err(ZS_EIO, "shard directory %s: statvfs failed: %s", dir, strerror(e));
    }
    unsigned long long avail = (unsigned long long)vs.f_bavail * (unsigned long long)vs.f_frsize;
    if (vs.f_frsize && avail / vs.f_frsize != (unsigned long long)vs.f_bavail) avail = ~0ULL;
    size_t margin = ZS_MAX(ZS_MIN_MARGIN, total_bytes / 100), need;
    if (zs_add_size(total_bytes, margin, &need) < 0) need = SIZE_MAX;
    if ((unsigned long long)need > avail)
        return zs_err(ZS_ENOSPC,
                      "shard directory %s: not enough free space: need %zu bytes of shards + "
                      "%zu bytes margin (%.2f GiB), the filesystem has %llu bytes (%.2f GiB) "
                      "available",
                      dir, total_bytes, margin, gib(total_bytes) + gib(margin), avail,
                      gib(avail));
    return 0;
}

/* ---------------------------------------------------------------- shard file ---- */

enum { SF_WRITING = 1, SF_READABLE = 2, SF_FAILED = 3 };

struct zs_shard_file {
    char *dir;
    int rank;
    char *fingerprint;
    char *path, *tmp_path, *man_path, *man_tmp_path;
    int n;
    size_t *bytes, *offs;
    uint64_t *sums;
    unsigned char *written;
    char **labels;
    size_t total;
    int state;
    int fd; /* data tmp file while writing, else -1 */
};

static void sf_free(zs_shard_file *f) {
    if (!f) return;
    if (f->fd >= 0) close(f->fd);
    if (f->labels)
        for (int i = 0; i < f->n; i++) free(f->labels[i]);
    free(f->labels);
    free(f->dir);
    free(f->fingerprint);
    free(f->path);
    free(f->tmp_path);
    free(f->man_path);
    free(f->man_tmp_path);
    free(f->bytes);
    free(f->offs);
    free(f->sums);
    free(f->written);
    free(f);
}

static int parse_hex64(const char *s, uint64_t *out) {
    if (!s || strlen(s) != 16) return -1;
    uint64_t v = 0;
    for (int i = 0; i < 16; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                : -1;
        if (d < 0) return -1;
        v = v << 4 | (uint64_t)d;
    }
    *out = v;
    return 0;
}

/* Returns 1 if the existing pair matches the layout and fingerprint (fills f->sums), else 0
 * after logging why. */
static int sf_try_reuse(zs_shard_file *f) {
    struct stat st;
    if (stat(f->man_path, &st) != 0) {
        if (errno == ENOENT || errno == ENOTDIR)
            zs_log_info("%s: no manifest, writing rank %d shards", f->man_path, f->rank);
        else
            zs_log_warn("%s: cannot stat manifest (%s); rewriting the shard file", f->man_path,
                        strerror(errno));
        return 0;
    }
    json_error_t je;
    json_t *m = json_load_file(f->man_path, 0, &je);
    if (!m) {
        zs_log_warn("%s: unreadable manifest (line %d: %s); rewriting the shard file",
                    f->man_path, je.line, je.text);
        return 0;
    }
    int ok = 0;
    const char *why = NULL;
    char whybuf[512];
    const char *fmt = json_string_value(json_object_get(m, "format"));
    json_t *ver = json_object_get(m, "version");
    json_t *rank = json_object_get(m, "rank");
    const char *fp = json_string_value(json_object_get(m, "fingerprint"));
    const char *alg = json_string_value(json_object_get(m, "checksum"));
    json_t *total = json_object_get(m, "total_bytes");
    json_t *shards = json_object_get(m, "shards");
    if (!fmt || strcmp(fmt, ZS_MANIFEST_FORMAT) != 0 || !json_is_integer(ver) ||
        json_integer_value(ver) != ZS_MANIFEST_VERSION || !json_is_integer(rank) || !fp ||
        !alg || strcmp(alg, "xxh64") != 0 || !json_is_integer(total) || !json_is_array(shards)) {
        why = "not a version-1 zeroserve shard manifest";
        goto done;
    }
    if (json_integer_value(rank) != f->rank) {
        snprintf(whybuf, sizeof whybuf, "manifest is for rank %lld, not %d",
                 (long long)json_integer_value(rank), f->rank);
        why = whybuf;
        goto done;
    }
    if (strcmp(fp, f->fingerprint) != 0) {
        zs_log_info("%s: checkpoint fingerprint changed (was \"%.200s\", now \"%.200s\"); "
                    "rewriting the shard file",
                    f->man_path, fp, f->fingerprint);
        goto done_quiet;
    }
    if (json_array_size(shards) != (size_t)f->n) {
        zs_log_info("%s: layout changed (%zu shards in the manifest, %d now); rewriting",
                    f->man_path, json_array_size(shards), f->n);
        goto done_quiet;
    }
    for (int i = 0; i < f->n; i++) {
        json_t *s = json_array_get(shards, (size_t)i);
        json_t *jb = json_object_get(s, "bytes"), *jo = json_object_get(s, "offset");
        const char *cs = json_string_value(json_object_get(s, "checksum"));
        if (!json_is_integer(jb) || !json_is_integer(jo) || !cs) {
            snprintf(whybuf, sizeof whybuf, "shard %d entry lacks bytes/offset/checksum", i);
            why = whybuf;
            goto done;
        }
        if ((unsigned long long)json_integer_value(jb) != (unsigned long long)f->bytes[i] ||
            json_integer_value(jb) < 0 || json_integer_value(jo) < 0 ||
            (unsigned long long)json_integer_value(jo) != (unsigned long long)f->offs[i]) {
            zs_log_info("%s: layout changed (shard %d: %lld bytes at %lld in the manifest, "
                        "%zu at %zu now); rewriting",
                        f->man_path, i, (long long)json_integer_value(jb),
                        (long long)json_integer_value(jo), f->bytes[i], f->offs[i]);
            goto done_quiet;
        }
        if (parse_hex64(cs, &f->sums[i]) != 0) {
            snprintf(whybuf, sizeof whybuf, "shard %d: bad checksum \"%.40s\"", i, cs);
            why = whybuf;
            goto done;
        }
    }
    if ((unsigned long long)json_integer_value(total) != (unsigned long long)f->total) {
        why = "total_bytes does not match the shards";
        goto done;
    }
    if (stat(f->path, &st) != 0) {
        zs_log_warn("%s: manifest present but data file %s is missing (%s); rewriting",
                    f->man_path, f->path, strerror(errno));
        goto done_quiet;
    }
    if (!S_ISREG(st.st_mode)) {
        zs_log_warn("%s is not a regular file; rewriting", f->path);
        goto done_quiet;
    }
    if ((unsigned long long)st.st_size != (unsigned long long)f->total) {
        zs_log_warn("%s: file is %lld bytes but its manifest %s describes %zu (truncated or "
                    "modified after it was written); treating it as stale and rewriting",
                    f->path, (long long)st.st_size, f->man_path, f->total);
        goto done_quiet;
    }
    ok = 1;
done:
    if (!ok && why)
        zs_log_warn("%s: %s; rewriting the shard file", f->man_path, why);
done_quiet:
    json_decref(m);
    if (!ok) memset(f->sums, 0, (size_t)f->n * sizeof *f->sums);
    return ok;
}

static int sf_create_tmp(zs_shard_file *f) {
    unlink(f->man_tmp_path); /* leftovers of an interrupted earlier attempt */
    /* The old pair is stale: remove it (manifest first) so that its space is free for the new
     * file; a crash from here on leaves no valid pair, which is then rewritten. */
    struct stat st;
    if (stat(f->path, &st) == 0 || stat(f->man_path, &st) == 0) {
        if (unlink(f->man_path) != 0 && errno != ENOENT) {
            int e = errno;
            return zs_err(zs_errno_code(e), "%s: cannot remove stale manifest: %s", f->man_path,
                          strerror(e));
        }
        if (unlink(f->path) != 0 && errno != ENOENT) {
            int e = errno;
            return zs_err(zs_errno_code(e), "%s: cannot remove stale shard file: %s", f->path,
                          strerror(e));
        }
        int rc = zs_fsync_dir(f->dir);
        if (rc < 0) return rc;
        zs_log_info("%s: removed the stale shard file and manifest", f->path);
    }
    int fd = open(f->tmp_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        int e = errno;
        return zs_err(zs_errno_code(e), "%s: cannot create shard file: %s", f->tmp_path,
                      strerror(e));
    }
    if (f->total > 0) {
        if (fallocate(fd, 0, 0, (off_t)f->total) != 0) {
            int e = errno;
            if (e == ENOSPC || e == EDQUOT) {
                struct statvfs vs;
                unsigned long long avail = 0;
                if (statvfs(f->dir, &vs) == 0)
                    avail = (unsigned long long)vs.f_bavail * vs.f_frsize;
                close(fd);
                unlink(f->tmp_path);
                return zs_err(ZS_ENOSPC,
                              "%s: cannot allocate %zu bytes (%.2f GiB) for rank %d's shards: "
                              "%s (%llu bytes available)",
                              f->tmp_path, f->total, gib(f->total), f->rank, strerror(e), avail);
            }
            /* EOPNOTSUPP etc.: fine, ftruncate below sets the size. */
        }
        if (ftruncate(fd, (off_t)f->total) != 0) {
            int e = errno;
            close(fd);
            unlink(f->tmp_path);
            return zs_err(zs_errno_code(e), "%s: cannot size shard file to %zu bytes: %s",
                          f->tmp_path, f->total, strerror(e));
        }
    }
    f->fd = fd;
    return 0;
}

int zs_shard_file_open(const char *dir, int rank, const char *fingerprint, int n,
                       const size_t *shard_bytes, int *reused, zs_shard_file **out) {
    if (!dir || !*dir || !fingerprint || !shard_bytes || !reused || !out)
        return zs_err(ZS_EINVAL, "zs_shard_file_open: NULL argument");
    if (rank < 0) return zs_err(ZS_EINVAL, "zs_shard_file_open: negative rank %d", rank);
    if (n <= 0) return zs_err(ZS_EINVAL, "%s: rank %d: shard count %d must be >= 1", dir, rank, n);
    json_t *fpj = json_string(fingerprint); /* NULL when not UTF-8 */
    if (!fpj) return zs_err(ZS_EINVAL, "%s: rank %d: fingerprint is not valid UTF-8", dir, rank);
    json_decref(fpj);
    zs_shard_file *f = calloc(1, sizeof *f);
    if (!f) return zs_err(ZS_ENOMEM, "out of memory");
    f->fd = -1;
    f->n = n;
    f->rank = rank;
    f->dir = strdup(dir);
    f->fingerprint = strdup(fingerprint);
    f->path = zs_str_printf("%s/rank%d.shards", dir, rank);
    f->tmp_path = zs_str_printf("%s/rank%d.shards.tmp", dir, rank);
    f->man_path = zs_str_printf("%s/rank%d.json", dir, rank);
    f->man_tmp_path = zs_str_printf("%s/rank%d.json.tmp", dir, rank);
    f->bytes = calloc((size_t)n, sizeof *f->bytes);
    f->offs = calloc((size_t)n, sizeof *f->offs);
    f->sums = calloc((size_t)n, sizeof *f->sums);
    f->written = calloc((size_t)n, 1);
    f->labels = calloc((size_t)n, sizeof *f->labels);
    if (!f->dir || !f->fingerprint || !f->path || !f->tmp_path || !f->man_path ||
        !f->man_tmp_path || !f->bytes || !f->offs || !f->sums || !f->written || !f->labels) {
        sf_free(f);
        return zs_err(ZS_ENOMEM, "out of memory");
    }
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        if (shard_bytes[i] % ZS_STORE_ALIGN != 0) {
            int rc = zs_err(ZS_EINVAL, "%s: shard %d size %zu is not a multiple of %d",
                            f->path, i, shard_bytes[i], ZS_STORE_ALIGN);
            sf_free(f);
            return rc;
        }
        f->bytes[i] = shard_bytes[i];
        f->offs[i] = off;
        if (zs_add_size(off, shard_bytes[i], &off) < 0 || off > (size_t)INT64_MAX) {
            int rc = zs_err(ZS_ERANGE, "%s: total size of %d shards overflows", f->path, n);
            sf_free(f);
            return rc;
        }
    }
    f->total = off;

    if (sf_try_reuse(f)) {
        f->state = SF_READABLE;
        *reused = 1;
        *out = f;
        return 0;
    }
    int rc = sf_create_tmp(f);
    if (rc < 0) {
        sf_free(f);
        return rc;
    }
    f->state = SF_WRITING;
    for (int i = 0; i < n; i++)
        if (f->bytes[i] == 0) {
            f->written[i] = 1;
            f->sums[i] = zs_checksum64("", 0);
        }
    *reused = 0;
    *out = f;
    return 0;
}

int zs_shard_file_write(zs_shard_file *f, int shard, const void *data) {
    if (!f) return zs_err(ZS_EINVAL, "zs_shard_file_write: NULL file");
    if (f->state != SF_WRITING)
        return zs_err(ZS_EINVAL, "%s: shard %d: file is not open for writing (%s)", f->path,
                      shard, f->state == SF_READABLE ? "reused or already committed" : "failed");
    if (shard < 0 || shard >= f->n)
        return zs_err(ZS_ERANGE, "%s: shard %d out of range (0..%d)", f->tmp_path, shard,
                      f->n - 1);
    if (f->bytes[shard] == 0) return 0;
    if (!data) return zs_err(ZS_EINVAL, "%s: shard %d: NULL data", f->tmp_path, shard);
    int e = zs_pwrite_all(f->fd, data, f->bytes[shard], (off_t)f->offs[shard]);
    if (e < 0)
        return zs_err(zs_errno_code(-e), "%s: shard %d: write of %zu bytes at offset %zu failed: %s",
                      f->tmp_path, shard, f->bytes[shard], f->offs[shard], strerror(-e));
    /* Start writeback now (asynchronously) so that commit's fsync has little left to do and
     * dirty pages do not pile up while a large model is written. */
    (void)sync_file_range(f->fd, (off_t)f->offs[shard], (off_t)f->bytes[shard],
                          SYNC_FILE_RANGE_WRITE);
    f->sums[shard] = zs_checksum64(data, f->bytes[shard]);
    f->written[shard] = 1;
    return 0;
}

static int sf_write_manifest(zs_shard_file *f);

/* Writes the manifest to its tmp name, renames it over the manifest and fsyncs the dir: the
 * manifest on disk is always either the old or the new one. */
static int sf_replace_manifest(zs_shard_file *f) {
    int rc = sf_write_manifest(f);
    if (rc < 0) {
        unlink(f->man_tmp_path);
        return rc;
    }
    if (rename(f->man_tmp_path, f->man_path) != 0) {
        int e = errno;
        unlink(f->man_tmp_path);
        return zs_err(zs_errno_code(e), "%s: cannot rename to %s: %s", f->man_tmp_path,
                      f->man_path, strerror(e));
    }
    return zs_fsync_dir(f->dir);
}

#define ZS_TRAINED_SUFFIX "-trained"

int zs_shard_file_update(zs_shard_file *f, int shard, const void *data) {
    if (!f || !data) return zs_err(ZS_EINVAL, "zs_shard_file_update: NULL argument");
    if (f->state != SF_READABLE)
        return zs_err(ZS_EINVAL, "%s: shard %d: only a committed file can be updated", f->path,
                      shard);
    if (shard < 0 || shard >= f->n)
        return zs_err(ZS_ERANGE, "%s: shard %d out of range (0..%d)", f->path, shard, f->n - 1);
    if (f->bytes[shard] == 0) return 0;
    /* First update: mark the manifest before any shard byte changes, so that from here on (even
     * after a crash half-way through a write) the file is never reused for the base checkpoint. */
    size_t fl = strlen(f->fingerprint), sl = strlen(ZS_TRAINED_SUFFIX);
    if (fl < sl || strcmp(f->fingerprint + fl - sl, ZS_TRAINED_SUFFIX) != 0) {
        char *fp = zs_str_printf("%s%s", f->fingerprint, ZS_TRAINED_SUFFIX);
        if (!fp) return zs_err(ZS_ENOMEM, "out of memory");
        char *old = f->fingerprint;
        f->fingerprint = fp;
        int rc = sf_replace_manifest(f);
        if (rc < 0) {
            f->fingerprint = old;
            free(fp);
            return rc;
        }
        free(old);
    }
    int fd = open(f->path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return zs_err(zs_errno_code(e), "%s: cannot open for update: %s", f->path, strerror(e));
    }
    int e = zs_pwrite_all(fd, data, f->bytes[shard], (off_t)f->offs[shard]);
    if (e == 0 && fdatasync(fd) != 0) e = -errno;
    /* readers use O_DIRECT: do not keep the new data in the page cache */
    if (e == 0) (void)posix_fadvise(fd, (off_t)f->offs[shard], (off_t)f->bytes[shard],
                                    POSIX_FADV_DONTNEED);
    close(fd);
    if (e < 0)
        return zs_err(zs_errno_code(-e), "%s: shard %d: update write of %zu bytes at offset %zu "
                      "failed: %s", f->path, shard, f->bytes[shard], f->offs[shard], strerror(-e));
    uint64_t old_sum = f->sums[shard];
    f->sums[shard] = zs_checksum64(data, f->bytes[shard]);
    int rc = sf_replace_manifest(f);
    if (rc < 0) f->sums[shard] = old_sum; /* the manifest on disk still has the old checksum */
    return rc;
}

int zs_shard_file_read(const zs_shard_file *f, int shard, void *buf) {
    if (!f || !buf) return zs_err(ZS_EINVAL, "zs_shard_file_read: NULL argument");
    if (f->state != SF_READABLE)
        return zs_err(ZS_EINVAL, "%s: shard %d: file is not readable (not committed)", f->tmp_path,
                      shard);
    if (shard < 0 || shard >= f->n)
        return zs_err(ZS_ERANGE, "%s: shard %d out of range (0..%d)", f->path, shard, f->n - 1);
    size_t n = f->bytes[shard], done = 0;
    if (n == 0) return 0;
    const char *lb = f->labels[shard];
    int fd = open(f->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return zs_err(zs_errno_code(e), "%s: cannot open: %s", f->path, strerror(e));
    }
    while (done < n) {
        ssize_t k = pread(fd, (char *)buf + done, n - done, (off_t)(f->offs[shard] + done));
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            int e = k < 0 ? errno : 0;
            close(fd);
            if (k == 0)
                return zs_err(ZS_EFORMAT, "%s: shard %d%s%s%s: unexpected end of file at offset "
                              "%zu (truncated?)", f->path, shard, lb ? " (" : "", lb ? lb : "",
                              lb ? ")" : "", f->offs[shard] + done);
            return zs_err(zs_errno_code(e), "%s: shard %d%s%s%s: read failed at offset %zu: %s",
                          f->path, shard, lb ? " (" : "", lb ? lb : "", lb ? ")" : "",
                          f->offs[shard] + done, strerror(e));
        }
        done += (size_t)k;
    }
    close(fd);
    uint64_t got = zs_checksum64(buf, n);
    if (got != f->sums[shard])
        return zs_err(ZS_ECHECKSUM, "%s: shard %d%s%s%s: checksum mismatch (manifest %016llx, "
                      "read %016llx; %zu bytes at offset %zu)", f->path, shard, lb ? " (" : "",
                      lb ? lb : "", lb ? ")" : "", (unsigned long long)f->sums[shard],
                      (unsigned long long)got, n, f->offs[shard]);
    return 0;
}

int zs_shard_file_repair(zs_shard_file *f, int shard, const void *data) {
    if (!f || !data) return zs_err(ZS_EINVAL, "zs_shard_file_repair: NULL argument");
    if (f->state != SF_READABLE)
        return zs_err(ZS_EINVAL, "%s: shard %d: only a committed file can be repaired", f->path, shard);
    if (shard < 0 || shard >= f->n)
        return zs_err(ZS_ERANGE, "%s: shard %d out of range (0..%d)", f->path, shard, f->n - 1);
    if (f->bytes[shard] == 0) return 0;
    if (zs_checksum64(data, f->bytes[shard]) != f->sums[shard])
        return zs_err(ZS_ECHECKSUM, "%s: shard %d: repair data does not match the recorded checksum",
                      f->path, shard);
    int fd = open(f->path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return zs_err(zs_errno_code(errno), "%s: cannot open for repair: %s", f->path, strerror(errno));
    int e = zs_pwrite_all(fd, data, f->bytes[shard], (off_t)f->offs[shard]);
    if (e == 0 && fsync(fd) != 0) e = -errno;
    close(fd);
    if (e < 0)
        return zs_err(zs_errno_code(-e), "%s: shard %d: repair write failed: %s", f->path, shard, strerror(-e));
    return 0;
}

static int sf_write_manifest(zs_shard_file *f) {
    json_t *m = json_object();
    json_t *arr = json_array();
    int bad = !m || !arr;
    if (!bad) {
        bad |= json_object_set_new(m, "format", json_string(ZS_MANIFEST_FORMAT));
        bad |= json_object_set_new(m, "version", json_integer(ZS_MANIFEST_VERSION));
        bad |= json_object_set_new(m, "rank", json_integer(f->rank));
        bad |= json_object_set_new(m, "fingerprint", json_string(f->fingerprint));
        bad |= json_object_set_new(m, "checksum", json_string("xxh64"));
        bad |= json_object_set_new(m, "alignment", json_integer(ZS_STORE_ALIGN));
        bad |= json_object_set_new(m, "total_bytes", json_integer((json_int_t)f->total));
        for (int i = 0; i < f->n && !bad; i++) {
            char hex[17];
            snprintf(hex, sizeof hex, "%016llx", (unsigned long long)f->sums[i]);
            json_t *s = json_object();
            if (!s) {
                bad = 1;
                break;
            }
            bad |= json_object_set_new(s, "offset", json_integer((json_int_t)f->offs[i]));
            bad |= json_object_set_new(s, "bytes", json_integer((json_int_t)f->bytes[i]));
            bad |= json_object_set_new(s, "checksum", json_string(hex));
            if (f->labels[i]) bad |= json_object_set_new(s, "label", json_string(f->labels[i]));
            bad |= json_array_append_new(arr, s);
        }
    }
    char *text = NULL;
    if (!bad) {
        bad |= json_object_set(m, "shards", arr);
        if (!bad) text = json_dumps(m, JSON_INDENT(1));
    }
    json_decref(arr);
    json_decref(m);
    if (bad || !text) {
        free(text);
        return zs_err(ZS_ENOMEM, "%s: cannot build manifest JSON", f->man_tmp_path);
    }
    size_t len = strlen(text);
    int fd = open(f->man_tmp_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        int e = errno;
        free(text);
        return zs_err(zs_errno_code(e), "%s: cannot create manifest: %s", f->man_tmp_path,
                      strerror(e));
    }
    int e = zs_pwrite_all(fd, text, len, 0);
    if (e == 0) e = zs_pwrite_all(fd, "\n", 1, (off_t)len);
    if (e == 0 && fsync(fd) != 0) e = -errno;
    if (close(fd) != 0 && e == 0) e = -errno;
    free(text);
    if (e < 0)
        return zs_err(zs_errno_code(-e), "%s: writing manifest failed: %s", f->man_tmp_path,
                      strerror(-e));
    return 0;
}

int zs_shard_file_commit(zs_shard_file *f) {
    if (!f) return zs_err(ZS_EINVAL, "zs_shard_file_commit: NULL file");
    if (f->state != SF_WRITING)
        return zs_err(ZS_EINVAL, "%s: commit: file is not open for writing (%s)", f->path,
                      f->state == SF_READABLE ? "reused or already committed" : "failed");
    for (int i = 0; i < f->n; i++)
        if (!f->written[i])
            return zs_err(ZS_EINVAL, "%s: commit: shard %d%s%s%s was never written",
                          f->tmp_path, i, f->labels[i] ? " (" : "",
                          f->labels[i] ? f->labels[i] : "", f->labels[i] ? ")" : "");
    int rc = 0;
    if (fdatasync(f->fd) != 0) {
        int e = errno;
        rc = zs_err(zs_errno_code(e), "%s: fsync failed: %s", f->tmp_path, strerror(e));
        goto fail;
    }
    /* The data is on disk; readers use O_DIRECT, so do not keep it in the page cache. */
    (void)posix_fadvise(f->fd, 0, 0, POSIX_FADV_DONTNEED);
    int cfd = f->fd;
    f->fd = -1;
    if (close(cfd) != 0) {
        int e = errno;
        rc = zs_err(ZS_EIO, "%s: close failed: %s", f->tmp_path, strerror(e));
        goto fail;
    }
    if ((rc = sf_write_manifest(f)) < 0) goto fail;
    /* Invalidate the old pair first: from here until the final rename there is no manifest, so a
     * crash leaves nothing that would be reused. */
    if (unlink(f->man_path) != 0 && errno != ENOENT) {
        int e = errno;
        rc = zs_err(zs_errno_code(e), "%s: cannot remove old manifest: %s", f->man_path,
                    strerror(e));
        goto fail;
    }
    if ((rc = zs_fsync_dir(f->dir)) < 0) goto fail;
    if (rename(f->tmp_path, f->path) != 0) {
        int e = errno;
        rc = zs_err(zs_errno_code(e), "%s: cannot rename to %s: %s", f->tmp_path, f->path,
                    strerror(e));
        goto fail;
    }
    if ((rc = zs_fsync_dir(f->dir)) < 0) goto fail;
    if (rename(f->man_tmp_path, f->man_path) != 0) {
        int e = errno;
        rc = zs_err(zs_errno_code(e), "%s: cannot rename to %s: %s", f->man_tmp_path, f->man_path,
                    strerror(e));
        goto fail;
    }
    if ((rc = zs_fsync_dir(f->dir)) < 0) goto fail;
    f->state = SF_READABLE;
    return 0;
fail:
    f->state = SF_FAILED;
    return rc;
}

void zs_shard_file_close(zs_shard_file *f) {
    if (!f) return;
    if (f->state == SF_WRITING || f->state == SF_FAILED) {
        if (f->fd >= 0) {
            close(f->fd);
            f->fd = -1;
        }
        unlink(f->tmp_path);
        unlink(f->man_tmp_path);
    }
    sf_free(f);
}

const char *zs_shard_file_path(const zs_shard_file *f) {
    if (!f) return NULL;
    return f->state == SF_READABLE ? f->path : f->tmp_path;
}

int zs_shard_file_count(const zs_shard_file *f) { return f ? f->n : 0; }

size_t zs_shard_file_bytes(const zs_shard_file *f, int shard) {
    return f && shard >= 0 && shard < f->n ? f->bytes[shard] : 0;
}

size_t zs_shard_file_offset(const zs_shard_file *f, int shard) {
    return f && shard >= 0 && shard < f->n ? f->offs[shard] : 0;
}

size_t zs_shard_file_total_bytes(const zs_shard_file *f) { return f ? f->total : 0; }

uint64_t zs_shard_file_checksum(const zs_shard_file *f, int shard) {
    return f && shard >= 0 && shard < f->n ? f->sums[shard] : 0;
}

int zs_shard_file_is_readable(const zs_shard_file *f) { return f && f->state == SF_READABLE; }

int zs_shard_file_set_label(zs_shard_file *f, int shard, const char *label) {
    if (!f) return zs_err(ZS_EINVAL, "zs_shard_file_set_label: NULL file");
    if (shard < 0 || shard >= f->n)
        return zs_err(ZS_ERANGE, "%s: label for shard %d out of range (0..%d)", f->path, shard,
                      f->n - 1);
    char *copy = NULL;
    if (label) {
        json_t *probe = json_string(label);
        if (!probe) return zs_err(ZS_EINVAL, "%s: shard %d: label is not valid UTF-8", f->path,
                                  shard);
        json_decref(probe);
        copy = strdup(label);
        if (!copy) return zs_err(ZS_ENOMEM, "out of memory");
    }
    free(f->labels[shard]);
    f->labels[shard] = copy;
    return 0;
}

const char *zs_shard_file_label(const zs_shard_file *f, int shard) {
    return f && shard >= 0 && shard < f->n ? f->labels[shard] : NULL;
}
