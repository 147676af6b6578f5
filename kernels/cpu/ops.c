/* ops.c — CPU reference-quality implementations of the forward-pass operations. */
#include "ops.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

/* Per-thread scratch for converting weight blocks from f16/bf16 to f32. */
static _Thread_local float *zs_ops_scratch;
static _Thread_local size_t zs_ops_scratch_n;

static float *ops_scratch(size_t n) {
    if (n > zs_ops_scratch_n) {
        free(zs_ops_scratch);
        zs_ops_scratch = zs_aligned_alloc(64, n * sizeof(float));
        ZS_ASSERT(zs_ops_scratch != NULL);
        zs_ops_scratch_n = n;
    }
    return zs_ops_scratch;
}

/* One BLAS call for rows [0,rows) of an f32 weight block. T==1 uses gemv (streams W once). */
static void matmul_f32(float *y, int ldy, const float *x, int T, int in, const float *W, int rows) {
    if (T == 1)
        cblas_sgemv(CblasRowMajor, CblasNoTrans, rows, in, 1.0f, W, in, x, 1, 0.0f, y, 1);
    else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, rows, in, 1.0f, x, in, W, in,
                    0.0f, y, ldy);
}

void zs_op_matmul(float *y, const float *x, int T, int in, const void *W, zs_dtype wdt, int out,
                  const float *bias) {
    if (wdt == ZS_F32) {
        matmul_f32(y, out, x, T, in, W, out);
    } else {
        /* convert ~256 KiB of weights at a time (stays in L2), then multiply that block */
        int rows_blk = (int)ZS_MAX(1, (64 * 1024) / (size_t)in);
        float *buf = ops_scratch((size_t)rows_blk * (size_t)in);
        size_t esz = zs_dtype_size(wdt);
        for (int r0 = 0; r0 < out; r0 += rows_blk) {
            int rows = ZS_MIN(rows_blk, out - r0);
            zs_to_f32(buf, (const char *)W + (size_t)r0 * (size_t)in * esz, wdt,
                      (size_t)rows * (size_t)in);
            matmul_f32(y + r0, out, x, T, in, buf, rows);
        }
    }
    if (bias)
        for (int t = 0; t < T; t++) zs_op_add(y + (size_t)t * (size_t)out, bias, (size_t)out);
}

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

void zs_op_layernorm(float *y, const float *x, const float *w, const float *b, int T, int d,
                     float eps) {
    for (int t = 0; t < T; t++) {
        const float *xr = x + (size_t)t * d;
        float *yr = y + (size_t)t * d;
        float mean = 0.0f;
        for (int i = 0; i < d; i++) mean += xr[i];
        mean /= (float)d;
        float var = 0.0f;
        for (int i = 0; i < d; i++) {
            float c = xr[i] - mean;
            var += c * c;
        }
        var /= (float)d;
        float s = 1.0f / sqrtf(var + eps);
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
    size_t esz = zs_dtype_size(dt);
    zs_to_f32(out, (const char *)table + (size_t)id * (size_t)d * esz, dt, (size_t)d);
}
