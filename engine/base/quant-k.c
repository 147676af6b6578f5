/* quant-k.c — the K-quant quantizers: f32 to ggml's Q4_K, Q5_K, Q6_K, Q3_K and Q2_K super-blocks
 * of 256, the bytes of ggml's reference quantizers (quantize_row_q4_K_ref / q5_K_ref / q6_K_ref /
 * q3_K_ref / q2_K_ref, no importance matrix). Their search for a group's scale (and min) runs in f32 with every operation rounded in
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

/* the first of the n values with the largest magnitude (ggml's max for make_qx/q3_quants) */
static inline float qk_signed_max(const float *x, int n) {
    float amax = 0, max = 0;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            max = x[i];
        }
    return max;
}

/* ---- Q4_K, Q5_K, Q2_K: levels with a scale and a min ---- */

/* Levels 0..nmax with a scale and a min for one group of n (<= 32) weighted values (ggml's
 * make_qkx2_quants; Q4_K: n 32, nmax 15, rmin -1, rdelta 0.1, 20 steps, squared error; Q5_K: n 32,
 * nmax 31, rmin -0.5, 15 steps; Q2_K: n 16, nmax 3, rmin -0.5, 15 steps, absolute error): the
 * first fit spans [min(x, 0), max(x)]; then nstep + 1 level grids (nmax + rmin + rdelta·is over
 * the span) are each refitted by weighted least squares (a positive min is clamped to 0 and the
 * scale refitted alone) and kept when their weighted error is lower. Returns the scale;
 * *neg_min = -min. */
ZS_QK_EXACT static float qk_fit_min(int n, int nmax, const float *x, const float *w, uint8_t *L, float *neg_min,
                                    float rmin, float rdelta, int nstep, int use_mad) {
    float lo = x[0], hi = x[0], sw = w[0], sx = sw * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < lo) lo = x[i];
        if (x[i] > hi) hi = x[i];
        sw += w[i];
        sx += w[i] * x[i];
    }
    if (lo > 0) lo = 0;
    if (hi == lo) {
        memset(L, 0, (size_t)n);
        *neg_min = -lo;
        return 0.0f;
    }
    float inv = nmax / (hi - lo), scale = 1 / inv, best = 0;
    for (int i = 0; i < n; i++) {
        L[i] = (uint8_t)qk_clamp(qk_round(inv * (x[i] - lo)), 0, nmax);
        float e = scale * L[i] + lo - x[i];
        e = use_mad ? fabsf(e) : e * e;
        best += w[i] * e;
    }
    uint8_t La[32];
    for (int is = 0; is <= nstep; is++) {
        inv = (rmin + rdelta * (float)is + nmax) / (hi - lo);
        float sl = 0, sl2 = 0, sxl = 0;
        for (int i = 0; i < n; i++) {
            int l = qk_clamp(qk_round(inv * (x[i] - lo)), 0, nmax);
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
        for (int i = 0; i < n; i++) {
            float e = s * La[i] + m - x[i];
            e = use_mad ? fabsf(e) : e * e;
            err += w[i] * e;
        }
        if (err < best) {
            memcpy(L, La, (size_t)n);
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

/* n (a multiple of 256) f32 values to n/256 Q4_K (five 0) or Q5_K (five 1) super-blocks, the
 * bytes of ggml's quantize_row_q4_K_ref / q5_K_ref (no importance matrix): per group of 32, ggml's
 * make_qkx2_quants (weights rms(group) + |x|; levels 0..15 (Q5_K 0..31) with a scale and a min,
 * the best of 21 (Q5_K 16) least-squares refits), the 8 scales and mins as 6-bit multiples of
 * d = fp16(max scale / 63) and dmin = fp16(max min / 63), then the levels again against those;
 * Q5_K's fifth bits go to qh. Every operation an f32 one rounded in ggml's order, none fused;
 * rounding with ggml's nearest_int. */
ZS_QK_EXACT static void quantize_q45_k(uint8_t *o, const float *src, size_t n, int five) {
    int nmax = five ? 31 : 15;
    size_t bb = five ? ZS_Q5_K_BYTES : ZS_Q4_K_BYTES;
    for (size_t b = 0; b < n / ZS_QK_K; b++, o += bb, src += ZS_QK_K) {
        const float *x = src;
        uint8_t L[ZS_QK_K], *sc = o + 4;
        float w[32], scales[8], mins[8], max_scale = 0, max_min = 0;
        for (int g = 0; g < 8; g++) {
            /* weights: the group's rms plus |x| */
            float s2 = 0;
            for (int l = 0; l < 32; l++) s2 += x[32 * g + l] * x[32 * g + l];
            float av = sqrtf(s2 / 32);
            for (int l = 0; l < 32; l++) w[l] = av + fabsf(x[32 * g + l]);
            scales[g] = five ? qk_fit_min(32, 31, x + 32 * g, w, L + 32 * g, &mins[g], -0.5f, 0.1f, 15, 0)
                             : qk_fit_min(32, 15, x + 32 * g, w, L + 32 * g, &mins[g], -1.0f, 0.1f, 20, 0);
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
            for (int l = 0; l < 32; l++)
                L[32 * g + l] = (uint8_t)qk_clamp(qk_round((x[32 * g + l] + m1) / d1), 0, nmax);
        }
        /* groups 2i and 2i+1 share bytes 32i..32i+31 of qs: low and high nibbles; Q5_K: the fifth
         * bit of weight l of group g is bit g of qh[l] */
        uint8_t *qs = o + (five ? 48 : 16), *qh = o + 16;
        if (five) memset(qh, 0, 32);
        for (int i = 0; i < 4; i++)
            for (int l = 0; l < 32; l++) {
                int a = L[64 * i + l], c = L[64 * i + 32 + l];
                if (five) qh[l] |= (uint8_t)(((a >> 4) << (2 * i)) | ((c >> 4) << (2 * i + 1)));
                qs[32 * i + l] = (uint8_t)((a & 15) | ((c & 15) << 4));
            }
    }
}

void zs_quantize_q4_k(void *dst, const float *src, size_t n) { quantize_q45_k(dst, src, n, 0); }
void zs_quantize_q5_k(void *dst, const float *src, size_t n) { quantize_q45_k(dst, src, n, 1); }

/* ---- Q6_K ---- */

/* Signed levels -32..31 and a scale for 16 values weighted by x² (ggml's make_qx_quants with
 * nmax 32, rmse_type 1): the scale from the first value of largest |x| (-32/max), its weighted
 * least-squares refit, then 18 more grids (-(32 + 0.1·is)/max, is = ±1..±9) kept when they fit
 * better. L gets level + 32 (0..63); an all-zero group gets L = 0 and scale 0. */
ZS_QK_EXACT static float qk6_fit(const float *x, int8_t *L) {
    enum { N = 16, NMAX = 32 };
    float max = qk_signed_max(x, N);
    if (fabsf(max) < 1e-15f) {
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

/* n (a multiple of 256) f32 values to n/256 Q6_K super-blocks, the bytes of ggml's
 * quantize_row_q6_K_ref: per 16, make_qx_quants (levels -32..31, weights x², the best of 19
 * grids), the 16 scales as int8 multiples of d = fp16(max_scale / -128), then the levels again. */
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

/* ---- Q3_K and Q2_K: 16 groups of 16 ---- */

/* The 2 low bits of the 256 levels L into qs (64 bytes): weight 128h + 32j + l at bits 2j of
 * qs[32h + l] */
static void qk_pack2(uint8_t *qs, const uint8_t *L) {
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            const uint8_t *q = L + 128 * h + l;
            qs[32 * h + l] = (uint8_t)((q[0] & 3) | (q[32] & 3) << 2 | (q[64] & 3) << 4 | (q[96] & 3) << 6);
        }
}

/* Signed levels -4..3 and a scale for 16 values weighted by x² (ggml's make_q3_quants with nmax 4
 * and rmse): the levels of the scale -4/max (max the first value of largest |x|), then up to 5
 * passes that move one level at a time to the least-squares optimum of the others' fit and keep
 * the move when the fit's sumlx²/suml2 grows. L gets level + 4 (0..7) and the return is
 * sumlx/suml2; an all-zero group gets L = 0 and scale 0. */
ZS_QK_EXACT static float qk3_fit(const float *x, int8_t *L) {
    enum { N = 16, NMAX = 4 };
    float max = qk_signed_max(x, N);
    if (fabsf(max) < 1e-15f) {
        memset(L, 0, N);
        return 0.0f;
    }
    float inv = -NMAX / max, slx = 0, sl2 = 0;
    for (int i = 0; i < N; i++) {
        int l = qk_clamp(qk_round(inv * x[i]), -NMAX, NMAX - 1);
        L[i] = (int8_t)l;
        float w = x[i] * x[i];
        slx += w * x[i] * l;
        sl2 += w * l * l;
    }
    for (int t = 0; t < 5; t++) {
        int changed = 0;
        for (int i = 0; i < N; i++) {
            float w = x[i] * x[i];
            float a = slx - w * x[i] * L[i];
            if (a > 0) {
                float b = sl2 - w * L[i] * L[i];
                int nl = qk_clamp(qk_round(x[i] * b / a), -NMAX, NMAX - 1);
                if (nl != L[i]) {
                    a += w * x[i] * nl;
                    b += w * nl * nl;
                    if (b > 0 && a * a * sl2 > slx * slx * b) {
                        L[i] = (int8_t)nl;
                        slx = a;
                        sl2 = b;
                        changed++;
                    }
                }
            }
        }
        if (!changed) break;
    }
    for (int i = 0; i < N; i++) L[i] = (int8_t)(L[i] + NMAX);
    return sl2 > 0.0f ? slx / sl2 : 0.0f;
}

/* n (a multiple of 256) f32 values to n/256 Q3_K super-blocks, the bytes of ggml's
 * quantize_row_q3_K_ref: per 16, make_q3_quants (above); the 16 scales as 6-bit signed multiples
 * of d = fp16(max_scale / -32) (max_scale the scale of largest magnitude), stored + 32; then the
 * levels again against the stored scales (a group whose scale is 0 keeps its fit); the third bit
 * of each level to hmask, the low two to qs. */
ZS_QK_EXACT void zs_quantize_q3_k(void *dst, const float *src, size_t n) {
    uint8_t *o = dst;
    for (size_t b = 0; b < n / ZS_QK_K; b++, o += ZS_Q3_K_BYTES, src += ZS_QK_K) {
        const float *x = src;
        int8_t L[ZS_QK_K];
        uint8_t *hmask = o, *qs = o + 32, *sc = o + 96;
        float scales[16];
        for (int g = 0; g < 16; g++) scales[g] = qk3_fit(x + 16 * g, L + 16 * g);
        float max_scale = qk_signed_max(scales, 16);
        memset(sc, 0, 12);
        uint16_t hd;
        if (max_scale != 0) {
            float inv = -32.0f / max_scale;
            for (int g = 0; g < 16; g++) {
                int8_t l = (int8_t)qk_round(inv * scales[g]);
                l = (int8_t)(qk_clamp(l, -32, 31) + 32);
                if (g < 8) sc[g] = (uint8_t)(l & 0xF);
                else sc[g - 8] |= (uint8_t)((l & 0xF) << 4);
                sc[g % 4 + 8] |= (uint8_t)((l >> 4) << (2 * (g / 4)));
            }
            hd = zs_f32_to_f16(1 / inv);
        } else {
            hd = zs_f32_to_f16(0.0f);
        }
        memcpy(o + 108, &hd, 2);
        float d = zs_f16_to_f32(hd);
        for (int g = 0; g < 16; g++) {
            int lo = g < 8 ? sc[g] & 0xF : sc[g - 8] >> 4, hi = (sc[8 + g % 4] >> (2 * (g / 4))) & 3;
            float d1 = d * (float)(int8_t)((lo | hi << 4) - 32);
            if (d1 == 0) continue;
            for (int l = 0; l < 16; l++) L[16 * g + l] = (int8_t)(qk_clamp(qk_round(x[16 * g + l] / d1), -4, 3) + 4);
        }
        /* the third bit of weight k: bit k/32 of hmask[k % 32] */
        memset(hmask, 0, 32);
        uint8_t L2[ZS_QK_K];
        for (int k = 0; k < ZS_QK_K; k++) {
            int l = L[k];
            if (l > 3) {
                hmask[k % 32] |= (uint8_t)(1u << (k / 32));
                l -= 4;
            }
            L2[k] = (uint8_t)l;
        }
        qk_pack2(qs, L2);
    }
}

/* n (a multiple of 256) f32 values to n/256 Q2_K super-blocks, the bytes of ggml's
 * quantize_row_q2_K_ref: per 16, make_qkx2_quants (weights |x|, levels 0..3 with a scale and a
 * min, absolute error, the best of 16 refits); the 16 scales and mins as 4-bit multiples of
 * d = fp16(max scale / 15) and dmin = fp16(max min / 15) (low and high nibble of each scale byte);
 * then the levels again against those (a group whose scale is 0 keeps its fit). */
ZS_QK_EXACT void zs_quantize_q2_k(void *dst, const float *src, size_t n) {
    uint8_t *o = dst;
    for (size_t b = 0; b < n / ZS_QK_K; b++, o += ZS_Q2_K_BYTES, src += ZS_QK_K) {
        const float *x = src;
        uint8_t L[ZS_QK_K], *sc = o, *qs = o + 16;
        float w[16], scales[16], mins[16], max_scale = 0, max_min = 0;
        for (int g = 0; g < 16; g++) {
            for (int l = 0; l < 16; l++) w[l] = fabsf(x[16 * g + l]);
            scales[g] = qk_fit_min(16, 3, x + 16 * g, w, L + 16 * g, &mins[g], -0.5f, 0.1f, 15, 1);
            if (scales[g] > max_scale) max_scale = scales[g];
            if (mins[g] > max_min) max_min = mins[g];
        }
        uint16_t hd, hm;
        if (max_scale > 0) {
            float is = 15.0f / max_scale;
            for (int g = 0; g < 16; g++) sc[g] = (uint8_t)qk_round(is * scales[g]);
            hd = zs_f32_to_f16(max_scale / 15.0f);
        } else {
            memset(sc, 0, 16);
            hd = zs_f32_to_f16(0.0f);
        }
        if (max_min > 0) {
            float im = 15.0f / max_min;
            for (int g = 0; g < 16; g++) sc[g] |= (uint8_t)(qk_round(im * mins[g]) << 4);
            hm = zs_f32_to_f16(max_min / 15.0f);
        } else {
            hm = zs_f32_to_f16(0.0f);
        }
        memcpy(o + 80, &hd, 2);
        memcpy(o + 82, &hm, 2);
        float d = zs_f16_to_f32(hd), dmin = zs_f16_to_f32(hm);
        for (int g = 0; g < 16; g++) {
            float d1 = d * (float)(sc[g] & 0xF);
            if (d1 == 0) continue;
            float m1 = dmin * (float)(sc[g] >> 4);
            for (int l = 0; l < 16; l++) L[16 * g + l] = (uint8_t)qk_clamp(qk_round((x[16 * g + l] + m1) / d1), 0, 3);
        }
        qk_pack2(qs, L);
    }
}
