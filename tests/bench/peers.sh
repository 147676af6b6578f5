#!/bin/sh
# `make bench-peers` (outside make test): zeroserve against llama.cpp on the same GGUF files,
# interleaved, prefill and decode, at f32, f16, bf16, q8_0, q4_0 and q4_k_m, prompts of 128 and
# 1024 tokens; medians and ratios, decode weight read against the memory bandwidth measured in
# the same run, and ZeRO-3 NVMe offload decode at q4_0 against bf16 (tests/bench/peers.py).
# The peer is llama.cpp from PyPI's llama-cpp-python==0.3.36 (its sdist builds llama.cpp with
# cmake, CPU only, about 6 minutes on 2 cores the first time), in a venv in the cache
# ($ZS_CACHE_DIR, default ~/.cache/zeroserve). Knobs: ROUNDS (3), DTYPES, PROMPTS, DECODE (32),
# KV (f16: llama.cpp's default KV cache type, used by both; f32 also works), NVME (1 = run the
# offload part), THREADS (all CPUs).
set -e
cd "$(dirname "$0")/../.."
CACHE=${ZS_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/zeroserve}
VENV=${PEER_VENV:-$CACHE/peer-venv}
if ! "$VENV/bin/python" -c "import llama_cpp, gguf, numpy" 2>/dev/null; then
    echo "bench-peers: building llama.cpp (llama-cpp-python==0.3.36) into $VENV; this takes minutes once"
    if ! python3 -m venv "$VENV" 2>/dev/null; then
        [ "$(id -u)" = 0 ] && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv python3-dev cmake g++ >/dev/null
        python3 -m venv "$VENV"
    fi
    command -v cmake >/dev/null || { [ "$(id -u)" = 0 ] && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq cmake g++ >/dev/null; }
    "$VENV/bin/pip" install -q numpy==2.4.6 gguf==0.19.0
    CMAKE_ARGS="-DGGML_NATIVE=ON -DGGML_BLAS=OFF" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
        "$VENV/bin/pip" install -q llama-cpp-python==0.3.36
fi
exec "$VENV/bin/python" tests/bench/peers.py --cache "$CACHE" "$@"
