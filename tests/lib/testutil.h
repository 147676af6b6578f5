/* testutil.h — tiny shared helpers for the test programs: checks that count failures, the path
 * of the shared fixtures, reading reference.json, and a scratch directory.
 * A test program exits 0 when every check passed, 1 otherwise, 77 to skip. The counters live in
 * testutil.c (tests/lib/libtu.a, linked into every test program), so that the checks of the other
 * tests/lib files count with the program's own. */
#ifndef ZS_TESTUTIL_H
#define ZS_TESTUTIL_H

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* checks made and failed so far (plain ints: a test that checks from several threads locks around them) */
extern int tu_failures;
extern int tu_checks;

#define CHECK(cond, ...)                                                                   \
    do {                                                                                   \
        tu_checks++;                                                                       \
        if (!(cond)) {                                                                     \
            tu_failures++;                                                                 \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                \
            fprintf(stderr, __VA_ARGS__);                                                  \
            fputc('\n', stderr);                                                           \
        }                                                                                  \
    } while (0)

/* Check that rc is an error and that the thread's error message contains every needle. */
#define CHECK_ERR(rc, ...)                                                                 \
    do {                                                                                   \
        const char *tu_needles_[] = {__VA_ARGS__, NULL};                                   \
        CHECK((rc) < 0, "expected an error, got %d", (int)(rc));                           \
        for (int tu_i_ = 0; tu_needles_[tu_i_]; tu_i_++)                                   \
            CHECK(strstr(zs_errmsg(), tu_needles_[tu_i_]) != NULL,                         \
                  "error message \"%s\" lacks \"%s\"", zs_errmsg(), tu_needles_[tu_i_]);   \
    } while (0)

/* CHECK from several threads at once: the condition is evaluated first (it may be a collective),
 * then the counters are updated and a failure printed under one lock (testutil.c). A failure line
 * starts with "FAIL " and tu_fail_tag (empty unless the test sets it, e.g. "[process 1] "). */
extern char tu_fail_tag[64];
void tu_check_locked(int ok, const char *file, int line, const char *cond, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
#define TCHECK(cond, ...) tu_check_locked((cond) ? 1 : 0, __FILE__, __LINE__, #cond, __VA_ARGS__)

static inline int tu_finish(const char *name) {
    fprintf(stderr, "%s: %d checks, %d failed\n", name, tu_checks, tu_failures);
    return tu_failures ? 1 : 0;
}

/* Directory of the shared fixtures: $ZS_SHARED or ../shared. */
static inline const char *tu_shared(void) {
    const char *s = getenv("ZS_SHARED");
    return s && *s ? s : "../shared";
}

/* Fills buf with "<shared>/models/<name>"; returns buf. */
static inline char *tu_model_dir(char *buf, size_t n, const char *name) {
    snprintf(buf, n, "%s/models/%s", tu_shared(), name);
    return buf;
}

/* Loads <model dir>/reference.json (NULL + message on failure). */
static inline json_t *tu_load_reference(const char *dir) {
    char p[4200];
    snprintf(p, sizeof p, "%.4000s/reference.json", dir);
    json_error_t e;
    json_t *j = json_load_file(p, 0, &e);
    if (!j) fprintf(stderr, "cannot load %s: %s\n", p, e.text);
    return j;
}

/* Creates a fresh scratch directory under $TMPDIR (or /tmp); fills buf. 0 on success. */
static inline int tu_tmpdir(char *buf, size_t n, const char *tag) {
    const char *t = getenv("TMPDIR");
    snprintf(buf, n, "%s/zs-%s-XXXXXX", t && *t ? t : "/tmp", tag);
    return mkdtemp(buf) ? 0 : -1;
}

/* rm -rf of a scratch directory made by tu_tmpdir. */
static inline void tu_rmdir(const char *dir) {
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", dir);
}

/* Writes len bytes to path; 0 on success. */
static inline int tu_write_file(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(data, 1, len, f);
    return (fclose(f) == 0 && w == len) ? 0 : -1;
}

/* |a-b| <= atol + rtol*|b| */
static inline int tu_close(double a, double b, double atol, double rtol) {
    return fabs(a - b) <= atol + rtol * fabs(b);
}

#endif
