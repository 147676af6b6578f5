/* stop.c — stop-string detection over streamed text (see stop.h). The held-back text plus each
 * new chunk is searched with memmem for every stop string; what cannot be part of a future
 * match is released at once. */
#define _GNU_SOURCE /* memmem */
#include "stop.h"

#include <string.h>

#include "common.h"

struct zs_stop {
    int n;
    char *str[ZS_STOP_MAX_COUNT];
    size_t len[ZS_STOP_MAX_COUNT];
    char *buf;     /* held-back text, then the new chunk appended during a push */
    size_t held;   /* bytes of held-back text at the start of buf */
    size_t bufcap; /* allocated bytes of buf */
    int stopped;
};

int zs_stop_new(const char *const *stops, int n, zs_stop **out) {
    if (n < 0) return zs_err(ZS_EINVAL, "stop: negative count %d", n);
    if (n > ZS_STOP_MAX_COUNT)
        return zs_err(ZS_EINVAL, "stop: at most %d stop strings are allowed (got %d)",
                      ZS_STOP_MAX_COUNT, n);
    if (n > 0 && !stops) return zs_err(ZS_EINVAL, "stop: list is NULL");
    if (!out) return zs_err(ZS_EINVAL, "zs_stop_new: out is NULL");
    for (int i = 0; i < n; i++) {
        if (!stops[i]) return zs_err(ZS_EINVAL, "stop[%d] is null", i);
        size_t m = strnlen(stops[i], ZS_STOP_MAX_LEN + 1);
        if (m == 0) return zs_err(ZS_EINVAL, "stop[%d] is an empty string", i);
        if (m > ZS_STOP_MAX_LEN)
            return zs_err(ZS_EINVAL, "stop[%d] is longer than %d bytes", i, ZS_STOP_MAX_LEN);
    }
    zs_stop *s = calloc(1, sizeof *s);
    if (!s) return zs_err(ZS_ENOMEM, "stop: out of memory");
    for (int i = 0; i < n; i++) {
        s->len[i] = strlen(stops[i]);
        s->str[i] = malloc(s->len[i] + 1);
        if (!s->str[i]) {
            zs_stop_free(s);
            return zs_err(ZS_ENOMEM, "stop: out of memory");
        }
        memcpy(s->str[i], stops[i], s->len[i] + 1);
        s->n = i + 1;
    }
    *out = s;
    return 0;
}

void zs_stop_free(zs_stop *s) {
    if (!s) return;
    for (int i = 0; i < s->n; i++) free(s->str[i]);
    free(s->buf);
    free(s);
}

size_t zs_stop_held(const zs_stop *s) { return s ? s->held : 0; }

/* Longest k < len(stop) such that the last k bytes of b[0..L) equal the first k of a stop. */
static size_t longest_partial(const zs_stop *s, const char *b, size_t L) {
    size_t h = 0;
    for (int i = 0; i < s->n; i++) {
        size_t k = s->len[i] - 1;
        if (k > L) k = L;
        for (; k > h; k--) {
            if (memcmp(b + L - k, s->str[i], k) == 0) {
                h = k;
                break;
            }
        }
    }
    return h;
}

int zs_stop_push(zs_stop *s, const char *text, size_t len, char *out, size_t cap,
                 size_t *n_out, int *stopped) {
    if (!s) return zs_err(ZS_EINVAL, "zs_stop_push: stop is NULL");
    if (!text && len) return zs_err(ZS_EINVAL, "zs_stop_push: text is NULL");
    if (!out && cap) return zs_err(ZS_EINVAL, "zs_stop_push: out is NULL");
    if (!n_out || !stopped) return zs_err(ZS_EINVAL, "zs_stop_push: n_out/stopped is NULL");
    if (s->stopped) {
        *n_out = 0;
        *stopped = 1;
        return 0;
    }
    size_t L;
    if (zs_add_size(s->held, len, &L)) return zs_err(ZS_ERANGE, "stop: text too long");
    if (L == 0) { /* nothing held and an empty piece (a token whose text is still incomplete) */
        *n_out = 0;
        *stopped = 0;
        return 0;
    }
    if (L > s->bufcap) {
        size_t nc = s->bufcap ? s->bufcap : 512;
        while (nc < L) nc = nc > SIZE_MAX / 2 ? L : nc * 2;
        char *nb = realloc(s->buf, nc);
        if (!nb) return zs_err(ZS_ENOMEM, "stop: out of memory for %zu bytes", L);
        s->buf = nb;
        s->bufcap = nc;
    }
    if (len) memcpy(s->buf + s->held, text, len); /* held part stays intact until commit */
    const char *b = s->buf;

    /* Earliest completed stop: smallest end, then smallest start. */
    size_t best_start = SIZE_MAX, best_end = SIZE_MAX;
    for (int i = 0; i < s->n; i++) {
        const char *hit = memmem(b, L, s->str[i], s->len[i]);
        if (!hit) continue;
        size_t st = (size_t)(hit - b), en = st + s->len[i];
        if (en < best_end || (en == best_end && st < best_start)) {
            best_start = st;
            best_end = en;
        }
    }
    if (best_end != SIZE_MAX) {
        if (best_start > cap)
            return zs_err(ZS_ENOSPC, "stop: output needs %zu bytes, buffer has %zu", best_start,
                          cap);
        if (best_start) memcpy(out, b, best_start);
        s->held = 0;
        s->stopped = 1;
        *n_out = best_start;
        *stopped = 1;
        return 0;
    }

    size_t cut = L - longest_partial(s, b, L);
    /* Never end the released text inside a UTF-8 character (at most 3 continuation bytes). */
    for (int i = 0; i < 3 && cut > 0 && cut < L && ((unsigned char)b[cut] & 0xC0) == 0x80; i++)
        cut--;
    if (cut > cap)
        return zs_err(ZS_ENOSPC, "stop: output needs %zu bytes, buffer has %zu", cut, cap);
    if (cut) memcpy(out, b, cut);
    memmove(s->buf, b + cut, L - cut);
    s->held = L - cut;
    *n_out = cut;
    *stopped = 0;
    return 0;
}

int zs_stop_flush(zs_stop *s, char *out, size_t cap, size_t *n_out) {
    if (!s) return zs_err(ZS_EINVAL, "zs_stop_flush: stop is NULL");
    if (!out && cap) return zs_err(ZS_EINVAL, "zs_stop_flush: out is NULL");
    if (!n_out) return zs_err(ZS_EINVAL, "zs_stop_flush: n_out is NULL");
    if (s->held > cap)
        return zs_err(ZS_ENOSPC, "stop: flush needs %zu bytes, buffer has %zu", s->held, cap);
    if (s->held) memcpy(out, s->buf, s->held);
    *n_out = s->held;
    s->held = 0;
    return 0;
}
