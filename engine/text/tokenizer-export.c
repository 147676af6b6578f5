/* tokenizer-export.c — a loaded tokenizer.json as llama.cpp's GGUF vocabulary arrays (tokens,
 * types, scores or merges, special ids), checked by building a tokenizer back from them. See
 * tokenizer-export.h. */
#include "tokenizer-export.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "tokenizer-internal.h"

typedef struct {
    int32_t rank, left, right, res;
} ex_merge;

static int cmp_rank(const void *a, const void *b) {
    const ex_merge *x = a, *y = b;
    return x->rank < y->rank ? -1 : x->rank > y->rank;
}

/* The merge table in rank order (*out malloc'd, NULL when there are none). */
static int merges_sorted(const zs_tokenizer *t, ex_merge **out, size_t *n) {
    *out = NULL;
    *n = 0;
    if (!t->mrank) return 0;
    size_t cnt = 0;
    for (size_t i = 0; i <= t->mmask; i++) cnt += t->mrank[i] >= 0;
    if (!cnt) return 0;
    ex_merge *v = malloc(cnt * sizeof *v);
    if (!v) return zs_err(ZS_ENOMEM, "tokenizer: out of memory");
    size_t k = 0;
    for (size_t i = 0; i <= t->mmask; i++)
        if (t->mrank[i] >= 0)
            v[k++] = (ex_merge){t->mrank[i], (int32_t)(t->mkey[i] >> 32), (int32_t)(uint32_t)t->mkey[i], t->mnew[i]};
    qsort(v, cnt, sizeof *v, cmp_rank);
    *out = v;
    *n = cnt;
    return 0;
}

static int is_byte_piece(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return 0;
    for (int i = 3; i < 5; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'A' && s[i] <= 'F') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
    return 1;
}

/* ---------------------------------------------------------------- which llama.cpp vocabulary */

/* SentencePiece style: byte fallback, spaces as U+2581 (normalizer or Metaspace), nothing else. */
static int spm_shape(const zs_tokenizer *t, const char *path, int *space_prefix) {
    static const char *const lb = "\xe2\x96\x81";
    int prepend = 0, replace = 0;
    for (size_t i = 0; i < t->n_norm; i++) {
        const zs_tok_norm *n = &t->norm[i];
        if (n->kind == ZS_TOK_NORM_PREPEND && !strcmp(n->a, lb) && !prepend && !replace) prepend = 1;
        else if (n->kind == ZS_TOK_NORM_REPLACE && !strcmp(n->a, " ") && n->b && !strcmp(n->b, lb) && !replace) replace = 1;
        else
            return zs_err(ZS_EUNSUPPORTED, "%s: normalizer step %zu cannot be written as a llama.cpp SentencePiece "
                          "vocabulary (only Prepend(\"\xe2\x96\x81\") and Replace(\" \", \"\xe2\x96\x81\"))", path, i);
    }
    for (size_t i = 0; i < t->n_pretok; i++) {
        const zs_tok_pretok *p = &t->pretok[i];
        if (p->kind != ZS_TOK_PT_METASPACE || strcmp(p->repl, lb) || replace || t->n_pretok > 1)
            return zs_err(ZS_EUNSUPPORTED, "%s: pre-tokenizer step %zu cannot be written as a llama.cpp SentencePiece "
                          "vocabulary (only one Metaspace with \"\xe2\x96\x81\", or none)", path, i);
        replace = 1;
        prepend = p->prepend != ZS_TOK_PREPEND_NEVER;
    }
    if (!replace)
        return zs_err(ZS_EUNSUPPORTED, "%s: a byte-fallback BPE that does not turn spaces into \"\xe2\x96\x81\" cannot be "
                      "written as a llama.cpp SentencePiece vocabulary", path);
    *space_prefix = prepend;
    return 0;
}

/* Byte-level BPE: llama.cpp's pre-tokenizer name for the pre-tokenizer sequence. */
static int bpe_pre(const zs_tokenizer *t, const char *path, const char **pre) {
    if (t->n_norm)
        return zs_err(ZS_EUNSUPPORTED, "%s: a byte-level BPE with a normalizer cannot be written as a llama.cpp "
                      "vocabulary", path);
    const zs_tok_pretok *p = t->pretok;
    size_t n = t->n_pretok;
    *pre = NULL;
    if (n == 1 && p[0].kind == ZS_TOK_PT_BYTELEVEL && p[0].use_regex) *pre = "gpt-2";
    else if (n == 2 && p[0].kind == ZS_TOK_PT_SPLIT && p[1].kind == ZS_TOK_PT_BYTELEVEL && !p[1].use_regex) {
        if (p[0].split_kind == ZS_TOK_SPLIT_LLAMA3) *pre = "llama-bpe";
        else if (p[0].split_kind == ZS_TOK_SPLIT_QWEN2) *pre = "qwen2";
    } else if (n == 2 && p[0].kind == ZS_TOK_PT_SPLIT && p[0].split_kind == ZS_TOK_SPLIT_DIGITS &&
               p[1].kind == ZS_TOK_PT_BYTELEVEL && p[1].use_regex) {
        *pre = "smollm";
    }
    if (!*pre || p[n - 1].add_prefix_space)
        return zs_err(ZS_EUNSUPPORTED, "%s: this byte-level pre-tokenizer sequence has no llama.cpp equivalent (known: "
                      "GPT-2's ByteLevel, Llama 3's and Qwen2's Split + ByteLevel, Digits + ByteLevel; no "
                      "add_prefix_space)", path);
    return 0;
}

/* ---------------------------------------------------------------- tokenizer_config.json extras */

static int read_text_file(const char *path, char **out) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (len + 1 >= cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) break;
            buf = nb;
            cap *= 2;
        }
        size_t r = fread(buf + len, 1, cap - 1 - len, f);
        len += r;
        if (r == 0) break;
    }
    fclose(f);
    if (!buf) return zs_err(ZS_ENOMEM, "tokenizer: out of memory");
    buf[len] = 0;
    *out = buf;
    return 0;
}

static int config_extras(const zs_tokenizer *t, const char *dir, zs_tok_export *e) {
    char path[4200];
    snprintf(path, sizeof path, "%.4000s/tokenizer_config.json", dir);
    e->pad = -1;
    json_t *j = NULL;
    FILE *f = fopen(path, "rb");
    if (f) {
        json_error_t je;
        j = json_loadf(f, 0, &je);
        fclose(f);
        if (!j || !json_is_object(j)) {
            json_decref(j);
            return zs_err(ZS_EFORMAT, "%s: not a JSON object", path);
        }
    }
    int rc = 0;
    json_t *pv = j ? json_object_get(j, "pad_token") : NULL;
    if (json_is_object(pv)) pv = json_object_get(pv, "content");
    if (json_is_string(pv)) {
        e->pad = zs_tokenizer_token_id(t, json_string_value(pv));
        if (e->pad < 0) rc = zs_err(ZS_EFORMAT, "%s: pad_token \"%.80s\" is not in the vocab", path, json_string_value(pv));
    }
    const char *tpl = NULL;
    json_t *ct = j ? json_object_get(j, "chat_template") : NULL;
    if (json_is_string(ct)) tpl = json_string_value(ct);
    else if (json_is_array(ct)) { /* [{name, template}]: "default", else the first */
        size_t i;
        json_t *it;
        json_array_foreach(ct, i, it) {
            const char *nm = json_string_value(json_object_get(it, "name"));
            const char *tx = json_string_value(json_object_get(it, "template"));
            if (tx && (!tpl || (nm && !strcmp(nm, "default")))) tpl = tx;
            if (tx && nm && !strcmp(nm, "default")) break;
        }
    }
    if (rc == 0 && tpl && !(e->chat_template = strdup(tpl))) rc = zs_err(ZS_ENOMEM, "tokenizer: out of memory");
    json_decref(j);
    if (rc == 0 && !e->chat_template) {
        snprintf(path, sizeof path, "%.4000s/chat_template.jinja", dir);
        rc = read_text_file(path, &e->chat_template);
    }
    return rc;
}

/* ---------------------------------------------------------------- the check */

static const char *const probes[] = {
    "Once upon a time, there was a little girl named Lily. She liked to play outside.",
    "Hello world! How are you today?",
    "  two leading spaces, and a trailing one ",
    "tabs\tand\nnewlines\n\n  mixed \r\n lines\n",
    "numbers: 0 7 42 123 4567 89012 3.14159 1,000,000 2024-01-31",
    "it's they're we've I'm you'll he'd IT'S",
    "caf\xc3\xa9 na\xc3\xafve r\xc3\xa9sum\xc3\xa9 \xc3\xbc" "ber Stra\xc3\x9f" "e \xc3\x85ngstr\xc3\xb6m",
    "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xae\xe3\x83\x86\xe3\x82\xad\xe3\x82\xb9\xe3\x83\x88 \xe4\xb8\xad\xe6\x96\x87",
    "emoji \xf0\x9f\x98\x80 \xf0\x9f\x9a\x80!! \xe2\x9c\x85",
    "CamelCaseWords snake_case_words kebab-case-words ALLCAPS",
    "$x = (a + b) * c; // done?! <tag attr=\"v\">&amp;</tag> {\"k\": [1, 2]}",
    "   ",
    "\n",
    "a",
};

static int same_ids(const zs_tokenizer *a, const zs_tokenizer *b, const char *text, const char *path) {
    int32_t *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    int rc = zs_tokenizer_encode(a, text, strlen(text), 1, &x, &nx);
    if (rc == 0) rc = zs_tokenizer_encode(b, text, strlen(text), 1, &y, &ny);
    if (rc == 0 && (nx != ny || (nx && memcmp(x, y, nx * sizeof *x)))) {
        size_t i = 0;
        while (i < nx && i < ny && x[i] == y[i]) i++;
        rc = zs_err(ZS_EUNSUPPORTED, "%s: the tokenizer cannot be written as a llama.cpp vocabulary: \"%.60s\" encodes to "
                    "%zu ids, from the exported arrays to %zu (first difference at token %zu: %d vs %d)", path, text, nx, ny,
                    i, i < nx ? x[i] : -1, i < ny ? y[i] : -1);
    }
    free(x);
    free(y);
    return rc;
}

static int check_export(const zs_tokenizer *t, const zs_tok_export *e, const char *path) {
    zs_tokenizer *b = NULL;
    int rc = zs_tokenizer_from_spec(&e->spec, &b);
    if (rc < 0) return zs_err_prefix(rc, "the exported vocabulary does not load");
    for (int32_t id = 0; rc == 0 && id < t->n_vocab; id++) {
        if (!t->piece[id]) continue;
        size_t la = t->dec_off[id + 1] - t->dec_off[id], lb = b->dec_off[id + 1] - b->dec_off[id];
        if (zs_tokenizer_is_special(t, id) != zs_tokenizer_is_special(b, id) || la != lb ||
            memcmp(t->dec_blob + t->dec_off[id], b->dec_blob + b->dec_off[id], la))
            rc = zs_err(ZS_EUNSUPPORTED, "%s: the tokenizer cannot be written as a llama.cpp vocabulary: token %d "
                        "(\"%.40s\") %s differently from the exported arrays", path, id, t->piece[id],
                        la != lb || memcmp(t->dec_blob + t->dec_off[id], b->dec_blob + b->dec_off[id], la) ? "decodes"
                                                                                                            : "is flagged");
    }
    if (rc == 0 && t->strip_leading != b->strip_leading)
        rc = zs_err(ZS_EUNSUPPORTED, "%s: the tokenizer cannot be written as a llama.cpp vocabulary: its decoder strips "
                    "%d leading space(s), the exported one %d", path, t->strip_leading, b->strip_leading);
    for (size_t i = 0; rc == 0 && i < sizeof probes / sizeof probes[0]; i++) rc = same_ids(t, b, probes[i], path);
    zs_tokenizer_free(b);
    return rc;
}

/* ---------------------------------------------------------------- export */

static int fill(const zs_tokenizer *t, const char *path, int32_t n, zs_tok_export *e) {
    zs_tokenizer_spec *s = &e->spec;
    int spm = 0, space_prefix = 1;
    const char *pre = NULL;
    if (t->byte_level && !t->byte_fallback) ZS_CHECK(bpe_pre(t, path, &pre));
    else if (t->byte_fallback && !t->byte_level) {
        ZS_CHECK(spm_shape(t, path, &space_prefix));
        spm = 1;
    } else
        return zs_err(ZS_EUNSUPPORTED, "%s: only byte-level BPE (llama.cpp's gpt2) and SentencePiece-style BPE with "
                      "byte_fallback (llama.cpp's llama) can be written as a llama.cpp vocabulary", path);
    e->model = spm ? "llama" : "gpt2";
    s->kind = spm ? ZS_TOK_SPEC_SPM : ZS_TOK_SPEC_BPE;
    s->origin = path;
    s->n_vocab = n;
    s->pre = pre;
    s->bos = t->bos;
    s->eos = t->eos;
    s->unk = t->unk_id;
    s->add_space_prefix = space_prefix;
    /* a template that adds one token names the bos (eos) when no config does */
    if (t->n_prefix == 1 && s->bos < 0) s->bos = t->prefix[0];
    if (t->n_suffix == 1 && s->eos < 0) s->eos = t->suffix[0];
    if (t->n_prefix > 1 || (t->n_prefix == 1 && t->prefix[0] != s->bos) || t->n_suffix > 1 ||
        (t->n_suffix == 1 && t->suffix[0] != s->eos))
        return zs_err(ZS_EUNSUPPORTED, "%s: the post-processor adds ids other than bos before and eos after the text; "
                      "a llama.cpp vocabulary cannot say so", path);
    s->add_bos = t->n_prefix == 1;
    s->add_eos = t->n_suffix == 1;

    char **tok = calloc((size_t)n, sizeof *tok);
    size_t *tlen = calloc((size_t)n, sizeof *tlen);
    int32_t *types = calloc((size_t)n, sizeof *types);
    float *scores = spm ? calloc((size_t)n, sizeof *scores) : NULL;
    s->tokens = (const char *const *)tok, s->token_len = tlen, s->types = types, s->scores = scores;
    if (!tok || !tlen || !types || (spm && !scores)) return zs_err(ZS_ENOMEM, "tokenizer: out of memory");
    for (int32_t id = 0; id < n; id++) {
        int have = id < t->n_vocab && t->piece[id];
        uint8_t fl = have ? t->flags[id] : 0;
        const char *p = !have ? NULL : (fl & ZS_TOK_F_ADDED) ? t->piece[id] : t->mpiece[id];
        size_t pl = !have ? 0 : (fl & ZS_TOK_F_ADDED) ? t->piece_len[id] : t->mpiece_len[id];
        char hole[32];
        if (!have) {
            pl = (size_t)snprintf(hole, sizeof hole, "[PAD%d]", (int)id);
            p = hole;
            e->n_unused++;
        }
        if (!(tok[id] = malloc(pl + 1))) return zs_err(ZS_ENOMEM, "tokenizer: out of memory");
        memcpy(tok[id], p, pl);
        tok[id][pl] = 0;
        tlen[id] = pl;
        int special = have && (fl & ZS_TOK_F_SPECIAL);
        types[id] = !have ? ZS_TOKTYPE_UNUSED
                  : id == t->unk_id && special ? ZS_TOKTYPE_UNKNOWN
                  : special ? ZS_TOKTYPE_CONTROL
                  : (fl & ZS_TOK_F_ADDED) ? ZS_TOKTYPE_USER_DEFINED
                  : spm && is_byte_piece(p, pl) ? ZS_TOKTYPE_BYTE : ZS_TOKTYPE_NORMAL;
    }

    ex_merge *m = NULL;
    size_t nm = 0;
    ZS_CHECK(merges_sorted(t, &m, &nm));
    int rc = 0;
    if (spm) { /* the k-th distinct merge result (from 0) scores -k; every other piece below them all */
        int32_t k = 0;
        float *sc = scores;
        for (int32_t id = 0; id < n; id++) sc[id] = 1.0f; /* marks "not yet scored" */
        for (size_t i = 0; i < nm; i++)
            if (sc[m[i].res] > 0) sc[m[i].res] = -(float)k++;
        for (int32_t id = 0; id < n; id++)
            if (sc[id] > 0) sc[id] = -(float)k;
    } else if (nm) {
        char **mer = calloc(nm, sizeof *mer);
        size_t *mlen = calloc(nm, sizeof *mlen);
        s->merges = (const char *const *)mer, s->merge_len = mlen, s->n_merges = nm;
        if (!mer || !mlen) rc = zs_err(ZS_ENOMEM, "tokenizer: out of memory");
        for (size_t i = 0; rc == 0 && i < nm; i++) {
            const char *a = t->mpiece[m[i].left], *b = t->mpiece[m[i].right];
            size_t la = t->mpiece_len[m[i].left], lb = t->mpiece_len[m[i].right];
            if (memchr(a, ' ', la) || memchr(b, ' ', lb)) {
                rc = zs_err(ZS_EUNSUPPORTED, "%s: merge %zu (\"%.40s\" \"%.40s\") has a token with a space, which a "
                            "llama.cpp merge list cannot hold", path, i, a, b);
                break;
            }
            if (!(mer[i] = malloc(la + lb + 2))) {
                rc = zs_err(ZS_ENOMEM, "tokenizer: out of memory");
                break;
            }
            memcpy(mer[i], a, la);
            mer[i][la] = ' ';
            memcpy(mer[i] + la + 1, b, lb);
            mer[i][la + lb + 1] = 0;
            mlen[i] = la + lb + 1;
        }
    }
    free(m);
    return rc;
}

void zs_tok_export_free(zs_tok_export *e) {
    if (!e) return;
    zs_tokenizer_spec *s = &e->spec;
    for (int32_t i = 0; s->tokens && i < s->n_vocab; i++) free((char *)s->tokens[i]);
    for (size_t i = 0; s->merges && i < s->n_merges; i++) free((char *)s->merges[i]);
    free((void *)s->tokens);
    free((void *)s->token_len);
    free((void *)s->types);
    free((void *)s->scores);
    free((void *)s->merges);
    free((void *)s->merge_len);
    free(e->chat_template);
    free(e);
}

int zs_tokenizer_export(const char *dir, int32_t n_vocab, zs_tok_export **out) {
    if (!dir || !out) return zs_err(ZS_EINVAL, "zs_tokenizer_export: NULL argument");
    zs_tokenizer *t = NULL;
    ZS_CHECK(zs_tokenizer_load(dir, &t));
    char path[4200];
    snprintf(path, sizeof path, "%.4000s/tokenizer.json", dir);
    int rc = 0;
    zs_tok_export *e = calloc(1, sizeof *e);
    if (!e) rc = zs_err(ZS_ENOMEM, "tokenizer: out of memory");
    if (rc == 0 && n_vocab > 0 && n_vocab < t->n_vocab)
        rc = zs_err(ZS_EINVAL, "%s: the tokenizer has %d ids, more than the model's vocab_size %d", path,
                    (int)t->n_vocab, (int)n_vocab);
    if (rc == 0) rc = fill(t, path, n_vocab > 0 ? n_vocab : t->n_vocab, e);
    if (rc == 0) rc = config_extras(t, dir, e);
    if (rc == 0) rc = check_export(t, e, path);
    zs_tokenizer_free(t);
    if (rc < 0) {
        zs_tok_export_free(e);
        return rc;
    }
    e->spec.origin = NULL; /* pointed at this function's buffer */
    *out = e;
    return 0;
}
