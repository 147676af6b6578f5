/* ref.c — readers of the reference data under tests/ref/ (ref.h): documents and their float32
 * arrays, token ids, AdamW's settings, regenerated models and the gradient comparison. */
#include "ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "testmodel.h"
#include "testutil.h"

int tu_ref_load(tu_ref *r, const char *json_path, const char *bin_path) {
    memset(r, 0, sizeof *r);
    json_t *doc = tu_ref_json(json_path);
    if (!doc) return -1;
    char p[4096];
    long n = 0;
    if (bin_path) {
        snprintf(p, sizeof p, "%s", bin_path);
    } else {
        const char *name = json_string_value(json_object_get(doc, "bin"));
        const char *slash = strrchr(json_path, '/');
        int dl = slash ? (int)(slash - json_path + 1) : 0;
        snprintf(p, sizeof p, "%.*s%s", dl, json_path, name ? name : "(no \"bin\")");
        n = (long)json_integer_value(json_object_get(doc, "bin_floats"));
    }
    FILE *f = fopen(p, "rb");
    if (f && bin_path && fseek(f, 0, SEEK_END) == 0) {
        n = ftell(f) / (long)sizeof(float);
        fseek(f, 0, SEEK_SET);
    }
    float *bin = tu_xcalloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    size_t got = f && n > 0 ? fread(bin, sizeof(float), (size_t)n, f) : 0;
    if (f) fclose(f);
    if (n <= 0 || (long)got != n) {
        fprintf(stderr, "%s: missing or short (%zu of %ld floats)\n", p, got, n);
        free(bin);
        json_decref(doc);
        return -1;
    }
    r->doc = doc;
    r->bin = bin;
    r->nbin = n;
    return 0;
}

void tu_ref_free(tu_ref *r) {
    json_decref(r->doc);
    free(r->bin);
    memset(r, 0, sizeof *r);
}

json_t *tu_ref_json(const char *path) {
    json_error_t je;
    json_t *doc = json_load_file(path, 0, &je);
    if (!doc) fprintf(stderr, "cannot load %s: %s (run from the repository root)\n", path, je.text);
    return doc;
}

json_t *tu_ref_batch(const char *path, int B, int T, int32_t *tok, int32_t *tgt, zs_adamw_params *adam) {
    json_t *doc = tu_ref_json(path);
    if (!doc) return NULL;
    tu_ref_rows(json_object_get(doc, "tokens"), B, T, tok);
    tu_ref_rows(json_object_get(doc, "targets"), B, T, tgt);
    tu_ref_adamw(json_object_get(doc, "adamw"), adam);
    return doc;
}

int tu_ref_ids(json_t *a, int32_t *out, int cap) {
    int n = (int)json_array_size(a);
    for (int i = 0; i < n && i < cap; i++) out[i] = (int32_t)json_integer_value(json_array_get(a, (size_t)i));
    return n;
}

void tu_ref_rows(json_t *rows, int B, int T, int32_t *out) {
    for (int b = 0; b < B; b++)
        for (int i = 0; i < T; i++)
            out[b * T + i] = (int32_t)json_integer_value(json_array_get(json_array_get(rows, (size_t)b), (size_t)i));
}

int32_t *tu_ref_ids_dup(json_t *a, size_t *n) {
    *n = json_array_size(a);
    int32_t *p = *n ? malloc(*n * sizeof *p) : NULL;
    if (p) tu_ref_ids(a, p, (int)*n);
    return p;
}

void tu_ref_adamw(json_t *a, zs_adamw_params *p) {
    p->lr = (float)json_number_value(json_object_get(a, "lr"));
    p->beta1 = (float)json_number_value(json_object_get(a, "beta1"));
    p->beta2 = (float)json_number_value(json_object_get(a, "beta2"));
    p->eps = (float)json_number_value(json_object_get(a, "eps"));
    p->weight_decay = (float)json_number_value(json_object_get(a, "weight_decay"));
}

int tu_ref_regen(json_t *cs, const char *dir, const char *script) {
    const char *name = json_string_value(json_object_get(cs, "name"));
    int rc = tu_regen_model(json_object_get(cs, "init_args"), dir);
    CHECK(rc == 0, "%s: init-model: %s", name, zs_errmsg());
    if (rc < 0) return rc;
    char st[4300], hex[17] = "";
    snprintf(st, sizeof st, "%s/model.safetensors", dir);
    const char *want = json_string_value(json_object_get(cs, "safetensors_checksum"));
    CHECK(tu_file_checksum(st, 4, hex, sizeof hex) == 0 && want && !strcmp(hex, want),
          "%s: the regenerated model.safetensors (checksum %s) is not the reference's (%s): init-model changed; "
          "re-run %s", name, hex, want ? want : "?", script);
    return 0;
}

int tu_ref_run(const char *json_path, const char *bin_path, const char *tag, const char *script, const char *only,
               tu_case_fn fn, void *ctx) {
    tu_ref ref;
    char tmp[4096], summary[8192] = "";
    if (tu_ref_load(&ref, json_path, bin_path) < 0) return -1;
    if (tu_tmpdir(tmp, sizeof tmp, tag) != 0) {
        fprintf(stderr, "no scratch directory\n");
        tu_ref_free(&ref);
        return -1;
    }
    json_t *cases = json_object_get(ref.doc, "cases");
    for (size_t i = 0; i < json_array_size(cases); i++) {
        tu_ref_case c = {&ref, json_array_get(cases, i), i, NULL, NULL, ""};
        c.name = json_string_value(json_object_get(c.cs, "name"));
        if (only && *only && (!c.name || strcmp(only, c.name))) continue;
        char dir[4300];
        snprintf(dir, sizeof dir, "%s/%s", tmp, c.name ? c.name : "(no name)");
        c.dir = dir;
        if (tu_ref_regen(c.cs, dir, script) < 0) continue;
        fn(&c, ctx);
        if (c.line[0] && strlen(summary) + strlen(c.line) + 2 < sizeof summary) {
            strcat(summary, c.line);
            strcat(summary, "\n");
        }
    }
    fputs(summary, stderr);
    tu_rmdir(tmp);
    tu_ref_free(&ref);
    return 0;
}

int tu_ref_lora_base(json_t *ref, const char *dir, const char *flag, const char *value) {
    int rc = tu_regen_model_with(json_object_get(ref, "init_model_args"), flag, value, dir);
    if (rc < 0) fprintf(stderr, "base %s: %s\n", dir, zs_errmsg());
    return rc;
}

zs_model *tu_ref_lora_base_open(json_t *ref, const char *dir, const char *flag, const char *value, int resident) {
    if (tu_ref_lora_base(ref, dir, flag, value) < 0) return NULL;
    zs_model *m = NULL;
    if (zs_model_open(dir, NULL, &m) < 0 || (resident && zs_model_load_resident(m) < 0)) {
        fprintf(stderr, "base %s: %s\n", dir, zs_errmsg());
        zs_model_free(m);
        return NULL;
    }
    return m;
}

/* the reference scripts' sampler of element indices */
static uint64_t lcg(uint64_t s) { return s * 6364136223846793005ull + 1442695040888963407ull; }

void tu_ref_grads(const char *label, json_t *ts, int n_sample, const float *bin, long nbin, tu_grad_fn get, void *ctx,
                  double tol, tu_grad_sum *sum) {
    memset(sum, 0, sizeof *sum);
    sum->worst_name = "";
    long cap = 0;
    for (size_t i = 0; i < json_array_size(ts); i++) {
        long numel = (long)json_integer_value(json_object_get(json_array_get(ts, i), "numel"));
        if (numel > cap) cap = numel;
    }
    float *buf = tu_xcalloc(sizeof(float) * (size_t)(cap > 0 ? cap : 1));
    for (size_t i = 0; i < json_array_size(ts); i++) {
        json_t *e = json_array_get(ts, i);
        const char *tn = json_string_value(json_object_get(e, "name"));
        long numel = (long)json_integer_value(json_object_get(e, "numel"));
        long off = (long)json_integer_value(json_object_get(e, "offset"));
        long am = (long)json_integer_value(json_object_get(e, "argmax"));
        int full = json_is_true(json_object_get(e, "full"));
        double rnorm = json_real_value(json_object_get(e, "norm"));
        memset(buf, 0, sizeof(float) * (size_t)cap);
        long n = get(ctx, tn, buf, cap);
        CHECK(n == numel, "%s: %s maps to %ld of our values, transformers has %ld", label, tn, n, numel);
        if (n != numel || am < 0 || am >= n || off < 0 || off + (full ? n : 1 + n_sample) > nbin) continue;
        sum->total += n;
        double nn = 0;
        for (long k = 0; k < n; k++) nn += (double)buf[k] * buf[k];
        nn = sqrt(nn);
        double norm_rel = fabs(nn - rnorm) / (rnorm > 0 ? rnorm : 1.0);
        const float *ref = bin + off;
        double num = 0, den = 0;
        if (full) {
            for (long k = 0; k < n; k++) {
                double d = (double)buf[k] - ref[k];
                num += d * d;
                den += (double)ref[k] * ref[k];
            }
        } else { /* the largest element, then the samples */
            num = (buf[am] - (double)ref[0]) * (buf[am] - (double)ref[0]);
            den = (double)ref[0] * ref[0];
            uint64_t s = (uint64_t)i + 1;
            for (int k = 0; k < n_sample; k++) {
                s = lcg(s);
                long idx = (long)((s >> 33) % (uint64_t)n);
                double d = (double)buf[idx] - ref[1 + k];
                num += d * d;
                den += (double)ref[1 + k] * ref[1 + k];
            }
        }
        double el_rel = sqrt(num) / (den > 0 ? sqrt(den) : 1.0);
        double rel = fmax(norm_rel, el_rel);
        if (getenv("ZS_VERBOSE"))
            fprintf(stderr, "  %-52s |g| %.4e (ref %.4e)  norm rel %.2e  %s rel %.2e\n", tn, nn, rnorm, norm_rel,
                    full ? "all elements" : "samples", el_rel);
        CHECK(rel <= tol, "%s: gradient of %s: norm %.6e vs %.6e (rel %.2e), %s rel L2 %.2e", label, tn, nn, rnorm,
              norm_rel, full ? "every element" : "sampled elements", el_rel);
        if (!(rel <= sum->worst)) {
            sum->worst = rel;
            sum->worst_name = tn;
        }
    }
    free(buf);
}
