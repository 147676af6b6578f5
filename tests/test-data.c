/* test-data.c — tests of the training data (engine/data.c): each example shape tokenized with
 * stories260K against hand-checked token ids and loss masks, chat examples (plain and llama-2
 * templates) checked against zs_chat_render, batching (targets, padding, truncation), seeded
 * deterministic shuffling with exact resume from a saved position, and every kind of bad input
 * (with the line number in the message), plus random corruption of a valid file. */
#include "data.h"

#include "chat.h"
#include "common.h"
#include "testutil.h"
#include "tokenizer.h"

#define N(a) ((int)(sizeof(a) / sizeof((a)[0])))

static char g_dir[512];
static zs_tokenizer *g_tok;

/* Writes text to <scratch>/name and returns the path (static buffer). */
static const char *put(const char *name, const char *text, size_t len) {
    static char p[700];
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    if (tu_write_file(p, text, len) != 0) fprintf(stderr, "cannot write %s\n", p);
    return p;
}

static zs_dataset *load_str(const char *text, int tmpl) {
    zs_data_opts o = {tmpl, 0, 0};
    zs_dataset *d = NULL;
    int rc = zs_data_load(put("d.jsonl", text, strlen(text)), g_tok, &o, &d);
    CHECK(rc == 0, "load failed: %s", zs_errmsg());
    return rc == 0 ? d : NULL;
}

static void expect_example(const zs_dataset *d, int i, const int32_t *want, const uint8_t *want_loss, int n,
                           const char *what) {
    const int32_t *t;
    const uint8_t *l;
    size_t nt;
    int rc = zs_data_example(d, i, &t, &l, &nt);
    CHECK(rc == 0, "%s: %s", what, zs_errmsg());
    if (rc) return;
    CHECK(nt == (size_t)n, "%s: %zu tokens, want %d", what, nt, n);
    for (int k = 0; k < n && k < (int)nt; k++) {
        CHECK(t[k] == want[k], "%s: token %d is %d, want %d", what, k, t[k], want[k]);
        CHECK(l[k] == want_loss[k], "%s: loss flag %d is %d, want %d", what, k, l[k], want_loss[k]);
    }
}

static void test_text_and_completion(void) {
    zs_dataset *d = load_str("{\"text\": \"Once upon a time\"}\n"
                             "{\"prompt\": \"Once upon a time\", \"completion\": \" there was\"}\n"
                             "{\"prompt\": \"Tom and his\", \"completion\": \" dog\", \"extra\": 1}\n"
                             "{\"text\": \"\"}\n",
                             ZS_CHAT_PLAIN);
    if (!d) return;
    CHECK(zs_data_count(d) == 4, "count %d", zs_data_count(d));
    /* "Once upon a time" = 1 403 407 261 378 (fixtures README); EOS 2 appended */
    int32_t t0[] = {1, 403, 407, 261, 378, 2};
    uint8_t l0[] = {0, 1, 1, 1, 1, 1};
    expect_example(d, 0, t0, l0, N(t0), "text");
    int32_t t1[] = {1, 403, 407, 261, 378, 383, 286, 2}; /* ▁there ▁was </s> */
    uint8_t l1[] = {0, 0, 0, 0, 0, 1, 1, 1};
    expect_example(d, 1, t1, l1, N(t1), "prompt/completion");
    /* "Tom and his dog" = 1 274 287 269 345 400 428 (fixtures README) */
    int32_t t2[] = {1, 274, 287, 269, 345, 400, 428, 2};
    uint8_t l2[] = {0, 0, 0, 0, 0, 1, 1, 1};
    expect_example(d, 2, t2, l2, N(t2), "prompt/completion 2");
    int32_t t3[] = {1, 2};
    uint8_t l3[] = {0, 1};
    expect_example(d, 3, t3, l3, N(t3), "empty text");
    zs_data_free(d);
    /* a token straddling the prompt/completion boundary ("▁time" of "ti" + "me") counts */
    d = load_str("{\"prompt\": \"Once upon a ti\", \"completion\": \"me there\"}\n", ZS_CHAT_PLAIN);
    if (d) {
        int32_t t4[] = {1, 403, 407, 261, 378, 383, 2};
        uint8_t l4[] = {0, 0, 0, 0, 1, 1, 1};
        expect_example(d, 0, t4, l4, N(t4), "straddling token");
        zs_data_free(d);
    }
    d = load_str("{\"text\": \"Once upon a time\"}\n"
                 "{\"prompt\": \"Once upon a time\", \"completion\": \" there was\"}\n"
                 "{\"prompt\": \"Tom and his\", \"completion\": \" dog\", \"extra\": 1}\n"
                 "{\"text\": \"\"}\n",
                 ZS_CHAT_PLAIN);
    if (!d) return;
    CHECK(zs_data_tokens(d) == 6 + 8 + 8 + 2, "tokens %zu", zs_data_tokens(d));
    CHECK(zs_data_max_len(d) == 8, "max_len %zu", zs_data_max_len(d));
    CHECK(zs_data_example(d, 4, NULL, NULL, NULL) == ZS_ERANGE, "example out of range");

    /* batches: file order is irrelevant, so look at one batch covering all 4 examples */
    int32_t tok[4 * 6], tgt[4 * 6];
    zs_data_pos pos = {7, 0, 0};
    int filled = 0;
    CHECK(zs_data_batches_per_epoch(d, 4) == 1 && zs_data_batches_per_epoch(d, 3) == 2, "batches per epoch");
    int rc = zs_data_next_batch(d, &pos, 4, 6, tok, tgt, &filled);
    CHECK(rc == 0 && filled == 4, "batch: %s", zs_errmsg());
    CHECK(pos.epoch == 1 && pos.index == 0, "pos after a full epoch (%d, %ld)", pos.epoch, pos.index);
    int seen = 0;
    for (int r = 0; r < 4; r++) {
        const int32_t *tk = tok + r * 6, *tg = tgt + r * 6;
        if (tk[1] == 403 && tk[5] == 2) { /* text: all count */
            int32_t wt[] = {403, 407, 261, 378, 2, -1};
            for (int k = 0; k < 6; k++) CHECK(tg[k] == wt[k], "text row target %d = %d", k, tg[k]);
            seen |= 1;
        } else if (tk[1] == 403) { /* prompt/completion truncated to T = 6: 1 403 407 261 378 383 | 286 */
            int32_t wk[] = {1, 403, 407, 261, 378, 383}, wt[] = {-1, -1, -1, -1, 383, 286};
            for (int k = 0; k < 6; k++)
                CHECK(tk[k] == wk[k] && tg[k] == wt[k], "pc row %d: %d %d", k, tk[k], tg[k]);
            seen |= 2;
        } else if (tk[1] == 274) {
            int32_t wt[] = {-1, -1, -1, -1, 400, 428};
            for (int k = 0; k < 6; k++) CHECK(tg[k] == wt[k], "tom row target %d = %d", k, tg[k]);
            seen |= 4;
        } else if (tk[0] == 1 && tk[1] == 2) {
            int32_t wk[] = {1, 2, 0, 0, 0, 0}, wt[] = {2, -1, -1, -1, -1, -1};
            for (int k = 0; k < 6; k++)
                CHECK(tk[k] == wk[k] && tg[k] == wt[k], "empty row %d: %d %d", k, tk[k], tg[k]);
            seen |= 8;
        }
    }
    CHECK(seen == 15, "rows seen %#x", seen);
    /* B larger than the data: padding rows */
    int32_t tok2[6 * 3], tgt2[6 * 3];
    pos = (zs_data_pos){7, 0, 0};
    rc = zs_data_next_batch(d, &pos, 6, 3, tok2, tgt2, &filled);
    CHECK(rc == 0 && filled == 4, "padded batch");
    for (int k = 4 * 3; k < 6 * 3; k++) CHECK(tok2[k] == 0 && tgt2[k] == -1, "padding row at %d", k);
    zs_data_free(d);
}

/* Encodes s without post-processing. */
static size_t enc(const char *s, int add_special, int32_t **ids) {
    size_t n = 0;
    *ids = NULL;
    CHECK(zs_tokenizer_encode(g_tok, s, strlen(s), add_special, ids, &n) == 0, "encode: %s", zs_errmsg());
    return n;
}

static void test_chat_plain(void) {
    zs_dataset *d = load_str("{\"messages\": [{\"role\": \"system\", \"content\": \"Be kind.\"},"
                             "{\"role\": \"user\", \"content\": \"hi\"},"
                             "{\"role\": \"assistant\", \"content\": \"hello\"},"
                             "{\"role\": \"user\", \"content\": \"and?\"},"
                             "{\"role\": \"assistant\", \"content\": \"bye\"}]}\n",
                             ZS_CHAT_PLAIN);
    if (!d) return;
    zs_chat_msg m[] = {{"system", "Be kind."}, {"user", "hi"}, {"assistant", "hello"}, {"user", "and?"},
                       {"assistant", "bye"}};
    char *r = NULL;
    CHECK(zs_chat_render(ZS_CHAT_PLAIN, m, N(m), 0, NULL, NULL, &r) == 0, "render");
    CHECK(r && !strcmp(r, "System: Be kind.\nUser: hi\nAssistant: hello\nUser: and?\nAssistant: bye\n"), "render %s",
          r);
    int32_t *full;
    size_t nf = enc(r, 1, &full);
    const int32_t *t;
    const uint8_t *l;
    size_t n;
    CHECK(zs_data_example(d, 0, &t, &l, &n) == 0, "example");
    /* = the rendered text's tokens with EOS (2) inserted after each assistant content, and only
     * the assistant content + EOS counted */
    CHECK(n == nf + 2, "chat tokens %zu, rendered %zu", n, nf);
    size_t j = 0;
    int eos_seen = 0;
    int32_t counted[64];
    int nc = 0;
    for (size_t i = 0; i < n; i++) {
        if (t[i] == 2) {
            eos_seen++;
            CHECK(l[i] == 1, "inserted EOS counted");
            counted[nc++] = -1;
            continue;
        }
        CHECK(j < nf && t[i] == full[j], "token %zu = %d, rendered %d", i, t[i], j < nf ? full[j] : -1);
        j++;
        if (l[i] && nc < 62) counted[nc++] = t[i];
    }
    CHECK(eos_seen == 2, "EOS count %d", eos_seen);
    /* counted: " hello" EOS " bye" EOS; compare with the encodings of the contents */
    int32_t *h, *b;
    size_t nh = enc("hello", 0, &h), nb = enc("bye", 0, &b); /* SentencePiece prefix gives "▁hello" */
    CHECK((size_t)nc == nh + nb + 2, "counted %d tokens, want %zu", nc, nh + nb + 2);
    if ((size_t)nc == nh + nb + 2) {
        CHECK(!memcmp(counted, h, nh * 4) && counted[nh] == -1, "first answer tokens");
        CHECK(!memcmp(counted + nh + 1, b, nb * 4) && counted[nc - 1] == -1, "second answer tokens");
    }
    /* hand-checked ids of "hello" after "Assistant:": ▁he ll o */
    int32_t wh[] = {281, 306, 414};
    CHECK(nh == 3 && !memcmp(h, wh, sizeof wh), "hello ids");
    /* the very last token is the rendered trailing "\n", not counted */
    CHECK(t[n - 1] == 13 && l[n - 1] == 0, "trailing newline masked");
    free(h);
    free(b);
    free(full);
    free(r);
    zs_data_free(d);
}

static void test_chat_llama2(void) {
    zs_dataset *d = load_str("{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
                             "{\"role\": \"user\", \"content\": \"Hi\"},"
                             "{\"role\": \"assistant\", \"content\": \" Hello \"},"
                             "{\"role\": \"user\", \"content\": \"More\"},"
                             "{\"role\": \"assistant\", \"content\": \"Bye\"}]}\n"
                             "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"},"
                             "{\"role\": \"assistant\", \"content\": \"\\u0001zs-data-answer-0\\u0001\"}]}\n",
                             ZS_CHAT_LLAMA2);
    if (!d) return;
    zs_chat_msg m[] = {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", " Hello "}, {"user", "More"},
                       {"assistant", "Bye"}};
    char *r = NULL;
    CHECK(zs_chat_render(ZS_CHAT_LLAMA2, m, N(m), 0, "<s>", "</s>", &r) == 0, "render");
    CHECK(r && !strcmp(r, "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello </s><s>[INST] More [/INST] Bye </s>"),
          "render %s", r);
    int32_t *full;
    size_t nf = enc(r, 0, &full); /* the template writes BOS itself */
    const int32_t *t;
    const uint8_t *l;
    size_t n;
    CHECK(zs_data_example(d, 0, &t, &l, &n) == 0, "example");
    CHECK(n == nf, "llama-2 tokens %zu, rendered %zu", n, nf);
    CHECK(t[0] == 1 && t[1] != 1, "exactly one BOS");
    /* counted runs: "▁He ll o ▁ </s>" = 346 306 414 410 2, then " Bye </s>" */
    int32_t run1[] = {346, 306, 414, 410, 2};
    int runs = 0;
    size_t i = 0;
    while (i < n && i < nf) {
        CHECK(t[i] == full[i], "token %zu", i);
        if (!l[i]) {
            i++;
            continue;
        }
        size_t s = i;
        while (i < n && l[i]) i++;
        runs++;
        if (runs == 1) {
            CHECK(i - s == 5 && !memcmp(t + s, run1, sizeof run1), "first answer run");
            CHECK(t[s - 1] == 509, "answer follows \"]\"");
        } else {
            char *txt = NULL;
            CHECK(zs_tokenizer_decode(g_tok, t + s, i - s, 0, &txt) == 0, "decode");
            CHECK(txt && !strcmp(txt, "Bye </s>"), "second answer run decodes to [%s]", txt);
            CHECK(i == n, "second answer ends the example");
            free(txt);
        }
    }
    CHECK(runs == 2, "%d answer runs", runs);
    /* content equal to the first marker candidate still works */
    CHECK(zs_data_example(d, 1, &t, &l, &n) == 0 && n > 4 && l[n - 1] == 1 && t[n - 1] == 2, "marker-like content");
    free(full);
    free(r);
    zs_data_free(d);

    /* a conversation with very many turns is refused (bounded work), not hung on */
    size_t cap = 1000 * 120 + 64, k = 0;
    char *many = malloc(cap);
    if (many) {
        k += (size_t)sprintf(many + k, "{\"text\": \"a\"}\n{\"messages\": [");
        for (int q = 0; q < 1000; q++)
            k += (size_t)sprintf(many + k, "%s{\"role\": \"%s\", \"content\": \"the dog and the cat ran %d\"}",
                                 q ? ", " : "", q % 2 ? "assistant" : "user", q);
        k += (size_t)sprintf(many + k, "]}\n");
        int rc = zs_data_load(put("many.jsonl", many, k), g_tok, NULL, &d);
        CHECK_ERR(rc, "line 2: conversation too long", "split");
        free(many);
    }
    /* llama-2 needs alternating roles: the error names the line */
    zs_data_opts o = {ZS_CHAT_LLAMA2, 0, 0};
    const char *bad = "{\"text\": \"ok\"}\n{\"messages\": [{\"role\": \"assistant\", \"content\": \"x\"}]}\n";
    int rc = zs_data_load(put("l2.jsonl", bad, strlen(bad)), g_tok, &o, &d);
    CHECK_ERR(rc, "line 2", "alternating");
}

/* Row signature for comparing batches: the example's first tokens. */
static int collect(zs_dataset *d, zs_data_pos *pos, int B, int T, int nbatches, int32_t *out_tok,
                   int32_t *out_tgt, int *fills) {
    for (int b = 0; b < nbatches; b++) {
        int rc = zs_data_next_batch(d, pos, B, T, out_tok + (size_t)b * B * T, out_tgt + (size_t)b * B * T, &fills[b]);
        if (rc) return rc;
    }
    return 0;
}

static void test_shuffle_resume(void) {
    char text[4096] = "";
    const char *words[] = {"Once", "Tom", "dog", "time", "upon", "his", "and", "was", "there", "a", "cat"};
    for (int i = 0; i < 11; i++) {
        char line[128];
        snprintf(line, sizeof line, "{\"text\": \"%s %s\"}\n", words[i], words[(i * 3 + 1) % 11]);
        strcat(text, line);
    }
    zs_dataset *d = load_str(text, ZS_CHAT_PLAIN), *d2 = load_str(text, ZS_CHAT_PLAIN);
    if (!d || !d2) {
        zs_data_free(d);
        zs_data_free(d2);
        return;
    }
    enum { B = 3, T = 8, NB = 12 }; /* 4 batches per epoch (3+3+3+2), 3 epochs */
    CHECK(zs_data_batches_per_epoch(d, B) == 4, "batches per epoch");
    static int32_t ta[NB * B * T], ga[NB * B * T], tb[NB * B * T], gb[NB * B * T];
    int fa[NB], fb[NB];
    zs_data_pos pa = {42, 0, 0}, pb = {42, 0, 0};
    CHECK(collect(d, &pa, B, T, NB, ta, ga, fa) == 0, "collect a: %s", zs_errmsg());
    CHECK(collect(d2, &pb, B, T, NB, tb, gb, fb) == 0, "collect b");
    CHECK(!memcmp(ta, tb, sizeof ta) && !memcmp(ga, gb, sizeof ga) && !memcmp(fa, fb, sizeof fa),
          "same seed -> same batches");
    CHECK(pa.epoch == 3 && pa.index == 0, "pos after 3 epochs (%d, %ld)", pa.epoch, pa.index);
    /* each epoch is a permutation: every example exactly once, the last batch partial */
    for (int e = 0; e < 3; e++) {
        int hits[11] = {0};
        for (int b = e * 4; b < e * 4 + 4; b++) {
            CHECK(fa[b] == (b % 4 == 3 ? 2 : 3), "fill of batch %d = %d", b, fa[b]);
            for (int r = 0; r < fa[b]; r++) {
                const int32_t *row = ta + ((size_t)b * B + r) * T;
                for (int x = 0; x < 11; x++) {
                    const int32_t *et;
                    size_t en;
                    zs_data_example(d, x, &et, NULL, &en);
                    if (!memcmp(row, et, (en < T ? en : T) * 4)) {
                        hits[x]++;
                        break;
                    }
                }
            }
        }
        for (int x = 0; x < 11; x++) CHECK(hits[x] == 1, "epoch %d: example %d seen %d times", e, x, hits[x]);
    }
    /* epochs are shuffled differently; a different seed gives a different order */
    CHECK(memcmp(ta, ta + 4 * B * T, 3 * B * T * 4) != 0, "epoch 1 order differs from epoch 0");
    zs_data_pos pc = {43, 0, 0};
    CHECK(collect(d2, &pc, B, T, 4, tb, gb, fb) == 0, "collect c");
    CHECK(memcmp(ta, tb, 4 * B * T * 4) != 0, "another seed -> another order");
    /* resume: restart from every saved position (mid-epoch and at epoch ends) on a fresh
     * dataset and get exactly the batches that followed */
    for (int k = 1; k < NB; k++) {
        zs_data_pos p = {42, 0, 0};
        CHECK(collect(d, &p, B, T, k, tb, gb, fb) == 0, "advance");
        zs_data_pos saved = p; /* what a checkpoint stores */
        zs_dataset *fresh = load_str(text, ZS_CHAT_PLAIN);
        if (!fresh) break;
        CHECK(collect(fresh, &saved, B, T, NB - k, tb, gb, fb) == 0, "resume");
        CHECK(!memcmp(tb, ta + (size_t)k * B * T, (size_t)(NB - k) * B * T * 4) &&
                  !memcmp(gb, ga + (size_t)k * B * T, (size_t)(NB - k) * B * T * 4) &&
                  !memcmp(fb, fa + k, (size_t)(NB - k) * sizeof(int)),
              "resume after %d batches", k);
        CHECK(saved.epoch == 3 && saved.index == 0, "resumed end position");
        zs_data_free(fresh);
    }
    /* index == count is the same as (epoch + 1, 0) */
    zs_data_pos pe = {42, 0, 11}, pf = {42, 1, 0};
    int f1, f2;
    CHECK(zs_data_next_batch(d, &pe, B, T, tb, gb, &f1) == 0 &&
              zs_data_next_batch(d2, &pf, B, T, tb + B * T, gb + B * T, &f2) == 0 &&
              !memcmp(tb, tb + B * T, B * T * 4) && pe.epoch == pf.epoch && pe.index == pf.index,
          "index == count");
    /* bad positions and shapes */
    zs_data_pos bad = {42, 0, 12};
    CHECK_ERR(zs_data_next_batch(d, &bad, B, T, tb, gb, &f1), "position");
    bad = (zs_data_pos){42, -1, 0};
    CHECK_ERR(zs_data_next_batch(d, &bad, B, T, tb, gb, &f1), "position");
    bad = (zs_data_pos){42, 0, 0};
    CHECK_ERR(zs_data_next_batch(d, &bad, 0, T, tb, gb, &f1), "batch shape");
    CHECK_ERR(zs_data_next_batch(d, &bad, B, 0, tb, gb, &f1), "batch shape");
    zs_data_free(d);
    zs_data_free(d2);

    /* max_examples loads the first ones only */
    zs_data_opts o = {ZS_CHAT_PLAIN, 0, 3};
    zs_dataset *d3 = NULL;
    CHECK(zs_data_load(put("m.jsonl", text, strlen(text)), g_tok, &o, &d3) == 0 && zs_data_count(d3) == 3,
          "max_examples");
    zs_data_free(d3);
}

/* validate_buf and load must both fail with all needles in the message. */
static void bad(const char *text, size_t len, const char *n1, const char *n2) {
    int n = -5;
    int rc = zs_data_validate_buf(text, len, 0, &n);
    CHECK_ERR(rc, n1, n2);
    CHECK(n == -5, "n_examples written on failure");
    zs_dataset *d = NULL;
    rc = zs_data_load(put("bad.jsonl", text, len), g_tok, NULL, &d);
    CHECK_ERR(rc, n1, n2);
    CHECK(d == NULL, "dataset on failure");
    rc = zs_data_validate(put("bad.jsonl", text, len), 0, &n);
    CHECK_ERR(rc, n1, n2);
}
#define BAD(s, n1, n2) bad(s, sizeof(s) - 1, n1, n2)

static void good(const char *text, size_t len, int want) {
    int n = -1;
    int rc = zs_data_validate_buf(text, len, 0, &n);
    CHECK(rc == 0 && n == want, "validate: rc %d n %d want %d: %s", rc, n, want, zs_errmsg());
    zs_dataset *d = NULL;
    rc = zs_data_load(put("good.jsonl", text, len), g_tok, NULL, &d);
    CHECK(rc == 0 && zs_data_count(d) == want, "load: %s", zs_errmsg());
    zs_data_free(d);
}
#define GOOD(s, n) good(s, sizeof(s) - 1, n)

static void test_bad_input(void) {
    const char *ok = "{\"text\": \"a\"}\n";
    BAD("", "file is empty", "");
    BAD("\n\n  \n", "file is empty", "");
    BAD("hello world\n", "line 1: not valid JSON", "column");
    BAD("{\"text\": \"a\"}\n{\"text\": \"a\"\n", "line 2: not valid JSON", "(column");
    BAD("{\"text\": \"a\"}\n{\"text\": \"a\"} x\n", "line 2: not valid JSON", "column");
    BAD("{\"text\": \"a\"}\n{\"text\": \"a\"}\n{\"text\": \"a\"}\n{\"text\": \"a\"}\n{\"text\": \"a\"}\n"
        "{\"text\": \"a\"}\n{\"prompt\": \"a\", \"completion\": 5}\n",
        "line 7: \"completion\" must be a string", "");
    BAD("{\"prompt\": 1, \"completion\": \"b\"}", "line 1: \"prompt\" must be a string", "");
    BAD("{\"prompt\": \"a\"}", "line 1: \"completion\" is missing", "");
    BAD("{\"completion\": \"a\"}", "line 1: \"prompt\" is missing", "");
    BAD("{\"text\": null}", "line 1: \"text\" must be a string", "");
    BAD("{\"foo\": \"a\"}", "line 1: expected one of {text}, {prompt, completion} or {messages}", "");
    BAD("{}", "line 1: expected one of", "");
    BAD("{\"text\": \"a\", \"messages\": []}", "line 1: more than one of", "");
    BAD("{\"text\": \"a\"}\n[1, 2]\n", "line 2: expected a JSON object", "array");
    BAD("\"just a string\"", "line 1: expected a JSON object", "string");
    BAD("42\n", "line 1: expected a JSON object", "number");
    BAD("{\"text\": \"a\"}\n{\"text\": \"\xff\"}\n", "line 2: invalid UTF-8", "column 11");
    BAD("{\"text\": \"\xc0\xaf\"}", "line 1: invalid UTF-8", "");          /* overlong */
    BAD("{\"text\": \"\xed\xa0\x80\"}", "line 1: invalid UTF-8", "");      /* surrogate */
    BAD("{\"text\": \"\xe2\x82\"}", "line 1: invalid UTF-8", "");          /* truncated */
    BAD("{\"text\": \"a\\u0000b\"}", "line 1: not valid JSON", "");        /* NUL in a string */
    BAD("{\"text\": \"a\x00\"}", "line 1: not valid JSON", "");            /* raw NUL byte */
    BAD("{\"text\": \"a\", \"text\": \"b\"}", "line 1: not valid JSON", "duplicate");
    BAD("{\"text\": \"a\"}\n\n{\"text\": \"a\"}\n", "line 2: empty line", "");
    BAD("{\"messages\": {}}", "line 1: \"messages\" must be an array", "");
    BAD("{\"messages\": []}", "line 1: \"messages\" must not be empty", "");
    BAD("{\"messages\": [1]}", "line 1: messages[0] must be an object", "");
    BAD("{\"text\": \"a\"}\n{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"bot\", "
        "\"content\": \"b\"}]}",
        "line 2: messages[1].role must be one of system, user, assistant", "");
    BAD("{\"messages\": [{\"content\": \"a\"}]}", "line 1: messages[0].role is missing", "");
    BAD("{\"messages\": [{\"role\": 3, \"content\": \"a\"}]}", "line 1: messages[0].role must be a string", "");
    BAD("{\"messages\": [{\"role\": \"user\"}]}", "line 1: messages[0].content is missing", "");
    BAD("{\"messages\": [{\"role\": \"assistant\", \"content\": [\"a\"]}]}",
        "line 1: messages[0].content must be a string", "");
    BAD("{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}]}", "line 1: \"messages\" has no assistant", "");
    /* size limit */
    int n = 0;
    CHECK_ERR(zs_data_validate_buf(ok, strlen(ok), 5, &n), "size limit");
    CHECK_ERR(zs_data_validate(put("s.jsonl", ok, strlen(ok)), 5, &n), "size limit");
    zs_data_opts o = {ZS_CHAT_PLAIN, 5, 0};
    zs_dataset *d = NULL;
    CHECK_ERR(zs_data_load(put("s.jsonl", ok, strlen(ok)), g_tok, &o, &d), "size limit");
    CHECK(zs_data_validate(put("s.jsonl", ok, strlen(ok)), strlen(ok), &n) == 0 && n == 1, "at the limit");
    /* files that are not there / not files */
    CHECK(zs_data_validate("/nonexistent/x.jsonl", 0, &n) == ZS_ENOTFOUND, "missing file");
    CHECK(zs_data_load(g_dir, g_tok, NULL, &d) < 0, "directory");
    o.chat_template = 99;
    CHECK_ERR(zs_data_load(put("s.jsonl", ok, strlen(ok)), g_tok, &o, &d), "chat template");
    /* deep nesting is refused by the parser, not a stack overflow */
    size_t deep = 200000;
    char *big = malloc(deep * 2 + 64);
    if (big) {
        size_t k = (size_t)sprintf(big, "{\"text\": \"a\", \"x\": ");
        for (size_t i = 0; i < deep; i++) big[k++] = '[';
        for (size_t i = 0; i < deep; i++) big[k++] = ']';
        big[k++] = '}';
        bad(big, k, "line 1: not valid JSON", "");
        free(big);
    }
    /* a huge line is fine when it is valid and under the limit */
    size_t hl = 3u << 20;
    char *huge = malloc(hl + 64);
    if (huge) {
        size_t k = (size_t)sprintf(huge, "{\"text\": \"a\"}\n{\"text\": \"");
        for (size_t i = 0; i < hl; i++) huge[k++] = "abc d"[i % 5];
        k += (size_t)sprintf(huge + k, "\"}\n");
        n = 0;
        CHECK(zs_data_validate_buf(huge, k, 0, &n) == 0 && n == 2, "huge line: %s", zs_errmsg());
        CHECK_ERR(zs_data_validate_buf(huge, k, 1u << 20, &n), "size limit");
        huge[k - 3] = 'x'; /* unterminated string in the huge line */
        CHECK_ERR(zs_data_validate_buf(huge, k, 0, &n), "line 2: not valid JSON");
        free(huge);
    }
    /* accepted variations: trailing empty lines, CRLF, BOM, no final newline, extra keys,
     * developer role, unicode */
    GOOD("{\"text\": \"a\"}\n\n\n", 1);
    GOOD("{\"text\": \"a\"}\r\n{\"prompt\": \"b\", \"completion\": \"c\"}\r\n", 2);
    GOOD("\xEF\xBB\xBF{\"text\": \"a\"}", 1);
    GOOD("{\"text\": \"caf\xc3\xa9 \xf0\x9f\x98\x80\", \"id\": 3}\n  {\"messages\": [{\"role\": \"developer\", "
         "\"content\": \"x\"}, {\"role\": \"user\", \"content\": \"\"}, {\"role\": \"assistant\", \"content\": \"\"}]}",
         2);
}

/* Random corruption of a valid file: must never crash (run under ASan/UBSan). */
static void test_fuzz(void) {
    const char *base = "{\"text\": \"Once upon a time\"}\n"
                       "{\"prompt\": \"Tom and\", \"completion\": \" his dog\"}\n"
                       "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", "
                       "\"content\": \"caf\xc3\xa9\"}]}\n";
    size_t len = strlen(base);
    char buf[512];
    uint64_t s = 12345;
    int ok = 0, fail = 0;
    for (int it = 0; it < 400; it++) {
        memcpy(buf, base, len);
        int edits = 1 + it % 4;
        for (int e = 0; e < edits; e++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            size_t at = (size_t)(s >> 33) % len;
            buf[at] = (char)(s >> 20);
        }
        size_t l = len - (size_t)(it % 7);
        int n = 0;
        int rc = zs_data_validate_buf(buf, l, 0, &n);
        zs_dataset *d = NULL;
        int tmpl = it % ZS_CHAT_COUNT;
        zs_data_opts o = {tmpl, 0, 0};
        int rc2 = zs_data_load(put("f.jsonl", buf, l), g_tok, &o, &d);
        if (rc2 == 0) {
            int32_t tk[2 * 16], tg[2 * 16];
            zs_data_pos p = {1, 0, 0};
            int f;
            for (int b = 0; b < 3; b++) CHECK(zs_data_next_batch(d, &p, 2, 16, tk, tg, &f) == 0, "fuzz batch");
            CHECK(rc == 0 && n == zs_data_count(d), "load ok but validate %d", rc);
        }
        if (rc == 0) ok++;
        else fail++;
        zs_data_free(d);
    }
    CHECK(ok > 0 && fail > 0, "fuzz ok %d fail %d", ok, fail);
}

int main(void) {
    char dir[512];
    tu_model_dir(dir, sizeof dir, "stories260K");
    if (zs_tokenizer_load(dir, &g_tok) != 0) {
        fprintf(stderr, "cannot load %s: %s\n", dir, zs_errmsg());
        return 1;
    }
    if (tu_tmpdir(g_dir, sizeof g_dir, "data") != 0) {
        fprintf(stderr, "cannot make a scratch directory\n");
        return 1;
    }
    CHECK(zs_chat_template_detect(dir) == ZS_CHAT_PLAIN, "stories260K has no chat template");
    test_text_and_completion();
    test_chat_plain();
    test_chat_llama2();
    test_shuffle_resume();
    test_bad_input();
    test_fuzz();
    zs_tokenizer_free(g_tok);
    tu_rmdir(g_dir);
    return tu_finish("test-data");
}
