/* plan.h — the placement planner: where a model's weights, experts and KV cache should live on a
 * machine, the live budget, the batch, and the decode tokens/s that follow, from bandwidths and
 * compute rates alone. zs_plan_run is pure and deterministic (no I/O, no globals, no clock); the
 * model descriptions come from plan-model.c, the named machines from plan-machines.c and this
 * machine, measured, from plan-local.c. Every function is thread-safe; the structs are plain data
 * owned by the caller.
 *
 * THE COST MODEL (one device; docs/plan.md compares it with published systems)
 *
 * Weights are counted in units: the LM head, each layer's dense part (attention, router, shared
 * expert; the MLP for a dense layer) and, for a mixture of experts, each MoE layer's routed experts.
 * The input embedding table lives in host memory (zeroserve's inference engines look rows up
 * there) and is never streamed. Every parameter costs bytes_per_weight bytes.
 *
 * A decode pass runs every layer once for a batch of B sequences: rows = B, or B * (k + 1) when
 * speculation verifies k drafts per sequence. The pass needs, on each resource:
 *   NVMe   bytes of the weights that live on NVMe / nvme_read_gbps (+ KV on NVMe: read of the
 *          context, write of the new rows at nvme_write_gbps)
 *   PCIe   bytes of every weight that lives below the device / pcie_gbps (+ the KV's bytes when
 *          the KV lives below the device and attention runs on the device)
 *   device max(FLOPs / dev_flops, bytes read from device memory / hbm_gbps): FLOPs are
 *          2 * active parameters * rows for the matmuls plus 4 * heads * head_dim * context per
 *          row and layer for attention on the device; bytes are every weight read once (streamed
 *          ones too, after they arrive) plus the KV when it is on the device
 *   host   when the KV lives below the device and attention runs on the host (FlexGen's CPU
 *          delegation): max(attention FLOPs / host_flops, KV bytes / host_gbps); only q and the
 *          attention output cross PCIe
 * The four overlap perfectly (the prefetch of layer L+1 runs while layer L computes):
 *   pass time = max(I/O, compute), I/O = max(NVMe, PCIe), compute = max(device, host),
 * and the point is I/O-bound or compute-bound by which of the two is larger. For KV below the
 * device the planner takes whichever attention site gives the shorter pass. The context a decode
 * pass attends over is prompt + output / 2 (the mean over the output); the KV is read once per
 * sequence per pass (a sequence's draft rows share it) and rows new entries are written.
 * tokens/s = B * E / pass time, E = 1 without speculation and with k drafts each accepted with
 * probability a (a chain that stops at the first rejection, plus the token the pass adds):
 *   E = (1 - a^(k+1)) / (1 - a)        (a = 0.7, k = 4 by default: E = 2.77).
 * The drafts are taken to cost nothing (prompt lookup; a draft model's own time is not counted).
 *
 * Experts: a pass over rows routed rows touches, per MoE layer, an expected
 *   E_exp * (1 - (1 - active / E_exp)^rows)
 * distinct experts (uniform routing); only those are streamed and read (zeroserve gathers the
 * routed experts only).
 *
 * Memory: the KV cache of B sequences of prompt + output positions lives whole in one tier
 * (device, host or NVMe), and must fit there. The device also holds ZS_PLAN_DEV_RESERVE_BYTES +
 * ZS_PLAN_DEV_RESERVE_SHARE of its memory for the runtime, the decode activations
 * (rows * (ZS_PLAN_ACT_WIDTHS * hidden + 3 * ffn + vocab) floats) and, when anything is
 * streamed, the live budget: ZS_PLAN_LIVE_LAYERS layers' worth of streamed bytes (one computing,
 * one arriving). The host keeps ZS_PLAN_HOST_RESERVE_SHARE of its memory for the system, the
 * embedding table and, when weights stream from NVMe, ZS_PLAN_LIVE_LAYERS layers of pinned read
 * slots. Given the KV's tier and B, the weights fill the device first (the head, then the layers'
 * dense parts, then whole layers of experts: each byte placed higher is read at least as often as
 * any placed after it), then the host, then NVMe; this greedy fill is optimal for the model, so
 * more memory on any tier never predicts fewer tokens/s.
 *
 * The search: every KV tier (or the one asked for) and every B in 1..max_batch (or the one asked
 * for); the best batch maximises tokens/s among the points that fit (the smallest B on a tie: once
 * a pass is bound by something that grows with B, more rows no longer pay, and the knee is kept).
 * With speculation on and off separately.
 *
 * Prefill (for the end-to-end figure that FlexGen and ZeRO-Inference report: generated tokens /
 * (prefill + decode time)): one pass over the weights (every expert) for B * prompt rows, its
 * time max(NVMe, PCIe, device) with the prompt's KV written to its tier and causal attention
 * (2 * heads * head_dim * prompt^2 FLOPs per sequence and layer) on the device; then output - 1
 * decode passes (divided by E with speculation).
 *
 * Left out: sliding windows (every layer attends the whole context), several devices, the
 * draft model's memory and time, kernel launch and per-layer latencies, prefill chunking, and
 * any contention between the links (they are taken to run in parallel at their full rates).
 *
 * No device (dev_mem 0, the local machine without a GPU): the host computes; "device" then means
 * host memory at host_gbps and host_flops, there is no host tier and no PCIe, and weights stream
 * from NVMe straight into host memory (zeroserve's CPU ranks). */
#ifndef ZS_PLAN_H
#define ZS_PLAN_H

#include "config.h"

/* ---- the constants of the cost model ---- */
#define ZS_PLAN_DEV_RESERVE_BYTES 1.0e9  /* device memory for the CUDA context, cuBLAS workspace */
#define ZS_PLAN_DEV_RESERVE_SHARE 0.05   /* ... and for fragmentation of the rest */
#define ZS_PLAN_HOST_RESERVE_SHARE 0.10  /* host memory left to the system and the process */
#define ZS_PLAN_LIVE_LAYERS 2            /* streamed layers held at once: one computing, one arriving */
#define ZS_PLAN_ACT_WIDTHS 8             /* decode activations: hidden-wide f32 vectors per row */
#define ZS_PLAN_SPEC_K 4                 /* default drafts per sequence and pass */
#define ZS_PLAN_SPEC_ACCEPT 0.7          /* default acceptance of each draft */
#define ZS_PLAN_MAX_BATCH 65536          /* the largest batch the search considers */
/* Datasheet peaks are not reached: a named machine (plan-machines.c) and the --tflops and
 * --hbm-gbps flags of `zeroserve plan` count these shares of them. Measured figures (plan-local.c)
 * and the practical link rates are used as they are. */
#define ZS_PLAN_FLOPS_SHARE 0.60         /* dense FP16 matmuls at decode and prefill shapes */
#define ZS_PLAN_HBM_SHARE 0.80           /* streaming reads of device memory */

enum { ZS_PLAN_DEVICE = 0, ZS_PLAN_HOST = 1, ZS_PLAN_NVME = 2, ZS_PLAN_TIERS = 3 };
#define ZS_PLAN_AUTO (-1)

/* A machine: what it achieves, not its datasheet. Bytes and FLOP/s as plain numbers, bandwidths
 * in GB/s (1e9 bytes/s). dev_mem 0: no device (the host computes; the device figures are not
 * used). nvme 0: no NVMe tier. */
typedef struct {
    char name[48];
    int devices;                       /* 1 (the only count the planner takes) */
    double dev_mem, host_mem, nvme;    /* bytes */
    double hbm_gbps, host_gbps, pcie_gbps, nvme_read_gbps, nvme_write_gbps;
    double dev_flops, host_flops;      /* FLOP/s of the weight dtype's matmuls (device), of f32 (host) */
} zs_plan_machine;

/* A model's sizes. */
typedef struct {
    char name[64];
    int layers, hidden, ffn, heads, kv_heads, head_dim, vocab;
    int max_pos;          /* learned position embeddings (OPT, GPT-2), counted in the parameters; 0: RoPE */
    int mlp_mats;         /* 3: gated MLP (gate, up, down); 2: fc1, fc2 (GPT-2, OPT) */
    int tied;             /* the LM head is the embedding table (counted once in the parameters) */
    int experts, active_experts, expert_ffn, shared_ffn; /* a mixture of experts (experts 0: dense) */
    int moe_layers;       /* layers whose MLP is the expert block (the others: a dense MLP of ffn) */
    double bytes_per_weight; /* e.g. 2 for bf16, 0.5625 for q4_0 (18 bytes per 32 weights) */
    double bytes_per_kv;     /* bytes of one KV element: 2 for f16/bf16, 4 for f32 */
} zs_plan_model;

/* The load. */
typedef struct {
    int prompt, output;   /* positions per sequence: prompt + output */
    int max_batch;        /* the search's largest batch */
    int batch;            /* > 0: this batch only (the "best" batch is this one) */
    int spec_k;           /* drafts per sequence and pass with speculation on (>= 1) */
    double spec_accept;   /* each draft's acceptance, in [0, 1) */
    int kv_tier;          /* ZS_PLAN_AUTO or the tier the KV must live in */
    int resident_layers;  /* ZS_PLAN_AUTO, or at most this many layers on the device (0: the head
                             streams too: every weight streamed, as ZeRO-Inference's offload) */
} zs_plan_load;

/* One evaluated point: a placement, a batch and what one decode pass costs. */
typedef struct {
    int batch, spec;          /* spec: speculation on */
    int kv_tier;
    int attn_host;            /* KV below the device: 1 attention runs on the host, 0 on the device */
    int head_tier;
    int layers[ZS_PLAN_TIERS];        /* layers (dense parts) on each tier */
    int expert_layers[ZS_PLAN_TIERS]; /* MoE layers whose experts live on each tier */
    double weight_bytes[ZS_PLAN_TIERS];
    double kv_bytes;          /* KV of batch sequences of prompt + output positions */
    double live_bytes;        /* streamed bytes held at once on the device (0: nothing streamed) */
    double used[ZS_PLAN_TIERS]; /* bytes placed on each tier (weights, KV, reserves, buffers) */
    double cap[ZS_PLAN_TIERS];  /* each tier's size */
    /* one decode pass */
    double rows;              /* rows computed per pass */
    double bytes_nvme, bytes_pcie, bytes_dev, bytes_host; /* moved or read per pass */
    double flops_dev, flops_host;
    double t_nvme, t_pcie, t_dev, t_host;  /* seconds each resource needs */
    double t_io, t_compute, t_pass;
    int io_bound;             /* t_io >= t_compute */
    const char *bound;        /* what sets t_pass: "NVMe", "PCIe", "device compute", "device memory",
                                 "host compute", "host memory" (a static string) */
    double tokens_per_pass, tok_s;
    double t_prefill, e2e_tok_s; /* prefill pass, and generated tokens / (prefill + decode) */
} zs_plan_point;

typedef struct {
    zs_plan_point b1, b1_spec, best, best_spec;
    double params, active_params; /* per token */
    double weight_bytes;      /* every unit (head, layers, experts), without the embedding table */
    double embed_bytes;       /* the embedding table in host memory */
    double kv_per_pos;        /* bytes of KV per position of one sequence (all layers) */
    double spec_tokens;       /* E */
    int no_device;
} zs_plan;

void zs_plan_load_default(zs_plan_load *l); /* prompt 512, output 32, max_batch 256, k 4, a 0.7, auto */
/* E = (1 - a^(k+1)) / (1 - a): expected tokens per pass with k drafts of acceptance a. */
double zs_plan_spec_tokens(int k, double a);
/* Parameters in all, and those one token uses (the active experts only). */
void zs_plan_model_params(const zs_plan_model *m, double *total, double *active);
/* The plan. ZS_EINVAL naming the field for a model, machine or load figure out of range;
 * ZS_ENOSPC when nothing fits at batch 1 (naming the sizes). */
int zs_plan_run(const zs_plan_model *m, const zs_plan_machine *mach, const zs_plan_load *l, zs_plan *out);
const char *zs_plan_tier_name(int tier); /* "device", "host", "nvme" */

/* ---- plan-model.c: models from files ---- */
/* From a parsed configuration: sizes, MoE fields, learned positions (GPT-2); the byte sizes given. */
int zs_plan_model_from_config(const zs_model_config *c, double bytes_per_weight, double bytes_per_kv,
                              zs_plan_model *out);
/* From a model directory (its config.json), a config.json path or a .gguf file. bytes_per_weight
 * is the dtype as stored (config.json's torch_dtype; a GGUF's tensor bytes over its elements);
 * bytes_per_kv 2. Architectures the config parser does not know (OPT, ...) are read from their
 * size fields alone. Errors name the path and the problem. */
int zs_plan_model_load(const char *path, zs_plan_model *out);
/* Bytes per weight of a --weight-dtype name (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k,
 * q3_k, q4_k, q5_k, q6_k, q4_k_m), or per KV element (kv: f32, f16, bf16). ZS_EINVAL naming
 * flag and the choices. */
int zs_plan_dtype_bytes(const char *flag, const char *name, int kv, double *bytes);

/* ---- plan-machines.c: the named machines ---- */
int zs_plan_machine_count(void);
int zs_plan_machine_at(int i, zs_plan_machine *out); /* ZS_ERANGE past the count */
/* By name (case-insensitive; "-" and " " ignored). ZS_ENOTFOUND listing the names. */
int zs_plan_machine_find(const char *name, zs_plan_machine *out);

/* ---- plan-local.c: this machine, measured ---- */
/* Host memory (physical), its read bandwidth (bench.c's probe), f32 matmul FLOP/s
 * (kernels/cpu), and with nvme_path (a directory) its free space, the write rate of a probe file
 * written there (fsync'd) and its raw O_DIRECT read rate; the file is removed. No device. Takes a few seconds. */
int zs_plan_machine_local(const char *nvme_path, zs_plan_machine *out);

#endif
