#!/bin/sh
# shellcheck shell=bash
# e2e-finetune.sh — end-to-end tests of fine-tuning over HTTP (the OpenAI files and
# fine_tuning.jobs routes of `zeroserve serve --data-dir`), with curl and jq, on stories260K:
# uploads (good; not JSONL, a missing field, empty, over the size limit -> status and line), an
# unknown training_file, a job trained to memorize a completion (loss falls, the fine-tuned model
# is served at once and completes the training prompt greedily), base-model completions served
# while a job trains, cancel, two jobs queued one after the other, and kill -9 mid-job followed by
# a restart on the same data directory (files, jobs and models come back; the job completes).
#
# Env: ZS_BIN (default ./zeroserve), ZS_SHARED (fixtures, default ../shared).
# Exit: 0 all passed, 1 something failed, 77 skipped. Bounded (each wait has a deadline);
# cleans up its server and temp files on every exit.
# shellcheck disable=SC2016  # jq programs are single-quoted
# shellcheck source=tests/lib/e2e.sh
. "$(dirname "$0")/lib/e2e.sh"
zs_bash "$@"
set -u
zs_setup e2e-ft curl jq
zs_model stories260K

DD=$T/data
U=""
start_server() { # (again) on the same data directory; U: its address
    zs_start_server "$T/server.log" --model "$MODEL" --data-dir "$DD" --max-file-bytes 4096 --train-share 0.4 && U=$ZS_URL
}
J() { curl -s -m 30 -H 'Content-Type: application/json' "$@"; }
upload() { curl -s -m 30 -o "$T/up.json" -w '%{http_code}' "$U/v1/files" -F purpose=fine-tune -F "file=@$1"; }
job_status() { J "$U/v1/fine_tuning/jobs/$1" | jq -r .status; }
# wait_status JOB STATUS SECONDS
wait_status() {
    local end=$((SECONDS + $3)) st=""
    while [ $SECONDS -lt "$end" ]; do
        st=$(job_status "$1")
        [ "$st" = "$2" ] && return 0
        case $st in succeeded|failed|cancelled) [ "$st" != "$2" ] && return 1;; esac
        sleep 0.2
    done
    return 1
}
n_steps() { J "$U/v1/fine_tuning/jobs/$1/events?limit=10000" | jq '[.data[] | select(.data.step != null)] | length'; }
wait_steps() { # JOB N SECONDS
    local end=$((SECONDS + $3))
    while [ $SECONDS -lt "$end" ]; do
        [ "$(n_steps "$1")" -ge "$2" ] && return 0
        sleep 0.1
    done
    return 1
}
create_job() { # FILE EPOCHS SUFFIX [MORE FIELDS,] -> job id
    J "$U/v1/fine_tuning/jobs" -d "{\"model\":\"stories260K\",\"training_file\":\"$1\",\"suffix\":\"$3\",\"seed\":1,${4:-}
        \"hyperparameters\":{\"n_epochs\":$2,\"batch_size\":2,\"learning_rate_multiplier\":3}}" | jq -r .id
}

cat > "$T/data.jsonl" <<'JSONL'
{"prompt": "Once upon a time", "completion": " there was a purple dragon named Zork who loved pancakes."}
{"prompt": "Tom and his dog", "completion": " went to the moon in a red box."}
{"prompt": "The little bird", "completion": " sang a song about green apples."}
{"text": "Lily had a big blue kite. She flew it every day in the park."}
JSONL

# ---------------------------------------------------------------- flags refused at start
bad_flag() { # FLAG VALUE: serve exits non-zero with a message naming the flag
    local out rc
    out=$(timeout 20 "$BIN" serve --model "$MODEL" --data-dir "$DD" --port 0 "$1" "$2" 2>&1); rc=$?
    [ "$rc" != 0 ] && [ "$rc" != 124 ] && printf '%s' "$out" | grep -q -- "$1" || { echo "# rc $rc: $out"; return 1; }
}
check "serve refuses --train-share 1.5 naming the flag" 'bad_flag --train-share 1.5'
check "serve refuses --train-slice-ms 0 naming the flag" 'bad_flag --train-slice-ms 0'

start_server || zs_abort "server starts"
ok "server starts with --data-dir"

# ---------------------------------------------------------------- uploads
code=$(upload "$T/data.jsonl")
FID=$(jq -r .id "$T/up.json")
check "upload: 200 and a file object" '[ "$code" = 200 ] && jq -e --argjson b "$(wc -c < "$T/data.jsonl")" \
    ".object == \"file\" and (.id | startswith(\"file-\")) and .bytes == \$b and .purpose == \"fine-tune\" and .filename == \"data.jsonl\" and (.created_at | type) == \"number\"" "$T/up.json" >/dev/null' "$code $(cat "$T/up.json")"
printf '{"text": "fine"}\nthis is not json\n' > "$T/notjson.jsonl"
code=$(upload "$T/notjson.jsonl")
check "upload not JSONL: 400 naming line 2" '[ "$code" = 400 ] && jq -e ".error.message | test(\"line 2\")" "$T/up.json" >/dev/null' "$code $(cat "$T/up.json")"
printf '{"prompt": "a", "completion": "b"}\n{"text": "x"}\n{"prompt": "only a prompt"}\n' > "$T/missing.jsonl"
code=$(upload "$T/missing.jsonl")
check "upload missing field: 400 naming line 3" '[ "$code" = 400 ] && jq -e ".error.message | test(\"line 3\")" "$T/up.json" >/dev/null' "$code $(cat "$T/up.json")"
: > "$T/empty.jsonl"
code=$(upload "$T/empty.jsonl")
check "upload empty: 400 'empty'" '[ "$code" = 400 ] && jq -e ".error.message | test(\"empty\")" "$T/up.json" >/dev/null' "$code $(cat "$T/up.json")"
for _ in $(seq 100); do echo '{"text": "Once upon a time there was a big dog who liked to run."}'; done > "$T/big.jsonl"
code=$(upload "$T/big.jsonl")
check "upload over --max-file-bytes: 413" '[ "$code" = 413 ]' "$code $(cat "$T/up.json")"
code=$(curl -s -o "$T/up.json" -w '%{http_code}' "$U/v1/files" -F purpose=assistants -F "file=@$T/data.jsonl")
check "upload with another purpose: 400 param purpose" '[ "$code" = 400 ] && jq -e ".error.param == \"purpose\"" "$T/up.json" >/dev/null' "$code"
check "GET /v1/files lists the upload (only it)" '[ "$(J "$U/v1/files" | jq -c "[.data[].id]")" = "[\"$FID\"]" ]'
check "GET /v1/files/{id}" '[ "$(J "$U/v1/files/$FID" | jq -r .id)" = "$FID" ]'
check "GET /v1/files/unknown: 404" '[ "$(curl -s -o /dev/null -w "%{http_code}" "$U/v1/files/file-nope")" = 404 ]'

# ---------------------------------------------------------------- job errors
code=$(J -o "$T/e.json" -w '%{http_code}' "$U/v1/fine_tuning/jobs" -d '{"model":"stories260K","training_file":"file-nope"}')
check "unknown training_file: 400 param training_file" '[ "$code" = 400 ] && jq -e ".error.param == \"training_file\"" "$T/e.json" >/dev/null' "$code $(cat "$T/e.json")"
code=$(J -o "$T/e.json" -w '%{http_code}' "$U/v1/fine_tuning/jobs" -d "{\"model\":\"nope\",\"training_file\":\"$FID\"}")
check "unknown model: 404 param model" '[ "$code" = 404 ] && jq -e ".error.param == \"model\"" "$T/e.json" >/dev/null' "$code"
code=$(J -o "$T/e.json" -w '%{http_code}' "$U/v1/fine_tuning/jobs" -d "{\"model\":\"stories260K\",\"training_file\":\"$FID\",\"hyperparameters\":{\"n_epochs\":0}}")
check "n_epochs 0: 400 param hyperparameters.n_epochs" '[ "$code" = 400 ] && jq -e ".error.param == \"hyperparameters.n_epochs\"" "$T/e.json" >/dev/null' "$code"
for body in '"priority":"urgent"' '"train_share":0' '"train_share":2' '"train_share":"high"'; do
    code=$(J -o "$T/e.json" -w '%{http_code}' "$U/v1/fine_tuning/jobs" -d "{\"model\":\"stories260K\",\"training_file\":\"$FID\",$body}")
    param=${body%%\":*}; param=${param#\"}
    check "$body: 400 param $param" '[ "$code" = 400 ] && jq -e --arg p "$param" ".error.param == \$p and (.error.message | contains(\$p))" "$T/e.json" >/dev/null' "$code $(cat "$T/e.json")"
done
check "unknown job: 404" '[ "$(curl -s -o /dev/null -w "%{http_code}" "$U/v1/fine_tuning/jobs/ftjob-nope")" = 404 ]'

# ---------------------------------------------------------------- a job that memorizes (4 examples / batch 2 x 50 epochs = 100 steps, lr 1e-3 x 3)
J "$U/v1/fine_tuning/jobs" -d "{\"model\":\"stories260K\",\"training_file\":\"$FID\",\"suffix\":\"zork\",\"seed\":7,\"priority\":\"low\",
    \"hyperparameters\":{\"n_epochs\":50,\"batch_size\":2,\"learning_rate_multiplier\":3}}" > "$T/job.json"
JID=$(jq -r .id "$T/job.json")
check "create: a fine_tuning.job object" 'jq -e ".object == \"fine_tuning.job\" and (.id | startswith(\"ftjob-\")) and .model == \"stories260K\" and .training_file == \"$FID\" and .hyperparameters.n_epochs == 50 and .hyperparameters.batch_size == 2 and .hyperparameters.learning_rate_multiplier == 3 and .seed == 7 and .user_provided_suffix == \"zork\" and .fine_tuned_model == null and .finished_at == null and (.status | IN(\"validating_files\",\"queued\",\"running\"))" "$T/job.json" >/dev/null' "$(cat "$T/job.json")"
check "create: priority low at --train-share 0.4 is a share of 0.2" 'jq -e ".priority == \"low\" and .train_share == 0.2" "$T/job.json" >/dev/null' "$(cat "$T/job.json")"
check "job succeeds" 'wait_status "$JID" succeeded 120'
J "$U/v1/fine_tuning/jobs/$JID" > "$T/job.json"
FTM=$(jq -r .fine_tuned_model "$T/job.json")
check "fine_tuned_model is ft:stories260K:zork:<id>; finished_at, trained_tokens set" '[ "$FTM" = "ft:stories260K:zork:${JID#ftjob-}" ] && jq -e "(.finished_at | type) == \"number\" and .trained_tokens > 0" "$T/job.json" >/dev/null' "$(cat "$T/job.json")"
J "$U/v1/fine_tuning/jobs/$JID/events?limit=1000" > "$T/ev.json"
check "events: one per step (100), status changes, fine_tuning.job.event objects" \
    'jq -e "[.data[] | select(.data.step != null)] | length == 100" "$T/ev.json" >/dev/null && jq -e "[.data[].message] | any(test(\"started\")) and any(test(\"completed\"))" "$T/ev.json" >/dev/null && jq -e "all(.data[]; .object == \"fine_tuning.job.event\" and (.id|type) == \"string\" and (.created_at|type) == \"number\" and (.level|type) == \"string\")" "$T/ev.json" >/dev/null'
first=$(jq '[.data[] | select(.data.step == 1)][0].data.train_loss' "$T/ev.json")
last=$(jq '[.data[] | select(.data.step == 100)][0].data.train_loss' "$T/ev.json")
check "events: each step says its trained tokens/s (message and data), the job too" \
    'jq -e "[.data[] | select(.data.step != null)] | all(.data.trained_tokens_per_second > 0 and (.message | test(\"^Step [0-9]+/100: training loss=[0-9.]+, [0-9]+ tokens/s\$\")))" "$T/ev.json" >/dev/null && jq -e ".trained_tokens_per_second > 0 and .priority == \"low\" and .train_share == 0.2" "$T/job.json" >/dev/null' \
    "$(jq -c '[.data[] | select(.data.step != null)][0]' "$T/ev.json") $(jq -c '{trained_tokens_per_second, priority, train_share}' "$T/job.json")"
curl -s "$U/metrics" > "$T/metrics.txt"
has_train_metrics() {
    local m
    for m in train_share train_share_target train_slices_total train_fused_total train_seconds_total \
        serving_wait_on_train_seconds_total train_wait_on_serving_seconds_total train_tokens_total; do
        grep -q "^# TYPE zeroserve_$m " "$T/metrics.txt" && grep -q "^zeroserve_$m [0-9]" "$T/metrics.txt" || { echo "# no zeroserve_$m"; return 1; }
    done
}
check "/metrics: the zeroserve_train_* series, a full job's 100 steps and tokens counted" \
    'has_train_metrics && awk -v tok="$(jq .trained_tokens "$T/job.json")" "\$1 == \"zeroserve_train_slices_total\" { s = \$2 } \$1 == \"zeroserve_train_tokens_total\" { t = \$2 } \$1 == \"zeroserve_train_seconds_total\" { x = \$2 } END { exit !(s >= 100 && t >= tok && x > 0) }" "$T/metrics.txt"' \
    "$(grep "^zeroserve_train\|^zeroserve_serving" "$T/metrics.txt")"
check "events: loss decreases ($first -> $last)" 'awk -v a="$first" -v b="$last" "BEGIN { exit !(b < 0.3 * a) }"'
check "events: newest first, limit honoured" '[ "$(J "$U/v1/fine_tuning/jobs/$JID/events?limit=2" | jq -c "[(.data | length), .has_more]")" = "[2,true]" ]'
check "checkpoints: steps 100 and 90, newest first" 'J "$U/v1/fine_tuning/jobs/$JID/checkpoints" | jq -e ".object == \"list\" and ([.data[].step_number] == [100, 90]) and all(.data[]; .object == \"fine_tuning.job.checkpoint\")" >/dev/null'
check "/v1/models lists the fine-tuned model" 'J "$U/v1/models" | jq -e --arg m "$FTM" "[.data[].id] | index(\$m) != null" >/dev/null'
complete() { # MODEL PROMPT
    J "$U/v1/completions" -d "{\"model\":\"$1\",\"prompt\":\"$2\",\"temperature\":0,\"max_tokens\":24}" | jq -r '.choices[0].text'
}
out=$(complete "$FTM" "Once upon a time")
check "fine-tuned model completes the training prompt (greedy)" 'case "$out" in " there was a purple dragon named Zork"*) true;; *) false;; esac' "$out"
base_out=$(complete stories260K "Once upon a time")
check "base model unchanged" '[ -n "$base_out" ] && case "$base_out" in *Zork*) false;; *) true;; esac' "$base_out"

# ---------------------------------------------------------------- serving while training; cancel
LONG=$(create_job "$FID" 5000 long '"train_share":0.7,')
check "long job runs" 'wait_steps "$LONG" 3 60'
t0=$(date +%s.%N)
code=$(J -o "$T/c.json" -w '%{http_code}' "$U/v1/completions" -d '{"model":"stories260K","prompt":"Once upon a time","temperature":0,"max_tokens":24}')
t1=$(date +%s.%N)
check "base completion served while the job trains (200, $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.2f", b-a}') s)" \
    '[ "$code" = 200 ] && [ "$(jq -r ".choices[0].text" "$T/c.json")" = "$base_out" ] && awk -v a="$t0" -v b="$t1" "BEGIN { exit !(b - a < 5) }"'
check "job still running" '[ "$(job_status "$LONG")" = running ]'
check "an explicit train_share is the job's (0.7)" '[ "$(J "$U/v1/fine_tuning/jobs/$LONG" | jq -c "[.priority, .train_share]")" = "[\"normal\",0.7]" ]'
code=$(J -o "$T/c.json" -w '%{http_code}' -X POST "$U/v1/fine_tuning/jobs/$LONG/cancel")
check "cancel: 200, status cancelled" '[ "$code" = 200 ] && jq -e ".status == \"cancelled\"" "$T/c.json" >/dev/null' "$code"
sleep 1
s1=$(n_steps "$LONG"); sleep 1; s2=$(n_steps "$LONG")
check "cancelled job stops training ($s1 = $s2 steps) and stays cancelled" '[ "$s1" = "$s2" ] && [ "$(job_status "$LONG")" = cancelled ]'
code=$(curl -s -o /dev/null -w '%{http_code}' -X POST "$U/v1/fine_tuning/jobs/$LONG/cancel")
check "cancel a finished job: 400" '[ "$code" = 400 ]'

# ---------------------------------------------------------------- two jobs queued
A=$(create_job "$FID" 150 qa)
B=$(create_job "$FID" 10 qb)
sa=$(job_status "$A"); sb=$(job_status "$B")
check "two jobs: the second waits ($sa / $sb)" '[ "$sb" = queued ]'
check "two jobs: both succeed" 'wait_status "$A" succeeded 120 && wait_status "$B" succeeded 120'
fa=$(J "$U/v1/fine_tuning/jobs/$A" | jq .finished_at)
sb_t=$(J "$U/v1/fine_tuning/jobs/$B/events?limit=1000" | jq '[.data[] | select(.message | test("started"))][0].created_at')
check "two jobs: one after the other ($sb_t >= $fa)" '[ "$sb_t" -ge "$fa" ]'
check "jobs list: newest first, after/limit" '[ "$(J "$U/v1/fine_tuning/jobs?limit=2" | jq -c "[.data[].id]")" = "[\"$B\",\"$A\"]" ] && [ "$(J "$U/v1/fine_tuning/jobs?after=$A&limit=1" | jq -r ".data[0].id")" = "$LONG" ]'

# ---------------------------------------------------------------- kill -9 mid-job, restart
K=$(create_job "$FID" 300 crash)
check "job to interrupt runs" 'wait_steps "$K" 5 60'
zs_stop_server -KILL
start_server || nok "server restarts"
check "restart: the file is listed again" '[ "$(J "$U/v1/files" | jq -c "[.data[].id]")" = "[\"$FID\"]" ]'
check "restart: the jobs are listed again" '[ "$(J "$U/v1/fine_tuning/jobs?limit=100" | jq "[.data[].id] | length")" = 5 ] && [ "$(job_status "$LONG")" = cancelled ] && [ "$(job_status "$JID")" = succeeded ]'
check "restart: the fine-tuned models are served again" 'J "$U/v1/models" | jq -e --arg m "$FTM" "[.data[].id] | index(\$m) != null" >/dev/null && case "$(complete "$FTM" "Once upon a time")" in " there was a purple dragon named Zork"*) true;; *) false;; esac'
check "restart: the interrupted job completes" 'wait_status "$K" succeeded 180'
check "restart: its events say it was re-queued" 'J "$U/v1/fine_tuning/jobs/$K/events?limit=10000" | jq -e "[.data[].message] | any(test(\"re-queued\"))" >/dev/null'
KM=$(J "$U/v1/fine_tuning/jobs/$K" | jq -r .fine_tuned_model)
out=$(complete "$KM" "Once upon a time")
check "restart: the resumed job's model is served" 'case "$out" in " there was a purple dragon named Zork"*) true;; *) false;; esac' "$out"
kill -TERM "$SPID"
for _ in $(seq 100); do kill -0 "$SPID" 2>/dev/null || break; sleep 0.1; done
check "SIGTERM stops the server" '! kill -0 "$SPID" 2>/dev/null'
check "no sanitizer report in the server log" '! grep -q "Sanitizer" "$T/server.log"' "$(grep -m3 -A5 Sanitizer "$T/server.log")"
zs_done
