#!/bin/sh
# `make demo-model`: shows the training path end to end on a fresh machine. Makes a small
# random-initialised Llama (init-model, fixed seed), generates simple stories (make-corpus) and
# trains the model on them with `zeroserve train` (ZeRO-3 steps, checkpoints, a progress bar):
# 3-4 minutes on 2 cores. The result is a Hugging Face directory, models/demo, that
# `make serve MODEL=models/demo` serves. OUT=DIR writes elsewhere; STEPS=N changes the length.
set -e
cd "$(dirname "$0")/.."
OUT=${OUT:-models/demo}
STEPS=${STEPS:-300}
W=$OUT.work
mkdir -p "$W"
./zeroserve init-model --arch llama --layers 4 --dim 128 --heads 4 --kv-heads 4 --ffn 344 \
    --vocab 512 --context 256 --seed 1234 --out "$W/init"
./zeroserve make-corpus --out "$W/stories.jsonl" --stories 4000 --seed 1
./zeroserve train --model "$W/init" --data "$W/stories.jsonl" --out "$OUT" \
    --steps "$STEPS" --lr 3e-3 --schedule cosine --warmup 20 --batch-size 16 --seq-len 128 \
    --checkpoint-dir "$W/checkpoints" --progress-bar
echo "demo model written to $OUT; serve it with: make serve MODEL=$OUT"
