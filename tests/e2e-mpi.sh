#!/bin/sh
# End-to-end checks of worlds of several processes under OpenMPI (mpirun --oversubscribe on this
# one machine): greedy text and logits bitwise equal to one process with as many ranks
# (stories260K and gpt2-bytes, offload none and nvme, 2 and 3 processes, 2 ranks per process),
# serving over HTTP from process 0 (curl smoke test, orderly stop; with --speculative ngram or a
# draft model the same text, drafts verified in process 0's passes), training steps with the same
# losses, checkpoint and exported model, and a follower killed with SIGKILL: process 0 reports it
# and the job exits non-zero within 30 s (plain mpirun, and with orte_enable_recovery, where
# zeroserve itself answers 503 naming the lost process). Skips (77) without mpirun.
# shellcheck source=tests/lib/e2e.sh
. "$(dirname "$0")/lib/e2e.sh"
zs_need_bin
zs_need mpirun curl
zs_mpi_env
zs_tmpdir mpi
mpi() { local np=$1; shift; timeout 300 mpirun -np "$np" "$@"; }

# ---------------------------------------------------------------- inference: same text, same logits
gen_case() { # model prompt np ranks-per-process offload
    local M=$SHARED/models/$1 prompt=$2 np=$3 rpp=$4 off=$5 tag="$1-$3x$4-$5" extra=""
    local total=$((np * rpp))
    mkdir -p "$T/nv1-$tag" "$T/nvm-$tag"
    [ "$off" = nvme ] && extra="--offload nvme --nvme-path"
    $Z generate --model "$M" --prompt "$prompt" --max-tokens 24 --temperature 0 --ranks $total \
        ${extra:+$extra "$T/nv1-$tag"} --logits-out "$T/one-$tag.bin" >"$T/one-$tag.txt" 2>"$T/one-$tag.err"
    mpi "$np" $Z generate --model "$M" --prompt "$prompt" --max-tokens 24 --temperature 0 --ranks $rpp \
        ${extra:+$extra "$T/nvm-$tag"} --logits-out "$T/mp-$tag.bin" >"$T/mp-$tag.txt" 2>"$T/mp-$tag.err"
    local rc=$?
    check "$tag: mpirun exits 0" '[ $rc = 0 ] || { tail -5 "$T/mp-$tag.err"; false; }'
    check "$tag: greedy text equals $total ranks in one process" \
        '[ -s "$T/one-$tag.txt" ] && cmp -s "$T/one-$tag.txt" "$T/mp-$tag.txt"'
    check "$tag: logits bitwise equal ($(( $(stat -c %s "$T/one-$tag.bin" 2>/dev/null || echo 0) / 4 )) floats)" \
        '[ -s "$T/one-$tag.bin" ] && cmp -s "$T/one-$tag.bin" "$T/mp-$tag.bin"'
    if [ "$off" = nvme ]; then
        check "$tag: every world rank wrote its own shard file" \
            '[ "$(ls "$T/nvm-$tag"/rank*.shards 2>/dev/null | wc -l)" = $total ]'
    fi
}
for np in 2 3; do
    for off in none nvme; do
        gen_case stories260K "Once upon a time" $np 1 $off
        gen_case gpt2-bytes "The quick brown fox" $np 1 $off
    done
done
gen_case stories260K "Lily and Tom" 2 2 nvme
gen_case gpt2-bytes "Hello" 2 2 none
# the text is also the reference continuation
M=$SHARED/models/stories260K
want=$(printf '%b' "$(sed -n 's/.*"new_text": "\([^"]*\)".*/\1/p' "$M/reference.json" | grep -v '^text minus' | head -1)")
mpi 3 $Z generate --model "$M" --prompt "Once upon a time" --max-tokens 64 --temperature 0 >"$T/ref.txt" 2>/dev/null
check "3 processes: the stories260K reference text" '[ "$(cat "$T/ref.txt")" = "Once upon a time$want" ]'

# different --ranks per process, commands that do not run as several processes
mpi 2 sh -c 'exec '"$Z"' generate --model '"$M"' --prompt hi --ranks $((OMPI_COMM_WORLD_RANK + 1))' >/dev/null 2>"$T/mismatch.err"
check "different --ranks per process: a clear error" '[ $? != 0 ] && grep -q "same --ranks" "$T/mismatch.err"'
mpi 2 $Z bench --model "$M" >/dev/null 2>"$T/bench.err"
check "bench under mpirun: refused with a reason" '[ $? != 0 ] && grep -q "runs as one process" "$T/bench.err"'

# ---------------------------------------------------------------- serving from process 0
# start_world NAME NP ARGS...: mpirun serve on a free port; sets URL, MPIPID, LOG
start_world() {
    local name=$1 np=$2; shift 2
    LOG=$T/$name.log
    # WRAP=1: each process's exit status goes to $LOG.rc (mpirun's own status does not carry
    # it when orte_enable_recovery is on)
    export ZS_RC_FILE=$LOG.rc
    URL=""
    zs_start_cmd "$LOG" timeout 300 mpirun -x ZS_RC_FILE -np "$np" ${WRAP:+sh "$T/wrap.sh"} $Z serve --model "$M" --port 0 "$@" ||
        { echo "world $name did not come up"; return 1; }
    MPIPID=$SPID URL=$ZS_URL
}
cat >"$T/wrap.sh" <<'EOF'
"$@"; rc=$?
echo "process $OMPI_COMM_WORLD_RANK exit $rc" >>"$ZS_RC_FILE"
exit $rc
EOF
pid_of() { sed -n "s/.*process $1 pid \([0-9]*\) on.*/\1/p" "$LOG" | head -1; }
# waits up to $2 s for pid $1 to end; sets WAITED (s) and RC
wait_end() {
    local t0=$(date +%s%N)
    for _ in $(seq 1 $(($2 * 10))); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
    WAITED=$(( ($(date +%s%N) - t0) / 100000000 )); WAITED="$((WAITED / 10)).$((WAITED % 10))"
    if kill -0 "$1" 2>/dev/null; then RC=timeout; kill -9 "$1"; else wait "$1"; RC=$?; fi
}

single=$($Z generate --model "$M" --prompt "Once upon a time" --max-tokens 24 --temperature 0 2>/dev/null)
mkdir -p "$T/nv-serve"
if start_world serve 3 --ranks 1 --offload nvme --nvme-path "$T/nv-serve"; then
    ok "serve: 3 processes up, /health 200"
    c=$(curl -s "$URL/v1/completions" -H 'Content-Type: application/json' \
        -d '{"prompt":"Once upon a time","max_tokens":24,"temperature":0}')
    check "serve: completion text equals one process" '[ "Once upon a time$(echo "$c" | jq -r .choices[0].text)" = "$single" ]'
    ch=$(curl -s "$URL/v1/chat/completions" -H 'Content-Type: application/json' \
        -d '{"messages":[{"role":"user","content":"Tell a story"}],"max_tokens":8}')
    check "serve: chat completion" '[ "$(echo "$ch" | jq -r .object)" = chat.completion ]'
    st=$(curl -sN "$URL/v1/completions" -H 'Content-Type: application/json' \
        -d '{"prompt":"Tom","max_tokens":8,"stream":true}')
    check "serve: streaming ends with [DONE]" 'echo "$st" | grep -q "data: \[DONE\]"'
    # concurrent requests: continuous batching on process 0, the followers in every gather
    cp=""
    for i in 1 2 3 4 5 6; do
        curl -s "$URL/v1/completions" -H 'Content-Type: application/json' \
            -d '{"prompt":"Once upon a time","max_tokens":24,"temperature":0}' >"$T/par$i.json" &
        cp="$cp $!"
    done
    for p in $cp; do wait "$p"; done
    same=0; for i in 1 2 3 4 5 6; do [ "Once upon a time$(jq -r .choices[0].text "$T/par$i.json")" = "$single" ] && same=$((same+1)); done
    check "serve: 6 concurrent requests each equal the solo text ($same/6)" '[ $same = 6 ]'
    ft=$(curl -s -o /dev/null -w '%{http_code}' "$URL/v1/fine_tuning/jobs" -H 'Content-Type: application/json' \
        -d '{"model":"stories260K","training_file":"file-x"}')
    check "serve: fine-tuning jobs refused with 400 in a multi-process world" '[ "$ft" = 400 ]'
    p0=$(pid_of 0)
    kill -TERM "$p0"
    wait_end $MPIPID 30
    check "serve: SIGTERM to process 0 stops the whole world, exit 0 (${WAITED}s)" '[ "$RC" = 0 ]'
    # a rare failure here has not been reproduced outside make test: keep what it says
    [ "$RC" = 0 ] || { echo "# mpirun status $RC; the world's log ends:"; tail -25 "$LOG" | sed 's/^/#   /'; }
else
    nok "serve: 3 processes up"
fi

# speculative decoding across processes: drafts in process 0's steps, verified in the same passes
# (a prompt that repeats itself, so that prompt lookup finds drafts); a draft model (the served
# model itself, so that every draft holds) runs in process 0 alone
rep="Lily and Tom went to the park. Lily and Tom went to the park. Lily and"
srep=$($Z generate --model "$M" --prompt "$rep" --max-tokens 24 --temperature 0 2>/dev/null)
for how in ngram draft; do
    if [ $how = ngram ]; then sargs="--speculative ngram"; else sargs="--draft-model $M"; fi
    if start_world spec-$how 3 --ranks 1 $sargs --spec-tokens 4; then
        c=$(curl -s "$URL/v1/completions" -H 'Content-Type: application/json' \
            -d "{\"prompt\":\"$rep\",\"max_tokens\":24,\"temperature\":0}")
        check "serve $sargs: the text of one process without it" '[ "$rep$(echo "$c" | jq -r .choices[0].text)" = "$srep" ]'
        cp=""
        for i in 1 2 3 4; do
            curl -s "$URL/v1/completions" -H 'Content-Type: application/json' \
                -d "{\"prompt\":\"$rep\",\"max_tokens\":24,\"temperature\":0}" >"$T/spar$i.json" &
            cp="$cp $!"
        done
        for p in $cp; do wait "$p"; done
        same=0; for i in 1 2 3 4; do [ "$rep$(jq -r .choices[0].text "$T/spar$i.json")" = "$srep" ] && same=$((same+1)); done
        check "serve $sargs: 4 concurrent requests each equal the solo text ($same/4)" '[ $same = 4 ]'
        mt=$(curl -s "$URL/metrics")
        drafted=$(echo "$mt" | sed -n 's/^zeroserve_spec_draft_tokens_total \([0-9]*\)$/\1/p')
        accepted=$(echo "$mt" | sed -n 's/^zeroserve_spec_accepted_tokens_total \([0-9]*\)$/\1/p')
        check "serve $sargs: drafts were verified across the processes (${accepted:-none} of ${drafted:-none} accepted)" \
            '[ "${drafted:-0}" -gt 0 ] && { [ $how = ngram ] || [ "$accepted" = "$drafted" ]; }'
        kill -TERM "$(pid_of 0)"
        wait_end $MPIPID 30
        check "serve $sargs: SIGTERM stops the world, exit 0" '[ "$RC" = 0 ]'
    else
        nok "serve $sargs: 3 processes up"
    fi
done

# ---------------------------------------------------------------- a follower dies
for mode in plain recovery; do
    [ $mode = recovery ] && export OMPI_MCA_orte_enable_recovery=1 WRAP=1
    if start_world kill-$mode 3 --ranks 1; then
        p1=$(pid_of 1)
        curl -s "$URL/v1/completions" -H 'Content-Type: application/json' -d '{"prompt":"Hi","max_tokens":4}' >/dev/null
        kill -9 "$p1"
        code=""; body=""
        for _ in $(seq 1 40); do
            body=$(curl -s -m 2 -w '\n%{http_code}' "$URL/v1/completions" -H 'Content-Type: application/json' \
                -d '{"prompt":"Hi","max_tokens":4}' 2>/dev/null)
            code=$(echo "$body" | tail -1)
            [ "$code" = 503 ] || [ "$code" = 000 ] && break
            sleep 0.05
        done
        wait_end $MPIPID 30
        p0rc=$(sed -n 's/^process 0 exit //p' "$LOG.rc" 2>/dev/null)
        check "kill follower ($mode): the job ends within 30 s (${WAITED}s), non-zero (mpirun $RC, process 0 ${p0rc:-killed})" \
            '[ "$RC" != timeout ] && { [ "$RC" != 0 ] || { [ -n "$p0rc" ] && [ "$p0rc" != 0 ]; }; }'
        check "kill follower ($mode): process 0 names the lost process" \
            'grep -q "process 1 (pid $p1 on .*) is gone" "$LOG"'
        if [ $mode = recovery ]; then
            check "kill follower (recovery): requests get 503 naming the lost process" \
                '[ "$code" = 503 ] && echo "$body" | grep -q "world_lost" && echo "$body" | grep -q "process 1 (pid $p1"'
        fi
    else
        nok "kill follower ($mode): world up"
    fi
    unset OMPI_MCA_orte_enable_recovery WRAP
done

# ---------------------------------------------------------------- training across processes
D=$T/train.jsonl
for i in $(seq 1 24); do echo "{\"prompt\":\"Q$i: what is $i plus $i?\",\"completion\":\" $((i+i)).\"}"; done >"$D"
targs="--model $M --data $D --steps 4 --batch-size 2 --seq-len 32 --lr 1e-3 --log-every 1"
$Z train $targs --ranks 2 --out "$T/t1" --checkpoint-dir "$T/c1" >"$T/t1.txt" 2>"$T/t1.err"
mpi 2 $Z train $targs --ranks 1 --out "$T/t2" --checkpoint-dir "$T/c2" >"$T/t2.txt" 2>"$T/t2.err"
check "train: 2 processes exit 0" '[ $? = 0 ] || { tail -5 "$T/t2.err"; false; }'
losses() { sed -n 's/.*loss \([0-9.]*\).*/\1/p' "$1" | tr '\n' ' '; }
check "train: 4 loss lines, only from process 0" '[ "$(grep -c "^step" "$T/t2.txt")" = 4 ]'
check "train: the same losses as 2 ranks in one process ($(losses "$T/t2.txt"))" \
    '[ -n "$(losses "$T/t1.txt")" ] && [ "$(losses "$T/t1.txt")" = "$(losses "$T/t2.txt")" ]'
check "train: the exported model is byte-identical" 'cmp -s "$T/t1/model.safetensors" "$T/t2/model.safetensors"'
check "train: each process wrote its rank file of the checkpoint" \
    '[ -f "$T/c2/step-000004/rank0.bin" ] && [ -f "$T/c2/step-000004/rank1.bin" ] && [ -f "$T/c2/step-000004/manifest.json" ]'
$Z export --checkpoint "$T/c2" --out "$T/t2x" >/dev/null 2>&1
check "train: the 2-process checkpoint exports (one process) to the same model" 'cmp -s "$T/t1/model.safetensors" "$T/t2x/model.safetensors"'
# 3 processes with NVMe offload and ZeRO stage 2 against one process with 3 ranks
$Z train $targs --ranks 3 --zero-stage 2 --steps 2 --out "$T/t3" --checkpoint-dir "$T/c3" >"$T/t3.txt" 2>/dev/null
mpi 3 $Z train $targs --ranks 1 --zero-stage 2 --steps 2 --out "$T/t4" --checkpoint-dir "$T/c4" >"$T/t4.txt" 2>"$T/t4.err"
check "train: 3 processes, ZeRO stage 2: same losses ($(losses "$T/t4.txt"))" \
    '[ -n "$(losses "$T/t3.txt")" ] && [ "$(losses "$T/t3.txt")" = "$(losses "$T/t4.txt")" ] && cmp -s "$T/t3/model.safetensors" "$T/t4/model.safetensors"'
mkdir -p "$T/nvt1" "$T/nvt2"
$Z train $targs --ranks 3 --steps 2 --offload nvme --nvme-path "$T/nvt1" --out "$T/t5" --checkpoint-dir "$T/c5" >"$T/t5.txt" 2>/dev/null
mpi 3 $Z train $targs --ranks 1 --steps 2 --offload nvme --nvme-path "$T/nvt2" --out "$T/t6" --checkpoint-dir "$T/c6" >"$T/t6.txt" 2>"$T/t6.err"
check "train: 3 processes, offload nvme: same losses and model" \
    '[ -n "$(losses "$T/t5.txt")" ] && [ "$(losses "$T/t5.txt")" = "$(losses "$T/t6.txt")" ] && cmp -s "$T/t5/model.safetensors" "$T/t6/model.safetensors"'
# resume the 2-process checkpoint of step 4 with 2 processes for 2 more steps = 6 steps in one go
$Z train $targs --ranks 2 --steps 6 --out "$T/t7" --checkpoint-dir "$T/c7" >/dev/null 2>&1
cp -r "$T/c2" "$T/c8"
mpi 2 $Z train $targs --ranks 1 --steps 6 --out "$T/t8" --resume "$T/c8" >"$T/t8.txt" 2>"$T/t8.err"
check "train: 2 processes resume their checkpoint; the model equals an uninterrupted run" \
    'cmp -s "$T/t7/model.safetensors" "$T/t8/model.safetensors"'

zs_done
