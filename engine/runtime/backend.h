/* backend.h — which compute devices this build and this machine have. The CPU backend is always
 * present; the CUDA backend exists when the build found nvcc (ZS_CUDA) and a driver with at
 * least one device is visible at run time. This header includes no CUDA headers.
 * Thread-safe: results are computed once and cached. */
#ifndef ZS_BACKEND_H
#define ZS_BACKEND_H

#include <stddef.h>

/* 1 when the binary was built with the CUDA part. */
int zs_backend_cuda_built(void);
/* Number of visible CUDA devices (0 without a driver or device, or in a CPU-only build).
 * The reason for 0 is logged once at info level. */
int zs_backend_cuda_devices(void);
/* Name and memory of device i into buf ("NVIDIA H200, 139.8 GiB"); ZS_ENOTFOUND if absent. */
int zs_backend_cuda_describe(int i, char *buf, size_t cap);
/* Converts n bf16 values to f32 on device `dev` (host buffers in and out): a round trip through
 * the device used by tests to check that kernels run. ZS_EUNSUPPORTED without CUDA. */
int zs_backend_cuda_bf16_to_f32(int dev, const unsigned short *src, float *dst, size_t n);

#endif
