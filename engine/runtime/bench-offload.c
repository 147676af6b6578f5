/* bench-offload.c — `zeroserve bench --offload nvme|cpu --ranks N`: weight streaming during
 * decode against the bound of its tier measured in the same run (raw io_uring O_DIRECT reads of
 * the same shard files for nvme, host memory bandwidth for cpu), and the overlap figure: decode
 * step time / max(I/O-only pass time, compute-only step time). */
#include <jansson.h>
#include <pthread.h>
#include <string.h>

#include "bench.h"
#include "common.h"
#include "store.h"

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double med(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

typedef struct { char path[4200]; int qd; size_t bs; double gbps; int rc; char err[256]; } raw_arg;

static void *raw_main(void *p) {
    raw_arg *a = p;
    a->rc = zs_store_raw_read_gbps(a->path, 0, a->qd, a->bs, &a->gbps);
    if (a->rc < 0) snprintf(a->err, sizeof a->err, "%s", zs_errmsg());
    return NULL;
}

/* Aggregate raw read GB/s of all rank files read at once (as the ranks read them). */
int zs_bench_raw_bound(const char *dir, int ranks, const zs_gather_opts *g, double *gbps) {
    raw_arg a[64];
    pthread_t th[64];
    if (ranks > 64) ranks = 64;
    for (int r = 0; r < ranks; r++) {
        memset(&a[r], 0, sizeof a[r]);
        snprintf(a[r].path, sizeof a[r].path, "%s/rank%d.shards", dir, r);
        a[r].qd = g->queue_depth ? g->queue_depth : 32;
        a[r].bs = g->block_size ? g->block_size : (size_t)1 << 20;
        pthread_create(&th[r], NULL, raw_main, &a[r]);
    }
    for (int r = 0; r < ranks; r++) pthread_join(th[r], NULL);
    double sum = 0;
    for (int r = 0; r < ranks; r++) {
        if (a[r].rc < 0) return zs_err(a[r].rc, "%s", a[r].err);
        sum += a[r].gbps;
    }
    /* the files are read at once: the aggregate is the sum of each reader's own rate, which
     * leaves out its set-up (ring, buffer registration) */
    *gbps = sum;
    return 0;
}

static int decode_rate(zs_engine *e, int nd, int runs, double *tok_s) {
    const zs_model_config *c = zs_model_config_get(zs_engine_model(e));
    int32_t prompt[8];
    for (int i = 0; i < 8; i++) prompt[i] = (int32_t)((i * 7919 + 13) % c->vocab_size);
    zs_gen_params gp;
    memset(&gp, 0, sizeof gp);
    zs_sampler_params_default(&gp.sampling);
    gp.sampling.temperature = 0;
    gp.max_tokens = nd + 1;
    gp.ignore_eos = 1;
    double *v = calloc((size_t)runs, sizeof *v);
    if (!v) return zs_err(ZS_ENOMEM, "out of memory");
    for (int r = 0; r <= runs; r++) {
        zs_gen_result res;
        int rc = zs_engine_generate(e, prompt, 8, &gp, NULL, NULL, &res);
        if (rc < 0) { free(v); return rc; }
        free(res.ids);
        if (r > 0) v[r - 1] = (res.n_generated - 1) / res.t_decode;
    }
    *tok_s = med(v, runs);
    free(v);
    return 0;
}

int zs_bench_offload(const zs_bench_opts *o) {
    int runs = o->runs > 0 ? o->runs : 5, nd = o->decode_tokens, rc;
    int tier = o->engine.gather.tier, ranks = o->engine.ranks;
    zs_engine *e;
    ZS_CHECK(zs_engine_open(&o->engine, &e));
    zs_model *m = zs_engine_model(e);
    const zs_model_config *c = zs_model_config_get(m);
    char arch[64]; /* kept: the engine (and its config) is freed before the JSON is written */
    snprintf(arch, sizeof arch, "%s", c->arch_name);
    /* bytes one pass streams from the tier, all ranks together */
    int *order = malloc((size_t)zs_model_pass_order_max(m) * sizeof(int));
    if (!order) { zs_engine_free(e); return zs_err(ZS_ENOMEM, "out of memory"); }
    int n_order = zs_model_pass_order(m, order);
    double pass_bytes = 0; /* a mixture of experts' routed experts come on top (bench --moe) */
    for (int i = 0; i < n_order; i++)
        if (order[i] >= 0) pass_bytes += (double)zs_partition_shard_bytes(m, order[i], ranks) * ranks;
    free(order);
    zs_gather_stats st;
    zs_world_stats(zs_engine_world(e), &st);
    fprintf(stderr, "bench: %s, %.1fM parameters, %d rank(s), offload %s, %.1f MB streamed per pass, live budget %.1f MB\n",
            c->arch_name, (double)zs_model_param_count(m) / 1e6, ranks, zs_offload_name(tier), pass_bytes / 1e6,
            (double)st.live_limit / 1e6);

    /* the bound of the tier, measured now */
    double *b = calloc((size_t)runs * 2, sizeof *b), *io = b + runs;
    if (!b) { zs_engine_free(e); return zs_err(ZS_ENOMEM, "out of memory"); }
    for (int r = 0; r < runs; r++) {
        rc = tier == ZS_OFFLOAD_NVME ? zs_bench_raw_bound(o->engine.nvme_path, ranks, &o->engine.gather, &b[r])
                                     : zs_bench_mem_bw((size_t)512 << 20, o->threads, 1, &b[r]);
        if (rc < 0) goto fail;
    }
    double bound = med(b, runs);
    /* I/O-only: whole passes with nothing to compute (every rank still reads and gathers) */
    for (int r = 0; r <= runs; r++) {
        double t0 = zs_now();
        if ((rc = zs_world_step(zs_engine_world(e), NULL, NULL)) < 0) goto fail;
        if (r > 0) io[r - 1] = zs_now() - t0;
    }
    double io_pass = med(io, runs);
    double dec;
    if ((rc = decode_rate(e, nd, runs, &dec)) < 0) goto fail;
    zs_engine_free(e);
    e = NULL;
    /* compute-only: the same model resident, one rank */
    zs_engine_opts ro = o->engine;
    ro.ranks = 1;
    ro.gather.tier = ZS_OFFLOAD_NONE;
    ro.gather.max_live_bytes = 0;
    double dec_res;
    if ((rc = zs_engine_open(&ro, &e)) < 0) goto fail;
    if ((rc = decode_rate(e, nd, runs, &dec_res)) < 0) goto fail;
    zs_engine_free(e);
    e = NULL;

    double stream = pass_bytes * dec / 1e9, step = 1.0 / dec, comp = 1.0 / dec_res;
    double overlap = step / ZS_MAX(io_pass, comp);
    printf("%-44s %8.3f GB/s\n", tier == ZS_OFFLOAD_NVME ? "raw io_uring O_DIRECT read (same files):" : "host memory bandwidth:", bound);
    printf("%-44s %8.3f GB/s  = %.2f x the bound\n", "weight stream during decode:", stream, stream / bound);
    printf("%-44s %8.2f tokens/s\n", "decode, batch 1:", dec);
    printf("%-44s %8.1f ms\n", "decode step:", step * 1e3);
    printf("%-44s %8.1f ms  (%.3f GB/s)\n", "I/O-only pass:", io_pass * 1e3, pass_bytes / io_pass / 1e9);
    printf("%-44s %8.1f ms\n", "compute-only step (resident, 1 rank):", comp * 1e3);
    printf("%-44s %8.2f  (step / max(I/O-only, compute-only))\n", "overlap figure:", overlap);
    rc = 0;
    if (o->json_out) {
        json_t *j = json_pack("{s:s, s:i, s:s, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:i}", "model", arch,
                              "ranks", ranks, "offload", zs_offload_name(tier), "bound_gbps", bound,
                              "stream_gbps", stream, "stream_ratio", stream / bound, "decode_tok_s", dec,
                              "io_pass_s", io_pass, "compute_step_s", comp, "overlap", overlap, "runs", runs);
        if (j && json_dump_file(j, o->json_out, JSON_INDENT(2)) != 0) rc = zs_err(ZS_EIO, "bench: cannot write %s", o->json_out);
        if (!j) rc = zs_err(ZS_ENOMEM, "bench: cannot build the JSON figures");
        json_decref(j);
    }
    free(b);
    return rc;
fail:
    free(b);
    zs_engine_free(e);
    return rc;
}
