/* bench.h — `zeroserve bench`: prefill and decode throughput of a model, with the bound it is
 * measured against (host memory read bandwidth) measured in the same run. */
#ifndef ZS_BENCH_H
#define ZS_BENCH_H

#include "engine.h"

typedef struct {
    zs_engine_opts engine;
    int runs;           /* repetitions; medians are reported (default 5) */
    int prefill_tokens; /* prompt length for the prefill figure (default 128) */
    int decode_tokens;  /* tokens per decode run (default 32) */
    int threads;        /* threads for the bandwidth probe (default: online CPUs) */
    const char *json_out; /* optional: write the figures as JSON here */
    int lora_adapters;  /* > 0: zs_bench_lora with this many adapters */
    int lora_r;         /* their rank (default 16) */
    int lora_seqs;      /* sequences decoding together (default 16) */
    int moe;            /* zs_bench_moe */
    int speculative;    /* zs_bench_spec */
    int spec_tokens;    /* its drafts per sequence and step (0: chosen from the measured costs) */
    const char *draft_model; /* with speculative: a draft model proposes (spec-draft.c), not prompt lookup */
    zs_model_opts draft;     /* its weight dtype (--draft-weight-dtype) */
} zs_bench_opts;

void zs_bench_opts_default(zs_bench_opts *o);
/* Measures host memory read bandwidth (GB/s: the median over runs of the fastest of 3 passes)
 * with a multi-threaded streaming read of a buffer of `bytes` on 2 MiB pages where allowed. */
int zs_bench_mem_bw(size_t bytes, int threads, int runs, double *gbps);
/* Throughput of a resident model against host memory bandwidth. */
int zs_bench_run(const zs_bench_opts *o);
/* Weight streaming with --offload/--ranks against the tier's bound, and the overlap figure
 * (bench-offload.c). */
int zs_bench_offload(const zs_bench_opts *o);
/* Decode tokens/s of a batch mixing lora_adapters LoRA adapters against the base alone
 * (bench-lora.c). */
int zs_bench_lora(const zs_bench_opts *o);
/* The median of n values (sorts v). */
double zs_bench_median(double *v, int n);
/* One decode run (bench-lora.c): S sequences prefilled with np tokens each (one forward call per
 * sequence), then nd decode steps of S tokens; *tok_s the decode tokens/s. ad NULL: every row
 * through the base, else sequence s through ad[s % n_ad]. logits: S x vocab floats. */
int zs_bench_decode_batch(zs_engine *e, int S, int np, int nd, zs_lora *const *ad, int n_ad, float *logits,
                          double *tok_s);
/* The aggregate raw io_uring O_DIRECT read rate of the ranks' shard files in dir, read at once
 * (bench-offload.c). */
int zs_bench_raw_bound(const char *dir, int ranks, const zs_gather_opts *g, double *gbps);
/* `bench --moe`: a mixture of experts' decode at batch 1, 8 and 32, routed-only against the
 * whole-block baseline (--moe-gather-all), interleaved; expert bytes per token, the cache's hit
 * rate and the stream rate against the tier's bound (bench-moe.c). */
int zs_bench_moe(const zs_bench_opts *o);
/* `bench --speculative`: greedy decode at batch 1 of a copying prompt through the scheduler, plain
 * against prompt lookup (or draft_model's drafts), interleaved: tokens/s, tokens per pass, the pass time against the tier's
 * I/O bound, and whether the outputs are identical (ZS_EINVAL when they are not; bench-spec.c). */
int zs_bench_spec(const zs_bench_opts *o);

#endif
