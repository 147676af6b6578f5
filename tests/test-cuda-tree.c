/* test-cuda-tree.c — token trees on the CUDA device (zs_batch.tree; docs/gpu.md "Speculative
 * decoding on CUDA: what holds"), on a GPU or the emulated device (tests/gpu/emu):
 *   - zs_cuda_attention_tree against the CPU's zs_op_attention_tree over the same paged cache (two
 *     trees of 12 nodes after prefixes of 37 and 100 positions, next to a causal chunk of a third
 *     sequence), caches in f32, f16 and bf16, GQA 1, 4 and an odd head dim, windows of 3 (inside the
 *     path) and 40 with a soft-cap, each impl (all take the simple kernel with a tree), within the
 *     tolerance of test-backend-ops' attention checks;
 *   - every tree row BIT FOR BIT the simple kernel's row for the same query decoded alone over its
 *     path compacted (what plain decoding gives), and the causal rows the tree-less call's;
 *   - the mask: a node's K and V poisoned with NaN change exactly its subtree's rows;
 *   - zs_cuda_kv_copy: moves in order (a move reading an earlier one's destination), as stored;
 *   - the forward pass (forward-cuda.c through a CUDA engine): stories260K (f32 weights, f32 and
 *     bf16 caches; Q8_0 weights) and a random Gemma 2 with a 5-token window and soft-caps: a tree
 *     of 12 drafts after a prompt, next to another sequence's prompt chunk, against each path
 *     decoded one token per pass on the same device (bit for bit where the matrix products do not
 *     depend on the number of rows: f32/bf16 weights on the emulated device; else within e2e-gpu's
 *     tolerances, and the rows that differ are printed), and against the CPU engine's tree pass;
 *     then the accepted path moved (tree->moves) in the next tree's pass = plain decoding again. */
#include "backend.h"
#include "common.h"
#include "testutil.h"

#ifndef ZS_CUDA
int main(void) {
    fprintf(stderr, "test-cuda-tree: this build has no CUDA part (CUDA=0); skipping\n");
    return 77;
}
#else

#include <cuda_runtime_api.h>
#include <pthread.h>

#include "attention.h"
#include "config.h"
#include "device.h"
#include "engine.h"
#include "init-model.h"
#include "kernels/cuda/kernels.h"
#include "kvcache.h"
#include "matmul-q8act.h"
#include "model.h"
#include "sched.h"
#include "spec.h"
#include "tensor.h"

static uint64_t rng = 0x2545f4914f6cdd1dull;
static float frand(void) { /* uniform in [-1, 1) */
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (float)((rng >> 11) * 0x1.0p-52) - 1.0f;
}

static zs_dev *D;
static void *S;

static void *up_raw(const void *x, size_t bytes) {
    void *d = zs_dev_alloc(D, bytes + 4);
    ZS_ASSERT(d != NULL && zs_dev_upload(D, d, x, bytes) == 0);
    return d;
}
static void down_raw(void *h, const void *d, size_t bytes) {
    ZS_ASSERT(zs_dev_sync(D) == 0);
    ZS_ASSERT(zs_dev_download(D, h, d, bytes) == 0);
}
static void rel(void *d) { zs_dev_release(D, d); }

static double nerr(const float *a, const float *ref, size_t n) {
    double m = 0, e = 0;
    for (size_t i = 0; i < n; i++) {
        m = fmax(m, fabs(ref[i]));
        double d = fabs((double)a[i] - ref[i]);
        if (!(d <= e)) e = isnan(d) ? INFINITY : d;
    }
    return e / (m > 1e-12 ? m : 1e-12);
}

static int rows_differ(const float *a, const float *b, size_t n) { return memcmp(a, b, n * 4) != 0; }

/* ---------- the attention kernel ---------- */

#define NODES 12
static const int tree_par[NODES] = {-1, 0, 0, 1, 1, 2, 3, 6, 4, 0, 9, 10}; /* depths 0..4 */
#define PA 37
#define PB 100

static int depth_of(const int *par, int i) {
    int d = 0;
    for (; par[i] >= 0; i = par[i]) d++;
    return d;
}

/* A paged pool in the host zs_kvcache layout (blocks of 16: K rows then V rows) of nseq
 * sequences with shuffled block ids, elements of dt. */
typedef struct {
    int nh, nkv, hd, kvd;
    zs_dtype dt;
    int nseq, len[3], tab_of[3], nblk;
    int32_t *tables;
    char *pool; /* nblk * 2 * 16 * kvd elements */
    size_t pool_bytes;
    int T, seq[2 * NODES + 5], pos[2 * NODES + 5], slot[2 * NODES + 5], par[2 * NODES + 5], tab[2 * NODES + 5];
    float *q;
} trig;

static size_t row_at(const trig *r, int s, int p, int which) { /* element index of a K/V row */
    int blk = r->tables[r->tab_of[s] + p / ZS_KV_BLOCK];
    return (((size_t)blk * 2 + (size_t)which) * ZS_KV_BLOCK + (size_t)(p % ZS_KV_BLOCK)) * (size_t)r->kvd;
}

static void trig_open(trig *r, int nh, int nkv, int hd, zs_dtype dt) {
    memset(r, 0, sizeof *r);
    r->nh = nh; r->nkv = nkv; r->hd = hd; r->kvd = nkv * hd; r->dt = dt;
    r->nseq = 3;
    const int len[3] = {PA + NODES, PB + NODES, 20};
    for (int s = 0; s < 3; s++) {
        r->len[s] = len[s];
        r->tab_of[s] = r->nblk;
        r->nblk += (len[s] + ZS_KV_BLOCK - 1) / ZS_KV_BLOCK;
    }
    r->tables = malloc((size_t)r->nblk * 4);
    for (int i = 0; i < r->nblk; i++) r->tables[i] = i;
    for (int i = r->nblk - 1; i > 0; i--) {
        int j = (int)((frand() + 1.0f) * 0.5f * (float)(i + 1)) % (i + 1);
        int32_t t = r->tables[i]; r->tables[i] = r->tables[j]; r->tables[j] = t;
    }
    size_t n = (size_t)r->nblk * 2 * ZS_KV_BLOCK * r->kvd, es = zs_dtype_size(dt);
    r->pool_bytes = n * es;
    float *f = malloc(n * 4);
    for (size_t i = 0; i < n; i++) f[i] = frand();
    r->pool = malloc(r->pool_bytes);
    zs_convert(r->pool, dt, f, ZS_F32, n);
    free(f);
    /* the call: A's tree, C's chunk (positions 13..17), B's tree */
    int T = 0;
    for (int t = 0; t < 3; t++) {
        int s = t == 0 ? 0 : t == 1 ? 2 : 1, P = s == 0 ? PA : PB, base = T;
        for (int i = 0; i < (s == 2 ? 5 : NODES); i++, T++) {
            r->seq[T] = s;
            r->tab[T] = r->tab_of[s];
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

static void trig_close(trig *r) {
    free(r->tables); free(r->pool); free(r->q);
}

/* the CPU op over the host pool */
static int cpu_tree(const trig *r, float *out, const zs_att_params *ap) {
    const void *ptrs[2 * 64];
    zs_att_seq views[3];
    size_t es = zs_dtype_size(r->dt);
    int used = 0;
    for (int s = 0; s < 3; s++) {
        int nb = (r->len[s] + ZS_KV_BLOCK - 1) / ZS_KV_BLOCK;
        const void **kp = ptrs + used, **vp = kp + nb;
        for (int j = 0; j < nb; j++) {
            kp[j] = r->pool + row_at(r, s, j * ZS_KV_BLOCK, 0) * es;
            vp[j] = r->pool + row_at(r, s, j * ZS_KV_BLOCK, 1) * es;
        }
        used += 2 * nb;
        views[s] = (zs_att_seq){kp, vp};
    }
    zs_att_tree tree = {r->slot, r->par};
    return zs_op_attention_tree(out, r->q, r->T, r->seq, r->pos, views, r->nh, r->nkv, r->hd, r->kvd, ZS_KV_BLOCK,
                                r->dt, ZS_ATT_AUTO, ap, &tree);
}

/* The device's call over pool (host bytes, uploaded): impl, with the tree (or without: tree 0). */
static int gpu_run(const trig *r, const char *pool, int impl, int tree, const zs_cuda_att_params *ap, float *out) {
    int T = r->T;
    int32_t base[2 * NODES + 5], poff[2 * NODES + 5], path[2 * NODES * 5 + 5];
    int np = zs_cuda_att_tree_plan(r->seq, r->pos, r->slot, r->par, T, base, poff, path);
    if (np < 0) return -1;
    void *dp = up_raw(pool, r->pool_bytes), *dq = up_raw(r->q, (size_t)T * r->nh * r->hd * 4);
    void *dtb = up_raw(r->tables, (size_t)r->nblk * 4), *dtab = up_raw(r->tab, (size_t)T * 4);
    void *dpos = up_raw(r->pos, (size_t)T * 4), *db = up_raw(base, (size_t)T * 4);
    void *dpo = up_raw(poff, (size_t)T * 4), *dpa = up_raw(path, (size_t)(np > 0 ? np : 1) * 4);
    size_t on = (size_t)T * r->nh * r->hd;
    void *dout = zs_dev_alloc(D, on * 4);
    ZS_ASSERT(dout != NULL);
    ZS_ASSERT(cudaMemsetAsync(dout, 0xff, on * 4, (cudaStream_t)S) == cudaSuccess); /* NaN: unwritten rows fail */
    zs_cuda_att_tree tr = {db, dpo, dpa};
    int rc = zs_cuda_attention_tree(impl, dout, ZS_F32, dq, r->nh * r->hd, dp, r->dt, dtb, dtab, dpos, T, r->nh, r->nkv,
                                    r->hd, ap, tree ? &tr : NULL, S);
    if (rc == 0) down_raw(out, dout, on * 4);
    rel(dp); rel(dq); rel(dtb); rel(dtab); rel(dpos); rel(db); rel(dpo); rel(dpa); rel(dout);
    return rc;
}

/* Row i's reference on the device: the simple kernel for its query alone over a one-sequence
 * cache that holds the prefix and then its path at consecutive positions (plain decoding's). */
static int gpu_path_ref(const trig *r, int i, const zs_cuda_att_params *ap, float *out) {
    int s = r->seq[i], d = r->pos[i] - (s == 0 ? PA : PB), P = r->pos[i] - d, path[NODES];
    for (int k = d, a = i; k >= 0; k--, a = r->par[a]) path[k] = a;
    int len = P + d + 1, nb = (len + ZS_KV_BLOCK - 1) / ZS_KV_BLOCK;
    size_t es = zs_dtype_size(r->dt), rowb = (size_t)r->kvd * es;
    size_t bytes = (size_t)nb * 2 * ZS_KV_BLOCK * r->kvd * es;
    char *pc = malloc(bytes);
    memset(pc, 0xff, bytes);
    int32_t tables[32], zero = 0, pos = len - 1;
    for (int j = 0; j < nb; j++) tables[j] = nb - 1 - j; /* reversed block ids */
    for (int p = 0; p < len; p++) {
        int from = p < P ? p : r->slot[path[p - P]];
        for (int w = 0; w < 2; w++) {
            size_t to = (((size_t)tables[p / ZS_KV_BLOCK] * 2 + (size_t)w) * ZS_KV_BLOCK + (size_t)(p % ZS_KV_BLOCK)) *
                        (size_t)r->kvd;
            memcpy(pc + to * es, r->pool + row_at(r, s, from, w) * es, rowb);
        }
    }
    size_t qd = (size_t)r->nh * r->hd;
    void *dp = up_raw(pc, bytes), *dq = up_raw(r->q + (size_t)i * qd, qd * 4), *dtb = up_raw(tables, (size_t)nb * 4);
    void *dz = up_raw(&zero, 4), *dpos = up_raw(&pos, 4), *dout = zs_dev_alloc(D, qd * 4);
    ZS_ASSERT(dout != NULL);
    int rc = zs_cuda_attention_ex(ZS_CUDA_ATTN_SIMPLE, dout, ZS_F32, dq, (int)qd, dp, r->dt, dtb, dz, dpos, 1, r->nh,
                                  r->nkv, r->hd, ap, S);
    if (rc == 0) down_raw(out, dout, qd * 4);
    rel(dp); rel(dq); rel(dtb); rel(dz); rel(dpos); rel(dout);
    free(pc);
    return rc;
}

static void check_tree_kernel(int nh, int nkv, int hd, zs_dtype dt, const zs_cuda_att_params *ap) {
    trig r;
    trig_open(&r, nh, nkv, hd, dt);
    char dn[128];
    snprintf(dn, sizeof dn, "CUDA tree attention, %s cache, %d heads / %d kv heads x %d, window %d, cap %g",
             zs_dtype_name(dt), nh, nkv, hd, ap ? ap->window : 0, ap ? (double)ap->softcap : 0.0);
    size_t qd = (size_t)nh * hd, n = (size_t)r.T * qd;
    float *ref = malloc(n * 4), *out = malloc(n * 4), *alt = malloc(n * 4), *one = malloc(qd * 4);
    zs_att_params cap = {ap ? ap->scale : 0, ap ? ap->softcap : 0, ap ? ap->window : 0};
    CHECK(cpu_tree(&r, ref, ap ? &cap : NULL) == 0, "%s: the CPU op: %s", dn, zs_errmsg());
    /* against the CPU op, each impl (the tolerance of test-backend-ops' f32 attention output); the
     * trees' rows take the simple kernel in every mode (the bits of simple's), the causal chunk of
     * the third sequence the mode's kernel (the bits of the tree-less call's) */
    static const int impls[3] = {ZS_CUDA_ATTN_SIMPLE, ZS_CUDA_ATTN_TILED, ZS_CUDA_ATTN_AUTO};
    float *plain = malloc(n * 4);
    for (int k = 0; k < 3; k++) {
        const char *in = zs_cuda_attention_mode_name(impls[k]);
        int rc = gpu_run(&r, r.pool, impls[k], 1, ap, k ? alt : out);
        CHECK(rc == 0, "%s (%s): launch: %s", dn, in, zs_cuda_take_error());
        double e = nerr(k ? alt : out, ref, n);
        CHECK(e <= 2e-5 + 1e-5, "%s (%s): against the CPU op: error %.3g", dn, in, e);
        rc = gpu_run(&r, r.pool, impls[k], 0, ap, plain);
        int bad = rc != 0;
        for (int i = 0; i < r.T; i++)
            bad += r.seq[i] == 2 ? rows_differ((k ? alt : out) + (size_t)i * qd, plain + (size_t)i * qd, qd)
                                 : rows_differ(alt + (size_t)i * qd, out + (size_t)i * qd, qd) && k;
        CHECK(bad == 0, "%s (%s): tree rows = the simple kernel's, causal rows = the tree-less call's (%d differ)", dn,
              in, bad);
    }
    free(plain);
    /* each tree row = its path decoded alone, bit for bit */
    int bad = 0;
    for (int i = 0; i < r.T; i++)
        if (r.seq[i] != 2) bad += gpu_path_ref(&r, i, ap, one) != 0 || rows_differ(one, out + (size_t)i * qd, qd);
    CHECK(bad == 0, "%s: %d of %d tree rows differ from their path decoded alone", dn, bad, 2 * NODES);
    /* the mask: each node of A's tree poisoned in turn changes exactly its subtree's rows (auto, the
     * forward pass's mode: the causal chunk's rows in the tiled kernel) */
    CHECK(gpu_run(&r, r.pool, ZS_CUDA_ATTN_AUTO, 1, ap, out) == 0, "%s: auto", dn);
    int wrong = 0;
    size_t es = zs_dtype_size(dt);
    char *pp = malloc(r.pool_bytes);
    float *nan = malloc((size_t)r.kvd * 4);
    for (int e = 0; e < r.kvd; e++) nan[e] = NAN;
    for (int x = 0; x < NODES; x++) {
        memcpy(pp, r.pool, r.pool_bytes);
        for (int w = 0; w < 2; w++) zs_convert(pp + row_at(&r, 0, r.slot[x], w) * es, dt, nan, ZS_F32, (size_t)r.kvd);
        int rc = gpu_run(&r, pp, ZS_CUDA_ATTN_AUTO, 1, ap, alt);
        for (int i = 0; i < r.T; i++) {
            int under = 0;
            if (r.seq[i] == 0)
                for (int a = i; a >= 0; a = r.par[a])
                    if (a == x) under = !ap || ap->window == 0 || r.pos[x] > r.pos[i] - ap->window;
            wrong += rc != 0 || rows_differ(alt + (size_t)i * qd, out + (size_t)i * qd, qd) != under;
        }
    }
    CHECK(wrong == 0, "%s: a poisoned node changes exactly its subtree's rows (%d rows wrong)", dn, wrong);
    free(pp); free(nan);
    free(ref); free(out); free(alt); free(one);
    trig_close(&r);
}

/* zs_cuda_kv_copy: in order (the second move reads the first one's destination), as stored */
static void check_kv_copy(void) {
    const zs_dtype dts[3] = {ZS_F32, ZS_F16, ZS_BF16};
    for (int k = 0; k < 3; k++) {
        int kvd = 24, nblk = 3;
        size_t es = zs_dtype_size(dts[k]), n = (size_t)nblk * 2 * ZS_KV_BLOCK * kvd, bytes = n * es;
        char *h = malloc(bytes), *want = malloc(bytes), *got = malloc(bytes);
        for (size_t i = 0; i < bytes; i++) h[i] = (char)(frand() * 127);
        memcpy(want, h, bytes);
        /* (block, row) pairs as element offsets of K rows: 2:5 -> 0:15, 0:15 -> 1:3, 1:3 -> 1:3 */
#define OFF(b, p) ((int64_t)(((b) * 2) * ZS_KV_BLOCK + (p)) * kvd)
        int64_t from[3] = {OFF(2, 5), OFF(0, 15), OFF(1, 3)}, to[3] = {OFF(0, 15), OFF(1, 3), OFF(1, 3)};
#undef OFF
        for (int m = 0; m < 3; m++)
            for (int w = 0; w < 2; w++) {
                size_t o = (size_t)w * ZS_KV_BLOCK * kvd;
                memmove(want + ((size_t)to[m] + o) * es, want + ((size_t)from[m] + o) * es, (size_t)kvd * es);
            }
        void *dp = up_raw(h, bytes), *df = up_raw(from, sizeof from), *dt = up_raw(to, sizeof to);
        CHECK(zs_cuda_kv_copy(dp, dts[k], df, dt, 3, kvd, S) == 0, "kv copy launch: %s", zs_cuda_take_error());
        down_raw(got, dp, bytes);
        CHECK(memcmp(got, want, bytes) == 0, "kv copy (%s): the moves in order, as stored", zs_dtype_name(dts[k]));
        CHECK(zs_cuda_kv_copy(dp, 99, df, dt, 3, kvd, S) == -1, "kv copy refuses element type 99");
        zs_cuda_take_error();
        rel(dp); rel(df); rel(dt);
        free(h); free(want); free(got);
    }
}

/* ---------- the forward pass ---------- */

typedef struct {
    zs_engine *e;
    int V;
    const char *name;
} frig;

static int frig_open(frig *r, const char *dir, int device, zs_dtype wdt, zs_dtype kvdt, const char *name) {
    memset(r, 0, sizeof *r);
    r->name = name;
    zs_engine_opts o;
    zs_engine_opts_default(&o);
    o.model_dir = dir;
    o.device = device;
    o.model.weight_dtype = wdt;
    o.kv_dtype = kvdt;
    o.ranks = 1;
    o.max_seqs = 6;
    o.max_batch_tokens = 64;
    int rc = zs_engine_open(&o, &r->e);
    if (rc == 0) r->V = zs_model_config_get(zs_engine_model(r->e))->vocab_size;
    return rc;
}

static int pass(frig *r, int seq, int n, const int32_t *tok, const int32_t *pos, const int32_t *slot,
                const int32_t *par, const zs_kv_move *mv, int nmv, float *lg) {
    int32_t sq[64], li[64];
    for (int i = 0; i < n; i++) { sq[i] = seq; li[i] = i; }
    zs_batch_tree t = {slot, par, mv, nmv};
    zs_batch b = {n, tok, pos, sq, li, n, NULL, NULL, slot || mv ? &t : NULL};
    return zs_engine_forward(r->e, &b, lg);
}

/* a fresh sequence: the prompt in one pass, then toks one per pass; the logits after each into lg */
static int plain_decode(frig *r, const int32_t *prompt, int np, const int32_t *toks, int n, float *lg) {
    zs_kvcache *kv = zs_engine_kv(r->e);
    int seq, rc;
    if ((rc = zs_kv_seq_open(kv, &seq)) < 0) return rc;
    float *scratch = malloc((size_t)np * r->V * 4);
    int32_t pos[64];
    for (int i = 0; i < np; i++) pos[i] = i;
    rc = zs_kv_seq_reserve(kv, seq, np + n);
    if (rc == 0) rc = pass(r, seq, np, prompt, pos, NULL, NULL, NULL, 0, scratch);
    for (int k = 0; rc == 0 && k < n; k++) {
        int32_t p = np + k;
        rc = pass(r, seq, 1, toks + k, &p, NULL, NULL, NULL, 0, lg + (size_t)k * r->V);
    }
    free(scratch);
    zs_kv_seq_close(kv, seq);
    return rc;
}

/* |a - b| over the largest |b| of each row, the worst row */
static double rel_err(const float *a, const float *b, size_t n) {
    double md = 0, mb = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= md)) md = isnan(d) ? INFINITY : d;
        if (fabs(b[i]) > mb) mb = fabs(b[i]);
    }
    return md / (mb > 0 ? mb : 1);
}

#define NP 20
/* The tree pass (and the next one with the moves) on engine r; with cpu (not NULL) also on the CPU
 * engine. exact: the tree rows must be plain decoding's bits; else within tol (and the number of
 * rows that differ is printed). */
static void check_forward(frig *r, frig *cpu, int exact, double tol) {
    int V = r->V;
    zs_kvcache *kv = zs_engine_kv(r->e);
    int32_t prompt[NP], tok[NODES], pos[NODES], slot[NODES], par[NODES];
    for (int i = 0; i < NP; i++) prompt[i] = (int32_t)(1 + (i * 37 + 11) % (V - 2));
    for (int i = 0; i < NODES; i++) {
        tok[i] = (int32_t)(3 + (i * 53 + 7) % (V - 4));
        pos[i] = NP + depth_of(tree_par, i);
        slot[i] = NP + i;
        par[i] = tree_par[i];
    }
    float *lg = malloc((size_t)(NODES + 6) * V * 4), *ref = malloc((size_t)(NODES + 8) * V * 4);
    float *pl = malloc((size_t)NP * V * 4), *lc = malloc((size_t)(NODES + 6) * V * 4);
    int32_t bt[NODES + 6], bp[NODES + 6], bsl[NODES + 6], bpa[NODES + 6], bsq[NODES + 6], bli[NODES + 6];
    int seq = -1, other = -1, rc = 0; /* the device engine's sequences */
    for (int k = 0; k < (cpu ? 2 : 1) && rc == 0; k++) {
        int seq_k, other_k;
        frig *e = k ? cpu : r;
        zs_kvcache *kk = zs_engine_kv(e->e);
        int32_t ppos[NP];
        for (int i = 0; i < NP; i++) ppos[i] = i;
        zs_kv_seq_open(kk, &seq_k);
        zs_kv_seq_open(kk, &other_k);
        if (!k) {
            seq = seq_k;
            other = other_k;
        }
        rc = zs_kv_seq_reserve(kk, seq_k, NP + 2 * NODES);
        if (rc == 0) rc = zs_kv_seq_reserve(kk, other_k, NP);
        if (rc == 0) rc = pass(e, seq_k, NP, prompt, ppos, NULL, NULL, NULL, 0, pl);
        /* the tree, with another sequence's prompt chunk in the same pass */
        for (int i = 0; i < 6; i++) {
            bt[i] = prompt[i + 3];
            bp[i] = bsl[i] = i;
            bpa[i] = -1;
            bsq[i] = other_k;
            bli[i] = NODES + i;
        }
        for (int i = 0; i < NODES; i++) {
            bt[6 + i] = tok[i];
            bp[6 + i] = pos[i];
            bsl[6 + i] = slot[i];
            bpa[6 + i] = par[i] < 0 ? -1 : 6 + par[i];
            bsq[6 + i] = seq_k;
            bli[6 + i] = i;
        }
        zs_batch_tree t = {bsl, bpa, NULL, 0};
        zs_batch b = {NODES + 6, bt, bp, bsq, bli, NODES + 6, NULL, NULL, &t};
        if (rc == 0) rc = zs_engine_forward(e->e, &b, k ? lc : lg);
        CHECK(rc == 0, "%s: the tree pass (%s): %s", r->name, k ? "cpu" : "cuda", zs_errmsg());
        if (k) {
            zs_kv_seq_close(kk, seq_k);
            zs_kv_seq_close(kk, other_k);
        }
    }
    if (cpu && rc == 0) {
        double e = rel_err(lg, lc, (size_t)(NODES + 6) * V);
        CHECK(e <= tol, "%s: the tree pass on the device against the CPU's: %.3g (tolerance %g)", r->name, e, tol);
    }
    /* each leaf's path decoded alone */
    int bad = 0, cmp = 0, seen[NODES] = {0}; /* rows compared: a node once per leaf below it */
    double worst = 0;
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
            bad += rows_differ(ref + (size_t)k * V, lg + (size_t)path[k] * V, (size_t)V);
            cmp++;
            worst = fmax(worst, rel_err(lg + (size_t)path[k] * V, ref + (size_t)k * V, (size_t)V));
            seen[path[k]] = 1;
        }
    }
    /* a chain (the path root, 1, 4, 8) verified as causal rows of one chunk, as sched-spec.c sends
     * drafts, and as a tree (parent = the previous row): a chunk's rows take the tiled attention
     * kernel in auto mode, a tree's the simple one, as plain decoding's */
    static const int chain[4] = {0, 1, 4, 8};
    int32_t ct[4], cpos[4], cslot[4], cpar[4];
    float *lch = malloc((size_t)4 * V * 4);
    int cbad[2] = {0, 0};
    double cworst[2] = {0, 0};
    for (int k = 0; k < 4; k++) {
        ct[k] = tok[chain[k]];
        cpos[k] = cslot[k] = NP + k;
        cpar[k] = k - 1;
    }
    if (rc == 0) rc = plain_decode(r, prompt, NP, ct, 4, ref);
    for (int as_tree = 0; as_tree < 2 && rc == 0; as_tree++) {
        int cs;
        int32_t ppos[NP];
        for (int i = 0; i < NP; i++) ppos[i] = i;
        if ((rc = zs_kv_seq_open(kv, &cs)) < 0) break;
        rc = zs_kv_seq_reserve(kv, cs, NP + 4);
        if (rc == 0) rc = pass(r, cs, NP, prompt, ppos, NULL, NULL, NULL, 0, pl);
        if (rc == 0)
            rc = pass(r, cs, 4, ct, cpos, as_tree ? cslot : NULL, as_tree ? cpar : NULL, NULL, 0, lch);
        for (int k = 0; rc == 0 && k < 4; k++) {
            cbad[as_tree] += rows_differ(ref + (size_t)k * V, lch + (size_t)k * V, (size_t)V);
            cworst[as_tree] = fmax(cworst[as_tree], rel_err(lch + (size_t)k * V, ref + (size_t)k * V, (size_t)V));
        }
        zs_kv_seq_close(kv, cs);
    }
    fprintf(stderr, "%s: a chain of 4 drafts vs plain decoding: as a chunk %d of 4 rows differ (worst %.3g), as a "
            "tree %d (worst %.3g)\n", r->name, cbad[0], cworst[0], cbad[1], cworst[1]);
    CHECK(rc == 0 && cworst[0] <= tol && (exact ? cbad[1] == 0 : cworst[1] <= tol),
          "%s: a chain verified as a chunk (within the tolerance) and as a tree (%s)", r->name,
          exact ? "bit for bit" : "within the tolerance");
    free(lch);
    int all = 1;
    for (int i = 0; i < NODES; i++) all &= seen[i];
    fprintf(stderr, "%s: tree rows vs plain decoding on the device: %d of %d rows (nodes once per path) differ in "
            "some bit, worst %.3g of the largest logit\n", r->name, bad, cmp, worst);
    CHECK(rc == 0 && all && (exact ? bad == 0 : worst <= tol),
          "%s: every node's logits = its path decoded alone (%s; %d rows differ, worst %.3g)", r->name,
          exact ? "bit for bit" : "within the tolerance", bad, worst);
    /* accept root -> 2 -> 5; the next tree goes in with the moves NP+2 -> NP+1, NP+5 -> NP+2 */
    zs_kv_move mv[2] = {{seq, NP + 2, NP + 1}, {seq, NP + 5, NP + 2}};
    int32_t acc[3] = {tok[0], tok[2], tok[5]}, t2[5], p2[5], s2[5], a2[5];
    static const int par2[5] = {-1, 0, 0, 1, 2};
    for (int i = 0; i < 5; i++) {
        t2[i] = (int32_t)(5 + (i * 29 + 3) % (V - 6));
        p2[i] = NP + 3 + depth_of(par2, i);
        s2[i] = NP + 3 + i;
        a2[i] = par2[i];
    }
    float *lg2 = malloc((size_t)5 * V * 4);
    if (rc == 0) rc = pass(r, seq, 5, t2, p2, s2, a2, mv, 2, lg2);
    CHECK(rc == 0, "%s: the next tree with the moves: %s", r->name, zs_errmsg());
    bad = 0;
    worst = 0;
    for (int leaf = 3; rc == 0 && leaf < 5; leaf++) {
        int path[5], d = depth_of(par2, leaf);
        for (int k = d, a = leaf; k >= 0; k--, a = par2[a]) path[k] = a;
        int32_t pt[8];
        memcpy(pt, acc, sizeof acc);
        for (int k = 0; k <= d; k++) pt[3 + k] = t2[path[k]];
        rc = plain_decode(r, prompt, NP, pt, 3 + d + 1, ref);
        for (int k = 0; rc == 0 && k <= d; k++) {
            bad += rows_differ(ref + (size_t)(3 + k) * V, lg2 + (size_t)path[k] * V, (size_t)V);
            worst = fmax(worst, rel_err(lg2 + (size_t)path[k] * V, ref + (size_t)(3 + k) * V, (size_t)V));
        }
    }
    CHECK(rc == 0 && (exact ? bad == 0 : worst <= tol),
          "%s: after the moves, the next tree = plain decoding of the accepted path (%d rows differ, worst %.3g)",
          r->name, bad, worst);
    /* zs_batch_check on the device too */
    int32_t li[5] = {0, 1, 2, 3, 4}, sq[5] = {seq, seq, seq, seq, seq};
    a2[2] = 2;
    zs_batch_tree tb = {s2, a2, NULL, 0};
    zs_batch b = {5, t2, p2, sq, li, 5, NULL, NULL, &tb};
    CHECK_ERR(zs_engine_forward(r->e, &b, lg2), "token tree", "row 2");
    zs_kv_seq_close(kv, seq);
    zs_kv_seq_close(kv, other);
    free(lg); free(ref); free(pl); free(lc); free(lg2);
}

static int make_gemma2(const char *dir) {
    zs_init_opts io;
    int rc = zs_init_opts_default("gemma2", &io);
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
    if ((rc = zs_config_override(&io.cfg, "{\"sliding_window\": 5}", "test-cuda-tree")) < 0) return rc;
    return zs_init_model_write(&io, dir);
}

static void check_sched(const char *dir, const char *name, int exact); /* below */

static void check_forwards(void) {
    int emu = getenv("ZS_EMU_DEVICE") != NULL;
    char dir[4096];
    tu_model_dir(dir, sizeof dir, "stories260K");
    static const struct { zs_dtype w, kv; const char *name; } st[] = {
        {ZS_F32, ZS_F32, "stories260K f32"},
        {ZS_F32, ZS_BF16, "stories260K f32, bf16 cache"},
        {ZS_Q8_0, ZS_F32, "stories260K Q8_0"},
    };
    frig cpu;
    int crc = frig_open(&cpu, dir, ZS_DEVICE_CPU, ZS_F32, ZS_F32, "stories260K on the CPU");
    CHECK(crc == 0, "stories260K on the CPU: %s", zs_errmsg());
    for (size_t i = 0; i < sizeof st / sizeof st[0]; i++) {
        frig r;
        int rc = frig_open(&r, dir, ZS_DEVICE_CUDA, st[i].w, st[i].kv, st[i].name);
        CHECK(rc == 0, "%s: %s", st[i].name, zs_errmsg());
        /* Q8_0: T <= 8 takes the fused kernel (the CPU's bits), the tree's 18 rows bf16 cuBLAS */
        int q = zs_dtype_is_quant(st[i].w);
        if (rc == 0) check_forward(&r, i == 0 && crc == 0 ? &cpu : NULL, emu && !q, q ? 0.15 : 1e-3);
        if (r.e) zs_engine_free(r.e);
    }
    if (crc == 0) zs_engine_free(cpu.e);
    char tmp[4096];
    tu_tmpdir(tmp, sizeof tmp, "cuda-tree");
    int rc = make_gemma2(tmp);
    CHECK(rc == 0, "gemma2: %s", zs_errmsg());
    frig r = {0}, c = {0};
    if (rc == 0) rc = frig_open(&r, tmp, ZS_DEVICE_CUDA, ZS_F32, ZS_F32, "Gemma 2 (window 5, soft-caps)");
    if (rc == 0) rc = frig_open(&c, tmp, ZS_DEVICE_CPU, ZS_F32, ZS_F32, "Gemma 2 on the CPU");
    CHECK(rc == 0, "Gemma 2: %s", zs_errmsg());
    if (rc == 0) check_forward(&r, &c, emu, 1e-3);
    if (r.e) zs_engine_free(r.e);
    if (c.e) zs_engine_free(c.e);
    check_sched(dir, "stories260K f32", emu);
    /* its window and soft-caps make the tiled and simple kernels' sums differ in the last bits */
    if (rc == 0) check_sched(tmp, "Gemma 2 (window 5, soft-caps)", emu);
    tu_rmdir(tmp);
}

/* ---------- the scheduler: speculative decoding on the device ---------- */

#define SQ_MAXT 40
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done, n;
    int32_t tok[SQ_MAXT];
    float lp[SQ_MAXT];
} sq_req;

static void sq_token(void *ud, int32_t tok, const char *t, size_t n, float lp, const int32_t *ti, const float *tl,
                     int nt) {
    (void)t; (void)n; (void)ti; (void)tl; (void)nt;
    sq_req *q = ud;
    pthread_mutex_lock(&q->mu);
    if (q->n < SQ_MAXT) {
        q->lp[q->n] = lp;
        q->tok[q->n++] = tok;
    }
    pthread_mutex_unlock(&q->mu);
}

static void sq_done(void *ud, int finish, const char *t, size_t n, int np, int ng, int err, const char *msg) {
    (void)finish; (void)t; (void)n; (void)np; (void)ng; (void)err; (void)msg;
    sq_req *q = ud;
    pthread_mutex_lock(&q->mu);
    q->done = 1;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

/* NREQ greedy requests at once on prompts that repeat themselves, through the scheduler on the
 * device: plain decoding (no drafts) against prompt lookup with 4 drafts per step. The scheduler
 * sends a CUDA verification as a tree (chains too), whose rows take the attention kernel of a lone
 * decode token: with f32 weights on the emulated device the tokens and logprobs are plain
 * decoding's bit for bit. (On these two models the tiled kernel happens to give the same bits
 * too, so this does not tell the two apart: check_forward's chain as a chunk does.) On a GPU
 * cuBLAS may sum in another order for more rows: counted, not required. */
static void check_sched(const char *dir, const char *name, int exact) {
    enum { NREQ = 6 };
    static const char *texts[NREQ] = {
        "Lily and Tom went to the park. Lily and Tom went to the park. Lily and",
        "Once upon a time there was a dog. Once upon a time there was a",
        "The sun is big. The sun is hot. The sun is",
        "Tom had a ball. Tom had a ball. Tom had a",
        "She said hello. She said hello. She said",
        "One day, one day, one day, one",
    };
    static sq_req q[2][NREQ];
    zs_sched_stats st[2];
    memset(st, 0, sizeof st);
    for (int mode = 0; mode < 2; mode++) {
        frig r;
        if (frig_open(&r, dir, ZS_DEVICE_CUDA, ZS_F32, ZS_F32, name) < 0) {
            CHECK(0, "sched: %s on the device: %s", name, zs_errmsg());
            return;
        }
        zs_spec *ng = NULL;
        if (mode) CHECK(zs_spec_ngram_new(ZS_SPEC_NGRAM_MIN, ZS_SPEC_NGRAM_MAX, &ng) == 0, "ngram: %s", zs_errmsg());
        zs_sched_opts so = {NREQ, 64, 64, 1, ng, mode ? 4 : 0, !mode, 0, 0, 0, 0};
        zs_sched *s = NULL;
        if (zs_sched_new(r.e, &so, &s) < 0) {
            CHECK(0, "sched: %s", zs_errmsg());
            zs_spec_free(ng);
            zs_engine_free(r.e);
            return;
        }
        int32_t *ids[NREQ] = {NULL};
        for (int j = 0; j < NREQ; j++) {
            sq_req *x = &q[mode][j];
            memset(x, 0, sizeof *x);
            pthread_mutex_init(&x->mu, NULL);
            pthread_cond_init(&x->cv, NULL);
            size_t n = 0;
            if (zs_tokenizer_encode(zs_engine_tokenizer(r.e), texts[j], strlen(texts[j]), 1, &ids[j], &n) < 0) {
                x->done = 1;
                continue;
            }
            zs_req_params rp;
            memset(&rp, 0, sizeof rp);
            rp.prompt = ids[j];
            rp.n_prompt = (int)n;
            rp.max_tokens = SQ_MAXT;
            zs_sampler_params_default(&rp.sampling);
            rp.sampling.temperature = 0;
            rp.top_logprobs = -1;
            rp.ignore_eos = 1;
            zs_req_sink sink = {sq_token, sq_done, x, NULL};
            if (zs_sched_submit(s, &rp, &sink, NULL) < 0) {
                CHECK(0, "submit: %s", zs_errmsg());
                x->done = 1;
            }
        }
        for (int j = 0; j < NREQ; j++) {
            pthread_mutex_lock(&q[mode][j].mu);
            while (!q[mode][j].done) pthread_cond_wait(&q[mode][j].cv, &q[mode][j].mu);
            pthread_mutex_unlock(&q[mode][j].mu);
            free(ids[j]);
        }
        zs_sched_stats_get(s, &st[mode]);
        zs_sched_free(s);
        zs_spec_free(ng);
        zs_engine_free(r.e);
    }
    int same_tok = 0, same_lp = 0;
    for (int j = 0; j < NREQ; j++) {
        int n = q[0][j].n;
        same_tok += n == SQ_MAXT && q[1][j].n == n && !memcmp(q[0][j].tok, q[1][j].tok, (size_t)n * 4);
        same_lp += q[1][j].n == n && !memcmp(q[0][j].lp, q[1][j].lp, (size_t)n * 4);
    }
    fprintf(stderr, "%s: sched on the device, prompt lookup (4 drafts) against plain decoding: %d of %d requests the "
            "same tokens, %d the same logprob bits; %llu of %llu drafts accepted, %llu passes against %llu\n",
            name, same_tok, NREQ, same_lp, (unsigned long long)st[1].spec_accepted, (unsigned long long)st[1].spec_drafted,
            (unsigned long long)st[1].passes, (unsigned long long)st[0].passes);
    CHECK(st[1].spec_accepted > 0, "%s: sched on the device: drafts accepted (%llu of %llu)", name,
          (unsigned long long)st[1].spec_accepted, (unsigned long long)st[1].spec_drafted);
    if (exact)
        CHECK(same_tok == NREQ && same_lp == NREQ,
              "%s: sched on the emulated device: greedy speculation = plain decoding bit for bit (%d, %d of %d)", name,
              same_tok, same_lp, NREQ);
}

int main(void) {
    /* the CUDA kernels reproduce the CPU's exact f32-activation path (matmul-q8act.h) */
    zs_op_matmul_quant_act(ZS_QUANT_ACT_F32);
    if (zs_backend_cuda_devices() == 0) {
        fprintf(stderr, "test-cuda-tree: no CUDA device visible; skipping\n");
        return 77;
    }
    CHECK(zs_dev_open(0, &D) == 0, "open device 0: %s", zs_errmsg());
    if (!D) return tu_finish("test-cuda-tree");
    S = zs_dev_stream(D, ZS_Q_COMPUTE);
    static const int shapes[][3] = {{4, 4, 64}, {8, 2, 32}, {4, 1, 12}};
    const zs_dtype dts[3] = {ZS_F32, ZS_F16, ZS_BF16};
    const zs_cuda_att_params w3 = {0, 0, 3}, w40 = {0, 0.5f, 40};
    for (int s = 0; s < 3; s++)
        for (int d = 0; d < 3; d++) check_tree_kernel(shapes[s][0], shapes[s][1], shapes[s][2], dts[d], NULL);
    check_tree_kernel(8, 2, 32, ZS_F32, &w3);
    check_tree_kernel(4, 1, 12, ZS_BF16, &w3);
    check_tree_kernel(8, 2, 32, ZS_F16, &w40);
    check_kv_copy();
    CHECK(zs_dev_sync(D) == 0, "device: %s", zs_errmsg());
    zs_dev_free(D);
    D = NULL;
    check_forwards();
    return tu_finish("test-cuda-tree");
}
#endif
