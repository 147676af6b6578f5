#!/bin/sh
# `make bench-peers` (outside make test): zeroserve against llama.cpp on the same GGUF files,
# interleaved, prefill and decode, prompts of 128 and 1024 tokens, on three models: the random
# 233M Llama at f32, f16, bf16, q8_0, q4_0 and q4_k_m; SmolLM2-135M-Instruct, Q4_1 as shipped; a
# random Qwen3-MoE at f32, q4_0 and q4_k_m. Medians and ratios, decode weight read against the
# memory bandwidth measured in the same run, ZeRO-3 NVMe offload decode at q4_0 against bf16, and
# (callgrind) instructions per decoded token of both engines (tests/bench/peers.py says how).
# The peer is llama.cpp from PyPI's llama-cpp-python==0.3.36 (PIN below; its sdist builds
# llama.cpp with cmake, CPU only, GGML_NATIVE, 10+ minutes on 2 cores the first time), in a venv in
# the cache ($ZS_CACHE_DIR, default ~/.cache/zeroserve); a venv that holds another version is
# rebuilt, and the report's header prints the version imported and llama.cpp's CPU features. The
# callgrind part needs a second build without AVX-512 (valgrind 3.19 runs none), peer-venv-avx2,
# made only when that part runs. Knobs:
#   MODELS (m233 smollm2 moe), DTYPES (the 233M model's: f32 f16 bf16 q8_0 q4_0 q4_k_m),
#   MOE_DTYPES (f32 q4_0 q4_k_m), ROUNDS (3), PROMPTS (128 1024), DECODE (32), KV (f16: llama.cpp's
#   default KV cache type, used by both; f32 also works), NVME (1 = run the offload part; needs
#   bf16 and q4_0 in DTYPES), THREADS (all CPUs), TIMINGS (1; 0 = only the callgrind part),
#   CALLGRIND (default 1 where valgrind is installed or, as root, installable; 0 = off),
#   CG_FILES (m233:q4_0 m233:q4_k_m smollm2:q4_1 moe:q4_k_m), CG_DECODE (4 12), CG_PROMPT (8),
#   PROFILE (1 = also per-function Ir of the decoded tokens, into $ZS_CACHE_DIR/callgrind; implies
#   CALLGRIND=1), JSON (a file for the figures), PEER_VENV, PEER_VENV_AVX2.
set -e
cd "$(dirname "$0")/../.."
PIN=0.3.36
CACHE=${ZS_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/zeroserve}
VENV=${PEER_VENV:-$CACHE/peer-venv}
VENV2=${PEER_VENV_AVX2:-$CACHE/peer-venv-avx2}
say() { echo "bench-peers: $*" >&2; }
apt_get() { [ "$(id -u)" = 0 ] && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null; }
version() { "$1/bin/python" -c "import llama_cpp, gguf, numpy; print(llama_cpp.__version__)" 2>/dev/null || echo none; }

# peer VENV CMAKE_ARGS WHAT: a venv whose llama_cpp imports and is exactly $PIN, built if not
peer() {
    v=$(version "$1")
    [ "$v" = "$PIN" ] && return 0
    if [ "$v" = none ]; then
        say "building llama.cpp (llama-cpp-python==$PIN, $3) into $1; this takes minutes once"
    else
        say "$1 holds llama-cpp-python $v, not the pinned $PIN: rebuilding it ($3); this takes minutes"
    fi
    if ! python3 -m venv "$1" 2>/dev/null; then
        apt_get python3-venv python3-dev cmake g++
        python3 -m venv "$1"
    fi
    command -v cmake >/dev/null || apt_get cmake g++
    # --no-cache-dir: pip would otherwise reuse a wheel built with the other venv's CMAKE_ARGS
    CMAKE_ARGS="$2" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) "$1/bin/pip" install -q --no-cache-dir \
        numpy==2.4.6 gguf==0.19.0 "llama-cpp-python==$PIN"
    [ "$(version "$1")" = "$PIN" ] || CMAKE_ARGS="$2" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
        "$1/bin/pip" install -q --no-cache-dir --force-reinstall --no-deps "llama-cpp-python==$PIN"
    v=$(version "$1")
    [ "$v" = "$PIN" ] || { say "$1: llama_cpp is $v after the build, not $PIN"; exit 1; }
}

peer "$VENV" "-DGGML_NATIVE=ON -DGGML_BLAS=OFF" "GGML_NATIVE"

[ "${PROFILE:-0}" = 1 ] && CALLGRIND=1
case ${CALLGRIND:-auto} in
auto)
    command -v valgrind >/dev/null || { apt_get valgrind && say "installed valgrind"; } || true
    if command -v valgrind >/dev/null; then CALLGRIND=1; else
        CALLGRIND=0; say "no valgrind (apt-get install valgrind, as root): the callgrind part is skipped"
    fi ;;
1)
    command -v valgrind >/dev/null || apt_get valgrind ||
        { say "CALLGRIND=1 needs valgrind (apt-get install valgrind, as root)"; exit 1; } ;;
esac
if [ "$CALLGRIND" = 1 ]; then
    peer "$VENV2" "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_BLAS=OFF" \
        "AVX2 without AVX-512, for callgrind"
    # valgrind stops at the first AVX-512 instruction (SIGILL): check that the build has none
    for so in "$VENV2"/lib/python3*/site-packages/llama_cpp/lib/*.so; do
        if command -v objdump >/dev/null && objdump -d --no-show-raw-insn "$so" | grep -q '%zmm'; then
            say "$so holds AVX-512 code; remove $VENV2 to rebuild it"; exit 1
        fi
    done
    export PEER_CG_PYTHON="$VENV2/bin/python"
fi
export CALLGRIND
exec "$VENV/bin/python" tests/bench/peers.py --cache "$CACHE" "$@"
