#!/bin/sh
# shellcheck shell=bash disable=SC2016,SC2034
# e2e-cors.sh — CORS (--allowed-origins) through the server. With a list of origins and an API key:
# a preflight (OPTIONS with Origin and Access-Control-Request-Method) from an allowed origin answers
# 204 with the origin echoed, Vary: Origin, the route's methods, Authorization and Content-Type and
# the headers asked for, and a max age, and needs no key; a preflight from another origin gets 403
# without CORS headers; OPTIONS on an unknown path 404. Normal responses to an allowed origin carry
# Access-Control-Allow-Origin and -Expose-Headers (Retry-After), errors (401, 400) and streams
# included; another origin, or no Origin, gets none. With '*': Access-Control-Allow-Origin: *.
# Without --allowed-origins: no CORS headers at all, and OPTIONS answers 405 as before. Bad lists
# fail the start with a message.
# shellcheck source=tests/lib/e2e.sh
. "$(dirname "$0")/lib/e2e.sh"
zs_bash "$@"
zs_need curl jq
zs_need_bin
zs_model stories260K
zs_tmpdir cors
export ZS_DEVICE=${ZS_DEVICE:-cpu}
APP=http://localhost:3000
zs_start_server "$T/s.log" --model "$MODEL" --api-key sekrit --allowed-origins "$APP, https://app.example.com" ||
    zs_abort "serve --allowed-origins"
# hdrs ARGS...: the response's status line and headers (lower-cased names) into $T/h, the body into $T/b
hdrs() {
    curl -s --max-time 60 -D - -o "$T/b" "$@" | tr -d '\r' | sed 's/^\([^:]*\):/\L\1:/' >"$T/h"
}
st() { head -1 "$T/h" | cut -d' ' -f2; }
hv() { sed -n "s/^$1: //p" "$T/h" | head -1; } # hv NAME (lower case): the header's value
no_cors() { ! grep -q '^access-control-' "$T/h"; }
pre() { # ORIGIN PATH [REQUEST-HEADERS]: a preflight for POST
    hdrs -X OPTIONS -H "Origin: $1" -H 'Access-Control-Request-Method: POST' \
        ${3:+-H "Access-Control-Request-Headers: $3"} "$ZS_URL$2"
}
pre "$APP" /v1/chat/completions "content-type,authorization,x-stainless-lang"
check "preflight from an allowed origin, no key: 204, the origin echoed, Vary: Origin" \
    '[ "$(st)" = 204 ] && [ "$(hv access-control-allow-origin)" = "$APP" ] && grep -qi "^vary: .*origin" "$T/h"' "$(cat "$T/h")"
check "preflight: the route's methods, Authorization, Content-Type and the asked-for headers, a max age" \
    '[ "$(hv access-control-allow-methods)" = POST ] && hv access-control-allow-headers | grep -q "^Authorization, Content-Type, .*x-stainless-lang" && [ "$(hv access-control-max-age)" -gt 0 ]' \
    "$(cat "$T/h")"
pre "https://app.example.com" /v1/files
check "preflight on a route with several methods lists them (the second origin of the list)" \
    '[ "$(st)" = 204 ] && [ "$(hv access-control-allow-origin)" = https://app.example.com ] && hv access-control-allow-methods | grep -q "GET" && hv access-control-allow-methods | grep -q "POST"' \
    "$(cat "$T/h")"
pre "http://evil.example" /v1/chat/completions
check "preflight from another origin: 403 origin_not_allowed, no CORS headers" \
    '[ "$(st)" = 403 ] && no_cors && jq -e ".error.code == \"origin_not_allowed\"" "$T/b" >/dev/null' "$(cat "$T/h")"
pre "$APP" /v1/nope
check "preflight on an unknown path: 404" '[ "$(st)" = 404 ]'
hdrs -X OPTIONS -H "Origin: $APP" "$ZS_URL/v1/models"
check "OPTIONS without Access-Control-Request-Method is no preflight: 405 as before (allowed origin still named)" \
    '[ "$(st)" = 405 ] && [ "$(hv access-control-allow-origin)" = "$APP" ]'
hdrs -H "Origin: $APP" -H 'Authorization: Bearer sekrit' "$ZS_URL/v1/models"
check "GET /v1/models from the allowed origin: 200 with the origin echoed and Retry-After exposed" \
    '[ "$(st)" = 200 ] && [ "$(hv access-control-allow-origin)" = "$APP" ] && hv access-control-expose-headers | grep -q Retry-After' \
    "$(cat "$T/h")"
hdrs -H "Origin: $APP" "$ZS_URL/v1/models"
check "an error (401, no key) to the allowed origin carries the CORS headers too" \
    '[ "$(st)" = 401 ] && [ "$(hv access-control-allow-origin)" = "$APP" ]'
hdrs -H "Origin: $APP" -H 'Authorization: Bearer sekrit' -H 'Content-Type: application/json' -d '{}' "$ZS_URL/v1/chat/completions"
check "a 400 to the allowed origin carries them" '[ "$(st)" = 400 ] && [ "$(hv access-control-allow-origin)" = "$APP" ]'
hdrs -N -H "Origin: $APP" -H 'Authorization: Bearer sekrit' -H 'Content-Type: application/json' \
    -d '{"messages":[{"role":"user","content":"hi"}],"max_tokens":4,"stream":true}' "$ZS_URL/v1/chat/completions"
check "a stream to the allowed origin carries them" \
    '[ "$(st)" = 200 ] && [ "$(hv access-control-allow-origin)" = "$APP" ] && grep -q "data: \[DONE\]" "$T/b"'
hdrs -H "Origin: http://evil.example" -H 'Authorization: Bearer sekrit' "$ZS_URL/v1/models"
check "another origin: 200 without CORS headers (the browser blocks the page)" '[ "$(st)" = 200 ] && no_cors'
hdrs -H 'Authorization: Bearer sekrit' "$ZS_URL/v1/models"
check "no Origin (curl, SDKs): no CORS headers" '[ "$(st)" = 200 ] && no_cors'
zs_stop_server

zs_start_server "$T/any.log" --model "$MODEL" --allowed-origins '*' || zs_abort "serve --allowed-origins '*'"
hdrs -H "Origin: http://anything.example:8000" "$ZS_URL/health"
check "'*': Access-Control-Allow-Origin: * for any origin" '[ "$(st)" = 200 ] && [ "$(hv access-control-allow-origin)" = "*" ]'
pre "http://anything.example:8000" /v1/completions
check "'*': preflight 204" '[ "$(st)" = 204 ] && [ "$(hv access-control-allow-origin)" = "*" ]'
zs_stop_server

zs_start_server "$T/none.log" --model "$MODEL" || zs_abort "serve"
hdrs -H "Origin: $APP" "$ZS_URL/v1/models"
check "default (no --allowed-origins): no CORS headers" '[ "$(st)" = 200 ] && no_cors && ! grep -qi "^vary: origin" "$T/h"'
pre "$APP" /v1/chat/completions
check "default: OPTIONS answers 405 as before, without CORS headers" '[ "$(st)" = 405 ] && no_cors'
zs_stop_server

bad() { # NAME PATTERN LIST
    local name=$1 pat=$2 rc=0
    timeout 60 "$BIN" serve --model "$MODEL" --port 0 --allowed-origins "$3" >/dev/null 2>"$T/bad.err" || rc=$?
    check "$name" '[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q -- "$pat" "$T/bad.err"' "exit $rc: $(head -c 300 "$T/bad.err")"
}
bad "an origin with a path is refused" "'https://a.example/' is not an origin" "https://a.example/"
bad "'*' beside origins is refused" "stands alone" "*,https://a.example"
bad "an empty entry is refused" "an empty entry" "https://a.example,,"
zs_done
