#!/bin/sh
# deploy-container.sh — `make test-deploy`: builds deploy/Dockerfile with podman and runs it.
#   1. installs podman, runc, debootstrap from Debian when missing (as root)
#   2. builds a local Debian 12 base image debian:bookworm-slim with debootstrap (no registry
#      access needed; skipped when the image exists; ZS_REBASE=1 rebuilds it)
#   3. podman build --network host --format docker -f deploy/Dockerfile -t zeroserve:test .
#   4. runs it with $ZS_SHARED/models/stories260K at /models/stories260K, ZS_MODEL=stories260K and
#      an API key, waits for /health, runs clients/curl/health.sh, models.sh, complete.sh
#   5. podman stop (SIGTERM): the container must exit 0 within the grace time
# Prints the time each step took. Exit 0 pass, 1 fail, 77 skip (not root / no podman).
# ZS_DEBIAN_MIRROR (default http://deb.debian.org/debian), ZS_DEPLOY_PORT (default 18080).
set -u
cd "$(dirname "$0")/.." || exit 1
t0=$(date +%s)
step() { echo "== $* ($(( $(date +%s) - t0 )) s)"; }
SHARED=${ZS_SHARED:-../shared}
MODEL=$SHARED/models/stories260K
PORT=${ZS_DEPLOY_PORT:-18080}
MIRROR=${ZS_DEBIAN_MIRROR:-http://deb.debian.org/debian}
IMAGE=zeroserve:test
NAME=zeroserve-deploy-test
KEY=deploy-test-key
[ -d "$MODEL" ] || { echo "SKIP: no $MODEL"; exit 77; }
work=$(mktemp -d /tmp/zs-deploy-test.XXXXXX) || exit 1

if ! command -v podman >/dev/null || ! command -v debootstrap >/dev/null; then
    if [ "$(id -u)" != 0 ]; then echo "SKIP: needs podman and debootstrap (apt-get install podman runc debootstrap)"; exit 77; fi
    step "installing podman runc debootstrap"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q podman runc debootstrap >"$work/apt.log" 2>&1 ||
        { apt-get update -q >/dev/null 2>&1 &&
          DEBIAN_FRONTEND=noninteractive apt-get install -y -q podman runc debootstrap >"$work/apt.log" 2>&1; } ||
        { tail -20 "$work/apt.log"; echo "SKIP: could not install podman"; exit 77; }
fi
[ "$(id -u)" = 0 ] || { echo "SKIP: run as root (rootful podman)"; exit 77; }
# nested containers here cannot set rlimits: no default ulimits
printf '[containers]\ndefault_ulimits = []\n' > "$work/containers.conf"
export CONTAINERS_CONF="$work/containers.conf"

cleanup() {
    podman rm -f -t 0 "$NAME" >/dev/null 2>&1
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

if [ "${ZS_REBASE:-0}" != 0 ] || ! podman image exists debian:bookworm-slim; then
    step "debootstrap --variant=minbase bookworm ($MIRROR)"
    timeout 900 debootstrap --variant=minbase bookworm "$work/rootfs" "$MIRROR" >"$work/debootstrap.log" 2>&1 ||
        { tail -20 "$work/debootstrap.log"; echo "FAIL: debootstrap (mirror slow or unreachable?)"; exit 1; }
    step "podman import → debian:bookworm-slim"
    tar -C "$work/rootfs" -c . | podman import - debian:bookworm-slim >/dev/null || { echo "FAIL: podman import"; exit 1; }
    rm -rf "$work/rootfs"
fi

step "podman build -f deploy/Dockerfile"
timeout 1500 podman build --network host --format docker --pull=never -f deploy/Dockerfile -t "$IMAGE" . \
    >"$work/build.log" 2>&1 || { tail -40 "$work/build.log"; echo "FAIL: podman build"; exit 1; }
podman image inspect --format '{{.Size}}' "$IMAGE" | awk '{ printf "image size %.1f MiB\n", $1 / 1048576 }'
podman image inspect --format '{{.Config.User}} {{json .Config.Healthcheck}}' "$IMAGE" 2>/dev/null ||
    podman inspect --format '{{.Config.User}}' "$IMAGE"

step "podman run"
podman rm -f -t 0 "$NAME" >/dev/null 2>&1
podman run -d --name "$NAME" --network host \
    -v "$(cd "$MODEL" && pwd):/models/stories260K:ro" \
    -e ZS_MODEL=stories260K -e ZS_API_KEY="$KEY" -e ZS_PORT="$PORT" -e ZS_DEVICE=cpu \
    "$IMAGE" >/dev/null || { echo "FAIL: podman run"; exit 1; }
export ZS_URL="http://127.0.0.1:$PORT" ZS_API_KEY="$KEY"
ok=0
for _ in $(seq 1 120); do
    if curl -fsS "$ZS_URL/health" >/dev/null 2>&1; then ok=1; break; fi
    [ "$(podman inspect --format '{{.State.Running}}' "$NAME")" = true ] || break
    sleep 0.5
done
if [ $ok != 1 ]; then podman logs "$NAME" 2>&1 | tail -30; echo "FAIL: /health never answered 200"; exit 1; fi
step "healthy; smoke test"
fail=0
out=$(sh clients/curl/health.sh) && echo "health: $out" || { echo "FAIL: health.sh"; fail=1; }
out=$(sh clients/curl/models.sh) && echo "models: $out" || { echo "FAIL: models.sh: $out"; fail=1; }
echo "$out" | grep -q '"stories260K"' || { echo "FAIL: /v1/models does not list stories260K"; fail=1; }
out=$(ZS_MAX_TOKENS=16 ZS_TEMPERATURE=0 sh clients/curl/complete.sh "Once upon a time") &&
    echo "complete: $out" || { echo "FAIL: complete.sh: $out"; fail=1; }
echo "$out" | grep -q '"text_completion"' || { echo "FAIL: not a text_completion"; fail=1; }
code=$(curl -s -o /dev/null -w '%{http_code}' "$ZS_URL/v1/models")
[ "$code" = 401 ] && echo "no key: 401" || { echo "FAIL: no key gave $code, not 401"; fail=1; }
uid=$(podman exec "$NAME" id -u) && [ "$uid" != 0 ] && echo "runs as uid $uid" ||
    { echo "FAIL: container runs as root"; fail=1; }

# a world of two processes inside the container (OpenMPI is in the image): the same text
one=$(podman exec "$NAME" zeroserve generate --model /models/stories260K --prompt "Once upon a time" \
    --max-tokens 16 --temperature 0 2>/dev/null)
two=$(podman exec "$NAME" mpirun --oversubscribe -np 2 --mca btl self,vader,tcp zeroserve generate \
    --model /models/stories260K --prompt "Once upon a time" --max-tokens 16 --temperature 0 2>"$work/mpi.err")
if [ -n "$one" ] && [ "$one" = "$two" ]; then echo "mpirun -np 2 in the container: same text"; else
    echo "FAIL: mpirun -np 2 in the container: '$two' vs '$one'"; tail -5 "$work/mpi.err"; fail=1; fi

step "podman stop (SIGTERM)"
podman stop -t 30 "$NAME" >/dev/null
rc=$(podman inspect --format '{{.State.ExitCode}}' "$NAME")
podman logs "$NAME" 2>&1 | tail -4
if [ "$rc" != 0 ]; then echo "FAIL: exit code $rc after SIGTERM"; fail=1; else echo "clean stop: exit 0"; fi
podman logs "$NAME" 2>&1 | grep -q "SIGTERM received" || { echo "FAIL: zeroserve did not see SIGTERM"; fail=1; }
step "done"
echo "deploy-container: $( [ $fail = 0 ] && echo passed || echo FAILED ) in $(( $(date +%s) - t0 )) s"
exit $fail
