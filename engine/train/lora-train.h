/* lora-train.h — LoRA training steps over a frozen base that the world streams (issue 14): the
 * base is gathered layer by layer by the ranks' ZeRO-3 coordinators exactly as for serving (any
 * tier, any weight dtype: f32/f16/bf16, or a block format, which makes it QLoRA), and may be the
 * very model object a server is serving (an inference model, with host embedding lookup tables);
 * nothing of the base is copied, updated or given a gradient.
 *
 * The adapter (lora.h) is replicated: one copy per process, read by every rank thread of the
 * process (as the model's resident parts are). Each rank runs its micro-batch forward (base
 * matmuls plus scale·B·A·drop(x) on the adapted projections) and backward (activation
 * checkpointing as backward.h: layers recomputed from their inputs), accumulating the adapter's
 * gradient in its own buffer; after the micro-steps the gradients are all-reduced over the
 * world's gradient communicator (in rank order: the result does not depend on how the ranks are
 * spread over processes), clipped by their global norm and AdamW (optim.h) updates the adapter, on
 * every process identically. (Implementation: each micro-step's per-rank gradients are
 * all-gathered and summed in global micro-batch order, each weighted by its share of the step's
 * counted targets, so the step's gradient is the mean over those targets and the same bits for
 * any rank count with the same micro-batch size: 2 ranks x 1 micro-step = 1 rank x 2.) Dropout (lora_dropout > 0) masks come from a counter-based stream
 * keyed by (seed, step, global micro-batch index, layer, target, element), so a step's result
 * does not depend on the rank count.
 *
 * Checkpoints hold only the adapter, its AdamW moments, the step and the caller's meta JSON (the
 * data position): dir/step-<N>/ with adapter_config.json + adapter_model.safetensors (PEFT's
 * format, loadable as an adapter on its own), optimizer.safetensors and state.json, written into a
 * temporary directory, fsync'd and renamed, then dir/latest updated atomically, so a kill -9 at
 * any point leaves the previous checkpoint whole. They load with any rank count.
 *
 * Scope: CPU devices; in-process worlds and spmd multi-process worlds (a world led by process 0
 * cannot run training: ZS_EUNSUPPORTED). Ownership: the world and the adapter are borrowed and
 * must outlive the training; the training owns gradients, moments and trainers. Thread-safety:
 * one thread drives it (the one that drives the world), and every call runs in lockstep on all
 * ranks like an engine step; inference steps may run between calls (the adapter changes only
 * inside zs_lora_training_step). */
#ifndef ZS_LORA_TRAIN_H
#define ZS_LORA_TRAIN_H

#include <stdint.h>

#include "lora.h"
#include "train.h"
#include "world.h"

typedef struct zs_lora_training zs_lora_training;

/* o: micro_batch, seq_len, grad_accum, grad_clip, adam, lr as for zs_training_begin; o->stage must
 * be 0 or fit the world as there (it only says how the frozen base is held). seed: the dropout
 * stream. */
int  zs_lora_training_begin(zs_world *w, zs_lora *adapter, const zs_train_opts *o, uint64_t seed,
                            zs_lora_training **out);
/* One optimizer step; tokens/targets and step exactly as zs_training_step. */
int  zs_lora_training_step(zs_lora_training *t, const int32_t *const *tokens, const int32_t *const *targets,
                           long step, float *loss);

/* The same step in slices (lora-slice.c), for a server that puts them between serving steps.
 * The step's micro-batches are walks of the gather's training order (zs_gather_order) in units
 * (a bucket; a MoE layer's with its experts mark; a tied head with the embeddings), run as range
 * passes. Whichever way the units are cut, or carried by riders, the gradient and the adapter are
 * bitwise those of zs_lora_training_step.
 *   step_begin  sets the step up (no world call); tokens/targets are borrowed until it ends.
 *   slice       runs units for about budget_s seconds by the measured unit times (at least one;
 *               INFINITY: whole micro-batches, one TRAIN pass each); *more = 0 once the step is
 *               done (the last slice applies AdamW; zs_lora_training_step_loss then holds the
 *               loss). then_more: the caller runs the next slice right after, so the last range
 *               declares the next one to the gathers.
 *   next_range  the range the next slice begins with, promised: the next slice runs it (the
 *               caller declares it to the gathers one step ahead). 0 when the step is done.
 *   rider       a rider (world.h) that computes the current micro-batch's next forward units on
 *               the buckets of the coming serving step (as many as budget_s allows), or NULL when
 *               the next units cannot ride (backward next, a range promised, a MoE model, CUDA);
 *               ride_end after that step (step_rc its result) takes the units it got (all ranks
 *               must have reached the end; else the micro-batch's forward starts over) and
 *               returns the seconds rank 0 spent on them. */
int  zs_lora_training_step_begin(zs_lora_training *t, const int32_t *const *tokens, const int32_t *const *targets,
                                 long step);
int  zs_lora_training_slice(zs_lora_training *t, double budget_s, int then_more, int *more);
int  zs_lora_training_next_range(zs_lora_training *t, double budget_s, zs_pass_range *out);
const zs_world_rider *zs_lora_training_rider(zs_lora_training *t, double budget_s);
double zs_lora_training_ride_end(zs_lora_training *t, int step_rc);
float zs_lora_training_step_loss(const zs_lora_training *t);
/* Gives up the step in progress (its slices were cancelled): the next step_begin starts clean. */
void zs_lora_training_step_abort(zs_lora_training *t);
/* The weight bytes of the range passes its slices began (every bucket's full bytes per pass). */
uint64_t zs_lora_training_pass_bytes(const zs_lora_training *t);
/* The loss without updating anything (grad_accum 1 layout); no dropout. */
int  zs_lora_training_eval(zs_lora_training *t, const int32_t *const *tokens, const int32_t *const *targets,
                           float *loss);
/* Checkpoints (see above). keep: how many step-N directories to keep (0: all). base_name goes to
 * the adapter's base_model_name_or_path. */
int  zs_lora_training_save(zs_lora_training *t, const char *dir, long step, const char *meta_json, int keep,
                           const char *base_name);
/* Loads dir/latest (or dir itself when it is a step directory) into the adapter and the moments.
 * ZS_ENOTFOUND when there is none; ZS_EINVAL when its adapter's shape or parameters differ from
 * the training's. *meta_json is malloc'd (may be NULL). */
int  zs_lora_training_load(zs_lora_training *t, const char *dir, long *step, char **meta_json);
/* The gradient of the last step (or eval: none), after the all-reduce and the mean over the
 * step's counted targets, before clipping: the same shape as the adapter. Valid until the next
 * step or zs_lora_training_end. NULL before the first step. */
const zs_lora *zs_lora_training_grad(const zs_lora_training *t);
/* Bytes a LoRA job holds beyond the served base, this process: the adapter, the gradient
 * accumulators (one per rank), the AdamW moments, and the trainers' activations and scratch. */
typedef struct { size_t adapter, grads, optimizer, activations; } zs_lora_train_memory;
void zs_lora_training_memory(const zs_lora_training *t, zs_lora_train_memory *out);
void zs_lora_training_end(zs_lora_training *t);

#endif
