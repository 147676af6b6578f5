#!/bin/sh
# e2e-serve-default.sh — what a newcomer's `make serve` does after the build: the default model
# ships with the repo (models/stories260K, byte-identical to the fixture), the server starts
# through server/serve-default.sh (the script `make serve` runs), and the first completion and
# the first chat answer come back within 60 s of the start, with the model's reference greedy
# text. Also: MODEL=DIR that is not a model directory is refused with a message.
# Env: ZS_SHARED (fixtures, default ../shared). Exit 0 pass, 1 fail.
cd "$(dirname "$0")/.." || exit 1
SHARED=${ZS_SHARED:-../shared}
T=$(mktemp -d)
SPID=""
cleanup() { [ -n "$SPID" ] && kill -TERM "$SPID" 2>/dev/null && wait "$SPID" 2>/dev/null; rm -rf "$T"; }
trap cleanup EXIT INT TERM
pass=0; fail=0
check() { # name, shell condition
    if eval "$2"; then pass=$((pass+1)); echo "ok - $1"; else fail=$((fail+1)); echo "not ok - $1"; fi
}

for f in config.json generation_config.json model.safetensors special_tokens_map.json tokenizer.json tokenizer_config.json; do
    check "models/stories260K/$f equals the fixture" "cmp -s models/stories260K/$f $SHARED/models/stories260K/$f"
done
check "models/stories260K has its license and attribution" \
    'grep -q "MIT License" models/stories260K/LICENSE && grep -q "Karpathy" models/stories260K/README.md'

start=$(date +%s%N)
PORT=0 sh server/serve-default.sh >"$T/log" 2>&1 &
SPID=$!
port=""; healthy=""
for _ in $(seq 600); do
    kill -0 "$SPID" 2>/dev/null || break
    [ -n "$port" ] || port=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$T/log" | head -1)
    if [ -n "$port" ] && [ "$(curl -s --max-time 2 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health")" = 200 ]; then
        healthy=1; break
    fi
    sleep 0.1
done
check "make serve's script starts the server on the default model" '[ -n "$healthy" ]'
[ -n "$healthy" ] || { cat "$T/log"; echo "$pass passed, $((fail+1)) failed"; exit 1; }
U=http://127.0.0.1:$port
curl -s --max-time 30 "$U/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt":"Once upon a time","max_tokens":32,"temperature":0}' >"$T/c.json"
t_first=$(( ($(date +%s%N) - start) / 1000000 ))
curl -s --max-time 30 "$U/v1/chat/completions" -H 'Content-Type: application/json' \
    -d '{"messages":[{"role":"user","content":"Tell me a story about a dog."}],"max_tokens":48}' >"$T/chat.json"
t_chat=$(( ($(date +%s%N) - start) / 1000000 ))
echo "# first completion ${t_first} ms after the start, first chat answer ${t_chat} ms"
check "the model is listed as stories260K" 'curl -s "$U/v1/models" | grep -q "\"id\":\"stories260K\""'
# the fixture's reference greedy continuation of the same prompt (64 tokens; we ask for 32)
want=$(jq -r '.cases[] | select(.prompt == "Once upon a time") | .new_text' "$SHARED/models/stories260K/reference.json")
got=$(jq -r '.choices[0].text' "$T/c.json")
echo "# completion: $got"
echo "# chat: $(jq -r '.choices[0].message.content' "$T/chat.json")"
check "the first completion is the reference greedy text" '[ -n "$got" ] && [ "${want#"$got"}" != "$want" ]'
check "the chat answer has text" '[ -n "$(jq -r ".choices[0].message.content // empty" "$T/chat.json")" ]'
check "the first answer came within 60 s of the start" '[ "$t_first" -lt 60000 ]'
kill -TERM "$SPID"; wait "$SPID"; rc=$?; SPID=""
check "SIGTERM stops it with status 0" '[ $rc = 0 ]'

MODEL=$T/nothing-here sh server/serve-default.sh >"$T/bad.log" 2>&1; rc=$?
check "MODEL=DIR without config.json is refused with a message" '[ $rc != 0 ] && grep -q "config.json not found" "$T/bad.log"'
echo "$pass passed, $fail failed"
[ $fail = 0 ]
