#!/bin/sh
# shellcheck shell=bash
# http-load.sh — HTTP serving benchmark (not part of `make test`): requests/s and p50/p99
# latency of a 16-token greedy completion at concurrency 1, 8 and 32, and the server overhead
# per request (HTTP latency minus engine time).
#
# The server reports its engine time per request (submit to completion) in the X-Engine-Time-Ms
# header of non-streamed responses; the overhead is the HTTP time minus that.
#
#   sh tests/bench/http-load.sh                  # starts ./zeroserve serve on stories260K
#   ZS_URL=http://127.0.0.1:8080 MODEL=DIR sh tests/bench/http-load.sh   # an already running server
# Env: MODEL (default $ZS_SHARED/models/stories260K), ZS_SHARED (default ../shared), ZS_BIN
# (default ./zeroserve), ZS_API_KEY, N (requests per concurrency level, default 256),
# LEVELS (default "1 8 32"), PROMPT (default "Once upon a time"), ZS_BENCH_ARGS (server flags).
# shellcheck source=tests/lib/e2e.sh
. "$(dirname "$0")/../lib/e2e.sh"
zs_bash "$@"
set -u
MODEL=${MODEL:-$SHARED/models/stories260K}
N=${N:-256}
LEVELS=${LEVELS:-"1 8 32"}
PROMPT=${PROMPT:-Once upon a time}
command -v curl >/dev/null || { echo "curl is needed" >&2; exit 1; }
zs_tmpdir http-load

if [ -z "${ZS_URL:-}" ]; then
    # shellcheck disable=SC2086
    zs_start_server "$T/server.log" --model "$MODEL" ${ZS_BENCH_ARGS:-} || exit 1
fi
AUTH=""
[ -n "${ZS_API_KEY:-}" ] && AUTH="Authorization: Bearer $ZS_API_KEY"
esc=$(printf '%s' "$PROMPT" | sed 's/\\/\\\\/g; s/"/\\"/g')
printf '{"prompt":"%s","max_tokens":16,"temperature":0,"ignore_eos":true}' "$esc" >"$T/body.json"

# worker W COUNT TAG: COUNT requests one after another on one curl (keep-alive), one latency per line
cat >"$T/worker.sh" <<EOF
args=()
for ((j = 0; j < \$2; j++)); do
    [ \$j -gt 0 ] && args+=(--next)
    args+=(-s -o /dev/null -w '%{http_code} %{time_total}\n' --max-time 120 -H 'Content-Type: application/json')
    [ -n "$AUTH" ] && args+=(-H "$AUTH")
    args+=(--data-binary @$T/body.json "$ZS_URL/v1/completions")
done
curl "\${args[@]}" >"$T/lat.\$3.\$1"
EOF

now() { date +%s.%N; }
echo "zeroserve HTTP load: $ZS_URL, model $(basename "$MODEL"), 16-token greedy completion of \"$PROMPT\", $N requests per level"
# warm-up
for w in $(seq 0 7); do echo "$w 4 warm"; done | xargs -P 8 -n 3 bash "$T/worker.sh"
printf '\n%-12s %10s %10s %10s %10s %8s\n' concurrency "req/s" "p50 ms" "p99 ms" "mean ms" errors
P50_C1=""
for c in $LEVELS; do
    n=$N; [ "$n" -lt $((c * 4)) ] && n=$((c * 4))
    t0=$(now)
    for w in $(seq 0 $((c - 1))); do echo "$w $(( n / c + (w < n % c ? 1 : 0) )) c$c"; done |
        xargs -P "$c" -n 3 bash "$T/worker.sh"
    t1=$(now)
    cat "$T"/lat.c"$c".* >"$T/all.$c"
    errs=$(awk '$1 != 200' "$T/all.$c" | wc -l)
    awk '{print $2}' "$T/all.$c" | sort -g >"$T/sorted.$c"
    read -r rps p50 p99 mean < <(awk -v t0="$t0" -v t1="$t1" '
        { v[NR] = $1; s += $1 }
        END { i50 = int(NR * 0.50 + 0.999999); i99 = int(NR * 0.99 + 0.999999)
              printf "%.1f %.2f %.2f %.2f\n", NR / (t1 - t0), v[i50] * 1000, v[i99] * 1000, s / NR * 1000 }' "$T/sorted.$c")
    printf '%-12s %10s %10s %10s %10s %8s\n' "$c" "$rps" "$p50" "$p99" "$mean" "$errs"
    [ "$c" = 1 ] && P50_C1=$p50
done

# server overhead: the server reports its engine time (first submit to completion) in the
# X-Engine-Time-Ms header; overhead = HTTP request time (curl) - engine time, per request
for _ in $(seq 41); do
    auth_args=(); [ -n "$AUTH" ] && auth_args=(-H "$AUTH")
    curl -s -D "$T/h" -o /dev/null -w '%{time_total}\n' --max-time 60 -H 'Content-Type: application/json' \
        "${auth_args[@]}" --data-binary @"$T/body.json" "$ZS_URL/v1/completions" >"$T/t"
    e=$(tr -d '\r' <"$T/h" | awk -F': ' 'tolower($1) == "x-engine-time-ms" { print $2 }')
    [ -n "$e" ] && awk -v t="$(cat "$T/t")" -v e="$e" 'BEGIN { printf "%.4f %.4f\n", t * 1000 - e, e }'
done | sort -g >"$T/overhead"
if [ -s "$T/overhead" ]; then
    read -r oh eng < <(awk '{ o[NR] = $1; e[NR] = $2 } END { m = int((NR + 1) / 2); printf "%.3f %.3f", o[m], e[m] }' "$T/overhead")
    echo
    echo "server overhead per request (HTTP time - X-Engine-Time-Ms, median of 41 sequential requests): $oh ms"
    echo "  (engine time for the same request: $eng ms)"
else
    echo "(the server sent no X-Engine-Time-Ms header)"
fi
