/* quota.c — per-tenant request, token and concurrency limits (quota.h): one entry per tenant seen,
 * with two token buckets and a count of requests in flight. */
#include "quota.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

typedef struct {
    char tenant[ZS_TENANT_MAX];
    double req_tokens, req_t; /* rpm bucket and when it was last refilled (req_t < 0: never) */
    double tok_tokens, tok_t; /* tpm bucket */
    long inflight;
} entry;

struct zs_quota {
    pthread_mutex_t mu;
    entry *e;
    int n, cap;
};

int zs_quota_new(zs_quota **out) {
    zs_quota *L = calloc(1, sizeof *L);
    if (!L) return zs_err(ZS_ENOMEM, "out of memory");
    pthread_mutex_init(&L->mu, NULL);
    *out = L;
    return 0;
}

void zs_quota_free(zs_quota *L) {
    if (!L) return;
    pthread_mutex_destroy(&L->mu);
    free(L->e);
    free(L);
}

static entry *find_locked(zs_quota *L, const char *tenant, int add) {
    for (int i = 0; i < L->n; i++)
        if (!strcmp(L->e[i].tenant, tenant)) return &L->e[i];
    if (!add) return NULL;
    if (L->n == L->cap) {
        int nc = L->cap ? L->cap * 2 : 16;
        entry *ne = realloc(L->e, (size_t)nc * sizeof *ne);
        if (!ne) return NULL;
        L->e = ne;
        L->cap = nc;
    }
    entry *e = &L->e[L->n++];
    memset(e, 0, sizeof *e);
    snprintf(e->tenant, sizeof e->tenant, "%s", tenant);
    e->req_t = e->tok_t = -1;
    return e;
}

/* Refills a bucket of a minute's worth (per_min) to time now; a new bucket starts full. A limit
 * lowered by a key reload clamps the bucket to the new minute's worth. */
static void refill(double *tokens, double *t, long per_min, double now) {
    double cap = (double)per_min;
    if (*t < 0) *tokens = cap;
    else if (now > *t) *tokens += (now - *t) * cap / 60.0;
    if (*tokens > cap) *tokens = cap;
    *t = now;
}

static long wait_for(double tokens, double want, long per_min) {
    double s = (want - tokens) * 60.0 / (double)per_min;
    long r = (long)ceil(s);
    return r < 1 ? 1 : r;
}

int zs_quota_admit(zs_quota *L, const char *tenant, const zs_key_limits *lim, double now,
                    zs_quota_refusal *why) {
    pthread_mutex_lock(&L->mu);
    entry *e = find_locked(L, tenant, 1);
    if (!e) {
        pthread_mutex_unlock(&L->mu);
        return zs_err(ZS_ENOMEM, "out of memory");
    }
    int ok = 1;
    if (lim->streams > 0 && e->inflight >= lim->streams) {
        /* a slot frees when a request ends; no time can be promised, so a second */
        *why = (zs_quota_refusal){"streams", "requests-at-once", lim->streams, 1};
        ok = 0;
    }
    if (ok && lim->rpm > 0) {
        refill(&e->req_tokens, &e->req_t, lim->rpm, now);
        if (e->req_tokens < 1.0) {
            *why = (zs_quota_refusal){"rpm", "requests-a-minute", lim->rpm, wait_for(e->req_tokens, 1.0, lim->rpm)};
            ok = 0;
        }
    }
    if (ok && lim->tpm > 0) {
        refill(&e->tok_tokens, &e->tok_t, lim->tpm, now);
        if (e->tok_tokens <= 0) {
            /* admitted again once the bucket is above zero: one token's worth past it */
            *why = (zs_quota_refusal){"tpm", "tokens-a-minute", lim->tpm, wait_for(e->tok_tokens, 1.0, lim->tpm)};
            ok = 0;
        }
    }
    if (ok) {
        if (lim->rpm > 0) e->req_tokens -= 1.0;
        e->inflight++;
    }
    pthread_mutex_unlock(&L->mu);
    return ok;
}

void zs_quota_done(zs_quota *L, const char *tenant) {
    pthread_mutex_lock(&L->mu);
    entry *e = find_locked(L, tenant, 0);
    if (e && e->inflight > 0) e->inflight--;
    pthread_mutex_unlock(&L->mu);
}

void zs_quota_charge(zs_quota *L, const char *tenant, const zs_key_limits *lim, long tokens,
                      double now) {
    if (lim->tpm <= 0 || tokens <= 0) return;
    pthread_mutex_lock(&L->mu);
    entry *e = find_locked(L, tenant, 1);
    if (e) {
        refill(&e->tok_tokens, &e->tok_t, lim->tpm, now);
        e->tok_tokens -= (double)tokens;
    }
    pthread_mutex_unlock(&L->mu);
}

long zs_quota_inflight(zs_quota *L, const char *tenant) {
    pthread_mutex_lock(&L->mu);
    entry *e = find_locked(L, tenant, 0);
    long n = e ? e->inflight : 0;
    pthread_mutex_unlock(&L->mu);
    return n;
}
