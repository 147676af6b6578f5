/* test-cuda-dequant.c — the device dequantization of kernels/cuda/dequant.h, checked on the host
 * in every build (a GPU or not, CUDA or not): the header is plain C, shared by matmul-quant.cu and
 * embed.cu, and compiled here by gcc. For every block format (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K,
 * Q6_K, Q5_K, Q3_K, Q2_K), over random blocks (every nibble, fifth bit and scale pattern; f16 scales of both
 * signs, subnormal and zero ones too):
 *   - the row size the kernels step by is zs_dtype_bytes of the row;
 *   - every weight zs_dq_at gives (the embedding lookup), and every weight of an emulation of
 *     the prefill dequantization kernel (its thread units of 8 weights and where they go), is
 *     zs_to_f32's, bit for bit;
 *   - an emulation of the decode kernel (qgemv_kernel): its grid of ZS_DQ_GEMV_THREADS-thread
 *     blocks, each thread's row and lane, the lane's fma chain over the weights of zs_dq_group
 *     and zs_dq_weight, and the three xor shuffles, as the kernel does them, gives zs_op_matmul's
 *     bits for T = 1, 2, 5, 8, every output written and no column past R (row counts not a
 *     multiple of 16 included).
 * What this cannot check is CUDA itself (its f16 conversion and _rn intrinsics, which are exact,
 * and the launch); tests/test-backend-ops.c compares the kernels on a device with the CPU. */
#include <math.h>

#include "common.h"
#include "kernels/cuda/dequant.h"
#include "ops.h"
#include "matmul-q8act.h"
#include "tensor.h"
#include "testutil.h"

static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint32_t urand(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}
static float frand(void) { return (float)(urand() >> 8) / 8388608.0f - 1.0f; } /* [-1, 1) */

static const zs_dtype QF[] = {ZS_Q8_0, ZS_Q4_0, ZS_Q4_1, ZS_Q5_0, ZS_Q5_1, ZS_Q4_K, ZS_Q6_K, ZS_Q5_K, ZS_Q3_K, ZS_Q2_K};
#define NQF (int)(sizeof QF / sizeof QF[0])

/* an f16 scale: mostly small normal values of either sign, sometimes subnormal or zero */
static uint16_t rand_scale(float mag) {
    uint32_t r = urand() % 16;
    if (r == 0) return 0;
    if (r == 1) return (uint16_t)(urand() % 1024 | (urand() & 1) << 15); /* subnormal */
    return zs_f32_to_f16(frand() * mag);
}

/* n weights of dt as random bytes with sane f16 fields */
static uint8_t *rand_blocks(zs_dtype dt, size_t n) {
    size_t bytes = zs_dtype_bytes(dt, n), bb = zs_dtype_size(dt);
    uint8_t *W = malloc(bytes + 1);
    for (size_t i = 0; i < bytes; i++) W[i] = (uint8_t)urand();
    for (size_t b = 0; b < bytes / bb; b++) {
        uint8_t *p = W + b * bb;
        uint16_t d = rand_scale(zs_dtype_block(dt) == 256 ? 0.002f : 0.02f), m = rand_scale(0.05f);
        int d_at = dt == ZS_Q6_K ? 208 : dt == ZS_Q3_K ? 108 : dt == ZS_Q2_K ? 80 : 0;
        int m_at = dt == ZS_Q2_K ? 82 : dt == ZS_Q4_1 || dt == ZS_Q5_1 || dt == ZS_Q4_K || dt == ZS_Q5_K ? 2 : -1;
        memcpy(p + d_at, &d, 2);
        if (m_at >= 0) memcpy(p + m_at, &m, 2);
    }
    return W;
}

/* the decode kernel (matmul-quant.cu, qgemv_kernel) walked on the host: grid, threads, lanes,
 * fma chains and shuffles; y[t*ldy + j] for j < R */
static void emulate_qgemv(float *y, int ldy, const float *x, int T, int in, const uint8_t *W, zs_dtype dt, int R) {
    int rows_per_block = ZS_DQ_GEMV_THREADS / 8;
    int grid = (R + rows_per_block - 1) / rows_per_block;
    for (int blk = 0; blk < grid; blk++)
        for (int warp = 0; warp < ZS_DQ_GEMV_THREADS / 32; warp++) {
            float acc[32][8];
            for (int lane32 = 0; lane32 < 32; lane32++) {
                int tid = warp * 32 + lane32, row = blk * rows_per_block + (tid >> 3), l = tid & 7;
                for (int t = 0; t < 8; t++) acc[lane32][t] = 0.0f;
                if (row >= R) continue;
                const uint8_t *wr = W + (size_t)row * zs_dq_row_bytes(dt, in);
                for (int kb = 0; kb < in >> 5; kb++) {
                    zs_dq_group_t G = zs_dq_group(dt, wr, kb);
                    float w[4];
                    for (int s = 0; s < 4; s++) w[s] = zs_dq_weight(dt, &G, 8 * s + l);
                    const float *xk = x + (size_t)kb * 32 + l;
                    for (int t = 0; t < T; t++)
                        for (int s = 0; s < 4; s++)
                            acc[lane32][t] = fmaf(w[s], xk[(size_t)t * in + 8 * s], acc[lane32][t]);
                }
            }
            for (int t = 0; t < T; t++) {
                float v[32], o[32];
                for (int i = 0; i < 32; i++) v[i] = acc[i][t];
                for (int dist = 1; dist <= 4; dist <<= 1) { /* __shfl_xor_sync(.., v, dist), then v + it */
                    for (int i = 0; i < 32; i++) o[i] = v[i ^ dist];
                    for (int i = 0; i < 32; i++) v[i] = v[i] + o[i];
                }
                for (int i = 0; i < 32; i++) {
                    int tid = warp * 32 + i, row = blk * rows_per_block + (tid >> 3);
                    if ((tid & 7) == 0 && row < R) y[(size_t)t * ldy + row] = v[i];
                }
            }
        }
}

static void check_format(zs_dtype dt, int in, int R) {
    const char *dn = zs_dtype_name(dt);
    size_t n = (size_t)R * in;
    uint8_t *W = rand_blocks(dt, n);
    CHECK(zs_dq_row_bytes(dt, in) == zs_dtype_bytes(dt, (size_t)in), "%s: row of %d: %zu bytes, zs_dtype_bytes %zu", dn,
          in, zs_dq_row_bytes(dt, in), zs_dtype_bytes(dt, (size_t)in));
    CHECK(zs_dq_block_bytes(dt) == (int)zs_dtype_size(dt) && 32 * zs_dq_groups(dt) == zs_dtype_block(dt),
          "%s: block of %d bytes, %d weights", dn, zs_dq_block_bytes(dt), 32 * zs_dq_groups(dt));
    /* every weight, as the embedding kernel reads it (zs_dq_at: row r, weight k) */
    float *ref = malloc(n * 4), *dq = malloc(n * 4);
    zs_to_f32(ref, W, dt, n);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++) {
        size_t r = i / (size_t)in;
        int k = (int)(i - r * (size_t)in);
        float v = zs_dq_at(dt, W + r * zs_dq_row_bytes(dt, in), k);
        if (memcmp(&v, &ref[i], 4) && !bad++) first = i;
    }
    CHECK(bad == 0, "%s %d x %d: %zu weights (zs_dq_at) differ from zs_to_f32 (first: %zu, %.9g vs %.9g)", dn, R, in,
          bad, first, bad ? (double)zs_dq_at(dt, W + first / in * zs_dq_row_bytes(dt, in), (int)(first % in)) : 0.0,
          bad ? (double)ref[first] : 0.0);
    /* and as the dequantization kernel (matmul-quant.cu, dequant_kernel) makes them: unit u is
     * weights 8s .. 8s+7 of group c / 4 of row u / (in/8), c = u % (in/8), s = c % 4, at 8u */
    for (size_t i = 0; i < n; i++) dq[i] = NAN;
    size_t per_row = (size_t)(in >> 3), units = (size_t)R * per_row;
    for (size_t u = 0; u < units; u++) {
        size_t r = u / per_row;
        int c = (int)(u - r * per_row), s = c & 3;
        zs_dq_group_t G = zs_dq_group(dt, W + r * zs_dq_row_bytes(dt, in), c >> 2);
        for (int l = 0; l < 8; l++) dq[u * 8 + l] = zs_dq_weight(dt, &G, 8 * s + l);
    }
    CHECK(memcmp(dq, ref, n * 4) == 0, "%s %d x %d: the dequantization kernel's weights differ from zs_to_f32", dn, R,
          in);
    free(dq);
    /* the decode kernel against the CPU product */
    int Ts[] = {1, 2, 5, 8};
    for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
        int T = Ts[ti], ldy = R + 3;
        float *x = malloc((size_t)T * in * 4), *y = malloc((size_t)T * ldy * 4), *yc = malloc((size_t)T * R * 4);
        for (size_t i = 0; i < (size_t)T * in; i++) x[i] = frand() * (i % 61 == 0 ? 8.0f : 1.0f);
        for (size_t i = 0; i < (size_t)T * ldy; i++) y[i] = NAN; /* unwritten outputs stay NaN */
        emulate_qgemv(y, ldy, x, T, in, W, dt, R);
        zs_op_matmul(yc, x, T, in, W, dt, R, NULL);
        size_t diff = 0, pad = 0;
        for (int t = 0; t < T; t++) {
            for (int j = 0; j < R; j++) diff += memcmp(&y[(size_t)t * ldy + j], &yc[(size_t)t * R + j], 4) != 0;
            for (int j = R; j < ldy; j++) pad += !isnan(y[(size_t)t * ldy + j]);
        }
        CHECK(diff == 0, "%s %d x %d, T=%d: %zu of %d outputs differ from zs_op_matmul", dn, R, in, T, diff, T * R);
        CHECK(pad == 0, "%s %d x %d, T=%d: %zu writes past row %d", dn, R, in, T, pad, R);
        free(x); free(y); free(yc);
    }
    free(W); free(ref);
}

int main(void) {
    /* the CUDA kernels reproduce the CPU's exact f32-activation path (matmul-q8act.h), not its
     * default 8-bit-activation one */
    zs_op_matmul_quant_act(ZS_QUANT_ACT_F32);
    for (int q = 0; q < NQF; q++) {
        int k = zs_dtype_block(QF[q]) == ZS_QK_K;
        check_format(QF[q], k ? 256 : 32, 5);    /* one block per row, fewer rows than a kernel block */
        check_format(QF[q], k ? 768 : 224, 37);  /* an odd number of blocks, rows past one kernel block */
        check_format(QF[q], k ? 2048 : 1024, 16); /* exactly one kernel block of rows */
    }
    return tu_finish("test-cuda-dequant");
}
