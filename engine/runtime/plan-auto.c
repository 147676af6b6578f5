/* plan-auto.c — --offload auto (plan-auto.h): this machine measured, the planner run for the
 * opened model and the engine's sessions, its placement written into the engine's options. */
#include "plan-auto.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "dsconfig.h"
#include "kvcache.h"
#include "plan.h"

/* the sessions the plan is for: a prompt and an answer of these lengths (capped by the context) */
#define AUTO_PROMPT 512
#define AUTO_OUTPUT 256
/* the share of the available memory the model and its cache may take before auto steps in */
#define AUTO_FIT_SHARE 0.85

/* The memory this process may take now: MemAvailable, under a cgroup's (a container's) limit,
 * or ZS_PLAN_MEMORY_BYTES when set (a smaller machine, for tests and for sharing one). */
static double avail_bytes(void) {
    const char *env = getenv("ZS_PLAN_MEMORY_BYTES");
    if (env && *env) {
        char *end;
        double v = strtod(env, &end);
        if (end != env && v > 0) return v;
        zs_log_warn("ZS_PLAN_MEMORY_BYTES=%s is not a positive number: ignored", env);
    }
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    double kb = 0, lim = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lf kB", &kb) == 1) break;
    if (f) fclose(f);
    double avail = kb * 1024.0;
    if (avail <= 0) {
        long pages = sysconf(_SC_AVPHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
        avail = pages > 0 && psz > 0 ? (double)pages * (double)psz : 0;
    }
    if ((f = fopen("/sys/fs/cgroup/memory.max", "r"))) { /* "max" when there is no limit */
        if (fscanf(f, "%lf", &lim) == 1 && lim > 0 && (avail <= 0 || lim < avail)) avail = lim;
        fclose(f);
    }
    return avail;
}

/* bytes per weight as the model was opened (a block format: its block's bytes over its elements) */
static double weight_bytes_each(const zs_model *m) {
    zs_dtype t = zs_model_layout(m, zs_bucket_layer(0))->slot[ZS_R_WQ].dtype;
    return (double)zs_dtype_size(t) / zs_dtype_block(t);
}

static int context_of(const zs_model *m, const zs_engine_opts *o) {
    int c = zs_model_config_get(m)->max_seq;
    return o->max_context > 0 && o->max_context < c ? o->max_context : c;
}

int zs_plan_auto_fits(const zs_model *m, const zs_engine_opts *o) {
    const zs_model_config *c = zs_model_config_get(m);
    double kv = (double)zs_kv_block_bytes(c->n_layers, c->n_kv_heads * c->head_dim, o->kv_dtype) / ZS_KV_BLOCK *
                ZS_MIN(context_of(m, o), AUTO_PROMPT + AUTO_OUTPUT) * (o->max_seqs > 0 ? o->max_seqs : 1);
    double need = (double)zs_model_weight_bytes(m) + kv;
    return need <= AUTO_FIT_SHARE * avail_bytes();
}

/* re-planning: a window of steps is at least this long; figures this far off (either way) in this
 * many windows in a row re-plan */
#define REPLAN_WINDOW_S 2.0
#define REPLAN_DRIFT 1.3
#define REPLAN_WINDOWS 3

struct zs_plan_auto {
    zs_plan_model pm;
    zs_plan_machine mach;   /* the figures the plan in force assumed */
    zs_plan_load l;
    zs_plan p;
    int layers;
    json_t *applied;        /* what the engine took of the first plan */
    char over[512];         /* flags that won over it */
    /* the window being measured */
    double w_s, w_stall, w_rows, w_nvme;
    int drifted;            /* windows in a row that drifted */
    int replans;
    json_t *replanned;      /* the last re-plan's figures, or NULL */
};

/* a placement as JSON */
static json_t *point_json(const zs_plan_point *p) {
    return json_pack("{s:i,s:f,s:s,s:f,s:f,s:f,s:{s:i,s:i},s:s,s:f,s:f}", "batch", p->batch, "tokens_per_s", p->tok_s,
                     "bound", p->bound ? p->bound : "", "pass_s", p->t_pass, "io_s", p->t_io, "compute_s", p->t_compute,
                     "layers", "memory", p->layers[ZS_PLAN_DEVICE], "nvme", p->layers[ZS_PLAN_NVME], "kv_tier",
                     p->kv_tier == ZS_PLAN_DEVICE ? "memory" : zs_plan_tier_name(p->kv_tier), "kv_bytes", p->kv_bytes,
                     "live_bytes", p->live_bytes);
}

int zs_plan_auto_apply(const zs_model *m, zs_engine_opts *o, unsigned gave, char **json, zs_plan_auto **keep) {
    *json = NULL;
    *keep = NULL;
    const zs_model_config *c = zs_model_config_get(m);
    zs_plan_model pm;
    ZS_CHECK(zs_plan_model_from_config(c, weight_bytes_each(m), (double)zs_dtype_size(o->kv_dtype), &pm));
    zs_plan_machine mach;
    zs_log_info("--offload auto: measuring this machine (memory, compute%s)", o->nvme_path ? ", NVMe" : "");
    ZS_CHECK(zs_plan_machine_local(o->nvme_path, &mach));
    /* the memory the process may use now, not all that is installed */
    double avail = avail_bytes();
    if (avail > 0 && avail < mach.host_mem) mach.host_mem = avail;
    zs_plan_load l;
    zs_plan_load_default(&l);
    int ctx = context_of(m, o);
    l.prompt = ZS_MIN(AUTO_PROMPT, ctx / 2);
    l.output = ZS_MIN(AUTO_OUTPUT, ctx - l.prompt);
    l.max_batch = o->max_seqs > 0 ? o->max_seqs : 1;
    if (!o->nvme_path) l.kv_tier = ZS_PLAN_DEVICE; /* nothing below memory to put it in */
    zs_plan p;
    int rc = zs_plan_run(&pm, &mach, &l, &p);
    if (rc == ZS_ENOSPC && !o->nvme_path)
        return zs_err(ZS_EINVAL, "--offload auto: %s; give --nvme-path DIR to stream the weights (and the KV cache) from NVMe",
                      zs_errmsg());
    ZS_CHECK(rc);
    const zs_plan_point *b = &p.best;
    char over[512] = "";
    json_t *applied = json_object();
    /* the weights */
    int stream = b->layers[ZS_PLAN_NVME] > 0 || b->head_tier == ZS_PLAN_NVME;
    if (stream && !o->nvme_path) {
        json_decref(applied);
        return zs_err(ZS_EINVAL, "--offload auto: %.1f GB of weights do not fit in %.1f GB of memory with the KV cache; "
                      "give --nvme-path DIR to stream them from NVMe", p.weight_bytes / 1e9, mach.host_mem / 1e9);
    }
    o->gather.tier = stream ? ZS_OFFLOAD_NVME : ZS_OFFLOAD_NONE;
    json_object_set_new(applied, "offload", json_string(stream ? "nvme" : "none"));
    if (stream) {
        if (gave & ZS_PLAN_GAVE_LIVE) strcat(over, " --max-live-bytes");
        else {
            /* the gather holds a whole bucket at least (the head's may be the largest): two of the
             * largest, so one can arrive while the other computes, if the plan says less */
            size_t largest = 0;
            for (int k = 0; k < zs_model_n_buckets(m); k++) {
                const zs_bucket_layout *bl = zs_model_layout(m, k);
                largest = ZS_MAX(largest, bl->data_bytes + bl->resident_bytes);
            }
            o->gather.max_live_bytes = ZS_MAX((size_t)b->live_bytes, 2 * largest + ((size_t)1 << 20));
        }
        json_object_set_new(applied, "max_live_bytes", json_integer((json_int_t)o->gather.max_live_bytes));
    }
    /* the KV cache: the batch's in memory, or an NVMe tier under the weights' directory */
    size_t kv_mem = (size_t)b->kv_bytes;
    if (b->kv_tier != ZS_PLAN_DEVICE) {
        if (gave & ZS_PLAN_GAVE_KV_OFFLOAD) {
            strcat(over, " --kv-offload");
        } else {
            static char kvdir[1100];
            snprintf(kvdir, sizeof kvdir, "%s", o->nvme_path);
            o->kv_offload = ZS_OFFLOAD_NVME;
            o->kv_nvme_path = kvdir;
        }
        /* memory keeps one full context per rank; the rest of the batch's KV swaps */
        kv_mem = zs_kv_block_bytes(c->n_layers, c->n_kv_heads * c->head_dim, o->kv_dtype) *
                 (size_t)((ctx + ZS_KV_BLOCK - 1) / ZS_KV_BLOCK);
    }
    if (gave & ZS_PLAN_GAVE_KV_BYTES) strcat(over, " --kv-bytes");
    else o->kv_bytes = ZS_MAX(kv_mem, zs_kv_block_bytes(c->n_layers, c->n_kv_heads * c->head_dim, o->kv_dtype) *
                                          (size_t)((ctx + ZS_KV_BLOCK - 1) / ZS_KV_BLOCK));
    json_object_set_new(applied, "kv_bytes", json_integer((json_int_t)o->kv_bytes));
    json_object_set_new(applied, "kv_offload", json_string(o->kv_offload == ZS_OFFLOAD_NVME ? "nvme"
                                                           : o->kv_offload == ZS_OFFLOAD_CPU ? "cpu" : "none"));
    if (o->nvme_path)
        zs_log_info("plan: this machine: %.3g GB of memory to use, %.1f GB/s, %.1f GFLOP/s; NVMe under %s: %.2f GB/s reads, "
                    "%.2f GB/s writes", mach.host_mem / 1e9, mach.host_gbps, mach.host_flops / 1e9, o->nvme_path,
                    mach.nvme_read_gbps, mach.nvme_write_gbps);
    else
        zs_log_info("plan: this machine: %.3g GB of memory to use, %.1f GB/s, %.1f GFLOP/s; no NVMe (--nvme-path not given)",
                    mach.host_mem / 1e9, mach.host_gbps, mach.host_flops / 1e9);
    zs_log_info("plan: %d of %d layers in memory, %d streamed from NVMe (live budget %.3g MB); KV of %d sequences "
                "(%.0f MB) in %s; predicted %.1f tokens/s at batch %d (%.1f at batch 1), %s-bound",
                b->layers[ZS_PLAN_DEVICE], c->n_layers, b->layers[ZS_PLAN_NVME], b->live_bytes / 1e6, b->batch,
                b->kv_bytes / 1e6, b->kv_tier == ZS_PLAN_DEVICE ? "memory" : "an NVMe tier", b->tok_s, b->batch,
                p.b1.tok_s, b->bound ? b->bound : "?");
    /* what the engine does with it: its tiers are whole (every layer streams when any does), and
     * the live budget holds two of the largest buckets at least */
    zs_log_info("plan applied: --offload %s%s%.3g MB, --kv-bytes %.3g MB, --kv-offload %s", stream ? "nvme" : "none",
                stream ? " --max-live-bytes " : "", stream ? (double)o->gather.max_live_bytes / 1e6 : 0.0,
                (double)o->kv_bytes / 1e6, o->kv_offload == ZS_OFFLOAD_NVME ? "nvme" : o->kv_offload == ZS_OFFLOAD_CPU ? "cpu" : "none");
    if (over[0]) zs_log_info("plan: given on the command line, so not the plan's:%s", over);
    zs_plan_auto *pa = calloc(1, sizeof *pa);
    if (!pa) {
        json_decref(applied);
        return zs_err(ZS_ENOMEM, "out of memory");
    }
    pa->pm = pm;
    pa->mach = mach;
    pa->l = l;
    pa->p = p;
    pa->layers = c->n_layers;
    pa->applied = applied;
    snprintf(pa->over, sizeof pa->over, "%s", over[0] ? over + 1 : "");
    if (!(*json = zs_plan_auto_json(pa))) {
        zs_plan_auto_free(pa);
        return zs_err(ZS_ENOMEM, "out of memory");
    }
    *keep = pa;
    return 0;
}

char *zs_plan_auto_json(const zs_plan_auto *pa) {
    const zs_plan_machine *mach = &pa->mach;
    json_t *root = json_pack("{s:s,s:{s:f,s:f,s:f,s:f,s:f},s:{s:s,s:f,s:f,s:i},s:{s:i,s:i,s:i},s:o,s:o,s:O,s:s}",
                             "mode", "auto", "machine", "memory_bytes", mach->host_mem, "memory_gbps", mach->host_gbps,
                             "flops", mach->host_flops, "nvme_read_gbps", mach->nvme_read_gbps, "nvme_write_gbps",
                             mach->nvme_write_gbps, "model", "name", pa->pm.name, "weight_bytes", pa->p.weight_bytes,
                             "kv_bytes_per_position", pa->p.kv_per_pos, "layers", pa->layers, "load", "prompt", pa->l.prompt,
                             "output", pa->l.output, "max_batch", pa->l.max_batch, "best", point_json(&pa->p.best), "batch_1",
                             point_json(&pa->p.b1), "applied", pa->applied, "given", pa->over);
    if (root && pa->replanned) json_object_set(root, "replanned", pa->replanned);
    char *j = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    return j;
}

void zs_plan_auto_free(zs_plan_auto *pa) {
    if (!pa) return;
    json_decref(pa->applied);
    json_decref(pa->replanned);
    free(pa);
}

/* measured / assumed, or 1 when either is unknown */
static double ratio(double measured, double assumed) { return measured > 0 && assumed > 0 ? measured / assumed : 1; }

int zs_plan_auto_observe(zs_plan_auto *pa, double rows, double step_s, double stall_s, double nvme_bytes, char **json) {
    *json = NULL;
    if (step_s <= 0 || rows <= 0) return 0;
    pa->w_s += step_s;
    pa->w_stall += ZS_MIN(stall_s, step_s);
    pa->w_rows += rows;
    pa->w_nvme += nvme_bytes;
    if (pa->w_s < REPLAN_WINDOW_S) return 0;
    /* what the window achieved: compute, per row as the planner counts it (2 FLOPs a parameter),
     * over the time not spent waiting for weights; NVMe reads over the whole window, when steps
     * waited for them (else the disk had more to give and its figure stays) */
    double total, active;
    zs_plan_model_params(&pa->pm, &total, &active);
    double busy = pa->w_s - pa->w_stall;
    double flops = busy > 0 ? 2.0 * active * pa->w_rows / busy : 0;
    double nvme = pa->w_stall > 0.2 * pa->w_s && pa->w_nvme > 0 ? pa->w_nvme / pa->w_s / 1e9 : 0;
    double rc = ratio(flops, pa->mach.host_flops), rn = ratio(nvme, pa->mach.nvme_read_gbps);
    pa->w_s = pa->w_stall = pa->w_rows = pa->w_nvme = 0;
    int off = fabs(log(rc)) > log(REPLAN_DRIFT) || fabs(log(rn)) > log(REPLAN_DRIFT);
    pa->drifted = off ? pa->drifted + 1 : 0;
    if (pa->drifted < REPLAN_WINDOWS) return 0;
    pa->drifted = 0;
    /* the planner again, with what was measured */
    zs_plan_machine m = pa->mach;
    if (rc != 1) m.host_flops = flops;
    if (rn != 1) m.nvme_read_gbps = nvme;
    zs_plan p;
    if (zs_plan_run(&pa->pm, &m, &pa->l, &p) < 0) {
        zs_log_warn("plan: re-planning from measured figures failed: %s", zs_errmsg());
        return 0;
    }
    const zs_plan_point *a = &pa->p.best, *b = &p.best;
    int moved = a->layers[ZS_PLAN_DEVICE] != b->layers[ZS_PLAN_DEVICE] || a->kv_tier != b->kv_tier ||
                fabs(a->live_bytes - b->live_bytes) > 0.1 * ZS_MAX(a->live_bytes, 1.0) || a->batch != b->batch;
    pa->replans++;
    json_decref(pa->replanned);
    pa->replanned = json_pack("{s:i,s:{s:f,s:f},s:{s:f,s:f},s:{s:f,s:f},s:b,s:s}", "count", pa->replans, "measured",
                              "flops", flops, "nvme_read_gbps", nvme, "planned", "flops", pa->mach.host_flops,
                              "nvme_read_gbps", pa->mach.nvme_read_gbps, "predicted_tokens_per_s", "before", a->tok_s,
                              "now", b->tok_s, "placement_changed", moved,
                              "applied", moved ? "at the next start: the weights' tiers, the live budget and the KV "
                                                 "cache are sized when the engine opens"
                                               : "nothing to change: the same placement");
    zs_log_info("plan: measured %.1f GFLOP/s%s%.2f GB/s NVMe reads against the %.1f GFLOP/s and %.2f GB/s planned, "
                "%d windows in a row: re-planned: %d of %d layers in memory, KV in %s, batch %d, %.1f tokens/s predicted "
                "(was %.1f)%s", flops / 1e9, nvme > 0 ? " and " : " (NVMe not waited for: ", nvme > 0 ? nvme : pa->mach.nvme_read_gbps,
                pa->mach.host_flops / 1e9, pa->mach.nvme_read_gbps, REPLAN_WINDOWS, b->layers[ZS_PLAN_DEVICE], pa->layers,
                b->kv_tier == ZS_PLAN_DEVICE ? "memory" : zs_plan_tier_name(b->kv_tier), b->batch, b->tok_s, a->tok_s,
                moved ? "; the placement changed, and a restart applies it (tiers and buffers are sized at start)" : "");
    pa->mach = m;
    pa->p = p;
    if (!(*json = zs_plan_auto_json(pa))) return zs_err(ZS_ENOMEM, "out of memory");
    return 1;
}
