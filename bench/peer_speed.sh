#!/usr/bin/env bash
# Speed of tern against llama.cpp on the synthetic files of issue #18: per file, R rounds that
# alternate `tern bench -t 2 -p 64 -n 32 -o json` and `llama-bench -t 2 -p 64 -n 32 -o json`,
# best of R per engine, and the ratios tern / llama.cpp for pp64 and tg32 (bench/peer_compare.sh
# does the alternating and the table; this fixes the settings and adds tern-only files).
#
# usage: bench/peer_speed.sh LLAMA_BENCH ROUNDS FILE[,LLAMA_FILE|,-]...
#   FILE            both engines run it
#   FILE,LLAMA_FILE tern runs FILE, llama.cpp LLAMA_FILE (a tern type against the nearest of llama.cpp's)
#   FILE,-          tern only (a tern type llama.cpp cannot read, e.g. tq4): its best of R, no ratio
# Env: TERN (default build/tern), THREADS (2), PP (64), TG (32), REPS (2: repetitions per tool run).
# e.g. bench/peer_speed.sh ~/llama.cpp/build/bin/llama-bench 6 llama-1b-Q4_0.gguf llama-1b-tq4.gguf,-
# Run it on a quiet machine: timings on a shared one are noise.
set -euo pipefail
if [ $# -lt 3 ]; then sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 64; fi
LB=$1 R=$2; shift 2
[ -x "$LB" ] || { echo "peer_speed: llama-bench '$LB' is not an executable" >&2; exit 64; }
case $R in '' | *[!0-9]* | 0) echo "peer_speed: ROUNDS '$R' is not a number >= 1" >&2; exit 64 ;; esac
TERN=${TERN:-$(dirname "$0")/../build/tern}
T=${THREADS:-2}
export TERN PP=${PP:-64} TG=${TG:-32} REPS=${REPS:-2}
both=() only=()
for arg in "$@"; do
  f=${arg%%,*}
  [ -s "$f" ] || { echo "peer_speed: no file '$f'" >&2; exit 66; }
  case $arg in *,-) only+=("$f") ;; *,*) both+=("$arg") ;; *) both+=("$f,$f") ;; esac
done
if [ ${#both[@]} -gt 0 ]; then "$(dirname "$0")/peer_compare.sh" "$LB" "$T" "$R" "${both[@]}"; fi
for f in "${only[@]+"${only[@]}"}"; do # tern alone: best of R of each test
  for r in $(seq 1 "$R"); do "$TERN" bench -m "$f" -p "$PP" -n "$TG" -r "$REPS" -t "$T" -o json 2>/dev/null; echo; done |
    python3 -c '
import json, sys
pp = tg = 0.0
dec = json.JSONDecoder(); s = sys.stdin.read(); i = 0
while i < len(s):
    if s[i].isspace(): i += 1; continue
    rows, i = dec.raw_decode(s, i)
    for r in rows:
        if r["n_gen"] > 0: tg = max(tg, r["avg_ts"])
        elif r["n_prompt"] > 0: pp = max(pp, r["avg_ts"])
n = sys.argv[1].rsplit("/", 1)[-1]; T, P, G = sys.argv[2:5]
if float(P) > 0: print(f"| {n} | (tern only) | {T} | pp{P} | {pp:.2f} | - | - | | | |")
print(f"| {n} | (tern only) | {T} | tg{G} | {tg:.2f} | - | - | | | |")' "$f" "$T" "$PP" "$TG"
done
