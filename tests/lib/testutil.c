/* testutil.c — the counters of testutil.h's CHECK: one pair per test program, shared by the test
 * and the tests/lib helpers it calls. */
#include "testutil.h"

int tu_failures = 0;
int tu_checks = 0;
