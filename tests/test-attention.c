/* test-attention.c — the CPU attention over the paged KV cache (kernels/cpu/attention.c):
 * random q/k/v in a real zs_kvcache with four sequences of 1, 17, 300 and 1030 positions (block
 * tables interleaved), GQA ratios 1 and 4, head dims 64, 128, 72, 8 and 12, each with the cache
 * in f32, f16 and bf16 (values written by zs_kv_write, rounded to nearest even):
 *   - within tolerance of a double-precision reference (over the values the cache holds);
 *   - BIT FOR BIT equal to a scalar loop of the documented order (attention.h) that reads the
 *     cache's values widened by tensor.c's scalar conversions, so a change of the order (or a
 *     wrong widening) fails here;
 *   - 16-bit caches: bit for bit equal to the f32 kernel over an f32 cache of the widened values;
 *   - batch invariance, bitwise: each token computed alone equals the same token in the mixed
 *     batch;
 *   - the generic and the AVX2+FMA(+F16C) kernels give the same bits (when the CPU has them);
 *   - the same checks (but the double reference) again in child processes with ZS_THREADS=1, 2
 *     and 3, which also check that the batch's output hashes to the parent's (every run without
 *     parameters and those with a window that cuts the keys);
 *   - zs_kv_write's rounding on hand-made ties, overflow, subnormals and NaN (bit patterns
 *     worked out by hand: IEEE round to nearest even, what PyTorch's .half() and
 *     .to(torch.bfloat16) do), and the block budget of zs_kv_blocks_for_bytes per dtype;
 *   - the family parameters (zs_att_params: scale, soft-cap, sliding window; each alone and
 *     combined, on two shapes in f32 and the windowed soft-capped ones in f16/bf16 too): the same
 *     checks against a documented-order loop and a double reference over the visible keys only;
 *     each token alone and the chunk in halves read views whose blocks before the window are
 *     NULL (the kernel must not touch them); explicit zeros and a window longer than every
 *     position give the bits of NULL;
 *   - errors for bad shapes, element types and parameters. */
#include "attention.h"
#include "common.h"
#include "kvcache.h"
#include "ops.h"
#include "tensor.h"
#include "testutil.h"

static uint64_t rng;
static float frand(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (float)((rng >> 11) * 0x1.0p-53) - 0.5f;
}

#define NSEQ 4
static const int seq_len[NSEQ] = {1, 17, 300, 1030};

/* the documented order, scalar */
static float doc_dot(const float *q, const float *k, int hd) {
    float l[8] = {0};
    int d8 = hd & ~7;
    for (int d = 0; d < d8; d += 8)
        for (int i = 0; i < 8; i++) l[i] = fmaf(q[d + i], k[d + i], l[i]);
    float s = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
    for (int d = d8; d < hd; d++) s = fmaf(q[d], k[d], s);
    return s;
}

typedef struct {
    int nh, nkv, hd;
    zs_dtype dt;       /* the cache's element type */
    zs_kvcache *kv;    /* in dt */
    zs_kvcache *wkv;   /* 16-bit dt: an f32 cache of the same values widened (same block ids) */
    zs_att_seq views[NSEQ], wviews[NSEQ];
    const void **ptrs, **wptrs;
    int T, *seq, *pos;
    float *q;
} rig;

/* Opens NSEQ sequences in kv, reserving a block at a time round robin so that the block tables
 * interleave (the same calls on a fresh cache give the same block ids). */
static void rig_reserve(zs_kvcache *kv, int *ids) {
    int slot;
    zs_kv_seq_open(kv, &slot); /* an unused slot first: the sequences are not slot 0.. */
    for (int s = 0; s < NSEQ; s++) zs_kv_seq_open(kv, &ids[s]);
    for (int len = ZS_KV_BLOCK;; len += ZS_KV_BLOCK) {
        int more = 0;
        for (int s = 0; s < NSEQ; s++)
            if (zs_kv_seq_len(kv, ids[s]) < seq_len[s]) {
                CHECK(zs_kv_seq_reserve(kv, ids[s], ZS_MIN(len, seq_len[s])) == 0, "reserve");
                more = 1;
            }
        if (!more) break;
    }
}

/* element i of a cache row of dtype dt, widened by tensor.c's scalar conversions */
static float kv_elem(zs_dtype dt, const void *row, size_t i) {
    if (dt == ZS_F32) return ((const float *)row)[i];
    uint16_t h = ((const uint16_t *)row)[i];
    return dt == ZS_F16 ? zs_f16_to_f32(h) : zs_bf16_to_f32(h);
}

static void rig_views(zs_kvcache *kv, const int *ids, const void **ptrs, zs_att_seq *views) {
    int used = 0;
    for (int s = 0; s < NSEQ; s++) {
        int n = (seq_len[s] + ZS_KV_BLOCK - 1) / ZS_KV_BLOCK;
        const void **kp = ptrs + used, **vp = kp + n;
        for (int j = 0; j < n; j++) {
            kp[j] = zs_kv_k(kv, 1, ids[s], j * ZS_KV_BLOCK);
            vp[j] = zs_kv_v(kv, 1, ids[s], j * ZS_KV_BLOCK);
        }
        used += 2 * n;
        views[s] = (zs_att_seq){kp, vp};
    }
}

static void rig_open(rig *r, int nh, int nkv, int hd, zs_dtype dt) {
    memset(r, 0, sizeof *r);
    r->nh = nh; r->nkv = nkv; r->hd = hd; r->dt = dt;
    int kvd = nkv * hd, nblk = 0;
    for (int s = 0; s < NSEQ; s++) nblk += (seq_len[s] + ZS_KV_BLOCK - 1) / ZS_KV_BLOCK;
    int rc = zs_kv_init_ex(2, kvd, nblk + 3, NSEQ + 1, 1040, dt, 1, &r->kv);
    if (rc == 0 && dt != ZS_F32) rc = zs_kv_init(2, kvd, nblk + 3, NSEQ + 1, 1040, &r->wkv);
    CHECK(rc == 0, "kv init: %s", zs_errmsg());
    if (rc) exit(1);
    CHECK(zs_kv_dtype(r->kv) == dt, "zs_kv_dtype");
    int ids[NSEQ], wids[NSEQ];
    rig_reserve(r->kv, ids);
    if (r->wkv) rig_reserve(r->wkv, wids);
    r->ptrs = calloc((size_t)2 * nblk, sizeof *r->ptrs);
    r->wptrs = calloc((size_t)2 * nblk, sizeof *r->wptrs);
    float *kb = malloc((size_t)kvd * 4), *vb = malloc((size_t)kvd * 4);
    float *kw = malloc((size_t)kvd * 4), *vw = malloc((size_t)kvd * 4);
    for (int s = 0; s < NSEQ; s++)
        for (int l = 0; l < 2; l++)
            for (int p = 0; p < seq_len[s]; p++) {
                for (int e = 0; e < kvd; e++) { kb[e] = 2.0f * frand(); vb[e] = frand(); }
                zs_kv_write(r->kv, l, ids[s], p, kb, vb);
                if (!r->wkv) continue;
                const void *k = zs_kv_k(r->kv, l, ids[s], p), *v = zs_kv_v(r->kv, l, ids[s], p);
                for (int e = 0; e < kvd; e++) { kw[e] = kv_elem(dt, k, (size_t)e); vw[e] = kv_elem(dt, v, (size_t)e); }
                zs_kv_write(r->wkv, l, wids[s], p, kw, vw);
            }
    free(kb); free(vb); free(kw); free(vw);
    rig_views(r->kv, ids, r->ptrs, r->views);
    if (r->wkv) rig_views(r->wkv, wids, r->wptrs, r->wviews);
    /* the batch: seq 3's last 40 positions (a prefill chunk), a decode token of each of the
     * others, a few scattered positions, in mixed order */
    r->seq = malloc(64 * sizeof(int));
    r->pos = malloc(64 * sizeof(int));
    int T = 0;
    r->seq[T] = 2; r->pos[T++] = 299;
    for (int p = 990; p < 1030; p++) { r->seq[T] = 3; r->pos[T++] = p; }
    r->seq[T] = 0; r->pos[T++] = 0;
    r->seq[T] = 1; r->pos[T++] = 16;
    r->seq[T] = 3; r->pos[T++] = 0;
    r->seq[T] = 3; r->pos[T++] = 513;
    r->seq[T] = 2; r->pos[T++] = 15;
    r->seq[T] = 2; r->pos[T++] = 16;
    r->seq[T] = 1; r->pos[T++] = 7;
    r->T = T;
    size_t qd = (size_t)nh * hd;
    r->q = malloc((size_t)T * qd * 4);
    for (size_t i = 0; i < (size_t)T * qd; i++) r->q[i] = 2.0f * frand();
}

static void rig_close(rig *r) {
    zs_kv_free(r->kv);
    zs_kv_free(r->wkv);
    free(r->ptrs); free(r->wptrs); free(r->seq); free(r->pos); free(r->q);
}

/* kv head kh of position j of sequence s, widened into w[hd] (scalar conversions) */
static void kv_head(const rig *r, const void *const *blocks, int j, int kh, float *w) {
    size_t es = zs_dtype_size(r->dt);
    const char *row = (const char *)blocks[j / ZS_KV_BLOCK] + (size_t)(j % ZS_KV_BLOCK) * r->nkv * r->hd * es;
    for (int e = 0; e < r->hd; e++) w[e] = kv_elem(r->dt, row, (size_t)kh * r->hd + e);
}

static uint64_t hash(const float *x, size_t n) {
    uint64_t h = 1469598103934665603ull;
    const unsigned char *b = (const unsigned char *)x;
    for (size_t i = 0; i < n * 4; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static int count_diff(const float *a, const float *b, size_t n) {
    int d = 0;
    for (size_t i = 0; i < n; i++) d += memcmp(&a[i], &b[i], 4) != 0;
    return d;
}

/* Views of r's sequences for a batch of the tokens idx[0..n) (NULL: all of r's batch) in which
 * every block wholly before the window of all the batch's tokens of its sequence is NULL (the
 * kernel must not read it); ptrs: room for 2 * every sequence's blocks. */
static void null_views(const rig *r, int window, const int *idx, int n, const void **ptrs, zs_att_seq *nv) {
    int used = 0;
    for (int s = 0; s < NSEQ; s++) {
        int nb = (seq_len[s] + ZS_KV_BLOCK - 1) / ZS_KV_BLOCK, lo = 0x7fffffff;
        for (int t = 0; t < (idx ? n : r->T); t++) {
            int i = idx ? idx[t] : t;
            if (r->seq[i] != s) continue;
            int l = r->pos[i] - window + 1;
            lo = ZS_MIN(lo, l > 0 ? l : 0);
        }
        const void **kp = ptrs + used, **vp = kp + nb;
        for (int b = 0; b < nb; b++) {
            int dead = (b + 1) * ZS_KV_BLOCK <= lo;
            kp[b] = dead ? NULL : r->views[s].k[b];
            vp[b] = dead ? NULL : r->views[s].v[b];
        }
        used += 2 * nb;
        nv[s] = (zs_att_seq){kp, vp};
    }
}

/* Every check above for one (shape, cache type, family parameters ap: NULL, or the scale /
 * soft-cap / window of zs_att_params); returns the hash of the batch's output. */
static uint64_t check_config(int nh, int nkv, int hd, zs_dtype dt, int with_double, const zs_att_params *ap) {
    rig r;
    rig_open(&r, nh, nkv, hd, dt);
    int T = r.T, group = nh / nkv, kvd = nkv * hd;
    char dn[96];
    snprintf(dn, sizeof dn, "%s scale %g cap %g window %d", zs_dtype_name(dt), ap ? (double)ap->scale : 0.0,
             ap ? (double)ap->softcap : 0.0, ap ? ap->window : 0);
    size_t qd = (size_t)nh * hd, n = (size_t)T * qd;
    float *out = malloc(n * 4), *doc = malloc(n * 4), *one = malloc(qd * 4), *alt = malloc(n * 4);
    double maxerr = 0;
    float *p = malloc(1040 * 4);
    double *pd = malloc(1040 * sizeof(double));
    /* the widened K and V heads of one sequence's positions, for the references */
    float *kw = malloc((size_t)1040 * hd * 4), *vw = malloc((size_t)1040 * hd * 4);
    float scale = ap && ap->scale != 0.0f ? ap->scale : 1.0f / sqrtf((float)hd);
    double dscale = ap && ap->scale != 0.0f ? (double)ap->scale : 1.0 / sqrt((double)hd);
    float cap = ap ? ap->softcap : 0.0f;
    int W = ap ? ap->window : 0;

    int rc = zs_op_attention(out, r.q, T, r.seq, r.pos, r.views, nh, nkv, hd, kvd, ZS_KV_BLOCK, dt, ZS_ATT_AUTO, ap);
    CHECK(rc == 0, "attention: %s", zs_errmsg());

    for (int i = 0; i < T; i++)
        for (int h = 0; h < nh; h++) {
            int s = r.seq[i], P = r.pos[i], kh = h / group;
            int lo = W > 0 && P - W + 1 > 0 ? P - W + 1 : 0; /* the first key in the window */
            const float *q = r.q + (size_t)i * qd + (size_t)h * hd;
            for (int j = lo; j <= P; j++) {
                kv_head(&r, r.views[s].k, j, kh, kw + (size_t)j * hd);
                kv_head(&r, r.views[s].v, j, kh, vw + (size_t)j * hd);
            }
            /* documented order (over the visible keys lo..P) */
            for (int j = lo; j <= P; j++) {
                p[j] = doc_dot(q, kw + (size_t)j * hd, hd) * scale;
                if (cap > 0.0f) p[j] = cap * tanhf(p[j] / cap);
            }
            zs_op_softmax(p + lo, P + 1 - lo);
            float *o = doc + (size_t)i * qd + (size_t)h * hd;
            for (int e = 0; e < hd; e++) {
                float x = 0.0f;
                for (int j = lo; j <= P; j++) x = fmaf(p[j], vw[(size_t)j * hd + e], x);
                o[e] = x;
            }
            if (!with_double) continue;
            /* double precision, the keys outside the window masked */
            double m = -INFINITY, sum = 0;
            for (int j = 0; j <= P; j++) {
                if (j < lo) { pd[j] = -INFINITY; continue; }
                const float *k = kw + (size_t)j * hd;
                double d = 0;
                for (int e = 0; e < hd; e++) d += (double)q[e] * k[e];
                pd[j] = d * dscale;
                if (cap > 0.0f) pd[j] = cap * tanh(pd[j] / cap);
                m = pd[j] > m ? pd[j] : m;
            }
            for (int j = 0; j <= P; j++) sum += (pd[j] = exp(pd[j] - m));
            for (int e = 0; e < hd; e++) {
                double x = 0;
                for (int j = lo; j <= P; j++) x += pd[j] / sum * vw[(size_t)j * hd + e];
                double err = fabs(x - out[(size_t)i * qd + (size_t)h * hd + e]);
                maxerr = err > maxerr ? err : maxerr;
            }
        }
    if (with_double) {
        fprintf(stderr, "%s nh %d nkv %d hd %d: max |out - double reference| %.3g\n", dn, nh, nkv, hd, maxerr);
        CHECK(maxerr < 1e-6, "%s nh %d nkv %d hd %d: max |out - double reference| %.3g", dn, nh, nkv, hd, maxerr);
    }
    int dd = count_diff(out, doc, n);
    CHECK(dd == 0, "%s nh %d nkv %d hd %d: %d of %zu elements differ from the documented order", dn, nh, nkv, hd,
          dd, n);
    if (r.wkv) {
        /* the f32 kernel over the widened values: the same bits */
        rc = zs_op_attention(alt, r.q, T, r.seq, r.pos, r.wviews, nh, nkv, hd, kvd, ZS_KV_BLOCK, ZS_F32, ZS_ATT_AUTO, ap);
        dd = rc == 0 ? count_diff(alt, out, n) : -1;
        CHECK(dd == 0, "%s nh %d nkv %d hd %d: %d elements differ from the f32 kernel over the widened cache", dn, nh,
              nkv, hd, dd);
    }

    /* each token alone (with a window: in views whose blocks before its window are NULL) */
    int nblk = 0;
    for (int s = 0; s < NSEQ; s++) nblk += (seq_len[s] + ZS_KV_BLOCK - 1) / ZS_KV_BLOCK;
    const void **nptrs = calloc((size_t)2 * nblk, sizeof *nptrs);
    zs_att_seq nv[NSEQ];
    int bad = 0;
    for (int i = 0; i < T; i++) {
        if (W > 0) null_views(&r, W, &i, 1, nptrs, nv);
        rc = zs_op_attention(one, r.q + (size_t)i * qd, 1, r.seq + i, r.pos + i, W > 0 ? nv : r.views, nh, nkv, hd,
                             kvd, ZS_KV_BLOCK, dt, ZS_ATT_AUTO, ap);
        bad += rc != 0 || count_diff(one, out + (size_t)i * qd, qd) != 0;
    }
    CHECK(bad == 0, "%s nh %d nkv %d hd %d: %d of %d tokens alone differ from the batch", dn, nh, nkv, hd, bad, T);
    /* the prefill chunk of seq 3 on its own, in two halves (with a window: NULL blocks before it) */
    int half0[20], half1[20];
    for (int i = 0; i < 20; i++) { half0[i] = 1 + i; half1[i] = 21 + i; }
    if (W > 0) null_views(&r, W, half0, 20, nptrs, nv);
    rc = zs_op_attention(alt, r.q + qd, 20, r.seq + 1, r.pos + 1, W > 0 ? nv : r.views, nh, nkv, hd, kvd,
                         ZS_KV_BLOCK, dt, ZS_ATT_AUTO, ap);
    if (W > 0) null_views(&r, W, half1, 20, nptrs, nv);
    rc |= zs_op_attention(alt + 20 * qd, r.q + 21 * qd, 20, r.seq + 21, r.pos + 21, W > 0 ? nv : r.views, nh, nkv,
                          hd, kvd, ZS_KV_BLOCK, dt, ZS_ATT_AUTO, ap);
    CHECK(rc == 0 && count_diff(alt, out + qd, 40 * qd) == 0, "%s nh %d nkv %d hd %d: the chunk in halves", dn, nh,
          nkv, hd);
    if (W > 0) {
        /* the whole batch with the blocks no token of a sequence sees NULL */
        null_views(&r, W, NULL, 0, nptrs, nv);
        rc = zs_op_attention(alt, r.q, T, r.seq, r.pos, nv, nh, nkv, hd, kvd, ZS_KV_BLOCK, dt, ZS_ATT_AUTO, ap);
        CHECK(rc == 0 && count_diff(alt, out, n) == 0, "%s nh %d nkv %d hd %d: the batch with NULL blocks", dn, nh,
              nkv, hd);
    }
    free(nptrs);

    /* generic vs AVX2 */
    rc = zs_op_attention(alt, r.q, T, r.seq, r.pos, r.views, nh, nkv, hd, kvd, ZS_KV_BLOCK, dt, ZS_ATT_GENERIC, ap);
    CHECK(rc == 0 && count_diff(alt, out, n) == 0, "%s nh %d nkv %d hd %d: the generic kernel gives the same bits",
          dn, nh, nkv, hd);
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        (dt != ZS_F16 || __builtin_cpu_supports("f16c"))) {
        rc = zs_op_attention(alt, r.q, T, r.seq, r.pos, r.views, nh, nkv, hd, kvd, ZS_KV_BLOCK, dt, ZS_ATT_AVX2, ap);
        CHECK(rc == 0 && count_diff(alt, out, n) == 0, "%s nh %d nkv %d hd %d: the AVX2 kernel gives the same bits",
              dn, nh, nkv, hd);
    } else {
        fprintf(stderr, "no AVX2+FMA(+F16C) here: the %s AVX2 kernel is not compared\n", dn);
    }
    uint64_t hh = hash(out, n);
    free(out); free(doc); free(one); free(alt); free(p); free(pd); free(kw); free(vw);
    rig_close(&r);
    return hh;
}

static const int configs[][3] = {{4, 4, 64}, {8, 2, 128}, {16, 4, 64}, {4, 1, 72}, {3, 3, 8}, {4, 1, 12}};
#define NBASE (int)(sizeof configs / sizeof configs[0])
static const zs_dtype kv_dts[3] = {ZS_F32, ZS_F16, ZS_BF16};

/* The family parameters: scale, soft-cap, window (0 and 7 must give the plain bits: explicit
 * zeros, and a window longer than every position) */
static const zs_att_params params[] = {
    {0, 0, 0}, {0.0625f, 0, 0}, {0, 0.5f, 0}, {0, 0, 1}, {0, 0, 5}, {0, 0, 16}, {0, 0, 333}, {0, 0, 2000},
    {1.0f, 5.0f, 37}, {0.0625f, 0.5f, 100}};
#define NPARAMS (int)(sizeof params / sizeof params[0])
/* One run: a shape, a cache type and the parameters (-1: NULL). Every shape and type without
 * parameters; every parameter set on two shapes in f32, and the windowed ones with a soft-cap on
 * the 16-bit caches too. */
typedef struct { int conf, dt, ps; } run;
#define MAXRUNS (NBASE * 3 + NPARAMS * 2 * 3)
static int make_runs(run *rs) {
    int n = 0;
    for (int d = 0; d < 3; d++)
        for (int b = 0; b < NBASE; b++) rs[n++] = (run){b, d, -1};
    static const int pconf[2] = {1, 5};
    for (int ps = 0; ps < NPARAMS; ps++)
        for (int c = 0; c < 2; c++)
            for (int d = 0; d < 3; d++)
                if (d == 0 || ps >= 8) rs[n++] = (run){pconf[c], d, ps};
    return n;
}

static uint16_t f16_bits(const void *p) { uint16_t h; memcpy(&h, p, 2); return h; }

/* zs_kv_write's rounding: IEEE round to nearest even, values and expected bits worked out by
 * hand (1 + 2^-11 is halfway between f16 1.0 and its successor: the even one, 1.0, wins) and
 * checked once against numpy's float16 cast and an integer round-half-even of the f32 bits */
static void check_rounding(void) {
    static const struct { float x; uint16_t f16, bf16; } cases[] = {
        {1.0f, 0x3c00, 0x3f80},
        {1.0f + 0x1p-11f, 0x3c00, 0x3f80},           /* f16 tie -> even (down) */
        {1.0f + 3 * 0x1p-11f, 0x3c02, 0x3f80},       /* f16 tie -> even (up) */
        {1.0f + 0x1p-11f + 0x1p-20f, 0x3c01, 0x3f80}, /* just above the tie: up */
        {1.0f + 0x1p-8f, 0x3c04, 0x3f80},            /* bf16 tie -> even (down) */
        {1.0f + 3 * 0x1p-8f, 0x3c0c, 0x3f82},        /* bf16 tie -> even (up) */
        {-2.5f, 0xc100, 0xc020},
        {65504.0f, 0x7bff, 0x4780},                  /* bf16: 0x477fe000 rounds up */
        {65519.0f, 0x7bff, 0x4780},                  /* below f16's halfway to 65536: 65504 */
        {65520.0f, 0x7c00, 0x4780},                  /* the tie above 65504 rounds to inf */
        {0x1p-24f, 0x0001, 0x3380},                  /* the smallest f16 subnormal */
        {0x1p-25f, 0x0000, 0x3300},                  /* tie with 0: even (0) */
        {3 * 0x1p-25f, 0x0002, 0x33c0},              /* tie between 1 and 2 subnormal ulps: 2 */
        {0x1p-14f, 0x0400, 0x3880},                  /* the smallest f16 normal */
        {1e30f, 0x7c00, 0x714a},
    };
    int n = (int)(sizeof cases / sizeof cases[0]);
    zs_kvcache *kv[2] = {NULL, NULL};
    const zs_dtype dts[2] = {ZS_F16, ZS_BF16};
    for (int d = 0; d < 2; d++) {
        int seq;
        CHECK(zs_kv_init_ex(1, n + 1, 1, 1, 16, dts[d], 1, &kv[d]) == 0, "kv init %s", zs_dtype_name(dts[d]));
        if (!kv[d]) return;
        zs_kv_seq_open(kv[d], &seq);
        zs_kv_seq_reserve(kv[d], seq, 3);
        float k[32], v[32];
        for (int i = 0; i < n; i++) { k[i] = cases[i].x; v[i] = -cases[i].x; }
        k[n] = v[n] = NAN;
        zs_kv_write(kv[d], 0, seq, 2, k, v);
        const char *kr = zs_kv_k(kv[d], 0, seq, 2), *vr = zs_kv_v(kv[d], 0, seq, 2);
        CHECK(kr == (const char *)zs_kv_k(kv[d], 0, seq, 0) + 2 * (n + 1) * 2, "%s: rows of 2-byte elements",
              zs_dtype_name(dts[d]));
        for (int i = 0; i < n; i++) {
            uint16_t want = d == 0 ? cases[i].f16 : cases[i].bf16;
            uint16_t gk = f16_bits(kr + 2 * i), gv = f16_bits(vr + 2 * i);
            CHECK(gk == want && gv == (uint16_t)(want ^ 0x8000u), "%s(%a): K %04x V %04x, want %04x and %04x",
                  zs_dtype_name(dts[d]), (double)cases[i].x, gk, gv, want, want ^ 0x8000u);
        }
        float back = kv_elem(dts[d], kr, (size_t)n);
        CHECK(isnan(back), "%s(NaN) is %g", zs_dtype_name(dts[d]), (double)back);
        zs_kv_free(kv[d]);
    }
    /* the budget: 16-bit elements fit twice the blocks in the same bytes */
    size_t b32 = zs_kv_block_bytes(11, 256, ZS_F32), b16 = zs_kv_block_bytes(11, 256, ZS_F16);
    CHECK(b32 == (size_t)11 * 2 * ZS_KV_BLOCK * 256 * 4 && b16 * 2 == b32 && zs_kv_block_bytes(11, 256, ZS_BF16) == b16,
          "block bytes %zu (f32) %zu (f16)", b32, b16);
    size_t budget = (size_t)1 << 30;
    int n32 = zs_kv_blocks_for_bytes(11, 256, ZS_F32, budget), n16 = zs_kv_blocks_for_bytes(11, 256, ZS_BF16, budget);
    CHECK(n32 == (int)(budget / b32) && n16 == (int)(budget / b16) && n16 >= 2 * n32, "blocks in 1 GiB: %d (f32), %d (bf16)",
          n32, n16);
    zs_kvcache *bad = NULL;
    CHECK_ERR(zs_kv_init_ex(1, 8, 1, 1, 16, ZS_Q8_0, 1, &bad), "element type", "Q8_0");
}

int main(int argc, char **argv) {
    run rs[MAXRUNS];
    int nrun = make_runs(rs);
    uint64_t h[MAXRUNS];
    for (int c = 0; c < nrun; c++) {
        int b = rs[c].conf;
        /* the children (thread counts) redo the runs whose tiling differs: no parameters, and a
         * window that cuts the keys; the scale and soft-cap alone change no task's reads */
        h[c] = 0;
        if (argc >= 2 && rs[c].ps >= 0 && !(params[rs[c].ps].window > 0 && params[rs[c].ps].window < 2000)) continue;
        rng = 0x9E3779B97F4A7C15ull + (uint64_t)b;
        h[c] = check_config(configs[b][0], configs[b][1], configs[b][2], kv_dts[rs[c].dt], argc < 2,
                            rs[c].ps < 0 ? NULL : &params[rs[c].ps]);
        if (argc < 2 && (rs[c].ps == 0 || rs[c].ps == 7)) {
            int base = rs[c].dt * NBASE + b; /* the same shape and type without parameters */
            CHECK(h[c] == h[base], "shape %d %s: parameters {%g, %g, %d} give other bits than NULL", b,
                  zs_dtype_name(kv_dts[rs[c].dt]), (double)params[rs[c].ps].scale, (double)params[rs[c].ps].softcap,
                  params[rs[c].ps].window);
        }
    }
    if (argc < 2) {
        check_rounding();
        rig r;
        rng = 1;
        rig_open(&r, 4, 2, 16, ZS_F32);
        float o[64 * 4];
        CHECK_ERR(zs_op_attention(o, r.q, 1, r.seq, r.pos, r.views, 4, 3, 16, 48, ZS_KV_BLOCK, ZS_F32, 0, NULL), "bad shape");
        CHECK_ERR(zs_op_attention(o, r.q, 1, r.seq, r.pos, r.views, 4, 2, 16, 16, ZS_KV_BLOCK, ZS_F32, 0, NULL), "bad shape");
        CHECK_ERR(zs_op_attention(o, r.q, 1, r.seq, r.pos, r.views, 4, 2, 16, 32, ZS_KV_BLOCK, ZS_Q8_0, 0, NULL),
                  "element type");
        const zs_att_params badp[] = {{0, 0, -1}, {0, -1.0f, 0}, {NAN, 0, 0}, {0, INFINITY, 0}, {0, NAN, 0}};
        for (int i = 0; i < 5; i++)
            CHECK_ERR(zs_op_attention(o, r.q, 1, r.seq, r.pos, r.views, 4, 2, 16, 32, ZS_KV_BLOCK, ZS_F32, 0, &badp[i]),
                      "bad parameters");
        rig_close(&r);
        /* the same bits with 1, 2 and 3 threads */
        char self[4096];
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        CHECK(n > 0, "readlink /proc/self/exe");
        if (n > 0) {
            self[n] = 0;
            char hs[MAXRUNS * 17 + 1] = "";
            for (int c = 0; c < nrun; c++) snprintf(hs + c * 17, 18, "%016llx,", (unsigned long long)h[c]);
            const char *threads[] = {"1", "2", "3"};
            for (int i = 0; i < 3; i++) {
                char cmd[4200 + MAXRUNS * 17];
                snprintf(cmd, sizeof cmd, "ZS_THREADS=%s '%s' %s", threads[i], self, hs);
                int rc = system(cmd);
                CHECK(rc == 0, "ZS_THREADS=%s: the same checks and the same bits (exit %d)", threads[i], rc);
            }
        }
    } else {
        for (int c = 0; c < nrun; c++) {
            if (!h[c]) continue; /* not redone here */
            char want[18];
            snprintf(want, sizeof want, "%016llx,", (unsigned long long)h[c]);
            CHECK(strncmp(argv[1] + c * 17, want, 17) == 0, "config %d: the output bits of the parent", c);
        }
    }
    return tu_finish(argc < 2 ? "test-attention" : "test-attention (child)");
}
