/* test-matmul-bwd.c — the training backward's matrix products (zs_op_matmul_bwd): dx, dW and db
 * compared BIT FOR BIT with a scalar loop of their documented fixed order (train-ops.h: per
 * element, blocks of 256 k from k = 0, each a chain of fmaf from zero added to the element), for
 * f32, f16 and bf16 weights and odd sizes on both sides of the pool and packing thresholds, and
 * against a double-precision reference. The same checks then run again in child processes with
 * ZS_THREADS=1 and ZS_THREADS=3: whatever the thread count, the bits are those of the loop. */
#include "common.h"
#include "train-ops.h"
#include "testutil.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (float)((rng >> 11) * 0x1.0p-53) - 0.5f;
}

#define KB 256 /* the documented block of k */

/* y[r*N + c] += Σ_k a(r,k)·b[k*N + c] in the documented order */
static void ref_update(float *y, int M, int N, int K, const float *a, size_t ars, size_t acs, const float *b) {
    for (int r = 0; r < M; r++)
        for (int c = 0; c < N; c++) {
            float v = y[(size_t)r * N + c];
            for (int k0 = 0; k0 < K; k0 += KB) {
                float s = 0.0f;
                for (int k = k0; k < K && k < k0 + KB; k++)
                    s = fmaf(a[(size_t)r * ars + (size_t)k * acs], b[(size_t)k * N + c], s);
                v += s;
            }
            y[(size_t)r * N + c] = v;
        }
}

static int count_diff(const float *a, const float *b, size_t n) {
    int d = 0;
    for (size_t i = 0; i < n; i++) d += memcmp(&a[i], &b[i], sizeof(float)) != 0;
    return d;
}

static void check_shape(int T, int in, int out, zs_dtype wdt, int exact) {
    size_t nx = (size_t)T * in, ny = (size_t)T * out, nw = (size_t)in * out;
    float *x = malloc(nx * 4), *dy = malloc(ny * 4), *Wf = malloc(nw * 4), *W = malloc(nw * 4);
    float *dx = malloc(nx * 4), *dW = malloc(nw * 4), *db = malloc((size_t)out * 4);
    float *rdx = malloc(nx * 4), *rdW = malloc(nw * 4), *rdb = malloc((size_t)out * 4);
    float *ws = malloc((size_t)ZS_MATMUL_BWD_BLOCK * in * 4);
    for (size_t i = 0; i < nx; i++) x[i] = frand();
    for (size_t i = 0; i < ny; i++) dy[i] = frand();
    for (size_t i = 0; i < nw; i++) Wf[i] = frand();
    zs_convert(W, wdt, Wf, ZS_F32, nw);
    zs_to_f32(Wf, W, wdt, nw); /* the reference uses the stored values */
    /* the gradients accumulate: start from values already there */
    for (size_t i = 0; i < nx; i++) dx[i] = rdx[i] = frand();
    for (size_t i = 0; i < nw; i++) dW[i] = rdW[i] = frand();
    for (int i = 0; i < out; i++) db[i] = rdb[i] = frand();
    float *dx0 = malloc(nx * 4), *dW0 = malloc(nw * 4);
    memcpy(dx0, dx, nx * 4);
    memcpy(dW0, dW, nw * 4);

    zs_op_matmul_bwd(dx, dW, db, dy, x, W, wdt, T, in, out, ws);
    ref_update(rdx, T, in, out, dy, (size_t)out, 1, Wf);
    ref_update(rdW, out, in, T, dy, 1, (size_t)out, x);
    for (int o = 0; o < out; o++) {
        double s = 0;
        for (int t = 0; t < T; t++) s += dy[(size_t)t * out + o];
        rdb[o] += (float)s;
    }
    const char *dn = zs_dtype_name(wdt);
    CHECK(count_diff(dx, rdx, nx) == 0, "T=%d %dx%d %s: dx bits = the fixed-order loop (%d differ)", T, in, out, dn,
          count_diff(dx, rdx, nx));
    CHECK(count_diff(dW, rdW, nw) == 0, "T=%d %dx%d %s: dW bits = the fixed-order loop (%d differ)", T, in, out, dn,
          count_diff(dW, rdW, nw));
    CHECK(count_diff(db, rdb, (size_t)out) == 0, "T=%d %dx%d %s: db bits = the fixed-order loop", T, in, out, dn);

    /* and close to the exact sums (in the first process only) */
    double ex = 0, ew = 0;
    for (int t = 0; t < T && exact; t++)
        for (int i = 0; i < in; i++) {
            double s = dx0[(size_t)t * in + i];
            for (int o = 0; o < out; o++) s += (double)dy[(size_t)t * out + o] * Wf[(size_t)o * in + i];
            ex = fmax(ex, fabs(s - dx[(size_t)t * in + i]) / (1 + fabs(s)));
        }
    for (int o = 0; o < out && exact; o++)
        for (int i = 0; i < in; i++) {
            double s = dW0[(size_t)o * in + i];
            for (int t = 0; t < T; t++) s += (double)dy[(size_t)t * out + o] * x[(size_t)t * in + i];
            ew = fmax(ew, fabs(s - dW[(size_t)o * in + i]) / (1 + fabs(s)));
        }
    CHECK(ex < 1e-5 && ew < 1e-5, "T=%d %dx%d %s: error vs double %.3g (dx), %.3g (dW)", T, in, out, dn, ex, ew);

    /* NULL outputs are skipped, the others unchanged by that */
    memcpy(rdW, dW, nw * 4);
    zs_op_matmul_bwd(NULL, dW, NULL, dy, x, W, wdt, 0, in, out, ws);
    CHECK(count_diff(dW, rdW, nw) == 0, "T=0: nothing changes");
    free(x); free(dy); free(Wf); free(W); free(dx); free(dW); free(db); free(rdx); free(rdW); free(rdb);
    free(ws); free(dx0); free(dW0);
}

static void run_checks(int exact) {
    /* small (on the calling thread), odd tails of 6 rows / 16 and 8 columns, and larger ones on
     * the pool with packed tiles, more than one block of k (T > 256, out > 256) */
    int shapes[][3] = {{1, 1, 1},     {3, 5, 7},      {37, 45, 23},   {64, 64, 64},  {130, 96, 300},
                       {300, 200, 130}, {290, 264, 270}, {97, 1000, 40}, {260, 33, 1100}};
    zs_dtype dts[] = {ZS_F32, ZS_F16, ZS_BF16};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int d = 0; d < 3; d++) check_shape(shapes[s][0], shapes[s][1], shapes[s][2], dts[d], exact);
}

int main(int argc, char **argv) {
    (void)argv;
    run_checks(argc < 2);
    if (argc < 2) {
        /* the same bits with one thread and with three */
        char self[4096];
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        CHECK(n > 0, "readlink /proc/self/exe");
        if (n > 0) {
            self[n] = 0;
            const char *threads[] = {"1", "3"};
            for (int i = 0; i < 2; i++) {
                char cmd[4300];
                snprintf(cmd, sizeof cmd, "ZS_THREADS=%s '%s' child", threads[i], self);
                int rc = system(cmd);
                CHECK(rc == 0, "ZS_THREADS=%s: the same checks pass (exit %d)", threads[i], rc);
            }
        }
    }
    return tu_finish(argc < 2 ? "test-matmul-bwd" : "test-matmul-bwd (child)");
}
