/* test-prefix-cache.c — prefix caching and constrained decoding in the scheduler.
 *
 * Prefix cache:
 *   - kvcache unit checks: reference counts, the LRU of released cached blocks, eviction under
 *     pressure, no leaked blocks, refusal with a sliding-window ring;
 *   - 200 mixed requests on stories260K (4 shared prompt prefixes of 37..150 tokens with
 *     different tails; greedy and seeded sampling; logprobs), with 1 and 2 ranks, sent in waves:
 *     tokens and logprob bits with the cache on are those with it off; the cache has hits on
 *     and none off; a KV budget small enough to force evictions gives the same bits again;
 *     no block stays held at the end.
 * Constrained decoding (zs_req_constraint): seeded sampled answers under a JSON-Schema grammar
 * are complete values the matcher accepts and jansson parses, with the schema's keys and enum
 * values; forced prefix and suffix tokens come out where they belong; a trigger lets free text
 * run until it appears; a constraint with out-of-range forced ids is refused at submit. */
#include <math.h>
#include <pthread.h>
#include <unistd.h>

#include <jansson.h>

#include "common.h"
#include "config.h"
#include "model.h"
#include "jsonschema.h"
#include "kvcache.h"
#include "sched.h"
#include "testutil.h"

/* ---------- kvcache unit checks ---------- */

static void test_kv_unit(void) {
    zs_kvcache *kv;
    CHECK(zs_kv_init(2, 8, 8, 4, 256, &kv) == 0, "kv init: %s", zs_errmsg());
    CHECK(zs_kv_prefix_enable(kv) == 0, "prefix enable: %s", zs_errmsg());
    int32_t toks[64];
    for (int i = 0; i < 64; i++) toks[i] = 3 + i * 7;
    uint64_t h[4];
    for (int j = 0; j < 4; j++) h[j] = zs_kv_prefix_hash(j ? h[j - 1] : 0, 0, toks + j * ZS_KV_BLOCK);
    uint64_t other = zs_kv_prefix_hash(0, 1, toks);
    CHECK(other != h[0], "the salt changes the hash");
    int a, b, c;
    CHECK(zs_kv_seq_open(kv, &a) == 0 && zs_kv_seq_reserve(kv, a, 48) == 0, "seq a");
    zs_kv_seq_publish(kv, a, 0, h[0]);
    zs_kv_seq_publish(kv, a, 1, h[1]);
    zs_kv_seq_publish(kv, a, 2, h[2]); /* position 47 is the last: block 2 is full */
    CHECK(zs_kv_prefix_lookup(kv, h, 4) == 3, "three blocks published");
    zs_kv_seq_close(kv, a);
    CHECK(zs_kv_used_blocks(kv) == 0 && zs_kv_cached_blocks(kv) == 3, "closed: 0 used, 3 cached (%d, %d)",
          zs_kv_used_blocks(kv), zs_kv_cached_blocks(kv));
    CHECK(zs_kv_seq_open(kv, &b) == 0, "seq b");
    CHECK(zs_kv_seq_share(kv, b, h, 2) == 2 && zs_kv_seq_len(kv, b) == 32, "b shares 2 blocks, length 32");
    CHECK(zs_kv_used_blocks(kv) == 2 && zs_kv_cached_blocks(kv) == 1, "2 held, 1 cached");
    CHECK(zs_kv_seq_open(kv, &c) == 0 && zs_kv_seq_share(kv, c, h, 3) == 3, "c shares 3 blocks at once");
    CHECK(zs_kv_seq_blocks(kv, b)[0] == zs_kv_seq_blocks(kv, c)[0], "the same physical block");
    CHECK(zs_kv_used_blocks(kv) == 3 && zs_kv_cached_blocks(kv) == 0, "3 held, 0 cached");
    CHECK(zs_kv_seq_reserve(kv, b, 64) == 0, "b grows by 2 blocks of its own");
    zs_kv_seq_close(kv, c);
    CHECK(zs_kv_used_blocks(kv) == 4 && zs_kv_cached_blocks(kv) == 1, "c closed: b's 4 held, block 2 cached");
    zs_kv_seq_close(kv, b);
    CHECK(zs_kv_used_blocks(kv) == 0 && zs_kv_cached_blocks(kv) == 3, "b closed: the 3 published cached");
    /* pressure: 8 blocks wanted, 5 free + 3 cached: every cached block is evicted */
    CHECK(zs_kv_seq_open(kv, &a) == 0 && zs_kv_seq_reserve(kv, a, 128) == 0, "a takes every block: %s", zs_errmsg());
    CHECK(zs_kv_evictions(kv) == 3 && zs_kv_cached_blocks(kv) == 0 && zs_kv_prefix_lookup(kv, h, 4) == 0,
          "evicted 3, nothing cached (%llu)", (unsigned long long)zs_kv_evictions(kv));
    CHECK(zs_kv_seq_open(kv, &b) == 0 && zs_kv_seq_reserve(kv, b, 1) == ZS_ENOSPC, "full: ENOSPC");
    zs_kv_seq_close(kv, b);
    zs_kv_seq_close(kv, a);
    CHECK(zs_kv_used_blocks(kv) == 0 && zs_kv_cached_blocks(kv) == 0, "nothing held or cached");
    /* an LRU: the least recently released goes first */
    CHECK(zs_kv_seq_open(kv, &a) == 0 && zs_kv_seq_reserve(kv, a, 16) == 0, "a: one block");
    zs_kv_seq_publish(kv, a, 0, h[0]);
    CHECK(zs_kv_seq_open(kv, &b) == 0 && zs_kv_seq_reserve(kv, b, 16) == 0, "b: one block");
    zs_kv_seq_publish(kv, b, 0, other);
    zs_kv_seq_close(kv, a); /* h[0] released first */
    zs_kv_seq_close(kv, b);
    CHECK(zs_kv_seq_open(kv, &c) == 0 && zs_kv_seq_reserve(kv, c, 16 * 7) == 0, "c: 7 blocks, one eviction");
    CHECK(zs_kv_prefix_lookup(kv, h, 1) == 0 && zs_kv_prefix_lookup(kv, &other, 1) == 1,
          "the older cached block was evicted, the newer kept");
    zs_kv_seq_close(kv, c);
    zs_kv_free(kv);

    CHECK(zs_kv_init(2, 8, 64, 4, 4096, &kv) == 0 && zs_kv_set_window(kv, 64, 16) == 0, "windowed kv");
    CHECK(zs_kv_prefix_enable(kv) == ZS_EINVAL, "no prefix cache with a window ring");
    zs_kv_free(kv);
}

/* ---------- requests through the scheduler ---------- */

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done, finish, n_tok, err;
    int32_t toks[256];
    uint32_t lp_bits[256];
    char text[4096];
    size_t len;
} req_t;

static void on_token(void *ud, int32_t tok, const char *t, size_t n, float lp, const int32_t *ti, const float *tl,
                     int nt) {
    (void)ti; (void)tl; (void)nt;
    req_t *q = ud;
    pthread_mutex_lock(&q->mu);
    if (q->n_tok < 256) {
        memcpy(&q->lp_bits[q->n_tok], &lp, 4);
        q->toks[q->n_tok++] = tok;
    }
    if (q->len + n < sizeof q->text) { memcpy(q->text + q->len, t, n); q->len += n; }
    pthread_mutex_unlock(&q->mu);
}

static void on_done(void *ud, int finish, const char *t, size_t n, int np, int ng, int err, const char *msg) {
    (void)np; (void)ng; (void)msg;
    req_t *q = ud;
    pthread_mutex_lock(&q->mu);
    if (q->len + n < sizeof q->text) { memcpy(q->text + q->len, t, n); q->len += n; }
    q->text[q->len] = 0;
    q->finish = finish;
    q->err = err;
    q->done = 1;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

static void req_init(req_t *q) {
    memset(q, 0, sizeof *q);
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
}

static void req_wait(req_t *q) {
    pthread_mutex_lock(&q->mu);
    while (!q->done) pthread_cond_wait(&q->cv, &q->mu);
    pthread_mutex_unlock(&q->mu);
}

static zs_engine *open_engine(int ranks, size_t kv_bytes) {
    char dir[4096];
    tu_model_dir(dir, sizeof dir, "stories260K");
    zs_engine_opts eo;
    zs_engine_opts_default(&eo);
    eo.model_dir = dir;
    eo.max_seqs = 16;
    eo.ranks = ranks;
    eo.kv_bytes = kv_bytes;
    eo.max_context = 256; /* every prompt + answer here is under 200 positions */
    zs_engine *e = NULL;
    int rc = zs_engine_open(&eo, &e);
    CHECK(rc == 0, "engine: %s", zs_errmsg());
    return rc == 0 ? e : NULL;
}

#define N_REQ 200
#define WAVE 20

/* The 200 requests: prefix k = i % 4 (37, 64, 100 or 150 tokens), a tail of 1..12 tokens that
 * depends on i, max_tokens 4..19; every third greedy, the rest seeded at temperature 0.9. */
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

static void run_mixed(int ranks, size_t kv_bytes, int no_prefix, run_out *o) {
    zs_engine *e = open_engine(ranks, kv_bytes);
    if (!e) return;
    zs_sched_opts so = {16, 64, 256, no_prefix, 0, 0, 0, 0, 0, 0, 0};
    zs_sched *s;
    if (zs_sched_new(e, &so, &s) < 0) {
        CHECK(0, "sched: %s", zs_errmsg());
        zs_engine_free(e);
        return;
    }
    static req_t q[WAVE];
    int32_t p[200];
    for (int w0 = 0; w0 < N_REQ; w0 += WAVE) {
        for (int j = 0; j < WAVE; j++) {
            int i = w0 + j;
            req_init(&q[j]);
            zs_req_params rp;
            memset(&rp, 0, sizeof rp);
            rp.prompt = p;
            rp.n_prompt = make_prompt(i, p);
            rp.max_tokens = 4 + i % 16;
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
            req_wait(&q[j]);
            o->n[i] = q[j].n_tok;
            o->finish[i] = q[j].finish;
            memcpy(o->toks[i], q[j].toks, sizeof o->toks[i]);
            memcpy(o->lps[i], q[j].lp_bits, sizeof o->lps[i]);
        }
    }
    /* the block counts are published after the step whose callbacks ended the last request */
    for (int t = 0; t < 400; t++) {
        zs_sched_stats_get(s, &o->st);
        if (o->st.kv_used == 0) break;
        usleep(5000);
    }
    zs_sched_free(s);
    zs_engine_free(e);
}

static void test_mixed(int ranks) {
    static run_out off, on, small;
    size_t block_bytes = 0;
    {
        zs_engine *e = open_engine(1, 0);
        if (!e) return;
        const zs_model_config *c = zs_model_config_get(zs_engine_model(e));
        block_bytes = zs_kv_block_bytes(c->n_layers, c->n_kv_heads * c->head_dim, ZS_F32);
        zs_engine_free(e);
    }
    memset(&off, 0, sizeof off);
    memset(&on, 0, sizeof on);
    memset(&small, 0, sizeof small);
    run_mixed(ranks, 0, 1, &off);
    run_mixed(ranks, 0, 0, &on);
    /* a KV budget of 20 blocks: the 4 prefixes' full blocks alone are 2 + 4 + 6 + 9 = 21, and one
     * request needs up to 12, so with one rank cached blocks must be evicted */
    run_mixed(ranks, (size_t)20 * block_bytes, 0, &small);
    int same = 0, same_small = 0, lengths = 0;
    for (int i = 0; i < N_REQ; i++) {
        lengths += off.n[i] == 4 + i % 16 && off.finish[i] == ZS_DONE_LENGTH;
        same += on.n[i] == off.n[i] && on.finish[i] == off.finish[i] &&
                !memcmp(on.toks[i], off.toks[i], sizeof on.toks[i]) && !memcmp(on.lps[i], off.lps[i], sizeof on.lps[i]);
        same_small += small.n[i] == off.n[i] && !memcmp(small.toks[i], off.toks[i], sizeof small.toks[i]) &&
                      !memcmp(small.lps[i], off.lps[i], sizeof small.lps[i]);
    }
    CHECK(lengths == N_REQ, "ranks %d: every request ran to its max_tokens (%d/%d)", ranks, lengths, N_REQ);
    CHECK(same == N_REQ, "ranks %d: prefix cache on = off, tokens and logprob bits, %d/%d requests", ranks, same, N_REQ);
    CHECK(same_small == N_REQ, "ranks %d: with evictions (a small KV budget) the same bits, %d/%d", ranks, same_small,
          N_REQ);
    fprintf(stderr, "ranks %d: prefix cache on: %llu of %llu prompt blocks from the cache (%llu tokens), %llu prompt "
                    "tokens prefilled (off: %llu); small budget: %llu hits, %llu evictions\n",
            ranks, (unsigned long long)on.st.prefix_hit_blocks, (unsigned long long)on.st.prefix_lookup_blocks,
            (unsigned long long)on.st.prefix_hit_tokens, (unsigned long long)on.st.prompt_tokens,
            (unsigned long long)off.st.prompt_tokens, (unsigned long long)small.st.prefix_hit_blocks,
            (unsigned long long)small.st.prefix_evictions);
    CHECK(off.st.prefix_hit_blocks == 0 && off.st.prefix_lookup_blocks == 0, "off: no lookups, no hits");
    CHECK(on.st.prefix_hit_blocks > on.st.prefix_lookup_blocks / 2, "on: most prompt blocks come from the cache");
    CHECK(on.st.prompt_tokens + on.st.prefix_hit_tokens == off.st.prompt_tokens,
          "on: prefilled + cached tokens = the prompt tokens prefilled without the cache");
    if (ranks == 1) CHECK(small.st.prefix_evictions > 0, "small budget: blocks were evicted (%llu)",
          (unsigned long long)small.st.prefix_evictions);
    CHECK(on.st.kv_used == 0 && small.st.kv_used == 0 && off.st.kv_used == 0, "no block held at the end");
    CHECK(off.st.kv_cached == 0 && on.st.kv_cached > 0, "cached blocks only with the cache on (%d)", on.st.kv_cached);
}

/* ---------- constrained decoding ---------- */

static const char *SCHEMA =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"enum\":[\"Lily\",\"Tom\",\"Sue\"]},"
    "\"age\":{\"type\":\"integer\"},\"happy\":{\"type\":\"boolean\"},"
    "\"toys\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"enum\":[\"ball\",\"red car\",\"doll\"]},\"maxItems\":2}},"
    "\"required\":[\"name\",\"age\",\"happy\",\"toys\"],\"additionalProperties\":false}";

/* The value's bytes: the token bytes of toks[from..n) fed to a fresh matcher must be accepted and done. */
static int value_ok(const zs_jschema *g, const zs_tokenizer *tk, const int32_t *toks, int from, int n) {
    zs_jschema_state st;
    zs_jschema_state_init(g, &st);
    for (int i = from; i < n; i++) {
        size_t len = 0;
        const char *b = zs_tokenizer_token_bytes(tk, toks[i], &len);
        if (!b || !zs_jschema_feed(g, &st, b, len)) return 0;
    }
    return zs_jschema_done(g, &st);
}

static void test_constrained(void) {
    zs_engine *e = open_engine(1, 0);
    if (!e) return;
    zs_sched_opts so = {16, 64, 256, 0, 0, 0, 0, 0, 0, 0, 0};
    zs_sched *s;
    if (zs_sched_new(e, &so, &s) < 0) {
        CHECK(0, "sched: %s", zs_errmsg());
        zs_engine_free(e);
        return;
    }
    const zs_tokenizer *tk = zs_engine_tokenizer(e);
    zs_jschema *g = NULL;
    zs_jschema_masks *m = NULL;
    CHECK(zs_jschema_compile(SCHEMA, &g) == 0, "compile: %s", zs_errmsg());
    CHECK(g && zs_jschema_mask_new(g, tk, &m) == 0, "masks: %s", zs_errmsg());
    if (!m) goto out;
    int32_t p1[] = {1, 403, 407, 261, 378};
    int32_t pre[2], suf[2];
    {
        int32_t *ids = NULL;
        size_t n = 0;
        CHECK(zs_tokenizer_encode(tk, "Data", 4, 0, &ids, &n) == 0 && n >= 1, "encode");
        pre[0] = ids[0];
        pre[1] = ids[n - 1];
        free(ids);
        CHECK(zs_tokenizer_encode(tk, " end", 4, 0, &ids, &n) == 0 && n >= 1, "encode");
        suf[0] = ids[0];
        suf[1] = ids[n - 1];
        free(ids);
    }
    enum { NC = 8 };
    static req_t q[NC + 2];
    zs_req_constraint con = {g, m, NULL, 0, NULL, 0, NULL};
    zs_req_constraint con_fix = {g, m, pre, 2, suf, 2, NULL};
    zs_req_constraint con_trig = {g, m, NULL, 0, NULL, 0, "little"};
    for (int i = 0; i < NC + 2; i++) {
        req_init(&q[i]);
        zs_req_params rp;
        memset(&rp, 0, sizeof rp);
        rp.prompt = p1;
        rp.n_prompt = 5;
        rp.max_tokens = 200;
        zs_sampler_params_default(&rp.sampling);
        rp.sampling.temperature = i < NC ? 1.0f : 0.0f;
        rp.sampling.seed = 7 + (uint64_t)i;
        rp.top_logprobs = 0;
        rp.constraint = i < NC ? (i == 1 ? &con_fix : &con) : &con_trig;
        zs_req_sink sink = {on_token, on_done, &q[i], NULL};
        CHECK(zs_sched_submit(s, &rp, &sink, NULL) == 0, "submit constrained %d: %s", i, zs_errmsg());
    }
    int valid = 0;
    for (int i = 0; i < NC; i++) {
        req_wait(&q[i]);
        int from = i == 1 ? 2 : 0, to = i == 1 ? q[i].n_tok - 2 : q[i].n_tok;
        int ok = q[i].finish == ZS_DONE_STOP && value_ok(g, tk, q[i].toks, from, to);
        json_error_t je;
        const char *txt = q[i].text;
        if (i == 1) ok = ok && q[i].toks[0] == pre[0] && q[i].toks[1] == pre[1] && q[i].toks[q[i].n_tok - 2] == suf[0] &&
                         q[i].toks[q[i].n_tok - 1] == suf[1];
        /* the text: the value (after the forced "Data" for request 1) parses */
        if (i == 1) {
            txt = strchr(txt, '{');
            char *end = txt ? strrchr(txt, '}') : NULL;
            if (end) end[1] = 0;
        }
        json_t *v = txt ? json_loads(txt, 0, &je) : NULL;
        json_t *name = json_object_get(v, "name");
        ok = ok && v && json_is_string(name) && json_is_integer(json_object_get(v, "age")) &&
             json_is_boolean(json_object_get(v, "happy")) && json_is_array(json_object_get(v, "toys")) &&
             json_array_size(json_object_get(v, "toys")) <= 2 &&
             (!strcmp(json_string_value(name), "Lily") || !strcmp(json_string_value(name), "Tom") ||
              !strcmp(json_string_value(name), "Sue"));
        if (!ok) fprintf(stderr, "  constrained %d (finish %d, %d tokens): %s\n", i, q[i].finish, q[i].n_tok, q[i].text);
        valid += ok;
        json_decref(v);
    }
    CHECK(valid == NC, "%d/%d sampled answers are complete values of the schema (forced prefix/suffix where given)",
          valid, NC);
    /* a trigger: free text until "little" appears, then the value */
    for (int i = NC; i < NC + 2; i++) req_wait(&q[i]);
    {
        const char *at = strstr(q[NC].text, "little");
        int ok = q[NC].finish == ZS_DONE_STOP && at && strchr(at, '{');
        if (ok) {
            const char *v0 = strchr(at, '{');
            json_error_t je;
            json_t *v = json_loads(v0, 0, &je);
            ok = v && json_is_object(v) && json_object_get(v, "toys");
            json_decref(v);
        }
        CHECK(ok, "trigger: free text up to \"little\", then a value: %s", q[NC].text);
        CHECK(q[NC].n_tok == q[NC + 1].n_tok && !memcmp(q[NC].toks, q[NC + 1].toks, sizeof q[NC].toks),
              "greedy constrained answers are the same twice");
    }
    {
        int32_t bad = 1 << 20;
        zs_req_constraint cb = {g, m, &bad, 1, NULL, 0, NULL};
        zs_req_params rp;
        memset(&rp, 0, sizeof rp);
        rp.prompt = p1;
        rp.n_prompt = 5;
        rp.max_tokens = 8;
        zs_sampler_params_default(&rp.sampling);
        rp.constraint = &cb;
        req_t qb;
        req_init(&qb);
        zs_req_sink sink = {on_token, on_done, &qb, NULL};
        CHECK(zs_sched_submit(s, &rp, &sink, NULL) == ZS_ERANGE, "an out-of-range forced id is refused at submit");
        rp.embed = 1;
        CHECK(zs_sched_submit(s, &rp, &sink, NULL) == ZS_EINVAL, "a constraint on an embedding request is refused");
    }
    zs_sched_stats st;
    for (int t = 0; t < 400; t++) {
        zs_sched_stats_get(s, &st);
        if (st.kv_used == 0) break;
        usleep(5000);
    }
    CHECK(st.constrained_tokens > 0 && st.kv_used == 0, "constrained tokens counted (%llu), no block held",
          (unsigned long long)st.constrained_tokens);
out:
    zs_sched_free(s);
    zs_engine_free(e);
    zs_jschema_mask_free(m);
    zs_jschema_free(g);
}

int main(void) {
    test_kv_unit();
    test_mixed(1);
    test_mixed(2);
    test_constrained();
    return tu_finish("test-prefix-cache");
}
