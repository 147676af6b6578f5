#!/bin/sh
# shellcheck shell=bash disable=SC2016,SC2034
# e2e-offload-auto.sh — --offload auto (engine/runtime/plan-auto.c) on stories260K: with room in
# memory the plan keeps every layer there (GET /v1/plan: mode auto, offload none, the measured
# machine, a predicted tokens/s); on a machine of 800 kB (ZS_PLAN_MEMORY_BYTES, the knob that also
# stands for a container's limit) it streams the layers from --nvme-path and puts the KV cache's
# overflow there, and the greedy text is the same as in memory; without --nvme-path it refuses by
# naming the flag; with no --offload at all, a model that does not fit gets the plan by itself, one
# that fits runs as before (mode flags); flags given win over the plan, and the log says so;
# `train --offload auto` is refused. While it serves, the plan is checked against what the steps
# achieve: stories260K's tiny matmuls run far below the FLOP/s measured at start, so after three
# 2-second windows /v1/plan has been re-planned from the measured figure (and the log says so).
# shellcheck source=tests/lib/e2e.sh
. "$(dirname "$0")/lib/e2e.sh"
zs_bash "$@"
zs_need curl jq
zs_need_bin
zs_model stories260K
zs_tmpdir offauto
export ZS_DEVICE=${ZS_DEVICE:-cpu}
gen() { "$BIN" generate --model "$MODEL" --prompt "Once upon a time" --max-tokens 24 --temperature 0 "$@"; }
want=$(gen 2>/dev/null)

ZS_LOG=info zs_start_server "$T/a.log" --model "$MODEL" --offload auto || zs_abort "serve --offload auto"
curl -s "$ZS_URL/v1/plan" >"$T/plan.json"
check "room in memory: /v1/plan says auto, offload none, every layer in memory, a measured machine and a prediction" \
    'jq -e ".mode == \"auto\" and .applied.offload == \"none\" and .best.layers.memory == 5 and .machine.memory_gbps > 0 and .best.tokens_per_s > 0" "$T/plan.json" >/dev/null' \
    "$(head -c 400 "$T/plan.json")"
# serve for a while: greedy completions back to back until the plan says it was re-planned (20 s at most)
end=$(($(date +%s) + 20))
while [ "$(date +%s)" -lt "$end" ]; do
    zs_post /v1/completions '{"prompt": ["Once upon a time", "The dog", "A girl", "One day"], "max_tokens": 200, "temperature": 0, "ignore_eos": true}' >/dev/null
    curl -s "$ZS_URL/v1/plan" >"$T/plan2.json"
    jq -e '.replanned.count >= 1' "$T/plan2.json" >/dev/null 2>&1 && break
done
check "while serving, the measured compute drifted from the plan's: re-planned from it (/v1/plan .replanned, machine.flops as measured)" \
    'jq -e ".replanned.count >= 1 and .replanned.measured.flops > 0 and (.machine.flops - .replanned.measured.flops | fabs) < 1 and .mode == \"auto\"" "$T/plan2.json" >/dev/null' \
    "$(head -c 600 "$T/plan2.json")"
zs_stop_server
check "the log says it re-planned" 'grep -q "plan: measured .* re-planned" "$T/a.log"' "$(grep plan "$T/a.log" | tail -3)"

mkdir -p "$T/nv"
ZS_PLAN_MEMORY_BYTES=800000 ZS_LOG=info gen --offload auto --nvme-path "$T/nv" >"$T/small.out" 2>"$T/small.log"
check "800 kB of memory: the layers stream from NVMe and the KV cache gets an NVMe tier" \
    'grep -q "plan: 0 of 5 layers in memory, 5 streamed from NVMe" "$T/small.log" && grep -q "KV offload: sequences beyond memory swapped to NVMe" "$T/small.log"' \
    "$(grep plan "$T/small.log" | head -3)"
check "and the greedy text is the one from memory" '[ -n "$want" ] && [ "$(cat "$T/small.out")" = "$want" ]' "$(cat "$T/small.out")"
rc=0
ZS_PLAN_MEMORY_BYTES=800000 gen --offload auto >/dev/null 2>"$T/nopath.log" || rc=$?
check "without --nvme-path it is refused, naming the flag" '[ $rc -ne 0 ] && grep -q -- "--nvme-path" "$T/nopath.log"' "$(cat "$T/nopath.log")"
ZS_PLAN_MEMORY_BYTES=800000 ZS_LOG=info gen --nvme-path "$T/nv" >"$T/default.out" 2>"$T/default.log"
check "no --offload, a model that does not fit: planned by itself, the same text" \
    'grep -q -- "--offload auto: measuring" "$T/default.log" && [ "$(cat "$T/default.out")" = "$want" ]'
ZS_LOG=info gen >/dev/null 2>"$T/fits.log"
check "no --offload, a model that fits: no plan, nothing measured" '! grep -q "measuring" "$T/fits.log"'
ZS_PLAN_MEMORY_BYTES=800000 ZS_LOG=info gen --offload auto --nvme-path "$T/nv" --kv-bytes 2000000 --kv-offload cpu \
    >/dev/null 2>"$T/given.log"
check "flags given win, and the log names them" \
    'grep -q "plan: given on the command line, so not the plan.s: --kv-offload --kv-bytes" "$T/given.log" && grep -q "sequences beyond memory swapped to host memory" "$T/given.log"' \
    "$(grep plan "$T/given.log" | tail -2)"
zs_start_server "$T/b.log" --model "$MODEL" || zs_abort "serve"
check "without auto, /v1/plan says the flags' placement" \
    'curl -s "$ZS_URL/v1/plan" | jq -e ".mode == \"flags\" and .applied.offload == \"none\" and .applied.kv_bytes > 0" >/dev/null'
zs_stop_server
rc=0
"$BIN" train --model "$MODEL" --data "$SHARED/data/tinyshakespeare.txt" --steps 1 --out "$T/tr" --offload auto >/dev/null 2>"$T/train.log" || rc=$?
check "train --offload auto is refused by name" '[ $rc -ne 0 ] && grep -q -- "--offload auto is for serving" "$T/train.log"' "$(tail -2 "$T/train.log")"
zs_done
