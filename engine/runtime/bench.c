/* bench.c — throughput benchmark: prefill tokens/s, decode tokens/s at batch 1, and decode
 * weight-read GB/s as a ratio to the host memory bandwidth measured in the same run. */
#include "bench.h"

#include <jansson.h>
#include <string.h>
#include <unistd.h>

#include "common.h"

void zs_bench_opts_default(zs_bench_opts *o) {
    memset(o, 0, sizeof *o);
    zs_engine_opts_default(&o->engine);
    o->engine.model.embed_lookup = 1; /* inference engines: embedding rows from host tables */
    o->runs = 5;
    o->prefill_tokens = 128;
    o->decode_tokens = 32;
}

static int count_cb(void *ud, const char *s, size_t n) { (void)ud; (void)s; (void)n; return 0; }

int zs_bench_run(const zs_bench_opts *o) {
    zs_engine *e;
    ZS_CHECK(zs_engine_open(&o->engine, &e));
    zs_model *m = zs_engine_model(e);
    const zs_model_config *c = zs_model_config_get(m);
    int runs = o->runs > 0 ? o->runs : 5;
    int np = ZS_MIN(o->prefill_tokens, zs_engine_context(e) - o->decode_tokens - 1);
    int nd = o->decode_tokens;
    if (np < 1 || nd < 1) {
        zs_engine_free(e);
        return zs_err(ZS_EINVAL, "bench: context %d too short for %d prefill + %d decode tokens",
                      zs_engine_context(e), o->prefill_tokens, o->decode_tokens);
    }
    /* weight bytes one decode step reads: every bucket, except that the embedding lookup reads
     * one row of the token (and position) tables; the table is read in full only as a tied head */
    size_t wbytes = zs_model_weight_bytes(m);
    const zs_bucket_layout *E = zs_model_layout(m, zs_bucket_embed());
    size_t dbytes = wbytes - E->slot[ZS_R_POS_EMB].nbytes;
    if (!c->tied_embeddings) dbytes -= E->slot[ZS_R_TOK_EMB].nbytes;
    size_t probe_bytes = ZS_MAX((size_t)512 << 20, ZS_MIN(wbytes, (size_t)1 << 30));
    int rc = 0;

    int32_t *prompt = malloc((size_t)np * sizeof(int32_t));
    double *tp = calloc((size_t)runs * 4, sizeof(double)), *td = tp + runs, *tb = td + runs, *tr = tb + runs;
    if (!prompt || !tp) { rc = zs_err(ZS_ENOMEM, "out of memory"); goto done; }
    for (int i = 0; i < np; i++) prompt[i] = (int32_t)((i * 7919 + 13) % c->vocab_size);
    zs_gen_params gp;
    memset(&gp, 0, sizeof gp);
    zs_sampler_params_default(&gp.sampling);
    gp.sampling.temperature = 0;
    gp.max_tokens = nd + 1; /* the first token comes from the prefill logits */
    gp.ignore_eos = 1;
    fprintf(stderr, "bench: %s, %.1fM parameters, %s weights (%.2f GB), prefill %d tokens, decode %d tokens, %d runs\n",
            c->arch_name, (double)zs_model_param_count(m) / 1e6, zs_dtype_name(zs_model_layout(m, 1)->slot[ZS_R_WQ].dtype),
            (double)wbytes / 1e9, np, nd, runs);
    for (int r = 0; r < runs + 1; r++) { /* run 0 warms up */
        zs_gen_result res;
        if ((rc = zs_engine_generate(e, prompt, np, &gp, count_cb, NULL, &res)) < 0) goto done;
        free(res.ids);
        if (r == 0) continue;
        tp[r - 1] = np / res.t_prefill;
        td[r - 1] = (res.n_generated - 1) / res.t_decode;
        /* the bound, measured right after each run: this machine's bandwidth drifts with load */
        if ((rc = zs_bench_mem_bw(probe_bytes, o->threads, 1, &tb[r - 1])) < 0) goto done;
        tr[r - 1] = td[r - 1] * (double)dbytes / 1e9 / tb[r - 1];
    }
    double pre = zs_bench_median(tp, runs), dec = zs_bench_median(td, runs), bw = zs_bench_median(tb, runs), ratio = zs_bench_median(tr, runs);
    double wgbps = dec * (double)dbytes / 1e9;
    printf("memory bandwidth (measured):   %8.2f GB/s\n", bw);
    printf("prefill:                       %8.1f tokens/s  (%d tokens)\n", pre, np);
    printf("decode, batch 1:               %8.2f tokens/s\n", dec);
    printf("decode weight read:            %8.2f GB/s  (%.2f GB per token)\n", wgbps, (double)dbytes / 1e9);
    printf("decode read / memory bandwidth: %7.2f  (median of the per-run ratios)\n", ratio);
    if (o->json_out) {
        json_t *j = json_pack("{s:s, s:f, s:f, s:f, s:f, s:f, s:f, s:i, s:i}", "model", c->arch_name,
                              "params_millions", (double)zs_model_param_count(m) / 1e6,
                              "mem_bw_gbps", bw, "prefill_tok_s", pre, "decode_tok_s", dec,
                              "decode_weight_gbps", wgbps, "decode_bw_ratio", ratio, "runs", runs,
                              "prefill_tokens", np);
        if (j && json_dump_file(j, o->json_out, JSON_INDENT(2)) != 0)
            rc = zs_err(ZS_EIO, "bench: cannot write %s", o->json_out);
        json_decref(j);
    }
done:
    free(prompt);
    free(tp);
    zs_engine_free(e);
    return rc;
}
