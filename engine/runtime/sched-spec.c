/* sched-spec.c — speculative decoding in the scheduler: how many draft tokens each running
 * sequence puts into a step, which (the constraint's forced tokens first, then the proposer's),
 * and the counters.
 *
 * The budget follows the measured cost. Every step's time is split into compute and the gather's
 * stall (time the compute waited for streamed weights); from them the scheduler keeps the pass's
 * stream time (cost_io) and the compute per token (cost_tok), and predicts a pass of n tokens to
 * take max(cost_io, n * cost_tok): while the pass waits for the stream, more tokens are free. Each
 * sequence has an acceptance rate a (its drafts accepted over tried, decayed); its j-th draft
 * yields a token with probability a^j. Drafts are added one at a time, the most likely first,
 * while the expected tokens per second of the step grow and the rank's batch has room. So
 * speculation steps back when batching already fills the pass (compute-bound) and goes deep when
 * the pass is waiting for NVMe. zs_sched_opts.spec_tokens = N fixes N per sequence instead. What
 * was chosen is logged when it changes and shown in /metrics (spec_k).
 *
 * Forced tokens of a constrained request (the prefix or suffix still to come, the bytes the
 * grammar forces in the value: sched-constrain.c) go in first as drafts (jump-forward): many of
 * them in one pass instead of one per pass. They are not counted as drafted: spec_forced_drafted
 * counts them, spec_forced those that held. Engine thread. */
#include <math.h>
#include <string.h>

#include "common.h"
#include "sched-impl.h"

#define DECAY 0.8            /* weight of the past in a sequence's acceptance rate */
#define COST_EWMA 0.2        /* weight of a new step in the cost estimates */
#define STALL_MIN 1e-4       /* seconds of stall that make a step I/O-bound */

int zs_sched_spec_init(zs_sched *s, const zs_sched_opts *o) {
    s->spec = o ? o->spec : NULL;
    s->spec_tokens = o ? o->spec_tokens : 0;
    if (s->spec_tokens < 0 || s->spec_tokens > ZS_SPEC_MAX_TOKENS)
        return zs_err(ZS_ERANGE, "--spec-tokens %d: between 0 (chosen from the costs) and %d", s->spec_tokens,
                      ZS_SPEC_MAX_TOKENS);
    /* constrained requests' forced tokens are drafts even without a proposer */
    s->spec_on = !(o && o->no_drafts);
    s->spec_reqs = calloc((size_t)s->max_seqs, sizeof *s->spec_reqs);
    s->spec_buf = malloc((size_t)s->max_seqs * ZS_SPEC_MAX_TOKENS * sizeof *s->spec_buf);
    if (!s->spec_reqs || !s->spec_buf) return zs_err(ZS_ENOMEM, "scheduler: out of memory");
    return 0;
}

static double rate(const zs_request *r) { return (r->acc_hits + 1.0) / (r->acc_trials + 2.0); }

/* Predicted seconds of a pass of n tokens (the largest rank's). */
static double pass_time(const zs_sched *s, int n) {
    double c = s->cost_tok * n;
    return c > s->cost_io ? c : s->cost_io;
}

/* Drafts per sequence from the costs: k[j] for the requests reqs[0..n) of one rank, within room. */
static void choose(const zs_sched *s, zs_request **reqs, int n, int base, int room, int *k) {
    for (int j = 0; j < n; j++) k[j] = 0;
    if (s->spec_tokens > 0) {
        for (int j = 0; j < n && room > 0; j++) {
            k[j] = ZS_MIN(s->spec_tokens, room);
            room -= k[j];
        }
        return;
    }
    if (s->cost_tok <= 0) { /* no step measured yet: a modest start */
        for (int j = 0; j < n && room > 0; j++) {
            k[j] = ZS_MIN(4, room);
            room -= k[j];
        }
        return;
    }
    double tokens = n, t = pass_time(s, base);
    int used = 0;
    while (used < room) {
        int best = -1;
        double gain = 0;
        for (int j = 0; j < n; j++) {
            if (k[j] >= ZS_SPEC_MAX_TOKENS) continue;
            double g = pow(rate(reqs[j]), k[j] + 1);
            if (g > gain) {
                gain = g;
                best = j;
            }
        }
        if (best < 0) break;
        double t2 = pass_time(s, base + used + 1);
        if ((tokens + gain) / t2 <= tokens / t) break; /* the pass would not yield more per second */
        k[best]++;
        used++;
        tokens += gain;
        t = t2;
    }
}

void zs_sched_spec_plan(zs_sched *s, const int *base, const int *room) {
    int nreq = 0, ksum = 0, nk = 0;
    int32_t *buf = s->spec_buf;
    for (int i = 0; i < s->nranks; i++) {
        zs_sched_rank *b = &s->rb[i];
        zs_request *dec[b->n_running + 1];
        int nd = 0, k[b->n_running + 1];
        for (int j = 0; j < b->n_running; j++) {
            zs_request *r = b->running[j];
            r->n_draft = r->n_forced = 0;
            /* a decode row, and room after it in the sequence's reservation for drafts */
            if (r->embed || r->n_done < r->n_prompt || r->max_tokens - r->n_gen - 1 <= 0) continue;
            dec[nd++] = r;
        }
        choose(s, dec, nd, base[i], room[i], k);
        int left = room[i];
        for (int j = 0; j < nd; j++) {
            zs_request *r = dec[j];
            /* the constraint's forced tokens cost a row each but are free of the budget's doubt */
            int cap = ZS_MIN(ZS_SPEC_MAX_TOKENS, r->max_tokens - r->n_gen - 1);
            int f = zs_sched_con_forced(r, r->draft, ZS_MIN(cap, left));
            r->n_draft = r->n_forced = f;
            left -= f;
            int want = ZS_MIN(k[j], ZS_MIN(cap - f, left));
            if (want <= 0 || !s->spec || (r->has_con && r->phase != PH_TRIGGER)) continue;
            ksum += want;
            nk++;
            zs_spec_req *q = &s->spec_reqs[nreq++];
            *q = (zs_spec_req){(uintptr_t)r, r->prompt, r->n_prompt + r->n_gen, want, buf, 0};
            buf += want;
            left -= want;
        }
    }
    if (nreq > 0 && zs_spec_propose(s->spec, s->spec_reqs, nreq) < 0) {
        zs_log_warn("speculation: the %s proposer failed (%s); this step runs without drafts", zs_spec_name(s->spec),
                    zs_errmsg());
        return;
    }
    for (int q = 0; q < nreq; q++) {
        zs_request *r = (zs_request *)s->spec_reqs[q].key;
        int m = ZS_MIN(s->spec_reqs[q].n_draft, s->spec_reqs[q].k);
        memcpy(r->draft + r->n_draft, s->spec_reqs[q].draft, (size_t)m * sizeof *r->draft);
        r->n_draft += m;
    }
    double kk = nk ? (double)ksum / nk : 0;
    pthread_mutex_lock(&s->mu);
    s->st.spec_k = kk;
    pthread_mutex_unlock(&s->mu);
    if (s->spec && nk && fabs(kk - s->spec_logged_k) >= 1.0) {
        zs_log_info("speculation (%s): %.1f drafts per sequence (pass: %.2f ms of stream, %.3f ms per token)",
                    zs_spec_name(s->spec), kk, s->cost_io * 1e3, s->cost_tok * 1e3);
        s->spec_logged_k = kk;
    }
}

void zs_sched_spec_verified(zs_sched *s, zs_request *r, int drafted, int forced, int accepted) {
    int spec = drafted - forced, acc = ZS_MAX(accepted - forced, 0);
    if (r && spec > 0) { /* a run of acc successes, then a failure unless all held */
        r->acc_hits = r->acc_hits * DECAY + acc;
        r->acc_trials = r->acc_trials * DECAY + acc + (acc < spec ? 1 : 0);
    }
    if (drafted == 0) return;
    pthread_mutex_lock(&s->mu);
    s->st.spec_drafted += (uint64_t)spec;
    s->st.spec_accepted += (uint64_t)acc;
    s->st.spec_forced += (uint64_t)ZS_MIN(accepted, forced);
    s->st.spec_forced_drafted += (uint64_t)forced;
    if (spec > 0) s->st.spec_accept_hist[ZS_MIN(acc, ZS_SPEC_MAX_TOKENS)]++;
    pthread_mutex_unlock(&s->mu);
}

void zs_sched_spec_step(zs_sched *s, int tokens, double seconds, double stall_s, int gen) {
    if (tokens > 0 && seconds > 0) {
        double compute = seconds - stall_s;
        if (compute < 0) compute = 0;
        double tok = compute / tokens;
        s->cost_tok = s->cost_tok > 0 ? (1 - COST_EWMA) * s->cost_tok + COST_EWMA * tok : tok;
        /* I/O-bound: the pass took as long as the stream; else the stream took at most this */
        double io = stall_s > STALL_MIN ? seconds : compute;
        if (stall_s > STALL_MIN || io < s->cost_io) s->cost_io = s->cost_io > 0 ? (1 - COST_EWMA) * s->cost_io + COST_EWMA * io : io;
    }
    if (gen <= 0) return;
    pthread_mutex_lock(&s->mu);
    s->st.passes++;
    s->st.pass_tokens += (uint64_t)gen;
    s->st.tokens_per_pass = s->st.tokens_per_pass > 0 ? 0.9 * s->st.tokens_per_pass + 0.1 * gen : gen;
    pthread_mutex_unlock(&s->mu);
}
