#!/usr/bin/env bash
# mem_cli_test.sh TERN TMPDIR — the memory plan of `tern train` / `tern finetune` through the real
# binary (docs/training.md, "Memory"):
#  - the plan table is printed before step 1 (each buffer class, the predicted peak, what is
#    recomputed), for train and for finetune (LoRA over a `tern synth` Q4_0 base: the mapped base);
#  - peak RSS (getrusage ru_maxrss, the "peak RSS" of the done line) within 10% of the plan's
#    predicted peak for `--preset 15m --batch 8` (ctx 256, vocab 340: about 420 MiB planned), with
#    --recompute none and full, once the binary's own footprint is taken off: the peak RSS of the
#    tiny run (step 1) minus its plan (~12 MiB; ~165 MiB in a CUDA build, whose libraries' pages
#    count from exec);
#  - --recompute full/attn lower the planned bytes; --grad-accum 2 gives the unsplit run's final
#    loss (to the 4 printed decimals: test_memplan checks the weights);
#  - --mem-budget picks a configuration that fits and says so; too small a budget is refused with
#    exit 64 naming the smallest configuration and its bytes, nothing written; bad flag values 64.
set -u
TERN=${1:?tern binary}
TMP=${2:?tmp dir}/mem-cli.$$
mkdir -p "$TMP"
trap 'rm -rf "$TMP"' EXIT
. "$(dirname "$0")/cli_lib.sh"

corpus="$TMP/corpus.txt"
. "$(dirname "$0")/corpus.sh"
test_corpus "$corpus"
"$TERN" tokenizer-train --vocab 340 -o "$TMP/tok.gguf" "$corpus" 2>"$TMP/err" || { cat "$TMP/err"; exit 1; }
TRAIN=(train --tokenizer "$TMP/tok.gguf" --data "$corpus" -t 2 --log-every 1000 --val-batches 1)

planned() { sed -n 's/.*planned \([0-9.]*\) MiB.*/\1/p' "$1"; }
rss() { sed -n 's/.*peak RSS \([0-9.]*\) MiB.*/\1/p' "$1"; }
loss() { sed -n 's/.*final loss \([0-9.]*\),.*/\1/p' "$1"; }

# 1. the table, tiny config
"$TERN" "${TRAIN[@]}" --preset tiny --ctx 64 --batch 8 --steps 4 -o "$TMP/a.gguf" 2>"$TMP/a.err" || bad "tiny run: $(tail -2 "$TMP/a.err")"
for row in "memory plan: batch 8 = 1 micro-batch of 8 sequences x ctx 64, recompute none" "parameters \(trained, f32\)" \
           "gradients" "AdamW moments" "attention probabilities" "FFN gate, up, SwiGLU output" "logits" "backward scratch" \
           "RoPE cache" "predicted peak" "recomputed in backward: nothing"; do
  grep -Eq "$row" "$TMP/a.err" && ok "plan row /$row/" || bad "plan lacks /$row/"
done
# the table comes before step 1
pl=$(grep -n "predicted peak" "$TMP/a.err" | cut -d: -f1); s1=$(grep -n "^step " "$TMP/a.err" | head -1 | cut -d: -f1)
[ -n "$pl" ] && [ -n "$s1" ] && [ "$pl" -lt "$s1" ] && ok "plan before step 1" || bad "plan line $pl, first step line $s1"

# 2. --grad-accum 2: the unsplit run's loss; recomputation lowers the plan
"$TERN" "${TRAIN[@]}" --preset tiny --ctx 64 --batch 8 --steps 4 --grad-accum 2 -o "$TMP/b.gguf" 2>"$TMP/b.err" || bad "accum run: $(tail -2 "$TMP/b.err")"
grep -q "batch 8 = 2 micro-batches of 4" "$TMP/b.err" && ok "accum plan" || bad "accum plan: $(grep 'memory plan' "$TMP/b.err")"
[ "$(loss "$TMP/a.err")" = "$(loss "$TMP/b.err")" ] && ok "grad-accum 2: final loss $(loss "$TMP/b.err") as unsplit" \
  || bad "grad-accum 2: final loss $(loss "$TMP/b.err") vs unsplit $(loss "$TMP/a.err")"
for rc in attn full; do
  "$TERN" "${TRAIN[@]}" --preset tiny --ctx 64 --batch 8 --steps 4 --recompute $rc -o "$TMP/$rc.gguf" 2>"$TMP/$rc.err" || bad "$rc run"
  awk -v a="$(planned "$TMP/a.err")" -v r="$(planned "$TMP/$rc.err")" 'BEGIN {exit !(r < a)}' \
    && ok "recompute $rc: planned $(planned "$TMP/$rc.err") MiB < $(planned "$TMP/a.err") MiB" || bad "recompute $rc: planned not lower"
  [ "$(loss "$TMP/a.err")" = "$(loss "$TMP/$rc.err")" ] && ok "recompute $rc: same final loss" || bad "recompute $rc: loss differs"
done
grep -q "recomputed in backward: the attention probabilities" "$TMP/attn.err" && ok "attn named" || bad "attn not named"

# 3. --mem-budget: between the full-batch plans of none and attn -> attn; too small -> refused
none=$(planned "$TMP/a.err"); attn=$(planned "$TMP/attn.err")
mid=$(awk -v a="$none" -v b="$attn" 'BEGIN {printf "%dK", (a + b) / 2 * 1024}')
"$TERN" "${TRAIN[@]}" --preset tiny --ctx 64 --batch 8 --steps 2 --mem-budget "$mid" -o "$TMP/c.gguf" 2>"$TMP/c.err" || bad "budget run: $(tail -2 "$TMP/c.err")"
grep -q "1 micro-batch of 8, recompute attn fits" "$TMP/c.err" && ok "budget $mid: $(grep -o 'mem-budget.*' "$TMP/c.err" | head -1)" \
  || bad "budget $mid: $(grep 'mem-budget\|memory plan' "$TMP/c.err")"
expect 64 "mem-budget 1.0 MiB is too small: the smallest configuration \(batch 8 as 8 micro-batches of 1, recompute full\) needs [0-9.]+ MiB" \
  -- "$TERN" "${TRAIN[@]}" --preset tiny --ctx 64 --batch 8 --steps 2 --mem-budget 1M -o "$TMP/d.gguf"
[ -e "$TMP/d.gguf" ] && bad "refused run wrote its output" || ok "nothing written by the refused run"
expect 64 "--mem-budget: '4Q' is not a size" -- "$TERN" "${TRAIN[@]}" --steps 2 --mem-budget 4Q -o "$TMP/d.gguf"
expect 64 "--recompute: 'some' \(none, attn or full\)" -- "$TERN" "${TRAIN[@]}" --steps 2 --recompute some -o "$TMP/d.gguf"
expect 64 "--grad-accum 3 must divide --batch 4" -- "$TERN" "${TRAIN[@]}" --preset tiny --batch 4 --steps 2 --grad-accum 3 -o "$TMP/d.gguf"

# 4. finetune prints the plan with the mapped base
"$TERN" synth --arch qwen3 --preset tiny --type q4_0 -o "$TMP/base.gguf" 2>"$TMP/err" || bad "synth"
"$TERN" finetune -m "$TMP/base.gguf" --data "$corpus" --ctx 32 --batch 4 --steps 2 -t 2 --lora-rank 4 --recompute full \
  --grad-accum 2 -o "$TMP/ad.gguf" 2>"$TMP/f.err" || bad "finetune: $(tail -2 "$TMP/f.err")"
grep -q "frozen base (file types)" "$TMP/f.err" && grep -q "batch 4 = 2 micro-batches of 2 sequences x ctx 32, recompute full" "$TMP/f.err" \
  && ok "finetune plan" || bad "finetune plan: $(grep -A3 'memory plan' "$TMP/f.err")"

# 5. peak RSS vs the plan, 15m preset (ctx 256, batch 8), less the binary's footprint (tiny run);
# not under AddressSanitizer, whose shadow memory and quarantine are RSS the plan does not model
if ldd "$TERN" 2>/dev/null | grep -q libasan; then
  echo "skip peak RSS vs plan: $TERN is built with AddressSanitizer (its shadow memory and quarantine count in RSS)"
  exit $fail
fi
base=$(awk -v p="$(planned "$TMP/a.err")" -v r="$(rss "$TMP/a.err")" 'BEGIN {print r - p}')
for rc in none full; do
  "$TERN" "${TRAIN[@]}" --preset 15m --batch 8 --steps 1 --recompute $rc -o "$TMP/m.gguf" 2>"$TMP/m.err" || { bad "15m $rc: $(tail -2 "$TMP/m.err")"; continue; }
  p=$(planned "$TMP/m.err"); r=$(rss "$TMP/m.err")
  awk -v p="$p" -v r="$r" -v b="$base" 'BEGIN {d = (r - b - p) / p; if (d < 0) d = -d; exit !(d <= 0.10)}' \
    && ok "15m batch 8 recompute $rc: peak RSS $r MiB - footprint $base MiB vs planned $p MiB (within 10%)" \
    || bad "15m batch 8 recompute $rc: peak RSS $r MiB - footprint $base MiB vs planned $p MiB"
done
exit $fail
