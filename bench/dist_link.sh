#!/usr/bin/env bash
# bench/dist_link.sh [TERN] [WORK_DIR] — training speed of the distributed methods behind a slow
# link: tokens/s of dp, dp --compress int8, diloco (H=10 and H=100) and noloco (H=10) on 2 ranks
# (`mpirun -np 2`, 1 thread each) at several simulated link rates (`--sim-link RATE,LAT`: every
# exchange lasts at least LAT + bytes / RATE, the ranks sleeping the rest; docs/distributed.md,
# "Slow links"), to show where diloco/noloco overtake dp.
# Model and data: the default model's family at the size bench/dist_converge.sh trains (llama:
# n_embd 128, 2 layers, 4/2 heads, n_ff 384, ctx 64, a 1024-token BPE; 656,000 parameters) on the
# first LINES lines of the default model's corpus (the King James Bible, scripts/make-kjv-corpus.sh).
# tokens/s is tern's own (the done line: tokens trained / wall time of the step loop, both ranks).
# Steps per point: diloco/noloco run one whole outer period (H steps, the last one exchanging, as
# a long run's average does); dp runs fewer steps where the link is slow (the sleep dominates, so
# a few steps measure it).
# Writes WORK_DIR/link.tsv, WORK_DIR/link.md (markdown table) and SVG (tokens/s vs link rate, log
# x; default docs/dist-link.svg), and prints the table.
# Knobs (environment): RATES ("10gbit 1gbit 100mbit 10mbit 1mbit"; "none", the real transport, is
# always measured first), LAT (1ms, added to every rate), B (per-rank batch, 8), LINES (12000),
# H1 (10) and H2 (100) the outer periods, DP_STEPS (20) the most dp steps per point, SVG, REUSE=1
# (redraw from the logs already in WORK_DIR).
# Timing: run it on a quiet machine; the measurements run under one `flock /tmp/bench.lock` (taken
# once the corpus and tokenizer are ready, held to the end) so no other measurement overlaps them. About 6 minutes wall with the defaults.
# Needs Open MPI (mpirun), awk and the bible-kjv package.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
tern=${1:-$here/build/tern}
work=${2:-$here/build/link}
RATES=${RATES:-10gbit 1gbit 100mbit 10mbit 1mbit} LAT=${LAT:-1ms} B=${B:-8} LINES=${LINES:-12000}
H1=${H1:-10} H2=${H2:-100} DP_STEPS=${DP_STEPS:-20}
SVG=${SVG:-$here/docs/dist-link.svg}
CTX=64
. "$here/bench/dist_common.sh"
COMMON=(train "${MODEL[@]}" --batch "$B" --lr 2e-3 --warmup 10 --seed 1 -t 1 --val-every 100000 --val-batches 1
        --log-every 100000)

# the link rate in bits/s for the plot ("none": 0)
bits() {
  awk -v r="${1%%,*}" 'BEGIN { n = r + 0; u = tolower(substr(r, length(n "") + 1))
    print (u == "kbit" ? n * 1e3 : u == "mbit" ? n * 1e6 : u == "gbit" ? n * 1e9 : 0) }'
}
# dp steps at a rate: about 20 s of simulated link at most, 2 at least, DP_STEPS at most
dp_steps() { # RATE BYTES_PER_STEP
  awk -v b="$(bits "$1")" -v x="$2" -v m="$DP_STEPS" 'BEGIN { if (b == 0) { print m; exit }
    s = int(20 / (8 * x / b + 0.001)); print (s < 2 ? 2 : (s > m ? m : s)) }'
}
# one point: METHOD_NAME RATE STEPS args... -> a TSV row
point() {
  local name=$1 rate=$2 steps=$3; shift 3
  local log="$work/$name.$rate.log" link=()
  [ "$rate" = none ] || link=(--sim-link "$rate,$LAT")
  if ! { [ "${REUSE:-0}" = 1 ] && [ -s "$log" ]; }; then
    mpirun -np 2 --bind-to none "$tern" "${COMMON[@]}" --steps "$steps" "$@" "${link[@]}" \
      -o "$work/out.gguf" >"$log" 2>&1 || { echo "$name at $rate failed: $(tail -3 "$log")" >&2; exit 1; }
  fi
  local tps bytes wait
  tps=$(sed -n 's/.*, \([0-9.]*\) tokens\/s,.*/\1/p' "$log")
  bytes=$(sed -n 's/.*communicated \([0-9]*\) bytes per rank.*/\1/p' "$log")
  wait=$(sed -n 's/.*waited \([0-9.]*\) s on it.*/\1/p' "$log")
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$rate" "$(bits "$rate")" "$steps" "$tps" "$((bytes / steps))" "${wait:-0}" \
    | tee -a "$work/link.tsv" >&2
}
exec 9>/tmp/bench.lock
flock 9 # held until the script exits
printf 'method\trate\tbits_per_s\tsteps\ttokens_per_s\tbytes_per_step\tlink_wait_s\n' >"$work/link.tsv"
# n_params from the plan of a 1-step run: dp sends 4 (n + 1) bytes per step
point dp none "$DP_STEPS" --dist dp
dpb=$(awk -F'\t' 'NR == 2 { print $6 }' "$work/link.tsv")
q8b=$(( dpb / 4 + dpb / 256 + 8 )) # int8 + one f32 scale per 256 values, about
for rate in none $RATES; do
  [ "$rate" = none ] || point dp "$rate" "$(dp_steps "$rate" "$dpb")" --dist dp
  point dp-int8 "$rate" "$(dp_steps "$rate" "$q8b")" --dist dp --compress int8
  point "diloco-H$H1" "$rate" "$H1" --dist diloco --outer-every "$H1"
  point "noloco-H$H1" "$rate" "$H1" --dist noloco --outer-every "$H1"
  point "diloco-H$H2" "$rate" "$H2" --dist diloco --outer-every "$H2"
done

# markdown: one row per rate, one column per method (tokens/s), and dp's bytes per step
awk -F'\t' -v lat="$LAT" '
NR > 1 { if (!($2 in seen)) { seen[$2] = 1; rates[++nr] = $2 }
         if (!($1 in ms)) { ms[$1] = 1; meth[++nm] = $1 }
         t[$1, $2] = $5; by[$1] = $6 }
END {
  printf "| link (rate, + %s per exchange) |", lat
  for (j = 1; j <= nm; j++) printf " %s |", meth[j]
  printf "\n|---|"; for (j = 1; j <= nm; j++) printf "---|"; printf "\n"
  for (i = 1; i <= nr; i++) {
    printf "| %s |", rates[i] == "none" ? "none (shared memory)" : rates[i]
    best = 0; for (j = 1; j <= nm; j++) if (t[meth[j], rates[i]] > best) best = t[meth[j], rates[i]]
    for (j = 1; j <= nm; j++) { v = t[meth[j], rates[i]]; printf (v == best ? " **%.0f** |" : " %.0f |"), v }
    printf "\n"
  }
  printf "| bytes per rank per step |"; for (j = 1; j <= nm; j++) printf " %d |", by[meth[j]]; printf "\n"
}' "$work/link.tsv" >"$work/link.md"

# SVG: tokens/s vs link rate, log x; "none" drawn at the right edge (one decade past the fastest)
awk -F'\t' -v lat="$LAT" '
NR > 1 { n++; m[n] = $1; b[n] = $3 + 0; t[n] = $5 + 0; if (t[n] > tmax) tmax = t[n]
         if (b[n] > 0 && (bmin == 0 || b[n] < bmin)) bmin = b[n]; if (b[n] > bmax) bmax = b[n] }
END {
  W = 720; H = 420; L = 70; R = 170; T = 36; Bm = 56; pw = W - L - R; ph = H - T - Bm
  lo = int(log(bmin) / log(10) + 1e-9); hi = int(log(bmax) / log(10) + 1e-9) + 1
  printf "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" font-size=\"12\">\n", W, H
  printf "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
  printf "<text x=\"%d\" y=\"20\">tokens/s vs simulated link rate (+ %s per exchange), 2 ranks x 1 thread</text>\n", L, lat
  printf "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n", L, T + ph, L + pw, T + ph
  printf "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n", L, T, L, T + ph
  split("bit/s kbit/s Mbit/s Gbit/s Tbit/s", un, " ")
  for (e = lo; e <= hi; e++) {
    x = L + pw * (e - lo) / (hi - lo); k = int(e / 3); v = 10 ^ (e - 3 * k)
    lab = e == hi ? "none" : sprintf("%d %s", v, un[k + 1])
    printf "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#ddd\"/>\n", x, T, x, T + ph
    printf "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%s</text>\n", x, T + ph + 16, lab
  }
  for (i = 0; i <= 4; i++) {
    y = T + ph - ph * i / 4
    printf "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%.0f</text>\n", L - 6, y + 4, tmax * i / 4
    printf "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#eee\"/>\n", L, y, L + pw, y
  }
  printf "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">link rate (log scale; right: no simulated link)</text>\n", L + pw / 2, H - 12
  printf "<text x=\"16\" y=\"%d\" transform=\"rotate(-90 16 %d)\" text-anchor=\"middle\">tokens/s</text>\n", T + ph / 2, T + ph / 2
  split("#1f77b4 #9467bd #ff7f0e #2ca02c #d62728", col, " "); nc = 0
  for (i = 1; i <= n; i++) if (!(m[i] in ci)) { ci[m[i]] = ++nc; names[nc] = m[i] }
  for (k = 1; k <= nc; k++) {
    np = 0
    for (i = 1; i <= n; i++) if (m[i] == names[k]) { e = b[i] > 0 ? log(b[i]) / log(10) : hi; px[++np] = L + pw * (e - lo) / (hi - lo); py[np] = T + ph - ph * t[i] / tmax }
    for (i = 1; i <= np; i++) for (j = i + 1; j <= np; j++) if (px[j] < px[i]) { s = px[i]; px[i] = px[j]; px[j] = s; s = py[i]; py[i] = py[j]; py[j] = s }
    pts = ""; for (i = 1; i <= np; i++) { pts = pts sprintf("%.1f,%.1f ", px[i], py[i]); printf "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", px[i], py[i], col[k] }
    dash = names[k] ~ /noloco/ ? " stroke-dasharray=\"6 4\"" : ""
    printf "<polyline points=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s/>\n", pts, col[k], dash
    printf "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"2\"%s/>\n", W - R + 10, T + 10 + 18 * k, W - R + 30, T + 10 + 18 * k, col[k], dash
    printf "<text x=\"%d\" y=\"%d\">%s</text>\n", W - R + 36, T + 14 + 18 * k, names[k]
  }
  printf "</svg>\n"
}' "$work/link.tsv" >"$SVG.tmp"
mv "$SVG.tmp" "$SVG"
cat "$work/link.md"
