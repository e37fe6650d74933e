#!/usr/bin/env bash
# batch_decode.sh [TERN] [PRESET] [THREADS] — decode throughput of tern serve's batched forward:
# the start-up cost model measures one decode step of 1 and of N sequences (one forward pass each),
# for N = 1, 2, 4, 8; then a short loadgen run at a rate near capacity. Loopback only.
set -u
TERN=${1:-build-serve/tern}
PRESET=${2:-small}
T=${3:-1}
TMP=$(mktemp -d)
trap 'kill $PID 2>/dev/null; rm -rf "$TMP"' EXIT
"$TERN" synth --preset "$PRESET" --type q8_0 -o "$TMP/m.gguf" >/dev/null 2>&1 || exit 1
for np in 1 2 4 8; do
    "$TERN" serve -m "$TMP/m.gguf" --port 0 -np $np -t "$T" >"$TMP/log" 2>&1 &
    PID=$!
    for _ in $(seq 1 600); do grep -q listening "$TMP/log" && break; sleep 0.1; done
    grep -o 'cost model:.*' "$TMP/log" | sed "s/^/np=$np /"
    if [ $np = 8 ]; then
        URL=$(grep -o 'http://127.0.0.1:[0-9]*' "$TMP/log")
        "$TERN" loadgen --url "$URL" --rate 1 --duration 10 --prompt-len 16-64 --output-len 32-96 --ttft-slo 2000 --tpot-slo 200
    fi
    kill -TERM $PID; wait $PID
done
