#!/bin/sh
# End-to-end checks of `zeroserve convert` (Hugging Face directory -> GGUF):
#   - stories260K at f32: `generate --model out.gguf` prints the directory's greedy text with the
#     same logits bit for bit (Q/K rows permuted on the way out, back on the way in); at q8_0 and
#     q4_k_m the same text and logits as the directory quantized at load (--weight-dtype), i.e.
#     the same per-tensor choices and bytes; gpt2-bytes (GPT-2: fused attn_qkv) at f32 and q8_0;
#   - bad input: a missing model directory, an output path that cannot be created, an unknown
#     --dtype, --out naming a directory, a GGUF file as --model, and a write that fails (a file
#     size limit) exit 1 with an error naming the problem, and leave no file behind (an older file
#     at --out stays as it was).
# The byte-level comparison with llama.cpp's own files and runtime is tests/test-gguf-write.c and
# tests/ref/check_convert.py.
SHARED=${ZS_SHARED:-../shared}
Z=./zeroserve
[ -x "$Z" ] || { echo "no ./zeroserve"; exit 1; }
T=$(mktemp -d /tmp/zs-convert-XXXXXX)
trap 'rm -rf "$T"' EXIT INT TERM
pass=0; fail=0
ok() { pass=$((pass+1)); echo "ok - $1"; }
bad() { fail=$((fail+1)); echo "not ok - $1"; }
check() { if eval "$2"; then ok "$1"; else bad "$1"; fi; }

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
  g=$(gen "$T/g$d.gguf" "ROMEO:" "$T/l5")
  check "gpt2 $d: converts, same text and logits as the directory" '[ $rc = 0 ] && [ -n "$w" ] && [ "$g" = "$w" ] && cmp -s "$T/l4" "$T/l5"'
done

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

echo "$pass passed, $fail failed"
[ $fail = 0 ]
