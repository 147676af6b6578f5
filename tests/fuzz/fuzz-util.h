/* fuzz-util.h — what the libFuzzer harnesses that feed path-taking readers share: a scratch
 * directory of their own under /dev/shm, writing one part of an input into it as a file, and
 * emptying it. Header-only (static inline functions), for tests/fuzz/fuzz-*.c; not thread-safe (a
 * harness runs one input at a time). Failures of the scratch directory itself are not findings:
 * they abort, which libFuzzer reports as a crash, so that a full /dev/shm is not taken for a
 * quiet pass. */
#ifndef ZS_FUZZ_UTIL_H
#define ZS_FUZZ_UTIL_H

#include <dirent.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* makes /dev/shm/zs-fuzz-NAME-XXXXXX into dir (cap bytes) */
static inline void fz_scratch_make(char *dir, size_t cap, const char *name) {
    snprintf(dir, cap, "/dev/shm/zs-fuzz-%s-XXXXXX", name);
    if (!mkdtemp(dir)) {
        perror("fuzz: mkdtemp under /dev/shm");
        abort();
    }
}

/* writes n bytes of d as dir/name (replacing it); d NULL removes dir/name instead */
static inline void fz_write(const char *dir, const char *name, const void *d, size_t n) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (!d) {
        unlink(path);
        return;
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) abort();
    const char *p = d;
    size_t off = 0;
    while (off < n) {
        ssize_t w = write(fd, p + off, n - off);
        if (w <= 0) abort();
        off += (size_t)w;
    }
    close(fd);
}

/* removes every file in dir (not recursive); keeps dir */
static inline void fz_empty(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[512];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
}

/* empties dir and removes it */
static inline void fz_remove(const char *dir) {
    fz_empty(dir);
    rmdir(dir);
}

#endif
