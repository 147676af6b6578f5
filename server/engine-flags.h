/* engine-flags.h — the engine flags shared by `generate`, `bench` and `serve` (model, dtype,
 * KV cache dtype, ranks, offload tier, live budget, aio, the expert cache of a mixture of experts, --config
 * FILE in DeepSpeed form), and how they become
 * zs_engine_opts: the config file is read first, then flags given on the command line win. */
#ifndef ZS_ENGINE_FLAGS_H
#define ZS_ENGINE_FLAGS_H

#include <stdint.h>

#include "cli.h"
#include "engine.h"

typedef struct {
    const char *model, *weight_dtype, *offload, *nvme_path, *config, *device, *kv_dtype;
    int ranks, verify, buffer_count, aio_queue_depth, context, zero_stage;
    int64_t max_live_bytes, persist_threshold, aio_block_size;
    int64_t expert_cache_bytes; /* mixtures of experts */
    int moe_gather_all, no_expert_speculation;
} zs_engine_flags;

void zs_engine_flags_init(zs_engine_flags *f);
/* Appends the flag descriptors to opts (room for ZS_ENGINE_FLAG_COUNT); returns the new count. */
#define ZS_ENGINE_FLAG_COUNT 19
int  zs_engine_flags_table(zs_engine_flags *f, zs_opt *opts, int n);
/* Fills eo (already defaulted) from the config file and the flags. */
int  zs_engine_flags_apply(const zs_engine_flags *f, zs_engine_opts *eo);

#endif
