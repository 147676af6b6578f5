/* test-ops-family.c — the training (backward) side of the model-family ops (train-ops.h,
 * kernels/cpu/ops-backward.c): RMSNorm with a weight offset (Gemma), RoPE from a frequency table
 * with an attention factor (rope_scaling), soft-capping (Gemma 2), GeGLU (Gemma), and the training
 * attention with zs_att_params (scale, soft-cap, sliding window).
 *   - every backward against central finite differences of a double-precision forward written
 *     here (h = 1e-5, so the differences are accurate to ~1e-9): the largest error over every
 *     coordinate of every input, relative to the largest gradient of that input, below 1e-4
 *     (float rounding of the backward's sums is ~1e-6);
 *   - the float forwards against the same double forwards (1e-6 relative);
 *   - the accumulating backwards (dx +=) add to what is there; the writing ones (softcap, GeGLU)
 *     work with their documented aliasing;
 *   - against transformers itself (tests/ref/ops-family-ref.json, made by
 *     tests/ref/make_ops_family_ref.py in float64: Gemma 2's eager attention with the sliding
 *     window mask of masking_utils, gelu_pytorch_tanh, Gemma2RMSNorm, apply_rotary_pos_emb):
 *     forwards 1e-6, gradients 1e-5, relative to max(1, the largest reference value); the
 *     inference attention (attention.c) over a paged view of the same K and V too;
 *   - bit for bit: rmsnorm_off_bwd with off 0 is rmsnorm_bwd, rope_freq_bwd with the default table
 *     and factor 1 is rope_bwd, and the training attention with NULL, all-zero parameters or a
 *     window of T or more gives the same bits forward and backward. */
#include "attention.h"
#include "common.h"
#include "ops.h"
#include "testutil.h"
#include "train-ops.h"

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static float frand(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (float)((rng >> 11) * 0x1.0p-53) - 0.5f;
}
static float *frnd(size_t n, float s) {
    float *p = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = s * 2.0f * frand();
    return p;
}
static int same_bits(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof(float)) == 0; }

/* A scalar loss of the double forward of one op: Σ c·y over its output, the inputs in x (their
 * float values widened), with the op's constant arguments in ctx. */
typedef double (*loss_fn)(const double *x, const void *ctx);

/* Central differences of f at every coordinate of the segment [off, off + n) of x (nx doubles)
 * against the gradient g[n]: returns max |g - fd| / max |fd| (and prints it). */
static double fd_check(loss_fn f, const void *ctx, const float *xf, int nx, int off, int n, const float *g,
                       const char *what) {
    double *x = malloc((size_t)nx * sizeof(double));
    for (int i = 0; i < nx; i++) x[i] = xf[i];
    double maxerr = 0, maxfd = 0;
    for (int i = off; i < off + n; i++) {
        double x0 = x[i], h = 1e-5 * fmax(1.0, fabs(x0));
        x[i] = x0 + h;
        double lp = f(x, ctx);
        x[i] = x0 - h;
        double lm = f(x, ctx);
        x[i] = x0;
        double fd = (lp - lm) / (2 * h);
        maxfd = fmax(maxfd, fabs(fd));
        maxerr = fmax(maxerr, fabs(fd - g[i - off]));
    }
    free(x);
    double rel = maxfd > 0 ? maxerr / maxfd : maxerr;
    fprintf(stderr, "%s: max |grad - finite difference| / max |fd| = %.3g (max |fd| %.3g)\n", what, rel, maxfd);
    /* (an input the loss does not depend on, e.g. q and k with a window of 1: exactly 0) */
    CHECK(maxfd > 0 ? rel < 1e-4 : maxerr == 0, "%s: gradient vs finite differences %.3g (max |fd| %.3g)", what, rel,
          maxfd);
    return rel;
}

/* ---- RMSNorm with offset ---- */

typedef struct { int T, d; float eps, off; const float *c; } rms_ctx;

/* x = [x (T*d) | w (d)] */
static double rms_loss(const double *x, const void *vc) {
    const rms_ctx *c = vc;
    const double *w = x + (size_t)c->T * c->d;
    double L = 0;
    for (int t = 0; t < c->T; t++) {
        const double *xr = x + (size_t)t * c->d;
        double ss = 0;
        for (int i = 0; i < c->d; i++) ss += xr[i] * xr[i];
        double r = 1 / sqrt(ss / c->d + c->eps);
        for (int i = 0; i < c->d; i++) L += c->c[(size_t)t * c->d + i] * xr[i] * r * (c->off + w[i]);
    }
    return L;
}

static void check_rmsnorm_off(void) {
    enum { T = 3, D = 24 };
    float *x = frnd(T * D + D, 1.0f), *c = frnd(T * D, 1.0f), *w = x + T * D;
    float y[T * D], dx[T * D], dw[D], base[T * D], dx0[T * D], dw0[D];
    for (int i = 0; i < D; i++) w[i] *= 0.3f; /* Gemma's weights are small around the offset 1 */
    rms_ctx ctx = {T, D, 1e-6f, 1.0f, c};
    /* forward vs double */
    zs_op_rmsnorm_off(y, x, w, T, D, ctx.eps, ctx.off);
    double worst = 0;
    for (int t = 0; t < T; t++) {
        double ss = 0;
        for (int i = 0; i < D; i++) ss += (double)x[t * D + i] * x[t * D + i];
        double r = 1 / sqrt(ss / D + ctx.eps);
        for (int i = 0; i < D; i++) {
            double e = x[t * D + i] * r * (1.0 + w[i]);
            worst = fmax(worst, fabs(y[t * D + i] - e) / (1 + fabs(e)));
        }
    }
    CHECK(worst < 1e-6, "rmsnorm_off forward vs double %.3g", worst);
    /* backward accumulates: start from arbitrary values and subtract them */
    for (int i = 0; i < T * D; i++) base[i] = frand();
    memcpy(dx, base, sizeof dx);
    for (int i = 0; i < D; i++) dw[i] = base[i];
    zs_op_rmsnorm_off_bwd(dx, dw, c, x, w, T, D, ctx.eps, ctx.off);
    for (int i = 0; i < T * D; i++) dx[i] -= base[i];
    for (int i = 0; i < D; i++) dw[i] -= base[i];
    fd_check(rms_loss, &ctx, x, T * D + D, 0, T * D, dx, "rmsnorm_off_bwd (off 1) dx");
    fd_check(rms_loss, &ctx, x, T * D + D, T * D, D, dw, "rmsnorm_off_bwd (off 1) dw");
    /* dw NULL: the same dx */
    float dx2[T * D];
    memset(dx2, 0, sizeof dx2);
    zs_op_rmsnorm_off_bwd(dx2, NULL, c, x, w, T, D, ctx.eps, ctx.off);
    float dx1[T * D];
    memset(dx1, 0, sizeof dx1);
    float dwt[D];
    memset(dwt, 0, sizeof dwt);
    zs_op_rmsnorm_off_bwd(dx1, dwt, c, x, w, T, D, ctx.eps, ctx.off);
    CHECK(same_bits(dx1, dx2, T * D), "rmsnorm_off_bwd with dw NULL: the same dx");
    /* off 0: rmsnorm_bwd's bits, and its gradient */
    memset(dx0, 0, sizeof dx0); memset(dw0, 0, sizeof dw0);
    memset(dx, 0, sizeof dx); memset(dw, 0, sizeof dw);
    zs_op_rmsnorm_bwd(dx0, dw0, c, x, w, T, D, ctx.eps);
    zs_op_rmsnorm_off_bwd(dx, dw, c, x, w, T, D, ctx.eps, 0.0f);
    CHECK(same_bits(dx, dx0, T * D) && same_bits(dw, dw0, D), "rmsnorm_off_bwd(off 0) == rmsnorm_bwd bit for bit");
    ctx.off = 0.0f;
    fd_check(rms_loss, &ctx, x, T * D + D, 0, T * D, dx, "rmsnorm_off_bwd (off 0) dx");
    free(x); free(c);
}

/* ---- RoPE from a table ---- */

typedef struct { int nh, hd, pos; const float *f; float af; const float *c; } rope_ctx;

static double rope_loss(const double *x, const void *vc) {
    const rope_ctx *c = vc;
    int half = c->hd / 2;
    double L = 0;
    for (int h = 0; h < c->nh; h++)
        for (int i = 0; i < half; i++) {
            double a = (double)((float)c->pos * c->f[i]), cs = cos(a) * c->af, sn = sin(a) * c->af;
            double x1 = x[h * c->hd + i], x2 = x[h * c->hd + i + half];
            L += c->c[h * c->hd + i] * (x1 * cs - x2 * sn) + c->c[h * c->hd + i + half] * (x2 * cs + x1 * sn);
        }
    return L;
}

static void check_rope_freq(void) {
    enum { NH = 3, HD = 16 };
    float f[HD / 2], x[NH * HD], g[NH * HD];
    float *c = frnd(NH * HD, 1.0f);
    for (int i = 0; i < HD / 2; i++) f[i] = 1.0f / powf(10000.0f, (float)(2 * i) / HD) * (i % 2 ? 0.25f : 1.0f);
    for (int i = 0; i < NH * HD; i++) x[i] = frand();
    rope_ctx ctx = {NH, HD, 77, f, 1.25f, c};
    memcpy(g, c, sizeof g);
    zs_op_rope_freq_bwd(g, NH, HD, ctx.pos, f, ctx.af);
    fd_check(rope_loss, &ctx, x, NH * HD, 0, NH * HD, g, "rope_freq_bwd (factor 1.25)");
    /* default table, factor 1: rope_bwd bit for bit, at several positions and head dims */
    int bad = 0;
    static const int hds[] = {8, 64, 256, 512};
    for (size_t k = 0; k < sizeof hds / sizeof hds[0]; k++) {
        int hd = hds[k];
        float *a = frnd((size_t)2 * hd, 1.0f), *b = malloc((size_t)2 * hd * 4), *tab = malloc((size_t)hd / 2 * 4);
        for (int i = 0; i < hd / 2; i++) tab[i] = 1.0f / powf(1e6f, (float)(2 * i) / (float)hd);
        for (int pos = 1; pos < 40000; pos += 7919) {
            memcpy(b, a, (size_t)2 * hd * 4);
            zs_op_rope_bwd(a, 2, hd, pos, 1e6f);
            zs_op_rope_freq_bwd(b, 2, hd, pos, tab, 1.0f);
            bad += !same_bits(a, b, (size_t)2 * hd);
        }
        free(a); free(b); free(tab);
    }
    CHECK(bad == 0, "rope_freq_bwd(default table, factor 1) == rope_bwd bit for bit (%d differ)", bad);
    free(c);
}

/* ---- soft-cap ---- */

typedef struct { int n; float cap; const float *c; } cap_ctx;

static double cap_loss(const double *x, const void *vc) {
    const cap_ctx *c = vc;
    double L = 0;
    for (int i = 0; i < c->n; i++) L += c->c[i] * c->cap * tanh(x[i] / c->cap);
    return L;
}

static void check_softcap(void) {
    enum { N = 50 };
    float *x = frnd(N, 6.0f), *c = frnd(N, 1.0f), y[N], dx[N];
    cap_ctx ctx = {N, 2.5f, c};
    memcpy(y, x, sizeof y);
    zs_op_softcap(y, N, ctx.cap);
    zs_op_softcap_bwd(dx, c, y, N, ctx.cap);
    fd_check(cap_loss, &ctx, x, N, 0, N, dx, "softcap_bwd");
    float d2[N];
    memcpy(d2, c, sizeof d2);
    zs_op_softcap_bwd(d2, d2, y, N, ctx.cap); /* dx aliasing dy */
    CHECK(same_bits(d2, dx, N), "softcap_bwd in place");
    free(x); free(c);
}

/* ---- GeGLU ---- */

typedef struct { int n; const float *c; } geglu_ctx;

/* x = [gate (n) | up (n)] */
static double geglu_loss(const double *x, const void *vc) {
    const geglu_ctx *c = vc;
    double L = 0;
    for (int i = 0; i < c->n; i++) {
        double v = x[i];
        L += c->c[i] * 0.5 * v * (1 + tanh(sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))) * x[c->n + i];
    }
    return L;
}

static void check_geglu(void) {
    enum { N = 60 };
    float *x = frnd(2 * N, 3.0f), *c = frnd(N, 1.0f), dg[N], du[N];
    geglu_ctx ctx = {N, c};
    zs_op_geglu_bwd(dg, du, c, x, x + N, N);
    fd_check(geglu_loss, &ctx, x, 2 * N, 0, N, dg, "geglu_bwd dgate");
    fd_check(geglu_loss, &ctx, x, 2 * N, N, N, du, "geglu_bwd dup");
    float g2[N], u2[N];
    memcpy(g2, c, sizeof g2);
    zs_op_geglu_bwd(g2, u2, g2, x, x + N, N); /* dgate aliasing dy */
    CHECK(same_bits(g2, dg, N) && same_bits(u2, du, N), "geglu_bwd with dgate aliasing dy");
    memcpy(u2, c, sizeof u2);
    zs_op_geglu_bwd(g2, u2, u2, x, x + N, N); /* dup aliasing dy */
    CHECK(same_bits(g2, dg, N) && same_bits(u2, du, N), "geglu_bwd with dup aliasing dy");
    free(x); free(c);
}

/* ---- training attention with the family parameters ---- */

typedef struct { int T, nh, nkv, hd; const zs_att_params *ap; const float *c; } att_ctx;

/* out[T, nh*hd] in double: scores · scale, soft-capped, softmax over the window, weighted sum */
static void att_ref(double *out, const double *q, const double *k, const double *v, const att_ctx *c) {
    int T = c->T, nh = c->nh, hd = c->hd, group = nh / c->nkv, qd = nh * hd, kvd = c->nkv * hd;
    double scale = c->ap && c->ap->scale != 0 ? c->ap->scale : 1 / sqrt((double)hd);
    double cap = c->ap ? c->ap->softcap : 0;
    int W = c->ap ? c->ap->window : 0;
    double *p = malloc((size_t)T * sizeof(double));
    for (int i = 0; i < T; i++)
        for (int h = 0; h < nh; h++) {
            int kh = h / group, lo = W > 0 && i - W + 1 > 0 ? i - W + 1 : 0;
            const double *qi = q + (size_t)i * qd + (size_t)h * hd;
            double m = -INFINITY, sum = 0;
            for (int j = lo; j <= i; j++) {
                double s = 0;
                for (int e = 0; e < hd; e++) s += qi[e] * k[(size_t)j * kvd + (size_t)kh * hd + e];
                s *= scale;
                if (cap > 0) s = cap * tanh(s / cap);
                p[j] = s;
                m = fmax(m, s);
            }
            for (int j = lo; j <= i; j++) sum += (p[j] = exp(p[j] - m));
            double *o = out + (size_t)i * qd + (size_t)h * hd;
            for (int e = 0; e < hd; e++) {
                double x = 0;
                for (int j = lo; j <= i; j++) x += p[j] / sum * v[(size_t)j * kvd + (size_t)kh * hd + e];
                o[e] = x;
            }
        }
    free(p);
}

/* x = [q | k | v] */
static double att_loss(const double *x, const void *vc) {
    const att_ctx *c = vc;
    size_t qn = (size_t)c->T * c->nh * c->hd, kn = (size_t)c->T * c->nkv * c->hd;
    double *o = malloc(qn * sizeof(double)), L = 0;
    att_ref(o, x, x + qn, x + qn + kn, c);
    for (size_t i = 0; i < qn; i++) L += c->c[i] * o[i];
    free(o);
    return L;
}

/* forward vs double and backward vs finite differences for one shape and parameter set */
static void check_attention_case(int T, int nh, int nkv, int hd, const zs_att_params *ap) {
    size_t qn = (size_t)T * nh * hd, kn = (size_t)T * nkv * hd, nx = qn + 2 * kn;
    float *x = frnd(nx, 1.0f), *c = frnd(qn, 1.0f), *out = malloc(qn * 4), *sc = malloc((size_t)2 * T * 4);
    float *g = calloc(nx, 4);
    att_ctx ctx = {T, nh, nkv, hd, ap, c};
    char what[160];
    snprintf(what, sizeof what, "attention T %d %d/%d heads x %d scale %g cap %g window %d", T, nh, nkv, hd,
             ap ? (double)ap->scale : 0.0, ap ? (double)ap->softcap : 0.0, ap ? ap->window : 0);
    zs_op_attention_fwd(out, x, x + qn, x + qn + kn, T, nh, nkv, hd, sc, ap);
    double *xd = malloc(nx * sizeof(double)), *od = malloc(qn * sizeof(double)), worst = 0;
    for (size_t i = 0; i < nx; i++) xd[i] = x[i];
    att_ref(od, xd, xd + qn, xd + qn + kn, &ctx);
    for (size_t i = 0; i < qn; i++) worst = fmax(worst, fabs(out[i] - od[i]));
    fprintf(stderr, "%s: forward max |out - double| %.3g\n", what, worst);
    CHECK(worst < 1e-6, "%s: forward vs double %.3g", what, worst);
    zs_op_attention_bwd(g, g + qn, g + qn + kn, c, x, x + qn, x + qn + kn, T, nh, nkv, hd, sc, ap);
    char w2[200];
    snprintf(w2, sizeof w2, "%s: dq", what);
    fd_check(att_loss, &ctx, x, (int)nx, 0, (int)qn, g, w2);
    snprintf(w2, sizeof w2, "%s: dk", what);
    fd_check(att_loss, &ctx, x, (int)nx, (int)qn, (int)kn, g + qn, w2);
    snprintf(w2, sizeof w2, "%s: dv", what);
    fd_check(att_loss, &ctx, x, (int)nx, (int)(qn + kn), (int)kn, g + qn + kn, w2);
    free(x); free(c); free(out); free(sc); free(g); free(xd); free(od);
}

/* NULL, all zeros and a window of T or more: the same bits, forward and backward (accumulating
 * onto the same starting values) */
static void check_attention_identity(int T, int nh, int nkv, int hd) {
    size_t qn = (size_t)T * nh * hd, kn = (size_t)T * nkv * hd, nx = qn + 2 * kn;
    float *x = frnd(nx, 1.0f), *c = frnd(qn, 1.0f), *sc = malloc((size_t)2 * T * 4), *g0 = frnd(nx, 0.1f);
    const zs_att_params same[3] = {{0, 0, 0}, {0, 0, T}, {0, 0, 100 * T}};
    float *o0 = malloc(qn * 4), *o1 = malloc(qn * 4), *ga = malloc(nx * 4), *gb = malloc(nx * 4);
    zs_op_attention_fwd(o0, x, x + qn, x + qn + kn, T, nh, nkv, hd, sc, NULL);
    memcpy(ga, g0, nx * 4);
    zs_op_attention_bwd(ga, ga + qn, ga + qn + kn, c, x, x + qn, x + qn + kn, T, nh, nkv, hd, sc, NULL);
    for (int s = 0; s < 3; s++) {
        zs_op_attention_fwd(o1, x, x + qn, x + qn + kn, T, nh, nkv, hd, sc, &same[s]);
        memcpy(gb, g0, nx * 4);
        zs_op_attention_bwd(gb, gb + qn, gb + qn + kn, c, x, x + qn, x + qn + kn, T, nh, nkv, hd, sc, &same[s]);
        CHECK(same_bits(o0, o1, qn) && same_bits(ga, gb, nx), "training attention: window %d gives NULL's bits",
              same[s].window);
    }
    /* a window does change the result (the test above could not pass with it ignored) */
    const zs_att_params w3 = {0, 0, 3};
    zs_op_attention_fwd(o1, x, x + qn, x + qn + kn, T, nh, nkv, hd, sc, &w3);
    CHECK(!same_bits(o0, o1, qn), "training attention: window 3 changes the output");
    free(x); free(c); free(sc); free(g0); free(o0); free(o1); free(ga); free(gb);
}

/* ---- against transformers (tests/ref/ops-family-ref.json, tests/ref/make_ops_family_ref.py) ---- */

/* the float array of a key of o (NULL if absent); *n its length */
static float *jfloats(json_t *o, const char *key, size_t *n) {
    json_t *a = json_object_get(o, key);
    size_t m = json_array_size(a);
    if (n) *n = m;
    if (!m) return NULL;
    float *p = malloc(m * sizeof(float));
    for (size_t i = 0; i < m; i++) p[i] = (float)json_number_value(json_array_get(a, i));
    return p;
}

/* max |a - ref| / max(1, max |ref|) over n, checked against tol */
static void cmp_ref(const float *a, const float *ref, size_t n, double tol, const char *what) {
    double err = 0, mx = 1;
    for (size_t i = 0; i < n; i++) {
        err = fmax(err, fabs((double)a[i] - ref[i]));
        mx = fmax(mx, fabs(ref[i]));
    }
    fprintf(stderr, "%s vs transformers: max error %.3g (scale %.3g)\n", what, err, mx);
    CHECK(ref && err / mx <= tol, "%s vs transformers: %.3g", what, err / mx);
}

static void check_torch(void) {
    json_error_t je;
    json_t *j = json_load_file("tests/ref/ops-family-ref.json", 0, &je);
    CHECK(j != NULL, "tests/ref/ops-family-ref.json: %s", je.text);
    if (!j) return;
    char what[160];
    json_t *cases = json_object_get(j, "attention");
    CHECK(json_array_size(cases) >= 4, "attention cases");
    for (size_t ci = 0; ci < json_array_size(cases); ci++) {
        json_t *c = json_array_get(cases, ci);
        int T = (int)json_integer_value(json_object_get(c, "T")), nh = (int)json_integer_value(json_object_get(c, "nh"));
        int nkv = (int)json_integer_value(json_object_get(c, "nkv")), hd = (int)json_integer_value(json_object_get(c, "hd"));
        zs_att_params ap = {(float)json_number_value(json_object_get(c, "scale")),
                            (float)json_number_value(json_object_get(c, "softcap")),
                            (int)json_integer_value(json_object_get(c, "window"))};
        size_t qn = (size_t)T * nh * hd, kn = (size_t)T * nkv * hd, n;
        float *q = jfloats(c, "q", &n), *k = jfloats(c, "k", NULL), *v = jfloats(c, "v", NULL);
        float *cc = jfloats(c, "c", NULL), *ro = jfloats(c, "out", NULL), *rdq = jfloats(c, "dq", NULL);
        float *rdk = jfloats(c, "dk", NULL), *rdv = jfloats(c, "dv", NULL);
        CHECK(n == qn && q && k && v && cc && ro && rdq && rdk && rdv, "attention case %zu: arrays", ci);
        if (n != qn || !k || !v || !cc || !ro || !rdq || !rdk || !rdv) { json_decref(j); return; }
        float *o = malloc(qn * 4), *sc = malloc((size_t)2 * T * 4);
        float *dq = calloc(qn, 4), *dk = calloc(kn, 4), *dv = calloc(kn, 4);
        snprintf(what, sizeof what, "attention T %d %d/%d x %d scale %g cap %g window %d", T, nh, nkv, hd,
                 (double)ap.scale, (double)ap.softcap, ap.window);
        zs_op_attention_fwd(o, q, k, v, T, nh, nkv, hd, sc, &ap);
        cmp_ref(o, ro, qn, 1e-6, what);
        zs_op_attention_bwd(dq, dk, dv, cc, q, k, v, T, nh, nkv, hd, sc, &ap);
        cmp_ref(dq, rdq, qn, 1e-5, "  dq");
        cmp_ref(dk, rdk, kn, 1e-5, "  dk");
        cmp_ref(dv, rdv, kn, 1e-5, "  dv");
        /* the inference attention over a paged view of the same K and V (blocks of 4 positions) */
        int B = 4, nb = (T + B - 1) / B;
        const void **kp = malloc((size_t)nb * sizeof *kp), **vp = malloc((size_t)nb * sizeof *vp);
        for (int b = 0; b < nb; b++) { kp[b] = k + (size_t)b * B * nkv * hd; vp[b] = v + (size_t)b * B * nkv * hd; }
        zs_att_seq sq = {kp, vp};
        int *seq = calloc((size_t)T, sizeof(int)), *pos = malloc((size_t)T * sizeof(int));
        for (int i = 0; i < T; i++) pos[i] = i;
        int rc = zs_op_attention(o, q, T, seq, pos, &sq, nh, nkv, hd, nkv * hd, B, ZS_F32, ZS_ATT_AUTO, &ap);
        CHECK(rc == 0, "inference attention: %s", zs_errmsg());
        cmp_ref(o, ro, qn, 1e-6, "  inference attention (zs_op_attention)");
        free(kp); free(vp); free(seq); free(pos);
        free(q); free(k); free(v); free(cc); free(ro); free(rdq); free(rdk); free(rdv);
        free(o); free(sc); free(dq); free(dk); free(dv);
    }
    /* soft-cap */
    json_t *o = json_object_get(j, "softcap");
    size_t n;
    float cap = (float)json_number_value(json_object_get(o, "cap"));
    float *x = jfloats(o, "x", &n), *c = jfloats(o, "c", NULL), *ry = jfloats(o, "y", NULL), *rdx = jfloats(o, "dx", NULL);
    float *y = malloc(n * 4), *dx = malloc(n * 4);
    memcpy(y, x, n * 4);
    zs_op_softcap(y, n, cap);
    cmp_ref(y, ry, n, 1e-6, "softcap");
    zs_op_softcap_bwd(dx, c, y, n, cap);
    cmp_ref(dx, rdx, n, 1e-6, "softcap_bwd");
    free(x); free(c); free(ry); free(rdx); free(y); free(dx);
    /* GeGLU */
    o = json_object_get(j, "geglu");
    float *gt = jfloats(o, "gate", &n), *up = jfloats(o, "up", NULL);
    c = jfloats(o, "c", NULL); ry = jfloats(o, "y", NULL);
    float *rdg = jfloats(o, "dgate", NULL), *rdu = jfloats(o, "dup", NULL);
    float *dg = malloc(n * 4), *du = malloc(n * 4);
    y = malloc(n * 4);
    zs_op_geglu(y, gt, up, n);
    cmp_ref(y, ry, n, 1e-6, "geglu (gelu_pytorch_tanh)");
    zs_op_geglu_bwd(dg, du, c, gt, up, n);
    cmp_ref(dg, rdg, n, 1e-6, "geglu_bwd dgate");
    cmp_ref(du, rdu, n, 1e-6, "geglu_bwd dup");
    free(gt); free(up); free(c); free(ry); free(rdg); free(rdu); free(dg); free(du); free(y);
    /* Gemma's RMSNorm */
    o = json_object_get(j, "rmsnorm");
    int T = (int)json_integer_value(json_object_get(o, "T")), d = (int)json_integer_value(json_object_get(o, "d"));
    float eps = (float)json_number_value(json_object_get(o, "eps")), off = (float)json_number_value(json_object_get(o, "off"));
    x = jfloats(o, "x", &n);
    float *w = jfloats(o, "w", NULL), *rdw = jfloats(o, "dw", NULL);
    c = jfloats(o, "c", NULL); ry = jfloats(o, "y", NULL); rdx = jfloats(o, "dx", NULL);
    y = malloc(n * 4); dx = calloc(n, 4);
    float *dw = calloc((size_t)d, 4);
    zs_op_rmsnorm_off(y, x, w, T, d, eps, off);
    cmp_ref(y, ry, n, 1e-6, "rmsnorm_off (Gemma2RMSNorm)");
    zs_op_rmsnorm_off_bwd(dx, dw, c, x, w, T, d, eps, off);
    cmp_ref(dx, rdx, n, 1e-5, "rmsnorm_off_bwd dx");
    cmp_ref(dw, rdw, (size_t)d, 1e-5, "rmsnorm_off_bwd dw");
    free(x); free(w); free(rdw); free(c); free(ry); free(rdx); free(y); free(dx); free(dw);
    /* RoPE from a table with a factor (Llama's apply_rotary_pos_emb) */
    o = json_object_get(j, "rope");
    int nh = (int)json_integer_value(json_object_get(o, "nh")), hd = (int)json_integer_value(json_object_get(o, "hd"));
    int pos = (int)json_integer_value(json_object_get(o, "pos"));
    float af = (float)json_number_value(json_object_get(o, "attn_factor"));
    float *inv = jfloats(o, "inv_freq", NULL);
    x = jfloats(o, "x", &n); c = jfloats(o, "c", NULL); ry = jfloats(o, "y", NULL); rdx = jfloats(o, "dx", NULL);
    zs_op_rope_freq(x, nh, hd, pos, inv, af);
    cmp_ref(x, ry, n, 1e-6, "rope_freq (apply_rotary_pos_emb)");
    zs_op_rope_freq_bwd(c, nh, hd, pos, inv, af);
    cmp_ref(c, rdx, n, 1e-6, "rope_freq_bwd");
    free(inv); free(x); free(c); free(ry); free(rdx);
    json_decref(j);
}

int main(void) {
    check_rmsnorm_off();
    check_rope_freq();
    check_softcap();
    check_geglu();
    static const zs_att_params ps[] = {{0, 0, 0}, {0.3f, 0, 0}, {1.0f, 0.7f, 0}, {0, 0, 1}, {0, 0, 3},
                                       {1.0f, 0.7f, 4}, {0.0625f, 50.0f, 6}};
    check_attention_case(11, 4, 2, 8, NULL);
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) {
        check_attention_case(11, 4, 2, 8, &ps[i]);
        check_attention_case(9, 3, 1, 5, &ps[i]);
    }
    check_attention_identity(23, 4, 2, 8);
    check_attention_identity(17, 3, 3, 12);
    check_torch();
    return tu_finish("test-ops-family");
}
