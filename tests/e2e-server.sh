#!/bin/sh
# shellcheck shell=bash
# e2e-server.sh — end-to-end tests of `zeroserve serve` over HTTP, with curl and jq, against
# exact expectations: every endpoint and field, every error case, streaming, cancellation,
# concurrency (batch invariance), a bounded load (no 5xx, no memory growth), the 429 queue
# limit and SIGTERM draining. Uses the stories260K fixture (reference.json holds its greedy
# continuations) and, for the checks that need generation to take a while, a random-weight
# Llama that `zeroserve init-model` writes into the temp dir.
#
# Env: BUILD (unused but accepted), ZS_SHARED (fixtures, default ../shared), ZS_BIN (default
# ./zeroserve), ZS_E2E_ARGS (extra server flags, e.g. "--ranks 2 --offload nvme --nvme-path D";
# see e2e-server-nvme.sh), ZS_E2E_LOAD (requests of the load check, default 2000).
# Exit: 0 all passed, 1 something failed, 77 skipped (no curl/jq/bash). Prints "ok - ..." /
# "not ok - ..." per check and a final count. Cleans up its servers and temp files on every exit.
# shellcheck disable=SC2016,SC2015  # jq programs are single-quoted; ok/nok always succeed
# shellcheck source=tests/lib/e2e.sh
. "$(dirname "$0")/lib/e2e.sh"
zs_bash "$@"
set -u
MODEL=$SHARED/models/stories260K
REF=$MODEL/reference.json
EXTRA_ARGS=${ZS_E2E_ARGS:-}
NLOAD=${ZS_E2E_LOAD:-2000}
T0=$(date +%s)
# the client scripts read these: start from none
unset ZS_URL ZS_API_KEY ZS_MODEL ZS_MAX_TOKENS ZS_TEMPERATURE ZS_SEED ZS_STOP ZS_EXTRA ZS_SYSTEM ZS_CHAT ZS_CURL ZS_TIMEOUT

zs_need curl
command -v jq >/dev/null 2>&1 || zs_apt_install jq
zs_need jq
zs_need_bin
zs_need_file "$REF"
zs_tmpdir e2e

# ------------------------------------------------------------------ reporting
note() { echo "# $*"; }
show() { # the last request and response, for a failure
    printf '#   request:  %s\n' "$(printf '%s' "$LASTREQ" | head -c 600 | tr '\n' ' ')"
    printf '#   response: HTTP %s %s\n' "$CODE" "$(head -c 700 "$T/body" | tr '\n' ' ')"
}

# ------------------------------------------------------------------ HTTP helpers
KEY="e2e-key-$$-$RANDOM"
URL=""
CODE=""; LASTREQ=""
: >"$T/body"; : >"$T/hdr"
# req METHOD PATH [BODY [curl args...]]: response body in $T/body, headers in $T/hdr, status in
# $CODE. The API key is sent unless NOAUTH=1; AUTH=... overrides the header value.
req() {
    local m=$1 p=$2 d=${3-}
    shift 2; [ $# -gt 0 ] && shift
    local a=(-sS -X "$m" --max-time "${MAXT:-30}" -o "$T/body" -D "$T/hdr" -w '%{http_code}')
    if [ "${NOAUTH:-0}" != 1 ]; then a+=(-H "Authorization: ${AUTH:-Bearer $KEY}"); fi
    if [ -n "$d" ]; then a+=(-H 'Content-Type: application/json' --data-binary "$d"); fi
    : >"$T/body"
    CODE=$(curl "${a[@]}" "$@" "$URL$p" 2>"$T/curlerr")
    LASTREQ="$m $p $(printf '%s' "$d" | head -c 400)"
}
post() { req POST "$@"; }
# jt FILTER [jq args...]: the jq boolean FILTER holds on the last response body
jt() { local f=$1; shift; jq -e "$@" "$f" "$T/body" >/dev/null 2>&1; }
jv() { local f=$1; shift; jq -r "$@" "$f" "$T/body" 2>/dev/null; }
hdr() { tr -d '\r' <"$T/hdr" | awk -v h="$1" 'BEGIN{IGNORECASE=1} tolower($0) ~ "^" tolower(h) ":" {sub(/^[^:]*: */, ""); print; exit}'; }
# expect DESC STATUS JQ-FILTER [jq args...]: one check on the last response
expect() {
    local desc=$1 st=$2 f=$3; shift 3
    if [ "$CODE" = "$st" ] && jt "$f" "$@"; then ok "$desc"; else nok "$desc"; echo "#   expected HTTP $st and $f"; show; fi
}
# experr DESC STATUS TYPE PARAM CODE: the OpenAI error shape; PARAM/CODE "-" = not checked,
# "null" = must be null, "a|b" = one of.
experr() {
    local desc=$1 st=$2 ty=$3 pa=$4 co=$5
    local f='(.error|type=="object") and (.error.message|type=="string" and length>0) and .error.type==$ty'
    [ "$pa" = null ] && f="$f and .error.param==null"
    [ "$pa" != null ] && [ "$pa" != - ] && f="$f and any(\$pa|split(\"|\")[]; . == \$r.error.param)"
    [ "$co" = null ] && f="$f and .error.code==null"
    [ "$co" != null ] && [ "$co" != - ] && f="$f and .error.code==\$co"
    f=". as \$r | $f"
    if [ "$CODE" = "$st" ] && jt "$f" --arg ty "$ty" --arg pa "$pa" --arg co "$co"; then
        ok "$desc → $st $ty$([ "$pa" != - ] && echo " param=$pa")$([ "$co" != - ] && echo " code=$co")"
    else
        nok "$desc → expected $st type=$ty param=$pa code=$co"; show
    fi
}
# sse FILE: the JSON chunks of an SSE body as one JSON array (on stdout)
sse() { tr -d '\r' <"$1" | sed -n 's/^data: //p' | grep -v '^\[DONE\]$' | jq -s . 2>/dev/null; }
# stream METHOD-less POST PATH BODY OUT: streamed request, raw SSE into OUT, status into $CODE
stream() {
    local p=$1 d=$2 out=$3
    CODE=$(curl -sS -N --max-time "${MAXT:-60}" -o "$out" -D "$out.hdr" -w '%{http_code}' \
        -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' --data-binary "$d" "$URL$p" 2>"$T/curlerr")
    LASTREQ="POST $p $d"
    cp "$out" "$T/body"
}
# metric NAME [LABEL-SUBSTRING]: sum of the samples of NAME (matching the label text) in $T/metrics
getmetrics() { curl -sS --max-time 10 -H "Authorization: Bearer $KEY" "$URL/metrics" -o "$T/metrics" 2>/dev/null; }
metric() {
    awk -v n="$1" -v l="${2-}" '
        /^#/ { next }
        { name = $1; sub(/\{.*/, "", name) }
        name == n && index($0, l) { s += $NF; found = 1 }
        END { if (found) printf "%.10g\n", s; else print "absent" }' "$T/metrics"
}
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.3f", b - a }'; }
calc() { awk "BEGIN { x = $*; print x }"; }
rss_kb() { awk '/^VmRSS:/ {print $2}' "/proc/$SPID/status" 2>/dev/null; }

# ------------------------------------------------------------------ server start/stop
# start_server NAME MODEL-DIR ARGS...: a server on a free loopback port, ready within ~180 s (NVMe
# shard files are written at the first load); sets URL
start_server() {
    local name=$1 dir=$2 t0
    shift 2
    t0=$(date +%s.%N)
    ZS_START_WAIT=1800 zs_start_server "$T/$name.log" --model "$dir" "$@" || { note "$name: did not start"; return 1; }
    URL=$ZS_URL
    note "$name: pid $SPID on $URL, ready after $(since "$t0") s ($*)"
}
# stop_server BOUND-S: SIGTERM, wait; sets STOP_RC (exit status, or "timeout") and STOP_S
stop_server() {
    local bound=$1 t0 i
    t0=$(date +%s.%N)
    kill -TERM "$SPID" 2>/dev/null
    STOP_RC=timeout
    for i in $(seq $((bound * 10))); do
        kill -0 "$SPID" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$SPID" 2>/dev/null; then
        kill -KILL "$SPID" 2>/dev/null; wait "$SPID" 2>/dev/null
    else
        wait "$SPID"; STOP_RC=$?
    fi
    STOP_S=$(since "$t0")
    SPID=""
}

# ------------------------------------------------------------------ reference data
REF1=$(jq -r '.cases[] | select(.prompt=="Once upon a time") | .new_text' "$REF")
REF2=$(jq -r '.cases[] | select(.prompt=="Tom and his dog") | .new_text' "$REF")
IDS1=$(jq -c '.cases[] | select(.prompt=="Once upon a time") | .prompt_ids' "$REF")
IDS2=$(jq -c '.cases[] | select(.prompt=="Tom and his dog") | .prompt_ids' "$REF")
[ -n "$REF1" ] && [ -n "$REF2" ] || { echo "not ok - cannot read $REF"; exit 1; }

note "zeroserve e2e: $BIN, model $MODEL${EXTRA_ARGS:+, extra flags: $EXTRA_ARGS}"
# shellcheck disable=SC2086
start_server main "$MODEL" --api-key "$KEY" --max-body-bytes 65536 $EXTRA_ARGS || zs_abort "server starts and /health turns 200"
ok "server starts and /health turns 200"
M=stories260K

# ================================================================== endpoints
NOAUTH=1 req GET /health
expect "GET /health without a key: 200 {\"status\":\"ok\"}" 200 '.status=="ok"'
[ "$(hdr content-type | cut -d';' -f1)" = application/json ] && ok "/health is application/json" || nok "/health content-type: $(hdr content-type)"
NOAUTH=0 AUTH="Bearer wrong" req GET /health
expect "GET /health with a wrong key is still 200" 200 '.status=="ok"'

req GET /v1/models
expect "GET /v1/models lists the served model id (basename of --model)" 200 \
    '.object=="list" and (.data|length)==1 and .data[0].id==$m and .data[0].object=="model" and (.data[0].created|type)=="number" and (.data[0].owned_by|type)=="string"' --arg m "$M"
req GET /v1/models/$M
expect "GET /v1/models/$M" 200 '.id==$m and .object=="model"' --arg m "$M"
req GET /v1/models/nope
experr "GET /v1/models/nope" 404 invalid_request_error - model_not_found

NOAUTH=1 req GET /
if [ "$CODE" = 200 ] && grep -q 'zeroserve playground' "$T/body" && [ "$(hdr content-type | cut -d';' -f1)" = text/html ]; then
    ok "GET / (no key needed) serves the playground page as text/html"
    cmp -s "$T/body" clients/web/index.html && ok "GET / is clients/web/index.html byte for byte" || nok "GET / differs from clients/web/index.html (stale build?)"
else nok "GET / serves the playground page"; show; fi

# ================================================================== completions
C='{"model":"stories260K","temperature":0,"max_tokens":64'
post /v1/completions "$C,\"prompt\":\"Once upon a time\"}"
expect "completion, greedy 64 tokens: text == reference new_text" 200 '.choices[0].text==$r' --arg r "$REF1"
expect "completion object fields (id, object, created, model, index, logprobs null)" 200 \
    '(.id|type)=="string" and (.id|length)>0 and .object=="text_completion" and (.created|type)=="number" and .model==$m and (.choices|length)==1 and .choices[0].index==0 and .choices[0].logprobs==null' --arg m "$M"
expect "finish_reason length; usage 5 + 64 = 69" 200 \
    '.choices[0].finish_reason=="length" and .usage.prompt_tokens==5 and .usage.completion_tokens==64 and .usage.total_tokens==69'
[ "$(hdr content-type | cut -d';' -f1)" = application/json ] && ok "completion is application/json" || nok "completion content-type: $(hdr content-type)"
post /v1/completions '{"prompt":"Once upon a time,","temperature":0,"max_tokens":63}'
expect "a continuation that starts with a space keeps it: \"Once upon a time,\" → \" there was…\" (reference minus its comma)" 200 \
    '.usage.prompt_tokens==6 and .choices[0].text==($r|.[1:])' --arg r "$REF1"
post /v1/completions "$C,\"prompt\":\"Tom and his dog\"}"
expect "completion \"Tom and his dog\": reference text, prompt_tokens 7" 200 \
    '.choices[0].text==$r and .usage.prompt_tokens==7 and .usage.completion_tokens==64' --arg r "$REF2"
post /v1/completions "$C,\"prompt\":[\"Once upon a time\",\"Tom and his dog\"]}"
expect "prompt as an array of 2 strings: 2 choices in order, both reference texts, usage summed" 200 \
    '(.choices|length)==2 and ([.choices[].index]|sort)==[0,1] and (.choices|map(select(.index==0))[0].text)==$a and (.choices|map(select(.index==1))[0].text)==$b and .usage.prompt_tokens==12 and .usage.completion_tokens==128 and .usage.total_tokens==140' \
    --arg a "$REF1" --arg b "$REF2"
post /v1/completions "$C,\"prompt\":$IDS1}"
expect "prompt as token ids $IDS1: reference text, prompt_tokens 5" 200 \
    '.choices[0].text==$r and .usage.prompt_tokens==5' --arg r "$REF1"
post /v1/completions "$C,\"prompt\":[$IDS1,$IDS2]}"
expect "prompt as an array of token-id arrays: both reference texts" 200 \
    '(.choices|length)==2 and (.choices|map(select(.index==0))[0].text)==$a and (.choices|map(select(.index==1))[0].text)==$b and .usage.prompt_tokens==12' \
    --arg a "$REF1" --arg b "$REF2"
post /v1/completions '{"prompt":"Once upon a time","temperature":0,"max_tokens":16}'
expect "no model field means the served model; 16 greedy tokens are a prefix of the reference" 200 \
    '.model==$m and .usage.completion_tokens==16 and .choices[0].finish_reason=="length" and (.choices[0].text|length)>0 and ($r|startswith($t))' \
    --arg m "$M" --arg r "$REF1" --arg t "$(jv '.choices[0].text')"
GREEDY16=$(jv '.choices[0].text')
post /v1/completions "$C,\"prompt\":\"Once upon a time\",\"user\":\"e2e-tester\"}"
expect "\"user\" is accepted" 200 '.choices[0].text==$r' --arg r "$REF1"

# seeds
S='{"prompt":"Once upon a time","temperature":0.8,"max_tokens":32'
post /v1/completions "$S,\"seed\":1234}"; A=$(jv '.choices[0].text'); CA=$CODE
post /v1/completions "$S,\"seed\":1234}"; B=$(jv '.choices[0].text')
post /v1/completions "$S,\"seed\":1235}"; D=$(jv '.choices[0].text')
if [ "$CA" = 200 ] && [ -n "$A" ] && [ "$A" = "$B" ]; then ok "same seed twice (temperature 0.8): same text"; else nok "same seed twice: same text"; note "seed 1234: '$A' / '$B'"; fi
if [ -n "$D" ] && [ "$A" != "$D" ]; then ok "another seed: another text"; else nok "seed 1235 gives another text than seed 1234"; note "'$A' / '$D'"; fi
[ "$A" != "$REF1" ] && ok "temperature 0.8 does not give the greedy text" || nok "temperature 0.8 gave the greedy text"

# stop strings
post /v1/completions "$C,\"prompt\":\"Once upon a time\",\"stop\":[\"Lily\"]}"
expect "stop [\"Lily\"]: text ends right before it, finish_reason stop" 200 \
    '.choices[0].text==($r|.[0:index("Lily")]) and .choices[0].finish_reason=="stop" and .usage.completion_tokens<64' --arg r "$REF1"
post /v1/completions "$C,\"prompt\":\"Once upon a time\",\"stop\":\"park\"}"
expect "stop \"park\" (a string): text ends right before it, finish_reason stop" 200 \
    '.choices[0].text==($r|.[0:index("park")]) and .choices[0].finish_reason=="stop"' --arg r "$REF1"
post /v1/completions "$C,\"prompt\":\"Once upon a time\",\"stop\":[\"zzz-never\",\". She\"]}"
expect "stop with 2 strings, the second matching" 200 \
    '.choices[0].text==($r|.[0:index(". She")]) and .choices[0].finish_reason=="stop"' --arg r "$REF1"

# n
post /v1/completions "$C,\"prompt\":\"Once upon a time\",\"n\":2}"
expect "n=2 greedy: two choices (index 0, 1), both the reference, usage 5 + 128" 200 \
    '(.choices|length)==2 and ([.choices[].index]|sort)==[0,1] and all(.choices[]; .text==$r) and .usage.prompt_tokens==5 and .usage.completion_tokens==128' --arg r "$REF1"
post /v1/completions '{"prompt":"Once upon a time","temperature":0.8,"max_tokens":16,"seed":7,"n":2}'
expect "n=2 sampled: two choices of 16 tokens" 200 \
    '(.choices|length)==2 and ([.choices[].index]|sort)==[0,1] and all(.choices[]; .finish_reason=="length" and (.text|type)=="string") and .usage.completion_tokens==32'

# logprobs (completions: legacy shape)
post /v1/completions '{"prompt":"Once upon a time","temperature":0,"max_tokens":8,"logprobs":2}'
expect "completion logprobs 2: tokens/token_logprobs/top_logprobs/text_offset, 8 each" 200 \
    '.choices[0].logprobs as $l | ($l.tokens|length)==8 and ($l.token_logprobs|length)==8 and ($l.top_logprobs|length)==8 and ($l.text_offset|length)==8 and ($l.tokens|add)==.choices[0].text and all($l.token_logprobs[]; type=="number" and . <= 0) and all($l.top_logprobs[]; type=="object" and length>=1 and length<=3) and ($l.text_offset|. == sort)'
expect "greedy: each sampled token has the top logprob" 200 \
    '.choices[0].logprobs as $l | all(range(0;8); $l.token_logprobs[.] >= ([$l.top_logprobs[.][]]|max) - 1e-4)'
expect "logprobs: the text is the greedy text" 200 '.choices[0].text as $t | ($t|length)>0 and ($g|startswith($t))' --arg g "$GREEDY16"
post /v1/completions '{"prompt":"Once upon a time","temperature":0,"max_tokens":4,"logprobs":0}'
expect "completion logprobs 0: the sampled token's logprob only" 200 \
    '(.choices[0].logprobs.token_logprobs|length)==4 and all(.choices[0].logprobs.token_logprobs[]; type=="number")'

# ================================================================== chat
MSGS='[{"role":"system","content":"You are a storyteller."},{"role":"user","content":"Tell me a story."},{"role":"assistant","content":"Once upon a time"},{"role":"user","content":"Go on."}]'
post /v1/chat/completions "{\"model\":\"$M\",\"messages\":$MSGS,\"temperature\":0,\"max_tokens\":12}"
expect "chat with system/user/assistant/user roles" 200 \
    '.object=="chat.completion" and (.id|type)=="string" and (.created|type)=="number" and .model==$m and (.choices|length)==1 and .choices[0].index==0 and .choices[0].message.role=="assistant" and (.choices[0].message.content|type)=="string" and (.choices[0].finish_reason=="stop" or .choices[0].finish_reason=="length") and .usage.prompt_tokens>7 and .usage.completion_tokens<=12 and .usage.total_tokens==.usage.prompt_tokens+.usage.completion_tokens' --arg m "$M"
CHAT=$(jv '.choices[0].message.content'); CHATFIN=$(jv '.choices[0].finish_reason'); CHATPT=$(jv '.usage.prompt_tokens')
post /v1/chat/completions "{\"messages\":$MSGS,\"temperature\":0,\"max_tokens\":12}"
expect "chat greedy is deterministic" 200 '.choices[0].message.content==$c' --arg c "$CHAT"
post /v1/chat/completions "{\"messages\":$MSGS,\"temperature\":0,\"max_completion_tokens\":7,\"ignore_eos\":true}"
expect "chat max_completion_tokens 7: 7 tokens, finish length" 200 '.usage.completion_tokens==7 and .choices[0].finish_reason=="length"'
post /v1/chat/completions "{\"messages\":$MSGS,\"temperature\":0,\"max_tokens\":5,\"ignore_eos\":true}"
expect "chat max_tokens 5: 5 tokens, finish length" 200 '.usage.completion_tokens==5 and .choices[0].finish_reason=="length"'
post /v1/chat/completions "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"temperature\":0.8,\"seed\":99,\"max_tokens\":16,\"user\":\"e2e\"}"
A=$(jv '.choices[0].message.content'); CA=$CODE
post /v1/chat/completions "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"temperature\":0.8,\"seed\":99,\"max_tokens\":16,\"user\":\"e2e\"}"
[ "$CA" = 200 ] && [ "$A" = "$(jv '.choices[0].message.content')" ] && ok "chat: same seed, same answer (and \"user\" accepted)" || { nok "chat: same seed, same answer"; show; }
post /v1/chat/completions "{\"messages\":$MSGS,\"temperature\":0,\"max_tokens\":6,\"ignore_eos\":true,\"logprobs\":true,\"top_logprobs\":2}"
expect "chat logprobs: content[] of {token, logprob, bytes, top_logprobs[2]}, one per token" 200 \
    '.choices[0].logprobs.content as $c | ($c|length)==6 and ($c|map(.token)|add)==.choices[0].message.content and all($c[]; (.token|type)=="string" and (.logprob|type)=="number" and .logprob<=0 and (.bytes|type)=="array" and (.top_logprobs|length)==2 and all(.top_logprobs[]; (.token|type)=="string" and (.logprob|type)=="number" and (.bytes|type)=="array"))'
post /v1/chat/completions "{\"messages\":$MSGS,\"temperature\":0,\"max_tokens\":6,\"n\":2}"
expect "chat n=2 greedy: two equal choices" 200 '(.choices|length)==2 and .choices[0].message.content==.choices[1].message.content and ([.choices[].index]|sort)==[0,1]'

# ================================================================== streaming
stream /v1/completions "$C,\"prompt\":\"Once upon a time\",\"stream\":true}" "$T/s1"
sse "$T/s1" >"$T/s1.json"
if [ "$CODE" = 200 ] && [ "$(tr -d '\r' <"$T/s1.hdr" | awk -F': *' 'tolower($1)=="content-type"{print $2}' | cut -d';' -f1)" = text/event-stream ]; then
    ok "stream: 200 text/event-stream"; else nok "stream: 200 text/event-stream (got $CODE)"; show; fi
if [ "$(tr -d '\r' <"$T/s1" | grep -v '^$' | tail -n 1)" = "data: [DONE]" ] && [ "$(grep -c '^data: \[DONE\]' "$T/s1")" = 1 ] &&
   [ -z "$(tr -d '\r' <"$T/s1" | grep -v '^$' | grep -v '^data: ')" ]; then
    ok "stream: only data: lines, ending with one data: [DONE]"; else nok "stream: data: lines ending with data: [DONE]"; tail -n 3 "$T/s1" | sed 's/^/#   /'; fi
if jq -e --arg r "$REF1" '(map(.choices[]? | select(.index==0) | .text) | add) == $r' "$T/s1.json" >/dev/null; then
    ok "stream: concatenated chunk texts == non-streamed greedy text"
else nok "stream: concatenated chunk texts == reference"; note "got: $(jq -c 'map(.choices[]?.text)|add' "$T/s1.json" | head -c 400)"; fi
jq -e 'length>=2 and all(.[]; .object=="text_completion" and .model=="stories260K") and (map(.id)|unique|length)==1 and (map(.choices[]?|select(.finish_reason!=null)|.finish_reason)==["length"]) and all(.[]; .usage==null)' "$T/s1.json" >/dev/null &&
    ok "stream chunks: one id, object text_completion, one finish_reason length, no usage" || { nok "stream chunk fields"; jq -c '.[0], .[-1]' "$T/s1.json" | sed 's/^/#   /'; }

stream /v1/completions '{"prompt":"Once upon a time","temperature":0,"max_tokens":16,"stream":true,"stream_options":{"include_usage":true}}' "$T/s2"
sse "$T/s2" >"$T/s2.json"
jq -e '.[-1].usage=={"prompt_tokens":5,"completion_tokens":16,"total_tokens":21} and .[-1].choices==[] and all(.[0:-1][]; .usage==null)' "$T/s2.json" >/dev/null &&
    ok "stream_options.include_usage: a last chunk with choices [] and usage 5/16/21, null before" || { nok "include_usage chunk"; jq -c '.[-2:]' "$T/s2.json" | sed 's/^/#   /'; }
jq -e --arg g "$GREEDY16" '(map(.choices[]?.text)|add)==$g' "$T/s2.json" >/dev/null && ok "stream of 16 greedy tokens == non-streamed" || nok "stream of 16 greedy tokens == non-streamed"

stream /v1/completions "$C,\"prompt\":\"Once upon a time\",\"stream\":true,\"stop\":[\"Lily\"]}" "$T/s3"
sse "$T/s3" >"$T/s3.json"
jq -e --arg r "$REF1" '(map(.choices[]?.text)|add)==($r|.[0:index("Lily")]) and (map(.choices[]?.finish_reason|select(.!=null))==["stop"])' "$T/s3.json" >/dev/null &&
    ok "stream with stop: text held back and cut before the stop string, finish stop" || { nok "stream with stop"; jq -c 'map(.choices[]?.text)' "$T/s3.json" | head -c 600; echo; }

stream /v1/chat/completions "{\"messages\":$MSGS,\"temperature\":0,\"max_tokens\":12,\"stream\":true}" "$T/s4"
sse "$T/s4" >"$T/s4.json"
jq -e --arg c "$CHAT" --arg f "$CHATFIN" '.[0].choices[0].delta.role=="assistant" and all(.[]; .object=="chat.completion.chunk") and ((map(.choices[]?.delta.content // "")|add)==$c) and (map(.choices[]?.finish_reason|select(.!=null))==[$f])' "$T/s4.json" >/dev/null &&
    ok "chat stream: role first, deltas concatenate to the non-streamed answer, same finish_reason" || { nok "chat stream == non-streamed"; note "non-streamed: '$CHAT' ($CHATFIN)"; jq -c 'map(.choices[]?.delta)' "$T/s4.json" | head -c 600; echo; }
[ "$(tr -d '\r' <"$T/s4" | grep -v '^$' | tail -n 1)" = "data: [DONE]" ] && ok "chat stream ends with data: [DONE]" || nok "chat stream ends with data: [DONE]"
stream /v1/chat/completions "{\"messages\":$MSGS,\"temperature\":0,\"max_tokens\":12,\"stream\":true,\"stream_options\":{\"include_usage\":true}}" "$T/s5"
sse "$T/s5" >"$T/s5.json"
jq -e --argjson p "$CHATPT" '.[-1].choices==[] and .[-1].usage.prompt_tokens==$p and .[-1].usage.total_tokens==$p+.[-1].usage.completion_tokens' "$T/s5.json" >/dev/null &&
    ok "chat stream include_usage" || { nok "chat stream include_usage"; jq -c '.[-1]' "$T/s5.json"; }

# ================================================================== the clients (clients/curl/*.sh, clients/zs)
export ZS_URL=$URL
out=$(sh clients/curl/health.sh); [ "$(printf '%s' "$out" | jq -r .status 2>/dev/null)" = ok ] && ok "clients/curl/health.sh" || nok "clients/curl/health.sh: $out"
out=$(ZS_API_KEY=$KEY sh clients/curl/models.sh); [ "$(printf '%s' "$out" | jq -r '.data[0].id' 2>/dev/null)" = "$M" ] && ok "clients/curl/models.sh" || nok "clients/curl/models.sh: $out"
out=$(ZS_API_KEY=$KEY ZS_TEMPERATURE=0 ZS_MAX_TOKENS=64 sh clients/curl/complete.sh "Once upon a time")
printf '%s' "$out" | jq -e --arg r "$REF1" '.choices[0].text==$r' >/dev/null 2>&1 && ok "clients/curl/complete.sh: the reference text" || nok "clients/curl/complete.sh: $(printf '%s' "$out" | head -c 300)"
out=$(ZS_API_KEY=$KEY ZS_MODEL=$M ZS_TEMPERATURE=0 ZS_MAX_TOKENS=64 ZS_STOP=Lily sh clients/curl/complete.sh "Once upon a time")
printf '%s' "$out" | jq -e --arg r "$REF1" '.choices[0].text==($r|.[0:index("Lily")])' >/dev/null 2>&1 && ok "clients/curl/complete.sh with ZS_MODEL and ZS_STOP" || nok "complete.sh with ZS_STOP: $(printf '%s' "$out" | head -c 300)"
out=$(ZS_API_KEY=$KEY ZS_SYSTEM="You tell stories." ZS_TEMPERATURE=0.7 ZS_SEED=3 ZS_MAX_TOKENS=8 ZS_EXTRA='"top_p":0.9' sh clients/curl/chat.sh 'Say "hi"')
printf '%s' "$out" | jq -e '.object=="chat.completion" and (.choices[0].message.content|type)=="string" and .usage.completion_tokens<=8' >/dev/null 2>&1 && ok "clients/curl/chat.sh (system message, seed, ZS_EXTRA, quotes in the prompt)" || nok "clients/curl/chat.sh: $(printf '%s' "$out" | head -c 300)"
ZS_API_KEY=$KEY ZS_TEMPERATURE=0 ZS_MAX_TOKENS=64 sh clients/curl/stream.sh "Once upon a time" >"$T/cs1"
[ "$(tr -d '\r' <"$T/cs1" | grep -v '^$' | tail -n 1)" = "data: [DONE]" ] && sse "$T/cs1" | jq -e --arg r "$REF1" '(map(.choices[]?.text)|add)==$r and .[-1].usage.completion_tokens==64' >/dev/null 2>&1 &&
    ok "clients/curl/stream.sh: SSE with the reference text, usage chunk, [DONE]" || { nok "clients/curl/stream.sh"; tail -n 3 "$T/cs1" | sed 's/^/#   /'; }
ZS_CHAT=1 ZS_API_KEY=$KEY ZS_MAX_TOKENS=8 sh clients/curl/stream.sh "Hello" >"$T/cs2"
sse "$T/cs2" | jq -e '.[0].object=="chat.completion.chunk"' >/dev/null 2>&1 && grep -q '^data: \[DONE\]' "$T/cs2" && ok "clients/curl/stream.sh with ZS_CHAT=1" || nok "clients/curl/stream.sh with ZS_CHAT=1"
out=$(sh clients/curl/complete.sh "Once" 2>/dev/null); rc=$?
[ $rc = 22 ] && printf '%s' "$out" | jq -e '.error.code=="invalid_api_key"' >/dev/null 2>&1 && ok "clients/curl/complete.sh without the key: exit 22 and the 401 error body" || nok "complete.sh without a key: exit $rc, $out"
out=$(clients/zs -k "$KEY" -n 64 -t 0 "Once upon a time" 2>"$T/zs.err"); rc=$?
[ $rc = 0 ] && [ "$out" = "$REF1" ] && ok "clients/zs streams the reference text" || { nok "clients/zs: exit $rc"; note "got: '$out' $(cat "$T/zs.err")"; }
out=$(ZS_API_KEY=$KEY clients/zs -c -v -n 6 -t 0.5 -s 9 "Hello" 2>"$T/zs.err"); rc=$?
[ $rc = 0 ] && grep -q 'completion tokens' "$T/zs.err" && ok "clients/zs -c -v (chat, usage line)" || { nok "clients/zs -c: exit $rc"; note "$(cat "$T/zs.err")"; }
clients/zs -k "$KEY" -m no-such-model "Once" >/dev/null 2>"$T/zs.err"; rc=$?
[ $rc = 1 ] && grep -q 'model_not_found' "$T/zs.err" && grep -q '404' "$T/zs.err" && ok "clients/zs: HTTP error → exit 1 with the message ($(head -c 100 "$T/zs.err"))" || { nok "clients/zs on an unknown model: exit $rc"; note "$(cat "$T/zs.err")"; }
clients/zs "Once" >/dev/null 2>"$T/zs.err"; rc=$?
[ $rc = 1 ] && grep -q 'invalid_api_key' "$T/zs.err" && ok "clients/zs without the key: exit 1, invalid_api_key" || { nok "clients/zs without a key: exit $rc"; note "$(cat "$T/zs.err")"; }
unset ZS_URL

# ================================================================== metrics
getmetrics
if [ -s "$T/metrics" ]; then
    missing=""
    for m in zeroserve_requests_total zeroserve_prompt_tokens_total zeroserve_generation_tokens_total \
             zeroserve_time_to_first_token_seconds_bucket zeroserve_time_to_first_token_seconds_sum zeroserve_time_to_first_token_seconds_count \
             zeroserve_inter_token_latency_seconds_bucket zeroserve_inter_token_latency_seconds_count \
             zeroserve_queue_length zeroserve_running_sequences zeroserve_kv_blocks_used zeroserve_kv_blocks_total \
             zeroserve_bytes_streamed_total zeroserve_gather_stall_seconds_total zeroserve_engine_steps_total; do
        [ "$(metric $m)" = absent ] && missing="$missing $m"
    done
    [ -z "$missing" ] && ok "/metrics has every metric" || nok "/metrics lacks:$missing"
    grep -q '^# TYPE zeroserve_time_to_first_token_seconds histogram' "$T/metrics" && grep -q 'zeroserve_time_to_first_token_seconds_bucket{le="+Inf"}' "$T/metrics" &&
        ok "TTFT is a Prometheus histogram with a +Inf bucket" || nok "TTFT histogram TYPE line / +Inf bucket"
    grep -q '^zeroserve_bytes_streamed_total{tier="' "$T/metrics" && ok "bytes_streamed_total has a tier label" || nok "bytes_streamed_total{tier=...}"
    v=$(metric zeroserve_requests_total 'route="/v1/completions",method="POST",status="200"')
    [ "$v" != absent ] && [ "${v%.*}" -ge 10 ] && ok "requests_total{route=\"/v1/completions\",method=\"POST\",status=\"200\"} = $v" || { nok "requests_total for completions 200: $v"; grep '^zeroserve_requests_total' "$T/metrics" | head -5 | sed 's/^/#   /'; }
    [ "$(metric zeroserve_kv_blocks_total)" != absent ] && [ "$(metric zeroserve_kv_blocks_total | cut -d. -f1)" -gt 0 ] && ok "kv_blocks_total > 0" || nok "kv_blocks_total > 0"
    p0=$(metric zeroserve_prompt_tokens_total); g0=$(metric zeroserve_generation_tokens_total)
    st0=$(metric zeroserve_engine_steps_total); tt0=$(metric zeroserve_time_to_first_token_seconds_count)
    post /v1/completions '{"prompt":"Once upon a time","temperature":0,"max_tokens":16}'
    getmetrics
    p1=$(metric zeroserve_prompt_tokens_total); g1=$(metric zeroserve_generation_tokens_total)
    st1=$(metric zeroserve_engine_steps_total); tt1=$(metric zeroserve_time_to_first_token_seconds_count)
    [ "$(calc "$p1 - $p0")" = 5 ] && [ "$(calc "$g1 - $g0")" = 16 ] && ok "one request: prompt_tokens_total +5, generation_tokens_total +16" ||
        nok "prompt/generation token counters: +$(calc "$p1 - $p0") / +$(calc "$g1 - $g0"), want +5 / +16"
    [ "$(calc "$st1 > $st0")" = 1 ] && [ "$(calc "$tt1 - $tt0")" = 1 ] && ok "engine_steps_total grows; TTFT count +1" || nok "engine steps $st0→$st1, TTFT count $tt0→$tt1"
    [ "$(metric zeroserve_running_sequences)" = 0 ] && [ "$(metric zeroserve_queue_length)" = 0 ] && ok "idle: running_sequences 0, queue_length 0" || nok "idle: running $(metric zeroserve_running_sequences) queue $(metric zeroserve_queue_length)"
else
    nok "GET /metrics answers"; fi
curl -sS --max-time 10 -o /dev/null -D "$T/mhdr" -H "Authorization: Bearer $KEY" "$URL/metrics"
tr -d '\r' <"$T/mhdr" | grep -qi '^content-type: text/plain' && ok "/metrics is text/plain" || nok "/metrics content-type: $(grep -i content-type "$T/mhdr")"

# ================================================================== errors, with a normal request running meanwhile
# background: greedy requests (plain and streamed) in a loop until the error phase ends
touch "$T/errphase"
(
    i=0
    while [ -e "$T/errphase" ] && [ $i -lt 400 ]; do
        curl -sS --max-time 30 -o "$T/bg.$i" -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' \
            --data-binary '{"prompt":"Once upon a time","temperature":0,"max_tokens":64}' "$URL/v1/completions" 2>/dev/null
        curl -sS -N --max-time 30 -o "$T/bgs.$i" -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' \
            --data-binary '{"prompt":"Once upon a time","temperature":0,"max_tokens":64,"stream":true}' "$URL/v1/completions" 2>/dev/null
        i=$((i + 1))
    done
) &
BG=$!; ZS_BGPIDS="$ZS_BGPIDS $BG"

post /v1/completions '{"model":"stories260K","prompt":'
experr "malformed JSON" 400 invalid_request_error null -
post /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}'
experr "malformed JSON (chat)" 400 invalid_request_error null -
post /v1/completions '[1,2,3]'
experr "body is a JSON array, not an object" 400 invalid_request_error null -
req POST /v1/completions "" -H 'Content-Type: application/json'
experr "empty body" 400 invalid_request_error - -
post /v1/completions '{"prompt":"Once upon a time","max_tokens":"ten"}'
experr "max_tokens a string" 400 invalid_request_error max_tokens invalid_type
post /v1/completions '{"prompt":"Once upon a time","max_tokens":1.5}'
experr "max_tokens not an integer" 400 invalid_request_error max_tokens invalid_type
post /v1/completions '{"prompt":"Once upon a time","temperature":"hot"}'
experr "temperature a string" 400 invalid_request_error temperature invalid_type
post /v1/completions '{"prompt":42}'
experr "prompt a number" 400 invalid_request_error prompt invalid_type
post /v1/completions '{"prompt":"Once","stream":"yes"}'
experr "stream a string" 400 invalid_request_error stream invalid_type
post /v1/completions '{"prompt":"Once","stop":5}'
experr "stop a number" 400 invalid_request_error stop invalid_type
post /v1/completions '{"prompt":"Once","n":"2"}'
experr "n a string" 400 invalid_request_error n invalid_type
post /v1/completions '{"prompt":"Once","seed":"x"}'
experr "seed a string" 400 invalid_request_error seed invalid_type
post /v1/completions '{"prompt":"Once","top_p":[1]}'
experr "top_p an array" 400 invalid_request_error top_p invalid_type
post /v1/completions '{"prompt":"Once","model":5}'
experr "model a number" 400 invalid_request_error model invalid_type
post /v1/completions '{"prompt":"Once","user":7}'
experr "user a number" 400 invalid_request_error user invalid_type
post /v1/completions '{"prompt":"Once","stream":true,"stream_options":{"include_usage":"yes"}}'
experr "stream_options.include_usage a string" 400 invalid_request_error "stream_options|stream_options.include_usage" invalid_type
post /v1/chat/completions '{"messages":"hi"}'
experr "chat messages a string" 400 invalid_request_error messages invalid_type
post /v1/chat/completions '{"messages":[{"role":"user","content":5}]}'
experr "chat message content a number" 400 invalid_request_error "messages|messages[0]|messages[0].content" -
post /v1/chat/completions '{"messages":[{"role":"wizard","content":"hi"}]}'
experr "chat message with an unknown role" 400 invalid_request_error "messages|messages[0]|messages[0].role" invalid_value
post /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}],"logprobs":"yes"}'
experr "chat logprobs a string" 400 invalid_request_error logprobs invalid_type
post /v1/completions '{"prompt":"Once","bogus_field":1}'
experr "unknown field" 400 invalid_request_error bogus_field unknown_parameter
# out of range
post /v1/completions '{"prompt":"Once","temperature":-1}'
experr "temperature -1" 400 invalid_request_error temperature invalid_value
post /v1/completions '{"prompt":"Once","temperature":2.5}'
experr "temperature 2.5" 400 invalid_request_error temperature invalid_value
post /v1/completions '{"prompt":"Once","top_p":1.5}'
experr "top_p 1.5" 400 invalid_request_error top_p invalid_value
post /v1/completions '{"prompt":"Once","max_tokens":0}'
experr "max_tokens 0" 400 invalid_request_error max_tokens invalid_value
post /v1/completions '{"prompt":"Once","max_tokens":-5}'
experr "max_tokens -5" 400 invalid_request_error max_tokens invalid_value
post /v1/completions '{"prompt":"Once","n":0}'
experr "n 0" 400 invalid_request_error n invalid_value
post /v1/completions '{"prompt":"Once","logprobs":6}'
experr "completions logprobs 6 (max 5)" 400 invalid_request_error logprobs invalid_value
post /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}],"logprobs":true,"top_logprobs":21}'
experr "chat top_logprobs 21 (max 20)" 400 invalid_request_error top_logprobs invalid_value
post /v1/completions '{"prompt":[1,403,999999]}'
experr "token id outside the vocabulary" 400 invalid_request_error prompt invalid_value
post /v1/completions '{"max_tokens":4}'
experr "prompt missing" 400 invalid_request_error prompt missing_required_parameter
post /v1/chat/completions '{"max_tokens":4}'
experr "messages missing" 400 invalid_request_error messages missing_required_parameter
post /v1/chat/completions '{"messages":[]}'
experr "messages empty" 400 invalid_request_error messages invalid_value
# unknown model
post /v1/completions '{"model":"no-such-model","prompt":"Once"}'
experr "completions with an unknown model" 404 invalid_request_error model model_not_found
post /v1/chat/completions '{"model":"no-such-model","messages":[{"role":"user","content":"hi"}]}'
experr "chat with an unknown model" 404 invalid_request_error model model_not_found
# context (512 tokens)
post /v1/completions '{"prompt":"Once upon a time","max_tokens":600}'
experr "prompt 5 + max_tokens 600 > context 512" 400 invalid_request_error "max_tokens|prompt" context_length_exceeded
post /v1/completions '{"prompt":"Once upon a time","max_tokens":508}'
experr "prompt 5 + max_tokens 508 = 513 > 512" 400 invalid_request_error "max_tokens|prompt" context_length_exceeded
post /v1/completions "{\"prompt\":[$(seq -s, 1 520 | sed 's/[0-9]*/300/g')],\"max_tokens\":1}"
experr "a 520-token prompt" 400 invalid_request_error "prompt|max_tokens" context_length_exceeded
post /v1/chat/completions "{\"messages\":[{\"role\":\"user\",\"content\":\"$(printf 'Once upon a time %.0s' $(seq 150))\"}],\"max_tokens\":4}"
experr "chat: a too-long message" 400 invalid_request_error "messages|max_tokens|max_completion_tokens" context_length_exceeded
post /v1/completions '{"prompt":"Once upon a time","max_tokens":507,"temperature":0}'
expect "prompt 5 + max_tokens 507 = 512 fits" 200 '.usage.completion_tokens>=1'
# body limit (--max-body-bytes 65536)
head -c 70000 /dev/zero | tr '\0' 'a' | sed 's/^/{"prompt":"/; s/$/"}/' >"$T/big.json"
req POST /v1/completions "" -H 'Content-Type: application/json' --data-binary @"$T/big.json"
experr "a 70 kB body over --max-body-bytes 65536" 413 invalid_request_error - request_too_large
# routes, methods, keys
req GET /v1/nope
experr "unknown route GET /v1/nope" 404 invalid_request_error - not_found
req POST /v2/completions '{"prompt":"x"}'
experr "unknown route POST /v2/completions" 404 invalid_request_error - not_found
req GET /v1/completions
experr "GET /v1/completions" 405 invalid_request_error - method_not_allowed
hdr allow | grep -q POST && ok "405 has Allow: POST" || nok "405 Allow header: '$(hdr allow)'"
req DELETE /v1/models
experr "DELETE /v1/models" 405 invalid_request_error - method_not_allowed
hdr allow | grep -q GET && ok "405 has Allow: GET" || nok "405 Allow header: '$(hdr allow)'"
req PUT /v1/chat/completions '{}'
experr "PUT /v1/chat/completions" 405 invalid_request_error - method_not_allowed
NOAUTH=1 req GET /v1/models
experr "GET /v1/models without a key" 401 invalid_request_error - invalid_api_key
AUTH="Bearer wrong-$KEY" req GET /v1/models
experr "GET /v1/models with a wrong key" 401 invalid_request_error - invalid_api_key
NOAUTH=1 req POST /v1/completions '{"prompt":"Once"}'
experr "POST /v1/completions without a key" 401 invalid_request_error - invalid_api_key
AUTH="Bearer wrong" req POST /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}]}'
experr "POST /v1/chat/completions with a wrong key" 401 invalid_request_error - invalid_api_key
AUTH="Basic $KEY" req GET /v1/models
experr "Authorization with another scheme" 401 invalid_request_error - invalid_api_key
NOAUTH=1 req GET /metrics
experr "GET /metrics without a key" 401 invalid_request_error - invalid_api_key

rm -f "$T/errphase"
wait "$BG" 2>/dev/null
nbg=0; badbg=0
for f in "$T"/bg.*; do
    [ -e "$f" ] || continue
    nbg=$((nbg + 1))
    jq -e --arg r "$REF1" '.choices[0].text==$r' "$f" >/dev/null 2>&1 || badbg=$((badbg + 1))
done
for f in "$T"/bgs.*; do
    [ -e "$f" ] || continue
    nbg=$((nbg + 1))
    sse "$f" | jq -e --arg r "$REF1" '(map(.choices[]?.text)|add)==$r' >/dev/null 2>&1 && grep -q '^data: \[DONE\]' "$f" || badbg=$((badbg + 1))
done
[ $nbg -ge 2 ] && [ $badbg = 0 ] && ok "$nbg normal requests (plain + streamed) running during the error cases all got the reference text" ||
    nok "normal requests during the error cases: $badbg of $nbg wrong"
getmetrics
v=$(metric zeroserve_requests_total 'route="/v1/completions",method="POST",status="400"')
[ "$v" != absent ] && [ "${v%.*}" -ge 20 ] && ok "requests_total counts the 400s of /v1/completions ($v)" || nok "requests_total{/v1/completions,POST,400} = $v"
[ "$(metric zeroserve_requests_total 'status="404"')" != absent ] && ok "requests_total counts 404s" || nok "requests_total has no status=\"404\" sample"

# ================================================================== cancellation
getmetrics
KV_IDLE=$(metric zeroserve_kv_blocks_used)
g0=$(metric zeroserve_generation_tokens_total)
# wait_idle SECONDS: polls /metrics until kv_blocks_used is back at $KV_IDLE and nothing runs or waits
wait_idle() {
    local t0
    t0=$(date +%s.%N)
    while :; do
        getmetrics
        if [ "$(metric zeroserve_kv_blocks_used)" = "$KV_IDLE" ] && [ "$(metric zeroserve_running_sequences)" = 0 ] &&
           [ "$(metric zeroserve_queue_length)" = 0 ]; then
            IDLE_S=$(since "$t0"); return 0
        fi
        [ "$(calc "$(since "$t0") > $1")" = 1 ] && break
        sleep 0.05
    done
    IDLE_S=never; return 1
}
curl -sS -N --max-time 30 -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' \
    --data-binary '{"prompt":"Once upon a time","temperature":0.8,"seed":3,"max_tokens":500,"stream":true}' \
    "$URL/v1/completions" 2>/dev/null | head -n 6 >"$T/cancel1"
nchunks=$(grep -c '^data: {' "$T/cancel1")
if wait_idle 1; then ok "a stream closed by the client after $nchunks chunks: kv_blocks_used back to $KV_IDLE, running 0 within ${IDLE_S}s"
else nok "after a client closed its stream: kv_blocks_used $(metric zeroserve_kv_blocks_used) (idle $KV_IDLE), running $(metric zeroserve_running_sequences) after 1 s"; fi
note "(stories260K generates 500 tokens in well under a second, so the discriminating cancellation check is the one on the slow model below)"

# ================================================================== concurrency: 32 streams == their solo runs
CB='{"prompt":"Once upon a time","temperature":0.8,"max_tokens":24,"stream":true,"seed":'
for i in $(seq 1 32); do
    stream /v1/completions "$CB$((100 + i))}" "$T/solo.$i"
    sse "$T/solo.$i" | jq -r -j 'map(.choices[]?.text)|add // ""' >"$T/solo.$i.txt"
done
PP=""
for i in $(seq 1 32); do
    curl -sS -N --max-time 60 -o "$T/par.$i" -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' \
        --data-binary "$CB$((100 + i))}" "$URL/v1/completions" 2>/dev/null &
    PP="$PP $!"
done
# shellcheck disable=SC2086
wait $PP 2>/dev/null
same=0; diffs=""
for i in $(seq 1 32); do
    sse "$T/par.$i" | jq -r -j 'map(.choices[]?.text)|add // ""' >"$T/par.$i.txt"
    if [ -s "$T/solo.$i.txt" ] && cmp -s "$T/solo.$i.txt" "$T/par.$i.txt" && grep -q '^data: \[DONE\]' "$T/par.$i"; then same=$((same + 1)); else diffs="$diffs $i"; fi
done
distinct=$(for i in $(seq 1 32); do md5sum <"$T/solo.$i.txt"; done | sort -u | wc -l)
[ "$same" = 32 ] && ok "32 concurrent streams (seeds 101-132, temperature 0.8) each equal their solo run" ||
    { nok "32 concurrent streams equal their solo runs: $same of 32 (differ:$diffs)"; i=${diffs# }; i=${i%% *}; note "seed $((100 + i)) solo: '$(cat "$T/solo.$i.txt")'"; note "seed $((100 + i)) in batch: '$(cat "$T/par.$i.txt")'"; }
[ "$distinct" -ge 16 ] && ok "the 32 seeds give $distinct distinct texts" || nok "the 32 seeds give only $distinct distinct texts"

# ================================================================== bounded load
# worker W N: N requests one after another on one curl process (--next), cycling through
# a plain completion, a chat completion and a streamed completion; one status code per line.
printf '{"prompt":"Once upon a time","max_tokens":8,"temperature":0.8}' >"$T/load0.json"
printf '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":8,"temperature":0.8,"ignore_eos":true}' >"$T/load1.json"
printf '{"prompt":"Tom and his dog","max_tokens":8,"temperature":0.8,"stream":true}' >"$T/load2.json"
cat >"$T/worker.sh" <<EOF
w=\$1; n=\$2; args=()
for ((j = 0; j < n; j++)); do
    k=\$(( (w + j) % 3 ))
    [ \$k = 1 ] && r=/v1/chat/completions || r=/v1/completions
    [ \$j -gt 0 ] && args+=(--next)
    args+=(-s -o /dev/null -w '%{http_code}\n' --max-time 60 -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' --data-binary @$T/load\$k.json "$URL\$r")
done
curl "\${args[@]}" >"$T/codes.\$w.\$3" 2>/dev/null
EOF
load() { # TOTAL TAG: TOTAL requests at concurrency 32
    local total=$1 tag=$2 w
    for w in $(seq 0 31); do echo "$w $(( total / 32 + (w < total % 32 ? 1 : 0) )) $tag"; done |
        xargs -P 32 -n 3 bash "$T/worker.sh"
    cat "$T"/codes.*."$tag" | sort | uniq -c | awk '{printf "%s%s×%s", (NR>1?", ":""), $2, $1}'
}
t0=$(date +%s.%N)
w=$(load 100 warm)
note "warm-up: 100 requests: $w"
RSS0=$(rss_kb)
t0=$(date +%s.%N)
codes=$(load "$NLOAD" main)
tl=$(since "$t0")
sleep 0.5
RSS1=$(rss_kb)
n200=$(cat "$T"/codes.*.main | grep -c '^200$')
n5xx=$(cat "$T"/codes.*.main | grep -c '^5')
ntot=$(cat "$T"/codes.*.main | wc -l)
note "load: $NLOAD requests at concurrency 32 in ${tl}s ($(calc "int($NLOAD / $tl)") req/s): $codes"
[ "$ntot" = "$NLOAD" ] && [ "$n5xx" = 0 ] && ok "load: $NLOAD requests, zero 5xx" || nok "load: $ntot answered, $n5xx 5xx ($codes)"
[ "$n200" = "$NLOAD" ] && ok "load: all $NLOAD are 200" || nok "load: $n200 of $NLOAD are 200 ($codes)"
if [ -n "$RSS0" ] && [ -n "$RSS1" ] && [ "$RSS1" -le $(( RSS0 + RSS0 / 10 )) ]; then
    ok "resident memory after the load within 10% of before: ${RSS0} kB → ${RSS1} kB"
else nok "resident memory after the load: ${RSS0:-?} kB → ${RSS1:-?} kB (more than +10%)"; fi
if wait_idle 2; then ok "after the load: idle (kv_blocks_used $KV_IDLE, running 0, queue 0)"; else nok "after the load: not idle: kv $(metric zeroserve_kv_blocks_used) running $(metric zeroserve_running_sequences) queue $(metric zeroserve_queue_length)"; fi
post /v1/completions "$C,\"prompt\":\"Once upon a time\"}"
expect "after the load: greedy text still the reference" 200 '.choices[0].text==$r' --arg r "$REF1"

# ================================================================== SIGTERM with a request in flight
curl -sS -N --max-time 60 -o "$T/term1" -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' \
    --data-binary '{"prompt":"Once upon a time","temperature":0.8,"seed":5,"max_tokens":500,"stream":true}' "$URL/v1/completions" 2>"$T/term1.err" &
CP=$!
for _ in $(seq 100); do grep -q '^data: {' "$T/term1" 2>/dev/null && break; sleep 0.02; done
stop_server 20
wait "$CP"; crc=$?
[ "$STOP_RC" = 0 ] && ok "SIGTERM: the server exits 0 (in ${STOP_S}s)" || { nok "SIGTERM: exit status $STOP_RC (after ${STOP_S}s)"; tail -n 5 "$T/main.log" | sed 's/^/#   /'; }
if [ $crc = 0 ] && sse "$T/term1" >/dev/null; then
    grep -q '^data: \[DONE\]' "$T/term1" && ok "in-flight stream at SIGTERM: complete response ending with [DONE]" || ok "in-flight stream at SIGTERM: clean end of the body"
else nok "in-flight stream at SIGTERM: curl exit $crc ($(cat "$T/term1.err"))"; fi
curl -s --max-time 3 -o /dev/null "$URL/health"; [ $? = 7 ] && ok "after SIGTERM the port is closed" || nok "after SIGTERM something still answers on $URL"

# ================================================================== slow model: real cancellation, 429, SIGTERM drain
SLOW=$T/slow-model
"$BIN" init-model --arch llama --layers 4 --dim 512 --heads 8 --kv-heads 4 --ffn 1376 --vocab 512 \
    --context 2048 --seed 3 --out "$SLOW" >"$T/init.log" 2>&1 || { nok "init-model for the slow model"; cat "$T/init.log"; }
# shellcheck disable=SC2086
if start_server slow "$SLOW" --max-seqs 2 --max-queue 1 $EXTRA_ARGS; then
    LONG='{"prompt":"Once upon a time","temperature":0,"max_tokens":1500,"ignore_eos":true,"stream":true}'
    getmetrics; KV_IDLE=$(metric zeroserve_kv_blocks_used)
    g0=$(metric zeroserve_generation_tokens_total)
    t0=$(date +%s.%N)
    curl -sS -N --max-time 60 --data-binary "$LONG" -H 'Content-Type: application/json' "$URL/v1/completions" 2>/dev/null | head -n 6 >"$T/cancel2"
    tc=$(since "$t0")
    if wait_idle 1; then
        ok "slow model: a 1500-token stream closed after $(grep -c '^data: {' "$T/cancel2") chunks (${tc}s) frees its KV blocks, running 0 within ${IDLE_S}s"
    else nok "slow model: after the client closed: kv_blocks_used $(metric zeroserve_kv_blocks_used) (idle $KV_IDLE), running $(metric zeroserve_running_sequences) after 1 s"; fi
    sleep 0.5; getmetrics
    g1=$(metric zeroserve_generation_tokens_total)
    gd=$(calc "$g1 - $g0")
    [ "$g0" != absent ] && [ "$g1" != absent ] && [ "$(calc "$gd < 1500")" = 1 ] && ok "the cancelled stream stopped generating ($gd of 1500 tokens)" || nok "the cancelled stream generated $gd of 1500 tokens"

    # queue full: max-seqs 2 + max-queue 1 -> the 4th and 5th concurrent request get 429
    for i in 1 2 3 4 5; do
        curl -sS -N --max-time 60 -o "$T/q.$i" -D "$T/q.$i.hdr" -w '%{http_code}' -H 'Content-Type: application/json' \
            --data-binary "$LONG" "$URL/v1/completions" >"$T/q.$i.code" 2>/dev/null &
        eval "QP$i=\$!"
        sleep 0.3
    done
    for i in 4 5; do eval "wait \$QP$i"; done
    n429=0; ra=0; shape=0
    for i in 4 5; do
        if [ "$(cat "$T/q.$i.code")" = 429 ]; then
            n429=$((n429 + 1))
            tr -d '\r' <"$T/q.$i.hdr" | grep -qi '^retry-after: *[0-9]' && ra=$((ra + 1))
            jq -e '.error.type=="rate_limit_error" and .error.code=="rate_limit_exceeded" and (.error.message|length)>0' "$T/q.$i" >/dev/null 2>&1 && shape=$((shape + 1))
        fi
    done
    [ $n429 = 2 ] && ok "2 running + 1 queued: the 4th and 5th requests get 429" || nok "queue full: $n429 of 2 got 429 (codes: $(cat "$T"/q.4.code "$T"/q.5.code | tr '\n' ' '))"
    [ $ra = 2 ] && [ $shape = 2 ] && ok "429 has Retry-After and {type rate_limit_error, code rate_limit_exceeded}" || nok "429 Retry-After ($ra/2) / error shape ($shape/2): $(head -c 300 "$T/q.4")"
    getmetrics
    [ "$(metric zeroserve_running_sequences)" = 2 ] && [ "$(metric zeroserve_queue_length)" = 1 ] && ok "metrics: running_sequences 2, queue_length 1" ||
        nok "metrics while full: running $(metric zeroserve_running_sequences) queue $(metric zeroserve_queue_length) (want 2 / 1)"
    # the clients of the running and queued requests go away: everything is freed
    for i in 1 2 3; do eval "kill \$QP$i" 2>/dev/null; done
    for i in 1 2 3; do eval "wait \$QP$i" 2>/dev/null; done
    if wait_idle 1; then ok "3 clients (2 running, 1 queued) gone: idle again within ${IDLE_S}s"
    else nok "3 clients gone: kv $(metric zeroserve_kv_blocks_used) (idle $KV_IDLE) running $(metric zeroserve_running_sequences) queue $(metric zeroserve_queue_length) after 1 s"; fi

    # SIGTERM while a long stream is in flight: exit 0 within the bound, a clean end of the stream
    curl -sS -N --max-time 90 -o "$T/term2" --data-binary "$LONG" -H 'Content-Type: application/json' "$URL/v1/completions" 2>"$T/term2.err" &
    CP=$!
    for _ in $(seq 200); do grep -q '^data: {' "$T/term2" 2>/dev/null && break; sleep 0.05; done
    stop_server 60
    wait "$CP"; crc=$?
    [ "$STOP_RC" = 0 ] && ok "SIGTERM during a 1500-token stream: exit 0 in ${STOP_S}s" || { nok "SIGTERM during a long stream: exit status $STOP_RC after ${STOP_S}s"; tail -n 5 "$T/slow.log" | sed 's/^/#   /'; }
    if [ $crc = 0 ] && sse "$T/term2" >/dev/null; then
        n=$(sse "$T/term2" | jq '[.[].choices[]?.text]|length')
        grep -q '^data: \[DONE\]' "$T/term2" && ok "its stream ended cleanly with [DONE] after $n chunks" || ok "its stream ended cleanly (no [DONE]) after $n chunks"
    else nok "the in-flight stream at SIGTERM: curl exit $crc ($(cat "$T/term2.err"))"; fi
else
    nok "the slow-model server starts"
fi

echo "# total time $(( $(date +%s) - T0 ))s"
zs_done
