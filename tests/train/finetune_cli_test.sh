#!/usr/bin/env bash
# finetune_cli_test.sh TERN TMPDIR — `tern finetune` (LoRA over a frozen Q4_0 base) through the
# real binary, on a `tern synth --arch qwen3 --preset tiny --type q4_0` model:
#  - JSONL chats: the validation loss falls (loss.csv: last < first), the adapter is a GGUF LoRA
#    adapter (`tern info`: general.type adapter, adapter.type lora, 2 tensors per adapted matrix);
#  - plain text works; --lora-targets restricts the tensors;
#  - bad input: malformed JSONL named by file:line (exit 65, nothing written), a chat without an
#    assistant turn, --skip-bad-lines, bad flags (exit 64);
#  - SIGINT mid-run writes the adapter so far; --ckpt-dir + --resume continues to the last step;
#    resuming with another rank is refused.
set -u
TERN=${1:?tern binary}
TMP=${2:?tmp dir}/finetune-cli.$$
mkdir -p "$TMP"
trap 'rm -rf "$TMP"' EXIT
. "$(dirname "$0")/cli_lib.sh"

"$TERN" synth --arch qwen3 --preset tiny --type q4_0 -o "$TMP/base.gguf" 2>"$TMP/err" || { cat "$TMP/err"; exit 1; }
chats="$TMP/chat.jsonl"
for i in $(seq 1 40); do
  a=$((i % 9)); b=$((i % 7))
  echo "{\"messages\":[{\"role\":\"user\",\"content\":\"$a+$b?\"},{\"role\":\"assistant\",\"content\":\"$a+$b=$((a + b))\"}]}"
done >"$chats"
FT=(finetune -m "$TMP/base.gguf" --ctx 64 --batch 4 -t 2 --lora-rank 4 --lr 1e-2 --log-every 1000)

# 1. chats: validation loss falls; the adapter's keys and tensors
"$TERN" "${FT[@]}" --data "$chats" --epochs 3 --val-split 0.1 --val-every 5 -o "$TMP/ad.gguf" 2>"$TMP/err"
if [ $? -ne 0 ]; then bad "finetune on chats: $(tail -2 "$TMP/err")"; else
  first=$(awk -F, 'NR>1 && $4!="" {print $4; exit}' "$TMP/ad.loss.csv")
  last=$(awk -F, 'NR>1 && $4!="" {v=$4} END {print v}' "$TMP/ad.loss.csv")
  awk -v f="$first" -v l="$last" 'BEGIN {exit !(l < f - 0.05)}' && ok "chats: val loss $first -> $last" || bad "chats: val loss $first -> $last"
  grep -q "trained targets" "$TMP/err" && ok "$(grep -o 'data: .*' "$TMP/err")" || bad "no data note"
  "$TERN" info "$TMP/ad.gguf" >"$TMP/info" 2>&1
  grep -Eq 'general\.type +string +"adapter"' "$TMP/info" && grep -Eq 'adapter\.type +string +"lora"' "$TMP/info" \
    && grep -Eq "adapter.lora.alpha +f32 +8" "$TMP/info" && ok "adapter keys" || bad "adapter keys: $(grep -E 'general|adapter' "$TMP/info")"
  n=$(grep -Ec "blk\.[0-9]+\.[a-z_]+\.weight\.lora_[ab] " "$TMP/info")
  [ "$n" -eq 28 ] && ok "28 lora tensors (2 layers x 7 matrices x a, b)" || bad "lora tensors: $n"
fi

# 2. plain text, two targets
for i in $(seq 1 300); do echo "the cat $((i % 5)) sat on the mat $((i % 3))."; [ $((i % 8)) -eq 0 ] && echo; done >"$TMP/text.txt"
# (`tern info` lists an adapter's keys and tensors, then says it is not a runnable model)
"$TERN" "${FT[@]}" --data "$TMP/text.txt" --steps 6 --lora-targets q,v -o "$TMP/ad2.gguf" 2>"$TMP/err" \
  || bad "plain text: $(tail -2 "$TMP/err")"
"$TERN" info "$TMP/ad2.gguf" >"$TMP/info" 2>&1
[ "$(grep -Ec '\.(attn_q|attn_v)\.weight\.lora_[ab] ' "$TMP/info")" -eq 8 ] && [ "$(grep -Ec '\.lora_[ab] ' "$TMP/info")" -eq 8 ] \
  && ok "plain text, q,v: 8 tensors; $(grep -o 'data: .*' "$TMP/err")" || bad "plain text, q,v: $(grep -c lora_ "$TMP/info") tensors"

# 3. bad input
{ head -3 "$chats"; echo '{"messages": [oops'; echo '{"messages":[{"role":"user","content":"hi"}]}'; } >"$TMP/bad.jsonl"
expect 65 "bad.jsonl:4: not JSON .*--skip-bad-lines" -- "$TERN" "${FT[@]}" --data "$TMP/bad.jsonl" --steps 2 -o "$TMP/b.gguf"
[ -e "$TMP/b.gguf" ] && bad "an adapter was written after bad data" || ok "nothing written"
{ head -3 "$chats"; echo '{"messages":[{"role":"user","content":"hi"}]}'; } >"$TMP/noans.jsonl"
expect 65 "noans.jsonl:4: the chat has no assistant turn" -- "$TERN" "${FT[@]}" --data "$TMP/noans.jsonl" --steps 2 -o "$TMP/b.gguf"
expect 0 "bad.jsonl:5: skipped: the chat has no assistant turn" -- "$TERN" "${FT[@]}" --data "$TMP/bad.jsonl" --steps 2 \
  --skip-bad-lines --val-split 0 -o "$TMP/b.gguf"
expect 64 "unknown target 'x'" -- "$TERN" "${FT[@]}" --data "$chats" --lora-targets q,x -o "$TMP/b.gguf"
expect 64 "-m base.gguf is required" -- "$TERN" finetune --data "$chats" -o "$TMP/b.gguf"
expect 64 "--lora-rank: '0'" -- "$TERN" "${FT[@]}" --data "$chats" --lora-rank 0 -o "$TMP/b.gguf"
expect 64 "--base-matmul: 'int4' .int8 or f32." -- "$TERN" "${FT[@]}" --data "$chats" --base-matmul int4 -o "$TMP/b.gguf"
expect 64 "LoRA rank 100 exceeds" -- "$TERN" "${FT[@]}" --data "$chats" --lora-rank 100 -o "$TMP/b.gguf"

# 4. SIGINT writes the adapter so far (and a checkpoint); --resume finishes the run
rm -f "$TMP/c.gguf"
"$TERN" "${FT[@]}" --data "$chats" --steps 100000 --ckpt-dir "$TMP/ck" --ckpt-every 1 -o "$TMP/c.gguf" 2>"$TMP/err" &
pid=$!
for _ in $(seq 1 100); do [ -e "$TMP/ck/latest" ] && break; sleep 0.1; done
kill -INT $pid; wait $pid; rc=$?
[ $rc -ne 0 ] && grep -q "the adapter so far is written" "$TMP/err" && [ -s "$TMP/c.gguf" ] \
  && ok "SIGINT: exit $rc, $(grep -o 'interrupted at step [0-9]*' "$TMP/err"), adapter written" || bad "SIGINT: rc $rc $(tail -1 "$TMP/err")"
step=$(grep -o 'interrupted at step [0-9]*' "$TMP/err" | grep -o '[0-9]*$')
"$TERN" "${FT[@]}" --data "$chats" --steps $((step + 3)) --ckpt-dir "$TMP/ck" --resume -o "$TMP/c.gguf" 2>"$TMP/err" \
  && grep -q "resumed from .* at step $step" "$TMP/err" && grep -q "step $((step + 3))/$((step + 3))" "$TMP/err" \
  && ok "--resume from step $step to $((step + 3))" || bad "--resume: $(tail -2 "$TMP/err")"
expect 64 "holds a LoRA adapter of rank 4, alpha 8, targets .*; this run trains a LoRA adapter of rank 2" -- \
  "$TERN" "${FT[@]}" --data "$chats" --lora-rank 2 --steps $((step + 6)) --ckpt-dir "$TMP/ck" --resume -o "$TMP/c.gguf"
exit $fail
