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
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "backward.h"
#include "ckpt.h"
#include "export.h"
#ifdef ZS_CUDA
#include "gather-cuda.h"
#endif
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
    void *wire;                              /* 16-bit precisions: a gradient as it goes on the wire */
    zs_optstate *os;                         /* the masters and moments (cpu: master/mom/var point into it) */
    int nv;                                  /* the optimizer state is in an NVMe file (read / write ranges) */
    unsigned char *oskip;                    /* per bucket: not updated by this step (experts without a gradient) */
    int skip;                                /* this step's gradients overflowed (agreed): nothing updated */
    float gnorm;                             /* this step's global gradient norm (unscaled) */
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
    int cuda;              /* the world's ranks are CUDA devices */
    int prec;              /* zs_precision */
    zs_dtype gdt;          /* the gradients' dtype on the wire: f32, or the 16-bit precision's */
    zs_loss_scaler sc;     /* fp16 loss scaling (a static 1 otherwise) */
    double cur_scale;      /* the scale of the step being run */
    zs_train_grad_hook hook;
    void *hook_ud;
    long kill_step;        /* tests: ZS_TEST_KILL_IN_OPTIMIZER=N kills the process (SIGKILL) in step N's
                              optimizer, after the first bucket's update was written back */
    long inf_step;         /* tests: ZS_TEST_GRAD_INF="N:R" writes an inf into world rank R's gradient */
    int inf_rank;          /*   at its first attempt of step N (a CLI / mpirun forced overflow) */
    int inf_done;
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

/* One reduction of n f32 values in buf in the wire dtype: an all-reduce into buf (scatter 0), or a
 * reduce-scatter of this rank's part (n / ranks values) into out. 16-bit precisions cast buf to
 * bf16 / fp16 (round to nearest even) first and widen the reduced values back to f32: the comm
 * sums in f32 in rank order and rounds once, so what arrives is the 16-bit sum. */
static int wire_reduce(zs_training *t, rank_tr *R, zs_comm *c, float *buf, size_t n, float *out, int scatter) {
    size_t part = n / (size_t)t->n;
    if (t->gdt == ZS_F32)
        return scatter ? zs_comm_reduce_scatter(c, buf, out, part, ZS_F32, ZS_RED_SUM, NULL)
                       : zs_comm_all_reduce(c, buf, buf, n, ZS_F32, ZS_RED_SUM, NULL);
    uint16_t *w = R->wire, *wr = w + n;
    zs_convert(w, t->gdt, buf, ZS_F32, n);
    int rc = scatter ? zs_comm_reduce_scatter(c, w, wr, part, t->gdt, ZS_RED_SUM, NULL)
                     : zs_comm_all_reduce(c, w, w, n, t->gdt, ZS_RED_SUM, NULL);
    if (rc == 0) zs_to_f32(scatter ? out : buf, scatter ? wr : w, t->gdt, scatter ? part : n);
    return rc;
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
        rc = wire_reduce(t, R, c, R->gfull, full, NULL, 0);
        if (rc == 0)
            for (size_t i = 0; i < full; i++) R->gacc[b][i] += R->gfull[i];
    } else if (t->shard_elem[b] > 0) {
        to_storage_order(t, b, gdata, R->gfull, scale);
        rc = wire_reduce(t, R, c, R->gfull, t->shard_elem[b] * (size_t)t->n, R->gshard, 1);
        if (rc == 0)
            for (size_t i = 0; i < t->shard_elem[b]; i++) R->gacc[b][i] += R->gshard[i];
    }
    if (rc == 0 && t->res_elem[b] > 0) {
        for (size_t i = 0; i < t->res_elem[b]; i++) gres[i] *= scale;
        rc = wire_reduce(t, R, c, gres, t->res_elem[b], NULL, 0);
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

/* A CUDA world: the failure of a gather's device ordering (ready / retire hooks) that acquire and
 * release could not return (gather-cuda.h); 0 on the CPU. */
static int dev_err(const zs_training *t) {
#ifdef ZS_CUDA
    if (t->cuda) return zs_dev_gather_take_error();
#else
    (void)t;
#endif
    return 0;
}

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
    if ((rc = src.acquire(src.ctx, eb, &d)) == 0 && (rc = dev_err(t)) == 0)
        rc = zs_train_embed_fwd(R->tr, d, zs_model_bucket_resident(m, eb), tok);
    FAIL(rc);
    src.release(src.ctx, eb);
    FAIL(dev_err(t));
    for (int l = 0; l < L; l++) {
        int b = zs_bucket_layer(l);
        FAIL(src.acquire(src.ctx, b, &d));
        FAIL(dev_err(t));
        if (!failed) FAIL(zs_train_layer_fwd(R->tr, l, d, zs_model_bucket_resident(m, b)));
        if (failed) FAIL(zs_trainer_experts_sync(R->tr, l, 0));
        src.release(src.ctx, b);
        FAIL(dev_err(t));
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
    FAIL(dev_err(t));
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
            FAIL(dev_err(t));
            if (!failed) FAIL(zs_train_layer_bwd(R->tr, l, d, zs_model_bucket_resident(m, b), R->gl_data, R->gl_res));
            if (failed) (void)zs_trainer_experts_sync(R->tr, l, 1);
            src.release(src.ctx, b);
            FAIL(dev_err(t));
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

/* The update of one sub-group of bucket b's partition on one rank (zs_optstate_step's callback):
 * AdamW on [off, off + n) with the unscaled, clipped gradient, the result in the storage dtype
 * straight into the shard buffer or into the scratch shard; after the bucket's last sub-group the
 * scratch shard goes out (all-gathered into every rank's whole copy with replicated parameters,
 * written back through the coordinator otherwise). */
typedef struct { zs_training *t; int rank; float f; } optim_ctx;

static int optim_sub(void *ud, int b, size_t off, size_t n, float *master, float *mom, float *var, int last) {
    optim_ctx *o = ud;
    zs_training *t = o->t;
    if (t->kill_step == t->step && b > zs_bucket_embed() && o->rank == 0) raise(SIGKILL);
    rank_tr *R = &t->r[o->rank];
    zs_gather *g = zs_world_gather(t->w, o->rank);
    long bt = t->step - R->bskip[b]; /* this bucket's own AdamW step (bias correction) */
    float *gs = grad_slice(t, o->rank, b) + off;
    if (o->f != 1.0f) zs_scale(gs, n, o->f);
    /* replicated parameters: the partition, then all-gathered; an expert, a CUDA world or the
     * nvme tier: the scratch shard, then zs_gather_write_shard (an expert's cached full copy is
     * stale; a device shard is uploaded); otherwise straight into the shard buffer */
    void *direct = t->stage < 3 || t->cuda || zs_bucket_is_expert(t->m, b, NULL, NULL) ? NULL : zs_gather_shard_buffer(g, b);
    char *out = direct ? (char *)direct : (char *)R->wbuf;
    int rc = zs_adamw_update(master, mom, var, gs, n, &t->o.adam, t->lr, bt, 1, out + off * t->dsize, t->wdt);
    if (rc == 0 && last && t->stage < 3)
        rc = zs_comm_all_gather(zs_world_grad_comm(t->w, o->rank), R->wbuf, zs_gather_shard_buffer(g, b),
                                t->shard_elem[b] * t->dsize, NULL);
    else if (rc == 0 && last && !direct)
        rc = zs_gather_write_shard(g, b, R->wbuf);
    if (last) memset(R->gacc[b], 0, t->shard_elem[b] * (t->stage == 1 ? (size_t)t->n : 1) * sizeof(float));
    return rc;
}

static void optim_job(void *ud, int rank) {
    zs_training *t = ud;
    rank_tr *R = &t->r[rank];
    zs_comm *c = zs_world_grad_comm(t->w, rank);
    int me = t->first + rank;
    R->skip = 0;
    R->gnorm = NAN;
    if (t->inf_step == t->step && t->inf_rank == me && !t->inf_done) { /* tests: a forced overflow */
        for (int b = 0; b < t->nb; b++)
            if (t->shard_elem[b]) {
                grad_slice(t, rank, b)[0] = INFINITY;
                break;
            }
        t->inf_done = 1;
    }
    if (t->hook)
        for (int b = 0; b < t->nb; b++) {
            if (t->shard_elem[b]) t->hook(t->hook_ud, me, b, grad_slice(t, rank, b), t->shard_elem[b], 0, t->step);
            if (t->res_elem[b]) t->hook(t->hook_ud, me, b, R->racc[b], t->res_elem[b], 1, t->step);
        }
    /* the global norm of the (still scaled) gradient, and whether any element of any rank's
     * partitions is inf or NaN: every rank checks its own, the flag is agreed with MAX */
    double ss = 0;
    int bad = 0;
    for (int b = 0; b < t->nb; b++) {
        double sb = zs_sumsq(grad_slice(t, rank, b), t->shard_elem[b]);
        double sr = t->res_elem[b] ? zs_sumsq(R->racc[b], t->res_elem[b]) : 0.0;
        bad |= !isfinite(sb) || !isfinite(sr);
        ss += sb;
        if (me == 0) ss += sr; /* replicated: count once */
    }
    float part = (float)ss, total = 0, flag = bad ? 1.0f : 0.0f, any = 0;
    int rc = zs_comm_all_reduce(c, &flag, &any, 1, ZS_F32, ZS_RED_MAX, NULL);
    if (rc == 0) rc = zs_comm_all_reduce(c, &part, &total, 1, ZS_F32, ZS_RED_SUM, NULL);
    if (rc < 0) {
        R->rc = rc;
        snprintf(R->err, sizeof R->err, "%s", zs_errmsg());
        return;
    }
    if (any > 0 || !isfinite(total)) {
        /* an overflow somewhere: every rank skips the step; the gradients are dropped */
        R->skip = 1;
        for (int b = 0; b < t->nb; b++) {
            memset(R->gacc[b], 0, t->shard_elem[b] * (t->stage == 1 ? (size_t)t->n : 1) * sizeof(float));
            memset(R->racc[b], 0, t->res_elem[b] * sizeof(float));
        }
        R->rc = 0;
        return;
    }
    /* unscale and clip in one factor (DeepSpeed's unscale_and_clip_grads): the norm of the
     * unscaled gradient is sqrt(total) / S */
    double S = t->cur_scale;
    float coef = t->o.grad_clip > 0 ? zs_clip_coef(S == 1.0 ? (double)total : (double)total / (S * S), t->o.grad_clip) : 1.0f;
    R->gnorm = (float)(sqrt((double)total) / S);
    optim_ctx oc = {t, rank, S == 1.0 ? coef : (float)((double)coef / S)};
    /* an expert that received no token in the whole step has no gradient: not updated (OLMoE:
     * every expert has one, zero where unused: see the top of the file) */
    for (int b = 0; b < t->nb; b++) {
        R->oskip[b] = zs_bucket_is_expert(t->m, b, NULL, NULL) && !R->ehad[b] &&
                      zs_model_config_get(t->m)->family != ZS_FAM_OLMOE;
        if (R->oskip[b]) R->bskip[b]++; /* torch's per-parameter step count does not advance either */
    }
    rc = zs_optstate_step(R->os, R->oskip, optim_sub, &oc);
    for (int b = 0; b < t->nb && rc == 0; b++) {
        if (R->oskip[b] || t->res_elem[b] == 0) continue;
        long bt = t->step - R->bskip[b];
        if (rank == 0) { /* every process updates its own copy of the resident tensors */
            if (oc.f != 1.0f) zs_scale(R->racc[b], t->res_elem[b], oc.f);
            rc = zs_adamw_update(R->rmaster[b], R->rmom[b], R->rvar[b], R->racc[b], t->res_elem[b], &t->o.adam, t->lr,
                                 bt, 1, NULL, ZS_F32);
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
    const float *ms = R->master[b] ? R->master[b] : R->gshard; /* (an empty shard has no array) */
    R->rc = 0;
    if (R->nv && t->shard_elem[b]) { /* nvme: read out of the optimizer file into the gradient scratch */
        R->rc = zs_optstate_read(R->os, b, 0, t->shard_elem[b], R->gshard, NULL, NULL);
        ms = R->gshard;
        /* every rank takes part in the gather, a failed read with zeros (the status follows) */
        if (R->rc < 0) memset(R->gshard, 0, t->shard_elem[b] * sizeof(float));
    }
    int rc = zs_comm_all_gather(zs_world_grad_comm(t->w, rank), ms, R->exfull, t->shard_elem[b] * sizeof(float), NULL);
    if (R->rc == 0) R->rc = rc;
    if (R->rc < 0) snprintf(R->err, sizeof R->err, "%s", zs_errmsg());
}

static void spec_job(void *ud, int rank) {
    zs_training *t = ud;
    zs_gather_set_speculation(zs_world_gather(t->w, rank), t->eval);
}

/* Before shards are written outside a step (a load): the inference pass speculated before
 * training began is consumed, else the first step would adopt buckets gathered from the old
 * weights (and an nvme write would race its reads). A step's own pass adopts it otherwise. */
static void settle_job(void *ud, int rank) {
    zs_training *t = ud;
    zs_gather_settle(zs_world_gather(t->w, rank));
}

/* ---- set-up ---- */

static float *falloc(size_t n) {
    float *p = zs_aligned_alloc(64, (n + 16) * sizeof(float));
    if (p) memset(p, 0, (n + 16) * sizeof(float));
    return p;
}

/* "f32", "f16", "bf16" (the spelling of --weight-dtype) */
static const char *dtype_lc(zs_dtype d) { return d == ZS_F32 ? "f32" : d == ZS_F16 ? "f16" : d == ZS_BF16 ? "bf16" : zs_dtype_name(d); }

const char *zs_precision_name(int p) {
    static const char *const n[] = {"default", "fp32", "bf16", "fp16"};
    return p >= 0 && p <= ZS_PREC_FP16 ? n[p] : "invalid";
}

int zs_precision_parse(const char *s, int *out) {
    if (!s) return zs_err(ZS_EINVAL, "precision: none given");
    if (!strcmp(s, "fp32") || !strcmp(s, "f32")) *out = ZS_PREC_FP32;
    else if (!strcmp(s, "bf16")) *out = ZS_PREC_BF16;
    else if (!strcmp(s, "fp16") || !strcmp(s, "f16")) *out = ZS_PREC_FP16;
    else return zs_err(ZS_EINVAL, "precision: '%s' is not one of fp32, bf16, fp16", s);
    return 0;
}

int zs_training_begin(zs_world *w, const zs_train_opts *o, zs_training **out) {
    if (zs_world_is_cuda(w) && zs_world_replicated(w))
        return zs_err(ZS_EUNSUPPORTED, "training on a GPU runs ZeRO stage 3 (sharded parameters); stages 1 and 2 train "
                                       "on the CPU device (--device cpu)");
    if (o->precision < ZS_PREC_DEFAULT || o->precision > ZS_PREC_FP16)
        return zs_err(ZS_EINVAL, "training: precision %d is not one of default, fp32, bf16, fp16", o->precision);
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
    t->cuda = zs_world_is_cuda(w);
    t->prec = o->precision;
    static const zs_dtype want[] = {ZS_DTYPE_COUNT, ZS_F32, ZS_BF16, ZS_F16};
    if (t->prec != ZS_PREC_DEFAULT && t->wdt != want[t->prec]) {
        zs_dtype have = t->wdt;
        free(t);
        return zs_err(ZS_EINVAL, "training: precision %s needs the weights stored in %s, the engine stores %s (open it "
                                 "with --weight-dtype %s, or let --precision choose it)",
                      zs_precision_name(o->precision), dtype_lc(want[o->precision]), dtype_lc(have),
                      dtype_lc(want[o->precision]));
    }
    t->gdt = t->prec == ZS_PREC_BF16 ? ZS_BF16 : t->prec == ZS_PREC_FP16 ? ZS_F16 : ZS_F32;
    if (t->prec == ZS_PREC_FP16) {
        t->sc = o->scaler;
        if (!(t->sc.scale > 0)) zs_loss_scaler_init(&t->sc, 1, NULL); /* a zeroed scaler: DeepSpeed's defaults */
    } else {
        zs_loss_scaler_init(&t->sc, 0, NULL);
    }
    t->cur_scale = t->sc.scale;
    const char *ks = getenv("ZS_TEST_KILL_IN_OPTIMIZER");
    t->kill_step = ks && *ks ? atol(ks) : -1;
    const char *gi = getenv("ZS_TEST_GRAD_INF");
    t->inf_step = -1;
    if (gi && *gi && sscanf(gi, "%ld:%d", &t->inf_step, &t->inf_rank) != 2) t->inf_step = -1;
    if (o->optimizer.device == ZS_OFFLOAD_NVME && (!o->optimizer.dir || !o->optimizer.dir[0])) {
        free(t);
        return zs_err(ZS_EINVAL, "training: offload_optimizer.device nvme needs offload_optimizer.nvme_path");
    }
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
        rc = t->cuda ? zs_trainer_new_device(m, o->micro_batch, o->seq_len, zs_world_dev(w, r), &R->tr)
                     : zs_trainer_new(m, o->micro_batch, o->seq_len, &R->tr);
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
        R->oskip = calloc((size_t)t->nb, 1);
        /* 16-bit gradients: a full bucket (or resident area) and its reduced part, as they go on the wire */
        if (t->gdt != ZS_F32) R->wire = falloc(ZS_MAX(max_full, max_res) + max_full / 2 + 16);
        int ok = R->gl_data && R->gl_res && R->gh_data && R->gh_res && R->ge_data && R->ge_res && R->gfull &&
                 R->gshard && R->wbuf && R->stat && R->oskip && (t->gdt == ZS_F32 || R->wire);
        if (ok) {
            /* the masters and moments: host memory, or a file per rank on NVMe */
            zs_optstate_opts so = o->optimizer;
            so.rank = t->first + r;
            if (so.device != ZS_OFFLOAD_NVME) so.device = ZS_OFFLOAD_CPU;
            if ((rc = zs_optstate_open(&so, t->nb, t->shard_elem, &R->os)) < 0) break;
            R->nv = so.device == ZS_OFFLOAD_NVME;
        }
        for (int b = 0; ok && b < t->nb; b++) {
            size_t se = t->shard_elem[b], re = t->res_elem[b];
            if (!R->nv) zs_optstate_arrays(R->os, b, &R->master[b], &R->mom[b], &R->var[b]);
            R->gacc[b] = falloc(t->stage == 1 ? se * (size_t)t->n : se);
            R->racc[b] = falloc(re);
            ok = (R->nv || se == 0 || (R->master[b] && R->mom[b] && R->var[b])) && R->gacc[b] && R->racc[b];
            if (ok && r == 0) {
                R->rmaster[b] = falloc(re); R->rmom[b] = falloc(re); R->rvar[b] = falloc(re);
                ok = R->rmaster[b] && R->rmom[b] && R->rvar[b];
            }
            if (!ok) break;
            /* fp32 masters from the storage shard (nvme: read from the shard file, verified) and
             * the resident tensors */
            zs_gather *g = zs_world_gather(w, r);
            /* (a CUDA world's tier-none shard is device memory: downloaded by read_shard) */
            const void *shard = t->cuda ? NULL : zs_gather_shard_buffer(g, b);
            if (se > 0 && !shard) {
                if ((rc = zs_gather_read_shard(g, b, R->wbuf)) < 0) break;
                shard = R->wbuf;
            }
            if (se > 0 && t->stage < 3) shard = (const char *)shard + (size_t)(t->first + r) * se * t->dsize; /* its partition */
            if (se > 0 && !R->nv) zs_to_f32(R->master[b], shard, t->wdt, se);
            if (se > 0 && R->nv) { /* nvme: through the gradient scratch into the rank's optimizer file */
                zs_to_f32(R->gshard, shard, t->wdt, se);
                if ((rc = zs_optstate_write(R->os, b, 0, se, R->gshard, NULL, NULL)) < 0) break;
            }
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

int zs_training_step_ex(zs_training *t, const int32_t *const *tokens, const int32_t *const *targets, long step,
                        zs_train_step_info *info) {
    if (step < 1) return zs_err(ZS_EINVAL, "training: steps are numbered from 1");
    t->eval = 0;
    float l;
    /* the loss scale goes into the backward (the gradient of the loss times S) */
    t->cur_scale = t->sc.scale;
    for (int r = 0; r < t->nl; r++) ZS_CHECK(zs_trainer_set_loss_scale(t->r[r].tr, (float)t->cur_scale));
    ZS_CHECK(run_micro(t, tokens, targets, t->o.grad_accum, &l));
    t->step = step;
    t->lr = zs_lr_at(&t->o.lr, step);
    double t0 = zs_now();
    zs_world_run(t->w, optim_job, t);
    double dt = zs_now() - t0;
    for (int r = 0; r < t->nl; r++)
        if (t->r[r].rc < 0) return zs_err(t->r[r].rc, "%s", t->r[r].err);
    int skipped = t->r[0].skip; /* agreed: the same on every rank */
    int rc = 0;
    if (t->sc.dynamic) {
        rc = zs_loss_scaler_update(&t->sc, skipped);
    } else {
        t->sc.iter++;
        if (skipped) t->sc.skipped++; /* a non-finite gradient without dynamic scaling: skipped all the same */
    }
    if (skipped)
        zs_log_warn("training: step %ld: the gradients overflowed (%s, loss scale %g): step skipped, scale now %g", step,
                    zs_precision_name(t->prec), t->cur_scale, t->sc.scale);
    if (info) {
        info->loss = l;
        info->skipped = skipped;
        info->loss_scale = t->cur_scale;
        info->next_scale = t->sc.scale;
        info->skipped_total = t->sc.skipped;
        info->grad_norm = t->r[0].gnorm;
        info->optim_s = dt;
    }
    return rc;
}

int zs_training_step(zs_training *t, const int32_t *const *tokens, const int32_t *const *targets, long step,
                     float *loss) {
    zs_train_step_info info;
    ZS_CHECK(zs_training_step_ex(t, tokens, targets, step, &info));
    *loss = info.loss;
    return 0;
}

void zs_training_set_grad_hook(zs_training *t, zs_train_grad_hook fn, void *ud) {
    t->hook = fn;
    t->hook_ud = ud;
}

void zs_training_scaler(const zs_training *t, zs_loss_scaler *out) { *out = t->sc; }

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
        for (int b = 0; R->master && b < t->nb; b++) { /* master, mom, var belong to the optimizer state */
            free(R->gacc[b]);
            free(R->rmaster[b]); free(R->rmom[b]); free(R->rvar[b]); free(R->racc[b]);
        }
        zs_optstate_close(R->os);
        free(R->wire); free(R->oskip);
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

/* The bucket's fp32 weights (every rank's master shard) into full: export.h's get(). */
static int export_bucket(zs_training *t, int b, float *full, int multi);

static int export_get(void *ud, int b, float *full) {
    zs_training *t = ud;
    return export_bucket(t, b, full, t->n > t->nl);
}

int zs_training_export(zs_training *t, const char *out_dir) { return zs_training_export_dtype(t, out_dir, ZS_DTYPE_COUNT); }

/* Streamed by engine/train/export.c, one bucket at a time; several processes: every rank gathers
 * the master shards of every bucket (a collective, so every process calls the export) and
 * process 0 writes the directory. */
int zs_training_export_dtype(zs_training *t, const char *out_dir, zs_dtype dt) {
    if (dt != ZS_DTYPE_COUNT && dt != ZS_F32 && dt != ZS_F16 && dt != ZS_BF16)
        return zs_err(ZS_EINVAL, "export: the dtype must be f32, f16 or bf16, not %s", zs_dtype_name(dt));
    int multi = t->n > t->nl;
    size_t max_full = 0;
    for (int b = 0; b < t->nb; b++) max_full = ZS_MAX(max_full, t->shard_elem[b] * (size_t)t->n);
    if (multi) {
        int rc = 0;
        for (int r = 0; r < t->nl; r++)
            if (!t->r[r].exfull && !(t->r[r].exfull = falloc(max_full))) rc = ZS_ENOMEM;
        /* every process must go through the same gathers: the failure is agreed on first */
        int all = rc;
        if (zs_cluster_min_int(rc, &all) < 0) return ZS_ECANCELLED;
        if (all < 0) return zs_err(ZS_ENOMEM, "export: out of memory on %s process", rc < 0 ? "this" : "another");
    }
    zs_export_src src = {t->m, t->nb, max_full, t->dsize, (const float *const *)t->r[0].rmaster, export_get, t,
                         multi ? zs_cluster_rank() == 0 : 1, multi};
    return zs_train_export_write(&src, out_dir, dt);
}

/* The bucket's fp32 weights (every rank's master shard) into full. */
static int export_bucket(zs_training *t, int b, float *full, int multi) {
    if (!multi) {
        for (int r = 0; r < t->n; r++) {
            float *dst = full + (size_t)r * t->shard_elem[b];
            if (t->r[r].nv) ZS_CHECK(zs_optstate_read(t->r[r].os, b, 0, t->shard_elem[b], dst, NULL, NULL));
            else if (t->shard_elem[b]) memcpy(dst, t->r[r].master[b], t->shard_elem[b] * sizeof(float));
        }
        return 0;
    }
    t->ex_bucket = b;
    zs_world_run(t->w, export_job, t);
    for (int r = 0; r < t->nl; r++)
        if (t->r[r].rc < 0) return zs_err(t->r[r].rc, "export: %s", t->r[r].err);
    memcpy(full, t->r[0].exfull, t->shard_elem[b] * (size_t)t->n * sizeof(float));
    return 0;
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

/* The same in chunks (zs_ckpt_save_opts.read), for an optimizer state in an NVMe file: elements
 * [off, off + n) of rank's slice of checkpoint bucket `bucket`, array `which` (0 master, 1 m, 2 v). */
static int ckpt_read(void *ud, int rank, int bucket, int which, size_t off, size_t n, float *dst) {
    zs_training *t = ud;
    rank_tr *R = &t->r[rank - t->first];
    if (bucket < t->nb)
        return zs_optstate_read(R->os, bucket, off, n, which == 0 ? dst : NULL, which == 1 ? dst : NULL,
                                which == 2 ? dst : NULL);
    int b = bucket - t->nb;
    const float *src = which == 0 ? t->r[0].rmaster[b] : which == 1 ? t->r[0].rmom[b] : t->r[0].rvar[b];
    memcpy(dst, src + off, n * sizeof(float));
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
/* elements of optimizer state a resume moves at a time into an NVMe optimizer file */
#define LOAD_CHUNK (1 << 20)
/* and the loss scaler's state */
#define SCALER_KEY "zs_loss_scaler"

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
    /* the dtype the weights were stored in: the buckets' sizes depend on it */
    json_object_set_new(m, ZS_CKPT_WDTYPE_KEY, json_string(dtype_lc(t->wdt)));
    /* the loss scaler's state (fp16), so that a resumed run scales as the uninterrupted one */
    const zs_loss_scaler *sc = &t->sc;
    json_object_set_new(m, SCALER_KEY,
                        json_pack("{s:f,s:I,s:I,s:i,s:I}", "scale", sc->scale, "iter", (json_int_t)sc->iter,
                                  "last_overflow", (json_int_t)sc->last_overflow, "cur_hysteresis",
                                  sc->cur_hysteresis, "skipped", (json_int_t)sc->skipped));
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
    json_object_del(m, ZS_CKPT_WDTYPE_KEY); /* checked by zs_training_load before anything was read */
    json_t *sc = json_object_get(m, SCALER_KEY);
    if (sc) {
        json_t *js = json_object_get(sc, "scale"), *ji = json_object_get(sc, "iter"), *jl = json_object_get(sc, "last_overflow"),
               *jh = json_object_get(sc, "cur_hysteresis"), *jk = json_object_get(sc, "skipped");
        if (!json_is_number(js) || !(json_number_value(js) > 0) || !json_is_integer(ji) || !json_is_integer(jl) ||
            !json_is_integer(jh) || !json_is_integer(jk)) {
            json_decref(m);
            return zs_err(ZS_EFORMAT, "%s: %s: expected {scale > 0, iter, last_overflow, cur_hysteresis, skipped}", path,
                          SCALER_KEY);
        }
        /* fp16 resumes the scale it had; the counts carry over in any precision */
        if (t->prec == ZS_PREC_FP16 && t->sc.dynamic) {
            t->sc.scale = json_number_value(js);
            t->sc.last_overflow = (long)json_integer_value(jl);
            t->sc.cur_hysteresis = (int)json_integer_value(jh);
        }
        t->sc.iter = (long)json_integer_value(ji);
        t->sc.skipped = (long)json_integer_value(jk);
        json_object_del(m, SCALER_KEY);
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
    zs_ckpt_save_opts so = {.model_dir = zs_model_dir(t->m), .model_fingerprint = zs_model_fingerprint(t->m),
                            .meta_json = meta, .keep = keep, .first_rank = t->first,
                            .local_ranks = t->n > t->nl ? t->nl : 0};
    /* an NVMe optimizer state is copied out of its file in chunks (no shard-sized buffer) */
    if (t->r[0].nv) so.read = ckpt_read;
    int rc = zs_ckpt_save(dir, step, &L, t->r[0].nv ? NULL : ckpt_get, t, &so);
    free(elems);
    free(repl);
    free(meta);
    return rc;
}

int zs_training_load(zs_training *t, const char *dir, long *step, char **meta_json) {
    zs_ckpt *c;
    ZS_CHECK(zs_ckpt_open(dir, &c));
    int rc = 0;
    /* the dtype the run stored its weights in first: the bucket sizes depend on it */
    json_t *mj = json_loads(zs_ckpt_meta(c), 0, NULL);
    json_t *wd = json_object_get(mj, ZS_CKPT_WDTYPE_KEY);
    if (wd && (!json_is_string(wd) || strcmp(json_string_value(wd), dtype_lc(t->wdt)) != 0))
        rc = zs_err(ZS_EINVAL, "%s: the checkpoint was trained with %s weights, this engine stores %s (open it with "
                               "--weight-dtype %s, or the --precision of the run)", zs_ckpt_path(c),
                    json_is_string(wd) ? json_string_value(wd) : "?", dtype_lc(t->wdt),
                    json_is_string(wd) ? json_string_value(wd) : "?");
    json_decref(mj);
    if (rc == 0 && zs_ckpt_n_buckets(c) != 2 * t->nb)
        rc = zs_err(ZS_EFORMAT, "%s: the checkpoint has %d buckets, this model %d", zs_ckpt_path(c),
                    zs_ckpt_n_buckets(c) / 2, t->nb);
    for (int b = 0; b < t->nb && rc == 0; b++)
        if (zs_ckpt_bucket_elems(c, b) != t->n_elem[b] || zs_ckpt_bucket_elems(c, t->nb + b) != t->res_elem[b])
            rc = zs_err(ZS_EFORMAT, "%s: bucket %d has another size than this model's (a different model or dtype?)",
                        zs_ckpt_path(c), b);
    /* each rank reads its own slice of the new partition, whatever the saved one was; with
     * replicated parameters (stages 1, 2) every partition also goes into every local rank's
     * whole copy, including the partitions of other processes' ranks */
    if (rc == 0) zs_world_run(t->w, settle_job, t);
    float *scratch = NULL;
    size_t ch = 0; /* nvme: elements per chunk (the scratch holds one of master, m and v) */
    int nvchunk = t->stage == 3 && t->r[0].nv; /* nvme optimizer state: in chunks, through a small scratch */
    if (t->stage < 3 || nvchunk) {
        size_t mx = 0;
        for (int b = 0; b < t->nb; b++) mx = ZS_MAX(mx, t->shard_elem[b]);
        if (nvchunk) ch = mx = ZS_MAX((size_t)1, ZS_MIN(mx, (size_t)LOAD_CHUNK));
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
            if (nvchunk && se) { /* chunk by chunk: into the optimizer file and the storage shard */
                rank_tr *R = &t->r[r];
                memset(R->wbuf, 0, se * t->dsize);
                for (size_t off = 0; off < len && rc == 0; off += ch) {
                    size_t n = ZS_MIN(ch, len - off);
                    rc = zs_ckpt_read(c, b, start + off, n, scratch, scratch + ch, scratch + 2 * ch);
                    if (rc == 0) rc = zs_optstate_write(R->os, b, off, n, scratch, scratch + ch, scratch + 2 * ch);
                    if (rc == 0) zs_convert((char *)R->wbuf + off * t->dsize, t->wdt, scratch, ZS_F32, n);
                }
                if (rc == 0) rc = zs_gather_write_shard(zs_world_gather(t->w, r), b, R->wbuf);
            }
            if (!nvchunk && se) { /* whole shards: straight into the arrays, or through the scratch */
                int direct = mine && !t->r[r].nv;
                float *ms = direct ? t->r[r].master[b] : scratch, *mm = direct ? t->r[r].mom[b] : scratch + se,
                      *mv = direct ? t->r[r].var[b] : scratch + 2 * se;
                memset(ms, 0, se * sizeof(float));
                memset(mm, 0, se * sizeof(float));
                memset(mv, 0, se * sizeof(float));
                if (len) rc = zs_ckpt_read(c, b, start, len, ms, mm, mv);
                if (rc == 0 && se && mine && !direct) rc = zs_optstate_write(t->r[r].os, b, 0, se, ms, mm, mv);
                if (rc == 0 && se) {
                    if (t->stage < 3) { /* replicated: this partition goes into every local whole copy */
                        for (int r2 = 0; r2 < t->nl; r2++)
                            zs_convert((char *)zs_gather_shard_buffer(zs_world_gather(t->w, r2), b) + start * t->dsize,
                                       t->wdt, ms, ZS_F32, se);
                    } else {
                        rank_tr *R = &t->r[r];
                        zs_gather *gt = zs_world_gather(t->w, r);
                        /* an expert through zs_gather_write_shard: its cached full copy is stale */
                        void *out = t->cuda || zs_bucket_is_expert(t->m, b, NULL, NULL) ? NULL : zs_gather_shard_buffer(gt, b);
                        zs_convert(out ? out : R->wbuf, t->wdt, ms, ZS_F32, se);
                        if (!out) rc = zs_gather_write_shard(gt, b, R->wbuf);
                    }
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
    zs_optstate_stats st;
    zs_optstate_stats_get(t->r[0].os, &st);
    out->optimizer_host = st.host_bytes;
    out->optimizer_file = st.file_bytes;
}
