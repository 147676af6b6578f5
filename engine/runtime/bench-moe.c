/* bench-moe.c — `zeroserve bench --moe`: decode of a mixture of experts at batch 1, 8 and 32
 * with only the routed experts gathered, against the same model gathering every expert of each
 * MoE layer in every pass (--moe-gather-all, the whole-block gather DeepSpeed ZeRO-3 does), the
 * two engines open at once and their runs interleaved. Per batch: decode tokens/s of each (median
 * of the runs) and their ratio, expert bytes gathered per token against the whole block's, the
 * expert cache's hit rate, and the rate the tier streamed at during decode against its bound
 * measured in the same run (raw io_uring O_DIRECT reads of the same shard files for nvme, host
 * memory bandwidth otherwise). */
#include <jansson.h>
#include <string.h>

#include "bench.h"
#include "common.h"

typedef struct {
    double tok_s, exp_per_tok, block_per_tok, hit, tier_gbps;
} moe_fig;

/* One decode run of S sequences on e, with the gather counters' deltas. */
static int run_one(zs_engine *e, int S, int np, int nd, float *logits, moe_fig *f) {
    zs_gather_stats a, b;
    zs_world_stats(zs_engine_world(e), &a);
    double t0 = zs_now();
    int rc = zs_bench_decode_batch(e, S, np, nd, NULL, 0, logits, &f->tok_s);
    double dt = zs_now() - t0;
    if (rc < 0) return rc;
    zs_world_stats(zs_engine_world(e), &b);
    double tokens = (double)S * (np + nd); /* prefill and decode together: the counters see both */
    long hits = b.expert_hits - a.expert_hits, looked = hits + b.expert_misses - a.expert_misses;
    f->exp_per_tok = (double)(b.expert_bytes - a.expert_bytes) / tokens;
    f->block_per_tok = (double)(b.expert_block_bytes - a.expert_block_bytes) / tokens;
    f->hit = looked ? (double)hits / (double)looked : 0;
    f->tier_gbps = (double)(b.bytes_nvme - a.bytes_nvme + b.bytes_host - a.bytes_host) / dt / 1e9;
    return 0;
}

int zs_bench_moe(const zs_bench_opts *o) {
    static const int batches[3] = {1, 8, 32};
    int runs = o->runs > 0 ? o->runs : 5, nd = o->decode_tokens, np = ZS_MIN(o->prefill_tokens, 16), rc = 0;
    int tier = o->engine.gather.tier, ranks = o->engine.ranks;
    zs_engine_opts eo = o->engine;
    eo.max_seqs = 32;
    eo.max_batch_tokens = ZS_MAX(eo.max_batch_tokens, 32);
    eo.gather.expert_gather_all = 0;
    zs_engine_opts ea = eo;
    ea.gather.expert_gather_all = 1;
    zs_engine *er = NULL, *eb = NULL;
    moe_fig *fr = calloc((size_t)runs * 3 * 2, sizeof *fr), *fa = fr ? fr + runs * 3 : NULL;
    double *v = calloc((size_t)runs * 8, sizeof *v), *bound = v ? v + runs * 6 : NULL;
    float *logits = NULL;
    json_t *jb = json_array();
    if (!fr || !v || !jb) {
        rc = zs_err(ZS_ENOMEM, "out of memory");
        goto done;
    }
    if ((rc = zs_engine_open(&eo, &er)) < 0) goto done;
    if ((rc = zs_engine_open(&ea, &eb)) < 0) goto done;
    zs_model *m = zs_engine_model(er);
    const zs_model_config *c = zs_model_config_get(m);
    if (c->n_experts <= 0) {
        rc = zs_err(ZS_EINVAL, "bench --moe: %s is not a mixture of experts", c->arch_name);
        goto done;
    }
    if (np + nd + 1 > zs_engine_context(er)) {
        rc = zs_err(ZS_EINVAL, "bench: context %d too short for %d + %d tokens", zs_engine_context(er), np, nd);
        goto done;
    }
    logits = malloc((size_t)32 * (size_t)c->vocab_size * sizeof(float));
    if (!logits) {
        rc = zs_err(ZS_ENOMEM, "out of memory");
        goto done;
    }
    zs_gather_stats st;
    zs_world_stats(zs_engine_world(er), &st);
    fprintf(stderr, "bench: %s, %.1fM parameters, %d experts (top %d) of %.2f MB, %d rank(s), offload %s, expert cache "
            "%.1f MB, %d interleaved runs of %d decode tokens\n", c->arch_name, (double)zs_model_param_count(m) / 1e6,
            c->n_experts, c->n_experts_used, (double)zs_model_expert_bytes(m) / 1e6, ranks, zs_offload_name(tier),
            (double)st.expert_cache_limit / 1e6, runs, nd);
    moe_fig warm;
    if ((rc = run_one(er, 1, np, 2, logits, &warm)) < 0 || (rc = run_one(eb, 1, np, 2, logits, &warm)) < 0) goto done;
    for (int r = 0; r < runs; r++) {
        rc = tier == ZS_OFFLOAD_NVME ? zs_bench_raw_bound(o->engine.nvme_path, ranks, &o->engine.gather, &bound[r])
                                     : zs_bench_mem_bw((size_t)512 << 20, o->threads, 1, &bound[r]);
        if (rc < 0) goto done;
        for (int i = 0; i < 3; i++) {
            if ((rc = run_one(er, batches[i], np, nd, logits, &fr[i * runs + r])) < 0) goto done;
            if ((rc = run_one(eb, batches[i], np, nd, logits, &fa[i * runs + r])) < 0) goto done;
        }
    }
    double bd = zs_bench_median(bound, runs);
    printf("%-46s %8.3f GB/s\n", tier == ZS_OFFLOAD_NVME ? "raw io_uring O_DIRECT read (same files):" : "host memory bandwidth:", bd);
    printf("%-7s %12s %12s %7s %14s %14s %8s %10s %10s\n", "batch", "routed tok/s", "all tok/s", "ratio",
           "routed MB/tok", "block MB/tok", "hit rate", "tier GB/s", "x bound");
    for (int i = 0; i < 3; i++) {
        moe_fig *a = fr + i * runs, *b = fa + i * runs;
        double *t = v, *u = v + runs, *q = v + 2 * runs, *x = v + 3 * runs, *y = v + 4 * runs, *h = v + 5 * runs;
        for (int r = 0; r < runs; r++) {
            t[r] = a[r].tok_s;
            u[r] = b[r].tok_s;
            q[r] = a[r].tok_s / b[r].tok_s;
            x[r] = a[r].exp_per_tok;
            y[r] = a[r].block_per_tok;
            h[r] = a[r].hit;
        }
        double tr = zs_bench_median(t, runs), ta = zs_bench_median(u, runs), ratio = zs_bench_median(q, runs);
        double xe = zs_bench_median(x, runs), xb = zs_bench_median(y, runs), hit = zs_bench_median(h, runs);
        for (int r = 0; r < runs; r++) t[r] = a[r].tier_gbps;
        double gb = zs_bench_median(t, runs);
        printf("%-7d %12.2f %12.2f %7.2f %14.3f %14.3f %8.3f %10.3f %10.2f\n", batches[i], tr, ta, ratio, xe / 1e6,
               xb / 1e6, hit, gb, gb / bd);
        json_array_append_new(jb, json_pack("{s:i, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}", "batch", batches[i],
                                            "routed_tok_s", tr, "gather_all_tok_s", ta, "ratio", ratio,
                                            "expert_bytes_per_token", xe, "block_bytes_per_token", xb, "hit_rate", hit,
                                            "tier_gbps", gb, "tier_ratio", gb / bd));
    }
    if (o->json_out) {
        json_t *j = json_pack("{s:s, s:i, s:s, s:f, s:i, s:O}", "model", c->arch_name, "ranks", ranks, "offload",
                              zs_offload_name(tier), "bound_gbps", bd, "runs", runs, "batches", jb);
        if (!j) rc = zs_err(ZS_ENOMEM, "bench: cannot build the JSON figures");
        else if (json_dump_file(j, o->json_out, JSON_INDENT(2)) != 0) rc = zs_err(ZS_EIO, "bench: cannot write %s", o->json_out);
        json_decref(j);
    }
done:
    json_decref(jb);
    free(logits);
    free(fr);
    free(v);
    zs_engine_free(er);
    zs_engine_free(eb);
    return rc;
}
