/* plan-auto.h — --offload auto: the planner (plan.h) run at start on this machine, measured
 * (plan-local.c), for the opened model, and its choice turned into the engine's options: the
 * weights' tier and live budget, the KV cache's bytes and tier; flags the user gave win, and the
 * log says which. Also the plan as JSON for GET /v1/plan. On the CPU device only for now (a CUDA
 * device is not measured yet: auto is refused there by name). While serving, the engine feeds
 * each step's figures back (zs_plan_auto_observe); when the compute or the NVMe reads achieved
 * stay more than 1.3x off the plan's figures for three 2-second windows in a row, it plans again
 * from them, logs the new plan and serves it (its "replanned" part says what was measured and
 * what a restart would change: the tiers and buffers are sized when the engine opens).
 * Ownership: the caller owns the zs_plan_auto and every JSON text returned.
 * Thread-safety: one thread at a time per zs_plan_auto (engine open, then the engine thread). */
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
 * figures behind it and what was applied or overridden (malloc'd); *keep: the plan kept for
 * re-planning. ZS_EINVAL naming what is missing (e.g. --nvme-path when the model must stream),
 * errors of the probes. */
typedef struct zs_plan_auto zs_plan_auto;
int zs_plan_auto_apply(const zs_model *m, zs_engine_opts *o, unsigned gave, char **json, zs_plan_auto **keep);
/* The plan in force as JSON (malloc'd; NULL when out of memory). */
char *zs_plan_auto_json(const zs_plan_auto *pa);
void zs_plan_auto_free(zs_plan_auto *pa);
/* One step: rows computed, its seconds, those spent waiting for weights, NVMe bytes read. Returns
 * 1 with *json the new plan when it re-planned, else 0 (ZS_ENOMEM). */
int  zs_plan_auto_observe(zs_plan_auto *pa, double rows, double step_s, double stall_s, double nvme_bytes, char **json);

#endif
