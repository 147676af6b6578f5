// matmul-quant.cu — matrix products over ggml block weights (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
// Q4_K, Q6_K, Q5_K, Q3_K, Q2_K, read as stored): the fused dequantize-and-dot kernel of decode, and the
// dequantization of rows into f32/f16/bf16 that prefill hands to cuBLAS (kernels.h).
//
// The decode kernel keeps the CPU kernel's order (kernels/cpu/matmul-quant-kern.h), so its
// results are the bits of zs_op_matmul: each row is computed by 8 lanes of a warp; lane l
// dequantizes weights k = l, l+8, l+16, ... of the row (dequant.h, the CPU's arithmetic) and
// accumulates fma(w[k], x[t][k], a) over them in increasing k, one accumulator per token; the 8
// lanes are then summed by shuffles over lane distance 1, 2, 4, which is the CPU's
// ((a0+a1)+(a2+a3))+((a4+a5)+(a6+a7)) (addition commutes exactly). Nothing depends on T or on
// the other rows, so a row's result is the same whatever the batch. Each weight is read once for
// all T tokens.
#include "dequant.h"
#include "dtype.cuh"
#include "kernels.h"

#define QV_THREADS ZS_DQ_GEMV_THREADS // 16 rows of 8 lanes per block (4 full warps: the shuffles need all 32 lanes)
#define QV_ROWS (QV_THREADS / 8)

template <int DT>
__global__ static void __launch_bounds__(QV_THREADS)
    qgemv_kernel(float *__restrict__ y, int ldy, const float *__restrict__ x, int T, int in,
                 const uint8_t *__restrict__ W, int R, float beta) {
    int row = blockIdx.x * QV_ROWS + (threadIdx.x >> 3), l = threadIdx.x & 7;
    float acc[ZS_CUDA_QGEMV_MAX_T];
#pragma unroll
    for (int t = 0; t < ZS_CUDA_QGEMV_MAX_T; t++) acc[t] = 0.0f;
    if (row < R) { // no return before the shuffles: every lane of the warp takes part in them
        const uint8_t *wr = W + (size_t)row * zs_dq_row_bytes(DT, in);
        const int nb = in >> 5;
#pragma unroll 2
        for (int kb = 0; kb < nb; kb++) {
            zs_dq_group_t G = zs_dq_group(DT, wr, kb); // the group's scales, once
            float w[4];
#pragma unroll
            for (int s = 0; s < 4; s++) w[s] = zs_dq_weight(DT, &G, 8 * s + l);
            const float *xk = x + (size_t)kb * 32 + l;
#pragma unroll
            for (int t = 0; t < ZS_CUDA_QGEMV_MAX_T; t++)
                if (t < T) {
                    const float *xt = xk + (size_t)t * in;
#pragma unroll
                    for (int s = 0; s < 4; s++) acc[t] = __fmaf_rn(w[s], __ldg(xt + 8 * s), acc[t]);
                }
        }
    }
#pragma unroll
    for (int t = 0; t < ZS_CUDA_QGEMV_MAX_T; t++)
        if (t < T) { // T is the same for every thread: the shuffles stay convergent
            float v = acc[t];
            v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, 1));
            v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, 2));
            v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, 4));
            if (l == 0 && row < R) {
                float *yp = y + (size_t)t * ldy + row;
                *yp = beta == 0.0f ? v : __fadd_rn(v, __fmul_rn(beta, *yp));
            }
        }
}

// out [R, in] (row-major, dtype odt) = the weights. Thread unit u (units = R * in/8) makes
// weights 8s .. 8s+7 of group kb of row r, where r = u / (in/8), c = u % (in/8), kb = c / 4,
// s = c % 4: the 8 outputs out[8u .. 8u+7] (8u = r*in + 32kb + 8s), the group's scales read once;
// bf16 into 16-byte-aligned out goes as one 16-byte store.
template <int DT>
__global__ static void dequant_kernel(void *out, int odt, const uint8_t *__restrict__ W, int in, size_t units) {
    size_t rb = zs_dq_row_bytes(DT, in), stride = (size_t)gridDim.x * blockDim.x;
    size_t per_row = (size_t)(in >> 3);
    bool vec = odt == ZS_DT_BF16 && ((uintptr_t)out & 15) == 0;
    for (size_t u = (size_t)blockIdx.x * blockDim.x + threadIdx.x; u < units; u += stride) {
        size_t r = u / per_row;
        int c = (int)(u - r * per_row), s = c & 3;
        zs_dq_group_t G = zs_dq_group(DT, W + r * rb, c >> 2);
        float v[8];
#pragma unroll
        for (int l = 0; l < 8; l++) v[l] = zs_dq_weight(DT, &G, 8 * s + l);
        if (vec) {
            unsigned p[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                __nv_bfloat162 h = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]); // .x the lower address
                memcpy(&p[i], &h, sizeof p[i]);
            }
            reinterpret_cast<uint4 *>(out)[u] = make_uint4(p[0], p[1], p[2], p[3]);
        } else {
#pragma unroll
            for (int l = 0; l < 8; l++) zs_st(out, odt, u * 8 + l, v[l]);
        }
    }
}

// the dtype and row length checks every launcher makes; 0 or -1 with the reason kept
static int check_rows(const char *who, int wdt, int in) {
    if (zs_dq_block_bytes(wdt) == 0) return zs_cuda_refuse("%s: dtype %d is not a block format", who, wdt);
    int blk = 32 * zs_dq_groups(wdt);
    if (in <= 0 || in % blk)
        return zs_cuda_refuse("%s: rows of %d weights are not whole blocks of %d", who, in, blk);
    return 0;
}

#define QDISPATCH(wdt, KERNEL, GRID, BLOCK, STREAM, ...)                                              \
    switch (wdt) {                                                                                  \
    case ZS_Q8_0: ZS_LAUNCH(KERNEL<ZS_Q8_0>, GRID, BLOCK, 0, STREAM, __VA_ARGS__); break;          \
    case ZS_Q4_0: ZS_LAUNCH(KERNEL<ZS_Q4_0>, GRID, BLOCK, 0, STREAM, __VA_ARGS__); break;          \
    case ZS_Q4_1: ZS_LAUNCH(KERNEL<ZS_Q4_1>, GRID, BLOCK, 0, STREAM, __VA_ARGS__); break;          \
    case ZS_Q5_0: ZS_LAUNCH(KERNEL<ZS_Q5_0>, GRID, BLOCK, 0, STREAM, __VA_ARGS__); break;          \
    case ZS_Q5_1: ZS_LAUNCH(KERNEL<ZS_Q5_1>, GRID, BLOCK, 0, STREAM, __VA_ARGS__); break;          \
    case ZS_Q4_K: ZS_LAUNCH(KERNEL<ZS_Q4_K>, GRID, BLOCK, 0, STREAM, __VA_ARGS__); break;          \
    case ZS_Q5_K: ZS_LAUNCH(KERNEL<ZS_Q5_K>, GRID, BLOCK, 0, STREAM, __VA_ARGS__); break;          \
    case ZS_Q3_K: ZS_LAUNCH(KERNEL<ZS_Q3_K>, GRID, BLOCK, 0, STREAM, __VA_ARGS__); break;          \
    case ZS_Q2_K: ZS_LAUNCH(KERNEL<ZS_Q2_K>, GRID, BLOCK, 0, STREAM, __VA_ARGS__); break;          \
    default: ZS_LAUNCH(KERNEL<ZS_Q6_K>, GRID, BLOCK, 0, STREAM, __VA_ARGS__); break;               \
    }

extern "C" int zs_cuda_qgemv(float *y, int ldy, const float *x, int T, int in, const void *W, int wdt, int R,
                             float beta, void *stream) {
    if (check_rows("quantized matrix-vector product", wdt, in) < 0) return -1;
    if (T < 1 || T > ZS_CUDA_QGEMV_MAX_T)
        return zs_cuda_refuse("quantized matrix-vector product: %d tokens (1 to %d)", T, ZS_CUDA_QGEMV_MAX_T);
    if (R < 0 || ldy < R) return zs_cuda_refuse("quantized matrix-vector product: %d rows, row stride %d", R, ldy);
    if (R == 0) return 0;
    unsigned grid = (unsigned)((R + QV_ROWS - 1) / QV_ROWS);
    cudaStream_t s = (cudaStream_t)stream;
    QDISPATCH(wdt, qgemv_kernel, grid, QV_THREADS, s, y, ldy, x, T, in, (const uint8_t *)W, R, beta);
    return zs_launch_ok();
}

extern "C" int zs_cuda_dequant(void *out, int odt, const void *W, int wdt, int R, int in, void *stream) {
    if (check_rows("dequantize", wdt, in) < 0) return -1;
    if (odt != ZS_DT_F32 && odt != ZS_DT_F16 && odt != ZS_DT_BF16)
        return zs_cuda_refuse("dequantize: output dtype %d is not f32, f16 or bf16", odt);
    if (R < 0) return zs_cuda_refuse("dequantize: %d rows", R);
    size_t units = (size_t)R * (size_t)(in / 8);
    if (units == 0) return 0;
    cudaStream_t s = (cudaStream_t)stream;
    QDISPATCH(wdt, dequant_kernel, zs_grid(units, 256), 256, s, out, odt, (const uint8_t *)W, in, units);
    return zs_launch_ok();
}
