/* plan-cmd.c — `zeroserve plan`: where a model's weights, experts and KV cache should live on a
 * machine (a named one, this one measured, or figures given as flags), the batch, and the decode
 * tokens/s the planner predicts at batch 1 and at the best batch, with speculation on and off,
 * with the bound (I/O or compute) and the figures behind it; --json prints the same as one object.
 * The planner and its cost model: engine/runtime/plan.h; the comparison with published systems:
 * docs/plan.md. */
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "cli.h"
#include "common.h"
#include "plan.h"

int zs_cmd_plan(int argc, char **argv);

#define NVME_WRITE_SHARE 0.5   /* without --nvme-write-gbps: drives sustain about half their read rate */
#define HOST_TFLOPS_DEFAULT 2.0 /* without --host-tflops (plan-machines.c's typical host) */
#define KV_DTYPE_DEFAULT "f16"  /* GPU engines keep 16-bit KV; zeroserve's own default is f32 */

typedef struct {
    const char *flag;
    float v; /* NAN: not given */
} fig;

enum { F_DEV_MEM, F_HOST_MEM, F_NVME, F_HBM, F_HOST_BW, F_PCIE, F_NVME_BW, F_TFLOPS, F_NVME_W, F_HOST_TFLOPS, F_COUNT };

static int apply_figures(fig *f, int named, zs_plan_machine *m) {
    for (int i = 0; i < F_COUNT; i++)
        if (!isnan(f[i].v) && !(f[i].v > 0))
            return zs_err(ZS_EINVAL, "--%s: %g must be > 0", f[i].flag, (double)f[i].v);
    if (!named) {
        char miss[256] = "";
        for (int i = 0; i <= F_TFLOPS; i++)
            if (isnan(f[i].v)) {
                size_t k = strlen(miss);
                snprintf(miss + k, sizeof miss - k, "%s--%s", k ? ", " : "", f[i].flag);
            }
        if (miss[0]) return zs_err(ZS_EINVAL, "without --machine these figures are needed: %s", miss);
        memset(m, 0, sizeof *m);
        snprintf(m->name, sizeof m->name, "custom");
        m->devices = 1;
        m->nvme_write_gbps = f[F_NVME_BW].v * NVME_WRITE_SHARE;
        m->host_flops = HOST_TFLOPS_DEFAULT * 1e12;
    }
    double *dst[F_COUNT] = {&m->dev_mem, &m->host_mem, &m->nvme, &m->hbm_gbps, &m->host_gbps, &m->pcie_gbps,
                            &m->nvme_read_gbps, &m->dev_flops, &m->nvme_write_gbps, &m->host_flops};
    double scale[F_COUNT] = {1e9, 1e9, 1e9, ZS_PLAN_HBM_SHARE, 1, 1, 1, 1e12 * ZS_PLAN_FLOPS_SHARE, 1, 1e12};
    for (int i = 0; i < F_COUNT; i++)
        if (!isnan(f[i].v)) *dst[i] = f[i].v * scale[i];
    return 0;
}

static int parse_tier(const char *s, int *out) {
    if (!s || !strcmp(s, "auto")) { *out = ZS_PLAN_AUTO; return 0; }
    for (int t = 0; t < ZS_PLAN_TIERS; t++)
        if (!strcmp(s, zs_plan_tier_name(t))) { *out = t; return 0; }
    return zs_err(ZS_EINVAL, "--kv-tier: '%s' is not one of auto, device, host, nvme", s);
}

/* A display name: the file or directory the model came from ("llama-2-70b" for .../llama-2-70b/config.json). */
static void model_name(const char *path, char *out, size_t n) {
    char p[1024];
    snprintf(p, sizeof p, "%s", path);
    size_t k = strlen(p);
    while (k > 1 && p[k - 1] == '/') p[--k] = 0;
    if (k >= 11 && !strcmp(p + k - 11, "config.json")) {
        p[k - 11] = 0;
        k -= 11;
        while (k > 1 && p[k - 1] == '/') p[--k] = 0;
    }
    const char *b = strrchr(p, '/'), *src = b && b[1] ? b + 1 : p[0] ? p : path;
    size_t len = strlen(src) < n - 1 ? strlen(src) : n - 1; /* a long name is cut */
    memcpy(out, src, len);
    out[len] = 0;
}

static const char *where(int t, int no_dev) { return no_dev && t == ZS_PLAN_DEVICE ? "host memory" : zs_plan_tier_name(t); }

static void print_point(const char *title, const zs_plan_point *p, const zs_plan *r, const zs_plan_model *m) {
    int nd = r->no_device;
    printf("\n%s:\n", title);
    printf("  batch %d, speculation %s: decode %.4g tokens/s (%.4g with prefill, %.4g tokens per pass); %s-bound by %s\n",
           p->batch, p->spec ? "on" : "off", p->tok_s, p->e2e_tok_s, p->tokens_per_pass, p->io_bound ? "I/O" : "compute",
           p->bound);
    printf("  pass %.4g s = max(I/O %.4g s [NVMe %.4g, PCIe %.4g], compute %.4g s [device %.4g, host %.4g])\n", p->t_pass,
           p->t_io, p->t_nvme, p->t_pcie, p->t_compute, p->t_dev, p->t_host);
    printf("  per token %.4g ms: I/O %.4g ms, compute %.4g ms; prefill %.4g s\n", 1e3 * p->t_pass / p->tokens_per_pass,
           1e3 * p->t_io / p->tokens_per_pass, 1e3 * p->t_compute / p->tokens_per_pass, p->t_prefill);
    printf("  moved per pass: PCIe %.3g GB, device memory %.3g GB, host memory %.3g GB; %.3g TFLOP on the device, %.3g on the host\n",
           p->bytes_pcie / 1e9, p->bytes_dev / 1e9, p->bytes_host / 1e9, p->flops_dev / 1e12, p->flops_host / 1e12);
    printf("  weights: head on %s; layers %d %s / %d host / %d nvme (%.3g / %.3g / %.3g GB)\n", where(p->head_tier, nd),
           p->layers[0], where(0, nd), p->layers[1], p->layers[2], p->weight_bytes[0] / 1e9, p->weight_bytes[1] / 1e9,
           p->weight_bytes[2] / 1e9);
    if (m->experts > 0)
        printf("  experts: layers %d %s / %d host / %d nvme\n", p->expert_layers[0], where(0, nd), p->expert_layers[1],
               p->expert_layers[2]);
    printf("  KV: %s, %.3g GB (attention on the %s); live budget %.3g GB%s\n", where(p->kv_tier, nd), p->kv_bytes / 1e9,
           p->attn_host ? "host" : nd ? "host" : "device", p->live_bytes / 1e9,
           p->live_bytes > 0 ? "" : " (nothing streamed)");
    printf("  memory used: %s %.4g of %.4g GB", where(0, nd), p->used[0] / 1e9, p->cap[0] / 1e9);
    if (!nd) printf(", host %.4g of %.4g GB", p->used[1] / 1e9, p->cap[1] / 1e9);
    printf(", nvme %.4g of %.4g GB\n", p->used[2] / 1e9, p->cap[2] / 1e9);
}

static json_t *tiers_json(const double *v, int as_int, const int *iv) {
    json_t *o = json_object();
    for (int t = 0; t < ZS_PLAN_TIERS; t++)
        json_object_set_new(o, zs_plan_tier_name(t), as_int ? json_integer(iv[t]) : json_real(v[t]));
    return o;
}

static json_t *point_json(const zs_plan_point *p, const zs_plan_model *m) {
    json_t *pl = json_pack("{s:s, s:o, s:o, s:s, s:f, s:s, s:f, s:o}", "head", zs_plan_tier_name(p->head_tier),
                           "layers", tiers_json(NULL, 1, p->layers), "weight_bytes", tiers_json(p->weight_bytes, 0, NULL),
                           "kv", zs_plan_tier_name(p->kv_tier), "kv_bytes", p->kv_bytes, "attention",
                           p->attn_host ? "host" : "device", "live_bytes", p->live_bytes, "used_bytes",
                           tiers_json(p->used, 0, NULL));
    if (m->experts > 0) json_object_set_new(pl, "expert_layers", tiers_json(NULL, 1, p->expert_layers));
    return json_pack("{s:i, s:b, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:s, s:s, s:{s:f, s:f, s:f, s:f}, "
                     "s:{s:f, s:f, s:f, s:f, s:f}, s:o}",
                     "batch", p->batch, "speculation", p->spec, "tokens_per_s", p->tok_s, "e2e_tokens_per_s", p->e2e_tok_s,
                     "tokens_per_pass", p->tokens_per_pass, "pass_s", p->t_pass, "prefill_s", p->t_prefill, "io_s", p->t_io,
                     "compute_s", p->t_compute, "per_token_io_s", p->t_io / p->tokens_per_pass, "per_token_compute_s",
                     p->t_compute / p->tokens_per_pass, "bound", p->io_bound ? "io" : "compute", "bound_by", p->bound,
                     "times_s", "nvme", p->t_nvme, "pcie", p->t_pcie, "device", p->t_dev, "host", p->t_host,
                     "per_pass", "pcie_bytes", p->bytes_pcie, "device_bytes", p->bytes_dev, "host_bytes", p->bytes_host,
                     "device_flops", p->flops_dev, "host_flops", p->flops_host, "placement", pl);
}

static int print_json(const zs_plan *r, const zs_plan_model *m, const zs_plan_machine *mc, const zs_plan_load *l,
                      const char *path) {
    json_t *o = json_pack(
        "{s:{s:s, s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:f, s:f, s:f, s:f, s:f}, "
        "s:{s:s, s:b, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}, "
        "s:{s:i, s:i, s:i, s:i, s:i, s:f, s:f}}",
        "model", "name", m->name, "path", path, "layers", m->layers, "hidden", m->hidden, "ffn", m->ffn, "heads", m->heads,
        "kv_heads", m->kv_heads, "head_dim", m->head_dim, "vocab", m->vocab, "experts", m->experts, "active_experts",
        m->active_experts, "params", r->params, "active_params", r->active_params, "bytes_per_weight", m->bytes_per_weight,
        "bytes_per_kv", m->bytes_per_kv, "weight_bytes", r->weight_bytes, "embed_bytes", r->embed_bytes,
        "kv_bytes_per_position", r->kv_per_pos,
        "machine", "name", mc->name, "device", !r->no_device, "device_mem_bytes", mc->dev_mem, "host_mem_bytes",
        mc->host_mem, "nvme_bytes", mc->nvme, "hbm_gbps", mc->hbm_gbps, "host_gbps", mc->host_gbps, "pcie_gbps",
        mc->pcie_gbps, "nvme_read_gbps", mc->nvme_read_gbps, "nvme_write_gbps", mc->nvme_write_gbps, "device_flops",
        mc->dev_flops, "host_flops", mc->host_flops,
        "load", "prompt", l->prompt, "output", l->output, "max_batch", l->max_batch, "batch", l->batch, "spec_drafts",
        l->spec_k, "spec_accept", l->spec_accept, "spec_tokens_per_pass", r->spec_tokens);
    if (!o) return zs_err(ZS_ENOMEM, "plan: cannot build the JSON answer");
    json_object_set_new(o, "batch1", point_json(&r->b1, m));
    json_object_set_new(o, "batch1_spec", point_json(&r->b1_spec, m));
    json_object_set_new(o, "best", point_json(&r->best, m));
    json_object_set_new(o, "best_spec", point_json(&r->best_spec, m));
    char *s = json_dumps(o, JSON_INDENT(2) | JSON_REAL_PRECISION(6));
    json_decref(o);
    if (!s) return zs_err(ZS_ENOMEM, "plan: cannot write the JSON answer");
    puts(s);
    free(s);
    return 0;
}

static void print_text(const zs_plan *r, const zs_plan_model *m, const zs_plan_machine *mc, const zs_plan_load *l) {
    printf("model   %s: %d layers, hidden %d, FFN %d (%d matrices), %d heads (%d KV) of %d, vocab %d", m->name, m->layers,
           m->hidden, m->ffn, m->mlp_mats, m->heads, m->kv_heads, m->head_dim, m->vocab);
    if (m->experts > 0)
        printf(", %d of %d experts of FFN %d in %d layers", m->active_experts, m->experts, m->expert_ffn, m->moe_layers);
    printf("\n        %.4g e9 parameters (%.4g e9 per token); %.4g bytes per weight: %.4g GB streamed or resident "
           "+ %.3g GB embedding table in host memory; KV %.4g MB per position (%.3g bytes per element)\n",
           r->params / 1e9, r->active_params / 1e9, m->bytes_per_weight, r->weight_bytes / 1e9, r->embed_bytes / 1e9,
           r->kv_per_pos / 1e6, m->bytes_per_kv);
    if (r->no_device)
        printf("machine %s: no device (the host computes): host %.4g GB, %.4g GB/s, %.3g TFLOP/s", mc->name,
               mc->host_mem / 1e9, mc->host_gbps, mc->host_flops / 1e12);
    else
        printf("machine %s: device %.4g GB, %.4g GB/s, %.4g TFLOP/s counted | host %.4g GB, %.4g GB/s, %.3g TFLOP/s | "
               "PCIe %.4g GB/s", mc->name, mc->dev_mem / 1e9, mc->hbm_gbps, mc->dev_flops / 1e12, mc->host_mem / 1e9,
               mc->host_gbps, mc->host_flops / 1e12, mc->pcie_gbps);
    if (mc->nvme > 0)
        printf(" | NVMe %.4g GB, read %.3g GB/s, write %.3g GB/s\n", mc->nvme / 1e9, mc->nvme_read_gbps, mc->nvme_write_gbps);
    else
        printf(" | no NVMe\n");
    printf("load    prompt %d + output %d (mean context %.1f); batch %s%d; speculation: %d drafts accepted with %.2f "
           "each = %.3g tokens per pass (a chain; drafts cost nothing)\n",
           l->prompt, l->output, l->prompt + l->output / 2.0, l->batch ? "" : "1 .. ", l->batch ? l->batch : l->max_batch,
           l->spec_k, l->spec_accept, r->spec_tokens);
    printf("\n%-22s %6s %12s %14s %14s %14s  %s\n", "", "batch", "tokens/s", "with prefill", "I/O per tok", "compute/tok",
           "bound");
    const zs_plan_point *pts[4] = {&r->b1, &r->b1_spec, &r->best, &r->best_spec};
    const char *names[4] = {"batch 1", "batch 1, speculation", l->batch ? "batch asked" : "best batch",
                            l->batch ? "batch asked, spec." : "best batch, spec."};
    for (int i = 0; i < 4; i++) {
        const zs_plan_point *p = pts[i];
        printf("%-22s %6d %12.4g %14.4g %11.4g ms %11.4g ms  %s (%s)\n", names[i], p->batch, p->tok_s, p->e2e_tok_s,
               1e3 * p->t_io / p->tokens_per_pass, 1e3 * p->t_compute / p->tokens_per_pass,
               p->io_bound ? "I/O" : "compute", p->bound);
    }
    for (int i = 0; i < 4; i++) print_point(names[i], pts[i], r, m);
}

int zs_cmd_plan(int argc, char **argv) {
    const char *model = NULL, *machine = NULL, *nvme_path = NULL, *wdt = NULL, *kdt = NULL, *kv_tier = NULL;
    int json = 0, resident = INT_MIN, batch = INT_MIN;
    float accept = (float)ZS_PLAN_SPEC_ACCEPT;
    zs_plan_load l;
    zs_plan_load_default(&l);
    fig f[F_COUNT] = {{"device-mem-gb", NAN}, {"host-mem-gb", NAN}, {"nvme-gb", NAN}, {"hbm-gbps", NAN},
                      {"host-gbps", NAN}, {"pcie-gbps", NAN}, {"nvme-gbps", NAN}, {"tflops", NAN},
                      {"nvme-write-gbps", NAN}, {"host-tflops", NAN}};
    zs_opt opts[] = {
        {"model", ZS_OPT_STR, &model, "a model directory, a .gguf file or a config.json (sizes only suffice)  [required]"},
        {"machine", ZS_OPT_STR, &machine, "H200 | A100-80G | L40 | RTX4090 | A6000 | T4 | local (this machine, measured); the figures below override"},
        {"nvme-path", ZS_OPT_STR, &nvme_path, "with --machine local: a directory on the NVMe drive to measure (a 256 MiB probe file, removed)"},
        {"device-mem-gb", ZS_OPT_FLOAT, &f[F_DEV_MEM].v, "device memory, GB"},
        {"host-mem-gb", ZS_OPT_FLOAT, &f[F_HOST_MEM].v, "host memory, GB"},
        {"nvme-gb", ZS_OPT_FLOAT, &f[F_NVME].v, "NVMe space, GB"},
        {"hbm-gbps", ZS_OPT_FLOAT, &f[F_HBM].v, "device memory bandwidth, GB/s (datasheet: 80 % is counted)"},
        {"host-gbps", ZS_OPT_FLOAT, &f[F_HOST_BW].v, "host memory read bandwidth, GB/s (achieved)"},
        {"pcie-gbps", ZS_OPT_FLOAT, &f[F_PCIE].v, "host-to-device bandwidth, GB/s (achieved)"},
        {"nvme-gbps", ZS_OPT_FLOAT, &f[F_NVME_BW].v, "NVMe read bandwidth, GB/s (achieved)"},
        {"tflops", ZS_OPT_FLOAT, &f[F_TFLOPS].v, "device dense FP16 TFLOP/s (datasheet: 60 % is counted)"},
        {"nvme-write-gbps", ZS_OPT_FLOAT, &f[F_NVME_W].v, "NVMe write bandwidth, GB/s (default: half the read rate)"},
        {"host-tflops", ZS_OPT_FLOAT, &f[F_HOST_TFLOPS].v, "host f32 TFLOP/s (default 2)"},
        {"weight-dtype", ZS_OPT_STR, &wdt, "f32 | f16 | bf16 | q8_0 | q4_0 | q4_1 | q5_0 | q5_1 | q2_k .. q6_k | q4_k_m (default: as stored)"},
        {"kv-dtype", ZS_OPT_STR, &kdt, "KV elements: f32 | f16 | bf16 (default f16)"},
        {"prompt", ZS_OPT_INT, &l.prompt, "prompt tokens per sequence (default 512)"},
        {"output", ZS_OPT_INT, &l.output, "output tokens per sequence (default 32)"},
        {"max-batch", ZS_OPT_INT, &l.max_batch, "the largest batch the search considers (default 256)"},
        {"batch", ZS_OPT_INT, &batch, "plan this batch only (instead of the best one)"},
        {"spec-k", ZS_OPT_INT, &l.spec_k, "drafts per sequence and pass with speculation (default 4)"},
        {"spec-accept", ZS_OPT_FLOAT, &accept, "each draft's acceptance, in [0, 1) (default 0.7)"},
        {"kv-tier", ZS_OPT_STR, &kv_tier, "auto (default) | device | host | nvme: where the KV cache must live"},
        {"resident-layers", ZS_OPT_INT, &resident, "at most this many layers resident on the device (0: every weight streamed, the head too); default: as many as fit"},
        {"json", ZS_OPT_FLAG, &json, "print the plan as one JSON object"},
    };
    int n_opts = (int)(sizeof opts / sizeof opts[0]);
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            zs_cli_usage("plan", "Plans where weights, experts and the KV cache live on a machine, the batch, and the "
                         "decode tokens/s that follow (cost model: engine/runtime/plan.h; docs/plan.md).", opts, n_opts);
            return 0;
        }
    ZS_CHECK(zs_cli_parse(argc, argv, opts, n_opts));
    if (!model) return zs_err(ZS_EINVAL, "--model is required");
    if (batch != INT_MIN && batch < 1) return zs_err(ZS_EINVAL, "--batch: %d must be >= 1", batch);
    if (resident != INT_MIN && resident < 0) return zs_err(ZS_EINVAL, "--resident-layers: %d must be >= 0", resident);
    if (l.prompt < 1) return zs_err(ZS_EINVAL, "--prompt: %d must be >= 1", l.prompt);
    if (l.output < 1) return zs_err(ZS_EINVAL, "--output: %d must be >= 1", l.output);
    if (l.max_batch < 1 || l.max_batch > ZS_PLAN_MAX_BATCH)
        return zs_err(ZS_EINVAL, "--max-batch: %d must be between 1 and %d", l.max_batch, ZS_PLAN_MAX_BATCH);
    if (batch > ZS_PLAN_MAX_BATCH) return zs_err(ZS_EINVAL, "--batch: %d must be at most %d", batch, ZS_PLAN_MAX_BATCH);
    if (l.spec_k < 1 || l.spec_k > 64) return zs_err(ZS_EINVAL, "--spec-k: %d must be between 1 and 64", l.spec_k);
    if (!(accept >= 0 && accept < 1)) return zs_err(ZS_EINVAL, "--spec-accept: %g must be in [0, 1)", (double)accept);
    l.batch = batch == INT_MIN ? 0 : batch;
    l.resident_layers = resident == INT_MIN ? ZS_PLAN_AUTO : resident;
    l.spec_accept = accept;
    ZS_CHECK(parse_tier(kv_tier, &l.kv_tier));
    if (nvme_path && (!machine || strcasecmp(machine, "local")))
        return zs_err(ZS_EINVAL, "--nvme-path measures this machine: it needs --machine local");

    zs_plan_model m;
    ZS_CHECK(zs_plan_model_load(model, &m));
    model_name(model, m.name, sizeof m.name);
    if (wdt && strcmp(wdt, "auto")) ZS_CHECK(zs_plan_dtype_bytes("--weight-dtype", wdt, 0, &m.bytes_per_weight));
    ZS_CHECK(zs_plan_dtype_bytes("--kv-dtype", kdt ? kdt : KV_DTYPE_DEFAULT, 1, &m.bytes_per_kv));

    zs_plan_machine mc;
    memset(&mc, 0, sizeof mc);
    if (machine && !strcasecmp(machine, "local")) {
        zs_log_info("plan: measuring this machine (host memory bandwidth, matmul FLOP/s%s)", nvme_path ? ", NVMe" : "");
        ZS_CHECK(zs_plan_machine_local(nvme_path, &mc));
    } else if (machine) {
        ZS_CHECK(zs_plan_machine_find(machine, &mc));
    }
    ZS_CHECK(apply_figures(f, machine != NULL, &mc));

    zs_plan r;
    ZS_CHECK(zs_plan_run(&m, &mc, &l, &r));
    if (json) return print_json(&r, &m, &mc, &l, model);
    print_text(&r, &m, &mc, &l);
    return 0;
}
