/* audit.c — the audit log (audit.h): JSON lines appended with one write(2) each. */
#define _GNU_SOURCE
#include "audit.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "common.h"

struct zs_audit {
    int fd, warned;
    char *path;
};

int zs_audit_open(const char *path, zs_audit **out) {
    zs_audit *a = calloc(1, sizeof *a);
    if (!a || !(a->path = strdup(path))) {
        free(a);
        return zs_err(ZS_ENOMEM, "out of memory");
    }
    a->fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (a->fd < 0) {
        int rc = zs_err(ZS_EIO, "audit log %s: cannot open it (%s)", path, strerror(errno));
        free(a->path);
        free(a);
        return rc;
    }
    *out = a;
    return 0;
}

void zs_audit_close(zs_audit *a) {
    if (!a) return;
    close(a->fd);
    free(a->path);
    free(a);
}

const char *zs_audit_path(const zs_audit *a) { return a ? a->path : NULL; }

/* A client's bytes may not be UTF-8: keep printable ASCII, '?' for the rest. */
static json_t *str_or_null(const char *s) {
    if (!s) return json_null();
    json_t *j = json_string(s);
    if (j) return j;
    char *c = strdup(s);
    if (!c) return json_null();
    for (char *p = c; *p; p++)
        if ((unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7f) *p = '?';
    j = json_string(c);
    free(c);
    return j ? j : json_null();
}

int zs_audit_write(zs_audit *a, const zs_audit_rec *rec) {
    if (!a) return 0;
    struct timeval tv;
    gettimeofday(&tv, NULL);
    struct tm tm;
    gmtime_r(&tv.tv_sec, &tm);
    char ts[64];
    snprintf(ts, sizeof ts, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
             tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(tv.tv_usec / 1000));
    const char *result = rec->result ? rec->result : rec->status < 400 ? "ok" : "error";
    json_t *j = json_pack("{s:s,s:o,s:o,s:o,s:o,s:o,s:i,s:o}", "time", ts, "tenant", str_or_null(rec->tenant), "role",
                          str_or_null(rec->role), "remote", str_or_null(rec->remote), "method", str_or_null(rec->method),
                          "path", str_or_null(rec->path), "status", rec->status, "result", str_or_null(result));
    if (j && rec->object) json_object_set_new(j, "object", str_or_null(rec->object));
    char *line = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!line) return zs_err(ZS_ENOMEM, "audit log: out of memory");
    size_t n = strlen(line);
    line[n] = '\n'; /* json_dumps's NUL becomes the line's end */
    ssize_t w = write(a->fd, line, n + 1);
    int e = errno;
    free(line);
    if (w == (ssize_t)(n + 1)) return 0;
    /* a short append leaves a torn line: the next line still starts after it */
    if (!__atomic_exchange_n(&a->warned, 1, __ATOMIC_RELAXED))
        zs_log_error("audit log %s: cannot append (%s); actions are no longer recorded there", a->path,
                     w < 0 ? strerror(e) : "short write");
    return zs_err(ZS_EIO, "audit log %s: cannot append", a->path);
}
