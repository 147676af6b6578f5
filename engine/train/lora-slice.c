/* lora-slice.c — LoRA training steps in slices (issue 31), so that a server can put them between
 * serving steps. A step is its micro-batches, each a walk of the gather's training order (forward,
 * then the layers in reverse) cut into units: one bucket, with a MoE layer's experts mark, and a
 * tied head with the embeddings it reads. A slice runs ranges of units as range passes
 * (zs_gather_pass_begin_range), each declaring the one after it when it is known, so the
 * prefetcher never guesses wrong. A micro-batch's forward may instead ride serving steps: the
 * rider wraps a serving pass's weight source and computes its units on each bucket while the
 * serving forward holds it, so those buckets are fetched once for both. Every unit runs the same
 * trainer calls on the same bucket bytes in the same order whichever way it runs, so gradients
 * and the adapter are bitwise those of zs_lora_training_step's single passes. */
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "backward.h"
#include "common.h"
#include "lora-train-impl.h"
#include "optim.h"

static uint64_t mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void fail(lrank *R, int rc) {
    if (R->rc == 0) {
        R->rc = rc;
        snprintf(R->err, sizeof R->err, "%s", zs_errmsg());
    }
}

int zs_lora_slice_init(zs_lora_training *t) {
    zs_gather *g = zs_world_gather(t->w, 0);
    t->n_ord = zs_gather_order(g, &t->ord, &t->n_inf);
    int nb = zs_model_n_buckets(t->m);
    t->bucket_bytes = calloc((size_t)nb, sizeof *t->bucket_bytes);
    if (!t->bucket_bytes) return zs_err(ZS_ENOMEM, "out of memory");
    for (int b = 0; b < nb; b++) t->bucket_bytes[b] = (uint64_t)zs_partition_shard_bytes(t->m, b, t->n) * (uint64_t)t->n;
    t->eb = zs_bucket_embed();
    t->hb = zs_bucket_head(t->m);
    int moe = 0;
    for (int i = 0; i < t->n_ord; i++) moe |= zs_pass_is_experts(t->ord[i]);
    t->can_ride = !moe && !zs_world_is_cuda(t->w) && !zs_world_led(t->w);
    return 0;
}

/* The end (exclusive) of the unit that starts at item p. */
static int unit_end(const zs_lora_training *t, int p) {
    int e = p + 1;
    if (e < t->n_ord && zs_pass_is_experts(t->ord[e])) e++;
    else if (p < t->n_inf && t->ord[p] == t->hb && t->tied && e < t->n_inf && t->ord[e] == t->eb) e++;
    return e;
}

static int is_bwd(const zs_lora_training *t, int p) { return p >= t->n_inf; }

/* A micro-batch starts on a rank (before its first unit). */
static void micro_start(zs_lora_training *t, lrank *R, int rank) {
    int i = t->micro * t->n + t->first + rank; /* the global micro-batch index */
    size_t np;
    float *gr = zs_lora_data(R->grad, &np);
    memset(gr, 0, np * sizeof(float));
    R->rc = 0;
    R->loss = 0;
    R->floss = 0;
    uint64_t key = mix64(mix64((uint64_t)t->step) ^ (uint64_t)i);
    int rc = zs_trainer_set_lora(R->tr, t->a, R->grad, t->seed, key);
    if (rc < 0) fail(R, rc);
    if (R->rc == 0 && t->lookup) {
        rc = zs_train_embed_fwd(R->tr, NULL, zs_model_bucket_resident(t->m, t->eb), t->tokens[i]);
        if (rc < 0) fail(R, rc);
    }
}

/* Unit p's computation on a rank, its bucket's data d (and a tied head's embeddings d2) held. After
 * a failure a MoE layer still takes part in its experts' agreement (zs_trainer_experts_sync). */
static void unit_compute(zs_lora_training *t, lrank *R, int rank, int p, const void *d, const void *d2) {
    int b = t->ord[p], i = t->micro * t->n + t->first + rank;
    const zs_model *m = t->m;
    int rc = 0;
    if (b == t->eb && !is_bwd(t, p)) {
        if (R->rc == 0) rc = zs_train_embed_fwd(R->tr, d, zs_model_bucket_resident(m, b), t->tokens[i]);
    } else if (b == t->hb && !is_bwd(t, p)) {
        if (R->rc == 0)
            rc = zs_train_head(R->tr, d, zs_model_bucket_resident(m, b), t->tied ? d2 : NULL,
                               t->tied ? zs_model_bucket_resident(m, t->eb) : NULL, t->targets[i], &R->floss, NULL,
                               NULL, NULL, NULL);
    } else {
        int l = b - 1, bwd = is_bwd(t, p);
        if (R->rc == 0)
            rc = bwd ? zs_train_layer_bwd(R->tr, l, d, zs_model_bucket_resident(m, b), NULL, NULL)
                     : zs_train_layer_fwd(R->tr, l, d, zs_model_bucket_resident(m, b));
        if (rc < 0) fail(R, rc);
        if (R->rc < 0) (void)zs_trainer_experts_sync(R->tr, l, bwd);
    }
    if (rc < 0) fail(R, rc);
}

void zs_lora_share_status(zs_lora_training *t, lrank *R, int rank) {
    zs_comm *c = zs_world_grad_comm(t->w, rank);
    lt_stat me = {R->loss, R->rc, 0};
    int crc = zs_comm_all_gather(c, &me, R->stat, sizeof me, NULL);
    if (crc < 0) fail(R, crc);
    if (rank == 0 && crc == 0)
        for (int k = 0; k < t->n; k++) {
            t->loss_sum += R->stat[k].loss;
            if (R->stat[k].rc < 0 && t->fail_rc == 0) {
                t->fail_rc = R->stat[k].rc;
                int local = k - t->first;
                if (local >= 0 && local < t->nl) snprintf(t->fail_err, sizeof t->fail_err, "%s", t->r[local].err);
                else snprintf(t->fail_err, sizeof t->fail_err, "LoRA training: rank %d failed; see that process's log", k);
            }
        }
}

/* The micro-batch's end on a rank: the embeddings' backward, then every rank's status and loss and
 * every rank's gradient in chunks, summed in rank order into the step's gradient by this process's
 * first rank (all_gathers: the same bits for any rank count and process layout). */
static void micro_finish(zs_lora_training *t, lrank *R, int rank) {
    if (R->rc == 0) {
        int rc = zs_train_embed_bwd(R->tr, NULL, NULL, NULL, NULL);
        if (rc < 0) fail(R, rc);
    }
    size_t np, bt = (size_t)t->o.micro_batch * (size_t)t->o.seq_len;
    float *gr = zs_lora_data(R->grad, &np);
    int i = t->micro * t->n + t->first + rank;
    float loss = R->floss;
    if (R->rc < 0) {
        memset(gr, 0, np * sizeof(float)); /* a failed rank still takes part, with zeros */
        loss = 0;
    }
    R->loss = (double)loss * (double)zs_train_count_targets(t->targets[i], bt);
    zs_comm *c = zs_world_grad_comm(t->w, rank);
    zs_lora_share_status(t, R, rank);
    float *acc = zs_lora_data(t->gsum, &np);
    for (size_t off = 0; off < np; off += t->chunk) {
        size_t len = ZS_MIN(t->chunk, np - off);
        int arc = zs_comm_all_gather(c, gr + off, R->gbuf, len * sizeof(float), NULL);
        if (arc < 0) {
            fail(R, arc);
            if (rank == 0 && t->fail_rc == 0) {
                t->fail_rc = arc;
                snprintf(t->fail_err, sizeof t->fail_err, "%s", R->err);
            }
            continue;
        }
        if (rank != 0) continue;
        for (int k = 0; k < t->n; k++) {
            long cnt = zs_train_count_targets(t->targets[t->micro * t->n + k], bt);
            float s = t->total_count > 0 ? (float)cnt / (float)t->total_count : 0.0f;
            const float *gk = R->gbuf + (size_t)k * len;
            float *ac = acc + off;
            for (size_t j = 0; j < len; j++) ac[j] += gk[j] * s;
        }
    }
}

/* ---- range passes ---- */

static void range_job(void *ud, int rank) {
    zs_lora_training *t = ud;
    lrank *R = &t->r[rank];
    zs_gather *g = zs_world_gather(t->w, rank);
    zs_weight_source src = R->src;
    zs_gather_pass_begin_range(g, t->cur, t->has_nxt ? &t->nxt : NULL);
    int end = t->cur.first + t->cur.count;
    if (rank == 0) t->rank0_fwd = t->rank0_bwd = 0, t->rank0_nf = t->rank0_nb = 0;
    for (int p = t->cur.first; p < end;) {
        int e = unit_end(t, p);
        double t0 = rank == 0 ? zs_now() : 0;
        if (p == 0) micro_start(t, R, rank);
        const void *d = NULL, *d2 = NULL;
        int b = t->ord[p], two = e - p == 2 && !zs_pass_is_experts(t->ord[p + 1]);
        if (rank == 0) t->pass_bytes += t->bucket_bytes[b] + (two ? t->bucket_bytes[t->ord[p + 1]] : 0);
        int arc = src.acquire(src.ctx, b, &d), arc2 = two ? src.acquire(src.ctx, t->ord[p + 1], &d2) : 0;
        if (arc < 0) fail(R, arc);
        if (arc2 < 0) fail(R, arc2);
        unit_compute(t, R, rank, p, d, d2);
        src.release(src.ctx, b);
        if (two) src.release(src.ctx, t->ord[p + 1]);
        if (rank == 0) {
            double dt = zs_now() - t0;
            if (is_bwd(t, p)) t->rank0_bwd += dt, t->rank0_nb++;
            else t->rank0_fwd += dt, t->rank0_nf++;
        }
        p = e;
    }
    zs_gather_pass_end(g); /* releases what is still held */
    if (end == t->n_ord) micro_finish(t, R, rank);
}

static void ewma(double *u, double total, int n) {
    if (n <= 0) return;
    double v = total / n;
    *u = *u > 0 ? 0.7 * *u + 0.3 * v : v;
}

/* The range of units from item p that fits budget_s by the measured unit times (at least one
 * unit; the micro-batch's end at most; a forward range may stop at the forward's end so that a
 * rider or a backward follows). budget_s <= 0 or infinite: to the micro-batch's end. */
static zs_pass_range plan_range(const zs_lora_training *t, int p, double budget_s) {
    int e = unit_end(t, p);
    double est = is_bwd(t, p) ? t->u_bwd : t->u_fwd;
    if (isfinite(budget_s) && budget_s > 0)
        while (e < t->n_ord) {
            double u = is_bwd(t, e) ? t->u_bwd : t->u_fwd;
            if (u <= 0 || est + u > budget_s) break;
            est += u;
            e = unit_end(t, e);
        }
    else
        e = t->n_ord;
    return (zs_pass_range){p, e - p};
}

/* The step's optimizer update, after its last micro-batch: the same on every process (the
 * gradient is): clip by the global norm, AdamW on the adapter. */
static int step_finish(zs_lora_training *t) {
    t->in_step = 0;
    if (t->fail_rc < 0) return zs_err(t->fail_rc, "%s", t->fail_err);
    t->have_grad = 1;
    float l = t->total_count > 0 ? (float)(t->loss_sum / (double)t->total_count) : 0.0f;
    size_t np;
    const float *g = zs_lora_data_const(t->gsum, &np);
    double ss = zs_sumsq(g, np);
    if (!isfinite(ss))
        return zs_err(ZS_ERANGE, "LoRA training: step %ld: the gradient is not finite (loss %g)", t->step, (double)l);
    float coef = t->o.grad_clip > 0 ? zs_clip_coef(ss, t->o.grad_clip) : 1.0f;
    memcpy(t->gclip, g, np * sizeof(float));
    if (coef != 1.0f) zs_scale(t->gclip, np, coef);
    float lr = zs_lr_at(&t->o.lr, t->step);
    /* PEFT / the HF Trainer decay every LoRA parameter */
    float *pa = zs_lora_data(t->a, &np);
    ZS_CHECK(zs_adamw_update(pa, t->mom, t->var, t->gclip, np, &t->o.adam, lr, t->step, 1, NULL, ZS_F32));
    t->step_loss = l;
    return 0;
}

int zs_lora_training_step_begin(zs_lora_training *t, const int32_t *const *tokens, const int32_t *const *targets,
                                long step) {
    if (step < 1) return zs_err(ZS_EINVAL, "LoRA training: steps are numbered from 1");
    if (t->in_step) return zs_err(ZS_EINVAL, "LoRA training: step %ld begun while step %ld runs", step, t->step);
    size_t bt = (size_t)t->o.micro_batch * (size_t)t->o.seq_len;
    t->step = step;
    t->tokens = tokens;
    t->targets = targets;
    t->accum = t->o.grad_accum;
    t->total_count = 0;
    for (int i = 0; i < t->n * t->accum; i++) t->total_count += zs_train_count_targets(targets[i], bt);
    t->loss_sum = 0;
    t->fail_rc = 0;
    t->fail_err[0] = 0;
    size_t np;
    float *g = zs_lora_data(t->gsum, &np);
    memset(g, 0, np * sizeof(float));
    t->have_grad = 0;
    t->micro = 0;
    t->pos = 0;
    t->in_step = 1;
    return 0;
}

int zs_lora_training_next_range(zs_lora_training *t, double budget_s, zs_pass_range *out) {
    if (!t->in_step || t->micro >= t->accum) return 0;
    if (!t->has_decl) {
        t->decl = plan_range(t, t->pos, budget_s);
        t->has_decl = 1;
    }
    *out = t->decl;
    return 1;
}

/* The estimated seconds of range r; a unit never measured counts as `unknown`. */
static double range_est(const zs_lora_training *t, zs_pass_range r, double unknown) {
    double est = 0;
    for (int p = r.first; p < r.first + r.count; p = unit_end(t, p)) {
        double u = is_bwd(t, p) ? t->u_bwd : t->u_fwd;
        est += u > 0 ? u : unknown;
    }
    return est;
}

int zs_lora_training_slice(zs_lora_training *t, double budget_s, int then_more, int *more) {
    if (!t->in_step) return zs_err(ZS_EINVAL, "LoRA training: a slice without a step");
    double t0 = zs_now();
    int whole = !(isfinite(budget_s) && budget_s > 0);
    while (t->micro < t->accum) {
        zs_pass_range cur = t->has_decl ? t->decl : plan_range(t, t->pos, budget_s);
        t->has_decl = 0;
        double left = budget_s - (zs_now() - t0);
        /* what follows this range: the rest of the micro-batch, or the next one's start; it
         * comes in this slice when both fit what is left (units not measured yet never fit) */
        int np = cur.first + cur.count, nmicro = t->micro, fits = 0;
        if (np == t->n_ord) np = 0, nmicro++;
        t->has_nxt = 0;
        if (nmicro < t->accum) {
            zs_pass_range nx = plan_range(t, np, budget_s);
            fits = whole || range_est(t, cur, INFINITY) + range_est(t, nx, INFINITY) < left;
            if (fits || then_more) {
                t->nxt = nx; /* a promise: the next range run is this one */
                t->has_nxt = 1;
            }
        } else if (then_more && !whole) {
            /* the step's last range: the next step's first follows (the caller has more work);
             * if no step follows, that pass is consumed unused */
            t->nxt = plan_range(t, 0, budget_s);
            t->has_nxt = 1;
        }
        if (!t->has_nxt && !fits && !whole) {
            /* the slice ends here and the caller serves next: its inference pass is declared (as
             * speculation would guess it, which a scheduler turns off while training is queued) */
            zs_pass_range inf = {0, t->n_inf};
            t->nxt = inf;
            t->has_nxt = 1;
            t->infer_next = 1;
        }
        t->cur = cur;
        zs_world_run(t->w, range_job, t);
        ewma(&t->u_fwd, t->rank0_fwd, t->rank0_nf);
        ewma(&t->u_bwd, t->rank0_bwd, t->rank0_nb);
        if (t->has_nxt && !t->infer_next) {
            t->decl = t->nxt;
            t->has_decl = 1;
        }
        t->infer_next = 0;
        t->pos = cur.first + cur.count;
        if (t->pos == t->n_ord) {
            t->pos = 0;
            t->micro++;
        }
        if (!fits) break;
    }
    if (t->micro < t->accum) {
        *more = 1;
        return 0;
    }
    *more = 0;
    return step_finish(t); /* a promised range stays: the next step begins with it */
}

float zs_lora_training_step_loss(const zs_lora_training *t) { return t->step_loss; }

void zs_lora_training_step_abort(zs_lora_training *t) {
    t->in_step = 0;
    t->has_decl = 0; /* a declared pass is consumed by the next pass begun (counted as wasted) */
}

int zs_lora_training_step(zs_lora_training *t, const int32_t *const *tokens, const int32_t *const *targets,
                          long step, float *loss) {
    ZS_CHECK(zs_lora_training_step_begin(t, tokens, targets, step));
    int more = 1, rc = 0;
    while (more && rc == 0) rc = zs_lora_training_slice(t, INFINITY, 0, &more);
    t->in_step = 0;
    if (rc < 0) return rc;
    *loss = t->step_loss;
    return 0;
}

/* ---- riding serving steps ---- */

static int ride_acquire(void *ctx, int b, const void **data) {
    lrank *R = ctx;
    int rc = R->inner.acquire(R->inner.ctx, b, data);
    R->cur = rc == 0 ? *data : NULL;
    return rc;
}

/* The serving forward is done with its k-th item: the rider's unit there runs first. */
static void ride_release(void *ctx, int b) {
    lrank *R = ctx;
    zs_lora_training *t = R->t;
    int rank = (int)(R - t->r);
    int k = R->k++;
    if (k >= t->ride_from && k < t->ride_to && k == R->reached) {
        double t0 = zs_now();
        int e = unit_end(t, k);
        if (e - k == 2) { /* a tied head: wait for the embeddings, which come next */
            R->head = R->cur;
            R->holding = 1;
            R->ride_s += zs_now() - t0;
            return;
        }
        if (k == 0) micro_start(t, R, rank);
        unit_compute(t, R, rank, k, R->cur, NULL);
        R->reached = e;
        R->ride_s += zs_now() - t0;
    } else if (R->holding && k == R->reached + 1) {
        double t0 = zs_now();
        unit_compute(t, R, rank, R->reached, R->head, R->cur);
        R->reached = k + 1;
        R->head = NULL;
        R->holding = 0;
        R->ride_s += zs_now() - t0;
        R->inner.release(R->inner.ctx, t->ord[k - 1]); /* the head's bucket (releases go in order) */
    }
    R->inner.release(R->inner.ctx, b);
}

static zs_weight_source ride_wrap(void *ud, int rank, zs_weight_source inner) {
    zs_lora_training *t = ud;
    lrank *R = &t->r[rank];
    R->inner = inner;
    R->k = 0;
    R->cur = R->head = NULL;
    R->holding = 0;
    R->reached = t->ride_from;
    R->ride_s = 0;
    return (zs_weight_source){ride_acquire, ride_release, R, inner.experts};
}

static void ride_walk(void *ud, int rank, zs_weight_source src) {
    zs_lora_training *t = ud;
    (void)rank;
    for (int k = 0; k < t->n_inf; k++) {
        const void *d;
        if (src.acquire(src.ctx, t->ord[k], &d) < 0) {
            src.release(src.ctx, t->ord[k]);
            return; /* pass_end drives the rest */
        }
        src.release(src.ctx, t->ord[k]);
    }
}

static void ride_done(void *ud, int rank) {
    zs_lora_training *t = ud;
    lrank *R = &t->r[rank];
    if (R->holding) { /* the pass stopped between a tied head and its embeddings */
        R->inner.release(R->inner.ctx, t->hb);
        R->head = NULL;
        R->holding = 0;
    }
}

const zs_world_rider *zs_lora_training_rider(zs_lora_training *t, double budget_s) {
    if (!t->can_ride || !t->in_step || t->has_decl || t->micro >= t->accum || t->pos >= t->n_inf || t->riding) return NULL;
    int e = t->pos;
    double est = 0;
    do {
        est += t->u_fwd;
        e = unit_end(t, e);
    } while (e < t->n_inf && t->u_fwd > 0 && est + t->u_fwd <= budget_s);
    if (t->u_fwd <= 0) e = t->n_inf; /* not measured yet: the whole forward, measured by this ride */
    t->ride_from = t->pos;
    t->ride_to = e;
    t->rider = (zs_world_rider){ride_wrap, ride_walk, ride_done, t};
    t->riding = 1;
    for (int r = 0; r < t->nl; r++) t->r[r].reached = -1, t->r[r].ride_s = 0;
    return &t->rider;
}

double zs_lora_training_ride_end(zs_lora_training *t, int step_rc) {
    if (!t->riding) return 0;
    t->riding = 0;
    int ok = step_rc == 0;
    for (int r = 0; r < t->nl; r++) ok &= t->r[r].reached == t->ride_to;
    double s = t->r[0].ride_s;
    int units = 0;
    for (int p = t->ride_from; p < t->ride_to; p = unit_end(t, p)) units++;
    if (ok) {
        ewma(&t->u_fwd, s, units);
        t->pos = t->ride_to;
    } else {
        t->pos = 0; /* the micro-batch's forward starts over (a new embedding pass abandons the old) */
    }
    return s;
}

uint64_t zs_lora_training_pass_bytes(const zs_lora_training *t) { return t->pass_bytes; }
