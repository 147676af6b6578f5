#!/bin/sh
# `make serve`: runs zeroserve on the default model. MODEL=DIR picks another model directory.
# Without MODEL, the default is a small random-initialised Llama written once by init-model with
# a fixed seed into models/default (it works on any machine; its weights are random, so its text
# is gibberish). Until the HTTP server lands, this generates one completion with `generate`.
set -e
cd "$(dirname "$0")/.."
PROMPT=${PROMPT:-"Once upon a time"}
if [ -z "$MODEL" ]; then
    MODEL=models/default
    if [ ! -f "$MODEL/config.json" ]; then
        ./zeroserve init-model --arch llama --layers 4 --dim 256 --heads 8 --kv-heads 4 --ffn 688 \
            --vocab 512 --context 1024 --seed 1234 --out "$MODEL"
    fi
    echo "note: the default model at $MODEL has RANDOM weights (init-model, seed 1234): expect gibberish."
    echo "      For real text: make serve MODEL=../shared/models/stories260K (or any HF Llama/GPT-2 directory)."
fi
exec ./zeroserve generate --model "$MODEL" --prompt "$PROMPT" --max-tokens "${MAX_TOKENS:-64}" \
    --temperature "${TEMPERATURE:-0.8}" --seed "${SEED:-0}" --stats
