// emu-cublas.cc — the cuBLAS calls zeroserve makes (cublasCreate/Destroy/SetStream/GetStream and
// cublasGemmEx), on the emulated device (tests only). engine/runtime/cublas-cuda.c loads them
// with dlopen from $ZS_CUBLAS_LIB, which the emulator's library points at itself when it loads.
// The product runs on the handle's stream, on the CPU: operands in f32, f16 or bf16 widened to
// f32, each element's sum over k in increasing order in f32 (fp32 accumulation), then
// alpha * sum + beta * C (C not read when beta is 0, as cuBLAS) rounded to C's type. Column-major,
// with cuBLAS's argument checks; the operands must be device memory of the handle's device.
#include <cublas_v2.h>
#include <stdlib.h>
#include <string.h>

#include <memory>
#include <vector>

#include "emu-internal.h"

namespace {

struct Handle {
    int dev;
    cudaStream_t stream;
};

size_t elem_size(cudaDataType t) {
    switch (t) {
    case CUDA_R_32F: return 4;
    case CUDA_R_16F: return 2;
    case CUDA_R_16BF: return 2;
    default: return 0;
    }
}

float load(const void *p, cudaDataType t, size_t i) {
    if (t == CUDA_R_32F) return ((const float *)p)[i];
    if (t == CUDA_R_16F) return __half2float(((const __half *)p)[i]);
    return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
}

void store(void *p, cudaDataType t, size_t i, float v) {
    if (t == CUDA_R_32F) ((float *)p)[i] = v;
    else if (t == CUDA_R_16F) ((__half *)p)[i] = __float2half_rn(v);
    else ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
}

// op(X) of r x c from X (column-major, leading dimension ld), as r rows of c floats
std::vector<float> rows_of(const void *X, cudaDataType t, int ld, bool trans, int r, int c) {
    std::vector<float> out((size_t)r * c);
    for (int i = 0; i < r; i++)
        for (int j = 0; j < c; j++)
            out[(size_t)i * c + j] = load(X, t, trans ? (size_t)i * ld + j : (size_t)j * ld + i);
    return out;
}

} // namespace

extern "C" {

cublasStatus_t cublasCreate_v2(cublasHandle_t *h) {
    if (!h) return CUBLAS_STATUS_INVALID_VALUE;
    Handle *x = new Handle{zs_emu_current_device(), nullptr};
    *h = (cublasHandle_t)x;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t h) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    delete (Handle *)h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (zs_emu_stream_device(s) != ((Handle *)h)->dev) return CUBLAS_STATUS_INVALID_VALUE;
    ((Handle *)h)->stream = s;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream_v2(cublasHandle_t h, cudaStream_t *s) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!s) return CUBLAS_STATUS_INVALID_VALUE;
    *s = ((Handle *)h)->stream;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void *alpha, const void *A, cudaDataType Atype, int lda, const void *B,
                            cudaDataType Btype, int ldb, const void *beta, void *C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
    (void)algo;
    Handle *h = (Handle *)handle;
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (computeType != CUBLAS_COMPUTE_32F && computeType != CUBLAS_COMPUTE_32F_FAST_16BF &&
        computeType != CUBLAS_COMPUTE_32F_FAST_16F && computeType != CUBLAS_COMPUTE_32F_FAST_TF32) {
        zs_emu_warn("cublasGemmEx: compute type %d is not emulated (32F only)", (int)computeType);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (!elem_size(Atype) || Atype != Btype || !elem_size(Ctype)) {
        zs_emu_warn("cublasGemmEx: types A %d, B %d, C %d are not emulated", (int)Atype, (int)Btype, (int)Ctype);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    bool ta = transa != CUBLAS_OP_N, tb = transb != CUBLAS_OP_N;
    if ((transa != CUBLAS_OP_N && transa != CUBLAS_OP_T) || (transb != CUBLAS_OP_N && transb != CUBLAS_OP_T) || m < 0 ||
        n < 0 || k < 0 || lda < (ta ? (k > 1 ? k : 1) : (m > 1 ? m : 1)) ||
        ldb < (tb ? (n > 1 ? n : 1) : (k > 1 ? k : 1)) || ldc < (m > 1 ? m : 1) || !alpha || !beta)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
    if (zs_emu_stream_device(h->stream) != zs_emu_current_device()) {
        zs_emu_warn("cublasGemmEx: the handle's device %d is not the current device %d", h->dev,
                    zs_emu_current_device());
        return CUBLAS_STATUS_EXECUTION_FAILED;
    }
    float al = *(const float *)alpha, be = *(const float *)beta; // host pointer mode: read now
    size_t ea = elem_size(Atype), ec = elem_size(Ctype);
    int ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
    if (k > 0) {
        zs_emu_check_device_ptr(A, ((size_t)(ac - 1) * lda + ar) * ea, h->dev, "cublasGemmEx A");
        zs_emu_check_device_ptr(B, ((size_t)(bc - 1) * ldb + br) * ea, h->dev, "cublasGemmEx B");
    }
    zs_emu_check_device_ptr(C, ((size_t)(n - 1) * ldc + m) * ec, h->dev, "cublasGemmEx C");
    zs_emu_op op;
    op.what = "cublasGemmEx";
    op.ranges = {zs_emu_range{(const char *)C, ((size_t)(n - 1) * ldc + m) * ec}};
    if (k > 0) {
        op.ranges.push_back(zs_emu_range{(const char *)A, ((size_t)(ac - 1) * lda + ar) * ea});
        op.ranges.push_back(zs_emu_range{(const char *)B, ((size_t)(bc - 1) * ldb + br) * ea});
    }
    op.run = [=]() {
        std::vector<float> a = rows_of(A, Atype, lda, ta, m, k); // op(A): m x k
        std::vector<float> b = rows_of(B, Btype, ldb, !tb, n, k); // op(B)^T: n x k
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                const float *x = &a[(size_t)i * k], *y = &b[(size_t)j * k];
                float s = 0.0f;
                for (int l = 0; l < k; l++) s += x[l] * y[l];
                size_t ci = (size_t)j * ldc + i;
                float v = al * s;
                if (be != 0.0f) v += be * load(C, Ctype, ci);
                store(C, Ctype, ci, v);
            }
    };
    cudaError_t e = zs_emu_enqueue(h->stream, std::move(op));
    return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

} // extern "C"
