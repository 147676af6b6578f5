/* tokenizer-encode.c — text -> ids: split out added tokens, normalize, pre-tokenize into words,
 * then BPE each word (merges by rank with a heap over a linked list of symbols, O(n log n) per
 * word). All scratch memory belongs to the call, so encode is safe from many threads at once. */
#include <string.h>

#include "common.h"
#include "tokenizer-internal.h"

typedef struct {
    char *p;
    size_t n, cap;
} buf_t;

typedef struct {
    size_t off, len;
    int first; /* starts at offset 0 of the original text (Metaspace prepend_scheme "first") */
} word_t;

typedef struct {
    word_t *v;
    size_t n, cap;
} words_t;

typedef struct {
    int32_t id, prev, next;
} sym_t;

typedef struct {
    int32_t rank, pos, right, lid, rid, newid;
} cand_t;

typedef struct {
    int32_t *ids;
    size_t n_ids, cap_ids;
    buf_t text[2];   /* normalized / pre-tokenized text (ping-pong) */
    words_t words[2];
    uint32_t *cp;    /* code points of the word being split */
    uint8_t *cls;
    size_t *boff;
    size_t cp_cap;
    sym_t *sym;
    size_t sym_n, sym_cap;
    cand_t *heap;
    size_t heap_n, heap_cap;
    buf_t mstr; /* byte-level mapped word */
} enc_ws;

static int oom(void) { return zs_err(ZS_ENOMEM, "zs_tokenizer_encode: out of memory"); }

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    size_t nc = *cap ? *cap : 16;
    while (nc < need) nc *= 2;
    void *np = realloc(*p, nc * elem);
    if (!np) return oom();
    *p = np;
    *cap = nc;
    return 0;
}

static int buf_add(buf_t *b, const char *s, size_t n) {
    ZS_CHECK(grow((void **)&b->p, &b->cap, b->n + n + 1, 1));
    memcpy(b->p + b->n, s, n);
    b->n += n;
    return 0;
}

static int words_add(words_t *w, size_t off, size_t len, int first) {
    ZS_CHECK(grow((void **)&w->v, &w->cap, w->n + 1, sizeof *w->v));
    w->v[w->n++] = (word_t){off, len, first};
    return 0;
}

static int push_id(enc_ws *ws, int32_t id) {
    ZS_CHECK(grow((void **)&ws->ids, &ws->cap_ids, ws->n_ids + 1, sizeof *ws->ids));
    ws->ids[ws->n_ids++] = id;
    return 0;
}

/* ---------------------------------------------------------------- BPE on one word */

static int pair_get(const zs_tokenizer *t, int32_t a, int32_t b, int32_t *rank, int32_t *newid) {
    if (!t->mrank) return 0;
    uint64_t k = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint64_t h = k;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    for (size_t s = (size_t)h & t->mmask; t->mrank[s] >= 0; s = (s + 1) & t->mmask) {
        if (t->mkey[s] == k) {
            *rank = t->mrank[s];
            *newid = t->mnew[s];
            return 1;
        }
    }
    return 0;
}

static int cand_less(const cand_t *a, const cand_t *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static int heap_push(enc_ws *ws, cand_t c) {
    ZS_CHECK(grow((void **)&ws->heap, &ws->heap_cap, ws->heap_n + 1, sizeof *ws->heap));
    size_t i = ws->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_less(&c, &ws->heap[p])) break;
        ws->heap[i] = ws->heap[p];
        i = p;
    }
    ws->heap[i] = c;
    return 0;
}

static cand_t heap_pop(enc_ws *ws) {
    cand_t top = ws->heap[0], last = ws->heap[--ws->heap_n];
    size_t i = 0, n = ws->heap_n;
    for (;;) {
        size_t l = 2 * i + 1, m = i;
        const cand_t *best = &last;
        if (l < n && cand_less(&ws->heap[l], best)) m = l, best = &ws->heap[l];
        if (l + 1 < n && cand_less(&ws->heap[l + 1], best)) m = l + 1;
        if (m == i) break;
        ws->heap[i] = ws->heap[m];
        i = m;
    }
    if (n) ws->heap[i] = last;
    return top;
}

static int try_pair(const zs_tokenizer *t, enc_ws *ws, int32_t left) {
    int32_t right = ws->sym[left].next, rank, newid;
    if (right < 0) return 0;
    int32_t a = ws->sym[left].id, b = ws->sym[right].id;
    if (!pair_get(t, a, b, &rank, &newid)) return 0;
    return heap_push(ws, (cand_t){rank, left, right, a, b, newid});
}

static int add_sym(const zs_tokenizer *t, enc_ws *ws, int32_t id) {
    if (id < 0) { /* unknown: <unk> (fused if asked), or dropped when the model has none */
        if (t->unk_id < 0) return 0;
        if (t->fuse_unk && ws->sym_n && ws->sym[ws->sym_n - 1].id == t->unk_id) return 0;
        id = t->unk_id;
    }
    ZS_CHECK(grow((void **)&ws->sym, &ws->sym_cap, ws->sym_n + 1, sizeof *ws->sym));
    ws->sym[ws->sym_n++] = (sym_t){id, -1, -1};
    return 0;
}

static int bpe_word(const zs_tokenizer *t, enc_ws *ws, const char *s, size_t n) {
    if (n == 0) return 0;
    ws->sym_n = 0;
    if (t->byte_level) {
        if (t->ignore_merges) {
            ws->mstr.n = 0;
            for (size_t i = 0; i < n; i++) {
                char u[4];
                int l = zs_tokenizer_utf8_encode(zs_tokenizer_byte_to_cp((unsigned char)s[i]), u);
                ZS_CHECK(buf_add(&ws->mstr, u, (size_t)l));
            }
            int32_t id = zs_tokenizer_model_lookup(t, ws->mstr.p, ws->mstr.n);
            if (id >= 0) return push_id(ws, id);
        }
        for (size_t i = 0; i < n; i++) ZS_CHECK(add_sym(t, ws, t->byte_id[(unsigned char)s[i]]));
    } else {
        if (t->ignore_merges) {
            int32_t id = zs_tokenizer_model_lookup(t, s, n);
            if (id >= 0) return push_id(ws, id);
        }
        for (size_t i = 0; i < n;) {
            uint32_t cp;
            int l = zs_tokenizer_utf8_decode((const unsigned char *)s + i, n - i, &cp);
            if (l <= 0) l = 1; /* cannot happen: text was validated and steps keep it valid */
            int32_t id = zs_tokenizer_model_lookup(t, s + i, (size_t)l);
            if (id < 0 && t->byte_fallback) {
                int all = 1;
                for (int k = 0; k < l; k++) all &= t->byte_id[(unsigned char)s[i + k]] >= 0;
                if (all) {
                    for (int k = 0; k < l; k++) ZS_CHECK(add_sym(t, ws, t->byte_id[(unsigned char)s[i + k]]));
                    i += (size_t)l;
                    continue;
                }
            }
            ZS_CHECK(add_sym(t, ws, id));
            i += (size_t)l;
        }
    }
    size_t ns = ws->sym_n;
    if (ns == 0) return 0;
    for (size_t i = 0; i < ns; i++) {
        ws->sym[i].prev = (int32_t)i - 1;
        ws->sym[i].next = i + 1 < ns ? (int32_t)i + 1 : -1;
    }
    ws->heap_n = 0;
    for (size_t i = 0; i + 1 < ns; i++) ZS_CHECK(try_pair(t, ws, (int32_t)i));
    while (ws->heap_n) {
        cand_t c = heap_pop(ws);
        sym_t *l = &ws->sym[c.pos];
        if (l->id != c.lid || l->next != c.right || ws->sym[c.right].id != c.rid) continue; /* stale */
        sym_t *r = &ws->sym[c.right];
        l->id = c.newid;
        l->next = r->next;
        if (r->next >= 0) ws->sym[r->next].prev = c.pos;
        r->id = -1;
        r->next = r->prev = -1;
        if (l->prev >= 0) ZS_CHECK(try_pair(t, ws, l->prev));
        ZS_CHECK(try_pair(t, ws, c.pos));
    }
    for (int32_t i = 0; i >= 0; i = ws->sym[i].next) ZS_CHECK(push_id(ws, ws->sym[i].id));
    return 0;
}

/* ---------------------------------------------------------------- pre-tokenizer steps */

/* Splits word w of text src with a regex splitter; appends the pieces to dst. */
static int split_word(enc_ws *ws, int kind, const char *src, word_t w, words_t *dst) {
    if (w.len == 0) return 0;
    if (w.len + 1 > ws->cp_cap) {
        size_t nc = ZS_MAX(w.len + 1, 2 * ws->cp_cap);
        uint32_t *ncp = realloc(ws->cp, nc * sizeof *ncp);
        if (ncp) ws->cp = ncp;
        uint8_t *ncls = realloc(ws->cls, nc);
        if (ncls) ws->cls = ncls;
        size_t *nb = realloc(ws->boff, nc * sizeof *nb);
        if (nb) ws->boff = nb;
        if (!ncp || !ncls || !nb) return oom();
        ws->cp_cap = nc;
    }
    size_t m = 0;
    for (size_t p = 0; p < w.len;) {
        int l = zs_tokenizer_utf8_decode((const unsigned char *)src + w.off + p, w.len - p, &ws->cp[m]);
        if (l <= 0) l = 1, ws->cp[m] = 0xFFFD;
        ws->cls[m] = (uint8_t)zs_tokenizer_cp_class(ws->cp[m]);
        ws->boff[m++] = p;
        p += (size_t)l;
    }
    ws->boff[m] = w.len;
    for (size_t i = 0; i < m;) {
        size_t j = zs_tokenizer_split_next(kind, ws->cp, ws->cls, m, i);
        ZS_CHECK(words_add(dst, w.off + ws->boff[i], ws->boff[j] - ws->boff[i], w.first && i == 0));
        i = j;
    }
    return 0;
}

/* Appends s[0..n) to b with every occurrence of from replaced by to. */
static int add_replaced(buf_t *b, const char *s, size_t n, const char *from, const char *to) {
    size_t lf = strlen(from), lt = strlen(to);
    for (size_t i = 0; i < n;) {
        if (lf && i + lf <= n && !memcmp(s + i, from, lf)) {
            ZS_CHECK(buf_add(b, to, lt));
            i += lf;
        } else {
            size_t j = i + 1;
            while (j < n && (!lf || s[j] != from[0])) j++;
            ZS_CHECK(buf_add(b, s + i, j - i));
            i = j;
        }
    }
    return 0;
}

/* Runs pre-tokenizer step p on (text[cur], words[cur]); the result lands in index *cur. */
static int pretok_step(enc_ws *ws, const zs_tok_pretok *p, int *cur) {
    int a = *cur, b = !a;
    buf_t *src = &ws->text[a], *dst = &ws->text[b];
    words_t *win = &ws->words[a], *wout = &ws->words[b];
    wout->n = 0;
    if (p->kind == ZS_TOK_PT_SPLIT) { /* same text, finer words */
        for (size_t i = 0; i < win->n; i++) ZS_CHECK(split_word(ws, p->split_kind, src->p, win->v[i], wout));
        words_t tmp = *win;
        *win = *wout;
        *wout = tmp;
        return 0;
    }
    dst->n = 0;
    int rc = 0;
    size_t lr = p->kind == ZS_TOK_PT_METASPACE ? strlen(p->repl) : 0;
    for (size_t i = 0; i < win->n && rc == 0; i++) {
        word_t w = win->v[i];
        const char *s = src->p + w.off;
        size_t start = dst->n;
        if (p->kind == ZS_TOK_PT_BYTELEVEL) {
            if (p->add_prefix_space && (w.len == 0 || s[0] != ' ')) rc = buf_add(dst, " ", 1);
            if (rc == 0) rc = buf_add(dst, s, w.len);
        } else { /* METASPACE */
            rc = add_replaced(dst, s, w.len, " ", p->repl);
            int want = p->prepend == ZS_TOK_PREPEND_ALWAYS || (p->prepend == ZS_TOK_PREPEND_FIRST && w.first);
            size_t len = dst->n - start;
            if (rc == 0 && want && !(len >= lr && !memcmp(dst->p + start, p->repl, lr))) {
                rc = buf_add(dst, p->repl, lr); /* make room, then shift right */
                if (rc == 0) {
                    memmove(dst->p + start + lr, dst->p + start, len);
                    memcpy(dst->p + start, p->repl, lr);
                }
            }
        }
        if (rc) break;
        word_t nw = {start, dst->n - start, w.first};
        if (p->kind == ZS_TOK_PT_BYTELEVEL) {
            rc = p->use_regex ? split_word(ws, ZS_TOK_SPLIT_GPT2, dst->p, nw, wout)
                              : words_add(wout, nw.off, nw.len, nw.first);
        } else if (p->split) { /* cut before each replacement char (merged with the next piece) */
            size_t s0 = nw.off, end = nw.off + nw.len;
            for (size_t k = nw.off + 1; k + lr <= end && rc == 0; k++) {
                if (!memcmp(dst->p + k, p->repl, lr)) {
                    rc = words_add(wout, s0, k - s0, nw.first && s0 == nw.off);
                    s0 = k;
                }
            }
            if (rc == 0 && end > s0) rc = words_add(wout, s0, end - s0, nw.first && s0 == nw.off);
        } else {
            rc = words_add(wout, nw.off, nw.len, nw.first);
        }
    }
    *cur = b;
    return rc;
}

/* ---------------------------------------------------------------- segments */

/* Encodes one stretch of text between added tokens; first: it starts at offset 0. */
static int encode_segment(const zs_tokenizer *t, enc_ws *ws, const char *s, size_t n, int first) {
    if (n == 0) return 0;
    int cur = 0;
    buf_t *b = &ws->text[0];
    b->n = 0;
    ZS_CHECK(buf_add(b, s, n));
    for (size_t k = 0; k < t->n_norm; k++) {
        const zs_tok_norm *nm = &t->norm[k];
        buf_t *o = &ws->text[!cur];
        o->n = 0;
        if (nm->kind == ZS_TOK_NORM_PREPEND) {
            if (ws->text[cur].n) ZS_CHECK(buf_add(o, nm->a, strlen(nm->a)));
            ZS_CHECK(buf_add(o, ws->text[cur].p, ws->text[cur].n));
        } else {
            ZS_CHECK(add_replaced(o, ws->text[cur].p, ws->text[cur].n, nm->a, nm->b));
        }
        cur = !cur;
    }
    ws->words[cur].n = 0;
    ZS_CHECK(words_add(&ws->words[cur], 0, ws->text[cur].n, first));
    for (size_t k = 0; k < t->n_pretok; k++) ZS_CHECK(pretok_step(ws, &t->pretok[k], &cur));
    const words_t *w = &ws->words[cur];
    for (size_t i = 0; i < w->n; i++) ZS_CHECK(bpe_word(t, ws, ws->text[cur].p + w->v[i].off, w->v[i].len));
    return 0;
}

static int is_ascii_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

/* The added token matching at text[pos..len), or NULL. Longest first. */
static const zs_tok_added *match_added(const zs_tokenizer *t, const char *text, size_t pos, size_t len) {
    unsigned char c = (unsigned char)text[pos];
    for (uint32_t k = t->added_start[c]; k < t->added_start[c + 1]; k++) {
        const zs_tok_added *a = &t->added[k];
        if (a->len <= len - pos && !memcmp(text + pos, a->content, a->len)) return a;
    }
    return NULL;
}

static int encode_all(const zs_tokenizer *t, enc_ws *ws, const char *text, size_t len, int add_special) {
    if (add_special)
        for (size_t i = 0; i < t->n_prefix; i++) ZS_CHECK(push_id(ws, t->prefix[i]));
    size_t seg = 0, pos = 0;
    while (pos < len) {
        const zs_tok_added *a = t->n_added ? match_added(t, text, pos, len) : NULL;
        if (!a) {
            pos++;
            continue;
        }
        size_t end = pos;
        if (a->lstrip)
            while (end > seg && is_ascii_space(text[end - 1])) end--;
        ZS_CHECK(encode_segment(t, ws, text + seg, end - seg, seg == 0));
        ZS_CHECK(push_id(ws, a->id));
        pos += a->len;
        if (a->rstrip)
            while (pos < len && is_ascii_space(text[pos])) pos++;
        seg = pos;
    }
    ZS_CHECK(encode_segment(t, ws, text + seg, len - seg, seg == 0));
    if (add_special)
        for (size_t i = 0; i < t->n_suffix; i++) ZS_CHECK(push_id(ws, t->suffix[i]));
    return 0;
}

int zs_tokenizer_encode(const zs_tokenizer *t, const char *text, size_t len, int add_special,
                        int32_t **ids, size_t *n_ids) {
    if (!t || (!text && len) || !ids || !n_ids) return zs_err(ZS_EINVAL, "zs_tokenizer_encode: NULL argument");
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        int l = zs_tokenizer_utf8_decode((const unsigned char *)text + i, len - i, &cp);
        if (l <= 0) return zs_err(ZS_EINVAL, "zs_tokenizer_encode: invalid UTF-8 at byte %zu of %zu", i, len);
        i += (size_t)l;
    }
    enc_ws ws;
    memset(&ws, 0, sizeof ws);
    int rc = encode_all(t, &ws, text ? text : "", len, add_special);
    for (int i = 0; i < 2; i++) {
        free(ws.text[i].p);
        free(ws.words[i].v);
    }
    free(ws.cp);
    free(ws.cls);
    free(ws.boff);
    free(ws.sym);
    free(ws.heap);
    free(ws.mstr.p);
    if (rc < 0) {
        free(ws.ids);
        return rc;
    }
    *ids = ws.ids;
    *n_ids = ws.n_ids;
    return 0;
}
