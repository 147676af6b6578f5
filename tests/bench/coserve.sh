#!/bin/sh
# shellcheck shell=bash
# coserve.sh — serving and a LoRA fine-tuning job on one engine (issue 31; not part of `make test`).
# A fixed offered load of N concurrent streaming clients (tests/bench/coload.py: each streams
# /v1/completions, 32 greedy tokens with ignore_eos, back to back) on three servers of the same
# model, started side by side and measured in turn:
#   res     the base resident;
#   nvme    the base offloaded to NVMe shard files (--offload nvme --nvme-path, a temp dir), with
#           the job's passes fused into serving passes (the default);
#   nvmenf  the same with fusion off (FUSE_OFF_ARGS; only where `serve --help` lists its flag).
# Every round, on each server (their order rotates), windows of DURATION seconds:
#   nojob N   the load alone (each N of LEVELS; not on nvmenf);
#   idle      a LoRA job (many epochs over a JSONL cut from tinyshakespeare) with no load;
#   job N     the load with that job running (each N), then the job is cancelled.
# The order of LEVELS alternates between rounds. /metrics is read before and after each window,
# the job's step (its events) and trained_tokens too. Figures are medians over the rounds, ratios
# medians of per-round ratios (a ratio's two sides come from the same round and server):
#   TTFT p99 and ITL p99 with the job / without          goal <= 1.25 (res and nvme, each N)
#   job steps/min under load / (share x steps/min idle)   goal >= 0.8  (share: the server's
#       zeroserve_train_share_target, else SHARE, else 0.25)
#   NVMe bytes streamed per trained token, nvmenf / nvme  goal >= 1.5  (each N, same load)
# A metric the server does not expose prints n/a (and its ratio n/a).
#
#   sh tests/bench/coserve.sh
#   MODEL=../shared/models/stories260K DURATION=8 ROUNDS=1 sh tests/bench/coserve.sh   # a quick run
# Env: MODEL (default SmolLM2-135M-Instruct Q4_1 via server/fetch-smollm2.sh), ZS_SHARED
# (../shared), ZS_BIN (./zeroserve), LEVELS ("4 16"), ROUNDS (3), DURATION (seconds per window,
# 30), SHARE (passed as --train-share when serve has it; default: the server's own), FUSE_OFF_ARGS
# ("--train-fuse off"), NVME_ARGS (more flags of the NVMe servers, e.g. --max-live-bytes N),
# ZS_BENCH_ARGS (more flags of every server), EPOCHS (of the job, 10000), BATCH (its batch size,
# 4), LORA_R (16), BASES ("res nvme nvmenf": a subset to run), KEEP=1 (keep the scratch dir).
# shellcheck source=tests/lib/e2e.sh
. "$(dirname "$0")/../lib/e2e.sh"
zs_bash "$@"
set -u
LEVELS=${LEVELS:-4 16}
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-30}
SHARE=${SHARE:-}
FUSE_OFF_ARGS=${FUSE_OFF_ARGS:---train-fuse off}
NVME_ARGS=${NVME_ARGS:-}
EPOCHS=${EPOCHS:-10000}
BATCH=${BATCH:-4}
LORA_R=${LORA_R:-16}
BASES=${BASES:-res nvme nvmenf}
if [ -z "${MODEL:-}" ]; then
    MODEL=$(sh server/fetch-smollm2.sh) || { echo "cannot fetch SmolLM2 (give MODEL=...)" >&2; exit 1; }
fi
export ZS_DEVICE=${ZS_DEVICE:-cpu} ZS_LOG=${ZS_LOG:-warn}
for t in curl jq python3 awk; do command -v "$t" >/dev/null || { echo "$t is needed" >&2; exit 1; }; done
zs_need_bin
zs_need_file "$SHARED/data/tinyshakespeare.txt"
zs_tmpdir coserve
[ "${KEEP:-0}" = 1 ] && zs_at_exit() { cp -r "$T" "$T.kept" && echo "kept: $T.kept" >&2; }
NOTES=""
note() { NOTES="$NOTES$1"$'\n'; }

# ---------------------------------------------------------------- flags the server may not have yet
HELP=$("$BIN" serve --help 2>&1)
has_flag() { printf '%s\n' "$HELP" | grep -q -- "$1"'\b'; }
SHARE_ARGS=()
if [ -n "$SHARE" ]; then
    if has_flag --train-share; then SHARE_ARGS=(--train-share "$SHARE")
    else note "serve has no --train-share: SHARE=$SHARE is only the share assumed for the progress ratio"; fi
fi
read -r -a FUSE_OFF <<<"$FUSE_OFF_ARGS"
SERVERS=""
for b in $BASES; do
    if [ "$b" = nvmenf ] && { [ ${#FUSE_OFF[@]} = 0 ] || ! has_flag "${FUSE_OFF[0]}"; }; then
        note "serve has no ${FUSE_OFF[0]:-fusion flag}: no fusion-off server (nvmenf), bytes ratio n/a"
        continue
    fi
    SERVERS="$SERVERS $b"
done
[ -n "$SERVERS" ] || { echo "no server to run (BASES=$BASES)" >&2; exit 1; }

# ---------------------------------------------------------------- the job's data
python3 - "$SHARED/data/tinyshakespeare.txt" "$T/train.jsonl" <<'EOF'
import json, sys
text = open(sys.argv[1], encoding="utf-8").read()
with open(sys.argv[2], "w") as f:
    for i in range(64):
        f.write(json.dumps({"text": text[i * 256:(i + 1) * 256]}) + "\n")
EOF

# ---------------------------------------------------------------- servers
# start TAG ARGS...: a server (URL_TAG, PID_TAG) with its own data directory
start() {
    local tag=$1
    shift
    # shellcheck disable=SC2086
    zs_start_server "$T/server-$tag.log" --model "$MODEL" --served-model-name m --data-dir "$T/data-$tag" \
        --max-seqs 32 "${SHARE_ARGS[@]}" ${ZS_BENCH_ARGS:-} "$@" || { echo "server $tag did not start" >&2; exit 1; }
    printf -v "URL_$tag" '%s' "$ZS_URL"
    SPID=""
}
url() { local v="URL_$1"; echo "${!v}"; }
# shellcheck disable=SC2086
for s in $SERVERS; do
    case $s in
    res) start res;;
    nvme) mkdir -p "$T/nvme-nvme"; start nvme --offload nvme --nvme-path "$T/nvme-nvme" $NVME_ARGS;;
    nvmenf) mkdir -p "$T/nvme-nvmenf"; start nvmenf --offload nvme --nvme-path "$T/nvme-nvmenf" $NVME_ARGS "${FUSE_OFF[@]}";;
    *) echo "unknown base $s (BASES: res nvme nvmenf)" >&2; exit 1;;
    esac
done

J() { curl -s -m 60 -H 'Content-Type: application/json' "$@"; }
# snap URL: the counters this script reads, "name value" (labels kept in the name)
snap() {
    curl -s --max-time 30 "$1/metrics" |
        awk '!/^#/ && $1 ~ /^zeroserve_(train_|serving_wait_on_train|bytes_streamed_total|generation_tokens_total|passes_total|gather_passes_total)/ { print $1, $2 }'
}
job_field() { J "$1/v1/fine_tuning/jobs/$2" | jq -r ".$3 // 0"; }
job_step() { local v; v=$(J "$1/v1/fine_tuning/jobs/$2/events?limit=50" | jq '[.data[].data.step // 0] | max // 0' 2>/dev/null); echo "${v:-0}"; }
# job_start TAG: a long LoRA job on that server, running and past its first step; JOB
job_start() {
    local u fv fid st i resp
    u=$(url "$1")
    fv="FID_$1"
    if [ -z "${!fv:-}" ]; then
        fid=$(curl -s -m 60 -F purpose=fine-tune -F file=@"$T/train.jsonl" "$u/v1/files" | jq -r .id)
        case $fid in file-*) ;; *) echo "upload to $1 failed: $fid" >&2; exit 1;; esac
        printf -v "$fv" '%s' "$fid"
    fi
    resp=$(J "$u/v1/fine_tuning/jobs" -d "{\"model\":\"m\",\"training_file\":\"${!fv}\",\"suffix\":\"coserve\",\"seed\":1,
        \"hyperparameters\":{\"n_epochs\":$EPOCHS,\"batch_size\":$BATCH},\"lora\":{\"r\":$LORA_R,\"alpha\":$((2 * LORA_R))}}")
    JOB=$(jq -r .id <<<"$resp" 2>/dev/null)
    case $JOB in ftjob-*) ;; *) echo "job refused by $1: $resp" >&2; exit 1;; esac
    for i in $(seq 3000); do
        [ "$(job_step "$u" "$JOB")" -ge 1 ] && return 0
        st=$(job_field "$u" "$JOB" status)
        case $st in succeeded|failed|cancelled) echo "job $JOB on $1 ended ($st) before its first step:" >&2
            J "$u/v1/fine_tuning/jobs/$JOB/events?limit=5" | jq -r '.data[].message' >&2; exit 1;;
        esac
        [ $((i % 100)) = 0 ] && echo "  (waiting for the job's first step on $1: $st)" >&2
        sleep 0.2
    done
    echo "job $JOB on $1 made no step in 600 s" >&2
    exit 1
}
job_cancel() {
    local u i
    u=$(url "$1")
    J -X POST "$u/v1/fine_tuning/jobs/$2/cancel" >/dev/null
    for i in $(seq 300); do
        [ "$(job_field "$u" "$2" status)" = cancelled ] && break
        sleep 0.1
    done
    sleep 1 # the last slice ends
}

# window ROUND TAG KIND N [JOB]: one measured window; its files $T/w/ROUND.TAG.KIND.N.*
now() { date +%s.%N; }
mkdir -p "$T/w"
window() {
    local r=$1 tag=$2 kind=$3 n=$4 job=${5:-} u w
    u=$(url "$tag")
    w="$T/w/$r.$tag.$kind.$n"
    snap "$u" >"$w.s0"
    [ -n "$job" ] && { job_step "$u" "$job" >"$w.step0"; job_field "$u" "$job" trained_tokens >"$w.tok0"; }
    now >"$w.t0"
    if [ "$n" -gt 0 ]; then
        python3 tests/bench/coload.py --url "$u" --model m --clients "$n" --duration "$DURATION" >"$w.load" 2>"$w.err" ||
            { echo "load failed on $tag (N $n):" >&2; cat "$w.err" "$w.load" >&2; }
    else
        sleep "$DURATION"
    fi
    now >"$w.t1"
    snap "$u" >"$w.s1"
    if [ -n "$job" ]; then
        job_step "$u" "$job" >"$w.step1"
        job_field "$u" "$job" trained_tokens >"$w.tok1"
        job_field "$u" "$job" status >"$w.status"
    fi
    printf '  round %s %-7s %-6s N %-3s %s\n' "$r" "$tag" "$kind" "$n" \
        "$([ -s "$w.load" ] && jq -c '{requests, tokens_per_s, ttft_p99_ms, itl_p99_ms}' "$w.load")$([ -n "$job" ] &&
            echo " steps $(cat "$w.step0")->$(cat "$w.step1")")" >&2
}

echo "== serving with a LoRA job on the same engine: $(basename "$MODEL"), servers:$SERVERS, N in $LEVELS, $ROUNDS rounds of ${DURATION}s windows, $(nproc) cores, ZS_DEVICE=$ZS_DEVICE =="
# a warm-up on each server
for s in $SERVERS; do
    python3 tests/bench/coload.py --url "$(url "$s")" --model m --clients 2 --duration 2 >/dev/null 2>&1
done
read -r -a rot <<<"$SERVERS"
for r in $(seq "$ROUNDS"); do
    lv=$LEVELS
    [ $((r % 2)) = 0 ] && lv=$(echo "$LEVELS" | awk '{ for (i = NF; i > 0; i--) printf "%s ", $i }')
    k=$(((r - 1) % ${#rot[@]}))
    order="${rot[*]:k} ${rot[*]:0:k}"
    for s in $order; do
        if [ "$s" != nvmenf ]; then
            for n in $lv; do window "$r" "$s" nojob "$n"; done
        fi
        job_start "$s"
        window "$r" "$s" idle 0 "$JOB"
        for n in $lv; do window "$r" "$s" job "$n" "$JOB"; done
        job_cancel "$s" "$JOB"
    done
done

# ---------------------------------------------------------------- the figures
[ -n "$NOTES" ] && { printf '\nnotes:\n'; printf '%s' "$NOTES" | sed 's/^/  /'; }
python3 - "$T/w" "${SHARE:-}" "$LEVELS" "$SERVERS" <<'EOF'
import glob, json, os, statistics, sys
wdir, share_env, levels, servers = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4].split()

def rd(p):
    try:
        return open(p).read().strip()
    except OSError:
        return None

def num(p):
    v = rd(p)
    try:
        return float(v)
    except (TypeError, ValueError):
        return None

def snapf(p):
    m = {}
    for line in (rd(p) or "").splitlines():
        k, _, v = line.partition(" ")
        try:
            m[k] = float(v)
        except ValueError:
            pass
    return m

W = {}  # (round, tag, kind, n) -> figures
for t0 in glob.glob(os.path.join(wdir, "*.t0")):
    base = t0[:-3]
    r, tag, kind, n = os.path.basename(base).split(".")
    f = {}
    dt = num(base + ".t1") - num(t0)
    s0, s1 = snapf(base + ".s0"), snapf(base + ".s1")
    d = lambda k: (s1[k] - s0[k]) if k in s0 and k in s1 else None
    ld = rd(base + ".load")
    if ld:
        f.update(json.loads(ld))
    st0, st1 = num(base + ".step0"), num(base + ".step1")
    if st0 is not None and st1 is not None:
        f["spm"] = (st1 - st0) / dt * 60
        f["ended"] = rd(base + ".status") != "running"
    tok = d("zeroserve_train_tokens_total")
    f["tok_src"] = "metrics"
    if tok is None and num(base + ".tok0") is not None:
        tok, f["tok_src"] = num(base + ".tok1") - num(base + ".tok0"), "job"
    f["train_tok"] = tok
    # the bytes training streamed itself (its slices; a ride streams nothing more, as the serving
    # step would read those buckets anyway); all NVMe bytes where the server has no such counter
    b = d('zeroserve_train_pass_bytes_total')
    if b is None:
        b = d('zeroserve_bytes_streamed_total{tier="nvme"}')
    f["bytes"] = b
    f["bpt"] = b / tok if b is not None and tok else None
    ts = d("zeroserve_train_seconds_total")
    f["share_meas"] = ts / dt if ts is not None else None
    f["wait_s"] = d("zeroserve_serving_wait_on_train_seconds_total")
    sl, fu = d("zeroserve_train_slices_total"), d("zeroserve_train_fused_total")
    f["fused_frac"] = fu / sl if sl and fu is not None else None
    f["share_target"] = s1.get("zeroserve_train_share_target")
    W[(int(r), tag, kind, int(n))] = f
rounds = sorted({k[0] for k in W})

def med(vals):
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None

def fig(tag, kind, n, key):
    return med([W.get((r, tag, kind, n), {}).get(key) for r in rounds])

def ratio(tag_a, kind_a, tag_b, kind_b, n, key):
    """per-round a/b"""
    out = []
    for r in rounds:
        a, b = W.get((r, tag_a, kind_a, n), {}).get(key), W.get((r, tag_b, kind_b, n), {}).get(key)
        if a is not None and b:
            out.append(a / b)
    return out

def spread(vals):
    return "" if len(vals) < 2 else "(%.2f-%.2f)" % (min(vals), max(vals))

def fmt(v, p=1):
    return "n/a" if v is None else f"{v:.{p}f}"

def big(v):
    return "n/a" if v is None else f"{v:.3g}"

print()
print("medians over %d round(s); ms; steps/min of the job; share = training seconds / window; bytes = weight bytes of training's own passes" % len(rounds))
hdr = "%-7s %-5s %4s %9s %9s %9s %9s %8s %8s %9s %7s %7s %9s %10s %10s" % (
    "server", "kind", "N", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99", "req", "tok/s", "steps/min",
    "share", "fused", "wait s", "train tok", "bytes/tok")
print(hdr)
print("-" * len(hdr))
for tag in servers:
    for kind in ("nojob", "idle", "job"):
        for n in ([0] if kind == "idle" else [int(x) for x in levels]):
            if not any(k[1:] == (tag, kind, n) for k in W):
                continue
            print("%-7s %-5s %4s %9s %9s %9s %9s %8s %8s %9s %7s %7s %9s %10s %10s" % (
                tag, kind, n or "-", fmt(fig(tag, kind, n, "ttft_p50_ms")), fmt(fig(tag, kind, n, "ttft_p99_ms")),
                fmt(fig(tag, kind, n, "itl_p50_ms")), fmt(fig(tag, kind, n, "itl_p99_ms")),
                fmt(fig(tag, kind, n, "requests"), 0), fmt(fig(tag, kind, n, "tokens_per_s")),
                fmt(fig(tag, kind, n, "spm")), fmt(fig(tag, kind, n, "share_meas"), 3),
                fmt(fig(tag, kind, n, "fused_frac"), 2), fmt(fig(tag, kind, n, "wait_s"), 2),
                big(fig(tag, kind, n, "train_tok")), big(fig(tag, kind, n, "bpt"))))
ended = [k for k, f in W.items() if f.get("ended")]
if ended:
    print("warning: the job was not running at the end of %d window(s) (%s): raise EPOCHS" %
          (len(ended), ", ".join("%s/%s/%s/N%s" % k for k in sorted(ended))))
src = {f["tok_src"] for f in W.values() if f.get("train_tok") is not None}
if src == {"job"}:
    print("(trained tokens from the job's trained_tokens: no zeroserve_train_tokens_total)")

def verdict(v, goal, le):
    if v is None:
        return "n/a"
    return "PASS" if (v <= goal if le else v >= goal) else "MISS"

print()
print("ratios against the goals (medians of per-round ratios, their range over the rounds):")
line = "  %-70s %8s %-13s goal %s %-4s %s"
for tag in [t for t in ("res", "nvme") if t in servers]:
    for n in [int(x) for x in levels]:
        for key, what in (("ttft_p99_ms", "p99 TTFT"), ("itl_p99_ms", "p99 ITL")):
            rs = ratio(tag, "job", tag, "nojob", n, key)
            v = med(rs)
            print(line % ("%s N=%d: %s with job / without" % (tag, n, what), fmt(v, 3), spread(rs), "<=", 1.25,
                          verdict(v, 1.25, True)))
for tag in [t for t in ("res", "nvme", "nvmenf") if t in servers]:
    for n in [int(x) for x in levels]:
        out = []
        src = "metric"
        for r in rounds:
            j, i = W.get((r, tag, "job", n), {}), W.get((r, tag, "idle", 0), {})
            sh = j.get("share_target")
            if sh is None:
                sh, src = (float(share_env) if share_env else 0.25), ("SHARE" if share_env else "assumed 0.25")
            if j.get("spm") is not None and i.get("spm") and sh:
                out.append(j["spm"] / (sh * i["spm"]))
        v = med(out)
        print(line % ("%s N=%d: job progress / (share x idle rate) [share: %s]" % (tag, n, src), fmt(v, 3), spread(out),
                      ">=", 0.8, verdict(v, 0.8, False)))
if "nvme" in servers:
    for n in [int(x) for x in levels]:
        rs = ratio("nvmenf", "job", "nvme", "job", n, "bpt") if "nvmenf" in servers else []
        v = med(rs)
        print(line % ("nvme N=%d: NVMe bytes per trained token, unfused / fused" % n, fmt(v, 3), spread(rs), ">=", 1.5,
                      verdict(v, 1.5, False)))
EOF
