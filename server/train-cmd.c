/* train-cmd.c — `zeroserve train`: fine-tunes a model on a JSONL file through the engine's ranks
 * (ZeRO-3, optimizer state in host memory), prints progress, and writes the result as a plain
 * Hugging Face model directory that `generate` and `serve` load. */
#include <stdio.h>
#include <string.h>

#include "chat.h"
#include "cli.h"
#include "common.h"
#include "data.h"
#include "engine-flags.h"
#include "train.h"

int zs_cmd_train(int argc, char **argv);

static void fmt_time(double s, char *buf, size_t cap) {
    long t = (long)(s + 0.5);
    snprintf(buf, cap, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
}

int zs_cmd_train(int argc, char **argv) {
    const char *data_path = NULL, *out = NULL, *schedule = "constant";
    int epochs = 1, steps = 0, batch = 4, accum = 1, seq_len = 0, warmup = 0, every = 1;
    float lr = 1e-4f, clip = 1.0f, wd = 0.0f;
    uint64_t seed = 0;
    zs_engine_flags ef;
    zs_engine_flags_init(&ef);
    zs_opt opts[20 + ZS_ENGINE_FLAG_COUNT] = {
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
    };
    int n_opts = zs_engine_flags_table(&ef, opts, 14);
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
    int sched;
    if (!strcmp(schedule, "constant")) sched = ZS_LR_CONSTANT;
    else if (!strcmp(schedule, "linear")) sched = ZS_LR_WARMUP_LINEAR;
    else if (!strcmp(schedule, "cosine")) sched = ZS_LR_WARMUP_COSINE;
    else return zs_err(ZS_EINVAL, "--schedule: '%s' is not one of constant, linear, cosine", schedule);

    /* validate the data first: a bad line stops here, before anything is loaded or written */
    int n_examples;
    ZS_CHECK(zs_data_validate(data_path, 0, &n_examples));
    zs_engine_opts eo;
    zs_engine_opts_default(&eo);
    eo.max_seqs = 1;
    ZS_CHECK(zs_engine_flags_apply(&ef, &eo));
    zs_engine *e;
    ZS_CHECK(zs_engine_open(&eo, &e));
    zs_dataset *d = NULL;
    zs_training *t = NULL;
    int32_t *buf = NULL;
    int rc;
    zs_data_opts dopt = {zs_chat_template_detect(ef.model), 0, 0};
    if ((rc = zs_data_load(data_path, zs_engine_tokenizer(e), &dopt, &d)) < 0) goto done;
    int ranks = zs_world_ranks(zs_engine_world(e));
    int ctx = zs_engine_context(e);
    if (seq_len == 0) seq_len = (int)ZS_MIN((size_t)ctx, ZS_MAX((size_t)2, zs_data_max_len(d)));
    if (seq_len > ctx) {
        rc = zs_err(ZS_ERANGE, "--seq-len %d exceeds the model's context %d", seq_len, ctx);
        goto done;
    }
    long per_epoch = (zs_data_batches_per_epoch(d, batch) + (long)ranks * accum - 1) / ((long)ranks * accum);
    if (steps == 0) steps = (int)ZS_MAX(1, per_epoch * epochs);
    zs_train_opts to;
    memset(&to, 0, sizeof to);
    to.micro_batch = batch;
    to.seq_len = seq_len;
    to.grad_accum = accum;
    to.grad_clip = clip;
    zs_adamw_params_default(&to.adam);
    to.adam.lr = lr;
    to.adam.weight_decay = wd;
    to.lr.type = sched;
    to.lr.warmup_type = ZS_WARMUP_LINEAR;
    to.lr.lr = lr;
    to.lr.warmup_min_ratio = 0.0f;
    to.lr.min_lr_ratio = 0.0f;
    to.lr.warmup_steps = warmup;
    to.lr.total_steps = steps;
    if ((rc = zs_training_begin(zs_engine_world(e), &to, &t)) < 0) goto done;
    int slots = ranks * accum;
    size_t bt = (size_t)batch * (size_t)seq_len;
    buf = malloc(sizeof(int32_t) * bt * 2 * (size_t)slots);
    const int32_t *T[512], *G[512];
    if (!buf || slots > 512) {
        rc = zs_err(ZS_ENOMEM, "out of memory (or more than 512 ranks x micro-steps)");
        goto done;
    }
    for (int i = 0; i < slots; i++) {
        T[i] = buf + (size_t)i * 2 * bt;
        G[i] = T[i] + bt;
    }
    fprintf(stderr, "train: %d examples (%zu tokens), %d step(s) of %d rank(s) x %d micro-step(s) x %d x %d tokens, lr %g (%s)\n",
            zs_data_count(d), zs_data_tokens(d), steps, ranks, accum, batch, seq_len, (double)lr, schedule);
    zs_data_pos pos = {seed, 0, 0};
    double t0 = zs_now(), first = -1, loss_avg = 0;
    for (int s = 1; s <= steps; s++) {
        for (int i = 0; i < slots; i++) {
            int filled;
            if ((rc = zs_data_next_batch(d, &pos, batch, seq_len, (int32_t *)T[i], (int32_t *)G[i], &filled)) < 0) goto done;
        }
        float loss;
        if ((rc = zs_training_step(t, T, G, s, &loss)) < 0) goto done;
        if (first < 0) first = loss;
        loss_avg = loss;
        if (s % every == 0 || s == steps) {
            double el = zs_now() - t0, tps = (double)s * (double)slots * (double)bt / el;
            char eta[32];
            fmt_time(el / s * (steps - s), eta, sizeof eta);
            printf("step %d/%d  loss %.4f  lr %.3g  %.0f tokens/s  ETA %s\n", s, steps, loss,
                   (double)zs_lr_at(&to.lr, s), tps, eta);
            fflush(stdout);
        }
    }
    if ((rc = zs_training_export(t, out)) < 0) goto done;
    fprintf(stderr, "train: loss %.4f -> %.4f; wrote %s\n", first, loss_avg, out);
done:
    free(buf);
    if (t) zs_training_end(t);
    zs_data_free(d);
    zs_engine_free(e);
    return rc;
}
