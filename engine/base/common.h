/* common.h — status codes, error messages, logging and checked allocation shared by every
 * zeroserve module.
 *
 * Errors: a function that can fail returns int, 0 (ZS_OK) or a negative ZS_E* code. The
 * human-readable reason goes into a thread-local buffer with zs_err(); callers read it with
 * zs_errmsg(). zs_err() returns its code so a failure is reported in one line:
 *     return zs_err(ZS_EFORMAT, "%s: header length %llu exceeds file size", path, n);
 * Everything here is thread-safe (the error buffer is per thread; logging takes a lock). */
#ifndef ZS_COMMON_H
#define ZS_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

enum {
    ZS_OK = 0,
    ZS_EINVAL = -1,       /* bad argument or bad input value */
    ZS_ENOMEM = -2,       /* allocation failed */
    ZS_EIO = -3,          /* read/write/system call failed */
    ZS_EFORMAT = -4,      /* malformed file content (JSON, safetensors, ...) */
    ZS_ENOTFOUND = -5,    /* missing file, tensor, key, token */
    ZS_EUNSUPPORTED = -6, /* valid but not supported (architecture, dtype, ...) */
    ZS_ERANGE = -7,       /* value out of range */
    ZS_ECHECKSUM = -8,    /* data does not match its checksum */
    ZS_ENOSPC = -9,       /* not enough room (disk, cache, queue) */
    ZS_EPERM = -10,       /* permission denied */
    ZS_ECANCELLED = -11,  /* operation cancelled */
    ZS_EBUSY = -12,       /* resource busy / queue full */
    ZS_ESHAPE = -13,      /* tensor shape mismatch */
    ZS_EDEVICE = -14,     /* device (GPU) error */
};

/* Short constant name of a code ("invalid argument", ...). */
const char *zs_strerror(int code);

/* Record a message for the calling thread and return code (printf-style). */
int zs_err(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prepend context to the current message: "ctx: old message". Returns code. */
int zs_err_prefix(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The last message recorded on this thread ("" if none). */
const char *zs_errmsg(void);
void zs_err_clear(void);

/* Logging to stderr. Level from ZS_LOG env (error|warn|info|debug), default info. */
enum { ZS_LOG_ERROR = 0, ZS_LOG_WARN = 1, ZS_LOG_INFO = 2, ZS_LOG_DEBUG = 3 };
void zs_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void zs_log_set_level(int level);
#define zs_log_error(...) zs_log(ZS_LOG_ERROR, __VA_ARGS__)
#define zs_log_warn(...) zs_log(ZS_LOG_WARN, __VA_ARGS__)
#define zs_log_info(...) zs_log(ZS_LOG_INFO, __VA_ARGS__)
#define zs_log_debug(...) zs_log(ZS_LOG_DEBUG, __VA_ARGS__)

/* Abort with file:line for broken internal invariants only (never for outside input). */
#define ZS_ASSERT(cond)                                                                     \
    do {                                                                                    \
        if (!(cond)) {                                                                      \
            fprintf(stderr, "zeroserve: assertion failed: %s (%s:%d)\n", #cond, __FILE__,   \
                    __LINE__);                                                              \
            abort();                                                                        \
        }                                                                                   \
    } while (0)

/* Propagate a failing return code. */
#define ZS_CHECK(expr)                                                                      \
    do {                                                                                    \
        int zs_check_rc_ = (expr);                                                          \
        if (zs_check_rc_ < 0) return zs_check_rc_;                                          \
    } while (0)

/* Allocation: these return NULL on failure (callers turn that into ZS_ENOMEM).
 * zs_aligned_alloc rounds size up to a multiple of align; free with free(). */
void *zs_aligned_alloc(size_t align, size_t size);

/* Monotonic clock in seconds. */
double zs_now(void);
/* The process's peak resident set (VmHWM of /proc/self/status), bytes; 0 if unknown. */
size_t zs_peak_rss_bytes(void);
/* Resets that peak to the current resident set (writes 5 to /proc/self/clear_refs); 0 or an
 * error code (no /proc, no permission). */
int zs_peak_rss_reset(void);

/* Overflow-checked size arithmetic: return 0 on success, ZS_ERANGE on overflow. */
int zs_mul_size(size_t a, size_t b, size_t *out);
int zs_add_size(size_t a, size_t b, size_t *out);

#define ZS_MIN(a, b) ((a) < (b) ? (a) : (b))
#define ZS_MAX(a, b) ((a) > (b) ? (a) : (b))
#define ZS_ALIGN_UP(x, a) (((x) + (a)-1) / (a) * (a))

#endif
