#!/bin/sh
# shellcheck shell=bash
# prefix-cache.sh — time to first token of a chat whose system prompt (~1000 tokens) is shared,
# cold and warm, on a model offloaded to NVMe (not part of `make test`):
#   ./zeroserve serve --offload nvme with the prefix cache on; RUNS rounds, each: a chat with a
#   new system prompt (cold: every block prefilled), then a chat with the same system prompt and
#   another question (warm: the system prompt's blocks come from the cache). max_tokens 1, so the
#   request's time is its time to first token. Medians, the ratio cold/warm, and the server's
#   prefix-cache counters. Then the same rounds against a server with --no-prefix-cache, whose
#   "warm" requests prefill everything, and the two servers' first-token texts are compared.
#
#   sh tests/bench/prefix-cache.sh
# Env: ZS_BIN (./zeroserve), MODEL (default: SmolLM2-135M-Instruct Q4_1 via
# server/fetch-smollm2.sh), RUNS (5), DIR (scratch for the NVMe shards, default /tmp/zs-pcbench).
# shellcheck source=tests/lib/e2e.sh
. "$(dirname "$0")/../lib/e2e.sh"
zs_bash "$@"
set -u
RUNS=${RUNS:-5}
DIR=${DIR:-/tmp/zs-pcbench}
if [ -z "${MODEL:-}" ]; then
    MODEL=$(sh server/fetch-smollm2.sh) || { echo "cannot fetch SmolLM2 (give MODEL=...)" >&2; exit 1; }
fi
command -v jq >/dev/null || { echo "jq is missing" >&2; exit 1; }
zs_tmpdir pc
zs_at_exit() { rm -rf "$DIR"; }

# a system prompt of about 1000 tokens, different for each seed
system_prompt() {
    local seed=$1 words="river stone lantern orchard harbor meadow copper violet thunder garden ledger summit"
    local out="You are assistant number $seed. Follow these house rules carefully."
    for i in $(seq 1 115); do
        out="$out Rule $i: $(echo "$words" | cut -d' ' -f$(( (i * 7 + seed) % 12 + 1 ))) matters."
    done
    printf '%s' "$out"
}

ask() { # url system question -> "seconds<TAB>text"
    jq -n --arg s "$2" --arg q "$3" \
        '{model: "m", max_tokens: 1, temperature: 0, messages: [{role: "system", content: $s}, {role: "user", content: $q}]}' \
        >"$T/body.json"
    curl -s --max-time 300 -o "$T/out.json" -w '%{time_total}' -H 'Content-Type: application/json' \
        --data-binary @"$T/body.json" "$1/v1/chat/completions" >"$T/time"
    printf '%s\t%s\t%s\n' "$(cat "$T/time")" "$(jq -r '.usage.prompt_tokens // "?"' "$T/out.json")" \
        "$(jq -c '.choices[0].message.content // .error.message' "$T/out.json")"
}

median() { sort -g | awk '{ a[NR] = $1 } END { if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }

bench() { # label extra-serve-args...
    local label=$1
    shift
    rm -rf "$DIR"
    mkdir -p "$DIR"
    zs_start_server "$T/server-$label.log" --model "$MODEL" --served-model-name m --offload nvme --nvme-path "$DIR" \
        --max-seqs 4 "$@" || exit 1
    ask "$ZS_URL" "$(system_prompt 999)" "Warm-up?" >/dev/null
    : >"$T/cold-$label"
    : >"$T/warm-$label"
    for r in $(seq 1 "$RUNS"); do
        local sp
        sp=$(system_prompt "$r")
        ask "$ZS_URL" "$sp" "What is rule 3?" >"$T/c"
        ask "$ZS_URL" "$sp" "And what is rule 17?" >"$T/w"
        cut -f1 "$T/c" >>"$T/cold-$label"
        cut -f1 "$T/w" >>"$T/warm-$label"
        cut -f3 "$T/w" >>"$T/text-$label"
        echo "  $label round $r: cold $(cut -f1 "$T/c") s, warm $(cut -f1 "$T/w") s ($(cut -f2 "$T/c") prompt tokens)"
    done
    curl -s "$ZS_URL/metrics" | grep -E '^zeroserve_(prefix_cache_(hit|lookup|miss)_blocks_total|kv_cached_blocks|bytes_streamed_total)' |
        sed 's/^/  /'
    zs_stop_server
}

echo "model: $MODEL (offload nvme), $RUNS rounds"
bench on
bench off --no-prefix-cache
for l in on off; do
    c=$(median <"$T/cold-$l")
    w=$(median <"$T/warm-$l")
    echo "prefix cache $l: time to first token, median: cold $c s, warm $w s, cold/warm $(awk -v a="$c" -v b="$w" 'BEGIN { printf "%.2f", a / b }')"
done
if cmp -s "$T/text-on" "$T/text-off"; then echo "first tokens with the cache on and off: the same"; else
    echo "first tokens with the cache on and off DIFFER"; diff "$T/text-on" "$T/text-off"; exit 1; fi
