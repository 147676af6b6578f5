#!/bin/sh
# The libFuzzer harnesses (tests/fuzz/) in `make test`: every kept crash input once, then a few
# seconds of fuzzing each from the committed seeds with a fixed seed (tests/fuzz/run.sh).
# Skips (77) where clang with libFuzzer is not installed; `make fuzz` runs them for longer.
BUILD=${BUILD:-build}
set -- "$BUILD"/fuzz/fuzz-*
[ -x "$1" ] || { echo "no fuzz harnesses built (clang with libFuzzer missing)"; exit 77; }
work=$(mktemp -d /tmp/zs-fuzz.XXXXXX) || exit 1
FUZZ_TIME=${FUZZ_SMOKE_TIME:-3} FUZZ_SEED=${FUZZ_SEED:-1} FUZZ_WORK=$work sh tests/fuzz/run.sh
rc=$?
rm -rf "$work"
exit $rc
