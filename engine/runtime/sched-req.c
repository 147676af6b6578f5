/* sched-req.c — the end of a scheduler request and its counters, below every other room of the
 * scheduler (it calls none of them): freeing a request, finishing one (its KV sequence closed,
 * its slot on the rank freed, the draft proposer told (spec.h), on_done called, the done counter
 * and the live list updated), and the per-token latency histograms behind /metrics. See
 * sched-impl.h. */
#include <string.h>

#include "common.h"
#include "kvswap.h"
#include "sched-impl.h"

static const double lat_bounds[ZS_SCHED_LAT_BUCKETS] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                        0.5,   1.0,  2.5,   5.0,  10.0, 30.0};

void zs_sreq_stats_init(zs_sched_stats *st) { memcpy(st->lat_bounds, lat_bounds, sizeof lat_bounds); }

static void observe(uint64_t *counts, uint64_t *count, double *sum, double v) {
    for (int i = 0; i < ZS_SCHED_LAT_BUCKETS; i++)
        if (v <= lat_bounds[i]) counts[i]++;
    (*count)++;
    *sum += v;
}

void zs_sreq_count_token(zs_sched *s, zs_request *r) {
    double now = zs_now();
    pthread_mutex_lock(&s->mu);
    if (r->n_gen == 0) observe(s->st.ttft_counts, &s->st.ttft_count, &s->st.ttft_sum, now - r->t_submit);
    else observe(s->st.itl_counts, &s->st.itl_count, &s->st.itl_sum, now - r->t_last);
    s->st.generated_tokens++;
    pthread_mutex_unlock(&s->mu);
    r->t_last = now;
}

void zs_sreq_free(zs_request *r) {
    if (!r) return;
    zs_sampler_free(r->smp);
    zs_detok_free(r->dt);
    zs_stop_free(r->st);
    free(r->acc);
    free(r->bh);
    free(r->gst);
    free(r->bits);
    free(r->masked);
    free(r->prompt);
    free(r);
}

void zs_sreq_finish(zs_sched *s, zs_request *r, int reason, const char *text, size_t len, int err,
                    const char *msg) {
    if (r->state == RQ_RUNNING) {
        zs_kv_seq_close(zs_world_kv(s->w, r->rank), r->seq);
        zs_spec_release(s->spec, (uintptr_t)r); /* the proposer's state of it (a draft model's KV) */
        zs_sched_rank *b = &s->rb[r->rank];
        for (int i = 0; i < b->n_running; i++)
            if (b->running[i] == r) {
                memmove(&b->running[i], &b->running[i + 1], (size_t)(b->n_running - i - 1) * sizeof(zs_request *));
                b->n_running--;
                break;
            }
    }
    if (r->state == RQ_PREEMPTED) {
        zs_kv_swapped_free(r->sw, s->kvt ? s->kvt[r->rank] : NULL);
        r->sw = NULL;
        zs_spec_release(s->spec, (uintptr_t)r);
    }
    r->sink.on_done(r->sink.ud, reason, text, len, r->n_prompt, r->n_gen, err, msg ? msg : "");
    pthread_mutex_lock(&s->mu);
    if (r->live_prev) r->live_prev->live_next = r->live_next;
    else s->live = r->live_next;
    if (r->live_next) r->live_next->live_prev = r->live_prev;
    s->n_live--;
    s->st.requests_done[reason]++;
    if (s->n_live == 0) pthread_cond_broadcast(&s->cv_idle);
    pthread_mutex_unlock(&s->mu);
    zs_sreq_free(r);
}
