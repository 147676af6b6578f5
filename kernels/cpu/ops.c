/* ops.c — CPU reference-quality implementations of the forward-pass operations (ops.h): norms,
 * RoPE (default or given frequencies), activations (GELU, SwiGLU, GeGLU), soft-capping, softmax,
 * embedding rows. Scalar loops in a fixed order: the same bits on every CPU. */
#include "ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

/* y = (x·s)·w' per row, s = 1/sqrtf(ss/d + eps), w' = w (off 0: zs_op_rmsnorm's bits, even for a
 * weight of -0) or off + w (Gemma) */
void zs_op_rmsnorm_off(float *y, const float *x, const float *w, int T, int d, float eps, float off) {
    for (int t = 0; t < T; t++) {
        const float *xr = x + (size_t)t * d;
        float *yr = y + (size_t)t * d;
        float ss = 0.0f;
        for (int i = 0; i < d; i++) ss += xr[i] * xr[i];
        float s = 1.0f / sqrtf(ss / (float)d + eps);
        if (off == 0.0f)
            for (int i = 0; i < d; i++) yr[i] = xr[i] * s * w[i];
        else
            for (int i = 0; i < d; i++) yr[i] = xr[i] * s * (off + w[i]);
    }
}

void zs_op_rmsnorm(float *y, const float *x, const float *w, int T, int d, float eps) {
    zs_op_rmsnorm_off(y, x, w, T, d, eps, 0.0f);
}

void zs_op_layernorm_stats(const float *x, int d, float eps, float *mean, float *rstd) {
    float m = 0.0f;
    for (int i = 0; i < d; i++) m += x[i];
    m /= (float)d;
    float var = 0.0f;
    for (int i = 0; i < d; i++) {
        float c = x[i] - m;
        var += c * c;
    }
    var /= (float)d;
    *mean = m;
    *rstd = 1.0f / sqrtf(var + eps);
}

void zs_op_layernorm(float *y, const float *x, const float *w, const float *b, int T, int d,
                     float eps) {
    for (int t = 0; t < T; t++) {
        const float *xr = x + (size_t)t * d;
        float *yr = y + (size_t)t * d;
        float mean, s;
        zs_op_layernorm_stats(xr, d, eps, &mean, &s);
        for (int i = 0; i < d; i++) yr[i] = (xr[i] - mean) * s * w[i] + (b ? b[i] : 0.0f);
    }
}

/* gelu_tanh(v), shared by zs_op_gelu and zs_op_geglu (the same bits) */
static inline float gelu1(float v) {
    const float k = 0.7978845608028654f; /* sqrt(2/pi) */
    return 0.5f * v * (1.0f + tanhf(k * (v + 0.044715f * v * v * v)));
}

/* pairs i0 .. i0+n-1 of every head rotated by pos·f[i - i0], cos and sin times af */
static void rope_pairs(float *x, int n_heads, int head_dim, int pos, int i0, int n, const float *f, float af) {
    int half = head_dim / 2;
    for (int i = i0; i < i0 + n; i++) {
        float ang = (float)pos * f[i - i0];
        float c = cosf(ang) * af, s = sinf(ang) * af;
        for (int h = 0; h < n_heads; h++) {
            float *v = x + (size_t)h * head_dim;
            float a = v[i], b = v[i + half];
            v[i] = a * c - b * s;
            v[i + half] = b * c + a * s;
        }
    }
}

void zs_op_rope_freq(float *x, int n_heads, int head_dim, int pos, const float *inv_freq, float attn_factor) {
    rope_pairs(x, n_heads, head_dim, pos, 0, head_dim / 2, inv_freq, attn_factor);
}

void zs_op_rope(float *x, int n_heads, int head_dim, int pos, float theta) {
    /* same float32 arithmetic as the HF reference: inv_freq = 1 / theta^(2i/d), a chunk of the
     * table at a time, then zs_op_rope_freq's rotation with the factor 1 (exact) */
    enum { CHUNK = 128 };
    float f[CHUNK];
    int half = head_dim / 2;
    for (int i0 = 0; i0 < half; i0 += CHUNK) {
        int n = half - i0 < CHUNK ? half - i0 : CHUNK;
        for (int i = 0; i < n; i++) f[i] = 1.0f / powf(theta, (float)(2 * (i0 + i)) / (float)head_dim);
        rope_pairs(x, n_heads, head_dim, pos, i0, n, f, 1.0f);
    }
}

void zs_op_softcap(float *x, size_t n, float cap) {
    /* the division, not a product with 1/cap: transformers' x / cap, tanh, * cap */
    for (size_t i = 0; i < n; i++) x[i] = cap * tanhf(x[i] / cap);
}

void zs_op_geglu(float *out, const float *gate, const float *up, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = gelu1(gate[i]) * up[i];
}

void zs_op_gelu(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = gelu1(x[i]);
}

void zs_op_swiglu(float *out, const float *gate, const float *up, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

void zs_op_add(float *y, const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] += x[i];
}

void zs_op_softmax(float *x, int n) {
    float m = -INFINITY;
    for (int i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    float s = 0.0f;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - m);
        s += x[i];
    }
    float inv = 1.0f / s;
    for (int i = 0; i < n; i++) x[i] *= inv;
}

void zs_op_embed(float *out, const void *table, zs_dtype dt, int d, int id) {
    /* a row is whole blocks (model.c keeps a block-format table's rows multiples of 32) */
    zs_to_f32(out, (const char *)table + zs_dtype_bytes(dt, (size_t)id * (size_t)d), dt, (size_t)d);
}
