# lib.sh — helpers for the tern serve integration tests: start a server on a free loopback port
# (--port 0; the port is read from its log), always kill it on exit, bounded waits.
set -u
TERN=${1:?tern binary}
MODEL=${2:?model}
TMP=${3:?tmp dir}
mkdir -p "$TMP"
SRV_PID=""
SRV_LOG=""
FAILS=0
cleanup() {
    if [ -n "$SRV_PID" ] && kill -0 "$SRV_PID" 2>/dev/null; then
        kill -KILL "$SRV_PID" 2>/dev/null
        wait "$SRV_PID" 2>/dev/null
    fi
}
trap cleanup EXIT

# start_server ARGS... → sets SRV_PID, PORT, U
start_server() {
    SRV_LOG=$(mktemp "$TMP/serve-log.XXXXXX")
    # TERN_SERVE_ARGS: extra flags for every server (scripts/gpu-check.sh: --device cuda)
    # shellcheck disable=SC2086
    "$TERN" serve -m "$MODEL" --port 0 -t 1 ${TERN_SERVE_ARGS:-} "$@" >"$SRV_LOG" 2>&1 &
    SRV_PID=$!
    PORT=""
    for _ in $(seq 1 300); do
        PORT=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$SRV_LOG" | sed 's/.*://')
        [ -n "$PORT" ] && break
        kill -0 "$SRV_PID" 2>/dev/null || break
        sleep 0.1
    done
    if [ -z "$PORT" ]; then
        echo "FAIL: server did not start"; cat "$SRV_LOG"; exit 1
    fi
    U="http://127.0.0.1:$PORT"
}

stop_server() {
    kill -TERM "$SRV_PID" 2>/dev/null
    for _ in $(seq 1 100); do kill -0 "$SRV_PID" 2>/dev/null || break; sleep 0.1; done
    wait "$SRV_PID"; SRV_RC=$?
    SRV_PID=""
}

ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; FAILS=$((FAILS + 1)); }
# expect CODE DESC curl-args... (body in $TMP/body)
expect() {
    local want=$1 desc=$2; shift 2
    local got
    got=$(curl -sS -m 30 -o "$TMP/body" -w '%{http_code}' "$@" 2>/dev/null)
    if [ "$got" = "$want" ]; then ok "$desc ($got)"; else bad "$desc: want $want got $got: $(head -c 300 "$TMP/body")"; fi
}
alive() {
    local got
    got=$(curl -sS -m 10 -o /dev/null -w '%{http_code}' "$U/health" 2>/dev/null)
    [ "$got" = 200 ] && ok "server alive after $*" || bad "server not alive after $* ($got)"
}
finish() {
    if [ "$FAILS" -gt 0 ]; then echo "$FAILS failure(s)"; exit 1; fi
    echo "all passed"; exit 0
}
