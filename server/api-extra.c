/* api-extra.c — POST /tokenize, POST /detokenize and POST /v1/embeddings (api-extra.h).
 *
 * /tokenize {"model"?, "prompt": string | "messages": [...], "add_special_tokens"? (true),
 * "add_generation_prompt"? (true, messages only), "with_pieces"? (false)} answers {"tokens",
 * "count", "max_model_len"}; llama.cpp's request is taken too: "content" for "prompt" (add_special
 * then defaults to false, as there), "add_special" for "add_special_tokens", "parse_special" (true
 * only); a field given under both names with different values is a 400 naming them; with_pieces each token is {"id", "piece"}, the piece being its text
 * as it appears inside a text, or its bytes as a list of integers where those are not valid
 * UTF-8 on their own (llama.cpp's shape). Messages go through the model's chat template as chat
 * completions do (encoded with BOS only where the template does not write it itself).
 * /detokenize {"model"?, "tokens": [ids]} answers {"prompt", "content"} (vLLM's and llama.cpp's
 * keys; bytes that are not valid UTF-8 become U+FFFD); {"tokens"} is llama.cpp's request as is.
 *
 * /v1/embeddings (OpenAI's shape): every input becomes one embedding request of the scheduler
 * (sched-embed.c: prefilled in the continuous batch beside generation traffic, its hidden rows
 * pooled, nothing sampled), all submitted at once; the last on_done (engine thread) or the handler,
 * whichever lets go last, answers with the vectors in input order, L2-normalised unless the
 * request says "normalize": false. Extensions: "pooling": "mean" | "last" (default: serve
 * --pooling), "normalize". A "model" naming a LoRA adapter runs with it (a reference is held
 * until the answer). A client that goes away does not cancel the (short) requests: they finish
 * and the answer is dropped. Strings are encoded with the tokenizer's special tokens (BOS), as
 * completion prompts are; token-id inputs are taken as they are. */
#define _GNU_SOURCE
#include "api-extra.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "api-models.h"
#include "api-request.h"
#include "chat.h"
#include "cluster.h"
#include "common.h"
#include "model.h"
#include "sched.h"
#include "strbuf.h"

#define MAX_EMBED_INPUTS 128 /* inputs per /v1/embeddings request */

static atomic_int g_pooling = ZS_POOL_MEAN;
void zs_api_set_default_pooling(int pooling) { atomic_store(&g_pooling, pooling == ZS_POOL_LAST ? ZS_POOL_LAST : ZS_POOL_MEAN); }
int zs_api_default_pooling(void) { return atomic_load(&g_pooling); }

/* ------------------------------------------------------------------ shared helpers */

static void respond_err(zs_http_req *r, const api_err *e) {
    if (e->status == 429 || e->status == 503) zs_http_add_header(r, "Retry-After", "1");
    zs_http_respond_error(r, e->status, e->type, e->param[0] ? e->param : NULL, e->code, "%s", e->msg);
}

static int bad_type(api_err *e, const char *name, const char *want) {
    return zs_api_fail(e, 400, name, "invalid_type", "Invalid type for '%s': expected %s.", name, want);
}

/* The body as a JSON object with only known keys (NULL-terminated), the model resolved (an
 * adapter: *ad holds a reference, or NULL when ad is NULL: then the base model answers). */
static json_t *parse_body(zs_api *a, zs_http_req *r, const char *const *known, const zs_api_model **m,
                          zs_api_adapter **ad, api_err *e) {
    char lost[512];
    pthread_mutex_lock(&a->mu);
    int draining = a->draining, loaded = a->base.sched != NULL;
    pthread_mutex_unlock(&a->mu);
    if (zs_cluster_lost(lost, sizeof lost)) {
        zs_api_fail(e, 503, NULL, "world_lost", "The multi-process world is lost (restart it): %s", lost);
        return NULL;
    }
    if (draining) {
        zs_api_fail(e, 503, NULL, "shutting_down", "The server is shutting down.");
        return NULL;
    }
    if (!loaded) {
        zs_api_fail(e, 503, NULL, "model_loading", "The model is still loading; try again shortly.");
        return NULL;
    }
    size_t blen;
    const char *body = zs_http_req_body(r, &blen);
    json_error_t je;
    json_t *root = json_loadb(body, blen, 0, &je);
    if (!root) {
        zs_api_fail(e, 400, NULL, NULL, "We could not parse the JSON body of your request: %s (line %d, column %d).",
                    je.text, je.line, je.column);
        return NULL;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        zs_api_fail(e, 400, NULL, NULL, "The body of your request must be a JSON object.");
        return NULL;
    }
    const char *k;
    json_t *v;
    json_object_foreach(root, k, v) {
        int ok = 0;
        for (int i = 0; known[i] && !ok; i++) ok = !strcmp(k, known[i]);
        if (!ok) {
            zs_api_fail(e, 400, k, "unknown_parameter", "Unrecognized request argument supplied: %s", k);
            json_decref(root);
            return NULL;
        }
    }
    json_t *model = json_object_get(root, "model");
    const zs_api_model *found = zs_api_model_find(a, NULL);
    zs_api_adapter *adapter = NULL;
    if (model && !json_is_null(model)) {
        if (!json_is_string(model)) {
            bad_type(e, "model", "a string");
            json_decref(root);
            return NULL;
        }
        if (zs_api_resolve(a, json_string_value(model), zs_http_req_who(r), &found, &adapter) < 0) {
            zs_api_fail(e, 404, "model", "model_not_found", "The model '%s' does not exist (this server serves '%s').",
                        json_string_value(model), a->base.model_name);
            json_decref(root);
            return NULL;
        }
    }
    if (!found) {
        zs_api_adapter_release(a, adapter);
        json_decref(root);
        zs_api_fail(e, 503, NULL, "model_loading", "The model is still loading; try again shortly.");
        return NULL;
    }
    if (ad) *ad = adapter;
    else zs_api_adapter_release(a, adapter); /* same tokenizer as its base */
    *m = found;
    return root;
}

static int get_bool(json_t *o, const char *name, int *out, api_err *e) {
    json_t *v = json_object_get(o, name);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return bad_type(e, name, "a boolean");
    *out = json_is_true(v);
    return 0;
}

/* Length of the valid UTF-8 sequence at s (n bytes left), or 0 when it is not one. */
static int utf8_len(const unsigned char *s, size_t n) {
    int len = s[0] < 0x80 ? 1 : (s[0] & 0xE0) == 0xC0 ? 2 : (s[0] & 0xF0) == 0xE0 ? 3 : (s[0] & 0xF8) == 0xF0 ? 4 : 0;
    if (!len || (size_t)len > n) return 0;
    for (int i = 1; i < len; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    unsigned cp = len == 1 ? s[0] : len == 2 ? s[0] & 0x1F : len == 3 ? s[0] & 0x0F : s[0] & 0x07;
    for (int i = 1; i < len; i++) cp = cp << 6 | (s[i] & 0x3F);
    static const unsigned min[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return len;
}

static int utf8_valid(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        int l = utf8_len((const unsigned char *)s + i, n - i);
        if (!l) return 0;
        i += (size_t)l;
    }
    return 1;
}

/* s as a JSON string, invalid bytes replaced by U+FFFD. */
static json_t *json_text(const char *s, size_t n) {
    sbuf b = {0};
    for (size_t i = 0; i < n;) {
        int l = utf8_len((const unsigned char *)s + i, n - i);
        if (l) sb_addn(&b, s + i, (size_t)l);
        else sb_addn(&b, "\xEF\xBF\xBD", 3);
        i += l ? (size_t)l : 1;
    }
    json_t *j = b.oom ? NULL : json_stringn(b.p ? b.p : "", b.len);
    free(b.p);
    return j;
}

/* Token ids of a JSON array (every item an integer in [0, vocab)); *out malloc'd. */
static int json_ids(const zs_api_model *m, json_t *arr, const char *param, int32_t **out, size_t *n, api_err *e) {
    size_t k = json_array_size(arr);
    int32_t *ids = malloc((k ? k : 1) * sizeof *ids);
    if (!ids) return zs_api_fail(e, 500, NULL, NULL, "out of memory");
    for (size_t i = 0; i < k; i++) {
        json_t *v = json_array_get(arr, i);
        json_int_t x = json_is_integer(v) ? json_integer_value(v) : -1;
        if (!json_is_integer(v) || x < 0 || x >= m->vocab) {
            free(ids);
            return zs_api_fail(e, 400, param, "invalid_value", "Invalid '%s': item %zu must be a token id between 0 and %d.",
                               param, i, m->vocab - 1);
        }
        ids[i] = (int32_t)x;
    }
    *out = ids;
    *n = k;
    return 0;
}

/* ------------------------------------------------------------------ /tokenize */

static const char *k_tokenize_fields[] = {"model", "prompt", "content", "messages", "add_special_tokens", "add_special",
                                          "parse_special", "add_generation_prompt", "with_pieces", NULL};

/* A field and its alias (another server's name for it): the one given, or either when both are
 * given with equal values; both with different values is a 400 naming them. NULL/null: neither. */
static int alias_field(json_t *root, const char *name, const char *alias, json_t **out, api_err *e) {
    json_t *a = root ? json_object_get(root, name) : NULL, *b = root ? json_object_get(root, alias) : NULL;
    if (a && json_is_null(a)) a = NULL;
    if (b && json_is_null(b)) b = NULL;
    if (a && b && !json_equal(a, b))
        return zs_api_fail(e, 400, alias, "invalid_value", "'%s' and '%s' name the same thing; give one of them (or "
                           "both with the same value).", name, alias);
    *out = a ? a : b;
    return 0;
}

void zs_api_h_tokenize(void *ud, zs_http_req *r) {
    zs_api *a = ud;
    api_err e = {0};
    const zs_api_model *m = NULL;
    json_t *root = parse_body(a, r, k_tokenize_fields, &m, NULL, &e), *out = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    char *text = NULL;
    int add_special = 1, add_gen = 1, pieces = 0, parse_special = 1, rc = root ? 0 : -1;
    json_t *prompt = NULL, *add_sp = NULL, *msgs = root ? json_object_get(root, "messages") : NULL;
    if (msgs && json_is_null(msgs)) msgs = NULL;
    /* llama.cpp's names: "content" for "prompt", "add_special" (default false there) */
    if (rc == 0) rc = alias_field(root, "prompt", "content", &prompt, &e);
    if (rc == 0) rc = alias_field(root, "add_special_tokens", "add_special", &add_sp, &e);
    if (rc == 0 && add_sp && !json_is_boolean(add_sp))
        rc = bad_type(&e, json_object_get(root, "add_special_tokens") ? "add_special_tokens" : "add_special", "a boolean");
    if (rc == 0 && add_sp) add_special = json_is_true(add_sp);
    else if (rc == 0 && prompt && !json_object_get(root, "prompt")) add_special = 0; /* llama.cpp's request, its default */
    if (rc == 0) rc = get_bool(root, "add_generation_prompt", &add_gen, &e);
    if (rc == 0) rc = get_bool(root, "with_pieces", &pieces, &e);
    if (rc == 0) rc = get_bool(root, "parse_special", &parse_special, &e);
    if (rc == 0 && !parse_special)
        rc = zs_api_fail(&e, 400, "parse_special", "unsupported_parameter", "'parse_special': false is not supported: "
                         "special tokens written in the text are always matched as their ids.");
    const char *pname = root && json_object_get(root, "prompt") ? "prompt" : "content";
    if (rc == 0 && !prompt && !msgs)
        rc = zs_api_fail(&e, 400, "prompt", "missing_required_parameter",
                         "Missing required parameter: 'prompt' (or 'content', or 'messages').");
    if (rc == 0 && prompt && msgs)
        rc = zs_api_fail(&e, 400, "messages", "invalid_value", "Give either '%s' or 'messages', not both.", pname);
    if (rc == 0 && prompt && !json_is_string(prompt)) rc = bad_type(&e, pname, "a string");
    if (rc == 0 && !msgs && json_object_get(root, "add_generation_prompt"))
        rc = zs_api_fail(&e, 400, "add_generation_prompt", "invalid_value", "'add_generation_prompt' applies to 'messages' only.");
    if (rc == 0 && msgs) {
        rc = zs_api_render_messages(m, msgs, add_gen, &text, &e);
        if (rc == 0) add_special = add_special && !zs_chat_has_bos(m->tmpl); /* as chat completions encode it */
    }
    const char *src = text ? text : prompt ? json_string_value(prompt) : "";
    size_t len = text ? strlen(text) : prompt ? json_string_length(prompt) : 0;
    if (rc == 0 && zs_tokenizer_encode(m->tok, src, len, add_special, &ids, &n) < 0)
        rc = zs_api_fail(&e, 400, msgs ? "messages" : pname, "invalid_value", "Cannot tokenize: %s", zs_errmsg());
    if (rc == 0) {
        json_t *arr = json_array();
        for (size_t i = 0; arr && i < n; i++) {
            if (!pieces) {
                json_array_append_new(arr, json_integer(ids[i]));
                continue;
            }
            char *p = zs_api_token_text(m, ids[i]);
            size_t pl = p ? strlen(p) : 0;
            json_t *pv;
            if (p && utf8_valid(p, pl)) {
                pv = json_stringn(p, pl);
            } else { /* bytes that are not UTF-8 on their own (a byte token, half a character) */
                pv = json_array();
                for (size_t k = 0; k < pl; k++) json_array_append_new(pv, json_integer((unsigned char)p[k]));
            }
            free(p);
            json_array_append_new(arr, json_pack("{s:i,s:o}", "id", (int)ids[i], "piece", pv));
        }
        out = json_pack("{s:o,s:i,s:i}", "tokens", arr, "count", (int)n, "max_model_len", m->context);
    }
    free(ids);
    free(text);
    json_decref(root);
    if (rc < 0) respond_err(r, &e);
    else zs_http_respond_json(r, 200, out);
}

/* ------------------------------------------------------------------ /detokenize */

static const char *k_detokenize_fields[] = {"model", "tokens", NULL};

void zs_api_h_detokenize(void *ud, zs_http_req *r) {
    zs_api *a = ud;
    api_err e = {0};
    const zs_api_model *m = NULL;
    json_t *root = parse_body(a, r, k_detokenize_fields, &m, NULL, &e), *out = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    char *text = NULL;
    int rc = root ? 0 : -1;
    json_t *toks = root ? json_object_get(root, "tokens") : NULL;
    if (rc == 0 && (!toks || json_is_null(toks)))
        rc = zs_api_fail(&e, 400, "tokens", "missing_required_parameter", "Missing required parameter: 'tokens'.");
    if (rc == 0 && !json_is_array(toks)) rc = bad_type(&e, "tokens", "an array of token ids");
    if (rc == 0) rc = json_ids(m, toks, "tokens", &ids, &n, &e);
    if (rc == 0 && zs_tokenizer_decode(m->tok, ids, n, 0, &text) < 0)
        rc = zs_api_fail(&e, 400, "tokens", "invalid_value", "Cannot detokenize: %s", zs_errmsg());
    if (rc == 0) {
        json_t *t = json_text(text, strlen(text));
        out = json_pack("{s:O,s:o}", "prompt", t, "content", t);
    }
    free(ids);
    free(text);
    json_decref(root);
    if (rc < 0) respond_err(r, &e);
    else zs_http_respond_json(r, 200, out);
}

/* ------------------------------------------------------------------ /v1/embeddings */

typedef struct emb_job emb_job;
typedef struct {
    emb_job *j;
    float *vec;
    int n_tok;
} emb_item;

struct emb_job {
    zs_api *api;
    zs_api_adapter *adapter; /* reference held until emb_free, or NULL */
    zs_http_req *req;
    pthread_mutex_t mu;
    int n, remaining, dim, normalize, base64, prompt_tokens;
    char model_id[256];
    emb_item *items;
    api_err err;
};

static void emb_free(emb_job *j) {
    zs_api *a = j->api;
    for (int i = 0; i < j->n; i++) free(j->items[i].vec);
    free(j->items);
    pthread_mutex_destroy(&j->mu);
    zs_api_adapter_release(a, j->adapter);
    free(j);
    pthread_mutex_lock(&a->mu);
    a->live--;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
}

static char *base64_f32(const float *v, int n) {
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t nb = (size_t)n * 4;
    unsigned char *b = malloc(nb ? nb : 1);
    char *o = malloc((nb + 2) / 3 * 4 + 1);
    if (!b || !o) {
        free(b);
        free(o);
        return NULL;
    }
    for (int i = 0; i < n; i++) { /* little-endian f32 */
        uint32_t u;
        memcpy(&u, &v[i], 4);
        for (int k = 0; k < 4; k++) b[(size_t)i * 4 + k] = (unsigned char)(u >> (8 * k));
    }
    size_t w = 0;
    for (size_t i = 0; i < nb; i += 3) {
        uint32_t x = (uint32_t)b[i] << 16 | (i + 1 < nb ? (uint32_t)b[i + 1] << 8 : 0) | (i + 2 < nb ? b[i + 2] : 0);
        o[w++] = tab[x >> 18 & 63];
        o[w++] = tab[x >> 12 & 63];
        o[w++] = i + 1 < nb ? tab[x >> 6 & 63] : '=';
        o[w++] = i + 2 < nb ? tab[x & 63] : '=';
    }
    o[w] = 0;
    free(b);
    return o;
}

/* Answers and frees the job (its last reference). */
static void emb_finish(emb_job *j) {
    if (j->err.status) {
        respond_err(j->req, &j->err);
        emb_free(j);
        return;
    }
    json_t *data = json_array();
    for (int i = 0; data && i < j->n; i++) {
        float *v = j->items[i].vec;
        if (j->normalize) { /* L2, in double */
            double ss = 0;
            for (int t = 0; t < j->dim; t++) ss += (double)v[t] * v[t];
            double nrm = sqrt(ss);
            if (nrm > 0)
                for (int t = 0; t < j->dim; t++) v[t] = (float)(v[t] / nrm);
        }
        json_t *emb;
        if (j->base64) {
            char *s = base64_f32(v, j->dim);
            emb = s ? json_string(s) : NULL;
            free(s);
        } else {
            emb = json_array();
            for (int t = 0; emb && t < j->dim; t++) json_array_append_new(emb, json_real(v[t]));
        }
        json_array_append_new(data, json_pack("{s:s,s:i,s:o}", "object", "embedding", "index", i, "embedding", emb));
    }
    json_t *out = json_pack("{s:s,s:o,s:s,s:{s:i,s:i}}", "object", "list", "data", data, "model", j->model_id, "usage",
                            "prompt_tokens", j->prompt_tokens, "total_tokens", j->prompt_tokens);
    zs_http_req_charge(j->req, j->prompt_tokens);
    zs_http_respond_json(j->req, 200, out);
    emb_free(j);
}

static void emb_release(emb_job *j) {
    pthread_mutex_lock(&j->mu);
    int last = --j->remaining == 0;
    pthread_mutex_unlock(&j->mu);
    if (last) emb_finish(j);
}

static void emb_on_token(void *ud, int32_t token, const char *text, size_t len, float logprob, const int32_t *top_ids,
                         const float *top_logprobs, int n_top) {
    (void)ud; (void)token; (void)text; (void)len; (void)logprob; (void)top_ids; (void)top_logprobs; (void)n_top;
}

static void emb_on_vec(void *ud, const float *vec, int dim) {
    emb_item *it = ud;
    float *v = malloc((size_t)dim * sizeof *v);
    if (v) memcpy(v, vec, (size_t)dim * sizeof *v);
    pthread_mutex_lock(&it->j->mu);
    it->vec = v;
    pthread_mutex_unlock(&it->j->mu);
}

static void emb_on_done(void *ud, int finish, const char *text, size_t len, int n_prompt, int n_generated, int err,
                        const char *msg) {
    (void)text; (void)len; (void)n_prompt; (void)n_generated;
    emb_item *it = ud;
    emb_job *j = it->j;
    pthread_mutex_lock(&j->mu);
    if (!j->err.status) {
        if (finish == ZS_DONE_CANCELLED)
            zs_api_fail(&j->err, 503, NULL, "shutting_down", "The request was cancelled: %s", msg && *msg ? msg : "cancelled");
        else if (finish != ZS_DONE_STOP)
            zs_api_fail(&j->err, 500, NULL, NULL, "The embedding failed: %s (%d)", msg && *msg ? msg : "error", err);
        else if (!it->vec)
            zs_api_fail(&j->err, 500, NULL, NULL, "out of memory");
    }
    pthread_mutex_unlock(&j->mu);
    emb_release(j);
}

static const char *k_embed_fields[] = {"model", "input", "encoding_format", "dimensions", "user", "pooling", "normalize", NULL};

/* One input: a string (encoded with BOS) or token ids, within the context. */
static int embed_input(const zs_api_model *m, json_t *v, const char *param, int32_t **ids, size_t *n, api_err *e) {
    if (json_is_string(v)) {
        if (json_string_length(v) == 0)
            return zs_api_fail(e, 400, param, "invalid_value", "Invalid '%s': the input must not be an empty string.", param);
        if (zs_tokenizer_encode(m->tok, json_string_value(v), json_string_length(v), 1, ids, n) < 0)
            return zs_api_fail(e, 400, param, "invalid_value", "Cannot tokenize '%s': %s", param, zs_errmsg());
    } else if (json_is_array(v)) {
        if (json_ids(m, v, param, ids, n, e) < 0) return -1;
    } else {
        return bad_type(e, param, "a string or an array of token ids");
    }
    if (*n == 0) {
        free(*ids);
        *ids = NULL;
        return zs_api_fail(e, 400, param, "invalid_value", "Invalid '%s': the input has no tokens.", param);
    }
    if (*n > (size_t)m->context) {
        free(*ids);
        *ids = NULL;
        return zs_api_fail(e, 400, param, "context_length_exceeded",
                           "This model's maximum context length is %d tokens, but '%s' has %zu tokens.", m->context, param, *n);
    }
    return 0;
}

void zs_api_h_embeddings(void *ud, zs_http_req *r) {
    zs_api *a = ud;
    api_err e = {0};
    const zs_api_model *m = NULL;
    zs_api_adapter *ad = NULL;
    json_t *root = parse_body(a, r, k_embed_fields, &m, &ad, &e);
    int rc = root ? 0 : -1, dim = 0, normalize = 1, base64 = 0, pooling = zs_api_default_pooling();
    if (rc == 0) dim = zs_model_config_get(zs_engine_model(m->engine))->dim;
    json_t *input = root ? json_object_get(root, "input") : NULL;
    if (rc == 0 && (!input || json_is_null(input)))
        rc = zs_api_fail(&e, 400, "input", "missing_required_parameter", "Missing required parameter: 'input'.");
    json_t *ef = root ? json_object_get(root, "encoding_format") : NULL;
    if (rc == 0 && ef && !json_is_null(ef)) {
        if (!json_is_string(ef) || (strcmp(json_string_value(ef), "float") && strcmp(json_string_value(ef), "base64")))
            rc = zs_api_fail(&e, 400, "encoding_format", "invalid_value", "Invalid 'encoding_format': expected 'float' or 'base64'.");
        else base64 = !strcmp(json_string_value(ef), "base64");
    }
    json_t *dm = root ? json_object_get(root, "dimensions") : NULL;
    if (rc == 0 && dm && !json_is_null(dm)) {
        if (!json_is_integer(dm)) rc = bad_type(&e, "dimensions", "an integer");
        else if (json_integer_value(dm) != dim)
            rc = zs_api_fail(&e, 400, "dimensions", "invalid_value", "Invalid 'dimensions': this model's embeddings have %d "
                             "dimensions (%lld asked; shortening them is not supported).", dim, (long long)json_integer_value(dm));
    }
    json_t *us = root ? json_object_get(root, "user") : NULL;
    if (rc == 0 && us && !json_is_null(us) && !json_is_string(us)) rc = bad_type(&e, "user", "a string");
    json_t *pl = root ? json_object_get(root, "pooling") : NULL;
    if (rc == 0 && pl && !json_is_null(pl)) {
        if (!json_is_string(pl) || (strcmp(json_string_value(pl), "mean") && strcmp(json_string_value(pl), "last")))
            rc = zs_api_fail(&e, 400, "pooling", "invalid_value", "Invalid 'pooling': expected 'mean' or 'last'.");
        else pooling = !strcmp(json_string_value(pl), "last") ? ZS_POOL_LAST : ZS_POOL_MEAN;
    }
    if (rc == 0) rc = get_bool(root, "normalize", &normalize, &e);

    /* the inputs: a string, an array of strings, an array of ids, an array of arrays of ids */
    int n = 0;
    int32_t *ids[MAX_EMBED_INPUTS];
    size_t nids[MAX_EMBED_INPUTS];
    if (rc == 0) {
        json_t *first = json_is_array(input) ? json_array_get(input, 0) : NULL;
        if (json_is_array(input) && json_array_size(input) == 0) {
            rc = zs_api_fail(&e, 400, "input", "invalid_value", "'input' must not be an empty array.");
        } else if (json_is_string(input) || json_is_integer(first)) {
            rc = embed_input(m, input, "input", &ids[0], &nids[0], &e);
            if (rc == 0) n = 1;
        } else if (json_is_array(input)) {
            size_t k = json_array_size(input);
            if (k > MAX_EMBED_INPUTS)
                rc = zs_api_fail(&e, 400, "input", "invalid_value", "Too many inputs: %zu (at most %d per request).", k,
                                 MAX_EMBED_INPUTS);
            for (size_t i = 0; rc == 0 && i < k; i++) {
                char pname[48];
                snprintf(pname, sizeof pname, "input[%zu]", i);
                json_t *v = json_array_get(input, i);
                if (json_is_string(v) != json_is_string(first) || (!json_is_string(v) && !json_is_array(v)))
                    rc = zs_api_fail(&e, 400, pname, "invalid_type", "Invalid type for '%s': 'input' must be a string, an array "
                                     "of strings, an array of token ids or an array of arrays of token ids.", pname);
                else if ((rc = embed_input(m, v, pname, &ids[n], &nids[n], &e)) == 0)
                    n++;
            }
        } else {
            rc = bad_type(&e, "input", "a string, an array of strings, an array of token ids or an array of arrays of token ids");
        }
    }
    emb_job *j = NULL;
    if (rc == 0) {
        j = calloc(1, sizeof *j);
        if (j) j->items = calloc((size_t)n, sizeof *j->items);
        if (!j || !j->items) {
            free(j);
            j = NULL;
            rc = zs_api_fail(&e, 500, NULL, NULL, "out of memory");
        }
    }
    if (rc < 0) {
        for (int i = 0; i < n; i++) free(ids[i]);
        zs_api_adapter_release(a, ad);
        json_decref(root);
        respond_err(r, &e);
        return;
    }
    pthread_mutex_init(&j->mu, NULL);
    j->api = a;
    j->adapter = ad;
    j->req = r;
    j->n = n;
    j->dim = dim;
    j->normalize = normalize;
    j->base64 = base64;
    snprintf(j->model_id, sizeof j->model_id, "%s", ad ? ad->name : m->model_name);
    j->remaining = n + 1; /* + the handler's hold */
    for (int i = 0; i < n; i++) j->prompt_tokens += (int)nids[i];
    pthread_mutex_lock(&a->mu);
    a->live++;
    pthread_mutex_unlock(&a->mu);
    json_decref(root);
    for (int i = 0; i < n; i++) {
        emb_item *it = &j->items[i];
        it->j = j;
        it->n_tok = (int)nids[i];
        pthread_mutex_lock(&j->mu);
        int stop = j->err.status != 0;
        pthread_mutex_unlock(&j->mu);
        int src = stop ? -1 : 0;
        if (!stop) {
            zs_req_params rp;
            memset(&rp, 0, sizeof rp);
            rp.prompt = ids[i];
            rp.n_prompt = (int)nids[i];
            rp.embed = 1;
            rp.pooling = pooling;
            rp.top_logprobs = -1;
            rp.lora = ad ? ad->lora : NULL;
            zs_req_sink sink = {emb_on_token, emb_on_done, it, emb_on_vec};
            src = zs_sched_submit(m->sched, &rp, &sink, NULL);
            if (src < 0) {
                pthread_mutex_lock(&j->mu);
                if (!j->err.status) {
                    if (src == ZS_EBUSY)
                        zs_api_fail(&j->err, 429, NULL, "rate_limit_exceeded", "The server is busy: the request queue is full. Retry shortly.");
                    else if (src == ZS_ECANCELLED)
                        zs_api_fail(&j->err, 503, NULL, "shutting_down", "The server is shutting down.");
                    else if (src == ZS_EUNSUPPORTED)
                        zs_api_fail(&j->err, 400, ad ? "model" : NULL, "unsupported_parameter", "%s", zs_errmsg());
                    else if (src == ZS_ERANGE || src == ZS_EINVAL)
                        zs_api_fail(&j->err, 400, "input", "invalid_value", "%s", zs_errmsg());
                    else
                        zs_api_fail(&j->err, 500, NULL, NULL, "cannot queue the request: %s", zs_errmsg());
                }
                pthread_mutex_unlock(&j->mu);
            }
        }
        free(ids[i]);
        if (src < 0) {
            pthread_mutex_lock(&j->mu);
            j->remaining--; /* never submitted: no on_done will come */
            pthread_mutex_unlock(&j->mu);
        }
    }
    emb_release(j);
}
