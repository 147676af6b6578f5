/* common.c — status codes, thread-local error messages, logging, small helpers. */
#include "common.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static _Thread_local char zs_errbuf[1024];

const char *zs_strerror(int code) {
    switch (code) {
    case ZS_OK: return "ok";
    case ZS_EINVAL: return "invalid argument";
    case ZS_ENOMEM: return "out of memory";
    case ZS_EIO: return "I/O error";
    case ZS_EFORMAT: return "bad format";
    case ZS_ENOTFOUND: return "not found";
    case ZS_EUNSUPPORTED: return "unsupported";
    case ZS_ERANGE: return "out of range";
    case ZS_ECHECKSUM: return "checksum mismatch";
    case ZS_ENOSPC: return "no space";
    case ZS_EPERM: return "permission denied";
    case ZS_ECANCELLED: return "cancelled";
    case ZS_EBUSY: return "busy";
    case ZS_ESHAPE: return "shape mismatch";
    case ZS_EDEVICE: return "device error";
    default: return "unknown error";
    }
}

int zs_err(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(zs_errbuf, sizeof zs_errbuf, fmt, ap);
    va_end(ap);
    return code;
}

int zs_err_prefix(int code, const char *fmt, ...) {
    char old[sizeof zs_errbuf], pre[sizeof zs_errbuf];
    memcpy(old, zs_errbuf, sizeof old);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pre, sizeof pre, fmt, ap);
    va_end(ap);
    size_t n = strlen(pre);
    memcpy(zs_errbuf, pre, n + 1);
    if (old[0] && n + 2 < sizeof zs_errbuf) {
        size_t room = sizeof zs_errbuf - n - 3, m = strlen(old);
        if (m > room) m = room;
        memcpy(zs_errbuf + n, ": ", 2);
        memcpy(zs_errbuf + n + 2, old, m);
        zs_errbuf[n + 2 + m] = 0;
    }
    return code;
}

const char *zs_errmsg(void) { return zs_errbuf; }
void zs_err_clear(void) { zs_errbuf[0] = 0; }

static pthread_mutex_t zs_log_lock = PTHREAD_MUTEX_INITIALIZER;
static int zs_log_level = -1;

void zs_log_set_level(int level) { zs_log_level = level; }

static int zs_log_level_get(void) {
    if (zs_log_level < 0) {
        const char *e = getenv("ZS_LOG");
        int l = ZS_LOG_INFO;
        if (e) {
            if (!strcmp(e, "error")) l = ZS_LOG_ERROR;
            else if (!strcmp(e, "warn")) l = ZS_LOG_WARN;
            else if (!strcmp(e, "debug")) l = ZS_LOG_DEBUG;
        }
        zs_log_level = l;
    }
    return zs_log_level;
}

void zs_log(int level, const char *fmt, ...) {
    if (level > zs_log_level_get()) return;
    static const char *names[] = {"error", "warn", "info", "debug"};
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&zs_log_lock);
    fprintf(stderr, "zeroserve: %s: ", names[level < 0 ? 0 : level > 3 ? 3 : level]);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    pthread_mutex_unlock(&zs_log_lock);
    va_end(ap);
}

void *zs_aligned_alloc(size_t align, size_t size) {
    void *p = NULL;
    if (size == 0) size = align;
    size = ZS_ALIGN_UP(size, align);
    if (posix_memalign(&p, align, size) != 0) return NULL;
    return p;
}

double zs_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

size_t zs_peak_rss_bytes(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    size_t kb = 0;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) kb = (size_t)strtoull(line + 6, NULL, 10);
    fclose(f);
    return kb * 1024;
}

int zs_peak_rss_reset(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return zs_err(ZS_EIO, "cannot open /proc/self/clear_refs to reset the peak resident set");
    int ok = fputs("5", f) >= 0;
    if (fclose(f) != 0) ok = 0;
    return ok ? 0 : zs_err(ZS_EIO, "cannot reset the peak resident set (/proc/self/clear_refs)");
}

int zs_mul_size(size_t a, size_t b, size_t *out) {
    size_t r;
    if (__builtin_mul_overflow(a, b, &r)) return ZS_ERANGE;
    *out = r;
    return 0;
}

int zs_add_size(size_t a, size_t b, size_t *out) {
    size_t r;
    if (__builtin_add_overflow(a, b, &r)) return ZS_ERANGE;
    *out = r;
    return 0;
}
