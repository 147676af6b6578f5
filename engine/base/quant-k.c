/* quant-k.c — the K-quant quantizers: f32 to ggml's Q4_K and Q6_K super-blocks of 256, the bytes
 * of ggml's reference quantizers (quantize_row_q4_K_ref / quantize_row_q6_K_ref, no importance
 * matrix). Their search for a group's scale (and min) runs in f32 with every operation rounded in
 * the order ggml writes it and nothing fused, and rounds with ggml's nearest_int (the
 * add-1.5·2^23 trick), so the bytes match on any input, outliers, zeros and subnormals included.
 * The layout of the blocks is described in tensor.c. Pure functions, thread-safe. */
#include <math.h>
#include <string.h>

#include "tensor.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif
/* no a*b + c contracted into an fma (ggml's reference build has none) */
#define ZS_QK_EXACT __attribute__((optimize("fp-contract=off")))

/* ggml's nearest_int: x + 1.5·2^23 leaves round-to-nearest-even(x) in the low mantissa bits
 * (|x| < 2^22); outside that range it gives what ggml gives, bit for bit */
static inline int qk_round(float x) {
    float v = x + 12582912.0f;
    int i;
    memcpy(&i, &v, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

static inline int qk_clamp(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* ---- Q4_K ---- */

/* Levels 0..15 with a scale and a min for one group of 32 weighted values (ggml's
 * make_qkx2_quants with nmax 15, rmin -1, rdelta 0.1, 20 steps, squared error): the first fit
 * spans [min(x, 0), max(x)]; then 21 level grids (15 - 1 + 0.1·is over the span) are each
 * refitted by weighted least squares (a positive min is clamped to 0 and the scale refitted alone)
 * and kept when their weighted squared error is lower. Returns the scale; *neg_min = -min. */
ZS_QK_EXACT static float qk4_fit(const float *x, const float *w, uint8_t *L, float *neg_min) {
    enum { N = 32, NMAX = 15, NSTEP = 20 };
    float lo = x[0], hi = x[0], sw = w[0], sx = sw * x[0];
    for (int i = 1; i < N; i++) {
        if (x[i] < lo) lo = x[i];
        if (x[i] > hi) hi = x[i];
        sw += w[i];
        sx += w[i] * x[i];
    }
    if (lo > 0) lo = 0;
    if (hi == lo) {
        memset(L, 0, N);
        *neg_min = -lo;
        return 0.0f;
    }
    float inv = NMAX / (hi - lo), scale = 1 / inv, best = 0;
    for (int i = 0; i < N; i++) {
        L[i] = (uint8_t)qk_clamp(qk_round(inv * (x[i] - lo)), 0, NMAX);
        float e = scale * L[i] + lo - x[i];
        best += w[i] * (e * e);
    }
    uint8_t La[N];
    for (int is = 0; is <= NSTEP; is++) {
        inv = (-1.0f + 0.1f * (float)is + NMAX) / (hi - lo);
        float sl = 0, sl2 = 0, sxl = 0;
        for (int i = 0; i < N; i++) {
            int l = qk_clamp(qk_round(inv * (x[i] - lo)), 0, NMAX);
            La[i] = (uint8_t)l;
            sl += w[i] * l;
            sl2 += w[i] * l * l;
            sxl += w[i] * l * x[i];
        }
        float D = sw * sl2 - sl * sl;
        if (!(D > 0)) continue;
        float s = (sw * sxl - sx * sl) / D, m = (sl2 * sx - sl * sxl) / D;
        if (m > 0) {
            m = 0;
            s = sxl / sl2;
        }
        float err = 0;
        for (int i = 0; i < N; i++) {
            float e = s * La[i] + m - x[i];
            err += w[i] * (e * e);
        }
        if (err < best) {
            memcpy(L, La, N);
            best = err;
            scale = s;
            lo = m;
        }
    }
    *neg_min = -lo;
    return scale;
}

/* Q4_K's 6-bit scale and min of group j back from the 12 packed bytes (get_scale_min_k4) */
static inline void qk4_scale_min(const uint8_t *q, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* n (a multiple of 256) f32 values to n/256 Q4_K / Q6_K super-blocks, the bytes of ggml's
 * quantize_row_q4_K_ref / quantize_row_q6_K_ref (no importance matrix). Q4_K: per group of
 * 32, ggml's make_qkx2_quants (weights rms(group) + |x|; levels 0..15 with a scale and a min, the
 * best of 21 least-squares refits), the 8 scales and mins as 6-bit multiples of d = fp16(max
 * scale / 63) and dmin = fp16(max min / 63), then the levels again against those. Q6_K: per 16,
 * make_qx_quants (levels -32..31, weights x², the best of 19 grids), the 16 scales as int8
 * multiples of d = fp16(max_scale / -128), then the levels again. Every operation an f32 one
 * rounded in ggml's order, none fused; rounding with ggml's nearest_int. */
ZS_QK_EXACT void zs_quantize_q4_k(void *dst, const float *src, size_t n) {
    uint8_t *o = dst;
    for (size_t b = 0; b < n / ZS_QK_K; b++, o += ZS_Q4_K_BYTES, src += ZS_QK_K) {
        const float *x = src;
        uint8_t L[ZS_QK_K], *sc = o + 4;
        float w[32], scales[8], mins[8], max_scale = 0, max_min = 0;
        for (int g = 0; g < 8; g++) {
            /* weights: the group's rms plus |x| */
            float s2 = 0;
            for (int l = 0; l < 32; l++) s2 += x[32 * g + l] * x[32 * g + l];
            float av = sqrtf(s2 / 32);
            for (int l = 0; l < 32; l++) w[l] = av + fabsf(x[32 * g + l]);
            scales[g] = qk4_fit(x + 32 * g, w, L + 32 * g, &mins[g]);
            if (scales[g] > max_scale) max_scale = scales[g];
            if (mins[g] > max_min) max_min = mins[g];
        }
        /* the 8 scales and mins as 6-bit multiples of max/63 */
        float is = max_scale > 0 ? 63.0f / max_scale : 0.0f, im = max_min > 0 ? 63.0f / max_min : 0.0f;
        for (int g = 0; g < 8; g++) {
            uint8_t ls = (uint8_t)qk_round(is * scales[g]), lm = (uint8_t)qk_round(im * mins[g]);
            ls = ls < 63 ? ls : 63;
            lm = lm < 63 ? lm : 63;
            if (g < 4) {
                sc[g] = ls;
                sc[g + 4] = lm;
            } else {
                sc[g + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
                sc[g - 4] |= (uint8_t)((ls >> 4) << 6);
                sc[g] |= (uint8_t)((lm >> 4) << 6);
            }
        }
        uint16_t hd = zs_f32_to_f16(max_scale / 63.0f), hm = zs_f32_to_f16(max_min / 63.0f);
        memcpy(o, &hd, 2);
        memcpy(o + 2, &hm, 2);
        /* the levels again against the stored (rounded) scales; a group whose scale is 0 keeps its fit */
        float d = zs_f16_to_f32(hd), dmin = zs_f16_to_f32(hm);
        for (int g = 0; g < 8; g++) {
            int s, m;
            qk4_scale_min(sc, g, &s, &m);
            float d1 = d * (float)s;
            if (d1 == 0) continue;
            float m1 = dmin * (float)m;
            for (int l = 0; l < 32; l++) L[32 * g + l] = (uint8_t)qk_clamp(qk_round((x[32 * g + l] + m1) / d1), 0, 15);
        }
        /* groups 2i and 2i+1 share bytes 32i..32i+31: low and high nibbles */
        for (int i = 0; i < 4; i++)
            for (int l = 0; l < 32; l++) o[16 + 32 * i + l] = (uint8_t)(L[64 * i + l] | (L[64 * i + 32 + l] << 4));
    }
}

/* ---- Q6_K ---- */

/* Signed levels -32..31 and a scale for 16 values weighted by x² (ggml's make_qx_quants with
 * nmax 32, rmse_type 1): the scale from the first value of largest |x| (-32/max), its weighted
 * least-squares refit, then 18 more grids (-(32 + 0.1·is)/max, is = ±1..±9) kept when they fit
 * better. L gets level + 32 (0..63); an all-zero group gets L = 0 and scale 0. */
ZS_QK_EXACT static float qk6_fit(const float *x, int8_t *L) {
    enum { N = 16, NMAX = 32 };
    float amax = 0, max = 0;
    for (int i = 0; i < N; i++) {
        float a = fabsf(x[i]);
        if (a > amax) {
            amax = a;
            max = x[i];
        }
    }
    if (amax < 1e-15f) {
        memset(L, 0, N);
        return 0.0f;
    }
    float inv = -NMAX / max, slx = 0, sl2 = 0;
    for (int i = 0; i < N; i++) {
        int l = qk_clamp(qk_round(inv * x[i]), -NMAX, NMAX - 1);
        L[i] = (int8_t)(l + NMAX);
        float w = x[i] * x[i];
        slx += w * x[i] * l;
        sl2 += w * l * l;
    }
    float scale = sl2 ? slx / sl2 : 0.0f, best = scale * slx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        inv = -(NMAX + 0.1f * (float)is) / max;
        slx = sl2 = 0;
        for (int i = 0; i < N; i++) {
            int l = qk_clamp(qk_round(inv * x[i]), -NMAX, NMAX - 1);
            float w = x[i] * x[i];
            slx += w * x[i] * l;
            sl2 += w * l * l;
        }
        if (sl2 > 0 && slx * slx > best * sl2) {
            for (int i = 0; i < N; i++) L[i] = (int8_t)(NMAX + qk_clamp(qk_round(inv * x[i]), -NMAX, NMAX - 1));
            scale = slx / sl2;
            best = scale * slx;
        }
    }
    return scale;
}

ZS_QK_EXACT void zs_quantize_q6_k(void *dst, const float *src, size_t n) {
    uint8_t *o = dst;
    for (size_t b = 0; b < n / ZS_QK_K; b++, o += ZS_Q6_K_BYTES, src += ZS_QK_K) {
        const float *x = src;
        int8_t L[ZS_QK_K], *sc = (int8_t *)(o + 192);
        float scales[16], max_scale = 0, max_abs = 0;
        for (int g = 0; g < 16; g++) {
            scales[g] = qk6_fit(x + 16 * g, L + 16 * g);
            float a = fabsf(scales[g]);
            if (a > max_abs) {
                max_abs = a;
                max_scale = scales[g];
            }
        }
        if (max_abs < 1e-15f) { /* nothing to scale: an all-zero block, d = 0 */
            memset(o, 0, ZS_Q6_K_BYTES);
            continue;
        }
        /* the 16 scales as int8 multiples of d = max_scale / -128 */
        float inv = -128.0f / max_scale;
        uint16_t hd = zs_f32_to_f16(1 / inv);
        memcpy(o + 208, &hd, 2);
        for (int g = 0; g < 16; g++) {
            int v = qk_round(inv * scales[g]);
            sc[g] = (int8_t)(v < 127 ? v : 127);
        }
        /* the levels again against the stored scales; a group whose scale is 0 keeps its fit */
        float d = zs_f16_to_f32(hd);
        for (int g = 0; g < 16; g++) {
            float d1 = d * (float)sc[g];
            if (d1 == 0) continue;
            for (int l = 0; l < 16; l++) L[16 * g + l] = (int8_t)(qk_clamp(qk_round(x[16 * g + l] / d1), -32, 31) + 32);
        }
        /* per half of 128: ql low nibbles (weights l, l+32 | l+64, l+96 high), qh the 2 high bits */
        uint8_t *ql = o, *qh = o + 128;
        for (int h = 0; h < 2; h++, ql += 64, qh += 32) {
            const int8_t *q = L + 128 * h;
            for (int l = 0; l < 32; l++) {
                ql[l] = (uint8_t)((q[l] & 0xF) | ((q[l + 64] & 0xF) << 4));
                ql[l + 32] = (uint8_t)((q[l + 32] & 0xF) | ((q[l + 96] & 0xF) << 4));
                qh[l] = (uint8_t)((q[l] >> 4) | ((q[l + 32] >> 4) << 2) | ((q[l + 64] >> 4) << 4) | ((q[l + 96] >> 4) << 6));
            }
        }
    }
}
