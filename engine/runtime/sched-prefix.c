/* sched-prefix.c — the prefix cache as the scheduler feeds it (on unless
 * zs_sched_opts.no_prefix_cache; kvcache.h holds the cache itself). Every full KV block of a
 * prompt is kept, content-addressed by its whole token prefix, after its sequence ends: at submit
 * a request's full prompt blocks are hashed along the prefix (zs_sched_prefix_hash); at admission
 * (sched.c) the rank that holds most of its leading blocks takes it and its sequence takes those
 * blocks over instead of prefilling them (zs_kv_seq_share; all but the last token's block, whose
 * logits must be computed); after each step the blocks the step completed are published
 * (zs_sched_prefix_publish). Unreferenced cached blocks are evicted least recently used first
 * when a sequence needs room. Outputs are the same bits on or off (the forward is batch- and
 * chunk-invariant). Embedding requests and requests with an adapter neither use nor fill the
 * cache (an adapter's identity is not a stable key across unload and load). Off by itself with a
 * sliding-window ring (zs_kv_set_window). */
#include "common.h"
#include "kvprefix.h"
#include "sched-impl.h"

/* At submit: r->bh, the hash of each full prompt block (none when the cache is off or the request
 * does not use it). 0 or ZS_ENOMEM. */
int zs_sched_prefix_hash(zs_sched *s, zs_request *r, const zs_req_params *p) {
    if (!s->prefix || p->embed || p->lora || p->n_prompt < ZS_KV_BLOCK) return 0;
    r->n_bh = p->n_prompt / ZS_KV_BLOCK;
    r->bh = malloc((size_t)r->n_bh * sizeof(uint64_t));
    if (!r->bh) return zs_err(ZS_ENOMEM, "out of memory");
    for (int j = 0; j < r->n_bh; j++)
        r->bh[j] = zs_kv_prefix_hash(j ? r->bh[j - 1] : 0, 0, p->prompt + (size_t)j * ZS_KV_BLOCK);
    return 0;
}

/* After a step: the prompt blocks of rank's running requests that are now complete go into that
 * rank's cache. Engine thread. */
void zs_sched_prefix_publish(zs_sched *s, int rank) {
    zs_sched_rank *b = &s->rb[rank];
    for (int j = 0; j < b->n_running; j++) {
        zs_request *r = b->running[j];
        while (r->bh && r->n_pub < r->n_bh && (r->n_pub + 1) * ZS_KV_BLOCK <= r->n_done) {
            zs_kv_seq_publish(zs_world_kv(s->w, rank), r->seq, r->n_pub, r->bh[r->n_pub]);
            if (s->kvp && s->kvp[rank]) zs_kvprefix_publish(s->kvp[rank], r->seq, r->n_pub, r->bh[r->n_pub]);
            r->n_pub++;
        }
    }
}
