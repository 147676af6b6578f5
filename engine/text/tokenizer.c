/* tokenizer.c — loading a Hugging Face tokenizer.json (BPE model) and the model's
 * tokenizer_config.json / config.json / generation_config.json into an immutable zs_tokenizer,
 * plus the simple accessors. Encoding is in tokenizer-encode.c, decoding in tokenizer-decode.c. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "common.h"
#include "tokenizer-internal.h"

#define MAX_ID (1 << 24) /* ids at or above this are rejected as out of range */

/* ---------------------------------------------------------------- string -> id hash map */

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static int32_t strmap_get(const zs_tok_strmap *m, char *const *str, const uint32_t *len,
                          const char *s, size_t n) {
    if (!m->slot) return -1;
    for (size_t i = hash_bytes(s, n) & m->mask;; i = (i + 1) & m->mask) {
        int32_t id = m->slot[i];
        if (id < 0) return -1;
        if (len[id] == n && memcmp(str[id], s, n) == 0) return id;
    }
}

/* Builds the map over every non-NULL str[id]; for equal strings the lower id wins. */
static int strmap_build(zs_tok_strmap *m, char *const *str, const uint32_t *len, int32_t n) {
    size_t cap = 16;
    while (cap < (size_t)n * 2) cap *= 2;
    m->slot = malloc(cap * sizeof *m->slot);
    if (!m->slot) return zs_err(ZS_ENOMEM, "tokenizer: out of memory");
    memset(m->slot, 0xff, cap * sizeof *m->slot);
    m->mask = cap - 1;
    for (int32_t id = 0; id < n; id++) {
        if (!str[id]) continue;
        size_t i = hash_bytes(str[id], len[id]) & m->mask;
        for (; m->slot[i] >= 0; i = (i + 1) & m->mask)
            if (len[m->slot[i]] == len[id] && !memcmp(str[m->slot[i]], str[id], len[id])) break;
        if (m->slot[i] < 0) m->slot[i] = id;
    }
    return 0;
}

int32_t zs_tokenizer_model_lookup(const zs_tokenizer *t, const char *s, size_t n) {
    return strmap_get(&t->model_map, t->mpiece, t->mpiece_len, s, n);
}

static int32_t any_lookup(const zs_tokenizer *t, const char *s, size_t n) {
    return strmap_get(&t->all_map, t->piece, t->piece_len, s, n);
}

/* ---------------------------------------------------------------- GPT-2 bytes_to_unicode */

uint32_t zs_tokenizer_byte_to_cp(int b) {
    /* printable bytes stand for themselves; the others map to 256 + k in byte order */
    if ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)) return (uint32_t)b;
    int k = 0;
    for (int c = 0; c < b; c++)
        if (!((c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF))) k++;
    return 256u + (uint32_t)k;
}

/* ---------------------------------------------------------------- JSON helpers */

static int load_json(const char *path, int required, json_t **out) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (errno == ENOENT && !required) {
            *out = NULL;
            return 0;
        }
        if (errno == ENOENT) return zs_err(ZS_ENOTFOUND, "%s: no such file", path);
        return zs_err(ZS_EIO, "%s: cannot open: %s", path, strerror(errno));
    }
    json_error_t e;
    json_t *j = json_loadf(f, 0, &e);
    fclose(f);
    if (!j)
        return zs_err(ZS_EFORMAT, "%s: not valid JSON: %s (line %d, column %d)", path, e.text, e.line,
                      e.column);
    if (!json_is_object(j)) {
        json_decref(j);
        return zs_err(ZS_EFORMAT, "%s: not a JSON object", path);
    }
    *out = j;
    return 0;
}

/* obj[key] as bool; def when absent or null; -1 with a message when of another type. */
static int get_bool(const char *path, const char *what, json_t *obj, const char *key, int def) {
    json_t *v = obj ? json_object_get(obj, key) : NULL;
    if (!v || json_is_null(v)) return def;
    if (!json_is_boolean(v)) return zs_err(ZS_EFORMAT, "%s: %s.%s is not a boolean", path, what, key);
    return json_is_true(v);
}

/* obj[key] as a string or NULL when absent/null; *bad set (with message) on another type. */
static const char *get_str(const char *path, const char *what, json_t *obj, const char *key, int *bad) {
    json_t *v = obj ? json_object_get(obj, key) : NULL;
    if (!v || json_is_null(v)) return NULL;
    if (!json_is_string(v)) {
        *bad = zs_err(ZS_EFORMAT, "%s: %s.%s is not a string", path, what, key);
        return NULL;
    }
    return json_string_value(v);
}

static const char *type_of(json_t *obj) {
    json_t *v = json_object_get(obj, "type");
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static char *dupn(const char *s, size_t n) {
    char *p = malloc(n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = 0;
    }
    return p;
}

/* ---------------------------------------------------------------- model: vocab and merges */

static int set_piece(char **arr, uint32_t *lens, int32_t id, const char *s, size_t n) {
    arr[id] = dupn(s, n);
    if (!arr[id]) return zs_err(ZS_ENOMEM, "tokenizer: out of memory");
    lens[id] = (uint32_t)n;
    return 0;
}

static int parse_id(const char *path, const char *what, json_t *v, int32_t *out) {
    if (!json_is_integer(v)) return zs_err(ZS_EFORMAT, "%s: %s: id is not an integer", path, what);
    json_int_t id = json_integer_value(v);
    if (id < 0 || id >= MAX_ID)
        return zs_err(ZS_ERANGE, "%s: %s: id %lld out of range [0, %d)", path, what, (long long)id, MAX_ID);
    *out = (int32_t)id;
    return 0;
}

static int parse_vocab_and_added(zs_tokenizer *t, const char *path, json_t *model, json_t *added) {
    json_t *vocab = json_object_get(model, "vocab");
    if (!json_is_object(vocab)) return zs_err(ZS_EFORMAT, "%s: model.vocab is missing or not an object", path);
    if (added && !json_is_null(added) && !json_is_array(added))
        return zs_err(ZS_EFORMAT, "%s: added_tokens is not an array", path);
    int32_t max_id = -1, id = 0;
    const char *key;
    json_t *v;
    char what[128];
    json_object_foreach(vocab, key, v) {
        snprintf(what, sizeof what, "model.vocab \"%.60s\"", key);
        ZS_CHECK(parse_id(path, what, v, &id));
        if (id > max_id) max_id = id;
    }
    size_t na = json_is_array(added) ? json_array_size(added) : 0;
    for (size_t i = 0; i < na; i++) {
        json_t *a = json_array_get(added, i);
        snprintf(what, sizeof what, "added_tokens[%zu]", i);
        if (!json_is_object(a)) return zs_err(ZS_EFORMAT, "%s: %s is not an object", path, what);
        json_t *c = json_object_get(a, "content");
        if (!json_is_string(c) || json_string_length(c) == 0)
            return zs_err(ZS_EFORMAT, "%s: %s.content is missing or empty", path, what);
        ZS_CHECK(parse_id(path, what, json_object_get(a, "id"), &id));
        if (id > max_id) max_id = id;
    }
    if (max_id < 0) return zs_err(ZS_EFORMAT, "%s: the vocabulary is empty", path);
    int32_t n = max_id + 1;
    t->n_vocab = n;
    t->piece = calloc((size_t)n, sizeof *t->piece);
    t->piece_len = calloc((size_t)n, sizeof *t->piece_len);
    t->mpiece = calloc((size_t)n, sizeof *t->mpiece);
    t->mpiece_len = calloc((size_t)n, sizeof *t->mpiece_len);
    t->flags = calloc((size_t)n, 1);
    if (!t->piece || !t->piece_len || !t->mpiece || !t->mpiece_len || !t->flags)
        return zs_err(ZS_ENOMEM, "tokenizer: out of memory");
    json_object_foreach(vocab, key, v) {
        id = (int32_t)json_integer_value(v);
        if (t->mpiece[id])
            return zs_err(ZS_EFORMAT, "%s: model.vocab: id %d is used by both \"%.60s\" and \"%.60s\"", path, id,
                          t->mpiece[id], key);
        ZS_CHECK(set_piece(t->mpiece, t->mpiece_len, id, key, strlen(key)));
        ZS_CHECK(set_piece(t->piece, t->piece_len, id, key, strlen(key)));
        t->flags[id] |= ZS_TOK_F_MODEL;
    }
    if (na) {
        t->added = calloc(na, sizeof *t->added);
        if (!t->added) return zs_err(ZS_ENOMEM, "tokenizer: out of memory");
    }
    for (size_t i = 0; i < na; i++) {
        json_t *a = json_array_get(added, i);
        json_t *c = json_object_get(a, "content");
        id = (int32_t)json_integer_value(json_object_get(a, "id"));
        if (t->flags[id] & ZS_TOK_F_ADDED)
            return zs_err(ZS_EFORMAT, "%s: added_tokens: id %d appears twice", path, id);
        zs_tok_added *at = &t->added[t->n_added++];
        at->len = json_string_length(c);
        at->content = dupn(json_string_value(c), at->len);
        if (!at->content) return zs_err(ZS_ENOMEM, "tokenizer: out of memory");
        at->id = id;
        snprintf(what, sizeof what, "added_tokens[%zu]", i);
        at->special = get_bool(path, what, a, "special", 0);
        at->lstrip = get_bool(path, what, a, "lstrip", 0);
        at->rstrip = get_bool(path, what, a, "rstrip", 0);
        if (at->special < 0 || at->lstrip < 0 || at->rstrip < 0) return ZS_EFORMAT;
        free(t->piece[id]);
        ZS_CHECK(set_piece(t->piece, t->piece_len, id, at->content, at->len));
        t->flags[id] |= ZS_TOK_F_ADDED | (at->special ? ZS_TOK_F_SPECIAL : 0);
    }
    ZS_CHECK(strmap_build(&t->model_map, t->mpiece, t->mpiece_len, n));
    ZS_CHECK(strmap_build(&t->all_map, t->piece, t->piece_len, n));
    return 0;
}

static int cmp_added(const void *pa, const void *pb) {
    const zs_tok_added *a = pa, *b = pb;
    unsigned char ca = (unsigned char)a->content[0], cb = (unsigned char)b->content[0];
    if (ca != cb) return ca < cb ? -1 : 1;
    if (a->len != b->len) return a->len > b->len ? -1 : 1; /* longest first */
    return a->id < b->id ? -1 : a->id > b->id;
}

static void index_added(zs_tokenizer *t) {
    if (t->n_added) qsort(t->added, t->n_added, sizeof *t->added, cmp_added);
    size_t k = 0;
    for (int b = 0; b <= 256; b++) {
        while (k < t->n_added && (unsigned char)t->added[k].content[0] < b) k++;
        t->added_start[b] = (uint32_t)k;
    }
}

static uint64_t pair_key(int32_t a, int32_t b) { return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b; }

static size_t pair_hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return (size_t)k;
}

static int merges_alloc(zs_tokenizer *t, size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap *= 2;
    t->mkey = malloc(cap * sizeof *t->mkey);
    t->mrank = malloc(cap * sizeof *t->mrank);
    t->mnew = malloc(cap * sizeof *t->mnew);
    if (!t->mkey || !t->mrank || !t->mnew) return zs_err(ZS_ENOMEM, "tokenizer: out of memory");
    for (size_t i = 0; i < cap; i++) t->mrank[i] = -1;
    t->mmask = cap - 1;
    return 0;
}

static void merge_put(zs_tokenizer *t, int32_t ia, int32_t ib, int32_t inew, int32_t rank) {
    uint64_t k = pair_key(ia, ib);
    size_t s = pair_hash(k) & t->mmask;
    while (t->mrank[s] >= 0 && t->mkey[s] != k) s = (s + 1) & t->mmask;
    t->mkey[s] = k; /* a repeated pair takes the later rank, as Hugging Face does */
    t->mrank[s] = rank;
    t->mnew[s] = inew;
}

/* Adds merge number r, pieces a + b (found in the vocab, as is their concatenation), to the
 * table; buf is the caller's scratch for the concatenation. Errors name src (file) and what
 * (the list, e.g. "model.merges"). */
static int merge_add(zs_tokenizer *t, const char *src, const char *what, size_t r, const char *a, size_t la,
                     const char *b, size_t lb, char **buf, size_t *bufcap) {
    int32_t ia = zs_tokenizer_model_lookup(t, a, la), ib = zs_tokenizer_model_lookup(t, b, lb);
    if (ia < 0 || ib < 0)
        return zs_err(ZS_EFORMAT, "%s: %s[%zu] (\"%.*s\" \"%.*s\"): token \"%.*s\" is not in the vocab", src, what, r,
                      (int)ZS_MIN(la, 60), a, (int)ZS_MIN(lb, 60), b, (int)ZS_MIN(ia < 0 ? la : lb, 60),
                      ia < 0 ? a : b);
    if (la + lb > *bufcap) {
        size_t cap = (la + lb) * 2;
        char *nb = realloc(*buf, cap);
        if (!nb) return zs_err(ZS_ENOMEM, "tokenizer: out of memory");
        *buf = nb;
        *bufcap = cap;
    }
    memcpy(*buf, a, la);
    memcpy(*buf + la, b, lb);
    int32_t inew = zs_tokenizer_model_lookup(t, *buf, la + lb);
    if (inew < 0)
        return zs_err(ZS_EFORMAT, "%s: %s[%zu]: merged token \"%.*s\" is not in the vocab", src, what, r,
                      (int)ZS_MIN(la + lb, 120), *buf);
    merge_put(t, ia, ib, inew, (int32_t)r);
    return 0;
}

static int parse_merges(zs_tokenizer *t, const char *path, json_t *model) {
    json_t *merges = json_object_get(model, "merges");
    if (!merges || json_is_null(merges)) return 0;
    if (!json_is_array(merges)) return zs_err(ZS_EFORMAT, "%s: model.merges is not an array", path);
    size_t n = json_array_size(merges);
    ZS_CHECK(merges_alloc(t, n));
    char *buf = NULL;
    size_t bufcap = 0;
    int rc = 0;
    for (size_t r = 0; r < n && rc == 0; r++) {
        json_t *m = json_array_get(merges, r);
        const char *a, *b;
        size_t la, lb;
        if (json_is_string(m)) {
            a = json_string_value(m);
            const char *sp = strchr(a, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                rc = zs_err(ZS_EFORMAT, "%s: model.merges[%zu] \"%.80s\" is not two tokens separated by one space",
                            path, r, a);
                break;
            }
            la = (size_t)(sp - a);
            b = sp + 1;
            lb = strlen(b);
        } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
                   json_is_string(json_array_get(m, 1))) {
            a = json_string_value(json_array_get(m, 0));
            b = json_string_value(json_array_get(m, 1));
            la = json_string_length(json_array_get(m, 0));
            lb = json_string_length(json_array_get(m, 1));
        } else {
            rc = zs_err(ZS_EFORMAT, "%s: model.merges[%zu] is neither \"a b\" nor [\"a\", \"b\"]", path, r);
            break;
        }
        rc = merge_add(t, path, "model.merges", r, a, la, b, lb, &buf, &bufcap);
    }
    free(buf);
    return rc;
}

static int check_model_type(const char *path, json_t *model) {
    if (!json_is_object(model)) return zs_err(ZS_EFORMAT, "%s: \"model\" is missing or not an object", path);
    const char *type = type_of(model);
    if (type && strcmp(type, "BPE"))
        return zs_err(ZS_EUNSUPPORTED, "%s: model type \"%s\" is not supported (only BPE)", path, type);
    if (!type && !json_object_get(model, "merges"))
        return zs_err(ZS_EUNSUPPORTED, "%s: model has no type and no merges (only BPE is supported)", path);
    return 0;
}

static int parse_model(zs_tokenizer *t, const char *path, json_t *model) {
    int bad = 0;
    const char *pre = get_str(path, "model", model, "continuing_subword_prefix", &bad);
    const char *suf = get_str(path, "model", model, "end_of_word_suffix", &bad);
    if (bad) return bad;
    if ((pre && *pre) || (suf && *suf))
        return zs_err(ZS_EUNSUPPORTED, "%s: BPE continuing_subword_prefix/end_of_word_suffix are not supported",
                      path);
    t->byte_fallback = get_bool(path, "model", model, "byte_fallback", 0);
    t->ignore_merges = get_bool(path, "model", model, "ignore_merges", 0);
    t->fuse_unk = get_bool(path, "model", model, "fuse_unk", 0);
    if (t->byte_fallback < 0 || t->ignore_merges < 0 || t->fuse_unk < 0) return ZS_EFORMAT;
    const char *unk = get_str(path, "model", model, "unk_token", &bad);
    if (bad) return bad;
    t->unk_id = unk ? zs_tokenizer_model_lookup(t, unk, strlen(unk)) : -1;
    return parse_merges(t, path, model);
}

/* ---------------------------------------------------------------- normalizer, pre-tokenizer */

static int parse_normalizer(zs_tokenizer *t, const char *path, json_t *n, int depth) {
    if (!n || json_is_null(n)) return 0;
    const char *type = json_is_object(n) ? type_of(n) : NULL;
    if (!type || depth > 8) return zs_err(ZS_EFORMAT, "%s: normalizer is not an object with a type", path);
    if (!strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(n, "normalizers");
        if (!json_is_array(arr)) return zs_err(ZS_EFORMAT, "%s: normalizer Sequence has no \"normalizers\" array", path);
        for (size_t i = 0; i < json_array_size(arr); i++)
            ZS_CHECK(parse_normalizer(t, path, json_array_get(arr, i), depth + 1));
        return 0;
    }
    if (!strcmp(type, "NFC")) return 0; /* treated as identity: input text is expected in NFC already */
    zs_tok_norm nm = {0};
    int bad = 0;
    if (!strcmp(type, "Prepend")) {
        const char *s = get_str(path, "normalizer Prepend", n, "prepend", &bad);
        if (bad) return bad;
        if (!s) return zs_err(ZS_EFORMAT, "%s: normalizer Prepend has no \"prepend\" string", path);
        nm.kind = ZS_TOK_NORM_PREPEND;
        nm.a = strdup(s);
    } else if (!strcmp(type, "Replace")) {
        json_t *pat = json_object_get(n, "pattern");
        const char *from = get_str(path, "normalizer Replace.pattern", pat, "String", &bad);
        const char *to = get_str(path, "normalizer Replace", n, "content", &bad);
        if (bad) return bad;
        if (!from || !*from || !to)
            return zs_err(ZS_EUNSUPPORTED, "%s: normalizer Replace needs a non-empty String pattern and a content "
                          "(Regex patterns are not supported)", path);
        nm.kind = ZS_TOK_NORM_REPLACE;
        nm.a = strdup(from);
        nm.b = strdup(to);
        if (!nm.b) {
            free(nm.a);
            nm.a = NULL;
        }
    } else {
        return zs_err(ZS_EUNSUPPORTED, "%s: normalizer \"%s\" is not supported", path, type);
    }
    if (!nm.a) return zs_err(ZS_ENOMEM, "tokenizer: out of memory");
    zs_tok_norm *nn = realloc(t->norm, (t->n_norm + 1) * sizeof *nn);
    if (!nn) {
        free(nm.a);
        free(nm.b);
        return zs_err(ZS_ENOMEM, "tokenizer: out of memory");
    }
    t->norm = nn;
    t->norm[t->n_norm++] = nm;
    return 0;
}

static int parse_prepend_scheme(const char *path, json_t *p, int *out) {
    int bad = 0;
    const char *s = get_str(path, "Metaspace", p, "prepend_scheme", &bad);
    if (bad) return bad;
    if (!s) { /* older files: add_prefix_space */
        int aps = get_bool(path, "Metaspace", p, "add_prefix_space", 1);
        if (aps < 0) return ZS_EFORMAT;
        *out = aps ? ZS_TOK_PREPEND_ALWAYS : ZS_TOK_PREPEND_NEVER;
    } else if (!strcmp(s, "first")) *out = ZS_TOK_PREPEND_FIRST;
    else if (!strcmp(s, "always")) *out = ZS_TOK_PREPEND_ALWAYS;
    else if (!strcmp(s, "never")) *out = ZS_TOK_PREPEND_NEVER;
    else return zs_err(ZS_EFORMAT, "%s: Metaspace prepend_scheme \"%s\" is not first/always/never", path, s);
    return 0;
}

static int metaspace_repl(const char *path, json_t *p, char out[8]) {
    int bad = 0;
    const char *r = get_str(path, "Metaspace", p, "replacement", &bad);
    if (bad) return bad;
    if (!r) r = "\xe2\x96\x81";
    if (!*r || strlen(r) >= 8) return zs_err(ZS_EFORMAT, "%s: Metaspace replacement must be one character", path);
    strcpy(out, r);
    return 0;
}

static int parse_pretok(zs_tokenizer *t, const char *path, json_t *p, int depth) {
    if (!p || json_is_null(p)) return 0;
    const char *type = json_is_object(p) ? type_of(p) : NULL;
    if (!type || depth > 8) return zs_err(ZS_EFORMAT, "%s: pre_tokenizer is not an object with a type", path);
    if (!strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(p, "pretokenizers");
        if (!json_is_array(arr))
            return zs_err(ZS_EFORMAT, "%s: pre_tokenizer Sequence has no \"pretokenizers\" array", path);
        for (size_t i = 0; i < json_array_size(arr); i++)
            ZS_CHECK(parse_pretok(t, path, json_array_get(arr, i), depth + 1));
        return 0;
    }
    if (t->byte_level)
        return zs_err(ZS_EUNSUPPORTED, "%s: pre-tokenizer \"%s\" after ByteLevel is not supported", path, type);
    zs_tok_pretok pt = {0};
    if (!strcmp(type, "ByteLevel")) {
        pt.kind = ZS_TOK_PT_BYTELEVEL;
        pt.add_prefix_space = get_bool(path, "pre_tokenizer ByteLevel", p, "add_prefix_space", 1);
        pt.use_regex = get_bool(path, "pre_tokenizer ByteLevel", p, "use_regex", 1);
        if (pt.add_prefix_space < 0 || pt.use_regex < 0) return ZS_EFORMAT;
        t->byte_level = 1;
    } else if (!strcmp(type, "Split")) {
        int bad = 0;
        json_t *pat = json_object_get(p, "pattern");
        const char *re = get_str(path, "pre_tokenizer Split.pattern", pat, "Regex", &bad);
        const char *beh = get_str(path, "pre_tokenizer Split", p, "behavior", &bad);
        int inv = get_bool(path, "pre_tokenizer Split", p, "invert", 0);
        if (bad) return bad;
        if (inv < 0) return ZS_EFORMAT;
        if (!re) return zs_err(ZS_EUNSUPPORTED, "%s: pre-tokenizer Split without a Regex pattern is not supported", path);
        pt.kind = ZS_TOK_PT_SPLIT;
        pt.split_kind = zs_tokenizer_split_kind(re);
        if (!pt.split_kind)
            return zs_err(ZS_EUNSUPPORTED, "%s: pre-tokenizer Split regex \"%.300s\" is not supported (known: the GPT-2, "
                          "Llama 3 and Qwen2 patterns)", path, re);
        if (inv || (beh && strcmp(beh, "Isolated")))
            return zs_err(ZS_EUNSUPPORTED, "%s: pre-tokenizer Split behavior \"%s\"%s is not supported (only Isolated)",
                          path, beh ? beh : "?", inv ? " with invert" : "");
    } else if (!strcmp(type, "Digits")) {
        int ind = get_bool(path, "pre_tokenizer Digits", p, "individual_digits", 0);
        if (ind < 0) return ZS_EFORMAT;
        pt.kind = ZS_TOK_PT_SPLIT;
        pt.split_kind = ind ? ZS_TOK_SPLIT_DIGITS : ZS_TOK_SPLIT_DIGIT_RUNS;
    } else if (!strcmp(type, "Metaspace")) {
        pt.kind = ZS_TOK_PT_METASPACE;
        ZS_CHECK(metaspace_repl(path, p, pt.repl));
        ZS_CHECK(parse_prepend_scheme(path, p, &pt.prepend));
        pt.split = get_bool(path, "pre_tokenizer Metaspace", p, "split", 1);
        if (pt.split < 0) return ZS_EFORMAT;
    } else {
        return zs_err(ZS_EUNSUPPORTED, "%s: pre-tokenizer \"%s\" is not supported", path, type);
    }
    zs_tok_pretok *np = realloc(t->pretok, (t->n_pretok + 1) * sizeof *np);
    if (!np) return zs_err(ZS_ENOMEM, "tokenizer: out of memory");
    t->pretok = np;
    t->pretok[t->n_pretok++] = pt;
    return 0;
}

/* ---------------------------------------------------------------- post-processor */

typedef struct {
    int32_t *v;
    size_t n;
} idvec;

static int idvec_push(idvec *a, int32_t id) {
    int32_t *nv = realloc(a->v, (a->n + 1) * sizeof *nv);
    if (!nv) return zs_err(ZS_ENOMEM, "tokenizer: out of memory");
    a->v = nv;
    a->v[a->n++] = id;
    return 0;
}

/* The ids of a template SpecialToken named name. */
static int template_special(zs_tokenizer *t, const char *path, json_t *post, const char *name, idvec *dst) {
    json_t *st = json_object_get(json_object_get(post, "special_tokens"), name);
    json_t *ids = st ? json_object_get(st, "ids") : NULL;
    if (json_is_array(ids)) {
        for (size_t i = 0; i < json_array_size(ids); i++) {
            int32_t id = 0;
            ZS_CHECK(parse_id(path, "post_processor special_tokens", json_array_get(ids, i), &id));
            if (id >= t->n_vocab)
                return zs_err(ZS_ERANGE, "%s: post_processor token \"%s\" id %d is not in the vocab", path, name, id);
            ZS_CHECK(idvec_push(dst, id));
        }
        return 0;
    }
    int32_t id = any_lookup(t, name, strlen(name));
    if (id < 0) return zs_err(ZS_EFORMAT, "%s: post_processor token \"%s\" is not in the vocab", path, name);
    return idvec_push(dst, id);
}

static int parse_post(zs_tokenizer *t, const char *path, json_t *p, idvec *pre, idvec *suf, int depth) {
    if (!p || json_is_null(p)) return 0;
    const char *type = json_is_object(p) ? type_of(p) : NULL;
    if (!type || depth > 8) return zs_err(ZS_EFORMAT, "%s: post_processor is not an object with a type", path);
    if (!strcmp(type, "ByteLevel")) return 0; /* offsets only */
    if (!strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(p, "processors");
        if (!json_is_array(arr))
            return zs_err(ZS_EFORMAT, "%s: post_processor Sequence has no \"processors\" array", path);
        for (size_t i = 0; i < json_array_size(arr); i++)
            ZS_CHECK(parse_post(t, path, json_array_get(arr, i), pre, suf, depth + 1));
        return 0;
    }
    if (!strcmp(type, "TemplateProcessing")) {
        json_t *single = json_object_get(p, "single");
        if (!json_is_array(single))
            return zs_err(ZS_EFORMAT, "%s: post_processor TemplateProcessing has no \"single\" array", path);
        int seen_a = 0;
        for (size_t i = 0; i < json_array_size(single); i++) {
            json_t *it = json_array_get(single, i);
            json_t *sp = json_object_get(it, "SpecialToken");
            if (json_object_get(it, "Sequence")) {
                seen_a = 1;
            } else if (json_is_string(json_object_get(sp, "id"))) {
                ZS_CHECK(template_special(t, path, p, json_string_value(json_object_get(sp, "id")), seen_a ? suf : pre));
            } else {
                return zs_err(ZS_EFORMAT, "%s: post_processor TemplateProcessing single[%zu] is not a SpecialToken "
                              "or Sequence", path, i);
            }
        }
        return 0;
    }
    if (!strcmp(type, "BertProcessing") || !strcmp(type, "RobertaProcessing")) {
        json_t *cls = json_object_get(p, "cls"), *sep = json_object_get(p, "sep");
        int32_t a = 0, b = 0;
        if (!json_is_array(cls) || !json_is_array(sep))
            return zs_err(ZS_EFORMAT, "%s: post_processor %s needs cls and sep", path, type);
        ZS_CHECK(parse_id(path, "post_processor cls", json_array_get(cls, 1), &a));
        ZS_CHECK(parse_id(path, "post_processor sep", json_array_get(sep, 1), &b));
        if (a >= t->n_vocab || b >= t->n_vocab)
            return zs_err(ZS_ERANGE, "%s: post_processor cls/sep id is not in the vocab", path);
        ZS_CHECK(idvec_push(pre, a));
        return idvec_push(suf, b);
    }
    return zs_err(ZS_EUNSUPPORTED, "%s: post_processor \"%s\" is not supported", path, type);
}

/* ---------------------------------------------------------------- decoder */

enum { DEC_REPLACE = 1, DEC_BYTEFALLBACK = 2, DEC_BYTELEVEL = 3 };
typedef struct {
    int kind;
    char from[16], to[16];
} dec_step;

typedef struct {
    dec_step s[16];
    int n;
    int inv[0x144]; /* bytes_to_unicode inverse: code point -> byte, or -1 */
} dec_steps;

static int parse_decoder(zs_tokenizer *t, const char *path, json_t *d, dec_steps *st, int depth) {
    if (!d || json_is_null(d)) return 0;
    const char *type = json_is_object(d) ? type_of(d) : NULL;
    if (!type || depth > 8) return zs_err(ZS_EFORMAT, "%s: decoder is not an object with a type", path);
    if (!strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(d, "decoders");
        if (!json_is_array(arr)) return zs_err(ZS_EFORMAT, "%s: decoder Sequence has no \"decoders\" array", path);
        for (size_t i = 0; i < json_array_size(arr); i++)
            ZS_CHECK(parse_decoder(t, path, json_array_get(arr, i), st, depth + 1));
        return 0;
    }
    if (!strcmp(type, "Fuse")) return 0;
    if (st->n >= 16) return zs_err(ZS_EUNSUPPORTED, "%s: too many decoder steps", path);
    dec_step *s = &st->s[st->n];
    memset(s, 0, sizeof *s);
    int bad = 0;
    if (!strcmp(type, "ByteLevel")) {
        s->kind = DEC_BYTELEVEL;
    } else if (!strcmp(type, "ByteFallback")) {
        s->kind = DEC_BYTEFALLBACK;
    } else if (!strcmp(type, "Replace")) {
        const char *from = get_str(path, "decoder Replace.pattern", json_object_get(d, "pattern"), "String", &bad);
        const char *to = get_str(path, "decoder Replace", d, "content", &bad);
        if (bad) return bad;
        if (!from || !*from || !to || strlen(from) >= 16 || strlen(to) > strlen(from))
            return zs_err(ZS_EUNSUPPORTED, "%s: decoder Replace is supported only for a String pattern no shorter "
                          "than its content", path);
        s->kind = DEC_REPLACE;
        strcpy(s->from, from);
        strcpy(s->to, to);
    } else if (!strcmp(type, "Metaspace")) {
        int scheme;
        ZS_CHECK(metaspace_repl(path, d, s->from));
        ZS_CHECK(parse_prepend_scheme(path, d, &scheme));
        s->kind = DEC_REPLACE;
        strcpy(s->to, " ");
        if (scheme != ZS_TOK_PREPEND_NEVER) t->strip_leading = 1;
    } else if (!strcmp(type, "Strip")) {
        const char *c = get_str(path, "decoder Strip", d, "content", &bad);
        json_t *start = json_object_get(d, "start"), *stop = json_object_get(d, "stop");
        if (bad) return bad;
        if (!c || strcmp(c, " ") || !json_is_integer(start) || json_integer_value(start) < 0 ||
            json_integer_value(start) > 64 || (stop && json_integer_value(stop) != 0))
            return zs_err(ZS_EUNSUPPORTED, "%s: decoder Strip is supported only for leading spaces", path);
        t->strip_leading = (int)json_integer_value(start);
        return 0;
    } else {
        return zs_err(ZS_EUNSUPPORTED, "%s: decoder \"%s\" is not supported", path, type);
    }
    st->n++;
    return 0;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* "<0xHH>" -> byte value, else -1. */
static int byte_token(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return -1;
    int h = hexval(s[3]), l = hexval(s[4]);
    return h < 0 || l < 0 ? -1 : h * 16 + l;
}

/* Applies the decoder steps to one model piece: in[0..n) -> out and tmp (n + 16 bytes each; no
 * step makes a piece longer). */
static size_t decode_piece(const dec_steps *st, const char *in, size_t n, char *out, char *tmp) {
    memcpy(out, in, n);
    for (int k = 0; k < st->n; k++) {
        const dec_step *s = &st->s[k];
        size_t m = 0;
        if (s->kind == DEC_BYTEFALLBACK) {
            int b = byte_token(out, n);
            if (b >= 0) {
                out[0] = (char)b;
                n = 1;
            }
            continue;
        }
        if (s->kind == DEC_REPLACE) {
            size_t lf = strlen(s->from), lt = strlen(s->to);
            for (size_t i = 0; i < n;) {
                if (i + lf <= n && !memcmp(out + i, s->from, lf)) {
                    memcpy(tmp + m, s->to, lt), m += lt, i += lf;
                } else {
                    tmp[m++] = out[i++];
                }
            }
        } else { /* DEC_BYTELEVEL: each char maps back to its byte; others stay as they are */
            for (size_t i = 0; i < n;) {
                uint32_t cp;
                int l = zs_tokenizer_utf8_decode((const unsigned char *)out + i, n - i, &cp);
                int b = l > 0 && cp < 0x144 ? st->inv[cp] : -1;
                if (l <= 0) l = 1, b = (unsigned char)out[i];
                if (b >= 0) tmp[m++] = (char)b;
                else memcpy(tmp + m, out + i, (size_t)l), m += (size_t)l;
                i += (size_t)l;
            }
        }
        memcpy(out, tmp, m);
        n = m;
    }
    return n;
}

static int build_decode_table(zs_tokenizer *t, dec_steps *st) {
    for (int i = 0; i < 0x144; i++) st->inv[i] = -1;
    for (int b = 0; b < 256; b++) st->inv[zs_tokenizer_byte_to_cp(b)] = b;
    size_t total = 0, maxlen = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        total += t->piece_len[id];
        maxlen = ZS_MAX(maxlen, t->piece_len[id]);
    }
    size_t room = maxlen + 16;
    t->dec_off = malloc(((size_t)t->n_vocab + 1) * sizeof *t->dec_off);
    char *out = malloc(room), *tmp = malloc(room);
    size_t cap = total + 64;
    t->dec_blob = malloc(cap);
    int rc = 0;
    if (!t->dec_off || !out || !tmp || !t->dec_blob) rc = zs_err(ZS_ENOMEM, "tokenizer: out of memory");
    size_t pos = 0;
    for (int32_t id = 0; id < t->n_vocab && rc == 0; id++) {
        t->dec_off[id] = pos;
        size_t n;
        if (!t->piece[id]) continue;
        if (t->flags[id] & ZS_TOK_F_ADDED) { /* added tokens decode to their content */
            n = t->piece_len[id];
            memcpy(out, t->piece[id], n);
        } else {
            n = decode_piece(st, t->mpiece[id], t->mpiece_len[id], out, tmp);
        }
        if (pos + n > cap) {
            cap = (pos + n) * 2;
            char *nb = realloc(t->dec_blob, cap);
            if (!nb) {
                rc = zs_err(ZS_ENOMEM, "tokenizer: out of memory");
                break;
            }
            t->dec_blob = nb;
        }
        memcpy(t->dec_blob + pos, out, n);
        pos += n;
    }
    if (rc == 0) t->dec_off[t->n_vocab] = pos;
    free(out);
    free(tmp);
    return rc;
}

/* ---------------------------------------------------------------- initial symbols */

static void build_byte_ids(zs_tokenizer *t) {
    for (int b = 0; b < 256; b++) {
        char s[8];
        int n;
        if (t->byte_level) {
            n = zs_tokenizer_utf8_encode(zs_tokenizer_byte_to_cp(b), s);
        } else {
            n = snprintf(s, sizeof s, "<0x%02X>", b);
        }
        t->byte_id[b] = zs_tokenizer_model_lookup(t, s, (size_t)n);
    }
}

/* ---------------------------------------------------------------- bos / eos from the configs */

/* A token given as "text" or {"content": "text"} in tokenizer_config.json -> id, or -1. */
static int config_token(zs_tokenizer *t, const char *path, json_t *tc, const char *key, int32_t *out) {
    *out = -1;
    json_t *v = tc ? json_object_get(tc, key) : NULL;
    if (!v || json_is_null(v)) return 0;
    if (json_is_object(v)) v = json_object_get(v, "content");
    if (!json_is_string(v)) return zs_err(ZS_EFORMAT, "%s: %s is neither a string nor {\"content\": ...}", path, key);
    *out = any_lookup(t, json_string_value(v), json_string_length(v));
    if (*out < 0)
        return zs_err(ZS_EFORMAT, "%s: %s \"%.80s\" is not in the vocab", path, key, json_string_value(v));
    return 0;
}

/* "<key>": int | [int, ...] | null -> appended to ids. */
static int config_ids(zs_tokenizer *t, const char *path, json_t *cfg, const char *key, idvec *ids) {
    json_t *v = cfg ? json_object_get(cfg, key) : NULL;
    if (!v || json_is_null(v)) return 0;
    size_t n = json_is_array(v) ? json_array_size(v) : 1;
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_is_array(v) ? json_array_get(v, i) : v;
        if (!json_is_integer(e)) return zs_err(ZS_EFORMAT, "%s: %s is not an integer or a list of integers", path, key);
        json_int_t id = json_integer_value(e);
        if (id < 0 || id >= t->n_vocab)
            return zs_err(ZS_ERANGE, "%s: %s %lld is out of range [0, %d)", path, key, (long long)id, t->n_vocab);
        ZS_CHECK(idvec_push(ids, (int32_t)id));
    }
    return 0;
}

static int load_special_ids(zs_tokenizer *t, const char *dir, idvec *pre, idvec *suf) {
    static const char *names[3] = {"tokenizer_config.json", "generation_config.json", "config.json"};
    json_t *cfg[3] = {NULL, NULL, NULL};
    char path[3][4096];
    int rc = 0;
    for (int i = 0; i < 3 && rc == 0; i++) {
        snprintf(path[i], sizeof path[i], "%s/%s", dir, names[i]);
        rc = load_json(path[i], 0, &cfg[i]);
    }
    idvec bos = {0}, eos = {0};
    int32_t tc_bos = -1, tc_eos = -1;
    if (rc == 0) rc = config_token(t, path[0], cfg[0], "bos_token", &tc_bos);
    if (rc == 0) rc = config_token(t, path[0], cfg[0], "eos_token", &tc_eos);
    if (rc == 0 && tc_bos >= 0) rc = idvec_push(&bos, tc_bos);
    if (rc == 0 && tc_eos >= 0) rc = idvec_push(&eos, tc_eos);
    for (int i = 1; i < 3 && rc == 0; i++) {
        rc = config_ids(t, path[i], cfg[i], "bos_token_id", &bos);
        if (rc == 0) rc = config_ids(t, path[i], cfg[i], "eos_token_id", &eos);
    }
    int add_bos = -1, add_eos = -1;
    if (rc == 0 && cfg[0]) {
        add_bos = get_bool(path[0], "tokenizer_config", cfg[0], "add_bos_token", -1);
        add_eos = get_bool(path[0], "tokenizer_config", cfg[0], "add_eos_token", -1);
        if (add_bos == ZS_EFORMAT || add_eos == ZS_EFORMAT) rc = ZS_EFORMAT;
    }
    if (rc == 0) {
        t->bos = bos.n ? bos.v[0] : -1;
        t->eos = eos.n ? eos.v[0] : -1;
        t->eos_ids = eos.v;
        t->n_eos = eos.n;
        eos.v = NULL;
        /* tokenizer_config's add_bos_token/add_eos_token, when given, decide (as the Llama tokenizer
         * classes do); otherwise the post-processor template does. */
        if (add_bos >= 0 || add_eos >= 0) {
            if (add_bos < 0) add_bos = pre->n > 0;
            if (add_eos < 0) add_eos = suf->n > 0;
            pre->n = suf->n = 0;
            if (add_bos && t->bos >= 0) rc = idvec_push(pre, t->bos);
            if (rc == 0 && add_eos && t->eos >= 0) rc = idvec_push(suf, t->eos);
        }
    }
    free(bos.v);
    free(eos.v);
    for (int i = 0; i < 3; i++) json_decref(cfg[i]);
    return rc;
}

/* ---------------------------------------------------------------- load / free */

static int load(zs_tokenizer *t, const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    json_t *root = NULL;
    ZS_CHECK(load_json(path, 1, &root));
    json_t *model = json_object_get(root, "model");
    dec_steps st = {.n = 0};
    idvec pre = {0}, suf = {0};
    int rc = check_model_type(path, model);
    if (rc == 0) rc = parse_vocab_and_added(t, path, model, json_object_get(root, "added_tokens"));
    if (rc == 0) rc = parse_model(t, path, model);
    if (rc == 0) rc = parse_normalizer(t, path, json_object_get(root, "normalizer"), 0);
    if (rc == 0) rc = parse_pretok(t, path, json_object_get(root, "pre_tokenizer"), 0);
    if (rc == 0) rc = parse_post(t, path, json_object_get(root, "post_processor"), &pre, &suf, 0);
    if (rc == 0) rc = parse_decoder(t, path, json_object_get(root, "decoder"), &st, 0);
    if (rc == 0) rc = build_decode_table(t, &st);
    json_decref(root);
    if (rc == 0) {
        index_added(t);
        build_byte_ids(t);
        rc = load_special_ids(t, dir, &pre, &suf);
    }
    if (rc == 0) {
        t->prefix = pre.v, t->n_prefix = pre.n;
        t->suffix = suf.v, t->n_suffix = suf.n;
        pre.v = suf.v = NULL;
    }
    free(pre.v);
    free(suf.v);
    return rc;
}

int zs_tokenizer_load(const char *dir, zs_tokenizer **out) {
    if (!dir || !out) return zs_err(ZS_EINVAL, "zs_tokenizer_load: NULL argument");
    zs_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return zs_err(ZS_ENOMEM, "tokenizer: out of memory");
    t->bos = t->eos = t->unk_id = -1;
    int rc = load(t, dir);
    if (rc < 0) {
        zs_tokenizer_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

void zs_tokenizer_free(zs_tokenizer *t) {
    if (!t) return;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        if (t->piece) free(t->piece[i]);
        if (t->mpiece) free(t->mpiece[i]);
    }
    free(t->piece);
    free(t->piece_len);
    free(t->mpiece);
    free(t->mpiece_len);
    free(t->flags);
    free(t->model_map.slot);
    free(t->all_map.slot);
    free(t->mkey);
    free(t->mrank);
    free(t->mnew);
    for (size_t i = 0; i < t->n_added; i++) free(t->added[i].content);
    free(t->added);
    for (size_t i = 0; i < t->n_norm; i++) {
        free(t->norm[i].a);
        free(t->norm[i].b);
    }
    free(t->norm);
    free(t->pretok);
    free(t->prefix);
    free(t->suffix);
    free(t->dec_blob);
    free(t->dec_off);
    free(t->eos_ids);
    free(t);
}

/* ---------------------------------------------------------------- from plain arrays (GGUF) */

typedef struct {
    float score;
    int32_t ll, lr; /* code points of the left / right part */
    int32_t id, il, ir;
} spm_merge;

static int cmp_spm_merge(const void *pa, const void *pb) {
    const spm_merge *a = pa, *b = pb;
    if (a->score != b->score) return a->score > b->score ? -1 : 1;
    if (a->ll != b->ll) return a->ll > b->ll ? -1 : 1;
    if (a->lr != b->lr) return a->lr > b->lr ? -1 : 1;
    if (a->id != b->id) return a->id < b->id ? -1 : 1;
    if (a->il != b->il) return a->il < b->il ? -1 : 1;
    return a->ir < b->ir ? -1 : a->ir > b->ir;
}

/* SentencePiece scores -> merges (convert_from_gguf.py's generate_merges; see tokenizer.h). */
static int spm_merges(zs_tokenizer *t, const zs_tokenizer_spec *s) {
    size_t n = 0, cap = 0;
    spm_merge *v = NULL;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        const char *p = t->mpiece[id];
        size_t len = t->mpiece_len[id];
        int special = s->types ? (s->types[id] == 2 || s->types[id] == 3)
                               : (id == s->bos || id == s->eos || id == s->unk);
        float score = special ? 0.0f : s->scores[id];
        int32_t cps = 0, cl = 0;
        for (size_t i = 0; i < len; i++) cps += ((unsigned char)p[i] & 0xC0) != 0x80;
        for (size_t i = 1; i < len; i++) {
            if (((unsigned char)p[i - 1] & 0xC0) != 0x80) cl++; /* code points in p[0..i) */
            if (((unsigned char)p[i] & 0xC0) == 0x80) continue; /* split at code point boundaries */
            int32_t il = zs_tokenizer_model_lookup(t, p, i), ir = zs_tokenizer_model_lookup(t, p + i, len - i);
            if (il < 0 || ir < 0) continue;
            if (n == cap) {
                cap = cap ? cap * 2 : 1024;
                spm_merge *nv = realloc(v, cap * sizeof *v);
                if (!nv) {
                    free(v);
                    return zs_err(ZS_ENOMEM, "tokenizer: out of memory");
                }
                v = nv;
            }
            v[n++] = (spm_merge){score, cl, cps - cl, id, il, ir};
        }
    }
    if (n) qsort(v, n, sizeof *v, cmp_spm_merge);
    int rc = merges_alloc(t, n);
    for (size_t r = 0; rc == 0 && r < n; r++) merge_put(t, v[r].il, v[r].ir, v[r].id, (int32_t)r);
    free(v);
    return rc;
}

static int bpe_merges(zs_tokenizer *t, const zs_tokenizer_spec *s) {
    const char *o = s->origin;
    ZS_CHECK(merges_alloc(t, s->n_merges));
    char *buf = NULL;
    size_t bufcap = 0;
    int rc = 0;
    for (size_t r = 0; r < s->n_merges && rc == 0; r++) {
        const char *a = s->merges[r];
        size_t n = s->merge_len[r];
        const char *sp = a ? memchr(a, ' ', n) : NULL;
        if (!sp || memchr(sp + 1, ' ', n - (size_t)(sp + 1 - a))) {
            rc = zs_err(ZS_EFORMAT, "%s: merges[%zu] \"%.80s\" is not two tokens separated by one space", o, r,
                        a ? a : "");
            break;
        }
        size_t la = (size_t)(sp - a), lb = n - la - 1;
        rc = merge_add(t, o, "merges", r, a, la, sp + 1, lb, &buf, &bufcap);
    }
    free(buf);
    return rc;
}

static int add_norm(zs_tokenizer *t, int kind, const char *a, const char *b) {
    zs_tok_norm *nn = realloc(t->norm, (t->n_norm + 1) * sizeof *nn);
    if (!nn) return zs_err(ZS_ENOMEM, "tokenizer: out of memory");
    t->norm = nn;
    zs_tok_norm *m = &t->norm[t->n_norm];
    m->kind = kind;
    m->a = strdup(a);
    m->b = b ? strdup(b) : NULL;
    if (!m->a || (b && !m->b)) {
        free(m->a);
        free(m->b);
        return zs_err(ZS_ENOMEM, "tokenizer: out of memory");
    }
    t->n_norm++;
    return 0;
}

static int add_pretok(zs_tokenizer *t, zs_tok_pretok pt) {
    zs_tok_pretok *np = realloc(t->pretok, (t->n_pretok + 1) * sizeof *np);
    if (!np) return zs_err(ZS_ENOMEM, "tokenizer: out of memory");
    t->pretok = np;
    t->pretok[t->n_pretok++] = pt;
    return 0;
}

static int from_spec(zs_tokenizer *t, const zs_tokenizer_spec *s) {
    const char *o = s->origin;
    int spm = s->kind == ZS_TOK_SPEC_SPM;
    int32_t n = s->n_vocab;
    t->n_vocab = n;
    t->piece = calloc((size_t)n, sizeof *t->piece);
    t->piece_len = calloc((size_t)n, sizeof *t->piece_len);
    t->mpiece = calloc((size_t)n, sizeof *t->mpiece);
    t->mpiece_len = calloc((size_t)n, sizeof *t->mpiece_len);
    t->flags = calloc((size_t)n, 1);
    size_t n_add = 0;
    for (int32_t id = 0; s->types && id < n; id++)
        n_add += (s->types[id] == 2 || s->types[id] == 3 || s->types[id] == 4) && s->token_len[id] > 0;
    t->added = n_add ? calloc(n_add, sizeof *t->added) : NULL;
    if (!t->piece || !t->piece_len || !t->mpiece || !t->mpiece_len || !t->flags || (n_add && !t->added))
        return zs_err(ZS_ENOMEM, "tokenizer: out of memory");
    for (int32_t id = 0; id < n; id++) {
        if (!s->tokens[id] || s->token_len[id] > UINT32_MAX)
            return zs_err(ZS_EFORMAT, "%s: token %d has no text", o, id);
        ZS_CHECK(set_piece(t->mpiece, t->mpiece_len, id, s->tokens[id], s->token_len[id]));
        ZS_CHECK(set_piece(t->piece, t->piece_len, id, s->tokens[id], s->token_len[id]));
        t->flags[id] |= ZS_TOK_F_MODEL;
        int ty = s->types ? s->types[id] : 1;
        if ((ty == 2 || ty == 3 || ty == 4) && s->token_len[id] > 0) {
            zs_tok_added *at = &t->added[t->n_added++];
            at->content = dupn(s->tokens[id], s->token_len[id]);
            if (!at->content) return zs_err(ZS_ENOMEM, "tokenizer: out of memory");
            at->len = s->token_len[id];
            at->id = id;
            at->special = ty != 4;
            t->flags[id] |= ZS_TOK_F_ADDED | (at->special ? ZS_TOK_F_SPECIAL : 0);
        }
    }
    ZS_CHECK(strmap_build(&t->model_map, t->mpiece, t->mpiece_len, n));
    ZS_CHECK(strmap_build(&t->all_map, t->piece, t->piece_len, n));
    dec_steps st = {.n = 0};
    if (spm) {
        ZS_CHECK(spm_merges(t, s));
        t->byte_fallback = 1;
        t->fuse_unk = 1;
        t->unk_id = s->unk;
        if (s->add_space_prefix != 0) ZS_CHECK(add_norm(t, ZS_TOK_NORM_PREPEND, "\xe2\x96\x81", NULL));
        ZS_CHECK(add_norm(t, ZS_TOK_NORM_REPLACE, " ", "\xe2\x96\x81"));
        st.s[st.n++] = (dec_step){.kind = DEC_REPLACE, .from = "\xe2\x96\x81", .to = " "};
        st.s[st.n++] = (dec_step){.kind = DEC_BYTEFALLBACK};
        t->strip_leading = s->add_space_prefix != 0;
    } else {
        ZS_CHECK(bpe_merges(t, s));
        const char *pre = s->pre ? s->pre : "gpt2";
        int split = 0;
        if (!strcmp(pre, "llama-bpe") || !strcmp(pre, "llama3")) split = ZS_TOK_SPLIT_LLAMA3, t->ignore_merges = 1;
        else if (!strcmp(pre, "qwen2")) split = ZS_TOK_SPLIT_QWEN2;
        /* llama.cpp's "smollm" (SmolLM/StarCoder vocabularies): each digit alone, then GPT-2's regex,
         * as their tokenizer.json's Sequence[Digits(individual_digits), ByteLevel] does */
        else if (!strcmp(pre, "smollm") || !strcmp(pre, "starcoder")) split = ZS_TOK_SPLIT_DIGITS;
        else if (strcmp(pre, "gpt2") && strcmp(pre, "gpt-2") && strcmp(pre, "default")) /* gpt-2: llama.cpp's */
            return zs_err(ZS_EUNSUPPORTED, "%s: pre-tokenizer \"%.60s\" is not supported (known: gpt-2, "
                          "llama-bpe, qwen2, smollm, starcoder)", o, pre);
        if (split) ZS_CHECK(add_pretok(t, (zs_tok_pretok){.kind = ZS_TOK_PT_SPLIT, .split_kind = split}));
        int regex_split = split == ZS_TOK_SPLIT_LLAMA3 || split == ZS_TOK_SPLIT_QWEN2; /* replaces GPT-2's */
        ZS_CHECK(add_pretok(t, (zs_tok_pretok){.kind = ZS_TOK_PT_BYTELEVEL, .use_regex = !regex_split}));
        t->byte_level = 1;
        st.s[st.n++] = (dec_step){.kind = DEC_BYTELEVEL};
    }
    ZS_CHECK(build_decode_table(t, &st));
    index_added(t);
    build_byte_ids(t);
    t->bos = s->bos;
    t->eos = s->eos;
    idvec pre = {0}, suf = {0};
    int rc = 0;
    if (s->eos >= 0) {
        t->eos_ids = malloc(sizeof *t->eos_ids);
        if (!t->eos_ids) return zs_err(ZS_ENOMEM, "tokenizer: out of memory");
        t->eos_ids[0] = s->eos;
        t->n_eos = 1;
    }
    int add_bos = s->add_bos >= 0 ? s->add_bos : spm, add_eos = s->add_eos > 0;
    if (add_bos && s->bos >= 0) rc = idvec_push(&pre, s->bos);
    if (rc == 0 && add_eos && s->eos >= 0) rc = idvec_push(&suf, s->eos);
    t->prefix = pre.v, t->n_prefix = pre.n;
    t->suffix = suf.v, t->n_suffix = suf.n;
    return rc;
}

int zs_tokenizer_from_spec(const zs_tokenizer_spec *s, zs_tokenizer **out) {
    if (!s || !out || !s->tokens || !s->token_len)
        return zs_err(ZS_EINVAL, "zs_tokenizer_from_spec: NULL argument");
    const char *o = s->origin ? s->origin : "tokenizer";
    if (s->kind != ZS_TOK_SPEC_SPM && s->kind != ZS_TOK_SPEC_BPE)
        return zs_err(ZS_EINVAL, "%s: unknown tokenizer kind %d", o, s->kind);
    if (s->n_vocab < 1 || s->n_vocab >= MAX_ID)
        return zs_err(ZS_ERANGE, "%s: vocabulary of %d tokens (must be 1 to %d)", o, (int)s->n_vocab, MAX_ID - 1);
    if (s->kind == ZS_TOK_SPEC_SPM && !s->scores)
        return zs_err(ZS_EFORMAT, "%s: a SentencePiece vocabulary needs scores", o);
    if (s->kind == ZS_TOK_SPEC_BPE && s->n_merges && (!s->merges || !s->merge_len))
        return zs_err(ZS_EINVAL, "zs_tokenizer_from_spec: NULL merges");
    const int32_t ids[3] = {s->bos, s->eos, s->unk};
    static const char *names[3] = {"bos", "eos", "unknown"};
    for (int i = 0; i < 3; i++)
        if (ids[i] < -1 || ids[i] >= s->n_vocab)
            return zs_err(ZS_ERANGE, "%s: %s token id %d is out of range [0, %d)", o, names[i], (int)ids[i],
                          (int)s->n_vocab);
    zs_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return zs_err(ZS_ENOMEM, "tokenizer: out of memory");
    t->bos = t->eos = t->unk_id = -1;
    zs_tokenizer_spec c = *s;
    c.origin = o;
    int rc = from_spec(t, &c);
    if (rc < 0) {
        zs_tokenizer_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

/* ---------------------------------------------------------------- accessors */

int zs_tokenizer_vocab_size(const zs_tokenizer *t) { return t->n_vocab; }
int zs_tokenizer_bos(const zs_tokenizer *t) { return t->bos; }
int zs_tokenizer_eos(const zs_tokenizer *t) { return t->eos; }

int zs_tokenizer_is_eos(const zs_tokenizer *t, int id) {
    for (size_t i = 0; i < t->n_eos; i++)
        if (t->eos_ids[i] == id) return 1;
    return 0;
}

int zs_tokenizer_is_special(const zs_tokenizer *t, int id) {
    if (id < 0 || id >= t->n_vocab) return 0;
    return (t->flags[id] & ZS_TOK_F_SPECIAL) || id == t->bos || zs_tokenizer_is_eos(t, id);
}

const char *zs_tokenizer_piece(const zs_tokenizer *t, int id) {
    return id < 0 || id >= t->n_vocab ? NULL : t->piece[id];
}

const char *zs_tokenizer_token_bytes(const zs_tokenizer *t, int id, size_t *len) {
    if (!t || id < 0 || id >= t->n_vocab || !t->piece[id]) {
        if (len) *len = 0;
        return NULL;
    }
    if (len) *len = t->dec_off[id + 1] - t->dec_off[id];
    return t->dec_blob + t->dec_off[id];
}

int zs_tokenizer_is_byte_fallback(const zs_tokenizer *t, int id) {
    size_t n = 0;
    const char *b = zs_tokenizer_token_bytes(t, id, &n);
    const char *p = b ? t->piece[id] : NULL;
    return p && n == 1 && byte_token(p, strlen(p)) == (unsigned char)b[0];
}

int zs_tokenizer_token_id(const zs_tokenizer *t, const char *piece) {
    return piece ? any_lookup(t, piece, strlen(piece)) : -1;
}
