#!/bin/sh
# shellcheck shell=bash
# playground-shot.sh — a screenshot of the playground page (GET /) after it streamed an answer
# (not part of `make test`). Installs Debian's chromium when missing (root only), starts
# ./zeroserve serve on stories260K, loads
#   /?mode=completion&prompt=Once%20upon%20a%20time&max_tokens=64&temperature=0&autosend=1
# in headless chromium (the page sends the prompt by itself) and saves
# build/test-artifacts/playground.png (OUT=... to change).
# Env: ZS_SHARED (default ../shared), MODEL, ZS_BIN (default ./zeroserve), OUT, CHROMIUM.
# Note: headless chromium runs the page in virtual time (--virtual-time-budget), so the timing
# figures on the stats line of the screenshot (tokens/s, total) are virtual, not real.
if [ -z "${BASH_VERSION:-}" ]; then exec bash "$0" "$@"; fi
set -u
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
SHARED=${ZS_SHARED:-../shared}
case $SHARED in /*) ;; *) SHARED=$ROOT/$SHARED;; esac
MODEL=${MODEL:-$SHARED/models/stories260K}
BIN=${ZS_BIN:-./zeroserve}
OUT=${OUT:-build/test-artifacts/playground.png}
case $OUT in /*) ;; *) OUT=$ROOT/$OUT;; esac

CHROMIUM=${CHROMIUM:-$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)}
if [ -z "$CHROMIUM" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "installing chromium (apt-get install -y chromium)"
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null || exit 1
        CHROMIUM=$(command -v chromium)
    else
        echo "chromium is missing; run: sudo apt-get install -y chromium" >&2; exit 77
    fi
fi

T=$(mktemp -d /tmp/zs-shot.XXXXXX) || exit 1
SPID=""
cleanup() {
    [ -n "$SPID" ] && kill -TERM "$SPID" 2>/dev/null && wait "$SPID" 2>/dev/null
    rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP
# shellcheck source=tests/start-server.sh
. "$ROOT/tests/start-server.sh"

zs_start_server "$T/server.log" --model "$MODEL" || exit 1
URL=$ZS_URL

mkdir -p "$(dirname "$OUT")"
PAGE="$URL/?mode=completion&prompt=Once%20upon%20a%20time&max_tokens=64&temperature=0&autosend=1"
echo "loading $PAGE"
timeout 120 "$CHROMIUM" --headless=new --no-sandbox --disable-gpu --hide-scrollbars --no-first-run \
    --user-data-dir="$T/profile" --window-size=1200,900 --virtual-time-budget=15000 \
    --screenshot="$OUT" "$PAGE" >"$T/chromium.log" 2>&1
rc=$?
if [ $rc != 0 ] || [ ! -s "$OUT" ]; then
    echo "chromium failed (exit $rc):" >&2; tail -n 20 "$T/chromium.log" >&2; exit 1
fi
# the page must have finished its request: the server counted one completion
n=$(curl -s --max-time 5 "$URL/metrics" | awk '/^zeroserve_requests_total/ && /\/v1\/completions/ && /status="200"/ { s += $NF } END { print s + 0 }')
echo "saved $OUT ($(wc -c <"$OUT") bytes); completions answered while loading the page: $n"
[ "$n" -ge 1 ] || { echo "the page did not send its completion" >&2; exit 1; }
