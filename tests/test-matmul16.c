/* test-matmul16.c — the matrix product over bf16 and f16 weights (zs_op_matmul, kernels in
 * kernels/cpu/matmul-16-kern.h), for odd shapes (in not a multiple of 8, out not a multiple of
 * 4, T = 1..37, on both sides of the pool threshold): every result BIT FOR BIT equal to a scalar
 * loop of the documented order (8 lanes of fused multiply-adds over k ≡ l mod 8, the fixed
 * pairwise lane sum, the k tail fused in order), whatever the batch size and the position of the
 * row in the call; the generic, AVX2 and AVX-512 kernels each equal to that loop; the AVX2 16-bit
 * kernel equal to the f32 AVX2 kernel over the widened weights; and close to a double-precision
 * reference. Then the same checks in child processes with ZS_THREADS=1, 2 and 3, whose results
 * must also hash alike. */
#include "common.h"
#include "matmul-16.h"
#include "ops.h"
#include "testutil.h"

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static float frand(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (float)((rng >> 11) * 0x1.0p-53) - 0.5f;
}

#define TMAX 37

/* the documented order, one element at a time */
static float ref_dot(const float *w, const float *x, int in) {
    int k8 = in & ~7;
    float a[8] = {0};
    for (int k = 0; k < k8; k++) a[k % 8] = fmaf(w[k], x[k], a[k % 8]);
    float s = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
    for (int k = k8; k < in; k++) s = fmaf(w[k], x[k], s);
    return s;
}

/* another order (one chain over k): must differ somewhere, or the bit checks would prove nothing */
static float seq_dot(const float *w, const float *x, int in) {
    float s = 0;
    for (int k = 0; k < in; k++) s = fmaf(w[k], x[k], s);
    return s;
}

static int count_diff(const float *a, const float *b, size_t n) {
    int d = 0;
    for (size_t i = 0; i < n; i++) d += memcmp(&a[i], &b[i], sizeof(float)) != 0;
    return d;
}

static uint64_t hash = 1469598103934665603ull; /* FNV-1a over every result of the run */
static void hash_bytes(const void *p, size_t n) {
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++) { hash ^= c[i]; hash *= 1099511628211ull; }
}

static int has_avx2(zs_dtype wdt) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           (wdt == ZS_BF16 || __builtin_cpu_supports("f16c"));
}

static void check_shape(int in, int out, zs_dtype wdt, int exact) {
    const char *dn = zs_dtype_name(wdt);
    size_t nw = (size_t)in * out;
    float *Wf = malloc(nw * 4), *x = malloc((size_t)TMAX * in * 4);
    uint16_t *W = malloc(nw * 2);
    float *ref = malloc((size_t)TMAX * out * 4), *y = malloc((size_t)TMAX * out * 4);
    float *y2 = malloc((size_t)TMAX * out * 4), *b = malloc((size_t)out * 4);
    for (size_t i = 0; i < nw; i++) Wf[i] = frand();
    for (size_t i = 0; i < (size_t)TMAX * in; i++) x[i] = frand();
    for (int i = 0; i < out; i++) b[i] = frand();
    zs_convert(W, wdt, Wf, ZS_F32, nw);
    zs_to_f32(Wf, W, wdt, nw); /* the references use the stored values */
    int seqdiff = 0;
    for (int t = 0; t < TMAX; t++)
        for (int j = 0; j < out; j++) {
            const float *wr = Wf + (size_t)j * in, *xr = x + (size_t)t * in;
            ref[(size_t)t * out + j] = ref_dot(wr, xr, in);
            float q = seq_dot(wr, xr, in);
            seqdiff += memcmp(&q, &ref[(size_t)t * out + j], 4) != 0;
        }

    /* the whole batch, then every batch size from the start and from offsets, and rows alone */
    zs_op_matmul(y, x, TMAX, in, W, wdt, out, NULL);
    hash_bytes(y, (size_t)TMAX * out * 4);
    CHECK(count_diff(y, ref, (size_t)TMAX * out) == 0, "%dx%d %s T=%d: bits = the documented loop (%d differ)", in,
          out, dn, TMAX, count_diff(y, ref, (size_t)TMAX * out));
    int bad = 0;
    for (int T = 1; T < TMAX; T++) {
        zs_op_matmul(y2, x, T, in, W, wdt, out, NULL);
        bad += count_diff(y2, ref, (size_t)T * out);
        int off = (T * 7) % (TMAX - T + 1);
        zs_op_matmul(y2, x + (size_t)off * in, T, in, W, wdt, out, NULL);
        bad += count_diff(y2, ref + (size_t)off * out, (size_t)T * out);
        hash_bytes(y2, (size_t)T * out * 4);
    }
    for (int t = 0; t < TMAX; t++) {
        zs_op_matmul(y2, x + (size_t)t * in, 1, in, W, wdt, out, NULL);
        bad += count_diff(y2, ref + (size_t)t * out, (size_t)out);
    }
    CHECK(bad == 0, "%dx%d %s: every T split gives the same bits (%d differ)", in, out, dn, bad);

    /* with a bias: the product's bits, then + b */
    zs_op_matmul(y2, x, TMAX, in, W, wdt, out, b);
    bad = 0;
    for (int t = 0; t < TMAX; t++)
        for (int j = 0; j < out; j++) {
            float e = ref[(size_t)t * out + j] + b[j];
            bad += memcmp(&e, &y2[(size_t)t * out + j], 4) != 0;
        }
    CHECK(bad == 0, "%dx%d %s: with a bias (%d differ)", in, out, dn, bad);

    /* each build's kernel on its own, over the whole matrix as one block */
    zs_matmul_block16_fn gen = wdt == ZS_BF16 ? zs_matmul_block_bf16_generic : zs_matmul_block_f16_generic;
    memset(y2, 0, (size_t)TMAX * out * 4);
    gen(y2, out, x, TMAX, in, W, out);
    CHECK(count_diff(y2, ref, (size_t)TMAX * out) == 0, "%dx%d %s: the generic kernel = the documented loop (%d differ)",
          in, out, dn, count_diff(y2, ref, (size_t)TMAX * out));
    for (int t = 0; t < 3; t++) gen(y2 + (size_t)t * out, out, x + (size_t)t * in, 1, in, W, out); /* its T = 1 tiles */
    CHECK(count_diff(y2, ref, (size_t)3 * out) == 0, "%dx%d %s: the generic kernel at T=1 = the documented loop (%d differ)",
          in, out, dn, count_diff(y2, ref, (size_t)3 * out));
    if (has_avx2(wdt)) {
        zs_matmul_block16_fn avx = wdt == ZS_BF16 ? zs_matmul_block_bf16_avx2 : zs_matmul_block_f16_avx2;
        memset(y2, 0, (size_t)TMAX * out * 4);
        avx(y2, out, x, TMAX, in, W, out);
        CHECK(count_diff(y2, ref, (size_t)TMAX * out) == 0, "%dx%d %s: the AVX2 kernel = the documented loop (%d differ)",
              in, out, dn, count_diff(y2, ref, (size_t)TMAX * out));
        for (int t = 0; t < 3; t++) avx(y2 + (size_t)t * out, out, x + (size_t)t * in, 1, in, W, out);
        CHECK(count_diff(y2, ref, (size_t)3 * out) == 0, "%dx%d %s: the AVX2 kernel at T=1 = the documented loop (%d differ)",
              in, out, dn, count_diff(y2, ref, (size_t)3 * out));
        CHECK(zs_matmul_pick16(wdt) == (zs_matmul_has_avx512() ? (wdt == ZS_BF16 ? zs_matmul_block_bf16_avx512
                                                                               : zs_matmul_block_f16_avx512)
                                                             : avx),
              "%s: zs_op_matmul runs the widest kernel on this CPU", dn);
        /* the f32 AVX2 kernel over the widened weights: the same order */
        memset(y2, 0, (size_t)TMAX * out * 4);
        zs_matmul_block_avx2(y2, out, x, TMAX, in, Wf, out);
        CHECK(count_diff(y2, ref, (size_t)TMAX * out) == 0, "%dx%d %s: = the f32 AVX2 kernel on the widened weights (%d differ)",
              in, out, dn, count_diff(y2, ref, (size_t)TMAX * out));
        if (zs_matmul_has_avx512()) { /* its 4 × 4 tile, and the f32 AVX-512 kernel */
            zs_matmul_block16_fn w = wdt == ZS_BF16 ? zs_matmul_block_bf16_avx512 : zs_matmul_block_f16_avx512;
            memset(y2, 0, (size_t)TMAX * out * 4);
            w(y2, out, x, TMAX, in, W, out);
            CHECK(count_diff(y2, ref, (size_t)TMAX * out) == 0,
                  "%dx%d %s: the AVX-512 kernel = the documented loop (%d differ)", in, out, dn,
                  count_diff(y2, ref, (size_t)TMAX * out));
            memset(y2, 0, (size_t)TMAX * out * 4);
            zs_matmul_block_avx512(y2, out, x, TMAX, in, Wf, out);
            CHECK(count_diff(y2, ref, (size_t)TMAX * out) == 0,
                  "%dx%d %s: = the f32 AVX-512 kernel on the widened weights (%d differ)", in, out, dn,
                  count_diff(y2, ref, (size_t)TMAX * out));
        }
    } else if (exact) {
        fprintf(stderr, "note: no AVX2/FMA%s here, only the generic %s kernel is checked\n", wdt == ZS_F16 ? "/F16C" : "", dn);
    }
    if (in >= 64 && out >= 64)
        CHECK(seqdiff > 0, "%dx%d %s: another order gives other bits somewhere, so the checks can see one", in, out, dn);

    /* and close to the exact sums (in the first process only) */
    double err = 0;
    for (int t = 0; t < TMAX && exact; t++)
        for (int j = 0; j < out; j++) {
            double s = 0;
            for (int k = 0; k < in; k++) s += (double)Wf[(size_t)j * in + k] * x[(size_t)t * in + k];
            err = fmax(err, fabs(s - y[(size_t)t * out + j]) / (1 + fabs(s)));
        }
    CHECK(err < 1e-5, "%dx%d %s: error %.3g vs double reference", in, out, dn, err);
    free(Wf); free(x); free(W); free(ref); free(y); free(y2); free(b);
}

static void run_checks(int exact) {
    /* small ones on the calling thread, and ones over the pool (out·in·T ≥ 2^20, and at T = 1
     * for 1029×1030) */
    int shapes[][2] = {{1, 1}, {7, 3}, {13, 5}, {9, 6}, {67, 31}, {300, 130}, {1029, 517}, {1029, 1030}, {2051, 66}};
    zs_dtype dts[] = {ZS_BF16, ZS_F16};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int d = 0; d < 2; d++) check_shape(shapes[s][0], shapes[s][1], dts[d], exact);
}

int main(int argc, char **argv) {
    int child = argc >= 2 && strcmp(argv[1], "child") == 0;
    run_checks(!child);
    if (child) {
        printf("%016llx\n", (unsigned long long)hash);
    } else {
        /* the same bits with one, two and three threads */
        char self[4096];
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        CHECK(n > 0, "readlink /proc/self/exe");
        if (n > 0) {
            self[n] = 0;
            const char *threads[] = {"1", "2", "3"};
            char hashes[3][64] = {{0}};
            for (int i = 0; i < 3; i++) {
                char cmd[4300];
                snprintf(cmd, sizeof cmd, "ZS_THREADS=%s '%s' child", threads[i], self);
                FILE *p = popen(cmd, "r");
                CHECK(p != NULL, "popen");
                if (!p) continue;
                if (!fgets(hashes[i], sizeof hashes[i], p)) hashes[i][0] = 0;
                int rc = pclose(p);
                CHECK(rc == 0, "ZS_THREADS=%s: the same checks pass (exit %d)", threads[i], rc);
            }
            char mine[64];
            snprintf(mine, sizeof mine, "%016llx\n", (unsigned long long)hash);
            for (int i = 0; i < 3; i++)
                CHECK(strcmp(hashes[i], mine) == 0, "ZS_THREADS=%s: the results hash alike (%s vs %s)", threads[i],
                      hashes[i], mine);
        }
    }
    return tu_finish(child ? "test-matmul16 (child)" : "test-matmul16");
}
