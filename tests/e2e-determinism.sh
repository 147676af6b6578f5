#!/bin/sh
# End-to-end check that training is bitwise reproducible whatever the machine does with threads:
# a few `zeroserve train` steps on stories260K (2 ranks in one process) export byte-identical
# model.safetensors when run plainly, pinned to one core (taskset -c 0), with OpenBLAS told to
# use 1 or 2 threads, and with our kernel pool at 1, 2 or 3 threads (ZS_THREADS); the same with
# bf16 weights and with gpt2-bytes (LayerNorm, biases, GELU, tied head); and, when mpirun is
# present, 2 processes of 1 rank equal 1 process of 2 ranks (mpirun binds each process to a core).
# shellcheck source=tests/lib/e2e.sh
. "$(dirname "$0")/lib/e2e.sh"
zs_need_bin
export ZS_LOG=${ZS_LOG:-warn} ZS_DEVICE=${ZS_DEVICE:-cpu}
zs_tmpdir det

D=$T/data.jsonl
for i in $(seq 1 24); do echo "{\"prompt\":\"Q$i: what is $i plus $i?\",\"completion\":\" $((i+i)).\"}"; done >"$D"
# train NAME MODEL [ENV...] [-- EXTRA ARGS]: trains into $T/NAME; its stderr in $T/NAME.err
train() {
    local name=$1 model=$2 envs="" extra=""
    shift 2
    while [ $# -gt 0 ] && [ "$1" != -- ]; do envs="$envs $1"; shift; done
    [ "$1" = -- ] && { shift; extra="$*"; }
    env $envs $PREFIX $Z train --model "$SHARED/models/$model" --data "$D" --steps 5 --batch-size 2 --seq-len 64 \
        --lr 1e-3 --ranks 2 --log-every 5 --out "$T/$name" $extra >"$T/$name.out" 2>"$T/$name.err"
}
same() { [ -s "$T/$1/model.safetensors" ] && cmp -s "$T/$1/model.safetensors" "$T/$2/model.safetensors"; }

for model in stories260K gpt2-bytes; do
    PREFIX=""
    train "$model-plain" $model
    check "$model: plain run exits 0" '[ -s "$T/$model-plain/model.safetensors" ] || { tail -3 "$T/$model-plain.err"; false; }'
    if command -v taskset >/dev/null; then
        PREFIX="taskset -c 0"
        train "$model-taskset" $model
        PREFIX=""
        check "$model: taskset -c 0 exports the same bytes" 'same "$model-plain" "$model-taskset"'
    fi
    for v in OPENBLAS_NUM_THREADS=1 OPENBLAS_NUM_THREADS=2 ZS_THREADS=1 ZS_THREADS=2 ZS_THREADS=3; do
        train "$model-$v" $model $v
        check "$model: $v exports the same bytes" 'same "$model-plain" "$model-$v"'
    done
done

# 16-bit weights: the backward converts blocks of rows; the bytes still do not depend on threads
PREFIX=""
train bf16-plain stories260K -- --weight-dtype bf16
check "bf16 weights: plain run exits 0" '[ -s "$T/bf16-plain/model.safetensors" ] || { tail -3 "$T/bf16-plain.err"; false; }'
train bf16-t1 stories260K ZS_THREADS=1 OPENBLAS_NUM_THREADS=1 -- --weight-dtype bf16
check "bf16 weights: ZS_THREADS=1 OPENBLAS_NUM_THREADS=1 exports the same bytes" 'same bf16-plain bf16-t1'
if command -v taskset >/dev/null; then
    PREFIX="taskset -c 0"
    train bf16-taskset stories260K ZS_THREADS=3 -- --weight-dtype bf16
    PREFIX=""
    check "bf16 weights: taskset -c 0 with ZS_THREADS=3 exports the same bytes" 'same bf16-plain bf16-taskset'
fi

# 2 processes of 1 rank each (mpirun binds each to a core) against 1 process of 2 ranks
if command -v mpirun >/dev/null; then
    zs_mpi_env
    timeout 300 mpirun -np 2 $Z train --model "$SHARED/models/stories260K" --data "$D" --steps 5 --batch-size 2 \
        --seq-len 64 --lr 1e-3 --ranks 1 --log-every 5 --out "$T/mpi" >"$T/mpi.out" 2>"$T/mpi.err"
    rc=$?
    check "mpirun -np 2 --ranks 1: exits 0" '[ $rc = 0 ] || { tail -3 "$T/mpi.err"; false; }'
    check "mpirun -np 2 --ranks 1 exports the same bytes as --ranks 2 in one process" 'same stories260K-plain mpi'
else
    echo "# mpirun not found: the multi-process comparison is skipped"
fi

zs_done
