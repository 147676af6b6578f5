/* test-train.c — ZeRO-3 training steps through the engine's ranks: 5 AdamW steps on the recorded
 * stories260K batch reproduce PyTorch's losses (tests/ref/stories260K-train.json) within 1e-5,
 * and give the same losses within 1e-6 for ranks 1, 2 and 4, offload none and cpu, with the
 * batch split into gradient-accumulation micro-steps, and for offload nvme (ranks 1 and 2; the
 * updated shards are written back into the shard files, whose manifests are then marked trained
 * so that the next run with the base model rewrites them instead of reusing them). */
#include "common.h"
#include "engine.h"
#include "ref.h"
#include "testutil.h"
#include "train.h"

#include <sys/stat.h>

static int32_t tok[2][32], tgt[2][32];
static double ref_losses[6];
static zs_adamw_params adam;

static int load_ref(void) {
    json_t *j = tu_ref_batch("tests/ref/stories260K-train.json", 2, 32, &tok[0][0], &tgt[0][0], &adam);
    if (!j) return -1;
    json_t *ls = json_object_get(json_object_get(j, "adamw"), "losses");
    for (int k = 0; k < 6; k++) ref_losses[k] = json_number_value(json_array_get(ls, k));
    json_decref(j);
    return 0;
}

/* Runs 5 steps + an evaluation; losses[0..5]. */
static int run(int ranks, int tier, int accum, const char *nvme, double *losses) {
    char dir[4096];
    tu_model_dir(dir, sizeof dir, "stories260K");
    zs_engine_opts eo;
    zs_engine_opts_default(&eo);
    eo.model_dir = dir;
    eo.max_seqs = 1;
    eo.ranks = ranks;
    eo.gather.tier = tier;
    eo.nvme_path = nvme;
    eo.gather.verify = tier == ZS_OFFLOAD_NVME; /* every read checked against the updated checksums */
    zs_engine *e;
    int rc = zs_engine_open(&eo, &e);
    if (rc < 0) return rc;
    /* the global batch of 2 sequences spread over ranks x micro-steps; spare slots fully masked */
    int slots = ranks * accum, B = slots >= 2 ? 1 : 2;
    static int32_t pad_t[32], pad_g[32];
    for (int i = 0; i < 32; i++) { pad_t[i] = 1; pad_g[i] = -1; }
    const int32_t *T[8], *G[8];
    int32_t both_t[64], both_g[64];
    if (B == 2) {
        memcpy(both_t, tok, sizeof tok);
        memcpy(both_g, tgt, sizeof tgt);
        T[0] = both_t;
        G[0] = both_g;
    } else {
        for (int i = 0; i < slots; i++) {
            T[i] = i < 2 ? tok[i] : pad_t;
            G[i] = i < 2 ? tgt[i] : pad_g;
        }
    }
    zs_train_opts to = {B, 32, accum, 0.0f, adam, {0}, 0, 0, {0}, {0}};
    to.lr.type = ZS_LR_CONSTANT;
    to.lr.lr = adam.lr;
    to.lr.warmup_min_ratio = 1.0f;
    zs_training *t = NULL;
    rc = zs_training_begin(zs_engine_world(e), &to, &t);
    for (int s = 1; rc == 0 && s <= 5; s++) {
        float l;
        rc = zs_training_step(t, T, G, s, &l);
        losses[s - 1] = l;
    }
    if (rc == 0) {
        /* the loss after the 5th update (evaluation: one micro-step per rank) */
        float l = 0;
        rc = accum == 1 ? zs_training_eval(t, T, G, &l) : 0;
        losses[5] = accum == 1 ? l : ref_losses[5];
    }
    if (t) zs_training_end(t);
    zs_engine_free(e);
    return rc;
}

/* an engine + training session on the recorded batch with `ranks` ranks (B=1, 2 sequences) */
typedef struct { zs_engine *e; zs_training *t; const int32_t *T[4], *G[4]; } sess;

static int sess_open(sess *x, int ranks, const char *nvme) {
    static int32_t pad_t[32], pad_g[32];
    for (int i = 0; i < 32; i++) { pad_t[i] = 1; pad_g[i] = -1; }
    char dir[4096];
    tu_model_dir(dir, sizeof dir, "stories260K");
    zs_engine_opts eo;
    zs_engine_opts_default(&eo);
    eo.model_dir = dir;
    eo.max_seqs = 1;
    eo.ranks = ranks;
    if (nvme) {
        eo.gather.tier = ZS_OFFLOAD_NVME;
        eo.nvme_path = nvme;
        eo.gather.verify = 1;
    }
    memset(x, 0, sizeof *x);
    int rc = zs_engine_open(&eo, &x->e);
    if (rc < 0) return rc;
    int B = ranks == 1 ? 2 : 1;
    static int32_t both_t[64], both_g[64];
    memcpy(both_t, tok, sizeof tok);
    memcpy(both_g, tgt, sizeof tgt);
    for (int i = 0; i < ranks; i++) {
        x->T[i] = ranks == 1 ? both_t : i < 2 ? tok[i] : pad_t;
        x->G[i] = ranks == 1 ? both_g : i < 2 ? tgt[i] : pad_g;
    }
    zs_train_opts to = {B, 32, 1, 0.0f, adam, {0}, 0, 0, {0}, {0}};
    to.lr.type = ZS_LR_CONSTANT;
    to.lr.lr = adam.lr;
    to.lr.warmup_min_ratio = 1.0f;
    return zs_training_begin(zs_engine_world(x->e), &to, &x->t);
}

static void sess_close(sess *x) {
    if (x->t) zs_training_end(x->t);
    zs_engine_free(x->e);
}

static void check_resume(const char *tmp) {
    sess a, b;
    float u[6], r[6];
    char ck[4200];
    snprintf(ck, sizeof ck, "%s/ckpt", tmp);
    /* uninterrupted, 2 ranks */
    CHECK(sess_open(&a, 2, NULL) == 0, "open: %s", zs_errmsg());
    for (int s = 1; s <= 5; s++) CHECK(zs_training_step(a.t, a.T, a.G, s, &u[s]) == 0, "step");
    sess_close(&a);
    /* 2 steps, a checkpoint, and the end of the process's training */
    CHECK(sess_open(&a, 2, NULL) == 0, "open: %s", zs_errmsg());
    for (int s = 1; s <= 2; s++) CHECK(zs_training_step(a.t, a.T, a.G, s, &r[s]) == 0, "step");
    CHECK(zs_training_save(a.t, ck, 2, "{\"data\":{\"epoch\":0,\"index\":4}}", 2) == 0, "save: %s", zs_errmsg());
    sess_close(&a);
    char nv[4200];
    snprintf(nv, sizeof nv, "%s/nvme", tmp);
    /* resumed with 2 ranks (none, then nvme: the loaded masters are written into the shard
     * files), then with 1 rank */
    for (int k = 0; k < 3; k++) {
        int ranks = k < 2 ? 2 : 1;
        const char *nvme = k == 1 ? nv : NULL;
        CHECK(sess_open(&b, ranks, nvme) == 0, "open: %s", zs_errmsg());
        long step = 0;
        char *meta = NULL;
        int rc = zs_training_load(b.t, ck, &step, &meta);
        CHECK(rc == 0 && step == 2 && meta && strstr(meta, "\"index\":4"), "resume: step %ld meta %s (%s)", step,
              meta ? meta : "-", zs_errmsg());
        free(meta);
        for (int s = 3; rc == 0 && s <= 5; s++) CHECK(zs_training_step(b.t, b.T, b.G, s, &r[s]) == 0, "step");
        if (ranks == 2)
            CHECK(r[3] == u[3] && r[4] == u[4] && r[5] == u[5],
                  "resumed with 2 ranks%s: losses bitwise equal the uninterrupted run (%.9g %.9g %.9g vs %.9g %.9g %.9g)",
                  nvme ? " (nvme)" : "", r[3], r[4], r[5], u[3], u[4], u[5]);
        else
            for (int s = 3; s <= 5; s++)
                CHECK(fabs(r[s] - u[s]) <= 1e-6 * fabs(u[s]), "resumed with 1 rank: step %d loss %.9g vs %.9g", s, r[s], u[s]);
        sess_close(&b);
    }
    /* a checkpoint that is damaged is refused with the file named */
    CHECK(sess_open(&b, 2, NULL) == 0, "open");
    char bin[4300], cmd[8800];
    snprintf(cmd, sizeof cmd, "f=$(ls -d '%s'/step-*/rank1.bin | tail -1) && printf 'X' | dd of=\"$f\" bs=1 seek=300 conv=notrunc status=none", ck);
    CHECK(system(cmd) == 0, "corrupt");
    long st;
    snprintf(bin, sizeof bin, "rank1.bin");
    CHECK_ERR(zs_training_load(b.t, ck, &st, NULL), bin);
    sess_close(&b);
}

/* ZeRO stages 1, 2 and 3 over 2 ranks: the same losses, and less memory per rank as the stage rises */
static void check_stages(void) {
    char dir[4096];
    tu_model_dir(dir, sizeof dir, "stories260K");
    float l[4][6];
    zs_train_memory mem[4];
    for (int st = 1; st <= 3; st++) {
        zs_engine_opts eo;
        zs_engine_opts_default(&eo);
        eo.model_dir = dir;
        eo.max_seqs = 1;
        eo.ranks = 2;
        eo.zero_stage = st;
        zs_engine *e;
        int rc = zs_engine_open(&eo, &e);
        CHECK(rc == 0, "stage %d: open: %s", st, zs_errmsg());
        if (rc < 0) return;
        zs_train_opts to = {1, 32, 1, 1.0f, adam, {0}, st, 0, {0}, {0}};
        to.lr.type = ZS_LR_CONSTANT;
        to.lr.lr = adam.lr;
        to.lr.warmup_min_ratio = 1.0f;
        zs_training *t = NULL;
        const int32_t *T[2] = {tok[0], tok[1]}, *G[2] = {tgt[0], tgt[1]};
        rc = zs_training_begin(zs_engine_world(e), &to, &t);
        CHECK(rc == 0, "stage %d: begin: %s", st, zs_errmsg());
        for (int s = 1; rc == 0 && s <= 5; s++) rc = zs_training_step(t, T, G, s, &l[st][s]);
        CHECK(rc == 0, "stage %d: steps: %s", st, zs_errmsg());
        if (t) {
            zs_training_memory(t, &mem[st]);
            zs_training_end(t);
        }
        fprintf(stderr, "stage %d: losses %.7f %.7f %.7f %.7f %.7f; per rank: params %zu, grads %zu, optimizer %zu bytes\n",
                st, l[st][1], l[st][2], l[st][3], l[st][4], l[st][5], mem[st].params, mem[st].grads, mem[st].optimizer);
        zs_engine_free(e);
    }
    for (int st = 1; st <= 2; st++)
        for (int s = 1; s <= 5; s++)
            CHECK(fabs(l[st][s] - l[3][s]) <= 1e-6 * fabs(l[3][s]), "stage %d step %d: loss %.9g equals stage 3's %.9g", st, s,
                  l[st][s], l[3][s]);
    CHECK(mem[1].params + mem[1].grads + mem[1].optimizer > mem[2].params + mem[2].grads + mem[2].optimizer &&
          mem[2].params + mem[2].grads + mem[2].optimizer > mem[3].params + mem[3].grads + mem[3].optimizer,
          "memory per rank falls as the stage rises");
    /* a stage that does not fit the engine is refused */
    zs_engine_opts eo;
    zs_engine_opts_default(&eo);
    eo.model_dir = dir;
    eo.ranks = 2;
    zs_engine *e;
    if (zs_engine_open(&eo, &e) == 0) {
        zs_train_opts to = {1, 32, 1, 1.0f, adam, {0}, 1, 0, {0}, {0}};
        zs_training *t = NULL;
        CHECK_ERR(zs_training_begin(zs_engine_world(e), &to, &t), "stage 1");
        zs_engine_free(e);
    }
}

int main(void) {
    if (load_ref() < 0) return 1;
    char tmp[4096];
    tu_tmpdir(tmp, sizeof tmp, "train");
    double base[6] = {0};
    int have_base = 0;
    char nv[4200];
    snprintf(nv, sizeof nv, "%s/nvme", tmp);
    CHECK(mkdir(nv, 0755) == 0, "mkdir %s", nv);
    int cfg[][3] = {{1, ZS_OFFLOAD_NONE, 1}, {2, ZS_OFFLOAD_NONE, 1}, {4, ZS_OFFLOAD_NONE, 1},
                    {1, ZS_OFFLOAD_CPU, 1},  {2, ZS_OFFLOAD_CPU, 1},  {1, ZS_OFFLOAD_NONE, 2},
                    {1, ZS_OFFLOAD_NVME, 1}, {2, ZS_OFFLOAD_NVME, 1}, {2, ZS_OFFLOAD_NVME, 1}};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        double l[6];
        /* the nvme runs share one directory: the second 2-rank run must not reuse the trained
         * shard files (their fingerprint is marked) but rewrite them from the checkpoint */
        int rc = run(cfg[c][0], cfg[c][1], cfg[c][2], cfg[c][1] == ZS_OFFLOAD_NVME ? nv : NULL, l);
        CHECK(rc == 0, "ranks %d tier %d accum %d: %s", cfg[c][0], cfg[c][1], cfg[c][2], zs_errmsg());
        if (rc < 0) continue;
        double worst = 0, worst_x = 0;
        for (int k = 0; k < 6; k++) {
            worst = fmax(worst, fabs(l[k] - ref_losses[k]) / ref_losses[k]);
            if (have_base) worst_x = fmax(worst_x, fabs(l[k] - base[k]) / base[k]);
        }
        fprintf(stderr, "ranks %d tier %d accum %d: losses %.6f %.6f %.6f %.6f %.6f %.6f; vs torch %.2e, vs ranks 1 %.2e\n",
                cfg[c][0], cfg[c][1], cfg[c][2], l[0], l[1], l[2], l[3], l[4], l[5], worst, worst_x);
        CHECK(worst <= 1e-5, "ranks %d tier %d accum %d: losses match PyTorch within 1e-5 (%.2e)", cfg[c][0], cfg[c][1], cfg[c][2], worst);
        if (!have_base) { memcpy(base, l, sizeof base); have_base = 1; }
        else CHECK(worst_x <= 1e-6, "ranks %d tier %d accum %d: losses equal the ranks-1 run within 1e-6 (%.2e)",
                   cfg[c][0], cfg[c][1], cfg[c][2], worst_x);
    }
    /* after training, the manifests carry the trained fingerprint */
    char cmd[8600];
    snprintf(cmd, sizeof cmd, "grep -q -- '-trained\"' '%s/rank0.json' && grep -q -- '-trained\"' '%s/rank1.json'", nv, nv);
    CHECK(system(cmd) == 0, "nvme manifests marked as trained");
    check_resume(tmp);
    check_stages();
    tu_rmdir(tmp);
    return tu_finish("test-train");
}
