#!/bin/sh
# e2e-gpu-kit.sh — keeps the GPU kit from rotting between the sessions that get a GPU: builds the
# kit (tests/gpu/make-kit.sh) into a temp folder, checks that it travels packed (kit.tar.gz) and
# its size against the device tool's 64 MiB, unpacks it, checks its contents, that every program in it resolves its libraries from the kit alone plus the C
# runtime (ldd with the system's other libraries hidden), and runs tests/gpu/run.sh from it packed
# again (run.sh unpacks it) here:
# with no GPU it must stop at the no-device exit (77) with a summary that says so.
# The full proof on a bare root with no network is `make gpu-dry-run` (root, downloads once).
# Exit 0 pass, 1 fail, 77 skipped (no nvcc: a build without CUDA has no kit).
# shellcheck source=tests/lib/e2e.sh
. "$(dirname "$0")/lib/e2e.sh"
command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ] || { echo "skip: no nvcc"; exit 77; }
zs_tmpdir gpu-kit

KIT=$T/kit BUILD=$BUILD sh tests/gpu/make-kit.sh >"$T/make-kit.log" 2>&1
rc=$?
tail -3 "$T/make-kit.log"
check "make-kit builds the kit" '[ $rc = 0 ]'
[ $rc = 0 ] || { cat "$T/make-kit.log"; zs_done; }
tree=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
kit=$(du -sb "$T/kit" | cut -f1)
echo "# working tree $((tree / 1048576)) MiB + kit $((kit / 1048576)) MiB (packed)"
check "the kit travels packed (kit.tar.gz, no bin/ or lib/ beside it)" '[ -f "$T/kit/kit.tar.gz" ] && [ ! -e "$T/kit/bin" ] && [ ! -e "$T/kit/lib" ]'
check "tree + kit fit the device tool's 64 MiB" '[ $((tree + kit)) -lt $((64 * 1048576)) ]'
tar -xzf "$T/kit/kit.tar.gz" -C "$T/kit"
for p in zeroserve test-cuda test-backend-ops test-embed test-train-cuda test-cuda-tree e2e-gpu bench-gpu; do
    check "the kit has bin/$p" '[ -x "$T/kit/bin/$p" ]'
done
check "the kit has the fixtures" '[ -f "$T/kit/shared/models/stories260K/model.safetensors" ] && [ -f "$T/kit/shared/models/gpt2-bytes/reference.json" ]'
# with only the kit's libraries and the C runtime: copy the C runtime into a folder of its own
# and make ldd resolve against it and the kit, nothing else
mkdir -p "$T/crt"
for l in $(ldd "$T/kit/bin/zeroserve" | awk '/=>/ { print $3 }'); do
    case $(basename "$l") in libc.so*|libm.so*|libdl.so*|librt.so*|libpthread.so*|libstdc++.so*|libgcc_s.so*) cp -L "$l" "$T/crt/";; esac
done
unres=""
for p in "$T"/kit/bin/*; do
    out=$(env -i LD_LIBRARY_PATH="$T/kit/lib:$T/crt" /lib64/ld-linux-x86-64.so.2 --inhibit-cache --list "$p" 2>&1)
    bad=$(echo "$out" | grep 'not found\|/usr/lib\|/lib/x86_64' | grep -v "$T" | grep -v 'ld-linux')
    [ -n "$bad" ] && unres="$unres $(basename "$p"): $bad;"
done
check "every kit program resolves its libraries from the kit and the C runtime alone${unres:+ ($unres)}" '[ -z "$unres" ]'

# run.sh in kit mode (a copy of the tree with the kit in place)
mkdir -p "$T/tree"
git ls-files | tar -cf - -T - | tar -C "$T/tree" -xf -
rm -rf "$T/kit/bin" "$T/kit/lib" # packed again, as it travels: run.sh unpacks it
mv "$T/kit" "$T/tree/gpu-kit"
OUT=$T/out DEADLINE=120 sh "$T/tree/tests/gpu/run.sh" >"$T/run.log" 2>&1
rc=$?
cat "$T/run.log"
check "run.sh from the kit stops at the no-device exit here (77; was $rc)" '[ $rc = 77 ]'
check "its summary says no_device in kit mode" \
    'grep -q "\"status\": \"no_device\"" "$T/out/gpu-summary.json" && grep -q "\"mode\": \"kit\"" "$T/out/gpu-summary.json"'
zs_done
