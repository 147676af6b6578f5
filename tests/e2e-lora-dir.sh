#!/bin/sh
# shellcheck shell=bash
# e2e-lora-dir.sh — run-time adapter loading confined to serve --lora-dir, with curl and jq, on
# the small random Llama of tests/ref/lora-peft (made with `zeroserve init-model`): adapters load
# by a path relative to a --lora-dir (the first that has it, of two) or an absolute one inside;
# every refusal — a '..' component, an absolute path outside (existing or not), a symlink in the
# directory to an adapter outside, a dangling one, an adapter whose adapter_config.json links
# outside, a NUL byte, a 5000-character path — answers the same bytes (400 invalid_lora_path,
# no path echoed); a bad adapter inside still gets its specific error; without --lora-dir the
# route answers 403 lora_loading_disabled naming the flag; a missing --lora-dir, or a file,
# fails the start naming it.
#
# Env: ZS_BIN (default ./zeroserve). Runs on the CPU (ZS_DEVICE=cpu), in a few seconds.
# Exit: 0 all passed, 1 something failed, 77 skipped.
# shellcheck disable=SC2016  # jq programs and check's conditions are single-quoted
# shellcheck source=tests/lib/e2e.sh
. "$(dirname "$0")/lib/e2e.sh"
zs_bash "$@"
set -u
REFDIR=$ROOT/tests/ref/lora-peft
export ZS_DEVICE=cpu
unset ZS_API_KEY
zs_setup e2e-lora-dir curl jq
zs_need_file "$REFDIR/reference.json"

mapfile -t ARGS < <(jq -r '.init_model_args[]' "$REFDIR/reference.json")
"$BIN" init-model "${ARGS[@]}" --out "$T/base" >/dev/null || zs_abort "init-model"
L=$T/loras L2=$T/loras2 O=$T/outside
mkdir -p "$L" "$L2" "$O"
cp -r "$REFDIR" "$L/good"
cp -r "$REFDIR" "$L2/second"
cp -r "$REFDIR" "$O/ad"
cp -r "$REFDIR" "$L/bad"; jq '.r = 0' "$REFDIR/adapter_config.json" > "$L/bad/adapter_config.json"
ln -s "$O/ad" "$L/link"                 # a directory link out
ln -s "$O/none" "$L/dangling"           # a link out to nothing
mkdir "$L/flink"; cp "$REFDIR/adapter_model.safetensors" "$L/flink/"
ln -s "$O/ad/adapter_config.json" "$L/flink/adapter_config.json" # a file link out

zs_start_server "$T/server.log" --model "$T/base" --max-seqs 2 --data-dir "$T/data" --lora-dir "$L" --lora-dir "$L2" ||
    zs_abort "server starts with two --lora-dir"
ok "server starts with --lora-dir twice"
U=$ZS_URL
post() { curl -s -m 60 -H 'Content-Type: application/json' -o "$T/r.json" -w '%{http_code}' "$U$1" --data-binary "$2"; }
load() { post /v1/load_lora_adapter "{\"lora_name\":\"$1\",\"lora_path\":$2}"; } # NAME PATH-AS-JSON

# ---------------------------------------------------------------- inside: loads
code=$(load g '"good"')
check "a path relative to the first --lora-dir loads: 200, root its real path" \
    '[ "$code" = 200 ] && jq -e --arg r "$(realpath "$L/good")" ".id == \"g\" and .root == \$r" "$T/r.json" >/dev/null' "$code $(cat "$T/r.json")"
code=$(load g2 "\"$L/good\"")
check "an absolute path inside loads: 200" '[ "$code" = 200 ]' "$code $(cat "$T/r.json")"
code=$(load s '"second"')
check "a relative path found under the second --lora-dir loads: 200" \
    '[ "$code" = 200 ] && jq -e --arg r "$(realpath "$L2/second")" ".root == \$r" "$T/r.json" >/dev/null' "$code $(cat "$T/r.json")"
code=$(load g3 '"./good/"')
check "'./good/' loads too: 200" '[ "$code" = 200 ]' "$code $(cat "$T/r.json")"
out=$(curl -s -m 60 -H 'Content-Type: application/json' "$U/v1/completions" -d '{"model":"g","prompt":[11,48,85],"max_tokens":4,"temperature":0}')
check "the loaded adapter answers" 'echo "$out" | jq -e ".model == \"g\" and (.choices | length) == 1" >/dev/null' "$out"
code=$(load b '"bad"')
check "a bad adapter inside: 400 invalid_lora_adapter naming its file and the problem" \
    '[ "$code" = 400 ] && jq -e ".error.code == \"invalid_lora_adapter\" and (.error.message | test(\"adapter_config.json\")) and (.error.message | test(\"r\"))" "$T/r.json" >/dev/null' \
    "$code $(cat "$T/r.json")"

# ---------------------------------------------------------------- refusals: one answer
code=$(load x "\"$O/ad\"")
cp "$T/r.json" "$T/ref.json"
check "an existing adapter outside: 400 invalid_lora_path, param lora_path" \
    '[ "$code" = 400 ] && jq -e ".error.code == \"invalid_lora_path\" and .error.param == \"lora_path\" and .error.type == \"invalid_request_error\"" "$T/ref.json" >/dev/null' \
    "$code $(cat "$T/ref.json")"
check "the refusal names no path" '! grep -q -e "$T" -e outside "$T/ref.json"' "$(cat "$T/ref.json")"
LONG=$(head -c 5000 /dev/zero | tr '\0' a)
same() { # DESCRIPTION PATH-AS-JSON: 400 with the bytes of the first refusal
    code=$(load x "$2")
    check "$1: the same 400, byte for byte" '[ "$code" = 400 ] && cmp -s "$T/r.json" "$T/ref.json"' "$code $(head -c 400 "$T/r.json")"
}
same "a path outside that does not exist" "\"$O/nope\""
same "/etc (exists)" '"/etc"'
same "/nonexistent (does not)" '"/nonexistent-zs-lora"'
same "'..' out of the --lora-dir to an existing adapter" '"../outside/ad"'
same "'..' out of the --lora-dir to nothing" '"../outside/nope"'
same "'..' that would stay inside (good/../good)" '"good/../good"'
same "a relative path that exists under neither" '"nope"'
same "a symlink in the --lora-dir to an adapter outside" '"link"'
same "the same symlink by its absolute path" "\"$L/link\""
same "a dangling symlink in the --lora-dir" '"dangling"'
same "an adapter whose adapter_config.json links outside" '"flink"'
same "a NUL byte after a good path" '"good\u0000/x"'
same "a lone NUL byte" '"\u0000"'
same "a 5000-character relative path" "\"$LONG\""
same "a 5000-character absolute path inside" "\"$L/$LONG\""
same "an empty path" '""'
code=$(load x 5)
check "lora_path a number: 400 invalid_type" '[ "$code" = 400 ] && jq -e ".error.code == \"invalid_type\"" "$T/r.json" >/dev/null' "$code $(cat "$T/r.json")"
code=$(post /v1/load_lora_adapter '{"lora_name":"x"}')
check "lora_path missing: 400 missing_required_parameter" '[ "$code" = 400 ] && jq -e ".error.param == \"lora_path\"" "$T/r.json" >/dev/null' "$code"
check "only the good loads are listed" \
    '[ "$(curl -s "$U/v1/models" | jq -c "[.data[].id] | sort")" = "[\"base\",\"g\",\"g2\",\"g3\",\"s\"]" ]' "$(curl -s "$U/v1/models" | jq -c "[.data[].id]")"
zs_stop_server
check "no sanitizer report in the server log" '! grep -q Sanitizer "$T/server.log"'

# ---------------------------------------------------------------- off without --lora-dir; bad --lora-dir
zs_start_server "$T/server2.log" --model "$T/base" --max-seqs 2 --data-dir "$T/data" || zs_abort "server starts"
U=$ZS_URL
code=$(load g '"good"')
check "without --lora-dir: 403 lora_loading_disabled naming --lora-dir" \
    '[ "$code" = 403 ] && jq -e ".error.code == \"lora_loading_disabled\" and (.error.message | test(\"--lora-dir\"))" "$T/r.json" >/dev/null' "$code $(cat "$T/r.json")"
code=$(post /v1/load_lora_adapter 'not json')
check "without --lora-dir, whatever the body: 403" '[ "$code" = 403 ]' "$code"
zs_stop_server
"$BIN" serve --model "$T/base" --port 0 --data-dir "$T/data" --lora-dir "$T/missing-dir" > "$T/bad.log" 2>&1
rc=$?
check "a missing --lora-dir fails the start, naming it" '[ "$rc" != 0 ] && grep -q -- "--lora-dir .*$T/missing-dir" "$T/bad.log"' "rc $rc: $(tail -2 "$T/bad.log")"
"$BIN" serve --model "$T/base" --port 0 --data-dir "$T/data" --lora-dir "$REFDIR/adapter_config.json" > "$T/bad.log" 2>&1
rc=$?
check "a --lora-dir that is a file fails the start" '[ "$rc" != 0 ] && grep -q "not a directory" "$T/bad.log"' "rc $rc: $(tail -2 "$T/bad.log")"
zs_done
