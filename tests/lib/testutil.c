/* testutil.c — the counters of testutil.h's CHECK (one pair per test program, shared by the test
 * and the tests/lib helpers it calls) and TCHECK, the check of several threads. */
#include "testutil.h"

#include <pthread.h>
#include <stdarg.h>

int tu_failures = 0;
int tu_checks = 0;
char tu_fail_tag[64] = "";

static pthread_mutex_t tu_lock = PTHREAD_MUTEX_INITIALIZER;

void tu_check_locked(int ok, const char *file, int line, const char *cond, const char *fmt, ...) {
    pthread_mutex_lock(&tu_lock);
    tu_checks++;
    if (!ok) {
        tu_failures++;
        fprintf(stderr, "FAIL %s%s:%d: %s: ", tu_fail_tag, file, line, cond);
        va_list ap;
        va_start(ap, fmt);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
        fputc('\n', stderr);
    }
    pthread_mutex_unlock(&tu_lock);
}
