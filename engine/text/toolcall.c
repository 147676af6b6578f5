/* toolcall.c — tool calls for chat models: rendering tool definitions, assistant tool calls and
 * tool results the way the published templates do (Qwen2.5's hermes format, Llama 3.1's, the
 * Mistral v3 one) or in the documented generic format, the JSON-Schema constraint that makes a
 * model write one call, and parsing calls out of generated text. See toolcall.h. */
#define _GNU_SOURCE /* memmem */
#include "toolcall.h"

#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "chat.h"
#include "common.h"
#include "jsonschema.h"
#include "strbuf.h"

static void sb_add(sbuf *b, const char *s) { sb_addn(b, s, strlen(s)); }

/* ================================================================ JSON text */

/* Python's repr() of a finite double: the shortest digits that read back to the same value,
 * fixed notation for 1e-4 <= |x| < 1e16 (with ".0" when integral), else d.ddde+XX. */
static void add_py_float(sbuf *b, double v) {
    char buf[64];
    int p = 1;
    for (; p <= 17; p++) {
        snprintf(buf, sizeof buf, "%.*e", p - 1, v);
        if (strtod(buf, NULL) == v) break;
    }
    if (p > 17) p = 17;
    snprintf(buf, sizeof buf, "%.*e", p - 1, v);
    /* buf: [-]d[.ddd]e[+-]XX */
    char digits[32];
    int nd = 0, neg = buf[0] == '-';
    const char *q = buf + neg;
    for (; *q && *q != 'e'; q++)
        if (*q >= '0' && *q <= '9') digits[nd++] = *q;
    int e = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = '\0';
    if (neg) sb_add(b, "-");
    if (e >= -4 && e < 16) {
        if (e >= 0) {
            for (int i = 0; i <= e; i++) sb_addn(b, i < nd ? &digits[i] : "0", 1);
            sb_add(b, ".");
            if (nd > e + 1) sb_addn(b, digits + e + 1, (size_t)(nd - e - 1));
            else sb_add(b, "0");
        } else {
            sb_add(b, "0.");
            for (int i = 0; i < -e - 1; i++) sb_add(b, "0");
            sb_addn(b, digits, (size_t)nd);
        }
    } else {
        sb_addn(b, digits, 1);
        if (nd > 1) {
            sb_add(b, ".");
            sb_addn(b, digits + 1, (size_t)(nd - 1));
        }
        snprintf(buf, sizeof buf, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
        sb_add(b, buf);
    }
}

/* A JSON string as Python's json.dumps(ensure_ascii=False) writes it. */
static void add_json_str(sbuf *b, const char *s, size_t n) {
    sb_add(b, "\"");
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char u[8];
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (c < 0x20) {
                snprintf(u, sizeof u, "\\u%04x", c);
                esc = u;
            }
        }
        if (esc) {
            sb_addn(b, s + i - run, run);
            run = 0;
            sb_add(b, esc);
        } else {
            run++;
        }
    }
    sb_addn(b, s + n - run, run);
    sb_add(b, "\"");
}

enum { JS_COMPACT = -2, JS_PY = -1 }; /* style; >= 0: Python's indent=N */

static void newline_indent(sbuf *b, int indent, int level) {
    sb_add(b, "\n");
    for (int i = 0; i < indent * level; i++) sb_add(b, " ");
}

/* Writes v as json.dumps does: JS_PY with ", " and ": ", an indent with "," and ": " and
 * newlines, JS_COMPACT with "," and ":". Keys in their order (jansson keeps insertion order). */
static void add_json(sbuf *b, const json_t *v, int style, int level) {
    const char *isep = style == JS_PY ? ", " : ",", *ksep = style == JS_COMPACT ? ":" : ": ";
    char num[32];
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        if (!json_object_size(v)) {
            sb_add(b, "{}");
            return;
        }
        sb_add(b, "{");
        const char *k;
        json_t *x;
        int first = 1;
        json_object_foreach((json_t *)v, k, x) {
            if (!first) sb_add(b, isep);
            first = 0;
            if (style >= 0) newline_indent(b, style, level + 1);
            add_json_str(b, k, strlen(k));
            sb_add(b, ksep);
            add_json(b, x, style, level + 1);
        }
        if (style >= 0) newline_indent(b, style, level);
        sb_add(b, "}");
        return;
    }
    case JSON_ARRAY: {
        if (!json_array_size(v)) {
            sb_add(b, "[]");
            return;
        }
        sb_add(b, "[");
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) sb_add(b, isep);
            if (style >= 0) newline_indent(b, style, level + 1);
            add_json(b, json_array_get(v, i), style, level + 1);
        }
        if (style >= 0) newline_indent(b, style, level);
        sb_add(b, "]");
        return;
    }
    case JSON_STRING: add_json_str(b, json_string_value(v), json_string_length(v)); return;
    case JSON_INTEGER:
        snprintf(num, sizeof num, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        sb_add(b, num);
        return;
    case JSON_REAL: add_py_float(b, json_real_value(v)); return;
    case JSON_TRUE: sb_add(b, "true"); return;
    case JSON_FALSE: sb_add(b, "false"); return;
    default: sb_add(b, "null"); return;
    }
}

static char *json_text(const json_t *v, int style) {
    sbuf b = {0};
    add_json(&b, v, style, 0);
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    return b.p;
}

/* Parses an object's JSON text; NULL when it is not one. */
static json_t *load_object(const char *text) {
    if (!text) return NULL;
    json_t *j = json_loads(text, JSON_REJECT_DUPLICATES, NULL);
    if (j && !json_is_object(j)) {
        json_decref(j);
        return NULL;
    }
    return j;
}

/* ================================================================ formats */

int zs_toolcall_format(int chat_tmpl) {
    switch (chat_tmpl) {
    case ZS_CHAT_CHATML: return ZS_TOOLFMT_HERMES;
    case ZS_CHAT_LLAMA3: return ZS_TOOLFMT_LLAMA3;
    case ZS_CHAT_MISTRAL: return ZS_TOOLFMT_MISTRAL;
    default: return ZS_TOOLFMT_GENERIC;
    }
}

const char *zs_toolcall_format_name(int fmt) {
    static const char *names[] = {"generic", "hermes", "llama3", "mistral"};
    return fmt >= 0 && fmt <= ZS_TOOLFMT_MISTRAL ? names[fmt] : "unknown";
}

/* ================================================================ rendering */

enum { M_SYSTEM, M_USER, M_ASSISTANT, M_TOOL };

typedef struct {
    int role;
    const char *content;  /* never NULL */
    const zs_tool_msg *m;
    json_t **args;        /* n_tool_calls parsed arguments */
} rmsg;

typedef struct {
    rmsg *m;
    int n;
    json_t **tools;  /* {"type": "function", "function": {...}} per tool */
    int n_tools;
} rctx;

static void rctx_free(rctx *c) {
    for (int i = 0; i < c->n; i++) {
        for (int k = 0; c->m[i].args && k < c->m[i].m->n_tool_calls; k++) json_decref(c->m[i].args[k]);
        free(c->m[i].args);
    }
    free(c->m);
    for (int i = 0; i < c->n_tools; i++) json_decref(c->tools[i]);
    free(c->tools);
}

static int check_name(const char *name, const char *what, int i) {
    size_t n = name ? strlen(name) : 0;
    if (n < 1 || n > 64) return zs_err(ZS_EINVAL, "%s[%d].function.name: must be 1 to 64 characters", what, i);
    for (size_t k = 0; k < n; k++) {
        char c = name[k];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
            return zs_err(ZS_EINVAL, "%s[%d].function.name: '%s' may hold only letters, digits, '_' and '-'", what, i,
                          name);
    }
    return 0;
}

/* The tool as its JSON: {"type": "function", "function": {"name", "description" (when given),
 * "parameters" (when given)}}. */
static int tool_json(const zs_tool_def *t, int i, json_t **out) {
    ZS_CHECK(check_name(t->name, "tools", i));
    json_t *params = NULL;
    if (t->parameters) {
        params = load_object(t->parameters);
        if (!params) return zs_err(ZS_EINVAL, "tools[%d].function.parameters: not a JSON object", i);
    }
    json_t *f = json_object(), *o = json_object();
    int bad = !f || !o;
    bad |= json_object_set_new(f, "name", json_string(t->name)) < 0;
    if (t->description) {
        json_t *d = json_string(t->description);
        if (!d) {
            json_decref(f);
            json_decref(o);
            json_decref(params);
            return zs_err(ZS_EINVAL, "tools[%d].function.description: not valid UTF-8", i);
        }
        bad |= json_object_set_new(f, "description", d) < 0;
    }
    if (params) bad |= json_object_set_new(f, "parameters", params) < 0;
    bad |= json_object_set_new(o, "type", json_string("function")) < 0;
    bad |= json_object_set_new(o, "function", f) < 0;
    if (bad) {
        json_decref(o);
        return zs_err(ZS_ENOMEM, "tools: out of memory");
    }
    *out = o;
    return 0;
}

static int rctx_init(rctx *c, const zs_tool_msg *msgs, int n, const zs_tool_def *tools, int n_tools) {
    memset(c, 0, sizeof *c);
    if (!msgs || n <= 0) return zs_err(ZS_EINVAL, "messages: at least one message is required");
    if (n_tools < 0 || (n_tools > 0 && !tools)) return zs_err(ZS_EINVAL, "tools: bad count");
    c->m = calloc((size_t)n, sizeof *c->m);
    c->tools = calloc((size_t)(n_tools ? n_tools : 1), sizeof *c->tools);
    if (!c->m || !c->tools) return zs_err(ZS_ENOMEM, "messages: out of memory");
    c->n = n;
    for (int i = 0; i < n_tools; i++) {
        ZS_CHECK(tool_json(&tools[i], i, &c->tools[i]));
        c->n_tools = i + 1;
    }
    for (int i = 0; i < n; i++) {
        const zs_tool_msg *m = &msgs[i];
        rmsg *r = &c->m[i];
        r->m = m;
        r->content = m->content ? m->content : "";
        const char *ro = m->role;
        if (ro && (!strcmp(ro, "system") || !strcmp(ro, "developer"))) r->role = M_SYSTEM;
        else if (ro && !strcmp(ro, "user")) r->role = M_USER;
        else if (ro && !strcmp(ro, "assistant")) r->role = M_ASSISTANT;
        else if (ro && !strcmp(ro, "tool")) r->role = M_TOOL;
        else
            return zs_err(ZS_EINVAL, "messages[%d].role: '%s' is not supported (expected system, user, assistant "
                          "or tool)", i, ro ? ro : "(none)");
        if (m->n_tool_calls < 0 || (m->n_tool_calls > 0 && !m->tool_calls))
            return zs_err(ZS_EINVAL, "messages[%d].tool_calls: bad count", i);
        if (m->n_tool_calls > 0 && r->role != M_ASSISTANT)
            return zs_err(ZS_EINVAL, "messages[%d].tool_calls: only assistant messages hold tool calls", i);
        if (m->n_tool_calls > 0) {
            r->args = calloc((size_t)m->n_tool_calls, sizeof *r->args);
            if (!r->args) return zs_err(ZS_ENOMEM, "messages: out of memory");
        }
        for (int k = 0; k < m->n_tool_calls; k++) {
            const zs_tool_call *tc = &m->tool_calls[k];
            if (!tc->name || !*tc->name)
                return zs_err(ZS_EINVAL, "messages[%d].tool_calls[%d].function.name: missing", i, k);
            const char *a = tc->arguments && *tc->arguments ? tc->arguments : "{}";
            r->args[k] = load_object(a);
            if (!r->args[k])
                return zs_err(ZS_EINVAL, "messages[%d].tool_calls[%d].function.arguments: not a JSON object", i, k);
        }
    }
    return 0;
}

static int has_tool_parts(const rctx *c) {
    for (int i = 0; i < c->n; i++)
        if (c->m[i].role == M_TOOL || c->m[i].m->n_tool_calls > 0) return 1;
    return 0;
}

/* Adds s with leading and trailing whitespace removed (Python's str.strip(), chat.c's). */
static void add_stripped(sbuf *b, const char *s) {
    size_t n = strlen(s);
    const char *u = zs_chat_strip(s, &n);
    sb_addn(b, u, n);
}

static const char *k_role[] = {"system", "user", "assistant", "tool"};

/* ---------------------------------------------------------------- hermes (Qwen2.5) */

static void render_hermes(const rctx *c, int gen, sbuf *b) {
    int first_sys = c->m[0].role == M_SYSTEM;
    if (c->n_tools) {
        sb_add(b, "<|im_start|>system\n");
        sb_add(b, first_sys ? c->m[0].content : "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
        sb_add(b, "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                  "You are provided with function signatures within <tools></tools> XML tags:\n<tools>");
        for (int i = 0; i < c->n_tools; i++) {
            sb_add(b, "\n");
            add_json(b, c->tools[i], JS_PY, 0);
        }
        sb_add(b, "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
                  "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
                  "\"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n");
    } else if (first_sys) {
        sb_add(b, "<|im_start|>system\n");
        sb_add(b, c->m[0].content);
        sb_add(b, "<|im_end|>\n");
    }
    for (int i = 0; i < c->n; i++) {
        const rmsg *m = &c->m[i];
        if (m->role == M_USER || (m->role == M_SYSTEM && i > 0) ||
            (m->role == M_ASSISTANT && !m->m->n_tool_calls)) {
            sb_add(b, "<|im_start|>");
            sb_add(b, k_role[m->role]);
            sb_add(b, "\n");
            sb_add(b, m->content);
            sb_add(b, "<|im_end|>\n");
        } else if (m->role == M_ASSISTANT) {
            sb_add(b, "<|im_start|>assistant");
            if (*m->content) {
                sb_add(b, "\n");
                sb_add(b, m->content);
            }
            for (int k = 0; k < m->m->n_tool_calls; k++) {
                sb_add(b, "\n<tool_call>\n{\"name\": \"");
                sb_add(b, m->m->tool_calls[k].name);
                sb_add(b, "\", \"arguments\": ");
                add_json(b, m->args[k], JS_PY, 0);
                sb_add(b, "}\n</tool_call>");
            }
            sb_add(b, "<|im_end|>\n");
        } else if (m->role == M_TOOL) {
            if (i == 0 || c->m[i - 1].role != M_TOOL) sb_add(b, "<|im_start|>user");
            sb_add(b, "\n<tool_response>\n");
            sb_add(b, m->content);
            sb_add(b, "\n</tool_response>");
            if (i == c->n - 1 || c->m[i + 1].role != M_TOOL) sb_add(b, "<|im_end|>\n");
        }
    }
    if (gen) sb_add(b, "<|im_start|>assistant\n");
}

/* ---------------------------------------------------------------- llama3 (Llama 3.1) */

#define LLAMA3_DATE "26 Jul 2024"

static int render_llama3(const rctx *c, int gen, const char *bos, sbuf *b) {
    int i = 0;
    sb_add(b, bos);
    if (c->n_tools) {
        if (c->m[0].role == M_SYSTEM) i = 1;
        sb_add(b, "<|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n"
                  "Cutting Knowledge Date: December 2023\nToday Date: " LLAMA3_DATE "\n\n");
        if (i) add_stripped(b, c->m[0].content);
        sb_add(b, "<|eot_id|>");
        if (i >= c->n) return zs_err(ZS_EINVAL, "messages: the llama3 tool format needs a user message (the tools "
                                                "are written into the first one)");
        if (c->m[i].role != M_USER)
            return zs_err(ZS_EINVAL, "messages[%d].role: the llama3 tool format writes the tools into the first user "
                          "message, which must follow the system message; got '%s'", i, k_role[c->m[i].role]);
        sb_add(b, "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please respond with a "
                  "JSON for a function call with its proper arguments that best answers the given prompt.\n\n"
                  "Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and "
                  "its value}.Do not use variables.\n\n");
        for (int t = 0; t < c->n_tools; t++) {
            add_json(b, c->tools[t], 4, 0);
            sb_add(b, "\n\n");
        }
        add_stripped(b, c->m[i].content);
        sb_add(b, "<|eot_id|>");
        i++;
    }
    for (; i < c->n; i++) {
        const rmsg *m = &c->m[i];
        if (m->m->n_tool_calls) {
            if (m->m->n_tool_calls != 1)
                return zs_err(ZS_EINVAL, "messages[%d].tool_calls: the llama3 tool format holds one call per message "
                              "(got %d)", i, m->m->n_tool_calls);
            sb_add(b, "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"");
            sb_add(b, m->m->tool_calls[0].name);
            sb_add(b, "\", \"parameters\": ");
            add_json(b, m->args[0], JS_PY, 0);
            sb_add(b, "}<|eot_id|>");
        } else if (m->role == M_TOOL) {
            sb_add(b, "<|start_header_id|>ipython<|end_header_id|>\n\n");
            add_json_str(b, m->content, strlen(m->content));
            sb_add(b, "<|eot_id|>");
        } else {
            sb_add(b, "<|start_header_id|>");
            sb_add(b, k_role[m->role]);
            sb_add(b, "<|end_header_id|>\n\n");
            add_stripped(b, m->content);
            sb_add(b, "<|eot_id|>");
        }
    }
    if (gen) sb_add(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    return 0;
}

/* ---------------------------------------------------------------- mistral (v3, Mistral-Nemo) */

/* Mistral's call ids are 9 letters/digits; any other id is mapped to 9 such characters
 * (FNV-1a of the id in base 62), the same for a call and for the result that names it. */
static void add_mistral_id(sbuf *b, const char *id) {
    size_t n = id ? strlen(id) : 0;
    int ok = n == 9;
    for (size_t k = 0; ok && k < n; k++) {
        char ch = id[k];
        ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9');
    }
    if (ok) {
        sb_add(b, id);
        return;
    }
    static const char al[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    uint64_t h = 1469598103934665603ull;
    for (size_t k = 0; k < n; k++) h = (h ^ (unsigned char)id[k]) * 1099511628211ull;
    char out[10];
    for (int k = 0; k < 9; k++) {
        out[k] = al[h % 62];
        h /= 62;
        if (!h) h = 0x9e3779b97f4a7c15ull;
    }
    out[9] = '\0';
    sb_add(b, out);
}

static void mistral_tools(const rctx *c, sbuf *b) {
    sb_add(b, "[AVAILABLE_TOOLS][");
    for (int t = 0; t < c->n_tools; t++) {
        json_t *f = json_object_get(c->tools[t], "function");
        sb_add(b, "{\"type\": \"function\", \"function\": {");
        const char *k;
        json_t *v;
        int first = 1;
        json_object_foreach(f, k, v) {
            if (!first) sb_add(b, ", ");
            first = 0;
            sb_add(b, "\"");
            sb_add(b, k);
            sb_add(b, "\": ");
            if (json_is_string(v)) { /* the template writes strings unescaped */
                sb_add(b, "\"");
                sb_add(b, json_string_value(v));
                sb_add(b, "\"");
            } else {
                add_json(b, v, JS_PY, 0);
            }
        }
        sb_add(b, "}}");
        sb_add(b, t + 1 < c->n_tools ? ", " : "]");
    }
    sb_add(b, "[/AVAILABLE_TOOLS]");
}

static int render_mistral(const rctx *c, const char *bos, const char *eos, sbuf *b) {
    int first = c->m[0].role == M_SYSTEM, idx = 0, last_user = -1;
    for (int i = first; i < c->n; i++) {
        const rmsg *m = &c->m[i];
        if (m->role == M_TOOL || m->m->n_tool_calls) continue;
        int want = idx % 2 == 0 ? M_USER : M_ASSISTANT;
        if (m->role != want)
            return zs_err(ZS_EINVAL, "messages[%d].role: the mistral chat template needs roles alternating "
                          "user/assistant/user/... (after an optional first system message; tool calls and results "
                          "aside); got '%s'", i, k_role[m->role]);
        idx++;
        if (m->role == M_USER) last_user = i;
    }
    if (first >= c->n)
        return zs_err(ZS_EINVAL, "messages: the mistral chat template needs a user message after the system message");
    sb_add(b, bos);
    for (int i = first; i < c->n; i++) {
        const rmsg *m = &c->m[i];
        if (m->role == M_USER) {
            if (c->n_tools && last_user >= 0 && !strcmp(m->content, c->m[last_user].content)) mistral_tools(c, b);
            sb_add(b, "[INST]");
            if (i == c->n - 1 && first) {
                sb_add(b, c->m[0].content);
                sb_add(b, "\n\n");
            }
            sb_add(b, m->content);
            sb_add(b, "[/INST]");
        } else if (m->m->n_tool_calls) {
            sb_add(b, "[TOOL_CALLS][");
            for (int k = 0; k < m->m->n_tool_calls; k++) {
                sb_add(b, "{\"name\": ");
                add_json_str(b, m->m->tool_calls[k].name, strlen(m->m->tool_calls[k].name));
                sb_add(b, ", \"arguments\": ");
                add_json(b, m->args[k], JS_PY, 0);
                sb_add(b, ", \"id\": \"");
                add_mistral_id(b, m->m->tool_calls[k].id);
                sb_add(b, "\"}");
                if (k + 1 < m->m->n_tool_calls) sb_add(b, ", ");
            }
            sb_add(b, "]");
            sb_add(b, eos);
        } else if (m->role == M_ASSISTANT) {
            sb_add(b, m->content);
            sb_add(b, eos);
        } else { /* tool */
            sb_add(b, "[TOOL_RESULTS]{\"content\": ");
            sb_add(b, m->content);
            sb_add(b, ", \"call_id\": \"");
            add_mistral_id(b, m->m->tool_call_id);
            sb_add(b, "\"}[/TOOL_RESULTS]");
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- generic */

#define GENERIC_INTRO                                                                                  \
    "# Tools\n\nYou may call one or more functions to assist with the user query. The functions, as " \
    "JSON:\n<tools>"
#define GENERIC_OUTRO                                                                                  \
    "\n</tools>\n\nTo call a function, answer with one line per call:\n<tool_call>{\"name\": "         \
    "<function-name>, \"arguments\": <args-json-object>}</tool_call>"

static int render_generic(int tmpl, const rctx *c, int gen, const char *bos, const char *eos, char **out) {
    int n = c->n + 1, k = 0, rc = 0;
    zs_chat_msg *cm = calloc((size_t)n, sizeof *cm);
    sbuf *texts = calloc((size_t)n, sizeof *texts); /* the contents this builds */
    if (!cm || !texts) {
        free(cm);
        free(texts);
        return zs_err(ZS_ENOMEM, "messages: out of memory");
    }
    int i = 0;
    if (c->n_tools) {
        sbuf *t = &texts[k];
        if (c->m[0].role == M_SYSTEM) {
            sb_add(t, c->m[0].content);
            sb_add(t, "\n\n");
            i = 1;
        }
        sb_add(t, GENERIC_INTRO);
        for (int j = 0; j < c->n_tools; j++) {
            sb_add(t, "\n");
            add_json(t, c->tools[j], JS_PY, 0);
        }
        sb_add(t, GENERIC_OUTRO);
        cm[k].role = "system";
        k++;
    }
    for (; i < c->n; i++) {
        const rmsg *m = &c->m[i];
        sbuf *t = &texts[k];
        if (m->role == M_TOOL) {
            cm[k].role = "user";
            for (; i < c->n && c->m[i].role == M_TOOL; i++) {
                if (t->len) sb_add(t, "\n");
                sb_add(t, "<tool_response>");
                sb_add(t, c->m[i].content);
                sb_add(t, "</tool_response>");
            }
            i--;
            if (!t->len) sb_addn(t, "", 0);
        } else if (m->m->n_tool_calls) {
            cm[k].role = "assistant";
            if (*m->content) {
                sb_add(t, m->content);
                sb_add(t, "\n");
            }
            for (int j = 0; j < m->m->n_tool_calls; j++) {
                if (j) sb_add(t, "\n");
                sb_add(t, "<tool_call>{\"name\": ");
                add_json_str(t, m->m->tool_calls[j].name, strlen(m->m->tool_calls[j].name));
                sb_add(t, ", \"arguments\": ");
                add_json(t, m->args[j], JS_PY, 0);
                sb_add(t, "}</tool_call>");
            }
        } else {
            cm[k].role = m->m->role;
            cm[k].content = m->content;
        }
        k++;
    }
    for (int j = 0; j < k; j++) {
        if (texts[j].oom) rc = zs_err(ZS_ENOMEM, "messages: out of memory");
        if (!cm[j].content) cm[j].content = texts[j].p ? texts[j].p : "";
    }
    if (rc == 0) rc = zs_chat_render(tmpl, cm, k, gen, bos, eos, out);
    for (int j = 0; j < n; j++) free(texts[j].p);
    free(texts);
    free(cm);
    return rc;
}

int zs_toolcall_render(int chat_tmpl, int fmt, const zs_tool_msg *msgs, int n, const zs_tool_def *tools,
                       int n_tools, int add_generation_prompt, const char *bos, const char *eos, char **out) {
    if (!out) return zs_err(ZS_EINVAL, "zs_toolcall_render: NULL output");
    if (chat_tmpl < 0 || chat_tmpl >= ZS_CHAT_NFAMILIES)
        return zs_err(ZS_EINVAL, "chat template %d is unknown", chat_tmpl);
    if (fmt != ZS_TOOLFMT_GENERIC && fmt != zs_toolcall_format(chat_tmpl))
        return zs_err(ZS_EINVAL, "tool format %s does not fit the %s chat template (use %s or generic)",
                      zs_toolcall_format_name(fmt), zs_chat_template_name(chat_tmpl),
                      zs_toolcall_format_name(zs_toolcall_format(chat_tmpl)));
    rctx c;
    int rc = rctx_init(&c, msgs, n, tools, n_tools);
    if (rc == 0 && !c.n_tools && !has_tool_parts(&c)) {
        /* exactly chat.c's text (its errors for roles included) */
        zs_chat_msg *cm = malloc((size_t)n * sizeof *cm);
        if (!cm) rc = zs_err(ZS_ENOMEM, "messages: out of memory");
        for (int i = 0; rc == 0 && i < n; i++) {
            cm[i].role = msgs[i].role;
            cm[i].content = msgs[i].content;
        }
        if (rc == 0) rc = zs_chat_render(chat_tmpl, cm, n, add_generation_prompt, bos, eos, out);
        free(cm);
        rctx_free(&c);
        return rc;
    }
    sbuf b = {0};
    if (rc == 0) {
        switch (fmt) {
        case ZS_TOOLFMT_HERMES: render_hermes(&c, add_generation_prompt, &b); break;
        case ZS_TOOLFMT_LLAMA3:
            rc = render_llama3(&c, add_generation_prompt, bos ? bos : "<|begin_of_text|>", &b);
            break;
        case ZS_TOOLFMT_MISTRAL: rc = render_mistral(&c, bos ? bos : "<s>", eos ? eos : "</s>", &b); break;
        default: rc = render_generic(chat_tmpl, &c, add_generation_prompt, bos, eos, out); break;
        }
    }
    rctx_free(&c);
    if (fmt == ZS_TOOLFMT_GENERIC || rc < 0) {
        free(b.p);
        return rc;
    }
    if (b.oom || (!b.p && !(b.p = calloc(1, 1)))) {
        free(b.p);
        return zs_err(ZS_ENOMEM, "messages: out of memory");
    }
    *out = b.p;
    return 0;
}

/* ================================================================ constraint */

/* Adds "additionalProperties": false to every object schema without it (type object, a type
 * list with object, or properties present), through properties, items, anyOf, $defs and
 * definitions; rewrites "$ref" ("#" -> "#/$defs/<prefix>", "#/$defs/N" or "#/definitions/N"
 * -> "#/$defs/<prefix>_N") for the definitions hoisted to the call schema's root. */
static int fix_schema(json_t *s, const char *prefix) {
    if (!json_is_object(s)) return 0;
    json_t *type = json_object_get(s, "type"), *props = json_object_get(s, "properties");
    int is_obj = props != NULL || (json_is_string(type) && !strcmp(json_string_value(type), "object"));
    if (json_is_array(type))
        for (size_t i = 0; i < json_array_size(type); i++) {
            const char *t = json_string_value(json_array_get(type, i));
            if (t && !strcmp(t, "object")) is_obj = 1;
        }
    if (is_obj && !json_object_get(s, "additionalProperties") && !json_object_get(s, "enum") &&
        !json_object_get(s, "const"))
        if (json_object_set_new(s, "additionalProperties", json_false()) < 0) return ZS_ENOMEM;
    json_t *ref = json_object_get(s, "$ref");
    if (json_is_string(ref)) {
        const char *r = json_string_value(ref);
        char buf[512];
        buf[0] = '\0';
        if (!strcmp(r, "#")) snprintf(buf, sizeof buf, "#/$defs/%s", prefix);
        else if (!strncmp(r, "#/$defs/", 8)) snprintf(buf, sizeof buf, "#/$defs/%s_%s", prefix, r + 8);
        else if (!strncmp(r, "#/definitions/", 14)) snprintf(buf, sizeof buf, "#/$defs/%s_%s", prefix, r + 14);
        if (buf[0] && json_object_set_new(s, "$ref", json_string(buf)) < 0) return ZS_ENOMEM;
    }
    const char *k;
    json_t *v;
    if (json_is_object(props)) json_object_foreach(props, k, v) ZS_CHECK(fix_schema(v, prefix));
    json_t *items = json_object_get(s, "items");
    if (items) ZS_CHECK(fix_schema(items, prefix));
    json_t *any = json_object_get(s, "anyOf");
    for (size_t i = 0; json_is_array(any) && i < json_array_size(any); i++)
        ZS_CHECK(fix_schema(json_array_get(any, i), prefix));
    static const char *const defs[] = {"$defs", "definitions"};
    for (int d = 0; d < 2; d++) {
        json_t *dv = json_object_get(s, defs[d]);
        if (json_is_object(dv)) json_object_foreach(dv, k, v) ZS_CHECK(fix_schema(v, prefix));
    }
    return 0;
}

/* The arguments schema of tool i, fixed, its $defs moved into root_defs as "t<i>_NAME" and the
 * schema itself as "t<i>" (for "$ref": "#"). */
static int tool_params_schema(const zs_tool_def *t, int i, json_t *root_defs, json_t **out) {
    json_t *p = t->parameters ? load_object(t->parameters)
                              : json_pack("{s:s,s:{},s:b}", "type", "object", "properties", "additionalProperties", 0);
    if (!p) return zs_err(ZS_EINVAL, "tools[%d].function.parameters: not a JSON object", i);
    char prefix[32];
    snprintf(prefix, sizeof prefix, "t%d", i);
    if (fix_schema(p, prefix) < 0) {
        json_decref(p);
        return zs_err(ZS_ENOMEM, "tools: out of memory");
    }
    static const char *const defs[] = {"$defs", "definitions"};
    for (int d = 0; d < 2; d++) {
        json_t *dv = json_object_get(p, defs[d]);
        const char *k;
        json_t *v;
        if (json_is_object(dv)) {
            json_object_foreach(dv, k, v) {
                char name[512];
                snprintf(name, sizeof name, "%s_%s", prefix, k);
                json_object_set(root_defs, name, v);
            }
            json_object_del(p, defs[d]);
        }
    }
    json_object_set(root_defs, prefix, p);
    *out = p;
    return 0;
}

/* More argument schemas than this are merged into one object (below): jsonschema.c follows at
 * most ZS_JSCHEMA_MAX_ALTS alternatives at once, and all of an anyOf's objects are alive after
 * its '{' (some headroom is left for anyOfs inside the arguments). */
#define MAX_ARG_ALTS (ZS_JSCHEMA_MAX_ALTS - 4)

/* The union of object schemas alts: every property of any of them (a name with different
 * schemas: anyOf of them), nothing required, additionalProperties false. NULL when one of them
 * is not a plain object schema (only type/properties/required/additionalProperties and
 * annotations) or a name has more than 64 schemas. */
static json_t *merge_objects(json_t *alts) {
    json_t *props = json_object(), *u = NULL;
    if (!props) return NULL;
    for (size_t i = 0; i < json_array_size(alts); i++) {
        json_t *a = json_array_get(alts, i), *v;
        const char *k;
        json_object_foreach(a, k, v) {
            if (strcmp(k, "type") && strcmp(k, "properties") && strcmp(k, "required") &&
                strcmp(k, "additionalProperties") && strcmp(k, "description") && strcmp(k, "title"))
                goto fail;
        }
        json_t *t = json_object_get(a, "type");
        if (!json_is_string(t) || strcmp(json_string_value(t), "object")) goto fail;
        json_t *pp = json_object_get(a, "properties");
        json_object_foreach(pp, k, v) {
            json_t *have = json_object_get(props, k);
            if (!have) {
                json_object_set_new(props, k, json_pack("{s:[O]}", "anyOf", v));
                continue;
            }
            json_t *list = json_object_get(have, "anyOf");
            int dup = 0;
            for (size_t j = 0; j < json_array_size(list); j++) dup |= json_equal(json_array_get(list, j), v);
            if (!dup && json_array_size(list) >= 64) goto fail;
            if (!dup) json_array_append(list, v);
        }
    }
    const char *k;
    json_t *v;
    json_object_foreach(props, k, v) { /* one schema: itself, not an anyOf of one */
        json_t *list = json_object_get(v, "anyOf");
        if (json_array_size(list) == 1) json_object_set(props, k, json_array_get(list, 0));
    }
    u = json_pack("{s:s,s:O,s:b}", "type", "object", "properties", props, "additionalProperties", 0);
fail:
    json_decref(props);
    return u;
}

/* Builds the call schema over tools[sel[0..n_sel)). */
static int call_schema(int fmt, const zs_tool_def *tools, const int *sel, int n_sel, char **out) {
    json_t *root = json_object(), *props = json_object(), *defs = json_object(), *names = json_array(),
           *alts = json_array();
    int rc = (!root || !props || !defs || !names || !alts) ? zs_err(ZS_ENOMEM, "tools: out of memory") : 0;
    for (int j = 0; rc == 0 && j < n_sel; j++) {
        json_t *p = NULL;
        rc = tool_params_schema(&tools[sel[j]], sel[j], defs, &p);
        if (rc < 0) break;
        json_array_append_new(names, json_string(tools[sel[j]].name));
        int dup = 0; /* identical argument schemas are one alternative */
        for (size_t a = 0; a < json_array_size(alts); a++)
            if (json_equal(json_array_get(alts, a), p)) dup = 1;
        if (dup) json_decref(p);
        else json_array_append_new(alts, p);
    }
    if (rc == 0) {
        const char *key = fmt == ZS_TOOLFMT_LLAMA3 ? "parameters" : "arguments";
        json_t *name = json_array_size(names) == 1 ? json_pack("{s:O}", "const", json_array_get(names, 0))
                                                   : json_pack("{s:O}", "enum", names);
        json_t *args = json_array_size(alts) == 1 ? json_incref(json_array_get(alts, 0))
                       : json_array_size(alts) > MAX_ARG_ALTS ? merge_objects(alts)
                                                              : NULL;
        if (!args) args = json_pack("{s:O}", "anyOf", alts);
        json_object_set_new(root, "type", json_string("object"));
        json_object_set_new(props, "name", name);
        json_object_set_new(props, key, args);
        json_object_set(root, "properties", props);
        json_object_set_new(root, "required", json_pack("[s,s]", "name", key));
        json_object_set_new(root, "additionalProperties", json_false());
        if (json_object_size(defs)) json_object_set(root, "$defs", defs);
        *out = json_text(root, JS_COMPACT);
        if (!*out) rc = zs_err(ZS_ENOMEM, "tools: out of memory");
    }
    json_decref(root);
    json_decref(props);
    json_decref(defs);
    json_decref(names);
    json_decref(alts);
    return rc;
}

/* Compiles schema; on failure rewrites jsonschema.c's message for tools[i].function.parameters:
 * the pointer made relative to the parameters. */
static int check_compiles(const char *schema, int i) {
    zs_jschema *g = NULL;
    int rc = zs_jschema_compile(schema, &g);
    zs_jschema_free(g);
    if (rc == 0 || i < 0) return rc;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", zs_errmsg());
    sbuf b = {0};
    const char *pre = "/properties/arguments", *pre2 = "/properties/parameters";
    for (const char *q = msg; *q;) {
        if (!strncmp(q, pre, strlen(pre))) q += strlen(pre);
        else if (!strncmp(q, pre2, strlen(pre2))) q += strlen(pre2);
        else sb_addn(&b, q++, 1);
    }
    rc = zs_err(rc, "tools[%d].function.parameters: %s", i, b.p ? b.p : msg);
    free(b.p);
    return rc;
}

int zs_toolcall_constraint_make(int fmt, const zs_tool_def *tools, int n_tools, const char *only,
                                zs_toolcall_constraint *out) {
    if (!out) return zs_err(ZS_EINVAL, "zs_toolcall_constraint_make: NULL output");
    memset(out, 0, sizeof *out);
    if (fmt < 0 || fmt > ZS_TOOLFMT_MISTRAL) return zs_err(ZS_EINVAL, "tool format %d is unknown", fmt);
    if (n_tools <= 0 || !tools) return zs_err(ZS_EINVAL, "tools: at least one tool is required");
    for (int i = 0; i < n_tools; i++) {
        ZS_CHECK(check_name(tools[i].name, "tools", i));
        for (int j = 0; j < i; j++)
            if (!strcmp(tools[i].name, tools[j].name))
                return zs_err(ZS_EINVAL, "tools[%d].function.name: '%s' is also tools[%d]'s name", i, tools[i].name, j);
    }
    int *sel = malloc((size_t)n_tools * sizeof *sel), n_sel = 0;
    if (!sel) return zs_err(ZS_ENOMEM, "tools: out of memory");
    for (int i = 0; i < n_tools; i++)
        if (!only || !strcmp(only, tools[i].name)) sel[n_sel++] = i;
    if (!n_sel) {
        free(sel);
        return zs_err(ZS_EINVAL, "tool_choice.function.name: '%s' is not among the tools", only);
    }
    /* each tool alone first: a parameters schema the grammar cannot take is named */
    int rc = 0;
    for (int j = 0; rc == 0 && j < n_sel; j++) {
        char *s = NULL;
        rc = call_schema(fmt, tools, &sel[j], 1, &s);
        if (rc == 0) rc = check_compiles(s, sel[j]);
        free(s);
    }
    char *schema = NULL;
    if (rc == 0) rc = call_schema(fmt, tools, sel, n_sel, &schema);
    if (rc == 0) rc = check_compiles(schema, -1);
    free(sel);
    if (rc < 0) {
        free(schema);
        return rc;
    }
    static const char *const pre[] = {"<tool_call>", "<tool_call>\n", "", "[TOOL_CALLS]["};
    static const char *const suf[] = {"</tool_call>", "\n</tool_call>", "", "]"};
    static const char *const trig[] = {"<tool_call>", "<tool_call>", "{", "[TOOL_CALLS]"};
    out->schema_json = schema;
    out->prefix = strdup(pre[fmt]);
    out->suffix = strdup(suf[fmt]);
    out->trigger = strdup(trig[fmt]);
    if (!out->prefix || !out->suffix || !out->trigger) {
        zs_toolcall_constraint_free(out);
        return zs_err(ZS_ENOMEM, "tools: out of memory");
    }
    return 0;
}

void zs_toolcall_constraint_free(zs_toolcall_constraint *c) {
    if (!c) return;
    free(c->schema_json);
    free(c->prefix);
    free(c->suffix);
    free(c->trigger);
    memset(c, 0, sizeof *c);
}

/* ================================================================ parsing */

typedef struct {
    size_t start, end;
} span;

typedef struct {
    zs_toolcall_parsed *out;
    int cap_calls;
    span *spans;
    int n_spans, cap_spans;
    const zs_tool_def *tools;
    int n_tools;
    const char *seed;
    int oom;
} pstate;

static int tool_known(const pstate *ps, const char *name) {
    if (!ps->n_tools) return 1;
    for (int i = 0; i < ps->n_tools; i++)
        if (ps->tools[i].name && !strcmp(ps->tools[i].name, name)) return 1;
    return 0;
}

/* A call object: "name" a known tool, "arguments" (or "parameters") an object or a string
 * holding one (or absent: {}). 1 with *args (new reference) set, 0 when it is not a call. */
static int call_parts(const pstate *ps, json_t *o, const char **name, json_t **args) {
    if (!json_is_object(o)) return 0;
    *name = json_string_value(json_object_get(o, "name"));
    if (!*name || !tool_known(ps, *name)) return 0;
    json_t *a = json_object_get(o, "arguments");
    if (!a) a = json_object_get(o, "parameters");
    if (!a) {
        *args = json_object();
        return *args != NULL;
    }
    if (json_is_object(a)) {
        *args = json_incref(a);
        return 1;
    }
    if (json_is_string(a)) {
        *args = load_object(json_string_value(a));
        return *args != NULL;
    }
    return 0;
}

static void add_call(pstate *ps, const char *name, json_t *args, const char *id) {
    zs_toolcall_parsed *p = ps->out;
    if (p->n_calls == ps->cap_calls) {
        int nc = ps->cap_calls ? ps->cap_calls * 2 : 4;
        zs_tool_call *n = realloc(p->calls, (size_t)nc * sizeof *n);
        if (!n) {
            ps->oom = 1;
            return;
        }
        p->calls = n;
        ps->cap_calls = nc;
    }
    char idbuf[160];
    if (!id) {
        if (ps->seed) snprintf(idbuf, sizeof idbuf, "call_%d_%.120s", p->n_calls, ps->seed);
        else snprintf(idbuf, sizeof idbuf, "call_%d", p->n_calls);
        id = idbuf;
    }
    zs_tool_call *c = &p->calls[p->n_calls];
    c->id = strdup(id);
    c->name = strdup(name);
    c->arguments = json_text(args, JS_COMPACT);
    if (!c->id || !c->name || !c->arguments) {
        free((char *)c->id);
        free((char *)c->name);
        free((char *)c->arguments);
        ps->oom = 1;
        return;
    }
    p->n_calls++;
}

static void add_span(pstate *ps, size_t a, size_t b) {
    if (ps->n_spans == ps->cap_spans) {
        int nc = ps->cap_spans ? ps->cap_spans * 2 : 4;
        span *n = realloc(ps->spans, (size_t)nc * sizeof *n);
        if (!n) {
            ps->oom = 1;
            return;
        }
        ps->spans = n;
        ps->cap_spans = nc;
    }
    ps->spans[ps->n_spans].start = a;
    ps->spans[ps->n_spans].end = b;
    ps->n_spans++;
}

static int in_span(const pstate *ps, size_t pos) {
    for (int i = 0; i < ps->n_spans; i++)
        if (pos >= ps->spans[i].start && pos < ps->spans[i].end) return 1;
    return 0;
}

static size_t skip_ws(const char *t, size_t len, size_t i) {
    while (i < len && (t[i] == ' ' || t[i] == '\n' || t[i] == '\r' || t[i] == '\t')) i++;
    return i;
}

/* One JSON value at t[i..len): the value (new reference) and the offset after it, NULL if none. */
static json_t *json_at(const char *t, size_t len, size_t i, size_t *end) {
    json_error_t e;
    json_t *v = json_loadb(t + i, len - i, JSON_DISABLE_EOF_CHECK | JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &e);
    if (!v) return NULL;
    *end = i + (size_t)e.position;
    if (*end > len) *end = len;
    return v;
}

/* Adds the calls in v (one object, or an array of them when arrays is set): all or nothing. */
static int take_calls(pstate *ps, json_t *v, int arrays) {
    json_t *one[1] = {v};
    json_t **items = one;
    size_t n = 1;
    if (json_is_array(v)) {
        if (!arrays || !json_array_size(v)) return 0;
        n = json_array_size(v);
    }
    const char **names = calloc(n, sizeof *names);
    json_t **args = calloc(n, sizeof *args);
    size_t ok = 0;
    if (names && args)
        for (; ok < n; ok++) {
            json_t *o = json_is_array(v) ? json_array_get(v, ok) : items[0];
            if (!call_parts(ps, o, &names[ok], &args[ok])) break;
        }
    int good = names && args && ok == n;
    for (size_t k = 0; k < ok; k++) {
        if (good) {
            json_t *o = json_is_array(v) ? json_array_get(v, k) : items[0];
            const char *id = json_string_value(json_object_get(o, "id"));
            add_call(ps, names[k], args[k], id && *id ? id : NULL);
        }
        json_decref(args[k]);
    }
    if (!names || !args) ps->oom = 1;
    free(names);
    free(args);
    return good;
}

/* Every "<open>JSON<close>" (close optional at the end of the text) whose JSON holds calls. */
static void scan_tagged(pstate *ps, const char *t, size_t len, const char *open, const char *close, int arrays) {
    size_t lo = strlen(open), lc = close ? strlen(close) : 0;
    for (size_t i = 0; i + lo <= len;) {
        const char *hit = memmem(t + i, len - i, open, lo);
        if (!hit) break;
        size_t a = (size_t)(hit - t), j = skip_ws(t, len, a + lo), end;
        i = a + lo;
        if (in_span(ps, a)) continue;
        json_t *v = json_at(t, len, j, &end);
        if (!v) continue;
        size_t k = skip_ws(t, len, end);
        int closed = lc && k + lc <= len && !memcmp(t + k, close, lc);
        if ((closed || k == len || !lc) && take_calls(ps, v, arrays)) {
            size_t stop = closed ? k + lc : lc ? k : end;
            add_span(ps, a, stop);
            i = stop;
        }
        json_decref(v);
    }
}

/* Llama 3.1: the text (after an optional <|python_tag|>) is one call object, or several
 * separated by ';' or whitespace. */
static void scan_llama3(pstate *ps, const char *t, size_t len) {
    size_t i = skip_ws(t, len, 0), start = i;
    static const char tag[] = "<|python_tag|>";
    if (len - i >= sizeof tag - 1 && !memcmp(t + i, tag, sizeof tag - 1)) i = skip_ws(t, len, i + sizeof tag - 1);
    size_t last = start;
    int any = 0;
    while (i < len && t[i] == '{') {
        size_t end;
        json_t *v = json_at(t, len, i, &end);
        if (!v) break;
        int ok = take_calls(ps, v, 0);
        json_decref(v);
        if (!ok) break;
        any = 1;
        last = end;
        i = skip_ws(t, len, end);
        if (i < len && t[i] == ';') i = skip_ws(t, len, i + 1);
    }
    if (any) add_span(ps, start, last);
}

static int cmp_span(const void *a, const void *b) {
    const span *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

int zs_toolcall_parse(int fmt, const char *text, size_t len, const zs_tool_def *tools, int n_tools,
                      const char *id_seed, zs_toolcall_parsed *out) {
    if (!out) return zs_err(ZS_EINVAL, "zs_toolcall_parse: NULL output");
    memset(out, 0, sizeof *out);
    if (!text && len) return zs_err(ZS_EINVAL, "zs_toolcall_parse: NULL text");
    if (!text) text = "";
    if (fmt < 0 || fmt > ZS_TOOLFMT_MISTRAL) return zs_err(ZS_EINVAL, "tool format %d is unknown", fmt);
    pstate ps = {.out = out, .tools = tools, .n_tools = tools ? n_tools : 0, .seed = id_seed};
    if (fmt == ZS_TOOLFMT_LLAMA3) scan_llama3(&ps, text, len);
    if (fmt == ZS_TOOLFMT_MISTRAL) scan_tagged(&ps, text, len, "[TOOL_CALLS]", NULL, 1);
    scan_tagged(&ps, text, len, "<tool_call>", "</tool_call>", 0); /* every format: the generic form too */
    /* calls are in the order of each scan (the format's own form first), spans by position */
    if (ps.n_spans > 1) qsort(ps.spans, (size_t)ps.n_spans, sizeof *ps.spans, cmp_span);
    sbuf b = {0};
    size_t pos = 0;
    for (int i = 0; i < ps.n_spans; i++) {
        if (ps.spans[i].start > pos) sb_addn(&b, text + pos, ps.spans[i].start - pos);
        if (ps.spans[i].end > pos) pos = ps.spans[i].end;
    }
    if (pos < len) sb_addn(&b, text + pos, len - pos);
    free(ps.spans);
    const char *c = b.p ? b.p : "";
    size_t n = b.len, s = 0;
    while (s < n && (c[s] == ' ' || c[s] == '\n' || c[s] == '\r' || c[s] == '\t')) s++;
    while (n > s && (c[n - 1] == ' ' || c[n - 1] == '\n' || c[n - 1] == '\r' || c[n - 1] == '\t')) n--;
    out->content = malloc(n - s + 1);
    if (out->content) {
        memcpy(out->content, c + s, n - s);
        out->content[n - s] = '\0';
    }
    free(b.p);
    if (ps.oom || b.oom || !out->content) {
        zs_toolcall_parsed_free(out);
        return zs_err(ZS_ENOMEM, "tool calls: out of memory");
    }
    return 0;
}

void zs_toolcall_parsed_free(zs_toolcall_parsed *p) {
    if (!p) return;
    for (int i = 0; i < p->n_calls; i++) {
        free((char *)p->calls[i].id);
        free((char *)p->calls[i].name);
        free((char *)p->calls[i].arguments);
    }
    free(p->calls);
    free(p->content);
    memset(p, 0, sizeof *p);
}
