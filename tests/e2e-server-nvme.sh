#!/bin/sh
# e2e-server-nvme.sh — the whole e2e-server.sh suite again, with the server's parameters split
# over 2 ranks and offloaded to NVMe shard files (--ranks 2 --offload nvme --nvme-path DIR) in a
# temp dir that is removed on every exit path. Same exit codes (0 pass, 1 fail, 77 skip).
# shellcheck source=tests/lib/e2e.sh
. "$(dirname "$0")/lib/e2e.sh"
zs_tmpdir e2e-nvme
ZS_E2E_ARGS="--ranks 2 --offload nvme --nvme-path $T ${ZS_E2E_ARGS:-}" sh tests/e2e-server.sh
