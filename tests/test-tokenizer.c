/* test-tokenizer.c — tokenizer tests: exact ids for the GPT-2, stories260K and gpt2-bytes
 * fixtures, decode round trips, the streaming decoder, a synthetic Llama-3-style byte-level
 * tokenizer (regex differences from GPT-2), a Metaspace variant of the Llama-2 tokenizer,
 * malformed files, invalid input, speed on long text and concurrent encoding. */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "common.h"
#include "testutil.h"
#include "tokenizer.h"

static int ids_equal(const int32_t *a, size_t na, json_t *arr) {
    if (na != json_array_size(arr)) return 0;
    for (size_t i = 0; i < na; i++)
        if (a[i] != json_integer_value(json_array_get(arr, i))) return 0;
    return 1;
}

static int32_t *ids_from_json(json_t *arr, size_t *n) {
    *n = json_array_size(arr);
    int32_t *v = malloc((*n + 1) * sizeof *v);
    for (size_t i = 0; i < *n; i++) v[i] = (int32_t)json_integer_value(json_array_get(arr, i));
    return v;
}

static void print_ids(const char *label, const int32_t *ids, size_t n) {
    fprintf(stderr, "  %s:", label);
    for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
    fputc('\n', stderr);
}

/* Encodes text and compares with the expected list (terminated by -1). */
static void check_encode(const zs_tokenizer *t, const char *text, int add_special, const int32_t *want) {
    int32_t *ids = NULL;
    size_t n = 0, nw = 0;
    while (want[nw] >= 0) nw++;
    int rc = zs_tokenizer_encode(t, text, strlen(text), add_special, &ids, &n);
    CHECK(rc == 0, "encode \"%s\": %s", text, zs_errmsg());
    int same = rc == 0 && n == nw && (n == 0 || !memcmp(ids, want, n * sizeof *ids));
    CHECK(same, "encode \"%s\" gives wrong ids", text);
    if (!same) {
        print_ids("got ", ids, n);
        print_ids("want", want, nw);
    }
    free(ids);
}

/* Decodes through a zs_detok one id at a time; returns the malloc'd concatenation. */
static char *stream_decode(const zs_tokenizer *t, const int32_t *ids, size_t n, int skip) {
    zs_detok *d = NULL;
    if (zs_detok_new(t, skip, &d)) return NULL;
    size_t cap = 64, len = 0, k;
    char *all = malloc(cap), buf[256];
    all[0] = 0;
    for (size_t i = 0; i <= n; i++) {
        int rc = i < n ? zs_detok_push(d, ids[i], buf, sizeof buf, &k) : zs_detok_flush(d, buf, sizeof buf, &k);
        CHECK(rc == 0, "detok: %s", zs_errmsg());
        if (rc) break;
        CHECK(strlen(buf) == k, "detok: n_out %zu but strlen %zu", k, strlen(buf));
        while (len + k + 1 > cap) cap *= 2, all = realloc(all, cap);
        memcpy(all + len, buf, k + 1);
        len += k;
    }
    zs_detok_free(d);
    return all;
}

static void check_stream_equals_decode(const zs_tokenizer *t, const int32_t *ids, size_t n, int skip,
                                       const char *label) {
    char *full = NULL;
    int rc = zs_tokenizer_decode(t, ids, n, skip, &full);
    CHECK(rc == 0, "%s: decode: %s", label, zs_errmsg());
    char *st = stream_decode(t, ids, n, skip);
    CHECK(full && st && !strcmp(full, st), "%s: stream \"%s\" != decode \"%s\"", label, st ? st : "?",
          full ? full : "?");
    free(full);
    free(st);
}

static zs_tokenizer *load_fixture(const char *name) {
    char dir[4096];
    zs_tokenizer *t = NULL;
    int rc = zs_tokenizer_load(tu_model_dir(dir, sizeof dir, name), &t);
    CHECK(rc == 0, "load %s: %s", name, zs_errmsg());
    return rc ? NULL : t;
}

/* ------------------------------------------------------------------ gpt2-tokenizer */

static void test_gpt2(const zs_tokenizer *t) {
    char dir[4096];
    json_t *ref = tu_load_reference(tu_model_dir(dir, sizeof dir, "gpt2-tokenizer"));
    CHECK(ref != NULL, "gpt2-tokenizer reference.json");
    if (!ref) return;
    CHECK(zs_tokenizer_vocab_size(t) == 50257, "vocab size %d", zs_tokenizer_vocab_size(t));
    CHECK(zs_tokenizer_bos(t) == -1 && zs_tokenizer_eos(t) == -1, "gpt2 has no bos/eos in the fixture");
    CHECK(zs_tokenizer_is_special(t, 50256), "<|endoftext|> is special");
    CHECK(zs_tokenizer_token_id(t, "\xc4\xa0the") == 262, "Ġthe id %d", zs_tokenizer_token_id(t, "\xc4\xa0the"));
    json_t *cases = json_object_get(ref, "cases"), *c;
    size_t i;
    json_array_foreach(cases, i, c) {
        const char *text = json_string_value(json_object_get(c, "text"));
        json_t *want = json_object_get(c, "ids"), *toks = json_object_get(c, "tokens");
        for (int add = 0; add <= 1; add++) {
            int32_t *ids = NULL;
            size_t n = 0;
            int rc = zs_tokenizer_encode(t, text, strlen(text), add, &ids, &n);
            CHECK(rc == 0, "encode: %s", zs_errmsg());
            int ok = rc == 0 && ids_equal(ids, n, want);
            CHECK(ok, "gpt2 case %zu \"%s\" (add_special %d)", i, text, add);
            if (!ok) print_ids("got", ids, n);
            if (add == 0 && ok) {
                for (size_t k = 0; k < n; k++) {
                    const char *p = zs_tokenizer_piece(t, ids[k]);
                    CHECK(p && !strcmp(p, json_string_value(json_array_get(toks, k))), "piece of %d", ids[k]);
                }
                char *s = NULL;
                rc = zs_tokenizer_decode(t, ids, n, 0, &s);
                CHECK(rc == 0 && !strcmp(s, text), "gpt2 decode case %zu: \"%s\"", i, s ? s : zs_errmsg());
                free(s);
                check_stream_equals_decode(t, ids, n, 0, text);
            }
            free(ids);
        }
    }
    /* skip_special drops <|endoftext|> */
    int32_t eot[] = {15496, 50256, 995};
    char *s = NULL;
    CHECK(zs_tokenizer_decode(t, eot, 3, 1, &s) == 0 && !strcmp(s, "Hello world"), "skip_special: %s", s);
    free(s);
    json_decref(ref);
}

/* ------------------------------------------------------------------ model fixtures */

static void test_model_fixture(const zs_tokenizer *t, const char *name) {
    char dir[4096];
    json_t *ref = tu_load_reference(tu_model_dir(dir, sizeof dir, name));
    CHECK(ref != NULL, "%s reference.json", name);
    if (!ref) return;
    json_t *c;
    size_t i;
    json_array_foreach(json_object_get(ref, "cases"), i, c) {
        const char *prompt = json_string_value(json_object_get(c, "prompt"));
        const char *text = json_string_value(json_object_get(c, "text"));
        int32_t *ids = NULL;
        size_t n = 0;
        int rc = zs_tokenizer_encode(t, prompt, strlen(prompt), 1, &ids, &n);
        int ok = rc == 0 && ids_equal(ids, n, json_object_get(c, "prompt_ids"));
        CHECK(ok, "%s: prompt \"%s\" ids (%s)", name, prompt, zs_errmsg());
        if (!ok) print_ids("got", ids, n);
        free(ids);
        int32_t *all = ids_from_json(json_object_get(c, "all_ids"), &n);
        char *s = NULL;
        rc = zs_tokenizer_decode(t, all, n, 1, &s);
        CHECK(rc == 0 && !strcmp(s, text), "%s: decode all_ids: \"%s\"", name, s ? s : zs_errmsg());
        free(s);
        check_stream_equals_decode(t, all, n, 1, name);
        check_stream_equals_decode(t, all, n, 0, name);
        free(all);
    }
    json_decref(ref);
}

static void test_stories_extra(const zs_tokenizer *t) {
    CHECK(zs_tokenizer_vocab_size(t) == 512, "stories vocab %d", zs_tokenizer_vocab_size(t));
    CHECK(zs_tokenizer_bos(t) == 1 && zs_tokenizer_eos(t) == 2, "bos %d eos %d", zs_tokenizer_bos(t),
          zs_tokenizer_eos(t));
    CHECK(zs_tokenizer_is_eos(t, 2) && !zs_tokenizer_is_eos(t, 1), "is_eos");
    CHECK(zs_tokenizer_is_special(t, 0) && zs_tokenizer_is_special(t, 1) && !zs_tokenizer_is_special(t, 300),
          "is_special");
    CHECK(!strcmp(zs_tokenizer_piece(t, 13), "<0x0A>"), "piece 13");
    CHECK(zs_tokenizer_piece(t, 512) == NULL && zs_tokenizer_piece(t, -1) == NULL, "piece out of range");
    CHECK(zs_tokenizer_token_id(t, "<s>") == 1 && zs_tokenizer_token_id(t, "nope!") == -1, "token_id");
    check_encode(t, "Once upon a time", 1, (const int32_t[]){1, 403, 407, 261, 378, -1});
    check_encode(t, "Tom and his dog", 1, (const int32_t[]){1, 274, 287, 269, 345, 400, 428, -1});
    check_encode(t, "Once upon a time", 0, (const int32_t[]){403, 407, 261, 378, -1});
    check_encode(t, "", 1, (const int32_t[]){1, -1});
    check_encode(t, "a\nb", 0, (const int32_t[]){zs_tokenizer_token_id(t, "\xe2\x96\x81" "a"), 13,
                                                 zs_tokenizer_token_id(t, "b"), -1});
    /* literal special tokens become their ids */
    int32_t *ids = NULL;
    size_t n = 0;
    const char *s = "Hi</s><s>";
    CHECK(zs_tokenizer_encode(t, s, strlen(s), 0, &ids, &n) == 0 && n >= 3 && ids[n - 2] == 2 && ids[n - 1] == 1,
          "literal specials");
    free(ids);
}

static void test_gpt2_bytes(const zs_tokenizer *t) {
    CHECK(zs_tokenizer_vocab_size(t) == 256, "vocab %d", zs_tokenizer_vocab_size(t));
    CHECK(zs_tokenizer_bos(t) == -1 && zs_tokenizer_eos(t) == -1, "no bos/eos");
    const char *s = "h\xc3\xa9 \xe6\x97\xa5!"; /* hé 日! */
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = zs_tokenizer_encode(t, s, strlen(s), 1, &ids, &n);
    int ok = rc == 0 && n == strlen(s);
    for (size_t i = 0; ok && i < n; i++) ok = ids[i] == (unsigned char)s[i];
    CHECK(ok, "gpt2-bytes: id == byte value");
    free(ids);
}

/* ------------------------------------------------------------------ streaming */

static void test_stream_multibyte(const zs_tokenizer *gpt2, const zs_tokenizer *stories, const zs_tokenizer *bytes) {
    const char *text = "Caf\xc3\xa9 na\xc3\xafve \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xf0\x9f\x98\x80\xf0\x9f\x91\x8d"
                       "\xf0\x9f\x8f\xbd \xc3\x9f end";
    const zs_tokenizer *ts[3] = {gpt2, stories, bytes};
    for (int k = 0; k < 3; k++) {
        if (!ts[k]) continue;
        int32_t *ids = NULL;
        size_t n = 0;
        int rc = zs_tokenizer_encode(ts[k], text, strlen(text), 1, &ids, &n);
        CHECK(rc == 0, "encode multibyte: %s", zs_errmsg());
        char *full = NULL;
        CHECK(zs_tokenizer_decode(ts[k], ids, n, 1, &full) == 0 && !strcmp(full, text), "multibyte round trip %d: %s",
              k, full);
        free(full);
        check_stream_equals_decode(ts[k], ids, n, 1, "multibyte");
        check_stream_equals_decode(ts[k], ids, n, 0, "multibyte");
        free(ids);
    }
    /* stories260K: 日 is not a piece, so it is three byte-fallback tokens; the first two emit nothing */
    if (stories) {
        int32_t *ids = NULL;
        size_t n = 0;
        const char *ri = "\xe6\x97\xa5";
        CHECK(zs_tokenizer_encode(stories, ri, 3, 0, &ids, &n) == 0 && n >= 3, "encode 日");
        if (n >= 3) {
            CHECK(ids[n - 3] == 3 + 0xE6 && ids[n - 2] == 3 + 0x97 && ids[n - 1] == 3 + 0xA5, "byte fallback ids");
            zs_detok *d = NULL;
            char buf[64];
            size_t k = 99, total = 0;
            CHECK(zs_detok_new(stories, 1, &d) == 0, "detok_new");
            for (size_t i = 0; i + 3 < n; i++) {
                zs_detok_push(d, ids[i], buf, sizeof buf, &k);
                total += k;
            }
            CHECK(zs_detok_push(d, ids[n - 3], buf, sizeof buf, &k) == 0 && k == 0 && buf[0] == 0, "mid-char push 1");
            CHECK(zs_detok_push(d, ids[n - 2], buf, sizeof buf, &k) == 0 && k == 0, "mid-char push 2");
            CHECK(zs_detok_push(d, ids[n - 1], buf, sizeof buf, &k) == 0 && k == 3 && !strcmp(buf, ri),
                  "completing push gives the char (%zu bytes)", k);
            CHECK(total == 0, "leading '▁' piece alone gives nothing after strip (%zu)", total);
            zs_detok_free(d);
        }
        free(ids);
    }
    /* gpt2-bytes (id == byte): invalid and truncated sequences give U+FFFD, in stream and in full */
    if (bytes) {
        int32_t seqs[][6] = {
            {0xE6, 0x97, 0xA5, 'a', -1},        /* 日a */
            {0xFF, 'a', -1},                    /* invalid byte */
            {0xE6, 'a', -1},                    /* truncated then ASCII */
            {'a', 0xE6, 0x97, -1},              /* truncated at end (flush) */
            {0xED, 0xA0, 0x80, -1},             /* surrogate: each byte invalid */
            {0xF0, 0x9F, 0x98, 0x80, 0x80, -1}, /* emoji + stray continuation */
        };
        const char *want[] = {"\xe6\x97\xa5" "a", "\xef\xbf\xbd" "a", "\xef\xbf\xbd" "a", "a\xef\xbf\xbd",
                              "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", "\xf0\x9f\x98\x80\xef\xbf\xbd"};
        for (int s = 0; s < 6; s++) {
            size_t n = 0;
            while (seqs[s][n] >= 0) n++;
            char *full = NULL;
            CHECK(zs_tokenizer_decode(bytes, seqs[s], n, 0, &full) == 0 && !strcmp(full, want[s]), "invalid seq %d", s);
            free(full);
            check_stream_equals_decode(bytes, seqs[s], n, 0, "invalid seq");
        }
        zs_detok *d = NULL;
        char buf[8];
        size_t k = 0;
        CHECK(zs_detok_new(bytes, 0, &d) == 0, "detok_new");
        CHECK(zs_detok_push(d, 0xE6, buf, sizeof buf, &k) == 0 && k == 0, "partial push");
        CHECK(zs_detok_push(d, 0x97, buf, sizeof buf, &k) == 0 && k == 0, "partial push 2");
        int rc = zs_detok_push(d, 0xA5, buf, 3, &k); /* needs 4 (3 + NUL) */
        CHECK_ERR(rc, "too small");
        CHECK(rc == ZS_ERANGE, "ERANGE for small buffer");
        CHECK(zs_detok_push(d, 0xA5, buf, 4, &k) == 0 && k == 3 && !strcmp(buf, "\xe6\x97\xa5"), "retry after ERANGE");
        rc = zs_detok_push(d, 256, buf, sizeof buf, &k);
        CHECK_ERR(rc, "out of range");
        CHECK(zs_detok_flush(d, buf, sizeof buf, &k) == 0 && k == 0, "flush empty");
        zs_detok_free(d);
    }
}

/* ------------------------------------------------------------------ synthetic Llama-3 */

static uint32_t b2u(int b) {
    int n = 0;
    for (int c = 0; c < 256; c++) {
        int printable = (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255);
        if (c == b) return printable ? (uint32_t)c : 256u + (uint32_t)n;
        if (!printable) n++;
    }
    return 0;
}

static void utf8(uint32_t cp, char *o) {
    if (cp < 0x80) o[0] = (char)cp, o[1] = 0;
    else o[0] = (char)(0xC0 | (cp >> 6)), o[1] = (char)(0x80 | (cp & 0x3F)), o[2] = 0;
}

static int write_json(const char *dir, const char *name, json_t *j) {
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    int rc = json_dump_file(j, p, JSON_INDENT(1));
    json_decref(j);
    return rc;
}

static const char *k_llama3_re =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static void test_llama3(void) {
    char dir[4096];
    CHECK(tu_tmpdir(dir, sizeof dir, "tok-llama3") == 0, "tmpdir");
    json_t *vocab = json_object();
    for (int b = 0; b < 256; b++) {
        char s[4];
        utf8(b2u(b), s);
        json_object_set_new(vocab, s, json_integer(b));
    }
    /* merges (rank order) and the extra pieces; "xyz" is reachable only through ignore_merges */
    const char *merges[][2] = {{"3", "4"}, {"1", "2"}, {"12", "3"}, {"I", "T"}, {"'", "S"},
                               {"\xc4\xa0", "\xc4\x8a"}, {".", "\xc4\x8a"}, {"h", "i"}};
    json_t *jm = json_array();
    int id = 256;
    for (int i = 0; i < 8; i++) {
        char s[16];
        snprintf(s, sizeof s, "%s%s", merges[i][0], merges[i][1]);
        json_object_set_new(vocab, s, json_integer(id++)); /* 256 "34" 257 "12" 258 "123" 259 "IT" 260 "'S"
                                                              261 "ĠĊ" 262 ".Ċ" 263 "hi" */
        json_array_append_new(jm, json_pack("[s,s]", merges[i][0], merges[i][1]));
    }
    json_object_set_new(vocab, "xyz", json_integer(264));
    json_t *tj = json_pack(
        "{s:s, s:[{s:i,s:s,s:b,s:b,s:b,s:b,s:b}, {s:i,s:s,s:b,s:b,s:b,s:b,s:b}, {s:i,s:s,s:b,s:b,s:b,s:b,s:b}],"
        " s:n, s:{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, {s:s, s:b, s:b, s:b}]},"
        " s:{s:s, s:[{s:s, s:b, s:b, s:b}, {s:s, s:[{s:{s:s,s:i}}, {s:{s:s,s:i}}], s:[], s:{s:{s:s,s:[i],s:[s]}}}]},"
        " s:{s:s, s:b, s:b, s:b},"
        " s:{s:s, s:n, s:b, s:b, s:b, s:o, s:o}}",
        "version", "1.0", "added_tokens",
        "id", 300, "content", "<|begin_of_text|>", "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0, "special", 1,
        "id", 301, "content", "<|eot_id|>", "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0, "special", 1,
        "id", 302, "content", "<|end_of_text|>", "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0, "special", 1,
        "normalizer",
        "pre_tokenizer", "type", "Sequence", "pretokenizers",
        "type", "Split", "pattern", "Regex", k_llama3_re, "behavior", "Isolated", "invert", 0,
        "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 0,
        "post_processor", "type", "Sequence", "processors",
        "type", "ByteLevel", "add_prefix_space", 1, "trim_offsets", 0, "use_regex", 1,
        "type", "TemplateProcessing", "single", "SpecialToken", "id", "<|begin_of_text|>", "type_id", 0,
        "Sequence", "id", "A", "type_id", 0, "pair", "special_tokens", "<|begin_of_text|>", "id", "<|begin_of_text|>",
        "ids", 300, "tokens", "<|begin_of_text|>",
        "decoder", "type", "ByteLevel", "add_prefix_space", 1, "trim_offsets", 1, "use_regex", 1,
        "model", "type", "BPE", "dropout", "fuse_unk", 0, "byte_fallback", 0, "ignore_merges", 1, "vocab", vocab,
        "merges", jm);
    CHECK(tj != NULL, "json_pack of the Llama-3 tokenizer.json");
    if (!tj) return;
    CHECK(write_json(dir, "tokenizer.json", tj) == 0, "write tokenizer.json");
    CHECK(write_json(dir, "config.json", json_pack("{s:i,s:i}", "bos_token_id", 300, "eos_token_id", 302)) == 0, "cfg");
    CHECK(write_json(dir, "generation_config.json", json_pack("{s:i,s:[i,i]}", "bos_token_id", 300, "eos_token_id",
                                                              301, 302)) == 0, "gen cfg");
    zs_tokenizer *t = NULL;
    int rc = zs_tokenizer_load(dir, &t);
    CHECK(rc == 0, "load synthetic llama3: %s", zs_errmsg());
    if (rc == 0) {
        CHECK(zs_tokenizer_vocab_size(t) == 303, "vocab %d", zs_tokenizer_vocab_size(t));
        CHECK(zs_tokenizer_bos(t) == 300 && zs_tokenizer_eos(t) == 301, "bos %d eos %d", zs_tokenizer_bos(t),
              zs_tokenizer_eos(t));
        CHECK(zs_tokenizer_is_eos(t, 301) && zs_tokenizer_is_eos(t, 302) && !zs_tokenizer_is_eos(t, 300), "eos set");
        /* \p{N}{1,3}: "1234" is "123" "4" (GPT-2 would keep one word and merge "3 4" first) */
        check_encode(t, "1234", 0, (const int32_t[]){258, '4', -1});
        check_encode(t, "12345678", 0, (const int32_t[]){258, '4', '5', '6', '7', '8', -1});
        /* (?i:'s): "'S" is one word (GPT-2: "'" then "S") */
        check_encode(t, "IT'S", 0, (const int32_t[]){259, 260, -1});
        /* \s*[\r\n]+ keeps spaces with the newline: "a", "  \n", "b" */
        check_encode(t, "a  \nb", 0, (const int32_t[]){'a', ' ', 261, 'b', -1});
        /* punctuation takes trailing newlines: "x", ".\n\n", "y" */
        check_encode(t, "x.\n\ny", 0, (const int32_t[]){'x', 262, '\n', 'y', -1});
        /* [^\r\n\p{L}\p{N}]?\p{L}+ : "(hi" is one word, " hi" too */
        check_encode(t, "(hi hi", 0, (const int32_t[]){'(', 263, ' ', 263, -1});
        /* ignore_merges: a word in the vocab is one token even without a merge path */
        check_encode(t, "xyz xyz", 0, (const int32_t[]){264, ' ', 'x', 'y', 'z', -1});
        /* template adds <|begin_of_text|>; literal specials are matched */
        check_encode(t, "hi<|eot_id|>", 1, (const int32_t[]){300, 263, 301, -1});
        const char *rt = "It's 2024!\n\n  caf\xc3\xa9 \xe6\x97\xa5\r\n";
        int32_t *ids = NULL;
        size_t n = 0;
        CHECK(zs_tokenizer_encode(t, rt, strlen(rt), 1, &ids, &n) == 0, "encode rt");
        char *s = NULL;
        CHECK(zs_tokenizer_decode(t, ids, n, 1, &s) == 0 && !strcmp(s, rt), "llama3 round trip: %s", s);
        free(s);
        s = NULL;
        CHECK(zs_tokenizer_decode(t, ids, n, 0, &s) == 0 && !strncmp(s, "<|begin_of_text|>It's", 21), "no skip: %s", s);
        free(s);
        check_stream_equals_decode(t, ids, n, 0, "llama3");
        free(ids);
        int32_t hole = 280;
        rc = zs_tokenizer_decode(t, &hole, 1, 0, &s);
        CHECK_ERR(rc, "280", "no token");
        zs_tokenizer_free(t);
    }
    tu_rmdir(dir);
}

/* ------------------------------------------------------------------ Metaspace variant of stories260K */

static void test_metaspace(void) {
    char src[4096], dir[4096], p[4200];
    tu_model_dir(src, sizeof src, "stories260K");
    snprintf(p, sizeof p, "%s/tokenizer.json", src);
    json_t *tj = json_load_file(p, 0, NULL);
    CHECK(tj != NULL, "load stories tokenizer.json");
    if (!tj || tu_tmpdir(dir, sizeof dir, "tok-meta")) return;
    json_object_set_new(tj, "normalizer", json_null());
    json_object_set_new(tj, "pre_tokenizer", json_pack("{s:s,s:s,s:s,s:b}", "type", "Metaspace", "replacement",
                                                       "\xe2\x96\x81", "prepend_scheme", "first", "split", 0));
    /* byte tokens first, then the Metaspace decoder (▁ -> space, strip the leading one) */
    json_object_set_new(tj, "decoder", json_pack("{s:s,s:[{s:s},{s:s},{s:s,s:s,s:s,s:b}]}", "type", "Sequence",
                                                 "decoders", "type", "ByteFallback", "type", "Fuse", "type",
                                                 "Metaspace", "replacement", "\xe2\x96\x81", "prepend_scheme",
                                                 "first", "split", 0));
    CHECK(write_json(dir, "tokenizer.json", tj) == 0, "write");
    zs_tokenizer *t = NULL;
    int rc = zs_tokenizer_load(dir, &t); /* no tokenizer_config: the template adds <s> */
    CHECK(rc == 0, "load metaspace variant: %s", zs_errmsg());
    if (rc == 0) {
        test_model_fixture(t, "stories260K");
        check_encode(t, "Tom and his dog", 1, (const int32_t[]){1, 274, 287, 269, 345, 400, 428, -1});
        zs_tokenizer_free(t);
    }
    tu_rmdir(dir);
}

/* ------------------------------------------------------------------ malformed input */

static int load_text(const char *dir, const char *json, zs_tokenizer **t) {
    char p[4200];
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    if (json) tu_write_file(p, json, strlen(json));
    else unlink(p);
    *t = NULL;
    return zs_tokenizer_load(dir, t);
}

static void test_bad_input(const zs_tokenizer *stories) {
    char dir[4096];
    CHECK(tu_tmpdir(dir, sizeof dir, "tok-bad") == 0, "tmpdir");
    zs_tokenizer *t = NULL;
    int rc = load_text(dir, NULL, &t);
    CHECK_ERR(rc, "tokenizer.json", "no such file");
    CHECK(rc == ZS_ENOTFOUND && t == NULL, "missing file: ENOTFOUND");
    rc = load_text(dir, "{\"model\": {\"type\": \"BPE\",", &t);
    CHECK_ERR(rc, "tokenizer.json", "not valid JSON");
    rc = load_text(dir, "[1, 2]", &t);
    CHECK_ERR(rc, "tokenizer.json", "not a JSON object");
    rc = load_text(dir, "{\"model\": {\"type\": \"Unigram\", \"vocab\": [[\"a\", 0.0]]}}", &t);
    CHECK_ERR(rc, "tokenizer.json", "Unigram", "not supported");
    CHECK(rc == ZS_EUNSUPPORTED, "Unigram: EUNSUPPORTED");
    rc = load_text(dir, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, "
                        "\"merges\": [\"a b\", \"a c\"]}}", &t);
    CHECK_ERR(rc, "tokenizer.json", "merges[1]", "\"c\" is not in the vocab");
    rc = load_text(dir, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [[\"a\", \"b\"]]}}",
                   &t);
    CHECK_ERR(rc, "tokenizer.json", "merged token \"ab\" is not in the vocab");
    rc = load_text(dir, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"ab\"]}}", &t);
    CHECK_ERR(rc, "tokenizer.json", "merges[0]", "two tokens");
    rc = load_text(dir, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 0}, \"merges\": []}}", &t);
    CHECK_ERR(rc, "tokenizer.json", "id 0 is used by both");
    rc = load_text(dir, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": -3}, \"merges\": []}}", &t);
    CHECK_ERR(rc, "tokenizer.json", "\"b\"", "-3 out of range");
    rc = load_text(dir, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 99999999}, \"merges\": []}}", &t);
    CHECK_ERR(rc, "tokenizer.json", "99999999 out of range");
    rc = load_text(dir, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": \"x\"}, \"merges\": []}}", &t);
    CHECK_ERR(rc, "tokenizer.json", "not an integer");
    rc = load_text(dir, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, "
                        "\"added_tokens\": [{\"id\": -1, \"content\": \"<x>\"}]}", &t);
    CHECK_ERR(rc, "tokenizer.json", "added_tokens[0]", "out of range");
    rc = load_text(dir, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, \"pre_tokenizer\": "
                        "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\w+|\\\\d\"}, \"behavior\": \"Isolated\"}}", &t);
    CHECK_ERR(rc, "tokenizer.json", "\\w+|\\d", "not supported");
    CHECK(rc == ZS_EUNSUPPORTED, "unknown regex: EUNSUPPORTED");
    rc = load_text(dir, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, \"normalizer\": "
                        "{\"type\": \"Lowercase\"}}", &t);
    CHECK_ERR(rc, "tokenizer.json", "normalizer \"Lowercase\"");
    /* a valid tokenizer.json with a broken tokenizer_config.json */
    char p[4200];
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    tu_write_file(p, "{\"eos_token\": 5}", strlen("{\"eos_token\": 5}"));
    rc = load_text(dir, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}", &t);
    CHECK_ERR(rc, "tokenizer_config.json", "eos_token");
    tu_write_file(p, "{\"eos_token\": \"</s>\"}", strlen("{\"eos_token\": \"</s>\"}"));
    rc = load_text(dir, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}", &t);
    CHECK_ERR(rc, "tokenizer_config.json", "\"</s>\" is not in the vocab");
    unlink(p);
    snprintf(p, sizeof p, "%s/config.json", dir);
    tu_write_file(p, "{\"eos_token_id\": [0, 7]}", strlen("{\"eos_token_id\": [0, 7]}"));
    rc = load_text(dir, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}", &t);
    CHECK_ERR(rc, "config.json", "eos_token_id 7 is out of range");
    tu_write_file(p, "{\"eos_token_id\": null}", strlen("{\"eos_token_id\": null}"));
    rc = load_text(dir, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}", &t);
    CHECK(rc == 0 && zs_tokenizer_eos(t) == -1, "null eos: %s", zs_errmsg());
    if (t) {
        /* a char not in the vocab (no unk, no byte fallback) is dropped, as Hugging Face does */
        int32_t *ids = NULL;
        size_t n = 9;
        CHECK(zs_tokenizer_encode(t, "ab", 2, 1, &ids, &n) == 0 && n == 1 && ids[0] == 0, "unknown dropped");
        free(ids);
        zs_tokenizer_free(t);
    }
    tu_rmdir(dir);

    if (!stories) return;
    int32_t *ids = (int32_t *)0x1;
    size_t n = 77;
    const char *bad[] = {"abc\xff", "\xc3", "a\xed\xa0\x80z", "\xc0\xaf", "\xf4\x90\x80\x80"};
    for (int i = 0; i < 5; i++) {
        rc = zs_tokenizer_encode(stories, bad[i], strlen(bad[i]), 1, &ids, &n);
        CHECK_ERR(rc, "invalid UTF-8 at byte");
        CHECK(rc == ZS_EINVAL && ids == (int32_t *)0x1 && n == 77, "out-params untouched on error");
    }
    int32_t oob[] = {1, 512}, neg[] = {-1};
    char *s = (char *)0x1;
    rc = zs_tokenizer_decode(stories, oob, 2, 0, &s);
    CHECK_ERR(rc, "512", "out of range");
    CHECK(rc == ZS_ERANGE && s == (char *)0x1, "decode ERANGE");
    rc = zs_tokenizer_decode(stories, neg, 1, 1, &s);
    CHECK_ERR(rc, "-1", "out of range");
}

/* ------------------------------------------------------------------ speed and threads */

static char *long_text(size_t want) {
    static const char *chunk = "Once upon a time, there was a little girl named Lily. She loved to play outside "
                               "in the park with her 23 friends!\nOne day, they saw a big red ball... \"Wow\", "
                               "she said; caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac 2024\r\n";
    size_t cl = strlen(chunk), n = 0;
    char *s = malloc(want + cl + 1);
    while (n < want) memcpy(s + n, chunk, cl), n += cl;
    s[n] = 0;
    return s;
}

static void test_speed(const zs_tokenizer *gpt2, const zs_tokenizer *stories) {
    char *text = long_text(100 * 1024);
    size_t len = strlen(text);
    const zs_tokenizer *ts[2] = {gpt2, stories};
    for (int k = 0; k < 2; k++) {
        if (!ts[k]) continue;
        int32_t *ids = NULL;
        size_t n = 0;
        double t0 = zs_now();
        int rc = zs_tokenizer_encode(ts[k], text, len, 0, &ids, &n);
        double dt = zs_now() - t0;
        CHECK(rc == 0, "long encode: %s", zs_errmsg());
        fprintf(stderr, "  encode %zu bytes (%s): %zu ids in %.3f s\n", len, k ? "stories260K" : "gpt2", n, dt);
        CHECK(dt < 2.0, "100 KB encode took %.3f s", dt); /* generous: sanitizer builds are several times slower */
        char *s = NULL;
        CHECK(zs_tokenizer_decode(ts[k], ids, n, 0, &s) == 0 && s && !strcmp(s, text), "long round trip");
        free(s);
        free(ids);
    }
    free(text);
}

typedef struct {
    const zs_tokenizer *t;
    const char **texts;
    int n_texts;
    int32_t **want;
    size_t *n_want;
    int mismatches;
} thread_arg;

static void *thread_main(void *p) {
    thread_arg *a = p;
    for (int iter = 0; iter < 20; iter++) {
        for (int i = 0; i < a->n_texts; i++) {
            int32_t *ids = NULL;
            size_t n = 0;
            if (zs_tokenizer_encode(a->t, a->texts[i], strlen(a->texts[i]), 1, &ids, &n) != 0 || n != a->n_want[i] ||
                memcmp(ids, a->want[i], n * sizeof *ids))
                a->mismatches++;
            free(ids);
        }
    }
    return NULL;
}

static void test_threads(const zs_tokenizer *t, const char *label) {
    if (!t) return;
    char *big = long_text(8 * 1024);
    const char *texts[] = {"Hello, my dog is cute", "It's 2024!\n\n  caf\xc3\xa9 \xe6\x97\xa5 \xf0\x9f\x98\x80",
                           "Once upon a time<|endoftext|> there</s>", big};
    int nt = 4;
    int32_t *want[4];
    size_t n_want[4];
    for (int i = 0; i < nt; i++)
        CHECK(zs_tokenizer_encode(t, texts[i], strlen(texts[i]), 1, &want[i], &n_want[i]) == 0, "encode");
    thread_arg args[2];
    pthread_t th[2];
    for (int k = 0; k < 2; k++) {
        args[k] = (thread_arg){t, texts, nt, want, n_want, 0};
        CHECK(pthread_create(&th[k], NULL, thread_main, &args[k]) == 0, "pthread_create");
    }
    for (int k = 0; k < 2; k++) {
        pthread_join(th[k], NULL);
        CHECK(args[k].mismatches == 0, "%s thread %d: %d mismatches", label, k, args[k].mismatches);
    }
    for (int i = 0; i < nt; i++) free(want[i]);
    free(big);
}

int main(void) {
    zs_tokenizer *gpt2 = load_fixture("gpt2-tokenizer");
    zs_tokenizer *stories = load_fixture("stories260K");
    zs_tokenizer *bytes = load_fixture("gpt2-bytes");
    if (gpt2) test_gpt2(gpt2);
    if (stories) {
        test_model_fixture(stories, "stories260K");
        test_stories_extra(stories);
    }
    if (bytes) {
        test_model_fixture(bytes, "gpt2-bytes");
        test_gpt2_bytes(bytes);
    }
    test_stream_multibyte(gpt2, stories, bytes);
    test_llama3();
    test_metaspace();
    test_bad_input(stories);
    test_speed(gpt2, stories);
    test_threads(gpt2, "gpt2");
    test_threads(stories, "stories260K");
    zs_tokenizer_free(gpt2);
    zs_tokenizer_free(stories);
    zs_tokenizer_free(bytes);
    return tu_finish("test-tokenizer");
}
