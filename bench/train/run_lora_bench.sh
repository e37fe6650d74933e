#!/usr/bin/env bash
# run_lora_bench.sh [BUILD_DIR] [lora|recompute|all] — LoRA fine-tuning, tern vs PyTorch eager, and the
# time and activation memory of tern train's --recompute modes. Prints markdown tables.
#
# lora: `tern finetune` (rank 16, alpha 32, all seven targets: its defaults) against bench_lora_torch.py
#   (the same shapes, read from the same GGUF; the same rank, alpha, targets, batch x ctx; 2 threads;
#   base fp32 and bf16) on two models: the 15m preset (`tern train --preset 15m`, one step, f32, the
#   default model's 4096-token vocabulary; batch 8 x 256) and `tern synth --preset 1b --type q4_0`
#   (batch 1 x 256; MODELS="15m 1b-q4_0 1b-f16" adds the f16 synth file). Alternated tern, torch
#   fp32, torch bf16, twice.
#   tokens/s exclude the first step (tern: the time between its "step 1/" and last progress lines;
#   torch: the script's own clock); peak RSS is getrusage's ru_maxrss of each process.
# recompute: `tern train --preset 15m --batch 8` with --recompute none, attn, full, alternated twice:
#   activation MiB from the memory plan and tokens/s (steps after the first, as above, and before the
#   last, which also validates).
#
# Every timed run is under `flock /tmp/bench.lock` and starts only once `pgrep -f tern-kjv-29m` prints
# nothing (NOWAIT=1 skips that wait: for trying the script out, its numbers are then no measurement).
# Env: STEPS (timed steps per 15m run, default 3; one more runs first, untimed), STEPS_1B (default 1),
# WORK (default /tmp/tern-lora-bench: models and logs, reused), DATA (a text file; default the KJV
# from scripts/make-kjv-corpus.sh, else this repository's docs), MODELS (default "15m 1b-q4_0"; also
# 1b-f16), BF16=0 (no torch bf16 rows).
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$here/build}
what=${2:-all}
steps=${STEPS:-3}
work=${WORK:-/tmp/tern-lora-bench}
tern=$build/tern
py=/usr/bin/python3
die() { echo "run_lora_bench: $*" >&2; exit 1; }
case $what in lora | recompute | all) ;; *) die "second argument: lora, recompute or all (got '$what')" ;; esac
[ -x "$tern" ] || die "no tern binary at $tern (build it: cmake --build build --target tern, or pass BUILD_DIR)"
{ [ -x "$py" ] && "$py" -c 'import torch' 2>/dev/null; } || die "$py cannot import torch (apt-get install python3-torch)"
[ -f "$here/models/tern-default.gguf" ] || die "no $here/models/tern-default.gguf (the 15m runs take its tokenizer)"
command -v flock >/dev/null || die "needs flock (util-linux)"
mkdir -p "$work"

# --- data: a slice of text (tokenizing more than the few steps need only costs time)
corpus=$work/corpus.txt
if [ -n "${DATA:-}" ]; then
  [ -s "$DATA" ] || die "DATA=$DATA: no such file or empty"
  head -c 400000 "$DATA" > "$corpus"
elif [ ! -s "$corpus" ]; then
  if command -v bible >/dev/null; then
    "$here/scripts/make-kjv-corpus.sh" "$work/kjv.txt" && head -c 400000 "$work/kjv.txt" > "$corpus"
  else
    cat "$here"/docs/*.md | head -c 400000 > "$corpus"
  fi
fi

quiet() { # waits for the quiet the timing rules ask for
  [ "${NOWAIT:-0}" = 1 ] && return
  while pgrep -f tern-kjv-29m >/dev/null; do echo "run_lora_bench: waiting for tern-kjv-29m to finish" >&2; sleep 60; done
}
stamp() { # prefixes every line with the time it arrived
  while IFS= read -r l; do printf '%s %s\n' "$(date +%s.%N)" "$l"; done
}
# tern_rate LOG TOKENS_PER_STEP [LAST]: tokens/s between the "step 1/" line and the line of step LAST
# (default the last one)
tern_rate() {
  awk -v n="$2" -v last="${3:-0}" '$2 ~ /^step$/ { split($3, s, "/")
      if (s[1] == 1) t1 = $1; if (s[1] > 1 && (!last || s[1] == last)) { tl = $1; k = s[1] } }
    END { if (!t1 || !tl) exit 1; printf "%.2f", n * (k - 1) / (tl - t1) }' "$1"
}
tern_rss() { sed -n 's/.*peak RSS \([0-9.]*\) MiB.*/\1/p' "$1" | tail -1; }
# run_tern LOG ARGS...: one timed tern run; its stderr, time-stamped, in LOG
run_tern() {
  local log=$1; shift
  quiet
  if ! flock /tmp/bench.lock "$tern" "$@" --log-every 1 2>&1 | stamp > "$log"; then
    tail -5 "$log" >&2; die "tern $1 failed (log: $log)"
  fi
}
run_torch() { # LOG ARGS...
  local log=$1; shift
  quiet
  flock /tmp/bench.lock "$py" "$here/bench/train/bench_lora_torch.py" "$@" > "$log" 2>&1 || { tail -5 "$log" >&2; die "bench_lora_torch.py failed (log: $log)"; }
}
torch_rate() { sed -n 's/.*  \([0-9.]*\) tokens\/s.*/\1/p' "$1"; }
torch_rss() { sed -n 's/.*peak RSS \([0-9.]*\) MiB.*/\1/p' "$1"; }
best() { printf '%s\n' "$@" | sort -g | tail -1; }  # the largest
least() { printf '%s\n' "$@" | sort -g | head -1; }

lora() {
  local m15=$work/lora-15m.gguf
  if [ ! -s "$m15" ]; then
    "$tern" train --preset 15m --data "$corpus" --tokenizer "$here/models/tern-default.gguf" --steps 1 --batch 1 \
      -o "$m15" > "$work/make-15m.log" 2>&1 || { tail -5 "$work/make-15m.log" >&2; die "tern train (the 15m base) failed"; }
  fi
  local models=() dtypes=(fp32) mname t
  for mname in ${MODELS:-15m 1b-q4_0}; do
    case $mname in
      15m) models+=("15m|$m15|8|$steps") ;;
      1b-q4_0 | 1b-f16)
        t=${mname#1b-}
        [ -s "$work/synth-1b-$t.gguf" ] || "$tern" synth --preset 1b --type "$t" -o "$work/synth-1b-$t.gguf" > "$work/make-1b-$t.log" 2>&1 ||
          die "tern synth --preset 1b --type $t failed ($work/make-1b-$t.log)"
        models+=("$mname|$work/synth-1b-$t.gguf|1|${STEPS_1B:-1}") ;;
      *) die "MODELS: unknown '$mname' (15m, 1b-q4_0, 1b-f16)" ;;
    esac
  done
  [ "${BF16:-1}" = 1 ] && dtypes+=(bf16)
  echo "| model (tern base type) | batch x ctx | run | tokens/s (round 1 / 2) | peak RSS MiB (1 / 2) | tern tokens/s ÷ this | tern RSS ÷ this |"
  echo "|---|---|---|---|---|---|---|"
  for spec in "${models[@]}"; do
    IFS='|' read -r name file batch ns <<< "$spec"
    local ctx=256 tr=() trss=() d r x
    declare -A rate=() rss=()
    for r in 1 2; do
      local log=$work/ft-$name-$r.log
      run_tern "$log" finetune -m "$file" --data "$corpus" -o "$work/adapter-$name.gguf" --batch "$batch" --ctx "$ctx" \
        --steps $((ns + 1)) --val-split 0 -t 2
      x=$(tern_rate "$log" $((batch * ctx))) || die "no step lines in $log"
      tr+=("$x") trss+=("$(tern_rss "$log")")
      for d in "${dtypes[@]}"; do
        log=$work/torch-$name-$d-$r.log
        run_torch "$log" "$file" --batch "$batch" --ctx "$ctx" --steps "$ns" --threads 2 --dtype "$d"
        rate[$d]+="$(torch_rate "$log") " rss[$d]+="$(torch_rss "$log") "
      done
    done
    local tb tl; tb=$(best "${tr[@]}"); tl=$(least "${trss[@]}")
    echo "| $name | ${batch}x$ctx | tern finetune | ${tr[0]} / ${tr[1]} | ${trss[0]} / ${trss[1]} | | |"
    for d in "${dtypes[@]}"; do
      local a b xb xl
      read -ra a <<< "${rate[$d]}"
      read -ra b <<< "${rss[$d]}"
      xb=$(best "${a[@]}"); xl=$(least "${b[@]}")
      echo "| $name | ${batch}x$ctx | torch $d | ${a[0]} / ${a[1]} | ${b[0]} / ${b[1]} | $(awk -v x="$tb" -v y="$xb" 'BEGIN{printf "%.2fx", x / y}') | $(awk -v x="$tl" -v y="$xl" 'BEGIN{printf "%.2f", x / y}') |"
    done
  done
  echo "(best tokens/s and least peak RSS of the two rounds in the ratios; 15m: $steps timed steps, 1b: ${STEPS_1B:-1}, after one untimed; torch $($py -c 'import torch; print(torch.__version__)'), $(date -u +%F))"
}

recompute() {
  # tern train --preset 15m --batch 8 (vocab 4096 from the default model's tokenizer), the same steps
  local rc r log a
  declare -A rate=() act=()
  for r in 1 2; do
    for rc in none attn full; do
      log=$work/rc-$rc-$r.log
      # tern train validates at the last step: one step more, not timed
      run_tern "$log" train --preset 15m --batch 8 --data "$corpus" --tokenizer "$here/models/tern-default.gguf" \
        --steps $((steps + 2)) --val-every 1000000 --val-batches 1 --recompute "$rc" -t 2 -o "$work/rc-$rc.gguf"
      a=$(tern_rate "$log" $((8 * 256)) $((steps + 1))) || die "no step lines in $log"
      rate[$rc]+="$a "
      # the plan's activation classes: the lines between "activations" and "predicted peak"
      a=$(awk '/activations \(/ { on = 1; next } /predicted peak/ { on = 0 }
        on && / MiB/ { for (i = 1; i <= NF; i++) if ($(i + 1) == "MiB") { s += $i; break } } END { printf "%.1f", s }' "$log")
      act[$rc]=$a
    done
  done
  local base x
  read -ra x <<< "${rate[none]}"
  base=$(best "${x[@]}")
  echo "| --recompute | activations (plan) | fall | tokens/s (round 1 / 2) | time vs none (best / best) |"
  echo "|---|---|---|---|---|"
  for rc in none attn full; do
    read -ra x <<< "${rate[$rc]}"
    echo "| $rc | ${act[$rc]} MiB | $(awk -v a="${act[none]}" -v b="${act[$rc]}" 'BEGIN{printf "%.2fx", a / b}') | ${x[0]} / ${x[1]} | $(awk -v a="$base" -v b="$(best "${x[@]}")" 'BEGIN{printf "%+.1f%%", (a / b - 1) * 100}') |"
  done
  echo "(tern train --preset 15m --batch 8, ctx 256, vocab 4096, 2 threads; $steps timed steps after one untimed; $(date -u +%F))"
}

case $what in
  lora) lora ;;
  recompute) recompute ;;
  all) lora; echo; recompute ;;
esac
