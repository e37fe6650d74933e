#!/usr/bin/env bash
# `tern generate --spec ngram` and `--draft` give the text plain generate gives (greedy and sampled
# with a seed), say how much they drafted and accepted, and refuse bad flags and a draft model of
# another vocabulary. usage: spec_cli.sh TERN DEFAULT_MODEL TMPDIR
set -u
TERN=$1 MODEL=$2 TMP=$3/spec.$$
mkdir -p "$TMP"
trap 'rm -rf "$TMP"' EXIT
pass=0 fail=0
ok() { pass=$((pass+1)); echo "ok: $1"; }
bad() { fail=$((fail+1)); echo "FAIL: $1"; }
P="And God said unto Moses, I AM THAT I AM: and he said, Thus shalt thou say unto the children of Israel, I AM hath sent me unto you. And God said moreover unto Moses, Thus shalt thou say unto the children of Israel"
gen() { # gen NAME ARGS... : stdout to $TMP/NAME.out, stderr to $TMP/NAME.err
  local name=$1; shift
  "$TERN" generate -m "$MODEL" -p "$P" -t 1 "$@" >"$TMP/$name.out" 2>"$TMP/$name.err" || bad "$name: exit $?"
}
for mode in greedy sampled; do
  if [ $mode = greedy ]; then S=(--temp 0 -n 64); else S=(--temp 0.8 --seed 11 -n 64 --ignore-eos); fi
  gen "$mode-plain" "${S[@]}"
  gen "$mode-ngram" "${S[@]}" --spec ngram
  gen "$mode-draft" "${S[@]}" --draft "$MODEL" --draft-max 4
  gen "$mode-both" "${S[@]}" --spec ngram --draft "$MODEL" --draft-min 2 --spec-ngram 2
  gen "$mode-pmin" "${S[@]}" --draft "$MODEL" --draft-max 4 --draft-p-min 0.9
  for v in ngram draft both pmin; do
    if cmp -s "$TMP/$mode-plain.out" "$TMP/$mode-$v.out"; then ok "$mode --$v: the text of plain generate"
    else bad "$mode --$v: text differs from plain generate"; diff "$TMP/$mode-plain.out" "$TMP/$mode-$v.out" | head -4; fi
    grep -q "tern: speculation: .* drafted, .* accepted" "$TMP/$mode-$v.err" && ok "$mode --$v: speculation line" || bad "$mode --$v: no speculation line"
  done
done
# greedy with the model as its own draft: every draft is the target's own choice
acc=$(sed -n 's/.*drafted, \([0-9]*\) accepted (\([0-9.]*\)%).*/\2/p' "$TMP/greedy-draft.err")
awk -v a="${acc:-0}" 'BEGIN { exit !(a >= 90) }' && ok "greedy self-draft accepts ${acc}% (>= 90%)" || bad "greedy self-draft accepts only ${acc:-?}%"
# --draft-p-min 0.9: the draft stops where it is unsure, so it drafts fewer tokens than without
dr() { sed -n 's/.*passes, \([0-9]*\) drafted.*/\1/p' "$TMP/$1.err"; }
[ -n "$(dr greedy-pmin)" ] && [ "$(dr greedy-pmin)" -lt "$(dr greedy-draft)" ] && ok "--draft-p-min 0.9 drafts fewer ($(dr greedy-pmin) < $(dr greedy-draft))" \
  || bad "--draft-p-min 0.9 drafted $(dr greedy-pmin), without $(dr greedy-draft)"
# the n-gram drafts of a repetitive prompt are mostly taken under greedy decoding
acc=$(sed -n 's/.*drafted, \([0-9]*\) accepted (\([0-9.]*\)%).*/\2/p' "$TMP/greedy-ngram.err")
awk -v a="${acc:-0}" 'BEGIN { exit !(a >= 30) }' && ok "greedy n-gram acceptance ${acc}% (>= 30%)" || bad "greedy n-gram acceptance ${acc:-?}%"
# per-channel K (-ctk tqc2): rollbacks into the open group and across a group's end stay exact —
# a draft that disagrees (the model requantized to tq2: some of its drafts rejected) and n-grams
"$TERN" quantize --allow-requantize "$MODEL" "$TMP/draft-tq2.gguf" tq2 >/dev/null 2>&1 || bad "quantize the tq2 draft"
P2="And God said, Let there be light: and there was light. And God saw the light, that it was good"
gen kc-plain -p "$P2" --temp 0 -n 150 --ignore-eos -ctk tqc2 -ctv q8_0
gen kc-draft -p "$P2" --temp 0 -n 150 --ignore-eos -ctk tqc2 -ctv q8_0 --draft "$TMP/draft-tq2.gguf" --draft-max 7
gen kc-ngram -p "$P2" --temp 0 -n 150 --ignore-eos -ctk tqc2 -ctv q8_0 --spec ngram
for v in draft ngram; do
  cmp -s "$TMP/kc-plain.out" "$TMP/kc-$v.out" && ok "-ctk tqc2 --$v: the text of plain generate" || bad "-ctk tqc2 --$v: text differs"
done
da=$(sed -n 's/.*passes, \([0-9]*\) drafted, \([0-9]*\) accepted.*/\1 \2/p' "$TMP/kc-draft.err")
set -- $da
[ -n "${2:-}" ] && [ "$2" -lt "$1" ] && ok "-ctk tqc2 tq2 draft: $2 of $1 drafts accepted (rollbacks happened)" || bad "-ctk tqc2 tq2 draft: '${da}'"
# bad input
expect() { local want=$1 what=$2; shift 2; "$TERN" generate -m "$MODEL" -p hi -n 2 "$@" >/dev/null 2>"$TMP/err"; local got=$?
  [ "$got" = "$want" ] && ok "$what (exit $got)" || { bad "$what: exit $got, want $want"; head -3 "$TMP/err"; }; }
expect 64 "--spec with an unknown mode" --spec magic
expect 64 "--draft-max 0" --spec ngram --draft-max 0
expect 64 "--draft-p-min outside 0..1" --draft "$MODEL" --draft-p-min 1.5
expect 66 "--draft missing file" --draft "$TMP/none.gguf"
"$TERN" synth -o "$TMP/other.gguf" --preset tiny --type q8_0 >/dev/null 2>&1
expect 65 "--draft of another vocabulary" --draft "$TMP/other.gguf"
grep -q "vocabulary" "$TMP/err" && ok "the vocabulary error says so" || bad "no vocabulary in: $(head -1 "$TMP/err")"
# tern bench --spec / --draft: both runs give the same tokens; the counts hold together; the model
# as its own draft has its drafts accepted; the prompt file is read; bad flags are refused
printf '%s\n' "$P" >"$TMP/prompt.txt"
for v in "--spec ngram" "--draft $MODEL --draft-max 4"; do
  # shellcheck disable=SC2086
  if "$TERN" bench -m "$MODEL" $v --spec-prompt "$TMP/prompt.txt" -n 48 -r 1 -t 1 -o json >"$TMP/bench.json" 2>"$TMP/bench.err"; then
    python3 - "$TMP/bench.json" "$v" <<'PY' && ok "bench $v: same tokens, counts consistent" || bad "bench $v: $(cat "$TMP/bench.json" | head -3)"
import json, sys
r = json.load(open(sys.argv[1]))[0]
assert r["same_tokens"] is True, "the speculative run gave other tokens"
assert 0 <= r["accepted"] <= r["drafted"] and r["passes"] >= 1
# tokens emitted per pass: accepted + 1 each; 1 warm-up + 1 repetition of 48 tokens
assert abs(r["tokens_per_pass"] - (r["accepted"] + r["passes"]) / r["passes"]) < 1e-3
assert r["plain_ts"] > 0 and r["spec_ts"] > 0 and abs(r["speedup"] - r["spec_ts"] / r["plain_ts"]) < 1e-3
if "--draft" in sys.argv[2]: assert r["acceptance"] >= 0.9, r["acceptance"]
PY
  else bad "bench $v: exit $?: $(head -2 "$TMP/bench.err")"; fi
done
"$TERN" bench -m "$MODEL" --spec-prompt "$TMP/prompt.txt" >/dev/null 2>"$TMP/err"; [ $? = 64 ] && ok "bench --spec-prompt without --spec: 64" || bad "bench --spec-prompt without --spec"
"$TERN" bench -m "$MODEL" --spec ngram --spec-prompt "$TMP/none.txt" >/dev/null 2>"$TMP/err"; [ $? = 66 ] && ok "bench --spec-prompt missing file: 66" || bad "bench --spec-prompt missing file: $(head -1 "$TMP/err")"
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
