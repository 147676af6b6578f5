#!/bin/sh
# shellcheck shell=bash disable=SC2016,SC2015,SC2001  # jq programs are single-quoted; ok/nok always succeed
# e2e-structured.sh — structured outputs (response_format json_object / json_schema) of `zeroserve
# serve`, with curl and jq:
#  1. stories260K (plain template), chat and completions: a bounded schema (boolean, enum, integer,
#     null, anyOf, $ref/$defs, an array with items and maxItems, a nested object) at temperature 0
#     and at temperature 1 with several seeds and n=2 — every answer ends with "stop" and validates
#     (jq checks the keys, in the schema's order, and types of the fixed schema); /metrics counts
#     jump-forward's forced tokens; json_object answers are objects (or cut by max_tokens);
#     streaming joins into a valid value; 8 concurrent constrained requests; the 400s (an
#     unsupported keyword named with its pointer, an unknown type, a bad name, ...).
#  1b. the same model with --speculative ngram --spec-tree on: greedy answers (copying prompts, a
#     schema) and logprobs = plain decoding's, the tree counters in /metrics; a bad value refused.
#  2. SmolLM2-135M-Instruct (chatml; fetched by server/fetch-smollm2.sh or $ZS_SMOLLM2, the part is
#     skipped when it cannot be had): json_object (an object that ends: with whitespace bounded
#     as in llama.cpp, greedy SmolLM2 writes its pretty-printed object and closes it) and a
#     schema with strings, numbers, an array, anyOf with null and $ref, at temperature 0 with n=2.
# With `import openai, jsonschema` working in python3 (e.g. PATH=/tmp/tv/bin:$PATH), both parts also
# run tests/structured_client.py (the official client, jsonschema validation, streaming); else that
# is reported as skipped.
#
# Env: ZS_SHARED (fixtures, default ../shared), ZS_BIN (default ./zeroserve), ZS_SMOLLM2 (the GGUF).
# Exit: 0 all passed, 1 something failed, 77 skipped (no curl/jq/bash or no fixture).
# shellcheck source=tests/lib/e2e.sh
. "$(dirname "$0")/lib/e2e.sh"
zs_bash "$@"
set -u
zs_setup e2e-struct curl jq
zs_model stories260K
# the python part: counts its ok / not ok lines
PY=""
if python3 -c "import openai, jsonschema" 2>/dev/null; then PY=python3; fi
run_client() {
    local out
    if [ -z "$PY" ]; then echo "# skip: python3 cannot import openai and jsonschema (the openai-client checks)"; return; fi
    out=$("$PY" tests/structured_client.py "$@" 2>&1)
    echo "$out" | sed 's/^/#   /'
    local np nf
    np=$(echo "$out" | grep -c '^ok - ')
    nf=$(echo "$out" | grep -c '^not ok - ')
    [ "$nf" = 0 ] && [ "$np" -gt 0 ] && ok "openai client ($1 on $3${4:+ $4}): $np checks passed" || nok "openai client ($1 on $3${4:+ $4}): $nf of $((np + nf)) checks failed"
}

# the bounded schema (every answer ends) and its jq check
SMALL='{"type":"object","properties":{"ok":{"type":"boolean"},"color":{"enum":["red","green","blue"]},"n":{"type":"integer"},"x":{"type":"null"},"id":{"anyOf":[{"type":"integer"},{"type":"boolean"}]},"p":{"$ref":"#/$defs/pt"},"v":{"type":"array","items":{"type":"number"},"maxItems":2}},"required":["ok","color","n","x","id","p","v"],"additionalProperties":false,"$defs":{"pt":{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"],"additionalProperties":false}}}'
JQ_SMALL='def int: type == "number" and . == floor;
  type == "object" and (keys_unsorted == ["ok","color","n","x","id","p","v"]) and (.ok | type) == "boolean"
  and (.color | IN("red","green","blue")) and (.n | int) and .x == null and ((.id | type) == "boolean" or (.id | int))
  and (.p | type == "object" and keys == ["a"] and (.a | int)) and (.v | type == "array" and length <= 2 and all(.[]; type == "number"))'
PERSON='{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},"height":{"type":"number"},"student":{"type":"boolean"},"pet":{"anyOf":[{"type":"string"},{"type":"null"}]},"color":{"enum":["red","green","blue"]},"tags":{"type":"array","items":{"type":"string"},"maxItems":3},"address":{"$ref":"#/$defs/address"}},"required":["name","age","height","student","pet","color","tags","address"],"additionalProperties":false,"$defs":{"address":{"type":"object","properties":{"city":{"type":"string"},"zip":{"type":"integer"}},"required":["city","zip"],"additionalProperties":false}}}'
JQ_PERSON='def int: type == "number" and . == floor;
  type == "object" and (keys_unsorted == ["name","age","height","student","pet","color","tags","address"]) and (.name | type) == "string"
  and (.age | int) and (.height | type) == "number" and (.student | type) == "boolean" and (.pet == null or (.pet | type) == "string")
  and (.color | IN("red","green","blue")) and (.tags | type == "array" and length <= 3 and all(.[]; type == "string"))
  and (.address | type == "object" and keys_unsorted == ["city","zip"] and (.city | type) == "string" and (.zip | int))'
rf() { echo "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"$1\",\"schema\":$2,\"strict\":true}}"; }
# all_valid RESPONSE FIELD JQ: every choice ended with "stop" and its text passes JQ; prints what failed
all_valid() {
    echo "$1" | jq -r --arg f "$2" '.choices[] | [.finish_reason, (if $f == "text" then .text else .message.content end)] | @json' |
        while read -r row; do
            fin=$(echo "$row" | jq -r '.[0]')
            txt=$(echo "$row" | jq -r '.[1]')
            if [ "$fin" != stop ] || ! echo "$txt" | jq -e "$3" >/dev/null 2>&1; then echo "bad($fin): $(echo "$txt" | head -c 200)"; fi
        done
    [ "$(echo "$1" | jq '.choices | length')" -ge 1 ] || echo "no choices: $(echo "$1" | head -c 300)"
}

# ------------------------------------------------------------------ 1. stories260K
zs_start_server "$T/srv.log" --model "$MODEL" --device cpu || zs_abort "server starts"
ok "stories260K server starts"
MSG='[{"role":"user","content":"Tell me about a cat."}]'
for route in chat completions; do
    if [ $route = chat ]; then R=/v1/chat/completions F=content IN="\"messages\":$MSG"; else R=/v1/completions F=text IN='"prompt":"Once upon a time"'; fi
    for ts in "0 1" "1 1" "1 2" "1 3"; do
        # shellcheck disable=SC2086  # two or three numbers
        # shellcheck disable=SC2086  # three numbers
    set -- $ts
        r=$(zs_post $R "{$IN,\"max_tokens\":450,\"temperature\":$1,\"seed\":$2,\"n\":2,\"response_format\":$(rf small "$SMALL")}")
        bad=$(all_valid "$r" $F "$JQ_SMALL")
        [ -z "$bad" ] && ok "$route json_schema t=$1 seed=$2 n=2: both answers end and validate ($(echo "$r" | jq -r '.choices[0].message.content // .choices[0].text' | tr -d ' \n' | head -c 80))" ||
            nok "$route json_schema t=$1 seed=$2: $bad"
    done
done
# the grammar's forced bytes (keys, quotes, ':') went in as drafts, several per pass (jump-forward)
m=$(curl -s "$ZS_URL/metrics" | awk '$1 == "zeroserve_spec_forced_tokens_total" { print int($2) }')
[ "${m:-0}" -gt 0 ] && ok "/metrics: $m forced tokens held as drafts (jump-forward)" || nok "metrics forced tokens: '$m'"
# json_object: the tiny model rarely closes its object; whatever it writes is an object or its start
r=$(zs_post /v1/completions '{"prompt":"Once upon a time","max_tokens":100,"temperature":1,"seed":1,"n":2,"response_format":{"type":"json_object"}}')
good=$(echo "$r" | jq '[.choices[] | select(.finish_reason == "length" and (.text | test("^[ \\t\\r\\n]*\\{")) or (.finish_reason == "stop" and (.text | fromjson? | type) == "object"))] | length')
[ "$good" = 2 ] && ok "completions json_object: both answers are objects or their start (cut by max_tokens)" || nok "json_object: $(echo "$r" | head -c 400)"
# streamed
zs_post /v1/chat/completions "{\"messages\":$MSG,\"max_tokens\":450,\"temperature\":1,\"seed\":9,\"stream\":true,\"response_format\":$(rf small "$SMALL")}" >"$T/sse"
txt=$(sed -n 's/^data: //p' "$T/sse" | grep -v '^\[DONE\]' | jq -j '.choices[0].delta.content // empty')
fin=$(sed -n 's/^data: //p' "$T/sse" | grep -v '^\[DONE\]' | jq -r '.choices[0].finish_reason // empty' | tail -1)
[ "$fin" = stop ] && echo "$txt" | jq -e "$JQ_SMALL" >/dev/null 2>&1 && ok "streamed: the deltas join into a valid value" || nok "streamed: $fin $(echo "$txt" | head -c 200)"
# 8 concurrent constrained requests (one batch), each validated
PIDS=""
for k in 1 2 3 4 5 6 7 8; do
    curl -s --max-time 300 "$ZS_URL/v1/chat/completions" -H 'Content-Type: application/json' \
        -d "{\"messages\":$MSG,\"max_tokens\":450,\"temperature\":1,\"seed\":$((100 + k)),\"response_format\":$(rf small "$SMALL")}" >"$T/c$k" & PIDS="$PIDS $!"
done
# shellcheck disable=SC2086
wait $PIDS
bad=""
for k in 1 2 3 4 5 6 7 8; do b=$(all_valid "$(cat "$T/c$k")" content "$JQ_SMALL"); [ -z "$b" ] || bad="$bad [$k] $b"; done
[ -z "$bad" ] && ok "8 concurrent constrained requests: every answer validates" || nok "concurrent: $bad"
# a constrained request and a free one side by side: the free one is not constrained
r=$(zs_post /v1/completions '{"prompt":"Once upon a time","max_tokens":20,"temperature":0}')
echo "$r" | jq -e '.choices[0].text | test("^[ \\t\\r\\n]*\\{") | not' >/dev/null && ok "a request without response_format is free text" || nok "free text: $r"
m=$(curl -s "$ZS_URL/metrics" | awk '/^zeroserve_constrained_tokens_total/ {print $2}')
[ -n "$m" ] && [ "${m%.*}" -gt 100 ] && ok "/metrics counts the constrained tokens ($m)" || echo "# note: no zeroserve_constrained_tokens_total in /metrics ('$m')"

# the 400s
S_PAT='{"type":"object","properties":{"s":{"type":"string","pattern":"^a+$"}},"required":["s"],"additionalProperties":false}'
zs_expect_400 /v1/chat/completions "{\"messages\":$MSG,\"response_format\":$(rf bad "$S_PAT")}" response_format.json_schema.schema "an unsupported keyword (chat)" "'pattern' at /properties/s"
zs_expect_400 /v1/completions "{\"prompt\":\"a\",\"response_format\":$(rf bad "$S_PAT")}" response_format.json_schema.schema "an unsupported keyword (completions)" pattern
zs_expect_400 /v1/chat/completions "{\"messages\":$MSG,\"response_format\":$(rf bad '{"type":"object","properties":{"a":{"type":"integer"}}}')}" response_format.json_schema.schema "an object without additionalProperties false" additionalProperties
zs_expect_400 /v1/chat/completions "{\"messages\":$MSG,\"response_format\":$(rf bad '{"type":"array"}')}" response_format.json_schema.schema "a root that is not an object" root
zs_expect_400 /v1/chat/completions "{\"messages\":$MSG,\"response_format\":{\"type\":\"xml\"}}" response_format.type "an unknown response_format type" xml
zs_expect_400 /v1/chat/completions "{\"messages\":$MSG,\"response_format\":{}}" response_format.type "response_format without a type"
zs_expect_400 /v1/chat/completions "{\"messages\":$MSG,\"response_format\":\"json\"}" response_format "response_format not an object"
zs_expect_400 /v1/chat/completions "{\"messages\":$MSG,\"response_format\":{\"type\":\"json_schema\"}}" response_format.json_schema "json_schema missing"
zs_expect_400 /v1/chat/completions "{\"messages\":$MSG,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"schema\":$SMALL}}}" response_format.json_schema.name "json_schema without a name"
zs_expect_400 /v1/chat/completions "{\"messages\":$MSG,\"response_format\":$(rf 'bad name!' "$SMALL")}" response_format.json_schema.name "a name with a space"
zs_expect_400 /v1/chat/completions "{\"messages\":$MSG,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"a\",\"schema\":5}}}" response_format.json_schema.schema "a schema that is not an object"
zs_expect_400 /v1/chat/completions "{\"messages\":$MSG,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"a\",\"schema\":$SMALL,\"strict\":\"yes\"}}}" response_format.json_schema.strict "strict not a boolean"
zs_expect_400 /v1/chat/completions "{\"messages\":$MSG,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"a\",\"schema\":$SMALL,\"foo\":1}}}" response_format.json_schema.foo "an unknown json_schema key"
r=$(zs_post /v1/chat/completions "{\"messages\":$MSG,\"max_tokens\":5,\"response_format\":{\"type\":\"text\"}}")
echo "$r" | jq -e '.choices[0].message.content | type == "string"' >/dev/null && ok "response_format text: accepted" || nok "text: $r"
run_client structured "$ZS_URL" stories260K --small
# greedy answers of plain decoding, for the speculative server below (copying prompts, a schema)
SPEC_REQS=('{"prompt":"Tom had a red ball. Tom had a big red ball. Sue had a blue ball. Tom had a","max_tokens":60,"temperature":0,"logprobs":2}'
    '{"prompt":"The cat sat on the mat. The dog sat on the log. The cat sat on the log. The dog sat","max_tokens":60,"temperature":0,"logprobs":2}'
    "{\"prompt\":\"Give JSON.\",\"max_tokens\":200,\"temperature\":0,\"response_format\":$(rf small "$SMALL")}")
SPEC_PLAIN=()
for q in "${SPEC_REQS[@]}"; do SPEC_PLAIN+=("$(zs_post /v1/completions "$q" | jq -c '[.choices[0].text, .choices[0].logprobs]')"); done
zs_stop_server

# ------------------------------------------------------------------ 1b. speculation with draft trees
# --speculative ngram --spec-tree on: the same greedy tokens and logprobs as plain decoding, the
# tree counters in /metrics; a bad --spec-tree value is refused naming the flag
if "$BIN" serve --model "$MODEL" --device cpu --spec-tree maybe >"$T/bad.log" 2>&1; then nok "--spec-tree maybe is refused"
else grep -q -- "--spec-tree must be on or off" "$T/bad.log" && ok "--spec-tree maybe is refused naming the flag" || nok "--spec-tree maybe" "$(head -c 200 "$T/bad.log")"; fi
# flags that shape a proposer's drafts are refused without one (else accepted and doing nothing)
for bad in "--spec-tree on|--spec-tree on needs --speculative ngram" "--spec-tokens 4|--spec-tokens 4 needs --speculative ngram"; do
    # shellcheck disable=SC2086  # the flag and its value are two words
    if "$BIN" serve --model "$MODEL" --device cpu ${bad%%|*} >"$T/bad.log" 2>&1; then nok "${bad%%|*} alone is refused"
    else grep -q -- "${bad#*|}" "$T/bad.log" && ok "${bad%%|*} without a proposer is refused" || nok "${bad%%|*} alone" "$(head -c 200 "$T/bad.log")"; fi
done
if zs_start_server "$T/srv-spec.log" --model "$MODEL" --device cpu --speculative ngram --spec-tree on --spec-tokens 8; then
    same=0
    for i in "${!SPEC_REQS[@]}"; do
        a=$(zs_post /v1/completions "${SPEC_REQS[$i]}" | jq -c '[.choices[0].text, .choices[0].logprobs]')
        [ "$a" = "${SPEC_PLAIN[$i]}" ] && same=$((same + 1)) || echo "# differs: $a vs ${SPEC_PLAIN[$i]}" | head -c 600
    done
    check "draft trees: greedy answers and logprobs = plain decoding ($same of ${#SPEC_REQS[@]})" '[ $same = ${#SPEC_REQS[@]} ]'
    met=$(curl -s "$ZS_URL/metrics")
    tr=$(echo "$met" | awk '/^zeroserve_spec_trees_total/ {print $2}')
    mv=$(echo "$met" | awk '/^zeroserve_spec_kv_moves_total/ {print $2}')
    sd=$(echo "$met" | awk '/^zeroserve_spec_side_accepted_tokens_total/ {print $2}')
    check "/metrics: trees $tr, side drafts accepted $sd, KV moves $mv" '[ -n "$tr" ] && [ -n "$mv" ] && [ -n "$sd" ] && [ "$tr" -gt 0 ]'
    zs_stop_server
else
    nok "the speculative server starts"
fi

# ------------------------------------------------------------------ 2. SmolLM2
if ! zs_smollm2 --try; then
    echo "# skip: SmolLM2 could not be fetched ($ZS_WHY): the SmolLM2 part"
else
    NAME=$(basename "$SMOL" .gguf)
    if zs_start_server "$T/srv2.log" --model "$SMOL" --device cpu; then
        ok "SmolLM2 server starts"
        M2='[{"role":"user","content":"Describe a person as JSON."}]'
        r=$(zs_post /v1/chat/completions "{\"messages\":$M2,\"max_tokens\":300,\"temperature\":0,\"response_format\":{\"type\":\"json_object\"}}")
        echo "$r" | jq -e '.choices[0].finish_reason == "stop" and (.choices[0].message.content | fromjson | type) == "object"' >/dev/null 2>&1 &&
            ok "SmolLM2 json_object: an object ($(echo "$r" | jq -r .choices[0].message.content | tr -d '\n' | head -c 100))" || nok "SmolLM2 json_object: $(echo "$r" | head -c 300)"
        r=$(zs_post /v1/chat/completions "{\"messages\":$M2,\"max_tokens\":400,\"temperature\":0,\"n\":2,\"response_format\":$(rf person "$PERSON")}")
        bad=$(all_valid "$r" content "$JQ_PERSON")
        [ -z "$bad" ] && ok "SmolLM2 json_schema (strings, numbers, array, anyOf null, \$ref) t=0 n=2: validates ($(echo "$r" | jq -r .choices[0].message.content | tr -d '\n' | head -c 120))" || nok "SmolLM2 person: $bad"
        r=$(zs_post /v1/chat/completions "{\"messages\":$M2,\"max_tokens\":450,\"temperature\":1,\"seed\":3,\"n\":2,\"response_format\":$(rf small "$SMALL")}")
        bad=$(all_valid "$r" content "$JQ_SMALL")
        [ -z "$bad" ] && ok "SmolLM2 bounded schema t=1 n=2: validates" || nok "SmolLM2 small t=1: $bad"
        run_client structured "$ZS_URL" "$NAME"
        zs_stop_server
    else
        nok "SmolLM2 server starts"
    fi
fi
zs_done
