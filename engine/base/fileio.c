/* fileio.c — file-system helpers shared by the shard store and the checkpoints. */
#define _GNU_SOURCE
#include "fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"

int zs_errno_code(int e) {
    switch (e) {
    case ENOENT:
    case ENOTDIR: return ZS_ENOTFOUND;
    case EACCES:
    case EPERM:
    case EROFS: return ZS_EPERM;
    case ENOSPC:
    case EDQUOT: return ZS_ENOSPC;
    case ENOMEM: return ZS_ENOMEM;
    default: return ZS_EIO;
    }
}

char *zs_str_printf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    int n = vasprintf(&s, fmt, ap);
    va_end(ap);
    return n < 0 ? NULL : s;
}

int zs_fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return zs_err(zs_errno_code(e), "%s: cannot open directory to fsync: %s", dir, strerror(e));
    }
    int rc = 0;
    if (fsync(fd) != 0 && errno != EINVAL && errno != EROFS) {
        int e = errno;
        rc = zs_err(ZS_EIO, "%s: fsync of directory failed: %s", dir, strerror(e));
    }
    close(fd);
    return rc;
}

int zs_write_file_atomic(const char *path, const void *data, size_t n) {
    char *tmp = zs_str_printf("%s.tmp", path);
    if (!tmp) return zs_err(ZS_ENOMEM, "out of memory");
    int rc = 0, fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        int e = errno;
        rc = zs_err(zs_errno_code(e), "%s: cannot create: %s", tmp, strerror(e));
    } else {
        int w = zs_pwrite_all(fd, data, n, 0);
        if (w == 0 && fsync(fd) != 0) w = -errno;
        if (close(fd) != 0 && w == 0) w = -errno;
        if (w < 0) rc = zs_err(zs_errno_code(-w), "%s: cannot write: %s", tmp, strerror(-w));
        else if (rename(tmp, path) != 0) {
            int e = errno;
            rc = zs_err(zs_errno_code(e), "%s: cannot rename into place: %s", path, strerror(e));
        }
        if (rc < 0) unlink(tmp);
    }
    if (rc == 0) {
        char *dir = zs_str_printf("%s", path), *sl = dir ? strrchr(dir, '/') : NULL;
        if (sl) *sl = 0;
        rc = dir ? zs_fsync_dir(sl ? (*dir ? dir : "/") : ".") : zs_err(ZS_ENOMEM, "out of memory");
        free(dir);
    }
    free(tmp);
    return rc;
}

int zs_pwrite_all(int fd, const void *buf, size_t n, off_t off) {
    const unsigned char *p = buf;
    while (n > 0) {
        ssize_t w = pwrite(fd, p, ZS_MIN(n, (size_t)1 << 30), off);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        if (w == 0) return -EIO;
        p += w;
        n -= (size_t)w;
        off += w;
    }
    return 0;
}

int zs_mkdir_p(const char *path) {
    char p[4096];
    if (snprintf(p, sizeof p, "%s", path) >= (int)sizeof p) return zs_err(ZS_EINVAL, "%s: path too long", path);
    for (char *s = p + 1;; s++) {
        if (*s != '/' && *s != 0) continue;
        char c = *s;
        *s = 0;
        if (mkdir(p, 0755) != 0 && errno != EEXIST) {
            int e = errno;
            return zs_err(zs_errno_code(e), "cannot create %s: %s", p, strerror(e));
        }
        *s = c;
        if (!c) break;
    }
    return 0;
}
