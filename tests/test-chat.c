/* test-chat.c — tests of the chat templates (engine/text/chat.c): every family against exact
 * expected strings (system prompts, multi-turn, generation prompt, stripping), bad roles, stop
 * strings, detection of the family from tokenizer_config.json / chat_template.jinja samples, and
 * byte-for-byte agreement with the published Jinja templates (Gemma 2, Gemma 3, Phi-3-mini,
 * Qwen3, Llama-3, Llama-2) as transformers renders them: tests/ref/chat-ref.json, made by
 * tests/ref/make_chat_ref.py. */
#include "chat.h"

#include "common.h"
#include "testutil.h"

#define N(a) ((int)(sizeof(a) / sizeof((a)[0])))

static void expect(int tmpl, const zs_chat_msg *m, int n, int gen, const char *bos, const char *eos,
                   const char *want, const char *what) {
    char *out = NULL;
    int rc = zs_chat_render(tmpl, m, n, gen, bos, eos, &out);
    CHECK(rc == 0, "%s: render failed: %s", what, zs_errmsg());
    if (rc == 0) CHECK(!strcmp(out, want), "%s:\n got  [%s]\n want [%s]", what, out, want);
    free(out);
}

static void test_llama2(void) {
    zs_chat_msg conv[] = {
        {"system", "You are a helpful assistant."},
        {"user", "Hello!"},
        {"assistant", " Hi there. "},
        {"user", "  How are you?\n"},
    };
    expect(ZS_CHAT_LLAMA2, conv, N(conv), 1, NULL, NULL,
           "<s>[INST] <<SYS>>\nYou are a helpful assistant.\n<</SYS>>\n\nHello! [/INST] Hi there. </s>"
           "<s>[INST] How are you? [/INST]",
           "llama-2 system + multi-turn");
    expect(ZS_CHAT_LLAMA2, conv + 1, 1, 1, NULL, NULL, "<s>[INST] Hello! [/INST]", "llama-2 one user message");
    expect(ZS_CHAT_LLAMA2, conv + 1, 1, 0, NULL, NULL, "<s>[INST] Hello! [/INST]",
           "llama-2 ignores add_generation_prompt");
    expect(ZS_CHAT_LLAMA2, conv + 1, 2, 1, "<BOS>", "<EOS>", "<BOS>[INST] Hello! [/INST] Hi there. <EOS>",
           "llama-2 with the model's bos/eos strings");
    /* developer is read as system */
    zs_chat_msg dev[] = {{"developer", "Be brief."}, {"user", "Hi"}};
    expect(ZS_CHAT_LLAMA2, dev, 2, 1, NULL, NULL, "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST]",
           "llama-2 developer role");

    char *out = NULL;
    zs_chat_msg two_users[] = {{"user", "a"}, {"user", "b"}};
    CHECK_ERR(zs_chat_render(ZS_CHAT_LLAMA2, two_users, 2, 1, NULL, NULL, &out), "messages[1].role", "alternat");
    zs_chat_msg asst_first[] = {{"assistant", "a"}, {"user", "b"}};
    CHECK_ERR(zs_chat_render(ZS_CHAT_LLAMA2, asst_first, 2, 1, NULL, NULL, &out), "messages[0].role");
    zs_chat_msg sys_late[] = {{"user", "a"}, {"system", "b"}};
    CHECK_ERR(zs_chat_render(ZS_CHAT_LLAMA2, sys_late, 2, 1, NULL, NULL, &out), "messages[1].role");
    CHECK_ERR(zs_chat_render(ZS_CHAT_LLAMA2, conv, 1, 1, NULL, NULL, &out), "messages", "user message");
    CHECK(out == NULL, "out set on failure");
    CHECK(zs_chat_has_bos(ZS_CHAT_LLAMA2) && zs_chat_has_bos(ZS_CHAT_LLAMA3), "bos in text");
    CHECK(!zs_chat_has_bos(ZS_CHAT_CHATML) && !zs_chat_has_bos(ZS_CHAT_PLAIN), "no bos in text");
}

static void test_llama3(void) {
    zs_chat_msg conv[] = {
        {"system", " You are terse. "},
        {"user", "Hi\n"},
        {"assistant", "Hello."},
        {"user", "Bye"},
    };
    expect(ZS_CHAT_LLAMA3, conv, N(conv), 1, NULL, NULL,
           "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
           "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
           "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
           "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
           "<|start_header_id|>assistant<|end_header_id|>\n\n",
           "llama-3 multi-turn with generation prompt");
    expect(ZS_CHAT_LLAMA3, conv + 1, 1, 0, NULL, NULL,
           "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
           "llama-3 without generation prompt");
    zs_chat_msg empty[] = {{"user", NULL}};
    expect(ZS_CHAT_LLAMA3, empty, 1, 1, NULL, NULL,
           "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n<|eot_id|>"
           "<|start_header_id|>assistant<|end_header_id|>\n\n",
           "llama-3 empty content");
}

static void test_chatml_plain(void) {
    zs_chat_msg conv[] = {
        {"system", "Sys"},
        {"user", " U1 "},
        {"assistant", "A1"},
        {"user", "U2"},
    };
    expect(ZS_CHAT_CHATML, conv, N(conv), 1, NULL, NULL,
           "<|im_start|>system\nSys<|im_end|>\n<|im_start|>user\n U1 <|im_end|>\n"
           "<|im_start|>assistant\nA1<|im_end|>\n<|im_start|>user\nU2<|im_end|>\n<|im_start|>assistant\n",
           "chatml");
    expect(ZS_CHAT_CHATML, conv + 1, 1, 0, NULL, NULL, "<|im_start|>user\n U1 <|im_end|>\n",
           "chatml without generation prompt");
    expect(ZS_CHAT_PLAIN, conv, N(conv), 1, NULL, NULL, "System: Sys\nUser:  U1 \nAssistant: A1\nUser: U2\nAssistant:",
           "plain");
    expect(ZS_CHAT_PLAIN, conv + 3, 1, 0, NULL, NULL, "User: U2\n", "plain without generation prompt");

    /* roles are checked by every template */
    zs_chat_msg tool[] = {{"user", "x"}, {"tool", "y"}};
    zs_chat_msg nul[] = {{NULL, "y"}};
    for (int t = 0; t < ZS_CHAT_COUNT; t++) {
        char *out = NULL;
        CHECK_ERR(zs_chat_render(t, tool, 2, 1, NULL, NULL, &out), "messages[1].role", "tool");
        CHECK_ERR(zs_chat_render(t, nul, 1, 1, NULL, NULL, &out), "messages[0].role");
        CHECK_ERR(zs_chat_render(t, tool, 0, 1, NULL, NULL, &out), "at least one");
        CHECK(out == NULL, "out untouched");
    }
}

static void test_gemma(void) {
    zs_chat_msg conv[] = {
        {"system", " Be brief. "},
        {"user", "\n Hi "},
        {"assistant", " Hello. "},
        {"user", "Bye\xe3\x80\x80"},
    };
    expect(ZS_CHAT_GEMMA, conv, N(conv), 1, NULL, NULL,
           "<bos><start_of_turn>user\n Be brief. \n\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n"
           "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n",
           "gemma system + multi-turn");
    expect(ZS_CHAT_GEMMA, conv + 1, 2, 0, "<B>", "<E>",
           "<B><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n",
           "gemma with the model's bos, no generation prompt");
    zs_chat_msg sys_empty[] = {{"developer", NULL}, {"user", NULL}};
    expect(ZS_CHAT_GEMMA, sys_empty, 2, 1, NULL, NULL,
           "<bos><start_of_turn>user\n\n\n<end_of_turn>\n<start_of_turn>model\n", "gemma empty system and user");

    char *out = NULL;
    zs_chat_msg two_users[] = {{"user", "a"}, {"user", "b"}};
    CHECK_ERR(zs_chat_render(ZS_CHAT_GEMMA, two_users, 2, 1, NULL, NULL, &out), "messages[1].role", "gemma",
              "alternat");
    zs_chat_msg sys_asst[] = {{"system", "s"}, {"assistant", "a"}};
    CHECK_ERR(zs_chat_render(ZS_CHAT_GEMMA, sys_asst, 2, 1, NULL, NULL, &out), "messages[1].role", "assistant");
    zs_chat_msg sys_late[] = {{"user", "a"}, {"system", "b"}};
    CHECK_ERR(zs_chat_render(ZS_CHAT_GEMMA, sys_late, 2, 1, NULL, NULL, &out), "messages[1].role", "system");
    CHECK_ERR(zs_chat_render(ZS_CHAT_GEMMA, conv, 1, 1, NULL, NULL, &out), "messages", "user message");
    CHECK(out == NULL, "out set on failure");
    CHECK(zs_chat_has_bos(ZS_CHAT_GEMMA), "gemma writes bos");
}

static void test_phi3(void) {
    zs_chat_msg conv[] = {
        {"system", " Sys "},
        {"user", " U1\n"},
        {"assistant", "A1 "},
        {"system", "late"},
        {"user", "U2"},
    };
    expect(ZS_CHAT_PHI3, conv, N(conv), 1, NULL, NULL,
           "<|system|>\n Sys <|end|>\n<|user|>\n U1\n<|end|>\n<|assistant|>\nA1 <|end|>\n<|system|>\nlate<|end|>\n"
           "<|user|>\nU2<|end|>\n<|assistant|>\n",
           "phi3 any order, verbatim");
    expect(ZS_CHAT_PHI3, conv + 1, 2, 0, NULL, NULL, "<|user|>\n U1\n<|end|>\n<|assistant|>\nA1 <|end|>\n<|endoftext|>",
           "phi3 without generation prompt ends with the default eos");
    expect(ZS_CHAT_PHI3, conv + 4, 1, 0, "<s>", "<EOS>", "<|user|>\nU2<|end|>\n<EOS>", "phi3 with the model's eos");
    CHECK(!zs_chat_has_bos(ZS_CHAT_PHI3), "phi3 writes no bos");
}

/* Python's str.strip() whitespace, and bytes that only look like it. */
static void test_strip(void) {
    zs_chat_msg m[] = {{"user", "\x1c\xc2\x85\xc2\xa0\xe1\x9a\x80\xe2\x80\x8a\xe2\x80\xaf\xe2\x81\x9f x \xe2\x80\xa8\xe2\x80\xa9\xe3\x80\x80\x1f"}};
    expect(ZS_CHAT_LLAMA3, m, 1, 0, NULL, NULL,
           "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nx<|eot_id|>", "unicode whitespace stripped");
    /* not whitespace: U+200B (zero width space), U+00A1, a truncated U+3000, a lone 0xc2, 0x85 alone */
    zs_chat_msg k[] = {{"user", "\xe2\x80\x8bx\xc2\xa1 \xe3\x80"}, {"assistant", "\x85y\xc2"}};
    expect(ZS_CHAT_GEMMA, k, 2, 0, NULL, NULL,
           "<bos><start_of_turn>user\n\xe2\x80\x8bx\xc2\xa1 \xe3\x80<end_of_turn>\n"
           "<start_of_turn>model\n\x85y\xc2<end_of_turn>\n",
           "non-whitespace bytes kept");
    zs_chat_msg all[] = {{"user", " \xe3\x80\x80\n"}};
    expect(ZS_CHAT_LLAMA2, all, 1, 1, NULL, NULL, "<s>[INST]  [/INST]", "all whitespace");
}

static void test_stops(void) {
    struct {
        int t;
        const char *want[3];
    } cases[] = {
        {ZS_CHAT_PLAIN, {NULL}},
        {ZS_CHAT_LLAMA2, {NULL}},
        {ZS_CHAT_LLAMA3, {"<|eot_id|>", NULL}},
        {ZS_CHAT_CHATML, {"<|im_end|>", NULL}},
        {ZS_CHAT_GEMMA, {"<end_of_turn>", NULL}},
        {ZS_CHAT_PHI3, {"<|end|>", "<|endoftext|>", NULL}},
    };
    CHECK(N(cases) == ZS_CHAT_COUNT, "every template has a case");
    for (int i = 0; i < N(cases); i++) {
        const char *const *s = zs_chat_stop_strings(cases[i].t);
        CHECK(s != NULL, "%s: stop list", zs_chat_template_name(cases[i].t));
        if (!s) continue;
        int k = 0;
        for (; cases[i].want[k]; k++)
            CHECK(s[k] && !strcmp(s[k], cases[i].want[k]), "%s: stop %d is %s, want %s",
                  zs_chat_template_name(cases[i].t), k, s[k] ? s[k] : "(end)", cases[i].want[k]);
        CHECK(s[k] == NULL, "%s: %d stops", zs_chat_template_name(cases[i].t), k);
    }
    CHECK(zs_chat_stop_strings(-1) && !zs_chat_stop_strings(-1)[0], "out of range: none");
    /* the first stop closes every assistant turn in the rendered text */
    zs_chat_msg m[] = {{"user", "q"}, {"assistant", "ANSWER"}};
    for (int t = ZS_CHAT_LLAMA3; t < ZS_CHAT_COUNT; t++) {
        char *out = NULL;
        CHECK(zs_chat_render(t, m, 2, 0, NULL, NULL, &out) == 0, "render %d", t);
        const char *at = out ? strstr(out, "ANSWER") : NULL;
        const char *stop = zs_chat_stop_strings(t)[0];
        CHECK(at && !strncmp(at + 6, stop, strlen(stop)), "%s: '%s' follows the answer in [%s]",
              zs_chat_template_name(t), stop, out ? out : "");
        free(out);
    }
}

/* tests/ref/chat-ref.json: the published templates' own renderings, byte for byte. */
static void test_reference(void) {
    json_error_t je;
    json_t *j = json_load_file("tests/ref/chat-ref.json", 0, &je);
    CHECK(j != NULL, "cannot load tests/ref/chat-ref.json: %s", je.text);
    if (!j) return;
    const char *name;
    json_t *tv;
    int ntpl = 0, ncase = 0, nerr = 0;
    json_object_foreach(json_object_get(j, "templates"), name, tv) {
        const char *fam = json_string_value(json_object_get(tv, "family"));
        int want = -2, got = zs_chat_template_classify(json_string_value(json_object_get(tv, "text")));
        CHECK(fam && zs_chat_template_parse(fam, &want) == 0, "%s: family %s", name, fam ? fam : "(none)");
        CHECK(got == want, "%s: classified as %s, want %s", name, zs_chat_template_name(got), fam ? fam : "?");
        ntpl++;
    }
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(j, "cases"), i, c) {
        const char *tname = json_string_value(json_object_get(c, "template"));
        const char *fam = json_string_value(json_object_get(c, "family"));
        int t = -2;
        CHECK(fam && zs_chat_template_parse(fam, &t) == 0 && t >= 0, "case %zu: family", i);
        if (t < 0) continue;
        json_t *msgs = json_object_get(c, "messages");
        size_t n = json_array_size(msgs);
        zs_chat_msg m[16];
        CHECK(n >= 1 && n <= 16, "case %zu: %zu messages", i, n);
        if (n < 1 || n > 16) continue;
        for (size_t k = 0; k < n; k++) {
            m[k].role = json_string_value(json_object_get(json_array_get(msgs, k), "role"));
            m[k].content = json_string_value(json_object_get(json_array_get(msgs, k), "content"));
        }
        const char *bos = json_string_value(json_object_get(c, "bos"));
        const char *eos = json_string_value(json_object_get(c, "eos"));
        int gen = json_is_true(json_object_get(c, "gen"));
        const char *want = json_string_value(json_object_get(c, "text"));
        char *out = NULL;
        int rc = zs_chat_render(t, m, (int)n, gen, bos, eos, &out);
        if (want) {
            CHECK(rc == 0, "case %zu (%s): render failed: %s", i, tname, zs_errmsg());
            if (rc == 0)
                CHECK(!strcmp(out, want), "case %zu (%s, gen %d):\n got  [%s]\n want [%s]", i, tname, gen, out, want);
        } else {
            /* the template raised (roles that do not alternate): so must the renderer */
            CHECK_ERR(rc, "alternat");
            CHECK(json_string_value(json_object_get(c, "error")) != NULL, "case %zu: neither text nor error", i);
            nerr++;
        }
        free(out);
        ncase++;
    }
    CHECK(ntpl >= 6 && ncase >= 30 && nerr >= 3, "reference: %d templates, %d cases, %d errors", ntpl, ncase, nerr);
    json_decref(j);
}

static void test_names(void) {
    int t = 99;
    CHECK(zs_chat_template_parse("auto", &t) == 0 && t == -1, "auto");
    CHECK(zs_chat_template_parse("llama-2", &t) == 0 && t == ZS_CHAT_LLAMA2, "llama-2");
    CHECK(zs_chat_template_parse("llama-3", &t) == 0 && t == ZS_CHAT_LLAMA3, "llama-3");
    CHECK(zs_chat_template_parse("chatml", &t) == 0 && t == ZS_CHAT_CHATML, "chatml");
    CHECK(zs_chat_template_parse("plain", &t) == 0 && t == ZS_CHAT_PLAIN, "plain");
    CHECK(zs_chat_template_parse("gemma", &t) == 0 && t == ZS_CHAT_GEMMA, "gemma");
    CHECK(zs_chat_template_parse("phi3", &t) == 0 && t == ZS_CHAT_PHI3, "phi3");
    t = 42;
    CHECK_ERR(zs_chat_template_parse("llama2", &t), "unknown chat template", "llama2",
              "auto, plain, llama-2, llama-3, chatml, gemma or phi3");
    CHECK(t == 42, "out untouched");
    for (int i = 0; i < ZS_CHAT_COUNT; i++) {
        int back = -5;
        CHECK(zs_chat_template_parse(zs_chat_template_name(i), &back) == 0 && back == i, "round trip %d", i);
    }
}

/* Real-world template snippets (abridged from the published tokenizer_config.json files). */
static const char *k_llama2_tpl =
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = "
    "messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
    "{% for message in loop_messages %}{% if loop.index0 == 0 and system_message != false %}{% set content = "
    "'<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = "
    "message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + "
    "' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}"
    "{% endfor %}";
static const char *k_llama3_tpl =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 "
    "%}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";
static const char *k_chatml_tpl =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
    "'<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + "
    "message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}";
static const char *k_gemma_tpl =
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}"
    "{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | "
    "trim + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}";
static const char *k_phi3_tpl =
    "{% for message in messages %}{% if message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + "
    "'<|end|>\n'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}";
/* Phi-4: <|im_start|> with <|im_sep|>, not ChatML's layout, so plain. */
static const char *k_phi4_tpl =
    "{% for message in messages %}{% if (message['role'] == 'user') %}{{'<|im_start|>user<|im_sep|>' + "
    "message['content'] + '<|im_end|><|im_start|>assistant<|im_sep|>'}}{% elif (message['role'] == 'assistant') %}"
    "{{message['content'] + '<|im_end|>'}}{% endif %}{% endfor %}";
/* Phi-4-mini writes <|assistant|> and <|end|> but builds the user tag from the role: plain. */
static const char *k_phi4mini_tpl =
    "{% for message in messages %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% else %}{{ eos_token }}{% endif %}";
/* Mistral uses [INST] without <<SYS>>: not llama-2's format, so plain. */
static const char *k_mistral_tpl =
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] "
    "+ ' [/INST]' }}{% endif %}{% endfor %}";

static int write_cfg(const char *dir, const char *json_body) {
    char path[600];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    return tu_write_file(path, json_body, strlen(json_body));
}

static void test_detect(void) {
    char dir[512];
    if (tu_tmpdir(dir, sizeof dir, "chat") != 0) {
        CHECK(0, "cannot make a scratch directory");
        return;
    }
    CHECK(zs_chat_template_detect(dir) == ZS_CHAT_PLAIN, "no file -> plain");
    CHECK(zs_chat_template_detect(NULL) == ZS_CHAT_PLAIN, "NULL -> plain");
    struct {
        const char *tpl;
        int want;
    } cases[] = {
        {k_llama2_tpl, ZS_CHAT_LLAMA2},
        {k_llama3_tpl, ZS_CHAT_LLAMA3},
        {k_chatml_tpl, ZS_CHAT_CHATML},
        {k_mistral_tpl, ZS_CHAT_PLAIN},
        {k_gemma_tpl, ZS_CHAT_GEMMA},
        {k_phi3_tpl, ZS_CHAT_PHI3},
        {k_phi4_tpl, ZS_CHAT_PLAIN},
        {k_phi4mini_tpl, ZS_CHAT_PLAIN},
        {"{{ messages }}", ZS_CHAT_PLAIN},
    };
    for (int i = 0; i < N(cases); i++) {
        json_t *j = json_pack("{s:s,s:s,s:b}", "chat_template", cases[i].tpl, "bos_token", "<s>", "add_bos_token", 1);
        char *s = json_dumps(j, 0);
        json_decref(j);
        CHECK(write_cfg(dir, s) == 0, "write");
        free(s);
        int got = zs_chat_template_detect(dir);
        CHECK(got == cases[i].want, "case %d: detected %s, want %s", i, zs_chat_template_name(got),
              zs_chat_template_name(cases[i].want));
    }
    /* the list form: "default" wins */
    json_t *j = json_pack("{s:[{s:s,s:s},{s:s,s:s}]}", "chat_template", "name", "tool_use", "template", k_chatml_tpl,
                          "name", "default", "template", k_llama3_tpl);
    char *s = json_dumps(j, 0);
    json_decref(j);
    write_cfg(dir, s);
    free(s);
    CHECK(zs_chat_template_detect(dir) == ZS_CHAT_LLAMA3, "list form uses default");
    /* no chat_template key, but a chat_template.jinja file */
    write_cfg(dir, "{\"bos_token\": \"<s>\"}");
    CHECK(zs_chat_template_detect(dir) == ZS_CHAT_PLAIN, "no key -> plain");
    char path[600];
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    tu_write_file(path, k_chatml_tpl, strlen(k_chatml_tpl));
    CHECK(zs_chat_template_detect(dir) == ZS_CHAT_CHATML, "chat_template.jinja");
    /* malformed JSON falls back too (never fails) */
    write_cfg(dir, "{not json");
    CHECK(zs_chat_template_detect(dir) == ZS_CHAT_CHATML, "malformed config -> the .jinja file");
    unlink(path);
    CHECK(zs_chat_template_detect(dir) == ZS_CHAT_PLAIN, "malformed config -> plain");
    tu_rmdir(dir);

    /* the fixture model has no chat template */
    char model[512];
    tu_model_dir(model, sizeof model, "stories260K");
    CHECK(zs_chat_template_detect(model) == ZS_CHAT_PLAIN, "stories260K -> plain");
}

int main(void) {
    test_llama2();
    test_llama3();
    test_chatml_plain();
    test_gemma();
    test_phi3();
    test_strip();
    test_stops();
    test_names();
    test_detect();
    test_reference();
    return tu_finish("test-chat");
}
