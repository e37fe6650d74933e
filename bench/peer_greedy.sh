#!/usr/bin/env bash
# Greedy agreement of tern and llama.cpp on the same synthetic files (issue #18): for each family
# and type, both engines decode STEPS tokens greedily from the same prompt ids; the table gives the
# steps that match, the first differing step with both engines' top-1 minus top-2 logit margins
# there, and a verdict.
#
# usage: bench/peer_greedy.sh LLAMA_BUILD DRIVER [FAMILY...]
#   LLAMA_BUILD  a llama.cpp build directory you made yourself, outside this repo (this script
#                never builds llama.cpp); with LLAMA_BUILD/bin/llama-quantize, every quantized file
#                is also made by llama-quantize from the same source and compared byte for byte
#   DRIVER       a greedy driver linked with that llama.cpp: `DRIVER MODEL N_STEPS "IDS" TEXT THREADS`
#                printing "# llama_tokenize IDS" (its own tokenization of TEXT), "prompt IDS" and one
#                line "STEP ID MARGIN RMS" per step, as `tern generate --dump-margins` writes them
#   FAMILY       default: llama qwen2 qwen3 smollm3 gemma3 (any family `tern synth --arch` knows)
# Env: TERN (default build/tern), WORK (where the files go; default a temp dir removed at exit),
#      TYPES (default "F32 F16 Q8_0 Q4_K_M"), PRESETS (default "tiny"; e.g. "tiny small"),
#      SRC (F32: the type `tern synth` writes, the others are quantized from it; F16 for 1b files),
#      STEPS (64), THREADS (1), PROMPT ("once upon a time"), SYNTH_ARGS (more `tern synth` flags, e.g.
#      "--experts 8 --top-k 2" for Mixtral-style llama files). Files already in WORK are reused.
#
# Verdict. Both engines read the same weights, so weight quantization is no difference between
# them; what differs is how activations are rounded on the way into each type's dot products and
# the order of summation. eps(type) is the relative rounding step of those activations: F32 and F16
# 2^-11 (the f16 KV cache of both engines; f16 activations for F16 weights, which llama.cpp built
# for an AVX512-FP16 CPU also accumulates in f16), Q8_0 and Q4_K_M 1/254 (8-bit activation blocks:
# half a step of max/127). Each layer rounds about four vectors on their way into a product (the
# attention and FFN inputs, the attention output with its f16 keys and values, the FFN hidden
# state, which llama.cpp's GELU also passes through an f16 table), so a logit may differ between
# the engines by delta = K * eps * rms(logits) with K = 4 * n_layer (the errors adding up, not
# cancelling). The column "max abs(dm) while matching" is the largest difference of the two
# engines' margins while their tokens agreed, in units of delta: below 1 shows delta bounds what
# was seen. At the first differing step each engine ranks the other's token below its own; with
# logits within delta of each other both margins are then below 2 * delta: "near-tie" when both
# are, MISMATCH (a bug on one side) when either is larger.
set -euo pipefail
if [ $# -lt 2 ]; then sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 64; fi
LB=$1 DRIVER=$2; shift 2
FAMILIES=${*:-llama qwen2 qwen3 smollm3 gemma3}
TERN=${TERN:-$(dirname "$0")/../build/tern}
TYPES=${TYPES:-F32 F16 Q8_0 Q4_K_M} PRESETS=${PRESETS:-tiny}
SRC=${SRC:-F32} STEPS=${STEPS:-64} THREADS=${THREADS:-1} PROMPT=${PROMPT:-once upon a time}
[ -x "$DRIVER" ] || { echo "peer_greedy: driver '$DRIVER' is not an executable" >&2; exit 64; }
[ -x "$TERN" ] || { echo "peer_greedy: tern binary '$TERN' not found (set TERN)" >&2; exit 64; }
LQ=$LB/bin/llama-quantize
[ -x "$LQ" ] || LQ=
if [ -z "${WORK:-}" ]; then WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT; fi
mkdir -p "$WORK"

printf '| family | preset | type | prompt ids | llama-quantize | steps matching | first differing step | margin there (tern / llama.cpp) | 2 delta | max abs(dm) while matching | verdict |\n'
printf '|---|---|---|---|---|---:|---:|---|---:|---:|---|\n'
for fam in $FAMILIES; do
  for preset in $PRESETS; do
    src=$WORK/$fam-$preset-$SRC.gguf
    [ -s "$src" ] || "$TERN" synth --arch "$fam" --preset "$preset" --type "${SRC,,}" ${SYNTH_ARGS:-} -o "$src" 2>/dev/null
    for type in $TYPES; do
      f=$WORK/$fam-$preset-$type.gguf same=-
      if [ "$type" != "$SRC" ]; then
        [ -s "$f" ] || "$TERN" quantize "$src" "$f" "$type" 2 >/dev/null 2>&1
        if [ -n "$LQ" ]; then
          "$LQ" "$src" "$WORK/llama-$type.gguf" "$type" 2 >/dev/null 2>&1 &&
            { cmp -s "$f" "$WORK/llama-$type.gguf" && same=identical || same=DIFFERS; } || same="llama-quantize failed"
          rm -f "$WORK/llama-$type.gguf"
        fi
      fi
      # the context: the steps and a short prompt, as small as the driver's (prompt + steps + 1), so
      # both engines pick the same LongRoPE factor set (phi3: long above original_context_length)
      "$TERN" generate -m "$f" -p "$PROMPT" -n "$STEPS" -c $((STEPS + 33)) --temp 0 --ignore-eos -t "$THREADS" --no-display-prompt \
        --dump-margins "$WORK/tern.txt" >/dev/null 2>"$WORK/tern.err" || { echo "peer_greedy: tern failed on $f:" >&2; cat "$WORK/tern.err" >&2; exit 1; }
      ids=$(sed -n 's/^prompt //p' "$WORK/tern.txt")
      if ! "$DRIVER" "$f" "$STEPS" "$ids" "$PROMPT" "$THREADS" >"$WORK/llama.txt" 2>"$WORK/llama.err"; then
        printf '| %s | %s | %s | | %s | | | | | | llama.cpp cannot run it: %s |\n' "$fam" "$preset" "$type" "$same" \
          "$(grep -v '^$' "$WORK/llama.err" | tail -1 | tr '|' '/')"
        continue
      fi
      nl=$("$TERN" info "$f" 2>/dev/null | sed -n 's/.*| n_layer \([0-9]*\).*/\1/p' | head -1)
      python3 - "$WORK/tern.txt" "$WORK/llama.txt" "$type" "$fam" "$preset" "$same" "$STEPS" "$nl" <<'PY'
import sys
tf, lf, typ, fam, preset, same, steps, nl = sys.argv[1:9]
steps = int(steps)
def load(p):
    rows, prompt, tok = [], None, None
    for l in open(p):
        w = l.split()
        if l.startswith("# llama_tokenize"): tok = w[2:]
        elif l.startswith("#"): continue
        elif w and w[0] == "prompt": prompt = w[1:]
        elif len(w) == 4: rows.append((int(w[1]), float(w[2]), float(w[3])))
    return rows, prompt, tok
t, tp, _ = load(tf)
l, lp, ltok = load(lf)
assert len(t) == steps and len(l) == steps and tp == lp, "dumps incomplete or prompts differ"
ids = "same" if ltok == tp else "DIFFER (llama.cpp: %s)" % " ".join(ltok or [])
eps = {"F32": 2.0 ** -11, "F16": 2.0 ** -11}.get(typ, 1.0 / 254)
K = 4 * int(nl)
first = next((i for i in range(steps) if t[i][0] != l[i][0]), None)
n_match = steps if first is None else first
delta = lambda i: K * eps * max(t[i][2], l[i][2])
worst = max((abs(t[i][1] - l[i][1]) / delta(i) for i in range(n_match)), default=0.0)
if first is None:
    print(f"| {fam} | {preset} | {typ} | {ids} | {same} | {steps} | - | - | - | {worst:.2f} | identical |")
else:
    mt, ml, b = t[first][1], l[first][1], 2 * delta(first)
    verdict = "near-tie" if max(mt, ml) < b else "MISMATCH"
    print(f"| {fam} | {preset} | {typ} | {ids} | {same} | {n_match} | {first} | {mt:.4g} / {ml:.4g} | {b:.3g} | {worst:.2f} | {verdict} |")
PY
    done
  done
done
