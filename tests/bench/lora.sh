#!/bin/sh
# shellcheck shell=bash
# lora.sh — the LoRA figures of issue 14 in one run (not part of `make test`):
#   1. memory of a LoRA fine-tune against a full fine-tune of the same model (peak RSS of
#      `zeroserve train` minus that of loading the model for inference, plus the figures train
#      prints), and their checkpoint sizes;
#   2. decode tokens/s of a batch mixing 8 adapters against the base alone (`zeroserve bench --lora 8`);
#   3. completion latency p50/p99 of a server with and without a LoRA job running on its base;
#   4. the loss curve of that job, which teaches the model a format (a word -> " <<word>> END"),
#      and the served adapter reproducing the format on words it was not trained on.
#
#   sh tests/bench/lora.sh
# Env: MODEL (default: SmolLM2-135M-Instruct Q4_1 from the zeroserve cache, fetched by
# server/fetch-smollm2.sh; its LoRA job is QLoRA over Q4_1), FULL_MODEL (the model of the
# memory comparison, which a full fine-tune can train: default MODEL loaded with
# --weight-dtype bf16), ZS_BIN (./zeroserve), N (completions per latency figure, 30),
# STEPS (training steps of the memory runs, 3), EPOCHS (of the format job, 3).
# shellcheck source=tests/lib/e2e.sh
. "$(dirname "$0")/../lib/e2e.sh"
zs_bash "$@"
set -u
N=${N:-30}
STEPS=${STEPS:-3}
EPOCHS=${EPOCHS:-3}
if [ -z "${MODEL:-}" ]; then
    MODEL=$(sh server/fetch-smollm2.sh) || { echo "cannot fetch SmolLM2 (give MODEL=...)" >&2; exit 1; }
fi
export ZS_DEVICE=${ZS_DEVICE:-cpu} ZS_LOG=${ZS_LOG:-warn}
for t in curl jq /usr/bin/time; do command -v "$t" >/dev/null || { echo "$t is needed" >&2; exit 1; }; done
zs_tmpdir lora-bench

# the format: train on 48 words, test on 8 others
TRAIN_WORDS="apple river stone cloud tiger maple honey candle rocket garden silver window
pencil butter forest castle dragon lemon marble needle orange pepper rabbit saddle
thunder violin walnut yellow zebra anchor bridge copper desert engine falcon glacier
harbor island jungle kettle ladder meadow nickel oyster parrot quartz sunset tunnel"
TEST_WORDS="banana planet mirror wizard coffee summer hammer lantern"
for w in $TRAIN_WORDS; do
    printf '{"prompt":"Word: %s\\nTag:","completion":" <<%s>> END"}\n' "$w" "$w"
done >"$T/format.jsonl"

echo "== zeroserve LoRA figures: $(basename "$MODEL") =="
echo
echo "-- 1. memory: LoRA vs full fine-tune of the same model ($STEPS steps, batch 4) --"
FULL_MODEL=${FULL_MODEL:-$MODEL}
peak_kb() { /usr/bin/time -f '%M' -o "$T/time.$1" "${@:2}" >"$T/out.$1" 2>&1; rc=$?; tail -n1 "$T/time.$1"; return $rc; }
base_kb=$(peak_kb gen "$BIN" generate --model "$FULL_MODEL" --weight-dtype bf16 --prompt "Word: apple" --max-tokens 1) ||
    { echo "generate failed:"; cat "$T/out.gen"; exit 1; }
lora_kb=$(peak_kb lora "$BIN" train --model "$FULL_MODEL" --weight-dtype bf16 --data "$T/format.jsonl" --out "$T/lora-out" \
    --steps "$STEPS" --batch-size 4 --lora-r 16 --checkpoint-dir "$T/ck-lora") || { echo "LoRA train failed:"; cat "$T/out.lora"; exit 1; }
# (a full fine-tune of a GGUF base trains and checkpoints, but cannot export a Hugging Face
# directory without the base's config.json: its exit status is not the figure here)
full_kb=$(peak_kb full "$BIN" train --model "$FULL_MODEL" --weight-dtype bf16 --data "$T/format.jsonl" --out "$T/full-out" \
    --steps "$STEPS" --batch-size 4 --checkpoint-dir "$T/ck-full")
grep -q "^step $STEPS/$STEPS " "$T/out.full" || { echo "full train failed:"; cat "$T/out.full"; exit 1; }
printf '%-34s %10s MB\n' "peak RSS, inference load (base)" $((base_kb / 1024))
printf '%-34s %10s MB   (+%s MB over the base)\n' "peak RSS, LoRA fine-tune (r 16)" $((lora_kb / 1024)) $(((lora_kb - base_kb) / 1024))
printf '%-34s %10s MB   (+%s MB over the base)\n' "peak RSS, full fine-tune" $((full_kb / 1024)) $(((full_kb - base_kb) / 1024))
grep -i "memory" "$T/out.lora" "$T/out.full" | sed 's/^/  /'
ck_l=$(du -sb "$T/ck-lora" | awk '{print $1}'); ck_f=$(du -sb "$T/ck-full" | awk '{print $1}')
printf '%-34s %10.2f MB\n' "checkpoint, LoRA" "$(echo "$ck_l / 1000000" | bc -l)"
printf '%-34s %10.2f MB   (%.0fx the LoRA one)\n' "checkpoint, full" "$(echo "$ck_f / 1000000" | bc -l)" "$(echo "$ck_f / $ck_l" | bc -l)"

echo
echo "-- 2. decode: a batch mixing 8 adapters vs the base alone --"
"$BIN" bench --model "$MODEL" --lora 8 --lora-r 16 --lora-seqs 16 --runs 5 --decode 16 2>&1 | grep -v "^zeroserve: info"

echo
echo "-- 3. completion latency with and without a LoRA job (16 greedy tokens, $N requests, one at a time) --"
zs_start_server "$T/server.log" --model "$MODEL" --data-dir "$T/data" || exit 1
printf '{"model":"%s","prompt":"Word: apple\\nTag:","max_tokens":16,"temperature":0,"ignore_eos":true}' \
    "$(curl -s "$ZS_URL/v1/models" | jq -r '.data[0].id')" >"$T/body.json"
lat() { # N requests -> file of seconds
    for ((j = 0; j < N; j++)); do
        curl -s -o /dev/null -w '%{time_total}\n' -H 'Content-Type: application/json' --data-binary @"$T/body.json" \
            "$ZS_URL/v1/completions"
        sleep 0.${1:-0}
    done | sort -g >"$T/lat.$2"
}
pct() { awk -v p="$2" '{ v[NR] = $1 } END { i = int(NR * p + 0.999999); printf "%.1f", v[i] * 1000 }' "$1"; }
lat 0 warm
lat 0 idle
fid=$(curl -s -F purpose=fine-tune -F file=@"$T/format.jsonl" "$ZS_URL/v1/files" | jq -r .id)
job=$(curl -s -H 'Content-Type: application/json' "$ZS_URL/v1/fine_tuning/jobs" -d "{\"model\":\"$(jq -r .model "$T/body.json")\",\"training_file\":\"$fid\",\"suffix\":\"tags\",\"method\":{\"type\":\"supervised\",\"supervised\":{\"hyperparameters\":{\"n_epochs\":$EPOCHS,\"batch_size\":4,\"learning_rate_multiplier\":2}}},\"lora\":{\"r\":16,\"alpha\":32}}")
jid=$(echo "$job" | jq -r .id)
[ "$jid" != null ] || { echo "job refused: $job"; exit 1; }
for _ in $(seq 600); do
    st=$(curl -s "$ZS_URL/v1/fine_tuning/jobs/$jid" | jq -r .status)
    [ "$st" = running ] && break
    sleep 0.2
done
lat 2 busy # with pauses between requests, so the job gets idle passes to run in
st=$(curl -s "$ZS_URL/v1/fine_tuning/jobs/$jid" | jq -r .status)
printf '%-34s p50 %8s ms   p99 %8s ms\n' "no job" "$(pct "$T/lat.idle" 0.5)" "$(pct "$T/lat.idle" 0.99)"
printf '%-34s p50 %8s ms   p99 %8s ms   (job %s at the end)\n' "LoRA job running" "$(pct "$T/lat.busy" 0.5)" \
    "$(pct "$T/lat.busy" 0.99)" "$st"

echo
echo "-- 4. the job's loss curve and the served adapter --"
for _ in $(seq 3000); do
    st=$(curl -s "$ZS_URL/v1/fine_tuning/jobs/$jid" | jq -r .status)
    case $st in succeeded|failed|cancelled) break;; esac
    sleep 0.5
done
curl -s "$ZS_URL/v1/fine_tuning/jobs/$jid" >"$T/job.json"
echo "job $jid: $st, $(jq -r '.fine_tuned_model' "$T/job.json")"
[ "$st" = succeeded ] || { jq . "$T/job.json"; tail -20 "$T/server.log"; exit 1; }
curl -s "$ZS_URL/v1/fine_tuning/jobs/$jid/events?limit=1000" |
    jq -r '.data | reverse | .[] | select(.data.train_loss != null) | "\(.data.step) \(.data.train_loss)"' >"$T/loss"
awk '{ printf "  step %3d  loss %.4f\n", $1, $2 }' "$T/loss" | awk 'NR == 1 || NR % 4 == 0 { print } END { print }' | uniq
ft=$(jq -r .fine_tuned_model "$T/job.json")
echo "/v1/models: $(curl -s "$ZS_URL/v1/models" | jq -c --arg ft "$ft" '.data[] | select(.id == $ft) | {id, parent}')"
ok=0; base_ok=0
for w in $TEST_WORDS; do
    for m in "$ft" "$(jq -r .model "$T/body.json")"; do
        out=$(curl -s -H 'Content-Type: application/json' "$ZS_URL/v1/completions" \
            -d "{\"model\":\"$m\",\"prompt\":\"Word: $w\\nTag:\",\"max_tokens\":12,\"temperature\":0}" | jq -r '.choices[0].text')
        if [ "$m" = "$ft" ]; then
            printf '  %-8s adapter: %-28s' "$w" "$(printf '%q' "$out")"
            case $out in " <<$w>> END"*) ok=$((ok + 1));; esac
        else
            printf ' base: %s\n' "$(printf '%q' "$out" | cut -c1-40)"
            case $out in " <<$w>> END"*) base_ok=$((base_ok + 1));; esac
        fi
    done
done
echo "format reproduced on unseen words: adapter $ok/8, base $base_ok/8"
