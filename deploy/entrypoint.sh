#!/bin/sh
# entrypoint.sh — the container's entrypoint: maps ZS_* environment variables to
# `zeroserve serve` flags, then execs zeroserve (PID 1 is zeroserve itself, so SIGTERM from
# `docker stop` / `podman stop` / Kubernetes reaches it and it drains before exiting 0).
#
#   ZS_MODEL            model directory: a name under $ZS_MODELS_DIR, or an absolute path  [required]
#   ZS_MODELS_DIR       where models are mounted (default /models)
#   ZS_HOST / ZS_PORT   listen address (default 0.0.0.0:8080; the HEALTHCHECK assumes 8080)
#   ZS_DATA_DIR         uploaded files, fine-tuning jobs, fine-tuned models (default /data)
#   ZS_API_KEY          read by zeroserve itself (never put on the command line)
#   ZS_RANKS            --ranks N
#   ZS_OFFLOAD          --offload none|cpu|nvme
#   ZS_NVME_PATH        --nvme-path DIR (for ZS_OFFLOAD=nvme; e.g. a volume at /nvme)
#   ZS_CONFIG           --config ds.json
#   ZS_CONTEXT          --context N
#   ZS_WEIGHT_DTYPE     --weight-dtype auto|f32|f16|bf16
#   ZS_MAX_SEQS         --max-seqs N
#   ZS_MAX_BATCH_TOKENS --max-batch-tokens N
#   ZS_MAX_QUEUE        --max-queue N
#   ZS_THREADS          --threads N
#   ZS_CHAT_TEMPLATE    --chat-template NAME
#   ZS_SERVED_MODEL_NAME --served-model-name NAME
#   ZS_EXTRA_ARGS       any further `serve` flags, split on spaces
#   ZS_DEVICE, ZS_LOG, ZS_STORE_PREAD, ... are read by zeroserve directly.
#
# Arguments: none → serve; arguments starting with "-" → extra `serve` flags; anything else is
# run as is (e.g. `zeroserve generate --model /models/x --prompt hi`, or `sh`).
set -eu

if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
    exec "$@"
fi

: "${ZS_MODEL:?set ZS_MODEL to a model directory under ${ZS_MODELS_DIR:-/models} (or an absolute path)}"
case $ZS_MODEL in
/*) model=$ZS_MODEL ;;
*) model=${ZS_MODELS_DIR:-/models}/$ZS_MODEL ;;
esac
if [ ! -d "$model" ]; then
    echo "entrypoint: model directory $model does not exist (mount it, e.g. -v ./models:/models:ro)" >&2
    exit 2
fi

set -- serve --model "$model" --host "${ZS_HOST:-0.0.0.0}" --port "${ZS_PORT:-8080}" \
    --data-dir "${ZS_DATA_DIR:-/data}" "$@"
# each ZS_VAR=value adds "--flag value" (values keep their spaces)
for pair in RANKS:ranks OFFLOAD:offload NVME_PATH:nvme-path CONFIG:config CONTEXT:context \
            WEIGHT_DTYPE:weight-dtype MAX_SEQS:max-seqs MAX_BATCH_TOKENS:max-batch-tokens \
            MAX_QUEUE:max-queue THREADS:threads CHAT_TEMPLATE:chat-template \
            SERVED_MODEL_NAME:served-model-name; do
    eval "value=\${ZS_${pair%%:*}:-}"
    if [ -n "$value" ]; then set -- "$@" "--${pair#*:}" "$value"; fi
done
if [ -n "${ZS_NVME_PATH:-}" ]; then mkdir -p "$ZS_NVME_PATH" 2>/dev/null || :; fi
mkdir -p "${ZS_DATA_DIR:-/data}" 2>/dev/null || :
# ZS_EXTRA_ARGS is split on spaces on purpose
# shellcheck disable=SC2086
exec zeroserve "$@" ${ZS_EXTRA_ARGS:-}
