/* persist.c — the small persistence helpers of the fine-tuning API (finetune-api.h): mkdir -p,
 * atomic writes (tmp + fsync + rename + directory fsync), whole-file reads and random ids. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "finetune-api.h"

int zs_persist_mkdirs(const char *path) {
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) return zs_err(ZS_EINVAL, "path too long: %s", path);
    for (char *p = buf + 1;; p++) {
        if (*p == '/' || *p == '\0') {
            char c = *p;
            *p = '\0';
            if (mkdir(buf, 0755) < 0 && errno != EEXIST)
                return zs_err(ZS_EIO, "cannot create directory %s: %s", buf, strerror(errno));
            *p = c;
            if (!c) break;
        }
    }
    return 0;
}

int zs_persist_write(const char *path, const void *data, size_t len) {
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) return zs_err(ZS_EINVAL, "path too long: %s", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return zs_err(ZS_EIO, "cannot create %s: %s", tmp, strerror(errno));
    const char *p = data;
    size_t left = len;
    while (left) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = errno;
            close(fd);
            unlink(tmp);
            return zs_err(e == ENOSPC ? ZS_ENOSPC : ZS_EIO, "cannot write %s: %s", tmp, strerror(e));
        }
        p += w;
        left -= (size_t)w;
    }
    if (fsync(fd) < 0 || close(fd) < 0) {
        unlink(tmp);
        return zs_err(ZS_EIO, "cannot sync %s: %s", tmp, strerror(errno));
    }
    if (rename(tmp, path) < 0) {
        unlink(tmp);
        return zs_err(ZS_EIO, "cannot rename %s: %s", tmp, strerror(errno));
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    int dfd = open(dirname(dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    return 0;
}

int zs_persist_write_json(const char *path, const json_t *j) {
    char *s = json_dumps(j, JSON_INDENT(1));
    if (!s) return zs_err(ZS_ENOMEM, "out of memory");
    size_t n = strlen(s);
    int rc = zs_persist_write(path, s, n);
    free(s);
    return rc;
}

int zs_persist_read(const char *path, char **out, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return zs_err(errno == ENOENT ? ZS_ENOTFOUND : ZS_EIO, "cannot open %s: %s", path, strerror(errno));
    size_t cap = 4096, n = 0;
    char *b = malloc(cap);
    for (;;) {
        if (!b) break;
        n += fread(b + n, 1, cap - n - 1, f);
        if (n < cap - 1) break;
        char *nb = realloc(b, cap *= 2);
        if (!nb) {
            free(b);
            b = NULL;
        } else {
            b = nb;
        }
    }
    int err = ferror(f);
    fclose(f);
    if (!b) return zs_err(ZS_ENOMEM, "out of memory reading %s", path);
    if (err) {
        free(b);
        return zs_err(ZS_EIO, "cannot read %s", path);
    }
    b[n] = '\0';
    *out = b;
    if (len) *len = n;
    return 0;
}

void zs_persist_new_id(const char *prefix, char *out, size_t cap) {
    unsigned char b[12];
    if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b) {
        uint64_t x = (uint64_t)(zs_now() * 1e9) ^ (uint64_t)(uintptr_t)out;
        for (size_t i = 0; i < sizeof b; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            b[i] = (unsigned char)(x >> 56);
        }
    }
    char hex[25];
    for (size_t i = 0; i < sizeof b; i++) sprintf(hex + 2 * i, "%02x", b[i]);
    snprintf(out, cap, "%s%s", prefix, hex);
}
