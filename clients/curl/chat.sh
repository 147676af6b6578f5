#!/bin/sh
# chat.sh PROMPT — POST /v1/chat/completions with one user message (and an optional system
# message). Not streamed. Prints the raw JSON response.
#   ZS_URL         base URL (default http://127.0.0.1:8080)
#   ZS_API_KEY     sent as "Authorization: Bearer ..." when set (passed to curl on stdin, not argv)
#   ZS_MODEL       model id (unset: no "model" field, which means the served model)
#   ZS_SYSTEM      a system message placed before the user message (unset: none)
#   ZS_MAX_TOKENS  max_completion_tokens (default 64)
#   ZS_TEMPERATURE temperature (0 = greedy; server default when unset)
#   ZS_SEED        seed (unset: none)
#   ZS_STOP        one stop string (unset: none)
#   ZS_EXTRA       more JSON fields, written as is, e.g. ZS_EXTRA='"top_p":0.9,"n":2'
#   ZS_CURL        extra curl flags, e.g. ZS_CURL=-i
# Exit status: 0 on HTTP 2xx, 22 on an HTTP error (the error body is still printed).
ZS_URL=${ZS_URL:-http://127.0.0.1:8080}
[ $# -ge 1 ] || { echo "usage: $0 PROMPT" >&2; exit 2; }
tab=$(printf '\t'); cr=$(printf '\r')
js() { printf '%s' "$1" | sed 's/\\/\\\\/g; s/"/\\"/g' | sed "s/$tab/\\\\t/g; s/$cr/\\\\r/g" |
       awk '{ printf "%s%s", (NR > 1 ? "\\n" : ""), $0 }'; }
auth() { [ -n "${ZS_API_KEY:-}" ] && printf 'header = "Authorization: Bearer %s"\n' "$ZS_API_KEY"; :; }
msgs=""
[ -n "${ZS_SYSTEM:-}" ] && msgs="{\"role\":\"system\",\"content\":\"$(js "$ZS_SYSTEM")\"},"
msgs="$msgs{\"role\":\"user\",\"content\":\"$(js "$1")\"}"
body="{\"messages\":[$msgs],\"max_completion_tokens\":${ZS_MAX_TOKENS:-64}"
[ -n "${ZS_TEMPERATURE:-}" ] && body="$body,\"temperature\":$ZS_TEMPERATURE"
[ -n "${ZS_SEED:-}" ] && body="$body,\"seed\":$ZS_SEED"
[ -n "${ZS_STOP:-}" ] && body="$body,\"stop\":\"$(js "$ZS_STOP")\""
[ -n "${ZS_EXTRA:-}" ] && body="$body,$ZS_EXTRA"
body="$body}"
[ -n "${ZS_MODEL:-}" ] && body="{\"model\":\"$(js "$ZS_MODEL")\",${body#\{}"
# shellcheck disable=SC2086
auth | curl -sS --fail-with-body --max-time "${ZS_TIMEOUT:-300}" -K - ${ZS_CURL:-} \
    -H 'Content-Type: application/json' --data-binary "$body" "$ZS_URL/v1/chat/completions"
