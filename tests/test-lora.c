/* test-lora.c — LoRA adapters in PEFT's format (engine/model/lora.h): an adapter made and saved by
 * PEFT 0.17.1 itself (tests/ref/lora-peft, from tests/ref/make_lora_ref.py) loads here with PEFT's
 * values bit for bit; one saved here reads back equal, with PEFT's names; and every malformed or
 * unsupported adapter is refused with a message naming the file and the problem. */
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>

#include "common.h"
#include "lora.h"
#include "model.h"
#include "ref.h"
#include "safetensors.h"
#include "testutil.h"

#define REF "tests/ref/lora-peft"

static char tmp[4096];

/* the base from reference.json's init-model flags (dim overrides its --dim when > 0) */
static zs_model *make_base(json_t *ref, const char *name, int dim) {
    char dimbuf[16], out[4200];
    snprintf(dimbuf, sizeof dimbuf, "%d", dim);
    snprintf(out, sizeof out, "%s/%s", tmp, name);
    return tu_ref_lora_base_open(ref, out, dim > 0 ? "--dim" : NULL, dimbuf, 0);
}

static void copy_file(const char *from, const char *to, long keep) {
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    char buf[65536];
    size_t k, total = 0;
    while (a && b && (k = fread(buf, 1, sizeof buf, a)) > 0) {
        if (keep >= 0 && total + k > (size_t)keep) k = (size_t)keep - total;
        fwrite(buf, 1, k, b);
        total += k;
        if (keep >= 0 && total >= (size_t)keep) break;
    }
    if (a) fclose(a);
    if (b) fclose(b);
}

/* an adapter dir whose config is PEFT's with one key replaced (value: JSON text; NULL deletes),
 * and whose safetensors is PEFT's (keep >= 0: only its first keep bytes) */
static const char *variant(const char *name, const char *key, const char *value, long keep) {
    static char dir[4200];
    snprintf(dir, sizeof dir, "%s/%s", tmp, name);
    mkdir(dir, 0755);
    json_t *c = json_load_file(REF "/adapter_config.json", 0, NULL);
    if (key) {
        if (value) json_object_set_new(c, key, json_loads(value, JSON_DECODE_ANY, NULL));
        else json_object_del(c, key);
    }
    char p[4300];
    snprintf(p, sizeof p, "%s/adapter_config.json", dir);
    json_dump_file(c, p, 0);
    json_decref(c);
    snprintf(p, sizeof p, "%s/adapter_model.safetensors", dir);
    copy_file(REF "/adapter_model.safetensors", p, keep);
    return dir;
}

/* y += scale·B·A·x for PEFT's adapter through zs_lora_apply against a double-precision
 * reference: the PEFT-layout path, the frozen f32 copies and the frozen bf16 copies; the frozen
 * kernel's rows do not depend on the other rows of the call (bit for bit). */
static void apply_checks(const zs_model *base) {
    zs_lora *l = NULL, *lf = NULL, *lb = NULL;
    if (zs_lora_load(REF, base, &l) < 0 || zs_lora_load(REF, base, &lf) < 0 || zs_lora_load(REF, base, &lb) < 0) {
        CHECK(0, "load for the apply checks: %s", zs_errmsg());
        zs_lora_free(l); zs_lora_free(lf); zs_lora_free(lb);
        return;
    }
    CHECK(zs_lora_freeze(lf, 0) == 0 && zs_lora_freeze(lb, 1) == 0, "freeze f32 and bf16");
    CHECK(zs_lora_freeze(lf, 0) == 0 && zs_lora_freeze(lf, 1) < 0, "freeze again: same type idempotent, another refused");
    enum { N = 7 };
    int r = zs_lora_get_params(l)->r;
    for (int t = 0; t < ZS_LORA_NT; t++) {
        int in, out;
        zs_lora_dims(l, t, &in, &out);
        float *x = malloc((size_t)N * in * 4), *y0 = calloc((size_t)N * out, 4), *y1 = calloc((size_t)N * out, 4);
        float *y2 = calloc((size_t)N * out, 4), *y3 = calloc((size_t)out, 4), *u = malloc((size_t)N * r * 4);
        double *ref = calloc((size_t)N * out, sizeof(double));
        for (int i = 0; i < N * in; i++) x[i] = (float)sin(0.37 * i + t) * 0.9f;
        const float *A = zs_lora_A_const(l, 1, t), *B = zs_lora_B_const(l, 1, t);
        double s = zs_lora_scale(l), worst = 0, worst_b = 0, mag = 0;
        for (int i = 0; i < N; i++)
            for (int o = 0; o < out; o++) {
                double acc = 0;
                for (int k = 0; k < r; k++) {
                    double a = 0;
                    for (int j = 0; j < in; j++) a += (double)A[(size_t)k * in + j] * x[(size_t)i * in + j];
                    acc += (double)B[(size_t)o * r + k] * a;
                }
                ref[(size_t)i * out + o] = s * acc;
                mag = fmax(mag, fabs(s * acc));
            }
        zs_lora_apply(l, 1, t, y0, x, N, u);
        zs_lora_apply(lf, 1, t, y1, x, N, u);
        zs_lora_apply(lb, 1, t, y2, x, N, u);
        double worst_f = 0;
        for (int i = 0; i < N * out; i++) {
            worst = fmax(worst, fabs(y0[i] - ref[i]));
            worst_f = fmax(worst_f, fabs(y1[i] - ref[i]));
            worst_b = fmax(worst_b, fabs(y2[i] - ref[i]));
        }
        CHECK(worst <= 1e-5 * mag && worst_f <= 1e-5 * mag, "%s: PEFT layout %.2e, frozen f32 %.2e of %.2e", zs_lora_target_name(t),
              worst, worst_f, mag);
        CHECK(worst_b <= 2e-2 * mag && worst_b > 0, "%s: frozen bf16 %.2e of %.2e", zs_lora_target_name(t), worst_b, mag);
        /* row 3 alone, and inside a scattered group of rows {5, 3, 0}: the same bits as in the call of 7 */
        zs_lora_apply(lf, 1, t, y3, x + 3 * in, 1, u);
        CHECK(!memcmp(y3, y1 + 3 * out, (size_t)out * 4), "%s: frozen kernel: a row alone equals it among 7", zs_lora_target_name(t));
        float *y4 = calloc((size_t)N * out, 4);
        int rows[3] = {5, 3, 0};
        zs_lora_rows g[2] = {{lf, rows, 0, 3}, {lb, NULL, 6, 1}};
        CHECK(zs_lora_apply_rows(g, 2, 1, t, y4, out, x, in, u) == 0, "apply_rows");
        int same = 1;
        for (int k = 0; k < 3; k++) same &= !memcmp(y4 + rows[k] * out, y1 + rows[k] * out, (size_t)out * 4);
        same &= !memcmp(y4 + 6 * out, y2 + 6 * out, (size_t)out * 4);
        for (int o = 0; o < out; o++) same &= y4[1 * out + o] == 0 && y4[2 * out + o] == 0;
        CHECK(same, "%s: two adapters over scattered rows: each row's bits as alone, other rows untouched", zs_lora_target_name(t));
        free(x); free(y0); free(y1); free(y2); free(y3); free(y4); free(u); free(ref);
    }
    zs_lora_free(l); zs_lora_free(lf); zs_lora_free(lb);
}

int main(void) {
    if (tu_tmpdir(tmp, sizeof tmp, "lora") != 0) return 1;
    json_t *ref = json_load_file(REF "/reference.json", 0, NULL);
    CHECK(ref != NULL, "reference.json");
    if (!ref) return tu_finish("test-lora");
    zs_model *base = make_base(ref, "base", 0);
    CHECK(base != NULL, "base model");
    if (!base) return tu_finish("test-lora");

    /* PEFT's adapter: its config and every value */
    zs_lora *l = NULL;
    CHECK(zs_lora_load(REF, base, &l) == 0, "load PEFT's adapter: %s", zs_errmsg());
    if (l) {
        const zs_lora_params *p = zs_lora_get_params(l);
        CHECK(p->r == 4 && p->alpha == 8 && !p->rslora && p->targets == ZS_LORA_ALL, "r 4, alpha 8, all seven targets");
        CHECK(zs_lora_scale(l) == 2.0f, "scale alpha / r = 2");
        zs_st_set *st = NULL;
        CHECK(zs_st_open_file(REF "/adapter_model.safetensors", &st) == 0, "open the file");
        int same = 1, n = 0;
        for (size_t i = 0; st && i < zs_st_count(st); i++) {
            const zs_st_tensor *t = zs_st_at(st, i);
            int layer, tg = -1;
            char mod[64], ab;
            if (sscanf(t->name, "base_model.model.model.layers.%d.%*[a-z_].%63[a-z_].lora_%c.weight", &layer, mod, &ab) != 3)
                continue;
            for (int k = 0; k < ZS_LORA_NT; k++)
                if (!strcmp(mod, zs_lora_target_name(k))) tg = k;
            const float *mine = ab == 'A' ? zs_lora_A_const(l, layer, tg) : zs_lora_B_const(l, layer, tg);
            same &= tg >= 0 && mine && !memcmp(mine, t->data, t->nbytes);
            n++;
        }
        CHECK(same && n == 2 * 2 * ZS_LORA_NT, "all %d of PEFT's matrices bit for bit", n);
        zs_st_close(st);
        int in, out;
        zs_lora_dims(l, ZS_LORA_K, &in, &out);
        CHECK(in == 64 && out == 32, "k_proj: in 64, out 32 (GQA)");
        CHECK(zs_lora_param_count(l) == 2u * 4u * (64 + 64 + 64 + 32 + 64 + 32 + 64 + 64 + 64 + 128 + 64 + 128 + 128 + 64),
              "parameter count %zu", zs_lora_param_count(l));

        /* saved here, read back equal, with PEFT's names */
        char sv[4200];
        snprintf(sv, sizeof sv, "%s/saved", tmp);
        CHECK(zs_lora_save(l, sv, "base") == 0, "save: %s", zs_errmsg());
        zs_lora *l2 = NULL;
        CHECK(zs_lora_load(sv, base, &l2) == 0, "load what was saved: %s", zs_errmsg());
        int eq = l2 != NULL;
        for (int layer = 0; eq && layer < 2; layer++)
            for (int t = 0; t < ZS_LORA_NT; t++) {
                zs_lora_dims(l, t, &in, &out);
                eq &= !memcmp(zs_lora_A_const(l, layer, t), zs_lora_A_const(l2, layer, t), (size_t)4 * in * 4) &&
                      !memcmp(zs_lora_B_const(l, layer, t), zs_lora_B_const(l2, layer, t), (size_t)out * 4 * 4);
            }
        CHECK(eq, "saved adapter reads back bit for bit");
        zs_lora_free(l2);
        char p2[4300];
        snprintf(p2, sizeof p2, "%s/adapter_model.safetensors", sv);
        st = NULL;
        CHECK(zs_st_open_file(p2, &st) == 0 &&
              zs_st_find(st, "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight") != NULL,
              "PEFT's tensor names in the saved file");
        zs_st_close(st);
        snprintf(p2, sizeof p2, "%s/adapter_config.json", sv);
        json_t *sc = json_load_file(p2, 0, NULL);
        CHECK(sc && !strcmp(json_string_value(json_object_get(sc, "peft_type")), "LORA") &&
              json_integer_value(json_object_get(sc, "r")) == 4 && json_array_size(json_object_get(sc, "target_modules")) == 7,
              "adapter_config.json as PEFT reads it");
        json_decref(sc);
        snprintf(p2, sizeof p2, "%s/adapter_config.json.tmp", sv);
        CHECK(access(p2, F_OK) != 0, "no temporary left");
        zs_lora_free(l);
    }

    /* "all-linear" and rsLoRA */
    zs_lora *x = NULL;
    CHECK(zs_lora_load(variant("alllin", "target_modules", "\"all-linear\"", -1), base, &x) == 0 &&
          zs_lora_get_params(x)->targets == ZS_LORA_ALL, "target_modules all-linear: %s", zs_errmsg());
    zs_lora_free(x);
    x = NULL;
    CHECK(zs_lora_load(variant("rs", "use_rslora", "true", -1), base, &x) == 0 && zs_lora_scale(x) == 4.0f,
          "use_rslora: scale alpha / sqrt(r) = 4");
    zs_lora_free(x);

    /* refused, each naming the problem */
    struct { const char *name, *key, *value; long keep; const char *needle; } bad[] = {
        {"r0", "r", "0", -1, "'r' is 0"},
        {"rstr", "r", "\"4\"", -1, "'r' must be an integer"},
        {"dora", "use_dora", "true", -1, "DoRA"},
        {"bias", "bias", "\"all\"", -1, "'bias' is 'all'"},
        {"save", "modules_to_save", "[\"lm_head\"]", -1, "modules_to_save"},
        {"ltt", "layers_to_transform", "[0]", -1, "layers_to_transform"},
        {"rank", "rank_pattern", "{\"q_proj\": 8}", -1, "rank_pattern"},
        {"regex", "target_modules", "\".*proj\"", -1, "regular expression"},
        {"foo", "target_modules", "[\"q_proj\", \"foo_proj\"]", -1, "foo_proj"},
        {"ia3", "peft_type", "\"IA3\"", -1, "IA3"},
        {"fewer", "target_modules", "[\"q_proj\"]", -1, "is not one of the adapter's"},
        {"rank8", "r", "8", -1, "expected [8, 64]"},
        {"trunc", NULL, NULL, 20000, "adapter_model.safetensors"},
        {"alpha", "lora_alpha", "-1", -1, "lora_alpha"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        x = NULL;
        int rc = zs_lora_load(variant(bad[i].name, bad[i].key, bad[i].value, bad[i].keep), base, &x);
        CHECK(rc < 0 && x == NULL, "%s: refused (rc %d)", bad[i].name, rc);
        CHECK(strstr(zs_errmsg(), bad[i].needle) != NULL, "%s: message \"%s\" names \"%s\"", bad[i].name, zs_errmsg(),
              bad[i].needle);
    }
    CHECK_ERR(zs_lora_load(tmp, base, &x), "adapter_config.json", "cannot open");
    /* an adapter for another base: shapes that do not match, named */
    zs_model *other = make_base(ref, "other", 128);
    CHECK(other != NULL, "a base of dim 128");
    if (other) {
        x = NULL;
        CHECK_ERR(zs_lora_load(REF, other, &x), "lora_A.weight", "expected");
        zs_model_free(other);
    }
    apply_checks(base);
    zs_model_free(base);
    json_decref(ref);
    tu_rmdir(tmp);
    return tu_finish("test-lora");
}
