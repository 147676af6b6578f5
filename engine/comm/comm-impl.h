/* comm-impl.h — what a communicator implementation provides: the vtable behind zs_comm and the
 * common header of every handle. Only comm.c and the comm-*.c implementations include it.
 *
 * An implementation embeds `struct zs_comm` as the first member of its handle struct and fills
 * ops/rank/size. comm.c validates arguments (handle, pointers, dtype, op, root, overflow)
 * before calling an op, so ops may assume: c != NULL, dt and op valid, root in [0, size),
 * non-NULL buffers whenever the size is non-zero, and that n*size fits in size_t. */
#ifndef ZS_COMM_IMPL_H
#define ZS_COMM_IMPL_H

#include "comm.h"

typedef struct zs_comm_ops {
    const char *name;
    int (*all_gather)(zs_comm *c, const void *send, void *recv, size_t bytes, void *stream);
    int (*reduce_scatter)(zs_comm *c, const void *send, void *recv, size_t count, zs_dtype dt,
                          zs_redop op, void *stream);
    int (*all_reduce)(zs_comm *c, const void *send, void *recv, size_t count, zs_dtype dt,
                      zs_redop op, void *stream);
    int (*broadcast)(zs_comm *c, void *buf, size_t bytes, int root, void *stream);
    int (*barrier)(zs_comm *c);
    int (*agree)(zs_comm *c, int local_status, int *global_status);
    void (*abort)(zs_comm *c);  /* thread-safe, idempotent */
    void (*free)(zs_comm *c);   /* frees the handle (and the group with the last handle) */
    int (*settle)(zs_comm *c, double timeout_s); /* optional (NULL: nothing is ever left pending) */
    int (*wait)(zs_comm *c, void *stream);       /* optional (NULL: collectives queue nothing) */
} zs_comm_ops;

struct zs_comm {
    const zs_comm_ops *ops;
    int rank;
    int size;
};

/* Name of a reduction for messages ("sum", "max"). */
const char *zs_comm_redop_name(zs_redop op);

/* Host reduction used by the CPU implementation (and usable by tests): out[e] = reduction over
 * k = 0..nsrc-1, in that order, of src[k][e], for e in [0, count). Accumulates in f32 and
 * rounds once for F16/BF16. out may equal one of src[k] (element-wise aliasing only). */
void zs_comm_host_reduce(void *out, const void *const *src, int nsrc, size_t count, zs_dtype dt,
                         zs_redop op);

#endif
