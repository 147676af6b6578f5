#!/bin/sh
# tests/gpu/make-kit.sh — `make gpu-kit`: prepares, on this machine, everything tests/gpu/run.sh
# needs on a bare GPU machine that has CUDA's driver and libraries but none of the Debian
# packages the build uses and no network. Writes the git-ignored folder gpu-kit/:
#   gpu-kit/bin/      zeroserve, test-cuda, test-backend-ops, test-embed, test-train-cuda, test-cuda-tree, e2e-gpu,
#                     bench-gpu, built here with
#                     nvcc (sm_80 and sm_90); cuBLAS and NCCL are loaded at run time, wherever the
#                     machine keeps them (engine/runtime/cublas-cuda.c, engine/comm/comm-nccl.c)
#   gpu-kit/lib/      the shared libraries those programs link that a bare machine may lack
#                     (jansson, libmicrohttpd and gnutls, liburing, OpenMPI, ... : the ldd closure
#                     minus glibc, libstdc++ and libgcc_s), copied from this machine
#   gpu-kit/shared/models/{stories260K,gpt2-bytes}   the fixtures, copied from $ZS_SHARED
#   gpu-kit/MANIFEST  what is in it, with sizes and the commit it was built from
# bin/ and lib/ travel packed as gpu-kit/kit.tar.gz (a third of their size: the eight programs
# each link the whole library statically), which run.sh unpacks where it runs; KIT_UNPACKED=1
# leaves them as folders. The device tool carries at most 64 MiB, working tree included, so the
# kit must stay under KIT_MAX_MIB (default: 62 less the tracked working tree); debug info and
# symbols are stripped unless KIT_DEBUG=1. Then, with the device tool:
#   run(command="OUT=$OUT sh tests/gpu/run.sh", carry=["gpu-kit"], timeout_s=540)
# Exit 0 kit written, 1 failed.
set -u
cd "$(dirname "$0")/../.." || exit 1
BUILD=${BUILD:-build}
SHARED=${ZS_SHARED:-../shared}
KIT=${KIT:-gpu-kit}
# the tracked tree travels with the kit: what is left of 64 MiB, less 2 for what grows meanwhile
TREE_MIB=$(( ($(git ls-files -z 2>/dev/null | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1) + 1048575) / 1048576 ))
MAX=${KIT_MAX_MIB:-$((62 - TREE_MIB))}
PROGS="zeroserve $BUILD/tests/test-cuda $BUILD/tests/test-backend-ops $BUILD/tests/test-embed $BUILD/tests/test-train-cuda $BUILD/tests/test-cuda-tree $BUILD/tests/gpu/e2e-gpu $BUILD/tests/gpu/bench-gpu"

command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ] ||
    { echo "make-kit: nvcc not found: the kit is built where the CUDA toolkit is" >&2; exit 1; }
make BUILD="$BUILD" CUDA=1 $PROGS || { echo "make-kit: the build failed" >&2; exit 1; }
for m in stories260K gpt2-bytes; do
    [ -f "$SHARED/models/$m/config.json" ] || { echo "make-kit: fixture $SHARED/models/$m missing (set ZS_SHARED)" >&2; exit 1; }
done

rm -rf "$KIT"
mkdir -p "$KIT/bin" "$KIT/lib" "$KIT/shared/models" || exit 1
for p in $PROGS; do cp "$p" "$KIT/bin/" || exit 1; done
# debug info doubles the programs' size, symbols add 7%; KIT_DEBUG=1 keeps both (cuda-gdb)
[ -n "${KIT_DEBUG:-}" ] || strip --strip-unneeded "$KIT"/bin/* || exit 1
# the libraries: every resolved dependency except the C runtime every Linux has, and the CUDA
# libraries (the machine's own, matched to its driver)
base='^(linux-vdso|ld-linux|libc|libm|libdl|librt|libpthread|libresolv|libutil|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt|libnccl)\.so'
for p in $PROGS; do
    ldd "$p" | awk '/=>/ && $3 ~ /^\// { print $1, $3 }'
done | sort -u | while read -r name path; do
    echo "$name" | grep -Eq "$base" && continue
    cp -L "$path" "$KIT/lib/$name" || exit 1
done
missing=$(for p in $PROGS; do LD_LIBRARY_PATH=$KIT/lib ldd "$p" | grep 'not found'; done | sort -u)
[ -z "$missing" ] || { echo "make-kit: unresolved libraries: $missing" >&2; exit 1; }
for m in stories260K gpt2-bytes; do
    mkdir -p "$KIT/shared/models/$m"
    for f in "$SHARED/models/$m"/*; do
        case $f in *.gguf) continue;; esac # not used by the GPU tests
        cp "$f" "$KIT/shared/models/$m/"
    done
done
{
    echo "zeroserve GPU kit, built $(date -u +%Y-%m-%dT%H:%M:%SZ) from $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet 2>/dev/null || echo '+changes')"
    echo "nvcc: $( (nvcc --version 2>/dev/null || /usr/local/cuda/bin/nvcc --version) | tail -1)"
    echo "runtime dependencies looked for on the machine: libcuda.so.1 (driver), libcublas.so.13, libnccl.so.2 (optional)"
    (cd "$KIT" && find . -type f | sort | xargs ls -l | awk '{ printf "%10d %s\n", $5, $9 }')
} > "$KIT/MANIFEST"
if [ -z "${KIT_UNPACKED:-}" ]; then
    tar -czf "$KIT/kit.tar.gz" -C "$KIT" bin lib && rm -rf "${KIT:?}/bin" "${KIT:?}/lib" ||
        { echo "make-kit: cannot pack bin/ and lib/" >&2; exit 1; }
fi
mib=$(du -sm "$KIT" | cut -f1)
echo "gpu kit: $KIT ($mib MiB; $(grep -c ' \./lib/' "$KIT/MANIFEST") libraries)"
[ "$mib" -le "$MAX" ] || { echo "make-kit: the kit is $mib MiB, over $MAX MiB (the device tool carries 64 MiB in all, the working tree's $TREE_MIB MiB included)" >&2; exit 1; }
echo "run it with the device tool: run(command=\"OUT=\$OUT sh tests/gpu/run.sh\", carry=[\"$KIT\"], timeout_s=540)"
