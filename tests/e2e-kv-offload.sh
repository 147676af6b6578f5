#!/bin/sh
# shellcheck shell=bash disable=SC2016,SC2034
# e2e-kv-offload.sh — the KV cache's tier below memory through the server: `serve --kv-bytes N
# --kv-offload nvme --kv-nvme-path DIR` on stories260K with room for 14 blocks (a request here
# needs up to 13) answers 16 greedy completions queued at once exactly as a server whose cache
# holds them all: by default the youngest are swapped out and back in (/metrics counts them), and
# nothing is left preempted; with --kv-stream they run streamed from the tier a layer at a time
# (counted, with the bytes read and written). A cache of 7 blocks, less than one context, serves
# the longest request (13 blocks) streamed, with the same text. The swap and stream files
# are not in DIR (unlinked from the start), only the prefix tier's (a second server on the same
# DIR warns and keeps its own unlinked one). After a
# restart the prefix blocks written through to DIR are back and a long prompt takes them (same
# text); after kill -9 under load and a damaged record the server starts, drops the torn block by
# its checksum (counted in /metrics, named in the log) and answers the same. Bad flags are refused by
# name: an unknown --kv-offload, nvme without a directory, a directory that does not exist,
# --kv-nvme-path without nvme, --kv-stream without a tier, --kv-bytes 0, and a --kv-bytes
# smaller than one context without a tier (and, with one, smaller than one context streamed; and
# in generate, which runs one sequence in memory and leaves the tier unused).
# (shellcheck SC2016, SC2034: the bodies of check are single-quoted and evaluated there.)
# shellcheck source=tests/lib/e2e.sh
. "$(dirname "$0")/lib/e2e.sh"
zs_bash "$@"
zs_need curl jq
zs_need_bin
zs_model stories260K
zs_tmpdir kvoff
export ZS_DEVICE=${ZS_DEVICE:-cpu}

refused() { # NAME WANT ARGS...: generate refuses the flags with a message containing WANT
    local name=$1 want=$2 rc=0
    shift 2
    "$BIN" generate --model "$MODEL" --prompt hi --max-tokens 1 "$@" >/dev/null 2>"$T/err" || rc=$?
    check "refused: $name" '[ $rc -ne 0 ] && grep -q -- "$want" "$T/err"' "$(head -c 300 "$T/err")"
}
refused "--kv-offload disk" "--kv-offload: 'disk'" --kv-offload disk
refused "nvme without a directory" "needs --kv-nvme-path" --kv-offload nvme
refused "a missing directory" "$T/none" --kv-offload nvme --kv-nvme-path "$T/none"
refused "--kv-nvme-path without nvme" "is for --kv-offload nvme" --kv-nvme-path "$T"
refused "--kv-bytes 0" "--kv-bytes must be positive" --kv-bytes 0
refused "--kv-stream without a tier" "--kv-stream is for --kv-offload" --kv-stream
refused "--kv-bytes below one context" "less than one full context" --kv-bytes 4096
rc=0
timeout 60 "$BIN" serve --model "$MODEL" --host 127.0.0.1 --port 0 --kv-bytes 20480 --kv-offload cpu >/dev/null 2>"$T/err" || rc=$?
check "refused: serve --kv-bytes below one context even streamed" '[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "even streamed layer by layer" "$T/err"' \
    "$(head -c 300 "$T/err")"
refused "generate --kv-offload with --kv-bytes below one context (it runs one sequence in memory)" "less than one full context" \
    --kv-bytes $((7 * 20480)) --kv-offload cpu

# 16 greedy completions of 60 tokens after prompts of 52..138 tokens (a sentence repeated 3..8
# times), sent as one request so that they are all queued at once and must take turns
prompts=$(for i in $(seq 0 15); do
    s=""
    for k in $(seq 0 $((2 + i % 6))); do s="$s Once upon a time, there was a little girl named Lily $k."; done
    printf '%s\n' "$s"
done | jq -Rsc 'split("\n")[:-1]')
run_all() { # OUT: the 16 texts, one JSON string per line, in prompt order
    zs_post /v1/completions "{\"prompt\": $prompts, \"max_tokens\": 60, \"temperature\": 0, \"ignore_eos\": true}" |
        jq -c '[.choices[] | {index, text}] | sort_by(.index) | .[].text' >"$1"
}

zs_start_server "$T/ref.log" --model "$MODEL" --context 208 || zs_abort "reference server starts"
run_all "$T/ref"
zs_stop_server
mkdir -p "$T/kv"
# 14 blocks of 20480 bytes (5 layers x K and V x 16 positions x 64 values x 4 bytes)
old_log=${ZS_LOG:-}
ZS_LOG=info
export ZS_LOG
zs_start_server "$T/off.log" --model "$MODEL" --context 208 --kv-bytes $((14 * 20480)) --kv-offload nvme \
    --kv-nvme-path "$T/kv" --max-seqs 16 || zs_abort "server with --kv-offload nvme starts"
ZS_LOG=$old_log
run_all "$T/off"
same=$(paste -d '\n' "$T/ref" "$T/off" | awk 'NR % 2 { a = $0; next } $0 == a && a != "" { n++ } END { print n + 0 }')
check "16 completions through a 14-block cache on NVMe: the same text as with room for all ($same/16)" \
    '[ "$same" = 16 ] && [ "$(wc -l <"$T/ref")" = 16 ]' "$(diff "$T/ref" "$T/off" | head -5)"
curl -s "$ZS_URL/metrics" >"$T/metrics"
metric() { awk -v k="$1" '$1 == k { print $2 }' "$T/metrics"; }
outs=$(metric 'zeroserve_kv_preemptions_total{how="swap"}')
bin=$(metric 'zeroserve_kv_swap_blocks_total{dir="in"}')
bout=$(metric 'zeroserve_kv_swap_blocks_total{dir="out"}')
check "/metrics: sequences swapped out ($outs), every block back in ($bin = $bout), none preempted now, none streamed" \
    '[ "${outs:-0}" -gt 0 ] && [ "$bin" = "$bout" ] && [ "$(metric zeroserve_kv_preempted_sequences)" = 0 ] &&
     [ "$(metric zeroserve_kv_streamed_total)" = 0 ]'
check "the log says where sequences beyond memory go" 'grep -q "KV offload: sequences beyond memory swapped to NVMe under $T/kv" "$T/off.log"'
zs_stop_server
# --kv-stream: the youngest keep running, streamed
mkdir -p "$T/kv2"
zs_start_server "$T/stream.log" --model "$MODEL" --context 208 --kv-bytes $((14 * 20480)) --kv-offload nvme \
    --kv-nvme-path "$T/kv2" --max-seqs 16 --kv-stream || zs_abort "server with --kv-stream starts"
run_all "$T/stream"
check "the same 16 with --kv-stream: the same text" 'cmp -s "$T/ref" "$T/stream"' "$(diff "$T/ref" "$T/stream" | head -5)"
curl -s "$ZS_URL/metrics" >"$T/metrics"
streamed=$(metric zeroserve_kv_streamed_total)
sin=$(metric 'zeroserve_kv_stream_bytes_total{dir="in"}')
sout=$(metric 'zeroserve_kv_stream_bytes_total{dir="out"}')
check "/metrics: $streamed sequences streamed ($sin bytes read, $sout written), none streamed or preempted now" \
    '[ "${streamed:-0}" -gt 0 ] && [ "${sin:-0}" -gt 0 ] && [ "${sout:-0}" -gt 0 ] && [ "$(metric zeroserve_kv_streamed_sequences)" = 0 ] &&
     [ "$(metric zeroserve_kv_preempted_sequences)" = 0 ] && [ "$(metric zeroserve_kv_stream_write_errors_total)" = 0 ]'
zs_stop_server
# one request longer than the cache's memory: 7 blocks hold 112 positions, the 8th prompt and its
# 60 tokens need about 200; streamed, it answers as with room for all
zs_start_server "$T/long.log" --model "$MODEL" --context 208 --kv-bytes $((7 * 20480)) --kv-offload cpu || zs_abort "a 7-block server"
zs_post /v1/completions "{\"prompt\": $(jq -c '.[7]' <<<"$prompts"), \"max_tokens\": 60, \"temperature\": 0, \"ignore_eos\": true}" |
    jq -c '.choices[0].text' >"$T/long"
curl -s "$ZS_URL/metrics" >"$T/metrics"
check "a request longer than the cache's memory, streamed: the same text ($(metric zeroserve_kv_streamed_total) streamed)" \
    '[ "$(cat "$T/long")" = "$(sed -n 8p "$T/ref")" ] && [ "$(metric zeroserve_kv_streamed_total)" -gt 0 ]' "$(cat "$T/long")"
zs_stop_server
ZS_URL=
zs_start_server "$T/off2.log" --model "$MODEL" --context 208 --kv-bytes $((14 * 20480)) --kv-offload nvme \
    --kv-nvme-path "$T/kv" --max-seqs 16 || zs_abort "server with --kv-offload nvme starts again"
PF=$(ls -A "$T/kv")
check "only the prefix tier's file is in the directory (the swap file is unlinked): $PF" \
    'case $PF in prefix-[0-9a-f]*-rank0.kvt) true;; *) false;; esac'
# a second server on the same directory while this one runs: its prefix tier is a file of its own
FIRST=$SPID
FIRST_URL=$ZS_URL
zs_start_server "$T/second.log" --model "$MODEL" --context 208 --kv-offload nvme --kv-nvme-path "$T/kv" ||
    zs_abort "a second server on the same directory"
check "a second server on the same directory warns and keeps its prefix blocks to itself" \
    'grep -q "another process uses it" "$T/second.log" && [ "$(ls -A "$T/kv")" = "$PF" ]'
zs_stop_server
SPID=$FIRST
ZS_URL=$FIRST_URL
zs_stop_server
check "the server stops cleanly" '[ "$ZS_RC" = 0 ]'

# a restart: the prefix blocks written through to NVMe are back, and the longest prompt (the 8th)
# takes its leading blocks from them
start_offload() { # LOG
    zs_start_server "$1" --model "$MODEL" --context 208 --kv-bytes $((14 * 20480)) --kv-offload nvme \
        --kv-nvme-path "$T/kv" --max-seqs 16
}
one() { # OUT: the 8th prompt alone
    zs_post /v1/completions "{\"prompt\": $(jq -c '.[7]' <<<"$prompts"), \"max_tokens\": 60, \"temperature\": 0, \"ignore_eos\": true}" |
        jq -c '.choices[0].text' >"$1"
}
start_offload "$T/re.log" || zs_abort "restart"
one "$T/one"
curl -s "$ZS_URL/metrics" >"$T/metrics"
rest=$(metric zeroserve_prefix_tier_restored_blocks)
hits=$(metric zeroserve_prefix_tier_hit_blocks_total)
check "after a restart: $rest prefix blocks back from NVMe, $hits of them taken by the prompt, the same text" \
    '[ "${rest:-0}" -gt 0 ] && [ "${hits:-0}" -gt 0 ] && [ "$(cat "$T/one")" = "$(sed -n 8p "$T/ref")" ]'
# kill -9 while the 16 are being served (blocks being written), then a damaged first record (the
# block every prompt here starts with): the next start serves the same text, the torn block dropped
run_all "$T/killed" &
sleep 0.3
zs_stop_server -KILL
wait
printf '\132\245\132\245' | dd of="$T/kv/$PF" bs=1 seek=$((4096 + 64 + 100)) conv=notrunc 2>/dev/null
start_offload "$T/torn.log" || zs_abort "start after kill -9"
one "$T/one2"
curl -s "$ZS_URL/metrics" >"$T/metrics"
dropped=$(metric zeroserve_prefix_tier_dropped_blocks_total)
check "after kill -9 and a torn block: the same text, $dropped block dropped by its checksum" \
    '[ "$(cat "$T/one2")" = "$(sed -n 8p "$T/ref")" ] && [ "${dropped:-0}" -ge 1 ]' "$(cat "$T/one2")"
check "the log names the torn block" 'grep -q "does not match its checksum" "$T/torn.log"'
zs_stop_server
zs_done
