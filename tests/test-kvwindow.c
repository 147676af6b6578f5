/* test-kvwindow.c — the sliding-window KV cache (kvcache.h zs_kv_set_window): a Mistral-style
 * model whose every layer attends through a window of 40 positions runs 300 tokens in chunks
 * through a cache that keeps a ring of blocks per sequence and through a plain cache; the logits
 * of every position are equal bit for bit, the ring sequence never owns more than its ring of
 * blocks, two ring sequences interleaved do not disturb each other, and the calls that the ring
 * cannot serve are refused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "config.h"
#include "init-model.h"
#include "model.h"
#include "testutil.h"

#define W 40
#define CHUNK 7
#define N 300

typedef struct {
    zs_kvcache *kv;
    int seq, done;
} run_t;

/* the next chunk of ids[] for one sequence; logits of every position into lg */
static int step(zs_forward *f, zs_weight_source *src, run_t *r, const int32_t *ids, int n, float *lg, int V) {
    int32_t pos[CHUNK], sq[CHUNK], li[CHUNK];
    for (int i = 0; i < n; i++) {
        pos[i] = r->done + i;
        sq[i] = r->seq;
        li[i] = i;
    }
    int rc = zs_kv_seq_reserve(r->kv, r->seq, r->done + n);
    zs_batch b = {n, ids + r->done, pos, sq, li, n, NULL, NULL, NULL};
    if (rc == 0) rc = zs_forward_run(f, src, r->kv, &b, lg + (size_t)r->done * V);
    r->done += n;
    return rc;
}

int main(void) {
    char dir[] = "/tmp/zs-kvwindow-XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "temp dir");
    zs_init_opts io;
    CHECK(zs_init_opts_default("mistral", &io) == 0, "mistral defaults");
    io.cfg.n_layers = 2;
    io.cfg.max_seq = 512;
    io.random_norms = 1;
    char ov[64];
    snprintf(ov, sizeof ov, "{\"sliding_window\": %d}", W);
    CHECK(zs_config_override(&io.cfg, ov, "test") == 0, "window override: %s", zs_errmsg());
    CHECK(zs_init_model_write(&io, dir) == 0, "init-model: %s", zs_errmsg());

    zs_model *m = NULL;
    CHECK(zs_model_open(dir, NULL, &m) == 0 && zs_model_load_resident(m) == 0, "open: %s", zs_errmsg());
    const zs_model_config *c = zs_model_config_get(m);
    CHECK(c->sliding_window == W && zs_config_layer_sliding(c, 0) && zs_config_layer_sliding(c, 1), "every layer windowed");
    int V = c->vocab_size, kvd = c->n_kv_heads * c->head_dim;
    zs_forward *f = NULL;
    CHECK(zs_forward_new(m, 16, &f) == 0, "forward");
    zs_weight_source src = zs_model_resident_source(m);

    zs_kvcache *plain = NULL, *ring = NULL;
    CHECK(zs_kv_init(c->n_layers, kvd, 64, 2, c->max_seq, &plain) == 0, "plain cache");
    CHECK(zs_kv_init(c->n_layers, kvd, 16, 2, c->max_seq, &ring) == 0, "ring cache (16 blocks: 2 rings)");
    CHECK(zs_kv_set_window(ring, W, CHUNK) == 0, "set window");
    int R = zs_kv_ring(ring);
    CHECK(R == (W + CHUNK - 1 + ZS_KV_BLOCK - 1) / ZS_KV_BLOCK + 1, "ring of %d blocks", R);

    int32_t ids[2][N];
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < N; i++) ids[s][i] = (int32_t)((i * 37 + s * 101 + i * i % 13) % (V - 1));
    float *lp = malloc((size_t)N * V * sizeof(float)), *lr[2];
    lr[0] = malloc((size_t)N * V * sizeof(float));
    lr[1] = malloc((size_t)N * V * sizeof(float));
    CHECK(lp && lr[0] && lr[1], "memory");

    /* the plain cache, sequence 0 alone */
    run_t p = {plain, 0, 0};
    CHECK(zs_kv_seq_open(plain, &p.seq) == 0, "open plain");
    while (p.done < N) CHECK(step(f, &src, &p, ids[0], ZS_MIN(CHUNK, N - p.done), lp, V) == 0, "plain step: %s", zs_errmsg());

    /* the ring cache, two sequences interleaved with different chunkings */
    run_t r[2] = {{ring, 0, 0}, {ring, 0, 0}};
    CHECK(zs_kv_seq_open(ring, &r[0].seq) == 0 && zs_kv_seq_open(ring, &r[1].seq) == 0, "open ring seqs");
    int maxused = 0;
    while (r[0].done < N || r[1].done < N) {
        for (int s = 0; s < 2; s++) {
            int n = ZS_MIN(s ? 3 : CHUNK, N - r[s].done);
            if (n > 0) CHECK(step(f, &src, &r[s], ids[s], n, lr[s], V) == 0, "ring step: %s", zs_errmsg());
        }
        maxused = ZS_MAX(maxused, zs_kv_used_blocks(ring));
    }
    CHECK(maxused <= 2 * R, "ring: at most %d blocks in use, saw %d", 2 * R, maxused);
    CHECK(!memcmp(lp, lr[0], (size_t)N * V * sizeof(float)), "ring logits == plain logits, bit for bit, at all %d positions", N);

    /* sequence 1 against its own plain run */
    zs_kv_seq_close(plain, p.seq);
    run_t p1 = {plain, 0, 0};
    CHECK(zs_kv_seq_open(plain, &p1.seq) == 0, "open plain 1");
    while (p1.done < N) CHECK(step(f, &src, &p1, ids[1], ZS_MIN(5, N - p1.done), lp, V) == 0, "plain 1 step");
    CHECK(!memcmp(lp, lr[1], (size_t)N * V * sizeof(float)), "second ring sequence == its plain run, bit for bit");

    /* closing gives the blocks back; the window cannot change under open sequences */
    zs_kv_seq_close(ring, r[0].seq);
    zs_kv_seq_close(ring, r[1].seq);
    CHECK(zs_kv_used_blocks(ring) == 0, "closing gives the rings back");
    int s2;
    CHECK(zs_kv_seq_open(ring, &s2) == 0, "reopen");
    CHECK(zs_kv_set_window(ring, W, CHUNK) == ZS_EBUSY, "window set while a sequence is open is refused");
    CHECK(zs_kv_set_window(ring, 0, CHUNK) == ZS_EINVAL, "window 0 refused");
    /* more tokens of one sequence in one call than the ring holds: refused, nothing written */
    {
        enum { BIG = 64 };
        int32_t bt[BIG], bp[BIG], bs[BIG], bl[BIG];
        for (int i = 0; i < BIG; i++) {
            bt[i] = ids[0][i];
            bp[i] = 100 + i;
            bs[i] = s2;
            bl[i] = -1;
        }
        CHECK(zs_kv_seq_reserve(ring, s2, 100 + BIG) == 0, "reserve 164 in the ring");
        CHECK(!zs_kv_span_ok(ring, 100, 100 + BIG - 1) && zs_kv_span_ok(ring, 100, 100 + CHUNK - 1) &&
              zs_kv_span_ok(ring, 0, BIG - 1), "span check (0..63 reads nothing older: it fits)");
        zs_batch big = {BIG, bt, bp, bs, bl, 0, NULL, NULL, NULL};
        zs_forward *fb = NULL;
        CHECK(zs_forward_new(m, BIG, &fb) == 0, "forward for 64");
        CHECK_ERR(zs_forward_run(fb, &src, ring, &big, NULL), "ring");
        zs_forward_free(fb);
    }

    zs_kv_free(plain);
    zs_kv_free(ring);
    zs_forward_free(f);
    zs_model_free(m);
    free(lp);
    free(lr[0]);
    free(lr[1]);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return tu_finish("test-kvwindow");
}
