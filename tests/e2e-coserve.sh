#!/bin/sh
# shellcheck shell=bash
# e2e-coserve.sh — a LoRA fine-tuning job sharing the serving engine (issue 31), over HTTP with
# curl and jq, on stories260K with 4 clients streaming completions back to back:
#   - with --train-share 0.5 a job completes under the load, its micro-batch forwards ride serving
#     steps (zeroserve_train_fused_total), /metrics reports the share, slices and waits, and a
#     greedy completion with logprobs is byte for byte what it was before the job;
#   - its adapter is byte-identical to the same job's trained with no load, and fused or not
#     (--train-fuse off);
#   - kill -9 while it trains under load: after a restart it resumes from its checkpoint and ends
#     with the uninterrupted run's adapter, byte for byte.
# Env: ZS_BIN (default ./zeroserve), ZS_SHARED (fixtures, default ../shared).
# Exit: 0 all passed, 1 something failed, 77 skipped. Bounded (each wait has a deadline).
# shellcheck disable=SC2016  # jq programs are single-quoted
# shellcheck source=tests/lib/e2e.sh
. "$(dirname "$0")/lib/e2e.sh"
zs_bash "$@"
set -u
zs_setup e2e-coserve curl jq
zs_model stories260K

DD=$T/data
U=""
start_server() { # FLAGS...: (again) on the same data directory; U: its address
    zs_start_server "$T/server.log" --model "$MODEL" --data-dir "$DD" --train-slice-ms 2 "$@" && U=$ZS_URL
}
J() { curl -s -m 30 -H 'Content-Type: application/json' "$@"; }
job_status() { J "$U/v1/fine_tuning/jobs/$1" | jq -r .status; }
wait_status() { # JOB STATUS SECONDS
    local end=$((SECONDS + $3)) st=""
    while [ $SECONDS -lt "$end" ]; do
        st=$(job_status "$1")
        [ "$st" = "$2" ] && return 0
        case $st in succeeded|failed|cancelled) return 1;; esac
        sleep 0.2
    done
    return 1
}
n_steps() { J "$U/v1/fine_tuning/jobs/$1/events?limit=10000" | jq '[.data[] | select(.data.step != null and (.data.skipped | not))] | length'; }
wait_steps() { # JOB N SECONDS
    local end=$((SECONDS + $3))
    while [ $SECONDS -lt "$end" ]; do
        [ "$(n_steps "$1")" -ge "$2" ] && return 0
        sleep 0.1
    done
    return 1
}
# a LoRA job of 20 steps (4 examples, batch 2, 10 epochs), the same seed every time
create_job() { # FILE SUFFIX -> job id
    J "$U/v1/fine_tuning/jobs" -d "{\"model\":\"stories260K\",\"training_file\":\"$1\",\"suffix\":\"$2\",\"seed\":5,
        \"lora\":{\"r\":4,\"alpha\":8,\"dropout\":0.1,\"target_modules\":\"all-linear\"},
        \"hyperparameters\":{\"n_epochs\":10,\"batch_size\":2,\"learning_rate_multiplier\":5}}" | jq -r .id
}
adapter_of() { # JOB -> the adapter file of its model
    local m
    m=$(J "$U/v1/fine_tuning/jobs/$1" | jq -r .fine_tuned_model)
    echo "$(J "$U/v1/models" | jq -r --arg m "$m" '.data[] | select(.id == $m) | .root')/adapter_model.safetensors"
}
metric() { curl -s -m 10 "$U/metrics" | awk -v k="$1" '$1 == k { print $2 }'; }

# the load: 4 clients streaming 32-token completions back to back until $T/stop exists; each
# client appends a line per finished request to $T/load.N
LOADPIDS=""
load_start() {
    rm -f "$T/stop" "$T"/load.*
    local i
    for i in 1 2 3 4; do
        (while [ ! -f "$T/stop" ]; do
            curl -s -m 60 -N "$U/v1/completions" -H 'Content-Type: application/json' \
                -d "{\"model\":\"stories260K\",\"prompt\":\"Once upon a time $i\",\"max_tokens\":32,\"stream\":true,\"ignore_eos\":true}" \
                >/dev/null && echo x >> "$T/load.$i"
        done) &
        LOADPIDS="$LOADPIDS $!"
        ZS_BGPIDS="$ZS_BGPIDS $!"
    done
}
load_stop() {
    touch "$T/stop"
    local p
    for p in $LOADPIDS; do wait "$p" 2>/dev/null; done
    LOADPIDS=""
}
load_count() { cat "$T"/load.* 2>/dev/null | wc -l; }

cat > "$T/data.jsonl" <<'JSONL'
{"prompt": "Once upon a time", "completion": " there was a purple dragon named Zork who loved pancakes."}
{"prompt": "Tom and his dog", "completion": " went to the moon in a red box."}
{"prompt": "The little bird", "completion": " sang a song about green apples."}
{"text": "Lily had a big blue kite. She flew it every day in the park."}
JSONL

# ---------------------------------------------------------------- the reference: no load
# (that a share of 0, the policy before issue 31, starves a job under gap-free load is
# tests/test-coserve's: HTTP clients leave gaps between requests, which such a job lives on)
start_server --train-share 0.5 || zs_abort "server starts"
FID=$(curl -s -m 30 "$U/v1/files" -F purpose=fine-tune -F "file=@$T/data.jsonl" | jq -r .id)
check "upload" '[ -n "$FID" ] && [ "$FID" != null ]'
R=$(create_job "$FID" alone)
check "the job alone succeeds" 'wait_status "$R" succeeded 120'
REF=$(adapter_of "$R")
check "its adapter exists" '[ -s "$REF" ]' "$REF"
zs_stop_server

# ---------------------------------------------------------------- share 0.5: it completes under load
start_server --train-share 0.5 || zs_abort "server restarts with --train-share 0.5"
greedy() { J "$U/v1/completions" -d '{"model":"stories260K","prompt":"Tom and his dog","max_tokens":24,"temperature":0,"logprobs":3}' | jq -c '.choices[0] | [.text, .logprobs]'; }
G0=$(greedy)
load_start
for _ in $(seq 100); do [ "$(load_count)" -ge 4 ] && break; sleep 0.1; done
F0=$(metric zeroserve_train_fused_total)
C=$(create_job "$FID" shared)
check "share 0.5: the job completes under continuous load" 'wait_status "$C" succeeded 180' "$(job_status "$C")"
l_end=$(load_count)
G1=$(greedy)
check "the load went on meanwhile ($l_end requests)" '[ "$l_end" -ge 8 ] && [ ! -f "$T/stop" ]'
check "a greedy completion with logprobs is byte for byte the same while requests and a job share the engine" \
    '[ "$G0" = "$G1" ] && [ -n "$G0" ]' "$G0 / $G1"
F1=$(metric zeroserve_train_fused_total)
check "its micro-batch forwards rode serving steps (zeroserve_train_fused_total $F0 -> $F1)" \
    'awk -v a="${F0:-0}" -v b="${F1:-0}" "BEGIN { exit !(b > a) }"'
sh_=$(metric zeroserve_train_share); tg=$(metric zeroserve_train_share_target); sl=$(metric zeroserve_train_slices_total)
wt=$(metric zeroserve_serving_wait_on_train_seconds_total); tt=$(metric zeroserve_train_tokens_total)
check "/metrics: share $sh_ (target $tg), $sl slices, $wt s waited, $tt tokens" \
    'awk -v s="$sh_" -v t="$tg" -v n="$sl" -v k="$tt" "BEGIN { exit !(s > 0 && s <= 1 && t == 0.5 && n > 0 && k > 0) }"'
check "its adapter is byte-identical to the unloaded run's" 'cmp -s "$REF" "$(adapter_of "$C")"'
check "events carry trained tokens/s" 'J "$U/v1/fine_tuning/jobs/$C/events?limit=1000" | jq -e "[.data[] | select(.data.step != null)] | all(.data.trained_tokens_per_second > 0)" >/dev/null'

# ---------------------------------------------------------------- kill -9 under load, resume
K=$(create_job "$FID" crash)
check "the job to interrupt passes its first checkpoint (step 10) under load" 'wait_steps "$K" 12 120'
zs_stop_server -KILL
load_stop
start_server --train-share 0.5 || zs_abort "server restarts after kill -9"
load_start
check "restart: the interrupted job resumes and completes under load" 'wait_status "$K" succeeded 180' "$(job_status "$K")"
check "restart: it resumed from its checkpoint (step 1 trained once, steps after 10 twice)" \
    'J "$U/v1/fine_tuning/jobs/$K/events?limit=10000" | jq -e "[.data[] | select(.data.step == 1)] | length == 1" >/dev/null && J "$U/v1/fine_tuning/jobs/$K/events?limit=10000" | jq -e "[.data[] | select(.data.step == 11)] | length >= 1" >/dev/null' 
check "restart: its adapter is the uninterrupted run's, byte for byte" 'cmp -s "$REF" "$(adapter_of "$K")"'
load_stop
zs_stop_server

# ---------------------------------------------------------------- unfused: the same bits
start_server --train-share 0.5 --train-fuse off || zs_abort "server starts with --train-fuse off"
load_start
N=$(create_job "$FID" unfused)
check "--train-fuse off: the job completes under load" 'wait_status "$N" succeeded 180'
check "--train-fuse off: no ride (zeroserve_train_fused_total $(metric zeroserve_train_fused_total))" '[ "$(metric zeroserve_train_fused_total)" = 0 ]'
check "--train-fuse off: the same adapter, byte for byte" 'cmp -s "$REF" "$(adapter_of "$N")"'
load_stop
check "no sanitizer report in the server log" '! grep -q "Sanitizer" "$T/server.log"' "$(grep -m3 -A5 Sanitizer "$T/server.log")"
zs_done
