/* backend.c — backend queries for a build without CUDA (the CUDA build uses backend-cuda.c). */
#include "backend.h"

#include "common.h"

#ifndef ZS_CUDA
int zs_backend_cuda_built(void) { return 0; }
int zs_backend_cuda_devices(void) { return 0; }
int zs_backend_cuda_describe(int i, char *buf, size_t cap) {
    (void)buf; (void)cap;
    return zs_err(ZS_ENOTFOUND, "CUDA device %d: this build has no CUDA support (built with CUDA=0)", i);
}
int zs_backend_cuda_bf16_to_f32(int dev, const unsigned short *src, float *dst, size_t n) {
    (void)dev; (void)src; (void)dst; (void)n;
    return zs_err(ZS_EUNSUPPORTED, "this build has no CUDA support (built with CUDA=0)");
}
#endif
