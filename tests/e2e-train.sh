#!/bin/sh
# End-to-end fine-tuning with `zeroserve train` on stories260K: 100 steps on a small JSONL lower
# the training loss by at least 30% and the exported model completes a training prompt with its
# training completion (greedy), with 1 rank and with 2 ranks offloaded to pinned host memory; a
# bad data line stops with its line number before anything is written.
# shellcheck source=tests/lib/e2e.sh
. "$(dirname "$0")/lib/e2e.sh"
M=$SHARED/models/stories260K
zs_tmpdir train
cp tests/ref/sft-small.jsonl "$T/data.jsonl" # prompt/completion, text and messages examples
for args in "--ranks 1" "--ranks 2 --offload cpu"; do
    $Z train --model "$M" --data "$T/data.jsonl" --out "$T/out" --steps 100 --lr 3e-3 --batch-size 2 \
        --log-every 1 $args > "$T/log" 2>&1; rc=$?
    check "train $args: exit 0" '[ $rc = 0 ]'
    first=$(sed -n 's/^step 1\/100  loss \([0-9.]*\).*/\1/p' "$T/log")
    last=$(sed -n 's/^step 100\/100  loss \([0-9.]*\).*/\1/p' "$T/log")
    check "train $args: loss $first -> $last, down by at least 30%" \
        '[ -n "$first" ] && [ -n "$last" ] && awk -v a="$first" -v b="$last" "BEGIN { exit !(b <= 0.7 * a) }"'
    out=$($Z generate --model "$T/out" --prompt "Once upon a time" --temperature 0 --max-tokens 40 2>/dev/null)
    check "train $args: the model completes a training prompt with its completion" \
        'case "$out" in "Once upon a time there was a purple dragon named Zork who loved pancakes"*) true;; *) false;; esac'
done
# kill -9 during training, then --resume: the losses from the checkpoint on equal an
# uninterrupted run's (printed to 4 decimals; tests/test-train checks the bits)
$Z train --model "$M" --data "$T/data.jsonl" --out "$T/u" --steps 300 --lr 1e-3 --batch-size 2 --ranks 2 \
    --checkpoint-dir "$T/uck" > "$T/u.log" 2>/dev/null
$Z train --model "$M" --data "$T/data.jsonl" --out "$T/k" --steps 300 --lr 1e-3 --batch-size 2 --ranks 2 \
    --save-every 10 --checkpoint-dir "$T/ck" > "$T/k1.log" 2>/dev/null &
kpid=$!
i=0; while [ ! -f "$T/ck/latest" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done
kill -9 $kpid 2>/dev/null; wait $kpid 2>/dev/null
ck=$(cat "$T/ck/latest" 2>/dev/null | sed 's/.*step-0*//')
check "kill -9 left a checkpoint (step ${ck:-none})" '[ -n "$ck" ] && [ "$ck" -lt 300 ]'
$Z train --model "$M" --data "$T/data.jsonl" --out "$T/k" --steps 300 --lr 1e-3 --batch-size 2 --ranks 1 \
    --resume "$T/ck" --batch-size 4 > "$T/k2.log" 2>/dev/null; rc=$?
check "resume (with 1 rank and the same global batch): exit 0" '[ $rc = 0 ]'
grep '^step' "$T/u.log" | awk -v c="${ck:-0}" '{ split($2, a, "/"); if (a[1] > c) print $2, $4 }' > "$T/u.tail"
grep '^step' "$T/k2.log" | awk '{ print $2, $4 }' > "$T/k.tail"
check "resumed losses equal the uninterrupted run from the checkpoint on" '[ -s "$T/k.tail" ] && cmp -s "$T/u.tail" "$T/k.tail"'
# export a checkpoint, serve it: the same greedy text as the model the run wrote itself
$Z export --checkpoint "$T/uck" --out "$T/exported" > /dev/null 2>&1; rc=$?
check "export --checkpoint: exit 0, the same weights as the run's own output" '[ $rc = 0 ] && cmp -s "$T/u/model.safetensors" "$T/exported/model.safetensors"'
want=$($Z generate --model "$T/u" --prompt "Tom and his dog" --temperature 0 --max-tokens 30 2>/dev/null)
got=""
zs_start_server "$T/serve.log" --model "$T/exported" &&
got=$(curl -s --max-time 30 "$ZS_URL/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt":"Tom and his dog","max_tokens":30,"temperature":0}' | sed -n 's/.*"text":"\([^"]*\)".*/\1/p')
zs_stop_server
check "serving the export gives the same greedy text" '[ -n "$got" ] && [ "Tom and his dog$got" = "$want" ]'
printf '{"text": "fine"}\n{"prompt": "x", "completion": 5}\n' > "$T/bad.jsonl"
$Z train --model "$M" --data "$T/bad.jsonl" --out "$T/bad-out" --steps 2 > "$T/log" 2>&1; rc=$?
check "bad data: exit 1 naming line 2" '[ $rc = 1 ] && grep -q "line 2" "$T/log"'
check "bad data: nothing written" '[ ! -e "$T/bad-out" ] && [ ! -e "$T/bad-out.tmp" ]'
: > "$T/empty.jsonl"
$Z train --model "$M" --data "$T/empty.jsonl" --out "$T/e-out" > "$T/log" 2>&1; rc=$?
check "empty data file refused" '[ $rc = 1 ] && grep -qi "empty" "$T/log"'
zs_done
