/* plan.c — the placement planner's cost model (plan.h states it in full): for each KV tier and
 * batch, the greedy weight placement, one decode pass's bytes and FLOPs on each resource, its
 * time, and the best batch. Pure: no I/O, no globals, the same answer for the same input. */
#include "plan.h"

#include <math.h>
#include <string.h>

#include "common.h"

#define PLAN_TIE 1e-9 /* a point beats the best so far only by more than this share (the smaller batch wins a tie) */

/* The model in units (bytes) and per-row costs. */
typedef struct {
    int L, Lm;             /* layers, MoE layers */
    double head, dense;    /* the LM head; one layer's dense part (the mean over dense and MoE layers) */
    double xl;             /* every expert of one MoE layer */
    double embed;          /* the embedding table, in host memory */
    double act_row;        /* decode activations per row */
    double kv_pos;         /* KV bytes per position of one sequence */
    double mm_flops_tok;   /* 2 * active parameters */
    double attn_flops_pos; /* attention FLOPs per row and context position, all layers */
    double qo_row;         /* host attention: q out and the output back, per row, all layers */
    double touch;          /* active / experts: one row's chance to route to a given expert */
} units;

/* The machine as the cost model sees it (no device: the host is the device). */
typedef struct {
    int no_dev;
    double dev_cap, host_cap, nvme_cap;   /* bytes usable (after the reserves and the table) */
    double dev_reserve, host_reserve;     /* bytes kept back */
    double hbm, host_bw, pcie, nvme_r, nvme_w; /* bytes/s (pcie 0: no link) */
    double dev_flops, host_flops;
} machine;

const char *zs_plan_tier_name(int tier) {
    return tier == ZS_PLAN_DEVICE ? "device" : tier == ZS_PLAN_HOST ? "host" : tier == ZS_PLAN_NVME ? "nvme" : "?";
}

void zs_plan_load_default(zs_plan_load *l) {
    memset(l, 0, sizeof *l);
    l->prompt = 512;
    l->output = 32;
    l->max_batch = 256;
    l->spec_k = ZS_PLAN_SPEC_K;
    l->spec_accept = ZS_PLAN_SPEC_ACCEPT;
    l->kv_tier = ZS_PLAN_AUTO;
    l->resident_layers = ZS_PLAN_AUTO;
}

double zs_plan_spec_tokens(int k, double a) {
    if (k <= 0) return 1.0;
    return (1.0 - pow(a, k + 1)) / (1.0 - a);
}

/* Parameters of the parts of one layer. */
static void layer_params(const zs_plan_model *m, double *attn, double *mlp, double *moe_dense, double *expert) {
    double h = m->hidden;
    *attn = h * m->head_dim * (2.0 * m->heads + 2.0 * m->kv_heads);
    *mlp = (double)m->mlp_mats * h * m->ffn;
    *moe_dense = *attn + (m->experts > 0 ? h * m->experts : 0) + (m->shared_ffn > 0 ? 3.0 * h * m->shared_ffn + h : 0);
    *expert = 3.0 * h * m->expert_ffn;
}

void zs_plan_model_params(const zs_plan_model *m, double *total, double *active) {
    double attn, mlp, md, ex;
    layer_params(m, &attn, &mlp, &md, &ex);
    int Lm = m->experts > 0 ? m->moe_layers : 0;
    double dense = (double)(m->layers - Lm) * (attn + mlp) + (double)Lm * md;
    double head = (double)m->vocab * m->hidden;
    if (total)
        *total = dense + (double)Lm * m->experts * ex + head + (m->tied ? 0 : head) + (double)m->max_pos * m->hidden;
    if (active) *active = dense + (double)Lm * m->active_experts * ex + head;
}

static int bad(const char *what, double v) { return zs_err(ZS_EINVAL, "plan: %s is %g; it must be > 0", what, v); }

static int check_model(const zs_plan_model *m) {
    if (m->layers < 1) return bad("the model's layer count", m->layers);
    if (m->hidden < 1) return bad("the model's hidden size", m->hidden);
    if (m->heads < 1) return bad("the model's attention heads", m->heads);
    if (m->head_dim < 1) return bad("the model's head dimension", m->head_dim);
    if (m->vocab < 1) return bad("the model's vocabulary", m->vocab);
    if (m->kv_heads < 1 || m->kv_heads > m->heads)
        return zs_err(ZS_EINVAL, "plan: the model's KV heads (%d) must be between 1 and its heads (%d)", m->kv_heads, m->heads);
    if (m->mlp_mats != 2 && m->mlp_mats != 3)
        return zs_err(ZS_EINVAL, "plan: the model's MLP matrices per layer are %d; 2 or 3", m->mlp_mats);
    if (m->max_pos < 0) return zs_err(ZS_EINVAL, "plan: the model's position count is negative (%d)", m->max_pos);
    if (m->experts < 0) return zs_err(ZS_EINVAL, "plan: the model's expert count is negative (%d)", m->experts);
    if (m->experts > 0) {
        if (m->active_experts < 1 || m->active_experts > m->experts)
            return zs_err(ZS_EINVAL, "plan: the model's active experts (%d) must be between 1 and its experts (%d)",
                          m->active_experts, m->experts);
        if (m->expert_ffn < 1) return bad("the model's expert FFN size", m->expert_ffn);
        if (m->moe_layers < 1 || m->moe_layers > m->layers)
            return zs_err(ZS_EINVAL, "plan: the model's MoE layers (%d) must be between 1 and its layers (%d)",
                          m->moe_layers, m->layers);
        if (m->shared_ffn < 0) return zs_err(ZS_EINVAL, "plan: the model's shared expert size is negative");
    }
    if (m->ffn < 1 && !(m->experts > 0 && m->moe_layers == m->layers)) return bad("the model's FFN size", m->ffn);
    if (!(m->bytes_per_weight > 0) || !isfinite(m->bytes_per_weight)) return bad("bytes per weight", m->bytes_per_weight);
    if (!(m->bytes_per_kv > 0) || !isfinite(m->bytes_per_kv)) return bad("bytes per KV element", m->bytes_per_kv);
    return 0;
}

static int pos_fig(const char *what, double v) { return v > 0 && isfinite(v) ? 0 : bad(what, v); }

static int check_machine(const zs_plan_machine *mc) {
    if (mc->devices != 1)
        return zs_err(ZS_EUNSUPPORTED, "plan: machine '%s' has %d devices; the planner takes one", mc->name, mc->devices);
    if (!(mc->dev_mem >= 0) || !isfinite(mc->dev_mem)) return zs_err(ZS_EINVAL, "plan: device memory is %g", mc->dev_mem);
    if (mc->dev_mem > 0) {
        ZS_CHECK(pos_fig("the device memory bandwidth (GB/s)", mc->hbm_gbps));
        ZS_CHECK(pos_fig("the PCIe bandwidth (GB/s)", mc->pcie_gbps));
        ZS_CHECK(pos_fig("the device FLOP/s", mc->dev_flops));
    }
    ZS_CHECK(pos_fig("the host memory (bytes)", mc->host_mem));
    ZS_CHECK(pos_fig("the host memory bandwidth (GB/s)", mc->host_gbps));
    ZS_CHECK(pos_fig("the host FLOP/s", mc->host_flops));
    if (!(mc->nvme >= 0) || !isfinite(mc->nvme)) return zs_err(ZS_EINVAL, "plan: NVMe size is %g", mc->nvme);
    if (mc->nvme > 0) {
        ZS_CHECK(pos_fig("the NVMe read bandwidth (GB/s)", mc->nvme_read_gbps));
        ZS_CHECK(pos_fig("the NVMe write bandwidth (GB/s)", mc->nvme_write_gbps));
    }
    return 0;
}

static int check_load(const zs_plan_load *l, int no_dev) {
    if (l->prompt < 1) return zs_err(ZS_EINVAL, "plan: the prompt length is %d; it must be >= 1", l->prompt);
    if (l->output < 1) return zs_err(ZS_EINVAL, "plan: the output length is %d; it must be >= 1", l->output);
    if (l->max_batch < 1 || l->max_batch > ZS_PLAN_MAX_BATCH)
        return zs_err(ZS_EINVAL, "plan: the largest batch is %d; it must be between 1 and %d", l->max_batch, ZS_PLAN_MAX_BATCH);
    if (l->batch < 0 || l->batch > ZS_PLAN_MAX_BATCH)
        return zs_err(ZS_EINVAL, "plan: the batch is %d; it must be between 1 and %d", l->batch, ZS_PLAN_MAX_BATCH);
    if (l->spec_k < 1 || l->spec_k > 64) return zs_err(ZS_EINVAL, "plan: drafts per pass are %d; 1 to 64", l->spec_k);
    if (!(l->spec_accept >= 0 && l->spec_accept < 1))
        return zs_err(ZS_EINVAL, "plan: the draft acceptance is %g; it must be in [0, 1)", l->spec_accept);
    if (l->kv_tier != ZS_PLAN_AUTO && (l->kv_tier < 0 || l->kv_tier >= ZS_PLAN_TIERS))
        return zs_err(ZS_EINVAL, "plan: KV tier %d is none of device, host, nvme", l->kv_tier);
    if (no_dev && l->kv_tier == ZS_PLAN_HOST)
        return zs_err(ZS_EINVAL, "plan: without a device host memory is the device; the KV tier is device or nvme");
    if (l->resident_layers < ZS_PLAN_AUTO)
        return zs_err(ZS_EINVAL, "plan: resident layers are %d; auto or >= 0", l->resident_layers);
    return 0;
}

static void make_units(const zs_plan_model *m, units *u) {
    double attn, mlp, md, ex, total, active;
    layer_params(m, &attn, &mlp, &md, &ex);
    zs_plan_model_params(m, &total, &active);
    double bw = m->bytes_per_weight;
    memset(u, 0, sizeof *u);
    u->L = m->layers;
    u->Lm = m->experts > 0 ? m->moe_layers : 0;
    u->head = (double)m->vocab * m->hidden * bw;
    u->dense = ((double)(u->L - u->Lm) * (attn + mlp) + (double)u->Lm * md) / u->L * bw;
    u->xl = u->Lm ? (double)m->experts * ex * bw : 0;
    u->embed = (double)m->vocab * m->hidden * bw;
    double ffn_row = u->Lm ? ZS_MAX((double)m->ffn, (double)m->active_experts * m->expert_ffn + m->shared_ffn) : m->ffn;
    u->act_row = (ZS_PLAN_ACT_WIDTHS * (double)m->hidden + 3.0 * ffn_row + m->vocab) * 4.0;
    u->kv_pos = 2.0 * m->layers * m->kv_heads * m->head_dim * m->bytes_per_kv;
    u->mm_flops_tok = 2.0 * active;
    u->attn_flops_pos = 4.0 * m->heads * m->head_dim * m->layers;
    u->qo_row = 2.0 * m->heads * m->head_dim * m->layers * 4.0;
    u->touch = m->experts > 0 ? (double)m->active_experts / m->experts : 0;
}

static void make_machine(const zs_plan_machine *mc, double embed, machine *e) {
    memset(e, 0, sizeof *e);
    e->no_dev = mc->dev_mem <= 0;
    e->host_reserve = ZS_PLAN_HOST_RESERVE_SHARE * mc->host_mem;
    e->nvme_cap = mc->nvme;
    e->nvme_r = mc->nvme_read_gbps * 1e9;
    e->nvme_w = mc->nvme_write_gbps * 1e9;
    e->host_bw = mc->host_gbps * 1e9;
    e->host_flops = mc->host_flops;
    if (e->no_dev) { /* host memory is the device; no host tier, no link */
        e->dev_reserve = e->host_reserve;
        e->dev_cap = mc->host_mem - e->host_reserve - embed;
        e->host_cap = 0;
        e->hbm = e->host_bw;
        e->dev_flops = mc->host_flops;
    } else {
        e->dev_reserve = ZS_PLAN_DEV_RESERVE_BYTES + ZS_PLAN_DEV_RESERVE_SHARE * mc->dev_mem;
        e->dev_cap = mc->dev_mem - e->dev_reserve;
        e->host_cap = mc->host_mem - e->host_reserve - embed;
        e->hbm = mc->hbm_gbps * 1e9;
        e->pcie = mc->pcie_gbps * 1e9;
        e->dev_flops = mc->dev_flops;
    }
}

static double per_s(double bytes, double rate) { return bytes > 0 ? bytes / rate : 0; }

/* The resources' times of one pass from its bytes and FLOPs. */
static void pass_times(const machine *e, zs_plan_point *p, double nvme_r, double nvme_w) {
    p->t_nvme = per_s(nvme_r, e->nvme_r) + per_s(nvme_w, e->nvme_w);
    p->t_pcie = e->no_dev ? 0 : per_s(p->bytes_pcie, e->pcie);
    p->t_dev = ZS_MAX(per_s(p->flops_dev, e->dev_flops), per_s(p->bytes_dev, e->hbm));
    p->t_host = ZS_MAX(per_s(p->flops_host, e->host_flops), per_s(p->bytes_host, e->host_bw));
    p->t_io = ZS_MAX(p->t_nvme, p->t_pcie);
    p->t_compute = ZS_MAX(p->t_dev, p->t_host);
    p->t_pass = ZS_MAX(p->t_io, p->t_compute);
    p->io_bound = p->t_io >= p->t_compute;
    double dc = per_s(p->flops_dev, e->dev_flops), hc = per_s(p->flops_host, e->host_flops);
    const char *b = e->no_dev ? (dc >= p->t_dev ? "host compute" : "host memory") /* the host is the device */
                              : (dc >= p->t_dev ? "device compute" : "device memory");
    double t = p->t_dev;
    if (p->t_host > t) { t = p->t_host; b = hc >= p->t_host ? "host compute" : "host memory"; }
    if (p->t_pcie >= t && p->t_pcie > 0) { t = p->t_pcie; b = "PCIe"; }
    if (p->t_nvme >= t && p->t_nvme > 0) { t = p->t_nvme; b = "NVMe"; }
    p->bound = b;
}

/* Places the weights for a KV tier and batch and prices one decode pass (and the prefill).
 * Returns 1 when it fits, 0 when not. */
static int eval_point(const units *u, const machine *e, const zs_plan_load *l, int kv_tier,
                      int B, int spec, double E, zs_plan_point *p) {
    memset(p, 0, sizeof *p);
    p->batch = B;
    p->spec = spec;
    p->kv_tier = kv_tier;
    double rows = (double)B * (spec ? l->spec_k + 1 : 1);
    p->rows = rows;
    double act = rows * u->act_row;
    double free_[ZS_PLAN_TIERS] = {e->dev_cap - act, e->host_cap, e->nvme_cap};
    if (e->no_dev && kv_tier == ZS_PLAN_HOST) return 0;
    p->kv_bytes = (double)B * (l->prompt + l->output) * u->kv_pos;
    free_[kv_tier] -= p->kv_bytes;
    for (int t = 0; t < ZS_PLAN_TIERS; t++)
        if (free_[t] < 0) return 0;
    /* experts one pass touches: the share of a layer's experts routed to by rows rows */
    double frac = u->Lm ? 1.0 - pow(1.0 - u->touch, rows) : 0;
    int L = u->L, Lm = u->Lm, lim = l->resident_layers;
    double total = u->head + L * u->dense + Lm * u->xl;
    int head_t, nd, ne, nh = 0, neh = 0;
    if ((lim == ZS_PLAN_AUTO || lim >= L) && total <= free_[ZS_PLAN_DEVICE]) { /* all resident */
        head_t = ZS_PLAN_DEVICE;
        nd = L;
        ne = Lm;
    } else {
        p->live_bytes = ZS_PLAN_LIVE_LAYERS * (u->dense + u->xl * frac);
        double cap = free_[ZS_PLAN_DEVICE] - p->live_bytes;
        if (cap < 0) return 0;
        head_t = lim != 0 && u->head <= cap ? ZS_PLAN_DEVICE : -1;
        if (head_t == ZS_PLAN_DEVICE) cap -= u->head;
        nd = (int)ZS_MIN((double)L, floor(cap / u->dense));
        if (lim >= 0) nd = ZS_MIN(nd, lim);
        cap -= nd * u->dense;
        ne = nd == L && Lm ? (int)ZS_MIN((double)Lm, floor(cap / u->xl)) : 0;
        if (lim >= 0) ne = ZS_MIN(ne, lim);
    }
    double rest = (head_t < 0 ? u->head : 0) + (L - nd) * u->dense + (Lm - ne) * u->xl;
    double slots = 0;
    if (rest > 0 && !e->no_dev) {
        double cap = free_[ZS_PLAN_HOST];
        if (rest > cap) { /* some stream from NVMe: pinned read slots for them */
            slots = ZS_PLAN_LIVE_LAYERS * (u->dense + u->xl);
            cap -= slots;
            if (cap < 0) return 0;
        }
        if (head_t < 0 && u->head <= cap) { head_t = ZS_PLAN_HOST; cap -= u->head; }
        nh = (int)ZS_MIN((double)(L - nd), floor(cap / u->dense));
        cap -= nh * u->dense;
        neh = nd + nh == L && Lm ? (int)ZS_MIN((double)(Lm - ne), floor(cap / u->xl)) : 0;
    }
    if (head_t < 0) head_t = ZS_PLAN_NVME;
    int nn = L - nd - nh, nen = Lm - ne - neh;
    p->head_tier = head_t;
    p->layers[0] = nd; p->layers[1] = nh; p->layers[2] = nn;
    p->expert_layers[0] = ne; p->expert_layers[1] = neh; p->expert_layers[2] = nen;
    for (int t = 0; t < ZS_PLAN_TIERS; t++)
        p->weight_bytes[t] = (head_t == t ? u->head : 0) + p->layers[t] * u->dense + p->expert_layers[t] * u->xl;
    if (p->weight_bytes[ZS_PLAN_NVME] > free_[ZS_PLAN_NVME]) return 0;
    p->cap[0] = e->dev_cap + e->dev_reserve + (e->no_dev ? u->embed : 0);
    p->cap[1] = e->no_dev ? 0 : e->host_cap + e->host_reserve + u->embed;
    p->cap[2] = e->nvme_cap;
    p->used[0] = e->dev_reserve + (e->no_dev ? u->embed : 0) + act + p->live_bytes + p->weight_bytes[0];
    p->used[1] = e->no_dev ? 0 : e->host_reserve + u->embed + slots + p->weight_bytes[1];
    p->used[2] = p->weight_bytes[2];
    p->used[kv_tier] += p->kv_bytes;

    /* one decode pass: weights (experts scaled by the share touched) */
    double s_host = (head_t == ZS_PLAN_HOST ? u->head : 0) + nh * u->dense + neh * u->xl * frac;
    double s_nvme = (head_t == ZS_PLAN_NVME ? u->head : 0) + nn * u->dense + nen * u->xl * frac;
    double ctx = l->prompt + l->output / 2.0;
    double kv_read = B * ctx * u->kv_pos, kv_write = rows * u->kv_pos;
    double attn = rows * ctx * u->attn_flops_pos;
    double nvme_r = s_nvme, nvme_w = 0;
    p->bytes_pcie = e->no_dev ? 0 : s_host + s_nvme;
    p->bytes_dev = u->head + L * u->dense + Lm * u->xl * frac;
    p->flops_dev = rows * u->mm_flops_tok;
    if (kv_tier == ZS_PLAN_DEVICE) {
        p->bytes_dev += kv_read + kv_write;
        p->flops_dev += attn;
        pass_times(e, p, nvme_r, nvme_w);
    } else {
        if (kv_tier == ZS_PLAN_NVME) { nvme_r += kv_read; nvme_w += kv_write; }
        zs_plan_point d = *p, h = *p; /* attention on the device (the KV crosses PCIe) or on the host */
        d.bytes_pcie += e->no_dev ? 0 : kv_read + kv_write;
        d.bytes_dev += kv_read + kv_write;
        d.flops_dev += attn;
        pass_times(e, &d, nvme_r, nvme_w);
        *p = d;
        if (!e->no_dev) {
            h.attn_host = 1;
            h.bytes_pcie += rows * u->qo_row;
            h.bytes_host = kv_read + kv_write;
            h.flops_host = attn;
            pass_times(e, &h, nvme_r, nvme_w);
            if (h.t_pass <= d.t_pass) *p = h;
        }
    }
    p->tokens_per_pass = B * (spec ? E : 1.0);
    p->tok_s = p->tokens_per_pass / p->t_pass;

    /* prefill: one pass over every weight for B * prompt rows; the prompt's KV to its tier */
    double rows_p = (double)B * l->prompt, kvw = rows_p * u->kv_pos;
    double f_host = (head_t == ZS_PLAN_HOST ? u->head : 0) + nh * u->dense + neh * u->xl;
    double f_nvme = (head_t == ZS_PLAN_NVME ? u->head : 0) + nn * u->dense + nen * u->xl;
    double pcie_p = e->no_dev ? 0 : f_host + f_nvme + (kv_tier != ZS_PLAN_DEVICE ? kvw : 0);
    double t_nvme_p = per_s(f_nvme, e->nvme_r) + (kv_tier == ZS_PLAN_NVME ? per_s(kvw, e->nvme_w) : 0);
    double flops_p = rows_p * u->mm_flops_tok + B * (u->attn_flops_pos / 2.0) * (double)l->prompt * l->prompt;
    double bytes_p = total + (kv_tier == ZS_PLAN_DEVICE ? kvw : 0);
    p->t_prefill = ZS_MAX(ZS_MAX(t_nvme_p, e->no_dev ? 0 : per_s(pcie_p, e->pcie)),
                          ZS_MAX(per_s(flops_p, e->dev_flops), per_s(bytes_p, e->hbm)));
    double passes = (l->output - 1) / (spec ? E : 1.0);
    p->e2e_tok_s = (double)B * l->output / (p->t_prefill + passes * p->t_pass);
    return 1;
}

/* The best point over the KV tiers and batches in [b0, b1] (found: 0 none). */
static int search(const units *u, const machine *e, const zs_plan_load *l, int b0, int b1,
                  int spec, double E, zs_plan_point *best) {
    int found = 0;
    for (int t = 0; t < ZS_PLAN_TIERS; t++) {
        if (l->kv_tier != ZS_PLAN_AUTO && t != l->kv_tier) continue;
        for (int B = b0; B <= b1; B++) {
            zs_plan_point p;
            if (!eval_point(u, e, l, t, B, spec, E, &p)) break; /* memory only grows with B */
            if (!found || p.tok_s > best->tok_s * (1 + PLAN_TIE)) { *best = p; found = 1; }
        }
    }
    return found;
}

int zs_plan_run(const zs_plan_model *m, const zs_plan_machine *mc, const zs_plan_load *l, zs_plan *out) {
    if (!m || !mc || !l || !out) return zs_err(ZS_EINVAL, "zs_plan_run: NULL argument");
    ZS_CHECK(check_model(m));
    ZS_CHECK(check_machine(mc));
    ZS_CHECK(check_load(l, mc->dev_mem <= 0));
    units u;
    make_units(m, &u);
    machine e;
    make_machine(mc, u.embed, &e);
    zs_plan r;
    memset(&r, 0, sizeof r);
    zs_plan_model_params(m, &r.params, &r.active_params);
    r.weight_bytes = u.head + u.L * u.dense + u.Lm * u.xl;
    r.embed_bytes = u.embed;
    r.kv_per_pos = u.kv_pos;
    r.spec_tokens = zs_plan_spec_tokens(l->spec_k, l->spec_accept);
    r.no_device = e.no_dev;
    double E = r.spec_tokens;
    if (!search(&u, &e, l, 1, 1, 0, E, &r.b1) || !search(&u, &e, l, 1, 1, 1, E, &r.b1_spec))
        return zs_err(ZS_ENOSPC,
                      "plan: %s does not fit %s even at batch 1: %.1f GB of weights (+ %.1f GB embedding table in host "
                      "memory) and %.3f GB of KV against device %.1f GB, host %.1f GB, NVMe %.1f GB%s",
                      m->name[0] ? m->name : "the model", mc->name[0] ? mc->name : "the machine", r.weight_bytes / 1e9,
                      u.embed / 1e9, (l->prompt + l->output) * u.kv_pos / 1e9, mc->dev_mem / 1e9, mc->host_mem / 1e9,
                      mc->nvme / 1e9, l->kv_tier != ZS_PLAN_AUTO || l->resident_layers != ZS_PLAN_AUTO ?
                      " (with the KV tier or resident layers asked for)" : "");
    int b0 = l->batch > 0 ? l->batch : 1, b1 = l->batch > 0 ? l->batch : l->max_batch;
    if (!search(&u, &e, l, b0, b1, 0, E, &r.best) || !search(&u, &e, l, b0, b1, 1, E, &r.best_spec))
        return zs_err(ZS_ENOSPC, "plan: batch %d does not fit %s: its KV alone is %.1f GB (%.3f MB per position)",
                      l->batch, mc->name[0] ? mc->name : "the machine",
                      (double)l->batch * (l->prompt + l->output) * u.kv_pos / 1e9, u.kv_pos / 1e6);
    *out = r;
    return 0;
}
