#!/bin/bash
# tern quantize vq2 --calib: the layers' Hessians collected on calibration text and each matrix's
# rounding errors fed forward through them (quant/vq.h, tn_vq_gptq_*), on tern's default model.
#   - every layer matrix is quantized with its Hessian (the count printed = the blk.* matrices of
#     `tern info`) and the file records the text (tern.quant.calib); it loads and generates;
#   - quality, measured on other text than the calibration's: the mean KL divergence of the
#     --calib file's logits from the q8_0 model's is below that of vq2 without --calib;
#   - bad input: a missing text, a text shorter than one chunk, --calib with a llama.cpp type
#     are refused with a message and no file.
set -u
TERN=$1; TMP=$2/quantize_vq_calib; SRC=$(cd "$(dirname "$0")/../.." && pwd)
M=$SRC/models/tern-default.gguf
mkdir -p "$TMP" && rm -f "$TMP"/*.gguf
fail=0
bad() { echo "FAIL: $*"; fail=1; }
cat "$SRC"/README.md "$SRC"/docs/*.md > "$TMP/all.txt"
head -c 30000 "$TMP/all.txt" > "$TMP/calib.txt"
tail -c +30001 "$TMP/all.txt" | head -c 12000 > "$TMP/eval.txt"
P="--allow-requantize --pure --token-embedding-type q8_0 --output-tensor-type q8_0"
"$TERN" quantize $P "$M" "$TMP/plain.gguf" vq2 -t 2 > "$TMP/plain.log" 2>&1 || bad "vq2 without --calib: $(tail -1 "$TMP/plain.log")"
"$TERN" quantize $P --calib "$TMP/calib.txt" --calib-chunks 16 "$M" "$TMP/hess.gguf" vq2 -t 2 > "$TMP/hess.log" 2>&1 ||
  bad "vq2 --calib: $(tail -1 "$TMP/hess.log")"
want=$("$TERN" info "$M" 2>/dev/null | grep -cE 'blk\.[0-9]+\.(attn_(q|k|v|output)|ffn_(gate|up|down))\.weight ')
got=$(sed -n 's/^quantize: \([0-9]*\) tensors quantized with their Hessians$/\1/p' "$TMP/hess.log")
echo "matrices quantized with their Hessians: ${got:-none} of $want"
[ "$want" -gt 0 ] && [ "${got:-0}" = "$want" ] || bad "expected $want matrices with Hessians, got '${got:-none}'"
"$TERN" info "$TMP/hess.gguf" 2>/dev/null | grep -q 'tern.quant.calib' || bad "tern.quant.calib missing"
"$TERN" generate -m "$TMP/hess.gguf" -p "And God said" -n 8 --temp 0 > /dev/null 2>&1 || bad "generate on the --calib file"
"$TERN" perplexity -m "$M" -f "$TMP/eval.txt" -c 128 -t 2 --kl-divergence-base "$TMP/base.kld" > /dev/null 2>&1 || bad "base logits"
kld() { "$TERN" perplexity -m "$1" --kl-divergence --kl-divergence-base "$TMP/base.kld" -t 2 2>/dev/null | awk '/^Mean KLD/ { print $3 }'; }
kp=$(kld "$TMP/plain.gguf"); kh=$(kld "$TMP/hess.gguf")
echo "mean KLD on held-out text: vq2 $kp, vq2 --calib $kh"
awk -v p="$kp" -v h="$kh" 'BEGIN { exit !(p > 0 && h > 0 && h < p) }' || bad "--calib did not lower the KLD ($kh vs $kp)"
# bad input
"$TERN" quantize $P --calib "$TMP/missing.txt" "$M" "$TMP/x1.gguf" vq2 > "$TMP/e1.log" 2>&1; rc=$?
[ $rc -ne 0 ] && grep -q "missing.txt" "$TMP/e1.log" && [ ! -e "$TMP/x1.gguf" ] || bad "missing --calib file: rc $rc, $(tail -1 "$TMP/e1.log")"
printf 'In the beginning' > "$TMP/short.txt"
"$TERN" quantize $P --calib "$TMP/short.txt" "$M" "$TMP/x2.gguf" vq2 > "$TMP/e2.log" 2>&1; rc=$?
[ $rc -eq 64 ] && grep -q "fewer than one chunk" "$TMP/e2.log" && [ ! -e "$TMP/x2.gguf" ] || bad "short --calib text: rc $rc, $(tail -1 "$TMP/e2.log")"
"$TERN" quantize --allow-requantize --calib "$TMP/calib.txt" "$M" "$TMP/x3.gguf" q4_0 > "$TMP/e3.log" 2>&1; rc=$?
[ $rc -eq 64 ] && grep -q "vq2" "$TMP/e3.log" && [ ! -e "$TMP/x3.gguf" ] || bad "--calib with q4_0: rc $rc, $(tail -1 "$TMP/e3.log")"
[ $fail = 0 ] && echo "PASS"
exit $fail
