/* test-quant.c — quantized weights, Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 (tensor.h, kernels/cpu/matmul-quant-kern.h,
 * model.c packing): the quantizers give the bytes of ggml's reference quantizers
 * (tests/ref/q8_0-ref.bin, q4_0-, q4_1-, q5_0-, q5_1-ref.bin, written by tests/ref/make_q8_ref.py
 * with the gguf package), and for Q4_1/Q5_0/Q5_1 the dequantizer gives the package's
 * dequantized values bit for bit; dequantize(quantize(x)) is within the step bound of x (Q8_0,
 * Q4_1, Q5_1 d/2, Q4_0, Q5_0 |d|, plus the f16 rounding of d and m); the matmul equals a scalar loop of the order matmul-quant-kern.h documents
 * bit for bit, in the generic and the AVX2 build, a row alone and in a batch, and (re-executed
 * with ZS_THREADS=1/2/3) whatever the thread count. Through the engine, stories260K with
 * --weight-dtype q8_0: the greedy ids of the reference prompts (how many of 64 match the f32
 * reference; the first 8 must), logits within 0.3 of the f32 reference (q4_0: reported, within
 * 6; q4_1, q5_0, q5_1 likewise), bitwise the same logits for ranks 1-3 and offload none/cpu/nvme; a generated untied model
 * gathers about 34/128 (q4_0: 18/128, q4_1 20/128, q5_0 22/128, q5_1 24/128) of the f32 bytes per
 * decode step; training refuses a
 * quantized engine; a Q8_0 (Q4_0, Q4_1, Q5_0, Q5_1) GGUF of stories260K, written here from the f32 one with our
 * quantizer, gives, as stored, the logits of --weight-dtype q8_0 (q4_0) on the safetensors
 * directory bit for bit. The K-quants Q4_K, Q6_K, Q5_K, Q3_K and Q2_K: the dequantizer gives the
 * gguf package's values of random super-blocks (tests/ref/q4_k-, q6_k-, q5_k-, q3_k-, q2_k-ref.bin)
 * bit for bit (and through zs_convert to f32, bf16 and Q8_0), and the kernels the scalar loop's
 * bits as above (their quantizers and --weight-dtype q4_k .. q2_k / q4_k_m: tests/test-quant-k.c).
 * With a CUDA device: the CUDA engine runs stories260K at q8_0 and q5_1, its logits of 4 tokens
 * within 0.5 of the CPU engine's (tests/test-backend-ops.c checks the kernels themselves). */
#include <ctype.h>

#include "backend.h"
#include "common.h"
#include "device.h"
#include "engine.h"
#include "gguf.h"
#include "init-model.h"
#include "matmul-16.h"
#include "matmul-q8act.h"
#include "ops.h"
#include "ref.h"
#include "testutil.h"
#include "train.h"

static uint32_t g_rng = 12345;
static float frand(void) { /* uniform in [-1, 1) */
    g_rng = g_rng * 1664525u + 1013904223u;
    return (float)((g_rng >> 8) & 0xffffff) / 8388608.0f - 1.0f;
}

/* ---- the quantizer against ggml's bytes ---- */

static void quantize(zs_dtype dt, void *dst, const float *x, size_t n) {
    int rc = zs_quantize(dt, dst, x, n);
    CHECK(rc == 0, "quantize %s: %s", zs_dtype_name(dt), zs_errmsg());
}

/* per block format: its reference file and magic, its generic and AVX2 kernels, the GGUF type */
static const struct {
    zs_dtype dt;
    const char *path, *magic;
    zs_matmul_blockq8_fn gen, avx;
    uint32_t ggml;
} QT[] = {
    {ZS_Q8_0, "tests/ref/q8_0-ref.bin", "ZSQ8", zs_matmul_block_q8_0_generic, zs_matmul_block_q8_0_avx2, ZS_GGML_Q8_0},
    {ZS_Q4_0, "tests/ref/q4_0-ref.bin", "ZSQ4", zs_matmul_block_q4_0_generic, zs_matmul_block_q4_0_avx2, ZS_GGML_Q4_0},
    {ZS_Q4_1, "tests/ref/q4_1-ref.bin", "ZS41", zs_matmul_block_q4_1_generic, zs_matmul_block_q4_1_avx2, ZS_GGML_Q4_1},
    {ZS_Q5_0, "tests/ref/q5_0-ref.bin", "ZS50", zs_matmul_block_q5_0_generic, zs_matmul_block_q5_0_avx2, ZS_GGML_Q5_0},
    {ZS_Q5_1, "tests/ref/q5_1-ref.bin", "ZS51", zs_matmul_block_q5_1_generic, zs_matmul_block_q5_1_avx2, ZS_GGML_Q5_1},
    /* K-quants: their files hold random super-blocks and the dequantized values (the quantizer: test-quant-k.c) */
    {ZS_Q4_K, "tests/ref/q4_k-ref.bin", "ZS4K", zs_matmul_block_q4_k_generic, zs_matmul_block_q4_k_avx2, ZS_GGML_Q4_K},
    {ZS_Q6_K, "tests/ref/q6_k-ref.bin", "ZS6K", zs_matmul_block_q6_k_generic, zs_matmul_block_q6_k_avx2, ZS_GGML_Q6_K},
    {ZS_Q5_K, "tests/ref/q5_k-ref.bin", "ZS5K", zs_matmul_block_q5_k_generic, zs_matmul_block_q5_k_avx2, ZS_GGML_Q5_K},
    {ZS_Q3_K, "tests/ref/q3_k-ref.bin", "ZS3K", zs_matmul_block_q3_k_generic, zs_matmul_block_q3_k_avx2, ZS_GGML_Q3_K},
    {ZS_Q2_K, "tests/ref/q2_k-ref.bin", "ZS2K", zs_matmul_block_q2_k_generic, zs_matmul_block_q2_k_avx2, ZS_GGML_Q2_K},
};
#define NQT (int)(sizeof QT / sizeof QT[0])
static int qt_index(zs_dtype dt) {
    for (int i = 0; i < NQT; i++) if (QT[i].dt == dt) return i;
    return 0;
}

/* where a K-quant super-block keeps its f16 d and dmin (-1: none) */
static void kblock_f16s(zs_dtype dt, int *od, int *om) {
    *od = dt == ZS_Q6_K ? 208 : dt == ZS_Q3_K ? 108 : dt == ZS_Q2_K ? 80 : 0;
    *om = dt == ZS_Q4_K || dt == ZS_Q5_K ? 2 : dt == ZS_Q2_K ? 82 : -1;
}

/* K-quant super-blocks for the kernel checks: random bytes, the f16 scales set to small values */
static void make_kblocks(zs_dtype dt, uint8_t *W, size_t n) {
    size_t bb = zs_dtype_size(dt);
    int od, om;
    kblock_f16s(dt, &od, &om);
    for (size_t i = 0; i < zs_dtype_bytes(dt, n); i++) W[i] = (uint8_t)(frand() * 128 + 128);
    for (size_t b = 0; b < n / 256; b++) {
        uint16_t d = zs_f32_to_f16(frand() * 0.002f), dm = zs_f32_to_f16(frand() * 0.004f);
        memcpy(W + b * bb + od, &d, 2);
        if (om >= 0) memcpy(W + b * bb + om, &dm, 2);
    }
}

/* a K-quant reference file: the gguf package's dequantized values of its super-blocks, bit for bit */
static void check_kreference(zs_dtype dt) {
    int qi = qt_index(dt);
    const char *path = QT[qi].path, *dn = zs_dtype_name(dt);
    size_t bb = zs_dtype_size(dt);
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL, "open %s (run from the repository root)", path);
    if (!f) return;
    char magic[4];
    uint32_t nb = 0;
    int ok = fread(magic, 1, 4, f) == 4 && !memcmp(magic, QT[qi].magic, 4) && fread(&nb, 4, 1, f) == 1 && nb > 0 &&
             nb < 100000;
    size_t n = (size_t)nb * 256;
    uint8_t *q = ok ? malloc(nb * bb) : NULL, *q8 = ok ? malloc(zs_dtype_bytes(ZS_Q8_0, n)) : NULL;
    uint8_t *q8w = ok ? malloc(zs_dtype_bytes(ZS_Q8_0, n)) : NULL;
    float *want = ok ? malloc(n * 4) : NULL, *got = ok ? malloc(n * 4) : NULL;
    uint16_t *h = ok ? malloc(n * 2) : NULL;
    ok = ok && fread(q, bb, nb, f) == nb && fread(want, 4, n, f) == n;
    fclose(f);
    CHECK(ok, "%s: reference header and body", path);
    if (ok) {
        zs_to_f32(got, q, dt, n);
        int bad = -1;
        for (size_t i = 0; i < n && bad < 0; i++)
            if (memcmp(&got[i], &want[i], 4)) bad = (int)i;
        CHECK(bad < 0, "%s: dequantize gives the reference dequantizer's bits (%u super-blocks; first difference at %d)",
              dn, nb, bad);
        memset(got, 0, n * 4);
        zs_convert(got, ZS_F32, q, dt, n);
        CHECK(!memcmp(got, want, n * 4), "zs_convert %s -> f32 is the same", dn);
        zs_convert(h, ZS_BF16, q, dt, n);
        int same = 1;
        for (size_t i = 0; i < n; i++) same &= h[i] == zs_f32_to_bf16(want[i]);
        CHECK(same, "%s -> bf16 is bf16(dequantize)", dn);
        zs_convert(q8, ZS_Q8_0, q, dt, n);
        zs_quantize_q8_0(q8w, want, n);
        CHECK(!memcmp(q8, q8w, zs_dtype_bytes(ZS_Q8_0, n)), "%s -> Q8_0 is quantize(dequantize)", dn);
    }
    size_t want_bb = dt == ZS_Q4_K ? 144 : dt == ZS_Q6_K ? 210 : dt == ZS_Q5_K ? 176 : dt == ZS_Q3_K ? 110 : 84;
    CHECK(zs_dtype_block(dt) == 256 && zs_dtype_size(dt) == want_bb &&
              zs_dtype_bytes(dt, 512) == 2 * zs_dtype_size(dt) && zs_dtype_is_quant(dt) && zs_dtype_can_quantize(dt),
          "%s super-block sizes", dn);
    char lower[8];
    zs_dtype pd;
    snprintf(lower, sizeof lower, "%s", dn);
    for (char *p = lower; *p; p++) *p = (char)tolower((unsigned char)*p);
    CHECK(zs_dtype_parse(lower, &pd) == 0 && pd == dt && zs_dtype_parse(dn, &pd) == 0 && pd == dt, "%s and %s parse",
          lower, dn);
    free(q); free(q8); free(q8w); free(want); free(got); free(h);
}

static void check_reference(zs_dtype dt) {
    if (zs_dtype_block(dt) == ZS_QK_K) { check_kreference(dt); return; }
    int q8 = dt == ZS_Q8_0, qi = qt_index(dt);
    /* with a min (Q4_1, Q5_1): the step is (max - min) / nmax, else |d| (d = amax/127, max/-8, max/-16) */
    int has_min = dt == ZS_Q4_1 || dt == ZS_Q5_1, nmax = dt == ZS_Q8_0 ? 127 : dt == ZS_Q4_0 ? 8 : dt == ZS_Q5_0 ? 16
                                                                           : dt == ZS_Q4_1 ? 15 : 31;
    const char *path = QT[qi].path, *dn = zs_dtype_name(dt);
    size_t bb = zs_dtype_size(dt);
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL, "open %s (run from the repository root)", path);
    if (!f) return;
    char magic[4];
    uint32_t nb = 0;
    int ok = fread(magic, 1, 4, f) == 4 && !memcmp(magic, QT[qi].magic, 4) && fread(&nb, 4, 1, f) == 1 &&
             nb > 0 && nb < 100000;
    CHECK(ok, "%s: reference header", path);
    if (!ok) { fclose(f); return; }
    size_t n = (size_t)nb * 32;
    float *x = malloc(n * 4), *y = malloc(n * 4);
    uint8_t *want = malloc((size_t)nb * bb), *got = malloc((size_t)nb * bb);
    float *yref = malloc(n * 4);
    ok = fread(x, 4, n, f) == n && fread(want, bb, nb, f) == nb && (dt < ZS_Q4_1 || fread(yref, 4, n, f) == n);
    fclose(f);
    CHECK(ok, "%s: reference body", path);
    if (ok) {
        memset(got, 0xAA, (size_t)nb * bb);
        quantize(dt, got, x, n);
        int bad = -1;
        for (uint32_t b = 0; b < nb && bad < 0; b++)
            if (memcmp(got + b * bb, want + b * bb, bb)) bad = (int)b;
        CHECK(bad < 0, "%s: the bytes of ggml's reference quantizer (%u blocks; first difference in block %d)", dn, nb, bad);
        memset(got, 0, (size_t)nb * bb);
        zs_convert(got, dt, x, ZS_F32, n);
        CHECK(!memcmp(got, want, (size_t)nb * bb), "zs_convert f32 -> %s quantizes the same", dn);
        /* dequantize: Q8_0 within d/2 of x, Q4_0 within |d| (the clipped end: -max becomes 7d),
         * plus the f16 rounding of d times the largest |q| */
        zs_to_f32(y, want, dt, n);
        if (dt >= ZS_Q4_1) /* the gguf package's dequantizer (ggml's dequantize_row_*), bit for bit */
            CHECK(!memcmp(y, yref, n * 4), "%s: dequantize gives the reference dequantizer's bits", dn);
        double worst = 0;
        int over = 0;
        for (uint32_t b = 0; b < nb; b++) {
            float amax = 0, max = 0, mn = x[b * 32], mx = x[b * 32];
            for (int j = 0; j < 32; j++) {
                if (amax < fabsf(x[b * 32 + j])) { amax = fabsf(x[b * 32 + j]); max = x[b * 32 + j]; }
                mn = fminf(mn, x[b * 32 + j]);
                mx = fmaxf(mx, x[b * 32 + j]);
            }
            double d = q8 ? amax / 127.0 : has_min ? ((double)mx - mn) / nmax : fabs(max / (double)-nmax);
            double dh = fabs(zs_f16_to_f32(zs_f32_to_f16((float)d)));
            /* with a min: the f16 rounding of min, and a few f32 roundings of the values' size */
            double mh = has_min ? fabs((double)zs_f16_to_f32(zs_f32_to_f16(mn)) - mn) + 4e-7 * fmax(amax, 1e-38) : 0;
            for (int j = 0; j < 32; j++) {
                double e = fabs((double)y[b * 32 + j] - x[b * 32 + j]);
                double bound = (q8 || has_min ? 0.5 : 1.0) * d * (1 + 1e-6) + nmax * fabs(dh - d) + mh + 1e-30;
                if (e > bound) over++;
                if (dh >= 6.103515625e-5) worst = fmax(worst, e / amax); /* normal f16 d (a subnormal one rounds coarsely, as in ggml) */
            }
        }
        CHECK(over == 0, "%s: dequantize(quantize(x)) within the step bound of x (%d over)", dn, over);
        fprintf(stderr, "test-quant: %s round trip: worst |error| / max|x| of a block = %.4g\n", dn, worst);
        /* f16 and bf16 sources go through f32 */
        uint16_t *h = malloc(n * 2);
        float *hf = malloc(n * 4);
        zs_convert(h, ZS_BF16, x, ZS_F32, n);
        zs_to_f32(hf, h, ZS_BF16, n);
        quantize(dt, want, hf, n);
        zs_convert(got, dt, h, ZS_BF16, n);
        CHECK(!memcmp(got, want, (size_t)nb * bb), "bf16 -> %s is quantize(widen(bf16))", dn);
        zs_convert(hf, ZS_F32, got, dt, n);
        zs_convert(h, ZS_F16, got, dt, n);
        int same = 1;
        for (size_t i = 0; i < n; i++) same &= zs_f32_to_f16(hf[i]) == h[i];
        CHECK(same, "%s -> f16 is f16(dequantize)", dn);
        free(h);
        free(hf);
    }
    CHECK(zs_dtype_block(ZS_Q8_0) == 32 && zs_dtype_size(ZS_Q8_0) == 34 && zs_dtype_bytes(ZS_Q8_0, 64) == 68 &&
              zs_dtype_block(ZS_Q4_0) == 32 && zs_dtype_bytes(ZS_Q4_0, 64) == 36 &&
              zs_dtype_bytes(ZS_BF16, 64) == 128 && zs_dtype_block(ZS_F32) == 1,
          "block sizes");
    CHECK(zs_dtype_size(ZS_Q4_1) == 20 && zs_dtype_size(ZS_Q5_0) == 22 && zs_dtype_size(ZS_Q5_1) == 24 &&
              zs_dtype_block(ZS_Q5_1) == 32 && zs_dtype_bytes(ZS_Q5_0, 96) == 66 && zs_dtype_is_quant(ZS_Q4_1) &&
              !zs_dtype_is_quant(ZS_BF16),
          "Q4_1/Q5_0/Q5_1 block sizes");
    zs_dtype pd;
    char lower[8];
    snprintf(lower, sizeof lower, "%s", dn);
    for (char *p = lower; *p; p++) *p = (char)tolower((unsigned char)*p);
    CHECK(zs_dtype_parse(lower, &pd) == 0 && pd == dt, "%s parses", lower);
    free(x); free(y); free(want); free(got); free(yref);
}

/* ---- the kernel against the documented order ---- */

/* the documented order over the weights as tensor.c dequantizes them */
static void scalar_q(float *y, const float *x, int T, int in, const float *Wd, int out) {
    for (int t = 0; t < T; t++)
        for (int j = 0; j < out; j++) {
            float a[8] = {0};
            for (int k = 0; k < in; k++) a[k % 8] = fmaf(Wd[(size_t)j * in + k], x[(size_t)t * in + k], a[k % 8]);
            y[(size_t)t * out + j] = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
        }
}

static void check_matmul(zs_dtype dt, int T, int in, int out) {
    const char *dn = zs_dtype_name(dt);
    size_t nw = (size_t)out * in;
    float *Wf = malloc(nw * 4), *Wd = malloc(nw * 4), *x = malloc((size_t)T * in * 4);
    uint8_t *W = malloc(zs_dtype_bytes(dt, nw));
    float *y = malloc((size_t)T * out * 4), *ref = malloc((size_t)T * out * 4), *y1 = malloc((size_t)out * 4);
    for (size_t i = 0; i < nw; i++) Wf[i] = frand() * (i % 97 == 0 ? 4.0f : 0.05f);
    for (size_t i = 0; i < (size_t)T * in; i++) x[i] = frand();
    if (zs_dtype_block(dt) == ZS_QK_K) make_kblocks(dt, W, nw); /* random super-blocks: every bit pattern */
    else quantize(dt, W, Wf, nw);
    zs_to_f32(Wd, W, dt, nw);
    scalar_q(ref, x, T, in, Wd, out);
    zs_op_matmul(y, x, T, in, W, dt, out, NULL);
    CHECK(!memcmp(y, ref, (size_t)T * out * 4), "%s matmul T=%d %dx%d: the scalar loop's bits", dn, T, in, out);
    QT[qt_index(dt)].gen(y, out, x, T, in, W, out);
    CHECK(!memcmp(y, ref, (size_t)T * out * 4), "%s generic kernel T=%d %dx%d: the scalar loop's bits", dn, T, in, out);
    __builtin_cpu_init();
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    if (avx2) {
        QT[qt_index(dt)].avx(y, out, x, T, in, W, out);
        CHECK(!memcmp(y, ref, (size_t)T * out * 4), "%s AVX2 kernel T=%d %dx%d: the scalar loop's bits", dn, T, in, out);
        /* the f32 kernel over the dequantized weights, as its AVX2 build runs it */
        zs_op_matmul(y, x, T, in, Wd, ZS_F32, out, NULL);
        CHECK(!memcmp(y, ref, (size_t)T * out * 4), "%s T=%d %dx%d: the f32 product over the dequantized weights", dn,
              T, in, out);
    }
    int bad = 0;
    for (int t = 0; t < T; t++) {
        zs_op_matmul(y1, x + (size_t)t * in, 1, in, W, dt, out, NULL);
        bad += memcmp(y1, ref + (size_t)t * out, (size_t)out * 4) != 0;
    }
    CHECK(bad == 0, "%s matmul T=%d %dx%d: a row alone is its row in the batch (%d differ)", dn, T, in, out, bad);
    /* the arithmetic: close to the exact product over the dequantized weights */
    int far = 0;
    for (int t = 0; t < T; t++)
        for (int j = 0; j < out; j++) {
            double s = 0, a = 0;
            for (int k = 0; k < in; k++) {
                double p = (double)Wd[(size_t)j * in + k] * x[(size_t)t * in + k];
                s += p;
                a += fabs(p);
            }
            far += fabs(ref[(size_t)t * out + j] - s) > 1e-5 * a + 1e-30;
        }
    CHECK(far == 0, "%s T=%d %dx%d: within 1e-5·Σ|w·x| of the exact product (%d outside)", dn, T, in, out, far);
    free(Wf); free(Wd); free(x); free(W); free(y); free(ref); free(y1);
}

static void run_kernel_checks(void) {
    int shapes[][3] = {{1, 32, 1}, {1, 64, 13}, {3, 96, 37}, {7, 256, 100}, {1, 1024, 300}, {5, 1024, 300}, {9, 512, 1030}};
    int kshapes[][3] = {{1, 256, 1}, {1, 256, 13}, {3, 512, 37}, {7, 256, 100}, {1, 1024, 300}, {5, 1024, 300}, {9, 512, 1030}};
    for (int q = 0; q < NQT; q++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            int k = zs_dtype_block(QT[q].dt) == ZS_QK_K; /* K-quants: rows of whole super-blocks */
            check_matmul(QT[q].dt, k ? kshapes[s][0] : shapes[s][0], k ? kshapes[s][1] : shapes[s][1],
                         k ? kshapes[s][2] : shapes[s][2]);
        }
}

/* ---- through the engine ---- */

static const char *tier_name[] = {"none", "cpu", "nvme"};
static int g_lookup = 1; /* embed_lookup of the engines opened (inference layout) */

static int g_stage = 0; /* zero_optimization.stage of the engines opened (0: the default, 3) */

static int open_engine(const char *dir, int ranks, int tier, const char *nvme, zs_dtype wdt, zs_engine **e) {
    zs_engine_opts o;
    zs_engine_opts_default(&o);
    if (g_stage) o.zero_stage = g_stage;
    o.model_dir = dir;
    o.model.embed_lookup = g_lookup;
    o.model.weight_dtype = wdt;
    o.max_seqs = 2;
    o.max_batch_tokens = 256;
    o.ranks = ranks;
    o.gather.tier = tier;
    o.nvme_path = nvme;
    o.device = ZS_DEVICE_CPU;
    return zs_engine_open(&o, e);
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[b]) b = i;
    return b;
}

/* Prefills prompt (logits of every position into all, if given), then greedy-decodes n_new ids
 * (the logits of each step appended to all after the prompt's rows). */
static int greedy(zs_engine *e, const int32_t *prompt, int np, int n_new, int32_t *ids, float *all, int vocab) {
    zs_kvcache *kv = zs_engine_kv(e);
    int seq, rc;
    if ((rc = zs_kv_seq_open(kv, &seq)) < 0) return rc;
    int32_t pos[256], sq[256], li[256];
    for (int i = 0; i < np; i++) { pos[i] = i; sq[i] = seq; li[i] = i; }
    float *lg = malloc((size_t)(np + n_new) * vocab * 4);
    zs_batch b = {np, prompt, pos, sq, li, np, NULL, NULL, NULL};
    rc = zs_kv_seq_reserve(kv, seq, np + n_new);
    if (rc == 0) rc = zs_engine_forward(e, &b, lg);
    for (int t = 0; rc == 0 && t < n_new; t++) {
        const float *last = lg + (size_t)(np - 1 + t) * vocab;
        int32_t tok = argmax(last, vocab), p = np + t, l0 = 0;
        ids[t] = tok;
        if (t + 1 == n_new) break;
        zs_batch d = {1, &tok, &p, &seq, &l0, 1, NULL, NULL, NULL};
        rc = zs_engine_forward(e, &d, lg + (size_t)(np + t) * vocab);
    }
    if (all && rc == 0) memcpy(all, lg, (size_t)(np + n_new - 1) * vocab * 4);
    free(lg);
    zs_kv_seq_close(kv, seq);
    return rc;
}

static void check_stories(const char *nv, zs_dtype qt, int min_lead, double tol) {
    const char *dn = zs_dtype_name(qt);
    char dir[4096];
    tu_model_dir(dir, sizeof dir, "stories260K");
    json_t *ref = tu_load_reference(dir);
    CHECK(ref != NULL, "stories260K reference");
    if (!ref) return;
    json_t *cases = json_object_get(ref, "cases");
    zs_engine *e;
    int rc = open_engine(dir, 1, ZS_OFFLOAD_NONE, NULL, qt, &e);
    CHECK(rc == 0, "stories260K %s: open: %s", dn, zs_errmsg());
    if (rc < 0) { json_decref(ref); return; }
    const zs_model *m = zs_engine_model(e);
    const zs_bucket_layout *L = zs_model_layout(m, zs_bucket_layer(0));
    CHECK(L->slot[ZS_R_WQ].dtype == qt && L->slot[ZS_R_W_UP].dtype == qt, "rows of 64: %s", dn);
    CHECK(L->slot[ZS_R_W_DOWN].dtype == ZS_F16, "rows of 172 (not a multiple of 32): f16, as llama.cpp");
    CHECK(L->slot[ZS_R_ATTN_NORM_W].dtype == ZS_F32, "norms stay f32");
    int vocab = zs_model_config_get(m)->vocab_size;
    float *base = NULL;
    int base_rows = 0;
    int32_t base_prompt[256];
    int base_np = 0;
    for (size_t ci = 0; ci < json_array_size(cases); ci++) {
        json_t *c = json_array_get(cases, ci);
        int32_t prompt[256], want[256], got[256];
        int np = tu_ref_ids(json_object_get(c, "prompt_ids"), prompt, 256);
        int nn = tu_ref_ids(json_object_get(c, "new_ids"), want, 256);
        float *all = malloc((size_t)(np + nn) * vocab * 4);
        rc = greedy(e, prompt, np, nn, got, all, vocab);
        CHECK(rc == 0, "stories260K %s case %zu: greedy: %s", dn, ci, zs_errmsg());
        int same = 0, lead = 0;
        for (int i = 0; i < nn; i++) same += got[i] == want[i];
        while (lead < nn && got[lead] == want[lead]) lead++;
        json_t *lg = json_object_get(c, "logits");
        double maxd = 0;
        for (size_t p = 0; p < json_array_size(lg); p++)
            for (int v = 0; v < vocab; v++)
                maxd = fmax(maxd, fabs(all[p * vocab + v] - json_real_value(json_array_get(json_array_get(lg, p), v))));
        fprintf(stderr, "test-quant: stories260K %s case %zu (\"%s\"): %d of %d greedy ids equal the f32 reference, "
                "the first %d in a row; max |logit - f32 ref| over positions 0-%zu: %.3g\n",
                dn, ci, json_string_value(json_object_get(c, "prompt")), same, nn, lead, json_array_size(lg) - 1, maxd);
        CHECK(lead >= min_lead, "stories260K %s case %zu: the first %d greedy ids equal the reference (%d do)", dn, ci,
              min_lead, lead);
        CHECK(maxd < tol, "stories260K %s case %zu: logits within %.2g of the f32 reference (%.3g)", dn, ci, tol, maxd);
        if (ci == 0) {
            base = all;
            base_rows = np + nn - 1;
            base_np = np;
            memcpy(base_prompt, prompt, sizeof prompt);
        } else {
            free(all);
        }
    }
    zs_engine_free(e);
    /* ranks 1-3 x offload none/cpu/nvme: the same bits */
    size_t bytes = (size_t)base_rows * vocab * 4;
    float *lg = malloc(bytes);
    int32_t ids[256];
    for (int ranks = 1; base && ranks <= 3; ranks++)
        for (int tier = 0; tier < 3; tier++) {
            rc = open_engine(dir, ranks, tier, nv, qt, &e);
            CHECK(rc == 0, "stories260K %s ranks %d %s: open: %s", dn, ranks, tier_name[tier], zs_errmsg());
            if (rc < 0) continue;
            memset(lg, 0, bytes);
            rc = greedy(e, base_prompt, base_np, base_rows - base_np + 1, ids, lg, vocab);
            CHECK(rc == 0 && !memcmp(lg, base, bytes), "stories260K %s ranks %d %s: logits bitwise those of one rank",
                  dn, ranks, tier_name[tier]);
            zs_engine_free(e);
        }
    /* ZeRO stage 1 (every rank holds the whole bucket: replicated, not sharded) */
    g_stage = 1;
    rc = base ? open_engine(dir, 2, ZS_OFFLOAD_CPU, nv, qt, &e) : -1;
    g_stage = 0;
    CHECK(rc == 0, "stories260K %s stage 1: open: %s", dn, zs_errmsg());
    if (rc == 0) {
        memset(lg, 0, bytes);
        rc = greedy(e, base_prompt, base_np, base_rows - base_np + 1, ids, lg, vocab);
        CHECK(rc == 0 && !memcmp(lg, base, bytes), "stories260K %s stage 1, 2 ranks: logits bitwise those of stage 3", dn);
        zs_engine_free(e);
    }
    free(lg);
    free(base);
    json_decref(ref);
}

/* Rewrites the f32 GGUF at src as dst with every matrix whose rows are a multiple of 32 in
 * qt (our quantizer), the rest unchanged: the header is copied with each such tensor's type
 * and offset patched in place (same field sizes), the data laid out again. */
static zs_dtype g_qt_ffn = ZS_DTYPE_COUNT; /* if set: the ffn_* matrices in this type instead (a mixed file) */
static int write_quant_gguf(const char *src, const char *dst, zs_dtype qt0) {
    zs_gguf *g;
    if (zs_gguf_open(src, &g) < 0) return -1;
    FILE *f = fopen(src, "rb");
    size_t hl = zs_gguf_data_offset(g), al = zs_gguf_alignment(g), nt = zs_gguf_tensor_count(g);
    uint8_t *hdr = malloc(hl);
    int ok = f && hdr && fread(hdr, 1, hl, f) == hl;
    if (f) fclose(f);
    size_t cap = 0;
    for (size_t i = 0; i < nt; i++) cap += zs_gguf_tensor_at(g, i)->nbytes + al;
    uint8_t *data = calloc(1, cap + 1);
    size_t off = 0;
    for (size_t i = 0; ok && i < nt; i++) {
        const zs_gguf_tensor *t = zs_gguf_tensor_at(g, i);
        size_t ln = strlen(t->name), p = 0;
        for (size_t q = 8; q + ln <= hl && !p; q++) {
            uint64_t l;
            memcpy(&l, hdr + q - 8, 8);
            if (l == ln && !memcmp(hdr + q, t->name, ln)) p = q + ln;
        }
        ok = p > 0;
        if (!ok) break;
        int quant = t->type == ZS_GGML_F32 && t->n_dims == 2 && t->ne[0] % 32 == 0;
        /* matrices whose rows are not whole blocks fall back to F16, as llama-quantize's do */
        int half = t->type == ZS_GGML_F32 && t->n_dims == 2 && !quant;
        zs_dtype qt = g_qt_ffn != ZS_DTYPE_COUNT && strstr(t->name, "ffn_") ? g_qt_ffn : qt0;
        uint32_t type = quant ? QT[qt_index(qt)].ggml : half ? (uint32_t)ZS_GGML_F16 : (uint32_t)t->type;
        uint64_t o = off;
        memcpy(hdr + p + 4 + 8 * (size_t)t->n_dims, &type, 4);
        memcpy(hdr + p + 8 + 8 * (size_t)t->n_dims, &o, 8);
        size_t nb = quant ? zs_dtype_bytes(qt, t->nbytes / 4) : half ? t->nbytes / 2 : t->nbytes;
        if (quant) quantize(qt, data + off, t->data, t->nbytes / 4);
        else if (half) zs_convert(data + off, ZS_F16, t->data, ZS_F32, t->nbytes / 4);
        else memcpy(data + off, t->data, t->nbytes);
        off = ZS_ALIGN_UP(off + nb, al);
    }
    zs_gguf_close(g);
    f = ok ? fopen(dst, "wb") : NULL;
    ok = f && fwrite(hdr, 1, hl, f) == hl && fwrite(data, 1, off, f) == off;
    if (f && fclose(f) != 0) ok = 0;
    free(hdr);
    free(data);
    return ok ? 0 : -1;
}

static void check_gguf(const char *tmp, zs_dtype qt) {
    char dir[4096], src[4200], dst[4200], w0[64], w1[64], w2[64];
    const char *dn = zs_dtype_name(qt);
    tu_model_dir(dir, sizeof dir, "stories260K");
    snprintf(src, sizeof src, "%s/stories260K.gguf", dir);
    snprintf(dst, sizeof dst, "%s/stories260K-%s.gguf", tmp, dn);
    int rc = write_quant_gguf(src, dst, qt);
    CHECK(rc == 0, "write a %s GGUF of stories260K", dn);
    if (rc < 0) return;
    int32_t prompt[5] = {1, 403, 407, 261, 378}, ids[3][16];
    float *lg[3];
    snprintf(w0, sizeof w0, "safetensors --weight-dtype %s", dn);
    snprintf(w1, sizeof w1, "%s GGUF as stored", dn);
    snprintf(w2, sizeof w2, "f32 GGUF --weight-dtype %s", dn);
    const char *what[3] = {w0, w1, w2};
    const char *paths[3] = {dir, dst, src};
    zs_dtype wd[3] = {qt, ZS_DTYPE_COUNT, qt};
    int vocab = 512, rows = 5 + 16 - 1;
    for (int i = 0; i < 3; i++) {
        lg[i] = calloc((size_t)rows * vocab, 4);
        zs_engine *e;
        rc = open_engine(paths[i], i == 1 ? 2 : 1, i == 1 ? ZS_OFFLOAD_CPU : ZS_OFFLOAD_NONE, NULL, wd[i], &e);
        CHECK(rc == 0, "%s: open: %s", what[i], zs_errmsg());
        if (rc < 0) continue;
        const zs_bucket_layout *L = zs_model_layout(zs_engine_model(e), zs_bucket_layer(0));
        CHECK(L->slot[ZS_R_WQ].dtype == qt && L->slot[ZS_R_W_DOWN].dtype == ZS_F16, "%s: %s layout", what[i], dn);
        rc = greedy(e, prompt, 5, 16, ids[i], lg[i], vocab);
        CHECK(rc == 0, "%s: greedy: %s", what[i], zs_errmsg());
        zs_engine_free(e);
        if (i > 0)
            CHECK(!memcmp(lg[i], lg[0], (size_t)rows * vocab * 4), "%s: logits bitwise those of %s", what[i], what[0]);
    }
    for (int i = 0; i < 3; i++) free(lg[i]);
}

/* a GGUF of mixed block formats (as Q4_K_M files are): each matrix keeps its own as stored, and
 * ranks/offload do not change the logits */
static void check_gguf_mixed(const char *tmp) {
    char dir[4096], src[4200], dst[4200];
    tu_model_dir(dir, sizeof dir, "stories260K");
    snprintf(src, sizeof src, "%s/stories260K.gguf", dir);
    snprintf(dst, sizeof dst, "%s/stories260K-mixed.gguf", tmp);
    g_qt_ffn = ZS_Q5_0;
    int rc = write_quant_gguf(src, dst, ZS_Q8_0);
    g_qt_ffn = ZS_DTYPE_COUNT;
    CHECK(rc == 0, "write a mixed Q8_0/Q5_0 GGUF of stories260K");
    if (rc < 0) return;
    int32_t prompt[5] = {1, 403, 407, 261, 378}, ids[2][16];
    int vocab = 512, rows = 5 + 16 - 1;
    float *lg[2];
    for (int i = 0; i < 2; i++) {
        lg[i] = calloc((size_t)rows * vocab, 4);
        zs_engine *e;
        rc = open_engine(dst, i ? 3 : 1, i ? ZS_OFFLOAD_CPU : ZS_OFFLOAD_NONE, NULL, ZS_DTYPE_COUNT, &e);
        CHECK(rc == 0, "mixed GGUF, %d rank(s): open: %s", i ? 3 : 1, zs_errmsg());
        if (rc < 0) continue;
        const zs_bucket_layout *L = zs_model_layout(zs_engine_model(e), zs_bucket_layer(0));
        CHECK(L->slot[ZS_R_WQ].dtype == ZS_Q8_0 && L->slot[ZS_R_W_UP].dtype == ZS_Q5_0 &&
                  L->slot[ZS_R_W_GATE].dtype == ZS_Q5_0 && L->slot[ZS_R_W_DOWN].dtype == ZS_F16,
              "mixed GGUF: each matrix as stored (wq %s, w_up %s, w_down %s)", zs_dtype_name(L->slot[ZS_R_WQ].dtype),
              zs_dtype_name(L->slot[ZS_R_W_UP].dtype), zs_dtype_name(L->slot[ZS_R_W_DOWN].dtype));
        rc = greedy(e, prompt, 5, 16, ids[i], lg[i], vocab);
        CHECK(rc == 0, "mixed GGUF: greedy: %s", zs_errmsg());
        zs_engine_free(e);
    }
    CHECK(!memcmp(lg[0], lg[1], (size_t)rows * vocab * 4), "mixed GGUF: 3 ranks, cpu offload: logits bitwise those of one");
    for (int i = 0; i < 2; i++) free(lg[i]);
}

/* speculation off, and the inference pass already speculated consumed now (before the counters) */
static void spec_off(void *ud, int rank) {
    zs_gather_set_speculation(zs_world_gather(ud, rank), 0);
    zs_gather_settle(zs_world_gather(ud, rank));
}

/* per decode step, all ranks together, with speculation off (nothing of a coming pass counted) */
static uint64_t decode_gathered(zs_engine *e, int vocab) {
    zs_kvcache *kv = zs_engine_kv(e);
    zs_world *w = zs_engine_world(e);
    int seq;
    if (zs_kv_seq_open(kv, &seq) < 0) return 0;
    zs_kv_seq_reserve(kv, seq, 8);
    float *lg = malloc((size_t)vocab * 4);
    zs_gather_stats s0, s1;
    int32_t tok = 3, p = 0, l0 = 0;
    zs_batch d = {1, &tok, &p, &seq, &l0, 1, NULL, NULL, NULL};
    int rc = zs_engine_forward(e, &d, lg);
    zs_world_run(w, spec_off, w);
    zs_world_stats(w, &s0);
    for (p = 1; rc == 0 && p < 4; p++) rc = zs_engine_forward(e, &d, lg);
    zs_world_stats(w, &s1);
    free(lg);
    zs_kv_seq_close(kv, seq);
    return rc == 0 ? (s1.bytes_gathered - s0.bytes_gathered) / 3 : 0;
}

static void check_bytes(const char *tmp) {
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/untied", tmp);
    zs_init_opts io;
    int rc = zs_init_opts_default("llama", &io);
    zs_model_config *c = &io.cfg;
    c->n_layers = 2;
    c->dim = 256;
    c->n_heads = 4;
    c->n_kv_heads = 2;
    c->head_dim = 64;
    c->ffn_dim = 512;
    c->vocab_size = 320;
    c->max_seq = 64;
    c->tied_embeddings = 0;
    c->dtype = ZS_F32;
    io.seed = 5;
    if (rc == 0) rc = zs_init_model_write(&io, dir);
    CHECK(rc == 0, "init-model: %s", zs_errmsg());
    if (rc < 0) return;
    uint64_t g[6] = {0};
    zs_dtype dts[6] = {ZS_F32, ZS_Q8_0, ZS_Q4_0, ZS_Q4_1, ZS_Q5_0, ZS_Q5_1};
    for (int i = 0; i < 6; i++) {
        zs_engine *e;
        rc = open_engine(dir, 2, ZS_OFFLOAD_CPU, NULL, dts[i], &e);
        CHECK(rc == 0, "untied %s: open: %s", zs_dtype_name(dts[i]), zs_errmsg());
        if (rc < 0) return;
        g[i] = decode_gathered(e, c->vocab_size);
        zs_engine_free(e);
        if (i == 1) {
            g_lookup = 0; /* the training layout */
            rc = open_engine(dir, 2, ZS_OFFLOAD_CPU, NULL, dts[i], &e);
            g_lookup = 1;
            CHECK(rc == 0, "untied q8_0, training layout: open: %s", zs_errmsg());
            if (rc < 0) return;
            zs_train_opts to;
            memset(&to, 0, sizeof to);
            to.micro_batch = 1;
            to.seq_len = 2;
            to.grad_accum = 1;
            zs_adamw_params_default(&to.adam);
            to.lr.lr = to.adam.lr;
            zs_training *t = NULL;
            CHECK_ERR(zs_training_begin(zs_engine_world(e), &to, &t), "Q8_0", "training", "f32, f16 or bf16");
            zs_engine_free(e);
        }
    }
    double ratio = g[0] ? (double)g[1] / (double)g[0] : 0, r4 = g[0] ? (double)g[2] / (double)g[0] : 0;
    fprintf(stderr, "test-quant: bytes gathered per decode step: f32 %llu, q8_0 %llu (ratio %.4f; 34/128 = %.4f), "
            "q4_0 %llu (ratio %.4f; 18/128 = %.4f)\n", (unsigned long long)g[0], (unsigned long long)g[1], ratio,
            34.0 / 128, (unsigned long long)g[2], r4, 18.0 / 128);
    CHECK(g[0] > 0 && ratio > 0.25 && ratio < 0.29, "q8_0 gathers ~34/128 of f32's bytes per decode step (%.4f)", ratio);
    CHECK(g[0] > 0 && r4 > 0.13 && r4 < 0.16, "q4_0 gathers ~18/128 of f32's bytes per decode step (%.4f)", r4);
    for (int i = 3; i < 6; i++) {
        double r = g[0] ? (double)g[i] / (double)g[0] : 0, want = (double)zs_dtype_size(dts[i]) / 128;
        fprintf(stderr, "test-quant: bytes gathered per decode step: %s %llu (ratio %.4f; %zu/128 = %.4f)\n",
                zs_dtype_name(dts[i]), (unsigned long long)g[i], r, zs_dtype_size(dts[i]), want);
        CHECK(g[0] > 0 && r > want - 0.01 && r < want + 0.02, "%s gathers ~%zu/128 of f32's bytes per decode step (%.4f)",
              zs_dtype_name(dts[i]), zs_dtype_size(dts[i]), r);
    }
}

int main(int argc, char **argv) {
    (void)argv;
    /* this file checks the exact f32-activation path (test-quant-q8act.c the 8-bit one) */
    zs_op_matmul_quant_act(ZS_QUANT_ACT_F32);
    run_kernel_checks();
    if (argc >= 2) return tu_finish("test-quant (child)");
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    CHECK(n > 0, "readlink /proc/self/exe");
    if (n > 0) {
        self[n] = 0;
        const char *threads[] = {"1", "2", "3"};
        for (int i = 0; i < 3; i++) {
            char cmd[4300];
            snprintf(cmd, sizeof cmd, "ZS_THREADS=%s '%s' child", threads[i], self);
            int rc = system(cmd);
            CHECK(rc == 0, "ZS_THREADS=%s: the kernel checks pass (exit %d)", threads[i], rc);
        }
    }
    for (int q = 0; q < NQT; q++) check_reference(QT[q].dt);
    char tmp[4096], nv[4096];
    if (tu_tmpdir(tmp, sizeof tmp, "quant") < 0 || tu_tmpdir(nv, sizeof nv, "quant-nv") < 0) {
        CHECK(0, "scratch directories");
        return tu_finish("test-quant");
    }
    check_stories(nv, ZS_Q8_0, 8, 0.3);
    check_stories(nv, ZS_Q4_0, 0, 6.0); /* 4 bits on a 260K model: reported, not held to the reference */
    check_stories(nv, ZS_Q4_1, 0, 6.0);
    check_stories(nv, ZS_Q5_0, 0, 6.0);
    check_stories(nv, ZS_Q5_1, 0, 6.0);
    check_bytes(tmp);
    check_gguf(tmp, ZS_Q8_0);
    check_gguf(tmp, ZS_Q4_0);
    check_gguf(tmp, ZS_Q4_1);
    check_gguf(tmp, ZS_Q5_0);
    check_gguf(tmp, ZS_Q5_1);
    check_gguf_mixed(tmp);
    if (zs_backend_cuda_built() && zs_backend_cuda_devices() > 0) { /* the CUDA path runs them */
        char dir[4096];
        tu_model_dir(dir, sizeof dir, "stories260K");
        zs_dtype qts[2] = {ZS_Q8_0, ZS_Q5_1};
        for (int i = 0; i < 2; i++) {
            zs_engine_opts o;
            zs_engine_opts_default(&o);
            o.model_dir = dir;
            o.model.weight_dtype = qts[i];
            o.device = ZS_DEVICE_CUDA;
            o.model.embed_lookup = 1;
            o.max_seqs = 2;
            zs_engine *e = NULL, *ce = NULL;
            int rc = zs_engine_open(&o, &e);
            CHECK(rc == 0, "stories260K %s on CUDA: open: %s", zs_dtype_name(qts[i]), zs_errmsg());
            if (rc == 0 && open_engine(dir, 1, ZS_OFFLOAD_NONE, NULL, qts[i], &ce) == 0) {
                /* 4 tokens (the fused kernel: the CPU's products) against the CPU engine; the
                 * w_down rows of 172 stay f16, multiplied by cuBLAS with f16 inputs there */
                int32_t ids[4] = {1, 403, 407, 261}, pos[4] = {0, 1, 2, 3}, got[2];
                float *lg = malloc(2 * 4 * 512 * 4);
                for (int k = 0; k < 2; k++) {
                    zs_engine *x = k ? ce : e;
                    int seq;
                    zs_kvcache *kv = zs_engine_kv(x);
                    CHECK(zs_kv_seq_open(kv, &seq) == 0 && zs_kv_seq_reserve(kv, seq, 4) == 0, "kv");
                    int32_t sq[4] = {seq, seq, seq, seq}, li[4] = {0, 1, 2, 3};
                    zs_batch b = {4, ids, pos, sq, li, 4, NULL, NULL, NULL};
                    CHECK(zs_engine_forward(x, &b, lg + (size_t)k * 4 * 512) == 0, "forward: %s", zs_errmsg());
                    zs_kv_seq_close(kv, seq);
                    got[k] = argmax(lg + (size_t)k * 4 * 512 + 3 * 512, 512);
                }
                double md = 0;
                for (int j = 0; j < 4 * 512; j++) md = fmax(md, fabs(lg[j] - lg[4 * 512 + j]));
                fprintf(stderr, "test-quant: stories260K %s on CUDA: max |logit - CPU| %.3g\n", zs_dtype_name(qts[i]), md);
                CHECK(md < 0.5 && got[0] == got[1], "stories260K %s on CUDA: logits within 0.5 of the CPU's (%.3g), "
                      "the same argmax (%d, CPU %d)", zs_dtype_name(qts[i]), md, got[0], got[1]);
                free(lg);
            }
            zs_engine_free(ce);
            zs_engine_free(e);
        }
    } else {
        fprintf(stderr, "test-quant: no CUDA device: the CUDA path is not exercised\n");
    }
    tu_rmdir(nv);
    tu_rmdir(tmp);
    return tu_finish("test-quant");
}
