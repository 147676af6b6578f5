/* api-tools.c — structured outputs and tool calls for the OpenAI routes (api-tools.h): the
 * compiled-grammar cache, response_format / tools / tool_choice turned into scheduler
 * constraints, tool calls as OpenAI's JSON, and the scanner the SSE stream uses to send a call's
 * name and arguments as they are generated.
 *
 * Decisions: response_format json_schema needs "name" ([A-Za-z0-9_-]{1,64}); a missing
 * "schema" means any JSON object (as json_object); "strict" is accepted either way (the output
 * always follows the schema). tool_choice "none" still renders the tools (as OpenAI does) and
 * nothing is constrained or parsed; "auto" lets the model write text or open a call (the
 * format's trigger), after which the call is constrained (except where the trigger is the start
 * of the call's JSON itself, llama3's "{": there the call is parsed but not constrained);
 * "required" and a named function constrain from the first token. One call per answer under a constraint: parallel_tool_calls
 * true only allows it. */
#define _GNU_SOURCE
#include "api-tools.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

/* ------------------------------------------------------------------ grammar cache */

struct zs_api_grammar {
    const zs_tokenizer *tok;
    char *key;          /* canonical schema text, "" for any object */
    zs_jschema *g;
    zs_jschema_masks *m;
    int refs;           /* requests holding it */
    int ready;          /* compiled (else another thread is compiling it) */
    int listed;         /* in the cache list */
    unsigned long used; /* LRU stamp */
    struct zs_api_grammar *next;
};

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    zs_api_grammar *list;
    unsigned long clock;
    long hits, compiles;
} gc = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, 0, 0, 0};

static void grammar_destroy(zs_api_grammar *g) {
    zs_jschema_mask_free(g->m);
    zs_jschema_free(g->g);
    free(g->key);
    free(g);
}

static void unlist_locked(zs_api_grammar *g) {
    for (zs_api_grammar **pp = &gc.list; *pp; pp = &(*pp)->next)
        if (*pp == g) {
            *pp = g->next;
            g->listed = 0;
            return;
        }
}

/* Evicts unused entries, least recently used first, down to the cache size (gc.mu held). */
static void evict_locked(void) {
    for (;;) {
        int idle = 0;
        zs_api_grammar *lru = NULL;
        for (zs_api_grammar *g = gc.list; g; g = g->next)
            if (g->refs == 0 && g->ready) {
                idle++;
                if (!lru || g->used < lru->used) lru = g;
            }
        if (idle <= ZS_API_GRAMMAR_CACHE || !lru) return;
        unlist_locked(lru);
        grammar_destroy(lru);
    }
}

static int compile_entry(zs_api_grammar *g) {
    double t0 = zs_now();
    int rc = g->key[0] ? zs_jschema_compile(g->key, &g->g) : zs_jschema_any_object(&g->g);
    double t1 = zs_now();
    if (rc == 0) rc = zs_jschema_mask_new(g->g, g->tok, &g->m);
    if (rc == 0)
        zs_log_info("api: grammar of a %zu-byte schema compiled in %.1f ms, its token masks built in %.1f ms",
                    strlen(g->key), (t1 - t0) * 1e3, (zs_now() - t1) * 1e3);
    return rc;
}

int zs_api_grammar_get(const zs_tokenizer *tok, const char *schema_json, zs_api_grammar **out) {
    *out = NULL;
    if (!tok) return zs_err(ZS_EINVAL, "json schema: no tokenizer");
    char *key = NULL;
    if (schema_json) {
        json_error_t je;
        json_t *s = json_loads(schema_json, JSON_REJECT_DUPLICATES, &je);
        if (!s) return zs_err(ZS_EINVAL, "json schema: not valid JSON (line %d: %s)", je.line, je.text);
        /* keys in the request's order: the grammar writes an object's keys in its schema's order */
        key = json_dumps(s, JSON_COMPACT);
        json_decref(s);
    } else {
        key = strdup("");
    }
    if (!key) return zs_err(ZS_ENOMEM, "out of memory");
    pthread_mutex_lock(&gc.mu);
    zs_api_grammar *g;
    for (;;) {
        for (g = gc.list; g; g = g->next)
            if (g->tok == tok && !strcmp(g->key, key)) break;
        if (!g || g->ready) break;
        pthread_cond_wait(&gc.cv, &gc.mu); /* another request compiles it */
    }
    if (g) {
        g->refs++;
        g->used = ++gc.clock;
        gc.hits++;
        pthread_mutex_unlock(&gc.mu);
        free(key);
        *out = g;
        return 0;
    }
    g = calloc(1, sizeof *g);
    if (!g) {
        pthread_mutex_unlock(&gc.mu);
        free(key);
        return zs_err(ZS_ENOMEM, "out of memory");
    }
    g->tok = tok;
    g->key = key;
    g->refs = 1;
    g->listed = 1;
    g->next = gc.list;
    gc.list = g;
    gc.compiles++;
    pthread_mutex_unlock(&gc.mu);

    int rc = compile_entry(g);

    pthread_mutex_lock(&gc.mu);
    if (rc == 0) {
        g->ready = 1;
        g->used = ++gc.clock;
        evict_locked();
        *out = g;
    } else {
        /* waiters re-walk the list, no longer find it and compile it themselves */
        unlist_locked(g);
    }
    pthread_cond_broadcast(&gc.cv);
    pthread_mutex_unlock(&gc.mu);
    if (rc < 0) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", zs_errmsg());
        grammar_destroy(g);
        return zs_err(rc, "%s", msg);
    }
    return 0;
}
void zs_api_grammar_release(zs_api_grammar *g) {
    if (!g) return;
    pthread_mutex_lock(&gc.mu);
    int gone = --g->refs == 0 && !g->listed;
    if (!gone && g->refs == 0) evict_locked();
    pthread_mutex_unlock(&gc.mu);
    if (gone) grammar_destroy(g);
}

const zs_jschema *zs_api_grammar_jschema(const zs_api_grammar *g) { return g->g; }
const zs_jschema_masks *zs_api_grammar_masks(const zs_api_grammar *g) { return g->m; }

void zs_api_grammar_purge(const zs_tokenizer *tok) {
    pthread_mutex_lock(&gc.mu);
    for (zs_api_grammar **pp = &gc.list; *pp;) {
        zs_api_grammar *g = *pp;
        if ((!tok || g->tok == tok) && g->ready && g->refs == 0) {
            *pp = g->next;
            grammar_destroy(g);
        } else if (!tok || g->tok == tok) {
            /* in use (or compiling): unlisted, freed at its last release */
            if (g->ready) {
                *pp = g->next;
                g->listed = 0;
            } else {
                pp = &g->next;
            }
        } else {
            pp = &g->next;
        }
    }
    pthread_mutex_unlock(&gc.mu);
}

void zs_api_grammar_stats(long *hits, long *compiles, int *entries) {
    pthread_mutex_lock(&gc.mu);
    int n = 0;
    for (zs_api_grammar *g = gc.list; g; g = g->next) n++;
    if (hits) *hits = gc.hits;
    if (compiles) *compiles = gc.compiles;
    if (entries) *entries = n;
    pthread_mutex_unlock(&gc.mu);
}

/* ------------------------------------------------------------------ constraints */

void zs_api_cons_free(zs_api_cons *c) {
    if (!c) return;
    zs_api_grammar_release(c->g);
    free(c->prefix);
    free(c->suffix);
    free(c->trigger);
    free(c);
}

/* Forced text as token ids: encoded without BOS or other post-processing; special tokens written
 * literally (<tool_call>, [TOOL_CALLS]) become their ids. */
static int forced_ids(const zs_api_model *m, const char *text, int32_t **ids, int *n) {
    *ids = NULL;
    *n = 0;
    if (!text || !*text) return 0;
    size_t nn = 0;
    int rc = zs_tokenizer_encode(m->tok, text, strlen(text), 0, ids, &nn);
    if (rc < 0) return rc;
    *n = (int)nn;
    return 0;
}

/* A constraint over the cached grammar of schema (NULL: any object). On a compile error: the
 * ZS_EINVAL with zs_errmsg() set, *out NULL. */
static int cons_make(const zs_api_model *m, const char *schema, const char *prefix, const char *suffix,
                     const char *trigger, zs_api_cons **out) {
    *out = NULL;
    zs_api_cons *c = calloc(1, sizeof *c);
    if (!c) return zs_err(ZS_ENOMEM, "out of memory");
    int rc = zs_api_grammar_get(m->tok, schema, &c->g);
    if (rc == 0) rc = forced_ids(m, prefix, &c->prefix, &c->n_prefix);
    if (rc == 0) rc = forced_ids(m, suffix, &c->suffix, &c->n_suffix);
    if (rc == 0 && trigger && !(c->trigger = strdup(trigger))) rc = zs_err(ZS_ENOMEM, "out of memory");
    if (rc < 0) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", zs_errmsg());
        zs_api_cons_free(c);
        return zs_err(rc, "%s", msg);
    }
    c->rc.grammar = zs_api_grammar_jschema(c->g);
    c->rc.masks = zs_api_grammar_masks(c->g);
    c->rc.prefix = c->prefix;
    c->rc.n_prefix = c->n_prefix;
    c->rc.suffix = c->suffix;
    c->rc.n_suffix = c->n_suffix;
    c->rc.trigger = c->trigger;
    *out = c;
    return 0;
}

static int valid_name(const char *s) {
    size_t n = strlen(s);
    if (n < 1 || n > 64) return 0;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_' || ch == '-'))
            return 0;
    }
    return 1;
}

static int missing(api_err *e, const char *name) {
    return zs_api_fail(e, 400, name, "missing_required_parameter", "Missing required parameter: '%s'.", name);
}

/* Only the keys of known (NULL-terminated) in object o; 400 naming prefix.key otherwise. */
static int known_keys(json_t *o, const char *prefix, const char *const *known, api_err *e) {
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        int ok = 0;
        for (int i = 0; known[i] && !ok; i++) ok = !strcmp(k, known[i]);
        if (!ok) {
            char p[96];
            snprintf(p, sizeof p, "%s.%s", prefix, k);
            return zs_api_fail(e, 400, p, "unknown_parameter", "Unrecognized argument supplied: '%s'.", p);
        }
    }
    return 0;
}

int zs_api_response_format(json_t *root, const zs_api_model *m, zs_api_cons **out, api_err *e) {
    *out = NULL;
    json_t *rf = json_object_get(root, "response_format");
    if (!rf || json_is_null(rf)) return 0;
    if (!json_is_object(rf)) return zs_api_bad_type(e, "response_format", "an object", rf);
    json_t *t = json_object_get(rf, "type");
    if (!t) return missing(e, "response_format.type");
    if (!json_is_string(t)) return zs_api_bad_type(e, "response_format.type", "a string", t);
    const char *ts = json_string_value(t);
    static const char *const k_type[] = {"type", NULL};
    static const char *const k_schema[] = {"type", "json_schema", NULL};
    if (!strcmp(ts, "text")) return known_keys(rf, "response_format", k_type, e);
    if (!strcmp(ts, "json_object")) {
        if (known_keys(rf, "response_format", k_type, e) < 0) return -1;
        if (cons_make(m, NULL, NULL, NULL, NULL, out) < 0)
            return zs_api_fail(e, 500, NULL, NULL, "cannot build the JSON grammar: %s", zs_errmsg());
        return 0;
    }
    if (strcmp(ts, "json_schema"))
        return zs_api_fail(e, 400, "response_format.type", "invalid_value",
                           "Invalid value for 'response_format.type': '%s' is not supported (expected 'text', "
                           "'json_object' or 'json_schema').", ts);
    if (known_keys(rf, "response_format", k_schema, e) < 0) return -1;
    json_t *js = json_object_get(rf, "json_schema");
    if (!js || json_is_null(js)) return missing(e, "response_format.json_schema");
    if (!json_is_object(js)) return zs_api_bad_type(e, "response_format.json_schema", "an object", js);
    static const char *const k_js[] = {"name", "schema", "strict", "description", NULL};
    if (known_keys(js, "response_format.json_schema", k_js, e) < 0) return -1;
    json_t *name = json_object_get(js, "name");
    if (!name || json_is_null(name)) return missing(e, "response_format.json_schema.name");
    if (!json_is_string(name)) return zs_api_bad_type(e, "response_format.json_schema.name", "a string", name);
    if (!valid_name(json_string_value(name)))
        return zs_api_fail(e, 400, "response_format.json_schema.name", "invalid_value",
                           "Invalid 'response_format.json_schema.name': '%s' must be 1 to 64 characters of a-z, A-Z, "
                           "0-9, '_' and '-'.", json_string_value(name));
    json_t *st = json_object_get(js, "strict");
    if (st && !json_is_null(st) && !json_is_boolean(st))
        return zs_api_bad_type(e, "response_format.json_schema.strict", "a boolean", st);
    /* accepted and not used: OpenAI gives it to the model as a hint; here the grammar alone
     * decides the value (docs/structured-outputs.md) */
    json_t *d = json_object_get(js, "description");
    if (d && !json_is_null(d) && !json_is_string(d))
        return zs_api_bad_type(e, "response_format.json_schema.description", "a string", d);
    json_t *schema = json_object_get(js, "schema");
    char *text = NULL;
    if (schema && !json_is_null(schema)) {
        if (!json_is_object(schema)) return zs_api_bad_type(e, "response_format.json_schema.schema", "an object", schema);
        text = json_dumps(schema, JSON_COMPACT); /* in order: properties are generated in it */
        if (!text) return zs_api_fail(e, 500, NULL, NULL, "out of memory");
    }
    int rc = cons_make(m, text, NULL, NULL, NULL, out);
    free(text);
    if (rc == ZS_EINVAL)
        return zs_api_fail(e, 400, "response_format.json_schema.schema", "invalid_value",
                           "Invalid schema for response_format '%s': %s", json_string_value(name), zs_errmsg());
    if (rc < 0) return zs_api_fail(e, 500, NULL, NULL, "cannot build the JSON grammar: %s", zs_errmsg());
    return 0;
}

/* ------------------------------------------------------------------ tools */

void zs_api_tools_free(zs_api_tools *t) {
    if (!t) return;
    for (int i = 0; i < t->n; i++) {
        free((char *)t->defs[i].name);
        free((char *)t->defs[i].description);
        free((char *)t->defs[i].parameters);
    }
    free(t->defs);
    free(t->only);
    free(t->trigger);
    free(t);
}

static int parse_tool(json_t *v, size_t i, zs_tool_def *d, api_err *e) {
    char p[96];
    snprintf(p, sizeof p, "tools[%zu]", i);
    if (!json_is_object(v)) return zs_api_bad_type(e, p, "an object", v);
    static const char *const k_tool[] = {"type", "function", NULL};
    static const char *const k_fn[] = {"name", "description", "parameters", "strict", NULL};
    if (known_keys(v, p, k_tool, e) < 0) return -1;
    json_t *type = json_object_get(v, "type");
    snprintf(p, sizeof p, "tools[%zu].type", i);
    if (!type) return missing(e, p);
    if (!json_is_string(type) || strcmp(json_string_value(type), "function"))
        return zs_api_fail(e, 400, p, "invalid_value", "Invalid value for '%s': only 'function' is supported.", p);
    json_t *fn = json_object_get(v, "function");
    snprintf(p, sizeof p, "tools[%zu].function", i);
    if (!fn) return missing(e, p);
    if (!json_is_object(fn)) return zs_api_bad_type(e, p, "an object", fn);
    if (known_keys(fn, p, k_fn, e) < 0) return -1;
    json_t *name = json_object_get(fn, "name");
    snprintf(p, sizeof p, "tools[%zu].function.name", i);
    if (!name) return missing(e, p);
    if (!json_is_string(name)) return zs_api_bad_type(e, p, "a string", name);
    if (!valid_name(json_string_value(name)) || strlen(json_string_value(name)) != json_string_length(name))
        return zs_api_fail(e, 400, p, "invalid_value",
                           "Invalid '%s': '%s' does not match '^[a-zA-Z0-9_-]{1,64}$'.", p, json_string_value(name));
    json_t *desc = json_object_get(fn, "description");
    snprintf(p, sizeof p, "tools[%zu].function.description", i);
    if (desc && !json_is_null(desc) && !json_is_string(desc)) return zs_api_bad_type(e, p, "a string", desc);
    json_t *par = json_object_get(fn, "parameters");
    snprintf(p, sizeof p, "tools[%zu].function.parameters", i);
    if (par && !json_is_null(par) && !json_is_object(par)) return zs_api_bad_type(e, p, "an object", par);
    /* accepted and not used: a constrained call always follows the parameters' schema, strict or not */
    json_t *st = json_object_get(fn, "strict");
    snprintf(p, sizeof p, "tools[%zu].function.strict", i);
    if (st && !json_is_null(st) && !json_is_boolean(st)) return zs_api_bad_type(e, p, "a boolean", st);
    d->name = strdup(json_string_value(name));
    d->description = json_is_string(desc) ? strdup(json_string_value(desc)) : NULL;
    d->parameters = json_is_object(par) ? json_dumps(par, JSON_COMPACT) : NULL;
    if (!d->name || (json_is_string(desc) && !d->description) || (json_is_object(par) && !d->parameters))
        return zs_api_fail(e, 500, NULL, NULL, "out of memory");
    return 0;
}

static int parse_tool_choice(json_t *tc, zs_api_tools *t, api_err *e) {
    if (!tc || json_is_null(tc)) {
        t->choice = t->n ? ZS_API_TC_AUTO : ZS_API_TC_NONE;
        return 0;
    }
    if (json_is_string(tc)) {
        const char *s = json_string_value(tc);
        if (!strcmp(s, "none")) t->choice = ZS_API_TC_NONE;
        else if (!strcmp(s, "auto")) t->choice = t->n ? ZS_API_TC_AUTO : ZS_API_TC_NONE;
        else if (!strcmp(s, "required")) t->choice = ZS_API_TC_REQUIRED;
        else
            return zs_api_fail(e, 400, "tool_choice", "invalid_value",
                               "Invalid value for 'tool_choice': '%s' (expected 'none', 'auto', 'required' or "
                               "{\"type\": \"function\", \"function\": {\"name\": ...}}).", s);
    } else if (json_is_object(tc)) {
        static const char *const k_tc[] = {"type", "function", NULL};
        static const char *const k_fn[] = {"name", NULL};
        if (known_keys(tc, "tool_choice", k_tc, e) < 0) return -1;
        json_t *type = json_object_get(tc, "type");
        if (!type) return missing(e, "tool_choice.type");
        if (!json_is_string(type) || strcmp(json_string_value(type), "function"))
            return zs_api_fail(e, 400, "tool_choice.type", "invalid_value",
                               "Invalid value for 'tool_choice.type': only 'function' is supported.");
        json_t *fn = json_object_get(tc, "function");
        if (!fn) return missing(e, "tool_choice.function");
        if (!json_is_object(fn)) return zs_api_bad_type(e, "tool_choice.function", "an object", fn);
        if (known_keys(fn, "tool_choice.function", k_fn, e) < 0) return -1;
        json_t *name = json_object_get(fn, "name");
        if (!name) return missing(e, "tool_choice.function.name");
        if (!json_is_string(name)) return zs_api_bad_type(e, "tool_choice.function.name", "a string", name);
        int found = 0;
        for (int i = 0; i < t->n && !found; i++) found = !strcmp(t->defs[i].name, json_string_value(name));
        if (!found)
            return zs_api_fail(e, 400, "tool_choice", "invalid_value",
                               "Invalid value for 'tool_choice': no function named '%s' is among the tools.",
                               json_string_value(name));
        t->choice = ZS_API_TC_NAMED;
        if (!(t->only = strdup(json_string_value(name)))) return zs_api_fail(e, 500, NULL, NULL, "out of memory");
    } else {
        return zs_api_bad_type(e, "tool_choice", "a string or an object", tc);
    }
    if ((t->choice == ZS_API_TC_REQUIRED || t->choice == ZS_API_TC_NAMED) && !t->n)
        return zs_api_fail(e, 400, "tool_choice", "invalid_value",
                           "Invalid value for 'tool_choice': it requires 'tools' with at least one function.");
    return 0;
}

int zs_api_tools_parse(json_t *root, const zs_api_model *m, zs_api_tools **out, api_err *e) {
    *out = NULL;
    json_t *tools = json_object_get(root, "tools");
    json_t *tc = json_object_get(root, "tool_choice");
    json_t *ptc = json_object_get(root, "parallel_tool_calls");
    if (ptc && !json_is_null(ptc) && !json_is_boolean(ptc)) return zs_api_bad_type(e, "parallel_tool_calls", "a boolean", ptc);
    if (tools && !json_is_null(tools) && !json_is_array(tools)) return zs_api_bad_type(e, "tools", "an array", tools);
    size_t n = json_is_array(tools) ? json_array_size(tools) : 0;
    if (n > ZS_API_MAX_TOOLS)
        return zs_api_fail(e, 400, "tools", "invalid_value", "Invalid 'tools': at most %d tools are supported, got %zu.",
                           ZS_API_MAX_TOOLS, n);
    zs_api_tools *t = calloc(1, sizeof *t);
    if (!t || (n && !(t->defs = calloc(n, sizeof *t->defs)))) {
        free(t);
        return zs_api_fail(e, 500, NULL, NULL, "out of memory");
    }
    t->parallel = ptc && json_is_boolean(ptc) ? json_is_true(ptc) : 1;
    t->fmt = zs_toolcall_format(m->tmpl);
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        rc = parse_tool(json_array_get(tools, i), i, &t->defs[i], e);
        t->n = (int)i + 1;
        for (size_t k = 0; rc == 0 && k < i; k++)
            if (!strcmp(t->defs[k].name, t->defs[i].name)) {
                char p[96];
                snprintf(p, sizeof p, "tools[%zu].function.name", i);
                rc = zs_api_fail(e, 400, p, "invalid_value", "Invalid '%s': the name '%s' is used by tools[%zu] already.",
                                 p, t->defs[i].name, k);
            }
    }
    if (rc == 0) rc = parse_tool_choice(tc, t, e);
    if (rc < 0 || (t->n == 0 && t->choice == ZS_API_TC_NONE)) {
        zs_api_tools_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

int zs_api_tools_constraint(zs_api_tools *t, const zs_api_model *m, zs_api_cons **out, api_err *e) {
    *out = NULL;
    if (!t || t->choice == ZS_API_TC_NONE) return 0;
    zs_toolcall_constraint c = {0};
    if (zs_toolcall_constraint_make(t->fmt, t->defs, t->n, t->choice == ZS_API_TC_NAMED ? t->only : NULL, &c) < 0) {
        const char *em = zs_errmsg();
        char p[96] = "tools";
        const char *colon = strchr(em, ':');
        if (!strncmp(em, "tools", 5) && colon && (size_t)(colon - em) < sizeof p) {
            memcpy(p, em, (size_t)(colon - em));
            p[colon - em] = '\0';
        }
        return zs_api_fail(e, 400, p, "invalid_value", "%s", em);
    }
    const char *prefix = c.prefix ? c.prefix : "";
    const char *trigger = NULL;
    if (t->choice == ZS_API_TC_AUTO) {
        trigger = c.trigger && *c.trigger ? c.trigger : NULL;
        if (trigger && !(t->trigger = strdup(trigger))) {
            zs_toolcall_constraint_free(&c);
            return zs_api_fail(e, 500, NULL, NULL, "out of memory");
        }
        if (trigger && strncmp(prefix, trigger, strlen(trigger))) {
            /* the trigger is the start of the value itself (llama3's "{"): the scheduler would start
             * the grammar after it, so such a call is not constrained, only parsed */
            zs_toolcall_constraint_free(&c);
            return 0;
        }
        /* with a trigger the prefix is forced after the trigger's text: drop what the trigger wrote */
        if (trigger) prefix += strlen(trigger);
    }
    int rc = cons_make(m, c.schema_json, prefix, c.suffix, trigger, out);
    zs_toolcall_constraint_free(&c);
    if (rc == ZS_EINVAL) return zs_api_fail(e, 400, "tools", "invalid_value", "Invalid 'tools': %s", zs_errmsg());
    if (rc < 0) return zs_api_fail(e, 500, NULL, NULL, "cannot build the tool-call grammar: %s", zs_errmsg());
    return 0;
}

json_t *zs_api_tool_calls_json(const zs_toolcall_parsed *p) {
    json_t *arr = json_array();
    for (int i = 0; arr && i < p->n_calls; i++)
        json_array_append_new(arr, json_pack("{s:s,s:s,s:{s:s,s:s}}", "id", p->calls[i].id ? p->calls[i].id : "",
                                             "type", "function", "function", "name", p->calls[i].name, "arguments",
                                             p->calls[i].arguments ? p->calls[i].arguments : "{}"));
    return arr;
}

/* ------------------------------------------------------------------ streaming */

static int is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

enum { S_KEY0, S_KEY, S_COLON, S_VAL0, S_VAL, S_AFTER };

void zs_api_call_scan(const char *t, size_t len, size_t from, zs_api_callscan *s) {
    memset(s, 0, sizeof *s);
    if (from >= len) return;
    const char *b = memchr(t + from, '{', len - from);
    if (!b) return;
    s->found = 1;
    int st = S_KEY0, esc = 0, instr = 0, which = 0, vdepth = 0;
    size_t key_s = 0, key_e = 0, val_s = 0, last = 0;
    for (size_t i = (size_t)(b - t) + 1; i < len; i++) {
        char ch = t[i];
        int val_end = 0; /* the value ended at `last` */
        switch (st) {
        case S_KEY0:
            if (ch == '"') {
                st = S_KEY;
                key_s = i + 1;
                esc = 0;
            } else if (ch == '}') {
                s->closed = 1;
                return;
            }
            break;
        case S_KEY:
            if (esc) esc = 0;
            else if (ch == '\\') esc = 1;
            else if (ch == '"') {
                key_e = i;
                st = S_COLON;
            }
            break;
        case S_COLON:
            if (ch == ':') {
                size_t kl = key_e - key_s;
                which = (kl == 4 && !memcmp(t + key_s, "name", 4)) ? 1
                        : ((kl == 9 && !memcmp(t + key_s, "arguments", 9)) ||
                           (kl == 10 && !memcmp(t + key_s, "parameters", 10))) ? 2 : 0;
                st = S_VAL0;
            }
            break;
        case S_VAL0:
            if (is_ws(ch)) break;
            val_s = i;
            last = i; /* nothing of this value yet (a ',' or '}' here ends it empty, not at an earlier value's end) */
            st = S_VAL;
            vdepth = 0;
            instr = 0;
            esc = 0;
            if (which == 2 && s->args_begun) {
                which = 0; /* a second "arguments": the first one's range stands */
            } else if (which == 2) {
                s->args_begun = 1;
                s->args_start = i;
            }
            /* fall through: this byte is the value's first */
            /* FALLTHRU */
        case S_VAL:
            if (instr) {
                if (esc) esc = 0;
                else if (ch == '\\') esc = 1;
                else if (ch == '"') {
                    instr = 0;
                    if (vdepth == 0) {
                        last = i + 1;
                        val_end = 1;
                    }
                }
                last = i + 1;
            } else if (ch == '"') {
                instr = 1;
                last = i + 1;
            } else if (ch == '{' || ch == '[') {
                vdepth++;
                last = i + 1;
            } else if (ch == '}' || ch == ']') {
                if (vdepth == 0) { /* the call object closes right after a scalar */
                    val_end = 2;
                } else {
                    vdepth--;
                    last = i + 1;
                    if (vdepth == 0) val_end = 1;
                }
            } else if (ch == ',' && vdepth == 0) {
                val_end = 3;
            } else if (!is_ws(ch)) {
                last = i + 1;
            }
            if (val_end) {
                if (which == 1 && t[val_s] == '"' && last - val_s >= 2 && last - val_s - 2 < sizeof s->name &&
                    !memchr(t + val_s + 1, '\\', last - val_s - 2)) {
                    memcpy(s->name, t + val_s + 1, last - val_s - 2);
                    s->name[last - val_s - 2] = 0;
                    s->name_done = 1;
                }
                if (which == 2) {
                    s->args_done = 1;
                    s->args_end = last;
                }
                if (val_end == 2) {
                    s->closed = 1;
                    return;
                }
                st = val_end == 3 ? S_KEY0 : S_AFTER;
            }
            break;
        case S_AFTER:
            if (ch == ',') st = S_KEY0;
            else if (ch == '}') {
                s->closed = 1;
                return;
            }
            break;
        }
    }
}

size_t zs_api_content_safe(const char *text, size_t len, const char *trigger, size_t *at) {
    size_t tl = trigger ? strlen(trigger) : 0;
    if (at) *at = len;
    if (!tl) return len;
    const char *p = memmem(text, len, trigger, tl);
    if (p) {
        if (at) *at = (size_t)(p - text);
        return (size_t)(p - text);
    }
    for (size_t k = tl - 1 < len ? tl - 1 : len; k > 0; k--)
        if (!memcmp(text + len - k, trigger, k)) return len - k;
    return len;
}
