/* test-zero.c — ZeRO-3 across ranks with offload: for ranks 1-4 and offload none/cpu/nvme the
 * greedy ids equal the references and the logits are bitwise those of ranks=1/offload=none; a
 * two-layer live budget is respected with prefetch depth >= 1; faults (truncated shard file,
 * flipped byte under --verify-shards, injected read error) fail only the generation they hit;
 * shard files are reused on restart and rewritten when the checkpoint changes; bad NVMe paths
 * stop start-up before anything is written. */
#include <errno.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <utime.h>

#include "common.h"
#include "engine.h"
#include "ref.h"
#include "safetensors.h"
#include "store.h"
#include "testutil.h"

static int open_engine(const char *dir, int ranks, int tier, const char *nvme, size_t max_live, int verify,
                       zs_engine **e) {
    zs_engine_opts o;
    zs_engine_opts_default(&o);
    o.model_dir = dir;
    o.max_seqs = 2;
    o.ranks = ranks;
    o.gather.tier = tier;
    o.nvme_path = nvme;
    o.gather.max_live_bytes = max_live;
    o.gather.verify = verify;
    return zs_engine_open(&o, e);
}

static int greedy(zs_engine *e, const int32_t *prompt, int np, int n, zs_gen_result *res) {
    zs_gen_params p;
    memset(&p, 0, sizeof p);
    zs_sampler_params_default(&p.sampling);
    p.sampling.temperature = 0;
    p.max_tokens = n;
    p.ignore_eos = 1;
    return zs_engine_generate(e, prompt, np, &p, NULL, NULL, res);
}

/* Logits of every position of ids (one prefill). */
static int logits_all(zs_engine *e, const int32_t *ids, int n, float *out) {
    zs_kvcache *kv = zs_engine_kv(e);
    int seq, rc;
    if ((rc = zs_kv_seq_open(kv, &seq)) < 0) return rc;
    int32_t pos[256], sq[256], li[256];
    for (int i = 0; i < n; i++) { pos[i] = i; sq[i] = seq; li[i] = i; }
    zs_batch b = {n, ids, pos, sq, li, n, NULL, NULL, NULL};
    rc = zs_kv_seq_reserve(kv, seq, n);
    if (rc == 0) rc = zs_engine_forward(e, &b, out);
    zs_kv_seq_close(kv, seq);
    return rc;
}

static const char *tier_name[] = {"none", "cpu", "nvme"};

static void check_matrix(const char *name) {
    char dir[4096], tmp[4096];
    tu_model_dir(dir, sizeof dir, name);
    json_t *ref = tu_load_reference(dir);
    if (!ref) { CHECK(0, "reference"); return; }
    json_t *c0 = json_array_get(json_object_get(ref, "cases"), 0);
    int32_t prompt[256], want[256], all[512];
    int np = tu_ref_ids(json_object_get(c0, "prompt_ids"), prompt, 256);
    int nn = tu_ref_ids(json_object_get(c0, "new_ids"), want, 256);
    int na = tu_ref_ids(json_object_get(c0, "all_ids"), all, 512);
    if (na > 200) na = 200;
    tu_tmpdir(tmp, sizeof tmp, "zero");
    float *base = NULL;
    size_t vocab = 0;
    for (int ranks = 1; ranks <= 4; ranks++)
        for (int tier = 0; tier < 3; tier++) {
            zs_engine *e;
            int rc = open_engine(dir, ranks, tier, tmp, 0, 0, &e);
            CHECK(rc == 0, "%s ranks %d %s: open: %s", name, ranks, tier_name[tier], zs_errmsg());
            if (rc < 0) continue;
            vocab = (size_t)zs_model_config_get(zs_engine_model(e))->vocab_size;
            zs_gen_result res;
            rc = greedy(e, prompt, np, nn, &res);
            CHECK(rc == 0, "%s ranks %d %s: generate: %s", name, ranks, tier_name[tier], zs_errmsg());
            if (rc == 0) {
                CHECK(res.n_generated == nn && !memcmp(res.ids, want, (size_t)nn * 4),
                      "%s ranks %d %s: greedy ids equal the reference", name, ranks, tier_name[tier]);
                free(res.ids);
            }
            float *lg = malloc((size_t)na * vocab * 4);
            rc = logits_all(e, all, na, lg);
            CHECK(rc == 0, "%s ranks %d %s: forward: %s", name, ranks, tier_name[tier], zs_errmsg());
            if (!base) base = lg;
            else {
                CHECK(memcmp(base, lg, (size_t)na * vocab * 4) == 0,
                      "%s ranks %d %s: logits bitwise equal to ranks=1/offload=none", name, ranks, tier_name[tier]);
                free(lg);
            }
            zs_gather_stats st;
            zs_world_stats(zs_engine_world(e), &st);
            if (ranks > 1 || tier == 2)
                CHECK(st.bytes_gathered > 0 && (tier != 2 || st.bytes_nvme > 0),
                      "%s ranks %d %s: the gathers moved bytes", name, ranks, tier_name[tier]);
            zs_engine_free(e);
        }
    free(base);
    tu_rmdir(tmp);
    json_decref(ref);
}

static void check_live_budget(void) {
    char dir[4096], tmp[4096];
    tu_model_dir(dir, sizeof dir, "stories260K");
    tu_tmpdir(tmp, sizeof tmp, "live");
    zs_model *m;
    CHECK(zs_model_open(dir, NULL, &m) == 0, "open: %s", zs_errmsg());
    int ranks = 2;
    size_t layer = zs_partition_shard_bytes(m, zs_bucket_layer(0), ranks) * (size_t)ranks;
    zs_model_free(m);
    for (int tier = 0; tier < 3; tier++) {
        zs_engine *e;
        int rc = open_engine(dir, ranks, tier, tmp, 2 * layer, 0, &e);
        CHECK(rc == 0, "open with a two-layer budget: %s", zs_errmsg());
        if (rc < 0) continue;
        int32_t prompt[] = {1, 403, 407, 261, 378};
        zs_gen_result res;
        CHECK(greedy(e, prompt, 5, 20, &res) == 0, "generate: %s", zs_errmsg());
        free(res.ids);
        zs_gather_stats st;
        zs_world_stats(zs_engine_world(e), &st);
        fprintf(stderr, "%s: live budget %zu, max live %zu, max depth %d, stall %.4f s\n", tier_name[tier],
                st.live_limit, st.max_live_bytes, st.max_depth, st.stall_s);
        CHECK(st.live_limit == 2 * layer, "the bound in force is two layers");
        CHECK(st.max_live_bytes <= 2 * layer, "live bytes never over the bound (%zu > %zu)", st.max_live_bytes, 2 * layer);
        CHECK(st.max_depth >= 1, "prefetch depth >= 1 reached (%d)", st.max_depth);
        zs_engine_free(e);
    }
    /* a budget below one bucket is refused at start-up */
    zs_engine *e;
    CHECK_ERR(open_engine(dir, 2, 1, tmp, layer / 2, 0, &e), "max_live_bytes", "largest bucket");
    tu_rmdir(tmp);
}

static void flip_byte(const char *path, long off) {
    FILE *f = fopen(path, "r+b");
    if (!f) { CHECK(0, "open %s", path); return; }
    fseek(f, off, SEEK_SET);
    int c = fgetc(f);
    fseek(f, off, SEEK_SET);
    fputc(c ^ 0x5a, f);
    fclose(f);
}

static void check_faults(void) {
    char dir[4096], tmp[4096], path[4200];
    tu_model_dir(dir, sizeof dir, "stories260K");
    tu_tmpdir(tmp, sizeof tmp, "fault");
    zs_engine *e;
    int rc = open_engine(dir, 2, ZS_OFFLOAD_NVME, tmp, 0, 1, &e);
    CHECK(rc == 0, "open: %s", zs_errmsg());
    if (rc < 0) return;
    int32_t prompt[] = {1, 403, 407, 261, 378};
    zs_gen_result res;
    CHECK(greedy(e, prompt, 5, 8, &res) == 0, "first generation: %s", zs_errmsg());
    free(res.ids);

    /* truncated after it was written */
    snprintf(path, sizeof path, "%s/rank1.shards", tmp);
    struct stat sb;
    stat(path, &sb);
    CHECK(truncate(path, sb.st_size / 2) == 0, "truncate");
    CHECK_ERR(greedy(e, prompt, 5, 8, &res), "rank1.shards", "truncated");
    rc = greedy(e, prompt, 5, 8, &res);
    CHECK(rc == 0, "the next generation works after a truncation: %s", zs_errmsg());
    if (rc == 0) free(res.ids);

    /* a flipped byte, found by --verify-shards */
    snprintf(path, sizeof path, "%s/rank0.shards", tmp);
    flip_byte(path, 3 * 4096 + 17);
    CHECK_ERR(greedy(e, prompt, 5, 8, &res), "rank0.shards", "checksum");
    rc = greedy(e, prompt, 5, 8, &res);
    CHECK(rc == 0, "the next generation works after a flipped byte: %s", zs_errmsg());
    if (rc == 0) free(res.ids);

    /* an injected read error */
    zs_store_inject_read_error(3);
    CHECK_ERR(greedy(e, prompt, 5, 8, &res), "Input/output error");
    zs_store_inject_read_error(0);
    rc = greedy(e, prompt, 5, 8, &res);
    CHECK(rc == 0, "the next generation works after a read error: %s", zs_errmsg());
    if (rc == 0) {
        int32_t want[] = {432, 383, 286, 261, 376, 298, 315, 421};
        CHECK(!memcmp(res.ids, want, sizeof want), "and gives the reference tokens");
        free(res.ids);
    }
    zs_gather_stats st;
    zs_world_stats(zs_engine_world(e), &st);
    CHECK(st.repairs >= 2 && st.read_errors >= 3, "counters: %ld repairs, %ld read errors", st.repairs, st.read_errors);
    zs_engine_free(e);
    tu_rmdir(tmp);
}

static int copy_model(const char *src, const char *dst) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "cd '%.400s' && cp config.json model.safetensors tokenizer.json tokenizer_config.json '%.400s'/",
             src, dst);
    return system(cmd);
}

static void check_reuse(void) {
    char src[4096], mdir[4096], nv[4096], path[4200];
    tu_model_dir(src, sizeof src, "stories260K");
    tu_tmpdir(mdir, sizeof mdir, "model");
    tu_tmpdir(nv, sizeof nv, "reuse");
    CHECK(copy_model(src, mdir) == 0, "copy model");
    zs_engine *e;
    CHECK(open_engine(mdir, 2, ZS_OFFLOAD_NVME, nv, 0, 0, &e) == 0, "open: %s", zs_errmsg());
    CHECK(!zs_world_reused_shards(zs_engine_world(e)), "first start writes the shard files");
    zs_engine_free(e);
    snprintf(path, sizeof path, "%s/rank0.shards", nv);
    struct stat a, b;
    stat(path, &a);
    sleep(1);
    CHECK(open_engine(mdir, 2, ZS_OFFLOAD_NVME, nv, 0, 0, &e) == 0, "reopen: %s", zs_errmsg());
    CHECK(zs_world_reused_shards(zs_engine_world(e)), "a restart reuses the shard files");
    zs_engine_free(e);
    stat(path, &b);
    CHECK(a.st_mtim.tv_sec == b.st_mtim.tv_sec && a.st_mtim.tv_nsec == b.st_mtim.tv_nsec, "mtime unchanged");
    /* change the checkpoint: one weight differs */
    zs_st_set *s;
    snprintf(path, sizeof path, "%s/model.safetensors", src);
    CHECK(zs_st_open_file(path, &s) == 0, "open src");
    size_t n = zs_st_count(s);
    zs_st_decl *d = calloc(n, sizeof *d);
    for (size_t i = 0; i < n; i++) {
        const zs_st_tensor *t = zs_st_at(s, i);
        d[i] = (zs_st_decl){t->name, t->dtype, t->ndim, {0}};
        memcpy(d[i].shape, t->shape, sizeof t->shape);
    }
    snprintf(path, sizeof path, "%s/model.safetensors", mdir);
    zs_st_writer *w;
    int rc = zs_st_writer_open(path, d, n, NULL, &w);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        const zs_st_tensor *t = zs_st_at(s, i);
        char *copy = malloc(t->nbytes);
        memcpy(copy, t->data, t->nbytes);
        if (i == n / 2) copy[5] ^= 1;
        rc = zs_st_writer_write(w, copy, t->nbytes);
        free(copy);
    }
    CHECK(rc == 0 && zs_st_writer_close(w) == 0, "rewrite checkpoint");
    free(d);
    zs_st_close(s);
    CHECK(open_engine(mdir, 2, ZS_OFFLOAD_NVME, nv, 0, 0, &e) == 0, "reopen: %s", zs_errmsg());
    CHECK(!zs_world_reused_shards(zs_engine_world(e)), "a changed checkpoint rewrites the shard files");
    zs_engine_free(e);
    /* a different rank count is a different layout: rewritten too */
    CHECK(open_engine(mdir, 3, ZS_OFFLOAD_NVME, nv, 0, 0, &e) == 0, "reopen: %s", zs_errmsg());
    CHECK(!zs_world_reused_shards(zs_engine_world(e)), "another rank count rewrites the shard files");
    zs_engine_free(e);
    tu_rmdir(nv);
    tu_rmdir(mdir);
}

static int dir_is_empty(const char *dir) {
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "test -z \"$(ls -A '%.4000s')\"", dir);
    return system(cmd) == 0;
}

static void check_bad_paths(void) {
    char dir[4096], tmp[4096], p[4200];
    tu_model_dir(dir, sizeof dir, "stories260K");
    tu_tmpdir(tmp, sizeof tmp, "paths");
    zs_engine *e;
    snprintf(p, sizeof p, "%s/does-not-exist", tmp);
    CHECK_ERR(open_engine(dir, 2, ZS_OFFLOAD_NVME, p, 0, 0, &e), "does-not-exist");
    snprintf(p, sizeof p, "%s/file", tmp);
    tu_write_file(p, "x", 1);
    CHECK_ERR(open_engine(dir, 2, ZS_OFFLOAD_NVME, p, 0, 0, &e), "file", "not a directory");
    CHECK_ERR(open_engine(dir, 2, ZS_OFFLOAD_NVME, "/proc/self", 0, 0, &e), "/proc/self");
    CHECK_ERR(open_engine(dir, 2, ZS_OFFLOAD_NVME, NULL, 0, 0, &e), "nvme");
    /* a disk with too little room: a 256 KiB tmpfs (needs root; skipped otherwise) */
    snprintf(p, sizeof p, "%s/small", tmp);
    mkdir(p, 0755);
    if (mount("tmpfs", p, "tmpfs", 0, "size=256k") == 0) {
        CHECK_ERR(open_engine(dir, 2, ZS_OFFLOAD_NVME, p, 0, 0, &e), "small");
        CHECK(dir_is_empty(p), "nothing half-written in a full directory");
        umount(p);
    } else {
        fprintf(stderr, "note: cannot mount a small tmpfs here (%s); the no-room case is covered by test-store\n",
                strerror(errno));
    }
    tu_rmdir(tmp);
}

int main(void) {
    check_matrix("stories260K");
    check_matrix("gpt2-bytes");
    check_live_budget();
    check_faults();
    check_reuse();
    check_bad_paths();
    return tu_finish("test-zero");
}
