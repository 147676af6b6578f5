/* toolcall.h — tool calls for chat models: the format a chat template writes tool definitions,
 * assistant tool calls and tool results in; the constraint that makes a model write one call
 * (a JSON-Schema grammar with the format's forced opener and closer, for sched.h's
 * zs_req_constraint); and parsing calls back out of generated text.
 *
 * Formats (chosen from the chat family, zs_toolcall_format), byte for byte what the published
 * templates render with transformers (tests/ref/toolcall-ref.json, tests/ref/make_toolcall_ref.py):
 *   hermes   chatml (Qwen2.5-Instruct's template): a system turn with the first system message's
 *            text (none: Qwen2.5's "You are Qwen, created by Alibaba Cloud. You are a helpful
 *            assistant.", which Qwen3 does not write) and "# Tools ... <tools>\n{tool}\n...
 *            </tools> ..."; a call is "<tool_call>\n{"name": N, "arguments": {...}}\n</tool_call>"
 *            (one per line after the assistant's content), consecutive tool results are one user
 *            turn of "\n<tool_response>\n...\n</tool_response>" parts.
 *   llama3   llama-3 (Llama 3.1 / 3.3's template, tools in the first user message, its default):
 *            a system header "Environment: ipython\nCutting Knowledge Date: December 2023\n
 *            Today Date: 26 Jul 2024\n\n{system}" (the template's default date_string: fixed, so
 *            prompts are reproducible and cacheable), the tools as JSON (indent 4) before the
 *            first user message (which must come first after the system message), a call is the
 *            bare {"name": N, "parameters": {...}} (one per assistant message; the content is
 *            dropped), a tool result an "ipython" turn holding the result as a JSON string.
 *   mistral  Mistral-Nemo-Instruct-2407's v3 template: [AVAILABLE_TOOLS][...][/AVAILABLE_TOOLS]
 *            before the last user turn (string fields written unescaped, as the template does),
 *            calls "[TOOL_CALLS][{"name": N, "arguments": {...}, "id": I}, ...]</s>" (the content
 *            is dropped), results "[TOOL_RESULTS]{"content": TEXT, "call_id": I}[/TOOL_RESULTS]".
 *            Ids must be 9 letters/digits there (the template raises otherwise); any other id is
 *            mapped to 9 such characters by a hash, the same for a call and its result.
 *   generic  every other family (rendered by zs_chat_render): the tools become a system message
 *            (merged after the first system message's text and "\n\n" when there is one):
 *              # Tools\n\nYou may call one or more functions to assist with the user query. The
 *              functions, as JSON:\n<tools>\n{tool}\n{tool}\n</tools>\n\nTo call a function,
 *              answer with one line per call:\n<tool_call>{"name": <function-name>,
 *              "arguments": <args-json-object>}</tool_call>
 *            an assistant's calls are its content (content + "\n", when there is content) and
 *            "<tool_call>{"name": N, "arguments": {...}}</tool_call>" lines joined by "\n";
 *            consecutive tool results are one user message of "<tool_response>TEXT</tool_response>"
 *            lines joined by "\n".
 * {tool} is {"type": "function", "function": {"name": N, "description": D (when given),
 * "parameters": P (when given)}}. JSON is written as Python's json.dumps(ensure_ascii=False)
 * writes it (what the templates' tojson does: ", " and ": ", shortest float repr, key order
 * kept); call arguments are re-serialised that way (OpenAI's argument strings are parsed).
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

/* Renders messages with tool definitions in chat_tmpl's family and fmt's format (fmt must be
 * zs_toolcall_format(chat_tmpl) or generic). n_tools may be 0: for messages without tool parts
 * the text is then exactly zs_chat_render's; with tool parts, the family's tool-less layout
 * (chat.c's) with the format's calls and results. ZS_EINVAL naming messages[i].role,
 * messages[i].tool_calls[k].function.arguments (not a JSON object), messages[i].tool_calls
 * (llama3: more than one call; a non-assistant message with calls), tools[i].function.name /
 * .parameters, or what the family's roles rules refuse. */
int zs_toolcall_render(int chat_tmpl, int fmt, const zs_tool_msg *msgs, int n, const zs_tool_def *tools,
                       int n_tools, int add_generation_prompt, const char *bos, const char *eos, char **out);

/* The constraint that makes the model write exactly one call in fmt: schema_json (for
 * zs_jschema_compile: one object with "name" fixed to a tool's name, or an anyOf over the tools,
 * and "arguments" — "parameters" for llama3 — by that tool's schema, made acceptable to the
 * grammar: an object schema without additionalProperties is read as additionalProperties
 * false, as OpenAI's strict mode writes them), the forced text before and after the JSON, and,
 * for tool_choice "auto", the trigger text that starts a call. only: the named function
 * (tool_choice {"type":"function","function":{"name":...}}), or NULL for any of the tools.
 * ZS_EINVAL naming tools[i].function.parameters and the keyword (pointer relative to the
 * parameters) for a schema jsonschema.c cannot take, tools[i].function.name for a bad or
 * duplicate name, tool_choice.function.name for an `only` not among the tools.
 * Schema details: parameters NULL is {} arguments; additionalProperties false is added to every
 * object schema lacking it (properties, items, anyOf, $defs/definitions included; "required"
 * kept as given); a tool's $defs are moved to the root's $defs as "t<i>_NAME" and its "$ref"s
 * ("#" included) rewritten. jsonschema.c's root must be one object schema with no anyOf beside
 * "type", so with several tools "name" is an enum and the arguments an anyOf of the (distinct)
 * tools' schemas: name and arguments are NOT tied (a call may pair one tool's name with
 * another's arguments; check the parsed call if that matters). Beyond ZS_JSCHEMA_MAX_ALTS - 4
 * distinct argument schemas of plain objects, they are merged into one object (every property
 * of any tool, none required), since the matcher follows at most ZS_JSCHEMA_MAX_ALTS
 * alternatives at once. */
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
 * generic "<tool_call>...</tool_call>" form, whitespace inside allowed, the closer optional at the
 * end of the text) whose JSON parses and names one of the tools (any name when n_tools is 0).
 * hermes/generic: each <tool_call> block; mistral: "[TOOL_CALLS]" and an array of calls (or one
 * call), all valid or none; llama3: the text from its start (after an optional <|python_tag|>)
 * as call objects separated by ';' or whitespace. "arguments" ("parameters") may be an object, a
 * string holding one, or absent ({}). The calls get their "id" when the text gives one, else
 * "call_<index>_<id_seed>" ("call_<index>" when id_seed is NULL); arguments are re-serialised
 * compactly. content: the text outside the calls (ASCII-whitespace trimmed), "" when only calls;
 * text that is not a valid call stays in content. Any bytes are safe (truncated, malformed).
 * n_calls 0 is not an error. */
typedef struct {
    zs_tool_call *calls;
    int n_calls;
    char *content;
} zs_toolcall_parsed;
int  zs_toolcall_parse(int fmt, const char *text, size_t len, const zs_tool_def *tools, int n_tools,
                       const char *id_seed, zs_toolcall_parsed *out);
void zs_toolcall_parsed_free(zs_toolcall_parsed *p);

#endif
