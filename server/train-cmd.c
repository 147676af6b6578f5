/* train-cmd.c — `zeroserve train`: fine-tunes a model on a JSONL file through the engine's ranks
 * (ZeRO-3, optimizer state in host memory), prints progress, and writes the result as a plain
 * Hugging Face model directory that `generate` and `serve` load; with --lora / --lora-r, trains a
 * LoRA adapter over the frozen base instead (any --weight-dtype, quantized = QLoRA) and writes it
 * in PEFT's format. The run itself is engine/finetune.c (shared with the server's fine-tuning
 * jobs). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "chat.h"
#include "ckpt.h"
#include "train.h"
#include "bench.h"
#include "cli.h"
#include "cluster.h"
#include "common.h"
#include "engine.h"
#include "data.h"
#include "engine-flags.h"
#include "finetune.h"

int zs_cmd_train(int argc, char **argv);

/* "q,k,v,o,gate,up,down" (each with or without _proj; "all") -> target bits */
static int parse_targets(const char *s, unsigned *out) {
    unsigned bits = 0;
    char buf[256];
    if (strlen(s) >= sizeof buf) return zs_err(ZS_EINVAL, "--lora-targets: too long");
    snprintf(buf, sizeof buf, "%s", s);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ') tok++;
        size_t n = strlen(tok);
        while (n && tok[n - 1] == ' ') tok[--n] = 0;
        if (n > 5 && !strcmp(tok + n - 5, "_proj")) tok[n - 5] = 0;
        if (!strcmp(tok, "all")) {
            bits |= ZS_LORA_ALL;
            continue;
        }
        int found = -1;
        for (int t = 0; t < ZS_LORA_NT; t++) {
            const char *name = zs_lora_target_name(t); /* "q_proj" */
            size_t k = strlen(name) - 5;
            if (strlen(tok) == k && !strncmp(tok, name, k)) found = t;
        }
        if (found < 0)
            return zs_err(ZS_EINVAL, "--lora-targets: '%s' is not one of q, k, v, o, gate, up, down (with or without _proj)", tok);
        bits |= 1u << found;
    }
    if (!bits) return zs_err(ZS_EINVAL, "--lora-targets: no target given");
    *out = bits;
    return 0;
}

static void fmt_time(double s, char *buf, size_t cap) {
    long t = (long)(s + 0.5);
    snprintf(buf, cap, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
}

typedef struct {
    int every;
    double t0;
    size_t step_tokens; /* tokens per step, padding included */
    const char *schedule;
    float lr;
    int batch, accum;
    int bar;          /* draw a progress bar instead of lines */
    long first_step;
    int fp16;         /* show the loss scale */
    double *st, *ot;  /* each applied step's wall time and optimizer time (the medians at the end) */
    long nt, capt;
} progress;

static void on_plan(void *ud, const zs_finetune_plan *p) {
    progress *g = ud;
    g->step_tokens = (size_t)p->ranks * (size_t)g->accum * (size_t)g->batch * (size_t)p->seq_len;
    fprintf(stderr, "train: %d examples (%zu tokens), %ld step(s) of %d rank(s), %d tokens per sequence, lr %g (%s)\n",
            p->examples, p->tokens, p->steps, p->ranks, p->seq_len, (double)g->lr, g->schedule);
    g->t0 = zs_now();
}

static void on_step(void *ud, const zs_finetune_step *st) {
    progress *g = ud;
    long s = st->step, steps = st->steps;
    float loss = st->loss, lr = st->lr;
    if (st->skipped) { /* fp16: the gradients overflowed; the same step is retried at the lowered scale */
        if (g->bar) fputc('\n', stderr);
        printf("step %ld/%ld  overflow at loss scale %g: skipped, scale now %g (%ld skipped)\n", s, steps,
               st->loss_scale, st->next_scale, st->skipped_total);
        fflush(stdout);
        return;
    }
    if (g->nt == g->capt) {
        long cap = g->capt ? 2 * g->capt : 64;
        double *a = realloc(g->st, (size_t)cap * sizeof(double)), *b = a ? realloc(g->ot, (size_t)cap * sizeof(double)) : NULL;
        if (a) g->st = a;
        if (b) {
            g->ot = b;
            g->capt = cap;
        }
    }
    if (g->nt < g->capt) {
        g->st[g->nt] = st->step_s;
        g->ot[g->nt++] = st->optim_s;
    }
    if (g->first_step == 0) g->first_step = s; /* a resumed run starts later */
    long done = s - g->first_step + 1;
    double el = zs_now() - g->t0, tps = (double)done * (double)g->step_tokens / el;
    char eta[32];
    fmt_time(el / (double)done * (double)(steps - s), eta, sizeof eta);
    if (g->bar) {
        int w = 30, k = (int)((long)w * s / steps);
        fprintf(stderr, "\r[%.*s%*s] %3d%%  step %ld/%ld  loss %.3f  ETA %s ", k, "##############################",
                w - k, "", (int)(100 * s / steps), s, steps, loss, eta);
        if (s == steps) fputc('\n', stderr);
        return;
    }
    if (s % g->every && s != steps) return;
    if (g->fp16)
        printf("step %ld/%ld  loss %.4f  lr %.3g  scale %g  skipped %ld  %.0f tokens/s  ETA %s\n", s, steps, loss,
               (double)lr, st->loss_scale, st->skipped_total, tps, eta);
    else
        printf("step %ld/%ld  loss %.4f  lr %.3g  %.0f tokens/s  ETA %s\n", s, steps, loss, (double)lr, tps, eta);
    fflush(stdout);
}

int zs_cmd_train(int argc, char **argv) {
    const char *data_path = NULL, *out = NULL, *schedule = "constant";
    int epochs = 1, steps = 0, batch = 4, accum = 1, seq_len = 0, warmup = 0, every = 1, bar = 0, save_every = 0;
    const char *ckpt_dir = NULL, *resume = NULL;
    float lr = 1e-4f, clip = 1.0f, wd = 0.0f;
    uint64_t seed = 0;
    int lora_on = 0, lora_r = 0, rslora = 0;
    const char *precision = NULL, *opt_offload = NULL, *opt_nvme = NULL, *out_dtype = NULL;
    int64_t sub_group = 0;
    int save16 = 0;
    /* flags whose absence lets a --config file decide: NAN / -1 = not given */
    float lr_flag = NAN, clip_flag = NAN, wd_flag = NAN;
    int batch_flag = -1, accum_flag = -1;
    float lora_alpha = -1.0f, lora_dropout = -1.0f; /* -1: not given */
    const char *lora_targets = NULL;
    zs_engine_flags ef;
    zs_engine_flags_init(&ef);
    zs_opt opts[32 + ZS_ENGINE_FLAG_COUNT] = {
        {"data", ZS_OPT_STR, &data_path, "training data, JSONL: {text} | {prompt, completion} | {messages}  [required]"},
        {"out", ZS_OPT_STR, &out, "output model directory (Hugging Face layout)  [required]"},
        {"epochs", ZS_OPT_INT, &epochs, "passes over the data (default 1)"},
        {"steps", ZS_OPT_INT, &steps, "optimizer steps (default: as many as the epochs take)"},
        {"lr", ZS_OPT_FLOAT, &lr_flag, "peak learning rate (default 1e-4, or optimizer.params.lr of --config)"},
        {"schedule", ZS_OPT_STR, &schedule, "constant | linear | cosine (after --warmup steps; default constant)"},
        {"warmup", ZS_OPT_INT, &warmup, "linear warm-up steps (default 0)"},
        {"batch-size", ZS_OPT_INT, &batch_flag, "sequences per rank and micro-step (default 4, or train_micro_batch_size_per_gpu)"},
        {"grad-accum", ZS_OPT_INT, &accum_flag, "micro-steps per optimizer step (default 1, or gradient_accumulation_steps)"},
        {"seq-len", ZS_OPT_INT, &seq_len, "tokens per sequence (default: the longest example, up to the context)"},
        {"clip", ZS_OPT_FLOAT, &clip_flag, "global gradient-norm clipping, 0 = off (default 1.0, or gradient_clipping)"},
        {"weight-decay", ZS_OPT_FLOAT, &wd_flag, "AdamW weight decay (default 0, or optimizer.params.weight_decay)"},
        {"precision", ZS_OPT_STR, &precision, "fp32 | bf16 | fp16: weights in the tiers and gradients on the wire in this dtype, "
                                              "fp32 masters and moments; fp16 with loss scaling (default: bf16/fp16.enabled "
                                              "of --config, else the weights as stored with fp32 gradients)"},
        {"offload-optimizer", ZS_OPT_STR, &opt_offload, "cpu | nvme: where the fp32 masters and moments live (default "
                                                        "cpu, or offload_optimizer.device)"},
        {"optimizer-nvme-path", ZS_OPT_STR, &opt_nvme, "directory of the per-rank optimizer files for --offload-optimizer nvme"},
        {"sub-group-size", ZS_OPT_I64, &sub_group, "elements of optimizer state streamed at a time with nvme (default 1e9, or zero_optimization.sub_group_size)"},
        {"save-16bit", ZS_OPT_FLAG, &save16, "every checkpoint also writes the consolidated 16-bit model (step-N/hf16), "
                                             "and --out is 16-bit (stage3_gather_16bit_weights_on_model_save)"},
        {"out-dtype", ZS_OPT_STR, &out_dtype, "f32 | bf16 | f16: dtype of --out (default: the base model's)"},
        {"seed", ZS_OPT_U64, &seed, "data shuffling seed (default 0)"},
        {"log-every", ZS_OPT_INT, &every, "print progress every N steps (default 1)"},
        {"progress-bar", ZS_OPT_FLAG, &bar, "draw a progress bar on stderr instead of one line per step"},
        {"checkpoint-dir", ZS_OPT_STR, &ckpt_dir, "write checkpoints here (default: OUT.checkpoints)"},
        {"save-every", ZS_OPT_INT, &save_every, "checkpoint every N steps (default 0: after the last step)"},
        {"resume", ZS_OPT_STR, &resume, "continue from the latest checkpoint in this directory (any rank count)"},
        {"lora", ZS_OPT_FLAG, &lora_on, "train a LoRA adapter over the frozen base instead of the whole model (--out gets "
                                        "adapter_config.json + adapter_model.safetensors, PEFT's format; any --weight-dtype, "
                                        "q8_0 / q4_k / ... = QLoRA)"},
        {"lora-r", ZS_OPT_INT, &lora_r, "LoRA rank (turns LoRA on; default 16)"},
        {"lora-alpha", ZS_OPT_FLOAT, &lora_alpha, "LoRA alpha: the update is scaled by alpha / r (default 32)"},
        {"lora-dropout", ZS_OPT_FLOAT, &lora_dropout, "dropout on the input of lora_A, in [0, 1) (default 0)"},
        {"lora-targets", ZS_OPT_STR, &lora_targets, "adapted projections (default q,k,v,o,gate,up,down; q,k,v,o on a mixture of experts; _proj optional)"},
        {"lora-rslora", ZS_OPT_FLAG, &rslora, "rank-stabilised LoRA: scale alpha / sqrt(r)"},
    };
    int n_opts = zs_engine_flags_table(&ef, opts, 30);
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            zs_cli_usage("train", "Fine-tunes a model on a JSONL file and writes the result as a model directory.", opts, n_opts);
            return 0;
        }
    ZS_CHECK(zs_cli_parse(argc, argv, opts, n_opts));
    if (!ef.model) return zs_err(ZS_EINVAL, "--model is required");
    if (!data_path) return zs_err(ZS_EINVAL, "--data is required");
    if (!out) return zs_err(ZS_EINVAL, "--out is required");
    zs_lora_params lp = {16, 32.0f, 0, 0.0f, 0}; /* targets 0: the base's default (zs_lora_default_targets) */
    int lora = lora_on || lora_r != 0;
    if (!lora && (lora_alpha != -1.0f || lora_dropout != -1.0f || lora_targets || rslora))
        return zs_err(ZS_EINVAL, "--lora-alpha, --lora-dropout, --lora-targets and --lora-rslora need LoRA on (--lora or --lora-r N)");
    if (lora) {
        if (lora_r < 0 || (lora_r == 0 && !lora_on)) return zs_err(ZS_EINVAL, "--lora-r must be >= 1");
        if (lora_r) lp.r = lora_r;
        if (lora_alpha != -1.0f) lp.alpha = lora_alpha;
        if (!(lp.alpha > 0)) return zs_err(ZS_EINVAL, "--lora-alpha must be > 0");
        if (lora_dropout != -1.0f) lp.dropout = lora_dropout;
        if (!(lp.dropout >= 0.0f && lp.dropout < 1.0f)) return zs_err(ZS_EINVAL, "--lora-dropout must be in [0, 1)");
        if (lora_targets) ZS_CHECK(parse_targets(lora_targets, &lp.targets));
        lp.rslora = rslora;
    }
    /* the engine flags and --config first: the file's training keys are defaults the flags override */
    zs_engine_opts eo;
    zs_engine_opts_default(&eo);
    eo.max_seqs = 1;
    ef.ds_uses = ZS_DS_USE_ENGINE | ZS_DS_USE_TRAIN;
    int prec = ZS_PREC_DEFAULT;
    if (precision) ZS_CHECK(zs_precision_parse(precision, &prec));
    static const char *const prec_dt[] = {NULL, "f32", "bf16", "f16"};
    if (precision && !ef.weight_dtype) ef.weight_dtype = prec_dt[prec]; /* the weights in the tiers follow */
    ZS_CHECK(zs_engine_flags_apply(&ef, &eo));
    if (eo.offload_auto == 1)
        return zs_err(ZS_EINVAL, "--offload auto is for serving: training places its parameters as --offload says (none, cpu, nvme)");
    eo.offload_auto = 0;
    const zs_zero_opts *z = &ef.ds;
    if (!precision && z->fp16 == 1) prec = ZS_PREC_FP16;
    else if (!precision && z->bf16 == 1) prec = ZS_PREC_BF16;
    if (precision && (z->fp16 == 1 || z->bf16 == 1) && prec != (z->fp16 == 1 ? ZS_PREC_FP16 : ZS_PREC_BF16))
        return zs_err(ZS_EINVAL, "--precision %s contradicts %s.enabled of --config %s", precision, z->fp16 == 1 ? "fp16" : "bf16",
                      ef.config);
    if (lora && prec != ZS_PREC_DEFAULT) { /* the base is stored in it; the adapter stays fp32 */
        if (!zs_cluster_follower())
            fprintf(stderr, "train: LoRA: the base in %s, the adapter, its gradients and AdamW in fp32 (no loss scaling)\n",
                    prec_dt[prec]);
        prec = ZS_PREC_DEFAULT;
    }
    if (!isnan(lr_flag)) lr = lr_flag;
    else if (!isnan(z->lr)) lr = z->lr;
    if (!isnan(clip_flag)) clip = clip_flag;
    else if (!isnan(z->grad_clip)) clip = z->grad_clip;
    if (!isnan(wd_flag)) wd = wd_flag;
    else if (!isnan(z->weight_decay)) wd = z->weight_decay;
    if (batch_flag != -1 || accum_flag != -1) {
        if (batch_flag != -1) batch = batch_flag;
        if (accum_flag != -1) accum = accum_flag;
    } else if (z->micro_batch > 0 || z->grad_accum > 0 || z->train_batch_size > 0) {
        /* DeepSpeed's rule train_batch = micro * accum * world, over the ranks of this process
         * times the processes */
        int world = (eo.ranks > 0 ? eo.ranks : 1) * zs_cluster_size();
        ZS_CHECK(zs_zero_opts_resolve_batch(z, world, &batch, &accum, NULL));
    }
    if (epochs < 1 || steps < 0 || batch < 1 || accum < 1 || seq_len < 0 || warmup < 0 || every < 1)
        return zs_err(ZS_EINVAL, "--epochs, --batch-size, --grad-accum and --log-every must be >= 1; --steps, --seq-len, --warmup >= 0");
    if (!(lr > 0) || clip < 0 || wd < 0) return zs_err(ZS_EINVAL, "--lr must be > 0; --clip and --weight-decay >= 0");
    zs_finetune_opts fo;
    zs_finetune_opts_default(&fo);
    if (!strcmp(schedule, "constant")) fo.schedule = ZS_LR_CONSTANT;
    else if (!strcmp(schedule, "linear")) fo.schedule = ZS_LR_WARMUP_LINEAR;
    else if (!strcmp(schedule, "cosine")) fo.schedule = ZS_LR_WARMUP_COSINE;
    else return zs_err(ZS_EINVAL, "--schedule: '%s' is not one of constant, linear, cosine", schedule);
    /* the config's optimizer (betas, eps) and scheduler; --lr / --schedule / --warmup given win */
    zs_adamw_params adam;
    ZS_CHECK(zs_adamw_params_from_opts(z, &adam));
    fo.adam = &adam;
    zs_lr_schedule sched;
    int sched_flags = !isnan(lr_flag) || strcmp(schedule, "constant") != 0 || warmup != 0;
    if (z->lr_schedule >= 0 && !sched_flags) {
        ZS_CHECK(zs_lr_schedule_from_opts(z, &sched));
        fo.lr_schedule = &sched;
        lr = sched.lr;
    } else if (z->lr_schedule >= 0) {
        zs_log_warn("%s: scheduler.*: --lr / --schedule / --warmup given: the command line's schedule is used", ef.config);
    }
    /* mixed precision, the loss scaler, where the optimizer state lives */
    fo.precision = prec;
    ZS_CHECK(zs_loss_scaler_init(&fo.scaler, prec == ZS_PREC_FP16, z));
    int ooff = z->offload_optimizer >= 0 ? z->offload_optimizer : ZS_OFFLOAD_CPU;
    if (opt_offload) ZS_CHECK(zs_offload_parse(opt_offload, &ooff));
    if (ooff == ZS_OFFLOAD_NONE) { /* the optimizer runs on the host: none is cpu, and says so */
        zs_log_warn("offload_optimizer.device none: AdamW runs on the host, its state in host memory (as with cpu)");
        ooff = ZS_OFFLOAD_CPU;
    }
    static char onv[1024];
    snprintf(onv, sizeof onv, "%s", opt_nvme ? opt_nvme : z->optimizer_nvme_path);
    if (ooff == ZS_OFFLOAD_NVME && !onv[0])
        return zs_err(ZS_EINVAL, "--offload-optimizer nvme needs --optimizer-nvme-path DIR (or offload_optimizer.nvme_path)");
    if (ooff != ZS_OFFLOAD_NVME && (opt_nvme || sub_group))
        return zs_err(ZS_EINVAL, "--optimizer-nvme-path and --sub-group-size need --offload-optimizer nvme");
    if (sub_group < 0) return zs_err(ZS_EINVAL, "--sub-group-size must be >= 1");
    if (lora && ooff == ZS_OFFLOAD_NVME)
        return zs_err(ZS_EINVAL, "--offload-optimizer nvme: a LoRA adapter's optimizer state is small and stays in host memory");
    fo.optimizer.device = ooff;
    fo.optimizer.dir = onv[0] ? onv : NULL;
    fo.optimizer.sub_group = (size_t)(sub_group ? sub_group : z->sub_group_size > 0 ? z->sub_group_size : 0);
    fo.optimizer.buffer_count = z->optimizer_buffer_count > 0 ? z->optimizer_buffer_count : 0;
    fo.optimizer.pin_memory = z->optimizer_pin_memory == 1;
    fo.optimizer.queue_depth = eo.gather.queue_depth;
    fo.save_16bit = save16 || z->gather_16bit_on_save == 1;
    if (ef.config) { /* what the run does not act upon, with the flags merged in */
        zs_zero_opts zr = *z;
        zr.fp16 = prec == ZS_PREC_FP16 ? 1 : 0; /* (LoRA: no loss scaling, reported as such) */
        zr.offload_optimizer = ooff;
        zs_zero_opts_report_unused(&zr, ef.config, ZS_DS_USE_ENGINE | ZS_DS_USE_TRAIN, NULL, NULL);
    }
    if (out_dtype) {
        zs_dtype od;
        if (zs_dtype_parse(out_dtype, &od) < 0 || (od != ZS_F32 && od != ZS_F16 && od != ZS_BF16))
            return zs_err(ZS_EINVAL, "--out-dtype: '%s' is not one of f32, bf16, f16", out_dtype);
        fo.export_dtype = od;
    }
    if (lora && (fo.save_16bit || out_dtype))
        return zs_err(ZS_EINVAL, "--save-16bit / --out-dtype: a LoRA run writes its adapter in PEFT's format (fp32)");

    /* validate the data first: a bad line stops here, before anything is loaded or written */
    int n_examples;
    ZS_CHECK(zs_data_validate(data_path, 0, &n_examples));
    if (eo.kv_dtype != ZS_F32) /* training's attention keeps its own f32 activations, no KV cache */
        return zs_err(ZS_EINVAL, "--kv-dtype %s: training uses no KV cache (only f32 is accepted)", ef.kv_dtype);
    if (ef.kv_bytes != -1 || ef.kv_offload || ef.kv_prefix_bytes != -1)
        return zs_err(ZS_EINVAL, "--kv-bytes / --kv-offload: training uses no KV cache");
    /* a full fine-tune needs the training layout (every table sharded, model.h); LoRA trains over
     * the base exactly as it is served (an inference model, any weight dtype) */
    eo.model.embed_lookup = lora ? 1 : 0;
    eo.spmd = 1; /* under mpirun every process trains its ranks' share of every step */
    if (!zs_cluster_follower() && !lora) {
        const char *where = ooff == ZS_OFFLOAD_NVME ? onv : "host memory";
        fprintf(stderr, "train: precision %s (%s), optimizer state (fp32 masters, m, v) in %s%s%s\n",
                zs_precision_name(prec),
                prec == ZS_PREC_FP16   ? (fo.scaler.dynamic ? "dynamic loss scaling" : "static loss scale")
                : prec == ZS_PREC_BF16 ? "bf16 gradients on the wire"
                : prec == ZS_PREC_FP32 ? "fp32 gradients"
                                       : "weights as the engine stores them, fp32 gradients",
                where, ooff == ZS_OFFLOAD_NVME ? " (sub-groups streamed through pinned buffers)" : "",
                fo.save_16bit ? "; 16-bit consolidated saves" : "");
    }
    zs_engine *e;
    ZS_CHECK(zs_engine_open(&eo, &e));
    fo.data_path = data_path;
    fo.out_dir = out;
    fo.chat_template = zs_model_chat_template_detect(ef.model);
    fo.epochs = epochs;
    fo.steps = steps;
    fo.batch = batch;
    fo.grad_accum = accum;
    fo.seq_len = seq_len;
    fo.warmup = warmup;
    fo.lr = lr;
    fo.clip = clip;
    fo.weight_decay = wd;
    fo.seed = seed;
    if (lora) {
        fo.lora = &lp;
        fo.base_name = ef.model;
    }
    if (save_every < 0) {
        zs_engine_free(e);
        return zs_err(ZS_EINVAL, "--save-every must be >= 0");
    }
    static char ckbuf[4200];
    if (!ckpt_dir && !resume) {
        snprintf(ckbuf, sizeof ckbuf, "%s.checkpoints", out);
        ckpt_dir = ckbuf;
    }
    fo.ckpt_dir = resume ? resume : ckpt_dir;
    fo.save_every = save_every;
    fo.resume = resume != NULL;
    if (resume) {
        struct stat sb;
        if (stat(resume, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
            zs_engine_free(e);
            return zs_err(ZS_ENOTFOUND, "--resume %s: no such checkpoint directory", resume);
        }
    }
    progress g = {every, zs_now(), 0, schedule, lr, batch, accum, bar, 0, prec == ZS_PREC_FP16, NULL, NULL, 0, 0};
    zs_finetune_hooks h = {on_plan, NULL, on_step, NULL, NULL, &g};
    zs_finetune_result res;
    /* several processes: process 0 reports */
    int rc = zs_finetune_run(e, &fo, zs_cluster_follower() ? NULL : &h, &res);
    if (rc == 0 && !zs_cluster_follower()) {
        fprintf(stderr, "train: loss %.4f -> %.4f; wrote %s\n", res.first_loss, res.last_loss, out);
        if (!lora)
            fprintf(stderr, "train: memory: optimizer state %.1f MiB (%.1f MiB of it in host memory), peak resident "
                            "%.1f MiB\n",
                    (double)res.mem_optimizer / 1048576.0 + (double)res.mem_params / 1048576.0,
                    (double)res.mem_optimizer_host / 1048576.0, (double)zs_peak_rss_bytes() / 1048576.0);
        if (g.nt > 0)
            fprintf(stderr, "train: step time median %.4f s, of it the optimizer %.4f s (%ld steps)\n",
                    zs_bench_median(g.st, (int)g.nt), zs_bench_median(g.ot, (int)g.nt), g.nt);
        if (prec == ZS_PREC_FP16)
            fprintf(stderr, "train: fp16: loss scale %g at the end, %ld step(s) skipped for overflows\n", res.loss_scale,
                    res.skipped_steps);
    }
    free(g.st);
    free(g.ot);
    zs_engine_free(e);
    return rc;
}

/* `zeroserve export --checkpoint DIR --out HF_DIR [--model BASE]`: consolidates the ranks'
 * shards of a training checkpoint into a plain Hugging Face model directory. */
int zs_cmd_export(int argc, char **argv);
int zs_cmd_export_merge(int argc, char **argv); /* export-cmd.c */
int zs_cmd_export(int argc, char **argv) {
    for (int i = 0; i < argc; i++) /* export --merge: an adapter merged into its base (export-cmd.c) */
        if (!strcmp(argv[i], "--merge")) return zs_cmd_export_merge(argc, argv);
    const char *ckpt = NULL, *out = NULL, *model = NULL, *dtype = NULL;
    zs_opt opts[] = {
        {"dtype", ZS_OPT_STR, &dtype, "f32 | bf16 | f16: the written weights' dtype (default: the base model's)"},
        {"checkpoint", ZS_OPT_STR, &ckpt, "checkpoint directory (a run's, following `latest`, or one step's)  [required]"},
        {"out", ZS_OPT_STR, &out, "output model directory  [required]"},
        {"model", ZS_OPT_STR, &model, "the base model directory (default: the one the checkpoint records)"},
    };
    int n_opts = sizeof opts / sizeof opts[0];
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            zs_cli_usage("export", "Writes a training checkpoint as a Hugging Face model directory (export --merge --help: a LoRA adapter merged into its base).", opts, n_opts);
            return 0;
        }
    ZS_CHECK(zs_cli_parse(argc, argv, opts, n_opts));
    if (!ckpt || !out) return zs_err(ZS_EINVAL, "--checkpoint and --out are required");
    zs_dtype odt = ZS_DTYPE_COUNT;
    if (dtype && (zs_dtype_parse(dtype, &odt) < 0 || (odt != ZS_F32 && odt != ZS_F16 && odt != ZS_BF16)))
        return zs_err(ZS_EINVAL, "--dtype: '%s' is not one of f32, bf16, f16", dtype);
    zs_ckpt *c;
    ZS_CHECK(zs_ckpt_open(ckpt, &c));
    char base[4096];
    snprintf(base, sizeof base, "%s", model ? model : zs_ckpt_model_dir(c) ? zs_ckpt_model_dir(c) : "");
    /* the base is opened in the dtype the run stored its weights in (the checkpoint's bucket sizes) */
    zs_dtype wdt = ZS_DTYPE_COUNT;
    json_t *mj = json_loads(zs_ckpt_meta(c), 0, NULL);
    const char *ws = json_string_value(json_object_get(mj, ZS_CKPT_WDTYPE_KEY));
    if (ws && zs_dtype_parse(ws, &wdt) < 0) wdt = ZS_DTYPE_COUNT;
    json_decref(mj);
    zs_ckpt_close(c);
    if (!base[0]) return zs_err(ZS_EINVAL, "%s records no model directory: give --model", ckpt);
    zs_engine_opts eo;
    zs_engine_opts_default(&eo);
    eo.model.weight_dtype = wdt;
    eo.model_dir = base;
    eo.max_seqs = 1;
    eo.model.embed_lookup = 0; /* the checkpoint's shards are in the training layout */
    zs_engine *e;
    ZS_CHECK(zs_engine_open(&eo, &e));
    zs_train_opts to;
    memset(&to, 0, sizeof to);
    to.micro_batch = 1;
    to.seq_len = 2;
    to.grad_accum = 1;
    zs_adamw_params_default(&to.adam);
    to.lr.lr = to.adam.lr;
    zs_training *t = NULL;
    long step = 0;
    int rc = zs_training_begin(zs_engine_world(e), &to, &t);
    if (rc == 0) rc = zs_training_load(t, ckpt, &step, NULL);
    if (rc == 0) rc = zs_training_export_dtype(t, out, odt);
    if (rc == 0) fprintf(stderr, "export: step %ld of %s -> %s\n", step, ckpt, out);
    if (t) zs_training_end(t);
    zs_engine_free(e);
    return rc;
}
