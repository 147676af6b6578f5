/* test-quota.c — the per-tenant limits (server/quota.h) on a clock the test drives: requests a
 * minute as a bucket that bursts to the limit then refills at limit/60 a second, with Retry-After
 * the seconds to the next request; requests at once held until done; tokens a minute charged after
 * the fact (one large request takes the bucket below zero and the tenant waits for it to refill);
 * tenants independent; no limits, no refusals; a limit lowered by a key reload clamps the bucket;
 * many threads admitting and finishing leave nothing in flight. */
#include <pthread.h>
#include <string.h>

#include "common.h"
#include "quota.h"
#include "testutil.h"

static zs_key_limits lim(long rpm, long tpm, long streams) { return (zs_key_limits){rpm, tpm, streams, 0}; }

static void test_rpm(void) {
    zs_quota *L;
    CHECK(zs_quota_new(&L) == 0, "new");
    zs_key_limits a = lim(6, 0, 0), none = lim(0, 0, 0);
    zs_quota_refusal w;
    int n = 0;
    for (int i = 0; i < 10; i++) {
        int ok = zs_quota_admit(L, "a", &a, 100.0, &w);
        if (ok == 1) {
            n++;
            zs_quota_done(L, "a");
        }
    }
    CHECK(n == 6, "rpm=6: a burst of 10 at one instant admits 6 (%d)", n);
    CHECK(zs_quota_admit(L, "a", &a, 100.0, &w) == 0 && !strcmp(w.limit, "rpm") && w.value == 6 && w.retry_s == 10,
          "the 7th is refused by rpm=6 with Retry-After 10 s (%s %ld %ld)", w.limit, w.value, w.retry_s);
    CHECK(zs_quota_admit(L, "a", &a, 104.0, &w) == 0 && w.retry_s == 6, "4 s later: 6 s to go (%ld)", w.retry_s);
    CHECK(zs_quota_admit(L, "a", &a, 110.0, &w) == 1, "10 s later one more is admitted");
    zs_quota_done(L, "a");
    CHECK(zs_quota_admit(L, "a", &a, 110.0, &w) == 0, "and only one");
    CHECK(zs_quota_admit(L, "b", &a, 110.0, &w) == 1, "another tenant has its own bucket");
    zs_quota_done(L, "b");
    CHECK(zs_quota_admit(L, "a", &a, 1000.0, &w) == 1, "after a long pause the bucket is full again");
    zs_quota_done(L, "a");
    n = 0;
    for (int i = 0; i < 10; i++)
        if (zs_quota_admit(L, "a", &a, 1000.0, &w) == 1) n++;
    CHECK(n == 5, "but no fuller than a minute's worth (%d more)", n);
    for (int i = 0; i < n; i++) zs_quota_done(L, "a");
    zs_key_limits lower = lim(2, 0, 0);
    CHECK(zs_quota_admit(L, "c", &a, 0.0, &w) == 1, "c starts at rpm=6");
    zs_quota_done(L, "c");
    n = 0;
    for (int i = 0; i < 10; i++)
        if (zs_quota_admit(L, "c", &lower, 0.5, &w) == 1) n++;
    CHECK(n == 2, "a reload lowering rpm to 2 clamps the bucket: 2 admitted (%d)", n);
    for (int i = 0; i < n; i++) zs_quota_done(L, "c");
    n = 0;
    for (int i = 0; i < 1000; i++)
        if (zs_quota_admit(L, "free", &none, 0.0, &w) == 1) n++;
    CHECK(n == 1000 && zs_quota_inflight(L, "free") == 1000, "no limits: all admitted and counted");
    zs_quota_free(L);
}

static void test_streams(void) {
    zs_quota *L;
    CHECK(zs_quota_new(&L) == 0, "new");
    zs_key_limits s = lim(0, 0, 2);
    zs_quota_refusal w;
    CHECK(zs_quota_admit(L, "a", &s, 0, &w) == 1 && zs_quota_admit(L, "a", &s, 0, &w) == 1, "streams=2: two at once");
    CHECK(zs_quota_admit(L, "a", &s, 0, &w) == 0 && !strcmp(w.limit, "streams") && w.value == 2 && w.retry_s >= 1,
          "a third is refused by streams (%s, retry %ld)", w.limit, w.retry_s);
    CHECK(zs_quota_inflight(L, "a") == 2, "two in flight");
    CHECK(zs_quota_admit(L, "b", &s, 0, &w) == 1, "tenant b is not held up by a");
    zs_quota_done(L, "a");
    CHECK(zs_quota_admit(L, "a", &s, 0, &w) == 1, "one done: one more admitted");
    zs_quota_done(L, "a");
    zs_quota_done(L, "a");
    zs_quota_done(L, "a"); /* one too many: stays at zero */
    CHECK(zs_quota_inflight(L, "a") == 0, "done more often than admitted stays at 0");
    zs_quota_done(L, "never"); /* unknown: no-op */
    CHECK(zs_quota_inflight(L, "never") == 0, "an unknown tenant has none in flight");
    zs_quota_free(L);
}

static void test_tpm(void) {
    zs_quota *L;
    CHECK(zs_quota_new(&L) == 0, "new");
    zs_key_limits t = lim(0, 600, 0); /* 10 tokens a second */
    zs_quota_refusal w;
    CHECK(zs_quota_admit(L, "a", &t, 0, &w) == 1, "first request admitted");
    zs_quota_charge(L, "a", &t, 500, 0);
    zs_quota_done(L, "a");
    CHECK(zs_quota_admit(L, "a", &t, 0, &w) == 1, "100 of 600 tokens left: admitted");
    zs_quota_charge(L, "a", &t, 400, 0);
    zs_quota_done(L, "a");
    CHECK(zs_quota_admit(L, "a", &t, 0, &w) == 0 && !strcmp(w.limit, "tpm") && w.value == 600 && w.retry_s == 31,
          "300 tokens below zero: refused by tpm with Retry-After 31 s (%s %ld)", w.limit, w.retry_s);
    CHECK(zs_quota_admit(L, "a", &t, 30.0, &w) == 0, "at 30 s the bucket is at 0: still refused");
    CHECK(zs_quota_admit(L, "a", &t, 30.2, &w) == 1, "above zero again: admitted");
    zs_quota_done(L, "a");
    CHECK(zs_quota_admit(L, "b", &t, 0, &w) == 1, "b's tokens are its own");
    zs_quota_done(L, "b");
    zs_key_limits both = lim(1, 600, 1);
    CHECK(zs_quota_admit(L, "c", &both, 0, &w) == 1, "rpm, tpm and streams together: the first admitted");
    CHECK(zs_quota_admit(L, "c", &both, 0, &w) == 0 && !strcmp(w.limit, "streams"), "then streams refuses first (%s)", w.limit);
    zs_quota_done(L, "c");
    CHECK(zs_quota_admit(L, "c", &both, 0, &w) == 0 && !strcmp(w.limit, "rpm"), "then rpm (%s)", w.limit);
    zs_quota_charge(L, "none", &(zs_key_limits){0}, 1000000, 0);
    CHECK(zs_quota_admit(L, "none", &(zs_key_limits){0}, 0, &w) == 1, "no tpm: charging is a no-op");
    zs_quota_done(L, "none");
    zs_quota_free(L);
}

typedef struct {
    zs_quota *L;
    int admitted;
} worker_arg;

static void *worker(void *p) {
    worker_arg *a = p;
    zs_key_limits s = lim(0, 0, 4);
    zs_quota_refusal w;
    for (int i = 0; i < 20000; i++)
        if (zs_quota_admit(a->L, i % 2 ? "x" : "y", &s, 0, &w) == 1) {
            a->admitted++;
            zs_quota_done(a->L, i % 2 ? "x" : "y");
        }
    return NULL;
}

static void test_threads(void) {
    zs_quota *L;
    CHECK(zs_quota_new(&L) == 0, "new");
    pthread_t t[8];
    worker_arg a[8];
    for (int i = 0; i < 8; i++) {
        a[i] = (worker_arg){L, 0};
        pthread_create(&t[i], NULL, worker, &a[i]);
    }
    int total = 0;
    for (int i = 0; i < 8; i++) {
        pthread_join(t[i], NULL);
        total += a[i].admitted;
    }
    CHECK(total > 0 && zs_quota_inflight(L, "x") == 0 && zs_quota_inflight(L, "y") == 0,
          "8 threads admitting and finishing: %d admitted, none left in flight", total);
    zs_quota_free(L);
}

int main(void) {
    zs_log_set_level(ZS_LOG_ERROR);
    test_rpm();
    test_streams();
    test_tpm();
    test_threads();
    return tu_finish("test-quota");
}
