#!/bin/sh
# shellcheck shell=bash
# speculative.sh — speculative decoding on weights streamed from NVMe (issue 30; not part of
# `make test`). Every case runs a server without speculation and one with it side by side, on the
# same model with the same live budget, each streaming its own copy of the shard files
# (`serve --offload nvme --max-live-bytes` far below the model's size); their requests alternate
# (plain, speculative, speculative, plain, ...), greedy, and every text must be the same on both:
#   1. ngram: SmolLM2-135M-Instruct (Q4_1 as stored, 96 MB per pass, a 40 MB live budget) with
#      prompt lookup (--speculative ngram), batch 1, on copying tasks (rewrite a paragraph with one
#      change, fix a function, rename a variable, correct a typo) and on plain chat;
#   2. draft: the same model dequantized to bf16 as the target (269 MB per pass, an 80 MB live
#      budget) and the Q4_1 file as a resident draft model (--draft-model), batch 1, the same
#      prompts; run only where `zeroserve serve --help` lists --draft-model;
#   3. batch: 8 and 32 requests at once (16 copying tasks and 16 chats), plain against speculative
#      for both pairs above (the draft pair where it exists): speculation should step back when
#      batching fills the pass.
# Per request, from the server's own figures: decode tokens/s = (completion tokens - 1) / (engine
# time - time to first token) (X-Engine-Time-Ms and the TTFT histogram of /metrics), tokens per
# pass, pass time, bytes streamed per pass (/metrics deltas) against the I/O bound: bytes per pass
# / the raw io_uring O_DIRECT read rate of the same shard files, measured in every round
# (`zeroserve bench --raw-read`). A batch's tokens/s is its completion tokens over the wall time
# of the burst. Figures are medians over the rounds (ratios: medians of the per-pair ratios).
# Exit 1 when a text differs between plain and speculative decoding, or a server fails.
#
#   sh tests/bench/speculative.sh
# Env: ZS_BIN (./zeroserve), MODEL (default: SmolLM2-135M-Instruct Q4_1 via
# server/fetch-smollm2.sh), RUNS (rounds, 3), CASES ("ngram draft batch"), BATCHES ("8 32"),
# DIR (scratch for the shard files, /tmp/zs-specbench; removed at the end), LIVE_Q4 (40000000),
# LIVE_BF16 (80000000), MAX_COPY (max_tokens of a copying task, 200), MAX_CHAT (128),
# MAX_BATCH (64), DRAFT_ARGS (the draft server's extra flags; default --draft-model MODEL, plus
# --draft-weight-dtype q4_1 where serve lists it), SPEC_ARGS (more flags for every speculative
# server, e.g. --spec-tokens 8).
# shellcheck source=tests/lib/e2e.sh
. "$(dirname "$0")/../lib/e2e.sh"
zs_bash "$@"
set -u
RUNS=${RUNS:-3}
CASES=${CASES:-ngram draft batch}
BATCHES=${BATCHES:-8 32}
DIR=${DIR:-/tmp/zs-specbench}
LIVE_Q4=${LIVE_Q4:-40000000}
LIVE_BF16=${LIVE_BF16:-80000000}
MAX_COPY=${MAX_COPY:-200}
MAX_CHAT=${MAX_CHAT:-128}
MAX_BATCH=${MAX_BATCH:-64}
SPEC_ARGS=${SPEC_ARGS:-}
if [ -z "${MODEL:-}" ]; then
    MODEL=$(sh server/fetch-smollm2.sh) || { echo "cannot fetch SmolLM2 (give MODEL=...)" >&2; exit 1; }
fi
export ZS_DEVICE=${ZS_DEVICE:-cpu} ZS_LOG=${ZS_LOG:-info}
for t in curl jq awk; do command -v "$t" >/dev/null || { echo "$t is needed" >&2; exit 1; }; done
zs_need_bin
zs_tmpdir specbench
zs_at_exit() { rm -rf "$DIR"; }
rm -rf "$DIR"
mkdir -p "$DIR" "$T/p" "$T/out"
HAVE_DRAFT=0
"$BIN" serve --help 2>&1 | grep -q -- '--draft-model' && HAVE_DRAFT=1
if [ -z "${DRAFT_ARGS:-}" ]; then
    DRAFT_ARGS="--draft-model $MODEL"
    "$BIN" serve --help 2>&1 | grep -q -- '--draft-weight-dtype' && DRAFT_ARGS="$DRAFT_ARGS --draft-weight-dtype q4_1"
fi
FAIL=0

# ---------------------------------------------------------------- the prompts
LIGHTHOUSE="The old lighthouse stood at the edge of the harbor, its white tower weathered by a hundred winters. Every evening the keeper climbed the spiral stairs, lit the great lamp, and watched the fishing boats return one by one through the narrow channel between the rocks."
BAKERY="Every morning before sunrise, the baker on Mill Street lit her ovens and shaped the dough she had left to rise overnight. By seven o'clock the shop smelled of warm bread and cinnamon, and a line of neighbors waited patiently at the door."
STATION="The small train station had only one platform and a wooden bench painted green. Twice a day the express from the city slowed down but never stopped, and the station master waved at it as it passed, as he had done for thirty years."
GARDEN="Behind the house there was a garden with three apple trees, a row of tomatoes and a little pond. In summer the children spent whole afternoons there, catching frogs, reading under the trees and eating the apples before they were ripe."
STATION_TYPO="The small train staton had only one platform and a wooden bench painted green. Twice a day the express from the city slowed down but never stopped, and the station master waved at it as it passed, as he had done for thirty years."
FIX_PY='def average(values):
    total = 0
    for v in values:
        total += v
    return total / len(value)'
RENAME_C='int sum_squares(const int *a, int n) {
    int tmp = 0;
    for (int i = 0; i < n; i++) {
        tmp += a[i] * a[i];
    }
    return tmp;
}'
# body NAME MAX_TOKENS USER_TEXT: a greedy chat request into $T/p/NAME.json
body() {
    jq -n --arg u "$3" --argjson m "$2" '{model: "m", temperature: 0, max_tokens: $m, messages: [{role: "user", content: $u}]}' \
        >"$T/p/$1.json"
}
body copy-edit "$MAX_COPY" "Rewrite the following paragraph, changing only the word \"harbor\" to \"bay\". Keep everything else identical.

$LIGHTHOUSE"
body copy-fix "$MAX_COPY" "Fix the bug in this Python function and return the whole corrected function.

\`\`\`python
$FIX_PY
\`\`\`"
body copy-typo "$MAX_COPY" "Correct the spelling mistake in the following text and return the whole corrected text.

$STATION_TYPO"
body copy-rename "$MAX_COPY" "Rename the variable tmp to result in this C function and return the whole function.

\`\`\`c
$RENAME_C
\`\`\`"
CHATS=("What are three tips for staying healthy?" "Write a short poem about the sea."
    "Explain what a CPU does, in simple terms." "How do I make a good cup of tea?"
    "What is the capital of France, and what is it known for?" "Give me a few ideas for a rainy weekend."
    "Why is the sky blue?" "Describe a cat to someone who has never seen one."
    "What should I pack for a week at the beach?" "How do plants make their food?"
    "Tell me a fun fact about octopuses." "What is the difference between weather and climate?"
    "Suggest a name for a small coffee shop." "How can I get better at remembering names?"
    "Write two sentences about autumn." "What does a librarian do?")
for i in 0 1 2 3; do body "chat-$((i + 1))" "$MAX_CHAT" "${CHATS[$i]}"; done
SOLO="copy-edit copy-fix copy-typo copy-rename chat-1 chat-2 chat-3 chat-4"
# the batch: 16 copying tasks (4 paragraphs x 4 instructions) and 16 chats, interleaved
INSTR=("Repeat the following paragraph exactly." "Rewrite the following paragraph, changing only its first word to uppercase."
    "Correct any spelling mistakes in the following paragraph and return it in full." "Copy the following paragraph and add a short title above it.")
PARAS=("$LIGHTHOUSE" "$BAKERY" "$STATION" "$GARDEN")
n=0
for i in 0 1 2 3; do
    for j in 0 1 2 3; do
        n=$((n + 1)); body "b-$n" "$MAX_BATCH" "${INSTR[$j]}

${PARAS[$(((i + j) % 4))]}"
        n=$((n + 1)); body "b-$n" "$MAX_BATCH" "${CHATS[$((i * 4 + j))]}"
    done
done

# ---------------------------------------------------------------- measuring
median() { sort -g | awk '{ a[NR] = $1 } END { if (!NR) print "nan"; else if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
# range: "min–max" of a column of numbers
range() { sort -g | awk 'NR == 1 { lo = $1 } { hi = $1 } END { if (NR) printf "%.2f–%.2f", lo, hi }'; }
# the counters of a server's /metrics this script reads, as "name value" lines
snap() {
    curl -s --max-time 30 "$1/metrics" | awk '
        /^zeroserve_time_to_first_token_seconds_sum / { print "ttft", $2 }
        /^zeroserve_passes_total / { print "passes", $2 }
        /^zeroserve_pass_tokens_total / { print "ptok", $2 }
        /^zeroserve_engine_steps_total / { print "steps", $2 }
        /^zeroserve_bytes_streamed_total\{tier="nvme"\} / { print "bytes", $2 }
        /^zeroserve_spec_draft_tokens_total / { print "drafted", $2 }
        /^zeroserve_spec_accepted_tokens_total / { print "accepted", $2 }
        /^zeroserve_spec_drafts_per_sequence / { print "k", $2 }'
}
# delta A B KEY: B's KEY minus A's
delta() { awk -v k="$3" 'FNR == NR { if ($1 == k) a = $2; next } $1 == k { printf "%.9g", $2 - a }' "$1" "$2"; }
# start TAG LIVE ARGS...: a server on the model, its shard files under $DIR/TAG; URL_TAG, PID_TAG
start() {
    local tag=$1 live=$2
    shift 2
    mkdir -p "$DIR/$tag"
    zs_start_server "$T/server-$tag.log" --model "$MODEL" --served-model-name m --offload nvme --nvme-path "$DIR/$tag" \
        --max-live-bytes "$live" --max-seqs 32 "$@" || { echo "server $tag did not start" >&2; exit 1; }
    printf -v "URL_$tag" '%s' "$ZS_URL"
    printf -v "PID_$tag" '%s' "$SPID"
    SPID=""
}
url() { local v="URL_$1"; echo "${!v}"; }
stop() { local v="PID_$1"; zs_stop_server "${!v}"; }
# raw TAG: the raw read GB/s of that server's shard files now
raw() { "$BIN" bench --raw-read "$DIR/$1" 2>/dev/null || echo nan; }

# one TAG PROMPT ROUND GBPS: one request alone; appends a line to $T/r-TAG:
#   prompt round tokens tok_s e2e_tok_s tokens_per_pass pass_ms bytes_per_pass bound_ms drafted accepted
# and its text to $T/out/TAG-PROMPT-ROUND
one() {
    local tag=$1 p=$2 r=$3 gbps=$4 u
    u=$(url "$tag")
    snap "$u" >"$T/m0"
    curl -s --max-time 900 -D "$T/hdr" -o "$T/resp" -H 'Content-Type: application/json' \
        --data-binary @"$T/p/$p.json" "$u/v1/chat/completions"
    snap "$u" >"$T/m1"
    local text ct ems
    text=$(jq -r '.choices[0].message.content // ("ERROR: " + (.error.message // "no answer"))' "$T/resp")
    printf '%s' "$text" >"$T/out/$tag-$p-$r"
    ct=$(jq -r '.usage.completion_tokens // 0' "$T/resp")
    ems=$(tr -d '\r' <"$T/hdr" | awk -F': ' 'tolower($1) == "x-engine-time-ms" { print $2 }')
    [ -n "$ems" ] || ems=0
    awk -v p="$p" -v r="$r" -v ct="$ct" -v ems="$ems" -v gbps="$gbps" \
        -v ttft="$(delta "$T/m0" "$T/m1" ttft)" -v passes="$(delta "$T/m0" "$T/m1" passes)" \
        -v ptok="$(delta "$T/m0" "$T/m1" ptok)" -v steps="$(delta "$T/m0" "$T/m1" steps)" \
        -v bytes="$(delta "$T/m0" "$T/m1" bytes)" -v dr="$(delta "$T/m0" "$T/m1" drafted)" \
        -v ac="$(delta "$T/m0" "$T/m1" accepted)" 'BEGIN {
            dec = ems / 1000 - ttft
            tok = (ct > 1 && dec > 0) ? (ct - 1) / dec : 0
            e2e = ems > 0 ? ct / (ems / 1000) : 0
            pp = passes > 1 ? (ptok - 1) / (passes - 1) : 1
            pms = passes > 1 ? dec / (passes - 1) * 1000 : 0
            bpp = steps > 0 ? bytes / steps : 0
            bound = gbps > 0 ? bpp / (gbps * 1e9) * 1000 : 0
            printf "%s %d %d %.4f %.4f %.4f %.3f %.0f %.3f %d %d\n", p, r, ct, tok, e2e, pp, pms, bpp, bound, dr, ac
        }' >>"$T/r-$tag"
}

# burst TAG N ROUND: N requests at once (b-1..b-N); appends to $T/b-TAG-N:
#   round tokens wall_s tok_s tokens_per_pass drafted_per_pass median_k pass_ms
burst() {
    local tag=$1 n=$2 r=$3 u i t0 t1 pids=""
    u=$(url "$tag")
    snap "$u" >"$T/m0"
    : >"$T/k-$tag"
    (while :; do curl -s --max-time 5 "$u/metrics" | awk '/^zeroserve_spec_drafts_per_sequence / { print $2 }' >>"$T/k-$tag"
        sleep 0.5; done) &
    local poller=$!
    t0=$(date +%s.%N)
    for i in $(seq 1 "$n"); do
        curl -s --max-time 1800 -o "$T/resp-$tag-$i" -H 'Content-Type: application/json' \
            --data-binary @"$T/p/b-$i.json" "$u/v1/chat/completions" &
        pids="$pids $!"
    done
    # shellcheck disable=SC2086
    wait $pids
    t1=$(date +%s.%N)
    kill "$poller" 2>/dev/null; wait "$poller" 2>/dev/null
    snap "$u" >"$T/m1"
    local ct=0 c
    for i in $(seq 1 "$n"); do
        c=$(jq -r '.usage.completion_tokens // 0' "$T/resp-$tag-$i")
        ct=$((ct + c))
        jq -r '.choices[0].message.content // ("ERROR: " + (.error.message // "no answer"))' "$T/resp-$tag-$i" \
            >"$T/out/$tag-b$n-$i-$r"
    done
    awk -v r="$r" -v ct="$ct" -v t0="$t0" -v t1="$t1" -v k="$(median <"$T/k-$tag")" \
        -v passes="$(delta "$T/m0" "$T/m1" passes)" -v ptok="$(delta "$T/m0" "$T/m1" ptok)" \
        -v steps="$(delta "$T/m0" "$T/m1" steps)" -v dr="$(delta "$T/m0" "$T/m1" drafted)" 'BEGIN {
            w = t1 - t0
            tpp = passes > 0 ? ptok / passes : 0
            dpp = passes > 0 ? dr / passes : 0
            pms = steps > 0 ? w / steps * 1000 : 0
            printf "%d %d %.3f %.4f %.4f %.4f %s %.3f\n", r, ct, w, ct / w, tpp, dpp, k, pms
        }' >>"$T/b-$tag-$n"
}

# same A B PATTERN: every text of A matching PATTERN is B's (the same prompt and round)
same() {
    local a=$1 b=$2 pat=$3 f g bad=0 cnt=0
    for f in "$T"/out/"$a"-$pat; do
        [ -f "$f" ] || continue
        g=$T/out/$b-${f#"$T"/out/"$a"-}
        cnt=$((cnt + 1))
        if ! cmp -s "$f" "$g"; then
            bad=$((bad + 1))
            echo "  DIFFERENT: $(basename "$f") vs $(basename "$g"):"
            diff <(cat "$f"; echo) <(cat "$g"; echo) | head -6 | sed 's/^/    /'
        fi
        case $(head -c 6 "$f") in ERROR:) bad=$((bad + 1)); echo "  $(basename "$f"): $(cat "$f")";; esac
    done
    if [ "$bad" = 0 ] && [ "$cnt" -gt 0 ]; then echo "  greedy texts: all $cnt identical to plain decoding"
    else echo "  greedy texts: $bad of $cnt DIFFER from plain decoding (or failed)"; FAIL=1; fi
}

# solo_case PLAIN SPEC LABEL: RUNS rounds over $SOLO, alternating which server goes first
solo_case() {
    local a=$1 b=$2 label=$3 r p gbps first second
    : >"$T/r-$a"; : >"$T/r-$b"; : >"$T/bw-$a"
    for p in $SOLO; do one "$a" "$p" 0 0; one "$b" "$p" 0 0; done # warm-up (and the prefix cache, alike)
    : >"$T/r-$a"; : >"$T/r-$b"
    for r in $(seq 1 "$RUNS"); do
        gbps=$(raw "$a")
        echo "$gbps" >>"$T/bw-$a"
        for p in $SOLO; do
            if [ $((r % 2)) = 1 ]; then first=$a second=$b; else first=$b second=$a; fi
            one "$first" "$p" "$r" "$gbps"
            one "$second" "$p" "$r" "$gbps"
        done
        echo "  round $r done (raw read $gbps GB/s)"
    done
    echo
    echo "$label: medians over $RUNS rounds; raw read of the shard files $(median <"$T/bw-$a") GB/s ($(range <"$T/bw-$a"))"
    for kind in copy chat; do
        # per-pair ratios of decode tokens/s
        join <(awk -v k="$kind" 'index($1, k) == 1 { print $1 "-" $2, $4 }' "$T/r-$a" | sort) \
             <(awk -v k="$kind" 'index($1, k) == 1 { print $1 "-" $2, $4 }' "$T/r-$b" | sort) |
            awk '$2 > 0 { print $3 / $2 }' >"$T/ratio-$kind"
        printf '  %-5s %-12s %9s %9s %9s %9s %9s %9s %14s\n' "$kind" server "tok/s" "e2e tok/s" "tok/pass" "pass ms" "bound ms" \
            "pass/bound" "acc/drafted"
        for s in "$a" "$b"; do
            awk -v k="$kind" 'index($1, k) == 1' "$T/r-$s" >"$T/sel"
            printf '  %-5s %-12s %9.2f %9.2f %9.2f %9.1f %9.1f %9.2f %14s\n' "" "$s" \
                "$(awk '{ print $4 }' "$T/sel" | median)" "$(awk '{ print $5 }' "$T/sel" | median)" \
                "$(awk '{ print $6 }' "$T/sel" | median)" "$(awk '{ print $7 }' "$T/sel" | median)" \
                "$(awk '{ print $9 }' "$T/sel" | median)" "$(awk '$9 > 0 { print $7 / $9 }' "$T/sel" | median)" \
                "$(awk '{ d += $10; a += $11 } END { if (d) printf "%d/%d %.2f", a, d, a / d; else print "-" }' "$T/sel")"
        done
        echo "  $kind: decode tokens/s $b / $a = $(median <"$T/ratio-$kind") (median of $(wc -l <"$T/ratio-$kind") pairs; $(range <"$T/ratio-$kind"))"
    done
    echo "  per prompt (median decode tok/s, $a -> $b, tokens, tokens per pass with $b):"
    for p in $SOLO; do
        printf '    %-12s %7.2f -> %7.2f  %4s tokens  %5.2f tok/pass\n' "$p" \
            "$(awk -v p="$p" '$1 == p { print $4 }' "$T/r-$a" | median)" "$(awk -v p="$p" '$1 == p { print $4 }' "$T/r-$b" | median)" \
            "$(awk -v p="$p" '$1 == p { print $3 }' "$T/r-$b" | median)" "$(awk -v p="$p" '$1 == p { print $6 }' "$T/r-$b" | median)"
    done
    same "$a" "$b" "*"
    grep -h "speculation (" "$T/server-$b.log" | tail -n 1 | sed 's/^/  last plan: /'
}

# batch_case PLAIN SPEC LABEL: bursts of each size in $BATCHES, RUNS rounds, alternating
batch_case() {
    local a=$1 b=$2 label=$3 n r
    echo
    echo "$label: batches of $BATCHES requests (16 copying tasks, 16 chats; max_tokens $MAX_BATCH), $RUNS rounds"
    for n in $BATCHES; do
        : >"$T/b-$a-$n"; : >"$T/b-$b-$n"
        burst "$a" "$n" 0; burst "$b" "$n" 0 # warm-up
        : >"$T/b-$a-$n"; : >"$T/b-$b-$n"
        for r in $(seq 1 "$RUNS"); do
            if [ $((r % 2)) = 1 ]; then burst "$a" "$n" "$r"; burst "$b" "$n" "$r"
            else burst "$b" "$n" "$r"; burst "$a" "$n" "$r"; fi
        done
        join <(awk '{ print $1, $4 }' "$T/b-$a-$n" | sort) <(awk '{ print $1, $4 }' "$T/b-$b-$n" | sort) |
            awk '$2 > 0 { print $3 / $2 }' >"$T/bratio"
        printf '  batch %-3s %-12s %9s %9s %12s %14s %9s\n' "$n" server "tok/s" "tok/pass" "drafts/pass" "drafts/seq (k)" "pass ms"
        for s in "$a" "$b"; do
            printf '  %-9s %-12s %9.2f %9.2f %12.2f %14s %9.1f\n' "" "$s" "$(awk '{ print $4 }' "$T/b-$s-$n" | median)" \
                "$(awk '{ print $5 }' "$T/b-$s-$n" | median)" "$(awk '{ print $6 }' "$T/b-$s-$n" | median)" \
                "$(awk '{ print $7 }' "$T/b-$s-$n" | median)" "$(awk '{ print $8 }' "$T/b-$s-$n" | median)"
        done
        echo "  batch $n: tokens/s $b / $a = $(median <"$T/bratio") (median of $(wc -l <"$T/bratio") pairs; $(range <"$T/bratio"))"
        same "$a" "$b" "b$n-*"
    done
}

has() { case " $CASES " in *" $1 "*) return 0;; esac; return 1; }
echo "== speculative decoding, weights streamed from NVMe: $(basename "$MODEL"), $RUNS rounds, $(nproc) cores =="
if has ngram || has batch; then
    echo
    echo "-- 1. prompt lookup: $(basename "$MODEL") as stored (Q4_1), live budget $((LIVE_Q4 / 1000000)) MB --"
    start plain "$LIVE_Q4"
    # shellcheck disable=SC2086
    start ngram "$LIVE_Q4" --speculative ngram $SPEC_ARGS
    grep -h "writing 1 shard file\|live budget\|KV cache" "$T/server-ngram.log" | head -n 3 | sed 's/^/  /'
    has ngram && solo_case plain ngram "prompt lookup, batch 1"
    has batch && batch_case plain ngram "prompt lookup, batched"
    stop plain; stop ngram
fi
if has draft || has batch; then
    echo
    echo "-- 2. draft model: target $(basename "$MODEL") dequantized to bf16 (--weight-dtype bf16), live budget" \
        "$((LIVE_BF16 / 1000000)) MB; draft: the Q4_1 file, resident --"
    if [ "$HAVE_DRAFT" = 0 ]; then
        echo "  not available in this build (zeroserve serve --help lists no --draft-model)"
    else
        start tplain "$LIVE_BF16" --weight-dtype bf16
        # shellcheck disable=SC2086
        start draft "$LIVE_BF16" --weight-dtype bf16 $DRAFT_ARGS $SPEC_ARGS
        grep -h "writing 1 shard file\|draft" "$T/server-draft.log" | head -n 4 | sed 's/^/  /'
        has draft && solo_case tplain draft "draft model, batch 1"
        has batch && batch_case tplain draft "draft model, batched"
        stop tplain; stop draft
    fi
fi
echo
if [ "$FAIL" = 0 ]; then echo "every greedy text was identical to plain decoding"; else echo "SOME TEXTS DIFFERED (above)"; fi
exit "$FAIL"
