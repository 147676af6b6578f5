/* strbuf.h — a growable byte string used to build text (chat prompts, JSON, SSE): appends never
 * fail loudly; an allocation failure sets oom and later appends are dropped, so the caller checks
 * once at the end. Header-only; a buffer belongs to one thread. Free p with free(). */
#ifndef ZS_STRBUF_H
#define ZS_STRBUF_H

#include <stdlib.h>
#include <string.h>

typedef struct {
    char *p;
    size_t len, cap;
    int oom;
} sbuf;

static inline void sb_addn(sbuf *b, const char *s, size_t n) {
    if (b->oom || !n) return;
    if (b->len + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc < b->len + n + 1) nc *= 2;
        char *np = realloc(b->p, nc);
        if (!np) {
            b->oom = 1;
            return;
        }
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

#endif
