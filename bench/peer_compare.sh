#!/usr/bin/env bash
# Side-by-side decode/prefill benchmark: tern vs a llama.cpp llama-bench binary you built
# yourself (outside this repo), alternating runs so both see the same machine state.
#
# usage: bench/peer_compare.sh LLAMA_BENCH THREADS ROUNDS MODEL.gguf|TERN.gguf,LLAMA.gguf...
#   e.g. bench/peer_compare.sh ~/llama.cpp/build/bin/llama-bench 2 3 synth-1b-Q4_0.gguf \
#          synth-1b-tq2g64a.gguf,synth-1b-Q2_K.gguf
# A pair TERN.gguf,LLAMA.gguf runs tern on the first file and llama.cpp on the second (a tern type
# against the nearest llama.cpp type).
#
# Roofline: `tern bench` sets each tg repetition against streaming-read passes interleaved with
# its decode (read_bw_during_gbs); llama.cpp's tg of the same round is set against the read
# passes of the tern run just before it. Bytes per token = the file's weights less the token
# embedding (one row of it is read per token), from `tern info`, for either engine's file; for a
# mixture of experts, the active bytes tern bench counted (its bytes_per_token), scaled by
# llama.cpp's file size over tern's.
# The table gives best-of-rounds t/s and their ratio, and the mean over rounds of each engine's
# % roofline; every round is printed on stderr.
# Env: TERN (default build/tern), PP (512; 0 skips prefill), TG (128), REPS per tool invocation (2).
set -euo pipefail
LB=$1 T=$2 R=$3; shift 3
TERN=${TERN:-$(dirname "$0")/../build/tern}
PP=${PP:-512} TG=${TG:-128} REPS=${REPS:-2}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

# bytes of weights read per generated token: all tensors but token_embd
tok_bytes() {
  "$TERN" info "$1" | awk '$2 == "token_embd.weight" { e = $NF } $1 == "total:" { w = $4 * 1048576 }
                           END { if (w == 0) exit 1; printf "%.0f\n", w - e }'
}

printf '| tern file | llama.cpp file | threads | test | tern t/s | llama.cpp t/s | tern / llama.cpp | read GB/s during | tern %% roofline | llama.cpp %% roofline |\n'
printf '|---|---|---:|---|---:|---:|---:|---:|---:|---:|\n'
for arg in "$@"; do
  m=${arg%%,*} ml=${arg#*,}
  wt=$(tok_bytes "$m") wl=$(tok_bytes "$ml")
  : > "$tmp/rounds"
  for r in $(seq 1 "$R"); do
    "$TERN" bench -m "$m" -p "$PP" -n "$TG" -r "$REPS" -t "$T" -o json > "$tmp/t.json" 2>/dev/null
    "$LB" -m "$ml" -p "$PP" -n "$TG" -r "$REPS" -t "$T" -o json > "$tmp/l.json" 2>/dev/null
    python3 - "$tmp/t.json" "$tmp/l.json" "$wl" "$wt" >> "$tmp/rounds" <<'PY'
import json, sys
t = json.load(open(sys.argv[1])); l = json.load(open(sys.argv[2])); wl, wt = float(sys.argv[3]), float(sys.argv[4])
tp = [r for r in t if r["n_prompt"] > 0 and r["n_gen"] == 0]; tg = [r for r in t if r["n_gen"] > 0][0]
lp = [r for r in l if r["n_prompt"] > 0 and r["n_gen"] == 0]; lg = [r for r in l if r["n_gen"] > 0 and r["n_prompt"] == 0][0]
bw = tg["read_bw_during_gbs"]
if tg.get("n_expert", 0) > 0:  # MoE: the active bytes tern counted, in llama.cpp's file's proportion
    wl = tg["bytes_per_token"] * wl / wt
print(tp[0]["avg_ts"] if tp else 0, tg["avg_ts"], lp[0]["avg_ts"] if lp else 0, lg["avg_ts"], bw,
      tg["roofline_pct"], 100.0 * wl * lg["avg_ts"] / 1e9 / bw if bw > 0 else 0)
PY
    read -r a b c d e f g < <(tail -1 "$tmp/rounds")
    echo "round $r $(basename "$m") vs $(basename "$ml"): tern pp $a tg $b ($f%) | llama.cpp pp $c tg $d ($g%) | read passes $e GB/s" >&2
  done
  python3 - "$m" "$ml" "$T" "$PP" "$TG" "$tmp/rounds" <<'PY'
import os, sys
m, ml, T, PP, TG, f = sys.argv[1:7]
rows = [list(map(float, l.split())) for l in open(f) if l.strip()]
col = lambda i: [r[i] for r in rows]
mean = lambda v: sum(v) / len(v)
n, nl = os.path.basename(m), os.path.basename(ml)
if float(PP) > 0:
    tpp, lpp = max(col(0)), max(col(2))
    print(f"| {n} | {nl} | {T} | pp{PP} | {tpp:.2f} | {lpp:.2f} | {tpp / lpp:.2f}x | | | |")
ttg, ltg = max(col(1)), max(col(3))
print(f"| {n} | {nl} | {T} | tg{TG} | {ttg:.2f} | {ltg:.2f} | {ttg / ltg:.2f}x | {mean(col(4)):.1f} | "
      f"{mean(col(5)):.1f}% | {mean(col(6)):.1f}% |")
PY
done
