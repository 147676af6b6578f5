/* bench-lora.c — `zeroserve bench --lora N`: decode throughput of a batch of sequences that mixes
 * N LoRA adapters (each sequence its own adapter, round robin) against the same batch through the
 * base alone, measured in the same run with the runs interleaved (base, mixed, base, mixed, ...),
 * so the figure is a ratio against a peer measured under the same load: what serving many adapters
 * over one weight stream costs. The adapters are random (PEFT's init for A, small random B) with
 * rank --lora-r over all seven projections; the base weights are gathered once per step for the
 * whole batch whichever adapters its rows use. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "common.h"
#include "lora.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int zs_bench_decode_batch(zs_engine *e, int S, int np, int nd, zs_lora *const *ad, int n_ad, float *logits,
                          double *tok_s) {
    zs_kvcache *kv = zs_engine_kv(e);
    const zs_model_config *c = zs_model_config_get(zs_engine_model(e));
    int V = c->vocab_size, rc = 0;
    int32_t *tok = malloc((size_t)(np + S) * 4 * sizeof(int32_t));
    const zs_lora **lr = calloc((size_t)(np + S), sizeof *lr);
    int *seq = malloc((size_t)S * sizeof(int));
    if (!tok || !lr || !seq) {
        free(tok); free(lr); free(seq);
        return zs_err(ZS_ENOMEM, "out of memory");
    }
    int32_t *pos = tok + np + S, *sq = pos + np + S, *li = sq + np + S;
    int opened = 0;
    for (; opened < S && rc == 0; opened++) {
        if ((rc = zs_kv_seq_open(kv, &seq[opened])) < 0) break;
        if ((rc = zs_kv_seq_reserve(kv, seq[opened], np + nd)) < 0) {
            zs_kv_seq_close(kv, seq[opened]);
            break;
        }
    }
    for (int s = 0; s < S && rc == 0; s++) { /* prefill, one sequence per call */
        for (int i = 0; i < np; i++) {
            tok[i] = (int32_t)((i * 7919 + s * 131 + 13) % V);
            pos[i] = i;
            sq[i] = seq[s];
            li[i] = i == np - 1 ? 0 : -1;
            lr[i] = ad ? ad[s % n_ad] : NULL;
        }
        zs_batch b = {np, tok, pos, sq, li, 1, ad ? lr : NULL, NULL, NULL};
        rc = zs_engine_forward(e, &b, logits);
    }
    double t0 = now_s();
    for (int step = 0; step < nd && rc == 0; step++) {
        for (int s = 0; s < S; s++) {
            tok[s] = (int32_t)((step * 31 + s * 17 + 5) % V);
            pos[s] = np + step;
            sq[s] = seq[s];
            li[s] = s;
            lr[s] = ad ? ad[s % n_ad] : NULL;
        }
        zs_batch b = {S, tok, pos, sq, li, S, ad ? lr : NULL, NULL, NULL};
        rc = zs_engine_forward(e, &b, logits);
    }
    double dt = now_s() - t0;
    for (int s = 0; s < opened && s < S; s++) zs_kv_seq_close(kv, seq[s]);
    free(tok); free(lr); free(seq);
    if (rc == 0) *tok_s = (double)S * nd / dt;
    return rc;
}

int zs_bench_lora(const zs_bench_opts *o) {
    int S = o->lora_seqs > 0 ? o->lora_seqs : 16, N = o->lora_adapters, R = o->lora_r > 0 ? o->lora_r : 16;
    int runs = o->runs > 0 ? o->runs : 5, nd = o->decode_tokens, np = ZS_MIN(o->prefill_tokens, 64);
    if (N < 1) return zs_err(ZS_EINVAL, "bench: --lora must be >= 1");
    zs_engine_opts eo = o->engine;
    eo.max_seqs = S;
    eo.max_batch_tokens = ZS_MAX(eo.max_batch_tokens, ZS_MAX(S, np));
    zs_engine *e;
    ZS_CHECK(zs_engine_open(&eo, &e));
    zs_model *m = zs_engine_model(e);
    const zs_model_config *c = zs_model_config_get(m);
    int rc = 0;
    zs_lora **ad = calloc((size_t)N, sizeof *ad);
    float *logits = malloc((size_t)S * (size_t)c->vocab_size * sizeof(float));
    double *tb = calloc((size_t)runs * 3, sizeof(double)), *tm = tb + runs, *ratio = tm + runs;
    if (!ad || !logits || !tb) { rc = zs_err(ZS_ENOMEM, "out of memory"); goto done; }
    if (np + nd > zs_engine_context(e)) {
        rc = zs_err(ZS_EINVAL, "bench: context %d too short for %d + %d tokens", zs_engine_context(e), np, nd);
        goto done;
    }
    zs_lora_params lp = {R, 2.0f * (float)R, 0, 0.0f, ZS_LORA_ALL};
    size_t ad_bytes = 0;
    for (int i = 0; i < N && rc == 0; i++) {
        if ((rc = zs_lora_new(m, &lp, &ad[i])) < 0) break;
        zs_lora_init(ad[i], 1000u + (unsigned)i);
        /* B small and random (PEFT starts it at zero, which would make the adapter a no-op) */
        int layers = zs_lora_n_layers(ad[i]);
        uint64_t st = 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1);
        for (int l = 0; l < layers; l++)
            for (int t = 0; t < ZS_LORA_NT; t++) {
                int in, out;
                float *B = zs_lora_B(ad[i], l, t);
                zs_lora_dims(ad[i], t, &in, &out);
                for (size_t k = 0; k < (size_t)out * (size_t)R; k++) {
                    st = st * 6364136223846793005ull + 1442695040888963407ull;
                    B[k] = ((float)(st >> 40) / (float)(1u << 24) - 0.5f) * 0.02f;
                }
            }
        ad_bytes += zs_lora_param_count(ad[i]) * (zs_lora_serving_bf16(m) ? 2 : 4);
        if ((rc = zs_lora_freeze(ad[i], zs_lora_serving_bf16(m))) < 0) break; /* as the server serves them */
    }
    if (rc < 0) goto done;
    fprintf(stderr, "bench: %s, %.1fM parameters, %s weights; %d sequences decoding %d tokens; %d adapters of rank %d "
            "(%.1f MB each as served), %d interleaved runs\n", c->arch_name, (double)zs_model_param_count(m) / 1e6,
            zs_dtype_name(zs_model_layout(m, 1)->slot[ZS_R_WQ].dtype), S, nd, N, R, (double)ad_bytes / N / 1e6, runs);
    double warm;
    if ((rc = zs_bench_decode_batch(e, S, np, 2, NULL, 0, logits, &warm)) < 0) goto done;
    if ((rc = zs_bench_decode_batch(e, S, np, 2, ad, N, logits, &warm)) < 0) goto done;
    for (int r = 0; r < runs && rc == 0; r++) {
        if ((rc = zs_bench_decode_batch(e, S, np, nd, NULL, 0, logits, &tb[r])) < 0) break;
        if ((rc = zs_bench_decode_batch(e, S, np, nd, ad, N, logits, &tm[r])) < 0) break;
        ratio[r] = tm[r] / tb[r];
    }
    if (rc < 0) goto done;
    double base = zs_bench_median(tb, runs), mixed = zs_bench_median(tm, runs), rt = zs_bench_median(ratio, runs);
    printf("decode, %d sequences, base alone:   %8.2f tokens/s\n", S, base);
    printf("decode, %d sequences, %d adapters:  %8.2f tokens/s\n", S, N, mixed);
    printf("mixed adapters / base:             %8.3f  (median of the per-pair ratios; goal >= 0.9)\n", rt);
    printf("adapter bytes per step:            %8.1f MB (%s serving copies, every adapter of the batch read once)\n",
           (double)ad_bytes / 1e6, zs_lora_serving_bf16(m) ? "bf16" : "f32");
done:
    for (int i = 0; ad && i < N; i++) zs_lora_free(ad[i]);
    free(ad);
    free(logits);
    free(tb);
    zs_engine_free(e);
    return rc;
}
