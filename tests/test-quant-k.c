/* test-quant-k.c — the K-quant quantizers (engine/base/quant-k.c) and the Q4_K_M mix
 * (engine/model/quant-mix.c, --weight-dtype q4_k / q6_k / q5_k / q3_k / q2_k / q4_k_m at load):
 *   - zs_quantize_q4_k / q6_k / q5_k / q3_k / q2_k give ggml's own bytes (ggml_quantize_chunk, i.e.
 *     quantize_row_q4_K_ref / q6_K_ref / q5_K_ref / q3_K_ref / q2_K_ref, from llama-cpp-python
 *     0.3.36's libggml-base, written by tests/ref/make_qk_ref.py into tests/ref/qk-quant-ref.bin)
 *     bit for bit on its rows (normal
 *     at several scales, outliers, zeros, tiny values, constant rows, rows of 256 and 512), and
 *     zs_to_f32 gives ggml's dequantized values of those bytes bit for bit; on 2048 more generated
 *     super-blocks (made here again bit for bit) the FNV-1a hashes of both bytes and values are
 *     ggml's; the round trip is within each format's bound (Q6_K 2.5%, Q2_K 34%); n not a
 *     multiple of 256 is refused;
 *   - zs_quant_mix_q4_k_m is llama.cpp's llama_tensor_get_type for Q4_K_M (llama-cpp-python
 *     0.3.36's): use_more_bits's layers (a 32-layer table written out here), output/tied table
 *     Q6_K, fallbacks Q5_0 / Q5_1 / Q8_0 / F16, norms F32, a fused attn_qkv under attn_v's rule,
 *     8 experts' attn_output Q5_K, the 70B rule (attn_v Q5_K) and which models it applies to;
 *   - through the engine, a generated Llama (2 layers, dim 256, built here): the q4_k_m layout
 *     (per-layer attn_v/ffn_down, tied table Q6_K; untied: LM head Q6_K, table Q4_K; rows of 320:
 *     Q5_0/Q8_0), prefill logits of q4_k_m, q4_k, q6_k, q5_k, q3_k and q2_k close to f32's (each
 *     within its tolerance), and q4_k_m's bitwise
 *     the same over 2 ranks with cpu offload;
 *   - GGUF files: the untied Llama converted to f32 and rewritten with its matrices in Q5_K, Q3_K
 *     or Q2_K (our quantizer) read back with those types, and the engine on each file as stored
 *     gives the logits of --weight-dtype q5_k / q3_k / q2_k on the directory bit for bit. */
#include "common.h"
#include "convert.h"
#include "device.h"
#include "engine.h"
#include "gguf.h"
#include "init-model.h"
#include "quant-mix.h"
#include "testutil.h"

/* ---- the reference rows ---- */

static uint64_t fnv1a64(const void *p, size_t n) {
    const uint8_t *b = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static int first_diff(const uint8_t *a, const uint8_t *b, size_t nb, size_t bb) {
    for (size_t i = 0; i < nb; i++)
        if (memcmp(a + i * bb, b + i * bb, bb)) return (int)i;
    return -1;
}

/* the file's types, as ggml numbers them */
#define MAX_TYPES 8
static uint32_t g_ntypes;
static zs_dtype g_types[MAX_TYPES];

static zs_dtype from_ggml(uint32_t t) {
    return t == 12 ? ZS_Q4_K : t == 14 ? ZS_Q6_K : t == 13 ? ZS_Q5_K : t == 11 ? ZS_Q3_K : t == 10 ? ZS_Q2_K
                                                                                                      : ZS_DTYPE_COUNT;
}

/* rms error / rms of the round trip of normal rows, per format: what ggml's quantizers give
 * (measured: Q4_K 0.067, Q6_K 0.017, Q5_K 0.036, Q3_K 0.148, Q2_K 0.288), with headroom */
static double round_trip_bound(zs_dtype dt) {
    return dt == ZS_Q4_K ? 0.09 : dt == ZS_Q6_K ? 0.025 : dt == ZS_Q5_K ? 0.05 : dt == ZS_Q3_K ? 0.19 : 0.34;
}

static void check_rows(FILE *f, uint32_t *nb_out) {
    uint32_t nr = 0, len[64];
    int ok = fread(&nr, 4, 1, f) == 1 && nr > 0 && nr <= 64 && fread(len, 4, nr, f) == nr;
    size_t n = 0;
    for (uint32_t r = 0; ok && r < nr; r++) {
        ok = len[r] % 256 == 0 && len[r] <= 4096;
        n += len[r];
    }
    CHECK(ok, "qk-quant-ref.bin: row table");
    if (!ok) return;
    size_t nb = n / 256;
    float *x = malloc(n * 4), *y = malloc(n * 4), *want_y = malloc(n * 4);
    uint8_t *want = malloc(nb * ZS_Q6_K_BYTES), *got = malloc(nb * ZS_Q6_K_BYTES);
    uint32_t ids[MAX_TYPES];
    ok = fread(x, 4, n, f) == n && fread(&g_ntypes, 4, 1, f) == 1 && g_ntypes >= 1 && g_ntypes <= MAX_TYPES &&
         fread(ids, 4, g_ntypes, f) == g_ntypes;
    for (uint32_t k = 0; ok && k < g_ntypes; k++) ok = (g_types[k] = from_ggml(ids[k])) != ZS_DTYPE_COUNT;
    CHECK(ok && g_ntypes == 5, "qk-quant-ref.bin: inputs and the table of the 5 K-quant types");
    if (ok) *nb_out = (uint32_t)nb;
    for (uint32_t k = 0; ok && k < g_ntypes; k++) {
        zs_dtype dt = g_types[k];
        const char *dn = zs_dtype_name(dt);
        size_t bb = zs_dtype_size(dt);
        ok = fread(want, bb, nb, f) == nb && fread(want_y, 4, n, f) == n;
        CHECK(ok, "qk-quant-ref.bin: %s section", dn);
        if (!ok) break;
        /* row by row, as the script called ggml */
        memset(got, 0xAA, nb * bb);
        size_t off = 0;
        for (uint32_t r = 0; r < nr; r++) {
            int rc = zs_quantize(dt, got + zs_dtype_bytes(dt, off), x + off, len[r]);
            CHECK(rc == 0, "quantize %s row %u: %s", dn, r, zs_errmsg());
            off += len[r];
        }
        int bad = first_diff(got, want, nb, bb);
        CHECK(bad < 0, "%s: ggml's bytes on the %u reference rows (%zu super-blocks; first difference in super-block %d)",
              dn, nr, nb, bad);
        for (size_t i = 0, shown = 0; bad >= 0 && i < bb && shown < 8; i++)
            if (got[bad * bb + i] != want[bad * bb + i]) {
                fprintf(stderr, "  %s super-block %d byte %zu: got %02x, ggml %02x\n", dn, bad, i, got[bad * bb + i],
                        want[bad * bb + i]);
                shown++;
            }
        memset(got, 0, nb * bb);
        zs_convert(got, dt, x, ZS_F32, n); /* all rows at once: blocks are independent */
        CHECK(!memcmp(got, want, nb * bb), "zs_convert f32 -> %s quantizes the same", dn);
        zs_to_f32(y, want, dt, n);
        int badv = -1;
        for (size_t i = 0; i < n && badv < 0; i++)
            if (memcmp(&y[i], &want_y[i], 4)) badv = (int)i;
        CHECK(badv < 0, "%s: dequantize gives ggml's dequantized values bit for bit (first difference at %d)", dn, badv);
        /* the round trip of the plain normal rows (0 and 1: 768 values at 0.02 and 1.0) */
        double e2 = 0, x2 = 0;
        for (size_t i = 0; i < 768; i++) {
            e2 += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
            x2 += (double)x[i] * x[i];
        }
        double rel = sqrt(e2 / x2);
        fprintf(stderr, "test-quant-k: %s round trip of normal rows: rms error / rms = %.4f\n", dn, rel);
        CHECK(rel < round_trip_bound(dt), "%s round trip within its bound (%.4f < %.3f)", dn, rel, round_trip_bound(dt));
    }
    free(x); free(y); free(want_y); free(want); free(got);
}

/* the generated inputs of make_qk_ref.py's gen_hashed, bit for bit */
static uint32_t lowbias32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

static void gen_hashed(float *x, uint32_t seed, size_t nb) {
    uint32_t add = seed * 0x9E3779B9u;
#define U(k) lowbias32((uint32_t)(k) + add)
    for (size_t i = 0; i < nb * 256; i++) {
        int64_t s = (int64_t)(U(3 * i) >> 11) + (U(3 * i + 1) >> 11) + (U(3 * i + 2) >> 11) - 3 * (1 << 20);
        uint32_t c = U(0x40000000u + i / 16);
        int eb = (int)(U(0x50000000u + i / 256) % 40) - 30, eg = (int)(c % 8) - 4;
        if (c % 37 == 0) s = 0;
        if (U(0x60000000u + i) % 97 == 0) s *= 32;
        x[i] = ldexpf((float)s, eb + eg - 20);
    }
#undef U
}

static void check_hashed(FILE *f) {
    char magic[4];
    uint32_t seed = 0, nb = 0;
    uint64_t want[2 * MAX_TYPES];
    int ok = fread(magic, 1, 4, f) == 4 && !memcmp(magic, "ZSQH", 4) && fread(&seed, 4, 1, f) == 1 &&
             fread(&nb, 4, 1, f) == 1 && nb > 0 && nb <= 65536 && fread(want, 8, 2 * g_ntypes, f) == 2 * g_ntypes;
    CHECK(ok, "qk-quant-ref.bin: hashed section");
    if (!ok) return;
    size_t n = (size_t)nb * 256;
    float *x = malloc(n * 4), *y = malloc(n * 4);
    uint8_t *q = malloc((size_t)nb * ZS_Q6_K_BYTES);
    gen_hashed(x, seed, nb);
    for (uint32_t k = 0; k < g_ntypes; k++) {
        zs_dtype dt = g_types[k];
        int rc = zs_quantize(dt, q, x, n);
        CHECK(rc == 0, "quantize %s: %s", zs_dtype_name(dt), zs_errmsg());
        uint64_t hq = fnv1a64(q, zs_dtype_bytes(dt, n));
        zs_to_f32(y, q, dt, n);
        uint64_t hy = fnv1a64(y, n * 4);
        CHECK(hq == want[2 * k], "%s: the FNV-1a of the bytes of %u generated super-blocks is ggml's (%016llx, ggml %016llx)",
              zs_dtype_name(dt), nb, (unsigned long long)hq, (unsigned long long)want[2 * k]);
        CHECK(hy == want[2 * k + 1], "%s: and of their dequantized values (%016llx, ggml %016llx)", zs_dtype_name(dt),
              (unsigned long long)hy, (unsigned long long)want[2 * k + 1]);
    }
    free(x); free(y); free(q);
}

static void check_reference(void) {
    const char *path = "tests/ref/qk-quant-ref.bin";
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL, "open %s (run from the repository root)", path);
    if (!f) return;
    char magic[4];
    uint32_t nb = 0;
    int ok = fread(magic, 1, 4, f) == 4 && !memcmp(magic, "ZSQK", 4);
    CHECK(ok, "%s: magic", path);
    if (ok) check_rows(f, &nb);
    if (ok && nb) check_hashed(f);
    fclose(f);
    /* the API around it */
    float x[512] = {0};
    uint8_t q[2 * ZS_Q6_K_BYTES];
    CHECK(zs_dtype_can_quantize(ZS_Q4_K) && zs_dtype_can_quantize(ZS_Q6_K) && zs_dtype_can_quantize(ZS_Q5_K) &&
              zs_dtype_can_quantize(ZS_Q3_K) && zs_dtype_can_quantize(ZS_Q2_K),
          "K-quants can be quantized into");
    CHECK(zs_dtype_size(ZS_Q5_K) == 176 && zs_dtype_size(ZS_Q3_K) == 110 && zs_dtype_size(ZS_Q2_K) == 84 &&
              zs_dtype_block(ZS_Q5_K) == 256 && zs_dtype_block(ZS_Q3_K) == 256 && zs_dtype_block(ZS_Q2_K) == 256 &&
              !strcmp(zs_dtype_name(ZS_Q5_K), "Q5_K") && !strcmp(zs_dtype_name(ZS_Q3_K), "Q3_K") &&
              !strcmp(zs_dtype_name(ZS_Q2_K), "Q2_K"),
          "Q5_K, Q3_K, Q2_K: 176, 110, 84 bytes per 256, their names");
    CHECK_ERR(zs_quantize(ZS_Q4_K, q, x, 300), "300 values", "Q4_K", "256");
    CHECK_ERR(zs_quantize(ZS_Q6_K, q, x, 32), "Q6_K");
    CHECK_ERR(zs_quantize(ZS_Q2_K, q, x, 288), "Q2_K", "256");
    const zs_dtype zt[] = {ZS_Q6_K, ZS_Q5_K, ZS_Q3_K, ZS_Q2_K};
    for (int k = 0; k < 4; k++) {
        memset(q, 0x55, sizeof q);
        CHECK(zs_quantize(zt[k], q, x, 512) == 0, "%s of 512 zeros", zs_dtype_name(zt[k]));
        float y[512];
        zs_to_f32(y, q, zt[k], 512);
        int zero = 1;
        for (size_t i = 0; i < 512; i++) zero &= y[i] == 0;
        if (zt[k] == ZS_Q6_K)
            for (size_t i = 0; i < 2 * ZS_Q6_K_BYTES; i++) zero &= q[i] == 0;
        CHECK(zero, "%s of zeros: dequantizes to 0%s", zs_dtype_name(zt[k]), zt[k] == ZS_Q6_K ? " (all-zero blocks)" : "");
    }
}

/* ---- the mix ---- */

static void check_mix(void) {
    /* use_more_bits for 32 layers (llama.cpp: i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2) */
    const int more32[] = {0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31};
    int got = 0, same = 1;
    for (int l = 0; l < 32; l++) {
        int want = 0;
        for (size_t k = 0; k < sizeof more32 / sizeof more32[0]; k++) want |= more32[k] == l;
        same &= zs_quant_mix_more_bits(l, 32) == want;
        zs_dtype v = zs_quant_mix_q4_k_m(l, ZS_R_WV, 32, 4096, 0), dn = zs_quant_mix_q4_k_m(l, ZS_R_W_DOWN, 32, 11008, 0);
        same &= v == (want ? ZS_Q6_K : ZS_Q4_K) && dn == (want ? ZS_Q6_K : ZS_Q4_K);
        got += v == ZS_Q6_K;
    }
    CHECK(same && got == 16, "32 layers: attn_v and ffn_down Q6_K in the 16 layers use_more_bits picks (%d)", got);
    CHECK(!zs_quant_mix_more_bits(0, 2) && zs_quant_mix_more_bits(1, 2), "2 layers: the last one gets more bits");
    int q4 = 1;
    const int roles[] = {ZS_R_WQ, ZS_R_WK, ZS_R_WO, ZS_R_W_GATE, ZS_R_W_UP};
    for (int l = 0; l < 32; l++)
        for (int r = 0; r < 5; r++) q4 &= zs_quant_mix_q4_k_m(l, roles[r], 32, 4096, 0) == ZS_Q4_K;
    CHECK(q4, "attn_q, attn_k, attn_output, ffn_gate, ffn_up: Q4_K");
    CHECK(zs_quant_mix_q4_k_m(32, ZS_R_LM_HEAD, 32, 4096, 0) == ZS_Q6_K, "output.weight: Q6_K");
    CHECK(zs_quant_mix_q4_k_m(32, ZS_R_LM_HEAD, 32, 4000, 0) == ZS_Q8_0, "output.weight, rows of 4000: Q8_0");
    CHECK(zs_quant_mix_q4_k_m(32, ZS_R_LM_HEAD, 32, 100, 0) == ZS_F16, "output.weight, rows of 100: F16");
    CHECK(zs_quant_mix_q4_k_m(-1, ZS_R_TOK_EMB, 32, 4096, 0) == ZS_Q4_K, "untied token_embd: Q4_K");
    CHECK(zs_quant_mix_q4_k_m(-1, ZS_R_TOK_EMB, 32, 4096, ZS_QMIX_TIED) == ZS_Q6_K, "tied token_embd: Q6_K");
    CHECK(zs_quant_mix_q4_k_m(-1, ZS_R_TOK_EMB, 32, 2880, ZS_QMIX_TIED) == ZS_Q8_0, "tied token_embd, rows of 2880: Q8_0");
    CHECK(zs_quant_mix_q4_k_m(-1, ZS_R_TOK_EMB, 32, 2880, 0) == ZS_Q5_0, "untied token_embd, rows of 2880: Q5_0");
    CHECK(zs_quant_mix_q4_k_m(-1, ZS_R_POS_EMB, 12, 768, 0) == ZS_F32, "position table: not quantized");
    CHECK(zs_quant_mix_q4_k_m(0, ZS_R_W_DOWN, 32, 11008 + 32, 0) == ZS_Q8_0 &&
              zs_quant_mix_q4_k_m(5, ZS_R_W_DOWN, 32, 11008 + 32, 0) == ZS_Q5_0 &&
              zs_quant_mix_q4_k_m(5, ZS_R_W_DOWN, 32, 11008 + 16, 0) == ZS_F16,
          "fallbacks: Q6_K -> Q8_0, Q4_K -> Q5_0, rows not of 32 -> F16");
    /* llama.cpp 0.3.36 counts attn_qkv among the attn_v-like tensors: attn_v's rule (12 layers:
     * use_more_bits picks 0, 3, 6, 9, 10, 11) */
    int fq = 1;
    for (int r = ZS_R_WQ; r <= ZS_R_WV; r++)
        fq &= zs_quant_mix_q4_k_m(3, r, 12, 768, ZS_QMIX_FUSED_QKV) == ZS_Q6_K &&
              zs_quant_mix_q4_k_m(4, r, 12, 768, ZS_QMIX_FUSED_QKV) == ZS_Q4_K &&
              zs_quant_mix_q4_k_m(4, r, 12, 768, ZS_QMIX_FUSED_QKV | ZS_QMIX_EXPERTS8) == ZS_Q8_0;
    CHECK(fq && ZS_R_WK == ZS_R_WQ + 1 && ZS_R_WV == ZS_R_WQ + 2,
          "fused attn_qkv (GPT-2, Phi-3): attn_v's rule, Q6_K in layer 3 of 12, Q4_K in layer 4, Q8_0 with 8 experts");
    CHECK(zs_quant_mix_q4_k_m(1, ZS_R_WO, 4, 256, ZS_QMIX_EXPERTS8) == ZS_Q5_K &&
              zs_quant_mix_q4_k_m(1, ZS_R_WO, 4, 288, ZS_QMIX_EXPERTS8) == ZS_Q5_1 &&
              zs_quant_mix_q4_k_m(1, ZS_R_WO, 4, 100, ZS_QMIX_EXPERTS8) == ZS_F16 &&
              zs_quant_mix_q4_k_m(1, ZS_R_WO, 4, 256, 0) == ZS_Q4_K,
          "8 experts: attn_output Q5_K (rows of 288: Q5_1, of 100: F16)");
    /* the 70B rule: attn_v Q4_K -> Q5_K (80 layers: use_more_bits picks 0..9, 12, 15, ..., 70..79) */
    CHECK(zs_quant_mix_is_70b(ZS_FAM_LLAMA, 80, 64, 8, 0) && !zs_quant_mix_is_70b(ZS_FAM_LLAMA, 80, 64, 64, 0) &&
              !zs_quant_mix_is_70b(ZS_FAM_LLAMA, 32, 32, 8, 0) && !zs_quant_mix_is_70b(ZS_FAM_MIXTRAL, 80, 32, 8, 8) &&
              zs_quant_mix_is_70b(ZS_FAM_MIXTRAL, 80, 32, 8, 4) && zs_quant_mix_is_70b(ZS_FAM_QWEN2, 80, 64, 64, 0) &&
              zs_quant_mix_is_70b(ZS_FAM_MISTRAL, 80, 64, 8, 0) && !zs_quant_mix_is_70b(ZS_FAM_QWEN3, 80, 64, 8, 0) &&
              !zs_quant_mix_is_70b(ZS_FAM_GEMMA2, 80, 64, 8, 0),
          "llama.cpp's 70B: llama's architecture with 80 layers and grouped KV heads (not 8 experts), qwen2 with 80");
    CHECK(zs_quant_mix_q4_k_m(10, ZS_R_WV, 80, 8192, ZS_QMIX_70B) == ZS_Q5_K &&
              zs_quant_mix_q4_k_m(12, ZS_R_WV, 80, 8192, ZS_QMIX_70B) == ZS_Q6_K &&
              zs_quant_mix_q4_k_m(10, ZS_R_WV, 80, 8192 + 32, ZS_QMIX_70B) == ZS_Q5_1 &&
              zs_quant_mix_q4_k_m(10, ZS_R_WV, 80, 8192, 0) == ZS_Q4_K &&
              zs_quant_mix_q4_k_m(10, ZS_R_WK, 80, 8192, ZS_QMIX_70B) == ZS_Q4_K &&
              zs_quant_mix_q4_k_m(10, ZS_R_W_DOWN, 80, 28672, ZS_QMIX_70B) == ZS_Q4_K,
          "70B: attn_v Q5_K where it would be Q4_K (Q5_1 for rows not of 256), Q6_K kept; other matrices as before");
    CHECK(zs_quant_mix_q4_k_m(3, ZS_R_ATTN_NORM_W, 32, 4096, 0) == ZS_F32 &&
              zs_quant_mix_q4_k_m(3, ZS_R_BQ, 32, 4096, 0) == ZS_F32 && zs_quant_mix_q4_k_m(32, ZS_R_OUT_NORM_W, 32, 4096, 0) == ZS_F32,
          "norms and biases: F32");
    CHECK(zs_quant_mix_q4_k_m(33, ZS_R_WQ, 32, 4096, 0) == ZS_DTYPE_COUNT &&
              zs_quant_mix_q4_k_m(-1, ZS_R_LM_HEAD + 5, 32, 4096, 0) == ZS_DTYPE_COUNT &&
              zs_quant_mix_q4_k_m(0, ZS_R_WQ, 0, 4096, 0) == ZS_DTYPE_COUNT,
          "out of range: ZS_DTYPE_COUNT");
}

/* ---- through the engine ---- */

static int make_model(const char *dir, int tied, int ffn, int seed) {
    zs_init_opts io;
    int rc = zs_init_opts_default("llama", &io);
    zs_model_config *c = &io.cfg;
    c->n_layers = 2;
    c->dim = 256;
    c->n_heads = 4;
    c->n_kv_heads = 2;
    c->head_dim = 64;
    c->ffn_dim = ffn;
    c->vocab_size = 512;
    c->max_seq = 128;
    c->tied_embeddings = tied;
    c->dtype = ZS_F32;
    io.seed = (uint64_t)seed;
    if (rc == 0) rc = zs_init_model_write(&io, dir);
    CHECK(rc == 0, "init-model %s: %s", dir, zs_errmsg());
    return rc;
}

static int open_engine(const char *dir, zs_dtype wdt, int mix, int ranks, int tier, zs_engine **e) {
    zs_engine_opts o;
    zs_engine_opts_default(&o);
    o.model_dir = dir;
    o.model.embed_lookup = 1;
    o.model.weight_dtype = wdt;
    o.model.quant_mix = mix;
    o.max_seqs = 1;
    o.max_batch_tokens = 64;
    o.ranks = ranks;
    o.gather.tier = tier;
    o.device = ZS_DEVICE_CPU;
    return zs_engine_open(&o, e);
}

#define NP 32
/* the logits of every position of one fixed prompt */
static int prefill(zs_engine *e, float *lg) {
    zs_kvcache *kv = zs_engine_kv(e);
    int seq, rc;
    if ((rc = zs_kv_seq_open(kv, &seq)) < 0) return rc;
    int32_t tok[NP], pos[NP], sq[NP], li[NP];
    for (int i = 0; i < NP; i++) {
        tok[i] = (int32_t)((i * 7919 + 13) % 512);
        pos[i] = i;
        sq[i] = seq;
        li[i] = i;
    }
    zs_batch b = {NP, tok, pos, sq, li, NP, NULL, NULL, NULL};
    rc = zs_kv_seq_reserve(kv, seq, NP);
    if (rc == 0) rc = zs_engine_forward(e, &b, lg);
    zs_kv_seq_close(kv, seq);
    return rc;
}

static zs_dtype slot_dt(zs_engine *e, int b, int role) {
    const zs_model *m = zs_engine_model(e);
    if (b < 0) b = zs_bucket_head(m);
    return zs_model_layout(m, b)->slot[role].dtype;
}

static void check_engine(const char *tmp) {
    char tied[4200], untied[4200], odd[4200];
    snprintf(tied, sizeof tied, "%s/tied", tmp);
    snprintf(untied, sizeof untied, "%s/untied", tmp);
    snprintf(odd, sizeof odd, "%s/ffn320", tmp);
    if (make_model(tied, 1, 512, 3) < 0 || make_model(untied, 0, 512, 4) < 0 || make_model(odd, 0, 320, 5) < 0) return;
    size_t nl = (size_t)NP * 512;
    float *ref = malloc(nl * 4), *lg = malloc(nl * 4), *lq = malloc(nl * 4);
    zs_engine *e;
    int rc = open_engine(tied, ZS_F32, 0, 1, ZS_OFFLOAD_NONE, &e);
    CHECK(rc == 0, "f32: open: %s", zs_errmsg());
    if (rc < 0) goto done;
    rc = prefill(e, ref);
    CHECK(rc == 0, "f32: prefill: %s", zs_errmsg());
    zs_engine_free(e);
    /* q4_k_m's layout */
    rc = open_engine(tied, ZS_Q4_K, ZS_QUANT_MIX_Q4_K_M, 1, ZS_OFFLOAD_NONE, &e);
    CHECK(rc == 0, "q4_k_m: open: %s", zs_errmsg());
    if (rc < 0) goto done;
    CHECK(slot_dt(e, 1, ZS_R_WV) == ZS_Q4_K && slot_dt(e, 2, ZS_R_WV) == ZS_Q6_K && slot_dt(e, 1, ZS_R_W_DOWN) == ZS_Q4_K &&
              slot_dt(e, 2, ZS_R_W_DOWN) == ZS_Q6_K,
          "q4_k_m, 2 layers: attn_v and ffn_down Q4_K in layer 0, Q6_K in layer 1 (use_more_bits)");
    CHECK(slot_dt(e, 1, ZS_R_WQ) == ZS_Q4_K && slot_dt(e, 2, ZS_R_WK) == ZS_Q4_K && slot_dt(e, 2, ZS_R_WO) == ZS_Q4_K &&
              slot_dt(e, 1, ZS_R_W_GATE) == ZS_Q4_K && slot_dt(e, 2, ZS_R_W_UP) == ZS_Q4_K,
          "q4_k_m: the other matrices Q4_K");
    CHECK(slot_dt(e, 0, ZS_R_TOK_EMB) == ZS_Q6_K, "q4_k_m: the tied token table (the LM head) is Q6_K (%s)",
          zs_dtype_name(slot_dt(e, 0, ZS_R_TOK_EMB)));
    CHECK(slot_dt(e, 1, ZS_R_ATTN_NORM_W) == ZS_F32 && slot_dt(e, -1, ZS_R_OUT_NORM_W) == ZS_F32, "q4_k_m: norms f32");
    CHECK(strstr(zs_model_fingerprint(zs_engine_model(e)), "Q4_K_M") != NULL, "q4_k_m: the fingerprint names the mix (%s)",
          zs_model_fingerprint(zs_engine_model(e)));
    rc = prefill(e, lq);
    CHECK(rc == 0, "q4_k_m: prefill: %s", zs_errmsg());
    zs_engine_free(e);
    /* logits close to f32's */
    const struct { zs_dtype dt; int mix; const char *name; double tol; } Q[] = {
        {ZS_Q4_K, ZS_QUANT_MIX_Q4_K_M, "q4_k_m", 0.2}, {ZS_Q4_K, 0, "q4_k", 0.25}, {ZS_Q6_K, 0, "q6_k", 0.07},
        {ZS_Q4_0, 0, "q4_0", 0.3}, {ZS_Q8_0, 0, "q8_0", 0.03}, {ZS_Q5_K, 0, "q5_k", 0.14}, {ZS_Q3_K, 0, "q3_k", 0.5},
        {ZS_Q2_K, 0, "q2_k", 0.85}};
    for (size_t k = 0; k < sizeof Q / sizeof Q[0]; k++) {
        if (k == 0) memcpy(lg, lq, nl * 4);
        else {
            rc = open_engine(tied, Q[k].dt, Q[k].mix, 1, ZS_OFFLOAD_NONE, &e);
            CHECK(rc == 0, "%s: open: %s", Q[k].name, zs_errmsg());
            if (rc < 0) continue;
            rc = prefill(e, lg);
            CHECK(rc == 0, "%s: prefill: %s", Q[k].name, zs_errmsg());
            zs_engine_free(e);
            if (rc < 0) continue;
        }
        double e2 = 0, r2 = 0, maxd = 0, maxr = 0;
        int agree = 0;
        for (size_t i = 0; i < nl; i++) {
            e2 += ((double)lg[i] - ref[i]) * ((double)lg[i] - ref[i]);
            r2 += (double)ref[i] * ref[i];
            maxd = fmax(maxd, fabs((double)lg[i] - ref[i]));
            maxr = fmax(maxr, fabs((double)ref[i]));
        }
        for (int p = 0; p < NP; p++) {
            int a = 0, b = 0;
            for (int v = 1; v < 512; v++) {
                if (lg[p * 512 + v] > lg[p * 512 + a]) a = v;
                if (ref[p * 512 + v] > ref[p * 512 + b]) b = v;
            }
            agree += a == b;
        }
        double rel = sqrt(e2 / r2);
        fprintf(stderr, "test-quant-k: %s prefill logits vs f32 (%d positions): rms error / rms = %.4f, max |diff| = %.4f "
                "(max |logit| %.3f), argmax agrees at %d of %d\n", Q[k].name, NP, rel, maxd, maxr, agree, NP);
        CHECK(rel < Q[k].tol, "%s: logits close to f32's (rms error / rms %.4f < %.2f)", Q[k].name, rel, Q[k].tol);
    }
    /* 2 ranks, shards in host memory: the same bits */
    rc = open_engine(tied, ZS_Q4_K, ZS_QUANT_MIX_Q4_K_M, 2, ZS_OFFLOAD_CPU, &e);
    CHECK(rc == 0, "q4_k_m 2 ranks: open: %s", zs_errmsg());
    if (rc == 0) {
        memset(lg, 0, nl * 4);
        rc = prefill(e, lg);
        CHECK(rc == 0 && !memcmp(lg, lq, nl * 4), "q4_k_m, 2 ranks, cpu offload: logits bitwise those of one rank");
        zs_engine_free(e);
    }
    /* untied: the LM head Q6_K, the token table Q4_K */
    rc = open_engine(untied, ZS_Q4_K, ZS_QUANT_MIX_Q4_K_M, 1, ZS_OFFLOAD_NONE, &e);
    CHECK(rc == 0, "untied q4_k_m: open: %s", zs_errmsg());
    if (rc == 0) {
        CHECK(slot_dt(e, -1, ZS_R_LM_HEAD) == ZS_Q6_K && slot_dt(e, 0, ZS_R_TOK_EMB) == ZS_Q4_K,
              "untied q4_k_m: output Q6_K, token_embd Q4_K (%s, %s)", zs_dtype_name(slot_dt(e, -1, ZS_R_LM_HEAD)),
              zs_dtype_name(slot_dt(e, 0, ZS_R_TOK_EMB)));
        CHECK(prefill(e, lg) == 0, "untied q4_k_m: prefill: %s", zs_errmsg());
        zs_engine_free(e);
    }
    /* rows of 320 (ffn_down): llama.cpp's fallbacks under q4_k_m; 16-bit under plain q4_k */
    rc = open_engine(odd, ZS_Q4_K, ZS_QUANT_MIX_Q4_K_M, 1, ZS_OFFLOAD_NONE, &e);
    CHECK(rc == 0, "ffn 320 q4_k_m: open: %s", zs_errmsg());
    if (rc == 0) {
        CHECK(slot_dt(e, 1, ZS_R_W_DOWN) == ZS_Q5_0 && slot_dt(e, 2, ZS_R_W_DOWN) == ZS_Q8_0 &&
                  slot_dt(e, 1, ZS_R_W_UP) == ZS_Q4_K,
              "ffn 320 q4_k_m: ffn_down Q5_0 (layer 0) and Q8_0 (layer 1), ffn_up Q4_K (%s, %s)",
              zs_dtype_name(slot_dt(e, 1, ZS_R_W_DOWN)), zs_dtype_name(slot_dt(e, 2, ZS_R_W_DOWN)));
        CHECK(prefill(e, lg) == 0, "ffn 320 q4_k_m: prefill: %s", zs_errmsg());
        zs_engine_free(e);
    }
    rc = open_engine(odd, ZS_Q4_K, 0, 1, ZS_OFFLOAD_NONE, &e);
    CHECK(rc == 0, "ffn 320 q4_k: open: %s", zs_errmsg());
    if (rc == 0) {
        zs_dtype d = slot_dt(e, 1, ZS_R_W_DOWN);
        CHECK(zs_dtype_block(d) == 1 && zs_dtype_size(d) == 2 && slot_dt(e, 1, ZS_R_W_UP) == ZS_Q4_K,
              "ffn 320 q4_k: ffn_down stays 16-bit (%s), ffn_up Q4_K", zs_dtype_name(d));
        zs_engine_free(e);
    }
    /* a mix with another weight dtype is refused */
    CHECK_ERR(open_engine(tied, ZS_Q8_0, ZS_QUANT_MIX_Q4_K_M, 1, ZS_OFFLOAD_NONE, &e), "mix", "Q4_K");
done:
    free(ref); free(lg); free(lq);
}

/* ---- GGUF files of K-quant tensors ---- */

static uint32_t ggml_of(zs_dtype dt) {
    return dt == ZS_Q5_K ? ZS_GGML_Q5_K : dt == ZS_Q3_K ? ZS_GGML_Q3_K : dt == ZS_Q2_K ? ZS_GGML_Q2_K
         : dt == ZS_Q4_K ? ZS_GGML_Q4_K : ZS_GGML_Q6_K;
}

/* Rewrites the f32 GGUF at src as dst with every matrix whose rows are whole super-blocks in qt
 * (our quantizer), the rest unchanged: the header is copied with each such tensor's type and
 * offset patched in place (the same field sizes), the data laid out again. */
static int write_k_gguf(const char *src, const char *dst, zs_dtype qt) {
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
        int quant = t->type == ZS_GGML_F32 && t->n_dims == 2 && t->ne[0] % ZS_QK_K == 0;
        uint32_t type = quant ? ggml_of(qt) : (uint32_t)t->type;
        uint64_t o = off;
        memcpy(hdr + p + 4 + 8 * (size_t)t->n_dims, &type, 4);
        memcpy(hdr + p + 8 + 8 * (size_t)t->n_dims, &o, 8);
        size_t nb = quant ? zs_dtype_bytes(qt, t->nbytes / 4) : t->nbytes;
        if (quant) ok = zs_quantize(qt, data + off, t->data, t->nbytes / 4) == 0;
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

/* the untied generated Llama as an f32 GGUF (zeroserve convert), rewritten with its matrices in
 * Q5_K, Q3_K, Q2_K: the reader takes the types, and the engine on the file as stored gives the
 * logits of --weight-dtype on the directory bit for bit */
static void check_gguf(const char *tmp) {
    char dir[4200], f32[4200], dst[4200];
    snprintf(dir, sizeof dir, "%s/untied", tmp);
    snprintf(f32, sizeof f32, "%s/untied-f32.gguf", tmp);
    zs_convert_opts co = {dir, f32, ZS_FTYPE_ALL_F32, "k", NULL, NULL};
    zs_convert_result cr = {0};
    int rc = zs_convert_run(&co, &cr);
    CHECK(rc == 0, "convert the untied model to an f32 GGUF: %s", zs_errmsg());
    if (cr.plan) zs_gguf_conv_close(cr.plan);
    if (rc < 0) return;
    size_t nl = (size_t)NP * 512;
    float *a = malloc(nl * 4), *b = malloc(nl * 4);
    const zs_dtype K[] = {ZS_Q5_K, ZS_Q3_K, ZS_Q2_K};
    for (int k = 0; k < 3; k++) {
        const char *dn = zs_dtype_name(K[k]);
        snprintf(dst, sizeof dst, "%s/untied-%s.gguf", tmp, dn);
        rc = write_k_gguf(f32, dst, K[k]);
        CHECK(rc == 0, "write a %s GGUF", dn);
        if (rc < 0) continue;
        zs_gguf *g = NULL;
        rc = zs_gguf_open(dst, &g);
        CHECK(rc == 0, "%s GGUF: open: %s", dn, zs_errmsg());
        if (rc == 0) {
            const zs_gguf_tensor *t = zs_gguf_find_tensor(g, "blk.1.ffn_down.weight");
            CHECK(t && t->type == ggml_of(K[k]) && t->nbytes == zs_dtype_bytes(K[k], (size_t)(t->ne[0] * t->ne[1])) &&
                      !strcmp(zs_gguf_type_name((int)t->type), dn),
                  "%s GGUF: ffn_down read back as %s, %zu bytes", dn, t ? zs_gguf_type_name((int)t->type) : "?",
                  t ? (size_t)t->nbytes : (size_t)0);
            zs_gguf_close(g);
        }
        zs_engine *e;
        rc = open_engine(dir, K[k], 0, 1, ZS_OFFLOAD_NONE, &e);
        CHECK(rc == 0, "%s: open the directory: %s", dn, zs_errmsg());
        if (rc < 0) continue;
        rc = prefill(e, a);
        zs_engine_free(e);
        if (rc == 0) rc = open_engine(dst, ZS_DTYPE_COUNT, 0, 1, ZS_OFFLOAD_NONE, &e);
        CHECK(rc == 0, "%s GGUF: open as stored: %s", dn, zs_errmsg());
        if (rc < 0) continue;
        CHECK(slot_dt(e, 1, ZS_R_WQ) == K[k] && slot_dt(e, 2, ZS_R_W_DOWN) == K[k] && slot_dt(e, -1, ZS_R_LM_HEAD) == K[k],
              "%s GGUF: the matrices as stored (%s, %s, %s)", dn, zs_dtype_name(slot_dt(e, 1, ZS_R_WQ)),
              zs_dtype_name(slot_dt(e, 2, ZS_R_W_DOWN)), zs_dtype_name(slot_dt(e, -1, ZS_R_LM_HEAD)));
        rc = prefill(e, b);
        zs_engine_free(e);
        CHECK(rc == 0 && !memcmp(a, b, nl * 4),
              "%s GGUF as stored: the logits of --weight-dtype %s on the directory, bit for bit", dn, dn);
    }
    free(a);
    free(b);
}

int main(void) {
    check_reference();
    check_mix();
    char tmp[4096];
    if (tu_tmpdir(tmp, sizeof tmp, "quant-k") < 0) {
        CHECK(0, "scratch directory");
        return tu_finish("test-quant-k");
    }
    check_engine(tmp);
    check_gguf(tmp);
    tu_rmdir(tmp);
    return tu_finish("test-quant-k");
}
