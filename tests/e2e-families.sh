#!/bin/sh
# e2e-families.sh — every model family end to end through `zeroserve generate`: for each case of
# tests/ref/family-ref.json (Llama + llama3 / linear / dynamic RoPE, Qwen2 + YaRN, Qwen3, Gemma 2,
# Gemma 3, Phi-3 + LongRoPE, Mistral; the models tests/test-families.c checks against
# transformers) it writes the model with `zeroserve init-model <the case's args>` and generates
# 140 tokens greedily (--temperature 0 --ignore-eos: past the sliding windows and the RoPE
# scalings' original lengths) with the default resident CPU engine, with --ranks 2 (parameters
# sharded over 2 rank threads), with --offload nvme (shard files) and with --ranks 2 --offload
# nvme. The text and the token ids must be identical in every mode. Exits 0 when all are.
# shellcheck source=tests/lib/e2e.sh
. "$(dirname "$0")/lib/e2e.sh"
REF=tests/ref/family-ref.json
zs_need_bin
zs_need --fail jq
[ -f "$REF" ] || { echo "not ok - no $REF"; exit 1; }
export ZS_LOG=${ZS_LOG:-warn} ZS_DEVICE=${ZS_DEVICE:-cpu}
zs_tmpdir e2e-fam
PROMPT="Once upon a time, in a small town by the sea"

# gen NAME MODE-ARGS...: text to $T/NAME.out, ids (--print-ids, stderr) to $T/NAME.ids
gen() {
    name=$1; shift
    timeout 300 $Z generate --model "$T/$case" --prompt "$PROMPT" --max-tokens 140 --temperature 0 --ignore-eos \
        --print-ids "$@" >"$T/$name.out" 2>"$T/$name.err"
    rc=$?
    grep -E '^[0-9]+( [0-9]+)*$' "$T/$name.err" >"$T/$name.ids"
    return $rc
}

n=$(jq '.cases | length' "$REF")
i=0
while [ "$i" -lt "$n" ]; do
    case=$(jq -r ".cases[$i].name" "$REF")
    set --
    while IFS= read -r a; do set -- "$@" "$a"; done <<EOF
$(jq -r ".cases[$i].init_args[]" "$REF")
EOF
    i=$((i+1))
    if ! $Z init-model "$@" --out "$T/$case" >"$T/$case.init" 2>&1; then
        check "$case: init-model $*" false
        tail -3 "$T/$case.init"
        continue
    fi
    gen "$case-plain"
    check "$case: generate (resident CPU) exits 0 with 140 ids" \
        '[ $rc = 0 ] && [ "$(wc -w <"$T/$case-plain.ids")" = 140 ] || { tail -3 "$T/$case-plain.err"; false; }'
    mkdir -p "$T/$case-nv1" "$T/$case-nv2"
    for mode in "ranks2:--ranks 2" "nvme:--offload nvme --nvme-path $T/$case-nv1" \
                "ranks2-nvme:--ranks 2 --offload nvme --nvme-path $T/$case-nv2"; do
        tag=${mode%%:*}
        # shellcheck disable=SC2086 # the mode's flags split on spaces (the paths have none)
        gen "$case-$tag" ${mode#*:}
        check "$case: generate ${mode#*:} gives the same text and ids" \
            '[ $rc = 0 ] && cmp -s "$T/$case-plain.out" "$T/$case-$tag.out" && [ -s "$T/$case-$tag.ids" ] && cmp -s "$T/$case-plain.ids" "$T/$case-$tag.ids" || { tail -3 "$T/$case-$tag.err"; false; }'
    done
done
check "the reference lists the 9 family cases" '[ "$n" -ge 9 ]'
zs_done
