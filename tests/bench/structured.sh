#!/bin/sh
# shellcheck shell=bash
# structured.sh — the cost of constrained decoding (not part of `make test`): generated tokens/s at
# batch 8 (8 concurrent chat requests of up to 64 tokens) with a grammar's token mask
# (response_format json_schema) and without (free text, ignore_eos), on SmolLM2-135M-Instruct
# (49152-token vocabulary). Three interleaved runs of each; prints the medians and their ratio
# (masked / free). tokens/s = the completion tokens of the 8 answers / the wall time of the batch
# (a constrained answer may end before 64 tokens: it counts what it generated).
#
#   sh tests/bench/structured.sh
#   ZS_URL=http://127.0.0.1:8080 MODEL_NAME=... sh tests/bench/structured.sh   # a running server
# Env: ZS_SMOLLM2 (the GGUF; default: server/fetch-smollm2.sh), ZS_BIN (default ./zeroserve),
# CONC (default 8), TOKENS (default 64), RUNS (default 3), ZS_BENCH_ARGS (server flags).
# shellcheck source=tests/lib/e2e.sh
. "$(dirname "$0")/../lib/e2e.sh"
zs_bash "$@"
set -u
zs_need --fail curl jq
CONC=${CONC:-8}
TOKENS=${TOKENS:-64}
RUNS=${RUNS:-3}
zs_tmpdir bench-struct

if [ -z "${ZS_URL:-}" ]; then
    zs_smollm2 --try || { echo "SmolLM2 cannot be fetched ($ZS_WHY)" >&2; exit 1; }
    # shellcheck disable=SC2086
    zs_start_server "$T/server.log" --model "$SMOL" ${ZS_BENCH_ARGS:-} || exit 1
fi
SCHEMA='{"type":"object","properties":{"people":{"type":"array","items":{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},"city":{"type":"string"}},"required":["name","age","city"],"additionalProperties":false}}},"required":["people"],"additionalProperties":false}'
MSG='[{"role":"user","content":"List some people with their name, age and city."}]'
FREE="{\"messages\":$MSG,\"max_tokens\":$TOKENS,\"temperature\":1,\"ignore_eos\":true"
MASK="{\"messages\":$MSG,\"max_tokens\":$TOKENS,\"temperature\":1,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"people\",\"schema\":$SCHEMA}}"

# batch BODY_PREFIX: prints the tokens/s of CONC concurrent requests
batch() {
    local t0 t1 pids="" k
    t0=$(date +%s.%N)
    for k in $(seq "$CONC"); do
        curl -s --max-time 600 "$ZS_URL/v1/chat/completions" -H 'Content-Type: application/json' \
            -d "$1,\"seed\":$k}" >"$T/r$k" & pids="$pids $!"
    done
    # shellcheck disable=SC2086
    wait $pids
    t1=$(date +%s.%N)
    local toks
    toks=$(cat "$T"/r* | jq -s '[.[].usage.completion_tokens] | add')
    rm -f "$T"/r*
    awk -v n="$toks" -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f\n", n / (b - a) }'
}
median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

batch "$FREE" >/dev/null # warm up (and compile the grammar and its masks once)
batch "$MASK" >/dev/null
free="" mask=""
for _ in $(seq "$RUNS"); do
    free="$free $(batch "$FREE")"
    mask="$mask $(batch "$MASK")"
done
mf=$(echo "$free" | tr ' ' '\n' | grep . | median)
mm=$(echo "$mask" | tr ' ' '\n' | grep . | median)
echo "batch $CONC x $TOKENS tokens: free text $mf tokens/s (runs:$free), masked $mm tokens/s (runs:$mask)"
awk -v a="$mm" -v b="$mf" 'BEGIN { printf "ratio masked / free: %.2f\n", a / b }'
