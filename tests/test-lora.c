/* test-lora.c — LoRA adapters in PEFT's format (engine/model/lora.h): an adapter made and saved by
 * PEFT 0.17.1 itself (tests/ref/lora-peft, from tests/ref/make_lora_ref.py) loads here with PEFT's
 * values bit for bit; one saved here reads back equal, with PEFT's names; and every malformed or
 * unsupported adapter is refused with a message naming the file and the problem. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "init-cmd.h"
#include "lora.h"
#include "model.h"
#include "safetensors.h"
#include "testutil.h"

#define REF "tests/ref/lora-peft"

static char tmp[4096];

/* the base from reference.json's init-model flags (dim overrides its --dim when > 0) */
static zs_model *make_base(json_t *ref, const char *name, int dim) {
    json_t *args = json_object_get(ref, "init_model_args");
    int n = (int)json_array_size(args);
    char *argv[64], dimbuf[16], out[4200];
    snprintf(out, sizeof out, "%s/%s", tmp, name);
    for (int i = 0; i < n && i < 58; i++) argv[i] = (char *)json_string_value(json_array_get(args, i));
    snprintf(dimbuf, sizeof dimbuf, "%d", dim);
    int argc = n;
    if (dim > 0) { argv[argc++] = "--dim"; argv[argc++] = dimbuf; }
    argv[argc++] = "--out";
    argv[argc++] = out;
    zs_init_opts io;
    const char *o;
    int help;
    zs_model *m = NULL;
    if (zs_init_cmd_parse(argc, argv, &io, &o, &help) < 0 || zs_init_model_write(&io, out) < 0 ||
        zs_model_open(out, NULL, &m) < 0) {
        fprintf(stderr, "base %s: %s\n", name, zs_errmsg());
        return NULL;
    }
    return m;
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
    zs_model_free(base);
    json_decref(ref);
    tu_rmdir(tmp);
    return tu_finish("test-lora");
}
