#!/bin/sh
# tests/gpu/emu/coverage.sh LOG — every kernel of kernels/cuda (each __global__ function) was
# launched at least once by the GPU tests on the emulated device: LOG holds the "program kernel
# count" lines that tests/gpu/emu/emu-runtime.cc appends at exit ($ZS_EMU_LAUNCH_LOG). Prints the
# launches of each test and of each kernel. Exit 0 all launched, 1 not (or no log), 77 no
# emulated device built.
cd "$(dirname "$0")/../../.." || exit 1
log=${1:-}
[ -n "$log" ] || { echo "usage: coverage.sh LOG"; exit 1; }
[ -s "$log" ] || { echo "not ok - no launches logged in $log (did the emulated tests run?)"; exit 1; }
# the kernels: the name after each __global__ (a __launch_bounds__(...) between them is skipped)
kernels=$(cat kernels/cuda/*.cu | tr '\n' ' ' | sed 's/__launch_bounds__([^)]*)//g' |
    grep -o '__global__[^(]*(' | sed 's/($//; s/.*[^A-Za-z0-9_]//' | sort -u)
launched=$(awk '$3 > 0 { n[$2] += $3 } END { for (k in n) print k, n[k] }' "$log" | sort)
echo "launches per test program (all its runs: plain, ASan, e2e-gpu on one device too):"
awk '{ n[$1] += $3; r[$1]++; if (!(($1, $2) in seen)) { seen[$1, $2] = 1; m[$1]++ } }
     END { for (p in n) printf "  %-22s %8d launches of %d kernels\n", p, n[p], m[p] }' "$log" | sort
echo "launches per kernel (all tests):"
echo "$launched" | awk '{ printf "  %-24s %8d\n", $1, $2 }'
missing=""
for k in $kernels; do
    echo "$launched" | grep -q "^$k " || missing="$missing $k"
done
total=$(echo "$kernels" | wc -w)
if [ -n "$missing" ]; then
    echo "not ok - kernels never launched on the emulated device:$missing"
    echo "0 passed, 1 failed"; exit 1
fi
echo "ok - all $total kernels of kernels/cuda were launched"
echo "1 passed, 0 failed"
