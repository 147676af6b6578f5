/* test-moe-gguf.c — the mixtures of experts through `zeroserve convert` against llama.cpp on the same
 * GGUF weights. tests/ref/moe-llamacpp/ref.json holds llama.cpp's own outputs (llama-cpp-python==0.3.16;
 * the q4_k_m cases 0.3.36, whose llama-quantize makes the same file byte for byte; made by
 * tests/ref/moe-llamacpp/make_ref.py): for Mixtral (written as llama with experts; 8 experts,
 * top-2), Qwen2-MoE (16 experts, top-4, a shared expert with its gate; also with a tied head, which
 * convert writes as a copy), Qwen3-MoE (16, top-4, renormalised, head_dim 128 != dim / heads) and OLMoE
 * (16, top-4, q/k norms over the whole projection), random checkpoints made here with init-model's
 * library calls, converted here (zeroserve convert's library call, f32, q8_0, and q4_k_m for Mixtral's
 * 8-expert rules and Qwen2-MoE's one-row shared gate) into the very file llama.cpp ran (its checksum is
 * in the reference). Checked per case:
 *   - the file is a mixture as llama.cpp reads it (general.architecture, expert_count, the stacked
 *     3-D ffn_{gate,up,down}_exps), and zeroserve's GGUF loader made one bucket per expert;
 *   - the whole logits row of the prompt's last position within the tolerance of llama.cpp's;
 *   - zeroserve's greedy ids equal llama.cpp's step by step (until a near tie of llama.cpp's own top two
 *     within twice the tolerance; at least MIN_STEPS compared), with the logits at llama.cpp's top-8 ids
 *     and the logsumexp within the tolerance at every compared step;
 *   - every feature of a case (top-1 routing, routing over every expert, the shared expert, the q/k
 *     norms) moved llama.cpp's own logits by at least FEATURE_MARGIN tolerances (an engine that routed
 *     otherwise, or left the piece out, could not pass);
 *   - the reference covers the four architectures, each with an f32 case that has features;
 * and, without the reference, the conversion rules themselves (gguf-convert.h): the stacked 3-D expert
 * tensors' dims, the types (routers F32; the shared gate a matrix for q8_0, 1-D F32 for the
 * llama-quantize types; llama-quantize's 8-expert rules (attn_output Q5_K) and ffn_down_exps as ffn_down under q4_k_m),
 * the copied head of a tied Qwen2-MoE, and the refusals of what llama.cpp cannot represent (a dense
 * layer, a renormalisation other than the architecture's, OLMoE's clip_qkv and grouped KV heads,
 * Qwen3-MoE's attention biases).
 * The quantized cases ran llama.cpp on the blocks dequantized to f32; zeroserve runs the blocks as
 * stored with its exact f32-activation path, so both sides compute the same arithmetic. */
#include "common.h"
#include "convert.h"
#include "engine.h"
#include "gguf.h"
#include "init-model.h"
#include "llamacpp.h"
#include "matmul-q8act.h"
#include "model.h"
#include "quant-mix.h"
#include "ref.h"
#include "testutil.h"

/* Limits on max |dlogit|, from the differences measured on 2026-12-01 (in brackets; the logits of these
 * random models span about 2). Both sides compute in f32 with an f32 KV cache; only the summation order
 * differs (and the order of the experts' sums). */
#define TOL 2e-4          /* [3.1e-5] */
#define MIN_STEPS 8       /* greedy steps compared at least */
#define FEATURE_MARGIN 10 /* a feature must move llama.cpp's logits by this many tolerances */
#define MIN_CASES 11

/* The file as llama.cpp reads a mixture: its architecture, expert_count, stacked expert tensors. */
static void check_file(const char *name, const char *gguf, json_t *c) {
    zs_gguf *g = NULL;
    int rc = zs_gguf_open(gguf, &g);
    CHECK(rc == 0, "%s: %s", name, zs_errmsg());
    if (rc) return;
    const char *want = json_string_value(json_object_get(c, "gguf_arch")), *a = NULL;
    CHECK(zs_gguf_get_str(g, "general.architecture", &a, NULL) == 0 && want && !strcmp(a, want),
          "%s: general.architecture is %s, not %s", name, a ? a : "?", want ? want : "?");
    char k[128];
    snprintf(k, sizeof k, "%s.expert_count", want ? want : "?");
    uint32_t ec = 0;
    long long ne = json_integer_value(json_object_get(c, "n_experts"));
    CHECK(zs_gguf_get_u32(g, k, &ec) == 0 && (long long)ec == ne && ne > 1, "%s: %s is %u, not %lld", name, k, ec, ne);
    const zs_gguf_tensor *t = zs_gguf_find_tensor(g, "blk.0.ffn_down_exps.weight");
    CHECK(t && t->n_dims == 3 && t->ne[2] == ne, "%s: blk.0.ffn_down_exps.weight is not [.., .., %lld]", name, ne);
    CHECK(!zs_gguf_find_tensor(g, "blk.0.ffn_down.weight"), "%s: a dense ffn_down in a MoE layer", name);
    zs_gguf_close(g);
}

/* ---------------------------------------------------------------- the conversion rules */

/* A random checkpoint of arch with the config keys of set (NULL: none) in tmp/name. */
static int make_dir(const char *tmp, const char *name, const char *arch, const char *set, char *dir, size_t n) {
    snprintf(dir, n, "%s/%s", tmp, name);
    zs_init_opts io;
    ZS_CHECK(zs_init_opts_default(arch, &io));
    io.seed = 7;
    if (set) ZS_CHECK(zs_config_override(&io.cfg, set, name));
    return zs_init_model_write(&io, dir);
}

static const zs_gguf_conv_tensor *find_t(const zs_gguf_conv *c, const char *name) {
    for (size_t i = 0; i < zs_gguf_conv_count(c); i++)
        if (!strcmp(zs_gguf_conv_at(c, i)->name, name)) return zs_gguf_conv_at(c, i);
    return NULL;
}

/* tensor name has type t (and, when nd > 0, nd dims) in plan c */
#define CHECK_T(c, what, name, t, nd)                                                                            \
    do {                                                                                                       \
        const zs_gguf_conv_tensor *x_ = find_t((c), (name));                                                   \
        CHECK(x_ && x_->type == (t) && ((nd) == 0 || x_->n_dims == (nd)), "%s: %s is %s/%d, want %s/%d", (what), \
              (name), x_ ? zs_gguf_type_name((int)x_->type) : "absent", x_ ? x_->n_dims : 0,                    \
              zs_gguf_type_name((int)(t)), (nd));                                                               \
    } while (0)

static void test_rules(const char *tmp) {
    char dir[4200];
    zs_gguf_conv *c = NULL;
    /* Mixtral (8 experts, top-2, 4 layers, dim 256, expert size 256) under q4_k_m: llama-quantize's
     * 8-expert rules, ffn_down_exps Q6_K in the layers use_more_bits picks (2 and 3 of 4) */
    int rc = make_dir(tmp, "r-mixtral", "mixtral", NULL, dir, sizeof dir);
    CHECK(rc == 0, "mixtral: %s", zs_errmsg());
    if (rc == 0 && (rc = zs_gguf_conv_open(dir, ZS_FTYPE_MOSTLY_Q4_K_M, &c)) == 0) {
        const zs_model_config *g = zs_gguf_conv_config(c);
        CHECK(!strcmp(zs_gguf_conv_arch(c), "llama") && g->n_experts == 8 && g->n_layers == 4, "mixtral: arch %s",
              zs_gguf_conv_arch(c));
        const zs_gguf_conv_tensor *x = find_t(c, "blk.0.ffn_gate_exps.weight"), *y = find_t(c, "blk.0.ffn_down_exps.weight");
        CHECK(x && x->n_dims == 3 && x->ne[0] == g->dim && x->ne[1] == g->moe_ffn_dim && x->ne[2] == 8,
              "mixtral: ffn_gate_exps is not [dim, moe_ffn, 8]");
        CHECK(y && y->n_dims == 3 && y->ne[0] == g->moe_ffn_dim && y->ne[1] == g->dim && y->ne[2] == 8,
              "mixtral: ffn_down_exps is not [moe_ffn, dim, 8]");
        char nm[64];
        for (int l = 0; l < 4; l++) {
#define N(fmt) (snprintf(nm, sizeof nm, fmt, l), nm)
            CHECK_T(c, "mixtral q4_k_m", N("blk.%d.attn_k.weight"), ZS_GGML_Q8_0, 2);
            CHECK_T(c, "mixtral q4_k_m", N("blk.%d.attn_v.weight"), ZS_GGML_Q8_0, 2);
            CHECK_T(c, "mixtral q4_k_m", N("blk.%d.attn_output.weight"), ZS_GGML_Q5_K, 2);
            CHECK_T(c, "mixtral q4_k_m", N("blk.%d.attn_q.weight"), ZS_GGML_Q4_K, 2);
            CHECK_T(c, "mixtral q4_k_m", N("blk.%d.ffn_gate_inp.weight"), ZS_GGML_F32, 2);
            CHECK_T(c, "mixtral q4_k_m", N("blk.%d.ffn_gate_exps.weight"), ZS_GGML_Q4_K, 3);
            CHECK_T(c, "mixtral q4_k_m", N("blk.%d.ffn_up_exps.weight"), ZS_GGML_Q4_K, 3);
            CHECK_T(c, "mixtral q4_k_m", N("blk.%d.ffn_down_exps.weight"), l >= 2 ? ZS_GGML_Q6_K : ZS_GGML_Q4_K, 3);
            CHECK(!find_t(c, N("blk.%d.ffn_down.weight")), "mixtral: a dense ffn_down");
#undef N
        }
        CHECK(zs_quant_mix_q4_k_m(1, ZS_R_WO, 4, 256, ZS_QMIX_EXPERTS8) == ZS_Q5_K &&
                  zs_quant_mix_q4_k_m(1, ZS_R_WO, 4, 288, ZS_QMIX_EXPERTS8) == ZS_Q5_1 &&
                  zs_quant_mix_q4_k_m(1, ZS_R_WK, 4, 100, ZS_QMIX_EXPERTS8) == ZS_F16 &&
                  zs_quant_mix_q4_k_m(1, ZS_R_WV, 4, 256, 0) == ZS_Q4_K &&
                  zs_quant_mix_q4_k_m(1, ZS_R_ROUTER, 4, 256, 0) == ZS_F32 &&
                  zs_quant_mix_q4_k_m(1, ZS_R_SHARED_GATE, 4, 256, 0) == ZS_F32,
              "quant-mix: the 8-expert rules and the routers");
        zs_gguf_conv_close(c);
        c = NULL;
    }
    CHECK(rc == 0, "mixtral q4_k_m: %s", zs_errmsg());
    /* q4_0: the 8-expert attn_k / attn_v rule applies to every llama-quantize type */
    if (zs_gguf_conv_open(dir, ZS_FTYPE_MOSTLY_Q4_0, &c) == 0) {
        CHECK_T(c, "mixtral q4_0", "blk.1.attn_v.weight", ZS_GGML_Q8_0, 2);
        CHECK_T(c, "mixtral q4_0", "blk.1.attn_output.weight", ZS_GGML_Q4_0, 2);
        CHECK_T(c, "mixtral q4_0", "blk.1.ffn_up_exps.weight", ZS_GGML_Q4_0, 3);
        zs_gguf_conv_close(c);
        c = NULL;
    }
    /* Qwen2-MoE: the shared expert's gate, a matrix to the converter (q8_0), 1-D to llama-quantize (q4_0);
     * tied: output.weight a copy of the token table */
    rc = make_dir(tmp, "r-qwen2moe", "qwen2moe", "{\"tie_word_embeddings\": true}", dir, sizeof dir);
    CHECK(rc == 0, "qwen2moe: %s", zs_errmsg());
    if (rc == 0 && zs_gguf_conv_open(dir, ZS_FTYPE_MOSTLY_Q8_0, &c) == 0) {
        const zs_gguf_conv_tensor *x = find_t(c, "blk.0.ffn_gate_inp_shexp.weight");
        CHECK(x && x->type == ZS_GGML_Q8_0 && x->n_dims == 2 && x->ne[1] == 1, "qwen2moe q8_0: ffn_gate_inp_shexp");
        CHECK_T(c, "qwen2moe q8_0", "blk.0.ffn_gate_inp.weight", ZS_GGML_F32, 2);
        CHECK_T(c, "qwen2moe q8_0", "blk.0.ffn_down_shexp.weight", ZS_GGML_Q8_0, 2);
        CHECK_T(c, "qwen2moe q8_0", "blk.0.attn_q.bias", ZS_GGML_F32, 1);
        const zs_gguf_conv_tensor *o = find_t(c, "output.weight");
        CHECK(o && o->type == ZS_GGML_Q8_0 && o->note && strstr(o->note, "copied"), "qwen2moe tied: output.weight copy");
        zs_gguf_conv_close(c);
        c = NULL;
    }
    if (rc == 0 && zs_gguf_conv_open(dir, ZS_FTYPE_MOSTLY_Q4_0, &c) == 0) {
        CHECK_T(c, "qwen2moe q4_0", "blk.3.ffn_gate_inp_shexp.weight", ZS_GGML_F32, 1);
        CHECK_T(c, "qwen2moe q4_0", "blk.3.attn_v.weight", ZS_GGML_Q4_0, 2); /* 16 experts: no 8-expert rule */
        CHECK_T(c, "qwen2moe q4_0", "output.weight", ZS_GGML_Q6_K, 2);       /* the output tensor's rule */
        zs_gguf_conv_close(c);
        c = NULL;
    }
    /* what llama.cpp 0.3.16 cannot represent */
    static const struct {
        const char *arch, *set, *needle;
    } bad[] = {
        {"qwen2moe", "{\"decoder_sparse_step\": 2}", "dense MLP"},
        {"qwen3moe", "{\"mlp_only_layers\": [1]}", "dense MLP"},
        {"qwen3moe", "{\"norm_topk_prob\": false}", "always renormalises"},
        {"qwen2moe", "{\"norm_topk_prob\": true}", "never renormalises"},
        {"olmoe", "{\"norm_topk_prob\": true}", "never renormalises"},
        {"olmoe", "{\"clip_qkv\": 8.0}", "clip_qkv"},
        {"olmoe", "{\"num_key_value_heads\": 2}", "k_norm"},
        {"qwen3moe", "{\"attention_bias\": true}", "has none"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char nm[32];
        snprintf(nm, sizeof nm, "r-bad%zu", i);
        rc = make_dir(tmp, nm, bad[i].arch, bad[i].set, dir, sizeof dir);
        CHECK(rc == 0, "%s %s: %s", bad[i].arch, bad[i].set, zs_errmsg());
        if (rc) continue;
        c = NULL;
        CHECK_ERR(zs_gguf_conv_open(dir, ZS_FTYPE_ALL_F32, &c), bad[i].needle, "llama.cpp");
        zs_gguf_conv_close(c);
    }
}

/* The logits rows of zeroserve's greedy decoding of p (n_new tokens) on the model at path (a GGUF
 * file or a Hugging Face directory) loaded at weight dtype wd (NULL: as stored; "q4_k_m": the mix);
 * NULL on failure (checked). */
static float *greedy_rows(const char *name, const char *path, const char *wd, const int32_t *p, size_t np, int n_new,
                          int *n_rows, int *vocab) {
    zs_engine *e = tu_lc_open(name, path, wd);
    if (!e) return NULL;
    tu_logit_log lg = {0};
    zs_gen_result res = {0};
    int rc = tu_lc_greedy(e, p, np, n_new, &lg, &res);
    CHECK(rc == 0, "%s: generate on %s: %s", name, path, zs_errmsg());
    free(res.ids);
    zs_engine_free(e);
    if (rc) {
        free(lg.rows);
        return NULL;
    }
    *n_rows = lg.n;
    *vocab = lg.vocab;
    return lg.rows;
}

static void run_case(json_t *c, const char *tmp) {
    const char *name = json_string_value(json_object_get(c, "name"));
    const char *pw = json_string_value(json_object_get(c, "peer_weights"));
    char gguf[4300];
    if (tu_lc_make_gguf(c, tmp, "tests/ref/moe-llamacpp/make_ref.py", gguf, sizeof gguf)) return;
    check_file(name, gguf, c);
    zs_op_matmul_quant_act(ZS_QUANT_ACT_F32); /* f32 files, and the blocks against llama.cpp's dequantized run */
    zs_engine *e = tu_lc_open(name, gguf, NULL);
    if (!e) return;
    /* the GGUF loader made a mixture: one bucket per expert after the head */
    const zs_model *m = zs_engine_model(e);
    int ne = (int)json_integer_value(json_object_get(c, "n_experts"));
    CHECK(zs_model_config_get(m)->n_experts == ne && zs_bucket_expert(m, 0, ne - 1) > zs_bucket_head(m),
          "%s: the loaded model has %d experts (want %d) or no expert buckets", name, zs_model_config_get(m)->n_experts, ne);
    size_t np;
    int32_t *p = tu_ref_ids_dup(json_object_get(c, "prompt_ids"), &np);
    char label[96];
    snprintf(label, sizeof label, "%s%s", name, pw && !strcmp(pw, "dequantized to f32") ? " (dequantized)" : "");
    if (p && np > 0) tu_lc_compare(label, e, p, np, c, TOL, MIN_STEPS);
    /* the file computes what the checkpoint does: at f32 bit for bit (the same floats in the same order:
     * Mixtral's Q/K rows permuted on the way out and back on the way in, the experts sliced from their
     * stacked tensors); at q8_0 and q4_k_m bit for bit what the checkpoint quantized at load
     * (--weight-dtype) does, i.e. the same block format and bytes for every tensor — except Qwen2-MoE's
     * shared-expert gate, a Q8_0 matrix in convert_hf_to_gguf.py's q8_0 file and f32 at load (a
     * steering tensor), where the two agree within the tolerance */
    if (p && np > 0) {
        const char *dt = json_string_value(json_object_get(c, "dtype"));
        int shexp_q8 = !strcmp(dt, "q8_0") && !strcmp(json_string_value(json_object_get(c, "gguf_arch")), "qwen2moe");
        char dir[4200];
        snprintf(dir, sizeof dir, "%s/%s", tmp, name);
        int na = 0, nb = 0, va = 0, vb = 0, n_new = (int)json_array_size(json_object_get(c, "ids"));
        float *ra = greedy_rows(name, gguf, NULL, p, np, n_new, &na, &va);
        float *rb = greedy_rows(name, dir, !strcmp(dt, "f32") ? NULL : dt, p, np, n_new, &nb, &vb);
        int same = ra && rb && na == nb && va == vb && na > 0;
        double d = 0;
        for (size_t i = 0; same && i < (size_t)na * va; i++) d = fabs(ra[i] - rb[i]) > d ? fabs(ra[i] - rb[i]) : d;
        if (shexp_q8) CHECK(same && d <= TOL, "%s: the file's logits differ from the checkpoint's at --weight-dtype %s "
                            "by %.3g", name, dt, d);
        else CHECK(same && !memcmp(ra, rb, (size_t)na * va * sizeof(float)), "%s: the file's logits are not the "
                   "checkpoint's%s%s bit for bit (max |d| %.3g)", name, strcmp(dt, "f32") ? " at --weight-dtype " : "",
                   strcmp(dt, "f32") ? dt : "", d);
        free(ra);
        free(rb);
    }
    tu_lc_features(name, c, TOL, FEATURE_MARGIN);
    free(p);
    zs_engine_free(e);
}

int main(void) {
    const char *path = "tests/ref/moe-llamacpp/ref.json";
    json_error_t je;
    json_t *ref = json_load_file(path, 0, &je);
    CHECK(ref != NULL, "%s: %s", path, je.text);
    if (!ref) return tu_finish("test-moe-gguf");
    json_t *cases = json_object_get(ref, "cases");
    /* the reference must cover what the test claims: the four architectures, each with an f32 case
     * whose features were measured */
    static const char *const archs[] = {"llama", "qwen2moe", "qwen3moe", "olmoe"};
    CHECK(json_array_size(cases) >= MIN_CASES, "%s: %zu cases (want >= %d)", path, json_array_size(cases), MIN_CASES);
    for (int a = 0; a < 4; a++) {
        int ok = 0;
        for (size_t i = 0; i < json_array_size(cases); i++) {
            json_t *c = json_array_get(cases, i);
            const char *ga = json_string_value(json_object_get(c, "gguf_arch"));
            const char *dt = json_string_value(json_object_get(c, "dtype"));
            ok |= ga && dt && !strcmp(ga, archs[a]) && !strcmp(dt, "f32") &&
                  json_array_size(json_object_get(c, "features")) >= 2;
        }
        CHECK(ok, "%s: no f32 case of %s with features", path, archs[a]);
    }
    char tmp[4096];
    if (tu_tmpdir(tmp, sizeof tmp, "moegguf") == 0) {
        test_rules(tmp);
        for (size_t i = 0; i < json_array_size(cases); i++) run_case(json_array_get(cases, i), tmp);
        tu_rmdir(tmp);
    }
    json_decref(ref);
    return tu_finish("test-moe-gguf");
}
