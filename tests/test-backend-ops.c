/* test-backend-ops.c — every device op against the CPU op on random inputs, on every CUDA device
 * present: dtype casts (convert.cu), embedding (embed.cu), RMSNorm and LayerNorm (norm.cu),
 * RoPE at theta 10000 and 500000 with the host-made frequency table (rope.cu), GELU, SwiGLU,
 * residual/bias add, softmax and argmax (act.cu); the model-family pieces: RMSNorm with Gemma's
 * weight offset and per head in place (qk_norm), RoPE with given frequencies (YaRN's table and
 * attention factor, LongRoPE's rows per token, from zs_rope_freqs) and its backward, the default
 * table with factor 1 giving zs_cuda_rope's bits, GeGLU, soft-capping, the embedding scale (the
 * CPU's bits); the paged KV store and causal attention with
 * GQA for prefill, chunks and decode (attention.cu: the simple kernel, the tiled one and the
 * auto split of the two, each against a CPU reference of the paged layout written here, with
 * NaN in the cache slots no token may read; T up to 70000, past the old grid.y limit; and over
 * a 16-bit (f16, bf16) cache: the store's rounding bit for bit, each kernel bit for bit against
 * itself over an f32 cache of the widened values), and with the family parameters
 * (zs_cuda_attention_ex: Gemma's scale, a soft-cap, sliding windows of 1 to longer than the
 * context, the cache before every window NaN and its table entries naming a block of NaN; with
 * all off the plain kernels' bits), the
 * refusals and their reasons (zs_cuda_take_error, zs_dev_error), and the cuBLAS matrix product
 * (f32, f16, bf16). Block-format weights (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q6_K, Q5_K, Q3_K,
 * Q2_K; random blocks,
 * matmul-quant.cu through zs_dev_gemm): decode (T = 1, 3, 8: the fused kernel) must give
 * zs_op_matmul's bits, also with beta 1 and for a row alone against the same row in a batch;
 * prefill (T = 9, 64, and 64 over 40000 rows, more than one 64 MiB chunk of bf16 weights: x and
 * the dequantized weights rounded to bf16, cuBLAS) is compared with the CPU's f32 product over
 * the same bf16-rounded operands under the f32 GEMM threshold 1e-4 (the products are exact in
 * f32, only the summation order differs), and with the exact operands under bf16's 1e-2; the
 * embedding lookup from block-format tables must give zs_op_embed's bits; bad shapes are refused
 * with their reason.
 * Outputs in f32, f16 and bf16 are compared with the CPU result rounded to the same dtype, under
 * a normalised error max|gpu - cpu| / max|cpu| with thresholds fit to each dtype (bf16 keeps 8
 * bits of mantissa: 2^-8 = 3.9e-3 per rounding). The backward kernels of backward.cu (norms,
 * RoPE, activations, add, embedding, cross-entropy, attention, the cuBLAS matmul backward) are
 * compared in f32 with the CPU ops of ops-backward.c (train-ops.h) under a relative L2 error
 * ||gpu - cpu|| / ||cpu||, with the family pieces (RMSNorm with offset, GeGLU, soft-cap, attention
 * with scale, soft-cap and window); and what the device trainer (backward-cuda.c) adds: its
 * attention forward (contiguous sequences through the paged store, each kernel) against the CPU's
 * training op, the per-head q/k norm backward, RMSNorm backward with offset 0 equal to the plain
 * one bit for bit, a cross-entropy block with every row masked; and the benchmarks' probes (the
 * read-bandwidth kernel, a timed upload). On the emulated device (tests/gpu/emu, ZS_EMU_DEVICE set)
 * the same kernels and paths run with fewer and smaller attention shapes, on device 0 only, and
 * the 70000-token case is left to a real device. Skips (77) without CUDA or without a device. */
#include "backend.h"
#include "common.h"
#include "testutil.h"

#ifndef ZS_CUDA
int main(void) {
    fprintf(stderr, "test-backend-ops: this build has no CUDA part (CUDA=0); skipping\n");
    return 77;
}
#else

#include <cublas_v2.h>

#include "device.h"
#include "kernels/cuda/kernels.h"
#include "ops.h"
#include "rope.h"
#include "matmul-q8act.h"
#include "tensor.h"
#include "train-ops.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void) { /* uniform in [-1, 1) */
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (float)((rng >> 11) * 0x1.0p-52) - 1.0f;
}
static void fill(float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = frand() * scale;
}

static const zs_dtype DTS[3] = {ZS_F32, ZS_F16, ZS_BF16};

/* normalised error threshold of a result stored in dt (after fp32 arithmetic) */
static double tol_of(zs_dtype dt) { return dt == ZS_F32 ? 2e-5 : dt == ZS_F16 ? 2e-3 : 1e-2; }

static double nerr(const float *a, const float *ref, size_t n) {
    double m = 0, e = 0;
    for (size_t i = 0; i < n; i++) {
        m = fmax(m, fabs(ref[i]));
        double d = fabs((double)a[i] - ref[i]);
        if (!(d <= e)) e = isnan(d) ? INFINITY : d;
    }
    return e / (m > 1e-12 ? m : 1e-12);
}

/* rounds f32 values through dt (what a dt store keeps) */
static void round_to(float *x, size_t n, zs_dtype dt) {
    if (dt == ZS_F32) return;
    void *t = malloc(n * 2);
    zs_convert(t, dt, x, ZS_F32, n);
    zs_to_f32(x, t, dt, n);
    free(t);
}

static zs_dev *D;
static void *S; /* compute stream */
/* on the emulated device (tests/gpu/emu, ZS_EMU_DEVICE set by it): every kernel and code path,
 * with fewer and smaller shapes (the threads of a block run as fibers on one core) */
static int EMU;

/* device copy of host f32 values stored as dt */
static void *up(const float *x, size_t n, zs_dtype dt) {
    void *h = malloc(n * 4 + 4), *d = zs_dev_alloc(D, n * 4 + 4);
    zs_convert(h, dt, x, ZS_F32, n);
    if (d && zs_dev_upload(D, d, h, n * zs_dtype_size(dt)) < 0) d = NULL;
    free(h);
    ZS_ASSERT(d != NULL);
    return d;
}
static void *up_raw(const void *x, size_t bytes) {
    void *d = zs_dev_alloc(D, bytes + 4);
    ZS_ASSERT(d != NULL && zs_dev_upload(D, d, x, bytes) == 0);
    return d;
}
/* f32 host copy of n device values of dtype dt (waits for the compute stream first) */
static float *down(const void *d, size_t n, zs_dtype dt) {
    ZS_ASSERT(zs_dev_sync(D) == 0);
    void *h = malloc(n * 4 + 4);
    float *o = malloc(n * 4 + 4);
    ZS_ASSERT(zs_dev_download(D, h, d, n * zs_dtype_size(dt)) == 0);
    zs_to_f32(o, h, dt, n);
    free(h);
    return o;
}
static void rel(void *d) { zs_dev_release(D, d); }

static void test_convert(void) {
    size_t n = 100003;
    float *x = malloc(n * 4);
    fill(x, n, 300.0f);
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++) {
            float *ref = malloc(n * 4);
            memcpy(ref, x, n * 4);
            round_to(ref, n, DTS[a]);
            round_to(ref, n, DTS[b]);
            void *src = up(x, n, DTS[a]), *dst = zs_dev_alloc(D, n * 4);
            CHECK(zs_cuda_convert(dst, DTS[b], src, DTS[a], n, S) == 0, "convert launch");
            float *g = down(dst, n, DTS[b]);
            /* f16 overflows at 65504: both sides give inf there, compare the finite ones */
            size_t bad = 0;
            for (size_t i = 0; i < n; i++)
                if (!(g[i] == ref[i] || (isinf(g[i]) && isinf(ref[i])))) bad++;
            CHECK(bad == 0, "convert %s -> %s: %zu of %zu values differ from the CPU conversion",
                  zs_dtype_name(DTS[a]), zs_dtype_name(DTS[b]), bad, n);
            free(g); free(ref); rel(src); rel(dst);
        }
    /* the original bf16 -> f32 entry point */
    free(x);
}

static void test_embed(void) {
    int rows = 300, d = 200, T = 37;
    for (int k = 0; k < 3; k++) {
        zs_dtype dt = DTS[k];
        float *tab = malloc((size_t)rows * d * 4), *ptab = malloc((size_t)rows * d * 4);
        fill(tab, (size_t)rows * d, 1.0f);
        fill(ptab, (size_t)rows * d, 1.0f);
        round_to(tab, (size_t)rows * d, dt);
        round_to(ptab, (size_t)rows * d, dt);
        int32_t ids[37], pos[37];
        for (int t = 0; t < T; t++) { ids[t] = (t * 131 + 7) % rows; pos[t] = t * 3; }
        float *ref = malloc((size_t)T * d * 4), *tmp = malloc((size_t)d * 4);
        void *tb = malloc((size_t)rows * d * 4), *pb = malloc((size_t)rows * d * 4);
        zs_convert(tb, dt, tab, ZS_F32, (size_t)rows * d);
        zs_convert(pb, dt, ptab, ZS_F32, (size_t)rows * d);
        for (int t = 0; t < T; t++) {
            zs_op_embed(ref + (size_t)t * d, tb, dt, d, ids[t]);
            zs_op_embed(tmp, pb, dt, d, pos[t]);
            zs_op_add(ref + (size_t)t * d, tmp, (size_t)d);
        }
        void *dt_tab = up(tab, (size_t)rows * d, dt), *dt_pos = up(ptab, (size_t)rows * d, dt);
        int32_t *dids = up_raw(ids, sizeof ids), *dpos = up_raw(pos, sizeof pos);
        float *out = zs_dev_alloc(D, (size_t)T * d * 4);
        CHECK(zs_cuda_embed(out, dt_tab, dt, dids, dt_pos, dt, dpos, T, d, S) == 0, "embed launch");
        float *g = down(out, (size_t)T * d, ZS_F32);
        double e = nerr(g, ref, (size_t)T * d);
        CHECK(e <= 1e-6, "embed %s: error %.3g", zs_dtype_name(dt), e);
        free(tab); free(ptab); free(ref); free(tmp); free(tb); free(pb); free(g);
        rel(dt_tab); rel(dt_pos); rel(dids); rel(dpos); rel(out);
    }
}

static void test_norms(void) {
    int dims[3] = {64, 1000, 4096}, R = 9;
    for (int di = 0; di < 3; di++) {
        int d = dims[di];
        size_t n = (size_t)R * d;
        float *x = malloc(n * 4), *w = malloc((size_t)d * 4), *b = malloc((size_t)d * 4);
        fill(x, n, 3.0f);
        fill(w, (size_t)d, 1.0f);
        fill(b, (size_t)d, 0.5f);
        int32_t rows[9];
        for (int r = 0; r < R; r++) rows[r] = (r * 5) % R; /* a permutation: the logits-row gather */
        float *rms = malloc(n * 4), *ln = malloc(n * 4), *xs = malloc(n * 4);
        for (int r = 0; r < R; r++) memcpy(xs + (size_t)r * d, x + (size_t)rows[r] * d, (size_t)d * 4);
        zs_op_rmsnorm(rms, xs, w, R, d, 1e-5f);
        zs_op_layernorm(ln, x, w, b, R, d, 1e-5f);
        float *dx = up(x, n, ZS_F32), *dw = up(w, (size_t)d, ZS_F32), *db = up(b, (size_t)d, ZS_F32);
        int32_t *drows = up_raw(rows, sizeof rows);
        for (int k = 0; k < 3; k++) {
            zs_dtype dt = DTS[k];
            void *y = zs_dev_alloc(D, n * 4);
            float *r1 = malloc(n * 4), *r2 = malloc(n * 4);
            memcpy(r1, rms, n * 4);
            memcpy(r2, ln, n * 4);
            round_to(r1, n, dt);
            round_to(r2, n, dt);
            CHECK(zs_cuda_rmsnorm(y, dt, dx, dw, drows, R, d, 1e-5f, S) == 0, "rmsnorm launch");
            float *g = down(y, n, dt);
            double e = nerr(g, r1, n);
            CHECK(e <= tol_of(dt), "rmsnorm d=%d -> %s: error %.3g", d, zs_dtype_name(dt), e);
            free(g);
            CHECK(zs_cuda_layernorm(y, dt, dx, dw, db, NULL, R, d, 1e-5f, S) == 0, "layernorm launch");
            g = down(y, n, dt);
            e = nerr(g, r2, n);
            CHECK(e <= tol_of(dt), "layernorm d=%d -> %s: error %.3g", d, zs_dtype_name(dt), e);
            free(g); free(r1); free(r2);
            rel(y);
        }
        free(x); free(w); free(b); free(rms); free(ln); free(xs);
        rel(dx); rel(dw); rel(db); rel(drows);
    }
}

/* the device RoPE table of the CPU op's frequencies (zs_cuda_rope_inv_freq) */
static float *rope_table(int hd, float theta) {
    float *h = malloc((size_t)(hd / 2) * 4 + 4);
    zs_cuda_rope_inv_freq(h, hd, theta);
    float *d = up(h, (size_t)(hd / 2), ZS_F32);
    free(h);
    return d;
}

static const char *cuda_why(void) {
    const char *w = zs_cuda_take_error();
    return w ? w : "(no reason recorded)";
}

static void test_rope(void) {
    int T = 23, nh = 6;
    float theta[2] = {10000.0f, 500000.0f};
    int hds[2] = {128, 64};
    for (int hi = 0; hi < 2; hi++)
        for (int k = 0; k < 2; k++) {
            int hd = hds[hi], ld = nh * hd + 32; /* a padded row stride */
            size_t n = (size_t)T * ld;
            float *x = malloc(n * 4), *ref = malloc(n * 4);
            fill(x, n, 2.0f);
            memcpy(ref, x, n * 4);
            int32_t pos[23];
            for (int t = 0; t < T; t++) pos[t] = t * 181; /* up to ~4000 */
            for (int t = 0; t < T; t++) zs_op_rope(ref + (size_t)t * ld, nh, hd, pos[t], theta[k]);
            float *dx = up(x, n, ZS_F32), *tabl = rope_table(hd, theta[k]);
            int32_t *dp = up_raw(pos, sizeof pos);
            CHECK(zs_cuda_rope(dx, T, ld, nh, hd, dp, tabl, S) == 0, "rope launch: %s", cuda_why());
            float *g = down(dx, n, ZS_F32);
            double e = nerr(g, ref, n);
            CHECK(e <= 2e-5, "rope head_dim %d theta %g: error %.3g", hd, theta[k], e);
            free(x); free(ref); free(g); rel(dx); rel(dp); rel(tabl);
        }
    CHECK(zs_cuda_rope(NULL, 1, 64, 1, 64, NULL, NULL, S) < 0, "rope without a table was accepted");
    const char *w = zs_cuda_take_error();
    CHECK(w && strstr(w, "inv_freq"), "rope without a table: reason \"%s\"", w ? w : "(none)");
}

static void test_act(void) {
    size_t n = 70001;
    int d = 1000, T = 70; /* T * d <= n */
    float *x = malloc(n * 4), *u = malloc(n * 4), *ref = malloc(n * 4);
    fill(x, n, 6.0f);
    fill(u, n, 2.0f);
    float *dx = up(x, n, ZS_F32), *du = up(u, n, ZS_F32);
    for (int k = 0; k < 3; k++) {
        zs_dtype dt = DTS[k];
        void *o = zs_dev_alloc(D, n * 4);
        memcpy(ref, x, n * 4);
        zs_op_gelu(ref, n);
        round_to(ref, n, dt);
        CHECK(zs_cuda_gelu(o, dt, dx, n, S) == 0, "gelu launch");
        float *g = down(o, n, dt);
        double e = nerr(g, ref, n);
        CHECK(e <= tol_of(dt), "gelu -> %s: error %.3g", zs_dtype_name(dt), e);
        free(g);
        zs_op_swiglu(ref, x, u, n);
        round_to(ref, n, dt);
        CHECK(zs_cuda_swiglu(o, dt, dx, du, n, S) == 0, "swiglu launch");
        g = down(o, n, dt);
        e = nerr(g, ref, n);
        CHECK(e <= tol_of(dt), "swiglu -> %s: error %.3g", zs_dtype_name(dt), e);
        free(g);
        rel(o);
    }
    /* y += x + bias over T rows of d */
    size_t m = (size_t)T * d;
    float *y = malloc(m * 4), *b = malloc((size_t)d * 4);
    fill(y, m, 1.0f);
    fill(b, (size_t)d, 1.0f);
    float *dy = up(y, m, ZS_F32), *db = up(b, (size_t)d, ZS_F32);
    memcpy(ref, y, m * 4);
    for (int t = 0; t < T; t++) {
        zs_op_add(ref + (size_t)t * d, x + (size_t)t * d, (size_t)d);
        zs_op_add(ref + (size_t)t * d, b, (size_t)d);
    }
    CHECK(zs_cuda_add(dy, dx, db, T, d, S) == 0, "add launch");
    float *g = down(dy, m, ZS_F32);
    double e = nerr(g, ref, m);
    CHECK(e <= 1e-6, "residual + bias add: error %.3g", e);
    free(g);
    /* softmax and argmax of rows */
    int R = 5, V = 32003;
    float *s = malloc((size_t)R * V * 4);
    fill(s, (size_t)R * V, 20.0f);
    s[3 * V + 777] = 40.0f; /* a clear maximum */
    float *ds = up(s, (size_t)R * V, ZS_F32);
    int32_t *di = zs_dev_alloc(D, (size_t)R * 4), idx[5];
    CHECK(zs_cuda_argmax(di, ds, R, V, S) == 0, "argmax launch");
    ZS_ASSERT(zs_dev_sync(D) == 0 && zs_dev_download(D, idx, di, sizeof idx) == 0);
    for (int r = 0; r < R; r++) {
        int best = 0;
        for (int i = 1; i < V; i++) if (s[(size_t)r * V + i] > s[(size_t)r * V + best]) best = i;
        CHECK(idx[r] == best, "argmax row %d: %d, CPU %d", r, idx[r], best);
    }
    for (int r = 0; r < R; r++) zs_op_softmax(s + (size_t)r * V, V);
    CHECK(zs_cuda_softmax(ds, R, V, S) == 0, "softmax launch");
    g = down(ds, (size_t)R * V, ZS_F32);
    e = nerr(g, s, (size_t)R * V);
    CHECK(e <= 1e-5, "softmax: error %.3g", e);
    free(g); free(s); free(x); free(u); free(ref); free(y); free(b);
    rel(dx); rel(du); rel(dy); rel(db); rel(ds); rel(di);
}

/* ---- the model-family pieces: RMSNorm with a weight offset and per head, RoPE with given and
 * per-token frequencies and an attention factor, GeGLU, soft-capping, scaling ---- */

/* A configuration for zs_rope_freqs (engine/model/rope.h) of one rope_scaling type at head_dim hd:
 * YaRN (one table, attention factor 0.1 ln 4 + 1) or LongRoPE (per position: the short factors up to
 * position 1023, the long ones past it; factor sqrt(1 + ln 4 / ln 1024)). */
static void rope_cfg(zs_model_config *c, int type, int hd) {
    memset(c, 0, sizeof *c);
    c->head_dim = hd;
    c->rope_theta = 10000.0f;
    c->max_seq = 4096;
    c->n_layers = 1;
    c->rope.type = type;
    c->rope.factor = 4.0f;
    c->rope.orig_max_pos = 1024;
    c->rope.truncate = 1;
    c->rope.n_factors = hd / 2;
    for (int i = 0; i < hd / 2; i++) {
        c->rope.short_factor[i] = 1.0f + 0.5f * (frand() + 1.0f);
        c->rope.long_factor[i] = 2.0f + 2.0f * (frand() + 1.0f);
    }
}

static void test_family_ops(void) {
    /* RMSNorm with Gemma's offset (y = x/rms * (1 + w)) over gathered rows, every output dtype */
    int dims[3] = {64, 1000, 4096}, R = 9;
    for (int di = 0; di < 3; di++) {
        int d = dims[di];
        size_t n = (size_t)R * d;
        float *x = malloc(n * 4), *w = malloc((size_t)d * 4), *xs = malloc(n * 4), *ref = malloc(n * 4);
        fill(x, n, 3.0f);
        fill(w, (size_t)d, 0.5f);
        int32_t rows[9];
        for (int r = 0; r < R; r++) rows[r] = (r * 5) % R;
        for (int r = 0; r < R; r++) memcpy(xs + (size_t)r * d, x + (size_t)rows[r] * d, (size_t)d * 4);
        float *dx = up(x, n, ZS_F32), *dw = up(w, (size_t)d, ZS_F32);
        int32_t *drows = up_raw(rows, sizeof rows);
        for (int k = 0; k < 3; k++) {
            zs_dtype dt = DTS[k];
            zs_op_rmsnorm_off(ref, xs, w, R, d, 1e-6f, 1.0f);
            round_to(ref, n, dt);
            void *y = zs_dev_alloc(D, n * 4);
            CHECK(zs_cuda_rmsnorm_off(y, dt, dx, dw, 1.0f, drows, R, d, 1e-6f, S) == 0, "rmsnorm_off launch: %s",
                  cuda_why());
            float *g = down(y, n, dt);
            double e = nerr(g, ref, n);
            CHECK(e <= tol_of(dt), "rmsnorm (offset 1) d=%d -> %s: error %.3g", d, zs_dtype_name(dt), e);
            free(g);
            rel(y);
        }
        free(x); free(w); free(xs); free(ref); rel(dx); rel(dw); rel(drows);
    }
    /* the per-head norm of q / k (qk_norm): T * heads rows of head_dim, in place, offsets 0 and 1 */
    {
        int T = 23, nh = 6, hds[2] = {128, 256};
        for (int hi = 0; hi < 2; hi++)
            for (int oi = 0; oi < 2; oi++) {
                int hd = hds[hi];
                size_t n = (size_t)T * nh * hd;
                float off = (float)oi;
                float *x = malloc(n * 4), *w = malloc((size_t)hd * 4), *ref = malloc(n * 4);
                fill(x, n, 2.0f);
                fill(w, (size_t)hd, 1.0f);
                zs_op_rmsnorm_off(ref, x, w, T * nh, hd, 1e-6f, off);
                float *dx = up(x, n, ZS_F32), *dw = up(w, (size_t)hd, ZS_F32);
                CHECK(zs_cuda_rmsnorm_off(dx, ZS_F32, dx, dw, off, NULL, T * nh, hd, 1e-6f, S) == 0,
                      "per-head rmsnorm launch: %s", cuda_why());
                float *g = down(dx, n, ZS_F32);
                double e = nerr(g, ref, n);
                CHECK(e <= 2e-5, "per-head rmsnorm in place, %d x %d heads of %d, offset %g: error %.3g", T, nh, hd,
                      off, e);
                free(g); free(x); free(w); free(ref); rel(dx); rel(dw);
            }
    }
    /* RoPE with given frequencies: YaRN's one table with its attention factor, LongRoPE's rows per
     * token (positions up to ~4000: both factor lists); the forward and its backward against
     * zs_op_rope_freq / zs_op_rope_freq_bwd, and the default table with factor 1 against zs_cuda_rope
     * bit for bit */
    {
        int T = 23, nh = 6;
        int hds[2] = {128, 64};
        for (int hi = 0; hi < 2; hi++)
            for (int ty = 0; ty < 2; ty++)
                for (int bwd = 0; bwd < 2; bwd++) {
                    int hd = hds[hi], half = hd / 2, ld = nh * hd + 32, per_tok = ty == 1;
                    zs_model_config c;
                    rope_cfg(&c, per_tok ? ZS_ROPE_LONGROPE : ZS_ROPE_YARN, hd);
                    size_t n = (size_t)T * ld;
                    float *x = malloc(n * 4), *ref = malloc(n * 4), *fr = malloc((size_t)T * half * 4), af = 1.0f;
                    fill(x, n, 2.0f);
                    memcpy(ref, x, n * 4);
                    int32_t pos[23];
                    for (int t = 0; t < T; t++) pos[t] = t * 181;
                    for (int t = 0; t < T; t++) {
                        float *row = fr + (size_t)(per_tok ? t : 0) * half;
                        if (per_tok || t == 0) zs_rope_freqs(&c, 0, pos[t], row, &af);
                        if (bwd) zs_op_rope_freq_bwd(ref + (size_t)t * ld, nh, hd, pos[t], row, af);
                        else zs_op_rope_freq(ref + (size_t)t * ld, nh, hd, pos[t], row, af);
                    }
                    CHECK(af != 1.0f, "the rope test's scaling has an attention factor (%g)", af);
                    float *dx = up(x, n, ZS_F32), *dfr = up(fr, (size_t)(per_tok ? T : 1) * half, ZS_F32);
                    int32_t *dp = up_raw(pos, sizeof pos);
                    int rc = bwd ? zs_cuda_rope_freq_bwd(dx, T, ld, nh, hd, dp, dfr, per_tok, af, S)
                                 : zs_cuda_rope_freq(dx, T, ld, nh, hd, dp, dfr, per_tok, af, S);
                    CHECK(rc == 0, "rope_freq%s launch: %s", bwd ? "_bwd" : "", cuda_why());
                    float *g = down(dx, n, ZS_F32);
                    double e = nerr(g, ref, n);
                    CHECK(e <= 2e-5, "rope_freq%s (%s, head_dim %d, factor %g): error %.3g", bwd ? "_bwd" : "",
                          per_tok ? "longrope, per token" : "yarn, one table", hd, af, e);
                    free(g);
                    /* the default table with factor 1: zs_cuda_rope's bits */
                    float *tabl = rope_table(hd, 10000.0f);
                    void *a = up(x, n, ZS_F32), *b = up(x, n, ZS_F32);
                    CHECK((bwd ? zs_cuda_rope_freq_bwd(a, T, ld, nh, hd, dp, tabl, 0, 1.0f, S)
                               : zs_cuda_rope_freq(a, T, ld, nh, hd, dp, tabl, 0, 1.0f, S)) == 0 &&
                          (bwd ? zs_cuda_rope_bwd(b, T, ld, nh, hd, dp, tabl, S)
                               : zs_cuda_rope(b, T, ld, nh, hd, dp, tabl, S)) == 0, "rope launches: %s", cuda_why());
                    float *ga = down(a, n, ZS_F32), *gb = down(b, n, ZS_F32);
                    CHECK(memcmp(ga, gb, n * 4) == 0, "rope_freq%s with the default table and factor 1 differs from "
                          "rope%s", bwd ? "_bwd" : "", bwd ? "_bwd" : "");
                    free(ga); free(gb); rel(a); rel(b); rel(tabl);
                    free(x); free(ref); free(fr); rel(dx); rel(dfr); rel(dp);
                }
    }
    /* GeGLU, every output dtype and in place; soft-cap; scale */
    {
        size_t n = 70001;
        float *x = malloc(n * 4), *u = malloc(n * 4), *ref = malloc(n * 4);
        fill(x, n, 6.0f);
        fill(u, n, 2.0f);
        float *dx = up(x, n, ZS_F32), *du = up(u, n, ZS_F32);
        for (int k = 0; k < 3; k++) {
            zs_dtype dt = DTS[k];
            void *o = zs_dev_alloc(D, n * 4);
            zs_op_geglu(ref, x, u, n);
            round_to(ref, n, dt);
            CHECK(zs_cuda_geglu(o, dt, dx, du, n, S) == 0, "geglu launch");
            float *g = down(o, n, dt);
            double e = nerr(g, ref, n);
            CHECK(e <= tol_of(dt), "geglu -> %s: error %.3g", zs_dtype_name(dt), e);
            free(g);
            rel(o);
        }
        float *dg = up(x, n, ZS_F32);
        zs_op_geglu(ref, x, u, n);
        CHECK(zs_cuda_geglu(dg, ZS_F32, dg, du, n, S) == 0, "geglu launch (in place)");
        float *g = down(dg, n, ZS_F32);
        double e = nerr(g, ref, n);
        CHECK(e <= tol_of(ZS_F32), "geglu in place: error %.3g", e);
        free(g);
        /* soft-cap at 30 over values up to +-100 (the tanh saturates), and a small cap */
        float caps[2] = {30.0f, 0.5f};
        for (int ci = 0; ci < 2; ci++) {
            float *v = malloc(n * 4);
            fill(v, n, 100.0f);
            float *dv = up(v, n, ZS_F32);
            zs_op_softcap(v, n, caps[ci]);
            CHECK(zs_cuda_softcap(dv, n, caps[ci], S) == 0, "softcap launch: %s", cuda_why());
            g = down(dv, n, ZS_F32);
            e = nerr(g, v, n);
            CHECK(e <= 2e-5, "softcap %g: error %.3g", caps[ci], e);
            free(g); free(v); rel(dv);
        }
        CHECK(zs_cuda_softcap(dx, n, 0.0f, S) < 0, "softcap 0 was accepted");
        const char *w = zs_cuda_take_error();
        CHECK(w && strstr(w, "cap"), "softcap 0: reason \"%s\"", w ? w : "(none)");
        /* scale: one f32 product, the CPU's bits */
        float sc = sqrtf(2304.0f);
        memcpy(ref, x, n * 4);
        for (size_t i = 0; i < n; i++) ref[i] *= sc;
        float *ds = up(x, n, ZS_F32);
        CHECK(zs_cuda_scale(ds, n, sc, S) == 0, "scale launch");
        g = down(ds, n, ZS_F32);
        CHECK(memcmp(g, ref, n * 4) == 0, "scale: differs from the f32 product (error %.3g)", nerr(g, ref, n));
        free(g);
        free(x); free(u); free(ref); rel(dx); rel(du); rel(dg); rel(ds);
    }
}

/* ---- paged KV store + attention: CPU reference over the same layout ---- */

/* A batch over the paged cache: sequences s = 0..nseq-1 of len[s] positions; the batch holds
 * the last nnew[s] positions of each, in sequence order (their K/V rows go in with kv_store;
 * the earlier ones are in the cache already). Block ids are shuffled over the pool. */
typedef struct {
    int nseq, n_blocks, T, maxlen;
    int *len, *tab_of;          /* [nseq]; sequence s's block ids are tables[tab_of[s] ...] */
    int32_t *tables;            /* [n_blocks] */
    int32_t *seq, *pos, *tab;   /* [T] */
} att_batch;

static uint32_t urand(uint32_t n) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (uint32_t)((rng >> 11) % n);
}

static void att_batch_make(att_batch *B, int nseq, const int *len, const int *nnew) {
    memset(B, 0, sizeof *B);
    B->nseq = nseq;
    B->len = malloc((size_t)nseq * sizeof(int));
    B->tab_of = malloc((size_t)nseq * sizeof(int));
    for (int s = 0; s < nseq; s++) {
        B->len[s] = len[s];
        B->tab_of[s] = B->n_blocks;
        B->n_blocks += (len[s] + ZS_KV_BLOCK - 1) / ZS_KV_BLOCK;
        B->T += nnew[s];
        if (len[s] > B->maxlen) B->maxlen = len[s];
    }
    B->tables = malloc((size_t)B->n_blocks * 4);
    for (int i = 0; i < B->n_blocks; i++) B->tables[i] = i;
    for (int i = B->n_blocks - 1; i > 0; i--) {
        int j = (int)urand((uint32_t)i + 1);
        int32_t t = B->tables[i]; B->tables[i] = B->tables[j]; B->tables[j] = t;
    }
    B->seq = malloc((size_t)B->T * 4);
    B->pos = malloc((size_t)B->T * 4);
    B->tab = malloc((size_t)B->T * 4);
    for (int s = 0, t = 0; s < nseq; s++)
        for (int p = len[s] - nnew[s]; p < len[s]; p++, t++) {
            B->seq[t] = s;
            B->pos[t] = p;
            B->tab[t] = B->tab_of[s];
        }
}

static void att_batch_free(att_batch *B) {
    free(B->len); free(B->tab_of); free(B->tables); free(B->seq); free(B->pos); free(B->tab);
}

/* the K (which 0) or V (1) row of position p of sequence s in the host layout of the pool */
static size_t kv_index(const att_batch *B, int kvd, int s, int p, int which) {
    int blk = B->tables[B->tab_of[s] + p / ZS_KV_BLOCK];
    return (((size_t)blk * 2 + (size_t)which) * ZS_KV_BLOCK + (size_t)(p % ZS_KV_BLOCK)) * (size_t)kvd;
}

static const int ATT_IMPLS[3] = {ZS_CUDA_ATTN_SIMPLE, ZS_CUDA_ATTN_TILED, ZS_CUDA_ATTN_AUTO};

/* a pool of n random values in [-1, 1) */
static float *frnd_pool(size_t n) {
    float *p = malloc(n * 4 + 4);
    fill(p, n, 1.0f);
    return p;
}

/* The first key position query position p sees: 0, or with a window the window's first. */
static int att_first(int p, int window) { return window > 0 && p - window + 1 > 0 ? p - window + 1 : 0; }

/* The scores' parameters of zs_cuda_att_params resolved as the CPU does (ap NULL: plain). */
static void att_resolve(const zs_cuda_att_params *ap, int hd, float *scale, float *cap, int *window) {
    *scale = ap && ap->scale != 0.0f ? ap->scale : 1.0f / sqrtf((float)hd);
    *cap = ap && ap->softcap > 0.0f ? ap->softcap : 0.0f;
    *window = ap && ap->window > 0 ? ap->window : 0;
}

/* The window's poison (ap with a window): per sequence, the positions before the first key of every
 * one of its batch tokens hold NaN, and the table entries of its blocks wholly before that point
 * name an extra block of NaN (B->n_blocks): a kernel that reads them fails the check. Returns the
 * blocks the pool needs. */
static int att_poison_tables(att_batch *B, int window) {
    if (window <= 0) return B->n_blocks;
    for (int s = 0; s < B->nseq; s++) {
        int lo = INT32_MAX;
        for (int t = 0; t < B->T; t++)
            if (B->seq[t] == s) lo = ZS_MIN(lo, att_first(B->pos[t], window));
        for (int j = 0; lo != INT32_MAX && (j + 1) * ZS_KV_BLOCK <= lo; j++) B->tables[B->tab_of[s] + j] = B->n_blocks;
    }
    return B->n_blocks + 1;
}

static void att_poison_pool(const att_batch *B, float *pool, int kvd, int window) {
    if (window <= 0) return;
    for (int s = 0; s < B->nseq; s++) {
        int lo = INT32_MAX;
        for (int t = 0; t < B->T; t++)
            if (B->seq[t] == s) lo = ZS_MIN(lo, att_first(B->pos[t], window));
        for (int p = 0; lo != INT32_MAX && p < lo; p++)
            for (int w = 0; w < 2; w++) {
                float *r = pool + kv_index(B, kvd, s, p, w);
                for (int i = 0; i < kvd; i++) r[i] = NAN;
            }
    }
}

/* The CPU reference of one query row over the paged pool: keys lo..p of sequence s, scores
 * (q.k)*scale, soft-capped, softmax (zs_op_softmax), the weighted sum of V in key order. */
static void att_ref_row(float *o, const float *qq, const float *pool, const att_batch *B, int kvd, int kh, int hd,
                        int s, int p, float scale, float cap, int window, float *sc) {
    int lo = att_first(p, window);
    for (int j = lo; j <= p; j++) {
        const float *kk = pool + kv_index(B, kvd, s, j, 0) + (size_t)kh * hd;
        float v = 0;
        for (int i = 0; i < hd; i++) v += qq[i] * kk[i];
        v *= scale;
        if (cap > 0) v = cap * tanhf(v / cap);
        sc[j - lo] = v;
    }
    zs_op_softmax(sc, p + 1 - lo);
    memset(o, 0, (size_t)hd * 4);
    for (int j = lo; j <= p; j++) {
        const float *vv = pool + kv_index(B, kvd, s, j, 1) + (size_t)kh * hd;
        for (int i = 0; i < hd; i++) o[i] += sc[j - lo] * vv[i];
    }
}

/* kv_store, then the attention of every kernel (simple, tiled, auto) in every output dtype
 * (f32 only when f32_only) against the CPU op (forward.c's loop) over the same cache; ap (not
 * NULL): through zs_cuda_attention_ex with its scale, soft-cap and window (the cache before every
 * window poisoned, att_poison_tables). */
static void attention_case_p(const char *name, int nseq, const int *len, const int *nnew, int nh, int nkv, int hd,
                             int f32_only, const zs_cuda_att_params *ap) {
    att_batch B;
    att_batch_make(&B, nseq, len, nnew);
    float scale, cap;
    int window;
    att_resolve(ap, hd, &scale, &cap, &window);
    int pool_blocks = att_poison_tables(&B, window);
    int T = B.T, kvd = nkv * hd, qd = nh * hd;
    size_t pool_n = (size_t)pool_blocks * 2 * ZS_KV_BLOCK * kvd;
    /* slots past a sequence's end hold NaN: a kernel reading beyond pos[t] fails the check */
    float *pool = malloc(pool_n * 4);
    for (size_t i = 0; i < pool_n; i++) pool[i] = NAN;
    for (int s = 0; s < nseq; s++)
        for (int p = 0; p < len[s]; p++) {
            fill(pool + kv_index(&B, kvd, s, p, 0), (size_t)kvd, 1.0f);
            fill(pool + kv_index(&B, kvd, s, p, 1), (size_t)kvd, 1.0f);
        }
    att_poison_pool(&B, pool, kvd, window);
    float *k = malloc((size_t)T * kvd * 4), *v = malloc((size_t)T * kvd * 4), *q = malloc((size_t)T * qd * 4);
    int64_t *off = malloc((size_t)T * 8);
    fill(k, (size_t)T * kvd, 1.0f);
    fill(v, (size_t)T * kvd, 1.0f);
    fill(q, (size_t)T * qd, 2.0f);
    for (int t = 0; t < T; t++) off[t] = (int64_t)kv_index(&B, kvd, B.seq[t], B.pos[t], 0);
    float *dpool = up(pool, pool_n, ZS_F32), *dk = up(k, (size_t)T * kvd, ZS_F32);
    float *dv = up(v, (size_t)T * kvd, ZS_F32), *dq = up(q, (size_t)T * qd, ZS_F32);
    int32_t *dtab = up_raw(B.tab, (size_t)T * 4), *dtables = up_raw(B.tables, (size_t)B.n_blocks * 4);
    int32_t *dpos = up_raw(B.pos, (size_t)T * 4);
    int64_t *doff = up_raw(off, (size_t)T * 8);
    char pn[96] = "";
    if (ap) snprintf(pn, sizeof pn, " [scale %g, soft-cap %g, window %d]", scale, cap, window);
    /* CPU: store, then attend (forward.c's loop) */
    for (int t = 0; t < T; t++) {
        memcpy(pool + kv_index(&B, kvd, B.seq[t], B.pos[t], 0), k + (size_t)t * kvd, (size_t)kvd * 4);
        memcpy(pool + kv_index(&B, kvd, B.seq[t], B.pos[t], 1), v + (size_t)t * kvd, (size_t)kvd * 4);
    }
    CHECK(zs_cuda_kv_store(dpool, dk, kvd, dv, kvd, doff, T, kvd, S) == 0, "kv_store launch: %s", cuda_why());
    float *gp = down(dpool, pool_n, ZS_F32);
    CHECK(memcmp(gp, pool, pool_n * 4) == 0, "kv_store %s (%d kv heads x %d): the device cache differs", name, nkv, hd);
    free(gp);
    float *ref = malloc((size_t)T * qd * 4), *sc = malloc((size_t)B.maxlen * 4 + 4);
    int group = nh / nkv;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < nh; h++)
            att_ref_row(ref + (size_t)t * qd + (size_t)h * hd, q + (size_t)t * qd + (size_t)h * hd, pool, &B, kvd,
                        h / group, hd, B.seq[t], B.pos[t], scale, cap, window, sc);
    float *r = malloc((size_t)T * qd * 4);
    void *out = zs_dev_alloc(D, (size_t)T * qd * 4);
    ZS_ASSERT(out != NULL);
    for (int kd = 0; kd < (f32_only ? 1 : 3); kd++) {
        zs_dtype dt = DTS[kd];
        memcpy(r, ref, (size_t)T * qd * 4);
        round_to(r, (size_t)T * qd, dt);
        for (int ii = 0; ii < 3; ii++) {
            int impl = ATT_IMPLS[ii];
            const char *in = zs_cuda_attention_mode_name(impl);
            /* NaN first: a row no kernel writes fails the check */
            ZS_ASSERT(cudaMemsetAsync(out, 0xff, (size_t)T * qd * zs_dtype_size(dt), (cudaStream_t)S) == cudaSuccess);
            int rc = ap ? zs_cuda_attention_ex(impl, out, dt, dq, qd, dpool, ZS_F32, dtables, dtab, dpos, T, nh, nkv, hd,
                                               ap, S)
                        : zs_cuda_attention_impl(impl, out, dt, dq, qd, dpool, dtables, dtab, dpos, T, nh, nkv, hd,
                                                 scale, S);
            CHECK(rc == 0, "attention (%s)%s launch: %s", in, pn, cuda_why());
            float *g = down(out, (size_t)T * qd, dt);
            double e = nerr(g, r, (size_t)T * qd);
            CHECK(e <= tol_of(dt) + 1e-5, "attention (%s)%s %s, T=%d, %d heads / %d kv heads x %d -> %s: error %.3g",
                  in, pn, name, T, nh, nkv, hd, zs_dtype_name(dt), e);
            free(g);
        }
    }
    /* the entry point of the forward pass (ZS_CUDA_ATTN's choice) */
    ZS_ASSERT(cudaMemsetAsync(out, 0xff, (size_t)T * qd * 4, (cudaStream_t)S) == cudaSuccess);
    int rc = ap ? zs_cuda_attention_ex(zs_cuda_attention_mode(), out, ZS_F32, dq, qd, dpool, ZS_F32, dtables, dtab,
                                       dpos, T, nh, nkv, hd, ap, S)
                : zs_cuda_attention(out, ZS_F32, dq, qd, dpool, dtables, dtab, dpos, T, nh, nkv, hd, scale, S);
    CHECK(rc == 0, "attention%s launch: %s", pn, cuda_why());
    float *g = down(out, (size_t)T * qd, ZS_F32);
    memcpy(r, ref, (size_t)T * qd * 4);
    double e = nerr(g, r, (size_t)T * qd);
    CHECK(e <= tol_of(ZS_F32) + 1e-5, "attention (ZS_CUDA_ATTN: %s)%s %s, %d heads / %d kv heads x %d: error %.3g",
          zs_cuda_attention_mode_name(zs_cuda_attention_mode()), pn, name, nh, nkv, hd, e);
    free(g);
    free(pool); free(k); free(v); free(q); free(off); free(ref); free(sc); free(r);
    rel(out); rel(dpool); rel(dk); rel(dv); rel(dq); rel(dtab); rel(dtables); rel(dpos); rel(doff);
    att_batch_free(&B);
}

static void attention_case(const char *name, int nseq, const int *len, const int *nnew, int nh, int nkv, int hd,
                           int f32_only) {
    attention_case_p(name, nseq, len, nnew, nh, nkv, hd, f32_only, NULL);
}

/* The 16-bit KV cache (--kv-dtype f16 / bf16): kv_store_dt rounds the new rows as the host's
 * zs_kv_write does (to nearest even; the device cache, widened, equals the host's bit for bit),
 * and each kernel (simple, tiled, auto) over the 16-bit pool gives the bits it gives over an f32
 * pool of the widened values (the kernels widen each value as they load it, then the arithmetic
 * is the same), within the f32 tolerance of the CPU reference over those values. */
static void attention_kv16_case_p(const char *name, int nseq, const int *len, const int *nnew, int nh, int nkv,
                                  int hd, const zs_cuda_att_params *ap) {
    att_batch B;
    att_batch_make(&B, nseq, len, nnew);
    float scale, cap;
    int window;
    att_resolve(ap, hd, &scale, &cap, &window);
    int pool_blocks = att_poison_tables(&B, window);
    int T = B.T, kvd = nkv * hd, qd = nh * hd, group = nh / nkv;
    size_t pool_n = (size_t)pool_blocks * 2 * ZS_KV_BLOCK * kvd, on = (size_t)T * qd;
    float *pool = malloc(pool_n * 4), *pw = malloc(pool_n * 4);
    for (size_t i = 0; i < pool_n; i++) pool[i] = NAN; /* never read: a kernel that does fails */
    for (int s = 0; s < nseq; s++)
        for (int p = 0; p < len[s]; p++) {
            fill(pool + kv_index(&B, kvd, s, p, 0), (size_t)kvd, 1.0f);
            fill(pool + kv_index(&B, kvd, s, p, 1), (size_t)kvd, 1.0f);
        }
    att_poison_pool(&B, pool, kvd, window);
    float *k = malloc((size_t)T * kvd * 4), *v = malloc((size_t)T * kvd * 4), *q = malloc(on * 4);
    float *kr = malloc((size_t)T * kvd * 4), *vr = malloc((size_t)T * kvd * 4);
    int64_t *off = malloc((size_t)T * 8);
    fill(k, (size_t)T * kvd, 1.0f);
    fill(v, (size_t)T * kvd, 1.0f);
    fill(q, on, 2.0f);
    for (int t = 0; t < T; t++) off[t] = (int64_t)kv_index(&B, kvd, B.seq[t], B.pos[t], 0);
    float *dk = up(k, (size_t)T * kvd, ZS_F32), *dv = up(v, (size_t)T * kvd, ZS_F32), *dq = up(q, on, ZS_F32);
    int32_t *dtab = up_raw(B.tab, (size_t)T * 4), *dtables = up_raw(B.tables, (size_t)B.n_blocks * 4);
    int32_t *dpos = up_raw(B.pos, (size_t)T * 4);
    int64_t *doff = up_raw(off, (size_t)T * 8);
    float *ref = malloc(on * 4), *sc = malloc((size_t)B.maxlen * 4 + 4);
    char pn[96] = "";
    if (ap) snprintf(pn, sizeof pn, " [scale %g, soft-cap %g, window %d]", scale, cap, window);
    void *out = zs_dev_alloc(D, on * 4), *wout = zs_dev_alloc(D, on * 4);
    ZS_ASSERT(out != NULL && wout != NULL);
    for (int kd = 1; kd < 3; kd++) {
        zs_dtype kt = DTS[kd];
        const char *kn = zs_dtype_name(kt);
        void *dp = up(pool, pool_n, kt); /* the cache before the step, rounded on the host */
        /* the host's cache after the step: everything rounded to kt, then widened */
        memcpy(pw, pool, pool_n * 4);
        memcpy(kr, k, (size_t)T * kvd * 4);
        memcpy(vr, v, (size_t)T * kvd * 4);
        round_to(kr, (size_t)T * kvd, kt);
        round_to(vr, (size_t)T * kvd, kt);
        for (int t = 0; t < T; t++) {
            memcpy(pw + kv_index(&B, kvd, B.seq[t], B.pos[t], 0), kr + (size_t)t * kvd, (size_t)kvd * 4);
            memcpy(pw + kv_index(&B, kvd, B.seq[t], B.pos[t], 1), vr + (size_t)t * kvd, (size_t)kvd * 4);
        }
        round_to(pw, pool_n, kt);
        CHECK(zs_cuda_kv_store_dt(dp, kt, dk, kvd, dv, kvd, doff, T, kvd, S) == 0, "kv_store %s launch: %s", kn,
              cuda_why());
        float *g = down(dp, pool_n, kt);
        CHECK(memcmp(g, pw, pool_n * 4) == 0, "kv_store %s %s (%d kv heads x %d): the device cache differs from the "
              "host's rounding", kn, name, nkv, hd);
        free(g);
        float *dpw = up(pw, pool_n, ZS_F32);
        for (int t = 0; t < T; t++)
            for (int h = 0; h < nh; h++)
                att_ref_row(ref + (size_t)t * qd + (size_t)h * hd, q + (size_t)t * qd + (size_t)h * hd, pw, &B, kvd,
                            h / group, hd, B.seq[t], B.pos[t], scale, cap, window, sc);
        for (int ii = 0; ii < 3; ii++) {
            int impl = ATT_IMPLS[ii];
            const char *in = zs_cuda_attention_mode_name(impl);
            ZS_ASSERT(cudaMemsetAsync(out, 0xff, on * 4, (cudaStream_t)S) == cudaSuccess);
            ZS_ASSERT(cudaMemsetAsync(wout, 0xff, on * 4, (cudaStream_t)S) == cudaSuccess);
            if (ap) {
                CHECK(zs_cuda_attention_ex(impl, out, ZS_F32, dq, qd, dp, kt, dtables, dtab, dpos, T, nh, nkv, hd, ap,
                                           S) == 0, "attention (%s)%s over %s launch: %s", in, pn, kn, cuda_why());
                CHECK(zs_cuda_attention_ex(impl, wout, ZS_F32, dq, qd, dpw, ZS_F32, dtables, dtab, dpos, T, nh, nkv, hd,
                                           ap, S) == 0, "attention (%s)%s launch: %s", in, pn, cuda_why());
            } else {
                CHECK(zs_cuda_attention_dt(impl, out, ZS_F32, dq, qd, dp, kt, dtables, dtab, dpos, T, nh, nkv, hd,
                                           scale, S) == 0, "attention (%s) over %s launch: %s", in, kn, cuda_why());
                CHECK(zs_cuda_attention_impl(impl, wout, ZS_F32, dq, qd, dpw, dtables, dtab, dpos, T, nh, nkv, hd,
                                             scale, S) == 0, "attention (%s) launch: %s", in, cuda_why());
            }
            float *a = down(out, on, ZS_F32), *b = down(wout, on, ZS_F32);
            size_t nd = 0;
            for (size_t i = 0; i < on; i++) nd += memcmp(&a[i], &b[i], 4) != 0;
            double ew = nerr(a, b, on), er = nerr(a, ref, on);
            CHECK(nd == 0, "attention (%s)%s over a %s cache, %s, %d heads / %d kv heads x %d: %zu of %zu elements "
                  "differ from the f32 cache of the widened values (error %.3g)", in, pn, kn, name, nh, nkv, hd, nd, on,
                  ew);
            CHECK(er <= tol_of(ZS_F32) + 1e-5, "attention (%s)%s over a %s cache, %s, %d heads / %d kv heads x %d: "
                  "error %.3g against the CPU", in, pn, kn, name, nh, nkv, hd, er);
            free(a); free(b);
        }
        rel(dp); rel(dpw);
    }
    free(pool); free(pw); free(k); free(v); free(q); free(kr); free(vr); free(off); free(ref); free(sc);
    rel(out); rel(wout); rel(dk); rel(dv); rel(dq); rel(dtab); rel(dtables); rel(dpos); rel(doff);
    att_batch_free(&B);
}

static void attention_kv16_case(const char *name, int nseq, const int *len, const int *nnew, int nh, int nkv,
                                int hd) {
    attention_kv16_case_p(name, nseq, len, nnew, nh, nkv, hd, NULL);
}

/* The model-family parameters (zs_cuda_attention_ex): Gemma's scale (query_pre_attn_scalar 256:
 * 1/16) and Gemma 2's soft-cap (small here, so that it bends these scores: the inputs' scores are
 * a few units), sliding windows of 1 (the token alone), 5, 16 (one KV block), 40 (across tiles of
 * the tiled kernel from an unaligned first key) and one longer than every sequence (no effect),
 * each with the cache before every window poisoned (NaN, table entries naming a block of NaN);
 * prefill, decode, a chunk after cached positions, a serving batch (both kernels in auto), the
 * shapes of GQA 2 / 4 / 6, head_dim 64, 128 and 256, and a 16-bit cache. With all three off,
 * zs_cuda_attention_ex is zs_cuda_attention_dt bit for bit. */
static void test_attention_params(void) {
    int len3[3] = {37, 5, 70}, one3[3] = {1, 1, 1};
    int lm[4] = {120, 33, 64, 20}, nm[4] = {40, 1, 1, 20}, l90 = 90, n37 = 37, l300 = 300, l77 = 77, n1 = 1;
    int wins[6] = {1, 5, 16, 40, 1000, 0};
    int heads[4][3] = {{8, 4, 64}, {32, 8, 128}, {12, 2, 64}, {8, 2, 256}};
    /* emulated: windows of 1, 16 and longer than the context, each with and without the scale
     * and soft-cap, over GQA 2 at head_dim 64 and GQA 4 at 256 */
    for (int wi = 0; wi < 6; wi += EMU ? 2 : 1)
        for (int ci = 0; ci < 2; ci++) {
            if (wins[wi] == 0 && ci == 0) continue; /* nothing to test: the plain cases above */
            zs_cuda_att_params ap = {ci ? 0.0625f : 0.0f, ci ? 0.75f : 0.0f, wins[wi]};
            for (int hi = 0; hi < 4; hi += EMU ? 3 : 1) {
                int nh = heads[hi][0], nkv = heads[hi][1], hd = heads[hi][2];
                int f32o = hi > 0; /* the output dtypes once per parameter set */
                attention_case_p("prefill of 3 sequences", 3, len3, len3, nh, nkv, hd, f32o, &ap);
                attention_case_p("decode of 3 sequences", 3, len3, one3, nh, nkv, hd, 1, &ap);
                attention_case_p("decode, T=1", 1, &l77, &n1, nh, nkv, hd, 1, &ap);
                attention_case_p("chunk of 37 after 53 cached", 1, &l90, &n37, nh, nkv, hd, 1, &ap);
                attention_case_p("serving batch", 4, lm, nm, nh, nkv, hd, f32o, &ap);
                if (hi < 2) {
                    int lp = EMU ? 100 : l300;
                    attention_case_p(EMU ? "prefill, T=100" : "prefill, T=300", 1, &lp, &lp, nh, nkv, hd, 1, &ap);
                }
            }
            attention_kv16_case_p("serving batch", 4, lm, nm, 32, 8, 128, &ap);
            attention_kv16_case_p("chunk of 37 after 53 cached", 1, &l90, &n37, 12, 2, 64, &ap);
        }
    /* all off: the plain kernels' bits */
    {
        att_batch B;
        att_batch_make(&B, 4, lm, nm);
        int nh = 8, nkv = 2, hd = 64, T = B.T, kvd = nkv * hd, qd = nh * hd;
        size_t pool_n = (size_t)B.n_blocks * 2 * ZS_KV_BLOCK * kvd, on = (size_t)T * qd;
        float *pool = frnd_pool(pool_n), *q = malloc(on * 4);
        fill(q, on, 2.0f);
        float *dpool = up(pool, pool_n, ZS_F32), *dq = up(q, on, ZS_F32);
        int32_t *dtab = up_raw(B.tab, (size_t)T * 4), *dtables = up_raw(B.tables, (size_t)B.n_blocks * 4);
        int32_t *dpos = up_raw(B.pos, (size_t)T * 4);
        void *o1 = zs_dev_alloc(D, on * 4), *o2 = zs_dev_alloc(D, on * 4);
        zs_cuda_att_params off = {0.0f, 0.0f, 0};
        for (int ii = 0; ii < 3; ii++) {
            int impl = ATT_IMPLS[ii];
            CHECK(zs_cuda_attention_dt(impl, o1, ZS_F32, dq, qd, dpool, ZS_F32, dtables, dtab, dpos, T, nh, nkv, hd,
                                       1.0f / sqrtf((float)hd), S) == 0, "attention launch: %s", cuda_why());
            CHECK(zs_cuda_attention_ex(impl, o2, ZS_F32, dq, qd, dpool, ZS_F32, dtables, dtab, dpos, T, nh, nkv, hd, &off,
                                       S) == 0, "attention_ex launch: %s", cuda_why());
            float *a = down(o1, on, ZS_F32), *b = down(o2, on, ZS_F32);
            CHECK(memcmp(a, b, on * 4) == 0, "attention (%s): zs_cuda_attention_ex with the parameters off differs "
                  "from zs_cuda_attention_dt (error %.3g)", zs_cuda_attention_mode_name(impl), nerr(b, a, on));
            CHECK(zs_cuda_attention_ex(impl, o2, ZS_F32, dq, qd, dpool, ZS_F32, dtables, dtab, dpos, T, nh, nkv, hd, NULL,
                                       S) == 0, "attention_ex launch: %s", cuda_why());
            free(b);
            b = down(o2, on, ZS_F32);
            CHECK(memcmp(a, b, on * 4) == 0, "attention (%s): zs_cuda_attention_ex with NULL parameters differs",
                  zs_cuda_attention_mode_name(impl));
            free(a); free(b);
        }
        free(pool); free(q);
        rel(dpool); rel(dq); rel(dtab); rel(dtables); rel(dpos); rel(o1); rel(o2);
        att_batch_free(&B);
    }
    /* an infinite soft-cap is refused with its reason */
    zs_cuda_att_params bad = {0.0f, INFINITY, 0};
    CHECK(zs_cuda_attention_ex(ZS_CUDA_ATTN_AUTO, NULL, ZS_F32, NULL, 0, NULL, ZS_F32, NULL, NULL, NULL, 4, 4, 4, 64,
                               &bad, S) < 0, "attention with an infinite soft-cap was accepted");
    const char *w = zs_cuda_take_error();
    CHECK(w && strstr(w, "soft-cap"), "attention with an infinite soft-cap: reason \"%s\"", w ? w : "(none)");
}

static void test_attention(void) {
    /* a batch of 3 sequences (37, 5 and 70 positions): prefill of all, and decode of the last */
    int len3[3] = {37, 5, 70}, one3[3] = {1, 1, 1};
    int shapes[6][3] = {
        {8, 4, 8},     /* stories260K: GQA 2, head_dim 8 */
        {4, 4, 16},    /* gpt2-bytes: MHA, head_dim 16 */
        {32, 8, 128},  /* Llama 3 8B: GQA 4 */
        {12, 2, 64},   /* GQA 6: a group split over two blocks (simple), 5 tokens x 6 heads (tiled) */
        {4, 1, 256},   /* MQA, head_dim 256 (tiled: > 48 KiB of shared memory) */
        {64, 1, 32},   /* a group of 64: two blocks of 32 heads, one token each (tiled) */
    };
    for (int i = 0; i < 6; i++) {
        attention_case("prefill of 3 sequences", 3, len3, len3, shapes[i][0], shapes[i][1], shapes[i][2], 0);
        attention_case("decode of 3 sequences", 3, len3, one3, shapes[i][0], shapes[i][1], shapes[i][2], 0);
    }
    /* GQA 1 and 4, head_dim 64 and 128: decode (T = 1), T = 37 (from position 0, and a chunk
     * after 53 cached positions), a prefill of 300 tokens (19 KV pages), and a serving batch
     * (a chunk, two decodes, a short prefill: both kernels in auto) */
    int heads[4][3] = {{8, 8, 64}, {8, 2, 64}, {8, 8, 128}, {32, 8, 128}};
    for (int i = EMU ? 1 : 0; i < 4; i += EMU ? 2 : 1) {
        int nh = heads[i][0], nkv = heads[i][1], hd = heads[i][2];
        int l1 = 77, n1 = 1;
        attention_case("decode, T=1", 1, &l1, &n1, nh, nkv, hd, 0);
        int l37 = 37;
        attention_case("prefill, T=37", 1, &l37, &l37, nh, nkv, hd, 0);
        int l90 = 90, n37 = 37;
        attention_case("chunk of 37 after 53 cached", 1, &l90, &n37, nh, nkv, hd, 0);
        int l300 = EMU ? 100 : 300; /* emulated: 7 KV pages, 4 key tiles */
        attention_case(EMU ? "prefill, T=100" : "prefill, T=300", 1, &l300, &l300, nh, nkv, hd, 0);
        int lm[4] = {120, 33, 64, 20}, nm[4] = {40, 1, 1, 20};
        attention_case("serving batch", 4, lm, nm, nh, nkv, hd, 0);
    }
    /* T > 65535 (grid.y's limit, where the token index used to be): 17500 sequences of 4 (9 M
     * threads: a real device only) */
    if (EMU) {
        fprintf(stderr, "test-backend-ops: the 70000-token attention case runs on a real device only\n");
    } else {
        int n = 17500;
        int *l = malloc((size_t)n * sizeof(int));
        for (int i = 0; i < n; i++) l[i] = 4;
        attention_case("70000 tokens", n, l, l, 2, 1, 64, 1);
        free(l);
    }
    /* a 16-bit KV cache: stories260K's shape, Llama 3 8B's (a serving batch: both kernels in
     * auto), MQA at head_dim 256 (tiled: > 48 KiB of shared memory), a chunk after cached positions */
    {
        int lm[4] = {120, 33, 64, 20}, nm[4] = {40, 1, 1, 20}, l90 = 90, n37 = 37;
        attention_kv16_case("prefill of 3 sequences", 3, len3, len3, 8, 4, 8);
        attention_kv16_case("decode of 3 sequences", 3, len3, one3, 8, 4, 8);
        attention_kv16_case("serving batch", 4, lm, nm, 32, 8, 128);
        attention_kv16_case("prefill of 3 sequences", 3, len3, len3, 4, 1, 256);
        attention_kv16_case("chunk of 37 after 53 cached", 1, &l90, &n37, 12, 2, 64);
        CHECK(zs_cuda_attention_dt(ZS_CUDA_ATTN_AUTO, NULL, ZS_F32, NULL, 0, NULL, ZS_Q8_0, NULL, NULL, NULL, 4, 4, 4,
                                   64, 1.0f, S) < 0, "attention over a Q8_0 cache was accepted");
        const char *w = zs_cuda_take_error();
        CHECK(w && strstr(w, "element type"), "attention over a Q8_0 cache: reason \"%s\"", w ? w : "(none)");
        CHECK(zs_cuda_kv_store_dt(NULL, ZS_Q8_0, NULL, 0, NULL, 0, NULL, 4, 64, S) < 0, "kv store into Q8_0 was accepted");
        w = zs_cuda_take_error();
        CHECK(w && strstr(w, "element type"), "kv store into Q8_0: reason \"%s\"", w ? w : "(none)");
    }
    /* refused shapes: -1 before any launch, with the reason (zs_cuda_take_error, zs_dev_error) */
    CHECK(zs_cuda_attention_impl(ZS_CUDA_ATTN_AUTO, NULL, ZS_F32, NULL, 0, NULL, NULL, NULL, NULL, 4, 4, 4, 300, 1.0f,
                                 S) < 0, "attention with head_dim 300 was accepted");
    CHECK_ERR(zs_dev_error("attention kernel"), "attention kernel", "head_dim 300");
    for (int ii = 0; ii < 3; ii++) {
        CHECK(zs_cuda_attention_impl(ATT_IMPLS[ii], NULL, ZS_F32, NULL, 0, NULL, NULL, NULL, NULL, 4, 70000, 70000, 64,
                                     1.0f, S) < 0, "attention (%s) with 70000 kv heads was accepted",
              zs_cuda_attention_mode_name(ATT_IMPLS[ii]));
        const char *w = zs_cuda_take_error();
        CHECK(w && strstr(w, "65535"), "attention (%s) with 70000 kv heads: reason \"%s\"",
              zs_cuda_attention_mode_name(ATT_IMPLS[ii]), w ? w : "(none)");
    }
}

static void test_gemm(void) {
    int shapes[3][3] = {{1, 64, 172}, {37, 1000, 515}, {130, 4096, 1024}}; /* T, in, out */
    for (int si = 0; si < 3; si++) {
        int T = shapes[si][0], in = shapes[si][1], out = shapes[si][2];
        for (int k = 0; k < 3; k++) {
            zs_dtype dt = DTS[k];
            float *Wf = malloc((size_t)in * out * 4), *x = malloc((size_t)T * in * 4);
            float *y = malloc((size_t)T * out * 4), *y0 = malloc((size_t)T * out * 4);
            fill(Wf, (size_t)in * out, 1.0f);
            fill(x, (size_t)T * in, 1.0f);
            fill(y0, (size_t)T * out, 1.0f);
            round_to(Wf, (size_t)in * out, dt);
            round_to(x, (size_t)T * in, dt); /* the device multiplies x stored in dt */
            void *W = malloc((size_t)in * out * 4);
            zs_convert(W, dt, Wf, ZS_F32, (size_t)in * out);
            zs_op_matmul(y, x, T, in, W, dt, out, NULL);
            void *dW = up(Wf, (size_t)in * out, dt), *dx = up(x, (size_t)T * in, dt);
            float *dy = up(y0, (size_t)T * out, ZS_F32);
            CHECK(zs_dev_gemm(D, dy, dx, T, in, dW, dt, out, 0.0f) == 0, "gemm: %s", zs_errmsg());
            float *g = down(dy, (size_t)T * out, ZS_F32);
            double e = nerr(g, y, (size_t)T * out);
            CHECK(e <= 1e-4, "gemm T=%d %dx%d %s: error %.3g", T, in, out, zs_dtype_name(dt), e);
            free(g);
            /* beta = 1: the residual accumulated in place */
            ZS_ASSERT(zs_dev_upload(D, dy, y0, (size_t)T * out * 4) == 0);
            CHECK(zs_dev_gemm(D, dy, dx, T, in, dW, dt, out, 1.0f) == 0, "gemm: %s", zs_errmsg());
            g = down(dy, (size_t)T * out, ZS_F32);
            for (size_t i = 0; i < (size_t)T * out; i++) y[i] += y0[i];
            e = nerr(g, y, (size_t)T * out);
            CHECK(e <= 1e-4, "gemm (beta 1) T=%d %dx%d %s: error %.3g", T, in, out, zs_dtype_name(dt), e);
            free(g); free(Wf); free(x); free(y); free(y0); free(W);
            rel(dW); rel(dx); rel(dy);
        }
    }
}

/* ---- block-format weights (matmul-quant.cu, embed.cu) ---- */

static const zs_dtype QDTS[] = {ZS_Q8_0, ZS_Q4_0, ZS_Q4_1, ZS_Q5_0, ZS_Q5_1, ZS_Q4_K, ZS_Q6_K, ZS_Q5_K, ZS_Q3_K, ZS_Q2_K};
#define NQDTS (int)(sizeof QDTS / sizeof QDTS[0])

/* n weights of dt as random bytes (every nibble, fifth-bit and scale pattern) with small f16
 * scales (and mins) of either sign */
static uint8_t *rand_blocks(zs_dtype dt, size_t n) {
    size_t bytes = zs_dtype_bytes(dt, n), bb = zs_dtype_size(dt);
    uint8_t *W = malloc(bytes + 4);
    for (size_t i = 0; i < bytes; i++) W[i] = (uint8_t)urand(256);
    int kq = zs_dtype_block(dt) == 256;
    int d_at = dt == ZS_Q6_K ? 208 : dt == ZS_Q3_K ? 108 : dt == ZS_Q2_K ? 80 : 0;
    int m_at = dt == ZS_Q2_K ? 82 : dt == ZS_Q4_1 || dt == ZS_Q5_1 || dt == ZS_Q4_K || dt == ZS_Q5_K ? 2 : -1;
    for (size_t b = 0; b < bytes / bb; b++) {
        uint16_t d = zs_f32_to_f16(frand() * (kq ? 0.002f : 0.02f)), m = zs_f32_to_f16(frand() * 0.05f);
        memcpy(W + b * bb + d_at, &d, 2);
        if (m_at >= 0) memcpy(W + b * bb + m_at, &m, 2);
    }
    return W;
}

/* decode: the fused kernel, bit for bit the CPU product */
static void qmatmul_decode(zs_dtype dt, int T, int in, int out) {
    const char *dn = zs_dtype_name(dt);
    size_t nw = (size_t)out * in, xn = (size_t)T * in, yn = (size_t)T * out;
    uint8_t *Wq = rand_blocks(dt, nw);
    float *x = malloc(xn * 4), *y = malloc(yn * 4), *y0 = malloc(yn * 4);
    fill(x, xn, 1.0f);
    fill(y0, yn, 1.0f);
    zs_op_matmul(y, x, T, in, Wq, dt, out, NULL);
    void *dW = up_raw(Wq, zs_dtype_bytes(dt, nw));
    float *dx = up(x, xn, ZS_F32), *dy = up(y0, yn, ZS_F32);
    CHECK(zs_dev_gemm(D, dy, dx, T, in, dW, dt, out, 0.0f) == 0, "qgemm: %s", zs_errmsg());
    float *g = down(dy, yn, ZS_F32);
    size_t diff = 0;
    for (size_t i = 0; i < yn; i++) diff += memcmp(&g[i], &y[i], 4) != 0;
    CHECK(diff == 0, "%s decode T=%d %dx%d: %zu of %zu outputs differ from zs_op_matmul's bits (error %.3g)", dn, T, in,
          out, diff, yn, nerr(g, y, yn));
    free(g);
    /* beta 1: the CPU's sum of the product and y0 */
    ZS_ASSERT(zs_dev_upload(D, dy, y0, yn * 4) == 0);
    CHECK(zs_dev_gemm(D, dy, dx, T, in, dW, dt, out, 1.0f) == 0, "qgemm: %s", zs_errmsg());
    g = down(dy, yn, ZS_F32);
    diff = 0;
    for (size_t i = 0; i < yn; i++) {
        float r = y[i] + y0[i];
        diff += memcmp(&g[i], &r, 4) != 0;
    }
    CHECK(diff == 0, "%s decode (beta 1) T=%d %dx%d: %zu outputs differ from the CPU's product + y", dn, T, in, out,
          diff);
    free(g);
    /* the last token alone gives its row of the batch */
    if (T > 1) {
        CHECK(zs_dev_gemm(D, dy, dx + (size_t)(T - 1) * in, 1, in, dW, dt, out, 0.0f) == 0, "qgemm: %s", zs_errmsg());
        g = down(dy, (size_t)out, ZS_F32);
        CHECK(memcmp(g, y + (size_t)(T - 1) * out, (size_t)out * 4) == 0,
              "%s decode %dx%d: token %d alone differs from its row in a batch of %d", dn, in, out, T - 1, T);
        free(g);
    }
    free(Wq); free(x); free(y); free(y0);
    rel(dW); rel(dx); rel(dy);
}

/* prefill: bf16 operands through cuBLAS */
static void qmatmul_prefill(zs_dtype dt, int T, int in, int out) {
    const char *dn = zs_dtype_name(dt);
    size_t nw = (size_t)out * in, xn = (size_t)T * in, yn = (size_t)T * out;
    uint8_t *Wq = rand_blocks(dt, nw);
    float *Wd = malloc(nw * 4), *x = malloc(xn * 4), *xr = malloc(xn * 4);
    float *y = malloc(yn * 4), *ye = malloc(yn * 4);
    fill(x, xn, 1.0f);
    zs_to_f32(Wd, Wq, dt, nw);
    zs_op_matmul(ye, x, T, in, Wd, ZS_F32, out, NULL); /* exact operands */
    round_to(Wd, nw, ZS_BF16);
    memcpy(xr, x, xn * 4);
    round_to(xr, xn, ZS_BF16);
    zs_op_matmul(y, xr, T, in, Wd, ZS_F32, out, NULL); /* the operands the device multiplies */
    void *dW = up_raw(Wq, zs_dtype_bytes(dt, nw));
    float *dx = up(x, xn, ZS_F32), *dy = zs_dev_alloc(D, yn * 4);
    CHECK(zs_dev_gemm(D, dy, dx, T, in, dW, dt, out, 0.0f) == 0, "qgemm: %s", zs_errmsg());
    float *g = down(dy, yn, ZS_F32);
    double e = nerr(g, y, yn), ee = nerr(g, ye, yn);
    CHECK(e <= 1e-4, "%s prefill T=%d %dx%d: error %.3g against the f32 product of the bf16-rounded operands", dn, T,
          in, out, e);
    CHECK(ee <= 1e-2, "%s prefill T=%d %dx%d: error %.3g against the exact operands' product", dn, T, in, out, ee);
    fprintf(stderr, "  %s prefill T=%d %dx%d: error %.2g (bf16 operands), %.2g (exact operands)\n", dn, T, in, out, e,
            ee);
    free(g);
    free(Wq); free(Wd); free(x); free(xr); free(y); free(ye);
    rel(dW); rel(dx); rel(dy);
}

static void test_qembed(zs_dtype dt) {
    int rows = 300, d = 512, T = 37;
    size_t n = (size_t)rows * d;
    uint8_t *tab = rand_blocks(dt, n), *ptab = rand_blocks(dt, n);
    int32_t ids[37], pos[37];
    for (int t = 0; t < T; t++) { ids[t] = (t * 131 + 7) % rows; pos[t] = t * 3; }
    float *ref = malloc((size_t)T * d * 4), *tmp = malloc((size_t)d * 4);
    for (int t = 0; t < T; t++) {
        zs_op_embed(ref + (size_t)t * d, tab, dt, d, ids[t]);
        zs_op_embed(tmp, ptab, dt, d, pos[t]);
        zs_op_add(ref + (size_t)t * d, tmp, (size_t)d);
    }
    void *dtab = up_raw(tab, zs_dtype_bytes(dt, n)), *dpt = up_raw(ptab, zs_dtype_bytes(dt, n));
    int32_t *dids = up_raw(ids, sizeof ids), *dpos = up_raw(pos, sizeof pos);
    float *out = zs_dev_alloc(D, (size_t)T * d * 4);
    CHECK(zs_cuda_embed(out, dtab, dt, dids, dpt, dt, dpos, T, d, S) == 0, "embed %s launch: %s", zs_dtype_name(dt),
          cuda_why());
    float *g = down(out, (size_t)T * d, ZS_F32);
    CHECK(memcmp(g, ref, (size_t)T * d * 4) == 0, "embed %s: differs from zs_op_embed (error %.3g)", zs_dtype_name(dt),
          nerr(g, ref, (size_t)T * d));
    free(g); free(tab); free(ptab); free(ref); free(tmp);
    rel(dtab); rel(dpt); rel(dids); rel(dpos); rel(out);
}

static void test_qmatmul(void) {
    for (int q = 0; q < NQDTS; q++) {
        zs_dtype dt = QDTS[q];
        qmatmul_decode(dt, 1, 1024, 300); /* 300 rows: the last kernel block is partly empty */
        qmatmul_decode(dt, 1, 256, 1);
        qmatmul_decode(dt, 3, 512, 77);
        qmatmul_decode(dt, 8, 1024, 300);
        qmatmul_prefill(dt, 9, 1024, 300);
        qmatmul_prefill(dt, 64, 1024, 300);
        test_qembed(dt);
    }
    qmatmul_prefill(ZS_Q4_K, 64, 1024, 40000); /* 40000 rows of bf16: two chunks */
    /* refusals, with the reason */
    uint8_t *buf = zs_dev_alloc(D, 1 << 16);
    CHECK(zs_cuda_qgemv((float *)buf, 8, (float *)buf, 9, 256, buf, ZS_Q8_0, 8, 0.0f, S) < 0, "qgemv with T=9 accepted");
    const char *w = zs_cuda_take_error();
    CHECK(w && strstr(w, "9 tokens"), "qgemv with T=9: reason \"%s\"", w ? w : "(none)");
    CHECK(zs_cuda_qgemv((float *)buf, 8, (float *)buf, 1, 128, buf, ZS_Q4_K, 8, 0.0f, S) < 0,
          "qgemv over Q4_K rows of 128 accepted");
    w = zs_cuda_take_error();
    CHECK(w && strstr(w, "whole blocks of 256"), "qgemv over Q4_K rows of 128: reason \"%s\"", w ? w : "(none)");
    CHECK(zs_cuda_dequant(buf, ZS_BF16, buf, ZS_BF16, 1, 64, S) < 0, "dequantize from bf16 accepted");
    w = zs_cuda_take_error();
    CHECK(w && strstr(w, "not a block format"), "dequantize from bf16: reason \"%s\"", w ? w : "(none)");
    CHECK_ERR(zs_dev_gemm(D, (float *)buf, buf, 1, 100, buf, ZS_Q8_0, 4, 0.0f), "Q8_0", "rows of 100");
    rel(buf);
}

/* ---- backward kernels (backward.cu) against the CPU ops of ops-backward.c, f32 ---- */

static double rel_l2(const float *a, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    if (isnan(num)) return INFINITY;
    return sqrt(num) / (den > 1e-24 ? sqrt(den) : 1e-12);
}

/* downloads n f32 values and compares them with ref under a relative L2 threshold */
static void cmp_dev(const float *d, const float *ref, size_t n, double tol, const char *what) {
    float *g = down(d, n, ZS_F32);
    double e = rel_l2(g, ref, n);
    CHECK(e <= tol, "%s: relative L2 error %.3g (threshold %.1g)", what, e, tol);
    free(g);
}

static float *frnd(size_t n, float scale) {
    float *x = malloc(n * 4 + 4);
    fill(x, n, scale);
    return x;
}

static void test_norms_bwd(void) {
    int dims[3] = {64, 1000, 4096}, T = 67;
    char what[128];
    for (int di = 0; di < 3; di++) {
        int d = dims[di];
        size_t n = (size_t)T * d;
        float *x = frnd(n, 3.0f), *gy = frnd(n, 1.0f), *w = frnd((size_t)d, 1.0f);
        float *dx0 = frnd(n, 1.0f), *dw0 = frnd((size_t)d, 1.0f), *db0 = frnd((size_t)d, 1.0f);
        float *rdx = malloc(n * 4), *rdw = malloc((size_t)d * 4), *rdb = malloc((size_t)d * 4);
        float *gx = up(x, n, ZS_F32), *ggy = up(gy, n, ZS_F32), *gw = up(w, (size_t)d, ZS_F32);
        float *st = zs_dev_alloc(D, (size_t)T * 2 * 4);
        for (int ln = 0; ln < 2; ln++) {
            memcpy(rdx, dx0, n * 4);
            memcpy(rdw, dw0, (size_t)d * 4);
            memcpy(rdb, db0, (size_t)d * 4);
            float *gdx = up(dx0, n, ZS_F32), *gdw = up(dw0, (size_t)d, ZS_F32), *gdb = up(db0, (size_t)d, ZS_F32);
            if (ln) {
                zs_op_layernorm_bwd(rdx, rdw, rdb, gy, x, w, T, d, 1e-5f);
                CHECK(zs_cuda_layernorm_bwd(gdx, gdw, gdb, ggy, gx, gw, T, d, 1e-5f, st, S) == 0,
                      "layernorm_bwd launch");
            } else {
                zs_op_rmsnorm_bwd(rdx, rdw, gy, x, w, T, d, 1e-5f);
                CHECK(zs_cuda_rmsnorm_bwd(gdx, gdw, ggy, gx, gw, T, d, 1e-5f, st, S) == 0, "rmsnorm_bwd launch");
            }
            const char *nm = ln ? "layernorm_bwd" : "rmsnorm_bwd";
            snprintf(what, sizeof what, "%s d=%d dx", nm, d);
            cmp_dev(gdx, rdx, n, 1e-5, what);
            snprintf(what, sizeof what, "%s d=%d dw", nm, d);
            cmp_dev(gdw, rdw, (size_t)d, 1e-5, what);
            if (ln) {
                snprintf(what, sizeof what, "%s d=%d db", nm, d);
                cmp_dev(gdb, rdb, (size_t)d, 1e-5, what);
            }
            /* dw (and db) NULL: dx only, no scratch */
            ZS_ASSERT(zs_dev_upload(D, gdx, dx0, n * 4) == 0);
            CHECK((ln ? zs_cuda_layernorm_bwd(gdx, NULL, NULL, ggy, gx, gw, T, d, 1e-5f, NULL, S)
                      : zs_cuda_rmsnorm_bwd(gdx, NULL, ggy, gx, gw, T, d, 1e-5f, NULL, S)) == 0,
                  "%s launch (dx only)", nm);
            snprintf(what, sizeof what, "%s d=%d dx (no dw)", nm, d);
            cmp_dev(gdx, rdx, n, 1e-5, what);
            rel(gdx); rel(gdw); rel(gdb);
        }
        free(x); free(gy); free(w); free(dx0); free(dw0); free(db0); free(rdx); free(rdw); free(rdb);
        rel(gx); rel(ggy); rel(gw); rel(st);
    }
}

static void test_rope_bwd(void) {
    int T = 23, nh = 6, hd = 128, ld = nh * hd + 32;
    float theta[2] = {10000.0f, 500000.0f};
    for (int k = 0; k < 2; k++) {
        size_t n = (size_t)T * ld;
        float *x = frnd(n, 2.0f), *ref = malloc(n * 4);
        memcpy(ref, x, n * 4);
        int32_t pos[23];
        for (int t = 0; t < T; t++) pos[t] = t * 181;
        for (int t = 0; t < T; t++) zs_op_rope_bwd(ref + (size_t)t * ld, nh, hd, pos[t], theta[k]);
        float *dx = up(x, n, ZS_F32), *tabl = rope_table(hd, theta[k]);
        int32_t *dp = up_raw(pos, sizeof pos);
        CHECK(zs_cuda_rope_bwd(dx, T, ld, nh, hd, dp, tabl, S) == 0, "rope_bwd launch: %s", cuda_why());
        char what[64];
        snprintf(what, sizeof what, "rope_bwd theta %g", theta[k]);
        cmp_dev(dx, ref, n, 1e-5, what);
        free(x); free(ref); rel(dx); rel(dp); rel(tabl);
    }
}

static void test_act_bwd(void) {
    size_t n = 70001;
    float *x = frnd(n, 6.0f), *u = frnd(n, 2.0f), *gy = frnd(n, 1.0f), *acc = frnd(n, 1.0f);
    float *r1 = malloc(n * 4), *r2 = malloc(n * 4);
    float *gx = up(x, n, ZS_F32), *gu = up(u, n, ZS_F32), *ggy = up(gy, n, ZS_F32);
    float *o1 = zs_dev_alloc(D, n * 4), *o2 = zs_dev_alloc(D, n * 4);
    zs_op_swiglu_bwd(r1, r2, gy, x, u, n);
    CHECK(zs_cuda_swiglu_bwd(o1, o2, ggy, gx, gu, n, S) == 0, "swiglu_bwd launch");
    cmp_dev(o1, r1, n, 1e-5, "swiglu_bwd dgate");
    cmp_dev(o2, r2, n, 1e-5, "swiglu_bwd dup");
    /* dgate aliasing dy */
    ZS_ASSERT(zs_dev_upload(D, o1, gy, n * 4) == 0);
    CHECK(zs_cuda_swiglu_bwd(o1, o2, o1, gx, gu, n, S) == 0, "swiglu_bwd launch");
    cmp_dev(o1, r1, n, 1e-5, "swiglu_bwd dgate (aliasing dy)");
    cmp_dev(o2, r2, n, 1e-5, "swiglu_bwd dup (dgate aliasing dy)");
    zs_op_gelu_bwd(r1, gy, x, n);
    CHECK(zs_cuda_gelu_bwd(o1, ggy, gx, n, S) == 0, "gelu_bwd launch");
    cmp_dev(o1, r1, n, 1e-5, "gelu_bwd");
    ZS_ASSERT(zs_dev_upload(D, o1, gy, n * 4) == 0);
    CHECK(zs_cuda_gelu_bwd(o1, o1, gx, n, S) == 0, "gelu_bwd launch");
    cmp_dev(o1, r1, n, 1e-5, "gelu_bwd (in place)");
    memcpy(r1, acc, n * 4);
    zs_op_add_bwd(r1, gy, n);
    ZS_ASSERT(zs_dev_upload(D, o1, acc, n * 4) == 0);
    CHECK(zs_cuda_add_bwd(o1, ggy, n, S) == 0, "add_bwd launch");
    cmp_dev(o1, r1, n, 1e-7, "add_bwd");
    free(x); free(u); free(gy); free(acc); free(r1); free(r2);
    rel(gx); rel(gu); rel(ggy); rel(o1); rel(o2);
}

/* the backward of the family pieces: RMSNorm with offset 1, GeGLU, soft-cap (rope_freq_bwd is in
 * test_family_ops, next to its forward) */
static void test_family_bwd(void) {
    int dims[2] = {64, 1000}, T = 67;
    char what[128];
    for (int di = 0; di < 2; di++) {
        int d = dims[di];
        size_t n = (size_t)T * d;
        float *x = frnd(n, 3.0f), *gy = frnd(n, 1.0f), *w = frnd((size_t)d, 0.5f);
        float *dx0 = frnd(n, 1.0f), *dw0 = frnd((size_t)d, 1.0f);
        float *rdx = malloc(n * 4), *rdw = malloc((size_t)d * 4);
        memcpy(rdx, dx0, n * 4);
        memcpy(rdw, dw0, (size_t)d * 4);
        zs_op_rmsnorm_off_bwd(rdx, rdw, gy, x, w, T, d, 1e-6f, 1.0f);
        float *gx = up(x, n, ZS_F32), *ggy = up(gy, n, ZS_F32), *gw = up(w, (size_t)d, ZS_F32);
        float *gdx = up(dx0, n, ZS_F32), *gdw = up(dw0, (size_t)d, ZS_F32), *st = zs_dev_alloc(D, (size_t)T * 2 * 4);
        CHECK(zs_cuda_rmsnorm_off_bwd(gdx, gdw, ggy, gx, gw, 1.0f, T, d, 1e-6f, st, S) == 0, "rmsnorm_off_bwd launch");
        snprintf(what, sizeof what, "rmsnorm_off_bwd (offset 1) d=%d dx", d);
        cmp_dev(gdx, rdx, n, 1e-5, what);
        snprintf(what, sizeof what, "rmsnorm_off_bwd (offset 1) d=%d dw", d);
        cmp_dev(gdw, rdw, (size_t)d, 1e-5, what);
        free(x); free(gy); free(w); free(dx0); free(dw0); free(rdx); free(rdw);
        rel(gx); rel(ggy); rel(gw); rel(gdx); rel(gdw); rel(st);
    }
    size_t n = 70001;
    float *x = frnd(n, 6.0f), *u = frnd(n, 2.0f), *gy = frnd(n, 1.0f);
    float *r1 = malloc(n * 4), *r2 = malloc(n * 4);
    float *gx = up(x, n, ZS_F32), *gu = up(u, n, ZS_F32), *ggy = up(gy, n, ZS_F32);
    float *o1 = zs_dev_alloc(D, n * 4), *o2 = zs_dev_alloc(D, n * 4);
    zs_op_geglu_bwd(r1, r2, gy, x, u, n);
    CHECK(zs_cuda_geglu_bwd(o1, o2, ggy, gx, gu, n, S) == 0, "geglu_bwd launch");
    cmp_dev(o1, r1, n, 1e-5, "geglu_bwd dgate");
    cmp_dev(o2, r2, n, 1e-5, "geglu_bwd dup");
    ZS_ASSERT(zs_dev_upload(D, o2, gy, n * 4) == 0);
    CHECK(zs_cuda_geglu_bwd(o1, o2, o2, gx, gu, n, S) == 0, "geglu_bwd launch");
    cmp_dev(o1, r1, n, 1e-5, "geglu_bwd dgate (dup aliasing dy)");
    cmp_dev(o2, r2, n, 1e-5, "geglu_bwd dup (aliasing dy)");
    /* soft-cap from the forward's output, cap 30 over +-100 and 0.5 */
    float caps[2] = {30.0f, 0.5f};
    for (int ci = 0; ci < 2; ci++) {
        float *v = frnd(n, 100.0f);
        zs_op_softcap(v, n, caps[ci]);
        float *gv = up(v, n, ZS_F32);
        zs_op_softcap_bwd(r1, gy, v, n, caps[ci]);
        CHECK(zs_cuda_softcap_bwd(o1, ggy, gv, n, caps[ci], S) == 0, "softcap_bwd launch");
        snprintf(what, sizeof what, "softcap_bwd %g", caps[ci]);
        cmp_dev(o1, r1, n, 1e-5, what);
        ZS_ASSERT(zs_dev_upload(D, o1, gy, n * 4) == 0);
        CHECK(zs_cuda_softcap_bwd(o1, o1, gv, n, caps[ci], S) == 0, "softcap_bwd launch");
        snprintf(what, sizeof what, "softcap_bwd %g (in place)", caps[ci]);
        cmp_dev(o1, r1, n, 1e-5, what);
        free(v); rel(gv);
    }
    CHECK(zs_cuda_softcap_bwd(o1, ggy, gx, n, -1.0f, S) < 0, "softcap_bwd with cap -1 was accepted");
    const char *w = zs_cuda_take_error();
    CHECK(w && strstr(w, "cap"), "softcap_bwd with cap -1: reason \"%s\"", w ? w : "(none)");
    free(x); free(u); free(gy); free(r1); free(r2);
    rel(gx); rel(gu); rel(ggy); rel(o1); rel(o2);
}

static void test_embed_bwd(void) {
    int rows = 300, d = 200, T = 517; /* T > rows: ids repeat */
    size_t tn = (size_t)rows * d, n = (size_t)T * d;
    float *tab = frnd(tn, 1.0f), *gy = frnd(n, 1.0f);
    int32_t *ids = malloc((size_t)T * 4);
    for (int t = 0; t < T; t++) ids[t] = (int32_t)((unsigned)(t * 131 + 7) * 2654435761u % 97u) * 3;
    float *gt = up(tab, tn, ZS_F32), *ggy = up(gy, n, ZS_F32);
    int32_t *gids = up_raw(ids, (size_t)T * 4);
    zs_op_embed_bwd(tab, gy, ids, T, d);
    CHECK(zs_cuda_embed_bwd(gt, ggy, gids, T, d, S) == 0, "embed_bwd launch");
    float *g = down(gt, tn, ZS_F32);
    /* the same float additions in the same order: equal bit for bit */
    CHECK(memcmp(g, tab, tn * 4) == 0, "embed_bwd: differs from the CPU scatter-add (relative L2 %.3g)",
          rel_l2(g, tab, tn));
    free(g); free(tab); free(gy); free(ids); rel(gt); rel(ggy); rel(gids);
}

static void test_xent(void) {
    int T = 7, V = 32003;
    size_t n = (size_t)T * V;
    float *lg = frnd(n, 8.0f), *ref = malloc(n * 4);
    int32_t tg[7] = {5, -1, 32002, 0, 1234, -1, 777};
    float scale = 1.0f / 5.0f;
    double rl = zs_op_cross_entropy(ref, lg, tg, T, V, scale);
    float *glg = up(lg, n, ZS_F32), *gd = zs_dev_alloc(D, n * 4), *grow = zs_dev_alloc(D, (size_t)T * 4);
    int32_t *gtg = up_raw(tg, sizeof tg);
    double *gl = zs_dev_alloc(D, sizeof(double)), loss = 0;
    CHECK(zs_cuda_cross_entropy(gd, grow, gl, glg, gtg, T, V, scale, S) == 0, "cross_entropy launch");
    cmp_dev(gd, ref, n, 1e-5, "cross_entropy dlogits");
    ZS_ASSERT(zs_dev_sync(D) == 0 && zs_dev_download(D, &loss, gl, sizeof loss) == 0);
    CHECK(fabs(loss - rl) <= 1e-5 * fabs(rl), "cross_entropy loss %.9g, CPU %.9g", loss, rl);
    float *rows = down(grow, (size_t)T, ZS_F32);
    CHECK(rows[1] == 0.0f && rows[5] == 0.0f, "cross_entropy: masked rows have loss %g, %g", rows[1], rows[5]);
    free(rows);
    /* in place (dlogits aliasing logits), no loss sum */
    CHECK(zs_cuda_cross_entropy(glg, grow, NULL, glg, gtg, T, V, scale, S) == 0, "cross_entropy launch");
    cmp_dev(glg, ref, n, 1e-5, "cross_entropy dlogits (in place)");
    free(lg); free(ref); rel(glg); rel(gd); rel(grow); rel(gtg); rel(gl);
}

static void attention_bwd_case_p(int T, int nh, int nkv, int hd, const zs_cuda_att_params *ap) {
    size_t qn = (size_t)T * nh * hd, kn = (size_t)T * nkv * hd;
    float *q = frnd(qn, 2.0f), *k = frnd(kn, 1.0f), *v = frnd(kn, 1.0f), *go = frnd(qn, 1.0f);
    float *dq = frnd(qn, 0.1f), *dk = frnd(kn, 0.1f), *dv = frnd(kn, 0.1f);
    float *gq = up(q, qn, ZS_F32), *gk = up(k, kn, ZS_F32), *gv = up(v, kn, ZS_F32), *ggo = up(go, qn, ZS_F32);
    float *gdq = up(dq, qn, ZS_F32), *gdk = up(dk, kn, ZS_F32), *gdv = up(dv, kn, ZS_F32);
    float *st = zs_dev_alloc(D, (size_t)T * nh * 3 * 4), *sc = malloc((size_t)T * 2 * 4);
    zs_att_params cpu_ap = {ap ? ap->scale : 0.0f, ap ? ap->softcap : 0.0f, ap ? ap->window : 0};
    zs_op_attention_bwd(dq, dk, dv, go, q, k, v, T, nh, nkv, hd, sc, ap ? &cpu_ap : NULL);
    int rc = ap ? zs_cuda_attention_bwd_ex(gdq, gdk, gdv, ggo, gq, gk, gv, T, nh, nkv, hd, ap, st, S)
                : zs_cuda_attention_bwd(gdq, gdk, gdv, ggo, gq, gk, gv, T, nh, nkv, hd, st, S);
    CHECK(rc == 0, "attention_bwd launch: %s", cuda_why());
    char what[160], pn[96] = "";
    if (ap) snprintf(pn, sizeof pn, " [scale %g, soft-cap %g, window %d]", ap->scale, ap->softcap, ap->window);
    snprintf(what, sizeof what, "attention_bwd%s T=%d %d/%d heads x %d: dq", pn, T, nh, nkv, hd);
    cmp_dev(gdq, dq, qn, 1e-4, what);
    snprintf(what, sizeof what, "attention_bwd%s T=%d %d/%d heads x %d: dk", pn, T, nh, nkv, hd);
    cmp_dev(gdk, dk, kn, 1e-4, what);
    snprintf(what, sizeof what, "attention_bwd%s T=%d %d/%d heads x %d: dv", pn, T, nh, nkv, hd);
    cmp_dev(gdv, dv, kn, 1e-4, what);
    free(q); free(k); free(v); free(go); free(dq); free(dk); free(dv); free(sc);
    rel(gq); rel(gk); rel(gv); rel(ggo); rel(gdq); rel(gdk); rel(gdv); rel(st);
}

static void attention_bwd_case(int T, int nh, int nkv, int hd) { attention_bwd_case_p(T, nh, nkv, hd, NULL); }

static void test_attention_bwd(void) {
    /* the family parameters: windows of 1, 7 (not a divisor of anything here), 16 and longer than
     * T, Gemma's scale with a soft-cap that bends these scores, both together */
    zs_cuda_att_params aps[6] = {{0, 0, 1}, {0, 0, 7}, {0, 0, 16}, {0, 0, 100}, {0.0625f, 0.75f, 0}, {0.0625f, 0.75f, 7}};
    for (int i = 0; i < 6; i++) {
        attention_bwd_case_p(37, 8, 4, 8, &aps[i]);
        attention_bwd_case_p(50, 32, 8, 128, &aps[i]);
        attention_bwd_case_p(21, 4, 1, 256, &aps[i]);
        attention_bwd_case_p(1, 2, 1, 40, &aps[i]);
    }
    attention_bwd_case(37, 8, 4, 8);
    attention_bwd_case(70, 4, 4, 16);
    attention_bwd_case(50, 32, 8, 128);
    attention_bwd_case(33, 12, 2, 64);
    attention_bwd_case(21, 4, 1, 256);
    attention_bwd_case(1, 2, 1, 40); /* one token; hd not a multiple of 32 */
}

/* The training forward's attention (engine/train/backward-cuda.c): B sequences of T tokens stored
 * contiguously in a pool through zs_cuda_kv_store_dt (sequence b's positions in blocks
 * b*nblk .. b*nblk+nblk-1, identity block tables) and read back by zs_cuda_attention_ex, each
 * kernel, against the CPU's training op zs_op_attention_fwd over each sequence's contiguous K/V
 * (relative L2 1e-5), with the family parameters. */
static void train_attention_case(int B, int T, int nh, int nkv, int hd, const zs_cuda_att_params *ap) {
    int N = B * T, qd = nh * hd, kvd = nkv * hd, nblk = (T + 15) / 16, nb = B * nblk;
    size_t qn = (size_t)N * qd, kn = (size_t)N * kvd, pool_n = (size_t)nb * 2 * 16 * kvd;
    float *q = frnd(qn, 2.0f), *k = frnd(kn, 1.0f), *v = frnd(kn, 1.0f), *ref = malloc(qn * 4), *sc = malloc((size_t)T * 2 * 4);
    zs_att_params cpu_ap = {ap ? ap->scale : 0.0f, ap ? ap->softcap : 0.0f, ap ? ap->window : 0};
    for (int b = 0; b < B; b++)
        zs_op_attention_fwd(ref + (size_t)b * T * qd, q + (size_t)b * T * qd, k + (size_t)b * T * kvd,
                            v + (size_t)b * T * kvd, T, nh, nkv, hd, sc, ap ? &cpu_ap : NULL);
    int32_t *tables = malloc((size_t)nb * 4), *tab = malloc((size_t)N * 4), *pos = malloc((size_t)N * 4);
    int64_t *off = malloc((size_t)N * 8);
    for (int i = 0; i < nb; i++) tables[i] = i;
    for (int i = 0; i < N; i++) {
        int b = i / T, p = i % T, blk = b * nblk + p / 16;
        tab[i] = b * nblk;
        pos[i] = p;
        off[i] = ((int64_t)blk * 2 * 16 + p % 16) * kvd;
    }
    float *gq = up(q, qn, ZS_F32), *gk = up(k, kn, ZS_F32), *gv = up(v, kn, ZS_F32);
    float *pool = zs_dev_alloc(D, pool_n * 4), *out = zs_dev_alloc(D, qn * 4);
    int32_t *gtables = up_raw(tables, (size_t)nb * 4), *gtab = up_raw(tab, (size_t)N * 4), *gpos = up_raw(pos, (size_t)N * 4);
    int64_t *goff = up_raw(off, (size_t)N * 8);
    CHECK(zs_cuda_kv_store_dt(pool, ZS_F32, gk, kvd, gv, kvd, goff, N, kvd, S) == 0, "kv_store launch: %s", cuda_why());
    char what[192], pn[96] = "";
    if (ap) snprintf(pn, sizeof pn, " [scale %g, soft-cap %g, window %d]", ap->scale, ap->softcap, ap->window);
    for (int ii = 0; ii < 3; ii++) {
        CHECK(zs_cuda_attention_ex(ATT_IMPLS[ii], out, ZS_F32, gq, qd, pool, ZS_F32, gtables, gtab, gpos, N, nh, nkv, hd,
                                   ap, S) == 0, "attention launch: %s", cuda_why());
        snprintf(what, sizeof what, "training attention (%s)%s %d x %d tokens, %d/%d heads x %d",
                 zs_cuda_attention_mode_name(ATT_IMPLS[ii]), pn, B, T, nh, nkv, hd);
        cmp_dev(out, ref, qn, 1e-5, what);
    }
    free(q); free(k); free(v); free(ref); free(sc); free(tables); free(tab); free(pos); free(off);
    rel(gq); rel(gk); rel(gv); rel(pool); rel(out); rel(gtables); rel(gtab); rel(gpos); rel(goff);
}

static void test_train_attention(void) {
    zs_cuda_att_params aps[3] = {{0, 0, 7}, {0.0625f, 0.75f, 0}, {0.0625f, 0.75f, 16}};
    train_attention_case(2, 32, 8, 4, 8, NULL);   /* stories260K's shape */
    train_attention_case(3, 45, 4, 4, 16, NULL);  /* T not a multiple of the block */
    train_attention_case(2, 70, 32, 8, 128, NULL);
    train_attention_case(1, 1, 2, 1, 40, NULL);
    for (int i = 0; i < 3; i++) train_attention_case(2, 37, 8, 2, 64, &aps[i]);
}

/* What the device trainer adds to the backward kernels' use: RMSNorm backward with offset 0 is
 * zs_cuda_rmsnorm_bwd bit for bit; the per-head q/k norm backward (T*heads rows of head_dim, offset
 * 0 and 1) against the CPU op; a cross-entropy block whose rows are all masked (loss 0, gradient 0). */
static void test_train_extra_bwd(void) {
    int T = 67, d = 1000;
    size_t n = (size_t)T * d;
    float *x = frnd(n, 3.0f), *gy = frnd(n, 1.0f), *w = frnd((size_t)d, 1.0f), *dx0 = frnd(n, 1.0f), *dw0 = frnd((size_t)d, 1.0f);
    float *gx = up(x, n, ZS_F32), *ggy = up(gy, n, ZS_F32), *gw = up(w, (size_t)d, ZS_F32), *st = zs_dev_alloc(D, (size_t)T * 2 * 4);
    float *a = up(dx0, n, ZS_F32), *aw = up(dw0, (size_t)d, ZS_F32), *b = up(dx0, n, ZS_F32), *bw = up(dw0, (size_t)d, ZS_F32);
    CHECK(zs_cuda_rmsnorm_bwd(a, aw, ggy, gx, gw, T, d, 1e-5f, st, S) == 0, "rmsnorm_bwd launch");
    CHECK(zs_cuda_rmsnorm_off_bwd(b, bw, ggy, gx, gw, 0.0f, T, d, 1e-5f, st, S) == 0, "rmsnorm_off_bwd launch");
    float *ha = down(a, n, ZS_F32), *hb = down(b, n, ZS_F32), *haw = down(aw, (size_t)d, ZS_F32), *hbw = down(bw, (size_t)d, ZS_F32);
    CHECK(memcmp(ha, hb, n * 4) == 0 && memcmp(haw, hbw, (size_t)d * 4) == 0,
          "rmsnorm_off_bwd with offset 0 differs from rmsnorm_bwd");
    free(ha); free(hb); free(haw); free(hbw);
    free(x); free(gy); free(w); free(dx0); free(dw0);
    rel(gx); rel(ggy); rel(gw); rel(st); rel(a); rel(aw); rel(b); rel(bw);
    /* per head: 23 tokens x 6 heads of 128 */
    int R = 23 * 6, hd = 128;
    float offs[2] = {0.0f, 1.0f};
    for (int oi = 0; oi < 2; oi++) {
        size_t m = (size_t)R * hd;
        float *hx = frnd(m, 3.0f), *hy = frnd(m, 1.0f), *hw = frnd((size_t)hd, 0.5f);
        float *rdx = calloc(m, 4), *rdw = calloc((size_t)hd, 4); /* from zero, as the trainer's */
        float *dxx = up(hx, m, ZS_F32), *dyy = up(hy, m, ZS_F32), *dww = up(hw, (size_t)hd, ZS_F32);
        float *gdx = up(rdx, m, ZS_F32), *gdw = up(rdw, (size_t)hd, ZS_F32), *hst = zs_dev_alloc(D, (size_t)R * 2 * 4);
        zs_op_rmsnorm_off_bwd(rdx, rdw, hy, hx, hw, R, hd, 1e-6f, offs[oi]);
        CHECK(zs_cuda_rmsnorm_off_bwd(gdx, gdw, dyy, dxx, dww, offs[oi], R, hd, 1e-6f, hst, S) == 0,
              "rmsnorm_off_bwd (per head) launch");
        char what[96];
        snprintf(what, sizeof what, "q/k norm backward (%d rows of %d, offset %g) dx", R, hd, offs[oi]);
        cmp_dev(gdx, rdx, m, 1e-5, what);
        snprintf(what, sizeof what, "q/k norm backward (%d rows of %d, offset %g) dw", R, hd, offs[oi]);
        cmp_dev(gdw, rdw, (size_t)hd, 1e-5, what);
        free(hx); free(hy); free(hw); free(rdx); free(rdw);
        rel(dxx); rel(dyy); rel(dww); rel(gdx); rel(gdw); rel(hst);
    }
    /* cross-entropy over rows that are all masked */
    int Tm = 3, V = 1000;
    size_t nv = (size_t)Tm * V;
    float *lg = frnd(nv, 8.0f);
    int32_t tg[3] = {-1, -1, -5};
    float *glg = up(lg, nv, ZS_F32), *grow = zs_dev_alloc(D, (size_t)Tm * 4);
    int32_t *gtg = up_raw(tg, sizeof tg);
    double *gl = zs_dev_alloc(D, sizeof(double)), loss = 1.0;
    CHECK(zs_cuda_cross_entropy(glg, grow, gl, glg, gtg, Tm, V, 0.5f, S) == 0, "cross_entropy launch");
    ZS_ASSERT(zs_dev_sync(D) == 0 && zs_dev_download(D, &loss, gl, sizeof loss) == 0);
    float *g = down(glg, nv, ZS_F32);
    int zero = 1;
    for (size_t i = 0; i < nv; i++) zero &= g[i] == 0.0f;
    CHECK(loss == 0.0 && zero, "cross_entropy over masked rows: loss %g, gradient zero %d", loss, zero);
    free(g); free(lg);
    rel(glg); rel(grow); rel(gtg); rel(gl);
}

static void test_matmul_bwd(void) {
    cublasHandle_t h = NULL;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS || cublasSetStream(h, S) != CUBLAS_STATUS_SUCCESS) {
        CHECK(0, "cublasCreate / cublasSetStream failed");
        return;
    }
    int shapes[3][3] = {{1, 64, 172}, {37, 1000, 515}, {130, 300, 2500}}; /* T, in, out; 2500 > one block */
    char what[128];
    for (int si = 0; si < 3; si++) {
        int T = shapes[si][0], in = shapes[si][1], out = shapes[si][2];
        size_t wn = (size_t)in * out, xn = (size_t)T * in, yn = (size_t)T * out;
        for (int kd = 0; kd < 3; kd++) {
            zs_dtype dt = DTS[kd];
            float *Wf = frnd(wn, 1.0f), *x = frnd(xn, 1.0f), *gy = frnd(yn, 1.0f);
            float *dx = frnd(xn, 1.0f), *dW = frnd(wn, 1.0f), *db = frnd((size_t)out, 1.0f);
            round_to(Wf, wn, dt);
            void *W = malloc(wn * 4);
            zs_convert(W, dt, Wf, ZS_F32, wn);
            void *gW = up(Wf, wn, dt);
            float *gx = up(x, xn, ZS_F32), *ggy = up(gy, yn, ZS_F32);
            float *gdx = up(dx, xn, ZS_F32), *gdW = up(dW, wn, ZS_F32), *gdb = up(db, (size_t)out, ZS_F32);
            float *ws = zs_dev_alloc(D, (size_t)ZS_CUDA_MATMUL_BWD_ROWS * in * 4);
            float *cws = malloc((size_t)ZS_MATMUL_BWD_BLOCK * in * 4);
            zs_op_matmul_bwd(dx, dW, db, gy, x, W, dt, T, in, out, cws);
            CHECK(zs_cuda_matmul_bwd(h, gdx, gdW, gdb, ggy, gx, gW, dt, T, in, out, ws, S) == 0,
                  "matmul_bwd launch");
            snprintf(what, sizeof what, "matmul_bwd T=%d %dx%d %s: dx", T, in, out, zs_dtype_name(dt));
            cmp_dev(gdx, dx, xn, 5e-5, what);
            snprintf(what, sizeof what, "matmul_bwd T=%d %dx%d %s: dW", T, in, out, zs_dtype_name(dt));
            cmp_dev(gdW, dW, wn, 5e-5, what);
            snprintf(what, sizeof what, "matmul_bwd T=%d %dx%d %s: db", T, in, out, zs_dtype_name(dt));
            cmp_dev(gdb, db, (size_t)out, 1e-5, what);
            free(Wf); free(x); free(gy); free(dx); free(dW); free(db); free(W); free(cws);
            rel(gW); rel(gx); rel(ggy); rel(gdx); rel(gdW); rel(gdb); rel(ws);
        }
    }
    /* a handle bound to another stream is refused */
    CHECK(cublasSetStream(h, NULL) == CUBLAS_STATUS_SUCCESS, "cublasSetStream");
    if (S != NULL) {
        float *buf = zs_dev_alloc(D, 64 * 4);
        CHECK(zs_cuda_matmul_bwd(h, buf, NULL, NULL, buf, buf, buf, ZS_F32, 1, 8, 8, NULL, S) < 0,
              "matmul_bwd accepted a handle bound to another stream");
        rel(buf);
    }
    ZS_ASSERT(zs_dev_sync(D) == 0);
    cublasDestroy(h);
}

/* the benchmarks' probes (bench-gpu): the read-bandwidth kernel (convert.cu) and a pinned upload,
 * timed with events; they run and give a positive, finite rate */
static void test_probes(void) {
    double g = 0;
    CHECK(zs_dev_read_gbps(D, (size_t)1 << 20, 2, &g) == 0, "read probe: %s", zs_errmsg());
    CHECK(g > 0 && isfinite(g), "read probe: %g GB/s", g);
    g = 0;
    CHECK(zs_dev_h2d_gbps(D, (size_t)1 << 20, 2, &g) == 0, "upload probe: %s", zs_errmsg());
    CHECK(g > 0 && isfinite(g), "upload probe: %g GB/s", g);
}

int main(void) {
    /* the CUDA kernels reproduce the CPU's exact f32-activation path (matmul-q8act.h), not its
     * default 8-bit-activation one */
    zs_op_matmul_quant_act(ZS_QUANT_ACT_F32);
    if (zs_backend_cuda_devices() == 0) {
        fprintf(stderr, "test-backend-ops: no CUDA device visible; skipping\n");
        return 77;
    }
    int ndev = zs_backend_cuda_devices();
    EMU = getenv("ZS_EMU_DEVICE") != NULL;
    if (EMU) ndev = 1; /* emulated devices are all alike */
    for (int dev = 0; dev < ndev; dev++) {
        char name[256];
        CHECK(zs_backend_cuda_describe(dev, name, sizeof name) == 0, "describe: %s", zs_errmsg());
        fprintf(stderr, "device %d: %s\n", dev, name);
        if (zs_dev_open(dev, &D) < 0) {
            CHECK(0, "open device %d: %s", dev, zs_errmsg());
            continue;
        }
        S = zs_dev_stream(D, ZS_Q_COMPUTE);
        test_convert();
        test_embed();
        test_norms();
        test_rope();
        test_act();
        test_family_ops();
        test_attention();
        test_attention_params();
        test_gemm();
        test_qmatmul();
        test_norms_bwd();
        test_rope_bwd();
        test_act_bwd();
        test_family_bwd();
        test_embed_bwd();
        test_xent();
        test_attention_bwd();
        test_matmul_bwd();
        test_train_attention();
        test_train_extra_bwd();
        test_probes();
        CHECK(zs_dev_sync(D) == 0, "device %d: %s", dev, zs_errmsg());
        zs_dev_free(D);
        D = NULL;
    }
    return tu_finish("test-backend-ops");
}
#endif
