#!/usr/bin/env bash
# train_cli_test.sh TERN TMPDIR [part] — `tern train` / `tern tokenizer-train` through the real
# binary. Parts: bad (bad input: clear error, non-zero exit, nothing written or lost),
# resume (kill -9 at random moments, resume, bit-identical to an uninterrupted run),
# generate (the output runs in `tern generate`). Default: all.
set -u
TERN=${1:?tern binary}
TMP=${2:?tmp dir}/train-cli.$$
PART=${3:-all}
mkdir -p "$TMP"
trap 'rm -rf "$TMP"' EXIT
fail=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fail=1; }

# expect CODE REGEX -- cmd...: exit code and a stderr line matching REGEX
expect() {
  local code=$1 re=$2; shift 3
  "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  if [ "$rc" -ne "$code" ]; then bad "$* -> exit $rc (want $code): $(tail -2 "$TMP/err")"; return; fi
  if ! grep -Eq "$re" "$TMP/err"; then bad "$* -> stderr lacks /$re/: $(tail -2 "$TMP/err")"; return; fi
  ok "exit $code /$re/: $(grep -E "$re" "$TMP/err" | head -1)"
}

# a small deterministic corpus
corpus="$TMP/corpus.txt"
for i in $(seq 1 2500); do
  echo "And the $((i % 7)) men went up to the city of $((i % 13)), and they saw $((i % 5)) sheep by the water."
  [ $((i % 10)) -eq 0 ] && echo
done >"$corpus"
"$TERN" tokenizer-train --vocab 340 -o "$TMP/tok.gguf" "$corpus" 2>"$TMP/err" || { cat "$TMP/err"; exit 1; }
TRAIN=(train --tokenizer "$TMP/tok.gguf" --preset tiny --ctx 32 --batch 4 -t 2 --log-every 1000)

if [ "$PART" = all ] || [ "$PART" = bad ]; then
  : >"$TMP/empty.txt"
  expect 65 "training data is empty" -- "$TERN" "${TRAIN[@]}" --data "$TMP/empty.txt" --steps 2 -o "$TMP/o.gguf"
  expect 65 "corpus is empty" -- "$TERN" tokenizer-train --vocab 300 -o "$TMP/o.gguf" "$TMP/empty.txt"
  printf 'valid text then \xff\xfe bad bytes\n' >"$TMP/bin.txt"
  expect 65 "invalid UTF-8 \(byte 0xFF\) at byte offset 16" -- "$TERN" "${TRAIN[@]}" --data "$TMP/bin.txt" --steps 2 -o "$TMP/o.gguf"
  expect 65 "invalid UTF-8" -- "$TERN" tokenizer-train --vocab 300 -o "$TMP/o.gguf" "$TMP/bin.txt"
  echo "tiny text" >"$TMP/tiny.txt"
  expect 64 "supports at most [0-9]+ tokens" -- "$TERN" tokenizer-train --vocab 4096 -o "$TMP/o.gguf" "$TMP/tiny.txt"
  expect 64 "supports at most [0-9]+ tokens" -- "$TERN" train --data "$TMP/tiny.txt" --vocab 4096 --steps 2 -o "$TMP/o.gguf"
  expect 65 "needs at least" -- "$TERN" "${TRAIN[@]}" --data "$TMP/tiny.txt" --steps 2 -o "$TMP/o.gguf"
  expect 71 "need [0-9.]+ MiB but only [0-9.]+ MiB" -- "$TERN" train --data "$corpus" --tokenizer "$TMP/tok.gguf" \
    --n-embd 16384 --n-layer 96 --n-head 128 --n-ff 65536 --ctx 4096 --steps 2 -o "$TMP/o.gguf"
  expect 71 "activations need [0-9.]+ MiB" -- "$TERN" train --data "$corpus" --tokenizer "$TMP/tok.gguf" \
    --preset tiny --ctx 8192 --batch 4096 --steps 2 -o "$TMP/o.gguf"
  expect 66 "" -- "$TERN" "${TRAIN[@]}" --data "$TMP/missing.txt" --steps 2 -o "$TMP/o.gguf"
  expect 64 "not an integer" -- "$TERN" "${TRAIN[@]}" --data "$corpus" --steps -3 -o "$TMP/o.gguf"
  [ -e "$TMP/o.gguf" ] && bad "an output was written by a failing run" || ok "no output left by failing runs"
  # corrupt checkpoint: clear error, the checkpoint and the old output are left as they were
  "$TERN" "${TRAIN[@]}" --data "$corpus" --steps 6 --ckpt-dir "$TMP/ck" --ckpt-every 3 -o "$TMP/c.gguf" 2>/dev/null || bad "checkpointed run"
  ck=$(ls "$TMP"/ck/ckpt-*.gguf | tail -1)
  printf '\x55' | dd of="$ck" bs=1 seek=5000 conv=notrunc 2>/dev/null
  sum=$(md5sum <"$ck"); osum=$(md5sum <"$TMP/c.gguf")
  expect 65 "checkpoint .* is corrupt" -- "$TERN" "${TRAIN[@]}" --data "$corpus" --steps 12 --ckpt-dir "$TMP/ck" --resume -o "$TMP/c.gguf"
  [ "$(md5sum <"$ck")" = "$sum" ] && [ "$(md5sum <"$TMP/c.gguf")" = "$osum" ] && ok "corrupt checkpoint and previous output untouched" || bad "files changed"
  echo "garbage" >"$TMP/ck/latest"
  expect 65 "manifest .* is corrupt" -- "$TERN" "${TRAIN[@]}" --data "$corpus" --steps 12 --ckpt-dir "$TMP/ck" --resume -o "$TMP/c.gguf"
  expect 64 "holds checkpoints; pass --resume" -- "$TERN" "${TRAIN[@]}" --data "$corpus" --steps 12 --ckpt-dir "$TMP/ck" -o "$TMP/c.gguf"
fi

if [ "$PART" = all ] || [ "$PART" = resume ]; then
  STEPS=60
  t0=$(date +%s%N)
  "$TERN" "${TRAIN[@]}" --data "$corpus" --steps $STEPS --ckpt-dir "$TMP/ra" --ckpt-every 4 -o "$TMP/a.gguf" 2>"$TMP/err" \
    || { bad "uninterrupted run: $(tail -1 "$TMP/err")"; }
  dur_ms=$(( ($(date +%s%N) - t0) / 1000000 )); [ $dur_ms -lt 20 ] && dur_ms=20
  kills=0
  for attempt in $(seq 1 200); do
    "$TERN" "${TRAIN[@]}" --data "$corpus" --steps $STEPS --ckpt-dir "$TMP/rb" --ckpt-every 4 --resume -o "$TMP/b.gguf" \
      >/dev/null 2>"$TMP/err" &
    pid=$!
    # kill at a uniformly random moment: within the first half of an uninterrupted run's duration
    # until a kill has landed, then over the whole duration, stretched a little more on every
    # attempt so a machine slower now than when it was timed still lets the run progress
    sleep "$(awk -v r=$RANDOM -v d=$dur_ms -v a=$attempt -v k=$kills 'BEGIN { f = k ? (1 + a / 10) : 0.5; printf "%.3f", r / 32768 * d * f / 1000 }')"
    if kill -9 $pid 2>/dev/null; then
      wait $pid 2>/dev/null
      kills=$((kills + 1))
      # whatever the moment, the manifest (if any) names a complete, verifiable checkpoint
      if [ -e "$TMP/rb/latest" ]; then
        f=$(sed -n 's/^file //p' "$TMP/rb/latest"); sz=$(sed -n 's/^size //p' "$TMP/rb/latest")
        [ "$(stat -c %s "$TMP/rb/$f" 2>/dev/null)" = "$sz" ] || bad "torn checkpoint after kill -9: $f"
      fi
    else
      wait $pid; rc=$?
      [ $rc -eq 0 ] || bad "resumed run failed ($rc): $(tail -1 "$TMP/err")"
      if [ $kills -eq 0 ]; then # finished before any kill landed: start over, the test needs one
        rm -rf "$TMP/rb" "$TMP/b.gguf" "$TMP/b.loss.csv" "$TMP/b.loss.svg"
        continue
      fi
      break
    fi
  done
  [ $kills -ge 1 ] || bad "the run was never killed (too fast to interrupt?)"
  if [ -e "$TMP/b.gguf" ] && cmp -s "$TMP/a.gguf" "$TMP/b.gguf" && cmp -s "$TMP/a.loss.csv" "$TMP/b.loss.csv"; then
    ok "killed -9 $kills times and resumed: weights and loss curve bit-identical to the uninterrupted run ($(md5sum <"$TMP/a.gguf" | cut -c1-16))"
  else
    bad "killed $kills times: resumed output differs from the uninterrupted run"
  fi
fi

if [ "$PART" = all ] || [ "$PART" = generate ]; then
  "$TERN" "${TRAIN[@]}" --data "$corpus" --steps 30 --lr 3e-3 -o "$TMP/g.gguf" 2>/dev/null || bad "train for generate"
  [ -s "$TMP/g.loss.csv" ] && [ -s "$TMP/g.loss.svg" ] && ok "loss curve CSV + SVG next to the output" || bad "no loss curve"
  out=$("$TERN" generate -m "$TMP/g.gguf" -p "And the" -n 12 --temp 0 -s 1 2>"$TMP/err") && [ -n "$out" ] \
    && ok "tern generate runs the trained model: $(echo "$out" | head -c 80)" || bad "generate: $(tail -1 "$TMP/err")"
  # fine-tune from it (--init)
  "$TERN" train --data "$corpus" --init "$TMP/g.gguf" --ctx 32 --batch 4 --steps 3 -o "$TMP/ft.gguf" 2>"$TMP/err" \
    && ok "fine-tune with --init" || bad "--init: $(tail -1 "$TMP/err")"
fi
exit $fail
