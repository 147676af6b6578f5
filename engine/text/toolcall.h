/* toolcall.h — tool calls for chat models: the format a chat template writes tool definitions,
 * assistant tool calls and tool results in; the constraint that makes a model write one call
 * (a JSON-Schema grammar with the format's forced opener and closer, for sched.h's
 * zs_req_constraint); and parsing calls back out of generated text.
 *
 * Formats (chosen from the chat family, zs_toolcall_format):
 *   hermes   chatml (Qwen2.5, Qwen3): tools listed in the system message inside <tools></tools>,
 *            a call is "<tool_call>\n{"name": N, "arguments": {...}}\n</tool_call>", a tool
 *            result is a user turn "<tool_response>\n...\n</tool_response>" (as Qwen2.5's
 *            template renders them).
 *   llama3   llama-3 (Llama 3.1 / 3.2): "Environment: ipython" system header, the functions as
 *            JSON in the first user message, a call is the bare JSON
 *            {"name": N, "parameters": {...}}, a tool result is an "ipython" turn.
 *   mistral  Mistral's v3 template ([AVAILABLE_TOOLS] ... [/AVAILABLE_TOOLS] before the last
 *            user turn, a call "[TOOL_CALLS][{"name": N, "arguments": {...}}]", results in
 *            [TOOL_RESULTS] ... [/TOOL_RESULTS]).
 *   generic  every other family: a system message (documented in the README) lists the tools as
 *            JSON and asks for "<tool_call>{"name": N, "arguments": {...}}</tool_call>"; tool
 *            results are rendered as user messages "<tool_response>...</tool_response>".
 *
 * Ownership: outputs are malloc'd (free with the matching _free); inputs are borrowed.
 * Everything is pure and thread-safe. Errors: 0 or ZS_EINVAL / ZS_ENOMEM with zs_errmsg()
 * naming the field ("tools[1].function.parameters: ..."). */
#ifndef ZS_TOOLCALL_H
#define ZS_TOOLCALL_H

#include <stddef.h>

enum { ZS_TOOLFMT_GENERIC = 0, ZS_TOOLFMT_HERMES = 1, ZS_TOOLFMT_LLAMA3 = 2, ZS_TOOLFMT_MISTRAL = 3 };

typedef struct {
    const char *name;        /* [A-Za-z0-9_-]{1,64} */
    const char *description; /* NULL: none */
    const char *parameters;  /* JSON Schema of the arguments as compact JSON text; NULL: {} */
} zs_tool_def;

typedef struct {
    const char *id;          /* "call_..." (rendered only where the format has ids) */
    const char *name;
    const char *arguments;   /* JSON object text */
} zs_tool_call;

/* A chat message with its tool parts (chat.h's zs_chat_msg plus these): role "tool" with
 * tool_call_id / name, and an assistant's tool_calls (content may then be NULL). */
typedef struct {
    const char *role;
    const char *content;
    const zs_tool_call *tool_calls;
    int n_tool_calls;
    const char *tool_call_id;  /* role "tool" */
    const char *name;          /* role "tool": the function's name, when given */
} zs_tool_msg;

/* ZS_CHAT_* family -> ZS_TOOLFMT_*; "hermes" "llama3" "mistral" "generic". */
int zs_toolcall_format(int chat_tmpl);
const char *zs_toolcall_format_name(int fmt);

/* Renders messages with tool definitions (n_tools may be 0: then the text equals
 * zs_chat_render's for messages without tool parts) in chat_tmpl's family and fmt's format.
 * ZS_EINVAL naming messages[i].role / messages[i].tool_calls for what the family cannot hold. */
int zs_toolcall_render(int chat_tmpl, int fmt, const zs_tool_msg *msgs, int n, const zs_tool_def *tools,
                       int n_tools, int add_generation_prompt, const char *bos, const char *eos, char **out);

/* The constraint that makes the model write exactly one call in fmt: schema_json (for
 * zs_jschema_compile: one object with "name" fixed to a tool's name, or an anyOf over the tools,
 * and "arguments" — "parameters" for llama3 — by that tool's schema, made acceptable to the
 * grammar: an object schema without additionalProperties is read as additionalProperties
 * false, as OpenAI's strict mode writes them), the forced text before and after the JSON, and,
 * for tool_choice "auto", the trigger text that starts a call. only: the named function
 * (tool_choice {"type":"function","function":{"name":...}}), or NULL for any of the tools.
 * ZS_EINVAL naming tools[i]... for a parameters schema the grammar cannot take, or only for a
 * name not among the tools. */
typedef struct {
    char *schema_json;
    char *prefix;   /* "" when none */
    char *suffix;   /* "" when none */
    char *trigger;  /* the opener of a call in free text ("<tool_call>", "[TOOL_CALLS]", "{" for llama3) */
} zs_toolcall_constraint;
int  zs_toolcall_constraint_make(int fmt, const zs_tool_def *tools, int n_tools, const char *only,
                                 zs_toolcall_constraint *out);
void zs_toolcall_constraint_free(zs_toolcall_constraint *c);

/* Splits generated text into content and calls: every call written in fmt (or, for any fmt, the
 * generic "<tool_call>...</tool_call>" form) whose JSON parses and names one of the tools. The
 * calls get ids "call_<index>_<id_seed>" unless given; arguments are re-serialised compactly.
 * content: the text outside the calls (trimmed), "" when only calls. n_calls 0 is not an error. */
typedef struct {
    zs_tool_call *calls;
    int n_calls;
    char *content;
} zs_toolcall_parsed;
int  zs_toolcall_parse(int fmt, const char *text, size_t len, const zs_tool_def *tools, int n_tools,
                       const char *id_seed, zs_toolcall_parsed *out);
void zs_toolcall_parsed_free(zs_toolcall_parsed *p);

#endif
