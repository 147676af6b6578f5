/* test-tree.c — token trees below the scheduler (the pass that verifies speculative decoding's
 * drafts as a tree, model.h zs_batch.tree):
 *   - the CPU attention with a tree (zs_op_attention_tree): every node's output is BIT FOR BIT the
 *     causal output of its query over a cache that holds its path compacted (root .. node at
 *     consecutive positions after the prefix: the accepted path alone), for two trees of 12 nodes
 *     after prefixes of 37 and 300 positions next to a causal chunk of a third sequence, GQA 1, 4
 *     and an odd head dim, caches in f32, f16 and bf16, no window and windows of 3 (inside the
 *     path) and 40 (inside the prefix) with a soft-cap, the generic and the AVX2 kernels;
 *   - the mask: a node's K and V poisoned with NaN change exactly the rows of its subtree (itself
 *     and its descendants), never a sibling's, a cousin's or an ancestor's;
 *   - a chain given as a tree (parent = the previous row) is the causal chain bit for bit; trees
 *     that break the rules are refused;
 *   - zs_kv_copy copies K and V as stored (f32, f16, bf16; across blocks);
 *   - the forward pass (stories260K with an f32 and a bf16 cache; a random Gemma 2 with a 5-token
 *     window on alternate layers and soft-caps; a random Mistral whose every layer has an 8-token
 *     window, in a ring cache): after a prompt, a tree of 12 drafts in one pass, next to another
 *     sequence's prompt chunk: each node's logits are the bits of the same tokens decoded one per
 *     pass on its path alone; then an accepted path's entries moved (zs_batch.tree->moves) in
 *     the pass of the next tree, whose slots overlap the old tree's, and that tree's logits are
 *     plain decoding's again (and differ without the moves: the moves are what makes them so);
 *   - zs_batch_check refuses trees and moves that break the rules. */
#include "attention.h"
#include "common.h"
#include "config.h"
#include "init-model.h"
#include "kvcache.h"
#include "model.h"
#include "ops.h"
#include "tensor.h"
#include "testutil.h"

static uint64_t rng = 88172645463325252ull;
static float frand(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (float)((rng >> 11) * 0x1.0p-53) - 0.5f;
}

static int count_diff(const float *a, const float *b, size_t n) {
    int d = 0;
    for (size_t i = 0; i < n; i++) d += memcmp(&a[i], &b[i], 4) != 0;
    return d;
}

/* ---------- the attention op ---------- */

#define NODES 12
/* node order: a parent before its children; slots P .. P+11 in this order, depths 0..4 */
static const int tree_par[NODES] = {-1, 0, 0, 1, 1, 2, 3, 6, 4, 0, 9, 10};
#define PA 37
#define PB 300
#define MAXLEN 340
#define LAYER 1

typedef struct {
    int nh, nkv, hd;
    zs_dtype dt;
    zs_kvcache *kv;
    int ids[3];                 /* sequences A (tree after PA), B (tree after PB), C (a causal chunk) */
    int T, seq[2 * NODES + 5], pos[2 * NODES + 5], slot[2 * NODES + 5], par[2 * NODES + 5];
    int seqidx[2 * NODES + 5];  /* 0, 1, 2: which of ids */
    float *q;
} arig;

static int depth_of(const int *par, int i) {
    int d = 0;
    for (; par[i] >= 0; i = par[i]) d++;
    return d;
}

static void views_of(zs_kvcache *kv, const int *ids, int n, const void **ptrs, zs_att_seq *views) {
    int used = 0;
    for (int s = 0; s < n; s++) {
        int nb = (zs_kv_seq_len(kv, ids[s]) + ZS_KV_BLOCK - 1) / ZS_KV_BLOCK;
        const void **kp = ptrs + used, **vp = kp + nb;
        for (int j = 0; j < nb; j++) {
            kp[j] = zs_kv_k(kv, LAYER, ids[s], j * ZS_KV_BLOCK);
            vp[j] = zs_kv_v(kv, LAYER, ids[s], j * ZS_KV_BLOCK);
        }
        used += 2 * nb;
        views[ids[s]] = (zs_att_seq){kp, vp};
    }
}

static void arig_open(arig *r, int nh, int nkv, int hd, zs_dtype dt) {
    memset(r, 0, sizeof *r);
    r->nh = nh; r->nkv = nkv; r->hd = hd; r->dt = dt;
    int kvd = nkv * hd;
    CHECK(zs_kv_init_ex(2, kvd, 64, 5, MAXLEN, dt, 1, &r->kv) == 0, "kv: %s", zs_errmsg());
    int spare;
    zs_kv_seq_open(r->kv, &spare); /* the sequences are not slot 0 */
    const int len[3] = {PA + NODES, PB + NODES, 20};
    for (int s = 0; s < 3; s++) {
        zs_kv_seq_open(r->kv, &r->ids[s]);
        CHECK(zs_kv_seq_reserve(r->kv, r->ids[s], len[s]) == 0, "reserve");
    }
    float *k = malloc((size_t)kvd * 4), *v = malloc((size_t)kvd * 4);
    for (int s = 0; s < 3; s++)
        for (int l = 0; l < 2; l++)
            for (int p = 0; p < len[s]; p++) {
                for (int e = 0; e < kvd; e++) { k[e] = 2.0f * frand(); v[e] = frand(); }
                zs_kv_write(r->kv, l, r->ids[s], p, k, v);
            }
    free(k); free(v);
    /* the call: A's tree, C's chunk (positions 13..17), B's tree */
    int T = 0;
    for (int t = 0; t < 3; t++) {
        int s = t == 0 ? 0 : t == 1 ? 2 : 1, P = s == 0 ? PA : PB, base = T;
        for (int i = 0; i < (s == 2 ? 5 : NODES); i++, T++) {
            r->seq[T] = r->ids[s];
            r->seqidx[T] = s;
            if (s == 2) {
                r->pos[T] = r->slot[T] = 13 + i;
                r->par[T] = -1;
            } else {
                r->pos[T] = P + depth_of(tree_par, i);
                r->slot[T] = P + i;
                r->par[T] = tree_par[i] < 0 ? -1 : base + tree_par[i];
            }
        }
    }
    r->T = T;
    size_t qd = (size_t)nh * hd;
    r->q = malloc((size_t)T * qd * 4);
    for (size_t i = 0; i < (size_t)T * qd; i++) r->q[i] = 2.0f * frand();
}

static void arig_close(arig *r) {
    zs_kv_free(r->kv);
    free(r->q);
}

static int run_tree(arig *r, float *out, int path, const zs_att_params *ap) {
    const void *ptrs[2 * 64];
    zs_att_seq views[5];
    views_of(r->kv, r->ids, 3, ptrs, views);
    zs_att_tree tree = {r->slot, r->par};
    return zs_op_attention_tree(out, r->q, r->T, r->seq, r->pos, views, r->nh, r->nkv, r->hd, r->nkv * r->hd,
                                ZS_KV_BLOCK, r->dt, path, ap, &tree);
}

/* Token i's reference: the causal output of its query over a cache holding positions 0..P-1 of
 * its sequence and then its path's slots, at position P + depth. */
static int path_ref(arig *r, int i, float *out, const zs_att_params *ap) {
    int kvd = r->nkv * r->hd, s = r->seq[i], d = r->pos[i] - (r->seqidx[i] == 0 ? PA : PB);
    int P = r->pos[i] - d, path[NODES];
    for (int k = d, a = i; k >= 0; k--, a = r->par[a]) path[k] = a;
    zs_kvcache *pc = NULL;
    if (zs_kv_init_ex(2, kvd, 32, 1, MAXLEN, r->dt, 1, &pc) < 0) return -1;
    int q;
    zs_kv_seq_open(pc, &q);
    zs_kv_seq_reserve(pc, q, P + d + 1);
    size_t row = (size_t)kvd * zs_dtype_size(r->dt);
    for (int p = 0; p < P + d + 1; p++) {
        int from = p < P ? p : r->slot[path[p - P]];
        memcpy(zs_kv_k(pc, LAYER, q, p), zs_kv_k(r->kv, LAYER, s, from), row);
        memcpy(zs_kv_v(pc, LAYER, q, p), zs_kv_v(r->kv, LAYER, s, from), row);
    }
    const void *ptrs[2 * 32];
    zs_att_seq views[1];
    views_of(pc, &q, 1, ptrs, views);
    int pos = P + d, zero = 0;
    int rc = zs_op_attention(out, r->q + (size_t)i * r->nh * r->hd, 1, &zero, &pos, views, r->nh, r->nkv, r->hd, kvd,
                             ZS_KV_BLOCK, r->dt, ZS_ATT_AUTO, ap);
    zs_kv_free(pc);
    return rc;
}

static void check_tree_op(int nh, int nkv, int hd, zs_dtype dt, const zs_att_params *ap) {
    arig r;
    arig_open(&r, nh, nkv, hd, dt);
    char dn[128];
    snprintf(dn, sizeof dn, "tree attention %s nh %d nkv %d hd %d window %d cap %g", zs_dtype_name(dt), nh, nkv, hd,
             ap ? ap->window : 0, ap ? (double)ap->softcap : 0.0);
    size_t qd = (size_t)nh * hd, n = (size_t)r.T * qd;
    float *out = malloc(n * 4), *alt = malloc(n * 4), *one = malloc(qd * 4);
    int rc = run_tree(&r, out, ZS_ATT_AUTO, ap);
    CHECK(rc == 0, "%s: %s", dn, zs_errmsg());
    /* every tree node = its path alone; the causal chunk = the plain op */
    int bad = 0;
    for (int i = 0; i < r.T; i++) {
        if (r.seqidx[i] == 2) {
            const void *ptrs[2 * 64];
            zs_att_seq views[5];
            views_of(r.kv, r.ids, 3, ptrs, views);
            rc = zs_op_attention(one, r.q + (size_t)i * qd, 1, r.seq + i, r.pos + i, views, nh, nkv, hd, nkv * hd,
                                 ZS_KV_BLOCK, dt, ZS_ATT_AUTO, ap);
        } else {
            rc = path_ref(&r, i, one, ap);
        }
        bad += rc != 0 || count_diff(one, out + (size_t)i * qd, qd) != 0;
    }
    CHECK(bad == 0, "%s: %d of %d rows differ from their path alone", dn, bad, r.T);
    /* the generic and the AVX2 kernels */
    rc = run_tree(&r, alt, ZS_ATT_GENERIC, ap);
    CHECK(rc == 0 && count_diff(alt, out, n) == 0, "%s: the generic kernel gives the same bits", dn);
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        (dt != ZS_F16 || __builtin_cpu_supports("f16c"))) {
        rc = run_tree(&r, alt, ZS_ATT_AVX2, ap);
        CHECK(rc == 0 && count_diff(alt, out, n) == 0, "%s: the AVX2 kernel gives the same bits", dn);
    }
    /* the mask: poison each node of A's tree in turn; exactly its subtree's rows change */
    int kvd = nkv * hd, wrong = 0;
    size_t row = (size_t)kvd * zs_dtype_size(dt);
    char *saved = malloc(2 * row);
    float *nan = malloc((size_t)kvd * 4);
    for (int e = 0; e < kvd; e++) nan[e] = NAN;
    for (int x = 0; x < NODES; x++) {
        int sx = r.slot[x];
        memcpy(saved, zs_kv_k(r.kv, LAYER, r.seq[x], sx), row);
        memcpy(saved + row, zs_kv_v(r.kv, LAYER, r.seq[x], sx), row);
        zs_kv_write(r.kv, LAYER, r.seq[x], sx, nan, nan);
        rc = run_tree(&r, alt, ZS_ATT_AUTO, ap);
        for (int i = 0; i < r.T; i++) {
            int under = 0; /* x is i or an ancestor of i whose key the window leaves visible */
            if (r.seq[i] == r.seq[x])
                for (int a = i; a >= 0; a = r.par[a])
                    if (a == x) under = !ap || ap->window == 0 || r.pos[x] > r.pos[i] - ap->window;
            int changed = count_diff(alt + (size_t)i * qd, out + (size_t)i * qd, qd) != 0;
            wrong += rc != 0 || changed != under;
        }
        memcpy(zs_kv_k(r.kv, LAYER, r.seq[x], sx), saved, row);
        memcpy(zs_kv_v(r.kv, LAYER, r.seq[x], sx), saved + row, row);
    }
    CHECK(wrong == 0, "%s: a poisoned node changes exactly its subtree's rows (%d rows wrong)", dn, wrong);
    free(saved); free(nan);
    free(out); free(alt); free(one);
    arig_close(&r);
}

/* a chain given as a tree is the causal chain; trees that break the rules are refused */
static void check_tree_rules(void) {
    arig r;
    arig_open(&r, 4, 2, 16, ZS_F32);
    int T = 8, seq[8], pos[8], slot[8], par[8];
    for (int i = 0; i < T; i++) {
        seq[i] = r.ids[1];
        pos[i] = slot[i] = PB + i;
        par[i] = i == 0 ? -1 : i - 1;
    }
    const void *ptrs[2 * 64];
    zs_att_seq views[5];
    views_of(r.kv, r.ids, 3, ptrs, views);
    float a[8 * 64], b[8 * 64];
    zs_att_tree tree = {slot, par};
    int rc = zs_op_attention_tree(a, r.q, T, seq, pos, views, 4, 2, 16, 32, ZS_KV_BLOCK, ZS_F32, 0, NULL, &tree);
    rc |= zs_op_attention(b, r.q, T, seq, pos, views, 4, 2, 16, 32, ZS_KV_BLOCK, ZS_F32, 0, NULL);
    CHECK(rc == 0 && count_diff(a, b, (size_t)T * 64) == 0, "a chain as a tree = the causal chain");
    par[3] = 3;
    CHECK_ERR(zs_op_attention_tree(a, r.q, T, seq, pos, views, 4, 2, 16, 32, ZS_KV_BLOCK, ZS_F32, 0, NULL, &tree),
              "cannot have token 3");
    par[3] = 1; /* position 3 below a node at position 1 */
    CHECK_ERR(zs_op_attention_tree(a, r.q, T, seq, pos, views, 4, 2, 16, 32, ZS_KV_BLOCK, ZS_F32, 0, NULL, &tree),
              "parent");
    par[3] = 2;
    slot[0] = PB + 1; /* a causal root not at its position */
    CHECK_ERR(zs_op_attention_tree(a, r.q, T, seq, pos, views, 4, 2, 16, 32, ZS_KV_BLOCK, ZS_F32, 0, NULL, &tree),
              "causal");
    zs_att_tree half = {slot, NULL};
    CHECK_ERR(zs_op_attention_tree(a, r.q, T, seq, pos, views, 4, 2, 16, 32, ZS_KV_BLOCK, ZS_F32, 0, NULL, &half),
              "without slots or parents");
    arig_close(&r);
}

static void check_kv_copy(void) {
    const zs_dtype dts[3] = {ZS_F32, ZS_F16, ZS_BF16};
    for (int d = 0; d < 3; d++) {
        zs_kvcache *kv = NULL;
        CHECK(zs_kv_init_ex(2, 24, 8, 2, 64, dts[d], 1, &kv) == 0, "kv");
        if (!kv) return;
        int s0, s1;
        zs_kv_seq_open(kv, &s0);
        zs_kv_seq_open(kv, &s1);
        zs_kv_seq_reserve(kv, s0, 40);
        zs_kv_seq_reserve(kv, s1, 40);
        float k[24], v[24];
        for (int l = 0; l < 2; l++)
            for (int p = 0; p < 40; p++) {
                for (int e = 0; e < 24; e++) { k[e] = frand(); v[e] = frand(); }
                zs_kv_write(kv, l, s0, p, k, v);
                zs_kv_write(kv, l, s1, p, v, k);
            }
        size_t row = 24 * zs_dtype_size(dts[d]);
        char want[2][24 * 4], other[2][24 * 4];
        memcpy(want[0], zs_kv_k(kv, 1, s0, 35), row);
        memcpy(want[1], zs_kv_v(kv, 1, s0, 35), row);
        memcpy(other[0], zs_kv_k(kv, 0, s0, 3), row);
        memcpy(other[1], zs_kv_v(kv, 0, s0, 3), row);
        zs_kv_copy(kv, 1, s0, 35, 3); /* from the third block to the first, one layer */
        CHECK(!memcmp(zs_kv_k(kv, 1, s0, 3), want[0], row) && !memcmp(zs_kv_v(kv, 1, s0, 3), want[1], row),
              "%s: K and V copied as stored", zs_dtype_name(dts[d]));
        CHECK(!memcmp(zs_kv_k(kv, 0, s0, 3), other[0], row) && !memcmp(zs_kv_v(kv, 0, s0, 3), other[1], row),
              "%s: the other layer untouched", zs_dtype_name(dts[d]));
        CHECK(!memcmp(zs_kv_k(kv, 1, s0, 35), want[0], row), "%s: the source stays", zs_dtype_name(dts[d]));
        zs_kv_free(kv);
    }
}

/* ---------- the forward pass ---------- */

typedef struct {
    zs_model *m;
    zs_kvcache *kv;
    zs_forward *f;
    zs_weight_source src;
    int V;
    const char *name;
} mrig;

static int mrig_open(mrig *r, const char *dir, zs_dtype kvdt, int ring, const char *name) {
    memset(r, 0, sizeof *r);
    r->name = name;
    int rc = zs_model_open(dir, NULL, &r->m);
    if (rc == 0) rc = zs_model_load_resident(r->m);
    if (rc < 0) return rc;
    const zs_model_config *c = zs_model_config_get(r->m);
    r->V = c->vocab_size;
    if ((rc = zs_kv_init_ex(c->n_layers, c->n_kv_heads * c->head_dim, 96, 8, 256, kvdt, 1, &r->kv)) < 0) return rc;
    if (ring && (rc = zs_kv_set_window(r->kv, c->sliding_window, 32)) < 0) return rc;
    if (ring && !zs_kv_ring(r->kv)) return zs_err(ZS_EINVAL, "no ring");
    r->src = zs_model_resident_source(r->m);
    return zs_forward_new(r->m, 64, &r->f);
}

static void mrig_close(mrig *r) {
    zs_forward_free(r->f);
    zs_kv_free(r->kv);
    zs_model_free(r->m);
}

/* One pass of n tokens of sequence seq from pos (slot/par NULL: causal at pos..), every row's
 * logits into lg. */
static int pass(mrig *r, int seq, int n, const int32_t *tok, const int32_t *pos, const int32_t *slot,
                const int32_t *par, const zs_kv_move *mv, int nmv, float *lg) {
    int32_t sq[64], li[64];
    for (int i = 0; i < n; i++) { sq[i] = seq; li[i] = i; }
    zs_batch_tree t = {slot, par, mv, nmv};
    zs_batch b = {n, tok, pos, sq, li, n, NULL, NULL, slot || mv ? &t : NULL};
    return zs_forward_run(r->f, &r->src, r->kv, &b, lg);
}

/* A fresh sequence: the prompt in one pass, then toks one per pass; the logits after each of toks
 * into lg[k]. */
static int plain_decode(mrig *r, const int32_t *prompt, int np, const int32_t *toks, int n, float *lg) {
    int seq, rc;
    if ((rc = zs_kv_seq_open(r->kv, &seq)) < 0) return rc;
    float *scratch = malloc((size_t)np * r->V * 4);
    int32_t pos[64];
    for (int i = 0; i < np; i++) pos[i] = i;
    rc = zs_kv_seq_reserve(r->kv, seq, np + n);
    if (rc == 0) rc = pass(r, seq, np, prompt, pos, NULL, NULL, NULL, 0, scratch);
    for (int k = 0; rc == 0 && k < n; k++) {
        int32_t p = np + k;
        rc = pass(r, seq, 1, toks + k, &p, NULL, NULL, NULL, 0, lg + (size_t)k * r->V);
    }
    free(scratch);
    zs_kv_seq_close(r->kv, seq);
    return rc;
}

#define NP 20
static void check_forward(mrig *r) {
    int V = r->V;
    int32_t prompt[NP], tok[NODES], pos[NODES], slot[NODES], par[NODES];
    for (int i = 0; i < NP; i++) prompt[i] = (int32_t)(1 + (i * 37 + 11) % (V - 2));
    for (int i = 0; i < NODES; i++) {
        tok[i] = (int32_t)(3 + (i * 53 + 7) % (V - 4));
        pos[i] = NP + depth_of(tree_par, i);
        slot[i] = NP + i;
        par[i] = tree_par[i];
    }
    float *lg = malloc((size_t)2 * NODES * V * 4), *ref = malloc((size_t)(NODES + 8) * V * 4);
    float *pl = malloc((size_t)NP * V * 4);
    int seq, other, rc;
    zs_kv_seq_open(r->kv, &seq);
    zs_kv_seq_open(r->kv, &other);
    int32_t ppos[NP];
    for (int i = 0; i < NP; i++) ppos[i] = i;
    rc = zs_kv_seq_reserve(r->kv, seq, NP + 2 * NODES);
    if (rc == 0) rc = zs_kv_seq_reserve(r->kv, other, NP);
    if (rc == 0) rc = pass(r, seq, NP, prompt, ppos, NULL, NULL, NULL, 0, pl);
    /* the tree, with another sequence's prompt chunk in the same pass */
    if (rc == 0) {
        int32_t bt[NODES + 6], bp[NODES + 6], bsl[NODES + 6], bpa[NODES + 6], bsq[NODES + 6], bli[NODES + 6];
        for (int i = 0; i < 6; i++) {
            bt[i] = prompt[i + 3];
            bp[i] = bsl[i] = i;
            bpa[i] = -1;
            bsq[i] = other;
            bli[i] = NODES + i;
        }
        for (int i = 0; i < NODES; i++) {
            bt[6 + i] = tok[i];
            bp[6 + i] = pos[i];
            bsl[6 + i] = slot[i];
            bpa[6 + i] = par[i] < 0 ? -1 : 6 + par[i];
            bsq[6 + i] = seq;
            bli[6 + i] = i;
        }
        zs_batch_tree t = {bsl, bpa, NULL, 0};
        zs_batch b = {NODES + 6, bt, bp, bsq, bli, NODES + 6, NULL, NULL, &t};
        rc = zs_forward_run(r->f, &r->src, r->kv, &b, lg);
    }
    CHECK(rc == 0, "%s: the tree pass: %s", r->name, zs_errmsg());
    /* each leaf's path decoded alone: every node on it has the tree's bits */
    int bad = 0, seen[NODES] = {0};
    for (int leaf = NODES - 1; rc == 0 && leaf >= 0; leaf--) {
        int isleaf = 1;
        for (int j = 0; j < NODES; j++) isleaf &= par[j] != leaf;
        if (!isleaf) continue;
        int path[NODES], d = depth_of(par, leaf);
        for (int k = d, a = leaf; k >= 0; k--, a = par[a]) path[k] = a;
        int32_t pt[NODES];
        for (int k = 0; k <= d; k++) pt[k] = tok[path[k]];
        rc = plain_decode(r, prompt, NP, pt, d + 1, ref);
        for (int k = 0; rc == 0 && k <= d; k++) {
            bad += count_diff(ref + (size_t)k * V, lg + (size_t)path[k] * V, (size_t)V) != 0;
            seen[path[k]] = 1;
        }
    }
    int all = 1;
    for (int i = 0; i < NODES; i++) all &= seen[i];
    CHECK(rc == 0 && all && bad == 0, "%s: every node's logits = its path decoded alone (%d differ)", r->name, bad);
    /* accept root -> 2 -> 5 (slots NP, NP+2, NP+5); the bonus token and the next tree go in with
     * the moves NP+2 -> NP+1, NP+5 -> NP+2; the next tree's slots NP+3 .. overlap the old tree */
    zs_kv_move mv[2] = {{seq, NP + 2, NP + 1}, {seq, NP + 5, NP + 2}};
    int32_t acc[3] = {tok[0], tok[2], tok[5]}, t2[5], p2[5], s2[5], a2[5];
    static const int par2[5] = {-1, 0, 0, 1, 2};
    for (int i = 0; i < 5; i++) {
        t2[i] = (int32_t)(5 + (i * 29 + 3) % (V - 6));
        p2[i] = NP + 3 + depth_of(par2, i);
        s2[i] = NP + 3 + i;
        a2[i] = par2[i];
    }
    /* a copy of the sequence's cache first: the same pass without the moves must differ */
    int cp;
    zs_kv_seq_open(r->kv, &cp);
    rc = zs_kv_seq_reserve(r->kv, cp, NP + 2 * NODES);
    const zs_model_config *c = zs_model_config_get(r->m);
    for (int l = 0; rc == 0 && l < c->n_layers; l++)
        for (int p = 0; p < NP + NODES; p++) {
            size_t row = (size_t)c->n_kv_heads * c->head_dim * zs_dtype_size(zs_kv_dtype(r->kv));
            if (zs_kv_ring(r->kv) && p < NP + NODES - 40) continue; /* the ring holds the last ones only */
            memcpy(zs_kv_k(r->kv, l, cp, p), zs_kv_k(r->kv, l, seq, p), row);
            memcpy(zs_kv_v(r->kv, l, cp, p), zs_kv_v(r->kv, l, seq, p), row);
        }
    float *lg2 = malloc((size_t)5 * V * 4), *lgn = malloc((size_t)5 * V * 4);
    if (rc == 0) rc = pass(r, seq, 5, t2, p2, s2, a2, mv, 2, lg2);
    CHECK(rc == 0, "%s: the next tree with the moves: %s", r->name, zs_errmsg());
    if (rc == 0) rc = pass(r, cp, 5, t2, p2, s2, a2, NULL, 0, lgn);
    bad = 0;
    int differ = 0;
    for (int leaf = 3; rc == 0 && leaf < 5; leaf++) {
        int path[5], d = depth_of(par2, leaf);
        for (int k = d, a = leaf; k >= 0; k--, a = par2[a]) path[k] = a;
        int32_t pt[8];
        memcpy(pt, acc, sizeof acc);
        for (int k = 0; k <= d; k++) pt[3 + k] = t2[path[k]];
        rc = plain_decode(r, prompt, NP, pt, 3 + d + 1, ref);
        for (int k = 0; rc == 0 && k <= d; k++) {
            bad += count_diff(ref + (size_t)(3 + k) * V, lg2 + (size_t)path[k] * V, (size_t)V) != 0;
            differ += count_diff(lgn + (size_t)path[k] * V, lg2 + (size_t)path[k] * V, (size_t)V) != 0;
        }
    }
    CHECK(rc == 0 && bad == 0, "%s: after the moves, the next tree = plain decoding of the accepted path (%d differ)",
          r->name, bad);
    CHECK(differ > 0, "%s: without the moves the next tree's logits differ", r->name);
    zs_kv_seq_close(r->kv, cp);
    /* zs_batch_check */
    int32_t li[5] = {0, 1, 2, 3, 4}, sq[5] = {seq, seq, seq, seq, seq};
    a2[2] = 2;
    zs_batch_tree bt = {s2, a2, NULL, 0};
    zs_batch b = {5, t2, p2, sq, li, 5, NULL, NULL, &bt};
    CHECK_ERR(zs_forward_run(r->f, &r->src, r->kv, &b, lg2), "token tree", "row 2");
    a2[2] = 0;
    bt.parent = NULL;
    CHECK_ERR(zs_forward_run(r->f, &r->src, r->kv, &b, lg2), "both slots and parents");
    bt.parent = a2;
    zs_kv_move far = {seq, NP + 2 * NODES, 3};
    bt.moves = &far;
    bt.n_moves = 1;
    CHECK_ERR(zs_forward_run(r->f, &r->src, r->kv, &b, lg2), "KV move", "room");
    zs_kv_seq_close(r->kv, seq);
    zs_kv_seq_close(r->kv, other);
    free(lg); free(ref); free(pl); free(lg2); free(lgn);
}

static int make_model(const char *arch, const char *over, const char *dir) {
    zs_init_opts io;
    int rc = zs_init_opts_default(arch, &io);
    if (rc < 0) return rc;
    io.cfg.n_layers = 2;
    io.cfg.dim = 64;
    io.cfg.n_heads = 4;
    io.cfg.n_kv_heads = 2;
    io.cfg.head_dim = 16;
    io.cfg.ffn_dim = 96;
    io.cfg.vocab_size = 300;
    io.cfg.max_seq = 256;
    io.seed = 5;
    io.random_norms = 1;
    io.init_std = 0.2f;
    if ((rc = zs_config_override(&io.cfg, over, "test-tree")) < 0) return rc;
    return zs_init_model_write(&io, dir);
}

int main(void) {
    static const int shapes[][3] = {{4, 4, 64}, {8, 2, 32}, {4, 1, 12}};
    const zs_dtype dts[3] = {ZS_F32, ZS_F16, ZS_BF16};
    const zs_att_params w3 = {0, 0, 3}, w40 = {0, 0.5f, 40};
    for (int s = 0; s < 3; s++)
        for (int d = 0; d < 3; d++) check_tree_op(shapes[s][0], shapes[s][1], shapes[s][2], dts[d], NULL);
    check_tree_op(8, 2, 32, ZS_F32, &w3);
    check_tree_op(4, 1, 12, ZS_BF16, &w3);
    check_tree_op(8, 2, 32, ZS_F16, &w40);
    check_tree_rules();
    check_kv_copy();

    char dir[4096];
    mrig r;
    tu_model_dir(dir, sizeof dir, "stories260K");
    const zs_dtype kvd[2] = {ZS_F32, ZS_BF16};
    for (int k = 0; k < 2; k++) {
        int rc = mrig_open(&r, dir, kvd[k], 0, k ? "stories260K, bf16 cache" : "stories260K");
        CHECK(rc == 0, "stories260K: %s", zs_errmsg());
        if (rc == 0) check_forward(&r);
        mrig_close(&r);
    }
    static const struct { const char *arch, *over, *name; int ring; } fam[] = {
        {"gemma2", "{\"sliding_window\": 5}", "Gemma 2 (window 5, soft-caps)", 0},
        {"mistral", "{\"sliding_window\": 8}", "Mistral (window 8, ring cache)", 1},
    };
    for (size_t i = 0; i < sizeof fam / sizeof fam[0]; i++) {
        char tmp[4096];
        tu_tmpdir(tmp, sizeof tmp, "tree");
        int rc = make_model(fam[i].arch, fam[i].over, tmp);
        if (rc == 0) rc = mrig_open(&r, tmp, ZS_F32, fam[i].ring, fam[i].name);
        CHECK(rc == 0, "%s: %s", fam[i].name, zs_errmsg());
        if (rc == 0) check_forward(&r);
        mrig_close(&r);
        tu_rmdir(tmp);
    }
    return tu_finish("test-tree");
}
