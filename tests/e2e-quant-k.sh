#!/bin/sh
# End-to-end check of the K-quants made at load through the command line: a random Llama whose
# rows are whole super-blocks (2 layers, dim 256, ffn 512; built here, a second) runs
# `generate --weight-dtype q4_k_m` (and q4_k, q6_k, q5_k, q3_k, q2_k), and the logits of the first generated
# position (the same prompt for all) are close to f32's; a bad --weight-dtype names q4_k_m among
# the accepted ones.
# shellcheck source=tests/lib/e2e.sh
. "$(dirname "$0")/lib/e2e.sh"
zs_need_bin
zs_tmpdir quant-k

M=$T/mk
$Z init-model --arch llama --layers 2 --dim 256 --heads 4 --kv-heads 2 --ffn 512 --vocab 512 --context 128 \
   --dtype f32 --seed 3 --out "$M" >/dev/null 2>"$T/err"
check "init-model: a 2-layer dim-256 Llama" '[ -f "$M/config.json" ]'

gen() { # dtype -> $T/lg-dtype.bin, $T/out-dtype.txt; returns generate's exit status
  ZS_LOG=warn $Z generate --model "$M" --weight-dtype "$1" --device cpu --prompt "Once upon a time" \
     --max-tokens 4 --temperature 0 --logits-out "$T/lg-$1.bin" >"$T/out-$1.txt" 2>"$T/err-$1"
}
gen f32; rc=$?
check "generate --weight-dtype f32: exit 0" '[ $rc = 0 ] && [ -s "$T/lg-f32.bin" ]'
# the first 512 logits (the first sampled position: the same context for every dtype):
# rms(q - f32) / rms(f32) and max |q - f32|
cmp_logits() {
  od -An -v -f -N 2048 "$T/lg-f32.bin" | tr -s ' ' '\n' | grep -v '^$' >"$T/a.txt"
  od -An -v -f -N 2048 "$T/lg-$1.bin" | tr -s ' ' '\n' | grep -v '^$' >"$T/b.txt"
  paste "$T/a.txt" "$T/b.txt" | awk '{d=$2-$1; e+=d*d; r+=$1*$1; if (d<0) d=-d; if (d>m) m=d; n++}
    END {if (n != 512 || r == 0) print "bad", n; else printf "%.4f %.4f\n", sqrt(e/r), m}'
}
for q in q4_k_m:0.25 q4_k:0.3 q6_k:0.08 q5_k:0.15 q3_k:0.6 q2_k:0.85; do
  dt=${q%%:*}; tol=${q#*:}
  gen "$dt"; rc=$?
  check "generate --weight-dtype $dt: exit 0, text out" '[ $rc = 0 ] && [ -s "$T/out-$dt.txt" ] && [ -s "$T/lg-$dt.bin" ]'
  res=$(cmp_logits "$dt")
  echo "# $dt: first-position logits vs f32: rms error / rms, max |diff| = $res"
  check "$dt: logits close to f32's (rms error / rms < $tol)" \
    'echo "$res" | awk -v t="$tol" "{exit !(\$1 != \"bad\" && \$1 < t)}"'
done
ZS_LOG=warn $Z generate --model "$M" --weight-dtype q4_k_x --device cpu --prompt hi --max-tokens 2 >/dev/null 2>"$T/err"; rc=$?
check "--weight-dtype q4_k_x: exit 1, the accepted names include q4_k_m" '[ $rc = 1 ] && grep -q "q4_k_m" "$T/err"'
zs_done
