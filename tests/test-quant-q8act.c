/* test-quant-q8act.c — the integer matmul path over block weights (kernels/cpu/matmul-q8act.h,
 * matmul-q8act-kern.h): for Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q6_K, Q5_K, Q3_K and Q2_K, zs_op_matmul in its
 * default mode, the generic, AVX2 and AVX-512 (VNNI) kernels all equal, bit for bit, a plain scalar loop
 * written here from the documented arithmetic (its own activation quantizer after llama.cpp's
 * quantize_row_q8_0 / q8_1 / q8_K_ref rounding, its own block decoding, integer pair sums, the
 * eight f32 chains over the blocks' exact integer sums), for T = 1, 3, 8, 37 and several row counts; a row alone gives
 * its row of the batch; re-executed with ZS_THREADS=1/2/3 the same checks pass (so the bits do
 * not depend on the thread count); the result is within the activation rounding bound of the
 * exact f32-activation path, Σ_k |w_k| · amax_block(x) · (0.5/127 + 2^-10) + 1e-5 · Σ|w·x| (the
 * half step of the 8-bit grid plus the fp16 rounding of the block scale); ZS_QUANT_ACT=f32 and
 * zs_op_matmul_quant_act(ZS_QUANT_ACT_F32) give the exact path's bits. */
#include "common.h"
#include "matmul-16.h"
#include "matmul-q8act.h"
#include "ops.h"
#include "testutil.h"

static uint32_t g_rng = 777;
static float frand(void) { /* uniform in [-1, 1) */
    g_rng = g_rng * 1664525u + 1013904223u;
    return (float)((g_rng >> 8) & 0xffffff) / 8388608.0f - 1.0f;
}
static uint8_t brand(void) {
    g_rng = g_rng * 1664525u + 1013904223u;
    return (uint8_t)(g_rng >> 24);
}

static const zs_dtype DTS[] = {ZS_Q8_0, ZS_Q4_0, ZS_Q4_1, ZS_Q5_0, ZS_Q5_1, ZS_Q4_K, ZS_Q6_K, ZS_Q5_K, ZS_Q3_K, ZS_Q2_K};
#define NDT ((int)(sizeof DTS / sizeof DTS[0]))
static const zs_q8a_fn GEN[] = {zs_q8a_block_q8_0_generic, zs_q8a_block_q4_0_generic, zs_q8a_block_q4_1_generic,
                                zs_q8a_block_q5_0_generic, zs_q8a_block_q5_1_generic, zs_q8a_block_q4_k_generic,
                                zs_q8a_block_q6_k_generic, zs_q8a_block_q5_k_generic, zs_q8a_block_q3_k_generic,
                                zs_q8a_block_q2_k_generic};
static const zs_q8a_fn AVX[] = {zs_q8a_block_q8_0_avx2, zs_q8a_block_q4_0_avx2, zs_q8a_block_q4_1_avx2,
                                zs_q8a_block_q5_0_avx2, zs_q8a_block_q5_1_avx2, zs_q8a_block_q4_k_avx2,
                                zs_q8a_block_q6_k_avx2, zs_q8a_block_q5_k_avx2, zs_q8a_block_q3_k_avx2,
                                zs_q8a_block_q2_k_avx2};
static const zs_q8a_fn A512[] = {zs_q8a_block_q8_0_avx512, zs_q8a_block_q4_0_avx512, zs_q8a_block_q4_1_avx512,
                                 zs_q8a_block_q5_0_avx512, zs_q8a_block_q5_1_avx512, zs_q8a_block_q4_k_avx512,
                                 zs_q8a_block_q6_k_avx512, zs_q8a_block_q5_k_avx512, zs_q8a_block_q3_k_avx512,
                                 zs_q8a_block_q2_k_avx512};

/* where a block keeps its f16 d and its f16 min (-1: none) */
static int d_at(zs_dtype dt) { return dt == ZS_Q6_K ? 208 : dt == ZS_Q3_K ? 108 : dt == ZS_Q2_K ? 80 : 0; }
static int m_at(zs_dtype dt) {
    return dt == ZS_Q2_K ? 82 : dt == ZS_Q4_1 || dt == ZS_Q5_1 || dt == ZS_Q4_K || dt == ZS_Q5_K ? 2 : -1;
}

static int has_avx512(void) {
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c") &&
           __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vnni");
}

/* random blocks: every bit pattern of the quants, sane f16 scales and mins */
static void make_blocks(zs_dtype dt, uint8_t *W, size_t nblocks) {
    size_t bsz = zs_dtype_size(dt);
    for (size_t i = 0; i < nblocks * bsz; i++) W[i] = brand();
    for (size_t b = 0; b < nblocks; b++) {
        uint8_t *p = W + b * bsz;
        uint16_t d = zs_f32_to_f16(frand() * 0.01f), m = zs_f32_to_f16(frand() * 0.02f);
        memcpy(p + d_at(dt), &d, 2);
        if (m_at(dt) >= 0) memcpy(p + m_at(dt), &m, 2);
    }
}

/* ---- the scalar reference ---- */

static float f16r(float v) { return zs_f16_to_f32(zs_f32_to_f16(v)); }

/* one activation row, quantized the way llama.cpp does (rintf: ties to even) */
static void ref_quant(int kind, const float *x, int in, int8_t *q, float *d, float *s, int16_t *bs) {
    int B = kind == ZS_Q8A_Q8_K ? 256 : 32;
    for (int b = 0; b < in / B; b++) {
        const float *xb = x + b * B;
        int8_t *qb = q + b * B;
        if (kind != ZS_Q8A_Q8_K) {
            float amax = 0;
            for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(xb[i]));
            float dd = amax / 127.0f, id = amax != 0 ? 127.0f / amax : 0.0f;
            int sum = 0;
            for (int i = 0; i < 32; i++) {
                float v = xb[i] * id;
                qb[i] = (int8_t)rintf(v);
                sum += qb[i];
            }
            d[b] = f16r(dd);
            if (kind == ZS_Q8A_Q8_1) s[b] = f16r(dd * (float)sum);
        } else {
            float amax = 0, max = 0;
            for (int i = 0; i < 256; i++)
                if (fabsf(xb[i]) > amax) amax = fabsf(xb[i]), max = xb[i];
            if (amax == 0) {
                d[b] = 0;
                memset(qb, 0, 256);
                for (int j = 0; j < 16; j++) bs[b * 16 + j] = 0;
                continue;
            }
            float iscale = -127.0f / max;
            for (int i = 0; i < 256; i++) {
                float v = iscale * xb[i];
                int r = (int)rintf(v);
                qb[i] = (int8_t)(r > 127 ? 127 : r);
            }
            for (int j = 0; j < 16; j++) {
                int t = 0;
                for (int i = 0; i < 16; i++) t += qb[16 * j + i];
                bs[b * 16 + j] = (int16_t)t;
            }
            d[b] = 1.0f / iscale;
        }
    }
}

/* one stored block decoded: its integer weights, the int16 scale of each pair of weights, the
 * f32 scale, and the min's parts (Q4_1/Q5_1: f32 m; Q4_K/Q5_K: f32 dmin and the group mins;
 * Q2_K: f32 dmin and the mins of the 16s) */
typedef struct {
    int w[256], sc[128], mn[16];
    float d, m;
} ref_blk;

static int nib(const uint8_t *q, int i) { return i < 16 ? q[i] & 15 : q[i - 16] >> 4; }

static void ref_decode(zs_dtype dt, const uint8_t *b, ref_blk *r) {
    uint16_t h;
    uint32_t qh = 0;
    memset(r, 0, sizeof *r);
    for (int i = 0; i < 128; i++) r->sc[i] = 1;
    switch (dt) {
    case ZS_Q8_0:
        for (int i = 0; i < 32; i++) r->w[i] = (int8_t)b[2 + i];
        break;
    case ZS_Q4_0:
        for (int i = 0; i < 32; i++) r->w[i] = nib(b + 2, i) - 8;
        break;
    case ZS_Q4_1:
        for (int i = 0; i < 32; i++) r->w[i] = nib(b + 4, i);
        break;
    case ZS_Q5_0:
        memcpy(&qh, b + 2, 4);
        for (int i = 0; i < 32; i++) r->w[i] = (nib(b + 6, i) | (int)((qh >> i) & 1) << 4) - 16;
        break;
    case ZS_Q5_1:
        memcpy(&qh, b + 4, 4);
        for (int i = 0; i < 32; i++) r->w[i] = nib(b + 8, i) | (int)((qh >> i) & 1) << 4;
        break;
    case ZS_Q4_K:
    case ZS_Q5_K: {
        const uint8_t *s = b + 4;
        for (int g = 0; g < 8; g++) {
            int sc, m;
            if (g < 4) sc = s[g] & 63, m = s[g + 4] & 63;
            else sc = (s[g + 4] & 15) | ((s[g - 4] >> 6) << 4), m = (s[g + 4] >> 4) | ((s[g] >> 6) << 4);
            r->mn[g] = m;
            for (int i = 0; i < 16; i++) r->sc[16 * g + i] = sc;
            for (int i = 0; i < 32; i++)
                r->w[32 * g + i] = dt == ZS_Q4_K ? (b[16 + 32 * (g / 2) + i] >> (4 * (g % 2))) & 15
                                                 : ((b[48 + 32 * (g / 2) + i] >> (4 * (g % 2))) & 15) |
                                                       ((b[16 + i] >> g) & 1) << 4;
        }
        break;
    }
    case ZS_Q3_K: /* dequantize_row_q3_K's layout: 128 per half, 4 quarters of 32, a scale per 16 */
    case ZS_Q2_K:
        for (int g = 0; g < 8; g++) {
            int hn = g / 4, qq = g % 4;
            for (int i = 0; i < 32; i++) {
                int lo = b[(dt == ZS_Q3_K ? 32 : 16) + 32 * hn + i] >> (2 * qq) & 3, is = 8 * hn + 2 * qq + i / 16;
                if (dt == ZS_Q3_K) {
                    const uint8_t *q = b + 96;
                    int sl = is < 8 ? q[is] & 15 : q[is - 8] >> 4, sh = q[8 + is % 4] >> (2 * (is / 4)) & 3;
                    r->w[32 * g + i] = lo - ((b[i] >> (4 * hn + qq) & 1) ? 0 : 4);
                    r->sc[16 * g + i / 2] = (sl | sh << 4) - 32;
                } else {
                    r->w[32 * g + i] = lo;
                    r->sc[16 * g + i / 2] = b[is] & 15;
                    r->mn[is] = b[is] >> 4;
                }
            }
        }
        break;
    case ZS_Q6_K: /* dequantize_row_q6_K's layout: 128 per half, 4 quarters of 32 */
        for (int g = 0; g < 8; g++) {
            int hn = g / 4, qq = g % 4;
            for (int i = 0; i < 32; i++) {
                int lo = b[64 * hn + 32 * (qq % 2) + i] >> (4 * (qq / 2)) & 15;
                int hi = b[128 + 32 * hn + i] >> (2 * qq) & 3;
                r->w[32 * g + i] = (lo | hi << 4) - 32;
                r->sc[16 * g + i / 2] = (int8_t)b[192 + 8 * hn + 2 * qq + i / 16];
            }
        }
        break;
    default: break;
    }
    memcpy(&h, b + d_at(dt), 2);
    r->d = zs_f16_to_f32(h);
    if (m_at(dt) >= 0) {
        memcpy(&h, b + m_at(dt), 2);
        r->m = zs_f16_to_f32(h);
    }
}

/* lanes = 1: the order before (8 int32 lanes of four, each scaled into its own f32 chain, then
 * summed pairwise): a check that the tests tell one order from another */
static void ref_matmul_o(zs_dtype dt, float *y, const float *x, int T, int in, const uint8_t *W, int out, int lanes) {
    int kind = zs_q8a_kind(dt), B = zs_dtype_block(dt), nb = in / B;
    int8_t *q = malloc((size_t)in);
    float *d = malloc(nb * 4), *s = malloc(nb * 4);
    int16_t *bs = malloc((size_t)in / 16 * 2 + 2);
    ref_blk *rb = malloc(sizeof *rb);
    size_t row = zs_dtype_bytes(dt, (size_t)in);
    for (int t = 0; t < T; t++) {
        ref_quant(kind, x + (size_t)t * in, in, q, d, s, bs);
        for (int j = 0; j < out; j++) {
            float a[8] = {0}, m[8] = {0}, al[8] = {0}, ml = 0;
            for (int b = 0; b < nb; b++) {
                ref_decode(dt, W + (size_t)j * row + (size_t)b * zs_dtype_size(dt), rb);
                int32_t S = 0, sl[8] = {0}; /* the block's exact integer sum, in plain order */
                for (int k = 0; k < B; k++) S += rb->sc[k / 2] * (rb->w[k] * q[b * B + k]);
                for (int k = 0; k < B; k++) sl[(k % 32) / 4] += rb->sc[k / 2] * (rb->w[k] * q[b * B + k]);
                float dd = rb->d * d[b];
                a[b % 8] = fmaf(dd, (float)S, a[b % 8]); /* eight chains, blocks dealt in turn */
                for (int l = 0; l < 8; l++) al[l] = fmaf(dd, (float)sl[l], al[l]);
                float mv = 0, mc = 0;
                int hasm = 0;
                if (dt == ZS_Q4_1 || dt == ZS_Q5_1) mc = rb->m, mv = s[b], hasm = 1;
                if (dt == ZS_Q4_K || dt == ZS_Q5_K) {
                    int ms = 0;
                    for (int g = 0; g < 8; g++) ms += rb->mn[g] * (bs[b * 16 + 2 * g] + bs[b * 16 + 2 * g + 1]);
                    mc = -(rb->m * d[b]), mv = (float)ms, hasm = 1;
                }
                if (dt == ZS_Q2_K) {
                    int ms = 0;
                    for (int k = 0; k < 16; k++) ms += rb->mn[k] * bs[b * 16 + k];
                    mc = -(rb->m * d[b]), mv = (float)ms, hasm = 1;
                }
                if (hasm) {
                    m[b % 8] = fmaf(mc, mv, m[b % 8]);
                    ml = fmaf(mc, mv, ml);
                }
            }
            float v = lanes ? ((al[0] + al[1]) + (al[2] + al[3])) + ((al[4] + al[5]) + (al[6] + al[7]))
                            : ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
            if (m_at(dt) >= 0)
                v = v + (lanes ? ml : ((m[0] + m[1]) + (m[2] + m[3])) + ((m[4] + m[5]) + (m[6] + m[7])));
            y[(size_t)t * out + j] = v;
        }
    }
    free(q); free(d); free(s); free(bs); free(rb);
}
static void ref_matmul(zs_dtype dt, float *y, const float *x, int T, int in, const uint8_t *W, int out) {
    ref_matmul_o(dt, y, x, T, in, W, out, 0);
}

/* ---- the checks ---- */

static double g_worst[NDT]; /* the largest |q8 - f32| / bound seen, per format */

static void check_one(int f, int T, int in, int out) {
    zs_dtype dt = DTS[f];
    const char *dn = zs_dtype_name(dt);
    size_t nw = (size_t)out * in;
    uint8_t *W = malloc(zs_dtype_bytes(dt, nw));
    float *x = malloc((size_t)T * in * 4), *ref = malloc((size_t)T * out * 4), *y = malloc((size_t)T * out * 4);
    float *y1 = malloc((size_t)out * 4), *yf = malloc((size_t)T * out * 4), *Wd = malloc(nw * 4);
    make_blocks(dt, W, nw / zs_dtype_block(dt));
    for (size_t i = 0; i < (size_t)T * in; i++) x[i] = frand() * (i % 61 == 0 ? 8.0f : 1.0f);
    if (T > 2) /* a block of zeros, a tie */
        for (int i = 0; i < 256 && i < in; i++) x[(size_t)in + i] = i == 3 ? 0.5f : 0.0f;
    ref_matmul(dt, ref, x, T, in, W, out);
    if ((size_t)T * out >= 64) { /* another order gives other bits somewhere, so the checks can see one */
        float *yo = malloc((size_t)T * out * 4);
        ref_matmul_o(dt, yo, x, T, in, W, out, 1);
        CHECK(memcmp(yo, ref, (size_t)T * out * 4) != 0, "%s T=%d in=%d out=%d: the lane order differs somewhere", dn,
              T, in, out);
        free(yo);
    }
    zs_op_matmul(y, x, T, in, W, dt, out, NULL);
    CHECK(!memcmp(y, ref, (size_t)T * out * 4), "%s T=%d in=%d out=%d: zs_op_matmul (q8) is the scalar loop's bits", dn,
          T, in, out);
    /* the kernels directly, on activations the driver's quantizer wrote */
    int kind = zs_q8a_kind(dt), nb = in / zs_dtype_block(dt);
    zs_q8a a = {malloc((size_t)T * in), malloc((size_t)T * nb * 4), malloc((size_t)T * nb * 4),
                malloc((size_t)T * in / 16 * 2 + 2), in, nb, NULL}; /* no qsum: the kernels sum the blocks */
    for (int t = 0; t < T; t++) zs_q8a_quantize_row(&a, kind, t, x + (size_t)t * in);
    memset(y, 0, (size_t)T * out * 4);
    GEN[f](y, out, &a, 0, T, W, out);
    CHECK(!memcmp(y, ref, (size_t)T * out * 4), "%s T=%d in=%d out=%d: the generic kernel", dn, T, in, out);
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) {
        memset(y, 0, (size_t)T * out * 4);
        AVX[f](y, out, &a, 0, T, W, out);
        CHECK(!memcmp(y, ref, (size_t)T * out * 4), "%s T=%d in=%d out=%d: the AVX2 kernel", dn, T, in, out);
        /* a slice of the activation rows and of the weight rows, as the driver's tiles call it */
        if (T > 3 && out > 5) {
            float *ys = calloc((size_t)T * out, 4);
            AVX[f](ys + (size_t)2 * out + 3, out, &a, 2, T - 3, W + zs_dtype_bytes(dt, (size_t)3 * in), out - 5);
            int bad = 0;
            for (int t = 2; t < T - 1; t++)
                for (int j = 3; j < out - 2; j++) bad += ys[(size_t)t * out + j] != ref[(size_t)t * out + j];
            CHECK(bad == 0, "%s T=%d out=%d: a sub-tile gives the same bits (%d differ)", dn, T, out, bad);
            free(ys);
        }
    }
    if (has_avx512()) {
        memset(y, 0, (size_t)T * out * 4);
        A512[f](y, out, &a, 0, T, W, out);
        CHECK(!memcmp(y, ref, (size_t)T * out * 4), "%s T=%d in=%d out=%d: the AVX-512 kernel", dn, T, in, out);
        if (T > 3 && out > 5) {
            float *ys = calloc((size_t)T * out, 4);
            A512[f](ys + (size_t)2 * out + 3, out, &a, 2, T - 3, W + zs_dtype_bytes(dt, (size_t)3 * in), out - 5);
            int bad = 0;
            for (int t = 2; t < T - 1; t++)
                for (int j = 3; j < out - 2; j++) bad += ys[(size_t)t * out + j] != ref[(size_t)t * out + j];
            CHECK(bad == 0, "%s T=%d out=%d: an AVX-512 sub-tile gives the same bits (%d differ)", dn, T, out, bad);
            free(ys);
        }
    }
    free(a.q); free(a.d); free(a.s); free(a.bs);
    int bad = 0;
    for (int t = 0; t < T; t++) {
        zs_op_matmul(y1, x + (size_t)t * in, 1, in, W, dt, out, NULL);
        bad += memcmp(y1, ref + (size_t)t * out, (size_t)out * 4) != 0;
    }
    CHECK(bad == 0, "%s T=%d in=%d out=%d: a row alone is its row of the batch (%d differ)", dn, T, in, out, bad);
    /* against the exact path */
    int prev = zs_op_matmul_quant_act(ZS_QUANT_ACT_F32);
    CHECK(prev == ZS_QUANT_ACT_Q8, "the default mode is q8 (%d)", prev);
    zs_op_matmul(yf, x, T, in, W, dt, out, NULL);
    zs_op_matmul_quant_act(ZS_QUANT_ACT_Q8);
    float *yx = malloc((size_t)T * out * 4);
    zs_matmul_pick_quant(dt)(yx, out, x, T, in, W, out);
    CHECK(!memcmp(yf, yx, (size_t)T * out * 4), "%s T=%d: ZS_QUANT_ACT_F32 is the exact kernel's bits", dn, T);
    free(yx);
    zs_to_f32(Wd, W, dt, nw);
    int B = kind == ZS_Q8A_Q8_K ? 256 : 32, far = 0;
    for (int t = 0; t < T; t++)
        for (int j = 0; j < out; j++) {
            double bound = 0, sa = 0;
            for (int b = 0; b < in / B; b++) {
                double am = 0, sw = 0;
                for (int k = b * B; k < (b + 1) * B; k++) {
                    am = fmax(am, fabs(x[(size_t)t * in + k]));
                    sw += fabs(Wd[(size_t)j * in + k]);
                    sa += fabs((double)Wd[(size_t)j * in + k] * x[(size_t)t * in + k]);
                }
                bound += sw * am * (0.5 / 127 + 1.0 / 1024);
            }
            bound += 1e-5 * sa + 1e-30;
            double e = fabs((double)ref[(size_t)t * out + j] - yf[(size_t)t * out + j]);
            far += e > bound;
            if (e / bound > g_worst[f]) g_worst[f] = e / bound;
        }
    CHECK(far == 0, "%s T=%d in=%d out=%d: within the activation rounding bound of the f32 path (%d outside)", dn, T,
          in, out, far);
    free(W); free(x); free(ref); free(y); free(y1); free(yf); free(Wd);
}

static void run_checks(void) {
    const int Ts[] = {1, 3, 8, 37};
    const int shapes[][2] = {{256, 1}, {256, 7}, {512, 13}, {768, 64}, {1024, 130}, {256, 1030}, {2304, 9}, {2560, 17}};
    for (int f = 0; f < NDT; f++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int i = 0; i < 4; i++) {
                if ((size_t)Ts[i] * shapes[s][0] * shapes[s][1] > (size_t)8 << 20) continue;
                check_one(f, Ts[i], shapes[s][0], shapes[s][1]);
            }
    /* blocks of 32 with rows that are not whole super-blocks */
    for (int f = 0; f < 5; f++) check_one(f, 3, 96, 9);
    CHECK(zs_matmul_q8act(NULL, NULL, 1, 100, NULL, ZS_Q8_0, 4) == ZS_EINVAL, "in not a multiple of 32: refused");
    CHECK(zs_matmul_q8act(NULL, NULL, 1, 96, NULL, ZS_Q4_K, 4) == ZS_EINVAL, "in not a multiple of 256: refused");
    CHECK(zs_matmul_q8act(NULL, NULL, 1, 256, NULL, ZS_F32, 4) == ZS_EINVAL, "f32 weights: refused");
    CHECK(!zs_matmul_q8act_supports(ZS_BF16) && zs_matmul_q8act_supports(ZS_Q6_K), "supports");
}

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "envf32")) { /* ZS_QUANT_ACT=f32 in the environment */
        CHECK(zs_op_matmul_quant_act(-1) == ZS_QUANT_ACT_F32, "ZS_QUANT_ACT=f32 read");
        int T = 5, in = 256, out = 11;
        uint8_t *W = malloc(zs_dtype_bytes(ZS_Q4_0, (size_t)in * out));
        float *x = malloc((size_t)T * in * 4), *y = malloc((size_t)T * out * 4), *yx = malloc((size_t)T * out * 4);
        make_blocks(ZS_Q4_0, W, (size_t)in * out / 32);
        for (int i = 0; i < T * in; i++) x[i] = frand();
        zs_op_matmul(y, x, T, in, W, ZS_Q4_0, out, NULL);
        zs_matmul_pick_quant(ZS_Q4_0)(yx, out, x, T, in, W, out);
        CHECK(!memcmp(y, yx, (size_t)T * out * 4), "ZS_QUANT_ACT=f32: the exact kernel's bits");
        free(W); free(x); free(y); free(yx);
        return tu_finish("test-quant-q8act (ZS_QUANT_ACT=f32)");
    }
    run_checks();
    if (argc >= 2) return tu_finish("test-quant-q8act (child)");
    for (int f = 0; f < NDT; f++)
        fprintf(stderr, "test-quant-q8act: %s: largest |q8 - f32| = %.3f of the bound\n", zs_dtype_name(DTS[f]),
                g_worst[f]);
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    CHECK(n > 0, "readlink /proc/self/exe");
    if (n > 0) {
        self[n] = 0;
        const char *threads[] = {"1", "2", "3"};
        for (int i = 0; i < 3; i++) {
            char cmd[4300];
            snprintf(cmd, sizeof cmd, "ZS_THREADS=%s '%s' child", threads[i], self);
            int rc = system(cmd);
            CHECK(rc == 0, "ZS_THREADS=%s: the checks pass (exit %d)", threads[i], rc);
        }
        char cmd[4300];
        snprintf(cmd, sizeof cmd, "ZS_QUANT_ACT=f32 '%s' envf32", self);
        CHECK(system(cmd) == 0, "ZS_QUANT_ACT=f32 selects the exact path");
    }
    return tu_finish("test-quant-q8act");
}
