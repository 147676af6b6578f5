#!/bin/sh
# shellcheck shell=bash disable=SC2016,SC2034
# e2e-playground.sh — the playground page (GET /, clients/web/index.html) in headless Chromium
# against `zeroserve serve --data-dir` on stories260K: the chat and completion views still stream
# (?autosend=1), the fine-tuning view uploads pasted JSONL and starts jobs by itself
# (?view=finetune&jsonl=...&autostart=1; checked through the API: the file, the job's method and
# hyperparameters, its steps), shows a running job's loss curve and a finished one's (#ft-points:
# one point per step; #ft-status[data-status]), a running job's trained tokens/s (#ft-tps) and
# training's share and target as /metrics says (#ft-share), puts the fine-tuned model into the chat model
# picker, reports a bad upload, and the engine view plots samples of /metrics. Every page load
# must leave #js-errors (the page's uncaught errors) empty. Screenshots of the fine-tuning and
# engine views go to $BUILD/test-artifacts/playground-{finetune,engine}.png.
# Against a server with --api-key-file: the page loads without a key, the chat view answers with an
# inference key typed into its field, and the key stays out of the URL and localStorage
# (sessionStorage only); curl sends the page's request with and without the key.
#
# The chat and completion views are loaded in real time over the DevTools protocol
# (tests/lib/cdp.sh) until the page says its request is done: Chromium's virtual time stops
# waiting once a streamed response has arrived, before the page has read it. The other views run
# in virtual time (--virtual-time-budget): timers jump ahead, and only network fetches take real
# time. So the page is loaded once to start a job, the job is
# followed through the API in real time, and the page is loaded again (?job=ID) to check what it
# draws from the job's events: nothing depends on how fast the job trains.
#
# Installs Debian's chromium when it is missing and this runs as root with apt-get (about a
# minute); skips (77) otherwise, or without curl, jq or the fixture.
# Env: ZS_BIN (default ./zeroserve), ZS_SHARED (default ../shared), BUILD (default build),
# CHROMIUM. Exit: 0 all passed, 1 something failed, 77 skipped. (shellcheck SC2016, SC2034: the
# bodies of check are single-quoted and evaluated there.)
# shellcheck source=tests/lib/e2e.sh
. "$(dirname "$0")/lib/e2e.sh"
zs_bash "$@"
# shellcheck source=tests/lib/cdp.sh
. "$(dirname "$0")/lib/cdp.sh"
set -u
ART=$BUILD/test-artifacts
case $ART in /*) ;; *) ART=$ROOT/$ART;; esac
zs_need curl jq
zs_need_bin
zs_model stories260K

CHROMIUM=${CHROMIUM:-$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)}
if [ -z "$CHROMIUM" ]; then
    t0=$SECONDS
    zs_apt_install chromium && echo "# chromium installed in $((SECONDS - t0)) s" && CHROMIUM=$(command -v chromium)
    [ -n "$CHROMIUM" ] || { echo "skip: chromium not found (apt-get install -y chromium)"; exit 77; }
fi

zs_tmpdir e2e-play
zs_start_server "$T/server.log" --model "$MODEL" --data-dir "$T/data" --speculative ngram --spec-tokens 4 || zs_abort "server starts"
ok "server starts with --data-dir (and prompt lookup, for the tokens-per-pass plot)"
U=$ZS_URL
J() { curl -s -m 30 -H 'Content-Type: application/json' "$@"; }
uri() { jq -rn --arg s "$1" '$s | @uri'; }

# chrome N BUDGET_MS ARGS... URL: headless chromium with a fresh profile, its log in $T/chrome-N.log
chrome() {
    local n=$1 budget=$2
    shift 2
    timeout 120 "$CHROMIUM" --headless=new --no-sandbox --disable-gpu --hide-scrollbars --no-first-run \
        --no-default-browser-check --user-data-dir="$T/profile-$n" --window-size=1200,1000 \
        --virtual-time-budget="$budget" "$@" 2>"$T/chrome-$n.log"
}
NDOM=0
# dom BUDGET_MS PATH: the page's DOM after BUDGET_MS of virtual time, into $T/dom-N.html; DOM=that file
dom() {
    NDOM=$((NDOM + 1))
    DOM=$T/dom-$NDOM.html
    chrome "$NDOM" "$1" --dump-dom "$U$2" >"$DOM"
    [ -s "$DOM" ] || { echo "# chromium printed no DOM for $2:"; tail -n 20 "$T/chrome-$NDOM.log"; }
}
# dom_done PATH: load PATH in real time (tests/lib/cdp.sh) until the page's chat request has
# finished (body[data-state] set), 60 s at most; DOM=the page then
dom_done() {
    NDOM=$((NDOM + 1))
    DOM=$T/dom-$NDOM.html
    local rc=0
    zs_cdp_dom "$U$1" 'document.body.dataset.state' 60000 "$DOM" || rc=$?
    [ $rc = 0 ] && return 0
    echo "# $1: data-state '$(attr data-state)' (rc $rc: 1 timed out, 2 chromium failed); chromium's log:"
    tail -n 20 "$DOM.log"
    return 1
}
# shot BUDGET_MS FILE PATH
shot() {
    NDOM=$((NDOM + 1))
    mkdir -p "$(dirname "$2")"
    rm -f "$2"
    chrome "$NDOM" "$1" --screenshot="$2" "$U$3" >/dev/null 2>&1
    [ -s "$2" ]
}
attr() { grep -o "$1=\"[^\"]*\"" "$DOM" | head -1 | sed 's/^[^=]*="\(.*\)"$/\1/'; } # attr NAME (first in $DOM)
text_of() { sed -n "s/.*<[a-z0-9]* id=\"$1\"[^>]*>\([^<]*\)<.*/\1/p" "$DOM" | head -1; } # text_of ID
ft_status() { sed -n 's/.*<span class="badge" id="ft-status" data-status="\([^"]*\)".*/\1/p' "$DOM" | head -1; }
no_js_errors() { grep -q '<div id="js-errors" role="alert"></div>' "$DOM"; }
js_errors() { sed -n 's/.*<div id="js-errors" role="alert">\([^<]*\)<.*/\1/p' "$DOM" | head -3; }
unhtml() { sed -e 's/&lt;/</g' -e 's/&gt;/>/g' -e 's/&quot;/"/g' -e 's/&nbsp;/ /g' -e 's/&amp;/\&/g'; }

# ---------------------------------------------------------------- chat and completion (unchanged)
want=$(J "$U/v1/completions" -d '{"prompt":"Once upon a time","max_tokens":16,"temperature":0}' | jq -r '.choices[0].text')
dom_done "/?mode=completion&prompt=Once%20upon%20a%20time&max_tokens=16&temperature=0&autosend=1"
got=$(sed -n 's/.*<span class="prompt">Once upon a time<\/span><span>\([^<]*\)<\/span>.*/\1/p' "$DOM" | unhtml)
check "completion view: streams the greedy completion (state done)" \
    '[ "$(attr data-state)" = done ] && [ -n "$want" ] && [ "$got" = "$want" ]' "state $(attr data-state): '$got' vs '$want'"
check "completion view: no JS error" no_js_errors "$(js_errors)"
dom_done "/?prompt=Hello&max_tokens=8&temperature=0&autosend=1"
check "chat view: streams an answer (state done, tokens on the stats line)" \
    '[ "$(attr data-state)" = done ] && [ "$(attr data-view)" = chat ] && grep -q "</b> tokens/s</span>" "$DOM"' "state $(attr data-state)"
check "chat view: no JS error" no_js_errors "$(js_errors)"

# ---------------------------------------------------------------- fine-tuning view, no job yet
dom 4000 "/?view=finetune"
check "finetune view without jobs: 0 points, no JS error" \
    '[ "$(attr data-view)" = finetune ] && [ "$(text_of ft-points)" = 0 ] && grep -q "No jobs yet" "$DOM" && no_js_errors' "$(js_errors)"
check "finetune view: the base model is offered" 'grep -q "<select id=\"ft-model\"><option value=\"stories260K\">" "$DOM"'

# a bad upload: the server's 400 is shown, the page does not throw
dom 6000 "/?view=finetune&jsonl=$(uri 'this is not json')&autostart=1"
check "bad JSONL: the upload's 400 naming line 1 is shown (data-ft-start error), no JS error" \
    '[ "$(attr data-ft-start)" = error ] && grep -q "HTTP 400 — [^<]*line 1" "$DOM" && no_js_errors' \
    "start $(attr data-ft-start); $(js_errors)"

JSONL='{"prompt": "Once upon a time", "completion": " there was a purple dragon named Zork who loved pancakes."}
{"prompt": "Tom and his dog", "completion": " went to the moon in a red box."}
{"prompt": "The little bird", "completion": " sang a song about green apples."}
{"text": "Lily had a big blue kite. She flew it every day in the park."}'
ENC=$(uri "$JSONL")

# ---------------------------------------------------------------- a long LoRA job started by the page, followed live
dom 6000 "/?view=finetune&jsonl=$ENC&method=lora&lora_r=4&n_epochs=3000&batch_size=2&learning_rate_multiplier=3&suffix=live&ft_seed=3&autostart=1"
LIVE=$(attr data-ft-job)
check "autostart: the page uploads and starts a job (data-ft-start started)" \
    '[ "$(attr data-ft-start)" = started ] && case "$LIVE" in ftjob-*) true;; *) false;; esac' "start $(attr data-ft-start) job '$LIVE'; $(js_errors)"
check "autostart: no JS error" no_js_errors "$(js_errors)"
J "$U/v1/fine_tuning/jobs/$LIVE" >"$T/live.json"
FID=$(jq -r .training_file "$T/live.json")
check "API: the job has the page's settings (LoRA r 4, 3000 epochs, batch 2, x3, suffix, seed)" \
    'jq -e ".model == \"stories260K\" and .lora.r == 4 and .hyperparameters.n_epochs == 3000 and .hyperparameters.batch_size == 2 and .hyperparameters.learning_rate_multiplier == 3 and .user_provided_suffix == \"live\" and .seed == 3" "$T/live.json" >/dev/null' \
    "$(cat "$T/live.json")"
check "API: the pasted JSONL was uploaded as pasted.jsonl (4 lines)" \
    'J "$U/v1/files/$FID" | jq -e --argjson b "$(printf "%s\n" "$JSONL" | wc -c)" ".filename == \"pasted.jsonl\" and .bytes == \$b and .purpose == \"fine-tune\"" >/dev/null'
n_steps() { J "$U/v1/fine_tuning/jobs/$1/events?limit=10000" | jq '[.data[] | select(.data.step != null)] | length'; }
wait_steps() { # JOB N SECONDS
    local end=$((SECONDS + $3))
    while [ $SECONDS -lt "$end" ]; do
        [ "$(n_steps "$1")" -ge "$2" ] && return 0
        sleep 0.2
    done
    return 1
}
check "API: the job trains (5 steps)" 'wait_steps "$LIVE" 5 90'
dom 4000 "/?view=finetune&job=$LIVE"
pts=$(text_of ft-points)
check "running job: status running, a curve of several points ($pts), a path drawn, no JS error" \
    '[ "$(ft_status)" = running ] && [ "${pts:-0}" -ge 5 ] && grep -q "<path [^>]*id=\"ft-line\"" "$DOM" && no_js_errors' \
    "status $(ft_status); $(js_errors)"
tps=$(grep -o 'id="ft-tps" data-value="[^"]*"' "$DOM" | sed 's/.*data-value="\([^"]*\)"/\1/' | head -1)
check "running job: trained tokens/s shown (#ft-tps $tps > 0)" \
    '[ -n "$tps" ] && awk -v v="$tps" "BEGIN { exit !(v > 0) }"' "$(grep -o 'id="ft-facts".\{0,600\}' "$DOM" | head -1)"
ptarget=$(grep -o 'id="ft-share" data-share="[^"]*" data-target="[^"]*"' "$DOM" | sed 's/.*data-target="\([^"]*\)"/\1/' | head -1)
mtarget=$(curl -s "$U/metrics" | awk '$1 == "zeroserve_train_share_target" { print $2 }')
check "running job: the share achieved and its target from /metrics shown (#ft-share target $ptarget = $mtarget)" \
    '[ -n "$ptarget" ] && [ -n "$mtarget" ] && awk -v a="$ptarget" -v b="$mtarget" "BEGIN { exit !(a == b) }"' \
    "$(grep -o 'id="ft-facts".\{0,600\}' "$DOM" | head -1)"
code=$(curl -s -o /dev/null -w '%{http_code}' -X POST "$U/v1/fine_tuning/jobs/$LIVE/cancel")
check "cancel the live job (API)" '[ "$code" = 200 ]'

# ---------------------------------------------------------------- a short full fine-tune started by the page, to the end
dom 6000 "/?view=finetune&jsonl=$ENC&method=full&n_epochs=10&batch_size=2&learning_rate_multiplier=3&suffix=page&autostart=1"
JID=$(attr data-ft-job)
check "autostart (full): a job is started" '[ "$(attr data-ft-start)" = started ] && [ -n "$JID" ] && [ "$JID" != "$LIVE" ] && no_js_errors' \
    "start $(attr data-ft-start); $(js_errors)"
check "API: a full fine-tune (lora null), 10 epochs" \
    'J "$U/v1/fine_tuning/jobs/$JID" | jq -e ".lora == null and .hyperparameters.n_epochs == 10" >/dev/null'
wait_done() { # JOB SECONDS -> 0 when succeeded
    local end=$((SECONDS + $2)) st=""
    while [ $SECONDS -lt "$end" ]; do
        st=$(J "$U/v1/fine_tuning/jobs/$1" | jq -r .status)
        case $st in succeeded) return 0;; failed|cancelled) return 1;; esac
        sleep 0.2
    done
    return 1
}
check "API: the job succeeds" 'wait_done "$JID" 120' "$(J "$U/v1/fine_tuning/jobs/$JID" | jq -c '{status, error}')"
steps=$(n_steps "$JID")
FTM=$(J "$U/v1/fine_tuning/jobs/$JID" | jq -r .fine_tuned_model)
dom 4000 "/?view=finetune&job=$JID"
pts=$(text_of ft-points)
check "finished job: status succeeded, one point per step ($pts = $steps, > 1)" \
    '[ "$(ft_status)" = succeeded ] && [ "$steps" -gt 1 ] && [ "$pts" = "$steps" ]' "status $(ft_status)"
check "finished job: both jobs listed with their status" \
    'grep -q "<tr data-id=\"$JID\" data-status=\"succeeded\"" "$DOM" && grep -q "<tr data-id=\"$LIVE\" data-status=\"cancelled\"" "$DOM"'
check "finished job: its model ($FTM) is in the chat model picker, 'Use in chat' shown" \
    'grep -q "<option value=\"$FTM\">" "$DOM" && grep -q "<button id=\"ft-use\" class=\"small\" type=\"button\">" "$DOM"'
check "finished job: no JS error" no_js_errors "$(js_errors)"
check "screenshot of the fine-tuning view" 'shot 4000 "$ART/playground-finetune.png" "/?view=finetune&job=$JID"'
out=$(J "$U/v1/completions" -d "{\"model\":\"$FTM\",\"prompt\":\"Once upon a time\",\"temperature\":0,\"max_tokens\":8}" | jq -r '.choices[0].text')
dom_done "/?mode=completion&model=$(uri "$FTM")&prompt=Once%20upon%20a%20time&max_tokens=8&temperature=0&autosend=1"
got=$(sed -n 's/.*<span class="prompt">Once upon a time<\/span><span>\([^<]*\)<\/span>.*/\1/p' "$DOM" | unhtml)
check "completion view with the fine-tuned model" '[ "$(attr data-state)" = done ] && [ -n "$out" ] && [ "$got" = "$out" ] && no_js_errors' \
    "'$got' vs '$out'"

# ---------------------------------------------------------------- engine view
for _ in 1 2 3; do J "$U/v1/completions" -d '{"prompt":"Once upon a time","max_tokens":8}' >/dev/null; done
dom 6000 "/?view=engine"
ns=$(text_of engine-samples)
check "engine view: several samples of /metrics ($ns), data-engine ok" '[ "${ns:-0}" -ge 3 ] && [ "$(attr data-engine)" = ok ]'
seven_plots() {
    for m in tokens requests kv bytes stall prefix pass; do grep -q "data-metric=\"$m\"" "$DOM" || return 1; done
    [ "$(grep -o '<svg viewBox="0 0 320 96"' "$DOM" | wc -l)" = 7 ]
}
check "engine view: the seven plots" seven_plots
check "engine view: the requests plot reads the running gauge (0 now)" 'grep -q "data-metric=\"requests\" data-available=\"1\" data-value=\"0\"" "$DOM"'
pc=$(curl -s "$U/metrics" | grep -c '^zeroserve_prefix_cache_lookup_blocks_total ')
check "engine view: the prefix-cache plot is available exactly when /metrics has its counters ($pc)" \
    'grep -q "data-metric=\"prefix\" data-available=\"$pc\"" "$DOM"'
tpp=$(curl -s "$U/metrics" | awk '$1 == "zeroserve_passes_total" { n = $2 } $1 == "zeroserve_pass_tokens_total" { t = $2 } END { if (n > 0) printf "%.2f over %d passes", t / n, n }')
check "engine view: the tokens-per-pass plot is available and says the overall figure of /metrics ($tpp)" \
    '[ -n "$tpp" ] && grep -q "data-metric=\"pass\" data-available=\"1\"" "$DOM" && grep -q "overall $tpp" "$DOM"'
check "engine view: no JS error" no_js_errors "$(js_errors)"
(while :; do J "$U/v1/completions" -d '{"prompt":"Once upon a time","max_tokens":48}' >/dev/null || break; done) &
ZS_BGPIDS=$!
check "screenshot of the engine view (under load)" 'shot 10000 "$ART/playground-engine.png" "/?view=engine"'
kill -TERM "$ZS_BGPIDS" 2>/dev/null; wait "$ZS_BGPIDS" 2>/dev/null; ZS_BGPIDS=""

kill -TERM "$SPID"
for _ in $(seq 100); do kill -0 "$SPID" 2>/dev/null || break; sleep 0.1; done
check "SIGTERM stops the server" '! kill -0 "$SPID" 2>/dev/null'

# ---------------------------------------------------------------- a server with keys: the page needs none, its key field does
printf 'key-play-inf alice inference\n' >"$T/keys"
chmod 600 "$T/keys"
zs_start_server "$T/keys.log" --model "$MODEL" --api-key-file "$T/keys" --data-dir "$T/data-keys" || zs_abort "server with --api-key-file"
U=$ZS_URL
code=$(curl -s -m 30 -o "$T/page.html" -w '%{http_code}' "$U/")
check "with --api-key-file: GET / needs no key (200, the page with its key field)" \
    '[ "$code" = 200 ] && grep -q "<input id=\"apikey\" type=\"password\"" "$T/page.html"' "$code"
check "the page reads no key from its URL and keeps none in localStorage" \
    '! grep -q localStorage clients/web/index.html && ! grep -Eq "params\.(get|has)\(\"(key|api_key|apikey|token)\"\)" clients/web/index.html'
CHATP='{"model":"stories260K","messages":[{"role":"user","content":"Hello"}],"max_tokens":8,"stream":true,"stream_options":{"include_usage":true}}'
# the page's request as headers() builds it: Content-Type and Authorization: Bearer KEY
code=$(curl -s -m 60 -o "$T/keychat.txt" -w '%{http_code}' -H 'Content-Type: application/json' \
    -H 'Authorization: Bearer key-play-inf' -d "$CHATP" "$U/v1/chat/completions")
check "the page's chat request with an inference key: 200, a stream to [DONE]" \
    '[ "$code" = 200 ] && grep -q "^data: \[DONE\]" "$T/keychat.txt"' "$code $(head -c 200 "$T/keychat.txt")"
code=$(curl -s -m 30 -o /dev/null -w '%{http_code}' -H 'Content-Type: application/json' -d "$CHATP" "$U/v1/chat/completions")
check "the same request without the key: 401" '[ "$code" = 401 ]'
# in Chromium: the key typed into the field (its change event), the model list loaded with it, then Send
NDOM=$((NDOM + 1))
DOM=$T/dom-$NDOM.html
KCOND='(window.__zsk || (window.__zsk = 1, $("apikey").value = "key-play-inf", $("apikey").dispatchEvent(new Event("change")),
  loadModels().then(send), 0)) && document.body.dataset.state && (document.body.dataset.keyInUrl = String(location.href.includes("key-play-inf")),
  document.body.dataset.keyKept = sessionStorage.getItem("zs-api-key") === "key-play-inf" ? "session" : "no",
  document.body.dataset.localItems = String(localStorage.length), 1)'
rc=0
zs_cdp_dom "$U/?prompt=Hello&max_tokens=8&temperature=0" "$KCOND" 60000 "$DOM" || rc=$?
check "chat view with the key typed in: the answer streams (state done), no JS error" \
    '[ $rc = 0 ] && [ "$(attr data-state)" = done ] && grep -q "</b> tokens/s</span>" "$DOM" && no_js_errors' \
    "rc $rc, state $(attr data-state); $(js_errors)"
check "the key is in sessionStorage only: not in the URL, nothing in localStorage" \
    '[ "$(attr data-key-in-url)" = false ] && [ "$(attr data-key-kept)" = session ] && [ "$(attr data-local-items)" = 0 ]' \
    "in url $(attr data-key-in-url), kept $(attr data-key-kept), local $(attr data-local-items)"
zs_stop_server
zs_done
