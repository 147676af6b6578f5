/* llamacpp.c — the comparison of zeroserve with llama.cpp's recorded outputs (llamacpp.h). */
#include "llamacpp.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "convert.h"
#include "device.h"
#include "init-model.h"
#include "quant-mix.h"
#include "testutil.h"

zs_engine *tu_lc_open(const char *name, const char *path, const char *wd) {
    zs_engine_opts o;
    zs_engine_opts_default(&o);
    o.model_dir = path;
    o.device = ZS_DEVICE_CPU;
    o.max_seqs = 1;
    o.max_context = 512;
    if (wd && !strcmp(wd, "q4_k_m")) { /* as --weight-dtype q4_k_m (engine-flags.c) */
        o.model.weight_dtype = ZS_Q4_K;
        o.model.quant_mix = ZS_QUANT_MIX_Q4_K_M;
    } else if (wd && strcmp(wd, "auto")) {
        int rc = zs_dtype_parse(wd, &o.model.weight_dtype);
        CHECK(rc == 0, "%s: --weight-dtype %s: %s", name, wd, zs_errmsg());
        if (rc) return NULL;
    }
    zs_engine *e = NULL;
    int rc = zs_engine_open(&o, &e);
    CHECK(rc == 0, "%s: open %s: %s", name, path, zs_errmsg());
    return rc ? NULL : e;
}

int tu_lc_greedy(zs_engine *e, const int32_t *p, size_t np, int n_new, tu_logit_log *lg, zs_gen_result *res) {
    zs_gen_params gp = {.max_tokens = n_new};
    zs_sampler_params_default(&gp.sampling);
    gp.sampling.temperature = 0;
    gp.on_logits = tu_on_logits;
    gp.logits_ud = lg;
    return zs_engine_generate(e, p, (int)np, &gp, NULL, NULL, res);
}

/* init-model's library calls, then convert's */
static int make_gguf(json_t *c, const char *name, const char *dir, const char *gguf) {
    const char *arch = json_string_value(json_object_get(c, "arch"));
    const char *dtype = json_string_value(json_object_get(c, "dtype"));
    zs_init_opts io;
    ZS_CHECK(zs_init_opts_default(arch, &io));
    io.seed = (uint64_t)json_integer_value(json_object_get(c, "seed"));
    io.random_norms = 1;
    json_t *is = json_object_get(c, "init_std");
    if (is) {
        io.init_std = (float)json_number_value(is);
        if (!(io.init_std > 0)) return zs_err(ZS_EINVAL, "%s: the reference's init_std is not positive", name);
    }
    char *set = json_dumps(json_object_get(c, "set"), JSON_COMPACT);
    if (!set) return zs_err(ZS_ENOMEM, "out of memory");
    int rc = zs_config_override(&io.cfg, set, name);
    free(set);
    ZS_CHECK(rc);
    ZS_CHECK(zs_init_model_write(&io, dir));
    zs_llama_ftype ft;
    ZS_CHECK(zs_llama_ftype_parse(dtype, &ft));
    zs_convert_opts o = {.model_dir = dir, .out_path = gguf, .ftype = ft, .name = "zs-peer"};
    zs_convert_result r;
    ZS_CHECK(zs_convert_run(&o, &r));
    zs_gguf_conv_close(r.plan);
    return 0;
}

int tu_lc_make_gguf(json_t *c, const char *tmp, const char *script, char *gguf, size_t n) {
    const char *name = json_string_value(json_object_get(c, "name"));
    char dir[4200], sum[32] = "";
    snprintf(dir, sizeof dir, "%s/%s", tmp, name);
    snprintf(gguf, n, "%s/%s.gguf", tmp, name);
    int rc = make_gguf(c, name, dir, gguf);
    CHECK(rc == 0, "%s: init-model + convert: %s", name, zs_errmsg());
    if (rc) return rc;
    const char *want = json_string_value(json_object_get(c, "gguf_checksum"));
    CHECK(tu_file_checksum(gguf, 8, sum, sizeof sum) == 0 && want && !strcmp(sum, want),
          "%s: the GGUF file (checksum %s) is not the one llama.cpp ran (%s): init-model or convert changed; "
          "regenerate the reference with %s", name, sum, want ? want : "?", script);
    return 0;
}

/* the larger of *worst and d; NaN sticks */
static void worse(double *worst, double d) {
    if (!(d <= *worst)) *worst = d;
}

void tu_lc_compare(const char *label, zs_engine *e, const int32_t *p, size_t np, json_t *c, double tol, int min_steps) {
    json_t *ref_ids = json_object_get(c, "ids"), *steps = json_object_get(c, "steps");
    json_t *last = json_object_get(c, "last_logits");
    int n_ref = (int)json_array_size(ref_ids);
    tu_logit_log lg = {0};
    zs_gen_result res = {0};
    int rc = tu_lc_greedy(e, p, np, n_ref, &lg, &res);
    CHECK(rc == 0, "%s: generate: %s", label, zs_errmsg());
    double worst_last = 0, worst = 0, worst_lse = 0;
    int compared = 0, tie_stop = 0;
    if (last) { /* the prompt's last position: its whole row */
        CHECK(rc != 0 || (lg.n >= 1 && (size_t)lg.vocab == json_array_size(last) && lg.vocab > 1),
              "%s: %d logits rows of %d, the reference's last row has %zu", label, lg.n, lg.vocab,
              json_array_size(last));
        if (rc == 0 && lg.n >= 1 && (size_t)lg.vocab == json_array_size(last))
            for (int v = 0; v < lg.vocab; v++)
                worse(&worst_last, fabs(lg.rows[v] - json_number_value(json_array_get(last, (size_t)v))));
    }
    for (int i = 0; rc == 0 && i < n_ref && i < lg.n; i++) {
        json_t *st = json_array_get(steps, (size_t)i);
        json_t *tid = json_object_get(st, "top_ids"), *tl = json_object_get(st, "top_logits");
        const float *row = lg.rows + (size_t)i * lg.vocab;
        for (size_t k = 0; k < json_array_size(tid); k++)
            worse(&worst, fabs(row[json_integer_value(json_array_get(tid, k))] - json_number_value(json_array_get(tl, k))));
        double m = row[0], s = 0;
        for (int v = 1; v < lg.vocab; v++) m = row[v] > m ? row[v] : m;
        for (int v = 0; v < lg.vocab; v++) s += exp((double)row[v] - m);
        worse(&worst_lse, fabs(m + log(s) - json_number_value(json_object_get(st, "logsumexp"))));
        compared++;
        int want = (int)json_integer_value(json_array_get(ref_ids, (size_t)i));
        double margin = json_number_value(json_array_get(tl, 0)) - json_number_value(json_array_get(tl, 1));
        if (i == res.n_generated && res.finish == ZS_FINISH_STOP && zs_tokenizer_is_eos(zs_engine_tokenizer(e), want))
            break; /* both stopped at the end-of-sequence token (zeroserve does not list it) */
        if (i >= res.n_generated || res.ids[i] != want) {
            if (margin < 2 * tol) tie_stop = 1;
            else CHECK(0, "%s: step %d: greedy id %d, llama.cpp %d (its margin %.4f)", label, i,
                       i < res.n_generated ? res.ids[i] : -1, want, margin);
            break;
        }
    }
    if (last)
        CHECK(worst_last <= tol, "%s: the prompt's last logits differ from llama.cpp's by %.3g (tolerance %.3g)", label,
              worst_last, tol);
    CHECK(worst <= tol, "%s: logits differ from llama.cpp's by %.3g (tolerance %.3g)", label, worst, tol);
    CHECK(worst_lse <= tol, "%s: logsumexp differs by %.3g (tolerance %.3g)", label, worst_lse, tol);
    CHECK(compared >= min_steps || (compared == n_ref && !tie_stop), "%s: only %d steps compared", label, compared);
    char lastd[64] = "";
    if (last) snprintf(lastd, sizeof lastd, ", last-position logits max |d| %.2g", worst_last);
    fprintf(stderr, "%-22s %2d/%2d steps equal%s%s, steps max |dlogit| %.2g, |dlogsumexp| %.2g (tolerance %.3g)\n",
            label, compared - tie_stop, n_ref, tie_stop ? " (then a near tie)" : "", lastd, worst, worst_lse, tol);
    free(res.ids);
    free(lg.rows);
}

void tu_lc_features(const char *name, json_t *c, double tol, double margin) {
    json_t *fs = json_object_get(c, "features");
    for (size_t k = 0; k < json_array_size(fs); k++) {
        json_t *f = json_array_get(fs, k);
        double d = json_number_value(json_object_get(f, "delta"));
        const char *what = json_string_value(json_object_get(f, "what"));
        CHECK(d >= margin * tol, "%s: %s moves llama.cpp's logits by only %.3g", name, what, d);
        fprintf(stderr, "%-22s   %s: llama.cpp's logits move by %.3g (%.0f tolerances)\n", "", what, d, d / tol);
    }
}
