// cuda-emu.h — what kernels/cuda/*.cu need to compile with the host C++ compiler and run on the
// emulated device (tests only: the emulator never ships in the binary). The Makefile force-includes
// it (-include) before every .cu of the emulated build, with ZS_EMU defined.
//
// A block's threads run as cooperative fibers (emu-block.cc): a thread runs until it reaches a
// barrier, a warp operation or its end, so __syncthreads is a real barrier and the lanes of a warp
// exchange values only at shuffles and votes, with CUDA's rules (32 lanes, the caller in the mask,
// every lane of the mask at the same operation). __shared__ variables are per worker thread
// statics: the blocks of one stream run one after another, so they are per block as on a GPU.
// __half and __nv_bfloat16 come from the toolkit's host-side headers.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __shared__
#undef __launch_bounds__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static thread_local
#define __launch_bounds__(...)

// ---- the calling thread's coordinates (set by the block scheduler before it resumes a fiber) ----
struct zs_emu_thread {
    uint3 tid, bid;
    dim3 bdim, gdim;
};
extern thread_local const zs_emu_thread *zs_emu_cur;
#define threadIdx (zs_emu_cur->tid)
#define blockIdx (zs_emu_cur->bid)
#define blockDim (zs_emu_cur->bdim)
#define gridDim (zs_emu_cur->gdim)

// ---- barriers and warp operations (emu-block.cc) ----
enum { ZS_EMU_SHFL_IDX, ZS_EMU_SHFL_XOR, ZS_EMU_SHFL_DOWN, ZS_EMU_SHFL_UP, ZS_EMU_BALLOT, ZS_EMU_SYNCWARP };
enum { ZS_EMU_BAR_PLAIN, ZS_EMU_BAR_OR, ZS_EMU_BAR_AND, ZS_EMU_BAR_COUNT };
// the block barrier; returns the combined predicate for the _or/_and/_count forms
int zs_emu_barrier(int kind, int pred);
// one warp operation of the calling lane: value v (its bits), the lanes in mask, the mode's
// argument (source lane, xor mask or delta) within segments of `width` lanes; returns the bits
// of the value the lane receives (the ballot for ZS_EMU_BALLOT)
uint64_t zs_emu_warp(int mode, unsigned mask, uint64_t v, int arg, int width);
// the block's dynamic shared memory (the launch's size, a separate allocation)
void *zs_emu_dyn_smem(void);

inline void __syncthreads(void) { zs_emu_barrier(ZS_EMU_BAR_PLAIN, 0); }
inline int __syncthreads_or(int p) { return zs_emu_barrier(ZS_EMU_BAR_OR, p != 0); }
inline int __syncthreads_and(int p) { return zs_emu_barrier(ZS_EMU_BAR_AND, p != 0); }
inline int __syncthreads_count(int p) { return zs_emu_barrier(ZS_EMU_BAR_COUNT, p != 0); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { zs_emu_warp(ZS_EMU_SYNCWARP, mask, 0, 0, 32); }
inline unsigned __ballot_sync(unsigned mask, int p) { return (unsigned)zs_emu_warp(ZS_EMU_BALLOT, mask, p != 0, 0, 32); }
inline int __any_sync(unsigned mask, int p) { return (__ballot_sync(mask, p) & mask) != 0; }
inline int __all_sync(unsigned mask, int p) { return (__ballot_sync(mask, p) & mask) == mask; }

template <typename T> inline T zs_emu_shfl(int mode, unsigned mask, T v, int arg, int width) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle of a value over 8 bytes");
    uint64_t b = 0;
    memcpy(&b, &v, sizeof v);
    b = zs_emu_warp(mode, mask, b, arg, width);
    T r;
    memcpy(&r, &b, sizeof r);
    return r;
}
template <typename T> inline T __shfl_sync(unsigned m, T v, int src, int w = 32) { return zs_emu_shfl(ZS_EMU_SHFL_IDX, m, v, src, w); }
template <typename T> inline T __shfl_xor_sync(unsigned m, T v, int x, int w = 32) { return zs_emu_shfl(ZS_EMU_SHFL_XOR, m, v, x, w); }
template <typename T> inline T __shfl_down_sync(unsigned m, T v, unsigned d, int w = 32) { return zs_emu_shfl(ZS_EMU_SHFL_DOWN, m, v, (int)d, w); }
template <typename T> inline T __shfl_up_sync(unsigned m, T v, unsigned d, int w = 32) { return zs_emu_shfl(ZS_EMU_SHFL_UP, m, v, (int)d, w); }

// ---- atomics: real ones, since two streams' kernels may run at once ----
template <typename T, typename F> inline T zs_emu_atomic_rmw(T *p, F f) {
    T old, nv;
    __atomic_load(p, &old, __ATOMIC_RELAXED);
    do nv = f(old); while (!__atomic_compare_exchange(p, &old, &nv, false, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED));
    return old;
}
template <typename T> inline T zs_emu_atomic_add(T *p, T v) { return zs_emu_atomic_rmw(p, [v](T o) { return o + v; }); }
template <typename T> inline T zs_emu_atomic_max(T *p, T v) { return zs_emu_atomic_rmw(p, [v](T o) { return o > v ? o : v; }); }
template <typename T> inline T zs_emu_atomic_min(T *p, T v) { return zs_emu_atomic_rmw(p, [v](T o) { return o < v ? o : v; }); }
inline float atomicAdd(float *p, float v) { return zs_emu_atomic_add(p, v); }
inline double atomicAdd(double *p, double v) { return zs_emu_atomic_add(p, v); }
inline int atomicAdd(int *p, int v) { return zs_emu_atomic_add(p, v); }
inline unsigned atomicAdd(unsigned *p, unsigned v) { return zs_emu_atomic_add(p, v); }
inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v) { return zs_emu_atomic_add(p, v); }
inline int atomicMax(int *p, int v) { return zs_emu_atomic_max(p, v); }
inline unsigned atomicMax(unsigned *p, unsigned v) { return zs_emu_atomic_max(p, v); }
inline int atomicMin(int *p, int v) { return zs_emu_atomic_min(p, v); }
inline unsigned atomicMin(unsigned *p, unsigned v) { return zs_emu_atomic_min(p, v); }
inline int atomicExch(int *p, int v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
inline unsigned atomicExch(unsigned *p, unsigned v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
inline int atomicCAS(int *p, int c, int v) { __atomic_compare_exchange_n(p, &c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST); return c; }
inline unsigned atomicCAS(unsigned *p, unsigned c, unsigned v) { __atomic_compare_exchange_n(p, &c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST); return c; }

// ---- loads and arithmetic intrinsics (the .cu files are compiled with -ffp-contract=off, so
// a * b + c is never fused unless the source says __fmaf_rn) ----
template <typename T> inline T __ldg(const T *p) { return *p; }
template <typename T> inline T __ldcs(const T *p) { return *p; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }
inline int __float_as_int(float f) { int u; memcpy(&u, &f, 4); return u; }
using std::max;
using std::min;

// ---- launches: ZS_LAUNCH (dtype.cuh) turns into zs_emu_launch under ZS_EMU ----
// Queues body on the stream after the launch checks (block and grid limits, shared memory within
// the device's and the kernel's attribute); a refused launch sets the thread's last error as
// CUDA does. ptrs: the pointer arguments, for the emulator's checks (memory freed while queued
// work uses it, pointers that are not device memory).
void zs_emu_launch_submit(const char *name, const void *fn, dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                          std::function<void()> body, std::vector<const void *> ptrs);

template <typename A> inline void zs_emu_note_ptr(std::vector<const void *> &v, const A &a) {
    if constexpr (std::is_pointer<A>::value) v.push_back((const void *)a);
}

template <typename... P, typename... A>
inline void zs_emu_launch(const char *name, void (*k)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                          A &&...a) {
    static_assert(sizeof...(P) == sizeof...(A), "kernel launched with the wrong number of arguments");
    std::tuple<typename std::decay<P>::type...> args(std::forward<A>(a)...);
    std::vector<const void *> ptrs;
    std::apply([&](const auto &...x) { (zs_emu_note_ptr(ptrs, x), ...); }, args);
    zs_emu_launch_submit(name, (const void *)k, grid, block, smem, s, [k, args]() { std::apply(k, args); },
                         std::move(ptrs));
}
