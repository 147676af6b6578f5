/* test-plan.c — the placement planner (engine/runtime/plan.h): decisions on synthetic machines (a
 * model that fits stays on the device and is compute-bound at large batch; one that does not
 * streams from host memory or NVMe and is I/O-bound at batch 1; more device memory never predicts
 * less; the best batch fits its memory and the next one does not; speculation raises batch-1
 * tokens/s; experts are placed after the dense parts; no device means the host computes), the
 * anchor configs of tests/ref/plan (about 69e9 and 175e9 parameters), a GGUF file, the named
 * machines, determinism, and every bad input refused with a message that names it. Re-planning
 * (plan-auto.h): steps whose compute is far from the measured machine's re-plan after three
 * windows, not before, with the measured figure in the new plan's machine and its "replanned"
 * part; steps that match it do not. */
#include <math.h>
#include <string.h>

#include "common.h"
#include "plan-auto.h"
#include "plan.h"
#include "testutil.h"

static zs_plan_machine gpu(double dev_gb, double host_gb, double nvme_gb) {
    zs_plan_machine m;
    memset(&m, 0, sizeof m);
    snprintf(m.name, sizeof m.name, "synthetic");
    m.devices = 1;
    m.dev_mem = dev_gb * 1e9;
    m.host_mem = host_gb * 1e9;
    m.nvme = nvme_gb * 1e9;
    m.hbm_gbps = 2000;
    m.host_gbps = 100;
    m.pcie_gbps = 25;
    m.nvme_read_gbps = 3;
    m.nvme_write_gbps = 2;
    m.dev_flops = 300e12;
    m.host_flops = 2e12;
    return m;
}

/* Llama-shaped: 32 layers of 4096 (7.2e9 parameters) or 80 of 8192 (69e9), GQA, bf16. */
static zs_plan_model llama(int big) {
    zs_plan_model m;
    memset(&m, 0, sizeof m);
    snprintf(m.name, sizeof m.name, big ? "llama-70b" : "llama-7b");
    m.layers = big ? 80 : 32;
    m.hidden = big ? 8192 : 4096;
    m.ffn = big ? 28672 : 14336;
    m.heads = big ? 64 : 32;
    m.kv_heads = 8;
    m.head_dim = 128;
    m.vocab = 32000;
    m.mlp_mats = 3;
    m.bytes_per_weight = 2;
    m.bytes_per_kv = 2;
    return m;
}

static void check_fits(const zs_plan_point *p, const char *what) {
    for (int t = 0; t < ZS_PLAN_TIERS; t++)
        CHECK(p->used[t] <= p->cap[t] * (1 + 1e-12), "%s: tier %s uses %.4g of %.4g bytes", what, zs_plan_tier_name(t),
              p->used[t], p->cap[t]);
    CHECK(p->layers[0] + p->layers[1] + p->layers[2] > 0, "%s: no layers placed", what);
}

static void test_fits_on_device(void) {
    zs_plan_model m = llama(0);
    zs_plan_machine mc = gpu(80, 256, 2000);
    zs_plan_load l;
    zs_plan_load_default(&l);
    l.prompt = 128;
    l.output = 32;
    l.max_batch = 1024;
    zs_plan r;
    CHECK(zs_plan_run(&m, &mc, &l, &r) == 0, "plan: %s", zs_errmsg());
    const zs_plan_point *p = &r.best;
    CHECK(p->layers[0] == 32 && p->head_tier == ZS_PLAN_DEVICE && p->live_bytes == 0, "resident: %d layers, head %d, live %g",
          p->layers[0], p->head_tier, p->live_bytes);
    CHECK(p->kv_tier == ZS_PLAN_DEVICE && p->bytes_pcie == 0, "KV on %s, PCIe %g", zs_plan_tier_name(p->kv_tier), p->bytes_pcie);
    CHECK(p->batch > 64 && p->batch < 1024, "best batch %d: the knee where compute takes over", p->batch);
    CHECK(!p->io_bound && !strcmp(p->bound, "device compute"), "large batch bound by %s", p->bound);
    CHECK(!r.b1.io_bound && !strcmp(r.b1.bound, "device memory"), "batch 1 bound by %s", r.b1.bound);
    /* batch 1 reads every weight once from device memory */
    CHECK(tu_close(r.b1.t_pass, r.b1.bytes_dev / (mc.hbm_gbps * 1e9), 0, 1e-12), "batch-1 pass %g", r.b1.t_pass);
    CHECK(r.best.tok_s > 100 * r.b1.tok_s, "best %g vs batch 1 %g", r.best.tok_s, r.b1.tok_s);
    check_fits(p, "resident best");
    double total, active;
    zs_plan_model_params(&m, &total, &active);
    CHECK(fabs(total - 7.24e9) < 0.02e9 && total == active + 32000.0 * 4096, "7B parameters %g / %g", total, active);
}

static void test_streams(void) {
    zs_plan_model m = llama(1); /* 138 GB of bf16 weights */
    zs_plan_machine mc = gpu(24, 256, 2000);
    zs_plan_load l;
    zs_plan_load_default(&l);
    zs_plan r;
    CHECK(zs_plan_run(&m, &mc, &l, &r) == 0, "plan: %s", zs_errmsg());
    const zs_plan_point *p = &r.b1;
    CHECK(p->layers[0] > 0 && p->layers[0] < 80 && p->layers[1] == 80 - p->layers[0] && p->layers[2] == 0,
          "host stream: %d / %d / %d", p->layers[0], p->layers[1], p->layers[2]);
    CHECK(p->io_bound && !strcmp(p->bound, "PCIe"), "batch 1 bound by %s", p->bound);
    CHECK(p->live_bytes >= 2 * p->weight_bytes[1] / p->layers[1] * 0.999, "live %g", p->live_bytes);
    CHECK(tu_close(p->t_pass, p->weight_bytes[1] / 25e9, 0, 1e-9), "pass %g = host bytes / PCIe", p->t_pass);
    check_fits(p, "host stream b1");
    check_fits(&r.best, "host stream best");
    CHECK(r.best.tok_s > 10 * r.b1.tok_s, "batching amortises the stream: %g vs %g", r.best.tok_s, r.b1.tok_s);

    mc = gpu(24, 64, 2000); /* the host holds a third: the rest from NVMe */
    CHECK(zs_plan_run(&m, &mc, &l, &r) == 0, "plan: %s", zs_errmsg());
    p = &r.b1;
    CHECK(p->layers[2] > 0 && p->weight_bytes[ZS_PLAN_NVME] > 0 && p->layers[1] > 0, "NVMe stream: %d / %d / %d",
          p->layers[0], p->layers[1], p->layers[2]);
    CHECK(p->io_bound && !strcmp(p->bound, "NVMe"), "batch 1 bound by %s", p->bound);
    check_fits(p, "nvme stream b1");
    check_fits(&r.best, "nvme stream best");

    mc = gpu(24, 64, 50); /* nowhere to put it */
    CHECK_ERR(zs_plan_run(&m, &mc, &l, &r), "does not fit", "GB of weights");
}

static void test_monotone(void) {
    zs_plan_model m = llama(1);
    zs_plan_load l;
    zs_plan_load_default(&l);
    double prev[4] = {0, 0, 0, 0};
    for (int gb = 8; gb <= 200; gb += 4) {
        zs_plan_machine mc = gpu(gb, 256, 2000);
        zs_plan r;
        CHECK(zs_plan_run(&m, &mc, &l, &r) == 0, "%d GB: %s", gb, zs_errmsg());
        double v[4] = {r.b1.tok_s, r.b1_spec.tok_s, r.best.tok_s, r.best_spec.tok_s};
        for (int i = 0; i < 4; i++) {
            CHECK(v[i] >= prev[i] * (1 - 1e-12), "device %d GB: point %d predicts %g < %g with less memory", gb, i, v[i], prev[i]);
            prev[i] = v[i];
        }
    }
    /* more host memory or a faster link never hurts either */
    zs_plan r1, r2;
    zs_plan_machine a = gpu(24, 128, 2000), b = gpu(24, 512, 2000);
    CHECK(zs_plan_run(&m, &a, &l, &r1) == 0 && zs_plan_run(&m, &b, &l, &r2) == 0, "%s", zs_errmsg());
    CHECK(r2.best.tok_s >= r1.best.tok_s && r2.b1.tok_s >= r1.b1.tok_s, "host memory: %g %g", r1.best.tok_s, r2.best.tok_s);
}

static void test_batch_memory(void) {
    zs_plan_model m = llama(0);
    zs_plan_machine mc = gpu(24, 256, 2000);
    zs_plan_load l;
    zs_plan_load_default(&l);
    l.prompt = 2048;
    l.output = 512;
    l.max_batch = 4096;
    l.kv_tier = ZS_PLAN_DEVICE;
    zs_plan r;
    CHECK(zs_plan_run(&m, &mc, &l, &r) == 0, "plan: %s", zs_errmsg());
    int b = r.best.batch;
    CHECK(b > 1 && b < 4096, "device KV caps the batch: %d", b);
    check_fits(&r.best, "device KV best");
    CHECK(r.best.kv_bytes == (double)b * 2560 * r.kv_per_pos, "KV bytes %g", r.best.kv_bytes);
    /* the largest batch that fits: one more does not */
    int last = 0;
    for (int B = b; B <= 4096; B++) {
        l.batch = B;
        zs_plan rr;
        if (zs_plan_run(&m, &mc, &l, &rr) < 0) break;
        check_fits(&rr.best, "asked batch");
        last = B;
    }
    CHECK(last >= b && last < 4096, "largest fitting batch %d (best %d)", last, b);
    l.batch = last + 1;
    CHECK_ERR(zs_plan_run(&m, &mc, &l, &r), "batch", "does not fit");
    /* the KV on the host lets the batch grow past it */
    l.batch = last + 1;
    l.kv_tier = ZS_PLAN_HOST;
    CHECK(zs_plan_run(&m, &mc, &l, &r) == 0, "plan: %s", zs_errmsg());
    CHECK(r.best.kv_tier == ZS_PLAN_HOST && r.best.batch == last + 1, "host KV batch %d", r.best.batch);
    check_fits(&r.best, "host KV batch");
    l.batch = 0;
    l.kv_tier = ZS_PLAN_AUTO;
    CHECK(zs_plan_run(&m, &mc, &l, &r) == 0, "plan: %s", zs_errmsg());
    check_fits(&r.best, "auto KV best");
    check_fits(&r.best_spec, "auto KV best, speculation");
}

static void test_speculation(void) {
    CHECK(tu_close(zs_plan_spec_tokens(4, 0.7), (1 - pow(0.7, 5)) / 0.3, 0, 1e-12), "E(4, 0.7)");
    CHECK(tu_close(zs_plan_spec_tokens(4, 0.7), 2.7731, 1e-4, 0), "E = %g", zs_plan_spec_tokens(4, 0.7));
    CHECK(zs_plan_spec_tokens(8, 0.0) == 1.0, "no acceptance, one token");
    zs_plan_model m = llama(1);
    zs_plan_machine mc = gpu(24, 256, 2000);
    zs_plan_load l;
    zs_plan_load_default(&l);
    zs_plan r;
    CHECK(zs_plan_run(&m, &mc, &l, &r) == 0, "plan: %s", zs_errmsg());
    CHECK(r.b1_spec.tok_s > 2.5 * r.b1.tok_s, "speculation at batch 1: %g vs %g", r.b1_spec.tok_s, r.b1.tok_s);
    CHECK(r.b1_spec.rows == 5 && r.b1_spec.tokens_per_pass == r.spec_tokens, "rows %g, tokens %g", r.b1_spec.rows,
          r.b1_spec.tokens_per_pass);
    /* resident and compute-bound at a large batch, verifying drafts costs more than it gains */
    zs_plan_model s = llama(0);
    mc = gpu(80, 256, 2000);
    l.prompt = 128;
    l.max_batch = 1024;
    l.batch = 1024;
    CHECK(zs_plan_run(&s, &mc, &l, &r) == 0, "plan: %s", zs_errmsg());
    CHECK(r.best_spec.tok_s < r.best.tok_s, "compute-bound speculation %g vs %g", r.best_spec.tok_s, r.best.tok_s);
    CHECK(r.b1_spec.tok_s > r.b1.tok_s, "memory-bound speculation at batch 1 %g vs %g", r.b1_spec.tok_s, r.b1.tok_s);
}

static void test_moe(void) {
    zs_plan_model m = llama(0);
    m.experts = 8;
    m.active_experts = 2;
    m.expert_ffn = 14336;
    m.moe_layers = 32;
    m.ffn = 14336;
    double total, active;
    zs_plan_model_params(&m, &total, &active);
    CHECK(fabs(total - 46.7e9) < 0.2e9 && fabs(active - 12.9e9) < 0.2e9, "Mixtral-shaped: %g / %g", total, active);
    zs_plan_machine mc = gpu(48, 256, 2000);
    zs_plan_load l;
    zs_plan_load_default(&l);
    zs_plan r;
    CHECK(zs_plan_run(&m, &mc, &l, &r) == 0, "plan: %s", zs_errmsg());
    const zs_plan_point *p = &r.b1;
    CHECK(p->layers[0] == 32 && p->head_tier == ZS_PLAN_DEVICE, "dense parts resident first: %d", p->layers[0]);
    CHECK(p->expert_layers[0] > 0 && p->expert_layers[0] < 32 && p->expert_layers[1] == 32 - p->expert_layers[0],
          "experts split: %d / %d / %d", p->expert_layers[0], p->expert_layers[1], p->expert_layers[2]);
    /* batch 1 touches 2 of 8 experts per layer; a large batch touches nearly all */
    double xl = (p->weight_bytes[1]) / p->expert_layers[1];
    CHECK(tu_close(p->bytes_pcie, p->expert_layers[1] * xl * 0.25, 0, 1e-9), "batch 1 streams a quarter: %g", p->bytes_pcie);
    CHECK(r.best.batch > 1 && r.best.bytes_pcie > 3.5 * p->bytes_pcie, "large batch streams more: %g", r.best.bytes_pcie);
    check_fits(&r.best, "moe best");
    m.active_experts = 9;
    CHECK_ERR(zs_plan_run(&m, &mc, &l, &r), "active experts");
}

static void test_no_device(void) {
    zs_plan_model m = llama(0);
    zs_plan_machine mc = gpu(0, 64, 500);
    mc.hbm_gbps = mc.pcie_gbps = mc.dev_flops = 0;
    zs_plan_load l;
    zs_plan_load_default(&l);
    zs_plan r;
    CHECK(zs_plan_run(&m, &mc, &l, &r) == 0, "plan: %s", zs_errmsg());
    CHECK(r.no_device && r.b1.layers[0] == 32 && r.b1.layers[1] == 0 && r.b1.t_pcie == 0, "host computes: %d layers",
          r.b1.layers[0]);
    CHECK(tu_close(r.b1.t_pass, r.b1.bytes_dev / 100e9, 0, 1e-9) && !strcmp(r.b1.bound, "host memory"),
          "host memory bound: %g, %s", r.b1.t_pass, r.b1.bound);
    mc.host_mem = 12e9; /* the rest streams from NVMe into host memory */
    CHECK(zs_plan_run(&m, &mc, &l, &r) == 0, "plan: %s", zs_errmsg());
    CHECK(r.b1.layers[2] > 0 && !strcmp(r.b1.bound, "NVMe"), "NVMe stream without a device: %d, %s", r.b1.layers[2], r.b1.bound);
    l.kv_tier = ZS_PLAN_HOST;
    CHECK_ERR(zs_plan_run(&m, &mc, &l, &r), "without a device");
}

static void test_anchors(void) {
    zs_plan_model m;
    double total, active;
    CHECK(zs_plan_model_load("tests/ref/plan/llama-2-70b/config.json", &m) == 0, "llama: %s", zs_errmsg());
    zs_plan_model_params(&m, &total, &active);
    CHECK(fabs(total - 69e9) < 0.01 * 69e9, "LLaMA-2-70B: %.4g parameters", total);
    CHECK(fabs(total - 68.976e9) < 0.001e9, "LLaMA-2-70B exactly: %.6g", total);
    CHECK(m.mlp_mats == 3 && !m.tied && m.kv_heads == 8 && m.head_dim == 128 && m.bytes_per_weight == 2, "llama fields");
    CHECK(zs_plan_model_load("tests/ref/plan/opt-175b", &m) == 0, "opt: %s", zs_errmsg());
    zs_plan_model_params(&m, &total, &active);
    CHECK(fabs(total - 175e9) < 0.01 * 175e9, "OPT-175B: %.4g parameters", total);
    CHECK(m.mlp_mats == 2 && m.tied && m.kv_heads == 96 && m.head_dim == 128 && m.max_pos == 2048 && m.ffn == 49152,
          "opt fields: mats %d tied %d kv %d hd %d pos %d", m.mlp_mats, m.tied, m.kv_heads, m.head_dim, m.max_pos);
    CHECK(m.bytes_per_weight == 2 && m.layers == 96 && m.vocab == 50272, "opt sizes");
    char p[1024];
    snprintf(p, sizeof p, "%s/models/stories260K/stories260K.gguf", tu_shared());
    if (access(p, R_OK) == 0) {
        CHECK(zs_plan_model_load(p, &m) == 0, "gguf: %s", zs_errmsg());
        CHECK(m.layers == 5 && m.hidden == 64 && m.bytes_per_weight > 0.5 && m.bytes_per_weight <= 4, "gguf: %d, %g",
              m.layers, m.bytes_per_weight);
    }
    snprintf(p, sizeof p, "%s/models/stories260K", tu_shared());
    if (access(p, R_OK) == 0) CHECK(zs_plan_model_load(p, &m) == 0 && m.layers == 5, "directory: %s", zs_errmsg());
}

static void test_machines(void) {
    zs_plan_model m;
    CHECK(zs_plan_model_load("tests/ref/plan/llama-2-70b/config.json", &m) == 0, "%s", zs_errmsg());
    zs_plan_load l;
    zs_plan_load_default(&l);
    CHECK(zs_plan_machine_count() == 6, "six named machines");
    for (int i = 0; i < zs_plan_machine_count(); i++) {
        zs_plan_machine mc, again;
        CHECK(zs_plan_machine_at(i, &mc) == 0, "machine %d", i);
        CHECK(zs_plan_machine_find(mc.name, &again) == 0 && !memcmp(&mc, &again, sizeof mc), "find %s", mc.name);
        zs_plan r1, r2;
        CHECK(zs_plan_run(&m, &mc, &l, &r1) == 0, "%s: %s", mc.name, zs_errmsg());
        CHECK(zs_plan_run(&m, &mc, &l, &r2) == 0 && !memcmp(&r1, &r2, sizeof r1), "%s: deterministic", mc.name);
        CHECK(r1.best.tok_s >= r1.b1.tok_s && r1.b1.tok_s > 0, "%s: %g %g", mc.name, r1.b1.tok_s, r1.best.tok_s);
    }
    zs_plan_machine mc;
    CHECK(zs_plan_machine_find("rtx 4090", &mc) == 0 && !strcmp(mc.name, "RTX4090"), "RTX 4090 by another spelling");
    CHECK(zs_plan_machine_find("a100-80g", &mc) == 0 && mc.dev_mem == 80e9, "A100");
    CHECK_ERR(zs_plan_machine_find("V100", &mc), "unknown machine 'V100'", "H200", "A100-80G", "L40", "RTX4090", "A6000",
              "T4", "local");
    CHECK_ERR(zs_plan_machine_at(6, &mc), "machine 6");
}

static void test_errors(void) {
    zs_plan_model m = llama(0);
    zs_plan_machine mc = gpu(80, 256, 2000);
    zs_plan_load l;
    zs_plan_load_default(&l);
    zs_plan r;
    zs_plan_model bm = m;
    bm.layers = 0;
    CHECK_ERR(zs_plan_run(&bm, &mc, &l, &r), "layer count");
    bm = m;
    bm.kv_heads = 5 * m.heads;
    CHECK_ERR(zs_plan_run(&bm, &mc, &l, &r), "KV heads");
    bm = m;
    bm.bytes_per_weight = NAN;
    CHECK_ERR(zs_plan_run(&bm, &mc, &l, &r), "bytes per weight");
    bm = m;
    bm.mlp_mats = 4;
    CHECK_ERR(zs_plan_run(&bm, &mc, &l, &r), "MLP matrices");
    zs_plan_machine bc = mc;
    bc.pcie_gbps = -1;
    CHECK_ERR(zs_plan_run(&m, &bc, &l, &r), "PCIe bandwidth");
    bc = mc;
    bc.host_mem = 0;
    CHECK_ERR(zs_plan_run(&m, &bc, &l, &r), "host memory");
    bc = mc;
    bc.nvme_read_gbps = 0;
    CHECK_ERR(zs_plan_run(&m, &bc, &l, &r), "NVMe read bandwidth");
    bc = mc;
    bc.devices = 2;
    CHECK_ERR(zs_plan_run(&m, &bc, &l, &r), "2 devices");
    zs_plan_load bl = l;
    bl.prompt = 0;
    CHECK_ERR(zs_plan_run(&m, &mc, &bl, &r), "prompt length");
    bl = l;
    bl.spec_accept = 1.0;
    CHECK_ERR(zs_plan_run(&m, &mc, &bl, &r), "acceptance");
    bl = l;
    bl.max_batch = ZS_PLAN_MAX_BATCH + 1;
    CHECK_ERR(zs_plan_run(&m, &mc, &bl, &r), "largest batch");
    bl = l;
    bl.kv_tier = 7;
    CHECK_ERR(zs_plan_run(&m, &mc, &bl, &r), "KV tier 7");
    double b;
    CHECK_ERR(zs_plan_dtype_bytes("--weight-dtype", "q3_x", 0, &b), "--weight-dtype", "'q3_x'", "q4_k_m");
    CHECK_ERR(zs_plan_dtype_bytes("--kv-dtype", "q8_0", 1, &b), "--kv-dtype", "'q8_0'", "f32, f16, bf16");
    CHECK(zs_plan_dtype_bytes("--weight-dtype", "q4_0", 0, &b) == 0 && b == 0.5625, "q4_0 is 0.5625 bytes");
    CHECK(zs_plan_dtype_bytes("--weight-dtype", "Q4_K", 0, &b) == 0 && b == 0.5625, "q4_k is 0.5625 bytes");
    CHECK(zs_plan_dtype_bytes("--weight-dtype", "q8_0", 0, &b) == 0 && b == 34.0 / 32, "q8_0");
    CHECK(zs_plan_dtype_bytes("--kv-dtype", "bf16", 1, &b) == 0 && b == 2, "bf16 KV");

    zs_plan_model pm;
    CHECK_ERR(zs_plan_model_load("tests/ref/plan/no-such/config.json", &pm), "no-such");
    char dir[256], path[512];
    CHECK(tu_tmpdir(dir, sizeof dir, "plan") == 0, "tmpdir");
    snprintf(path, sizeof path, "%s/config.json", dir);
    CHECK(tu_write_file(path, "{\"hidden_size\": 8", 17) == 0, "write");
    CHECK_ERR(zs_plan_model_load(path, &pm), "not valid JSON");
    const char *opt_missing = "{\"architectures\": [\"OPTForCausalLM\"], \"model_type\": \"opt\", \"hidden_size\": 64, "
                              "\"num_hidden_layers\": 2, \"vocab_size\": 100, \"ffn_dim\": 256}";
    CHECK(tu_write_file(path, opt_missing, strlen(opt_missing)) == 0, "write");
    CHECK_ERR(zs_plan_model_load(path, &pm), "num_attention_heads", "missing");
    const char *opt_bad = "{\"architectures\": [\"OPTForCausalLM\"], \"hidden_size\": -64, \"num_hidden_layers\": 2, "
                          "\"num_attention_heads\": 2, \"vocab_size\": 100, \"ffn_dim\": 256}";
    CHECK(tu_write_file(path, opt_bad, strlen(opt_bad)) == 0, "write");
    CHECK_ERR(zs_plan_model_load(path, &pm), "'hidden_size' must be a positive integer");
    const char *llama_bad = "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": 64, "
                            "\"num_hidden_layers\": 2, \"vocab_size\": 100}";
    CHECK(tu_write_file(path, llama_bad, strlen(llama_bad)) == 0, "write");
    CHECK_ERR(zs_plan_model_load(path, &pm), "num_attention_heads");
    CHECK_ERR(zs_plan_model_load(dir, &pm), "num_attention_heads"); /* the directory's config.json */
    snprintf(path, sizeof path, "%s/model.bin", dir);
    CHECK(tu_write_file(path, "x", 1) == 0, "write");
    CHECK_ERR(zs_plan_model_load(path, &pm), "not a model directory");
    snprintf(path, sizeof path, "%s/bad.gguf", dir);
    CHECK(tu_write_file(path, "GGUFxxxx", 8) == 0, "write");
    CHECK(zs_plan_model_load(path, &pm) < 0, "a broken GGUF is refused");
    tu_rmdir(dir);
}

/* --offload auto's plan of stories260K on this machine, fed steps */
static void test_replan(void) {
    char dir[4096];
    tu_model_dir(dir, sizeof dir, "stories260K");
    zs_engine_opts eo;
    zs_engine_opts_default(&eo);
    eo.model_dir = dir;
    zs_model *m = NULL;
    if (zs_model_open(dir, &eo.model, &m) < 0) {
        CHECK(0, "model: %s", zs_errmsg());
        return;
    }
    char *json = NULL;
    zs_plan_auto *pa = NULL;
    CHECK(zs_plan_auto_apply(m, &eo, 0, &json, &pa) == 0 && pa && json, "auto plan: %s", zs_errmsg());
    if (!pa) {
        zs_model_free(m);
        return;
    }
    CHECK(strstr(json, "\"replanned\"") == NULL, "a fresh plan has no replanned part");
    free(json);
    /* 64 rows a second: a few MFLOP/s against the GFLOP/s measured at start */
    int replanned_at = 0;
    for (int i = 1; i <= 12 && !replanned_at; i++) {
        char *j = NULL;
        int rc = zs_plan_auto_observe(pa, 64, 1.0, 0.0, 0, &j);
        if (rc == 1) {
            replanned_at = i;
            CHECK(j && strstr(j, "\"replanned\"") && strstr(j, "\"count\":1"), "the new plan says it was re-planned: %s",
                  j ? j : "(null)");
        }
        free(j);
    }
    CHECK(replanned_at == 6, "re-planned after three windows of 2 s (step %d)", replanned_at);
    /* the same figures again: they are the plan's now */
    int again = 0;
    for (int i = 0; i < 12; i++) {
        char *j = NULL;
        again += zs_plan_auto_observe(pa, 64, 1.0, 0.0, 0, &j) == 1;
        free(j);
    }
    CHECK(again == 0, "steps that match the plan do not re-plan (%d)", again);
    /* one window off and then back: no re-plan (three in a row are needed) */
    char *j = NULL;
    int rc1 = zs_plan_auto_observe(pa, 6400, 1.0, 0.0, 0, &j) + zs_plan_auto_observe(pa, 6400, 1.0, 0.0, 0, &j);
    for (int i = 0; i < 8; i++) rc1 += zs_plan_auto_observe(pa, 64, 1.0, 0.0, 0, &j);
    CHECK(rc1 == 0 && !j, "one window off does not re-plan");
    j = zs_plan_auto_json(pa);
    CHECK(j && strstr(j, "\"mode\":\"auto\""), "the plan in force as JSON");
    free(j);
    zs_plan_auto_free(pa);
    zs_model_free(m);
}

int main(void) {
    zs_log_set_level(ZS_LOG_WARN);
    test_replan();
    test_fits_on_device();
    test_streams();
    test_monotone();
    test_batch_memory();
    test_speculation();
    test_moe();
    test_no_device();
    test_anchors();
    test_machines();
    test_errors();
    return tu_finish("test-plan");
}
