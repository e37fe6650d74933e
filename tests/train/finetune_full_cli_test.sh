#!/usr/bin/env bash
# finetune_full_cli_test.sh TERN TMPDIR — `tern finetune --full` through the real binary, on a
# `tern synth --arch qwen3 --preset tiny --type f16` model:
#  - JSONL chats (loss on assistant tokens): the validation loss falls (loss.csv: last < first);
#    the model is written as f16 (default) with the base's family, and `tern generate` runs it;
#  - plain text with --out-type q8_0 (`tern info`: q8_0 matrices);
#  - the memory plan is printed and --mem-budget chooses; --ckpt-dir + --resume continues;
#  - refusals: a Q4_0 base (exit 65, names LoRA, nothing written), LoRA flags with --full and a bad
#    --out-type (exit 64).
set -u
TERN=${1:?tern binary}
TMP=${2:?tmp dir}/finetune-full.$$
mkdir -p "$TMP"
trap 'rm -rf "$TMP"' EXIT
. "$(dirname "$0")/cli_lib.sh"

"$TERN" synth --arch qwen3 --preset tiny --type f16 -o "$TMP/base.gguf" 2>"$TMP/err" || { cat "$TMP/err"; exit 1; }
"$TERN" synth --arch qwen3 --preset tiny --type q4_0 -o "$TMP/q4.gguf" 2>"$TMP/err" || { cat "$TMP/err"; exit 1; }
chats="$TMP/chat.jsonl"
for i in $(seq 1 40); do
  a=$((i % 9)); b=$((i % 7))
  echo "{\"messages\":[{\"role\":\"user\",\"content\":\"$a+$b?\"},{\"role\":\"assistant\",\"content\":\"$a+$b=$((a + b))\"}]}"
done >"$chats"
FT=(finetune --full -m "$TMP/base.gguf" --ctx 64 --batch 4 -t 2 --lr 2e-3 --log-every 1000)

# 1. chats: validation loss falls; an f16 model of the base's family that generates
"$TERN" "${FT[@]}" --data "$chats" --epochs 2 --val-split 0.1 --val-every 3 -o "$TMP/ft.gguf" 2>"$TMP/err"
if [ $? -ne 0 ]; then bad "finetune --full on chats: $(tail -2 "$TMP/err")"; else
  first=$(awk -F, 'NR>1 && $4!="" {print $4; exit}' "$TMP/ft.loss.csv")
  last=$(awk -F, 'NR>1 && $4!="" {v=$4} END {print v}' "$TMP/ft.loss.csv")
  awk -v f="$first" -v l="$last" 'BEGIN {exit !(l < f - 0.05)}' && ok "chats: val loss $first -> $last" || bad "chats: val loss $first -> $last"
  grep -q "memory plan" "$TMP/err" && grep -q "every weight, trained in f32" "$TMP/err" && ok "plan printed" || bad "no plan / note"
  "$TERN" info "$TMP/ft.gguf" >"$TMP/info" 2>&1
  grep -Eq 'general\.architecture +string +"qwen3"' "$TMP/info" && ok "qwen3 output" || bad "architecture: $(grep architecture "$TMP/info")"
  grep -q "chat_template\|tokenizer.ggml.model" "$TMP/info" && ok "tokenizer keys kept" || bad "tokenizer keys"
  n16=$(grep -Ec 'blk\.0\.[a-z_]+\.weight +\[[0-9, ]+\] +f16 ' "$TMP/info")
  [ "$n16" -ge 7 ] && ok "f16 matrices ($n16 in layer 0)" || bad "f16 matrices: $n16; $(grep 'blk\.0\.' "$TMP/info" | head -3)"
  "$TERN" generate -m "$TMP/ft.gguf" -p "3+4?" -n 8 --temp 0 >"$TMP/gen" 2>"$TMP/err"
  [ $? -eq 0 ] && ok "tern generate runs the fine-tuned model" || bad "generate: $(tail -2 "$TMP/err")"
fi

# 2. plain text, q8_0 output; --mem-budget chooses
for i in $(seq 1 300); do echo "the cat $((i % 5)) sat on the mat $((i % 3))."; [ $((i % 8)) -eq 0 ] && echo; done >"$TMP/text.txt"
"$TERN" "${FT[@]}" --data "$TMP/text.txt" --steps 3 --out-type q8_0 --mem-budget 1G -o "$TMP/ft8.gguf" 2>"$TMP/err" \
  || bad "plain text q8_0: $(tail -2 "$TMP/err")"
grep -q "mem-budget .* fits" "$TMP/err" && ok "$(grep -o 'mem-budget .* fits' "$TMP/err")" || bad "budget note"
"$TERN" info "$TMP/ft8.gguf" >"$TMP/info" 2>&1
[ "$(grep -Ec 'blk\.0\.[a-z_]+\.weight +\[[0-9, ]+\] +q8_0 ' "$TMP/info")" -ge 7 ] && ok "q8_0 matrices" || bad "q8_0: $(grep 'blk\.0\.' "$TMP/info" | head -3)"

# 3. checkpoints and --resume
"$TERN" "${FT[@]}" --data "$TMP/text.txt" --steps 2 --ckpt-dir "$TMP/ck" -o "$TMP/r.gguf" 2>"$TMP/err" || bad "ckpt run: $(tail -2 "$TMP/err")"
expect 0 "resumed from .* at step 2" -- "$TERN" "${FT[@]}" --data "$TMP/text.txt" --steps 4 --ckpt-dir "$TMP/ck" --resume -o "$TMP/r.gguf"

# 4. refusals
expect 65 "q4_0 tensor .*LoRA" -- "$TERN" finetune --full -m "$TMP/q4.gguf" --data "$chats" --steps 2 -o "$TMP/b.gguf"
[ -e "$TMP/b.gguf" ] && bad "a model was written for a quantized base" || ok "nothing written"
expect 64 "--lora-rank is a LoRA option" -- "$TERN" "${FT[@]}" --data "$chats" --lora-rank 4 -o "$TMP/b.gguf"
expect 64 "--out-type: 'iq2_xxs'" -- "$TERN" "${FT[@]}" --data "$chats" --out-type iq2_xxs -o "$TMP/b.gguf"
expect 64 "--out-type is for --full" -- "$TERN" finetune -m "$TMP/q4.gguf" --data "$chats" --out-type f16 -o "$TMP/b.gguf"
exit $fail
