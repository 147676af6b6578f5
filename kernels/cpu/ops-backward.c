/* ops-backward.c — CPU backward of the forward ops (train-ops.h): matmul, norms, RoPE,
 * causal attention with GQA (scale, soft-cap, sliding window), activations (GELU, SwiGLU, GeGLU,
 * soft-cap), embedding, cross-entropy. Sums that reduce over a row
 * or over tokens accumulate in double where it is cheap; the forward parts (attention) are scalar
 * loops of their own (the inference attention of attention.c is the same math in SIMD). The
 * matrix products use our own fixed-order kernel (matmul-bwd-kern.h: per element, fused
 * multiply-add chains over fixed blocks of k, added in order), spread over the pool: every
 * result is the same bits whatever the thread count (ours or OpenBLAS's), the core affinity or
 * the CPU, so training is bitwise reproducible across process layouts. (No BLAS here: sgemm's
 * sums change order with its thread count and kernel choice.) */
#include "train-ops.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "ops.h"
#include "pool.h"

/* the kernel's helpers are static, so the vector-return ABI note does not apply */
#pragma GCC diagnostic ignored "-Wpsabi"
#define KERN_NAME(x) zs_bkern_generic_##x
#include "matmul-bwd-kern.h"

/* ---- Y += A·B in fixed order, on the pool ---- */

void zs_matmul_bwd_block_avx2(float *y, ptrdiff_t ldy, const float *a, ptrdiff_t ars, ptrdiff_t acs,
                              const float *b, ptrdiff_t ldb, int M, int N, int K, float *pa, float *pb);

typedef void (*upd_fn)(float *y, ptrdiff_t ldy, const float *a, ptrdiff_t ars, ptrdiff_t acs, const float *b,
                       ptrdiff_t ldb, int M, int N, int K, float *pa, float *pb);

static upd_fn pick_update(void) {
    static upd_fn fn; /* benign race: every thread computes the same value */
    upd_fn f = __atomic_load_n(&fn, __ATOMIC_RELAXED);
    if (!f) {
        __builtin_cpu_init();
        f = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? zs_matmul_bwd_block_avx2
                                                                           : zs_bkern_generic_block;
        __atomic_store_n(&fn, f, __ATOMIC_RELAXED);
    }
    return f;
}

/* Blocks of Y: at most UPD_MB rows x UPD_NB columns per task. k is cut into blocks of UPD_KC
 * from k = 0, one kernel call each, in order: these cuts are part of the result's definition
 * (train-ops.h), fixed, never sized by the thread count. (A packed 16-column panel of B,
 * UPD_KC x 16 floats, stays in L1 while the row tiles pass over it; the packed A block in L2.) */
#define UPD_MB 192
#define UPD_NB 256
#define UPD_KC 256
/* the f16/bf16 weight blocks must cut k where the f32 path does */
_Static_assert(ZS_MATMUL_BWD_BLOCK % UPD_KC == 0, "ZS_MATMUL_BWD_BLOCK must be a multiple of UPD_KC");

/* Each thread's packing buffers (UPD_MB + UPD_NB) * UPD_KC floats, allocated on its first
 * block and freed when the thread ends. Without them (no memory) the kernel runs unpacked, with
 * the same result. */
static pthread_key_t pack_key;
static pthread_once_t pack_once = PTHREAD_ONCE_INIT;
static int pack_key_ok;

static void pack_key_init(void) { pack_key_ok = pthread_key_create(&pack_key, free) == 0; }

static float *pack_buffer(void) {
    pthread_once(&pack_once, pack_key_init);
    if (!pack_key_ok) return NULL;
    float *p = pthread_getspecific(pack_key);
    if (!p) {
        p = zs_aligned_alloc(64, (size_t)(UPD_MB + UPD_NB) * UPD_KC * sizeof(float));
        if (p && pthread_setspecific(pack_key, p) != 0) {
            free(p);
            p = NULL;
        }
    }
    return p;
}

typedef struct {
    float *y;
    const float *a, *b;
    ptrdiff_t ldy, ars, acs, ldb;
    int M, N, K, mb, nb, ntn;
    upd_fn fn;
} upd_job;

/* One block of Y (mb rows x nb columns), all of k in order, UPD_KC at a time. */
static void upd_task(void *arg, int task) {
    const upd_job *j = arg;
    int r0 = (task / j->ntn) * j->mb, c0 = (task % j->ntn) * j->nb;
    int M = ZS_MIN(j->mb, j->M - r0), N = ZS_MIN(j->nb, j->N - c0);
    float *pa = pack_buffer(), *pb = pa ? pa + (size_t)UPD_MB * UPD_KC : NULL;
    for (int k0 = 0; k0 < j->K; k0 += UPD_KC)
        j->fn(j->y + (ptrdiff_t)r0 * j->ldy + c0, j->ldy, j->a + (ptrdiff_t)r0 * j->ars + (ptrdiff_t)k0 * j->acs,
              j->ars, j->acs, j->b + (ptrdiff_t)k0 * j->ldb + c0, j->ldb, M, N, ZS_MIN(UPD_KC, j->K - k0), pa, pb);
}

/* Y[M,N] (row stride ldy) += A·B with A(r,k) = a[r*ars + k*acs], B[k,c] = b[k*ldb + c]. The
 * tasks' blocks of Y only decide who computes which elements, never how, so the thread count
 * may size them. */
static void update(float *y, ptrdiff_t ldy, const float *a, ptrdiff_t ars, ptrdiff_t acs, const float *b,
                   ptrdiff_t ldb, int M, int N, int K) {
    if (M <= 0 || N <= 0 || K <= 0) return;
    upd_job j = {y, a, b, ldy, ars, acs, ldb, M, N, K, UPD_MB, UPD_NB, 0, pick_update()};
    /* blocks smaller (down to 24 x 64) until every thread has work */
    int want = 4 * zs_pool_threads();
    for (;;) {
        long tasks = (long)((M + j.mb - 1) / j.mb) * (long)((N + j.nb - 1) / j.nb);
        if (tasks >= want) break;
        if (j.nb > 64 && j.nb >= 2 * j.mb) j.nb /= 2;
        else if (j.mb > 24) j.mb /= 2;
        else if (j.nb > 64) j.nb /= 2;
        else break;
    }
    j.ntn = (N + j.nb - 1) / j.nb;
    long tasks = (long)((M + j.mb - 1) / j.mb) * (long)j.ntn;
    ZS_ASSERT(tasks <= 0x7fffffff);
    /* small products are done here: waking the pool would cost more than the work */
    if ((size_t)M * (size_t)N * (size_t)K < ((size_t)1 << 20))
        for (int t = 0; t < tasks; t++) upd_task(&j, t);
    else
        zs_pool_run(upd_task, &j, (int)tasks);
}

typedef struct {
    float *dst;
    const char *src;
    zs_dtype dt;
    size_t n, per;     /* elements in all, per task (whole rows) */
    size_t in, row_bytes;
} conv_job;

/* rows of W to f32: element types or block formats (a row is whole blocks: row_bytes apart) */
static void conv_task(void *arg, int task) {
    const conv_job *j = arg;
    size_t lo = (size_t)task * j->per, n = ZS_MIN(j->per, j->n - lo);
    zs_to_f32(j->dst + lo, j->src + lo / j->in * j->row_bytes, j->dt, n);
}

void zs_op_matmul_bwd(float *dx, float *dW, float *db, const float *dy, const float *x, const void *W,
                      zs_dtype wdt, int T, int in, int out, float *wscratch) {
    if (T <= 0) return;
    if (dx) {
        /* dx[t,i] += Σ_o dy[t,o]·W[o,i]: A = dy (rows t), B = W (rows o) */
        if (wdt == ZS_F32) {
            update(dx, in, dy, out, 1, (const float *)W, in, T, in, out);
        } else {
            /* W converted ZS_MATMUL_BWD_BLOCK rows at a time (a multiple of UPD_KC: the same
             * cuts of k = o as the f32 path) */
            size_t rb = zs_dtype_bytes(wdt, (size_t)in); /* block formats: in is a multiple of the block */
            for (int r0 = 0; r0 < out; r0 += ZS_MATMUL_BWD_BLOCK) {
                int R = ZS_MIN(ZS_MATMUL_BWD_BLOCK, out - r0);
                conv_job cj = {wscratch, (const char *)W + (size_t)r0 * rb, wdt,
                               (size_t)R * (size_t)in, (size_t)16 * (size_t)in, (size_t)in, rb};
                int ct = (int)((cj.n + cj.per - 1) / cj.per);
                if ((size_t)R * (size_t)in * (size_t)T < ((size_t)1 << 20))
                    for (int c = 0; c < ct; c++) conv_task(&cj, c);
                else
                    zs_pool_run(conv_task, &cj, ct);
                update(dx, in, dy + r0, out, 1, wscratch, in, T, in, R);
            }
        }
    }
    /* dW[o,i] += Σ_t dy[t,o]·x[t,i]: A = dyᵀ (rows o), B = x (rows t) */
    if (dW) update(dW, in, dy, 1, out, x, in, out, in, T);
    if (db) {
        for (int o = 0; o < out; o++) {
            double s = 0.0;
            for (int t = 0; t < T; t++) s += dy[(size_t)t * out + o];
            db[o] += (float)s;
        }
    }
}

void zs_op_rmsnorm_off_bwd(float *dx, float *dw, const float *dy, const float *x, const float *w, int T, int d,
                           float eps, float off) {
    for (int t = 0; t < T; t++) {
        const float *xr = x + (size_t)t * d, *gr = dy + (size_t)t * d;
        float *dr = dx + (size_t)t * d;
        float ss = 0.0f;
        for (int i = 0; i < d; i++) ss += xr[i] * xr[i];
        float r = 1.0f / sqrtf(ss / (float)d + eps);
        /* the weight as the forward sees it: w (off 0, zs_op_rmsnorm_bwd's bits) or off + w */
#define RMS_W(i) (off == 0.0f ? w[i] : off + w[i])
        double dot = 0.0;
        for (int i = 0; i < d; i++) dot += (double)gr[i] * RMS_W(i) * xr[i];
        float c = (float)(dot * r * r * r / d);
        for (int i = 0; i < d; i++) {
            dr[i] += r * RMS_W(i) * gr[i] - c * xr[i];
            if (dw) dw[i] += gr[i] * xr[i] * r;
        }
#undef RMS_W
    }
}

void zs_op_rmsnorm_bwd(float *dx, float *dw, const float *dy, const float *x, const float *w, int T, int d,
                       float eps) {
    zs_op_rmsnorm_off_bwd(dx, dw, dy, x, w, T, d, eps, 0.0f);
}

void zs_op_layernorm_bwd(float *dx, float *dw, float *db, const float *dy, const float *x, const float *w,
                         int T, int d, float eps) {
    for (int t = 0; t < T; t++) {
        const float *xr = x + (size_t)t * d, *gr = dy + (size_t)t * d;
        float *dr = dx + (size_t)t * d;
        float mean, r;
        zs_op_layernorm_stats(xr, d, eps, &mean, &r);
        double sg = 0.0, sgx = 0.0;
        for (int i = 0; i < d; i++) {
            double g = (double)gr[i] * w[i];
            sg += g;
            sgx += g * ((xr[i] - mean) * r);
        }
        float mg = (float)(sg / d), mgx = (float)(sgx / d);
        for (int i = 0; i < d; i++) {
            float xh = (xr[i] - mean) * r;
            dr[i] += r * (gr[i] * w[i] - mg - xh * mgx);
            if (dw) dw[i] += gr[i] * xh;
            if (db) db[i] += gr[i];
        }
    }
}

void zs_op_rope_bwd(float *dx, int n_heads, int head_dim, int pos, float theta) {
    int half = head_dim / 2;
    for (int i = 0; i < half; i++) {
        float inv_freq = 1.0f / powf(theta, (float)(2 * i) / (float)head_dim);
        float ang = (float)pos * inv_freq;
        float c = cosf(ang), s = sinf(ang);
        for (int h = 0; h < n_heads; h++) {
            float *v = dx + (size_t)h * head_dim;
            float a = v[i], b = v[i + half];
            v[i] = a * c + b * s;
            v[i + half] = b * c - a * s;
        }
    }
}

void zs_op_rope_freq_bwd(float *dx, int n_heads, int head_dim, int pos, const float *inv_freq, float attn_factor) {
    int half = head_dim / 2;
    for (int i = 0; i < half; i++) {
        /* the forward's c and s (factor included): the transpose of [c -s; s c] */
        float ang = (float)pos * inv_freq[i];
        float c = cosf(ang) * attn_factor, s = sinf(ang) * attn_factor;
        for (int h = 0; h < n_heads; h++) {
            float *v = dx + (size_t)h * head_dim;
            float a = v[i], b = v[i + half];
            v[i] = a * c + b * s;
            v[i + half] = b * c - a * s;
        }
    }
}

void zs_op_softcap_bwd(float *dx, const float *dy, const float *y, size_t n, float cap) {
    for (size_t i = 0; i < n; i++) {
        float t = y[i] / cap;
        dx[i] = dy[i] * (1.0f - t * t);
    }
}

/* The attention parameters resolved: the scale (0: 1/sqrt(hd)), the soft-cap (0: none) and the
 * window (0: none) */
static void att_params(const zs_att_params *ap, int hd, float *scale, float *cap, int *window) {
    *scale = ap && ap->scale != 0.0f ? ap->scale : 1.0f / sqrtf((float)hd);
    *cap = ap && ap->softcap > 0.0f ? ap->softcap : 0.0f;
    *window = ap && ap->window > 0 ? ap->window : 0;
}

/* the first key query i sees */
static inline int att_lo(int i, int window) { return window > 0 && i - window + 1 > 0 ? i - window + 1 : 0; }

static inline float att_dot(const float *q, const float *k, int hd) {
    float s = 0.0f;
    for (int e = 0; e < hd; e++) s += q[e] * k[e];
    return s;
}

/* The probabilities of query row i of head h (keys lo..i; p[lo..i] written) into p, scalar; the
 * forward and the backward here share it (the inference attention, attention.c, is the same math
 * in SIMD). */
static void att_row_probs(float *p, const float *q, const float *k, int i, int lo, int kvd, int hd, float scale,
                          float cap) {
    for (int j = lo; j <= i; j++) p[j] = att_dot(q, k + (size_t)j * kvd, hd) * scale;
    if (cap > 0.0f) zs_op_softcap(p + lo, (size_t)(i + 1 - lo), cap);
    zs_op_softmax(p + lo, i + 1 - lo);
}

void zs_op_attention_fwd(float *out, const float *q, const float *k, const float *v, int T, int nh, int nkv,
                         int hd, float *scratch, const zs_att_params *ap) {
    int group = nh / nkv, window;
    size_t qd = (size_t)nh * hd, kvd = (size_t)nkv * hd;
    float scale, cap;
    att_params(ap, hd, &scale, &cap, &window);
    for (int i = 0; i < T; i++) {
        int lo = att_lo(i, window);
        for (int h = 0; h < nh; h++) {
            int kh = h / group;
            att_row_probs(scratch, q + (size_t)i * qd + (size_t)h * hd, k + (size_t)kh * hd, i, lo, (int)kvd, hd,
                          scale, cap);
            float *o = out + (size_t)i * qd + (size_t)h * hd;
            memset(o, 0, (size_t)hd * sizeof(float));
            for (int j = lo; j <= i; j++) {
                const float *vr = v + (size_t)j * kvd + (size_t)kh * hd;
                float w = scratch[j];
                for (int e = 0; e < hd; e++) o[e] += w * vr[e];
            }
        }
    }
}

void zs_op_attention_bwd(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                         const float *v, int T, int nh, int nkv, int hd, float *scratch, const zs_att_params *ap) {
    int group = nh / nkv, window;
    size_t qd = (size_t)nh * hd, kvd = (size_t)nkv * hd;
    float scale, cap;
    att_params(ap, hd, &scale, &cap, &window);
    float *p = scratch, *dp = scratch + T;
    for (int i = 0; i < T; i++) {
        int lo = att_lo(i, window);
        for (int h = 0; h < nh; h++) {
            int kh = h / group;
            const float *qi = q + (size_t)i * qd + (size_t)h * hd;
            const float *go = dout + (size_t)i * qd + (size_t)h * hd;
            float *dqi = dq + (size_t)i * qd + (size_t)h * hd;
            att_row_probs(p, qi, k + (size_t)kh * hd, i, lo, (int)kvd, hd, scale, cap);
            /* dp_j = dout_i · v_j; softmax backward: ds_j = p_j (dp_j - Σ p dp) */
            double D = 0.0;
            for (int j = lo; j <= i; j++) {
                const float *vr = v + (size_t)j * kvd + (size_t)kh * hd;
                float s = 0.0f;
                for (int e = 0; e < hd; e++) s += go[e] * vr[e];
                dp[j] = s;
                D += (double)p[j] * s;
            }
            float Df = (float)D;
            for (int j = lo; j <= i; j++) {
                const float *kr = k + (size_t)j * kvd + (size_t)kh * hd;
                float ds = p[j] * (dp[j] - Df);
                if (cap > 0.0f) {
                    /* through the soft-cap: × (1 - tanh²) of the scaled score, recomputed (the
                     * scratch holds p and dp only) */
                    float t = tanhf(att_dot(qi, kr, hd) * scale / cap);
                    ds *= 1.0f - t * t;
                }
                ds *= scale;
                float *dkr = dk + (size_t)j * kvd + (size_t)kh * hd;
                float *dvr = dv + (size_t)j * kvd + (size_t)kh * hd;
                for (int e = 0; e < hd; e++) {
                    dqi[e] += ds * kr[e];
                    dkr[e] += ds * qi[e];
                    dvr[e] += p[j] * go[e];
                }
            }
        }
    }
}

void zs_op_swiglu_bwd(float *dgate, float *dup, const float *dy, const float *gate, const float *up, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float g = gate[i], u = up[i], y = dy[i];
        float sig = 1.0f / (1.0f + expf(-g));
        float silu = g * sig;
        dgate[i] = y * u * sig * (1.0f + g * (1.0f - sig));
        dup[i] = y * silu;
    }
}

void zs_op_gelu_bwd(float *dx, const float *dy, const float *x, size_t n) {
    const float k = 0.7978845608028654f; /* sqrt(2/pi) */
    for (size_t i = 0; i < n; i++) {
        float v = x[i];
        float th = tanhf(k * (v + 0.044715f * v * v * v));
        float d = 0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * k * (1.0f + 3.0f * 0.044715f * v * v);
        dx[i] = dy[i] * d;
    }
}

void zs_op_geglu_bwd(float *dgate, float *dup, const float *dy, const float *gate, const float *up, size_t n) {
    const float k = 0.7978845608028654f; /* sqrt(2/pi) */
    for (size_t i = 0; i < n; i++) {
        float v = gate[i], u = up[i], y = dy[i];
        float th = tanhf(k * (v + 0.044715f * v * v * v));
        float d = 0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * k * (1.0f + 3.0f * 0.044715f * v * v);
        dgate[i] = y * u * d;
        dup[i] = y * (0.5f * v * (1.0f + th));
    }
}

void zs_op_add_bwd(float *dx, const float *dy, size_t n) { zs_op_add(dx, dy, n); }

void zs_op_embed_bwd(float *dtable, const float *dy, const int32_t *ids, int T, int d) {
    for (int t = 0; t < T; t++) zs_op_add(dtable + (size_t)ids[t] * d, dy + (size_t)t * d, (size_t)d);
}

double zs_op_cross_entropy(float *dlogits, const float *logits, const int32_t *targets, int T, int V,
                           float scale) {
    double loss = 0.0;
    for (int t = 0; t < T; t++) {
        const float *x = logits + (size_t)t * V;
        float *g = dlogits ? dlogits + (size_t)t * V : NULL;
        int tg = targets[t];
        if (tg < 0) {
            if (g) memset(g, 0, (size_t)V * sizeof(float));
            continue;
        }
        float m = -INFINITY;
        for (int j = 0; j < V; j++) m = x[j] > m ? x[j] : m;
        double s = 0.0;
        for (int j = 0; j < V; j++) s += exp((double)x[j] - m);
        double lse = m + log(s);
        loss += lse - x[tg];
        if (g) {
            for (int j = 0; j < V; j++) g[j] = (float)(exp((double)x[j] - lse) * scale);
            g[tg] -= scale;
        }
    }
    return loss;
}
