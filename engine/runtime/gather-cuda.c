/* gather-cuda.c — the gather coordinator's device operations (gather.h, zs_gather_dev) for a
 * rank on a CUDA device: device buffers from the rank's pool, and the assembly of a full bucket
 * on the device.
 *
 * Queues and events (per full-bucket buffer: copied, ready, retired):
 *   copy queue:   waits `retired` (the compute queue's last use of the buffer), then copies this
 *                 rank's shard (pinned host or device) into its place in the buffer; `copied`.
 *   comm queue:   NCCL: waits `copied` (or `retired` for a device shard), ncclAllGather in place
 *                 (out of place from a device shard); `ready`. The prefetch thread then waits for
 *                 the comm queue, because the agreement before the next bucket is a collective on
 *                 another stream (comm-nccl.c's internal one) and two ranks must not run the
 *                 communicator's kernels in different orders.
 *   local comm:   ranks that share a device (NCCL refuses two ranks on one GPU), or any group
 *                 built on the in-process communicator: after the own copy, the ranks exchange
 *                 the addresses of their buffers through the local all_gather and each copies
 *                 the other ranks' shards device-to-device (cudaMemcpyDefault: peer copies
 *                 between devices too) on its copy queue, waits for them, and a barrier keeps
 *                 every buffer alive until all ranks have read it; `ready` on the copy queue.
 *   compute queue: waits `ready` at acquire, records `retired` at release.
 * A transient source (an NVMe read slot) is waited for before returning, so the slot can be
 * given back; a cpu-tier shard is read asynchronously (registered memory, stays valid). */
#include <string.h>

#include "comm.h"
#include "common.h"
#include "device-impl.h"
#include "gather-cuda.h"

static int cu(cudaError_t e, zs_dev *d, const char *what) {
    if (e == cudaSuccess) return 0;
    cudaGetLastError();
    return zs_err(ZS_EDEVICE, "CUDA device %d: %s: %s", d->id, what, cudaGetErrorString(e));
}

static void *gd_alloc(void *ctx, size_t bytes) { return zs_dev_alloc(ctx, bytes); }

static void gd_free(void *ctx, void *p) {
    zs_dev *d = ctx;
    zs_dev_bufev *ev = zs_dev_buf_events(d, p);
    cudaSetDevice(d->id);
    if (ev) {
        cudaEventSynchronize(ev->retired);
        cudaEventSynchronize(ev->copied); /* a gather that failed after its copy records no ready */
        cudaEventSynchronize(ev->ready);
    } else {
        zs_dev_sync(d);
    }
    zs_dev_release(d, p);
}

static int gd_upload(void *ctx, void *dst, const void *src, size_t bytes) {
    return zs_dev_upload(ctx, dst, src, bytes);
}

static int gather_q(zs_dev *d, zs_comm *comm, const void *src, int kind, void *full, size_t shard);

/* A gather that fails leaves no copy queued: its source (a read slot, the pinned cpu tier) may be
 * released or unregistered as soon as the caller hears of the failure. */
static int gd_gather(void *ctx, zs_comm *comm, const void *src, int kind, void *full, size_t shard) {
    zs_dev *d = ctx;
    ZS_CHECK(zs_dev_set_current(d));
    int rc = gather_q(d, comm, src, kind, full, shard);
    if (rc < 0) cudaStreamSynchronize(d->q[ZS_Q_COPY]);
    return rc;
}

static int gather_q(zs_dev *d, zs_comm *comm, const void *src, int kind, void *full, size_t shard) {
    zs_dev_bufev *ev = zs_dev_buf_events(d, full);
    if (!ev) return ZS_ENOMEM;
    int rank = zs_comm_rank(comm), n = zs_comm_size(comm);
    char *mine = (char *)full + (size_t)rank * shard;
    cudaStream_t cq = d->q[ZS_Q_COPY], mq = d->q[ZS_Q_COMM];
    int nccl = n > 1 && !strcmp(zs_comm_name(comm), "nccl");

    if (nccl) {
        if (kind == ZS_GSRC_DEVICE) {
            ZS_CHECK(cu(cudaStreamWaitEvent(mq, ev->retired, 0), d, "cudaStreamWaitEvent"));
            ZS_CHECK(zs_comm_all_gather(comm, src, full, shard, mq));
        } else {
            ZS_CHECK(cu(cudaStreamWaitEvent(cq, ev->retired, 0), d, "cudaStreamWaitEvent"));
            ZS_CHECK(cu(cudaMemcpyAsync(mine, src, shard, cudaMemcpyHostToDevice, cq), d, "shard copy"));
            int rc = cu(cudaEventRecord(ev->copied, cq), d, "cudaEventRecord");
            if (rc == 0) rc = cu(cudaStreamWaitEvent(mq, ev->copied, 0), d, "cudaStreamWaitEvent");
            if (rc == 0) rc = zs_comm_all_gather(comm, mine, full, shard, mq);
            /* a read slot goes back to the pool when this returns: its copy must be done, also
             * when the all_gather failed (an abort) */
            if (kind == ZS_GSRC_HOST_TRANSIENT) {
                int src = cu(cudaStreamSynchronize(cq), d, "shard copy");
                if (rc == 0) rc = src;
            }
            ZS_CHECK(rc);
        }
        ZS_CHECK(cu(cudaEventRecord(ev->ready, mq), d, "cudaEventRecord"));
        /* the next collective of this communicator (zs_comm_agree) runs on NCCL's internal
         * stream: wait here so that the ranks' NCCL kernels never run in different orders; by
         * polling, so that an abort (a peer that stopped prefetching) ends the wait */
        return zs_comm_wait(comm, mq);
    }

    ZS_CHECK(cu(cudaStreamWaitEvent(cq, ev->retired, 0), d, "cudaStreamWaitEvent"));
    ZS_CHECK(cu(cudaMemcpyAsync(mine, src, shard, cudaMemcpyDefault, cq), d, "shard copy"));
    if (n == 1) {
        int rc = cu(cudaEventRecord(ev->ready, cq), d, "cudaEventRecord");
        if (kind == ZS_GSRC_HOST_TRANSIENT) { /* the read slot's copy is done before it goes back */
            int src = cu(cudaStreamSynchronize(cq), d, "shard copy");
            if (rc == 0) rc = src;
        }
        return rc;
    }
    /* local communicator: every rank's own shard is in place before the addresses go out */
    int rc = cu(cudaStreamSynchronize(cq), d, "shard copy");
    /* a failed copy still takes part in the exchange (as a NULL address) so no rank hangs */
    void *self = rc == 0 ? full : NULL;
    void **peers = calloc((size_t)n, sizeof(void *));
    if (!peers) {
        zs_comm_abort(comm);
        return zs_err(ZS_ENOMEM, "out of memory");
    }
    int xrc = zs_comm_all_gather(comm, &self, peers, sizeof(void *), NULL);
    if (xrc < 0) {
        free(peers);
        return xrc;
    }
    for (int j = 0; j < n && rc == 0; j++) {
        if (j == rank) continue;
        if (!peers[j]) {
            rc = zs_err(ZS_EDEVICE, "rank %d: the shard copy of rank %d failed", rank, j);
            break;
        }
        rc = cu(cudaMemcpyAsync((char *)full + (size_t)j * shard, (const char *)peers[j] + (size_t)j * shard, shard,
                                cudaMemcpyDefault, cq), d, "peer shard copy");
    }
    int src2 = cu(cudaStreamSynchronize(cq), d, "peer shard copy");
    if (rc == 0) rc = src2;
    free(peers);
    /* nobody may reuse its buffer before every rank has read its shard from it */
    int brc = zs_comm_barrier(comm);
    if (rc == 0) rc = brc;
    if (rc == 0) rc = cu(cudaEventRecord(ev->ready, cq), d, "cudaEventRecord");
    return rc;
}

/* ---- ready / retire (compute thread) ----
 * The hooks of gather.h return nothing, so a failure is handled here in two steps: the order it
 * was to establish is made another way (the host waits instead of the queue), so no kernel reads
 * a half-gathered bucket and no gather overwrites a bucket still being read; and the error is
 * kept for the calling thread, whose forward pass takes it with zs_dev_gather_take_error
 * (gather-cuda.h) after acquire/release and fails the step with it. */

static _Thread_local int pend_rc;        /* first failure not yet taken (0: none) */
static _Thread_local char pend_msg[512];

static int keep(int rc) {
    if (rc < 0 && pend_rc == 0) {
        pend_rc = rc;
        snprintf(pend_msg, sizeof pend_msg, "%s", zs_errmsg());
    }
    return rc;
}

int zs_dev_gather_take_error(void) {
    int rc = pend_rc;
    if (rc == 0) return 0;
    pend_rc = 0;
    return zs_err(rc, "%s", pend_msg);
}

/* The host waits instead of a queue, after a failed wait/record: for event ev, else for the
 * compute queue (compute_only) or all three queues. The failure's message stays. */
static int fallback(int rc, zs_dev *d, cudaEvent_t ev, int compute_only) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", zs_errmsg());
    cudaError_t e = ev ? cudaEventSynchronize(ev)
                       : compute_only ? cudaStreamSynchronize(d->q[ZS_Q_COMPUTE]) : cudaErrorUnknown;
    if (e != cudaSuccess) {
        cudaGetLastError();
        zs_dev_sync(d); /* all three queues (also the last resort) */
    }
    return zs_err(rc, "%s", msg);
}

/* The compute queue waits for the gather of full; else the host waits for it. */
static int gd_ready_rc(zs_dev *d, const void *full) {
    zs_dev_bufev *ev = zs_dev_buf_events(d, full);
    if (!ev) /* cannot happen after a gather created the events; stay safe */
        return fallback(zs_err_prefix(ZS_EDEVICE, "CUDA device %d: the events of a gathered bucket", d->id), d,
                        NULL, 0);
    int rc = cu(cudaSetDevice(d->id), d, "cudaSetDevice (waiting for a gathered bucket)");
    if (rc == 0) rc = cu(cudaStreamWaitEvent(d->q[ZS_Q_COMPUTE], ev->ready, 0), d,
                         "cudaStreamWaitEvent (compute queue waits for a gathered bucket)");
    return rc < 0 ? fallback(rc, d, ev->ready, 0) : 0;
}

/* The compute queue's last use of full is recorded (the next gather into it waits for that);
 * else the host waits for the compute queue, so the event's older state is safe to wait for. */
static int gd_retire_rc(zs_dev *d, const void *full) {
    zs_dev_bufev *ev = zs_dev_buf_events(d, full);
    if (!ev)
        return fallback(zs_err_prefix(ZS_EDEVICE, "CUDA device %d: the events of a gathered bucket", d->id), d,
                        NULL, 1);
    int rc = cu(cudaSetDevice(d->id), d, "cudaSetDevice (retiring a gathered bucket)");
    if (rc == 0) rc = cu(cudaEventRecord(ev->retired, d->q[ZS_Q_COMPUTE]), d,
                         "cudaEventRecord (compute queue's last use of a gathered bucket)");
    return rc < 0 ? fallback(rc, d, NULL, 1) : 0;
}

static void gd_ready(void *ctx, const void *full) {
    if (keep(gd_ready_rc(ctx, full)) < 0) zs_log_error("%s", zs_errmsg());
}

static void gd_retire(void *ctx, const void *full) {
    if (keep(gd_retire_rc(ctx, full)) < 0) zs_log_error("%s", zs_errmsg());
}

void zs_dev_gather_ops(zs_dev *d, zs_gather_dev *ops) {
    *ops = (zs_gather_dev){d, gd_alloc, gd_free, gd_upload, gd_gather, gd_ready, gd_retire};
}
