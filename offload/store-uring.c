/* store-uring.c — the shard reader of the NVMe tier: io_uring read_fixed requests into
 * registered pinned buffers with O_DIRECT, resubmission of -EAGAIN and short reads, checksum
 * verification, a pread(2) fallback for kernels/containers without io_uring, buffered fallback
 * for filesystems that refuse O_DIRECT, a test fault hook, and the raw bandwidth probe. */
#define _GNU_SOURCE
#include "store.h"

#include "common.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#define RD_DEFAULT_QD 32
#define RD_DEFAULT_BS ((size_t)1 << 20)
#define RD_MAX_BS ((size_t)1 << 30)
#define RD_MAX_RETRIES 10000

/* ---------------------------------------------------------------- process-wide knobs ---- */

static atomic_long g_inject_nth;   /* 0: off */
static atomic_long g_inject_count; /* block reads counted since the last inject call */
static atomic_int g_force_pread = -1; /* -1: not set (read env), 0/1 */

static atomic_int g_logged_nodirect, g_logged_nouring, g_logged_noreg, g_logged_forced,
    g_logged_directread;

static int log_once(atomic_int *flag) { return atomic_exchange(flag, 1) == 0; }

void zs_store_inject_read_error(long nth) {
    atomic_store(&g_inject_count, 0);
    atomic_store(&g_inject_nth, nth > 0 ? nth : 0);
}

void zs_store_force_pread(int on) { atomic_store(&g_force_pread, on ? 1 : 0); }

static int force_pread(void) {
    int v = atomic_load(&g_force_pread);
    if (v >= 0) return v;
    const char *e = getenv("ZS_STORE_PREAD");
    return e && *e && strcmp(e, "0") != 0;
}

/* Counts one block read; returns 1 if this one must fail with -EIO. */
static int inject_hit(void) {
    long nth = atomic_load(&g_inject_nth);
    if (nth <= 0) return 0;
    long c = atomic_fetch_add(&g_inject_count, 1) + 1;
    if (c == nth) {
        atomic_store(&g_inject_nth, 0);
        return 1;
    }
    return 0;
}

/* Opens path read-only, with O_DIRECT when the filesystem accepts it (and the environment
 * variable ZS_STORE_NO_DIRECT is not set to a non-zero value). */
static int open_direct(const char *path, int *fd_out, int *direct) {
    const char *nd = getenv("ZS_STORE_NO_DIRECT");
    int want = !(nd && *nd && strcmp(nd, "0") != 0);
    int fd = want ? open(path, O_RDONLY | O_CLOEXEC | O_DIRECT) : -1;
    if (!want) {
        fd = open(path, O_RDONLY | O_CLOEXEC);
        *direct = 0;
    } else if (fd < 0 && errno == EINVAL) {
        if (log_once(&g_logged_nodirect))
            zs_log_info("%s: filesystem refuses O_DIRECT; using buffered reads", path);
        fd = open(path, O_RDONLY | O_CLOEXEC);
        *direct = 0;
    } else {
        *direct = 1;
    }
    if (fd < 0) {
        int e = errno;
        return zs_err(e == ENOENT ? ZS_ENOTFOUND : e == EACCES || e == EPERM ? ZS_EPERM : ZS_EIO,
                      "%s: cannot open for reading: %s", path, strerror(e));
    }
    *fd_out = fd;
    return 0;
}

/* Sets up a ring; returns 1 with io_uring, 0 for the pread fallback (logged once). */
static int ring_init(struct io_uring *ring, int entries) {
    if (force_pread()) {
        if (log_once(&g_logged_forced)) zs_log_info("store: pread forced (io_uring disabled)");
        return 0;
    }
    int rc = io_uring_queue_init((unsigned)entries, ring, 0);
    if (rc == 0) return 1;
    if (log_once(&g_logged_nouring)) {
        if (rc == -ENOSYS || rc == -EPERM)
            zs_log_warn("io_uring not permitted, using pread");
        else
            zs_log_warn("io_uring setup failed (%s), using pread", strerror(-rc));
    }
    return 0;
}

/* ---------------------------------------------------------------- reader ---- */

typedef struct {
    int active;
    int op;       /* index into ops */
    size_t soff;  /* start of this block within the shard */
    size_t len;   /* block length */
    size_t done;  /* bytes of it already read */
    int inject;   /* fail this block with -EIO (test hook) */
    int buffered; /* an unaligned remainder after a short read: use the buffered fd */
    int retries;
} rd_req;

typedef struct {
    int used;
    int shard, buf;
    uint64_t tag;
    uint64_t seq;      /* submission order */
    size_t next;       /* next shard byte to issue */
    int outstanding;   /* block requests in flight */
    int status;        /* 0 or first error */
    int finished;      /* ready to be returned by poll */
    uint64_t done_seq; /* completion order */
    char msg[768];
} rd_op;

struct zs_shard_reader {
    char *path;
    int n;
    size_t *offs, *bytes;
    uint64_t *sums;
    char **labels;
    size_t total;
    int fd, fd_buffered, direct, direct_broken;
    int use_uring, fixed;
    struct io_uring ring;
    int n_bufs;
    void **bufs;
    size_t *buf_bytes;
    unsigned char *buf_busy;
    int qd;
    size_t bs;
    int verify;
    rd_req *reqs;
    int reqs_active;
    int sq_pending; /* sqes prepared but not yet consumed by the kernel */
    rd_op *ops;
    int ops_cap;
    int inflight; /* ops submitted and not yet returned by poll */
    uint64_t seq, done_seq;
};

static const char *lbl_open(const zs_shard_reader *r, int s) { return r->labels[s] ? " (" : ""; }
static const char *lbl(const zs_shard_reader *r, int s) { return r->labels[s] ? r->labels[s] : ""; }
static const char *lbl_close(const zs_shard_reader *r, int s) { return r->labels[s] ? ")" : ""; }

static void op_fail(zs_shard_reader *r, rd_op *op, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void op_fail(zs_shard_reader *r, rd_op *op, int code, const char *fmt, ...) {
    if (op->status != 0) return; /* keep the first error */
    op->status = code;
    int k = snprintf(op->msg, sizeof op->msg, "%s: shard %d%s%s%s: ", r->path, op->shard,
                     lbl_open(r, op->shard), lbl(r, op->shard), lbl_close(r, op->shard));
    if (k < 0 || (size_t)k >= sizeof op->msg) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(op->msg + k, sizeof op->msg - (size_t)k, fmt, ap);
    va_end(ap);
    op->next = r->bytes[op->shard]; /* issue nothing more for it */
}

/* Marks an op finished if nothing of it is outstanding; verifies the checksum. */
static void op_maybe_finish(zs_shard_reader *r, rd_op *op) {
    if (op->finished || op->outstanding > 0) return;
    if (op->status == 0 && op->next < r->bytes[op->shard]) return;
    if (op->status == 0 && r->verify) {
        uint64_t got = zs_checksum64(r->bufs[op->buf], r->bytes[op->shard]);
        if (got != r->sums[op->shard])
            op_fail(r, op, ZS_ECHECKSUM,
                    "checksum mismatch (manifest %016llx, read %016llx; %zu bytes at offset %zu)",
                    (unsigned long long)r->sums[op->shard], (unsigned long long)got,
                    r->bytes[op->shard], r->offs[op->shard]);
    }
    op->finished = 1;
    op->done_seq = ++r->done_seq;
}

/* Opens the buffered (non-O_DIRECT) descriptor on first use. */
static int ensure_buffered(zs_shard_reader *r) {
    if (r->fd_buffered >= 0) return 0;
    if (!r->direct) {
        r->fd_buffered = dup(r->fd);
    } else {
        r->fd_buffered = open(r->path, O_RDONLY | O_CLOEXEC);
    }
    if (r->fd_buffered < 0) {
        int e = errno;
        return zs_err(ZS_EIO, "%s: cannot reopen without O_DIRECT: %s", r->path, strerror(e));
    }
    return 0;
}

/* The filesystem accepted O_DIRECT at open but refuses the read (EINVAL): switch this reader to
 * buffered reads. Returns 0 or a ZS_E* code. */
static int switch_buffered(zs_shard_reader *r) {
    if (r->direct_broken) return 0;
    int rc = ensure_buffered(r);
    if (rc < 0) return rc;
    if (log_once(&g_logged_directread))
        zs_log_info("%s: O_DIRECT read refused (EINVAL); using buffered reads", r->path);
    r->direct_broken = 1;
    return 0;
}

static int req_fd(zs_shard_reader *r, const rd_req *q) {
    return (r->direct_broken || q->buffered) && r->fd_buffered >= 0 ? r->fd_buffered : r->fd;
}

/* After a short read the rest of a block may be unaligned, which O_DIRECT refuses: read it
 * buffered. Returns 0 or a ZS_E* code. */
static int req_rest_fd(zs_shard_reader *r, rd_req *q, const char *addr, size_t off, size_t len) {
    if (!r->direct || r->direct_broken) return 0;
    if ((uintptr_t)addr % ZS_STORE_ALIGN == 0 && off % ZS_STORE_ALIGN == 0 &&
        len % ZS_STORE_ALIGN == 0)
        return 0;
    int rc = ensure_buffered(r);
    if (rc == 0) q->buffered = 1;
    return rc;
}

static void req_prep(zs_shard_reader *r, int ri) {
    rd_req *q = &r->reqs[ri];
    rd_op *op = &r->ops[q->op];
    struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring);
    ZS_ASSERT(sqe); /* at most qd requests exist and the SQ has qd entries */
    char *addr = (char *)r->bufs[op->buf] + q->soff + q->done;
    unsigned len = (unsigned)(q->len - q->done);
    off_t off = (off_t)(r->offs[op->shard] + q->soff + q->done);
    if (r->fixed)
        io_uring_prep_read_fixed(sqe, req_fd(r, q), addr, len, off, op->buf);
    else
        io_uring_prep_read(sqe, req_fd(r, q), addr, len, (uint64_t)off);
    io_uring_sqe_set_data64(sqe, (uint64_t)ri);
    r->sq_pending++;
}

/* Pushes prepared sqes to the kernel. Transient refusals leave them queued for later. */
static int ring_push(zs_shard_reader *r, unsigned wait_nr) {
    for (;;) {
        int rc = wait_nr ? io_uring_submit_and_wait(&r->ring, wait_nr) : io_uring_submit(&r->ring);
        if (rc >= 0) {
            r->sq_pending -= ZS_MIN(rc, r->sq_pending);
            return 0;
        }
        if (rc == -EINTR) continue;
        if (rc == -EAGAIN || rc == -EBUSY) return 0; /* retry on the next push */
        return zs_err(ZS_EIO, "%s: io_uring submit failed: %s", r->path, strerror(-rc));
    }
}

/* Fills free request slots with blocks of the earliest submitted shards. */
static void pump(zs_shard_reader *r) {
    while (r->reqs_active < r->qd) {
        rd_op *best = NULL;
        for (int i = 0; i < r->ops_cap; i++) {
            rd_op *op = &r->ops[i];
            if (op->used && !op->finished && op->status == 0 && op->next < r->bytes[op->shard] &&
                (!best || op->seq < best->seq))
                best = op;
        }
        if (!best) return;
        int ri = 0;
        while (r->reqs[ri].active) ri++;
        rd_req *q = &r->reqs[ri];
        memset(q, 0, sizeof *q);
        q->active = 1;
        q->op = (int)(best - r->ops);
        q->soff = best->next;
        q->len = ZS_MIN(r->bs, r->bytes[best->shard] - best->next);
        q->inject = inject_hit();
        best->next += q->len;
        best->outstanding++;
        r->reqs_active++;
        req_prep(r, ri);
    }
}

static void req_release(zs_shard_reader *r, int ri) {
    r->reqs[ri].active = 0;
    r->reqs_active--;
}

static void handle_cqe(zs_shard_reader *r, int ri, int res) {
    ZS_ASSERT(ri >= 0 && ri < r->qd && r->reqs[ri].active);
    rd_req *q = &r->reqs[ri];
    rd_op *op = &r->ops[q->op];
    if (q->inject) {
        q->inject = 0;
        res = -EIO;
    }
    size_t foff = r->offs[op->shard] + q->soff + q->done;
    if ((res == -EAGAIN || res == -EINTR) && ++q->retries < RD_MAX_RETRIES && op->status == 0) {
        req_prep(r, ri);
        return;
    }
    if (res == -EINVAL && r->direct && !r->direct_broken && op->status == 0) {
        int rc = switch_buffered(r);
        if (rc == 0) {
            req_prep(r, ri);
            return;
        }
        op_fail(r, op, rc, "%s", zs_errmsg());
    } else if (res < 0) {
        op_fail(r, op, ZS_EIO, "read failed at offset %zu: %s", foff, strerror(-res));
    } else if (res == 0) {
        op_fail(r, op, ZS_EFORMAT,
                "unexpected end of file at offset %zu (the file is shorter than its manifest "
                "says: truncated?)",
                foff);
    } else if (op->status == 0) {
        q->done += (size_t)res;
        if (q->done < q->len) { /* short read: requeue the rest */
            int rc = req_rest_fd(r, q, (char *)r->bufs[op->buf] + q->soff + q->done,
                                 r->offs[op->shard] + q->soff + q->done, q->len - q->done);
            if (rc == 0) {
                req_prep(r, ri);
                return;
            }
            op_fail(r, op, rc, "%s", zs_errmsg());
        }
    }
    op->outstanding--;
    req_release(r, ri);
    op_maybe_finish(r, op);
}

/* Reads one whole op synchronously with pread (fallback mode). */
static void pread_op(zs_shard_reader *r, rd_op *op) {
    size_t bytes = r->bytes[op->shard];
    char *dst = r->bufs[op->buf];
    while (op->next < bytes && op->status == 0) {
        size_t len = ZS_MIN(r->bs, bytes - op->next), done = 0;
        int inject = inject_hit();
        while (done < len) {
            size_t foff = r->offs[op->shard] + op->next + done;
            ssize_t n;
            if (inject) {
                inject = 0;
                n = -1;
                errno = EIO;
            } else {
                int fd = r->fd;
                if (r->direct_broken) {
                    fd = r->fd_buffered;
                } else if (done > 0 && r->direct) { /* unaligned rest after a short read */
                    rd_req tmp = {0};
                    int rc = req_rest_fd(r, &tmp, dst + op->next + done, foff, len - done);
                    if (rc < 0) {
                        op_fail(r, op, rc, "%s", zs_errmsg());
                        break;
                    }
                    if (tmp.buffered) fd = r->fd_buffered;
                }
                n = pread(fd, dst + op->next + done, len - done, (off_t)foff);
            }
            if (n < 0) {
                int e = errno;
                if (e == EINTR || e == EAGAIN) continue;
                if (e == EINVAL && r->direct && !r->direct_broken) {
                    int rc = switch_buffered(r);
                    if (rc == 0) continue;
                    op_fail(r, op, rc, "%s", zs_errmsg());
                    break;
                }
                op_fail(r, op, ZS_EIO, "read failed at offset %zu: %s", foff, strerror(e));
                break;
            }
            if (n == 0) {
                op_fail(r, op, ZS_EFORMAT,
                        "unexpected end of file at offset %zu (the file is shorter than its "
                        "manifest says: truncated?)",
                        foff);
                break;
            }
            done += (size_t)n;
        }
        if (op->status == 0) op->next += len;
    }
    op_maybe_finish(r, op);
}

void zs_shard_reader_close(zs_shard_reader *r) {
    if (!r) return;
    if (r->use_uring) {
        /* Drain: the kernel must not write into the caller's buffers after we return. */
        while (r->reqs_active > 0) {
            if (r->sq_pending > 0 && ring_push(r, 0) < 0) break;
            struct io_uring_cqe *cqe;
            int rc = io_uring_wait_cqe(&r->ring, &cqe);
            if (rc == -EINTR || rc == -EAGAIN) continue;
            if (rc < 0) break;
            int ri = (int)io_uring_cqe_get_data64(cqe);
            io_uring_cqe_seen(&r->ring, cqe);
            if (ri >= 0 && ri < r->qd && r->reqs[ri].active) req_release(r, ri);
        }
        if (r->fixed) io_uring_unregister_buffers(&r->ring);
        io_uring_queue_exit(&r->ring);
    }
    if (r->fd >= 0) close(r->fd);
    if (r->fd_buffered >= 0) close(r->fd_buffered);
    if (r->labels)
        for (int i = 0; i < r->n; i++) free(r->labels[i]);
    free(r->labels);
    free(r->path);
    free(r->offs);
    free(r->bytes);
    free(r->sums);
    free(r->bufs);
    free(r->buf_bytes);
    free(r->buf_busy);
    free(r->reqs);
    free(r->ops);
    free(r);
}

int zs_shard_reader_open(const zs_shard_file *f, const zs_reader_opts *o, void *const *bufs,
                         const size_t *buf_bytes, int n_bufs, zs_shard_reader **out) {
    if (!f || !out || (n_bufs > 0 && (!bufs || !buf_bytes)))
        return zs_err(ZS_EINVAL, "zs_shard_reader_open: NULL argument");
    const char *path = zs_shard_file_path(f);
    if (!zs_shard_file_is_readable(f))
        return zs_err(ZS_EINVAL, "%s: cannot read a shard file that is not committed", path);
    if (n_bufs <= 0) return zs_err(ZS_EINVAL, "%s: reader needs at least one buffer", path);
    int qd = o && o->queue_depth > 0 ? o->queue_depth : RD_DEFAULT_QD;
    size_t bs = o && o->block_size > 0 ? o->block_size : RD_DEFAULT_BS;
    if (qd > 4096) return zs_err(ZS_EINVAL, "%s: queue depth %d too large (max 4096)", path, qd);
    if (bs > RD_MAX_BS)
        return zs_err(ZS_EINVAL, "%s: block size %zu too large (max %zu)", path, bs, RD_MAX_BS);
    bs = ZS_ALIGN_UP(bs, (size_t)ZS_STORE_ALIGN);
    for (int i = 0; i < n_bufs; i++) {
        if (!bufs[i] || (uintptr_t)bufs[i] % ZS_STORE_ALIGN != 0 ||
            buf_bytes[i] % ZS_STORE_ALIGN != 0)
            return zs_err(ZS_EINVAL,
                          "%s: buffer %d (%p, %zu bytes) must be non-NULL with address and size "
                          "multiples of %d",
                          path, i, bufs[i], buf_bytes[i], ZS_STORE_ALIGN);
    }

    zs_shard_reader *r = calloc(1, sizeof *r);
    if (!r) return zs_err(ZS_ENOMEM, "out of memory");
    r->fd = r->fd_buffered = -1;
    r->n = zs_shard_file_count(f);
    r->total = zs_shard_file_total_bytes(f);
    r->qd = qd;
    r->bs = bs;
    r->verify = o ? o->verify : 0;
    r->n_bufs = n_bufs;
    r->path = strdup(path);
    r->offs = calloc((size_t)r->n, sizeof *r->offs);
    r->bytes = calloc((size_t)r->n, sizeof *r->bytes);
    r->sums = calloc((size_t)r->n, sizeof *r->sums);
    r->labels = calloc((size_t)r->n, sizeof *r->labels);
    r->bufs = calloc((size_t)n_bufs, sizeof *r->bufs);
    r->buf_bytes = calloc((size_t)n_bufs, sizeof *r->buf_bytes);
    r->buf_busy = calloc((size_t)n_bufs, 1);
    r->reqs = calloc((size_t)qd, sizeof *r->reqs);
    r->ops_cap = 8;
    r->ops = calloc((size_t)r->ops_cap, sizeof *r->ops);
    if (!r->path || !r->offs || !r->bytes || !r->sums || !r->labels || !r->bufs ||
        !r->buf_bytes || !r->buf_busy || !r->reqs || !r->ops) {
        zs_shard_reader_close(r);
        return zs_err(ZS_ENOMEM, "out of memory");
    }
    for (int i = 0; i < r->n; i++) {
        r->offs[i] = zs_shard_file_offset(f, i);
        r->bytes[i] = zs_shard_file_bytes(f, i);
        r->sums[i] = zs_shard_file_checksum(f, i);
        const char *l = zs_shard_file_label(f, i);
        if (l && !(r->labels[i] = strdup(l))) {
            zs_shard_reader_close(r);
            return zs_err(ZS_ENOMEM, "out of memory");
        }
    }
    memcpy(r->bufs, bufs, (size_t)n_bufs * sizeof *bufs);
    memcpy(r->buf_bytes, buf_bytes, (size_t)n_bufs * sizeof *buf_bytes);

    int rc = open_direct(r->path, &r->fd, &r->direct);
    if (rc < 0) {
        zs_shard_reader_close(r);
        return rc;
    }
    struct stat st;
    if (fstat(r->fd, &st) != 0) {
        rc = zs_err(ZS_EIO, "%s: fstat failed: %s", r->path, strerror(errno));
        zs_shard_reader_close(r);
        return rc;
    }
    if ((unsigned long long)st.st_size < (unsigned long long)r->total) {
        rc = zs_err(ZS_EFORMAT,
                    "%s: file is %lld bytes but its manifest describes %zu (truncated?)", r->path,
                    (long long)st.st_size, r->total);
        zs_shard_reader_close(r);
        return rc;
    }

    r->use_uring = ring_init(&r->ring, qd);
    if (r->use_uring) {
        struct iovec *iov = calloc((size_t)n_bufs, sizeof *iov);
        if (!iov) {
            zs_shard_reader_close(r);
            return zs_err(ZS_ENOMEM, "out of memory");
        }
        for (int i = 0; i < n_bufs; i++) {
            iov[i].iov_base = bufs[i];
            iov[i].iov_len = buf_bytes[i];
        }
        int reg = io_uring_register_buffers(&r->ring, iov, (unsigned)n_bufs);
        free(iov);
        if (reg == 0) {
            r->fixed = 1;
        } else if (log_once(&g_logged_noreg)) {
            zs_log_warn("%s: io_uring buffer registration of %d buffers failed (%s; check "
                        "RLIMIT_MEMLOCK); using unregistered io_uring reads",
                        r->path, n_bufs, strerror(-reg));
        }
    }
    *out = r;
    return 0;
}

int zs_shard_reader_submit(zs_shard_reader *r, int shard, int buf, uint64_t tag) {
    if (!r) return zs_err(ZS_EINVAL, "zs_shard_reader_submit: NULL reader");
    if (shard < 0 || shard >= r->n)
        return zs_err(ZS_ERANGE, "%s: shard %d out of range (0..%d)", r->path, shard, r->n - 1);
    if (buf < 0 || buf >= r->n_bufs)
        return zs_err(ZS_ERANGE, "%s: shard %d: buffer %d out of range (0..%d)", r->path, shard,
                      buf, r->n_bufs - 1);
    if (r->buf_bytes[buf] < r->bytes[shard])
        return zs_err(ZS_EINVAL, "%s: shard %d needs %zu bytes but buffer %d holds %zu", r->path,
                      shard, r->bytes[shard], buf, r->buf_bytes[buf]);
    if (r->buf_busy[buf])
        return zs_err(ZS_EBUSY, "%s: shard %d: buffer %d is still the target of another read",
                      r->path, shard, buf);
    int slot = -1;
    for (int i = 0; i < r->ops_cap; i++)
        if (!r->ops[i].used) {
            slot = i;
            break;
        }
    if (slot < 0) {
        int ncap = r->ops_cap * 2;
        rd_op *nops = realloc(r->ops, (size_t)ncap * sizeof *nops);
        if (!nops) return zs_err(ZS_ENOMEM, "out of memory");
        memset(nops + r->ops_cap, 0, (size_t)(ncap - r->ops_cap) * sizeof *nops);
        slot = r->ops_cap;
        r->ops = nops;
        r->ops_cap = ncap;
    }
    rd_op *op = &r->ops[slot];
    memset(op, 0, sizeof *op);
    op->used = 1;
    op->shard = shard;
    op->buf = buf;
    op->tag = tag;
    op->seq = ++r->seq;
    r->buf_busy[buf] = 1;
    r->inflight++;
    op_maybe_finish(r, op); /* zero-length shard */
    if (r->use_uring && !op->finished) {
        pump(r);
        int rc = ring_push(r, 0);
        if (rc < 0) return rc;
    }
    return 0;
}

/* Returns the earliest finished op, or NULL. */
static rd_op *first_finished(zs_shard_reader *r) {
    rd_op *best = NULL;
    for (int i = 0; i < r->ops_cap; i++) {
        rd_op *op = &r->ops[i];
        if (op->used && op->finished && (!best || op->done_seq < best->done_seq)) best = op;
    }
    return best;
}

static int deliver(zs_shard_reader *r, rd_op *op, uint64_t *tag, int *status) {
    *tag = op->tag;
    *status = op->status;
    if (op->status != 0) zs_err(op->status, "%s", op->msg);
    r->buf_busy[op->buf] = 0;
    op->used = 0;
    r->inflight--;
    return 1;
}

int zs_shard_reader_poll(zs_shard_reader *r, int wait, uint64_t *tag, int *status) {
    if (!r || !tag || !status) return zs_err(ZS_EINVAL, "zs_shard_reader_poll: NULL argument");
    for (;;) {
        rd_op *done = first_finished(r);
        if (done) return deliver(r, done, tag, status);
        if (r->inflight == 0) return 0;
        if (!r->use_uring) {
            rd_op *next = NULL;
            for (int i = 0; i < r->ops_cap; i++) {
                rd_op *op = &r->ops[i];
                if (op->used && !op->finished && (!next || op->seq < next->seq)) next = op;
            }
            ZS_ASSERT(next);
            pread_op(r, next);
            continue;
        }
        pump(r);
        int rc = ring_push(r, 0);
        if (rc < 0) return rc;
        int got = 0;
        struct io_uring_cqe *cqe;
        while (io_uring_peek_cqe(&r->ring, &cqe) == 0 && cqe) {
            int ri = (int)io_uring_cqe_get_data64(cqe);
            int res = cqe->res;
            io_uring_cqe_seen(&r->ring, cqe);
            handle_cqe(r, ri, res);
            got = 1;
        }
        if (got) {
            pump(r);
            if ((rc = ring_push(r, 0)) < 0) return rc;
            continue;
        }
        if (!wait) return 0;
        ZS_ASSERT(r->reqs_active > 0);
        rc = r->sq_pending > 0 ? io_uring_submit_and_wait(&r->ring, 1)
                               : io_uring_wait_cqe(&r->ring, &cqe);
        if (r->sq_pending > 0 && rc >= 0) r->sq_pending -= ZS_MIN(rc, r->sq_pending);
        if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY && rc != -ETIME)
            return zs_err(ZS_EIO, "%s: io_uring wait failed: %s", r->path, strerror(-rc));
    }
}

int zs_shard_reader_inflight(const zs_shard_reader *r) { return r ? r->inflight : 0; }

int zs_shard_reader_set_checksum(zs_shard_reader *r, int shard, uint64_t sum) {
    if (!r) return zs_err(ZS_EINVAL, "zs_shard_reader_set_checksum: NULL reader");
    if (shard < 0 || shard >= r->n)
        return zs_err(ZS_ERANGE, "%s: shard %d out of range (0..%d)", r->path, shard, r->n - 1);
    r->sums[shard] = sum;
    return 0;
}

int zs_shard_reader_mode(const zs_shard_reader *r, int *direct) {
    if (!r) return 0;
    if (direct) *direct = r->direct && !r->direct_broken;
    return r->use_uring;
}

/* ---------------------------------------------------------------- raw bandwidth ---- */

int zs_store_raw_read_gbps(const char *path, size_t bytes, int queue_depth, size_t block_size,
                           double *gbps) {
    if (!path || !gbps) return zs_err(ZS_EINVAL, "zs_store_raw_read_gbps: NULL argument");
    int qd = queue_depth > 0 ? queue_depth : RD_DEFAULT_QD;
    size_t bs = block_size > 0 ? block_size : RD_DEFAULT_BS;
    if (qd > 4096 || bs > RD_MAX_BS)
        return zs_err(ZS_EINVAL, "%s: queue depth %d / block size %zu out of range", path, qd,
                      bs);
    bs = ZS_ALIGN_UP(bs, (size_t)ZS_STORE_ALIGN);
    int fd, direct, fdb = -1, dbroken = 0; /* dbroken: O_DIRECT reads refused, use fdb */
    int rc = open_direct(path, &fd, &direct);
    if (rc < 0) return rc;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return zs_err(ZS_EINVAL, "%s: not a regular file", path);
    }
    size_t fsize = (size_t)st.st_size;
    if (bytes == 0) bytes = fsize;
    if (bytes > fsize) {
        close(fd);
        return zs_err(ZS_ERANGE, "%s: asked to read %zu bytes but the file has %zu", path, bytes,
                      fsize);
    }
    if (bytes == 0) {
        close(fd);
        return zs_err(ZS_EINVAL, "%s: file is empty", path);
    }
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    size_t region;
    if (zs_mul_size(bs, (size_t)qd, &region) < 0) {
        close(fd);
        return zs_err(ZS_ERANGE, "%s: queue depth x block size overflows", path);
    }
    char *mem = zs_aligned_alloc(ZS_STORE_ALIGN, region);
    if (!mem) {
        close(fd);
        return zs_err(ZS_ENOMEM, "%s: cannot allocate %zu bytes of read buffers", path, region);
    }
    struct io_uring ring;
    int uring = ring_init(&ring, qd), fixed = 0;
    size_t issued = 0, completed = 0;
    double t0 = zs_now();
    if (uring) {
        struct iovec *iov = calloc((size_t)qd, sizeof *iov);
        /* per slot: file offset of its block, block length (to count), bytes read so far */
        size_t *soff = calloc((size_t)qd, sizeof *soff), *slen = calloc((size_t)qd, sizeof *slen);
        size_t *sdone = calloc((size_t)qd, sizeof *sdone);
        int *busy = calloc((size_t)qd, sizeof *busy);
        int active = 0;
        if (!iov || !soff || !slen || !sdone || !busy) {
            rc = zs_err(ZS_ENOMEM, "out of memory");
            goto uring_done;
        }
        for (int i = 0; i < qd; i++) {
            iov[i].iov_base = mem + (size_t)i * bs;
            iov[i].iov_len = bs;
        }
        fixed = io_uring_register_buffers(&ring, iov, (unsigned)qd) == 0;
        t0 = zs_now();
        for (;;) {
            for (int i = 0; i < qd && issued < bytes; i++) { /* fill free slots */
                if (busy[i]) continue;
                busy[i] = 1;
                soff[i] = issued;
                slen[i] = ZS_MIN(bs, bytes - issued);
                sdone[i] = 0;
                issued += slen[i];
                active++;
                struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
                ZS_ASSERT(sqe);
                /* O_DIRECT needs 4096-multiples; a tail past `bytes` is read and ignored */
                unsigned len = (unsigned)ZS_ALIGN_UP(slen[i], (size_t)ZS_STORE_ALIGN);
                int ufd = dbroken ? fdb : fd;
                if (fixed)
                    io_uring_prep_read_fixed(sqe, ufd, iov[i].iov_base, len, (off_t)soff[i], i);
                else
                    io_uring_prep_read(sqe, ufd, iov[i].iov_base, len, soff[i]);
                io_uring_sqe_set_data64(sqe, (uint64_t)i);
            }
            if (active == 0) break;
            int s = io_uring_submit_and_wait(&ring, 1);
            if (s < 0 && s != -EINTR && s != -EAGAIN && s != -EBUSY) {
                rc = zs_err(ZS_EIO, "%s: io_uring submit failed: %s", path, strerror(-s));
                break;
            }
            struct io_uring_cqe *cqe;
            while (io_uring_peek_cqe(&ring, &cqe) == 0 && cqe) {
                int i = (int)io_uring_cqe_get_data64(cqe);
                int res = cqe->res;
                io_uring_cqe_seen(&ring, cqe);
                if (res == -EINVAL && direct && !dbroken) {
                    if (fdb < 0) fdb = open(path, O_RDONLY | O_CLOEXEC);
                    if (fdb < 0) {
                        res = -errno;
                    } else {
                        dbroken = 1;
                        if (log_once(&g_logged_directread))
                            zs_log_info("%s: O_DIRECT read refused (EINVAL); using buffered "
                                        "reads",
                                        path);
                    }
                }
                if (rc < 0) { /* draining after an error */
                    busy[i] = 0;
                    active--;
                    continue;
                }
                if (res == -EAGAIN || res == -EINTR || (res == -EINVAL && dbroken)) {
                    /* resubmit the rest of the block below */
                } else if (res < 0 || res == 0) {
                    rc = zs_err(ZS_EIO, "%s: read failed at offset %zu: %s", path,
                                soff[i] + sdone[i],
                                res < 0 ? strerror(-res) : "unexpected end of file");
                    busy[i] = 0;
                    active--;
                    continue;
                } else {
                    sdone[i] += (size_t)res;
                    if (sdone[i] >= slen[i]) {
                        completed += slen[i];
                        busy[i] = 0;
                        active--;
                        continue;
                    }
                }
                if (direct && fdb < 0 && (sdone[i] % ZS_STORE_ALIGN) != 0) {
                    fdb = open(path, O_RDONLY | O_CLOEXEC); /* unaligned rest: buffered */
                    if (fdb < 0) {
                        rc = zs_err(ZS_EIO, "%s: cannot reopen without O_DIRECT: %s", path,
                                    strerror(errno));
                        busy[i] = 0;
                        active--;
                        continue;
                    }
                }
                struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
                ZS_ASSERT(sqe);
                int ufd = dbroken || (direct && sdone[i] % ZS_STORE_ALIGN != 0) ? fdb : fd;
                /* after a short read the remainder may be unaligned: plain read */
                io_uring_prep_read(sqe, ufd, (char *)iov[i].iov_base + sdone[i],
                                   (unsigned)(slen[i] - sdone[i]), soff[i] + sdone[i]);
                io_uring_sqe_set_data64(sqe, (uint64_t)i);
            }
            if (rc < 0 && active == 0) break;
            if (rc < 0) issued = bytes; /* issue nothing more, keep draining */
        }
    uring_done:
        free(iov);
        free(soff);
        free(slen);
        free(sdone);
        free(busy);
        if (fixed) io_uring_unregister_buffers(&ring);
        io_uring_queue_exit(&ring);
    } else {
        t0 = zs_now();
        while (completed < bytes && rc == 0) {
            size_t len = ZS_ALIGN_UP(ZS_MIN(bs, bytes - completed), (size_t)ZS_STORE_ALIGN);
            ssize_t n = pread(dbroken ? fdb : fd, mem, len, (off_t)completed);
            if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
            if (n < 0 && errno == EINVAL && direct && !dbroken) {
                fdb = open(path, O_RDONLY | O_CLOEXEC);
                if (fdb >= 0) {
                    dbroken = 1;
                    continue;
                }
            }
            if (n <= 0) {
                rc = zs_err(ZS_EIO, "%s: read failed at offset %zu: %s", path, completed,
                            n < 0 ? strerror(errno) : "unexpected end of file");
                break;
            }
            completed += ZS_MIN((size_t)n, bytes - completed);
        }
    }
    double dt = zs_now() - t0;
    free(mem);
    close(fd);
    if (fdb >= 0) close(fdb);
    if (rc < 0) return rc;
    if (dt <= 0) dt = 1e-9;
    *gbps = (double)bytes / dt / 1e9;
    return 0;
}
