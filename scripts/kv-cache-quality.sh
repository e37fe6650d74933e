#!/usr/bin/env bash
# KV cache types' quality (docs/kv-cache.md): perplexity and mean KL divergence against the f16
# cache's logits, for tern and (if given) llama.cpp's llama-perplexity on the same file and text.
# usage: scripts/kv-cache-quality.sh TERN MODEL TEXT CTX OUTDIR [LLAMA_PERPLEXITY]
# Prints one markdown row per engine, cache pair and rotation (tern's --kv-rotate: none, k, kv):
# engine | K | V | rotated | PPL | mean KLD | same top.
set -euo pipefail
tern=$1 model=$2 text=$3 ctx=$4 out=$5 ll=${6:-}
mkdir -p "$out"
row() { # engine k v rotated file
    local ppl kld top
    ppl=$(grep -o 'Final estimate: PPL = [0-9.]*\|Mean PPL(Q) *: *[0-9.]*' "$5" | head -1 | awk '{print $NF}' || true)
    kld=$(awk '/^Mean +KLD/{print $3; exit}' "$5")
    top=$(grep -o 'Same top[^:]*: *[0-9.]*' "$5" | head -1 | awk '{print $NF}' || true)
    echo "| $1 | $2 | $3 | $4 | ${ppl:-refused} | ${kld:--} | ${top:--} |"
}
"$tern" perplexity -m "$model" -f "$text" -c "$ctx" -t 1 --kl-divergence-base "$out/tern-f16.kld" >"$out/tern-f16.out" 2>&1
row tern f16 f16 - "$out/tern-f16.out"
# rotation: none; k (a quantized K with its queries; what auto does); kv (V too, where V is quantized)
for kv in "q8_0 q8_0 none" "q8_0 q8_0 k" "q8_0 q8_0 kv" "q8_0 f16 none" "q8_0 f16 k" "f16 q8_0 none" "f16 q8_0 kv" \
          "q4_0 q4_0 none" "q4_0 q4_0 k" "q4_0 q4_0 kv" "q8_0 q4_0 none" "q8_0 q4_0 k" "q8_0 q4_0 kv" \
          "q4_0 f16 none" "q4_0 f16 k" "f16 q4_0 none" "f16 q4_0 kv" \
          "tq8 tq8 k" "tq4 tq4 none" "tq4 tq4 k" "tq3 tq3 none" "tq3 tq3 k" "tq2 tq2 k" "tq4 tq3 k" \
          "tq4 f16 k" "tq3 f16 k" "f16 tq4 none" "f16 tq3 none" "f16 tq2 none" "q8_0 tq3 k" "q8_0 tq2 k" \
          "tqc4 f16 none" "tqc3 f16 none" "tqc3 f16 k" "tqc2 f16 none" "tqc2 f16 k" "tq2 f16 k" \
          "tqc3 q8_0 none" "tqc2 q8_0 none" "tqc3 tq3 none" "tqc2 tq3 none"; do
    set -- $kv
    f="$out/tern-$1-$2-$3.out"
    "$tern" perplexity -m "$model" --kl-divergence --kl-divergence-base "$out/tern-f16.kld" -t 1 -ctk "$1" -ctv "$2" \
        --kv-rotate "$3" >"$f" 2>&1 || true
    row tern "$1" "$2" "$3" "$f"
done
[ -n "$ll" ] || exit 0
# llama.cpp: a quantized V cache needs flash attention (-fa on); f16 base with -fa on as well
"$ll" -m "$model" -f "$text" -c "$ctx" -t 1 -fa on --kl-divergence-base "$out/ll-f16.kld" >"$out/ll-f16.out" 2>&1 || true
row llama.cpp f16 f16 - "$out/ll-f16.out"
for kv in "q8_0 q8_0" "q4_0 q4_0" "q8_0 q4_0"; do
    set -- $kv
    f="$out/ll-$1-$2.out"
    "$ll" -m "$model" -f "$text" -c "$ctx" -t 1 -fa on -ctk "$1" -ctv "$2" --kl-divergence --kl-divergence-base "$out/ll-f16.kld" >"$f" 2>&1 || true
    row llama.cpp "$1" "$2" none "$f"
done
