/* train.c — ZeRO-3 training steps over the world's ranks: per-rank forward/backward through the
 * gather coordinator (training pass order), reduce-scatter of each bucket's gradient, fp32
 * gradient shards accumulated over micro-steps, global-norm clipping and partitioned AdamW on
 * fp32 master shards, written back to the storage shards (shard buffers, or in place into the
 * NVMe shard files through the gather coordinator). See train.h.
 *
 * Mixtures of experts: the trainer takes each MoE layer's experts from the rank's gather source
 * (the agreement protocol of model.h) and accumulates each expert's gradient into a per-expert
 * buffer of this rank (egrad_cb; only the experts its tokens selected). After layer l's backward
 * the ranks agree on the experts of l that received tokens on any rank (an all-reduce MAX of one
 * f32 flag per expert on the gradient communicator; zeros from a rank that failed) and every rank
 * reduces those experts' gradients, in increasing order, as any other bucket (zeros where it had
 * none). An expert reduced in no micro-step of a step has no gradient: AdamW leaves it alone (no
 * moment decay, no weight decay, and its own step count -- AdamW's bias correction -- stays behind,
 * as torch.optim.AdamW skips a parameter whose grad is None), except
 * in OLMoE, whose block runs every expert (transformers loops over all of them, so torch sees zero
 * gradients and updates every expert). The auxiliary load-balancing loss is per micro-batch
 * (backward.h) and, like its cross-entropy, weighted by the micro-batch's share of the step's
 * counted targets: the step's loss is sum_i count_i/total · (CE_i + coef·aux_i).
 * A rank whose pass failed still drives its weight source through the whole pass (every bucket
 * acquired and released, experts() with an all-zero mask, every agreed expert acquired and
 * released: zs_trainer_experts_sync) and takes part in every reduction with zeros, so the other
 * ranks' gathers and reductions complete. */
#include "train.h"

#include <jansson.h>
#include <math.h>
#include <string.h>

#include "backward.h"
#include "ckpt.h"
#include "cluster.h"
#include "common.h"
#include "gather.h"
#include "safetensors.h"

typedef struct {
    zs_trainer *tr;
    float **master, **mom, **var, **gacc;   /* [bucket] this rank's shard, storage-element order */
    float **rmaster, **rmom, **rvar, **racc; /* [bucket] resident area (glayout order); rank 0 updates */
    float *gl_data, *gl_res;                 /* one bucket's gradient, glayout order */
    float *gh_data, *gh_res, *ge_data, *ge_res; /* head and embedding gradients of a micro-step */
    float *gfull, *gshard;                   /* storage-element order, full and one shard */
    void *wbuf;                              /* one shard in the storage dtype (nvme write-back) */
    float *exfull;                           /* export across processes: one gathered bucket */
    void *stat;                              /* several processes: every rank's {loss, status} */
    /* mixtures of experts: the gather source the trainer reads experts from; per expert of the
     * layer being backpropagated, its gradient buffer (glayout data area, made on first use), whether
     * this rank's tokens gave it one (eflag), the flags all-reduced (emask); a zero gradient; per
     * bucket whether the step reduced a gradient for it (ehad: experts without one are not updated) */
    zs_training *owner;
    zs_weight_source src;
    float **eg, *emask, *ezero;              /* eg[e]: data area, then resident area (backward.h) */
    unsigned char *eflag, *ehad;
    long *bskip;                             /* per bucket: optimizer steps it was skipped (experts) */
    int eg_fail;
    double loss_sum;
    int rc;
    char err[512];
} rank_tr;

struct zs_training {
    zs_world *w;
    zs_model *m;
    zs_train_opts o;
    int n, nb, tied;       /* n: ranks of the world (all processes) */
    int nl, first;         /* ranks of this process (t->r has nl entries), world rank of the first */
    int stage;             /* ZeRO stage: 3 sharded parameters; 2 and 1 replicated parameters,
                              with gradients reduce-scattered (2) or all-reduced (1) */
    size_t *n_elem, *shard_elem, *res_elem; /* per bucket */
    size_t dsize;
    zs_dtype wdt;
    rank_tr *r;
    /* the current job */
    const int32_t *const *tokens, *const *targets;
    int micro;             /* micro-step index */
    long total_count;      /* counted targets of the whole step */
    long step;
    float lr;
    int eval;
    int ex_bucket;         /* the bucket export_job gathers */
    double loss_total;     /* several processes: the step's loss sum and worst status */
    int worst_rc, worst_rank;
    int n_experts;         /* experts per MoE layer (0: a dense model) */
    size_t eg_bytes;       /* the largest expert bucket's gradient (glayout: data area + resident area) */
};

/* ---- layout helpers ---- */

/* glayout (f32 offsets) data area -> storage-element order (zero padding), times scale */
static void to_storage_order(const zs_training *t, int b, const float *gl, float *se, float scale) {
    const zs_bucket_layout *L = zs_model_layout(t->m, b), *G = zs_model_grad_layout(t->m, b);
    memset(se, 0, t->shard_elem[b] * (size_t)t->n * sizeof(float));
    for (int s = 0; s < L->n_roles; s++) {
        const zs_slot *a = &L->slot[s], *g = &G->slot[s];
        if (!a->present || a->resident) continue;
        size_t n = (size_t)(a->shape[0] * a->shape[1]);
        const float *src = gl + g->offset / 4;
        float *dst = se + a->offset / t->dsize;
        for (size_t i = 0; i < n; i++) dst[i] = src[i] * scale;
    }
}

/* Reduces one bucket's gradient (glayout order, this rank's micro-batch) into the shards. */
static int reduce_bucket(zs_training *t, int rank, int b, float *gdata, float *gres, float scale) {
    rank_tr *R = &t->r[rank];
    zs_comm *c = zs_world_grad_comm(t->w, rank);
    int rc = 0;
    if (t->shard_elem[b] > 0 && t->stage == 1) {
        /* stage 1: every rank keeps the whole gradient */
        size_t full = t->shard_elem[b] * (size_t)t->n;
        to_storage_order(t, b, gdata, R->gfull, scale);
        rc = zs_comm_all_reduce(c, R->gfull, R->gfull, full, ZS_F32, ZS_RED_SUM, NULL);
        if (rc == 0)
            for (size_t i = 0; i < full; i++) R->gacc[b][i] += R->gfull[i];
    } else if (t->shard_elem[b] > 0) {
        to_storage_order(t, b, gdata, R->gfull, scale);
        rc = zs_comm_reduce_scatter(c, R->gfull, R->gshard, t->shard_elem[b], ZS_F32, ZS_RED_SUM, NULL);
        if (rc == 0)
            for (size_t i = 0; i < t->shard_elem[b]; i++) R->gacc[b][i] += R->gshard[i];
    }
    if (rc == 0 && t->res_elem[b] > 0) {
        for (size_t i = 0; i < t->res_elem[b]; i++) gres[i] *= scale;
        rc = zs_comm_all_reduce(c, gres, gres, t->res_elem[b], ZS_F32, ZS_RED_SUM, NULL);
        if (rc == 0)
            for (size_t i = 0; i < t->res_elem[b]; i++) R->racc[b][i] += gres[i];
    }
    return rc;
}

long zs_train_count_targets(const int32_t *tg, size_t n) {
    long c = 0;
    for (size_t i = 0; i < n; i++) c += tg[i] >= 0;
    return c;
}

/* ---- mixtures of experts ---- */

/* The trainer's expert gradient buffer: expert e of the layer being backpropagated, zeroed on its
 * first use in that layer (NULL when out of memory: eg_fail fails the pass). */
static float *egrad_cb(void *ctx, int layer, int e) {
    rank_tr *R = ctx;
    zs_training *t = R->owner;
    (void)layer;
    if (e < 0 || e >= t->n_experts) return NULL;
    if (!R->eg[e] && !(R->eg[e] = zs_aligned_alloc(64, t->eg_bytes + 64))) {
        R->eg_fail = 1;
        return NULL;
    }
    if (!R->eflag[e]) {
        memset(R->eg[e], 0, t->eg_bytes);
        R->eflag[e] = 1;
    }
    return R->eg[e];
}

/* After layer l's backward: the experts of l that received tokens on any rank (this rank's
 * flags, zeros when it failed, all-reduced with MAX), each reduced in increasing order like any
 * bucket (this rank's gradient or zeros) and marked as having a gradient this step. */
static int reduce_experts(zs_training *t, int rank, int l, int failed, float scale) {
    rank_tr *R = &t->r[rank];
    zs_comm *c = zs_world_grad_comm(t->w, rank);
    int E = t->n_experts, rc = 0;
    for (int e = 0; e < E; e++) R->emask[e] = !failed && R->eflag[e] ? 1.0f : 0.0f;
    rc = zs_comm_all_reduce(c, R->emask, R->emask, (size_t)E, ZS_F32, ZS_RED_MAX, NULL);
    for (int e = 0; e < E && rc == 0; e++) {
        if (!(R->emask[e] > 0.0f)) continue;
        int b = zs_bucket_expert(t->m, l, e), mine = !failed && R->eflag[e];
        float *g = mine ? R->eg[e] : R->ezero, *gr = R->gl_res;
        if (mine) gr = R->eg[e] + zs_model_grad_layout(t->m, b)->data_bytes / sizeof(float);
        else memset(R->gl_res, 0, t->res_elem[b] * sizeof(float) + 4);
        rc = reduce_bucket(t, rank, b, g, gr, scale);
        R->ehad[b] = 1;
    }
    memset(R->eflag, 0, (size_t)E);
    return rc;
}

/* ---- one micro-step on one rank ---- */

static void micro_job(void *ud, int rank) {
    zs_training *t = ud;
    rank_tr *R = &t->r[rank];
    zs_model *m = t->m;
    zs_gather *g = zs_world_gather(t->w, rank);
    zs_weight_source src = R->src;
    const zs_model_config *c = zs_model_config_get(m);
    int i = t->micro * t->n + t->first + rank, L = c->n_layers, eb = zs_bucket_embed(), hb = zs_bucket_head(m);
    size_t bt = (size_t)t->o.micro_batch * (size_t)t->o.seq_len;
    const int32_t *tok = t->tokens[i], *tg = t->targets[i];
    long count = zs_train_count_targets(tg, bt);
    /* the trainer's gradient is of this rank's mean loss: weigh it by its share of the step */
    float scale = t->total_count > 0 ? (float)count / (float)t->total_count : 0.0f;
    const void *d, *d2;
    int rc = 0, failed = 0;
    float loss = 0;
#define FAIL(x)                                                      \
    do {                                                             \
        int rc_ = (x);                                               \
        if (rc_ < 0 && !failed) {                                    \
            failed = rc_;                                            \
            snprintf(R->err, sizeof R->err, "%s", zs_errmsg());      \
        }                                                            \
    } while (0)

    /* an evaluation has no backward: its pass is the inference order (the same buckets) */
    zs_gather_pass_begin(g, t->eval ? ZS_PASS_INFER : ZS_PASS_TRAIN);
    /* forward; after a failure the pass is still driven through the source without computing */
    if ((rc = src.acquire(src.ctx, eb, &d)) == 0) rc = zs_train_embed_fwd(R->tr, d, zs_model_bucket_resident(m, eb), tok);
    FAIL(rc);
    src.release(src.ctx, eb);
    for (int l = 0; l < L; l++) {
        int b = zs_bucket_layer(l);
        FAIL(src.acquire(src.ctx, b, &d));
        if (!failed) FAIL(zs_train_layer_fwd(R->tr, l, d, zs_model_bucket_resident(m, b)));
        if (failed) FAIL(zs_trainer_experts_sync(R->tr, l, 0));
        src.release(src.ctx, b);
    }
    if (!failed) {
        memset(R->gh_data, 0, zs_model_grad_layout(m, hb)->data_bytes);
        memset(R->gh_res, 0, t->res_elem[hb] * sizeof(float) + 4);
        memset(R->ge_data, 0, zs_model_grad_layout(m, eb)->data_bytes);
        memset(R->ge_res, 0, t->res_elem[eb] * sizeof(float) + 4);
    }
    rc = src.acquire(src.ctx, hb, &d);
    int rc2 = t->tied ? src.acquire(src.ctx, eb, &d2) : 0;
    FAIL(rc);
    FAIL(rc2);
    if (!failed)
        FAIL(zs_train_head(R->tr, d, zs_model_bucket_resident(m, hb), t->tied ? d2 : NULL,
                           t->tied ? zs_model_bucket_resident(m, eb) : NULL, tg, &loss,
                           t->eval ? NULL : R->gh_data, t->eval ? NULL : R->gh_res,
                           t->eval ? NULL : R->ge_data, t->eval ? NULL : R->ge_res));
    src.release(src.ctx, hb);
    if (t->tied) src.release(src.ctx, eb);
    if (failed) loss = 0;
    R->loss_sum += (double)loss * (double)count;
    if (!t->eval) {
        /* backward; after a failure every rank still takes part in every gather and reduction
         * (with zeros) */
        for (int l = L - 1; l >= 0; l--) {
            int b = zs_bucket_layer(l);
            memset(R->gl_data, 0, zs_model_grad_layout(m, b)->data_bytes);
            memset(R->gl_res, 0, t->res_elem[b] * sizeof(float) + 4);
            FAIL(src.acquire(src.ctx, b, &d));
            if (!failed) FAIL(zs_train_layer_bwd(R->tr, l, d, zs_model_bucket_resident(m, b), R->gl_data, R->gl_res));
            if (failed) (void)zs_trainer_experts_sync(R->tr, l, 1);
            src.release(src.ctx, b);
            if (R->eg_fail) {
                R->eg_fail = 0;
                FAIL(zs_err(ZS_ENOMEM, "training: out of memory for the gradient of an expert of layer %d", l));
            }
            if (failed) {
                memset(R->gl_data, 0, zs_model_grad_layout(m, b)->data_bytes);
                memset(R->gl_res, 0, t->res_elem[b] * sizeof(float) + 4);
            }
            FAIL(reduce_bucket(t, rank, b, R->gl_data, R->gl_res, scale));
            if (zs_config_layer_moe(c, l)) FAIL(reduce_experts(t, rank, l, failed, scale));
        }
        if (!failed) FAIL(zs_train_embed_bwd(R->tr, NULL, NULL, R->ge_data, R->ge_res));
        if (failed) {
            memset(R->ge_data, 0, zs_model_grad_layout(m, eb)->data_bytes);
            memset(R->ge_res, 0, t->res_elem[eb] * sizeof(float) + 4);
            memset(R->gh_data, 0, zs_model_grad_layout(m, hb)->data_bytes);
            memset(R->gh_res, 0, t->res_elem[hb] * sizeof(float) + 4);
        }
        FAIL(reduce_bucket(t, rank, eb, R->ge_data, R->ge_res, scale));
        FAIL(reduce_bucket(t, rank, hb, R->gh_data, R->gh_res, scale));
    }
#undef FAIL
    zs_gather_pass_end(g);
    if (failed && R->rc == 0) R->rc = failed; /* the first failure of the step */
}

/* ---- the optimizer step on one rank ---- */

/* The gradient of this rank's optimizer partition of bucket b. */
static float *grad_slice(const zs_training *t, int rank, int b) {
    return t->stage == 1 ? t->r[rank].gacc[b] + (size_t)(t->first + rank) * t->shard_elem[b] : t->r[rank].gacc[b];
}

static void optim_job(void *ud, int rank) {
    zs_training *t = ud;
    rank_tr *R = &t->r[rank];
    zs_comm *c = zs_world_grad_comm(t->w, rank);
    zs_gather *g = zs_world_gather(t->w, rank);
    double ss = 0;
    for (int b = 0; b < t->nb; b++) {
        ss += zs_sumsq(grad_slice(t, rank, b), t->shard_elem[b]);
        if (t->first + rank == 0) ss += zs_sumsq(R->racc[b], t->res_elem[b]); /* replicated: count once */
    }
    float part = (float)ss, total = 0;
    int rc = zs_comm_all_reduce(c, &part, &total, 1, ZS_F32, ZS_RED_SUM, NULL);
    if (rc < 0) {
        R->rc = rc;
        snprintf(R->err, sizeof R->err, "%s", zs_errmsg());
        return;
    }
    float coef = t->o.grad_clip > 0 ? zs_clip_coef(total, t->o.grad_clip) : 1.0f;
    for (int b = 0; b < t->nb && rc == 0; b++) {
        /* an expert that received no token in the whole step has no gradient: not updated (OLMoE:
         * every expert has one, zero where unused: see the top of the file) */
        if (zs_bucket_is_expert(t->m, b, NULL, NULL) && !R->ehad[b] &&
            zs_model_config_get(t->m)->family != ZS_FAM_OLMOE) {
            R->bskip[b]++; /* torch's per-parameter step count does not advance either */
            continue;
        }
        long bt = t->step - R->bskip[b]; /* this bucket's own AdamW step (bias correction) */
        if (t->shard_elem[b] > 0) {
            float *gs = grad_slice(t, rank, b);
            if (coef != 1.0f) zs_scale(gs, t->shard_elem[b], coef);
            if (t->stage < 3) {
                /* replicated parameters: update this rank's partition, then every rank gathers the
                 * updated partitions into its whole copy */
                rc = zs_adamw_update(R->master[b], R->mom[b], R->var[b], gs, t->shard_elem[b], &t->o.adam, t->lr,
                                     bt, 1, R->wbuf, t->wdt);
                if (rc == 0)
                    rc = zs_comm_all_gather(c, R->wbuf, zs_gather_shard_buffer(g, b), t->shard_elem[b] * t->dsize, NULL);
            } else {
                /* none/cpu: straight into the shard buffer; nvme: into the scratch shard, then
                 * written in place into the shard file (between passes: no read is in flight).
                 * An expert always goes through zs_gather_write_shard, which tells the
                 * coordinator that its cached full copy is stale */
                void *out = zs_bucket_is_expert(t->m, b, NULL, NULL) ? NULL : zs_gather_shard_buffer(g, b);
                rc = zs_adamw_update(R->master[b], R->mom[b], R->var[b], gs, t->shard_elem[b], &t->o.adam, t->lr,
                                     bt, 1, out ? out : R->wbuf, t->wdt);
                if (rc == 0 && !out) rc = zs_gather_write_shard(g, b, R->wbuf);
            }
            memset(R->gacc[b], 0, t->shard_elem[b] * (t->stage == 1 ? (size_t)t->n : 1) * sizeof(float));
        }
        if (t->res_elem[b] > 0) {
            if (rank == 0) { /* every process updates its own copy of the resident tensors */
                if (coef != 1.0f) zs_scale(R->racc[b], t->res_elem[b], coef);
                if (rc == 0)
                    rc = zs_adamw_update(R->rmaster[b], R->rmom[b], R->rvar[b], R->racc[b], t->res_elem[b],
                                         &t->o.adam, t->lr, bt, 1, NULL, ZS_F32);
                /* write the resident tensors back in their storage dtypes */
                const zs_bucket_layout *L = zs_model_layout(t->m, b), *G = zs_model_grad_layout(t->m, b);
                char *res = zs_model_bucket_resident_mut(t->m, b);
                for (int s = 0; rc == 0 && s < L->n_roles; s++) {
                    const zs_slot *a = &L->slot[s];
                    if (!a->present || !a->resident) continue;
                    zs_convert(res + a->offset, a->dtype, R->rmaster[b] + G->slot[s].offset / 4, ZS_F32,
                               (size_t)(a->shape[0] * a->shape[1]));
                }
            }
            memset(R->racc[b], 0, t->res_elem[b] * sizeof(float));
        }
    }
    if (rc < 0) snprintf(R->err, sizeof R->err, "%s", zs_errmsg());
    R->rc = rc;
}

/* Several processes: every rank learns every rank's loss sum and status (an all_gather, so the
 * sum below adds them in rank order as one process does). */
typedef struct { double loss; int32_t rc, pad; } rank_stat;

static void stat_job(void *ud, int rank) {
    zs_training *t = ud;
    rank_tr *R = &t->r[rank];
    rank_stat me = {R->loss_sum, R->rc, 0};
    int rc = zs_comm_all_gather(zs_world_grad_comm(t->w, rank), &me, R->stat, sizeof me, NULL);
    if (rank != 0) return;
    const rank_stat *all = R->stat;
    t->loss_total = 0;
    t->worst_rc = rc;
    t->worst_rank = -1;
    for (int g = 0; rc == 0 && g < t->n; g++) {
        t->loss_total += all[g].loss;
        if (all[g].rc < 0 && t->worst_rank < 0) {
            t->worst_rc = all[g].rc;
            t->worst_rank = g;
        }
    }
    if (rc < 0) snprintf(R->err, sizeof R->err, "%s", zs_errmsg());
}

static void export_job(void *ud, int rank) {
    zs_training *t = ud;
    rank_tr *R = &t->r[rank];
    int b = t->ex_bucket;
    R->rc = zs_comm_all_gather(zs_world_grad_comm(t->w, rank), R->master[b], R->exfull,
                               t->shard_elem[b] * sizeof(float), NULL);
    if (R->rc < 0) snprintf(R->err, sizeof R->err, "%s", zs_errmsg());
}

static void spec_job(void *ud, int rank) {
    zs_training *t = ud;
    zs_gather_set_speculation(zs_world_gather(t->w, rank), t->eval);
}

/* ---- set-up ---- */

static float *falloc(size_t n) {
    float *p = zs_aligned_alloc(64, (n + 16) * sizeof(float));
    if (p) memset(p, 0, (n + 16) * sizeof(float));
    return p;
}

int zs_training_begin(zs_world *w, const zs_train_opts *o, zs_training **out) {
    if (zs_world_is_cuda(w)) return zs_err(ZS_EUNSUPPORTED, "training runs on the CPU device for now (use --device cpu)");
    if (zs_world_led(w))
        return zs_err(ZS_EUNSUPPORTED, "training: a multi-process world led by process 0 cannot train; every process "
                                       "must run the training (zeroserve train under mpirun)");
    if (zs_model_embed_lookup(zs_world_model(w)))
        return zs_err(ZS_EINVAL, "training: the engine was opened for inference (embedding lookup tables in host "
                                 "memory); open it with zs_model_opts.embed_lookup = 0");
    if (o->micro_batch < 1 || o->seq_len < 2 || o->grad_accum < 1)
        return zs_err(ZS_EINVAL, "training: batch size, sequence length (>= 2) and gradient accumulation must be positive");
    zs_model *m = zs_world_model(w);
    const zs_model_config *c = zs_model_config_get(m);
    if (zs_model_quant_dtype(m) != ZS_DTYPE_COUNT)
        return zs_err(ZS_EUNSUPPORTED, "training: the engine stores %s weights; training writes fp32 masters back into "
                                       "the storage dtype and needs f32, f16 or bf16 (open it with --weight-dtype bf16)",
                      zs_dtype_name(zs_model_quant_dtype(m)));
    if (o->seq_len > c->max_seq)
        return zs_err(ZS_ERANGE, "training: sequence length %d exceeds the model's context %d", o->seq_len, c->max_seq);
    zs_training *t = calloc(1, sizeof *t);
    if (!t) return zs_err(ZS_ENOMEM, "out of memory");
    t->w = w;
    t->m = m;
    t->o = *o;
    t->n = zs_world_size(w);
    t->nl = zs_world_ranks(w);
    t->first = zs_world_first_rank(w);
    int repl = zs_world_replicated(w);
    t->stage = o->stage ? o->stage : repl ? 2 : 3;
    if (t->stage < 1 || t->stage > 3 || (t->stage < 3) != repl) {
        int st = t->stage;
        free(t);
        return zs_err(ZS_EINVAL, "training: ZeRO stage %d does not fit this engine (parameters %s); open it with the same zero_optimization.stage",
                      st, repl ? "replicated: stage 1 or 2" : "sharded: stage 3");
    }
    t->nb = zs_model_n_buckets(m);
    t->tied = c->tied_embeddings;
    t->wdt = zs_model_layout(m, zs_bucket_layer(0))->slot[ZS_R_WQ].dtype;
    t->dsize = zs_dtype_size(t->wdt);
    t->n_elem = calloc((size_t)t->nb * 3, sizeof(size_t));
    t->r = calloc((size_t)t->nl, sizeof *t->r);
    int rc = 0;
    if (!t->n_elem || !t->r) { free(t->n_elem); free(t->r); free(t); return zs_err(ZS_ENOMEM, "out of memory"); }
    t->shard_elem = t->n_elem + t->nb;
    t->res_elem = t->shard_elem + t->nb;
    size_t max_full = 0, max_gl = 0, max_res = 0, max_se = 0;
    t->n_experts = c->n_experts;
    for (int b = 0; b < t->nb; b++) {
        if (zs_bucket_is_expert(m, b, NULL, NULL)) /* the data area, then the resident one (backward.h) */
            t->eg_bytes = ZS_MAX(t->eg_bytes, zs_model_grad_layout(m, b)->data_bytes + zs_model_grad_layout(m, b)->resident_bytes);
        const zs_bucket_layout *L = zs_model_layout(m, b), *G = zs_model_grad_layout(m, b);
        for (int s = 0; s < L->n_roles && rc == 0; s++)
            if (L->slot[s].present && !L->slot[s].resident && L->slot[s].dtype != t->wdt)
                rc = s == ZS_R_ROUTER || s == ZS_R_SHARED_GATE
                         ? zs_err(ZS_EUNSUPPORTED, "training: the %s of layer %d is stored in %s, the other matrices in %s "
                                  "(a MoE router keeps its checkpoint's dtype); train in the checkpoint's own dtype",
                                  s == ZS_R_ROUTER ? "router" : "shared-expert gate", b - 1,
                                  zs_dtype_name(L->slot[s].dtype), zs_dtype_name(t->wdt))
                         : zs_err(ZS_EUNSUPPORTED, "training: mixed dtypes in the sharded part of bucket %d", b);
        t->n_elem[b] = L->data_bytes / t->dsize;
        t->shard_elem[b] = zs_partition_shard_bytes(m, b, t->n) / t->dsize;
        t->res_elem[b] = G->resident_bytes / 4;
        max_full = ZS_MAX(max_full, t->shard_elem[b] * (size_t)t->n);
        max_se = ZS_MAX(max_se, t->shard_elem[b]);
        max_gl = ZS_MAX(max_gl, G->data_bytes / 4);
        max_res = ZS_MAX(max_res, t->res_elem[b]);
    }
    for (int r = 0; r < t->nl && rc == 0; r++) {
        zs_gather_stats st;
        zs_gather_stats_get(zs_world_gather(w, r), &st);
        rank_tr *R = &t->r[r];
        rc = zs_trainer_new(m, o->micro_batch, o->seq_len, &R->tr);
        if (rc < 0) break;
        R->owner = t;
        R->src = zs_gather_source(zs_world_gather(w, r));
        R->ehad = calloc((size_t)t->nb, 1);
        R->bskip = calloc((size_t)t->nb, sizeof(long));
        if (!R->ehad || !R->bskip) { rc = zs_err(ZS_ENOMEM, "out of memory"); break; }
        if (t->n_experts > 0) {
            R->eg = calloc((size_t)t->n_experts, sizeof(float *));
            R->emask = falloc((size_t)t->n_experts);
            R->ezero = falloc(t->eg_bytes / sizeof(float));
            R->eflag = calloc((size_t)t->n_experts, 1);
            if (!R->eg || !R->emask || !R->ezero || !R->eflag) { rc = zs_err(ZS_ENOMEM, "out of memory"); break; }
        }
        if ((rc = zs_trainer_set_experts(R->tr, &R->src, egrad_cb, R)) < 0) break;
        R->master = calloc((size_t)t->nb * 8, sizeof(float *));
        if (!R->master) { rc = zs_err(ZS_ENOMEM, "out of memory"); break; }
        R->mom = R->master + t->nb; R->var = R->mom + t->nb; R->gacc = R->var + t->nb;
        R->rmaster = R->gacc + t->nb; R->rmom = R->rmaster + t->nb; R->rvar = R->rmom + t->nb;
        R->racc = R->rvar + t->nb;
        R->gl_data = falloc(max_gl);
        R->gl_res = falloc(max_res);
        R->gh_data = falloc(zs_model_grad_layout(m, zs_bucket_head(m))->data_bytes / 4);
        R->gh_res = falloc(t->res_elem[zs_bucket_head(m)]);
        R->ge_data = falloc(zs_model_grad_layout(m, zs_bucket_embed())->data_bytes / 4);
        R->ge_res = falloc(t->res_elem[zs_bucket_embed()]);
        R->gfull = falloc(max_full);
        R->gshard = falloc(max_full);
        R->wbuf = falloc(max_se); /* f32-sized: room for a shard in any storage dtype */
        R->stat = calloc((size_t)t->n, sizeof(rank_stat));
        int ok = R->gl_data && R->gl_res && R->gh_data && R->gh_res && R->ge_data && R->ge_res && R->gfull &&
                 R->gshard && R->wbuf && R->stat;
        for (int b = 0; ok && b < t->nb; b++) {
            size_t se = t->shard_elem[b], re = t->res_elem[b];
            R->master[b] = falloc(se); R->mom[b] = falloc(se); R->var[b] = falloc(se);
            R->gacc[b] = falloc(t->stage == 1 ? se * (size_t)t->n : se);
            R->racc[b] = falloc(re);
            ok = R->master[b] && R->mom[b] && R->var[b] && R->gacc[b] && R->racc[b];
            if (ok && r == 0) {
                R->rmaster[b] = falloc(re); R->rmom[b] = falloc(re); R->rvar[b] = falloc(re);
                ok = R->rmaster[b] && R->rmom[b] && R->rvar[b];
            }
            if (!ok) break;
            /* fp32 masters from the storage shard (nvme: read from the shard file, verified) and
             * the resident tensors */
            zs_gather *g = zs_world_gather(w, r);
            const void *shard = zs_gather_shard_buffer(g, b);
            if (se > 0 && !shard) {
                if ((rc = zs_gather_read_shard(g, b, R->wbuf)) < 0) break;
                shard = R->wbuf;
            }
            if (se > 0 && t->stage < 3) shard = (const char *)shard + (size_t)(t->first + r) * se * t->dsize; /* its partition */
            if (se > 0) zs_to_f32(R->master[b], shard, t->wdt, se);
            if (r == 0 && re > 0) {
                const zs_bucket_layout *L = zs_model_layout(m, b), *G = zs_model_grad_layout(m, b);
                const char *res = zs_model_bucket_resident(m, b);
                for (int s = 0; s < L->n_roles; s++)
                    if (L->slot[s].present && L->slot[s].resident)
                        zs_to_f32(R->rmaster[b] + G->slot[s].offset / 4, res + L->slot[s].offset, L->slot[s].dtype,
                                  (size_t)(L->slot[s].shape[0] * L->slot[s].shape[1]));
            }
        }
        if (rc == 0 && !ok) rc = zs_err(ZS_ENOMEM, "training: out of memory for the optimizer state");
    }
    if (rc < 0) {
        zs_training_end(t);
        return rc;
    }
    /* training passes are announced: the prefetchers stop guessing inference passes */
    t->eval = 0;
    zs_world_run(w, spec_job, t);
    *out = t;
    return 0;
}

static int run_micro(zs_training *t, const int32_t *const *tokens, const int32_t *const *targets, int accum,
                     float *loss) {
    size_t bt = (size_t)t->o.micro_batch * (size_t)t->o.seq_len;
    t->tokens = tokens;
    t->targets = targets;
    t->total_count = 0;
    for (int i = 0; i < t->n * accum; i++) t->total_count += zs_train_count_targets(targets[i], bt);
    for (int r = 0; r < t->nl; r++) {
        t->r[r].loss_sum = 0;
        t->r[r].rc = 0;
        memset(t->r[r].ehad, 0, (size_t)t->nb); /* no expert has a gradient yet this step */
    }
    int multi = t->n > t->nl;
    for (t->micro = 0; t->micro < accum; t->micro++) {
        zs_world_run(t->w, micro_job, t);
        /* several processes: a failed rank still took part in every reduction (with zeros); the
         * processes learn of it together below */
        for (int r = 0; !multi && r < t->nl; r++)
            if (t->r[r].rc < 0) return zs_err(t->r[r].rc, "%s", t->r[r].err);
    }
    double sum = 0;
    if (multi) {
        zs_world_run(t->w, stat_job, t);
        int local = t->worst_rank - t->first;
        if (t->worst_rc < 0 && t->worst_rank < 0) return zs_err(t->worst_rc, "%s", t->r[0].err);
        if (t->worst_rc < 0 && local >= 0 && local < t->nl) return zs_err(t->worst_rc, "%s", t->r[local].err);
        if (t->worst_rc < 0)
            return zs_err(t->worst_rc, "training: rank %d (process %d) failed; see that process's log", t->worst_rank,
                          t->worst_rank / t->nl);
        sum = t->loss_total;
    } else {
        for (int r = 0; r < t->nl; r++) sum += t->r[r].loss_sum;
    }
    *loss = t->total_count > 0 ? (float)(sum / (double)t->total_count) : 0.0f;
    return 0;
}

int zs_training_step(zs_training *t, const int32_t *const *tokens, const int32_t *const *targets, long step,
                     float *loss) {
    if (step < 1) return zs_err(ZS_EINVAL, "training: steps are numbered from 1");
    t->eval = 0;
    float l;
    ZS_CHECK(run_micro(t, tokens, targets, t->o.grad_accum, &l));
    t->step = step;
    t->lr = zs_lr_at(&t->o.lr, step);
    zs_world_run(t->w, optim_job, t);
    for (int r = 0; r < t->nl; r++)
        if (t->r[r].rc < 0) return zs_err(t->r[r].rc, "%s", t->r[r].err);
    *loss = l;
    return 0;
}

int zs_training_eval(zs_training *t, const int32_t *const *tokens, const int32_t *const *targets, float *loss) {
    t->eval = 1;
    int accum = t->o.grad_accum;
    t->o.grad_accum = 1;
    int rc = run_micro(t, tokens, targets, 1, loss);
    t->o.grad_accum = accum;
    t->eval = 0;
    return rc;
}

void zs_training_end(zs_training *t) {
    if (!t) return;
    t->eval = 1; /* speculation back on */
    zs_world_run(t->w, spec_job, t);
    for (int r = 0; r < t->nl; r++) {
        rank_tr *R = &t->r[r];
        zs_trainer_free(R->tr);
        for (int b = 0; R->master && b < t->nb; b++) {
            free(R->master[b]); free(R->mom[b]); free(R->var[b]); free(R->gacc[b]);
            free(R->rmaster[b]); free(R->rmom[b]); free(R->rvar[b]); free(R->racc[b]);
        }
        free(R->master);
        free(R->gl_data); free(R->gl_res); free(R->gh_data); free(R->gh_res);
        free(R->ge_data); free(R->ge_res); free(R->gfull); free(R->gshard); free(R->wbuf);
        free(R->exfull); free(R->stat);
        for (int e = 0; R->eg && e < t->n_experts; e++) free(R->eg[e]);
        free(R->eg); free(R->emask); free(R->ezero); free(R->eflag); free(R->ehad); free(R->bskip);
    }
    free(t->r);
    free(t->n_elem);
    free(t);
}

/* ---- export ---- */

typedef struct { const char *name; int ndim; int64_t shape[2]; float *data; } ex_tensor;

static int copy_file(const char *src_dir, const char *dst_dir, const char *name, int required) {
    char a[4200], b[4200];
    snprintf(a, sizeof a, "%s/%s", src_dir, name);
    snprintf(b, sizeof b, "%s/%s", dst_dir, name);
    FILE *in = fopen(a, "rb");
    if (!in) return required ? zs_err(ZS_ENOTFOUND, "export: cannot read %s", a) : 0;
    FILE *out = fopen(b, "wb");
    if (!out) {
        fclose(in);
        return zs_err(ZS_EIO, "export: cannot write %s", b);
    }
    char buf[65536];
    size_t n;
    int rc = 0;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        if (fwrite(buf, 1, n, out) != n) rc = zs_err(ZS_EIO, "export: cannot write %s", b);
    fclose(in);
    if (fclose(out) != 0 && rc == 0) rc = zs_err(ZS_EIO, "export: cannot write %s", b);
    return rc;
}

/* Several processes: every rank gathers the master shards of every bucket (a collective, so
 * every process calls the export); process 0 writes the directory. */
static int export_multi(zs_training *t, const char *out_dir);
static int export_write(zs_training *t, const char *out_dir, int writer);

int zs_training_export(zs_training *t, const char *out_dir) {
    if (t->n > t->nl) return export_multi(t, out_dir);
    return export_write(t, out_dir, 1);
}

static int export_multi(zs_training *t, const char *out_dir) {
    size_t max_full = 0;
    for (int b = 0; b < t->nb; b++) max_full = ZS_MAX(max_full, t->shard_elem[b] * (size_t)t->n);
    int rc = 0;
    for (int r = 0; r < t->nl; r++)
        if (!t->r[r].exfull && !(t->r[r].exfull = falloc(max_full))) rc = ZS_ENOMEM;
    /* every process must go through the same gathers: the failure is agreed on first */
    int all = rc;
    if (zs_cluster_min_int(rc, &all) < 0) return ZS_ECANCELLED;
    if (all < 0) return zs_err(ZS_ENOMEM, "export: out of memory on %s process", rc < 0 ? "this" : "another");
    return export_write(t, out_dir, zs_cluster_rank() == 0);
}

/* The bucket's fp32 weights (every rank's master shard) into full. */
static int export_bucket(zs_training *t, int b, float *full, int multi) {
    if (!multi) {
        for (int r = 0; r < t->n; r++)
            memcpy(full + (size_t)r * t->shard_elem[b], t->r[r].master[b], t->shard_elem[b] * sizeof(float));
        return 0;
    }
    t->ex_bucket = b;
    zs_world_run(t->w, export_job, t);
    for (int r = 0; r < t->nl; r++)
        if (t->r[r].rc < 0) return zs_err(t->r[r].rc, "export: %s", t->r[r].err);
    memcpy(full, t->r[0].exfull, t->shard_elem[b] * (size_t)t->n * sizeof(float));
    return 0;
}

/* writer 0 (several processes, not process 0): take part in the gathers only */
static int export_write(zs_training *t, const char *out_dir, int writer) {
    zs_model *m = t->m;
    int multi = t->n > t->nl;
    char tmp[4200], path[4300];
    snprintf(tmp, sizeof tmp, "%s.tmp", out_dir);
    char cmd[8600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", tmp, tmp);
    int mkrc = writer && (strchr(out_dir, '\'') || system(cmd) != 0) ? zs_err(ZS_EIO, "export: cannot create %s", tmp) : 0;
    if (!multi && mkrc < 0) return mkrc;
    ex_tensor *ts = calloc((size_t)t->nb * ZS_MAX_ROLES, sizeof *ts);
    float *full = NULL;
    size_t max_full = 0;
    for (int b = 0; b < t->nb; b++) max_full = ZS_MAX(max_full, t->shard_elem[b] * (size_t)t->n);
    full = falloc(max_full);
    int nt = 0, rc = 0;
    if (!ts || !full) rc = zs_err(ZS_ENOMEM, "out of memory");
    for (int b = 0; b < t->nb && rc == 0; b++) {
        /* the bucket's fp32 weights: every rank's master shard, and rank 0's resident masters */
        if ((rc = export_bucket(t, b, full, multi)) < 0) break;
        if (!writer || mkrc < 0) continue; /* the gathers go on: the others wait in them */
        const zs_bucket_layout *L = zs_model_layout(m, b), *G = zs_model_grad_layout(m, b);
        for (int s = 0; s < L->n_roles && rc == 0; s++) {
            zs_slot_source src;
            if (!L->slot[s].present || zs_model_slot_source(m, b, s, &src) < 0) continue;
            const zs_slot *a = &L->slot[s];
            const float *w = a->resident ? t->r[0].rmaster[b] + G->slot[s].offset / 4 : full + a->offset / t->dsize;
            ex_tensor *x = NULL;
            for (int i = 0; i < nt; i++)
                if (!strcmp(ts[i].name, src.name)) x = &ts[i];
            if (!x) {
                x = &ts[nt++];
                x->name = src.name;
                x->ndim = src.ndim;
                x->shape[0] = src.shape[0];
                x->shape[1] = src.shape[1];
                x->data = falloc((size_t)(src.shape[0] * src.shape[1]));
                if (!x->data) { rc = zs_err(ZS_ENOMEM, "out of memory"); break; }
            }
            int64_t out = a->shape[0], in = a->shape[1];
            if (src.kind == ZS_SRC_COPY) {
                memcpy(x->data, w, (size_t)(out * in) * sizeof(float));
            } else if (src.kind == ZS_SRC_VEC_SLICE) {
                memcpy(x->data + src.col0, w, (size_t)out * sizeof(float));
            } else if (src.kind == ZS_SRC_ROW_SLICE) { /* rows col0.. of a fused [rows, in] tensor */
                memcpy(x->data + src.col0 * in, w, (size_t)(out * in) * sizeof(float));
            } else { /* our [out, in] rows are columns col0.. of an [in, cols] tensor */
                int64_t cols = src.shape[1];
                for (int64_t o = 0; o < out; o++)
                    for (int64_t i = 0; i < in; i++) x->data[i * cols + src.col0 + o] = w[o * in + i];
            }
        }
    }
    if (rc == 0 && mkrc < 0) rc = zs_err(mkrc, "export: cannot create %s", tmp);
    if (!writer || rc < 0) {
        for (int i = 0; ts && i < nt; i++) free(ts[i].data);
        free(ts);
        free(full);
        if (writer && mkrc == 0) {
            snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
            if (system(cmd) != 0) zs_log_warn("export: could not remove %s", tmp);
        }
        return rc;
    }
    zs_st_decl *d = calloc((size_t)nt + 1, sizeof *d);
    if (rc == 0 && !d) rc = zs_err(ZS_ENOMEM, "out of memory");
    for (int i = 0; rc == 0 && i < nt; i++) {
        d[i].name = ts[i].name;
        d[i].dtype = t->wdt;
        d[i].ndim = ts[i].ndim;
        d[i].shape[0] = ts[i].shape[0];
        d[i].shape[1] = ts[i].shape[1];
    }
    zs_st_writer *wr = NULL;
    snprintf(path, sizeof path, "%s/model.safetensors", tmp);
    if (rc == 0) rc = zs_st_writer_open(path, d, (size_t)nt, "{\"format\":\"pt\",\"zeroserve\":\"fine-tuned\"}", &wr);
    for (int i = 0; rc == 0 && i < nt; i++) {
        size_t n = (size_t)(ts[i].shape[0] * ts[i].shape[1]);
        if (t->wdt == ZS_F32) {
            rc = zs_st_writer_write(wr, ts[i].data, n * 4);
        } else {
            void *c = malloc(n * 2);
            if (!c) { rc = zs_err(ZS_ENOMEM, "out of memory"); break; }
            zs_convert(c, t->wdt, ts[i].data, ZS_F32, n);
            rc = zs_st_writer_write(wr, c, n * 2);
            free(c);
        }
    }
    if (wr) {
        if (rc == 0) rc = zs_st_writer_close(wr);
        else zs_st_writer_abort(wr);
    }
    const char *dir = zs_model_dir(m);
    if (rc == 0) rc = copy_file(dir, tmp, "config.json", 1);
    if (rc == 0) rc = copy_file(dir, tmp, "tokenizer.json", 1);
    if (rc == 0) rc = copy_file(dir, tmp, "tokenizer_config.json", 0);
    if (rc == 0) rc = copy_file(dir, tmp, "generation_config.json", 0);
    if (rc == 0) rc = copy_file(dir, tmp, "special_tokens_map.json", 0);
    if (rc == 0) {
        snprintf(cmd, sizeof cmd, "rm -rf '%s' && mv '%s' '%s'", out_dir, tmp, out_dir);
        if (system(cmd) != 0) rc = zs_err(ZS_EIO, "export: cannot move %s to %s", tmp, out_dir);
    } else {
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
        if (system(cmd) != 0) zs_log_warn("export: could not remove %s", tmp);
    }
    for (int i = 0; ts && i < nt; i++) free(ts[i].data);
    free(ts);
    free(d);
    free(full);
    return rc;
}

/* ---- checkpoints ---- */

/* Checkpoint buckets: 0..nb-1 are the sharded data areas (storage-element order, the ranks'
 * master shards), nb..2nb-1 the resident areas (replicated: rank 0's copy). */
static int ckpt_get(void *ud, int rank, int bucket, const float **master, const float **m, const float **v,
                    size_t *n) {
    zs_training *t = ud;
    const rank_tr *R = &t->r[rank - t->first]; /* the saver asks only for this process's ranks */
    if (bucket < t->nb) {
        size_t start = (size_t)rank * t->shard_elem[bucket];
        size_t len = start >= t->n_elem[bucket] ? 0 : ZS_MIN(t->shard_elem[bucket], t->n_elem[bucket] - start);
        *master = R->master[bucket];
        *m = R->mom[bucket];
        *v = R->var[bucket];
        *n = len;
    } else {
        int b = bucket - t->nb;
        *master = t->r[0].rmaster[b];
        *m = t->r[0].rmom[b];
        *v = t->r[0].rvar[b];
        *n = t->res_elem[b];
    }
    return 0;
}

static void ckpt_layout(zs_training *t, size_t *elems, size_t *shards, unsigned char *repl, zs_ckpt_layout *L) {
    for (int b = 0; b < t->nb; b++) {
        elems[b] = t->n_elem[b];
        shards[b] = ZS_MAX(t->shard_elem[b], (size_t)1);
        repl[b] = 0;
        elems[t->nb + b] = t->res_elem[b];
        shards[t->nb + b] = ZS_MAX(t->res_elem[b], (size_t)1);
        repl[t->nb + b] = 1;
    }
    *L = (zs_ckpt_layout){2 * t->nb, elems, shards, repl, t->n};
}

/* The key of the caller's meta JSON under which a checkpoint keeps the optimizer steps each
 * bucket was skipped (experts that no token used: their own AdamW step counts lag the global one);
 * taken out again by zs_training_load. */
#define SKIPS_KEY "zs_optimizer_skipped_steps"

/* *out: meta_json with SKIPS_KEY {"bucket": count} for the buckets ever skipped (the same on every
 * rank), a new string. */
static int meta_with_skips(const zs_training *t, const char *meta_json, char **out) {
    json_error_t je;
    json_t *m = meta_json ? json_loads(meta_json, 0, &je) : json_object();
    *out = NULL;
    if (!m || !json_is_object(m)) {
        json_decref(m);
        return zs_err(ZS_EINVAL, "checkpoint: the meta data is not a JSON object");
    }
    json_t *sk = json_object();
    for (int b = 0; sk && b < t->nb; b++)
        if (t->r[0].bskip[b] > 0) {
            char key[16];
            snprintf(key, sizeof key, "%d", b);
            json_object_set_new(sk, key, json_integer((json_int_t)t->r[0].bskip[b]));
        }
    if (sk && json_object_size(sk) > 0) json_object_set_new(m, SKIPS_KEY, sk);
    else json_decref(sk);
    *out = json_dumps(m, JSON_COMPACT);
    json_decref(m);
    return *out ? 0 : zs_err(ZS_ENOMEM, "out of memory");
}

/* Restores the skipped-step counts from a checkpoint's meta and gives back the meta without them
 * (*rest: a new string). */
static int meta_take_skips(zs_training *t, const char *path, const char *meta, char **rest) {
    json_error_t je;
    json_t *m = json_loads(meta, 0, &je);
    if (!m || !json_is_object(m)) {
        json_decref(m);
        return zs_err(ZS_EFORMAT, "%s: the checkpoint's meta data is not a JSON object", path);
    }
    for (int r = 0; r < t->nl; r++) memset(t->r[r].bskip, 0, (size_t)t->nb * sizeof(long));
    json_t *sk = json_object_get(m, SKIPS_KEY);
    if (sk) {
        const char *key;
        json_t *v;
        json_object_foreach(sk, key, v) {
            char *end;
            long b = strtol(key, &end, 10);
            if (!json_is_object(sk) || *end || b < 0 || b >= t->nb || !json_is_integer(v) || json_integer_value(v) < 0) {
                json_decref(m);
                return zs_err(ZS_EFORMAT, "%s: %s: '%s' is not a bucket of this model with a step count", path, SKIPS_KEY,
                              key);
            }
            for (int r = 0; r < t->nl; r++) t->r[r].bskip[b] = (long)json_integer_value(v);
        }
        json_object_del(m, SKIPS_KEY);
    }
    *rest = json_dumps(m, JSON_COMPACT);
    json_decref(m);
    return *rest ? 0 : zs_err(ZS_ENOMEM, "out of memory");
}

int zs_training_save(zs_training *t, const char *dir, long step, const char *meta_json, int keep) {
    char *meta;
    ZS_CHECK(meta_with_skips(t, meta_json, &meta));
    size_t *elems = calloc((size_t)t->nb * 4, sizeof(size_t));
    unsigned char *repl = calloc((size_t)t->nb * 2, 1);
    if (!elems || !repl) {
        free(elems);
        free(repl);
        free(meta);
        return zs_err(ZS_ENOMEM, "out of memory");
    }
    zs_ckpt_layout L;
    ckpt_layout(t, elems, elems + 2 * t->nb, repl, &L);
    zs_ckpt_save_opts so = {zs_model_dir(t->m), zs_model_fingerprint(t->m), meta, keep, t->first,
                            t->n > t->nl ? t->nl : 0};
    int rc = zs_ckpt_save(dir, step, &L, ckpt_get, t, &so);
    free(elems);
    free(repl);
    free(meta);
    return rc;
}

int zs_training_load(zs_training *t, const char *dir, long *step, char **meta_json) {
    zs_ckpt *c;
    ZS_CHECK(zs_ckpt_open(dir, &c));
    int rc = 0;
    if (zs_ckpt_n_buckets(c) != 2 * t->nb)
        rc = zs_err(ZS_EFORMAT, "%s: the checkpoint has %d buckets, this model %d", zs_ckpt_path(c),
                    zs_ckpt_n_buckets(c) / 2, t->nb);
    for (int b = 0; b < t->nb && rc == 0; b++)
        if (zs_ckpt_bucket_elems(c, b) != t->n_elem[b] || zs_ckpt_bucket_elems(c, t->nb + b) != t->res_elem[b])
            rc = zs_err(ZS_EFORMAT, "%s: bucket %d has another size than this model's (a different model or dtype?)",
                        zs_ckpt_path(c), b);
    /* each rank reads its own slice of the new partition, whatever the saved one was; with
     * replicated parameters (stages 1, 2) every partition also goes into every local rank's
     * whole copy, including the partitions of other processes' ranks */
    float *scratch = NULL;
    if (t->stage < 3) {
        size_t mx = 0;
        for (int b = 0; b < t->nb; b++) mx = ZS_MAX(mx, t->shard_elem[b]);
        if (!(scratch = falloc(mx * 3))) rc = zs_err(ZS_ENOMEM, "out of memory");
    }
    for (int g = 0; g < t->n && rc == 0; g++) {
        int r = g - t->first;
        int mine = r >= 0 && r < t->nl;
        if (!mine && t->stage == 3) continue;
        for (int b = 0; b < t->nb && rc == 0; b++) {
            size_t se = t->shard_elem[b];
            size_t start = (size_t)g * se;
            size_t len = start >= t->n_elem[b] ? 0 : ZS_MIN(se, t->n_elem[b] - start);
            float *ms = mine ? t->r[r].master[b] : scratch, *mm = mine ? t->r[r].mom[b] : scratch + se,
                  *mv = mine ? t->r[r].var[b] : scratch + 2 * se;
            memset(ms, 0, se * sizeof(float));
            memset(mm, 0, se * sizeof(float));
            memset(mv, 0, se * sizeof(float));
            if (len) rc = zs_ckpt_read(c, b, start, len, ms, mm, mv);
            if (rc == 0 && se) {
                if (t->stage < 3) { /* replicated: this partition goes into every local whole copy */
                    for (int r2 = 0; r2 < t->nl; r2++)
                        zs_convert((char *)zs_gather_shard_buffer(zs_world_gather(t->w, r2), b) + start * t->dsize,
                                   t->wdt, ms, ZS_F32, se);
                } else {
                    rank_tr *R = &t->r[r];
                    zs_gather *gt = zs_world_gather(t->w, r);
                    /* an expert through zs_gather_write_shard: its cached full copy is stale */
                    void *out = zs_bucket_is_expert(t->m, b, NULL, NULL) ? NULL : zs_gather_shard_buffer(gt, b);
                    zs_convert(out ? out : R->wbuf, t->wdt, ms, ZS_F32, se);
                    if (!out) rc = zs_gather_write_shard(gt, b, R->wbuf);
                }
            }
            /* the resident tensors: every process's first rank (each process has its copy) */
            if (rc == 0 && r == 0 && t->res_elem[b]) {
                rank_tr *R = &t->r[0];
                rc = zs_ckpt_read(c, t->nb + b, 0, t->res_elem[b], R->rmaster[b], R->rmom[b], R->rvar[b]);
                const zs_bucket_layout *Ly = zs_model_layout(t->m, b), *G = zs_model_grad_layout(t->m, b);
                char *res = zs_model_bucket_resident_mut(t->m, b);
                for (int s = 0; rc == 0 && s < Ly->n_roles; s++)
                    if (Ly->slot[s].present && Ly->slot[s].resident)
                        zs_convert(res + Ly->slot[s].offset, Ly->slot[s].dtype, R->rmaster[b] + G->slot[s].offset / 4,
                                   ZS_F32, (size_t)(Ly->slot[s].shape[0] * Ly->slot[s].shape[1]));
            }
        }
    }
    free(scratch);
    if (rc == 0) {
        *step = zs_ckpt_step(c);
        /* the steps each expert was skipped (its own AdamW count), kept in the meta by the save */
        char *rest = NULL;
        rc = meta_take_skips(t, zs_ckpt_path(c), zs_ckpt_meta(c), &rest);
        if (rc == 0 && meta_json) *meta_json = rest;
        else free(rest);
    }
    zs_ckpt_close(c);
    return rc;
}

void zs_training_memory(const zs_training *t, zs_train_memory *out) {
    memset(out, 0, sizeof *out);
    for (int b = 0; b < t->nb; b++) {
        size_t se = t->shard_elem[b];
        out->params += se * t->dsize * (t->stage < 3 ? (size_t)t->n : 1); /* a shard, or the whole bucket */
        out->grads += se * sizeof(float) * (t->stage == 1 ? (size_t)t->n : 1);
        out->optimizer += 3 * se * sizeof(float);                       /* master, m, v */
    }
}
