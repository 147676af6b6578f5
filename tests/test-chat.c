/* test-chat.c — tests of the chat templates (engine/chat.c): every family against exact
 * expected strings (system prompts, multi-turn, generation prompt, stripping), bad roles, and
 * detection of the family from tokenizer_config.json / chat_template.jinja samples. */
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

static void test_names(void) {
    int t = 99;
    CHECK(zs_chat_template_parse("auto", &t) == 0 && t == -1, "auto");
    CHECK(zs_chat_template_parse("llama-2", &t) == 0 && t == ZS_CHAT_LLAMA2, "llama-2");
    CHECK(zs_chat_template_parse("llama-3", &t) == 0 && t == ZS_CHAT_LLAMA3, "llama-3");
    CHECK(zs_chat_template_parse("chatml", &t) == 0 && t == ZS_CHAT_CHATML, "chatml");
    CHECK(zs_chat_template_parse("plain", &t) == 0 && t == ZS_CHAT_PLAIN, "plain");
    t = 42;
    CHECK_ERR(zs_chat_template_parse("llama2", &t), "unknown chat template", "llama2");
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
    test_names();
    test_detect();
    return tu_finish("test-chat");
}
