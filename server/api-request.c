/* api-request.c — parsing and validation of /v1/completions and /v1/chat/completions request
 * bodies (jansson), strictly: malformed JSON, unknown fields, wrong types and out-of-range
 * values are 400s whose `param` names the field; an unknown model is 404; a prompt that does
 * not fit the context is 400 context_length_exceeded. Prompts are tokenized here (chat through
 * the chat template, chat.h).
 *
 * Decisions where OpenAI has no exact answer: unknown fields are 400 (param = the field);
 * frequency_penalty / presence_penalty must be 0, echo false, best_of 1, suffix null or "",
 * logit_bias empty; other values are 400 code "unsupported_parameter". response_format
 * (json_object / json_schema, chat and completions) and tools / tool_choice (chat) become the
 * request's constraint (api-tools.c); a JSON response_format together with tools is accepted
 * only with tool_choice "none". Messages may hold role "tool" (tool_call_id required) and
 * assistant tool_calls; with tools or such parts the prompt is rendered by toolcall.h in the
 * format of the model's chat family. A prompt over the context names "tools" when there are
 * tools (the message says by how many tokens). A missing "model" means the served model; a
 * "model" naming a LoRA adapter runs on the base model with it (q->adapter holds a reference).
 * top_p 0 means greedy; top_k (0 or -1 = off), min_p and ignore_eos are extensions. Content
 * parts of one message are joined with "\n". Default max_tokens: 16 (completions, capped by
 * the room left in the context), the rest of the context (chat). */
#define _GNU_SOURCE
#include "api-request.h"
#include "api-tools.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "chat.h"
#include "common.h"
#include "strbuf.h"

static uint64_t random_u64(void) {
    uint64_t x;
    if (getrandom(&x, sizeof x, 0) != (ssize_t)sizeof x) x = (uint64_t)(zs_now() * 1e9);
    return x;
}

/* Number field (integer or real); absent/null leaves *out. */
static int get_num(json_t *o, const char *name, double lo, double hi, double *out, int *given, api_err *e) {
    json_t *v = json_object_get(o, name);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v)) return zs_api_bad_type(e, name, "a number", v);
    double x = json_number_value(v);
    if (!isfinite(x) || x < lo || x > hi)
        return zs_api_fail(e, 400, name, "invalid_value", "Invalid '%s': %g is out of range; expected a value between %g and %g.",
                    name, x, lo, hi);
    *out = x;
    if (given) *given = 1;
    return 0;
}

static int int_value(json_t *v, long long *out) {
    if (json_is_integer(v)) {
        *out = json_integer_value(v);
        return 1;
    }
    if (json_is_real(v)) {
        double x = json_real_value(v);
        if (isfinite(x) && x == floor(x) && fabs(x) < 9e15) {
            *out = (long long)x;
            return 1;
        }
    }
    return 0;
}

static int get_int(json_t *o, const char *name, long long lo, long long hi, long long *out, int *given,
                   api_err *e) {
    json_t *v = json_object_get(o, name);
    if (!v || json_is_null(v)) return 0;
    long long x;
    if (!int_value(v, &x)) return zs_api_bad_type(e, name, "an integer", v);
    if (x < lo || x > hi)
        return zs_api_fail(e, 400, name, "invalid_value", "Invalid '%s': %lld is out of range; expected a value between %lld and %lld.",
                    name, x, lo, hi);
    *out = x;
    if (given) *given = 1;
    return 0;
}

static int get_bool(json_t *o, const char *name, int *out, api_err *e) {
    json_t *v = json_object_get(o, name);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return zs_api_bad_type(e, name, "a boolean", v);
    *out = json_is_true(v);
    return 0;
}

static int unsupported(api_err *e, const char *name, const char *what) {
    return zs_api_fail(e, 400, name, "unsupported_parameter", "'%s' is not supported by this server: %s.", name, what);
}

/* ------------------------------------------------------------------ request parsing */

void zs_api_req_free(req_t *q) {
    if (q->adapter) zs_api_adapter_release(q->api, q->adapter);
    q->adapter = NULL;
    for (int i = 0; i < q->n_prompts; i++) free(q->prompts[i]);
    free(q->prompts);
    free(q->n_prompt);
    zs_api_cons_free(q->cons);
    zs_api_tools_free(q->tools);
    q->cons = NULL;
    q->tools = NULL;
    json_decref(q->root);
}

static const char *k_cmpl_fields[] = {
    "model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "n",
    "logprobs", "stream", "stream_options", "user", "frequency_penalty", "presence_penalty", "echo",
    "best_of", "suffix", "logit_bias", "ignore_eos", "response_format", NULL};
static const char *k_chat_fields[] = {
    "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
    "min_p", "seed", "stop", "n", "logprobs", "top_logprobs", "stream", "stream_options", "user",
    "frequency_penalty", "presence_penalty", "logit_bias", "response_format", "ignore_eos", "tools",
    "tool_choice", "parallel_tool_calls", "metadata", "store", "service_tier", NULL};

static int check_fields(json_t *root, const char *const *known, api_err *e) {
    const char *k;
    json_t *v;
    json_object_foreach(root, k, v) {
        int ok = 0;
        for (int i = 0; known[i] && !ok; i++) ok = !strcmp(k, known[i]);
        if (!ok) return zs_api_fail(e, 400, k, "unknown_parameter", "Unrecognized request argument supplied: %s", k);
    }
    return 0;
}

static int add_prompt(req_t *q, int32_t *ids, int n, api_err *e) {
    if (q->n_prompts >= MAX_CHOICES) {
        free(ids);
        return zs_api_fail(e, 400, "prompt", "invalid_value", "Too many prompts (at most %d).", MAX_CHOICES);
    }
    int32_t **np = realloc(q->prompts, (size_t)(q->n_prompts + 1) * sizeof *np);
    if (np) q->prompts = np;
    int *nn = realloc(q->n_prompt, (size_t)(q->n_prompts + 1) * sizeof *nn);
    if (nn) q->n_prompt = nn;
    if (!np || !nn) {
        free(ids);
        return zs_api_fail(e, 500, NULL, NULL, "out of memory");
    }
    q->prompts[q->n_prompts] = ids;
    q->n_prompt[q->n_prompts] = n;
    q->n_prompts++;
    return 0;
}

static int encode_text(const zs_api_model *a, req_t *q, const char *text, size_t len, int add_special,
                       const char *param, api_err *e) {
    int32_t *ids = NULL;
    size_t n = 0;
    if (zs_tokenizer_encode(a->tok, text, len, add_special, &ids, &n) < 0)
        return zs_api_fail(e, 400, param, "invalid_value", "Cannot tokenize '%s': %s", param, zs_errmsg());
    if (n == 0) {
        free(ids);
        return zs_api_fail(e, 400, param, "invalid_value", "'%s' must not be empty (it encodes to no tokens).", param);
    }
    if (n > (size_t)a->context) {
        free(ids);
        return zs_api_fail(e, 400, param, "context_length_exceeded",
                    "This model's maximum context length is %d tokens, but the %s has %zu tokens.",
                    a->context, !strcmp(param, "messages") ? "conversation" : "prompt", n);
    }
    return add_prompt(q, ids, (int)n, e);
}

static int token_ids(const zs_api_model *a, req_t *q, json_t *arr, const char *param, api_err *e) {
    size_t n = json_array_size(arr);
    if (n == 0) return zs_api_fail(e, 400, param, "invalid_value", "'%s' must not be empty.", param);
    if (n > (size_t)a->context)
        return zs_api_fail(e, 400, param, "context_length_exceeded",
                    "This model's maximum context length is %d tokens, but the prompt has %zu tokens.",
                    a->context, n);
    int32_t *ids = malloc(n * sizeof *ids);
    if (!ids) return zs_api_fail(e, 500, NULL, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        long long x;
        json_t *v = json_array_get(arr, i);
        if (!int_value(v, &x) || x < 0 || x >= a->vocab) {
            free(ids);
            return zs_api_fail(e, 400, param, "invalid_value",
                        "Invalid '%s': item %zu must be a token id between 0 and %d.", param, i, a->vocab - 1);
        }
        ids[i] = (int32_t)x;
    }
    return add_prompt(q, ids, (int)n, e);
}

static int parse_prompt(const zs_api_model *a, req_t *q, api_err *e) {
    json_t *p = json_object_get(q->root, "prompt");
    q->prompt_param = "prompt";
    if (!p || json_is_null(p)) return zs_api_fail(e, 400, "prompt", "missing_required_parameter", "Missing required parameter: 'prompt'.");
    if (json_is_string(p))
        return encode_text(a, q, json_string_value(p), json_string_length(p), 1, "prompt", e);
    if (!json_is_array(p)) return zs_api_bad_type(e, "prompt", "a string or an array", p);
    size_t n = json_array_size(p);
    if (n == 0) return zs_api_fail(e, 400, "prompt", "invalid_value", "'prompt' must not be an empty array.");
    json_t *first = json_array_get(p, 0);
    if (json_is_number(first)) return token_ids(a, q, p, "prompt", e);
    size_t i;
    json_t *v;
    json_array_foreach(p, i, v) {
        if (json_is_string(v) && json_is_string(first)) {
            if (encode_text(a, q, json_string_value(v), json_string_length(v), 1, "prompt", e) < 0) return -1;
        } else if (json_is_array(v) && json_is_array(first)) {
            if (token_ids(a, q, v, "prompt", e) < 0) return -1;
        } else {
            return zs_api_fail(e, 400, "prompt", "invalid_type",
                        "Invalid type for 'prompt': expected a string, an array of strings, an array of token ids "
                        "or an array of arrays of token ids.");
        }
    }
    return 0;
}

/* Content of messages[i]: a string, text parts joined with "\n" (*owned malloc'd), or null where
 * null_ok. 0 or -1 with e filled. */
static int msg_content(json_t *c, size_t i, int null_ok, const char **out, char **owned, api_err *e) {
    char pname[96];
    snprintf(pname, sizeof pname, "messages[%zu].content", i);
    *out = NULL;
    if (json_is_string(c)) {
        *out = json_string_value(c);
        return 0;
    }
    if ((!c || json_is_null(c)) && null_ok) return 0;
    if (!json_is_array(c))
        return c ? zs_api_bad_type(e, pname, "a string or an array of content parts", c)
                 : zs_api_fail(e, 400, pname, "missing_required_parameter", "Missing required parameter: '%s'.", pname);
    sbuf b = {0};
    size_t j;
    json_t *part;
    json_array_foreach(c, j, part) {
        json_t *type = json_object_get(part, "type");
        json_t *text = json_object_get(part, "text");
        if (!json_is_object(part) || !json_is_string(type) || strcmp(json_string_value(type), "text")) {
            free(b.p);
            snprintf(pname, sizeof pname, "messages[%zu].content[%zu].type", i, j);
            return zs_api_fail(e, 400, pname, "invalid_value", "Invalid '%s': only content parts of type 'text' are supported.",
                               pname);
        }
        if (!json_is_string(text)) {
            free(b.p);
            snprintf(pname, sizeof pname, "messages[%zu].content[%zu].text", i, j);
            return text ? zs_api_bad_type(e, pname, "a string", text)
                        : zs_api_fail(e, 400, pname, "missing_required_parameter", "Missing required parameter: '%s'.", pname);
        }
        if (j) sb_addn(&b, "\n", 1);
        sb_addn(&b, json_string_value(text), json_string_length(text));
    }
    if (b.oom) {
        free(b.p);
        return zs_api_fail(e, 500, NULL, NULL, "out of memory");
    }
    *owned = b.p;
    *out = b.p ? b.p : "";
    return 0;
}

/* A required string field of messages[i] (path: "tool_call_id", "tool_calls[0].id", ...). */
static int msg_str(json_t *o, const char *key, size_t i, const char *path, const char **out, api_err *e) {
    char pname[96];
    snprintf(pname, sizeof pname, "messages[%zu].%s", i, path);
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v))
        return zs_api_fail(e, 400, pname, "missing_required_parameter", "Missing required parameter: '%s'.", pname);
    if (!json_is_string(v)) return zs_api_bad_type(e, pname, "a string", v);
    *out = json_string_value(v);
    return 0;
}

/* An assistant's tool_calls: [{id, type:"function", function:{name, arguments}}]. */
static int msg_tool_calls(json_t *tc, size_t i, zs_tool_msg *m, api_err *e) {
    char pname[96];
    snprintf(pname, sizeof pname, "messages[%zu].tool_calls", i);
    if (!tc || json_is_null(tc)) return 0;
    if (!json_is_array(tc)) return zs_api_bad_type(e, pname, "an array", tc);
    size_t n = json_array_size(tc);
    if (!n) return 0;
    zs_tool_call *calls = calloc(n, sizeof *calls);
    if (!calls) return zs_api_fail(e, 500, NULL, NULL, "out of memory");
    m->tool_calls = calls;
    m->n_tool_calls = (int)n;
    for (size_t k = 0; k < n; k++) {
        json_t *c = json_array_get(tc, k);
        char path[64];
        snprintf(pname, sizeof pname, "messages[%zu].tool_calls[%zu]", i, k);
        if (!json_is_object(c)) return zs_api_bad_type(e, pname, "an object", c);
        snprintf(path, sizeof path, "tool_calls[%zu].id", k);
        if (msg_str(c, "id", i, path, &calls[k].id, e) < 0) return -1;
        json_t *type = json_object_get(c, "type");
        snprintf(pname, sizeof pname, "messages[%zu].tool_calls[%zu].type", i, k);
        if (type && !json_is_null(type) && (!json_is_string(type) || strcmp(json_string_value(type), "function")))
            return zs_api_fail(e, 400, pname, "invalid_value", "Invalid value for '%s': only 'function' is supported.", pname);
        json_t *fn = json_object_get(c, "function");
        snprintf(pname, sizeof pname, "messages[%zu].tool_calls[%zu].function", i, k);
        if (!fn) return zs_api_fail(e, 400, pname, "missing_required_parameter", "Missing required parameter: '%s'.", pname);
        if (!json_is_object(fn)) return zs_api_bad_type(e, pname, "an object", fn);
        snprintf(path, sizeof path, "tool_calls[%zu].function.name", k);
        if (msg_str(fn, "name", i, path, &calls[k].name, e) < 0) return -1;
        snprintf(path, sizeof path, "tool_calls[%zu].function.arguments", k);
        if (msg_str(fn, "arguments", i, path, &calls[k].arguments, e) < 0) return -1;
        json_t *args = json_loads(calls[k].arguments, 0, NULL);
        int obj = json_is_object(args);
        json_decref(args);
        if (!obj) {
            snprintf(pname, sizeof pname, "messages[%zu].tool_calls[%zu].function.arguments", i, k);
            return zs_api_fail(e, 400, pname, "invalid_value", "Invalid '%s': expected a JSON object as a string.", pname);
        }
    }
    return 0;
}

/* Validates a chat's messages (roles system/developer/user/assistant/tool; content a string,
 * text parts joined with "\n", or null for an assistant; a tool message's tool_call_id; an
 * assistant's tool_calls) and renders them with the model's template, with tools (may be NULL)
 * in the format of its family (toolcall.h) when there are tools or tool parts; add_gen: with the
 * generation prompt; *out malloc'd. */
static int render_chat(const zs_api_model *a, json_t *m, const zs_api_tools *tools, int add_gen, char **out,
                       api_err *e) {
    *out = NULL;
    if (!m || json_is_null(m)) return zs_api_fail(e, 400, "messages", "missing_required_parameter", "Missing required parameter: 'messages'.");
    if (!json_is_array(m)) return zs_api_bad_type(e, "messages", "an array", m);
    size_t n = json_array_size(m);
    if (n == 0) return zs_api_fail(e, 400, "messages", "invalid_value", "'messages' must contain at least one message.");
    if (n > 100000) return zs_api_fail(e, 400, "messages", "invalid_value", "Too many messages.");
    zs_tool_msg *msgs = calloc(n, sizeof *msgs);
    char **owned = calloc(n, sizeof *owned);
    int rc = 0, tool_parts = 0;
    char pname[96];
    if (!msgs || !owned) rc = zs_api_fail(e, 500, NULL, NULL, "out of memory");
    for (size_t i = 0; rc == 0 && i < n; i++) {
        json_t *msg = json_array_get(m, i);
        snprintf(pname, sizeof pname, "messages[%zu]", i);
        if (!json_is_object(msg)) {
            rc = zs_api_bad_type(e, pname, "an object", msg);
            break;
        }
        json_t *role = json_object_get(msg, "role");
        snprintf(pname, sizeof pname, "messages[%zu].role", i);
        if (!json_is_string(role)) {
            rc = role ? zs_api_bad_type(e, pname, "a string", role)
                      : zs_api_fail(e, 400, pname, "missing_required_parameter", "Missing required parameter: '%s'.", pname);
            break;
        }
        const char *rs = json_string_value(role);
        int is_tool = !strcmp(rs, "tool"), is_asst = !strcmp(rs, "assistant");
        if (strcmp(rs, "system") && strcmp(rs, "user") && !is_asst && strcmp(rs, "developer") && !is_tool) {
            rc = zs_api_fail(e, 400, pname, "invalid_value",
                      "Invalid value for '%s': '%s' is not supported (expected 'system', 'user', 'assistant' or 'tool').",
                      pname, rs);
            break;
        }
        msgs[i].role = rs;
        if (is_tool) {
            tool_parts = 1;
            if ((rc = msg_str(msg, "tool_call_id", i, "tool_call_id", &msgs[i].tool_call_id, e)) < 0) break;
            json_t *nm = json_object_get(msg, "name");
            if (nm && !json_is_null(nm)) {
                snprintf(pname, sizeof pname, "messages[%zu].name", i);
                if (!json_is_string(nm)) {
                    rc = zs_api_bad_type(e, pname, "a string", nm);
                    break;
                }
                msgs[i].name = json_string_value(nm);
            }
        }
        if (is_asst) {
            if ((rc = msg_tool_calls(json_object_get(msg, "tool_calls"), i, &msgs[i], e)) < 0) break;
            if (msgs[i].n_tool_calls) tool_parts = 1;
        } else if (json_object_get(msg, "tool_calls")) {
            snprintf(pname, sizeof pname, "messages[%zu].tool_calls", i);
            rc = zs_api_fail(e, 400, pname, "invalid_value", "Invalid '%s': only assistant messages have tool calls.", pname);
            break;
        }
        if ((rc = msg_content(json_object_get(msg, "content"), i, is_asst, &msgs[i].content, &owned[i], e)) < 0) break;
        if (!msgs[i].content && !msgs[i].n_tool_calls) msgs[i].content = "";
    }
    char *text = NULL;
    int n_tools = tools ? tools->n : 0;
    if (rc == 0) {
        int r2;
        if (!n_tools && !tool_parts) {
            zs_chat_msg *cm = calloc(n, sizeof *cm);
            for (size_t i = 0; cm && i < n; i++) {
                cm[i].role = msgs[i].role;
                cm[i].content = msgs[i].content;
            }
            r2 = cm ? zs_chat_render(a->tmpl, cm, (int)n, add_gen, a->bos, a->eos, &text)
                    : zs_err(ZS_ENOMEM, "out of memory");
            free(cm);
        } else {
            r2 = zs_toolcall_render(a->tmpl, tools ? tools->fmt : zs_toolcall_format(a->tmpl), msgs, (int)n,
                                    tools ? tools->defs : NULL, n_tools, add_gen, a->bos, a->eos, &text);
        }
        if (r2 < 0) {
            const char *em = zs_errmsg();
            const char *colon = strchr(em, ':');
            if ((!strncmp(em, "messages", 8) || !strncmp(em, "tools", 5)) && colon && (size_t)(colon - em) < sizeof pname) {
                memcpy(pname, em, (size_t)(colon - em));
                pname[colon - em] = '\0';
            } else {
                snprintf(pname, sizeof pname, "messages");
            }
            rc = zs_api_fail(e, r2 == ZS_ENOMEM ? 500 : 400, pname, "invalid_value", "%s", em);
        }
    }
    if (owned)
        for (size_t i = 0; i < n; i++) free(owned[i]);
    if (msgs)
        for (size_t i = 0; i < n; i++) free((void *)msgs[i].tool_calls);
    free(owned);
    free(msgs);
    if (rc == 0) *out = text;
    else free(text);
    return rc;
}

/* Shared with /tokenize: the messages without tools. */
int zs_api_render_messages(const zs_api_model *a, json_t *m, int add_gen, char **out, api_err *e) {
    return render_chat(a, m, NULL, add_gen, out, e);
}

static int parse_messages(const zs_api_model *a, req_t *q, api_err *e) {
    q->prompt_param = "messages";
    char *text = NULL;
    int rc = render_chat(a, json_object_get(q->root, "messages"), q->tools, 1, &text, e);
    if (rc == 0) {
        int32_t *ids = NULL;
        size_t n = 0;
        if (zs_tokenizer_encode(a->tok, text, strlen(text), !zs_chat_has_bos(a->tmpl), &ids, &n) < 0) {
            rc = zs_api_fail(e, 400, "messages", "invalid_value", "Cannot tokenize 'messages': %s", zs_errmsg());
        } else if (n > (size_t)a->context) {
            free(ids);
            if (q->tools && q->tools->n)
                rc = zs_api_fail(e, 400, "tools", "context_length_exceeded",
                                 "This model's maximum context length is %d tokens, but the messages with the %d "
                                 "rendered tools have %zu tokens, %zu more. Please reduce the length of the messages "
                                 "or tools.", a->context, q->tools->n, n, n - (size_t)a->context);
            else
                rc = zs_api_fail(e, 400, "messages", "context_length_exceeded",
                                 "This model's maximum context length is %d tokens, but the conversation has %zu "
                                 "tokens, %zu more. Please reduce the length of the messages.", a->context, n,
                                 n - (size_t)a->context);
        } else if (n == 0) {
            free(ids);
            rc = zs_api_fail(e, 400, "messages", "invalid_value", "'messages' must not be empty (it encodes to no tokens).");
        } else {
            rc = add_prompt(q, ids, (int)n, e);
        }
    }
    free(text);
    /* the template's end of turn, where the vocabulary has it as one token, ends the answer as EOS does */
    const char *const *ends = zs_chat_stop_strings(a->tmpl);
    q->n_end_ids = 0;
    for (int i = 0; rc == 0 && ends && ends[i] && q->n_end_ids < 4; i++) {
        int id = zs_tokenizer_token_id(a->tok, ends[i]);
        if (id >= 0) q->end_ids[q->n_end_ids++] = id;
    }
    return rc;
}

/* The text of one token as it appears inside a text: decoding [ref, id] minus the decoded ref,
 * so the leading space SentencePiece decoders strip at the start of a text is kept. */
char *zs_api_token_text(const zs_api_model *a, int32_t id) {
    char *s = NULL;
    if (a->ref_tok >= 0) {
        int32_t two[2] = {a->ref_tok, id};
        if (zs_tokenizer_decode(a->tok, two, 2, 0, &s) == 0) {
            size_t rl = strlen(a->ref_text);
            if (!strncmp(s, a->ref_text, rl)) {
                memmove(s, s + rl, strlen(s + rl) + 1);
                return s;
            }
            free(s);
            s = NULL;
        }
    }
    if (zs_tokenizer_decode(a->tok, &id, 1, 0, &s) == 0) return s;
    return strdup("");
}

int zs_api_parse_request(zs_api *a, zs_http_req *r, int chat, req_t *q, api_err *e) {
    size_t blen;
    const char *body = zs_http_req_body(r, &blen);
    return zs_api_parse_body(a, zs_http_req_who(r), body, blen, chat, q, e);
}

int zs_api_parse_body(zs_api *a, const zs_key_id *who, const char *body, size_t blen, int chat, req_t *q,
                      api_err *e) {
    memset(q, 0, sizeof *q);
    q->api = a;
    q->chat = chat;
    q->top_logprobs = -1;
    q->n = 1;
    zs_sampler_params_default(&q->sp);
    json_error_t je;
    q->root = json_loadb(body, blen, 0, &je);
    if (!q->root)
        return zs_api_fail(e, 400, NULL, NULL,
                    "We could not parse the JSON body of your request: %s (line %d, column %d). "
                    "The body must be a JSON object.", je.text, je.line, je.column);
    if (!json_is_object(q->root))
        return zs_api_fail(e, 400, NULL, NULL, "The body of your request must be a JSON object, not %s.",
                    zs_api_json_type(q->root));
    json_t *root = q->root;
    if (check_fields(root, chat ? k_chat_fields : k_cmpl_fields, e) < 0) return -1;

    json_t *model = json_object_get(root, "model");
    const zs_api_model *m = zs_api_model_find(a, NULL);
    if (model && !json_is_null(model)) {
        if (!json_is_string(model)) return zs_api_bad_type(e, "model", "a string", model);
        if (zs_api_resolve(a, json_string_value(model), who, &m, &q->adapter) < 0)
            return zs_api_fail(e, 404, "model", "model_not_found", "The model '%s' does not exist (this server serves '%s').",
                        json_string_value(model), a->base.model_name);
    }
    if (!m) return zs_api_fail(e, 503, NULL, "model_loading", "The model is still loading; try again shortly.");
    q->model = m;

    double x;
    long long ll;
    int given = 0;
    x = q->sp.temperature;
    if (get_num(root, "temperature", 0, 2, &x, NULL, e) < 0) return -1;
    q->sp.temperature = (float)x;
    x = q->sp.top_p;
    if (get_num(root, "top_p", 0, 1, &x, NULL, e) < 0) return -1;
    if (x == 0) { /* OpenAI allows 0: only the most likely token */
        q->sp.top_p = 1;
        q->sp.top_k = 1;
    } else {
        q->sp.top_p = (float)x;
    }
    ll = -2;
    if (get_int(root, "top_k", -1, 1LL << 30, &ll, NULL, e) < 0) return -1;
    if (ll > 0 && q->sp.top_k != 1) q->sp.top_k = (int)ll; /* 0 and -1 (vLLM) = off */
    x = 0;
    if (get_num(root, "min_p", 0, 1, &x, NULL, e) < 0) return -1;
    if (x >= 1) return zs_api_fail(e, 400, "min_p", "invalid_value", "Invalid 'min_p': expected a value >= 0 and < 1.");
    q->sp.min_p = (float)x;
    given = 0;
    if (get_int(root, "seed", INT64_MIN, INT64_MAX, &ll, &given, e) < 0) return -1;
    q->seed = given ? (uint64_t)ll : random_u64();
    ll = 1;
    if (get_int(root, "n", 1, MAX_N, &ll, NULL, e) < 0) return -1;
    q->n = (int)ll;
    if (get_bool(root, "stream", &q->stream, e) < 0) return -1;
    json_t *so = json_object_get(root, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) return zs_api_bad_type(e, "stream_options", "an object", so);
        if (!q->stream)
            return zs_api_fail(e, 400, "stream_options", "invalid_value", "'stream_options' is only allowed when 'stream' is true.");
        const char *k;
        json_t *v;
        json_object_foreach(so, k, v) {
            if (strcmp(k, "include_usage"))
                return zs_api_fail(e, 400, "stream_options", "unknown_parameter", "Unrecognized stream option: %s", k);
        }
        json_t *iu = json_object_get(so, "include_usage");
        if (iu && !json_is_null(iu)) {
            if (!json_is_boolean(iu)) return zs_api_bad_type(e, "stream_options.include_usage", "a boolean", iu);
            q->include_usage = json_is_true(iu);
        }
    }
    if (get_bool(root, "ignore_eos", &q->ignore_eos, e) < 0) return -1;

    /* stop */
    json_t *st = json_object_get(root, "stop");
    if (st && !json_is_null(st)) {
        json_t *one[1] = {st};
        size_t ns = 1;
        if (json_is_array(st)) ns = json_array_size(st);
        else if (!json_is_string(st)) return zs_api_bad_type(e, "stop", "a string or an array of strings", st);
        if (ns > ZS_STOP_MAX_COUNT)
            return zs_api_fail(e, 400, "stop", "invalid_value", "Invalid 'stop': at most %d stop sequences are supported.",
                        ZS_STOP_MAX_COUNT);
        for (size_t i = 0; i < ns; i++) {
            json_t *v = json_is_array(st) ? json_array_get(st, i) : one[0];
            if (!json_is_string(v)) return zs_api_bad_type(e, "stop", "a string or an array of strings", v);
            size_t l = json_string_length(v);
            if (l == 0) continue; /* an empty stop string stops nothing */
            if (l > ZS_STOP_MAX_LEN || strlen(json_string_value(v)) != l)
                return zs_api_fail(e, 400, "stop", "invalid_value", "Invalid 'stop': each stop sequence must be 1 to %d bytes.",
                            ZS_STOP_MAX_LEN);
            q->stop[q->n_stop++] = json_string_value(v);
        }
    }

    /* logprobs */
    if (!chat) {
        ll = -1;
        if (get_int(root, "logprobs", 0, MAX_LOGPROBS_CMPL, &ll, NULL, e) < 0) return -1;
        q->top_logprobs = (int)ll;
    } else {
        int want = 0;
        if (get_bool(root, "logprobs", &want, e) < 0) return -1;
        ll = 0;
        given = 0;
        if (get_int(root, "top_logprobs", 0, ZS_SAMPLER_MAX_TOP_LOGPROBS, &ll, &given, e) < 0) return -1;
        if (given && !want)
            return zs_api_fail(e, 400, "top_logprobs", "invalid_value", "'top_logprobs' requires 'logprobs' to be true.");
        q->top_logprobs = want ? (int)ll : -1;
    }

    /* accepted only with their neutral values */
    const char *pens[] = {"frequency_penalty", "presence_penalty"};
    for (int i = 0; i < 2; i++) {
        x = 0;
        if (get_num(root, pens[i], -2, 2, &x, NULL, e) < 0) return -1;
        if (x != 0) return unsupported(e, pens[i], "only 0 is accepted");
    }
    if (!chat) {
        int echo = 0;
        if (get_bool(root, "echo", &echo, e) < 0) return -1;
        if (echo) return unsupported(e, "echo", "only false is accepted");
        ll = 1;
        if (get_int(root, "best_of", 1, 1 << 20, &ll, NULL, e) < 0) return -1;
        if (ll != 1) return unsupported(e, "best_of", "only 1 is accepted");
        json_t *sfx = json_object_get(root, "suffix");
        if (sfx && !json_is_null(sfx)) {
            if (!json_is_string(sfx)) return zs_api_bad_type(e, "suffix", "a string", sfx);
            if (json_string_length(sfx)) return unsupported(e, "suffix", "only null or \"\" is accepted");
        }
    }
    json_t *lb = json_object_get(root, "logit_bias");
    if (lb && !json_is_null(lb)) {
        if (!json_is_object(lb)) return zs_api_bad_type(e, "logit_bias", "an object", lb);
        if (json_object_size(lb)) return unsupported(e, "logit_bias", "only an empty map is accepted");
    }
    json_t *us = json_object_get(root, "user");
    if (us && !json_is_null(us) && !json_is_string(us)) return zs_api_bad_type(e, "user", "a string", us);
    if (chat) {
        if (zs_api_tools_parse(root, m, &q->tools, e) < 0) return -1;
        json_t *md = json_object_get(root, "metadata");
        if (md && !json_is_null(md) && !json_is_object(md)) return zs_api_bad_type(e, "metadata", "an object", md);
        json_t *sto = json_object_get(root, "store");
        if (sto && !json_is_null(sto) && !json_is_boolean(sto)) return zs_api_bad_type(e, "store", "a boolean", sto);
        json_t *tier = json_object_get(root, "service_tier");
        if (tier && !json_is_null(tier) && !json_is_string(tier)) return zs_api_bad_type(e, "service_tier", "a string", tier);
    }

    /* max tokens: validated before the prompt so a type error is reported as such */
    const char *mt_name = "max_tokens";
    ll = -1;
    given = 0;
    if (get_int(root, "max_tokens", 1, INT32_MAX, &ll, &given, e) < 0) return -1;
    if (chat) {
        long long l2 = -1;
        int g2 = 0;
        if (get_int(root, "max_completion_tokens", 1, INT32_MAX, &l2, &g2, e) < 0) return -1;
        if (g2) {
            ll = l2;
            given = 1;
            mt_name = "max_completion_tokens";
        }
    }
    q->max_tokens_given = given;

    /* response_format: checked before the prompt (a type error is reported as such), compiled after it */
    json_t *rf = json_object_get(root, "response_format");
    int rf_json = 0;
    if (rf && !json_is_null(rf)) {
        if (!json_is_object(rf)) return zs_api_bad_type(e, "response_format", "an object", rf);
        json_t *t = json_object_get(rf, "type");
        rf_json = json_is_string(t) && strcmp(json_string_value(t), "text");
    }
    if (rf_json && q->tools && q->tools->choice != ZS_API_TC_NONE)
        return unsupported(e, "response_format", "a JSON response_format cannot be combined with tools unless "
                                                 "tool_choice is \"none\"");

    /* the prompt(s) */
    if ((chat ? parse_messages(m, q, e) : parse_prompt(m, q, e)) < 0) return -1;
    /* the constraint of every choice: the tools' call, or the response format's JSON */
    if (q->tools && q->tools->choice != ZS_API_TC_NONE) {
        if (zs_api_tools_constraint(q->tools, m, &q->cons, e) < 0) return -1;
    } else if (zs_api_response_format(root, m, &q->cons, e) < 0) {
        return -1;
    }
    if ((long)q->n_prompts * q->n > MAX_CHOICES)
        return zs_api_fail(e, 400, "n", "invalid_value", "Too many choices: %d prompts x n=%d is more than %d.", q->n_prompts,
                    q->n, MAX_CHOICES);
    int longest = 0;
    for (int i = 0; i < q->n_prompts; i++) longest = ZS_MAX(longest, q->n_prompt[i]);
    if (given) {
        if ((long long)longest + ll > m->context)
            return zs_api_fail(e, 400, mt_name, "context_length_exceeded",
                        "This model's maximum context length is %d tokens. However, you requested %lld tokens "
                        "(%d in the %s, %lld for the completion). Please reduce the length of the %s or %s.",
                        m->context, longest + ll, longest, chat ? "messages" : "prompt", ll,
                        chat ? "messages" : "prompt", mt_name);
        q->max_tokens = (int)ll;
    } else {
        int room = m->context - longest;
        if (room < 1)
            return zs_api_fail(e, 400, q->prompt_param, "context_length_exceeded",
                        "This model's maximum context length is %d tokens, and the %s already has %d tokens.",
                        m->context, chat ? "conversation" : "prompt", longest);
        q->max_tokens = chat ? room : ZS_MIN(16, room);
    }
    return 0;
}
