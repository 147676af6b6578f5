#!/bin/sh
# health.sh — GET /health: 200 {"status":...} once the model is loaded, 503 {"status":"loading"}
# before. /health needs no API key. Prints the raw response body.
#   ZS_URL      base URL (default http://127.0.0.1:8080)
#   ZS_CURL     extra curl flags, e.g. ZS_CURL=-i to see the status line and headers
ZS_URL=${ZS_URL:-http://127.0.0.1:8080}
# shellcheck disable=SC2086
exec curl -sS --fail-with-body --max-time "${ZS_TIMEOUT:-10}" ${ZS_CURL:-} "$ZS_URL/health"
