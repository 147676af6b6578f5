#!/bin/sh
# shellcheck shell=bash
# e2e-lora.sh — end-to-end tests of LoRA adapters over HTTP, with curl and jq, on the small random
# Llama of tests/ref/lora-peft (made here with `zeroserve init-model` and the flags its
# reference.json records): `serve --lora a=tests/ref/lora-peft` lists the adapter with its parent
# and serves PEFT's numbers (the greedy token's logprob against PEFT's logits), a completion with
# "model": "a" differs from the base's; POST /v1/load_lora_adapter errors (missing fields, a name
# in use, bad bodies) and bad adapters under --lora-dir as 400s naming the file and the problem
# (an adapter for another base: shape; a target module the base lacks; r 0; a truncated
# safetensors; no directory: invalid_lora_path); a LoRA fine-tuning job over HTTP (OpenAI's method shape plus the lora extension, its
# validation errors, the default rule on this small base) that succeeds and whose ft:... model is
# listed with its parent and answers; the job's adapter loaded again at run time under another
# name; concurrent requests over two adapters and the base (each answer the one it gets alone);
# unloading: waits for a running stream, fails what is left under load with a clear error (404 or
# an SSE error event), requests naming it get 404, the name can be reused; a bad --lora fails the
# start naming NAME and DIR; a LoRA job killed (-9) mid-run continues from its latest checkpoint
# after a restart on the same data directory, which serves the first job's adapter again.
#
# Env: ZS_BIN (default ./zeroserve). Runs on the CPU (ZS_DEVICE=cpu), in 10 to 30 s.
# Exit: 0 all passed, 1 something failed, 77 skipped. Bounded (each wait has a deadline);
# cleans up its servers, background requests and temp files on every exit.
# shellcheck disable=SC2016,SC2034  # jq programs are single-quoted; check's eval reads variables
# shellcheck source=tests/lib/e2e.sh
. "$(dirname "$0")/lib/e2e.sh"
zs_bash "$@"
set -u
REFDIR=$ROOT/tests/ref/lora-peft
export ZS_DEVICE=cpu
unset ZS_API_KEY
zs_setup e2e-lora curl jq
zs_need_file "$REFDIR/reference.json"

# ---------------------------------------------------------------- the bases and the adapters
mapfile -t ARGS < <(jq -r '.init_model_args[]' "$REFDIR/reference.json")
"$BIN" init-model "${ARGS[@]}" --out "$T/base" >/dev/null || zs_abort "init-model"
ARGS32=()
for ((i = 0; i < ${#ARGS[@]}; i++)); do
    ARGS32+=("${ARGS[i]}")
    if [ "${ARGS[i]}" = --dim ]; then ARGS32+=(32); i=$((i+1)); fi
done
"$BIN" init-model "${ARGS32[@]}" --out "$T/base32" >/dev/null || nok "init-model --dim 32"
bad() { rm -rf "${T:?}/$1"; cp -r "$REFDIR" "$T/$1"; }
bad tgt; jq '.target_modules = ["foo_proj"]' "$REFDIR/adapter_config.json" > "$T/tgt/adapter_config.json"
bad r0; jq '.r = 0' "$REFDIR/adapter_config.json" > "$T/r0/adapter_config.json"
bad trunc; sz=$(stat -c %s "$REFDIR/adapter_model.safetensors")
head -c $((sz - 100)) "$REFDIR/adapter_model.safetensors" > "$T/trunc/adapter_model.safetensors"
printf '{"text": "hello there"}\n{"text": "the sky is blue"}\n' > "$T/tiny.jsonl"
if "$BIN" train --help 2>&1 | grep -q -- '--lora-r'; then
    # an adapter for another base (dim 32): its tensors do not fit this one
    "$BIN" train --model "$T/base32" --data "$T/tiny.jsonl" --out "$T/ad32" --lora-r 4 --epochs 1 >/dev/null 2>&1 ||
        nok "train --lora-r on the dim-32 base"
else
    echo "# note: this zeroserve has no 'train --lora-r': the shape mismatch is the PEFT adapter with r edited to 2"
    bad ad32; jq '.r = 2' "$REFDIR/adapter_config.json" > "$T/ad32/adapter_config.json"
fi

DD=$T/data
zs_start_server "$T/server.log" --model "$T/base" --data-dir "$DD" --max-seqs 4 --lora "a=$REFDIR" --lora-dir "$T" ||
    zs_abort "server starts with --lora a=$REFDIR --lora-dir \$T"
ok "server starts with --lora a=tests/ref/lora-peft"
U=$ZS_URL
J() { curl -s -m 60 -H 'Content-Type: application/json' "$@"; }
post() { J -o "$T/r.json" -w '%{http_code}' "$U$1" -d "$2"; } # PATH BODY -> code, body in $T/r.json
P='[11,48,85,122,159,196,233,270]'
cmpl() { # MODEL [PROMPT-JSON] -> the greedy text of 16 tokens
    J "$U/v1/completions" -d "{\"model\":\"$1\",\"prompt\":${2:-$P},\"temperature\":0,\"max_tokens\":16,\"ignore_eos\":true}" |
        jq -c '.choices[0].text // ("ERROR " + (.error.message // "?"))' # JSON-quoted: the random model writes NULs
}

# ---------------------------------------------------------------- serving a
J "$U/v1/models" > "$T/m.json"
check "/v1/models lists a with parent and root" 'jq -e --arg r "$REFDIR" "[.data[].id] == [\"base\",\"a\"] and (.data[1] | .parent == \"base\" and .root == \$r and .object == \"model\")" "$T/m.json" >/dev/null' "$(cat "$T/m.json")"
check "/v1/models/a" '[ "$(J "$U/v1/models/a" | jq -r .parent)" = base ]'
IDS=$(jq -c .ids "$REFDIR/reference.json")
ref=$(jq '.logits[3] as $l | ($l | max) as $m | -($l | map(. - $m | exp) | add | log)' "$REFDIR/reference.json")
J "$U/v1/completions" -d "{\"model\":\"a\",\"prompt\":$IDS,\"temperature\":0,\"max_tokens\":1,\"logprobs\":0}" > "$T/c.json"
got=$(jq '.choices[0].logprobs.token_logprobs[0]' "$T/c.json")
check "a serves PEFT's numbers: the greedy token's logprob after the reference ids ($got vs PEFT $ref)" \
    'awk -v a="$got" -v b="$ref" "BEGIN { d = a - b; exit !(d < 1e-3 && d > -1e-3) }"' "$(cat "$T/c.json")"
check "the answer names the adapter" 'jq -e ".model == \"a\"" "$T/c.json" >/dev/null'
base_lp=$(J "$U/v1/completions" -d "{\"prompt\":$IDS,\"temperature\":0,\"max_tokens\":1,\"logprobs\":0}" | jq '.choices[0].logprobs.token_logprobs[0]')
check "the base's logprob differs ($base_lp)" 'awk -v a="$base_lp" -v b="$ref" "BEGIN { d = a - b; exit !(d > 1e-3 || d < -1e-3) }"'
OUT_BASE=$(cmpl base); OUT_A=$(cmpl a)
check "a completion with model a differs from the base's" '[ "$OUT_A" != "$OUT_BASE" ] && [ "${OUT_A#\"ERROR}" = "$OUT_A" ]' "$OUT_A / $OUT_BASE"

# ---------------------------------------------------------------- load errors
code=$(post /v1/load_lora_adapter '{"lora_name":"x"}')
check "load without lora_path: 400 param lora_path" '[ "$code" = 400 ] && jq -e ".error.param == \"lora_path\"" "$T/r.json" >/dev/null' "$code $(cat "$T/r.json")"
code=$(post /v1/load_lora_adapter "{\"lora_name\":\"\",\"lora_path\":\"$REFDIR\"}")
check "load with an empty lora_name: 400" '[ "$code" = 400 ] && jq -e ".error.param == \"lora_name\"" "$T/r.json" >/dev/null' "$code"
code=$(post /v1/load_lora_adapter "{\"lora_name\":\"a\",\"lora_path\":\"$REFDIR\"}")
check "load under a name in use (a): 400 lora_adapter_exists" '[ "$code" = 400 ] && jq -e ".error.code == \"lora_adapter_exists\"" "$T/r.json" >/dev/null' "$code $(cat "$T/r.json")"
code=$(post /v1/load_lora_adapter "{\"lora_name\":\"base\",\"lora_path\":\"$REFDIR\"}")
check "load under the base's name: 400" '[ "$code" = 400 ]' "$code"
code=$(post /v1/load_lora_adapter "{\"lora_name\":\"x\",\"lora_path\":\"$REFDIR\",\"extra\":1}")
check "load with an unknown field: 400 param extra" '[ "$code" = 400 ] && jq -e ".error.param == \"extra\"" "$T/r.json" >/dev/null' "$code"
code=$(post /v1/load_lora_adapter 'not json')
check "load with a body that is not JSON: 400" '[ "$code" = 400 ]' "$code"
badload() { # DESCRIPTION DIR FILE PATTERN
    bl_file=$3 bl_pat=$4
    code=$(post /v1/load_lora_adapter "{\"lora_name\":\"x\",\"lora_path\":\"$2\"}")
    check "bad adapter, $1: 400 naming $(basename "$3") and the problem" \
        '[ "$code" = 400 ] && jq -e --arg f "$bl_file" --arg p "$bl_pat" ".error.code == \"invalid_lora_adapter\" and (.error.message | contains(\$f)) and (.error.message | test(\$p))" "$T/r.json" >/dev/null' \
        "$code $(cat "$T/r.json")"
}
badload "made for another base (dim 32)" "$T/ad32" "$T/ad32/adapter_model.safetensors" "shape"
badload "a target module the base lacks" "$T/tgt" "$T/tgt/adapter_config.json" "foo_proj"
badload "r 0" "$T/r0" "$T/r0/adapter_config.json" "'r' is 0"
badload "truncated safetensors" "$T/trunc" "$T/trunc/adapter_model.safetensors" "truncated"
code=$(post /v1/load_lora_adapter "{\"lora_name\":\"x\",\"lora_path\":\"$T/nope\"}")
check "no such directory: 400 invalid_lora_path (tests/e2e-lora-dir.sh has the rest of --lora-dir)" \
    '[ "$code" = 400 ] && jq -e ".error.code == \"invalid_lora_path\" and .error.param == \"lora_path\"" "$T/r.json" >/dev/null' "$code $(cat "$T/r.json")"
check "after the failures only base and a are listed" '[ "$(J "$U/v1/models" | jq -c "[.data[].id]")" = "[\"base\",\"a\"]" ]'
code=$(post /v1/unload_lora_adapter '{"lora_name":"nope"}')
check "unload an unknown adapter: 404" '[ "$code" = 404 ]' "$code"

# ---------------------------------------------------------------- a LoRA job over HTTP
for _ in 1 2 3 4 5 6 7 8; do echo '{"prompt": "Q: what color is the sky?", "completion": " A: blue"}'; done > "$T/data.jsonl"
FID=$(curl -s -m 30 "$U/v1/files" -F purpose=fine-tune -F "file=@$T/data.jsonl" | jq -r .id)
check "upload" '[ "${FID#file-}" != "$FID" ]' "$FID"
jobreq() { echo "{\"model\":\"base\",\"training_file\":\"$FID\",$1}"; }
code=$(post /v1/fine_tuning/jobs "$(jobreq '"method":{"type":"dpo","dpo":{}}')")
check "job with method dpo: 400 param method.type naming it" '[ "$code" = 400 ] && jq -e ".error.param == \"method.type\" and (.error.message | test(\"dpo\"))" "$T/r.json" >/dev/null' "$code $(cat "$T/r.json")"
code=$(post /v1/fine_tuning/jobs "$(jobreq '"hyperparameters":{"n_epochs":2},"method":{"type":"supervised","supervised":{"hyperparameters":{"n_epochs":3}}}')")
check "job with both hyperparameters shapes, different: 400" '[ "$code" = 400 ]' "$code $(cat "$T/r.json")"
code=$(post /v1/fine_tuning/jobs "$(jobreq '"lora":{"r":4,"rank":8}')")
check "job with an unknown lora key: 400 param lora.rank" '[ "$code" = 400 ] && jq -e ".error.param == \"lora.rank\"" "$T/r.json" >/dev/null' "$code $(cat "$T/r.json")"
code=$(post /v1/fine_tuning/jobs "$(jobreq '"lora":{"target_modules":["q","foo"]}')")
check "job with an unknown target module: 400 naming it" '[ "$code" = 400 ] && jq -e ".error.param == \"lora.target_modules[1]\" and (.error.message | test(\"foo\"))" "$T/r.json" >/dev/null' "$code $(cat "$T/r.json")"
code=$(post /v1/fine_tuning/jobs "$(jobreq '"lora":{"r":0}')")
check "job with lora.r 0: 400 param lora.r" '[ "$code" = 400 ] && jq -e ".error.param == \"lora.r\"" "$T/r.json" >/dev/null' "$code"
# the default on a base of 0.1M parameters, unquantized: a full fine-tune (cancelled at once)
code=$(post /v1/fine_tuning/jobs "$(jobreq '"suffix":"dflt"')")
DJ=$(jq -r .id "$T/r.json")
check "job without lora on this small base: a full fine-tune (\"lora\": null)" '[ "$code" = 200 ] && jq -e "has(\"lora\") and .lora == null" "$T/r.json" >/dev/null' "$code $(cat "$T/r.json")"
J -X POST "$U/v1/fine_tuning/jobs/$DJ/cancel" >/dev/null
code=$(post /v1/fine_tuning/jobs "$(jobreq '"suffix":"sky","seed":3,"method":{"type":"supervised","supervised":{"hyperparameters":{"n_epochs":3,"batch_size":2,"learning_rate_multiplier":10}}},"lora":{"r":4,"alpha":8,"target_modules":"all-linear"}')")
JID=$(jq -r .id "$T/r.json")
check "LoRA job created: lora and method recorded" '[ "$code" = 200 ] && jq -e ".lora == {\"r\":4,\"alpha\":8,\"dropout\":0,\"target_modules\":[\"q_proj\",\"k_proj\",\"v_proj\",\"o_proj\",\"gate_proj\",\"up_proj\",\"down_proj\"]} and .method.type == \"supervised\" and .method.supervised.hyperparameters == {\"n_epochs\":3,\"batch_size\":2,\"learning_rate_multiplier\":10} and .hyperparameters.n_epochs == 3" "$T/r.json" >/dev/null' "$code $(cat "$T/r.json")"
st=""
for _ in $(seq 600); do
    st=$(J "$U/v1/fine_tuning/jobs/$JID" | jq -r .status)
    case $st in succeeded|failed|cancelled) break;; esac
    sleep 0.1
done
J "$U/v1/fine_tuning/jobs/$JID" > "$T/job.json"
check "LoRA job succeeds" '[ "$st" = succeeded ]' "$st $(jq -c .error "$T/job.json")"
FTM=$(jq -r .fine_tuned_model "$T/job.json")
check "its model is ft:base:sky:<id>" '[ "$FTM" = "ft:base:sky:${JID#ftjob-}" ]' "$FTM"
J "$U/v1/fine_tuning/jobs/$JID/events?limit=1000" > "$T/ev.json"
first=$(jq '[.data[] | select(.data.step == 1)][0].data.train_loss' "$T/ev.json")
last=$(jq '[.data[] | select(.data.step == 12)][0].data.train_loss' "$T/ev.json")
check "12 steps, loss goes down ($first -> $last), trained over the served base" \
    'awk -v a="$first" -v b="$last" "BEGIN { exit !(b < a) }" && jq -e "[.data[].message] | any(test(\"LoRA adapter .* over the served base\"))" "$T/ev.json" >/dev/null'
check "checkpoints listed" 'J "$U/v1/fine_tuning/jobs/$JID/checkpoints" | jq -e "(.data | length) >= 1" >/dev/null'
J "$U/v1/models" > "$T/m.json"
FTDIR=$(jq -r --arg m "$FTM" '.data[] | select(.id == $m) | .root' "$T/m.json")
check "the job's adapter is listed with parent base" 'jq -e --arg m "$FTM" "any(.data[]; .id == \$m and .parent == \"base\")" "$T/m.json" >/dev/null && [ -f "$FTDIR/adapter_model.safetensors" ] && [ -f "$FTDIR/adapter_config.json" ]' "$(cat "$T/m.json")"
OUT_FT=$(cmpl "$FTM")
check "the job's model answers (and not as the base)" '[ "${OUT_FT#\"ERROR}" = "$OUT_FT" ] && [ "$OUT_FT" != "$OUT_BASE" ]' "$OUT_FT"

# ---------------------------------------------------------------- a second adapter at run time
code=$(post /v1/load_lora_adapter "{\"lora_name\":\"b\",\"lora_path\":\"$FTDIR\"}")
check "load b (the job's adapter) at run time: 200 lora_adapter r 4 alpha 8" '[ "$code" = 200 ] && jq -e --arg r "$FTDIR" ".object == \"lora_adapter\" and .id == \"b\" and .parent == \"base\" and .root == \$r and .r == 4 and .alpha == 8 and (.target_modules | length) == 7" "$T/r.json" >/dev/null' "$code $(cat "$T/r.json")"
OUT_B=$(cmpl b)
check "b answers as the job's model, not as a" '[ "$OUT_B" = "$OUT_FT" ] && [ "$OUT_B" != "$OUT_A" ]' "$OUT_B"

# ---------------------------------------------------------------- concurrency: base, a and b at once
for k in 1 2 3 4; do
    for m in base a b; do
        J "$U/v1/completions" -d "{\"model\":\"$m\",\"prompt\":$P,\"temperature\":0,\"max_tokens\":16,\"ignore_eos\":true}" \
            -o "$T/cc-$m-$k.json" -w '%{http_code}' > "$T/cc-$m-$k.code" &
        ZS_BGPIDS="$ZS_BGPIDS $!"
    done
done
wait $ZS_BGPIDS 2>/dev/null; ZS_BGPIDS=""
okc=1
for k in 1 2 3 4; do
    [ "$(cat "$T/cc-base-$k.code")" = 200 ] && [ "$(jq -c '.choices[0].text' "$T/cc-base-$k.json")" = "$OUT_BASE" ] || okc=0
    [ "$(cat "$T/cc-a-$k.code")" = 200 ] && [ "$(jq -c '.choices[0].text' "$T/cc-a-$k.json")" = "$OUT_A" ] || okc=0
    [ "$(cat "$T/cc-b-$k.code")" = 200 ] && [ "$(jq -c '.choices[0].text' "$T/cc-b-$k.json")" = "$OUT_B" ] || okc=0
done
check "12 concurrent requests over base, a and b: all 200, each the answer it gets alone" '[ "$okc" = 1 ]'

# ---------------------------------------------------------------- unloading
STREAM="{\"model\":\"b\",\"prompt\":$P,\"temperature\":0,\"max_tokens\":48,\"ignore_eos\":true,\"n\":8,\"stream\":true}"
gauge() { curl -s -m 5 "$U/metrics" | awk -v g="$1" '$1 == g { print int($2) }'; }
wait_gauge() { # NAME MIN: until the scheduler's gauge is at least MIN (5 s at most)
    for _ in $(seq 1000); do [ "$(gauge "$1")" -ge "$2" ] 2>/dev/null && return 0; sleep 0.005; done
    return 1
}
J -N "$U/v1/completions" -d "$STREAM" > "$T/stream1.txt" &
SP=$!; ZS_BGPIDS="$SP"
wait_gauge zeroserve_running_sequences 1
code=$(post /v1/unload_lora_adapter '{"lora_name":"b"}')
wait "$SP" 2>/dev/null; ZS_BGPIDS=""
check "unload b while a stream uses it (wait_s 30): 200, it waited (0 failed)" '[ "$code" = 200 ] && jq -e ".deleted == true and .failed_requests == 0" "$T/r.json" >/dev/null' "$code $(cat "$T/r.json")"
check "the stream finished normally" '[ "$(tail -n 2 "$T/stream1.txt" | head -1)" = "data: [DONE]" ] && ! grep -q error "$T/stream1.txt"' "$(tail -c 300 "$T/stream1.txt")"
code=$(J -o "$T/r.json" -w '%{http_code}' "$U/v1/completions" -d '{"model":"b","prompt":"hi"}')
check "a request naming b after the unload: 404" '[ "$code" = 404 ] && jq -e ".error.code == \"model_not_found\"" "$T/r.json" >/dev/null' "$code"
check "b is no longer listed" '! J "$U/v1/models" | jq -e "any(.data[]; .id == \"b\")" >/dev/null && [ "$(curl -s -o /dev/null -w "%{http_code}" "$U/v1/models/b")" = 404 ]'
code=$(post /v1/unload_lora_adapter '{"lora_name":"b"}')
check "unload b again: 404" '[ "$code" = 404 ]' "$code"
code=$(post /v1/load_lora_adapter "{\"lora_name\":\"b\",\"lora_path\":\"$FTDIR\"}")
check "the name b can be loaded again" '[ "$code" = 200 ] && [ "$(cmpl b)" = "$OUT_B" ]' "$code"
# under load: one streaming request (admitted first: its first event is in before the rest are
# sent, so the unload can only find it running or finished), then 24 requests of 8 sequences x 48
# tokens with b (4 sequences at a time)
J -N "$U/v1/completions" -d "$STREAM" > "$T/stream2.txt" &
ZS_BGPIDS="$ZS_BGPIDS $!"
for _ in $(seq 500); do grep -q '^data: ' "$T/stream2.txt" 2>/dev/null && break; sleep 0.01; done
for k in $(seq 24); do
    J "$U/v1/completions" -d "{\"model\":\"b\",\"prompt\":$P,\"temperature\":0,\"max_tokens\":48,\"ignore_eos\":true,\"n\":8}" \
        -o "$T/ld-$k.json" -w '%{http_code}' > "$T/ld-$k.code" &
    ZS_BGPIDS="$ZS_BGPIDS $!"
done
wait_gauge zeroserve_queue_length 16 || echo "# note: the queue never reached 16 requests"
code=$(post /v1/unload_lora_adapter '{"lora_name":"b","wait_s":0}')
cp "$T/r.json" "$T/unload2.json"
wait $ZS_BGPIDS 2>/dev/null; ZS_BGPIDS=""
nf=$(jq .failed_requests "$T/unload2.json")
check "unload b under load with wait_s 0: 200, the requests left are failed ($nf)" '[ "$code" = 200 ] && [ "$nf" -ge 1 ]' "$code $(cat "$T/unload2.json")"
n200=0; n404=0; nlate=0; nother=0
for k in $(seq 24); do
    c=$(cat "$T/ld-$k.code")
    if [ "$c" = 200 ]; then n200=$((n200+1))
    elif [ "$c" = 404 ] && jq -e '.error.message | test("unloaded")' "$T/ld-$k.json" >/dev/null; then n404=$((n404+1))
    elif [ "$c" = 404 ] && jq -e '.error.code == "model_not_found"' "$T/ld-$k.json" >/dev/null; then nlate=$((nlate+1))
    else nother=$((nother+1)); echo "# $c $(head -c 300 "$T/ld-$k.json")"; fi
done
check "every request under load ended: 200, 404 'unloaded', or 404 (sent after the unload) ($n200 / $n404 / $nlate / $nother other)" \
    '[ "$nother" = 0 ] && [ "$n404" -ge 1 ]'
check "the stream under load ended with [DONE] or an error event naming the unload" \
    'tail -n 2 "$T/stream2.txt" | head -1 | grep -q -e "^data: \[DONE\]$" -e "unloaded"' "$(tail -c 300 "$T/stream2.txt")"
check "the server is healthy after the unloads" '[ "$(curl -s -o /dev/null -w "%{http_code}" "$U/health")" = 200 ] && [ "$(cmpl a)" = "$OUT_A" ]'

# ---------------------------------------------------------------- kill -9 mid-job; a bad --lora; restart
n_steps() { J "$U/v1/fine_tuning/jobs/$1/events?limit=10000" | jq '[.data[] | select(.data.step != null)] | length'; }
code=$(post /v1/fine_tuning/jobs "$(jobreq '"suffix":"long","lora":{"r":2},"hyperparameters":{"n_epochs":100,"batch_size":2}')")
KJ=$(jq -r .id "$T/r.json")
for _ in $(seq 300); do [ "$(n_steps "$KJ")" -ge 15 ] && break; sleep 0.1; done
ks=$(n_steps "$KJ")
check "a long LoRA job runs ($ks steps)" '[ "$code" = 200 ] && [ "$ks" -ge 15 ]' "$code $(cat "$T/r.json")"
t0=$(date +%s.%N); ob=$(cmpl base); oa=$(cmpl a); t1=$(date +%s.%N)
check "served while the job trains on the same base: base and a answer as before ($(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.2f", b-a}') s)" \
    '[ "$ob" = "$OUT_BASE" ] && [ "$oa" = "$OUT_A" ] && [ "$(J "$U/v1/fine_tuning/jobs/$KJ" | jq -r .status)" = running ]' "$ob / $oa"
zs_stop_server -KILL
check "no sanitizer report in the server log" '! grep -q "Sanitizer" "$T/server.log"'
"$BIN" serve --model "$T/base" --port 0 --data-dir "$T/data2" --lora "bad=$T/tgt" > "$T/bad.log" 2>&1 &
BP=$!; ZS_BGPIDS="$BP"
for _ in $(seq 200); do kill -0 "$BP" 2>/dev/null || break; sleep 0.1; done
kill -0 "$BP" 2>/dev/null && { kill -KILL "$BP"; nok "a bad --lora fails the start" "still running"; }
wait "$BP"; rc=$?; ZS_BGPIDS=""
check "a bad --lora fails the start, naming NAME=DIR and the problem" '[ "$rc" != 0 ] && grep -q -- "--lora bad=$T/tgt" "$T/bad.log" && grep -q foo_proj "$T/bad.log"' "rc $rc: $(tail -3 "$T/bad.log")"
"$BIN" serve --model "$T/base" --port 0 --data-dir "$T/data2" --lora "noequals" > "$T/bad2.log" 2>&1
rc=$?
check "--lora without NAME=DIR: an error saying so" '[ "$rc" != 0 ] && grep -q "NAME=DIR" "$T/bad2.log"' "$(tail -2 "$T/bad2.log")"
zs_start_server "$T/server2.log" --model "$T/base" --data-dir "$DD" --max-seqs 4 || nok "restart on the same data directory"
U=$ZS_URL
check "restart: the job's adapter is served again with its parent, same answers" \
    'J "$U/v1/models" | jq -e --arg m "$FTM" "any(.data[]; .id == \$m and .parent == \"base\")" >/dev/null && [ "$(cmpl "$FTM")" = "$OUT_FT" ]'
st=""
for _ in $(seq 900); do
    st=$(J "$U/v1/fine_tuning/jobs/$KJ" | jq -r .status)
    case $st in succeeded|failed|cancelled) break;; esac
    sleep 0.1
done
check "restart: the job killed mid-run completes" '[ "$st" = succeeded ]' "$st $(J "$U/v1/fine_tuning/jobs/$KJ" | jq -c .error)"
# chronological: the first step after the re-queue continues from a checkpoint (every 10 steps)
resumed=$(J "$U/v1/fine_tuning/jobs/$KJ/events?limit=10000" |
    jq '[.data | reverse | .[]] | (map(.message | test("re-queued")) | index(true)) as $i | [.[$i:][] | select(.data.step != null)][0].data.step')
check "restart: it continued from its latest checkpoint (first step after the restart: $resumed)" '[ "$resumed" -gt 10 ] 2>/dev/null'
KM=$(J "$U/v1/fine_tuning/jobs/$KJ" | jq -r .fine_tuned_model)
check "restart: the resumed job's adapter is served" 'J "$U/v1/models/$KM" | jq -e ".parent == \"base\"" >/dev/null && [ "$(cmpl "$KM" | cut -c1-6)" != "\"ERROR" ]'
kill -TERM "$SPID"
for _ in $(seq 100); do kill -0 "$SPID" 2>/dev/null || break; sleep 0.1; done
check "SIGTERM stops the server" '! kill -0 "$SPID" 2>/dev/null'
check "no sanitizer report in the restarted server's log" '! grep -q "Sanitizer" "$T/server2.log"'
zs_done
