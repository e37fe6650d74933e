#!/usr/bin/env bash
# One GPU session's checks for the CUDA backend, in one go, results in OUT (default gpu-results/):
#   nvidia-smi and `tern info`; the GPU tests (test_cuda gpu: kernel parity for every type, forward
#   against the double-precision reference, paged batches, -ngl splits, stories260K greedy vs the
#   CPU); the default model's greedy text on GPU and CPU (f16, q8_0 and q4_0 KV caches), and that
#   of synthetic smollm3, gemma3, gemma2, phi3, qwen3moe, qwen2moe, gpt-oss, olmoe, deepseek2 (V2, V3) and plm files; `tern serve --device cuda` under
#   the serve test suite's scripts; and the benchmarks on a 1B-class synthetic model (Q4_0, Q8_0, tq2/3/4,
#   F16, Q4_K_M, IQ4_XS, Q3_K_M): decode and pp512 against the card's copy bandwidth and fp16 peak, measured in the same run,
#   decode with the persistent kernel (TERN_CUDA_PERSIST=1), prefill's products of the code types on
#   the int8 tensor cores against fp16 + cuBLAS (TERN_CUDA_MMQ=0) and against the GEMV token tiles;
#   and on its Mixtral-style mixture of experts (8 experts, top 2, Q4_0).
#
# usage: scripts/gpu-check.sh [OUT]
#   TERN_BIN, TERN_TEST_CUDA  the binaries (default build/tern, build/tests/cuda/test_cuda)
#   TERN_SHARED_DIR           folder with models/stories260K (default ../shared)
#   GPU_CHECK_QUICK=1         skip the 1B benchmarks; GPU_CHECK_SKIP_SERVE=1: skip the serve suite
#   PEER                      llama.cpp's llama-bench built with CUDA: run on the same files after tern
#   GPU_CHECK_SERVE           the serve tests to run (default: http batch_equiv features best_of_echo fault slo)
#   GPU_CHECK_BUDGET=S        the whole run in S seconds: each step's limit is cut to what is left, and
#                             the steps past it are listed as skipped (a loan's command has 10 minutes)
# Order: what a loan must not miss first — tern info and test_cuda, the default model's greedy text,
# the 1B code types' decode (launch by launch and persistent) that #25's targets are about — then the
# quantized caches, vq2 and the other families' greedy text, the serve suite, and the remaining
# benchmarks. On a machine without tern's libraries, scripts/gpu-pack.sh prepares it all.
# Every step has its own time limit, so one hang costs that step only. OUT holds three files,
# written as the steps end (a run cut short keeps what it finished): summary.txt (one line per
# step: exit code, seconds), log.txt (every step's output under a header), bench.jsonl (the
# benchmarks' JSON rows).
set -uo pipefail
BUDGET=${GPU_CHECK_BUDGET:-0}
case $BUDGET in '' | *[!0-9]*)
    echo "gpu-check: GPU_CHECK_BUDGET='$BUDGET' is not a number of seconds" >&2
    exit 2
    ;;
esac
cd "$(dirname "$0")/.."
OUT=${1:-gpu-results}
mkdir -p "$OUT"
BIN=${TERN_BIN:-build/tern}
TC=${TERN_TEST_CUDA:-build/tests/cuda/test_cuda}
PEER=${PEER:-}
export TERN_SHARED_DIR=${TERN_SHARED_DIR:-../shared}
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-13.0/lib64; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done
if ldd "$BIN" | grep -q 'libcublas.*not found'; then # cuBLAS elsewhere (a Python wheel's copy, say)
    d=$(find /usr /opt -name 'libcublas.so.13' -print -quit 2>/dev/null)
    [ -n "$d" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$(dirname "$d")"
fi
TMPD=$(mktemp -d /tmp/tern-gpu.XXXXXX)
trap 'rm -rf "$TMPD"' EXIT
SUM="$OUT/summary.txt" LOG="$OUT/log.txt"
: >"$SUM"
: >"$LOG"
: >"$OUT/bench.jsonl"
step() { # step NAME LIMIT_S CMD... : runs CMD with a time limit; output to LOG, one line to SUM
    local name=$1 lim=$2
    shift 2
    if [ "$BUDGET" -gt 0 ]; then # the whole run's budget: a step gets what is left of it, at most
        local left=$((BUDGET - SECONDS))
        if [ "$left" -lt 20 ]; then
            printf '%-28s skipped: GPU_CHECK_BUDGET (%s s) spent\n' "$name" "$BUDGET" | tee -a "$SUM"
            return 125
        fi
        [ "$lim" -gt $((left - 10)) ] && lim=$((left - 10))
    fi
    local t0=$SECONDS
    timeout "$lim" "$@" >"$TMPD/step.out" 2>&1
    local rc=$?
    { echo "===== $name (rc $rc, $((SECONDS - t0)) s): $*"; cat "$TMPD/step.out"; echo; } >>"$LOG"
    case $name in
    bench_*) grep '^  {' "$TMPD/step.out" | sed -e 's/,$//' -e "s/^  {/{\"step\": \"$name\", /" >>"$OUT/bench.jsonl" ;;
    peer_*) grep '^{' "$TMPD/step.out" | sed -e "s/^{/{\"step\": \"$name\", /" >>"$OUT/bench.jsonl" ;;
    esac
    printf '%-28s rc=%-3s %4ss\n' "$name" "$rc" "$((SECONDS - t0))" | tee -a "$SUM"
    return $rc
}

step env 30 bash -c "nvidia-smi; echo; uname -a; echo; ldd '$BIN'; echo; '$BIN' info"
step test_cuda 180 "$TC" gpu

# the default model: greedy on the GPU and on the CPU
M0=models/tern-default.gguf
step greedy_default 60 bash -c "
  '$BIN' generate -m $M0 -p 'And God said' -n 64 --temp 0 --device cuda 2>$TMPD/g.err >$TMPD/gpu.txt; e1=\$?
  '$BIN' generate -m $M0 -p 'And God said' -n 64 --temp 0 -t 4 2>$TMPD/c.err >$TMPD/cpu.txt; e2=\$?
  cat $TMPD/g.err; echo '--- gpu:'; cat $TMPD/gpu.txt; echo; echo '--- cpu:'; cat $TMPD/cpu.txt; echo
  [ \$e1 = 0 ] && [ \$e2 = 0 ] && cmp $TMPD/gpu.txt $TMPD/cpu.txt && echo 'greedy text identical'"

# the same with one-token steps in the persistent kernel (TERN_CUDA_PERSIST=1)
step greedy_default_persist 60 bash -c "
  TERN_CUDA_PERSIST=1 '$BIN' generate -m $M0 -p 'And God said' -n 64 --temp 0 --device cuda 2>$TMPD/g.err >$TMPD/gpu.txt; e1=\$?
  '$BIN' generate -m $M0 -p 'And God said' -n 64 --temp 0 -t 4 2>$TMPD/c.err >$TMPD/cpu.txt; e2=\$?
  cat $TMPD/g.err; echo '--- gpu:'; cat $TMPD/gpu.txt; echo; echo '--- cpu:'; cat $TMPD/cpu.txt; echo
  [ \$e1 = 0 ] && [ \$e2 = 0 ] && cmp $TMPD/gpu.txt $TMPD/cpu.txt && echo 'greedy text identical'"

# what #25's decode targets are about, first after the correctness checks (a GPU loan is minutes):
# the 1B-class synthetic model's code types, launch by launch and with the persistent kernel
if [ "${GPU_CHECK_QUICK:-0}" != 1 ]; then
    # 1B-class synthetic model (Llama-3.2-1B shapes): F16, then each type quantized from it
    step synth_1b 120 "$BIN" synth -o "$TMPD/1b-f16.gguf" --preset 1b --type f16
    # first what #25's targets are about: the code types, launch by launch and with one-token steps
    # as one persistent kernel (TERN_CUDA_PERSIST=1: every layer in one cooperative launch, grid
    # barriers between its stages), side by side
    for ty in q4_0 tq2 tq4 q8_0 tq3; do
        step "quantize_$ty" 90 "$BIN" quantize -t "$(nproc)" "$TMPD/1b-f16.gguf" "$TMPD/1b-$ty.gguf" "$ty"
        step "bench_$ty" 90 "$BIN" bench --device cuda -m "$TMPD/1b-$ty.gguf" -p 512 -n 128 -r 3 -o json
        step "bench_${ty}_persist" 60 env TERN_CUDA_PERSIST=1 "$BIN" bench --device cuda -m "$TMPD/1b-$ty.gguf" -p 0 -n 128 -r 5 -o json
    done
    # the persistent kernel on one block per SM instead of two, without its L2 prefetch, and its profile
    sms=$(nvidia-smi --query-gpu=multiprocessor_count --format=csv,noheader 2>/dev/null | head -1 | tr -dc 0-9)
    [ -n "$sms" ] && step bench_q4_0_persist_1bps 60 env TERN_CUDA_PERSIST=1 TERN_CUDA_PERSIST_GRID="$sms" \
        "$BIN" bench --device cuda -m "$TMPD/1b-q4_0.gguf" -p 0 -n 128 -r 5 -o json
    step bench_q4_0_persist_nopf 60 env TERN_CUDA_PERSIST=1 TERN_CUDA_PREFETCH=0 "$BIN" bench --device cuda -m "$TMPD/1b-q4_0.gguf" \
        -p 0 -n 128 -r 5 -o json
    TERN_CUDA_PERSIST=1 TERN_CUDA_PROFILE=1 step profile_q4_0_persist 60 "$BIN" bench --device cuda -m "$TMPD/1b-q4_0.gguf" -p 0 -n 64 -r 1
fi

# a quantized KV cache on the GPU: the default model's greedy text with q8_0, q4_0 and tq4 K/V (K
# rotated, the default), and a per-channel tqc3 K over a q8_0 V, on GPU and CPU
for kvt in q8_0 q4_0 tq4 tqc3; do
    kvv=$kvt
    [ $kvt = tqc3 ] && kvv=q8_0
    step "greedy_default_kv_$kvt" 60 bash -c "
      '$BIN' generate -m $M0 -p 'And God said' -n 64 --temp 0 -ctk $kvt -ctv $kvv --device cuda 2>$TMPD/g.err >$TMPD/gpu.txt; e1=\$?
      '$BIN' generate -m $M0 -p 'And God said' -n 64 --temp 0 -ctk $kvt -ctv $kvv -t 4 2>$TMPD/c.err >$TMPD/cpu.txt; e2=\$?
      cat $TMPD/g.err; echo '--- gpu:'; cat $TMPD/gpu.txt; echo; echo '--- cpu:'; cat $TMPD/cpu.txt; echo
      [ \$e1 = 0 ] && [ \$e2 = 0 ] && cmp $TMPD/gpu.txt $TMPD/cpu.txt && echo 'greedy text identical'"
done

# tern's codebook type vq2 on the GPU: the default model quantized to it, greedy text on GPU and CPU
step greedy_default_vq2 180 bash -c "
  '$BIN' quantize $M0 $TMPD/vq2.gguf vq2 >/dev/null || exit 3
  '$BIN' generate -m $TMPD/vq2.gguf -p 'And God said' -n 64 --temp 0 --device cuda 2>$TMPD/g.err >$TMPD/gpu.txt; e1=\$?
  '$BIN' generate -m $TMPD/vq2.gguf -p 'And God said' -n 64 --temp 0 -t 4 2>$TMPD/c.err >$TMPD/cpu.txt; e2=\$?
  cat $TMPD/g.err; echo '--- gpu:'; cat $TMPD/gpu.txt; echo; echo '--- cpu:'; cat $TMPD/cpu.txt; echo
  [ \$e1 = 0 ] && [ \$e2 = 0 ] && '$BIN' bench --device cuda -m $TMPD/vq2.gguf -p 128 -n 64 -r 2
  [ \$e1 = 0 ] && [ \$e2 = 0 ] && cmp $TMPD/gpu.txt $TMPD/cpu.txt && echo 'greedy text identical'"

# the other families on the GPU (synthetic small models): greedy text on GPU and CPU, and their
# speed on the card
# (deepseek2: latent attention, at its tiny presets: V2's shape and V3's; plm: latent attention, no experts)
for spec in smollm3 gemma3 gemma2 phi3 qwen3moe qwen2moe gpt-oss olmoe deepseek2:tiny deepseek2:tiny-v3 plm:tiny; do
    a=${spec%%:*}
    case $spec in *:*) preset=${spec#*:} ;; *moe | gpt-oss) preset=tiny ;; *) preset=small ;; esac
    [ "$preset" = tiny-v3 ] && spec=deepseek2-v3 # (the step's name)
    step "greedy_${spec%%:*}" 90 bash -c "
      '$BIN' synth -o $TMPD/$a.gguf --arch $a --preset $preset --type q8_0 >/dev/null || exit 3
      '$BIN' generate -m $TMPD/$a.gguf -p 'Once upon a time' -n 48 --temp 0 --device cuda 2>$TMPD/g.err >$TMPD/gpu.txt; e1=\$?
      '$BIN' generate -m $TMPD/$a.gguf -p 'Once upon a time' -n 48 --temp 0 -t 4 2>$TMPD/c.err >$TMPD/cpu.txt; e2=\$?
      cat $TMPD/g.err; echo '--- gpu:'; cat $TMPD/gpu.txt; echo; echo '--- cpu:'; cat $TMPD/cpu.txt; echo
      [ \$e1 = 0 ] && [ \$e2 = 0 ] && '$BIN' bench --device cuda -m $TMPD/$a.gguf -p 128 -n 64 -r 2
      [ \$e1 = 0 ] && [ \$e2 = 0 ] && cmp $TMPD/gpu.txt $TMPD/cpu.txt && echo 'greedy text identical'"
done

# tern serve --device cuda under the serve suite's integration scripts (the tiny q8_0 model)
if [ "${GPU_CHECK_SKIP_SERVE:-0}" != 1 ]; then
    "$BIN" synth -o "$TMPD/tiny-q8_0.gguf" --preset tiny --type q8_0 >/dev/null 2>&1
    export TERN_SERVE_ARGS="--device cuda"
    for t in ${GPU_CHECK_SERVE:-http batch_equiv features best_of_echo fault slo}; do
        if [ "$t" = http ]; then
            step serve_http 120 bash tests/serve/http_test.sh "$BIN" "$TMPD/tiny-q8_0.gguf" "$TMPD/s-http"
        else
            step "serve_$t" 120 python3 "tests/serve/${t}_test.py" "$BIN" "$TMPD/tiny-q8_0.gguf" "$TMPD/s-$t"
        fi
    done
    # batch invariance with a quantized cache in paged blocks
    TERN_SERVE_ARGS="--device cuda -ctk q8_0 -ctv q4_0" step serve_batch_equiv_kvq 120 python3 tests/serve/batch_equiv_test.py \
        "$BIN" "$TMPD/tiny-q8_0.gguf" "$TMPD/s-beq"
    unset TERN_SERVE_ARGS
fi

if [ "${GPU_CHECK_QUICK:-0}" != 1 ]; then
    # long contexts: decode after 8192 tokens in the cache, each (token, head)'s positions split
    # across blocks (flash-decoding, the default), unsplit (TERN_CUDA_ATTN_SPLIT=1), and in the
    # persistent kernel (its attention stage splits a head across the blocks it has for each)
    for v in split:TERN_CUDA_X=1 nosplit:TERN_CUDA_ATTN_SPLIT=1 persist:TERN_CUDA_PERSIST=1; do
        # shellcheck disable=SC2086 # the settings are words
        step "bench_q4_0_d8192_${v%%:*}" 90 env ${v#*:} "$BIN" bench --device cuda -m "$TMPD/1b-q4_0.gguf" -d 8192 -p 0 -n 64 \
            -r 3 -o json
    done
    # prefill's attention in query tiles (the default) and a block per (token, head), at 512 and
    # 4096 prompt tokens
    for v in tile:TERN_CUDA_X=1 notile:TERN_CUDA_ATTN_TILE=0; do
        # shellcheck disable=SC2086 # the settings are words
        for np in 512 4096; do
            step "bench_q4_0_pp${np}_${v%%:*}" 90 env ${v#*:} "$BIN" bench --device cuda -m "$TMPD/1b-q4_0.gguf" -p "$np" -n 0 -r 3 \
                -o json
        done
    done
    # prefill's products of the code types on the int8 tensor cores (k_mmq_code, the default) against
    # fp16 dequantization + cuBLAS above 64 tokens (TERN_CUDA_MMQ=0, the path measured before it)
    for ty in q4_0 q8_0 tq2 tq4; do
        step "bench_${ty}_pp512_nommq" 90 env TERN_CUDA_MMQ=0 "$BIN" bench --device cuda -m "$TMPD/1b-$ty.gguf" -p 512 -n 0 -r 3 -o json
    done
    step bench_q4_0_pp4096_nommq 90 env TERN_CUDA_MMQ=0 "$BIN" bench --device cuda -m "$TMPD/1b-q4_0.gguf" -p 4096 -n 0 -r 3 -o json
    [ -n "$PEER" ] && for ty in q4_0 q8_0; do
        step "peer_$ty" 120 "$PEER" -m "$TMPD/1b-$ty.gguf" -p 512 -n 128 -r 3 -ngl 99 -fa 1 -o jsonl
    done
    [ -n "$PEER" ] && step peer_q4_0_d8192 120 "$PEER" -m "$TMPD/1b-q4_0.gguf" -d 8192 -p 0 -n 64 -r 3 -ngl 99 -fa 1 -o jsonl
    [ -n "$PEER" ] && step peer_q4_0_pp4096 120 "$PEER" -m "$TMPD/1b-q4_0.gguf" -p 4096 -n 0 -r 3 -ngl 99 -fa 1 -o jsonl
    # the other types, and llama.cpp's CUDA build on the same file right after each
    for ty in q4_K_M iq4_xs q3_K_M; do
        step "quantize_$ty" 90 "$BIN" quantize -t "$(nproc)" "$TMPD/1b-f16.gguf" "$TMPD/1b-$ty.gguf" "$ty"
    done
    for ty in f16 q4_K_M iq4_xs q3_K_M; do
        step "bench_$ty" 90 "$BIN" bench --device cuda -m "$TMPD/1b-$ty.gguf" -p 512 -n 128 -r 3 -o json
        [ -n "$PEER" ] && step "peer_$ty" 120 "$PEER" -m "$TMPD/1b-$ty.gguf" -p 512 -n 128 -r 3 -ngl 99 -fa 1 -o jsonl
    done
    # decode with each one-token fusion and launch setting away from its default (docs/cuda.md),
    # then all off; the defaults again last, to see the drift within the run
    for v in rows1:TERN_CUDA_GEMV_ROWS=1 norope:TERN_CUDA_FUSE_ROPE=0 nonorm:TERN_CUDA_FUSE_NORM=0 noglu:TERN_CUDA_FUSE_GLU=0 \
        noprefetch:TERN_CUDA_PREFETCH=0 \
        noearly:TERN_CUDA_EARLY=0 bps16:TERN_CUDA_GEMV_BPS=16 \
        "alloff:TERN_CUDA_FUSE=0 TERN_CUDA_PREFETCH=0 TERN_CUDA_EARLY=0 TERN_CUDA_GEMV_BPS=0 TERN_CUDA_GEMV_ROWS=1" \
        default:TERN_CUDA_X=1; do
        # shellcheck disable=SC2086 # the settings are words
        step "bench_q4_0_${v%%:*}" 60 env ${v#*:} "$BIN" bench --device cuda -m "$TMPD/1b-q4_0.gguf" -p 0 -n 128 -r 5 -o json
    done
    step bench_tq2_alloff 60 env TERN_CUDA_FUSE=0 TERN_CUDA_PREFETCH=0 TERN_CUDA_EARLY=0 TERN_CUDA_GEMV_BPS=0 TERN_CUDA_GEMV_ROWS=1 \
        "$BIN" bench --device cuda -m "$TMPD/1b-tq2.gguf" -p 0 -n 128 -r 5 -o json
    # prefill through the batch-invariant kernels (as tern serve runs): the tensor-core kernel for
    # the code types (the default) and the GEMV kernels' token tiles it replaced
    TERN_CUDA_PREFILL=gemv step bench_q4_0_gemv 60 "$BIN" bench --device cuda -m "$TMPD/1b-q4_0.gguf" -p 512 -n 0 -r 3 -o json
    TERN_CUDA_PREFILL=gemv TERN_CUDA_MMQ=0 step bench_q4_0_gemv_tiles 60 "$BIN" bench --device cuda -m "$TMPD/1b-q4_0.gguf" \
        -p 512 -n 0 -r 3 -o json
    # where the tensor cores start to win over the token tiles (TERN_CUDA_MMQ: the smallest batch
    # on them, 65 by default): batches of 16 and 64 tokens, batch-invariant as tern serve's
    for np in 16 64; do
        for v in tiles:TERN_CUDA_MMQ=0 mmq:TERN_CUDA_MMQ=9; do
            # shellcheck disable=SC2086 # the settings are words
            TERN_CUDA_PREFILL=gemv step "bench_q4_0_pp${np}_${v%%:*}" 60 env ${v#*:} "$BIN" bench --device cuda \
                -m "$TMPD/1b-q4_0.gguf" -p "$np" -n 0 -r 5 -o json
        done
    done
    # where the time goes: every launch timed (TERN_CUDA_PROFILE=1; no graph), decode and prefill
    TERN_CUDA_PROFILE=1 step profile_q4_0_tg 60 "$BIN" bench --device cuda -m "$TMPD/1b-q4_0.gguf" -p 0 -n 64 -r 1
    TERN_CUDA_PROFILE=1 step profile_q4_0_pp 60 "$BIN" bench --device cuda -m "$TMPD/1b-q4_0.gguf" -p 512 -n 0 -r 1
    # a mixture of experts: the 1B shapes with 8 experts of n_ff rows per layer, top 2 (Mixtral-style,
    # 3.8 GB of weights, about 1 GB read per token), one-token steps routed on the GPU and on the host
    step synth_moe 180 "$BIN" synth -o "$TMPD/moe-q4_0.gguf" --preset 1b --experts 8 --top-k 2 --type q4_0
    step bench_moe_q4_0 120 "$BIN" bench --device cuda -m "$TMPD/moe-q4_0.gguf" -p 512 -n 128 -r 3 -o json
    step bench_moe_q4_0_host 90 env TERN_CUDA_MOE_HOST=1 "$BIN" bench --device cuda -m "$TMPD/moe-q4_0.gguf" -p 0 -n 64 -r 3 -o json
    [ -n "$PEER" ] && step peer_moe_q4_0 120 "$PEER" -m "$TMPD/moe-q4_0.gguf" -p 512 -n 128 -r 3 -ngl 99 -fa 1 -o jsonl
    TERN_CUDA_PROFILE=1 step profile_moe_tg 60 "$BIN" bench --device cuda -m "$TMPD/moe-q4_0.gguf" -p 0 -n 32 -r 1
    # layers split between GPU and CPU: half the layers on the GPU
    step bench_q4_0_ngl8 90 "$BIN" bench --device cuda -ngl 8 -m "$TMPD/1b-q4_0.gguf" -p 64 -n 16 -r 1 -t "$(nproc)"
fi

echo "results in $OUT"
