/* e2e-gpu.c — the engine on a CUDA device against the reference outputs of the real fixtures
 * (stories260K, gpt2-bytes), for every combination of weight dtype (f32, bf16), ranks (1, and 2
 * sharing the one GPU through the local communicator, or NCCL where there are two GPUs) and
 * offload tier (none, cpu, nvme):
 *   f32:  the 64 greedy ids of each case equal the reference, logits of positions 0-3 within 1e-4;
 *   bf16: reported, not required equal: greedy ids that differ from the reference (count and
 *         first step), max |logit - reference| at positions 0-3, and the same against the CPU
 *         engine with the same bf16 weights; fails only on gross errors (logit error > 1, or
 *         the first greedy token wrong).
 *   q8_0: reported as bf16, against the CPU engine with the same q8_0 weights; the logits of
 *         positions 0-3 (4 tokens: every block-format product in the fused kernel, the CPU's
 *         bits) within 1e-3 of the CPU's where every matrix is q8_0 (gpt2-bytes: the tied
 *         head and the position table too), within 1.0 where a matrix stays bf16 (stories260K's
 *         rows of 172); the blocks go through shards, tiers and gathers unchanged.
 * The model families (zs_init_model_write: a random model of each, written to a scratch
 * directory, norms random so that every weight counts, matrices at init_std 0.1 so that attention
 * is far from uniform): Llama with llama3 and YaRN RoPE scaling, Mistral with a sliding window of
 * 16, Qwen2, Qwen3 (q/k norms, head_dim 128), Gemma 2 (norm offset, post norms, GeGLU, soft-caps,
 * window 16 on alternate layers, query_pre_attn_scalar), Gemma 3 (q/k norms, local/global RoPE,
 * window 16, linear scaling on the global layers), Phi-3 (LongRoPE switching to its long factors
 * past position 32, window 24): f32 weights on the device against the CPU engine with the same
 * weights: a prefill of 40 tokens and chunks of 64 up to position 320 (every row's logits: the
 * tiled attention), 40 decode steps of given tokens (the simple kernel, the windows sliding, past
 * the ring of KV blocks a window gives a sequence; LongRoPE's per-token frequencies), and a
 * serving batch of a 20-token chunk of a second sequence with a decode of the first (both kernels
 * in one call); max |gpu - cpu| over every logit within 1e-3 of the largest |cpu logit| (bf16
 * weights against the CPU engine with bf16 weights: within 0.15, gross errors only).
 * Usage: e2e-gpu [summary.json]. Reads the fixtures from $ZS_SHARED/models (default ../shared).
 * Exit 0 pass, 1 fail, 77 no CUDA device. */
#include "backend.h"
#include "common.h"
#include "device.h"
#include "engine.h"
#include "init-model.h"
#include "matmul-q8act.h"
#include "testutil.h"

typedef struct {
    int32_t prompt[256], want[256], all[512];
    int np, nn, na;
    float *ref_logits; /* 4 rows */
} ref_case;

static int load_cases(const char *dir, ref_case *cs, int cap, int vocab) {
    json_t *ref = tu_load_reference(dir);
    if (!ref) return 0;
    json_t *cases = json_object_get(ref, "cases");
    int n = 0;
    size_t ci;
    json_t *c;
    json_array_foreach(cases, ci, c) {
        if (n == cap) break;
        ref_case *r = &cs[n++];
        json_t *a;
        size_t i;
        r->np = r->nn = r->na = 0;
        json_array_foreach(json_object_get(c, "prompt_ids"), i, a) if (i < 256) r->prompt[r->np++] = (int32_t)json_integer_value(a);
        json_array_foreach(json_object_get(c, "new_ids"), i, a) if (i < 256) r->want[r->nn++] = (int32_t)json_integer_value(a);
        json_array_foreach(json_object_get(c, "all_ids"), i, a) if (i < 512) r->all[r->na++] = (int32_t)json_integer_value(a);
        r->ref_logits = calloc((size_t)4 * vocab, 4);
        json_t *lg = json_object_get(c, "logits");
        for (size_t p = 0; p < 4 && p < json_array_size(lg); p++)
            for (int v = 0; v < vocab; v++)
                r->ref_logits[p * vocab + v] = (float)json_real_value(json_array_get(json_array_get(lg, p), v));
    }
    json_decref(ref);
    return n;
}

/* logits of positions 0-3 of all_ids (one forward of 4 tokens) */
static int first_logits(zs_engine *e, const ref_case *r, float *out) {
    zs_kvcache *kv = zs_engine_kv(e);
    int seq, rc;
    if ((rc = zs_kv_seq_open(kv, &seq)) < 0) return rc;
    int32_t pos[4], sq[4], li[4];
    for (int i = 0; i < 4; i++) { pos[i] = i; sq[i] = seq; li[i] = i; }
    zs_batch b = {4, r->all, pos, sq, li, 4, NULL, NULL, NULL};
    rc = zs_kv_seq_reserve(kv, seq, 4);
    if (rc == 0) rc = zs_engine_forward(e, &b, out);
    zs_kv_seq_close(kv, seq);
    return rc;
}

static int greedy(zs_engine *e, const ref_case *r, int32_t *got) {
    zs_gen_params gp;
    memset(&gp, 0, sizeof gp);
    zs_sampler_params_default(&gp.sampling);
    gp.sampling.temperature = 0;
    gp.max_tokens = r->nn;
    gp.ignore_eos = 1;
    zs_gen_result res;
    int rc = zs_engine_generate(e, r->prompt, r->np, &gp, NULL, NULL, &res);
    if (rc < 0) return rc;
    memcpy(got, res.ids, (size_t)res.n_generated * 4);
    for (int i = res.n_generated; i < r->nn; i++) got[i] = -1;
    free(res.ids);
    return 0;
}

static double maxdiff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= m)) m = isnan(d) ? INFINITY : d;
    }
    return m;
}

static int open_engine(const char *dir, int device, zs_dtype wdt, int ranks, int tier, const char *nvme, zs_engine **e) {
    zs_engine_opts o;
    zs_engine_opts_default(&o);
    o.model_dir = dir;
    o.device = device;
    o.model.weight_dtype = wdt;
    o.model.embed_lookup = 1; /* as serve and generate open it */
    o.ranks = ranks;
    o.gather.tier = tier;
    o.nvme_path = nvme;
    o.max_seqs = 2;
    o.max_batch_tokens = 256;
    return zs_engine_open(&o, e);
}

static json_t *runs;

static void run_model(const char *name) {
    char dir[4096];
    tu_model_dir(dir, sizeof dir, name);
    ref_case cs[4];
    int vocab = strcmp(name, "gpt2-bytes") == 0 ? 256 : 512;
    int nc = load_cases(dir, cs, 4, vocab);
    CHECK(nc > 0, "%s: reference cases", name);
    if (nc == 0) return;
    char nvme[4096];
    CHECK(tu_tmpdir(nvme, sizeof nvme, "gpu-nvme") == 0, "scratch dir");
    /* the CPU engine with bf16 weights: what the bf16 GPU run should be close to */
    float *cpu16 = calloc((size_t)nc * 4 * vocab, 4);
    zs_engine *ce;
    int rc = open_engine(dir, ZS_DEVICE_CPU, ZS_BF16, 1, ZS_OFFLOAD_NONE, NULL, &ce);
    CHECK(rc == 0, "%s: CPU bf16 engine: %s", name, zs_errmsg());
    for (int i = 0; rc == 0 && i < nc; i++) CHECK(first_logits(ce, &cs[i], cpu16 + (size_t)i * 4 * vocab) == 0, "cpu logits");
    zs_engine_free(ce);
    /* and with q8_0 weights: the fused decode kernel gives the CPU's products */
    float *cpuq = calloc((size_t)nc * 4 * vocab, 4);
    rc = open_engine(dir, ZS_DEVICE_CPU, ZS_Q8_0, 1, ZS_OFFLOAD_NONE, NULL, &ce);
    CHECK(rc == 0, "%s: CPU q8_0 engine: %s", name, zs_errmsg());
    int all_q = rc == 0;
    for (int i = 0; rc == 0 && i < nc; i++) CHECK(first_logits(ce, &cs[i], cpuq + (size_t)i * 4 * vocab) == 0, "cpu logits");
    if (rc == 0) {
        const zs_model *qm = zs_engine_model(ce);
        for (int b = 0; b < zs_model_n_buckets(qm); b++) {
            const zs_bucket_layout *L = zs_model_layout(qm, b);
            for (int r = 0; r < L->n_roles; r++)
                if (L->slot[r].present && L->slot[r].ndim == 2 && !zs_dtype_is_quant(L->slot[r].dtype)) all_q = 0;
        }
        zs_engine_free(ce);
    }

    zs_dtype dts[3] = {ZS_F32, ZS_BF16, ZS_Q8_0};
    const char *tiers[3] = {"none", "cpu", "nvme"};
    for (int di = 0; di < 3; di++)
        for (int ranks = 1; ranks <= 2; ranks++)
            for (int tier = 0; tier < 3; tier++) {
                char label[160];
                snprintf(label, sizeof label, "%s %s ranks %d offload %s", name, zs_dtype_name(dts[di]), ranks, tiers[tier]);
                zs_engine *e = NULL;
                double t0 = zs_now();
                rc = open_engine(dir, ZS_DEVICE_CUDA, dts[di], ranks, tier, nvme, &e);
                CHECK(rc == 0, "%s: open: %s", label, zs_errmsg());
                if (rc < 0) continue;
                int ids_diff = 0, first_diff = -1, first_tok_ok = 1;
                double lerr = 0, cerr = 0;
                for (int i = 0; i < nc; i++) {
                    int32_t got[256];
                    float *lg = malloc((size_t)4 * vocab * 4);
                    rc = greedy(e, &cs[i], got);
                    CHECK(rc == 0, "%s case %d: greedy: %s", label, i, zs_errmsg());
                    for (int k = 0; rc == 0 && k < cs[i].nn; k++)
                        if (got[k] != cs[i].want[k]) {
                            ids_diff++;
                            if (first_diff < 0) first_diff = k;
                            if (k == 0) first_tok_ok = 0;
                        }
                    rc = first_logits(e, &cs[i], lg);
                    CHECK(rc == 0, "%s case %d: logits: %s", label, i, zs_errmsg());
                    if (rc == 0) {
                        lerr = fmax(lerr, maxdiff(lg, cs[i].ref_logits, (size_t)4 * vocab));
                        cerr = fmax(cerr, maxdiff(lg, (dts[di] == ZS_Q8_0 ? cpuq : cpu16) + (size_t)i * 4 * vocab,
                                                  (size_t)4 * vocab));
                    }
                    free(lg);
                }
                zs_gather_stats st;
                zs_world_stats(zs_engine_world(e), &st);
                zs_engine_free(e);
                fprintf(stderr, "%-42s greedy ids differing %3d (first at step %d), max |logit - ref| %.3g, "
                        "vs CPU %s %.3g  (%.2f s)\n", label, ids_diff, first_diff, lerr,
                        zs_dtype_name(dts[di] == ZS_Q8_0 ? ZS_Q8_0 : ZS_BF16), cerr, zs_now() - t0);
                if (dts[di] == ZS_F32) {
                    CHECK(ids_diff == 0, "%s: greedy ids equal the reference (%d differ, first at step %d)", label,
                          ids_diff, first_diff);
                    CHECK(lerr <= 1e-4, "%s: logits within 1e-4 of the reference (%.3g)", label, lerr);
                } else {
                    CHECK(first_tok_ok, "%s: the first greedy token equals the reference", label);
                    CHECK(lerr <= 1.0, "%s: %s logits within 1.0 of the reference (%.3g)", label,
                          zs_dtype_name(dts[di]), lerr);
                    if (dts[di] == ZS_Q8_0)
                        CHECK(cerr <= (all_q ? 1e-3 : 1.0), "%s: logits within %g of the CPU q8_0 engine's (%.3g)",
                              label, all_q ? 1e-3 : 1.0, cerr);
                }
                json_array_append_new(runs, json_pack("{s:s, s:s, s:i, s:s, s:i, s:i, s:f, s:f, s:I}", "model", name,
                                                      "dtype", zs_dtype_name(dts[di]), "ranks", ranks, "offload",
                                                      tiers[tier], "greedy_ids_differing", ids_diff,
                                                      "first_differing_step", first_diff, "max_logit_err_vs_ref", lerr,
                                                      "max_logit_err_vs_cpu_same_dtype", di ? cerr : lerr,
                                                      "bytes_gathered", (json_int_t)st.bytes_gathered));
            }
    tu_rmdir(nvme);
    for (int i = 0; i < nc; i++) free(cs[i].ref_logits);
    free(cpu16);
    free(cpuq);
}

/* ---- the model families: a random model of each against the CPU engine ---- */

typedef struct {
    const char *label, *arch, *over; /* over: config.json keys put over the family's defaults */
} fam_case;

/* the largest |a - b| and |b| over n values */
static void fam_err(const float *a, const float *b, size_t n, double *md, double *mb) {
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= *md)) *md = isnan(d) ? INFINITY : d;
        if (fabs(b[i]) > *mb) *mb = fabs(b[i]);
    }
}

/* One forward of a batch on both engines: tokens ids[i] of sequence sq[i] (0 or 1: the engines'
 * sequence slots s[0], s[1]) at pos[i], logits of every token; the errors accumulate. */
static int fam_step(zs_engine *e[2], int seqs[2][2], int n, const int32_t *ids, const int32_t *pos, const int *sq,
                    int vocab, double *md, double *mb) {
    float *lg[2];
    int32_t sqv[2][64], li[64];
    for (int i = 0; i < n; i++) li[i] = i;
    int rc = 0;
    for (int k = 0; k < 2 && rc == 0; k++) {
        zs_kvcache *kv = zs_engine_kv(e[k]);
        for (int i = 0; i < n && rc == 0; i++) {
            sqv[k][i] = seqs[k][sq[i]];
            if (zs_kv_seq_len(kv, sqv[k][i]) < pos[i] + 1) rc = zs_kv_seq_reserve(kv, sqv[k][i], pos[i] + 1);
        }
        lg[k] = malloc((size_t)n * vocab * 4);
        zs_batch b = {n, ids, pos, sqv[k], li, n, NULL, NULL, NULL};
        if (rc == 0) rc = zs_engine_forward(e[k], &b, lg[k]);
    }
    if (rc == 0) fam_err(lg[1], lg[0], (size_t)n * vocab, md, mb);
    free(lg[0]);
    free(lg[1]);
    return rc;
}

static void run_family_dt(const fam_case *fc, const char *dir, int vocab, zs_dtype wdt);

static void run_family(const fam_case *fc, int idx, const char *scratch) {
    zs_init_opts o;
    int rc = zs_init_opts_default(fc->arch, &o);
    CHECK(rc == 0, "%s: init-model defaults: %s", fc->label, zs_errmsg());
    if (rc < 0) return;
    o.random_norms = 1;
    o.init_std = 0.1f;
    rc = zs_config_override(&o.cfg, fc->over, fc->label);
    CHECK(rc == 0, "%s: config %s: %s", fc->label, fc->over, zs_errmsg());
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/%d-%s", scratch, idx, fc->arch);
    if (rc == 0) rc = zs_init_model_write(&o, dir);
    CHECK(rc == 0, "%s: write the model: %s", fc->label, zs_errmsg());
    if (rc < 0) return;
    for (int di = 0; di < 2; di++) run_family_dt(fc, dir, o.cfg.vocab_size, di ? ZS_BF16 : ZS_F32);
}

/* The family's model in weight dtype wdt on the device and on the CPU: f32 within 1e-3 of the largest
 * |logit| (the same arithmetic up to the order of sums), bf16 within 0.15 (the device also rounds
 * the matrices' inputs to bf16: a few 1e-2 here, where a wrong window or RoPE gives 0.2 to 1) */
static void run_family_dt(const fam_case *fc, const char *dir, int vocab, zs_dtype wdt) {
    double tol = wdt == ZS_F32 ? 1e-3 : 0.15;
    const char *dn = zs_dtype_name(wdt);
    zs_engine *e[2] = {NULL, NULL};
    int seqs[2][2], rc = 0;
    for (int k = 0; k < 2 && rc == 0; k++) {
        rc = open_engine(dir, k ? ZS_DEVICE_CUDA : ZS_DEVICE_CPU, wdt, 1, ZS_OFFLOAD_NONE, NULL, &e[k]);
        CHECK(rc == 0, "%s %s: open (%s): %s", fc->label, dn, k ? "cuda" : "cpu", zs_errmsg());
        for (int j = 0; j < 2 && rc == 0; j++) rc = zs_kv_seq_open(zs_engine_kv(e[k]), &seqs[k][j]);
    }
    double mp = 0, mbp = 0, mdd = 0, mbd = 0, ms = 0, mbs = 0;
    uint64_t r = 0x9e3779b97f4a7c15ull ^ (uint64_t)strlen(fc->label);
    int32_t ids[64], pos[64];
    int sq[64];
    /* prefill: the 40-token prefill and the chunks; decode: the one-token steps */
#define NEXT_ID() (r ^= r << 13, r ^= r >> 7, r ^= r << 17, (int32_t)(r % (uint64_t)vocab))
    /* prefill of 40 tokens of sequence 0 */
    if (rc == 0) {
        for (int i = 0; i < 40; i++) { ids[i] = NEXT_ID(); pos[i] = i; sq[i] = 0; }
        rc = fam_step(e, seqs, 40, ids, pos, sq, vocab, &mp, &mbp);
        CHECK(rc == 0, "%s %s: prefill: %s", fc->label, dn, zs_errmsg());
    }
    /* 24 decode steps of given tokens, chunks of 64 up to position 320 (past the ring of blocks a
     * window gives a sequence: 18 blocks with 256-token chunks), 16 more decode steps */
    for (int t = 40; t < 336 && rc == 0;) {
        int n = t >= 64 && t < 320 ? 64 : 1;
        for (int i = 0; i < n; i++) { ids[i] = NEXT_ID(); pos[i] = t + i; sq[i] = 0; }
        rc = fam_step(e, seqs, n, ids, pos, sq, vocab, n > 1 ? &mp : &mdd, n > 1 ? &mbp : &mbd);
        CHECK(rc == 0, "%s %s: %s at %d: %s", fc->label, dn, n > 1 ? "chunk" : "decode", t, zs_errmsg());
        t += n;
    }
    /* a serving batch: 20 tokens of sequence 1 and the next token of sequence 0 */
    if (rc == 0) {
        for (int i = 0; i < 20; i++) { ids[i] = NEXT_ID(); pos[i] = i; sq[i] = 1; }
        ids[20] = NEXT_ID(); pos[20] = 336; sq[20] = 0;
        rc = fam_step(e, seqs, 21, ids, pos, sq, vocab, &ms, &mbs);
        CHECK(rc == 0, "%s %s: serving batch: %s", fc->label, dn, zs_errmsg());
    }
#undef NEXT_ID
    if (rc == 0) {
        double ep = mp / fmax(mbp, 1e-9), ed = mdd / fmax(mbd, 1e-9), es = ms / fmax(mbs, 1e-9);
        fprintf(stderr, "%-42s %-4s prefill %.3g, decode %.3g, serving batch %.3g (max |gpu - cpu| / max |cpu|; "
                "logits up to %.3g)\n", fc->label, dn, ep, ed, es, mbp);
        CHECK(ep <= tol, "%s %s: prefill logits: GPU against CPU %.3g (max |diff| %.3g)", fc->label, dn, ep, mp);
        CHECK(ed <= tol, "%s %s: decode logits: GPU against CPU %.3g (max |diff| %.3g)", fc->label, dn, ed, mdd);
        CHECK(es <= tol, "%s %s: serving-batch logits: GPU against CPU %.3g (max |diff| %.3g)", fc->label, dn, es, ms);
        json_array_append_new(runs, json_pack("{s:s, s:s, s:f, s:f, s:f}", "model", fc->label, "dtype", dn,
                                              "rel_err_prefill", ep, "rel_err_decode", ed, "rel_err_serving", es));
    }
    for (int k = 0; k < 2; k++) zs_engine_free(e[k]);
}

static void run_families(void) {
    char scratch[4096];
    CHECK(tu_tmpdir(scratch, sizeof scratch, "gpu-families") == 0, "scratch dir");
    /* phi3 (head_dim 64): LongRoPE with 32 short and 32 long factors, switching past position 32 */
    char phi3[4096];
    int n = snprintf(phi3, sizeof phi3, "{\"sliding_window\": 24, \"original_max_position_embeddings\": 32, "
                     "\"rope_scaling\": {\"type\": \"longrope\", \"short_factor\": [");
    for (int i = 0; i < 32; i++) n += snprintf(phi3 + n, sizeof phi3 - n, "%s%.3f", i ? ", " : "", 1.0 + 0.02 * i);
    n += snprintf(phi3 + n, sizeof phi3 - n, "], \"long_factor\": [");
    for (int i = 0; i < 32; i++) n += snprintf(phi3 + n, sizeof phi3 - n, "%s%.3f", i ? ", " : "", 1.5 + 0.5 * i);
    snprintf(phi3 + n, sizeof phi3 - n, "]}}");
    const fam_case fams[] = {
        {"llama (llama3 RoPE scaling)", "llama",
         "{\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, "
         "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 64}}"},
        {"llama (YaRN RoPE scaling)", "llama",
         "{\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0, \"original_max_position_embeddings\": 256}}"},
        {"mistral (window 16)", "mistral", "{\"sliding_window\": 16}"},
        {"qwen2", "qwen2", "{}"},
        {"qwen3", "qwen3", "{}"},
        {"gemma2 (window 16)", "gemma2", "{\"sliding_window\": 16}"},
        {"gemma3 (window 16, linear RoPE scaling)", "gemma3",
         "{\"sliding_window\": 16, \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 2.0}}"},
        {"phi3 (longrope, window 24)", "phi3", phi3},
    };
    for (size_t i = 0; i < sizeof fams / sizeof fams[0]; i++) run_family(&fams[i], (int)i, scratch);
    tu_rmdir(scratch);
}

int main(int argc, char **argv) {
    /* the CUDA kernels reproduce the CPU's exact f32-activation path (matmul-q8act.h), not its
     * default 8-bit-activation one */
    zs_op_matmul_quant_act(ZS_QUANT_ACT_F32);
    if (zs_backend_cuda_devices() == 0) {
        fprintf(stderr, "e2e-gpu: no CUDA device visible (built with CUDA: %d); skipping\n", zs_backend_cuda_built());
        return 77;
    }
    char name[256];
    if (zs_backend_cuda_describe(0, name, sizeof name) == 0) fprintf(stderr, "device 0: %s\n", name);
    runs = json_array();
    run_model("stories260K");
    run_model("gpt2-bytes");
    run_families();
    int rc = tu_finish("e2e-gpu");
    if (argc > 1) {
        json_t *j = json_pack("{s:s, s:i, s:i, s:o}", "device", name, "checks", tu_checks, "failed", tu_failures,
                              "runs", runs);
        if (json_dump_file(j, argv[1], JSON_INDENT(1)) != 0) fprintf(stderr, "cannot write %s\n", argv[1]);
        json_decref(j);
    } else {
        json_decref(runs);
    }
    return rc;
}
