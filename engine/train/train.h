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
 * Scope now: CPU devices, tiers none, cpu and nvme, ZeRO stage 3. Ownership: a zs_training borrows the
 * world (which must outlive it) and owns the optimizer state. Thread-safety: one thread drives it,
 * and no inference step may run between zs_training_begin and zs_training_end. */
#ifndef ZS_TRAIN_H
#define ZS_TRAIN_H

#include <stdint.h>

#include "optim.h"
#include "world.h"

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
} zs_train_opts;

typedef struct zs_training zs_training;

int  zs_training_begin(zs_world *w, const zs_train_opts *o, zs_training **out);
/* One optimizer step. tokens[i] and targets[i] (B*T each; targets -1 where masked) are the
 * micro-batch of rank i % ranks in micro-step i / ranks, for i < ranks * grad_accum. The loss
 * is the mean next-token cross-entropy over every counted target of the step. step is 1-based
 * (AdamW bias correction and the LR schedule). */
int  zs_training_step(zs_training *t, const int32_t *const *tokens, const int32_t *const *targets,
                      long step, float *loss);
/* The loss of a batch without updating anything (same layout as a step with grad_accum 1). */
int  zs_training_eval(zs_training *t, const int32_t *const *tokens, const int32_t *const *targets,
                      float *loss);
/* Writes the current weights (the fp32 masters, in the checkpoint's dtype) as a plain Hugging
 * Face model directory, with the base model's config and tokenizer files: into out_dir.tmp,
 * then renamed to out_dir (replacing it). */
int  zs_training_export(zs_training *t, const char *out_dir);
/* Checkpoints (engine/ckpt.c): every rank's fp32 master shard and AdamW moments, the resident
 * tensors, the step and the caller's meta JSON (data position, config). A checkpoint saved with N
 * ranks loads with any rank count; loading also rewrites the storage shards from the masters.
 * *meta_json is malloc'd (may be NULL). */
int  zs_training_save(zs_training *t, const char *dir, long step, const char *meta_json, int keep);
int  zs_training_load(zs_training *t, const char *dir, long *step, char **meta_json);
/* Bytes one rank holds for the sharded part of the model (norms and biases, replicated in every
 * stage, are left out): parameters in their storage dtype, fp32 gradient accumulators, fp32
 * optimizer state (master, m, v). */
typedef struct { size_t params, grads, optimizer; } zs_train_memory;
void zs_training_memory(const zs_training *t, zs_train_memory *out);
void zs_training_end(zs_training *t);
/* The counted (non-negative) targets among n: the weight of a micro-batch in a step's mean loss
 * (shared with lora-train.c). */
long zs_train_count_targets(const int32_t *targets, size_t n);

#endif
