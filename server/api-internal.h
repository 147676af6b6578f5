/* api-internal.h — what the two halves of the OpenAI layer share: the api object, the parsed
 * request (api-request.c parses and validates a request body into it) and the error it answers
 * with (api-openai.c turns it into the OpenAI error shape). Not a public interface. */
#ifndef ZS_API_INTERNAL_H
#define ZS_API_INTERNAL_H

#include <jansson.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "stop.h"
#include "strbuf.h"

#define MAX_N 16            /* choices per prompt */
#define MAX_CHOICES 128     /* prompts x n per request */
#define MAX_LOGPROBS_CMPL 5 /* completions: logprobs 0..5 */

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

/* An error to answer with: status, OpenAI type and code, the field at fault, a message. */
typedef struct {
    int status;
    const char *type, *code;
    char param[96];
    char msg[600];
} api_err;

int zs_api_fail(api_err *e, int status, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* A parsed, validated request: sampling and limits, stop strings (pointing into root) and the
 * tokenized prompts (one per prompt; chat has one). */
typedef struct {
    int chat;
    const zs_api_model *model; /* the model the request names (set by zs_api_parse_request) */
    json_t *root;
    int max_tokens, max_tokens_given;
    int n, stream, include_usage;
    int top_logprobs;          /* -1: none */
    int ignore_eos;
    zs_sampler_params sp;
    uint64_t seed;
    const char *stop[ZS_STOP_MAX_COUNT];
    int n_stop;
    int n_prompts;
    int32_t **prompts;
    int *n_prompt;
    const char *prompt_param; /* "prompt" | "messages" */
} req_t;

/* Parses the request body of a completions (chat = 0) or chat completions request into q (which
 * zs_api_req_free releases in every case). -1 with e filled on a bad request. */
int  zs_api_parse_request(zs_api *a, zs_http_req *r, int chat, req_t *q, api_err *e);
void zs_api_req_free(req_t *q);

#endif
