#!/bin/sh
# shellcheck shell=bash disable=SC2016,SC2034
# e2e-limits.sh — per-tenant limits from the key file (server/quota.h) through the server: rpm=3
# admits three requests and answers the fourth 429 with Retry-After and the code rpm_limit, naming
# rpm=3; tpm=40 admits a 60-token completion and then refuses with tpm_limit; streams=1 refuses a
# second request while a long stream runs (streams_limit), and admits again once the stream's client
# has gone, and a client that waits for each answer never meets its own limit. Meanwhile a tenant
# without limits is served every time.
# shellcheck source=tests/lib/e2e.sh
. "$(dirname "$0")/lib/e2e.sh"
zs_bash "$@"
zs_need curl jq
zs_need_bin
zs_tmpdir limits
export ZS_DEVICE=${ZS_DEVICE:-cpu}
# a model slow enough that a 1500-token stream lasts seconds (e2e-server.sh's)
SLOW=$T/slow-model
"$BIN" init-model --arch llama --layers 4 --dim 512 --heads 8 --kv-heads 4 --ffn 1376 --vocab 512 \
    --context 2048 --seed 3 --out "$SLOW" >"$T/init.log" 2>&1 || zs_abort "init-model for the slow model"
cat >"$T/keys" <<'KEYS'
key-burst burst inference rpm=3
key-tok   tok   inference tpm=40
key-one   one   inference streams=1
key-calm  calm  inference
key-adm   ops   admin
KEYS
chmod 600 "$T/keys"
code() { # PATH KEY [BODY]: the HTTP status; the headers in $T/h, the body in $T/b
    curl -s -D "$T/h" -o "$T/b" -w '%{http_code}' -H "Authorization: Bearer $2" \
        ${3:+-H 'Content-Type: application/json' --data-binary "$3"} "$ZS_URL$1"
}
retry_after() { tr -d '\r' <"$T/h" | awk -F': ' 'tolower($1)=="retry-after"{print $2}'; }
zs_start_server "$T/s.log" --model "$SLOW" --api-key-file "$T/keys" || zs_abort "serve --api-key-file"

# ---- requests a minute
c1=$(code /v1/models key-burst) c2=$(code /v1/models key-burst) c3=$(code /v1/models key-burst)
c4=$(code /v1/models key-burst)
ra=$(retry_after)
check "rpm=3: three requests 200, the fourth 429" '[ "$c1$c2$c3" = 200200200 ] && [ "$c4" = 429 ]' "$c1 $c2 $c3 $c4"
check "its Retry-After is the seconds to the next request (1..20)" '[ -n "$ra" ] && [ "$ra" -ge 1 ] && [ "$ra" -le 20 ]' "Retry-After '$ra'"
check "the 429 names the limit: code rpm_limit, message with rpm=3 and the tenant" \
    'jq -e ".error.code == \"rpm_limit\" and .error.type == \"rate_limit_error\" and (.error.message | test(\"burst.*rpm=3\"))" "$T/b" >/dev/null' \
    "$(head -c 300 "$T/b")"
check "another tenant is served meanwhile" '[ "$(code /v1/models key-calm)" = 200 ]'

# ---- tokens a minute
P='{"prompt": "Once upon a time", "max_tokens": 60, "temperature": 0, "ignore_eos": true}'
t1=$(code /v1/completions key-tok "$P")
used=$(jq -r '.usage.total_tokens' "$T/b" 2>/dev/null)
t2=$(code /v1/completions key-tok "$P")
check "tpm=40: a completion of $used tokens is admitted, the next one 429 tpm_limit with Retry-After" \
    '[ "$t1" = 200 ] && [ "$used" -gt 40 ] && [ "$t2" = 429 ] && jq -e ".error.code == \"tpm_limit\"" "$T/b" >/dev/null && [ -n "$(retry_after)" ]' \
    "$t1 $t2 $(head -c 300 "$T/b")"
check "the calm tenant completes the same request" '[ "$(code /v1/completions key-calm "$P")" = 200 ]'

# ---- requests at once
LONG='{"prompt":"Once upon a time","temperature":0,"max_tokens":1500,"ignore_eos":true,"stream":true}'
curl -s -N --max-time 60 -H "Authorization: Bearer key-one" -H 'Content-Type: application/json' \
    --data-binary "$LONG" "$ZS_URL/v1/completions" >"$T/long" 2>/dev/null &
LPID=$!
for _ in $(seq 1 100); do grep -q '^data: {' "$T/long" 2>/dev/null && break; sleep 0.1; done
s2=$(code /v1/models key-one)
check "streams=1: while its stream runs, another request is 429 streams_limit" \
    '[ "$s2" = 429 ] && jq -e ".error.code == \"streams_limit\" and (.error.message | test(\"streams=1\"))" "$T/b" >/dev/null' \
    "$s2 $(head -c 300 "$T/b")"
check "the calm tenant is served during it" '[ "$(code /v1/models key-calm)" = 200 ]'
kill "$LPID" 2>/dev/null
s3=000
for _ in $(seq 1 50); do s3=$(code /v1/models key-one); [ "$s3" = 200 ] && break; sleep 0.1; done
check "once the stream's client has gone, the tenant is admitted again" '[ "$s3" = 200 ]' "$s3"
seqc=""
for _ in $(seq 1 30); do seqc="$seqc $(code /v1/completions key-one '{"prompt": "hi", "max_tokens": 2}')"; done
check "streams=1: a client that waits for each answer is never refused (30 in a row)" \
    '[ -z "$(echo "$seqc" | tr " " "\n" | grep -v "^200$" | grep .)" ]' "$seqc"
zs_stop_server
zs_done
