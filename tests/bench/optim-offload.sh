#!/bin/sh
# shellcheck shell=bash
# optim-offload.sh — ZeRO-Infinity optimizer offload (issue 16) against the optimizer in host
# memory, on the same model in one run (not part of `make test`):
#   a random Llama (default ~60M parameters, bf16 weights) trained STEPS steps by `zeroserve
#   train --precision bf16` with --offload-optimizer cpu, then nvme (--sub-group-size SUB), RUNS
#   times interleaved; per mode the medians of: the step time, the optimizer's part of it, the
#   process's peak resident memory (VmHWM) and the optimizer state's host bytes; then nvme/cpu.
#   Each nvme optimizer step reads and writes 12 bytes per parameter (fp32 master, m, v): the
#   rate that makes is printed, against the same bytes moved by dd with O_DIRECT (one request in
#   flight: a reference, not a bound).
#
#   sh tests/bench/optim-offload.sh
# Env: ZS_BIN (./zeroserve), DIR (scratch: model, data, optimizer files; default /tmp/zs-optbench,
# keep it on the disk you mean: tmpfs measures memory), LAYERS/DIM/FFN/VOCAB (the model: 8/768/2048/32000),
# STEPS (4), RUNS (3), SUB (sub_group_size, 1e6 elements), BUFS (buffer_count, 4).
if [ -z "${BASH_VERSION:-}" ]; then exec bash "$0" "$@"; fi
set -u
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
BIN=${ZS_BIN:-./zeroserve}
case $BIN in /*) ;; *) BIN=$ROOT/$BIN;; esac
DIR=${DIR:-/tmp/zs-optbench}
LAYERS=${LAYERS:-8}; DIM=${DIM:-768}; FFN=${FFN:-2048}; VOCAB=${VOCAB:-32000}
STEPS=${STEPS:-4}; RUNS=${RUNS:-3}; SUB=${SUB:-1000000}; BUFS=${BUFS:-4}
export ZS_DEVICE=${ZS_DEVICE:-cpu} ZS_LOG=${ZS_LOG:-warn}
mkdir -p "$DIR/nv" || exit 1
M=$DIR/model
if [ ! -f "$M/config.json" ]; then
    "$BIN" init-model --out "$M" --layers "$LAYERS" --dim "$DIM" --heads 12 --ffn "$FFN" --vocab "$VOCAB" \
        --context 256 --dtype bf16 > /dev/null || exit 1
fi
python3 - "$DIR/data.jsonl" <<'EOF' || { for i in $(seq 64); do echo '{"text": "the quick brown fox jumps over the lazy dog and runs far away"}'; done > "$DIR/data.jsonl"; }
import sys
with open(sys.argv[1], "w") as f:
    for i in range(64):
        f.write('{"text": "%s"}\n' % " ".join("w%d" % ((i * 7 + k) % 97) for k in range(40)))
EOF
cat > "$DIR/nvme.json" <<EOF
{"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "$DIR/nv", "buffer_count": $BUFS},
 "sub_group_size": $SUB}, "bf16": {"enabled": true}}
EOF
cat > "$DIR/cpu.json" <<EOF
{"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}, "bf16": {"enabled": true}}
EOF
one() { # mode -> "step_s optim_s peak_mib host_mib"
    "$BIN" train --model "$M" --data "$DIR/data.jsonl" --out "$DIR/out-$1" --steps "$STEPS" --batch-size 1 --seq-len 64 \
        --lr 1e-4 --config "$DIR/$1.json" --checkpoint-dir "$DIR/ck-$1" > "$DIR/$1.log" 2>&1 || { tail -3 "$DIR/$1.log" >&2; return 1; }
    rm -rf "$DIR/out-$1" "$DIR/ck-$1"
    st=$(sed -n 's/^train: step time median \([0-9.]*\) s, of it the optimizer \([0-9.]*\) s.*/\1 \2/p' "$DIR/$1.log")
    mem=$(sed -n 's/^train: memory: optimizer state .* (\([0-9.]*\) MiB of it in host memory), peak resident \([0-9.]*\) MiB/\2 \1/p' "$DIR/$1.log")
    echo "$st $mem"
}
: > "$DIR/cpu.runs"; : > "$DIR/nvme.runs"
for r in $(seq "$RUNS"); do
    one cpu >> "$DIR/cpu.runs" || exit 1
    one nvme >> "$DIR/nvme.runs" || exit 1
done
med() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
col() { awk -v c="$2" '{ print $c }' "$DIR/$1.runs" | med; }
params=$(python3 -c "
import json; c = json.load(open('$M/config.json'))
d, f, L, V = c['hidden_size'], c['intermediate_size'], c['num_hidden_layers'], c['vocab_size']
print(L * (4 * d * d + 3 * d * f) + 2 * V * d)" 2>/dev/null || echo 0)
# the file system's sequential O_DIRECT rates with one request in flight (dd, 1 GiB written then
# read): a reference for the optimizer's stream, not a bound (io_uring keeps several in flight)
rawgb() { # "write_gbps read_gbps"
    f=$DIR/nv/raw.bin
    w=$( { dd if=/dev/zero of="$f" bs=4M count=256 oflag=direct conv=fsync 2>&1 >/dev/null; } | sed -n 's/.* s, \([0-9.]*\) \([GM]\)B\/s.*/\1 \2/p')
    r=$( { dd if="$f" of=/dev/null bs=4M iflag=direct 2>&1 >/dev/null; } | sed -n 's/.* s, \([0-9.]*\) \([GM]\)B\/s.*/\1 \2/p')
    rm -f "$f"
    echo "$w $r" | awk '{ a = ($2 == "M") ? $1 / 1000 : $1; b = ($4 == "M") ? $3 / 1000 : $3; print a, b }'
}
raw=$(rawgb)
echo "model: $LAYERS layers, dim $DIM, ffn $FFN, vocab $VOCAB (~$params parameters), bf16; $STEPS steps x $RUNS runs per mode, interleaved"
printf '%-6s %12s %12s %14s %16s\n' mode step_s optim_s peak_rss_MiB optim_host_MiB
for m in cpu nvme; do
    printf '%-6s %12s %12s %14s %16s\n' $m "$(col $m 1)" "$(col $m 2)" "$(col $m 3)" "$(col $m 4)"
done
echo "O_DIRECT with one request in flight (dd, 4 MiB blocks) on $DIR/nv: write $(echo "$raw" | cut -d' ' -f1) GB/s, read $(echo "$raw" | cut -d' ' -f2) GB/s"
awk -v raw="$raw" -v a="$(col cpu 1)" -v b="$(col nvme 1)" -v c="$(col cpu 3)" -v d="$(col nvme 3)" -v e="$(col cpu 2)" -v f="$(col nvme 2)" -v p="$params" 'BEGIN {
    printf "nvme / cpu: step time %.2fx, optimizer %.2fx, peak resident %.2fx (%.0f MiB less)\n", b / a, f / e, d / c, c - d
    split(raw, r, " ")
    if (p > 0 && f > 0) {
        bound = (r[1] > 0 && r[2] > 0) ? 12 * p / (r[1] * 1e9) + 12 * p / (r[2] * 1e9) : 0
        printf "nvme optimizer step: %.2f GB/s moved (12 bytes per parameter read and written)", 2 * 12 * p / f / 1e9
        if (bound > 0) printf "; %.2f s against %.2f s for the same bytes at dd'"'"'s rates (%.2fx)", f, bound, f / bound
        printf "\n"
    }
}'
