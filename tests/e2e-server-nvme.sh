#!/bin/sh
# e2e-server-nvme.sh — the whole e2e-server.sh suite again, with the server's parameters split
# over 2 ranks and offloaded to NVMe shard files (--ranks 2 --offload nvme --nvme-path DIR) in a
# temp dir that is removed on every exit path. Same exit codes (0 pass, 1 fail, 77 skip).
cd "$(dirname "$0")/.." || exit 1
d=$(mktemp -d /tmp/zs-e2e-nvme.XXXXXX) || exit 1
trap 'rm -rf "$d"' EXIT
trap 'exit 1' INT TERM HUP
ZS_E2E_ARGS="--ranks 2 --offload nvme --nvme-path $d ${ZS_E2E_ARGS:-}" sh tests/e2e-server.sh
