/* kvtier.c — KV blocks below the cache's memory: records in host memory or in an unlinked
 * file on NVMe (kvtier.h), with a free-slot list and a checksum per record. */
#define _GNU_SOURCE
#include "kvtier.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "store.h"

struct zs_kvtier {
    int kind;
    size_t rec_bytes, stride; /* stride: rec_bytes rounded up to ZS_STORE_ALIGN (nvme) */
    char dir[1024];
    int fd;                   /* nvme: the unlinked file */
    int direct;               /* fd was opened with O_DIRECT */
    char *stage;              /* nvme: one aligned record */
    int cap;                  /* slots allocated in the arrays below */
    int n_slots;              /* slots ever used (the file holds n_slots * stride bytes) */
    unsigned char *used;      /* [cap] */
    uint64_t *sum;            /* [cap] each record's XXH64 */
    char **mem;               /* cpu: [cap] each record */
    int *free_slots;          /* [cap] freed slots to reuse */
    int n_free;
    zs_kvtier_stats st;
};

static int open_file(zs_kvtier *t, const char *dir) {
    struct stat sb;
    if (!dir || !*dir) return zs_err(ZS_EINVAL, "--kv-offload nvme needs --kv-nvme-path DIR");
    if (strlen(dir) >= sizeof t->dir) return zs_err(ZS_EINVAL, "--kv-nvme-path is too long");
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return zs_err(ZS_ENOTFOUND, "--kv-nvme-path %s: not a directory", dir);
    snprintf(t->dir, sizeof t->dir, "%s", dir);
    for (int direct = 1; direct >= 0; direct--) {
        int fl = O_RDWR | O_CLOEXEC | (direct ? O_DIRECT : 0);
        t->fd = open(dir, fl | O_TMPFILE, 0600);
        if (t->fd < 0 && (errno == EOPNOTSUPP || errno == EISDIR || errno == ENOENT)) {
            /* no O_TMPFILE here: a named file, removed at once */
            char path[1100];
            for (int i = 0; i < 100 && t->fd < 0; i++) {
                snprintf(path, sizeof path, "%s/.zs-kv-%d-%d", dir, (int)getpid(), i);
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
    if (errno == EACCES || errno == EPERM || errno == EROFS)
        return zs_err(ZS_EPERM, "--kv-nvme-path %s: cannot create a file there (%s)", dir, strerror(errno));
    return zs_err(ZS_EIO, "--kv-nvme-path %s: cannot create a file there (%s)", dir, strerror(errno));
}

int zs_kvtier_open(int kind, const char *dir, size_t rec_bytes, zs_kvtier **out) {
    if (kind != ZS_KVTIER_CPU && kind != ZS_KVTIER_NVME)
        return zs_err(ZS_EINVAL, "kv tier: kind %d is not cpu or nvme", kind);
    if (rec_bytes == 0) return zs_err(ZS_EINVAL, "kv tier: empty records");
    zs_kvtier *t = calloc(1, sizeof *t);
    if (!t) return zs_err(ZS_ENOMEM, "out of memory");
    t->kind = kind;
    t->fd = -1;
    t->rec_bytes = rec_bytes;
    t->stride = (rec_bytes + ZS_STORE_ALIGN - 1) / ZS_STORE_ALIGN * ZS_STORE_ALIGN;
    if (kind == ZS_KVTIER_NVME) {
        int rc = open_file(t, dir);
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
    free(t->free_slots);
    free(t);
}

int zs_kvtier_kind(const zs_kvtier *t) { return t->kind; }
size_t zs_kvtier_rec_bytes(const zs_kvtier *t) { return t->rec_bytes; }

static int grow(zs_kvtier *t) {
    int cap = t->cap ? t->cap * 2 : 64;
    unsigned char *u = realloc(t->used, (size_t)cap);
    if (u) t->used = u;
    uint64_t *s = realloc(t->sum, (size_t)cap * sizeof *s);
    if (s) t->sum = s;
    int *f = realloc(t->free_slots, (size_t)cap * sizeof *f);
    if (f) t->free_slots = f;
    char **m = t->kind == ZS_KVTIER_CPU ? realloc(t->mem, (size_t)cap * sizeof *m) : NULL;
    if (m) t->mem = m;
    if (!u || !s || !f || (t->kind == ZS_KVTIER_CPU && !m)) return zs_err(ZS_ENOMEM, "kv tier: out of memory");
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

/* pwrite/pread of one whole record at slot, retrying short transfers */
static int file_io(zs_kvtier *t, int slot, int write) {
    off_t off = (off_t)slot * (off_t)t->stride;
    size_t done = 0;
    while (done < t->stride) {
        ssize_t k = write ? pwrite(t->fd, t->stage + done, t->stride - done, off + (off_t)done)
                          : pread(t->fd, t->stage + done, t->stride - done, off + (off_t)done);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == ENOSPC || errno == EFBIG || errno == EDQUOT))
            return zs_err(ZS_ENOSPC, "--kv-nvme-path %s: the disk is full (%s)", t->dir, strerror(errno));
        if (k < 0) return zs_err(ZS_EIO, "--kv-nvme-path %s: %s failed (%s)", t->dir, write ? "write" : "read", strerror(errno));
        if (k == 0) return zs_err(ZS_EIO, "--kv-nvme-path %s: the file ended early", t->dir);
        done += (size_t)k;
    }
    return 0;
}

int zs_kvtier_put(zs_kvtier *t, const struct iovec *iov, int n, int *slot) {
    if (iov_total(iov, n) != t->rec_bytes)
        return zs_err(ZS_EINVAL, "kv tier: a record of %zu bytes, not %zu", iov_total(iov, n), t->rec_bytes);
    double t0 = zs_now();
    int s;
    int fresh = t->n_free == 0;
    if (fresh) {
        if (t->n_slots == t->cap) ZS_CHECK(grow(t));
        s = t->n_slots;
    } else {
        s = t->free_slots[t->n_free - 1];
    }
    char *dst;
    if (t->kind == ZS_KVTIER_CPU) {
        if (!t->mem[s] && !(t->mem[s] = malloc(t->rec_bytes))) {
            t->st.put_errors++;
            return zs_err(ZS_ENOMEM, "kv tier: out of host memory for KV blocks");
        }
        dst = t->mem[s];
    } else {
        dst = t->stage;
    }
    size_t o = 0;
    for (int i = 0; i < n; i++) {
        memcpy(dst + o, iov[i].iov_base, iov[i].iov_len);
        o += iov[i].iov_len;
    }
    if (t->kind == ZS_KVTIER_NVME) {
        memset(dst + o, 0, t->stride - o);
        int rc = file_io(t, s, 1);
        if (rc < 0) {
            t->st.put_errors++;
            return rc;
        }
    }
    t->sum[s] = zs_checksum64(dst, t->rec_bytes);
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
    const char *src = t->kind == ZS_KVTIER_CPU ? t->mem[slot] : t->stage;
    if (t->kind == ZS_KVTIER_NVME) ZS_CHECK(file_io(t, slot, 0));
    if (zs_checksum64(src, t->rec_bytes) != t->sum[slot])
        return zs_err(ZS_ECHECKSUM, "kv tier%s%s: block %d does not match its checksum", t->dir[0] ? " " : "", t->dir, slot);
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
    t->used[slot] = 0;
    t->free_slots[t->n_free++] = slot;
    t->st.slots_used--;
}

void zs_kvtier_stats_get(const zs_kvtier *t, zs_kvtier_stats *out) { *out = t->st; }
