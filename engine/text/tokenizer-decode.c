/* tokenizer-decode.c — ids -> text. Every id's bytes were precomputed at load (decoder steps
 * applied); here they are concatenated, the leading space(s) SentencePiece decoders strip are
 * dropped, and the bytes are turned into valid UTF-8 (U+FFFD for each maximal invalid
 * subsequence). Full decode and the streaming zs_detok share one state machine, so their
 * outputs agree byte for byte. */
#include <string.h>

#include "common.h"
#include "tokenizer-internal.h"

typedef struct {
    unsigned char pend[4]; /* bytes of an incomplete UTF-8 sequence */
    int npend, need;
    int started;    /* some byte has been produced (leading-space stripping is over) */
    int strip_left; /* leading spaces still to drop */
} utf8_state;

struct zs_detok {
    const zs_tokenizer *t;
    int skip_special;
    utf8_state st;
};

/* Output sink: a fixed caller buffer (fixed=1) or a growing heap buffer. */
typedef struct {
    char *p;
    size_t n, cap;
    int fixed, full;
} sink_t;

static void put(sink_t *s, const void *src, size_t n) {
    if (s->full) return;
    if (s->n + n + 1 > s->cap) {
        if (s->fixed) {
            s->full = 1;
            return;
        }
        size_t nc = s->cap ? s->cap : 64;
        while (nc < s->n + n + 1) nc *= 2;
        char *np = realloc(s->p, nc);
        if (!np) {
            s->full = 1;
            return;
        }
        s->p = np;
        s->cap = nc;
    }
    memcpy(s->p + s->n, src, n);
    s->n += n;
}

static void put_fffd(sink_t *s) { put(s, "\xef\xbf\xbd", 3); }

static void feed_byte(utf8_state *st, sink_t *out, unsigned char c) {
    for (;;) {
        if (st->npend == 0) {
            if (c < 0x80) put(out, &c, 1);
            else if (c >= 0xC2 && c <= 0xDF) st->need = 2;
            else if (c >= 0xE0 && c <= 0xEF) st->need = 3;
            else if (c >= 0xF0 && c <= 0xF4) st->need = 4;
            else put_fffd(out);
            if (c >= 0xC2 && c <= 0xF4) st->pend[st->npend++] = c;
            return;
        }
        unsigned lo = 0x80, hi = 0xBF;
        if (st->npend == 1) {
            unsigned lead = st->pend[0];
            if (lead == 0xE0) lo = 0xA0;
            if (lead == 0xED) hi = 0x9F;
            if (lead == 0xF0) lo = 0x90;
            if (lead == 0xF4) hi = 0x8F;
        }
        if (c >= lo && c <= hi) {
            st->pend[st->npend++] = c;
            if (st->npend == st->need) {
                put(out, st->pend, (size_t)st->npend);
                st->npend = 0;
            }
            return;
        }
        put_fffd(out); /* the pending prefix is a maximal invalid subsequence; retry c fresh */
        st->npend = 0;
    }
}

static void feed(utf8_state *st, sink_t *out, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!st->started) {
            if (c == ' ' && st->strip_left > 0) {
                st->strip_left--;
                continue;
            }
            st->started = 1;
        }
        feed_byte(st, out, c);
    }
}

static void finish(utf8_state *st, sink_t *out) {
    if (st->npend) put_fffd(out);
    st->npend = 0;
}

static int check_id(const zs_tokenizer *t, int32_t id, const char *fn) {
    if (id < 0 || id >= t->n_vocab || !t->piece[id])
        return zs_err(ZS_ERANGE, "%s: token id %d out of range (vocab size %d%s)", fn, (int)id, t->n_vocab,
                      id >= 0 && id < t->n_vocab ? ", id has no token" : "");
    return 0;
}

static void feed_id(const zs_tokenizer *t, int skip_special, utf8_state *st, sink_t *out, int32_t id) {
    if (skip_special && zs_tokenizer_is_special(t, id)) return;
    feed(st, out, t->dec_blob + t->dec_off[id], t->dec_off[id + 1] - t->dec_off[id]);
}

int zs_tokenizer_decode(const zs_tokenizer *t, const int32_t *ids, size_t n, int skip_special, char **out) {
    if (!t || (!ids && n) || !out) return zs_err(ZS_EINVAL, "zs_tokenizer_decode: NULL argument");
    for (size_t i = 0; i < n; i++) ZS_CHECK(check_id(t, ids[i], "zs_tokenizer_decode"));
    utf8_state st = {.strip_left = t->strip_leading};
    sink_t s = {0};
    put(&s, "", 0);
    for (size_t i = 0; i < n; i++) feed_id(t, skip_special, &st, &s, ids[i]);
    finish(&st, &s);
    if (s.full) {
        free(s.p);
        return zs_err(ZS_ENOMEM, "zs_tokenizer_decode: out of memory");
    }
    s.p[s.n] = 0;
    *out = s.p;
    return 0;
}

int zs_detok_new(const zs_tokenizer *t, int skip_special, zs_detok **out) {
    if (!t || !out) return zs_err(ZS_EINVAL, "zs_detok_new: NULL argument");
    zs_detok *d = calloc(1, sizeof *d);
    if (!d) return zs_err(ZS_ENOMEM, "zs_detok_new: out of memory");
    d->t = t;
    d->skip_special = skip_special;
    d->st.strip_left = t->strip_leading;
    *out = d;
    return 0;
}

/* Decodes one id (or flushes) on a copy of the state into buf; commits the state only if all fit. */
static int detok_emit(zs_detok *d, int32_t id, int flush, char *buf, size_t cap, size_t *n_out, const char *fn) {
    if (!d || !buf || !n_out) return zs_err(ZS_EINVAL, "%s: NULL argument", fn);
    if (!flush) ZS_CHECK(check_id(d->t, id, fn));
    utf8_state st = d->st;
    sink_t s = {.p = buf, .cap = cap, .fixed = 1};
    if (flush) finish(&st, &s);
    else feed_id(d->t, d->skip_special, &st, &s, id);
    if (s.full || cap == 0)
        return zs_err(ZS_ERANGE, "%s: output buffer of %zu bytes is too small", fn, cap);
    buf[s.n] = 0;
    d->st = st;
    *n_out = s.n;
    return 0;
}

int zs_detok_push(zs_detok *d, int32_t id, char *buf, size_t cap, size_t *n_out) {
    return detok_emit(d, id, 0, buf, cap, n_out, "zs_detok_push");
}

int zs_detok_flush(zs_detok *d, char *buf, size_t cap, size_t *n_out) {
    return detok_emit(d, 0, 1, buf, cap, n_out, "zs_detok_flush");
}

void zs_detok_free(zs_detok *d) { free(d); }
