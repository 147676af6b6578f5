#!/bin/sh
# models.sh — GET /v1/models: the served model(s). Prints the raw response body.
#   ZS_URL      base URL (default http://127.0.0.1:8080)
#   ZS_API_KEY  sent as "Authorization: Bearer ..." when set (read from stdin by curl, never argv)
#   ZS_CURL     extra curl flags, e.g. ZS_CURL=-i to see the status line and headers
ZS_URL=${ZS_URL:-http://127.0.0.1:8080}
auth() { [ -n "${ZS_API_KEY:-}" ] && printf 'header = "Authorization: Bearer %s"\n' "$ZS_API_KEY"; :; }
# shellcheck disable=SC2086
auth | curl -sS --fail-with-body --max-time "${ZS_TIMEOUT:-10}" -K - ${ZS_CURL:-} "$ZS_URL/v1/models"
