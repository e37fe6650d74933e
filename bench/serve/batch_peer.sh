#!/usr/bin/env bash
# batch_peer.sh — serving throughput against batch size, tern serve beside llama.cpp's llama-server:
# for each batch size B, each server runs with -np B and B closed-loop clients (bench/serve/goodput.sh
# --closed B,N x B: loadgen --concurrency B --requests N x B), all sending the same seeded mix of
# requests (prompt and output lengths drawn from ranges: prefill and decode interleave in the
# batch), the two servers alternating per B. Writes DIR/batch.tsv and DIR/batch.md (output tokens
# per second per server and B, tern / llama-server, prompt + output tokens per second, and the
# median TTFT and TPOT). Needs jq.
#
#   bench/serve/batch_peer.sh -m MODEL [-s LLAMA_SERVER] [--tern build/tern] [-t 2]
#        [--batches "1 2 4 8 16"] [--per-slot 4] [--prompt-len 8-32] [--output-len 64-128] [--out DIR]
#
# --per-slot N: N x B requests per batch size. The peer binary is built outside this repository by
# the user.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
TERN=build/tern
PEER=""
MODEL=""
T=2
BATCHES="1 2 4 8 16"
PER=4
PLEN=8-32
OLEN=64-128
OUT=batch-out
while [ $# -gt 0 ]; do
    case "$1" in
    -m) MODEL=$2; shift ;;
    -s) PEER=$2; shift ;;
    --tern) TERN=$2; shift ;;
    -t) T=$2; shift ;;
    --batches) BATCHES=$2; shift ;;
    --per-slot) PER=$2; shift ;;
    --prompt-len) PLEN=$2; shift ;;
    --output-len) OLEN=$2; shift ;;
    --out) OUT=$2; shift ;;
    -h | --help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "batch_peer.sh: unknown argument '$1'" >&2; exit 64 ;;
    esac
    shift
done
[ -n "$MODEL" ] && [ -f "$MODEL" ] || { echo "batch_peer.sh: -m MODEL (an existing GGUF file) is required" >&2; exit 64; }
mkdir -p "$OUT"
printf 'batch\tserver\tsent\tcompleted\tout_tok_s\tall_tok_s\tttft_p50_ms\ttpot_p50_ms\n' >"$OUT/batch.tsv"
for b in $BATCHES; do
    bash "$HERE/goodput.sh" -m "$MODEL" ${PEER:+-s "$PEER"} --tern "$TERN" -t "$T" -np "$b" --rates 1 \
        --closed "$b,$((PER * b))" --prompt-len "$PLEN" --output-len "$OLEN" --ttft-slo 600000 --tpot-slo 600000 \
        --out "$OUT/b$b" >/dev/null || exit $?
    for srv in tern llama-server; do
        [ -f "$OUT/b$b/$srv-1.json" ] || continue
        jq -r --arg b "$b" --arg s "$srv" '[$b, $s, (.sent // 0), (.completed // 0), ((.output_tokens // 0) / (.wall_s // 1)),
            (((.prompt_tokens // 0) + (.output_tokens // 0)) / (.wall_s // 1)), (.ttft_ms.p50 // 0), (.tpot_ms.p50 // 0)] | @tsv' \
            "$OUT/b$b/$srv-1.json" >>"$OUT/batch.tsv"
        tail -n 1 "$OUT/batch.tsv" >&2
    done
done
{
    echo "| batch | requests | tern out tok/s | llama-server out tok/s | tern / llama-server | tern prompt+out tok/s | llama-server prompt+out tok/s | tern TTFT / TPOT p50 ms | llama-server TTFT / TPOT p50 ms |"
    echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    awk -F'\t' 'NR > 1 { k = $1; if ($2 == "llama-server") { p[k] = $5; pa[k] = $6; pt[k] = $7; pp[k] = $8 } else { n[k] = $3; t[k] = $5; ta[k] = $6; tt[k] = $7; tp[k] = $8 }
        if (!(k in seen)) { seen[k] = 1; order[m++] = k } }
        END { for (i = 0; i < m; i++) { k = order[i]
            printf "| %s | %d | %.1f | %s | %s | %.1f | %s | %.0f / %.1f | %s |\n", k, n[k], t[k], (k in p) ? sprintf("%.1f", p[k]) : "-",
                (k in p && p[k] > 0) ? sprintf("%.2fx", t[k] / p[k]) : "-", ta[k], (k in pa) ? sprintf("%.1f", pa[k]) : "-",
                tt[k], tp[k], (k in pt) ? sprintf("%.0f / %.1f", pt[k], pp[k]) : "-" } }' "$OUT/batch.tsv"
} >"$OUT/batch.md"
cat "$OUT/batch.md"
