/* comm.c — the public communicator entry points: argument checks, then dispatch through the
 * implementation's vtable (comm-impl.h). Also the host reduction shared by the CPU backend and
 * the stub of zs_comm_nccl_create for builds without CUDA. */
#include "comm.h"

#include <string.h>

#include "comm-impl.h"
#include "common.h"

/* ---- host reduction ---------------------------------------------------------------------- */

#define RED_CHUNK 1024 /* elements per f32 accumulator chunk (4 KiB, stays in L1) */

const char *zs_comm_redop_name(zs_redop op) {
    switch (op) {
    case ZS_RED_SUM: return "sum";
    case ZS_RED_MAX: return "max";
    default: return "?";
    }
}

static void load_f32(float *dst, const void *src, zs_dtype dt, size_t m) {
    if (dt == ZS_F32) memcpy(dst, src, m * 4);
    else zs_to_f32(dst, src, dt, m);
}

/* acc = acc (op) x, NaN propagating for max so that the result does not depend on order
 * beyond the fixed rank order. */
static void accumulate(float *restrict acc, const float *restrict x, size_t m, zs_redop op) {
    if (op == ZS_RED_SUM) {
        for (size_t e = 0; e < m; e++) acc[e] += x[e];
    } else {
        for (size_t e = 0; e < m; e++) {
            float a = acc[e], v = x[e];
            acc[e] = (v > a || v != v) ? v : a;
        }
    }
}

void zs_comm_host_reduce(void *out, const void *const *src, int nsrc, size_t count, zs_dtype dt,
                         zs_redop op) {
    size_t es = zs_dtype_size(dt);
    float acc[RED_CHUNK], tmp[RED_CHUNK];
    if (nsrc <= 0) return;
    if (nsrc == 1) { /* a single rank: a plain copy (or nothing, in place) */
        if (out != src[0]) memmove(out, src[0], count * es);
        return;
    }
    for (size_t off = 0; off < count; off += RED_CHUNK) {
        size_t m = ZS_MIN((size_t)RED_CHUNK, count - off);
        load_f32(acc, (const char *)src[0] + off * es, dt, m);
        for (int k = 1; k < nsrc; k++) {
            const char *s = (const char *)src[k] + off * es;
            if (dt == ZS_F32) {
                /* the source may alias out (in place), but only at this same chunk, which is
                 * written after every source was read: copy to keep `restrict` honest. */
                memcpy(tmp, s, m * 4);
            } else {
                zs_to_f32(tmp, s, dt, m);
            }
            accumulate(acc, tmp, m, op);
        }
        zs_convert((char *)out + off * es, dt, acc, ZS_F32, m);
    }
}

/* ---- argument checks and dispatch -------------------------------------------------------- */

/* An argument error on one rank would leave the others waiting in the collective forever, so
 * it also aborts the group. */
static int bad_arg(zs_comm *c, const char *what, const char *fmt, const char *detail) {
    if (c) zs_comm_abort(c);
    return zs_err(ZS_EINVAL, "comm %s: %s%s (group aborted)", what, fmt, detail ? detail : "");
}

#define CHECK_COMM(c, what)                                                                 \
    do {                                                                                    \
        if (!(c) || !(c)->ops) return zs_err(ZS_EINVAL, "comm %s: NULL communicator", what); \
    } while (0)

static int check_red(zs_comm *c, const char *what, zs_dtype dt, zs_redop op) {
    if ((int)dt < 0 || dt >= ZS_DTYPE_ELEM_COUNT) return bad_arg(c, what, "invalid dtype", NULL);
    if (op != ZS_RED_SUM && op != ZS_RED_MAX) return bad_arg(c, what, "invalid reduction op", NULL);
    return 0;
}

int zs_comm_rank(const zs_comm *c) { return c ? c->rank : -1; }
int zs_comm_size(const zs_comm *c) { return c ? c->size : 0; }
const char *zs_comm_name(const zs_comm *c) { return c && c->ops ? c->ops->name : "?"; }

void zs_comm_free(zs_comm *c) {
    if (c && c->ops) c->ops->free(c);
}

void zs_comm_abort(zs_comm *c) {
    if (c && c->ops) c->ops->abort(c);
}

int zs_comm_wait(zs_comm *c, void *stream) {
    return c && c->ops && c->ops->wait ? c->ops->wait(c, stream) : 0;
}

int zs_comm_settle(zs_comm *c, double timeout_s) {
    return c && c->ops && c->ops->settle ? c->ops->settle(c, timeout_s) : 0;
}

int zs_comm_all_gather(zs_comm *c, const void *send, void *recv, size_t bytes_per_rank,
                       void *stream) {
    CHECK_COMM(c, "all_gather");
    size_t total;
    if (zs_mul_size(bytes_per_rank, (size_t)c->size, &total))
        return bad_arg(c, "all_gather", "size overflows", NULL);
    if (bytes_per_rank && (!send || !recv))
        return bad_arg(c, "all_gather", "NULL buffer", NULL);
    return c->ops->all_gather(c, send, recv, bytes_per_rank, stream);
}

int zs_comm_reduce_scatter(zs_comm *c, const void *send, void *recv, size_t count_per_rank,
                           zs_dtype dt, zs_redop op, void *stream) {
    CHECK_COMM(c, "reduce_scatter");
    ZS_CHECK(check_red(c, "reduce_scatter", dt, op));
    size_t total;
    if (zs_mul_size(count_per_rank, (size_t)c->size, &total) ||
        zs_mul_size(total, zs_dtype_size(dt), &total))
        return bad_arg(c, "reduce_scatter", "size overflows", NULL);
    if (count_per_rank && (!send || !recv))
        return bad_arg(c, "reduce_scatter", "NULL buffer", NULL);
    return c->ops->reduce_scatter(c, send, recv, count_per_rank, dt, op, stream);
}

int zs_comm_all_reduce(zs_comm *c, const void *send, void *recv, size_t count, zs_dtype dt,
                       zs_redop op, void *stream) {
    CHECK_COMM(c, "all_reduce");
    ZS_CHECK(check_red(c, "all_reduce", dt, op));
    size_t total;
    if (zs_mul_size(count, zs_dtype_size(dt), &total))
        return bad_arg(c, "all_reduce", "size overflows", NULL);
    if (count && (!send || !recv)) return bad_arg(c, "all_reduce", "NULL buffer", NULL);
    return c->ops->all_reduce(c, send, recv, count, dt, op, stream);
}

int zs_comm_broadcast(zs_comm *c, void *buf, size_t bytes, int root, void *stream) {
    CHECK_COMM(c, "broadcast");
    if (root < 0 || root >= c->size) {
        char d[64];
        snprintf(d, sizeof d, " %d (group of %d)", root, c->size);
        return bad_arg(c, "broadcast", "root out of range:", d);
    }
    if (bytes && !buf) return bad_arg(c, "broadcast", "NULL buffer", NULL);
    return c->ops->broadcast(c, buf, bytes, root, stream);
}

int zs_comm_barrier(zs_comm *c) {
    CHECK_COMM(c, "barrier");
    return c->ops->barrier(c);
}

int zs_comm_agree(zs_comm *c, int local_status, int *global_status) {
    CHECK_COMM(c, "agree");
    if (!global_status) return bad_arg(c, "agree", "NULL global_status", NULL);
    if (local_status > 0) local_status = 0; /* only 0 or negative codes are meaningful */
    return c->ops->agree(c, local_status, global_status);
}

#ifndef ZS_CUDA
int zs_comm_nccl_create(int n, const int *devs, zs_comm **comms) {
    (void)n, (void)devs, (void)comms;
    return zs_err(ZS_EUNSUPPORTED, "comm nccl: zeroserve was built without CUDA/NCCL");
}

int zs_comm_nccl_create_cluster(int n, const int *devs, zs_comm **comms) {
    return zs_comm_nccl_create(n, devs, comms);
}
#endif
