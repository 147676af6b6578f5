#!/bin/sh
# `make serve`: starts the HTTP server on the default model. MODEL=DIR serves another model
# directory; HOST, PORT and any ZS_API_KEY in the environment are passed on.
# Without MODEL, the default is a small random-initialised Llama that init-model writes once,
# with a fixed seed, into models/default: it works on any machine, but its weights are random,
# so its text is gibberish.
set -e
cd "$(dirname "$0")/.."
if [ -z "$MODEL" ]; then
    MODEL=models/default
    if [ ! -f "$MODEL/config.json" ]; then
        ./zeroserve init-model --arch llama --layers 4 --dim 256 --heads 8 --kv-heads 4 --ffn 688 \
            --vocab 512 --context 1024 --seed 1234 --out "$MODEL"
    fi
    echo "note: the default model at $MODEL has RANDOM weights (init-model, seed 1234): expect gibberish."
    echo "      For real text: make serve MODEL=../shared/models/stories260K (or any HF Llama/GPT-2 directory)."
fi
NAME=$(basename "$MODEL")
echo "try:  curl -s http://${HOST:-127.0.0.1}:${PORT:-8080}/v1/completions -H 'Content-Type: application/json' -d '{\"model\":\"$NAME\",\"prompt\":\"Once upon a time\",\"max_tokens\":32}'"
exec ./zeroserve serve --model "$MODEL" --host "${HOST:-127.0.0.1}" --port "${PORT:-8080}" $SERVE_ARGS
