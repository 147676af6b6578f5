/* engine-flags.h — the engine flags shared by `generate`, `bench` and `serve` (model, dtype,
 * KV cache dtype, bytes and tier below memory, ranks, offload tier, live budget, aio, the expert cache of a mixture of experts, --config
 * FILE in DeepSpeed form), and how they become
 * zs_engine_opts: the config file is read first, then flags given on the command line win. */
#ifndef ZS_ENGINE_FLAGS_H
#define ZS_ENGINE_FLAGS_H

#include <stdint.h>

#include "cli.h"
#include "dsconfig.h"
#include "engine.h"

typedef struct {
    const char *model, *weight_dtype, *offload, *nvme_path, *config, *device, *kv_dtype;
    const char *kv_offload, *kv_nvme_path; /* the KV cache's tier below memory */
    int64_t kv_bytes, kv_prefix_bytes;     /* -1: unset */
    int ranks, verify, buffer_count, aio_queue_depth, context, zero_stage;
    int64_t max_live_bytes, persist_threshold, aio_block_size;
    int64_t expert_cache_bytes; /* mixtures of experts */
    int moe_gather_all, no_expert_speculation;
    int kv_stream;
    /* set by the command before zs_engine_flags_apply: what it acts upon of a --config file
     * (ZS_DS_USE_* of dsconfig.h; 0: ZS_DS_USE_ENGINE); every other key the file sets is reported
     * once at start (zs_zero_opts_report_unused; with ZS_DS_USE_TRAIN the command does it itself,
     * after merging its own flags into ds) */
    unsigned ds_uses;
    /* filled by zs_engine_flags_apply: the parsed --config (everything unset without one), for the
     * command's own keys (training: optimizer, scheduler, fp16 loss scaling, offload_optimizer) */
    zs_zero_opts ds;
} zs_engine_flags;

void zs_engine_flags_init(zs_engine_flags *f);
/* Appends the flag descriptors to opts (room for ZS_ENGINE_FLAG_COUNT); returns the new count. */
#define ZS_ENGINE_FLAG_COUNT 24
int  zs_engine_flags_table(zs_engine_flags *f, zs_opt *opts, int n);
/* A --weight-dtype value (NULL or "auto": as stored; f32, f16, bf16, the block formats, q4_k_m)
 * into mo's weight_dtype and quant_mix; ZS_EINVAL naming flag and the choices. */
int  zs_engine_flags_weight_dtype(const char *flag, const char *value, zs_model_opts *mo);
/* Fills eo (already defaulted) from the config file and the flags. */
int  zs_engine_flags_apply(zs_engine_flags *f, zs_engine_opts *eo);

#endif
