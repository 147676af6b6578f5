/* plan-auto.c — --offload auto (plan-auto.h): this machine measured, the planner run for the
 * opened model and the engine's sessions, its placement written into the engine's options. */
#include "plan-auto.h"

#include <jansson.h>
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

/* a placement as JSON */
static json_t *point_json(const zs_plan_point *p) {
    return json_pack("{s:i,s:f,s:s,s:f,s:f,s:f,s:{s:i,s:i},s:s,s:f,s:f}", "batch", p->batch, "tokens_per_s", p->tok_s,
                     "bound", p->bound ? p->bound : "", "pass_s", p->t_pass, "io_s", p->t_io, "compute_s", p->t_compute,
                     "layers", "memory", p->layers[ZS_PLAN_DEVICE], "nvme", p->layers[ZS_PLAN_NVME], "kv_tier",
                     p->kv_tier == ZS_PLAN_DEVICE ? "memory" : zs_plan_tier_name(p->kv_tier), "kv_bytes", p->kv_bytes,
                     "live_bytes", p->live_bytes);
}

int zs_plan_auto_apply(const zs_model *m, zs_engine_opts *o, unsigned gave, char **json) {
    *json = NULL;
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
    json_t *root = json_pack("{s:s,s:{s:f,s:f,s:f,s:f,s:f},s:{s:s,s:f,s:f,s:i},s:{s:i,s:i,s:i},s:o,s:o,s:o,s:s}",
                             "mode", "auto", "machine", "memory_bytes", mach.host_mem, "memory_gbps", mach.host_gbps,
                             "flops", mach.host_flops, "nvme_read_gbps", mach.nvme_read_gbps, "nvme_write_gbps",
                             mach.nvme_write_gbps, "model", "name", pm.name, "weight_bytes", p.weight_bytes,
                             "kv_bytes_per_position", p.kv_per_pos, "layers", c->n_layers, "load", "prompt", l.prompt,
                             "output", l.output, "max_batch", l.max_batch, "best", point_json(b), "batch_1",
                             point_json(&p.b1), "applied", applied, "given", over[0] ? over + 1 : "");
    *json = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    return *json ? 0 : zs_err(ZS_ENOMEM, "out of memory");
}
