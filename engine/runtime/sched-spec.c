/* sched-spec.c — speculative decoding in the scheduler: how many draft tokens each running
 * sequence puts into a step, which (the constraint's forced tokens first, then the proposer's),
 * and the counters.
 *
 * The budget follows the measured cost. Every step's time is split into compute and the gather's
 * stall (time the compute waited for streamed weights); from them the scheduler keeps the pass's
 * stream time (cost_io) and the compute per token (cost_tok), and predicts a pass of n tokens to
 * take max(cost_io, n * cost_tok), plus the proposer's time per draft (cost_prop: a draft model's
 * steps run before the pass, on this thread): while the pass waits for the stream, more tokens are
 * free. Each
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
 * counts them, spec_forced those that held.
 *
 * Trees (zs_sched_opts.spec_tree): the proposer offers a tree (several continuations, each node
 * with its share among its siblings); a node's gain is the product of a · share along its path,
 * and nodes are kept the same way, best gain first, a parent before its children. Node j sits in
 * KV slot p+1+j at position p+depth and sees only its path (zs_batch.tree). Verification walks
 * from the decode row: a node's children are verified together (zs_sampler_verify_multi) and the
 * accepted child's row verifies the next level. The accepted path's K/V entries are moved to
 * p+1, p+2, .. by the next step (it always holds the sequence: a step that fails ends it); the
 * rejected slots are written over later. Engine thread. */
#include <math.h>
#include <string.h>

#include "common.h"
#include "device.h"
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
    s->spec_tree = s->spec && o && o->spec_tree;
    /* a chain in causal rows of a chunk takes CUDA's tiled attention, whose sums run in another
     * order than a lone decode token's; as a tree it takes the simple kernel, as decoding does */
    s->chains_as_trees = zs_engine_device(s->e) == ZS_DEVICE_CUDA;
    size_t n = (size_t)s->max_seqs * ZS_SPEC_MAX_TOKENS;
    s->spec_reqs = calloc((size_t)s->max_seqs, sizeof *s->spec_reqs);
    s->spec_buf = malloc(n * sizeof *s->spec_buf);
    s->spec_par = malloc(n * sizeof *s->spec_par);
    s->spec_share = malloc(n * sizeof *s->spec_share);
    if (!s->spec_reqs || !s->spec_buf || !s->spec_par || !s->spec_share) return zs_err(ZS_ENOMEM, "scheduler: out of memory");
    return 0;
}

void zs_sched_spec_free(zs_sched *s) {
    free(s->spec_reqs);
    free(s->spec_buf);
    free(s->spec_par);
    free(s->spec_share);
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
        /* the proposer runs before the pass on this thread: its time is the step's too */
        double t2 = pass_time(s, base + used + 1) + s->cost_prop * (used + 1);
        if ((tokens + gain) / t2 <= tokens / t) break; /* the pass would not yield more per second */
        k[best]++;
        used++;
        tokens += gain;
        t = t2;
    }
}

/* The steps' mean drafts per proposing sequence, for /metrics and the log. */
static void publish_k(zs_sched *s, int ksum, int nk) {
    double kk = nk ? (double)ksum / nk : 0;
    pthread_mutex_lock(&s->mu);
    s->st.spec_k = kk;
    pthread_mutex_unlock(&s->mu);
    if (s->spec && nk && fabs(kk - s->spec_logged_k) >= 1.0) {
        zs_log_info("speculation (%s%s): %.1f drafts per sequence (pass: %.2f ms of stream, %.3f ms per token)",
                    zs_spec_name(s->spec), s->spec_tree ? ", trees" : "", kk, s->cost_io * 1e3, s->cost_tok * 1e3);
        s->spec_logged_k = kk;
    }
}

/* ---------- trees ---------- */

/* One sequence's proposal while the plan chooses from it: its nodes (the proposer's order, a
 * parent before its children), each node's gain (the chance that its whole path is accepted:
 * the product of rate · share along it) and place among the chosen (-1: not chosen). */
typedef struct {
    zs_request *r;
    const zs_spec_req *q;
    int n, taken;
    double gain[ZS_SPEC_MAX_TOKENS];
    int at[ZS_SPEC_MAX_TOKENS];
} tree_prop;

/* The best node of p that may be taken next (its parent taken), or -1. */
static int tree_next(const tree_prop *p) {
    int best = -1;
    for (int c = 0; c < p->n; c++)
        if (p->at[c] < 0 && (p->q->parent[c] < 0 || p->at[p->q->parent[c]] >= 0) &&
            (best < 0 || p->gain[c] > p->gain[best]))
            best = c;
    return best;
}

static void tree_take(tree_prop *p, int c) { p->at[c] = p->taken++; }

/* Nodes for the np proposals of one rank in room rows: --spec-tokens N each (best first), 4 each
 * before a step was measured, else one at a time, the likeliest of all first, while the expected
 * tokens per second of the step grow (as choose() does for chains; base: the rows without them,
 * dec: the decode rows). */
static void tree_choose(const zs_sched *s, tree_prop *p, int np, int base, int dec, int room) {
    if (s->spec_tokens > 0 || s->cost_tok <= 0) {
        int each = s->spec_tokens > 0 ? s->spec_tokens : 4;
        for (int j = 0; j < np; j++)
            for (int c; p[j].taken < each && room > 0 && (c = tree_next(&p[j])) >= 0; room--) tree_take(&p[j], c);
        return;
    }
    double tokens = dec, t = pass_time(s, base);
    for (int used = 0; used < room; used++) {
        int bj = -1, bc = -1;
        for (int j = 0; j < np; j++) {
            int c = tree_next(&p[j]);
            if (c >= 0 && (bj < 0 || p[j].gain[c] > p[bj].gain[bc])) {
                bj = j;
                bc = c;
            }
        }
        if (bj < 0) break;
        double t2 = pass_time(s, base + used + 1), g = p[bj].gain[bc];
        if ((tokens + g) / t2 <= tokens / t) break; /* the pass would not yield more per second */
        tree_take(&p[bj], bc);
        tokens += g;
        t = t2;
    }
}

/* The plan with trees: every decode sequence's forced tokens (a chain), then the proposer's best
 * tree of up to its cap, of which tree_choose keeps the nodes worth their rows; they go after the
 * forced tokens in the order chosen (a parent before its children). */
static void plan_trees(zs_sched *s, const int *base, const int *room) {
    int nreq = 0, ksum = 0, nk = 0, left[s->nranks], forced[s->nranks], dec[s->nranks], first[s->nranks + 1];
    for (int i = 0; i < s->nranks; i++) {
        zs_sched_rank *b = &s->rb[i];
        left[i] = room[i];
        forced[i] = dec[i] = 0;
        first[i] = nreq;
        for (int j = 0; j < b->n_running; j++) {
            zs_request *r = b->running[j];
            r->n_draft = r->n_forced = r->tree = 0;
            if (r->embed || r->n_done < r->n_ctx || r->max_tokens - r->n_gen - 1 <= 0) continue;
            dec[i]++;
            int cap = ZS_MIN(ZS_SPEC_MAX_TOKENS, r->max_tokens - r->n_gen - 1);
            int f = zs_sched_con_forced(r, r->draft, ZS_MIN(cap, left[i]));
            for (int d = 0; d < f; d++) r->dpar[d] = (int8_t)(d - 1);
            r->n_draft = r->n_forced = f;
            left[i] -= f;
            forced[i] += f;
            if (cap - f <= 0 || (r->has_con && r->phase != PH_TRIGGER)) continue;
            zs_spec_req *q = &s->spec_reqs[nreq];
            size_t o = (size_t)nreq++ * ZS_SPEC_MAX_TOKENS;
            *q = (zs_spec_req){(uintptr_t)r, r->prompt, r->n_prompt + r->n_gen, cap - f, s->spec_buf + o, 0,
                               s->spec_par + o, s->spec_share + o};
        }
    }
    first[s->nranks] = nreq;
    if (nreq > 0 && zs_spec_propose(s->spec, s->spec_reqs, nreq) < 0) {
        zs_log_warn("speculation: the %s proposer failed (%s); this step runs without drafts", zs_spec_name(s->spec),
                    zs_errmsg());
        return;
    }
    for (int i = 0; i < s->nranks; i++) {
        int np = first[i + 1] - first[i];
        if (np == 0 || left[i] <= 0) continue;
        tree_prop p[np];
        for (int j = 0; j < np; j++) {
            const zs_spec_req *q = &s->spec_reqs[first[i] + j];
            zs_request *r = (zs_request *)q->key;
            double a = rate(r);
            p[j].r = r;
            p[j].q = q;
            p[j].n = ZS_MIN(q->n_draft, q->k);
            p[j].taken = 0;
            for (int c = 0; c < p[j].n; c++) {
                int pa = q->parent[c];
                if (pa >= c || pa < -1) { /* not a tree in node order: the nodes before it only */
                    p[j].n = c;
                    break;
                }
                double sh = q->share[c] > 0 ? (q->share[c] < 1 ? q->share[c] : 1.0) : 0.0;
                p[j].gain[c] = (pa < 0 ? 1.0 : p[j].gain[pa]) * a * sh;
                p[j].at[c] = -1;
            }
        }
        tree_choose(s, p, np, base[i] + forced[i], dec[i], left[i]);
        for (int j = 0; j < np; j++) {
            zs_request *r = p[j].r;
            int f = r->n_draft;
            for (int c = 0; c < p[j].n; c++) {
                int o = p[j].at[c], pa = p[j].q->parent[c];
                if (o < 0) continue;
                r->draft[f + o] = p[j].q->draft[c];
                r->dpar[f + o] = (int8_t)(pa < 0 ? f - 1 : f + p[j].at[pa]);
            }
            r->n_draft += p[j].taken;
            for (int d = f; d < r->n_draft; d++) r->tree |= r->dpar[d] != d - 1;
            if (p[j].taken) {
                ksum += p[j].taken;
                nk++;
            }
        }
    }
    publish_k(s, ksum, nk);
}

void zs_sched_spec_plan(zs_sched *s, const int *base, const int *room) {
    if (s->spec_tree) {
        plan_trees(s, base, room);
        return;
    }
    int nreq = 0, ksum = 0, nk = 0;
    int32_t *buf = s->spec_buf;
    for (int i = 0; i < s->nranks; i++) {
        zs_sched_rank *b = &s->rb[i];
        zs_request *dec[b->n_running + 1];
        int nd = 0, k[b->n_running + 1];
        for (int j = 0; j < b->n_running; j++) {
            zs_request *r = b->running[j];
            r->n_draft = r->n_forced = r->tree = 0;
            /* a decode row, and room after it in the sequence's reservation for drafts */
            if (r->embed || r->n_done < r->n_ctx || r->max_tokens - r->n_gen - 1 <= 0) continue;
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
            *q = (zs_spec_req){(uintptr_t)r, r->prompt, r->n_prompt + r->n_gen, want, buf, 0, NULL, NULL};
            buf += want;
            left -= want;
        }
    }
    double t0 = zs_now();
    if (nreq > 0 && zs_spec_propose(s->spec, s->spec_reqs, nreq) < 0) {
        zs_log_warn("speculation: the %s proposer failed (%s); this step runs without drafts", zs_spec_name(s->spec),
                    zs_errmsg());
        return;
    }
    if (nreq > 0 && ksum > 0) {
        double per = (zs_now() - t0) / ksum;
        s->cost_prop = s->cost_prop > 0 ? (1 - COST_EWMA) * s->cost_prop + COST_EWMA * per : per;
    }
    for (int q = 0; q < nreq; q++) {
        zs_request *r = (zs_request *)s->spec_reqs[q].key;
        int m = ZS_MIN(s->spec_reqs[q].n_draft, s->spec_reqs[q].k);
        memcpy(r->draft + r->n_draft, s->spec_reqs[q].draft, (size_t)m * sizeof *r->draft);
        r->n_draft += m;
    }
    for (int i = 0; i < s->nranks; i++) /* chains: each draft after the one before */
        for (int j = 0; j < s->rb[i].n_running; j++)
            for (int d = 0; d < s->rb[i].running[j]->n_draft; d++) s->rb[i].running[j]->dpar[d] = (int8_t)(d - 1);
    publish_k(s, ksum, nk);
}

/* The counters of one verification: drafted drafts (forced of them forced), accepted of them held
 * along the path; missed: it stopped at a node whose children all failed; tree: they branched;
 * side: accepted drafts that were not their parent's first child. r NULL: it ended. */
static void verified(zs_sched *s, zs_request *r, int drafted, int forced, int accepted, int missed, int tree,
                     int side) {
    int spec = drafted - forced, acc = ZS_MAX(accepted - forced, 0);
    if (r && spec > 0) { /* a run of acc successes, then a failure unless it stopped without one */
        r->acc_hits = r->acc_hits * DECAY + acc;
        r->acc_trials = r->acc_trials * DECAY + acc + (missed ? 1 : 0);
    }
    if (drafted == 0) return;
    pthread_mutex_lock(&s->mu);
    s->st.spec_drafted += (uint64_t)spec;
    s->st.spec_accepted += (uint64_t)acc;
    s->st.spec_forced += (uint64_t)ZS_MIN(accepted, forced);
    s->st.spec_forced_drafted += (uint64_t)forced;
    if (spec > 0) s->st.spec_accept_hist[ZS_MIN(acc, ZS_SPEC_MAX_TOKENS)]++;
    s->st.spec_trees += (uint64_t)(tree != 0);
    s->st.spec_side_accepted += (uint64_t)side;
    pthread_mutex_unlock(&s->mu);
}

void zs_sched_spec_verify(zs_sched *s, zs_request *r, const float *rows) {
    int nd = r->n_draft, forced = r->n_forced, tree = r->tree, P = r->n_prompt + r->n_gen - 1, seq = r->seq;
    int path[ZS_SPEC_MAX_TOKENS], acc = 0, cur = -1, side = 0, missed = 0;
    for (;;) { /* from the decode token down the tree: the node's children verified together */
        int32_t kids[ZS_SPEC_MAX_TOKENS];
        int at[ZS_SPEC_MAX_TOKENS], nk = 0, which = -1;
        for (int j = cur + 1; j < nd; j++)
            if (r->dpar[j] == cur) {
                at[nk] = j;
                kids[nk++] = r->draft[j];
            }
        int v = zs_sched_sample(s, r, rows + (size_t)(cur + 1) * (size_t)s->vocab, kids, nk, &which);
        if (v < 0) { /* it ended (and is freed) */
            r = NULL;
            break;
        }
        if (v == 0) {
            missed = nk > 0;
            break;
        }
        side += which > 0;
        cur = at[which];
        path[acc++] = cur;
    }
    verified(s, r, nd, forced, acc, missed, tree, side);
    if (!r) return;
    /* the path's entries to consecutive positions after the decode token's (a chain's are there) */
    r->n_moves = 0;
    for (int e = 1; e <= acc; e++)
        if (path[e - 1] + 1 != e) r->moves[r->n_moves++] = (zs_kv_move){seq, P + 1 + path[e - 1], P + e};
    if (r->n_moves) {
        pthread_mutex_lock(&s->mu);
        s->st.spec_kv_moves += (uint64_t)r->n_moves;
        pthread_mutex_unlock(&s->mu);
    }
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
