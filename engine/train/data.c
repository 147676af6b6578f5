/* data.c — training data (data.h): JSONL validation with line-numbered errors, tokenization of
 * the three example shapes with loss masks (text, prompt/completion, chat messages through the
 * chat templates), and seeded, resumable [B, T] batching with one example per row. */
#include "data.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "chat.h"
#include "common.h"

struct zs_dataset {
    int n;            /* examples */
    size_t *off;      /* [n + 1] token offsets of each example */
    int32_t *tok;     /* [ntok] */
    uint8_t *loss;    /* [ntok] 1 = predicting this token counts */
    size_t ntok, cap; /* tokens used / allocated */
    size_t offcap;    /* allocated entries of off */
    size_t max_len;
    /* zs_data_next_batch's cached order */
    int *perm;
    int perm_valid, perm_epoch;
    uint64_t perm_seed;
};

/* ---------------------------------------------------------------- reading the file */

static int read_limited(const char *path, size_t max_bytes, char **out, size_t *out_len) {
    if (!path) return zs_err(ZS_EINVAL, "data: no file given");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return zs_err(e == ENOENT ? ZS_ENOTFOUND : ZS_EIO, "cannot open %s: %s", path, strerror(e));
    }
    struct stat st;
    if (fstat(fd, &st) == 0) {
        if (S_ISDIR(st.st_mode)) {
            close(fd);
            return zs_err(ZS_EINVAL, "%s is a directory", path);
        }
        if (S_ISREG(st.st_mode) && (uint64_t)st.st_size > (uint64_t)max_bytes) {
            close(fd);
            return zs_err(ZS_ERANGE, "file is %lld bytes, over the size limit of %zu bytes",
                          (long long)st.st_size, max_bytes);
        }
    }
    /* read up to max_bytes + 1 (to notice files that grow or are not regular) */
    size_t cap = 65536, len = 0;
    char *buf = malloc(cap + 1);
    if (!buf) {
        close(fd);
        return zs_err(ZS_ENOMEM, "data: out of memory");
    }
    for (;;) {
        if (len == cap) {
            if (len > max_bytes) break;
            size_t ncap = cap * 2;
            if (ncap > max_bytes + 1 && max_bytes + 1 > cap) ncap = max_bytes + 1;
            char *nb = realloc(buf, ncap + 1);
            if (!nb) {
                free(buf);
                close(fd);
                return zs_err(ZS_ENOMEM, "data: out of memory reading %s", path);
            }
            buf = nb;
            cap = ncap;
        }
        ssize_t r = read(fd, buf + len, cap - len);
        if (r < 0) {
            if (errno == EINTR) continue;
            int e = errno;
            free(buf);
            close(fd);
            return zs_err(ZS_EIO, "cannot read %s: %s", path, strerror(e));
        }
        if (r == 0) break;
        len += (size_t)r;
    }
    close(fd);
    if (len > max_bytes) {
        free(buf);
        return zs_err(ZS_ERANGE, "file is over the size limit of %zu bytes", max_bytes);
    }
    buf[len] = 0;
    *out = buf;
    *out_len = len;
    return 0;
}

/* ---------------------------------------------------------------- validation */

enum { SHAPE_TEXT = 1, SHAPE_PC = 2, SHAPE_CHAT = 3 };

/* Offset of the first invalid UTF-8 byte, or len when all valid. */
static size_t utf8_bad(const unsigned char *s, size_t len) {
    size_t i = 0;
    while (i < len) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t n;
        unsigned min;
        uint32_t cp;
        if (c >= 0xC2 && c <= 0xDF) n = 1, min = 0x80, cp = c & 0x1F;
        else if (c >= 0xE0 && c <= 0xEF) n = 2, min = 0x800, cp = c & 0x0F;
        else if (c >= 0xF0 && c <= 0xF4) n = 3, min = 0x10000, cp = c & 0x07;
        else return i;
        if (len - i <= n) return i;
        for (size_t k = 1; k <= n; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return i;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
        i += n + 1;
    }
    return len;
}

static const char *json_kind(const json_t *j) {
    switch (json_typeof(j)) {
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER:
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    default: return "an object";
    }
}

static int role_ok(const char *r) {
    return !strcmp(r, "system") || !strcmp(r, "user") || !strcmp(r, "assistant") || !strcmp(r, "developer");
}

/* Checks one parsed line; *shape on success. */
static int check_shape(const json_t *o, long line, int *shape) {
    json_t *text = json_object_get(o, "text"), *p = json_object_get(o, "prompt"),
           *c = json_object_get(o, "completion"), *m = json_object_get(o, "messages");
    int kinds = (text != NULL) + (p || c) + (m != NULL);
    if (kinds == 0)
        return zs_err(ZS_EFORMAT, "line %ld: expected one of {text}, {prompt, completion} or {messages}", line);
    if (kinds > 1)
        return zs_err(ZS_EFORMAT, "line %ld: more than one of {text}, {prompt, completion} or {messages}", line);
    if (text) {
        if (!json_is_string(text)) return zs_err(ZS_EFORMAT, "line %ld: \"text\" must be a string", line);
        *shape = SHAPE_TEXT;
        return 0;
    }
    if (p || c) {
        if (!p) return zs_err(ZS_EFORMAT, "line %ld: \"prompt\" is missing (it goes with \"completion\")", line);
        if (!c) return zs_err(ZS_EFORMAT, "line %ld: \"completion\" is missing (it goes with \"prompt\")", line);
        if (!json_is_string(p)) return zs_err(ZS_EFORMAT, "line %ld: \"prompt\" must be a string", line);
        if (!json_is_string(c)) return zs_err(ZS_EFORMAT, "line %ld: \"completion\" must be a string", line);
        *shape = SHAPE_PC;
        return 0;
    }
    if (!json_is_array(m)) return zs_err(ZS_EFORMAT, "line %ld: \"messages\" must be an array", line);
    size_t n = json_array_size(m);
    if (n == 0) return zs_err(ZS_EFORMAT, "line %ld: \"messages\" must not be empty", line);
    if (n > INT_MAX / 2) return zs_err(ZS_EFORMAT, "line %ld: too many messages", line);
    int assistants = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(m, i);
        if (!json_is_object(e)) return zs_err(ZS_EFORMAT, "line %ld: messages[%zu] must be an object", line, i);
        json_t *r = json_object_get(e, "role"), *ct = json_object_get(e, "content");
        if (!r) return zs_err(ZS_EFORMAT, "line %ld: messages[%zu].role is missing", line, i);
        if (!json_is_string(r)) return zs_err(ZS_EFORMAT, "line %ld: messages[%zu].role must be a string", line, i);
        if (!role_ok(json_string_value(r)))
            return zs_err(ZS_EFORMAT, "line %ld: messages[%zu].role must be one of system, user, assistant", line, i);
        if (!ct) return zs_err(ZS_EFORMAT, "line %ld: messages[%zu].content is missing", line, i);
        if (!json_is_string(ct))
            return zs_err(ZS_EFORMAT, "line %ld: messages[%zu].content must be a string", line, i);
        if (!strcmp(json_string_value(r), "assistant")) assistants++;
    }
    if (!assistants)
        return zs_err(ZS_EFORMAT, "line %ld: \"messages\" has no assistant message (nothing to learn from)", line);
    *shape = SHAPE_CHAT;
    return 0;
}

/* Called for each example; returns < 0 to fail, 1 to stop early, 0 to go on. */
typedef int (*line_cb)(void *ctx, const json_t *obj, int shape, long line);

static int is_blank(const char *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != ' ' && p[i] != '\t' && p[i] != '\r') return 0;
    return 1;
}

static int scan(const char *buf, size_t len, size_t max_bytes, line_cb cb, void *ctx, int *n_examples) {
    if (max_bytes == 0) max_bytes = ZS_DATA_DEFAULT_MAX_BYTES;
    if (!buf && len) return zs_err(ZS_EINVAL, "data: no buffer");
    if (len > max_bytes)
        return zs_err(ZS_ERANGE, "file is %zu bytes, over the size limit of %zu bytes", len, max_bytes);
    size_t i = 0;
    if (len >= 3 && !memcmp(buf, "\xEF\xBB\xBF", 3)) i = 3; /* UTF-8 byte order mark */
    long line = 0, blank_line = 0;
    int count = 0;
    while (i < len) {
        const char *p = buf + i;
        const char *nl = memchr(p, '\n', len - i);
        size_t n = nl ? (size_t)(nl - p) : len - i;
        i += n + (nl ? 1 : 0);
        line++;
        if (is_blank(p, n)) {
            if (!blank_line) blank_line = line;
            continue;
        }
        if (blank_line)
            return zs_err(ZS_EFORMAT, "line %ld: empty line (empty lines are allowed only at the end of the file)",
                          blank_line);
        size_t bad = utf8_bad((const unsigned char *)p, n);
        if (bad < n) return zs_err(ZS_EFORMAT, "line %ld: invalid UTF-8 (column %zu)", line, bad + 1);
        json_error_t e;
        json_t *o = json_loadb(p, n, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &e);
        if (!o) return zs_err(ZS_EFORMAT, "line %ld: not valid JSON: %s (column %d)", line, e.text, e.column);
        if (!json_is_object(o)) {
            int rc = zs_err(ZS_EFORMAT, "line %ld: expected a JSON object, got %s", line, json_kind(o));
            json_decref(o);
            return rc;
        }
        int shape = 0;
        int rc = check_shape(o, line, &shape);
        if (rc == 0 && count == INT_MAX) rc = zs_err(ZS_ERANGE, "line %ld: more than %d examples", line, INT_MAX);
        if (rc == 0) {
            count++;
            if (cb) rc = cb(ctx, o, shape, line);
        }
        json_decref(o);
        if (rc < 0) return rc;
        if (rc > 0) break;
    }
    if (count == 0) return zs_err(ZS_EFORMAT, "file is empty (no examples)");
    *n_examples = count;
    return 0;
}

int zs_data_validate_buf(const char *buf, size_t len, size_t max_bytes, int *n_examples) {
    if (!n_examples) return zs_err(ZS_EINVAL, "data: n_examples is NULL");
    return scan(buf, len, max_bytes, NULL, NULL, n_examples);
}

int zs_data_validate(const char *path, size_t max_bytes, int *n_examples) {
    if (!n_examples) return zs_err(ZS_EINVAL, "data: n_examples is NULL");
    if (max_bytes == 0) max_bytes = ZS_DATA_DEFAULT_MAX_BYTES;
    char *buf = NULL;
    size_t len = 0;
    ZS_CHECK(read_limited(path, max_bytes, &buf, &len));
    int rc = scan(buf, len, max_bytes, NULL, NULL, n_examples);
    free(buf);
    return rc;
}

/* ---------------------------------------------------------------- tokenization */

typedef struct {
    size_t s, e;    /* byte range of the answer in the text */
    int insert_eos; /* insert (and count) EOS after the range */
} span;

typedef struct {
    zs_dataset *d;
    const zs_tokenizer *tok;
    int tmpl, eos, adds_eos;
    int max_examples;
} load_ctx;

/* Encodes text[0..n); drops the EOS the post-processor appends (when it does) so that our own
 * EOS handling is the only one. */
static int encode(const load_ctx *c, const char *text, size_t n, int add_special, int32_t **ids, size_t *nid) {
    ZS_CHECK(zs_tokenizer_encode(c->tok, text, n, add_special, ids, nid));
    if (add_special && c->adds_eos && *nid > 0 && zs_tokenizer_is_eos(c->tok, (*ids)[*nid - 1])) (*nid)--;
    return 0;
}

/* Token index in full[0..nf) where text offset off falls (see data.h for straddling tokens):
 * the longest common prefix of encode(text[0..off)) and full. Exact for every tokenizer, at the
 * cost of encoding the prefix; *budget (bytes left to encode this way) bounds the work of an
 * example with many turns. */
static int boundary(const load_ctx *c, const char *text, size_t len, size_t off, int add_special,
                    const int32_t *full, size_t nf, int is_end, int insert_eos, size_t *budget, size_t *out) {
    if (off >= len) {
        *out = nf;
        return 0;
    }
    if (*budget < off)
        return zs_err(ZS_ERANGE, "conversation too long to tokenize with its loss mask (%zu bytes, too many "
                      "assistant turns): split it into shorter examples", len);
    *budget -= off;
    int32_t *p = NULL;
    size_t np = 0;
    ZS_CHECK(encode(c, text, off, add_special, &p, &np));
    size_t k = 0;
    while (k < np && k < nf && p[k] == full[k]) k++;
    free(p);
    if (k < np && is_end && !insert_eos && k < nf) k++; /* the straddling token ends the answer */
    *out = k;
    return 0;
}

static int ds_reserve(zs_dataset *d, size_t extra) {
    size_t need;
    if (zs_add_size(d->ntok, extra, &need) < 0) return zs_err(ZS_ENOMEM, "data: too many tokens");
    if (need <= d->cap) return 0;
    size_t ncap = d->cap ? d->cap : 4096;
    while (ncap < need) {
        if (ncap > SIZE_MAX / 2) return zs_err(ZS_ENOMEM, "data: too many tokens");
        ncap *= 2;
    }
    int32_t *t = realloc(d->tok, ncap * sizeof *t);
    if (!t) return zs_err(ZS_ENOMEM, "data: out of memory (%zu tokens)", ncap);
    d->tok = t;
    uint8_t *l = realloc(d->loss, ncap);
    if (!l) return zs_err(ZS_ENOMEM, "data: out of memory (%zu tokens)", ncap);
    d->loss = l;
    d->cap = ncap;
    return 0;
}

/* Tokenizes text with the answer spans (sorted, disjoint) and appends one example to the dataset. */
static int add_example(load_ctx *c, const char *text, size_t len, int add_special, const span *sp, int nsp) {
    zs_dataset *d = c->d;
    int32_t *full = NULL;
    size_t nf = 0;
    ZS_CHECK(encode(c, text, len, add_special, &full, &nf));
    size_t *bs = malloc(2 * (size_t)(nsp > 0 ? nsp : 1) * sizeof *bs);
    if (!bs) {
        free(full);
        return zs_err(ZS_ENOMEM, "data: out of memory");
    }
    size_t *be = bs + nsp;
    int rc = 0;
    /* prefix encodings may cost 64x the text + 4 MiB: at least 64 assistant turns of any length */
    size_t budget = len > (SIZE_MAX - ((size_t)4 << 20)) / 64 ? SIZE_MAX : 64 * len + ((size_t)4 << 20);
    for (int k = 0; k < nsp && rc == 0; k++) {
        rc = boundary(c, text, len, sp[k].s, add_special, full, nf, 0, sp[k].insert_eos, &budget, &bs[k]);
        if (rc == 0)
            rc = boundary(c, text, len, sp[k].e, add_special, full, nf, 1, sp[k].insert_eos, &budget, &be[k]);
        if (rc == 0 && be[k] < bs[k]) be[k] = bs[k];
    }
    if (rc == 0) rc = ds_reserve(d, nf + (size_t)nsp);
    if (rc == 0 && (size_t)d->n + 2 > d->offcap) {
        size_t ncap = d->offcap ? d->offcap * 2 : 1024;
        size_t *no = realloc(d->off, ncap * sizeof *no);
        if (!no) rc = zs_err(ZS_ENOMEM, "data: out of memory");
        else {
            d->off = no;
            d->offcap = ncap;
        }
    }
    if (rc == 0) {
        size_t start = d->ntok, w = start;
        int k = 0; /* next span whose end has not been passed */
        for (size_t i = 0; i <= nf; i++) {
            /* EOS inserted at the end of spans that end at token i */
            while (k < nsp && be[k] <= i) {
                if (sp[k].insert_eos && c->eos >= 0 && be[k] == i) {
                    d->tok[w] = c->eos;
                    d->loss[w++] = 1;
                }
                k++;
            }
            if (i == nf) break;
            int counted = 0;
            for (int q = k; q < nsp && bs[q] <= i; q++)
                if (i < be[q]) counted = 1;
            d->tok[w] = full[i];
            d->loss[w++] = (uint8_t)counted;
        }
        if (w > start) d->loss[start] = 0; /* nothing predicts the first token */
        d->off[d->n] = start;
        d->n++;
        d->ntok = w;
        d->off[d->n] = w;
        if (w - start > d->max_len) d->max_len = w - start;
    }
    free(bs);
    free(full);
    return rc;
}

static int add_chat(load_ctx *c, const json_t *msgs, long line) {
    size_t n = json_array_size(msgs);
    zs_chat_msg *m = calloc(n, sizeof *m);
    if (!m) return zs_err(ZS_ENOMEM, "data: out of memory");
    int nasst = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(msgs, i);
        m[i].role = json_string_value(json_object_get(e, "role"));
        m[i].content = json_string_value(json_object_get(e, "content"));
        if (!strcmp(m[i].role, "assistant")) nasst++;
    }
    const char *bos = NULL, *eos = NULL;
    int bid = zs_tokenizer_bos(c->tok);
    if (bid >= 0) bos = zs_tokenizer_piece(c->tok, bid);
    if (c->eos >= 0) eos = zs_tokenizer_piece(c->tok, c->eos);
    char *r = NULL, *rk = NULL, marker[48];
    span *sp = NULL;
    int rc = zs_chat_render(c->tmpl, m, (int)n, 0, bos, eos, &r);
    if (rc < 0) {
        rc = zs_err_prefix(rc == ZS_ENOMEM ? rc : ZS_EFORMAT, "line %ld", line);
        goto done;
    }
    /* a marker that no content holds: rendering with it in place of an assistant's content
     * shows where that content starts in the rendered text */
    for (unsigned u = 0;; u++) {
        snprintf(marker, sizeof marker, "\x01zs-data-answer-%u\x01", u);
        int clash = 0;
        for (size_t i = 0; i < n && !clash; i++) clash = strstr(m[i].content, marker) != NULL;
        if (!clash) break;
    }
    const char *closing = "";
    char close_buf[256];
    switch (c->tmpl) {
    case ZS_CHAT_LLAMA2:
        snprintf(close_buf, sizeof close_buf, " %s", eos ? eos : "</s>");
        closing = close_buf;
        break;
    case ZS_CHAT_LLAMA3: closing = "<|eot_id|>"; break;
    case ZS_CHAT_CHATML: closing = "<|im_end|>"; break;
    case ZS_CHAT_GEMMA: closing = "<end_of_turn>"; break;
    case ZS_CHAT_PHI3: closing = "<|end|>"; break;
    default: break;
    }
    size_t rlen = strlen(r), mlen = strlen(marker), clen = strlen(closing);
    sp = calloc((size_t)nasst, sizeof *sp);
    if (!sp) {
        rc = zs_err(ZS_ENOMEM, "data: out of memory");
        goto done;
    }
    int k = 0;
    for (size_t i = 0; i < n; i++) {
        if (strcmp(m[i].role, "assistant")) continue;
        const char *saved = m[i].content;
        m[i].content = marker;
        rc = zs_chat_render(c->tmpl, m, (int)n, 0, bos, eos, &rk);
        m[i].content = saved;
        if (rc < 0) {
            rc = zs_err_prefix(rc == ZS_ENOMEM ? rc : ZS_EFORMAT, "line %ld", line);
            goto done;
        }
        const char *at = strstr(rk, marker);
        size_t rklen = strlen(rk);
        size_t p = at ? (size_t)(at - rk) : 0, rest = at ? rklen - p - mlen : 0;
        /* r = rk[0..p) + content as rendered + rk[p + mlen..] */
        if (!at || p > rlen || rest > rlen - p || memcmp(r, rk, p) || memcmp(r + rlen - rest, at + mlen, rest) ||
            rest < clen || memcmp(r + rlen - rest, closing, clen)) {
            rc = zs_err(ZS_EUNSUPPORTED, "line %ld: cannot locate messages[%zu] in the %s chat template's text",
                        line, i, zs_chat_template_name(c->tmpl));
            goto done;
        }
        sp[k].s = p;
        sp[k].e = rlen - rest + clen;
        sp[k].insert_eos = clen == 0;
        k++;
        free(rk);
        rk = NULL;
    }
    rc = add_example(c, r, rlen, !zs_chat_has_bos(c->tmpl), sp, nasst);
    if (rc < 0) zs_err_prefix(rc, "line %ld", line);
done:
    free(rk);
    free(sp);
    free(r);
    free(m);
    return rc;
}

static int load_cb(void *ctx, const json_t *o, int shape, long line) {
    load_ctx *c = ctx;
    int rc;
    if (shape == SHAPE_TEXT) {
        json_t *t = json_object_get(o, "text");
        size_t n = json_string_length(t);
        span s = {0, n, 1};
        rc = add_example(c, json_string_value(t), n, 1, &s, 1);
        if (rc < 0) zs_err_prefix(rc, "line %ld", line);
    } else if (shape == SHAPE_PC) {
        json_t *p = json_object_get(o, "prompt"), *q = json_object_get(o, "completion");
        size_t np = json_string_length(p), nq = json_string_length(q);
        char *buf = malloc(np + nq + 1);
        if (!buf) return zs_err(ZS_ENOMEM, "data: out of memory");
        memcpy(buf, json_string_value(p), np);
        memcpy(buf + np, json_string_value(q), nq);
        buf[np + nq] = 0;
        span s = {np, np + nq, 1};
        rc = add_example(c, buf, np + nq, 1, &s, 1);
        if (rc < 0) zs_err_prefix(rc, "line %ld", line);
        free(buf);
    } else {
        rc = add_chat(c, json_object_get(o, "messages"), line);
    }
    if (rc < 0) return rc;
    return c->max_examples > 0 && c->d->n >= c->max_examples ? 1 : 0;
}

int zs_data_load(const char *path, const zs_tokenizer *tok, const zs_data_opts *o, zs_dataset **out) {
    if (!tok || !out) return zs_err(ZS_EINVAL, "data: no tokenizer or output");
    zs_data_opts def = {ZS_CHAT_PLAIN, 0, 0};
    if (!o) o = &def;
    if (o->chat_template < 0 || o->chat_template >= ZS_CHAT_NFAMILIES)
        return zs_err(ZS_EINVAL, "data: chat template %d is unknown", o->chat_template);
    if (o->max_examples < 0) return zs_err(ZS_EINVAL, "data: max_examples %d is negative", o->max_examples);
    size_t max_bytes = o->max_bytes ? o->max_bytes : ZS_DATA_DEFAULT_MAX_BYTES;
    char *buf = NULL;
    size_t len = 0;
    ZS_CHECK(read_limited(path, max_bytes, &buf, &len));
    zs_dataset *d = calloc(1, sizeof *d);
    if (!d) {
        free(buf);
        return zs_err(ZS_ENOMEM, "data: out of memory");
    }
    load_ctx c = {d, tok, o->chat_template, zs_tokenizer_eos(tok), 0, o->max_examples};
    /* does the post-processor append EOS itself (add_eos_token)? */
    int32_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    if (zs_tokenizer_encode(tok, "a", 1, 1, &a, &na) == 0 && zs_tokenizer_encode(tok, "a", 1, 0, &b, &nb) == 0)
        c.adds_eos = na > 0 && zs_tokenizer_is_eos(tok, a[na - 1]) && !(nb > 0 && zs_tokenizer_is_eos(tok, b[nb - 1]));
    free(a);
    free(b);
    int n = 0;
    int rc = scan(buf, len, max_bytes, load_cb, &c, &n);
    free(buf);
    if (rc < 0) {
        zs_data_free(d);
        return rc;
    }
    *out = d;
    return 0;
}

void zs_data_free(zs_dataset *d) {
    if (!d) return;
    free(d->off);
    free(d->tok);
    free(d->loss);
    free(d->perm);
    free(d);
}

int zs_data_count(const zs_dataset *d) { return d ? d->n : 0; }
size_t zs_data_tokens(const zs_dataset *d) { return d ? d->ntok : 0; }
size_t zs_data_max_len(const zs_dataset *d) { return d ? d->max_len : 0; }

int zs_data_example(const zs_dataset *d, int i, const int32_t **tokens, const uint8_t **loss, size_t *n) {
    if (!d || i < 0 || i >= d->n) return zs_err(ZS_ERANGE, "data: example %d out of range [0, %d)", i, d ? d->n : 0);
    if (tokens) *tokens = d->tok + d->off[i];
    if (loss) *loss = d->loss + d->off[i];
    if (n) *n = d->off[i + 1] - d->off[i];
    return 0;
}

/* ---------------------------------------------------------------- batching */

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [0, bound) by rejection (no modulo bias). */
static uint64_t below(uint64_t *s, uint64_t bound) {
    uint64_t lim = UINT64_MAX - UINT64_MAX % bound;
    uint64_t r;
    do r = splitmix64(s);
    while (r >= lim);
    return r % bound;
}

static int ensure_perm(zs_dataset *d, uint64_t seed, int epoch) {
    if (d->perm_valid && d->perm_seed == seed && d->perm_epoch == epoch) return 0;
    if (!d->perm) {
        d->perm = malloc((size_t)d->n * sizeof *d->perm);
        if (!d->perm) return zs_err(ZS_ENOMEM, "data: out of memory");
    }
    for (int i = 0; i < d->n; i++) d->perm[i] = i;
    uint64_t s = seed + (uint64_t)epoch;
    for (int i = d->n - 1; i > 0; i--) {
        int j = (int)below(&s, (uint64_t)i + 1);
        int t = d->perm[i];
        d->perm[i] = d->perm[j];
        d->perm[j] = t;
    }
    d->perm_valid = 1;
    d->perm_seed = seed;
    d->perm_epoch = epoch;
    return 0;
}

long zs_data_batches_per_epoch(const zs_dataset *d, int B) {
    if (!d || B < 1) return 0;
    return ((long)d->n + B - 1) / B;
}

int zs_data_next_batch(zs_dataset *d, zs_data_pos *pos, int B, int T, int32_t *tokens, int32_t *targets,
                       int *n_rows_filled) {
    if (!d || !pos || !tokens || !targets || !n_rows_filled) return zs_err(ZS_EINVAL, "data: NULL argument");
    if (B < 1 || T < 1) return zs_err(ZS_EINVAL, "data: batch shape [%d, %d] must be positive", B, T);
    if (d->n < 1) return zs_err(ZS_EINVAL, "data: the dataset is empty");
    if (pos->epoch < 0 || pos->index < 0 || pos->index > d->n)
        return zs_err(ZS_EINVAL, "data: position (epoch %d, index %ld) out of range (%d examples)", pos->epoch,
                      pos->index, d->n);
    zs_data_pos p = *pos;
    if (p.index == d->n) {
        if (p.epoch == INT_MAX) return zs_err(ZS_ERANGE, "data: epoch counter overflow");
        p.epoch++;
        p.index = 0;
    }
    ZS_CHECK(ensure_perm(d, p.seed, p.epoch));
    long left = d->n - p.index;
    int rows = left < B ? (int)left : B;
    for (int r = 0; r < B; r++) {
        int32_t *tk = tokens + (size_t)r * (size_t)T, *tg = targets + (size_t)r * (size_t)T;
        size_t n = 0;
        const int32_t *et = NULL;
        const uint8_t *el = NULL;
        if (r < rows) {
            size_t e = (size_t)d->perm[p.index + r];
            et = d->tok + d->off[e];
            el = d->loss + d->off[e];
            n = d->off[e + 1] - d->off[e];
        }
        for (size_t t = 0; t < (size_t)T; t++) {
            tk[t] = t < n ? et[t] : 0;
            tg[t] = t + 1 < n && el[t + 1] ? et[t + 1] : -1;
        }
    }
    p.index += rows;
    if (p.index == d->n && p.epoch < INT_MAX) {
        p.epoch++;
        p.index = 0;
    }
    *pos = p;
    *n_rows_filled = rows;
    return 0;
}
