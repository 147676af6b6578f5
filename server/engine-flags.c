/* engine-flags.c — engine flags and the DeepSpeed-style --config file merged into engine
 * options (flags win over the file). */
#include "engine-flags.h"

#include <string.h>

#include "common.h"
#include "device.h"
#include "dsconfig.h"
#include "plan-auto.h"
#include "quant-mix.h"

void zs_engine_flags_init(zs_engine_flags *f) {
    memset(f, 0, sizeof *f);
    zs_zero_opts_init(&f->ds);
    f->max_live_bytes = -1;
    f->persist_threshold = -1;
    f->expert_cache_bytes = -1;
    f->kv_bytes = -1;
    f->kv_prefix_bytes = -1;
}

int zs_engine_flags_table(zs_engine_flags *f, zs_opt *o, int n) {
    zs_opt t[ZS_ENGINE_FLAG_COUNT] = {
        {"model", ZS_OPT_STR, &f->model, "model directory (Hugging Face layout)  [required]"},
        {"weight-dtype", ZS_OPT_STR, &f->weight_dtype, "auto (as stored) | f32 | f16 | bf16 | q8_0 | q4_0 | q4_1 | q5_0 | q5_1 | q2_k | q3_k | q4_k | q5_k | q6_k | q4_k_m (llama.cpp's mix; quantized at load)"},
        {"kv-dtype", ZS_OPT_STR, &f->kv_dtype, "KV cache elements: f32 (default) | f16 | bf16 (half the bytes, twice the positions)"},
        {"kv-bytes", ZS_OPT_I64, &f->kv_bytes, "KV cache memory per rank, in bytes (default: max-seqs full contexts, at most 1 GiB)"},
        {"kv-offload", ZS_OPT_STR, &f->kv_offload, "the KV cache's tier below memory: none (default: requests wait for room) | cpu | nvme (sequences beyond memory run with their K/V streamed from it, or wait swapped out to it)"},
        {"kv-nvme-path", ZS_OPT_STR, &f->kv_nvme_path, "directory of the KV cache's NVMe tier (--kv-offload nvme); its prefix blocks stay there across restarts"},
        {"kv-stream", ZS_OPT_FLAG, &f->kv_stream, "with --kv-offload: when the cache is full the youngest keep running with their K/V streamed from the tier a layer at a time (while the reads hide behind the compute) instead of waiting swapped out; without it only a request longer than the cache's memory is streamed"},
        {"kv-prefix-bytes", ZS_OPT_I64, &f->kv_prefix_bytes, "room for prefix-cache blocks in the KV tier (default: 4x --kv-bytes in host memory, 16 GiB on NVMe; unused with serve --no-prefix-cache and by generate, perplexity, bench)"},
        {"context", ZS_OPT_INT, &f->context, "context length (default: the model's)"},
        {"config", ZS_OPT_STR, &f->config, "DeepSpeed-style JSON config (zero_optimization, aio, bf16...)"},
        {"device", ZS_OPT_STR, &f->device, "cpu | cuda (default: cuda when a device is visible)"},
        {"ranks", ZS_OPT_INT, &f->ranks, "rank threads, each with its own device (default 1)"},
        {"zero-stage", ZS_OPT_INT, &f->zero_stage, "ZeRO stage: 3 shards the parameters (default); 1 and 2 replicate them (training: 2 shards gradients, 1 does not)"},
        {"offload", ZS_OPT_STR, &f->offload, "where a rank's shards live: none | cpu | nvme | auto (planned from this machine, measured at start; the default when the model and its KV do not fit in memory, else none)"},
        {"nvme-path", ZS_OPT_STR, &f->nvme_path, "directory of the shard files for --offload nvme"},
        {"max-live-bytes", ZS_OPT_I64, &f->max_live_bytes, "full-layer bytes resident at once (default 4 layers)"},
        {"persist-threshold", ZS_OPT_I64, &f->persist_threshold, "tensors under this many elements stay resident (default 0: norms and biases)"},
        {"verify-shards", ZS_OPT_FLAG, &f->verify, "check every shard's checksum on every read"},
        {"buffer-count", ZS_OPT_INT, &f->buffer_count, "pinned read slots per rank (default 4)"},
        {"aio-queue-depth", ZS_OPT_INT, &f->aio_queue_depth, "io_uring queue depth (default 32)"},
        {"aio-block-size", ZS_OPT_I64, &f->aio_block_size, "bytes per read request (default 1 MiB)"},
        {"expert-cache-bytes", ZS_OPT_I64, &f->expert_cache_bytes, "mixtures of experts: full expert bytes held at once, part of --max-live-bytes (default: two layers' experts)"},
        {"moe-gather-all", ZS_OPT_FLAG, &f->moe_gather_all, "mixtures of experts: gather every expert of a layer in every pass, nothing cached (the whole-block baseline)"},
        {"no-expert-speculation", ZS_OPT_FLAG, &f->no_expert_speculation, "mixtures of experts: no speculative expert gathers"},
    };
    memcpy(o + n, t, sizeof t);
    return n + ZS_ENGINE_FLAG_COUNT;
}

int zs_engine_flags_weight_dtype(const char *flag, const char *v, zs_model_opts *mo) {
    mo->weight_dtype = ZS_DTYPE_COUNT;
    mo->quant_mix = ZS_QUANT_MIX_NONE;
    if (!v || !strcmp(v, "auto")) return 0;
    if (!strcmp(v, "q4_k_m") || !strcmp(v, "Q4_K_M")) {
        mo->weight_dtype = ZS_Q4_K; /* llama.cpp's Q4_K_M: Q4_K with Q5_K/Q6_K where it keeps more bits */
        mo->quant_mix = ZS_QUANT_MIX_Q4_K_M;
        return 0;
    }
    if (zs_dtype_parse(v, &mo->weight_dtype) < 0)
        return zs_err(ZS_EINVAL, "%s: '%s' is not one of auto, f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, "
                      "q4_k, q5_k, q6_k, q4_k_m", flag, v);
    return 0;
}

int zs_engine_flags_apply(zs_engine_flags *f, zs_engine_opts *eo) {
    zs_zero_opts z;
    zs_zero_opts_init(&z);
    if (f->config) {
        /* unknown and accepted-but-ignored keys are reported as the file is read, the keys this
         * command does not act upon right after */
        ZS_CHECK(zs_dsconfig_load(f->config, &z));
    }
    /* flags override the file */
    zs_zero_opts fl;
    zs_zero_opts_init(&fl);
    int offload_auto = f->offload && !strcasecmp(f->offload, "auto");
    if (f->offload && !offload_auto) ZS_CHECK(zs_offload_parse(f->offload, &fl.offload_param));
    if (f->nvme_path) {
        if (strlen(f->nvme_path) >= sizeof fl.nvme_path) return zs_err(ZS_EINVAL, "--nvme-path is too long");
        snprintf(fl.nvme_path, sizeof fl.nvme_path, "%s", f->nvme_path);
    }
    if (f->persist_threshold >= 0) fl.param_persistence_threshold = f->persist_threshold;
    else if (f->persist_threshold != -1) return zs_err(ZS_EINVAL, "--persist-threshold must be >= 0");
    if (f->buffer_count) fl.buffer_count = f->buffer_count;
    if (f->aio_queue_depth) fl.aio_queue_depth = f->aio_queue_depth;
    if (f->aio_block_size) fl.aio_block_size = f->aio_block_size;
    zs_zero_opts_merge(&z, &fl);
    f->ds = z;
    /* the keys this command does not act upon, over the file merged with the flags (`train`
     * reports itself, once its own flags are merged too) */
    if (f->config && !(f->ds_uses & ZS_DS_USE_TRAIN))
        zs_zero_opts_report_unused(&z, f->config, f->ds_uses ? f->ds_uses : ZS_DS_USE_ENGINE, NULL, NULL);
    if (z.offload_param == ZS_OFFLOAD_NVME && !z.nvme_path[0])
        return zs_err(ZS_EINVAL, "--offload nvme needs --nvme-path DIR (or offload_param.nvme_path in --config)");

    eo->model_dir = f->model;
    if (f->device && zs_device_parse(f->device, &eo->device) < 0)
        return zs_err(ZS_EINVAL, "--device: '%s' is not one of cpu, cuda, auto", f->device);
    if (f->context < 0) return zs_err(ZS_EINVAL, "--context must be >= 0");
    eo->max_context = f->context;
    if (f->ranks < 0 || f->ranks > 256) return zs_err(ZS_EINVAL, "--ranks must be between 1 and 256");
    eo->ranks = f->ranks > 0 ? f->ranks : 1;
    if (f->zero_stage < 0 || f->zero_stage > 3) return zs_err(ZS_EINVAL, "--zero-stage must be 1, 2 or 3");
    if (f->zero_stage) eo->zero_stage = f->zero_stage;
    else if (z.zero_stage == 0) return zs_err(ZS_EUNSUPPORTED, "zero_optimization.stage 0 is not supported (use 1, 2 or 3)");
    else if (z.zero_stage > 0) eo->zero_stage = z.zero_stage;
    eo->gather.tier = z.offload_param >= 0 ? z.offload_param : ZS_OFFLOAD_NONE;
    /* auto: asked for, or the default when neither a flag nor the file says where the weights go */
    eo->offload_auto = offload_auto ? 1 : z.offload_param < 0 ? 2 : 0;
    eo->plan_gave = (f->max_live_bytes > 0 || z.max_live_parameters > 0 ? ZS_PLAN_GAVE_LIVE : 0) |
                    (f->kv_bytes > 0 ? ZS_PLAN_GAVE_KV_BYTES : 0) | (f->kv_offload ? ZS_PLAN_GAVE_KV_OFFLOAD : 0);
    static char nvme[1024];
    snprintf(nvme, sizeof nvme, "%s", z.nvme_path);
    eo->nvme_path = nvme[0] ? nvme : NULL;
    if (f->max_live_bytes != -1 && f->max_live_bytes <= 0) return zs_err(ZS_EINVAL, "--max-live-bytes must be positive");
    if (f->max_live_bytes > 0) eo->gather.max_live_bytes = (size_t)f->max_live_bytes;
    else if (z.max_live_parameters > 0) eo->max_live_params = z.max_live_parameters;
    if (z.param_persistence_threshold >= 0) eo->model.persist_threshold = z.param_persistence_threshold;
    if (f->buffer_count < 0 || f->buffer_count > 64) return zs_err(ZS_EINVAL, "--buffer-count must be between 1 and 64");
    if (z.buffer_count > 64) return zs_err(ZS_EINVAL, "offload_param.buffer_count must be at most 64");
    if (z.buffer_count > 0) eo->gather.buffer_count = z.buffer_count;
    if (f->aio_queue_depth < 0 || f->aio_queue_depth > 4096) return zs_err(ZS_EINVAL, "--aio-queue-depth must be between 1 and 4096");
    if (z.aio_queue_depth > 0) eo->gather.queue_depth = z.aio_queue_depth;
    if (f->aio_block_size < 0 || (f->aio_block_size && (f->aio_block_size < 4096 || f->aio_block_size % 4096)))
        return zs_err(ZS_EINVAL, "--aio-block-size must be a positive multiple of 4096");
    if (z.aio_block_size > 0) eo->gather.block_size = (size_t)z.aio_block_size;
    eo->gather.verify = f->verify;
    if (f->expert_cache_bytes != -1 && f->expert_cache_bytes <= 0) return zs_err(ZS_EINVAL, "--expert-cache-bytes must be positive");
    if (f->expert_cache_bytes > 0) eo->gather.expert_cache_bytes = (size_t)f->expert_cache_bytes;
    eo->gather.expert_gather_all = f->moe_gather_all;
    eo->gather.expert_no_speculate = f->no_expert_speculation;
    eo->kv_dtype = ZS_F32;
    if (f->kv_dtype) {
        zs_dtype kt;
        if (zs_dtype_parse(f->kv_dtype, &kt) < 0 || (kt != ZS_F32 && kt != ZS_F16 && kt != ZS_BF16))
            return zs_err(ZS_EINVAL, "--kv-dtype: '%s' is not one of f32, f16, bf16", f->kv_dtype);
        eo->kv_dtype = kt;
    }
    if (f->kv_bytes != -1 && f->kv_bytes <= 0) return zs_err(ZS_EINVAL, "--kv-bytes must be positive");
    if (f->kv_bytes > 0) eo->kv_bytes = (size_t)f->kv_bytes;
    eo->kv_offload = ZS_OFFLOAD_NONE;
    if (f->kv_offload && zs_offload_parse(f->kv_offload, &eo->kv_offload) < 0)
        return zs_err(ZS_EINVAL, "--kv-offload: '%s' is not one of none, cpu, nvme", f->kv_offload);
    if (f->kv_nvme_path && eo->kv_offload != ZS_OFFLOAD_NVME)
        return zs_err(ZS_EINVAL, "--kv-nvme-path is for --kv-offload nvme");
    if (eo->kv_offload == ZS_OFFLOAD_NVME && !f->kv_nvme_path)
        return zs_err(ZS_EINVAL, "--kv-offload nvme needs --kv-nvme-path DIR");
    eo->kv_nvme_path = f->kv_nvme_path;
    if (f->kv_prefix_bytes != -1 && f->kv_prefix_bytes <= 0) return zs_err(ZS_EINVAL, "--kv-prefix-bytes must be positive");
    if (f->kv_prefix_bytes > 0 && eo->kv_offload == ZS_OFFLOAD_NONE)
        return zs_err(ZS_EINVAL, "--kv-prefix-bytes is for --kv-offload cpu or nvme");
    if (f->kv_prefix_bytes > 0) eo->kv_prefix_bytes = (size_t)f->kv_prefix_bytes;
    if (f->kv_stream && eo->kv_offload == ZS_OFFLOAD_NONE) return zs_err(ZS_EINVAL, "--kv-stream is for --kv-offload cpu or nvme");
    eo->kv_stream = f->kv_stream;
    /* precision: --weight-dtype, else bf16/fp16 from the config, else as stored */
    ZS_CHECK(zs_engine_flags_weight_dtype("--weight-dtype", f->weight_dtype, &eo->model));
    int as_stored = !f->weight_dtype || !strcmp(f->weight_dtype, "auto");
    if (as_stored && z.bf16 == 1) {
        eo->model.weight_dtype = ZS_BF16;
    } else if (as_stored && z.fp16 == 1) {
        eo->model.weight_dtype = ZS_F16;
    }
    return 0;
}
