#!/bin/bash
# Quick checks of tern perplexity: KL-divergence base file + comparison (a model against its own
# logits: KLD ~ 0, same top token 100%), a quantized model gives KLD > 0, too-short text is an
# error (65), missing model 66. Exit 77 without the shared folder.
set -u
TERN=$1; TMP=$2/perplexity; mkdir -p "$TMP"
S=${TERN_SHARED_DIR:-}; M=$S/models/stories260K; D=$S/data/eval_200k.txt
[ -f "$M/stories260K-F32.gguf" ] && [ -f "$D" ] || { echo "skipped: shared models/data not found"; exit 77; }
fail=0
"$TERN" perplexity -m "$M/stories260K-F32.gguf" -f "$D" -c 128 --chunks 3 --kl-divergence-base "$TMP/base.kld" >"$TMP/a.out" 2>/dev/null || { echo "FAIL base"; fail=1; }
"$TERN" perplexity -m "$M/stories260K-F32.gguf" --kl-divergence --kl-divergence-base "$TMP/base.kld" >"$TMP/b.out" 2>/dev/null || { echo "FAIL self"; fail=1; }
grep -q "Same top token: 100.000%" "$TMP/b.out" && awk '/Mean KLD/{exit !($3 < 1e-4)}' "$TMP/b.out" && echo "ok   self KLD ~ 0" || { echo "FAIL self KLD"; cat "$TMP/b.out"; fail=1; }
"$TERN" perplexity -m "$M/stories260K-Q4_0.gguf" --kl-divergence --kl-divergence-base "$TMP/base.kld" >"$TMP/c.out" 2>/dev/null || { echo "FAIL q4_0"; fail=1; }
awk '/Mean KLD/{exit !($3 > 1e-4)}' "$TMP/c.out" && echo "ok   Q4_0 KLD > 0: $(grep 'Mean KLD' "$TMP/c.out")" || { echo "FAIL q4_0 KLD"; cat "$TMP/c.out"; fail=1; }
head -c 300 "$D" > "$TMP/short.txt"
"$TERN" perplexity -m "$M/stories260K-F32.gguf" -f "$TMP/short.txt" -c 256 >/dev/null 2>&1; rc=$?
[ $rc -eq 65 ] && echo "ok   short text -> 65" || { echo "FAIL short text exit $rc"; fail=1; }
"$TERN" perplexity -m "$TMP/nope.gguf" -f "$D" >/dev/null 2>&1; rc=$?
[ $rc -eq 66 ] && echo "ok   missing model -> 66" || { echo "FAIL missing model exit $rc"; fail=1; }
exit $fail
