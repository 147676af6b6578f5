/* api-models.h — the api object and the models it serves (api-models.c): the base model of
 * zs_api_new / zs_api_attach, the fine-tuned models added later and the LoRA adapters served over
 * the base (zs_api_add_adapter / zs_api_load_adapter / zs_api_unload_adapter). Shared by the
 * OpenAI routes (api-openai.c) and the request parser (api-request.c); not a public interface.
 * Dependencies run one way: api-openai.c -> api-request.c -> api-models.c. */
#ifndef ZS_API_MODELS_H
#define ZS_API_MODELS_H

#include <pthread.h>

#include "api.h"
#include "lora.h"

/* One served model: its name, engine, scheduler and what requests need of its tokenizer. The
 * base model is embedded in zs_api; models added later (fine-tuned ones) form a list and are
 * never removed before zs_api_free, so a pointer to one stays valid while requests use it. */
typedef struct zs_api_model {
    char *model_name;
    char *owner; /* the tenant it is served to (and admins: keys.h's zs_key_sees); NULL: every one */
    zs_engine *engine;
    zs_sched *sched;
    const zs_tokenizer *tok;
    int context, vocab, tmpl;
    char *bos, *eos, *ref_text;
    int ref_tok;
    long created;
    struct zs_api_model *next;
} zs_api_model;

/* A served LoRA adapter over the base model. Reference counted under zs_api.mu: the table holds
 * one reference while the adapter is listed, and every request using it one more (taken by
 * zs_api_resolve, dropped by zs_api_adapter_release when the request's job is freed, after its
 * last on_done). Unloading unlists it (removed = 1: no longer found by name) and drops the
 * table's reference; the adapter (zs_lora included) is freed when the count reaches 0, never
 * before — except while an unload waits for it (waiting = 1), which then frees it itself. name,
 * dir and lora are immutable while the adapter lives. */
typedef struct zs_api_adapter {
    char *name, *dir;
    char *owner; /* the tenant it is served to (and admins); NULL: every one (zs_key_sees) */
    zs_lora *lora;
    long created;
    int refs, removed, waiting;
    struct zs_api_adapter *next; /* the list of listed adapters, newest first */
} zs_api_adapter;

struct zs_api {
    zs_http *http;
    pthread_mutex_t mu;
    pthread_cond_t cv;             /* live and adapter reference counts went down */
    zs_api_model base;             /* the model of zs_api_new / zs_api_attach */
    zs_api_model *extra;           /* zs_api_add_model, newest first (guarded by mu) */
    zs_api_adapter *adapters;      /* listed adapters, newest first (guarded by mu) */
    long live;
    int draining;
    char **lora_dirs;              /* serve --lora-dir, real paths (immutable after zs_api_new) */
    int n_lora_dirs;
};

/* The served model called name (NULL: the base model), or NULL when there is none (the base
 * model counts only once attached). Adapters are not models here (see zs_api_resolve).
 * Thread-safe. */
const zs_api_model *zs_api_model_find(zs_api *a, const char *name);
/* What a request's "model" names: a served model (*ad = NULL) or an adapter (*m = the base model,
 * *ad = the adapter with a reference taken for the caller: release it with
 * zs_api_adapter_release). name NULL: the base model. who: the caller (NULL: no keys, or the server
 * itself); a model or adapter of another tenant is not found for it. Returns 0, or ZS_ENOTFOUND
 * (nothing by that name that who sees). Thread-safe. */
int  zs_api_resolve(zs_api *a, const char *name, const zs_key_id *who, const zs_api_model **m, zs_api_adapter **ad);
/* Drops a reference (ad may be NULL); frees an unloaded adapter at the last one. Thread-safe;
 * never waits. */
void zs_api_adapter_release(zs_api *a, zs_api_adapter *ad);
/* Whether name is taken by a model or a listed adapter (whoever it is served to). Thread-safe. */
int  zs_api_name_taken(zs_api *a, const char *name);
/* zs_api_add_adapter before zs_api_attach (serve --lora): l (owned in every case) is listed from
 * the start, so no request sees the base without it. The caller checks l against the engine it
 * attaches next. */
int  zs_api_preload_adapter(zs_api *a, const char *name, const char *dir, zs_lora *l);
/* Frees the listed adapters (zs_api_free, once no request is live). */
void zs_api_adapters_free(zs_api *a);

/* The --lora-dir directories (zs_api_new): each resolved with realpath() and kept; a missing one,
 * or one that is not a directory, is ZS_EINVAL / ZS_ENOTFOUND naming it. */
int  zs_api_set_lora_dirs(zs_api *a, const char *const *dirs, int n);
void zs_api_lora_dirs_free(zs_api *a);
/* The lora_path of POST /v1/load_lora_adapter (len bytes of a JSON string) confined to the
 * --lora-dir directories: a relative path is tried under each of them in order, an absolute one
 * must be inside one of them; after realpath() (symlinks followed) the directory and the files
 * the loader reads from it (adapter_config.json, adapter_model.safetensors, where they exist)
 * must all be inside one of them. Refused: NUL bytes, PATH_MAX bytes or more, a ".." component.
 * *out (malloc'd) is the real path. Every refusal, and a path that does not exist, is the same
 * ZS_EPERM with no message of its own, so that an answer tells nothing about paths outside the
 * directories. Thread-safe. */
int  zs_api_lora_path(zs_api *a, const char *path, size_t len, char **out);

/* Loads the PEFT adapter directory dir for e's model, ready to serve (frozen: zs_lora_freeze):
 * refused on the CUDA device and in multi-process worlds; errors name the file and the problem. */
int zs_api_adapter_open(zs_engine *e, const char *dir, zs_lora **out);

#endif
