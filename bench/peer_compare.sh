#!/usr/bin/env bash
# Side-by-side decode/prefill benchmark: tern vs a llama.cpp llama-bench binary you built
# yourself (outside this repo), on the same GGUF files, alternating runs so both see the same
# machine state. Also measures the streaming-read roofline (tern bench's bandwidth probe) in the
# same run. Prints a markdown table of best-of-rounds t/s, ratios and % of roofline.
#
# usage: bench/peer_compare.sh LLAMA_BENCH THREADS ROUNDS MODEL.gguf...
#   e.g. bench/peer_compare.sh ~/llama.cpp/build/bin/llama-bench 2 3 synth-1b-Q4_0.gguf
# Env: TERN (default build/tern), PP (512), TG (128), REPS per tool invocation (2).
set -euo pipefail
LB=$1 T=$2 R=$3; shift 3
TERN=${TERN:-$(dirname "$0")/../build/tern}
PP=${PP:-512} TG=${TG:-128} REPS=${REPS:-2}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
printf '| model | size MiB | threads | test | tern t/s | llama.cpp t/s | tern / llama.cpp | read GB/s | tern %% roofline | llama.cpp %% roofline |\n'
printf '|---|---:|---:|---|---:|---:|---:|---:|---:|---:|\n'
for m in "$@"; do
  bt_pp=0 bt_tg=0 bl_pp=0 bl_tg=0 bw=0 size=0 wpt=0
  for r in $(seq 1 "$R"); do
    "$TERN" bench -m "$m" -p "$PP" -n "$TG" -r "$REPS" -t "$T" -o json > "$tmp/t.json" 2>/dev/null
    "$LB" -m "$m" -p "$PP" -n "$TG" -r "$REPS" -t "$T" -o json > "$tmp/l.json" 2>/dev/null
    read -r tpp ttg tbw tsize twpt < <(python3 - "$tmp/t.json" <<'PY'
import json,sys
rows=json.load(open(sys.argv[1]))
pp=[r for r in rows if r["n_prompt"]>0][0]; tg=[r for r in rows if r["n_gen"]>0][0]
print(pp["avg_ts"], tg["avg_ts"], tg["read_bw_gbs"], tg["model_size"], tg.get("bytes_per_token", tg["model_size"]))
PY
)
    read -r lpp ltg < <(python3 - "$tmp/l.json" <<'PY'
import json,sys
rows=json.load(open(sys.argv[1]))
pp=[r for r in rows if r["n_prompt"]>0 and r["n_gen"]==0][0]; tg=[r for r in rows if r["n_gen"]>0 and r["n_prompt"]==0][0]
print(pp["avg_ts"], tg["avg_ts"])
PY
)
    bt_pp=$(python3 -c "print(max($bt_pp,$tpp))"); bt_tg=$(python3 -c "print(max($bt_tg,$ttg))")
    bl_pp=$(python3 -c "print(max($bl_pp,$lpp))"); bl_tg=$(python3 -c "print(max($bl_tg,$ltg))")
    bw=$(python3 -c "print(max($bw,$tbw))"); size=$tsize; wpt=$twpt
    echo "round $r $(basename "$m"): tern pp $tpp tg $ttg | llama.cpp pp $lpp tg $ltg | bw $tbw GB/s" >&2
  done
  python3 - "$m" "$T" "$PP" "$TG" "$bt_pp" "$bt_tg" "$bl_pp" "$bl_tg" "$bw" "$size" "$wpt" <<'PY'
import sys,os
m,T,PP,TG=sys.argv[1],sys.argv[2],sys.argv[3],sys.argv[4]
tpp,ttg,lpp,ltg,bw,size,wpt=map(float,sys.argv[5:12])
name=os.path.basename(m)
roof=lambda ts: 100.0*wpt*ts/1e9/bw if bw>0 else 0
print(f"| {name} | {size/1048576:.0f} | {T} | pp{PP} | {tpp:.2f} | {lpp:.2f} | {tpp/lpp:.2f}x | | | |")
print(f"| {name} | {size/1048576:.0f} | {T} | tg{TG} | {ttg:.2f} | {ltg:.2f} | {ttg/ltg:.2f}x | {bw:.1f} | {roof(ttg):.0f}% | {roof(ltg):.0f}% |")
PY
done
