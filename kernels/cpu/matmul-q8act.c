/* matmul-q8act.c — the integer path of zs_op_matmul over block weights (matmul-q8act.h): the
 * mode switch (ZS_QUANT_ACT), the activation quantizers (llama.cpp's Q8_0, Q8_1 and Q8_K
 * rounding), the generic build of the block kernels (matmul-q8act-kern.h, lane by lane in plain
 * C; the AVX2 and AVX-512 builds, matmul-q8act-avx2.c and -avx512.c, give the same bits), the
 * run-time choice of build, and the driver that quantizes a call's activations once into a
 * per-thread scratch buffer (scratch.c) and spreads blocks of weight rows over the pool. */
#include "matmul-q8act.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "pool.h"
#include "scratch.h"

#pragma GCC diagnostic ignored "-Wpsabi" /* static helpers pass vectors: the ABI note does not apply */

/* ---- the mode ---- */

static atomic_int g_mode = -1;

static int mode_from_env(void) {
    const char *e = getenv("ZS_QUANT_ACT");
    if (!e || !*e || !strcmp(e, "q8")) return ZS_QUANT_ACT_Q8;
    if (!strcmp(e, "f32")) return ZS_QUANT_ACT_F32;
    zs_log_warn("ZS_QUANT_ACT=%s: not \"q8\" or \"f32\"; using q8 (8-bit activations)", e);
    return ZS_QUANT_ACT_Q8;
}

int zs_op_matmul_quant_act(int mode) {
    int cur = atomic_load(&g_mode);
    if (cur < 0) {
        int want = mode_from_env(), expect = -1;
        atomic_compare_exchange_strong(&g_mode, &expect, want);
        cur = atomic_load(&g_mode);
    }
    if (mode == ZS_QUANT_ACT_Q8 || mode == ZS_QUANT_ACT_F32) atomic_store(&g_mode, mode);
    return cur;
}

/* ---- the activation quantizers ---- */

int zs_q8a_kind(zs_dtype wdt) {
    switch (wdt) {
    case ZS_Q8_0: case ZS_Q4_0: case ZS_Q5_0: return ZS_Q8A_Q8_0;
    case ZS_Q4_1: case ZS_Q5_1: return ZS_Q8A_Q8_1;
    case ZS_Q4_K: case ZS_Q6_K: case ZS_Q5_K: case ZS_Q3_K: case ZS_Q2_K: return ZS_Q8A_Q8_K;
    default: return -1;
    }
}

/* round to nearest, ties to even, for |v| < 2^22 (ggml's nearest_int; _mm256_round_ps's
 * nearest mode gives the same for these values); v is one rounded product, never fused with
 * the addition (hence fp-contract off) */
__attribute__((optimize("fp-contract=off"))) static void q8_block32(const float *x, int8_t *q, float *dq, float *sq, int32_t *isum) {
    float amax = 0.0f;
    for (int i = 0; i < 32; i++) {
        float ax = __builtin_fabsf(x[i]);
        amax = ax > amax ? ax : amax;
    }
    float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
    int sum = 0;
    for (int i = 0; i < 32; i++) {
        float v = x[i] * id + 12582912.0f;
        int32_t b;
        memcpy(&b, &v, 4);
        int r = (b & 0x007fffff) - 0x00400000;
        q[i] = (int8_t)r;
        sum += r;
    }
    *dq = zs_f16_to_f32(zs_f32_to_f16(d));
    if (sq) *sq = zs_f16_to_f32(zs_f32_to_f16(d * (float)sum));
    if (isum) *isum = sum;
}

__attribute__((optimize("fp-contract=off"))) static void q8k_block(const float *x, int8_t *q, float *dq, int16_t *bs) {
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < 256; i++) {
        float ax = __builtin_fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax == 0.0f) {
        *dq = 0.0f;
        memset(q, 0, 256);
        memset(bs, 0, 16 * sizeof *bs);
        return;
    }
    float iscale = -127.0f / max;
    for (int i = 0; i < 256; i++) {
        float v = iscale * x[i] + 12582912.0f;
        int32_t b;
        memcpy(&b, &v, 4);
        int r = (b & 0x007fffff) - 0x00400000;
        q[i] = (int8_t)(r < 127 ? r : 127);
    }
    for (int j = 0; j < 16; j++) {
        int s = 0;
        for (int i = 0; i < 16; i++) s += q[16 * j + i];
        bs[j] = (int16_t)s;
    }
    *dq = 1.0f / iscale;
}

void zs_q8a_quantize_row(zs_q8a *a, int kind, int t, const float *x) {
    int8_t *q = a->q + (size_t)t * a->in;
    float *d = a->d + (size_t)t * a->nb;
    if (kind == ZS_Q8A_Q8_K) {
        int16_t *bs = a->bs + (size_t)t * (a->in / 16);
        for (int b = 0; b < a->nb; b++) q8k_block(x + 256 * b, q + 256 * b, d + b, bs + 16 * b);
        return;
    }
    float *s = kind == ZS_Q8A_Q8_1 ? a->s + (size_t)t * a->nb : NULL;
    int32_t *qs = a->qsum ? a->qsum + (size_t)t * a->nb : NULL;
    for (int b = 0; b < a->nb; b++) q8_block32(x + 32 * b, q + 32 * b, d + b, s ? s + b : NULL, qs ? qs + b : NULL);
}

/* ---- the generic kernels ---- */

/* 32 byte pairs: acc + lane l = sc[2l]·(w·x over bytes 4l, 4l+1) + sc[2l+1]·(bytes 4l+2, 4l+3),
 * the weights signed or unsigned bytes (what maddubs/madd compute: no sum here can saturate) */
static inline zs_ka_i32 zs_gka_dot(zs_ka_i32 acc, zs_ka_i8 w, zs_ka_i8 x, zs_ka_i16 sc, int sgn) {
    zs_ka_i32 r;
    for (int l = 0; l < 8; l++) {
        int p[2];
        for (int h = 0; h < 2; h++) {
            int i = 4 * l + 2 * h;
            int w0 = sgn ? w[i] : (uint8_t)w[i], w1 = sgn ? w[i + 1] : (uint8_t)w[i + 1];
            p[h] = w0 * x[i] + w1 * x[i + 1];
        }
        r[l] = acc[l] + sc[2 * l] * p[0] + sc[2 * l + 1] * p[1];
    }
    return r;
}
static inline zs_ka_i32 zs_gka_xsum(zs_ka_i8 x) {
    zs_ka_i32 r;
    for (int l = 0; l < 8; l++) r[l] = x[4 * l] + x[4 * l + 1] + x[4 * l + 2] + x[4 * l + 3];
    return r;
}
static inline zs_ka_i16 zs_gka_scv_k4(const uint8_t *p) {
    zs_ka_i16 r;
    for (int i = 0; i < 16; i++) r[i] = p[i & 7];
    return r;
}
static inline zs_ka_i16 zs_gka_scv_k6(const uint8_t *p) {
    zs_ka_i16 r;
    for (int i = 0; i < 8; i++) r[i] = (int8_t)p[2 * i], r[8 + i] = (int8_t)p[2 * i + 1];
    return r;
}
static inline zs_ka_i16 zs_gka_pick(zs_ka_i16 v, int g) {
    zs_ka_i16 r;
    for (int i = 0; i < 16; i++) r[i] = v[(i & 8) + g];
    return r;
}
static inline zs_ka_i16 zs_gka_mn2(const uint8_t *p) {
    zs_ka_i16 r;
    for (int i = 0; i < 16; i++) r[i] = p[i >> 1];
    return r;
}
static inline int zs_gka_msum(zs_ka_i16 v, const int16_t *bs) {
    int s = 0;
    for (int i = 0; i < 16; i++) s += v[i] * bs[i];
    return s;
}
static inline int zs_gka_isum(zs_ka_i32 v) {
    int s = 0;
    for (int l = 0; l < 8; l++) s += v[l];
    return s;
}
static inline zs_ka_i8 zs_gka_q8_0(const uint8_t *b) {
    zs_ka_i8 r;
    for (int i = 0; i < 32; i++) r[i] = (int8_t)b[2 + i];
    return r;
}
/* the 32 nibbles at q (weights 0..15 low, 16..31 high), plus the fifth bits of qh */
static inline zs_ka_i8 zs_gka_nib(const uint8_t *q, uint32_t qh) {
    zs_ka_i8 r;
    for (int i = 0; i < 32; i++) r[i] = (int8_t)((i < 16 ? q[i] & 15 : q[i - 16] >> 4) | (int)(qh >> i & 1) << 4);
    return r;
}
static inline uint32_t zs_gka_qh(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static inline zs_ka_i8 zs_gka_q4k(const uint8_t *b, int g) {
    const uint8_t *q = b + 16 + 32 * (g >> 1);
    zs_ka_i8 r;
    for (int i = 0; i < 32; i++) r[i] = (int8_t)(q[i] >> (4 * (g & 1)) & 15);
    return r;
}
static inline zs_ka_i8 zs_gka_q6k(const uint8_t *b, int g) {
    int hn = g >> 2, gg = g & 3;
    const uint8_t *ql = b + 64 * hn + 32 * (gg & 1), *qh = b + 128 + 32 * hn;
    zs_ka_i8 r;
    for (int i = 0; i < 32; i++)
        r[i] = (int8_t)((((ql[i] >> (4 * (gg >> 1))) & 15) | ((qh[i] >> (2 * gg)) & 3) << 4) - 32);
    return r;
}
/* Q5_K: Q4_K's nibbles at 48 with the fifth bits of qh (at 16: bit g of qh[i]) */
static inline zs_ka_i8 zs_gka_q5k(const uint8_t *b, int g) {
    const uint8_t *q = b + 48 + 32 * (g >> 1), *qh = b + 16;
    zs_ka_i8 r;
    for (int i = 0; i < 32; i++) r[i] = (int8_t)((q[i] >> (4 * (g & 1)) & 15) | ((qh[i] >> g) & 1) << 4);
    return r;
}
/* Q3_K: half g/4, quarter j = g%4: bits 2j of qs (at 32), bit 4·half + j of hmask (at 0), -4..3 */
static inline zs_ka_i8 zs_gka_q3k(const uint8_t *b, int g) {
    int hn = g >> 2, j = g & 3;
    const uint8_t *qs = b + 32 + 32 * hn;
    zs_ka_i8 r;
    for (int i = 0; i < 32; i++) r[i] = (int8_t)(((qs[i] >> (2 * j)) & 3) - (((b[i] >> (4 * hn + j)) & 1) ? 0 : 4));
    return r;
}
/* Q2_K: bits 2j of qs (at 16), 0..3 */
static inline zs_ka_i8 zs_gka_q2k(const uint8_t *b, int g) {
    const uint8_t *qs = b + 16 + 32 * (g >> 2);
    zs_ka_i8 r;
    for (int i = 0; i < 32; i++) r[i] = (int8_t)((qs[i] >> (2 * (g & 3))) & 3);
    return r;
}

#define KA_D(h) zs_f16_to_f32(h)
#define KA_DOT(acc, w, x, sc) zs_gka_dot((acc), (w), (x), (sc), KA_SIGNED)
#define KA_XSUM(x) zs_gka_xsum(x)
#define KA_SCV_K4(p) zs_gka_scv_k4(p)
#define KA_SCV_K6(p) zs_gka_scv_k6(p)
#define KA_PICK(v, g) zs_gka_pick((v), (g))
#define KA_MN2(p) zs_gka_mn2(p)
#define KA_MSUM(v, bs) zs_gka_msum((v), (bs))
#define KA_ISUM(v) zs_gka_isum(v)
#define KA_TR 1 /* the generic build: one row × one activation row (code size over speed: x86 runs the other builds) */
#define KA_TT 1
#define KA_DR 1
#define KA_PACK 0
#define KA_DEC 0
#define KA_NAME(x) zs_ka_generic_q8_0_##x
#define KA_FMT ZS_KA_Q8_0
#define KA_W(b, g) zs_gka_q8_0(b)
#include "matmul-q8act-kern.h"
#undef KA_NAME
#undef KA_FMT
#undef KA_W
#define KA_NAME(x) zs_ka_generic_q4_0_##x
#define KA_FMT ZS_KA_Q4_0
#define KA_W(b, g) zs_gka_nib((b) + 2, 0)
#include "matmul-q8act-kern.h"
#undef KA_NAME
#undef KA_FMT
#undef KA_W
#define KA_NAME(x) zs_ka_generic_q4_1_##x
#define KA_FMT ZS_KA_Q4_1
#define KA_W(b, g) zs_gka_nib((b) + 4, 0)
#include "matmul-q8act-kern.h"
#undef KA_NAME
#undef KA_FMT
#undef KA_W
#define KA_NAME(x) zs_ka_generic_q5_0_##x
#define KA_FMT ZS_KA_Q5_0
#define KA_W(b, g) zs_gka_nib((b) + 6, zs_gka_qh((b) + 2))
#include "matmul-q8act-kern.h"
#undef KA_NAME
#undef KA_FMT
#undef KA_W
#define KA_NAME(x) zs_ka_generic_q5_1_##x
#define KA_FMT ZS_KA_Q5_1
#define KA_W(b, g) zs_gka_nib((b) + 8, zs_gka_qh((b) + 4))
#include "matmul-q8act-kern.h"
#undef KA_NAME
#undef KA_FMT
#undef KA_W
#define KA_NAME(x) zs_ka_generic_q4_k_##x
#define KA_FMT ZS_KA_Q4_K
#define KA_W(b, g) zs_gka_q4k((b), (g))
#include "matmul-q8act-kern.h"
#undef KA_NAME
#undef KA_FMT
#undef KA_W
#define KA_NAME(x) zs_ka_generic_q6_k_##x
#define KA_FMT ZS_KA_Q6_K
#define KA_W(b, g) zs_gka_q6k((b), (g))
#include "matmul-q8act-kern.h"
#undef KA_NAME
#undef KA_FMT
#undef KA_W
#define KA_NAME(x) zs_ka_generic_q5_k_##x
#define KA_FMT ZS_KA_Q5_K
#define KA_W(b, g) zs_gka_q5k((b), (g))
#include "matmul-q8act-kern.h"
#undef KA_NAME
#undef KA_FMT
#undef KA_W
#define KA_NAME(x) zs_ka_generic_q3_k_##x
#define KA_FMT ZS_KA_Q3_K
#define KA_W(b, g) zs_gka_q3k((b), (g))
#include "matmul-q8act-kern.h"
#undef KA_NAME
#undef KA_FMT
#undef KA_W
#define KA_NAME(x) zs_ka_generic_q2_k_##x
#define KA_FMT ZS_KA_Q2_K
#define KA_W(b, g) zs_gka_q2k((b), (g))
#include "matmul-q8act-kern.h"
#undef KA_NAME
#undef KA_FMT
#undef KA_W
#undef KA_D
#undef KA_DOT
#undef KA_XSUM
#undef KA_SCV_K4
#undef KA_SCV_K6
#undef KA_PICK
#undef KA_MN2
#undef KA_MSUM
#undef KA_ISUM
#undef KA_TR
#undef KA_TT
#undef KA_DR
#undef KA_PACK
#undef KA_DEC

#define ZS_KA_WRAP(f)                                                                                 \
    void zs_q8a_block_##f##_generic(float *y, int ldy, const zs_q8a *a, int t0, int T, const uint8_t *W, int R) { \
        zs_ka_generic_##f##_block(y, ldy, a, t0, T, W, R);                                             \
    }
ZS_KA_FORMATS(ZS_KA_WRAP)
#undef ZS_KA_WRAP

int zs_matmul_q8act_supports(zs_dtype wdt) { return zs_q8a_kind(wdt) >= 0; }

/* the builds this CPU runs: 2 with AVX-512VL/BW + VNNI, 1 with AVX2+FMA+F16C, else 0 */
static int q8a_level(void) {
    __builtin_cpu_init();
    if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))) return 0;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vnni"))
        return 2;
    return 1;
}

#define ZS_KA_PICK3(f) (lv == 2 ? zs_q8a_block_##f##_avx512 : lv == 1 ? zs_q8a_block_##f##_avx2 : zs_q8a_block_##f##_generic)
zs_q8a_fn zs_q8a_pick(zs_dtype wdt) {
    int lv = q8a_level();
    switch (wdt) {
    case ZS_Q8_0: return ZS_KA_PICK3(q8_0);
    case ZS_Q4_0: return ZS_KA_PICK3(q4_0);
    case ZS_Q4_1: return ZS_KA_PICK3(q4_1);
    case ZS_Q5_0: return ZS_KA_PICK3(q5_0);
    case ZS_Q5_1: return ZS_KA_PICK3(q5_1);
    case ZS_Q4_K: return ZS_KA_PICK3(q4_k);
    case ZS_Q6_K: return ZS_KA_PICK3(q6_k);
    case ZS_Q5_K: return ZS_KA_PICK3(q5_k);
    case ZS_Q3_K: return ZS_KA_PICK3(q3_k);
    case ZS_Q2_K: return ZS_KA_PICK3(q2_k);
    default: return NULL;
    }
}
#undef ZS_KA_PICK3

/* ---- the driver ---- */

typedef struct {
    float *y;
    const float *x;
    zs_q8a a;
    int kind, T, out, rows_per_task, tok_tile, rows_per_qtask;
    const uint8_t *W;
    size_t row_bytes;
    zs_q8a_fn fn;
} q8a_job;

static void q8a_quant_task(void *arg, int task) {
    q8a_job *j = arg;
    int t0 = task * j->rows_per_qtask, tn = ZS_MIN(j->rows_per_qtask, j->T - t0);
    for (int t = t0; t < t0 + tn; t++) zs_q8a_quantize_row(&j->a, j->kind, t, j->x + (size_t)t * j->a.in);
}

static void q8a_task(void *arg, int task) {
    q8a_job *j = arg;
    int r0 = task * j->rows_per_task, R = ZS_MIN(j->rows_per_task, j->out - r0);
    for (int t0 = 0; t0 < j->T; t0 += j->tok_tile) {
        int tn = ZS_MIN(j->tok_tile, j->T - t0);
        j->fn(j->y + (size_t)t0 * j->out + r0, j->out, &j->a, t0, tn, j->W + (size_t)r0 * j->row_bytes, R);
    }
}

int zs_matmul_q8act(float *y, const float *x, int T, int in, const void *W, zs_dtype wdt, int out) {
    int kind = zs_q8a_kind(wdt), blk = zs_dtype_block(wdt);
    zs_q8a_fn fn = zs_q8a_pick(wdt);
    if (kind < 0 || !fn || blk <= 0 || in <= 0 || in % blk || T < 0 || out < 0) return ZS_EINVAL;
    if (T == 0 || out == 0) return 0;
    int nb = in / blk;
    /* q (T·in, 64-aligned), d (T·nb), s (T·nb, Q8_1), bs (T·in/16, Q8_K), qsum (T·nb, not Q8_K:
     * the packed kernels' offsets, summed once here rather than by every task) */
    size_t nq = ((size_t)T * in + 63) & ~(size_t)63, nd = (size_t)T * nb;
    size_t bytes = nq + nd * 4 + (kind == ZS_Q8A_Q8_1 ? nd * 4 : 0) +
                   (kind == ZS_Q8A_Q8_K ? (size_t)T * (in / 16) * 2 : nd * 4);
    uint8_t *buf = zs_scratch_get(ZS_SCRATCH_Q8A, bytes);
    if (!buf) return ZS_ENOMEM;
    q8a_job j = {0};
    j.y = y;
    j.x = x;
    j.kind = kind;
    j.T = T;
    j.out = out;
    j.W = W;
    j.fn = fn;
    j.row_bytes = zs_dtype_bytes(wdt, (size_t)in);
    j.a.in = in;
    j.a.nb = nb;
    j.a.q = (int8_t *)buf;
    j.a.d = (float *)(buf + nq);
    uint8_t *p = buf + nq + nd * 4;
    if (kind == ZS_Q8A_Q8_1) {
        j.a.s = (float *)p;
        p += nd * 4;
    }
    if (kind == ZS_Q8A_Q8_K) j.a.bs = (int16_t *)p;
    else j.a.qsum = (int32_t *)p;
    int threads = zs_pool_threads();
    /* the activations, once (rows in parallel when there are enough of them) */
    int big = (size_t)out * (size_t)in * (size_t)T >= ((size_t)1 << 20);
    if (big && T >= 2 * threads && (size_t)T * in >= 65536) {
        j.rows_per_qtask = ZS_MAX(1, T / (4 * threads));
        zs_pool_run(q8a_quant_task, &j, (T + j.rows_per_qtask - 1) / j.rows_per_qtask);
    } else {
        j.rows_per_qtask = T;
        q8a_quant_task(&j, 0);
    }
    /* weight blocks of ~64 KiB as stored, a multiple of 4 rows, enough of them for the threads
     * (the blocking never changes an element's arithmetic, only where and when it is done) */
    int rows = (int)((64 * 1024) / ZS_MAX(j.row_bytes, (size_t)1));
    rows = ZS_MAX(4, rows & ~3);
    while (rows > 4 && (out + rows - 1) / rows < 4 * threads) rows = ZS_MAX(4, (rows / 2) & ~3);
    /* the packed kernels (T >= 4) take rows in panels of 8, two at a time */
    if (T >= 4) rows = ZS_MAX(16, rows & ~15);
    j.rows_per_task = rows;
    /* activation rows in tiles of ~16 KiB of int8, a multiple of 4 (the kernel's tile) */
    j.tok_tile = ZS_MAX(4, (int)((16 * 1024) / (size_t)in) & ~3);
    /* a packed panel is repacked for every tile of tokens: tiles of ~256 KiB of activations (at
     * least 32 rows) keep that cost small */
    if (T >= 4) j.tok_tile = ZS_MAX(32, (int)((256 * 1024) / (size_t)in) & ~3);
    int tasks = (out + rows - 1) / rows;
    if (!big)
        for (int t = 0; t < tasks; t++) q8a_task(&j, t);
    else
        zs_pool_run(q8a_task, &j, tasks);
    return 0;
}
