/* test-moe-zero.c — mixtures of experts through the ZeRO-3 coordinator (gather.h, "Experts"):
 * random Qwen3-MoE and Qwen2-MoE models (init-model) run with 1, 2 and 3 ranks and offload
 * none / cpu / nvme, each rank with its OWN sequence in the same step (so the ranks route to
 * different experts and must agree on the union), give logits bitwise equal to one resident rank
 * running each sequence alone; the same under an expert cache of one or two experts (every
 * eviction rule taken), with speculation off, and with the whole-block baseline; the counters add
 * up (hits + misses = agreed experts, gathered <= whole block); a corrupt expert shard is rewritten
 * from the checkpoint and the answer is unchanged; and with 128 experts and top-8 at batch 1, the
 * bytes streamed per decode step stay within 1.3 x (the non-expert buckets + 8 experts per layer). */
#include <sys/stat.h>

#include "common.h"
#include "device.h"
#include "engine.h"
#include "gather.h"
#include "init-model.h"
#include "testutil.h"

static int make_model(const char *arch, const char *dir, int n_exp, int top_k, int moe_ffn, int layers) {
    zs_init_opts io;
    int rc = zs_init_opts_default(arch, &io);
    if (rc < 0) return rc;
    zs_model_config *c = &io.cfg;
    c->n_layers = layers;
    c->dim = 64;
    c->n_heads = 4;
    c->n_kv_heads = 2;
    c->head_dim = 16;
    c->vocab_size = 300;
    c->max_seq = 128;
    c->n_experts = n_exp;
    c->n_experts_used = top_k;
    c->moe_ffn_dim = moe_ffn;
    c->ffn_dim = 96;
    if (c->shared_ffn_dim) c->shared_ffn_dim = 48;
    io.seed = 77;
    io.random_norms = 1;
    if ((rc = zs_config_override(c, "{}", "test-moe-zero")) < 0) return rc;
    return zs_init_model_write(&io, dir);
}

typedef struct {
    int ranks, tier;
    size_t xcache;
    int all, nospec;
} run_cfg;

static const char *tier_name[] = {"none", "cpu", "nvme"};

static int open_engine(const char *dir, const run_cfg *r, const char *nvme, zs_engine **e) {
    zs_engine_opts o;
    zs_engine_opts_default(&o);
    o.model_dir = dir;
    o.max_seqs = 2;
    o.ranks = r->ranks;
    o.gather.tier = r->tier;
    o.nvme_path = nvme;
    o.gather.expert_cache_bytes = r->xcache;
    o.gather.expert_gather_all = r->all;
    o.gather.expert_no_speculate = r->nospec;
    o.device = ZS_DEVICE_CPU;
    return zs_engine_open(&o, e);
}

#define NS 3   /* distinct sequences */
#define NP 12  /* prompt tokens */
#define ND 6   /* decode steps */
#define MAXR 3

static void seq_tokens(int s, int32_t *t, int n, int vocab) {
    for (int i = 0; i < n; i++) t[i] = (int32_t)((i * 37 + s * 101 + 7) % vocab);
}

/* Runs every rank's own sequence (rank r: sequence r % NS) through a prefill of NP tokens and ND
 * decode steps in the same world steps; out[r] gets the logits of each step's last row
 * ((1 + ND) x vocab). */
static int run_world(zs_engine *e, int ranks, float **out) {
    zs_world *w = zs_engine_world(e);
    int V = zs_model_config_get(zs_engine_model(e))->vocab_size, rc = 0;
    int seq[MAXR];
    int32_t tok[MAXR][NP + ND], pos[MAXR][NP], sq[MAXR][NP], li[MAXR][NP];
    zs_batch bs[MAXR];
    float *lg[MAXR];
    for (int r = 0; r < ranks; r++) {
        zs_kvcache *kv = zs_world_kv(w, r);
        if ((rc = zs_kv_seq_open(kv, &seq[r])) < 0) return rc;
        if ((rc = zs_kv_seq_reserve(kv, seq[r], NP + ND)) < 0) return rc;
        seq_tokens(r % NS, tok[r], NP + ND, V);
    }
    for (int step = 0; step <= ND && rc == 0; step++) {
        for (int r = 0; r < ranks; r++) {
            int n = step == 0 ? NP : 1, p0 = step == 0 ? 0 : NP + step - 1;
            for (int i = 0; i < n; i++) {
                pos[r][i] = p0 + i;
                sq[r][i] = seq[r];
                li[r][i] = i == n - 1 ? 0 : -1;
            }
            bs[r] = (zs_batch){n, tok[r] + p0, pos[r], sq[r], li[r], 1, NULL, NULL, NULL};
            lg[r] = out[r] + (size_t)step * (size_t)V;
        }
        rc = zs_world_step(w, bs, lg);
    }
    for (int r = 0; r < ranks; r++) zs_kv_seq_close(zs_world_kv(w, r), seq[r]);
    return rc;
}

/* The reference: each sequence alone on one resident rank. */
static int reference(const char *dir, float **ref, int *vocab) {
    run_cfg rc1 = {1, 0, 0, 0, 0};
    zs_engine *e;
    int rc = open_engine(dir, &rc1, NULL, &e);
    if (rc < 0) return rc;
    *vocab = zs_model_config_get(zs_engine_model(e))->vocab_size;
    for (int s = 0; s < NS && rc == 0; s++) {
        /* sequence s on rank 0 of a one-rank world: run_world with ranks 1 runs sequence 0, so
         * shift the token pattern by running it as "rank s" through a one-element world */
        zs_world *w = zs_engine_world(e);
        zs_kvcache *kv = zs_world_kv(w, 0);
        int seq;
        int32_t tok[NP + ND], pos[NP], sq[NP], li[NP];
        if ((rc = zs_kv_seq_open(kv, &seq)) < 0) break;
        zs_kv_seq_reserve(kv, seq, NP + ND);
        seq_tokens(s, tok, NP + ND, *vocab);
        for (int step = 0; step <= ND && rc == 0; step++) {
            int n = step == 0 ? NP : 1, p0 = step == 0 ? 0 : NP + step - 1;
            for (int i = 0; i < n; i++) {
                pos[i] = p0 + i;
                sq[i] = seq;
                li[i] = i == n - 1 ? 0 : -1;
            }
            zs_batch b = {n, tok + p0, pos, sq, li, 1, NULL, NULL, NULL};
            rc = zs_engine_forward(e, &b, ref[s] + (size_t)step * (size_t)*vocab);
        }
        zs_kv_seq_close(kv, seq);
    }
    zs_engine_free(e);
    return rc;
}

static void check_config(const char *name, const char *dir, const char *nvme, float **ref, int V, const run_cfg *r) {
    zs_engine *e;
    char tag[160];
    snprintf(tag, sizeof tag, "%s ranks %d %s cache %zu%s%s", name, r->ranks, tier_name[r->tier], r->xcache,
             r->all ? " gather-all" : "", r->nospec ? " no-spec" : "");
    int rc = open_engine(dir, r, nvme, &e);
    CHECK(rc == 0, "%s: open: %s", tag, zs_errmsg());
    if (rc < 0) return;
    size_t n = (size_t)(1 + ND) * (size_t)V;
    float *out[MAXR];
    for (int i = 0; i < r->ranks; i++) out[i] = calloc(n, sizeof(float));
    for (int pass = 0; pass < 2 && rc == 0; pass++) { /* the second time over a warm cache */
        rc = run_world(e, r->ranks, out);
        CHECK(rc == 0, "%s: run: %s", tag, zs_errmsg());
        for (int i = 0; i < r->ranks && rc == 0; i++)
            CHECK(!memcmp(out[i], ref[i % NS], n * sizeof(float)),
                  "%s (pass %d): rank %d's sequence's logits bitwise those of one resident rank", tag, pass, i);
    }
    zs_gather_stats st;
    zs_world_stats(zs_engine_world(e), &st);
    fprintf(stderr, "%s: layer passes %ld, selected %ld, hits %ld, misses %ld, spec %ld/%ld, experts %.3f MB of %.3f "
            "MB whole-block, cache %zu/%zu\n", tag, st.expert_layers, st.expert_selected, st.expert_hits,
            st.expert_misses, st.expert_spec_used, st.expert_spec, st.expert_bytes / 1e6, st.expert_block_bytes / 1e6,
            st.expert_cache_used, st.expert_cache_limit);
    CHECK(st.expert_layers > 0 && st.expert_selected > 0, "%s: the experts were agreed on", tag);
    int moving = r->ranks > 1 || r->tier == ZS_OFFLOAD_NVME;
    if (moving) {
        CHECK(st.expert_hits + st.expert_misses == st.expert_selected,
              "%s: hits + misses = agreed experts (%ld + %ld vs %ld)", tag, st.expert_hits, st.expert_misses,
              st.expert_selected);
        CHECK(st.expert_cache_used <= st.expert_cache_limit, "%s: the cache within its bound", tag);
        if (r->all)
            CHECK(st.expert_hits == 0 && st.expert_bytes == st.expert_block_bytes,
                  "%s: the baseline gathers every expert of every layer, every pass", tag);
        else
            CHECK(st.expert_bytes < st.expert_block_bytes, "%s: fewer expert bytes than a whole-block gather", tag);
        if (!r->all && r->xcache == 0)
            CHECK(st.expert_hits > 0, "%s: the cache hits over the second run", tag);
    }
    for (int i = 0; i < r->ranks; i++) free(out[i]);
    zs_engine_free(e);
}

static void check_arch(const char *arch) {
    char dir[4096], nvme[4096];
    tu_tmpdir(dir, sizeof dir, "moe-model");
    tu_tmpdir(nvme, sizeof nvme, "moe-nvme");
    int rc = make_model(arch, dir, 16, 4, 32, 3);
    CHECK(rc == 0, "%s: init-model: %s", arch, zs_errmsg());
    if (rc < 0) return;
    float *ref[NS];
    int V = 0;
    for (int s = 0; s < NS; s++) ref[s] = calloc((size_t)(1 + ND) * 300, sizeof(float));
    rc = reference(dir, ref, &V);
    CHECK(rc == 0, "%s: reference: %s", arch, zs_errmsg());
    if (rc == 0) {
        zs_model *m;
        zs_model_opts mo;
        zs_model_opts_default(&mo);
        mo.embed_lookup = 1;
        size_t one = 0;
        if (zs_model_open(dir, &mo, &m) == 0) {
            one = zs_model_expert_bytes(m);
            zs_model_free(m);
        }
        for (int ranks = 1; ranks <= 3; ranks++)
            for (int tier = 0; tier < 3; tier++) {
                run_cfg r = {ranks, tier, 0, 0, 0};
                check_config(arch, dir, nvme, ref, V, &r);
            }
        /* a cache of one expert (rank 1 nvme) and of two (ranks 2): every eviction rule */
        run_cfg small1 = {1, ZS_OFFLOAD_NVME, one, 0, 0}, small2 = {2, ZS_OFFLOAD_CPU, 2 * one, 0, 0};
        run_cfg nospec = {2, ZS_OFFLOAD_NVME, 3 * one, 0, 1}, all = {2, ZS_OFFLOAD_NVME, 0, 1, 0};
        check_config(arch, dir, nvme, ref, V, &small1);
        check_config(arch, dir, nvme, ref, V, &small2);
        check_config(arch, dir, nvme, ref, V, &nospec);
        check_config(arch, dir, nvme, ref, V, &all);
        /* a cache smaller than one expert is refused by name */
        zs_engine *e;
        run_cfg tiny = {2, ZS_OFFLOAD_CPU, one / 2, 0, 0};
        rc = open_engine(dir, &tiny, nvme, &e);
        CHECK(rc < 0 && strstr(zs_errmsg(), "smaller than one expert"), "%s: a cache under one expert is refused (%s)",
              arch, rc < 0 ? zs_errmsg() : "opened");
        if (rc == 0) zs_engine_free(e);
    }
    for (int s = 0; s < NS; s++) free(ref[s]);
    tu_rmdir(nvme);
    tu_rmdir(dir);
}

/* A flipped byte in an expert's shard: found by its checksum (verify on), rewritten from the
 * checkpoint, the same logits. */
static void check_repair(void) {
    char dir[4096], nvme[4096], path[4200];
    tu_tmpdir(dir, sizeof dir, "moe-rep");
    tu_tmpdir(nvme, sizeof nvme, "moe-rep-nvme");
    if (make_model("qwen3moe", dir, 16, 4, 32, 2) < 0) {
        CHECK(0, "repair: init-model: %s", zs_errmsg());
        return;
    }
    float *ref[NS];
    int V = 0;
    for (int s = 0; s < NS; s++) ref[s] = calloc((size_t)(1 + ND) * 300, sizeof(float));
    CHECK(reference(dir, ref, &V) == 0, "repair: reference: %s", zs_errmsg());
    zs_engine_opts o;
    zs_engine_opts_default(&o);
    o.model_dir = dir;
    o.max_seqs = 2;
    o.ranks = 1;
    o.gather.tier = ZS_OFFLOAD_NVME;
    o.nvme_path = nvme;
    o.gather.verify = 1;
    o.device = ZS_DEVICE_CPU;
    { /* a cache of one expert: every plan reads its experts again */
        zs_model *m;
        zs_model_opts mo;
        zs_model_opts_default(&mo);
        if (zs_model_open(dir, &mo, &m) == 0) {
            o.gather.expert_cache_bytes = zs_model_expert_bytes(m);
            zs_model_free(m);
        }
    }
    zs_engine *e;
    int rc = zs_engine_open(&o, &e);
    CHECK(rc == 0, "repair: open: %s", zs_errmsg());
    if (rc == 0) {
        float *out[1] = {calloc((size_t)(1 + ND) * (size_t)V, sizeof(float))};
        CHECK(run_world(e, 1, out) == 0, "repair: a first run: %s", zs_errmsg());
        /* a byte of every expert shard of layer 0 flipped (whichever the sequence routes to),
         * at the offsets of the manifest */
        zs_model *m;
        zs_model_opts mo;
        zs_model_opts_default(&mo);
        mo.embed_lookup = 1;
        snprintf(path, sizeof path, "%s/rank0.json", nvme);
        json_t *man = json_load_file(path, 0, NULL), *sh = json_object_get(man, "shards");
        snprintf(path, sizeof path, "%s/rank0.shards", nvme);
        FILE *f = fopen(path, "r+b");
        int flipped = 0;
        if (f && sh && zs_model_open(dir, &mo, &m) == 0) {
            for (int x = 0; x < 16; x++) {
                json_t *js = json_array_get(sh, (size_t)zs_bucket_expert(m, 0, x));
                long off = (long)json_integer_value(json_object_get(js, "offset")) + 100;
                fseek(f, off, SEEK_SET);
                int c = fgetc(f);
                fseek(f, off, SEEK_SET);
                flipped += c != EOF && fputc(c ^ 0x5a, f) != EOF;
            }
            zs_model_free(m);
        }
        if (f) fclose(f);
        json_decref(man);
        CHECK(flipped == 16, "repair: 16 expert shards corrupted (%d)", flipped);
        /* the step that reads a corrupt shard fails on checksum; the next reads the rewritten one */
        rc = run_world(e, 1, out);
        CHECK(rc < 0 && strstr(zs_errmsg(), "checksum"), "repair: the corrupt expert fails its step naming the "
              "checksum (%s)", rc < 0 ? zs_errmsg() : "no error");
        int tries = 0;
        while ((rc = run_world(e, 1, out)) < 0 && ++tries < 20) {}
        CHECK(rc == 0, "repair: a run after the repairs succeeds: %s", zs_errmsg());
        zs_gather_stats st;
        zs_world_stats(zs_engine_world(e), &st);
        CHECK(st.repairs >= 1 && st.read_errors >= 1, "repair: the corrupt expert shards were found and rewritten "
              "(%ld repairs, %ld read errors)", st.repairs, st.read_errors);
        CHECK(rc == 0 && !memcmp(out[0], ref[0], (size_t)(1 + ND) * (size_t)V * sizeof(float)),
              "repair: the same logits after the repair");
        free(out[0]);
        zs_engine_free(e);
    }
    for (int s = 0; s < NS; s++) free(ref[s]);
    tu_rmdir(nvme);
    tu_rmdir(dir);
}

/* 128 experts, top-8, batch 1: bytes per decode step within 1.3 x (non-expert buckets + 8 experts
 * per MoE layer), against the whole-block baseline's 128. */
static void check_bound(void) {
    char dir[4096], nvme[4096];
    tu_tmpdir(dir, sizeof dir, "moe-128");
    tu_tmpdir(nvme, sizeof nvme, "moe-128-nvme");
    int L = 2, rc = make_model("qwen3moe", dir, 128, 8, 32, L);
    CHECK(rc == 0, "bound: init-model: %s", zs_errmsg());
    if (rc < 0) return;
    zs_model *m;
    zs_model_opts mo;
    zs_model_opts_default(&mo);
    mo.embed_lookup = 1;
    if (zs_model_open(dir, &mo, &m) < 0) {
        CHECK(0, "bound: open: %s", zs_errmsg());
        return;
    }
    int order[64], n = zs_model_pass_order(m, order);
    size_t stat = 0, one = zs_partition_shard_bytes(m, zs_bucket_expert(m, 0, 0), 1);
    for (int i = 0; i < n; i++)
        if (order[i] >= 0) stat += zs_partition_shard_bytes(m, order[i], 1);
    zs_model_free(m);
    double bound = 1.3 * ((double)stat + (double)L * 8.0 * (double)one);
    for (int all = 0; all < 2; all++) {
        run_cfg r = {1, ZS_OFFLOAD_NVME, all ? 0 : 8 * one, all, 0};
        zs_engine *e;
        if ((rc = open_engine(dir, &r, nvme, &e)) < 0) {
            CHECK(0, "bound: open: %s", zs_errmsg());
            break;
        }
        zs_kvcache *kv = zs_engine_kv(e);
        int seq, V = zs_model_config_get(zs_engine_model(e))->vocab_size;
        float *lg = malloc((size_t)V * sizeof(float));
        zs_kv_seq_open(kv, &seq);
        zs_kv_seq_reserve(kv, seq, 64);
        int32_t t = 5, p = 0, q = seq, li = 0;
        zs_batch b = {1, &t, &p, &q, &li, 1, NULL, NULL, NULL};
        zs_engine_forward(e, &b, lg); /* warm: the first pass */
        zs_gather_stats a, z;
        zs_world_stats(zs_engine_world(e), &a);
        int steps = 32;
        for (p = 1; p <= steps && rc == 0; p++) {
            t = (int32_t)((p * 53 + 11) % V);
            rc = zs_engine_forward(e, &b, lg);
        }
        zs_world_stats(zs_engine_world(e), &z);
        double per = (double)(z.bytes_gathered - a.bytes_gathered) / steps;
        fprintf(stderr, "bound: %s: %.0f bytes per decode step; non-expert %zu + 8 experts x %d layers %zu: bound %.0f; "
                "whole block %.0f\n", all ? "gather-all" : "routed", per, stat, L, (size_t)L * 8 * one, bound,
                (double)stat + (double)L * 128 * one);
        if (!all) CHECK(rc == 0 && per <= bound, "bound: routed bytes per decode step %.0f <= %.0f", per, bound);
        else CHECK(rc == 0 && per > 4 * bound, "bound: the whole-block baseline moves far more (%.0f)", per);
        free(lg);
        zs_kv_seq_close(kv, seq);
        zs_engine_free(e);
    }
    tu_rmdir(nvme);
    tu_rmdir(dir);
}

int main(void) {
    zs_log_set_level(ZS_LOG_WARN);
    check_arch("qwen3moe");
    check_arch("qwen2moe");
    check_repair();
    check_bound();
    return tu_finish("test-moe-zero");
}
