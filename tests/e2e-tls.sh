#!/bin/sh
# shellcheck shell=bash disable=SC2016,SC2034
# e2e-tls.sh — HTTPS (--tls-cert, --tls-key) through the server, with the committed test CA and
# certificate of tests/tls/ (made by tests/tls/make-certs.sh): the start line says https://;
# curl --cacert calls /health, /v1/models and a chat completion (plain and streamed) by address and
# by the name localhost; curl without the CA fails verification; plain HTTP to the port is closed
# at once and the server still answers HTTPS afterwards, as it does beside a client that connects
# and says nothing. Errors at start, each a nonzero exit with a message: --tls-cert without
# --tls-key (and the reverse), a missing file, a certificate that is not PEM, the two files
# swapped, a key that is not the certificate's.
# shellcheck source=tests/lib/e2e.sh
. "$(dirname "$0")/lib/e2e.sh"
zs_bash "$@"
zs_need curl jq
zs_need_bin
zs_model stories260K
zs_tmpdir tls
export ZS_DEVICE=${ZS_DEVICE:-cpu}
CA=$ROOT/tests/tls/ca.pem
CERT=$ROOT/tests/tls/server.pem
cp "$ROOT/tests/tls/server-key.pem" "$T/key.pem" # git keeps no modes: 600 here, as a key should be
chmod 600 "$T/key.pem"
export ZS_CACERT=$CA
zs_start_server "$T/s.log" --model "$MODEL" --tls-cert "$CERT" --tls-key "$T/key.pem" || zs_abort "serve --tls-cert --tls-key"
PORT=${ZS_URL##*:}
check "the start line says https://" 'grep -q "listening on https://127.0.0.1:$PORT " "$T/s.log"' "$(head -3 "$T/s.log")"
check "no warning about the key's mode (600)" '! grep -q "others may read it" "$T/s.log"'
C() { curl -s --max-time 60 --cacert "$CA" "$@"; }
check "GET /health over https with the test CA: 200 ok" '[ "$(C "$ZS_URL/health" | jq -r .status)" = ok ]'
check "GET /v1/models over https: the model" '[ "$(C "$ZS_URL/v1/models" | jq -r ".data[0].id")" = stories260K ]'
check "https://localhost:$PORT (the certificate's DNS name) verifies too" \
    '[ "$(C "https://localhost:$PORT/health" | jq -r .status)" = ok ]'
CHAT='{"messages": [{"role": "user", "content": "Once upon a time"}], "max_tokens": 8, "temperature": 0}'
C -H 'Content-Type: application/json' -d "$CHAT" "$ZS_URL/v1/chat/completions" >"$T/chat.json"
check "a chat completion over https" \
    'jq -e ".object == \"chat.completion\" and (.choices[0].message.content | type == \"string\") and .usage.completion_tokens > 0" "$T/chat.json" >/dev/null' \
    "$(head -c 300 "$T/chat.json")"
C -N -H 'Content-Type: application/json' -d "${CHAT%\}}, \"stream\": true}" "$ZS_URL/v1/chat/completions" >"$T/stream.txt"
check "a streamed chat completion over https ends with [DONE]" \
    '[ "$(grep -c "^data: {" "$T/stream.txt")" -ge 2 ] && [ "$(grep "^data: " "$T/stream.txt" | tail -1)" = "data: [DONE]" ]' \
    "$(tail -c 300 "$T/stream.txt")"
rc=0
curl -s --max-time 20 -o /dev/null "$ZS_URL/health" 2>/dev/null || rc=$?
check "curl without the test CA refuses the certificate (exit 60, not verified)" '[ $rc = 60 ]' "curl exit $rc"
rc=0
t0=$(date +%s%N)
curl -s --max-time 20 -o /dev/null "http://127.0.0.1:$PORT/health" 2>/dev/null || rc=$?
ms=$((($(date +%s%N) - t0) / 1000000))
check "plain HTTP to the https port: the connection is closed at once (curl exit $rc in $ms ms)" \
    '[ $rc -ne 0 ] && [ $rc -ne 28 ] && [ $ms -lt 5000 ]'
check "the server still answers https after it" '[ "$(C "$ZS_URL/health" | jq -r .status)" = ok ] && kill -0 "$SPID"'
exec 3<>"/dev/tcp/127.0.0.1/$PORT" # a client that connects and says nothing
check "beside a silent TCP client, https still answers" '[ "$(C "$ZS_URL/v1/models" | jq -r ".data[0].id")" = stories260K ]'
exec 3>&-
zs_stop_server
check "SIGTERM stops the https server cleanly (exit 0)" '[ "$ZS_RC" = 0 ]' "exit $ZS_RC"

# errors at start: a clear message and a nonzero exit, before the model loads
bad() { # NAME PATTERN ARGS...: serve ARGS must exit nonzero (not a timeout) with PATTERN on stderr
    local name=$1 pat=$2 rc=0
    shift 2
    timeout 60 "$BIN" serve --model "$MODEL" --port 0 "$@" >/dev/null 2>"$T/bad.err" || rc=$?
    check "$name" '[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q -- "$pat" "$T/bad.err"' "exit $rc: $(head -c 300 "$T/bad.err")"
}
bad "--tls-cert without --tls-key is refused" "--tls-cert without --tls-key: --tls-cert and --tls-key go together" \
    --tls-cert "$CERT"
bad "--tls-key without --tls-cert is refused" "--tls-key without --tls-cert" --tls-key "$T/key.pem"
bad "a missing certificate file is named" "--tls-cert $T/nope.pem: no such file" --tls-cert "$T/nope.pem" --tls-key "$T/key.pem"
printf 'not a certificate\n' >"$T/junk.pem"
bad "a certificate file that is not PEM is named" "--tls-cert $T/junk.pem: not a PEM certificate" \
    --tls-cert "$T/junk.pem" --tls-key "$T/key.pem"
bad "the files swapped: said so" "holds a private key, not a certificate (--tls-cert and --tls-key swapped?)" \
    --tls-cert "$T/key.pem" --tls-key "$CERT"
cp "$ROOT/tests/tls/ca-key.pem" "$T/other-key.pem"
bad "a key that is not the certificate's is named with both files" \
    "--tls-key $T/other-key.pem is not the key of the certificate in --tls-cert $CERT" \
    --tls-cert "$CERT" --tls-key "$T/other-key.pem"
zs_done
