/* main.c — the zeroserve command line: serve, generate, train, export, convert, init-model,
 * make-corpus, bench, perplexity, plan. Under mpirun every process runs the same command line
 * (cluster.h): serve, generate and perplexity run on process 0 with the others following, train
 * runs on every process. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "bench.h"
#include "cli.h"
#include "cluster.h"
#include "common.h"
#include "engine-flags.h"
#include "engine.h"
#include "init-cmd.h"
#include "init-model.h"

int zs_cmd_train(int argc, char **argv);  /* train-cmd.c */
int zs_cmd_export(int argc, char **argv); /* train-cmd.c */
int zs_cmd_perplexity(int argc, char **argv); /* perplexity-cmd.c */
int zs_cmd_convert(int argc, char **argv); /* convert-cmd.c */
int zs_cmd_plan(int argc, char **argv); /* plan-cmd.c */

#include "corpus.h"

static int cmd_make_corpus(int argc, char **argv) {
    const char *out = NULL;
    int n = 2000;
    uint64_t seed = 1;
    zs_opt opts[] = {
        {"out", ZS_OPT_STR, &out, "output JSONL file  [required]"},
        {"stories", ZS_OPT_INT, &n, "number of stories (default 2000)"},
        {"seed", ZS_OPT_U64, &seed, "random seed (default 1)"},
    };
    int n_opts = sizeof opts / sizeof opts[0];
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help")) {
            zs_cli_usage("make-corpus", "Writes simple generated stories as JSONL training data.", opts, n_opts);
            return 0;
        }
    ZS_CHECK(zs_cli_parse(argc, argv, opts, n_opts));
    if (!out) return zs_err(ZS_EINVAL, "--out is required");
    return zs_corpus_write(out, n, seed);
}

static int want_help(int argc, char **argv) {
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return 1;
    return 0;
}

static int print_cb(void *ud, const char *s, size_t n) {
    (void)ud;
    fwrite(s, 1, n, stdout);
    fflush(stdout);
    return 0;
}

static void write_logits(void *ud, const float *logits, int vocab) {
    FILE *f = ud;
    fwrite(logits, sizeof(float), (size_t)vocab, f);
}

/* Commands that make no sense as several processes. */
static int single_process(const char *cmd) {
    if (zs_cluster_size() > 1)
        return zs_err(ZS_EUNSUPPORTED, "%s runs as one process; start it without mpirun (serve, generate and train run under mpirun)", cmd);
    return 0;
}

static int cmd_generate(int argc, char **argv) {
    const char *prompt = NULL, *stop = NULL, *logits_out = NULL;
    zs_gen_params gp;
    memset(&gp, 0, sizeof gp);
    zs_sampler_params_default(&gp.sampling);
    gp.max_tokens = 64;
    int ignore_eos = 0, stats = 0, ids = 0;
    uint64_t seed = 0;
    zs_engine_flags ef;
    zs_engine_flags_init(&ef);
    zs_opt opts[16 + ZS_ENGINE_FLAG_COUNT] = {
        {"prompt", ZS_OPT_STR, &prompt, "prompt text  [required]"},
        {"max-tokens", ZS_OPT_INT, &gp.max_tokens, "new tokens at most (default 64)"},
        {"temperature", ZS_OPT_FLOAT, &gp.sampling.temperature, "0 = greedy (default 1)"},
        {"top-p", ZS_OPT_FLOAT, &gp.sampling.top_p, "nucleus sampling (default 1 = off)"},
        {"top-k", ZS_OPT_INT, &gp.sampling.top_k, "keep the k most likely tokens (default 0 = off)"},
        {"seed", ZS_OPT_U64, &seed, "random seed (default 0)"},
        {"stop", ZS_OPT_STR, &stop, "stop string"},
        {"ignore-eos", ZS_OPT_FLAG, &ignore_eos, "keep generating after the end-of-sequence token"},
        {"stats", ZS_OPT_FLAG, &stats, "print timing and gather counters to stderr"},
        {"print-ids", ZS_OPT_FLAG, &ids, "print the generated token ids to stderr"},
        {"logits-out", ZS_OPT_STR, &logits_out, "write the logits of every sampled position to this file (f32)"},
    };
    int n_opts = zs_engine_flags_table(&ef, opts, 11);
    if (want_help(argc, argv)) {
        zs_cli_usage("generate", "Generates text from a prompt and prints it as it is produced.", opts, n_opts);
        return 0;
    }
    ZS_CHECK(zs_cli_parse(argc, argv, opts, n_opts));
    if (!ef.model) return zs_err(ZS_EINVAL, "--model is required");
    if (!prompt) return zs_err(ZS_EINVAL, "--prompt is required");
    gp.sampling.seed = seed;
    gp.ignore_eos = ignore_eos;
    if (stop) { gp.stop = &stop; gp.n_stop = 1; }
    zs_engine_opts eo;
    zs_engine_opts_default(&eo);
    eo.max_seqs = 1;
    ZS_CHECK(zs_engine_flags_apply(&ef, &eo));
    eo.model.embed_lookup = 1; /* an inference engine: embedding rows from host tables */
    if (eo.kv_offload != ZS_OFFLOAD_NONE)
        zs_log_warn("--kv-offload: generate runs one sequence, which never gives up its room; the tier stays unused "
                    "(it serves `serve`)");
    eo.kv_whole = 1;
    zs_engine *e;
    ZS_CHECK(zs_engine_open(&eo, &e));
    if (zs_cluster_follower()) {
        int frc = zs_engine_follow(e);
        zs_engine_free(e);
        return frc;
    }
    FILE *lf = NULL;
    if (logits_out && !(lf = fopen(logits_out, "wb"))) {
        zs_engine_free(e);
        return zs_err(ZS_EIO, "--logits-out %s: cannot create it", logits_out);
    }
    gp.on_logits = lf ? write_logits : NULL;
    gp.logits_ud = lf;
    int32_t *pids = NULL;
    size_t np = 0;
    int rc = zs_tokenizer_encode(zs_engine_tokenizer(e), prompt, strlen(prompt), 1, &pids, &np);
    if (rc == 0 && np == 0) rc = zs_err(ZS_EINVAL, "the prompt encodes to no tokens");
    zs_gen_result res;
    if (rc == 0) {
        fputs(prompt, stdout);
        fflush(stdout);
        rc = zs_engine_generate(e, pids, (int)np, &gp, print_cb, NULL, &res);
        fputc('\n', stdout);
    }
    if (rc == 0) {
        if (ids) {
            for (int i = 0; i < res.n_generated; i++) fprintf(stderr, "%s%d", i ? " " : "", res.ids[i]);
            fputc('\n', stderr);
        }
        if (stats) {
            fprintf(stderr, "prompt %d tokens in %.3f s (%.1f tok/s); generated %d tokens in %.3f s (%.2f tok/s); finish: %s\n",
                    res.n_prompt, res.t_prefill, res.n_prompt / res.t_prefill, res.n_generated, res.t_decode,
                    res.n_generated > 1 ? (res.n_generated - 1) / res.t_decode : 0.0,
                    res.finish == ZS_FINISH_STOP ? "stop" : "length");
            zs_gather_stats gs;
            zs_world_stats(zs_engine_world(e), &gs);
            fprintf(stderr, "gather: ranks %d, nvme %.1f MB, host %.1f MB, gathered %.1f MB, stall %.3f s, "
                    "max depth %d, max live %.1f MB (limit %.1f MB), read errors %ld, repairs %ld\n",
                    zs_world_ranks(zs_engine_world(e)), gs.bytes_nvme / 1e6, gs.bytes_host / 1e6,
                    gs.bytes_gathered / 1e6, gs.stall_s, gs.max_depth, gs.max_live_bytes / 1e6,
                    gs.live_limit / 1e6, gs.read_errors, gs.repairs);
            if (gs.expert_layers > 0) {
                long looked = gs.expert_hits + gs.expert_misses;
                fprintf(stderr, "experts: layer passes %ld, selected %ld, hits %ld, misses %ld (hit rate %.3f), "
                        "speculative %ld (used %ld), gathered %.3f MB, whole-block %.3f MB (ratio %.4f), "
                        "cache %.1f MB (limit %.1f MB)\n",
                        gs.expert_layers, gs.expert_selected, gs.expert_hits, gs.expert_misses,
                        looked ? (double)gs.expert_hits / (double)looked : 0.0, gs.expert_spec, gs.expert_spec_used,
                        gs.expert_bytes / 1e6, gs.expert_block_bytes / 1e6,
                        gs.expert_block_bytes ? (double)gs.expert_bytes / (double)gs.expert_block_bytes : 0.0,
                        gs.expert_cache_used / 1e6, gs.expert_cache_limit / 1e6);
            }
        }
        free(res.ids);
    }
    free(pids);
    if (lf && fclose(lf) != 0 && rc == 0) rc = zs_err(ZS_EIO, "--logits-out %s: write failed", logits_out);
    zs_engine_free(e);
    return rc;
}

static int cmd_init_model(int argc, char **argv) {
    zs_init_opts io;
    const char *out;
    int help;
    ZS_CHECK(zs_init_cmd_parse(argc, argv, &io, &out, &help));
    if (help) return 0;
    const zs_model_config *c = &io.cfg;
    ZS_CHECK(zs_init_model_write(&io, out));
    double params = (double)c->vocab_size * c->dim * (c->tied_embeddings ? 1 : 2);
    for (int l = 0; l < c->n_layers; l++) {
        params += (double)c->dim * c->head_dim * (2 * c->n_heads + 2 * c->n_kv_heads);
        if (zs_config_layer_moe(c, l)) /* router, experts, shared expert and its gate */
            params += (double)c->dim * (c->n_experts + 3.0 * c->n_experts * c->moe_ffn_dim + 3.0 * c->shared_ffn_dim +
                                        (c->shared_ffn_dim > 0));
        else
            params += (double)c->dim * c->ffn_dim * (c->arch == ZS_ARCH_GPT2 ? 2 : 3);
    }
    printf("wrote %s: %s, %d layers, dim %d, %.1fM parameters, %s, seed %llu — the weights are random\n", out,
           c->arch_name, c->n_layers, c->dim, params / 1e6, zs_dtype_name(c->dtype), (unsigned long long)io.seed);
    return 0;
}

static int cmd_bench(int argc, char **argv) {
    zs_bench_opts bo;
    zs_bench_opts_default(&bo);
    zs_engine_flags ef;
    zs_engine_flags_init(&ef);
    const char *raw_read = NULL, *draft_dtype = NULL;
    zs_opt opts[14 + ZS_ENGINE_FLAG_COUNT] = {
        {"runs", ZS_OPT_INT, &bo.runs, "repetitions, medians reported (default 5)"},
        {"prefill", ZS_OPT_INT, &bo.prefill_tokens, "prompt tokens (default 128)"},
        {"decode", ZS_OPT_INT, &bo.decode_tokens, "decode tokens per run (default 32)"},
        {"threads", ZS_OPT_INT, &bo.threads, "threads of the bandwidth probe (default: all CPUs)"},
        {"json", ZS_OPT_STR, &bo.json_out, "also write the figures as JSON to this file"},
        {"lora", ZS_OPT_INT, &bo.lora_adapters, "N: decode of a batch mixing N random LoRA adapters against the base alone"},
        {"lora-r", ZS_OPT_INT, &bo.lora_r, "rank of those adapters (default 16)"},
        {"lora-seqs", ZS_OPT_INT, &bo.lora_seqs, "sequences decoding together with --lora (default 16)"},
        {"moe", ZS_OPT_FLAG, &bo.moe, "a mixture of experts: decode at batch 1, 8, 32 with only the routed experts gathered against --moe-gather-all"},
        {"speculative", ZS_OPT_FLAG, &bo.speculative, "greedy decode of a copying prompt at batch 1, plain against prompt lookup (or --draft-model): tokens/s, tokens per pass, pass time against the I/O bound"},
        {"spec-tokens", ZS_OPT_INT, &bo.spec_tokens, "with --speculative: drafts per step (default 0: chosen from the measured costs; at most 16)"},
        {"draft-model", ZS_OPT_STR, &bo.draft_model, "with --speculative: a draft model (same vocabulary; HF directory or GGUF file) proposes instead of prompt lookup"},
        {"draft-weight-dtype", ZS_OPT_STR, &draft_dtype, "its weights: the choices of --weight-dtype (default auto: as stored)"},
        {"raw-read", ZS_OPT_STR, &raw_read, "DIR: only the raw io_uring O_DIRECT read rate of the shard files DIR/rank*.shards (--ranks of them), in GB/s; no --model"},
    };
    int n_opts = zs_engine_flags_table(&ef, opts, 14);
    if (want_help(argc, argv)) {
        zs_cli_usage("bench", "Measures prefill and decode throughput against bounds measured in the same run.", opts, n_opts);
        return 0;
    }
    ZS_CHECK(zs_cli_parse(argc, argv, opts, n_opts));
    if (raw_read) { /* the NVMe bound alone, for scripts that measure a server (tests/bench/speculative.sh) */
        ZS_CHECK(zs_engine_flags_apply(&ef, &bo.engine));
        double gbps;
        ZS_CHECK(zs_bench_raw_bound(raw_read, bo.engine.ranks, &bo.engine.gather, &gbps));
        printf("%.4f\n", gbps);
        return 0;
    }
    if (!ef.model) return zs_err(ZS_EINVAL, "--model is required");
    if (bo.runs < 1 || bo.prefill_tokens < 1 || bo.decode_tokens < 2)
        return zs_err(ZS_EINVAL, "--runs and --prefill must be >= 1, --decode >= 2");
    if (bo.lora_adapters < 0 || bo.lora_r < 0 || bo.lora_seqs < 0)
        return zs_err(ZS_EINVAL, "--lora, --lora-r and --lora-seqs must be >= 1");
    if (!bo.lora_adapters && (bo.lora_r || bo.lora_seqs)) return zs_err(ZS_EINVAL, "--lora-r and --lora-seqs need --lora N");
    bo.engine.max_seqs = 1;
    bo.engine.max_batch_tokens = ZS_MAX(256, bo.prefill_tokens);
    ZS_CHECK(zs_engine_flags_apply(&ef, &bo.engine));
    if (bo.moe && (bo.lora_adapters || ef.moe_gather_all))
        return zs_err(ZS_EINVAL, "--moe runs the --moe-gather-all baseline itself and does not combine with --lora");
    if (bo.spec_tokens < 0 || bo.spec_tokens > ZS_SPEC_MAX_TOKENS)
        return zs_err(ZS_ERANGE, "--spec-tokens must be between 0 and %d (got %d)", ZS_SPEC_MAX_TOKENS, bo.spec_tokens);
    if (bo.spec_tokens && !bo.speculative) return zs_err(ZS_EINVAL, "--spec-tokens needs --speculative");
    if (bo.draft_model && !bo.speculative) return zs_err(ZS_EINVAL, "--draft-model needs --speculative");
    if (draft_dtype && !bo.draft_model) return zs_err(ZS_EINVAL, "--draft-weight-dtype %s needs --draft-model PATH", draft_dtype);
    if (draft_dtype) ZS_CHECK(zs_engine_flags_weight_dtype("--draft-weight-dtype", draft_dtype, &bo.draft));
    if (bo.speculative && (bo.moe || bo.lora_adapters))
        return zs_err(ZS_EINVAL, "--speculative does not combine with --moe or --lora");
    if (bo.speculative) return zs_bench_spec(&bo);
    if (bo.engine.kv_offload != ZS_OFFLOAD_NONE)
        zs_log_warn("--kv-offload: this bench places its sequences itself and never preempts them; the tier stays "
                    "unused (it serves `serve` and `bench --speculative`)");
    bo.engine.kv_whole = 1;
    if (bo.moe) return zs_bench_moe(&bo);
    if (bo.lora_adapters) return zs_bench_lora(&bo);
    if (bo.engine.ranks > 1 || bo.engine.gather.tier != ZS_OFFLOAD_NONE) return zs_bench_offload(&bo);
    return zs_bench_run(&bo);
}

static void usage(void) {
    fprintf(stderr,
            "usage: zeroserve <command> [flags]   (zeroserve <command> --help for its flags)\n\n"
            "commands:\n"
            "  serve        serve the model over an OpenAI-compatible HTTP API\n"
            "  generate     generate text from a prompt\n"
            "  train        fine-tune a model on a JSONL file (ZeRO-3 through the same engine)\n"
            "  make-corpus  write simple generated stories as JSONL (the demo model's data)\n"
            "  export       write a training checkpoint (or, --merge, a base with a LoRA adapter merged in) as a Hugging Face directory\n"
            "  convert      write a Hugging Face model directory as a GGUF file (f32 .. q4_k_m) for llama.cpp\n"
            "  init-model   write a random-initialised model in Hugging Face layout\n"
            "  bench        measure prefill/decode throughput against memory bandwidth\n"
            "  perplexity   mean NLL and perplexity of the model on a text file (llama.cpp's method)\n"
            "  plan         where weights, experts and KV should live on a machine, the batch, and the tokens/s that follow\n");
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage();
        return argc < 2 ? 2 : 0;
    }
    const char *cmd = argv[1];
    int rc;
    if ((rc = zs_cluster_init(&argc, &argv)) < 0) {
        fprintf(stderr, "zeroserve %s: error: %s\n", cmd, zs_errmsg());
        return 1;
    }
    if (!strcmp(cmd, "serve")) rc = zs_cmd_serve(argc - 2, argv + 2);
    else if (!strcmp(cmd, "train")) rc = zs_cmd_train(argc - 2, argv + 2);
    else if (!strcmp(cmd, "make-corpus")) rc = single_process(cmd) ?: cmd_make_corpus(argc - 2, argv + 2);
    else if (!strcmp(cmd, "export")) rc = single_process(cmd) ?: zs_cmd_export(argc - 2, argv + 2);
    else if (!strcmp(cmd, "convert")) rc = single_process(cmd) ?: zs_cmd_convert(argc - 2, argv + 2);
    else if (!strcmp(cmd, "generate")) rc = cmd_generate(argc - 2, argv + 2);
    else if (!strcmp(cmd, "init-model")) rc = single_process(cmd) ?: cmd_init_model(argc - 2, argv + 2);
    else if (!strcmp(cmd, "bench")) rc = single_process(cmd) ?: cmd_bench(argc - 2, argv + 2);
    else if (!strcmp(cmd, "perplexity")) rc = zs_cmd_perplexity(argc - 2, argv + 2);
    else if (!strcmp(cmd, "plan")) rc = single_process(cmd) ?: zs_cmd_plan(argc - 2, argv + 2);
    else {
        fprintf(stderr, "zeroserve: unknown command '%s'\n", cmd);
        usage();
        return 2;
    }
    if (rc < 0) {
        if (zs_cluster_size() > 1)
            fprintf(stderr, "zeroserve %s (process %d of %d): error: %s\n", cmd, zs_cluster_rank(), zs_cluster_size(),
                    zs_errmsg()[0] ? zs_errmsg() : zs_strerror(rc));
        else
            fprintf(stderr, "zeroserve %s: error: %s\n", cmd, zs_errmsg()[0] ? zs_errmsg() : zs_strerror(rc));
        /* no orderly end of the cluster after a failure: the others may be inside a collective;
         * they see this process go (liveness watch) */
        return 1;
    }
    zs_cluster_finalize();
    return 0;
}
