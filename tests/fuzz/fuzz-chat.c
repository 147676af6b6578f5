/* fuzz-chat.c — libFuzzer harness for chat template selection and rendering (engine/text/chat.c)
 * and tool calls (engine/text/toolcall.c). Input layout, split at the first NUL byte:
 *     tokenizer_config.json [\0 text]
 * The first part is written as tokenizer_config.json (and the text, when given, as
 * chat_template.jinja) in a per-process directory under /dev/shm, the family is detected with
 * zs_chat_template_detect and, from the first part as a string, zs_chat_template_classify; fixed
 * conversations (system/user/assistant, assistant tool calls, tool results; the text as a user
 * message's content) are rendered in the detected family with zs_chat_render and
 * zs_toolcall_render, and the text (or the whole input) is parsed by zs_toolcall_parse in every
 * tool-call format, with and without a tool list; every parsed call's arguments must be a JSON
 * object and its name one of the tools. Built and run by `make fuzz` (tests/fuzz/run.sh). */
#define _GNU_SOURCE
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chat.h"
#include "common.h"
#include "toolcall.h"
#include "fuzz-util.h"

#define FZ_MAX_INPUT (1u << 20)

static char g_dir[64];
static volatile uint64_t sink;

static const zs_tool_def k_tools[] = {
    {"get_weather", "Current weather of a city.",
     "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"unit\":{\"enum\":[\"c\",\"f\"]}},"
     "\"required\":[\"city\"]}"},
    {"add", NULL, NULL},
};
enum { N_TOOLS = 2 };

static void cleanup(void) { fz_remove(g_dir); }

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    zs_log_set_level(ZS_LOG_ERROR);
    fz_scratch_make(g_dir, sizeof g_dir, "chat");
    atexit(cleanup);
    return 0;
}


static void check_family(int t) {
    if (t < 0 || t >= ZS_CHAT_NFAMILIES) __builtin_trap();
}

/* zs_chat_render of a few conversations, the text as a user message's content. */
static void render_plain(int t, const char *text) {
    const zs_chat_msg convs[][5] = {
        {{"system", "You are terse."}, {"user", text}, {"assistant", " Hi! "}, {"user", "Again?"}},
        {{"user", text}},
        {{"developer", text}, {"user", "\xe3\x80\x80 spaced \xc2\xa0"}},
        {{"user", "a"}, {"user", text}},                /* not alternating */
        {{"system", text}},                             /* system with nothing after it */
        {{"user", "a"}, {"tool", text}},                /* a role chat.c refuses */
    };
    const int lens[] = {4, 1, 2, 2, 1, 2};
    for (size_t c = 0; c < sizeof lens / sizeof lens[0]; c++) {
        for (int gen = 0; gen < 2; gen++) {
            char *out = NULL;
            int rc = zs_chat_render(t, convs[c], lens[c], gen, NULL, NULL, &out);
            if (rc == 0) {
                if (!out) __builtin_trap();
                sink += strlen(out);
            } else if (out || zs_errmsg()[0] == 0) {
                __builtin_trap();
            }
            free(out);
        }
    }
    char *out = NULL;
    if (zs_chat_render(t, convs[0], 4, 1, "<BOS>", "<EOS>", &out) == 0) sink += strlen(out);
    free(out);
    for (const char *const *s = zs_chat_stop_strings(t); *s; s++) sink += strlen(*s);
}

/* zs_toolcall_render: definitions, an assistant's calls and the tool results. */
static void render_tools(int t, const char *text) {
    const zs_tool_call calls[] = {
        {"call_abc123XYZ", "get_weather", "{\"city\": \"Paris\", \"unit\": \"c\"}"},
        {"call_2", "add", "{}"},
    };
    const zs_tool_call bad_args[] = {{"call_3", "add", text}}; /* the text as arguments */
    const zs_tool_msg msgs[] = {
        {"system", "Be brief.", NULL, 0, NULL, NULL},
        {"user", text, NULL, 0, NULL, NULL},
        {"assistant", NULL, calls, 2, NULL, NULL},
        {"tool", "{\"temp\": 21}", NULL, 0, "call_abc123XYZ", "get_weather"},
        {"tool", text, NULL, 0, "call_2", NULL},
        {"assistant", "It is 21.", NULL, 0, NULL, NULL},
        {"user", "Thanks", NULL, 0, NULL, NULL},
    };
    const zs_tool_msg one_call[] = {
        {"user", "hi", NULL, 0, NULL, NULL},
        {"assistant", "ok", bad_args, 1, NULL, NULL},
        {"tool", "r", NULL, 0, "call_3", "add"},
    };
    int fmts[2] = {zs_toolcall_format(t), ZS_TOOLFMT_GENERIC};
    sink += strlen(zs_toolcall_format_name(fmts[0]));
    for (int f = 0; f < 2; f++) {
        for (int nt = 0; nt <= N_TOOLS; nt += N_TOOLS) {
            char *out = NULL;
            int rc = zs_toolcall_render(t, fmts[f], msgs, 7, k_tools, nt, 1, NULL, NULL, &out);
            if (rc == 0) sink += strlen(out);
            else if (out || zs_errmsg()[0] == 0) __builtin_trap();
            free(out);
            out = NULL;
            rc = zs_toolcall_render(t, fmts[f], one_call, 3, k_tools, nt, 0, "<s>", "</s>", &out);
            if (rc == 0) sink += strlen(out);
            else if (out || zs_errmsg()[0] == 0) __builtin_trap();
            free(out);
        }
    }
}

static void parse_calls(const char *text, size_t len) {
    for (int fmt = ZS_TOOLFMT_GENERIC; fmt <= ZS_TOOLFMT_MISTRAL; fmt++) {
        for (int nt = 0; nt <= N_TOOLS; nt += N_TOOLS) {
            zs_toolcall_parsed p;
            memset(&p, 0, sizeof p);
            int rc = zs_toolcall_parse(fmt, text, len, k_tools, nt, nt ? "seed" : NULL, &p);
            if (rc < 0) {
                if (zs_errmsg()[0] == 0) __builtin_trap();
                zs_toolcall_parsed_free(&p);
                continue;
            }
            if (!p.content || p.n_calls < 0 || (p.n_calls && !p.calls)) __builtin_trap();
            sink += strlen(p.content);
            for (int i = 0; i < p.n_calls; i++) {
                const zs_tool_call *c = &p.calls[i];
                if (!c->id || !c->name || !c->arguments) __builtin_trap();
                if (nt) {
                    int known = 0;
                    for (int k = 0; k < nt; k++) known |= !strcmp(c->name, k_tools[k].name);
                    if (!known) __builtin_trap();
                }
                json_t *a = json_loads(c->arguments, 0, NULL);
                if (!json_is_object(a)) __builtin_trap();
                json_decref(a);
                sink += strlen(c->id);
            }
            zs_toolcall_parsed_free(&p);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > FZ_MAX_INPUT) return 0;
    const uint8_t *nul = memchr(data, 0, size);
    size_t cfg_n = nul ? (size_t)(nul - data) : size;
    char *cfg = malloc(cfg_n + 1);
    memcpy(cfg, data, cfg_n);
    cfg[cfg_n] = 0;
    size_t text_n = nul ? size - cfg_n - 1 : 0;
    char *text = malloc(text_n + 1);
    if (text_n) memcpy(text, nul + 1, text_n);
    text[text_n] = 0;

    fz_write(g_dir, "tokenizer_config.json", cfg, cfg_n);
    fz_write(g_dir, "chat_template.jinja", nul ? text : NULL, text_n);
    int t = zs_chat_template_detect(g_dir);
    check_family(t);
    int c = zs_chat_template_classify(cfg);
    check_family(c);
    sink += zs_chat_has_bos(t) + strlen(zs_chat_template_name(t));

    size_t sl = strlen(text);
    const char *st = zs_chat_strip(text, &sl);
    if (st < text || st + sl > text + strlen(text)) __builtin_trap();

    render_plain(t, text);
    if (c != t) render_plain(c, text);
    render_tools(t, text);
    if (nul) parse_calls(text, text_n);
    else parse_calls((const char *)data, size);
    free(cfg);
    free(text);
    return 0;
}
