/* cluster.h — the processes of one zeroserve world (DESIGN.md §1). A plain start is a cluster
 * of one process. Under `mpirun -np P` (OpenMPI) the P processes join one world through MPI:
 * process p runs local ranks p*L .. p*L+L-1 (world rank = process offset + local rank), every
 * process with the same --ranks L. Process 0 serves HTTP and schedules; the others follow.
 *
 * What lives here: the MPI bootstrap (MPI_THREAD_MULTIPLE), small control collectives between
 * the processes (broadcast, all_gather, barrier, from one thread of each process), and the
 * liveness watch: every follower holds a TCP connection to process 0, so that the death of any
 * process (kill -9, a crash, a lost host via TCP keep-alive) is seen by the others within
 * seconds instead of hanging a collective forever. A lost peer marks the cluster lost: every
 * control and MPI collective returns ZS_ECANCELLED from then on, and the callbacks registered
 * with zs_cluster_on_lost run once (on the watch thread).
 *
 * The MPI types stay in cluster-mpi.c and comm-mpi.c; this header is plain C.
 * Thread-safety: init and finalize from the main thread; the control collectives from one
 * thread per process at a time, all processes in the same order; the queries from anywhere. */
#ifndef ZS_CLUSTER_H
#define ZS_CLUSTER_H

#include <stddef.h>

/* Joins the MPI job when the process was started by mpirun (or another PMI launcher), else
 * sets up a cluster of one. Idempotent. Errors: MPI without thread support, a failed bootstrap
 * of the liveness connections (message names the process and address). */
int  zs_cluster_init(int *argc, char ***argv);
/* Orderly end: every process calls it (it ends with a barrier, then MPI_Finalize). After a
 * loss it only closes what it can and returns (never blocks). */
void zs_cluster_finalize(void);

int  zs_cluster_rank(void);  /* this process, 0..size-1 (0 without MPI) */
int  zs_cluster_size(void);  /* processes (1 without MPI) */
/* Processes on this host and this process's index among them (0 and 1 without MPI): CUDA
 * devices and CPU threads are shared out by them. */
int  zs_cluster_node_rank(void);
int  zs_cluster_node_size(void);
/* 1 when this process is a follower (rank > 0 of a cluster of several processes). */
int  zs_cluster_follower(void);

/* Control collectives between the processes (not the ranks): abortable, ZS_ECANCELLED once
 * the cluster is lost. bcast copies root's bytes everywhere; all_gather puts process p's bytes
 * at recv + p*bytes; and_int gives every process the minimum of the values (an agreement on
 * the worst status). */
int  zs_cluster_bcast(void *buf, size_t bytes, int root);
int  zs_cluster_all_gather(const void *send, void *recv, size_t bytes);
int  zs_cluster_min_int(int local, int *global);
int  zs_cluster_barrier(void);

/* 1 once a peer process is gone; msg (may be NULL) gets what happened, e.g. "process 1 (pid
 * 4242 on node-b) is gone: its connection closed". */
int  zs_cluster_lost(char *msg, size_t cap);
/* Marks the cluster lost by this process (e.g. a step that cannot continue). */
void zs_cluster_set_lost(const char *why);
/* Called once, on the watch thread, when the cluster becomes lost (up to 8 callbacks). */
int  zs_cluster_on_lost(void (*fn)(void *ud, const char *msg), void *ud);

/* Opaque transport for comm-mpi.c and comm-nccl.c: a new MPI communicator spanning every
 * process (MPI_Comm_dup of the world, collective: every process calls it in the same order).
 * Returns it as an integer handle (MPI_Comm_c2f) or a negative ZS_E* code. */
int  zs_cluster_new_mpi_comm(int *handle);
void zs_cluster_free_mpi_comm(int handle);

#endif
