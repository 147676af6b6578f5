#!/bin/sh
# e2e-plan.sh — `zeroserve plan` end to end on the anchors of docs/plan.md (tests/ref/plan): each
# prints a placement and predictions, --json parses with jq, and the prediction lies within a
# stated factor of the published figure:
#   - throughput anchors, within 1.5x: ZeRO-Inference (LLaMA-2-70B, 4-bit weights streamed from
#     host memory, batch 96 on an A6000: 23.44 tokens/s) and FlexGen (OPT-175B on a T4, batch 256,
#     the planner's own placement: 0.69 tokens/s), both generated tokens / (prefill + decode). Both
#     runs are bound by what the model prices directly, the stream over the slowest link (PCIe,
#     NVMe) and the prefill's FLOPs; what is left is the share of peak FLOP/s counted (60 %) and
#     link rates the sources give only roughly, worth tens of percent, not 2x. (Measured: 1.08x
#     and 0.87x.)
#   - speculative anchors at batch 1 on an RTX 4090, within 4x: Sequoia (LLaMA-2-70B in fp16,
#     about 0.57 s per token) and UMbreLLa (a 70B in 4-bit AWQ, 8.6 tokens/s greedy on MT-Bench).
#     The planner's acceptance model is a chain of 4 drafts accepted at 0.7 each (2.77 tokens per
#     pass); those systems verify trees of hundreds of drafts from a strong draft model, several
#     times more tokens per pass, and their draft model's memory and time are not in the plan: the
#     pass time is modelled, the tokens per pass are not, hence the wider factor. (Measured: 3.0x
#     and 2.3x below.)
# Then every kind of bad input is refused by name with exit 1 and no crash.
# shellcheck source=tests/lib/e2e.sh
. "$(dirname "$0")/lib/e2e.sh"
zs_setup plan jq
export ZS_DEVICE=${ZS_DEVICE:-cpu}

LL=tests/ref/plan/llama-2-70b/config.json
OPT=tests/ref/plan/opt-175b
# within A B F: A / B lies in [1/F, F]
within() { awk -v a="$1" -v b="$2" -v f="$3" 'BEGIN { r = a / b; exit !(b > 0 && r <= f && r >= 1 / f) }'; }
# anchor NAME FIELD PUBLISHED FACTOR ARGS...: the text and JSON answers, FIELD (a jq path) within FACTOR
anchor() {
    name=$1 field=$2 pub=$3 fac=$4
    shift 4
    $Z plan "$@" >"$T/$name.txt" 2>"$T/$name.err"; rc=$?
    check "$name: plan prints a placement and predictions" \
        '[ $rc = 0 ] && grep -q "^  weights: head on" "$T/$name.txt" && grep -q "^  KV: " "$T/$name.txt" && grep -q "^best batch\|^batch asked" "$T/$name.txt"' \
        "$(cat "$T/$name.err")"
    $Z plan "$@" --json >"$T/$name.json" 2>>"$T/$name.err"
    check "$name: --json parses with jq" 'jq -e ".best.tokens_per_s > 0 and .batch1_spec.tokens_per_s > .batch1.tokens_per_s" "$T/$name.json" >/dev/null'
    got=$(jq -r "$field" "$T/$name.json" 2>/dev/null)
    check "$name: $field = $got within ${fac}x of the published $pub" 'within "$got" "$pub" "$fac"'
}

anchor zero-inference .best.e2e_tokens_per_s 23.44 1.5 --model $LL --machine A6000 --weight-dtype q4_0 \
    --prompt 512 --output 32 --batch 96 --resident-layers 0 --kv-tier device
anchor flexgen .best.e2e_tokens_per_s 0.69 1.5 --model $OPT --machine T4 --prompt 512 --output 32 --batch 256
check "flexgen: the planner chooses FlexGen's placement (KV on NVMe, weights split host/NVMe, attention on the host)" \
    'jq -e ".best.placement | .kv == \"nvme\" and .attention == \"host\" and .layers.host > 0 and .layers.nvme > 0" "$T/flexgen.json" >/dev/null'
anchor sequoia "1 / .batch1_spec.tokens_per_s" 0.57 4 --model $LL --machine RTX4090 --weight-dtype f16 --batch 1
anchor umbrella .batch1_spec.tokens_per_s 8.6 4 --model $LL --machine RTX4090 --weight-dtype q4_0 --batch 1
check "sequoia: I/O-bound by PCIe at batch 1" 'jq -e ".batch1.bound == \"io\" and .batch1.bound_by == \"PCIe\"" "$T/sequoia.json" >/dev/null'

# this machine, measured (no device), on a real GGUF and a model directory
M=$SHARED/models/stories260K
if [ -d "$M" ]; then
    $Z plan --model "$M/stories260K.gguf" --machine local --nvme-path "$T" >"$T/local.txt" 2>"$T/local.err"; rc=$?
    if grep -q "the probe needs" "$T/local.err"; then # a full /tmp: the measurement without the drive
        echo "# $(cat "$T/local.err")"
        $Z plan --model "$M/stories260K.gguf" --machine local >"$T/local.txt" 2>"$T/local.err"; rc=$?
        check "--machine local: measured, no device" '[ $rc = 0 ] && grep -q "no device (the host computes)" "$T/local.txt"' "$(cat "$T/local.err")"
    else
        check "--machine local --nvme-path: measured, no device" '[ $rc = 0 ] && grep -q "no device (the host computes)" "$T/local.txt" && grep -q "NVMe [0-9.]* GB, read" "$T/local.txt"' "$(cat "$T/local.err")"
    fi
    check "the NVMe probe file is removed" '[ -z "$(ls -A "$T" | grep zs-plan-probe)" ]'
    check "a model directory plans" '$Z plan --model "$M" --machine L40 --json | jq -e ".model.layers == 5" >/dev/null'
else
    echo "# skip: $M not found (ZS_SHARED)"
fi
check "plan --help lists its flags" '$Z plan --help 2>&1 | grep -q -- "--resident-layers"'
check "zeroserve --help lists plan" '$Z --help 2>&1 | grep -q "^  plan "'

# refused EXPECT ARGS...: exit 1 (not a crash) and the message contains EXPECT
refused() {
    want=$1
    shift
    $Z plan "$@" >/dev/null 2>"$T/err"; rc=$?
    check "refused ($want): $*" '[ $rc = 1 ] && grep -qF -- "$want" "$T/err"' "rc $rc: $(cat "$T/err")"
}
printf '{"hidden_size": 8' >"$T/broken.json"
mkdir -p "$T/nocfg"
refused "unknown machine 'V100' (known: H200, A100-80G, L40, RTX4090, A6000, T4, local)" --model $LL --machine V100
refused "no-such/config.json" --model tests/ref/plan/no-such/config.json --machine T4
refused "nocfg/config.json: cannot open" --model "$T/nocfg" --machine T4
refused "not valid JSON" --model "$T/broken.json" --machine T4
refused "not a model directory, a .gguf file or a config.json" --model "$T/err" --machine T4
refused "--pcie-gbps: -1 must be > 0" --model $LL --machine T4 --pcie-gbps -1
refused "--host-mem-gb: 0 must be > 0" --model $LL --machine T4 --host-mem-gb 0
refused "--tflops: 0 must be > 0" --model $LL --machine T4 --tflops 0
refused "without --machine these figures are needed: --host-gbps, --pcie-gbps" --model $LL --device-mem-gb 24 \
    --host-mem-gb 256 --nvme-gb 1000 --hbm-gbps 1000 --nvme-gbps 3 --tflops 100
refused "--weight-dtype: 'q9_0' is not one of" --model $LL --machine T4 --weight-dtype q9_0
refused "--kv-dtype: 'q4_0' is not one of f32, f16, bf16" --model $LL --machine T4 --kv-dtype q4_0
refused "--kv-tier: 'disk' is not one of auto, device, host, nvme" --model $LL --machine T4 --kv-tier disk
refused "--prompt: 0 must be >= 1" --model $LL --machine T4 --prompt 0
refused "--batch: -4 must be >= 1" --model $LL --machine T4 --batch -4
refused "--spec-accept: 1 must be in [0, 1)" --model $LL --machine T4 --spec-accept 1
refused "--output: 'many' is not an integer" --model $LL --machine T4 --output many
refused "--nvme-path measures this machine: it needs --machine local" --model $LL --machine T4 --nvme-path "$T"
refused "--nvme-path $T/none: not a directory" --model $LL --machine local --nvme-path "$T/none"
refused "does not fit T4 even at batch 1" --model $OPT --machine T4 --host-mem-gb 20 --nvme-gb 10
refused "batch 4096 does not fit" --model $OPT --machine T4 --batch 4096
refused "--model is required" --machine T4
refused "unknown flag --gpus" --model $LL --machine T4 --gpus 2

zs_done
