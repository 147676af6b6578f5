/* finetune.c — one fine-tuning run (finetune.h): data validation and loading, the step loop of
 * train.h (full) or lora-train.h (LoRA over the frozen base) with the hooks between steps, every
 * world-driving call through hooks->exec, an optional validation loss, and the export (a model
 * directory, or the adapter in PEFT's format). */
#include "finetune.h"

#include <jansson.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <stdlib.h>
#include <string.h>

#include "backward.h"
#include "ckpt.h"
#include "cluster.h"
#include "common.h"
#include "fileio.h"
#include "data.h"
#include "lora-train.h"
#include "train.h"

void zs_finetune_opts_default(zs_finetune_opts *o) {
    memset(o, 0, sizeof *o);
    o->epochs = 1;
    o->batch = 4;
    o->grad_accum = 1;
    o->schedule = ZS_LR_CONSTANT;
    o->lr = 1e-4f;
    o->clip = 1.0f;
    o->export_dtype = ZS_DTYPE_COUNT;
}

/* Counted targets of one [B*T] batch. */
static size_t counted(const int32_t *g, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += g[i] >= 0;
    return c;
}

/* One world-driving call of the run (a step, an evaluation, a checkpoint save or load, the export),
 * made through hooks->exec when there is one: the training is full (t) or LoRA (lt). */
enum { FT_STEP, FT_EVAL, FT_SAVE, FT_LOAD, FT_EXPORT, FT_EXPORT16 };
typedef struct {
    int op;
    zs_training *t;
    zs_lora_training *lt;
    zs_lora *adapter;
    const int32_t *const *T, *const *G;
    long step, *step_out;
    float *loss;
    const char *dir, *meta, *base_name;
    char **meta_out;
    zs_train_step_info *info;
    zs_dtype dtype;           /* FT_EXPORT / FT_EXPORT16 */
    uint64_t tokens;          /* FT_STEP: the step's counted tokens */
} ft_call;

zs_dtype zs_finetune_16bit_dtype(int precision) { return precision == ZS_PREC_FP16 ? ZS_F16 : ZS_BF16; }

static int lora_export(zs_lora *a, const char *out_dir, const char *base_name) {
    if (zs_cluster_rank() != 0) return 0; /* several processes: process 0 writes (the same adapter) */
    if (strchr(out_dir, '\'')) return zs_err(ZS_EINVAL, "export: a quote in the path %s", out_dir);
    char tmp[4200], cmd[8600];
    snprintf(tmp, sizeof tmp, "%s.tmp", out_dir);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd) != 0) return zs_err(ZS_EIO, "export: cannot remove %s", tmp);
    int rc = zs_lora_save(a, tmp, base_name);
    if (rc == 0) {
        snprintf(cmd, sizeof cmd, "rm -rf '%s' && mv '%s' '%s'", out_dir, tmp, out_dir);
        if (system(cmd) != 0) rc = zs_err(ZS_EIO, "export: cannot move %s to %s", tmp, out_dir);
    } else {
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
        if (system(cmd) != 0) zs_log_warn("export: could not remove %s", tmp);
    }
    return rc;
}

static int ft_do(void *arg) {
    ft_call *c = arg;
    switch (c->op) {
    case FT_STEP:
        if (c->lt) return zs_lora_training_step(c->lt, c->T, c->G, c->step, c->loss);
        ZS_CHECK(zs_training_step_ex(c->t, c->T, c->G, c->step, c->info));
        *c->loss = c->info->loss;
        return 0;
    case FT_EVAL:
        return c->lt ? zs_lora_training_eval(c->lt, c->T, c->G, c->loss) : zs_training_eval(c->t, c->T, c->G, c->loss);
    case FT_SAVE:
        return c->lt ? zs_lora_training_save(c->lt, c->dir, c->step, c->meta, 2, c->base_name)
                     : zs_training_save(c->t, c->dir, c->step, c->meta, 2);
    case FT_LOAD:
        return c->lt ? zs_lora_training_load(c->lt, c->dir, c->step_out, c->meta_out)
                     : zs_training_load(c->t, c->dir, c->step_out, c->meta_out);
    case FT_EXPORT16: /* the 16-bit save into a checkpoint's step directory */
        return zs_training_export_dtype(c->t, c->dir, c->dtype);
    default:
        return c->lt ? lora_export(c->adapter, c->dir, c->base_name) : zs_training_export_dtype(c->t, c->dir, c->dtype);
    }
}

/* A LoRA step's slices as background work (lora-slice.c behind zs_sched_work). */
static int lt_slice(void *ud, double budget_s, int then_more) {
    int more = 0;
    ZS_CHECK(zs_lora_training_slice(ud, budget_s, then_more, &more));
    return more;
}
static const zs_world_rider *lt_ride(void *ud, double budget_s) { return zs_lora_training_rider(ud, budget_s); }
static double lt_ride_end(void *ud, int step_rc) { return zs_lora_training_ride_end(ud, step_rc); }
static int lt_next(void *ud, double budget_s, zs_pass_range *out) { return zs_lora_training_next_range(ud, budget_s, out); }
static uint64_t lt_bytes(void *ud) { return zs_lora_training_pass_bytes(ud); }

static int ft_exec(const zs_finetune_hooks *h, ft_call *c) {
    if (c->lt && h && h->exec_work) {
        if (c->op == FT_STEP) {
            ZS_CHECK(zs_lora_training_step_begin(c->lt, c->T, c->G, c->step));
            zs_sched_work w = {lt_slice, lt_ride, lt_ride_end, lt_next, lt_bytes, 0, c->tokens, c->lt};
            int rc = h->exec_work(h->ud, &w);
            if (rc < 0) {
                zs_lora_training_step_abort(c->lt);
                return rc;
            }
            *c->loss = zs_lora_training_step_loss(c->lt);
            return 0;
        }
        if (c->op == FT_SAVE || c->op == FT_LOAD || c->op == FT_EXPORT) return ft_do(c);
    }
    return h && h->exec ? h->exec(h->ud, ft_do, c) : ft_do(c);
}

/* The loss of the first batch of each rank of the validation set. */
static int valid_loss(const zs_finetune_hooks *h, ft_call *call, const char *path, const zs_tokenizer *tok, const zs_finetune_opts *o,
                      int ranks, int seq_len, int32_t *buf, const int32_t **T, const int32_t **G,
                      float *loss) {
    zs_data_opts dopt = {o->chat_template, 0, 0};
    zs_dataset *d = NULL;
    ZS_CHECK(zs_data_load(path, tok, &dopt, &d));
    zs_data_pos pos = {o->seed, 0, 0};
    size_t bt = (size_t)o->batch * (size_t)seq_len;
    int rc = 0;
    for (int i = 0; i < ranks && rc == 0; i++) {
        T[i] = buf + (size_t)i * 2 * bt;
        G[i] = T[i] + bt;
        int filled;
        rc = zs_data_next_batch(d, &pos, o->batch, seq_len, (int32_t *)T[i], (int32_t *)G[i], &filled);
    }
    if (rc == 0) {
        call->op = FT_EVAL;
        call->T = T;
        call->G = G;
        call->loss = loss;
        rc = ft_exec(h, call);
    }
    zs_data_free(d);
    return rc;
}

int zs_finetune_run(zs_engine *e, const zs_finetune_opts *o, const zs_finetune_hooks *h,
                    zs_finetune_result *res) {
    if (!e || !o || !o->data_path) return zs_err(ZS_EINVAL, "finetune: the training data is required");
    if (o->epochs < 1 || o->steps < 0 || o->batch < 1 || o->grad_accum < 1 || o->seq_len < 0 || o->warmup < 0)
        return zs_err(ZS_EINVAL, "finetune: epochs, batch size and gradient accumulation must be >= 1; steps, "
                                 "sequence length and warm-up >= 0");
    if (!(o->lr > 0) || o->clip < 0 || o->weight_decay < 0)
        return zs_err(ZS_EINVAL, "finetune: the learning rate must be > 0; clipping and weight decay >= 0");
    int n_examples;
    ZS_CHECK(zs_data_validate(o->data_path, 0, &n_examples));
    int vrc = o->valid_path ? zs_data_validate(o->valid_path, 0, &n_examples) : 0;
    if (vrc < 0) return zs_err_prefix(vrc, "validation data");
    zs_finetune_result r;
    memset(&r, 0, sizeof r);
    r.valid_loss = -1;
    r.loss_scale = 1.0;
    zs_dataset *d = NULL;
    zs_training *t = NULL;
    zs_lora_training *lt = NULL;
    zs_lora *adapter = NULL;
    ft_call call;
    memset(&call, 0, sizeof call);
    const char *base_name = o->base_name ? o->base_name : zs_model_dir(zs_engine_model(e));
    int32_t *buf = NULL;
    int rc;
    zs_data_opts dopt = {o->chat_template, 0, 0};
    if ((rc = zs_data_load(o->data_path, zs_engine_tokenizer(e), &dopt, &d)) < 0) goto done;
    int ranks = zs_world_size(zs_engine_world(e)); /* every process builds every rank's batch */
    int ctx = zs_engine_context(e);
    int seq_len = o->seq_len;
    if (seq_len == 0) seq_len = (int)ZS_MIN((size_t)ctx, ZS_MAX((size_t)2, zs_data_max_len(d)));
    if (seq_len > ctx) {
        rc = zs_err(ZS_ERANGE, "finetune: the sequence length %d exceeds the model's context %d", seq_len, ctx);
        goto done;
    }
    long per_epoch = (zs_data_batches_per_epoch(d, o->batch) + (long)ranks * o->grad_accum - 1) /
                     ((long)ranks * o->grad_accum);
    long steps = o->steps ? o->steps : ZS_MAX(1, per_epoch * o->epochs);
    zs_train_opts to;
    memset(&to, 0, sizeof to);
    to.micro_batch = o->batch;
    to.seq_len = seq_len;
    to.grad_accum = o->grad_accum;
    to.grad_clip = o->clip;
    zs_adamw_params_default(&to.adam);
    to.adam.lr = o->lr;
    to.adam.weight_decay = o->weight_decay;
    to.lr.type = o->schedule;
    to.lr.warmup_type = ZS_WARMUP_LINEAR;
    to.lr.lr = o->lr;
    to.lr.warmup_min_ratio = 0.0f;
    to.lr.min_lr_ratio = 0.0f;
    to.lr.warmup_steps = o->warmup;
    to.lr.total_steps = steps;
    if (o->lr_schedule) to.lr = *o->lr_schedule;
    if (o->adam) {
        to.adam.beta1 = o->adam->beta1;
        to.adam.beta2 = o->adam->beta2;
        to.adam.eps = o->adam->eps;
    }
    to.stage = zs_engine_zero_stage(e);
    to.precision = o->precision;
    to.scaler = o->scaler;
    to.optimizer = o->optimizer;
    if (o->lora) {
        /* LoRA: a fresh adapter (PEFT's initialisation; a checkpoint replaces it below) over the
         * frozen base */
        if ((rc = zs_lora_new(zs_engine_model(e), o->lora, &adapter)) < 0) goto done;
        zs_lora_init(adapter, o->seed);
        if ((rc = zs_lora_training_begin(zs_engine_world(e), adapter, &to, o->seed, &lt)) < 0) goto done;
        zs_lora_train_memory lm;
        zs_lora_training_memory(lt, &lm);
        r.mem_params = lm.adapter;
        r.mem_grads = lm.grads;
        r.mem_optimizer = lm.optimizer;
        r.mem_activations = lm.activations;
    } else {
        /* the trainers' scratch: one trainer's bytes (measured before the training allocates) */
        zs_trainer *probe = NULL;
        size_t tb = 0;
        if (zs_trainer_new(zs_engine_model(e), o->batch, seq_len, &probe) == 0) tb = zs_trainer_bytes(probe);
        zs_trainer_free(probe);
        if ((rc = zs_training_begin(zs_engine_world(e), &to, &t)) < 0) goto done;
        zs_train_memory tm;
        zs_training_memory(t, &tm);
        size_t nl = (size_t)zs_world_ranks(zs_engine_world(e));
        r.mem_params = nl * tm.optimizer / 3; /* the fp32 masters; m and v below */
        r.mem_grads = nl * tm.grads;
        r.mem_optimizer = nl * (tm.optimizer - tm.optimizer / 3);
        r.mem_activations = nl * tb;
        r.mem_optimizer_host = nl * tm.optimizer_host;
    }
    call.t = t;
    call.lt = lt;
    call.adapter = adapter;
    call.base_name = base_name;
    int slots = ranks * o->grad_accum;
    size_t bt = (size_t)o->batch * (size_t)seq_len;
    buf = malloc(sizeof(int32_t) * bt * 2 * (size_t)slots);
    const int32_t *T[512], *G[512];
    if (!buf || slots > 512) {
        rc = zs_err(ZS_ENOMEM, "finetune: out of memory (or more than 512 ranks x micro-steps)");
        goto done;
    }
    for (int i = 0; i < slots; i++) {
        T[i] = buf + (size_t)i * 2 * bt;
        G[i] = T[i] + bt;
    }
    if (h && h->on_plan) {
        zs_finetune_plan p = {zs_data_count(d), zs_data_tokens(d), steps, ranks, seq_len};
        h->on_plan(h->ud, &p);
    }
    zs_data_pos pos = {o->seed, 0, 0};
    long s0 = 0;
    /* a checkpoint directory that cannot be made stops the run now, not after the training */
    if (o->ckpt_dir && (rc = zs_mkdir_p(o->ckpt_dir)) < 0) goto done;
    if (o->ckpt_dir && o->resume) {
        int orc;
        if (lt) { /* a LoRA run directory: latest (or a step directory: state.json) */
            struct stat sb;
            char p1[4200], p2[4200];
            snprintf(p1, sizeof p1, "%s/latest", o->ckpt_dir);
            snprintf(p2, sizeof p2, "%s/state.json", o->ckpt_dir);
            orc = stat(p1, &sb) == 0 || stat(p2, &sb) == 0 ? 0 : ZS_ENOTFOUND;
        } else {
            zs_ckpt *probe;
            orc = zs_ckpt_open(o->ckpt_dir, &probe); /* an empty directory: a fresh start */
            if (orc == 0) zs_ckpt_close(probe);
        }
        if (orc != 0 && orc != ZS_ENOTFOUND) {
            rc = orc;
            goto done;
        }
        if (orc == 0) {
            char *meta = NULL;
            call.op = FT_LOAD;
            call.dir = o->ckpt_dir;
            call.step_out = &s0;
            call.meta_out = &meta;
            if ((rc = ft_exec(h, &call)) < 0) goto done;
            json_t *j = meta ? json_loads(meta, 0, NULL) : NULL;
            json_t *dp = json_object_get(j, "data");
            if (!json_is_object(dp)) {
                json_decref(j);
                free(meta);
                rc = zs_err(ZS_EFORMAT, "%s: the checkpoint has no data position", o->ckpt_dir);
                goto done;
            }
            pos.epoch = (int)json_integer_value(json_object_get(dp, "epoch"));
            pos.index = (long)json_integer_value(json_object_get(dp, "index"));
            pos.seed = strtoull(json_string_value(json_object_get(dp, "seed")) ? json_string_value(json_object_get(dp, "seed")) : "0", NULL, 10);
            r.first_loss = (float)json_real_value(json_object_get(j, "first_loss"));
            r.trained_tokens = (size_t)json_integer_value(json_object_get(j, "trained_tokens"));
            json_decref(j);
            free(meta);
            zs_log_info("finetune: resuming from step %ld of %s", s0, o->ckpt_dir);
        }
    }
    zs_train_step_info info;
    memset(&info, 0, sizeof info);
    info.loss_scale = info.next_scale = 1.0;
    int retries = 0;
    for (long s = s0 + 1; s <= steps; s++) {
        if (h && h->before_step && h->before_step(h->ud, s)) {
            rc = zs_err(ZS_ECANCELLED, "finetune: stopped before step %ld", s);
            goto done;
        }
        zs_data_pos before = pos; /* a skipped step does not move the data position */
        size_t tokens_before = r.trained_tokens;
        for (int i = 0; i < slots; i++) {
            int filled;
            if ((rc = zs_data_next_batch(d, &pos, o->batch, seq_len, (int32_t *)T[i], (int32_t *)G[i], &filled)) < 0)
                goto done;
            r.trained_tokens += counted(G[i], bt);
        }
        float loss;
        call.op = FT_STEP;
        call.T = T;
        call.G = G;
        call.step = s;
        call.loss = &loss;
        call.info = &info;
        call.tokens = r.trained_tokens - tokens_before;
        info.skipped = 0;
        info.grad_norm = NAN;
        double ts0 = zs_now();
        if ((rc = ft_exec(h, &call)) < 0) goto done;
        double step_s = zs_now() - ts0;
        if (t) {
            r.skipped_steps = info.skipped_total;
            r.loss_scale = info.next_scale;
        }
        if (h && h->on_step) {
            zs_finetune_step st = {s, steps, loss, zs_lr_at(&to.lr, s), r.trained_tokens, info.skipped,
                                   t ? info.loss_scale : 1.0, t ? info.next_scale : 1.0, r.skipped_steps,
                                   t ? info.grad_norm : NAN, step_s, t ? info.optim_s : 0.0};
            h->on_step(h->ud, &st);
        }
        if (info.skipped) {
            /* the same step again on the same data, at the lowered scale; a scale that cannot go
             * lower fails in the scaler (ZS_ERANGE), and a gradient that is not finite without
             * dynamic scaling would only repeat */
            zs_loss_scaler sc;
            zs_training_scaler(t, &sc);
            if (!sc.dynamic || ++retries > 200) {
                rc = zs_err(ZS_ERANGE, "finetune: step %ld: the gradients are not finite (inf or NaN)%s; stopping before "
                                       "the step is applied, the checkpoints so far kept (lower the learning rate%s)",
                            s, retries > 200 ? " in 200 attempts" : "",
                            o->precision == ZS_PREC_FP16 ? "" : ", or train in fp16 with dynamic loss scaling");
                goto done;
            }
            pos = before;
            r.trained_tokens = tokens_before;
            s--;
            continue;
        }
        retries = 0;
        if (s == 1) r.first_loss = loss;
        r.last_loss = loss;
        r.steps = s;
        if (o->ckpt_dir && ((o->save_every > 0 && s % o->save_every == 0) || s == steps)) {
            /* the data position (and the seed of its shuffle: the run's only RNG), the loss so far,
             * and the training configuration */
            char meta[1024];
            snprintf(meta, sizeof meta,
                     "{\"data\":{\"epoch\":%d,\"index\":%ld,\"seed\":\"%llu\"},\"first_loss\":%.9g,"
                     "\"trained_tokens\":%zu,\"config\":{\"steps\":%ld,\"batch_size\":%d,\"grad_accum\":%d,"
                     "\"seq_len\":%d,\"ranks\":%d,\"zero_stage\":%d,\"lr\":%.9g,\"schedule\":%d,\"warmup\":%d,"
                     "\"clip\":%.9g,\"weight_decay\":%.9g}}",
                     pos.epoch, pos.index, (unsigned long long)pos.seed, (double)r.first_loss, r.trained_tokens,
                     steps, o->batch, o->grad_accum, seq_len, ranks, to.stage, (double)o->lr, o->schedule, o->warmup,
                     (double)o->clip, (double)o->weight_decay);
            call.op = FT_SAVE;
            call.dir = o->ckpt_dir;
            call.step = s;
            call.meta = meta;
            if ((rc = ft_exec(h, &call)) < 0) goto done;
            if (t && o->save_16bit) { /* the consolidated 16-bit weights, beside the checkpoint's shards */
                char hf[4300];
                snprintf(hf, sizeof hf, "%s/step-%06ld/hf16", o->ckpt_dir, s);
                call.op = FT_EXPORT16;
                call.dir = hf;
                call.dtype = zs_finetune_16bit_dtype(o->precision);
                if ((rc = ft_exec(h, &call)) < 0) goto done;
            }
        }
    }
    if (o->valid_path) {
        int32_t *vb = malloc(sizeof(int32_t) * bt * 2 * (size_t)ranks);
        if (!vb) {
            rc = zs_err(ZS_ENOMEM, "finetune: out of memory");
            goto done;
        }
        rc = valid_loss(h, &call, o->valid_path, zs_engine_tokenizer(e), o, ranks, seq_len, vb, T, G, &r.valid_loss);
        free(vb);
        if (rc < 0) goto done;
    }
    if (o->out_dir) {
        call.op = FT_EXPORT;
        call.dir = o->out_dir;
        call.dtype = o->export_dtype;
        if (o->save_16bit && o->export_dtype == ZS_DTYPE_COUNT) call.dtype = zs_finetune_16bit_dtype(o->precision);
        if ((rc = ft_exec(h, &call)) < 0) goto done;
    }
done:
    free(buf);
    if (t) zs_training_end(t);
    if (lt) zs_lora_training_end(lt);
    zs_lora_free(adapter);
    zs_data_free(d);
    if (res && (rc == 0 || rc == ZS_ECANCELLED)) *res = r;
    return rc;
}
