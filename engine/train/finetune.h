/* finetune.h — one fine-tuning run end to end over an open engine: validate and load the JSONL
 * data, cut it into batches, run the ZeRO-3 training steps (train.h), report each step, and
 * export the result as a plain Hugging Face model directory. `zeroserve train` and the server's
 * fine-tuning jobs both run through it.
 *
 * Ownership: the engine is borrowed (its world is used for training: no inference step may run
 * on it meanwhile); the run owns its dataset, optimizer state and buffers and frees them before
 * returning. Thread-safety: one thread per run; the hooks are called on that thread. */
#ifndef ZS_FINETUNE_H
#define ZS_FINETUNE_H

#include <stddef.h>
#include <stdint.h>

#include "engine.h"
#include "lora.h"
#include "sched.h"
#include "train.h"

typedef struct {
    const char *data_path;   /* training JSONL (required) */
    const char *valid_path;  /* validation JSONL: its loss is measured once at the end (or NULL) */
    const char *out_dir;     /* export directory (NULL: nothing is written) */
    int chat_template;       /* ZS_CHAT_* for {messages} examples */
    int epochs;              /* passes over the data (>= 1) */
    int steps;               /* optimizer steps; 0 = as many as the epochs take */
    int batch;               /* sequences per rank and micro-step */
    int grad_accum;          /* micro-steps per optimizer step */
    int seq_len;             /* 0 = the longest example, up to the context */
    int warmup;              /* linear warm-up steps */
    int schedule;            /* ZS_LR_CONSTANT | ZS_LR_WARMUP_LINEAR | ZS_LR_WARMUP_COSINE */
    float lr, clip, weight_decay;
    uint64_t seed;           /* data shuffling */
    const char *ckpt_dir;    /* checkpoints (engine/ckpt.c) go here (NULL: none) */
    int save_every;          /* save every N steps (0: only after the last step) */
    int resume;              /* continue from the latest checkpoint in ckpt_dir, if there is one:
                                weights, optimizer state, step and data position */
    /* LoRA (lora.h, lora-train.h): non-NULL trains an adapter over the frozen base instead of the
     * whole model: the engine may be an inference engine (embedding lookup tables) in any weight
     * dtype, quantized included (QLoRA), and may be the one a server serves (see hooks.exec);
     * out_dir receives adapter_config.json + adapter_model.safetensors (PEFT's format) and the
     * checkpoints hold only the adapter and its optimizer state. NULL: a full fine-tune. */
    const zs_lora_params *lora;
    const char *base_name;   /* LoRA: the adapter's base_model_name_or_path (NULL: the model path) */
    /* Full fine-tunes (ignored by LoRA, which keeps its adapter in fp32 and all-reduces it in fp32):
     * mixed precision (train.h: the engine must store the weights in a 16-bit precision's dtype),
     * the fp16 loss scaler (zs_loss_scaler_init; zeroed: DeepSpeed's dynamic defaults) and where
     * the masters and moments live (zs_optstate_opts: cpu, or nvme with its sub-groups). */
    int precision;
    zs_loss_scaler scaler;
    zs_optstate_opts optimizer;
    /* The optimizer's betas and eps (NULL: torch's defaults; lr and weight decay are the fields
     * above) and a full learning-rate schedule (NULL: schedule / warmup / lr above, linear
     * warm-up, decay to 0), e.g. from a DeepSpeed config (optim.h). */
    const zs_adamw_params *adam;
    const zs_lr_schedule *lr_schedule;
    /* stage3_gather_16bit_weights_on_model_save: every checkpoint also writes the consolidated
     * 16-bit model into its step directory (DIR/step-NNNNNN/hf16: Hugging Face layout, in the
     * precision's 16-bit dtype, bf16 when training in fp32), and the final export is 16-bit too. */
    int save_16bit;
    zs_dtype export_dtype;   /* the final export's dtype: ZS_F32/F16/BF16; ZS_DTYPE_COUNT (the default):
                                the base checkpoint's own dtype, or the 16-bit one with save_16bit */
} zs_finetune_opts;

/* The dtype of the 16-bit consolidated save for a precision: fp16 for ZS_PREC_FP16, else bf16. */
zs_dtype zs_finetune_16bit_dtype(int precision);

/* Defaults of `zeroserve train`: 1 epoch, batch 4, lr 1e-4 constant, clip 1.0. */
void zs_finetune_opts_default(zs_finetune_opts *o);

typedef struct {
    int examples;
    size_t tokens;        /* tokens of the training set */
    long steps;           /* planned optimizer steps */
    int ranks, seq_len;
} zs_finetune_plan;

typedef struct zs_finetune_step {
    long step, steps;        /* this step (1-based) and the planned total */
    float loss, lr;          /* its mean loss and the LR it used */
    size_t tokens;           /* counted tokens trained on so far */
    int skipped;             /* 1: this attempt overflowed and was skipped */
    double loss_scale;       /* the scale this attempt used (1 without fp16) */
    double next_scale;       /* the scale of the next attempt */
    long skipped_total;      /* attempts skipped so far in the run */
    float grad_norm;         /* global gradient norm before clipping (NAN when skipped; LoRA: NAN) */
    double step_s;           /* wall time of the step (forward, backward, reductions, optimizer) */
    double optim_s;          /* of it, the optimizer step (nvme: with its I/O; LoRA: 0) */
} zs_finetune_step;

typedef struct {
    /* Once, after the data is loaded and before the first step. */
    void (*on_plan)(void *ud, const zs_finetune_plan *p);
    /* Before each step (1-based): return non-zero to stop the run (it then returns ZS_ECANCELLED).
     * A server uses it to yield the machine to serving. */
    int (*before_step)(void *ud, long step);
    /* After each step (and each skipped attempt, s->skipped = 1: fp16 overflow, nothing updated,
     * the same step is retried on the same data at the lowered scale). */
    void (*on_step)(void *ud, const struct zs_finetune_step *s);
    /* Runs fn(arg) where the engine's world may be driven and returns its result (NULL hook: fn is
     * called directly). Every training step, evaluation, checkpoint save and load of the run goes
     * through it (but see exec_work): a server maps it to zs_sched_run_idle, a slice of background
     * work on the engine thread of the served base. */
    int (*exec)(void *ud, int (*fn)(void *arg), void *arg);
    /* LoRA runs (NULL: exec runs each step whole): runs a step as background work in slices
     * (sched.h: a server maps it to zs_sched_run_work on the served base, with the job's share;
     * w->tokens is the step's counted tokens). With it, checkpoint saves and loads and the export
     * run on the calling thread, off the engine thread (they only touch the adapter, its moments
     * and files, which no slice uses between steps). */
    int (*exec_work)(void *ud, const zs_sched_work *w);
    void *ud;
} zs_finetune_hooks;

typedef struct {
    long steps;            /* steps done */
    float first_loss, last_loss;
    float valid_loss;      /* -1 without validation data */
    size_t trained_tokens; /* tokens of the batches trained on (padding excluded) */
    /* memory the run held beyond the base's weights as served, this process (bytes): trained
     * parameters (LoRA: the adapter; full: every rank's fp32 master shards), their gradients,
     * optimizer moments, and activations / trainer scratch */
    size_t mem_params, mem_grads, mem_optimizer, mem_activations;
    size_t mem_optimizer_host; /* of mem_optimizer: in host memory (nvme: the staging buffers) */
    long skipped_steps;        /* attempts skipped for fp16 overflows */
    double loss_scale;         /* the loss scale at the end (1 without fp16) */
} zs_finetune_result;

/* Runs o on e's world. h may be NULL. res (may be NULL) is filled on success and, as far as the
 * run went, on ZS_ECANCELLED. Data errors name the line ("line 3: ..."). */
int zs_finetune_run(zs_engine *e, const zs_finetune_opts *o, const zs_finetune_hooks *h,
                    zs_finetune_result *res);

#endif
