#!/bin/sh
# tests/gpu/run.sh — what a session with a GPU runs, in one call of the device tool, on a bare
# machine (CUDA's driver and libraries, no Debian build packages, no network):
#   run(command="OUT=$OUT sh tests/gpu/run.sh", carry=["gpu-kit"], timeout_s=540)
# after `make gpu-kit` here (tests/gpu/make-kit.sh: the programs built with nvcc, the shared
# libraries they need, the fixtures). Without gpu-kit/ it builds with make instead (a machine
# that has the packages). Steps, all inside one deadline (DEADLINE, default 500 s):
#   setup     the kit's programs and libraries; where the machine keeps libcuda, cuBLAS, NCCL
#   device    test-cuda: a CUDA device is visible (no device: status "no_device", exit 77)
#   fixtures  stories260K and gpt2-bytes must be there (missing on a machine with a device: a
#             failure, not a skip)
#   test-backend-ops   every CUDA kernel against the CPU op
#   test-embed  embedding rows looked up on the host (inference layout) against the old layout,
#             on the device too
#   tree-gpu  test-cuda-tree: token trees (speculative decoding) on the device: the tree attention
#             against the CPU op, the KV moves, a tree pass against each path decoded alone (it
#             prints how many rows differ in some bit: docs/gpu.md "what holds")
#   e2e-gpu   the fixtures' reference outputs on the device: f32/bf16 x ranks 1/2 x offload
#             none/cpu/nvme; a random model of every llama-family architecture (Llama with RoPE
#             scaling, Mistral, Qwen2, Qwen3, Gemma 2, Gemma 3, Phi-3) against the CPU engine
#   train-gpu test-train-cuda: the device trainer's pass against the CPU trainer (loss, every
#             bucket's gradient; stories260K f32/bf16/all-resident, gpt2-bytes) and 3 training
#             steps on a CUDA engine against a CPU engine (a kit without the program: a failure)
#   mkmodel   the 8B-shaped bf16 benchmark model, written in the background during the tests
#   bench-gpu bounds, offload-cpu decode at batch 1/8/32/128, resident decode, 2048-token prefill
# Each step gets min(its budget, the time left before the deadline); one that does not fit is
# recorded as skipped for lack of time. $OUT/gpu-summary.json is rewritten after every step, so
# a run killed from outside still says how far it got. Also writes $OUT/gpu-run.log (everything),
# $OUT/e2e.json, $OUT/bench.json, $OUT/mkmodel.log.
# Environment: OUT (default /tmp/zs-gpu-out), WORK (scratch for the model, ~16 GB of local disk,
# default /tmp/zs-gpu-work), KIT (default gpu-kit), BUILD (default build, without a kit),
# ZS_SHARED (fixtures), DEADLINE (seconds), QUICK=1 (fewer benchmark steps), SKIP_BENCH=1.
# Exit: 0 everything passed, 1 a step failed, 77 no CUDA device.
cd "$(dirname "$0")/../.." || exit 1
T0=$(date +%s)
DEADLINE=${DEADLINE:-500}
OUT=${OUT:-/tmp/zs-gpu-out}
WORK=${WORK:-/tmp/zs-gpu-work}
KIT=${KIT:-gpu-kit}
BUILD=${BUILD:-build}
mkdir -p "$OUT" "$WORK" || exit 1
LOG=$OUT/gpu-run.log
SUM=$OUT/gpu-summary.json
: > "$LOG"
rm -f "$OUT/e2e.json" "$OUT/bench.json" "$OUT/mkmodel.rc"
elapsed() { echo $(( $(date +%s) - T0 )); }
left() { echo $(( DEADLINE - $(elapsed) )); }
say() { echo "[gpu $(elapsed)s] $*" | tee -a "$LOG"; }
# json string escaping for short messages
jstr() { printf '"%s"' "$(printf '%s' "$1" | sed 's/\\/\\\\/g; s/"/\\"/g' | tr '\n\t' '  ')"; }
jfile() { if [ -s "$1" ]; then cat "$1"; else echo null; fi; }

status=running; device=""; steps=""; mode=""; message="started"; libs=""
write_summary() {
    {
        echo "{"
        echo " \"status\": $(jstr "$status"),"
        echo " \"mode\": $(jstr "$mode"),"
        echo " \"device\": $(jstr "$device"),"
        echo " \"message\": $(jstr "$message"),"
        echo " \"elapsed_s\": $(elapsed),"
        echo " \"deadline_s\": $DEADLINE,"
        echo " \"libraries\": $(jstr "$libs"),"
        echo " \"steps\": {$steps},"
        echo " \"e2e\": $(jfile "$OUT/e2e.json"),"
        echo " \"bench\": $(jfile "$OUT/bench.json")"
        echo "}"
    } > "$SUM.tmp" && mv "$SUM.tmp" "$SUM"
}
failed=0; device_seen=""
add_step() { # name rc seconds [note]
    steps="$steps${steps:+, }\"$1\": {\"rc\": $2, \"s\": $3${4:+, \"note\": $(jstr "$4")}}"
    case $2 in 0) ;; 77) [ -n "$device_seen" ] && failed=1;; *) failed=1;; esac # a skip with a device is a failure
    write_summary
}
finish() { # status message exit-code
    status=$1; message=$2
    write_summary
    say "summary: $SUM (status $status): $message"
    exit "$3"
}
run_step() { # name budget command...: runs with min(budget, time left - 5 s)
    name=$1; budget=$2; shift 2
    l=$(( $(left) - 5 ))
    [ "$l" -lt "$budget" ] && budget=$l
    if [ "$budget" -lt 10 ]; then
        say "$name: skipped, ${l}s left before the deadline"
        add_step "$name" 124 0 "no time left before the deadline"
        return 124
    fi
    s=$(date +%s)
    say "$name (budget ${budget}s): $*"
    timeout -k 5 "$budget" "$@" >>"$LOG" 2>&1
    rc=$?
    t=$(( $(date +%s) - s ))
    [ $rc = 124 ] && say "$name: stopped at its budget of ${budget}s"
    add_step "$name" $rc $t
    say "$name: exit $rc (${t}s)"
    return $rc
}
trap 'message="stopped by a signal"; status=killed; write_summary; exit 1' INT TERM
write_summary

# ---- setup: the kit, or a build ----
# the kit travels packed (make-kit.sh): unpacked here first
if [ -f "$KIT/kit.tar.gz" ] && [ ! -x "$KIT/bin/zeroserve" ]; then
    tar -xzf "$KIT/kit.tar.gz" -C "$KIT" || finish failed "cannot unpack $KIT/kit.tar.gz (tar and gzip)" 1
fi
if [ -x "$KIT/bin/zeroserve" ]; then
    mode=kit
    B=$KIT/bin
    say "kit: $(head -1 "$KIT/MANIFEST" 2>/dev/null)"
    export LD_LIBRARY_PATH="$PWD/$KIT/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    cp "$B/zeroserve" ./zeroserve || finish failed "cannot copy the kit's zeroserve" 1 # bench-gpu runs ./zeroserve
    add_step setup 0 0 "kit"
else
    mode=build
    export PATH="$PATH:/usr/local/cuda/bin"
    rm -f zeroserve
    if ! run_step build 300 make BUILD="$BUILD" CUDA=1 zeroserve "$BUILD/tests/test-cuda" \
            "$BUILD/tests/test-backend-ops" "$BUILD/tests/test-embed" "$BUILD/tests/test-train-cuda" \
            "$BUILD/tests/test-cuda-tree" \
            "$BUILD/tests/gpu/e2e-gpu" "$BUILD/tests/gpu/bench-gpu"; then
        tail -n 40 "$LOG"
        finish failed "no gpu-kit/ and the build failed (see gpu-run.log; make the kit with: make gpu-kit)" 1
    fi
    B=$BUILD/tests
    mkdir -p "$BUILD/kitview" && for p in test-cuda test-backend-ops test-embed test-train-cuda test-cuda-tree; do ln -sf "$PWD/$BUILD/tests/$p" "$BUILD/kitview/$p"; done
    for p in e2e-gpu bench-gpu; do ln -sf "$PWD/$BUILD/tests/gpu/$p" "$BUILD/kitview/$p"; done
    B=$BUILD/kitview
fi
# where the machine keeps the libraries loaded at run time (recorded for the next session)
findlib() { # name: the first match in the usual places
    for d in ${CUDA_HOME:+$CUDA_HOME/lib64} /usr/local/cuda/lib64 /usr/local/nvidia/lib64 /usr/local/nvidia/lib \
             /usr/lib/x86_64-linux-gnu /usr/lib64 /opt/*/.venv/lib/python3*/site-packages/nvidia/*/lib \
             /usr/local/lib/python3*/dist-packages/nvidia/*/lib; do
        [ -e "$d/$1" ] && { echo "$d/$1"; return 0; }
    done
    ldconfig -p 2>/dev/null | awk -v n="$1" '$1 == n { print $NF; exit }'
}
libcuda=$(findlib libcuda.so.1); libcublas=$(findlib libcublas.so.13); libnccl=$(findlib libnccl.so.2)
libs="libcuda: ${libcuda:-none}; cublas: ${libcublas:-none}; nccl: ${libnccl:-none}"
say "libraries: $libs"
# the driver's library where the loader may not look (a read-only mount, say)
[ -n "$libcuda" ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$libcuda")"
[ -n "$libcublas" ] && export ZS_CUBLAS_LIB=${ZS_CUBLAS_LIB:-$libcublas}
[ -n "$libnccl" ] && export ZS_NCCL_LIB=${ZS_NCCL_LIB:-$libnccl}
missing=$(for p in "$B"/*; do ldd "$p" 2>/dev/null | grep 'not found'; done | sort -u | tr '\n' ' ')
[ -z "$missing" ] || finish failed "unresolved libraries: $missing" 1
write_summary

# ---- device ----
command -v nvidia-smi >/dev/null 2>&1 && timeout 20 nvidia-smi >>"$LOG" 2>&1
s=$(date +%s)
timeout -k 5 60 "$B/test-cuda" >>"$LOG" 2>&1
rc=$?
if [ $rc = 77 ]; then
    add_step device 77 $(( $(date +%s) - s )) "no CUDA device visible"
    say "no CUDA device is visible (no driver or no GPU): the GPU tests and the benchmark need one; stopping"
    finish no_device "no CUDA device visible: the kit's programs started, nothing ran on a device" 77
fi
device_seen=1
add_step test-cuda $rc $(( $(date +%s) - s ))
device=$(grep -m1 '^device 0:' "$LOG" | sed 's/^device 0: //')
say "device 0: $device"

# ---- fixtures: required once a device is there ----
if [ -z "$ZS_SHARED" ]; then
    for d in "$KIT/shared" ../shared ./shared; do [ -f "$d/models/stories260K/config.json" ] && ZS_SHARED=$d && break; done
fi
if [ -z "$ZS_SHARED" ] || [ ! -f "$ZS_SHARED/models/stories260K/config.json" ] || [ ! -f "$ZS_SHARED/models/gpt2-bytes/config.json" ]; then
    add_step fixtures 1 0 "stories260K/gpt2-bytes not found"
    finish failed "fixtures not found (make gpu-kit copies them into gpu-kit/shared; or set ZS_SHARED)" 1
fi
export ZS_SHARED
add_step fixtures 0 0 "$ZS_SHARED"

# ---- the benchmark model, written while the tests run ----
MODEL=$WORK/llama8b
MKPID=""
if [ -z "$SKIP_BENCH" ] && [ ! -s "$MODEL/model.safetensors" ]; then
    say "writing the 8B bf16 benchmark model to $MODEL in the background"
    rm -rf "$MODEL"
    mk_budget=$(( $(left) - 150 ))
    [ "$mk_budget" -gt 300 ] && mk_budget=300
    if [ "$mk_budget" -ge 30 ]; then
        ( timeout -k 5 "$mk_budget" "$B/bench-gpu" mkmodel "$MODEL" > "$OUT/mkmodel.log" 2>&1; echo $? > "$OUT/mkmodel.rc" ) &
        MKPID=$!
    else
        echo 124 > "$OUT/mkmodel.rc"
    fi
elif [ -z "$SKIP_BENCH" ]; then
    echo 0 > "$OUT/mkmodel.rc"
fi

# ---- tests ----
export ZS_LOG=${ZS_LOG:-warn}
run_step test-backend-ops 150 "$B/test-backend-ops"
run_step test-embed 60 env TMPDIR="$WORK" "$B/test-embed"
run_step e2e-gpu 180 env TMPDIR="$WORK" "$B/e2e-gpu" "$OUT/e2e.json"
if [ -x "$B/test-cuda-tree" ]; then
    run_step tree-gpu 40 env TMPDIR="$WORK" "$B/test-cuda-tree"
    grep -E 'vs plain decoding' "$LOG" | tail -n 8
else
    say "tree-gpu: $B/test-cuda-tree is not in the kit (tests/gpu/make-kit.sh PROGS)"
    add_step tree-gpu 1 0 "test-cuda-tree is not in the kit"
fi
if [ -x "$B/test-train-cuda" ]; then
    run_step train-gpu 90 env TMPDIR="$WORK" "$B/test-train-cuda"
else
    say "train-gpu: $B/test-train-cuda is not in the kit (tests/gpu/make-kit.sh PROGS)"
    add_step train-gpu 1 0 "test-train-cuda is not in the kit"
fi

# ---- benchmark ----
if [ -z "$SKIP_BENCH" ]; then
    if [ -n "$MKPID" ]; then say "waiting for the benchmark model"; wait "$MKPID"; fi
    cat "$OUT/mkmodel.log" >>"$LOG" 2>/dev/null
    mrc=$(cat "$OUT/mkmodel.rc" 2>/dev/null || echo 1)
    add_step mkmodel "$mrc" 0
    if [ "$mrc" = 0 ]; then
        run_step bench-gpu 240 "$B/bench-gpu" run "$MODEL" "$OUT/bench.json" ${QUICK:+--quick}
        grep -E '^(pinned|device memory|bf16|offload|weight stream|resident|prefill)' "$LOG" | tail -n 12
    fi
fi
if [ $failed = 0 ]; then finish ok "done" 0; else finish failed "a step failed (see steps and gpu-run.log)" 1; fi
