/* train.h — ZeRO-3 training steps through the serving engine's ranks (DESIGN.md §3 step 6, §5).
 *
 * Each rank runs its micro-batch forward (gathering each bucket in order), the head and loss,
 * then backward (gathering the layers again in reverse; activations are recomputed per layer).
 * Each bucket's gradient is reduce-scattered as soon as it exists, so rank r keeps only the
 * gradient of its own shard, accumulated in fp32 over the micro-steps; resident tensors (norms,
 * biases) are all-reduced. The optimizer step clips by the global norm and runs AdamW on the fp32
 * master shards held in host memory (ZeRO-Offload), then writes the updated shard back to the
 * rank's tier in the storage dtype: its shard buffer (none, cpu), or in place into its NVMe shard
 * file (nvme: new checksum in the manifest, fingerprint marked "-trained" so that a later start
 * from the base checkpoint rewrites the file). With nvme the masters start from the shard file.
 *
 * Mixed precision (zs_train_opts.precision): the weights in the tiers and the gather in bf16 or
 * fp16, each micro-batch's gradient cast to that dtype for the reductions and accumulated in fp32
 * by its owner; fp16 scales the loss (lossscale.h) and every rank skips a step whose gradients
 * overflowed anywhere (agreed with a MAX all-reduce). The masters and moments live in host memory or
 * in an NVMe file per rank, streamed by sub-groups during the optimizer step (optstate.h).
 *
 * Devices: the CPU, or CUDA (ZeRO stage 3): each rank's forward and backward run on its device
 * (backward.h, zs_trainer_new_device), its gradients come back to host memory and are reduced over
 * the host gradient communicator, the optimizer runs on the host and the updated shards are
 * uploaded (zs_gather_write_shard). Tiers none, cpu and nvme; ZeRO stages 1-3 on the CPU.
 * Ownership: a zs_training borrows the world (which must outlive it) and owns the optimizer state. Thread-safety: one thread drives it,
 * and no inference step may run between zs_training_begin and zs_training_end. */
#ifndef ZS_TRAIN_H
#define ZS_TRAIN_H

#include <stdint.h>

#include "lossscale.h"
#include "optim.h"
#include "optstate.h"
#include "world.h"

/* Mixed precision (DeepSpeed's bf16 / fp16 blocks). */
typedef enum {
    ZS_PREC_DEFAULT = 0, /* the weights as the engine stores them, fp32 gradients */
    ZS_PREC_FP32 = 1,    /* fp32 weights and gradients (the engine must store f32) */
    ZS_PREC_BF16 = 2,    /* bf16 weights in the tiers and the gather, bf16 gradients on the wire */
    ZS_PREC_FP16 = 3,    /* fp16 weights and gradients on the wire, with loss scaling */
} zs_precision;
const char *zs_precision_name(int p);           /* "default", "fp32", "bf16", "fp16" */
int zs_precision_parse(const char *s, int *out); /* "fp32|f32|bf16|fp16|f16"; ZS_EINVAL naming it */

typedef struct {
    int micro_batch;          /* sequences per rank and micro-step (B) */
    int seq_len;              /* tokens per sequence (T) */
    int grad_accum;           /* micro-steps per optimizer step */
    float grad_clip;          /* global-norm clipping; 0 = off */
    zs_adamw_params adam;
    zs_lr_schedule lr;        /* the LR of each optimizer step */
    int stage;                /* ZeRO stage 1, 2 or 3; 0: 3, or 2 when the world replicates the
                                 parameters (stages 1 and 2 need a world opened with replicated
                                 parameters: zs_engine_opts.zero_stage) */
    /* zs_precision. BF16 / FP16 need the engine's weights stored in that dtype (ZS_EINVAL
     * otherwise): each micro-batch's gradient is cast to it (round to nearest even) before the
     * reduce-scatter / all-reduce, so half the bytes of fp32 go on the wire; the reduced shard is
     * accumulated in fp32 by its owner. The master weights and moments stay fp32. */
    int precision;
    /* FP16: the loss scaler (zs_loss_scaler_init; a zeroed one: DeepSpeed's dynamic defaults).
     * Other precisions: ignored (scale 1). Copied at begin. */
    zs_loss_scaler scaler;
    /* Where each rank's masters and moments live: device ZS_OFFLOAD_CPU (0 / NONE: host memory)
     * or ZS_OFFLOAD_NVME (dir, sub_group, buffer_count, pin_memory); rank is set per rank. */
    zs_optstate_opts optimizer;
} zs_train_opts;

/* What one optimizer step did (zs_training_step_ex). */
typedef struct {
    float loss;               /* the step's mean loss (also for a skipped step) */
    int skipped;              /* 1: the gradients overflowed (fp16): nothing was updated */
    double loss_scale;        /* the scale this step's gradients carried (1 without fp16) */
    double next_scale;        /* the scale of the next step */
    long skipped_total;       /* steps skipped so far in this run (checkpoints keep it) */
    float grad_norm;          /* the global gradient norm before clipping (unscaled; NAN on overflow) */
    double optim_s;           /* seconds of the optimizer step (nvme: its I/O included) */
} zs_train_step_info;

typedef struct zs_training zs_training;

int  zs_training_begin(zs_world *w, const zs_train_opts *o, zs_training **out);
/* One optimizer step. tokens[i] and targets[i] (B*T each; targets -1 where masked) are the
 * micro-batch of rank i % ranks in micro-step i / ranks, for i < ranks * grad_accum. The loss
 * is the mean next-token cross-entropy over every counted target of the step. step is 1-based
 * (AdamW bias correction and the LR schedule). */
int  zs_training_step(zs_training *t, const int32_t *const *tokens, const int32_t *const *targets,
                      long step, float *loss);
/* The same, with what the step did. A skipped step (fp16 overflow agreed by every rank) leaves
 * the masters, the moments, the storage shards and every AdamW step count as they were: the
 * caller retries the same data with the same step number (its data position does not move).
 * An overflow at the minimum loss scale fails with ZS_ERANGE (lossscale.h). */
int  zs_training_step_ex(zs_training *t, const int32_t *const *tokens, const int32_t *const *targets,
                         long step, zs_train_step_info *info);
/* A test hook: fn(ud, rank, bucket, grad, n, resident, step) is called on each rank's thread for
 * every bucket's gradient partition (resident 0) and resident gradient (resident 1) of this rank
 * after the micro-steps and before the overflow check, with the gradient still multiplied by the
 * loss scale; it may change it (e.g. write an inf to force an overflow). NULL removes it. */
typedef void (*zs_train_grad_hook)(void *ud, int rank, int bucket, float *grad, size_t n, int resident, long step);
void zs_training_set_grad_hook(zs_training *t, zs_train_grad_hook fn, void *ud);
/* The loss scaler's state now (a copy). */
void zs_training_scaler(const zs_training *t, zs_loss_scaler *out);
/* The loss of a batch without updating anything (same layout as a step with grad_accum 1). */
int  zs_training_eval(zs_training *t, const int32_t *const *tokens, const int32_t *const *targets,
                      float *loss);
/* Writes the current weights (the fp32 masters, in the checkpoint's dtype) as a plain Hugging
 * Face model directory, with the base model's config and tokenizer files: into out_dir.tmp,
 * then renamed to out_dir (replacing it). */
int  zs_training_export(zs_training *t, const char *out_dir);
/* The same in the given dtype (ZS_F32, ZS_F16 or ZS_BF16; ZS_DTYPE_COUNT: the base checkpoint's
 * own dtype, the one its safetensors store). The buckets are gathered one at a time and every
 * tensor is written as soon as its last bucket is in: no rank (and not the writer) holds more than
 * one bucket's fp32 weights at once, plus the tensors still waiting for a later bucket. */
int  zs_training_export_dtype(zs_training *t, const char *out_dir, zs_dtype dtype);
/* Checkpoints (engine/ckpt.c): every rank's fp32 master shard and AdamW moments, the resident
 * tensors, the step and the caller's meta JSON (data position, config). A checkpoint saved with N
 * ranks loads with any rank count; loading also rewrites the storage shards from the masters.
 * *meta_json is malloc'd (may be NULL). */
int  zs_training_save(zs_training *t, const char *dir, long step, const char *meta_json, int keep);
int  zs_training_load(zs_training *t, const char *dir, long *step, char **meta_json);
/* The key of a checkpoint's meta JSON that names the dtype the run stored its weights in ("f32",
 * "f16", "bf16"): zs_training_save writes it, zs_training_load refuses another engine dtype, and
 * `zeroserve export` opens the base in it. */
#define ZS_CKPT_WDTYPE_KEY "zs_weight_dtype"
/* Bytes one rank holds for the sharded part of the model (norms and biases, replicated in every
 * stage, are left out): parameters in their storage dtype, fp32 gradient accumulators, fp32
 * optimizer state (master, m, v). */
typedef struct {
    size_t params, grads, optimizer;
    size_t optimizer_host;    /* of optimizer: bytes in host memory (nvme: the staging buffers) */
    size_t optimizer_file;    /* nvme: bytes in the rank's optimizer file */
} zs_train_memory;
void zs_training_memory(const zs_training *t, zs_train_memory *out);
void zs_training_end(zs_training *t);
/* The counted (non-negative) targets among n: the weight of a micro-batch in a step's mean loss
 * (shared with lora-train.c). */
long zs_train_count_targets(const int32_t *targets, size_t n);

#endif
