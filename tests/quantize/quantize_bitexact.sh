#!/bin/bash
# tern quantize stories260K-F32.gguf to each type llama.cpp's llama-quantize (commit 34af94cd9)
# made in $TERN_SHARED_DIR/models/stories260K: the whole output file must be byte-identical.
# Also: in == out is refused (exit 64), an unknown type is a usage error, and no temp files stay.
# Exit 77 (skipped) without the shared folder.
set -u
TERN=$1; TMP=$2/quantize; mkdir -p "$TMP"
M=${TERN_SHARED_DIR:-}/models/stories260K
[ -f "$M/stories260K-F32.gguf" ] || { echo "skipped: $M not found"; exit 77; }
fail=0
for T in Q8_0 Q4_0 Q4_K_M Q2_K; do
  "$TERN" quantize "$M/stories260K-F32.gguf" "$TMP/$T.gguf" "$T" -t 2 2>"$TMP/$T.log" || { echo "FAIL $T: exit $?"; cat "$TMP/$T.log"; fail=1; continue; }
  if cmp -s "$TMP/$T.gguf" "$M/stories260K-$T.gguf"; then echo "ok   $T byte-identical"; else echo "FAIL $T differs"; cmp "$TMP/$T.gguf" "$M/stories260K-$T.gguf"; fail=1; fi
  grep -q "converting to" "$TMP/$T.log" || { echo "FAIL $T: no progress lines"; fail=1; }
done
cp "$M/stories260K-F32.gguf" "$TMP/same.gguf"
"$TERN" quantize "$TMP/same.gguf" "$TMP/same.gguf" Q8_0 2>/dev/null; rc=$?
[ $rc -eq 64 ] && echo "ok   in == out refused" || { echo "FAIL in==out exit $rc"; fail=1; }
"$TERN" quantize "$TMP/same.gguf" "$TMP/x.gguf" Q9_9 2>/dev/null; rc=$?
[ $rc -eq 64 ] && [ ! -e "$TMP/x.gguf" ] && echo "ok   unknown type refused" || { echo "FAIL unknown type exit $rc"; fail=1; }
# a tern type round-trips through the loader
"$TERN" quantize "$M/stories260K-F32.gguf" "$TMP/tq4.gguf" tq4g32a 2>/dev/null && "$TERN" info "$TMP/tq4.gguf" | grep -q "tern.quant.type" \
  && echo "ok   tq4g32a written" || { echo "FAIL tq4g32a"; fail=1; }
ls "$TMP" | grep -q '\.tmp\.' && { echo "FAIL temp files left"; fail=1; }
exit $fail
