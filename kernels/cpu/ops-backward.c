/* ops-backward.c — CPU backward of the forward ops (engine/train-ops.h): matmul through OpenBLAS
 * sgemm, norms, RoPE, causal attention with GQA, activations, embedding, cross-entropy. Sums
 * that reduce over a row or over tokens accumulate in double where it is cheap; the forward
 * parts (attention) repeat the exact float arithmetic of ops.c / forward.c. */
#include "train-ops.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

#include "common.h"
#include "ops.h"

void zs_op_matmul_bwd(float *dx, float *dW, float *db, const float *dy, const float *x, const void *W,
                      zs_dtype wdt, int T, int in, int out, float *wscratch) {
    if (T <= 0) return;
    if (dx) {
        if (wdt == ZS_F32) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, in, out, 1.0f, dy, out,
                        (const float *)W, in, 1.0f, dx, in);
        } else {
            /* dx += Σ over blocks of W rows: dy[:, r0:r0+R] · W[r0:r0+R, :] */
            size_t esz = zs_dtype_size(wdt);
            for (int r0 = 0; r0 < out; r0 += ZS_MATMUL_BWD_BLOCK) {
                int R = ZS_MIN(ZS_MATMUL_BWD_BLOCK, out - r0);
                zs_to_f32(wscratch, (const char *)W + (size_t)r0 * (size_t)in * esz, wdt, (size_t)R * (size_t)in);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, in, R, 1.0f, dy + r0, out, wscratch,
                            in, 1.0f, dx, in);
            }
        }
    }
    if (dW)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, T, 1.0f, dy, out, x, in, 1.0f, dW, in);
    if (db) {
        for (int o = 0; o < out; o++) {
            double s = 0.0;
            for (int t = 0; t < T; t++) s += dy[(size_t)t * out + o];
            db[o] += (float)s;
        }
    }
}

void zs_op_rmsnorm_bwd(float *dx, float *dw, const float *dy, const float *x, const float *w, int T, int d,
                       float eps) {
    for (int t = 0; t < T; t++) {
        const float *xr = x + (size_t)t * d, *gr = dy + (size_t)t * d;
        float *dr = dx + (size_t)t * d;
        float ss = 0.0f;
        for (int i = 0; i < d; i++) ss += xr[i] * xr[i];
        float r = 1.0f / sqrtf(ss / (float)d + eps);
        double dot = 0.0;
        for (int i = 0; i < d; i++) dot += (double)gr[i] * w[i] * xr[i];
        float c = (float)(dot * r * r * r / d);
        for (int i = 0; i < d; i++) {
            dr[i] += r * w[i] * gr[i] - c * xr[i];
            if (dw) dw[i] += gr[i] * xr[i] * r;
        }
    }
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

/* The probabilities of query row i of head h (keys 0..i) into p: the float arithmetic of
 * forward.c's attention(). */
static void att_row_probs(float *p, const float *q, const float *k, int i, int kvd, int hd, float scale) {
    for (int j = 0; j <= i; j++) {
        const float *kr = k + (size_t)j * kvd;
        float s = 0.0f;
        for (int e = 0; e < hd; e++) s += q[e] * kr[e];
        p[j] = s * scale;
    }
    zs_op_softmax(p, i + 1);
}

void zs_op_attention_fwd(float *out, const float *q, const float *k, const float *v, int T, int nh, int nkv,
                         int hd, float *scratch) {
    int group = nh / nkv;
    size_t qd = (size_t)nh * hd, kvd = (size_t)nkv * hd;
    float scale = 1.0f / sqrtf((float)hd);
    for (int i = 0; i < T; i++) {
        for (int h = 0; h < nh; h++) {
            int kh = h / group;
            att_row_probs(scratch, q + (size_t)i * qd + (size_t)h * hd, k + (size_t)kh * hd, i, (int)kvd, hd,
                          scale);
            float *o = out + (size_t)i * qd + (size_t)h * hd;
            memset(o, 0, (size_t)hd * sizeof(float));
            for (int j = 0; j <= i; j++) {
                const float *vr = v + (size_t)j * kvd + (size_t)kh * hd;
                float w = scratch[j];
                for (int e = 0; e < hd; e++) o[e] += w * vr[e];
            }
        }
    }
}

void zs_op_attention_bwd(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                         const float *v, int T, int nh, int nkv, int hd, float *scratch) {
    int group = nh / nkv;
    size_t qd = (size_t)nh * hd, kvd = (size_t)nkv * hd;
    float scale = 1.0f / sqrtf((float)hd);
    float *p = scratch, *dp = scratch + T;
    for (int i = 0; i < T; i++) {
        for (int h = 0; h < nh; h++) {
            int kh = h / group;
            const float *qi = q + (size_t)i * qd + (size_t)h * hd;
            const float *go = dout + (size_t)i * qd + (size_t)h * hd;
            float *dqi = dq + (size_t)i * qd + (size_t)h * hd;
            att_row_probs(p, qi, k + (size_t)kh * hd, i, (int)kvd, hd, scale);
            /* dp_j = dout_i · v_j; softmax backward: ds_j = p_j (dp_j - Σ p dp) */
            double D = 0.0;
            for (int j = 0; j <= i; j++) {
                const float *vr = v + (size_t)j * kvd + (size_t)kh * hd;
                float s = 0.0f;
                for (int e = 0; e < hd; e++) s += go[e] * vr[e];
                dp[j] = s;
                D += (double)p[j] * s;
            }
            float Df = (float)D;
            for (int j = 0; j <= i; j++) {
                float ds = p[j] * (dp[j] - Df) * scale;
                const float *kr = k + (size_t)j * kvd + (size_t)kh * hd;
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
