#!/bin/bash
# ggml's lookup-table and ternary types end to end on synthetic llamas (tern synth: tiny, whose
# 64-wide tensors make iq4_xs / tq*_0 fall back, and small, 256-multiple widths).
#
# mode e2e: tern quantize F32 -> IQ4_NL, IQ4_XS, MXFP4 (--pure: a dense model's MXFP4_MOE mix is
#   all q8_0), TQ1_0, TQ2_0; requantize IQ4_XS -> Q8_0 (--allow-requantize) works; each file
#   loads and tern generate runs; the mean KL divergence of each file's logits from the F32
#   model's (tern perplexity --kl-divergence) is measured against q4_0 --pure, a 4.5-bpw format
#   tern already trusts: iq4_nl / iq4_xs (4.5 / 4.25 bpw, levels fitted to the weights) within
#   1.5x of q4_0's, mxfp4 (power-of-two scales, 8 magnitudes) within 4x; tq1_0 and tq2_0 round
#   identically (the same ternary values) so their KLDs are equal, and below 1 nat.
# mode peer: the same inputs through llama.cpp's llama-quantize ($TERN_LLAMA_BIN, a build made
#   outside this repo; exit 77 = skipped without it): default mixes, --pure and --imatrix (a
#   tern imatrix of the small model) give byte-identical files — for the types above and for the
#   codebook i-quants IQ1_S .. IQ3_M (mixes with the imatrix, --pure with it, IQ3_S / IQ3_M also
#   without); both tools refuse IQ2_XXS, IQ2_M, IQ3_XXS, IQ1_M without an imatrix, and IQ2_XXS,
#   IQ2_XS, IQ1_S --pure with one (token_embd and output have no importance data).
set -u
MODE=$1; TERN=$2; TMP=$3/quantize_iq_$MODE; SRC=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$TMP"
fail=0
if [ "$MODE" = peer ]; then
  LB=${TERN_LLAMA_BIN:-}
  [ -n "$LB" ] && [ -x "$LB/llama-quantize" ] || { echo "skipped: no llama-quantize in TERN_LLAMA_BIN='$LB'"; exit 77; }
  export LD_LIBRARY_PATH="$LB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
for P in tiny small; do
  "$TERN" synth -o "$TMP/$P.gguf" --preset $P --type f32 >/dev/null 2>&1 || { echo "FAIL synth $P"; exit 1; }
done
TEXT="$TMP/text.txt"; cat "$SRC"/README.md "$SRC"/docs/*.md | head -c 40000 > "$TEXT"

if [ "$MODE" = peer ]; then
  "$TERN" imatrix -m "$TMP/small.gguf" -f "$TEXT" -o "$TMP/imat.gguf" -c 64 --chunks 4 -t 2 >/dev/null 2>&1 || { echo "FAIL imatrix"; exit 1; }
  cases=()
  for P in tiny small; do
    for T in IQ4_NL IQ4_XS TQ1_0 TQ2_0 MXFP4_MOE; do
      for V in mix pure imat; do
        [ $P = tiny ] && [ $V != mix ] && continue  # tiny: the fallbacks; small covers the rest
        [ $V = imat ] && { [ $P = tiny ] || [[ $T != IQ4_* ]]; } && continue
        cases+=("$P $T $V")
      done
    done
  done
  # the codebook i-quants and their mixes: with the importance matrix (llama-quantize requires
  # one for iq1_*, iq2_*, iq3_xxs tensors), --pure with it, and without it where it is optional
  for T in IQ2_XXS IQ2_XS IQ2_S IQ2_M IQ3_XXS IQ3_XS IQ3_S IQ3_M IQ1_S IQ1_M; do cases+=("small $T imat"); done
  for T in IQ2_M IQ3_XXS IQ3_S IQ1_M; do cases+=("small $T pureimat"); done
  for T in IQ3_S IQ3_M; do cases+=("small $T mix" "small $T pure"); done
  cases+=("tiny IQ3_S mix")  # 64-wide tensors fall back to iq4_nl
  for c in "${cases[@]}"; do
    read -r P T V <<<"$c"
    opt=(); [ $V = pure ] && opt=(--pure); [ $V = imat ] && opt=(--imatrix "$TMP/imat.gguf")
    [ $V = pureimat ] && opt=(--pure --imatrix "$TMP/imat.gguf")
    o="$TMP/$P-$T-$V"
    "$LB/llama-quantize" "${opt[@]}" "$TMP/$P.gguf" "$o.ref.gguf" $T 2 >"$o.ref.log" 2>&1 || { echo "FAIL llama-quantize $P $T $V"; tail -3 "$o.ref.log"; fail=1; continue; }
    "$TERN" quantize "${opt[@]}" "$TMP/$P.gguf" "$o.gguf" $T 2 >"$o.log" 2>&1 || { echo "FAIL tern quantize $P $T $V"; tail -3 "$o.log"; fail=1; continue; }
    if cmp -s "$o.gguf" "$o.ref.gguf"; then echo "ok   $P $T $V byte-identical"; else echo "FAIL $P $T $V differs: $(cmp "$o.gguf" "$o.ref.gguf" | head -1)"; fail=1; fi
    rm -f "$o.gguf" "$o.ref.gguf"
  done
  # both refuse the types that need importance data when none is given (tern: usage error, 64)
  for T in IQ2_XXS IQ2_M IQ3_XXS IQ1_M; do
    o="$TMP/small-$T-none"
    "$LB/llama-quantize" "$TMP/small.gguf" "$o.ref.gguf" $T 2 >"$o.ref.log" 2>&1 && { echo "FAIL llama-quantize made $T without an imatrix"; fail=1; }
    "$TERN" quantize "$TMP/small.gguf" "$o.gguf" $T 2 >"$o.log" 2>&1; rc=$?
    if [ $rc = 64 ] && grep -q -- "--imatrix" "$o.log" && [ ! -e "$o.gguf" ]; then echo "ok   $T without an imatrix refused (64)"; else echo "FAIL $T without an imatrix: exit $rc"; tail -2 "$o.log"; fail=1; fi
    rm -f "$o.gguf" "$o.ref.gguf"
  done
  # --pure with an imatrix puts token_embd and output (which this imatrix does not cover) in a type that cannot go without
  # one: both refuse (llama-quantize 3f545bec aborts on GGML_ASSERT(imatrix != NULL); tern exits 65
  # naming the first such tensor, leaving no file; llama-quantize leaves a partial one)
  for T in IQ2_XXS IQ2_XS IQ1_S; do
    o="$TMP/small-$T-pureimat"
    "$LB/llama-quantize" --pure --imatrix "$TMP/imat.gguf" "$TMP/small.gguf" "$o.ref.gguf" $T 2 >"$o.ref.log" 2>&1 && { echo "FAIL llama-quantize made $T --pure with token_embd uncovered"; fail=1; }
    "$TERN" quantize --pure --imatrix "$TMP/imat.gguf" "$TMP/small.gguf" "$o.gguf" $T 2 >"$o.log" 2>&1; rc=$?
    if [ $rc = 65 ] && grep -q "needs importance data" "$o.log" && [ ! -e "$o.gguf" ]; then echo "ok   $T --pure --imatrix: a tensor without importance data refused (65)"; else echo "FAIL $T --pure --imatrix: exit $rc"; tail -2 "$o.log"; fail=1; fi
    rm -f "$o.gguf" "$o.ref.gguf"
  done
  exit $fail
fi

# e2e
"$TERN" perplexity -m "$TMP/small.gguf" -f "$TEXT" -c 128 --chunks 3 -t 2 --kl-divergence-base "$TMP/base.kld" >/dev/null 2>&1 || { echo "FAIL F32 perplexity"; exit 1; }
declare -A KLD
for T in Q4_0 IQ4_NL IQ4_XS MXFP4 TQ1_0 TQ2_0; do
  f="$TMP/small-$T.gguf"
  "$TERN" quantize --pure "$TMP/small.gguf" "$f" $T 2 >"$f.log" 2>&1 || { echo "FAIL quantize $T"; tail -3 "$f.log"; fail=1; continue; }
  "$TERN" quantize "$TMP/tiny.gguf" "$TMP/tiny-$T.gguf" $T 2 >/dev/null 2>&1 || { echo "FAIL quantize tiny $T"; fail=1; }
  for g in "$f" "$TMP/tiny-$T.gguf"; do
    out=$("$TERN" generate -m "$g" -p "Once upon a time" -n 8 --temp 0 -t 2 2>&1) || { echo "FAIL generate $g: $out" | tail -3; fail=1; }
  done
  k=$("$TERN" perplexity -m "$f" -f "$TEXT" -c 128 --chunks 3 -t 2 --kl-divergence-base "$TMP/base.kld" --kl-divergence 2>&1 | awk '/Mean KLD/ {print $3}')
  [ -n "$k" ] || { echo "FAIL no KLD for $T"; fail=1; continue; }
  KLD[$T]=$k; echo "     $T: mean KLD vs F32 $k"
done
chk() { awk -v a="$2" -v b="$3" -v f="$4" 'BEGIN { exit !(a <= f * b) }' && echo "ok   $1 KLD $2 <= $4 x q4_0's $3" || { echo "FAIL $1 KLD $2 > $4 x q4_0's $3"; fail=1; }; }
chk IQ4_NL "${KLD[IQ4_NL]:-inf}" "${KLD[Q4_0]:-0}" 1.5
chk IQ4_XS "${KLD[IQ4_XS]:-inf}" "${KLD[Q4_0]:-0}" 1.5
chk MXFP4 "${KLD[MXFP4]:-inf}" "${KLD[Q4_0]:-0}" 4
[ "${KLD[TQ1_0]:-x}" = "${KLD[TQ2_0]:-y}" ] && awk -v a="${KLD[TQ1_0]}" 'BEGIN { exit !(a < 1) }' && echo "ok   tq1_0 = tq2_0 KLD ${KLD[TQ1_0]} < 1" \
  || { echo "FAIL tq1_0 / tq2_0 KLD ${KLD[TQ1_0]:-?} / ${KLD[TQ2_0]:-?}"; fail=1; }
# requantizing from an i-quant works (dequantize -> q8_0), and ggml's tq names are not tern's tq types
"$TERN" quantize --allow-requantize "$TMP/small-IQ4_XS.gguf" "$TMP/rq.gguf" Q8_0 2 >/dev/null 2>&1 && "$TERN" generate -m "$TMP/rq.gguf" -p hi -n 2 --temp 0 -t 2 >/dev/null 2>&1 \
  && echo "ok   IQ4_XS -> Q8_0 requantized" || { echo "FAIL requantize IQ4_XS"; fail=1; }
"$TERN" info "$TMP/small-TQ2_0.gguf" 2>&1 | grep -q "tern.quant.type" && { echo "FAIL TQ2_0 written as a tern type"; fail=1; }
ls "$TMP" | grep -q '\.tmp\.' && { echo "FAIL temp files left"; fail=1; }
exit $fail
