/* gather-impl.h — the insides of the gather coordinator, shared by its three files, whose calls
 * run one way: gather.c (shards, the prefetch thread, the static buckets) -> gather-experts.c (the
 * experts of a mixture of experts: the agreement at each layer's mark, the expert cache,
 * speculation) -> gather-read.c (NVMe completions, shard repair). Not a public header: only those
 * three files include it. Every field after `mu` is guarded by it unless its comment says otherwise.
 * Items are numbered over all passes; the ring holds them in that order, each one's bucket found
 * through the pass that holds it (zs_gather_tidx: the current range of the training order, or the
 * known next one), so the ranks' prefetchers gather the same items as long as every rank begins
 * the same ranges with the same declarations. */
#ifndef ZS_GATHER_IMPL_H
#define ZS_GATHER_IMPL_H

#include <pthread.h>

#include "gather.h"
#include "pinned.h"
#include "store.h"

typedef struct {
    int bucket;        /* or a ZS_PASS_EXPERTS mark */
    int slot;          /* pinned slot of its NVMe read, -1 */
    int read_done;     /* NVMe read finished */
    int read_status;
    int ready;         /* published to the compute thread */
    int status;        /* agreed status */
    void *buf;         /* full bucket (or the shard itself in direct mode) */
    size_t live;       /* bytes it counts against the live budget */
    int remote;        /* failed because another rank's read failed */
    char msg[320];
    /* a mark: its plan (the agreed experts, in increasing order) */
    long plan_id;
    int plan_n;
    uint64_t agreed[ZS_EXPERT_WORDS];
} item_t;

typedef struct fbuf { void *p; size_t cap; struct fbuf *next; } fbuf;

/* One expert bucket in the cache. Presence, LRU order and eviction victims change only on the
 * prefetch thread, in an order every rank repeats; the compute thread sets held / released_plan. */
typedef struct {
    void *buf;          /* the full expert while present */
    int present;
    int spec;           /* gathered speculatively and not used since */
    long lru;           /* the cache clock when last listed (or speculated) */
    long used_plan;     /* the last plan that lists it */
    long ready_plan;    /* the plan the prefetcher has made it ready for (the compute thread may take it) */
    long released_plan; /* the last plan in which the compute thread released it */
    int held;           /* acquired and not yet released */
    int status;         /* for ready_plan: 0, or the agreed failure */
    char msg[240];
} xent_t;

/* An NVMe read of an expert shard into a pinned slot. */
typedef struct { int busy, done, status, bucket; char msg[240]; } xread_t;

struct zs_gather {
    const zs_model *m;
    int rank, nranks;
    zs_comm *comm;
    zs_gather_opts o;
    int n_buckets;
    size_t *shard_bytes, *full_bytes;
    void **shards;            /* none/cpu: shard of each bucket */
    void *host_region;        /* cpu tier: one pinned region holding all shards */
    zs_pinned *pinned_all;    /* cpu tier */
    zs_shard_file *file;      /* nvme tier */
    zs_pinned *slots;         /* nvme tier: read slots */
    zs_shard_reader *reader;
    int direct;               /* no pipeline: acquire returns the shard itself */

    int *order;               /* the inference order, marks included (also built in direct mode) */
    int n_order;
    int *torder;              /* the training order: order[], then the layers in reverse, each MoE
                                 layer followed by its mark again; every pass is a range of it */
    int n_torder;
    int max_len;              /* longest pass (n_torder) */
    /* Items are numbered from 0 over all passes. The current pass is items [cur_start, cur_start +
     * cur.count), torder[cur.first ..]; the next pass, when known (declared at the last begin, or
     * the inference pass while speculation is on), follows it at once. Nothing beyond is known, so
     * the prefetcher never runs more than one pass ahead; it enters the next pass only once the
     * consumer has acquired an item of the current one or ended it (cur_ended). */
    int spec;
    long cur_start;
    zs_pass_range cur;        /* count 0 before the first pass */
    int cur_ended;
    int has_next;
    zs_pass_range next;
    item_t *ring;
    long ring_n;

    pthread_t thread;
    int thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
    long produced;            /* items published */
    long consumed;            /* items acquired */
    long released;            /* items released */
    long submitted;           /* NVMe reads submitted (item index; prefetch thread only) */
    size_t live, live_limit;  /* the static buckets (experts are counted apart) */
    int pass_rc, pass_remote; /* first failure of this pass (a local one preferred) */
    char pass_msg[320];
    fbuf *free_bufs;
    zs_gather_stats st;
    int has_dev;              /* the rank's device is a GPU: buffers in device memory */
    zs_gather_dev dv;

    /* ---- experts (gather-experts.c); moe 0 for a dense model ---- */
    int moe, n_exp, n_moe_layers;
    size_t max_static_full, max_expert_full;
    xent_t *xe;               /* [n_buckets]; only expert buckets' entries are used */
    size_t xused, xlimit;     /* full expert bytes held / the bound */
    long xclock;              /* LRU clock (prefetch thread) */
    long xplan_id;            /* plans made (prefetch thread) */
    uint64_t (*last_agreed)[ZS_EXPERT_WORDS]; /* [n_layers] each layer's latest forward agreement */
    unsigned char *has_last;  /* [n_layers] */
    float *spec_score;        /* [n_layers] how often the previous pass's experts were used again */
    fbuf *xfree;              /* expert buffers not in use */
    /* the compute thread's mask for the mark at item posted_k (one at a time) */
    long posted_k;
    uint64_t posted_mask[ZS_EXPERT_WORDS];
    int posted_wasted;        /* ... drained in a pass consumed unused (every rank alike) */
    int wasting;              /* compute thread: consuming a declared or speculated pass unused */
    /* the plan the compute thread is consuming (compute thread; read by the prefetcher under mu) */
    int cplan_open, cplan_layer;
    long cplan_id;
    long cdone_plan;          /* the last plan the compute thread has wholly given back */
    int cplan_n, cplan_next;
    int *cplan_list;          /* [n_exp] expert ids in increasing order */
    xread_t *xr;              /* [pinned slots] NVMe expert reads */
    void *xsync;              /* a shard-sized buffer for a synchronous read when no slot is free */
};

#define XTAG (1ULL << 62) /* an expert read's tag: XTAG | slot (an item's read is tagged with its index) */

/* the ring of items in pass order */
static inline item_t *zs_gather_ring_at(zs_gather *g, long k) { return &g->ring[k % g->ring_n]; }
/* Under mu: the index in torder of item k, or -1 while no known pass holds it. */
static inline int zs_gather_tidx(const zs_gather *g, long k) {
    long end = g->cur_start + g->cur.count;
    if (k >= g->cur_start && k < end) return g->cur.first + (int)(k - g->cur_start);
    if (g->has_next && k >= end && k < end + g->next.count) return g->next.first + (int)(k - end);
    return -1;
}
/* Under mu: the bucket of item k (or a mark), or -1 while its pass is not known. */
static inline int zs_gather_bucket_of(const zs_gather *g, long k) {
    int t = zs_gather_tidx(g, k);
    return t < 0 ? -1 : g->torder[t];
}
/* Under mu: item k is in a backward (past the inference prefix of torder), whatever pass holds it. */
static inline int zs_gather_item_is_bwd(const zs_gather *g, long k) { return zs_gather_tidx(g, k) >= g->n_order; }

/* gather-read.c (prefetch thread) */
void zs_gather_reap(zs_gather *g);                /* one NVMe completion (waits) */
void zs_gather_wait_read(zs_gather *g, long k);   /* until item k's read is done */
/* Rewrites shard `bad` (and any past a truncated file's end) from the checkpoint, marking fixed[b];
 * reads in flight after item k of rewritten shards are made again. */
void zs_gather_repair(zs_gather *g, int bad, long k, unsigned char *fixed);

/* gather-experts.c */
int  zs_gx_init(zs_gather *g);                   /* at new: sizes, limits (after shard sizes) */
void zs_gx_free(zs_gather *g);
void zs_gx_mark(zs_gather *g, long k, int layer, int bwd); /* prefetch thread: process mark item k */
int  zs_gx_experts(void *ctx, int layer, const uint64_t *mask, uint64_t *agreed); /* the source's experts() */
int  zs_gx_acquire(zs_gather *g, int bucket, const void **data);
void zs_gx_release(zs_gather *g, int bucket);
void zs_gx_consume_bwd_marks(zs_gather *g);      /* under mu: consume backward marks with empty plans */
void zs_gx_invalidate(zs_gather *g, int bucket); /* a new shard was written: drop the cached expert */
void zs_gx_drain(zs_gather *g);                  /* pass_end: finish the open plan */
int  zs_gx_drain_mark(zs_gather *g, long k);     /* pass_end: consume mark item k and its plan */

#endif
