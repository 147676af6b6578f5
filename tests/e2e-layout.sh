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
echo "$pass passed, $fail failed"
[ $fail = 0 ]
