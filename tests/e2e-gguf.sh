#!/bin/sh
# End-to-end checks of GGUF models through the command line: generate with --model FILE.gguf
# prints the same greedy text as the safetensors directory converted from it (stories260K), also
# over 2 ranks with NVMe shards (written once, then reused by the GGUF's fingerprint), and a
# file that is not a usable GGUF gives a clear error with exit status 1.
# shellcheck source=tests/lib/e2e.sh
. "$(dirname "$0")/lib/e2e.sh"
zs_need_bin
zs_tmpdir gguf

M=$SHARED/models/stories260K
G=$M/stories260K.gguf
want=$($Z generate --model "$M" --prompt "Once upon a time" --max-tokens 32 --temperature 0 2>/dev/null)
out=$($Z generate --model "$G" --prompt "Once upon a time" --max-tokens 32 --temperature 0 2>"$T/err")
check "generate --model FILE.gguf: same text as the directory" '[ -n "$out" ] && [ "$out" = "$want" ]'
mkdir -p "$T/nv"
for i in 1 2; do
  o2=$($Z generate --model "$G" --prompt "Once upon a time" --max-tokens 32 --temperature 0 --ranks 2 --offload nvme --nvme-path "$T/nv" 2>/dev/null)
  check "generate gguf --ranks 2 --offload nvme (run $i): same text" '[ "$o2" = "$want" ]'
done
check "nvme shard manifests name the GGUF fingerprint" 'grep -q "gguf-" "$T"/nv/rank0.json'
printf 'not a gguf' > "$T/bad.gguf"
$Z generate --model "$T/bad.gguf" --prompt hi --max-tokens 3 >/dev/null 2>"$T/err"; rc=$?
check "a file that is not GGUF: exit 1, error names the file" '[ $rc = 1 ] && grep -q "bad.gguf" "$T/err"'
zs_done
