/* ops.c — CPU reference-quality implementations of the forward-pass operations. */
#include "ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

void zs_op_rmsnorm(float *y, const float *x, const float *w, int T, int d, float eps) {
    for (int t = 0; t < T; t++) {
        const float *xr = x + (size_t)t * d;
        float *yr = y + (size_t)t * d;
        float ss = 0.0f;
        for (int i = 0; i < d; i++) ss += xr[i] * xr[i];
        float s = 1.0f / sqrtf(ss / (float)d + eps);
        for (int i = 0; i < d; i++) yr[i] = xr[i] * s * w[i];
    }
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

void zs_op_rope(float *x, int n_heads, int head_dim, int pos, float theta) {
    int half = head_dim / 2;
    for (int i = 0; i < half; i++) {
        /* same float32 arithmetic as the HF reference: inv_freq = 1 / theta^(2i/d) */
        float inv_freq = 1.0f / powf(theta, (float)(2 * i) / (float)head_dim);
        float ang = (float)pos * inv_freq;
        float c = cosf(ang), s = sinf(ang);
        for (int h = 0; h < n_heads; h++) {
            float *v = x + (size_t)h * head_dim;
            float a = v[i], b = v[i + half];
            v[i] = a * c - b * s;
            v[i + half] = b * c + a * s;
        }
    }
}

void zs_op_gelu(float *x, size_t n) {
    const float k = 0.7978845608028654f; /* sqrt(2/pi) */
    for (size_t i = 0; i < n; i++) {
        float v = x[i];
        x[i] = 0.5f * v * (1.0f + tanhf(k * (v + 0.044715f * v * v * v)));
    }
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
