/* api-tools.h — structured outputs and tool calls for the OpenAI routes (api-tools.c): the
 * compiled-grammar cache, response_format and tools / tool_choice parsed into scheduler
 * constraints (sched.h's zs_req_constraint), and the pieces the answers need (tool calls as
 * OpenAI's JSON, and an incremental scanner of a call being generated, for streaming). Not a
 * public interface. Dependencies: api-request.c and api-openai.c use this; it uses
 * jsonschema.h, toolcall.h and api-error.h.
 *
 * Grammar cache: compiled grammars with their token masks (zs_jschema_mask_new over a model's
 * tokenizer), keyed by (tokenizer, the schema's compact JSON text, keys in the request's order:
 * the order of properties is the order the value writes them), at most ZS_API_GRAMMAR_CACHE entries not in use, evicted least
 * recently used first. An entry is reference counted: a request holds its entry from parsing
 * until the scheduler's last on_done, so an evicted entry in use is freed at its last release.
 * Thread-safe (one mutex; a compile runs outside it while other requests for the same key wait
 * for it).
 *
 * Ownership: zs_api_tools and zs_api_cons own every string and array they point to (copies of
 * the request's JSON), so they outlive the request body; free them with their _free functions
 * (NULL is fine). Pure functions otherwise; a zs_api_callscan belongs to one thread. */
#ifndef ZS_API_TOOLS_H
#define ZS_API_TOOLS_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "api-error.h"
#include "api-models.h"
#include "jsonschema.h"
#include "sched.h"
#include "toolcall.h"

#define ZS_API_GRAMMAR_CACHE 16 /* cached grammars kept while unused */
#define ZS_API_MAX_TOOLS 128

/* ------------------------------------------------------------------ grammar cache */

typedef struct zs_api_grammar zs_api_grammar;

/* The compiled grammar and masks of schema_json (NULL: any JSON object, response_format
 * json_object) over tok, from the cache or compiled now; a reference is taken for the caller.
 * ZS_EINVAL with jsonschema.c's message (naming the keyword and its pointer) for a schema the
 * grammar cannot take; ZS_ENOMEM. */
int  zs_api_grammar_get(const zs_tokenizer *tok, const char *schema_json, zs_api_grammar **out);
void zs_api_grammar_release(zs_api_grammar *g); /* NULL is fine */
const zs_jschema *zs_api_grammar_jschema(const zs_api_grammar *g);
const zs_jschema_masks *zs_api_grammar_masks(const zs_api_grammar *g);
/* Drops every unused entry of tok (a model going away; zs_api_free), or of every tokenizer
 * (tok NULL). Entries in use are dropped at their last release. */
void zs_api_grammar_purge(const zs_tokenizer *tok);
/* Cache counters (tests, logs): lookups answered from the cache, compiles, entries held. */
void zs_api_grammar_stats(long *hits, long *compiles, int *entries);

/* ------------------------------------------------------------------ constraints */

/* A request's constraint with everything it points to: the cache entry (a reference) and the
 * forced token ids. c->rc is what zs_req_params.constraint points at (valid while c lives). */
typedef struct zs_api_cons {
    zs_api_grammar *g;
    int32_t *prefix, *suffix;
    int n_prefix, n_suffix;
    char *trigger; /* NULL: constrained from the first token */
    zs_req_constraint rc;
} zs_api_cons;
void zs_api_cons_free(zs_api_cons *c);

/* response_format of a chat or completions request (root: the body): NULL / {"type":"text"}
 * leave *out NULL; {"type":"json_object"} and {"type":"json_schema","json_schema":{name,
 * schema, strict, description}} give a constraint over m's tokenizer. 0, or -1 with e filled
 * (400 naming response_format.* ; a schema the grammar cannot take: param
 * "response_format.json_schema.schema", the message naming the keyword). */
int zs_api_response_format(json_t *root, const zs_api_model *m, zs_api_cons **out, api_err *e);

/* ------------------------------------------------------------------ tools */

enum { ZS_API_TC_NONE = 0, ZS_API_TC_AUTO = 1, ZS_API_TC_REQUIRED = 2, ZS_API_TC_NAMED = 3 };

typedef struct zs_api_tools {
    int n;
    zs_tool_def *defs;  /* n tools; strings owned */
    int choice;         /* ZS_API_TC_* (default: auto with tools, none without) */
    char *only;         /* ZS_API_TC_NAMED: the function's name */
    int parallel;       /* parallel_tool_calls (default 1; one call per answer under a constraint) */
    int fmt;            /* ZS_TOOLFMT_* of the model's chat family */
    char *trigger;      /* ZS_API_TC_AUTO: the text that opens a call (from the constraint) */
} zs_api_tools;

/* tools, tool_choice and parallel_tool_calls of a chat body. *out is NULL when the request has
 * no tools and tool_choice is absent/none/auto. 0, or -1 with e filled (400 naming
 * tools[i].function.name, tool_choice, ...). */
int  zs_api_tools_parse(json_t *root, const zs_api_model *m, zs_api_tools **out, api_err *e);
void zs_api_tools_free(zs_api_tools *t);
/* The constraint of t's tool_choice (auto: with the trigger; required / named: from the first
 * token); *out NULL for none. 0, or -1 with e filled (400 naming tools[i].function.parameters
 * for a schema the grammar cannot take). Sets t->trigger for auto. */
int  zs_api_tools_constraint(zs_api_tools *t, const zs_api_model *m, zs_api_cons **out, api_err *e);

/* OpenAI's "tool_calls" array of p: [{id, type:"function", function:{name, arguments}}]. */
json_t *zs_api_tool_calls_json(const zs_toolcall_parsed *p);

/* ------------------------------------------------------------------ streaming */

/* Where a call's parts are in text generated so far (scanned from the first '{' at or after
 * `from`): the function's name once its string is complete, and the byte range of the
 * arguments value ("arguments", or "parameters" for llama3) as far as it has come. */
typedef struct {
    int found;           /* a '{' was seen */
    int name_done;
    char name[72];
    int args_begun, args_done;
    size_t args_start, args_end; /* args_end valid when args_done; else the value runs to the end */
    int closed;          /* the call object is complete */
} zs_api_callscan;
void zs_api_call_scan(const char *text, size_t len, size_t from, zs_api_callscan *out);

/* The bytes of text[0..len) that are content for sure while trigger may still open a call: up
 * to the trigger where it occurs (*at = its offset, else len), else all but the longest tail
 * that is a prefix of trigger. */
size_t zs_api_content_safe(const char *text, size_t len, const char *trigger, size_t *at);

#endif
