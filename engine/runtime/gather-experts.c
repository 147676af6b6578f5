/* gather-experts.c — the experts of a mixture of experts in the gather coordinator (gather.h,
 * "Experts"): the budget split between the expert cache and the other buckets, the prefetch
 * thread's work at each layer's mark (speculative gathers, the agreement on the union of the
 * ranks' selected experts, the gathers of the union's uncached experts in increasing order), the
 * compute thread's side of the protocol of model.h (experts(), then acquire/release of each agreed
 * expert), and draining a pass that stopped early.
 *
 * Determinism across ranks: the prefetch thread alone decides what is present, what is evicted
 * and what is gathered, from the agreed masks, the sizes and its own clock, in an order every rank
 * repeats; the compute thread only marks entries held and released. When the chosen victim is
 * still to be used (an earlier expert of the plan being consumed, or an expert of the previous
 * plan), the prefetch thread waits for its release instead of choosing another. */
#include <string.h>

#include "common.h"
#include "gather-impl.h"

static int mask_has(const uint64_t *m, int e) { return (int)((m[e >> 6] >> (e & 63)) & 1u); }
static void mask_add(uint64_t *m, int e) { m[e >> 6] |= 1ULL << (e & 63); }

static int mask_list(const uint64_t *m, int n, int *list) {
    int k = 0;
    for (int e = 0; e < n; e++)
        if (mask_has(m, e)) list[k++] = e;
    return k;
}

/* ---- set-up ---- */

int zs_gx_init(zs_gather *g) {
    const zs_model_config *c = zs_model_config_get(g->m);
    size_t max_static = g->max_static_full, total_exp = 0, given = g->o.max_live_bytes;
    g->posted_k = -1;
    if (c->n_experts <= 0) {
        if (g->o.expert_cache_bytes || g->o.expert_gather_all || g->o.expert_no_speculate)
            return zs_err(ZS_EINVAL, "the expert options (--expert-cache-bytes, --moe-gather-all, --no-expert-speculation) "
                          "are for mixtures of experts; %s is dense", c->arch_name);
        g->live_limit = given ? given : 4 * max_static;
        if (!g->direct && g->live_limit < max_static)
            return zs_err(ZS_EINVAL, "max_live_bytes (%zu) is smaller than the largest bucket (%zu bytes)",
                          g->live_limit, max_static);
        g->st.live_limit = g->live_limit;
        return 0;
    }
    g->moe = 1;
    g->n_exp = c->n_experts;
    for (int l = 0; l < c->n_layers; l++) {
        if (zs_bucket_expert(g->m, l, 0) < 0) continue;
        g->n_moe_layers++;
        for (int e = 0; e < g->n_exp; e++) {
            size_t f = g->full_bytes[zs_bucket_expert(g->m, l, e)];
            g->max_expert_full = ZS_MAX(g->max_expert_full, f);
            total_exp += f;
        }
    }
    g->xe = calloc((size_t)g->n_buckets, sizeof *g->xe);
    g->last_agreed = calloc((size_t)c->n_layers, sizeof *g->last_agreed);
    g->has_last = calloc((size_t)c->n_layers, 1);
    g->spec_score = malloc((size_t)c->n_layers * sizeof(float));
    g->cplan_list = malloc((size_t)g->n_exp * sizeof(int));
    if (!g->xe || !g->last_agreed || !g->has_last || !g->spec_score || !g->cplan_list)
        return zs_err(ZS_ENOMEM, "rank %d: out of memory for the expert cache's table", g->rank);
    for (int l = 0; l < c->n_layers; l++) g->spec_score[l] = 1.0f;
    size_t layer_full = (size_t)g->n_exp * g->max_expert_full;
    if (g->o.expert_cache_bytes) {
        g->xlimit = g->o.expert_cache_bytes;
    } else if (given) {
        if (given < 2 * max_static + g->max_expert_full)
            return zs_err(ZS_EINVAL, "max_live_bytes (%zu) is smaller than two of the largest non-expert buckets "
                          "(%zu bytes each) and one expert (%zu bytes)", given, max_static, g->max_expert_full);
        g->xlimit = given - 2 * max_static;
    } else {
        g->xlimit = ZS_MIN(2 * layer_full, total_exp);
    }
    if (g->xlimit < g->max_expert_full)
        return zs_err(ZS_EINVAL, "expert_cache_bytes (%zu) is smaller than one expert (%zu bytes)", g->xlimit,
                      g->max_expert_full);
    if (given) {
        if (given < g->xlimit + max_static && !g->direct)
            return zs_err(ZS_EINVAL, "max_live_bytes (%zu) leaves %zu bytes beside the expert cache (%zu bytes), "
                          "less than the largest non-expert bucket (%zu bytes)", given,
                          given > g->xlimit ? given - g->xlimit : 0, g->xlimit, max_static);
        g->live_limit = given - g->xlimit;
    } else {
        g->live_limit = 4 * max_static;
    }
    g->st.live_limit = g->live_limit;
    g->st.expert_cache_limit = g->xlimit;
    return 0;
}

static void *xbuf_alloc(zs_gather *g, size_t size) {
    return g->has_dev ? g->dv.alloc(g->dv.ctx, size) : zs_aligned_alloc(4096, size);
}

static void xbuf_free(zs_gather *g, void *p) {
    if (!p) return;
    if (g->has_dev) g->dv.free(g->dv.ctx, p);
    else free(p);
}

void zs_gx_free(zs_gather *g) {
    if (g->xe)
        for (int b = 0; b < g->n_buckets; b++) xbuf_free(g, g->xe[b].buf);
    while (g->xfree) {
        fbuf *f = g->xfree;
        g->xfree = f->next;
        xbuf_free(g, f->p);
        free(f);
    }
    free(g->xe);
    free(g->last_agreed);
    free(g->has_last);
    free(g->spec_score);
    free(g->cplan_list);
    free(g->xr);
    free(g->xsync);
}

/* Under mu. */
static void *xbuf_get(zs_gather *g, size_t size) {
    for (fbuf **pp = &g->xfree; *pp; pp = &(*pp)->next)
        if ((*pp)->cap >= size) {
            fbuf *f = *pp;
            *pp = f->next;
            void *p = f->p;
            free(f);
            return p;
        }
    return xbuf_alloc(g, size);
}

static void xbuf_put(zs_gather *g, void *p, size_t cap) {
    fbuf *f = malloc(sizeof *f);
    if (!f) {
        xbuf_free(g, p);
        return;
    }
    *f = (fbuf){p, cap, g->xfree};
    g->xfree = f;
}

/* Under mu: drops a present entry from the cache. */
static void evict(zs_gather *g, int b) {
    xent_t *x = &g->xe[b];
    xbuf_put(g, x->buf, g->full_bytes[b]);
    x->buf = NULL;
    x->present = 0;
    x->spec = 0;
    g->xused -= g->full_bytes[b];
}

/* An entry the compute thread has still to take or give back. */
static int pending(const xent_t *x) { return x->held || x->ready_plan > x->released_plan; }

/* ---- reading and gathering one expert (prefetch thread) ---- */

static void xread_submit(zs_gather *g, int b, int slot) {
    xread_t *r = &g->xr[slot];
    *r = (xread_t){.busy = 1, .bucket = b};
    int rc = zs_shard_reader_submit(g->reader, b, slot, XTAG | (uint64_t)slot);
    if (rc < 0) {
        r->done = 1;
        r->status = rc;
        snprintf(r->msg, sizeof r->msg, "%s", zs_errmsg());
    }
}

/* Submits reads for the plan's entries from index i on that are not present and have none yet,
 * while slots are free. */
static void top_up(zs_gather *g, int layer, const int *list, int n, int i, int *rd) {
    for (int j = i; j < n; j++) {
        int b = zs_bucket_expert(g->m, layer, list[j]);
        pthread_mutex_lock(&g->mu);
        int present = g->xe[b].present && !g->o.expert_gather_all;
        pthread_mutex_unlock(&g->mu);
        if (present || rd[j] >= 0) continue;
        int slot;
        if (zs_pinned_acquire(g->slots, 0, &slot) < 0) return;
        xread_submit(g, b, slot);
        rd[j] = slot;
    }
}

/* Reads this rank's shard of expert bucket b (from the read in slot `slot`, or now), agrees on
 * the status with the other ranks and all-gathers the expert into a buffer of the cache. Returns
 * the agreed status; *out the buffer (0) or NULL. The room must have been made. */
static int fetch_one(zs_gather *g, int b, int slot, void **out, char *msg, size_t cap) {
    int nvme = g->o.tier == ZS_OFFLOAD_NVME;
    size_t need = g->full_bytes[b];
    const void *send = NULL;
    int local = 0, remote = 0;
    *out = NULL;
    msg[0] = 0;
    if (nvme) {
        if (slot < 0 && zs_pinned_acquire(g->slots, 0, &slot) == 0) xread_submit(g, b, slot);
        if (slot >= 0) {
            while (!g->xr[slot].done) zs_gather_reap(g);
            local = g->xr[slot].status;
            if (local < 0) snprintf(msg, cap, "%s", g->xr[slot].msg);
            send = zs_pinned_slot(g->slots, slot);
        } else { /* every slot is taken by reads further on in the plan */
            local = zs_shard_file_read(g->file, b, g->xsync);
            if (local < 0) snprintf(msg, cap, "%s", zs_errmsg());
            send = g->xsync;
        }
    } else {
        send = g->shards[b];
    }
    int global = local;
    char lb[48];
    if (local < 0) {
        g->st.read_errors++;
        zs_log_error("rank %d: %s", g->rank, msg);
    }
    int rc = zs_comm_agree(g->comm, local, &global);
    if (rc < 0) {
        global = rc;
        snprintf(msg, cap, "%s", zs_errmsg());
    } else if (global < 0 && local == 0) {
        remote = 1;
        snprintf(msg, cap, "reading the %s shard failed on another rank", zs_bucket_label(g->m, b, lb, sizeof lb));
    }
    void *full = NULL;
    if (global == 0) {
        pthread_mutex_lock(&g->mu);
        full = xbuf_get(g, need);
        pthread_mutex_unlock(&g->mu);
        if (!full) {
            global = zs_err(ZS_ENOMEM, "rank %d: out of memory for a %zu-byte expert", g->rank, need);
            snprintf(msg, cap, "%s", zs_errmsg());
            zs_comm_abort(g->comm); /* the other ranks are in the all_gather */
        } else if ((rc = g->has_dev ? g->dv.gather(g->dv.ctx, g->comm, send,
                                                   nvme ? ZS_GSRC_HOST_TRANSIENT
                                                        : g->o.tier == ZS_OFFLOAD_CPU ? ZS_GSRC_HOST : ZS_GSRC_DEVICE,
                                                   full, g->shard_bytes[b])
                                    : zs_comm_all_gather(g->comm, send, full, g->shard_bytes[b], NULL)) < 0) {
            global = rc;
            snprintf(msg, cap, "%s", zs_errmsg());
            pthread_mutex_lock(&g->mu);
            xbuf_put(g, full, need);
            pthread_mutex_unlock(&g->mu);
            full = NULL;
        }
    }
    if (nvme && slot >= 0) {
        g->xr[slot].busy = 0;
        zs_pinned_release(g->slots, slot);
    }
    if (nvme && local < 0 && local != ZS_EIO) {
        /* rewrite the shard (and any truncated ones); reads in flight of rewritten shards again */
        unsigned char *fixed = calloc((size_t)g->n_buckets, 1);
        if (fixed) {
            zs_gather_repair(g, b, g->submitted, fixed);
            for (int s = 0; s < zs_pinned_count(g->slots); s++) {
                xread_t *r = &g->xr[s];
                if (!r->busy || !fixed[r->bucket]) continue;
                while (!r->done) zs_gather_reap(g);
                xread_submit(g, r->bucket, s);
            }
        }
        free(fixed);
    }
    if (global < 0 && !remote && !msg[0]) snprintf(msg, cap, "%s", zs_errmsg());
    if (full) {
        pthread_mutex_lock(&g->mu);
        g->st.expert_bytes += need;
        g->st.bytes_gathered += need;
        if (nvme) g->st.bytes_nvme += g->shard_bytes[b];
        else if (g->o.tier == ZS_OFFLOAD_CPU) g->st.bytes_host += g->shard_bytes[b];
        g->st.items++;
        pthread_mutex_unlock(&g->mu);
    }
    *out = full;
    return global;
}

/* ---- the prefetch thread at a mark ---- */

/* Under mu: the least recently used present expert that `ok` accepts, or -1. */
static int lru_victim(zs_gather *g, int (*ok)(const zs_gather *, int, const void *), const void *arg) {
    int v = -1;
    for (int b = 0; b < g->n_buckets; b++) {
        const xent_t *x = &g->xe[b];
        if (!x->present || !ok(g, b, arg)) continue;
        if (v < 0 || x->lru < g->xe[v].lru) v = b;
    }
    return v;
}

static int not_in_plan(const zs_gather *g, int b, const void *arg) {
    return g->xe[b].used_plan != *(const long *)arg;
}

typedef struct { long before; int layer; const uint64_t *pred; } spec_arg;

/* Speculation may evict only experts no plan since the latest has listed (none of them is still
 * to be used) that it is not about to gather itself. */
static int spec_ok(const zs_gather *g, int b, const void *arg) {
    const spec_arg *a = arg;
    int l, e;
    if (g->xe[b].used_plan >= a->before) return 0;
    return !(zs_bucket_is_expert(g->m, b, &l, &e) && l == a->layer && mask_has(a->pred, e));
}

/* Makes room for need bytes for entry i of plan pid (list[0..n) of layer), waiting for the
 * compute thread where the victim is still to be used. */
static void make_room(zs_gather *g, long pid, int layer, const int *list, int n, int i, size_t need) {
    pthread_mutex_lock(&g->mu);
    while (g->xused + need > g->xlimit && !g->stop) {
        /* (1) the least recently used expert outside the plan (at most the previous plan's are
         * still to be used: wait for them) */
        int v = lru_victim(g, not_in_plan, &pid);
        if (v >= 0) {
            while (pending(&g->xe[v]) && !g->stop) pthread_cond_wait(&g->cv, &g->mu);
            if (g->stop) break;
            evict(g, v);
            continue;
        }
        /* (2) the plan's earliest present expert before entry i, once the compute thread is done with it */
        for (int j = 0; j < i && v < 0; j++) {
            int b = zs_bucket_expert(g->m, layer, list[j]);
            if (g->xe[b].present) v = b;
        }
        if (v >= 0) {
            while ((g->xe[v].held || g->xe[v].released_plan != pid) && !g->stop) pthread_cond_wait(&g->cv, &g->mu);
            if (g->stop) break;
            evict(g, v);
            continue;
        }
        /* (3) the plan's last present expert after entry i (not yet handed out; gathered again later) */
        for (int j = n - 1; j > i && v < 0; j--) {
            int b = zs_bucket_expert(g->m, layer, list[j]);
            if (g->xe[b].present) v = b;
        }
        if (v < 0) break; /* cannot happen: the limit holds at least one expert */
        evict(g, v);
    }
    pthread_mutex_unlock(&g->mu);
}

/* Gathers, before the agreement, the experts layer l used in the previous pass that are not
 * cached, while that guess has been right at least half the time, into room that no plan since
 * the latest needs. */
static void speculate(zs_gather *g, int layer) {
    if (!g->has_last[layer] || g->spec_score[layer] < 0.5f) return;
    const uint64_t *pred = g->last_agreed[layer];
    spec_arg a = {g->xplan_id, layer, pred};
    for (int e = 0; e < g->n_exp; e++) {
        if (!mask_has(pred, e)) continue;
        int b = zs_bucket_expert(g->m, layer, e);
        size_t need = g->full_bytes[b];
        pthread_mutex_lock(&g->mu);
        int skip = g->xe[b].present, room = 1;
        while (!skip && g->xused + need > g->xlimit) {
            int v = lru_victim(g, spec_ok, &a);
            if (v < 0) {
                room = 0;
                break;
            }
            evict(g, v);
        }
        pthread_mutex_unlock(&g->mu);
        if (!room) return;
        if (skip) continue;
        void *buf;
        char msg[240];
        int rc = fetch_one(g, b, -1, &buf, msg, sizeof msg);
        pthread_mutex_lock(&g->mu);
        if (rc == 0) {
            xent_t *x = &g->xe[b];
            x->buf = buf;
            x->present = 1;
            x->spec = 1;
            x->lru = ++g->xclock;
            x->used_plan = g->xplan_id; /* the next speculation may take it back unless a plan lists it */
            g->xused += need;
            g->st.expert_spec++;
        }
        pthread_mutex_unlock(&g->mu);
        if (rc < 0) return; /* every rank saw the same failure */
    }
}

/* The union of the ranks' masks: an all-reduce (max) of one float per expert. */
static int agree_mask(zs_gather *g, zs_comm *comm, const uint64_t *mask, uint64_t *agreed) {
    float f[ZS_MAX_EXPERTS];
    for (int e = 0; e < g->n_exp; e++) f[e] = (float)mask_has(mask, e);
    int rc = g->nranks > 1 ? zs_comm_all_reduce(comm, f, f, (size_t)g->n_exp, ZS_F32, ZS_RED_MAX, NULL) : 0;
    memset(agreed, 0, ZS_EXPERT_WORDS * sizeof *agreed);
    if (rc < 0) return rc;
    for (int e = 0; e < g->n_exp; e++)
        if (f[e] > 0) mask_add(agreed, e);
    return 0;
}

static void count_layer(zs_gather *g, int layer, int n) { /* under mu */
    g->st.expert_layers++;
    g->st.expert_selected += n;
    for (int e = 0; e < g->n_exp; e++) g->st.expert_block_bytes += g->full_bytes[zs_bucket_expert(g->m, layer, e)];
}

void zs_gx_mark(zs_gather *g, long k, int layer, int bwd) {
    item_t *it = zs_gather_ring_at(g, k);
    uint64_t mask[ZS_EXPERT_WORDS], agreed[ZS_EXPERT_WORDS];
    int list[ZS_MAX_EXPERTS], rd[ZS_MAX_EXPERTS];
    int rc = 0;
    char msg[320] = "";
    memset(agreed, 0, sizeof agreed);
    if (!bwd) {
        if (!g->o.expert_no_speculate && !g->o.expert_gather_all) speculate(g, layer);
        pthread_mutex_lock(&g->mu);
        while (!g->stop && g->posted_k != k) pthread_cond_wait(&g->cv, &g->mu);
        memcpy(mask, g->posted_mask, sizeof mask);
        int stop = g->stop, wasted = g->posted_wasted;
        pthread_mutex_unlock(&g->mu);
        if (stop) return;
        rc = agree_mask(g, g->comm, mask, agreed);
        if (rc < 0) snprintf(msg, sizeof msg, "%s", zs_errmsg());
        else if (g->o.expert_gather_all)
            for (int e = 0; e < g->n_exp; e++) mask_add(agreed, e);
        /* a pass consumed unused says nothing of the routing: the layer's last forward choice (a
         * later backward's plan, the next speculation) stays */
        if (wasted) goto plan;
        if (rc == 0) {
            /* how much of the previous pass's choice this pass used again (the same on every rank) */
            if (g->has_last[layer]) {
                int np = 0, hit = 0;
                for (int e = 0; e < g->n_exp; e++)
                    if (mask_has(g->last_agreed[layer], e)) {
                        np++;
                        hit += mask_has(agreed, e);
                    }
                if (np > 0) g->spec_score[layer] = 0.75f * g->spec_score[layer] + 0.25f * (float)hit / (float)np;
            }
        }
        memcpy(g->last_agreed[layer], agreed, sizeof agreed); /* zero after a failed agreement */
        g->has_last[layer] = rc == 0;
    } else {
        /* a backward mark (past the inference prefix of the training order: a TRAIN pass's
         * backward, a BWD pass, any range there): the layer's latest forward agreement, whichever
         * pass held that forward mark (the trainer mirrors it: a forward mark drained after a
         * failure agrees on nothing, so its backward gathers nothing; one of a pass consumed
         * unused leaves the agreement before it) */
        memcpy(agreed, g->last_agreed[layer], sizeof agreed);
    }
plan:;
    int n = mask_list(agreed, g->n_exp, list);
    long pid = ++g->xplan_id;
    pthread_mutex_lock(&g->mu);
    /* plans share experts (a backward repeats its forward's), and an entry is made ready for one
     * plan at a time: the compute thread gives the previous plan back first (a forward mark's
     * mask already comes after it; a backward mark would otherwise run ahead) */
    while (g->cdone_plan < pid - 1 && !g->stop) pthread_cond_wait(&g->cv, &g->mu);
    for (int i = 0; i < n; i++) g->xe[zs_bucket_expert(g->m, layer, list[i])].used_plan = pid;
    it->plan_id = pid;
    it->plan_n = n;
    memcpy(it->agreed, agreed, sizeof agreed);
    it->status = rc;
    snprintf(it->msg, sizeof it->msg, "%s", msg);
    it->ready = 1;
    if (!bwd) count_layer(g, layer, n);
    g->produced = k + 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);

    int nvme = g->o.tier == ZS_OFFLOAD_NVME;
    for (int i = 0; i < n; i++) rd[i] = -1;
    if (nvme) top_up(g, layer, list, n, 0, rd);
    for (int i = 0; i < n; i++) {
        int b = zs_bucket_expert(g->m, layer, list[i]);
        xent_t *x = &g->xe[b];
        size_t need = g->full_bytes[b];
        pthread_mutex_lock(&g->mu);
        if (g->stop) {
            pthread_mutex_unlock(&g->mu);
            return;
        }
        x->lru = ++g->xclock;
        if (x->present && g->o.expert_gather_all) { /* the baseline keeps nothing from pass to pass */
            while (pending(x) && !g->stop) pthread_cond_wait(&g->cv, &g->mu);
            if (!g->stop) evict(g, b);
        }
        if (x->present) {
            g->st.expert_hits++;
            if (x->spec) g->st.expert_spec_used++;
            x->spec = 0;
            x->status = 0;
            x->ready_plan = pid;
            pthread_cond_broadcast(&g->cv);
            pthread_mutex_unlock(&g->mu);
            continue;
        }
        g->st.expert_misses++;
        pthread_mutex_unlock(&g->mu);
        make_room(g, pid, layer, list, n, i, need);
        void *buf;
        char emsg[240];
        int st = fetch_one(g, b, rd[i], &buf, emsg, sizeof emsg);
        rd[i] = -1;
        pthread_mutex_lock(&g->mu);
        if (st == 0) {
            x->buf = buf;
            x->present = 1;
            g->xused += need;
        } else {
            snprintf(x->msg, sizeof x->msg, "%s", emsg);
        }
        x->spec = 0;
        x->status = st;
        x->ready_plan = pid;
        pthread_cond_broadcast(&g->cv);
        pthread_mutex_unlock(&g->mu);
        if (nvme) top_up(g, layer, list, n, i + 1, rd);
    }
}

/* ---- the compute thread ---- */

/* Under mu: the plan of mark item it becomes the one being consumed. */
static void open_plan(zs_gather *g, const item_t *it, int layer) {
    g->cplan_open = 1;
    g->cplan_id = it->plan_id;
    g->cplan_n = mask_list(it->agreed, g->n_exp, g->cplan_list);
    g->cplan_next = 0;
    g->cplan_layer = layer;
    if (g->cplan_n == 0) {
        g->cdone_plan = g->cplan_id;
        pthread_cond_broadcast(&g->cv);
    }
}

/* Under mu: takes mark item k (the next one), waits for its plan and opens it. */
static int take_mark(zs_gather *g, long k, int layer) {
    g->consumed = k + 1;
    pthread_cond_broadcast(&g->cv);
    if (g->produced <= k) {
        double t0 = zs_now();
        while (g->produced <= k && !g->stop) pthread_cond_wait(&g->cv, &g->mu);
        g->st.stall_s += zs_now() - t0;
    }
    if (g->produced <= k) {
        g->cplan_open = 1;
        g->cplan_n = g->cplan_next = 0;
        return zs_err(ZS_ECANCELLED, "engine is shutting down");
    }
    item_t *it = zs_gather_ring_at(g, k);
    open_plan(g, it, layer);
    if (it->status < 0) {
        if (g->pass_rc == 0) {
            g->pass_rc = it->status;
            snprintf(g->pass_msg, sizeof g->pass_msg, "%s", it->msg);
        }
        return zs_err(it->status, "%s", it->msg);
    }
    return 0;
}

int zs_gx_experts(void *ctx, int layer, const uint64_t *mask, uint64_t *agreed) {
    zs_gather *g = ctx;
    uint64_t m[ZS_EXPERT_WORDS] = {0};
    for (int e = 0; e < g->n_exp; e++)
        if (mask_has(mask, e)) mask_add(m, e);
    if (g->direct) { /* nothing to gather; replicated ranks still agree (on the compute thread) */
        int rc = agree_mask(g, g->comm, m, agreed);
        if (rc == 0 && g->o.expert_gather_all)
            for (int e = 0; e < g->n_exp; e++) mask_add(agreed, e);
        int n = 0;
        for (int e = 0; e < g->n_exp; e++) n += mask_has(agreed, e);
        pthread_mutex_lock(&g->mu);
        count_layer(g, layer, n);
        pthread_mutex_unlock(&g->mu);
        return rc;
    }
    pthread_mutex_lock(&g->mu);
    ZS_ASSERT(!g->cplan_open || g->cplan_next == g->cplan_n);
    long k = g->consumed;
    int b = zs_gather_bucket_of(g, k);
    ZS_ASSERT(zs_pass_is_experts(b) && zs_pass_experts_layer(b) == layer && !zs_gather_item_is_bwd(g, k));
    memcpy(g->posted_mask, m, sizeof m);
    g->posted_wasted = g->wasting;
    g->posted_k = k;
    g->cplan_layer = layer;
    int rc = take_mark(g, k, layer);
    memset(agreed, 0, ZS_EXPERT_WORDS * sizeof *agreed);
    for (int i = 0; i < g->cplan_n; i++) mask_add(agreed, g->cplan_list[i]);
    pthread_mutex_unlock(&g->mu);
    return rc;
}

/* Under mu: backward marks come without an experts() call; take the next one. */
static int take_bwd_mark(zs_gather *g) {
    long k = g->consumed;
    int b = zs_gather_bucket_of(g, k);
    ZS_ASSERT(zs_pass_is_experts(b) && zs_gather_item_is_bwd(g, k));
    g->cplan_layer = zs_pass_experts_layer(b);
    return take_mark(g, k, g->cplan_layer);
}

void zs_gx_consume_bwd_marks(zs_gather *g) {
    for (;;) {
        if (g->cplan_open && g->cplan_next < g->cplan_n) return;
        long k = g->consumed;
        int b = zs_gather_bucket_of(g, k);
        if (!zs_pass_is_experts(b) || !zs_gather_item_is_bwd(g, k)) return;
        (void)take_bwd_mark(g);
        /* a plan with experts must be taken through acquire (the caller skipped them otherwise) */
        ZS_ASSERT(g->cplan_n == 0 || g->stop);
    }
}

int zs_gx_acquire(zs_gather *g, int bucket, const void **data) {
    int layer, e;
    zs_bucket_is_expert(g->m, bucket, &layer, &e);
    pthread_mutex_lock(&g->mu);
    int rc = 0;
    if (!g->cplan_open || g->cplan_next == g->cplan_n) rc = take_bwd_mark(g);
    if (rc < 0 && g->cplan_n == 0) {
        pthread_mutex_unlock(&g->mu);
        return rc;
    }
    ZS_ASSERT(g->cplan_next < g->cplan_n && g->cplan_layer == layer && g->cplan_list[g->cplan_next] == e);
    xent_t *x = &g->xe[bucket];
    if (x->ready_plan != g->cplan_id) {
        double t0 = zs_now();
        while (x->ready_plan != g->cplan_id && !g->stop) pthread_cond_wait(&g->cv, &g->mu);
        g->st.stall_s += zs_now() - t0;
    }
    g->cplan_next++;
    x->held = 1;
    if (x->ready_plan != g->cplan_id) {
        rc = zs_err(ZS_ECANCELLED, "engine is shutting down");
    } else if (x->status < 0) {
        rc = zs_err(x->status, "%s", x->msg);
        if (g->pass_rc == 0) {
            g->pass_rc = x->status;
            snprintf(g->pass_msg, sizeof g->pass_msg, "%s", x->msg);
        }
    } else {
        *data = x->buf;
    }
    const void *ready = rc == 0 && g->has_dev ? x->buf : NULL;
    pthread_mutex_unlock(&g->mu);
    if (ready) g->dv.ready(g->dv.ctx, ready);
    return rc;
}

void zs_gx_release(zs_gather *g, int bucket) {
    pthread_mutex_lock(&g->mu);
    xent_t *x = &g->xe[bucket];
    if (x->held) {
        if (g->has_dev && x->buf) g->dv.retire(g->dv.ctx, x->buf);
        x->held = 0;
        x->released_plan = g->cplan_id;
        if (g->cplan_next == g->cplan_n) g->cdone_plan = g->cplan_id; /* the plan's last expert */
        pthread_cond_broadcast(&g->cv);
    }
    pthread_mutex_unlock(&g->mu);
}

void zs_gx_drain(zs_gather *g) {
    pthread_mutex_lock(&g->mu);
    if (!g->cplan_open) {
        pthread_mutex_unlock(&g->mu);
        return;
    }
    int layer = g->cplan_layer;
    if (g->cplan_next > 0) {
        int b = zs_bucket_expert(g->m, layer, g->cplan_list[g->cplan_next - 1]);
        pthread_mutex_unlock(&g->mu);
        zs_gx_release(g, b); /* the one a failed caller still holds */
        pthread_mutex_lock(&g->mu);
    }
    while (g->cplan_next < g->cplan_n && !g->stop) {
        int b = zs_bucket_expert(g->m, layer, g->cplan_list[g->cplan_next]);
        pthread_mutex_unlock(&g->mu);
        const void *d;
        (void)zs_gx_acquire(g, b, &d);
        zs_gx_release(g, b);
        pthread_mutex_lock(&g->mu);
    }
    pthread_mutex_unlock(&g->mu);
}

int zs_gx_drain_mark(zs_gather *g, long k) {
    pthread_mutex_lock(&g->mu);
    int b = zs_gather_bucket_of(g, k), bwd = zs_gather_item_is_bwd(g, k);
    int rc = 0;
    if (bwd) rc = take_bwd_mark(g);
    pthread_mutex_unlock(&g->mu);
    if (!bwd) {
        uint64_t zero[ZS_EXPERT_WORDS] = {0}, agreed[ZS_EXPERT_WORDS];
        rc = zs_gx_experts(g, zs_pass_experts_layer(b), zero, agreed);
    }
    zs_gx_drain(g);
    return rc;
}

void zs_gx_invalidate(zs_gather *g, int bucket) {
    pthread_mutex_lock(&g->mu);
    xent_t *x = &g->xe[bucket];
    if (x->present) { /* between passes: nothing is still to be used */
        ZS_ASSERT(!pending(x));
        evict(g, bucket);
    }
    pthread_mutex_unlock(&g->mu);
}
