/* fuzz-request.c — libFuzzer harness for the /v1/completions and /v1/chat/completions request
 * parsers (server/api-request.c, with response_format and tools/tool_choice in
 * server/api-tools.c). Each input is a request body, parsed with zs_api_parse_body as a
 * completions request and as a chat request over api objects that need no engine: a zs_api with
 * its mutex and a base model made of the stories260K tokenizer (loaded once from
 * $ZS_SHARED/models, default ../shared), a context of 4096 and a chat family (chatml, llama-3,
 * mistral, plain: each tool-call format), plus one listed adapter ("fuzz-lora", without weights:
 * the parser only takes and drops a reference). On success the request is checked (prompts
 * non-empty, ids in [0, vocab), max_tokens within the context, stop strings, the constraint's
 * forced ids) and freed; either way the grammar cache is emptied so that inputs do not depend on
 * each other. The streaming scanners zs_api_call_scan / zs_api_content_safe run on the bytes too.
 * Built and run by `make fuzz` (tests/fuzz/run.sh); seeds: tests/fuzz/corpus/request/. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api-models.h"
#include "api-request.h"
#include "api-tools.h"
#include "chat.h"
#include "common.h"
#include "tokenizer.h"

#define MAX_INPUT (64u << 10)
#define CONTEXT 4096 /* larger than the model's 512, so that prompts with rendered tools reach the constraint */

static const int k_tmpls[] = {ZS_CHAT_CHATML, ZS_CHAT_LLAMA3, ZS_CHAT_MISTRAL, ZS_CHAT_PLAIN};
enum { N_APIS = sizeof k_tmpls / sizeof k_tmpls[0] };

static zs_tokenizer *g_tok;
static zs_api g_api[N_APIS];
static zs_api_adapter g_adapter[N_APIS];
static volatile uint64_t sink;

static void cleanup(void) {
    for (int i = 0; i < N_APIS; i++) {
        free(g_api[i].base.bos);
        free(g_api[i].base.eos);
        pthread_mutex_destroy(&g_api[i].mu);
        pthread_cond_destroy(&g_api[i].cv);
    }
    zs_api_grammar_purge(NULL);
    zs_tokenizer_free(g_tok);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    zs_log_set_level(ZS_LOG_ERROR);
    const char *shared = getenv("ZS_SHARED");
    if (!shared || !*shared) shared = "../shared";
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/models/stories260K", shared);
    if (zs_tokenizer_load(dir, &g_tok) < 0) {
        fprintf(stderr, "fuzz-request: cannot load the tokenizer of %s: %s\n", dir, zs_errmsg());
        abort();
    }
    int bos = zs_tokenizer_bos(g_tok), eos = zs_tokenizer_eos(g_tok);
    for (int i = 0; i < N_APIS; i++) {
        zs_api *a = &g_api[i];
        pthread_mutex_init(&a->mu, NULL);
        pthread_cond_init(&a->cv, NULL);
        a->base.model_name = "stories260K";
        a->base.tok = g_tok;
        a->base.context = CONTEXT;
        a->base.vocab = zs_tokenizer_vocab_size(g_tok);
        a->base.tmpl = k_tmpls[i];
        a->base.bos = bos >= 0 ? strdup(zs_tokenizer_piece(g_tok, bos)) : NULL;
        a->base.eos = eos >= 0 ? strdup(zs_tokenizer_piece(g_tok, eos)) : NULL;
        a->base.ref_tok = -1;
        g_adapter[i].name = "fuzz-lora";
        g_adapter[i].refs = 1; /* the table's reference: never freed */
        a->adapters = &g_adapter[i];
    }
    atexit(cleanup);
    return 0;
}

static void check(const req_t *q, const zs_api *a) {
    int vocab = a->base.vocab;
    if (q->n_prompts < 1 || q->n < 1 || q->n > MAX_N || (long)q->n_prompts * q->n > MAX_CHOICES) __builtin_trap();
    for (int i = 0; i < q->n_prompts; i++) {
        if (q->n_prompt[i] < 1 || q->n_prompt[i] > CONTEXT) __builtin_trap();
        for (int k = 0; k < q->n_prompt[i]; k++)
            if (q->prompts[i][k] < 0 || q->prompts[i][k] >= vocab) __builtin_trap();
        if (q->n_prompt[i] + q->max_tokens > CONTEXT) __builtin_trap();
    }
    if (q->max_tokens < 1) __builtin_trap();
    if (q->n_stop < 0 || q->n_stop > ZS_STOP_MAX_COUNT) __builtin_trap();
    for (int i = 0; i < q->n_stop; i++) sink += strlen(q->stop[i]);
    if (q->top_logprobs < -1 || q->top_logprobs > ZS_SAMPLER_MAX_TOP_LOGPROBS) __builtin_trap();
    if (q->cons) {
        for (int i = 0; i < q->cons->n_prefix; i++)
            if (q->cons->prefix[i] < 0 || q->cons->prefix[i] >= vocab) __builtin_trap();
        for (int i = 0; i < q->cons->n_suffix; i++)
            if (q->cons->suffix[i] < 0 || q->cons->suffix[i] >= vocab) __builtin_trap();
        if (q->cons->trigger) sink += strlen(q->cons->trigger);
    }
    if (q->tools) {
        if (q->tools->n < 0 || q->tools->n > ZS_API_MAX_TOOLS) __builtin_trap();
        for (int i = 0; i < q->tools->n; i++) sink += strlen(q->tools->defs[i].name);
    }
    if (q->adapter && q->adapter != &a->adapters[0]) __builtin_trap();
}

static void parse(zs_api *a, const char *body, size_t n, int chat) {
    req_t q;
    api_err e;
    memset(&e, 0, sizeof e);
    int rc = zs_api_parse_body(a, NULL, body, n, chat, &q, &e);
    if (rc == 0) {
        check(&q, a);
        if (chat) { /* the /tokenize path: the messages without tools */
            char *text = NULL;
            api_err e2;
            if (zs_api_render_messages(&a->base, json_object_get(q.root, "messages"), 0, &text, &e2) == 0)
                sink += strlen(text);
            free(text);
        }
    } else if (e.status < 400 || e.status > 599 || !e.msg[0]) {
        __builtin_trap(); /* every refusal is an HTTP error with a message */
    }
    zs_api_req_free(&q);
    if (a->adapters[0].refs != 1) __builtin_trap(); /* the request's reference was dropped */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > MAX_INPUT) return 0;
    const char *body = (const char *)data;
    parse(&g_api[0], body, size, 0);
    for (int i = 0; i < N_APIS; i++) parse(&g_api[i], body, size, 1);
    zs_api_grammar_purge(NULL);

    zs_api_callscan cs;
    zs_api_call_scan(body, size, 0, &cs);
    if (cs.args_done && (cs.args_start > cs.args_end || cs.args_end > size)) __builtin_trap();
    sink += cs.found + cs.name_done + strnlen(cs.name, sizeof cs.name);
    static const char *triggers[] = {"<tool_call>", "[TOOL_CALLS]", "{"};
    for (int i = 0; i < 3; i++) {
        size_t at = 0, safe = zs_api_content_safe(body, size, triggers[i], &at);
        if (safe > size || at > size) __builtin_trap();
    }
    return 0;
}
