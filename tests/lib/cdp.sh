# shellcheck shell=bash
# cdp.sh — one page in headless Chromium driven in real time over the DevTools protocol
# (--remote-debugging-pipe: NUL-terminated JSON on fds 3 and 4), for the tests that must wait
# for something the page does in its own time, such as reading a whole token stream.
# --virtual-time-budget cannot: since Chromium 156 virtual time stops waiting once a streamed
# response has arrived, before the page has read it, so --dump-dom caught streams half read.
# Needs bash, jq and $CHROMIUM; the caller sources tests/lib/e2e.sh first ($T is its temp dir).

# zs_cdp_dom URL COND TIMEOUT_MS OUT: load URL, wait (real time) until the JavaScript expression
# COND is truthy or TIMEOUT_MS have passed, and write the page's outerHTML to OUT.
# Returns 0 when COND came true, 1 on a timeout, 2 when Chromium failed (its log in OUT.log).
zs_cdp_dom() {
    local url=$1 cond=$2 tmo=$3 out=$4 d id=0 cp tid sid expr rc=2 wait_s
    d=$(mktemp -d "$T/cdp.XXXXXX") || return 2
    mkfifo "$d/in" "$d/out" || return 2
    "$CHROMIUM" --headless=new --no-sandbox --disable-gpu --hide-scrollbars --no-first-run \
        --no-default-browser-check --user-data-dir="$d/profile" --window-size=1200,1000 \
        --remote-debugging-pipe 3<"$d/in" 4>"$d/out" 2>"$out.log" &
    cp=$!
    exec {wfd}>"$d/in" {rfd}<"$d/out"
    trap '' PIPE # a Chromium that died makes the writes fail, not kill the test
    wait_s=$((tmo / 1000 + 30))
    _cdp_send() { # METHOD PARAMS [SESSION]
        id=$((id + 1))
        printf '%s\0' "$(jq -cn --argjson id "$id" --arg m "$1" --argjson p "$2" --arg s "${3:-}" \
            '{id: $id, method: $m, params: $p} + (if $s == "" then {} else {sessionId: $s} end)')" >&"$wfd"
    }
    _cdp_recv() { # JQ_FILTER: the first message it accepts, or 1 after wait_s without one
        local msg
        while IFS= read -r -d '' -t "$wait_s" msg <&"$rfd"; do
            jq -e "$1" <<<"$msg" >/dev/null 2>&1 && { printf '%s' "$msg"; return 0; }
        done
        return 1
    }
    expr="new Promise((done) => { const t0 = Date.now(); const poll = () => {
            let ok = false; try { ok = !!($cond); } catch (_) {}
            if (ok || Date.now() - t0 > $tmo) done([ok, document.documentElement.outerHTML]);
            else setTimeout(poll, 50); }; poll(); })"
    if _cdp_send Target.createTarget '{"url": "about:blank"}' &&
        tid=$(_cdp_recv ".id == $id" | jq -er .result.targetId) &&
        _cdp_send Target.attachToTarget "$(jq -cn --arg t "$tid" '{targetId: $t, flatten: true}')" &&
        sid=$(_cdp_recv ".id == $id" | jq -er .result.sessionId) &&
        _cdp_send Page.enable '{}' "$sid" && _cdp_recv ".id == $id" >/dev/null &&
        _cdp_send Page.navigate "$(jq -cn --arg u "$url" '{url: $u}')" "$sid" && _cdp_recv ".id == $id" >/dev/null &&
        _cdp_recv '.method == "Page.loadEventFired"' >/dev/null &&
        _cdp_send Runtime.evaluate "$(jq -cn --arg e "$expr" '{expression: $e, awaitPromise: true, returnByValue: true}')" "$sid" &&
        _cdp_recv ".id == $id" | jq -e .result.result.value >"$d/res.json"; then
        jq -r '.[1]' "$d/res.json" >"$out"
        if [ "$(jq -r '.[0]' "$d/res.json")" = true ]; then rc=0; else rc=1; fi
        _cdp_send Browser.close '{}' && _cdp_recv ".id == $id" >/dev/null
    fi
    exec {wfd}>&- {rfd}<&-
    trap - PIPE
    kill "$cp" 2>/dev/null
    wait "$cp" 2>/dev/null
    rm -rf "$d"
    return $rc
}
