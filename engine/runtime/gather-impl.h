/* gather-impl.h — the insides of the gather coordinator, shared by its three files, whose calls
 * run one way: gather.c (shards, the prefetch thread, the static buckets) -> gather-experts.c (the
 * experts of a mixture of experts: the agreement at each layer's mark, the expert cache,
 * speculation) -> gather-read.c (NVMe completions, shard repair). Not a public header: only those
 * three files include it. Every field after `mu` is guarded by it unless its comment says otherwise. */
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

    int *order;               /* pass order of kind 0 (inference), marks included */
    int n_order;
    int *torder;              /* pass order of kind 1 (training: forward, then layers in reverse, each
                                 MoE layer followed by its mark again) */
    int n_torder;
    int max_len;              /* longest pass */
    /* which bucket item k is: with speculation on (serving), every pass from spec_base on is of
     * kind 0 and the prefetcher runs into the next pass; with it off, only the items of the
     * current pass (begun with its kind) are known */
    int spec;
    long spec_base;
    long cur_start;           /* first item of the consumer's current pass */
    int cur_kind;
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
    long pass_start;
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
static inline int zs_gather_pass_len(const zs_gather *g, int kind) { return kind ? g->n_torder : g->n_order; }
/* Under mu: the bucket of item k, or -1 while its pass has not begun (speculation off). */
static inline int zs_gather_bucket_of(const zs_gather *g, long k) {
    if (g->spec && k >= g->spec_base) return g->order[(k - g->spec_base) % g->n_order];
    if (k >= g->cur_start && k < g->cur_start + zs_gather_pass_len(g, g->cur_kind))
        return (g->cur_kind ? g->torder : g->order)[k - g->cur_start];
    return -1;
}
/* Under mu: item k is in a training pass's backward. */
static inline int zs_gather_item_is_bwd(const zs_gather *g, long k) {
    if (g->spec && k >= g->spec_base) return 0;
    return g->cur_kind == 1 && k >= g->cur_start + g->n_order && k < g->cur_start + g->n_torder;
}

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
