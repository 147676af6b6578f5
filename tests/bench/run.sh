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
