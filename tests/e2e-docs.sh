#!/bin/sh
# e2e-docs.sh — keeps the documentation's links working: every relative markdown link
# [text](path) or [text](path#anchor) in README.md and docs/*.md must name a file or folder that
# exists (relative to the linking file), and an #anchor must match a heading of the target under
# GitHub's slug rule (lowercase; spaces to '-'; everything but letters, digits, '-' and '_' removed;
# a repeated heading gets -1, -2, ...). http(s) and mailto links are skipped, and so is text in
# code (fenced blocks and `spans`). Also: README.md stays a landing page of at most 300 lines.
# Exit 0 pass, 1 fail.
cd "$(dirname "$0")/.." || exit 1
pass=0; fail=0
T=$(mktemp -d /tmp/zs-e2e-docs.XXXXXX) || exit 1
trap 'rm -rf "$T"' EXIT INT TERM

# links FILE: "LINE TARGET" for every link outside code
links() {
    awk '
    /^[ \t]*(```|~~~)/ { fence = !fence; next }
    fence { next }
    {
        s = $0
        gsub(/`[^`]*`/, "", s)
        while ((i = index(s, "](")) > 0) {
            s = substr(s, i + 2)
            j = index(s, ")")
            if (j == 0) break
            t = substr(s, 1, j - 1)
            sub(/^[ \t<]+/, "", t); sub(/[ \t].*$/, "", t); sub(/>$/, "", t)
            if (t != "") print NR, t
            s = substr(s, j + 1)
        }
    }' "$1"
}

# slugs FILE: the anchor of every heading outside code, one a line
slugs() {
    awk '
    /^[ \t]*(```|~~~)/ { fence = !fence; next }
    fence { next }
    /^#+[ \t]/ {
        h = $0
        sub(/^#+[ \t]+/, "", h); sub(/[ \t]+#*[ \t]*$/, "", h)
        h = tolower(h)
        gsub(/[^a-z0-9 _-]/, "", h)
        gsub(/ /, "-", h)
        if (h in seen) { n = ++seen[h]; print h "-" n } else { seen[h] = 0; print h }
    }' "$1"
}

for f in README.md docs/*.md; do
    [ -f "$f" ] || continue
    dir=$(dirname "$f")
    links "$f" >"$T/links"
    n=0; bad=0
    while read -r line target; do
        case $target in http://*|https://*|mailto:*) continue;; esac
        n=$((n + 1))
        path=${target%%#*}
        anchor=""
        case $target in *'#'*) anchor=${target#*#};; esac
        if [ -z "$path" ]; then file=$f; else file=$dir/$path; fi
        if [ ! -e "$file" ]; then
            echo "not ok - $f:$line: $target: $path does not exist"; bad=$((bad + 1)); continue
        fi
        if [ -n "$anchor" ]; then
            if [ ! -f "$file" ] || ! slugs "$file" | grep -qxF "$anchor"; then
                echo "not ok - $f:$line: $target: no heading with the anchor #$anchor in ${path:-$(basename "$f")}"; bad=$((bad + 1))
            fi
        fi
    done <"$T/links"
    if [ $bad = 0 ]; then pass=$((pass + 1)); echo "ok - $f: $n relative links resolve"
    else fail=$((fail + 1)); fi
done

lines=$(wc -l <README.md)
if [ "$lines" -le 300 ]; then pass=$((pass + 1)); echo "ok - README.md has $lines lines (at most 300)"
else fail=$((fail + 1)); echo "not ok - README.md has $lines lines: a landing page has at most 300, the rest goes into docs/"; fi

echo "$pass passed, $fail failed"
[ $fail = 0 ]
