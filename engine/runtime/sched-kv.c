/* sched-kv.c — the KV cache's room when it has a tier below memory (--kv-offload): sequences
 * reserve blocks as they grow instead of their whole length at admission. When a running sequence
 * cannot grow, with --kv-stream the youngest sequence in memory is streamed (kvstream.h): its
 * blocks go to the tier and it keeps running, with a stage block per block in memory, as long as
 * steps hardly wait for the tier's reads. Otherwise (by default, which measured faster on a CPU)
 * the youngest are preempted: swapped out to the tier (kvswap.h) and
 * resumed later bit for bit, or recomputed (a streamed sequence, or one the tier cannot take: a
 * full disk): their prompt and generated tokens are prefilled again (the kernels are
 * batch-invariant, so the recomputed K/V are the same bits). Preempted requests resume
 * first-preempted first, before any new request is admitted. Without a tier the scheduler
 * reserves whole requests (sched.c) and none of this runs. A request longer than the cache's
 * memory runs streamed in any case (admitted alone in memory, it would never fit). */
#include <string.h>

#include "common.h"
#include "kvprefix.h"
#include "kvstream.h"
#include "kvswap.h"
#include "sched-impl.h"

int zs_sched_kv_init(zs_sched *s) {
    s->kvt = NULL;
    s->kvp = NULL;
    if (!zs_engine_kv_tier(s->e, 0)) return 0;
    s->kvt = calloc((size_t)s->nranks, sizeof *s->kvt);
    s->kvp = calloc((size_t)s->nranks, sizeof *s->kvp);
    s->kvs = calloc((size_t)s->nranks, sizeof *s->kvs);
    if (!s->kvt || !s->kvp || !s->kvs) return zs_err(ZS_ENOMEM, "out of memory");
    for (int i = 0; i < s->nranks; i++) {
        s->kvt[i] = zs_engine_kv_tier(s->e, i);
        s->kvp[i] = zs_engine_kv_prefix(s->e, i);
        s->kvs[i] = zs_engine_kv_stream(s->e, i);
    }
    s->kv_stream_on = zs_engine_kv_stream_on(s->e);
    return 0;
}

int zs_sched_kv_prefix_lookup(zs_sched *s, int rank, const uint64_t *hashes, int n) {
    int k = zs_kv_prefix_lookup(zs_world_kv(s->w, rank), hashes, n);
    if (s->kvp && s->kvp[rank] && k < n) k += zs_kvprefix_lookup(s->kvp[rank], hashes + k, n - k);
    return k;
}

/* rank's stream, while it takes sequences */
static zs_kvstream *stream_of(const zs_sched *s, int rank) {
    zs_kvstream *st = s->kvs ? s->kvs[rank] : NULL;
    return st && zs_kvstream_ok(st) ? st : NULL;
}

/* 1 when r at its full length needs more blocks than rank's memory has */
static int longer_than_memory(const zs_sched *s, int rank, const zs_request *r) {
    return (r->n_prompt + r->max_tokens + ZS_KV_BLOCK - 1) / ZS_KV_BLOCK > zs_kv_total_blocks(zs_world_kv(s->w, rank));
}

int zs_sched_kv_reserve(zs_sched *s, int rank, int seq, const zs_request *r) {
    zs_kvcache *kv = zs_world_kv(s->w, rank);
    int need = zs_sched_kv_need(s, r);
    if (zs_kv_seq_reserve(kv, seq, need) == 0) return 0;
    if (!s->kvt || r->embed || zs_kv_seq_streamed(kv, seq) || !stream_of(s, rank)) return ZS_ENOSPC;
    /* new sequences wait for room in memory, unless --kv-stream or they can never have it */
    if (!s->kv_stream_on && !longer_than_memory(s, rank, r)) return ZS_ENOSPC;
    zs_kv_seq_set_streamed(kv, seq); /* its shared prefix blocks stay; the rest are streamed */
    if (zs_kv_seq_reserve(kv, seq, need) < 0) return ZS_ENOSPC;
    pthread_mutex_lock(&s->mu);
    s->st.kv_streamed++;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

int zs_sched_kv_fits(const zs_sched *s, int rank, int positions) {
    zs_kvcache *kv = zs_world_kv(s->w, rank);
    int blocks = (positions + ZS_KV_BLOCK - 1) / ZS_KV_BLOCK;
    if (zs_kv_ring(kv) || blocks <= zs_kv_total_blocks(kv)) return 1;
    return stream_of(s, rank) && blocks <= zs_kv_total_blocks(kv) * zs_kv_stage_per_block(kv);
}

int zs_sched_kv_prefix_take(zs_sched *s, int rank, int seq, const uint64_t *hashes, int n) {
    int k = zs_kv_seq_share(zs_world_kv(s->w, rank), seq, hashes, n), t = 0;
    if (s->kvp && s->kvp[rank] && k < n) t = zs_kvprefix_take(s->kvp[rank], seq, hashes, n);
    if (t) {
        pthread_mutex_lock(&s->mu);
        s->st.prefix_tier_hit_blocks += (uint64_t)t;
        pthread_mutex_unlock(&s->mu);
    }
    return k + t;
}

int zs_sched_kv_need(const zs_sched *s, const zs_request *r) {
    int full = r->n_prompt + r->max_tokens;
    if (!s->kvt) return full;
    /* the position the next decode token goes to, then its drafts */
    int p = r->n_done < r->n_ctx ? r->n_ctx : r->n_prompt + r->n_gen - 1;
    return ZS_MIN(full, p + 1 + (s->spec_on ? ZS_SPEC_MAX_TOKENS : 0));
}

static void unlink_running(zs_sched *s, zs_request *r) {
    zs_sched_rank *b = &s->rb[r->rank];
    for (int i = 0; i < b->n_running; i++)
        if (b->running[i] == r) {
            memmove(&b->running[i], &b->running[i + 1], (size_t)(b->n_running - i - 1) * sizeof(zs_request *));
            b->n_running--;
            return;
        }
}

/* r out of the cache: swapped to the tier, else set up to be recomputed; queued to resume */
static void preempt(zs_sched *s, zs_request *r) {
    zs_kvcache *kv = zs_world_kv(s->w, r->rank);
    zs_kv_swapped *sw = NULL;
    int blocks = 0;
    const int *units;
    blocks = zs_kv_seq_units(kv, r->seq, &units);
    int streamed = zs_kv_seq_streamed(kv, r->seq); /* its K/V are in the stream's records: recomputed */
    if (streamed || zs_kv_swap_out(kv, r->seq, s->kvt[r->rank], &sw) < 0) {
        if (!streamed && !s->kv_tier_warned) {
            zs_log_warn("KV offload: %s; preempted sequences are recomputed instead (serving goes on from memory)",
                        zs_errmsg());
            s->kv_tier_warned = 1;
        }
        zs_kv_seq_close(kv, r->seq);
        /* everything before the next decode position is prefilled again; drafts and pending
         * moves of a verified tree are void (the recomputed K/V are in place already) */
        if (r->n_done >= r->n_ctx) r->n_ctx = r->n_prompt + r->n_gen - 1;
        r->n_done = 0;
        r->n_moves = 0;
        r->n_draft = 0;
    }
    r->sw = sw;
    r->seq = -1;
    r->state = RQ_PREEMPTED;
    unlink_running(s, r);
    r->next = NULL;
    if (s->preempted_tail) s->preempted_tail->next = r;
    else s->preempted = r;
    s->preempted_tail = r;
    pthread_mutex_lock(&s->mu);
    if (sw) {
        s->st.kv_swap_outs++;
        s->st.kv_swap_out_blocks += (uint64_t)blocks;
    } else {
        s->st.kv_recomputes++;
    }
    s->st.kv_preempted++;
    pthread_mutex_unlock(&s->mu);
}

enum { ANY, MOVABLE, IN_MEMORY };

/* the youngest running request of rank i that may be preempted (not an embedding), or NULL;
 * IN_MEMORY: one not streamed; MOVABLE: one not streamed with a block that can be */
static zs_request *youngest(zs_sched *s, int i, int which) {
    zs_kvcache *kv = zs_world_kv(s->w, i);
    zs_request *y = NULL;
    for (int j = 0; j < s->rb[i].n_running; j++) {
        zs_request *r = s->rb[i].running[j];
        if (r->embed || (y && r->admit_no < y->admit_no)) continue;
        if (which != ANY && zs_kv_seq_streamed(kv, r->seq)) continue;
        if (which == MOVABLE) {
            const int *b = zs_kv_seq_blocks(kv, r->seq);
            int n = (zs_kv_seq_len(kv, r->seq) + ZS_KV_BLOCK - 1) / ZS_KV_BLOCK, movable = 0;
            for (int k = 0; k < n && !movable; k++) movable = zs_kv_block_movable(kv, b[k]);
            if (!movable) continue;
        }
        y = r;
    }
    return y;
}

/* streaming more stops paying when steps wait this share of their time for streamed K/V: the
 * tier's reads no longer hide behind the compute, and swapping the youngest out does better */
#define STREAM_WAIT_MAX 0.10

void zs_sched_kv_step_done(zs_sched *s, double dt) {
    double w = 0;
    for (int i = 0; s->kvs && i < s->nranks; i++) {
        zs_kvstream_stats ks;
        if (!s->kvs[i]) continue;
        zs_kvstream_stats_get(s->kvs[i], &ks);
        w += ks.wait_s;
    }
    double share = dt > 0 ? (w - s->kv_stream_wait_s0) / (dt * s->nranks) : 0;
    s->kv_stream_wait_s0 = w;
    s->kv_stream_wait = 0.8 * s->kv_stream_wait + 0.2 * share;
}

/* r cannot grow: with --kv-stream the youngest sequence in memory goes on streamed (its blocks to
 * the tier), else r itself when memory could never hold it; 1 when one did. */
static int stream_youngest(zs_sched *s, int i, zs_request *r) {
    zs_kvstream *st = stream_of(s, i);
    zs_request *v = NULL;
    if (!st) return 0;
    if (s->kv_stream_on && s->kv_stream_wait <= STREAM_WAIT_MAX) v = youngest(s, i, MOVABLE);
    if (!v && longer_than_memory(s, i, r)) v = r;
    if (!v) return 0;
    if (zs_kvstream_convert(st, v->seq) < 0) {
        zs_log_warn("KV streaming: %s; the sequence is preempted instead", zs_errmsg());
        return 0;
    }
    pthread_mutex_lock(&s->mu);
    s->st.kv_streamed++;
    pthread_mutex_unlock(&s->mu);
    return 1;
}

/* The full blocks streamed sequences grew in memory go to the tier (kvstream.h), so memory keeps
 * only their last block. Not a sequence whose verified tree still has K/V moves to make. */
static void settle(zs_sched *s, int i) {
    zs_kvstream *st = s->kvs ? s->kvs[i] : NULL;
    if (!st) return;
    zs_kvcache *kv = zs_world_kv(s->w, i);
    int n = 0, seqs[s->rb[i].n_running + 1], written[s->rb[i].n_running + 1];
    for (int j = 0; j < s->rb[i].n_running; j++) {
        zs_request *r = s->rb[i].running[j];
        if (r->embed || r->n_moves || !zs_kv_seq_streamed(kv, r->seq)) continue;
        seqs[n] = r->seq;
        written[n++] = r->n_done < r->n_ctx ? r->n_done : r->n_prompt + r->n_gen - 1;
    }
    if (n && zs_kvstream_settle(st, seqs, written, n) < 0)
        zs_log_warn("KV streaming: %s", zs_errmsg());
}

void zs_sched_kv_grow(zs_sched *s) {
    if (!s->kvt) return;
    for (int i = 0; i < s->nranks; i++) {
        zs_kvcache *kv = zs_world_kv(s->w, i);
        /* a streamed block that could not be written: those sequences are recomputed */
        for (int j = 0; s->kvs && s->kvs[i] && j < s->rb[i].n_running;) {
            zs_request *r = s->rb[i].running[j];
            if (zs_kvstream_seq_lost(s->kvs[i], r->seq)) preempt(s, r);
            else j++;
        }
        settle(s, i); /* first: the memory it frees is room for the rest */
        /* oldest first: they keep their room, the youngest give theirs up */
        for (int j = 0; j < s->rb[i].n_running;) {
            zs_request *r = s->rb[i].running[j];
            int need = zs_sched_kv_need(s, r);
            if (zs_kv_seq_len(kv, r->seq) >= need || zs_kv_seq_reserve(kv, r->seq, need) == 0) {
                j++;
                continue;
            }
            /* memory blocks run out: the youngest in memory is streamed (r itself, maybe) */
            if (!zs_kv_seq_streamed(kv, r->seq) && stream_youngest(s, i, r)) continue;
            /* else the youngest in memory is swapped out (whole blocks come free), else the youngest
             * streamed one is recomputed */
            zs_request *v = youngest(s, i, IN_MEMORY);
            if (!v) v = youngest(s, i, ANY);
            if (!v) break; /* only embeddings: they hold whole prompts already */
            preempt(s, v);
            if (v == r) continue; /* running[j] is the next one now */
            for (j = 0; j < s->rb[i].n_running && s->rb[i].running[j] != r; j++) {}
        }
    }
}

/* Resumes preempted requests in the order they were preempted; returns 1 while any is left (new
 * requests wait behind them). */
int zs_sched_kv_resume(zs_sched *s) {
    while (s->preempted) {
        zs_request *r = s->preempted;
        zs_sched_rank *b = &s->rb[r->rank];
        zs_kvcache *kv = zs_world_kv(s->w, r->rank);
        if (b->n_running >= s->per_rank) return 1;
        int seq, rc, blocks = r->sw ? zs_kv_swapped_blocks(r->sw) : 0;
        /* back only with room for its next step too: else the oldest running would preempt it
         * again at once */
        int need = (zs_sched_kv_need(s, r) + ZS_KV_BLOCK - 1) / ZS_KV_BLOCK;
        if (zs_kv_ring(kv)) need = ZS_MIN(need, zs_kv_ring(kv));
        if (zs_kv_avail_blocks(kv) < ZS_MAX(blocks, need) && (r->sw || zs_kv_stage_avail(kv) < need)) return 1;
        if (r->sw) {
            rc = zs_kv_swap_in(kv, r->sw, s->kvt[r->rank], &seq);
            if (rc == ZS_EBUSY || rc == ZS_ENOSPC) return 1;
            if (rc == 0) r->sw = NULL;
            /* moves of a verified tree apply to the sequence's new slot */
            for (int m = 0; rc == 0 && m < r->n_moves; m++) r->moves[m].seq = seq;
        } else {
            if ((rc = zs_kv_seq_open(kv, &seq)) < 0) return 1;
            int n_share = r->bh ? ZS_MIN(r->n_bh, (r->n_ctx - 1) / ZS_KV_BLOCK) : 0;
            int shared = n_share > 0 ? zs_sched_kv_prefix_take(s, r->rank, seq, r->bh, n_share) : 0;
            if (zs_sched_kv_reserve(s, r->rank, seq, r) < 0) {
                zs_kv_seq_close(kv, seq);
                return 1;
            }
            r->n_done = shared * ZS_KV_BLOCK;
        }
        s->preempted = r->next;
        if (!s->preempted) s->preempted_tail = NULL;
        r->next = NULL;
        if (rc < 0) { /* the tier lost it (read error, checksum): the request fails, the rest go on */
            char msg[300];
            snprintf(msg, sizeof msg, "its KV cache could not be read back: %s", zs_errmsg());
            zs_log_error("request preempted to the KV tier: %s", msg);
            zs_sreq_finish(s, r, ZS_DONE_ERROR, "", 0, rc, msg);
            continue;
        }
        r->seq = seq;
        r->state = RQ_RUNNING;
        b->running[b->n_running++] = r;
        if (blocks) {
            pthread_mutex_lock(&s->mu);
            s->st.kv_swap_in_blocks += (uint64_t)blocks;
            pthread_mutex_unlock(&s->mu);
        }
    }
    return 0;
}

void zs_sched_kv_reap(zs_sched *s, int stop) {
    for (zs_request **pp = &s->preempted; *pp;) {
        zs_request *r = *pp;
        if (stop || atomic_load(&r->cancelled) || atomic_load(&r->failed)) {
            *pp = r->next;
            r->next = NULL;
            if (!stop && atomic_load(&r->failed)) zs_sreq_finish(s, r, ZS_DONE_ERROR, "", 0, ZS_ECANCELLED, r->fail_msg);
            else zs_sreq_finish(s, r, ZS_DONE_CANCELLED, "", 0, ZS_ECANCELLED, "cancelled");
        } else {
            pp = &r->next;
        }
    }
    s->preempted_tail = NULL;
    for (zs_request *r = s->preempted; r; r = r->next) s->preempted_tail = r;
}

int zs_sched_kv_preempted(const zs_sched *s) {
    int n = 0;
    for (const zs_request *r = s->preempted; r; r = r->next) n++;
    return n;
}

void zs_sched_kv_prefix_stats(const zs_sched *s, zs_sched_stats *st) {
    st->prefix_tier_stored = st->prefix_tier_dropped = 0;
    st->prefix_tier_held = st->prefix_tier_restored = 0;
    for (int i = 0; s->kvp && i < s->nranks; i++) {
        zs_kvprefix_stats ps;
        if (!s->kvp[i]) continue;
        zs_kvprefix_stats_get(s->kvp[i], &ps);
        st->prefix_tier_stored += ps.stored;
        st->prefix_tier_dropped += ps.dropped;
        st->prefix_tier_held += ps.held;
        st->prefix_tier_restored += ps.restored;
    }
}

void zs_sched_kv_stream_stats(const zs_sched *s, zs_sched_stats *st) {
    st->kv_stream_loads = st->kv_stream_stores = st->kv_stream_bytes_in = st->kv_stream_bytes_out = 0;
    st->kv_stream_write_errors = st->kv_stream_settled = 0;
    st->kv_stream_wait_s = 0;
    st->kv_streamed_now = 0;
    for (int i = 0; s->kvs && i < s->nranks; i++) {
        zs_kvstream_stats ks;
        if (!s->kvs[i]) continue;
        zs_kvstream_stats_get(s->kvs[i], &ks);
        st->kv_stream_loads += ks.loads;
        st->kv_stream_stores += ks.stores;
        st->kv_stream_bytes_in += ks.bytes_in;
        st->kv_stream_bytes_out += ks.bytes_out;
        st->kv_stream_write_errors += ks.write_errors;
        st->kv_stream_settled += ks.settled;
        st->kv_stream_wait_s += ks.wait_s;
        zs_kvcache *kv = zs_world_kv(s->w, i);
        for (int j = 0; j < s->rb[i].n_running; j++)
            st->kv_streamed_now += zs_kv_seq_streamed(kv, s->rb[i].running[j]->seq);
    }
}
