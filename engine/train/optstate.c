/* optstate.c — one rank's optimizer state (fp32 master, AdamW m and v) in host memory (device
 * "cpu") or in a scratch file on NVMe (device "nvme") streamed through a few pinned staging
 * buffers with O_DIRECT io_uring during the optimizer step: reads run ahead of the update,
 * writes follow it. Layout and guarantees: optstate.h.
 *
 * nvme details: the file is opened twice, buffered (fallback, rare unaligned remainders after a
 * short transfer) and O_DIRECT (everything else, so there is no page-cache coherence question).
 * Without O_DIRECT (at open, or EINVAL at the first transfer) or without io_uring, the same
 * layout is moved with pread/pwrite (logged once). The environment knobs of the NVMe tier apply
 * here too: ZS_STORE_NO_DIRECT=1 (no O_DIRECT) and ZS_STORE_PREAD=1 (no io_uring) force the
 * pread/pwrite path. One step request covers one sub-group's three regions (contiguous in the
 * file and in its staging buffer) and is cut into chunks of at most OS_CHUNK bytes; at most
 * queue_depth chunks are in flight. Short transfers are resubmitted, -EAGAIN / -EINTR retried. */
#define _GNU_SOURCE
#include "optstate.h"

#include "common.h"
#include "dsconfig.h"
#include "pinned.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#define OS_ALIGN ((size_t)4096)
#define OS_CHUNK ((size_t)1 << 20) /* bytes per io_uring request */
#define OS_SPAN ((size_t)4 << 20)  /* read / write: bounce buffer for runs of small sub-groups */
#define OS_DEFAULT_SUB_GROUP ((size_t)1000000000)
#define OS_DEFAULT_BUFFERS 4
#define OS_MAX_BUFFERS 1024
#define OS_DEFAULT_QD 32
#define OS_MAX_QD 4096
#define OS_MAX_RETRIES 10000

static atomic_int g_logged_nodirect, g_logged_nouring, g_logged_noreg, g_logged_nolock,
    g_logged_directio;
static int log_once(atomic_int *flag) { return atomic_exchange(flag, 1) == 0; }

static int env_on(const char *name) {
    const char *e = getenv(name);
    return e && *e && strcmp(e, "0") != 0;
}

enum { BUF_FREE = 0, BUF_READ, BUF_READY, BUF_WRITE };

typedef struct { /* one staging buffer and the sub-group transfer it holds */
    int state;
    uint64_t g; /* index of the sub-group in this step's visiting order */
    int b, last;
    size_t off, n;   /* elements of bucket b */
    size_t foff;     /* file offset of the sub-group */
    size_t len;      /* bytes of its three regions */
    size_t next;     /* next byte to issue */
    int outstanding; /* chunks in flight */
    int failed;
    uint64_t seq; /* issue order among transfers */
} os_buf;

typedef struct { /* one chunk in flight */
    int active;
    int buf;
    size_t boff, len, done; /* chunk [boff, boff + len) of the transfer; done bytes of it */
    int retries;
    int buffered; /* an unaligned remainder after a short transfer: buffered fd */
} os_req;

struct zs_optstate {
    int device; /* ZS_OFFLOAD_CPU or ZS_OFFLOAD_NVME */
    int nb;
    size_t *elems;
    size_t sg;
    /* cpu */
    float **arr[3]; /* arr[r][b], r: master, m, v */
    /* nvme */
    char *path;
    size_t *boff; /* file offset of each bucket's first sub-group */
    size_t file_bytes;
    int fd, fd_dir; /* buffered / O_DIRECT (-1: none) */
    int uring, fixed, direct_broken, broken;
    struct io_uring ring;
    int qd;
    zs_pinned *pool;
    int nbuf;
    size_t slot; /* bytes of one staging buffer: 3 regions of the largest sub-group */
    os_buf *bufs;
    os_req *reqs;
    int reqs_active, sq_pending;
    uint64_t seq;
    int err; /* first error of the running step */
    char errmsg[1024];
    zs_optstate_stats st;
};

/* ---------------------------------------------------------------- layout ---- */

static size_t region_bytes(size_t n) { return ZS_ALIGN_UP(n * sizeof(float), OS_ALIGN); }

/* Sub-group k of bucket b: its first element, element count and file offset. */
static void sg_info(const zs_optstate *s, int b, size_t k, size_t *off, size_t *n, size_t *foff) {
    *off = k * s->sg;
    *n = ZS_MIN(s->sg, s->elems[b] - *off);
    if (foff) *foff = s->boff ? s->boff[b] + (k ? k * 3 * region_bytes(s->sg) : 0) : 0;
}

typedef struct {
    int b;
    size_t k;
} sg_it;

static void it_norm(const zs_optstate *s, const unsigned char *skip, sg_it *it) {
    while (it->b < s->nb &&
           (s->elems[it->b] == 0 || (skip && skip[it->b]) || it->k * s->sg >= s->elems[it->b])) {
        it->b++;
        it->k = 0;
    }
}

static sg_it it_first(const zs_optstate *s, const unsigned char *skip) {
    sg_it it = {0, 0};
    it_norm(s, skip, &it);
    return it;
}

static void it_next(const zs_optstate *s, const unsigned char *skip, sg_it *it) {
    it->k++;
    it_norm(s, skip, it);
}

/* ---------------------------------------------------------------- synchronous I/O ---- */

static int io_fd(const zs_optstate *s) {
    return s->fd_dir >= 0 && !s->direct_broken ? s->fd_dir : s->fd;
}

/* O_DIRECT refused at the first transfer: everything goes through the buffered fd from now on. */
static void switch_buffered(zs_optstate *s) {
    if (s->direct_broken) return;
    s->direct_broken = 1;
    if (log_once(&g_logged_directio))
        zs_log_info("%s: O_DIRECT transfer refused (EINVAL); using buffered I/O", s->path);
}

/* Moves len bytes between mem and the file at foff with pread / pwrite, whole. */
static int io_full(zs_optstate *s, int wr, size_t foff, size_t len, void *mem) {
    size_t done = 0;
    int retries = 0;
    while (done < len) {
        int fd = io_fd(s);
        char *p = (char *)mem + done;
        size_t o = foff + done, l = len - done;
        if (fd == s->fd_dir && (done % OS_ALIGN || (uintptr_t)p % OS_ALIGN || o % OS_ALIGN))
            fd = s->fd; /* unaligned remainder after a short transfer */
        ssize_t r = wr ? pwrite(fd, p, l, (off_t)o) : pread(fd, p, l, (off_t)o);
        if (r < 0) {
            int e = errno;
            if ((e == EINTR || e == EAGAIN) && ++retries < OS_MAX_RETRIES) continue;
            if (e == EINVAL && fd == s->fd_dir && !s->direct_broken) {
                switch_buffered(s);
                continue;
            }
            return zs_err(e == ENOSPC || e == EDQUOT ? ZS_ENOSPC : ZS_EIO,
                          "%s: %s of %zu bytes failed at offset %zu: %s", s->path,
                          wr ? "write" : "read", l, o, strerror(e));
        }
        if (r == 0)
            return zs_err(ZS_EIO, "%s: %s at offset %zu", s->path,
                          wr ? "write made no progress" : "unexpected end of file (truncated?)", o);
        done += (size_t)r;
        if (wr)
            s->st.bytes_written += (uint64_t)r;
        else
            s->st.bytes_read += (uint64_t)r;
    }
    return 0;
}

/* Any range of the file, through staging buffer 0 when O_DIRECT is in use (aligned
 * read-modify-write of partial pages), straight from / into mem otherwise. */
static int io_range(zs_optstate *s, int wr, size_t foff, size_t len, void *mem) {
    if (len == 0) return 0;
    if (s->fd_dir < 0 || s->direct_broken) return io_full(s, wr, foff, len, mem);
    char *bounce = zs_pinned_slot(s->pool, 0);
    ZS_ASSERT(bounce && s->slot >= OS_ALIGN);
    size_t pos = foff, end = foff + len;
    while (pos < end) {
        size_t a0 = pos / OS_ALIGN * OS_ALIGN;
        size_t a1 = ZS_MIN(ZS_ALIGN_UP(end, OS_ALIGN), a0 + s->slot);
        size_t p1 = ZS_MIN(end, a1);
        char *m = (char *)mem + (pos - foff);
        if (!wr || pos > a0 || p1 < a1) ZS_CHECK(io_full(s, 0, a0, a1 - a0, bounce));
        if (wr) {
            memcpy(bounce + (pos - a0), m, p1 - pos);
            ZS_CHECK(io_full(s, 1, a0, a1 - a0, bounce));
        } else {
            memcpy(m, bounce + (pos - a0), p1 - pos);
        }
        pos = p1;
        if (s->fd_dir < 0 || s->direct_broken) /* switched mid-way: the rest buffered */
            return io_full(s, wr, pos, end - pos, (char *)mem + (pos - foff));
    }
    return 0;
}

/* ---------------------------------------------------------------- open / close ---- */

void zs_optstate_close(zs_optstate *s) {
    if (!s) return;
    if (s->uring) {
        if (s->fixed) io_uring_unregister_buffers(&s->ring);
        io_uring_queue_exit(&s->ring); /* also waits for anything left in flight */
    }
    zs_pinned_free(s->pool);
    if (s->fd_dir >= 0) close(s->fd_dir);
    if (s->fd >= 0) close(s->fd);
    if (s->path && s->fd >= 0 && unlink(s->path) != 0)
        zs_log_warn("%s: cannot remove the optimizer state file: %s", s->path, strerror(errno));
    for (int r = 0; r < 3; r++) {
        if (s->arr[r])
            for (int b = 0; b < s->nb; b++)
                free(s->arr[r][b]);
        free(s->arr[r]);
    }
    free(s->bufs);
    free(s->reqs);
    free(s->boff);
    free(s->elems);
    free(s->path);
    free(s);
}

static int open_cpu(zs_optstate *s) {
    for (int r = 0; r < 3; r++) {
        s->arr[r] = calloc((size_t)s->nb, sizeof *s->arr[r]);
        if (!s->arr[r]) return zs_err(ZS_ENOMEM, "optimizer state: out of memory");
    }
    size_t total = 0;
    for (int b = 0; b < s->nb; b++) {
        size_t bytes;
        if (zs_mul_size(s->elems[b], sizeof(float), &bytes) < 0 ||
            zs_add_size(total, bytes, &total) < 0)
            return zs_err(ZS_ERANGE, "optimizer state: bucket %d of %zu elements too large", b,
                          s->elems[b]);
        if (bytes == 0) continue;
        for (int r = 0; r < 3; r++) {
            s->arr[r][b] = zs_aligned_alloc(64, bytes);
            if (!s->arr[r][b])
                return zs_err(ZS_ENOMEM, "optimizer state: cannot allocate %zu bytes for bucket %d",
                              bytes, b);
            memset(s->arr[r][b], 0, bytes);
        }
    }
    s->st.host_bytes = total * 3;
    return 0;
}

/* Sets up the staging buffers: mlock, io_uring ring, fixed-buffer registration. */
static int open_staging(zs_optstate *s, const zs_optstate_opts *o) {
    if (s->slot == 0) return 0; /* no element at all: nothing to stage */
    ZS_CHECK(zs_pinned_init(s->slot, s->nbuf, &s->pool));
    s->st.host_bytes = s->slot * (size_t)s->nbuf;
    if (o->pin_memory && mlock(zs_pinned_slot(s->pool, 0), s->st.host_bytes) != 0 &&
        log_once(&g_logged_nolock))
        zs_log_warn("optimizer state: cannot lock %zu bytes of staging buffers in memory (%s); "
                    "continuing unpinned",
                    s->st.host_bytes, strerror(errno));
    s->bufs = calloc((size_t)s->nbuf, sizeof *s->bufs);
    if (!s->bufs) return zs_err(ZS_ENOMEM, "optimizer state: out of memory");
    if (s->fd_dir < 0) return 0;
    if (env_on("ZS_STORE_PREAD")) {
        if (log_once(&g_logged_nouring))
            zs_log_info("optimizer state: pread/pwrite forced (ZS_STORE_PREAD)");
        return 0;
    }
    int rc = io_uring_queue_init((unsigned)s->qd, &s->ring, 0);
    if (rc != 0) {
        if (log_once(&g_logged_nouring))
            zs_log_info("optimizer state: io_uring setup failed (%s); using pread/pwrite",
                        strerror(-rc));
        return 0;
    }
    s->uring = 1;
    s->reqs = calloc((size_t)s->qd, sizeof *s->reqs);
    struct iovec *iov = calloc((size_t)s->nbuf, sizeof *iov);
    if (!s->reqs || !iov) {
        free(iov);
        return zs_err(ZS_ENOMEM, "optimizer state: out of memory");
    }
    for (int i = 0; i < s->nbuf; i++) {
        iov[i].iov_base = zs_pinned_slot(s->pool, i);
        iov[i].iov_len = s->slot;
    }
    rc = io_uring_register_buffers(&s->ring, iov, (unsigned)s->nbuf);
    free(iov);
    if (rc == 0)
        s->fixed = 1;
    else if (log_once(&g_logged_noreg))
        zs_log_info("optimizer state: io_uring buffer registration failed (%s); plain reads/writes",
                    strerror(-rc));
    return 0;
}

static int open_nvme(zs_optstate *s, const zs_optstate_opts *o) {
    if (!o->dir || !*o->dir)
        return zs_err(
            ZS_EINVAL,
            "optimizer state: device nvme needs a directory (offload_optimizer.nvme_path)");
    struct stat st;
    if (stat(o->dir, &st) != 0) {
        int e = errno;
        return zs_err(e == ENOENT ? ZS_ENOTFOUND : ZS_EIO, "%s: optimizer state directory: %s",
                      o->dir, e == ENOENT ? "does not exist" : strerror(e));
    }
    if (!S_ISDIR(st.st_mode))
        return zs_err(ZS_EINVAL, "%s: optimizer state directory is not a directory", o->dir);
    size_t plen = strlen(o->dir) + 64;
    s->path = malloc(plen);
    s->boff = calloc((size_t)s->nb, sizeof *s->boff);
    if (!s->path || !s->boff) return zs_err(ZS_ENOMEM, "optimizer state: out of memory");
    snprintf(s->path, plen, "%s/zs-optimizer-rank%d.bin", o->dir, o->rank);

    /* layout: bucket by bucket, sub-group by sub-group, master / m / v regions */
    size_t total = 0, maxsg = 0;
    for (int b = 0; b < s->nb; b++) {
        size_t e = s->elems[b], bytes;
        if (e > (SIZE_MAX / 16) / sizeof(float))
            return zs_err(ZS_ERANGE, "%s: bucket %d of %zu elements too large", s->path, b, e);
        s->boff[b] = total;
        size_t full = e / s->sg, rest = e % s->sg;
        if (zs_mul_size(full, 3 * region_bytes(ZS_MIN(s->sg, e)), &bytes) < 0 ||
            zs_add_size(total, bytes, &total) < 0 ||
            zs_add_size(total, 3 * region_bytes(rest), &total) < 0)
            return zs_err(ZS_ERANGE, "%s: optimizer state of bucket %d overflows", s->path, b);
        maxsg = ZS_MAX(maxsg, ZS_MIN(s->sg, e));
    }
    s->file_bytes = total;
    s->st.file_bytes = total;
    s->slot = 3 * region_bytes(maxsg);

    s->fd = open(s->path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (s->fd < 0) {
        int e = errno;
        return zs_err(e == EACCES || e == EPERM || e == EROFS ? ZS_EPERM
                      : e == ENOSPC                           ? ZS_ENOSPC
                                                              : ZS_EIO,
                      "%s: cannot create the optimizer state file: %s", s->path, strerror(e));
    }
    if (total > 0) {
        int e = fallocate(s->fd, 0, 0, (off_t)total) == 0 ? 0 : errno;
        if (e == EOPNOTSUPP || e == ENOSYS || e == EINVAL)
            e = ftruncate(s->fd, (off_t)total) == 0 ? 0 : errno;
        if (e)
            return zs_err(e == ENOSPC || e == EDQUOT ? ZS_ENOSPC : ZS_EIO,
                          "%s: cannot size the optimizer state file to %zu bytes: %s", s->path,
                          total, strerror(e));
    }
    if (env_on("ZS_STORE_NO_DIRECT")) {
        if (log_once(&g_logged_nodirect))
            zs_log_info("%s: O_DIRECT disabled (ZS_STORE_NO_DIRECT); using pread/pwrite", s->path);
    } else {
        s->fd_dir = open(s->path, O_RDWR | O_CLOEXEC | O_DIRECT);
        if (s->fd_dir < 0) {
            int e = errno;
            if (e != EINVAL)
                return zs_err(ZS_EIO, "%s: cannot reopen with O_DIRECT: %s", s->path, strerror(e));
            if (log_once(&g_logged_nodirect))
                zs_log_info("%s: filesystem refuses O_DIRECT; using pread/pwrite", s->path);
        }
    }
    ZS_CHECK(open_staging(s, o));
    if (!s->uring && s->fd_dir >= 0) { /* no io_uring: the pread/pwrite path, buffered */
        close(s->fd_dir);
        s->fd_dir = -1;
    }
    s->st.direct = s->uring;
    return 0;
}

int zs_optstate_open(const zs_optstate_opts *o, int n_buckets, const size_t *elems,
                     zs_optstate **out) {
    if (!o || !out || (n_buckets > 0 && !elems))
        return zs_err(ZS_EINVAL, "zs_optstate_open: NULL argument");
    *out = NULL;
    if (n_buckets < 1)
        return zs_err(ZS_EINVAL, "optimizer state: need at least one bucket (got %d)", n_buckets);
    int dev = o->device == ZS_OFFLOAD_NONE ? ZS_OFFLOAD_CPU : o->device;
    if (dev != ZS_OFFLOAD_CPU && dev != ZS_OFFLOAD_NVME)
        return zs_err(ZS_EINVAL, "optimizer state: unknown device %d (cpu or nvme)", o->device);
    if (o->buffer_count < 0 || o->buffer_count > OS_MAX_BUFFERS)
        return zs_err(ZS_EINVAL, "optimizer state: buffer_count %d out of range (1..%d)",
                      o->buffer_count, OS_MAX_BUFFERS);
    if (o->queue_depth < 0 || o->queue_depth > OS_MAX_QD)
        return zs_err(ZS_EINVAL, "optimizer state: queue depth %d out of range (1..%d)",
                      o->queue_depth, OS_MAX_QD);
    if (o->rank < 0) return zs_err(ZS_EINVAL, "optimizer state: negative rank %d", o->rank);
    zs_optstate *s = calloc(1, sizeof *s);
    if (!s) return zs_err(ZS_ENOMEM, "optimizer state: out of memory");
    s->device = dev;
    s->nb = n_buckets;
    s->sg = o->sub_group ? o->sub_group : OS_DEFAULT_SUB_GROUP;
    s->nbuf = o->buffer_count ? o->buffer_count : OS_DEFAULT_BUFFERS;
    s->qd = o->queue_depth ? o->queue_depth : OS_DEFAULT_QD;
    s->fd = s->fd_dir = -1;
    s->elems = malloc((size_t)n_buckets * sizeof *s->elems);
    if (!s->elems) {
        free(s);
        return zs_err(ZS_ENOMEM, "optimizer state: out of memory");
    }
    memcpy(s->elems, elems, (size_t)n_buckets * sizeof *s->elems);
    int rc = dev == ZS_OFFLOAD_CPU ? open_cpu(s) : open_nvme(s, o);
    if (rc < 0) {
        zs_optstate_close(s);
        return rc;
    }
    *out = s;
    return 0;
}

/* ---------------------------------------------------------------- random access ---- */

int zs_optstate_arrays(zs_optstate *s, int b, float **master, float **m, float **v) {
    if (!s) return zs_err(ZS_EINVAL, "zs_optstate_arrays: NULL state");
    if (s->device != ZS_OFFLOAD_CPU)
        return zs_err(ZS_EUNSUPPORTED,
                      "optimizer state on nvme has no arrays in memory (use read / write)");
    if (b < 0 || b >= s->nb)
        return zs_err(ZS_ERANGE, "optimizer state: bucket %d out of range (0..%d)", b, s->nb - 1);
    if (master) *master = s->arr[0][b];
    if (m) *m = s->arr[1][b];
    if (v) *v = s->arr[2][b];
    return 0;
}

/* Copies between the caller's arrays (element off of bucket b at a[r][0]) and the consecutive
 * whole sub-groups k, k+1, ... that fit in OS_SPAN bytes, from *cur up to at most end: one
 * aligned O_DIRECT read of their regions (and one write back for wr) through a bounce buffer
 * (*bounce, allocated on first use, freed by the caller). Advances *cur. */
static int span_access(zs_optstate *s, int wr, int b, size_t k, size_t off, size_t end,
                       float *const a[3], char **bounce, size_t *cur) {
    size_t so, sn, sf, k1 = k;
    sg_info(s, b, k, &so, &sn, &sf);
    size_t span = 3 * region_bytes(sn), last_end = so + sn;
    while (last_end < end) { /* extend by whole sub-groups while they fit */
        size_t o2, n2, f2;
        sg_info(s, b, k1 + 1, &o2, &n2, &f2);
        if (f2 + 3 * region_bytes(n2) - sf > OS_SPAN) break;
        k1++;
        span = f2 + 3 * region_bytes(n2) - sf;
        last_end = o2 + n2;
    }
    if (!*bounce && !(*bounce = zs_aligned_alloc(OS_ALIGN, OS_SPAN)))
        return zs_err(ZS_ENOMEM, "optimizer state: cannot allocate a %zu-byte bounce buffer",
                      OS_SPAN);
    int rc = io_full(s, 0, sf, span, *bounce);
    for (size_t kk = k; rc == 0 && kk <= k1; kk++) {
        size_t o2, n2, f2;
        sg_info(s, b, kk, &o2, &n2, &f2);
        size_t lo = ZS_MAX(o2, *cur), hi = ZS_MIN(o2 + n2, end);
        for (int r = 0; r < 3 && lo < hi; r++) {
            if (!a[r]) continue;
            char *fp =
                *bounce + (f2 - sf) + (size_t)r * region_bytes(n2) + (lo - o2) * sizeof(float);
            if (wr)
                memcpy(fp, a[r] + (lo - off), (hi - lo) * sizeof(float));
            else
                memcpy(a[r] + (lo - off), fp, (hi - lo) * sizeof(float));
        }
    }
    if (rc == 0 && wr) rc = io_full(s, 1, sf, span, *bounce);
    if (rc < 0)
        return zs_err_prefix(rc, "optimizer state bucket %d elements [%zu, %zu)", b, *cur,
                             ZS_MIN(last_end, end));
    *cur = ZS_MIN(last_end, end);
    return 0;
}

/* Copies [off, off + n) of bucket b between the state and the caller's arrays. */
static int os_access(zs_optstate *s, int wr, int b, size_t off, size_t n, float *const a[3]) {
    if (!s) return zs_err(ZS_EINVAL, "zs_optstate_%s: NULL state", wr ? "write" : "read");
    if (b < 0 || b >= s->nb)
        return zs_err(ZS_ERANGE, "optimizer state: bucket %d out of range (0..%d)", b, s->nb - 1);
    if (off > s->elems[b] || n > s->elems[b] - off)
        return zs_err(ZS_ERANGE,
                      "optimizer state: elements [%zu, %zu + %zu) exceed bucket %d of %zu", off,
                      off, n, b, s->elems[b]);
    if (n == 0) return 0;
    if (s->device == ZS_OFFLOAD_CPU) {
        for (int r = 0; r < 3; r++) {
            if (!a[r]) continue;
            if (wr)
                memcpy(s->arr[r][b] + off, a[r], n * sizeof(float));
            else
                memcpy(a[r], s->arr[r][b] + off, n * sizeof(float));
        }
        return 0;
    }
    if (s->broken)
        return zs_err(ZS_EIO, "%s: optimizer state unusable after a failed I/O", s->path);
    size_t cur = off, end = off + n;
    char *bounce = NULL;
    while (cur < end) {
        size_t k = cur / s->sg, so, sn, sf;
        sg_info(s, b, k, &so, &sn, &sf);
        if (s->fd_dir >= 0 && !s->direct_broken && 3 * region_bytes(sn) <= OS_SPAN) {
            /* O_DIRECT and small sub-groups: whole sub-groups at once through one bounce */
            int rc = span_access(s, wr, b, k, off, end, a, &bounce, &cur);
            if (rc < 0) {
                free(bounce);
                return rc;
            }
            continue;
        }
        size_t cnt = ZS_MIN(end, so + sn) - cur;
        for (int r = 0; r < 3; r++) {
            if (!a[r]) continue;
            size_t fo = sf + (size_t)r * region_bytes(sn) + (cur - so) * sizeof(float);
            int rc = io_range(s, wr, fo, cnt * sizeof(float), a[r] + (cur - off));
            if (rc < 0) {
                free(bounce);
                return zs_err_prefix(rc, "optimizer state bucket %d elements [%zu, %zu)", b, cur,
                                     cur + cnt);
            }
        }
        cur += cnt;
    }
    free(bounce);
    return 0;
}

int zs_optstate_read(zs_optstate *s, int b, size_t off, size_t n, float *master, float *m,
                     float *v) {
    float *a[3] = {master, m, v};
    return os_access(s, 0, b, off, n, a);
}

int zs_optstate_write(zs_optstate *s, int b, size_t off, size_t n, const float *master,
                      const float *m, const float *v) {
    float *a[3] = {(float *)master, (float *)m, (float *)v}; /* only read from */
    return os_access(s, 1, b, off, n, a);
}

/* ---------------------------------------------------------------- io_uring pipeline ---- */

static void step_fail(zs_optstate *s, os_buf *op, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void step_fail(zs_optstate *s, os_buf *op, int code, const char *fmt, ...) {
    op->failed = 1;
    if (s->err) return; /* keep the first error */
    s->err = code;
    int k = snprintf(s->errmsg, sizeof s->errmsg,
                     "%s: sub-group %llu of the step (bucket %d, elements [%zu, %zu)): ", s->path,
                     (unsigned long long)op->g, op->b, op->off, op->off + op->n);
    if (k < 0 || (size_t)k >= sizeof s->errmsg) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->errmsg + k, sizeof s->errmsg - (size_t)k, fmt, ap);
    va_end(ap);
}

static void req_prep(zs_optstate *s, int ri) {
    os_req *q = &s->reqs[ri];
    os_buf *op = &s->bufs[q->buf];
    struct io_uring_sqe *sqe = io_uring_get_sqe(&s->ring);
    ZS_ASSERT(sqe); /* at most qd requests exist and the SQ has qd entries */
    char *addr = (char *)zs_pinned_slot(s->pool, q->buf) + q->boff + q->done;
    unsigned len = (unsigned)(q->len - q->done);
    uint64_t off = op->foff + q->boff + q->done;
    int fd = q->buffered ? s->fd : io_fd(s);
    if (op->state == BUF_WRITE) {
        if (s->fixed)
            io_uring_prep_write_fixed(sqe, fd, addr, len, off, q->buf);
        else
            io_uring_prep_write(sqe, fd, addr, len, off);
    } else {
        if (s->fixed)
            io_uring_prep_read_fixed(sqe, fd, addr, len, off, q->buf);
        else
            io_uring_prep_read(sqe, fd, addr, len, off);
    }
    io_uring_sqe_set_data64(sqe, (uint64_t)ri);
    s->sq_pending++;
}

/* Fills free request slots with chunks of the earliest issued transfers. After an error only
 * writes already started go on (reads are abandoned). */
static void pump(zs_optstate *s) {
    while (s->reqs_active < s->qd) {
        os_buf *best = NULL;
        for (int i = 0; i < s->nbuf; i++) {
            os_buf *op = &s->bufs[i];
            if (((op->state == BUF_READ && !s->err) || op->state == BUF_WRITE) && !op->failed &&
                op->next < op->len && (!best || op->seq < best->seq))
                best = op;
        }
        if (!best) return;
        int ri = 0;
        while (s->reqs[ri].active)
            ri++;
        os_req *q = &s->reqs[ri];
        memset(q, 0, sizeof *q);
        q->active = 1;
        q->buf = (int)(best - s->bufs);
        q->boff = best->next;
        q->len = ZS_MIN(OS_CHUNK, best->len - best->next);
        best->next += q->len;
        best->outstanding++;
        s->reqs_active++;
        req_prep(s, ri);
    }
}

/* Pushes prepared SQEs to the kernel; transient refusals leave them queued. */
static int ring_push(zs_optstate *s) {
    for (;;) {
        int rc = io_uring_submit(&s->ring);
        if (rc >= 0) {
            s->sq_pending -= ZS_MIN(rc, s->sq_pending);
            return 0;
        }
        if (rc == -EINTR) continue;
        if (rc == -EAGAIN || rc == -EBUSY) return 0;
        return zs_err(ZS_EIO, "%s: io_uring submit failed: %s", s->path, strerror(-rc));
    }
}

/* A transfer with nothing in flight is finished (read: ready; write: buffer free) or, after
 * its own failure or an abandoned read, free. */
static void op_check(zs_optstate *s, os_buf *op) {
    if (op->outstanding > 0 || op->state == BUF_FREE || op->state == BUF_READY) return;
    if (op->failed || (op->state == BUF_READ && s->err && op->next < op->len))
        op->state = BUF_FREE;
    else if (op->next == op->len)
        op->state = op->state == BUF_READ ? BUF_READY : BUF_FREE;
}

static void handle_cqe(zs_optstate *s, int ri, int res) {
    ZS_ASSERT(ri >= 0 && ri < s->qd && s->reqs[ri].active);
    os_req *q = &s->reqs[ri];
    os_buf *op = &s->bufs[q->buf];
    int wr = op->state == BUF_WRITE;
    size_t foff = op->foff + q->boff + q->done;
    if ((res == -EAGAIN || res == -EINTR) && ++q->retries < OS_MAX_RETRIES && !op->failed) {
        req_prep(s, ri);
        return;
    }
    if (res == -EINVAL && !q->buffered && !s->direct_broken && !op->failed) {
        switch_buffered(s);
        req_prep(s, ri);
        return;
    }
    if (res < 0) {
        step_fail(s, op, res == -ENOSPC || res == -EDQUOT ? ZS_ENOSPC : ZS_EIO,
                  "%s failed at offset %zu: %s", wr ? "write" : "read", foff, strerror(-res));
    } else if (res == 0) {
        step_fail(s, op, ZS_EIO, "%s at offset %zu",
                  wr ? "write made no progress" : "unexpected end of file (truncated?)", foff);
    } else {
        if (wr)
            s->st.bytes_written += (uint64_t)res;
        else
            s->st.bytes_read += (uint64_t)res;
        q->done += (size_t)res;
        if (q->done < q->len && !op->failed) { /* short transfer: the rest, buffered if unaligned */
            if (!s->direct_broken &&
                ((foff + (size_t)res) % OS_ALIGN || (q->len - q->done) % OS_ALIGN))
                q->buffered = 1;
            req_prep(s, ri);
            return;
        }
    }
    op->outstanding--;
    q->active = 0;
    s->reqs_active--;
    op_check(s, op);
}

/* Blocks for at least one completion (counted in io_wait_s) and handles every one available. */
static int wait_some(zs_optstate *s) {
    ZS_ASSERT(s->reqs_active > 0);
    struct io_uring_cqe *cqe;
    double t0 = zs_now();
    int rc = s->sq_pending > 0 ? io_uring_submit_and_wait(&s->ring, 1)
                               : io_uring_wait_cqe(&s->ring, &cqe);
    s->st.io_wait_s += zs_now() - t0;
    if (s->sq_pending > 0 && rc >= 0) s->sq_pending -= ZS_MIN(rc, s->sq_pending);
    if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY && rc != -ETIME)
        return zs_err(ZS_EIO, "%s: io_uring wait failed: %s", s->path, strerror(-rc));
    while (io_uring_peek_cqe(&s->ring, &cqe) == 0 && cqe) {
        int ri = (int)io_uring_cqe_get_data64(cqe);
        int res = cqe->res;
        io_uring_cqe_seen(&s->ring, cqe);
        handle_cqe(s, ri, res);
    }
    return 0;
}

static void op_start(zs_optstate *s, os_buf *op, int state) {
    op->state = state;
    op->next = 0;
    op->outstanding = 0;
    op->failed = 0;
    op->seq = ++s->seq;
}

static void set_err(zs_optstate *s, int code) {
    if (s->err) return;
    s->err = code;
    snprintf(s->errmsg, sizeof s->errmsg, "%s", zs_errmsg());
}

static int step_uring(zs_optstate *s, const unsigned char *skip, zs_optstate_fn fn, void *ud) {
    for (int i = 0; i < s->nbuf; i++)
        s->bufs[i].state = BUF_FREE;
    s->err = 0;
    int fatal = 0, rc;
    sg_it rd = it_first(s, skip), cu = rd;
    uint64_t g_rd = 0, g_cu = 0;
    while (cu.b < s->nb && !s->err) {
        while (rd.b < s->nb && g_rd < g_cu + (uint64_t)s->nbuf) { /* read ahead */
            os_buf *op = &s->bufs[g_rd % (uint64_t)s->nbuf];
            if (op->state != BUF_FREE) break; /* its write still runs */
            op->g = g_rd;
            op->b = rd.b;
            sg_info(s, rd.b, rd.k, &op->off, &op->n, &op->foff);
            op->last = op->off + op->n == s->elems[rd.b];
            op->len = 3 * region_bytes(op->n);
            op_start(s, op, BUF_READ);
            it_next(s, skip, &rd);
            g_rd++;
        }
        pump(s);
        if ((rc = ring_push(s)) < 0) {
            set_err(s, rc);
            fatal = 1;
            break;
        }
        os_buf *op = &s->bufs[g_cu % (uint64_t)s->nbuf];
        if (op->state == BUF_READY && op->g == g_cu) {
            float *base = zs_pinned_slot(s->pool, (int)(op - s->bufs));
            size_t rf = region_bytes(op->n) / sizeof(float);
            rc = fn(ud, op->b, op->off, op->n, base, base + rf, base + 2 * rf, op->last);
            if (rc < 0) {
                set_err(s, rc);
                op->state = BUF_FREE;
                break;
            }
            op_start(s, op, BUF_WRITE);
            g_cu++;
            it_next(s, skip, &cu);
            continue;
        }
        if (s->err) break;
        if ((rc = wait_some(s)) < 0) {
            set_err(s, rc);
            fatal = 1;
            break;
        }
        if (s->err) break;
    }
    /* drain: every write started completes; abandoned reads are waited for */
    while (!fatal) {
        pump(s); /* nothing active after a pump: nothing left to issue */
        if (s->reqs_active == 0) break;
        if ((rc = ring_push(s)) < 0 || (rc = wait_some(s)) < 0) {
            set_err(s, rc);
            fatal = 1;
        }
    }
    if (fatal) s->broken = 1; /* requests may still be in flight: no further I/O on this state */
    for (int i = 0; i < s->nbuf; i++)
        s->bufs[i].state = BUF_FREE;
    return s->err ? zs_err(s->err, "%s", s->errmsg) : 0;
}

/* pread/pwrite on the buffered fd (O_DIRECT is closed in this mode): one sub-group at a time
 * through staging buffer 0, no overlap. */
static int step_sync(zs_optstate *s, const unsigned char *skip, zs_optstate_fn fn, void *ud) {
    float *base = zs_pinned_slot(s->pool, 0);
    uint64_t g = 0;
    for (sg_it it = it_first(s, skip); it.b < s->nb; it_next(s, skip, &it), g++) {
        size_t off, n, foff;
        sg_info(s, it.b, it.k, &off, &n, &foff);
        size_t rb = region_bytes(n);
        double t0 = zs_now();
        int rc = io_full(s, 0, foff, 3 * rb, base);
        s->st.io_wait_s += zs_now() - t0;
        if (rc < 0)
            return zs_err_prefix(rc, "sub-group %llu of the step (bucket %d, elements [%zu, %zu))",
                                 (unsigned long long)g, it.b, off, off + n);
        rc = fn(ud, it.b, off, n, base, base + rb / sizeof(float), base + 2 * rb / sizeof(float),
                off + n == s->elems[it.b]);
        if (rc < 0) return rc;
        t0 = zs_now();
        rc = io_full(s, 1, foff, 3 * rb, base);
        s->st.io_wait_s += zs_now() - t0;
        if (rc < 0)
            return zs_err_prefix(rc, "sub-group %llu of the step (bucket %d, elements [%zu, %zu))",
                                 (unsigned long long)g, it.b, off, off + n);
    }
    return 0;
}

int zs_optstate_step(zs_optstate *s, const unsigned char *skip, zs_optstate_fn fn, void *ud) {
    if (!s || !fn) return zs_err(ZS_EINVAL, "zs_optstate_step: NULL argument");
    if (s->device == ZS_OFFLOAD_CPU) {
        for (sg_it it = it_first(s, skip); it.b < s->nb; it_next(s, skip, &it)) {
            size_t off, n;
            sg_info(s, it.b, it.k, &off, &n, NULL);
            int rc = fn(ud, it.b, off, n, s->arr[0][it.b] + off, s->arr[1][it.b] + off,
                        s->arr[2][it.b] + off, off + n == s->elems[it.b]);
            if (rc < 0) return rc;
        }
        return 0;
    }
    if (s->broken)
        return zs_err(ZS_EIO, "%s: optimizer state unusable after a failed I/O", s->path);
    if (!s->pool) return 0; /* no elements */
    return s->uring ? step_uring(s, skip, fn, ud) : step_sync(s, skip, fn, ud);
}

void zs_optstate_stats_get(const zs_optstate *s, zs_optstate_stats *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!s) return;
    *out = s->st;
    out->direct = s->uring && !s->direct_broken;
}
