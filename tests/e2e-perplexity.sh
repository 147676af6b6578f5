#!/bin/sh
# End-to-end checks of `zeroserve perplexity` (llama.cpp's llama-perplexity method) against
# independent references in tests/ref/ppl-ref.tsv (tests/ref/make_ppl_ref.py): transformers'
# LlamaForCausalLM / GPT2LMHeadModel on stories260K and gpt2-bytes (with and without BOS), and
# llama.cpp itself (llama-cpp-python) on stories260K.gguf. For every case the token count, the
# window count and the scored-token count must be equal and the mean NLL agree within
# |a-b| <= 1e-5 * |b| (float32 forwards on both sides; measured differences are about 1e-7).
# Also: the GGUF file gives the directory's NLL bit for bit, 2 ranks give 1 rank's, bf16/q8_0/q4_0
# weights change it a little, and bad input (missing or empty text, too few tokens, a window
# larger than the model's context or than the text, a stride not smaller than the window) is a
# clear error with exit status 1.
# shellcheck source=tests/lib/e2e.sh
. "$(dirname "$0")/lib/e2e.sh"
zs_need_bin
REF=tests/ref/ppl-ref.tsv
[ -f "$REF" ] || { echo "no $REF"; exit 1; }
zs_tmpdir ppl
# field NAME of the one-line JSON object in file $1
jget() { sed -n "s/.*\"$2\":\([^,}]*\).*/\1/p" "$1"; }
# |a-b| <= rtol*|b|
close() { awk -v a="$1" -v b="$2" -v r="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; m = b < 0 ? -b : b; exit !(a != "" && d <= r * m) }'; }

tab=$(printf '\t')
while IFS="$tab" read -r name backend model text ntok nwin nscored nll args; do
    case $name in '#'*|'') continue;; esac
    # shellcheck disable=SC2086
    $Z perplexity --model "$SHARED/$model" --text "tests/ref/$text" $args --json >"$T/$name.json" 2>"$T/$name.err"
    rc=$?
    got=$(jget "$T/$name.json" mean_nll)
    check "$name ($backend, $model $args): exit 0" '[ $rc = 0 ]'
    check "$name: $ntok tokens, $nwin windows, $nscored scored tokens" \
        '[ "$(jget "$T/$name.json" tokens_in_text)" = "$ntok" ] && [ "$(jget "$T/$name.json" windows)" = "$nwin" ] && [ "$(jget "$T/$name.json" scored)" = "$nscored" ]'
    check "$name: mean NLL $got vs $backend $nll (rtol 1e-5)" 'close "$got" "$nll" 1e-5'
done <"$REF"

M=$SHARED/models/stories260K
S=tests/ref/ppl-story.txt
out=$($Z perplexity --model "$M" --text "$S" --context 64 2>&1)
check "the human line names the perplexity, the scored tokens and the method" \
    'echo "$out" | grep -q "^perplexity [0-9.]* +/- [0-9.]*, mean NLL [0-9.]* nats over 124 scored tokens: 4 windows of 64 tokens, the second half of each scored, BOS at each window start (llama.cpp llama-perplexity method)"'
$Z perplexity --help 2>"$T/help"
check "--help says it is llama.cpp's method (second half of each window, BOS)" \
    'grep -q "llama.cpp" "$T/help" && grep -q "second half" "$T/help" && grep -q "BOS" "$T/help" && grep -q -- "--stride" "$T/help"'
$Z perplexity --model "$M" --text "$S" --context 64 --json >"$T/dir.json" 2>/dev/null
$Z perplexity --model "$M/stories260K.gguf" --text "$S" --context 64 --json >"$T/gguf.json" 2>/dev/null
base=$(jget "$T/dir.json" mean_nll)
check "GGUF file and directory: the same mean NLL bit for bit ($base)" '[ -n "$base" ] && [ "$(jget "$T/gguf.json" mean_nll)" = "$base" ]'
$Z perplexity --model "$M" --text "$S" --context 64 --ranks 2 --json >"$T/r2.json" 2>/dev/null
check "--ranks 2: the same mean NLL bit for bit" '[ "$(jget "$T/r2.json" mean_nll)" = "$base" ]'
if command -v mpirun >/dev/null; then
    zs_mpi_env
    timeout 300 mpirun -np 2 $Z perplexity --model "$M" --text "$S" --context 64 --json >"$T/mpi.json" 2>"$T/mpi.err"
    check "mpirun -np 2 (process 0 drives, the other follows): the same mean NLL bit for bit" \
        '[ "$(jget "$T/mpi.json" mean_nll)" = "$base" ] || { tail -3 "$T/mpi.err"; false; }'
fi
for d in bf16 q8_0 q4_0; do
    $Z perplexity --model "$M" --text "$S" --context 64 --weight-dtype $d --json >"$T/$d.json" 2>"$T/$d.err"
    v=$(jget "$T/$d.json" mean_nll)
    check "--weight-dtype $d: mean NLL $v differs from f32's and is within 10% of it" \
        '[ -n "$v" ] && [ "$v" != "$base" ] && close "$v" "$base" 0.1 && grep -q "\"weight_dtype\":\"$d\"" "$T/$d.json"'
done

# bad input: exit 1 and a message that names the problem
err() { # description, expected message (grep -E), flags...
    d=$1; want=$2; shift 2
    $Z perplexity "$@" >"$T/out" 2>"$T/err"; rc=$?
    check "$d: exit 1, '$want'" '[ $rc = 1 ] && grep -Eq -e "$want" "$T/err" && [ ! -s "$T/out" ]'
}
: >"$T/empty.txt"
printf 'a' >"$T/one.txt"
err "missing text file" "nothere.txt: cannot open" --model "$M" --text "$T/nothere.txt"
err "no --text" "--text is required" --model "$M"
err "empty text" "empty.txt is empty" --model "$M" --text "$T/empty.txt"
err "a 1-token text (no BOS)" "1 token to use; perplexity needs at least 2" --model "$SHARED/models/gpt2-bytes" --text "$T/one.txt"
err "BOS + 1 token: nothing to score" "a window of 2 tokens scores nothing" --model "$M" --text "$T/one.txt"
err "--context larger than the model's" "--context 1024 is larger than the model's context \(512" --model "$M" --text "$S" --context 1024
err "--context larger than the text" "308 tokens, fewer than one window of --context 400" --model "$M" --text "$S" --context 400
err "--stride not smaller than the window" "--stride 64 must be smaller than the window" --model "$M" --text "$S" --context 64 --stride 64
err "a negative --max-tokens" "--max-tokens must be >= 0" --model "$M" --text "$S" --max-tokens -1
err "a directory as text" "read failed" --model "$M" --text "$T"
zs_done
