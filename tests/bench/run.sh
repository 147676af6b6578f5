#!/bin/sh
# Benchmarks (`make bench`): decode/prefill throughput of a ~250M-parameter random Llama in fp32
# against the host memory bandwidth measured in the same run. Figures are medians of RUNS runs.
# The model is written once into models/bench-250m (about 1 GB).
set -e
cd "$(dirname "$0")/../.."
M=models/bench-250m
if [ ! -f "$M/config.json" ]; then
    ./zeroserve init-model --arch llama --layers 11 --dim 1024 --heads 16 --kv-heads 16 --ffn 4096 \
        --vocab 32000 --context 2048 --seed 7 --out "$M"
fi
./zeroserve bench --model "$M" --runs "${RUNS:-5}" --prefill "${PREFILL:-128}" --decode "${DECODE:-32}" ${JSON:+--json "$JSON"}

# ZeRO-3 weight streaming from NVMe shard files, 2 ranks, a live budget of 300 MB (under a third of the
# model): stream GB/s against raw io_uring O_DIRECT reads of the same files, and the overlap figure.
NV=${NVME_PATH:-models/bench-250m-shards}
mkdir -p "$NV"
./zeroserve bench --model "$M" --offload nvme --nvme-path "$NV" --ranks "${RANKS:-2}" \
    --max-live-bytes 300000000 --runs "${RUNS:-5}" --decode "${DECODE_NVME:-8}"
