# tests/lib/e2e.sh — the harness of the end-to-end scripts (tests/e2e-*.sh, tests/bench/*.sh,
# tests/playground-shot.sh, tests/soak.sh), sourced first thing:
#     . "$(dirname "$0")/lib/e2e.sh"        # from tests/;  "$(dirname "$0")/../lib/e2e.sh" below it
# Sourcing it goes to the repository root and sets
#     ROOT    the repository root (the working directory from here on)
#     BUILD   $BUILD or build
#     SHARED  the fixtures: $ZS_SHARED or ../shared, as an absolute path
#     BIN     the binary: $ZS_BIN or ./zeroserve, as an absolute path (Z: the same)
# and traps EXIT (cleanup: zs_at_exit when the script defines it, background processes in
# ZS_BGPIDS killed, every server started here stopped, $T removed) and INT/TERM/HUP (exit 1).
# Then, as a script needs them:
#     zs_bash "$@"          run the script again under bash (skip when there is none)
#     zs_need [--fail] TOOL...   skip (77), or fail with --fail, when a tool is missing
#     zs_apt_install PKG... install Debian packages when root (status of apt-get)
#     zs_need_bin           fail when $BIN is not built
#     zs_need_file PATH     skip when a fixture is missing
#     zs_smollm2 [--try]    SMOL: the SmolLM2 GGUF ($ZS_SMOLLM2 or fetched); skip (--try: 1) without
#     zs_mpi_env            export OpenMPI's settings for worlds on this machine (root, oversubscribed)
#     zs_tmpdir TAG         T: a fresh temp directory, removed on exit
#     zs_setup TAG [TOOL...]   zs_need TOOL..., zs_need_bin, zs_tmpdir TAG
#     zs_model NAME         MODEL: the fixture $SHARED/models/NAME; skip without it
#     zs_start_server LOG ARGS...   "$BIN" serve on a free loopback port (sets SPID, ZS_URL)
#     zs_start_cmd LOG CMD...       any command that serves and prints its "listening on" line
#                                   (http:// or https://; ZS_CACERT: the CA curl verifies with)
#     zs_stop_server [-SIG] [PID]   SIGTERM (or SIG), up to 5 s, SIGKILL; ZS_RC its exit status
#     zs_post PATH BODY / zs_code PATH BODY   POST JSON to ZS_URL: the body / the status ($T/body)
#     zs_expect_400 PATH BODY PARAM WHAT [TEXT]   ok when it is a 400 naming PARAM (and TEXT)
#     ok MSG / nok MSG [DETAIL] / check NAME CONDITION [DETAIL]   count and print TAP lines
#     zs_done               print "N passed, N failed" and exit 0 when nothing failed, else 1
#     zs_abort MSG          nok MSG, then zs_done (a failure that ends the script)
# POSIX sh (dash); the variables and functions of the harness are named zs_* / ZS_*, besides ok,
# nok, check, ROOT, BUILD, SHARED, BIN, Z, T, SPID, SMOL.
# shellcheck shell=sh disable=SC3043,SC2034  # dash and bash have local; the variables are the scripts'

ZS_SCRIPT=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
cd "$(dirname "$ZS_SCRIPT")" || exit 1
while [ ! -f tests/lib/e2e.sh ]; do
    [ "$PWD" = / ] && { echo "not ok - no repository root above $ZS_SCRIPT"; exit 1; }
    cd .. || exit 1
done
ROOT=$PWD
BUILD=${BUILD:-build}
SHARED=${ZS_SHARED:-../shared}
case $SHARED in /*) ;; *) SHARED=$ROOT/$SHARED;; esac
[ -d "$SHARED" ] && SHARED=$(cd "$SHARED" && pwd)
BIN=${ZS_BIN:-./zeroserve}
case $BIN in /*) ;; *) BIN=$ROOT/${BIN#./};; esac
Z=$BIN
T=""
SPID=""
ZS_SERVERS=""
ZS_BGPIDS=""
ZS_NPASS=0
ZS_NFAIL=0
ZS_RC=0

# zs_bash "$@": the script again under bash, with its arguments (skip, 77, where there is none)
zs_bash() {
    [ -n "${BASH_VERSION:-}" ] && return 0
    command -v bash >/dev/null 2>&1 || { echo "skip: bash not found"; exit 77; }
    exec bash "$ZS_SCRIPT" "$@"
}

# zs_need [--fail] TOOL...: each tool on PATH, else skip (77; --fail: fail, 1) naming it
zs_need() {
    local st=77 t
    [ "${1:-}" = --fail ] && { st=1; shift; }
    for t in "$@"; do
        command -v "$t" >/dev/null 2>&1 && continue
        if [ $st = 77 ]; then echo "skip: $t not found"; else echo "not ok - $t not found"; fi
        exit $st
    done
}

# zs_apt_install PKG...: installs Debian packages when running as root with apt-get (quietly,
# updating the package lists when a first try fails); the status of the install
zs_apt_install() {
    [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 || return 1
    echo "# installing $* (apt-get install -y $*)"
    { DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq "$@" ||
      { timeout 600 apt-get update -qq && DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq "$@"; }
    } >/dev/null 2>&1
}

# zs_need_bin: the binary is built, else fail (1)
zs_need_bin() {
    [ -x "$BIN" ] && return 0
    echo "not ok - $BIN not built (make)"
    echo "0 passed, 1 failed"
    exit 1
}

# zs_need_file PATH: a fixture (file or directory) exists, else skip (77)
zs_need_file() {
    [ -e "$1" ] && return 0
    echo "skip: fixture $1 not found (ZS_SHARED=${ZS_SHARED:-../shared})"
    exit 77
}

# zs_smollm2 [--try]: SMOL, the SmolLM2-135M-Instruct GGUF fixture: $ZS_SMOLLM2, else fetched by
# server/fetch-smollm2.sh; when it cannot be had, skip (77), or with --try return 1 (SMOL empty,
# ZS_WHY the fetch's last line)
zs_smollm2() {
    local log
    SMOL=${ZS_SMOLLM2:-}
    [ -n "$SMOL" ] && [ -f "$SMOL" ] && return 0
    log=$(mktemp) || exit 1
    SMOL=$(sh server/fetch-smollm2.sh 2>"$log") || SMOL=""
    ZS_WHY=$(tail -1 "$log")
    rm -f "$log"
    [ -n "$SMOL" ] && return 0
    [ "${1:-}" = --try ] && return 1
    echo "skip: SmolLM2 could not be fetched ($ZS_WHY)"
    exit 77
}

# zs_mpi_env: exports OpenMPI's settings for worlds on this one machine: as root, more processes
# than cores, shared memory and TCP, quiet about the fabrics it does not find
zs_mpi_env() {
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    export OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_base_warn_component_unused=0 OMPI_MCA_rmaps_base_oversubscribe=1
}

# zs_tmpdir TAG: T, a fresh directory /tmp/zs-TAG.XXXXXX, removed on exit
zs_tmpdir() {
    T=$(mktemp -d "/tmp/zs-$1.XXXXXX") || exit 1
}

# zs_setup TAG [TOOL...]: the usual start: the tools (skip without them), the binary (fail
# without it), T (zs_tmpdir TAG)
zs_setup() {
    local tag="$1"
    shift
    zs_need "$@"
    zs_need_bin
    zs_tmpdir "$tag"
}

# zs_model NAME: MODEL, the fixture $SHARED/models/NAME (skip without it)
zs_model() {
    MODEL=$SHARED/models/$1
    zs_need_file "$MODEL"
}

# zs_start_cmd LOG CMD...: runs CMD in the background, its output appended to LOG, until it prints
# "listening on http://127.0.0.1:PORT" (or https://: then ZS_CACERT, when set, is the CA curl
# verifies it with, here and in zs_post/zs_code) and GET /health answers 200 (ZS_START_WAIT tenths
# of a second at most, default 600); sets SPID and ZS_URL. 1, with the log on stderr and the process
# stopped, when it exits or never becomes healthy. Every process started here is stopped on exit.
zs_start_cmd() {
    local log="$1" port="" skip=0 line scheme=http
    shift
    [ -f "$log" ] && skip=$(wc -c <"$log")
    "$@" >>"$log" 2>&1 &
    SPID=$!
    ZS_SERVERS="$ZS_SERVERS $SPID"
    for _ in $(seq "${ZS_START_WAIT:-600}"); do
        kill -0 "$SPID" 2>/dev/null || break
        if [ -z "$port" ]; then
            line=$(tail -c +$((skip + 1)) "$log" | grep -o -m1 'listening on https\{0,1\}://127\.0\.0\.1:[0-9]*')
            port=${line##*:}
            case $line in *https://*) scheme=https;; esac
        fi
        if [ -n "$port" ] && [ "$(curl -s --max-time 2 ${ZS_CACERT:+--cacert "$ZS_CACERT"} -o /dev/null \
                -w '%{http_code}' "$scheme://127.0.0.1:$port/health")" = 200 ]; then
            ZS_URL=$scheme://127.0.0.1:$port
            return 0
        fi
        sleep 0.1
    done
    tail -c +$((skip + 1)) "$log" >&2
    echo "could not start the server" >&2
    zs_stop_server "$SPID"
    return 1
}

# zs_start_server LOG ARGS...: "$BIN" serve --host 127.0.0.1 --port 0 ARGS (zs_start_cmd)
zs_start_server() {
    local log="$1"
    shift
    zs_start_cmd "$log" "$BIN" serve --host 127.0.0.1 --port 0 "$@"
}

# zs_stop_server [-SIGNAL] [PID]: SIGNAL (default TERM) to PID (default: SPID), up to 5 s for it
# to end, then SIGKILL; ZS_RC its exit status. SPID is emptied when it was PID.
zs_stop_server() {
    local sig=TERM p q rest=""
    case ${1:-} in -*) sig=${1#-}; shift;; esac
    p=${1:-$SPID}
    [ -n "$p" ] || return 0
    kill -"$sig" "$p" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null
    wait "$p" 2>/dev/null
    ZS_RC=$?
    for q in $ZS_SERVERS; do [ "$q" = "$p" ] || rest="$rest $q"; done
    ZS_SERVERS=$rest
    [ "$p" = "$SPID" ] && SPID=""
    return 0
}

zs_cleanup() {
    local p
    trap - EXIT INT TERM HUP
    command -v zs_at_exit >/dev/null 2>&1 && zs_at_exit
    for p in $ZS_BGPIDS; do kill "$p" 2>/dev/null; done
    for p in $ZS_SERVERS; do kill -TERM "$p" 2>/dev/null; done
    for p in $ZS_SERVERS; do
        for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$p" 2>/dev/null
    done
    for p in $ZS_SERVERS $ZS_BGPIDS; do wait "$p" 2>/dev/null; done
    [ -n "$T" ] && rm -rf "$T"
    return 0
}
trap zs_cleanup EXIT
trap 'echo "# interrupted"; exit 1' INT TERM HUP

# zs_post PATH BODY: POST the JSON BODY to the server at ZS_URL; prints the response's body.
# zs_code PATH BODY: the same; prints the HTTP status, the body goes to $T/body.
# Each request gives up after ZS_HTTP_TIMEOUT seconds (default 300).
zs_post() {
    curl -s --max-time "${ZS_HTTP_TIMEOUT:-300}" ${ZS_CACERT:+--cacert "$ZS_CACERT"} -H 'Content-Type: application/json' \
        "$ZS_URL$1" -d "$2"
}
zs_code() {
    curl -s --max-time "${ZS_HTTP_TIMEOUT:-300}" ${ZS_CACERT:+--cacert "$ZS_CACERT"} -o "$T/body" -w '%{http_code}' \
        -H 'Content-Type: application/json' "$ZS_URL$1" -d "$2"
}
# zs_expect_400 PATH BODY PARAM WHAT [TEXT]: ok when POST BODY answers 400 with error.param PARAM
# (PARAM ending in *: starting with the rest) and an error.message that contains TEXT
zs_expect_400() {
    local c p m pm=0
    c=$(zs_code "$1" "$2")
    p=$(jq -r '.error.param // "null"' "$T/body" 2>/dev/null)
    m=$(jq -r '.error.message // ""' "$T/body" 2>/dev/null)
    case $3 in
    *\*) case $p in "${3%\*}"*) pm=1;; esac;;
    *) [ "$p" = "$3" ] && pm=1;;
    esac
    case $m in *"${5:-}"*) ;; *) pm=0;; esac
    # shellcheck disable=SC2016 # the quotes around TEXT are part of the message
    if [ "$c" = 400 ] && [ $pm = 1 ]; then ok "$4: 400 param $p${5:+ naming '$5'}"
    else nok "$4: got $c param $p ($(head -c 300 "$T/body"))"; fi
}

# ok MSG...: a passed check; nok MSG [DETAIL]: a failed one (DETAIL in brackets when not empty)
ok() {
    ZS_NPASS=$((ZS_NPASS + 1))
    echo "ok $((ZS_NPASS + ZS_NFAIL)) - $*"
}
nok() {
    ZS_NFAIL=$((ZS_NFAIL + 1))
    echo "not ok $((ZS_NPASS + ZS_NFAIL)) - $1${2:+ ($2)}"
}
# check NAME CONDITION [DETAIL]: ok NAME when eval CONDITION succeeds, else nok NAME DETAIL
check() {
    if eval "$2"; then ok "$1"; else nok "$1" "${3:-}"; fi
}

# zs_done: the final line, and exit 0 when nothing failed (1 otherwise)
zs_done() {
    echo "$ZS_NPASS passed, $ZS_NFAIL failed"
    [ "$ZS_NFAIL" = 0 ] && exit 0
    exit 1
}

# zs_abort MSG [DETAIL]: a failure the script cannot go on after
zs_abort() {
    nok "$@"
    zs_done
}
