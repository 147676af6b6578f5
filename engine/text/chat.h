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
 *   plain    (models without a chat template):
 *              System: {content}\nUser: {content}\nAssistant: {content}\n ... Assistant:
 *
 * BOS: llama-2 and llama-3 write the BOS token literally into the text; encode such text with
 * add_special = 0 (zs_chat_has_bos) so BOS is not doubled. chatml and plain do not, so their
 * text is encoded with the tokenizer's usual post-processing (add_special = 1).
 *
 * Roles: "system", "user", "assistant" ("developer", OpenAI's newer name for system, is read as
 * system). Anything else -> ZS_EINVAL naming messages[i].role.
 *
 * Everything here is pure and thread-safe; *out is malloc'd, the caller frees it. */
#ifndef ZS_CHAT_H
#define ZS_CHAT_H

enum { ZS_CHAT_PLAIN = 0, ZS_CHAT_LLAMA2 = 1, ZS_CHAT_LLAMA3 = 2, ZS_CHAT_CHATML = 3, ZS_CHAT_COUNT };

typedef struct {
    const char *role;    /* "system" | "user" | "assistant" | "developer" */
    const char *content; /* UTF-8 text (NULL = "") */
} zs_chat_msg;

/* "plain", "llama-2", "llama-3", "chatml". */
const char *zs_chat_template_name(int tmpl);
/* Name -> ZS_CHAT_*; "auto" -> -1 (detect); ZS_EINVAL for anything else. */
int zs_chat_template_parse(const char *name, int *out);

/* Reads <model_dir>/tokenizer_config.json ("chat_template": a Jinja string, or a list of
 * {name, template} where "default" is used) or <model_dir>/chat_template.jinja and recognises
 * the family by its markers: "<|im_start|>" -> chatml, "<|start_header_id|>" -> llama-3,
 * "[INST]" with "<<SYS>>" or "bos_token + '[INST]" -> llama-2. No file, no template or an
 * unknown template -> plain. Never fails. */
int zs_chat_template_detect(const char *model_dir);

/* The family of a Jinja template text by the same markers (NULL or unknown -> plain); for
 * templates that come from elsewhere (a GGUF file's tokenizer.chat_template). */
int zs_chat_template_classify(const char *tmpl_text);

/* 1 when the rendered text of tmpl begins with the BOS token written literally. */
int zs_chat_has_bos(int tmpl);

/* Renders n >= 1 messages. bos/eos: the model's BOS/EOS strings, NULL for the family's usual
 * ones ("<s>"/"</s>" for llama-2, "<|begin_of_text|>" for llama-3). ZS_EINVAL with a message
 * naming messages[i].role for a bad role or, for llama-2, roles that do not alternate. */
int zs_chat_render(int tmpl, const zs_chat_msg *msgs, int n, int add_generation_prompt,
                   const char *bos, const char *eos, char **out);

#endif
