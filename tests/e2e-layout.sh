#!/bin/sh
# e2e-layout.sh — keeps docs/ARCHITECTURE.md's dependency rules true: every #include "x.h" of a
# file in engine/, kernels/ or offload/ is resolved to the folder that holds x.h, and a folder may
# include only from its own level or lower ones:
#   0  engine/base
#   1  kernels/cpu, kernels/cuda, offload        (numeric ops and storage: base only)
#   2  engine/model, engine/text, engine/comm    (not each other)
#   3  engine/runtime
#   4  engine/train
#   5  server
# Also: every source file under engine/ kernels/ offload/ server/ is named in ARCHITECTURE.md's
# tables, and no folder is left in engine/ that the page does not describe.
# And, from the object files (nm): no two files call into each other, within a room or across
# rooms, and no longer cycle of calls either (A uses B's, B uses C's, C uses A's). The objects
# are those of $BUILD/libzs.a (the CUDA ones when the archive holds them) and server/main.o;
# missing or older than their sources, they are built first (make), and the check fails if they
# cannot be. Symbols are what each object defines (nm -g: text, data) and leaves undefined.
# Exit 0 pass, 1 fail.
cd "$(dirname "$0")/.." || exit 1
fail=0; pass=0
level() {
    case $1 in
    engine/base) echo 0;; kernels/cpu|kernels/cuda|offload) echo 1;;
    engine/model|engine/text|engine/comm) echo 2;; engine/runtime) echo 3;; engine/train) echo 4;;
    server) echo 5;; *) echo 9;;
    esac
}
dirs="engine/base engine/model engine/text engine/comm engine/runtime engine/train kernels/cpu kernels/cuda offload server"
for d in engine/*/; do
    d=${d%/}
    case " $dirs " in *" $d "*) ;; *) echo "not ok - $d is not one of the rooms ARCHITECTURE.md describes"; fail=$((fail+1));; esac
done
bad=""
for d in $dirs; do
    ld=$(level "$d")
    for f in "$d"/*.c "$d"/*.h "$d"/*.cu "$d"/*.cuh; do
        [ -f "$f" ] || continue
        for h in $(sed -n 's/^#include "\([^"]*\)".*/\1/p' "$f"); do
            b=$(basename "$h")
            hd=""
            for e in $dirs; do [ -f "$e/$b" ] && hd=$e && break; done
            [ -n "$hd" ] || continue # generated or system-like headers
            [ "$hd" = "$d" ] && continue
            lh=$(level "$hd")
            if [ "$lh" -gt "$ld" ] || { [ "$lh" = "$ld" ] && [ "$ld" != 1 ]; }; then
                bad="$bad $f->$hd/$b"
            fi
        done
    done
done
if [ -z "$bad" ]; then pass=$((pass+1)); echo "ok - includes run one way (base <- kernels/offload <- model/text/comm <- runtime <- train <- server)"
else fail=$((fail+1)); echo "not ok - includes against the rooms' order:$bad"; fi
missing=""
for d in $dirs; do
    for f in "$d"/*.c "$d"/*.cu; do
        [ -f "$f" ] || continue
        n=$(basename "$f"); n=${n%.*}
        grep -q "$n" docs/ARCHITECTURE.md || missing="$missing $f"
    done
done
if [ -z "$missing" ]; then pass=$((pass+1)); echo "ok - every source file is on the map"
else fail=$((fail+1)); echo "not ok - not in docs/ARCHITECTURE.md:$missing"; fi

# ---- calls between object files run one way ----
B=${BUILD:-build}
lib=$B/libzs.a
# candidates: "object source kind" (kind 1: always in libzs.a; 0: CUDA, when the archive holds
# it; main: the server's main.o, linked beside the archive)
cands=$(
    for d in $dirs; do
        for f in "$d"/*.c "$d"/*.cu; do
            [ -f "$f" ] || continue
            k=1
            case $f in server/main.c) k=main;; *-cuda.c|*-nccl.c|*.cu) k=0;; esac
            echo "$B/${f%.*}.o $f $k"
        done
    done
    echo "$B/gen/playground.o $B/gen/playground.c 1"
    echo "$B/gen/openapi.o $B/gen/openapi.c 1")
stale() { # the objects that must exist are missing or older than their sources
    [ -f "$lib" ] || return 0
    printf '%s\n' "$cands" | while read -r o f k; do
        [ "$k" = 0 ] && continue
        if [ ! -f "$o" ] || [ "$f" -nt "$o" ]; then echo "$o"; fi
    done | grep -q .
}
built=1
if stale; then
    echo "# building the objects first: make $lib $B/server/main.o"
    make --no-print-directory -s BUILD="$B" "$lib" "$B/server/main.o" >/dev/null 2>&1 || built=0
    stale && built=0
fi
if [ $built = 0 ]; then
    fail=$((fail+1)); echo "not ok - the objects to check calls in cannot be built (run make BUILD=$B $lib $B/server/main.o)"
else
    # "object source" of each object checked: kind 1 and main always; a CUDA object when the
    # archive holds more members of its name than the other objects of that name
    map=$(printf '%s\n' "$cands" | awk -v members="$(ar t "$lib" | tr '\n' ' ')" '
        BEGIN { n = split(members, m, " "); for (i = 1; i <= n; i++) left[m[i]]++ }
        function base(p) { sub(/.*\//, "", p); return p }
        { o[NR] = $1; s[NR] = $2; k[NR] = $3 }
        END {
            for (i = 1; i <= NR; i++) if (k[i] == 1) { left[base(o[i])]--; print o[i], s[i] }
            for (i = 1; i <= NR; i++) if (k[i] == "main") print o[i], s[i]
            for (i = 1; i <= NR; i++) if (k[i] == 0 && left[base(o[i])] > 0) { left[base(o[i])]--; print o[i], s[i] }
            for (b in left) if (left[b] > 0) printf "# note - libzs.a also holds %s, which no source here makes (a stale archive)\n", b > "/dev/stderr"
        }')
    # edges A -> B (A uses symbols B defines); a pair of opposite edges is a failure, and so is a
    # cycle through more files (a strongly connected component of more than two)
    res=$(printf '%s\n' "$map" | awk '{print $1}' | xargs nm -A -P -g 2>/dev/null | awk '
        NR == FNR { src[$1] = $2; next }
        {
            f = $1; sub(/:$/, "", f)
            if (!(f in src)) next
            if ($3 == "U" || $3 == "w" || $3 == "v") uses[f] = uses[f] " " $2
            else defs[$2] = defs[$2] " " f
        }
        function base(p) { sub(/.*\//, "", p); return p }
        function first(l) { sub(/,.*/, "", l); return l }
        function tarjan(v,    n, i, w, ws, c, members) {
            num[v] = low[v] = ++idx; stk[++top] = v; on[v] = 1
            n = split(adj[v], ws, " ")
            for (i = 1; i <= n; i++) {
                w = ws[i]
                if (!(w in num)) { tarjan(w); if (low[w] < low[v]) low[v] = low[w] }
                else if (on[w] && num[w] < low[v]) low[v] = num[w]
            }
            if (low[v] != num[v]) return
            c = 0; members = ""
            do { w = stk[top--]; on[w] = 0; comp[w] = v; c++; members = members " " src[w] } while (w != v)
            if (c > 2) printf "not ok - %d files call round in a cycle:%s (one: %s)\n", c, members, cycle(v)
        }
        function cycle(v,    q, h, t, n, i, w, ws, prev, seen, path, x) { # the shortest cycle through v
            h = 1; t = 0; q[++t] = v
            while (h <= t) {
                x = q[h++]; n = split(adj[x], ws, " ")
                for (i = 1; i <= n; i++) {
                    w = ws[i]
                    if (comp[w] != v) continue
                    if (w == v) {
                        path = src[v] " (" first(edge[x, v]) ")"
                        while (x != v) { path = src[x] " (" first(edge[prev[x], x]) ") -> " path; x = prev[x] }
                        return src[v] " -> " path
                    }
                    if (!(w in seen)) { seen[w] = 1; prev[w] = x; q[++t] = w }
                }
            }
            return "?"
        }
        END {
            for (f in uses) {
                n = split(uses[f], us, " ")
                for (i = 1; i <= n; i++) {
                    m = split(defs[us[i]], ds, " ")
                    for (j = 1; j <= m; j++) {
                        g = ds[j]
                        if (g == f) continue
                        if ((f, g) in edge) edge[f, g] = edge[f, g] ", " us[i]
                        else { edge[f, g] = us[i]; adj[f] = adj[f] " " g }
                    }
                }
            }
            for (e in edge) {
                split(e, p, SUBSEP)
                if (src[p[1]] < src[p[2]] && ((p[2], p[1]) in edge))
                    printf "not ok - %s <-> %s: %s uses %s; %s uses %s\n", src[p[1]], src[p[2]], base(src[p[1]]),
                           edge[p[1], p[2]], base(src[p[2]]), edge[p[2], p[1]]
            }
            for (v in src) if (!(v in num)) tarjan(v)
            nf = 0; for (v in src) nf++
            ne = 0; for (e in edge) ne++
            printf "# %d objects, %d edges\n", nf, ne
        }' /dev/fd/3 - 3<<EOF
$map
EOF
)
    printf '%s\n' "$res" | sort
    if printf '%s\n' "$res" | grep -q '^not ok'; then
        fail=$((fail+1))
    else
        pass=$((pass+1)); echo "ok - no two object files call into each other, and calls run round no cycle"
    fi
fi
echo "$pass passed, $fail failed"
[ $fail = 0 ]
