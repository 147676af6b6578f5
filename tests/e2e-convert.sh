#!/bin/sh
# End-to-end checks of `zeroserve convert` (Hugging Face directory -> GGUF):
#   - stories260K at f32: `generate --model out.gguf` prints the directory's greedy text with the
#     same logits bit for bit (Q/K rows permuted on the way out, back on the way in); at q8_0 and
#     q4_k_m the same text and logits as the directory quantized at load (--weight-dtype), i.e.
#     the same per-tensor choices and bytes; gpt2-bytes (GPT-2: fused attn_qkv) at f32 and q8_0;
#   - the newer families (random checkpoints from init-model): qwen3, gemma2, gemma3, phi3 and llama with
#     Llama 3 RoPE convert to llama.cpp's architectures (and tensors: rope_freqs, Phi-3's fused attn_qkv),
#     and `generate` on the file prints the directory's greedy text with the same logits; what llama.cpp
#     cannot represent is refused, naming it (dynamic NTK, LongRoPE outside phi3, YaRN beta_fast,
#     Gemma 3's local RoPE base and final softcapping, Gemma 2 untied or without softcapping, Gemma's
#     query_pre_attn_scalar and sliding-layer pattern, Qwen3 attention biases); Mistral's sliding
#     window converts with a warning (llama.cpp's llama architecture has none);
#   - bad input: a missing model directory, an output path that cannot be created, an unknown
#     --dtype, --out naming a directory, a GGUF file as --model, and a write that fails (a file
#     size limit) exit 1 with an error naming the problem, and leave no file behind (an older file
#     at --out stays as it was).
# The byte-level comparison with llama.cpp's own files and runtime is tests/test-gguf-write.c and
# tests/ref/check_convert.py.
# shellcheck source=tests/lib/e2e.sh
. "$(dirname "$0")/lib/e2e.sh"
zs_need_bin
zs_tmpdir convert

S=$SHARED/models/stories260K
G=$SHARED/models/gpt2-bytes
gen() { # model, prompt, logits file, extra flags...
  m=$1; p=$2; l=$3; shift 3
  $Z generate --model "$m" --prompt "$p" --max-tokens 32 --temperature 0 --logits-out "$l" "$@" 2>>"$T/gen.err"
}

# ---- stories260K
$Z convert --model "$S" --out "$T/s32.gguf" --dtype f32 >"$T/out" 2>"$T/err"; rc=$?
check "convert f32: exit 0, summary line" '[ $rc = 0 ] && grep -q "wrote $T/s32.gguf: GGUF v3, llama" "$T/out"'
want=$(gen "$S" "Once upon a time" "$T/l0")
got=$(gen "$T/s32.gguf" "Once upon a time" "$T/l1")
check "f32: same greedy text as the directory" '[ -n "$want" ] && [ "$got" = "$want" ]'
check "f32: same logits bit for bit" 'cmp -s "$T/l0" "$T/l1"'
for d in q8_0 q4_k_m; do
  $Z convert --model "$S" --out "$T/s$d.gguf" --dtype $d >/dev/null 2>"$T/err-$d"; rc=$?
  w=$(gen "$S" "Once upon a time" "$T/l2" --weight-dtype $d)
  g=$(gen "$T/s$d.gguf" "Once upon a time" "$T/l3")
  check "$d: converts, same text as --weight-dtype $d on the directory" '[ $rc = 0 ] && [ -n "$w" ] && [ "$g" = "$w" ]'
  check "$d: same logits bit for bit" 'cmp -s "$T/l2" "$T/l3"'
done
check "q8_0: rows of 172 fall back to F16 and say so" '[ $(grep -c "ffn_down.weight: rows are not a multiple of 32: F16" "$T/err-q8_0") = 5 ]'
check "the output of f32 is smaller than 1.1 MB and larger than 1 MB" '[ $(wc -c <"$T/s32.gguf") -gt 1000000 ] && [ $(wc -c <"$T/s32.gguf") -lt 1100000 ]'

# ---- gpt2-bytes
for d in f32 q8_0; do
  $Z convert --model "$G" --out "$T/g$d.gguf" --dtype $d >/dev/null 2>"$T/err"; rc=$?
  wd=""; [ $d = q8_0 ] && wd="--weight-dtype q8_0"
  w=$(gen "$G" "ROMEO:" "$T/l4" $wd)
  # the file keeps position_embd in F32 (as llama.cpp's converter does) and "as stored" keeps it so;
  # the directory's --weight-dtype q8_0 quantizes every matrix: ask the file for the same
  g=$(gen "$T/g$d.gguf" "ROMEO:" "$T/l5" $wd)
  check "gpt2 $d: converts, same text and logits as the directory" '[ $rc = 0 ] && [ -n "$w" ] && [ "$g" = "$w" ] && cmp -s "$T/l4" "$T/l5"'
done
g=$(gen "$T/gq8_0.gguf" "ROMEO:" "$T/l6")
check "gpt2 q8_0 as stored (position_embd F32): generates" '[ -n "$g" ]' 

# ---- the newer families
init() { n=$1; shift; $Z init-model "$@" --random-norms --out "$T/$n" >/dev/null 2>>"$T/init.err"; }
init fq3 --arch qwen3
init fg2 --arch gemma2 --sliding-window 16
init fg3 --arch gemma3 --sliding-window 16 --rope-scaling '{"rope_type":"linear","factor":8}'
init fp3 --arch phi3 --sliding-window 24
init fl3 --arch llama --rope-scaling '{"rope_type":"llama3","factor":8,"low_freq_factor":1,"high_freq_factor":4,"original_max_position_embeddings":16}'
for m in fq3:qwen3 fg2:gemma2 fg3:gemma3 fp3:phi3 fl3:llama; do
  n=${m%%:*}; a=${m#*:}
  $Z convert --model "$T/$n" --out "$T/$n.gguf" --dtype f32 >"$T/out" 2>"$T/err"; rc=$?
  w=$(gen "$T/$n" "the quick brown fox jumps over the lazy dog" "$T/l6")
  g=$(gen "$T/$n.gguf" "the quick brown fox jumps over the lazy dog" "$T/l7")
  check "$n: converts as '$a', same greedy text as the directory" '[ $rc = 0 ] && grep -q "GGUF v3, $a," "$T/out" && [ -n "$w" ] && [ "$g" = "$w" ]'
  # Llama 3's RoPE comes back as per-frequency factors (the same angles up to rounding)
  [ $n = fl3 ] || check "$n: same logits bit for bit" 'cmp -s "$T/l6" "$T/l7"'
done
check "llama3: a rope_freqs tensor" 'grep -q "rope_freqs.weight" "$T/fl3.gguf"'
check "phi3: fused attn_qkv, no ffn_gate" 'grep -q "blk.0.attn_qkv.weight" "$T/fp3.gguf" && ! grep -q "ffn_gate" "$T/fp3.gguf"'
refuse() { # directory, text of the message
  rd=$1; rmsg=$2
  $Z convert --model "$T/$rd" --out "$T/$rd.gguf" --dtype f32 >/dev/null 2>"$T/err"; rc=$?
  check "$rd: refused: $rmsg" '[ $rc = 1 ] && grep -qF "$rmsg" "$T/err" && [ ! -e "$T/$rd.gguf" ]'
}
F16='[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]'
init rdyn --arch llama --rope-scaling '{"rope_type":"dynamic","factor":2}'
refuse rdyn "llama.cpp has no dynamic NTK"
init rlr --arch llama --rope-scaling "{\"rope_type\":\"longrope\",\"factor\":4,\"short_factor\":$F16,\"long_factor\":$F16}"
refuse rlr "LongRoPE factors only for the phi3 architecture"
init rbeta --arch qwen2 --rope-scaling '{"rope_type":"yarn","factor":4,"beta_fast":16}'
refuse rbeta "beta_fast 16 / beta_slow 1: llama.cpp reads no such key"
init rg3l --arch gemma3 --set '{"rope_local_base_freq": 5000}'
refuse rg3l "rope_local_base_freq is 5000: llama.cpp's 'gemma3' hard-codes 10000"
init rg3c --arch gemma3 --set '{"final_logit_softcapping": 30}'
refuse rg3c "Gemma 3 with final logit softcapping"
init rg3p --arch gemma3 --set '{"layer_types": ["sliding_attention","full_attention","sliding_attention","sliding_attention","sliding_attention","full_attention"]}'
refuse rg3p "layer 1 is full: llama.cpp's 'gemma3' hard-codes every sixth layer"
init rg2u --arch gemma2 --untied
refuse rg2u "Gemma 2 with a separate lm_head"
init rg2c --arch gemma2 --set '{"attn_logit_softcapping": null}'
refuse rg2c "Gemma 2 without attention logit softcapping"
init rg2q --arch gemma2 --set '{"query_pre_attn_scalar": 224}'
refuse rg2q "query_pre_attn_scalar is 224; llama.cpp's 'gemma2' hard-codes 256"
init rq3b --arch qwen3 --set '{"attention_bias": true}'
refuse rq3b "attention biases"
init wmis --arch mistral --sliding-window 64
ZS_LOG=warn $Z convert --model "$T/wmis" --out "$T/wmis.gguf" --dtype f32 >/dev/null 2>"$T/err"; rc=$?
check "mistral with a window of 64: converts, warns that llama.cpp has none" '[ $rc = 0 ] && grep -q "has no sliding window" "$T/err"'

# ---- bad input: exit 1, a message naming the problem, no file left
$Z convert --model "$T/no-such-model" --out "$T/a.gguf" --dtype f32 >/dev/null 2>"$T/err"; rc=$?
check "missing model directory: exit 1, named" '[ $rc = 1 ] && grep -q "no-such-model: no such model directory" "$T/err" && [ ! -e "$T/a.gguf" ]'
$Z convert --model "$S" --out "$T/nodir/a.gguf" --dtype f32 >/dev/null 2>"$T/err"; rc=$?
check "output directory missing: exit 1, path named" '[ $rc = 1 ] && grep -q "nodir/a.gguf: cannot create" "$T/err" && [ ! -e "$T/nodir" ]'
$Z convert --model "$S" --out /proc/zs-convert-test.gguf --dtype f32 >/dev/null 2>"$T/err"; rc=$?
check "unwritable output: exit 1, path named" '[ $rc = 1 ] && grep -q "/proc/zs-convert-test.gguf" "$T/err"'
$Z convert --model "$S" --out "$T/b.gguf" --dtype q3_k >/dev/null 2>"$T/err"; rc=$?
check "unknown --dtype: exit 1, lists the types, no file" '[ $rc = 1 ] && grep -q "q3_k" "$T/err" && grep -q "q4_k_m" "$T/err" && [ ! -e "$T/b.gguf" ] && [ ! -e "$T/b.gguf.tmp" ]'
$Z convert --model "$S" --out "$T" --dtype f32 >/dev/null 2>"$T/err"; rc=$?
check "--out is a directory: exit 1" '[ $rc = 1 ] && grep -q "is a directory" "$T/err"'
$Z convert --model "$S/stories260K.gguf" --out "$T/c.gguf" >/dev/null 2>"$T/err"; rc=$?
check "a GGUF file as --model: exit 1, not a directory" '[ $rc = 1 ] && grep -q "not a directory" "$T/err" && [ ! -e "$T/c.gguf" ]'
$Z convert --out "$T/c.gguf" >/dev/null 2>"$T/err"; rc=$?
check "no --model: exit 1" '[ $rc = 1 ] && grep -q "\-\-model and \-\-out are required" "$T/err"'
printf 'old' >"$T/full.gguf"
(ulimit -f 200; exec $Z convert --model "$S" --out "$T/full.gguf" --dtype f32) >/dev/null 2>"$T/err"; rc=$?
check "a failed write (file size limit): exit 1, path named, older file kept, no temporary" \
  '[ $rc = 1 ] && grep -q "full.gguf: cannot write" "$T/err" && [ "$(cat "$T/full.gguf")" = old ] && [ ! -e "$T/full.gguf.tmp" ]'
check "no temporary files anywhere" '[ -z "$(ls "$T" | grep "\.tmp$")" ]'

zs_done
