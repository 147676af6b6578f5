/* kvtier.c — KV blocks below the cache's memory: tagged records in host memory or in a file on
 * NVMe (unlinked, or named and kept across restarts), with a free-slot list and a checksum per
 * record (kvtier.h). */
#define _GNU_SOURCE
#include "kvtier.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "store.h"

#define REC_MAGIC 0x31434552564b535aULL  /* "ZSKVREC1" */
#define FILE_MAGIC 0x31524954564b535aULL /* "ZSKVTIR1" */
#define REC_HDR 64                       /* a record's header bytes on NVMe */

/* a record's header on NVMe; hsum covers the fields before it */
typedef struct {
    uint64_t magic, tag, sum, bytes, hsum;
} rec_hdr;

/* a persistent file's header (its first ZS_STORE_ALIGN bytes); hsum covers the fields before it */
typedef struct {
    uint64_t magic, key, rec_bytes, stride, hsum;
} file_hdr;

struct zs_kvtier {
    int kind;
    size_t rec_bytes, stride; /* nvme: header + payload, rounded up to ZS_STORE_ALIGN */
    off_t base;               /* nvme: where slot 0 starts (after a persistent file's header) */
    char dir[1024];
    int fd;                   /* nvme: the file */
    int direct;               /* fd was opened with O_DIRECT */
    int persistent;
    char *stage;              /* nvme: one aligned record */
    int cap;                  /* slots allocated in the arrays below */
    int n_slots;              /* slots ever used (the file holds them) */
    unsigned char *used;      /* [cap] */
    uint64_t *sum;            /* [cap] each record's XXH64 */
    uint64_t *tag;            /* [cap] each record's tag */
    char **mem;               /* cpu: [cap] each record */
    int *free_slots;          /* [cap] freed slots to reuse */
    int n_free;
    zs_kvtier_stats st;
};

static int check_dir(zs_kvtier *t, const char *dir) {
    struct stat sb;
    if (!dir || !*dir) return zs_err(ZS_EINVAL, "--kv-offload nvme needs --kv-nvme-path DIR");
    if (strlen(dir) >= sizeof t->dir) return zs_err(ZS_EINVAL, "--kv-nvme-path is too long");
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return zs_err(ZS_ENOTFOUND, "--kv-nvme-path %s: not a directory", dir);
    snprintf(t->dir, sizeof t->dir, "%s", dir);
    return 0;
}

static int open_err(const char *dir) {
    if (errno == EACCES || errno == EPERM || errno == EROFS)
        return zs_err(ZS_EPERM, "--kv-nvme-path %s: cannot create a file there (%s)", dir, strerror(errno));
    return zs_err(ZS_EIO, "--kv-nvme-path %s: cannot create a file there (%s)", dir, strerror(errno));
}

/* an unlinked file in dir, O_DIRECT where the filesystem takes it */
static int open_tmp(zs_kvtier *t) {
    for (int direct = 1; direct >= 0; direct--) {
        int fl = O_RDWR | O_CLOEXEC | (direct ? O_DIRECT : 0);
        t->fd = open(t->dir, fl | O_TMPFILE, 0600);
        if (t->fd < 0 && (errno == EOPNOTSUPP || errno == EISDIR || errno == ENOENT)) {
            /* no O_TMPFILE here: a named file, removed at once */
            char path[1100];
            for (int i = 0; i < 100 && t->fd < 0; i++) {
                snprintf(path, sizeof path, "%s/.zs-kv-%d-%d", t->dir, (int)getpid(), i);
                t->fd = open(path, fl | O_CREAT | O_EXCL, 0600);
                if (t->fd >= 0) unlink(path);
                else if (errno != EEXIST) break;
            }
        }
        if (t->fd >= 0) {
            t->direct = direct;
            return 0;
        }
        if (!direct || errno != EINVAL) break; /* EINVAL: the filesystem refuses O_DIRECT */
    }
    return open_err(t->dir);
}

static zs_kvtier *tier_new(int kind, size_t rec_bytes) {
    zs_kvtier *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->kind = kind;
    t->fd = -1;
    t->rec_bytes = rec_bytes;
    t->stride = (REC_HDR + rec_bytes + ZS_STORE_ALIGN - 1) / ZS_STORE_ALIGN * ZS_STORE_ALIGN;
    return t;
}

int zs_kvtier_open(int kind, const char *dir, size_t rec_bytes, zs_kvtier **out) {
    if (kind != ZS_KVTIER_CPU && kind != ZS_KVTIER_NVME)
        return zs_err(ZS_EINVAL, "kv tier: kind %d is not cpu or nvme", kind);
    if (rec_bytes == 0) return zs_err(ZS_EINVAL, "kv tier: empty records");
    zs_kvtier *t = tier_new(kind, rec_bytes);
    if (!t) return zs_err(ZS_ENOMEM, "out of memory");
    if (kind == ZS_KVTIER_NVME) {
        int rc = check_dir(t, dir);
        if (rc == 0) rc = open_tmp(t);
        if (rc == 0 && !(t->stage = zs_aligned_alloc(ZS_STORE_ALIGN, t->stride)))
            rc = zs_err(ZS_ENOMEM, "kv tier: out of memory");
        if (rc < 0) {
            zs_kvtier_free(t);
            return rc;
        }
    }
    *out = t;
    return 0;
}

void zs_kvtier_free(zs_kvtier *t) {
    if (!t) return;
    if (t->fd >= 0) close(t->fd);
    if (t->mem)
        for (int i = 0; i < t->cap; i++) free(t->mem[i]);
    free(t->mem);
    free(t->stage);
    free(t->used);
    free(t->sum);
    free(t->tag);
    free(t->free_slots);
    free(t);
}

int zs_kvtier_kind(const zs_kvtier *t) { return t->kind; }
size_t zs_kvtier_rec_bytes(const zs_kvtier *t) { return t->rec_bytes; }
int zs_kvtier_slots(const zs_kvtier *t) { return t->n_slots; }

int zs_kvtier_tag(const zs_kvtier *t, int slot, uint64_t *tag) {
    if (slot < 0 || slot >= t->n_slots || !t->used[slot]) return 0;
    *tag = t->tag[slot];
    return 1;
}

static int grow(zs_kvtier *t, int want) {
    if (want <= t->cap) return 0;
    int cap = t->cap ? t->cap : 64;
    while (cap < want) cap *= 2;
    unsigned char *u = realloc(t->used, (size_t)cap);
    if (u) t->used = u;
    uint64_t *s = realloc(t->sum, (size_t)cap * sizeof *s);
    if (s) t->sum = s;
    uint64_t *g = realloc(t->tag, (size_t)cap * sizeof *g);
    if (g) t->tag = g;
    int *f = realloc(t->free_slots, (size_t)cap * sizeof *f);
    if (f) t->free_slots = f;
    char **m = t->kind == ZS_KVTIER_CPU ? realloc(t->mem, (size_t)cap * sizeof *m) : NULL;
    if (m) t->mem = m;
    if (!u || !s || !g || !f || (t->kind == ZS_KVTIER_CPU && !m)) return zs_err(ZS_ENOMEM, "kv tier: out of memory");
    memset(t->used + t->cap, 0, (size_t)(cap - t->cap));
    if (m) memset(m + t->cap, 0, (size_t)(cap - t->cap) * sizeof *m);
    t->cap = cap;
    return 0;
}

static size_t iov_total(const struct iovec *iov, int n) {
    size_t b = 0;
    for (int i = 0; i < n; i++) b += iov[i].iov_len;
    return b;
}

/* pwrite/pread of len bytes of stage at off, retrying short transfers */
static int file_io(zs_kvtier *t, off_t off, size_t len, int write) {
    size_t done = 0;
    while (done < len) {
        ssize_t k = write ? pwrite(t->fd, t->stage + done, len - done, off + (off_t)done)
                          : pread(t->fd, t->stage + done, len - done, off + (off_t)done);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == ENOSPC || errno == EFBIG || errno == EDQUOT))
            return zs_err(ZS_ENOSPC, "--kv-nvme-path %s: the disk is full (%s)", t->dir, strerror(errno));
        if (k < 0) return zs_err(ZS_EIO, "--kv-nvme-path %s: %s failed (%s)", t->dir, write ? "write" : "read", strerror(errno));
        if (k == 0) return zs_err(ZS_EIO, "--kv-nvme-path %s: the file ended early", t->dir);
        done += (size_t)k;
    }
    return 0;
}

static off_t slot_off(const zs_kvtier *t, int slot) { return t->base + (off_t)slot * (off_t)t->stride; }

int zs_kvtier_put(zs_kvtier *t, const struct iovec *iov, int n, uint64_t tag, int *slot) {
    if (iov_total(iov, n) != t->rec_bytes)
        return zs_err(ZS_EINVAL, "kv tier: a record of %zu bytes, not %zu", iov_total(iov, n), t->rec_bytes);
    double t0 = zs_now();
    int fresh = t->n_free == 0;
    if (fresh) ZS_CHECK(grow(t, t->n_slots + 1));
    int s = fresh ? t->n_slots : t->free_slots[t->n_free - 1];
    char *dst;
    if (t->kind == ZS_KVTIER_CPU) {
        if (!t->mem[s] && !(t->mem[s] = malloc(t->rec_bytes))) {
            t->st.put_errors++;
            return zs_err(ZS_ENOMEM, "kv tier: out of host memory for KV blocks");
        }
        dst = t->mem[s];
    } else {
        dst = t->stage + REC_HDR;
    }
    size_t o = 0;
    for (int i = 0; i < n; i++) {
        memcpy(dst + o, iov[i].iov_base, iov[i].iov_len);
        o += iov[i].iov_len;
    }
    uint64_t sum = zs_checksum64(dst, t->rec_bytes);
    if (t->kind == ZS_KVTIER_NVME) {
        rec_hdr h = {REC_MAGIC, tag, sum, t->rec_bytes, 0};
        h.hsum = zs_checksum64(&h, offsetof(rec_hdr, hsum));
        memset(t->stage, 0, REC_HDR);
        memcpy(t->stage, &h, sizeof h);
        memset(dst + o, 0, t->stride - REC_HDR - o);
        int rc = file_io(t, slot_off(t, s), t->stride, 1);
        if (rc < 0) {
            t->st.put_errors++;
            return rc;
        }
    }
    t->sum[s] = sum;
    t->tag[s] = tag;
    t->used[s] = 1;
    if (fresh) t->n_slots++;
    else t->n_free--;
    t->st.puts++;
    t->st.bytes_out += t->rec_bytes;
    t->st.slots_used++;
    t->st.put_s += zs_now() - t0;
    *slot = s;
    return 0;
}

int zs_kvtier_get(zs_kvtier *t, int slot, const struct iovec *iov, int n) {
    if (slot < 0 || slot >= t->n_slots || !t->used[slot]) return zs_err(ZS_EINVAL, "kv tier: slot %d is not in use", slot);
    if (iov_total(iov, n) != t->rec_bytes)
        return zs_err(ZS_EINVAL, "kv tier: a record of %zu bytes, not %zu", iov_total(iov, n), t->rec_bytes);
    double t0 = zs_now();
    const char *src = t->kind == ZS_KVTIER_CPU ? t->mem[slot] : t->stage + REC_HDR;
    if (t->kind == ZS_KVTIER_NVME) ZS_CHECK(file_io(t, slot_off(t, slot), t->stride, 0));
    if (zs_checksum64(src, t->rec_bytes) != t->sum[slot])
        return zs_err(ZS_ECHECKSUM, "kv tier%s%s: record %d does not match its checksum", t->dir[0] ? " " : "", t->dir, slot);
    size_t o = 0;
    for (int i = 0; i < n; i++) {
        memcpy(iov[i].iov_base, src + o, iov[i].iov_len);
        o += iov[i].iov_len;
    }
    t->st.gets++;
    t->st.bytes_in += t->rec_bytes;
    t->st.get_s += zs_now() - t0;
    return 0;
}

void zs_kvtier_drop(zs_kvtier *t, int slot) {
    if (slot < 0 || slot >= t->n_slots || !t->used[slot]) return;
    if (t->persistent) { /* cleared on disk too (a failed write only means it may come back) */
        memset(t->stage, 0, ZS_STORE_ALIGN);
        (void)file_io(t, slot_off(t, slot), ZS_STORE_ALIGN, 1);
    }
    t->used[slot] = 0;
    t->free_slots[t->n_free++] = slot;
    t->st.slots_used--;
}

void zs_kvtier_stats_get(const zs_kvtier *t, zs_kvtier_stats *out) { *out = t->st; }

/* ---------- a persistent file ---------- */

/* A fresh file: its header written, no records. */
static int start_over(zs_kvtier *t, uint64_t key) {
    if (ftruncate(t->fd, 0) != 0) return zs_err(ZS_EIO, "%s: cannot truncate (%s)", t->dir, strerror(errno));
    file_hdr h = {FILE_MAGIC, key, t->rec_bytes, t->stride, 0};
    h.hsum = zs_checksum64(&h, offsetof(file_hdr, hsum));
    memset(t->stage, 0, ZS_STORE_ALIGN);
    memcpy(t->stage, &h, sizeof h);
    return file_io(t, 0, ZS_STORE_ALIGN, 1);
}

/* Reads the records back: every slot whose header is whole and of this record size. */
static int restore(zs_kvtier *t, off_t size) {
    int n = (int)((size - t->base) / (off_t)t->stride);
    ZS_CHECK(grow(t, n > 0 ? n : 1));
    for (int s = 0; s < n; s++) {
        ZS_CHECK(file_io(t, slot_off(t, s), ZS_STORE_ALIGN, 0));
        rec_hdr h;
        memcpy(&h, t->stage, sizeof h);
        int ok = h.magic == REC_MAGIC && h.bytes == t->rec_bytes && h.hsum == zs_checksum64(&h, offsetof(rec_hdr, hsum));
        t->used[s] = (unsigned char)ok;
        if (ok) {
            t->sum[s] = h.sum;
            t->tag[s] = h.tag;
            t->st.slots_used++;
            t->st.restored++;
        }
    }
    t->n_slots = n;
    for (int s = n - 1; s >= 0; s--)
        if (!t->used[s]) t->free_slots[t->n_free++] = s;
    return 0;
}

int zs_kvtier_open_persistent(const char *dir, const char *name, size_t rec_bytes, uint64_t key, zs_kvtier **out) {
    if (rec_bytes == 0 || key == 0 || !name || !*name || strchr(name, '/'))
        return zs_err(ZS_EINVAL, "kv tier: a persistent file needs a plain name, records and a key");
    zs_kvtier *t = tier_new(ZS_KVTIER_NVME, rec_bytes);
    if (!t) return zs_err(ZS_ENOMEM, "out of memory");
    t->persistent = 1;
    t->base = ZS_STORE_ALIGN;
    int rc = check_dir(t, dir);
    char path[1400];
    if (rc == 0) {
        snprintf(path, sizeof path, "%s/%s", dir, name);
        for (int direct = 1; direct >= 0 && t->fd < 0; direct--) {
            t->fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | (direct ? O_DIRECT : 0), 0600);
            t->direct = direct && t->fd >= 0;
            if (t->fd < 0 && (!direct || errno != EINVAL)) break;
        }
        if (t->fd < 0) rc = open_err(dir);
        /* one process at a time: another one's records would be overwritten under it */
        if (rc == 0 && flock(t->fd, LOCK_EX | LOCK_NB) != 0)
            rc = errno == EWOULDBLOCK ? zs_err(ZS_EBUSY, "%s: another process uses it", path)
                                      : zs_err(ZS_EIO, "%s: cannot lock it (%s)", path, strerror(errno));
    }
    if (rc == 0 && !(t->stage = zs_aligned_alloc(ZS_STORE_ALIGN, t->stride))) rc = zs_err(ZS_ENOMEM, "kv tier: out of memory");
    struct stat sb;
    if (rc == 0 && fstat(t->fd, &sb) != 0) rc = zs_err(ZS_EIO, "%s: %s", path, strerror(errno));
    if (rc == 0) {
        const char *why = NULL;
        file_hdr h = {0, 0, 0, 0, 0};
        if (sb.st_size == 0) why = "";
        else if (sb.st_size < ZS_STORE_ALIGN || file_io(t, 0, ZS_STORE_ALIGN, 0) < 0) why = "its header is cut short";
        if (!why) {
            memcpy(&h, t->stage, sizeof h);
            if (h.magic != FILE_MAGIC || h.hsum != zs_checksum64(&h, offsetof(file_hdr, hsum))) why = "its header is damaged";
            else if (h.key != key) why = "it holds another model's (or dtype's) KV blocks";
            else if (h.rec_bytes != rec_bytes || h.stride != t->stride) why = "its blocks are of another size";
        }
        if (why) {
            if (*why) zs_log_warn("KV prefix tier %s: starting over: %s", path, why);
            rc = start_over(t, key);
        } else {
            rc = restore(t, sb.st_size);
        }
    }
    if (rc < 0) {
        zs_kvtier_free(t);
        return rc;
    }
    *out = t;
    return 0;
}
