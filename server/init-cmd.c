/* init-cmd.c — `zeroserve init-model`'s flags: from the command line to the zs_init_opts of a random
 * model (init-model.h), with the config.json keys given as JSON put through the config parser.
 * Shared by the CLI (main.c) and the tests that regenerate a model from the same flags. */
#include "init-cmd.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "common.h"

int zs_init_cmd_parse(int argc, char **argv, zs_init_opts *iop, const char **outp, int *help) {
    const char *arch = "llama", *out = NULL, *dtype = "f32";
    zs_init_opts io;
    *help = 0;
    /* first pass: find --arch so the defaults fit it */
    for (int i = 0; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--arch")) arch = argv[i + 1];
        else if (!strncmp(argv[i], "--arch=", 7)) arch = argv[i] + 7;
    ZS_CHECK(zs_init_opts_default(arch, &io));
    zs_model_config *c = &io.cfg;
    int head_dim = 0, untied = 0, tied = 0, qkv_bias = 0, window = -1;
    const char *set = NULL, *rope_scaling = NULL, *mlp_only = NULL;
    float theta = 0;
    const int unset = INT_MIN; /* the MoE flags not given */
    int experts = unset, experts_used = unset, moe_ffn = unset, shared_ffn = unset, sparse_step = unset;
    zs_opt opts[] = {
        {"arch", ZS_OPT_STR, &arch, "llama | mistral | qwen2 | qwen3 | gemma2 | gemma3 | phi3 | gpt2 | mixtral | qwen2moe | "
                                   "qwen3moe | olmoe (default llama)"},
        {"layers", ZS_OPT_INT, &c->n_layers, "transformer blocks"},
        {"dim", ZS_OPT_INT, &c->dim, "hidden size"},
        {"heads", ZS_OPT_INT, &c->n_heads, "attention heads"},
        {"kv-heads", ZS_OPT_INT, &c->n_kv_heads, "key/value heads (llama; default = heads)"},
        {"head-dim", ZS_OPT_INT, &head_dim, "per-head size (default: dim / heads for llama and gpt2, the family's own otherwise)"},
        {"ffn", ZS_OPT_INT, &c->ffn_dim, "MLP hidden size"},
        {"vocab", ZS_OPT_INT, &c->vocab_size, "vocabulary size (>= 257)"},
        {"context", ZS_OPT_INT, &c->max_seq, "max positions"},
        {"dtype", ZS_OPT_STR, &dtype, "f32 | f16 | bf16 (default f32)"},
        {"seed", ZS_OPT_U64, &io.seed, "random seed (default 1234)"},
        {"tied", ZS_OPT_FLAG, &tied, "tie the LM head to the embeddings"},
        {"untied", ZS_OPT_FLAG, &untied, "separate LM head"},
        {"qkv-bias", ZS_OPT_FLAG, &qkv_bias, "llama: attention_bias (q, k, v and o biases; Qwen2 has q/k/v ones always)"},
        {"rope-theta", ZS_OPT_FLOAT, &theta, "RoPE base (default: the family's)"},
        {"rope-scaling", ZS_OPT_STR, &rope_scaling, "rope_scaling as JSON, e.g. '{\"rope_type\":\"linear\",\"factor\":4}'"},
        {"sliding-window", ZS_OPT_INT, &window, "sliding_window (mistral, phi3, gemma*, qwen*: 0 = none)"},
        {"experts", ZS_OPT_INT, &experts, "MoE: experts per layer (mixtral, qwen2moe, qwen3moe, olmoe; qwen*: 0 = dense)"},
        {"experts-used", ZS_OPT_INT, &experts_used, "MoE: experts per token (top-k)"},
        {"moe-ffn", ZS_OPT_INT, &moe_ffn, "MoE: each expert's hidden size (mixtral, olmoe: the same as --ffn)"},
        {"shared-ffn", ZS_OPT_INT, &shared_ffn, "qwen2moe: the shared expert's hidden size"},
        {"sparse-step", ZS_OPT_INT, &sparse_step, "qwen2moe, qwen3moe: decoder_sparse_step (layer l sparse iff (l+1) % N == 0)"},
        {"mlp-only-layers", ZS_OPT_STR, &mlp_only, "qwen2moe, qwen3moe: comma-separated layers with a dense MLP, e.g. 0,3"},
        {"set", ZS_OPT_STR, &set, "more config.json keys as a JSON object, put over the rest"},
        {"random-norms", ZS_OPT_FLAG, &io.random_norms, "random norm weights and biases (reference checks)"},
        {"init-std", ZS_OPT_FLOAT, &io.init_std, "standard deviation of the matrices' normal init (default 0.02)"},
        {"out", ZS_OPT_STR, &out, "output directory  [required]"},
    };
    int n_opts = sizeof opts / sizeof opts[0];
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            zs_cli_usage("init-model", "Writes a random-initialised model in Hugging Face layout.", opts, n_opts);
            *help = 1;
            return 0;
        }
    int kv_given = 0;
    for (int i = 0; i < argc; i++) if (!strncmp(argv[i], "--kv-heads", 10)) kv_given = 1;
    ZS_CHECK(zs_cli_parse(argc, argv, opts, n_opts));
    if (!out) return zs_err(ZS_EINVAL, "--out is required");
    if (zs_dtype_parse(dtype, &c->dtype) < 0 || zs_dtype_is_quant(c->dtype))
        return zs_err(ZS_EINVAL, "--dtype: '%s' is not one of f32, f16, bf16 (quantize at load: --weight-dtype q8_0, q4_0, q4_1, q5_0 or q5_1)", dtype);
    if (c->n_heads <= 0 || c->dim <= 0) return zs_err(ZS_EINVAL, "--heads and --dim must be positive");
    if (!kv_given && c->arch == ZS_ARCH_GPT2) c->n_kv_heads = c->n_heads;
    else if (!kv_given) c->n_kv_heads = ZS_MIN(c->n_kv_heads, c->n_heads);
    /* llama and gpt2: dim / heads unless given; the newer families keep their own head_dim */
    if (head_dim > 0 && c->family == ZS_FAM_OLMOE && head_dim * c->n_heads != c->dim)
        return zs_err(ZS_EINVAL, "--head-dim: olmoe's head size is always --dim / --heads (%d)", c->dim / c->n_heads);
    if (head_dim > 0) c->head_dim = head_dim;
    else if (c->family == ZS_FAM_LLAMA || c->family == ZS_FAM_GPT2 || c->family == ZS_FAM_MIXTRAL ||
             c->family == ZS_FAM_QWEN2MOE || c->family == ZS_FAM_OLMOE)
        c->head_dim = c->dim / c->n_heads;
    if (c->query_pre_attn_scalar > 0) c->query_pre_attn_scalar = (float)c->head_dim; /* Gemma: as the 2B/9B */
    if (tied) c->tied_embeddings = 1;
    if (untied) c->tied_embeddings = 0;
    if (qkv_bias) c->qkv_bias = 1;
    if (theta > 0) c->rope_theta = theta;
    if (!(io.init_std > 0) || !isfinite(io.init_std)) return zs_err(ZS_EINVAL, "--init-std must be a positive number");
    if (c->swa_pattern > 0) /* the family's pattern over the layers asked for */
        for (int l = 0; l < c->n_layers && l < ZS_MAX_LAYERS; l++) c->layer_sliding[l] = (l + 1) % c->swa_pattern != 0;
    /* mixtures of experts */
    int moe_fam = c->family == ZS_FAM_MIXTRAL || c->family == ZS_FAM_QWEN2MOE || c->family == ZS_FAM_QWEN3MOE ||
                  c->family == ZS_FAM_OLMOE;
    int qwen_moe = c->family == ZS_FAM_QWEN2MOE || c->family == ZS_FAM_QWEN3MOE;
    const char *moe_flag = experts != unset ? "--experts" : experts_used != unset ? "--experts-used" : moe_ffn != unset ? "--moe-ffn"
                           : shared_ffn != unset ? "--shared-ffn" : sparse_step != unset ? "--sparse-step"
                           : mlp_only ? "--mlp-only-layers" : NULL;
    if (moe_flag && !moe_fam)
        return zs_err(ZS_EINVAL, "%s: %s is not a mixture of experts (use --arch mixtral, qwen2moe, qwen3moe or olmoe)",
                      moe_flag, zs_family_name(c->family));
    if (shared_ffn != unset && c->family != ZS_FAM_QWEN2MOE)
        return zs_err(ZS_EINVAL, "--shared-ffn: only qwen2moe has a shared expert");
    if ((sparse_step != unset || mlp_only) && !qwen_moe)
        return zs_err(ZS_EINVAL, "%s: only qwen2moe and qwen3moe have dense layers (mixtral and olmoe route every "
                      "layer)", sparse_step != unset ? "--sparse-step" : "--mlp-only-layers");
    if (experts == 0 && !qwen_moe)
        return zs_err(ZS_EINVAL, "--experts: %s needs at least 1 expert", zs_family_name(c->family));
    if (experts != unset) c->n_experts = experts;
    if (experts_used != unset) c->n_experts_used = experts_used;
    if (moe_ffn != unset) c->moe_ffn_dim = moe_ffn;
    if (shared_ffn != unset) c->shared_ffn_dim = shared_ffn;
    if (c->family == ZS_FAM_MIXTRAL || c->family == ZS_FAM_OLMOE) { /* the experts are intermediate_size wide */
        if (moe_ffn != unset) c->ffn_dim = moe_ffn;
        c->moe_ffn_dim = c->ffn_dim;
    }
    if (moe_fam) /* every layer sparse; --sparse-step / --mlp-only-layers below say otherwise */
        for (int l = 0; l < c->n_layers && l < ZS_MAX_LAYERS; l++) c->layer_moe[l] = c->n_experts > 0;
    /* the keys given as JSON go through the config.json parser (its checks and messages) */
    json_t *ov = json_object();
    if (!ov) return zs_err(ZS_ENOMEM, "out of memory");
    json_error_t je;
    if (sparse_step != unset) json_object_set_new(ov, "decoder_sparse_step", json_integer(sparse_step));
    if (mlp_only) {
        json_t *arr = json_array();
        const char *q = mlp_only;
        while (*q) {
            char *end;
            long v = strtol(q, &end, 10);
            if (end == q || v < 0 || v > 1000000 || (*end && *end != ',')) {
                json_decref(arr);
                json_decref(ov);
                return zs_err(ZS_EINVAL, "--mlp-only-layers: '%s' is not a comma-separated list of layer indices", mlp_only);
            }
            json_array_append_new(arr, json_integer(v));
            q = *end ? end + 1 : end;
        }
        json_object_set_new(ov, "mlp_only_layers", arr);
    }
    if (set) {
        json_t *j = json_loads(set, 0, &je);
        if (!json_is_object(j)) {
            json_decref(j);
            json_decref(ov);
            return zs_err(ZS_EINVAL, "--set: not a JSON object (%s)", j ? "another JSON value" : je.text);
        }
        json_object_update(ov, j);
        json_decref(j);
    }
    if (rope_scaling) {
        json_t *j = json_loads(rope_scaling, 0, &je);
        if (!json_is_object(j)) {
            json_decref(j);
            json_decref(ov);
            return zs_err(ZS_EINVAL, "--rope-scaling: not a JSON object (%s)", j ? "another JSON value" : je.text);
        }
        json_object_set_new(ov, "rope_scaling", j);
    }
    if ((rope_scaling || theta > 0) && c->family == ZS_FAM_GPT2)
        return zs_err(ZS_EINVAL, "--rope-scaling / --rope-theta: gpt2 has learned positions, no RoPE");
    if (window > 0 && (c->family == ZS_FAM_LLAMA || c->family == ZS_FAM_GPT2))
        return zs_err(ZS_EINVAL, "--sliding-window: %s has no sliding window (transformers ignores the key); "
                      "use --arch mistral, qwen2, qwen3, gemma2, gemma3 or phi3", zs_family_name(c->family));
    if (window >= 0) {
        json_object_set_new(ov, "sliding_window", window ? json_integer(window) : json_null());
        if (window && (c->family == ZS_FAM_QWEN2 || c->family == ZS_FAM_QWEN3)) {
            json_object_set_new(ov, "use_sliding_window", json_true());
            json_object_set_new(ov, "max_window_layers", json_integer(0));
        }
    }
    char *ovt = json_dumps(ov, 0);
    json_decref(ov);
    if (!ovt) return zs_err(ZS_ENOMEM, "out of memory");
    int orc = zs_config_override(c, ovt, "init-model");
    free(ovt);
    ZS_CHECK(orc);
    *iop = io;
    *outp = out;
    return 0;
}
