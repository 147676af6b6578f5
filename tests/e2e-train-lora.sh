#!/bin/sh
# End-to-end LoRA fine-tuning with the CLI on stories260K (issue 14): `zeroserve train --lora-r`
# over a q8_0 base (QLoRA) lowers the loss and writes only a PEFT adapter (a few hundred KB at
# most, against the 1 MB base); kill -9 during a LoRA run and --resume with another rank count
# (same global batch) gives a byte-identical adapter to an uninterrupted run; `export --merge`
# writes a full model whose greedy text equals the server's with the adapter; bad LoRA flags are
# refused by name.
# shellcheck source=tests/lib/e2e.sh
. "$(dirname "$0")/lib/e2e.sh"
M=$SHARED/models/stories260K
zs_tmpdir train-lora
export ZS_DEVICE=cpu
for w in Zork Mira Pip Luna Bo Kit; do
    printf '{"prompt": "The name is %s.", "completion": " Hello, %s! I am a dragon."}\n' "$w" "$w"
done > "$T/data.jsonl"

# QLoRA: r 8 over q8_0 weights, 120 steps
$Z train --model "$M" --weight-dtype q8_0 --data "$T/data.jsonl" --out "$T/ad" --steps 120 --lr 5e-3 \
    --batch-size 2 --lora-r 8 --lora-alpha 16 --log-every 1 > "$T/log" 2>&1; rc=$?
check "train --lora-r 8 --weight-dtype q8_0: exit 0" '[ $rc = 0 ]'
first=$(sed -n 's/^step 1\/120  loss \([0-9.]*\).*/\1/p' "$T/log")
last=$(sed -n 's/^step 120\/120  loss \([0-9.]*\).*/\1/p' "$T/log")
check "QLoRA loss $first -> $last, down by at least 40%" \
    '[ -n "$first" ] && [ -n "$last" ] && awk -v a="$first" -v b="$last" "BEGIN { exit !(b <= 0.6 * a) }"'
check "the output is a PEFT adapter and nothing else" \
    '[ "$(ls "$T/ad" | tr "\n" " ")" = "adapter_config.json adapter_model.safetensors " ]'
sz=$(wc -c < "$T/ad/adapter_model.safetensors" 2>/dev/null || echo 0)
check "the adapter is small ($sz bytes)" '[ "$sz" -gt 1000 ] && [ "$sz" -lt 400000 ]'
check "adapter_config.json: r 8, alpha 16, all seven targets" \
    'jq -e ".r == 8 and .lora_alpha == 16 and (.target_modules | length) == 7 and .peft_type == \"LORA\"" "$T/ad/adapter_config.json" > /dev/null'

# kill -9 and resume with another rank count: 1 rank x batch 2 x accum 2 == 2 ranks x batch 2
common="--model $M --data $T/data.jsonl --steps 400 --lr 1e-3 --batch-size 2 --lora-r 4 --lora-dropout 0.1"
$Z train $common --grad-accum 2 --out "$T/u" --checkpoint-dir "$T/uck" > /dev/null 2>&1
$Z train $common --ranks 2 --out "$T/k" --save-every 20 --checkpoint-dir "$T/ck" > /dev/null 2>&1 &
kpid=$!
i=0; while [ ! -f "$T/ck/latest" ] && [ $i -lt 400 ]; do sleep 0.02; i=$((i+1)); done
kill -9 $kpid 2>/dev/null; wait $kpid 2>/dev/null
ck=$(sed 's/.*step-0*//' "$T/ck/latest" 2>/dev/null)
check "kill -9 left a LoRA checkpoint (step ${ck:-none})" '[ -n "$ck" ] && [ "$ck" -lt 400 ]'
cks=$(du -sb "$T/ck" 2>/dev/null | awk '{print $1}')
check "LoRA checkpoints hold the adapter and its moments only ($cks bytes)" '[ -n "$cks" ] && [ "$cks" -lt 1000000 ]'
$Z train $common --grad-accum 2 --out "$T/k" --resume "$T/ck" > "$T/k2.log" 2>&1; rc=$?
check "resume with 1 rank x 2 micro-steps: exit 0" '[ $rc = 0 ]'
check "the resumed adapter equals the uninterrupted run's, byte for byte" \
    'cmp -s "$T/u/adapter_model.safetensors" "$T/k/adapter_model.safetensors"'

# export --merge on the f32 base: the merged model's greedy text equals the server's with the adapter
$Z train --model "$M" --data "$T/data.jsonl" --out "$T/ad32" --steps 150 --lr 5e-3 --batch-size 2 --lora-r 8 \
    > /dev/null 2>&1
$Z export --merge --model "$M" --lora "$T/ad32" --out "$T/merged" > /dev/null 2>&1; rc=$?
check "export --merge: exit 0, a full model directory" '[ $rc = 0 ] && [ -f "$T/merged/config.json" ] && [ -f "$T/merged/tokenizer.json" ]'
gen=$($Z generate --model "$T/merged" --prompt "The name is Zork." --temperature 0 --max-tokens 12 2>/dev/null)
check "the merged model learnt the format: $gen" 'case "$gen" in "The name is Zork. Hello, Zork!"*) true;; *) false;; esac'
if zs_start_server "$T/server.log" --model "$M" --lora "tags=$T/ad32" --data-dir "$T/data"; then
    srv=$(curl -s "$ZS_URL/v1/completions" -H 'Content-Type: application/json' \
        -d '{"model":"tags","prompt":"The name is Zork.","max_tokens":12,"temperature":0}' | jq -r '.choices[0].text')
    check "served with the adapter: the merged model's text ($srv)" '[ "The name is Zork.$srv" = "$gen" ]'
    zs_stop_server
else
    check "serve --lora starts" false
fi

# refusals
$Z train --model "$M" --data "$T/data.jsonl" --out "$T/x" --steps 1 --lora-alpha 8 > "$T/e1" 2>&1
check "--lora-alpha without LoRA is refused" 'grep -qi "lora" "$T/e1" && [ ! -d "$T/x" ]'
$Z train --model "$M" --data "$T/data.jsonl" --out "$T/x" --steps 1 --lora-r 4 --lora-targets q,foo > "$T/e2" 2>&1
check "an unknown --lora-targets name is refused by name" 'grep -q "foo" "$T/e2" && [ ! -d "$T/x" ]'
$Z export --merge --model "$M" --lora "$T/nonexistent" --out "$T/x" > "$T/e3" 2>&1
check "export --merge of a missing adapter names it" 'grep -q "nonexistent" "$T/e3" && [ ! -d "$T/x" ]'

zs_done
