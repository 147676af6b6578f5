/* dsconfig.h — DeepSpeed-style JSON config files (`--config FILE`, DESIGN.md §7) read into
 * zs_zero_opts, zeroserve's ZeRO options, plus the helpers the CLI needs to merge them with its
 * flags (`--offload`, ...).
 *
 * Every field of zs_zero_opts has an "unset" value (documented per field), so a file and the
 * command line can be layered: zs_zero_opts_init() leaves everything unset, a parse sets only
 * what the file gives, and zs_zero_opts_merge(dst, src) copies the fields src sets. Defaults are
 * the consumer's business, not this module's.
 *
 * What the parser accepts (as DeepSpeed users write these files):
 *  - Any scalar value may be the string "auto" (Hugging Face Trainer integration) or null: both
 *    mean unset, without error. A block ("zero_optimization", "aio", ...) may be null (absent).
 *  - Integers may be written as integral JSON reals (5e8, 1e9, 3.0); a non-integral or
 *    out-of-range number is an error. Booleans are true/false or the integers 0/1.
 *  - Strings naming choices (devices, optimizer and scheduler types, warmup_type) match
 *    case-insensitively; the canonical spelling is stored.
 *  - Duplicate keys in one object are an error (ZS_EFORMAT), as in DeepSpeed.
 *  - Unknown keys, at any level, are reported once each (one report per dotted key per parse;
 *    the walk visits each key once and does not descend into an unknown key's value), and
 *    parsing continues. Reports go to the on_unknown callback of the *_ex functions, or, when
 *    that is NULL (and always for zs_dsconfig_parse/load), to zs_log_warn as
 *    "<origin>: ignoring unknown key 'zero_optimization.overlap_foo'".
 *  - Known DeepSpeed keys that zeroserve accepts but does not act upon (the list, each with what
 *    zeroserve does instead, is ds_*_fields in dsconfig.c, the IGN entries): communication
 *    tuning (zero_optimization.{overlap_comm, contiguous_gradients, reduce_bucket_size,
 *    reduce_scatter, allgather_partitions, allgather_bucket_size, round_robin_gradients,
 *    stage3_max_reuse_distance, ignore_unused_parameters, elastic_checkpoint,
 *    load_from_fp32_weights}), offload_param.max_in_cpu, offload_optimizer.{fast_init, pipeline,
 *    pipeline_read, pipeline_write, ratio}, aio.{thread_count, single_submit, overlap_events,
 *    intra_op_parallelism, use_gds}, fp16.auto_cast, optimizer.params.torch_adam,
 *    scheduler.params.last_batch_iteration and the top-level keys steps_per_print,
 *    wall_clock_breakdown, zero_allow_untested_optimizer, zero_force_ds_cpu_optimizer,
 *    gradient_predivide_factor, prescale_gradients, dump_state, memory_breakdown,
 *    activation_checkpointing, flops_profiler, tensorboard, wandb, csv_monitor, comms_logger.
 *    None is silent: each one present (whatever its value, null and "auto" included) is reported
 *    once per parse with its dotted key and what zeroserve does instead, to the on_ignored
 *    callback of the *_rep functions or, when that is NULL (and always for parse/load/_ex), to
 *    zs_log_warn as "<origin>: zero_optimization.overlap_comm is accepted but not used:
 *    <instead>".
 *  - Parsed keys that a given command does not use are reported by zs_zero_opts_report_unused,
 *    which the command calls on its merged options (file + flags): optimizer.*, scheduler.* and
 *    the batch keys outside `zeroserve train`; fp16 loss scaling, offload_optimizer.*,
 *    sub_group_size and the 16-bit save outside training and fine-tuning jobs; fp16 loss
 *    scaling while fp16.enabled is not true; offload_optimizer.{nvme_path, pin_memory,
 *    buffer_count} and sub_group_size while offload_optimizer.device is not nvme;
 *    offload_param.{nvme_path, buffer_count} while offload_param.device is not nvme; aio.* while
 *    neither device is nvme; and always offload_param.{pin_memory, buffer_size} and
 *    stage3_prefetch_bucket_size, which are validated but drive nothing.
 *  - zero_optimization.stage3_gather_16bit_weights_on_model_save and its older spelling
 *    stage3_gather_fp16_weights_on_model_save set one field (gather_16bit_on_save); both given
 *    with different values is ZS_EINVAL naming both.
 *  - "bfloat16" is accepted as the legacy spelling of "bf16".
 *
 * Errors (return value; message via zs_errmsg(), naming the origin and the full dotted key):
 *  ZS_EINVAL    wrong type or impossible value, e.g.
 *               "ds.json: zero_optimization.stage: expected an integer 0..3, got \"three\"";
 *               also the cross-field rules of zs_zero_opts_check() (the parser applies them to
 *               what the file gives).
 *  ZS_EFORMAT   not JSON (message has line and column), duplicate key, top level not an
 *               object, file larger than 16 MiB or containing a NUL byte.
 *  ZS_ENOTFOUND the file does not exist.  ZS_EIO: cannot read it.  ZS_ENOMEM.
 * Out-parameters are written only on success.
 *
 * Learning-rate schedules (DeepSpeed scheduler.type -> zs_zero_opts):
 *   WarmupLR       -> ZS_LR_CONSTANT       warm up for warmup_steps, then hold the peak LR
 *   WarmupDecayLR  -> ZS_LR_WARMUP_LINEAR  warm up, then decay linearly to 0 at total_steps
 *   WarmupCosineLR -> ZS_LR_WARMUP_COSINE  warm up, then cosine decay to cos_min_ratio * peak
 *                                          at total_steps
 * i.e. lr_schedule names what follows the warm-up; warmup_type says the warm-up's shape
 * (DeepSpeed's default, when absent, is "log" for WarmupLR/WarmupDecayLR). No scheduler block
 * (lr_schedule unset) means a constant LR. Parameters DeepSpeed does not define for the given
 * type (e.g. total_num_steps for WarmupLR) are reported as unknown keys and ignored.
 *
 * Optimizer: optimizer.type "Adam" or "AdamW" (stored canonically). Both run decoupled weight
 * decay, as DeepSpeed does by default (adam_w_mode true); adam_w_mode false, amsgrad true and
 * bias_correction false are rejected since zeroserve implements only plain AdamW.
 *
 * Thread safety: every function is reentrant (no globals; the error message is per thread).
 * The caller owns zs_zero_opts (plain data, no pointers). */
#ifndef ZS_DSCONFIG_H
#define ZS_DSCONFIG_H

#include <stdint.h>

typedef enum { ZS_OFFLOAD_NONE = 0, ZS_OFFLOAD_CPU = 1, ZS_OFFLOAD_NVME = 2 } zs_offload;
typedef enum { ZS_LR_CONSTANT = 0, ZS_LR_WARMUP_LINEAR = 1, ZS_LR_WARMUP_COSINE = 2 } zs_lr_sched;
typedef enum { ZS_WARMUP_LINEAR = 0, ZS_WARMUP_LOG = 1 } zs_warmup_type;

typedef struct {
    /* ZeRO / offload. Ints holding an enum are plain int so that -1 can mean unset. */
    int zero_stage;                      /* zero_optimization.stage: 0..3; -1 unset */
    int offload_param;                   /* zs_offload: offload_param.device; -1 unset */
    char nvme_path[1024];                /* offload_param.nvme_path; "" unset */
    int pin_memory;                      /* offload_param.pin_memory: 0/1; -1 unset */
    int buffer_count;                    /* offload_param.buffer_count (slots) >= 1; 0 unset */
    int64_t buffer_size;                 /* offload_param.buffer_size, ELEMENTS: > 0; 0 unset */
    int offload_optimizer;               /* zs_offload: offload_optimizer.device; -1 unset */
    char optimizer_nvme_path[1024];      /* offload_optimizer.nvme_path; "" unset */
    int64_t prefetch_bucket_size;        /* stage3_prefetch_bucket_size (elements) >= 0; -1 unset */
    int64_t max_live_parameters;         /* stage3_max_live_parameters (elements): > 0; -1 unset */
    int64_t param_persistence_threshold; /* stage3_param_persistence_threshold: >= 0; -1 unset */
    int64_t aio_block_size;              /* aio.block_size (bytes): 2^k, 4096 .. 64 MiB; 0 unset */
    int aio_queue_depth;                 /* aio.queue_depth: 1 .. 4096; 0 unset */
    int bf16, fp16;                      /* {bf16,fp16}.enabled: 0/1; -1 unset; both 1 = error */

    /* Training (parsed and validated now, used by the training feature). Floats: NAN unset. */
    char optimizer_type[32];             /* optimizer.type: "AdamW" or "Adam"; "" unset */
    float lr;                            /* optimizer.params.lr: finite >= 0 */
    float beta1, beta2;                  /* optimizer.params.betas[0..1]: each in [0, 1) */
    float eps;                           /* optimizer.params.eps: finite > 0 */
    float weight_decay;                  /* optimizer.params.weight_decay: finite >= 0 */
    int lr_schedule;                     /* zs_lr_sched from scheduler.type (see above); -1 unset */
    int warmup_type;                     /* zs_warmup_type from scheduler.params.warmup_type; -1 */
    int warmup_steps;                    /* scheduler.params.warmup_num_steps: >= 0; -1 unset */
    int total_steps;                     /* scheduler.params.total_num_steps: > 0; -1 unset */
    float warmup_min_lr, warmup_max_lr;  /* WarmupLR/WarmupDecayLR params: finite >= 0 */
    float warmup_min_ratio;              /* WarmupCosineLR warmup_min_ratio: 0..1 */
    float cos_min_ratio;                 /* WarmupCosineLR cos_min_ratio: 0..1 */
    int micro_batch;                     /* train_micro_batch_size_per_gpu: >= 1; 0 unset */
    int grad_accum;                      /* gradient_accumulation_steps: >= 1; 0 unset */
    float grad_clip;                     /* gradient_clipping: finite >= 0 (0 = off) */
    int64_t train_batch_size;            /* train_batch_size: >= 1; 0 unset */

    /* fp16 loss scaling (fp16.*; acted upon only when fp16 is on). DeepSpeed's defaults when
     * unset: loss_scale 0 (dynamic), initial_scale_power 16, loss_scale_window 1000,
     * hysteresis 2, consecutive_hysteresis false, min_loss_scale 1. */
    float loss_scale;                    /* fp16.loss_scale: 0 dynamic, > 0 static; NAN unset */
    int initial_scale_power;             /* fp16.initial_scale_power: 0..64 (scale 2^p); -1 unset */
    int loss_scale_window;               /* fp16.loss_scale_window: >= 1; 0 unset */
    int hysteresis;                      /* fp16.hysteresis: >= 1; 0 unset */
    int consecutive_hysteresis;          /* fp16.consecutive_hysteresis: 0/1; -1 unset */
    float min_loss_scale;                /* fp16.min_loss_scale: finite > 0; NAN unset */

    /* ZeRO-Infinity optimizer offload (offload_optimizer.*, zero_optimization.sub_group_size) */
    int optimizer_pin_memory;            /* offload_optimizer.pin_memory: 0/1; -1 unset */
    int optimizer_buffer_count;          /* offload_optimizer.buffer_count: >= 1; 0 unset */
    int64_t sub_group_size;              /* zero_optimization.sub_group_size (elements): >= 1;
                                            0 unset (DeepSpeed's default 1e9) */
    /* zero_optimization.stage3_gather_16bit_weights_on_model_save (or its older spelling
     * stage3_gather_fp16_weights_on_model_save; both given and different: an error): 0/1; -1 unset */
    int gather_16bit_on_save;
} zs_zero_opts;

/* Called once per key of the file that is accepted but not acted upon (a known DeepSpeed key
 * without meaning here, or, from zs_zero_opts_report_unused, a key the running command does not
 * use), with its full dotted name and what zeroserve does instead ("zeroserve always recomputes
 * activations in the backward"). */
typedef void (*zs_dsconfig_ignored_fn)(void *ud, const char *origin, const char *key, const char *instead);

/* Called once per unknown key with its full dotted name ("zero_optimization.overlap_foo"). */
typedef void (*zs_dsconfig_unknown_fn)(void *ud, const char *origin, const char *key);

/* Everything unset. */
void zs_zero_opts_init(zs_zero_opts *o);

/* Reads and parses a config file (at most 16 MiB); origin in messages is the path. */
int zs_dsconfig_load(const char *path, zs_zero_opts *out);
/* Parses config text; origin names it in messages (e.g. the file path, "ds.json"). */
int zs_dsconfig_parse(const char *json_text, const char *origin, zs_zero_opts *out);
/* As above, but unknown keys go to on_unknown (NULL: zs_log_warn). */
int zs_dsconfig_load_ex(const char *path, zs_dsconfig_unknown_fn on_unknown, void *ud,
                        zs_zero_opts *out);
int zs_dsconfig_parse_ex(const char *json_text, const char *origin,
                         zs_dsconfig_unknown_fn on_unknown, void *ud, zs_zero_opts *out);

/* As the *_ex functions, with a second callback for the accepted-but-ignored keys (NULL:
 * zs_log_warn "<origin>: <key> is accepted but not used: <instead>"; also what
 * zs_dsconfig_parse/load/parse_ex/load_ex do). Each ignored key present in the file is reported
 * once per parse, whatever its value (null and "auto" included). */
int zs_dsconfig_load_rep(const char *path, zs_dsconfig_unknown_fn on_unknown,
                         zs_dsconfig_ignored_fn on_ignored, void *ud, zs_zero_opts *out);
int zs_dsconfig_parse_rep(const char *json_text, const char *origin,
                          zs_dsconfig_unknown_fn on_unknown, zs_dsconfig_ignored_fn on_ignored,
                          void *ud, zs_zero_opts *out);

/* What a command acts upon, for zs_zero_opts_report_unused. */
enum {
    ZS_DS_USE_ENGINE = 1u, /* zero_optimization.stage, offload_param.*, stage3_* budgets, aio.*,
                              bf16/fp16.enabled (the weight dtype): every command that opens an engine */
    ZS_DS_USE_TRAIN = 2u,  /* optimizer.*, scheduler.*, batch sizes, gradient_clipping, fp16 loss
                              scaling, offload_optimizer.*, sub_group_size, the 16-bit save:
                              `zeroserve train` */
    ZS_DS_USE_JOBS = 4u,   /* a server's fine-tuning jobs: fp16 loss scaling, offload_optimizer.*,
                              sub_group_size and the 16-bit save (the hyper-parameters come from
                              each job's request) */
};
/* Reports, through fn (NULL: zs_log_warn as above), every field that o sets and that a command
 * acting upon `uses` (ZS_DS_USE_* bits) does not use, by its dotted key, with what that command
 * does instead (e.g. for `serve` without ZS_DS_USE_TRAIN: "optimizer.params.lr: serving does not
 * train; fine-tuning jobs take their hyper-parameters from each request"). Fields are visited in
 * a fixed order; each is reported at most once per call. origin prefixes messages. */
void zs_zero_opts_report_unused(const zs_zero_opts *o, const char *origin, unsigned uses,
                                zs_dsconfig_ignored_fn fn, void *ud);

/* Copies into dst every field that src sets (src wins); unset fields of src leave dst alone.
 * betas are one field: beta1 and beta2 are copied independently, each when set. */
void zs_zero_opts_merge(zs_zero_opts *dst, const zs_zero_opts *src);

/* Cross-field rules, for options assembled from a file and flags (the parser applies the same
 * rules to a file alone). Only fields that are set are checked. ZS_EINVAL naming the key:
 *  - offload_param nvme needs nvme_path; offload_optimizer nvme needs optimizer_nvme_path;
 *  - offload_param cpu/nvme needs zero_stage 3 (when the stage is set);
 *  - bf16 and fp16 not both 1;  - total_steps >= warmup_steps.
 * origin prefixes messages (NULL: "options"). */
int zs_zero_opts_check(const zs_zero_opts *o, const char *origin);

/* Batch sizes for a world of `world` ranks (>= 1), DeepSpeed's rule
 * train_batch_size = micro_batch * grad_accum * world: when all three are set they must agree;
 * when two are set the third must come out a whole number >= 1. ZS_EINVAL with a message
 * naming the keys otherwise. */
int zs_zero_opts_check_batch(const zs_zero_opts *o, int world);
/* The same check, then the resolved values, derived as DeepSpeed does: from two set values the
 * third; from train_batch alone accum 1 and micro train_batch / world; from micro alone accum 1;
 * where DeepSpeed would refuse (neither train_batch nor micro set) micro 1 (and accum 1 unless
 * set). Out-parameters (any may be NULL) written only on success. */
int zs_zero_opts_resolve_batch(const zs_zero_opts *o, int world, int *micro, int *accum,
                               int64_t *train_batch);

/* "none", "cpu", "nvme"; "unset" for -1; "invalid" otherwise. */
const char *zs_offload_name(int o);
/* Parses "none"|"cpu"|"nvme" (case-insensitive) for the --offload flag. ZS_EINVAL naming the
 * value otherwise; *out written only on success. */
int zs_offload_parse(const char *s, int *out);

#endif
