#!/bin/sh
# e2e-spec-draft.sh — speculative decoding with a draft model through `zeroserve serve`
# (--draft-model, --draft-weight-dtype, --speculative draft; engine/runtime/spec-draft.c), on the
# CPU with stories260K as the target:
#   - greedy completions (texts, token logprobs, finish reasons) of a server with the draft model
#     equal a server's without speculation, byte for byte, for a set of prompts; with the same
#     model as its draft (its GGUF file beside the Hugging Face directory) every draft holds (/metrics: drafted = accepted > 0, more than one token
#     per pass); with the draft at q8_0 drafts are accepted (> 0), more than one token per pass;
#   - streamed answers equal the plain server's too;
#   - refused at start, with the message: a draft with another vocabulary (gpt2-bytes: 256 tokens
#     against 512), a draft model that does not exist (the load error after "--draft-model PATH:"),
#     --speculative ngram with --draft-model, --speculative draft without one,
#     --draft-weight-dtype without a draft model, and a bad --draft-weight-dtype.
# shellcheck source=tests/lib/e2e.sh
. "$(dirname "$0")/lib/e2e.sh"
zs_setup specdraft curl
zs_model stories260K
export ZS_DEVICE=${ZS_DEVICE:-cpu}
G=$SHARED/models/gpt2-bytes

# metric NAME: its value in $T/metrics (absent: "absent")
metric() { awk -v n="$1" '$1 == n { print $2; f = 1 } END { if (!f) print "absent" }' "$T/metrics"; }

PROMPTS="Once upon a time|Tom had a red ball. He liked to kick the ball. One day, the ball|The sun was hot. The cat sat on the mat and|Lily and Tom went to the park. Lily and Tom went to the park. Lily and|Once upon a time, there was a little girl named Lily"
# answers TAG: every prompt's greedy completion (with logprobs) and a streamed one into $T/TAG.*
answers() {
    local i=0 p
    printf '%s\n' "$PROMPTS" | tr '|' '\n' > "$T/prompts"
    while IFS= read -r p; do
        i=$((i + 1))
        zs_post /v1/completions "{\"prompt\": \"$p\", \"max_tokens\": $((20 + i * 7)), \"temperature\": 0, \"logprobs\": 2}" |
            sed 's/"id": *"[^"]*"//; s/"created": *[0-9]*//; s/"usage".*//' > "$T/$1.$i"
        zs_post /v1/completions "{\"prompt\": \"$p\", \"max_tokens\": 24, \"temperature\": 0, \"stream\": true}" |
            grep '^data:' | sed 's/"id": *"[^"]*"//; s/"created": *[0-9]*//' > "$T/$1.s$i"
    done < "$T/prompts"
}
same_answers() { # TAG: every answer equals the plain server's
    local i
    for i in 1 2 3 4 5; do
        grep -q '"text"' "$T/plain.$i" && cmp -s "$T/plain.$i" "$T/$1.$i" && cmp -s "$T/plain.s$i" "$T/$1.s$i" || return 1
    done
}

zs_start_server "$T/plain.log" --model "$MODEL" --max-seqs 4 || zs_abort "the plain server starts"
answers plain
zs_stop_server

# the same weights as the GGUF file llama.cpp converted (the draft's vocabulary read from GGUF)
zs_start_server "$T/draft.log" --model "$MODEL" --max-seqs 4 --draft-model "$MODEL/stories260K.gguf" --spec-tokens 4 ||
    zs_abort "a server with --draft-model (a GGUF file) starts"
answers draft
curl -s --max-time 10 "$ZS_URL/metrics" -o "$T/metrics"
zs_stop_server
check "--draft-model (the same model, as GGUF): greedy completions, logprobs and streams equal the plain server's" 'same_answers draft'
d=$(metric zeroserve_spec_draft_tokens_total); a=$(metric zeroserve_spec_accepted_tokens_total)
p=$(metric zeroserve_passes_total); t=$(metric zeroserve_pass_tokens_total)
check "the same model as draft: /metrics shows drafts, all accepted ($a of $d)" '[ "$d" != absent ] && [ "$d" -gt 0 ] && [ "$a" = "$d" ]'
check "more than one token per pass ($t tokens in $p passes)" '[ "$p" != absent ] && [ "$t" -gt "$p" ]'
echo "# same model: $a of $d drafts accepted, $t tokens in $p passes"

zs_start_server "$T/q8.log" --model "$MODEL" --max-seqs 4 --speculative draft --draft-model "$MODEL" \
    --draft-weight-dtype q8_0 --spec-tokens 3 || zs_abort "a server with --speculative draft --draft-weight-dtype q8_0 starts"
answers q8
curl -s --max-time 10 "$ZS_URL/metrics" -o "$T/metrics"
zs_stop_server
check "--draft-weight-dtype q8_0: greedy completions, logprobs and streams equal the plain server's" 'same_answers q8'
d=$(metric zeroserve_spec_draft_tokens_total); a=$(metric zeroserve_spec_accepted_tokens_total)
p=$(metric zeroserve_passes_total); t=$(metric zeroserve_pass_tokens_total)
check "the q8_0 draft: drafts accepted ($a of $d)" '[ "$d" != absent ] && [ "$a" -gt 0 ] && [ "$a" -le "$d" ]'
check "the q8_0 draft: more than one token per pass ($t tokens in $p passes)" '[ "$p" != absent ] && [ "$t" -gt "$p" ]'
echo "# q8_0 draft, 3 drafts per step: $a of $d drafts accepted, $t tokens in $p passes"

# refusals: the process exits 1 with the message, before it serves
refused() { # WHAT NEEDLE ARGS...: serve ARGS fails naming NEEDLE
    local what="$1" needle="$2"
    shift 2
    timeout 120 "$BIN" serve --host 127.0.0.1 --port 0 --model "$MODEL" "$@" >"$T/ref.log" 2>&1
    local rc=$?
    check "$what is refused (exit $rc): $needle" '[ $rc = 1 ] && grep -qF -- "$needle" "$T/ref.log"'
}
zs_need_file "$G"
refused "a draft with another vocabulary" "--draft-model $G: its vocabulary (256 tokens) is not the target $MODEL's (512 tokens)" \
    --draft-model "$G"
grep -F -- "--draft-model" "$T/ref.log" | sed 's/^/# /'
refused "a draft model that does not exist" "--draft-model $T/none: $T/none" --draft-model "$T/none"
refused "--speculative ngram with --draft-model" "--speculative ngram and --draft-model $MODEL" \
    --speculative ngram --draft-model "$MODEL"
refused "--speculative none with --draft-model" "--speculative none and --draft-model $MODEL" \
    --speculative none --draft-model "$MODEL"
refused "--speculative draft without a draft model" "--speculative draft needs --draft-model PATH" --speculative draft
refused "--draft-weight-dtype without a draft model" "--draft-weight-dtype q8_0 needs --draft-model PATH" \
    --draft-weight-dtype q8_0
refused "a bad --draft-weight-dtype" "--draft-weight-dtype: 'q9' is not one of auto" --draft-model "$MODEL" \
    --draft-weight-dtype q9
check "serve --help lists --draft-model and --draft-weight-dtype" \
    '"$BIN" serve --help 2>&1 | grep -q -- "--draft-model" && "$BIN" serve --help 2>&1 | grep -q -- "--draft-weight-dtype"'
zs_done
