#!/usr/bin/env bash
# tern bench's machine peaks and --sweep-bits on a tiny f16 model: the shape of the output (8
# widths, the fields and columns), never timings; and the temporary directory is gone afterwards.
# usage: bench_sweep_test.sh TERN TMPDIR
set -u
TERN=$1 T=$2/bench-sweep.$$
mkdir -p "$T/tmp"
trap 'rm -rf "$T"' EXIT
fail=0
check() { if eval "$2"; then echo "ok: $1"; else echo "FAIL: $1"; fail=1; fi; }

"$TERN" synth --preset tiny --type f16 -o "$T/tiny-f16.gguf" >/dev/null 2>&1
check "synth tiny f16" '[ -s "$T/tiny-f16.gguf" ]'

# plain bench: the machine line and JSON fields
"$TERN" bench -m "$T/tiny-f16.gguf" -p 8 -n 4 -r 1 -t 1 > "$T/md" 2>"$T/mderr"
rc=$?
check "bench md exit 0" '[ $rc -eq 0 ]' || true
[ $rc -eq 0 ] || { echo "--- stderr of the md bench (exit $rc):"; tail -15 "$T/mderr"; echo "--- stdout:"; tail -15 "$T/md"; }
check "bench md machine line" 'grep -q "^machine: read .* GB/s (1 thread), .* GB/s (1 threads).*f32 FMA .* GFLOP/s, int8 dot .* GOP/s" "$T/md"'
check "bench md pp and tg rows" '[ $(grep -c "| *\(pp8\|tg4\) |" "$T/md") -eq 2 ]'
"$TERN" bench -m "$T/tiny-f16.gguf" -p 8 -n 4 -r 1 -t 1 -o json > "$T/json" 2>/dev/null
for f in read_bw_gbs read_bw_1t_gbs fma_gflops int8_gops roofline_pct bytes_per_token gbs gops; do
  check "bench json has $f" 'grep -q "\"$f\":" "$T/json"'
done

# sweep: 8 widths, md and json; the quantized files live in $TMPDIR/tern-sweep-* and are removed
TMPDIR="$T/tmp" "$TERN" bench --sweep-bits -m "$T/tiny-f16.gguf" -n 4 -r 1 -t 1 > "$T/smd" 2>"$T/serr"
rc=$?
check "sweep md exit 0" '[ $rc -eq 0 ]' || true
[ $rc -eq 0 ] || { echo "--- stderr of the md sweep (exit $rc):"; tail -15 "$T/serr"; }
check "sweep md has 8 tg rows, b = 1..8" '[ "$(grep -o "^| [1-8] | tq[1-8]g64a *| .*| tg4 " "$T/smd" | cut -c3 | tr -d "\n")" = 12345678 ]'
check "sweep md columns" 'grep -q "^| b | type *| *bpw | file MiB | MiB/token | test *| *t/s | *GB/s | roofline |" "$T/smd"'
check "sweep md machine line" 'grep -q "^machine: read" "$T/smd"'
check "sweep temp dir removed" '[ -z "$(ls -A "$T/tmp")" ]'
TMPDIR="$T/tmp" "$TERN" bench --sweep-bits -m "$T/tiny-f16.gguf" -n 4 -p 8 -r 1 -t 1 --group 32 --sym -o json > "$T/sjson" 2>/dev/null
check "sweep json exit 0" '[ $? -eq 0 ]'
check "sweep json has 8 widths" '[ $(grep -c "\"bits\":" "$T/sjson") -eq 8 ]'
check "sweep json types tq1g32..tq8g32" '[ "$(grep -o "\"type\": \"tq[1-8]g32\"" "$T/sjson" | wc -l)" -eq 8 ]'
for f in bpw bytes_per_token tg_ts tg_gbs roofline_pct roofline_size_pct pp_ts pp_gops read_bw_gbs; do
  check "sweep json has $f on every width" '[ $(grep -c "\"$f\":" "$T/sjson") -eq 8 ]'
done
python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); assert len(r)==8 and [x["bits"] for x in r]==list(range(1,9))' "$T/sjson" 2>/dev/null
check "sweep json parses, bits 1..8" '[ $? -eq 0 ]'
# the whole-file percentage is the bytes-read one scaled by file size / bytes per token, to within
# the rounding of the two printed percentages (2 decimals each: 0.005, the first one's scaled too)
python3 -c '
import json,sys
for x in json.load(open(sys.argv[1])):
    ratio = x["model_size"] / x["bytes_per_token"]
    want = x["roofline_pct"] * ratio
    assert x["roofline_pct"] > 0 and ratio > 1, x
    assert abs(x["roofline_size_pct"] - want) <= 0.005 * (1 + ratio) + 1e-3 * want, (x["roofline_size_pct"], want)' "$T/sjson" 2>/dev/null
check "sweep json roofline_size_pct = roofline_pct x size / bytes per token" '[ $? -eq 0 ]'
check "sweep temp dir removed (json)" '[ -z "$(ls -A "$T/tmp")" ]'

# errors: a sweep needs -m; a bad group is a usage error
"$TERN" bench --sweep-bits >/dev/null 2>&1; check "sweep without -m exits 64" '[ $? -eq 64 ]'
# a quantized model: refused (65) naming the type, before anything is quantized or measured
"$TERN" synth --preset tiny --type q8_0 -o "$T/tiny-q8.gguf" >/dev/null 2>&1
TMPDIR="$T/tmp" "$TERN" bench --sweep-bits -m "$T/tiny-q8.gguf" -n 4 -r 1 -t 1 >/dev/null 2>"$T/qerr"
check "sweep of a q8_0 model exits 65" '[ $? -eq 65 ]'
check "sweep of a q8_0 model names the type, measures nothing" 'grep -q "needs an f32, f16 or bf16 model.*q8_0" "$T/qerr" && ! grep -q "measuring the machine" "$T/qerr"'
check "sweep of a q8_0 model leaves no temp dir" '[ -z "$(ls -A "$T/tmp")" ]'
"$TERN" bench --sweep-bits -m "$T/tiny-f16.gguf" --group 48 >/dev/null 2>&1; check "bad --group exits 64" '[ $? -eq 64 ]'
exit $fail
