/* cublas-cuda.c — cuBLAS loaded at run time instead of linked: this file defines the few cuBLAS
 * entry points zeroserve calls (cublasCreate/Destroy/SetStream/GetStream and cublasGemmEx, the
 * names cublas_v2.h maps them to), each forwarding to the real function of a libcublas.so that
 * is dlopen'ed on first use. So a CUDA build starts on machines with no cuBLAS at all (a CPU
 * machine, a container without the CUDA libraries, the GPU kit's dry run) and finds the library
 * wherever the machine keeps it: $ZS_CUBLAS_LIB, the loader's path (LD_LIBRARY_PATH, the
 * binary's run path), $CUDA_HOME/lib64, /usr/local/cuda/lib64, or a Python venv's NVIDIA wheel
 * (nvidia/cublas/lib). If none is found, cublasCreate fails with CUBLAS_STATUS_NOT_INITIALIZED
 * and the error names every place tried.
 *
 * Thread-safe: the library is loaded once (pthread_once); the forwarders only read the table. */
#define _GNU_SOURCE
#include <cublas_v2.h>
#include <dlfcn.h>
#include <glob.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

#define ZS_STR2(x) #x
#define ZS_STR(x) ZS_STR2(x)
#define CUBLAS_SONAME "libcublas.so." ZS_STR(CUBLAS_VER_MAJOR)

static struct {
    __typeof__(&cublasCreate_v2) create;
    __typeof__(&cublasDestroy_v2) destroy;
    __typeof__(&cublasSetStream_v2) set_stream;
    __typeof__(&cublasGetStream_v2) get_stream;
    __typeof__(&cublasGemmEx) gemm_ex;
    char path[1024];
    char tried[3072];
} cb;
static pthread_once_t cb_once = PTHREAD_ONCE_INIT;

static void *try_open(const char *path) {
    size_t n = strlen(cb.tried);
    if (n + strlen(path) + 3 < sizeof cb.tried) snprintf(cb.tried + n, sizeof cb.tried - n, "%s%s", n ? ", " : "", path);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (h) snprintf(cb.path, sizeof cb.path, "%s", path);
    return h;
}

static void *try_glob(const char *pattern) {
    glob_t g;
    void *h = NULL;
    if (glob(pattern, 0, NULL, &g) == 0)
        for (size_t i = 0; i < g.gl_pathc && !h; i++) h = try_open(g.gl_pathv[i]);
    else
        try_open(pattern); /* only to list it among the places tried */
    globfree(&g);
    return h;
}

static void cb_load(void) {
    char buf[1024];
    void *h = NULL;
    const char *env = getenv("ZS_CUBLAS_LIB");
    if (env && *env) h = try_open(env);
    if (!h) h = try_open(CUBLAS_SONAME);
    const char *home = getenv("CUDA_HOME");
    if (!h && home && *home) {
        snprintf(buf, sizeof buf, "%s/lib64/%s", home, CUBLAS_SONAME);
        h = try_open(buf);
    }
    if (!h) h = try_open("/usr/local/cuda/lib64/" CUBLAS_SONAME);
    if (!h) h = try_glob("/opt/*/.venv/lib/python3*/site-packages/nvidia/cu*/lib/" CUBLAS_SONAME);
    if (!h) h = try_glob("/opt/*/.venv/lib/python3*/site-packages/nvidia/cublas/lib/" CUBLAS_SONAME);
    if (!h) h = try_glob("/usr/local/lib/python3*/dist-packages/nvidia/cublas/lib/" CUBLAS_SONAME);
    if (!h) return;
    cb.create = (__typeof__(cb.create))dlsym(h, "cublasCreate_v2");
    cb.destroy = (__typeof__(cb.destroy))dlsym(h, "cublasDestroy_v2");
    cb.set_stream = (__typeof__(cb.set_stream))dlsym(h, "cublasSetStream_v2");
    cb.get_stream = (__typeof__(cb.get_stream))dlsym(h, "cublasGetStream_v2");
    cb.gemm_ex = (__typeof__(cb.gemm_ex))dlsym(h, "cublasGemmEx");
    if (!cb.create || !cb.destroy || !cb.set_stream || !cb.get_stream || !cb.gemm_ex) {
        zs_log_error("cuBLAS: %s lacks a function zeroserve needs (cublasCreate_v2, cublasDestroy_v2, "
                     "cublasSetStream_v2, cublasGetStream_v2, cublasGemmEx)", cb.path);
        cb.create = NULL;
        return;
    }
    zs_log_info("cuBLAS: loaded %s", cb.path);
}

static int cb_ready(void) {
    pthread_once(&cb_once, cb_load);
    return cb.create != NULL;
}

cublasStatus_t cublasCreate_v2(cublasHandle_t *handle) {
    if (!cb_ready()) {
        zs_err(ZS_EIO, "cuBLAS (%s) not found; tried %s. Set ZS_CUBLAS_LIB to its path, or add its "
                       "directory to LD_LIBRARY_PATH", CUBLAS_SONAME, cb.tried);
        zs_log_error("%s", zs_errmsg());
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    return cb.create(handle);
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
    return cb_ready() ? cb.destroy(handle) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
    return cb_ready() ? cb.set_stream(handle, stream) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t cublasGetStream_v2(cublasHandle_t handle, cudaStream_t *stream) {
    return cb_ready() ? cb.get_stream(handle, stream) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void *alpha, const void *A, cudaDataType Atype, int lda, const void *B,
                            cudaDataType Btype, int ldb, const void *beta, void *C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
    if (!cb_ready()) return CUBLAS_STATUS_NOT_INITIALIZED;
    return cb.gemm_ex(handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb, beta, C, Ctype, ldc,
                      computeType, algo);
}
