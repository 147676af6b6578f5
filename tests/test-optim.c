/* test-optim.c — the optimizer (engine/optim.h): AdamW against a double-precision reference over
 * 10 steps, bit-exactness against a plain float loop with the documented operation order, the
 * same bits with one thread and the scalar path (a child run of this program with ZS_THREADS=1
 * ZS_OPTIM_SCALAR=1), weight decay on/off, bias correction, the storage-dtype copy, argument
 * errors, the LR schedules at chosen steps, the DeepSpeed-config mapping, and the clipping
 * helpers (deterministic sum of squares, scale, clip factor). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common.h"
#include "dsconfig.h"
#include "optim.h"
#include "pool.h"
#include "tensor.h"
#include "testutil.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float frand(void) { /* uniform in [-1, 1) */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((double)(rng_state >> 11) / 9007199254740992.0 * 2 - 1);
}

static float *falloc(size_t n) {
    float *p = calloc(n ? n : 1, sizeof(float));
    if (!p) { fprintf(stderr, "out of memory\n"); exit(1); }
    return p;
}

/* The documented float order (optim.h), written out independently of optim.c. */
static void ref_float(float *p, float *m, float *v, const float *g, size_t n,
                      const zs_adamw_params *a, float lr, long t, int decay) {
    double c1 = 1.0 - pow((double)a->beta1, (double)t), c2 = 1.0 - pow((double)a->beta2, (double)t);
    float keep = decay ? (float)(1.0 - (double)lr * (double)a->weight_decay) : 1.0f;
    float step = (float)((double)lr / c1), c2s = (float)sqrt(c2);
    float omb1 = (float)(1.0 - (double)a->beta1), omb2 = (float)(1.0 - (double)a->beta2);
    for (size_t i = 0; i < n; i++) {
        float mi = a->beta1 * m[i] + omb1 * g[i];
        float vi = a->beta2 * v[i] + omb2 * (g[i] * g[i]);
        float den = sqrtf(vi) / c2s + a->eps;
        m[i] = mi;
        v[i] = vi;
        p[i] = p[i] * keep - step * (mi / den);
    }
}

/* The textbook AdamW in double. */
static void ref_double(double *p, double *m, double *v, const float *g, size_t n,
                       const zs_adamw_params *a, double lr, long t, int decay) {
    double b1 = a->beta1, b2 = a->beta2;
    for (size_t i = 0; i < n; i++) {
        if (decay) p[i] -= lr * a->weight_decay * p[i];
        m[i] = b1 * m[i] + (1 - b1) * g[i];
        v[i] = b2 * v[i] + (1 - b2) * (double)g[i] * g[i];
        double mh = m[i] / (1 - pow(b1, (double)t)), vh = v[i] / (1 - pow(b2, (double)t));
        p[i] -= lr * mh / (sqrt(vh) + a->eps);
    }
}

/* 10 steps of AdamW on n elements with a fixed seed; returns XXH-like fold of the bits. */
static uint64_t run_fixed(size_t n, float **pm, float **mm, float **vm) {
    rng_state = 12345;
    float *p = falloc(n), *m = falloc(n), *v = falloc(n), *g = falloc(n);
    for (size_t i = 0; i < n; i++) p[i] = frand();
    zs_adamw_params a;
    zs_adamw_params_default(&a);
    for (long t = 1; t <= 10; t++) {
        for (size_t i = 0; i < n; i++) g[i] = frand() * 0.1f;
        if (zs_adamw_update(p, m, v, g, n, &a, 1e-2f, t, 1, NULL, ZS_F32) != 0) exit(2);
    }
    uint64_t h = 1469598103934665603ull;
    const float *arr[3] = {p, m, v};
    for (int k = 0; k < 3; k++)
        for (size_t i = 0; i < n; i++) {
            uint32_t u;
            memcpy(&u, &arr[k][i], 4);
            h = (h ^ u) * 1099511628211ull;
        }
    double ss = zs_sumsq(g, n);
    uint64_t su;
    memcpy(&su, &ss, 8);
    h = (h ^ su) * 1099511628211ull;
    free(g);
    if (pm) { *pm = p; *mm = m; *vm = v; } else { free(p); free(m); free(v); }
    return h;
}

#define FIXED_N ((size_t)ZS_ADAMW_CHUNK * 5 + 1237)

static void test_adamw_reference(void) {
    size_t n = (size_t)ZS_ADAMW_CHUNK * 3 + 77; /* several chunks, a ragged tail */
    zs_adamw_params a;
    zs_adamw_params_default(&a);
    a.weight_decay = 0.1f;
    for (int decay = 0; decay <= 1; decay++) {
        rng_state = 777 + (uint64_t)decay;
        float *p = falloc(n), *m = falloc(n), *v = falloc(n), *g = falloc(n);
        float *pf = falloc(n), *mf = falloc(n), *vf = falloc(n);
        double *pd = calloc(n, sizeof(double)), *md = calloc(n, sizeof(double)),
               *vd = calloc(n, sizeof(double));
        for (size_t i = 0; i < n; i++) pf[i] = p[i] = frand(), pd[i] = p[i];
        double worst = 0;
        int exact = 1;
        for (long t = 1; t <= 10; t++) {
            float lr = 1e-3f * (float)t; /* changing LR, as a schedule would */
            for (size_t i = 0; i < n; i++) g[i] = frand() * (i % 7 == 0 ? 1e-4f : 0.3f);
            int rc = zs_adamw_update(p, m, v, g, n, &a, lr, t, decay, NULL, ZS_F32);
            CHECK(rc == 0, "update: %s", zs_errmsg());
            ref_float(pf, mf, vf, g, n, &a, lr, t, decay);
            ref_double(pd, md, vd, g, n, &a, lr, t, decay);
            if (memcmp(p, pf, n * 4) || memcmp(m, mf, n * 4) || memcmp(v, vf, n * 4)) exact = 0;
            for (size_t i = 0; i < n; i++) {
                double e = fabs(p[i] - pd[i]);
                if (e > worst) worst = e;
            }
        }
        CHECK(exact, "decay %d: zs_adamw_update differs from the documented float order", decay);
        CHECK(worst < 1e-6, "decay %d: worst abs error vs double reference %.3g", decay, worst);
        fprintf(stderr, "adamw decay=%d: bit-exact vs float loop: %s; worst abs err vs double %.3g (|p| <= 1.06)\n",
                decay, exact ? "yes" : "NO", worst);
        free(p); free(m); free(v); free(g); free(pf); free(mf); free(vf);
        free(pd); free(md); free(vd);
    }
}

static void test_adamw_cases(void) {
    zs_adamw_params a;
    zs_adamw_params_default(&a);
    CHECK(a.lr == 1e-3f && a.beta1 == 0.9f && a.beta2 == 0.999f && a.eps == 1e-8f &&
          a.weight_decay == 0.01f, "torch defaults");
    /* bias correction: the first step from zero moments moves each weight by ~lr*sign(g) */
    enum { N = 1000 };
    float p[N], m[N], v[N], g[N];
    for (int i = 0; i < N; i++) { p[i] = 1; m[i] = v[i] = 0; g[i] = (i % 2 ? 1 : -1) * (0.01f + i * 1e-3f); }
    a.weight_decay = 0;
    CHECK(zs_adamw_update(p, m, v, g, N, &a, 0.5f, 1, 1, NULL, ZS_F32) == 0, "step 1");
    int ok = 1;
    for (int i = 0; i < N; i++) {
        double want = 1 - 0.5 * (g[i] > 0 ? 1 : -1);
        if (!tu_close(p[i], want, 1e-5, 0)) ok = 0;
    }
    CHECK(ok, "bias-corrected first step is lr*sign(g)");
    /* weight decay alone: zero gradient -> p *= 1 - lr*wd exactly (decay 1), unchanged (decay 0) */
    a.weight_decay = 0.25f;
    for (int i = 0; i < N; i++) { p[i] = (float)i - 300.5f; m[i] = v[i] = g[i] = 0; }
    CHECK(zs_adamw_update(p, m, v, g, N, &a, 0.5f, 3, 1, NULL, ZS_F32) == 0, "decay step");
    ok = 1;
    for (int i = 0; i < N; i++)
        if (p[i] != ((float)i - 300.5f) * 0.875f || m[i] != 0 || v[i] != 0) ok = 0;
    CHECK(ok, "decoupled decay with zero gradient: p * (1 - lr*wd)");
    for (int i = 0; i < N; i++) p[i] = (float)i - 300.5f;
    CHECK(zs_adamw_update(p, m, v, g, N, &a, 0.5f, 3, 0, NULL, ZS_F32) == 0, "no-decay step");
    ok = 1;
    for (int i = 0; i < N; i++) if (p[i] != (float)i - 300.5f) ok = 0;
    CHECK(ok, "decay=0 leaves p alone with a zero gradient");

    /* the storage-dtype copy */
    size_t n = (size_t)ZS_ADAMW_CHUNK + 4099;
    float *pp = falloc(n), *mm = falloc(n), *vv = falloc(n), *gg = falloc(n), *f32 = falloc(n);
    uint16_t *h = calloc(n, 2), *want = calloc(n, 2);
    for (zs_dtype dt = ZS_F32; dt < ZS_DTYPE_ELEM_COUNT; dt++) {
        rng_state = 99;
        for (size_t i = 0; i < n; i++) pp[i] = frand(), mm[i] = vv[i] = 0, gg[i] = frand();
        void *out = dt == ZS_F32 ? (void *)f32 : (void *)h;
        CHECK(zs_adamw_update(pp, mm, vv, gg, n, &a, 1e-3f, 1, 1, out, dt) == 0, "out %d", dt);
        if (dt == ZS_F32) {
            CHECK(!memcmp(f32, pp, n * 4), "f32 copy equals master");
        } else {
            zs_convert(want, dt, pp, ZS_F32, n);
            CHECK(!memcmp(h, want, n * 2), "%s copy equals converted master", zs_dtype_name(dt));
        }
    }
    /* out == master for F32 is allowed */
    CHECK(zs_adamw_update(pp, mm, vv, gg, n, &a, 1e-3f, 2, 1, pp, ZS_F32) == 0, "out aliases master");
    free(pp); free(mm); free(vv); free(gg); free(f32); free(h); free(want);

    /* errors */
    zs_adamw_params bad = a;
    CHECK_ERR(zs_adamw_update(p, m, v, g, N, &a, 1e-3f, 0, 1, NULL, ZS_F32), "step 0");
    bad.beta1 = 1.0f;
    CHECK_ERR(zs_adamw_update(p, m, v, g, N, &bad, 1e-3f, 1, 1, NULL, ZS_F32), "betas");
    bad = a;
    bad.eps = 0;
    CHECK_ERR(zs_adamw_update(p, m, v, g, N, &bad, 1e-3f, 1, 1, NULL, ZS_F32), "eps");
    CHECK_ERR(zs_adamw_update(p, m, v, g, N, &a, NAN, 1, 1, NULL, ZS_F32), "lr");
    CHECK_ERR(zs_adamw_update(NULL, m, v, g, N, &a, 1e-3f, 1, 1, NULL, ZS_F32), "NULL");
    CHECK(zs_adamw_update(NULL, NULL, NULL, NULL, 0, &a, 1e-3f, 1, 1, NULL, ZS_F32) == 0, "n=0");
}

static void test_threads_and_isa(const char *self) {
    uint64_t here = run_fixed(FIXED_N, NULL, NULL, NULL);
    char cmd[4300];
    snprintf(cmd, sizeof cmd, "ZS_THREADS=1 ZS_OPTIM_SCALAR=1 '%.4000s' --child", self);
    FILE *f = popen(cmd, "r");
    unsigned long long child = 0;
    int got = f && fscanf(f, "%llx", &child) == 1;
    if (f) pclose(f);
    CHECK(got, "child run printed its hash");
    CHECK(got && child == here, "1 thread + scalar path %016llx vs %d threads + SIMD %016llx", child,
          zs_pool_threads(), (unsigned long long)here);
    fprintf(stderr, "determinism: %d threads SIMD vs 1 thread scalar: %s\n", zs_pool_threads(),
            got && child == here ? "identical" : "DIFFERENT");
}

static void test_schedules(void) {
    zs_lr_schedule s = {.type = ZS_LR_CONSTANT, .warmup_type = ZS_WARMUP_LINEAR, .lr = 0.5f};
    CHECK(zs_lr_at(&s, 1) == 0.5f && zs_lr_at(&s, 100000) == 0.5f && zs_lr_at(&s, 0) == 0.5f,
          "constant");
    s.warmup_steps = 10; /* WarmupLR, linear, from 0 */
    CHECK(zs_lr_at(&s, 1) == 0.0f, "warm-up starts at min: %g", (double)zs_lr_at(&s, 1));
    CHECK(zs_lr_at(&s, 6) == 0.25f, "warm-up half way: %g", (double)zs_lr_at(&s, 6));
    CHECK(zs_lr_at(&s, 10) == (float)(0.5 * 0.9), "last warm-up step: %g", (double)zs_lr_at(&s, 10));
    CHECK(zs_lr_at(&s, 11) == 0.5f && zs_lr_at(&s, 5000) == 0.5f, "peak after warm-up");
    s.warmup_min_ratio = 0.2f; /* starts at 0.1 */
    CHECK(zs_lr_at(&s, 1) == (float)(0.5 * 0.2f), "warm-up from min ratio");
    CHECK(zs_lr_at(&s, 6) == (float)(0.5 * (0.2f + (1 - 0.2f) * 0.5)), "warm-up from min ratio, half");
    s = (zs_lr_schedule){.type = ZS_LR_CONSTANT, .warmup_type = ZS_WARMUP_LOG, .lr = 1, .warmup_steps = 100};
    CHECK(zs_lr_at(&s, 10) == (float)(log(10.0) / log(100.0)), "log warm-up: %.9g",
          (double)zs_lr_at(&s, 10));
    CHECK(zs_lr_at(&s, 10) == 0.5f, "log warm-up at step 10 of 100 = 0.5");
    CHECK(zs_lr_at(&s, 1) == 0.0f && zs_lr_at(&s, 101) == 1.0f, "log warm-up ends");
    /* WarmupDecayLR */
    s = (zs_lr_schedule){.type = ZS_LR_WARMUP_LINEAR, .warmup_type = ZS_WARMUP_LINEAR, .lr = 1,
                         .warmup_steps = 10, .total_steps = 110};
    CHECK(zs_lr_at(&s, 11) == 1.0f, "decay starts at peak");
    CHECK(zs_lr_at(&s, 61) == 0.5f, "decay half way: %g", (double)zs_lr_at(&s, 61));
    CHECK(zs_lr_at(&s, 111) == 0.0f && zs_lr_at(&s, 500) == 0.0f, "decay ends at 0");
    s.min_lr_ratio = 0.1f;
    CHECK(zs_lr_at(&s, 61) == (float)(0.1f + 0.9f * 0.5), "decay to a floor: %.9g", (double)zs_lr_at(&s, 61));
    CHECK(zs_lr_at(&s, 1000) == 0.1f, "floor after total");
    /* WarmupCosineLR */
    s = (zs_lr_schedule){.type = ZS_LR_WARMUP_COSINE, .warmup_type = ZS_WARMUP_LINEAR, .lr = 2,
                         .warmup_steps = 0, .total_steps = 100};
    CHECK(zs_lr_at(&s, 1) == (float)(2 * (1 + cos(M_PI / 100)) / 2), "cosine step 1");
    CHECK(zs_lr_at(&s, 50) == 1.0f, "cosine half way: %.9g", (double)zs_lr_at(&s, 50));
    CHECK(zs_lr_at(&s, 100) == 0.0f && zs_lr_at(&s, 250) == 0.0f, "cosine end, stays at floor");
    s.min_lr_ratio = 0.1f;
    CHECK(zs_lr_at(&s, 50) == (float)(2 * (0.1f + (1 - 0.1f) * 0.5)), "cosine with floor");
    s.warmup_steps = 20;
    s.total_steps = 20;
    CHECK(zs_lr_at(&s, 21) == (float)(2 * 0.1f), "cosine with T == W sits at the floor");
    CHECK(zs_lr_at(&s, 11) == 1.0f, "cosine warm-up half way (linear, from 0)");

    /* from a DeepSpeed config */
    zs_zero_opts o;
    zs_lr_schedule r;
    zs_zero_opts_init(&o);
    CHECK(zs_dsconfig_parse("{\"optimizer\":{\"type\":\"AdamW\",\"params\":{\"lr\":3e-4,"
                            "\"weight_decay\":0.0}}}", "t.json", &o) == 0, "parse: %s", zs_errmsg());
    CHECK(zs_lr_schedule_from_opts(&o, &r) == 0 && r.lr == 3e-4f && r.warmup_steps == 0 &&
          zs_lr_at(&r, 1) == 3e-4f, "no scheduler: constant optimizer LR");
    zs_adamw_params ap;
    zs_adamw_params_from_opts(&o, &ap);
    CHECK(ap.lr == 3e-4f && ap.weight_decay == 0 && ap.beta2 == 0.999f, "adamw params from config");
    zs_zero_opts_init(&o);
    CHECK(zs_dsconfig_parse("{\"scheduler\":{\"type\":\"WarmupDecayLR\",\"params\":{"
                            "\"warmup_min_lr\":0.0,\"warmup_max_lr\":0.01,\"warmup_num_steps\":4,"
                            "\"warmup_type\":\"linear\",\"total_num_steps\":24}}}", "t.json", &o) == 0,
          "parse: %s", zs_errmsg());
    CHECK(zs_lr_schedule_from_opts(&o, &r) == 0, "decay from config: %s", zs_errmsg());
    CHECK(zs_lr_at(&r, 3) == 0.005f && zs_lr_at(&r, 5) == 0.01f && zs_lr_at(&r, 15) == 0.005f &&
          zs_lr_at(&r, 25) == 0.0f, "WarmupDecayLR values %g %g %g %g", (double)zs_lr_at(&r, 3),
          (double)zs_lr_at(&r, 5), (double)zs_lr_at(&r, 15), (double)zs_lr_at(&r, 25));
    zs_zero_opts_init(&o);
    CHECK(zs_dsconfig_parse("{\"scheduler\":{\"type\":\"WarmupCosineLR\",\"params\":{"
                            "\"warmup_num_steps\":10}}}", "t.json", &o) == 0, "parse: %s", zs_errmsg());
    CHECK_ERR(zs_lr_schedule_from_opts(&o, &r), "total_num_steps", "WarmupCosineLR");
    zs_zero_opts_init(&o);
    CHECK(zs_dsconfig_parse("{\"scheduler\":{\"type\":\"WarmupLR\"}}", "t.json", &o) == 0, "parse");
    CHECK(zs_lr_schedule_from_opts(&o, &r) == 0 && r.lr == 1e-3f && r.warmup_steps == 1000 &&
          r.warmup_type == ZS_WARMUP_LOG && r.warmup_min_ratio == 0, "WarmupLR defaults");
}

static void test_clipping(void) {
    size_t n = 1000003;
    float *g = falloc(n);
    rng_state = 4242;
    long double want = 0;
    for (size_t i = 0; i < n; i++) {
        g[i] = frand() * (i % 1000 == 0 ? 100.0f : 1.0f);
        want += (long double)g[i] * g[i];
    }
    double s1 = zs_sumsq(g, n), s2 = zs_sumsq(g, n);
    CHECK(memcmp(&s1, &s2, 8) == 0, "sumsq deterministic across calls");
    CHECK(tu_close(s1, (double)want, 0, 1e-13), "sumsq %.17g vs %.17Lg", s1, want);
    CHECK(zs_sumsq(g, 0) == 0, "empty");
    CHECK(zs_sumsq(g, 3) == (double)g[0] * g[0] + (double)g[1] * g[1] + (double)g[2] * g[2], "small");
    float c = zs_clip_coef(s1, 1.0f);
    CHECK(tu_close(c, 1.0 / (sqrt(s1) + 1e-6), 0, 1e-6), "clip coef %g", (double)c);
    CHECK(zs_clip_coef(s1, 0) == 1.0f, "clipping off");
    CHECK(zs_clip_coef(0.25, 10.0f) == 1.0f, "small norm not scaled up");
    CHECK(isnan(zs_clip_coef(INFINITY, 1.0f)), "inf norm -> NAN");
    float g0 = g[0], gl = g[n - 1];
    zs_scale(g, n, c);
    CHECK(g[0] == g0 * c && g[n - 1] == gl * c, "scale");
    double after = zs_sumsq(g, n);
    CHECK(tu_close(sqrt(after), 1.0, 1e-5, 0), "clipped norm %.9g", sqrt(after));
    free(g);
}

static void bench_update(void) {
    if (getenv("ZS_ASAN")) return;
    size_t n = (size_t)32 << 20;
    float *p = falloc(n), *m = falloc(n), *v = falloc(n), *g = falloc(n);
    uint16_t *o = calloc(n, 2);
    for (size_t i = 0; i < n; i++) p[i] = 1, g[i] = (float)(i % 13) * 0.01f;
    zs_adamw_params a;
    zs_adamw_params_default(&a);
    zs_adamw_update(p, m, v, g, n, &a, 1e-3f, 1, 1, o, ZS_BF16); /* touch pages */
    double t0 = zs_now();
    zs_adamw_update(p, m, v, g, n, &a, 1e-3f, 2, 1, NULL, ZS_F32);
    double t1 = zs_now();
    zs_adamw_update(p, m, v, g, n, &a, 1e-3f, 3, 1, o, ZS_BF16);
    double t2 = zs_now();
    double s = zs_sumsq(g, n);
    double t3 = zs_now();
    fprintf(stderr, "bench (%d threads): adamw %.0f M elem/s (%.2f GB/s), +bf16 out %.0f M elem/s, "
            "sumsq %.0f M elem/s (%g)\n", zs_pool_threads(), n / (t1 - t0) / 1e6,
            n * 28.0 / (t1 - t0) / 1e9, n / (t2 - t1) / 1e6, n / (t3 - t2) / 1e6, s);
    free(p); free(m); free(v); free(g); free(o);
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--child")) {
        printf("%016llx\n", (unsigned long long)run_fixed(FIXED_N, NULL, NULL, NULL));
        return 0;
    }
    test_adamw_reference();
    test_adamw_cases();
    char self[4096];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl > 0) self[sl] = 0; else snprintf(self, sizeof self, "%s", argv[0]);
    test_threads_and_isa(self);
    test_schedules();
    test_clipping();
    bench_update();
    return tu_finish("test-optim");
}
