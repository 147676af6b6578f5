/* matmul.c — y = x · Wᵀ (+ bias) on the CPU, batch-invariant: a token's output row is the same
 * bits whatever other tokens share the call (OpenBLAS sgemm picks different kernels and blockings
 * by shape, so its rows change with the batch size; continuous batching needs them not to).
 * Weight rows are split into blocks that stay in cache while every token passes over them, the
 * blocks are spread over the pool's threads, and f16/bf16 rows are converted block by block. */
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "ops.h"
#include "pool.h"

/* the kernel's helpers are static, so the vector-return ABI note does not apply */
#pragma GCC diagnostic ignored "-Wpsabi"
#define KERN_NAME(x) zs_kern_generic_##x
#include "matmul-kern.h"

void zs_matmul_block_avx2(float *y, int ldy, const float *x, int T, int in, const float *W, int R);

typedef void (*block_fn)(float *y, int ldy, const float *x, int T, int in, const float *W, int R);

static block_fn pick_kernel(void) {
    static block_fn fn;
    if (!fn) {
        __builtin_cpu_init();
        fn = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? zs_matmul_block_avx2
                                                                             : zs_kern_generic_block;
    }
    return fn;
}

typedef struct {
    float *y;
    const float *x;
    int T, in, out, rows_per_task, tok_tile;
    const void *W;
    zs_dtype wdt;
    block_fn fn;
} mm_job;

static _Thread_local float *mm_scratch;
static _Thread_local size_t mm_scratch_n;

static void mm_task(void *arg, int task) {
    mm_job *j = arg;
    int r0 = task * j->rows_per_task, R = ZS_MIN(j->rows_per_task, j->out - r0);
    const float *w;
    if (j->wdt == ZS_F32) {
        w = (const float *)j->W + (size_t)r0 * j->in;
    } else {
        size_t n = (size_t)R * j->in;
        if (n > mm_scratch_n) {
            free(mm_scratch);
            mm_scratch = zs_aligned_alloc(64, n * sizeof(float));
            ZS_ASSERT(mm_scratch != NULL);
            mm_scratch_n = n;
        }
        zs_to_f32(mm_scratch, (const char *)j->W + (size_t)r0 * j->in * zs_dtype_size(j->wdt), j->wdt, n);
        w = mm_scratch;
    }
    /* tokens in tiles, so the x rows of a tile stay in L1 while the weight block is reused */
    for (int t0 = 0; t0 < j->T; t0 += j->tok_tile) {
        int tn = ZS_MIN(j->tok_tile, j->T - t0);
        j->fn(j->y + (size_t)t0 * j->out + r0, j->out, j->x + (size_t)t0 * j->in, tn, j->in, w, R);
    }
}

void zs_op_matmul(float *y, const float *x, int T, int in, const void *W, zs_dtype wdt, int out,
                  const float *bias) {
    mm_job j = {y, x, T, in, out, 0, 0, W, wdt, pick_kernel()};
    /* weight blocks of ~64 KiB (f32), a multiple of 4 rows */
    int rows = (int)((64 * 1024 / 4) / (size_t)ZS_MAX(in, 1));
    rows = ZS_MAX(4, rows & ~3);
    /* but enough blocks to keep every thread busy on small matrices */
    int threads = zs_pool_threads();
    while (rows > 4 && (out + rows - 1) / rows < 4 * threads) rows = ZS_MAX(4, (rows / 2) & ~3);
    j.rows_per_task = rows;
    j.tok_tile = ZS_MAX(2, (int)((16 * 1024 / 4) / (size_t)ZS_MAX(in, 1)) & ~1);
    int tasks = (out + rows - 1) / rows;
    /* small products are done here: waking the pool would cost more than the work */
    if ((size_t)out * (size_t)in * (size_t)T < ((size_t)1 << 20))
        for (int t = 0; t < tasks; t++) mm_task(&j, t);
    else
        zs_pool_run(mm_task, &j, tasks);
    if (bias)
        for (int t = 0; t < T; t++) zs_op_add(y + (size_t)t * out, bias, (size_t)out);
}
