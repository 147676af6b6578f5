/* attention.c — causal attention over the paged KV cache on the CPU (attention.h): the tokens of
 * a batch are grouped by sequence and cut into tiles; one task is (tile, kv head) and does every
 * query head of that kv head for every token of the tile, so each block of K and V is read once
 * per tile and reused by group × tile rows. Tasks run on the pool's threads; every output row is
 * written by exactly one task and its arithmetic is fixed (attention.h), so the bits depend on
 * neither the batch, the tile size nor the thread count. The inner loops (attention-kern.h) are
 * compiled for each cache element type (f32; f16 and bf16, widened in registers as they are
 * read) in two builds, generic and AVX2+FMA (+F16C for f16), with the same fused operations in
 * the same order. The family parameters (zs_att_params) change the scores' multiplier, soft-cap
 * the scores of each row before its softmax, and with a sliding window start each row's keys at
 * pos - window + 1 (blocks no row of a tile sees are never read); without them the work is
 * exactly the plain causal attention's. */
#include "attention.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "ops.h"
#include "pool.h"
#include "tensor.h"

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
    float scale;   /* the dot products' multiplier */
    float softcap; /* > 0: scores soft-capped */
    int window;    /* > 0: a sliding window */
    int base;      /* the first position of the first block the tile sees (0 without a window) */
    const struct att_tree_rows *tr; /* a token tree (zs_att_tree), or NULL: every token causal */
    int *path;     /* scratch for a tree token's path (its depth + 1 entries at most) */
} att_task;

/* A tree's rows resolved once per call: per token, the end (exclusive) of the run of positions
 * before its path (pos + 1 for a causal token, its root's slot for a tree token), the last key it
 * reads (its slot), and its depth below its root (0: causal). */
typedef struct att_tree_rows {
    const int *slot, *parent;
    int *cend, *kend, *depth;
} att_tree_rows;

/* the first key a query at position p sees (window 0: key 0) */
static inline int att_first_key(int p, int window) {
    return window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
}

/* Token tok's keys: the run [*c0, *ce) of positions (c0 the first in the window; the run is empty
 * when the window starts at or past its end), then, for a tree token, the visible part of its
 * path; *ke: the last key position it reads (the scores cover c0..ke). */
static inline void att_row_keys(const att_task *t, int tok, int *c0, int *ce, int *ke) {
    int p = t->pos[tok], lo = att_first_key(p, t->window);
    int e = t->tr ? t->tr->cend[tok] : p + 1;
    *ce = e;
    *c0 = lo < e ? lo : e;
    *ke = t->tr ? t->tr->kend[tok] : p;
}

/* 1 when some row of the task sees a key of the block [b0, b0 + B) (a tree row: any key between
 * its first and its slot, a superset of what it reads) */
static inline int att_block_seen(const att_task *t, int b0, int B) {
    for (int i = 0; i < t->nt; i++) {
        int c0, ce, ke;
        att_row_keys(t, t->tok[i], &c0, &ce, &ke);
        if (ke >= b0 && c0 < b0 + B) return 1;
    }
    return 0;
}

/* A tree token's path, root first, into path[0..depth]; returns how many of it the window
 * leaves visible, a suffix: path[n - k .. n) (every one without a window). */
static inline int att_path(const att_task *t, int tok, int *path, int *first) {
    const att_tree_rows *tr = t->tr;
    int d = tr->depth[tok], lo = att_first_key(t->pos[tok], t->window), k0 = 0;
    for (int i = d, a = tok; i >= 0; i--, a = tr->parent[a]) {
        path[i] = a;
        if (t->pos[a] < lo && k0 == 0) k0 = i + 1;
    }
    *first = k0;
    return d + 1 - k0;
}

/* one bf16 widened: its 16 bits are the high half of the f32 (exact) */
static inline float att_bf16_widen(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

typedef void (*att_task_fn)(const att_task *t, float *s, size_t lds);

/* generic: lane by lane fmaf (exact, so the same bits as vfmadd); 16-bit elements widened one
 * by one */
#define ATT_FMA8(a, b, c)                                                                      \
    ({                                                                                         \
        zs_v8 fa_ = (a), fb_ = (b), fc_ = (c), fr_;                                            \
        for (int fi_ = 0; fi_ < 8; fi_++) fr_[fi_] = __builtin_fmaf(fa_[fi_], fb_[fi_], fc_[fi_]); \
        fr_;                                                                                   \
    })
static inline zs_v8 att_g_f16x8(const uint16_t *p) {
    zs_v8 r;
    for (int i = 0; i < 8; i++) r[i] = zs_f16_to_f32(p[i]);
    return r;
}
static inline zs_v8 att_g_bf16x8(const uint16_t *p) {
    zs_v8 r;
    for (int i = 0; i < 8; i++) r[i] = att_bf16_widen(p[i]);
    return r;
}
#define KERN_NAME(x) zs_att_generic_##x
#define KV_T float
#define KV_LD8(p) (*(const zs_v8u *)(p))
#define KV_LD1(p) (*(p))
#include "attention-kern.h"
#undef KERN_NAME
#undef KV_T
#undef KV_LD8
#undef KV_LD1
#define KERN_NAME(x) zs_att_generic_f16_##x
#define KV_T uint16_t
#define KV_LD8(p) att_g_f16x8(p)
#define KV_LD1(p) zs_f16_to_f32(*(p))
#include "attention-kern.h"
#undef KERN_NAME
#undef KV_T
#undef KV_LD8
#undef KV_LD1
#define KERN_NAME(x) zs_att_generic_bf16_##x
#define KV_T uint16_t
#define KV_LD8(p) att_g_bf16x8(p)
#define KV_LD1(p) att_bf16_widen(*(p))
#include "attention-kern.h"
#undef KERN_NAME
#undef KV_T
#undef KV_LD8
#undef KV_LD1
#undef ATT_FMA8

#pragma GCC push_options
#pragma GCC target("avx2,fma")
#include <immintrin.h>
#define ATT_FMA8(a, b, c) ((zs_v8)_mm256_fmadd_ps((__m256)(a), (__m256)(b), (__m256)(c)))
#define KERN_NAME(x) zs_att_avx2_##x
#define KV_T float
#define KV_LD8(p) (*(const zs_v8u *)(p))
#define KV_LD1(p) (*(p))
#include "attention-kern.h"
#undef KERN_NAME
#undef KV_T
#undef KV_LD8
#undef KV_LD1
/* bf16 -> f32 by shift: 8 values zero-extended to 32 bits, moved to the high half (exact) */
#define KERN_NAME(x) zs_att_avx2_bf16_##x
#define KV_T uint16_t
#define KV_LD8(p) \
    ((zs_v8)_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16)))
#define KV_LD1(p) att_bf16_widen(*(p))
#include "attention-kern.h"
#undef KERN_NAME
#undef KV_T
#undef KV_LD8
#undef KV_LD1
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
/* f16 -> f32 with F16C (exact) */
#define KERN_NAME(x) zs_att_avx2_f16_##x
#define KV_T uint16_t
#define KV_LD8(p) ((zs_v8)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p))))
#define KV_LD1(p) _cvtsh_ss(*(p))
#include "attention-kern.h"
#undef KERN_NAME
#undef KV_T
#undef KV_LD8
#undef KV_LD1
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
    int ntiles, nkv, group, hd, kv_stride, block;
    att_task_fn fn;
    size_t qd;
    float scale, softcap;
    int window;
    const att_tree_rows *tr;
    atomic_int failed;
} att_job;

static void att_run_task(void *arg, int task) {
    att_job *j = arg;
    /* the last tiles (the longest rows of a prefill chunk) first, for balance */
    const att_tile *tl = &j->tiles[j->ntiles - 1 - task / j->nkv];
    att_task t = {j->out, j->q, j->ord + tl->start, j->pos, &j->seqs[tl->seq], tl->nt, task % j->nkv, j->group,
                  j->hd, j->kv_stride, j->block, j->qd, j->scale, j->softcap, j->window, 0, j->tr, NULL};
    int maxk = 0, minlo = 0x7fffffff, maxd = 0;
    for (int i = 0; i < t.nt; i++) {
        int c0, ce, ke;
        att_row_keys(&t, t.tok[i], &c0, &ce, &ke);
        maxk = ZS_MAX(maxk, ke);
        minlo = ZS_MIN(minlo, c0);
        if (t.tr) maxd = ZS_MAX(maxd, t.tr->depth[t.tok[i]]);
    }
    if (t.window > 0) t.base = minlo / t.block * t.block;
    size_t lds = ((size_t)(maxk + 1 - t.base) + 7) & ~(size_t)7, ns = lds * (size_t)t.nt * (size_t)j->group;
    /* the scores, then (a tree) room for one path */
    float *s = scratch_get(ns + (t.tr ? (size_t)maxd + 1 : 0));
    if (!s) { atomic_store(&j->failed, 1); return; }
    if (t.tr) t.path = (int *)(void *)(s + ns);
    j->fn(&t, s, lds);
}

static int have_avx2(void) {
    static int v = -1;
    if (v < 0) {
        __builtin_cpu_init();
        v = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }
    return v;
}

static int have_f16c(void) {
    static int v = -1;
    if (v < 0) {
        __builtin_cpu_init();
        v = __builtin_cpu_supports("f16c");
    }
    return v;
}

/* Checks a tree (zs_att_tree's rules) and resolves its rows into tr (arrays of 3 * T ints). */
static int tree_rows(const zs_att_tree *tree, int T, const int *seq, const int *pos, att_tree_rows *tr, int *mem) {
    tr->slot = tree->slot;
    tr->parent = tree->parent;
    tr->cend = mem;
    tr->kend = mem + T;
    tr->depth = mem + 2 * T;
    for (int i = 0; i < T; i++) {
        int a = tree->parent[i], sl = tree->slot[i];
        if (a < 0) {
            if (a != -1 || sl != pos[i])
                return zs_err(ZS_EINVAL, "attention: token %d is causal (parent %d) but sits in slot %d at position %d",
                              i, a, sl, pos[i]);
            tr->cend[i] = pos[i] + 1;
            tr->depth[i] = 0;
        } else {
            if (a >= i || seq[a] != seq[i] || pos[a] != pos[i] - 1 || tree->slot[a] >= sl)
                return zs_err(ZS_EINVAL, "attention: token %d (sequence %d, position %d, slot %d) cannot have token %d "
                              "as its parent", i, seq[i], pos[i], sl, a);
            tr->cend[i] = tr->cend[a] - (tr->depth[a] == 0); /* the root's slot */
            tr->depth[i] = tr->depth[a] + 1;
        }
        tr->kend[i] = sl;
    }
    return 0;
}

int zs_op_attention(float *out, const float *q, int T, const int *seq, const int *pos, const zs_att_seq *seqs,
                    int nh, int nkv, int hd, int kv_stride, int block, int kv_dtype, int path,
                    const zs_att_params *ap) {
    return zs_op_attention_tree(out, q, T, seq, pos, seqs, nh, nkv, hd, kv_stride, block, kv_dtype, path, ap, NULL);
}

int zs_op_attention_tree(float *out, const float *q, int T, const int *seq, const int *pos, const zs_att_seq *seqs,
                         int nh, int nkv, int hd, int kv_stride, int block, int kv_dtype, int path,
                         const zs_att_params *ap, const zs_att_tree *tree) {
    if (T <= 0) return 0;
    if (nh <= 0 || nkv <= 0 || nh % nkv || hd <= 0 || kv_stride < nkv * hd || block <= 0)
        return zs_err(ZS_EINVAL, "attention: bad shape (heads %d, kv heads %d, head dim %d, stride %d, block %d)",
                      nh, nkv, hd, kv_stride, block);
    if (kv_dtype != ZS_F32 && kv_dtype != ZS_F16 && kv_dtype != ZS_BF16)
        return zs_err(ZS_EINVAL, "attention: KV cache element type %d (f32, f16 or bf16)", kv_dtype);
    float scale = 1.0f / sqrtf((float)hd), softcap = 0.0f;
    int window = 0;
    if (ap) {
        if (!isfinite(ap->scale) || !(ap->softcap >= 0.0f) || isinf(ap->softcap) || ap->window < 0)
            return zs_err(ZS_EINVAL, "attention: bad parameters (scale %g, soft-cap %g, window %d)",
                          (double)ap->scale, (double)ap->softcap, ap->window);
        if (ap->scale != 0.0f) scale = ap->scale;
        softcap = ap->softcap;
        window = ap->window;
    }
    int simd = have_avx2() && (kv_dtype != ZS_F16 || have_f16c());
    int avx2 = path == ZS_ATT_AVX2 ? 1 : path == ZS_ATT_GENERIC ? 0 : simd;
    if (avx2 && !simd)
        return zs_err(ZS_EUNSUPPORTED, "attention: this CPU has no AVX2+FMA%s", kv_dtype == ZS_F16 ? "+F16C" : "");
    att_task_fn fn = kv_dtype == ZS_F16  ? (avx2 ? zs_att_avx2_f16_task : zs_att_generic_f16_task)
                     : kv_dtype == ZS_BF16 ? (avx2 ? zs_att_avx2_bf16_task : zs_att_generic_bf16_task)
                                          : (avx2 ? zs_att_avx2_task : zs_att_generic_task);
    int group = nh / nkv;
    int *ord = malloc((size_t)T * (tree ? 4 : 1) * sizeof(int));
    att_tile *tiles = malloc((size_t)T * sizeof(att_tile));
    if (!ord || !tiles) {
        free(ord); free(tiles);
        return zs_err(ZS_ENOMEM, "attention: out of memory for %d tokens", T);
    }
    att_tree_rows tr;
    if (tree) {
        int rc = tree->slot && tree->parent ? tree_rows(tree, T, seq, pos, &tr, ord + T)
                                            : zs_err(ZS_EINVAL, "attention: a tree without slots or parents");
        if (rc < 0) {
            free(ord); free(tiles);
            return rc;
        }
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
    att_job j = {out, q, ord, seq, pos, seqs, tiles, ntiles, nkv, group, hd, kv_stride, block, fn,
                 (size_t)nh * hd, scale, softcap, window, tree ? &tr : NULL, 0};
    zs_pool_run(att_run_task, &j, ntiles * nkv);
    free(ord);
    free(tiles);
    if (atomic_load(&j.failed)) return zs_err(ZS_ENOMEM, "attention: out of memory for the scores");
    return 0;
}
