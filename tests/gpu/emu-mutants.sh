#!/bin/sh
# tests/gpu/emu-mutants.sh — does the emulated device catch the bugs it is there for? Each mutant
# is a one-line bug put into a copy of the tree (the kernels, the CUDA runtime calls, NCCL); the
# GPU test named with it is built for the emulated device (tests/gpu/emu) and run, and must fail.
# A mutant that every test survives is a hole in the emulator or the tests: the script exits 1.
# Not part of `make test` (about 20-30 min on 2 cores: each mutant rebuilds one file and runs one
# test); run it after changing the emulator or the GPU tests:
#   sh tests/gpu/emu-mutants.sh            every mutant
#   sh tests/gpu/emu-mutants.sh NAME...    some (names in the table below)
# Needs a built tree (make test, or at least make build/emu/tests/<test>), and ../shared.
# Exit 0: every mutant failed its test; 1: one survived (or could not be applied/built).
set -u
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
BUILD=${BUILD:-build}
SHARED=${ZS_SHARED:-$ROOT/../shared}
[ -x "$BUILD/emu/tests/test-backend-ops" ] || { echo "build the emulated device's tests first (make test)"; exit 1; }

# name | file | occurrence of the line | the line's text (a fixed string) | what it becomes | test
# (Not here because no test can catch them, the code being right without them: the ready event of
# an NCCL gather, whose caller waits for the comm stream anyway; the synchronisation after the
# logits' copy, whose destination is pageable memory, which CUDA copies into synchronously.)
MUTANTS='attn-off-by-one|kernels/cuda/attention.cu|1|for (int j = j0 + warp; j <= p; j += ATT_WARPS) {|for (int j = j0 + warp; j < p; j += ATT_WARPS) {|test-backend-ops
no-syncthreads|kernels/cuda/dtype.cuh|2|    __syncthreads();|    ;|test-backend-ops
shfl-mask|kernels/cuda/dtype.cuh|1|v += __shfl_xor_sync(0xffffffffu, v, o);|v += __shfl_xor_sync(0x0000ffffu, v, o);|test-backend-ops
no-wait-event|engine/runtime/gather-cuda.c|1|if (rc == 0) rc = cu(cudaStreamWaitEvent(d->q[ZS_Q_COMPUTE], ev->ready, 0), d,|if (rc == 1) rc = cu(cudaStreamWaitEvent(d->q[ZS_Q_COMPUTE], ev->ready, 0), d,|e2e-gpu
read-before-sync|engine/comm/comm-nccl.c|1|ZS_CHECK(wait_on(c, c->stream, "agree"));|(void)0;|test-train-cuda
smem-size|kernels/cuda/attention.cu|1|(TL_R * D + 2 * TL_BK * D) * sizeof(float); }|(TL_R * D + 2 * TL_BK * D) * sizeof(__nv_bfloat16); }|test-backend-ops
launch-2048|kernels/cuda/backward.cu|1|ZS_LAUNCH(xent_kernel, T, 1024, 0, s,|ZS_LAUNCH(xent_kernel, T, 2048, 0, s,|test-backend-ops
warp-sum-half|kernels/cuda/dtype.cuh|1|for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync|for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync|test-backend-ops
qgemv-shuffle|kernels/cuda/matmul-quant.cu|1|v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, 4));|v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, 2));|test-backend-ops
kv-store-offset|kernels/cuda/attention.cu|1|size_t kd = (size_t)off[t], vd = kd + (size_t)ZS_KV_BLK * kvd;|size_t kd = (size_t)off[t] + 1, vd = kd + (size_t)ZS_KV_BLK * kvd;|test-backend-ops
rope-pair|kernels/cuda/rope.cu|1|float a = v[i], b = v[i + half];|float a = v[i], b = v[i + half - 1];|test-backend-ops
no-wait-copied|engine/runtime/gather-cuda.c|1|if (rc == 0) rc = cu(cudaStreamWaitEvent(mq, ev->copied, 0), d,|if (rc == 1) rc = cu(cudaStreamWaitEvent(mq, ev->copied, 0), d,|e2e-gpu
embed-row|kernels/cuda/embed.cu|1|size_t row = (size_t)ids[t], prow|size_t row = (size_t)ids[t] + 1, prow|test-embed
nccl-short-gather|engine/comm/comm-nccl.c|1|nc.ncclAllGather(send, recv, bytes, ncclInt8|nc.ncclAllGather(send, recv, bytes / 2, ncclInt8|e2e-gpu
grad-read-before-sync|engine/train/backward-cuda.c|1|ZS_CHECK(sync(t, "gradient download"));|(void)0;|test-train-cuda
shfl-max-mask|kernels/cuda/dtype.cuh|1|v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));|v = fmaxf(v, __shfl_xor_sync(0xfffffffeu, v, o));|test-backend-ops'

W=$(mktemp -d /tmp/zs-mutants.XXXXXX) || exit 1
trap 'rm -rf "$W"' EXIT INT TERM
echo "copying the tree and its build to $W"
mkdir -p "$W/src"
git ls-files -co --exclude-standard | grep -v '^build/' | tar -cf - -T - | (cd "$W/src" && tar -xf -) || exit 1
(cd "$BUILD" && tar -cf - --exclude=./asan --exclude=./fuzz --exclude=./test-logs --exclude=./emu/asan .) |
    (mkdir -p "$W/src/build" && cd "$W/src/build" && tar -xf -) || exit 1

# mutate FILE N OLD NEW: the Nth line containing OLD gets OLD replaced by NEW; 1 if no such line
mutate() {
    awk -v n="$2" -v old="$3" -v new="$4" '
        !done && index($0, old) { if (++k == n) { i = index($0, old); $0 = substr($0, 1, i - 1) new substr($0, i + length(old)); done = 1 } }
        { print }
        END { exit done ? 0 : 1 }' "$1" > "$1.mut" && mv "$1.mut" "$1"
}

only=" $* "
total=0; caught=0; survived=""
echo "$MUTANTS" | while IFS='|' read -r name file occ old new test; do
    [ "$only" = "  " ] || case $only in *" $name "*) ;; *) continue;; esac
    echo "$name|$file|$occ|$old|$new|$test"
done > "$W/list"
while IFS='|' read -r name file occ old new test; do
    total=$((total + 1))
    f="$W/src/$file"
    cp "$f" "$W/orig"
    if ! mutate "$f" "$occ" "$old" "$new"; then
        echo "SURVIVED  $name: the line to mutate is not in $file (update this script)"
        survived="$survived $name"; continue
    fi
    if ! make -C "$W/src" --no-print-directory "build/emu/tests/$test" > "$W/$name.build" 2>&1; then
        echo "CAUGHT    $name ($file): it does not build"; caught=$((caught + 1))
    else
        start=$(date +%s)
        (cd "$W/src" && ZS_SHARED=$SHARED ZS_LOG=warn ZS_DEVICE=cpu timeout 900 "build/emu/tests/$test") > "$W/$name.log" 2>&1
        rc=$?
        t=$(( $(date +%s) - start ))
        why=$(grep -m1 -E 'zs-emu: FAULT|^FAIL|not ok|AddressSanitizer' "$W/$name.log" | cut -c1-150)
        if [ $rc -ne 0 ]; then
            echo "CAUGHT    $name ($file) by $test, exit $rc in ${t}s: ${why:-$(tail -1 "$W/$name.log" | cut -c1-150)}"
            caught=$((caught + 1))
        else
            echo "SURVIVED  $name ($file): $test passed in ${t}s"
            survived="$survived $name"
        fi
    fi
    cp "$W/orig" "$f" && touch "$f" # rebuilt (newer than its object) by the next mutant's make
done < "$W/list"
echo "$caught of $total mutants caught${survived:+; survived:$survived}"
[ -z "$survived" ] && [ "$total" -gt 0 ]
