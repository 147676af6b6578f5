#!/bin/sh
# soak.sh — a bounded soak of `zeroserve serve` (not part of make test): the server runs with
# its parameters offloaded to NVMe shard files (--offload nvme) and a data dir, while a few
# concurrent client loops send a mix of requests for N minutes: completions and chat, plain and
# streamed, streams cut by the client mid-way, several sampling settings (temperature 0/0.7/1.5,
# top_p, top_k, seed, stop, n=2, logprobs, response_format json_object), embeddings when the
# model serves them, /v1/models, /health, /metrics, and bad inputs that must get a 4xx with an
# OpenAI error body. A fine-tuning job runs over HTTP at the same time (to succeeded, then its
# model answers) and a second one is cancelled. Every ~2 s the server's RSS, open fds, threads and
# KV/scheduler gauges go to OUT/samples.csv. At the end: wait for idle, final sample, SIGTERM
# (exit 0 within 30 s), OUT/soak.svg (RSS, fds, KV blocks over time, drawn by tests/soak-svg.sh)
# and PASS/FAIL lines.
#
# Usage: sh tests/soak.sh [--minutes N] [--model DIR] [--out DIR]
#        (defaults: 10, $ZS_SHARED/models/stories260K, /tmp/zs-soak)
# Env:   ZS_BIN (default ./zeroserve), ZS_SHARED (default ../shared), PORT (default: a free one,
#        --port 0), ZS_SOAK_LOOPS (concurrent client loops, default 4).
# Out:   OUT/requests.log (one line a request: loop kind expect http curl_rc err.type err.code
#        verdict), OUT/samples.csv, OUT/soak.svg, OUT/server.log, OUT/summary.txt.
# Exit:  0 when every check passes, 1 otherwise, 77 when curl/jq/the model are missing.
# Traffic goes only to 127.0.0.1; every loop is bounded in time and count; the server, the
# client loops and the NVMe dir are cleaned up on every exit path (EXIT/INT/TERM/HUP).
# shellcheck source=tests/lib/e2e.sh
. "$(dirname "$0")/lib/e2e.sh"
set -u
MINUTES=10
MODEL=$SHARED/models/stories260K
OUT=/tmp/zs-soak
NLOOPS=${ZS_SOAK_LOOPS:-4}
while [ $# -gt 0 ]; do
    case $1 in
        --minutes) MINUTES=${2:?--minutes needs a value}; shift 2;;
        --model) MODEL=${2:?--model needs a directory}; shift 2;;
        --out) OUT=${2:?--out needs a directory}; shift 2;;
        -h|--help) sed -n '2,22p' "$ZS_SCRIPT"; exit 0;;
        *) echo "soak.sh: unknown argument $1 (see --help)" >&2; exit 2;;
    esac
done
case $MINUTES in ''|*[!0-9.]*) echo "soak.sh: --minutes must be a number" >&2; exit 2;; esac
case $MODEL in /*) ;; *) MODEL=$ROOT/$MODEL;; esac
zs_need curl jq
zs_need_bin
zs_need_file "$MODEL/config.json"
MNAME=$(basename "$MODEL")
SOAK_S=$(awk -v m="$MINUTES" 'BEGIN { s = int(m * 60); if (s < 20) s = 20; print s }')

mkdir -p "$OUT" || exit 1
rm -rf "$OUT/loops" "$OUT/data" "$OUT/ft"
mkdir -p "$OUT/loops" "$OUT/ft" || exit 1
: >"$OUT/requests.log"; : >"$OUT/summary.txt"
zs_tmpdir soak-nvme
NV=$T
LPIDS=""; SAMPLER=""
RUNFLAG=$OUT/loops/running      # the client loops and the sampler run while this file exists
zs_at_exit() { # before the harness stops the server and removes $NV: the loops and the sampler
    rm -f "$RUNFLAG"
    for p in $LPIDS $SAMPLER; do kill "$p" 2>/dev/null; done
}

say() { echo "$*" | tee -a "$OUT/summary.txt"; }
now() { date +%s; }
T0=$(now)
NFAIL=0
pass() { say "PASS: $*"; }
fail() { say "FAIL: $*"; NFAIL=$((NFAIL + 1)); }

# ------------------------------------------------------------------ server
say "# soak: $BIN serve --model $MODEL --offload nvme (${SOAK_S}s of traffic, $NLOOPS client loops, out $OUT)"
: >"$OUT/server.log"
U=""
ZS_START_WAIT=1800 # up to ~180 s: the shard files are written at the first load
zs_start_cmd "$OUT/server.log" env ZS_DEVICE="${ZS_DEVICE:-cpu}" ZS_LOG="${ZS_LOG:-warn}" "$BIN" serve --model "$MODEL" \
    --host 127.0.0.1 --port "${PORT:-0}" --offload nvme --nvme-path "$NV" --data-dir "$OUT/data" && U=$ZS_URL
if [ -z "$U" ]; then
    fail "the server starts and /health turns 200"; exit 1
fi
say "# server pid $SPID on $U, healthy after $(( $(now) - T0 ))s"

# ------------------------------------------------------------------ sampling
# metric NAME FILE: the (summed) value of NAME in a /metrics text, or "" when absent
metric() { awk -v n="$1" '/^#/ { next } { k = $1; sub(/\{.*/, "", k) } k == n { s += $NF; f = 1 } END { if (f) printf "%.10g", s }' "$2"; }
rss_kb() { awk '/^VmRSS:/ { print $2 }' "/proc/$SPID/status" 2>/dev/null; }
threads() { awk '/^Threads:/ { print $2 }' "/proc/$SPID/status" 2>/dev/null; }
nfds() { ls "/proc/$SPID/fd" 2>/dev/null | wc -l | tr -d ' '; }
# sample TAG: one CSV line (the metrics are fetched first, the fds are counted after that
# connection has closed, so it is not counted)
sample() {
    curl -s --max-time 5 -o "$OUT/loops/metrics.s" "$U/metrics" 2>/dev/null || : >"$OUT/loops/metrics.s"
    m=$OUT/loops/metrics.s
    echo "$(( $(now) - T0 )),$(rss_kb),$(nfds),$(metric zeroserve_kv_blocks_used "$m"),$(metric zeroserve_kv_cached_blocks "$m"),$(metric zeroserve_running_sequences "$m"),$(metric zeroserve_queue_length "$m"),$(threads),$(metric zeroserve_generation_tokens_total "$m"),$1"
}
# settled_fds: the least of 5 counts 0.3 s apart (connections that are closing are not counted)
settled_fds() {
    best=""; j=0
    while [ $j -lt 5 ]; do
        c=$(nfds); [ -z "$best" ] || [ "$c" -lt "$best" ] && best=$c
        sleep 0.3; j=$((j + 1))
    done
    echo "$best"
}
echo "t_s,rss_kb,fds,kv_used,kv_cached,running,queue,threads,gen_tokens,phase" >"$OUT/samples.csv"
curl -s --max-time 5 -o "$OUT/loops/m0" "$U/metrics"
KV0=$(metric zeroserve_kv_blocks_used "$OUT/loops/m0"); KVC0=$(metric zeroserve_kv_cached_blocks "$OUT/loops/m0")
KVT=$(metric zeroserve_kv_blocks_total "$OUT/loops/m0")
FD0=$(settled_fds); RSS0=$(rss_kb)
fdlist() { ls -l "/proc/$SPID/fd" 2>/dev/null | awk 'NR > 1 { print $NF }' | sort; }
fdlist >"$OUT/fds-start.txt"
sample start >>"$OUT/samples.csv"
say "# start: rss ${RSS0} kB, fds $FD0, kv_blocks_used ${KV0:-?} of ${KVT:-?}, kv_cached_blocks ${KVC0:-?}, threads $(threads)"

# ------------------------------------------------------------------ requests
# req LOOP KIND EXPECT METHOD PATH [BODY]: one request, one log line.
#   EXPECT ok: 2xx and a well-formed body; 4xx-NNN: status NNN with an error object.
# The verdict (last field) is ok, expected4xx or UNEXPECTED.
req() {
    lp=$1 kind=$2 ex=$3 meth=$4 path=$5 body=${6-}
    b=$OUT/loops/body.$lp
    : >"$b"
    if [ -n "$body" ]; then
        code=$(printf '%s' "$body" | curl -s -X "$meth" --max-time 60 -o "$b" -w '%{http_code}' \
            -H 'Content-Type: application/json' --data-binary @- "$U$path" 2>/dev/null)
    else
        code=$(curl -s -X "$meth" --max-time 60 -o "$b" -w '%{http_code}' "$U$path" 2>/dev/null)
    fi
    rc=$?
    et=$(jq -r '.error.type // "-"' "$b" 2>/dev/null | head -n 1); ec=$(jq -r '.error.code // "-"' "$b" 2>/dev/null | head -n 1)
    v=UNEXPECTED
    case $ex in
        ok) if [ $rc = 0 ]; then case $code in 2??) wellformed "$kind" "$b" && v=ok;; esac; fi;;
        4xx-*) [ $rc = 0 ] && [ "$code" = "${ex#4xx-}" ] && [ "${et:--}" != - ] && v=expected4xx;;
    esac
    [ $v = UNEXPECTED ] && { printf '%s %s %s\n' "$kind" "$code" "$(head -c 300 "$b" | tr '\n' ' ')" >>"$OUT/loops/unexpected.$lp"; }
    echo "$lp $kind $ex ${code:-000} $rc ${et:--} ${ec:--} $v" >>"$OUT/loops/log.$lp"
}
# wellformed KIND FILE: the 2xx body of KIND has the shape it should
wellformed() {
    case $1 in
        sse*) tr -d '\r' <"$2" | grep -v '^$' | tail -n 1 | grep -q '^data: \[DONE\]$';;
        cmpl*) jq -e '.object=="text_completion" and (.choices|length)>=1 and all(.choices[]; (.text|type)=="string")' "$2" >/dev/null 2>&1;;
        chat*) jq -e '.object=="chat.completion" and (.choices|length)>=1 and all(.choices[]; (.message.content|type)=="string")' "$2" >/dev/null 2>&1;;
        emb*) jq -e '.object=="list" and (.data[0].embedding|length)>0' "$2" >/dev/null 2>&1;;
        models) jq -e '.object=="list" and (.data|length)>=1' "$2" >/dev/null 2>&1;;
        health) jq -e '.status=="ok"' "$2" >/dev/null 2>&1;;
        metrics) grep -q '^zeroserve_kv_blocks_used ' "$2";;
        *) true;;
    esac
}
# cut LOOP KIND BODY HOW: a streamed request the client drops mid-way ("head": after 400 bytes,
# "time": curl --max-time 0.15). Verdict cancelled (200, then the client went away) or ok (the
# stream ended with [DONE] first); anything else UNEXPECTED.
cut() {
    lp=$1 kind=$2 body=$3 how=$4
    b=$OUT/loops/body.$lp h=$OUT/loops/hdr.$lp
    : >"$b"; : >"$h"
    if [ "$how" = head ]; then
        { printf '%s' "$body" | curl -s -N --max-time 60 -D "$h" -H 'Content-Type: application/json' \
            --data-binary @- "$U/v1/completions" 2>/dev/null; echo $? >"$b.rc"; } | head -c 400 >"$b"
    else
        printf '%s' "$body" | curl -s -N --max-time 0.15 -D "$h" -o "$b" -H 'Content-Type: application/json' \
            --data-binary @- "$U$5" 2>/dev/null
        echo $? >"$b.rc"
    fi
    rc=$(cat "$b.rc"); code=$(tr -d '\r' <"$h" | awk 'NR == 1 { print $2 }')
    v=UNEXPECTED
    if [ "$code" = 200 ]; then
        case $rc in
            0) grep -q '^data: \[DONE\]' "$b" && v=ok;;
            23|28|141) v=cancelled;;     # write error / timeout / SIGPIPE: the client hung up
        esac
    elif [ -z "$code" ] && [ "$rc" = 28 ]; then
        v=cancelled                      # the timeout came before the headers (a slow moment)
    fi
    [ $v = UNEXPECTED ] && printf '%s %s rc=%s %s\n' "$kind" "${code:-000}" "$rc" "$(head -c 300 "$b" | tr '\n' ' ')" >>"$OUT/loops/unexpected.$lp"
    echo "$lp $kind cancel ${code:-000} $rc - - $v" >>"$OUT/loops/log.$lp"
}

MSG='[{"role":"system","content":"You tell short stories."},{"role":"user","content":"Tell me about a cat."}]'
P='"prompt":"Once upon a time"'
# the valid mix: KIND BODY (completions cmpl-*, chat chat-*, streams sse-*)
cmpl_body() {
    case $1 in
        0) echo "cmpl-greedy {$P,\"temperature\":0,\"max_tokens\":32}";;
        1) echo "cmpl-t0.7 {$P,\"temperature\":0.7,\"top_p\":0.9,\"max_tokens\":48,\"seed\":$2}";;
        2) echo "cmpl-t1.5 {$P,\"temperature\":1.5,\"top_k\":40,\"max_tokens\":48}";;
        3) echo "cmpl-stop {$P,\"temperature\":0,\"max_tokens\":64,\"stop\":[\"Lily\",\". She\"]}";;
        4) echo "cmpl-n2 {\"prompt\":\"Tom and his dog\",\"temperature\":0.8,\"seed\":$2,\"n\":2,\"max_tokens\":24}";;
        5) echo "cmpl-logprobs {$P,\"temperature\":0,\"max_tokens\":8,\"logprobs\":3}";;
        6) echo "cmpl-json {$P,\"temperature\":1,\"seed\":$2,\"max_tokens\":40,\"response_format\":{\"type\":\"json_object\"}}";;
        7) echo "cmpl-batch {\"prompt\":[\"Once upon a time\",\"The little bird\"],\"temperature\":0.7,\"top_k\":20,\"min_p\":0.05,\"max_tokens\":16}";;
    esac
}
chat_body() {
    case $1 in
        0) echo "chat-greedy {\"messages\":$MSG,\"temperature\":0,\"max_tokens\":32}";;
        1) echo "chat-t0.7 {\"messages\":$MSG,\"temperature\":0.7,\"top_p\":0.8,\"seed\":$2,\"max_tokens\":40}";;
        2) echo "chat-t1.5 {\"messages\":$MSG,\"temperature\":1.5,\"top_k\":50,\"max_completion_tokens\":40}";;
        3) echo "chat-logprobs {\"messages\":$MSG,\"temperature\":0,\"max_tokens\":8,\"logprobs\":true,\"top_logprobs\":3}";;
        4) echo "chat-n2 {\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"temperature\":0.9,\"n\":2,\"seed\":$2,\"max_tokens\":20}";;
        5) echo "chat-json {\"messages\":$MSG,\"temperature\":1,\"seed\":$2,\"max_tokens\":40,\"response_format\":{\"type\":\"json_object\"}}";;
        6) echo "chat-stop {\"messages\":$MSG,\"temperature\":0,\"max_tokens\":48,\"stop\":\"the\",\"presence_penalty\":0}";;
    esac
}
# bad inputs: KIND STATUS METHOD PATH BODY
bad_case() {
    case $1 in
        0) echo 'bad-malformed 400 POST /v1/completions {"prompt":"Once upon'"";;
        1) echo 'bad-type 400 POST /v1/completions {"prompt":"Once","max_tokens":"ten"}';;
        2) echo 'bad-model 404 POST /v1/chat/completions {"model":"no-such-model","messages":[{"role":"user","content":"hi"}]}';;
        3) echo 'bad-huge-max-tokens 400 POST /v1/completions {"prompt":"Once","max_tokens":100000000}';;
        4) echo 'bad-empty-messages 400 POST /v1/chat/completions {"messages":[]}';;
        5) echo 'bad-response-format 400 POST /v1/chat/completions {"messages":[{"role":"user","content":"hi"}],"response_format":{"type":"xml"}}';;
        6) echo 'bad-temperature 400 POST /v1/completions {"prompt":"Once","temperature":2.5}';;
        7) echo 'bad-unknown-field 400 POST /v1/completions {"prompt":"Once","bogus_field":1}';;
        8) echo 'bad-role 400 POST /v1/chat/completions {"messages":[{"role":"wizard","content":"hi"}]}';;
        9) echo 'bad-array-body 400 POST /v1/chat/completions [1,2,3]';;
        10) echo 'bad-method 405 GET /v1/completions';;
        11) echo 'bad-route 404 GET /v1/nope';;
        12) echo 'bad-token-id 400 POST /v1/completions {"prompt":[1,2,999999999]}';;
        13) echo 'bad-json-schema 400 POST /v1/completions {"prompt":"a","response_format":{"type":"json_schema"}}';;
        14) echo 'bad-emb-input 400 POST /v1/embeddings {"input":42}';;
    esac
}
NBAD=15
STREAM_C="{$P,\"temperature\":0.8,\"max_tokens\":200,\"stream\":true,\"stream_options\":{\"include_usage\":true},\"seed\":"
STREAM_CHAT="{\"messages\":$MSG,\"temperature\":0.7,\"max_tokens\":120,\"stream\":true,\"seed\":"
LONG_C="{$P,\"temperature\":0.9,\"max_tokens\":480,\"ignore_eos\":true,\"stream\":true,\"seed\":"

# do embeddings work on this model? (then they join the mix)
EMB=0
c=$(curl -s --max-time 30 -o "$OUT/loops/emb0" -w '%{http_code}' -H 'Content-Type: application/json' \
    -d "{\"input\":\"Once upon a time\"}" "$U/v1/embeddings")
[ "$c" = 200 ] && EMB=1
say "# embeddings: $([ $EMB = 1 ] && echo "served (in the mix)" || echo "not served ($c), left out")"

# client LOOP: requests until the run flag goes or the count bound is hit. Loop 0 completions,
# 1 chat, 2 streams (complete and cut), 3 bad inputs mixed with GETs and embeddings; loops >= 4
# repeat that pattern.
MAXREQ=200000
client() {
    lp=$1 n=0 role=$(( $1 % 4 ))
    while [ -e "$RUNFLAG" ] && [ $n -lt $MAXREQ ]; do
        n=$((n + 1)); s=$(( n * 7 + lp ))
        case $role in
            0) line=$(cmpl_body $(( n % 8 )) $s); req "$lp" "${line%% *}" ok POST /v1/completions "${line#* }";;
            1) line=$(chat_body $(( n % 7 )) $s); req "$lp" "${line%% *}" ok POST /v1/chat/completions "${line#* }";;
            2) case $(( n % 5 )) in
                   0) req "$lp" sse-cmpl ok POST /v1/completions "$STREAM_C$s}";;
                   1) req "$lp" sse-chat ok POST /v1/chat/completions "$STREAM_CHAT$s}";;
                   2) cut "$lp" cut-head "$LONG_C$s}" head;;
                   3) cut "$lp" cut-time "$LONG_C$s}" time /v1/completions;;
                   4) cut "$lp" cut-chat "{\"messages\":$MSG,\"temperature\":0.9,\"max_tokens\":400,\"ignore_eos\":true,\"stream\":true,\"seed\":$s}" time /v1/chat/completions;;
               esac;;
            3) case $(( n % 4 )) in
                   0|1) line=$(bad_case $(( (n / 2 + n % 2 * 7) % NBAD )))
                        k=${line%% *}; line=${line#* }; st=${line%% *}; line=${line#* }
                        me=${line%% *}; line=${line#* }; pa=${line%% *}; bd=${line#"$pa"}; bd=${bd# }
                        [ "$k" = bad-emb-input ] && [ $EMB = 0 ] && { k=bad-route; st=404; me=GET; pa=/v1/nope; bd=""; }
                        req "$lp" "$k" "4xx-$st" "$me" "$pa" "$bd";;
                   2) case $(( n / 4 % 3 )) in
                          0) req "$lp" models ok GET /v1/models;;
                          1) req "$lp" health ok GET /health;;
                          2) req "$lp" metrics ok GET /metrics;;
                      esac;;
                   3) if [ $EMB = 1 ]; then
                          req "$lp" emb ok POST /v1/embeddings "{\"input\":[\"Once upon a time\",\"a dog $n\"]}"
                      else req "$lp" models ok GET /v1/models; fi;;
               esac;;
        esac
    done
}

# ------------------------------------------------------------------ fine-tuning
ftj() { curl -s --max-time 30 -H 'Content-Type: application/json' "$@"; }
ft_status() { ftj "$U/v1/fine_tuning/jobs/$1" | jq -r '.status // "?"'; }
ft_steps() { ftj "$U/v1/fine_tuning/jobs/$1/events?limit=10000" | jq '[.data[]? | select(.data.step != null)] | length'; }
# ft_wait JOB STATUS DEADLINE-EPOCH: 0 when JOB reaches STATUS in time
ft_wait() {
    while [ "$(now)" -lt "$3" ]; do
        st=$(ft_status "$1")
        [ "$st" = "$2" ] && return 0
        case $st in succeeded|failed|cancelled) return 1;; esac
        sleep 1
    done
    return 1
}
# finetune: upload, job A (4 examples / batch 2 x 20 epochs = 40 steps) to succeeded, its model
# answers; then job B (long) cancelled after a few steps. Writes OUT/ft/result (A's status and B's).
finetune() {
    F=$OUT/ft
    cat >"$F/data.jsonl" <<'JSONL'
{"prompt": "Once upon a time", "completion": " there was a purple dragon named Zork who loved pancakes."}
{"prompt": "Tom and his dog", "completion": " went to the moon in a red box."}
{"prompt": "The little bird", "completion": " sang a song about green apples."}
{"text": "Lily had a big blue kite. She flew it every day in the park."}
JSONL
    sleep 5                                         # let the client loops get going first
    fid=$(curl -s --max-time 30 "$U/v1/files" -F purpose=fine-tune -F "file=@$F/data.jsonl" | jq -r '.id // empty')
    [ -n "$fid" ] || { echo "upload failed" >"$F/result"; return; }
    a=$(ftj "$U/v1/fine_tuning/jobs" -d "{\"model\":\"$MNAME\",\"training_file\":\"$fid\",\"suffix\":\"soak\",\"seed\":1,
        \"hyperparameters\":{\"n_epochs\":20,\"batch_size\":2,\"learning_rate_multiplier\":3}}" | jq -r '.id // empty')
    [ -n "$a" ] || { echo "create failed" >"$F/result"; return; }
    t_a=$(now)
    if ft_wait "$a" succeeded $(( $(now) + SOAK_S + 120 )); then
        sa=succeeded
        ftm=$(ftj "$U/v1/fine_tuning/jobs/$a" | jq -r .fine_tuned_model)
        c=$(ftj -o "$F/ftc.json" -w '%{http_code}' "$U/v1/completions" -d "{\"model\":\"$ftm\",$P,\"temperature\":0,\"max_tokens\":16}")
        ftout=$(jq -r '.choices[0].text // empty' "$F/ftc.json" 2>/dev/null)
        [ "$c" = 200 ] || sa="succeeded-but-model-answers-$c"
    else sa=$(ft_status "$a"); ftm=-; ftout=""; fi
    d_a=$(( $(now) - t_a )); n_a=$(ft_steps "$a")
    b=$(ftj "$U/v1/fine_tuning/jobs" -d "{\"model\":\"$MNAME\",\"training_file\":\"$fid\",\"suffix\":\"cancel\",\"seed\":2,
        \"hyperparameters\":{\"n_epochs\":5000,\"batch_size\":2}}" | jq -r '.id // empty')
    sb=none; n_b=0
    if [ -n "$b" ]; then
        end=$(( $(now) + 120 ))
        while [ "$(now)" -lt "$end" ] && [ "$(ft_steps "$b")" -lt 3 ]; do sleep 0.5; done
        c=$(ftj -o "$F/cancel.json" -w '%{http_code}' -X POST "$U/v1/fine_tuning/jobs/$b/cancel")
        sleep 2
        n1=$(ft_steps "$b"); sleep 2; n_b=$(ft_steps "$b")
        sb=$(ft_status "$b")
        [ "$c" = 200 ] && [ "$n1" = "$n_b" ] || sb="$sb(cancel-http-$c,steps-$n1-then-$n_b)"
    fi
    echo "$a $sa $n_a $d_a $b $sb $n_b $ftm" >"$F/result"
    printf '%s\n' "$ftout" >"$F/ft-text"
}

# ------------------------------------------------------------------ run
touch "$RUNFLAG"
(
    while [ -e "$RUNFLAG" ] && kill -0 "$SPID" 2>/dev/null; do sample soak; sleep 2; done
) >>"$OUT/samples.csv" &
SAMPLER=$!
l=0
while [ $l -lt "$NLOOPS" ]; do
    client "$l" &
    LPIDS="$LPIDS $!"; l=$((l + 1))
done
finetune &
FTPID=$!; LPIDS="$LPIDS $FTPID"
END=$(( $(now) + SOAK_S )); last=0
while [ "$(now)" -lt "$END" ]; do
    kill -0 "$SPID" 2>/dev/null || { say "# the server died during the soak"; break; }
    el=$(( $(now) - T0 ))
    if [ $(( el / 60 )) -gt "$last" ]; then
        last=$(( el / 60 ))
        say "# ${el}s: $(cat "$OUT"/loops/log.* 2>/dev/null | wc -l) requests, $(cat "$OUT"/loops/log.* 2>/dev/null | grep -c ' UNEXPECTED$') unexpected, $(tail -n 1 "$OUT/samples.csv")"
    fi
    sleep 1
done
rm -f "$RUNFLAG"
# the loops finish their current request (each curl is bounded by --max-time 60)
for p in $LPIDS; do
    [ "$p" = "$FTPID" ] && continue
    wait "$p" 2>/dev/null
done
kill "$SAMPLER" 2>/dev/null; wait "$SAMPLER" 2>/dev/null; SAMPLER=""
# the fine-tuning part has its own deadlines (SOAK_S + 120 s at most for job A, 2 min for B)
wait "$FTPID" 2>/dev/null; LPIDS=""
cat "$OUT"/loops/log.* >"$OUT/requests.log" 2>/dev/null
cat "$OUT"/loops/unexpected.* >"$OUT/unexpected.txt" 2>/dev/null

# ------------------------------------------------------------------ idle, final state
ALIVE=0; kill -0 "$SPID" 2>/dev/null && ALIVE=1
IDLE_S=never; t_i=$(now)
while [ $ALIVE = 1 ] && [ $(( $(now) - t_i )) -lt 60 ]; do
    curl -s --max-time 5 -o "$OUT/loops/mi" "$U/metrics"
    if [ "$(metric zeroserve_running_sequences "$OUT/loops/mi")" = 0 ] && [ "$(metric zeroserve_queue_length "$OUT/loops/mi")" = 0 ] &&
       [ "$(metric zeroserve_kv_blocks_used "$OUT/loops/mi")" = "$KV0" ]; then IDLE_S=$(( $(now) - t_i )); break; fi
    sleep 0.5
done
sleep 1
if [ $ALIVE = 1 ]; then
    FD1=$(settled_fds); RSS1=$(rss_kb); fdlist >"$OUT/fds-end.txt"
    sample final >>"$OUT/samples.csv"
    curl -s --max-time 5 -o "$OUT/loops/m1" "$U/metrics"
    KV1=$(metric zeroserve_kv_blocks_used "$OUT/loops/m1"); KVC1=$(metric zeroserve_kv_cached_blocks "$OUT/loops/m1")
    cp "$OUT/loops/m1" "$OUT/metrics-final.txt"
else FD1="?"; RSS1="?"; KV1="?"; KVC1="?"; fi

# ------------------------------------------------------------------ SIGTERM
STOP_RC=dead; STOP_S=-
if [ $ALIVE = 1 ]; then
    t_s=$(date +%s.%N)
    kill -TERM "$SPID"
    i=0; while [ $i -lt 300 ] && kill -0 "$SPID" 2>/dev/null; do sleep 0.1; i=$((i + 1)); done
    if kill -0 "$SPID" 2>/dev/null; then
        STOP_RC="still running after 30 s (killed)"; kill -KILL "$SPID"; wait "$SPID" 2>/dev/null
    else
        wait "$SPID"; STOP_RC=$?
    fi
    STOP_S=$(awk -v a="$t_s" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
else
    wait "$SPID"; STOP_RC="died during the soak (status $?)"
fi
SPID=""

# ------------------------------------------------------------------ summary
say ""
say "# requests by kind (verdicts):"
awk '{ k[$2 " " $8]++; v[$8]++; n++ } END {
        for (x in k) printf "#   %-28s %d\n", x, k[x] | "sort"; close("sort")
        printf "# total %d:", n; for (x in v) printf " %s %d", x, v[x]; printf "\n" }' "$OUT/requests.log" | tee -a "$OUT/summary.txt"
say "# by HTTP status class and error type/code:"
awk '{ c = substr($4, 1, 1) "xx"; if ($4 == "000") c = "none"; k[c " " $6 " " $7]++ } END {
        for (x in k) printf "#   %-50s %d\n", x, k[x] | "sort" }' "$OUT/requests.log" | tee -a "$OUT/summary.txt"
NREQ=$(wc -l <"$OUT/requests.log" | tr -d ' ')
NUNEX=$(grep -c ' UNEXPECTED$' "$OUT/requests.log")
[ -s "$OUT/unexpected.txt" ] && { say "# first unexpected answers:"; head -n 5 "$OUT/unexpected.txt" | sed 's/^/#   /' | tee -a "$OUT/summary.txt"; }
FTR=$(cat "$OUT/ft/result" 2>/dev/null)
say "# fine-tuning: $FTR (job status steps seconds; cancelled job status steps; model)"
[ -s "$OUT/ft/ft-text" ] && say "# fine-tuned model on \"Once upon a time\": $(head -c 120 "$OUT/ft/ft-text")"

# RSS: the median of the 2nd quarter of the soak samples against the median of the 4th
RSSCHK=$(awk -F, '$10 == "soak" && $2 != "" { r[n++] = $2 }
    function med(a, lo, hi,   m, i, j, t, b) {
        m = 0; for (i = lo; i < hi; i++) b[m++] = a[i]
        for (i = 1; i < m; i++) { t = b[i]; for (j = i - 1; j >= 0 && b[j] > t; j--) b[j + 1] = b[j]; b[j + 1] = t }
        return m % 2 ? b[int(m / 2)] : (b[m / 2 - 1] + b[m / 2]) / 2 }
    END {
        if (n < 8) { print "few " n; exit }
        q2 = med(r, int(n / 4), int(n / 2)); q4 = med(r, int(3 * n / 4), n)
        bound = 16384; if (q2 * 0.05 > bound) bound = q2 * 0.05
        printf "%d %d %d %d %d\n", q2, q4, q4 - q2, bound, (q4 - q2 <= bound) }' "$OUT/samples.csv")
# shellcheck disable=SC2086
set -- $RSSCHK

say ""
say "# start → end: rss ${RSS0} kB → ${RSS1} kB, fds $FD0 → $FD1, kv_blocks_used $KV0 → $KV1, kv_cached_blocks $KVC0 → $KVC1 (prefix cache; allowed), idle after ${IDLE_S}s"
[ "$NUNEX" = 0 ] && [ "$NREQ" -gt 0 ] && pass "no unexpected answers ($NREQ requests)" || fail "$NUNEX unexpected answers of $NREQ requests (OUT/unexpected.txt)"
[ "$IDLE_S" != never ] && [ "$KV1" = "$KV0" ] && pass "idle at the end: kv_blocks_used $KV1 = start $KV0 (cached blocks $KVC1 held by the prefix cache are allowed)" ||
    fail "kv_blocks_used at the end $KV1, start $KV0 (idle: $IDLE_S)"
# a fine-tuned model served from --offload nvme opens its own shard file ($NV/ft_*) and io_uring:
# those are allowed (one ring per such file at most), everything else must be back to the start
NFTF=$(grep -c "^$NV/ft_" "$OUT/fds-end.txt" 2>/dev/null); NFTF=${NFTF:-0}
NRING=$(( $(grep -c 'io_uring' "$OUT/fds-end.txt" 2>/dev/null) - $(grep -c 'io_uring' "$OUT/fds-start.txt" 2>/dev/null) ))
[ "$NRING" -le "$NFTF" ] 2>/dev/null || NRING=0
FDX=$(( ${FD1:-0} - NFTF - NRING )) 2>/dev/null || FDX="?"
[ "$FDX" = "$FD0" ] && pass "open fds at the end (idle) $FD1 = start $FD0 + $NFTF shard file(s) and $NRING io_uring(s) of the served fine-tuned model(s)" ||
    fail "open fds at the end $FD1, start $FD0; new: $(diff "$OUT/fds-start.txt" "$OUT/fds-end.txt" 2>/dev/null | sed -n 's/^> //p' | sort | uniq -c | awk '{ printf "%s%s x%s", (NR > 1 ? ", " : ""), $2, $1 }')"
if [ "$1" = few ]; then fail "RSS: only $2 samples"
else
    [ "$5" = 1 ] && pass "RSS flat: median of the 4th quarter $(( $2 / 1024 )) MiB vs 2nd quarter $(( $1 / 1024 )) MiB: $(( $3 / 1024 )) MiB ($3 kB) growth <= bound max(16 MiB, 5%) = $(( $4 / 1024 )) MiB" ||
        fail "RSS grew: median of the 4th quarter $2 kB vs 2nd quarter $1 kB: +$3 kB > bound max(16 MiB, 5%) = $4 kB"
fi
set -- $FTR
[ "${2:-}" = succeeded ] && pass "fine-tuning job ${1:-?} succeeded (${3:-?} steps in ${4:-?}s, during the soak)" || fail "fine-tuning job: ${FTR:-no result}"
case ${6:-} in
    cancelled) pass "the second fine-tuning job ${5:-?} was cancelled after ${7:-?} steps and stopped";;
    *) fail "the second fine-tuning job: ${6:-no result}";;
esac
[ "$STOP_RC" = 0 ] && pass "SIGTERM: the server exited 0 in ${STOP_S}s (bound 30 s)" || fail "SIGTERM: exit status $STOP_RC (${STOP_S}s)"
grep -q 'Sanitizer\|Segmentation\|Assertion' "$OUT/server.log" && fail "the server log has a crash/sanitizer report" 

sh "$ROOT/tests/soak-svg.sh" "$OUT/samples.csv" "$OUT/soak.svg" "zeroserve soak: $MNAME, ${SOAK_S}s, $NREQ requests" &&
    say "# wrote $OUT/soak.svg, $OUT/samples.csv, $OUT/requests.log, $OUT/summary.txt" || fail "writing $OUT/soak.svg"
say "# total $(( $(now) - T0 ))s; $([ $NFAIL = 0 ] && echo "all checks passed" || echo "$NFAIL check(s) failed")"
[ $NFAIL = 0 ]
