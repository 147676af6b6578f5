#!/bin/sh
# shellcheck shell=bash
# tenant-flood.sh — one tenant's flood against another tenant's latency (not part of `make test`).
#
# A server with two inference tenants: calm (no limits) and flood (LIMIT from the key file). Each
# round measures calm's latency over N sequential chat completions (max_tokens CALM_TOK, greedy)
# three ways, interleaved: alone; while flood sends long completions (max_tokens FLOOD_TOK) on
# FLOODERS connections at once, a new one as soon as one is answered, refused or not (curl
# --parallel: one process, so that the client's own CPU stays small), with flood's limit in force;
# and the same flood with flood's limit lifted (the key file rewritten and SIGHUP, as an operator
# would). Prints
# p50 and p99 of each, and the medians over RUNS rounds of p99 flooded / p99 alone, with and without
# the limit; the issue's bound is 1.5 with it. Also how many of flood's requests were answered 200
# and 429.
#
#   sh tests/bench/tenant-flood.sh
# Env: ZS_BIN (./zeroserve), MODEL (default: SmolLM2-135M-Instruct Q4_1 via
# server/fetch-smollm2.sh), RUNS (3), N (40), CALM_TOK (16), FLOOD_TOK (64), FLOODERS (16),
# LIMIT ("streams=1"; any of the key file's limits).
# shellcheck source=tests/lib/e2e.sh
. "$(dirname "$0")/../lib/e2e.sh"
zs_bash "$@"
set -u
RUNS=${RUNS:-3}
N=${N:-40}
CALM_TOK=${CALM_TOK:-16}
FLOOD_TOK=${FLOOD_TOK:-64}
FLOODERS=${FLOODERS:-16}
LIMIT=${LIMIT:-streams=1}
if [ -z "${MODEL:-}" ]; then
    MODEL=$(sh server/fetch-smollm2.sh) || { echo "cannot fetch SmolLM2 (give MODEL=...)" >&2; exit 1; }
fi
command -v jq >/dev/null || { echo "jq is missing" >&2; exit 1; }
zs_need_bin
zs_tmpdir flood
median() { sort -g | awk '{ a[NR] = $1 } END { if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
pct() { sort -g | awk -v p="$1" '{ a[NR] = $1 } END { i = int(p / 100 * NR + 0.999999); if (i < 1) i = 1; if (i > NR) i = NR; print a[i] }'; }
keys() { # the flood tenant's limit: LIMIT or none
    printf 'key-calm calm inference\nkey-flood flood inference %s\n' "$1" >"$T/keys"
    chmod 600 "$T/keys"
}
keys "$LIMIT"
zs_start_server "$T/s.log" --model "$MODEL" --api-key-file "$T/keys" --max-queue 256 || { echo "cannot start the server" >&2; exit 1; }
CALM=$(jq -cn --argjson n "$CALM_TOK" '{messages: [{role: "user", content: "Name three colours."}], max_tokens: $n, temperature: 0, ignore_eos: true}')
FLOOD=$(jq -cn --argjson n "$FLOOD_TOK" '{messages: [{role: "user", content: "Tell me a long story about the sea."}], max_tokens: $n, temperature: 0, ignore_eos: true}')
calm() { # N sequential requests: latencies (s), one a line
    for _ in $(seq 1 "$N"); do
        curl -s -o /dev/null -w '%{time_total}\n' -H 'Authorization: Bearer key-calm' -H 'Content-Type: application/json' \
            --data-binary "$CALM" "$ZS_URL/v1/chat/completions"
    done
}
flooded() { # $1: label; calm's latencies while flood floods
    for _ in $(seq 1 200); do
        printf 'url = "%s/v1/chat/completions"\noutput = "/dev/null"\n' "$ZS_URL"
    done >"$T/flood.cfg"
    rm -f "$T/stop"
    : >"$T/fl"
    (while [ ! -e "$T/stop" ]; do
        stdbuf -oL curl -s -Z --parallel-max "$FLOODERS" -w '%{http_code}\n' -H 'Authorization: Bearer key-flood' \
            -H 'Content-Type: application/json' --data-binary "$FLOOD" -K "$T/flood.cfg" 2>/dev/null
    done >>"$T/fl") &
    fpid=$!
    sleep 2
    calm >"$T/lat.$1"
    touch "$T/stop"
    wait "$fpid" 2>/dev/null
    echo "$(grep -c '^200$' "$T/fl") $(grep -c '^429$' "$T/fl")" >"$T/codes.$1"
}
calm >/dev/null # warm up
: >"$T/r.limit"; : >"$T/r.open"
for r in $(seq 1 "$RUNS"); do
    calm >"$T/lat.alone"
    keys "$LIMIT"; kill -HUP "$SPID"; sleep 0.5
    flooded limit
    keys ""; kill -HUP "$SPID"; sleep 0.5
    flooded open
    a50=$(pct 50 <"$T/lat.alone") a99=$(pct 99 <"$T/lat.alone")
    for m in limit open; do
        p50=$(pct 50 <"$T/lat.$m") p99=$(pct 99 <"$T/lat.$m")
        read -r ok429 <"$T/codes.$m"
        printf 'round %d, %-5s: calm p50 %.3f s p99 %.3f s (alone %.3f / %.3f): p99 ratio %.2f; flood answered 200/429: %s\n' \
            "$r" "$m" "$p50" "$p99" "$a50" "$a99" "$(echo "$p99 $a99" | awk '{ print $1 / $2 }')" "$(echo "$ok429" | tr ' ' /)"
        echo "$p99 $a99" | awk '{ print $1 / $2 }' >>"$T/r.$m"
    done
done
printf 'median over %d rounds of calm p99 flooded / alone: with %s for flood %.2f (bound 1.5); without a limit %.2f\n' \
    "$RUNS" "$LIMIT" "$(median <"$T/r.limit")" "$(median <"$T/r.open")"
zs_stop_server
