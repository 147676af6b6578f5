# start-server.sh — sourced by the scripts that need one running server (tests/bench/http-load.sh,
# tests/playground-shot.sh): zs_start_server LOG ARGS... starts "$BIN" serve on a free loopback
# port (--port 0; the port is read from the "listening on" line), waits up to 60 s for /health
# to answer 200, and sets SPID and ZS_URL. Returns 1 (with the log on stderr) when the server
# exits or never becomes healthy.
zs_start_server() {
    local log=$1 port=""
    shift
    "$BIN" serve --host 127.0.0.1 --port 0 "$@" >"$log" 2>&1 &
    SPID=$!
    for _ in $(seq 600); do
        kill -0 "$SPID" 2>/dev/null || break
        [ -n "$port" ] || port=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$log" | head -1)
        if [ -n "$port" ] && [ "$(curl -s --max-time 2 -o /dev/null -w '%{http_code}' \
                "http://127.0.0.1:$port/health")" = 200 ]; then
            ZS_URL=http://127.0.0.1:$port
            return 0
        fi
        sleep 0.1
    done
    cat "$log" >&2
    echo "could not start the server" >&2
    kill -TERM "$SPID" 2>/dev/null
    wait "$SPID" 2>/dev/null
    SPID=""
    return 1
}
