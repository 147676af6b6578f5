#!/bin/sh
# shellcheck shell=bash
# tests/openapi/schemathesis.sh — property-based testing of `zeroserve serve` against its own
# OpenAPI document (GET /openapi.json) with Schemathesis (pinned, installed into a venv under
# /tmp): every operation gets generated valid and invalid requests, and every answer is checked
# against the document (no 5xx, status codes, content types, response headers and bodies; invalid
# bodies refused; authentication not ignored). Not checked: positive_data_acceptance (that every
# schema-valid request gets a 2xx): the server validates what a schema cannot say (token ids
# below the model's vocabulary, a training file's JSONL lines, a lora_path that exists under
# --lora-dir, the model's embedding size, stream_options only with stream: true). The server runs with an --api-key-file (the
# requests carry its admin key), a --data-dir (the fine-tuning routes) and a --lora-dir. Not part
# of `make test`: it needs PyPI (or a venv already there) and a few minutes.
#
# Env: ZS_BIN (default ./zeroserve); MODEL: stories260K (default: the fixture, fast) or smollm2
# (SmolLM2-135M-Instruct, /root/.cache/zeroserve or fetched; served with --context 128 so that
# generated max_tokens and n stay cheap on a CPU); MAX_EXAMPLES per operation (default 30);
# ST_VENV (default /tmp/zs-schemathesis-venv); ST_ARGS: more arguments for `st run` (e.g.
# "--seed 7"). The report (JUnit XML and the log) stays in $ST_OUT (default /tmp/zs-schemathesis).
# Exit: 0 no failure found, 1 failures (listed), 77 skipped (no python3 / no PyPI).
# shellcheck source=tests/lib/e2e.sh
. "$(dirname "$0")/../lib/e2e.sh"
zs_bash "$@"
set -u
export ZS_DEVICE=cpu
unset ZS_API_KEY
zs_setup openapi-st curl python3
ST_VERSION=4.32.5 HYP_VERSION=6.140.0 # pinned (hypothesis 6.170.27 crashed describing a lambda: "AST constructor recursion depth mismatch")
VENV=${ST_VENV:-/tmp/zs-schemathesis-venv}
OUTD=${ST_OUT:-/tmp/zs-schemathesis}
mkdir -p "$OUTD"
if ! "$VENV/bin/st" --version 2>/dev/null | grep -q "$ST_VERSION"; then
    echo "# installing schemathesis $ST_VERSION into $VENV"
    { python3 -m venv "$VENV" && "$VENV/bin/pip" install -q "schemathesis==$ST_VERSION" "hypothesis==$HYP_VERSION"; } >"$OUTD/pip.log" 2>&1 ||
        { echo "skip: cannot install schemathesis $ST_VERSION ($(tail -1 "$OUTD/pip.log"))"; exit 77; }
fi

CTX=()
case ${MODEL:-stories260K} in
smollm2) zs_smollm2; M=$SMOL; CTX=(--context 128);;
stories260K) zs_model stories260K; M=$MODEL;;
*) M=$MODEL;;
esac
KEY=sk-st-admin
printf '%s ops admin\nsk-st-infer users inference\n' "$KEY" > "$T/keys"
mkdir -p "$T/loras"
zs_start_server "$OUTD/server.log" --model "$M" "${CTX[@]}" --api-key-file "$T/keys" --data-dir "$T/data" \
    --lora-dir "$T/loras" --max-seqs 4 --max-queue 64 || zs_abort "server starts with $M"
ok "server starts with $M"
echo "# schemathesis $ST_VERSION against $ZS_URL/openapi.json, ${MAX_EXAMPLES:-30} examples per operation"
# shellcheck disable=SC2086  # ST_ARGS is a list of words
"$VENV/bin/st" run "$ZS_URL/openapi.json" --url "$ZS_URL" -H "Authorization: Bearer $KEY" --checks all \
    --exclude-checks positive_data_acceptance \
    --max-examples "${MAX_EXAMPLES:-30}" --request-timeout 60 --workers 2 --seed "${ST_SEED:-1}" \
    --report junit --report-dir "$OUTD" ${ST_ARGS:-} > "$OUTD/st.log" 2>&1
rc=$?
tail -n 60 "$OUTD/st.log" | sed 's/^/# /'
# CPython 3.11.7's ast module (gh-106905, fixed in 3.11.8) can raise "AST constructor recursion
# depth mismatch" while Hypothesis describes a lambda: a runtime error of the tool, not an answer
# of the server; told apart from failures, which the summary lists under "Failures:"
tool_bug=0
if [ "$rc" != 0 ] && ! grep -q '^Failures:' "$OUTD/st.log" && grep -q 'AST constructor recursion depth mismatch' "$OUTD/st.log" &&
    [ "$(grep -c 'Runtime Error' "$OUTD/st.log")" -le 4 ]; then
    tool_bug=1
    echo "# note: Schemathesis stopped on CPython's AST recursion bug in an operation (not a failure of the server)"
fi
check "schemathesis finds no failure (rc $rc; $OUTD/st.log)" '[ "$rc" = 0 ] || [ "$tool_bug" = 1 ]'
check "the server is healthy after it" '[ "$(curl -s -o /dev/null -w "%{http_code}" "$ZS_URL/health")" = 200 ]'
zs_stop_server
check "the server stopped cleanly (status $ZS_RC)" '[ "$ZS_RC" = 0 ]'
check "no sanitizer report in the server log" '! grep -q Sanitizer "$OUTD/server.log"'
zs_done
