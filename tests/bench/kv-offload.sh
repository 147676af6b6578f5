#!/bin/sh
# shellcheck shell=bash
# kv-offload.sh — the KV cache below memory (--kv-offload), measured (not part of `make test`):
#
# 1. Time to first token of a ~4000-token prompt (max_tokens 1), RUNS rounds, each with a new
#    prompt, on a server with --kv-offload nvme and a KV budget that holds about one such prompt:
#    cold (every block prefilled); warm in memory (the same prompt again); warm on NVMe (two other
#    long prompts pushed its blocks out of memory first: they come back from the prefix tier's
#    file); warm on NVMe after a restart (a new server on the same directory). Medians, and each
#    warm case over cold; the four answers of a round must be the same text.
# 2. Throughput of N greedy completions submitted at once (requests of up to 128 prompts of ~24
#    tokens each, all sent together, OUT tokens each, ignore_eos) for N = 64, 128, 256, at a KV budget that holds about 32
#    whole requests, with the weights streamed from NVMe (--offload nvme): KV in memory only
#    (--kv-offload none: whole requests reserved at admission, the rest wait) against KV with an
#    NVMe tier (reserved as they grow, the youngest swapped out when the cache is full), and with
#    --kv-stream (the youngest run with their K/V streamed from the tier a layer at a time). Tokens/s,
#    the most sequences running at once (sampled from /metrics), preemptions, and whether both
#    ways answered the same text.
#
#   sh tests/bench/kv-offload.sh
# Env: ZS_BIN (./zeroserve), MODEL (default: SmolLM2-135M-Instruct Q4_1 via
# server/fetch-smollm2.sh), RUNS (3), OUT (32), SIZES ("64 128 256"), DIR (scratch on the disk to
# measure, default /tmp/zs-kvbench), PARTS ("ttft batch": which of the two to run).
# shellcheck source=tests/lib/e2e.sh
. "$(dirname "$0")/../lib/e2e.sh"
zs_bash "$@"
set -u
RUNS=${RUNS:-3}
OUT=${OUT:-32}
SIZES=${SIZES:-64 128 256}
PARTS=${PARTS:-ttft batch}
DIR=${DIR:-/tmp/zs-kvbench}
if [ -z "${MODEL:-}" ]; then
    MODEL=$(sh server/fetch-smollm2.sh) || { echo "cannot fetch SmolLM2 (give MODEL=...)" >&2; exit 1; }
fi
command -v jq >/dev/null || { echo "jq is missing" >&2; exit 1; }
zs_tmpdir kvb
zs_at_exit() { rm -rf "$DIR"; }
median() { sort -g | awk '{ a[NR] = $1 } END { if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
metric() { curl -s "$ZS_URL/metrics" | awk -v k="$1" '$1 == k { print $2 }'; }

# a long prompt of about N tokens, different for each seed
long_prompt() { # seed words
    local seed=$1 n=$2 words="river stone lantern orchard harbor meadow copper violet thunder garden ledger summit"
    local out="Story $seed."
    for i in $(seq 1 $((n / 6))); do out="$out $(echo "$words" | cut -d' ' -f$(((i * 7 + seed) % 12 + 1))) $i."; done
    printf '%s' "$out"
}
ttft() { # prompt -> "seconds<TAB>prompt tokens<TAB>text"
    jq -n --arg p "$1" '{prompt: $p, max_tokens: 1, temperature: 0}' >"$T/body.json"
    curl -s --max-time 600 -o "$T/out.json" -w '%{time_total}' -H 'Content-Type: application/json' \
        --data-binary @"$T/body.json" "$ZS_URL/v1/completions" >"$T/time"
    printf '%s\t%s\t%s\n' "$(cat "$T/time")" "$(jq -r '.usage.prompt_tokens // "?"' "$T/out.json")" \
        "$(jq -c '.choices[0].text // .error.message' "$T/out.json")"
}

# ---------------------------------------------------------------- 1. time to first token
# KV per position of SmolLM2-135M in f32: 30 layers x K,V x 192 x 4 bytes = 46 KB; 288 blocks of 16
KVB=$((4608 * 46080))
serve_ttft() { # log
    zs_start_server "$1" --model "$MODEL" --context 4600 --kv-bytes $KVB --kv-offload nvme --kv-nvme-path "$DIR" \
        --max-seqs 2 || exit 1
}
if [ "${PARTS#*ttft}" != "$PARTS" ]; then
rm -rf "$DIR"
mkdir -p "$DIR"
echo "1. time to first token of a ~4000-token prompt: $MODEL, --kv-offload nvme under $DIR, $RUNS rounds"
for c in cold mem nvme restart; do : >"$T/ttft-$c"; done
serve_ttft "$T/ttft.log"
ttft "$(long_prompt 0 4000)" >/dev/null # warm-up
for r in $(seq 1 "$RUNS"); do
    p=$(long_prompt "$r" 4000)
    ttft "$p" >"$T/cold"
    ttft "$p" >"$T/mem"
    ttft "$(long_prompt $((r + 100)) 4000)" >/dev/null # two others push it down to NVMe
    ttft "$(long_prompt $((r + 200)) 4000)" >/dev/null
    hits0=$(metric zeroserve_prefix_tier_hit_blocks_total)
    ttft "$p" >"$T/nvme"
    hits1=$(metric zeroserve_prefix_tier_hit_blocks_total)
    zs_stop_server
    serve_ttft "$T/ttft-$r.log"
    ttft "$p" >"$T/restart"
    for c in cold mem nvme restart; do cut -f1 "$T/$c" >>"$T/ttft-$c"; done
    same=yes
    for c in mem nvme restart; do [ "$(cut -f3 "$T/$c")" = "$(cut -f3 "$T/cold")" ] || same=NO; done
    echo "  round $r ($(cut -f2 "$T/cold") prompt tokens): cold $(cut -f1 "$T/cold") s, memory $(cut -f1 "$T/mem") s," \
        "NVMe $(cut -f1 "$T/nvme") s ($((${hits1%.*} - ${hits0%.*})) blocks from the tier), after a restart $(cut -f1 "$T/restart") s;" \
        "same text: $same"
done
zs_stop_server
cold=$(median <"$T/ttft-cold")
for c in mem nvme restart; do
    m=$(median <"$T/ttft-$c")
    echo "  median $c: $m s = $(awk -v a="$m" -v b="$cold" 'BEGIN { printf "%.3f", a / b }') x cold ($cold s)"
done
fi

# ---------------------------------------------------------------- 2. throughput at batch N
# a budget of ~32 whole requests (48 + OUT positions each, in blocks of 16)
BLK=$((16 * 46080))
PER=$(((48 + OUT + 15) / 16))
KVB2=$((32 * PER * BLK))
WDIR=$DIR/weights
[ "${PARTS#*batch}" = "$PARTS" ] || echo "2. N greedy completions of $OUT tokens at once, weights from NVMe, a KV budget of $((32 * PER)) blocks (~32 requests)"
batch() { # label N kv-flags...
    local label=$1 n=$2
    shift 2
    rm -rf "$DIR/kv"
    mkdir -p "$DIR/kv" "$WDIR"
    zs_start_server "$T/b-$label-$n.log" --model "$MODEL" --context 512 --offload nvme --nvme-path "$WDIR" \
        --kv-bytes $KVB2 --max-seqs 256 --max-batch-tokens 512 "$@" || exit 1
    # requests of at most 128 prompts (the API's limit), all sent at once
    local k parts=$(((n + 127) / 128)) pids=""
    for k in $(seq 0 $((parts - 1))); do
        jq -n --argjson a $((k * 128)) --argjson b $((k * 128 + (n - k * 128 < 128 ? n - k * 128 : 128))) --argjson o "$OUT" \
            '{prompt: [range($a; $b) | "Tale \(.): once upon a time a fox and a crow met by the river, and the fox said"],
              max_tokens: $o, temperature: 0, ignore_eos: true}' >"$T/batch-$k.json"
    done
    (while :; do metric zeroserve_running_sequences; sleep 0.2; done) >"$T/running" 2>/dev/null &
    local mon=$! t0 t1
    t0=$(date +%s.%N)
    for k in $(seq 0 $((parts - 1))); do
        curl -s --max-time 3600 -H 'Content-Type: application/json' --data-binary @"$T/batch-$k.json" \
            "$ZS_URL/v1/completions" >"$T/b-$label-$n-$k.json" &
        pids="$pids $!"
    done
    for k in $pids; do wait "$k"; done
    t1=$(date +%s.%N)
    kill "$mon" 2>/dev/null
    wait "$mon" 2>/dev/null
    local toks most pre
    toks=$(cat "$T/b-$label-$n"-*.json | jq -s 'map(.usage.completion_tokens // 0) | add')
    most=$(sort -g "$T/running" | tail -1)
    pre=$(curl -s "$ZS_URL/metrics" | awk '$1 ~ /^zeroserve_kv_preemptions_total/ { s += $2 } END { print s + 0 }')
    for k in $(seq 0 $((parts - 1))); do
        jq -c '[.choices[] | {index, text}] | sort_by(.index) | .[].text' "$T/b-$label-$n-$k.json"
    done >"$T/texts-$label-$n"
    printf '%s\t%s\n' "$(awk -v t="$toks" -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", t / (b - a) }')" "$most" >"$T/res-$label-$n"
    echo "  N=$n $label: $toks tokens, $(cut -f1 "$T/res-$label-$n") tokens/s, at most ${most:-?} running, $pre preemptions"
    zs_stop_server
}
[ "${PARTS#*batch}" != "$PARTS" ] || SIZES=
for n in $SIZES; do
    batch memory "$n" --kv-offload none
    batch nvme "$n" --kv-offload nvme --kv-nvme-path "$DIR/kv"
    batch stream "$n" --kv-offload nvme --kv-nvme-path "$DIR/kv" --kv-stream
    for m in nvme stream; do
        if cmp -s "$T/texts-memory-$n" "$T/texts-$m-$n"; then s=same; else s=DIFFERENT; fi
        echo "  N=$n: KV on NVMe ($m) / in memory = $(awk -v a="$(cut -f1 "$T/res-$m-$n")" -v b="$(cut -f1 "$T/res-memory-$n")" \
            'BEGIN { printf "%.2f", a / b }') tokens/s; texts: $s"
    done
done
