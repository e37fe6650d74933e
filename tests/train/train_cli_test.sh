#!/usr/bin/env bash
# train_cli_test.sh TERN TMPDIR [part] — `tern train` / `tern tokenizer-train` through the real
# binary. Parts: bad (bad input: clear error, non-zero exit, nothing written or lost),
# resume (kill -9 at random moments, resume, bit-identical to an uninterrupted run),
# generate (the output runs in `tern generate`), arch (--arch qwen2/qwen3: loss goes down, the
# output is of that family and generates; --init from `tern synth --arch qwen3`; families and
# flags training refuses), zoresume (--zo with the one-byte exchange: 6 steps, then --resume to
# 12 == 12 steps straight, bit for bit: the adaptive clip range is in the checkpoint). Default: all.
set -u
TERN=${1:?tern binary}
TMP=${2:?tmp dir}/train-cli.$$
PART=${3:-all}
mkdir -p "$TMP"
trap 'rm -rf "$TMP"' EXIT
. "$(dirname "$0")/cli_lib.sh"

# a small deterministic corpus
corpus="$TMP/corpus.txt"
. "$(dirname "$0")/corpus.sh"
test_corpus "$corpus"
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
  # --sim-link (a simulated slow link between ranks): refused without --dist and with bad values,
  # before anything runs (no MPI needed)
  expect 64 "train: --sim-link simulates the link between ranks: it needs --dist" -- "$TERN" "${TRAIN[@]}" --data "$corpus" --steps 2 --sim-link 1gbit -o "$TMP/o.gguf"
  expect 64 "finetune: --sim-link simulates the link between ranks: it needs --dist" -- "$TERN" finetune -m "$TMP/none.gguf" --data "$corpus" --sim-link 1gbit,2ms -o "$TMP/o.gguf"
  for v in 1gbps 1gbit,2 1gbit,2s 0mbit -1mbit mbit "1gbit,2ms,3us" 1gbit,; do
    expect 64 "--sim-link: '$v' is not RATE\[,LATENCY\]" -- "$TERN" "${TRAIN[@]}" --data "$corpus" --steps 2 --dist dp --sim-link "$v" -o "$TMP/o.gguf"
  done
  expect 64 "--sim-link needs a value" -- "$TERN" "${TRAIN[@]}" --data "$corpus" --steps 2 --dist dp --sim-link
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

if [ "$PART" = all ] || [ "$PART" = zoresume ]; then
  # constant lr (no warmup, min-lr-frac 1): the schedule does not depend on --steps, so a run
  # stopped at 6 and resumed to 12 sees the same lr at every step as one of 12
  Z=("${TRAIN[@]}" --data "$corpus" --zo --compress int8 --lr 1e-4 --warmup 0 --min-lr-frac 1 --val-every 3)
  if "$TERN" "${Z[@]}" --steps 12 -o "$TMP/za.gguf" 2>"$TMP/err" &&
     "$TERN" "${Z[@]}" --steps 6 --ckpt-dir "$TMP/zc" -o "$TMP/zb.gguf" 2>"$TMP/err"; then
    # the clip range after 6 steps moved off its start (1.0): a restart at 1.0 would quantize
    # differently (the control: this test fails when the range is not restored)
    ck=$(ls "$TMP"/zc/ckpt-*.gguf | tail -1)
    clip=$(python3 -c "import sys; sys.path.insert(0, '$(dirname "$0")/../common'); from tern_testlib import read_gguf
kv = read_gguf(sys.argv[1])[0]; print(kv.get('tern.train.zo_clip', 'absent'))" "$ck")
    awk -v c="$clip" 'BEGIN { exit !(c + 0 > 0 && c + 0 != 1) }' && ok "checkpoint at step 6 holds the clip range $clip (not the start, 1)" ||
      bad "checkpoint zo_clip: '$clip'"
    if "$TERN" "${Z[@]}" --steps 12 --ckpt-dir "$TMP/zc" --resume -o "$TMP/zb.gguf" 2>"$TMP/err" &&
       cmp -s "$TMP/za.gguf" "$TMP/zb.gguf" && cmp -s "$TMP/za.loss.csv" "$TMP/zb.loss.csv"; then
      ok "--zo --compress int8: 6 steps + --resume to 12 == 12 steps straight (weights and loss curve bit for bit)"
    else
      bad "--zo resumed run differs from the uninterrupted one: $(tail -1 "$TMP/err")"
    fi
  else
    bad "--zo runs: $(tail -1 "$TMP/err")"
  fi
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
if [ "$PART" = all ] || [ "$PART" = arch ]; then
  # loss_drop CSV: first and last training loss from <out>.loss.csv, and whether it went down
  loss_drop() { awk -F, 'NR == 2 { a = $2 } NR > 1 { b = $2 } END { printf "%s -> %s", a, b; exit !(b < a - 0.5) }' "$1"; }
  for fam in qwen3 qwen2; do
    # the block tern info reads back from the file: qwen3 with query rows 4 x 32 = 128 over n_embd
    # 64 (as Qwen3's shapes) and its q/k norms, qwen2 with its biases; both RoPE on halves
    extra=(); blk="block: qwen2 \| heads 4 / kv 2 of 16 \(q rows 64\).*rope neox.*qkv bias"
    [ $fam = qwen3 ] && extra=(--head-dim 32) && blk="block: qwen3 \| heads 4 / kv 2 of 32 \(q rows 128\).*rope neox.*q/k norm"
    "$TERN" "${TRAIN[@]}" --arch $fam "${extra[@]}" --data "$corpus" --steps 30 --lr 3e-3 --ckpt-dir "$TMP/ck-$fam" \
      -o "$TMP/$fam.gguf" 2>"$TMP/err" || bad "--arch $fam: $(tail -1 "$TMP/err")"
    grep -q "model: $fam," "$TMP/err" && ok "--arch $fam: $(grep -o "model: $fam,[^;]*" "$TMP/err")" || bad "no '$fam' model line"
    d=$(loss_drop "$TMP/$fam.loss.csv") && ok "--arch $fam: training loss goes down over 30 steps: $d" \
      || bad "--arch $fam: loss did not go down: $d"
    "$TERN" info "$TMP/$fam.gguf" >"$TMP/info" 2>&1 && grep -Eq "$blk" "$TMP/info" \
      && ok "tern info: the output is a $fam model: $(grep -E "$blk" "$TMP/info")" || bad "tern info $fam: $(tail -2 "$TMP/info")"
    out=$("$TERN" generate -m "$TMP/$fam.gguf" -p "And the" -n 12 --temp 0 -s 1 2>"$TMP/err") && [ -n "$out" ] \
      && ok "tern generate runs the trained $fam model: $(echo "$out" | head -c 80)" || bad "generate $fam: $(tail -1 "$TMP/err")"
  done
  # qwen3 resume: killed -9 once its first checkpoint is committed, resumed: the same file as the
  # uninterrupted run above (the checkpoint holds the q/k-norm weights and their moments too)
  Q3=("${TRAIN[@]}" --arch qwen3 --head-dim 32 --data "$corpus" --steps 30 --lr 3e-3)
  "$TERN" "${Q3[@]}" --ckpt-dir "$TMP/ck-q3b" --ckpt-every 3 -o "$TMP/q3b.gguf" >/dev/null 2>&1 &
  pid=$!
  for i in $(seq 1 400); do [ -e "$TMP/ck-q3b/latest" ] && break; sleep 0.02; done
  kill -9 $pid 2>/dev/null && killed="killed at $(sed -n 's/^step //p' "$TMP/ck-q3b/latest" 2>/dev/null)" || killed="finished before the kill"
  wait $pid 2>/dev/null
  "$TERN" "${Q3[@]}" --ckpt-dir "$TMP/ck-q3b" --ckpt-every 3 --resume -o "$TMP/q3b.gguf" 2>"$TMP/err" || bad "qwen3 resume: $(tail -1 "$TMP/err")"
  cmp -s "$TMP/qwen3.gguf" "$TMP/q3b.gguf" && ok "qwen3 $killed and resumed: output bit-identical to the uninterrupted run" \
    || bad "qwen3 resumed output differs from the uninterrupted run ($killed)"
  # resume checks the family: another --arch on the same checkpoints is refused by name
  expect 64 "made for architecture qwen3 with head_dim 32; this run is llama" -- "$TERN" "${TRAIN[@]}" --data "$corpus" \
    --steps 31 --ckpt-dir "$TMP/ck-qwen3" --resume -o "$TMP/r.gguf"
  # fine-tune a trained qwen3 (--init reads the family and head_dim from the file)
  "$TERN" train --data "$corpus" --init "$TMP/qwen3.gguf" --ctx 32 --batch 4 --steps 3 -o "$TMP/ft3.gguf" 2>"$TMP/err" \
    && grep -q "model: qwen3,.*heads of 32" "$TMP/err" && ok "--init a trained qwen3: $(grep -o 'model: qwen3,[^;]*' "$TMP/err")" \
    || bad "--init qwen3: $(tail -1 "$TMP/err")"
  # --init from `tern synth --arch qwen3 --preset tiny` (head_dim 32 over n_embd 64), then generate
  "$TERN" synth --arch qwen3 --preset tiny --type f16 -o "$TMP/s3.gguf" 2>/dev/null || bad "synth qwen3"
  "$TERN" train --data "$corpus" --init "$TMP/s3.gguf" --ctx 32 --batch 4 --steps 3 -o "$TMP/fs3.gguf" 2>"$TMP/err" \
    && grep -q "fine-tuning .*s3.gguf (qwen3" "$TMP/err" && ok "--init a synth qwen3: $(grep -o 'model: qwen3,[^;]*' "$TMP/err")" \
    || bad "--init synth qwen3: $(tail -1 "$TMP/err")"
  out=$("$TERN" generate -m "$TMP/fs3.gguf" -p "a" -n 8 --temp 0 -s 1 2>"$TMP/err") \
    && ok "tern generate runs the fine-tuned synth qwen3" || bad "generate fine-tuned synth qwen3: $(tail -1 "$TMP/err")"
  # families training does not run, unknown ones, and flags that contradict each other
  "$TERN" synth --arch gemma3 --preset tiny --type f32 -o "$TMP/g3.gguf" 2>/dev/null || bad "synth gemma3"
  expect 65 "is of architecture gemma3, which training does not run \(it trains llama, qwen2, qwen3\)" -- \
    "$TERN" train --data "$corpus" --init "$TMP/g3.gguf" --ctx 32 --steps 2 -o "$TMP/o.gguf"
  expect 64 "cannot train architecture 'gemma3' \(training runs llama, qwen2, qwen3\)" -- \
    "$TERN" "${TRAIN[@]}" --arch gemma3 --data "$corpus" --steps 2 -o "$TMP/o.gguf"
  expect 64 "unknown architecture 'mamba' \(training runs llama, qwen2, qwen3\)" -- \
    "$TERN" "${TRAIN[@]}" --arch mamba --data "$corpus" --steps 2 -o "$TMP/o.gguf"
  expect 64 "train: --arch and --init" -- "$TERN" train --arch qwen3 --init "$TMP/s3.gguf" --data "$corpus" --steps 2 -o "$TMP/o.gguf"
  expect 64 "head_dim 7 must be even" -- "$TERN" "${TRAIN[@]}" --arch qwen3 --head-dim 7 --data "$corpus" --steps 2 -o "$TMP/o.gguf"
  [ -e "$TMP/o.gguf" ] && bad "an output was written by a refused run" || ok "no output left by refused runs"
fi
exit $fail
