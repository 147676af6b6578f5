/* device.c — device selection (--device cpu|cuda|auto, ZS_DEVICE) for every build, and the
 * device API of device.h for a build without CUDA (each call fails with ZS_EUNSUPPORTED). */
#include "device.h"

#include <string.h>

#include "backend.h"
#include "common.h"

int zs_device_parse(const char *s, int *out) {
    if (!s) return zs_err(ZS_EINVAL, "device: no value");
    if (!strcmp(s, "auto")) *out = ZS_DEVICE_AUTO;
    else if (!strcmp(s, "cpu")) *out = ZS_DEVICE_CPU;
    else if (!strcmp(s, "cuda") || !strcmp(s, "gpu")) *out = ZS_DEVICE_CUDA;
    else return zs_err(ZS_EINVAL, "device '%s' is not one of cpu, cuda, auto", s);
    return 0;
}

const char *zs_device_name(int device) {
    return device == ZS_DEVICE_CPU ? "cpu" : device == ZS_DEVICE_CUDA ? "cuda" : "auto";
}

int zs_device_resolve(int requested, int *out) {
    int dev = requested;
    const char *env = getenv("ZS_DEVICE");
    if (dev == ZS_DEVICE_AUTO && env && *env) {
        int rc = zs_device_parse(env, &dev);
        if (rc < 0) return zs_err_prefix(rc, "ZS_DEVICE");
    }
    if (dev == ZS_DEVICE_CUDA) {
        if (!zs_backend_cuda_built())
            return zs_err(ZS_EDEVICE, "device cuda: this build has no CUDA support (built with CUDA=0)");
        if (zs_backend_cuda_devices() == 0)
            return zs_err(ZS_EDEVICE, "device cuda: no CUDA device is visible (no driver or no GPU)");
        *out = ZS_DEVICE_CUDA;
        return 0;
    }
    if (dev == ZS_DEVICE_AUTO)
        dev = zs_backend_cuda_devices() > 0 ? ZS_DEVICE_CUDA : ZS_DEVICE_CPU;
    *out = dev;
    return 0;
}

#ifndef ZS_CUDA
#define NO_CUDA() zs_err(ZS_EUNSUPPORTED, "this build has no CUDA support (built with CUDA=0)")
int zs_dev_open(int cuda_device, zs_dev **out) { (void)cuda_device; (void)out; return NO_CUDA(); }
void zs_dev_free(zs_dev *d) { (void)d; }
int zs_dev_id(const zs_dev *d) { (void)d; return -1; }
void *zs_dev_stream(zs_dev *d, int queue) { (void)d; (void)queue; return NULL; }
int zs_dev_set_current(zs_dev *d) { (void)d; return NO_CUDA(); }
void *zs_dev_alloc(zs_dev *d, size_t bytes) { (void)d; (void)bytes; NO_CUDA(); return NULL; }
void zs_dev_release(zs_dev *d, void *p) { (void)d; (void)p; }
size_t zs_dev_pool_bytes(zs_dev *d) { (void)d; return 0; }
int zs_dev_upload(zs_dev *d, void *dst, const void *src, size_t bytes) {
    (void)d; (void)dst; (void)src; (void)bytes;
    return NO_CUDA();
}
int zs_dev_download(zs_dev *d, void *dst, const void *src, size_t bytes) {
    (void)d; (void)dst; (void)src; (void)bytes;
    return NO_CUDA();
}
int zs_dev_sync(zs_dev *d) { (void)d; return NO_CUDA(); }
int zs_dev_error(const char *what) { return zs_err(ZS_EUNSUPPORTED, "%s: this build has no CUDA support", what); }
int zs_dev_gemm(zs_dev *d, float *y, const void *x, int T, int in, const void *W, zs_dtype wdt, int out,
                float beta) {
    (void)d; (void)y; (void)x; (void)T; (void)in; (void)W; (void)wdt; (void)out; (void)beta;
    return NO_CUDA();
}
void zs_dev_install_pinned_hooks(void) {}
void zs_dev_gather_ops(zs_dev *d, zs_gather_dev *ops) { (void)d; memset(ops, 0, sizeof *ops); }
int zs_forward_cuda_new(const zs_model *m, int max_tokens, zs_dev *d, const zs_kvcache *kv,
                        zs_forward_cuda **out) {
    (void)m; (void)max_tokens; (void)d; (void)kv; (void)out;
    return NO_CUDA();
}
void zs_forward_cuda_free(zs_forward_cuda *f) { (void)f; }
int zs_forward_cuda_run(zs_forward_cuda *f, zs_weight_source *src, zs_kvcache *kv, const zs_batch *b,
                        float *logits) {
    (void)f; (void)src; (void)kv; (void)b; (void)logits;
    return NO_CUDA();
}
int zs_dev_h2d_gbps(zs_dev *d, size_t bytes, int runs, double *gbps) {
    (void)d; (void)bytes; (void)runs; (void)gbps;
    return NO_CUDA();
}
int zs_dev_read_gbps(zs_dev *d, size_t bytes, int runs, double *gbps) {
    (void)d; (void)bytes; (void)runs; (void)gbps;
    return NO_CUDA();
}
int zs_dev_gemm_tflops(zs_dev *d, int n, int runs, double *tflops) {
    (void)d; (void)n; (void)runs; (void)tflops;
    return NO_CUDA();
}
#endif
