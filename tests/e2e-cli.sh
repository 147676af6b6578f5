#!/bin/sh
# End-to-end checks of the command line: generate reproduces the stories260K reference text,
# init-model writes a model that generate and bench run, --config maps DeepSpeed keys (unknown
# keys reported once, wrong types and impossible values named), and bad flags or model
# directories give clear errors with exit status 1.
# shellcheck source=tests/lib/e2e.sh
. "$(dirname "$0")/lib/e2e.sh"
zs_need_bin
zs_tmpdir cli

M=$SHARED/models/stories260K
# the first case's new_text (JSON escapes \n and \' are the only ones in it)
want=$(printf '%b' "$(sed -n 's/.*"new_text": "\([^"]*\)".*/\1/p' "$M/reference.json" | grep -v '^text minus' | head -1)")
out=$($Z generate --model "$M" --prompt "Once upon a time" --max-tokens 64 --temperature 0 2>"$T/err")
check "generate: greedy text equals the reference" '[ "$out" = "Once upon a time$want" ]'
for r in 2 3; do
  out2=$($Z generate --model "$M" --prompt "Once upon a time" --max-tokens 64 --temperature 0 --ranks $r --offload nvme --nvme-path "$T" 2>/dev/null)
  check "generate --ranks $r --offload nvme: same text" '[ "$out2" = "$out" ]'
done
a=$($Z generate --model "$M" --prompt "Tom" --max-tokens 20 --seed 7 2>/dev/null)
b=$($Z generate --model "$M" --prompt "Tom" --max-tokens 20 --seed 7 2>/dev/null)
c=$($Z generate --model "$M" --prompt "Tom" --max-tokens 20 --seed 8 2>/dev/null)
check "same seed, same text" '[ "$a" = "$b" ]'
check "another seed, another text" '[ "$a" != "$c" ]'
s=$($Z generate --model "$M" --prompt "Once upon a time" --max-tokens 64 --temperature 0 --stop "Lily" 2>/dev/null)
check "stop string ends the text before it" '[ "$s" = "Once upon a time, there was a little girl named " ]'

$Z init-model --arch gpt2 --layers 2 --dim 64 --heads 4 --ffn 128 --vocab 300 --context 64 --seed 3 --out "$T/g" >/dev/null
check "init-model gpt2 + generate" '$Z generate --model "$T/g" --prompt "hi" --max-tokens 5 >/dev/null 2>&1'
$Z init-model --arch llama --layers 3 --dim 64 --heads 4 --kv-heads 2 --ffn 96 --vocab 300 --context 128 --dtype bf16 --seed 3 --out "$T/l" >/dev/null
check "init-model llama bf16 + generate" '$Z generate --model "$T/l" --prompt "hi" --max-tokens 5 >/dev/null 2>&1'
$Z init-model --arch llama --layers 3 --dim 64 --heads 4 --kv-heads 2 --ffn 96 --vocab 300 --context 128 --dtype bf16 --seed 3 --out "$T/l2" >/dev/null
check "init-model is deterministic" 'cmp -s "$T/l/model.safetensors" "$T/l2/model.safetensors"'
check "bench runs" '$Z bench --model "$T/l" --runs 1 --prefill 8 --decode 4 --json "$T/b.json" >/dev/null 2>&1 && grep -q decode_tok_s "$T/b.json"'
mkdir -p "$T/nv"
check "bench --offload nvme runs (and writes --json)" '$Z bench --model "$T/l" --runs 1 --decode 4 --offload nvme --nvme-path "$T/nv" --ranks 2 --json "$T/bo.json" >"$T/bo" 2>&1 && grep -q "overlap figure" "$T/bo" && grep -q "\"overlap\"" "$T/bo.json"'

echo '{"zero_optimization":{"stage":3,"offload_param":{"device":"cpu"},"bogus_key":1},"steps_per_print":10}' > "$T/ok.json"
$Z generate --model "$M" --prompt hi --max-tokens 3 --config "$T/ok.json" --ranks 2 >/dev/null 2>"$T/err"; rc=$?
check "config: accepted" '[ $rc = 0 ]'
check "config: unknown key reported once" '[ "$(grep -c "bogus_key" "$T/err")" = 1 ]'
echo '{"zero_optimization":{"stage":"three"}}' > "$T/bad1.json"
$Z generate --model "$M" --prompt hi --config "$T/bad1.json" >/dev/null 2>"$T/err"; rc=$?
check "config: wrong type names the key" '[ $rc = 1 ] && grep -q "zero_optimization.stage" "$T/err"'
echo '{"zero_optimization":{"stage":3,"stage3_max_live_parameters":100}}' > "$T/bad2.json"
$Z generate --model "$M" --prompt hi --config "$T/bad2.json" --ranks 2 >/dev/null 2>"$T/err"; rc=$?
check "config: live budget below one layer names the key" '[ $rc = 1 ] && grep -q "stage3_max_live_parameters" "$T/err"'
echo '{"zero_optimization": ' > "$T/bad3.json"
$Z generate --model "$M" --prompt hi --config "$T/bad3.json" >/dev/null 2>"$T/err"; rc=$?
check "config: not JSON" '[ $rc = 1 ] && grep -q "bad3.json" "$T/err"'

$Z generate --model "$M" --prompt hi --max-tokens x >/dev/null 2>"$T/err"; rc=$?
check "bad number names the flag" '[ $rc = 1 ] && grep -q -- "--max-tokens" "$T/err"'
$Z generate --model "$M" --prompt hi --bogus >/dev/null 2>"$T/err"; rc=$?
check "unknown flag" '[ $rc = 1 ] && grep -q -- "--bogus" "$T/err"'
$Z generate --model "$T/none" --prompt hi >/dev/null 2>"$T/err"; rc=$?
check "missing model directory named" '[ $rc = 1 ] && grep -q "$T/none" "$T/err"'
$Z generate --model "$M" --prompt hi --offload nvme >/dev/null 2>"$T/err"; rc=$?
check "nvme without a path" '[ $rc = 1 ] && grep -q "nvme-path" "$T/err"'
$Z generate --model "$M" --prompt hi --max-tokens 600 >/dev/null 2>"$T/err"; rc=$?
check "prompt + max tokens over the context" '[ $rc = 1 ] && grep -q "context" "$T/err"'

zs_done
