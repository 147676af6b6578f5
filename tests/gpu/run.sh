#!/bin/sh
# tests/gpu/run.sh — what a session with a GPU runs: builds the CUDA part, then runs the GPU tests
# and the GPU benchmark on CUDA device 0, in under 6 minutes on one H200. Writes
#   $OUT/gpu-run.log        everything (build, tests, benchmark)
#   $OUT/gpu-summary.json   status, device, per-step exit codes and times, the e2e and bench JSON
#   $OUT/e2e.json, $OUT/bench.json, $OUT/mkmodel.log
# Steps: build (make, nvcc for sm_80 and sm_90) -> device check (stops here without a device:
# status "no_device", exit 77) -> the 8B bf16 benchmark model is written in the background
# (bench-gpu mkmodel; $WORK/llama8b is reused when present) -> test-backend-ops (every kernel
# against the CPU op) and test-cuda -> e2e-gpu (stories260K and gpt2-bytes: f32/bf16 x ranks 1/2 x
# offload none/cpu/nvme against the reference) -> bench-gpu (bounds, offload-cpu decode at batch
# 1/8/32/128, resident decode and 2048-token prefill).
# Environment: OUT (default /tmp/zs-gpu-out), WORK (scratch for the model, default
# /tmp/zs-gpu-work: local disk, ~16 GB), BUILD (default build), ZS_SHARED (fixtures; default
# ../shared or ./shared), JOBS (make -j), QUICK=1 (fewer benchmark steps), SKIP_BENCH=1.
# Exit: 0 everything passed, 1 a step failed, 77 no CUDA device.
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp/zs-gpu-out}
WORK=${WORK:-/tmp/zs-gpu-work}
BUILD=${BUILD:-build}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 4)}
mkdir -p "$OUT" "$WORK" || exit 1
LOG=$OUT/gpu-run.log
SUM=$OUT/gpu-summary.json
: > "$LOG"
T0=$(date +%s)
say() { echo "[gpu $(( $(date +%s) - T0 ))s] $*" | tee -a "$LOG"; }
# json string escaping for short messages
jstr() { printf '"%s"' "$(printf '%s' "$1" | sed 's/\\/\\\\/g; s/"/\\"/g' | tr '\n\t' '  ')"; }
jfile() { if [ -s "$1" ]; then cat "$1"; else echo null; fi; }

status=ok; device=""; steps=""
add_step() { # name rc seconds
    steps="$steps${steps:+, }\"$1\": {\"rc\": $2, \"s\": $3}"
    case $2 in 0|77) ;; *) status=failed;; esac
}
write_summary() {
    {
        echo "{"
        echo " \"status\": $(jstr "$status"),"
        echo " \"device\": $(jstr "$device"),"
        echo " \"message\": $(jstr "$1"),"
        echo " \"elapsed_s\": $(( $(date +%s) - T0 )),"
        echo " \"steps\": {$steps},"
        echo " \"e2e\": $(jfile "$OUT/e2e.json"),"
        echo " \"bench\": $(jfile "$OUT/bench.json")"
        echo "}"
    } > "$SUM"
    say "summary: $SUM (status $status)"
}
run_step() { # name timeout command...
    name=$1; to=$2; shift 2
    s=$(date +%s)
    say "$name: $*"
    timeout "$to" "$@" >>"$LOG" 2>&1
    rc=$?
    t=$(( $(date +%s) - s ))
    add_step "$name" $rc $t
    say "$name: exit $rc (${t}s)"
    return $rc
}

# ---- build ----
export PATH="$PATH:/usr/local/cuda/bin"
rm -f zeroserve  # relinked from $BUILD (the binary does not depend on which build dir made it)
rm -f "$OUT/e2e.json" "$OUT/bench.json"
if ! run_step build 400 make BUILD="$BUILD" CUDA=1 -j"$JOBS" zeroserve "$BUILD/tests/test-cuda" \
        "$BUILD/tests/test-backend-ops" "$BUILD/tests/gpu/e2e-gpu" "$BUILD/tests/gpu/bench-gpu"; then
    tail -n 40 "$LOG"
    write_summary "the build failed (see gpu-run.log)"
    exit 1
fi

# ---- device ----
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >>"$LOG" 2>&1
"$BUILD/tests/test-cuda" >>"$LOG" 2>&1
rc=$?
if [ $rc = 77 ]; then
    status=no_device
    say "no CUDA device is visible (no driver or no GPU): the GPU tests and the benchmark need one; stopping"
    add_step device 77 0
    write_summary "no CUDA device visible: built and linked, nothing run on a device"
    exit 77
fi
add_step test-cuda $rc 0
device=$(grep -m1 '^device 0:' "$LOG" | sed 's/^device 0: //')
say "device 0: $device"

# ---- the benchmark model, written while the tests run ----
MODEL=$WORK/llama8b
if [ -z "$SKIP_BENCH" ] && [ ! -s "$MODEL/model.safetensors" ]; then
    say "writing the 8B bf16 benchmark model to $MODEL in the background"
    rm -rf "$MODEL"
    ( timeout 400 "$BUILD/tests/gpu/bench-gpu" mkmodel "$MODEL" > "$OUT/mkmodel.log" 2>&1; echo $? > "$OUT/mkmodel.rc" ) &
    MKPID=$!
else
    echo 0 > "$OUT/mkmodel.rc"
    MKPID=""
fi

# ---- tests ----
export ZS_LOG=${ZS_LOG:-warn}
if [ -z "$ZS_SHARED" ]; then
    for d in ../shared ./shared; do [ -d "$d/models/stories260K" ] && ZS_SHARED=$d && break; done
fi
export ZS_SHARED
run_step test-backend-ops 180 "$BUILD/tests/test-backend-ops"
if [ -n "$ZS_SHARED" ] && [ -d "$ZS_SHARED/models/stories260K" ]; then
    run_step e2e-gpu 300 env TMPDIR="$WORK" "$BUILD/tests/gpu/e2e-gpu" "$OUT/e2e.json"
else
    say "e2e-gpu: fixtures not found (set ZS_SHARED, or put them in ./shared/models); skipped"
    add_step e2e-gpu 77 0
fi

# ---- benchmark ----
if [ -z "$SKIP_BENCH" ]; then
    if [ -n "$MKPID" ]; then say "waiting for the benchmark model"; wait "$MKPID"; fi
    cat "$OUT/mkmodel.log" >>"$LOG" 2>/dev/null
    mrc=$(cat "$OUT/mkmodel.rc" 2>/dev/null || echo 1)
    add_step mkmodel "$mrc" 0
    if [ "$mrc" = 0 ]; then
        run_step bench-gpu 360 "$BUILD/tests/gpu/bench-gpu" run "$MODEL" "$OUT/bench.json" ${QUICK:+--quick}
        grep -E '^(pinned|device memory|bf16|offload|weight stream|resident|prefill)' "$LOG" | tail -n 12
    fi
fi
write_summary "done"
[ "$status" = ok ]
