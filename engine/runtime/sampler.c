/* sampler.c — token sampling (greedy, temperature, top_k, min_p, top_p) with a per-sampler
 * xoshiro256** generator, and log-softmax helpers for logprobs. See sampler.h.
 *
 * Cost per call for a vocabulary of n: one validation/argmax pass, one exp pass over the
 * candidates, and then
 *   - top_k: a size-k heap over n (O(n log k)) and a sort of the k survivors;
 *   - top_p without top_k: a histogram of the candidates by log-probability (buckets of 1/64
 *     nat) locates the bucket where the cumulative mass crosses top_p; everything before it is
 *     kept unsorted and only that one bucket is sorted. Many exactly equal logits at the
 *     crossing degrade to a sort of those (all equal: a full sort).
 *   - neither: inverse-CDF walk in id order, no sort. */
#include "sampler.h"

#include <math.h>
#include <string.h>

#include "common.h"

typedef struct {
    float logit;
    int id;
} zs_cand;

struct zs_sampler {
    zs_sampler_params p;
    int n;
    uint64_t rng[4];
    zs_cand *cand; /* n entries, scratch */
    double *w;     /* n entries, scratch: unnormalised probabilities exp((l - max) / T) */
};

/* ---------- parameters ---------- */

void zs_sampler_params_default(zs_sampler_params *p) {
    if (!p) return;
    memset(p, 0, sizeof *p);
    p->temperature = 1.0f;
    p->top_p = 1.0f;
    p->top_k = 0;
    p->seed = 0;
    p->min_p = 0.0f;
}

int zs_sampler_params_check(const zs_sampler_params *p) {
    if (!p) return zs_err(ZS_EINVAL, "sampler params: NULL");
    if (!isfinite(p->temperature))
        return zs_err(ZS_EINVAL, "temperature must be a number between 0 and 100");
    if (p->temperature < 0.0f || p->temperature > ZS_SAMPLER_MAX_TEMPERATURE)
        return zs_err(ZS_ERANGE, "temperature must be between 0 and 100 (got %g)",
                      (double)p->temperature);
    if (!isfinite(p->top_p))
        return zs_err(ZS_EINVAL, "top_p must be a number greater than 0 and at most 1");
    if (!(p->top_p > 0.0f) || p->top_p > 1.0f)
        return zs_err(ZS_ERANGE, "top_p must be greater than 0 and at most 1 (got %g)",
                      (double)p->top_p);
    if (p->top_k < 0) return zs_err(ZS_ERANGE, "top_k must be >= 0 (got %d)", p->top_k);
    if (!isfinite(p->min_p))
        return zs_err(ZS_EINVAL, "min_p must be a number >= 0 and < 1");
    if (p->min_p < 0.0f || p->min_p >= 1.0f)
        return zs_err(ZS_ERANGE, "min_p must be >= 0 and < 1 (got %g)", (double)p->min_p);
    return 0;
}

/* ---------- random numbers: splitmix64 seeding, xoshiro256** ---------- */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static inline uint64_t rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t xoshiro_next(uint64_t s[4]) {
    uint64_t result = rotl64(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl64(s[3], 45);
    return result;
}

/* Uniform in [0,1) with 53 random bits. */
static double rng_uniform(uint64_t s[4]) { return (double)(xoshiro_next(s) >> 11) * 0x1.0p-53; }

/* ---------- lifecycle ---------- */

int zs_sampler_new(const zs_sampler_params *p, int vocab_size, zs_sampler **out) {
    ZS_CHECK(zs_sampler_params_check(p));
    if (vocab_size <= 0) return zs_err(ZS_EINVAL, "vocab_size must be > 0 (got %d)", vocab_size);
    if (!out) return zs_err(ZS_EINVAL, "zs_sampler_new: out is NULL");
    size_t nc, nw;
    if (zs_mul_size((size_t)vocab_size, sizeof(zs_cand), &nc) ||
        zs_mul_size((size_t)vocab_size, sizeof(double), &nw))
        return zs_err(ZS_ERANGE, "vocab_size %d too large", vocab_size);
    zs_sampler *s = calloc(1, sizeof *s);
    if (!s) return zs_err(ZS_ENOMEM, "sampler: out of memory");
    s->cand = malloc(nc);
    s->w = malloc(nw);
    if (!s->cand || !s->w) {
        zs_sampler_free(s);
        return zs_err(ZS_ENOMEM, "sampler: out of memory for vocab_size %d", vocab_size);
    }
    s->p = *p;
    s->n = vocab_size;
    uint64_t x = p->seed;
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix64(&x);
    *out = s;
    return 0;
}

void zs_sampler_free(zs_sampler *s) {
    if (!s) return;
    free(s->cand);
    free(s->w);
    free(s);
}

/* ---------- helpers ---------- */

/* Canonical order: higher logit first, then lower id. */
static inline int cand_before(const zs_cand *a, const zs_cand *b) {
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static int cand_cmp(const void *pa, const void *pb) {
    const zs_cand *a = pa, *b = pb;
    if (cand_before(a, b)) return -1;
    if (cand_before(b, a)) return 1;
    return 0;
}

/* Validates n logits; returns the index of the first non-finite one, or -1. Fills *max and
 * *argmax (lowest id among ties). */
static int scan_logits(const float *l, int n, float *max, int *argmax) {
    float m = -INFINITY;
    int am = 0;
    for (int i = 0; i < n; i++) {
        float v = l[i];
        if (!isfinite(v)) return i;
        if (v > m) {
            m = v;
            am = i;
        }
    }
    *max = m;
    *argmax = am;
    return -1;
}

/* log(sum exp(l - max)): terms in float (each within an ulp or two; expf is much faster than
 * exp), accumulated in double. */
static double log_sum_exp_shifted(const float *l, int n, float max) {
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += (double)expf(l[i] - max);
    return log(sum);
}

/* Unnormalised probability of a logit after temperature: exp((l - max) / T), max weight 1. */
static inline double cand_weight(float logit, float max, double inv_t) {
    return (double)expf((float)(((double)logit - (double)max) * inv_t));
}

/* Min-heap keyed on the canonical order: the root is the worst kept candidate. */
static void heap_sift_down(zs_cand *h, int n, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, worst = i;
        if (l < n && cand_before(&h[worst], &h[l])) worst = l;
        if (r < n && cand_before(&h[worst], &h[r])) worst = r;
        if (worst == i) return;
        zs_cand t = h[i];
        h[i] = h[worst];
        h[worst] = t;
        i = worst;
    }
}

static void heap_sift_up(zs_cand *h, int i) {
    while (i > 0) {
        int parent = (i - 1) / 2;
        if (!cand_before(&h[parent], &h[i])) return;
        zs_cand t = h[i];
        h[i] = h[parent];
        h[parent] = t;
        i = parent;
    }
}

/* The k best of n logits into c[0..k), sorted in canonical order. */
static void select_top_k(const float *l, int n, int k, zs_cand *c) {
    int m = 0;
    for (int i = 0; i < n; i++) {
        zs_cand x = {l[i], i};
        if (m < k) {
            c[m] = x;
            heap_sift_up(c, m);
            m++;
        } else if (cand_before(&x, &c[0])) {
            c[0] = x;
            heap_sift_down(c, m, 0);
        }
    }
    qsort(c, (size_t)m, sizeof *c, cand_cmp);
}

#define ZS_TOPP_BUCKETS 2048
#define ZS_TOPP_SCALE 64.0 /* buckets per nat; 2048/64 = 32 nats, the rest share the last */

static inline int topp_bucket(float max, float logit, double inv_t) {
    double b = ((double)max - (double)logit) * inv_t * ZS_TOPP_SCALE;
    return b >= (double)(ZS_TOPP_BUCKETS - 1) ? ZS_TOPP_BUCKETS - 1 : (int)b;
}

static inline void cand_swap(zs_cand *c, double *w, int i, int j) {
    zs_cand tc = c[i];
    c[i] = c[j];
    c[j] = tc;
    double tw = w[i];
    w[i] = w[j];
    w[j] = tw;
}

/* Keeps the minimal prefix (canonical order) of the m candidates c/w whose mass reaches
 * top_p of their total. c/w are in canonical order when `sorted`; otherwise the candidates are
 * bucketed by log-probability: buckets wholly before the crossing bucket are kept as they are
 * (every member precedes every later candidate in canonical order), and only the crossing
 * bucket is sorted to find where the prefix ends. Returns the kept count; the kept candidates
 * are c[0..kept) with weights w[0..kept). */
static int apply_top_p(zs_cand *c, double *w, int m, int sorted, float max, double inv_t,
                       double top_p) {
    double total = 0.0;
    for (int j = 0; j < m; j++) total += w[j];
    const double target = top_p * total;
    int a = 0, e = m; /* c[0..a): kept whole; c[a..a+e): sorted, prefix to be chosen */
    if (!sorted) {
        double mass[ZS_TOPP_BUCKETS] = {0};
        for (int j = 0; j < m; j++) mass[topp_bucket(max, c[j].logit, inv_t)] += w[j];
        int bstar = ZS_TOPP_BUCKETS - 1;
        double cum = 0.0;
        for (int b = 0; b < ZS_TOPP_BUCKETS; b++) {
            cum += mass[b];
            if (cum >= target) {
                bstar = b;
                break;
            }
        }
        for (int j = 0; j < m; j++)
            if (topp_bucket(max, c[j].logit, inv_t) < bstar) cand_swap(c, w, a++, j);
        int end = a;
        for (int j = a; j < m; j++)
            if (topp_bucket(max, c[j].logit, inv_t) == bstar) cand_swap(c, w, end++, j);
        e = end - a;
        qsort(c + a, (size_t)e, sizeof *c, cand_cmp);
        for (int j = a; j < end; j++) w[j] = cand_weight(c[j].logit, max, inv_t);
    }
    double cum = 0.0;
    for (int j = 0; j < a; j++) cum += w[j];
    for (int j = a; j < a + e; j++) {
        cum += w[j];
        if (cum >= target) return j + 1;
    }
    return a + e; /* rounding: keep everything collected */
}

/* ---------- sampling ---------- */

/* The candidates the draw is made from: c[0..m) with unnormalised weights w[0..m) after
 * temperature, top_k, min_p and top_p (in that order); *lse gets log(sum exp(l - max)) when the
 * pass yields it for free (else NAN). Only for temperature > 0 and top_k != 1. */
static int kept_candidates(zs_sampler *s, const float *logits, float max, double *lse) {
    const zs_sampler_params *p = &s->p;
    const int n = s->n;
    const double inv_t = 1.0 / (double)p->temperature;
    zs_cand *c = s->cand;
    double *w = s->w;
    int m, sorted;
    *lse = NAN;
    if (p->top_k > 0 && p->top_k < n) {
        select_top_k(logits, n, p->top_k, c);
        m = p->top_k;
        sorted = 1;
    } else {
        for (int i = 0; i < n; i++) {
            c[i].logit = logits[i];
            c[i].id = i;
        }
        m = n;
        sorted = 0;
    }
    double sum = 0.0;
    for (int j = 0; j < m; j++) {
        w[j] = cand_weight(c[j].logit, max, inv_t);
        sum += w[j];
    }
    if (m == n && p->temperature == 1.0f) *lse = log(sum);

    if (p->min_p > 0.0f) { /* max weight is exactly 1, so the cut is min_p itself */
        const double cut = (double)p->min_p;
        int k = 0;
        for (int j = 0; j < m; j++) {
            if (w[j] >= cut) {
                c[k] = c[j];
                w[k] = w[j];
                k++;
            }
        }
        m = k; /* k >= 1: the maximum (w == 1) always stays */
    }
    if (p->top_p < 1.0f) m = apply_top_p(c, w, m, sorted, max, inv_t, (double)p->top_p);
    return m;
}

/* 1 when id is one of skip[0..n) */
static inline int skipped(int id, const int *skip, int n) {
    for (int i = 0; i < n; i++)
        if (skip[i] == id) return 1;
    return 0;
}

/* The candidate that the inverse-CDF walk of u in [0, 1) lands on, skipping the ids skip[0..n_skip). */
static int draw(const zs_sampler *s, int m, double u, const int *skip, int n_skip, int argmax) {
    const zs_cand *c = s->cand;
    const double *w = s->w;
    double total = 0.0;
    for (int j = 0; j < m; j++)
        if (!skipped(c[j].id, skip, n_skip)) total += w[j];
    const double r = u * total;
    double cum = 0.0;
    int last_pos = -1;
    for (int j = 0; j < m; j++) {
        if (w[j] <= 0.0 || skipped(c[j].id, skip, n_skip)) continue;
        cum += w[j];
        last_pos = j;
        if (r < cum) return c[j].id;
    }
    return last_pos >= 0 ? c[last_pos].id : argmax; /* rounding at the end */
}

static int check_call(const zs_sampler *s, const float *logits, const int *token, const char *who) {
    if (!s) return zs_err(ZS_EINVAL, "%s: sampler is NULL", who);
    if (!logits) return zs_err(ZS_EINVAL, "%s: logits is NULL", who);
    if (!token) return zs_err(ZS_EINVAL, "%s: token is NULL", who);
    return 0;
}

static void set_logprob(const zs_sampler *s, const float *logits, float max, double lse, int tok, float *logprob) {
    if (!logprob) return;
    if (isnan(lse)) lse = log_sum_exp_shifted(logits, s->n, max);
    *logprob = (float)((double)logits[tok] - (double)max - lse);
}

static int greedy(const zs_sampler *s) { return !(s->p.temperature > 0.0f && s->p.top_k != 1); }

int zs_sampler_sample(zs_sampler *s, const float *logits, int *token, float *logprob) {
    ZS_CHECK(check_call(s, logits, token, "zs_sampler_sample"));
    float max = 0.0f;
    int argmax = 0;
    int bad = scan_logits(logits, s->n, &max, &argmax);
    if (bad >= 0)
        return zs_err(ZS_EINVAL, "logits[%d] is not finite (%g)", bad, (double)logits[bad]);

    const double u = rng_uniform(s->rng); /* exactly one draw per successful call */
    int tok = argmax;
    double lse = NAN; /* log(sum exp(l - max)) when a pass below yields it for free */
    if (!greedy(s)) {
        int m = kept_candidates(s, logits, max, &lse);
        tok = draw(s, m, u, NULL, 0, argmax);
    }
    set_logprob(s, logits, max, lse, tok, logprob);
    *token = tok;
    return 0;
}

int zs_sampler_verify(zs_sampler *s, const float *logits, int draft, int *token, int *accepted, float *logprob) {
    if (!accepted) return zs_err(ZS_EINVAL, "zs_sampler_verify: accepted is NULL");
    int which = -1;
    ZS_CHECK(zs_sampler_verify_multi(s, logits, &draft, 1, token, &which, logprob));
    *accepted = which == 0;
    return 0;
}

int zs_sampler_verify_multi(zs_sampler *s, const float *logits, const int *drafts, int n, int *token, int *which,
                            float *logprob) {
    ZS_CHECK(check_call(s, logits, token, "zs_sampler_verify"));
    if (!which) return zs_err(ZS_EINVAL, "zs_sampler_verify: which is NULL");
    if (n < 1 || n > ZS_SAMPLER_MAX_DRAFTS || !drafts)
        return zs_err(ZS_ERANGE, "zs_sampler_verify: %d drafts (1 to %d)", n, ZS_SAMPLER_MAX_DRAFTS);
    for (int i = 0; i < n; i++)
        if (drafts[i] < 0 || drafts[i] >= s->n) return zs_err(ZS_ERANGE, "draft token %d is out of the vocabulary", drafts[i]);
    *which = -1;
    if (greedy(s)) { /* the argmax with plain decoding's one draw: its bits and its generator */
        ZS_CHECK(zs_sampler_sample(s, logits, token, logprob));
        for (int i = 0; i < n && *which < 0; i++)
            if (drafts[i] == *token) *which = i;
        return 0;
    }
    float max = 0.0f;
    int argmax = 0;
    int bad = scan_logits(logits, s->n, &max, &argmax);
    if (bad >= 0)
        return zs_err(ZS_EINVAL, "logits[%d] is not finite (%g)", bad, (double)logits[bad]);
    double lse = NAN;
    int m = kept_candidates(s, logits, max, &lse);
    double total = 0.0, pd[ZS_SAMPLER_MAX_DRAFTS] = {0}, rest = 0.0;
    for (int j = 0; j < m; j++) {
        total += s->w[j];
        int hit = 0;
        for (int i = 0; i < n; i++)
            if (s->cand[j].id == drafts[i]) {
                hit = 1;
                for (int k = 0; k < i; k++) hit &= drafts[k] != drafts[i]; /* a repeated draft: its first place */
                if (hit) pd[i] = s->w[j];
                break;
            }
        if (!hit) rest += s->w[j];
    }
    for (int i = 1; i < n; i++) /* a repeated draft has no mass left when its second turn comes */
        for (int k = 0; k < i; k++)
            if (drafts[k] == drafts[i]) pd[i] = 0.0;
    /* each q is a point mass on its draft: accept draft i with probability p_i(draft i), p_i being p
     * with drafts 0..i-1 taken out, renormalised; when all fail, draw from p without any of them */
    int tok = -1;
    double left = total;
    for (int i = 0; i < n && tok < 0; i++) {
        if (rng_uniform(s->rng) < pd[i] / left) {
            tok = drafts[i];
            *which = i;
        }
        left -= pd[i];
    }
    if (tok < 0) {
        if (rest > 0.0) {
            tok = draw(s, m, rng_uniform(s->rng), drafts, n, argmax);
        } else { /* rounding: the drafts held all the mass; the last one with some takes it */
            for (int i = n - 1; i >= 0 && tok < 0; i--)
                if (pd[i] > 0.0) {
                    tok = drafts[i];
                    *which = i;
                }
            if (tok < 0) tok = draw(s, m, rng_uniform(s->rng), NULL, 0, argmax);
        }
    }
    set_logprob(s, logits, max, lse, tok, logprob);
    *token = tok;
    return 0;
}

int zs_sampler_top_logprobs(const float *logits, int vocab_size, int k, int *ids,
                            float *logprobs) {
    if (!logits) return zs_err(ZS_EINVAL, "top_logprobs: logits is NULL");
    if (vocab_size <= 0)
        return zs_err(ZS_EINVAL, "top_logprobs: vocab_size must be > 0 (got %d)", vocab_size);
    if (k < 0 || k > ZS_SAMPLER_MAX_TOP_LOGPROBS)
        return zs_err(ZS_ERANGE, "top_logprobs must be between 0 and %d (got %d)",
                      ZS_SAMPLER_MAX_TOP_LOGPROBS, k);
    if (k > vocab_size)
        return zs_err(ZS_ERANGE, "top_logprobs %d exceeds the vocabulary size %d", k,
                      vocab_size);
    if (k > 0 && (!ids || !logprobs))
        return zs_err(ZS_EINVAL, "top_logprobs: ids/logprobs is NULL");
    float max = 0.0f;
    int argmax = 0;
    int bad = scan_logits(logits, vocab_size, &max, &argmax);
    if (bad >= 0)
        return zs_err(ZS_EINVAL, "logits[%d] is not finite (%g)", bad, (double)logits[bad]);
    if (k == 0) return 0;

    /* Insertion into a sorted array of at most 20: scanning in id order and inserting only
     * when strictly better than the current last keeps ties ordered by lower id. */
    zs_cand best[ZS_SAMPLER_MAX_TOP_LOGPROBS];
    int m = 0;
    for (int i = 0; i < vocab_size; i++) {
        zs_cand x = {logits[i], i};
        if (m == k && !cand_before(&x, &best[m - 1])) continue;
        int j = m < k ? m++ : k - 1;
        while (j > 0 && cand_before(&x, &best[j - 1])) {
            best[j] = best[j - 1];
            j--;
        }
        best[j] = x;
    }
    double lse = log_sum_exp_shifted(logits, vocab_size, max);
    for (int j = 0; j < k; j++) {
        ids[j] = best[j].id;
        logprobs[j] = (float)((double)best[j].logit - (double)max - lse);
    }
    return 0;
}
