#!/bin/sh
# tests/gpu/dry-run.sh — `make gpu-dry-run`: proves, without a GPU, that tests/gpu/run.sh works
# on a bare machine from the kit alone. It builds (once, cached) a minimal Debian 12 root with
# debootstrap --variant=minbase: no -dev packages, no compiler, no make, no CUDA, none of the
# libraries the build installs; copies into it what the device tool would send (the tracked and
# untracked-not-ignored files, plus gpu-kit/ as named in carry); then, in a new network
# namespace (loopback only: no network) and a chroot into that root:
#   1. the kit's zeroserve generates the stories260K reference text on the CPU (the carried
#      libraries are enough to run it);
#   2. tests/gpu/run.sh runs as the device tool would run it and must stop at the no-device
#      exit (77, status "no_device" in gpu-summary.json, which was written at every step).
# Needs root (chroot, namespaces); downloads the Debian packages once (ZS_DEBIAN_MIRROR).
# ZS_DRYRUN_ROOT (default /var/tmp/zs-gpu-dryrun-root) keeps the root between runs.
# Exit 0 pass, 1 fail, 77 not root.
set -u
cd "$(dirname "$0")/../.." || exit 1
ROOT=${ZS_DRYRUN_ROOT:-/var/tmp/zs-gpu-dryrun-root}
MIRROR=${ZS_DEBIAN_MIRROR:-http://deb.debian.org/debian}
KIT=${KIT:-gpu-kit}
[ "$(id -u)" = 0 ] || { echo "SKIP: the dry run needs root (chroot, unshare)"; exit 77; }
[ -x "$KIT/bin/zeroserve" ] || [ -f "$KIT/kit.tar.gz" ] || { echo "FAIL: no $KIT/ (make gpu-kit)"; exit 1; }
pass=0; fail=0
check() { if eval "$2"; then pass=$((pass+1)); echo "ok - $1"; else fail=$((fail+1)); echo "not ok - $1"; fi; }

if [ ! -x "$ROOT/bin/sh" ]; then
    command -v debootstrap >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >/dev/null ||
        { echo "FAIL: cannot install debootstrap"; exit 1; }
    echo "== debootstrap --variant=minbase bookworm $ROOT"
    rm -rf "$ROOT.tmp"
    timeout 900 debootstrap --variant=minbase bookworm "$ROOT.tmp" "$MIRROR" >/tmp/zs-dryrun-debootstrap.log 2>&1 ||
        { tail -20 /tmp/zs-dryrun-debootstrap.log; echo "FAIL: debootstrap"; exit 1; }
    mv "$ROOT.tmp" "$ROOT"
fi
devpk=$(chroot "$ROOT" dpkg-query -W -f '${Package}\n' | grep -E -- '-dev$|^(gcc|gcc-[0-9]+|cpp|make|jq|curl)$|^(libjansson|libmicrohttpd|liburing|libopenblas|libopenmpi)' | tr '\n' ' ')
check "the root has no -dev packages, compiler, make or the build's libraries ($devpk)" '[ -z "$devpk" ]'
check "the root has no CUDA" '[ ! -e "$ROOT/usr/local/cuda" ] && ! chroot "$ROOT" sh -c "command -v nvcc" >/dev/null'

# what the device tool sends: the working tree (tracked and untracked-not-ignored) and the carry
W=$ROOT/work/zeroserve
rm -rf "$ROOT/work" "$ROOT/tmp/out"
mkdir -p "$W" "$ROOT/tmp/out"
{ git ls-files; git ls-files -o --exclude-standard; } | sort -u | while read -r f; do
    [ -e "$f" ] && printf '%s\n' "$f"
done | tar -cf - -T - | tar -C "$W" -xf - || { echo "FAIL: copying the tree"; exit 1; }
cp -a "$KIT" "$W/" || exit 1
echo "== sent $(du -sm "$W" | cut -f1) MiB (the device tool carries 64 MiB)"
check "what travels fits the device tool's 64 MiB" '[ "$(du -sm "$W" | cut -f1)" -lt 64 ]'

inroot() { # command...: in the root, no network, /proc and /dev mounted
    unshare --net --mount --fork sh -c 'mount -t proc proc "$0/proc" && mount --bind /dev "$0/dev" &&
        exec chroot "$0" /usr/bin/env -i PATH=/usr/bin:/bin HOME=/root sh -c "$1"' "$ROOT" "$*"
}
net=$(inroot 'cat /proc/net/dev' | awk -F: 'NR > 2 { gsub(/ /, "", $1); print $1 }' | tr '\n' ' ')
check "no network in the dry run (interfaces: $net)" '[ "$net" = "lo " ]'
got=$(inroot 'cd /work/zeroserve && { [ -x gpu-kit/bin/zeroserve ] || tar -xzf gpu-kit/kit.tar.gz -C gpu-kit; } && LD_LIBRARY_PATH=gpu-kit/lib ZS_LOG=error gpu-kit/bin/zeroserve generate --model models/stories260K --prompt "Once upon a time" --max-tokens 16 --temperature 0')
echo "# kit zeroserve in the root: $got"
want=$(ZS_LOG=error ZS_DEVICE=cpu ./zeroserve generate --model models/stories260K --prompt "Once upon a time" --max-tokens 16 --temperature 0)
check "the kit's zeroserve runs in the bare root (the same stories260K greedy text as here: $want)" \
    '[ -n "$got" ] && [ "$got" = "$want" ]'

s=$(date +%s)
inroot 'cd /work/zeroserve && OUT=/tmp/out sh tests/gpu/run.sh' >/tmp/zs-dryrun-run.log 2>&1
rc=$?
t=$(( $(date +%s) - s ))
sed 's/^/    /' /tmp/zs-dryrun-run.log
sum=$ROOT/tmp/out/gpu-summary.json
check "run.sh stops at the no-device exit (exit 77; was $rc, ${t}s)" '[ $rc = 77 ]'
check "gpu-summary.json says no_device, kit mode, and the steps" \
    'grep -q "\"status\": \"no_device\"" "$sum" && grep -q "\"mode\": \"kit\"" "$sum" && grep -q "\"device\": {\"rc\": 77" "$sum"'
check "the run's log is there" '[ -s "$ROOT/tmp/out/gpu-run.log" ]'
echo "$pass passed, $fail failed"
[ $fail = 0 ]
