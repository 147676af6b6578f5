// launch.cu — why the calling thread's last launcher call failed (kernels.h: zs_cuda_take_error):
// the launch's CUDA error, read once by zs_launch_ok (cudaGetLastError clears it, so it cannot be
// read a second time), or the argument a launcher refused (zs_cuda_refuse). Thread-local: each
// thread sees only its own launchers.
#include <stdarg.h>
#include <stdio.h>

#include "dtype.cuh"
#include "kernels.h"

static thread_local char err_msg[256];
static thread_local int err_set;

extern "C" int zs_cuda_launch_status(cudaError_t e) {
    if (e == cudaSuccess) {
        err_set = 0; // an older failure is no longer this thread's last one
        return 0;
    }
    snprintf(err_msg, sizeof err_msg, "%s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
    err_set = 1;
    return -1;
}

extern "C" int zs_cuda_refuse(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err_msg, sizeof err_msg, fmt, ap);
    va_end(ap);
    err_set = 1;
    return -1;
}

extern "C" const char *zs_cuda_take_error(void) {
    if (!err_set) return NULL;
    err_set = 0;
    return err_msg;
}
