/* api-models.h — the api object and the models it serves (api-models.c): the base model of
 * zs_api_new / zs_api_attach and the fine-tuned models added later. Shared by the OpenAI routes
 * (api-openai.c) and the request parser (api-request.c); not a public interface.
 * Dependencies run one way: api-openai.c -> api-request.c -> api-models.c. */
#ifndef ZS_API_MODELS_H
#define ZS_API_MODELS_H

#include <pthread.h>

#include "api.h"

/* One served model: its name, engine, scheduler and what requests need of its tokenizer. The
 * base model is embedded in zs_api; models added later (fine-tuned ones) form a list and are
 * never removed before zs_api_free, so a pointer to one stays valid while requests use it. */
typedef struct zs_api_model {
    char *model_name;
    zs_engine *engine;
    zs_sched *sched;
    const zs_tokenizer *tok;
    int context, vocab, tmpl;
    char *bos, *eos, *ref_text;
    int ref_tok;
    long created;
    struct zs_api_model *next;
} zs_api_model;

struct zs_api {
    zs_http *http;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    zs_api_model base;   /* the model of zs_api_new / zs_api_attach */
    zs_api_model *extra; /* zs_api_add_model, newest first (guarded by mu) */
    long live;
    int draining;
};

/* The served model called name (NULL: the base model), or NULL when there is none (the base
 * model counts only once attached). Thread-safe. */
const zs_api_model *zs_api_model_find(zs_api *a, const char *name);

#endif
