#!/bin/sh
# e2e-moe.sh — mixtures of experts end to end through the CLI and the server: for random Mixtral,
# Qwen2-MoE, Qwen3-MoE and OLMoE models (zeroserve init-model), `generate` gives the same greedy
# text and bitwise the same logits with 1 rank, 2 ranks over NVMe shard files, 3 ranks over pinned
# host memory, and under mpirun -np 2 (nvme, and 2 x 2 ranks over cpu); --stats reports the experts
# (hit rate, gathered against a whole-block gather; --moe-gather-all gathers all of it); the expert
# flags are checked (positive, at least one expert, refused on a dense model by name); `train` fine-
# tunes a Qwen2-MoE fully (2 ranks over cpu; under mpirun -np 2 the same bytes) and with LoRA (2 ranks over NVMe; the attention
# projections by default, MLP targets refused by name); `bench --moe` prints routed-only against
# gather-all at batch 1, 8 and 32 with its JSON; and a served MoE model answers a completion, runs
# a LoRA fine-tuning job over its streamed base (an MLP target refused with 400) whose adapter
# answers, and exports the expert counters on /metrics.
#
# Env: ZS_BIN (default ./zeroserve). CPU only (ZS_DEVICE=cpu); 20 to 60 s. mpirun parts are skipped
# (not failed) without mpirun. Exit 0 all passed, 1 something failed.
# shellcheck disable=SC2016  # check's programs are single-quoted on purpose
# shellcheck source=tests/lib/e2e.sh
. "$(dirname "$0")/lib/e2e.sh"
zs_bash "$@"
set -u
export ZS_DEVICE=cpu ZS_LOG=warn
zs_mpi_env
unset ZS_API_KEY
zs_need_bin
zs_tmpdir e2e-moe
HAVE_MPI=0
command -v mpirun >/dev/null 2>&1 && HAVE_MPI=1

init() { # arch dir extra...
    local a=$1 d=$2; shift 2
    "$BIN" init-model --arch "$a" --layers 3 --dim 64 --heads 4 --kv-heads 2 --head-dim 16 --vocab 300 \
        --context 256 --seed 11 --out "$d" "$@" >"$T/init-$a.log" 2>&1
}
gen() { # tag model extra... : text to $T/$tag.txt, logits to $T/$tag.bin, stats to $T/$tag.err
    local tag=$1 m=$2; shift 2
    timeout 300 "$BIN" generate --model "$m" --prompt "Once upon a time" --max-tokens 12 --temperature 0 \
        --ignore-eos --stats --logits-out "$T/$tag.bin" "$@" >"$T/$tag.txt" 2>"$T/$tag.err"
}
same() { cmp -s "$T/$1.txt" "$T/$2.txt" && cmp -s "$T/$1.bin" "$T/$2.bin" && [ -s "$T/$1.bin" ]; }

for a in mixtral qwen2moe qwen3moe olmoe; do
    M=$T/m-$a
    case $a in
    mixtral) init $a "$M" --experts 8 --experts-used 2 --ffn 48 ;;
    qwen2moe) init $a "$M" --experts 16 --experts-used 4 --moe-ffn 32 --shared-ffn 48 --ffn 96 --mlp-only-layers 1 ;;
    qwen3moe) init $a "$M" --experts 16 --experts-used 4 --moe-ffn 32 --ffn 96 ;;
    olmoe) init $a "$M" --experts 16 --experts-used 4 --ffn 32 ;;
    esac
    rc=$?
    check "$a: init-model writes a MoE model" '[ $rc = 0 ] && [ -s "$M/config.json" ]' "$(tail -2 "$T/init-$a.log")"
    gen "$a-1" "$M"
    rc=$?
    check "$a: generate on one rank" '[ $rc = 0 ] && [ -s "$T/$a-1.txt" ]' "$(tail -3 "$T/$a-1.err")"
    mkdir -p "$T/nv-$a"
    gen "$a-2nvme" "$M" --ranks 2 --offload nvme --nvme-path "$T/nv-$a"
    check "$a: 2 ranks over NVMe: same text, logits bitwise" 'same $a-1 $a-2nvme' "$(tail -3 "$T/$a-2nvme.err")"
    check "$a: 2 ranks over NVMe: the experts were gathered, fewer than a whole-block gather" \
        'grep -q "^experts: " "$T/$a-2nvme.err" && awk "/^experts: /{ for (i = 1; i <= NF; i++) if (\$i == \"(ratio\") r = \$(i+1) + 0 } END { exit !(r > 0 && r < 1) }" "$T/$a-2nvme.err"' \
        "$(grep '^experts' "$T/$a-2nvme.err")"
    gen "$a-3cpu" "$M" --ranks 3 --offload cpu
    check "$a: 3 ranks over pinned host memory: same text, logits bitwise" 'same $a-1 $a-3cpu' "$(tail -3 "$T/$a-3cpu.err")"
    gen "$a-all" "$M" --ranks 2 --offload cpu --moe-gather-all
    check "$a: --moe-gather-all: same logits, and it gathers the whole block (ratio 1)" \
        'same $a-1 $a-all && grep -q "(ratio 1.0000)" "$T/$a-all.err"' "$(grep '^experts' "$T/$a-all.err")"
    if [ $HAVE_MPI = 1 ]; then
        mkdir -p "$T/nvm-$a"
        tag=$a-mpi; timeout 300 mpirun -np 2 "$BIN" generate --model "$M" --prompt "Once upon a time" --max-tokens 12 \
            --temperature 0 --ignore-eos --offload nvme --nvme-path "$T/nvm-$a" --logits-out "$T/$tag.bin" \
            >"$T/$tag.txt" 2>"$T/$tag.err"
        check "$a: mpirun -np 2 over NVMe: same text, logits bitwise" 'same $a-1 $a-mpi' "$(tail -3 "$T/$a-mpi.err")"
        tag=$a-mpi2; timeout 300 mpirun -np 2 "$BIN" generate --model "$M" --prompt "Once upon a time" --max-tokens 12 \
            --temperature 0 --ignore-eos --ranks 2 --offload cpu --logits-out "$T/$tag.bin" >"$T/$tag.txt" 2>"$T/$tag.err"
        check "$a: mpirun -np 2 x 2 ranks over cpu: same text, logits bitwise" 'same $a-1 $a-mpi2' "$(tail -3 "$T/$a-mpi2.err")"
    fi
done

# ---------------------------------------------------------------- flags
M=$T/m-qwen3moe
"$BIN" generate --model "$M" --prompt x --max-tokens 2 --ranks 2 --offload cpu --expert-cache-bytes 0 >/dev/null 2>"$T/f1.err"
rc=$?
check "--expert-cache-bytes 0 is refused" '[ $rc != 0 ] && grep -q "expert-cache-bytes must be positive" "$T/f1.err"' "$(tail -1 "$T/f1.err")"
"$BIN" generate --model "$M" --prompt x --max-tokens 2 --ranks 2 --offload cpu --expert-cache-bytes 4096 >/dev/null 2>"$T/f2.err"
rc=$?
check "an expert cache under one expert is refused by name" '[ $rc != 0 ] && grep -q "smaller than one expert" "$T/f2.err"' "$(tail -1 "$T/f2.err")"
"$BIN" init-model --arch llama --layers 2 --dim 64 --heads 4 --vocab 300 --out "$T/dense" >/dev/null 2>&1
"$BIN" generate --model "$T/dense" --prompt x --max-tokens 2 --moe-gather-all >/dev/null 2>"$T/f3.err"
rc=$?
check "--moe-gather-all on a dense model is refused, naming it" '[ $rc != 0 ] && grep -q "is dense" "$T/f3.err"' "$(tail -1 "$T/f3.err")"

# ---------------------------------------------------------------- training
M2=$T/m-qwen2moe
i=0
while [ $i -lt 40 ]; do
    printf '{"text": "line %d: the quick brown fox jumps over the lazy dog, and the dog sleeps on"}\n' $i
    i=$((i + 1))
done >"$T/data.jsonl"
tr_common="--data $T/data.jsonl --steps 6 --seq-len 32 --batch-size 2 --lr 3e-3"
# shellcheck disable=SC2086
"$BIN" train --model "$M2" $tr_common --out "$T/ft" --ranks 2 --offload cpu >"$T/ft.log" 2>&1
rc=$?
check "train (full, 2 ranks over cpu) on a Qwen2-MoE: the loss goes down and the model is written" \
    '[ $rc = 0 ] && awk "/^train: loss/ { exit !(\$5 + 0 < \$3 + 0) }" "$T/ft.log" && [ -s "$T/ft/config.json" ]' "$(tail -2 "$T/ft.log")"
if [ $HAVE_MPI = 1 ]; then
    # shellcheck disable=SC2086
    timeout 300 mpirun -np 2 "$BIN" train --model "$M2" $tr_common --out "$T/ftm" --ranks 1 --offload cpu >"$T/ftm.log" 2>&1
    rc=$?
    check "train under mpirun -np 2: the same model, byte for byte, as 2 ranks in one process" \
        '[ $rc = 0 ] && cmp -s "$T/ft/model.safetensors" "$T/ftm/model.safetensors"' "$(tail -2 "$T/ftm.log")"
fi
gen ft "$T/ft"
rc=$?
check "the fine-tuned MoE generates" '[ $rc = 0 ] && [ -s "$T/ft.txt" ] && ! cmp -s "$T/ft.bin" "$T/qwen2moe-1.bin"' "$(tail -2 "$T/ft.err")"
mkdir -p "$T/nvt"
# shellcheck disable=SC2086
"$BIN" train --model "$M2" $tr_common --lora --out "$T/lo" --ranks 2 --offload nvme --nvme-path "$T/nvt" >"$T/lo.log" 2>&1
rc=$?
check "train --lora (2 ranks over NVMe) on a MoE: the attention projections by default, the loss goes down" \
    '[ $rc = 0 ] && [ "$(jq -c "[.target_modules[]] | sort" "$T/lo/adapter_config.json")" = "[\"k_proj\",\"o_proj\",\"q_proj\",\"v_proj\"]" ] && awk "/^train: loss/ { exit !(\$5 + 0 < \$3 + 0) }" "$T/lo.log"' \
    "$(tail -2 "$T/lo.log")"
# shellcheck disable=SC2086
"$BIN" train --model "$M2" $tr_common --lora --lora-targets q,gate --out "$T/lo2" >"$T/lo2.log" 2>&1
rc=$?
check "train --lora-targets gate on a MoE: refused, naming the target and the mixture of experts" \
    '[ $rc != 0 ] && grep -q "gate_proj.*mixture of experts" "$T/lo2.log" && [ ! -e "$T/lo2" ]' "$(tail -1 "$T/lo2.log")"

# ---------------------------------------------------------------- bench --moe
mkdir -p "$T/nvb"
timeout 300 "$BIN" bench --model "$M" --moe --runs 1 --decode 3 --prefill 4 --offload nvme --nvme-path "$T/nvb" \
    --json "$T/bench.json" >"$T/bench.txt" 2>"$T/bench.err"
rc=$?
check "bench --moe: runs, a line per batch 1, 8, 32, the JSON with three batches" \
    '[ $rc = 0 ] && grep -Eq "^1 " "$T/bench.txt" && grep -Eq "^8 " "$T/bench.txt" && grep -Eq "^32 " "$T/bench.txt" && [ "$(jq ".batches | length" "$T/bench.json")" = 3 ]' \
    "$(tail -3 "$T/bench.err")"
check "bench --moe: routed bytes per token under the whole block's at batch 1" \
    '[ "$(jq ".batches[0].expert_bytes_per_token < .batches[0].block_bytes_per_token" "$T/bench.json")" = true ]'

# ---------------------------------------------------------------- served
if command -v curl >/dev/null 2>&1; then
    mkdir -p "$T/nvs"
    if zs_start_server "$T/server.log" --model "$M" --offload nvme --nvme-path "$T/nvs" --data-dir "$T/data"; then
        code=$(curl -s -o "$T/c.json" -w '%{http_code}' "$ZS_URL/v1/completions" -H 'Content-Type: application/json' \
            -d '{"model":"m-qwen3moe","prompt":"Once upon a time","max_tokens":8,"temperature":0}')
        [ "$code" = 404 ] && code=$(curl -s -o "$T/c.json" -w '%{http_code}' "$ZS_URL/v1/completions" \
            -H 'Content-Type: application/json' -d '{"prompt":"Once upon a time","max_tokens":8,"temperature":0}')
        check "served: a completion from the MoE model" '[ "$code" = 200 ]' "$code $(head -c 200 "$T/c.json")"
        # a LoRA job over the served MoE: the attention projections by default; MLP targets refused
        FID=$(curl -s -m 30 "$ZS_URL/v1/files" -F purpose=fine-tune -F "file=@$T/data.jsonl" | jq -r .id)
        post() { curl -s -m 30 -o "$T/r.json" -w '%{http_code}' "$ZS_URL$1" -H 'Content-Type: application/json' -d "$2"; }
        code=$(post /v1/fine_tuning/jobs "{\"training_file\":\"$FID\",\"model\":\"m-qwen3moe\",\"lora\":{\"target_modules\":[\"down_proj\"]}}")
        check "served: a LoRA job targeting down_proj on a MoE: 400 naming the target" \
            '[ "$code" = 400 ] && jq -e ".error.param == \"lora.target_modules\" and (.error.message | test(\"down_proj\"))" "$T/r.json" >/dev/null' "$code $(cat "$T/r.json")"
        code=$(post /v1/fine_tuning/jobs "{\"training_file\":\"$FID\",\"model\":\"m-qwen3moe\",\"suffix\":\"moe\",\"lora\":{\"r\":4},\"hyperparameters\":{\"n_epochs\":1,\"batch_size\":4}}")
        JID=$(jq -r .id "$T/r.json")
        check "served: a LoRA job on the MoE is created with the attention projections" \
            '[ "$code" = 200 ] && [ "$(jq -c ".lora.target_modules" "$T/r.json")" = "[\"q_proj\",\"k_proj\",\"v_proj\",\"o_proj\"]" ]' "$code $(cat "$T/r.json")"
        st=""
        for _ in $(seq 600); do
            st=$(curl -s "$ZS_URL/v1/fine_tuning/jobs/$JID" | jq -r .status)
            case $st in succeeded|failed|cancelled) break;; esac
            sleep 0.1
        done
        FTM=$(curl -s "$ZS_URL/v1/fine_tuning/jobs/$JID" | jq -r .fine_tuned_model)
        code=$(post /v1/completions "{\"model\":\"$FTM\",\"prompt\":\"Once upon a time\",\"max_tokens\":8,\"temperature\":0}")
        check "served: the job succeeds over the streamed MoE and its adapter answers" '[ "$st" = succeeded ] && [ "$code" = 200 ]' \
            "$st $code $(curl -s "$ZS_URL/v1/fine_tuning/jobs/$JID" | jq -c .error)"
        curl -s "$ZS_URL/metrics" >"$T/metrics.txt"
        check "served: /metrics exports the expert counters" \
            'awk "\$1 == \"zeroserve_expert_bytes_total\" && \$2 > 0 { f = 1 } END { exit !f }" "$T/metrics.txt" && grep -q "^zeroserve_expert_cache_hit_ratio " "$T/metrics.txt" && grep -q "^zeroserve_expert_bytes_per_token " "$T/metrics.txt"'
        zs_stop_server
    else
        nok "served: the server starts" "$(tail -3 "$T/server.log")"
    fi
fi
zs_done
