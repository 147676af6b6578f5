/* ftrun.c — the fine-tuning job runner: one thread that takes the oldest queued job and trains
 * it, then serves the result at once under ft:<base>:<suffix>:<job id hex> (ft:<base>:<job id
 * hex> without a suffix), to the job's tenant only unless the job is shared (zs_ftjobs_model_owner):
 *   - a full fine-tune ("lora": null) trains a separate copy of the base model (a second engine
 *     on the same model directory, with the server's ranks and offload settings: the served base
 *     model is never touched), exports it into data_dir/models/<name> and serves that model;
 *   - a LoRA job ("lora": {...}) trains an adapter over the served base engine itself (no second
 *     engine, no copy of the weights): each training step is background work of the base
 *     scheduler (zs_finetune_hooks.exec_work -> zs_sched_run_work: slices between serving steps,
 *     or riding them, under the job's share), an evaluation one slice (exec -> zs_sched_run_idle),
 *     and its checkpoints are written on this thread; the adapter (PEFT's
 *     format) goes to data_dir/models/<name> and is served over the base (zs_api_load_adapter).
 * Checkpoints (every 10 steps) go to the job's checkpoint directory; a job interrupted by a
 * restart continues from the latest.
 *
 * Sharing with serving: a job trains with its "train_share" F of the time while requests are
 * served. A LoRA job's share is kept by the base scheduler (sched-train.c). A full job, on its
 * own engine, keeps a duty cycle (serving busy: any served model's scheduler has queued or
 * running requests, polled every millisecond): after a step of step_s seconds it waits, while
 * serving stays busy, up to step_s (1 - F) / F before the next (F = 0: while serving is busy);
 * its seconds trained and waited and its tokens go to /metrics (zs_metrics_train_*). A cancel
 * or a server stop is seen before the next step (and, for a LoRA job, between its slices). Each step's event and the job carry "trained_tokens_per_second": this run's tokens over
 * its wall time so far. */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chat.h"
#include "common.h"
#include "engine.h"
#include "finetune.h"
#include "ftrun.h"
#include "lora.h"

int zs_ftjobs_serve_model(zs_ftjobs *J, const char *name, const char *owner, const char *dir) {
    zs_engine_opts eo = J->engine;
    eo.model_dir = dir;
    char nv[4096];
    if (J->nvme_path) {
        snprintf(nv, sizeof nv, "%s/%s", J->nvme_path, strrchr(dir, '/') ? strrchr(dir, '/') + 1 : dir);
        ZS_CHECK(zs_persist_mkdirs(nv));
        eo.nvme_path = nv;
    }
    zs_engine *e = NULL;
    zs_sched *s = NULL;
    ZS_CHECK(zs_engine_open(&eo, &e));
    int rc = zs_sched_new(e, &J->sched, &s);
    ftmodel *m = rc == 0 ? calloc(1, sizeof *m) : NULL;
    if (rc == 0 && !m) rc = zs_err(ZS_ENOMEM, "out of memory");
    if (rc == 0) rc = zs_api_add_model(J->api, name, owner, dir, e, s);
    if (rc < 0) {
        free(m);
        if (s) zs_sched_free(s);
        zs_engine_free(e);
        return rc;
    }
    m->engine = e;
    m->sched = s;
    pthread_mutex_lock(&J->mu);
    m->next = J->models;
    J->models = m;
    pthread_mutex_unlock(&J->mu);
    return 0;
}

typedef struct {
    zs_ftjobs *J;
    ftjob *j;
    int is_lora;
    double share;       /* the job's "train_share" (0: train only while serving is idle) */
    double t0;          /* when the run began: tokens/s leave out the time queued */
    double last_step_s; /* the last step's wall time: a full job's duty cycle waits from it */
    long first_step;    /* the first step of this run (a resumed job starts later), and the */
    size_t base_tokens; /* tokens counted before it: tokens/s are this run's */
    size_t prev_tokens; /* the tokens counted at the last step */
    double train_s, wait_s; /* a full job: seconds trained, and waited for serving */
} run_ctx;

static int serving_busy(zs_ftjobs *J) {
    zs_sched_stats st;
    zs_sched_stats_get(J->base_sched, &st);
    if (st.queued || st.running) return 1;
    pthread_mutex_lock(&J->mu);
    ftmodel *m = J->models;
    pthread_mutex_unlock(&J->mu);
    for (; m; m = m->next) { /* the list only grows at its head: m and what follows stay */
        zs_sched_stats_get(m->sched, &st);
        if (st.queued || st.running) return 1;
    }
    return 0;
}

static int stop_requested(run_ctx *c) {
    pthread_mutex_lock(&c->J->mu);
    int stop = c->j->cancel || c->J->stopping;
    pthread_mutex_unlock(&c->J->mu);
    return stop;
}

/* A LoRA job's steps run in the base scheduler's slices, which keep its share. A full job trains on an engine of its own, so the share is a duty cycle here:
 * after a step of step_s seconds it waits, while serving is busy, up to step_s (1 - F) / F, so
 * that it trains F of the time serving has work (F = 0: it waits while serving is busy). */
static int before_step(void *ud, long step) {
    run_ctx *c = ud;
    (void)step;
    if (c->is_lora) return stop_requested(c); /* the base scheduler gives its slices their share */
    double t0 = zs_now(), end = c->share > 0 ? t0 + c->last_step_s * (1 - c->share) / c->share : INFINITY;
    int waited = 0;
    while (!stop_requested(c) && zs_now() < end && serving_busy(c->J)) {
        waited = 1;
        usleep(1000);
    }
    if (waited) {
        double w = zs_now() - t0;
        c->wait_s += w;
        zs_metrics_train_wait(w);
    }
    return stop_requested(c);
}

/* A LoRA job's exec hook: fn runs on the base scheduler's engine thread when it is idle. */
typedef struct {
    run_ctx *c;
    int (*fn)(void *arg);
    void *arg;
} idle_call;

static int idle_fn(void *ud) {
    idle_call *ic = ud;
    return ic->fn(ic->arg);
}

static int idle_cancelled(void *ud) {
    idle_call *ic = ud;
    return stop_requested(ic->c);
}

static int exec_idle(void *ud, int (*fn)(void *arg), void *arg) {
    run_ctx *c = ud;
    idle_call ic = {c, fn, arg};
    return zs_sched_run_idle(c->J->base_sched, idle_fn, &ic, idle_cancelled);
}

static int work_cancelled(void *ud) { return stop_requested(ud); }

/* A LoRA job's step: slices on the base scheduler's engine thread, with the job's share. */
static int exec_work(void *ud, const zs_sched_work *w) {
    run_ctx *c = ud;
    zs_sched_work x = *w;
    x.share = c->share;
    return zs_sched_run_work(c->J->base_sched, &x, work_cancelled, c);
}

/* A job's "lora" object (as ftjobs.c normalized it) as adapter parameters. */
static int lora_params_of(json_t *lj, zs_lora_params *p) {
    memset(p, 0, sizeof *p);
    p->r = (int)json_integer_value(json_object_get(lj, "r"));
    p->alpha = (float)json_number_value(json_object_get(lj, "alpha"));
    p->dropout = (float)json_number_value(json_object_get(lj, "dropout"));
    size_t i;
    json_t *x;
    json_array_foreach(json_object_get(lj, "target_modules"), i, x) {
        for (int t = 0; t < ZS_LORA_NT; t++)
            if (json_is_string(x) && !strcmp(json_string_value(x), zs_lora_target_name(t))) p->targets |= 1u << t;
    }
    if (p->r < 1 || !(p->alpha > 0) || !p->targets)
        return zs_err(ZS_EINVAL, "the job's 'lora' record is not valid (r %d, alpha %g)", p->r, (double)p->alpha);
    return 0;
}

static void on_step(void *ud, const zs_finetune_step *st) {
    run_ctx *c = ud;
    if (c->first_step == 0) { /* a resumed run counts from here: the tokens of its first step are a share of those so far */
        c->first_step = st->step;
        c->base_tokens = st->step > 1 ? st->tokens - st->tokens / (size_t)st->step : 0;
        c->prev_tokens = c->base_tokens;
    }
    size_t run_tokens = st->tokens >= c->base_tokens ? st->tokens - c->base_tokens : 0;
    double el = zs_now() - c->t0;
    double tps = el > 0 ? (double)run_tokens / el : 0;
    if (!c->is_lora) { /* a LoRA job's seconds and tokens are counted by the scheduler that runs them */
        c->train_s += st->step_s;
        zs_metrics_train_step(st->step_s, serving_busy(c->J),
                              st->tokens > c->prev_tokens ? st->tokens - c->prev_tokens : 0, c->share);
    }
    c->prev_tokens = st->tokens;
    c->last_step_s = st->step_s;
    char msg[192];
    if (st->skipped)
        snprintf(msg, sizeof msg, "Step %ld/%ld: gradient overflow at loss scale %g: step skipped, scale now %g", st->step,
                 st->steps, st->loss_scale, st->next_scale);
    else
        snprintf(msg, sizeof msg, "Step %ld/%ld: training loss=%.4f, %.0f tokens/s", st->step, st->steps, (double)st->loss,
                 tps);
    zs_metrics_set_training(st->step, st->next_scale, st->skipped_total);
    pthread_mutex_lock(&c->J->mu);
    zs_ftjobs_event_locked(c->J, c->j, st->skipped ? "warn" : "info", msg,
                           json_pack("{s:I,s:I,s:f,s:f,s:f,s:I,s:b,s:f}", "step", (json_int_t)st->step, "total_steps",
                                     (json_int_t)st->steps, "train_loss", (double)st->loss, "learning_rate", (double)st->lr,
                                     "loss_scale", st->loss_scale, "skipped_steps", (json_int_t)st->skipped_total,
                                     "skipped", st->skipped, "trained_tokens_per_second", tps));
    json_object_set_new(c->j->obj, "trained_tokens", json_integer((json_int_t)st->tokens));
    json_object_set_new(c->j->obj, "trained_tokens_per_second", json_real(tps));
    pthread_mutex_unlock(&c->J->mu);
}

static void on_plan(void *ud, const zs_finetune_plan *p) {
    run_ctx *c = ud;
    char msg[256];
    snprintf(msg, sizeof msg, "Training: %d examples (%zu tokens), %ld steps on %d rank(s), %d tokens per sequence",
             p->examples, p->tokens, p->steps, p->ranks, p->seq_len);
    pthread_mutex_lock(&c->J->mu);
    zs_ftjobs_event_locked(c->J, c->j, "info", msg, NULL);
    pthread_mutex_unlock(&c->J->mu);
}

/* The oldest queued job (mu held). */
static ftjob *next_queued_locked(zs_ftjobs *J) {
    ftjob *found = NULL;
    for (ftjob *j = J->jobs; j; j = j->next)
        if (!strcmp(json_string_value(json_object_get(j->obj, "status")), "queued")) found = j;
    return found;
}

static int run_full(zs_ftjobs *J, const zs_finetune_opts *fo, const zs_finetune_hooks *h, zs_finetune_result *res,
                    const char *hex, int rc);
static void finish_job(zs_ftjobs *J, ftjob *j, int rc, const char *name, int is_lora, const zs_finetune_result *r);

static void run_job(zs_ftjobs *J, ftjob *j) {
    char tf[4096], vf[4096], name[512], dir[4096], hex[64];
    pthread_mutex_lock(&J->mu);
    json_t *o = j->obj, *hp = json_object_get(o, "hyperparameters");
    const char *tid = json_string_value(json_object_get(o, "training_file"));
    const char *vid = json_string_value(json_object_get(o, "validation_file"));
    const char *suffix = json_string_value(json_object_get(o, "user_provided_suffix"));
    snprintf(hex, sizeof hex, "%s", j->id + 6);
    json_t *lj = json_object_get(o, "lora");
    if (json_is_string(lj)) { /* "auto": created while the base was loading; decided now */
        json_object_set_new(o, "lora", zs_ftjobs_lora_auto(J->base_engine));
        lj = json_object_get(o, "lora");
    }
    int is_lora = json_is_object(lj);
    zs_lora_params lp;
    int lora_rc = is_lora ? lora_params_of(lj, &lp) : 0;
    if (suffix && *suffix) snprintf(name, sizeof name, "ft:%s:%s:%s", J->base_name, suffix, hex);
    else snprintf(name, sizeof name, "ft:%s:%s", J->base_name, hex);
    zs_finetune_opts fo;
    zs_finetune_opts_default(&fo);
    fo.epochs = (int)json_integer_value(json_object_get(hp, "n_epochs"));
    fo.batch = (int)json_integer_value(json_object_get(hp, "batch_size"));
    fo.lr = (float)(FT_BASE_LR * json_number_value(json_object_get(hp, "learning_rate_multiplier")));
    fo.seed = (uint64_t)json_integer_value(json_object_get(o, "seed"));
    int have_files = zs_files_path(J->files, tid, NULL, tf, sizeof tf) == 0 &&
                     (!vid || zs_files_path(J->files, vid, NULL, vf, sizeof vf) == 0);
    json_object_set_new(o, "trained_tokens", json_integer(0));
    json_object_set_new(o, "trained_tokens_per_second", json_real(0));
    /* the record's share (ftjobs.c always writes one); the server's as a fallback */
    json_t *sh = json_object_get(o, "train_share");
    double share = json_is_number(sh) ? json_number_value(sh) : J->sched.train_share;
    char started[160];
    if (is_lora)
        snprintf(started, sizeof started, "Fine-tuning job started: a LoRA adapter (r %d, alpha %g) over the served base",
                 lp.r, (double)lp.alpha);
    else
        snprintf(started, sizeof started, "Fine-tuning job started: a full fine-tune of a copy of the base");
    zs_ftjobs_set_status_locked(J, j, "running", started);
    pthread_mutex_unlock(&J->mu);
    zs_ftjobs_model_dir(J, name, dir, sizeof dir);
    if (zs_persist_mkdirs(J->models_dir) < 0) have_files = 0;
    fo.data_path = tf;
    fo.valid_path = vid ? vf : NULL;
    fo.out_dir = dir;
    fo.chat_template = zs_model_chat_template_detect(J->base_dir);
    /* checkpoints every 10 steps; a job interrupted by a restart continues from the latest */
    char ck[4200];
    zs_ftjobs_ckpt_dir(J, j, ck, sizeof ck);
    fo.ckpt_dir = ck;
    fo.save_every = 10;
    fo.resume = 1;
    /* full fine-tunes: the server's --config decides the precision (its engine stores the weights
     * in it), the fp16 loss scaler, where the optimizer state lives and the 16-bit saves */
    const zs_zero_opts *z = &J->train;
    int train_rc = 0;
    if (!is_lora) {
        fo.precision = z->fp16 == 1 ? ZS_PREC_FP16 : z->bf16 == 1 ? ZS_PREC_BF16 : ZS_PREC_DEFAULT;
        train_rc = zs_loss_scaler_init(&fo.scaler, fo.precision == ZS_PREC_FP16, z);
        if (z->offload_optimizer == ZS_OFFLOAD_NVME) {
            fo.optimizer.device = ZS_OFFLOAD_NVME;
            fo.optimizer.dir = z->optimizer_nvme_path;
            fo.optimizer.sub_group = z->sub_group_size > 0 ? (size_t)z->sub_group_size : 0;
            fo.optimizer.buffer_count = z->optimizer_buffer_count > 0 ? z->optimizer_buffer_count : 0;
            fo.optimizer.pin_memory = z->optimizer_pin_memory == 1;
        }
        fo.save_16bit = z->gather_16bit_on_save == 1;
    }

    int rc = have_files ? 0 : zs_err(ZS_ENOTFOUND, "a file of the job no longer exists");
    if (rc == 0) rc = lora_rc;
    if (rc == 0) rc = train_rc;
    run_ctx c = {J, j, is_lora, share, zs_now(), 0, 0, 0, 0, 0, 0};
    zs_finetune_hooks h = {on_plan, before_step, on_step, NULL, NULL, &c};
    zs_finetune_result res;
    memset(&res, 0, sizeof res);
    if (is_lora) {
        /* over the served base, its steps in the base scheduler's slices, with the job's share */
        fo.lora = &lp;
        fo.base_name = J->base_name;
        h.exec = exec_idle;
        h.exec_work = exec_work;
        if (rc == 0) rc = zs_finetune_run(J->base_engine, &fo, &h, &res);
        if (rc == 0 && !stop_requested(&c)) rc = zs_api_load_adapter(J->api, name, zs_ftjobs_model_owner(j), dir);
    } else {
        zs_metrics_train_active(1, share);
        rc = run_full(J, &fo, &h, &res, hex, rc);
        zs_metrics_train_active(0, 0);
        if (rc == 0 && !stop_requested(&c)) rc = zs_ftjobs_serve_model(J, name, zs_ftjobs_model_owner(j), dir);
    }
    finish_job(J, j, rc, name, is_lora, &res);
}

/* A full fine-tune: a training engine of its own on the base's directory. rc: what went before. */
static int run_full(zs_ftjobs *J, const zs_finetune_opts *fo, const zs_finetune_hooks *h, zs_finetune_result *res,
                    const char *hex, int rc) {
    zs_engine_opts eo = J->engine;
    eo.max_seqs = 1;
    eo.kv_offload = ZS_OFFLOAD_NONE; /* training has no KV cache */
    eo.offload_auto = 0;             /* and places its parameters as the served base does */
    eo.model.embed_lookup = 0; /* a training engine: every table sharded (the served ones look rows up) */
    char nv[4096];
    if (J->nvme_path) {
        snprintf(nv, sizeof nv, "%s/train-%s", J->nvme_path, hex);
        if (rc == 0) rc = zs_persist_mkdirs(nv);
        eo.nvme_path = nv;
    }
    zs_engine *e = NULL;
    if (rc == 0) rc = zs_engine_open(&eo, &e);
    if (rc == 0) rc = zs_finetune_run(e, fo, h, res);
    zs_engine_free(e);
    return rc;
}

/* The job's final record: succeeded (with its model), failed (with the message of rc) or left as
 * it is (cancelled, or "running" when the server stops: re-queued at the next start). */
static void finish_job(zs_ftjobs *J, ftjob *j, int rc, const char *name, int is_lora, const zs_finetune_result *r) {
    const zs_finetune_result res = *r;
    json_t *o = j->obj;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", zs_errmsg());
    pthread_mutex_lock(&J->mu);
    if (j->cancel) {
        /* already "cancelled" */
    } else if (J->stopping && rc == ZS_ECANCELLED) {
        /* the server stops: the record stays "running" and the job is re-queued at the next start */
    } else if (rc == 0) {
        json_object_set_new(o, "fine_tuned_model", json_string(name));
        json_object_set_new(o, "trained_tokens", json_integer((json_int_t)res.trained_tokens));
        if (res.valid_loss >= 0) {
            char vm[128];
            snprintf(vm, sizeof vm, "Validation loss=%.4f", (double)res.valid_loss);
            zs_ftjobs_event_locked(J, j, "info", vm, json_pack("{s:f}", "valid_loss", (double)res.valid_loss));
        }
        if (is_lora) {
            char mm[300];
            snprintf(mm, sizeof mm, "Memory beyond the served base: adapter %.2f MiB, gradients %.2f MiB, optimizer %.2f MiB, "
                     "activations %.2f MiB", res.mem_params / 1048576.0, res.mem_grads / 1048576.0,
                     res.mem_optimizer / 1048576.0, res.mem_activations / 1048576.0);
            zs_ftjobs_event_locked(J, j, "info", mm,
                                   json_pack("{s:I,s:I,s:I,s:I}", "mem_params", (json_int_t)res.mem_params, "mem_grads",
                                             (json_int_t)res.mem_grads, "mem_optimizer", (json_int_t)res.mem_optimizer,
                                             "mem_activations", (json_int_t)res.mem_activations));
        }
        char done[700];
        snprintf(done, sizeof done, "New fine-tuned %s created: %s (loss %.4f -> %.4f)", is_lora ? "LoRA adapter" : "model",
                 name, (double)res.first_loss, (double)res.last_loss);
        zs_ftjobs_event_locked(J, j, "info", done, NULL);
        zs_ftjobs_set_status_locked(J, j, "succeeded", "The job has successfully completed");
    } else {
        json_object_set_new(o, "error", json_pack("{s:s,s:s,s:n}", "code", "training_failed", "message", msg, "param"));
        char fm[1100];
        snprintf(fm, sizeof fm, "Fine-tuning failed: %s", msg);
        zs_ftjobs_set_status_locked(J, j, "failed", fm);
    }
    pthread_mutex_unlock(&J->mu);
}

void *zs_ftjobs_runner_main(void *arg) {
    zs_ftjobs *J = arg;
    pthread_mutex_lock(&J->mu);
    for (;;) {
        ftjob *j = NULL;
        while (!J->stopping && !(j = next_queued_locked(J))) pthread_cond_wait(&J->cv, &J->mu);
        if (J->stopping) break;
        pthread_mutex_unlock(&J->mu);
        run_job(J, j);
        pthread_mutex_lock(&J->mu);
    }
    pthread_mutex_unlock(&J->mu);
    return NULL;
}
