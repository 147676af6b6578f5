/* engine.h — the inference engine as the CLI and the server see it: a model, its tokenizer, a
 * KV cache and a forward executor, plus single-sequence generation (prefill in chunks, then
 * token-by-token decode with sampling, stop strings and EOS, text streamed to a callback).
 * Ownership: the engine owns everything it opens. Thread-safety: one thread at a time. */
#ifndef ZS_ENGINE_H
#define ZS_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "gather.h"
#include "model.h"
#include "sampler.h"
#include "tokenizer.h"
#include "world.h"

/* A model path is a Hugging Face directory (config.json, *.safetensors, tokenizer.json) or a GGUF
 * file (F32/F16/BF16 tensors; llama, qwen2, gpt2; its embedded tokenizer and chat template). */
/* The tokenizer of a model path: tokenizer.json of a directory, or the tokenizer a GGUF file
 * embeds (tokenizer.ggml.model "llama": SentencePiece, or "gpt2": byte-level BPE; see
 * zs_tokenizer_spec). Errors name the file and the key. */
int zs_model_tokenizer_load(const char *model_path, zs_tokenizer **out);
/* The chat template family of a model path (zs_chat_template_detect for a directory; a GGUF's
 * tokenizer.chat_template). Never fails: plain when unknown. */
int zs_model_chat_template_detect(const char *model_path);
/* 1 when the path is a regular file (then it is read as GGUF). */
int zs_model_path_is_file(const char *model_path);

typedef struct {
    const char *model_dir;     /* model path: a directory or a .gguf file */
    zs_model_opts model;
    int max_seqs;          /* KV sequence slots (default 8) */
    int max_batch_tokens;  /* tokens per forward call (default 256) */
    int max_context;       /* 0 = the model's max_position_embeddings */
    size_t kv_bytes;       /* KV cache memory of a rank (--kv-bytes); 0 = enough for max_seqs
                              full contexts, capped at 1 GiB */
    int kv_offload;        /* --kv-offload: ZS_OFFLOAD_NONE (0, default) | _CPU | _NVME: where the
                              scheduler swaps preempted sequences when the cache is full (CPU
                              device only for now) */
    const char *kv_nvme_path; /* --kv-nvme-path: the directory of the NVMe tier's files */
    int kv_whole;          /* the caller keeps each sequence whole in memory (generate, perplexity,
                              bench): the cache must hold one context, streamed or not */
    int kv_stream;         /* --kv-stream: with a tier, the youngest run layer-streamed (kvstream.h)
                              when the cache is full instead of waiting swapped out (without it,
                              only a request longer than the cache's memory is streamed) */
    int offload_auto;      /* 1: --offload auto (plan-auto.h: the placement planned at open from
                              this machine, measured); 2: the same only when the model and its KV
                              do not fit in memory (no --offload given); 0: the flags as they are */
    unsigned plan_gave;    /* ZS_PLAN_GAVE_* (plan-auto.h): what the user set, which auto keeps */
    size_t kv_prefix_bytes; /* --kv-prefix-bytes: room for prefix blocks in the tier (0: 4x kv_bytes
                               in host memory, 16 GiB on NVMe) */
    zs_dtype kv_dtype;     /* KV cache elements: ZS_F32 (default, 0), ZS_F16 or ZS_BF16 (half the
                              bytes per position, so twice the positions in kv_bytes) */
    int ranks;             /* rank threads (default 1) */
    const char *nvme_path; /* shard directory for offload nvme */
    zs_gather_opts gather; /* tier (offload), live budget, slots, aio, verify */
    int zero_stage;        /* 1, 2: parameters replicated on every rank; 3 (default, 0): sharded */
    int64_t max_live_params; /* live budget in parameters (DeepSpeed's stage3_max_live_parameters),
                                used when gather.max_live_bytes is 0 */
    int device;            /* ZS_DEVICE_AUTO (default: CUDA when a device is visible; the
                              ZS_DEVICE environment variable overrides auto) | _CPU | _CUDA */
    int spmd;              /* several processes (cluster.h): every process drives the engine
                              (training); 0: process 0 drives, the others zs_engine_follow */
    int local;             /* 1: an engine of this process alone, whatever the cluster (a draft
                              model: process 0 runs it, the others never open it) */
} zs_engine_opts;

void zs_engine_opts_default(zs_engine_opts *o);

typedef struct zs_engine zs_engine;
int  zs_engine_open(const zs_engine_opts *o, zs_engine **out);
void zs_engine_free(zs_engine *e);
zs_model *zs_engine_model(zs_engine *e);
zs_tokenizer *zs_engine_tokenizer(zs_engine *e);
zs_kvcache *zs_engine_kv(zs_engine *e);   /* rank 0's cache */
/* The tier below memory of rank `rank`'s KV cache (kv_offload), or NULL without one. */
struct zs_kvtier *zs_engine_kv_tier(zs_engine *e, int rank);
/* The placement as JSON for GET /v1/plan: --offload auto's plan (plan-auto.h), or {"mode":
 * "flags", "applied": {...}} with what the flags gave. */
char *zs_engine_plan_json(zs_engine *e); /* a copy (free it): it may be replaced while serving */
/* A step's figures for --offload auto's re-planning (plan-auto.h): rows computed, seconds, those
 * waiting for weights, NVMe bytes read. Engine thread; nothing without auto. */
void zs_engine_plan_observe(zs_engine *e, double rows, double step_s, double stall_s, double nvme_bytes);
/* Rank `rank`'s layer-streamed sequences (kv_offload; NULL without, or for a model it cannot
 * stream: one layer, a window ring). */
struct zs_kvstream *zs_engine_kv_stream(zs_engine *e, int rank);
int zs_engine_kv_stream_on(const zs_engine *e); /* --kv-stream */
/* The prefix cache's blocks below memory of rank `rank` (kv_offload), or NULL. */
struct zs_kvprefix *zs_engine_kv_prefix(zs_engine *e, int rank);
zs_world *zs_engine_world(zs_engine *e);
int  zs_engine_device(const zs_engine *e);            /* ZS_DEVICE_CPU or ZS_DEVICE_CUDA */
int  zs_engine_context(const zs_engine *e);
int  zs_engine_max_seqs(const zs_engine *e);
int  zs_engine_zero_stage(const zs_engine *e);        /* 1, 2 or 3 */          /* KV sequence slots of each rank */
int  zs_engine_max_batch_tokens(const zs_engine *e);  /* tokens per forward call and rank */

/* A streaming decoder for the continuation of prompt: primed with the prompt's last ordinary
 * token, so the continuation decodes in context (SentencePiece drops a leading space only at
 * the very start of a text, not where a continuation starts). */
int  zs_engine_detok_for(zs_engine *e, const int32_t *prompt, int n_prompt, zs_detok **out);

/* A follower process of a multi-process world: runs process 0's step plans until it stops
 * (zs_world_follow). */
int  zs_engine_follow(zs_engine *e);

/* Runs one forward call (any mix of sequences of rank 0) as one step of all ranks. */
int  zs_engine_forward(zs_engine *e, const zs_batch *b, float *logits);

typedef struct {
    int max_tokens;             /* new tokens at most (>= 0) */
    zs_sampler_params sampling;
    const char *const *stop;    /* stop strings */
    int n_stop;
    int ignore_eos;
    /* called with the logits of every sampled position (vocab floats), or NULL */
    void (*on_logits)(void *ud, const float *logits, int vocab);
    void *logits_ud;
} zs_gen_params;

enum { ZS_FINISH_STOP = 0, ZS_FINISH_LENGTH = 1 };

typedef struct {
    int n_prompt, n_generated;
    int finish;                 /* ZS_FINISH_* */
    double t_prefill, t_decode; /* seconds */
    int32_t *ids;               /* generated ids (malloc'd, caller frees), n_generated long */
} zs_gen_result;

/* Called with each piece of text that is safe to show; return non-zero to cancel. */
typedef int (*zs_gen_cb)(void *ud, const char *text, size_t len);

int zs_engine_generate(zs_engine *e, const int32_t *prompt, int n_prompt, const zs_gen_params *p,
                       zs_gen_cb cb, void *ud, zs_gen_result *res);

#endif
