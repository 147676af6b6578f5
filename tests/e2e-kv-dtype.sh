#!/bin/sh
# e2e-kv-dtype.sh — the 16-bit KV cache end to end (--kv-dtype f16 | bf16, on the CPU): greedy
# generation on stories260K keeps the reference text of reference.json (the PyTorch f32 forward)
# with the cache in f16 and in bf16, and the logits of every sampled position stay close to the
# f32 cache's: max |logit(16-bit) - logit(f32)| <= 0.05 for f16 and <= 0.3 for bf16 over 64
# positions x 512 logits of magnitude up to ~22 (measured: 0.019 and 0.13; one rounding of a
# K/V value is 2^-11 relative in f16, 2^-8 in bf16). The 16-bit logits are bitwise the same with
# 2 ranks and with 1 thread; bench and serve take the flag; a bad value is refused by name.
# shellcheck source=tests/lib/e2e.sh
. "$(dirname "$0")/lib/e2e.sh"
zs_need_bin
zs_tmpdir kvdt
export ZS_DEVICE=${ZS_DEVICE:-cpu}

M=$SHARED/models/stories260K
# the first case's new_text (JSON escapes \n and \' are the only ones in it)
want=$(printf '%b' "$(sed -n 's/.*"new_text": "\([^"]*\)".*/\1/p' "$M/reference.json" | grep -v '^text minus' | head -1)")
gen() { # kv dtype, logits file, extra flags...
    d=$1; l=$2; shift 2
    $Z generate --model "$M" --prompt "Once upon a time" --max-tokens 64 --temperature 0 --kv-dtype "$d" \
        --logits-out "$l" "$@" 2>"$T/err-$d"
}
# max |a - b| over two files of f32 values of the same size, or "size" when they differ
maxdiff() {
    [ "$(stat -c %s "$1")" = "$(stat -c %s "$2")" ] && [ "$(stat -c %s "$1")" -gt 0 ] || { echo size; return; }
    od -An -v -f -w4 "$1" > "$T/a.txt"
    od -An -v -f -w4 "$2" > "$T/b.txt"
    paste "$T/a.txt" "$T/b.txt" | awk '{ x = $1 - $2; if (x < 0) x = -x; if (x > m) m = x } END { printf "%.6g\n", m + 0 }'
}
within() { [ "$1" != size ] && awk -v a="$1" -v b="$2" 'BEGIN { exit !(a <= b) }'; }

out32=$(gen f32 "$T/f32.bin")
check "f32 cache: greedy text equals the reference" '[ "$out32" = "Once upon a time$want" ]'
for d in f16 bf16; do
    out=$(gen $d "$T/$d.bin")
    check "$d cache: greedy text equals the reference" '[ "$out" = "Once upon a time$want" ]'
    tol=0.05; [ $d = bf16 ] && tol=0.3
    m=$(maxdiff "$T/f32.bin" "$T/$d.bin")
    check "$d cache: logits within $tol of the f32 cache's (max |diff| $m over $(( $(stat -c %s "$T/$d.bin") / 4 )) logits)" \
        'within "$m" $tol'
    check "$d cache: not the f32 cache's bits (the rounding happens)" '! cmp -s "$T/f32.bin" "$T/$d.bin"'
done
gen f16 "$T/f16-r2.bin" --ranks 2 >/dev/null
check "f16 cache, --ranks 2: logits bitwise equal to 1 rank" 'cmp -s "$T/f16.bin" "$T/f16-r2.bin"'
ZS_THREADS=1 gen f16 "$T/f16-t1.bin" >/dev/null
check "f16 cache, 1 thread: logits bitwise equal" 'cmp -s "$T/f16.bin" "$T/f16-t1.bin"'
ZS_LOG=info gen bf16 "$T/bf16-log.bin" >/dev/null
check "the KV cache reports its element type and size" 'grep -q "KV cache: .* MiB of BF16" "$T/err-bf16"'

$Z init-model --arch llama --layers 2 --dim 64 --heads 4 --kv-heads 2 --ffn 96 --vocab 300 --context 128 --seed 3 --out "$T/l" >/dev/null
check "bench --kv-dtype f16 runs" '$Z bench --model "$T/l" --runs 1 --prefill 8 --decode 4 --kv-dtype f16 --json "$T/b.json" >/dev/null 2>&1 && grep -q decode_tok_s "$T/b.json"'
check "serve lists --kv-dtype" '$Z serve --help 2>&1 | grep -q -- "--kv-dtype"'
$Z generate --model "$M" --prompt hi --kv-dtype q8_0 >/dev/null 2>"$T/err"; rc=$?
check "--kv-dtype q8_0 is refused by name" '[ $rc = 1 ] && grep -q -- "--kv-dtype: .q8_0. is not one of f32, f16, bf16" "$T/err"'
echo '{"text":"Once upon a time"}' >"$T/d.jsonl"
$Z train --model "$M" --data "$T/d.jsonl" --out "$T/tr" --steps 1 --kv-dtype f16 >/dev/null 2>"$T/err"; rc=$?
check "train refuses --kv-dtype f16 (no KV cache in training)" '[ $rc = 1 ] && grep -q "training uses no KV cache" "$T/err" && [ ! -e "$T/tr" ]'

zs_done
