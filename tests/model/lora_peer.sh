#!/bin/sh
# lora_peer.sh TEST_LORA TERN — tern and llama.cpp with the same base model and LoRA adapter
# (written by test_lora --make): greedy generations (--temp 0, 24 tokens) must agree. Needs a
# llama.cpp build with llama-completion or llama-cli in $TERN_LLAMA_BIN; exits 77 (skipped) and
# says why otherwise.
set -u
TL=$1
TERN=$2
LB=${TERN_LLAMA_BIN:-}
LL=""
for b in llama-completion llama-cli; do
  if [ -n "$LB" ] && [ -x "$LB/$b" ]; then LL="$LB/$b"; break; fi
done
if [ -z "$LL" ]; then
  echo "skipped: no llama-completion or llama-cli in TERN_LLAMA_BIN='$LB' (a llama.cpp build's bin/ folder)"
  exit 77
fi
D=$(mktemp -d "${TERN_TEST_TMP:-/tmp}/lora-peer.XXXXXX") || exit 1
trap 'rm -rf "$D"' EXIT
"$TL" --make "$D" || { echo "FAIL: test_lora --make"; exit 1; }
P="once upon a time"
"$TERN" generate -m "$D/base.gguf" --lora "$D/adapter.gguf" -p "$P" -n 24 --temp 0 --ignore-eos -t 1 \
  --no-display-prompt > "$D/tern.txt" 2>"$D/tern.err" || { cat "$D/tern.err"; echo "FAIL: tern generate"; exit 1; }
"$LL" -m "$D/base.gguf" --lora "$D/adapter.gguf" -p "$P" -n 24 --temp 0 --ignore-eos -t 1 -no-cnv \
  --no-display-prompt > "$D/llama.txt" 2>"$D/llama.err" </dev/null || { tail -5 "$D/llama.err"; echo "FAIL: $LL"; exit 1; }
# the texts up to their trailing newlines (llama-completion 3f545bec ends its output with a blank line)
if [ "$(cat "$D/tern.txt")" = "$(cat "$D/llama.txt")" ]; then
  echo "ok: tern and llama.cpp agree on 24 greedy tokens with the adapter"
  exit 0
fi
echo "FAIL: greedy generations differ"; echo "tern:  $(cat "$D/tern.txt")"; echo "llama: $(cat "$D/llama.txt")"
exit 1
