/* plan-model.c — the planner's model descriptions (zs_plan_model) from what a user points at: a
 * Hugging Face directory or its config.json (through the config parser; architectures it does not
 * know, such as OPT, by their size fields alone), or a GGUF file (its metadata, and its bytes per
 * weight from the tensors themselves); and the byte sizes of the dtype names the planner takes. */
#include <errno.h>
#include <jansson.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "common.h"
#include "gguf.h"
#include "plan.h"

#define PLAN_Q4_K_M_BITS 4.85 /* llama.cpp's Q4_K_M: Q4_K with Q6_K/Q5_K where it keeps more bits; the
                                 size llama-quantize reports for Llama models is about 4.85 bits per weight */

int zs_plan_dtype_bytes(const char *flag, const char *name, int kv, double *bytes) {
    const char *choices = kv ? "f32, f16, bf16"
                             : "f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k, q4_k_m";
    if (!kv && !strcasecmp(name, "q4_k_m")) {
        *bytes = PLAN_Q4_K_M_BITS / 8.0;
        return 0;
    }
    zs_dtype t;
    if (zs_dtype_parse(name, &t) < 0 || (kv && t >= ZS_DTYPE_ELEM_COUNT))
        return zs_err(ZS_EINVAL, "%s: '%s' is not one of %s", flag, name, choices);
    *bytes = (double)zs_dtype_size(t) / zs_dtype_block(t);
    return 0;
}

int zs_plan_model_from_config(const zs_model_config *c, double bytes_per_weight, double bytes_per_kv,
                              zs_plan_model *out) {
    if (!c || !out) return zs_err(ZS_EINVAL, "zs_plan_model_from_config: NULL argument");
    zs_plan_model m;
    memset(&m, 0, sizeof m);
    snprintf(m.name, sizeof m.name, "%s", c->arch_name);
    m.layers = c->n_layers;
    m.hidden = c->dim;
    m.ffn = c->ffn_dim;
    m.heads = c->n_heads;
    m.kv_heads = c->n_kv_heads;
    m.head_dim = c->head_dim;
    m.vocab = c->vocab_size;
    m.max_pos = c->arch == ZS_ARCH_GPT2 ? c->max_seq : 0; /* learned positions */
    m.mlp_mats = c->arch == ZS_ARCH_GPT2 ? 2 : 3;
    m.tied = c->tied_embeddings;
    if (c->n_experts > 0) {
        m.experts = c->n_experts;
        m.active_experts = c->n_experts_used;
        m.expert_ffn = c->moe_ffn_dim;
        m.shared_ffn = c->shared_ffn_dim;
        for (int l = 0; l < c->n_layers; l++) m.moe_layers += zs_config_layer_moe(c, l);
        if (!m.moe_layers) m.experts = m.active_experts = m.expert_ffn = m.shared_ffn = 0;
    }
    m.bytes_per_weight = bytes_per_weight;
    m.bytes_per_kv = bytes_per_kv;
    *out = m;
    return 0;
}

/* A positive integer size field, or -1 when absent or null. */
static int size_field(json_t *root, const char *key, const char *origin, int *out) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) { *out = -1; return 0; }
    if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 100000000)
        return zs_err(ZS_EINVAL, "%s: '%s' must be a positive integer", origin, key);
    *out = (int)json_integer_value(v);
    return 0;
}

/* Architectures the config parser does not know (OPT and others) cannot run in zeroserve, but a
 * placement needs only their sizes: hidden_size, num_hidden_layers, ffn_dim (OPT: fc1 and fc2, so
 * 2 matrices) or intermediate_size (taken as a gated MLP of 3), num_attention_heads,
 * num_key_value_heads (default: the heads), vocab_size, max_position_embeddings (learned positions
 * when there is no rope_theta), tie_word_embeddings (transformers' default: tied), torch_dtype. */
static int sizes_only(const char *text, const char *origin, zs_plan_model *out) {
    json_error_t je;
    json_t *root = json_loads(text, 0, &je);
    if (!root) return zs_err(ZS_EFORMAT, "%s: not valid JSON (line %d: %s)", origin, je.line, je.text);
    zs_plan_model m;
    memset(&m, 0, sizeof m);
    int ffn_dim, inter, rc = 0;
    if ((rc = size_field(root, "hidden_size", origin, &m.hidden)) < 0 ||
        (rc = size_field(root, "num_hidden_layers", origin, &m.layers)) < 0 ||
        (rc = size_field(root, "num_attention_heads", origin, &m.heads)) < 0 ||
        (rc = size_field(root, "num_key_value_heads", origin, &m.kv_heads)) < 0 ||
        (rc = size_field(root, "vocab_size", origin, &m.vocab)) < 0 ||
        (rc = size_field(root, "max_position_embeddings", origin, &m.max_pos)) < 0 ||
        (rc = size_field(root, "ffn_dim", origin, &ffn_dim)) < 0 ||
        (rc = size_field(root, "intermediate_size", origin, &inter)) < 0)
        goto done;
    const char *missing = m.hidden < 0 ? "hidden_size" : m.layers < 0 ? "num_hidden_layers" :
                          m.heads < 0 ? "num_attention_heads" : m.vocab < 0 ? "vocab_size" :
                          ffn_dim < 0 && inter < 0 ? "ffn_dim or intermediate_size" : NULL;
    if (missing) { rc = zs_err(ZS_ENOTFOUND, "%s: required key '%s' is missing", origin, missing); goto done; }
    if (m.hidden % m.heads) {
        rc = zs_err(ZS_EINVAL, "%s: 'num_attention_heads' (%d) does not divide 'hidden_size' (%d)", origin, m.heads,
                    m.hidden);
        goto done;
    }
    m.head_dim = m.hidden / m.heads;
    if (m.kv_heads < 0) m.kv_heads = m.heads;
    m.ffn = ffn_dim > 0 ? ffn_dim : inter;
    m.mlp_mats = ffn_dim > 0 ? 2 : 3;
    json_t *rt = json_object_get(root, "rope_theta");
    if (m.max_pos < 0 || (rt && !json_is_null(rt))) m.max_pos = 0;
    json_t *tw = json_object_get(root, "tie_word_embeddings");
    m.tied = tw && json_is_boolean(tw) ? json_is_true(tw) : 1;
    json_t *dt = json_object_get(root, "torch_dtype");
    const char *ds = json_is_string(dt) ? json_string_value(dt) : "float32";
    m.bytes_per_weight = !strcmp(ds, "float16") || !strcmp(ds, "bfloat16") ? 2 : 4;
    m.bytes_per_kv = 2;
    json_t *ar = json_object_get(root, "architectures");
    json_t *mt = json_object_get(root, "model_type");
    const char *nm = json_is_array(ar) && json_is_string(json_array_get(ar, 0)) ? json_string_value(json_array_get(ar, 0))
                     : json_is_string(mt) ? json_string_value(mt) : "unknown";
    snprintf(m.name, sizeof m.name, "%s", nm);
    *out = m;
done:
    json_decref(root);
    return rc;
}

static int read_text(const char *path, char **out) {
    FILE *f = fopen(path, "rb");
    if (!f) return zs_err(errno == ENOENT ? ZS_ENOTFOUND : ZS_EIO, "%s: cannot open: %s", path, strerror(errno));
    char *b = NULL;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0) n = ftell(f);
    int rc = 0;
    if (n < 0 || n > (1L << 24) || fseek(f, 0, SEEK_SET) != 0) rc = zs_err(ZS_EIO, "%s: not a readable config file", path);
    else if (!(b = malloc((size_t)n + 1))) rc = zs_err(ZS_ENOMEM, "out of memory");
    else if (fread(b, 1, (size_t)n, f) != (size_t)n) rc = zs_err(ZS_EIO, "%s: read failed", path);
    fclose(f);
    if (rc < 0) { free(b); return rc; }
    b[n] = 0;
    *out = b;
    return 0;
}

static int from_json(const char *path, zs_plan_model *out) {
    char *text = NULL;
    ZS_CHECK(read_text(path, &text));
    zs_model_config *c = malloc(sizeof *c); /* large (RoPE factor tables) */
    if (!c) { free(text); return zs_err(ZS_ENOMEM, "out of memory"); }
    int rc = zs_config_parse(text, path, c);
    if (rc == 0) {
        rc = zs_plan_model_from_config(c, (double)zs_dtype_size(c->dtype), 2, out);
    } else if (rc == ZS_EUNSUPPORTED) {
        zs_log_debug("%s: %s; reading its sizes alone", path, zs_errmsg());
        rc = sizes_only(text, path, out);
    }
    free(c);
    free(text);
    return rc;
}

static int from_gguf(const char *path, zs_plan_model *out) {
    zs_gguf *g;
    ZS_CHECK(zs_gguf_open(path, &g));
    zs_model_config *c = malloc(sizeof *c);
    int rc = c ? zs_config_from_gguf(g, c) : zs_err(ZS_ENOMEM, "out of memory");
    double bytes = 0, elems = 0;
    for (size_t i = 0; rc == 0 && i < zs_gguf_tensor_count(g); i++) {
        const zs_gguf_tensor *t = zs_gguf_tensor_at(g, i);
        double n = 1;
        for (int d = 0; d < t->n_dims; d++) n *= (double)t->ne[d];
        bytes += (double)t->nbytes;
        elems += n;
    }
    if (rc == 0 && elems <= 0) rc = zs_err(ZS_EFORMAT, "%s: no tensors", path);
    if (rc == 0) rc = zs_plan_model_from_config(c, bytes / elems, 2, out);
    free(c);
    zs_gguf_close(g);
    return rc;
}

int zs_plan_model_load(const char *path, zs_plan_model *out) {
    if (!path || !out) return zs_err(ZS_EINVAL, "zs_plan_model_load: NULL argument");
    struct stat st;
    if (stat(path, &st) != 0)
        return zs_err(errno == ENOENT ? ZS_ENOTFOUND : ZS_EIO, "%s: %s", path, strerror(errno));
    size_t n = strlen(path);
    if (S_ISDIR(st.st_mode)) {
        char p[4096];
        if (snprintf(p, sizeof p, "%s/config.json", path) >= (int)sizeof p) return zs_err(ZS_EINVAL, "%s: path too long", path);
        return from_json(p, out);
    }
    if (n >= 5 && !strcasecmp(path + n - 5, ".gguf")) return from_gguf(path, out);
    if (n >= 5 && !strcasecmp(path + n - 5, ".json")) return from_json(path, out);
    return zs_err(ZS_EINVAL, "%s: not a model directory, a .gguf file or a config.json", path);
}
