/* api-openai.c — the OpenAI-compatible routes (DESIGN.md §6): /health, /v1/models,
 * /v1/completions, /v1/chat/completions (plain JSON or Server-Sent Events), /metrics, the
 * playground page at /, /v1/plan (where the weights and KV live: engine.h) and vLLM's LoRA
 * adapter routes. Validated requests (api-request.c)
 * become scheduler requests (one per choice), answered from the scheduler's callbacks as one
 * JSON body or as SSE chunks.
 *
 * Request lifetime: a handler validates, tokenizes and creates a `job` holding one `choice`
 * per generated sequence, submits every choice, then (stream) starts the SSE stream. The job
 * is answered and freed by whichever thread sees its last reference go: the engine thread
 * (last on_done) or the handler (its own hold). A client disconnect (on_close) cancels every
 * choice still running. Locking: job->mu guards the job; no zs_sched_* call and no HTTP call
 * that can wait (respond, stream_start, stream_end) is made while holding it, so neither the
 * scheduler's nor the HTTP layer's locks are ever taken inside job->mu except the non-waiting
 * zs_http_stream_write. An on_done that arrives while a cancel is in flight waits for it, so
 * the zs_request handles a cancel uses stay valid.
 *
 * A request naming a LoRA adapter runs on the base model's scheduler with the adapter
 * (zs_req_params.lora); its job holds a reference on the adapter until job_free, after the
 * scheduler's last on_done, so an unload never frees an adapter a request still uses.
 * POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's names and bodies) load and
 * unload adapters at run time (api-models.c).
 *
 * Structured outputs and tool calls (api-tools.c): every choice of a request with a
 * response_format or tools runs under the request's constraint (zs_req_params.constraint),
 * which the job owns (with its grammar-cache reference) until job_free. With a tool_choice
 * other than "none" the answer's text is parsed for calls (zs_toolcall_parse): the message
 * then has tool_calls (content null, or the text outside the call) and finish_reason
 * "tool_calls". Streaming sends OpenAI's tool-call deltas: {tool_calls:[{index, id, type,
 * function:{name, arguments:""}}]} once the name is generated, then {tool_calls:[{index,
 * function:{arguments: "..."}}]} as the arguments are generated; the text of a call never goes
 * out as content (with "auto", text that could be the start of the format's trigger is held
 * back until it is known not to be). Logprobs are not streamed for such requests.
 *
 * Request parsing and validation live in api-request.c. */
#define _GNU_SOURCE
#include "api-extra.h"
#include "api-models.h"
#include "api-request.h"
#include "api-tools.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "cluster.h"
#include "chat.h"
#include "common.h"
#include "engine.h"
#include "strbuf.h"

extern const unsigned char zs_playground_html[];
extern const size_t zs_playground_html_len;

/* ------------------------------------------------------------------ small helpers */

static void random_hex(char *out, int nbytes) {
    unsigned char b[32];
    if (nbytes > 32) nbytes = 32;
    if (getrandom(b, (size_t)nbytes, 0) != nbytes) {
        uint64_t x = (uint64_t)zs_now() * 1000003u ^ (uint64_t)(uintptr_t)out;
        for (int i = 0; i < nbytes; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            b[i] = (unsigned char)(x >> 56);
        }
    }
    for (int i = 0; i < nbytes; i++) sprintf(out + 2 * i, "%02x", b[i]);
}

static json_t *bytes_array(const char *s) {
    json_t *arr = json_array();
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        json_array_append_new(arr, json_integer(*p));
    return arr;
}

static void respond_err(zs_http_req *r, const api_err *e) {
    if (e->status == 429 || e->status == 503) zs_http_add_header(r, "Retry-After", "1");
    zs_http_respond_error(r, e->status, e->type, e->param[0] ? e->param : NULL, e->code, "%s",
                          e->msg);
}

/* ------------------------------------------------------------------ jobs */

typedef struct {
    int32_t token;
    float logprob;
    int n_top;
    size_t offset;
    int32_t top_ids[ZS_SAMPLER_MAX_TOP_LOGPROBS];
    float top_lps[ZS_SAMPLER_MAX_TOP_LOGPROBS];
} lp_entry;

typedef struct job job;

typedef struct {
    job *j;
    int index;
    zs_request *req;
    int submitted, done;
    int finish, n_prompt, n_gen, err;
    char *errmsg;
    sbuf text;      /* non-stream: the completion text */
    size_t emitted; /* stream: bytes sent (text_offset) */
    lp_entry *lps;
    int n_lps, cap_lps;
    /* tool calls, streaming: content bytes of text sent, the call's first delta sent, argument bytes sent */
    size_t content_sent, args_sent;
    size_t call_at; /* auto: where the call's trigger starts in text (in_call) */
    int call_hdr, in_call;
} choice;

struct job {
    zs_api *api;
    const zs_api_model *m; /* the model answering (the base model for an adapter) */
    zs_api_adapter *adapter; /* the LoRA adapter the request names, a reference held until job_free (or NULL) */
    const char *model_id;  /* what "model" says in the answer: the adapter's name or m's */
    zs_sched *sched;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    zs_http_req *req;
    zs_http_stream *stream;
    int chat, streaming, include_usage, top_logprobs;
    char id[64];
    long created;
    int n;
    choice *ch;
    int prompt_tokens;
    int remaining, cancelling, closed, started;
    sbuf pre;    /* stream data produced before the stream started */
    api_err err; /* err.status != 0: answer with this error */
    double t_submit, t_done; /* engine time: first submit to last on_done (X-Engine-Time-Ms) */
    zs_api_cons *cons;       /* the constraint of every choice (or NULL), freed in job_free */
    zs_api_tools *tools;     /* chat tools (or NULL) */
    int tool_mode;           /* tools with tool_choice other than none: answers are parsed for calls */
};

static void job_free(job *j) {
    for (int i = 0; i < j->n; i++) {
        free(j->ch[i].text.p);
        free(j->ch[i].errmsg);
        free(j->ch[i].lps);
    }
    free(j->ch);
    free(j->pre.p);
    /* after the scheduler's last on_done: the constraint is no longer used */
    zs_api_cons_free(j->cons);
    zs_api_tools_free(j->tools);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    zs_api *a = j->api;
    /* the scheduler has made its last on_done call of every choice: the adapter is no longer used */
    zs_api_adapter_release(a, j->adapter);
    free(j);
    pthread_mutex_lock(&a->mu);
    a->live--;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
}

static json_t *chunk_base(job *j) {
    json_t *c = json_pack("{s:s,s:s,s:I,s:s}", "id", j->id, "object",
                          j->chat ? "chat.completion.chunk" : "text_completion", "created",
                          (json_int_t)j->created, "model", j->model_id);
    return c;
}

/* Appends one SSE event (job->mu held). */
static void emit_locked(job *j, const char *data, size_t len) {
    if (j->closed) return;
    if (j->started) {
        sbuf ev = {0};
        sb_addn(&ev, "data: ", 6);
        sb_addn(&ev, data, len);
        sb_addn(&ev, "\n\n", 2);
        if (!ev.oom && ev.p) zs_http_stream_write(j->stream, ev.p, ev.len);
        free(ev.p);
    } else {
        sb_addn(&j->pre, "data: ", 6);
        sb_addn(&j->pre, data, len);
        sb_addn(&j->pre, "\n\n", 2);
    }
}

static void emit_json_locked(job *j, json_t *obj) {
    if (!obj) return;
    char *s = json_dumps(obj, JSON_COMPACT);
    json_decref(obj);
    if (s) emit_locked(j, s, strlen(s));
    free(s);
}

/* One choice entry of a chunk: chat {index, delta, logprobs, finish_reason} or completions
 * {index, text, logprobs, finish_reason}. delta_role/text may be NULL. */
static json_t *chunk_choice(job *j, int index, const char *role, const char *text, size_t len,
                            json_t *logprobs, const char *finish) {
    json_t *c = json_object();
    json_object_set_new(c, "index", json_integer(index));
    if (j->chat) {
        json_t *d = json_object();
        if (role) json_object_set_new(d, "role", json_string(role));
        if (text) json_object_set_new(d, "content", json_stringn(text, len));
        json_object_set_new(c, "delta", d);
    } else {
        json_object_set_new(c, "text", json_stringn(text ? text : "", text ? len : 0));
    }
    json_object_set_new(c, "logprobs", logprobs ? logprobs : json_null());
    json_object_set_new(c, "finish_reason", finish ? json_string(finish) : json_null());
    return c;
}

static void emit_choice_locked(job *j, json_t *choice_obj) {
    json_t *c = chunk_base(j);
    if (!c) {
        json_decref(choice_obj);
        return;
    }
    json_t *arr = json_array();
    json_array_append_new(arr, choice_obj);
    json_object_set_new(c, "choices", arr);
    if (j->include_usage) json_object_set_new(c, "usage", json_null());
    emit_json_locked(j, c);
}

/* Logprobs of a list of entries, in the shape of the endpoint. */
static json_t *logprobs_json(job *j, const lp_entry *e, int n) {
    const zs_api_model *a = j->m;
    if (j->chat) {
        json_t *content = json_array();
        for (int i = 0; i < n; i++) {
            char *t = zs_api_token_text(a, e[i].token);
            json_t *tops = json_array();
            for (int k = 0; k < e[i].n_top; k++) {
                char *tt = zs_api_token_text(a, e[i].top_ids[k]);
                json_array_append_new(tops, json_pack("{s:s,s:f,s:o}", "token", tt, "logprob",
                                                      (double)e[i].top_lps[k], "bytes", bytes_array(tt)));
                free(tt);
            }
            json_array_append_new(content, json_pack("{s:s,s:f,s:o,s:o}", "token", t, "logprob",
                                                     (double)e[i].logprob, "bytes", bytes_array(t), "top_logprobs",
                                                     tops));
            free(t);
        }
        return json_pack("{s:o,s:n}", "content", content, "refusal");
    }
    json_t *tokens = json_array(), *tlp = json_array(), *tops = json_array(), *offs = json_array();
    for (int i = 0; i < n; i++) {
        char *t = zs_api_token_text(a, e[i].token);
        json_array_append_new(tokens, json_string(t));
        json_array_append_new(tlp, json_real(e[i].logprob));
        json_t *d = json_object();
        for (int k = 0; k < e[i].n_top; k++) {
            char *tt = zs_api_token_text(a, e[i].top_ids[k]);
            if (!json_object_get(d, tt)) json_object_set_new(d, tt, json_real(e[i].top_lps[k]));
            free(tt);
        }
        if (!json_object_get(d, t)) json_object_set_new(d, t, json_real(e[i].logprob));
        json_array_append_new(tops, d);
        json_array_append_new(offs, json_integer((json_int_t)e[i].offset));
        free(t);
    }
    return json_pack("{s:o,s:o,s:o,s:o}", "tokens", tokens, "token_logprobs", tlp, "top_logprobs", tops,
                     "text_offset", offs);
}

static const char *finish_name(int f) { return f == ZS_DONE_LENGTH ? "length" : "stop"; }

/* One chat chunk of choice index with delta (owned) and finish (may be NULL). (mu held) */
static void emit_delta_locked(job *j, int index, json_t *delta, const char *finish) {
    json_t *c = json_object();
    json_object_set_new(c, "index", json_integer(index));
    json_object_set_new(c, "delta", delta);
    json_object_set_new(c, "logprobs", json_null());
    json_object_set_new(c, "finish_reason", finish ? json_string(finish) : json_null());
    emit_choice_locked(j, c);
}

static void emit_content_locked(job *j, choice *c, const char *t, size_t n) {
    if (n) emit_delta_locked(j, c->index, json_pack("{s:s%}", "content", t, n), NULL);
}

/* A tool-call delta: the call's opening one (id and name, arguments "") or an arguments chunk. */
static void emit_call_locked(job *j, choice *c, int k, const char *id, const char *name, const char *args, size_t n) {
    json_t *tc = json_pack("{s:i}", "index", k);
    if (name) {
        json_object_set_new(tc, "id", json_string(id));
        json_object_set_new(tc, "type", json_string("function"));
        json_object_set_new(tc, "function", json_pack("{s:s,s:s}", "name", name, "arguments", ""));
    } else {
        json_object_set_new(tc, "function", json_pack("{s:s%}", "arguments", args, n));
    }
    emit_delta_locked(j, c->index, json_pack("{s:[o]}", "tool_calls", tc), NULL);
}

/* The id of call k of choice c. */
static void call_id(job *j, const choice *c, int k, char *out, size_t n) {
    snprintf(out, n, "call_%d_%s%d", k, j->id + strlen("chatcmpl-"), c->index);
}

/* Streams what c->text holds of content and of the call so far (mu held): content up to where a
 * call may start (auto), then the call's name once complete and its arguments as they come (the
 * call's text is rescanned at each token: quadratic in the length of one call only).
 * final: the answer is complete (content held back as a possible trigger goes out if no call). */
static void tool_stream_locked(job *j, choice *c, int final) {
    const char *t = c->text.p ? c->text.p : "";
    size_t len = c->text.len, call_at = 0;
    if (j->tools->choice == ZS_API_TC_AUTO && !c->in_call) {
        /* no trigger can start before content_sent (what was sent was not a prefix of it) */
        size_t base = c->content_sent, at;
        size_t safe = base + zs_api_content_safe(t + base, len - base, j->tools->trigger, &at);
        at += base;
        if (final && at == len) safe = len;
        if (safe > c->content_sent) {
            emit_content_locked(j, c, t + c->content_sent, safe - c->content_sent);
            c->content_sent = safe;
        }
        if (at == len) return;
        c->in_call = 1;
        c->call_at = at;
    }
    if (j->tools->choice == ZS_API_TC_AUTO) call_at = c->call_at;
    zs_api_callscan sc;
    zs_api_call_scan(t, len, call_at, &sc);
    if (!c->call_hdr && sc.name_done) {
        char id[96];
        call_id(j, c, 0, id, sizeof id);
        emit_call_locked(j, c, 0, id, sc.name, NULL, 0);
        c->call_hdr = 1;
    }
    if (c->call_hdr && sc.args_begun) {
        size_t end = sc.args_done ? sc.args_end : len, from = sc.args_start + c->args_sent;
        if (end > from) {
            emit_call_locked(j, c, 0, NULL, NULL, t + from, end - from);
            c->args_sent += end - from;
        }
    }
}

/* The answer of a streamed tool-mode choice is complete (mu held): the rest of the call (or of
 * the content), then the last chunk with finish_reason "tool_calls" when there is a call. */
static void tool_stream_finish_locked(job *j, choice *c, int finish) {
    tool_stream_locked(j, c, 1);
    zs_toolcall_parsed p = {0};
    char seed[64];
    snprintf(seed, sizeof seed, "%s%d", j->id + strlen("chatcmpl-"), c->index);
    if (zs_toolcall_parse(j->tools->fmt, c->text.p ? c->text.p : "", c->text.len, j->tools->defs, j->tools->n, seed,
                          &p) < 0)
        memset(&p, 0, sizeof p);
    if (p.n_calls > 0) {
        for (int k = c->call_hdr ? 1 : 0; k < p.n_calls; k++) {
            char id[96];
            call_id(j, c, k, id, sizeof id);
            emit_call_locked(j, c, k, id, p.calls[k].name, NULL, 0);
            const char *a = p.calls[k].arguments ? p.calls[k].arguments : "{}";
            emit_call_locked(j, c, k, NULL, NULL, a, strlen(a));
        }
        if (c->call_hdr && c->args_sent == 0) {
            const char *a = p.calls[0].arguments ? p.calls[0].arguments : "{}";
            emit_call_locked(j, c, 0, NULL, NULL, a, strlen(a));
        }
    } else if (!c->call_hdr && c->text.len > c->content_sent) {
        /* no call came out of it (cut short): what was held back is content */
        emit_content_locked(j, c, c->text.p + c->content_sent, c->text.len - c->content_sent);
        c->content_sent = c->text.len;
    }
    emit_delta_locked(j, c->index, json_object(), p.n_calls > 0 && finish == ZS_DONE_STOP ? "tool_calls" : finish_name(finish));
    zs_toolcall_parsed_free(&p);
}

static void on_token(void *ud, int32_t token, const char *text, size_t len, float logprob,
                     const int32_t *top_ids, const float *top_lps, int n_top) {
    choice *c = ud;
    job *j = c->j;
    int want_lp = j->top_logprobs >= 0;
    lp_entry e;
    if (want_lp) {
        e.token = token;
        e.logprob = logprob;
        e.n_top = ZS_MAX(0, ZS_MIN(n_top, ZS_SAMPLER_MAX_TOP_LOGPROBS));
        for (int k = 0; k < e.n_top; k++) {
            e.top_ids[k] = top_ids[k];
            e.top_lps[k] = top_lps[k];
        }
    }
    pthread_mutex_lock(&j->mu);
    if (j->tool_mode && j->streaming) {
        sb_addn(&c->text, text, len);
        if (!j->closed) tool_stream_locked(j, c, 0);
    } else if (j->streaming) {
        e.offset = c->emitted;
        if (!j->closed && (len || want_lp))
            emit_choice_locked(j, chunk_choice(j, c->index, NULL, text ? text : "", len,
                                               want_lp ? logprobs_json(j, &e, 1) : NULL, NULL));
        c->emitted += len;
    } else {
        e.offset = c->text.len;
        sb_addn(&c->text, text, len);
        if (want_lp) {
            if (c->n_lps == c->cap_lps) {
                int nc = c->cap_lps ? 2 * c->cap_lps : 16;
                lp_entry *np = realloc(c->lps, (size_t)nc * sizeof *np);
                if (np) {
                    c->lps = np;
                    c->cap_lps = nc;
                }
            }
            if (c->n_lps < c->cap_lps) c->lps[c->n_lps++] = e;
        }
    }
    pthread_mutex_unlock(&j->mu);
}


static void job_finish(job *j);

static void on_done(void *ud, int finish, const char *text, size_t len, int n_prompt,
                    int n_generated, int err, const char *msg) {
    choice *c = ud;
    job *j = c->j;
    pthread_mutex_lock(&j->mu);
    while (j->cancelling) pthread_cond_wait(&j->cv, &j->mu);
    j->t_done = zs_now();
    c->done = 1;
    c->req = NULL;
    c->finish = finish;
    c->n_prompt = n_prompt;
    c->n_gen = n_generated;
    if (finish == ZS_DONE_ERROR) {
        c->err = err ? err : ZS_EIO;
        c->errmsg = strdup(msg ? msg : "generation failed");
    }
    if (j->tool_mode && j->streaming) {
        sb_addn(&c->text, text, len);
        if ((finish == ZS_DONE_STOP || finish == ZS_DONE_LENGTH) && !j->closed) tool_stream_finish_locked(j, c, finish);
    } else if (j->streaming) {
        if (finish == ZS_DONE_STOP || finish == ZS_DONE_LENGTH) {
            if (len) emit_choice_locked(j, chunk_choice(j, c->index, NULL, text, len, NULL, NULL));
            c->emitted += len;
            emit_choice_locked(j, chunk_choice(j, c->index, NULL, NULL, 0, NULL, finish_name(finish)));
        }
    } else {
        sb_addn(&c->text, text, len);
    }
    int last = --j->remaining == 0;
    pthread_mutex_unlock(&j->mu);
    if (last) job_finish(j);
}

/* Cancels every submitted, unfinished choice. close: the client has gone. */
static void job_cancel(job *j, int close) {
    pthread_mutex_lock(&j->mu);
    if (close) j->closed = 1;
    zs_request *reqs[MAX_CHOICES];
    int n = 0;
    for (int i = 0; i < j->n; i++)
        if (j->ch[i].req && !j->ch[i].done) reqs[n++] = j->ch[i].req;
    j->cancelling++;
    pthread_mutex_unlock(&j->mu);
    for (int i = 0; i < n; i++) zs_sched_cancel(j->sched, reqs[i]);
    pthread_mutex_lock(&j->mu);
    j->cancelling--;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

static void on_close(void *ud) { job_cancel(ud, 1); }

static json_t *usage_json(job *j) {
    long gen = 0;
    for (int i = 0; i < j->n; i++) gen += j->ch[i].n_gen;
    return json_pack("{s:i,s:I,s:I}", "prompt_tokens", j->prompt_tokens, "completion_tokens", (json_int_t)gen,
                     "total_tokens", (json_int_t)(gen + j->prompt_tokens));
}

/* A tool-mode chat choice (not streamed): the message with the calls parsed out of its text. */
static json_t *tool_choice_json(job *j, const choice *c, json_t *lp) {
    zs_toolcall_parsed p = {0};
    char seed[64];
    snprintf(seed, sizeof seed, "%s%d", j->id + strlen("chatcmpl-"), c->index);
    if (zs_toolcall_parse(j->tools->fmt, c->text.p ? c->text.p : "", c->text.len, j->tools->defs, j->tools->n, seed,
                          &p) < 0)
        memset(&p, 0, sizeof p);
    json_t *msg;
    const char *finish = finish_name(c->finish);
    if (p.n_calls > 0) {
        msg = json_pack("{s:s,s:o,s:o}", "role", "assistant", "content",
                        p.content && *p.content ? json_string(p.content) : json_null(), "tool_calls",
                        zs_api_tool_calls_json(&p));
        if (c->finish == ZS_DONE_STOP) finish = "tool_calls";
    } else {
        msg = json_pack("{s:s,s:s%}", "role", "assistant", "content", c->text.p ? c->text.p : "", c->text.len);
    }
    zs_toolcall_parsed_free(&p);
    return json_pack("{s:i,s:o,s:o,s:s}", "index", c->index, "message", msg, "logprobs", lp, "finish_reason", finish);
}

/* All choices are done (no locks held; only one thread gets here): answer and free. */
static void job_finish(job *j) {
    /* the first failure among the choices, if any */
    const choice *failed = NULL, *cancelled = NULL;
    for (int i = 0; i < j->n; i++) {
        if (!j->ch[i].submitted) continue;
        if (j->ch[i].finish == ZS_DONE_ERROR && !failed) failed = &j->ch[i];
        if (j->ch[i].finish == ZS_DONE_CANCELLED && !cancelled) cancelled = &j->ch[i];
    }
    char lost[512];
    if (!j->err.status && !j->closed && (failed || cancelled) && zs_cluster_lost(lost, sizeof lost)) {
        zs_api_fail(&j->err, 503, NULL, "world_lost", "The multi-process world is lost (restart it): %s", lost);
    } else if (!j->err.status && !j->closed) {
        if (failed && failed->err == ZS_ECANCELLED && j->adapter)
            /* zs_sched_fail_lora: the adapter was unloaded while the request ran (as a request
             * naming it from now on, 404) */
            zs_api_fail(&j->err, 404, "model", "model_not_found", "%s", failed->errmsg ? failed->errmsg : "the adapter was unloaded");
        else if (failed) zs_api_fail(&j->err, 500, NULL, NULL, "generation failed: %s", failed->errmsg ? failed->errmsg : "");
        else if (cancelled) zs_api_fail(&j->err, 503, NULL, NULL, "the request was cancelled: the server is shutting down");
    }
    {
        /* the tenant's tokens-a-minute pay for what was computed, answered or not */
        long gen = 0;
        for (int i = 0; i < j->n; i++) gen += j->ch[i].n_gen;
        zs_http_req_charge(j->stream ? zs_http_stream_req(j->stream) : j->req, gen + j->prompt_tokens);
    }
    if (j->stream) {
        pthread_mutex_lock(&j->mu);
        if (j->err.status) {
            json_t *ev = json_pack("{s:{s:s,s:s,s:n,s:s?}}", "error", "message", j->err.msg, "type", j->err.type,
                                   "param", "code", j->err.code);
            emit_json_locked(j, ev);
        } else {
            if (j->include_usage) {
                json_t *c = chunk_base(j);
                if (c) {
                    json_object_set_new(c, "choices", json_array());
                    json_object_set_new(c, "usage", usage_json(j));
                    emit_json_locked(j, c);
                }
            }
            emit_locked(j, "[DONE]", 6);
        }
        pthread_mutex_unlock(&j->mu);
        zs_http_stream_end(j->stream);
    } else if (j->req) {
        if (j->err.status) {
            respond_err(j->req, &j->err);
        } else if (j->closed) {
            zs_http_respond_error(j->req, 499, "invalid_request_error", NULL, NULL, "client closed the request");
        } else {
            json_t *choices = json_array();
            for (int i = 0; i < j->n; i++) {
                choice *c = &j->ch[i];
                json_t *lp = j->top_logprobs >= 0 ? logprobs_json(j, c->lps, c->n_lps) : json_null();
                json_t *o;
                if (j->chat && j->tool_mode)
                    o = tool_choice_json(j, c, lp);
                else if (j->chat)
                    o = json_pack("{s:i,s:{s:s,s:s%},s:o,s:s}", "index", c->index, "message", "role", "assistant",
                                  "content", c->text.p ? c->text.p : "", c->text.len, "logprobs", lp,
                                  "finish_reason", finish_name(c->finish));
                else
                    o = json_pack("{s:s%,s:i,s:o,s:s}", "text", c->text.p ? c->text.p : "", c->text.len, "index",
                                  c->index, "logprobs", lp, "finish_reason", finish_name(c->finish));
                json_array_append_new(choices, o);
            }
            json_t *resp = json_pack("{s:s,s:s,s:I,s:s,s:o,s:o}", "id", j->id, "object",
                                     j->chat ? "chat.completion" : "text_completion", "created",
                                     (json_int_t)j->created, "model", j->model_id, "choices", choices,
                                     "usage", usage_json(j));
            char ms[32];
            snprintf(ms, sizeof ms, "%.3f", (j->t_done - j->t_submit) * 1e3);
            zs_http_add_header(j->req, "X-Engine-Time-Ms", ms);
            zs_http_respond_json(j->req, 200, resp);
        }
    }
    job_free(j);
}

static void job_release(job *j) {
    pthread_mutex_lock(&j->mu);
    int last = --j->remaining == 0;
    pthread_mutex_unlock(&j->mu);
    if (last) job_finish(j);
}

static void handle_generate(zs_api *a, zs_http_req *r, int chat) {
    api_err e = {0};
    pthread_mutex_lock(&a->mu);
    zs_sched *s = a->base.sched;
    int draining = a->draining;
    pthread_mutex_unlock(&a->mu);
    char lost[512];
    if (zs_cluster_lost(lost, sizeof lost)) {
        zs_api_fail(&e, 503, NULL, "world_lost", "The multi-process world is lost (restart it): %s", lost);
        respond_err(r, &e);
        return;
    }
    if (draining) {
        zs_api_fail(&e, 503, NULL, "shutting_down", "The server is shutting down.");
        respond_err(r, &e);
        return;
    }
    if (!s) {
        zs_api_fail(&e, 503, NULL, "model_loading", "The model is still loading; try again shortly.");
        respond_err(r, &e);
        return;
    }
    req_t q;
    if (zs_api_parse_request(a, r, chat, &q, &e) < 0) {
        zs_api_req_free(&q);
        respond_err(r, &e);
        return;
    }
    s = q.model->sched;
    int n = q.n_prompts * q.n;
    job *j = calloc(1, sizeof *j);
    choice *ch = j ? calloc((size_t)n, sizeof *ch) : NULL;
    if (!ch) {
        free(j);
        zs_api_req_free(&q);
        zs_http_respond_error(r, 500, "server_error", NULL, NULL, "out of memory");
        return;
    }
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->api = a;
    j->m = q.model;
    j->adapter = q.adapter; /* the job holds the request's adapter reference from here on */
    q.adapter = NULL;
    j->model_id = j->adapter ? j->adapter->name : j->m->model_name;
    j->sched = s;
    j->req = r;
    j->chat = chat;
    j->streaming = q.stream;
    j->include_usage = q.include_usage;
    j->top_logprobs = q.top_logprobs;
    j->cons = q.cons; /* the job owns the constraint and the tools from here on */
    j->tools = q.tools;
    q.cons = NULL;
    q.tools = NULL;
    j->tool_mode = chat && j->tools && j->tools->choice != ZS_API_TC_NONE;
    snprintf(j->id, sizeof j->id, "%s", chat ? "chatcmpl-" : "cmpl-");
    random_hex(j->id + strlen(j->id), 12);
    j->created = (long)time(NULL);
    j->n = n;
    j->ch = ch;
    for (int i = 0; i < q.n_prompts; i++) j->prompt_tokens += q.n_prompt[i];
    j->remaining = n + 1; /* + the handler's own hold */
    pthread_mutex_lock(&a->mu);
    a->live++;
    pthread_mutex_unlock(&a->mu);
    if (chat && q.stream)
        for (int i = 0; i < n; i++)
            emit_choice_locked(j, chunk_choice(j, i, "assistant", "", 0, NULL, NULL));
    zs_http_on_close(r, on_close, j);

    j->t_submit = zs_now();
    int stop = 0;
    for (int i = 0; i < n; i++) {
        choice *c = &ch[i];
        c->j = j;
        c->index = i;
        pthread_mutex_lock(&j->mu);
        stop = stop || j->closed || j->err.status;
        if (stop) j->remaining--;
        pthread_mutex_unlock(&j->mu);
        if (stop) continue;
        int p = i / q.n, k = i % q.n;
        zs_req_params rp = {0};
        rp.prompt = q.prompts[p];
        rp.n_prompt = q.n_prompt[p];
        rp.max_tokens = q.max_tokens;
        rp.sampling = q.sp;
        rp.sampling.seed = q.seed + (uint64_t)k;
        rp.stop = q.n_stop ? q.stop : NULL;
        rp.n_stop = q.n_stop;
        rp.top_logprobs = q.top_logprobs;
        rp.ignore_eos = q.ignore_eos;
        rp.n_end_ids = q.n_end_ids;
        memcpy(rp.end_ids, q.end_ids, sizeof rp.end_ids);
        rp.lora = j->adapter ? j->adapter->lora : NULL;
        rp.constraint = j->cons ? &j->cons->rc : NULL;
        zs_req_sink sink = {on_token, on_done, c, NULL};
        zs_request *rq = NULL;
        c->submitted = 1; /* before submit: on_done may come at once */
        int rc = zs_sched_submit(s, &rp, &sink, &rq);
        pthread_mutex_lock(&j->mu);
        if (rc == 0) {
            if (!c->done) c->req = rq;
        } else {
            c->submitted = 0;
            j->remaining--;
            if (!j->err.status) {
                pthread_mutex_lock(&a->mu);
                int shutting = a->draining;
                pthread_mutex_unlock(&a->mu);
                if (rc == ZS_ECANCELLED || shutting)
                    zs_api_fail(&j->err, 503, NULL, "shutting_down", "The server is shutting down.");
                else if (rc == ZS_EBUSY)
                    zs_api_fail(&j->err, 429, NULL, "rate_limit_exceeded",
                         "The server is busy: the request queue is full. Retry shortly.");
                else if (rc == ZS_ERANGE || rc == ZS_EINVAL)
                    zs_api_fail(&j->err, 400, NULL, "invalid_value", "%s", zs_errmsg());
                else
                    zs_api_fail(&j->err, 500, NULL, NULL, "cannot queue the request: %s", zs_errmsg());
            }
        }
        int cancel_now = rc == 0 && j->closed && !c->done;
        pthread_mutex_unlock(&j->mu);
        if (cancel_now) job_cancel(j, 1);
    }
    zs_api_req_free(&q);
    pthread_mutex_lock(&j->mu);
    int failed = j->err.status != 0, closed = j->closed;
    pthread_mutex_unlock(&j->mu);
    if (failed) {
        job_cancel(j, 0);
    } else if (j->streaming && !closed) {
        zs_http_stream *st = NULL;
        int rc = zs_http_stream_start(r, 200, "text/event-stream", &st);
        pthread_mutex_lock(&j->mu);
        if (rc == 0) {
            j->stream = st;
            j->started = 1;
            if (j->pre.len && !j->closed) zs_http_stream_write(st, j->pre.p, j->pre.len);
            free(j->pre.p);
            memset(&j->pre, 0, sizeof j->pre);
        } else if (rc == ZS_ECANCELLED) {
            j->req = NULL; /* released by the HTTP layer */
        } else {
            zs_api_fail(&j->err, 500, NULL, NULL, "cannot start the stream: %s", zs_errmsg());
        }
        pthread_mutex_unlock(&j->mu);
        if (rc < 0) job_cancel(j, rc == ZS_ECANCELLED);
    }
    job_release(j);
}

/* ------------------------------------------------------------------ routes */

static void h_completions(void *ud, zs_http_req *r) { handle_generate(ud, r, 0); }
static void h_chat(void *ud, zs_http_req *r) { handle_generate(ud, r, 1); }

static void h_health(void *ud, zs_http_req *r) {
    char lost[512];
    if (zs_cluster_lost(lost, sizeof lost)) {
        json_t *j = json_pack("{s:s,s:s}", "status", "error", "error", lost);
        char *b = j ? json_dumps(j, JSON_COMPACT) : NULL;
        zs_http_respond(r, 503, "application/json", b ? b : "{\"status\":\"error\"}", b ? strlen(b) : 18);
        free(b);
        json_decref(j);
        return;
    }
    int ok = zs_api_loaded(ud);
    const char *b = ok ? "{\"status\":\"ok\"}" : "{\"status\":\"loading\"}";
    zs_http_respond(r, ok ? 200 : 503, "application/json", b, strlen(b));
}

static json_t *model_json(const zs_api_model *m) {
    return json_pack("{s:s,s:s,s:I,s:s}", "id", m->model_name, "object", "model", "created", (json_int_t)m->created,
                     "owned_by", "zeroserve");
}

/* An adapter as a model (vLLM's shape): "parent" is the base model's id, "root" the adapter's
 * directory. (mu held or a reference on ad) */
static json_t *adapter_json(const zs_api *a, const zs_api_adapter *ad) {
    return json_pack("{s:s,s:s,s:I,s:s,s:s,s:s}", "id", ad->name, "object", "model", "created", (json_int_t)ad->created,
                     "owned_by", "zeroserve", "root", ad->dir, "parent", a->base.model_name);
}

/* The models and adapters the caller sees: the base, and those served to every tenant or to its
 * own (keys.h's zs_key_sees; admins see all). */
static void h_models(void *ud, zs_http_req *r) {
    zs_api *a = ud;
    const zs_key_id *who = zs_http_req_who(r);
    json_t *data = json_array();
    json_array_append_new(data, model_json(&a->base));
    pthread_mutex_lock(&a->mu);
    const zs_api_model *x = a->extra;
    json_t *ads = json_array(); /* newest first in the table: listed oldest first */
    for (const zs_api_adapter *ad = a->adapters; ad; ad = ad->next)
        if (zs_key_sees(who, ad->owner)) json_array_insert_new(ads, 0, adapter_json(a, ad));
    pthread_mutex_unlock(&a->mu);
    json_t *ft = json_array(); /* the list is newest first: list the oldest first */
    for (; x; x = x->next)
        if (zs_key_sees(who, x->owner)) json_array_insert_new(ft, 0, model_json(x));
    json_array_extend(data, ft);
    json_array_extend(data, ads);
    json_decref(ft);
    json_decref(ads);
    zs_http_respond_json(r, 200, json_pack("{s:s,s:o}", "object", "list", "data", data));
}

static void h_model(void *ud, zs_http_req *r) {
    zs_api *a = ud;
    const char *id = zs_http_req_param(r);
    const zs_api_model *m = NULL;
    zs_api_adapter *ad = NULL;
    if (!id || zs_api_resolve(a, id, zs_http_req_who(r), &m, &ad) < 0) {
        zs_http_respond_error(r, 404, "invalid_request_error", "model", "model_not_found",
                              "The model '%s' does not exist.", id ? id : "");
        return;
    }
    json_t *o = ad ? adapter_json(a, ad) : model_json(m);
    zs_api_adapter_release(a, ad);
    zs_http_respond_json(r, 200, o);
}

/* ------------------------------------------------------------------ LoRA adapters (vLLM's routes) */

/* The body of an adapter route: a JSON object with only the keys of known (NULL-terminated).
 * NULL after answering 400. */
static json_t *adapter_body(zs_http_req *r, const char *const *known) {
    size_t len;
    const char *body = zs_http_req_body(r, &len);
    json_error_t je;
    json_t *root = json_loadb(body, len, JSON_ALLOW_NUL, &je); /* strings with a NUL are refused by name */
    if (!root) {
        zs_http_respond_error(r, 400, "invalid_request_error", NULL, NULL,
                              "We could not parse the JSON body of your request: %s (line %d, column %d).", je.text,
                              je.line, je.column);
        return NULL;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        zs_http_respond_error(r, 400, "invalid_request_error", NULL, NULL, "The body must be a JSON object.");
        return NULL;
    }
    const char *k;
    json_t *v;
    json_object_foreach(root, k, v) {
        int ok = 0;
        for (int i = 0; known[i] && !ok; i++) ok = !strcmp(k, known[i]);
        if (!ok) {
            zs_http_respond_error(r, 400, "invalid_request_error", k, "unknown_parameter",
                                  "Unrecognized request argument supplied: %s", k);
            json_decref(root);
            return NULL;
        }
    }
    return root;
}

/* A required non-empty string field; NULL after answering 400. */
static const char *adapter_str(zs_http_req *r, json_t *root, const char *key) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        zs_http_respond_error(r, 400, "invalid_request_error", key, "missing_required_parameter",
                              "Missing required parameter: '%s'.", key);
        return NULL;
    }
    if (!json_is_string(v) || !json_string_length(v) || strlen(json_string_value(v)) != json_string_length(v)) {
        zs_http_respond_error(r, 400, "invalid_request_error", key, "invalid_value",
                              "Invalid '%s': expected a non-empty string.", key);
        return NULL;
    }
    return json_string_value(v);
}

/* 503 while loading or shutting down; 0 to go on. */
static int adapter_unavailable(zs_api *a, zs_http_req *r) {
    pthread_mutex_lock(&a->mu);
    int loading = !a->base.sched, draining = a->draining;
    pthread_mutex_unlock(&a->mu);
    if (!loading && !draining) return 0;
    zs_http_add_header(r, "Retry-After", "1");
    zs_http_respond_error(r, 503, "server_error", NULL, draining ? "shutting_down" : "model_loading", "%s",
                          draining ? "The server is shutting down." : "The model is still loading; try again shortly.");
    return 1;
}

/* The one answer to every lora_path refused (outside the --lora-dir directories, or not there):
 * the same bytes whether or not the path exists elsewhere. */
static void lora_path_refused(zs_http_req *r) {
    zs_http_respond_error(r, 400, "invalid_request_error", "lora_path", "invalid_lora_path",
                          "Invalid 'lora_path': not an adapter directory under the server's --lora-dir (give a path "
                          "relative to one of them, or an absolute path inside one).");
}

/* POST /v1/load_lora_adapter {"lora_name", "lora_path"}: loads a PEFT adapter directory under one
 * of serve's --lora-dir directories (zs_api_lora_path) against the base model and serves it as
 * lora_name. Without --lora-dir run-time loading is off: 403 lora_loading_disabled. */
static void h_load_adapter(void *ud, zs_http_req *r) {
    zs_api *a = ud;
    static const char *const known[] = {"lora_name", "lora_path", NULL};
    if (adapter_unavailable(a, r)) return;
    if (!a->n_lora_dirs) {
        zs_http_respond_error(r, 403, "permission_error", NULL, "lora_loading_disabled",
                              "Loading LoRA adapters at run time is off on this server: start it with --lora-dir DIR "
                              "to allow adapters under DIR (adapters given with --lora are served from the start).");
        return;
    }
    json_t *root = adapter_body(r, known);
    if (!root) return;
    char *path = NULL;
    const char *name = adapter_str(r, root, "lora_name");
    json_t *pv = name ? json_object_get(root, "lora_path") : NULL;
    if (!name) goto out;
    if (!pv || json_is_null(pv)) {
        zs_http_respond_error(r, 400, "invalid_request_error", "lora_path", "missing_required_parameter",
                              "Missing required parameter: 'lora_path'.");
        goto out;
    }
    if (!json_is_string(pv)) {
        zs_http_respond_error(r, 400, "invalid_request_error", "lora_path", "invalid_type",
                              "Invalid type for 'lora_path': expected a string.");
        goto out;
    }
    if (strlen(name) > 256) {
        zs_http_respond_error(r, 400, "invalid_request_error", "lora_name", "invalid_value",
                              "Invalid 'lora_name': at most 256 characters.");
        goto out;
    }
    if (zs_api_name_taken(a, name)) {
        zs_http_respond_error(r, 400, "invalid_request_error", "lora_name", "lora_adapter_exists",
                              "The name '%s' is already served (a model or a LoRA adapter); unload it first or "
                              "choose another.", name);
        goto out;
    }
    int rc = zs_api_lora_path(a, json_string_value(pv), json_string_length(pv), &path);
    if (rc == ZS_ENOMEM) {
        zs_http_respond_error(r, 500, "server_error", NULL, NULL, "cannot load the adapter: out of memory");
        goto out;
    }
    if (rc < 0) {
        lora_path_refused(r);
        goto out;
    }
    rc = zs_api_load_adapter(a, name, NULL, path); /* an admin's: served to every tenant */
    if (rc == ZS_EBUSY) {
        adapter_unavailable(a, r);
    } else if (rc == ZS_ENOMEM) {
        zs_http_respond_error(r, 500, "server_error", NULL, NULL, "cannot load the adapter: %s", zs_errmsg());
    } else if (rc < 0) {
        const char *code = rc == ZS_EUNSUPPORTED ? "unsupported_lora_adapter" : "invalid_lora_adapter";
        if (zs_api_name_taken(a, name)) code = "lora_adapter_exists"; /* loaded meanwhile under that name */
        zs_http_respond_error(r, 400, "invalid_request_error", !strcmp(code, "lora_adapter_exists") ? "lora_name" : "lora_path",
                              code, "Cannot load the LoRA adapter '%s': %s", name, zs_errmsg());
    } else {
        const zs_api_model *m = NULL;
        zs_api_adapter *ad = NULL;
        json_t *o = NULL;
        if (zs_api_resolve(a, name, NULL, &m, &ad) == 0 && ad) {
            const zs_lora_params *p = zs_lora_get_params(ad->lora);
            json_t *tm = json_array();
            for (int t = 0; t < ZS_LORA_NT; t++)
                if (p->targets & (1u << t)) json_array_append_new(tm, json_string(zs_lora_target_name(t)));
            o = json_pack("{s:s,s:s,s:I,s:s,s:s,s:i,s:f,s:o,s:I}", "object", "lora_adapter", "id", ad->name, "created",
                          (json_int_t)ad->created, "parent", a->base.model_name, "root", ad->dir, "r", p->r, "alpha",
                          (double)p->alpha, "target_modules", tm, "parameters", (json_int_t)zs_lora_param_count(ad->lora));
        } else { /* unloaded at once by another request */
            o = json_pack("{s:s,s:s,s:s,s:s}", "object", "lora_adapter", "id", name, "parent", a->base.model_name,
                          "root", path);
        }
        zs_api_adapter_release(a, ad);
        zs_http_req_set_object(r, name);
        zs_http_respond_json(r, 200, o);
    }
out:
    free(path);
    json_decref(root);
}

#define UNLOAD_WAIT_S 30.0 /* how long an unload waits for the requests using the adapter by default */

/* POST /v1/unload_lora_adapter {"lora_name", "wait_s"?}: stops serving the adapter (404 for it
 * from now on), waits up to wait_s (default 30, at most 3600) for the requests using it, fails
 * those left, and answers once it is freed (or left to the last of them). */
static void h_unload_adapter(void *ud, zs_http_req *r) {
    zs_api *a = ud;
    static const char *const known[] = {"lora_name", "lora_int_id", "wait_s", NULL};
    json_t *root = adapter_body(r, known);
    if (!root) return;
    const char *name = adapter_str(r, root, "lora_name");
    if (!name) goto out;
    double wait_s = UNLOAD_WAIT_S;
    json_t *w = json_object_get(root, "wait_s");
    if (w && !json_is_null(w)) {
        if (!json_is_number(w) || !(json_number_value(w) >= 0) || json_number_value(w) > 3600) {
            zs_http_respond_error(r, 400, "invalid_request_error", "wait_s", "invalid_value",
                                  "Invalid 'wait_s': expected a number of seconds between 0 and 3600.");
            goto out;
        }
        wait_s = json_number_value(w);
    }
    int n_failed = 0;
    int rc = zs_api_unload_adapter(a, name, wait_s, &n_failed);
    if (rc == ZS_ENOTFOUND) {
        zs_http_respond_error(r, 404, "invalid_request_error", "lora_name", "lora_adapter_not_found",
                              "No LoRA adapter named '%s' is served.", name);
    } else if (rc < 0) {
        zs_http_respond_error(r, 500, "server_error", NULL, NULL, "cannot unload the adapter: %s", zs_errmsg());
    } else {
        zs_http_respond_json(r, 200, json_pack("{s:s,s:s,s:b,s:i}", "object", "lora_adapter", "id", name, "deleted", 1,
                                               "failed_requests", n_failed));
    }
out:
    json_decref(root);
}

static void h_metrics(void *ud, zs_http_req *r) {
    zs_api *a = ud;
    pthread_mutex_lock(&a->mu);
    zs_sched *s = a->base.sched;
    pthread_mutex_unlock(&a->mu);
    char *text = NULL;
    size_t len = 0;
    if (zs_metrics_render(a->http, s, &text, &len) < 0) {
        zs_http_respond_error(r, 500, "server_error", NULL, NULL, "cannot render metrics: %s", zs_errmsg());
        return;
    }
    zs_http_respond(r, 200, "text/plain; version=0.0.4; charset=utf-8", text, len);
    free(text);
}

/* GET /v1/plan: where the weights and the KV cache live and why (engine.h, plan-auto.h) */
static void h_plan(void *ud, zs_http_req *r) {
    zs_api *a = ud;
    pthread_mutex_lock(&a->mu);
    zs_engine *e = a->base.engine;
    pthread_mutex_unlock(&a->mu);
    char *j = e ? zs_engine_plan_json(e) : NULL;
    if (!j) {
        zs_http_respond_error(r, 503, "server_error", NULL, "loading", "The model is still loading.");
        return;
    }
    zs_http_respond(r, 200, "application/json", j, strlen(j));
    free(j);
}

static void h_playground(void *ud, zs_http_req *r) {
    (void)ud;
    zs_http_respond(r, 200, "text/html; charset=utf-8", (const char *)zs_playground_html, zs_playground_html_len);
}

/* ------------------------------------------------------------------ lifecycle */

int zs_api_new(zs_http *h, const zs_api_opts *o, zs_api **out) {
    if (!h || !o || !o->model_name || !out) return zs_err(ZS_EINVAL, "api: bad arguments");
    zs_api *a = calloc(1, sizeof *a);
    if (!a) return zs_err(ZS_ENOMEM, "api: out of memory");
    a->http = h;
    a->base.model_name = strdup(o->model_name);
    a->base.tmpl = o->chat_template >= 0 ? o->chat_template : zs_model_chat_template_detect(o->model_dir);
    a->base.ref_tok = -1;
    a->base.created = (long)time(NULL);
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->cv, NULL);
    int rc = a->base.model_name ? 0 : zs_err(ZS_ENOMEM, "api: out of memory");
    if (!rc) rc = zs_api_set_lora_dirs(a, o->lora_dirs, o->n_lora_dirs);
    if (!rc) rc = zs_http_route(h, "GET", "/health", ZS_ROLE_NONE, h_health, a);
    if (!rc) rc = zs_http_route(h, "GET", "/", ZS_ROLE_NONE, h_playground, a);
    if (!rc) rc = zs_api_openapi_route(h);                                                               /* api-openapi.c */
    if (!rc) rc = zs_http_route(h, "GET", "/metrics", ZS_ROLE_ADMIN, h_metrics, a);
    if (!rc) rc = zs_http_route(h, "GET", "/v1/models", ZS_ROLE_INFERENCE, h_models, a);
    if (!rc) rc = zs_http_route(h, "GET", "/v1/plan", ZS_ROLE_ADMIN, h_plan, a);
    if (!rc) rc = zs_http_route(h, "GET", "/v1/models/{id}", ZS_ROLE_INFERENCE, h_model, a);
    if (!rc) rc = zs_http_route(h, "POST", "/v1/completions", ZS_ROLE_INFERENCE, h_completions, a);
    if (!rc) rc = zs_http_route(h, "POST", "/v1/chat/completions", ZS_ROLE_INFERENCE, h_chat, a);
    if (!rc) rc = zs_http_route(h, "POST", "/v1/load_lora_adapter", ZS_ROLE_ADMIN, h_load_adapter, a);
    if (!rc) rc = zs_http_route(h, "POST", "/v1/unload_lora_adapter", ZS_ROLE_ADMIN, h_unload_adapter, a);
    if (!rc) rc = zs_http_route(h, "POST", "/tokenize", ZS_ROLE_INFERENCE, zs_api_h_tokenize, a);       /* api-extra.c */
    if (!rc) rc = zs_http_route(h, "POST", "/detokenize", ZS_ROLE_INFERENCE, zs_api_h_detokenize, a);
    if (!rc) rc = zs_http_route(h, "POST", "/v1/embeddings", ZS_ROLE_INFERENCE, zs_api_h_embeddings, a);
    if (rc < 0) {
        zs_api_free(a);
        return rc;
    }
    *out = a;
    return 0;
}

void zs_api_drain(zs_api *a) {
    pthread_mutex_lock(&a->mu);
    a->draining = 1;
    pthread_mutex_unlock(&a->mu);
}

int zs_api_loaded(zs_api *a) {
    pthread_mutex_lock(&a->mu);
    int ok = a->base.sched != NULL;
    pthread_mutex_unlock(&a->mu);
    return ok;
}

long zs_api_live(zs_api *a) {
    pthread_mutex_lock(&a->mu);
    long n = a->live;
    pthread_mutex_unlock(&a->mu);
    return n;
}

long zs_api_wait_idle(zs_api *a, double timeout_s) {
    double end = zs_now() + timeout_s;
    pthread_mutex_lock(&a->mu);
    while (a->live > 0) {
        double left = end - zs_now();
        if (left <= 0) break;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        double t = ts.tv_sec + ts.tv_nsec * 1e-9 + ZS_MIN(left, 0.1);
        ts.tv_sec = (time_t)t;
        ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
        pthread_cond_timedwait(&a->cv, &a->mu, &ts);
    }
    long n = a->live;
    pthread_mutex_unlock(&a->mu);
    return n;
}

void zs_api_free(zs_api *a) {
    if (!a) return;
    long left = zs_api_wait_idle(a, 5.0);
    if (left) {
        zs_log_error("api: %ld requests still live at shutdown; leaking them", left);
        return;
    }
    zs_api_adapters_free(a);
    zs_api_lora_dirs_free(a);
    /* the cached grammars' masks borrow the models' tokenizers */
    for (zs_api_model *m = &a->base; m; m = m == &a->base ? a->extra : m->next)
        if (m->tok) zs_api_grammar_purge(m->tok);
    pthread_mutex_destroy(&a->mu);
    pthread_cond_destroy(&a->cv);
    for (zs_api_model *m = &a->base, *next; m; m = next) {
        next = m == &a->base ? a->extra : m->next;
        free(m->model_name);
        free(m->owner);
        free(m->bos);
        free(m->eos);
        free(m->ref_text);
        if (m != &a->base) free(m);
    }
    free(a);
}

