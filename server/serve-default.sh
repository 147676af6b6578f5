#!/bin/sh
# `make serve`: starts the HTTP server on the default model. MODEL=DIR serves another model
# directory; HOST, PORT, SERVE_ARGS (more serve flags) and ZS_API_KEY pass through.
# The default is models/stories260K, which ships with the repo (a real trained Llama, MIT
# license; see its README): no download and no training before the first answer.
set -e
cd "$(dirname "$0")/.."
if [ -z "$MODEL" ]; then
    MODEL=models/stories260K
    echo "note: the default model is stories260K (a 260K-parameter Llama trained on TinyStories by"
    echo "      Andrej Karpathy, MIT): it tells short children's stories, nothing else. Serve a real model"
    echo "      with: make serve MODEL=DIR (a Hugging Face Llama/Mistral/Qwen2/GPT-2 directory)."
fi
if [ ! -f "$MODEL/config.json" ]; then
    echo "zeroserve: $MODEL/config.json not found: MODEL must be a Hugging Face model directory" >&2
    exit 1
fi
NAME=$(basename "$MODEL")
echo "try:  curl -s http://${HOST:-127.0.0.1}:${PORT:-8080}/v1/completions -H 'Content-Type: application/json' -d '{\"model\":\"$NAME\",\"prompt\":\"Once upon a time\",\"max_tokens\":64}'"
exec ./zeroserve serve --model "$MODEL" --host "${HOST:-127.0.0.1}" --port "${PORT:-8080}" $SERVE_ARGS
