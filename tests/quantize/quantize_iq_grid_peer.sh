#!/bin/bash
# llama.cpp's codebook i-quant files run in tern (issue #26): a synthetic llama (tern synth
# --preset small: 256-multiple widths, so every matrix takes the type), a tern imatrix of it, and
# llama.cpp's own llama-quantize --imatrix to IQ2_XXS, IQ2_XS, IQ2_M, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M
# (default mixes: the i-quant for most matrices, whatever llama.cpp picks for the rest; ftype IQ2_M
# is the one whose matrices are iq2_s — ftype IQ2_S makes them iq2_xs). Then, per file:
#   - greedy tokens: tern generate and llama.cpp (the greedy driver, linked with that llama.cpp)
#     decode STEPS (32) tokens from the same prompt ids; bench/peer_greedy.sh judges them: identical,
#     or a first differing step where both engines' top-1 margins are within the activation
#     rounding bound (near-tie, reported); MISMATCH fails. Both engines read the same weights, so
#     a wrong dequantization or dot product shows as a mismatch at once.
#   - tern perplexity runs and prints a finite perplexity.
# Needs $TERN_LLAMA_BIN/llama-quantize (a llama.cpp build made outside this repo) and the greedy
# driver ($TERN_GREEDY_DRIVER, default $TERN_LLAMA_BIN/../../../greedy_llama); exit 77 = skipped,
# saying which is missing. Nothing llama.cpp writes is kept (files live in the test's temp dir).
# usage: quantize_iq_grid_peer.sh TERN TMPDIR
set -u
TERN=$1; TMP=$2/quantize_iq_grid_peer; SRC=$(cd "$(dirname "$0")/../.." && pwd)
LB=${TERN_LLAMA_BIN:-}
[ -n "$LB" ] && [ -x "$LB/llama-quantize" ] || { echo "skipped: no llama-quantize in TERN_LLAMA_BIN='$LB'"; exit 77; }
DRV=${TERN_GREEDY_DRIVER:-$LB/../../../greedy_llama}
[ -x "$DRV" ] || { echo "skipped: no greedy driver at '$DRV' (set TERN_GREEDY_DRIVER)"; exit 77; }
export LD_LIBRARY_PATH="$LB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
TYPES=${IQ_TYPES:-IQ2_XXS IQ2_XS IQ2_M IQ3_XXS IQ3_S IQ1_S IQ1_M}
tensor_type() { [ "$1" = IQ2_M ] && echo iq2_s || echo "${1,,}"; }
rm -rf "$TMP"; mkdir -p "$TMP"
fail=0
TEXT="$TMP/text.txt"; cat "$SRC"/README.md "$SRC"/docs/*.md | head -c 40000 > "$TEXT"
"$TERN" synth -o "$TMP/llama-small-F32.gguf" --preset small --type f32 >/dev/null 2>&1 || { echo "FAIL synth"; exit 1; }
"$TERN" imatrix -m "$TMP/llama-small-F32.gguf" -f "$TEXT" -o "$TMP/imat.gguf" -c 64 --chunks 4 -t 2 >/dev/null 2>&1 || { echo "FAIL imatrix"; exit 1; }
for T in $TYPES; do
  "$LB/llama-quantize" --imatrix "$TMP/imat.gguf" "$TMP/llama-small-F32.gguf" "$TMP/llama-small-$T.gguf" "$T" 2 >"$TMP/lq-$T.log" 2>&1 \
    || { echo "FAIL llama-quantize $T: $(tail -1 "$TMP/lq-$T.log")"; fail=1; continue; }
  tt=$(tensor_type "$T")
  n=$("$TERN" info "$TMP/llama-small-$T.gguf" 2>/dev/null | grep -c " $tt ")
  [ "$n" -gt 0 ] && echo "ok   $T file: $n tensors of type $tt" || { echo "FAIL $T file has no $tt tensor"; fail=1; }
  ppl=$("$TERN" perplexity -m "$TMP/llama-small-$T.gguf" -f "$TEXT" -c 128 --chunks 1 -t 2 2>&1 | sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p')
  awk -v p="${ppl:-x}" 'BEGIN { exit !(p + 0 > 0 && p + 0 < 1e30) }' && echo "ok   $T perplexity $ppl" || { echo "FAIL $T perplexity '${ppl:-}'"; fail=1; }
done
# peer_greedy.sh reuses the files in WORK; an LLAMA_BUILD without bin/llama-quantize skips its own
# (imatrix-less) quantization
TABLE=$(WORK="$TMP" TERN="$TERN" TYPES="$TYPES" PRESETS=small STEPS=${STEPS:-32} THREADS=2 \
  bash "$SRC/bench/peer_greedy.sh" "$TMP/no-llama-quantize" "$DRV" llama 2>"$TMP/greedy.err") || { echo "FAIL peer_greedy: $(tail -3 "$TMP/greedy.err")"; fail=1; }
echo "$TABLE"
for T in $TYPES; do
  row=$(echo "$TABLE" | grep "| $T |")
  case "$row" in
    *"| identical |"*) echo "ok   $T greedy tokens identical" ;;
    *"| near-tie |"*) echo "ok   $T greedy tokens agree up to a near-tie: $row" ;;
    *) echo "FAIL $T greedy: ${row:-no row}"; fail=1 ;;
  esac
done
exit $fail
