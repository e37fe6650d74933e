#!/usr/bin/env bash
# bench/dist_converge.sh [TERN] [WORK_DIR] — convergence of the distributed methods on one token
# budget: dp, diloco (H inner steps), noloco (H) and zo (one byte per sample per step), each on 2
# ranks (`mpirun -np 2`, 1 thread per rank) training a small llama (the default model's family:
# n_embd 128, 2 layers, 4/2 heads, n_ff 384, ctx 64, a 1024-token BPE) from the same seed on the
# default model's corpus (the King James Bible, scripts/make-kjv-corpus.sh; its first LINES lines).
# Writes docs/dist-converge.svg (validation loss vs tokens seen, all ranks together) and prints a
# markdown table: final validation loss, its ratio to dp's, bytes sent per rank (measured by
# tern, the "communicated" line). On 2 ranks noloco's one peer is the other rank, so it equals
# diloco (drawn dashed over it).
# Validation runs every H steps (where diloco/noloco have just synchronized) on rank 0.
# Knobs (environment): STEPS (300), H (25), B (per-rank batch, 8), LINES (12000), ZO_LR (1e-4),
# SVG (docs/dist-converge.svg), REUSE=1 (redraw from the runs already in WORK_DIR). About 6 CPU
# minutes with the defaults (32 min wall on a 2-core machine shared with other jobs).
# Needs Open MPI (mpirun), python3 (standard library only: the SVG is written by hand) and the
# bible-kjv package.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
tern=${1:-$here/build/tern}
work=${2:-$here/build/converge}
STEPS=${STEPS:-300} H=${H:-25} B=${B:-8} LINES=${LINES:-12000} ZO_LR=${ZO_LR:-1e-4}
SVG=${SVG:-$here/docs/dist-converge.svg}
CTX=64
command -v python3 >/dev/null || { echo "needs python3" >&2; exit 66; }
. "$here/bench/dist_common.sh"
COMMON=(train "${MODEL[@]}" --steps "$STEPS" --batch "$B" --warmup 30 --seed 1 -t 1 --val-every "$H" --val-batches 8
        --log-every 50)
run() { # NAME args...
  local name=$1; shift
  [ "${REUSE:-0}" = 1 ] && [ -s "$work/$name.loss.csv" ] && return
  local t0=$SECONDS
  nice -n 10 mpirun -np 2 --bind-to none "$tern" "${COMMON[@]}" "$@" -o "$work/$name.gguf" 2>"$work/$name.log" ||
    { echo "$name failed: $(tail -3 "$work/$name.log")" >&2; exit 1; }
  echo "$name: $(grep -o 'communicated.*' "$work/$name.log") in $((SECONDS - t0)) s" >&2
}
run dp --lr 2e-3 --dist dp
run diloco --lr 2e-3 --dist diloco --outer-every "$H"
run noloco --lr 2e-3 --dist noloco --outer-every "$H"
run zo --lr "$ZO_LR" --dist dp --zo
python3 - "$work" "$SVG" "$((2 * B * CTX))" "$H" <<'PY'
import csv, re, sys
work, svg, tok_per_step, H = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
names = ["dp", "diloco", "noloco", "zo"]
labels = {"dp": "dp", "diloco": "diloco H=%s" % H, "noloco": "noloco H=%s" % H, "zo": "zo (1 byte/sample)"}
dash = {"noloco": ' stroke-dasharray="6,4"'}
colors = {"dp": "#1f77b4", "diloco": "#ff7f0e", "noloco": "#2ca02c", "zo": "#d62728"}
curves, bytes_ = {}, {}
for n in names:
    pts = []
    with open("%s/%s.loss.csv" % (work, n)) as f:
        for r in csv.DictReader(f):
            if r["val_loss"]:
                pts.append((int(r["step"]) * tok_per_step, float(r["val_loss"])))
    curves[n] = pts
    log = open("%s/%s.log" % (work, n)).read()
    bytes_[n] = int(re.search(r"communicated (\d+) bytes per rank", log).group(1))
W, Hh, L, R, T, Bm = 820, 500, 70, 190, 40, 60
xs = [x for c in curves.values() for x, _ in c]
ys = [y for c in curves.values() for _, y in c]
x1, y0, y1 = max(xs), min(ys), max(ys)
y0, y1 = y0 - 0.05 * (y1 - y0), y1 + 0.05 * (y1 - y0)
X = lambda x: L + x / x1 * (W - L - R)
Y = lambda y: T + (y1 - y) / (y1 - y0) * (Hh - T - Bm)
o = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">' % (W, Hh),
     '<rect width="100%" height="100%" fill="white"/>',
     '<text x="%d" y="22">validation loss vs tokens (2 ranks, same budget and seed; tern bench/dist_converge.sh)</text>' % L,
     '<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>' % (L, Hh - Bm, W - R, Hh - Bm),
     '<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>' % (L, T, L, Hh - Bm)]
for k in range(5):
    v = y0 + (y1 - y0) * k / 4
    o.append('<text x="8" y="%.1f">%.2f</text>' % (Y(v) + 4, v))
    o.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>' % (L, Y(v), W - R, Y(v)))
    xv = x1 * k / 4
    o.append('<text x="%.1f" y="%d">%.0fk</text>' % (X(xv) - 12, Hh - Bm + 18, xv / 1000))
o.append('<text x="%d" y="%d">tokens seen (all ranks)</text>' % ((W - R) // 2 - 40, Hh - 15))
for i, n in enumerate(names):
    pts = " ".join("%.1f,%.1f" % (X(x), Y(y)) for x, y in curves[n])
    o.append('<polyline fill="none" stroke="%s" stroke-width="2"%s points="%s"/>' % (colors[n], dash.get(n, ""), pts))
    ly = T + 20 + 22 * i
    o.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="3"%s/>' % (W - R + 15, ly, W - R + 40, ly, colors[n], dash.get(n, "")))
    o.append('<text x="%d" y="%d">%s</text>' % (W - R + 45, ly + 4, labels[n]))
o.append("</svg>")
open(svg + ".tmp", "w").write("\n".join(o) + "\n")
import os
os.replace(svg + ".tmp", svg)
dpv = curves["dp"][-1][1]
print("| method | final val loss | vs dp | bytes sent per rank | per step |")
print("|---|---|---|---|---|")
steps = curves["dp"][-1][0] // tok_per_step
for n in names:
    v = curves[n][-1][1]
    print("| %s | %.4f | %+.1f%% | %d | %.1f |" % (labels[n], v, 100 * (v / dpv - 1), bytes_[n], bytes_[n] / steps))
PY
