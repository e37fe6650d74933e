#!/usr/bin/env bash
# zo_mem_test.sh TERN TMPDIR — `--zo` trains with inference memory (src/train/zo.h), single process:
#  - the plan of a --zo run has no gradients and no AdamW moments (0.0 MiB rows), the same
#    parameter bytes as the AdamW run, and a lower predicted peak (forward-only activations);
#  - measured peak RSS (getrusage, the done line): AdamW minus --zo is at least 90% of the
#    gradient + moment bytes the plan rows of the AdamW run list (3 x the parameter row), for
#    `tern train --preset 15m` (batch 1, ctx 64: the parameters dominate) and for `tern finetune`
#    over a q4_0 base (LoRA rank 64 on the `synth --preset small` qwen3: the adapter is what is trained);
#  - `--zo --compress int8` runs in one process (the one-byte quantization without MPI);
#    `--compress int8` without --zo or --dist is refused (exit 64).
# AddressSanitizer's shadow memory makes RSS meaningless: the RSS checks say they are skipped then.
set -u
TERN=${1:?tern binary}
TMP=${2:?tmp dir}/zo-mem.$$
mkdir -p "$TMP"
trap 'rm -rf "$TMP"' EXIT
. "$(dirname "$0")/cli_lib.sh"
corpus="$TMP/corpus.txt"
. "$(dirname "$0")/corpus.sh"
test_corpus "$corpus"
"$TERN" tokenizer-train --vocab 340 -o "$TMP/tok.gguf" "$corpus" 2>"$TMP/err" || { cat "$TMP/err"; exit 1; }
asan=0
ldd "$TERN" 2>/dev/null | grep -q libasan && asan=1

row() { sed -n "s/.*$2 *\([0-9.]*\) MiB.*/\1/p" "$1" | head -1; }
rss() { sed -n 's/.*peak RSS \([0-9.]*\) MiB.*/\1/p' "$1"; }
# compare NAME_ADAMW NAME_ZO what
compare() {
  local a=$TMP/$1.err z=$TMP/$2.err
  local pa pz ga gz ma mz
  pa=$(row "$a" "parameters (trained, f32)"); pz=$(row "$z" "parameters (trained, f32)")
  ga=$(row "$a" "gradients"); gz=$(row "$z" "gradients"); ma=$(row "$a" "AdamW moments (m, v)"); mz=$(row "$z" "AdamW moments (m, v)")
  [ -n "$pa" ] && [ "$pa" = "$pz" ] && [ "$gz" = 0.0 ] && [ "$mz" = 0.0 ] && [ "$ga" = "$pa" ] &&
    ok "$3: plan rows: parameters $pz MiB, gradients $gz, moments $mz (AdamW: $ga, $ma)" ||
    bad "$3: plan rows: params $pa/$pz grads $ga/$gz moments $ma/$mz"
  local kpa kpz
  kpa=$(row "$a" "predicted peak"); kpz=$(row "$z" "predicted peak")
  awk -v a="$kpa" -v z="$kpz" 'BEGIN { exit !(z < a) }' && ok "$3: predicted peak $kpz MiB < AdamW's $kpa MiB" ||
    bad "$3: predicted peak $kpz vs $kpa"
  if [ $asan = 1 ]; then echo "SKIP $3: peak RSS under AddressSanitizer (shadow memory) is not compared"; return; fi
  local ra rz
  ra=$(rss "$a"); rz=$(rss "$z")
  awk -v ra="$ra" -v rz="$rz" -v g="$ga" -v m="$ma" 'BEGIN { exit !(ra - rz >= 0.9 * (g + m)) }' &&
    ok "$3: peak RSS --zo $rz MiB vs AdamW $ra MiB: saves $(awk -v a="$ra" -v z="$rz" 'BEGIN{printf "%.1f", a-z}') MiB >= 90% of gradients + moments ($ga + $ma MiB)" ||
    bad "$3: peak RSS --zo $rz MiB vs AdamW $ra MiB: saves less than 90% of $ga + $ma MiB"
}

T=(train --tokenizer "$TMP/tok.gguf" --data "$corpus" --preset 15m --ctx 64 --batch 1 --steps 2 -t 2 --log-every 1000 --val-batches 1)
"$TERN" "${T[@]}" -o "$TMP/a.gguf" 2>"$TMP/a.err" || bad "AdamW run: $(tail -2 "$TMP/a.err")"
"$TERN" "${T[@]}" --zo -o "$TMP/z.gguf" 2>"$TMP/z.err" || bad "--zo run: $(tail -2 "$TMP/z.err")"
compare a z "train --preset 15m"

"$TERN" synth --arch qwen3 --preset small --type q4_0 -o "$TMP/base.gguf" 2>"$TMP/err" || { cat "$TMP/err"; exit 1; }
F=(finetune -m "$TMP/base.gguf" --data "$corpus" --ctx 64 --batch 1 --steps 2 -t 2 --lora-rank 64 --val-split 0 --log-every 1000)
"$TERN" "${F[@]}" -o "$TMP/fa.gguf" 2>"$TMP/fa.err" || bad "finetune AdamW: $(tail -2 "$TMP/fa.err")"
"$TERN" "${F[@]}" --zo -o "$TMP/fz.gguf" 2>"$TMP/fz.err" || bad "finetune --zo: $(tail -2 "$TMP/fz.err")"
grep -q "frozen base (file types)" "$TMP/fz.err" && ok "finetune --zo: the q4_0 base stays mapped in its type" ||
  bad "finetune --zo: no mapped base row"
compare fa fz "finetune --zo (LoRA over q4_0)"

"$TERN" "${T[@]}" --preset tiny --zo --compress int8 -o "$TMP/q.gguf" 2>"$TMP/q.err" && [ -s "$TMP/q.gguf" ] &&
  ok "--zo --compress int8 runs in one process" || bad "--zo --compress int8: $(tail -2 "$TMP/q.err")"
expect 64 "compress needs --dist \(or --zo\)" -- "$TERN" "${T[@]}" --compress int8 -o "$TMP/x.gguf"
exit $fail
