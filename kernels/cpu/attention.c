/* attention.c — causal attention over the paged KV cache on the CPU (attention.h): the tokens of
 * a batch are grouped by sequence and cut into tiles; one task is (tile, kv head) and does every
 * query head of that kv head for every token of the tile, so each block of K and V is read once
 * per tile and reused by group × tile rows. Tasks run on the pool's threads; every output row is
 * written by exactly one task and its arithmetic is fixed (attention.h), so the bits depend on
 * neither the batch, the tile size nor the thread count. The inner loops (attention-kern.h) are
 * compiled twice, generic and AVX2+FMA, with the same fused operations in the same order. */
#include "attention.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "ops.h"
#include "pool.h"

#pragma GCC diagnostic ignored "-Wpsabi"

typedef float zs_v8 __attribute__((vector_size(32)));
typedef float zs_v8u __attribute__((vector_size(32), aligned(4), may_alias)); /* unaligned loads */

typedef struct {
    float *out;
    const float *q;
    const int *tok; /* the tile's token indices */
    const int *pos;
    const zs_att_seq *sq;
    int nt, kh, group, hd, kv_stride, block;
    size_t qd;
    float scale;
} att_task;

/* generic: lane by lane fmaf (exact, so the same bits as vfmadd) */
#define ATT_FMA8(a, b, c)                                                                      \
    ({                                                                                         \
        zs_v8 fa_ = (a), fb_ = (b), fc_ = (c), fr_;                                            \
        for (int fi_ = 0; fi_ < 8; fi_++) fr_[fi_] = __builtin_fmaf(fa_[fi_], fb_[fi_], fc_[fi_]); \
        fr_;                                                                                   \
    })
#define KERN_NAME(x) zs_att_generic_##x
#include "attention-kern.h"
#undef KERN_NAME
#undef ATT_FMA8

#pragma GCC push_options
#pragma GCC target("avx2,fma")
#include <immintrin.h>
#define ATT_FMA8(a, b, c) ((zs_v8)_mm256_fmadd_ps((__m256)(a), (__m256)(b), (__m256)(c)))
#define KERN_NAME(x) zs_att_avx2_##x
#include "attention-kern.h"
#undef KERN_NAME
#undef ATT_FMA8
#pragma GCC pop_options

/* per-thread score scratch, freed when its thread exits */
static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static pthread_key_t key;
typedef struct { float *p; size_t n; } scratch;
static void scratch_free(void *p) {
    scratch *s = p;
    free(s->p);
    free(s);
}
static void key_init(void) { (void)pthread_key_create(&key, scratch_free); }
static float *scratch_get(size_t n) {
    pthread_once(&key_once, key_init);
    scratch *s = pthread_getspecific(key);
    if (!s) {
        if (!(s = calloc(1, sizeof *s))) return NULL;
        if (pthread_setspecific(key, s) != 0) { free(s); return NULL; }
    }
    if (s->n < n) {
        float *p = zs_aligned_alloc(64, n * sizeof(float));
        if (!p) return NULL;
        free(s->p);
        s->p = p;
        s->n = n;
    }
    return s->p;
}

typedef struct { int seq, start, nt; } att_tile;

typedef struct {
    float *out;
    const float *q;
    const int *ord, *seq, *pos;
    const zs_att_seq *seqs;
    const att_tile *tiles;
    int ntiles, nkv, group, hd, kv_stride, block, avx2;
    size_t qd;
    float scale;
    atomic_int failed;
} att_job;

static void att_run_task(void *arg, int task) {
    att_job *j = arg;
    /* the last tiles (the longest rows of a prefill chunk) first, for balance */
    const att_tile *tl = &j->tiles[j->ntiles - 1 - task / j->nkv];
    att_task t = {j->out, j->q, j->ord + tl->start, j->pos, &j->seqs[tl->seq], tl->nt, task % j->nkv, j->group,
                  j->hd, j->kv_stride, j->block, j->qd, j->scale};
    int maxp = 0;
    for (int i = 0; i < t.nt; i++) maxp = ZS_MAX(maxp, j->pos[t.tok[i]]);
    size_t lds = ((size_t)maxp + 1 + 7) & ~(size_t)7;
    float *s = scratch_get(lds * (size_t)t.nt * (size_t)j->group);
    if (!s) { atomic_store(&j->failed, 1); return; }
    if (j->avx2) zs_att_avx2_task(&t, s, lds);
    else zs_att_generic_task(&t, s, lds);
}

static int have_avx2(void) {
    static int v = -1;
    if (v < 0) {
        __builtin_cpu_init();
        v = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }
    return v;
}

int zs_op_attention(float *out, const float *q, int T, const int *seq, const int *pos, const zs_att_seq *seqs,
                    int nh, int nkv, int hd, int kv_stride, int block, int path) {
    if (T <= 0) return 0;
    if (nh <= 0 || nkv <= 0 || nh % nkv || hd <= 0 || kv_stride < nkv * hd || block <= 0)
        return zs_err(ZS_EINVAL, "attention: bad shape (heads %d, kv heads %d, head dim %d, stride %d, block %d)",
                      nh, nkv, hd, kv_stride, block);
    int avx2 = path == ZS_ATT_AVX2 ? 1 : path == ZS_ATT_GENERIC ? 0 : have_avx2();
    if (avx2 && !have_avx2()) return zs_err(ZS_EUNSUPPORTED, "attention: this CPU has no AVX2+FMA");
    int group = nh / nkv;
    int *ord = malloc((size_t)T * sizeof(int));
    att_tile *tiles = malloc((size_t)T * sizeof(att_tile));
    if (!ord || !tiles) {
        free(ord); free(tiles);
        return zs_err(ZS_ENOMEM, "attention: out of memory for %d tokens", T);
    }
    /* tokens grouped by sequence, in batch order within one (stable insertion sort: a batch is
     * already grouped, so this is one pass) */
    for (int i = 0; i < T; i++) {
        int k = i;
        while (k > 0 && seq[ord[k - 1]] > seq[i]) { ord[k] = ord[k - 1]; k--; }
        ord[k] = i;
    }
    /* tiles of up to qt tokens of one sequence: ~64 rows a tile, smaller when there would be
     * too few tasks for the threads (the tiling never changes an element's arithmetic) */
    int threads = zs_pool_threads(), qt = ZS_MAX(1, 64 / group), ntiles;
    for (;;) {
        ntiles = 0;
        for (int i = 0; i < T;) {
            int k = i;
            while (k < T && seq[ord[k]] == seq[ord[i]] && k - i < qt) k++;
            tiles[ntiles++] = (att_tile){seq[ord[i]], i, k - i};
            i = k;
        }
        if (qt == 1 || (size_t)ntiles * (size_t)nkv >= 4 * (size_t)threads) break;
        qt = ZS_MAX(1, qt / 2);
    }
    att_job j = {out, q, ord, seq, pos, seqs, tiles, ntiles, nkv, group, hd, kv_stride, block, avx2,
                 (size_t)nh * hd, 1.0f / sqrtf((float)hd), 0};
    zs_pool_run(att_run_task, &j, ntiles * nkv);
    free(ord);
    free(tiles);
    if (atomic_load(&j.failed)) return zs_err(ZS_ENOMEM, "attention: out of memory for the scores");
    return 0;
}
