/* test-lora-train.c — LoRA training over a frozen, streamed base (engine/train/lora-train.h) on
 * small random llama models (init-model): (a) the analytic adapter gradient matches central finite
 * differences of the loss; (b) the base's shards and resident tensors are bit for bit untouched
 * after steps, and with B = 0 the first step's loss is the base's loss (a full-training engine's
 * evaluation) exactly; (c) 2 ranks give the same adapter bits as 1 rank with the same global
 * batch (2 micro-steps); (d) a q8_0 base trains (QLoRA: the loss falls); (e) save -> new training ->
 * load -> continue gives the uninterrupted run's adapter bits, also with another rank count, and a
 * truncated or garbled checkpoint is refused naming the file; (f) inference engines (embedding
 * lookup tables) with tied and untied heads; (g) dropout > 0 changes the result and is the same
 * bits across rank counts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "engine.h"
#include "gather.h"
#include "sampler.h"
#include "init-cmd.h"
#include "lora-train.h"
#include "testutil.h"
#include "train.h"

static char tmp[4096], base_untied[4200], base_tied[4200];

#define TT 16 /* tokens per sequence */
static int32_t tok[4][TT], tgt[4][TT];

static int make_base(const char *out, int tied) {
    char *argv[] = {"--arch", "llama", "--layers", "2", "--dim", "64", "--heads", "4", "--kv-heads", "2", "--ffn", "128",
                    "--vocab", "300", "--context", "64", "--seed", "5", "--random-norms", tied ? "--tied" : "--untied",
                    "--out", (char *)out};
    zs_init_opts io;
    const char *o;
    int help;
    if (zs_init_cmd_parse((int)(sizeof argv / sizeof argv[0]), argv, &io, &o, &help) < 0 || zs_init_model_write(&io, out) < 0) {
        fprintf(stderr, "base %s: %s\n", out, zs_errmsg());
        return -1;
    }
    return 0;
}

static zs_engine *open_engine(const char *dir, int ranks, int lookup, zs_dtype wd) {
    zs_engine_opts eo;
    zs_engine_opts_default(&eo);
    eo.model_dir = dir;
    eo.max_seqs = 1;
    eo.ranks = ranks;
    eo.model.embed_lookup = lookup;
    eo.model.weight_dtype = wd;
    zs_engine *e = NULL;
    if (zs_engine_open(&eo, &e) < 0) {
        fprintf(stderr, "open %s: %s\n", dir, zs_errmsg());
        return NULL;
    }
    return e;
}

static zs_train_opts topts(int B, int accum, float lr, float clip) {
    zs_train_opts o;
    memset(&o, 0, sizeof o);
    o.micro_batch = B;
    o.seq_len = TT;
    o.grad_accum = accum;
    o.grad_clip = clip;
    zs_adamw_params_default(&o.adam);
    o.adam.lr = lr;
    o.adam.weight_decay = 0.01f;
    o.lr.type = ZS_LR_CONSTANT;
    o.lr.lr = lr;
    o.lr.warmup_min_ratio = 1.0f;
    return o;
}

static zs_lora *new_adapter(zs_engine *e, int r, float alpha, float dropout, unsigned targets, uint64_t seed, int random_b) {
    zs_lora_params p = {r, alpha, 0, dropout, targets};
    zs_lora *l = NULL;
    if (zs_lora_new(zs_engine_model(e), &p, &l) < 0) {
        fprintf(stderr, "lora: %s\n", zs_errmsg());
        return NULL;
    }
    zs_lora_init(l, seed);
    if (random_b) { /* a non-zero B, so that A has a gradient too */
        uint64_t s = seed * 2654435761u + 1;
        for (int layer = 0; layer < zs_lora_n_layers(l); layer++)
            for (int t = 0; t < ZS_LORA_NT; t++) {
                float *B = zs_lora_B(l, layer, t);
                int in, out;
                zs_lora_dims(l, t, &in, &out);
                for (int i = 0; B && i < out * r; i++) {
                    s = s * 6364136223846793005ull + 1442695040888963407ull;
                    B[i] = ((float)(s >> 40) / 16777216.0f - 0.5f) * 0.2f;
                }
            }
    }
    return l;
}

/* slot i of a 1-sequence micro-batch layout (B=1), or both sequences in one (B=2) */
static void layout(int slots, int B, const int32_t **T, const int32_t **G, int32_t *both_t, int32_t *both_g) {
    if (B == 2) {
        for (int s = 0; s < slots; s++) {
            memcpy(both_t + s * 2 * TT, tok[2 * s], sizeof(int32_t) * 2 * TT);
            memcpy(both_g + s * 2 * TT, tgt[2 * s], sizeof(int32_t) * 2 * TT);
            T[s] = both_t + s * 2 * TT;
            G[s] = both_g + s * 2 * TT;
        }
    } else {
        for (int s = 0; s < slots; s++) {
            T[s] = tok[s];
            G[s] = tgt[s];
        }
    }
}

/* n steps of a LoRA training on e with `ranks` ranks x accum micro-steps of one sequence each
 * (global batch ranks*accum sequences), starting at step s0 + 1; the adapter ends in a */
static int run_steps(zs_engine *e, zs_lora *a, int accum, long s0, int n, float lr, float clip, float *losses,
                     const char *save_dir, const char *load_dir) {
    int ranks = zs_world_size(zs_engine_world(e));
    zs_train_opts o = topts(1, accum, lr, clip);
    zs_lora_training *t = NULL;
    int rc = zs_lora_training_begin(zs_engine_world(e), a, &o, 77, &t);
    const int32_t *T[4], *G[4];
    layout(ranks * accum, 1, T, G, NULL, NULL);
    if (rc == 0 && load_dir) {
        long st;
        char *meta = NULL;
        rc = zs_lora_training_load(t, load_dir, &st, &meta);
        if (rc == 0) CHECK(st == s0 && meta && strstr(meta, "\"pos\":7"), "loaded step %ld meta %s", st, meta ? meta : "-");
        free(meta);
    }
    for (int s = 1; rc == 0 && s <= n; s++) rc = zs_lora_training_step(t, T, G, s0 + s, losses ? &losses[s - 1] : &(float){0});
    if (rc == 0 && save_dir) rc = zs_lora_training_save(t, save_dir, s0 + n, "{\"pos\":7}", 2, "base");
    if (rc < 0) fprintf(stderr, "run_steps: %s\n", zs_errmsg());
    zs_lora_training_end(t);
    return rc;
}

static int same_adapter(const zs_lora *x, const zs_lora *y) {
    size_t n1, n2;
    const float *a = zs_lora_data_const(x, &n1), *b = zs_lora_data_const(y, &n2);
    return n1 == n2 && memcmp(a, b, n1 * sizeof(float)) == 0;
}

/* (a) */
static void check_fd(void) {
    zs_engine *e = open_engine(base_untied, 1, 1, ZS_F32);
    if (!e) { CHECK(0, "engine"); return; }
    zs_lora *a = new_adapter(e, 4, 16.0f, 0.0f, ZS_LORA_ALL, 3, 1), *keep = NULL;
    zs_lora_new_like(a, &keep);
    zs_lora_copy(keep, a);
    zs_train_opts o = topts(2, 1, 1e-3f, 0.0f);
    zs_lora_training *t = NULL;
    CHECK(zs_lora_training_begin(zs_engine_world(e), a, &o, 1, &t) == 0, "begin: %s", zs_errmsg());
    const int32_t *T[1], *G[1];
    int32_t bt[2 * TT], bg[2 * TT];
    layout(1, 2, T, G, bt, bg);
    CHECK(zs_lora_training_grad(t) == NULL, "no gradient before the first step");
    float l0, le;
    CHECK(zs_lora_training_step(t, T, G, 1, &l0) == 0, "step: %s", zs_errmsg());
    const zs_lora *g = zs_lora_training_grad(t);
    CHECK(g != NULL, "gradient");
    zs_lora_copy(a, keep); /* back to the point the gradient is of */
    CHECK(zs_lora_training_eval(t, T, G, &le) == 0 && le == l0, "eval loss %.9g = step loss %.9g", le, l0);
    int checked = 0, bad = 0;
    double worst = 0;
    for (int k = 0; k < 14 && g; k++) {
        int layer = k % 2, tg = k % ZS_LORA_NT, isB = k >= 7;
        int in, out;
        zs_lora_dims(a, tg, &in, &out);
        int idx = (k * 37) % (isB ? out * 4 : 4 * in);
        float *p = isB ? zs_lora_B(a, layer, tg) : zs_lora_A(a, layer, tg);
        const float *gp = isB ? zs_lora_B_const(g, layer, tg) : zs_lora_A_const(g, layer, tg);
        float h = 1e-2f, save = p[idx], lp, lm;
        p[idx] = save + h;
        zs_lora_training_eval(t, T, G, &lp);
        p[idx] = save - h;
        zs_lora_training_eval(t, T, G, &lm);
        p[idx] = save;
        double fd = ((double)lp - (double)lm) / (2.0 * h), an = gp[idx];
        double err = fabs(fd - an) / (fabs(an) + 2e-4);
        worst = ZS_MAX(worst, err);
        checked++;
        if (err > 0.05) {
            bad++;
            fprintf(stderr, "  %s layer %d %s[%d]: analytic %.6g, finite differences %.6g\n", zs_lora_target_name(tg), layer,
                    isB ? "B" : "A", idx, an, fd);
        }
    }
    CHECK(checked == 14 && bad == 0, "%d of %d entries off (worst relative error %.3g)", bad, checked, worst);
    fprintf(stderr, "finite differences: %d entries, worst relative error %.3g\n", checked, worst);
    zs_lora_training_end(t);
    zs_lora_free(a);
    zs_lora_free(keep);
    zs_engine_free(e);
}

/* every bucket's shard (rank 0..ranks-1) and resident area, concatenated */
static size_t snapshot(zs_engine *e, char **out) {
    zs_world *w = zs_engine_world(e);
    zs_model *m = zs_engine_model(e);
    size_t total = 0;
    int n = zs_world_ranks(w);
    for (int b = 0; b < zs_model_n_buckets(m); b++)
        total += zs_partition_shard_bytes(m, b, n) * (size_t)n + zs_model_layout(m, b)->resident_bytes;
    char *p = malloc(total + 1), *q = p;
    for (int b = 0; b < zs_model_n_buckets(m); b++) {
        size_t sb = zs_partition_shard_bytes(m, b, n);
        for (int r = 0; r < n; r++) {
            const void *s = zs_gather_shard_buffer(zs_world_gather(w, r), b);
            if (sb && s) memcpy(q, s, sb);
            q += sb;
        }
        size_t rb = zs_model_layout(m, b)->resident_bytes;
        if (rb) memcpy(q, zs_model_bucket_resident(m, b), rb);
        q += rb;
    }
    *out = p;
    return total;
}

/* (b) and (f) */
static void check_frozen(const char *base, int tied) {
    /* the base's loss from a full-training engine */
    zs_engine *fe = open_engine(base, 1, 0, ZS_F32);
    zs_train_opts o = topts(2, 1, 1e-3f, 1.0f);
    const int32_t *T[2], *G[2];
    int32_t bt[4 * TT], bg[4 * TT];
    layout(1, 2, T, G, bt, bg);
    float lbase = -1;
    zs_training *ft = NULL;
    if (fe && zs_training_begin(zs_engine_world(fe), &o, &ft) == 0) CHECK(zs_training_eval(ft, T, G, &lbase) == 0, "eval");
    zs_training_end(ft);
    zs_engine_free(fe);
    /* the same through LoRA on an inference engine, 2 ranks */
    zs_engine *e = open_engine(base, 2, 1, ZS_F32);
    if (!e) { CHECK(0, "engine"); return; }
    CHECK(zs_model_embed_lookup(zs_engine_model(e)) == 1, "an inference model");
    char *before, *after;
    size_t n1 = snapshot(e, &before);
    zs_lora *a = new_adapter(e, 8, 16.0f, 0.0f, ZS_LORA_ALL, 9, 0);
    zs_train_opts lo = topts(1, 1, 1e-2f, 1.0f);
    zs_lora_training *t = NULL;
    CHECK(zs_lora_training_begin(zs_engine_world(e), a, &lo, 1, &t) == 0, "begin: %s", zs_errmsg());
    layout(2, 1, T, G, NULL, NULL);
    float l[6];
    for (int s = 1; s <= 6 && t; s++) CHECK(zs_lora_training_step(t, T, G, s, &l[s - 1]) == 0, "step %d: %s", s, zs_errmsg());
    /* (2 ranks of B = 1 against 1 rank of B = 2: the same loss up to the order of its sums) */
    CHECK(fabsf(l[0] - lbase) <= 1e-6f * fabsf(lbase), "%s: step 1 loss %.9g, the base's %.9g", tied ? "tied" : "untied",
          l[0], lbase);
    CHECK(l[5] < l[0], "%s: the loss falls: %.6g -> %.6g", tied ? "tied" : "untied", l[0], l[5]);
    /* inference steps run between training steps on the same world */
    zs_lora_training_memory(t, &(zs_lora_train_memory){0});
    size_t n2 = snapshot(e, &after);
    CHECK(n1 == n2 && memcmp(before, after, n1) == 0, "the base is untouched");
    zs_lora_train_memory mem;
    zs_lora_training_memory(t, &mem);
    CHECK(mem.adapter == zs_lora_param_count(a) * 4 && mem.optimizer == 2 * mem.adapter && mem.activations > 0,
          "memory figures");
    zs_lora_training_end(t);
    int32_t prompt[4] = {1, 2, 3, 4};
    zs_gen_params gp;
    memset(&gp, 0, sizeof gp);
    zs_sampler_params_default(&gp.sampling);
    gp.max_tokens = 3;
    gp.ignore_eos = 1;
    zs_gen_result gr;
    memset(&gr, 0, sizeof gr);
    CHECK(zs_engine_generate(e, prompt, 4, &gp, NULL, NULL, &gr) == 0 && gr.n_generated == 3, "serving after training: %s", zs_errmsg());
    free(gr.ids);
    free(before);
    free(after);
    zs_lora_free(a);
    zs_engine_free(e);
}

/* (c), (g) */
static void check_ranks(float dropout) {
    zs_engine *e1 = open_engine(base_untied, 1, 1, ZS_F32), *e2 = open_engine(base_untied, 2, 1, ZS_F32);
    if (!e1 || !e2) { CHECK(0, "engines"); zs_engine_free(e1); zs_engine_free(e2); return; }
    zs_lora *a1 = new_adapter(e1, 4, 8.0f, dropout, ZS_LORA_ALL, 5, 0), *a2 = new_adapter(e2, 4, 8.0f, dropout, ZS_LORA_ALL, 5, 0);
    float l1[5], l2[5];
    CHECK(run_steps(e1, a1, 2, 0, 5, 1e-2f, 1.0f, l1, NULL, NULL) == 0, "1 rank");
    CHECK(run_steps(e2, a2, 1, 0, 5, 1e-2f, 1.0f, l2, NULL, NULL) == 0, "2 ranks");
    CHECK(same_adapter(a1, a2), "dropout %g: 2 ranks = 1 rank x 2 micro-steps, bit for bit", (double)dropout);
    CHECK(memcmp(l1, l2, sizeof l1) == 0, "the same losses");
    if (dropout > 0) { /* and the masks matter */
        zs_lora *a3 = new_adapter(e1, 4, 8.0f, 0.0f, ZS_LORA_ALL, 5, 0);
        CHECK(run_steps(e1, a3, 2, 0, 5, 1e-2f, 1.0f, NULL, NULL, NULL) == 0, "no dropout");
        CHECK(!same_adapter(a1, a3), "dropout changes the result");
        zs_lora_free(a3);
    }
    fprintf(stderr, "ranks (dropout %g): losses %.6g .. %.6g\n", (double)dropout, l1[0], l1[4]);
    zs_lora_free(a1);
    zs_lora_free(a2);
    zs_engine_free(e1);
    zs_engine_free(e2);
}

/* (d) */
static void check_q8(void) {
    zs_engine *e = open_engine(base_tied, 1, 1, ZS_Q8_0);
    if (!e) { CHECK(0, "engine"); return; }
    CHECK(zs_model_quant_dtype(zs_engine_model(e)) == ZS_Q8_0, "a q8_0 base");
    zs_lora *a = new_adapter(e, 8, 16.0f, 0.0f, ZS_LORA_ALL, 2, 0);
    float l[20];
    CHECK(run_steps(e, a, 1, 0, 20, 2e-2f, 1.0f, l, NULL, NULL) == 0, "q8_0 steps");
    CHECK(l[19] < 0.9f * l[0] && l[19] < l[9] && l[9] < l[0], "QLoRA: the loss falls %.5g -> %.5g", l[0], l[19]);
    fprintf(stderr, "q8_0: loss %.5g -> %.5g in 20 steps\n", l[0], l[19]);
    zs_lora_free(a);
    zs_engine_free(e);
}

static void corrupt(const char *path, long keep, int flip) {
    FILE *f = fopen(path, "rb");
    char *buf = malloc(1 << 22);
    size_t n = f ? fread(buf, 1, 1 << 22, f) : 0;
    if (f) fclose(f);
    if (flip && n > 200) buf[n - 100] ^= 0x40;
    if (keep >= 0 && (size_t)keep < n) n = (size_t)keep;
    f = fopen(path, "wb");
    if (f) {
        fwrite(buf, 1, n, f);
        fclose(f);
    }
    free(buf);
}

/* (e) */
static void check_resume(void) {
    zs_engine *e1 = open_engine(base_untied, 1, 1, ZS_F32), *e2 = open_engine(base_untied, 2, 1, ZS_F32);
    if (!e1 || !e2) { CHECK(0, "engines"); zs_engine_free(e1); zs_engine_free(e2); return; }
    char ck[4200], cp[4600], cmd[13000];
    snprintf(ck, sizeof ck, "%s/ck", tmp);
    zs_lora *u = new_adapter(e2, 4, 8.0f, 0.1f, ZS_LORA_ALL, 8, 0), *x = new_adapter(e2, 4, 8.0f, 0.1f, ZS_LORA_ALL, 8, 0);
    zs_lora *y = new_adapter(e1, 4, 8.0f, 0.1f, ZS_LORA_ALL, 99, 0);
    CHECK(run_steps(e2, u, 1, 0, 6, 1e-2f, 1.0f, NULL, NULL, NULL) == 0, "uninterrupted");
    CHECK(run_steps(e2, x, 1, 0, 3, 1e-2f, 1.0f, NULL, ck, NULL) == 0, "first half, saved");
    /* the second half: another adapter (other init), 1 rank x 2 micro-steps, from the checkpoint */
    CHECK(run_steps(e1, y, 2, 3, 3, 1e-2f, 1.0f, NULL, NULL, ck) == 0, "second half on 1 rank");
    CHECK(same_adapter(u, y), "resumed with another rank count = uninterrupted, bit for bit");
    snprintf(cp, sizeof cp, "%s/step-000003/adapter_config.json", ck);
    CHECK(access(cp, F_OK) == 0, "a PEFT adapter in the step directory");
    /* a damaged checkpoint is refused, naming the file */
    zs_train_opts o = topts(1, 1, 1e-2f, 1.0f);
    zs_lora_training *t = NULL;
    CHECK(zs_lora_training_begin(zs_engine_world(e1), y, &o, 1, &t) == 0, "begin");
    long st;
    const char *files[3] = {"optimizer.safetensors", "adapter_model.safetensors", "state.json"};
    for (int i = 0; i < 3 && t; i++)
        for (int mode = 0; mode < 2; mode++) {
            char bad[4300];
            snprintf(bad, sizeof bad, "%s/bad", tmp);
            snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s/step-000003' '%s'", bad, ck, bad);
            if (system(cmd) != 0) continue;
            snprintf(cp, sizeof cp, "%s/%s", bad, files[i]);
            corrupt(cp, mode == 0 ? 150 : -1, mode == 1);
            int rc = zs_lora_training_load(t, bad, &st, NULL);
            CHECK_ERR(rc, files[i]);
        }
    char none[4400];
    snprintf(none, sizeof none, "%s/none", tmp);
    CHECK(zs_lora_training_load(t, none, &st, NULL) == ZS_ENOTFOUND, "no checkpoint: ZS_ENOTFOUND");
    zs_lora_training_end(t);
    zs_lora_free(u);
    zs_lora_free(x);
    zs_lora_free(y);
    zs_engine_free(e1);
    zs_engine_free(e2);
}

int main(void) {
    if (tu_tmpdir(tmp, sizeof tmp, "lora-train") != 0) return 1;
    snprintf(base_untied, sizeof base_untied, "%s/untied", tmp);
    snprintf(base_tied, sizeof base_tied, "%s/tied", tmp);
    if (make_base(base_untied, 0) < 0 || make_base(base_tied, 1) < 0) return 1;
    /* a small repetitive corpus: 4 sequences of a cycle of 5 tokens, shifted */
    for (int s = 0; s < 4; s++)
        for (int i = 0; i < TT; i++) {
            tok[s][i] = 10 + (i + s) % 5;
            tgt[s][i] = i < 2 && s == 1 ? -1 : 10 + (i + s + 1) % 5;
        }
    check_fd();
    check_frozen(base_untied, 0);
    check_frozen(base_tied, 1);
    check_ranks(0.0f);
    check_ranks(0.1f);
    check_q8();
    check_resume();
    tu_rmdir(tmp);
    return tu_finish("test-lora-train");
}
