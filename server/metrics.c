/* metrics.c — GET /metrics: the HTTP request counters, the scheduler's counters, gauges and
 * latency histograms, and fine-tuning's (a job's steps, the share it has beside serving), in the
 * Prometheus text exposition format 0.0.4. */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "api.h"
#include "common.h"

/* the training gauges (zs_metrics_set_training): the fine-tuning job running now, process-wide */
static pthread_mutex_t train_mu = PTHREAD_MUTEX_INITIALIZER;
static long train_step, train_skipped;
static double train_scale = 1.0;
static int train_seen;

void zs_metrics_set_training(long step, double loss_scale, long skipped_steps) {
    pthread_mutex_lock(&train_mu);
    train_step = step;
    train_scale = loss_scale;
    train_skipped = skipped_steps;
    train_seen = 1;
    pthread_mutex_unlock(&train_mu);
}

/* a full fine-tuning job's duty cycle (zs_metrics_train_*), process-wide under train_mu: its
 * totals, and the seconds trained while serving was busy and waited, decayed over about 10 s
 * (as the scheduler's achieved share) */
#define DUTY_DECAY_S 10.0
static double full_train_s, full_wait_s, duty_busy_s, duty_wait_s, duty_t, full_share;
static uint64_t full_tokens, full_steps;
static int full_active;

static void duty_decay_locked(void) {
    double t = zs_now();
    if (duty_t > 0) {
        double f = exp(-(t - duty_t) / DUTY_DECAY_S);
        duty_busy_s *= f;
        duty_wait_s *= f;
    }
    duty_t = t;
}

void zs_metrics_train_step(double step_s, int busy, uint64_t tokens, double share) {
    pthread_mutex_lock(&train_mu);
    duty_decay_locked();
    full_train_s += step_s;
    full_tokens += tokens;
    full_steps++;
    if (busy) duty_busy_s += step_s;
    full_share = share;
    pthread_mutex_unlock(&train_mu);
}

void zs_metrics_train_wait(double wait_s) {
    pthread_mutex_lock(&train_mu);
    duty_decay_locked();
    full_wait_s += wait_s;
    duty_wait_s += wait_s;
    pthread_mutex_unlock(&train_mu);
}

void zs_metrics_train_active(int active, double share) {
    pthread_mutex_lock(&train_mu);
    full_active = active;
    if (active) {
        full_share = share;
        duty_busy_s = duty_wait_s = 0; /* a new job's share is its own */
        duty_t = 0;
    }
    pthread_mutex_unlock(&train_mu);
}

typedef struct {
    char *p;
    size_t len, cap;
    int oom;
} obuf;

static void outf(obuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void outf(obuf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = 1;
            return;
        }
        if (b->p && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t nc = b->cap ? b->cap : 4096;
        while (nc <= b->len + (size_t)n) nc *= 2;
        char *np = realloc(b->p, nc);
        if (!np) {
            b->oom = 1;
            return;
        }
        b->p = np;
        b->cap = nc;
    }
}

static void head(obuf *b, const char *name, const char *type, const char *help) {
    outf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A label value with \, " and newline escaped. */
static void label_value(obuf *b, const char *s) {
    for (; *s; s++) {
        if (*s == '\\') outf(b, "\\\\");
        else if (*s == '"') outf(b, "\\\"");
        else if (*s == '\n') outf(b, "\\n");
        else outf(b, "%c", *s);
    }
}

static void count_cb(void *ud, const char *route, const char *method, int status, long count) {
    obuf *b = ud;
    outf(b, "zeroserve_requests_total{route=\"");
    label_value(b, route);
    outf(b, "\",method=\"");
    label_value(b, method);
    outf(b, "\",status=\"%d\"} %ld\n", status, count);
}

/* nb buckets; bounds must grow from above `prev` (unset latency bounds, all 0, print none) */
static void histogram_n(obuf *b, const char *name, const char *help, const double *bounds, int nb, double prev,
                        const uint64_t *counts, uint64_t count, double sum) {
    head(b, name, "histogram", help);
    for (int i = 0; i < nb; i++) {
        if (!(bounds[i] > prev)) continue; /* unset or not increasing */
        outf(b, "%s_bucket{le=\"%g\"} %llu\n", name, bounds[i], (unsigned long long)counts[i]);
        prev = bounds[i];
    }
    outf(b, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)count);
    outf(b, "%s_sum %.9g\n", name, sum);
    outf(b, "%s_count %llu\n", name, (unsigned long long)count);
}

static void histogram(obuf *b, const char *name, const char *help, const double *bounds,
                      const uint64_t *counts, uint64_t count, double sum) {
    histogram_n(b, name, help, bounds, ZS_SCHED_LAT_BUCKETS, 0, counts, count, sum);
}

int zs_metrics_render(zs_http *h, zs_sched *s, char **out, size_t *len) {
    if (!out || !len) return zs_err(ZS_EINVAL, "metrics: bad arguments");
    zs_sched_stats st;
    memset(&st, 0, sizeof st);
    if (s) zs_sched_stats_get(s, &st);
    obuf b = {0};

    head(&b, "zeroserve_requests_total", "counter", "HTTP requests by route, method and status.");
    if (h) zs_http_counts(h, count_cb, &b);

    head(&b, "zeroserve_prompt_tokens_total", "counter", "Prompt tokens processed.");
    outf(&b, "zeroserve_prompt_tokens_total %llu\n", (unsigned long long)st.prompt_tokens);
    head(&b, "zeroserve_generation_tokens_total", "counter", "Tokens generated.");
    outf(&b, "zeroserve_generation_tokens_total %llu\n", (unsigned long long)st.generated_tokens);

    histogram(&b, "zeroserve_time_to_first_token_seconds", "Time from submission to the first generated token.",
              st.lat_bounds, st.ttft_counts, st.ttft_count, st.ttft_sum);
    histogram(&b, "zeroserve_inter_token_latency_seconds", "Time between consecutive generated tokens of a sequence.",
              st.lat_bounds, st.itl_counts, st.itl_count, st.itl_sum);

    head(&b, "zeroserve_queue_length", "gauge", "Requests waiting to be admitted.");
    outf(&b, "zeroserve_queue_length %d\n", st.queued);
    head(&b, "zeroserve_running_sequences", "gauge", "Sequences being generated.");
    outf(&b, "zeroserve_running_sequences %d\n", st.running);
    head(&b, "zeroserve_kv_blocks_used", "gauge", "KV cache blocks in use (all ranks).");
    outf(&b, "zeroserve_kv_blocks_used %d\n", st.kv_used);
    head(&b, "zeroserve_kv_blocks_total", "gauge", "KV cache blocks (all ranks).");
    outf(&b, "zeroserve_kv_blocks_total %d\n", st.kv_total);
    head(&b, "zeroserve_kv_cached_blocks", "gauge", "KV blocks the prefix cache keeps that no sequence holds (evictable).");
    outf(&b, "zeroserve_kv_cached_blocks %d\n", st.kv_cached);
    head(&b, "zeroserve_prefix_cache_lookup_blocks_total", "counter", "Full prompt blocks looked up in the prefix cache.");
    outf(&b, "zeroserve_prefix_cache_lookup_blocks_total %llu\n", (unsigned long long)st.prefix_lookup_blocks);
    head(&b, "zeroserve_prefix_cache_hit_blocks_total", "counter", "Prompt blocks found in the prefix cache (not prefilled).");
    outf(&b, "zeroserve_prefix_cache_hit_blocks_total %llu\n", (unsigned long long)st.prefix_hit_blocks);
    head(&b, "zeroserve_prefix_cache_miss_blocks_total", "counter", "Prompt blocks looked up and not found (prefilled).");
    outf(&b, "zeroserve_prefix_cache_miss_blocks_total %llu\n",
         (unsigned long long)(st.prefix_lookup_blocks - st.prefix_hit_blocks));
    head(&b, "zeroserve_prefix_cache_hit_tokens_total", "counter", "Prompt tokens taken from the prefix cache.");
    outf(&b, "zeroserve_prefix_cache_hit_tokens_total %llu\n", (unsigned long long)st.prefix_hit_tokens);
    head(&b, "zeroserve_prefix_cache_evictions_total", "counter", "Cached KV blocks given to other sequences.");
    outf(&b, "zeroserve_prefix_cache_evictions_total %llu\n", (unsigned long long)st.prefix_evictions);
    head(&b, "zeroserve_kv_preemptions_total", "counter", "Sequences preempted from a full KV cache (--kv-offload), by how: swap (to the tier) or recompute.");
    outf(&b, "zeroserve_kv_preemptions_total{how=\"swap\"} %llu\n", (unsigned long long)st.kv_swap_outs);
    outf(&b, "zeroserve_kv_preemptions_total{how=\"recompute\"} %llu\n", (unsigned long long)st.kv_recomputes);
    head(&b, "zeroserve_kv_swap_blocks_total", "counter", "KV blocks swapped out to the tier and back in.");
    outf(&b, "zeroserve_kv_swap_blocks_total{dir=\"out\"} %llu\n", (unsigned long long)st.kv_swap_out_blocks);
    outf(&b, "zeroserve_kv_swap_blocks_total{dir=\"in\"} %llu\n", (unsigned long long)st.kv_swap_in_blocks);
    head(&b, "zeroserve_kv_preempted_sequences", "gauge", "Sequences preempted now, waiting to resume.");
    outf(&b, "zeroserve_kv_preempted_sequences %d\n", st.kv_preempted_now);
    head(&b, "zeroserve_kv_streamed_total", "counter", "Sequences moved from the KV cache's memory to layer streaming from the tier (--kv-offload).");
    outf(&b, "zeroserve_kv_streamed_total %llu\n", (unsigned long long)st.kv_streamed);
    head(&b, "zeroserve_kv_streamed_sequences", "gauge", "Running sequences whose K/V are streamed from the tier a layer at a time now.");
    outf(&b, "zeroserve_kv_streamed_sequences %d\n", st.kv_streamed_now);
    head(&b, "zeroserve_kv_stream_bytes_total", "counter", "Bytes of streamed K/V read from the tier into stage blocks (in) and written behind (out).");
    outf(&b, "zeroserve_kv_stream_bytes_total{dir=\"in\"} %llu\n", (unsigned long long)st.kv_stream_bytes_in);
    outf(&b, "zeroserve_kv_stream_bytes_total{dir=\"out\"} %llu\n", (unsigned long long)st.kv_stream_bytes_out);
    head(&b, "zeroserve_kv_stream_wait_seconds_total", "counter", "Seconds steps waited for streamed K/V (the loads a layer needed, the last writes).");
    outf(&b, "zeroserve_kv_stream_wait_seconds_total %.6f\n", st.kv_stream_wait_s);
    head(&b, "zeroserve_kv_stream_write_errors_total", "counter", "Streamed K/V blocks that could not be written (a full disk): their sequences were recomputed.");
    outf(&b, "zeroserve_kv_stream_write_errors_total %llu\n", (unsigned long long)st.kv_stream_write_errors);
    head(&b, "zeroserve_prefix_tier_hit_blocks_total", "counter", "Prompt blocks taken back from the KV tier below memory (--kv-offload) instead of prefilled.");
    outf(&b, "zeroserve_prefix_tier_hit_blocks_total %llu\n", (unsigned long long)st.prefix_tier_hit_blocks);
    head(&b, "zeroserve_prefix_tier_stored_blocks_total", "counter", "Prefix blocks written down to the KV tier (evicted from memory, or written through to NVMe).");
    outf(&b, "zeroserve_prefix_tier_stored_blocks_total %llu\n", (unsigned long long)st.prefix_tier_stored);
    head(&b, "zeroserve_prefix_tier_dropped_blocks_total", "counter", "Prefix blocks in the KV tier that failed their checksum (a torn write) and were prefilled instead.");
    outf(&b, "zeroserve_prefix_tier_dropped_blocks_total %llu\n", (unsigned long long)st.prefix_tier_dropped);
    head(&b, "zeroserve_prefix_tier_blocks", "gauge", "Prefix blocks in the KV tier now.");
    outf(&b, "zeroserve_prefix_tier_blocks %d\n", st.prefix_tier_held);
    head(&b, "zeroserve_prefix_tier_restored_blocks", "gauge", "Prefix blocks the NVMe tier's file brought back at start.");
    outf(&b, "zeroserve_prefix_tier_restored_blocks %d\n", st.prefix_tier_restored);
    head(&b, "zeroserve_constrained_tokens_total", "counter", "Tokens sampled under a structured-output grammar mask.");
    outf(&b, "zeroserve_constrained_tokens_total %llu\n", (unsigned long long)st.constrained_tokens);

    head(&b, "zeroserve_spec_draft_tokens_total", "counter", "Speculative decoding: draft tokens verified in a step.");
    outf(&b, "zeroserve_spec_draft_tokens_total %llu\n", (unsigned long long)st.spec_drafted);
    head(&b, "zeroserve_spec_accepted_tokens_total", "counter", "Speculative decoding: draft tokens accepted.");
    outf(&b, "zeroserve_spec_accepted_tokens_total %llu\n", (unsigned long long)st.spec_accepted);
    head(&b, "zeroserve_spec_forced_tokens_total", "counter",
         "Tokens a constraint forces (prefix, suffix, the grammar's forced bytes), fed several per pass as drafts "
         "(jump-forward), that held.");
    outf(&b, "zeroserve_spec_forced_tokens_total %llu\n", (unsigned long long)st.spec_forced);
    head(&b, "zeroserve_spec_trees_total", "counter", "Speculative decoding: verifications whose drafts branched (--spec-tree).");
    outf(&b, "zeroserve_spec_trees_total %llu\n", (unsigned long long)st.spec_trees);
    head(&b, "zeroserve_spec_side_accepted_tokens_total", "counter",
         "Speculative decoding: accepted drafts of a tree that were not their parent's first (likeliest) child.");
    outf(&b, "zeroserve_spec_side_accepted_tokens_total %llu\n", (unsigned long long)st.spec_side_accepted);
    head(&b, "zeroserve_spec_kv_moves_total", "counter",
         "Speculative decoding: K/V entries of accepted tree paths moved to their positions.");
    outf(&b, "zeroserve_spec_kv_moves_total %llu\n", (unsigned long long)st.spec_kv_moves);
    head(&b, "zeroserve_spec_forced_draft_tokens_total", "counter",
         "Forced tokens put into steps as drafts; those that did not hold were spelled otherwise by the model.");
    outf(&b, "zeroserve_spec_forced_draft_tokens_total %llu\n", (unsigned long long)st.spec_forced_drafted);
    {
        double bounds[ZS_SPEC_MAX_TOKENS + 1];
        uint64_t cum[ZS_SPEC_MAX_TOKENS + 1], n = 0;
        double sum = 0;
        for (int i = 0; i <= ZS_SPEC_MAX_TOKENS; i++) {
            bounds[i] = i;
            n += st.spec_accept_hist[i];
            cum[i] = n;
            sum += (double)i * (double)st.spec_accept_hist[i];
        }
        histogram_n(&b, "zeroserve_spec_accepted_length", "Speculative decoding: drafts accepted per verification.",
                    bounds, ZS_SPEC_MAX_TOKENS + 1, -1, cum, n, sum);
    }
    head(&b, "zeroserve_spec_drafts_per_sequence", "gauge",
         "Speculative decoding: drafts per sequence chosen for the last step (from the measured costs, or --spec-tokens).");
    outf(&b, "zeroserve_spec_drafts_per_sequence %.3g\n", st.spec_k);
    head(&b, "zeroserve_tokens_per_pass", "gauge",
         "Tokens generated per weight pass (steps that generated any; moving average of the last ~10).");
    outf(&b, "zeroserve_tokens_per_pass %.4g\n", st.tokens_per_pass);
    head(&b, "zeroserve_passes_total", "counter", "Weight passes (steps) that generated tokens.");
    outf(&b, "zeroserve_passes_total %llu\n", (unsigned long long)st.passes);
    head(&b, "zeroserve_pass_tokens_total", "counter", "Tokens generated by those passes.");
    outf(&b, "zeroserve_pass_tokens_total %llu\n", (unsigned long long)st.pass_tokens);

    head(&b, "zeroserve_bytes_streamed_total", "counter",
         "Parameter bytes moved by the ZeRO-3 gather: read from NVMe, copied from host, received through all_gather.");
    outf(&b, "zeroserve_bytes_streamed_total{tier=\"nvme\"} %llu\n", (unsigned long long)st.gather.bytes_nvme);
    outf(&b, "zeroserve_bytes_streamed_total{tier=\"host\"} %llu\n", (unsigned long long)st.gather.bytes_host);
    outf(&b, "zeroserve_bytes_streamed_total{tier=\"gathered\"} %llu\n",
         (unsigned long long)st.gather.bytes_gathered);
    head(&b, "zeroserve_gather_stall_seconds_total", "counter", "Time compute waited for a layer to be gathered.");
    outf(&b, "zeroserve_gather_stall_seconds_total %.9g\n", st.gather.stall_s);
    head(&b, "zeroserve_gather_passes_total", "counter",
         "Weight passes begun; adopted: they took over a pass the prefetcher had started for another use (a training "
         "pass after a speculated inference pass); wasted: a started pass consumed unused.");
    outf(&b, "zeroserve_gather_passes_total{kind=\"all\"} %ld\n", st.gather.passes);
    outf(&b, "zeroserve_gather_passes_total{kind=\"adopted\"} %ld\n", st.gather.passes_adopted);
    outf(&b, "zeroserve_gather_passes_total{kind=\"wasted\"} %ld\n", st.gather.passes_wasted);

    const zs_gather_stats *gs = &st.gather;
    if (gs->expert_layers > 0) { /* a mixture of experts */
        uint64_t tokens = st.prompt_tokens + st.generated_tokens;
        long looked = gs->expert_hits + gs->expert_misses;
        head(&b, "zeroserve_expert_bytes_total", "counter",
             "Mixture of experts: full expert bytes gathered (routed misses and speculation; summed over ranks).");
        outf(&b, "zeroserve_expert_bytes_total %llu\n", (unsigned long long)gs->expert_bytes);
        head(&b, "zeroserve_expert_block_bytes_total", "counter",
             "Mixture of experts: the bytes a whole-block gather (every expert of every MoE layer) would have moved.");
        outf(&b, "zeroserve_expert_block_bytes_total %llu\n", (unsigned long long)gs->expert_block_bytes);
        head(&b, "zeroserve_expert_bytes_per_token", "gauge", "Expert bytes gathered per token processed (prompt and generated).");
        outf(&b, "zeroserve_expert_bytes_per_token %.9g\n", tokens ? (double)gs->expert_bytes / (double)tokens : 0.0);
        head(&b, "zeroserve_expert_lookups_total", "counter", "Agreed experts looked up in the expert cache, by result.");
        outf(&b, "zeroserve_expert_lookups_total{result=\"hit\"} %ld\n", gs->expert_hits);
        outf(&b, "zeroserve_expert_lookups_total{result=\"miss\"} %ld\n", gs->expert_misses);
        head(&b, "zeroserve_expert_cache_hit_ratio", "gauge", "Expert cache hits over lookups.");
        outf(&b, "zeroserve_expert_cache_hit_ratio %.6f\n", looked ? (double)gs->expert_hits / (double)looked : 0.0);
        head(&b, "zeroserve_expert_speculative_total", "counter", "Experts gathered speculatively, and of those used.");
        outf(&b, "zeroserve_expert_speculative_total{result=\"gathered\"} %ld\n", gs->expert_spec);
        outf(&b, "zeroserve_expert_speculative_total{result=\"used\"} %ld\n", gs->expert_spec_used);
        head(&b, "zeroserve_expert_selected_total", "counter", "Experts the ranks agreed on, summed over MoE layer passes.");
        outf(&b, "zeroserve_expert_selected_total %ld\n", gs->expert_selected);
        head(&b, "zeroserve_expert_cache_bytes", "gauge", "Full expert bytes held now (largest rank).");
        outf(&b, "zeroserve_expert_cache_bytes %zu\n", gs->expert_cache_used);
        head(&b, "zeroserve_expert_cache_limit_bytes", "gauge", "The expert cache's bound.");
        outf(&b, "zeroserve_expert_cache_limit_bytes %zu\n", gs->expert_cache_limit);
    }

    head(&b, "zeroserve_engine_steps_total", "counter", "Engine steps (one pass over all layers each).");
    outf(&b, "zeroserve_engine_steps_total %llu\n", (unsigned long long)st.steps);
    head(&b, "zeroserve_requests_finished_total", "counter", "Generation requests finished, by reason.");
    static const char *reasons[4] = {"stop", "length", "cancelled", "error"};
    for (int i = 0; i < 4; i++)
        outf(&b, "zeroserve_requests_finished_total{reason=\"%s\"} %llu\n", reasons[i],
             (unsigned long long)st.requests_done[i]);

    pthread_mutex_lock(&train_mu);
    long tstep = train_step, tskip = train_skipped;
    double tscale = train_scale;
    int tseen = train_seen;
    duty_decay_locked();
    double ftrain = full_train_s, fwait = full_wait_s, fbusy = duty_busy_s, fdw = duty_wait_s, fshare = full_share;
    uint64_t ftok = full_tokens, fsteps = full_steps;
    int factive = full_active;
    pthread_mutex_unlock(&train_mu);
    /* fine-tuning beside serving: the base scheduler's slices (sched-train.c), plus a full job's
     * steps on its own engine (counted as slices; its share while it runs) */
    double share = st.train_share, target = st.train_share_target;
    if (factive) {
        share = fbusy + fdw > 0 ? fbusy / (fbusy + fdw) : 0;
        target = fshare;
    }
    head(&b, "zeroserve_train_share", "gauge",
         "Fine-tuning's share of the engine's time while serving had work too (decayed over about 10 s).");
    outf(&b, "zeroserve_train_share %.4g\n", share);
    head(&b, "zeroserve_train_share_target", "gauge", "The share of the fine-tuning job in force (--train-share by its priority, or its train_share).");
    outf(&b, "zeroserve_train_share_target %.4g\n", target);
    head(&b, "zeroserve_train_slices_total", "counter", "Pieces of fine-tuning run between serving steps (a full job's steps included).");
    outf(&b, "zeroserve_train_slices_total %llu\n", (unsigned long long)(st.train_slices + fsteps));
    head(&b, "zeroserve_train_pass_bytes_total", "counter",
         "Weight bytes of the passes fine-tuning began itself (riding a serving step begins none).");
    outf(&b, "zeroserve_train_pass_bytes_total %llu\n", (unsigned long long)st.train_pass_bytes);
    head(&b, "zeroserve_train_fused_total", "counter", "Serving steps that carried fine-tuning forward units on their weight gathers (fused passes).");
    outf(&b, "zeroserve_train_fused_total %llu\n", (unsigned long long)st.train_fused);
    head(&b, "zeroserve_train_seconds_total", "counter", "Seconds of fine-tuning (a full job's steps included).");
    outf(&b, "zeroserve_train_seconds_total %.9g\n", st.train_s + ftrain);
    head(&b, "zeroserve_serving_wait_on_train_seconds_total", "counter",
         "Seconds requests waited on fine-tuning slices (run while a request was queued or running).");
    outf(&b, "zeroserve_serving_wait_on_train_seconds_total %.9g\n", st.train_wait_s);
    head(&b, "zeroserve_train_wait_on_serving_seconds_total", "counter",
         "Seconds a full fine-tuning job held its next step back for serving (its duty cycle).");
    outf(&b, "zeroserve_train_wait_on_serving_seconds_total %.9g\n", fwait);
    head(&b, "zeroserve_train_tokens_total", "counter", "Training tokens whose step completed (a full job's included).");
    outf(&b, "zeroserve_train_tokens_total %llu\n", (unsigned long long)(st.train_tokens + ftok));
    if (tseen) { /* a full fine-tuning job has run a step since the start */
        head(&b, "zeroserve_train_step", "gauge", "The last optimizer step of the running (or last) fine-tuning job.");
        outf(&b, "zeroserve_train_step %ld\n", tstep);
        head(&b, "zeroserve_train_loss_scale", "gauge", "Its current fp16 loss scale (1 without fp16).");
        outf(&b, "zeroserve_train_loss_scale %.17g\n", tscale);
        head(&b, "zeroserve_train_skipped_steps_total", "counter", "Its steps skipped for fp16 gradient overflows.");
        outf(&b, "zeroserve_train_skipped_steps_total %ld\n", tskip);
    }

    if (b.oom) {
        free(b.p);
        return zs_err(ZS_ENOMEM, "metrics: out of memory");
    }
    *out = b.p;
    *len = b.len;
    return 0;
}
