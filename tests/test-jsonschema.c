/* test-jsonschema.c — tests of the JSON-Schema grammar matcher and token masks
 * (engine/text/jsonschema.c):
 *  - every document of tests/ref/jsonschema/corpus.json (~20 schemas, valid documents and
 *    near-misses, labelled by Python's jsonschema: tests/ref/make_jsonschema_ref.py) fed byte by
 *    byte gets the label's verdict (valid iff every byte is accepted and the value is done;
 *    documents jsonschema accepts in a spelling the matcher refuses on purpose — whitespace
 *    outside strings beyond the bound (jsonschema.h), keys out of the schema's order — are
 *    labelled so and must be refused; spaced and pretty-printed ones within it are taken);
 *  - unsupported keywords fail with a message naming the keyword and its JSON pointer;
 *  - a rejected feed leaves the state unchanged; at every gap of a compact document each
 *    whitespace spelling gets the bound's verdict (one space, a newline and up to
 *    ZS_JSCHEMA_MAX_INDENT spaces/tabs taken; two spaces, "\n\n", " \n", \r, a lone tab, one
 *    indent byte more refused), anywhere else
 *    outside strings (before/after the value, inside a key or number) refused, inside strings
 *    taken; keys follow "properties", optional ones may be left out, required ones not;
 *    any-object takes keys in any order;
 *  - forced bytes (zs_jschema_forced): hand-made cases (required keys after '"' or the
 *    whitespace decision but not after '{', a const, enums once one value is left, maxItems,
 *    json_object's '{', '}' after whitespace, the cap, done), and along every accepted corpus
 *    document at every place: the forced bytes are the only byte that may follow, one after the
 *    other (feeding all 256), the document continues with them, and where none is forced there
 *    is a choice or nothing (done);
 *  - zs_jschema_mask_spell spells those runs in stories260K's and GPT-2's tokens, longest first
 *    (every other token checked), among equal ones a piece before a byte-fallback token
 *    (zs_tokenizer_is_byte_fallback: stories260K's 256 "<0xXX>", none of GPT-2's), then the
 *    lowest id; k bounds the count;
 *  - the mask equals per-token feeding (every token of stories260K, a sample of GPT-2's) along
 *    corpus documents (a compact one and one with whitespace per schema), EOS exactly when done;
 *  - random masked generation (GPT-2 tokenizer and stories260K, several seeds per schema) gives
 *    text that jansson parses and the matcher accepts; the documents of seed 1 equal
 *    tests/ref/jsonschema/generated.json, which jsonschema labelled valid offline
 *    (ZS_JSCHEMA_WRITE_GENERATED=<path> rewrites that file; then run the script's
 *    --validate-generated mode). Prints the mask time per token. */
#include "jsonschema.h"

#include "common.h"
#include "testutil.h"
#include "tokenizer.h"

static char *ref_path(char *buf, size_t n, const char *file) {
    snprintf(buf, n, "tests/ref/jsonschema/%s", file);
    return buf;
}

static int accepts(const zs_jschema *g, const char *doc, size_t n) {
    zs_jschema_state st;
    zs_jschema_state_init(g, &st);
    for (size_t i = 0; i < n; i++)
        if (!zs_jschema_feed(g, &st, doc + i, 1)) return 0;
    return zs_jschema_done(g, &st);
}

static int accepts_s(const zs_jschema *g, const char *doc) { return accepts(g, doc, strlen(doc)); }

static zs_jschema *compile_json(const json_t *schema) {
    char *s = json_dumps(schema, JSON_COMPACT);
    zs_jschema *g = NULL;
    int rc = zs_jschema_compile(s, &g);
    CHECK(rc == 0, "compile %s: %s", s, zs_errmsg());
    free(s);
    return rc == 0 ? g : NULL;
}

static void test_corpus(json_t *corpus) {
    json_t *schemas = json_object_get(corpus, "schemas");
    CHECK(json_array_size(schemas) >= 20, "corpus has %zu schemas", json_array_size(schemas));
    size_t i, n_docs = 0, n_valid = 0, n_ws = 0, n_order = 0, n_spaced = 0;
    json_t *e;
    json_array_foreach(schemas, i, e) {
        const char *name = json_string_value(json_object_get(e, "name"));
        zs_jschema *g = compile_json(json_object_get(e, "schema"));
        if (!g) continue;
        size_t j;
        json_t *d;
        json_array_foreach(json_object_get(e, "docs"), j, d) {
            const char *doc = json_string_value(json_object_get(d, "doc"));
            const char *refused = json_string_value(json_object_get(d, "refused"));
            int want = json_is_true(json_object_get(d, "valid")) && !refused;
            int got = accepts(g, doc, strlen(doc));
            CHECK(got == want, "schema %s: document %s: matcher says %s, jsonschema says %s%s%s", name, doc,
                  got ? "valid" : "invalid", json_is_true(json_object_get(d, "valid")) ? "valid" : "invalid",
                  refused ? ", refused for its " : "", refused ? refused : "");
            if (refused) n_ws += !strcmp(refused, "whitespace"), n_order += !strcmp(refused, "key order");
            n_spaced += want && json_is_true(json_object_get(d, "ws"));
            /* whole-document feed agrees with byte-by-byte feed */
            zs_jschema_state st;
            zs_jschema_state_init(g, &st);
            int all = zs_jschema_feed(g, &st, doc, strlen(doc)) && zs_jschema_done(g, &st);
            CHECK(all == got, "schema %s: document %s: one feed says %d, byte feeds %d", name, doc, all, got);
            n_docs++;
            n_valid += (size_t)want;
        }
        zs_jschema_free(g);
    }
    CHECK(n_docs >= 400 && n_valid >= 50 && n_docs - n_valid >= 200, "corpus: %zu docs, %zu valid", n_docs, n_valid);
    CHECK(n_ws >= 100 && n_order >= 10 && n_spaced >= 100,
          "corpus: %zu documents with whitespace beyond the bound, %zu with keys out of order (valid JSON Schema, "
          "refused spellings), %zu taken with whitespace within it", n_ws, n_order, n_spaced);
    fprintf(stderr, "corpus: %zu documents (%zu valid, %zu of them with whitespace outside strings; %zu more refused "
            "for whitespace, %zu for key order) agree with jsonschema\n", n_docs, n_valid, n_spaced, n_ws, n_order);
}

static void expect_refused(const char *schema, const char *kw, const char *ptr) {
    zs_jschema *g = NULL;
    int rc = zs_jschema_compile(schema, &g);
    CHECK(rc == ZS_EINVAL, "%s: rc %d", schema, rc);
    CHECK(g == NULL, "%s: out set on failure", schema);
    CHECK(strstr(zs_errmsg(), kw) && strstr(zs_errmsg(), ptr), "%s: message \"%s\" lacks %s / %s", schema,
          zs_errmsg(), kw, ptr);
}

#define OBJ(props) "{\"type\":\"object\",\"properties\":{" props "},\"additionalProperties\":false}"

static void test_refused(void) {
    expect_refused(OBJ("\"name\":{\"type\":\"string\",\"pattern\":\"^a\"}"), "'pattern'", "/properties/name");
    expect_refused(OBJ("\"d\":{\"type\":\"string\",\"format\":\"date\"}"), "'format'", "/properties/d");
    expect_refused(OBJ("\"d\":{\"type\":\"string\",\"minLength\":2}"), "'minLength'", "/properties/d");
    expect_refused(OBJ("\"n\":{\"type\":\"number\",\"minimum\":0}"), "'minimum'", "/properties/n");
    expect_refused(OBJ("\"o\":{\"oneOf\":[{\"type\":\"string\"}]}"), "'oneOf'", "/properties/o");
    expect_refused(OBJ("\"o\":{\"allOf\":[{\"type\":\"string\"}]}"), "'allOf'", "/properties/o");
    expect_refused(OBJ("\"o\":{\"not\":{\"type\":\"string\"}}"), "'not'", "/properties/o");
    expect_refused(OBJ("\"o\":{\"type\":\"string\",\"if\":{}}"), "'if'", "/properties/o");
    expect_refused("{\"type\":\"object\",\"patternProperties\":{},\"additionalProperties\":false}",
                   "'patternProperties'", "/");
    expect_refused(OBJ("\"a\":{\"type\":\"array\",\"items\":{\"type\":\"integer\",\"multipleOf\":2}}"),
                   "'multipleOf'", "/properties/a/items");
    expect_refused(OBJ("\"a\":{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"string\",\"maxLength\":3}]}"),
                   "'maxLength'", "/properties/a/anyOf/1");
    expect_refused(OBJ("\"a\":{\"$ref\":\"#/properties/b\"}"), "'$ref'", "/properties/a");
    expect_refused(OBJ("\"a\":{\"$ref\":\"http://x/y.json\"}"), "'$ref'", "/properties/a");
    expect_refused(OBJ("\"a\":{\"$ref\":\"#/$defs/missing\"}"), "does not exist", "/properties/a");
    expect_refused(OBJ("\"a~/b\":{\"type\":\"string\",\"pattern\":\"x\"}"), "'pattern'", "/properties/a~0~1b");
    expect_refused("{\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"#/$defs/x\"}},\"additionalProperties\":false,"
                   "\"$defs\":{\"x\":{\"type\":\"string\",\"format\":\"email\"}}}",
                   "'format'", "/$defs/x");
    expect_refused("{\"type\":\"string\"}", "root", "object");
    expect_refused("[1,2]", "root", "object");
    expect_refused("{\"type\":\"object\"", "not valid JSON", "line");
    expect_refused("{\"type\":\"object\",\"properties\":{}}", "additionalProperties", "/");
    expect_refused(OBJ("\"o\":" OBJ("\"p\":{\"type\":\"string\"}") ",\"q\":{\"type\":\"object\",\"properties\":{},"
                       "\"additionalProperties\":true}"),
                   "'additionalProperties'", "/properties/q");
    expect_refused(OBJ("\"a\":{\"type\":\"strng\"}"), "'type'", "/properties/a");
    expect_refused(OBJ("\"a\":{\"description\":\"no type\"}"), "no 'type'", "/properties/a");
    expect_refused("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}},\"required\":[\"b\"],"
                   "\"additionalProperties\":false}",
                   "'required'", "\"b\"");
    expect_refused(OBJ("\"a\":{\"type\":\"string\",\"enum\":[1,2]}"), "'enum'", "/properties/a");
    expect_refused(OBJ("\"a\":{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}"), "'minItems'", "/properties/a");
    expect_refused(OBJ("\"a\":{\"type\":\"string\",\"items\":{}}"), "'items'", "/properties/a");
    expect_refused("{\"type\":\"object\",\"$id\":\"x\",\"additionalProperties\":false}", "'$id'", "/");
}

static void test_matcher_rules(void) {
    zs_jschema *g = NULL;
    CHECK(zs_jschema_compile(OBJ("\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"}"), &g) == 0, "%s",
          zs_errmsg());
    if (!g) return;
    zs_jschema_state st, before;
    zs_jschema_state_init(g, &st);
    CHECK(zs_jschema_feed(g, &st, "{\"a\":1", 6), "prefix");
    memcpy(&before, &st, sizeof st);
    CHECK(!zs_jschema_feed(g, &st, ",\"c", 3), "unknown key refused");
    CHECK(!memcmp(&before, &st, sizeof st), "rejected feed changed the state");
    CHECK(!zs_jschema_feed(g, &st, ",\"a\"", 4), "duplicate key refused");
    CHECK(!zs_jschema_done(g, &st), "open object is not done");
    CHECK(zs_jschema_feed(g, &st, "}", 1) && zs_jschema_done(g, &st), "close");
    CHECK(!zs_jschema_feed(g, &st, " ", 1) && !zs_jschema_feed(g, &st, "}", 1), "nothing after the root");
    /* bounded whitespace: at each gap between two tokens (after '{', a key, ':', a value, ',')
     * the spellings of the bound are taken, the others refused; before or after the value and
     * inside a key or number all are refused */
    const char *compact = "{\"a\":-12,\"b\":\"x y\"}";
    static const int gap[] = {1, 4, 5, 8, 9, 12, 13, 18};
    enum { MI = ZS_JSCHEMA_MAX_INDENT };
    char max_sp[MI + 2] = "\n", max_tab[MI + 2] = "\n", over[MI + 3] = "\n"; /* the bound's indents, one more */
    memset(max_sp + 1, ' ', MI), memset(max_tab + 1, '\t', MI), memset(over + 1, ' ', MI + 1);
    const struct { const char *w; int ok; } sp[] = {
        {" ", 1}, {"\n", 1}, {"\n  ", 1}, {"\n\t \t", 1}, {max_sp, 1}, {max_tab, 1},
        {"  ", 0}, {"\t", 0}, {"\r", 0}, {"\r\n", 0}, {"\n\n", 0}, {" \n", 0}, {"\n \n", 0}, {"\t ", 0}, {over, 0},
    };
    CHECK(accepts_s(g, compact), "compact");
    int right = 0, tried = 0;
    for (size_t i = 0; i <= strlen(compact); i++) {
        if (i >= 14 && i <= 17) continue; /* inside the string "x y": whitespace is content */
        int is_gap = 0;
        for (size_t k = 0; k < sizeof gap / sizeof gap[0]; k++) is_gap |= gap[k] == (int)i;
        for (size_t k = 0; k < sizeof sp / sizeof sp[0]; k++) {
            char doc[96];
            snprintf(doc, sizeof doc, "%.*s%s%s", (int)i, compact, sp[k].w, compact + i);
            int got = accepts_s(g, doc), want = is_gap && sp[k].ok;
            CHECK(got == want, "whitespace [%s] at %zu: %d, want %d", sp[k].w, i, got, want);
            right += got == want;
            tried++;
        }
    }
    CHECK(right == tried, "whitespace at every place of a compact document (%d of %d right)", right, tried);
    CHECK(accepts_s(g, "{\n  \"a\": -12,\n  \"b\": \"x y\"\n}") && accepts_s(g, "{ \"a\" : 1 , \"b\" : \"\" }") &&
              !accepts_s(g, "{\"a\":1,\"b\":\"\"}\n") && !accepts_s(g, "{\"a\":\n\n1}"),
          "pretty-printed and spaced taken, a trailing newline and a blank line refused");
    CHECK(accepts_s(g, "{\"a\":1,\"b\":\" \\n\\t x \"}"), "whitespace inside strings");
    /* keys in the order of "properties"; optional ones may be left out */
    CHECK(accepts_s(g, "{\"b\":\"x\"}") && accepts_s(g, "{}") && !accepts_s(g, "{\"b\":\"x\",\"a\":1}"),
          "key order, optional keys left out");
    CHECK(!accepts(g, "{\"a\":1.0}", 9) && !accepts(g, "{\"a\":1e3}", 9) && !accepts(g, "{\"a\":01}", 8),
          "integer forms");
    CHECK(accepts_s(g, "{\"a\":-0}") && accepts_s(g, "{\"a\":-123456789012345678}") &&
              !accepts_s(g, "{\"a\":1234567890123456789}"), "-0, integer digit bound");
    CHECK(!accepts(g, "{\"b\":\"\x01\"}", 9) && !accepts(g, "{\"b\":\"\xc3\"}", 9) &&
              !accepts(g, "{\"b\":\"\xed\xa0\x80\"}", 11) && !accepts(g, "{\"b\":\"\\x\"}", 10),
          "bad string bytes / escapes");
    CHECK(accepts_s(g, "{\"b\":\"\\u00e9\\n\xf0\x9f\x98\x80\"}"), "escapes and UTF-8");
    zs_jschema_free(g);

    /* a required key cannot be skipped; an optional one can */
    CHECK(zs_jschema_compile("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":"
                             "\"integer\"},\"c\":{\"type\":\"integer\"}},\"required\":[\"b\"],"
                             "\"additionalProperties\":false}", &g) == 0, "%s", zs_errmsg());
    if (!g) return;
    CHECK(accepts_s(g, "{\"b\":2}") && accepts_s(g, "{\"a\":1,\"b\":2,\"c\":3}") && accepts_s(g, "{\"b\":2,\"c\":3}"),
          "optional a and c around required b");
    CHECK(!accepts_s(g, "{\"a\":1,\"c\":3}") && !accepts_s(g, "{\"c\":3}") && !accepts_s(g, "{\"a\":1}") &&
              !accepts_s(g, "{\"b\":2,\"a\":1}") && !accepts_s(g, "{\"b\":2,\"b\":2}"),
          "required b not skipped, no key twice or backwards");
    zs_jschema_free(g);

    CHECK(zs_jschema_any_object(&g) == 0, "any object");
    if (!g) return;
    CHECK(accepts_s(g, "{}") && accepts_s(g, "{\"x\":[1,{\"y\":null},\"s\",true,-2.5e+3],\"x\":{}}"),
          "json_object accepts objects");
    CHECK(!accepts(g, "[]", 2) && !accepts(g, "\"s\"", 3) && !accepts(g, "{\"a\":}", 6) && !accepts(g, "{", 1),
          "json_object refuses non-objects and broken JSON");
    CHECK(accepts_s(g, "{\"b\":1,\"a\":2}") && accepts_s(g, "{\"a\": 1}") && accepts_s(g, "{\n  \"a\": [1, 2]\n}") &&
              accepts_s(g, "{ }") && !accepts_s(g, "[ ]") && !accepts_s(g, " {}") && !accepts_s(g, "{}\n") &&
              !accepts_s(g, "{\"a\":  1}") && !accepts_s(g, "{\"a\":[1,\n\n2]}"),
          "json_object: keys in any order, bounded whitespace");
    zs_jschema_free(g);
}

/* ---------------------------------------------------------------- forced bytes */

/* How many bytes may follow st (feeding each of the 256: the definition zs_jschema_forced meets);
 * *only: the last of them. */
static int next_bytes(const zs_jschema *g, const zs_jschema_state *st, int *only) {
    static zs_jschema_state s2;
    int n = 0;
    for (int c = 0; c < 256; c++) {
        char b = (char)c;
        zs_jschema_state_copy(&s2, st);
        if (zs_jschema_feed(g, &s2, &b, 1)) n++, *only = c;
    }
    return n;
}

static void expect_forced(const zs_jschema *g, const char *fed, size_t cap, const char *want, int want_done) {
    zs_jschema_state st;
    zs_jschema_state_init(g, &st);
    CHECK(zs_jschema_feed(g, &st, fed, strlen(fed)), "forced: %s is accepted", fed);
    zs_jschema_state before = st;
    char out[256];
    int done = -1;
    size_t n = zs_jschema_forced(g, &st, out, cap, &done);
    CHECK(n == strlen(want) && !memcmp(out, want, n) && done == want_done,
          "forced after [%s]: [%.*s] done %d, want [%s] done %d", fed, (int)n, out, done, want, want_done);
    CHECK(!memcmp(&before, &st, sizeof st), "forced: the state is unchanged");
}

#define PERSON OBJ("\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"}") /* no required */
#define REQ(props, req) "{\"type\":\"object\",\"properties\":{" props "},\"required\":[" req "],\"additionalProperties\":false}"

static void test_forced_cases(void) {
    zs_jschema *g = NULL;
    CHECK(zs_jschema_compile(REQ("\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"}", "\"name\",\"age\""),
                             &g) == 0, "%s", zs_errmsg());
    if (!g) return;
    /* '{' is forced (no whitespace before the value); after it whitespace may come, so nothing,
     * but once '"' or the whitespace is there the required key is */
    expect_forced(g, "", 256, "{", 0);
    expect_forced(g, "{", 256, "", 0);                              /* ' ', '\n' or '"' */
    expect_forced(g, "{\"", 256, "name\"", 0);                      /* then ':' or whitespace */
    expect_forced(g, "{\"", 3, "nam", 0);                           /* cap */
    expect_forced(g, "{ ", 256, "\"name\"", 0);                     /* one space: no more whitespace */
    expect_forced(g, "{\n  ", 256, "", 0);                          /* more indent or '"' */
    expect_forced(g, "{\"name\"", 256, "", 0);                      /* ':' or whitespace */
    expect_forced(g, "{\"name\" ", 256, ":", 0);
    expect_forced(g, "{\"name\": ", 256, "\"", 0);                  /* the string's quote */
    expect_forced(g, "{\"name\":\"Al", 256, "", 0);                /* string content is free */
    expect_forced(g, "{\"name\":\"Al\"", 256, "", 0);              /* ',' or whitespace */
    expect_forced(g, "{\"name\":\"Al\",\"", 256, "age\"", 0);      /* the next key is required */
    expect_forced(g, "{\"name\":\"Al\",\n\t", 256, "", 0);
    expect_forced(g, "{\"name\":\"Al\",\"age\":3", 256, "", 0);    /* a digit, '}' or whitespace */
    expect_forced(g, "{\"name\":\"Al\",\"age\":3 ", 256, "}", 1);  /* '}' after the space */
    expect_forced(g, "{\"name\":\"Al\",\"age\":3\n", 256, "", 0);  /* indent or '}' */
    expect_forced(g, "{\"name\":\"Al\",\"age\":3}", 256, "", 1);   /* done */
    CHECK(zs_jschema_forced(NULL, NULL, NULL, 0, NULL) == 0, "NULL arguments");
    zs_jschema_free(g);
    CHECK(zs_jschema_compile(PERSON, &g) == 0, "%s", zs_errmsg());
    if (!g) return;
    expect_forced(g, "", 256, "{", 0);                              /* '"', '}' or whitespace: both optional */
    expect_forced(g, "{\"", 256, "", 0);                            /* "name" or "age" */
    expect_forced(g, "{\"n", 256, "ame\"", 0);
    expect_forced(g, "{\"name\":\"x\",", 256, "", 0);              /* '"' or whitespace */
    expect_forced(g, "{\"name\":\"x\",\"", 256, "age\"", 0);       /* only age is left */
    zs_jschema_free(g);
    CHECK(zs_jschema_compile(REQ("\"kind\":{\"const\":\"event\"},\"color\":{\"enum\":[\"red\",\"green\",\"blue\"]},"
                                 "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"mon\",\"tue\"]},\"maxItems\":1},"
                                 "\"ok\":{\"type\":\"boolean\"},\"v\":{\"enum\":[\"rose\",\"red\",12,1]}",
                                 "\"kind\",\"color\",\"tags\",\"ok\",\"v\""), &g) == 0, "%s", zs_errmsg());
    if (!g) return;
    expect_forced(g, "{\"", 256, "kind\"", 0);
    expect_forced(g, "{\"kind\": ", 256, "\"event\"", 0);           /* a const */
    expect_forced(g, "{\"kind\":\"event\",\"color\":\"g", 256, "reen\"", 0);
    expect_forced(g, "{\"kind\":\"event\",\"color\":\"red\",\"tags\":[", 256, "", 0); /* '"', ']' or whitespace */
    expect_forced(g, "{\"kind\":\"event\",\"color\":\"red\",\"tags\":[\"t", 256, "ue\"", 0);
    expect_forced(g, "{\"kind\":\"event\",\"color\":\"red\",\"tags\":[\"tue\" ", 256, "]", 0); /* maxItems */
    expect_forced(g, "{\"kind\":\"event\",\"color\":\"red\",\"tags\":[],\"ok\":f", 256, "alse", 0);
    expect_forced(g, "{\"kind\":\"event\",\"color\":\"red\",\"tags\":[],\"ok\":true,\"v\":\"r", 256, "", 0); /* o, e */
    expect_forced(g, "{\"kind\":\"event\",\"color\":\"red\",\"tags\":[],\"ok\":true,\"v\":\"re", 256, "d\"", 0);
    expect_forced(g, "{\"kind\":\"event\",\"color\":\"red\",\"tags\":[],\"ok\":true,\"v\":1", 256, "", 0); /* 12, 1} */
    expect_forced(g, "{\"kind\":\"event\",\"color\":\"red\",\"tags\":[],\"ok\":true,\"v\":12", 256, "", 0);
    expect_forced(g, "{\"kind\":\"event\",\"color\":\"red\",\"tags\":[],\"ok\":true,\"v\":12 ", 256, "}", 1);
    zs_jschema_free(g);
    CHECK(zs_jschema_any_object(&g) == 0, "any object");
    if (!g) return;
    expect_forced(g, "", 256, "{", 0);
    expect_forced(g, "{\"a\"", 256, "", 0);                         /* ':' or whitespace */
    expect_forced(g, "{\"a\" ", 256, ":", 0);
    expect_forced(g, "{\"a\":1", 256, "", 0);
    zs_jschema_free(g);
}

/* Along every document the matcher accepts, at every prefix: the forced bytes are the only byte
 * that may follow, one after the other (checked by feeding all 256), the document continues
 * with them, and where nothing is forced there is a choice (or nothing: done). */
static void test_forced_corpus(json_t *corpus) {
    json_t *schemas = json_object_get(corpus, "schemas");
    size_t i, n_pos = 0, n_forced = 0, n_bytes = 0;
    json_t *e;
    json_array_foreach(schemas, i, e) {
        zs_jschema *g = compile_json(json_object_get(e, "schema"));
        if (!g) continue;
        size_t j;
        json_t *d;
        json_array_foreach(json_object_get(e, "docs"), j, d) {
            if (!json_is_true(json_object_get(d, "valid")) || json_object_get(d, "refused")) continue;
            const char *doc = json_string_value(json_object_get(d, "doc"));
            size_t len = strlen(doc);
            zs_jschema_state st;
            zs_jschema_state_init(g, &st);
            char out[256];
            size_t prev = 0;
            int bad = 0;
            for (size_t k = 0; k <= len && !bad; k++) {
                int done = -1, only = -1;
                size_t n = zs_jschema_forced(g, &st, out, sizeof out, &done);
                int nb = next_bytes(g, &st, &only);
                if (n > 0) bad |= nb != 1 || only != (unsigned char)out[0] || k + n > len || memcmp(doc + k, out, n);
                else bad |= nb == 1;
                bad |= k > 0 && prev > 0 && n != prev - 1; /* a run goes on byte by byte */
                bad |= done != (k + n == len);
                CHECK(!bad, "forced along %s at %zu: [%.*s] done %d, %d bytes may follow", doc, k, (int)n, out, done, nb);
                n_pos++;
                n_forced += n > 0;
                n_bytes += n;
                prev = n;
                if (k < len) zs_jschema_feed(g, &st, doc + k, 1);
            }
        }
        zs_jschema_free(g);
    }
    CHECK(n_forced * 4 > n_pos, "forced bytes at %zu of %zu places", n_forced, n_pos);
    fprintf(stderr, "forced: %zu of %zu places along the corpus force bytes (%.1f on average there)\n", n_forced, n_pos,
            (double)n_bytes / (double)(n_forced ? n_forced : 1));
}

/* ---------------------------------------------------------------- masks */

typedef struct {
    const char *name;
    zs_tokenizer *tok;
    int n_vocab;
} tokcase;

static int bit(const uint32_t *b, int id) { return b[id / 32] >> (id % 32) & 1; }

/* Mask == per-token feeding at every prefix of doc (every token when stride 1). */
static void check_mask_along(const zs_jschema *g, const zs_jschema_masks *m, const tokcase *tc, const char *doc,
                             int stride) {
    size_t n = strlen(doc);
    uint32_t *bits = malloc(zs_jschema_mask_words(m) * sizeof *bits);
    zs_jschema_state st;
    zs_jschema_state_init(g, &st);
    int bad = 0;
    for (size_t i = 0; i <= n && !bad; i++) {
        int count = zs_jschema_mask(m, &st, bits), want_count = 0;
        int done = zs_jschema_done(g, &st);
        for (int id = 0; id < tc->n_vocab; id++) {
            int want;
            if (zs_tokenizer_is_eos(tc->tok, id)) want = done;
            else if (zs_tokenizer_is_special(tc->tok, id)) want = 0;
            else {
                size_t len;
                const char *b = zs_tokenizer_token_bytes(tc->tok, id, &len);
                zs_jschema_state s2 = st;
                want = len && zs_jschema_feed(g, &s2, b, len);
            }
            want_count += want;
            if ((id % stride) && !want) continue; /* sample: every allowed token, every stride-th other */
            if (bit(bits, id) != want) {
                CHECK(0, "%s: mask after %zu bytes of %s: token %d is %d, feeding says %d", tc->name, i, doc, id,
                      bit(bits, id), want);
                bad = 1;
                break;
            }
        }
        CHECK(count == want_count || bad, "%s: mask count %d, want %d", tc->name, count, want_count);
        if (i < n) zs_jschema_feed(g, &st, doc + i, 1);
    }
    free(bits);
}

static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Random masked generation: returns the malloc'd text (NULL if not done within 300 tokens);
 * *mask_s / *n_masks accumulate the time spent in zs_jschema_mask. */
static double mask_max; /* slowest single mask (a cache miss), seconds */

static char *generate(const zs_jschema *g, const zs_jschema_masks *m, const tokcase *tc, uint64_t seed,
                      double *mask_s, int *n_masks) {
    uint32_t *bits = malloc(zs_jschema_mask_words(m) * sizeof *bits);
    int32_t *allowed = malloc((size_t)tc->n_vocab * sizeof *allowed);
    int32_t *closers = malloc((size_t)tc->n_vocab * sizeof *closers);
    char *text = calloc(1, 1);
    size_t len = 0;
    zs_jschema_state st;
    zs_jschema_state_init(g, &st);
    uint64_t rs = seed * 0x1234567ull + 77;
    int ok = 0;
    for (int step = 0; step < 300; step++) {
        double t0 = zs_now();
        int count = zs_jschema_mask(m, &st, bits);
        double dt = zs_now() - t0;
        *mask_s += dt;
        if (dt > mask_max) mask_max = dt;
        (*n_masks)++;
        if (zs_jschema_done(g, &st)) {
            int only_eos = 1;
            for (int id = 0; id < tc->n_vocab; id++)
                if (bit(bits, id) != zs_tokenizer_is_eos(tc->tok, id)) only_eos = 0;
            CHECK(only_eos, "%s: done, but the mask is not exactly the EOS ids", tc->name);
            ok = 1;
            break;
        }
        int na = 0, nc = 0;
        for (int id = 0; id < tc->n_vocab; id++) {
            if (!bit(bits, id)) continue;
            allowed[na++] = id;
            size_t l;
            const char *b = zs_tokenizer_token_bytes(tc->tok, id, &l);
            if (memchr(b, '"', l) || memchr(b, '}', l) || memchr(b, ']', l)) closers[nc++] = id;
        }
        CHECK(na == count && na > 0, "%s: dead end after \"%s\" (%d allowed, count %d)", tc->name, text, na, count);
        if (!na) break;
        int id = nc && rng_next(&rs) % 2 ? closers[rng_next(&rs) % (uint64_t)nc] : allowed[rng_next(&rs) % (uint64_t)na];
        size_t l;
        const char *b = zs_tokenizer_token_bytes(tc->tok, id, &l);
        if (!zs_jschema_feed(g, &st, b, l)) {
            CHECK(0, "%s: masked token %d refused by feed", tc->name, id);
            break;
        }
        text = realloc(text, len + l + 1);
        memcpy(text + len, b, l);
        len += l;
        text[len] = 0;
    }
    free(bits);
    free(allowed);
    free(closers);
    if (!ok) {
        free(text);
        return NULL;
    }
    return text;
}

static void test_masks(json_t *corpus, tokcase *tcs, int n_tc) {
    json_t *schemas = json_object_get(corpus, "schemas");
    char path[512];
    json_error_t je;
    json_t *committed = json_load_file(ref_path(path, sizeof path, "generated.json"), 0, &je);
    CHECK(committed != NULL, "cannot load %s: %s", path, je.text);
    const char *wpath = getenv("ZS_JSCHEMA_WRITE_GENERATED");
    json_t *written = json_array();
    int n_committed_checked = 0;
    for (int t = 0; t < n_tc; t++) {
        double mask_s = 0;
        int n_masks = 0, n_done = 0, n_runs = 0;
        size_t i;
        json_t *e;
        json_array_foreach(schemas, i, e) {
            const char *name = json_string_value(json_object_get(e, "name"));
            zs_jschema *g = compile_json(json_object_get(e, "schema"));
            zs_jschema_masks *m = NULL;
            if (!g) continue;
            CHECK(zs_jschema_mask_new(g, tcs[t].tok, &m) == 0, "mask_new: %s", zs_errmsg());
            if (!m) {
                zs_jschema_free(g);
                continue;
            }
            CHECK(zs_jschema_mask_words(m) == (size_t)(tcs[t].n_vocab + 31) / 32, "mask words");
            /* exhaustive (stories260K) / sampled (GPT-2) agreement along the first valid document */
            json_t *d0 = json_array_get(json_object_get(e, "docs"), 0);
            if (i % 3 == 0 || tcs[t].n_vocab < 1000) {
                check_mask_along(g, m, &tcs[t], json_string_value(json_object_get(d0, "doc")),
                                 tcs[t].n_vocab < 1000 ? 1 : 97);
                size_t k;
                json_t *dw;
                json_array_foreach(json_object_get(e, "docs"), k, dw) { /* the first taken one with whitespace */
                    if (!json_is_true(json_object_get(dw, "ws")) || !json_is_true(json_object_get(dw, "valid")) ||
                        json_object_get(dw, "refused"))
                        continue;
                    check_mask_along(g, m, &tcs[t], json_string_value(json_object_get(dw, "doc")),
                                     tcs[t].n_vocab < 1000 ? 1 : 97);
                    break;
                }
            }
            for (uint64_t seed = 1; seed <= 3; seed++) {
                char *text = generate(g, m, &tcs[t], seed, &mask_s, &n_masks);
                n_runs++;
                if (!text) {
                    fprintf(stderr, "%s/%s seed %d: not done within 300 tokens\n", tcs[t].name, name, (int)seed);
                    continue;
                }
                n_done++;
                json_t *parsed = json_loads(text, 0, &je);
                CHECK(parsed && json_is_object(parsed), "%s/%s seed %d: generated text does not parse: %s",
                      tcs[t].name, name, (int)seed, text);
                json_decref(parsed);
                CHECK(accepts(g, text, strlen(text)), "%s/%s: generated text not accepted: %s", tcs[t].name, name,
                      text);
                if (seed == 1) {
                    json_array_append_new(written, json_pack("{s:s,s:s,s:i,s:s}", "tokenizer", tcs[t].name, "schema",
                                                             name, "seed", (int)seed, "doc", text));
                    size_t k;
                    json_t *c;
                    json_array_foreach(json_object_get(committed, "docs"), k, c) {
                        if (strcmp(json_string_value(json_object_get(c, "tokenizer")), tcs[t].name) ||
                            strcmp(json_string_value(json_object_get(c, "schema")), name))
                            continue;
                        CHECK(!strcmp(json_string_value(json_object_get(c, "doc")), text),
                              "%s/%s: generated \"%s\", committed \"%s\"", tcs[t].name, name, text,
                              json_string_value(json_object_get(c, "doc")));
                        CHECK(json_is_true(json_object_get(c, "valid")), "%s/%s: jsonschema rejected %s",
                              tcs[t].name, name, json_string_value(json_object_get(c, "doc")));
                        n_committed_checked++;
                    }
                }
                free(text);
            }
            zs_jschema_mask_free(m);
            zs_jschema_free(g);
        }
        CHECK(n_done * 10 >= n_runs * 9, "%s: only %d of %d generations finished in 300 tokens", tcs[t].name, n_done,
              n_runs);
        fprintf(stderr,
                "%s: %d generations finished of %d; mask %.1f us per token over %d tokens, slowest %.0f us "
                "(vocab %d)\n",
                tcs[t].name, n_done, n_runs, 1e6 * mask_s / (n_masks ? n_masks : 1), n_masks, 1e6 * mask_max,
                tcs[t].n_vocab);
        mask_max = 0;
    }
    if (wpath) {
        json_t *o = json_pack("{s:o}", "docs", written);
        CHECK(json_dump_file(o, wpath, JSON_INDENT(1)) == 0, "write %s", wpath);
        json_decref(o);
    } else {
        json_decref(written);
        CHECK(n_committed_checked >= 30, "only %d committed generated documents checked", n_committed_checked);
    }
    json_decref(committed);
}

/* zs_jschema_mask_spell: the tokens spell the bytes; at each place the longest token that fits
 * (every other token checked), among equal ones a piece before a byte-fallback token, then the
 * lowest id; k bounds the count. */
static int spell_ok(const zs_jschema_masks *m, const tokcase *tc, const char *bytes, size_t n) {
    int32_t ids[300];
    size_t used = 0;
    int k = zs_jschema_mask_spell(m, bytes, n, ids, 300, &used);
    size_t at = 0;
    for (int t = 0; t < k; t++) {
        size_t len;
        const char *b = zs_tokenizer_token_bytes(tc->tok, ids[t], &len);
        if (!b || !len || at + len > n || memcmp(bytes + at, b, len) || zs_tokenizer_is_special(tc->tok, ids[t])) {
            CHECK(0, "%s: spelling [%.*s]: token %d does not spell its place", tc->name, (int)n, bytes, ids[t]);
            return 0;
        }
        for (int id = 0; id < tc->n_vocab; id++) {
            size_t l2;
            const char *b2 = zs_tokenizer_token_bytes(tc->tok, id, &l2);
            if (!b2 || !l2 || zs_tokenizer_is_special(tc->tok, id) || at + l2 > n || memcmp(bytes + at, b2, l2)) continue;
            int bf = zs_tokenizer_is_byte_fallback(tc->tok, id), bf0 = zs_tokenizer_is_byte_fallback(tc->tok, ids[t]);
            if (l2 > len || (l2 == len && (bf < bf0 || (bf == bf0 && id < ids[t])))) {
                CHECK(0, "%s: spelling [%.*s] at %zu: token %d (%zu bytes) chosen, %d (%zu bytes) fits better", tc->name,
                      (int)n, bytes, at, ids[t], len, id, l2);
                return 0;
            }
        }
        at += len;
    }
    CHECK(at == used && used == n, "%s: spelling [%.*s]: %zu of %zu bytes spelled (%d tokens)", tc->name, (int)n, bytes,
          used, n, k);
    return at == used && used == n;
}

static void test_spell(json_t *corpus, tokcase *tcs, int n_tc) {
    for (int t = 0; t < n_tc; t++) {
        zs_jschema *g = NULL;
        zs_jschema_masks *m = NULL;
        CHECK(zs_jschema_any_object(&g) == 0 && zs_jschema_mask_new(g, tcs[t].tok, &m) == 0, "masks: %s", zs_errmsg());
        if (!m) {
            zs_jschema_free(g);
            continue;
        }
        int n_ok = 0, n_tried = 0, n_tok = 0;
        /* the forced runs along the first document of every schema */
        size_t i;
        json_t *e;
        json_array_foreach(json_object_get(corpus, "schemas"), i, e) {
            zs_jschema *gs = compile_json(json_object_get(e, "schema"));
            if (!gs) continue;
            const char *doc = json_string_value(json_object_get(json_array_get(json_object_get(e, "docs"), 0), "doc"));
            zs_jschema_state st;
            zs_jschema_state_init(gs, &st);
            for (size_t k = 0; doc[k]; k++) {
                char out[256];
                size_t n = zs_jschema_forced(gs, &st, out, sizeof out, NULL);
                if (n > 0) { /* every place in a run: its rest */
                    n_ok += spell_ok(m, &tcs[t], out, n);
                    n_tried++;
                    int32_t ids[64];
                    n_tok += zs_jschema_mask_spell(m, out, n, ids, 64, NULL);
                }
                zs_jschema_feed(gs, &st, doc + k, 1);
            }
            zs_jschema_free(gs);
        }
        /* stories260K's 256 "<0xXX>" tokens are byte fallback (one has a piece of its own: "n") */
        int n_bf = 0, id_n = -1, id_n_bf = -1;
        for (int id = 0; id < tcs[t].n_vocab; id++) {
            size_t l;
            const char *b = zs_tokenizer_token_bytes(tcs[t].tok, id, &l);
            int bf = zs_tokenizer_is_byte_fallback(tcs[t].tok, id);
            n_bf += bf;
            if (b && l == 1 && b[0] == 'n' && !zs_tokenizer_is_special(tcs[t].tok, id)) *(bf ? &id_n_bf : &id_n) = id;
        }
        int32_t one = -1;
        int want_bf = strcmp(tcs[t].name, "gpt2") ? 256 : 0;
        CHECK(n_bf == want_bf && zs_jschema_mask_spell(m, "n", 1, &one, 1, NULL) == 1 && one == id_n &&
                  (want_bf == 0 || id_n_bf >= 0),
              "%s: %d byte-fallback tokens (want %d); \"n\" spelled %d, its piece %d (byte token %d)", tcs[t].name,
              n_bf, want_bf, one, id_n, id_n_bf);
        const char *fixed = "{\"name\":\"\",\"arguments\":{\"city\":\"";
        n_ok += spell_ok(m, &tcs[t], fixed, strlen(fixed));
        n_tried++;
        int32_t ids[4];
        size_t used = 99;
        int k = zs_jschema_mask_spell(m, fixed, strlen(fixed), ids, 2, &used);
        size_t l0 = 0, l1 = 0;
        if (k == 2) zs_tokenizer_token_bytes(tcs[t].tok, ids[0], &l0), zs_tokenizer_token_bytes(tcs[t].tok, ids[1], &l1);
        CHECK(k == 2 && used == l0 + l1 && used < strlen(fixed), "%s: k bounds the tokens (%d, %zu bytes)", tcs[t].name,
              k, used);
        CHECK(zs_jschema_mask_spell(m, "", 0, ids, 4, &used) == 0 && used == 0, "nothing to spell");
        CHECK(n_ok == n_tried && n_tried >= 20, "%s: %d of %d forced runs spelled", tcs[t].name, n_ok, n_tried);
        fprintf(stderr, "%s: %d forced runs spelled in %d tokens\n", tcs[t].name, n_tried, n_tok);
        zs_jschema_mask_free(m);
        zs_jschema_free(g);
    }
}

int main(void) {
    char path[512];
    json_error_t je;
    json_t *corpus = json_load_file(ref_path(path, sizeof path, "corpus.json"), 0, &je);
    CHECK(corpus != NULL, "cannot load %s: %s", path, je.text);
    if (!corpus) return tu_finish("test-jsonschema");
    test_corpus(corpus);
    test_refused();
    test_matcher_rules();
    test_forced_cases();
    test_forced_corpus(corpus);

    tokcase tcs[2] = {{"gpt2", NULL, 0}, {"stories260K", NULL, 0}};
    const char *dirs[2] = {"gpt2-tokenizer", "stories260K"};
    int n_tc = 0;
    for (int i = 0; i < 2; i++) {
        char d[600];
        int rc = zs_tokenizer_load(tu_model_dir(d, sizeof d, dirs[i]), &tcs[n_tc].tok);
        CHECK(rc == 0, "load %s: %s", d, zs_errmsg());
        if (rc == 0) {
            tcs[n_tc].name = tcs[i].name;
            tcs[n_tc].n_vocab = zs_tokenizer_vocab_size(tcs[n_tc].tok);
            n_tc++;
        }
    }
    test_masks(corpus, tcs, n_tc);
    test_spell(corpus, tcs, n_tc);
    for (int i = 0; i < n_tc; i++) zs_tokenizer_free(tcs[i].tok);
    json_decref(corpus);
    return tu_finish("test-jsonschema");
}
