/* plan-local.c — the machine `zeroserve plan --machine local` plans for: this one, measured. Host
 * memory (physical pages), its read bandwidth (bench.c's streaming probe), the f32 FLOP/s of the
 * CPU matmul (kernels/cpu, the kernel the CPU ranks run) and, with --nvme-path, that directory's
 * free space, the write rate of a probe file (written, fsync'd) and its raw O_DIRECT read rate
 * (offload/store.h).
 * No device: the planner then has the host compute. */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "bench.h"
#include "common.h"
#include "ops.h"
#include "plan.h"
#include "store.h"

#define PROBE_MEM_BYTES ((size_t)256 << 20)  /* the bandwidth probe's buffer */
#define PROBE_MEM_RUNS 3
#define PROBE_MM_T 64                        /* the matmul: 64 rows through a 1024 x 1024 f32 matrix */
#define PROBE_MM_N 1024
#define PROBE_MM_SECONDS 0.25                /* ... repeated for at least this long */
#define PROBE_FILE_BYTES ((size_t)256 << 20) /* the NVMe probe file */
#define PROBE_CHUNK ((size_t)4 << 20)

static int matmul_flops(double *out) {
    size_t nw = (size_t)PROBE_MM_N * PROBE_MM_N, nx = (size_t)PROBE_MM_T * PROBE_MM_N;
    float *w = malloc(nw * sizeof *w), *x = malloc(nx * sizeof *x), *y = malloc(nx * sizeof *y);
    if (!w || !x || !y) { free(w); free(x); free(y); return zs_err(ZS_ENOMEM, "plan: out of memory for the matmul probe"); }
    for (size_t i = 0; i < nw; i++) w[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    for (size_t i = 0; i < nx; i++) x[i] = (float)(i % 97) / 97.0f;
    zs_op_matmul(y, x, PROBE_MM_T, PROBE_MM_N, w, ZS_F32, PROBE_MM_N, NULL); /* warm the pool and caches */
    long n = 0;
    double t0 = zs_now(), t;
    do {
        zs_op_matmul(y, x, PROBE_MM_T, PROBE_MM_N, w, ZS_F32, PROBE_MM_N, NULL);
        n++;
    } while ((t = zs_now() - t0) < PROBE_MM_SECONDS || n < 3);
    *out = 2.0 * PROBE_MM_T * (double)PROBE_MM_N * PROBE_MM_N * n / t;
    free(w); free(x); free(y);
    return 0;
}

/* Writes the probe file in dir (fsync'd: the write rate), reads it back raw, removes it. */
static int nvme_probe(const char *dir, double *free_bytes, double *rd, double *wr) {
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return zs_err(ZS_ENOTFOUND, "--nvme-path %s: not a directory", dir);
    struct statvfs vs;
    if (statvfs(dir, &vs) != 0) return zs_err(ZS_EIO, "--nvme-path %s: statvfs: %s", dir, strerror(errno));
    *free_bytes = (double)vs.f_bavail * (double)vs.f_frsize;
    if (*free_bytes < 2.0 * PROBE_FILE_BYTES)
        return zs_err(ZS_ENOSPC, "--nvme-path %s: %.0f MB free, the probe needs %zu MB", dir, *free_bytes / 1e6,
                      2 * (PROBE_FILE_BYTES >> 20));
    char path[4096];
    if (snprintf(path, sizeof path, "%s/.zs-plan-probe-XXXXXX", dir) >= (int)sizeof path)
        return zs_err(ZS_EINVAL, "--nvme-path %s: path too long", dir);
    int fd = mkstemp(path);
    if (fd < 0) return zs_err(ZS_EIO, "--nvme-path %s: cannot create a probe file: %s", dir, strerror(errno));
    char *buf = zs_aligned_alloc(ZS_STORE_ALIGN, PROBE_CHUNK);
    int rc = buf ? 0 : zs_err(ZS_ENOMEM, "plan: out of memory for the NVMe probe");
    double t0 = zs_now();
    for (size_t off = 0; rc == 0 && off < PROBE_FILE_BYTES; off += PROBE_CHUNK) {
        for (size_t i = 0; i < PROBE_CHUNK; i += 4096) buf[i] = (char)(off >> 12) + (char)i; /* not all zeros */
        if (pwrite(fd, buf, PROBE_CHUNK, (off_t)off) != (ssize_t)PROBE_CHUNK)
            rc = zs_err(ZS_EIO, "--nvme-path %s: writing the probe file: %s", dir, strerror(errno));
    }
    if (rc == 0 && fsync(fd) != 0) rc = zs_err(ZS_EIO, "--nvme-path %s: fsync: %s", dir, strerror(errno));
    if (rc == 0) *wr = (double)PROBE_FILE_BYTES / (zs_now() - t0) / 1e9;
    close(fd);
    free(buf);
    if (rc == 0) rc = zs_store_raw_read_gbps(path, 0, 32, (size_t)1 << 20, rd);
    unlink(path);
    return rc;
}

int zs_plan_machine_local(const char *nvme_path, zs_plan_machine *out) {
    if (!out) return zs_err(ZS_EINVAL, "zs_plan_machine_local: NULL argument");
    zs_plan_machine m;
    memset(&m, 0, sizeof m);
    snprintf(m.name, sizeof m.name, "local");
    m.devices = 1;
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || psz <= 0) return zs_err(ZS_EIO, "plan: cannot read this machine's memory size");
    m.host_mem = (double)pages * (double)psz;
    ZS_CHECK(zs_bench_mem_bw(PROBE_MEM_BYTES, 0, PROBE_MEM_RUNS, &m.host_gbps));
    ZS_CHECK(matmul_flops(&m.host_flops));
    if (nvme_path) ZS_CHECK(nvme_probe(nvme_path, &m.nvme, &m.nvme_read_gbps, &m.nvme_write_gbps));
    *out = m;
    return 0;
}
