// emu-internal.h — what the emulator's files share: how a kernel's grid is run (emu-block.cc), the
// runtime's memory table and fault reports (emu-runtime.cc), and the stream queue that cuBLAS and
// NCCL put their work on (emu-stream.cc). Tests only.
#pragma once
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include <functional>
#include <string>
#include <vector>

// ---- faults: a broken rule of the device (a deadlocked barrier, a shuffle with a bad mask, a
// hazard between the host and queued work). They are bugs of the code under test: the emulator
// prints what happened and ends the process (abort), so no test can pass over one. ----
[[noreturn]] void zs_emu_fault(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
// Warnings: printed once per distinct text.
void zs_emu_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

// ---- kernels (emu-block.cc) ----
struct zs_emu_grid {
    const char *name;
    dim3 grid, block;
    size_t smem; // dynamic shared memory bytes
    std::function<void()> body;
};
// Runs every block of g on the calling thread, one after another.
void zs_emu_run_grid(const zs_emu_grid &g);

// ---- memory (emu-runtime.cc) ----
enum { ZS_EMU_MEM_DEVICE = 1, ZS_EMU_MEM_PINNED = 2, ZS_EMU_MEM_REGISTERED = 3 };
struct zs_emu_range {
    const char *p;
    size_t n;
};
// The allocation or registered host range holding p: its kind (0: none, plain host memory), its
// start and size, and its device (-1 for host memory).
int zs_emu_mem_find(const void *p, zs_emu_range *r, int *dev);
int zs_emu_current_device(void);
int zs_emu_device_count(void);
// Checks that p (n bytes, n 0: only p itself) may be read or written by device dev's work; else
// a fault naming `what`.
void zs_emu_check_device_ptr(const void *p, size_t n, int dev, const char *what);

// ---- streams (emu-stream.cc) ----
// One piece of queued work. ranges: the memory it reads or writes (for the hazard checks).
struct zs_emu_op {
    std::string what;
    std::function<void()> run;
    std::vector<zs_emu_range> ranges;
};
// Queues op on stream s (NULL: the device's legacy default stream); cudaSuccess or an error for
// a destroyed or foreign stream.
cudaError_t zs_emu_enqueue(cudaStream_t s, zs_emu_op op);
// The same, and the stream runs up to op without waiting for a synchronisation (collectives:
// the ranks' streams must meet whatever their hosts do next).
cudaError_t zs_emu_enqueue_now(cudaStream_t s, zs_emu_op op);
// The device a stream belongs to (the current one for NULL).
int zs_emu_stream_device(cudaStream_t s);
// Runs everything queued on every stream of every device, and waits for it (process exit, frees).
void zs_emu_drain_device(int dev);
// Faults when queued work that has not run yet uses [p, p + n): called by the frees.
void zs_emu_check_unused(const void *p, size_t n, const char *what);
// 1 when queued work that has not run yet uses [p, p + n).
int zs_emu_range_pending(const void *p, size_t n);
