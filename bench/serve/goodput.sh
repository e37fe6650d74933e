#!/usr/bin/env bash
# goodput.sh — goodput vs request rate, tern serve against another OpenAI-compatible server
# (llama.cpp's llama-server), same model file, same threads, same load and SLOs, alternating runs.
#
#   bench/serve/goodput.sh -m MODEL [-s LLAMA_SERVER] [--tern build/tern] [-t 2] [-np 8]
#                          [--rates "0.25 0.5 1 1.5 2"] [--duration 60] [--prompt-len 64-256]
#                          [--output-len 32-128] [--ttft-slo 4000] [--tpot-slo 200] [--out DIR]
#                          [--tern-args "ARGS"] [--variant NAME=ARGS]... [--peer-args "ARGS"] [--prompts FILE]
#                          [--closed N,M]
#
# For each rate: start tern serve, run `tern loadgen -o json`, stop it; then the same against
# llama-server (if given). Writes DIR/goodput.tsv (one row per server and rate), DIR/goodput.md
# (table) and DIR/goodput.svg (goodput and SLO attainment vs rate). Goodput here is DistServe's:
# requests per second of the offered load that met both objectives = attainment x rate
# (completed-in-SLO / sent, times sent / arrival window), so a server that falls behind is not
# credited for finishing late after the arrivals stop.
# --variant NAME=ARGS (repeatable) runs tern once per variant and rate with ARGS added to its
# command line, labelled NAME (e.g. --variant off= --variant "fixed4=--spec ngram --spec-fixed 4"
# --variant "adaptive=--spec ngram"); variants and the peer alternate within each rate.
# --peer-args adds arguments to llama-server's (e.g. "--model-draft small.gguf"). --prompts FILE:
# loadgen sends lines of FILE as prompts instead of random words. DIR/throughput.svg plots the
# output tokens/s the same way, DIR/tpot.svg the median time per output token. --closed N,M: instead
# of Poisson arrivals, a closed loop of N clients sending M requests in all (loadgen --concurrency N
# --requests M; the rate then only labels the rows: bench/serve/batch_peer.sh).
# The peer binary is built outside this repository by the user; nothing of it is kept here.
#   bench/serve/goodput.sh --replot --out DIR [--ttft-slo MS --tpot-slo MS]   rewrites DIR's table
#   and plot from DIR/goodput.tsv (e.g. after concatenating the rows of several runs).
set -u
TERN=build/tern
PEER=""
MODEL=""
T=2
NP=8
RATES="0.25 0.5 1 1.5 2"
DUR=60
PLEN=64-256
OLEN=32-128
TTFT=4000
TPOT=200
OUT=goodput-out
TERN_ARGS=""
PEER_ARGS=""
PROMPTS=""
CLOSED=""
VARIANTS=()
REPLOT=0
while [ $# -gt 0 ]; do
    case "$1" in
    -m) MODEL=$2; shift ;;
    -s) PEER=$2; shift ;;
    --tern) TERN=$2; shift ;;
    -t) T=$2; shift ;;
    -np) NP=$2; shift ;;
    --rates) RATES=$2; shift ;;
    --duration) DUR=$2; shift ;;
    --prompt-len) PLEN=$2; shift ;;
    --output-len) OLEN=$2; shift ;;
    --ttft-slo) TTFT=$2; shift ;;
    --tpot-slo) TPOT=$2; shift ;;
    --tern-args) TERN_ARGS=$2; shift ;;
    --peer-args) PEER_ARGS=$2; shift ;;
    --variant) case "$2" in *=*) VARIANTS+=("$2") ;; *) echo "goodput.sh: --variant wants NAME=ARGS, got '$2'" >&2; exit 64 ;; esac; shift ;;
    --prompts) PROMPTS=$2; shift ;;
    --closed) case "$2" in *,*) CLOSED=$2 ;; *) echo "goodput.sh: --closed wants N,M, got '$2'" >&2; exit 64 ;; esac; shift ;;
    --out) OUT=$2; shift ;;
    --replot) REPLOT=1 ;;
    -h | --help) sed -n '2,28p' "$0"; exit 0 ;;
    *) echo "goodput.sh: unknown argument '$1'" >&2; exit 64 ;;
    esac
    shift
done
if [ "$REPLOT" = 0 ]; then
[ -n "$MODEL" ] && [ -f "$MODEL" ] || { echo "goodput.sh: -m MODEL (an existing GGUF file) is required" >&2; exit 64; }
[ -x "$TERN" ] || { echo "goodput.sh: tern binary '$TERN' not found (build first or pass --tern)" >&2; exit 66; }
[ -z "$PROMPTS" ] || [ -f "$PROMPTS" ] || { echo "goodput.sh: --prompts $PROMPTS: no such file" >&2; exit 66; }
[ ${#VARIANTS[@]} -gt 0 ] || VARIANTS=("tern=")
command -v jq >/dev/null || { echo "goodput.sh: needs jq (apt-get install jq)" >&2; exit 69; }
mkdir -p "$OUT"
CTX=$((NP * 1024))
PID=""
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; wait 2>/dev/null; }
trap cleanup EXIT

free_port() { echo $((20000 + RANDOM % 20000)); }

start_tern() { # extra arguments
    "$TERN" serve -m "$MODEL" --port 0 -np "$NP" -t "$T" -c "$CTX" --ttft-slo "$TTFT" --tpot-slo "$TPOT" \
        --max-queue 256 $TERN_ARGS $1 >"$OUT/server.log" 2>&1 &
    PID=$!
    for _ in $(seq 1 1200); do
        URL=$(grep -o 'http://127.0.0.1:[0-9]*' "$OUT/server.log" | head -1)
        [ -n "$URL" ] && return 0
        kill -0 $PID 2>/dev/null || break
        sleep 0.1
    done
    echo "goodput.sh: tern serve did not start:" >&2; cat "$OUT/server.log" >&2; exit 70
}

start_peer() {
    local port; port=$(free_port)
    "$PEER" -m "$MODEL" --port "$port" -np "$NP" -t "$T" -tb "$T" -c "$CTX" $PEER_ARGS >"$OUT/server.log" 2>&1 &
    PID=$!
    URL=http://127.0.0.1:$port
    for _ in $(seq 1 1200); do
        curl -sf "$URL/health" >/dev/null 2>&1 && return 0
        kill -0 $PID 2>/dev/null || break
        sleep 0.1
    done
    echo "goodput.sh: $PEER did not start:" >&2; tail -20 "$OUT/server.log" >&2; exit 70
}

stop_server() { kill -TERM "$PID" 2>/dev/null; wait "$PID" 2>/dev/null; PID=""; }

run_one() { # name rate
    local name=$1 rate=$2 j
    j=$("$TERN" loadgen --url "$URL" --rate "$rate" --duration "$DUR" --prompt-len "$PLEN" --output-len "$OLEN" \
        --ttft-slo "$TTFT" --tpot-slo "$TPOT" ${CLOSED:+--concurrency "${CLOSED%,*}" --requests "${CLOSED#*,}"} ${PROMPTS:+--prompts "$PROMPTS"} -o json 2>/dev/null)
    [ -n "$j" ] || j='{}'
    echo "$j" >"$OUT/$name-$rate.json"
    echo "$j" | jq -r --arg n "$name" --arg r "$rate" '[$n, $r, (.sent // 0), (.completed // 0), (.rejected_429 // 0),
        (.failed // 0), ((.slo_attainment // 0) * (.sent // 0) / (.arrival_s // 1)), (.slo_attainment // 0),
        (.throughput_tok_s // 0), (.ttft_ms.p50 // 0), (.ttft_ms.p90 // 0), (.tpot_ms.p50 // 0), (.tpot_ms.p90 // 0)]
        | @tsv' >>"$OUT/goodput.tsv"
    tail -1 "$OUT/goodput.tsv" >&2
}

printf 'server\trate\tsent\tcompleted\t429\tfailed\tgoodput\tattainment\ttok_s\tttft_p50\tttft_p90\ttpot_p50\ttpot_p90\n' >"$OUT/goodput.tsv"
echo "goodput.sh: model $MODEL, -t $T -np $NP, prompt ${PROMPTS:-$PLEN}, output $OLEN, SLO TTFT $TTFT ms TPOT $TPOT ms, ${DUR}s per rate" >&2
for rate in $RATES; do
    for v in "${VARIANTS[@]}"; do start_tern "${v#*=}"; run_one "${v%%=*}" "$rate"; stop_server; done
    if [ -n "$PEER" ]; then start_peer; run_one llama-server "$rate"; stop_server; fi
done

else
    [ -f "$OUT/goodput.tsv" ] || { echo "goodput.sh: --replot needs $OUT/goodput.tsv" >&2; exit 66; }
fi

# table
{
    echo "| rate (req/s) | server | sent | in SLO | 429 | goodput (req/s) | attainment | out tok/s | TTFT p50/p90 ms | TPOT p50/p90 ms |"
    echo "|---|---|---|---|---|---|---|---|---|---|"
    tail -n +2 "$OUT/goodput.tsv" | awk -F'\t' '{ printf "| %s | %s | %d | %.0f | %d | %.3f | %.0f%% | %.1f | %.0f / %.0f | %.1f / %.1f |\n",
        $2, $1, $3, $8 * $3, $5, $7, 100 * $8, $9, $10, $11, $12, $13 }'
} >"$OUT/goodput.md"

# plots: goodput vs rate (solid) and the offered load (dotted diagonal); output tokens/s vs rate
plot() { # column, 1 = goodput plot (title, offered-load diagonal) / 0 = tokens/s / 2 = TPOT p50
tail -n +2 "$OUT/goodput.tsv" | awk -F'\t' -v ttft="$TTFT" -v tpot="$TPOT" -v col="$1" -v gp="$2" '
{ s[NR] = $1; r[NR] = $2 + 0; g[NR] = $col + 0; if (r[NR] > rmax) rmax = r[NR]; if (g[NR] > gmax) gmax = g[NR]; n = NR }
END {
    W = 640; H = 400; L = 60; R = 150; T = 30; B = 50; pw = W - L - R; ph = H - T - B
    if (gp == 1 && gmax < rmax) gmax = rmax
    if (gmax <= 0) gmax = 1
    printf "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" font-size=\"12\">\n", W, H
    printf "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
    if (gp == 1) printf "<text x=\"%d\" y=\"18\" text-anchor=\"middle\">goodput (TTFT &lt;= %s ms, TPOT &lt;= %s ms) vs offered load</text>\n", L + pw / 2, ttft, tpot
    else printf "<text x=\"%d\" y=\"18\" text-anchor=\"middle\">%s vs offered load</text>\n", L + pw / 2, gp == 2 ? "time per output token, median" : "output tokens/s"
    printf "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n", L, T + ph, L + pw, T + ph
    printf "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n", L, T, L, T + ph
    for (i = 0; i <= 4; i++) {
        x = L + pw * i / 4; y = T + ph - ph * i / 4
        printf "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%.2f</text>\n", x, T + ph + 16, rmax * i / 4
        printf "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%.2f</text>\n", L - 6, y + 4, gmax * i / 4
        printf "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", L, y, L + pw, y
    }
    printf "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">request rate (req/s, Poisson)</text>\n", L + pw / 2, H - 10
    printf "<text x=\"16\" y=\"%d\" transform=\"rotate(-90 16 %d)\" text-anchor=\"middle\">%s</text>\n", T + ph / 2, T + ph / 2, gp == 1 ? "goodput (req/s)" : gp == 2 ? "TPOT p50 (ms)" : "output tokens/s"
    if (gp == 1) printf "<line x1=\"%d\" y1=\"%d\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#999\" stroke-dasharray=\"4 4\"/>\n", L, T + ph, L + pw, T + ph - ph * rmax / gmax
    split("#1f77b4 #d62728 #2ca02c #9467bd #ff7f0e #8c564b #e377c2 #17becf", pal, " "); nc = 0
    for (i = 1; i <= n; i++) if (!(s[i] in ci)) { ci[s[i]] = ++nc; names[nc] = s[i] }
    for (k = 1; k <= nc; k++) {
        pts = ""
        for (i = 1; i <= n; i++) if (s[i] == names[k]) {
            x = L + pw * r[i] / rmax; y = T + ph - ph * g[i] / gmax; pts = pts sprintf("%.1f,%.1f ", x, y)
            printf "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", x, y, pal[k]
        }
        printf "<polyline points=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"2\"/>\n", pts, pal[k]
        printf "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"2\"/>\n", W - R + 10, T + 10 + 18 * k, W - R + 30, T + 10 + 18 * k, pal[k]
        printf "<text x=\"%d\" y=\"%d\">%s</text>\n", W - R + 36, T + 14 + 18 * k, names[k]
    }
    if (gp == 1) printf "<text x=\"%d\" y=\"%d\" fill=\"#999\">offered load</text>\n", W - R + 36, T + 14 + 18 * (nc + 1)
    printf "</svg>\n"
}'
}
plot 7 1 >"$OUT/goodput.svg"
plot 9 0 >"$OUT/throughput.svg"
plot 12 2 >"$OUT/tpot.svg"
cat "$OUT/goodput.md"
