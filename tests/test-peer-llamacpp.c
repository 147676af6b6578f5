/* test-peer-llamacpp.c — zeroserve against llama.cpp on the same GGUF weights.
 * tests/ref/llamacpp-ref.json holds llama.cpp's own outputs (llama-cpp-python==0.3.16, made by
 * tests/ref/make_llamacpp_ref.py): for stories260K.gguf as stored and at every weight dtype
 * (files written by llama.cpp's gguf package with ggml's reference quantizers, which zeroserve
 * reproduces at load with --weight-dtype; Q4_K_M by llama-quantize itself) and for
 * SmolLM2-135M-Instruct.Q4_1.gguf (the real-model fixture, $ZS_SMOLLM2: the test fails, not
 * skips, without it), the prompt's ids, the greedy ids, and at every generated position the 8
 * largest logits and the logsumexp; each quantized case twice: llama.cpp on the blocks as stored,
 * and on the same blocks dequantized to f32 (so that llama.cpp's f32 arithmetic meets ours). Checked here:
 *   - the prompt tokenizes to llama.cpp's ids;
 *   - zeroserve's greedy ids equal llama.cpp's, step by step, until a step where llama.cpp's
 *     own top two logits lie within twice the tolerance of each other (a near tie, where either
 *     engine may pick either; the comparison of that case stops there, and at least MIN_STEPS
 *     steps (MIN_STEPS_STORED on blocks as stored) must have been compared);
 *   - at every compared step, zeroserve's logits at llama.cpp's top-8 ids and its logsumexp
 *     agree within the dtype's tolerance (llama.cpp rounds the activations to f16 for f16
 *     weights, where zeroserve keeps them in f32, and to 8-bit blocks for quantized ones, as
 *     zeroserve's default path does, each engine rounding its own activations; the "-exact"
 *     cases run zeroserve's exact f32-activation path against llama.cpp's f32 arithmetic; the
 *     tolerances below are the measured differences with headroom);
 *   - SmolLM2's vocabulary tokenizes a list of hard strings to the same ids as llama.cpp's
 *     tokenizer and PyPI's `tokenizers` (the reference holds both, which agree);
 *   - the newer families (tests/ref/llamacpp-family-ref.json, made by
 *     tests/ref/make_family_llamacpp_ref.py): random checkpoints made here with init-model's library
 *     calls (llama with Llama 3 and linear RoPE scaling, Mistral with YaRN and mscale, Qwen2 with YaRN,
 *     Qwen3 with YaRN and an attention factor, Gemma 2 with a window of 32 and both softcaps, Gemma 3
 *     with a window of 32 and linear scaling of its global layers, also at q4_k_m, Phi-3 with LongRoPE,
 *     also at q8_0), converted here (zeroserve convert's library call) into the very file llama.cpp ran
 *     (its checksum is in the reference), then the same comparison of greedy ids and logits over 96
 *     prompt ids and 16 generated, and every feature of a case (RoPE scaling, window, softcapping,
 *     ...) must have moved llama.cpp's own logits by at least FEATURE_MARGIN tolerances. */
#include "common.h"
#include "engine.h"
#include "llamacpp.h"
#include "matmul-q8act.h"
#include "ref.h"
#include "testutil.h"

#define MIN_STEPS 8          /* steps compared at least: the cases on f32 arithmetic on both sides */
#define MIN_STEPS_STORED 4   /* on the blocks as stored (8-bit activations on both sides, rounded
                                apart: a near tie may come early) */
/* Limits on max |dlogit|, from the differences measured on 2026-12-01 (in brackets; stories260K's
 * logits span about 30, SmolLM2's about 40). With f32 arithmetic on both sides (llama.cpp's KV
 * cache set to f32 as well) only the summation order differs. */
#define TOL_EXACT 1e-4      /* [1e-5] f32, or llama.cpp on the same blocks dequantized to f32 */
#define TOL_SMOL_EXACT 5e-4 /* [5e-5] the same over SmolLM2's 30 layers */
#define TOL_16 0.1          /* [0.051] llama.cpp rounds activations to f16 / bf16 for 16-bit weights */
#define TOL_QUANT 0.35      /* [0.22] and to 8-bit blocks (Q8_0/Q8_1/Q8_K) for quantized weights, as
                               zeroserve's default path does too (kernels/cpu/matmul-q8act.h),
                               each engine rounding its own activations */
#define TOL_SMOL 1.0        /* [0.55] SmolLM2's Q4_1 with q8_1 activations, 30 layers */

/* max |logit difference| allowed (see the header): measured differences, with headroom */
static double tolerance(const char *case_name, const char *wd, const char *peer_weights) {
    int exact = peer_weights && !strcmp(peer_weights, "dequantized to f32");
    if (strstr(case_name, "smollm2")) return exact ? TOL_SMOL_EXACT : TOL_SMOL;
    if (!strcmp(wd, "auto") || exact) return TOL_EXACT;
    if (!strcmp(wd, "f16") || !strcmp(wd, "bf16")) return TOL_16;
    return TOL_QUANT;
}

static const char *model_path(const char *name, char *buf, size_t n) {
    if (!strcmp(name, "stories260K.gguf")) {
        snprintf(buf, n, "%s/models/stories260K/stories260K.gguf", tu_shared());
        return buf;
    }
    const char *s = getenv("ZS_SMOLLM2");
    if (s && *s && !strcmp(name, "SmolLM2-135M-Instruct.Q4_1.gguf")) return s;
    return NULL;
}

static int ids_equal(const int32_t *a, size_t na, json_t *arr) {
    if (na != json_array_size(arr)) return 0;
    for (size_t i = 0; i < na; i++)
        if (a[i] != json_integer_value(json_array_get(arr, i))) return 0;
    return 1;
}

static void run_case(json_t *c) {
    const char *name = json_string_value(json_object_get(c, "name"));
    const char *wd = json_string_value(json_object_get(c, "weight_dtype"));
    const char *prompt = json_string_value(json_object_get(c, "prompt"));
    char buf[4096];
    const char *path = model_path(json_string_value(json_object_get(c, "model")), buf, sizeof buf);
    CHECK(path != NULL, "%s: model %s not found (ZS_SMOLLM2 is the SmolLM2 fixture: sh server/fetch-smollm2.sh)",
          name, json_string_value(json_object_get(c, "model")));
    if (!path) return;
    /* llama.cpp on the dequantized blocks meets our exact f32-activation path; on the blocks as
     * stored, our default 8-bit-activation path (kernels/cpu/matmul-q8act.h) */
    const char *pw = json_string_value(json_object_get(c, "peer_weights"));
    int exact = pw && !strcmp(pw, "dequantized to f32");
    zs_op_matmul_quant_act(exact ? ZS_QUANT_ACT_F32 : ZS_QUANT_ACT_Q8);
    zs_engine *e = tu_lc_open(name, path, wd);
    if (!e) return;
    int32_t *p = NULL;
    size_t np = 0;
    int rc = zs_tokenizer_encode(zs_engine_tokenizer(e), prompt, strlen(prompt), 1, &p, &np);
    CHECK(rc == 0 && ids_equal(p, np, json_object_get(c, "prompt_ids")), "%s: prompt ids differ from llama.cpp's", name);
    double tol = tolerance(name, wd, pw);
    int f32_both = exact || (!strcmp(wd, "auto") && !strstr(name, "smollm2")); /* f32 weights or dequantized */
    if (rc == 0) tu_lc_compare(name, e, p, np, c, tol, f32_both ? MIN_STEPS : MIN_STEPS_STORED);
    free(p);
    zs_engine_free(e);
}

static void check_tokenize(json_t *t) {
    const char *path = getenv("ZS_SMOLLM2");
    CHECK(path && *path, "ZS_SMOLLM2 (the SmolLM2 fixture) is not set: sh server/fetch-smollm2.sh");
    if (!path || !*path) return;
    zs_tokenizer *tk = NULL;
    int rc = zs_model_tokenizer_load(path, &tk);
    CHECK(rc == 0, "tokenizer of %s: %s", path, zs_errmsg());
    if (rc) return;
    json_t *cases = json_object_get(t, "cases");
    int ok = 0;
    for (size_t i = 0; i < json_array_size(cases); i++) {
        json_t *c = json_array_get(cases, i);
        const char *s = json_string_value(json_object_get(c, "text"));
        int32_t *ids = NULL;
        size_t n = 0;
        rc = zs_tokenizer_encode(tk, s, strlen(s), 0, &ids, &n);
        int a = rc == 0 && ids_equal(ids, n, json_object_get(c, "llama_cpp"));
        int b = rc == 0 && ids_equal(ids, n, json_object_get(c, "tokenizers"));
        CHECK(a && b, "SmolLM2 tokenizes \"%s\" unlike %s", s, !a && !b ? "llama.cpp and tokenizers" : !a ? "llama.cpp" : "tokenizers");
        ok += a && b;
        free(ids);
    }
    fprintf(stderr, "SmolLM2 tokenizer: %d/%zu strings as llama.cpp and tokenizers\n", ok, json_array_size(cases));
    zs_tokenizer_free(tk);
}

/* ---- the newer families: models made here, converted here, against llama.cpp on the same file ---- */

/* Limits on max |dlogit| of the family cases, from the differences measured on 2026-12-01 (in brackets;
 * the logits of these random models span about 2). Both sides compute in f32 with an f32 KV cache, but
 * ggml's CPU GELU reads an f16 table (input and output rounded to f16), which Gemma's GeGLU goes
 * through. */
#define TOL_FAMILY 1e-4 /* [3e-6] llama, mistral, qwen2, qwen3, phi3 */
#define TOL_GELU 2e-3   /* [3e-4] gemma2, gemma3 */
#define FEATURE_MARGIN 10 /* a feature must move llama.cpp's logits by this many tolerances */

static void run_family_case(json_t *c, const char *tmp) {
    const char *name = json_string_value(json_object_get(c, "name"));
    const char *arch = json_string_value(json_object_get(c, "arch"));
    const char *pw = json_string_value(json_object_get(c, "peer_weights"));
    char gguf[4300];
    if (tu_lc_make_gguf(c, tmp, "tests/ref/make_family_llamacpp_ref.py", gguf, sizeof gguf)) return;
    /* f32 files and the dequantized peers: zeroserve's exact f32-activation path */
    int exact = pw && !strcmp(pw, "dequantized to f32");
    zs_op_matmul_quant_act(ZS_QUANT_ACT_F32);
    zs_engine *e = tu_lc_open(name, gguf, NULL);
    if (!e) return;
    size_t np;
    int32_t *p = tu_ref_ids_dup(json_object_get(c, "prompt_ids"), &np);
    double tol = strstr(arch, "gemma") ? TOL_GELU : TOL_FAMILY;
    char label[96];
    snprintf(label, sizeof label, "%s%s", name, exact ? " (dequantized)" : "");
    if (p) tu_lc_compare(label, e, p, np, c, tol, MIN_STEPS);
    /* what each feature changes in llama.cpp's logits: far above the tolerance, or the case could not
     * tell an engine without it */
    tu_lc_features(name, c, tol, FEATURE_MARGIN);
    free(p);
    zs_engine_free(e);
}

int main(void) {
    char path[4096];
    snprintf(path, sizeof path, "tests/ref/llamacpp-ref.json");
    json_error_t je;
    json_t *ref = json_load_file(path, 0, &je);
    CHECK(ref != NULL, "%s: %s", path, je.text);
    if (!ref) return tu_finish("test-peer-llamacpp");
    json_t *cases = json_object_get(ref, "cases");
    for (size_t i = 0; i < json_array_size(cases); i++) run_case(json_array_get(cases, i));
    check_tokenize(json_object_get(ref, "tokenize"));
    json_decref(ref);
    /* the newer families (tests/ref/llamacpp-family-ref.json, tests/ref/make_family_llamacpp_ref.py) */
    snprintf(path, sizeof path, "tests/ref/llamacpp-family-ref.json");
    ref = json_load_file(path, 0, &je);
    CHECK(ref != NULL, "%s: %s", path, je.text);
    char tmp[4096];
    if (ref && tu_tmpdir(tmp, sizeof tmp, "peerfam") == 0) {
        cases = json_object_get(ref, "cases");
        for (size_t i = 0; i < json_array_size(cases); i++) run_family_case(json_array_get(cases, i), tmp);
        tu_rmdir(tmp);
    }
    json_decref(ref);
    return tu_finish("test-peer-llamacpp");
}
