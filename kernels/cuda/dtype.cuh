// dtype.cuh — shared device helpers of the kernels: loads and stores of f32/f16/bf16 values
// (dtype codes as zs_dtype: 0 f32, 1 f16, 2 bf16), block reductions, launch checks (the error
// is read once and kept for zs_cuda_take_error: launch.cu), and the two spellings that differ
// between nvcc and the emulated device of the tests (tests/gpu/emu/cuda-emu.h, ZS_EMU): every
// launch goes through ZS_LAUNCH, and dynamic shared memory is declared with ZS_EXTERN_SHARED.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#ifdef ZS_EMU
#define ZS_LAUNCH(k, grid, block, smem, stream, ...) zs_emu_launch(#k, k, grid, block, smem, stream, __VA_ARGS__)
#define ZS_EXTERN_SHARED(T, name) T *name = (T *)zs_emu_dyn_smem()
#else
#define ZS_LAUNCH(k, grid, block, smem, stream, ...) k<<<grid, block, smem, stream>>>(__VA_ARGS__)
#define ZS_EXTERN_SHARED(T, name) extern __shared__ T name[]
#endif

enum { ZS_DT_F32 = 0, ZS_DT_F16 = 1, ZS_DT_BF16 = 2 };

static __device__ __forceinline__ float zs_ld(const void *p, int dt, size_t i) {
    if (dt == ZS_DT_F32) return ((const float *)p)[i];
    if (dt == ZS_DT_F16) return __half2float(((const __half *)p)[i]);
    return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
}

static __device__ __forceinline__ void zs_st(void *p, int dt, size_t i, float v) {
    if (dt == ZS_DT_F32) ((float *)p)[i] = v;
    else if (dt == ZS_DT_F16) ((__half *)p)[i] = __float2half_rn(v);
    else ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
}

static __device__ __forceinline__ float zs_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ __forceinline__ float zs_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
// sh holds 33 floats.
static __device__ __forceinline__ float zs_block_sum(float v, float *sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = zs_warp_sum(v);
    __syncthreads(); // sh may still be read by an earlier reduction
    if (lane == 0) sh[w] = v;
    __syncthreads();
    if (w == 0) {
        float s = lane < nw ? sh[lane] : 0.0f;
        s = zs_warp_sum(s);
        if (lane == 0) sh[32] = s;
    }
    __syncthreads();
    return sh[32];
}

static __device__ __forceinline__ float zs_block_max(float v, float *sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = zs_warp_max(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    if (w == 0) {
        float s = lane < nw ? sh[lane] : -INFINITY;
        s = zs_warp_max(s);
        if (lane == 0) sh[32] = s;
    }
    __syncthreads();
    return sh[32];
}

// launch.cu: records e as this thread's launcher status (0 for cudaSuccess, else -1 and the
// error's text for zs_cuda_take_error); zs_cuda_refuse records a refused argument, returns -1.
extern "C" int zs_cuda_launch_status(cudaError_t e);
extern "C" int zs_cuda_refuse(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

// After a launch: 0, or -1 with the launch's error kept (cudaGetLastError clears CUDA's copy).
static inline int zs_launch_ok(void) { return zs_cuda_launch_status(cudaGetLastError()); }

static inline unsigned zs_grid(size_t n, unsigned threads) {
    size_t b = (n + threads - 1) / threads;
    if (b > 65535u * 32u) b = 65535u * 32u;
    return b ? (unsigned)b : 1u;
}
