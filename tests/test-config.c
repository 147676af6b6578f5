/* test-config.c — config.json of the mixtures of experts (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE):
 * what each key turns into, the defaults of transformers 4.57's config classes when a key is absent,
 * the settings refused with the key named, the sparse layers (decoder_sparse_step, mlp_only_layers),
 * zs_config_write read back equal, init-model's defaults, flags and tensor names (the names and
 * shapes transformers' modeling_*.py declare: directories written this way load with
 * AutoModelForCausalLM.from_pretrained with no missing, unexpected or mismatched keys), and the
 * GGUF metadata of the MoE architectures under llama.cpp's key names (gguf/constants.py) with what
 * llama.cpp's loader defaults and hard-codes. */
#include <stdio.h>
#include <string.h>

#include "common.h"
#include "config.h"
#include "gguf-write.h"
#include "gguf.h"
#include "init-cmd.h"
#include "init-model.h"
#include "model.h"
#include "safetensors.h"
#include "testutil.h"

static char tmp[4096];
static const char *o = "x/config.json";

/* the sizes every snippet shares: 4 layers of 64, 8 heads of 8 */
#define SIZES "\"hidden_size\": 64, \"intermediate_size\": 96, \"num_hidden_layers\": 4, \"num_attention_heads\": 8, " \
              "\"vocab_size\": 300"
#define CFG(arch, extra) "{\"architectures\": [\"" arch "\"], " SIZES extra "}"
/* Qwen2-MoE's num_key_value_heads defaults to 16, more than the 8 heads here */
#define Q2(extra) CFG("Qwen2MoeForCausalLM", ", \"num_key_value_heads\": 4, \"" extra)

static int all_moe(const zs_model_config *c, const char *want) {
    for (int l = 0; l < c->n_layers; l++)
        if (zs_config_layer_moe(c, l) != (want[l] == 'S')) return 0;
    return (int)strlen(want) == c->n_layers;
}

static void test_mixtral(void) {
    zs_model_config c;
    /* Mixtral-8x7B-v0.1's config.json, shrunk */
    const char *real = "{\"architectures\": [\"MixtralForCausalLM\"], \"attention_dropout\": 0.0, \"bos_token_id\": 1, "
                       "\"eos_token_id\": 2, \"hidden_act\": \"silu\", \"hidden_size\": 64, \"initializer_range\": 0.02, "
                       "\"intermediate_size\": 224, \"max_position_embeddings\": 32768, \"model_type\": \"mixtral\", "
                       "\"num_attention_heads\": 8, \"num_experts_per_tok\": 2, \"num_hidden_layers\": 3, "
                       "\"num_key_value_heads\": 2, \"num_local_experts\": 8, \"output_router_logits\": false, "
                       "\"rms_norm_eps\": 1e-05, \"rope_theta\": 1000000.0, \"router_aux_loss_coef\": 0.02, "
                       "\"sliding_window\": null, \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\", "
                       "\"transformers_version\": \"4.36.0.dev0\", \"use_cache\": true, \"vocab_size\": 300}";
    CHECK(zs_config_parse(real, o, &c) == 0, "mixtral: %s", zs_errmsg());
    CHECK(c.family == ZS_FAM_MIXTRAL && c.arch == ZS_ARCH_LLAMA && c.n_experts == 8 && c.n_experts_used == 2 &&
              c.moe_ffn_dim == 224 && c.ffn_dim == 224 && c.shared_ffn_dim == 0 && c.norm_topk_prob == 1 &&
              c.router_aux_loss_coef == 0.02f && !c.output_router_logits && c.n_kv_heads == 2 && c.head_dim == 8 &&
              !c.qkv_bias && !c.o_bias && !c.qk_norm && !c.qk_norm_full && c.clip_qkv == 0 && c.sliding_window == 0 &&
              all_moe(&c, "SSS") && c.dtype == ZS_BF16 && c.bos_id == 1 && c.eos_id == 2,
          "mixtral values");
    CHECK(!strcmp(zs_family_name(c.family), "mixtral"), "mixtral name %s", zs_family_name(c.family));
    /* MixtralConfig's defaults: 8 experts top-2, kv heads 8, theta 1e6, eps 1e-5, aux 0.001, context 131072,
     * no window; attention_bias and norm_topk_prob do not exist for it */
    CHECK(zs_config_parse(CFG("MixtralForCausalLM", ", \"attention_bias\": true, \"norm_topk_prob\": false"), o, &c) == 0,
          "mixtral defaults: %s", zs_errmsg());
    CHECK(c.n_experts == 8 && c.n_experts_used == 2 && c.n_kv_heads == 8 && c.rope_theta == 1e6f && c.norm_eps == 1e-5f &&
              c.router_aux_loss_coef == 0.001f && c.max_seq == 131072 && c.sliding_window == 0 && !c.qkv_bias &&
              c.norm_topk_prob == 1 && all_moe(&c, "SSSS"),
          "mixtral defaults values (kv %d theta %g eps %g)", c.n_kv_heads, (double)c.rope_theta, (double)c.norm_eps);
    /* a window applies to every layer */
    CHECK(zs_config_parse(CFG("MixtralForCausalLM", ", \"sliding_window\": 64"), o, &c) == 0 && c.sliding_window == 64 &&
              zs_config_layer_window(&c, 0) == 64 && zs_config_layer_window(&c, 3) == 64,
          "mixtral window: %s", zs_errmsg());
    /* model_type alone */
    CHECK(zs_config_parse("{\"model_type\": \"mixtral\", " SIZES "}", o, &c) == 0 && c.family == ZS_FAM_MIXTRAL,
          "mixtral by model_type: %s", zs_errmsg());
    /* refusals, by name */
    CHECK_ERR(zs_config_parse(CFG("MixtralForCausalLM", ", \"num_local_experts\": 513"), o, &c), "num_local_experts",
              "513", "512");
    CHECK_ERR(zs_config_parse(CFG("MixtralForCausalLM", ", \"num_local_experts\": 0"), o, &c), "num_local_experts");
    CHECK_ERR(zs_config_parse(CFG("MixtralForCausalLM", ", \"num_experts_per_tok\": 9"), o, &c), "num_experts_per_tok",
              "9", "8");
    CHECK_ERR(zs_config_parse(CFG("MixtralForCausalLM", ", \"num_experts_per_tok\": 0"), o, &c), "num_experts_per_tok");
    CHECK_ERR(zs_config_parse(CFG("MixtralForCausalLM", ", \"router_jitter_noise\": 0.01"), o, &c), "router_jitter_noise");
    CHECK(zs_config_parse(CFG("MixtralForCausalLM", ", \"router_jitter_noise\": 0.0"), o, &c) == 0, "jitter 0: %s",
          zs_errmsg());
    CHECK_ERR(zs_config_parse(CFG("MixtralForCausalLM", ", \"router_aux_loss_coef\": -1"), o, &c), "router_aux_loss_coef");
    CHECK_ERR(zs_config_parse(CFG("MixtralForCausalLM", ", \"output_router_logits\": 1"), o, &c), "output_router_logits");
    CHECK_ERR(zs_config_parse(CFG("MixtralForCausalLM", ", \"hidden_act\": \"gelu\""), o, &c), "hidden_act", "gelu");
}

static void test_qwen2moe(void) {
    zs_model_config c;
    /* Qwen1.5-MoE-A2.7B's config.json, shrunk */
    const char *real = "{\"architectures\": [\"Qwen2MoeForCausalLM\"], \"attention_dropout\": 0.0, \"bos_token_id\": 151643, "
                       "\"eos_token_id\": 151643, \"hidden_act\": \"silu\", \"hidden_size\": 64, \"initializer_range\": 0.02, "
                       "\"intermediate_size\": 176, \"max_position_embeddings\": 8192, \"max_window_layers\": 21, "
                       "\"model_type\": \"qwen2_moe\", \"num_attention_heads\": 4, \"num_hidden_layers\": 4, "
                       "\"num_key_value_heads\": 4, \"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000.0, "
                       "\"sliding_window\": 32768, \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\", "
                       "\"use_cache\": true, \"use_sliding_window\": false, \"vocab_size\": 151936, "
                       "\"decoder_sparse_step\": 1, \"moe_intermediate_size\": 44, \"shared_expert_intermediate_size\": 176, "
                       "\"num_experts_per_tok\": 4, \"num_experts\": 60, \"norm_topk_prob\": false, "
                       "\"output_router_logits\": false, \"router_aux_loss_coef\": 0.001}";
    CHECK(zs_config_parse(real, o, &c) == 0, "qwen2moe: %s", zs_errmsg());
    CHECK(c.family == ZS_FAM_QWEN2MOE && c.n_experts == 60 && c.n_experts_used == 4 && c.moe_ffn_dim == 44 &&
              c.shared_ffn_dim == 176 && c.ffn_dim == 176 && !c.norm_topk_prob && c.router_aux_loss_coef == 0.001f &&
              c.qkv_bias && !c.o_bias && !c.mlp_bias && !c.qk_norm && !c.qk_norm_full && c.head_dim == 16 &&
              c.sliding_window == 0 && all_moe(&c, "SSSS"),
          "qwen2moe values");
    CHECK(!strcmp(zs_family_name(c.family), "qwen2moe"), "qwen2moe name");
    /* defaults: 60 experts top-4, 1408 / 5632 wide, kv heads 16, qkv_bias true */
    CHECK(zs_config_parse("{\"architectures\": [\"Qwen2MoeForCausalLM\"], \"hidden_size\": 64, \"intermediate_size\": 96, "
                          "\"num_hidden_layers\": 2, \"num_attention_heads\": 16, \"vocab_size\": 300}", o, &c) == 0,
          "qwen2moe defaults: %s", zs_errmsg());
    CHECK(c.n_experts == 60 && c.n_experts_used == 4 && c.moe_ffn_dim == 1408 && c.shared_ffn_dim == 5632 &&
              c.n_kv_heads == 16 && c.qkv_bias && !c.norm_topk_prob && c.rope_theta == 10000.0f && c.norm_eps == 1e-6f &&
              c.max_seq == 32768 && !c.tied_embeddings,
          "qwen2moe default values");
    CHECK(zs_config_parse(CFG("Qwen2MoeForCausalLM", ", \"num_key_value_heads\": null, \"qkv_bias\": false, "
                                                     "\"norm_topk_prob\": true, \"output_router_logits\": true"), o, &c) == 0 &&
              c.n_kv_heads == 8 && !c.qkv_bias && c.norm_topk_prob && c.output_router_logits,
          "qwen2moe keys: %s", zs_errmsg());
    /* sparse layers: (l + 1) % step == 0 and not in mlp_only_layers (indices past the layers never match) */
    CHECK(zs_config_parse(Q2("decoder_sparse_step\": 2, \"mlp_only_layers\": [3, 9]"), o,
                          &c) == 0 && all_moe(&c, "DSDD"),
          "qwen2moe sparse step: %s", zs_errmsg());
    CHECK(zs_config_parse(Q2("mlp_only_layers\": [0, 2]"), o, &c) == 0 && all_moe(&c, "DSDS"),
          "qwen2moe mlp_only_layers: %s", zs_errmsg());
    /* num_experts 0: every layer dense, the routing fields 0 */
    CHECK(zs_config_parse(Q2("num_experts\": 0"), o, &c) == 0 && c.n_experts == 0 &&
              c.n_experts_used == 0 && c.moe_ffn_dim == 0 && c.shared_ffn_dim == 0 && all_moe(&c, "DDDD"),
          "qwen2moe dense: %s", zs_errmsg());
    /* refusals */
    CHECK_ERR(zs_config_parse(Q2("use_sliding_window\": true"), o, &c), "use_sliding_window");
    CHECK_ERR(zs_config_parse(Q2("head_dim\": 16"), o, &c), "head_dim", "hidden_size");
    CHECK_ERR(zs_config_parse(Q2("decoder_sparse_step\": 0"), o, &c), "decoder_sparse_step");
    CHECK_ERR(zs_config_parse(Q2("mlp_only_layers\": [\"1\"]"), o, &c), "mlp_only_layers[0]");
    CHECK_ERR(zs_config_parse(Q2("mlp_only_layers\": 1"), o, &c), "mlp_only_layers");
    CHECK_ERR(zs_config_parse(Q2("num_experts\": 4, \"num_experts_per_tok\": 5"), o, &c),
              "num_experts_per_tok", "num_experts");
    CHECK_ERR(zs_config_parse(Q2("num_experts\": 1000"), o, &c), "num_experts", "512");
    CHECK_ERR(zs_config_parse(Q2("moe_intermediate_size\": 0"), o, &c), "moe_intermediate_size");
    CHECK_ERR(zs_config_parse(Q2("shared_expert_intermediate_size\": 0"), o, &c),
              "shared_expert_intermediate_size");
}

static void test_qwen3moe(void) {
    zs_model_config c;
    /* Qwen3-30B-A3B's config.json, shrunk */
    const char *real = "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0, "
                       "\"bos_token_id\": 151643, \"decoder_sparse_step\": 1, \"eos_token_id\": 151645, \"head_dim\": 32, "
                       "\"hidden_act\": \"silu\", \"hidden_size\": 64, \"initializer_range\": 0.02, \"intermediate_size\": 192, "
                       "\"max_position_embeddings\": 40960, \"max_window_layers\": 48, \"mlp_only_layers\": [], "
                       "\"model_type\": \"qwen3_moe\", \"moe_intermediate_size\": 24, \"norm_topk_prob\": true, "
                       "\"num_attention_heads\": 8, \"num_experts\": 128, \"num_experts_per_tok\": 8, "
                       "\"num_hidden_layers\": 3, \"num_key_value_heads\": 2, \"output_router_logits\": false, "
                       "\"rms_norm_eps\": 1e-06, \"rope_scaling\": null, \"rope_theta\": 1000000.0, "
                       "\"router_aux_loss_coef\": 0.001, \"sliding_window\": null, \"tie_word_embeddings\": false, "
                       "\"torch_dtype\": \"bfloat16\", \"use_cache\": true, \"use_sliding_window\": false, \"vocab_size\": 151936}";
    CHECK(zs_config_parse(real, o, &c) == 0, "qwen3moe: %s", zs_errmsg());
    CHECK(c.family == ZS_FAM_QWEN3MOE && c.n_experts == 128 && c.n_experts_used == 8 && c.moe_ffn_dim == 24 &&
              c.ffn_dim == 192 && c.shared_ffn_dim == 0 && c.norm_topk_prob && c.head_dim == 32 && c.n_kv_heads == 2 &&
              c.qk_norm && !c.qk_norm_full && !c.qkv_bias && !c.o_bias && c.sliding_window == 0 && all_moe(&c, "SSS"),
          "qwen3moe values");
    CHECK(!strcmp(zs_family_name(c.family), "qwen3moe"), "qwen3moe name");
    /* defaults: 128 experts top-8, 768 wide, kv heads 4, head_dim hidden / heads (not Qwen3's 128) */
    CHECK(zs_config_parse(CFG("Qwen3MoeForCausalLM", ""), o, &c) == 0, "qwen3moe defaults: %s", zs_errmsg());
    CHECK(c.n_experts == 128 && c.n_experts_used == 8 && c.moe_ffn_dim == 768 && c.n_kv_heads == 4 && c.head_dim == 8 &&
              !c.norm_topk_prob && c.router_aux_loss_coef == 0.001f && c.qk_norm,
          "qwen3moe default values (head_dim %d)", c.head_dim);
    CHECK(zs_config_parse(CFG("Qwen3MoeForCausalLM", ", \"attention_bias\": true"), o, &c) == 0 && c.qkv_bias && c.o_bias,
          "qwen3moe attention_bias: %s", zs_errmsg());
    /* its window (use_sliding_window) is every layer's; the default 4096 outlasts a 1024 context */
    CHECK(zs_config_parse(CFG("Qwen3MoeForCausalLM", ", \"use_sliding_window\": true, \"sliding_window\": 16, "
                                                     "\"max_window_layers\": 2"), o, &c) == 0 &&
              c.sliding_window == 16 && zs_config_layer_window(&c, 0) == 16 && zs_config_layer_window(&c, 3) == 16,
          "qwen3moe window: %s", zs_errmsg());
    CHECK(zs_config_parse(CFG("Qwen3MoeForCausalLM", ", \"sliding_window\": 16"), o, &c) == 0 && c.sliding_window == 0,
          "qwen3moe window off: %s", zs_errmsg());
    CHECK(zs_config_parse(CFG("Qwen3MoeForCausalLM", ", \"decoder_sparse_step\": 3, \"mlp_only_layers\": [5]"), o, &c) == 0 &&
              all_moe(&c, "DDSD"),
          "qwen3moe sparse step: %s", zs_errmsg());
    CHECK_ERR(zs_config_parse(CFG("Qwen3MoeForCausalLM", ", \"num_experts_per_tok\": 200"), o, &c), "num_experts_per_tok");
}

static void test_olmoe(void) {
    zs_model_config c;
    /* OLMoE-1B-7B-0924's config.json, shrunk */
    const char *real = "{\"architectures\": [\"OlmoeForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0, "
                       "\"clip_qkv\": null, \"eos_token_id\": 50279, \"hidden_act\": \"silu\", \"hidden_size\": 64, "
                       "\"initializer_range\": 0.02, \"intermediate_size\": 32, \"max_position_embeddings\": 4096, "
                       "\"model_type\": \"olmoe\", \"norm_topk_prob\": false, \"num_attention_heads\": 4, "
                       "\"num_experts\": 64, \"num_experts_per_tok\": 8, \"num_hidden_layers\": 2, "
                       "\"num_key_value_heads\": 2, \"output_router_logits\": false, \"pad_token_id\": 1, "
                       "\"rms_norm_eps\": 1e-05, \"rope_scaling\": null, \"rope_theta\": 10000.0, "
                       "\"router_aux_loss_coef\": 0.01, \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\", "
                       "\"use_cache\": true, \"vocab_size\": 50304}";
    CHECK(zs_config_parse(real, o, &c) == 0, "olmoe: %s", zs_errmsg());
    CHECK(c.family == ZS_FAM_OLMOE && c.n_experts == 64 && c.n_experts_used == 8 && c.moe_ffn_dim == 32 &&
              c.ffn_dim == 32 && !c.norm_topk_prob && c.router_aux_loss_coef == 0.01f && c.qk_norm_full && !c.qk_norm &&
              c.clip_qkv == 0 && c.head_dim == 16 && c.n_kv_heads == 2 && !c.qkv_bias && c.bos_id == -1 &&
              c.eos_id == 50279 && all_moe(&c, "SS"),
          "olmoe values");
    CHECK(!strcmp(zs_family_name(c.family), "olmoe"), "olmoe name");
    /* defaults: 64 experts top-8, aux 0.01, eps 1e-5, kv heads = heads; head_dim is always hidden / heads */
    CHECK(zs_config_parse(CFG("OlmoeForCausalLM", ", \"head_dim\": 32, \"clip_qkv\": 8.0, \"attention_bias\": true, "
                                                  "\"sliding_window\": 16"), o, &c) == 0,
          "olmoe defaults: %s", zs_errmsg());
    CHECK(c.n_experts == 64 && c.n_experts_used == 8 && c.router_aux_loss_coef == 0.01f && c.norm_eps == 1e-5f &&
              c.n_kv_heads == 8 && c.head_dim == 8 && c.clip_qkv == 8.0f && c.qkv_bias && c.o_bias && c.sliding_window == 0 &&
              c.max_seq == 4096,
          "olmoe default values (head_dim %d)", c.head_dim);
    CHECK_ERR(zs_config_parse(CFG("OlmoeForCausalLM", ", \"clip_qkv\": -1"), o, &c), "clip_qkv");
    CHECK_ERR(zs_config_parse(CFG("OlmoeForCausalLM", ", \"num_experts\": 0"), o, &c), "num_experts");
    CHECK_ERR(zs_config_parse(CFG("OlmoeForCausalLM", ", \"norm_topk_prob\": \"yes\""), o, &c), "norm_topk_prob");
    /* the dense families are unchanged by all this */
    CHECK(zs_config_parse(CFG("LlamaForCausalLM", ", \"num_experts\": 8"), o, &c) == 0 && c.n_experts == 0 &&
              !zs_config_layer_moe(&c, 0),
          "llama: %s", zs_errmsg());
}

/* the fields zs_config_write promises to keep */
static int same(const zs_model_config *a, const zs_model_config *b) {
    return a->family == b->family && a->n_layers == b->n_layers && a->dim == b->dim && a->n_heads == b->n_heads &&
           a->n_kv_heads == b->n_kv_heads && a->head_dim == b->head_dim && a->ffn_dim == b->ffn_dim &&
           a->norm_eps == b->norm_eps && a->rope_theta == b->rope_theta && a->qkv_bias == b->qkv_bias &&
           a->o_bias == b->o_bias && a->qk_norm == b->qk_norm && a->sliding_window == b->sliding_window &&
           a->n_experts == b->n_experts && a->n_experts_used == b->n_experts_used && a->moe_ffn_dim == b->moe_ffn_dim &&
           a->shared_ffn_dim == b->shared_ffn_dim && a->norm_topk_prob == b->norm_topk_prob &&
           a->router_aux_loss_coef == b->router_aux_loss_coef && a->output_router_logits == b->output_router_logits &&
           a->qk_norm_full == b->qk_norm_full && a->clip_qkv == b->clip_qkv &&
           !memcmp(a->layer_moe, b->layer_moe, sizeof a->layer_moe) &&
           !memcmp(a->layer_sliding, b->layer_sliding, sizeof a->layer_sliding);
}

static void roundtrip(const char *name, const zs_model_config *c) {
    char p[4200];
    zs_model_config b;
    snprintf(p, sizeof p, "%s/config.json", tmp);
    int rc = zs_config_write(c, p);
    CHECK(rc == 0, "%s writes: %s", name, zs_errmsg());
    rc = rc ? rc : zs_config_load(tmp, &b);
    CHECK(rc == 0 && same(c, &b), "%s reads back equal: %s", name, rc ? zs_errmsg() : "fields differ");
}

static void test_write(void) {
    static const char *archs[] = {"mixtral", "qwen2moe", "qwen3moe", "olmoe"};
    zs_model_config c;
    for (int i = 0; i < 4; i++) {
        zs_init_opts io;
        CHECK(zs_init_opts_default(archs[i], &io) == 0, "%s defaults: %s", archs[i], zs_errmsg());
        CHECK(!strcmp(zs_family_name(io.cfg.family), archs[i]), "%s family name", archs[i]);
        roundtrip(archs[i], &io.cfg);
        /* every knob away from its default */
        io.cfg.output_router_logits = 1;
        io.cfg.router_aux_loss_coef = 0.02f;
        if (io.cfg.family != ZS_FAM_MIXTRAL) io.cfg.norm_topk_prob = !io.cfg.norm_topk_prob;
        if (io.cfg.family == ZS_FAM_OLMOE) io.cfg.clip_qkv = 8.5f;
        roundtrip(archs[i], &io.cfg);
    }
    /* transformers-shaped configs with dense layers and windows: parsed, written, read back */
    const char *cfgs[] = {
        Q2("decoder_sparse_step\": 2, \"mlp_only_layers\": [3]"),
        Q2("mlp_only_layers\": [0, 1, 2, 3]"),
        Q2("num_experts\": 0"),
        CFG("Qwen3MoeForCausalLM", ", \"decoder_sparse_step\": 4"),
        CFG("Qwen3MoeForCausalLM", ", \"use_sliding_window\": true, \"sliding_window\": 16, \"attention_bias\": true"),
        CFG("MixtralForCausalLM", ", \"sliding_window\": 32, \"num_key_value_heads\": 2, \"rope_scaling\": "
                                  "{\"rope_type\": \"linear\", \"factor\": 2.0}"),
        CFG("OlmoeForCausalLM", ", \"attention_bias\": true, \"num_key_value_heads\": 4"),
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
        int rc = zs_config_parse(cfgs[i], o, &c);
        CHECK(rc == 0, "config %zu: %s", i, zs_errmsg());
        if (rc == 0) roundtrip(cfgs[i], &c);
    }
    /* the written step and list (the largest step that fits, the rest listed) */
    CHECK(zs_config_parse(Q2("decoder_sparse_step\": 2, \"mlp_only_layers\": [3]"), o, &c) == 0,
          "step config");
    char p[4200];
    snprintf(p, sizeof p, "%s/config.json", tmp);
    CHECK(zs_config_write(&c, p) == 0, "write: %s", zs_errmsg());
    json_t *j = json_load_file(p, 0, NULL);
    json_t *only = json_object_get(j, "mlp_only_layers");
    CHECK(json_integer_value(json_object_get(j, "decoder_sparse_step")) == 2 && json_array_size(only) == 1 &&
              json_integer_value(json_array_get(only, 0)) == 3,
          "written decoder_sparse_step / mlp_only_layers");
    json_decref(j);
    /* not expressible: Mixtral's experts are intermediate_size wide and it routes every layer */
    zs_init_opts io;
    zs_init_opts_default("mixtral", &io);
    io.cfg.moe_ffn_dim = io.cfg.ffn_dim + 2;
    CHECK_ERR(zs_config_write(&io.cfg, p), "moe_ffn_dim");
    zs_init_opts_default("mixtral", &io);
    io.cfg.layer_moe[1] = 0;
    CHECK_ERR(zs_config_write(&io.cfg, p), "sparse");
    zs_init_opts_default("qwen3moe", &io);
    io.cfg.shared_ffn_dim = 64; /* only Qwen2-MoE has a shared expert */
    CHECK_ERR(zs_config_write(&io.cfg, p), "shared_ffn_dim");
    zs_init_opts_default("olmoe", &io);
    io.cfg.qk_norm_full = 0;
    CHECK_ERR(zs_config_write(&io.cfg, p), "qk_norm_full");
    /* override re-derives what follows */
    zs_init_opts_default("qwen3moe", &io);
    CHECK(zs_config_override(&io.cfg, "{\"num_experts\": 32, \"decoder_sparse_step\": 2}", "t") == 0 &&
              io.cfg.n_experts == 32 && all_moe(&io.cfg, "DSDS"),
          "override: %s", zs_errmsg());
}

/* ---- GGUF metadata as llama.cpp's converter writes it ---- */
typedef struct { const char *key; uint32_t v; } gg_kv;

/* Writes <tmp>/t.gguf: arch, the common sizes (4 layers of 64, 8 heads, ffn 96), the extra u32 keys,
 * and for each layer l a tiny blk.l.ffn_gate_inp.weight ('S' in layers) or blk.l.ffn_up.weight ('D');
 * opens it and reads the config. */
static int gg_config(const char *arch, const gg_kv *kv, const char *layers, zs_model_config *c) {
    char path[4200], k[160];
    snprintf(path, sizeof path, "%s/t.gguf", tmp);
    zs_gguf_writer *w;
    if (zs_gguf_writer_open(path, &w) != 0) return -1;
    zs_gguf_writer_kv_str(w, "general.architecture", arch);
    static const gg_kv base[] = {{"context_length", 256}, {"embedding_length", 64}, {"block_count", 4},
                                 {"feed_forward_length", 96}, {"attention.head_count", 8}, {"attention.head_count_kv", 4},
                                 {"vocab_size", 300}};
    for (size_t i = 0; i < sizeof base / sizeof base[0]; i++) {
        snprintf(k, sizeof k, "%s.%s", arch, base[i].key);
        zs_gguf_writer_kv_u32(w, k, base[i].v);
    }
    snprintf(k, sizeof k, "%s.attention.layer_norm_rms_epsilon", arch);
    zs_gguf_writer_kv_f32(w, k, 1e-5f);
    for (; kv && kv->key; kv++) {
        snprintf(k, sizeof k, "%s.%s", arch, kv->key);
        if (!strcmp(kv->key, "attention.clamp_kqv")) zs_gguf_writer_kv_f32(w, k, (float)kv->v);
        else zs_gguf_writer_kv_u32(w, k, kv->v);
    }
    int64_t ne[1] = {8};
    int nt = 0;
    for (int l = 0; layers && layers[l]; l++) {
        snprintf(k, sizeof k, layers[l] == 'S' ? "blk.%d.ffn_gate_inp.weight" : "blk.%d.ffn_up.weight", l);
        zs_gguf_writer_add_tensor(w, k, ZS_GGML_F32, 1, ne);
        nt++;
    }
    float zeros[8] = {0};
    for (int i = 0; i < nt; i++) zs_gguf_writer_write(w, zeros, sizeof zeros);
    if (zs_gguf_writer_close(w) != 0) return -1;
    zs_gguf *g;
    if (zs_gguf_open(path, &g) != 0) return -1;
    int rc = zs_config_from_gguf(g, c);
    zs_gguf_close(g);
    return rc;
}

static void test_gguf(void) {
    zs_model_config c;
    /* llama with experts: Mixtral, every layer, renormalised, the experts feed_forward_length wide */
    const gg_kv mx[] = {{"expert_count", 8}, {"expert_used_count", 2}, {NULL, 0}};
    CHECK(gg_config("llama", mx, "SSSS", &c) == 0, "llama experts: %s", zs_errmsg());
    CHECK(c.family == ZS_FAM_MIXTRAL && !strcmp(c.arch_name, "MixtralForCausalLM") && c.n_experts == 8 &&
              c.n_experts_used == 2 && c.moe_ffn_dim == 96 && c.ffn_dim == 96 && c.norm_topk_prob && !c.shared_ffn_dim &&
              all_moe(&c, "SSSS") && c.router_aux_loss_coef == 0.001f,
          "mixtral from gguf");
    const gg_kv dense[] = {{"expert_count", 0}, {NULL, 0}};
    CHECK(gg_config("llama", dense, NULL, &c) == 0 && c.family == ZS_FAM_LLAMA && c.n_experts == 0, "llama, 0 experts: %s",
          zs_errmsg());
    const gg_kv mx_bad[] = {{"expert_count", 8}, {"expert_used_count", 9}, {NULL, 0}};
    CHECK_ERR(gg_config("llama", mx_bad, NULL, &c), "llama.expert_used_count");
    const gg_kv mx_big[] = {{"expert_count", 1024}, {"expert_used_count", 2}, {NULL, 0}};
    CHECK_ERR(gg_config("llama", mx_big, NULL, &c), "llama.expert_count", "512");
    const gg_kv mx_sh[] = {{"expert_count", 8}, {"expert_used_count", 2}, {"expert_shared_feed_forward_length", 32},
                           {NULL, 0}};
    CHECK_ERR(gg_config("llama", mx_sh, NULL, &c), "expert_shared_feed_forward_length");
    const gg_kv q2_exp[] = {{"expert_count", 4}, {NULL, 0}};
    CHECK_ERR(gg_config("qwen2", q2_exp, NULL, &c), "qwen2.expert_count");
    /* qwen2moe: the experts' and the shared expert's widths, no renormalisation; a dense layer */
    const gg_kv q2[] = {{"expert_count", 16}, {"expert_used_count", 4}, {"expert_feed_forward_length", 24},
                        {"expert_shared_feed_forward_length", 40}, {"expert_weights_norm", 1}, {NULL, 0}};
    CHECK(gg_config("qwen2moe", q2, "DSSS", &c) == 0, "qwen2moe: %s", zs_errmsg());
    CHECK(c.family == ZS_FAM_QWEN2MOE && c.n_experts == 16 && c.n_experts_used == 4 && c.moe_ffn_dim == 24 &&
              c.shared_ffn_dim == 40 && c.ffn_dim == 96 && !c.norm_topk_prob && all_moe(&c, "DSSS") && !c.qk_norm,
          "qwen2moe from gguf");
    /* llama.cpp's defaults: experts feed_forward_length / used wide, the shared expert feed_forward_length */
    const gg_kv q2d[] = {{"expert_count", 16}, {"expert_used_count", 4}, {NULL, 0}};
    CHECK(gg_config("qwen2moe", q2d, NULL, &c) == 0 && c.moe_ffn_dim == 24 && c.shared_ffn_dim == 96 &&
              all_moe(&c, "SSSS"),
          "qwen2moe defaults from gguf: %s", zs_errmsg());
    CHECK_ERR(gg_config("qwen2moe", NULL, NULL, &c), "qwen2moe.expert_count", "missing");
    const gg_kv q2k[] = {{"expert_count", 16}, {NULL, 0}};
    CHECK_ERR(gg_config("qwen2moe", q2k, NULL, &c), "qwen2moe.expert_used_count");
    /* qwen3moe: renormalised, per-head q/k norms */
    const gg_kv q3[] = {{"expert_count", 32}, {"expert_used_count", 8}, {"expert_feed_forward_length", 16}, {NULL, 0}};
    CHECK(gg_config("qwen3moe", q3, "SSSS", &c) == 0, "qwen3moe: %s", zs_errmsg());
    CHECK(c.family == ZS_FAM_QWEN3MOE && c.n_experts == 32 && c.n_experts_used == 8 && c.moe_ffn_dim == 16 &&
              c.norm_topk_prob && c.qk_norm && !c.qk_norm_full && !c.shared_ffn_dim && all_moe(&c, "SSSS"),
          "qwen3moe from gguf");
    const gg_kv q3sh[] = {{"expert_count", 32}, {"expert_used_count", 8}, {"expert_shared_feed_forward_length", 16},
                          {NULL, 0}};
    CHECK_ERR(gg_config("qwen3moe", q3sh, NULL, &c), "expert_shared_feed_forward_length");
    /* olmoe: the experts feed_forward_length wide, q/k norms over the projections, clamp_kqv */
    const gg_kv ol[] = {{"expert_count", 64}, {"expert_used_count", 8}, {"attention.clamp_kqv", 8}, {NULL, 0}};
    CHECK(gg_config("olmoe", ol, "SSSS", &c) == 0, "olmoe: %s", zs_errmsg());
    CHECK(c.family == ZS_FAM_OLMOE && c.n_experts == 64 && c.n_experts_used == 8 && c.moe_ffn_dim == 96 &&
              !c.norm_topk_prob && c.qk_norm_full && !c.qk_norm && c.clip_qkv == 8.0f && c.router_aux_loss_coef == 0.01f &&
              all_moe(&c, "SSSS"),
          "olmoe from gguf");
    /* only Qwen has dense layers: an olmoe file's layers all route */
    CHECK(gg_config("olmoe", ol, "DSSS", &c) == 0 && all_moe(&c, "SSSS"), "olmoe layers: %s", zs_errmsg());
    /* a GGUF config reads as a config.json one would: written, it reads back equal */
    CHECK(gg_config("qwen2moe", q2, "DSSS", &c) == 0, "qwen2moe again: %s", zs_errmsg());
    c.bos_id = c.eos_id = -1;
    roundtrip("qwen2moe from gguf", &c);
    CHECK(gg_config("llama", mx, "SSSS", &c) == 0, "mixtral again: %s", zs_errmsg());
    roundtrip("mixtral from gguf", &c);
}

static int cmd(zs_init_opts *io, const char *line) {
    char buf[8400], *argv[64];
    int argc = 0, help;
    const char *out;
    snprintf(buf, sizeof buf, "%s", line);
    for (char *t = strtok(buf, " "); t && argc < 63; t = strtok(NULL, " ")) argv[argc++] = t;
    return zs_init_cmd_parse(argc, argv, io, &out, &help);
}

static void test_init_cmd(void) {
    zs_init_opts io;
    CHECK(cmd(&io, "--arch qwen2moe --layers 6 --experts 8 --experts-used 2 --moe-ffn 32 --shared-ffn 48 "
                   "--sparse-step 2 --mlp-only-layers 3 --out x") == 0, "qwen2moe flags: %s", zs_errmsg());
    CHECK(io.cfg.n_experts == 8 && io.cfg.n_experts_used == 2 && io.cfg.moe_ffn_dim == 32 && io.cfg.shared_ffn_dim == 48 &&
              all_moe(&io.cfg, "DSDDDS"),
          "qwen2moe flag values");
    CHECK(cmd(&io, "--arch qwen2moe --dim 128 --heads 4 --out x") == 0 && io.cfg.head_dim == 32,
          "qwen2moe head_dim follows dim: %s", zs_errmsg());
    CHECK(cmd(&io, "--arch qwen3moe --layers 7 --out x") == 0 && all_moe(&io.cfg, "SSSSSSS"), "qwen3moe layers: %s",
          zs_errmsg());
    CHECK(cmd(&io, "--arch qwen3moe --experts 0 --out x") == 0 && io.cfg.n_experts == 0 && all_moe(&io.cfg, "DDDD"),
          "qwen3moe dense: %s", zs_errmsg());
    CHECK(cmd(&io, "--arch mixtral --moe-ffn 100 --experts 4 --experts-used 1 --out x") == 0 && io.cfg.ffn_dim == 100 &&
              io.cfg.moe_ffn_dim == 100 && io.cfg.n_experts == 4 && io.cfg.n_experts_used == 1,
          "mixtral flags: %s", zs_errmsg());
    CHECK(cmd(&io, "--arch olmoe --ffn 64 --out x") == 0 && io.cfg.moe_ffn_dim == 64, "olmoe --ffn: %s", zs_errmsg());
    CHECK_ERR(cmd(&io, "--arch llama --experts 4 --out x"), "--experts", "llama");
    CHECK_ERR(cmd(&io, "--arch qwen3 --moe-ffn 4 --out x"), "--moe-ffn", "qwen3");
    CHECK_ERR(cmd(&io, "--arch mixtral --shared-ffn 4 --out x"), "--shared-ffn");
    CHECK_ERR(cmd(&io, "--arch olmoe --sparse-step 2 --out x"), "--sparse-step");
    CHECK_ERR(cmd(&io, "--arch mixtral --experts 0 --out x"), "--experts");
    CHECK_ERR(cmd(&io, "--arch qwen3moe --mlp-only-layers 1,x --out x"), "--mlp-only-layers");
    CHECK_ERR(cmd(&io, "--arch qwen3moe --experts 8 --experts-used 9 --out x"), "num_experts_per_tok");
    CHECK_ERR(cmd(&io, "--arch mixtral --experts 600 --out x"), "num_local_experts", "512");
    CHECK_ERR(cmd(&io, "--arch olmoe --head-dim 32 --out x"), "--head-dim");
    CHECK_ERR(cmd(&io, "--arch qwen2moe --head-dim 32 --out x"), "head_dim", "hidden_size");
}

/* init-model's files: transformers' tensor names and shapes */
static void test_init_write(void) {
    static const struct {
        const char *line, *present[6];
        const char *absent;
        int n_tensors;
    } T[] = {
        {"--arch mixtral --layers 2 --dim 64 --heads 4 --kv-heads 2 --experts 4 --ffn 32 --vocab 300",
         {"model.layers.1.block_sparse_moe.gate.weight", "model.layers.1.block_sparse_moe.experts.3.w1.weight",
          "model.layers.0.block_sparse_moe.experts.0.w2.weight", "model.layers.0.block_sparse_moe.experts.2.w3.weight"},
         "model.layers.0.mlp.gate_proj.weight", 3 + 2 * (6 + 1 + 4 * 3)},
        {"--arch qwen2moe --layers 2 --dim 64 --heads 4 --experts 4 --moe-ffn 16 --shared-ffn 24 --ffn 40 "
         "--mlp-only-layers 0 --vocab 300",
         {"model.layers.1.mlp.gate.weight", "model.layers.1.mlp.experts.3.down_proj.weight",
          "model.layers.1.mlp.shared_expert.up_proj.weight", "model.layers.1.mlp.shared_expert_gate.weight",
          "model.layers.0.mlp.down_proj.weight", "model.layers.0.self_attn.q_proj.bias"},
         "model.layers.0.mlp.gate.weight", 3 + (9 + 3) + (9 + 1 + 12 + 4)},
        {"--arch qwen3moe --layers 2 --dim 64 --heads 4 --kv-heads 2 --head-dim 32 --experts 4 --moe-ffn 16 --vocab 300",
         {"model.layers.0.mlp.gate.weight", "model.layers.1.mlp.experts.0.gate_proj.weight",
          "model.layers.1.mlp.experts.3.up_proj.weight", "model.layers.0.self_attn.q_norm.weight"},
         "model.layers.0.mlp.shared_expert_gate.weight", 3 + 2 * (8 + 1 + 12)},
        {"--arch olmoe --layers 2 --dim 64 --heads 4 --kv-heads 2 --experts 4 --ffn 16 --vocab 300",
         {"model.layers.0.mlp.gate.weight", "model.layers.1.mlp.experts.2.down_proj.weight",
          "model.layers.0.self_attn.q_norm.weight", "model.layers.1.self_attn.k_norm.weight"},
         "model.layers.0.mlp.down_proj.weight", 3 + 2 * (8 + 1 + 12)},
    };
    for (size_t i = 0; i < sizeof T / sizeof T[0]; i++) {
        zs_init_opts io;
        char line[8400], dir[4200];
        snprintf(dir, sizeof dir, "%s/m%zu", tmp, i);
        snprintf(line, sizeof line, "%s --out %s", T[i].line, dir);
        int rc = cmd(&io, line);
        CHECK(rc == 0, "%s: %s", T[i].line, zs_errmsg());
        if (rc) continue;
        rc = zs_init_model_write(&io, dir);
        CHECK(rc == 0, "write %s: %s", T[i].line, zs_errmsg());
        zs_st_set *s = NULL;
        zs_model_config c;
        if (rc || zs_st_open_dir(dir, &s) != 0 || zs_config_load(dir, &c) != 0) {
            CHECK(0, "open %s: %s", dir, zs_errmsg());
            continue;
        }
        CHECK((int)zs_st_count(s) == T[i].n_tensors, "%s: %zu tensors, want %d", T[i].line, zs_st_count(s),
              T[i].n_tensors);
        for (int k = 0; k < 6 && T[i].present[k]; k++) CHECK(zs_st_find(s, T[i].present[k]), "%s: no %s", T[i].line,
                                                              T[i].present[k]);
        CHECK(!zs_st_find(s, T[i].absent), "%s: has %s", T[i].line, T[i].absent);
        /* shapes: [out, in] */
        int64_t d = c.dim, F = c.moe_ffn_dim, E = c.n_experts;
        const zs_st_tensor *t;
        int last = c.n_layers - 1;
        char nm[160];
        snprintf(nm, sizeof nm, c.family == ZS_FAM_MIXTRAL ? "model.layers.%d.block_sparse_moe.gate.weight"
                                                           : "model.layers.%d.mlp.gate.weight", last);
        t = zs_st_find(s, nm);
        CHECK(t && t->shape[0] == E && t->shape[1] == d, "%s: router shape", nm);
        snprintf(nm, sizeof nm, c.family == ZS_FAM_MIXTRAL ? "model.layers.%d.block_sparse_moe.experts.1.w2.weight"
                                                           : "model.layers.%d.mlp.experts.1.down_proj.weight", last);
        t = zs_st_find(s, nm);
        CHECK(t && t->shape[0] == d && t->shape[1] == F, "%s: expert down shape", nm);
        if (c.family == ZS_FAM_QWEN2MOE) {
            t = zs_st_find(s, "model.layers.1.mlp.shared_expert.gate_proj.weight");
            CHECK(t && t->shape[0] == 24 && t->shape[1] == d, "shared expert shape");
            t = zs_st_find(s, "model.layers.1.mlp.shared_expert_gate.weight");
            CHECK(t && t->shape[0] == 1 && t->shape[1] == d, "shared expert gate shape");
            t = zs_st_find(s, "model.layers.0.mlp.up_proj.weight");
            CHECK(t && t->shape[0] == 40 && t->shape[1] == d, "dense layer shape");
        }
        if (c.family == ZS_FAM_OLMOE) {
            t = zs_st_find(s, "model.layers.0.self_attn.q_norm.weight");
            CHECK(t && t->ndim == 1 && t->shape[0] == 64, "olmoe q_norm over the whole q");
            t = zs_st_find(s, "model.layers.0.self_attn.k_norm.weight");
            CHECK(t && t->ndim == 1 && t->shape[0] == 32, "olmoe k_norm over the whole k");
        }
        if (c.family == ZS_FAM_QWEN3MOE) {
            t = zs_st_find(s, "model.layers.0.self_attn.k_norm.weight");
            CHECK(t && t->ndim == 1 && t->shape[0] == 32, "qwen3moe k_norm per head");
        }
        zs_st_close(s);
    }
}

int main(void) {
    if (tu_tmpdir(tmp, sizeof tmp, "config") != 0) {
        fprintf(stderr, "cannot create a scratch directory\n");
        return 1;
    }
    test_mixtral();
    test_qwen2moe();
    test_qwen3moe();
    test_olmoe();
    test_write();
    test_init_cmd();
    test_init_write();
    test_gguf();
    tu_rmdir(tmp);
    return tu_finish("test-config");
}
