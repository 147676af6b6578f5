#!/bin/sh
# soak-svg.sh — draws the samples of tests/soak.sh as one self-contained SVG with awk: three
# small line charts over time (resident memory in MiB, open fds, KV blocks used and cached),
# each with its axes, tick labels, axis titles and the start and end values.
# Usage: sh tests/soak-svg.sh SAMPLES.csv OUT.svg [TITLE]
#   SAMPLES.csv: the header line, then t_s,rss_kb,fds,kv_used,kv_cached,... (soak.sh's columns).
# Exit: 0 written, 1 no samples / cannot write.
set -u
[ $# -ge 2 ] || { echo "usage: sh tests/soak-svg.sh SAMPLES.csv OUT.svg [TITLE]" >&2; exit 1; }
IN=$1 OUTF=$2 TITLE=${3:-zeroserve soak}
awk -F, -v title="$TITLE" '
function esc(s) { gsub(/&/, "\\&amp;", s); gsub(/</, "\\&lt;", s); gsub(/>/, "\\&gt;", s); return s }
function fmt(v) { return (v == int(v)) ? sprintf("%d", v) : sprintf("%.1f", v) }
# nice step for about 4 ticks over a span
function step(span,   e, m) {
    if (span <= 0) return 1
    e = 1; while (span / e > 10) e *= 10; while (span / e < 1) e /= 10
    m = span / e
    return (m > 5 ? 2 : (m > 2 ? 1 : 0.5)) * e
}
# chart K: series cols[K, 1..ns[K]] drawn at vertical offset Y0
function chart(k, y0,   lo, hi, i, j, s, c, x, y, pts, st, v, t, px, py) {
    lo = 1e300; hi = -1e300
    for (j = 1; j <= ns[k]; j++) for (i = 1; i <= n; i++) {
        c = cols[k, j]; if (val[i, c] == "") continue
        v = val[i, c] * scale[k]
        if (v < lo) lo = v; if (v > hi) hi = v
    }
    if (lo > hi) { lo = 0; hi = 1 }
    if (lo > 0 && lo < (hi - lo) * 0.5) lo = 0
    if (hi == lo) { hi = lo + 1; lo = lo > 1 ? lo - 1 : 0 }
    st = step(hi - lo); lo = int(lo / st) * st; if (lo > 0 && lo - int(lo) != 0) lo = int(lo)
    hi = (int(hi / st) + (hi / st > int(hi / st) ? 1 : 0)) * st; if (hi <= lo) hi = lo + st
    printf "<g transform=\"translate(0,%d)\">\n", y0
    printf "<text x=\"%d\" y=\"14\" class=\"h\">%s</text>\n", L, esc(name[k])
    printf "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" class=\"frame\"/>\n", L, TOP, W, H
    for (v = lo; v <= hi + st / 1e6; v += st) {
        py = TOP + H - (v - lo) / (hi - lo) * H
        printf "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" class=\"grid\"/>", L, py, L + W, py
        printf "<text x=\"%d\" y=\"%.1f\" class=\"yt\">%s</text>\n", L - 6, py + 4, fmt(v)
    }
    st = step(tmax - tmin)
    for (t = int(tmin / st) * st; t <= tmax; t += st) {
        if (t < tmin) continue
        px = L + (t - tmin) / (tmax - tmin) * W
        printf "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" class=\"grid\"/>", px, TOP, px, TOP + H
        printf "<text x=\"%.1f\" y=\"%d\" class=\"xt\">%s</text>\n", px, TOP + H + 14, fmt(t)
    }
    printf "<text x=\"%d\" y=\"%d\" class=\"xl\">time (s)</text>\n", L + W / 2, TOP + H + 30
    printf "<text transform=\"translate(14,%d) rotate(-90)\" class=\"xl\">%s</text>\n", TOP + H / 2, esc(unit[k])
    for (j = 1; j <= ns[k]; j++) {
        c = cols[k, j]; pts = ""; first = ""; last = ""
        for (i = 1; i <= n; i++) {
            if (val[i, c] == "") continue
            v = val[i, c] * scale[k]
            x = L + (tm[i] - tmin) / (tmax - tmin) * W
            y = TOP + H - (v - lo) / (hi - lo) * H
            pts = pts sprintf("%.1f,%.1f ", x, y)
            if (first == "") first = v; last = v
        }
        printf "<polyline points=\"%s\" class=\"s%d\"/>\n", pts, j
        printf "<text x=\"%d\" y=\"%d\" class=\"lg s%dt\">%s: start %s, end %s</text>\n", L + W + 10, TOP + 14 + (j - 1) * 34, j, esc(sname[k, j]), fmt(first), fmt(last)
    }
    printf "</g>\n"
}
NR == 1 { next }
$1 != "" { n++; tm[n] = $1; for (c = 2; c <= 5; c++) val[n, c] = $c }
END {
    if (n < 1) { print "soak-svg: no samples" > "/dev/stderr"; exit 1 }
    tmin = tm[1]; tmax = tm[n]; if (tmax <= tmin) tmax = tmin + 1
    L = 70; W = 560; TOP = 22; H = 130; CH = 200
    name[1] = "Resident memory (VmRSS)"; unit[1] = "MiB"; scale[1] = 1 / 1024; ns[1] = 1; cols[1, 1] = 2; sname[1, 1] = "RSS MiB"
    name[2] = "Open file descriptors"; unit[2] = "fds"; scale[2] = 1; ns[2] = 1; cols[2, 1] = 3; sname[2, 1] = "fds"
    name[3] = "KV cache blocks"; unit[3] = "blocks"; scale[3] = 1; ns[3] = 2
    cols[3, 1] = 4; sname[3, 1] = "used"; cols[3, 2] = 5; sname[3, 2] = "cached (prefix)"
    printf "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
    printf "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"900\" height=\"%d\" viewBox=\"0 0 900 %d\" font-family=\"sans-serif\" font-size=\"11\">\n", 40 + 3 * CH, 40 + 3 * CH
    printf "<style>.frame{fill:#fafafa;stroke:#444}.grid{stroke:#ddd}.yt{text-anchor:end}.xt{text-anchor:middle}.xl{text-anchor:middle;fill:#333}.h{font-weight:bold;font-size:12px}"
    printf ".s1{fill:none;stroke:#1f77b4;stroke-width:1.5}.s2{fill:none;stroke:#d62728;stroke-width:1.5;stroke-dasharray:4 2}.s1t{fill:#1f77b4}.s2t{fill:#d62728}</style>\n"
    printf "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
    printf "<text x=\"%d\" y=\"22\" font-size=\"14\" font-weight=\"bold\">%s (%d samples, %s s)</text>\n", L, esc(title), n, fmt(tmax - tmin)
    for (k = 1; k <= 3; k++) chart(k, 36 + (k - 1) * CH)
    printf "</svg>\n"
}' "$IN" >"$OUTF.tmp" && mv "$OUTF.tmp" "$OUTF"
