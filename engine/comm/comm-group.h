/* comm-group.h — the in-process half shared by the host communicators comm-local.c and
 * comm-mpi.c: a group of n local ranks (threads) that publish their arguments in one slot each,
 * meet at a generation-counted barrier that an abort cancels, and compare their slots, so that
 * every collective can be written as
 *     zs_comm_group_enter (publish, abortable barrier)   then   zs_comm_group_check (compare);
 *     the rank's own part of the work, reading the other ranks' buffers through their slots;
 *     zs_comm_group_sync(g, 0) (after it nobody reads another rank's buffers any more).
 * Only comm-local.c and comm-mpi.c include it.
 *
 * The barrier waits on a condition variable. A group made with a watch function (comm-mpi with
 * several processes) waits in slices of a few milliseconds in its abortable barriers and calls
 * the watch between them, outside the lock, so that it can notice what only polling shows (an
 * abort from another process, a lost cluster) and abort the group.
 *
 * Thread-safety: slots are written by their own rank before a barrier and read by every rank
 * after it; zs_comm_group_abort and zs_comm_group_aborted from any thread at any time. */
#ifndef ZS_COMM_GROUP_H
#define ZS_COMM_GROUP_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

/* The collectives, as published in slots and named in messages. ZS_COLL_BAD is what comm-mpi
 * sends to the other processes in place of a collective its ranks could not agree on. */
enum {
    ZS_COLL_ALL_GATHER,
    ZS_COLL_REDUCE_SCATTER,
    ZS_COLL_ALL_REDUCE,
    ZS_COLL_BROADCAST,
    ZS_COLL_BARRIER,
    ZS_COLL_AGREE,
    ZS_COLL_BAD
};

/* One rank's published arguments and outcome; a cache line each so ranks do not false-share. */
typedef struct {
    int kind;         /* ZS_COLL_* */
    int dt, op, root; /* -1 where not meaningful */
    size_t size;      /* bytes or elements, as the collective takes them */
    const void *send;
    void *recv;
    int status;    /* agree: the rank's status */
    void *scratch; /* comm-mpi: this rank's scratch (reduce_scatter, all_reduce) */
    int prep;      /* comm-mpi: 0, or why the rank cannot take part (scratch allocation) */
    int work;      /* comm-mpi: 0, or how the rank's MPI part failed */
} __attribute__((aligned(64))) zs_comm_slot;

typedef struct {
    int n; /* local ranks */
    zs_comm_slot *slots;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived;       /* ranks waiting in the current barrier generation */
    unsigned long gen; /* barrier generation */
    atomic_int aborted;
    int refs; /* live handles */
    void (*watch)(void *arg);
    void *watch_arg;
} zs_comm_group;

/* Initializes g (caller's memory) for n local ranks with zeroed slots and n references. watch
 * (NULL for none) is called with watch_arg while an abortable barrier waits. Returns 0, or
 * ZS_ENOMEM / ZS_EIO with a message naming the communicator `name`. */
int zs_comm_group_init(zs_comm_group *g, int n, void (*watch)(void *), void *watch_arg,
                       const char *name);
/* Frees what init made (not g itself). */
void zs_comm_group_destroy(zs_comm_group *g);
/* Drops one handle's reference: 1 when it was the last, then the caller destroys the group. */
int zs_comm_group_release(zs_comm_group *g);

/* Waits until all n local ranks have arrived. Abortable: ZS_ECANCELLED (no message) when the
 * group is (or becomes) aborted before the generation completes. Not abortable: always waits
 * for the generation, only used once every local rank is known to be on its way. */
int zs_comm_group_sync(zs_comm_group *g, int abortable);
/* Marks the group aborted and wakes its waiting ranks; 1 for the call that aborted it first. */
int zs_comm_group_abort(zs_comm_group *g);
int zs_comm_group_aborted(zs_comm_group *g);

/* Publishes `mine` as local rank li's slot and waits for every local rank (abortable): 0, or
 * ZS_ECANCELLED without a message (the caller names the collective and rank). */
int zs_comm_group_enter(zs_comm_group *g, int li, const zs_comm_slot *mine);
/* After enter: 0 when every local rank called the same collective (kind, size, dtype, op,
 * root), else ZS_EINVAL with "comm <name>: ranks disagree on the collective: rank <base>
 * called ..., rank <base+r> called ..." — the same on every local rank. base: world rank of
 * local rank 0. */
int zs_comm_group_check(const zs_comm_group *g, const char *name, int base);
/* The minimum of 0 and every local rank's slot status (agree). */
int zs_comm_group_worst(const zs_comm_group *g);

/* A slot for `kind` with dt, op and root -1. */
zs_comm_slot zs_comm_group_slot(int kind, size_t size, const void *send, void *recv);
/* Balanced split of count elements into n parts: part r is [lo, hi). */
void zs_comm_group_part(size_t count, int n, int r, size_t *lo, size_t *hi);
/* Copies into buf (count elements of es bytes) part k of every other local rank k's published
 * recv, starting after local rank li so that the ranks do not all read one buffer at once. */
void zs_comm_group_gather_parts(const zs_comm_group *g, int li, void *buf, size_t count,
                                size_t es);

/* "all_gather", ..., "agree", "failed collective"; "?" for anything else. */
const char *zs_comm_group_kind_name(int kind);
/* A call as messages show it, e.g. "all_reduce(count=8, f32, sum)". */
void zs_comm_group_describe(int kind, size_t size, int dt, int op, int root, char *buf, size_t n);

#endif
