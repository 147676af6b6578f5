#!/bin/sh
# shellcheck shell=bash disable=SC2016,SC2034
# e2e-tenants.sh — tenants own what they make (--api-key-file, server/keys.h): with a key file of
# three tenants (acme finetune with jobs=2, beta finetune, ops admin) on stories260K, acme's
# upload, jobs, events, checkpoints and fine-tuned models (a full one, a LoRA adapter) answer beta
# exactly as unknown ids do (404, never 403; a job on acme's file: what an unknown file gets),
# lists leave them out, admins see everything (with the owner); a job created with "shared": true
# serves its model to every tenant ("shared" must be a boolean: 400 naming it); acme's third job
# while two are queued or running is a 429 jobs_limit with Retry-After, and beta is unaffected; a
# restart on the same data directory keeps every owner and the shared flag.
#
# Env: ZS_BIN (default ./zeroserve), ZS_SHARED (fixtures, default ../shared).
# Exit: 0 all passed, 1 something failed, 77 skipped. Each wait has a deadline.
# shellcheck source=tests/lib/e2e.sh
. "$(dirname "$0")/lib/e2e.sh"
zs_bash "$@"
set -u
zs_setup tenants curl jq
zs_model stories260K
export ZS_DEVICE=${ZS_DEVICE:-cpu}

printf 'key-acme acme finetune jobs=2\nkey-acme-inf acme inference jobs=2\nkey-beta beta finetune\nkey-adm ops admin\n' >"$T/keys"
chmod 600 "$T/keys"
DD=$T/data
start() { zs_start_server "$T/server.log" --model "$MODEL" --api-key-file "$T/keys" --data-dir "$DD"; }

# call KEY METHOD PATH [BODY]: the status; the body in $T/r.json, the headers in $T/h.txt
call() {
    curl -s -m 30 -o "$T/r.json" -D "$T/h.txt" -w '%{http_code}' -X "$2" -H "Authorization: Bearer $1" \
        ${4:+-H 'Content-Type: application/json' --data-binary "$4"} "$ZS_URL$3"
}
# same_404 KEY METHOD PATH_OF_THEIRS PATH_OF_NOTHING ID NOID [BODY]: both answer 404 with the same
# error, the ids aside; BODY (a printf format) gets ID, then NOID, for its %s
same_404() {
    local a b ja jb
    # shellcheck disable=SC2059
    a=$(call "$1" "$2" "$3" "${7:+$(printf "$7" "$5")}")
    ja=$(jq -c --arg id "$5" '.error | if type == "object" then .message |= sub($id; "ID") else . end' "$T/r.json")
    # shellcheck disable=SC2059
    b=$(call "$1" "$2" "$4" "${7:+$(printf "$7" "$6")}")
    jb=$(jq -c --arg id "$6" '.error | if type == "object" then .message |= sub($id; "ID") else . end' "$T/r.json")
    [ "$a" = 404 ] && [ "$b" = 404 ] && [ -n "$ja" ] && [ "$ja" = "$jb" ] || { echo "# $a $ja / $b $jb"; return 1; }
}
ids() { # KEY PATH: the ids of a list, as a JSON array
    call "$1" GET "$2" >/dev/null && jq -c '[.data[].id]' "$T/r.json"
}
has() { # KEY PATH ID: the list shows ID
    ids "$1" "$2" | jq -e --arg i "$3" 'index($i) != null' >/dev/null
}
job_status() { call key-acme GET "/v1/fine_tuning/jobs/$1" >/dev/null && jq -r .status "$T/r.json"; }
wait_status() { # JOB STATUS SECONDS
    local end=$((SECONDS + $3)) st=""
    while [ $SECONDS -lt "$end" ]; do
        st=$(job_status "$1")
        [ "$st" = "$2" ] && return 0
        case $st in succeeded|failed|cancelled) echo "# $1: $st"; return 1;; esac
        sleep 0.2
    done
    echo "# $1: still $st"
    return 1
}
# job KEY FILE EPOCHS [FIELDS,]: creates a job (status in $T/r.json); its id
job() {
    call "$1" POST /v1/fine_tuning/jobs "{\"model\":\"stories260K\",\"training_file\":\"$2\",\"seed\":1,${4:-}
        \"hyperparameters\":{\"n_epochs\":$3,\"batch_size\":2,\"learning_rate_multiplier\":1}}" >/dev/null
    jq -r '.id // empty' "$T/r.json"
}
complete_code() { # KEY MODEL
    call "$1" POST /v1/completions "{\"model\":\"$2\",\"prompt\":\"Once upon a time\",\"max_tokens\":2}"
}

cat >"$T/data.jsonl" <<'JSONL'
{"prompt": "Once upon a time", "completion": " there was a purple dragon named Zork."}
{"text": "Lily had a big blue kite. She flew it every day in the park."}
JSONL
upload() { # KEY: the status; the file object in $T/up.json
    curl -s -m 30 -o "$T/up.json" -w '%{http_code}' -H "Authorization: Bearer $1" "$ZS_URL/v1/files" \
        -F purpose=fine-tune -F "file=@$T/data.jsonl"
}

start || zs_abort "the server starts with --api-key-file and --data-dir"

# ---------------------------------------------------------------- files
code=$(upload key-acme)
FA=$(jq -r '.id // empty' "$T/up.json")
check "acme uploads a file (200, no owner field)" '[ "$code" = 200 ] && [ -n "$FA" ] && jq -e "has(\"owner\") | not" "$T/up.json" >/dev/null' \
    "$code $(cat "$T/up.json")"
upload key-beta >/dev/null
FB=$(jq -r '.id // empty' "$T/up.json")
check "the audit log names acme's upload with the file's id" \
    'jq -se --arg id "$FA" "any(.[]; .tenant == \"acme\" and .method == \"POST\" and .path == \"/v1/files\" and .status == 200 and .object == \$id)" "$DD/audit.jsonl" >/dev/null' \
    "$(tail -n 2 "$DD/audit.jsonl" 2>&1)"
check "acme lists its file, not beta's" 'has key-acme /v1/files "$FA" && ! has key-acme /v1/files "$FB"' "$(ids key-acme /v1/files)"
check "beta's list leaves acme's file out" 'has key-beta /v1/files "$FB" && ! has key-beta /v1/files "$FA"' "$(ids key-beta /v1/files)"
check "beta's GET of acme's file: 404 as for an unknown id" 'same_404 key-beta GET "/v1/files/$FA" /v1/files/file-nope "$FA" file-nope'
check "acme's GET of its file: 200" '[ "$(call key-acme GET "/v1/files/$FA")" = 200 ] && jq -e ".id == \"$FA\" and (has(\"owner\") | not)" "$T/r.json" >/dev/null'
check "admin lists both files, with their owners" \
    'call key-adm GET /v1/files >/dev/null && jq -e --arg a "$FA" --arg b "$FB" "([.data[] | select(.id == \$a) | .owner] == [\"acme\"]) and ([.data[] | select(.id == \$b) | .owner] == [\"beta\"])" "$T/r.json" >/dev/null' \
    "$(cat "$T/r.json")"

# ---------------------------------------------------------------- job creation
BODY='{"model":"stories260K","training_file":"%s","hyperparameters":{"n_epochs":1}}'
# shellcheck disable=SC2059
cb=$(call key-beta POST /v1/fine_tuning/jobs "$(printf "$BODY" "$FA")")
eb=$(jq -c --arg id "$FA" '.error | if type == "object" then .message |= sub($id; "ID") else . end' "$T/r.json")
# shellcheck disable=SC2059
cn=$(call key-beta POST /v1/fine_tuning/jobs "$(printf "$BODY" file-nope)")
en=$(jq -c '.error | .message |= sub("file-nope"; "ID")' "$T/r.json")
check "beta's job on acme's file: the answer to an unknown file ($cb)" \
    '[ "$cb" = "$cn" ] && [ "$cb" -ge 400 ] && [ "$eb" = "$en" ] && echo "$eb" | jq -e ".param == \"training_file\"" >/dev/null' "$cb $eb / $cn $en"
# shellcheck disable=SC2059
cb=$(call key-beta POST /v1/fine_tuning/jobs "{\"model\":\"stories260K\",\"training_file\":\"$FB\",\"validation_file\":\"$FA\"}")
check "beta's job with acme's file as validation_file: refused as unknown" \
    '[ "$cb" = 400 ] && jq -e ".error.param == \"validation_file\"" "$T/r.json" >/dev/null' "$cb $(cat "$T/r.json")"
for v in '"yes"' 1 '{}' '[]'; do
    c=$(call key-acme POST /v1/fine_tuning/jobs "{\"model\":\"stories260K\",\"training_file\":\"$FA\",\"shared\":$v}")
    check "\"shared\": $v: 400 naming shared" \
        '[ "$c" = 400 ] && jq -e ".error.param == \"shared\" and (.error.message | test(\"shared\"))" "$T/r.json" >/dev/null' "$c $(cat "$T/r.json")"
done

# ---------------------------------------------------------------- three small jobs of acme
J1=$(job key-acme "$FA" 1 '"suffix":"priv",')          # a full fine-tune (stories260K's default)
check "acme's job: 200, \"shared\": false, no owner field" \
    '[ -n "$J1" ] && jq -e ".shared == false and (has(\"owner\") | not)" "$T/r.json" >/dev/null' "$(cat "$T/r.json")"
check "job 1 (full, private) succeeds" 'wait_status "$J1" succeeded 90'
J2=$(job key-acme "$FA" 1 '"suffix":"lora","lora":{"r":2},')
check "job 2 (LoRA, private) succeeds" '[ -n "$J2" ] && wait_status "$J2" succeeded 90'
uk=$(call key-acme POST /v1/fine_tuning/jobs "{\"model\":\"stories260K\",\"training_file\":\"$FA\",\"sharedd\":true}")
check "a job with a field it does not know (sharedd): 400 unknown_parameter naming it" \
    '[ "$uk" = 400 ] && jq -e ".error.code == \"unknown_parameter\" and .error.param == \"sharedd\"" "$T/r.json" >/dev/null' "$uk $(cat "$T/r.json")"
uk=$(call key-acme POST /v1/fine_tuning/jobs "{\"model\":\"stories260K\",\"training_file\":\"$FA\",\"hyperparameters\":{\"n_epoch\":1}}")
check "and one in hyperparameters (n_epoch): 400 naming hyperparameters.n_epoch" \
    '[ "$uk" = 400 ] && jq -e ".error.param == \"hyperparameters.n_epoch\"" "$T/r.json" >/dev/null' "$uk $(cat "$T/r.json")"
J3=$(job key-acme "$FA" 1 '"suffix":"pub","shared":true,')
check "job 3 (\"shared\": true) records it and succeeds" \
    '[ -n "$J3" ] && jq -e ".shared == true" "$T/r.json" >/dev/null && wait_status "$J3" succeeded 90'
model_of() { call key-acme GET "/v1/fine_tuning/jobs/$1" >/dev/null && jq -r '.fine_tuned_model // empty' "$T/r.json"; }
M1=$(model_of "$J1"); M2=$(model_of "$J2"); M3=$(model_of "$J3")

# ---------------------------------------------------------------- jobs, events, checkpoints
jobs_checks() { # TAG
    check "$1: acme lists its jobs, beta none of them" \
        'has key-acme /v1/fine_tuning/jobs "$J1" && has key-acme /v1/fine_tuning/jobs "$J3" && ! has key-beta /v1/fine_tuning/jobs "$J1" && ! has key-beta /v1/fine_tuning/jobs "$J3"' \
        "$(ids key-beta /v1/fine_tuning/jobs)"
    check "$1: admin lists acme's jobs with owner acme" \
        'call key-adm GET "/v1/fine_tuning/jobs?limit=100" >/dev/null && jq -e --arg j "$J1" "[.data[] | select(.id == \$j) | .owner] == [\"acme\"]" "$T/r.json" >/dev/null' "$(cat "$T/r.json")"
    check "$1: beta's GET of acme's job: 404 as for an unknown id" \
        'same_404 key-beta GET "/v1/fine_tuning/jobs/$J1" /v1/fine_tuning/jobs/ftjob-nope "$J1" ftjob-nope'
    check "$1: beta's events of acme's job: 404 as for an unknown id" \
        'same_404 key-beta GET "/v1/fine_tuning/jobs/$J1/events" /v1/fine_tuning/jobs/ftjob-nope/events "$J1" ftjob-nope'
    check "$1: beta's checkpoints of acme's job: 404 as for an unknown id" \
        'same_404 key-beta GET "/v1/fine_tuning/jobs/$J1/checkpoints" /v1/fine_tuning/jobs/ftjob-nope/checkpoints "$J1" ftjob-nope'
    check "$1: acme reads its job's events and checkpoints; admin too" \
        '[ "$(call key-acme GET "/v1/fine_tuning/jobs/$J1/events")" = 200 ] && jq -e ".data | length > 0" "$T/r.json" >/dev/null && [ "$(call key-acme GET "/v1/fine_tuning/jobs/$J1/checkpoints")" = 200 ] && jq -e ".data | length > 0" "$T/r.json" >/dev/null && [ "$(call key-adm GET "/v1/fine_tuning/jobs/$J1/events")" = 200 ]'
}
jobs_checks "before a restart"

# ---------------------------------------------------------------- fine-tuned models
models_checks() { # TAG
    check "$1: acme's /v1/models lists its three models; so does its inference key's" \
        'has key-acme /v1/models "$M1" && has key-acme /v1/models "$M2" && has key-acme /v1/models "$M3" && has key-acme-inf /v1/models "$M1" && has key-acme-inf /v1/models "$M2"' \
        "$M1 $M2 $M3: $(ids key-acme /v1/models)"
    check "$1: beta's /v1/models: the base and the shared model only" \
        '[ "$(ids key-beta /v1/models)" = "$(jq -cn --arg m "$M3" "[\"stories260K\", \$m]")" ]' "$(ids key-beta /v1/models)"
    check "$1: admin's /v1/models lists all three" 'has key-adm /v1/models "$M1" && has key-adm /v1/models "$M2" && has key-adm /v1/models "$M3"'
    check "$1: beta's GET /v1/models/{acme's model, acme's adapter}: 404 as for an unknown model" \
        'same_404 key-beta GET "/v1/models/$M1" /v1/models/ft:nope "$M1" ft:nope && same_404 key-beta GET "/v1/models/$M2" /v1/models/ft:nope "$M2" ft:nope'
    local P='{"model":"%s","prompt":"Once upon a time","max_tokens":2}' E='{"model":"%s","input":"hi"}'
    local C='{"model":"%s","messages":[{"role":"user","content":"hi"}]}'
    check "$1: beta's completions, chat and embeddings naming acme's model or adapter: 404 model_not_found as for an unknown one" \
        'same_404 key-beta POST /v1/completions /v1/completions "$M1" ft:nope "$P" && [ "$(jq -r .error.code "$T/r.json")" = model_not_found ] && same_404 key-beta POST /v1/completions /v1/completions "$M2" ft:nope "$P" && same_404 key-beta POST /v1/chat/completions /v1/chat/completions "$M2" ft:nope "$C" && same_404 key-beta POST /v1/embeddings /v1/embeddings "$M1" ft:nope "$E"' \
        "$(cat "$T/r.json")"
    check "$1: acme completes with its model and adapter, beta with the shared model and the base" \
        '[ "$(complete_code key-acme "$M1")" = 200 ] && [ "$(complete_code key-acme-inf "$M2")" = 200 ] && [ "$(complete_code key-beta "$M3")" = 200 ] && [ "$(complete_code key-beta stories260K)" = 200 ] && [ "$(complete_code key-adm "$M1")" = 200 ]' \
        "$(cat "$T/r.json")"
}
check "the three models are named" '[ -n "$M1" ] && [ -n "$M2" ] && [ -n "$M3" ]' "$M1 $M2 $M3"
models_checks "before a restart"

# ---------------------------------------------------------------- the jobs limit (acme: jobs=2)
L1=$(job key-acme "$FA" 10000 '"suffix":"long1",')
L2=$(job key-acme "$FA" 10000 '"suffix":"long2",')
c=$(call key-acme POST /v1/fine_tuning/jobs "{\"model\":\"stories260K\",\"training_file\":\"$FA\"}")
check "acme's third active job: 429 jobs_limit naming the limit, with Retry-After" \
    '[ -n "$L1" ] && [ -n "$L2" ] && [ "$c" = 429 ] && grep -qi "^Retry-After: [0-9]" "$T/h.txt" && jq -e ".error.code == \"jobs_limit\" and (.error.message | test(\"tenant .acme. has 2 fine-tuning jobs queued or running.*jobs=2\"))" "$T/r.json" >/dev/null' \
    "$c $(cat "$T/r.json")"
check "acme's jobs list has no job of the refused request" \
    '[ "$(call key-adm GET "/v1/fine_tuning/jobs?limit=100" >/dev/null; jq "[.data[] | select(.owner == \"acme\")] | length" "$T/r.json")" = 5 ]'
JB=$(job key-beta "$FB" 10000)
check "beta is not limited by acme's jobs (200)" '[ -n "$JB" ]' "$(cat "$T/r.json")"
check "beta's cancel of acme's running job: 404 as for an unknown id; the job goes on" \
    'same_404 key-beta POST "/v1/fine_tuning/jobs/$L1/cancel" /v1/fine_tuning/jobs/ftjob-nope/cancel "$L1" ftjob-nope && [ "$(job_status "$L1")" != cancelled ]'
check "acme cancels its jobs (200)" '[ "$(call key-acme POST "/v1/fine_tuning/jobs/$L1/cancel")" = 200 ] && [ "$(call key-acme POST "/v1/fine_tuning/jobs/$L2/cancel")" = 200 ]'
L3=$(job key-acme "$FA" 10000 '"suffix":"long3",')
check "once they are cancelled, acme may create a job again" '[ -n "$L3" ] && [ "$(call key-acme POST "/v1/fine_tuning/jobs/$L3/cancel")" = 200 ]' "$(cat "$T/r.json")"
check "admin cancels beta's job (200)" '[ "$(call key-adm POST "/v1/fine_tuning/jobs/$JB/cancel")" = 200 ]'

# ---------------------------------------------------------------- the records, and a restart
check "the records on disk name the owner" \
    'jq -e ".owner == \"acme\"" "$DD/files/$FA.json" >/dev/null && jq -e "._owner == \"acme\" and .shared == false" "$DD/jobs/$J1.json" >/dev/null && jq -e "._owner == \"acme\" and .shared == true" "$DD/jobs/$J3.json" >/dev/null'
zs_stop_server
check "the server stops cleanly" '[ "$ZS_RC" = 0 ]' "rc $ZS_RC"
start || zs_abort "the server starts again on the same data directory"
check "after a restart: beta's GET of acme's file: 404; acme's: 200; beta's list leaves it out" \
    'same_404 key-beta GET "/v1/files/$FA" /v1/files/file-nope "$FA" file-nope && [ "$(call key-acme GET "/v1/files/$FA")" = 200 ] && ! has key-beta /v1/files "$FA" && has key-beta /v1/files "$FB"'
jobs_checks "after a restart"
models_checks "after a restart"
zs_stop_server
check "no sanitizer report in the server log" '! grep -q "Sanitizer" "$T/server.log"' "$(grep -m3 -A5 Sanitizer "$T/server.log")"
zs_done
