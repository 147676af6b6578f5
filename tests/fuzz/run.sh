#!/bin/sh
# Runs the libFuzzer harnesses built by `make fuzz-build` ($BUILD/fuzz/fuzz-NAME):
#   1. every kept crash input in tests/fuzz/regress/NAME/ once (the regression tests);
#   2. fuzzing for FUZZ_TIME seconds (FUZZ_SEED fixes libFuzzer's seed), starting from the
#      committed seeds tests/fuzz/corpus/NAME/ and the fixtures that tests/fuzz/fuzz-NAME.seeds
#      lists (paths under $ZS_SHARED). New inputs go to a work corpus ($FUZZ_WORK/NAME; make fuzz
#      keeps it between runs), a crash to $BUILD/fuzz/crash-NAME-*; tests/fuzz/fuzz-NAME.options
#      holds extra libFuzzer flags (one line, e.g. -max_len=...).
# Prints one line per harness (executions, corpus size, findings) and exits 1 on any finding.
# Used by `make fuzz` (FUZZ_TIME=60) and tests/e2e-fuzz.sh in `make test` (a few seconds each).
BUILD=${BUILD:-build}
FUZZ_TIME=${FUZZ_TIME:-60}
ZS_SHARED=${ZS_SHARED:-../shared}
FUZZ_WORK=${FUZZ_WORK:-$BUILD/fuzz/work}
export ZS_LOG=${ZS_LOG_FUZZ:-error}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
logdir=$BUILD/fuzz/logs
mkdir -p "$logdir" "$FUZZ_WORK"
found=0; total=0; nh=0
for bin in "$BUILD"/fuzz/fuzz-*; do
    [ -x "$bin" ] && [ -f "$bin" ] || continue
    name=${bin##*/fuzz-}
    [ -n "$FUZZ_NAMES" ] && case " $FUZZ_NAMES " in *" $name "*) ;; *) continue;; esac
    nh=$((nh+1))
    opts=""
    [ -f "tests/fuzz/fuzz-$name.options" ] && opts=$(cat "tests/fuzz/fuzz-$name.options")
    # 1. regressions: each kept input runs once and must not crash
    nreg=0
    if [ -d "tests/fuzz/regress/$name" ]; then
        set -- tests/fuzz/regress/"$name"/*
        if [ -e "$1" ]; then
            nreg=$#
            # shellcheck disable=SC2086
            if ! timeout 300 "$bin" $opts "$@" >"$logdir/$name-regress.log" 2>&1; then
                echo "fuzz-$name: a regression input crashes again (log: $logdir/$name-regress.log)"
                grep -m3 -E "ERROR|runtime error|SUMMARY" "$logdir/$name-regress.log" | sed 's/^/    /'
                found=$((found+1))
                continue
            fi
        fi
    fi
    # 2. fuzzing from the seeds
    work=$FUZZ_WORK/$name
    mkdir -p "$work"
    seeds=""
    [ -d "tests/fuzz/corpus/$name" ] && seeds="tests/fuzz/corpus/$name"
    if [ -f "tests/fuzz/fuzz-$name.seeds" ]; then
        while read -r f; do
            case $f in ''|'#'*) continue;; esac
            [ -f "$ZS_SHARED/$f" ] && cp "$ZS_SHARED/$f" "$work/seed-$(echo "$f" | tr '/' '_')" 2>/dev/null
        done < "tests/fuzz/fuzz-$name.seeds"
    fi
    seedopt=""
    [ -n "$FUZZ_SEED" ] && seedopt="-seed=$FUZZ_SEED"
    start=$(date +%s)
    # shellcheck disable=SC2086
    timeout $((FUZZ_TIME + 120)) "$bin" $opts $seedopt -max_total_time="$FUZZ_TIME" -timeout=20 -rss_limit_mb=4096 \
        -print_final_stats=1 -artifact_prefix="$BUILD/fuzz/crash-$name-" "$work" $seeds >"$logdir/$name.log" 2>&1
    rc=$?
    t=$(( $(date +%s) - start ))
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$logdir/$name.log" | tail -1)
    units=$(find "$work" -type f | wc -l)
    total=$((total + ${execs:-0}))
    if [ $rc -ne 0 ]; then
        found=$((found+1))
        art=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$logdir/$name.log" | tail -1)
        echo "fuzz-$name: FINDING after ${t}s (exit $rc): ${art:-see $logdir/$name.log}"
        grep -m3 -E "ERROR|runtime error|SUMMARY" "$logdir/$name.log" | sed 's/^/    /'
    else
        echo "fuzz-$name: ${execs:-?} executions in ${t}s, corpus $units inputs, $nreg regression inputs pass, no findings"
    fi
done
[ "$nh" = 0 ] && { echo "no fuzz harnesses built in $BUILD/fuzz (make fuzz-build)"; exit 77; }
echo "fuzz: $nh harnesses, $total executions, $found with findings"
[ "$found" = 0 ]
