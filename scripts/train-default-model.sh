#!/usr/bin/env bash
# Reproduces tern's default model (models/tern-default.gguf): a ~5M-parameter Llama trained by
# `tern train` on the King James Bible (Debian bible-kjv). Dimensions are multiples of 256
# (n_embd, n_ff) so every llama.cpp quant type applies to every tensor; written as q8_0.
# usage: scripts/train-default-model.sh [TERN_BIN] [OUT.gguf] [STEPS] [WORK_DIR]
# The short test (tests/train) runs it with STEPS=3 into a temp dir.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
tern=${1:-$here/build/tern}
out=${2:-$here/models/tern-default.gguf}
steps=${3:-600}
work=${4:-$here/build/kjv}
mkdir -p "$work"
[ -s "$work/kjv.txt" ] || "$here/scripts/make-kjv-corpus.sh" "$work/kjv.txt"
exec nice -n 10 "$tern" train --data "$work/kjv.txt" --vocab 4096 \
  --n-embd 256 --n-layer 4 --n-head 8 --n-head-kv 4 --n-ff 768 --ctx 128 \
  --steps "$steps" --batch 16 --lr 2e-3 --warmup 30 --seed 1 -t 2 \
  --ckpt-dir "$work/ckpt" --ckpt-every 50 --resume \
  --out-type q8_0 --name tern-default-kjv -o "$out"
