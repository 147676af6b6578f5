/* lora.c — PEFT LoRA adapters: adapter_config.json parsing and checks, the tensors by PEFT's names
 * checked against the base, and the writer of both files. See lora.h. */
#include "lora.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "fileio.h"
#include "ops.h"
#include "pool.h"
#include "safetensors.h"

static const char *const lora_names[ZS_LORA_NT] = {"q_proj", "k_proj", "v_proj", "o_proj",
                                                   "gate_proj", "up_proj", "down_proj"};
static const int lora_roles[ZS_LORA_NT] = {ZS_R_WQ, ZS_R_WK, ZS_R_WV, ZS_R_WO, ZS_R_W_GATE, ZS_R_W_UP, ZS_R_W_DOWN};

struct zs_lora {
    zs_lora_params p;
    int n_layers;
    int in[ZS_LORA_NT], out[ZS_LORA_NT];
    float *A[ZS_LORA_NT], *B[ZS_LORA_NT]; /* [n_layers * r * in], [n_layers * out * r], inside flat */
    float *flat;                           /* every parameter: per target, A then B */
    size_t n_flat;
    void *tflat;                           /* zs_lora_freeze: per target Aᵀ [in, r] and Bᵀ [r, out] per layer */
    int tbf16;                             /* ... in bf16 (else f32) */
    void *At[ZS_LORA_NT], *Bt[ZS_LORA_NT];
};

const char *zs_lora_target_name(int t) { return t >= 0 && t < ZS_LORA_NT ? lora_names[t] : "?"; }
int zs_lora_target_role(int t) { return t >= 0 && t < ZS_LORA_NT ? lora_roles[t] : -1; }

/* One zeroed block for every target's A and B (per target: A, then B). */
static int lora_alloc(zs_lora *l) {
    size_t n = 0;
    for (int t = 0; t < ZS_LORA_NT; t++)
        if (l->p.targets >> t & 1) n += (size_t)l->n_layers * (size_t)l->p.r * (size_t)(l->in[t] + l->out[t]);
    l->flat = zs_aligned_alloc(64, (n ? n : 1) * sizeof(float));
    if (!l->flat) return zs_err(ZS_ENOMEM, "lora: out of memory for %zu parameters", n);
    memset(l->flat, 0, (n ? n : 1) * sizeof(float));
    l->n_flat = n;
    float *p = l->flat;
    for (int t = 0; t < ZS_LORA_NT; t++) {
        l->A[t] = l->B[t] = NULL;
        if (!(l->p.targets >> t & 1)) continue;
        l->A[t] = p;
        p += (size_t)l->n_layers * (size_t)l->p.r * (size_t)l->in[t];
        l->B[t] = p;
        p += (size_t)l->n_layers * (size_t)l->out[t] * (size_t)l->p.r;
    }
    return 0;
}

/* Mixtures of experts: the MLP targets are refused when any layer is sparse (targets apply to every
 * layer; PEFT adapts each expert's gate_proj / up_proj / down_proj, and Qwen2-MoE's shared expert,
 * as modules of their own, which this engine does not serve); the attention projections are fine. */
static int lora_check_moe(const zs_model_config *c, unsigned targets) {
    for (int t = ZS_LORA_GATE; t <= ZS_LORA_DOWN; t++) {
        if (!(targets >> t & 1)) continue;
        for (int l = 0; l < c->n_layers; l++)
            if (zs_config_layer_moe(c, l))
                return zs_err(ZS_EUNSUPPORTED, "lora: target %s: layer %d of this %s is a mixture of experts, whose "
                              "experts' %s are not adaptable yet; adapt the attention projections (q_proj, k_proj, "
                              "v_proj, o_proj)", lora_names[t], l, c->arch_name, lora_names[t]);
    }
    return 0;
}

unsigned zs_lora_default_targets(const zs_model_config *c) {
    for (int l = 0; l < c->n_layers; l++)
        if (zs_config_layer_moe(c, l))
            return 1u << ZS_LORA_Q | 1u << ZS_LORA_K | 1u << ZS_LORA_V | 1u << ZS_LORA_O;
    return ZS_LORA_ALL;
}

int zs_lora_check_targets(const zs_model_config *c, unsigned targets) { return lora_check_moe(c, targets); }

int zs_lora_new(const zs_model *base, const zs_lora_params *pp, zs_lora **out) {
    const zs_model_config *c = zs_model_config_get(base);
    zs_lora_params pd = *pp, *p = &pd;
    if (!p->targets) p->targets = zs_lora_default_targets(c);
    if (c->arch != ZS_ARCH_LLAMA)
        return zs_err(ZS_EUNSUPPORTED, "lora: adapters are supported for the llama family, not %s", c->arch_name);
    if (c->family == ZS_FAM_PHI3)
        return zs_err(ZS_EUNSUPPORTED, "lora: Phi-3's fused qkv_proj / gate_up_proj adapters are not supported yet");
    if (p->r <= 0 || p->r > 4096) return zs_err(ZS_EINVAL, "lora: rank r is %d; it must be 1 to 4096", p->r);
    if (!(p->alpha > 0) || !isfinite(p->alpha)) return zs_err(ZS_EINVAL, "lora: lora_alpha must be a positive number");
    if (!p->targets || (p->targets & ~ZS_LORA_ALL)) return zs_err(ZS_EINVAL, "lora: no target module");
    if (!(p->dropout >= 0 && p->dropout < 1)) return zs_err(ZS_EINVAL, "lora: lora_dropout must be in [0, 1)");
    ZS_CHECK(lora_check_moe(c, p->targets));
    zs_lora *l = calloc(1, sizeof *l);
    if (!l) return zs_err(ZS_ENOMEM, "out of memory");
    l->p = *p;
    l->n_layers = c->n_layers;
    const zs_bucket_layout *L = zs_model_layout(base, zs_bucket_layer(0));
    for (int t = 0; t < ZS_LORA_NT; t++) {
        const zs_slot *s = &L->slot[lora_roles[t]];
        l->out[t] = (int)s->shape[0];
        l->in[t] = (int)s->shape[1];
    }
    int rc = lora_alloc(l);
    if (rc < 0) {
        zs_lora_free(l);
        return rc;
    }
    *out = l;
    return 0;
}

void zs_lora_free(zs_lora *l) {
    if (!l) return;
    free(l->flat);
    free(l->tflat);
    free(l);
}

int zs_lora_new_like(const zs_lora *src, zs_lora **out) {
    zs_lora *l = calloc(1, sizeof *l);
    if (!l) return zs_err(ZS_ENOMEM, "out of memory");
    l->p = src->p;
    l->n_layers = src->n_layers;
    memcpy(l->in, src->in, sizeof l->in);
    memcpy(l->out, src->out, sizeof l->out);
    int rc = lora_alloc(l);
    if (rc < 0) {
        zs_lora_free(l);
        return rc;
    }
    *out = l;
    return 0;
}

int zs_lora_copy(zs_lora *dst, const zs_lora *src) {
    if (dst->n_flat != src->n_flat || dst->p.r != src->p.r || dst->p.targets != src->p.targets ||
        dst->n_layers != src->n_layers)
        return zs_err(ZS_EINVAL, "lora: copy between adapters of different shapes");
    memcpy(dst->flat, src->flat, src->n_flat * sizeof(float));
    return 0;
}

int zs_lora_check_base(const zs_lora *l, const zs_model *base) {
    const zs_model_config *c = zs_model_config_get(base);
    if (c->arch == ZS_ARCH_GPT2) return zs_err(ZS_EUNSUPPORTED, "lora: LoRA adapters are not supported for GPT-2 models");
    if (l->n_layers != c->n_layers)
        return zs_err(ZS_EINVAL, "lora: the adapter has %d layers; the model has %d", l->n_layers, c->n_layers);
    ZS_CHECK(lora_check_moe(c, l->p.targets));
    const zs_bucket_layout *L = zs_model_layout(base, zs_bucket_layer(0));
    for (int t = 0; t < ZS_LORA_NT; t++) {
        if (!l->A[t]) continue;
        const zs_slot *s = &L->slot[lora_roles[t]];
        if (!s->present || s->shape[0] != l->out[t] || s->shape[1] != l->in[t])
            return zs_err(ZS_EINVAL, "lora: the adapter's %s maps %d to %d features; the model's maps %d to %d",
                          lora_names[t], l->in[t], l->out[t], s->present ? (int)s->shape[1] : 0,
                          s->present ? (int)s->shape[0] : 0);
    }
    return 0;
}

int zs_lora_serving_bf16(const zs_model *base) {
    return zs_model_layout(base, zs_bucket_layer(0))->slot[ZS_R_WQ].dtype != ZS_F32;
}

int zs_lora_freeze(zs_lora *l, int bf16) {
    if (l->tflat) return l->tbf16 == !!bf16 ? 0 : zs_err(ZS_EINVAL, "lora: the adapter is already frozen in %s", l->tbf16 ? "bf16" : "f32");
    size_t es = bf16 ? 2 : 4;
    char *p = zs_aligned_alloc(64, (l->n_flat ? l->n_flat : 1) * es);
    if (!p) return zs_err(ZS_ENOMEM, "lora: out of memory for the serving copy (%zu parameters)", l->n_flat);
    l->tflat = p;
    l->tbf16 = !!bf16;
    int r = l->p.r;
#define PUT(base, i, v) (bf16 ? (void)(((uint16_t *)(base))[i] = zs_f32_to_bf16(v)) : (void)(((float *)(base))[i] = (v)))
    for (int t = 0; t < ZS_LORA_NT; t++) {
        if (!l->A[t]) continue;
        size_t na = (size_t)r * (size_t)l->in[t], nb = (size_t)l->out[t] * (size_t)r;
        l->At[t] = p;
        l->Bt[t] = p + (size_t)l->n_layers * na * es;
        for (int layer = 0; layer < l->n_layers; layer++) {
            const float *A = l->A[t] + (size_t)layer * na, *B = l->B[t] + (size_t)layer * nb;
            char *At = (char *)l->At[t] + (size_t)layer * na * es, *Bt = (char *)l->Bt[t] + (size_t)layer * nb * es;
            for (int k = 0; k < r; k++)
                for (int j = 0; j < l->in[t]; j++) PUT(At, (size_t)j * r + k, A[(size_t)k * l->in[t] + j]);
            for (int o = 0; o < l->out[t]; o++)
                for (int k = 0; k < r; k++) PUT(Bt, (size_t)k * l->out[t] + o, B[(size_t)o * r + k]);
        }
        p += (size_t)l->n_layers * (na + nb) * es;
    }
#undef PUT
    return 0;
}

float *zs_lora_data(zs_lora *l, size_t *n) {
    if (n) *n = l->n_flat;
    return l->flat;
}
const float *zs_lora_data_const(const zs_lora *l, size_t *n) {
    if (n) *n = l->n_flat;
    return l->flat;
}
int zs_lora_n_layers(const zs_lora *l) { return l->n_layers; }

/* splitmix64: a counter-based stream for the initialisation */
static uint64_t mix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void zs_lora_init(zs_lora *l, uint64_t seed) {
    memset(l->flat, 0, l->n_flat * sizeof(float));
    uint64_t k = 0;
    for (int t = 0; t < ZS_LORA_NT; t++) {
        if (!l->A[t]) continue;
        /* kaiming_uniform_(a = sqrt(5)) over fan_in = in: U(-1/sqrt(in), 1/sqrt(in)) */
        float bound = 1.0f / sqrtf((float)l->in[t]);
        size_t na = (size_t)l->n_layers * (size_t)l->p.r * (size_t)l->in[t];
        for (size_t i = 0; i < na; i++, k++) {
            double u = (double)(mix64(seed * 0x100000001B3ull + k) >> 11) * (1.0 / 9007199254740992.0);
            l->A[t][i] = (float)((2.0 * u - 1.0) * bound);
        }
    }
}

size_t zs_lora_apply_scratch(const zs_lora *l, int n) { return (size_t)n * (size_t)l->p.r; }

/* a·b over n floats in a fixed order: 8 lanes over k, the lanes added pairwise, then the tail (the
 * loop vectorises; the result depends on n and the values only) */
static inline float lora_dot(const float *a, const float *b, int n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int k = 0;
    for (; k + 8 <= n; k += 8)
        for (int q = 0; q < 8; q++) acc[q] += a[k + q] * b[k + q];
    float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; k < n; k++) s += a[k] * b[k];
    return s;
}

enum { LORA_RC = 4, LORA_OC = 128 }; /* ranks / output features per task */

typedef struct {
    const zs_lora_rows *g;
    int ng, layer, t, in, out;
    float *y, *u;
    const float *x;
    int *tstart; /* [ng + 1]: first task of each group */
    size_t *ustart; /* [ng]: first u element of each group */
    int phase;
} apply_job;

static inline int grow(const zs_lora_rows *g, int i) { return g->rows ? g->rows[i] : g->row0 + i; }

static void apply_task(void *arg, int task) {
    const apply_job *j = arg;
    int gi = 0;
    while (task >= j->tstart[gi + 1]) gi++;
    const zs_lora_rows *g = &j->g[gi];
    const zs_lora *l = g->l;
    int r = l->p.r, c = task - j->tstart[gi];
    float *u = j->u + j->ustart[gi];
    if (j->phase == 0) {
        float s = zs_lora_scale(l);
        if (l->tflat) { /* frozen: the transposed copy, 4 rows per task reading it once */
            size_t es = l->tbf16 ? 2 : 4;
            const char *At = (const char *)l->At[j->t] + (size_t)j->layer * (size_t)r * (size_t)j->in * es;
            float *up[4];
            const float *xp[4];
            int n = ZS_MIN(4, g->n - 4 * c);
            for (int i = 0; i < n; i++) {
                up[i] = u + (size_t)(4 * c + i) * r;
                xp[i] = j->x + (size_t)grow(g, 4 * c + i) * (size_t)j->in;
            }
            zs_op_lora_down4(up, xp, n, At, l->tbf16, j->in, r, s);
            return;
        }
        /* u[i, k] = scale · A[k]·x[i] for a chunk of ranks k */
        const float *A = zs_lora_A_const(l, j->layer, j->t);
        int k1 = ZS_MIN(r, (c + 1) * LORA_RC);
        for (int i = 0; i < g->n; i++) {
            const float *x = j->x + (size_t)grow(g, i) * (size_t)j->in;
            for (int k = c * LORA_RC; k < k1; k++) u[(size_t)i * r + k] = s * lora_dot(x, A + (size_t)k * j->in, j->in);
        }
    } else { /* y[i, o] += B[o]·u[i] for a chunk of outputs o */
        int o0 = c * LORA_OC, o1 = ZS_MIN(j->out, o0 + LORA_OC);
        if (l->tflat) {
            size_t es = l->tbf16 ? 2 : 4;
            const char *Bt = (const char *)l->Bt[j->t] + (size_t)j->layer * (size_t)j->out * (size_t)r * es;
            for (int i = 0; i < g->n; i++)
                zs_op_lora_up(j->y + (size_t)grow(g, i) * (size_t)j->out, u + (size_t)i * r, Bt, l->tbf16, r, j->out, o0, o1);
            return;
        }
        const float *B = zs_lora_B_const(l, j->layer, j->t);
        for (int i = 0; i < g->n; i++) {
            float *y = j->y + (size_t)grow(g, i) * (size_t)j->out;
            for (int o = o0; o < o1; o++) y[o] += lora_dot(u + (size_t)i * r, B + (size_t)o * r, r);
        }
    }
}

int zs_lora_apply_rows(const zs_lora_rows *g, int ng, int layer, int t, float *y, int out, const float *x, int in,
                       float *u) {
    int stack_ts[17];
    size_t stack_us[16];
    int *ts = ng <= 16 ? stack_ts : malloc((size_t)(ng + 1) * sizeof(int));
    size_t *us = ng <= 16 ? stack_us : malloc((size_t)ng * sizeof(size_t));
    if (!ts || !us) {
        if (ng > 16) { free(ts); free(us); }
        return zs_err(ZS_ENOMEM, "lora: out of memory");
    }
    apply_job j = {g, ng, layer, t, in, out, y, u, x, ts, us, 0};
    size_t uoff = 0;
    long work = 0;
    for (int p = 0; p < 2; p++) {
        j.phase = p;
        ts[0] = 0;
        for (int i = 0; i < ng; i++) {
            const zs_lora *l = g[i].l;
            int act = l->A[t] && g[i].n > 0 && l->in[t] == in && l->out[t] == out;
            int n = !act ? 0 : p == 0 ? (l->tflat ? (g[i].n + 3) / 4 : (l->p.r + LORA_RC - 1) / LORA_RC) : (out + LORA_OC - 1) / LORA_OC;
            ts[i + 1] = ts[i] + n;
            if (p == 0) {
                us[i] = uoff;
                if (act) {
                    uoff += (size_t)g[i].n * (size_t)l->p.r;
                    work += (long)g[i].n * l->p.r * (long)(in + out);
                }
            }
        }
        if (ts[ng] == 0) break;
        if (work < 32768) /* too little to wake the pool for */
            for (int k = 0; k < ts[ng]; k++) apply_task(&j, k);
        else
            zs_pool_run(apply_task, &j, ts[ng]);
    }
    if (ng > 16) { free(ts); free(us); }
    return 0;
}

void zs_lora_apply(const zs_lora *l, int layer, int t, float *y, const float *x, int n, float *scratch) {
    if (!l->A[t] || n <= 0) return;
    zs_lora_rows g = {l, NULL, 0, n};
    (void)zs_lora_apply_rows(&g, 1, layer, t, y, l->out[t], x, l->in[t], scratch); /* one group: no allocation */
}

const zs_lora_params *zs_lora_get_params(const zs_lora *l) { return &l->p; }
float zs_lora_scale(const zs_lora *l) {
    return l->p.rslora ? l->p.alpha / sqrtf((float)l->p.r) : l->p.alpha / (float)l->p.r;
}
float *zs_lora_A(zs_lora *l, int layer, int t) {
    return l->A[t] ? l->A[t] + (size_t)layer * l->p.r * l->in[t] : NULL;
}
float *zs_lora_B(zs_lora *l, int layer, int t) {
    return l->B[t] ? l->B[t] + (size_t)layer * l->out[t] * l->p.r : NULL;
}
const float *zs_lora_A_const(const zs_lora *l, int layer, int t) { return zs_lora_A((zs_lora *)l, layer, t); }
const float *zs_lora_B_const(const zs_lora *l, int layer, int t) { return zs_lora_B((zs_lora *)l, layer, t); }
int zs_lora_dims(const zs_lora *l, int t, int *in, int *out) {
    if (t < 0 || t >= ZS_LORA_NT) return ZS_EINVAL;
    *in = l->in[t];
    *out = l->out[t];
    return 0;
}
size_t zs_lora_param_count(const zs_lora *l) {
    size_t n = 0;
    for (int t = 0; t < ZS_LORA_NT; t++)
        if (l->A[t]) n += (size_t)l->n_layers * (size_t)l->p.r * (size_t)(l->in[t] + l->out[t]);
    return n;
}

/* PEFT's name of a LoRA matrix ("A" or "B") */
static void lora_tname(char *buf, size_t cap, int layer, int t, char which) {
    snprintf(buf, cap, "base_model.model.model.layers.%d.%s.%s.lora_%c.weight", layer, t <= ZS_LORA_O ? "self_attn" : "mlp",
             lora_names[t], which);
}

/* adapter_config.json -> params, refusing what this engine does not compute */
static int lora_parse_config(const char *path, json_t *root, zs_lora_params *p) {
    memset(p, 0, sizeof *p);
    const char *pt = json_string_value(json_object_get(root, "peft_type"));
    if (pt && strcmp(pt, "LORA"))
        return zs_err(ZS_EUNSUPPORTED, "%s: peft_type is '%s'; only LORA adapters are supported", path, pt);
    json_t *r = json_object_get(root, "r");
    if (!json_is_integer(r)) return zs_err(ZS_EINVAL, "%s: 'r' must be an integer", path);
    if (json_integer_value(r) <= 0 || json_integer_value(r) > 4096)
        return zs_err(ZS_EINVAL, "%s: 'r' is %lld; the rank must be 1 to 4096", path, (long long)json_integer_value(r));
    p->r = (int)json_integer_value(r);
    json_t *a = json_object_get(root, "lora_alpha");
    if (a && !json_is_null(a) && !json_is_number(a)) return zs_err(ZS_EINVAL, "%s: 'lora_alpha' must be a number", path);
    p->alpha = a && json_is_number(a) ? (float)json_number_value(a) : 8.0f; /* PEFT's default */
    if (!(p->alpha > 0) || !isfinite(p->alpha)) return zs_err(ZS_EINVAL, "%s: 'lora_alpha' must be positive", path);
    json_t *d = json_object_get(root, "lora_dropout");
    p->dropout = d && json_is_number(d) ? (float)json_number_value(d) : 0.0f;
    if (!(p->dropout >= 0 && p->dropout < 1)) return zs_err(ZS_EINVAL, "%s: 'lora_dropout' must be in [0, 1)", path);
    p->rslora = json_is_true(json_object_get(root, "use_rslora"));
    static const char *const refused_true[] = {"use_dora", "fan_in_fan_out", "lora_bias", "use_qalora", NULL};
    for (int i = 0; refused_true[i]; i++)
        if (json_is_true(json_object_get(root, refused_true[i])))
            return zs_err(ZS_EUNSUPPORTED, "%s: '%s' is true; %s is not supported", path, refused_true[i],
                          !strcmp(refused_true[i], "use_dora") ? "DoRA" : "it");
    const char *bias = json_string_value(json_object_get(root, "bias"));
    if (bias && strcmp(bias, "none"))
        return zs_err(ZS_EUNSUPPORTED, "%s: 'bias' is '%s'; only \"none\" is supported", path, bias);
    static const char *const refused_set[] = {"modules_to_save", "layers_to_transform", "layers_pattern",
                                              "layer_replication", "trainable_token_indices", "target_parameters", NULL};
    for (int i = 0; refused_set[i]; i++) {
        json_t *v = json_object_get(root, refused_set[i]);
        if (v && !json_is_null(v) && !(json_is_array(v) && json_array_size(v) == 0))
            return zs_err(ZS_EUNSUPPORTED, "%s: '%s' is set; it is not supported", path, refused_set[i]);
    }
    static const char *const refused_map[] = {"rank_pattern", "alpha_pattern", NULL};
    for (int i = 0; refused_map[i]; i++) {
        json_t *v = json_object_get(root, refused_map[i]);
        if (json_is_object(v) && json_object_size(v))
            return zs_err(ZS_EUNSUPPORTED, "%s: '%s' has entries; per-module ranks are not supported", path, refused_map[i]);
    }
    json_t *tm = json_object_get(root, "target_modules");
    if (json_is_string(tm)) {
        if (strcmp(json_string_value(tm), "all-linear"))
            return zs_err(ZS_EUNSUPPORTED, "%s: 'target_modules' is the regular expression '%s'; give a list of module "
                          "names", path, json_string_value(tm));
        p->targets = ZS_LORA_ALL;
    } else if (json_is_array(tm) && json_array_size(tm)) {
        for (size_t i = 0; i < json_array_size(tm); i++) {
            const char *n = json_string_value(json_array_get(tm, i));
            int t = 0;
            while (n && t < ZS_LORA_NT && strcmp(n, lora_names[t])) t++;
            if (!n || t == ZS_LORA_NT)
                return zs_err(ZS_EINVAL, "%s: 'target_modules[%zu]' is %s%s%s; the base has q_proj, k_proj, v_proj, "
                              "o_proj, gate_proj, up_proj, down_proj", path, i, n ? "'" : "", n ? n : "not a string",
                              n ? "'" : "");
            p->targets |= 1u << t;
        }
    } else {
        return zs_err(ZS_EINVAL, "%s: 'target_modules' must be a non-empty list of module names or \"all-linear\"", path);
    }
    return 0;
}

int zs_lora_load(const char *dir, const zs_model *base, zs_lora **out) {
    char path[4096];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) {
        struct stat st;
        if (stat(path, &st) != 0) return zs_err(ZS_ENOTFOUND, "%s: cannot open: %s", path, strerror(errno));
        return zs_err(ZS_EFORMAT, "%s: not valid JSON (line %d: %s)", path, je.line, je.text);
    }
    zs_lora_params p;
    int rc = json_is_object(root) ? lora_parse_config(path, root, &p) : zs_err(ZS_EFORMAT, "%s: not a JSON object", path);
    json_decref(root);
    if (rc < 0) return rc;
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    zs_st_set *st = NULL;
    if ((rc = zs_st_open_file(path, &st)) < 0) return rc;
    zs_lora *l = NULL;
    if ((rc = zs_lora_new(base, &p, &l)) < 0) {
        zs_st_close(st);
        return zs_err_prefix(rc, "%s", dir);
    }
    size_t used = 0;
    char nm[256];
    for (int layer = 0; rc == 0 && layer < l->n_layers; layer++)
        for (int t = 0; rc == 0 && t < ZS_LORA_NT; t++) {
            if (!l->A[t]) continue;
            for (int w = 0; rc == 0 && w < 2; w++) {
                int64_t shape[2] = {w ? l->out[t] : p.r, w ? p.r : l->in[t]};
                const zs_st_tensor *x;
                lora_tname(nm, sizeof nm, layer, t, w ? 'B' : 'A');
                if ((rc = zs_st_get(st, nm, 2, shape, &x)) < 0) break;
                zs_to_f32(w ? zs_lora_B(l, layer, t) : zs_lora_A(l, layer, t), x->data, x->dtype,
                          (size_t)(shape[0] * shape[1]));
                used++;
            }
        }
    if (rc == 0 && used != zs_st_count(st)) {
        /* a tensor the config does not account for (another target, a layer the base lacks, ...) */
        for (size_t i = 0; i < zs_st_count(st) && rc == 0; i++) {
            const char *n = zs_st_at(st, i)->name;
            int layer = -1, known = 0;
            char mod[64] = "", ab = 0;
            if (sscanf(n, "base_model.model.model.layers.%d.%*[a-z_].%63[a-z_].lora_%c.weight", &layer, mod, &ab) == 3)
                for (int t = 0; t < ZS_LORA_NT; t++)
                    known |= l->A[t] && !strcmp(mod, lora_names[t]) && layer >= 0 && layer < l->n_layers;
            if (!known)
                rc = zs_err(ZS_EINVAL, "%s: tensor '%s' is not one of the adapter's (r %d, target_modules of "
                            "adapter_config.json, %d layers of the base)", path, n, p.r, l->n_layers);
        }
    }
    zs_st_close(st);
    if (rc < 0) {
        zs_lora_free(l);
        return rc;
    }
    *out = l;
    return 0;
}

int zs_lora_save(const zs_lora *l, const char *dir, const char *base_name) {
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) return zs_err(ZS_EIO, "%s: cannot create: %s", dir, strerror(errno));
    int nt = 0;
    for (int t = 0; t < ZS_LORA_NT; t++) nt += l->A[t] ? 2 * l->n_layers : 0;
    zs_st_decl *d = calloc((size_t)nt, sizeof *d);
    char (*names)[160] = calloc((size_t)nt, sizeof *names);
    if (!d || !names) {
        free(d);
        free(names);
        return zs_err(ZS_ENOMEM, "out of memory");
    }
    int k = 0;
    for (int layer = 0; layer < l->n_layers; layer++)
        for (int t = 0; t < ZS_LORA_NT; t++) {
            if (!l->A[t]) continue;
            for (int w = 0; w < 2; w++, k++) {
                lora_tname(names[k], sizeof names[k], layer, t, w ? 'B' : 'A');
                d[k] = (zs_st_decl){names[k], ZS_F32, 2, {w ? l->out[t] : l->p.r, w ? l->p.r : l->in[t], 0, 0}};
            }
        }
    char path[4096];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    zs_st_writer *wr = NULL;
    int rc = zs_st_writer_open(path, d, (size_t)nt, "{\"format\":\"pt\"}", &wr);
    for (int layer = 0; rc == 0 && layer < l->n_layers; layer++)
        for (int t = 0; rc == 0 && t < ZS_LORA_NT; t++) {
            if (!l->A[t]) continue;
            rc = zs_st_writer_write(wr, zs_lora_A_const(l, layer, t), (size_t)l->p.r * l->in[t] * sizeof(float));
            if (rc == 0) rc = zs_st_writer_write(wr, zs_lora_B_const(l, layer, t), (size_t)l->out[t] * l->p.r * sizeof(float));
        }
    if (wr) {
        if (rc == 0) rc = zs_st_writer_close(wr);
        else zs_st_writer_abort(wr);
    }
    free(d);
    free(names);
    if (rc < 0) return rc;
    /* adapter_config.json as PEFT writes it (the keys PEFT reads back) */
    json_t *c = json_object(), *tm = json_array();
    for (int t = 0; t < ZS_LORA_NT; t++)
        if (l->A[t]) json_array_append_new(tm, json_string(lora_names[t]));
    json_object_set_new(c, "peft_type", json_string("LORA"));
    json_object_set_new(c, "task_type", json_string("CAUSAL_LM"));
    json_object_set_new(c, "base_model_name_or_path", base_name ? json_string(base_name) : json_null());
    json_object_set_new(c, "r", json_integer(l->p.r));
    json_object_set_new(c, "lora_alpha", json_real(l->p.alpha));
    json_object_set_new(c, "lora_dropout", json_real(l->p.dropout));
    json_object_set_new(c, "use_rslora", json_boolean(l->p.rslora));
    json_object_set_new(c, "use_dora", json_false());
    json_object_set_new(c, "bias", json_string("none"));
    json_object_set_new(c, "fan_in_fan_out", json_false());
    json_object_set_new(c, "inference_mode", json_true());
    json_object_set_new(c, "init_lora_weights", json_true());
    json_object_set_new(c, "modules_to_save", json_null());
    json_object_set_new(c, "target_modules", tm);
    char *text = json_dumps(c, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(c);
    if (!text) return zs_err(ZS_ENOMEM, "out of memory");
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    rc = zs_write_file_atomic(path, text, strlen(text));
    free(text);
    return rc;
}
