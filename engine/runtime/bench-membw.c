/* bench-membw.c — the host memory bandwidth probe that benchmarks and the placement planner
 * measure against (zs_bench_mem_bw), and the median of their runs (bench.h). Calls nothing of the
 * engine, so the planner can measure from inside engine open. */
#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "bench.h"
#include "common.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double zs_bench_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

typedef struct { const uint64_t *p; size_t n; uint64_t sum; } bw_arg;
typedef uint64_t bw_vec __attribute__((vector_size(32)));

/* Streams the buffer with wide loads into several accumulators so the loop is bound by memory,
 * not by the adds. */
static void *bw_worker(void *a) {
    bw_arg *w = a;
    const bw_vec *v = (const bw_vec *)w->p;
    size_t nv = w->n / 4, i = 0;
    bw_vec s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    for (; i + 4 <= nv; i += 4) {
        s0 += v[i]; s1 += v[i + 1]; s2 += v[i + 2]; s3 += v[i + 3];
    }
    for (; i < nv; i++) s0 += v[i];
    bw_vec s = s0 + s1 + s2 + s3;
    w->sum = s[0] + s[1] + s[2] + s[3];
    return NULL;
}

/* The bound must not be measured low, or a ratio against it flatters: the buffer sits on 2 MiB
 * pages where the kernel allows (as a model's weights may), and each run is the fastest of 3
 * passes over it. */
int zs_bench_mem_bw(size_t bytes, int threads, int runs, double *gbps) {
    if (threads <= 0) threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (threads <= 0) threads = 1;
    if (threads > 64) threads = 64;
    if (runs <= 0) runs = 5;
    size_t n = bytes / 8;
    uint64_t *buf = zs_aligned_alloc((size_t)2 << 20, (n * 8 + ((size_t)2 << 20) - 1) & ~(((size_t)2 << 20) - 1));
    double *t = calloc((size_t)runs, sizeof *t);
    if (!buf || !t) {
        free(buf); free(t);
        return zs_err(ZS_ENOMEM, "bench: cannot allocate %zu MiB for the bandwidth probe", bytes >> 20);
    }
#ifdef MADV_HUGEPAGE
    (void)madvise(buf, n * 8, MADV_HUGEPAGE);
#endif
    for (size_t i = 0; i < n; i++) buf[i] = i;
    pthread_t th[64];
    bw_arg args[64];
    volatile uint64_t sink = 0;
    for (int r = 0; r < runs; r++) {
        double best = 0;
        for (int pass = 0; pass < 3; pass++) {
            double t0 = zs_now();
            size_t per = n / (size_t)threads / 16 * 16; /* 128-byte multiples; the tail is not read */
            for (int k = 0; k < threads; k++) {
                args[k] = (bw_arg){buf + per * (size_t)k, per, 0};
                pthread_create(&th[k], NULL, bw_worker, &args[k]);
            }
            for (int k = 0; k < threads; k++) {
                pthread_join(th[k], NULL);
                sink += args[k].sum;
            }
            double g = (double)(per * (size_t)threads * 8) / (zs_now() - t0) / 1e9;
            best = g > best ? g : best;
        }
        t[r] = best;
    }
    (void)sink;
    *gbps = zs_bench_median(t, runs);
    free(buf);
    free(t);
    return 0;
}
