/* plan-auto.h — --offload auto: the planner (plan.h) run at start on this machine, measured
 * (plan-local.c), for the opened model, and its choice turned into the engine's options: the
 * weights' tier and live budget, the KV cache's bytes and tier; flags the user gave win, and the
 * log says which. Also the plan as JSON for GET /v1/plan. On the CPU device only for now (a CUDA
 * device is not measured yet: auto is refused there by name).
 * Thread-safety: call from one thread (engine open); the JSON text is owned by the caller. */
#ifndef ZS_PLAN_AUTO_H
#define ZS_PLAN_AUTO_H

#include "engine.h"
#include "model.h"

/* What the planner may change: the user gave none of these (ZS_PLAN_GAVE_* bits in gave). */
enum {
    ZS_PLAN_GAVE_LIVE = 1,        /* --max-live-bytes (or stage3_max_live_parameters) */
    ZS_PLAN_GAVE_KV_BYTES = 2,    /* --kv-bytes */
    ZS_PLAN_GAVE_KV_OFFLOAD = 4,  /* --kv-offload */
};

/* Whether the model's weights and a KV cache for its sessions fit in this machine's available
 * memory with room to spare (the test that makes auto the default when --offload is not given). */
int zs_plan_auto_fits(const zs_model *m, const zs_engine_opts *o);
/* Plans for m on this machine and writes the choice into o (gather.tier, gather.max_live_bytes,
 * kv_bytes, kv_offload, kv_nvme_path) except what gave says the user set; *json: the plan, the
 * figures behind it and what was applied or overridden (malloc'd). ZS_EINVAL naming what is
 * missing (e.g. --nvme-path when the model must stream), errors of the probes. */
int zs_plan_auto_apply(const zs_model *m, zs_engine_opts *o, unsigned gave, char **json);

#endif
