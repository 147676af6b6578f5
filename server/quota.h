/* quota.h — per-tenant limits from the key file (keys.h's zs_key_limits): requests a minute (rpm),
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
#ifndef ZS_QUOTA_H
#define ZS_QUOTA_H

#include "keys.h"

typedef struct zs_quota zs_quota;

/* Why a request was refused. */
typedef struct {
    const char *limit; /* "rpm", "tpm" or "streams" (static) */
    const char *what;  /* what it counts, in words: "requests-a-minute", ... (static) */
    long value;        /* the limit's value */
    long retry_s;      /* seconds until it would be admitted (at least 1) */
} zs_quota_refusal;

int  zs_quota_new(zs_quota **out);
void zs_quota_free(zs_quota *L);
/* Admits one request of tenant under lim at time now: 1, and it holds one of its streams until
 * zs_quota_done; or 0 and *why. A tenant without limits is always admitted (and counted).
 * ZS_ENOMEM when the table cannot grow. */
int  zs_quota_admit(zs_quota *L, const char *tenant, const zs_key_limits *lim, double now,
                     zs_quota_refusal *why);
/* The request admitted for tenant has finished. */
void zs_quota_done(zs_quota *L, const char *tenant);
/* Charges tokens to tenant's tokens-a-minute bucket (no-op without a tpm limit). */
void zs_quota_charge(zs_quota *L, const char *tenant, const zs_key_limits *lim, long tokens,
                      double now);
/* The tenant's requests in flight (0 for a tenant never seen). */
long zs_quota_inflight(zs_quota *L, const char *tenant);

#endif
