#!/bin/sh
# `make serve`: starts the HTTP server on the default model. MODEL=DIR serves another model
# directory; HOST, PORT, SERVE_ARGS (more serve flags) and ZS_API_KEY pass through.
# Without MODEL, the default is a demo model this engine trains once on this machine: a small
# random-initialised Llama (init-model, fixed seed) fine-tuned with `zeroserve train` on simple
# stories the project generates itself (make-corpus), so a fresh machine shows readable text
# with no download. It takes a few minutes, once; the result is kept in models/default.
set -e
cd "$(dirname "$0")/.."
if [ -z "$MODEL" ]; then
    MODEL=models/default
    if [ ! -f "$MODEL/config.json" ]; then
        echo "zeroserve: first start: training the demo model (a 0.9M-parameter Llama on generated stories;"
        echo "           a few minutes on 2 cores, once)"
        ./zeroserve init-model --arch llama --layers 4 --dim 128 --heads 4 --kv-heads 4 --ffn 344 \
            --vocab 512 --context 256 --seed 1234 --out models/demo-init
        ./zeroserve make-corpus --out models/demo-stories.jsonl --stories 4000 --seed 1
        ./zeroserve train --model models/demo-init --data models/demo-stories.jsonl --out "$MODEL" \
            --steps 300 --lr 3e-3 --schedule cosine --warmup 20 --batch-size 16 --seq-len 128 \
            --checkpoint-dir models/demo-checkpoints --progress-bar
    fi
    echo "note: models/default is the demo model trained on generated stories: it tells tiny stories, nothing else."
    echo "      Serve a real model with: make serve MODEL=DIR (any Hugging Face Llama/Mistral/Qwen2/GPT-2 directory)."
fi
NAME=$(basename "$MODEL")
echo "try:  curl -s http://${HOST:-127.0.0.1}:${PORT:-8080}/v1/completions -H 'Content-Type: application/json' -d '{\"model\":\"$NAME\",\"prompt\":\"Once upon a time\",\"max_tokens\":64}'"
exec ./zeroserve serve --model "$MODEL" --host "${HOST:-127.0.0.1}" --port "${PORT:-8080}" $SERVE_ARGS
