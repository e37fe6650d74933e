#!/usr/bin/env bash
# run_bench.sh [BUILD_DIR] [STEPS] — tern vs PyTorch eager, ~15M-param Llama (n_embd 288, 6 layers,
# 6 heads, n_ff 768, ctx 256, vocab 16384 untied), same batch, 2 threads. Alternates the two
# (tern, torch, tern, torch) so both see the same machine load; prints tokens/s and peak RSS.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$here/build}
steps=${2:-3}
cfg="288 6 6 6 768 256 16384 8 2 $steps"
cc -O2 -o "$build/bench_train" "$here/bench/train/bench_train.c" -I"$here/src" -I"$here/include" \
  "$build/libtern.a" $(pkg-config --libs openblas libpcre2-8) -lpthread -lm
for i in 1 2; do
  "$build/bench_train" $cfg
  /usr/bin/python3 "$here/bench/train/bench_torch.py" $cfg
done
