/* optim.c — AdamW on fp32 master shards, LR schedules and gradient-clipping helpers (optim.h).
 *
 * The update kernel has three bodies: AVX (chosen at first use on CPUs that have it), SSE2 (the
 * x86-64 baseline) and a scalar loop (other architectures, or env ZS_OPTIM_SCALAR=1). None uses
 * FMA, and all follow adam_one's order of operations, so every element goes through the same
 * correctly rounded IEEE operations whatever the path: results are bit-identical across paths
 * and thread counts. */
#include "optim.h"

#include <math.h>
#include <string.h>

#include "common.h"
#include "pool.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define ZS_OPT_X86 1
#endif

/* ---------- AdamW ---------- */

void zs_adamw_params_default(zs_adamw_params *p) {
    p->lr = 1e-3f;
    p->beta1 = 0.9f;
    p->beta2 = 0.999f;
    p->eps = 1e-8f;
    p->weight_decay = 0.01f;
}

int zs_adamw_params_from_opts(const zs_zero_opts *o, zs_adamw_params *p) {
    zs_adamw_params d;
    zs_adamw_params_default(&d);
    if (!isnan(o->lr)) d.lr = o->lr;
    if (!isnan(o->beta1)) d.beta1 = o->beta1;
    if (!isnan(o->beta2)) d.beta2 = o->beta2;
    if (!isnan(o->eps)) d.eps = o->eps;
    if (!isnan(o->weight_decay)) d.weight_decay = o->weight_decay;
    *p = d;
    return 0;
}

typedef struct {
    float b1, omb1, b2, omb2; /* beta1, 1-beta1, beta2, 1-beta2 */
    float keep;               /* 1 - lr*wd (1 without decay) */
    float step;               /* lr / c1 */
    float c2s;                /* sqrt(c2) */
    float eps;
} adam_consts;

/* One element: the reference order of operations that every path below follows. */
static inline void adam_one(float *p, float *m, float *v, float g, const adam_consts *k) {
    float mi = k->b1 * *m + k->omb1 * g;
    float vi = k->b2 * *v + k->omb2 * (g * g);
    float den = sqrtf(vi) / k->c2s + k->eps;
    *m = mi;
    *v = vi;
    *p = *p * k->keep - k->step * (mi / den);
}

#ifdef ZS_OPT_X86
/* AVX (not FMA: every product and sum is rounded on its own, as in adam_one). */
__attribute__((target("avx"))) static void adam_avx(float *restrict p, float *restrict m,
                                                    float *restrict v, const float *restrict g,
                                                    size_t n, const adam_consts *k) {
    const __m256 b1 = _mm256_set1_ps(k->b1), omb1 = _mm256_set1_ps(k->omb1);
    const __m256 b2 = _mm256_set1_ps(k->b2), omb2 = _mm256_set1_ps(k->omb2);
    const __m256 keep = _mm256_set1_ps(k->keep), step = _mm256_set1_ps(k->step);
    const __m256 c2s = _mm256_set1_ps(k->c2s), eps = _mm256_set1_ps(k->eps);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 gi = _mm256_loadu_ps(g + i);
        __m256 mi = _mm256_add_ps(_mm256_mul_ps(b1, _mm256_loadu_ps(m + i)), _mm256_mul_ps(omb1, gi));
        __m256 vi = _mm256_add_ps(_mm256_mul_ps(b2, _mm256_loadu_ps(v + i)),
                                  _mm256_mul_ps(omb2, _mm256_mul_ps(gi, gi)));
        __m256 den = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), c2s), eps);
        __m256 pi = _mm256_sub_ps(_mm256_mul_ps(_mm256_loadu_ps(p + i), keep),
                                  _mm256_mul_ps(step, _mm256_div_ps(mi, den)));
        _mm256_storeu_ps(m + i, mi);
        _mm256_storeu_ps(v + i, vi);
        _mm256_storeu_ps(p + i, pi);
    }
    for (; i < n; i++) adam_one(p + i, m + i, v + i, g[i], k);
}

/* SSE2 (the x86-64 baseline). */
static void adam_sse(float *restrict p, float *restrict m, float *restrict v,
                     const float *restrict g, size_t n, const adam_consts *k) {
    const __m128 b1 = _mm_set1_ps(k->b1), omb1 = _mm_set1_ps(k->omb1);
    const __m128 b2 = _mm_set1_ps(k->b2), omb2 = _mm_set1_ps(k->omb2);
    const __m128 keep = _mm_set1_ps(k->keep), step = _mm_set1_ps(k->step);
    const __m128 c2s = _mm_set1_ps(k->c2s), eps = _mm_set1_ps(k->eps);
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        __m128 gi = _mm_loadu_ps(g + i);
        __m128 mi = _mm_add_ps(_mm_mul_ps(b1, _mm_loadu_ps(m + i)), _mm_mul_ps(omb1, gi));
        __m128 vi = _mm_add_ps(_mm_mul_ps(b2, _mm_loadu_ps(v + i)), _mm_mul_ps(omb2, _mm_mul_ps(gi, gi)));
        __m128 den = _mm_add_ps(_mm_div_ps(_mm_sqrt_ps(vi), c2s), eps);
        __m128 pi = _mm_sub_ps(_mm_mul_ps(_mm_loadu_ps(p + i), keep), _mm_mul_ps(step, _mm_div_ps(mi, den)));
        _mm_storeu_ps(m + i, mi);
        _mm_storeu_ps(v + i, vi);
        _mm_storeu_ps(p + i, pi);
    }
    for (; i < n; i++) adam_one(p + i, m + i, v + i, g[i], k);
}
#endif

typedef void (*adam_fn)(float *restrict, float *restrict, float *restrict, const float *restrict,
                        size_t, const adam_consts *);

static void adam_plain(float *restrict p, float *restrict m, float *restrict v,
                       const float *restrict g, size_t n, const adam_consts *k) {
    for (size_t i = 0; i < n; i++) adam_one(p + i, m + i, v + i, g[i], k);
}

static adam_fn adam_pick(void) {
    static adam_fn fn; /* benign race: every thread computes the same value */
    adam_fn f = __atomic_load_n(&fn, __ATOMIC_RELAXED);
    if (f) return f;
#ifdef ZS_OPT_X86
    f = getenv("ZS_OPTIM_SCALAR") ? adam_plain : __builtin_cpu_supports("avx") ? adam_avx : adam_sse;
#else
    f = adam_plain;
#endif
    __atomic_store_n(&fn, f, __ATOMIC_RELAXED);
    return f;
}

typedef struct {
    float *p, *m, *v;
    const float *g;
    size_t n;
    adam_consts k;
    void *out;
    zs_dtype odt;
} adam_job;

/* Pieces small enough that the converted copy reads the just-written master from L1/L2. */
#define ADAM_PIECE 4096

static void adam_task(void *arg, int task) {
    const adam_job *j = arg;
    size_t lo = (size_t)task * ZS_ADAMW_CHUNK;
    size_t hi = ZS_MIN(lo + ZS_ADAMW_CHUNK, j->n);
    size_t es = zs_dtype_size(j->odt);
    adam_fn kern = adam_pick();
    for (size_t a = lo; a < hi; a += ADAM_PIECE) {
        size_t len = ZS_MIN((size_t)ADAM_PIECE, hi - a);
        kern(j->p + a, j->m + a, j->v + a, j->g + a, len, &j->k);
        if (j->out && !(j->odt == ZS_F32 && j->out == (void *)j->p))
            zs_convert((char *)j->out + a * es, j->odt, j->p + a, ZS_F32, len);
    }
}

int zs_adamw_update(float *master, float *m, float *v, const float *grad, size_t n,
                    const zs_adamw_params *p, float lr, long t, int decay, void *out,
                    zs_dtype out_dtype) {
    if (!p) return zs_err(ZS_EINVAL, "adamw: no parameters");
    if (t < 1) return zs_err(ZS_EINVAL, "adamw: step %ld: steps count from 1", t);
    if (!(p->beta1 >= 0 && p->beta1 < 1) || !(p->beta2 >= 0 && p->beta2 < 1))
        return zs_err(ZS_EINVAL, "adamw: betas (%g, %g) must be in [0, 1)", (double)p->beta1,
                      (double)p->beta2);
    if (!(p->eps > 0) || !isfinite(p->eps))
        return zs_err(ZS_EINVAL, "adamw: eps %g must be a finite number > 0", (double)p->eps);
    if (!(p->weight_decay >= 0) || !isfinite(p->weight_decay))
        return zs_err(ZS_EINVAL, "adamw: weight_decay %g must be >= 0", (double)p->weight_decay);
    if (!isfinite(lr) || lr < 0) return zs_err(ZS_EINVAL, "adamw: lr %g must be >= 0", (double)lr);
    if (out && (unsigned)out_dtype >= ZS_DTYPE_ELEM_COUNT)
        return zs_err(ZS_EINVAL, "adamw: bad output dtype %d", (int)out_dtype);
    if (n == 0) return 0;
    if (!master || !m || !v || !grad) return zs_err(ZS_EINVAL, "adamw: NULL array");

    double c1 = 1.0 - pow((double)p->beta1, (double)t);
    double c2 = 1.0 - pow((double)p->beta2, (double)t);
    adam_job j = {.p = master, .m = m, .v = v, .g = grad, .n = n, .out = out, .odt = out_dtype};
    j.k.b1 = p->beta1;
    j.k.omb1 = (float)(1.0 - (double)p->beta1);
    j.k.b2 = p->beta2;
    j.k.omb2 = (float)(1.0 - (double)p->beta2);
    j.k.keep = decay ? (float)(1.0 - (double)lr * (double)p->weight_decay) : 1.0f;
    j.k.step = (float)((double)lr / c1);
    j.k.c2s = (float)sqrt(c2);
    j.k.eps = p->eps;
    size_t tasks = (n + ZS_ADAMW_CHUNK - 1) / ZS_ADAMW_CHUNK;
    /* more than INT_MAX chunks (7e13 elements) cannot happen on a real machine; split anyway */
    for (size_t done = 0; done < tasks;) {
        size_t now = ZS_MIN(tasks - done, (size_t)1 << 30);
        adam_job jj = j;
        size_t off = done * ZS_ADAMW_CHUNK;
        jj.p += off; jj.m += off; jj.v += off; jj.g += off;
        jj.n = ZS_MIN(n - off, now * ZS_ADAMW_CHUNK);
        if (out) jj.out = (char *)out + off * zs_dtype_size(out_dtype);
        zs_pool_run(adam_task, &jj, (int)now);
        done += now;
    }
    return 0;
}

/* ---------- learning-rate schedule ---------- */

float zs_lr_at(const zs_lr_schedule *s, long step) {
    double L = s->lr, a = s->warmup_min_ratio, b = s->min_lr_ratio;
    long k = step < 1 ? 0 : step - 1;
    long W = s->warmup_steps > 0 ? s->warmup_steps : 0, T = s->total_steps;
    if (k < W) {
        double g = s->warmup_type == ZS_WARMUP_LOG ? log((double)k + 1) / log((double)ZS_MAX(W, 2))
                                                   : (double)k / (double)W;
        return (float)(L * (a + (1 - a) * g));
    }
    switch (s->type) {
    case ZS_LR_WARMUP_LINEAR: {
        double g = (double)(T - k) / (double)ZS_MAX(1, T - W);
        if (g < 0) g = 0;
        return (float)(L * (b + (1 - b) * g));
    }
    case ZS_LR_WARMUP_COSINE: {
        if (T <= W) return (float)(L * b);
        long j = ZS_MIN(k - W + 1, T - W);
        double g = (1 + cos(M_PI * (double)j / (double)(T - W))) / 2;
        return (float)(L * (b + (1 - b) * g));
    }
    default: return (float)L;
    }
}

int zs_lr_schedule_from_opts(const zs_zero_opts *o, zs_lr_schedule *out) {
    zs_lr_schedule s = {.type = ZS_LR_CONSTANT, .warmup_type = ZS_WARMUP_LOG, .lr = 1e-3f};
    if (o->lr_schedule < 0) {
        if (!isnan(o->lr)) s.lr = o->lr;
        s.warmup_steps = 0;
        *out = s;
        return 0;
    }
    s.type = o->lr_schedule;
    if (s.type != ZS_LR_CONSTANT && s.type != ZS_LR_WARMUP_LINEAR && s.type != ZS_LR_WARMUP_COSINE)
        return zs_err(ZS_EINVAL, "scheduler.type: unknown schedule %d", s.type);
    if (o->warmup_type >= 0) s.warmup_type = o->warmup_type;
    s.warmup_steps = o->warmup_steps >= 0 ? o->warmup_steps : 1000;
    s.total_steps = o->total_steps;
    if (s.type == ZS_LR_WARMUP_COSINE) {
        if (!isnan(o->lr)) s.lr = o->lr;
        s.warmup_min_ratio = isnan(o->warmup_min_ratio) ? 0.0f : o->warmup_min_ratio;
        s.min_lr_ratio = isnan(o->cos_min_ratio) ? 1e-4f : o->cos_min_ratio;
    } else {
        double mx = isnan(o->warmup_max_lr) ? 1e-3 : o->warmup_max_lr;
        double mn = isnan(o->warmup_min_lr) ? 0.0 : o->warmup_min_lr;
        s.lr = (float)mx;
        s.warmup_min_ratio = mx > 0 ? (float)(mn / mx) : 0.0f;
        s.min_lr_ratio = s.warmup_min_ratio;
    }
    if (s.type != ZS_LR_CONSTANT) {
        if (s.total_steps < 1)
            return zs_err(ZS_EINVAL, "scheduler.params.total_num_steps: required by %s",
                          s.type == ZS_LR_WARMUP_LINEAR ? "WarmupDecayLR" : "WarmupCosineLR");
        if (s.total_steps < s.warmup_steps)
            return zs_err(ZS_EINVAL, "scheduler.params.total_num_steps: must be at least "
                          "warmup_num_steps (%d), got %d", s.warmup_steps, s.total_steps);
    } else {
        s.total_steps = 0;
    }
    *out = s;
    return 0;
}

/* ---------- clipping ---------- */

#define SS_CHUNK 65536  /* elements per partial sum */
#define SS_ROUND 1024   /* partial sums per pool job */

typedef struct {
    const float *g;
    size_t n;
    double part[SS_ROUND];
} ss_job;

static double sumsq_chunk(const float *x, size_t n) {
    double acc[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) acc[l] += (double)x[i + l] * (double)x[i + l];
    for (int l = 0; i < n; i++, l++) acc[l] += (double)x[i] * (double)x[i];
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

static void ss_task(void *arg, int task) {
    ss_job *j = arg;
    size_t lo = (size_t)task * SS_CHUNK;
    j->part[task] = sumsq_chunk(j->g + lo, ZS_MIN((size_t)SS_CHUNK, j->n - lo));
}

double zs_sumsq(const float *g, size_t n) {
    if (n == 0) return 0;
    if (n <= SS_CHUNK) return sumsq_chunk(g, n);
    ss_job *j = malloc(sizeof *j);
    double total = 0;
    size_t chunks = (n + SS_CHUNK - 1) / SS_CHUNK;
    for (size_t c0 = 0; c0 < chunks; c0 += SS_ROUND) {
        size_t now = ZS_MIN((size_t)SS_ROUND, chunks - c0);
        size_t off = c0 * SS_CHUNK;
        if (j) {
            j->g = g + off;
            j->n = ZS_MIN(n - off, now * SS_CHUNK);
            zs_pool_run(ss_task, j, (int)now);
            for (size_t c = 0; c < now; c++) total += j->part[c];
        } else { /* no memory for the partials: the same sums, on this thread */
            for (size_t c = 0; c < now; c++) {
                size_t lo = off + c * SS_CHUNK;
                total += sumsq_chunk(g + lo, ZS_MIN((size_t)SS_CHUNK, n - lo));
            }
        }
    }
    free(j);
    return total;
}

typedef struct {
    float *g;
    size_t n;
    float s;
} scale_job;

static void scale_task(void *arg, int task) {
    const scale_job *j = arg;
    size_t lo = (size_t)task * SS_CHUNK, hi = ZS_MIN(lo + SS_CHUNK, j->n);
    float s = j->s;
    for (size_t i = lo; i < hi; i++) j->g[i] *= s;
}

void zs_scale(float *g, size_t n, float s) {
    size_t chunks = (n + SS_CHUNK - 1) / SS_CHUNK;
    for (size_t c0 = 0; c0 < chunks; c0 += (size_t)1 << 30) {
        size_t now = ZS_MIN(chunks - c0, (size_t)1 << 30);
        scale_job j = {g + c0 * SS_CHUNK, ZS_MIN(n - c0 * SS_CHUNK, now * SS_CHUNK), s};
        zs_pool_run(scale_task, &j, (int)now);
    }
}

float zs_clip_coef(double sumsq, float max_norm) {
    if (!(max_norm > 0)) return 1.0f;
    if (!isfinite(sumsq)) return NAN;
    double c = (double)max_norm / (sqrt(sumsq) + 1e-6);
    return c < 1 ? (float)c : 1.0f;
}
