#!/bin/sh
# shellcheck shell=bash
# offload-auto.sh — `--offload auto` against the best hand-tuned flags of a small grid search
# (not part of `make test`): decode tokens/s at batch 1 from `zeroserve bench` (medians of RUNS
# runs), for SmolLM2-135M-Instruct Q4_1
#   - as it is (it fits in memory): auto against --offload none and --offload nvme with live
#     budgets of the largest bucket plus 2, 4 and 8 layers;
#   - on a machine whose memory is CAP bytes, less than the weights (ZS_PLAN_MEMORY_BYTES for
#     auto): auto against --offload nvme with those live budgets (a resident
#     placement is not in the grid: it would not fit).
# Prints every grid point, the best, auto's choice (from its log) and auto / best.
#
#   sh tests/bench/offload-auto.sh
# Env: ZS_BIN (./zeroserve), MODEL (default: SmolLM2 via server/fetch-smollm2.sh), RUNS (3),
# DECODE (32), CAP (60000000), DIR (scratch on the disk to measure, default /tmp/zs-autobench).
# shellcheck source=tests/lib/e2e.sh
. "$(dirname "$0")/../lib/e2e.sh"
zs_bash "$@"
set -u
RUNS=${RUNS:-3}
DECODE=${DECODE:-32}
CAP=${CAP:-60000000}
DIR=${DIR:-/tmp/zs-autobench}
if [ -z "${MODEL:-}" ]; then
    MODEL=$(sh server/fetch-smollm2.sh) || { echo "cannot fetch SmolLM2 (give MODEL=...)" >&2; exit 1; }
fi
command -v jq >/dev/null || { echo "jq is missing" >&2; exit 1; }
zs_tmpdir autob
zs_at_exit() { rm -rf "$DIR"; }
mkdir -p "$DIR"
# bytes of one layer as stored (the largest bucket), from a resident bench's log
layer=$("$BIN" plan --model "$MODEL" --machine local --json 2>/dev/null | jq -r '.model.weight_bytes / .model.layers | floor')
[ -n "$layer" ] && [ "$layer" != null ] || { echo "cannot size a layer (zeroserve plan)" >&2; exit 1; }

run() { # label env-assignments-or-- bench-flags...: decode tokens/s
    local label=$1 envs=$2
    shift 2
    # shellcheck disable=SC2086
    env $envs ZS_LOG=info "$BIN" bench --model "$MODEL" --runs "$RUNS" --prefill 32 --decode "$DECODE" --json "$T/$label.json" \
        "$@" >"$T/$label.out" 2>"$T/$label.log" || { echo "  $label: failed: $(tail -1 "$T/$label.log")" >&2; echo 0; return; }
    jq -r '.decode_tok_s' "$T/$label.json"
}

grid() { # case envs-for-auto: the grid points, the best, auto
    local case=$1 aenv=$2 best=0 bestl="" v i=0
    shift 2
    echo "$case:"
    for point in "$@"; do
        i=$((i + 1))
        # shellcheck disable=SC2086
        v=$(run "$NCASE-$i" -- $point)
        echo "  $point: $v tokens/s"
        if awk -v a="$v" -v b="$best" 'BEGIN { exit !(a > b) }'; then best=$v; bestl=$point; fi
    done
    v=$(run "$NCASE-auto" "$aenv" --offload auto --nvme-path "$DIR")
    echo "  --offload auto: $v tokens/s ($(grep -o 'plan: [0-9]* of [0-9]* layers in memory, [0-9]* streamed[^;]*' "$T/$NCASE-auto.log" | head -1))"
    NCASE=$((NCASE + 1))
    echo "  best of the grid: $bestl ($best tokens/s); auto / best = $(awk -v a="$v" -v b="$best" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')"
}

echo "model: $MODEL; a layer is $layer bytes; $RUNS runs of $DECODE tokens"
# the gather holds at least its largest bucket (the head, here): the budgets of the grid start there
big=$("$BIN" bench --model "$MODEL" --offload nvme --nvme-path "$DIR" --max-live-bytes 4096 --runs 1 2>&1 |
    sed -n 's/.*largest bucket (\([0-9]*\) bytes).*/\1/p' | head -1)
[ -n "$big" ] || { echo "cannot find the largest bucket" >&2; exit 1; }
echo "the largest bucket is $big bytes"
L2=$((big + 2 * layer)); L4=$((big + 4 * layer)); L8=$((big + 8 * layer))
NCASE=1
grid "fits" "ZS_PLAN_MEMORY_BYTES=" "--offload none" \
    "--offload nvme --nvme-path $DIR --max-live-bytes $L2" "--offload nvme --nvme-path $DIR --max-live-bytes $L4" \
    "--offload nvme --nvme-path $DIR --max-live-bytes $L8"
grid "does not fit ($CAP bytes of memory)" "ZS_PLAN_MEMORY_BYTES=$CAP" \
    "--offload nvme --nvme-path $DIR --max-live-bytes $L2" "--offload nvme --nvme-path $DIR --max-live-bytes $L4" \
    "--offload nvme --nvme-path $DIR --max-live-bytes $L8"
