/* test-toolcall.c — tests of tool calls (engine/text/toolcall.c): renderings with tools byte for
 * byte against the published templates (Qwen2.5's hermes, Llama 3.1's, Mistral-Nemo's v3 format)
 * as transformers renders them (tests/ref/toolcall-ref.json, made by
 * tests/ref/make_toolcall_ref.py), the generic format's exact text, the call constraint (it
 * compiles with jsonschema.c, takes a valid call's bytes and refuses an invalid one, names the
 * tool whose parameters it cannot take), parsing calls out of text (several calls, every
 * truncation of valid outputs, garbage), bad input naming the field, and the mistral family. */
#include "toolcall.h"

#include "chat.h"
#include "common.h"
#include "jsonschema.h"
#include "testutil.h"

#define N(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* ---------------------------------------------------------------- reference */

static int fmt_of(const char *name) {
    for (int f = 0; f <= ZS_TOOLFMT_MISTRAL; f++)
        if (name && !strcmp(name, zs_toolcall_format_name(f))) return f;
    return -1;
}

typedef struct {
    zs_tool_def defs[8];
    char *params[8];
    int n;
} tools_t;

static void load_tools(json_t *arr, tools_t *t) {
    memset(t, 0, sizeof *t);
    for (size_t i = 0; i < json_array_size(arr) && i < 8; i++) {
        json_t *f = json_object_get(json_array_get(arr, i), "function");
        t->defs[i].name = json_string_value(json_object_get(f, "name"));
        t->defs[i].description = json_string_value(json_object_get(f, "description"));
        json_t *p = json_object_get(f, "parameters");
        t->params[i] = p ? json_dumps(p, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        t->defs[i].parameters = t->params[i];
        t->n++;
    }
}

static void free_tools(tools_t *t) {
    for (int i = 0; i < t->n; i++) free(t->params[i]);
}

typedef struct {
    zs_tool_msg m[16];
    zs_tool_call calls[16][4];
    int n;
} msgs_t;

static void load_msgs(json_t *arr, msgs_t *ms) {
    memset(ms, 0, sizeof *ms);
    for (size_t i = 0; i < json_array_size(arr) && i < 16; i++) {
        json_t *j = json_array_get(arr, i);
        zs_tool_msg *m = &ms->m[i];
        m->role = json_string_value(json_object_get(j, "role"));
        m->content = json_string_value(json_object_get(j, "content"));
        m->tool_call_id = json_string_value(json_object_get(j, "tool_call_id"));
        m->name = json_string_value(json_object_get(j, "name"));
        json_t *tc = json_object_get(j, "tool_calls");
        for (size_t k = 0; k < json_array_size(tc) && k < 4; k++) {
            json_t *c = json_array_get(tc, k);
            ms->calls[i][k].id = json_string_value(json_object_get(c, "id"));
            ms->calls[i][k].name = json_string_value(json_object_get(json_object_get(c, "function"), "name"));
            ms->calls[i][k].arguments =
                json_string_value(json_object_get(json_object_get(c, "function"), "arguments"));
            m->n_tool_calls++;
        }
        if (m->n_tool_calls) m->tool_calls = ms->calls[i];
        ms->n++;
    }
}

static void test_reference(void) {
    json_error_t je;
    json_t *j = json_load_file("tests/ref/toolcall-ref.json", 0, &je);
    CHECK(j != NULL, "cannot load tests/ref/toolcall-ref.json: %s", je.text);
    if (!j) return;
    tools_t tools;
    load_tools(json_object_get(j, "tools"), &tools);
    size_t i;
    json_t *c;
    int ncase = 0, nerr = 0, nnotools = 0, nfmt[4] = {0};
    json_array_foreach(json_object_get(j, "cases"), i, c) {
        const char *tname = json_string_value(json_object_get(c, "template"));
        const char *conv = json_string_value(json_object_get(c, "conversation"));
        int tmpl = -2, fmt = fmt_of(json_string_value(json_object_get(c, "format")));
        CHECK(zs_chat_template_parse(json_string_value(json_object_get(c, "family")), &tmpl) == 0 && tmpl >= 0,
              "case %zu: family", i);
        CHECK(fmt >= 0 && zs_toolcall_format(tmpl) == fmt, "case %zu: format", i);
        if (tmpl < 0 || fmt < 0) continue;
        msgs_t ms;
        load_msgs(json_object_get(c, "messages"), &ms);
        int with_tools = json_is_true(json_object_get(c, "tools"));
        int gen = json_is_true(json_object_get(c, "gen"));
        const char *bos = json_string_value(json_object_get(c, "bos"));
        const char *eos = json_string_value(json_object_get(c, "eos"));
        const char *want = json_string_value(json_object_get(c, "text"));
        char *out = NULL;
        int rc = zs_toolcall_render(tmpl, fmt, ms.m, ms.n, tools.defs, with_tools ? tools.n : 0, gen, bos, eos, &out);
        if (json_is_true(json_object_get(c, "no_tools"))) {
            zs_chat_msg cm[16];
            for (int k = 0; k < ms.n; k++) cm[k] = (zs_chat_msg){ms.m[k].role, ms.m[k].content};
            char *chat = NULL;
            CHECK(zs_chat_render(tmpl, cm, ms.n, gen, bos, eos, &chat) == 0, "case %zu: chat render", i);
            CHECK(rc == 0 && chat && !strcmp(out, chat), "case %zu (%s %s): without tools\n got  [%s]\n want [%s]", i,
                  tname, conv, out ? out : zs_errmsg(), chat ? chat : "");
            free(chat);
            nnotools++;
        }
        if (want) {
            CHECK(rc == 0, "case %zu (%s %s): render failed: %s", i, tname, conv, zs_errmsg());
            if (rc == 0) CHECK(!strcmp(out, want), "case %zu (%s %s):\n got  [%s]\n want [%s]", i, tname, conv, out, want);
            nfmt[fmt]++;
        } else if (json_object_get(c, "error")) {
            CHECK_ERR(rc, "messages[2].tool_calls", "one call");
            nerr++;
        }
        free(out);
        ncase++;
    }
    CHECK(ncase >= 30 && nerr >= 1 && nnotools >= 6 && nfmt[1] >= 8 && nfmt[2] >= 7 && nfmt[3] >= 9,
          "reference: %d cases, %d errors, %d without tools, %d/%d/%d per format", ncase, nerr, nnotools, nfmt[1],
          nfmt[2], nfmt[3]);
    free_tools(&tools);
    json_decref(j);
}

/* ---------------------------------------------------------------- generic */

static const zs_tool_def k_tools[] = {
    {"get_weather", "Weather now",
     "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"}},"
     "\"required\":[\"city\"]}"},
    {"ping", NULL, NULL},
};

static void expect_render(int tmpl, int fmt, const zs_tool_msg *m, int n, const zs_tool_def *t, int nt, int gen,
                          const char *want, const char *what) {
    char *out = NULL;
    int rc = zs_toolcall_render(tmpl, fmt, m, n, t, nt, gen, NULL, NULL, &out);
    CHECK(rc == 0, "%s: render failed: %s", what, zs_errmsg());
    if (rc == 0) CHECK(!strcmp(out, want), "%s:\n got  [%s]\n want [%s]", what, out, want);
    free(out);
}

#define GEN_TOOLS                                                                                                \
    "# Tools\n\nYou may call one or more functions to assist with the user query. The functions, as JSON:\n"    \
    "<tools>\n"                                                                                                  \
    "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather now\", "      \
    "\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"days\": "       \
    "{\"type\": \"integer\"}}, \"required\": [\"city\"]}}}\n"                                                    \
    "{\"type\": \"function\", \"function\": {\"name\": \"ping\"}}\n</tools>\n\n"                                 \
    "To call a function, answer with one line per call:\n"                                                       \
    "<tool_call>{\"name\": <function-name>, \"arguments\": <args-json-object>}</tool_call>"

static void test_generic(void) {
    zs_tool_call calls[] = {{"call_1", "get_weather", "{\"city\":\"Oslo\",\"days\":2.50}"}, {"call_2", "ping", NULL}};
    zs_tool_msg conv[] = {
        {"user", "Weather?", NULL, 0, NULL, NULL},
        {"assistant", "Checking.", calls, 2, NULL, NULL},
        {"tool", "sunny", NULL, 0, "call_1", "get_weather"},
        {"tool", "pong", NULL, 0, "call_2", "ping"},
    };
    expect_render(ZS_CHAT_PLAIN, ZS_TOOLFMT_GENERIC, conv, N(conv), k_tools, N(k_tools), 1,
                  "System: " GEN_TOOLS "\nUser: Weather?\nAssistant: Checking.\n"
                  "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"days\": 2.5}}</tool_call>\n"
                  "<tool_call>{\"name\": \"ping\", \"arguments\": {}}</tool_call>\n"
                  "User: <tool_response>sunny</tool_response>\n<tool_response>pong</tool_response>\nAssistant:",
                  "generic, plain: tools prepended, calls and results as text");
    zs_tool_msg sys[] = {{"system", "Be brief.", NULL, 0, NULL, NULL}, {"user", " Hi ", NULL, 0, NULL, NULL}};
    expect_render(ZS_CHAT_GEMMA, ZS_TOOLFMT_GENERIC, sys, 2, k_tools, N(k_tools), 1,
                  "<bos><start_of_turn>user\nBe brief.\n\n" GEN_TOOLS "\n\nHi<end_of_turn>\n<start_of_turn>model\n",
                  "generic, gemma: tools merged into the system message");
    /* llama-2 needs alternating roles: the two results are one user turn */
    expect_render(ZS_CHAT_LLAMA2, ZS_TOOLFMT_GENERIC, conv, N(conv), NULL, 0, 1,
                  "<s>[INST] Weather? [/INST] Checking.\n"
                  "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"days\": 2.5}}</tool_call>\n"
                  "<tool_call>{\"name\": \"ping\", \"arguments\": {}}</tool_call> </s>"
                  "<s>[INST] <tool_response>sunny</tool_response>\n<tool_response>pong</tool_response> [/INST]",
                  "generic, llama-2 without tool definitions");
    /* no tools, no tool parts: chat.c's text for every family */
    zs_tool_msg plain[] = {{"system", "S", NULL, 0, NULL, NULL}, {"user", "U", NULL, 0, NULL, NULL}};
    zs_chat_msg cm[] = {{"system", "S"}, {"user", "U"}};
    for (int t = 0; t < ZS_CHAT_NFAMILIES; t++) {
        char *a = NULL, *b = NULL;
        CHECK(zs_toolcall_render(t, zs_toolcall_format(t), plain, 2, NULL, 0, 1, NULL, NULL, &a) == 0, "render %d", t);
        CHECK(zs_chat_render(t, cm, 2, 1, NULL, NULL, &b) == 0, "chat %d", t);
        CHECK(a && b && !strcmp(a, b), "%s: without tools [%s] vs [%s]", zs_chat_template_name(t), a ? a : "",
              b ? b : "");
        free(a);
        free(b);
    }
    /* hermes without tool definitions keeps the tool parts in its own layout */
    zs_tool_call one[] = {{"x", "ping", "{}"}};
    zs_tool_msg h[] = {{"user", "u", NULL, 0, NULL, NULL}, {"assistant", NULL, one, 1, NULL, NULL},
                       {"tool", "pong", NULL, 0, "x", NULL}};
    expect_render(ZS_CHAT_CHATML, ZS_TOOLFMT_HERMES, h, 3, NULL, 0, 1,
                  "<|im_start|>user\nu<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{\"name\": \"ping\", "
                  "\"arguments\": {}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\npong\n"
                  "</tool_response><|im_end|>\n<|im_start|>assistant\n",
                  "hermes without tool definitions");
    /* mistral: ids that are not 9 letters/digits map to 9 such, the same for call and result */
    zs_tool_call mc[] = {{"call_0_abc", "ping", "{}"}};
    zs_tool_msg mm[] = {{"user", "u", NULL, 0, NULL, NULL}, {"assistant", NULL, mc, 1, NULL, NULL},
                        {"tool", "1", NULL, 0, "call_0_abc", NULL}};
    char *out = NULL;
    CHECK(zs_toolcall_render(ZS_CHAT_MISTRAL, ZS_TOOLFMT_MISTRAL, mm, 3, NULL, 0, 1, NULL, NULL, &out) == 0, "mistral");
    const char *a = out ? strstr(out, "\"id\": \"") : NULL, *b = out ? strstr(out, "\"call_id\": \"") : NULL;
    CHECK(a && b && !strncmp(a + 7, b + 12, 9) && a[16] == '"' && b[21] == '"', "mistral ids: %s", out ? out : "");
    free(out);
}

/* Python's float repr and string escapes, as the templates' tojson writes them. */
static void test_json_style(void) {
    struct {
        const char *in, *want;
    } cases[] = {
        {"{\"a\":1.0}", "{\"a\": 1.0}"},
        {"{\"a\":0.1}", "{\"a\": 0.1}"},
        {"{\"a\":1e16}", "{\"a\": 1e+16}"},
        {"{\"a\":123456789012345.6}", "{\"a\": 123456789012345.6}"},
        {"{\"a\":0.0001}", "{\"a\": 0.0001}"},
        {"{\"a\":0.00001}", "{\"a\": 1e-05}"},
        {"{\"a\":-2.5e-300}", "{\"a\": -2.5e-300}"},
        {"{\"a\":-0.0}", "{\"a\": -0.0}"},
        {"{\"a\":[],\"b\":{},\"c\":[1,true,null]}", "{\"a\": [], \"b\": {}, \"c\": [1, true, null]}"},
        {"{\"s\":\"\\u00e9\\n\\t\\\"\\\\/\\u0001\\u007f\"}", "{\"s\": \"\xc3\xa9\\n\\t\\\"\\\\/\\u0001\x7f\"}"},
    };
    for (int i = 0; i < N(cases); i++) {
        zs_tool_call c[] = {{"x", "ping", cases[i].in}};
        zs_tool_msg m[] = {{"user", "u", NULL, 0, NULL, NULL}, {"assistant", NULL, c, 1, NULL, NULL}};
        char *out = NULL;
        CHECK(zs_toolcall_render(ZS_CHAT_CHATML, ZS_TOOLFMT_HERMES, m, 2, NULL, 0, 0, NULL, NULL, &out) == 0, "%d", i);
        char want[256];
        snprintf(want, sizeof want, "\"arguments\": %s}\n</tool_call>", cases[i].want);
        CHECK(out && strstr(out, want), "json style %d: [%s] lacks [%s]", i, out ? out : "", want);
        free(out);
    }
}

/* ---------------------------------------------------------------- constraint */

static int accepts(const char *schema, const char *bytes) {
    zs_jschema *g = NULL;
    if (zs_jschema_compile(schema, &g) < 0) return -1;
    zs_jschema_state st;
    zs_jschema_state_init(g, &st);
    int ok = zs_jschema_feed(g, &st, bytes, strlen(bytes)) && zs_jschema_done(g, &st);
    zs_jschema_free(g);
    return ok;
}

static void test_constraint(void) {
    zs_toolcall_constraint c;
    int rc = zs_toolcall_constraint_make(ZS_TOOLFMT_HERMES, k_tools, 1, NULL, &c);
    CHECK(rc == 0, "hermes, one tool: %s", zs_errmsg());
    if (rc == 0) {
        CHECK(!strcmp(c.prefix, "<tool_call>\n") && !strcmp(c.suffix, "\n</tool_call>") &&
                  !strcmp(c.trigger, "<tool_call>"), "hermes opener/closer [%s] [%s] [%s]", c.prefix, c.suffix,
              c.trigger);
        CHECK(accepts(c.schema_json, "{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\",\"days\":3}}") == 1,
              "valid call accepted by %s", c.schema_json);
        CHECK(accepts(c.schema_json, "{\"name\":\"get_weather\",\"arguments\":{\"days\":3}}") == 0,
              "required city");
        CHECK(accepts(c.schema_json, "{\"name\":\"get_weather\",\"arguments\":{\"city\":\"P\",\"x\":1}}") == 0,
              "additionalProperties false added");
        CHECK(accepts(c.schema_json, "{\"name\":\"ping\",\"arguments\":{}}") == 0, "other name");
        CHECK(accepts(c.schema_json, "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}") == 1 &&
                  accepts(c.schema_json, "{\"name\":  \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}") == 0 &&
                  accepts(c.schema_json, "{\"arguments\":{\"city\":\"Paris\"},\"name\":\"get_weather\"}") == 0,
              "the call's whitespace bounded, its keys in the schema's order (jsonschema.h)");
        zs_toolcall_constraint_free(&c);
    }
    /* several tools: name enum and arguments anyOf; llama3 writes "parameters" */
    rc = zs_toolcall_constraint_make(ZS_TOOLFMT_LLAMA3, k_tools, 2, NULL, &c);
    CHECK(rc == 0, "llama3, two tools: %s", zs_errmsg());
    if (rc == 0) {
        CHECK(!*c.prefix && !*c.suffix && !strcmp(c.trigger, "{"), "llama3 has no opener");
        CHECK(accepts(c.schema_json, "{\"name\":\"ping\",\"parameters\":{}}") == 1, "ping: %s", c.schema_json);
        CHECK(accepts(c.schema_json, "{\"name\":\"get_weather\",\"parameters\":{\"city\":\"x\"}}") == 1, "weather");
        CHECK(accepts(c.schema_json, "{\"name\":\"ping\",\"arguments\":{}}") == 0, "llama3 key");
        CHECK(accepts(c.schema_json, "{\"name\":\"pong\",\"parameters\":{}}") == 0, "unknown name");
        zs_toolcall_constraint_free(&c);
    }
    rc = zs_toolcall_constraint_make(ZS_TOOLFMT_MISTRAL, k_tools, 2, "ping", &c);
    CHECK(rc == 0, "mistral, named: %s", zs_errmsg());
    if (rc == 0) {
        CHECK(!strcmp(c.prefix, "[TOOL_CALLS][") && !strcmp(c.suffix, "]") && !strcmp(c.trigger, "[TOOL_CALLS]"),
              "mistral opener");
        CHECK(accepts(c.schema_json, "{\"name\":\"ping\",\"arguments\":{}}") == 1, "ping");
        CHECK(accepts(c.schema_json, "{\"name\":\"get_weather\",\"arguments\":{\"city\":\"x\"}}") == 0,
              "only the named tool");
        zs_toolcall_constraint_free(&c);
    }
    rc = zs_toolcall_constraint_make(ZS_TOOLFMT_GENERIC, k_tools, 2, NULL, &c);
    CHECK(rc == 0 && !strcmp(c.prefix, "<tool_call>") && !strcmp(c.suffix, "</tool_call>"), "generic opener");
    zs_toolcall_constraint_free(&c);
    /* nested objects, items, anyOf and $defs get additionalProperties false; refs still resolve */
    zs_tool_def nested[] = {{"f", NULL,
                             "{\"type\":\"object\",\"properties\":{\"o\":{\"type\":\"object\",\"properties\":{\"a\":"
                             "{\"type\":\"string\"}}},\"l\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/item\"}},"
                             "\"u\":{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"b\":{\"type\":\"integer\"}}},"
                             "{\"type\":\"null\"}]},\"r\":{\"$ref\":\"#\"}},\"$defs\":{\"item\":{\"type\":\"object\","
                             "\"properties\":{\"k\":{\"type\":\"boolean\"}},\"required\":[\"k\"]}}}"}};
    rc = zs_toolcall_constraint_make(ZS_TOOLFMT_HERMES, nested, 1, NULL, &c);
    CHECK(rc == 0, "nested: %s", zs_errmsg());
    if (rc == 0) {
        const char *ok = "{\"name\":\"f\",\"arguments\":{\"o\":{\"a\":\"x\"},\"l\":[{\"k\":true}],\"u\":{\"b\":1},"
                         "\"r\":{\"u\":null}}}";
        CHECK(accepts(c.schema_json, ok) == 1, "nested valid call: %s", c.schema_json);
        CHECK(accepts(c.schema_json, "{\"name\":\"f\",\"arguments\":{\"o\":{\"z\":1}}}") == 0, "nested extra key");
        CHECK(accepts(c.schema_json, "{\"name\":\"f\",\"arguments\":{\"l\":[{\"k\":true,\"z\":1}]}}") == 0,
              "$defs extra key");
        CHECK(accepts(c.schema_json, "{\"name\":\"f\",\"arguments\":{\"u\":{\"b\":1,\"z\":1}}}") == 0,
              "anyOf extra key");
        CHECK(accepts(c.schema_json, "{\"name\":\"f\",\"arguments\":{\"l\":[{}]}}") == 0, "$defs required kept");
        CHECK(accepts(c.schema_json, "{\"name\":\"f\",\"arguments\":{\"r\":{\"r\":{\"o\":{}}}}}") == 1, "$ref #");
        zs_toolcall_constraint_free(&c);
    }
    /* what the grammar cannot take is refused, naming the tool's parameters and the keyword */
    zs_tool_def bad[] = {k_tools[0],
                         {"g", NULL, "{\"type\":\"object\",\"properties\":{\"s\":{\"type\":\"string\",\"pattern\":\"a+\"}}}"}};
    CHECK_ERR(zs_toolcall_constraint_make(ZS_TOOLFMT_HERMES, bad, 2, NULL, &c), "tools[1].function.parameters",
              "'pattern'", "/properties/s");
    CHECK(c.schema_json == NULL, "nothing on failure");
    zs_tool_def notjson[] = {{"g", NULL, "{\"type\":"}};
    CHECK_ERR(zs_toolcall_constraint_make(ZS_TOOLFMT_HERMES, notjson, 1, NULL, &c), "tools[0].function.parameters",
              "JSON");
    zs_tool_def badname[] = {{"a b", NULL, NULL}};
    CHECK_ERR(zs_toolcall_constraint_make(ZS_TOOLFMT_HERMES, badname, 1, NULL, &c), "tools[0].function.name");
    zs_tool_def dup[] = {{"a", NULL, NULL}, {"a", NULL, NULL}};
    CHECK_ERR(zs_toolcall_constraint_make(ZS_TOOLFMT_HERMES, dup, 2, NULL, &c), "tools[1].function.name", "'a'");
    CHECK_ERR(zs_toolcall_constraint_make(ZS_TOOLFMT_HERMES, k_tools, 2, "nope", &c), "tool_choice", "'nope'");
    CHECK_ERR(zs_toolcall_constraint_make(ZS_TOOLFMT_HERMES, k_tools, 0, NULL, &c), "tools");
    /* many tools with different parameters: every one stays reachable */
    zs_tool_def many[20];
    char names[20][16], params[20][160];
    for (int i = 0; i < 20; i++) {
        snprintf(names[i], sizeof names[i], "t%d", i);
        snprintf(params[i], sizeof params[i],
                 "{\"type\":\"object\",\"properties\":{\"p%d\":{\"type\":\"integer\"}},\"required\":[\"p%d\"]}", i, i);
        many[i] = (zs_tool_def){names[i], NULL, params[i]};
    }
    rc = zs_toolcall_constraint_make(ZS_TOOLFMT_HERMES, many, 20, NULL, &c);
    CHECK(rc == 0, "20 tools: %s", zs_errmsg());
    if (rc == 0) {
        int reach = 0;
        for (int i = 0; i < 20; i++) {
            char call[128];
            snprintf(call, sizeof call, "{\"name\":\"t%d\",\"arguments\":{\"p%d\":7}}", i, i);
            reach += accepts(c.schema_json, call) == 1;
        }
        CHECK(reach == 20, "20 tools: %d reachable", reach);
        zs_toolcall_constraint_free(&c);
    }
}

/* ---------------------------------------------------------------- parsing */

static void expect_parse(int fmt, const char *text, int n, const char *name0, const char *args0, const char *content,
                         const char *what) {
    zs_toolcall_parsed p;
    int rc = zs_toolcall_parse(fmt, text, strlen(text), k_tools, N(k_tools), "s1", &p);
    CHECK(rc == 0, "%s: %s", what, zs_errmsg());
    if (rc) return;
    CHECK(p.n_calls == n, "%s: %d calls, want %d (content [%s])", what, p.n_calls, n, p.content);
    if (n && p.n_calls) {
        CHECK(!strcmp(p.calls[0].name, name0), "%s: name %s", what, p.calls[0].name);
        CHECK(!strcmp(p.calls[0].arguments, args0), "%s: arguments %s, want %s", what, p.calls[0].arguments, args0);
        CHECK(p.calls[0].id && !strncmp(p.calls[0].id, "call_0", 6), "%s: id %s", what, p.calls[0].id);
    }
    CHECK(!strcmp(p.content, content), "%s: content [%s], want [%s]", what, p.content, content);
    zs_toolcall_parsed_free(&p);
}

static const char *k_outputs[][2] = {
    {"hermes", "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Z\xc3\xbcrich\", \"days\": 2}}\n</tool_call>"
               "\n<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>"},
    {"llama3", "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Z\xc3\xbcrich\", \"days\": 2}}"},
    {"mistral", "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Z\xc3\xbcrich\", \"days\": 2}}, "
                "{\"name\": \"ping\", \"arguments\": {}}]"},
    {"generic", "Sure.\n<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Z\xc3\xbcrich\", \"days\": 2}}</tool_call>"},
};

static void test_parse(void) {
    const char *args = "{\"city\":\"Z\xc3\xbcrich\",\"days\":2}";
    expect_parse(ZS_TOOLFMT_HERMES, k_outputs[0][1], 2, "get_weather", args, "", "hermes two calls");
    expect_parse(ZS_TOOLFMT_LLAMA3, k_outputs[1][1], 1, "get_weather", args, "", "llama3");
    expect_parse(ZS_TOOLFMT_MISTRAL, k_outputs[2][1], 2, "get_weather", args, "", "mistral two calls");
    expect_parse(ZS_TOOLFMT_GENERIC, k_outputs[3][1], 1, "get_weather", args, "Sure.", "generic with content");
    expect_parse(ZS_TOOLFMT_LLAMA3, "<|python_tag|>{\"name\": \"ping\", \"parameters\": {}}; {\"name\": \"ping\"}", 2,
                 "ping", "{}", "", "llama3 python tag, two calls");
    expect_parse(ZS_TOOLFMT_HERMES, "<tool_call>{\"name\": \"ping\", \"arguments\": \"{\\\"a\\\": 1}\"}", 1, "ping",
                 "{\"a\":1}", "", "arguments as a JSON string, unterminated but complete");
    expect_parse(ZS_TOOLFMT_HERMES, "Hello <tool_call>{\"name\": \"nope\", \"arguments\": {}}</tool_call>", 0, "", "",
                 "Hello <tool_call>{\"name\": \"nope\", \"arguments\": {}}</tool_call>", "unknown tool stays text");
    expect_parse(ZS_TOOLFMT_LLAMA3, "The answer is {\"name\": \"ping\"}", 0, "", "", "The answer is {\"name\": \"ping\"}",
                 "llama3 only at the start");
    expect_parse(ZS_TOOLFMT_MISTRAL, " just text \n", 0, "", "", "just text", "no calls");
    expect_parse(ZS_TOOLFMT_HERMES, "<tool_call>\n{\"name\": \"ping\", \"arguments\": {}} trailing", 0, "", "",
                 "<tool_call>\n{\"name\": \"ping\", \"arguments\": {}} trailing", "unclosed call with text after");
    /* ids: given ids kept (mistral), seeds */
    zs_toolcall_parsed p;
    const char *withid = "[TOOL_CALLS][{\"name\": \"ping\", \"arguments\": {}, \"id\": \"abc123XYZ\"}]";
    CHECK(zs_toolcall_parse(ZS_TOOLFMT_MISTRAL, withid, strlen(withid), k_tools, 2, "q", &p) == 0 && p.n_calls == 1 &&
              !strcmp(p.calls[0].id, "abc123XYZ"), "mistral id kept");
    zs_toolcall_parsed_free(&p);
    CHECK(zs_toolcall_parse(ZS_TOOLFMT_HERMES, k_outputs[0][1], strlen(k_outputs[0][1]), k_tools, 2, "q", &p) == 0 &&
              p.n_calls == 2 && !strcmp(p.calls[0].id, "call_0_q") && !strcmp(p.calls[1].id, "call_1_q"), "seeded ids");
    zs_toolcall_parsed_free(&p);
    /* every truncation of every output, and byte garbage: no crash, complete calls only */
    for (int o = 0; o < N(k_outputs); o++) {
        int fmt = fmt_of(k_outputs[o][0]);
        size_t len = strlen(k_outputs[o][1]);
        for (size_t cut = 0; cut <= len; cut++) {
            CHECK(zs_toolcall_parse(fmt, k_outputs[o][1], cut, k_tools, 2, NULL, &p) == 0, "truncation %zu", cut);
            for (int k = 0; k < p.n_calls; k++) {
                json_t *a = json_loads(p.calls[k].arguments, 0, NULL);
                CHECK(json_is_object(a), "%s cut %zu: arguments %s", k_outputs[o][0], cut, p.calls[k].arguments);
                json_decref(a);
            }
            if (cut < len / 2) CHECK(p.n_calls == 0 || fmt == ZS_TOOLFMT_HERMES, "%s cut %zu: %d calls", k_outputs[o][0],
                                     cut, p.n_calls);
            zs_toolcall_parsed_free(&p);
        }
    }
    unsigned seed = 12345;
    char junk[256];
    const char *pieces[] = {"<tool_call>", "</tool_call>", "[TOOL_CALLS]", "{", "}", "[", "]", "\"", "name", ":",
                            "\"ping\"", ",", "\\", "\xff", "\n", "arguments", "{}"};
    for (int it = 0; it < 2000; it++) {
        size_t n = 0;
        while (n < sizeof junk - 16) {
            seed = seed * 1103515245u + 12345u;
            if ((seed >> 16) % 12 == 0) break;
            const char *pc = pieces[(seed >> 8) % N(pieces)];
            memcpy(junk + n, pc, strlen(pc));
            n += strlen(pc);
        }
        int fmt = (int)(seed >> 3) % 4;
        CHECK(zs_toolcall_parse(fmt, junk, n, k_tools, 2, "z", &p) == 0, "junk %d", it);
        zs_toolcall_parsed_free(&p);
    }
    CHECK(zs_toolcall_parse(ZS_TOOLFMT_HERMES, NULL, 0, k_tools, 2, NULL, &p) == 0 && p.n_calls == 0 && !*p.content,
          "empty text");
    zs_toolcall_parsed_free(&p);
}

/* ---------------------------------------------------------------- errors and the mistral family */

static void test_errors(void) {
    char *out = NULL;
    zs_tool_call badargs[] = {{"x", "ping", "[1]"}};
    zs_tool_msg m1[] = {{"user", "u", NULL, 0, NULL, NULL}, {"assistant", NULL, badargs, 1, NULL, NULL}};
    CHECK_ERR(zs_toolcall_render(ZS_CHAT_CHATML, ZS_TOOLFMT_HERMES, m1, 2, NULL, 0, 1, NULL, NULL, &out),
              "messages[1].tool_calls[0].function.arguments");
    zs_tool_msg m2[] = {{"robot", "u", NULL, 0, NULL, NULL}};
    CHECK_ERR(zs_toolcall_render(ZS_CHAT_CHATML, ZS_TOOLFMT_HERMES, m2, 1, k_tools, 1, 1, NULL, NULL, &out),
              "messages[0].role", "robot");
    zs_tool_call ok[] = {{"x", "ping", "{}"}};
    zs_tool_msg m3[] = {{"user", "u", ok, 1, NULL, NULL}};
    CHECK_ERR(zs_toolcall_render(ZS_CHAT_CHATML, ZS_TOOLFMT_HERMES, m3, 1, NULL, 0, 1, NULL, NULL, &out),
              "messages[0].tool_calls");
    zs_tool_def badp[] = {{"f", NULL, "\"str\""}};
    zs_tool_msg u[] = {{"user", "u", NULL, 0, NULL, NULL}};
    CHECK_ERR(zs_toolcall_render(ZS_CHAT_CHATML, ZS_TOOLFMT_HERMES, u, 1, badp, 1, 1, NULL, NULL, &out),
              "tools[0].function.parameters");
    zs_tool_def badn[] = {{"", NULL, NULL}};
    CHECK_ERR(zs_toolcall_render(ZS_CHAT_CHATML, ZS_TOOLFMT_HERMES, u, 1, badn, 1, 1, NULL, NULL, &out),
              "tools[0].function.name");
    CHECK_ERR(zs_toolcall_render(ZS_CHAT_GEMMA, ZS_TOOLFMT_HERMES, u, 1, NULL, 0, 1, NULL, NULL, &out), "hermes",
              "gemma");
    zs_tool_msg sys_only[] = {{"system", "s", NULL, 0, NULL, NULL}};
    CHECK_ERR(zs_toolcall_render(ZS_CHAT_LLAMA3, ZS_TOOLFMT_LLAMA3, sys_only, 1, k_tools, 1, 1, NULL, NULL, &out),
              "messages", "user message");
    zs_tool_msg two_users[] = {{"user", "a", NULL, 0, NULL, NULL}, {"user", "b", NULL, 0, NULL, NULL}};
    CHECK_ERR(zs_toolcall_render(ZS_CHAT_MISTRAL, ZS_TOOLFMT_MISTRAL, two_users, 2, k_tools, 1, 1, NULL, NULL, &out),
              "messages[1].role", "alternat");
    CHECK(out == NULL, "out untouched on errors");

    /* the mistral family: detection, name, text */
    CHECK(zs_chat_template_classify("{{ bos_token }}[AVAILABLE_TOOLS][INST]") == ZS_CHAT_MISTRAL, "v3 markers");
    CHECK(zs_chat_template_classify("[SYSTEM_PROMPT]{{ system }}[/SYSTEM_PROMPT][INST]") == ZS_CHAT_MISTRAL, "v7");
    CHECK(zs_chat_template_classify("{{ bos_token }}[INST] {{ m }} [/INST]") == ZS_CHAT_PLAIN, "old mistral: plain");
    int t = -5;
    CHECK(zs_chat_template_parse("mistral", &t) == 0 && t == ZS_CHAT_MISTRAL, "parse mistral");
    CHECK(!strcmp(zs_chat_template_name(ZS_CHAT_MISTRAL), "mistral") && zs_chat_has_bos(ZS_CHAT_MISTRAL), "name, bos");
    CHECK(zs_toolcall_format(ZS_CHAT_MISTRAL) == ZS_TOOLFMT_MISTRAL && zs_toolcall_format(ZS_CHAT_GEMMA) == 0,
          "formats");
    zs_chat_msg cm[] = {{"system", "S"}, {"user", "a"}, {"assistant", "b"}, {"user", "c"}};
    CHECK(zs_chat_render(ZS_CHAT_MISTRAL, cm, 4, 1, NULL, NULL, &out) == 0 &&
              !strcmp(out, "<s>[INST]a[/INST]b</s>[INST]S\n\nc[/INST]"), "mistral text [%s]", out ? out : "");
    free(out);
    out = NULL;
    CHECK(zs_chat_render(ZS_CHAT_MISTRAL, cm, 3, 1, NULL, NULL, &out) == 0 && !strcmp(out, "<s>[INST]a[/INST]b</s>"),
          "mistral drops the system text when the last message is not a user's [%s]", out ? out : "");
    free(out);
}

int main(void) {
    test_reference();
    test_generic();
    test_json_style();
    test_constraint();
    test_parse();
    test_errors();
    return tu_finish("test-toolcall");
}
