/* chat.h — chat templates: turning a list of {role, content} messages into the prompt text a
 * chat model was trained on, for the families the server recognises, and choosing the family
 * from a model's tokenizer_config.json.
 *
 * Output formats (exactly what the Hugging Face Jinja templates of these families produce):
 *
 *   llama-2  (Meta's Llama-2-chat template; roles must alternate user/assistant starting with
 *            user, after an optional first system message; content is strip()ed, the system
 *            text is not):
 *              <s>[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {assistant} </s>
 *              <s>[INST] {user} [/INST]
 *            add_generation_prompt changes nothing (the text already ends with "[/INST]").
 *   llama-3  (Llama-3-Instruct; content is trim()med; any order of roles):
 *              <|begin_of_text|><|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>
 *              ... <|start_header_id|>assistant<|end_header_id|>\n\n   (generation prompt)
 *   chatml   (Qwen / ChatML; content verbatim; no BOS, no default system message):
 *              <|im_start|>{role}\n{content}<|im_end|>\n ... <|im_start|>assistant\n
 *            Qwen3's template is ChatML plus <think> handling and is detected as chatml. Its text
 *            is the same for a conversation that ends with a user message and whose assistant
 *            messages hold no "</think>" (what a chat request sends), with enable_thinking at
 *            the template's default (true: nothing after the generation prompt; the model opens
 *            <think> itself). Not followed: Qwen3 drops "<think>...</think>" from assistant
 *            messages before the last user message (here content is verbatim, <think> included),
 *            and writes "<think>\n\n</think>\n\n" before the content of an assistant message
 *            after the last user message (here: nothing; matters only for training data).
 *            (Qwen2/2.5's templates add a default system message when there is none; this does
 *            not.)
 *   gemma    (Gemma 2 and Gemma 3; the assistant role is written "model"; content is trim()med;
 *            roles alternate user/assistant/... after an optional first system message):
 *              <bos><start_of_turn>user\n{system}\n\n{user}<end_of_turn>\n
 *              <start_of_turn>model\n{assistant}<end_of_turn>\n ... <start_of_turn>model\n
 *            A system message is Gemma 3's behaviour for both: its text (verbatim, not trimmed)
 *            and "\n\n" open the first user message. Gemma 2's template raises "System role not
 *            supported" instead; without a system message both templates render these bytes.
 *   phi3     (Phi-3-mini / Phi-3-medium; content verbatim; any order of roles; no BOS):
 *              <|system|>\n{content}<|end|>\n<|user|>\n{content}<|end|>\n
 *              <|assistant|>\n{content}<|end|>\n ... <|assistant|>\n   (generation prompt)
 *            Without a generation prompt the text ends with the EOS string instead
 *            ("<|endoftext|>"), as Phi-3-mini-4k-instruct's template does. (Phi-3.5's template
 *            drops a system message whose content is empty; Phi-3-medium's drops every system
 *            message and writes <|assistant|>\n after each user message; this follows
 *            Phi-3-mini's, which is the same as both for a system-less chat request.)
 *   mistral  (Mistral's v3 templates with tools, as Mistral-Nemo-Instruct-2407's renders; roles
 *            must alternate user/assistant starting with user, after an optional first system
 *            message; content verbatim; the system text goes into the LAST message when it is a
 *            user message, and is dropped otherwise, as the template does):
 *              <s>[INST]{user}[/INST]{assistant}</s>[INST]{system}\n\n{user}[/INST]
 *            add_generation_prompt changes nothing. Tool definitions, calls and results:
 *            toolcall.h. (Mistral-7B-Instruct-v0.3's v3 template writes "[INST] " and
 *            " [/INST]" with spaces, and the v7 templates ([SYSTEM_PROMPT]) write the system
 *            prompt in its own block; both are detected as mistral and rendered as above.)
 *   plain    (models without a chat template):
 *              System: {content}\nUser: {content}\nAssistant: {content}\n ... Assistant:
 *
 * BOS: llama-2, llama-3 and gemma write the BOS token literally into the text; encode such text
 * with add_special = 0 (zs_chat_has_bos) so BOS is not doubled. chatml, phi3 and plain do not,
 * so their text is encoded with the tokenizer's usual post-processing (add_special = 1; Qwen's
 * and Phi-3's tokenizer_config.json add no BOS).
 *
 * Stripping ("strip()"/"trim") is Python's str.strip(): leading and trailing Unicode whitespace
 * (str.isspace(): ASCII \t\n\v\f\r, space, \x1c-\x1f, U+0085, U+00A0, U+1680, U+2000-U+200A,
 * U+2028, U+2029, U+202F, U+205F, U+3000).
 *
 * tests/ref/chat-ref.json holds the published templates' own renderings (transformers' renderer,
 * tests/ref/make_chat_ref.py) that tests/test-chat.c compares with byte for byte.
 *
 * Roles: "system", "user", "assistant" ("developer", OpenAI's newer name for system, is read as
 * system). Anything else -> ZS_EINVAL naming messages[i].role.
 *
 * Everything here is pure and thread-safe; *out is malloc'd, the caller frees it. */
#ifndef ZS_CHAT_H
#define ZS_CHAT_H

#include <stddef.h>

enum {
    ZS_CHAT_PLAIN = 0,
    ZS_CHAT_LLAMA2 = 1,
    ZS_CHAT_LLAMA3 = 2,
    ZS_CHAT_CHATML = 3,
    ZS_CHAT_GEMMA = 4,
    ZS_CHAT_PHI3 = 5,
    ZS_CHAT_COUNT,        /* 6: the families above (what tests/test-chat.c enumerates) */
    ZS_CHAT_MISTRAL = 6,  /* Mistral's v3 template (after ZS_CHAT_COUNT, see below) */
    ZS_CHAT_NFAMILIES     /* every family, mistral included */
};

typedef struct {
    const char *role;    /* "system" | "user" | "assistant" | "developer" */
    const char *content; /* UTF-8 text (NULL = "") */
} zs_chat_msg;

/* ZS_CHAT_MISTRAL is numbered after ZS_CHAT_COUNT so that loops over 0..ZS_CHAT_COUNT-1 (the
 * trainer's check of its --chat-template, tests that expect every family to have a stop string)
 * keep their meaning; code that accepts every family loops to ZS_CHAT_NFAMILIES. */

/* "plain", "llama-2", "llama-3", "chatml", "gemma", "phi3", "mistral" ("unknown" out of
 * range). */
const char *zs_chat_template_name(int tmpl);
/* Name -> ZS_CHAT_*; "auto" -> -1 (detect); ZS_EINVAL (listing the names) for anything else. */
int zs_chat_template_parse(const char *name, int *out);

/* Reads <model_dir>/tokenizer_config.json ("chat_template": a Jinja string, or a list of
 * {name, template} where "default" is used) or <model_dir>/chat_template.jinja and recognises
 * the family by its markers, first match wins: "<|im_start|>" -> chatml (unless "<|im_sep|>",
 * Phi-4's format: plain), "<|start_header_id|>" -> llama-3, "<start_of_turn>" -> gemma,
 * "<|user|>" with "<|end|>" -> phi3, "[INST]" with "<<SYS>>" or "bos_token + '[INST]" ->
 * llama-2, "[AVAILABLE_TOOLS]", "[TOOL_CALLS]" or "[SYSTEM_PROMPT]" (Mistral's v3 / v7
 * markers) -> mistral. No file, no template or an unknown template -> plain. Never fails. */
int zs_chat_template_detect(const char *model_dir);

/* The family of a Jinja template text by the same markers (NULL or unknown -> plain); for
 * templates that come from elsewhere (a GGUF file's tokenizer.chat_template). */
int zs_chat_template_classify(const char *tmpl_text);

/* 1 when the rendered text of tmpl begins with the BOS token written literally (llama-2,
 * llama-3, gemma, mistral). */
int zs_chat_has_bos(int tmpl);

/* The strings that end an assistant turn of tmpl, NULL-terminated (static; never NULL itself):
 * llama-3 "<|eot_id|>", chatml "<|im_end|>", gemma "<end_of_turn>", phi3 "<|end|>" and
 * "<|endoftext|>"; none for llama-2 and mistral (their turns end with the model's EOS) and
 * plain. The first
 * is the marker that closes every turn in the rendered text. Each is one special token of
 * the family's vocabulary; a generation should stop when it is produced even where the
 * model's eos_token_id does not list it. */
const char *const *zs_chat_stop_strings(int tmpl);

/* Renders n >= 1 messages. bos/eos: the model's BOS/EOS strings, NULL for the family's usual
 * ones ("<s>"/"</s>" for llama-2 and mistral, "<|begin_of_text|>" for llama-3, "<bos>" for gemma,
 * "<|endoftext|>" as phi3's EOS). ZS_EINVAL with a message naming messages[i].role for a bad
 * role or, for llama-2, gemma and mistral, roles that do not alternate (a system message anywhere but
 * first included), or naming messages for a system message with nothing after it. */
int zs_chat_render(int tmpl, const zs_chat_msg *msgs, int n, int add_generation_prompt,
                   const char *bos, const char *eos, char **out);

/* Python's str.strip() on s[0..*n): returns the first byte kept and sets *n to the kept length
 * (the Unicode whitespace listed above). */
const char *zs_chat_strip(const char *s, size_t *n);

#endif
