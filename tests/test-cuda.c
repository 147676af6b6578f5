/* test-cuda.c — the CUDA part: the bf16 -> f32 kernel against the CPU conversion on random
 * values. Skips (77) where the build has no CUDA or no device is visible. */
#include "backend.h"
#include "common.h"
#include "tensor.h"
#include "testutil.h"

int main(void) {
    if (!zs_backend_cuda_built() || zs_backend_cuda_devices() == 0) {
        fprintf(stderr, "test-cuda: no CUDA device (built with CUDA: %d); skipping\n", zs_backend_cuda_built());
        return 77;
    }
    char name[256];
    CHECK(zs_backend_cuda_describe(0, name, sizeof name) == 0, "describe: %s", zs_errmsg());
    fprintf(stderr, "device 0: %s\n", name);
    size_t n = 1 << 20;
    unsigned short *src = malloc(n * 2);
    float *gpu = malloc(n * 4), *cpu = malloc(n * 4);
    uint64_t s = 42;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        src[i] = zs_f32_to_bf16((float)((int64_t)(s >> 11) % 200000) / 1000.0f);
    }
    zs_to_f32(cpu, src, ZS_BF16, n);
    int rc = zs_backend_cuda_bf16_to_f32(0, src, gpu, n);
    CHECK(rc == 0, "kernel: %s", zs_errmsg());
    CHECK(rc != 0 || memcmp(cpu, gpu, n * 4) == 0, "bf16 -> f32 on the device equals the CPU conversion");
    free(src); free(gpu); free(cpu);
    return tu_finish("test-cuda");
}
