/* config.c — Hugging Face config.json <-> zs_model_config: strict parsing (types, ranges,
 * supported architectures and options, with messages that name the file and the key) and an
 * atomic writer whose output reads back equal. See config.h. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "gguf.h"

#define CFG_MAX_FILE ((off_t)64 * 1024 * 1024)

typedef struct {
    const char *cls;        /* architectures[0] */
    const char *model_type; /* model_type written back */
    zs_arch arch;
    int max_seq_default;
} cfg_arch;

static const cfg_arch cfg_archs[] = {
    {"LlamaForCausalLM", "llama", ZS_ARCH_LLAMA, 2048},
    {"MistralForCausalLM", "mistral", ZS_ARCH_LLAMA, 131072},
    {"Qwen2ForCausalLM", "qwen2", ZS_ARCH_LLAMA, 32768},
    {"GPT2LMHeadModel", "gpt2", ZS_ARCH_GPT2, 1024},
};
#define CFG_NARCH (sizeof cfg_archs / sizeof cfg_archs[0])
#define CFG_SUPPORTED "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, GPT2LMHeadModel"

static const char *cfg_type(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a float";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "?";
}

/* Integer key >= min. Absent or null: def, unless required (absent -> ZS_ENOTFOUND). */
static int cfg_int(const char *origin, json_t *root, const char *key, int required, int def,
                   int min, int *out) {
    json_t *v = json_object_get(root, key);
    if (!v || (json_is_null(v) && !required)) {
        if (required) return zs_err(ZS_ENOTFOUND, "%s: required key '%s' is missing", origin, key);
        *out = def;
        return 0;
    }
    if (!json_is_integer(v))
        return zs_err(ZS_EINVAL, "%s: '%s' must be an integer, got %s", origin, key, cfg_type(v));
    json_int_t x = json_integer_value(v);
    if (x < min || x > INT_MAX)
        return zs_err(ZS_EINVAL, "%s: '%s' is %lld; it must be %s integer from %d to %d", origin,
                      key, (long long)x, min > 0 ? "a positive" : "an", min, INT_MAX);
    *out = (int)x;
    return 0;
}

/* Positive finite number (integer or float). Absent or null: def. */
static int cfg_float(const char *origin, json_t *root, const char *key, float def, float *out) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_number(v))
        return zs_err(ZS_EINVAL, "%s: '%s' must be a number, got %s", origin, key, cfg_type(v));
    double d = json_number_value(v);
    float f = (float)d;
    if (!(d > 0) || !isfinite(f) || f == 0)
        return zs_err(ZS_EINVAL, "%s: '%s' is %g, must be a positive float", origin, key, d);
    *out = f;
    return 0;
}

static int cfg_bool(const char *origin, json_t *root, const char *key, int def, int *out) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_boolean(v))
        return zs_err(ZS_EINVAL, "%s: '%s' must be true or false, got %s", origin, key,
                      cfg_type(v));
    *out = json_is_true(v);
    return 0;
}

/* Token id: null/absent -> -1; integer >= 0; a list -> its first element (empty -> -1). */
static int cfg_token(const char *origin, json_t *root, const char *key, int *out) {
    json_t *v = json_object_get(root, key);
    if (json_is_array(v)) v = json_array_size(v) ? json_array_get(v, 0) : NULL;
    if (!v || json_is_null(v)) {
        *out = -1;
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT_MAX)
        return zs_err(ZS_EINVAL, "%s: '%s' must be a non-negative integer, a list of them or null",
                      origin, key);
    *out = (int)json_integer_value(v);
    return 0;
}

/* Optional string key: NULL when absent or null. */
static int cfg_str(const char *origin, json_t *root, const char *key, const char **out) {
    json_t *v = json_object_get(root, key);
    *out = NULL;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v))
        return zs_err(ZS_EINVAL, "%s: '%s' must be a string, got %s", origin, key, cfg_type(v));
    *out = json_string_value(v);
    return 0;
}

static int cfg_parse_root(json_t *root, const char *origin, zs_model_config *out) {
    zs_model_config c;
    memset(&c, 0, sizeof c);
    const char *model_type, *s;
    ZS_CHECK(cfg_str(origin, root, "model_type", &model_type));

    /* architecture: architectures[0], else model_type */
    const cfg_arch *a = NULL;
    json_t *av = json_object_get(root, "architectures");
    if (av && !json_is_null(av)) {
        if (!json_is_array(av) || !json_array_size(av) || !json_is_string(json_array_get(av, 0)))
            return zs_err(ZS_EINVAL, "%s: 'architectures' must be a non-empty list of strings",
                          origin);
        const char *name = json_string_value(json_array_get(av, 0));
        for (size_t i = 0; i < CFG_NARCH; i++)
            if (!strcmp(name, cfg_archs[i].cls)) a = &cfg_archs[i];
        if (!a)
            return zs_err(ZS_EUNSUPPORTED,
                          "%s: unsupported architecture '%s' (supported: " CFG_SUPPORTED ")",
                          origin, name);
    } else if (model_type) {
        for (size_t i = 0; i < CFG_NARCH; i++)
            if (!strcmp(model_type, cfg_archs[i].model_type)) a = &cfg_archs[i];
        if (!a)
            return zs_err(ZS_EUNSUPPORTED,
                          "%s: no 'architectures' and unsupported model_type '%s' (supported: "
                          CFG_SUPPORTED ")", origin, model_type);
    } else {
        return zs_err(ZS_ENOTFOUND, "%s: required key 'architectures' is missing", origin);
    }
    c.arch = a->arch;
    snprintf(c.arch_name, sizeof c.arch_name, "%s", a->cls);

    /* dtype: torch_dtype, or "dtype" (newer transformers) */
    const char *dkey = json_object_get(root, "torch_dtype") ? "torch_dtype" : "dtype";
    ZS_CHECK(cfg_str(origin, root, dkey, &s));
    c.dtype = ZS_F32;
    if (s) {
        if (!strcmp(s, "float32")) c.dtype = ZS_F32;
        else if (!strcmp(s, "float16")) c.dtype = ZS_F16;
        else if (!strcmp(s, "bfloat16")) c.dtype = ZS_BF16;
        else
            return zs_err(ZS_EUNSUPPORTED,
                          "%s: '%s' is '%s' (supported: float32, float16, bfloat16)", origin, dkey,
                          s);
    }
    ZS_CHECK(cfg_token(origin, root, "bos_token_id", &c.bos_id));
    ZS_CHECK(cfg_token(origin, root, "eos_token_id", &c.eos_id));
    ZS_CHECK(cfg_int(origin, root, "vocab_size", 1, 0, 1, &c.vocab_size));

    if (a->arch == ZS_ARCH_GPT2) {
        ZS_CHECK(cfg_int(origin, root, "n_embd", 1, 0, 1, &c.dim));
        ZS_CHECK(cfg_int(origin, root, "n_layer", 1, 0, 1, &c.n_layers));
        ZS_CHECK(cfg_int(origin, root, "n_head", 1, 0, 1, &c.n_heads));
        if (c.dim > INT_MAX / 4) return zs_err(ZS_EINVAL, "%s: 'n_embd' is too large", origin);
        ZS_CHECK(cfg_int(origin, root, "n_inner", 0, 4 * c.dim, 1, &c.ffn_dim));
        ZS_CHECK(cfg_int(origin, root, "n_positions", 0, a->max_seq_default, 1, &c.max_seq));
        ZS_CHECK(cfg_float(origin, root, "layer_norm_epsilon", 1e-5f, &c.norm_eps));
        ZS_CHECK(cfg_bool(origin, root, "tie_word_embeddings", 1, &c.tied_embeddings));
        ZS_CHECK(cfg_str(origin, root, "activation_function", &s));
        if (s && strcmp(s, "gelu_new") && strcmp(s, "gelu_pytorch_tanh"))
            return zs_err(ZS_EUNSUPPORTED,
                          "%s: 'activation_function' is '%s' (supported: gelu_new, "
                          "gelu_pytorch_tanh)", origin, s);
        int flag;
        ZS_CHECK(cfg_bool(origin, root, "scale_attn_weights", 1, &flag));
        if (!flag)
            return zs_err(ZS_EUNSUPPORTED, "%s: 'scale_attn_weights' false is not supported",
                          origin);
        ZS_CHECK(cfg_bool(origin, root, "scale_attn_by_inverse_layer_idx", 0, &flag));
        if (flag)
            return zs_err(ZS_EUNSUPPORTED,
                          "%s: 'scale_attn_by_inverse_layer_idx' true is not supported", origin);
        if (c.dim % c.n_heads)
            return zs_err(ZS_EINVAL, "%s: 'n_head' (%d) does not divide 'n_embd' (%d)", origin,
                          c.n_heads, c.dim);
        c.n_kv_heads = c.n_heads;
        c.head_dim = c.dim / c.n_heads;
        c.rope_theta = 0;
        c.qkv_bias = c.o_bias = c.mlp_bias = 1;
        c.act = 1;
    } else {
        int qwen2 = !strcmp(a->cls, "Qwen2ForCausalLM") || (model_type && !strcmp(model_type, "qwen2"));
        int mistral = !strcmp(a->cls, "MistralForCausalLM");
        ZS_CHECK(cfg_int(origin, root, "hidden_size", 1, 0, 1, &c.dim));
        ZS_CHECK(cfg_int(origin, root, "num_hidden_layers", 1, 0, 1, &c.n_layers));
        ZS_CHECK(cfg_int(origin, root, "num_attention_heads", 1, 0, 1, &c.n_heads));
        ZS_CHECK(cfg_int(origin, root, "num_key_value_heads", 0, c.n_heads, 1, &c.n_kv_heads));
        ZS_CHECK(cfg_int(origin, root, "intermediate_size", 1, 0, 1, &c.ffn_dim));
        ZS_CHECK(cfg_int(origin, root, "max_position_embeddings", 0, a->max_seq_default, 1,
                         &c.max_seq));
        ZS_CHECK(cfg_float(origin, root, "rms_norm_eps", 1e-6f, &c.norm_eps));
        ZS_CHECK(cfg_bool(origin, root, "tie_word_embeddings", 0, &c.tied_embeddings));
        json_t *hd = json_object_get(root, "head_dim");
        if (hd && !json_is_null(hd)) {
            ZS_CHECK(cfg_int(origin, root, "head_dim", 1, 0, 1, &c.head_dim));
        } else {
            if (c.dim % c.n_heads)
                return zs_err(ZS_EINVAL,
                              "%s: 'num_attention_heads' (%d) does not divide 'hidden_size' (%d)",
                              origin, c.n_heads, c.dim);
            c.head_dim = c.dim / c.n_heads;
        }
        if (c.head_dim % 2)
            return zs_err(ZS_EINVAL, "%s: 'head_dim' (%d) must be even for RoPE", origin,
                          c.head_dim);
        if (c.n_heads % c.n_kv_heads)
            return zs_err(ZS_EINVAL,
                          "%s: 'num_attention_heads' (%d) is not a multiple of "
                          "'num_key_value_heads' (%d)", origin, c.n_heads, c.n_kv_heads);
        ZS_CHECK(cfg_str(origin, root, "hidden_act", &s));
        if (s && strcmp(s, "silu") && strcmp(s, "swish"))
            return zs_err(ZS_EUNSUPPORTED, "%s: 'hidden_act' is '%s' (supported: silu)", origin,
                          s);
        json_t *rs = json_object_get(root, "rope_scaling");
        if (rs && !json_is_null(rs))
            return zs_err(ZS_EUNSUPPORTED, "%s: 'rope_scaling' is set; RoPE scaling is not "
                          "supported (only null)", origin);
        /* newer transformers: rope_parameters {"rope_type": "default", "rope_theta": ...} */
        float theta_def = 10000.0f;
        json_t *rp = json_object_get(root, "rope_parameters");
        if (rp && !json_is_null(rp)) {
            if (!json_is_object(rp))
                return zs_err(ZS_EINVAL, "%s: 'rope_parameters' must be an object", origin);
            const char *rt;
            ZS_CHECK(cfg_str(origin, rp, "rope_type", &rt));
            if (rt && strcmp(rt, "default"))
                return zs_err(ZS_EUNSUPPORTED, "%s: 'rope_parameters.rope_type' is '%s' "
                              "(supported: default)", origin, rt);
            ZS_CHECK(cfg_float(origin, rp, "rope_theta", theta_def, &theta_def));
        }
        ZS_CHECK(cfg_float(origin, root, "rope_theta", theta_def, &c.rope_theta));
        if (qwen2) {
            c.qkv_bias = 1; /* Qwen2: q, k, v have biases, o_proj and the MLP do not */
        } else if (!mistral) { /* Mistral has no biases whatever the config says */
            int ab;
            ZS_CHECK(cfg_bool(origin, root, "attention_bias", 0, &ab));
            c.qkv_bias = c.o_bias = ab;
            ZS_CHECK(cfg_bool(origin, root, "mlp_bias", 0, &c.mlp_bias));
        }
        c.act = 0;
        /* sliding_window (Mistral, Qwen2): accepted, not acted upon yet (full attention); said so
         * when it would matter, i.e. when the window is shorter than the context */
        json_t *sw = json_object_get(root, "sliding_window"), *usw = json_object_get(root, "use_sliding_window");
        if (json_is_integer(sw) && json_integer_value(sw) > 0 && json_integer_value(sw) < c.max_seq &&
            !json_is_false(usw))
            zs_log_warn("%s: sliding_window %lld is ignored: attention is over the whole context (%d); "
                        "results past %lld positions differ from the model's", origin,
                        (long long)json_integer_value(sw), c.max_seq, (long long)json_integer_value(sw));
    }
    *out = c;
    return 0;
}

int zs_config_parse(const char *json_text, const char *origin, zs_model_config *out) {
    if (!origin) origin = "config.json";
    if (!json_text || !out) return zs_err(ZS_EINVAL, "%s: zs_config_parse: NULL argument", origin);
    json_error_t je;
    json_t *root = json_loads(json_text, 0, &je);
    if (!root)
        return zs_err(ZS_EFORMAT, "%s: not valid JSON (line %d, column %d: %s)", origin, je.line,
                      je.column, je.text);
    int rc;
    if (!json_is_object(root)) rc = zs_err(ZS_EFORMAT, "%s: not a JSON object", origin);
    else rc = cfg_parse_root(root, origin, out);
    json_decref(root);
    return rc;
}

static char *cfg_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    size_t k = a;
    if (a && dir[a - 1] != '/') p[k++] = '/';
    memcpy(p + k, name, b + 1);
    return p;
}

int zs_config_load(const char *dir, zs_model_config *out) {
    if (!dir || !out) return zs_err(ZS_EINVAL, "zs_config_load: NULL argument");
    char *path = cfg_join(dir, "config.json");
    if (!path) return zs_err(ZS_ENOMEM, "out of memory");
    int rc = 0;
    char *text = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0) {
        rc = zs_err(errno == ENOENT || errno == ENOTDIR ? ZS_ENOTFOUND : ZS_EIO,
                    "%s: cannot open: %s", path, strerror(errno));
    } else if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        rc = zs_err(ZS_EIO, "%s: not a readable regular file", path);
    } else if (st.st_size > CFG_MAX_FILE) {
        rc = zs_err(ZS_EFORMAT, "%s: absurdly large (%lld bytes)", path, (long long)st.st_size);
    } else if (!(text = malloc((size_t)st.st_size + 1))) {
        rc = zs_err(ZS_ENOMEM, "%s: out of memory", path);
    } else {
        size_t got = 0, want = (size_t)st.st_size;
        while (got < want) {
            ssize_t r = read(fd, text + got, want - got);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) break;
            got += (size_t)r;
        }
        if (got != want) rc = zs_err(ZS_EIO, "%s: read failed", path);
        text[got] = 0;
        if (rc == 0 && strlen(text) != got)
            rc = zs_err(ZS_EFORMAT, "%s: not valid JSON (contains a NUL byte)", path);
        if (rc == 0) rc = zs_config_parse(text, path, out);
    }
    if (fd >= 0) close(fd);
    free(text);
    free(path);
    return rc;
}

/* The double with the fewest significant digits that rounds back to f. */
static double cfg_short(float f) {
    char buf[32];
    for (int p = 1; p <= 9; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, (double)f);
        if (strtof(buf, NULL) == f) return strtod(buf, NULL);
    }
    return (double)f;
}

static int cfg_set(json_t *o, const char *k, json_t *v) { return json_object_set_new(o, k, v); }

static json_t *cfg_id(int id) { return id < 0 ? json_null() : json_integer(id); }

int zs_config_write(const zs_model_config *c, const char *path) {
    if (!c || !path) return zs_err(ZS_EINVAL, "zs_config_write: NULL argument");
    const cfg_arch *a = NULL;
    for (size_t i = 0; i < CFG_NARCH; i++)
        if (!strcmp(c->arch_name, cfg_archs[i].cls)) a = &cfg_archs[i];
    if (!a || a->arch != c->arch)
        return zs_err(ZS_EINVAL, "%s: cannot write config: architecture '%.63s' (arch %d) is not "
                      "one of " CFG_SUPPORTED, path, c->arch_name, (int)c->arch);
    if (!isfinite(c->norm_eps) || !isfinite(c->rope_theta) || (unsigned)c->dtype >= ZS_DTYPE_ELEM_COUNT)
        return zs_err(ZS_EINVAL, "%s: cannot write config: invalid norm_eps, rope_theta or dtype",
                      path);
    static const char *dnames[] = {"float32", "float16", "bfloat16"};
    json_t *r = json_object(), *arr = json_array();
    if (!r || !arr) {
        json_decref(r);
        json_decref(arr);
        return zs_err(ZS_ENOMEM, "out of memory");
    }
    json_array_append_new(arr, json_string(a->cls));
    cfg_set(r, "architectures", arr);
    cfg_set(r, "model_type", json_string(a->model_type));
    cfg_set(r, "vocab_size", json_integer(c->vocab_size));
    if (c->arch == ZS_ARCH_GPT2) {
        cfg_set(r, "activation_function", json_string("gelu_new"));
        cfg_set(r, "n_positions", json_integer(c->max_seq));
        cfg_set(r, "n_ctx", json_integer(c->max_seq));
        cfg_set(r, "n_embd", json_integer(c->dim));
        cfg_set(r, "n_layer", json_integer(c->n_layers));
        cfg_set(r, "n_head", json_integer(c->n_heads));
        cfg_set(r, "n_inner", json_integer(c->ffn_dim));
        cfg_set(r, "layer_norm_epsilon", json_real(cfg_short(c->norm_eps)));
    } else {
        cfg_set(r, "hidden_size", json_integer(c->dim));
        cfg_set(r, "intermediate_size", json_integer(c->ffn_dim));
        cfg_set(r, "num_hidden_layers", json_integer(c->n_layers));
        cfg_set(r, "num_attention_heads", json_integer(c->n_heads));
        cfg_set(r, "num_key_value_heads", json_integer(c->n_kv_heads));
        cfg_set(r, "head_dim", json_integer(c->head_dim));
        cfg_set(r, "max_position_embeddings", json_integer(c->max_seq));
        cfg_set(r, "rms_norm_eps", json_real(cfg_short(c->norm_eps)));
        cfg_set(r, "rope_theta", json_real(cfg_short(c->rope_theta)));
        cfg_set(r, "rope_scaling", json_null());
        cfg_set(r, "hidden_act", json_string("silu"));
        if (!strcmp(a->model_type, "llama")) { /* only plain llama has configurable biases */
            cfg_set(r, "attention_bias", json_boolean(c->qkv_bias));
            cfg_set(r, "mlp_bias", json_boolean(c->mlp_bias));
        }
    }
    cfg_set(r, "tie_word_embeddings", json_boolean(c->tied_embeddings));
    cfg_set(r, "bos_token_id", cfg_id(c->bos_id));
    cfg_set(r, "eos_token_id", cfg_id(c->eos_id));
    cfg_set(r, "torch_dtype", json_string(dnames[c->dtype]));
    char *text = json_dumps(r, JSON_INDENT(2) | JSON_REAL_PRECISION(9));
    json_decref(r);
    if (!text) return zs_err(ZS_ENOMEM, "out of memory");

    /* Whatever is written must read back equal: parse it and compare field by field. */
    zs_model_config b;
    int rc = zs_config_parse(text, path, &b);
    if (rc < 0) {
        free(text);
        return zs_err_prefix(ZS_EINVAL, "cannot write config");
    }
#define CFG_SAME(f)                                                                         \
    if (rc == 0 && b.f != c->f)                                                             \
        rc = zs_err(ZS_EINVAL, "%s: cannot write config: field '" #f "' is not expressible " \
                    "for %s (it would read back differently)", path, a->cls);
    CFG_SAME(arch) CFG_SAME(n_layers) CFG_SAME(dim) CFG_SAME(n_heads) CFG_SAME(n_kv_heads)
    CFG_SAME(head_dim) CFG_SAME(ffn_dim) CFG_SAME(vocab_size) CFG_SAME(max_seq)
    CFG_SAME(norm_eps) CFG_SAME(rope_theta) CFG_SAME(tied_embeddings) CFG_SAME(qkv_bias)
    CFG_SAME(o_bias) CFG_SAME(mlp_bias) CFG_SAME(bos_id) CFG_SAME(eos_id) CFG_SAME(dtype)
    CFG_SAME(act)
#undef CFG_SAME
    if (rc < 0) {
        free(text);
        return rc;
    }

    size_t pl = strlen(path), tl = strlen(text);
    char *tmp = malloc(pl + 5);
    if (!tmp) {
        free(text);
        return zs_err(ZS_ENOMEM, "out of memory");
    }
    memcpy(tmp, path, pl);
    memcpy(tmp + pl, ".tmp", 5);
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        rc = zs_err(ZS_EIO, "%s: cannot create: %s", tmp, strerror(errno));
    } else {
        int ok = fwrite(text, 1, tl, f) == tl && fputc('\n', f) != EOF && fflush(f) == 0 &&
                 fsync(fileno(f)) == 0;
        int e = errno;
        if (fclose(f) != 0 && ok) {
            ok = 0;
            e = errno;
        }
        if (!ok) rc = zs_err(e == ENOSPC ? ZS_ENOSPC : ZS_EIO, "%s: cannot write: %s", tmp,
                             strerror(e));
        else if (rename(tmp, path) != 0)
            rc = zs_err(ZS_EIO, "%s: cannot rename into place: %s", path, strerror(errno));
        if (rc < 0) unlink(tmp);
    }
    free(tmp);
    free(text);
    return rc;
}

/* ---------------------------------------------------------------- GGUF metadata */

/* Names <arch>.<key> in k and looks it up: 1 present, 0 absent (and not required), or
 * ZS_ENOTFOUND when a required key is missing. */
static int gg_key(const zs_gguf *g, const char *arch, const char *key, int required, char *k, size_t cap) {
    snprintf(k, cap, "%s.%s", arch, key);
    if (zs_gguf_find_key(g, k) >= 0) return 1;
    return required ? zs_err(ZS_ENOTFOUND, "%s: required key '%s' is missing", zs_gguf_path(g), k) : 0;
}

/* <arch>.<key> as a positive int: absent -> def (or ZS_ENOTFOUND when required). */
static int gg_int(const zs_gguf *g, const char *arch, const char *key, int required, int def,
                  int *out) {
    char k[160];
    int rc = gg_key(g, arch, key, required, k, sizeof k);
    if (rc <= 0) {
        if (rc == 0) *out = def;
        return rc;
    }
    int64_t v;
    ZS_CHECK(zs_gguf_get_i64(g, k, &v));
    if (v < 1 || v > INT_MAX)
        return zs_err(ZS_EINVAL, "%s: '%s' is %lld; it must be a positive integer", zs_gguf_path(g),
                      k, (long long)v);
    *out = (int)v;
    return 0;
}

/* <arch>.<key> as a positive finite float: absent -> def (or ZS_ENOTFOUND when required). */
static int gg_float(const zs_gguf *g, const char *arch, const char *key, int required, float def,
                    float *out) {
    char k[160];
    int rc = gg_key(g, arch, key, required, k, sizeof k);
    if (rc <= 0) {
        if (rc == 0) *out = def;
        return rc;
    }
    double d;
    ZS_CHECK(zs_gguf_get_f64(g, k, &d));
    float f = (float)d;
    if (!(d > 0) || !isfinite(f) || f == 0)
        return zs_err(ZS_EINVAL, "%s: '%s' is %g, must be a positive float", zs_gguf_path(g), k, d);
    *out = f;
    return 0;
}

static int gg_token(const zs_gguf *g, const char *key, int *out) {
    *out = -1;
    if (zs_gguf_find_key(g, key) < 0) return 0;
    uint32_t v;
    ZS_CHECK(zs_gguf_get_u32(g, key, &v));
    if (v > INT_MAX) return zs_err(ZS_ERANGE, "%s: '%s' is out of range", zs_gguf_path(g), key);
    *out = (int)v;
    return 0;
}

int zs_config_from_gguf(const zs_gguf *g, zs_model_config *out) {
    if (!g || !out) return zs_err(ZS_EINVAL, "zs_config_from_gguf: NULL argument");
    const char *path = zs_gguf_path(g), *arch;
    if (zs_gguf_find_key(g, "general.architecture") < 0)
        return zs_err(ZS_ENOTFOUND, "%s: required key 'general.architecture' is missing", path);
    ZS_CHECK(zs_gguf_get_str(g, "general.architecture", &arch, NULL));
    zs_model_config c;
    memset(&c, 0, sizeof c);
    int gpt2 = !strcmp(arch, "gpt2"), qwen2 = !strcmp(arch, "qwen2");
    if (!gpt2 && !qwen2 && strcmp(arch, "llama"))
        return zs_err(ZS_EUNSUPPORTED, "%s: general.architecture '%.60s' is not supported (supported: "
                      "llama, qwen2, gpt2)", path, arch);
    c.arch = gpt2 ? ZS_ARCH_GPT2 : ZS_ARCH_LLAMA;
    snprintf(c.arch_name, sizeof c.arch_name, "%s",
             gpt2 ? "GPT2LMHeadModel" : qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM");
    ZS_CHECK(gg_int(g, arch, "context_length", 1, 0, &c.max_seq));
    ZS_CHECK(gg_int(g, arch, "embedding_length", 1, 0, &c.dim));
    ZS_CHECK(gg_int(g, arch, "block_count", 1, 0, &c.n_layers));
    ZS_CHECK(gg_int(g, arch, "feed_forward_length", 1, 0, &c.ffn_dim));
    ZS_CHECK(gg_int(g, arch, "attention.head_count", 1, 0, &c.n_heads));
    ZS_CHECK(gg_int(g, arch, "attention.head_count_kv", 0, c.n_heads, &c.n_kv_heads));
    /* vocab: the token list when there is one, else <arch>.vocab_size */
    size_t nv = 0;
    if (zs_gguf_find_key(g, "tokenizer.ggml.tokens") >= 0) {
        ZS_CHECK(zs_gguf_get_arr(g, "tokenizer.ggml.tokens", NULL, &nv));
        if (nv < 1 || nv > INT_MAX)
            return zs_err(ZS_EINVAL, "%s: 'tokenizer.ggml.tokens' has %zu entries", path, nv);
        c.vocab_size = (int)nv;
    } else {
        ZS_CHECK(gg_int(g, arch, "vocab_size", 1, 0, &c.vocab_size));
    }
    ZS_CHECK(gg_token(g, "tokenizer.ggml.bos_token_id", &c.bos_id));
    ZS_CHECK(gg_token(g, "tokenizer.ggml.eos_token_id", &c.eos_id));
    c.tied_embeddings = zs_gguf_find_tensor(g, "output.weight") == NULL;
    const zs_gguf_tensor *te = zs_gguf_find_tensor(g, "token_embd.weight");
    c.dtype = te && te->type == ZS_GGML_F16 ? ZS_F16 : te && te->type == ZS_GGML_BF16 ? ZS_BF16 : ZS_F32;
    if (gpt2) {
        ZS_CHECK(gg_float(g, arch, "attention.layer_norm_epsilon", 1, 0, &c.norm_eps));
        if (c.dim % c.n_heads)
            return zs_err(ZS_EINVAL, "%s: 'gpt2.attention.head_count' (%d) does not divide "
                          "'gpt2.embedding_length' (%d)", path, c.n_heads, c.dim);
        c.n_kv_heads = c.n_heads;
        c.head_dim = c.dim / c.n_heads;
        c.rope_theta = 0;
        c.qkv_bias = c.o_bias = c.mlp_bias = 1;
        c.act = 1;
    } else {
        ZS_CHECK(gg_float(g, arch, "attention.layer_norm_rms_epsilon", 1, 0, &c.norm_eps));
        ZS_CHECK(gg_float(g, arch, "rope.freq_base", 0, 10000.0f, &c.rope_theta));
        if (c.dim % c.n_heads && zs_gguf_find_key(g, qwen2 ? "qwen2.attention.key_length"
                                                           : "llama.attention.key_length") < 0)
            return zs_err(ZS_EINVAL, "%s: '%s.attention.head_count' (%d) does not divide "
                          "'%s.embedding_length' (%d)", path, arch, c.n_heads, arch, c.dim);
        ZS_CHECK(gg_int(g, arch, "attention.key_length", 0, c.dim / c.n_heads, &c.head_dim));
        int vl, rd;
        ZS_CHECK(gg_int(g, arch, "attention.value_length", 0, c.head_dim, &vl));
        ZS_CHECK(gg_int(g, arch, "rope.dimension_count", 0, c.head_dim, &rd));
        if (vl != c.head_dim)
            return zs_err(ZS_EUNSUPPORTED, "%s: '%s.attention.value_length' (%d) differs from the key "
                          "length (%d)", path, arch, vl, c.head_dim);
        if (rd != c.head_dim)
            return zs_err(ZS_EUNSUPPORTED, "%s: '%s.rope.dimension_count' is %d; RoPE over part of a "
                          "head (head_dim %d) is not supported", path, arch, rd, c.head_dim);
        char k[160];
        snprintf(k, sizeof k, "%s.rope.scaling.type", arch);
        if (zs_gguf_find_key(g, k) >= 0) {
            const char *st;
            ZS_CHECK(zs_gguf_get_str(g, k, &st, NULL));
            if (strcmp(st, "none"))
                return zs_err(ZS_EUNSUPPORTED, "%s: '%s' is '%.40s'; RoPE scaling is not supported",
                              path, k, st);
        }
        if (c.head_dim % 2)
            return zs_err(ZS_EINVAL, "%s: head_dim (%d) must be even for RoPE", path, c.head_dim);
        if (c.n_kv_heads > c.n_heads || c.n_heads % c.n_kv_heads)
            return zs_err(ZS_EINVAL, "%s: '%s.attention.head_count' (%d) is not a multiple of "
                          "'%s.attention.head_count_kv' (%d)", path, arch, c.n_heads, arch, c.n_kv_heads);
        c.qkv_bias = qwen2;
        if (!qwen2) /* llama: biases when the file has them */
            c.qkv_bias = c.o_bias = zs_gguf_find_tensor(g, "blk.0.attn_q.bias") != NULL;
        c.act = 0;
    }
    *out = c;
    return 0;
}
