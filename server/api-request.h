/* api-request.h — a completions or chat request parsed and validated (api-request.c); a bad one
 * is answered with api-error.h's error. Not a public interface. */
#ifndef ZS_API_REQUEST_H
#define ZS_API_REQUEST_H

#include <jansson.h>
#include <stdint.h>

#include "api-error.h"
#include "api-models.h"
#include "sampler.h"
#include "stop.h"

#define MAX_N 16            /* choices per prompt */
#define MAX_CHOICES 128     /* prompts x n per request */
#define MAX_LOGPROBS_CMPL 5 /* completions: logprobs 0..5 */

/* A parsed, validated request: sampling and limits, stop strings (pointing into root) and the
 * tokenized prompts (one per prompt; chat has one). */
typedef struct {
    int chat;
    const zs_api_model *model; /* the model the request runs on (set by zs_api_parse_request) */
    zs_api *api;
    /* the LoRA adapter "model" names (model is then the base), with a reference held (NULL: none);
     * whoever takes it over sets this to NULL, else zs_api_req_free drops it */
    zs_api_adapter *adapter;
    json_t *root;
    int max_tokens, max_tokens_given;
    int n, stream, include_usage;
    int top_logprobs;          /* -1: none */
    int ignore_eos;
    int32_t end_ids[4];        /* chat: the template's end-of-turn tokens that are single ids (zs_req_params) */
    int n_end_ids;
    zs_sampler_params sp;
    uint64_t seed;
    const char *stop[ZS_STOP_MAX_COUNT];
    int n_stop;
    int n_prompts;
    int32_t **prompts;
    int *n_prompt;
    const char *prompt_param; /* "prompt" | "messages" */
    /* structured outputs / tool calls (api-tools.h), owned; whoever takes them over (the job)
     * sets these to NULL, else zs_api_req_free frees them */
    struct zs_api_cons *cons;   /* the constraint of every choice (NULL: none) */
    struct zs_api_tools *tools; /* chat: the request's tools and tool_choice (NULL: none) */
} req_t;

/* Parses the request body of a completions (chat = 0) or chat completions request into q (which
 * zs_api_req_free releases in every case, the adapter reference included). -1 with e filled on a
 * bad request; a model of another tenant than the request's caller is a 404 like an unknown one. */
int  zs_api_parse_request(zs_api *a, zs_http_req *r, int chat, req_t *q, api_err *e);
/* The same for a body given as bytes (blen of them; body need not be NUL-terminated): what
 * zs_api_parse_request does with the request's body, for callers without an HTTP request (the
 * fuzz harness tests/fuzz/fuzz-request.c): it uses a's mutex, models and adapters, no engine. who:
 * the caller (zs_http_req_who), NULL without keys. */
int  zs_api_parse_body(zs_api *a, const zs_key_id *who, const char *body, size_t blen, int chat, req_t *q,
                       api_err *e);
void zs_api_req_free(req_t *q);
/* A chat's "messages" validated (400s naming the message and field) and rendered with a's chat
 * template, add_gen: with the generation prompt; *text malloc'd. 0, or -1 with e filled. */
int  zs_api_render_messages(const zs_api_model *a, json_t *messages, int add_gen, char **text, api_err *e);
/* The text of token id as it appears inside a text (the leading space a SentencePiece decoder
 * strips at the start of a text kept); malloc'd, "" when it cannot be decoded (NULL: no memory). */
char *zs_api_token_text(const zs_api_model *a, int32_t id);

#endif
