/* api.h — the server's application layer (DESIGN.md §6): the OpenAI-compatible routes on top of
 * the HTTP layer (api-openai.c), the Prometheus /metrics text (metrics.c), and the `serve`
 * command that puts HTTP, engine and scheduler together (serve.c).
 *
 * Ownership: zs_api borrows the zs_http it registers its routes on, and the engine and
 * scheduler handed to zs_api_attach; it owns its per-request state. The zs_server of serve.c
 * owns everything it starts (HTTP, engine, scheduler, api).
 * Thread-safety: zs_api_attach, zs_api_loaded and zs_api_live may be called from any thread;
 * route handlers run on the HTTP threads and scheduler callbacks on the engine thread. */
#ifndef ZS_API_H
#define ZS_API_H

#include <stddef.h>

#include "dsconfig.h"
#include "engine.h"
#include "http.h"
#include "sched.h"

/* ------------------------------------------------------------------ api-openai.c */

typedef struct {
    const char *model_name; /* the id clients use in "model" (required) */
    const char *model_dir;  /* for chat template detection */
    int chat_template;      /* ZS_CHAT_* (chat.h), or -1: detect from model_dir */
    /* the directories POST /v1/load_lora_adapter may load adapters from (serve --lora-dir), each
     * resolved with realpath() by zs_api_new (a missing one fails it, named); none: run-time
     * loading over HTTP is off (403 lora_loading_disabled). zs_api_load_adapter is not confined. */
    const char *const *lora_dirs;
    int n_lora_dirs;
} zs_api_opts;

typedef struct zs_api zs_api;

/* Registers GET /health, GET /, GET /openapi.json, GET /metrics, GET /v1/models, GET /v1/models/{id},
 * POST /v1/completions, POST /v1/chat/completions, POST /v1/load_lora_adapter and
 * POST /v1/unload_lora_adapter on h (before traffic). /health and the
 * playground page / need no API key (the page holds no data; its API calls send the key). Until
 * zs_api_attach, /health answers 503 {"status":"loading"} and the generation routes 503. */
int  zs_api_new(zs_http *h, const zs_api_opts *o, zs_api **out);
/* The model is loaded: from now on requests go to s (e and s are borrowed and must outlive
 * every request: free the scheduler only after zs_http_stop, then zs_api_free). */
void zs_api_attach(zs_api *a, zs_engine *e, zs_sched *s);
int  zs_api_loaded(zs_api *a);
/* Serves one more model under name (a fine-tuned one) from now on: /v1/models lists it and
 * requests naming it go to s. owner: the tenant it is served to (with keys, other tenants but
 * admins get what an unknown model gets: keys.h's zs_key_sees); NULL: every tenant. e and s are
 * borrowed like zs_api_attach's; model_dir is for the chat template. ZS_EINVAL when the name is
 * taken. Thread-safe. */
int  zs_api_add_model(zs_api *a, const char *name, const char *owner, const char *model_dir, zs_engine *e,
                      zs_sched *s);
/* LoRA adapters over the base model (engine/model/lora.h). zs_api_add_adapter serves l under name
 * from now on: /v1/models lists it with "parent" set to the base model's id, and a request whose
 * "model" names it runs on the base's scheduler with the adapter (rows of different adapters share
 * one batch and one weight stream). The api takes ownership of l in every case (freed at once on
 * failure). dir is shown in /v1/models ("root"). ZS_EINVAL when the name is taken by a model or an
 * adapter (the message says so), ZS_EINVAL for an empty name, ZS_EBUSY before the base is attached. Thread-safe.
 * A request takes a reference to its adapter at submit and drops it at on_done. */
int  zs_api_add_adapter(zs_api *a, const char *name, const char *dir, zs_lora *l);
/* Loads the PEFT adapter directory dir against the base model and serves it as name, to owner's
 * tenant only (a fine-tuning job's; NULL: every tenant, as zs_api_add_adapter's are): errors name
 * the file and the problem (ZS_EFORMAT / ZS_EINVAL / ZS_ENOTFOUND / ZS_EUNSUPPORTED, e.g. a shape
 * that does not match the base, a target module it lacks, r = 0, a truncated safetensors; the CUDA
 * device serves no adapters yet). Thread-safe. */
int  zs_api_load_adapter(zs_api *a, const char *name, const char *owner, const char *dir);
/* Stops serving adapter name: requests naming it get 404 from now on; waits up to wait_s for the
 * queued and running requests that use it, then fails those left (their answers end with an error
 * saying the adapter was unloaded; *n_failed says how many, may be NULL). The adapter's memory is
 * freed when the last request using it has finished, never before. ZS_ENOTFOUND for a name that is
 * not a served adapter. Thread-safe. */
int  zs_api_unload_adapter(zs_api *a, const char *name, double wait_s, int *n_failed);
/* Shutting down: new generation requests get 503 (call before zs_sched_drain). */
void zs_api_drain(zs_api *a);
/* Requests of the api still holding state (submitted to the scheduler or being answered). */
long zs_api_live(zs_api *a);
/* Waits up to timeout_s for zs_api_live to reach 0; returns what is left. */
long zs_api_wait_idle(zs_api *a, double timeout_s);
void zs_api_free(zs_api *a); /* after zs_http_stop and after the scheduler's last callback */

/* ------------------------------------------------------------------ api-openapi.c */

/* Registers GET /openapi.json (no key needed): the OpenAPI document of the server's routes
 * (server/openapi.json, embedded at build). zs_api_new calls it. */
int zs_api_openapi_route(zs_http *h);
/* The embedded document (static; *len its length), e.g. for the test that checks it. */
const char *zs_api_openapi_json(size_t *len);

/* ------------------------------------------------------------------ metrics.c */

/* The Prometheus text exposition (format 0.0.4) of the HTTP counters of h and the scheduler's
 * counters (s may be NULL while the model loads: its figures are then 0). *out is malloc'd. */
int zs_metrics_render(zs_http *h, zs_sched *s, char **out, size_t *len);
/* The training gauges /metrics shows (zeroserve_train_*): the running job's last step, its loss
 * scale and the steps skipped for fp16 overflows (process-wide; thread-safe). */
void zs_metrics_set_training(long step, double loss_scale, long skipped_steps);
/* A full fine-tuning job (its own engine, not the scheduler) adds into the base scheduler's
 * training series of /metrics: a step of step_s seconds (busy: serving had work at its end) and
 * its tokens; seconds it waited for serving (its duty cycle); while active, its share stands for
 * the scheduler's in zeroserve_train_share and _target (process-wide; thread-safe). */
void zs_metrics_train_step(double step_s, int busy, uint64_t tokens, double share);
void zs_metrics_train_wait(double wait_s);
void zs_metrics_train_active(int active, double share);

/* ------------------------------------------------------------------ serve.c */

typedef struct {
    zs_http_opts http;
    zs_engine_opts engine;  /* model_dir required; strings are copied */
    zs_sched_opts sched;
    const char *model_name; /* NULL: the basename of engine.model_dir */
    int chat_template;      /* ZS_CHAT_* or -1 (auto) */
    int quiet;              /* no "listening"/"ready" lines on stderr */
    const char *data_dir;   /* fine-tuning API (files, jobs, fine-tuned models) under it; NULL: off */
    size_t max_file_bytes;  /* largest uploaded training file (0: 100 MiB; the body limit applies too) */
    const char *const *loras; /* "NAME=DIR" LoRA adapters served from the start (serve --lora); a bad
                                 one fails the load with the error naming it */
    int n_loras;
    const char *const *lora_dirs; /* serve --lora-dir: where POST /v1/load_lora_adapter may load from
                                     (zs_api_opts); none: run-time loading is off */
    int n_lora_dirs;
    /* the --config's keys for full fine-tuning jobs (bf16/fp16 precision, fp16 loss scaling,
     * offload_optimizer, sub_group_size, the 16-bit save); copied; NULL: none */
    const zs_zero_opts *train_config;
    /* speculative decoding (spec.h): NULL (a draft model when draft_model is set, else none),
     * "none", "ngram" (prompt lookup) or "draft" (draft_model); the number of drafts per sequence
     * is sched.spec_tokens (0: chosen from the measured costs) */
    const char *speculative;
    /* the draft model (spec-draft.c): a Hugging Face directory or GGUF file sharing the model's
     * vocabulary, kept resident on the CPU with its own KV cache for the scheduler's sequences;
     * NULL: none. draft_weight_dtype: NULL or a --weight-dtype value. Copied. "none" or "ngram"
     * with a draft model, "draft" without one, or a dtype without a model are refused by name. */
    const char *draft_model;
    const char *draft_weight_dtype;
} zs_server_opts;

typedef struct zs_server zs_server;

/* Starts HTTP (so /health answers 503 while loading) and loads the engine in a background
 * thread. on_loaded(ud, rc), when given, is called from that thread once loading has finished
 * (rc 0) or failed (rc < 0, message in zs_errmsg() of that thread). */
int  zs_server_start(const zs_server_opts *o, void (*on_loaded)(void *ud, int rc), void *ud,
                     zs_server **out);
int  zs_server_port(const zs_server *s);
/* The server's HTTP layer (borrowed; valid until zs_server_stop), e.g. to list its routes. */
zs_http *zs_server_http(zs_server *s);
/* Waits up to timeout_s for loading: 0 loaded, the load error code, or ZS_EBUSY (still loading). */
int  zs_server_wait_loaded(zs_server *s, double timeout_s);
/* Stops accepting, lets in-flight requests finish for up to drain_s, frees everything. */
void zs_server_stop(zs_server *s, double drain_s);

/* `zeroserve serve ...`: runs until SIGTERM/SIGINT; 0 on a clean stop. */
int zs_cmd_serve(int argc, char **argv);

#endif
