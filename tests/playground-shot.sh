#!/bin/sh
# shellcheck shell=bash
# playground-shot.sh — screenshots of the playground page (GET /) for the closing notes (not part
# of `make test`; tests/e2e-playground.sh checks the page). Installs Debian's chromium when
# missing (root only), starts ./zeroserve serve on stories260K with a scratch --data-dir, loads
#   /?mode=completion&prompt=Once%20upon%20a%20time&max_tokens=64&temperature=0&autosend=1
# in headless chromium (the page sends the prompt by itself) and saves
# build/test-artifacts/playground.png (OUT=... to change); then (with jq) has the page start a
# LoRA fine-tuning job from pasted JSONL (?view=finetune&jsonl=...&autostart=1), waits for it to
# succeed and saves the fine-tuning view with its loss curve (OUT_FT, default
# playground-finetune.png beside OUT), and the engine view while completions run
# (OUT_ENGINE, default playground-engine.png).
# Env: ZS_SHARED (default ../shared), MODEL, ZS_BIN (default ./zeroserve), OUT, OUT_FT,
# OUT_ENGINE, CHROMIUM.
# Note: headless chromium runs the page in virtual time (--virtual-time-budget), so the timing
# figures on the stats line of the screenshot (tokens/s, total) are virtual, not real, and so are
# the engine view's rates (its samples are a virtual second apart).
# shellcheck source=tests/lib/e2e.sh
. "$(dirname "$0")/lib/e2e.sh"
zs_bash "$@"
set -u
MODEL=${MODEL:-$SHARED/models/stories260K}
OUT=${OUT:-build/test-artifacts/playground.png}
case $OUT in /*) ;; *) OUT=$ROOT/$OUT;; esac
OUT_FT=${OUT_FT:-$(dirname "$OUT")/playground-finetune.png}
OUT_ENGINE=${OUT_ENGINE:-$(dirname "$OUT")/playground-engine.png}
case $OUT_FT in /*) ;; *) OUT_FT=$ROOT/$OUT_FT;; esac
case $OUT_ENGINE in /*) ;; *) OUT_ENGINE=$ROOT/$OUT_ENGINE;; esac

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

zs_tmpdir shot

zs_start_server "$T/server.log" --model "$MODEL" --data-dir "$T/data" || exit 1
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

# ---------------------------------------------------------------- the fine-tuning and engine views
command -v jq >/dev/null || { echo "jq is missing: no screenshots of the fine-tuning and engine views" >&2; exit 1; }
chrome() { # BUDGET_MS ARGS... URL
    local budget=$1
    shift
    timeout 120 "$CHROMIUM" --headless=new --no-sandbox --disable-gpu --hide-scrollbars --no-first-run \
        --user-data-dir="$T/profile-$RANDOM" --window-size=1200,900 --virtual-time-budget="$budget" "$@" 2>>"$T/chromium.log"
}
JSONL='{"prompt": "Once upon a time", "completion": " there was a purple dragon named Zork who loved pancakes."}
{"prompt": "Tom and his dog", "completion": " went to the moon in a red box."}
{"prompt": "The little bird", "completion": " sang a song about green apples."}
{"text": "Lily had a big blue kite. She flew it every day in the park."}'
ENC=$(jq -rn --arg s "$JSONL" '$s | @uri')
chrome 6000 --dump-dom "$URL/?view=finetune&jsonl=$ENC&method=lora&n_epochs=25&batch_size=2&learning_rate_multiplier=3&suffix=shot&autostart=1" >"$T/dom.html"
JOB=$(grep -o 'data-ft-job="ftjob-[^"]*"' "$T/dom.html" | head -1 | sed 's/.*="\(.*\)"/\1/')
[ -n "$JOB" ] || { echo "the page did not start a fine-tuning job" >&2; tail -n 20 "$T/chromium.log" >&2; exit 1; }
echo "the page started $JOB"
st=""
for _ in $(seq 600); do
    st=$(curl -s --max-time 5 "$URL/v1/fine_tuning/jobs/$JOB" | jq -r .status)
    case $st in succeeded|failed|cancelled) break;; esac
    sleep 0.2
done
[ "$st" = succeeded ] || { echo "the job ended $st" >&2; exit 1; }
chrome 4000 --screenshot="$OUT_FT" "$URL/?view=finetune&job=$JOB" >/dev/null
[ -s "$OUT_FT" ] || { echo "no screenshot of the fine-tuning view" >&2; exit 1; }
echo "saved $OUT_FT ($(wc -c <"$OUT_FT") bytes)"
(while curl -s --max-time 30 -o /dev/null -H 'Content-Type: application/json' "$URL/v1/completions" \
        -d '{"prompt":"Once upon a time","max_tokens":48}'; do :; done) &
ZS_BGPIDS=$!
chrome 12000 --screenshot="$OUT_ENGINE" "$URL/?view=engine" >/dev/null
kill -TERM "$ZS_BGPIDS" 2>/dev/null; wait "$ZS_BGPIDS" 2>/dev/null; ZS_BGPIDS=""
[ -s "$OUT_ENGINE" ] || { echo "no screenshot of the engine view" >&2; exit 1; }
echo "saved $OUT_ENGINE ($(wc -c <"$OUT_ENGINE") bytes)"
