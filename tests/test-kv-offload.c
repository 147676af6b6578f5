/* test-kv-offload.c — the KV cache below memory (--kv-offload) and preemption.
 *
 *   - kvtier: records put and read back bit for bit in host memory and in an NVMe file, slots
 *     reused, wrong sizes and unused slots refused; under a file size limit (a full disk) a put
 *     fails with ZS_ENOSPC and the records already there still read back;
 *   - kvswap: a sequence's K/V (prefix-shared blocks included, and a sliding-window ring) swapped
 *     out, the cache reused by others, swapped back in bit for bit; no room: ZS_ENOSPC, nothing
 *     changed;
 *   - the scheduler: 200 mixed requests on stories260K (4 shared prefixes, tails, greedy and
 *     seeded sampling, logprobs, 4..40 tokens) with a KV budget of 14 blocks, where one request
 *     needs up to 13: tokens and logprob bits are those of a cache that holds everything, with
 *     the tier in host memory, on NVMe, and on a "full disk" (a file size limit: preempted
 *     sequences are recomputed instead); sequences were swapped (or recomputed) in each run,
 *     and nothing is left held or swapped at the end; evicted prefix blocks came back from the
 *     tier in those runs (kvprefix: unit checks below too, with a persistent file reopened, a
 *     torn record dropped and another model's file started over); with speculative decoding (draft trees:
 *     swapped sequences carry their pending K/V moves) greedy answers are those of plain decoding.
 *     All of it twice: by default (the youngest swapped out whole), and with --kv-stream (layer
 *     streaming, kvstream.h: the youngest keep running with their K/V read from the tier a layer
 *     at a time and written behind, their last block growing in memory and moved once full;
 *     on the full disk, the sequences whose blocks could not be written are recomputed). */
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common.h"
#include "config.h"
#include "dsconfig.h"
#include "kvprefix.h"
#include "kvswap.h"
#include "kvtier.h"
#include "model.h"
#include "sched.h"
#include "spec.h"
#include "testutil.h"

static char g_dir[4096];

/* ---------- kvtier ---------- */

static void fill(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)((i * 131u + seed * 7919u) >> 3);
}

static void test_tier(int kind) {
    const char *name = kind == ZS_KVTIER_CPU ? "cpu" : "nvme";
    size_t rb = 5000; /* not a multiple of 4096: the file's records are padded */
    zs_kvtier *t;
    CHECK(zs_kvtier_open(kind, g_dir, rb, &t) == 0, "%s tier: %s", name, zs_errmsg());
    if (!t) return;
    unsigned char a[5000], b[5000], got[5000];
    fill(a, sizeof a, 1);
    fill(b, sizeof b, 2);
    struct iovec ia[2] = {{a, 1000}, {a + 1000, 4000}}, ib[1] = {{b, 5000}};
    int sa = -1, sb = -1;
    CHECK(zs_kvtier_put(t, ia, 2, 11, &sa) == 0 && zs_kvtier_put(t, ib, 1, 12, &sb) == 0 && sa != sb, "%s: two puts", name);
    struct iovec ig[3] = {{got, 10}, {got + 10, 4090}, {got + 4100, 900}};
    CHECK(zs_kvtier_get(t, sa, ig, 3) == 0 && !memcmp(got, a, sizeof a), "%s: record a back bit for bit", name);
    CHECK(zs_kvtier_get(t, sb, ig, 3) == 0 && !memcmp(got, b, sizeof b), "%s: record b back bit for bit", name);
    struct iovec bad[1] = {{got, 4999}};
    CHECK(zs_kvtier_put(t, bad, 1, 13, &sa) == ZS_EINVAL && zs_kvtier_get(t, sb, bad, 1) == ZS_EINVAL, "%s: wrong size refused",
          name);
    zs_kvtier_drop(t, sa);
    CHECK(zs_kvtier_get(t, sa, ig, 3) == ZS_EINVAL, "%s: a dropped slot is not read", name);
    int sc = -1;
    CHECK(zs_kvtier_put(t, ib, 1, 14, &sc) == 0 && sc == sa, "%s: the dropped slot is reused (%d)", name, sc);
    zs_kvtier_stats st;
    zs_kvtier_stats_get(t, &st);
    CHECK(st.puts == 3 && st.gets == 2 && st.slots_used == 2, "%s: counters (%llu puts, %llu gets, %d used)", name,
          (unsigned long long)st.puts, (unsigned long long)st.gets, st.slots_used);
    if (kind == ZS_KVTIER_NVME) {
        /* a full disk: the file may not grow past its 2 records */
        struct rlimit old, lim;
        getrlimit(RLIMIT_FSIZE, &old);
        lim = old;
        lim.rlim_cur = 2 * 8192;
        signal(SIGXFSZ, SIG_IGN);
        CHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0, "setrlimit");
        int sd = -1;
        CHECK(zs_kvtier_put(t, ia, 2, 15, &sd) == ZS_ENOSPC, "nvme: a put past the file size limit is ZS_ENOSPC: %s",
              zs_errmsg());
        CHECK(strstr(zs_errmsg(), "full") != NULL, "the message says the disk is full: %s", zs_errmsg());
        setrlimit(RLIMIT_FSIZE, &old);
        CHECK(zs_kvtier_get(t, sb, ig, 3) == 0 && !memcmp(got, b, sizeof b), "nvme: after the full disk, b still reads back");
        zs_kvtier_stats_get(t, &st);
        CHECK(st.put_errors == 1 && st.slots_used == 2, "nvme: one put error counted, still 2 records");
    }
    zs_kvtier_free(t);
    zs_kvtier *x = NULL;
    if (kind == ZS_KVTIER_NVME) {
        CHECK(zs_kvtier_open(kind, "/nonexistent/kv", rb, &x) == ZS_ENOTFOUND && strstr(zs_errmsg(), "/nonexistent/kv"),
              "nvme: a missing directory is named: %s", zs_errmsg());
        CHECK(zs_kvtier_open(kind, NULL, rb, &x) == ZS_EINVAL, "nvme: no directory: %s", zs_errmsg());
    }
}

/* ---------- kvswap ---------- */

static void seq_fill(zs_kvcache *kv, int seq, int len, int kv_dim, unsigned seed) {
    float k[64], v[64];
    for (int p = 0; p < len; p++)
        for (int l = 0; l < 2; l++) {
            for (int d = 0; d < kv_dim; d++) {
                k[d] = (float)(seed * 1000 + p * 10 + d) * 0.001f + (float)l;
                v[d] = -k[d] * 1.5f;
            }
            zs_kv_write(kv, l, seq, p, k, v);
        }
}

static int seq_same(zs_kvcache *kv, int seq, int len, int kv_dim, unsigned seed, int from) {
    zs_kvcache *ref;
    if (zs_kv_init(2, kv_dim, 64, 1, 512, &ref) < 0) return 0;
    int r;
    int ok = zs_kv_seq_open(ref, &r) == 0 && zs_kv_seq_reserve(ref, r, len) == 0;
    seq_fill(ref, r, len, kv_dim, seed);
    for (int p = from; ok && p < len; p++)
        for (int l = 0; l < 2; l++)
            ok &= !memcmp(zs_kv_k(kv, l, seq, p), zs_kv_k(ref, l, r, p), (size_t)kv_dim * 4) &&
                  !memcmp(zs_kv_v(kv, l, seq, p), zs_kv_v(ref, l, r, p), (size_t)kv_dim * 4);
    zs_kv_free(ref);
    return ok;
}

static void test_swap(int kind, int window) {
    const int kv_dim = 8;
    zs_kvcache *kv;
    CHECK(zs_kv_init(2, kv_dim, 10, 4, 512, &kv) == 0, "kv: %s", zs_errmsg());
    if (window) CHECK(zs_kv_set_window(kv, 40, 8) == 0 && zs_kv_ring(kv) > 0, "a window ring");
    else CHECK(zs_kv_prefix_enable(kv) == 0, "prefix cache");
    zs_kvtier *t;
    CHECK(zs_kvtier_open(kind, g_dir, zs_kv_swap_rec_bytes(kv), &t) == 0, "tier: %s", zs_errmsg());
    int a, b;
    int len = window ? 120 : 70; /* a ring wraps; without one, 5 blocks */
    CHECK(zs_kv_seq_open(kv, &a) == 0 && zs_kv_seq_reserve(kv, a, len) == 0, "seq a");
    seq_fill(kv, a, len, kv_dim, 3);
    int32_t toks[16] = {0};
    uint64_t h = zs_kv_prefix_hash(0, 0, toks);
    if (!window) {
        /* block 0 shared with b: swapping a out leaves it to b */
        zs_kv_seq_publish(kv, a, 0, h);
        CHECK(zs_kv_seq_open(kv, &b) == 0 && zs_kv_seq_share(kv, b, &h, 1) == 1, "b shares a's first block");
    }
    int from = window ? len - 40 : 0; /* a ring keeps the window's positions only */
    zs_kv_swapped *sw = NULL;
    CHECK(zs_kv_swap_out(kv, a, t, &sw) == 0, "swap out: %s", zs_errmsg());
    CHECK(sw && zs_kv_swapped_blocks(sw) == (window ? zs_kv_ring(kv) : 5), "its blocks");
    if (!window) {
        CHECK(zs_kv_used_blocks(kv) == 1, "only b's shared block is held (%d)", zs_kv_used_blocks(kv));
        zs_kv_seq_close(kv, b);
    }
    /* others take (and overwrite) the freed blocks: 9 of 10 (8 with a ring of 4 per sequence) */
    int c, d;
    CHECK(zs_kv_seq_open(kv, &c) == 0 && zs_kv_seq_reserve(kv, c, 64) == 0 && zs_kv_seq_open(kv, &d) == 0 &&
          zs_kv_seq_reserve(kv, d, 80) == 0, "c and d take most of the cache: %s", zs_errmsg());
    seq_fill(kv, c, 64, kv_dim, 9);
    seq_fill(kv, d, 80, kv_dim, 10);
    int s2 = -1;
    CHECK(zs_kv_swap_in(kv, sw, t, &s2) == ZS_ENOSPC, "no room: ZS_ENOSPC");
    zs_kv_seq_close(kv, c);
    zs_kv_seq_close(kv, d);
    CHECK(zs_kv_swap_in(kv, sw, t, &s2) == 0, "swap in: %s", zs_errmsg());
    CHECK(zs_kv_seq_len(kv, s2) == len, "its length back (%d)", zs_kv_seq_len(kv, s2));
    CHECK(seq_same(kv, s2, len, kv_dim, 3, from), "%s%s: K and V back bit for bit", kind == ZS_KVTIER_CPU ? "cpu" : "nvme",
          window ? ", window ring" : "");
    zs_kvtier_stats st;
    zs_kvtier_stats_get(t, &st);
    CHECK(st.slots_used == 0, "no record left in the tier");
    zs_kv_seq_close(kv, s2);
    CHECK(zs_kv_used_blocks(kv) == 0, "nothing held");
    zs_kvtier_free(t);
    zs_kv_free(kv);
}

/* ---------- kvprefix ---------- */

/* a cache of 6 blocks with the prefix cache on, over tier t; 3 published blocks of one prompt */
static void prefix_seq(zs_kvcache *kv, const uint64_t *h, unsigned seed) {
    int a;
    CHECK(zs_kv_seq_open(kv, &a) == 0 && zs_kv_seq_reserve(kv, a, 48) == 0, "a prompt of 3 blocks");
    seq_fill(kv, a, 48, 8, seed);
    for (int j = 0; j < 3; j++) zs_kv_seq_publish(kv, a, j, h[j]);
    zs_kv_seq_close(kv, a);
}

static void test_prefix(void) {
    uint64_t h[3];
    int32_t toks[48];
    for (int i = 0; i < 48; i++) toks[i] = 7 + i;
    for (int j = 0; j < 3; j++) h[j] = zs_kv_prefix_hash(j ? h[j - 1] : 0, 0, toks + 16 * j);
    /* host memory: evicted blocks go down and come back bit for bit */
    zs_kvcache *kv;
    CHECK(zs_kv_init(2, 8, 6, 4, 512, &kv) == 0 && zs_kv_prefix_enable(kv) == 0, "kv");
    zs_kvtier *t;
    CHECK(zs_kvtier_open(ZS_KVTIER_CPU, NULL, zs_kv_swap_rec_bytes(kv), &t) == 0, "tier");
    zs_kvprefix *p;
    CHECK(zs_kvprefix_open(kv, t, 8, 0, &p) == 0, "prefix tier: %s", zs_errmsg());
    prefix_seq(kv, h, 5);
    int b;
    CHECK(zs_kv_seq_open(kv, &b) == 0 && zs_kv_seq_reserve(kv, b, 96) == 0, "another sequence takes every block");
    CHECK(zs_kv_prefix_lookup(kv, h, 3) == 0 && zs_kvprefix_lookup(p, h, 3) == 3, "the 3 cached blocks went down");
    zs_kv_seq_close(kv, b);
    int c;
    CHECK(zs_kv_seq_open(kv, &c) == 0 && zs_kv_seq_share(kv, c, h, 3) == 0, "memory has none of them");
    CHECK(zs_kvprefix_take(p, c, h, 3) == 3 && zs_kv_seq_len(kv, c) == 48, "all 3 taken back");
    CHECK(seq_same(kv, c, 48, 8, 5, 0), "their K and V bit for bit");
    CHECK(zs_kv_prefix_lookup(kv, h, 3) == 3, "and published in memory again");
    zs_kv_seq_close(kv, c);
    zs_kvprefix_stats ps;
    zs_kvprefix_stats_get(p, &ps);
    CHECK(ps.stored == 3 && ps.taken == 3 && ps.held == 3, "counters: %llu stored, %llu taken, %d held",
          (unsigned long long)ps.stored, (unsigned long long)ps.taken, ps.held);
    zs_kvprefix_free(p);
    zs_kvtier_free(t);
    zs_kv_free(kv);

    /* a persistent file: written through, back after a "restart", torn records dropped */
    CHECK(zs_kv_init(2, 8, 6, 4, 512, &kv) == 0 && zs_kv_prefix_enable(kv) == 0, "kv");
    size_t rec = zs_kv_swap_rec_bytes(kv);
    CHECK(zs_kvtier_open_persistent(g_dir, "prefix.kvt", rec, 42, &t) == 0, "persistent tier: %s", zs_errmsg());
    CHECK(zs_kvprefix_open(kv, t, 8, 1, &p) == 0, "prefix tier");
    int a;
    CHECK(zs_kv_seq_open(kv, &a) == 0 && zs_kv_seq_reserve(kv, a, 48) == 0, "a prompt");
    seq_fill(kv, a, 48, 8, 6);
    for (int j = 0; j < 3; j++) {
        zs_kv_seq_publish(kv, a, j, h[j]);
        zs_kvprefix_publish(p, a, j, h[j]);
    }
    zs_kv_seq_close(kv, a);
    zs_kvprefix_free(p);
    zs_kvtier_free(t);
    zs_kv_free(kv);
    CHECK(zs_kv_init(2, 8, 6, 4, 512, &kv) == 0 && zs_kv_prefix_enable(kv) == 0, "a new cache (a restart)");
    CHECK(zs_kvtier_open_persistent(g_dir, "prefix.kvt", rec, 42, &t) == 0 && zs_kvprefix_open(kv, t, 8, 1, &p) == 0,
          "the file again");
    zs_kvprefix_stats_get(p, &ps);
    CHECK(ps.restored == 3 && zs_kvprefix_lookup(p, h, 3) == 3, "its 3 blocks are back (%d)", ps.restored);
    CHECK(zs_kv_seq_open(kv, &c) == 0 && zs_kvprefix_take(p, c, h, 3) == 3 && seq_same(kv, c, 48, 8, 6, 0),
          "and read back bit for bit");
    zs_kv_seq_close(kv, c);
    zs_kvprefix_free(p);
    zs_kvtier_free(t);
    /* a torn write: the second record's payload damaged on disk */
    char path[4200];
    snprintf(path, sizeof path, "%s/prefix.kvt", g_dir);
    FILE *f = fopen(path, "r+b");
    CHECK(f != NULL, "open the file");
    if (f) {
        size_t stride = (64 + rec + 4095) / 4096 * 4096;
        fseek(f, (long)(4096 + stride + 64 + 100), SEEK_SET);
        fputc(0x5a, f);
        fputc(0xa5, f);
        fclose(f);
    }
    zs_kv_free(kv);
    CHECK(zs_kv_init(2, 8, 6, 4, 512, &kv) == 0 && zs_kv_prefix_enable(kv) == 0, "a new cache");
    CHECK(zs_kvtier_open_persistent(g_dir, "prefix.kvt", rec, 42, &t) == 0 && zs_kvprefix_open(kv, t, 8, 1, &p) == 0,
          "the damaged file opens");
    CHECK(zs_kv_seq_open(kv, &c) == 0 && zs_kvprefix_take(p, c, h, 3) == 1 && zs_kv_seq_len(kv, c) == 16,
          "the run stops at the torn block: 1 taken, the sequence holds 16 positions (%d)", zs_kv_seq_len(kv, c));
    zs_kvprefix_stats_get(p, &ps);
    CHECK(ps.dropped == 1 && zs_kvprefix_lookup(p, h + 1, 1) == 0, "the torn block is dropped");
    zs_kv_seq_close(kv, c);
    zs_kvprefix_free(p);
    zs_kvtier_free(t);
    /* another key (another model): the file starts over */
    CHECK(zs_kvtier_open_persistent(g_dir, "prefix.kvt", rec, 43, &t) == 0 && zs_kvprefix_open(kv, t, 8, 1, &p) == 0,
          "another key");
    zs_kvprefix_stats_get(p, &ps);
    CHECK(ps.restored == 0 && zs_kvprefix_lookup(p, h, 1) == 0, "nothing of the other model's comes back");
    zs_kvprefix_free(p);
    zs_kvtier_free(t);
    zs_kv_free(kv);
}

/* ---------- requests through the scheduler ---------- */

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done, finish, n_tok, err;
    int32_t toks[64];
    uint32_t lp_bits[64];
} req_t;

static void on_token(void *ud, int32_t tok, const char *t, size_t n, float lp, const int32_t *ti, const float *tl,
                     int nt) {
    (void)t; (void)n; (void)ti; (void)tl; (void)nt;
    req_t *q = ud;
    pthread_mutex_lock(&q->mu);
    if (q->n_tok < 64) {
        memcpy(&q->lp_bits[q->n_tok], &lp, 4);
        q->toks[q->n_tok++] = tok;
    }
    pthread_mutex_unlock(&q->mu);
}

static void on_done(void *ud, int finish, const char *t, size_t n, int np, int ng, int err, const char *msg) {
    (void)t; (void)n; (void)np; (void)ng;
    req_t *q = ud;
    if (err) fprintf(stderr, "request failed: %s\n", msg);
    pthread_mutex_lock(&q->mu);
    q->finish = finish;
    q->err = err;
    q->done = 1;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

#define N_REQ 200
#define WAVE 25

static int make_prompt(int i, int32_t *p) {
    static const int plen[4] = {37, 64, 100, 150};
    int k = i % 4, n = 0;
    p[n++] = 1;
    for (int t = 1; t < plen[k]; t++) p[n++] = 5 + (t * 37 + k * 101) % 500;
    int tail = 1 + (i * 7) % 12;
    for (int t = 0; t < tail; t++) p[n++] = 5 + (i * 13 + t * 29) % 500;
    return n;
}

typedef struct {
    int32_t toks[N_REQ][64];
    uint32_t lps[N_REQ][64];
    int n[N_REQ], finish[N_REQ];
    zs_sched_stats st;
} run_out;

/* kv_blocks 0: the default cache (everything fits); fsize > 0: the NVMe tier's file may not grow
 * past fsize bytes */
static void run_mixed(int kv_blocks, int kind, int spec, size_t fsize, int stream, run_out *o) {
    char dir[4096];
    tu_model_dir(dir, sizeof dir, "stories260K");
    zs_engine_opts eo;
    zs_engine_opts_default(&eo);
    eo.model_dir = dir;
    eo.max_seqs = 16;
    eo.max_context = 208; /* 13 blocks: the longest request has 202 positions */
    eo.kv_offload = kind;
    eo.kv_nvme_path = kind == ZS_OFFLOAD_NVME ? g_dir : NULL;
    eo.kv_stream = stream;
    zs_engine *e = NULL;
    if (kv_blocks) {
        /* the block size of this model: a first engine says it */
        CHECK(zs_engine_open(&eo, &e) == 0, "engine: %s", zs_errmsg());
        if (!e) return;
        const zs_model_config *c = zs_model_config_get(zs_engine_model(e));
        eo.kv_bytes = (size_t)kv_blocks * zs_kv_block_bytes(c->n_layers, c->n_kv_heads * c->head_dim, ZS_F32);
        zs_engine_free(e);
        e = NULL;
    }
    CHECK(zs_engine_open(&eo, &e) == 0, "engine: %s", zs_errmsg());
    if (!e) return;
    zs_spec *sp = NULL;
    if (spec) CHECK(zs_spec_ngram_new(1, 3, &sp) == 0, "ngram proposer");
    zs_sched_opts so = {16, 64, 256, 0, sp, 0, 0, spec ? 1 : 0, 0, 0, 0};
    zs_sched *s;
    if (zs_sched_new(e, &so, &s) < 0) {
        CHECK(0, "sched: %s", zs_errmsg());
        zs_engine_free(e);
        return;
    }
    struct rlimit old;
    getrlimit(RLIMIT_FSIZE, &old);
    if (fsize) {
        struct rlimit lim = old;
        lim.rlim_cur = fsize;
        signal(SIGXFSZ, SIG_IGN);
        setrlimit(RLIMIT_FSIZE, &lim);
    }
    static req_t q[WAVE];
    int32_t p[200];
    for (int w0 = 0; w0 < N_REQ; w0 += WAVE) {
        for (int j = 0; j < WAVE; j++) {
            int i = w0 + j;
            memset(&q[j], 0, sizeof q[j]);
            pthread_mutex_init(&q[j].mu, NULL);
            pthread_cond_init(&q[j].cv, NULL);
            zs_req_params rp;
            memset(&rp, 0, sizeof rp);
            rp.prompt = p;
            rp.n_prompt = make_prompt(i, p);
            rp.max_tokens = 4 + (i * 7) % 37;
            zs_sampler_params_default(&rp.sampling);
            rp.sampling.temperature = i % 3 == 0 ? 0.0f : 0.9f;
            rp.sampling.seed = 1000 + (uint64_t)i;
            rp.top_logprobs = i % 5 == 0 ? 3 : 0;
            rp.ignore_eos = 1;
            zs_req_sink sink = {on_token, on_done, &q[j], NULL};
            int rc = zs_sched_submit(s, &rp, &sink, NULL);
            CHECK(rc == 0, "submit %d: %s", i, zs_errmsg());
            if (rc < 0) q[j].done = 1;
        }
        for (int j = 0; j < WAVE; j++) {
            int i = w0 + j;
            pthread_mutex_lock(&q[j].mu);
            while (!q[j].done) pthread_cond_wait(&q[j].cv, &q[j].mu);
            pthread_mutex_unlock(&q[j].mu);
            o->n[i] = q[j].n_tok;
            o->finish[i] = q[j].finish;
            memcpy(o->toks[i], q[j].toks, sizeof o->toks[i]);
            memcpy(o->lps[i], q[j].lp_bits, sizeof o->lps[i]);
        }
    }
    if (fsize) setrlimit(RLIMIT_FSIZE, &old);
    for (int t = 0; t < 400; t++) {
        zs_sched_stats_get(s, &o->st);
        if (o->st.kv_used == 0) break;
        usleep(5000);
    }
    if (kind) {
        zs_kvtier_stats ts;
        zs_kvtier_stats_get(zs_engine_kv_tier(e, 0), &ts);
        CHECK(ts.slots_used == 0, "no record left in the tier (%d)", ts.slots_used);
    }
    zs_sched_free(s);
    zs_spec_free(sp);
    zs_engine_free(e);
}

static int same_runs(const run_out *a, const run_out *b) {
    int same = 0;
    for (int i = 0; i < N_REQ; i++)
        same += a->n[i] == b->n[i] && a->finish[i] == b->finish[i] && !memcmp(a->toks[i], b->toks[i], sizeof a->toks[i]) &&
                !memcmp(a->lps[i], b->lps[i], sizeof a->lps[i]);
    return same;
}

static void test_mixed(void) {
    static run_out ref, cpu, nvme, spec, full, scpu, snvme, sspec, sfull;
    run_mixed(0, ZS_OFFLOAD_NONE, 0, 0, 0, &ref);
    int lengths = 0;
    for (int i = 0; i < N_REQ; i++) lengths += ref.n[i] == 4 + (i * 7) % 37 && ref.finish[i] == ZS_DONE_LENGTH;
    CHECK(lengths == N_REQ, "every request ran to its max_tokens (%d/%d)", lengths, N_REQ);
    CHECK(ref.st.kv_preempted == 0 && ref.st.kv_streamed == 0, "no preemption or streaming with room for everything");
    /* 14 blocks: the longest request needs 13 (162 + 40 positions). By default the youngest are
     * swapped out whole and wait */
    run_mixed(14, ZS_OFFLOAD_CPU, 0, 0, 0, &cpu);
    int n = same_runs(&ref, &cpu);
    CHECK(n == N_REQ, "swapping, tier in host memory: the same tokens and logprob bits, %d/%d", n, N_REQ);
    CHECK(cpu.st.kv_swap_outs > 0 && cpu.st.kv_swap_in_blocks == cpu.st.kv_swap_out_blocks && cpu.st.kv_recomputes == 0 &&
          cpu.st.kv_streamed == 0, "host tier: %llu sequences swapped out, %llu blocks out and in",
          (unsigned long long)cpu.st.kv_swap_outs, (unsigned long long)cpu.st.kv_swap_out_blocks);
    run_mixed(14, ZS_OFFLOAD_NVME, 0, 0, 0, &nvme);
    n = same_runs(&ref, &nvme);
    CHECK(n == N_REQ, "swapping, tier on NVMe: the same tokens and logprob bits, %d/%d", n, N_REQ);
    CHECK(nvme.st.kv_swap_outs > 0, "NVMe tier: %llu swapped out", (unsigned long long)nvme.st.kv_swap_outs);
    /* with speculative decoding (draft trees; sampled answers then differ from plain decoding's,
     * greedy ones do not): the greedy requests as without it */
    run_mixed(14, ZS_OFFLOAD_NVME, 1, 0, 0, &spec);
    int greedy = 0;
    n = 0;
    for (int i = 0; i < N_REQ; i += 3, greedy++)
        n += spec.n[i] == ref.n[i] && !memcmp(spec.toks[i], ref.toks[i], sizeof ref.toks[i]);
    CHECK(n == greedy && spec.st.kv_swap_outs > 0, "NVMe tier with draft trees: greedy answers the same, %d/%d (%llu swapped, "
          "%llu drafts accepted)", n, greedy, (unsigned long long)spec.st.kv_swap_outs, (unsigned long long)spec.st.spec_accepted);
    /* a full disk: the file holds 3 records, then preempted sequences are recomputed */
    run_mixed(14, ZS_OFFLOAD_NVME, 0, 3 * 8192, 0, &full);
    n = same_runs(&ref, &full);
    CHECK(n == N_REQ, "full disk (recompute): the same tokens and logprob bits, %d/%d", n, N_REQ);
    CHECK(full.st.kv_recomputes > 0, "full disk: %llu recomputed, %llu swapped", (unsigned long long)full.st.kv_recomputes,
          (unsigned long long)full.st.kv_swap_outs);
    CHECK(cpu.st.prefix_tier_hit_blocks > 0 && nvme.st.prefix_tier_hit_blocks > 0,
          "prefix blocks came back from the tier (host %llu, NVMe %llu) with the same bits",
          (unsigned long long)cpu.st.prefix_tier_hit_blocks, (unsigned long long)nvme.st.prefix_tier_hit_blocks);
    /* --kv-stream: sequences beyond memory keep running, their K/V read from the tier a layer at
     * a time; the same bits */
    run_mixed(14, ZS_OFFLOAD_CPU, 0, 0, 1, &scpu);
    n = same_runs(&ref, &scpu);
    CHECK(n == N_REQ, "streaming, tier in host memory: the same tokens and logprob bits, %d/%d", n, N_REQ);
    CHECK(scpu.st.kv_streamed > 0 && scpu.st.kv_stream_loads > 0 && scpu.st.kv_stream_stores > 0 &&
          scpu.st.kv_stream_write_errors == 0,
          "host tier: %llu sequences streamed (%llu block-layers read, %llu written), %llu preempted (swapping: %llu)",
          (unsigned long long)scpu.st.kv_streamed, (unsigned long long)scpu.st.kv_stream_loads,
          (unsigned long long)scpu.st.kv_stream_stores, (unsigned long long)scpu.st.kv_preempted,
          (unsigned long long)cpu.st.kv_preempted);
    run_mixed(14, ZS_OFFLOAD_NVME, 0, 0, 1, &snvme);
    n = same_runs(&ref, &snvme);
    CHECK(n == N_REQ && snvme.st.kv_streamed > 0 && snvme.st.kv_stream_loads > 0,
          "streaming, tier on NVMe: the same tokens and logprob bits, %d/%d (%llu streamed)", n, N_REQ,
          (unsigned long long)snvme.st.kv_streamed);
    CHECK(scpu.st.kv_stream_settled + snvme.st.kv_stream_settled > 0,
          "full blocks streamed sequences grew in memory went to the tier (%llu, %llu)",
          (unsigned long long)scpu.st.kv_stream_settled, (unsigned long long)snvme.st.kv_stream_settled);
    run_mixed(14, ZS_OFFLOAD_NVME, 1, 0, 1, &sspec);
    n = 0;
    for (int i = 0; i < N_REQ; i += 3) n += sspec.n[i] == ref.n[i] && !memcmp(sspec.toks[i], ref.toks[i], sizeof ref.toks[i]);
    CHECK(n == greedy && sspec.st.kv_streamed > 0, "streaming with draft trees: greedy answers the same, %d/%d (%llu streamed)",
          n, greedy, (unsigned long long)sspec.st.kv_streamed);
    /* a full disk while streaming: the writes that fail lose blocks, those sequences are
     * recomputed and the rest is served from memory */
    run_mixed(14, ZS_OFFLOAD_NVME, 0, 3 * 8192, 1, &sfull);
    n = same_runs(&ref, &sfull);
    CHECK(n == N_REQ && sfull.st.kv_recomputes > 0, "streaming on a full disk: the same tokens and logprob bits, %d/%d "
          "(%llu recomputed, %llu failed writes)", n, N_REQ, (unsigned long long)sfull.st.kv_recomputes,
          (unsigned long long)sfull.st.kv_stream_write_errors);
    fprintf(stderr, "preemptions: host %llu (%llu blocks), nvme %llu (%llu blocks), full disk %llu swapped + %llu recomputed; "
            "streaming: %llu streamed + %llu preempted (host, %llu blocks settled), %llu + %llu (nvme)\n",
            (unsigned long long)cpu.st.kv_preempted, (unsigned long long)cpu.st.kv_swap_out_blocks,
            (unsigned long long)nvme.st.kv_preempted, (unsigned long long)nvme.st.kv_swap_out_blocks,
            (unsigned long long)full.st.kv_swap_outs, (unsigned long long)full.st.kv_recomputes,
            (unsigned long long)scpu.st.kv_streamed, (unsigned long long)scpu.st.kv_preempted,
            (unsigned long long)scpu.st.kv_stream_settled,
            (unsigned long long)snvme.st.kv_streamed, (unsigned long long)snvme.st.kv_preempted);
}

int main(void) {
    if (tu_tmpdir(g_dir, sizeof g_dir, "kv-offload") < 0) return 1;
    test_tier(ZS_KVTIER_CPU);
    test_tier(ZS_KVTIER_NVME);
    test_swap(ZS_KVTIER_CPU, 0);
    test_swap(ZS_KVTIER_NVME, 0);
    test_swap(ZS_KVTIER_NVME, 1);
    test_prefix();
    test_mixed();
    tu_rmdir(g_dir);
    return tu_finish("test-kv-offload");
}
