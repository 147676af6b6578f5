/* gather-read.c — the NVMe reads under the gather coordinator (gather-impl.h): each completion
 * filed with its ring item or expert read, waiting for one item's read, and the repair of a
 * truncated or corrupt shard from the checkpoint. The bottom of the coordinator: gather.c's
 * prefetch thread and gather-experts.c call these; these call neither. Prefetch thread only. */
#include <string.h>
#include <sys/stat.h>

#include "common.h"
#include "gather-impl.h"

/* Waits for one NVMe completion and files it with its item or expert read; a failure of the
 * reader itself fails every read in flight. */
void zs_gather_reap(zs_gather *g) {
    uint64_t tag;
    int status;
    int r = zs_shard_reader_poll(g->reader, 1, &tag, &status);
    if (r < 0) {
        char msg[240];
        snprintf(msg, sizeof msg, "%s", zs_errmsg());
        for (long j = g->produced; j < g->submitted; j++) {
            item_t *it = zs_gather_ring_at(g, j);
            if (it->read_done) continue;
            it->read_done = 1;
            it->read_status = r;
            snprintf(it->msg, sizeof it->msg, "%s", msg);
        }
        for (int i = 0; g->xr && i < zs_pinned_count(g->slots); i++)
            if (g->xr[i].busy && !g->xr[i].done) {
                g->xr[i].done = 1;
                g->xr[i].status = r;
                snprintf(g->xr[i].msg, sizeof g->xr[i].msg, "%s", msg);
            }
        return;
    }
    if (r == 0) return;
    if (tag & XTAG) {
        xread_t *x = &g->xr[(int)(tag & 0xffff)];
        x->done = 1;
        x->status = status;
        if (status < 0) snprintf(x->msg, sizeof x->msg, "%s", zs_errmsg());
        return;
    }
    item_t *d = zs_gather_ring_at(g, (long)tag);
    d->read_done = 1;
    d->read_status = status;
    if (status < 0) snprintf(d->msg, sizeof d->msg, "%s", zs_errmsg());
}

/* Waits until item k's read is done, reaping other completions on the way. */
void zs_gather_wait_read(zs_gather *g, long k) {
    item_t *it = zs_gather_ring_at(g, k);
    while (!it->read_done) zs_gather_reap(g);
}

/* Rewrites bucket b's shard, and every shard past the end of a truncated file, from the
 * checkpoint; then reads again the shards of those buckets that were already in flight. */
void zs_gather_repair(zs_gather *g, int bad, long k, unsigned char *fixed) {
    struct stat sb;
    off_t size = stat(zs_shard_file_path(g->file), &sb) == 0 ? sb.st_size : 0;
    for (int b = 0; b < g->n_buckets; b++) {
        size_t off = zs_shard_file_offset(g->file, b), n = zs_shard_file_bytes(g->file, b);
        if (n == 0 || (b != bad && (off_t)(off + n) <= size)) continue;
        const zs_bucket_layout *L = zs_model_layout(g->m, b);
        char *full = zs_aligned_alloc(4096, g->full_bytes[b]);
        int rc = full ? zs_model_pack_bucket(g->m, b, full, NULL) : zs_err(ZS_ENOMEM, "out of memory");
        if (rc == 0) {
            memset(full + L->data_bytes, 0, g->full_bytes[b] - L->data_bytes);
            rc = zs_shard_file_repair(g->file, b, full + (size_t)g->rank * g->shard_bytes[b]);
        }
        free(full);
        char lb[32];
        if (rc == 0) {
            fixed[b] = 1;
            g->st.repairs++;
            zs_log_warn("rank %d: rewrote the %s shard of %s from the checkpoint", g->rank,
                        zs_bucket_label(g->m, b, lb, sizeof lb), zs_shard_file_path(g->file));
        } else {
            zs_log_error("rank %d: cannot repair the %s shard: %s", g->rank,
                         zs_bucket_label(g->m, b, lb, sizeof lb), zs_errmsg());
        }
    }
    for (long j = k + 1; j < g->submitted; j++) {
        item_t *it = zs_gather_ring_at(g, j);
        if (it->slot < 0 || it->bucket < 0 || !fixed[it->bucket]) continue;
        zs_gather_wait_read(g, j);
        it->read_done = 0;
        it->read_status = 0;
        it->msg[0] = 0;
        int rc = zs_shard_reader_submit(g->reader, it->bucket, it->slot, (uint64_t)j);
        if (rc < 0) {
            it->read_done = 1;
            it->read_status = rc;
            snprintf(it->msg, sizeof it->msg, "%s", zs_errmsg());
        }
    }
}
