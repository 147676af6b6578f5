/* cluster-mpi.c — the processes of one world (cluster.h): MPI bootstrap under mpirun, control
 * collectives between processes over a private MPI communicator (non-blocking calls polled so
 * that a lost peer cancels them), and the liveness watch over TCP: process 0 listens, every
 * follower connects to it at start-up, and a watch thread in each process sees a peer's
 * connection close (process death) or time out (TCP keep-alive: a lost host) within seconds.
 *
 * Why our own connections: OpenMPI gives no timely, portable notice of a dead peer — a
 * collective with a dead member just waits. A closed socket is noticed by the kernel at once. */
#define _GNU_SOURCE
#include "cluster.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <mpi.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common.h"

#define MAX_ADDRS 16
#define MAX_CBS 8
#define CONNECT_TIMEOUT_MS 3000
#define ACCEPT_TIMEOUT_MS 60000
/* after a loss, the process exits on its own if it has not within this time (a thread stuck
 * where nothing can wake it must not keep the world alive) */
#define LOST_EXIT_S 20

typedef struct {
    int32_t pid;
    char host[64];
} proc_info;

typedef struct {
    uint16_t port;
    int32_t n;
    uint32_t addr[MAX_ADDRS]; /* IPv4, network order */
} leader_addr;

static struct {
    int inited, mpi, rank, size;
    int node_rank, node_size; /* processes on this host */
    MPI_Comm ctl;
    proc_info *procs;
    int *fds;        /* process 0: fds[p] is follower p's connection; followers: fds[0] */
    int wake[2];     /* stops the watch thread */
    pthread_t watch;
    int watching;
    atomic_int closing;
    atomic_int lost;
    pthread_mutex_t mu;
    char lost_msg[512];
    void (*cb[MAX_CBS])(void *, const char *);
    void *cb_ud[MAX_CBS];
    int n_cb;
} C = {.mu = PTHREAD_MUTEX_INITIALIZER, .wake = {-1, -1}};

int zs_cluster_rank(void) { return C.rank; }
int zs_cluster_size(void) { return C.size > 0 ? C.size : 1; }
int zs_cluster_follower(void) { return C.size > 1 && C.rank > 0; }
int zs_cluster_node_rank(void) { return C.node_rank; }
int zs_cluster_node_size(void) { return C.node_size > 0 ? C.node_size : 1; }

int zs_cluster_lost(char *msg, size_t cap) {
    if (!atomic_load(&C.lost)) return 0;
    if (msg && cap) {
        pthread_mutex_lock(&C.mu);
        snprintf(msg, cap, "%s", C.lost_msg);
        pthread_mutex_unlock(&C.mu);
    }
    return 1;
}

static void *exit_timer(void *arg) {
    (void)arg;
    sleep(LOST_EXIT_S);
    zs_log_error("cluster lost %d s ago and this process is still running: exiting", LOST_EXIT_S);
    _exit(3);
    return NULL;
}

void zs_cluster_set_lost(const char *why) {
    pthread_mutex_lock(&C.mu);
    if (atomic_load(&C.lost)) {
        pthread_mutex_unlock(&C.mu);
        return;
    }
    snprintf(C.lost_msg, sizeof C.lost_msg, "%s", why);
    atomic_store(&C.lost, 1);
    int n = C.n_cb;
    pthread_mutex_unlock(&C.mu);
    zs_log_error("%s", why);
    for (int i = 0; i < n; i++) C.cb[i](C.cb_ud[i], why);
    pthread_t th;
    if (pthread_create(&th, NULL, exit_timer, NULL) == 0) pthread_detach(th);
}

int zs_cluster_on_lost(void (*fn)(void *ud, const char *msg), void *ud) {
    pthread_mutex_lock(&C.mu);
    if (C.n_cb >= MAX_CBS) {
        pthread_mutex_unlock(&C.mu);
        return zs_err(ZS_ENOSPC, "cluster: too many loss callbacks");
    }
    C.cb[C.n_cb] = fn;
    C.cb_ud[C.n_cb] = ud;
    C.n_cb++;
    pthread_mutex_unlock(&C.mu);
    return 0;
}

static int mpi_fail(int code, const char *what) {
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(code, s, &len);
    return zs_err(ZS_EIO, "cluster: %s failed: %.*s", what, len, s);
}

/* Polls a request to completion; ZS_ECANCELLED once the cluster is lost. */
static int wait_req(MPI_Request *rq, const char *what) {
    long spins = 0;
    for (;;) {
        int done = 0, rc = MPI_Test(rq, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return mpi_fail(rc, what);
        if (done) return 0;
        if (atomic_load(&C.lost)) {
            char m[512];
            zs_cluster_lost(m, sizeof m);
            return zs_err(ZS_ECANCELLED, "cluster: %s cancelled: %s", what, m);
        }
        if (++spins > 64) {
            struct timespec ts = {0, spins > 20000 ? 1000000 : 50000};
            nanosleep(&ts, NULL);
        }
    }
}

static int single(void) { return !C.mpi; }

int zs_cluster_bcast(void *buf, size_t bytes, int root) {
    if (single() || bytes == 0) return 0;
    if (bytes > INT32_MAX) return zs_err(ZS_ERANGE, "cluster: broadcast of %zu bytes is too large", bytes);
    MPI_Request rq;
    int rc = MPI_Ibcast(buf, (int)bytes, MPI_BYTE, root, C.ctl, &rq);
    return rc != MPI_SUCCESS ? mpi_fail(rc, "broadcast") : wait_req(&rq, "broadcast");
}

int zs_cluster_all_gather(const void *send, void *recv, size_t bytes) {
    if (single()) {
        if (bytes && recv != send) memmove(recv, send, bytes);
        return 0;
    }
    if (bytes > INT32_MAX) return zs_err(ZS_ERANGE, "cluster: all_gather of %zu bytes is too large", bytes);
    MPI_Request rq;
    int rc = MPI_Iallgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, C.ctl, &rq);
    return rc != MPI_SUCCESS ? mpi_fail(rc, "all_gather") : wait_req(&rq, "all_gather");
}

int zs_cluster_min_int(int local, int *global) {
    *global = local;
    if (single()) return 0;
    MPI_Request rq;
    int rc = MPI_Iallreduce(&local, global, 1, MPI_INT, MPI_MIN, C.ctl, &rq);
    return rc != MPI_SUCCESS ? mpi_fail(rc, "agreement") : wait_req(&rq, "agreement");
}

int zs_cluster_barrier(void) {
    if (single()) return 0;
    MPI_Request rq;
    int rc = MPI_Ibarrier(C.ctl, &rq);
    return rc != MPI_SUCCESS ? mpi_fail(rc, "barrier") : wait_req(&rq, "barrier");
}

int zs_cluster_new_mpi_comm(int *handle) {
    if (single()) return zs_err(ZS_EUNSUPPORTED, "cluster: not started under mpirun");
    MPI_Comm c;
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &c);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Comm_dup");
    MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
    *handle = (int)MPI_Comm_c2f(c);
    return 0;
}

void zs_cluster_free_mpi_comm(int handle) {
    if (single()) return;
    MPI_Comm c = MPI_Comm_f2c((MPI_Fint)handle);
    /* MPI_Comm_free is collective in effect for pending traffic; after a loss, leave it */
    if (c != MPI_COMM_NULL && !atomic_load(&C.lost)) MPI_Comm_free(&c);
}

/* ---- liveness ---- */

static void keepalive(int fd) {
    int on = 1, idle = 5, intvl = 2, cnt = 3;
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
}

static const char *who(int p, char *buf, size_t cap) {
    snprintf(buf, cap, "process %d (pid %d on %s)", p, (int)C.procs[p].pid, C.procs[p].host);
    return buf;
}

static void *watch_main(void *arg) {
    (void)arg;
    /* signals are for the main thread (a server waits for SIGTERM and SIGUSR1 in sigwait) */
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    int n = C.rank == 0 ? C.size : 1;
    struct pollfd *pf = calloc((size_t)n + 1, sizeof *pf);
    int *proc = calloc((size_t)n + 1, sizeof *proc);
    if (!pf || !proc) {
        free(pf);
        free(proc);
        return NULL;
    }
    for (;;) {
        int k = 0;
        pf[k++] = (struct pollfd){C.wake[0], POLLIN, 0};
        for (int p = 0; p < (C.rank == 0 ? C.size : 1); p++)
            if (C.fds[p] >= 0) {
                proc[k] = C.rank == 0 ? p : 0;
                pf[k++] = (struct pollfd){C.fds[p], POLLIN, 0};
            }
        if (k == 1) break;
        int r = poll(pf, (nfds_t)k, -1);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 || (pf[0].revents & (POLLIN | POLLHUP))) break;
        for (int i = 1; i < k; i++) {
            if (!pf[i].revents) continue;
            char b[64];
            ssize_t got = recv(pf[i].fd, b, sizeof b, MSG_DONTWAIT);
            if (got > 0 || (got < 0 && (errno == EAGAIN || errno == EINTR))) continue;
            int e = got < 0 ? errno : 0;
            int p = proc[i];
            int slot = C.rank == 0 ? p : 0;
            close(C.fds[slot]);
            C.fds[slot] = -1;
            if (atomic_load(&C.closing)) continue;
            char w[128], msg[512];
            if (C.rank == 0)
                snprintf(msg, sizeof msg, "%s is gone: %s", who(p, w, sizeof w),
                         e ? strerror(e) : "its connection to process 0 closed");
            else
                snprintf(msg, sizeof msg, "%s is gone: %s; this follower stops", who(0, w, sizeof w),
                         e ? strerror(e) : "its connection closed");
            zs_cluster_set_lost(msg);
        }
    }
    free(pf);
    free(proc);
    return NULL;
}

/* The IPv4 addresses of this host, loopback last. */
static int local_addrs(leader_addr *la) {
    struct ifaddrs *ifa = NULL;
    la->n = 0;
    if (getifaddrs(&ifa) == 0) {
        for (int pass = 0; pass < 2; pass++)
            for (struct ifaddrs *i = ifa; i && la->n < MAX_ADDRS; i = i->ifa_next) {
                if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP)) continue;
                int lo = (i->ifa_flags & IFF_LOOPBACK) != 0;
                if (lo != pass) continue;
                la->addr[la->n++] = ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr;
            }
        freeifaddrs(ifa);
    }
    if (la->n == 0) la->addr[la->n++] = htonl(INADDR_LOOPBACK);
    return 0;
}

static int connect_to(uint32_t addr, uint16_t port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return -1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = addr};
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0 && errno != EINPROGRESS) {
        close(fd);
        return -1;
    }
    struct pollfd pf = {fd, POLLOUT, 0};
    int err = 0;
    socklen_t el = sizeof err;
    if (poll(&pf, 1, CONNECT_TIMEOUT_MS) != 1 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0 || err) {
        close(fd);
        return -1;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    return fd;
}

static int write_all(int fd, const void *p, size_t n) {
    const char *c = p;
    while (n) {
        ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Process 0 listens; followers connect and say who they are. Returns this process's status
 * (the caller agrees on it with the others). */
static int liveness_setup(void) {
    leader_addr la;
    memset(&la, 0, sizeof la);
    int lfd = -1, rc = 0;
    if (C.rank == 0) {
        lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0, .sin_addr.s_addr = htonl(INADDR_ANY)};
        socklen_t sl = sizeof sa;
        if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(lfd, C.size) != 0 ||
            getsockname(lfd, (struct sockaddr *)&sa, &sl) != 0)
            rc = zs_err(ZS_EIO, "cluster: process 0 cannot listen for its followers: %s", strerror(errno));
        else
            la.port = ntohs(sa.sin_port);
        local_addrs(&la);
    }
    /* the address goes out even after a failure (port 0): everybody must take part */
    int brc = MPI_Bcast(&la, (int)sizeof la, MPI_BYTE, 0, C.ctl);
    if (brc != MPI_SUCCESS && rc == 0) rc = mpi_fail(brc, "broadcast of process 0's address");
    if (C.rank == 0) {
        int need = C.size - 1;
        double t0 = zs_now();
        while (rc == 0 && need > 0) {
            struct pollfd pf = {lfd, POLLIN, 0};
            int left = ACCEPT_TIMEOUT_MS - (int)((zs_now() - t0) * 1000);
            if (left <= 0 || poll(&pf, 1, left) != 1) {
                rc = zs_err(ZS_EIO, "cluster: %d follower(s) did not connect to process 0 (port %u) within %d s",
                            need, la.port, ACCEPT_TIMEOUT_MS / 1000);
                break;
            }
            int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
            if (fd < 0) continue;
            int32_t hello[2];
            struct pollfd rp = {fd, POLLIN, 0};
            if (poll(&rp, 1, 5000) != 1 || recv(fd, hello, sizeof hello, MSG_WAITALL) != (ssize_t)sizeof hello ||
                hello[0] <= 0 || hello[0] >= C.size || C.fds[hello[0]] >= 0 || hello[1] != C.procs[hello[0]].pid) {
                close(fd); /* not one of ours */
                continue;
            }
            keepalive(fd);
            C.fds[hello[0]] = fd;
            need--;
        }
        if (lfd >= 0) close(lfd);
    } else if (la.port) {
        int fd = -1;
        /* on process 0's host, loopback first */
        if (!strcmp(C.procs[0].host, C.procs[C.rank].host)) fd = connect_to(htonl(INADDR_LOOPBACK), la.port);
        for (int i = 0; fd < 0 && i < la.n; i++) fd = connect_to(la.addr[i], la.port);
        int32_t hello[2] = {C.rank, C.procs[C.rank].pid};
        if (fd < 0 || write_all(fd, hello, sizeof hello) != 0) {
            if (fd >= 0) close(fd);
            rc = zs_err(ZS_EIO, "cluster: process %d cannot connect to process 0 on %s port %u (%d address(es) tried)",
                        C.rank, C.procs[0].host, la.port, la.n);
        } else {
            keepalive(fd);
            C.fds[0] = fd;
        }
    } else {
        rc = zs_err(ZS_EIO, "cluster: process 0 could not listen for its followers");
    }
    return rc;
}

static int launched_by_mpi(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_SIZE");
}

int zs_cluster_init(int *argc, char ***argv) {
    if (C.inited) return 0;
    C.inited = 1;
    C.rank = 0;
    C.size = 1;
    if (!launched_by_mpi()) return 0;
    int prov = 0;
    int rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &prov);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Init_thread");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &C.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &C.size);
    if (C.size == 1) { /* mpirun -np 1: nothing to join */
        MPI_Finalize();
        C.rank = 0;
        return 0;
    }
    C.mpi = 1;
    if (prov < MPI_THREAD_MULTIPLE)
        return zs_err(ZS_EUNSUPPORTED, "cluster: this MPI library does not support MPI_THREAD_MULTIPLE (got level %d)", prov);
    if ((rc = MPI_Comm_dup(MPI_COMM_WORLD, &C.ctl)) != MPI_SUCCESS) return mpi_fail(rc, "MPI_Comm_dup");
    MPI_Comm_set_errhandler(C.ctl, MPI_ERRORS_RETURN);
    MPI_Comm node;
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
        MPI_Comm_rank(node, &C.node_rank);
        MPI_Comm_size(node, &C.node_size);
        MPI_Comm_free(&node);
    }
    /* several processes on one host share its cores: each kernel thread pool takes its part
     * (kernels/cpu/pool.c reads ZS_THREADS when it starts) */
    if (C.node_size > 1 && !getenv("ZS_THREADS")) {
        char nt[16];
        snprintf(nt, sizeof nt, "%ld", ZS_MAX(1L, sysconf(_SC_NPROCESSORS_ONLN) / C.node_size));
        setenv("ZS_THREADS", nt, 0);
    }
    C.procs = calloc((size_t)C.size, sizeof *C.procs);
    C.fds = malloc((size_t)C.size * sizeof *C.fds);
    if (!C.procs || !C.fds) return zs_err(ZS_ENOMEM, "out of memory");
    for (int p = 0; p < C.size; p++) C.fds[p] = -1;
    proc_info me = {(int32_t)getpid(), ""};
    if (gethostname(me.host, sizeof me.host - 1) != 0) snprintf(me.host, sizeof me.host, "?");
    if ((rc = MPI_Allgather(&me, (int)sizeof me, MPI_BYTE, C.procs, (int)sizeof me, MPI_BYTE, C.ctl)) != MPI_SUCCESS)
        return mpi_fail(rc, "exchange of process information");
    int st = liveness_setup(), all = 0;
    char err[512];
    snprintf(err, sizeof err, "%s", st < 0 ? zs_errmsg() : "");
    if ((rc = MPI_Allreduce(&st, &all, 1, MPI_INT, MPI_MIN, C.ctl)) != MPI_SUCCESS) return mpi_fail(rc, "start-up agreement");
    if (all < 0) return st < 0 ? zs_err(st, "%s", err) : zs_err(all, "cluster: another process failed to start (see its log)");
    if (pipe2(C.wake, O_CLOEXEC) != 0) return zs_err(ZS_EIO, "cluster: pipe: %s", strerror(errno));
    if (pthread_create(&C.watch, NULL, watch_main, NULL) != 0) return zs_err(ZS_EIO, "cluster: cannot start the watch thread");
    C.watching = 1;
    if (C.rank == 0) { /* always shown: the pids are what an operator needs to find a process */
        char line[2048];
        int at = snprintf(line, sizeof line, "zeroserve: a world of %d processes:", C.size);
        for (int p = 0; p < C.size && at < (int)sizeof line - 80; p++)
            at += snprintf(line + at, sizeof line - (size_t)at, "%s process %d pid %d on %s", p ? "," : "", p,
                           (int)C.procs[p].pid, C.procs[p].host);
        fprintf(stderr, "%s\n", line);
    }
    return 0;
}

void zs_cluster_finalize(void) {
    if (!C.mpi) return;
    /* closing first: after the barrier every process has set it, so a peer's connection that
     * closes from then on is an orderly end */
    atomic_store(&C.closing, 1);
    int ok = !atomic_load(&C.lost) && zs_cluster_barrier() == 0;
    if (C.watching) {
        if (write(C.wake[1], "q", 1) < 0) { /* the thread also ends when every peer closed */ }
        pthread_join(C.watch, NULL);
        C.watching = 0;
    }
    for (int p = 0; C.fds && p < C.size; p++)
        if (C.fds[p] >= 0) close(C.fds[p]);
    if (C.wake[0] >= 0) close(C.wake[0]);
    if (C.wake[1] >= 0) close(C.wake[1]);
    free(C.fds);
    C.fds = NULL;
    if (ok) {
        MPI_Comm_free(&C.ctl);
        MPI_Finalize();
    }
    free(C.procs);
    C.procs = NULL;
    C.mpi = 0;
}
