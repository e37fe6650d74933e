#!/usr/bin/env bash
# CLI behaviour: exit codes of robustness.md §4.3 and basic outputs of the tern binary.
# usage: cli_test.sh TERN MODEL TMPDIR
set -u
TERN=$1 MODEL=$2 TMP=$3/cli.$$
mkdir -p "$TMP"
trap 'rm -rf "$TMP"' EXIT
pass=0 fail=0
expect() { # expect CODE DESCRIPTION -- command...
  local want=$1 what=$2; shift 3
  "$@" >"$TMP/out" 2>"$TMP/err"; local got=$?
  if [ "$got" = "$want" ]; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: $what: exit $got, want $want"; sed 's/^/  stderr: /' "$TMP/err" | head -5; fi
}
expect_err() { # expect_err PATTERN DESCRIPTION : stderr of the last command matches
  if grep -q -- "$1" "$TMP/err"; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: $2: stderr lacks '$1'"; sed 's/^/  stderr: /' "$TMP/err" | head -5; fi
}

expect 0 "help" -- "$TERN" --help
expect 64 "no command" -- "$TERN"
expect 64 "unknown command" -- "$TERN" frobnicate
expect 0 "info without a file" -- "$TERN" info
grep -q "isa:" "$TMP/out" && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL: tern info prints no isa line"; }
# --device: an unknown device is a usage error; without a GPU (tern info says why on its cuda
# line) --device cuda fails at the context with an error naming cuda (65), for every command
expect 64 "unknown --device" -- "$TERN" generate -m "$MODEL" -p hi -n 1 --device tpu
expect_err "tpu" "unknown --device names it"
expect 64 "-ngl without a number" -- "$TERN" bench -m "$MODEL" --device cuda -ngl many
if "$TERN" info | grep -q "^cuda: "; then
  for cmd in "generate -p hi -n 1" "bench -p 8 -n 2 -r 1 --no-roofline" "perplexity -f $MODEL -c 16 --chunks 1"; do
    # shellcheck disable=SC2086
    expect 65 "$cmd --device cuda without a GPU" -- "$TERN" ${cmd%% *} -m "$MODEL" ${cmd#* } --device cuda
    expect_err "cuda: no usable device\|built without CUDA" "$cmd --device cuda says why (no GPU, or no CUDA in this build)"
  done
fi
expect 66 "missing model" -- "$TERN" generate -m "$TMP/missing.gguf" -p hi -n 1
expect_err "missing.gguf" "missing model names the path"
expect 66 "directory as model" -- "$TERN" generate -m "$TMP" -p hi -n 1
# a text file that is missing: one error line naming it (not a second, empty one), exit 66
expect_one_err() { # expect_one_err PATTERN DESCRIPTION : stderr has exactly one error line, and it matches
  if [ "$(grep -c "tern: error" "$TMP/err")" = 1 ] && grep "tern: error" "$TMP/err" | grep -q -- "$1"; then pass=$((pass+1));
  else fail=$((fail+1)); echo "FAIL: $2: want one error line matching '$1'"; sed 's/^/  stderr: /' "$TMP/err" | head -5; fi
}
expect 66 "missing prompt file" -- "$TERN" generate -m "$MODEL" -f "$TMP/nofile.txt" -n 1
expect_one_err "cannot open '.*nofile.txt'" "missing prompt file: one error naming it"
expect 66 "missing tokenize file" -- "$TERN" tokenize -m "$MODEL" -f "$TMP/nofile.txt"
expect_one_err "cannot open '.*nofile.txt'" "missing tokenize file: one error naming it"
expect 66 "missing perplexity text" -- "$TERN" perplexity -m "$MODEL" -f "$TMP/nofile.txt"
expect_one_err "cannot open '.*nofile.txt'" "missing perplexity text: one error naming it"
expect 66 "missing --calib text" -- "$TERN" quantize --allow-requantize --target-bpw 5 --calib "$TMP/nofile.txt" "$MODEL" "$TMP/q.gguf" tq4
expect_one_err "cannot open '.*nofile.txt'" "missing --calib text: one error naming it"
[ ! -e "$TMP/q.gguf" ] && [ -z "$(ls "$TMP" | grep 'q.gguf.tmp')" ] && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL: a failed quantize left a file"; }
expect 74 "directory as prompt file" -- "$TERN" generate -m "$MODEL" -f "$TMP" -n 1
expect_one_err "read error on" "directory as prompt file: one error"
# an output that is one of the run's inputs is refused (64), and the input is left as it was
cp "$MODEL" "$TMP/in.gguf"
for i in $(seq 40); do echo "the cat sat on the mat and the dog sat on the log by the door"; done > "$TMP/text.txt"
cp "$TMP/text.txt" "$TMP/text0.txt"
expect 64 "imatrix -o over the model" -- "$TERN" imatrix -m "$TMP/in.gguf" -f "$TMP/text.txt" -c 16 -o "$TMP/in.gguf"
expect_one_err "is an input of this run" "imatrix -o over the model: named"
expect 64 "imatrix -o over the text" -- "$TERN" imatrix -m "$TMP/in.gguf" -f "$TMP/text.txt" -c 16 -o "$TMP/./text.txt"
expect 64 "quantize output over its --imatrix" -- "$TERN" quantize --allow-requantize --imatrix "$TMP/text.txt" "$TMP/in.gguf" "$TMP/text.txt" tq3
expect 64 "tokenizer-train -o over its text" -- "$TERN" tokenizer-train --vocab 300 -o "$TMP/text.txt" "$TMP/text.txt"
expect 64 "train -o over its data" -- "$TERN" train --data "$TMP/text.txt" -o "$TMP/text.txt" --steps 1
expect 64 "train -o over its --init" -- "$TERN" train --data "$TMP/text.txt" --init "$TMP/in.gguf" -o "$TMP/in.gguf" --steps 1
expect 64 "perplexity base over the model" -- "$TERN" perplexity -m "$TMP/in.gguf" -f "$TMP/text.txt" -c 16 --kl-divergence-base "$TMP/in.gguf"
cmp -s "$MODEL" "$TMP/in.gguf" && cmp -s "$TMP/text.txt" "$TMP/text0.txt" && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL: an input was overwritten"; }
expect 64 "quantize without TYPE" -- "$TERN" quantize "$MODEL" "$TMP/x.gguf"
expect_one_err "missing TYPE" "quantize without TYPE: says what is missing"
expect 64 "quantize --imatrix without a value" -- "$TERN" quantize "$MODEL" "$TMP/x.gguf" tq3 --imatrix
expect_one_err "\-\-imatrix needs a value" "quantize --imatrix without a value: named"
expect 64 "negative -n" -- "$TERN" generate -m "$MODEL" -n -5
expect 64 "zero threads" -- "$TERN" generate -m "$MODEL" -t 0
expect_err "\-t" "bad -t names the flag"
expect 64 "huge context" -- "$TERN" generate -m "$MODEL" -c 1e9
expect 64 "nan temperature" -- "$TERN" generate -m "$MODEL" --temp nan
expect 64 "unknown flag" -- "$TERN" generate -m "$MODEL" --bogus
printf 'GGUF\x03\x00\x00\x00' > "$TMP/trunc.gguf"
expect 65 "truncated gguf" -- "$TERN" generate -m "$TMP/trunc.gguf" -p hi -n 1
expect_err "tern: error" "error line format"
head -c 100 /dev/urandom > "$TMP/junk.gguf"
expect 65 "junk file" -- "$TERN" info "$TMP/junk.gguf"
: > "$TMP/empty.gguf"
expect 65 "empty file" -- "$TERN" generate -m "$TMP/empty.gguf" -p hi -n 1

# model families (src/model/arch/): a synthetic qwen3 runs; tern info shows its block; a llama
# file relabelled qwen3 lacks qwen3's q/k norms: one error naming the tensor and its shape, exit 65
expect 0 "synth qwen3" -- "$TERN" synth --arch qwen3 --preset tiny --type q8_0 -o "$TMP/q3.gguf"
expect 0 "generate qwen3" -- "$TERN" generate -m "$TMP/q3.gguf" -p "once upon a time" -n 8 --temp 0 -t 2
expect 0 "info qwen3" -- "$TERN" info "$TMP/q3.gguf"
grep -q "block: qwen3 | heads 4 / kv 2 of 32 (q rows 128).*q/k norm" "$TMP/out" && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL: tern info lacks the qwen3 block line"; }
expect 0 "info --arch qwen3" -- "$TERN" info --arch qwen3
grep -q "blk.N.attn_q_norm.weight *required *\[head_dim\]" "$TMP/out" && grep -q "blk.N.attn_output.weight *required *\[n_head\*head_dim, n_embd\]" "$TMP/out" && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL: tern info --arch qwen3 lacks its tensors"; }
expect 64 "info --arch unknown" -- "$TERN" info --arch gptx
expect 0 "synth gemma3" -- "$TERN" synth --arch gemma3 --preset tiny --type q4_0 -o "$TMP/g3.gguf"
expect 0 "generate gemma3 past its window" -- "$TERN" generate -m "$TMP/g3.gguf" -p "once upon a time" -n 12 --temp 0 -t 2
expect 0 "info gemma3" -- "$TERN" info "$TMP/g3.gguf"
grep -q "sliding window: 4 positions" "$TMP/out" && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL: tern info lacks gemma3's window"; }
expect 0 "synth gemma2" -- "$TERN" synth --arch gemma2 --preset tiny --type q8_0 -o "$TMP/g2.gguf"
expect 0 "generate gemma2 past its window" -- "$TERN" generate -m "$TMP/g2.gguf" -p "once upon a time" -n 12 --temp 0 -t 2
expect 0 "info gemma2" -- "$TERN" info "$TMP/g2.gguf"
grep -q "sliding window: 4 positions on layers il % 2 < 1" "$TMP/out" && grep -q "attention score soft-capping at 50" "$TMP/out" && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL: tern info lacks gemma2's window or caps"; }
# gemma2's attention cap 50.0f (00 00 48 42 after the key and its f32 type) made -50: exit 65 naming the key
perl -0777 -pe 's/(attn_logit_softcapping\x06\x00\x00\x00)\x00\x00\x48\x42/${1}\x00\x00\x48\xc2/s' "$TMP/g2.gguf" > "$TMP/g2neg.gguf"
expect 65 "gemma2 with a negative attention cap" -- "$TERN" generate -m "$TMP/g2neg.gguf" -p hi -n 1
expect_one_err "key 'gemma2.attn_logit_softcapping' = -50 must be a number > 0" "negative cap: the key named"
expect 0 "synth phi3" -- "$TERN" synth --arch phi3 --preset tiny --type q4_0 -o "$TMP/p3.gguf"
expect 0 "generate phi3 (long factors: context 128 > 32)" -- "$TERN" generate -m "$TMP/p3.gguf" -p "once upon a time" -n 8 --temp 0 -t 2
expect 0 "generate phi3 (short factors: context 32)" -- "$TERN" generate -m "$TMP/p3.gguf" -p "once upon a time" -n 8 --temp 0 -t 2 -c 32
expect 0 "info phi3" -- "$TERN" info "$TMP/p3.gguf"
grep -q "rope neox, 12 dims" "$TMP/out" && grep -q "LongRoPE: long factors in a context > 32 positions" "$TMP/out" && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL: tern info lacks phi3's partial rotary or LongRoPE"; }
expect 0 "info --arch phi3" -- "$TERN" info --arch phi3
grep -q "blk.N.attn_qkv.weight *required" "$TMP/out" && grep -q "2\*n_ff (gate|up)" "$TMP/out" && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL: tern info --arch phi3 lacks its fused tensors"; }
expect 64 "synth unknown arch" -- "$TERN" synth --arch gptx --preset tiny -o "$TMP/x.gguf"
expect_err "qwen3" "synth unknown arch lists the families"
perl -0777 -pe 's/llama\./qwen3./g; s/(general\.architecture.{12})llama/${1}qwen3/s' "$MODEL" > "$TMP/relabel.gguf"
expect 65 "llama file relabelled qwen3" -- "$TERN" generate -m "$TMP/relabel.gguf" -p hi -n 1
expect_one_err "missing tensor 'blk.0.attn_q_norm.weight' (qwen3 expects shape \[16\])" "relabelled file: the missing q norm named"
expect 65 "info of the relabelled file" -- "$TERN" info "$TMP/relabel.gguf"
expect 65 "train --init from a gemma3 file" -- "$TERN" train --data "$TMP/text.txt" --init "$TMP/g3.gguf" -o "$TMP/tr.gguf" --steps 1
expect_one_err "architecture gemma3, which training does not run (it trains llama, qwen2, qwen3)" "train --init gemma3: says why"

# generation: greedy is deterministic; sampled output repeats with the same seed
expect 0 "greedy generation" -- "$TERN" generate -m "$MODEL" -p "once upon a time" -n 16 --temp 0 -t 2
cp "$TMP/out" "$TMP/greedy1"
grep -q "tok/s" "$TMP/err" && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL: no timings on stderr"; }
expect 0 "greedy generation again" -- "$TERN" generate -m "$MODEL" -p "once upon a time" -n 16 --temp 0 -t 1
cmp -s "$TMP/out" "$TMP/greedy1" && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL: greedy output differs between runs/thread counts"; }
# --dump-margins: the greedy tokens it lists are the ones printed; only with --temp 0, not with
# speculation; the file appears whole or not at all (its values: tests/model/test_dump_margins.c)
expect 0 "greedy generation with --dump-margins" -- "$TERN" generate -m "$MODEL" -p "once upon a time" -n 16 --temp 0 -t 2 --dump-margins "$TMP/dm.txt"
cmp -s "$TMP/out" "$TMP/greedy1" && [ "$(grep -c '^[0-9]' "$TMP/dm.txt")" = 16 ] && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL: --dump-margins changed the output or lacks 16 steps"; }
expect 64 "--dump-margins when sampling" -- "$TERN" generate -m "$MODEL" -p hi -n 2 --dump-margins "$TMP/dm2.txt"
expect_err "needs --temp 0" "--dump-margins when sampling says why"
expect 64 "--dump-margins with --spec" -- "$TERN" generate -m "$MODEL" -p hi -n 2 --temp 0 --spec ngram --dump-margins "$TMP/dm2.txt"
expect 64 "--dump-margins over the model" -- "$TERN" generate -m "$MODEL" -p hi -n 2 --temp 0 --dump-margins "$MODEL"
expect 74 "--dump-margins into a directory" -- "$TERN" generate -m "$MODEL" -p hi -n 2 --temp 0 --dump-margins "$TMP"
[ ! -e "$TMP/dm2.txt" ] && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL: a refused --dump-margins left a file"; }
expect 0 "seeded sampling" -- "$TERN" generate -m "$MODEL" -p "the" -n 16 --temp 1.0 -s 42
cp "$TMP/out" "$TMP/s1"
expect 0 "seeded sampling again" -- "$TERN" generate -m "$MODEL" -p "the" -n 16 --temp 1.0 -s 42
cmp -s "$TMP/out" "$TMP/s1" && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL: same seed gave different text"; }
expect 0 "tokenize" -- "$TERN" tokenize -m "$MODEL" -p "once upon a time"
grep -q "^ *1 -> .<s>.$" "$TMP/out" && grep -q "detokenized text matches" "$TMP/err" && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL: tokenize output lacks BOS or the round trip failed"; cat "$TMP/err"; }
expect 0 "info on a model" -- "$TERN" info "$MODEL"
grep -q "blk.0.attn_q.weight" "$TMP/out" && grep -q "bits per weight" "$TMP/out" && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL: info lacks tensor table"; }
expect 0 "bench json" -- "$TERN" bench -m "$MODEL" -p 16 -n 4 -r 1 -o json --no-roofline
grep -q '"avg_ts"' "$TMP/out" && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL: bench json lacks avg_ts"; }
expect 64 "bench -r 0" -- "$TERN" bench -m "$MODEL" -r 0
expect 0 "bench -d (tests after a filled cache)" -- "$TERN" bench -m "$MODEL" -d 24 -p 8 -n 4 -r 1 -o json --no-roofline
[ "$(grep -c '"n_depth": 24,' "$TMP/out")" = 2 ] && grep -q '"n_prompt": 8,' "$TMP/out" && grep -q '"n_gen": 4,' "$TMP/out" && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL: bench -d 24 rows lack n_depth 24"; cat "$TMP/out"; }
expect 0 "bench -d md" -- "$TERN" bench -m "$MODEL" -d 24 -p 8 -n 4 -r 1 --no-roofline
grep -q "pp8 @ d24" "$TMP/out" && grep -q "tg4 @ d24" "$TMP/out" && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL: bench -d table lacks the @ d24 tests"; }
expect 64 "bench -d -1" -- "$TERN" bench -m "$MODEL" -d -1
expect_err "-d needs a number" "bench -d -1 says why"
# SIGPIPE: reader closes early; tern exits quietly (0 or 141), no error spam
"$TERN" generate -m "$MODEL" -p "the" -n 64 --temp 0 2>"$TMP/err" | head -c1 >/dev/null
rc=${PIPESTATUS[0]}
if [ "$rc" = 0 ] || [ "$rc" = 141 ]; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: SIGPIPE exit $rc"; fi

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
