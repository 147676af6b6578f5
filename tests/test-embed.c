/* test-embed.c — the embedding lookup tables of inference engines (model.h, embed_lookup): an
 * untied model's token table (and GPT-2's position table) lives in host memory, so a decode step
 * gathers the layer and head buckets only, and nothing of the table is in any tier; a tied model
 * gathers its embedding bucket once per pass (for the head), not twice. For ranks 1-3 and offload
 * none/cpu/nvme, f32/f16/bf16 weights, Llama and GPT-2, tied and untied, the logits are bitwise
 * those of the sharded (training) layout on one resident rank, and the fixtures still give their
 * reference ids. The host rows are bit for bit the packed bucket's; the fingerprint (shard files,
 * the world check) tells the two layouts apart, so neither reuses the other's shard files; and
 * training refuses an engine opened for inference. Where a CUDA device is visible the same runs
 * on it compare each lookup engine with the sharded layout of the same ranks and tier (the rows
 * are staged on the host and copied per step, the tables never uploaded whole). */
#include "backend.h"
#include "common.h"
#include "device.h"
#include "engine.h"
#include "init-model.h"
#include "train.h"
#include "testutil.h"

static const char *tier_name[] = {"none", "cpu", "nvme"};
static int g_device = ZS_DEVICE_CPU; /* the device of every engine the checks open */

static int make_model(const char *dir, const char *arch, int tied, zs_dtype dt) {
    zs_init_opts io;
    ZS_CHECK(zs_init_opts_default(arch, &io));
    zs_model_config *c = &io.cfg;
    int gpt2 = c->arch == ZS_ARCH_GPT2;
    c->n_layers = 2;
    c->dim = 64;
    c->n_heads = 4;
    c->n_kv_heads = gpt2 ? 4 : 2;
    c->head_dim = 16;
    c->ffn_dim = gpt2 ? 128 : 96;
    c->vocab_size = 300;
    c->max_seq = 64;
    c->tied_embeddings = tied;
    c->dtype = dt;
    io.seed = 11;
    return zs_init_model_write(&io, dir);
}

static int open_engine(const char *dir, int lookup, int ranks, int tier, const char *nvme, zs_dtype wdt,
                       zs_engine **e) {
    zs_engine_opts o;
    zs_engine_opts_default(&o);
    o.model_dir = dir;
    o.model.embed_lookup = lookup;
    o.model.weight_dtype = wdt;
    o.max_seqs = 2;
    o.max_batch_tokens = 64;
    o.ranks = ranks;
    o.gather.tier = tier;
    o.nvme_path = nvme;
    o.device = g_device;
    return zs_engine_open(&o, e);
}

/* speculation off, and the inference pass already speculated consumed now (before the counters) */
static void spec_off(void *ud, int rank) {
    zs_gather_set_speculation(zs_world_gather(ud, rank), 0);
    zs_gather_settle(zs_world_gather(ud, rank));
}

/* What one pass moves, all ranks together: full buckets received and shard bytes read. */
typedef struct { uint64_t gathered, nvme, host; long items; } pass_bytes;

#define NP 6
#define NDEC 6
#define NACC 3 /* the last NACC decode steps are counted with speculation off */

/* Prefills ids[0..NP) (logits of every row), then decodes ids[NP..NP+NDEC) one token a step
 * (one logits row each): logits gets NP + NDEC rows. The counters of the last NACC decode steps,
 * run with speculation off so that nothing of a coming pass is in them, go to *per_step. */
static int run_seq(zs_engine *e, const int32_t *ids, float *logits, int vocab, pass_bytes *per_step) {
    zs_kvcache *kv = zs_engine_kv(e);
    zs_world *w = zs_engine_world(e);
    int seq, rc;
    if ((rc = zs_kv_seq_open(kv, &seq)) < 0) return rc;
    int32_t pos[NP], sq[NP], li[NP];
    for (int i = 0; i < NP; i++) { pos[i] = i; sq[i] = seq; li[i] = i; }
    zs_batch b = {NP, ids, pos, sq, li, NP, NULL, NULL, NULL};
    rc = zs_kv_seq_reserve(kv, seq, NP + NDEC);
    if (rc == 0) rc = zs_engine_forward(e, &b, logits);
    zs_gather_stats s0, s1;
    memset(&s0, 0, sizeof s0);
    for (int t = 0; rc == 0 && t < NDEC; t++) {
        if (t == NDEC - NACC) {
            zs_world_run(w, spec_off, w);
            zs_world_stats(w, &s0);
        }
        int32_t p = NP + t, l0 = 0;
        zs_batch d = {1, &ids[NP + t], &p, &seq, &l0, 1, NULL, NULL, NULL};
        rc = zs_engine_forward(e, &d, logits + (size_t)(NP + t) * vocab);
    }
    zs_world_stats(w, &s1);
    per_step->gathered = (s1.bytes_gathered - s0.bytes_gathered) / NACC;
    per_step->nvme = (s1.bytes_nvme - s0.bytes_nvme) / NACC;
    per_step->host = (s1.bytes_host - s0.bytes_host) / NACC;
    per_step->items = (s1.items - s0.items) / NACC;
    CHECK((s1.bytes_gathered - s0.bytes_gathered) % NACC == 0, "the same bytes every decode step");
    zs_kv_seq_close(kv, seq);
    return rc;
}

/* The full bytes of bucket b with n ranks (what all_gather hands every rank). */
static uint64_t full_bytes(const zs_model *m, int b, int n) { return (uint64_t)zs_partition_shard_bytes(m, b, n) * (uint64_t)n; }

/* One model: the sharded layout on one resident rank is the reference (on a CUDA device: the
 * sharded layout of the same ranks and tier); every lookup engine must give its logits bit for
 * bit and gather what the pass order promises. */
static void check_model(const char *label, const char *dir, zs_dtype wdt, const char *tmp, json_t *ref) {
    int32_t ids[NP + NDEC];
    zs_engine *e;
    int rc = open_engine(dir, 0, 1, ZS_OFFLOAD_NONE, NULL, wdt, &e);
    CHECK(rc == 0, "%s: open the reference engine: %s", label, zs_errmsg());
    if (rc < 0) return;
    const zs_model_config *c = zs_model_config_get(zs_engine_model(e));
    int vocab = c->vocab_size, tied = c->tied_embeddings, L = c->n_layers;
    for (int i = 0; i < NP + NDEC; i++) ids[i] = (int32_t)((i * 97 + 5) % vocab);
    size_t rows = (size_t)(NP + NDEC) * (size_t)vocab;
    float *base = malloc(rows * 4), *lg = malloc(rows * 4), *ref0 = malloc(rows * 4);
    int cuda = g_device == ZS_DEVICE_CUDA;
    pass_bytes ps;
    rc = run_seq(e, ids, base, vocab, &ps);
    CHECK(rc == 0, "%s: reference run: %s", label, zs_errmsg());
    zs_engine_free(e);

    for (int ranks = 1; ranks <= 3; ranks++)
        for (int tier = 0; tier < 3; tier++) {
            for (int lookup = 0; lookup <= 1; lookup++) {
                if (!lookup && !cuda && !(ranks == 2 && tier == ZS_OFFLOAD_CPU)) continue; /* the old layout, once */
                rc = open_engine(dir, lookup, ranks, tier, tmp, wdt, &e);
                CHECK(rc == 0, "%s ranks %d %s lookup %d: open: %s", label, ranks, tier_name[tier], lookup, zs_errmsg());
                if (rc < 0) continue;
                const zs_model *m = zs_engine_model(e);
                int n = zs_world_size(zs_engine_world(e));
                memset(lg, 0, rows * 4);
                rc = run_seq(e, ids, lg, vocab, &ps);
                CHECK(rc == 0, "%s ranks %d %s lookup %d: run: %s", label, ranks, tier_name[tier], lookup, zs_errmsg());
                if (cuda && !lookup) memcpy(ref0, lg, rows * 4);
                CHECK(rc == 0 && memcmp(cuda ? ref0 : base, lg, rows * 4) == 0,
                      "%s ranks %d %s lookup %d: logits bitwise equal to the sharded layout on %s", label, ranks,
                      tier_name[tier], lookup, cuda ? "the same ranks and tier" : "one resident rank");
                /* what a decode step must gather: every layer and the head once, the embedding
                 * bucket once more for a tied head (with the lookup) or once / twice (without) */
                uint64_t want = 0, want_shards = 0;
                long want_items = 0;
                for (int b = 1; b <= L + 1; b++) {
                    want += full_bytes(m, b, n);
                    want_shards += zs_partition_shard_bytes(m, b, n);
                    want_items += full_bytes(m, b, n) > 0;
                }
                int embed_times = lookup ? tied : tied ? 2 : 1;
                uint64_t emb = full_bytes(m, zs_bucket_embed(), n);
                want += emb * (uint64_t)embed_times;
                want_shards += zs_partition_shard_bytes(m, zs_bucket_embed(), n) * (uint64_t)embed_times;
                want_items += emb > 0 ? embed_times : 0;
                /* no pipeline: the shards are the buckets (gather.c) */
                int direct = ranks == 1 && (cuda ? tier == ZS_OFFLOAD_NONE : tier != ZS_OFFLOAD_NVME);
                uint64_t per_rank = want * (uint64_t)ranks;
                fprintf(stderr, "%s ranks %d %s lookup %d: %llu bytes gathered per decode step (%ld buckets; "
                        "embedding bucket %llu bytes)\n", label, ranks, tier_name[tier], lookup,
                        (unsigned long long)ps.gathered, ps.items, (unsigned long long)emb);
                if (direct) {
                    CHECK(ps.gathered == 0 && ps.items == 0, "%s ranks 1 %s: nothing gathered", label, tier_name[tier]);
                } else {
                    CHECK(ps.gathered == per_rank, "%s ranks %d %s lookup %d: %llu bytes gathered per decode step, want %llu",
                          label, ranks, tier_name[tier], lookup, (unsigned long long)ps.gathered,
                          (unsigned long long)per_rank);
                    CHECK(ps.items == want_items * ranks, "%s ranks %d %s lookup %d: %ld buckets gathered per step, want %ld",
                          label, ranks, tier_name[tier], lookup, ps.items, want_items * ranks);
                    uint64_t tier_bytes = tier == ZS_OFFLOAD_NVME ? ps.nvme : tier == ZS_OFFLOAD_CPU ? ps.host : 0;
                    if (tier != ZS_OFFLOAD_NONE)
                        CHECK(tier_bytes == want_shards * (uint64_t)ranks, "%s ranks %d %s lookup %d: %llu shard bytes read "
                              "per step, want %llu", label, ranks, tier_name[tier], lookup,
                              (unsigned long long)tier_bytes, (unsigned long long)(want_shards * (uint64_t)ranks));
                }
                if (lookup && !tied)
                    CHECK(zs_partition_shard_bytes(m, zs_bucket_embed(), n) == 0 &&
                              zs_model_layout(m, zs_bucket_embed())->data_bytes == 0,
                          "%s: an untied inference model has no sharded embedding bytes", label);
                if (lookup && tied)
                    CHECK(emb > 0 && zs_model_layout(m, zs_bucket_embed())->slot[ZS_R_TOK_EMB].resident == 0,
                          "%s: a tied token table stays sharded for the head", label);
                /* the greedy ids of the fixtures */
                if (ref && lookup && rc == 0) {
                    json_t *c0 = json_array_get(json_object_get(ref, "cases"), 0);
                    json_t *pj = json_object_get(c0, "prompt_ids"), *nj = json_object_get(c0, "new_ids");
                    int np = (int)json_array_size(pj), nn = (int)json_array_size(nj);
                    if (nn > 16) nn = 16;
                    int32_t *prompt = malloc((size_t)np * 4);
                    for (int i = 0; i < np; i++) prompt[i] = (int32_t)json_integer_value(json_array_get(pj, i));
                    zs_gen_params gp;
                    memset(&gp, 0, sizeof gp);
                    zs_sampler_params_default(&gp.sampling);
                    gp.sampling.temperature = 0;
                    gp.max_tokens = nn;
                    gp.ignore_eos = 1;
                    zs_gen_result res;
                    rc = zs_engine_generate(e, prompt, np, &gp, NULL, NULL, &res);
                    int same = rc == 0 && res.n_generated == nn;
                    for (int i = 0; same && i < nn; i++)
                        same = res.ids[i] == (int32_t)json_integer_value(json_array_get(nj, i));
                    CHECK(same, "%s ranks %d %s: greedy ids equal the reference (%s)", label, ranks, tier_name[tier],
                          rc < 0 ? zs_errmsg() : "");
                    if (rc == 0) free(res.ids);
                    free(prompt);
                }
                zs_engine_free(e);
            }
        }
    free(base);
    free(lg);
    free(ref0);
}

/* The host rows are the packed bucket's, byte for byte; the layouts differ only where promised. */
static void check_tables(const char *label, const char *dir, zs_dtype wdt) {
    zs_model_opts o0, o1;
    zs_model_opts_default(&o0);
    o0.weight_dtype = wdt;
    o1 = o0;
    o1.embed_lookup = 1;
    zs_model *m0 = NULL, *m1 = NULL;
    int rc = zs_model_open(dir, &o0, &m0);
    if (rc == 0) rc = zs_model_open(dir, &o1, &m1);
    CHECK(rc == 0, "%s: open: %s", label, zs_errmsg());
    if (rc < 0) { zs_model_free(m0); return; }
    int eb = zs_bucket_embed();
    const zs_model_config *c = zs_model_config_get(m1);
    const zs_bucket_layout *E0 = zs_model_layout(m0, eb), *E1 = zs_model_layout(m1, eb);
    CHECK(!zs_model_embed_lookup(m0) && zs_model_embed_lookup(m1), "%s: the option is kept", label);
    CHECK(zs_model_embed_table(m1, ZS_R_TOK_EMB) == NULL, "%s: no table before the resident parts are loaded", label);
    CHECK(zs_model_load_resident_parts(m1) == 0, "%s: resident parts: %s", label, zs_errmsg());
    CHECK(zs_model_embed_table(m0, ZS_R_TOK_EMB) == NULL, "%s: no lookup tables without embed_lookup", label);
    char *full = zs_aligned_alloc(4096, E0->data_bytes);
    CHECK(full && zs_model_pack_bucket(m0, eb, full, NULL) == 0, "%s: pack: %s", label, zs_errmsg());
    size_t want_host = 0;
    for (int r = ZS_R_TOK_EMB; r <= ZS_R_POS_EMB; r++) {
        const zs_slot *s0 = &E0->slot[r], *s1 = &E1->slot[r];
        if (!s0->present) {
            CHECK(zs_model_embed_table(m1, r) == NULL, "%s: no table for an absent slot", label);
            continue;
        }
        want_host += s0->nbytes;
        const void *t = zs_model_embed_table(m1, r);
        CHECK(!s0->resident, "%s: role %d sharded in the training layout", label, r);
        CHECK(s1->resident == !(r == ZS_R_TOK_EMB && c->tied_embeddings), "%s: role %d resident with embed_lookup "
              "unless it is a tied head", label, r);
        CHECK(s1->dtype == s0->dtype && s1->nbytes == s0->nbytes, "%s: role %d: same dtype and size", label, r);
        CHECK(t && full && memcmp(t, full + s0->offset, s0->nbytes) == 0, "%s: role %d: host rows bit for bit the "
              "packed bucket's", label, r);
    }
    CHECK(zs_model_embed_table_bytes(m1) == want_host && zs_model_embed_table_bytes(m0) == 0,
          "%s: host table bytes %zu, want %zu", label, zs_model_embed_table_bytes(m1), want_host);
    CHECK(c->tied_embeddings ? E1->data_bytes == ZS_ALIGN_UP(E0->slot[ZS_R_TOK_EMB].nbytes, 4096) : E1->data_bytes == 0,
          "%s: embedding bucket data %zu bytes", label, E1->data_bytes);
    CHECK(zs_model_param_count(m0) == zs_model_param_count(m1), "%s: same parameters (the tied copy is none)", label);
    for (int b = 1; b < zs_model_n_buckets(m0); b++)
        CHECK(!memcmp(zs_model_layout(m0, b), zs_model_layout(m1, b), sizeof(zs_bucket_layout)),
              "%s: bucket %d has the same layout", label, b);
    int o0n[1100], o1n[1100];
    int n0 = zs_model_pass_order(m0, o0n), n1 = zs_model_pass_order(m1, o1n);
    int L = c->n_layers, ok = n1 == L + 1 + c->tied_embeddings;
    for (int i = 0; ok && i < L + 1; i++) ok = o1n[i] == 1 + i;
    if (ok && c->tied_embeddings) ok = o1n[L + 1] == eb;
    CHECK(ok && n0 == L + 2 + c->tied_embeddings && o0n[0] == eb,
          "%s: pass orders (inference: layers, head%s; training unchanged)", label, c->tied_embeddings ? ", embed" : "");
    CHECK(strcmp(zs_model_fingerprint(m0), zs_model_fingerprint(m1)) != 0 && strstr(zs_model_fingerprint(m1), "-e1") &&
              strstr(zs_model_fingerprint(m0), "-e0"),
          "%s: the fingerprints tell the layouts apart (%s / %s)", label, zs_model_fingerprint(m0),
          zs_model_fingerprint(m1));
    free(full);
    zs_model_free(m0);
    zs_model_free(m1);
}

/* An inference engine and a training engine on one --nvme-path never take each other's files. */
static void check_shard_files(const char *dir) {
    char nv[4096];
    tu_tmpdir(nv, sizeof nv, "embnv");
    static const int seq[4] = {1, 1, 0, 1};
    static const int want_reused[4] = {0, 1, 0, 0};
    for (int i = 0; i < 4; i++) {
        zs_engine *e;
        int rc = open_engine(dir, seq[i], 2, ZS_OFFLOAD_NVME, nv, ZS_DTYPE_COUNT, &e);
        CHECK(rc == 0, "open %d: %s", i, zs_errmsg());
        if (rc < 0) continue;
        CHECK(zs_world_reused_shards(zs_engine_world(e)) == want_reused[i], "start %d (lookup %d): shard files %s", i,
              seq[i], want_reused[i] ? "reused" : "rewritten");
        zs_engine_free(e);
    }
    tu_rmdir(nv);
}

static void check_training_refuses(const char *dir) {
    zs_engine *e;
    int rc = open_engine(dir, 1, 1, ZS_OFFLOAD_NONE, NULL, ZS_DTYPE_COUNT, &e);
    CHECK(rc == 0, "open: %s", zs_errmsg());
    if (rc < 0) return;
    zs_train_opts to;
    memset(&to, 0, sizeof to);
    to.micro_batch = 1;
    to.seq_len = 2;
    to.grad_accum = 1;
    zs_adamw_params_default(&to.adam);
    to.lr.lr = to.adam.lr;
    zs_training *t = NULL;
    CHECK_ERR(zs_training_begin(zs_engine_world(e), &to, &t), "opened for inference", "embed_lookup = 0");
    zs_engine_free(e);
}

int main(void) {
    char tmp[4096], nv[4096], p[4200];
    if (tu_tmpdir(tmp, sizeof tmp, "embed") < 0 || tu_tmpdir(nv, sizeof nv, "embed-nv") < 0) {
        CHECK(0, "scratch directories");
        return tu_finish("test-embed");
    }
    static const struct { const char *label, *arch; int tied; zs_dtype dt, wdt; } gen[] = {
        {"llama untied", "llama", 0, ZS_F32, ZS_DTYPE_COUNT},
        {"llama untied bf16 weights", "llama", 0, ZS_F32, ZS_BF16},
        {"gpt2 untied f16 weights", "gpt2", 0, ZS_F32, ZS_F16},
        {"llama tied bf16 checkpoint", "llama", 1, ZS_BF16, ZS_DTYPE_COUNT},
    };
    for (size_t i = 0; i < sizeof gen / sizeof gen[0]; i++) {
        snprintf(p, sizeof p, "%s/m%zu", tmp, i);
        int rc = make_model(p, gen[i].arch, gen[i].tied, gen[i].dt);
        CHECK(rc == 0, "%s: init-model: %s", gen[i].label, zs_errmsg());
        if (rc < 0) continue;
        check_tables(gen[i].label, p, gen[i].wdt);
        check_model(gen[i].label, p, gen[i].wdt, nv, NULL);
    }
    static const char *fixtures[] = {"stories260K", "gpt2-bytes"};
    for (int i = 0; i < 2; i++) {
        char dir[4096];
        tu_model_dir(dir, sizeof dir, fixtures[i]);
        json_t *ref = tu_load_reference(dir);
        CHECK(ref != NULL, "%s: reference", fixtures[i]);
        check_tables(fixtures[i], dir, ZS_DTYPE_COUNT);
        check_model(fixtures[i], dir, ZS_DTYPE_COUNT, nv, ref);
        json_decref(ref);
    }
    snprintf(p, sizeof p, "%s/m0", tmp);
    check_shard_files(p);
    check_training_refuses(p);
    if (zs_backend_cuda_built() && zs_backend_cuda_devices() > 0) {
        g_device = ZS_DEVICE_CUDA;
        for (size_t i = 0; i < sizeof gen / sizeof gen[0]; i++) {
            char label[128];
            snprintf(label, sizeof label, "cuda: %s", gen[i].label);
            snprintf(p, sizeof p, "%s/m%zu", tmp, i);
            check_model(label, p, gen[i].wdt, nv, NULL);
        }
        for (int i = 0; i < 2; i++) {
            char dir[4096], label[128];
            tu_model_dir(dir, sizeof dir, fixtures[i]);
            snprintf(label, sizeof label, "cuda: %s", fixtures[i]);
            check_model(label, dir, ZS_DTYPE_COUNT, nv, NULL);
        }
    } else {
        fprintf(stderr, "test-embed: no CUDA device (built with CUDA: %d): the device runs are skipped\n",
                zs_backend_cuda_built());
    }
    tu_rmdir(nv);
    tu_rmdir(tmp);
    return tu_finish("test-embed");
}
