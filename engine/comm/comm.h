/* comm.h — collectives between the ranks of a zeroserve world: all_gather, reduce_scatter,
 * all_reduce, broadcast, barrier, error agreement and abort. One interface, several
 * implementations behind a vtable (comm-impl.h):
 *   "local"  ranks are threads of this process, buffers are host memory (comm-local.c);
 *   "nccl"   ranks are threads of this process, one CUDA device each, buffers are device
 *            memory and collectives are enqueued on a CUDA stream (comm-nccl.c); with several
 *            processes (cluster.h) one NCCL world across them, bootstrapped over MPI;
 *   "mpi"    ranks are threads of several processes (cluster.h), buffers are host memory:
 *            threads of one process exchange through shared memory, processes through MPI
 *            (comm-mpi.c). Results are bitwise those of "local" with as many ranks.
 *
 * Ownership: a create call returns one handle per rank. Each rank frees its own handle with
 * zs_comm_free; the state shared by the group is freed with the last handle.
 *
 * Thread-safety: each handle belongs to one rank thread; the collectives, zs_comm_barrier and
 * zs_comm_agree on a handle must be called from one thread at a time (normally the rank's own
 * thread). Different handles of one group are used concurrently by their rank threads — that is
 * the point. zs_comm_abort may be called from any thread at any time, on any handle of the
 * group (also concurrently with collectives). zs_comm_rank/size/name are always safe.
 *
 * Ordering: all ranks must call the same sequence of collectives with the same sizes, dtypes,
 * ops and roots. The local backend checks this and fails every rank with ZS_EINVAL on a
 * mismatch; NCCL does not check (a mismatch hangs or corrupts, as in NCCL itself).
 *
 * Argument errors (NULL buffers, bad dtype/op/root, size overflow) are detected before a rank
 * enters the collective; since the other ranks would then wait forever, such an error also
 * aborts the group (zs_comm_abort) and every rank gets ZS_ECANCELLED from then on.
 *
 * Failures: 0 or a negative ZS_E* code with a message in zs_errmsg() of the calling thread.
 * After zs_comm_abort every collective of the group returns ZS_ECANCELLED; the group cannot be
 * revived, only freed. */
#ifndef ZS_COMM_H
#define ZS_COMM_H

#include <stddef.h>

#include "tensor.h"

typedef struct zs_comm zs_comm; /* one rank's handle */

typedef enum { ZS_RED_SUM = 0, ZS_RED_MAX = 1 } zs_redop;

/* In-process group of n ranks (threads), host buffers. Fills comms[0..n-1], one handle per
 * rank (comms[i] has rank i); each handle is then used by its own rank thread. */
int zs_comm_local_create(int n, zs_comm **comms);

/* NCCL: n ranks in one process on CUDA devices devs[0..n-1] (distinct), created with one
 * ncclCommInitAll call from the calling thread. Buffers passed to its collectives are device
 * pointers of the rank's device; `stream` is a cudaStream_t passed as void* (NULL = default
 * stream). The collectives set the calling thread's current device to the rank's device.
 * Returns ZS_EUNSUPPORTED when built without CUDA, ZS_EDEVICE when CUDA/NCCL fail (no GPU). */
int zs_comm_nccl_create(int n, const int *devs, zs_comm **comms);

/* Multi-process group over host buffers: this process's n ranks (threads) join those of every
 * process of the cluster (cluster.h), each with n ranks too. comms[i] gets world rank
 * zs_cluster_rank()*n + i; the group has n*zs_cluster_size() ranks. Collective over the
 * processes: each calls it with the same n, in the same order as its other create calls.
 * Reductions combine the ranks in the order 0..size-1 as "local" does, so the results are
 * bitwise equal to one process with as many ranks. A lost cluster cancels the group. */
int zs_comm_mpi_create(int n, zs_comm **comms);

/* NCCL across the processes of the cluster: process 0 makes the NCCL unique id and broadcasts
 * it over MPI (the nccl-tests pattern); each process then joins its n devices devs[0..n-1] with
 * ncclCommInitRank as world ranks zs_cluster_rank()*n + i. Otherwise as zs_comm_nccl_create. */
int zs_comm_nccl_create_cluster(int n, const int *devs, zs_comm **comms);

/* Frees one rank's handle (NULL is ignored); the shared group goes with the last one. A handle
 * may be freed once no call on it is running; the group stays valid for the other ranks until
 * their handles are freed too (so after an abort each rank may free its handle as soon as its
 * own call returned). NCCL: on an aborted group this uses ncclCommAbort. */
void zs_comm_free(zs_comm *c);

int zs_comm_rank(const zs_comm *c);
int zs_comm_size(const zs_comm *c);
const char *zs_comm_name(const zs_comm *c); /* "local", "nccl", "mpi" */

/* Collectives. `stream` is the comm queue of the calling rank's backend (NULL on CPU): for the
 * local comm the call completes before returning (stream is ignored); for NCCL it is enqueued
 * on the stream and the buffers must stay valid until the stream reaches it.
 * A size of 0 is allowed (still a collective: every rank must call it). */

/* recv holds n*bytes_per_rank bytes; rank i's data lands at offset i*bytes_per_rank. send may
 * alias recv + rank*bytes_per_rank (in place); otherwise send and recv must not overlap. */
int zs_comm_all_gather(zs_comm *c, const void *send, void *recv, size_t bytes_per_rank,
                       void *stream);

/* send has n*count_per_rank elements; rank i receives the reduction of block i of every rank's
 * send into recv (count_per_rank elements). recv may alias send + rank*count_per_rank (in
 * place); otherwise they must not overlap. */
int zs_comm_reduce_scatter(zs_comm *c, const void *send, void *recv, size_t count_per_rank,
                           zs_dtype dt, zs_redop op, void *stream);

/* Every rank receives the element-wise reduction of all ranks' send (count elements).
 * send == recv is allowed (in place); otherwise they must not overlap. */
int zs_comm_all_reduce(zs_comm *c, const void *send, void *recv, size_t count, zs_dtype dt,
                       zs_redop op, void *stream);

/* Copies bytes from root's buf into every other rank's buf. */
int zs_comm_broadcast(zs_comm *c, void *buf, size_t bytes, int root, void *stream);

/* Returns when every rank of the group has called it (NCCL: host-side, after the device work
 * queued before it on the comm's internal stream; it does not wait for other streams). */
int zs_comm_barrier(zs_comm *c);

/* Waits until the work queued on stream (this handle's device collectives and what comes
 * before them) is done, polling, so that zs_comm_abort ends the wait with ZS_ECANCELLED instead
 * of a hang on a peer that gave up. Host communicators queue nothing: 0 at once. */
int zs_comm_wait(zs_comm *c, void *stream);

/* Agree on an error: every rank passes its local status (0 or negative; positive counts as 0);
 * every rank gets the minimum (worst) status in *global_status. Returns 0 when the agreement itself worked (then
 * *global_status is set), or a negative code (e.g. ZS_ECANCELLED after an abort). */
int zs_comm_agree(zs_comm *c, int local_status, int *global_status);

/* Marks the group failed: ranks blocked in a collective return ZS_ECANCELLED instead of
 * hanging, and every later collective returns ZS_ECANCELLED. Safe from any thread; NULL is
 * ignored. A collective that every rank has already entered may still complete normally. */
void zs_comm_abort(zs_comm *c);

/* After an abort: a collective that this handle's caller gave up on may still be under way in
 * the transport (MPI goes on writing its receive buffer when the peers' data arrives late, e.g.
 * over a slow link). Waits up to timeout_s for it to finish. Returns 0 when nothing is pending
 * (always for the in-process backend; NCCL tears the aborted rank's communicator down here,
 * which ends its collectives still queued on a stream), 1 when it still is (or the cluster is
 * lost): then the buffers of that call must not be freed. Call it from one thread, once no thread
 * uses the handle. */
int zs_comm_settle(zs_comm *c, double timeout_s);

#endif
