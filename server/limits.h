/* limits.h — per-tenant limits from the key file (keys.h's zs_key_limits): requests a minute (rpm),
 * tokens a minute (tpm), requests at once (streams). Jobs at once are counted by the fine-tuning
 * jobs (ftjobs.c), which know which jobs still run.
 *
 * rpm and tpm are token buckets that hold a minute's worth and refill continuously, so a tenant may
 * burst up to its limit and then goes at the limit's rate. A request is admitted while the tenant's
 * token bucket is above zero; its tokens (prompt and generated) are charged when it finishes, so one
 * large request may take the bucket below zero, and the tenant waits until it has refilled.
 *
 * Times are seconds on any monotonic clock, passed in (tests drive the clock). Ownership: the table
 * owns copies of tenant names. Thread-safety: every call is thread-safe. */
#ifndef ZS_LIMITS_H
#define ZS_LIMITS_H

#include "keys.h"

typedef struct zs_limits zs_limits;

/* Why a request was refused. */
typedef struct {
    const char *limit; /* "rpm", "tpm" or "streams" (static) */
    long value;        /* the limit's value */
    long retry_s;      /* seconds until it would be admitted (at least 1) */
} zs_limits_refusal;

int  zs_limits_new(zs_limits **out);
void zs_limits_free(zs_limits *L);
/* Admits one request of tenant under lim at time now: 1, and it holds one of its streams until
 * zs_limits_done; or 0 and *why. A tenant without limits is always admitted (and counted).
 * ZS_ENOMEM when the table cannot grow. */
int  zs_limits_admit(zs_limits *L, const char *tenant, const zs_key_limits *lim, double now,
                     zs_limits_refusal *why);
/* The request admitted for tenant has finished. */
void zs_limits_done(zs_limits *L, const char *tenant);
/* Charges tokens to tenant's tokens-a-minute bucket (no-op without a tpm limit). */
void zs_limits_charge(zs_limits *L, const char *tenant, const zs_key_limits *lim, long tokens,
                      double now);
/* The tenant's requests in flight (0 for a tenant never seen). */
long zs_limits_inflight(zs_limits *L, const char *tenant);

#endif
