/* gather.c — the ZeRO-3 gather coordinator of one rank: shard storage per tier, the prefetch
 * thread (read -> agree -> all_gather -> publish, in pass order, within the live budget), the
 * acquire/release weight source, counters, and reading / writing back one shard of any tier
 * between passes (training). Every pass is a range of the training order; the prefetch thread
 * works on the current pass and on the next one when it is known (declared at the begin, or the
 * inference pass while speculation is on), never further: a begun pass adopts the known next one
 * when it extends it, else that one is first consumed whole on every rank (wasted). The experts
 * of a mixture of experts (their marks in the pass order, the cache) are in gather-experts.c;
 * NVMe completions and the repair of truncated or corrupt shards in gather-read.c. */
#include "gather.h"

#include <pthread.h>
#include <string.h>

#include "common.h"
#include "device.h"
#include "gather-impl.h"

size_t zs_partition_shard_bytes(const zs_model *m, int bucket, int nranks) {
    size_t d = zs_model_layout(m, bucket)->data_bytes;
    if (d == 0) return 0;
    return ZS_ALIGN_UP((d + (size_t)nranks - 1) / (size_t)nranks, 4096);
}

int zs_gather_new(const zs_model *m, int rank, int nranks, zs_comm *comm, const zs_gather_opts *o,
                  zs_gather **out) {
    zs_gather *g = calloc(1, sizeof *g);
    if (!g) return zs_err(ZS_ENOMEM, "out of memory");
    g->m = m;
    g->rank = rank;
    g->nranks = nranks;
    g->comm = comm;
    g->o = *o;
    g->o.dev = NULL;
    if (o->dev) {
        g->dv = *o->dev;
        g->has_dev = 1;
    }
    if (g->o.buffer_count <= 0) g->o.buffer_count = 4;
    g->n_buckets = zs_model_n_buckets(m);
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->shard_bytes = calloc((size_t)g->n_buckets, sizeof(size_t));
    g->full_bytes = calloc((size_t)g->n_buckets, sizeof(size_t));
    g->shards = calloc((size_t)g->n_buckets, sizeof(void *));
    if (!g->shard_bytes || !g->full_bytes || !g->shards) goto nomem;
    size_t total = 0, max_shard = 0;
    if (o->replicate && (o->tier == ZS_OFFLOAD_NVME || o->dev)) {
        zs_gather_free(g);
        return zs_err(ZS_EUNSUPPORTED, "ZeRO stages 1 and 2 (replicated parameters) need --offload none or cpu on the CPU device");
    }
    for (int b = 0; b < g->n_buckets; b++) {
        g->shard_bytes[b] = zs_partition_shard_bytes(m, b, nranks) * (o->replicate ? (size_t)nranks : 1);
        g->full_bytes[b] = g->shard_bytes[b] * (o->replicate ? 1 : (size_t)nranks);
        max_shard = ZS_MAX(max_shard, g->shard_bytes[b]);
        total += g->shard_bytes[b];
    }
    int nl = zs_model_config_get(m)->n_layers, omax = zs_model_pass_order_max(m);
    g->order = malloc((size_t)omax * sizeof(int));
    g->torder = malloc((size_t)(omax + 2 * nl) * sizeof(int));
    if (!g->order || !g->torder) goto nomem;
    g->n_order = zs_model_pass_order(m, g->order);
    /* training: embeddings, layers, head (+ embeddings again for a tied head: both at once),
     * then the layers in reverse for the backward pass (the embedding backward reads no weights),
     * each MoE layer followed by its experts' mark again */
    for (int i = 0; i < g->n_order; i++) g->torder[g->n_torder++] = g->order[i];
    for (int l = nl - 1; l >= 0; l--) {
        g->torder[g->n_torder++] = zs_bucket_layer(l);
        if (zs_bucket_expert(m, l, 0) >= 0) g->torder[g->n_torder++] = ZS_PASS_EXPERTS(l);
    }
    /* every pass kind is a range of torder: the inference pass is its prefix */
    ZS_ASSERT(g->n_torder >= g->n_order && memcmp(g->torder, g->order, (size_t)g->n_order * sizeof(int)) == 0);
    g->max_len = ZS_MAX(g->n_order, g->n_torder);
    /* no pass yet (an empty one, ended); speculation on: the first inference pass is the next */
    g->spec = 1;
    g->cur_ended = 1;
    g->has_next = 1;
    g->next = (zs_pass_range){0, g->n_order};
    /* on a GPU a cpu-tier shard is host memory, so it still goes through the pipeline */
    g->direct = (nranks == 1 || o->replicate) &&
                (g->has_dev ? o->tier == ZS_OFFLOAD_NONE : o->tier != ZS_OFFLOAD_NVME);
    for (int b = 0; b < g->n_buckets; b++)
        if (!zs_bucket_is_expert(m, b, NULL, NULL)) g->max_static_full = ZS_MAX(g->max_static_full, g->full_bytes[b]);
    int xrc = zs_gx_init(g); /* the experts' share of the budget; sets live_limit */
    if (xrc < 0) {
        zs_gather_free(g);
        return xrc;
    }
    g->st.live_limit = g->live_limit;
    if (o->tier == ZS_OFFLOAD_NONE) {
        for (int b = 0; b < g->n_buckets; b++) {
            if (!g->shard_bytes[b]) continue;
            g->shards[b] = g->has_dev ? g->dv.alloc(g->dv.ctx, g->shard_bytes[b])
                                      : zs_aligned_alloc(4096, g->shard_bytes[b]);
            if (!g->shards[b]) goto nomem;
        }
    } else if (o->tier == ZS_OFFLOAD_CPU) {
        int rc = zs_pinned_init(ZS_MAX(total, 4096), 1, &g->pinned_all);
        if (rc < 0) { zs_gather_free(g); return rc; }
        char *p = zs_pinned_slot(g->pinned_all, 0);
        for (int b = 0; b < g->n_buckets; b++) {
            g->shards[b] = g->shard_bytes[b] ? p : NULL;
            p += g->shard_bytes[b];
        }
    } else {
        /* a read slot never runs a full pass ahead: the slot count stays below the pass length */
        int n = ZS_MIN(g->o.buffer_count, ZS_MAX(1, g->n_order - 1));
        n = ZS_MIN(n, 64);
        int rc = zs_pinned_init(ZS_MAX(max_shard, 4096), n, &g->slots);
        if (rc < 0) { zs_gather_free(g); return rc; }
        if (g->moe) {
            g->xr = calloc((size_t)n, sizeof *g->xr);
            g->xsync = zs_aligned_alloc(4096, ZS_MAX(max_shard, 4096));
            if (!g->xr || !g->xsync) goto nomem;
        }
    }
    g->ring_n = g->max_len + g->o.buffer_count + 2;
    g->ring = calloc((size_t)g->ring_n, sizeof(item_t));
    if (!g->ring) goto nomem;
    *out = g;
    return 0;
nomem:
    zs_gather_free(g);
    return zs_err(ZS_ENOMEM, "rank %d: out of memory for parameter shards", rank);
}

void *zs_gather_shard_buffer(zs_gather *g, int b) { return g->shards[b]; }

int zs_gather_put_shard(zs_gather *g, int b, const void *src) {
    if (!g->shards[b]) return 0;
    if (g->has_dev && g->o.tier == ZS_OFFLOAD_NONE)
        return g->dv.upload(g->dv.ctx, g->shards[b], src, g->shard_bytes[b]);
    memcpy(g->shards[b], src, g->shard_bytes[b]);
    return 0;
}

int zs_gather_read_shard(zs_gather *g, int b, void *dst) {
    if (!g->shard_bytes[b]) return 0;
    if (g->o.tier == ZS_OFFLOAD_NVME) {
        if (!g->file) return zs_err(ZS_EINVAL, "rank %d: no shard file attached", g->rank);
        return zs_shard_file_read(g->file, b, dst);
    }
    if (g->has_dev && g->o.tier == ZS_OFFLOAD_NONE) {
        /* a device-resident shard (tier none on a GPU) comes down on the copy queue; the device ops'
         * ctx is the rank's zs_dev (zs_dev_gather_ops). Shards are written only by synchronous
         * uploads on that queue (zs_gather_put_shard), and the gathers only read them */
        int rc = zs_dev_download(g->dv.ctx, dst, g->shards[b], g->shard_bytes[b]);
        return rc < 0 ? zs_err_prefix(rc, "rank %d: reading the device shard of bucket %d", g->rank, b) : 0;
    }
    memcpy(dst, g->shards[b], g->shard_bytes[b]);
    return 0;
}

int zs_gather_write_shard(zs_gather *g, int b, const void *src) {
    if (!g->shard_bytes[b]) return 0;
    if (g->moe && !g->direct && zs_bucket_is_expert(g->m, b, NULL, NULL))
        zs_gx_invalidate(g, b); /* the cached full expert is the old one */
    if (g->o.tier != ZS_OFFLOAD_NVME) return zs_gather_put_shard(g, b, src);
    if (!g->file || !g->reader) return zs_err(ZS_EINVAL, "rank %d: no shard file attached", g->rank);
    /* between passes with speculation off and no next pass known (declared, or speculated and
     * not yet adopted or consumed): every item of the last pass was produced and consumed, and
     * the prefetcher reads nothing before the next pass_begin */
    pthread_mutex_lock(&g->mu);
    ZS_ASSERT(!g->spec && !g->has_next);
    ZS_ASSERT(g->consumed == g->cur_start + g->cur.count);
    ZS_ASSERT(g->released == g->consumed && g->produced == g->consumed);
    ZS_ASSERT(g->submitted <= g->produced && zs_shard_reader_inflight(g->reader) == 0);
    pthread_mutex_unlock(&g->mu);
    int rc = zs_shard_file_update(g->file, b, src);
    if (rc == 0) rc = zs_shard_reader_set_checksum(g->reader, b, zs_shard_file_checksum(g->file, b));
    return rc;
}

int zs_gather_attach_file(zs_gather *g, void *shard_file) {
    g->file = shard_file;
    int n = zs_pinned_count(g->slots);
    void *bufs[64];
    size_t sizes[64];
    for (int i = 0; i < n && i < 64; i++) {
        bufs[i] = zs_pinned_slot(g->slots, i);
        sizes[i] = zs_pinned_slot_bytes(g->slots);
    }
    zs_reader_opts ro = {g->o.queue_depth, g->o.block_size, g->o.verify};
    return zs_shard_reader_open(g->file, &ro, bufs, sizes, n, &g->reader);
}

/* ---- full-bucket buffer pool (callers hold g->mu) ---- */

static void *buf_alloc(zs_gather *g, size_t size) {
    return g->has_dev ? g->dv.alloc(g->dv.ctx, size) : zs_aligned_alloc(4096, size);
}

static void buf_free(zs_gather *g, void *p) {
    if (g->has_dev) {
        if (p) g->dv.free(g->dv.ctx, p);
    } else {
        free(p);
    }
}

static void *pool_get(zs_gather *g, size_t size) {
    fbuf **pp = &g->free_bufs, **best = NULL;
    for (; *pp; pp = &(*pp)->next)
        if ((*pp)->cap >= size && (!best || (*pp)->cap < (*best)->cap)) best = pp;
    if (best) {
        fbuf *f = *best;
        *best = f->next;
        void *p = f->p;
        free(f);
        return p;
    }
    /* nothing fits: the cached buffers are too small for this bucket; drop them */
    while (g->free_bufs) {
        fbuf *f = g->free_bufs;
        g->free_bufs = f->next;
        buf_free(g, f->p);
        free(f);
    }
    return buf_alloc(g, size);
}

static void pool_put(zs_gather *g, void *p, size_t cap) {
    fbuf *f = malloc(sizeof *f);
    if (!f) { buf_free(g, p); return; }
    *f = (fbuf){p, cap, g->free_bufs};
    g->free_bufs = f;
}

/* ---- the prefetch thread ---- */

/* The full bytes item k's bucket counts against the live budget (0 for a mark). */
static size_t item_need(const zs_gather *g, int b) { return b >= 0 ? g->full_bytes[b] : 0; }

/* The end (exclusive) of the items the prefetcher may work on now. Under g->mu. */
static long prefetch_limit(const zs_gather *g) {
    long end = g->cur_start + g->cur.count;
    /* into the next pass only once the consumer is inside the current one (or past it) */
    if (g->has_next && (g->cur_ended || g->consumed > g->cur_start)) end += g->next.count;
    /* and never a ring's worth ahead of the consumer (the ring holds max_len + slots + 2 items) */
    return ZS_MIN(end, g->consumed + g->max_len);
}

/* Submits NVMe reads for items [submitted, limit) while slots are free, never past a mark after
 * item cur (the prefetcher's current item): a mark's experts take the slots first. Caller holds
 * no lock. */
static void submit_reads(zs_gather *g, long limit, long cur) {
    while (g->submitted < limit) {
        long j = g->submitted;
        item_t *it = zs_gather_ring_at(g, j);
        pthread_mutex_lock(&g->mu);
        int b = zs_gather_bucket_of(g, j);
        pthread_mutex_unlock(&g->mu);
        if (b == -1) return; /* its pass has not begun */
        if (zs_pass_is_experts(b) && j > cur) return;
        memset(it, 0, sizeof *it);
        it->bucket = b;
        it->slot = -1;
        if (zs_pass_is_experts(b) || g->shard_bytes[b] == 0) {
            it->read_done = 1;
            g->submitted++;
            continue;
        }
        int slot;
        if (zs_pinned_acquire(g->slots, 0, &slot) < 0) return; /* no free slot: later */
        it->slot = slot;
        int rc = zs_shard_reader_submit(g->reader, b, slot, (uint64_t)j);
        if (rc < 0) {
            it->read_done = 1;
            it->read_status = rc;
            snprintf(it->msg, sizeof it->msg, "%s", zs_errmsg());
        }
        g->submitted++;
    }
}

static void *prefetch_main(void *arg) {
    zs_gather *g = arg;
    int nvme = g->o.tier == ZS_OFFLOAD_NVME;
    for (long k = 0;; k++) {
        /* stay within the known passes, one pass of the compute thread, and the live budget */
        pthread_mutex_lock(&g->mu);
        int b = -1;
        while (!g->stop && (k >= prefetch_limit(g) || (b = zs_gather_bucket_of(g, k)) == -1 ||
                            (g->live > 0 && g->live + item_need(g, b) > g->live_limit)))
            pthread_cond_wait(&g->cv, &g->mu);
        long window = prefetch_limit(g);
        int stop = g->stop, bwd = zs_gather_item_is_bwd(g, k);
        pthread_mutex_unlock(&g->mu);
        if (stop) break;
        size_t need = item_need(g, b);

        item_t *it = zs_gather_ring_at(g, k);
        if (zs_pass_is_experts(b)) { /* a MoE layer's experts (gather-experts.c) */
            if (nvme && g->submitted <= k) submit_reads(g, k + 1, k);
            if (!nvme) memset(it, 0, sizeof *it);
            it->bucket = b;
            it->slot = -1;
            zs_gx_mark(g, k, zs_pass_experts_layer(b), bwd);
            continue;
        }
        if (nvme) {
            /* every earlier item has returned its slot, so item k always gets one */
            if (g->submitted <= k) submit_reads(g, k + 1, k);
            ZS_ASSERT(g->submitted > k);
            submit_reads(g, ZS_MIN(window, k + zs_pinned_count(g->slots)), k);
            zs_gather_wait_read(g, k);
        } else {
            memset(it, 0, sizeof *it);
            it->bucket = b;
            it->slot = -1;
        }
        int local = nvme ? it->read_status : 0;
        int global = local;
        void *full = NULL;
        if (need > 0) {
            if (local < 0) {
                g->st.read_errors++;
                zs_log_error("rank %d: %s", g->rank, it->msg);
            }
            int rc = zs_comm_agree(g->comm, local, &global);
            if (rc < 0) {
                global = rc;
                snprintf(it->msg, sizeof it->msg, "%s", zs_errmsg());
            } else if (global < 0 && local == 0) {
                char lb[32];
                it->remote = 1;
                snprintf(it->msg, sizeof it->msg, "reading the %s shard failed on another rank",
                         zs_bucket_label(g->m, b, lb, sizeof lb));
            }
            if (global == 0) {
                const void *send = nvme ? zs_pinned_slot(g->slots, it->slot) : g->shards[b];
                pthread_mutex_lock(&g->mu); /* the pool is shared with release() */
                full = pool_get(g, need);
                pthread_mutex_unlock(&g->mu);
                if (!full) {
                    /* still take part in the collective so the other ranks do not hang */
                    global = zs_err(ZS_ENOMEM, "rank %d: out of memory for a %zu-byte bucket", g->rank, need);
                    snprintf(it->msg, sizeof it->msg, "%s", zs_errmsg());
                    zs_comm_abort(g->comm);
                } else if ((rc = g->has_dev
                                      ? g->dv.gather(g->dv.ctx, g->comm, send,
                                                     nvme ? ZS_GSRC_HOST_TRANSIENT
                                                          : g->o.tier == ZS_OFFLOAD_CPU ? ZS_GSRC_HOST : ZS_GSRC_DEVICE,
                                                     full, g->shard_bytes[b])
                                      : zs_comm_all_gather(g->comm, send, full, g->shard_bytes[b], NULL)) < 0) {
                    global = rc;
                    snprintf(it->msg, sizeof it->msg, "%s", zs_errmsg());
                    pthread_mutex_lock(&g->mu);
                    pool_put(g, full, need);
                    pthread_mutex_unlock(&g->mu);
                    full = NULL;
                }
            }
            if (nvme && it->slot >= 0) zs_pinned_release(g->slots, it->slot);
            if (nvme && local < 0 && local != ZS_EIO) {
                unsigned char *fixed = calloc((size_t)g->n_buckets, 1);
                if (fixed) zs_gather_repair(g, b, k, fixed);
                free(fixed);
            }
        }
        pthread_mutex_lock(&g->mu);
        if (global < 0 && !it->remote && local == 0 && it->msg[0] == 0)
            snprintf(it->msg, sizeof it->msg, "%s", zs_errmsg());
        it->status = global;
        it->buf = full;
        it->live = full ? need : 0;
        it->ready = 1;
        if (full) {
            g->live += need;
            if (g->live > g->st.max_live_bytes) g->st.max_live_bytes = g->live;
            g->st.bytes_gathered += need;
            if (nvme) g->st.bytes_nvme += g->shard_bytes[b];
            else if (g->o.tier == ZS_OFFLOAD_CPU) g->st.bytes_host += g->shard_bytes[b];
            g->st.items++;
        }
        g->produced = k + 1;
        pthread_cond_broadcast(&g->cv);
        pthread_mutex_unlock(&g->mu);
    }
    return NULL;
}

int zs_gather_start(zs_gather *g) {
    if (g->direct) return 0;
    if (g->o.tier == ZS_OFFLOAD_NVME && !g->reader)
        return zs_err(ZS_EINVAL, "rank %d: no shard file attached", g->rank);
    if (pthread_create(&g->thread, NULL, prefetch_main, g) != 0)
        return zs_err(ZS_EIO, "rank %d: cannot start the prefetch thread", g->rank);
    g->thread_started = 1;
    return 0;
}

/* ---- the compute side ---- */

static int acquire_static(zs_gather *g, int bucket, const void **data);
static void release_static(zs_gather *g);

static int g_acquire(void *ctx, int bucket, const void **data) {
    zs_gather *g = ctx;
    if (g->direct) {
        *data = g->shards[bucket];
        return 0;
    }
    if (g->moe && zs_bucket_is_expert(g->m, bucket, NULL, NULL)) return zs_gx_acquire(g, bucket, data);
    return acquire_static(g, bucket, data);
}

static int acquire_static(zs_gather *g, int bucket, const void **data) {
    pthread_mutex_lock(&g->mu);
    if (g->moe) zs_gx_consume_bwd_marks(g); /* a backward mark whose plan is empty */
    long k = g->consumed++;
    ZS_ASSERT(zs_gather_bucket_of(g, k) == bucket);
    pthread_cond_broadcast(&g->cv); /* the window moved */
    if (g->produced <= k) {
        double t0 = zs_now();
        while (g->produced <= k && !g->stop) pthread_cond_wait(&g->cv, &g->mu);
        g->st.stall_s += zs_now() - t0;
    }
    item_t *it = zs_gather_ring_at(g, k);
    int depth = (int)(g->produced - k - 1);
    if (depth > g->st.max_depth) g->st.max_depth = depth;
    int rc = g->stop && g->produced <= k ? zs_err(ZS_ECANCELLED, "engine is shutting down") : 0;
    if (rc == 0 && it->status < 0) {
        rc = zs_err(it->status, "%s", it->msg);
        if (g->pass_rc == 0 || (g->pass_remote && !it->remote)) {
            g->pass_rc = it->status;
            g->pass_remote = it->remote;
            snprintf(g->pass_msg, sizeof g->pass_msg, "%s", it->msg);
        }
    }
    if (rc == 0) *data = it->buf;
    const void *ready = rc == 0 && g->has_dev ? it->buf : NULL;
    pthread_mutex_unlock(&g->mu);
    if (ready) g->dv.ready(g->dv.ctx, ready); /* the compute queue waits for the gather */
    return rc;
}

static void g_release(void *ctx, int bucket) {
    zs_gather *g = ctx;
    if (g->direct) return;
    if (g->moe && bucket >= 0 && zs_bucket_is_expert(g->m, bucket, NULL, NULL)) {
        zs_gx_release(g, bucket);
        return;
    }
    release_static(g);
}

/* Releases the oldest item still held (items are released in the order they were acquired; the
 * marks consumed after it need no release and are passed over). */
static void release_static(zs_gather *g) {
    pthread_mutex_lock(&g->mu);
    while (g->released < g->consumed && zs_pass_is_experts(zs_gather_ring_at(g, g->released)->bucket)) g->released++;
    ZS_ASSERT(g->released < g->consumed);
    item_t *it = zs_gather_ring_at(g, g->released++);
    if (it->ready && it->buf) {
        if (g->has_dev) g->dv.retire(g->dv.ctx, it->buf); /* before another gather may reuse it */
        pool_put(g, it->buf, g->full_bytes[it->bucket]);
        g->live -= it->live;
        it->buf = NULL;
        it->live = 0;
    }
    while (g->released < g->consumed && zs_pass_is_experts(zs_gather_ring_at(g, g->released)->bucket)) g->released++;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

zs_weight_source zs_gather_source(zs_gather *g) {
    return (zs_weight_source){g_acquire, g_release, g, g->moe ? zs_gx_experts : NULL};
}

int zs_gather_order(const zs_gather *g, const int **order, int *n_infer) {
    *order = g->torder;
    *n_infer = g->n_order;
    return g->n_torder;
}

zs_pass_range zs_gather_kind_range(const zs_gather *g, int kind) {
    if (kind == ZS_PASS_TRAIN) return (zs_pass_range){0, g->n_torder};
    if (kind == ZS_PASS_BWD) return (zs_pass_range){g->n_order, g->n_torder - g->n_order};
    ZS_ASSERT(kind == ZS_PASS_INFER);
    return (zs_pass_range){0, g->n_order};
}

/* A range of torder that a pass may cover: never starts at a mark, never leaves a layer's mark
 * out of the range that holds its bucket (a mark always follows its layer's bucket). */
static void check_range(const zs_gather *g, zs_pass_range r) {
    ZS_ASSERT(r.count >= 1 && r.first >= 0 && r.first + r.count <= g->n_torder);
    ZS_ASSERT(!zs_pass_is_experts(g->torder[r.first]));
    ZS_ASSERT(r.first + r.count == g->n_torder || !zs_pass_is_experts(g->torder[r.first + r.count]));
}

static int same_range(zs_pass_range a, zs_pass_range b) { return a.first == b.first && a.count == b.count; }

/* Under mu: the pass after the current one (at item cur_start + cur.count) becomes current as
 * cur, followed by *next (NULL: unknown). */
static void advance(zs_gather *g, zs_pass_range cur, const zs_pass_range *next) {
    g->cur_start += g->cur.count;
    g->cur = cur;
    g->cur_ended = 0;
    g->has_next = next != NULL;
    if (next) g->next = *next;
    pthread_cond_broadcast(&g->cv); /* the prefetcher may start on it */
}

static void clear_pass_error(zs_gather *g) {
    g->pass_rc = 0;
    g->pass_remote = 0;
    g->pass_msg[0] = 0;
}

/* The current pass, a declared or speculated one that no caller began, driven to its end: its
 * forward marks agree on nothing and leave the layers' last forward choices as they were. */
static void consume_unused(zs_gather *g) {
    g->wasting = 1;
    zs_gather_pass_end(g);
    g->wasting = 0;
    clear_pass_error(g); /* not a caller's pass */
}

void zs_gather_pass_begin_range(zs_gather *g, zs_pass_range cur, const zs_pass_range *next) {
    clear_pass_error(g);
    check_range(g, cur);
    if (next) check_range(g, *next);
    pthread_mutex_lock(&g->mu);
    g->st.passes++;
    if (g->direct) {
        pthread_mutex_unlock(&g->mu);
        return;
    }
    ZS_ASSERT(g->released == g->consumed && g->consumed == g->cur_start + g->cur.count);
    zs_pass_range infer = {0, g->n_order};
    const zs_pass_range *after = next ? next : g->spec ? &infer : NULL;
    if (g->has_next && !same_range(g->next, cur)) {
        if (g->next.first == cur.first && cur.count >= g->next.count) {
            /* what the prefetcher did of it is cur's prefix: the same items */
            g->st.passes_adopted++;
        } else {
            /* the prefetcher may be inside it on some ranks: every rank consumes it whole, so the
             * collectives stay matched (the prefetcher may go on into cur meanwhile) */
            g->st.passes_wasted++;
            advance(g, g->next, &cur);
            pthread_mutex_unlock(&g->mu);
            consume_unused(g);
            pthread_mutex_lock(&g->mu);
        }
    }
    advance(g, cur, after);
    pthread_mutex_unlock(&g->mu);
}

void zs_gather_pass_begin(zs_gather *g, int kind) {
    zs_gather_pass_begin_range(g, zs_gather_kind_range(g, kind), NULL);
}

void zs_gather_pass_end(zs_gather *g) {
    if (g->direct) return;
    if (g->moe) zs_gx_drain(g); /* the rest of the experts of an open plan */
    for (;;) {
        pthread_mutex_lock(&g->mu);
        while (g->released < g->consumed && zs_pass_is_experts(zs_gather_ring_at(g, g->released)->bucket)) g->released++;
        int held = g->released < g->consumed;
        pthread_mutex_unlock(&g->mu);
        if (!held) break;
        release_static(g);
    }
    /* the rest of the range: every rank takes part in all of its gathers */
    while (g->consumed < g->cur_start + g->cur.count) {
        const void *d;
        pthread_mutex_lock(&g->mu);
        long k = g->consumed;
        int b = zs_gather_bucket_of(g, k);
        pthread_mutex_unlock(&g->mu);
        if (zs_pass_is_experts(b)) {
            (void)zs_gx_drain_mark(g, k);
            continue;
        }
        (void)acquire_static(g, b, &d);
        release_static(g);
    }
    pthread_mutex_lock(&g->mu);
    g->cur_ended = 1;
    pthread_cond_broadcast(&g->cv); /* the prefetcher may go on into a known next pass */
    pthread_mutex_unlock(&g->mu);
}

void zs_gather_set_speculation(zs_gather *g, int on) {
    if (g->direct) return;
    pthread_mutex_lock(&g->mu);
    g->spec = !!on;
    /* on: the pass after the current one is the inference pass unless another is declared; off:
     * a speculated pass stays the next one, which the next begin adopts or consumes (the ranks
     * may be anywhere inside it) */
    if (on && !g->has_next) {
        g->has_next = 1;
        g->next = (zs_pass_range){0, g->n_order};
        pthread_cond_broadcast(&g->cv);
    }
    pthread_mutex_unlock(&g->mu);
}

void zs_gather_settle(zs_gather *g) {
    if (g->direct) return;
    pthread_mutex_lock(&g->mu);
    ZS_ASSERT(g->released == g->consumed && g->consumed == g->cur_start + g->cur.count);
    if (!g->has_next) {
        pthread_mutex_unlock(&g->mu);
        return;
    }
    zs_pass_range infer = {0, g->n_order};
    g->st.passes_wasted++;
    advance(g, g->next, g->spec ? &infer : NULL);
    pthread_mutex_unlock(&g->mu);
    consume_unused(g);
}

int zs_gather_pass_error(const zs_gather *g, int *remote, const char **msg) {
    *remote = g->pass_remote;
    *msg = g->pass_msg;
    return g->pass_rc;
}

void zs_gather_stats_get(zs_gather *g, zs_gather_stats *s) {
    pthread_mutex_lock(&g->mu);
    *s = g->st;
    s->live_bytes = g->live;
    s->expert_cache_used = g->xused;
    pthread_mutex_unlock(&g->mu);
}

void zs_gather_stats_reset_peaks(zs_gather *g) {
    pthread_mutex_lock(&g->mu);
    g->st.max_depth = 0;
    g->st.max_live_bytes = g->live;
    g->st.stall_s = 0;
    pthread_mutex_unlock(&g->mu);
}

void zs_gather_free(zs_gather *g) {
    if (!g) return;
    if (g->thread_started) {
        pthread_mutex_lock(&g->mu);
        g->stop = 1;
        pthread_cond_broadcast(&g->cv);
        pthread_mutex_unlock(&g->mu);
        zs_comm_abort(g->comm); /* wakes a prefetch thread blocked in a collective */
        pthread_join(g->thread, NULL);
        /* the all_gather it gave up on may still write into a ring buffer (MPI: late data over
         * a slow link); wait for it, else leave the buffers allocated */
        if (zs_comm_settle(g->comm, 5.0) > 0) {
            zs_log_warn("gather: a cancelled all_gather is still pending in the transport: its buffers are left allocated");
            g->ring = NULL;
            g->free_bufs = NULL;
            g->slots = NULL;
            g->pinned_all = NULL;
            if (g->o.tier == ZS_OFFLOAD_NONE) g->n_buckets = 0;
        }
    }
    if (g->ring)
        for (long i = 0; i < g->ring_n; i++) buf_free(g, g->ring[i].buf);
    while (g->free_bufs) {
        fbuf *f = g->free_bufs;
        g->free_bufs = f->next;
        buf_free(g, f->p);
        free(f);
    }
    zs_shard_reader_close(g->reader);
    if (g->file) zs_shard_file_close(g->file);
    zs_pinned_free(g->slots);
    if (g->o.tier == ZS_OFFLOAD_NONE && g->shards)
        for (int b = 0; b < g->n_buckets; b++) buf_free(g, g->shards[b]);
    zs_pinned_free(g->pinned_all);
    zs_gx_free(g);
    free(g->order);
    free(g->torder);
    free(g->shards);
    free(g->shard_bytes);
    free(g->full_bytes);
    free(g->ring);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    free(g);
}
