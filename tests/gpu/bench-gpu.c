/* bench-gpu.c — the GPU benchmark of tests/gpu/run.sh, every figure against a bound measured in
 * the same run on the same device:
 *   pinned host -> device cudaMemcpyAsync GB/s (the bound of weight streaming);
 *   --offload cpu: weight-stream GB/s during decode at batch 1 and its ratio to that bound, and
 *   decode tokens/s at batch 1, 8, 32, 128 (one pass over the streamed weights per step);
 *   resident: decode tokens/s at batch 1 against the HBM read bound (measured read bandwidth /
 *   weight bytes per token), and prefill tokens/s of 2048 tokens with its FLOP rate against the
 *   bf16 tensor-core peak measured with cublasGemmEx;
 *   the attention kernels alone (kernels/cuda/attention.cu) on a 2048-token prefill of the 8B
 *   shape (32 / 8 heads x 128): the simple and the tiled kernel, ms and TFLOP/s, and how far
 *   apart their outputs are (test-backend-ops checks both against the CPU);
 *   the block-format products alone (matmul-quant.cu through zs_dev_gemm) on the 8B MLP's
 *   14336 x 4096 matrix in Q8_0, Q4_K and Q6_K: the fused decode kernel at T = 1 and 8 (GB/s of
 *   weight bytes against the measured read bandwidth) and the bf16 prefill path at T = 512
 *   (TFLOP/s against the measured bf16 peak).
 *
 *   bench-gpu mkmodel DIR [layers dim heads kv_heads ffn vocab]   writes a random bf16 Llama
 *       (default the 8B shape: 32 4096 32 8 14336 32000) fast: config and tokenizer from
 *       `zeroserve init-model` of a tiny model with the same vocab, weights from a repeated
 *       random block (values do not matter for speed; norms are ones)
 *   bench-gpu run DIR OUT.json [--quick]
 * Exit 0, 1 on error, 77 without a CUDA device. */
#include <jansson.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>

#include "backend.h"
#include "common.h"
#include "config.h"
#include "device.h"
#include "engine.h"
#include "safetensors.h"
#ifdef ZS_CUDA
#include "kernels/cuda/kernels.h"
#endif

static int cmpd(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmpd);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ---- mkmodel ---- */

static int mkmodel(const char *dir, int L, int d, int nh, int nkv, int ff, int V) {
    char cmd[8192], path[4096];
    /* a tiny model of the same vocab gives the tokenizer and the config skeleton */
    snprintf(cmd, sizeof cmd, "./zeroserve init-model --arch llama --layers 1 --dim 64 --heads 2 --kv-heads 1 "
             "--ffn 64 --vocab %d --context 4096 --dtype bf16 --untied --out '%s' >/dev/null", V, dir);
    if (system(cmd) != 0) return zs_err(ZS_EIO, "mkmodel: %s failed", cmd);
    zs_model_config c;
    ZS_CHECK(zs_config_load(dir, &c));
    c.n_layers = L;
    c.dim = d;
    c.n_heads = nh;
    c.n_kv_heads = nkv;
    c.head_dim = d / nh;
    c.ffn_dim = ff;
    c.vocab_size = V;
    c.max_seq = 4096;
    c.tied_embeddings = 0;
    c.dtype = ZS_BF16;
    snprintf(path, sizeof path, "%s/config.json", dir);
    ZS_CHECK(zs_config_write(&c, path));
    int q = nh * (d / nh), kv = nkv * (d / nh), n = 0;
    int cap = 3 + 9 * L;
    zs_st_decl *decls = calloc((size_t)cap, sizeof *decls);
    char (*names)[96] = calloc((size_t)cap, 96);
    if (!decls || !names) return zs_err(ZS_ENOMEM, "out of memory");
#define ADD(nd, a, b, ...)                                                                   \
    do {                                                                                     \
        snprintf(names[n], 96, __VA_ARGS__);                                                 \
        decls[n].name = names[n];                                                            \
        decls[n].dtype = ZS_BF16;                                                            \
        decls[n].ndim = nd;                                                                  \
        decls[n].shape[0] = a;                                                               \
        decls[n].shape[1] = b;                                                               \
        n++;                                                                                 \
    } while (0)
    ADD(2, V, d, "model.embed_tokens.weight");
    for (int l = 0; l < L; l++) {
        ADD(1, d, 0, "model.layers.%d.input_layernorm.weight", l);
        ADD(2, q, d, "model.layers.%d.self_attn.q_proj.weight", l);
        ADD(2, kv, d, "model.layers.%d.self_attn.k_proj.weight", l);
        ADD(2, kv, d, "model.layers.%d.self_attn.v_proj.weight", l);
        ADD(2, d, q, "model.layers.%d.self_attn.o_proj.weight", l);
        ADD(1, d, 0, "model.layers.%d.post_attention_layernorm.weight", l);
        ADD(2, ff, d, "model.layers.%d.mlp.gate_proj.weight", l);
        ADD(2, ff, d, "model.layers.%d.mlp.up_proj.weight", l);
        ADD(2, d, ff, "model.layers.%d.mlp.down_proj.weight", l);
    }
    ADD(1, d, 0, "model.norm.weight");
    ADD(2, V, d, "lm_head.weight");
#undef ADD
    /* a block of random normal-ish bf16 values (std ~0.02), written cyclically */
    size_t blk = (size_t)1 << 24;
    uint16_t *rnd = malloc(blk * 2 + 2), *ones = malloc((size_t)d * 2);
    uint64_t s = 0x2545F4914F6CDD1Dull;
    for (size_t i = 0; i < blk; i++) {
        float acc = 0;
        for (int k = 0; k < 4; k++) {
            s ^= s << 13; s ^= s >> 7; s ^= s << 17;
            acc += (float)((s >> 11) * 0x1.0p-53) - 0.5f;
        }
        rnd[i] = zs_f32_to_bf16(acc * 0.0346f); /* sum of 4 uniforms: var 1/3 -> std 0.02 */
    }
    for (int i = 0; i < d; i++) ones[i] = zs_f32_to_bf16(1.0f);
    zs_st_writer *w;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    int rc = zs_st_writer_open(path, decls, (size_t)n, "{\"format\":\"pt\",\"zeroserve\":\"bench-gpu mkmodel\"}", &w);
    size_t at = 0;
    for (int i = 0; rc == 0 && i < n; i++) {
        size_t total = (size_t)decls[i].shape[0] * (size_t)(decls[i].ndim > 1 ? decls[i].shape[1] : 1);
        if (decls[i].ndim == 1) { rc = zs_st_writer_write(w, ones, total * 2); continue; }
        while (total > 0 && rc == 0) {
            size_t m = ZS_MIN(total, blk - at);
            rc = zs_st_writer_write(w, rnd + at, m * 2);
            total -= m;
            at = (at + m + 12345) % blk;
        }
    }
    if (rc == 0) rc = zs_st_writer_close(w);
    else zs_st_writer_abort(w);
    free(rnd); free(ones); free(decls); free(names);
    return rc;
}

/* ---- run ---- */

typedef struct {
    zs_engine *e;
    int vocab, B;
    int seqs[256], len[256];
    float *logits;
} bctx;

/* One forward of ntok tokens for each of the B sequences (logits of each one's last token). */
static int step(bctx *b, int ntok) {
    zs_kvcache *kv = zs_engine_kv(b->e);
    int T = b->B * ntok;
    int32_t *tok = malloc((size_t)T * 16), *pos = tok + T, *sq = pos + T, *li = sq + T;
    for (int s = 0, t = 0; s < b->B; s++) {
        int rc = zs_kv_seq_reserve(kv, b->seqs[s], b->len[s] + ntok);
        if (rc < 0) { free(tok); return rc; }
        for (int i = 0; i < ntok; i++, t++) {
            tok[t] = (int32_t)((b->len[s] * 7919 + s * 131 + 13) % b->vocab);
            pos[t] = b->len[s] + i;
            sq[t] = b->seqs[s];
            li[t] = i == ntok - 1 ? s : -1;
        }
        b->len[s] += ntok;
    }
    zs_batch bt = {T, tok, pos, sq, li, b->B, NULL, NULL, NULL};
    int rc = zs_engine_forward(b->e, &bt, b->logits);
    free(tok);
    return rc;
}

static int open_seqs(bctx *b, int B) {
    b->B = B;
    for (int s = 0; s < B; s++) {
        ZS_CHECK(zs_kv_seq_open(zs_engine_kv(b->e), &b->seqs[s]));
        b->len[s] = 0;
    }
    return 0;
}
static void close_seqs(bctx *b) {
    for (int s = 0; s < b->B; s++) zs_kv_seq_close(zs_engine_kv(b->e), b->seqs[s]);
    b->B = 0;
}

static int open_engine(const char *dir, int tier, int max_seqs, int max_tokens, int context, size_t kv_bytes,
                       zs_engine **e) {
    zs_engine_opts o;
    zs_engine_opts_default(&o);
    o.model_dir = dir;
    o.device = ZS_DEVICE_CUDA;
    o.model.embed_lookup = 1; /* as serve opens it: embedding rows from the host table */
    o.gather.tier = tier;
    o.max_seqs = max_seqs;
    o.max_batch_tokens = max_tokens;
    o.max_context = context;
    o.kv_bytes = kv_bytes;
    double t0 = zs_now();
    int rc = zs_engine_open(&o, e);
    if (rc == 0) fprintf(stderr, "bench-gpu: engine (offload %s) open in %.1f s\n", zs_offload_name(tier), zs_now() - t0);
    return rc;
}

/* The attention kernels alone: one sequence of np tokens, all in the batch (a prefill), over a
 * paged cache of np positions; the median of 5 runs of each kernel, timed on the host around a
 * device sync. */
static int bench_attention(json_t *j, int np) {
#ifdef ZS_CUDA
    int nh = 32, nkv = 8, hd = 128, kvd = nkv * hd, qd = nh * hd, nblk = (np + ZS_KV_BLOCK - 1) / ZS_KV_BLOCK;
    size_t pool_n = (size_t)nblk * 2 * ZS_KV_BLOCK * kvd, qn = (size_t)np * qd;
    zs_dev *d;
    ZS_CHECK(zs_dev_open(0, &d));
    void *S = zs_dev_stream(d, ZS_Q_COMPUTE);
    float *hp = malloc(pool_n * 4), *hq = malloc(qn * 4), *o1 = malloc(qn * 4), *o2 = malloc(qn * 4);
    int32_t *hi = malloc((size_t)(nblk + 2 * np) * 4);
    float *pool = zs_dev_alloc(d, pool_n * 4), *q = zs_dev_alloc(d, qn * 4), *out = zs_dev_alloc(d, qn * 4);
    int32_t *di = zs_dev_alloc(d, (size_t)(nblk + 2 * np) * 4);
    int rc = hp && hq && o1 && o2 && hi && pool && q && out && di ? 0 : zs_err(ZS_ENOMEM, "attention bench: out of memory");
    uint64_t r = 12345;
    for (size_t i = 0; rc == 0 && i < pool_n; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        hp[i] = (float)((r >> 40) & 0xffff) / 32768.0f - 1.0f;
    }
    for (size_t i = 0; rc == 0 && i < qn; i++) hq[i] = hp[i % pool_n];
    if (rc == 0) {
        for (int i = 0; i < nblk; i++) hi[i] = i;                       /* the block table */
        for (int t = 0; t < np; t++) hi[nblk + t] = 0;                  /* tab: one sequence */
        for (int t = 0; t < np; t++) hi[nblk + np + t] = t;             /* pos */
        rc = zs_dev_upload(d, pool, hp, pool_n * 4);
    }
    if (rc == 0) rc = zs_dev_upload(d, q, hq, qn * 4);
    if (rc == 0) rc = zs_dev_upload(d, di, hi, (size_t)(nblk + 2 * np) * 4);
    int impls[2] = {ZS_CUDA_ATTN_SIMPLE, ZS_CUDA_ATTN_TILED};
    double ms[2] = {0, 0}, flops = 4.0 * ((double)np * (np + 1) / 2) * qd;
    for (int k = 0; k < 2 && rc == 0; k++) {
        double tv[6];
        for (int it = 0; it < 6 && rc == 0; it++) {
            double t0 = zs_now();
            if (zs_cuda_attention_impl(impls[k], out, ZS_F32, q, qd, pool, di, di + nblk, di + nblk + np, np, nh, nkv,
                                       hd, 1.0f / sqrtf((float)hd), S) != 0)
                rc = zs_dev_error("attention kernel");
            if (rc == 0) rc = zs_dev_sync(d);
            tv[it] = zs_now() - t0;
        }
        if (rc == 0) rc = zs_dev_download(d, k ? o2 : o1, out, qn * 4);
        if (rc == 0) ms[k] = median(tv + 1, 5) * 1e3; /* the first run warms up */
    }
    if (rc == 0) {
        double diff = 0, mx = 0;
        for (size_t i = 0; i < qn; i++) {
            diff = fmax(diff, fabs((double)o1[i] - o2[i]));
            mx = fmax(mx, fabs((double)o1[i]));
        }
        printf("prefill attention %d tokens, 32/8 heads x 128: simple %.2f ms (%.1f TFLOP/s), tiled %.2f ms "
               "(%.1f TFLOP/s) = %.1f x; max |tiled - simple| / max|simple| %.2g\n",
               np, ms[0], flops / ms[0] / 1e9, ms[1], flops / ms[1] / 1e9, ms[0] / ms[1], diff / (mx > 0 ? mx : 1));
        json_object_set_new(j, "attention_prefill_simple_ms", json_real(ms[0]));
        json_object_set_new(j, "attention_prefill_tiled_ms", json_real(ms[1]));
        json_object_set_new(j, "attention_prefill_tiled_vs_simple_err", json_real(diff / (mx > 0 ? mx : 1)));
    }
    free(hp); free(hq); free(o1); free(o2); free(hi);
    zs_dev_free(d); /* the pool buffers go with it */
    return rc;
#else
    (void)j;
    (void)np;
    return 0;
#endif
}

/* The block-format products alone: random blocks (small f16 scales) of a 14336 x 4096 matrix;
 * the median of 5 timed runs after a warm-up, each timed on the host around a device sync. */
static int bench_qmatmul(json_t *j, double hbm, double peak) {
#ifdef ZS_CUDA
    int out = 14336, in = 4096, Ts[3] = {1, 8, 512};
    zs_dtype dts[3] = {ZS_Q8_0, ZS_Q4_K, ZS_Q6_K};
    zs_dev *d;
    ZS_CHECK(zs_dev_open(0, &d));
    size_t wmax = zs_dtype_bytes(ZS_Q8_0, (size_t)out * in);
    uint8_t *hw = malloc(wmax);
    float *hx = malloc((size_t)512 * in * 4);
    void *W = zs_dev_alloc(d, wmax);
    float *x = zs_dev_alloc(d, (size_t)512 * in * 4), *y = zs_dev_alloc(d, (size_t)512 * out * 4);
    int rc = hw && hx && W && x && y ? 0 : zs_err(ZS_ENOMEM, "quantized matmul bench: out of memory");
    uint64_t r = 987654321;
    for (size_t i = 0; rc == 0 && i < (size_t)512 * in; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        hx[i] = (float)((r >> 40) & 0xffff) / 32768.0f - 1.0f;
    }
    if (rc == 0) rc = zs_dev_upload(d, x, hx, (size_t)512 * in * 4);
    json_t *q = json_object();
    for (int k = 0; k < 3 && rc == 0; k++) {
        zs_dtype dt = dts[k];
        size_t wb = zs_dtype_bytes(dt, (size_t)out * in), bb = zs_dtype_size(dt);
        for (size_t i = 0; i < wb; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            hw[i] = (uint8_t)(r >> 56);
        }
        uint16_t h = zs_f32_to_f16(0.001f);
        for (size_t b = 0; b < wb / bb; b++) {
            memcpy(hw + b * bb + (dt == ZS_Q6_K ? 208 : 0), &h, 2);
            if (dt == ZS_Q4_K) memcpy(hw + b * bb + 2, &h, 2);
        }
        if ((rc = zs_dev_upload(d, W, hw, wb)) < 0) break;
        for (int ti = 0; ti < 3 && rc == 0; ti++) {
            int T = Ts[ti];
            double tv[6];
            for (int it = 0; it < 6 && rc == 0; it++) {
                double t0 = zs_now();
                rc = zs_dev_gemm(d, y, x, T, in, W, dt, out, 0.0f);
                if (rc == 0) rc = zs_dev_sync(d);
                tv[it] = zs_now() - t0;
            }
            if (rc < 0) break;
            double t = median(tv + 1, 5);
            char key[64];
            if (T <= 8) {
                printf("%s %dx%d T=%d (fused kernel): %8.1f us, %7.1f GB/s of weights (%.2f of the read bound)\n",
                       zs_dtype_name(dt), out, in, T, t * 1e6, wb / t / 1e9, wb / t / 1e9 / hbm);
                snprintf(key, sizeof key, "%s_t%d_gbps", zs_dtype_name(dt), T);
                json_object_set_new(q, key, json_real(wb / t / 1e9));
            } else {
                double tf = 2.0 * T * (double)in * out / t / 1e12;
                printf("%s %dx%d T=%d (bf16 cuBLAS): %8.1f us, %6.1f TFLOP/s (%.2f of the bf16 peak)\n",
                       zs_dtype_name(dt), out, in, T, t * 1e6, tf, tf / peak);
                snprintf(key, sizeof key, "%s_t%d_tflops", zs_dtype_name(dt), T);
                json_object_set_new(q, key, json_real(tf));
            }
        }
    }
    json_object_set_new(j, "quant_matmul_14336x4096", q);
    free(hw); free(hx);
    zs_dev_free(d); /* the pool buffers go with it */
    return rc;
#else
    (void)j;
    (void)hbm;
    (void)peak;
    return 0;
#endif
}

static int run(const char *dir, const char *out, int quick) {
    json_t *j = json_object();
    char name[256] = "";
    zs_backend_cuda_describe(0, name, sizeof name);
    json_object_set_new(j, "device", json_string(name));
    fprintf(stderr, "bench-gpu: device 0: %s\n", name);
    int rc;
    /* bounds */
    zs_dev *d;
    double h2d = 0, hbm = 0, peak = 0;
    ZS_CHECK(zs_dev_open(0, &d));
    rc = zs_dev_h2d_gbps(d, (size_t)1 << 30, 5, &h2d);
    if (rc == 0) rc = zs_dev_read_gbps(d, (size_t)4 << 30, 5, &hbm);
    if (rc == 0) rc = zs_dev_gemm_tflops(d, 8192, 5, &peak);
    zs_dev_free(d);
    if (rc < 0) return rc;
    printf("pinned host->device cudaMemcpyAsync:   %8.2f GB/s\n", h2d);
    printf("device memory read:                    %8.1f GB/s\n", hbm);
    printf("bf16 cublasGemmEx 8192^3:              %8.1f TFLOP/s\n", peak);
    json_object_set_new(j, "h2d_gbps", json_real(h2d));
    json_object_set_new(j, "hbm_read_gbps", json_real(hbm));
    json_object_set_new(j, "bf16_gemm_tflops", json_real(peak));
    if ((rc = bench_attention(j, 2048)) < 0) return rc;
    if ((rc = bench_qmatmul(j, hbm, peak)) < 0) return rc;

    /* --offload cpu: decode at batch 1, 8, 32, 128 */
    zs_engine *e;
    int Bs[4] = {1, 8, 32, 128}, nd = quick ? 2 : 3;
    if ((rc = open_engine(dir, ZS_OFFLOAD_CPU, 128, 1024, 64, (size_t)1 << 30, &e)) < 0) return rc;
    zs_model *m = zs_engine_model(e);
    const zs_model_config *c = zs_model_config_get(m);
    json_object_set_new(j, "params_billions", json_real((double)zs_model_param_count(m) / 1e9));
    int order[2 * ZS_MAX_LAYERS + 8], n_order = zs_model_pass_order(m, order); /* dense here: no marks */
    double pass_bytes = 0;
    for (int i = 0; i < n_order; i++) pass_bytes += (double)zs_partition_shard_bytes(m, order[i], 1);
    json_object_set_new(j, "offload_cpu_pass_gb", json_real(pass_bytes / 1e9));
    bctx b = {e, c->vocab_size, 0, {0}, {0}, malloc((size_t)128 * c->vocab_size * 4)};
    json_t *dec = json_object();
    double stream1 = 0;
    for (int k = 0; k < 4 && rc == 0; k++) {
        int B = Bs[k];
        if ((rc = open_seqs(&b, B)) < 0) break;
        rc = step(&b, 8); /* the prompts, and a warm-up pass */
        double t0 = zs_now();
        for (int i = 0; i < nd && rc == 0; i++) rc = step(&b, 1);
        double t = (zs_now() - t0) / nd;
        close_seqs(&b);
        if (rc < 0) break;
        printf("offload cpu, decode batch %3d:          %8.2f tokens/s  (step %.1f ms, stream %.2f GB/s)\n", B, B / t,
               t * 1e3, pass_bytes / t / 1e9);
        char key[16];
        snprintf(key, sizeof key, "%d", B);
        json_object_set_new(dec, key, json_real(B / t));
        if (B == 1) stream1 = pass_bytes / t / 1e9;
    }
    zs_gather_stats st;
    zs_world_stats(zs_engine_world(e), &st);
    zs_engine_free(e);
    if (rc < 0) { free(b.logits); return rc; }
    printf("weight stream during decode (batch 1): %8.2f GB/s = %.3f x the pinned H2D bound (target >= 0.85)\n", stream1,
           stream1 / h2d);
    json_object_set_new(j, "offload_cpu_decode_tok_s", dec);
    json_object_set_new(j, "offload_cpu_stream_gbps", json_real(stream1));
    json_object_set_new(j, "offload_cpu_stream_ratio", json_real(stream1 / h2d));
    json_object_set_new(j, "offload_cpu_stall_s", json_real(st.stall_s));

    /* resident: decode at batch 1, prefill of 2048 tokens */
    int np = 2048;
    if ((rc = open_engine(dir, ZS_OFFLOAD_NONE, 2, np, np + 64, (size_t)2 << 30, &e)) < 0) { free(b.logits); return rc; }
    m = zs_engine_model(e);
    b.e = e;
    const zs_bucket_layout *E = zs_model_layout(m, zs_bucket_embed());
    double dbytes = (double)zs_model_weight_bytes(m) - (double)E->slot[ZS_R_TOK_EMB].nbytes; /* untied */
    int n1 = quick ? 8 : 32;
    double td[3];
    for (int r = 0; r < 3 && rc == 0; r++) {
        if ((rc = open_seqs(&b, 1)) < 0) break;
        rc = step(&b, 8);
        double t0 = zs_now();
        for (int i = 0; i < n1 && rc == 0; i++) rc = step(&b, 1);
        td[r] = n1 / (zs_now() - t0);
        close_seqs(&b);
    }
    double dec1 = rc == 0 ? median(td, 3) : 0, bound1 = hbm * 1e9 / dbytes;
    if (rc == 0) {
        printf("resident decode batch 1:               %8.1f tokens/s  (HBM bound %.1f tokens/s: %.3f; %.2f GB per token)\n",
               dec1, bound1, dec1 / bound1, dbytes / 1e9);
        json_object_set_new(j, "resident_decode_b1_tok_s", json_real(dec1));
        json_object_set_new(j, "resident_decode_b1_hbm_bound_tok_s", json_real(bound1));
        json_object_set_new(j, "resident_decode_b1_ratio", json_real(dec1 / bound1));
    }
    /* prefill: one sequence of np tokens in one step */
    double tp[4];
    int runs = quick ? 2 : 4;
    for (int r = 0; r < runs && rc == 0; r++) {
        if ((rc = open_seqs(&b, 1)) < 0) break;
        double t0 = zs_now();
        rc = step(&b, np);
        tp[r] = zs_now() - t0;
        close_seqs(&b);
    }
    if (rc == 0) {
        double t = median(tp + 1, runs - 1); /* the first run warms up */
        /* matrix FLOPs of every token through the layers, the LM head for the one logits row,
         * and causal attention (QK^T and PV over T^2/2 pairs) */
        double layer_params = 0;
        for (int l = 0; l < c->n_layers; l++) layer_params += (double)zs_model_layout(m, zs_bucket_layer(l))->data_bytes / 2;
        double qd = (double)c->n_heads * c->head_dim;
        double flops = 2.0 * np * layer_params + 2.0 * c->vocab_size * c->dim +
                       4.0 * ((double)np * np / 2) * qd * c->n_layers;
        double tf = flops / t / 1e12;
        printf("prefill %d tokens:                   %8.0f tokens/s  (%.1f TFLOP/s = %.3f x the bf16 GEMM peak)\n", np,
               np / t, tf, tf / peak);
        json_object_set_new(j, "prefill_tokens", json_integer(np));
        json_object_set_new(j, "prefill_tok_s", json_real(np / t));
        json_object_set_new(j, "prefill_tflops", json_real(tf));
        json_object_set_new(j, "prefill_ratio_to_peak", json_real(tf / peak));
    }
    zs_engine_free(e);
    free(b.logits);
    if (rc < 0) return rc;
    if (json_dump_file(j, out, JSON_INDENT(1)) != 0) rc = zs_err(ZS_EIO, "cannot write %s", out);
    json_decref(j);
    return rc;
}

int main(int argc, char **argv) {
    if (argc >= 3 && !strcmp(argv[1], "mkmodel")) {
        int v[6] = {32, 4096, 32, 8, 14336, 32000};
        for (int i = 0; i < 6 && 3 + i < argc; i++) v[i] = atoi(argv[3 + i]);
        double t0 = zs_now();
        int rc = mkmodel(argv[2], v[0], v[1], v[2], v[3], v[4], v[5]);
        if (rc < 0) { fprintf(stderr, "bench-gpu mkmodel: %s\n", zs_errmsg()); return 1; }
        fprintf(stderr, "bench-gpu: wrote %s in %.1f s\n", argv[2], zs_now() - t0);
        return 0;
    }
    if (argc < 4 || strcmp(argv[1], "run")) {
        fprintf(stderr, "usage: bench-gpu mkmodel DIR [layers dim heads kv_heads ffn vocab]\n"
                        "       bench-gpu run DIR OUT.json [--quick]\n");
        return 1;
    }
    if (zs_backend_cuda_devices() == 0) {
        fprintf(stderr, "bench-gpu: no CUDA device visible; skipping\n");
        return 77;
    }
    int rc = run(argv[2], argv[3], argc > 4 && !strcmp(argv[4], "--quick"));
    if (rc < 0) { fprintf(stderr, "bench-gpu: %s\n", zs_errmsg()); return 1; }
    return 0;
}
