/* test-ops.c — the CPU kernels: the matrix product against a double-precision reference (f32,
 * f16 and bf16 weights, odd sizes), its batch invariance (a row's result is the same bits for
 * any number of rows in the call and any position), and the elementwise ops (RMSNorm, LayerNorm,
 * RoPE pairing, GELU, SwiGLU, softmax) against direct formulas; the model-family ops (RMSNorm
 * with a weight offset, RoPE from a frequency table with a factor, soft-cap, GeGLU) against
 * double formulas and, bit for bit, against the plain ops where ops.h promises it. */
#include <cblas.h>

#include "common.h"
#include "ops.h"
#include "testutil.h"

static uint64_t rng = 88172645463325252ull;
static float frand(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (float)((rng >> 11) * 0x1.0p-53) - 0.5f;
}

static void check_matmul(int in, int out, zs_dtype wdt) {
    int T = 41;
    float *Wf = malloc((size_t)in * out * 4), *x = malloc((size_t)in * T * 4);
    float *y = malloc((size_t)out * T * 4), *y1 = malloc((size_t)out * 4), *b = malloc((size_t)out * 4);
    void *W = malloc((size_t)in * out * 4);
    for (size_t i = 0; i < (size_t)in * out; i++) Wf[i] = frand();
    for (size_t i = 0; i < (size_t)in * T; i++) x[i] = frand();
    for (int i = 0; i < out; i++) b[i] = frand();
    zs_convert(W, wdt, Wf, ZS_F32, (size_t)in * out);
    zs_to_f32(Wf, W, wdt, (size_t)in * out); /* the reference uses the stored values */
    zs_op_matmul(y, x, T, in, W, wdt, out, b);
    double maxerr = 0;
    for (int t = 0; t < T; t++)
        for (int j = 0; j < out; j++) {
            double s = b[j];
            for (int k = 0; k < in; k++) s += (double)Wf[(size_t)j * in + k] * x[(size_t)t * in + k];
            maxerr = fmax(maxerr, fabs(s - y[(size_t)t * out + j]) / (1 + fabs(s)));
        }
    CHECK(maxerr < 1e-5, "matmul %dx%d %s: error %.3g vs double reference", in, out, zs_dtype_name(wdt), maxerr);
    /* and against OpenBLAS sgemm on the same values */
    float *yb = malloc((size_t)out * T * 4);
    for (int t = 0; t < T; t++) memcpy(yb + (size_t)t * out, b, (size_t)out * 4);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, out, in, 1.0f, x, in, Wf, in, 1.0f, yb, out);
    double blas = 0;
    for (size_t i = 0; i < (size_t)out * T; i++) blas = fmax(blas, fabs(yb[i] - y[i]) / (1 + fabs(yb[i])));
    CHECK(blas < 1e-5, "matmul %dx%d %s: differs from OpenBLAS sgemm by %.3g", in, out, zs_dtype_name(wdt), blas);
    free(yb);
    /* invariance: every row equals its own T=1 product, and every sub-batch gives the same rows */
    int bad = 0;
    for (int t = 0; t < T; t++) {
        zs_op_matmul(y1, x + (size_t)t * in, 1, in, W, wdt, out, b);
        bad += memcmp(y1, y + (size_t)t * out, (size_t)out * 4) != 0;
    }
    float *y2 = malloc((size_t)out * T * 4);
    for (int off = 1; off < 6; off++)
        for (int n = 1; off + n <= T; n += 3) {
            zs_op_matmul(y2, x + (size_t)off * in, n, in, W, wdt, out, b);
            bad += memcmp(y2, y + (size_t)off * out, (size_t)n * out * 4) != 0;
        }
    CHECK(bad == 0, "matmul %dx%d %s: rows are batch-invariant (%d mismatches)", in, out, zs_dtype_name(wdt), bad);
    free(Wf); free(x); free(y); free(y1); free(y2); free(b); free(W);
}

static void check_elementwise(void) {
    int d = 24;
    float x[48], y[48], w[24], bb[24];
    for (int i = 0; i < 48; i++) x[i] = frand() * 4;
    for (int i = 0; i < 24; i++) { w[i] = frand() + 1; bb[i] = frand(); }
    zs_op_rmsnorm(y, x, w, 2, d, 1e-5f);
    for (int t = 0; t < 2; t++) {
        double ss = 0;
        for (int i = 0; i < d; i++) ss += (double)x[t * d + i] * x[t * d + i];
        double s = 1 / sqrt(ss / d + 1e-5);
        for (int i = 0; i < d; i++) CHECK(tu_close(y[t * d + i], x[t * d + i] * s * w[i], 1e-5, 1e-5), "rmsnorm");
    }
    zs_op_layernorm(y, x, w, bb, 2, d, 1e-5f);
    for (int t = 0; t < 2; t++) {
        double m = 0, v = 0;
        for (int i = 0; i < d; i++) m += x[t * d + i];
        m /= d;
        for (int i = 0; i < d; i++) v += (x[t * d + i] - m) * (x[t * d + i] - m);
        v /= d;
        for (int i = 0; i < d; i++)
            CHECK(tu_close(y[t * d + i], (x[t * d + i] - m) / sqrt(v + 1e-5) * w[i] + bb[i], 1e-5, 1e-5), "layernorm");
    }
    /* RoPE: dims i and i + hd/2 rotate together by pos * theta^(-2i/hd) */
    float r[16], r0[16];
    for (int i = 0; i < 16; i++) r[i] = r0[i] = frand();
    zs_op_rope(r, 2, 8, 3, 10000.0f);
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < 4; i++) {
            double a = 3 * pow(10000.0, -2.0 * i / 8), c = cos(a), s = sin(a);
            double x1 = r0[h * 8 + i], x2 = r0[h * 8 + i + 4];
            CHECK(tu_close(r[h * 8 + i], x1 * c - x2 * s, 1e-5, 1e-5) && tu_close(r[h * 8 + i + 4], x2 * c + x1 * s, 1e-5, 1e-5),
                  "rope pair %d", i);
        }
    float g[5] = {-3, -0.5f, 0, 0.7f, 2.5f}, g0[5];
    memcpy(g0, g, sizeof g);
    zs_op_gelu(g, 5);
    for (int i = 0; i < 5; i++) {
        double v = g0[i], e = 0.5 * v * (1 + tanh(sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
        CHECK(tu_close(g[i], e, 1e-6, 1e-5), "gelu(%g)", v);
    }
    float up[5] = {1, 2, 3, 4, 5}, out[5];
    zs_op_swiglu(out, g0, up, 5);
    for (int i = 0; i < 5; i++) CHECK(tu_close(out[i], g0[i] / (1 + exp(-g0[i])) * up[i], 1e-6, 1e-5), "swiglu");
    float sm[4] = {1, 2, 3, 1000};
    zs_op_softmax(sm, 4);
    CHECK(tu_close(sm[3], 1.0, 1e-6, 0) && sm[0] >= 0, "softmax is stable for large inputs");
}

/* bits of two float arrays equal */
static int same_bits(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof(float)) == 0; }

/* The model-family ops: RMSNorm with a weight offset, RoPE from a frequency table with an
 * attention factor, soft-capping, GeGLU: against double-precision formulas, and bit for bit
 * against the plain ops where they promise it (offset 0, factor 1 with the default table). */
static void check_family(void) {
    /* RMSNorm with offset: off 0 is zs_op_rmsnorm's bits (weights of -0 and 0 included) */
    enum { D = 40, NT = 3 };
    float x[NT * D], w[D], y0[NT * D], y1[NT * D];
    for (int i = 0; i < NT * D; i++) x[i] = frand() * 4;
    for (int i = 0; i < D; i++) w[i] = frand();
    w[3] = -0.0f; w[4] = 0.0f; x[5] = -x[5];
    zs_op_rmsnorm(y0, x, w, NT, D, 1e-6f);
    zs_op_rmsnorm_off(y1, x, w, NT, D, 1e-6f, 0.0f);
    CHECK(same_bits(y0, y1, NT * D), "rmsnorm_off(off 0) == rmsnorm bit for bit");
    memcpy(y1, x, sizeof x);
    zs_op_rmsnorm_off(y1, y1, w, NT, D, 1e-6f, 0.0f); /* in place */
    CHECK(same_bits(y0, y1, NT * D), "rmsnorm_off in place");
    zs_op_rmsnorm_off(y1, x, w, NT, D, 1e-6f, 1.0f);
    double worst = 0;
    for (int t = 0; t < NT; t++) {
        double ss = 0;
        for (int i = 0; i < D; i++) ss += (double)x[t * D + i] * x[t * D + i];
        double s = 1 / sqrt(ss / D + 1e-6);
        for (int i = 0; i < D; i++) {
            double e = x[t * D + i] * s * (1.0 + w[i]);
            worst = fmax(worst, fabs(y1[t * D + i] - e) / (1 + fabs(e)));
        }
    }
    CHECK(worst < 1e-6, "rmsnorm_off(off 1) vs double: %.3g", worst);

    /* RoPE: zs_op_rope is the old formula bit for bit, and zs_op_rope_freq with the default table
     * and factor 1 is zs_op_rope; head dims across the 128-pair chunk of zs_op_rope's table */
    static const int hds[] = {8, 64, 128, 256, 258, 512};
    float theta = 500000.0f;
    for (size_t c = 0; c < sizeof hds / sizeof hds[0]; c++) {
        int hd = hds[c], nh = 3, half = hd / 2;
        float *r0 = malloc((size_t)nh * hd * 4), *r1 = malloc((size_t)nh * hd * 4), *r2 = malloc((size_t)nh * hd * 4);
        float *f = malloc((size_t)half * 4);
        int bad = 0;
        for (int pos = 0; pos < 5000; pos += 997) {
            for (int i = 0; i < nh * hd; i++) r0[i] = r1[i] = r2[i] = frand();
            /* the old zs_op_rope, written out */
            for (int i = 0; i < half; i++) {
                float inv = 1.0f / powf(theta, (float)(2 * i) / (float)hd);
                float ang = (float)pos * inv;
                float cs = cosf(ang), sn = sinf(ang);
                for (int h = 0; h < nh; h++) {
                    float *v = r0 + (size_t)h * hd, a = v[i], b = v[i + half];
                    v[i] = a * cs - b * sn;
                    v[i + half] = b * cs + a * sn;
                }
            }
            for (int i = 0; i < half; i++) f[i] = 1.0f / powf(theta, (float)(2 * i) / (float)hd);
            zs_op_rope(r1, nh, hd, pos, theta);
            zs_op_rope_freq(r2, nh, hd, pos, f, 1.0f);
            bad += !same_bits(r0, r1, (size_t)nh * hd) + !same_bits(r0, r2, (size_t)nh * hd);
        }
        CHECK(bad == 0, "rope hd %d: zs_op_rope / zs_op_rope_freq(af 1) differ from the old formula (%d)", hd, bad);
        free(r0); free(r1); free(r2); free(f);
    }
    /* an arbitrary table and factor vs double */
    {
        enum { HD = 12, NH = 2 };
        float f[HD / 2], v[NH * HD], v0[NH * HD], af = 1.2f;
        for (int i = 0; i < HD / 2; i++) f[i] = 0.5f / (float)(1 + 3 * i);
        for (int i = 0; i < NH * HD; i++) v[i] = v0[i] = frand();
        zs_op_rope_freq(v, NH, HD, 37, f, af);
        worst = 0;
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < HD / 2; i++) {
                double a = (double)(float)(37.0f * f[i]), cs = cos(a) * af, sn = sin(a) * af;
                double x1 = v0[h * HD + i], x2 = v0[h * HD + i + HD / 2];
                worst = fmax(worst, fabs(v[h * HD + i] - (x1 * cs - x2 * sn)));
                worst = fmax(worst, fabs(v[h * HD + i + HD / 2] - (x2 * cs + x1 * sn)));
            }
        CHECK(worst < 1e-6, "rope_freq (table, factor 1.2) vs double: %.3g", worst);
    }

    /* soft-cap and GeGLU vs double; GeGLU is zs_op_gelu(gate) · up bit for bit */
    enum { N = 64 };
    float g[N], u[N], o[N], ref[N];
    for (int i = 0; i < N; i++) { g[i] = frand() * 12; u[i] = frand() * 3; }
    g[0] = 0.0f; g[1] = -0.0f; g[2] = 200.0f; g[3] = -200.0f;
    memcpy(o, g, sizeof g);
    zs_op_softcap(o, N, 3.0f);
    worst = 0;
    for (int i = 0; i < N; i++) worst = fmax(worst, fabs(o[i] - 3.0 * tanh(g[i] / 3.0)));
    CHECK(worst < 1e-6, "softcap vs double: %.3g", worst);
    CHECK(o[2] == 3.0f && o[3] == -3.0f && o[0] == 0.0f && signbit(o[1]), "softcap saturates and keeps 0 / -0");
    zs_op_geglu(o, g, u, N);
    memcpy(ref, g, sizeof g);
    zs_op_gelu(ref, N);
    worst = 0;
    int bad = 0;
    for (int i = 0; i < N; i++) {
        double v = g[i], e = 0.5 * v * (1 + tanh(sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))) * u[i];
        worst = fmax(worst, fabs(o[i] - e) / (1 + fabs(e)));
        float want = ref[i] * u[i];
        bad += memcmp(&want, &o[i], 4) != 0;
    }
    CHECK(worst < 1e-6, "geglu vs double: %.3g", worst);
    CHECK(bad == 0, "geglu == gelu(gate) * up bit for bit (%d differ)", bad);
    memcpy(ref, o, sizeof o);
    memcpy(o, g, sizeof g);
    zs_op_geglu(o, o, u, N); /* out aliasing gate */
    CHECK(same_bits(o, ref, N), "geglu in place");
}

int main(void) {
    int shapes[][2] = {{64, 64}, {64, 172}, {172, 64}, {13, 7}, {8, 5}, {1024, 300}, {256, 688}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int dt = 0; dt < 3; dt++) check_matmul(shapes[s][0], shapes[s][1], (zs_dtype)dt);
    check_elementwise();
    check_family();
    return tu_finish("test-ops");
}
