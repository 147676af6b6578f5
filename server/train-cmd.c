/* train-cmd.c — `zeroserve train`: fine-tunes a model on a JSONL file through the engine's ranks
 * (ZeRO-3, optimizer state in host memory), prints progress, and writes the result as a plain
 * Hugging Face model directory that `generate` and `serve` load; with --lora / --lora-r, trains a
 * LoRA adapter over the frozen base instead (any --weight-dtype, quantized = QLoRA) and writes it
 * in PEFT's format. The run itself is engine/finetune.c (shared with the server's fine-tuning
 * jobs). */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "chat.h"
#include "ckpt.h"
#include "train.h"
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
} progress;

static void on_plan(void *ud, const zs_finetune_plan *p) {
    progress *g = ud;
    g->step_tokens = (size_t)p->ranks * (size_t)g->accum * (size_t)g->batch * (size_t)p->seq_len;
    fprintf(stderr, "train: %d examples (%zu tokens), %ld step(s) of %d rank(s), %d tokens per sequence, lr %g (%s)\n",
            p->examples, p->tokens, p->steps, p->ranks, p->seq_len, (double)g->lr, g->schedule);
    g->t0 = zs_now();
}

static void on_step(void *ud, long s, long steps, float loss, float lr, size_t tokens) {
    progress *g = ud;
    (void)tokens;
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
    float lora_alpha = -1.0f, lora_dropout = -1.0f; /* -1: not given */
    const char *lora_targets = NULL;
    zs_engine_flags ef;
    zs_engine_flags_init(&ef);
    zs_opt opts[26 + ZS_ENGINE_FLAG_COUNT] = {
        {"data", ZS_OPT_STR, &data_path, "training data, JSONL: {text} | {prompt, completion} | {messages}  [required]"},
        {"out", ZS_OPT_STR, &out, "output model directory (Hugging Face layout)  [required]"},
        {"epochs", ZS_OPT_INT, &epochs, "passes over the data (default 1)"},
        {"steps", ZS_OPT_INT, &steps, "optimizer steps (default: as many as the epochs take)"},
        {"lr", ZS_OPT_FLOAT, &lr, "peak learning rate (default 1e-4)"},
        {"schedule", ZS_OPT_STR, &schedule, "constant | linear | cosine (after --warmup steps; default constant)"},
        {"warmup", ZS_OPT_INT, &warmup, "linear warm-up steps (default 0)"},
        {"batch-size", ZS_OPT_INT, &batch, "sequences per rank and micro-step (default 4)"},
        {"grad-accum", ZS_OPT_INT, &accum, "micro-steps per optimizer step (default 1)"},
        {"seq-len", ZS_OPT_INT, &seq_len, "tokens per sequence (default: the longest example, up to the context)"},
        {"clip", ZS_OPT_FLOAT, &clip, "global gradient-norm clipping, 0 = off (default 1.0)"},
        {"weight-decay", ZS_OPT_FLOAT, &wd, "AdamW weight decay (default 0)"},
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
    int n_opts = zs_engine_flags_table(&ef, opts, 24);
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            zs_cli_usage("train", "Fine-tunes a model on a JSONL file and writes the result as a model directory.", opts, n_opts);
            return 0;
        }
    ZS_CHECK(zs_cli_parse(argc, argv, opts, n_opts));
    if (!ef.model) return zs_err(ZS_EINVAL, "--model is required");
    if (!data_path) return zs_err(ZS_EINVAL, "--data is required");
    if (!out) return zs_err(ZS_EINVAL, "--out is required");
    if (epochs < 1 || steps < 0 || batch < 1 || accum < 1 || seq_len < 0 || warmup < 0 || every < 1)
        return zs_err(ZS_EINVAL, "--epochs, --batch-size, --grad-accum and --log-every must be >= 1; --steps, --seq-len, --warmup >= 0");
    if (!(lr > 0) || clip < 0 || wd < 0) return zs_err(ZS_EINVAL, "--lr must be > 0; --clip and --weight-decay >= 0");
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
    zs_finetune_opts fo;
    zs_finetune_opts_default(&fo);
    if (!strcmp(schedule, "constant")) fo.schedule = ZS_LR_CONSTANT;
    else if (!strcmp(schedule, "linear")) fo.schedule = ZS_LR_WARMUP_LINEAR;
    else if (!strcmp(schedule, "cosine")) fo.schedule = ZS_LR_WARMUP_COSINE;
    else return zs_err(ZS_EINVAL, "--schedule: '%s' is not one of constant, linear, cosine", schedule);

    /* validate the data first: a bad line stops here, before anything is loaded or written */
    int n_examples;
    ZS_CHECK(zs_data_validate(data_path, 0, &n_examples));
    zs_engine_opts eo;
    zs_engine_opts_default(&eo);
    eo.max_seqs = 1;
    ZS_CHECK(zs_engine_flags_apply(&ef, &eo));
    if (eo.kv_dtype != ZS_F32) /* training's attention keeps its own f32 activations, no KV cache */
        return zs_err(ZS_EINVAL, "--kv-dtype %s: training uses no KV cache (only f32 is accepted)", ef.kv_dtype);
    /* a full fine-tune needs the training layout (every table sharded, model.h); LoRA trains over
     * the base exactly as it is served (an inference model, any weight dtype) */
    eo.model.embed_lookup = lora ? 1 : 0;
    eo.spmd = 1; /* under mpirun every process trains its ranks' share of every step */
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
    if (save_every < 0) return zs_err(ZS_EINVAL, "--save-every must be >= 0");
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
        if (stat(resume, &sb) != 0 || !S_ISDIR(sb.st_mode))
            return zs_err(ZS_ENOTFOUND, "--resume %s: no such checkpoint directory", resume);
    }
    progress g = {every, zs_now(), 0, schedule, lr, batch, accum, bar, 0};
    zs_finetune_hooks h = {on_plan, NULL, on_step, NULL, &g};
    zs_finetune_result res;
    /* several processes: process 0 reports */
    int rc = zs_finetune_run(e, &fo, zs_cluster_follower() ? NULL : &h, &res);
    if (rc == 0 && !zs_cluster_follower()) fprintf(stderr, "train: loss %.4f -> %.4f; wrote %s\n", res.first_loss, res.last_loss, out);
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
    const char *ckpt = NULL, *out = NULL, *model = NULL;
    zs_opt opts[] = {
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
    zs_ckpt *c;
    ZS_CHECK(zs_ckpt_open(ckpt, &c));
    char base[4096];
    snprintf(base, sizeof base, "%s", model ? model : zs_ckpt_model_dir(c) ? zs_ckpt_model_dir(c) : "");
    zs_ckpt_close(c);
    if (!base[0]) return zs_err(ZS_EINVAL, "%s records no model directory: give --model", ckpt);
    zs_engine_opts eo;
    zs_engine_opts_default(&eo);
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
    if (rc == 0) rc = zs_training_export(t, out);
    if (rc == 0) fprintf(stderr, "export: step %ld of %s -> %s\n", step, ckpt, out);
    if (t) zs_training_end(t);
    zs_engine_free(e);
    return rc;
}
