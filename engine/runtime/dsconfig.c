/* dsconfig.c — DeepSpeed-style JSON config (--config FILE) -> zs_zero_opts: a table-driven walk
 * over the known keys that checks types and ranges (messages name the file and the dotted key),
 * reports unknown keys and accepted-but-ignored keys (with what zeroserve does instead) once
 * each, the report of the parsed fields a command does not use (zs_zero_opts_report_unused),
 * and the merge / cross-field / batch-size helpers the CLI uses. See dsconfig.h for the format. */
#include "dsconfig.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"

#define DS_MAX_FILE ((off_t)16 * 1024 * 1024)

/* ------------------------------------------------------------------------------------------ */
/* Key tables                                                                                  */

typedef enum {
    F_IGNORE,  /* known DeepSpeed key without meaning here: any value, reported with desc (what
                  zeroserve does instead) through on_ignored */
    F_BLOCK,   /* nested object (or null) parsed with `sub` */
    F_INT,     /* int in [ilo, ihi] */
    F_I64,     /* int64_t in [ilo, ihi]; DS_POW2 flag: also a power of two */
    F_BOOL,    /* int 0/1; DS_ALIAS: desc is the full dotted name of another spelling of the same
                  field, and a value different from the one it already set is an error */
    F_REQBOOL, /* a boolean that zeroserve supports only with the value ilo; stores nothing */
    F_NUM,     /* float in [dlo, dhi] (DS_LO_OPEN: > dlo) */
    F_STR,     /* char[size]; "" means unset */
    F_CHOICE,  /* one of choices[] (case-insensitive): int index, or (DS_AS_STRING) the name */
    F_BETAS,   /* [beta1, beta2], each in [0, 1) */
} ds_kind;

enum { DS_POW2 = 1u, DS_LO_OPEN = 2u, DS_AS_STRING = 4u, DS_ALIAS = 8u };

/* Scheduler types, in zs_lr_sched order (index == enum value). */
static const char *const ds_sched_names[] = {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR", NULL};
#define S_WL (1u << ZS_LR_CONSTANT)
#define S_WD (1u << ZS_LR_WARMUP_LINEAR)
#define S_WC (1u << ZS_LR_WARMUP_COSINE)

static const char *const ds_offload_names[] = {"none", "cpu", "nvme", NULL};
static const char *const ds_optim_names[] = {"Adam", "AdamW", NULL};
static const char *const ds_warmup_names[] = {"linear", "log", NULL};

struct ds_block;

typedef struct {
    const char *key;
    ds_kind kind;
    size_t off;   /* offset of the destination in zs_zero_opts */
    size_t size;  /* F_STR / F_CHOICE with DS_AS_STRING: destination size */
    int64_t ilo, ihi;
    double dlo, dhi;
    unsigned flags;
    unsigned sched; /* scheduler.params only: scheduler types defining this key (0 = all) */
    const char *desc; /* "expected <desc>"; F_REQBOOL: why only one value is supported;
                         F_IGNORE: what zeroserve does instead; F_BOOL + DS_ALIAS: the other key */
    const char *const *choices;
    const struct ds_block *sub;
} ds_field;

typedef struct ds_block {
    const ds_field *fields;
    size_t n;
    const char *first; /* key processed before the others (scheduler.type), or NULL */
} ds_block;

#define OFF(f) offsetof(zs_zero_opts, f)
#define IGN(k, instead) {.key = k, .kind = F_IGNORE, .desc = instead}
#define BLK(k, b) {.key = k, .kind = F_BLOCK, .sub = &b}
#define INT(k, f, lo, hi, d)                                                                     \
    {.key = k, .kind = F_INT, .off = OFF(f), .ilo = lo, .ihi = hi, .desc = d}
#define I64(k, f, lo, hi, d)                                                                     \
    {.key = k, .kind = F_I64, .off = OFF(f), .ilo = lo, .ihi = hi, .desc = d}
#define BOOL(k, f) {.key = k, .kind = F_BOOL, .off = OFF(f)}
#define ALIAS(k, f, other)                                                                       \
    {.key = k, .kind = F_BOOL, .off = OFF(f), .flags = DS_ALIAS, .desc = other}
#define REQB(k, v, why) {.key = k, .kind = F_REQBOOL, .ilo = v, .desc = why}
#define NUM(k, f, lo, hi, fl, d)                                                                 \
    {.key = k, .kind = F_NUM, .off = OFF(f), .dlo = lo, .dhi = hi, .flags = fl, .desc = d}
#define STR(k, f) {.key = k, .kind = F_STR, .off = OFF(f), .size = sizeof(((zs_zero_opts *)0)->f)}
#define CHOICE(k, f, names) {.key = k, .kind = F_CHOICE, .off = OFF(f), .choices = names}
#define N(a) (sizeof a / sizeof a[0])

static const ds_field ds_offp_fields[] = {
    CHOICE("device", offload_param, ds_offload_names),
    STR("nvme_path", nvme_path),
    BOOL("pin_memory", pin_memory),
    INT("buffer_count", buffer_count, 1, INT_MAX, "a positive integer"),
    I64("buffer_size", buffer_size, 1, INT64_MAX, "a positive integer"),
    IGN("max_in_cpu", "with device nvme the parameters stay in the shard file: host memory holds "
        "only the read slots (offload_param.buffer_count) and the gathered layers"),
};
static const ds_block ds_offp = {ds_offp_fields, N(ds_offp_fields), NULL};

#define DS_PIPELINED                                                                             \
    "the NVMe optimizer step always pipelines: reads run up to buffer_count - 1 sub-groups "      \
    "ahead and each sub-group is written back behind its update"
#define DS_G16 "zero_optimization.stage3_gather_16bit_weights_on_model_save"
#define DS_GF16 "zero_optimization.stage3_gather_fp16_weights_on_model_save"

static const ds_field ds_offo_fields[] = {
    CHOICE("device", offload_optimizer, ds_offload_names),
    STR("nvme_path", optimizer_nvme_path),
    BOOL("pin_memory", optimizer_pin_memory),
    INT("buffer_count", optimizer_buffer_count, 1, INT_MAX, "a positive integer"),
    IGN("fast_init", "the NVMe optimizer file is created when training begins (there is one "
        "initialization path)"),
    IGN("pipeline", DS_PIPELINED), IGN("pipeline_read", DS_PIPELINED),
    IGN("pipeline_write", DS_PIPELINED),
    IGN("ratio", "the whole optimizer state is where offload_optimizer.device puts it (no partial "
        "offload)"),
};
static const ds_block ds_offo = {ds_offo_fields, N(ds_offo_fields), NULL};

static const ds_field ds_zero_fields[] = {
    INT("stage", zero_stage, 0, 3, "an integer 0..3"),
    BLK("offload_param", ds_offp),
    BLK("offload_optimizer", ds_offo),
    I64("stage3_prefetch_bucket_size", prefetch_bucket_size, 0, INT64_MAX,
        "a non-negative integer"),
    I64("stage3_max_live_parameters", max_live_parameters, 1, INT64_MAX, "a positive integer"),
    I64("stage3_param_persistence_threshold", param_persistence_threshold, 0, INT64_MAX,
        "a non-negative integer"),
    I64("sub_group_size", sub_group_size, 1, INT64_MAX, "a positive integer"),
    ALIAS("stage3_gather_16bit_weights_on_model_save", gather_16bit_on_save, DS_GF16),
    ALIAS("stage3_gather_fp16_weights_on_model_save", gather_16bit_on_save, DS_G16),
    IGN("overlap_comm", "layers are gathered ahead by a prefetch thread, and each layer's "
        "gradient is reduce-scattered as soon as its backward produces it"),
    IGN("contiguous_gradients", "each layer's gradient is copied into one contiguous buffer for "
        "its reduction, and each rank keeps one contiguous fp32 shard of it"),
    IGN("reduce_bucket_size", "each bucket (one layer) is one reduction"),
    IGN("reduce_scatter", "stages 2 and 3 always reduce-scatter the gradients; stage 1 "
        "all-reduces them"),
    IGN("allgather_partitions", "updated partitions are all-gathered bucket by bucket (stages 1 "
        "and 2 after each step; stage 3 gathers each layer when it is used)"),
    IGN("allgather_bucket_size", "each bucket (one layer) is one all-gather"),
    IGN("round_robin_gradients", "each rank owns the same contiguous slice of every bucket's "
        "gradient"),
    IGN("stage3_max_reuse_distance", "a layer's full parameters are released after each use and "
        "gathered again for the backward (experts stay cached within --expert-cache-bytes)"),
    IGN("ignore_unused_parameters", "a parameter without a gradient is never an error: an expert "
        "that no token chose is left alone by AdamW"),
    IGN("elastic_checkpoint", "checkpoints always load with any rank count"),
    IGN("load_from_fp32_weights", "a resume always loads the fp32 master shards from the "
        "checkpoint"),
};
static const ds_block ds_zero = {ds_zero_fields, N(ds_zero_fields), NULL};

static const ds_field ds_aio_fields[] = {
    {.key = "block_size", .kind = F_I64, .off = OFF(aio_block_size), .ilo = 4096,
     .ihi = 64 << 20, .flags = DS_POW2, .desc = "a power of two from 4096 to 67108864"},
    INT("queue_depth", aio_queue_depth, 1, 4096, "an integer 1..4096"),
    IGN("thread_count", "each rank reads its shard file through one io_uring with "
        "aio.queue_depth requests in flight"),
    IGN("single_submit", "reads are submitted in batches that fill aio.queue_depth"),
    IGN("overlap_events", "completions are reaped and new reads submitted in one loop: they "
        "always overlap"),
    IGN("intra_op_parallelism", "one io_uring per rank; aio.queue_depth sets the parallelism"),
    IGN("use_gds", "no GPUDirect Storage: NVMe reads land in pinned host slots (then are copied "
        "to the GPU, if there is one)"),
};
static const ds_block ds_aio = {ds_aio_fields, N(ds_aio_fields), NULL};

static const ds_field ds_bf16_fields[] = {BOOL("enabled", bf16)};
static const ds_block ds_bf16 = {ds_bf16_fields, N(ds_bf16_fields), NULL};

static const ds_field ds_fp16_fields[] = {
    BOOL("enabled", fp16),
    NUM("loss_scale", loss_scale, 0, HUGE_VAL, 0, "a number >= 0 (0: dynamic)"),
    INT("initial_scale_power", initial_scale_power, 0, 64, "an integer 0..64"),
    INT("loss_scale_window", loss_scale_window, 1, INT_MAX, "a positive integer"),
    INT("hysteresis", hysteresis, 1, INT_MAX, "a positive integer"),
    BOOL("consecutive_hysteresis", consecutive_hysteresis),
    NUM("min_loss_scale", min_loss_scale, 0, HUGE_VAL, DS_LO_OPEN, "a number > 0"),
    IGN("auto_cast", "the CPU backend computes in fp32 and casts the gradients to fp16 for the "
        "wire"),
};
static const ds_block ds_fp16 = {ds_fp16_fields, N(ds_fp16_fields), NULL};

static const ds_field ds_optp_fields[] = {
    NUM("lr", lr, 0, HUGE_VAL, 0, "a number >= 0"),
    {.key = "betas", .kind = F_BETAS},
    NUM("eps", eps, 0, HUGE_VAL, DS_LO_OPEN, "a number > 0"),
    NUM("weight_decay", weight_decay, 0, HUGE_VAL, 0, "a number >= 0"),
    REQB("adam_w_mode", 1, "zeroserve implements only decoupled weight decay (AdamW)"),
    REQB("amsgrad", 0, "zeroserve does not implement AMSGrad"),
    REQB("bias_correction", 1, "zeroserve always applies Adam bias correction"),
    IGN("torch_adam", "zeroserve runs its own AdamW (fp32, on the host) over each rank's master "
        "shards"),
};
static const ds_block ds_optp = {ds_optp_fields, N(ds_optp_fields), NULL};

static const ds_field ds_opt_fields[] = {
    {.key = "type", .kind = F_CHOICE, .off = OFF(optimizer_type),
     .size = sizeof(((zs_zero_opts *)0)->optimizer_type), .flags = DS_AS_STRING,
     .choices = ds_optim_names},
    BLK("params", ds_optp),
};
static const ds_block ds_opt = {ds_opt_fields, N(ds_opt_fields), NULL};

static const ds_field ds_schedp_fields[] = {
    INT("warmup_num_steps", warmup_steps, 0, INT_MAX, "a non-negative integer"),
    {.key = "total_num_steps", .kind = F_INT, .off = OFF(total_steps), .ilo = 1, .ihi = INT_MAX,
     .sched = S_WD | S_WC, .desc = "a positive integer"},
    {.key = "warmup_min_lr", .kind = F_NUM, .off = OFF(warmup_min_lr), .dlo = 0, .dhi = HUGE_VAL,
     .sched = S_WL | S_WD, .desc = "a number >= 0"},
    {.key = "warmup_max_lr", .kind = F_NUM, .off = OFF(warmup_max_lr), .dlo = 0, .dhi = HUGE_VAL,
     .sched = S_WL | S_WD, .desc = "a number >= 0"},
    CHOICE("warmup_type", warmup_type, ds_warmup_names),
    {.key = "warmup_min_ratio", .kind = F_NUM, .off = OFF(warmup_min_ratio), .dlo = 0, .dhi = 1,
     .sched = S_WC, .desc = "a number from 0 to 1"},
    {.key = "cos_min_ratio", .kind = F_NUM, .off = OFF(cos_min_ratio), .dlo = 0, .dhi = 1,
     .sched = S_WC, .desc = "a number from 0 to 1"},
    IGN("last_batch_iteration", "the schedule follows the step number (a resume continues from "
        "the checkpoint's step)"),
};
static const ds_block ds_schedp = {ds_schedp_fields, N(ds_schedp_fields), NULL};

static const ds_field ds_sched_fields[] = {
    CHOICE("type", lr_schedule, ds_sched_names),
    BLK("params", ds_schedp),
};
static const ds_block ds_sched = {ds_sched_fields, N(ds_sched_fields), "type"};

#define DS_GRAD_WEIGHT                                                                           \
    "each micro-batch's gradient is weighted once, by its share of the step's counted tokens, "  \
    "before the sum-reduction"
#define DS_NO_TRACKER "no experiment tracker: progress goes to stdout, job events and /metrics"

static const ds_field ds_root_fields[] = {
    BLK("zero_optimization", ds_zero),
    BLK("aio", ds_aio),
    BLK("bf16", ds_bf16),
    BLK("bfloat16", ds_bf16),
    BLK("fp16", ds_fp16),
    BLK("optimizer", ds_opt),
    BLK("scheduler", ds_sched),
    INT("train_micro_batch_size_per_gpu", micro_batch, 1, INT_MAX, "a positive integer"),
    INT("gradient_accumulation_steps", grad_accum, 1, INT_MAX, "a positive integer"),
    NUM("gradient_clipping", grad_clip, 0, HUGE_VAL, 0, "a number >= 0"),
    I64("train_batch_size", train_batch_size, 1, INT64_MAX, "a positive integer"),
    IGN("steps_per_print", "`zeroserve train` prints progress every --log-every steps "
        "(default 1)"),
    IGN("wall_clock_breakdown", "no per-phase timers: progress lines give tokens/s, and "
        "`generate --stats` and /metrics the gather stall time"),
    IGN("zero_allow_untested_optimizer", "only Adam and AdamW exist (optimizer.type), both "
        "tested"),
    IGN("zero_force_ds_cpu_optimizer", "AdamW always runs on the host over the fp32 master "
        "shards"),
    IGN("gradient_predivide_factor", DS_GRAD_WEIGHT), IGN("prescale_gradients", DS_GRAD_WEIGHT),
    IGN("dump_state", "no state dump: `zeroserve train` prints one line with the examples, "
        "steps, ranks, sequence length and LR"),
    IGN("memory_breakdown", "no per-step memory report: `generate --stats` prints the gather's "
        "live bytes, and LoRA fine-tuning jobs report their memory in a job event"),
    IGN("activation_checkpointing", "zeroserve always recomputes each layer's activations in the "
        "backward (one checkpoint per layer)"),
    IGN("flops_profiler", "no FLOPs profiler: `zeroserve bench` measures throughput against "
        "bounds measured in the same run"),
    IGN("tensorboard", DS_NO_TRACKER), IGN("wandb", DS_NO_TRACKER),
    IGN("csv_monitor", DS_NO_TRACKER),
    IGN("comms_logger", "no communication log: /metrics and `generate --stats` count the bytes "
        "read, moved and gathered"),
};
static const ds_block ds_root = {ds_root_fields, N(ds_root_fields), NULL};

/* ------------------------------------------------------------------------------------------ */
/* Value helpers                                                                               */

typedef struct {
    const char *origin;
    zs_dsconfig_unknown_fn on_unknown;
    zs_dsconfig_ignored_fn on_ignored;
    void *ud;
    zs_zero_opts *o;
} ds_ctx;

/* "auto" (Hugging Face) and null both mean "not given". */
static int ds_is_unset(const json_t *v) {
    return json_is_null(v) || (json_is_string(v) && strcmp(json_string_value(v), "auto") == 0);
}

/* A short rendering of a JSON value for messages: -5, 5.5, "gpu", [0.9], {...}. */
static const char *ds_render(const json_t *v, char *buf, size_t n) {
    if (json_is_integer(v)) {
        snprintf(buf, n, "%lld", (long long)json_integer_value(v));
    } else if (json_is_real(v)) {
        snprintf(buf, n, "%.10g", json_real_value(v));
    } else {
        char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_REAL_PRECISION(10));
        if (!s) {
            snprintf(buf, n, "?");
        } else {
            size_t len = strlen(s), max = 60 < n - 1 ? 60 : n - 1;
            if (len > max) snprintf(buf, n, "%.*s...", (int)(max - 3), s);
            else snprintf(buf, n, "%s", s);
            free(s);
        }
    }
    return buf;
}

/* An integer, or an integral real (5e8); 0 on success. */
static int ds_as_int(const json_t *v, int64_t *out) {
    if (json_is_integer(v)) {
        *out = json_integer_value(v);
        return 0;
    }
    if (json_is_real(v)) {
        double d = json_real_value(v);
        /* 9223372036854775808.0 is 2^63, the first double past INT64_MAX. */
        if (isfinite(d) && d == floor(d) && d >= -9223372036854775808.0 &&
            d < 9223372036854775808.0) {
            *out = (int64_t)d;
            return 0;
        }
    }
    return -1;
}

static int ds_bad(const ds_ctx *c, const char *path, const json_t *v, const char *desc) {
    char got[96];
    return zs_err(ZS_EINVAL, "%s: %s: expected %s, got %s", c->origin, path, desc,
                  ds_render(v, got, sizeof got));
}

static void ds_report_unknown(const ds_ctx *c, const char *path) {
    if (c->on_unknown) c->on_unknown(c->ud, c->origin, path);
    else zs_log_warn("%s: ignoring unknown key '%s'", c->origin, path);
}

static void ds_report_ignored(zs_dsconfig_ignored_fn fn, void *ud, const char *origin,
                              const char *key, const char *instead) {
    if (fn) fn(ud, origin, key, instead);
    else zs_log_warn("%s: %s is accepted but not used: %s", origin, key, instead);
}

/* 0/1 from true/false or the integers 0/1; -1 otherwise. */
static int ds_as_bool(const json_t *v) {
    if (json_is_boolean(v)) return json_is_true(v);
    if (json_is_integer(v) && (json_integer_value(v) == 0 || json_integer_value(v) == 1))
        return (int)json_integer_value(v);
    return -1;
}

static int ds_block_parse(ds_ctx *c, json_t *obj, const ds_block *b, const char *prefix);

static int ds_field_parse(ds_ctx *c, const ds_field *f, json_t *v, const char *path) {
    char *dst = (char *)c->o + f->off;
    if (f->kind == F_IGNORE) { /* whatever the value, null and "auto" included */
        ds_report_ignored(c->on_ignored, c->ud, c->origin, path, f->desc);
        return 0;
    }
    if (f->kind == F_BLOCK) {
        if (json_is_null(v)) return 0;
        if (!json_is_object(v)) return ds_bad(c, path, v, "an object");
        return ds_block_parse(c, v, f->sub, path);
    }
    if (ds_is_unset(v)) return 0;
    switch (f->kind) {
    case F_INT:
    case F_I64: {
        int64_t x;
        if (ds_as_int(v, &x) != 0) return ds_bad(c, path, v, f->desc);
        if (x < f->ilo) return ds_bad(c, path, v, f->desc);
        if (x > f->ihi && f->ihi == INT_MAX) { /* descs of int fields give no upper bound */
            char got[96];
            return zs_err(ZS_EINVAL, "%s: %s: expected %s no larger than %lld, got %s",
                          c->origin, path, f->desc, (long long)f->ihi,
                          ds_render(v, got, sizeof got));
        }
        if (x > f->ihi || ((f->flags & DS_POW2) && (x & (x - 1)) != 0))
            return ds_bad(c, path, v, f->desc);
        if (f->kind == F_INT) *(int *)dst = (int)x;
        else *(int64_t *)dst = x;
        return 0;
    }
    case F_BOOL:
    case F_REQBOOL: {
        int b = ds_as_bool(v);
        if (b < 0) return ds_bad(c, path, v, "true or false");
        if (f->kind == F_BOOL) {
            /* two spellings of one setting: the first one seen set it (init leaves -1) */
            if ((f->flags & DS_ALIAS) && *(int *)dst >= 0 && *(int *)dst != b)
                return zs_err(ZS_EINVAL, "%s: %s is %s but %s is %s: they are two spellings of "
                              "one setting; give one", c->origin, path, b ? "true" : "false",
                              f->desc, *(int *)dst ? "true" : "false");
            *(int *)dst = b;
        } else if (b != f->ilo) {
            return zs_err(ZS_EINVAL, "%s: %s: only %s is supported, got %s: %s", c->origin,
                          path, f->ilo ? "true" : "false", b ? "true" : "false", f->desc);
        }
        return 0;
    }
    case F_NUM: {
        if (!json_is_number(v)) return ds_bad(c, path, v, f->desc);
        double d = json_number_value(v);
        float x = (float)d;
        if (!isfinite(d) || !isfinite(x) || x < f->dlo || x > f->dhi ||
            ((f->flags & DS_LO_OPEN) && x <= f->dlo))
            return ds_bad(c, path, v, f->desc);
        *(float *)dst = x;
        return 0;
    }
    case F_STR: {
        if (!json_is_string(v)) return ds_bad(c, path, v, "a string");
        size_t len = json_string_length(v);
        if (len >= f->size) {
            return zs_err(ZS_EINVAL, "%s: %s: expected a string shorter than %zu bytes, got %zu "
                          "bytes", c->origin, path, f->size, len);
        }
        memcpy(dst, json_string_value(v), len + 1); /* "" stays "" = unset */
        return 0;
    }
    case F_CHOICE: {
        const char *s = json_is_string(v) ? json_string_value(v) : NULL;
        for (int i = 0; s && f->choices[i]; i++) {
            if (strcasecmp(s, f->choices[i]) != 0) continue;
            if (f->flags & DS_AS_STRING) snprintf(dst, f->size, "%s", f->choices[i]);
            else *(int *)dst = i;
            return 0;
        }
        char list[160] = "", got[96];
        size_t used = 0;
        for (int i = 0; f->choices[i] && used < sizeof list; i++)
            used += (size_t)snprintf(list + used, sizeof list - used, "%s\"%s\"", i ? ", " : "",
                                     f->choices[i]);
        return zs_err(ZS_EINVAL, "%s: %s: expected one of %s, got %s", c->origin, path, list,
                      ds_render(v, got, sizeof got));
    }
    case F_BETAS: {
        const char *desc = "an array of two numbers in [0, 1)";
        if (!json_is_array(v) || json_array_size(v) != 2) return ds_bad(c, path, v, desc);
        float b[2];
        for (size_t i = 0; i < 2; i++) {
            json_t *e = json_array_get(v, i);
            double d = json_is_number(e) ? json_number_value(e) : -1;
            b[i] = (float)d;
            if (!(d >= 0 && d < 1) || !(b[i] < 1)) return ds_bad(c, path, v, desc);
        }
        c->o->beta1 = b[0];
        c->o->beta2 = b[1];
        return 0;
    }
    default: break;
    }
    ZS_ASSERT(!"unhandled field kind");
    return ZS_EINVAL;
}

static const ds_field *ds_find(const ds_block *b, const char *key) {
    for (size_t i = 0; i < b->n; i++)
        if (strcmp(b->fields[i].key, key) == 0) return &b->fields[i];
    return NULL;
}

static int ds_key_parse(ds_ctx *c, const ds_block *b, const char *prefix, const char *key,
                        json_t *v) {
    char path[512];
    if (prefix[0]) snprintf(path, sizeof path, "%s.%s", prefix, key);
    else snprintf(path, sizeof path, "%s", key);
    const ds_field *f = ds_find(b, key);
    /* scheduler.params: a key the chosen scheduler type does not define counts as unknown. */
    if (f && f->sched && c->o->lr_schedule >= 0 && !(f->sched & (1u << c->o->lr_schedule)))
        f = NULL;
    if (!f) {
        ds_report_unknown(c, path);
        return 0;
    }
    return ds_field_parse(c, f, v, path);
}

static int ds_block_parse(ds_ctx *c, json_t *obj, const ds_block *b, const char *prefix) {
    json_t *first = b->first ? json_object_get(obj, b->first) : NULL;
    if (first) ZS_CHECK(ds_key_parse(c, b, prefix, b->first, first));
    const char *key;
    json_t *v;
    json_object_foreach(obj, key, v) {
        if (first && strcmp(key, b->first) == 0) continue;
        ZS_CHECK(ds_key_parse(c, b, prefix, key, v));
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Public API                                                                                  */

void zs_zero_opts_init(zs_zero_opts *o) {
    memset(o, 0, sizeof *o);
    o->zero_stage = -1;
    o->offload_param = -1;
    o->pin_memory = -1;
    o->offload_optimizer = -1;
    o->prefetch_bucket_size = -1;
    o->max_live_parameters = -1;
    o->param_persistence_threshold = -1;
    o->bf16 = o->fp16 = -1;
    o->lr = o->beta1 = o->beta2 = o->eps = o->weight_decay = NAN;
    o->lr_schedule = -1;
    o->warmup_type = -1;
    o->warmup_steps = -1;
    o->total_steps = -1;
    o->warmup_min_lr = o->warmup_max_lr = o->warmup_min_ratio = o->cos_min_ratio = NAN;
    o->grad_clip = NAN;
    o->loss_scale = o->min_loss_scale = NAN;
    o->initial_scale_power = -1;
    o->consecutive_hysteresis = -1;
    o->optimizer_pin_memory = -1;
    o->gather_16bit_on_save = -1;
}

void zs_zero_opts_merge(zs_zero_opts *dst, const zs_zero_opts *src) {
#define M_NEG(f) if (src->f >= 0) dst->f = src->f
#define M_POS(f) if (src->f > 0) dst->f = src->f
#define M_NUM(f) if (!isnan(src->f)) dst->f = src->f
#define M_STR(f) if (src->f[0]) memcpy(dst->f, src->f, sizeof dst->f)
    M_NEG(zero_stage);
    M_NEG(offload_param);
    M_STR(nvme_path);
    M_NEG(pin_memory);
    M_POS(buffer_count);
    M_POS(buffer_size);
    M_NEG(offload_optimizer);
    M_STR(optimizer_nvme_path);
    M_NEG(prefetch_bucket_size);
    M_NEG(max_live_parameters);
    M_NEG(param_persistence_threshold);
    M_POS(aio_block_size);
    M_POS(aio_queue_depth);
    M_NEG(bf16);
    M_NEG(fp16);
    M_STR(optimizer_type);
    M_NUM(lr);
    M_NUM(beta1);
    M_NUM(beta2);
    M_NUM(eps);
    M_NUM(weight_decay);
    M_NEG(lr_schedule);
    M_NEG(warmup_type);
    M_NEG(warmup_steps);
    M_NEG(total_steps);
    M_NUM(warmup_min_lr);
    M_NUM(warmup_max_lr);
    M_NUM(warmup_min_ratio);
    M_NUM(cos_min_ratio);
    M_POS(micro_batch);
    M_POS(grad_accum);
    M_NUM(grad_clip);
    M_POS(train_batch_size);
    M_NUM(loss_scale);
    M_NEG(initial_scale_power);
    M_POS(loss_scale_window);
    M_POS(hysteresis);
    M_NEG(consecutive_hysteresis);
    M_NUM(min_loss_scale);
    M_NEG(optimizer_pin_memory);
    M_POS(optimizer_buffer_count);
    M_POS(sub_group_size);
    M_NEG(gather_16bit_on_save);
#undef M_NEG
#undef M_POS
#undef M_NUM
#undef M_STR
}

int zs_zero_opts_check(const zs_zero_opts *o, const char *origin) {
    if (!o) return zs_err(ZS_EINVAL, "zs_zero_opts_check: NULL argument");
    if (!origin) origin = "options";
    if (o->offload_param == ZS_OFFLOAD_NVME && !o->nvme_path[0])
        return zs_err(ZS_EINVAL, "%s: zero_optimization.offload_param.nvme_path: required when "
                      "offload_param.device is \"nvme\"", origin);
    if (o->offload_optimizer == ZS_OFFLOAD_NVME && !o->optimizer_nvme_path[0])
        return zs_err(ZS_EINVAL, "%s: zero_optimization.offload_optimizer.nvme_path: required "
                      "when offload_optimizer.device is \"nvme\"", origin);
    if ((o->offload_param == ZS_OFFLOAD_CPU || o->offload_param == ZS_OFFLOAD_NVME) &&
        o->zero_stage >= 0 && o->zero_stage != 3)
        return zs_err(ZS_EINVAL, "%s: zero_optimization.offload_param: parameter offload "
                      "(device \"%s\") requires zero_optimization.stage 3, got stage %d", origin,
                      zs_offload_name(o->offload_param), o->zero_stage);
    if (o->bf16 == 1 && o->fp16 == 1)
        return zs_err(ZS_EINVAL, "%s: bf16.enabled and fp16.enabled are both true; enable at "
                      "most one", origin);
    if (o->total_steps >= 0 && o->warmup_steps >= 0 && o->total_steps < o->warmup_steps)
        return zs_err(ZS_EINVAL, "%s: scheduler.params.total_num_steps: must be at least "
                      "warmup_num_steps (%d), got %d", origin, o->warmup_steps, o->total_steps);
    if (o->zero_stage > 3 || o->offload_param > ZS_OFFLOAD_NVME ||
        o->offload_optimizer > ZS_OFFLOAD_NVME || o->lr_schedule > ZS_LR_WARMUP_COSINE ||
        o->warmup_type > ZS_WARMUP_LOG || o->initial_scale_power > 64 ||
        o->consecutive_hysteresis > 1 || o->optimizer_pin_memory > 1 ||
        o->gather_16bit_on_save > 1 || o->loss_scale < 0 || o->min_loss_scale <= 0 ||
        o->loss_scale_window < 0 || o->hysteresis < 0 || o->optimizer_buffer_count < 0 ||
        o->sub_group_size < 0)
        return zs_err(ZS_EINVAL, "%s: option value out of range", origin);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Fields a command does not use (zs_zero_opts_report_unused)                                  */

typedef enum { U_INT_NEG, U_INT_POS, U_I64_NEG, U_I64_POS, U_FLT, U_STR, U_BETAS } u_set;
typedef enum {
    UC_ENGINE, /* used by every command that opens an engine */
    UC_TRAIN,  /* used by `zeroserve train` only */
    UC_TJ,     /* used by `zeroserve train` and by a server's fine-tuning jobs */
    UC_NONE,   /* parsed and validated, used by nothing: `instead` says what happens */
} u_cat;
enum {
    UW_FP16 = 1u,     /* used only when fp16.enabled is true */
    UW_OPT_NVME = 2u, /* only when offload_optimizer.device is nvme */
    UW_PAR_NVME = 4u, /* only when offload_param.device is nvme */
    UW_ANY_NVME = 8u, /* only when offload_param.device or offload_optimizer.device is nvme */
};

typedef struct {
    const char *key; /* full dotted key */
    u_set set;       /* how "set" reads for the field at off */
    size_t off;
    u_cat cat;
    unsigned when;   /* UW_* conditions */
    const char *instead; /* UC_NONE only */
} u_field;

static const u_field u_fields[] = {
    {"zero_optimization.stage", U_INT_NEG, OFF(zero_stage), UC_ENGINE, 0, NULL},
    {"zero_optimization.offload_param.device", U_INT_NEG, OFF(offload_param), UC_ENGINE, 0, NULL},
    {"zero_optimization.offload_param.nvme_path", U_STR, OFF(nvme_path), UC_ENGINE, UW_PAR_NVME,
     NULL},
    {"zero_optimization.offload_param.pin_memory", U_INT_NEG, OFF(pin_memory), UC_NONE, 0,
     "host copies of the parameters (device cpu, and the NVMe read slots) are always "
     "page-aligned and, on a CUDA device, pinned with cudaHostRegister"},
    {"zero_optimization.offload_param.buffer_count", U_INT_POS, OFF(buffer_count), UC_ENGINE,
     UW_PAR_NVME, NULL},
    {"zero_optimization.offload_param.buffer_size", U_I64_POS, OFF(buffer_size), UC_NONE, 0,
     "each NVMe read slot holds one bucket's shard and is sized to the largest one "
     "(offload_param.buffer_count sets how many)"},
    {"zero_optimization.offload_optimizer.device", U_INT_NEG, OFF(offload_optimizer), UC_TJ, 0,
     NULL},
    {"zero_optimization.offload_optimizer.nvme_path", U_STR, OFF(optimizer_nvme_path), UC_TJ,
     UW_OPT_NVME, NULL},
    {"zero_optimization.offload_optimizer.pin_memory", U_INT_NEG, OFF(optimizer_pin_memory), UC_TJ,
     UW_OPT_NVME, NULL},
    {"zero_optimization.offload_optimizer.buffer_count", U_INT_POS, OFF(optimizer_buffer_count),
     UC_TJ, UW_OPT_NVME, NULL},
    {"zero_optimization.sub_group_size", U_I64_POS, OFF(sub_group_size), UC_TJ, UW_OPT_NVME, NULL},
    {"zero_optimization.stage3_prefetch_bucket_size", U_I64_NEG, OFF(prefetch_bucket_size),
     UC_NONE, 0,
     "the prefetch thread gathers whole layers ahead, bounded by stage3_max_live_parameters "
     "(--max-live-bytes) and the free read slots"},
    {"zero_optimization.stage3_max_live_parameters", U_I64_NEG, OFF(max_live_parameters),
     UC_ENGINE, 0, NULL},
    {"zero_optimization.stage3_param_persistence_threshold", U_I64_NEG,
     OFF(param_persistence_threshold), UC_ENGINE, 0, NULL},
    {DS_G16, U_INT_NEG, OFF(gather_16bit_on_save), UC_TJ, 0, NULL},
    {"aio.block_size", U_I64_POS, OFF(aio_block_size), UC_ENGINE, UW_ANY_NVME, NULL},
    {"aio.queue_depth", U_INT_POS, OFF(aio_queue_depth), UC_ENGINE, UW_ANY_NVME, NULL},
    {"bf16.enabled", U_INT_NEG, OFF(bf16), UC_ENGINE, 0, NULL},
    {"fp16.enabled", U_INT_NEG, OFF(fp16), UC_ENGINE, 0, NULL},
    {"fp16.loss_scale", U_FLT, OFF(loss_scale), UC_TJ, UW_FP16, NULL},
    {"fp16.initial_scale_power", U_INT_NEG, OFF(initial_scale_power), UC_TJ, UW_FP16, NULL},
    {"fp16.loss_scale_window", U_INT_POS, OFF(loss_scale_window), UC_TJ, UW_FP16, NULL},
    {"fp16.hysteresis", U_INT_POS, OFF(hysteresis), UC_TJ, UW_FP16, NULL},
    {"fp16.consecutive_hysteresis", U_INT_NEG, OFF(consecutive_hysteresis), UC_TJ, UW_FP16, NULL},
    {"fp16.min_loss_scale", U_FLT, OFF(min_loss_scale), UC_TJ, UW_FP16, NULL},
    {"optimizer.type", U_STR, OFF(optimizer_type), UC_TRAIN, 0, NULL},
    {"optimizer.params.lr", U_FLT, OFF(lr), UC_TRAIN, 0, NULL},
    {"optimizer.params.betas", U_BETAS, 0, UC_TRAIN, 0, NULL},
    {"optimizer.params.eps", U_FLT, OFF(eps), UC_TRAIN, 0, NULL},
    {"optimizer.params.weight_decay", U_FLT, OFF(weight_decay), UC_TRAIN, 0, NULL},
    {"scheduler.type", U_INT_NEG, OFF(lr_schedule), UC_TRAIN, 0, NULL},
    {"scheduler.params.warmup_type", U_INT_NEG, OFF(warmup_type), UC_TRAIN, 0, NULL},
    {"scheduler.params.warmup_num_steps", U_INT_NEG, OFF(warmup_steps), UC_TRAIN, 0, NULL},
    {"scheduler.params.total_num_steps", U_INT_NEG, OFF(total_steps), UC_TRAIN, 0, NULL},
    {"scheduler.params.warmup_min_lr", U_FLT, OFF(warmup_min_lr), UC_TRAIN, 0, NULL},
    {"scheduler.params.warmup_max_lr", U_FLT, OFF(warmup_max_lr), UC_TRAIN, 0, NULL},
    {"scheduler.params.warmup_min_ratio", U_FLT, OFF(warmup_min_ratio), UC_TRAIN, 0, NULL},
    {"scheduler.params.cos_min_ratio", U_FLT, OFF(cos_min_ratio), UC_TRAIN, 0, NULL},
    {"train_micro_batch_size_per_gpu", U_INT_POS, OFF(micro_batch), UC_TRAIN, 0, NULL},
    {"gradient_accumulation_steps", U_INT_POS, OFF(grad_accum), UC_TRAIN, 0, NULL},
    {"gradient_clipping", U_FLT, OFF(grad_clip), UC_TRAIN, 0, NULL},
    {"train_batch_size", U_I64_POS, OFF(train_batch_size), UC_TRAIN, 0, NULL},
};

static int u_is_set(const zs_zero_opts *o, const u_field *f) {
    const char *p = (const char *)o + f->off;
    switch (f->set) {
    case U_INT_NEG: return *(const int *)p >= 0;
    case U_INT_POS: return *(const int *)p > 0;
    case U_I64_NEG: return *(const int64_t *)p >= 0;
    case U_I64_POS: return *(const int64_t *)p > 0;
    case U_FLT: return !isnan(*(const float *)p);
    case U_STR: return p[0] != 0;
    case U_BETAS: return !isnan(o->beta1) || !isnan(o->beta2);
    }
    return 0;
}

/* Why f is not used by a command acting on `uses`, or NULL when it is used. A condition the
 * options themselves break comes first (it holds whatever the command), then the command. */
static const char *u_why(const zs_zero_opts *o, const u_field *f, unsigned uses) {
    if (f->cat == UC_NONE) return f->instead;
    if ((f->when & UW_FP16) && o->fp16 != 1) return "fp16 is off: no loss scaling";
    if ((f->when & UW_OPT_NVME) && o->offload_optimizer != ZS_OFFLOAD_NVME)
        return "the optimizer state is in host memory (offload_optimizer.device is not nvme)";
    if ((f->when & UW_PAR_NVME) && o->offload_param != ZS_OFFLOAD_NVME)
        return "the parameters are not read from NVMe (offload_param.device is not nvme)";
    if ((f->when & UW_ANY_NVME) && o->offload_param != ZS_OFFLOAD_NVME &&
        o->offload_optimizer != ZS_OFFLOAD_NVME)
        return "nothing is read from NVMe (neither offload_param.device nor "
               "offload_optimizer.device is nvme)";
    switch (f->cat) {
    case UC_ENGINE:
        return uses & ZS_DS_USE_ENGINE ? NULL : "this command does not open an engine";
    case UC_TRAIN:
        if (uses & ZS_DS_USE_TRAIN) return NULL;
        return uses & ZS_DS_USE_JOBS ? "serving does not train from the config: fine-tuning "
                                       "jobs take their hyper-parameters from each request"
                                     : "this command does not train";
    case UC_TJ:
        return uses & (ZS_DS_USE_TRAIN | ZS_DS_USE_JOBS) ? NULL : "this command does not train";
    default: return NULL;
    }
}

void zs_zero_opts_report_unused(const zs_zero_opts *o, const char *origin, unsigned uses,
                                zs_dsconfig_ignored_fn fn, void *ud) {
    if (!o) return;
    if (!origin) origin = "options";
    for (size_t i = 0; i < N(u_fields); i++) {
        const u_field *f = &u_fields[i];
        if (!u_is_set(o, f)) continue;
        const char *why = u_why(o, f, uses);
        if (why) ds_report_ignored(fn, ud, origin, f->key, why);
    }
}

int zs_zero_opts_resolve_batch(const zs_zero_opts *o, int world, int *micro_out,
                               int *accum_out, int64_t *train_out) {
    if (!o) return zs_err(ZS_EINVAL, "zs_zero_opts_resolve_batch: NULL argument");
    if (world < 1) return zs_err(ZS_EINVAL, "batch size: world size must be >= 1, got %d", world);
    int64_t micro = o->micro_batch > 0 ? o->micro_batch : 0;
    int64_t accum = o->grad_accum > 0 ? o->grad_accum : 0;
    int64_t tb = o->train_batch_size > 0 ? o->train_batch_size : 0;
    int64_t prod;
    if (tb && micro && accum) {
        if (__builtin_mul_overflow(micro, accum, &prod) ||
            __builtin_mul_overflow(prod, (int64_t)world, &prod) || prod != tb)
            return zs_err(ZS_EINVAL, "train_batch_size %lld != train_micro_batch_size_per_gpu "
                          "%lld * gradient_accumulation_steps %lld * world size %d", (long long)tb,
                          (long long)micro, (long long)accum, world);
    } else if (tb && (micro || accum)) {
        int64_t known = micro ? micro : accum, d;
        if (__builtin_mul_overflow(known, (int64_t)world, &d) || tb % d != 0)
            return zs_err(ZS_EINVAL, "train_batch_size %lld is not a multiple of %s %lld * "
                          "world size %d", (long long)tb,
                          micro ? "train_micro_batch_size_per_gpu" : "gradient_accumulation_steps",
                          (long long)known, world);
        if (tb / d > INT_MAX)
            return zs_err(ZS_EINVAL, "train_batch_size %lld gives %s %lld, too large",
                          (long long)tb, micro ? "gradient_accumulation_steps" :
                          "train_micro_batch_size_per_gpu", (long long)(tb / d));
        if (micro) accum = tb / d;
        else micro = tb / d;
    } else if (tb) {
        if (tb % world != 0 || tb / world > INT_MAX)
            return zs_err(ZS_EINVAL, "train_batch_size %lld is not a multiple of world size %d "
                          "(or too large)", (long long)tb, world);
        micro = tb / world;
        accum = 1;
    } else {
        if (!micro) micro = 1;
        if (!accum) accum = 1;
        if (__builtin_mul_overflow(micro, accum, &tb) ||
            __builtin_mul_overflow(tb, (int64_t)world, &tb))
            return zs_err(ZS_EINVAL, "train_micro_batch_size_per_gpu %lld * "
                          "gradient_accumulation_steps %lld * world size %d overflows",
                          (long long)micro, (long long)accum, world);
    }
    if (micro_out) *micro_out = (int)micro;
    if (accum_out) *accum_out = (int)accum;
    if (train_out) *train_out = tb;
    return 0;
}

int zs_zero_opts_check_batch(const zs_zero_opts *o, int world) {
    return zs_zero_opts_resolve_batch(o, world, NULL, NULL, NULL);
}

const char *zs_offload_name(int o) {
    if (o >= ZS_OFFLOAD_NONE && o <= ZS_OFFLOAD_NVME) return ds_offload_names[o];
    return o == -1 ? "unset" : "invalid";
}

int zs_offload_parse(const char *s, int *out) {
    if (!out) return zs_err(ZS_EINVAL, "zs_offload_parse: NULL argument");
    for (int i = 0; s && ds_offload_names[i]; i++) {
        if (strcasecmp(s, ds_offload_names[i]) == 0) {
            *out = i;
            return 0;
        }
    }
    return zs_err(ZS_EINVAL, "offload device \"%.100s\": expected one of \"none\", \"cpu\", "
                  "\"nvme\"", s ? s : "(null)");
}

int zs_dsconfig_parse_rep(const char *json_text, const char *origin,
                          zs_dsconfig_unknown_fn on_unknown, zs_dsconfig_ignored_fn on_ignored,
                          void *ud, zs_zero_opts *out) {
    if (!origin) origin = "config";
    if (!json_text || !out)
        return zs_err(ZS_EINVAL, "%s: zs_dsconfig_parse: NULL argument", origin);
    json_error_t je;
    json_t *root = json_loads(json_text, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return zs_err(ZS_EFORMAT, "%s: not valid JSON (line %d, column %d: %s)", origin, je.line,
                      je.column, je.text);
    int rc = 0;
    if (!json_is_object(root)) {
        char got[96];
        rc = zs_err(ZS_EFORMAT, "%s: expected a JSON object at the top level, got %s", origin,
                    ds_render(root, got, sizeof got));
    } else {
        zs_zero_opts tmp;
        zs_zero_opts_init(&tmp);
        ds_ctx c = {origin, on_unknown, on_ignored, ud, &tmp};
        rc = ds_block_parse(&c, root, &ds_root, "");
        if (rc == 0) rc = zs_zero_opts_check(&tmp, origin);
        if (rc == 0) *out = tmp;
    }
    json_decref(root);
    return rc;
}

int zs_dsconfig_parse_ex(const char *json_text, const char *origin,
                         zs_dsconfig_unknown_fn on_unknown, void *ud, zs_zero_opts *out) {
    return zs_dsconfig_parse_rep(json_text, origin, on_unknown, NULL, ud, out);
}

int zs_dsconfig_parse(const char *json_text, const char *origin, zs_zero_opts *out) {
    return zs_dsconfig_parse_rep(json_text, origin, NULL, NULL, NULL, out);
}

int zs_dsconfig_load_rep(const char *path, zs_dsconfig_unknown_fn on_unknown,
                         zs_dsconfig_ignored_fn on_ignored, void *ud, zs_zero_opts *out) {
    if (!path || !out) return zs_err(ZS_EINVAL, "zs_dsconfig_load: NULL argument");
    int rc = 0;
    char *text = NULL;
    struct stat st;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        rc = zs_err(errno == ENOENT || errno == ENOTDIR ? ZS_ENOTFOUND : ZS_EIO,
                    "%s: cannot open config file: %s", path, strerror(errno));
    } else if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        rc = zs_err(ZS_EIO, "%s: not a readable regular file", path);
    } else if (st.st_size > DS_MAX_FILE) {
        rc = zs_err(ZS_EFORMAT, "%s: config file too large (%lld bytes, limit %lld)", path,
                    (long long)st.st_size, (long long)DS_MAX_FILE);
    } else if (!(text = malloc((size_t)st.st_size + 1))) {
        rc = zs_err(ZS_ENOMEM, "%s: out of memory", path);
    } else {
        size_t got = 0, want = (size_t)st.st_size;
        while (got < want) {
            ssize_t r = read(fd, text + got, want - got);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) break;
            got += (size_t)r;
        }
        text[got] = 0;
        if (got != want) rc = zs_err(ZS_EIO, "%s: read failed", path);
        else if (strlen(text) != got)
            rc = zs_err(ZS_EFORMAT, "%s: not valid JSON (contains a NUL byte)", path);
        else rc = zs_dsconfig_parse_rep(text, path, on_unknown, on_ignored, ud, out);
    }
    if (fd >= 0) close(fd);
    free(text);
    return rc;
}

int zs_dsconfig_load_ex(const char *path, zs_dsconfig_unknown_fn on_unknown, void *ud,
                        zs_zero_opts *out) {
    return zs_dsconfig_load_rep(path, on_unknown, NULL, ud, out);
}

int zs_dsconfig_load(const char *path, zs_zero_opts *out) {
    return zs_dsconfig_load_rep(path, NULL, NULL, NULL, out);
}
