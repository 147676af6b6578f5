/* chat.c — chat templates (llama-2, llama-3, chatml, gemma, phi3, mistral, plain) rendered in C exactly as
 * the Hugging Face Jinja templates of these families render, the strings that end a turn, and
 * detection of the family from a model's tokenizer_config.json. See chat.h for the formats and
 * the few places where a published template is deliberately not followed. */
#include "chat.h"

#include <jansson.h>
#include <stdarg.h>
#include <string.h>

#include "common.h"
#include "strbuf.h"

static const char *k_names[ZS_CHAT_NFAMILIES] = {"plain", "llama-2", "llama-3", "chatml", "gemma", "phi3",
                                                 "mistral"};

const char *zs_chat_template_name(int tmpl) {
    return tmpl >= 0 && tmpl < ZS_CHAT_NFAMILIES ? k_names[tmpl] : "unknown";
}

int zs_chat_template_parse(const char *name, int *out) {
    if (!name || !out) return zs_err(ZS_EINVAL, "chat template: no name");
    if (!strcmp(name, "auto")) {
        *out = -1;
        return 0;
    }
    for (int i = 0; i < ZS_CHAT_NFAMILIES; i++)
        if (!strcmp(name, k_names[i])) {
            *out = i;
            return 0;
        }
    char list[256] = "auto";
    for (int i = 0; i < ZS_CHAT_COUNT; i++) {
        size_t l = strlen(list);
        snprintf(list + l, sizeof list - l, "%s%s", i == ZS_CHAT_COUNT - 1 ? " or " : ", ", k_names[i]);
    }
    return zs_err(ZS_EINVAL, "unknown chat template '%s' (expected %s; or %s)", name, list, k_names[ZS_CHAT_MISTRAL]);
}

/* ------------------------------------------------------------------ detection */

static int classify(const char *t) {
    if (!t) return ZS_CHAT_PLAIN;
    /* Phi-4 writes <|im_start|>{role}<|im_sep|>{content}: not ChatML */
    if (strstr(t, "<|im_start|>")) return strstr(t, "<|im_sep|>") ? ZS_CHAT_PLAIN : ZS_CHAT_CHATML;
    if (strstr(t, "<|start_header_id|>")) return ZS_CHAT_LLAMA3;
    if (strstr(t, "<start_of_turn>")) return ZS_CHAT_GEMMA;
    if (strstr(t, "<|user|>") && strstr(t, "<|end|>")) return ZS_CHAT_PHI3;
    if (strstr(t, "[INST]") && (strstr(t, "<<SYS>>") || strstr(t, "bos_token + '[INST]") ||
                                strstr(t, "bos_token + \"[INST]")))
        return ZS_CHAT_LLAMA2;
    /* Mistral's v3 (tools) and v7 (system prompt) markers; its older [INST]-only templates stay plain */
    if (strstr(t, "[AVAILABLE_TOOLS]") || strstr(t, "[TOOL_CALLS]") || strstr(t, "[SYSTEM_PROMPT]"))
        return ZS_CHAT_MISTRAL;
    return ZS_CHAT_PLAIN;
}

static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (cap - len < 4096) {
            size_t nc = cap ? cap * 2 : 8192;
            char *nb = realloc(buf, nc + 1);
            if (!nb) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = nb;
            cap = nc;
        }
        size_t n = fread(buf + len, 1, cap - len, f);
        len += n;
        if (n == 0) break;
    }
    fclose(f);
    buf[len] = '\0';
    return buf;
}

int zs_chat_template_classify(const char *tmpl_text) { return classify(tmpl_text); }

int zs_chat_template_detect(const char *model_dir) {
    if (!model_dir) return ZS_CHAT_PLAIN;
    char path[4200];
    snprintf(path, sizeof path, "%.4000s/tokenizer_config.json", model_dir);
    json_t *j = json_load_file(path, 0, NULL);
    int kind = ZS_CHAT_PLAIN, found = 0;
    if (j) {
        json_t *ct = json_object_get(j, "chat_template");
        if (json_is_string(ct)) {
            kind = classify(json_string_value(ct));
            found = 1;
        } else if (json_is_array(ct)) {
            size_t i;
            json_t *e;
            json_array_foreach(ct, i, e) {
                const char *name = json_string_value(json_object_get(e, "name"));
                const char *tpl = json_string_value(json_object_get(e, "template"));
                if (tpl && (!found || (name && !strcmp(name, "default")))) {
                    kind = classify(tpl);
                    found = 1;
                    if (name && !strcmp(name, "default")) break;
                }
            }
        }
        json_decref(j);
    }
    if (!found) {
        snprintf(path, sizeof path, "%.4000s/chat_template.jinja", model_dir);
        char *t = read_text(path);
        if (t) kind = classify(t);
        free(t);
    }
    return kind;
}

int zs_chat_has_bos(int tmpl) {
    return tmpl == ZS_CHAT_LLAMA2 || tmpl == ZS_CHAT_LLAMA3 || tmpl == ZS_CHAT_GEMMA || tmpl == ZS_CHAT_MISTRAL;
}

const char *const *zs_chat_stop_strings(int tmpl) {
    static const char *const none[] = {NULL};
    static const char *const llama3[] = {"<|eot_id|>", NULL};
    static const char *const chatml[] = {"<|im_end|>", NULL};
    static const char *const gemma[] = {"<end_of_turn>", NULL};
    static const char *const phi3[] = {"<|end|>", "<|endoftext|>", NULL};
    switch (tmpl) {
    case ZS_CHAT_LLAMA3: return llama3;
    case ZS_CHAT_CHATML: return chatml;
    case ZS_CHAT_GEMMA: return gemma;
    case ZS_CHAT_PHI3: return phi3;
    default: return none;
    }
}

/* ------------------------------------------------------------------ rendering */

static void sb_add(sbuf *b, const char *s) { sb_addn(b, s, strlen(s)); }

/* Python's str.isspace() code points (what str.strip() and Jinja's trim remove). */
static int is_space_cp(unsigned c) {
    return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

/* The length of the UTF-8 whitespace character at s[0..n), 0 if there is none. Only the
 * encodings of the code points above are recognised; anything else (invalid bytes included)
 * is not whitespace. */
static size_t space_at(const unsigned char *s, size_t n) {
    if (n >= 1 && s[0] < 0x80) return is_space_cp(s[0]) ? 1 : 0;
    if (n >= 2 && s[0] == 0xc2 && (s[1] == 0x85 || s[1] == 0xa0)) return 2;
    if (n >= 3 && (s[0] == 0xe1 || s[0] == 0xe2 || s[0] == 0xe3) && (s[1] & 0xc0) == 0x80 && (s[2] & 0xc0) == 0x80) {
        unsigned c = (unsigned)(s[0] & 0x0f) << 12 | (unsigned)(s[1] & 0x3f) << 6 | (s[2] & 0x3f);
        return is_space_cp(c) ? 3 : 0;
    }
    return 0;
}

/* The length of the UTF-8 whitespace character that ends s[0..n), 0 if there is none. */
static size_t space_before(const unsigned char *s, size_t n) {
    if (n >= 1 && space_at(s + n - 1, 1)) return 1;
    if (n >= 2 && space_at(s + n - 2, 2) == 2) return 2;
    if (n >= 3 && space_at(s + n - 3, 3) == 3) return 3;
    return 0;
}

const char *zs_chat_strip(const char *s, size_t *n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t k;
    while ((k = space_at(u, *n))) u += k, *n -= k;
    while ((k = space_before(u, *n))) *n -= k;
    return (const char *)u;
}

/* Python's str.strip() (Jinja's trim filter): leading and trailing Unicode whitespace. */
static void sb_add_stripped(sbuf *b, const char *s, size_t n) {
    const char *u = zs_chat_strip(s, &n);
    sb_addn(b, u, n);
}

enum { R_SYSTEM, R_USER, R_ASSISTANT };

static int role_of(const zs_chat_msg *m, int i, int *out) {
    const char *r = m->role;
    if (r && (!strcmp(r, "system") || !strcmp(r, "developer"))) *out = R_SYSTEM;
    else if (r && !strcmp(r, "user")) *out = R_USER;
    else if (r && !strcmp(r, "assistant")) *out = R_ASSISTANT;
    else
        return zs_err(ZS_EINVAL, "messages[%d].role: '%s' is not supported (expected system, user or assistant)",
                      i, r ? r : "(none)");
    return 0;
}

static const char *k_role_names[] = {"system", "user", "assistant"};
static const char *k_plain_names[] = {"System", "User", "Assistant"};

/* llama-2 and gemma: after an optional first system message (messages[0..first)), roles must
 * go user, assistant, user, ... (their templates raise an exception otherwise) and at least one
 * message must follow the system message (the templates would silently drop it). */
static int check_alternating(const int *roles, int n, int first, const char *name) {
    if (first >= n)
        return zs_err(ZS_EINVAL, "messages: the %s chat template needs a user message after the system message", name);
    for (int i = first; i < n; i++) {
        int want = (i - first) % 2 == 0 ? R_USER : R_ASSISTANT;
        if (roles[i] != want)
            return zs_err(ZS_EINVAL, "messages[%d].role: the %s chat template needs roles alternating "
                          "user/assistant/user/... (after an optional first system message); got '%s'",
                          i, name, k_role_names[roles[i]]);
    }
    return 0;
}

static int render_llama2(const zs_chat_msg *m, const int *roles, int n, const char *bos,
                         const char *eos, sbuf *b) {
    int first = 0;
    const char *sys = NULL;
    if (roles[0] == R_SYSTEM) {
        sys = m[0].content ? m[0].content : "";
        first = 1;
    }
    int rc = check_alternating(roles, n, first, "llama-2");
    if (rc < 0) return rc;
    for (int i = first; i < n; i++) {
        const char *c = m[i].content ? m[i].content : "";
        if (roles[i] == R_USER) {
            sb_add(b, bos);
            sb_add(b, "[INST] ");
            if (i == first && sys) {
                sbuf t = {0};
                sb_add(&t, "<<SYS>>\n");
                sb_add(&t, sys);
                sb_add(&t, "\n<</SYS>>\n\n");
                sb_add(&t, c);
                if (t.oom) b->oom = 1;
                else sb_add_stripped(b, t.p, t.len);
                free(t.p);
            } else {
                sb_add_stripped(b, c, strlen(c));
            }
            sb_add(b, " [/INST]");
        } else {
            sb_add(b, " ");
            sb_add_stripped(b, c, strlen(c));
            sb_add(b, " ");
            sb_add(b, eos);
        }
    }
    return 0;
}

/* Gemma 3's template (Gemma 2's without a system message): the system text, verbatim, and
 * "\n\n" open the first user turn; every content is trim()med. */
static int render_gemma(const zs_chat_msg *m, const int *roles, int n, int gen, const char *bos, sbuf *b) {
    int first = roles[0] == R_SYSTEM;
    int rc = check_alternating(roles, n, first, "gemma");
    if (rc < 0) return rc;
    sb_add(b, bos);
    for (int i = first; i < n; i++) {
        const char *c = m[i].content ? m[i].content : "";
        sb_add(b, roles[i] == R_USER ? "<start_of_turn>user\n" : "<start_of_turn>model\n");
        if (i == first && first) {
            sb_add(b, m[0].content ? m[0].content : "");
            sb_add(b, "\n\n");
        }
        sb_add_stripped(b, c, strlen(c));
        sb_add(b, "<end_of_turn>\n");
    }
    if (gen) sb_add(b, "<start_of_turn>model\n");
    return 0;
}

/* Mistral-Nemo's template without tools: content verbatim, the system text (a first system
 * message) only in the last message when that is a user message. */
static int render_mistral(const zs_chat_msg *m, const int *roles, int n, const char *bos, const char *eos,
                          sbuf *b) {
    int first = roles[0] == R_SYSTEM;
    int rc = check_alternating(roles, n, first, "mistral");
    if (rc < 0) return rc;
    sb_add(b, bos);
    for (int i = first; i < n; i++) {
        const char *c = m[i].content ? m[i].content : "";
        if (roles[i] == R_USER) {
            sb_add(b, "[INST]");
            if (first && i == n - 1) {
                sb_add(b, m[0].content ? m[0].content : "");
                sb_add(b, "\n\n");
            }
            sb_add(b, c);
            sb_add(b, "[/INST]");
        } else {
            sb_add(b, c);
            sb_add(b, eos);
        }
    }
    return 0;
}

/* Phi-3-mini's template: any order of roles, content verbatim, the EOS text closing a
 * conversation rendered without a generation prompt. */
static void render_phi3(const zs_chat_msg *m, const int *roles, int n, int gen, const char *eos, sbuf *b) {
    static const char *tags[] = {"<|system|>\n", "<|user|>\n", "<|assistant|>\n"};
    for (int i = 0; i < n; i++) {
        sb_add(b, tags[roles[i]]);
        sb_add(b, m[i].content ? m[i].content : "");
        sb_add(b, "<|end|>\n");
    }
    sb_add(b, gen ? "<|assistant|>\n" : eos);
}

int zs_chat_render(int tmpl, const zs_chat_msg *msgs, int n, int add_generation_prompt,
                   const char *bos, const char *eos, char **out) {
    if (!msgs || n <= 0 || !out) return zs_err(ZS_EINVAL, "messages: at least one message is required");
    if (tmpl < 0 || tmpl >= ZS_CHAT_NFAMILIES) return zs_err(ZS_EINVAL, "chat template %d is unknown", tmpl);
    int *roles = malloc((size_t)n * sizeof *roles);
    if (!roles) return zs_err(ZS_ENOMEM, "chat template: out of memory");
    for (int i = 0; i < n; i++) {
        int rc = role_of(&msgs[i], i, &roles[i]);
        if (rc < 0) {
            free(roles);
            return rc;
        }
    }
    sbuf b = {0};
    int rc = 0;
    switch (tmpl) {
    case ZS_CHAT_LLAMA2:
        rc = render_llama2(msgs, roles, n, bos ? bos : "<s>", eos ? eos : "</s>", &b);
        break;
    case ZS_CHAT_LLAMA3:
        sb_add(&b, bos ? bos : "<|begin_of_text|>");
        for (int i = 0; i < n; i++) {
            const char *c = msgs[i].content ? msgs[i].content : "";
            sb_add(&b, "<|start_header_id|>");
            sb_add(&b, k_role_names[roles[i]]);
            sb_add(&b, "<|end_header_id|>\n\n");
            sb_add_stripped(&b, c, strlen(c));
            sb_add(&b, "<|eot_id|>");
        }
        if (add_generation_prompt) sb_add(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
        break;
    case ZS_CHAT_MISTRAL:
        rc = render_mistral(msgs, roles, n, bos ? bos : "<s>", eos ? eos : "</s>", &b);
        break;
    case ZS_CHAT_GEMMA:
        rc = render_gemma(msgs, roles, n, add_generation_prompt, bos ? bos : "<bos>", &b);
        break;
    case ZS_CHAT_PHI3:
        render_phi3(msgs, roles, n, add_generation_prompt, eos ? eos : "<|endoftext|>", &b);
        break;
    case ZS_CHAT_CHATML:
        for (int i = 0; i < n; i++) {
            sb_add(&b, "<|im_start|>");
            sb_add(&b, k_role_names[roles[i]]);
            sb_add(&b, "\n");
            sb_add(&b, msgs[i].content ? msgs[i].content : "");
            sb_add(&b, "<|im_end|>\n");
        }
        if (add_generation_prompt) sb_add(&b, "<|im_start|>assistant\n");
        break;
    default:
        for (int i = 0; i < n; i++) {
            sb_add(&b, k_plain_names[roles[i]]);
            sb_add(&b, ": ");
            sb_add(&b, msgs[i].content ? msgs[i].content : "");
            sb_add(&b, "\n");
        }
        if (add_generation_prompt) sb_add(&b, "Assistant:");
        break;
    }
    free(roles);
    if (rc == 0 && b.oom) rc = zs_err(ZS_ENOMEM, "chat template: out of memory");
    if (rc == 0 && !b.p && !(b.p = calloc(1, 1))) b.oom = 1; /* empty output still a string */
    if (rc == 0 && b.oom) rc = zs_err(ZS_ENOMEM, "chat template: out of memory");
    if (rc < 0) {
        free(b.p);
        return rc;
    }
    *out = b.p;
    return 0;
}
