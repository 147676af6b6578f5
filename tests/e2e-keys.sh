#!/bin/sh
# shellcheck shell=bash disable=SC2016,SC2034
# e2e-keys.sh — API keys with tenants and roles (--api-key-file, server/keys.h) through the server:
# an inference key completes and is refused /metrics and /v1/files (403, naming the role it
# needs); a finetune key lists files and is refused /metrics; an admin key reads /metrics; no key
# and an unknown key get 401; /health needs none. SIGHUP reloads the file (an old key is gone, a
# new one works), and a bad file on SIGHUP keeps the keys in force and logs the file and line. A bad
# key file fails the start naming its line; --api-key with --api-key-file is refused. The audit
# log under --data-dir records a fine-tuning action, a 403 and the reloads, and not the reads.
# shellcheck source=tests/lib/e2e.sh
. "$(dirname "$0")/lib/e2e.sh"
zs_bash "$@"
zs_need curl jq
zs_need_bin
zs_model stories260K
zs_tmpdir keys
export ZS_DEVICE=${ZS_DEVICE:-cpu}
printf '# tenants\nkey-inf t1 inference\nkey-ft t2 finetune rpm=100\nkey-adm ops admin\n' >"$T/keys"
chmod 600 "$T/keys"
code() { # PATH KEY [BODY]: the HTTP status
    curl -s -o /dev/null -w '%{http_code}' ${2:+-H "Authorization: Bearer $2"} \
        ${3:+-H 'Content-Type: application/json' --data-binary "$3"} "$ZS_URL$1"
}
zs_start_server "$T/s.log" --model "$MODEL" --api-key-file "$T/keys" --data-dir "$T/data" || zs_abort "serve --api-key-file"
P='{"prompt": "hi", "max_tokens": 1}'
check "inference: completions 200, /metrics 403, /v1/files 403" \
    '[ "$(code /v1/completions key-inf "$P")" = 200 ] && [ "$(code /metrics key-inf)" = 403 ] && [ "$(code /v1/files key-inf)" = 403 ]'
check "the 403 names the role and what the route needs" \
    'curl -s -H "Authorization: Bearer key-inf" "$ZS_URL/metrics" | jq -e ".error.code == \"insufficient_role\" and (.error.message | test(\"role \\\\(inference\\\\).*needs admin\"))" >/dev/null'
check "finetune: /v1/files 200, completions 200, /metrics 403" \
    '[ "$(code /v1/files key-ft)" = 200 ] && [ "$(code /v1/completions key-ft "$P")" = 200 ] && [ "$(code /metrics key-ft)" = 403 ]'
check "admin: /metrics 200, /v1/files 200" '[ "$(code /metrics key-adm)" = 200 ] && [ "$(code /v1/files key-adm)" = 200 ]'
check "no key and an unknown key: 401; /health: 200 without one" \
    '[ "$(code /v1/models "")" = 401 ] && [ "$(code /v1/models key-infx)" = 401 ] && [ "$(code /health "")" = 200 ]'
J='{"model": "x", "training_file": "file-nope"}'
jc=$(code /v1/fine_tuning/jobs key-ft "$J")
A=$T/data/audit.jsonl
check "the audit log: a finetune action with who, what, when and its result" \
    '[ "$jc" = 404 ] && jq -se "any(.[]; .tenant == \"t2\" and .role == \"finetune\" and .method == \"POST\" and .path == \"/v1/fine_tuning/jobs\" and .status == 404 and .result != \"ok\" and (.time | test(\"^20[0-9-]+T[0-9:.]+Z$\")) and .remote == \"127.0.0.1\")" "$A" >/dev/null' \
    "$jc $(tail -n 3 "$A" 2>&1)"
check "a role refused an admin route is logged (403 insufficient_role), a read let in is not" \
    'jq -se "any(.[]; .tenant == \"t1\" and .path == \"/metrics\" and .status == 403 and .result == \"insufficient_role\") and ([.[] | select(.method == \"GET\" and .status == 200)] | length == 0)" "$A" >/dev/null' \
    "$(cat "$A" 2>&1 | head -c 600)"
check "the audit log is the owner's alone (mode 600)" '[ "$(stat -c %a "$A")" = 600 ]'
printf 'key-new t3 admin\n' >"$T/keys"
kill -HUP "$SPID"
sleep 0.5
check "SIGHUP reloads the file: the new key works, the old one is gone" \
    '[ "$(code /metrics key-new)" = 200 ] && [ "$(code /v1/models key-inf)" = 401 ]'
printf 'key-x t3\n' >"$T/keys"
kill -HUP "$SPID"
sleep 0.5
check "a bad file on SIGHUP keeps the keys in force" '[ "$(code /metrics key-new)" = 200 ]'
zs_stop_server
check "the audit log has both SIGHUPs: keys_reloaded, then bad_key_file" \
    'jq -se "[.[] | select(.method == \"SIGHUP\") | .result] == [\"keys_reloaded\", \"bad_key_file\"]" "$A" >/dev/null' "$(grep SIGHUP "$A")"
check "the log says what SIGHUP did, with the bad file's line" \
    'grep -q "SIGHUP: 1 keys from" "$T/s.log" && grep -q "keys:1: 2 fields.*the keys in force stay" "$T/s.log"'
rc=0
timeout 60 "$BIN" serve --model "$MODEL" --port 0 --api-key-file "$T/keys" >/dev/null 2>"$T/bad.err" || rc=$?
check "a bad key file fails the start, naming the line" '[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "keys:1: 2 fields" "$T/bad.err"' \
    "$(head -c 300 "$T/bad.err")"
rc=0
timeout 60 "$BIN" serve --model "$MODEL" --port 0 --api-key-file "$T/keys" --api-key k >/dev/null 2>"$T/both.err" || rc=$?
check "--api-key with --api-key-file is refused" '[ $rc -ne 0 ] && grep -q -- "--api-key and --api-key-file" "$T/both.err"'
zs_done
