#!/usr/bin/env bash
# Reproduces docs/quant-quality.md: size, perplexity and KL divergence against the f16 base of
# tern's default model (models/tern-default.gguf) for tern's tq types, tern's --target-bpw and
# llama.cpp's own llama-quantize types, each with and without an importance matrix; writes
# WORK/results.tsv, a markdown table on stdout, and docs/quant-quality.svg (KLD and PPL vs bpw).
#
# usage: scripts/quant-quality.sh TERN [LLAMA_BIN_DIR] [WORK]
#        SET=2bit scripts/quant-quality.sh TERN [LLAMA_BIN_DIR] [WORK]
#   SET=2bit: the 2-bit table instead (tern's vq2 against tern's IQ2_XXS / IQ2_XS / IQ2_M and tq2
#                  types, --pure with token_embd and output in q8_0 so only the layer matrices
#                  differ; vq2 also with --calib: Hessians on the calibration text, imatrix column
#                  "hessian"); writes WORK/results-2bit.tsv and the table, no plot
#   TERN           tern binary (e.g. build/tern)
#   LLAMA_BIN_DIR  folder with llama.cpp's llama-quantize and llama-imatrix (optional: without it
#                  the llama.cpp rows are skipped); built outside this repository
#   WORK           scratch folder (default build/quant-quality)
#   MODEL=FILE     another base than the default model, on the same tokenizer and corpus (e.g. the
#                  29M model of docs/speculative.md; its trainer held out the same windows)
#
# Data (needs Debian's bible-kjv, installed by scripts/install-test-deps.sh):
#   - base: the shipped model is q8_0; it is dequantized to F16 (tern quantize ... F16), so "f16
#     base" means the q8_0 model in f16, not the trainer's f32 weights;
#   - evaluation: the KJV verses that lie wholly inside the trainer's validation windows (every
#     20th window of 128 tokens, src/train/data.h) — text the model never trained on, in its
#     domain. The corpus is rebuilt and tokenized one paragraph at a time exactly as the trainer
#     did (the token count must be the training run's 986404);
#   - calibration (imatrix, --calib): the first 120 kB of the corpus without those verses.
# Perplexity and KLD: tern perplexity -c 128 (the model's context), second half of each chunk.
set -euo pipefail
TERN=$(realpath "${1:?usage: $0 TERN [LLAMA_BIN_DIR] [WORK]}")
LL=${2:-}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
W=${3:-$ROOT/build/quant-quality}
mkdir -p "$W"
W=$(realpath "$W")
M=${MODEL:-$ROOT/models/tern-default.gguf}
T=${THREADS:-2}
C=128
if [ -n "$LL" ] && [ ! -x "$LL/llama-quantize" ]; then echo "no llama-quantize in $LL: skipping llama.cpp rows" >&2; LL=; fi
log() { echo "[quant-quality] $*" >&2; }

# ---- data --------------------------------------------------------------------------------------
if [ ! -s "$W/eval.txt" ] || [ ! -s "$W/calib.txt" ]; then
  log "building the held-out evaluation text"
  bash "$ROOT/scripts/make-kjv-corpus.sh" "$W/kjv.txt"
  rm -rf "$W/para" && mkdir -p "$W/para"
  awk -v RS= -v d="$W/para" '{ f = sprintf("%s/p%05d.txt", d, NR); printf "%s", $0 > f; close(f) }' "$W/kjv.txt"
  for f in "$W"/para/p*.txt; do "$TERN" tokenize -m "$M" -f "$f" --ids 2>/dev/null | tr -d '[],'; done > "$W/ids.txt"
  n=$(awk '{ n += NF } END { print n }' "$W/ids.txt")
  [ "$n" = 986404 ] || { echo "tokenized corpus has $n tokens, the training run had 986404" >&2; exit 65; }
  # verses whose tokens and closing newline (id 281) lie inside a validation window (w % 20 == 19)
  awk 'FNR == NR {
         for (i = 1; i <= NF; i++) {
           if (i == 1 || $(i) == 281) { if (i > 1) end[NR, k] = pos - 1; k = (i == 1) ? 0 : k + 1; start[NR, k] = pos + 1 }
           pos++
         }
         end[NR, k] = pos - 1; nv[NR] = k + 1; ntok = pos; next }
       { n = split($0, lines, "\n")
         for (k = 0; k < n && k < nv[FNR]; k++) {
           s = start[FNR, k]; e = end[FNR, k] + 1; w = int(s / 128)
           if (w % 20 == 19 && s % 128 >= 1 && int(e / 128) == w && (w + 1) * 128 < ntok) print lines[k + 1]
         } }' "$W/ids.txt" RS= "$W/kjv.txt" > "$W/eval.txt.tmp"
  mv "$W/eval.txt.tmp" "$W/eval.txt"
  grep -vxFf "$W/eval.txt" "$W/kjv.txt" > "$W/train-only.txt"
  head -c 120000 "$W/train-only.txt" > "$W/calib.txt"
  rm -rf "$W/para" "$W/train-only.txt"
fi
[ -s "$W/base-f16.gguf" ] || "$TERN" quantize --allow-requantize "$M" "$W/base-f16.gguf" F16 -t "$T" 2>/dev/null
[ -s "$W/base.kld" ] || "$TERN" perplexity -m "$W/base-f16.gguf" -f "$W/eval.txt" -c $C -t "$T" --kl-divergence-base "$W/base.kld" >/dev/null 2>&1
[ -s "$W/imatrix-tern.gguf" ] || "$TERN" imatrix -m "$W/base-f16.gguf" -f "$W/calib.txt" -c $C -t "$T" -o "$W/imatrix-tern.gguf" 2>/dev/null
if [ -n "$LL" ] && [ ! -s "$W/imatrix-llama.gguf" ]; then
  "$LL/llama-imatrix" -m "$W/base-f16.gguf" -f "$W/calib.txt" -c $C -t "$T" -o "$W/imatrix-llama.gguf" >/dev/null 2>&1
fi

# ---- rows: NAME <tab> who <tab> imatrix <tab> command that writes $OUT -----------------------------
bpw_of() { "$TERN" info "$1" | awk '/bits per weight/ { print $(NF-3) }'; }
rows=()
add() { rows+=("$1"$'\t'"$2"$'\t'"$3"$'\t'"$4"); }
SET=${SET:-all}
for im in no yes; do
  [ "$SET" = 2bit ] && break
  IM=; [ $im = yes ] && IM="--imatrix $W/imatrix-tern.gguf"
  for b in 1 2 3 4 5 6 8; do add "tq${b}g64a" tern $im "\"$TERN\" quantize $IM \"$W/base-f16.gguf\" \"\$OUT\" tq${b}g64a -t $T"; done
  for b in 2 3 4; do add "tq${b}g32a" tern $im "\"$TERN\" quantize $IM \"$W/base-f16.gguf\" \"\$OUT\" tq${b}g32a -t $T"; done
  for b in 3 4 5; do add "tq${b}g128" tern $im "\"$TERN\" quantize $IM \"$W/base-f16.gguf\" \"\$OUT\" tq${b}g128 -t $T"; done
  if [ -n "$LL" ]; then
    LIM=; [ $im = yes ] && LIM="--imatrix $W/imatrix-llama.gguf"
    for q in Q2_K Q3_K_M Q4_0 Q4_K_M Q5_K_M Q6_K Q8_0; do
      add "$q" llama.cpp $im "\"$LL/llama-quantize\" $LIM \"$W/base-f16.gguf\" \"\$OUT\" $q $T"
    done
  fi
done
if [ -n "$LL" ]; then # llama-quantize with tern's importance matrix (the formats interoperate)
  add "Q4_K_M (tern imatrix)" llama.cpp tern "\"$LL/llama-quantize\" --imatrix $W/imatrix-tern.gguf \"$W/base-f16.gguf\" \"\$OUT\" Q4_K_M $T"
fi

if [ "$SET" = 2bit ]; then
  # only the layer matrices differ: --pure, token_embd and output q8_0 in every file
  P="--pure --token-embedding-type q8_0 --output-tensor-type q8_0"
  for im in no yes; do
    IM=; [ $im = yes ] && IM="--imatrix $W/imatrix-tern.gguf"
    for q in vq2 tq2g256 tq2g128 tq2g64a; do add "$q (pure)" tern $im "\"$TERN\" quantize $P $IM \"$W/base-f16.gguf\" \"\$OUT\" $q -t $T"; done
    # tern's i-quants need importance data (as llama-quantize's do); IQ2_M --pure = iq2_s tensors (IQ2_S --pure = iq2_xs)
    [ $im = yes ] && for q in IQ2_XXS IQ2_XS IQ2_M; do add "$q (pure)" tern $im "\"$TERN\" quantize $P $IM \"$W/base-f16.gguf\" \"\$OUT\" $q -t $T"; done
  done
  # vq2 with the layers' Hessians collected on the calibration text (error feedback, quant/vq.h)
  add "vq2 (pure, --calib)" tern hessian "\"$TERN\" quantize $P --calib $W/calib.txt \"$W/base-f16.gguf\" \"\$OUT\" vq2 -t $T"
fi

table() { # the markdown table of a results file, by bpw
  echo "| file | made by | imatrix | bpw | PPL | mean KLD | same top |"
  echo "|---|---|---|---|---|---|---|"
  sort -t$'\t' -k4,4g "$1" | awk -F'\t' '{ printf "| %s | %s | %s | %.3f | %.3f | %s | %s |\n", $1, $2, $3, $4, $5, $6, $7 }'
}
safe() { printf '%s' "$1" | tr -c 'A-Za-z0-9_.-' '_'; }
run_row() { # name who im cmd -> tsv line
  local name=$1 who=$2 im=$3 cmd=$4 out
  out="$W/m-$(safe "$name")-$im.gguf"
  [ -s "$out" ] || OUT="$out" bash -c "OUT=\"$out\"; $cmd" >"$W/last.log" 2>&1 || { log "FAILED: $name ($im): $(tail -2 "$W/last.log")"; return 0; }
  local bpw res cache="${out%.gguf}.result"
  [ -s "$cache" ] && [ "$cache" -nt "$out" ] && { cat "$cache"; return 0; }
  bpw=$(bpw_of "$out")
  res=$("$TERN" perplexity -m "$out" --kl-divergence --kl-divergence-base "$W/base.kld" -t "$T" 2>/dev/null |
        awk '/^Final estimate/ { ppl = $5 } /^Mean KLD/ { kld = $3 } /^Same top/ { top = $4 } END { print ppl "\t" kld "\t" top }')
  printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$who" "$im" "$bpw" "$res" | tee "$cache"
}

TSV=$W/results.tsv
if [ "$SET" = 2bit ]; then
  TSV=$W/results-2bit.tsv
  for r in "${rows[@]}"; do IFS=$'\t' read -r a b c d <<<"$r"; log "$a ($b, imatrix $c)"; run_row "$a" "$b" "$c" "$d"; done > "$TSV.tmp"
  mv "$TSV.tmp" "$TSV"
  table "$TSV"
  exit 0
fi
{
  base_ppl=$("$TERN" perplexity -m "$W/base-f16.gguf" --kl-divergence --kl-divergence-base "$W/base.kld" -t "$T" 2>/dev/null | awk '/^Final estimate/ { print $5 }')
  printf 'F16 (base)\tbase\tno\t%s\t%s\t0\t100.000%%\n' "$(bpw_of "$W/base-f16.gguf")" "$base_ppl"
  for r in "${rows[@]}"; do IFS=$'\t' read -r a b c d <<<"$r"; log "$a ($b, imatrix $c)"; run_row "$a" "$b" "$c" "$d"; done
  # tern --target-bpw at 3.1 / 4.0 / 4.9 and at the bpw of llama.cpp's Q2_K, Q3_K_M, Q4_K_M files
  targets="3.1 4.0 4.9"
  if [ -n "$LL" ]; then
    # (0.001 below the printed, rounded bpw, so tern's file is never the larger one)
    for q in Q2_K Q3_K_M Q4_K_M; do f="$W/m-$q-no.gguf"; [ -s "$f" ] && targets="$targets $(bpw_of "$f" | awk '{ printf "%.3f", $1 - 0.001 }')"; done
  fi
  for x in $targets; do
    log "target-bpw $x"
    run_row "tq4 --target-bpw $x" tern no "\"$TERN\" quantize --target-bpw $x \"$W/base-f16.gguf\" \"\$OUT\" tq4g64a -t $T"
    run_row "tq4 --target-bpw $x" tern yes "\"$TERN\" quantize --imatrix $W/imatrix-tern.gguf --calib $W/calib.txt --target-bpw $x \"$W/base-f16.gguf\" \"\$OUT\" tq4g64a -t $T"
  done
} > "$TSV.tmp"
mv "$TSV.tmp" "$TSV"

# ---- markdown table -------------------------------------------------------------------------------
table "$TSV"

# ---- SVG: mean KLD (log) and PPL against bpw, tern vs llama.cpp; big hollow = no imatrix, small
# filled = with imatrix (so both show where they overlap); PPL panel clipped at +4% of the base -----
awk -F'\t' -v out="$ROOT/docs/quant-quality.svg" '
  function X(b) { return L + (b - xmin) / (xmax - xmin) * PW }
  function YK(k) { return T1 + (log(kmax) - log(k)) / (log(kmax) - log(kmin)) * PH }
  function YP(p) { return T2 + (pmax - p) / (pmax - pmin) * PH }
  function mark(x, y, who, im, tb,    col, fill, r) {
    col = who == "llama.cpp" ? "#d62728" : "#1f77b4"; fill = im == "no" ? "none" : col; r = im == "no" ? 6 : 3
    if (tb) printf "<rect x=\"%.1f\" y=\"%.1f\" width=\"%d\" height=\"%d\" fill=\"%s\" stroke=\"%s\" stroke-width=\"1.5\"/>\n", x - r, y - r, 2 * r, 2 * r, fill, col > out
    else if (who == "llama.cpp") printf "<path d=\"M%.1f %.1f l%.1f %.1f h%.1f z\" fill=\"%s\" stroke=\"%s\" stroke-width=\"1.5\"/>\n", x, y - 1.2 * r, 1.1 * r, 2 * r, -2.2 * r, fill, col > out
    else printf "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"%d\" fill=\"%s\" stroke=\"%s\" stroke-width=\"1.5\"/>\n", x, y, r, fill, col > out
  }
  $2 == "base" { base = $5 }
  $2 != "base" && $6 > 0 && $4 < 9.5 { n++; name[n] = $1; who[n] = $2; im[n] = $3; b[n] = $4; p[n] = $5; k[n] = $6 }
  END {
    L = 70; R = 20; PW = 640; PH = 260; T1 = 50; T2 = T1 + PH + 70; Wd = L + PW + R; Ht = T2 + PH + 50
    xmin = 2.5; xmax = 9; kmin = 1e9; kmax = 0
    for (i = 1; i <= n; i++) { if (k[i] < kmin) kmin = k[i]; if (k[i] > kmax) kmax = k[i] }
    kmin = 10 ^ int(log(kmin) / log(10) - 1); kmax = 10 ^ int(log(kmax) / log(10) + 1)
    pmin = base * 0.995; pmax = base * 1.04
    printf "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" font-size=\"12\">\n", Wd, Ht > out
    printf "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n" > out
    printf "<text x=\"%d\" y=\"20\" font-size=\"14\">tern-default (5.25M params, KJV), held-out KJV verses: KL divergence vs the f16 base</text>\n", L > out
    printf "<text x=\"%d\" y=\"%d\" font-size=\"14\">perplexity (f16 base %.2f, dashed; points above +4%% not shown)</text>\n", L, T2 - 12, base > out
    for (pan = 1; pan <= 2; pan++) {
      top = pan == 1 ? T1 : T2
      printf "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#888\"/>\n", L, top, PW, PH > out
      for (x = 3; x <= 9; x++) {
        printf "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#eee\"/>\n", X(x), top, X(x), top + PH > out
        printf "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%d</text>\n", X(x), top + PH + 15, x > out
      }
      printf "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">bits per weight (whole file)</text>\n", L + PW / 2, top + PH + 32 > out
    }
    for (e = kmin; e <= kmax * 1.0001; e *= 10) {
      printf "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#eee\"/>\n", L, YK(e), L + PW, YK(e) > out
      printf "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n", L - 5, YK(e) + 4, e > out
    }
    printf "<text x=\"15\" y=\"%d\" transform=\"rotate(-90 15 %d)\" text-anchor=\"middle\">mean KLD (log scale)</text>\n", T1 + PH / 2, T1 + PH / 2 > out
    for (j = 0; j <= 5; j++) {
      v = pmin + (pmax - pmin) * j / 5
      printf "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#eee\"/>\n", L, YP(v), L + PW, YP(v) > out
      printf "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%.2f</text>\n", L - 5, YP(v) + 4, v > out
    }
    printf "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#555\" stroke-dasharray=\"5,4\"/>\n", L, YP(base), L + PW, YP(base) > out
    printf "<text x=\"15\" y=\"%d\" transform=\"rotate(-90 15 %d)\" text-anchor=\"middle\">perplexity</text>\n", T2 + PH / 2, T2 + PH / 2 > out
    for (pass = 0; pass < 2; pass++) # hollow (no imatrix) first, filled on top
      for (i = 1; i <= n; i++) {
        if ((im[i] == "no") != (pass == 0) || b[i] < xmin || b[i] > xmax) continue
        tb = index(name[i], "target-bpw") > 0
        mark(X(b[i]), YK(k[i]), who[i], im[i], tb)
        if (p[i] <= pmax && p[i] >= pmin) mark(X(b[i]), YP(p[i]), who[i], im[i], tb)
      }
    lx = L + PW - 270; ly = T1 + 18
    mark(lx, ly, "tern", "no", 0);           printf "<text x=\"%d\" y=\"%d\">tern tq types (default mix)</text>\n", lx + 12, ly + 4 > out
    mark(lx, ly + 18, "tern", "no", 1);      printf "<text x=\"%d\" y=\"%d\">tern --target-bpw</text>\n", lx + 12, ly + 22 > out
    mark(lx, ly + 36, "llama.cpp", "no", 0); printf "<text x=\"%d\" y=\"%d\">llama.cpp llama-quantize</text>\n", lx + 12, ly + 40 > out
    printf "<text x=\"%d\" y=\"%d\">large hollow: no imatrix; small filled: imatrix</text>\n", lx - 6, ly + 58 > out
    printf "</svg>\n" > out
  }' "$TSV"
log "wrote $TSV and docs/quant-quality.svg"
