/* test-gather-range.c — passes over ranges of the training order (gather.h, issue 31): with
 * stories260K (dense) and a random Qwen3-MoE, offload cpu and nvme, 1 and 2 ranks in one process,
 * every bucket handed out in a range pass is bit for bit the concatenation of the ranks' shards;
 * a training pass cut into slices (forward in 3, backward in 2), each declared at the previous
 * begin, reads every bucket once per slice and wastes nothing; a training pass after a speculated
 * inference pass adopts it (no extra pass read); a wrong declaration is consumed (passes_wasted)
 * and the bytes stay right; and a shard is written on nvme after speculation off and a training
 * pass. */
#include "common.h"
#include "device.h"
#include "engine.h"
#include "gather.h"
#include "init-model.h"
#include "testutil.h"

#define MAXR 2
#define MAXL 16

typedef struct {
    zs_world *w;
    const zs_model *m;
    int nr, nb, direct, moe, n_exp;
    unsigned char **ref; /* [nb] the full bucket: the ranks' shards one after the other */
    size_t *full;        /* [nb] its bytes */
    /* the pass the next walk job runs */
    zs_pass_range cur, next;
    int has_next;
    int spec;            /* spec_job: the value to set */
    /* per rank: the latest forward agreement of each layer (the backward's plan), mismatches */
    uint64_t last[MAXR][MAXL][ZS_EXPERT_WORDS];
    int bad[MAXR], fail[MAXR];
    char msg[MAXR][256];
} ctx_t;

static int has(const uint64_t *m, int e) { return (int)((m[e >> 6] >> (e & 63)) & 1u); }

static void check_bucket(ctx_t *c, int rank, int b, const void *d) {
    if (c->full[b] && (!d || memcmp(d, c->ref[b], c->full[b]) != 0)) c->bad[rank]++;
}

/* Walks a pass over c->cur as a trainer would: each bucket acquired and compared; at a forward
 * mark the rank's own experts (two, different per rank and layer), at a backward mark the
 * layer's last agreement. */
static void walk_job(void *ud, int rank) {
    ctx_t *c = ud;
    zs_gather *g = zs_world_gather(c->w, rank);
    zs_gather_pass_begin_range(g, c->cur, c->has_next ? &c->next : NULL);
    zs_weight_source src = zs_gather_source(g);
    const int *ord;
    int ninf;
    zs_gather_order(g, &ord, &ninf);
    for (int i = c->cur.first; i < c->cur.first + c->cur.count; i++) {
        int b = ord[i];
        const void *d = NULL;
        if (zs_pass_is_experts(b)) {
            int l = zs_pass_experts_layer(b);
            uint64_t agreed[ZS_EXPERT_WORDS] = {0};
            if (i < ninf) {
                uint64_t mask[ZS_EXPERT_WORDS] = {0};
                int e0 = (rank + l) % c->n_exp, e1 = (3 * rank + 2 * l + 1) % c->n_exp;
                mask[e0 >> 6] |= 1ULL << (e0 & 63);
                mask[e1 >> 6] |= 1ULL << (e1 & 63);
                if (src.experts(src.ctx, l, mask, agreed) < 0) c->fail[rank]++;
                memcpy(c->last[rank][l], agreed, sizeof agreed);
            } else {
                memcpy(agreed, c->last[rank][l], sizeof agreed);
            }
            for (int e = 0; e < c->n_exp; e++) {
                if (!has(agreed, e)) continue;
                int xb = zs_bucket_expert(c->m, l, e);
                if (src.acquire(src.ctx, xb, &d) < 0) c->fail[rank]++;
                else check_bucket(c, rank, xb, d);
                src.release(src.ctx, xb);
            }
            continue;
        }
        if (src.acquire(src.ctx, b, &d) < 0) c->fail[rank]++;
        else check_bucket(c, rank, b, d);
        src.release(src.ctx, b);
    }
    zs_gather_pass_end(g);
    int remote;
    const char *msg;
    if (zs_gather_pass_error(g, &remote, &msg) < 0) {
        c->fail[rank]++;
        snprintf(c->msg[rank], sizeof c->msg[rank], "%s", msg);
    }
}

static void spec_job(void *ud, int rank) {
    ctx_t *c = ud;
    zs_gather_set_speculation(zs_world_gather(c->w, rank), c->spec);
}

static void settle_job(void *ud, int rank) {
    ctx_t *c = ud;
    zs_gather_settle(zs_world_gather(c->w, rank));
}

static void run_pass(ctx_t *c, zs_pass_range cur, const zs_pass_range *next) {
    c->cur = cur;
    c->has_next = next != NULL;
    if (next) c->next = *next;
    zs_world_run(c->w, walk_job, c);
}

static void set_spec(ctx_t *c, int on) {
    c->spec = on;
    zs_world_run(c->w, spec_job, c);
}

/* Counters summed over the ranks. */
typedef struct { uint64_t bytes; long passes, adopted, wasted; } cnt_t;

static cnt_t counters(ctx_t *c, int tier) {
    cnt_t s = {0, 0, 0, 0};
    for (int r = 0; r < c->nr; r++) {
        zs_gather_stats st;
        zs_gather_stats_get(zs_world_gather(c->w, r), &st);
        s.bytes += tier == ZS_OFFLOAD_NVME ? st.bytes_nvme : st.bytes_host;
        s.passes += st.passes;
        s.adopted += st.passes_adopted;
        s.wasted += st.passes_wasted;
    }
    return s;
}

/* Shard bytes read for the static buckets of torder[first, first + count), all ranks. */
static uint64_t range_bytes(ctx_t *c, zs_pass_range r) {
    const int *ord;
    int ninf;
    zs_gather_order(zs_world_gather(c->w, 0), &ord, &ninf);
    uint64_t s = 0;
    for (int i = r.first; i < r.first + r.count; i++)
        if (ord[i] >= 0) s += (uint64_t)zs_partition_shard_bytes(c->m, ord[i], c->nr) * (uint64_t)c->nr;
    return s;
}

/* Cuts r into n ranges, none starting at a mark. */
static int split(ctx_t *c, zs_pass_range r, int n, zs_pass_range *out) {
    const int *ord;
    int ninf, k = 0, at = r.first, end = r.first + r.count;
    zs_gather_order(zs_world_gather(c->w, 0), &ord, &ninf);
    for (int i = 1; i <= n; i++) {
        int cut = i == n ? end : r.first + r.count * i / n;
        while (cut < end && zs_pass_is_experts(ord[cut])) cut++;
        if (cut <= at) continue;
        out[k++] = (zs_pass_range){at, cut - at};
        at = cut;
    }
    return k;
}

static void check_ranks(ctx_t *c, const char *what) {
    for (int r = 0; r < c->nr; r++) {
        CHECK(c->bad[r] == 0, "%s: rank %d: every bucket bit for bit (%d differ)", what, r, c->bad[r]);
        CHECK(c->fail[r] == 0, "%s: rank %d: no failure (%s)", what, r, c->msg[r]);
        c->bad[r] = c->fail[r] = 0;
    }
}

static void check_config(const char *label, const char *dir, int ranks, int tier, const char *nvme) {
    zs_engine_opts o;
    zs_engine_opts_default(&o);
    o.model_dir = dir;
    o.max_seqs = 1;
    o.ranks = ranks;
    o.gather.tier = tier;
    o.nvme_path = nvme;
    o.device = ZS_DEVICE_CPU;
    zs_engine *e;
    char what[160];
    snprintf(what, sizeof what, "%s ranks %d %s", label, ranks, tier == ZS_OFFLOAD_NVME ? "nvme" : "cpu");
    int rc = zs_engine_open(&o, &e);
    CHECK(rc == 0, "%s: open: %s", what, zs_errmsg());
    if (rc < 0) return;
    ctx_t *c = calloc(1, sizeof *c);
    c->w = zs_engine_world(e);
    c->m = zs_engine_model(e);
    c->nr = ranks;
    c->nb = zs_model_n_buckets(c->m);
    c->n_exp = zs_model_config_get(c->m)->n_experts;
    c->moe = c->n_exp > 0;
    c->direct = ranks == 1 && tier != ZS_OFFLOAD_NVME;
    c->ref = calloc((size_t)c->nb, sizeof *c->ref);
    c->full = calloc((size_t)c->nb, sizeof *c->full);
    for (int b = 0; b < c->nb; b++) {
        size_t sh = zs_partition_shard_bytes(c->m, b, ranks);
        c->full[b] = sh * (size_t)ranks;
        c->ref[b] = malloc(c->full[b] + 1);
        for (int r = 0; r < ranks && sh; r++)
            CHECK(zs_gather_read_shard(zs_world_gather(c->w, r), b, c->ref[b] + (size_t)r * sh) == 0,
                  "%s: read shard %d: %s", what, b, zs_errmsg());
    }
    zs_gather *g0 = zs_world_gather(c->w, 0);
    const int *ord;
    int ninf, n = zs_gather_order(g0, &ord, &ninf);
    zs_pass_range INF = zs_gather_kind_range(g0, ZS_PASS_INFER), TR = zs_gather_kind_range(g0, ZS_PASS_TRAIN),
                  BW = zs_gather_kind_range(g0, ZS_PASS_BWD);
    CHECK(INF.first == 0 && INF.count == ninf && TR.first == 0 && TR.count == n && BW.first == ninf &&
              BW.count == n - ninf && ninf > 0 && n > ninf,
          "%s: the kinds' ranges (%d of %d)", what, ninf, n);
    int counted = !c->direct; /* direct mode moves nothing: only the bytes are checked */

    /* (1) an inference pass, a training pass, a backward pass: the bytes */
    run_pass(c, INF, NULL);
    run_pass(c, TR, NULL);
    run_pass(c, BW, NULL);
    check_ranks(c, what);

    /* (2) speculation off; the speculated pass consumed: nothing is pending */
    set_spec(c, 0);
    zs_world_run(c->w, settle_job, c);
    cnt_t s0 = counters(c, tier);

    /* (3) a training pass in slices: forward in 3, backward in 2, each declared one begin ahead */
    zs_pass_range sl[8];
    int k = split(c, (zs_pass_range){0, ninf}, 3, sl);
    k += split(c, BW, 2, sl + k);
    CHECK(k == 5, "%s: five slices (%d)", what, k);
    uint64_t want = 0;
    for (int i = 0; i < k; i++) {
        run_pass(c, sl[i], i + 1 < k ? &sl[i + 1] : NULL);
        want += range_bytes(c, sl[i]);
    }
    check_ranks(c, what);
    cnt_t s1 = counters(c, tier);
    CHECK(s1.passes - s0.passes == (long)k * ranks, "%s: slices: %d passes begun per rank", what, k);
    if (counted) {
        CHECK(s1.wasted == s0.wasted && s1.adopted == s0.adopted, "%s: slices: nothing wasted or adopted", what);
        if (!c->moe)
            CHECK(s1.bytes - s0.bytes == want && want == range_bytes(c, TR),
                  "%s: slices: each bucket read once per slice (%llu bytes, want %llu)", what,
                  (unsigned long long)(s1.bytes - s0.bytes), (unsigned long long)want);
    }

    /* (4) adoption: speculation on, an inference pass (the next one speculated), speculation off,
     * then a training pass: it takes over the speculated inference pass */
    s0 = counters(c, tier);
    set_spec(c, 1);
    run_pass(c, INF, NULL);
    set_spec(c, 0);
    run_pass(c, TR, NULL);
    check_ranks(c, what);
    s1 = counters(c, tier);
    if (counted) {
        CHECK(s1.adopted - s0.adopted == ranks && s1.wasted == s0.wasted, "%s: adoption: adopted %ld, wasted %ld", what,
              s1.adopted - s0.adopted, s1.wasted - s0.wasted);
        if (!c->moe)
            CHECK(s1.bytes - s0.bytes == range_bytes(c, INF) + range_bytes(c, TR),
                  "%s: adoption: no extra pass read (%llu bytes, want %llu)", what,
                  (unsigned long long)(s1.bytes - s0.bytes),
                  (unsigned long long)(range_bytes(c, INF) + range_bytes(c, TR)));
    }

    /* (5) a shard written between passes (nvme: speculation off, the training pass above took the
     * speculated pass, nothing declared): the same bytes back, so the later checks still hold */
    for (int r = 0; r < ranks; r++) {
        int b = zs_bucket_layer(0);
        size_t sh = zs_partition_shard_bytes(c->m, b, ranks);
        CHECK(zs_gather_write_shard(zs_world_gather(c->w, r), b, c->ref[b] + (size_t)r * sh) == 0,
              "%s: write_shard after a training pass: %s", what, zs_errmsg());
    }

    /* (6) adoption with speculation on through the training pass: what it speculates after is
     * consumed by settle (wasted) */
    s0 = counters(c, tier);
    set_spec(c, 1);
    run_pass(c, INF, NULL);
    run_pass(c, TR, NULL);
    set_spec(c, 0);
    zs_world_run(c->w, settle_job, c);
    check_ranks(c, what);
    s1 = counters(c, tier);
    if (counted) {
        CHECK(s1.adopted - s0.adopted == ranks && s1.wasted - s0.wasted == ranks,
              "%s: speculation on: adopted %ld, wasted %ld (settle)", what, s1.adopted - s0.adopted,
              s1.wasted - s0.wasted);
        if (!c->moe)
            CHECK(s1.bytes - s0.bytes == 2 * range_bytes(c, INF) + range_bytes(c, TR),
                  "%s: speculation on: inference + training + the speculated inference pass", what);
    }

    /* (7) a wrong declaration: BWD declared, INFER begun: the BWD pass is consumed first */
    s0 = counters(c, tier);
    run_pass(c, INF, &BW);
    run_pass(c, INF, NULL);
    check_ranks(c, what);
    s1 = counters(c, tier);
    if (counted) {
        CHECK(s1.wasted - s0.wasted == ranks && s1.adopted == s0.adopted, "%s: wrong declaration: wasted %ld", what,
              s1.wasted - s0.wasted);
        if (!c->moe)
            CHECK(s1.bytes - s0.bytes == 2 * range_bytes(c, INF) + range_bytes(c, BW),
                  "%s: wrong declaration: the declared pass read once", what);
    }

    /* (8) a declared forward slice, then the whole training pass begun: adopted */
    s0 = counters(c, tier);
    run_pass(c, INF, &sl[0]);
    run_pass(c, TR, NULL);
    check_ranks(c, what);
    s1 = counters(c, tier);
    if (counted)
        CHECK(s1.adopted - s0.adopted == ranks && s1.wasted == s0.wasted, "%s: a declared slice grows into its pass",
              what);

    /* (9) a declared training pass, then a shorter pass from the same item: consumed, not adopted */
    s0 = counters(c, tier);
    run_pass(c, INF, &TR);
    run_pass(c, sl[0], NULL);
    check_ranks(c, what);
    s1 = counters(c, tier);
    if (counted)
        CHECK(s1.wasted - s0.wasted == ranks && s1.adopted == s0.adopted, "%s: a longer declared pass is consumed",
              what);

    /* (10) a write after the wrong declarations: nothing pending (nvme asserts it) */
    for (int r = 0; r < ranks; r++) {
        int b = zs_bucket_head(c->m);
        size_t sh = zs_partition_shard_bytes(c->m, b, ranks);
        CHECK(zs_gather_write_shard(zs_world_gather(c->w, r), b, c->ref[b] + (size_t)r * sh) == 0,
              "%s: write_shard: %s", what, zs_errmsg());
    }
    run_pass(c, TR, NULL);
    check_ranks(c, what);
    fprintf(stderr, "%s: %d items in the training order, %d in the inference pass\n", what, n, ninf);

    set_spec(c, 1); /* serving again: the world is freed with a speculated pass in flight */
    for (int b = 0; b < c->nb; b++) free(c->ref[b]);
    free(c->ref);
    free(c->full);
    free(c);
    zs_engine_free(e);
}

static int make_moe(const char *dir) {
    zs_init_opts io;
    int rc = zs_init_opts_default("qwen3moe", &io);
    if (rc < 0) return rc;
    zs_model_config *c = &io.cfg;
    c->n_layers = 3;
    c->dim = 64;
    c->n_heads = 4;
    c->n_kv_heads = 2;
    c->head_dim = 16;
    c->vocab_size = 300;
    c->max_seq = 64;
    c->n_experts = 8;
    c->n_experts_used = 2;
    c->moe_ffn_dim = 32;
    c->ffn_dim = 96;
    io.seed = 31;
    if ((rc = zs_config_override(c, "{}", "test-gather-range")) < 0) return rc;
    return zs_init_model_write(&io, dir);
}

int main(void) {
    zs_log_set_level(ZS_LOG_WARN);
    char dense[4096], moe[4096], nvme[4096];
    tu_model_dir(dense, sizeof dense, "stories260K");
    tu_tmpdir(moe, sizeof moe, "range-moe");
    tu_tmpdir(nvme, sizeof nvme, "range-nvme");
    int mrc = make_moe(moe);
    CHECK(mrc == 0, "init-model (qwen3moe): %s", zs_errmsg());
    for (int ranks = 1; ranks <= MAXR; ranks++)
        for (int tier = ZS_OFFLOAD_CPU; tier <= ZS_OFFLOAD_NVME; tier++) {
            check_config("stories260K", dense, ranks, tier, nvme);
            if (mrc == 0) check_config("qwen3moe", moe, ranks, tier, nvme);
        }
    tu_rmdir(nvme);
    tu_rmdir(moe);
    if (tu_failures == 0) fprintf(stderr, "test-gather-range: %d checks passed\n", tu_checks);
    return tu_finish("test-gather-range");
}
