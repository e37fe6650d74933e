#!/usr/bin/env bash
# KV cache types' quality (docs/kv-cache.md): perplexity and mean KL divergence against the f16
# cache's logits, for tern and (if given) llama.cpp's llama-perplexity on the same file and text.
# usage: scripts/kv-cache-quality.sh TERN MODEL TEXT CTX OUTDIR [LLAMA_PERPLEXITY]
# Prints one markdown row per engine and cache pair: engine | K | V | PPL | mean KLD | same top.
set -euo pipefail
tern=$1 model=$2 text=$3 ctx=$4 out=$5 ll=${6:-}
mkdir -p "$out"
row() { # engine k v file
    local ppl kld top
    ppl=$(grep -o 'Final estimate: PPL = [0-9.]*\|Mean PPL(Q) *: *[0-9.]*' "$4" | head -1 | awk '{print $NF}' || true)
    kld=$(awk '/^Mean +KLD/{print $3; exit}' "$4")
    top=$(grep -o 'Same top[^:]*: *[0-9.]*' "$4" | head -1 | awk '{print $NF}' || true)
    echo "| $1 | $2 | $3 | ${ppl:-refused} | ${kld:--} | ${top:--} |"
}
"$tern" perplexity -m "$model" -f "$text" -c "$ctx" -t 1 --kl-divergence-base "$out/tern-f16.kld" >"$out/tern-f16.out" 2>&1
row tern f16 f16 "$out/tern-f16.out"
for kv in "q8_0 q8_0" "q8_0 f16" "f16 q8_0" "q4_0 q4_0" "q8_0 q4_0" "q4_0 f16" "f16 q4_0"; do
    set -- $kv
    f="$out/tern-$1-$2.out"
    "$tern" perplexity -m "$model" --kl-divergence --kl-divergence-base "$out/tern-f16.kld" -t 1 -ctk "$1" -ctv "$2" >"$f" 2>&1 || true
    row tern "$1" "$2" "$f"
done
[ -n "$ll" ] || exit 0
# llama.cpp: a quantized V cache needs flash attention (-fa on); f16 base with -fa on as well
"$ll" -m "$model" -f "$text" -c "$ctx" -t 1 -fa on --kl-divergence-base "$out/ll-f16.kld" >"$out/ll-f16.out" 2>&1 || true
row llama.cpp f16 f16 "$out/ll-f16.out"
for kv in "q8_0 q8_0" "q4_0 q4_0" "q8_0 q4_0"; do
    set -- $kv
    f="$out/ll-$1-$2.out"
    "$ll" -m "$model" -f "$text" -c "$ctx" -t 1 -fa on -ctk "$1" -ctv "$2" --kl-divergence --kl-divergence-base "$out/ll-f16.kld" >"$f" 2>&1 || true
    row llama.cpp "$1" "$2" "$f"
done
