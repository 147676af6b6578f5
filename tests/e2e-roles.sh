#!/bin/sh
# shellcheck shell=bash disable=SC2016,SC2034
# e2e-roles.sh — who may call what, checked against the table in docs/serving.md ("What each role
# may call"): the test reads the table and, for every row and every column (no key, acme's
# inference key, acme's finetune key, beta's finetune key, ops's admin key), sends the row's request
# with the column's key and expects the cell's status. Every route that /openapi.json describes must
# have a row, and every row a request here, so a route added without its line in the docs fails.
# acme's objects: a file it uploads, a LoRA fine-tuning job of one epoch on stories260K and the
# model that job serves; the adapter loaded at run time is that job's, under --lora-dir.
#
# Env: ZS_BIN (default ./zeroserve), ZS_SHARED (fixtures, default ../shared).
# Exit: 0 all passed, 1 something failed, 77 skipped. Each wait has a deadline.
# shellcheck source=tests/lib/e2e.sh
. "$(dirname "$0")/lib/e2e.sh"
zs_bash "$@"
set -u
zs_setup roles curl jq
zs_model stories260K
export ZS_DEVICE=${ZS_DEVICE:-cpu}
unset ZS_API_KEY
DOC=$ROOT/docs/serving.md
zs_need_file "$DOC"

cat >"$T/keys" <<'KEYS'
key-acme-inf acme inference
key-acme-ft  acme finetune
key-beta     beta finetune
key-ops      ops  admin
KEYS
chmod 600 "$T/keys"
COLKEYS=("" key-acme-inf key-acme-ft key-beta key-ops)
DD=$T/data
mkdir -p "$DD/models"
zs_start_server "$T/server.log" --model "$MODEL" --api-key-file "$T/keys" --data-dir "$DD" --lora-dir "$DD/models" \
    --allowed-origins http://app.example ||
    zs_abort "serve with a key file, a data directory and --lora-dir"

# call KEY METHOD PATH [BODY]: the status; the body in $T/r.json
call() {
    curl -s -m 60 -o "$T/r.json" -w '%{http_code}' -X "$2" ${1:+-H "Authorization: Bearer $1"} \
        ${4:+-H 'Content-Type: application/json' --data-binary "$4"} "$ZS_URL$3"
}
upload() { # KEY: the status
    curl -s -m 30 -o "$T/r.json" -w '%{http_code}' ${1:+-H "Authorization: Bearer $1"} "$ZS_URL/v1/files" \
        -F purpose=fine-tune -F "file=@$T/data.jsonl"
}
job() { # KEY FILE EPOCHS [FIELDS,]: the status of creating a job (its object in $T/r.json)
    call "$1" POST /v1/fine_tuning/jobs "{\"model\":\"stories260K\",\"training_file\":\"$2\",\"seed\":1,${4:-}
        \"hyperparameters\":{\"n_epochs\":$3,\"batch_size\":2,\"learning_rate_multiplier\":1}}"
}
wait_done() { # JOB SECONDS: 0 once it succeeded
    local end=$((SECONDS + $2)) st=""
    while [ $SECONDS -lt "$end" ]; do
        call key-ops GET "/v1/fine_tuning/jobs/$1" >/dev/null
        st=$(jq -r .status "$T/r.json")
        case $st in succeeded) return 0;; failed|cancelled) break;; esac
        sleep 0.2
    done
    echo "# job $1: $st"
    return 1
}
cat >"$T/data.jsonl" <<'JSONL'
{"prompt": "Once upon a time", "completion": " there was a purple dragon named Zork."}
{"text": "Lily had a big blue kite. She flew it every day in the park."}
JSONL

# ---------------------------------------------------------------- acme's objects
[ "$(upload key-acme-ft)" = 200 ] || zs_abort "acme uploads a file: $(cat "$T/r.json")"
FA=$(jq -r .id "$T/r.json")
[ "$(job key-acme-ft "$FA" 1 '"suffix":"roles","lora":{"r":2},')" = 200 ] || zs_abort "acme's LoRA job: $(cat "$T/r.json")"
JA=$(jq -r .id "$T/r.json")
wait_done "$JA" 120 || zs_abort "acme's job $JA did not succeed"
call key-acme-ft GET "/v1/fine_tuning/jobs/$JA" >/dev/null
AM=$(jq -r '.fine_tuned_model // empty' "$T/r.json")
AD=$(ls "$DD/models" | head -n 1) # the job's adapter directory (its name made safe for a file name)
[ -n "$AM" ] && [ -n "$AD" ] && [ -f "$DD/models/$AD/adapter_config.json" ] || zs_abort "acme's job has no adapter under $DD/models ($AM)"
BASE=$(basename "$MODEL")
LONGJOBS=()

# row REQUEST KEY: sends the row's request with KEY, prints the status
row() {
    local req=$1 key=$2 c
    case $req in
    '`GET /health`') call "$key" GET /health ;;
    '`GET /`') call "$key" GET / ;;
    '`GET /openapi.json`') call "$key" GET /openapi.json ;;
    '`GET /v1/models`') call "$key" GET /v1/models ;;
    '`GET /v1/models/{base}`') call "$key" GET "/v1/models/$BASE" ;;
    "\`GET /v1/models/{acme's model}\`") call "$key" GET "/v1/models/$AM" ;;
    '`POST /v1/completions`') call "$key" POST /v1/completions '{"prompt":"Once","max_tokens":2}' ;;
    "\`POST /v1/completions\` with acme's model")
        call "$key" POST /v1/completions "{\"model\":\"$AM\",\"prompt\":\"Once\",\"max_tokens\":2}" ;;
    '`POST /v1/chat/completions`') call "$key" POST /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}' ;;
    '`POST /v1/embeddings`') call "$key" POST /v1/embeddings '{"input":"Once upon a time"}' ;;
    '`POST /tokenize`') call "$key" POST /tokenize '{"prompt":"Once upon a time"}' ;;
    '`POST /detokenize`') call "$key" POST /detokenize '{"tokens":[1,2,3]}' ;;
    '`POST /v1/files`') upload "$key" ;;
    '`GET /v1/files`') call "$key" GET /v1/files ;;
    "\`GET /v1/files/{acme's file}\`") call "$key" GET "/v1/files/$FA" ;;
    "\`POST /v1/fine_tuning/jobs\` on acme's file")
        c=$(job "$key" "$FA" 100)
        [ "$c" = 200 ] && LONGJOBS+=("$(jq -r .id "$T/r.json")")
        echo "$c" ;;
    '`GET /v1/fine_tuning/jobs`') call "$key" GET /v1/fine_tuning/jobs ;;
    "\`GET /v1/fine_tuning/jobs/{acme's job}\`") call "$key" GET "/v1/fine_tuning/jobs/$JA" ;;
    "\`GET /v1/fine_tuning/jobs/{acme's job}/events\`") call "$key" GET "/v1/fine_tuning/jobs/$JA/events" ;;
    "\`GET /v1/fine_tuning/jobs/{acme's job}/checkpoints\`") call "$key" GET "/v1/fine_tuning/jobs/$JA/checkpoints" ;;
    "\`POST /v1/fine_tuning/jobs/{acme's job}/cancel\`")
        [ "$(job key-acme-ft "$FA" 100)" = 200 ] || { echo "setup: $(cat "$T/r.json")"; return; }
        local j
        j=$(jq -r .id "$T/r.json")
        LONGJOBS+=("$j")
        call "$key" POST "/v1/fine_tuning/jobs/$j/cancel" ;;
    '`OPTIONS /v1/chat/completions` (a CORS preflight)')
        curl -s -m 30 -o "$T/r.json" -w '%{http_code}' -X OPTIONS ${key:+-H "Authorization: Bearer $key"} \
            -H 'Origin: http://app.example' -H 'Access-Control-Request-Method: POST' "$ZS_URL/v1/chat/completions" ;;
    '`GET /metrics`') call "$key" GET /metrics ;;
    '`GET /v1/plan`') call "$key" GET /v1/plan ;;
    '`POST /v1/load_lora_adapter`') call "$key" POST /v1/load_lora_adapter "{\"lora_name\":\"roles-ad\",\"lora_path\":\"$AD\"}" ;;
    '`POST /v1/unload_lora_adapter`') call "$key" POST /v1/unload_lora_adapter '{"lora_name":"roles-ad"}' ;;
    *) echo "no request for this row" ;;
    esac
}

# ---------------------------------------------------------------- the table
awk '/^\| request \| no key \| acme inference \| acme finetune \| beta finetune \| ops admin \|$/ { on = 1; next }
     on && /^\|---/ { next }
     on && /^\|/ { print; next }
     on { exit }' "$DOC" >"$T/table"
check "docs/serving.md has the role table (at least 20 rows)" '[ "$(wc -l <"$T/table")" -ge 20 ]' "$(wc -l <"$T/table") rows"
ROWS=()
while IFS= read -r line; do
    IFS='|' read -r _ req c0 c1 c2 c3 c4 _ <<<"$line"
    req=$(echo "$req" | sed 's/^ *//; s/ *$//')
    want=("$c0" "$c1" "$c2" "$c3" "$c4")
    got=()
    for i in 0 1 2 3 4; do got+=("$(row "$req" "${COLKEYS[$i]}")"); done
    w=$(echo "${want[*]}" | xargs)
    g="${got[*]}"
    check "$req: $w" '[ "$w" = "$g" ]' "got $g (last answer: $(head -c 300 "$T/r.json"))"
    ROWS+=("$req")
done <"$T/table"
for j in "${LONGJOBS[@]}"; do call key-ops POST "/v1/fine_tuning/jobs/$j/cancel" >/dev/null; done

# ---------------------------------------------------------------- every route has a row
call "" GET /openapi.json >/dev/null
jq -r '.paths | to_entries[] | .key as $p | .value | keys[] | select(test("^(get|post|put|delete|patch)$")) | "\(ascii_upcase) \($p)"' \
    "$T/r.json" | sed 's/{[^}]*}/{}/g' | sort -u >"$T/routes"
printf '%s\n' "${ROWS[@]}" | grep -v '^`OPTIONS ' | sed 's/^`\([A-Z]* [^`]*\)`.*/\1/; s/{[^}]*}/{}/g' | sort -u >"$T/rows"
check "every route of /openapi.json ($(wc -l <"$T/routes")) has a row in the table" '[ -s "$T/routes" ] && [ -z "$(comm -23 "$T/routes" "$T/rows")" ]' \
    "without a row: $(comm -23 "$T/routes" "$T/rows" | tr '\n' ';')"
check "and every row is a route" '[ -z "$(comm -13 "$T/routes" "$T/rows")" ]' "not a route: $(comm -13 "$T/routes" "$T/rows" | tr '\n' ';')"
zs_stop_server
zs_done
