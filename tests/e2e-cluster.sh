#!/bin/sh
# The multi-host test (in `make test`; alone: `make test-cluster`; root): three hosts on this
# machine as network namespaces joined by a bridge (tests/cluster/net.sh), mpirun launching the
# world across them over TCP (tests/cluster/rsh.sh as its launch agent, the tcp BTL, --host).
# Checks:
#  - generate, serve and train across 3 hosts are bitwise those of one process with 3 ranks;
#  - a partition mid-generation (host 2's switch port down while a stream runs): process 0 names
#    the lost host within the keep-alive bound, the stream ends with world_lost, new requests
#    get 503 world_lost, every process and mpirun end within their bounds;
#  - a partition mid-training: the same bounds, then the run resumes from its last checkpoint
#    with the world that is left (2 hosts; equal to one process with 2 ranks resuming) and with a
#    new world of 3 hosts (equal to the uninterrupted run);
#  - a slow link (50 ms one way on host 2: `tc netem`, or tests/cluster/netdelay where the kernel
#    has no sch_netem): identical results; the slowdown is reported.
# Every wait is bounded; the namespaces and every process are removed at the end. Traffic goes
# only between the namespaces' addresses 10.231.0.0/24. Skips (77) without root, ip netns,
# unshare, mpirun, curl or jq.
# shellcheck source=tests/lib/e2e.sh
. "$(dirname "$0")/lib/e2e.sh"
zs_need_bin
[ "$(id -u)" = 0 ] || { echo "skip: the cluster test needs root (network namespaces)"; exit 77; }
zs_need ip unshare mpirun curl jq
P=zc$$
export ZS_CLUSTER_NS=$P ZS_LOG=warn OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ip netns add "$P-probe" 2>/dev/null || { echo "skip: cannot make network namespaces here"; exit 77; }
ip netns del "$P-probe"
zs_tmpdir cluster
JOBS=""
zs_at_exit() { # before the harness's cleanup: every process here and in the namespaces, then the namespaces
    for p in $JOBS; do kill -9 "$p" 2>/dev/null; done
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$P-"); do
        ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null
    done
    sh tests/cluster/net.sh down "$P"
}
now() { date +%s%N; }
secs() { echo "$(( ($2 - $1) / 1000000000 )).$(( ($2 - $1) / 100000000 % 10 ))"; } # t0 t1 (ns)
le() { [ "$(( ($2 - $1) / 1000000 ))" -le "$(( $3 * 1000 ))" ]; } # t0 t1 bound_s
# rc files of $T/wrap.sh lines: "process P exit RC TIME_NS"
exits() { awk -v t="$2" '{ printf "%sprocess %d: %d after %.1f s", (NR > 1 ? ", " : ""), $2, $4, ($5 - t) / 1e9 }' "$1" 2>/dev/null; }
ended_in() { # file t0 bound: all 3 processes exited non-zero within bound s of t0
    [ "$(awk -v t="$2" -v b="$3" '$4 != 0 && ($5 - t) / 1e9 <= b' "$1" 2>/dev/null | wc -l)" = 3 ]
}

sh tests/cluster/net.sh up "$P" 3 || { echo "could not make the hosts"; exit 1; }
H0="ip netns exec $P-h0"
cat >"$T/wrap.sh" <<'EOF'
"$@"; rc=$?
echo "process $OMPI_COMM_WORLD_RANK exit $rc $(date +%s%N)" >>"$ZS_RC_FILE"
exit $rc
EOF
# mpr NP ARGS...: mpirun on host 0 across hosts 0..NP-1 (what users run across real nodes),
# with the daemon keep-alive docs/offload.md recommends, under a time limit; the daemons stay attached
# to the launch agent, so one that fails to start ends mpirun with an error instead of a wait
MPR_LIMIT=120
mpr() {
    local np=$1 hosts; shift
    hosts=$(seq -s, -f "10.231.0.%g" 1 "$np")
    $H0 unshare --uts sh -c 'hostname "$0"; exec "$@"' "$P-h0" \
        timeout $MPR_LIMIT mpirun --mca plm_rsh_agent "$PWD/tests/cluster/rsh.sh" --mca plm_rsh_no_tree_spawn 1 \
        --mca orte_leave_session_attached 1 \
        --mca oob_tcp_if_include 10.231.0.0/24 --mca btl self,tcp --mca btl_tcp_if_include 10.231.0.0/24 \
        --mca oob_tcp_keepalive_time 10 --mca oob_tcp_keepalive_intvl 2 --mca oob_tcp_keepalive_probes 3 \
        -x ZS_CLUSTER_NS -x ZS_LOG -x ZS_RC_FILE --host "$hosts" -np "$np" "$@"
}
export ZS_RC_FILE=$T/none.rc
M=$SHARED/models/stories260K
G=$SHARED/models/gpt2-bytes

# ---------------------------------------------------------------- bitwise equal to one process
gen() { # tag model prompt tokens np
    $Z generate --model "$2" --prompt "$3" --max-tokens "$4" --temperature 0 --ranks "$5" \
        --logits-out "$T/one-$1.bin" >"$T/one-$1.txt" 2>"$T/one-$1.err"
    local t0=$(now)
    mpr "$5" "$Z" generate --model "$2" --prompt "$3" --max-tokens "$4" --temperature 0 --ranks 1 \
        --logits-out "$T/mp-$1.bin" >"$T/mp-$1.txt" 2>"$T/mp-$1.err"
    RC=$?; GEN_NS=$(( $(now) - t0 ))
}
gen st3 "$M" "Once upon a time" 16 3
check "generate, 3 hosts: exit 0, text and logits bitwise those of 3 ranks in one process" \
    '[ $RC = 0 ] && [ -s "$T/one-st3.bin" ] && cmp -s "$T/one-st3.txt" "$T/mp-st3.txt" && cmp -s "$T/one-st3.bin" "$T/mp-st3.bin" || { tail -5 "$T/mp-st3.err"; false; }'
check "generate, 3 hosts: every process on its own host" \
    'grep -q "process 1 pid [0-9]* on $P-h1, process 2 pid [0-9]* on $P-h2" "$T/mp-st3.err"'
gen gp2 "$G" "The quick brown fox" 16 2
check "generate gpt2-bytes, 2 hosts: bitwise those of 2 ranks in one process" \
    '[ $RC = 0 ] && [ -s "$T/one-gp2.bin" ] && cmp -s "$T/one-gp2.bin" "$T/mp-gp2.bin" && cmp -s "$T/one-gp2.txt" "$T/mp-gp2.txt"'

D=$T/train.jsonl
for i in $(seq 1 24); do echo "{\"prompt\":\"Q$i: what is $i plus $i?\",\"completion\":\" $((i+i)).\"}"; done >"$D"
STEPS=200
targs="--model $M --data $D --batch-size 2 --seq-len 32 --lr 1e-3 --log-every 10 --save-every 10"
losses() { sed -n 's/^step.*loss \([0-9.]*\).*/\1/p' "$1" | tr '\n' ' '; }
$Z train $targs --steps $STEPS --ranks 3 --out "$T/r3" --checkpoint-dir "$T/cr3" >"$T/r3.txt" 2>"$T/r3.err"
t0=$(now)
mpr 3 "$Z" train $targs --steps $STEPS --ranks 1 --out "$T/m3" --checkpoint-dir "$T/cm3" >"$T/m3.txt" 2>"$T/m3.err"
RC=$?; TRAIN_NS=$(( $(now) - t0 ))
check "train $STEPS steps, 3 hosts: the losses and the model of 3 ranks in one process ($(secs 0 $TRAIN_NS) s)" \
    '[ $RC = 0 ] && [ -n "$(losses "$T/r3.txt")" ] && [ "$(losses "$T/r3.txt")" = "$(losses "$T/m3.txt")" ] && cmp -s "$T/r3/model.safetensors" "$T/m3/model.safetensors" || { tail -5 "$T/m3.err"; false; }'

# ---------------------------------------------------------------- a partition mid-generation
NAME_BOUND=13   # TCP keep-alive: 5 s idle + 3 probes 2 s apart, and scheduling
PROC_BOUND=20   # + 3 s of 503s, then exit
MPIRUN_BOUND=40 # mpirun: the processes' bound, then its connection to the lost daemon gives up
                # (keep-alive 10 s + 3 x 2 s when idle; about 13 s of retransmissions with
                # tcp_retries2 5 when it holds unsent data), and scheduling
# waits for mpirun ($MP) up to twice the bound (to say how long it took); sets tend, RC
wait_mpirun() {
    tend=""
    for _ in $(seq 1 $((MPIRUN_BOUND * 20))); do kill -0 $MP 2>/dev/null || { tend=$(now); break; }; sleep 0.1; done
    if [ -n "$tend" ]; then wait $MP; RC=$?; else RC=running; kill -9 $MP 2>/dev/null; fi
}
export ZS_RC_FILE=$T/serve.rc
LOG=$T/serve.log
mpr 3 sh "$T/wrap.sh" "$Z" serve --model "$M" --ranks 1 --host 10.231.0.1 --port 0 >"$LOG" 2>&1 &
MP=$!; JOBS="$JOBS $MP"
URL=""
for _ in $(seq 1 300); do
    p=$(sed -n 's/.*listening on http:\/\/10.231.0.1:\([0-9]*\).*/\1/p' "$LOG" | head -1)
    if [ -n "$p" ] && $H0 curl -sf -m 2 "http://10.231.0.1:$p/health" >/dev/null 2>&1; then URL=http://10.231.0.1:$p; break; fi
    kill -0 $MP 2>/dev/null || break
    sleep 0.1
done
if [ -n "$URL" ]; then
    ok "serve, 3 hosts: up on 10.231.0.1, /health 200"
    c=$($H0 curl -s -m 30 "$URL/v1/completions" -H 'Content-Type: application/json' \
        -d '{"prompt":"Once upon a time","max_tokens":16,"temperature":0}')
    check "serve, 3 hosts: the completion is the one-process text" \
        '[ "Once upon a time$(echo "$c" | jq -r .choices[0].text)" = "$(cat "$T/one-st3.txt")" ]'
    p2=$(sed -n "s/.*process 2 pid \([0-9]*\) on.*/\1/p" "$LOG" | head -1)
    # streams back to back (bounded in count and time) so that one is running when the link goes
    ( for i in $(seq 1 400); do
        [ -f "$T/stop" ] && break
        $H0 curl -sN -m 40 "$URL/v1/completions" -H 'Content-Type: application/json' \
            -d '{"prompt":"Once upon a time","max_tokens":300,"stream":true}' >"$T/s$i.txt" 2>/dev/null
      done ) &
    CL=$!; JOBS="$JOBS $CL"
    sleep 1
    tcut=$(now)
    sh tests/cluster/net.sh cut "$P" 2
    tname=""
    for _ in $(seq 1 $((NAME_BOUND * 20))); do
        grep -q "process 2 (pid $p2 on $P-h2) is gone" "$LOG" && { tname=$(now); break; }
        sleep 0.05
    done
    body=$($H0 curl -s -m 5 -w '\n%{http_code}' "$URL/v1/completions" -H 'Content-Type: application/json' -d '{"prompt":"Hi","max_tokens":4}')
    touch "$T/stop"
    check "partition mid-generation: process 0 names the lost host within $NAME_BOUND s (${tname:+$(secs $tcut $tname) s})" \
        '[ -n "$tname" ] && le $tcut $tname $NAME_BOUND'
    check "partition mid-generation: a new request gets 503 world_lost naming process 2 on $P-h2" \
        '[ "$(echo "$body" | tail -1)" = 503 ] && echo "$body" | grep -q "\"world_lost\"" && echo "$body" | grep -q "process 2 (pid $p2 on $P-h2)"'
    check "partition mid-generation: the stream that was running ends with the world_lost error event" \
        'grep -l "\"text\"" "$T"/s*.txt 2>/dev/null | xargs -r grep -l "world_lost" | grep -q .'
    tend=""
    wait_mpirun
    ends=$(exits "$T/serve.rc" $tcut)
    check "partition mid-generation: every process exits non-zero within $PROC_BOUND s ($ends)" \
        'ended_in "$T/serve.rc" $tcut $PROC_BOUND'
    check "partition mid-generation: mpirun ends within $MPIRUN_BOUND s, non-zero (${tend:+$(secs $tcut $tend) s}, status $RC)" \
        '[ -n "$tend" ] && le $tcut $tend $MPIRUN_BOUND && [ "$RC" != 0 ]'
    kill $CL 2>/dev/null; wait $CL 2>/dev/null
    sh tests/cluster/net.sh mend "$P" 2
else
    nok "serve, 3 hosts: up"; tail -20 "$LOG"
fi

# ---------------------------------------------------------------- a partition mid-training
export ZS_RC_FILE=$T/train.rc
mpr 3 sh "$T/wrap.sh" "$Z" train $targs --steps $STEPS --ranks 1 --out "$T/p3" --checkpoint-dir "$T/cp3" >"$T/p3.txt" 2>"$T/p3.err" &
MP=$!; JOBS="$JOBS $MP"
for _ in $(seq 1 300); do [ -f "$T/cp3/step-000020/manifest.json" ] && break; kill -0 $MP 2>/dev/null || break; sleep 0.05; done
tcut=$(now)
sh tests/cluster/net.sh cut "$P" 2
tend=""
wait_mpirun
tname=$(grep -c "process 2 (pid [0-9]* on $P-h2) is gone" "$T/p3.err")
check "partition mid-training: cut after step 20; process 0 names the lost host; it stopped before step $STEPS" \
    '[ "$tname" -ge 1 ] && ! grep -q "^step $STEPS/" "$T/p3.txt"'
ends=$(exits "$T/train.rc" $tcut)
check "partition mid-training: every process exits non-zero within $PROC_BOUND s ($ends)" \
    'ended_in "$T/train.rc" $tcut $PROC_BOUND'
check "partition mid-training: mpirun ends within $MPIRUN_BOUND s, non-zero (${tend:+$(secs $tcut $tend) s}, status $RC)" \
    '[ -n "$tend" ] && le $tcut $tend $MPIRUN_BOUND && [ "$RC" != 0 ]'
last=$(cat "$T/cp3/latest" 2>/dev/null)
echo "# the last complete checkpoint: $last"
# the world that is left: hosts 0 and 1 (2 ranks), against one process with 2 ranks resuming the same checkpoint
cp -r "$T/cp3" "$T/cpa"; cp -r "$T/cp3" "$T/cpb"; cp -r "$T/cp3" "$T/cpc"
export ZS_RC_FILE=$T/none.rc
mpr 2 "$Z" train $targs --steps $STEPS --ranks 1 --out "$T/pa" --resume "$T/cpa" >"$T/pa.txt" 2>"$T/pa.err"
RC=$?
$Z train $targs --steps $STEPS --ranks 2 --out "$T/pb" --resume "$T/cpb" >"$T/pb.txt" 2>"$T/pb.err"
check "resume with the world that is left (2 hosts) from $last: finishes $STEPS steps, equal to one process with 2 ranks resuming" \
    '[ $RC = 0 ] && grep -q "^step $STEPS/" "$T/pa.txt" && [ -s "$T/pb/model.safetensors" ] && cmp -s "$T/pa/model.safetensors" "$T/pb/model.safetensors" || { tail -3 "$T/pa.err"; false; }'
sh tests/cluster/net.sh mend "$P" 2
mpr 3 "$Z" train $targs --steps $STEPS --ranks 1 --out "$T/pc" --resume "$T/cpc" >"$T/pc.txt" 2>"$T/pc.err"
RC=$?
check "resume with a new world of 3 hosts from $last: the model of the uninterrupted run, byte for byte" \
    '[ $RC = 0 ] && cmp -s "$T/r3/model.safetensors" "$T/pc/model.safetensors" || { tail -3 "$T/pc.err"; false; }'

# ---------------------------------------------------------------- a slow link
H2="ip netns exec $P-h2"
ND=""
gen sl "$M" "Once upon a time" 4 3
fast=$GEN_NS
if $H2 tc qdisc add dev eth0 root netem delay 50ms 2>"$T/netem.err"; then
    how="tc netem delay 50ms"
else
    how="netdelay 50 ms ($(head -1 "$T/netem.err" | tr -d '\n'): no sch_netem)"
    NDB=$BUILD/tests/cluster/netdelay
    [ -x "$NDB" ] || { mkdir -p "$T/bin"; cc -O2 -o "$T/bin/netdelay" tests/cluster/netdelay.c && NDB=$T/bin/netdelay; }
    if command -v iptables >/dev/null && [ -x "$NDB" ] &&
        $H2 iptables -A OUTPUT -o eth0 -j NFQUEUE --queue-num 0 --queue-bypass; then
        $H2 "$NDB" --queue 0 --delay-ms 50 --seconds 300 >"$T/nd.txt" 2>&1 &
        ND=$!; JOBS="$JOBS $ND"
        sleep 0.3
    else
        how=""
    fi
fi
if [ -n "$how" ]; then
    MPR_LIMIT=240
    gen sl "$M" "Once upon a time" 4 3
    slow=$GEN_NS
    check "slow link ($how on host 2): generate across 3 hosts gives the same text and logits" \
        '[ $RC = 0 ] && [ -s "$T/one-sl.bin" ] && cmp -s "$T/one-sl.bin" "$T/mp-sl.bin" && cmp -s "$T/one-sl.txt" "$T/mp-sl.txt" || { tail -5 "$T/mp-sl.err"; false; }'
    echo "# slow link: 4 tokens across 3 hosts in $(secs 0 $slow) s against $(secs 0 $fast) s ($(( slow / (fast / 10 + 1) / 10 ))x)"
    t0=$(now)
    mpr 3 "$Z" train $targs --steps 1 --ranks 1 --out "$T/s3" --checkpoint-dir "$T/cs3" >"$T/s3.txt" 2>"$T/s3.err"
    RC=$?; slow=$(( $(now) - t0 ))
    $Z train $targs --steps 1 --ranks 3 --out "$T/o3" --checkpoint-dir "$T/co3" >"$T/o3.txt" 2>/dev/null
    check "slow link: 1 training step across 3 hosts give the model of one process ($(secs 0 $slow) s)" \
        '[ $RC = 0 ] && cmp -s "$T/o3/model.safetensors" "$T/s3/model.safetensors" || { tail -5 "$T/s3.err"; false; }'
    [ -n "$ND" ] && { kill $ND; wait $ND; sed 's/^/# /' "$T/nd.txt"; }
else
    echo "# slow link: no sch_netem and no iptables/netdelay: not tested"
fi

zs_done
