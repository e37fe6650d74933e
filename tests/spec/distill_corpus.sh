#!/usr/bin/env bash
# scripts/distill_corpus.py: the target's continuations of corpus openings as training paragraphs —
# the right count, --exclude honoured, the greedy ones equal to `tern generate --temp 0` of their
# opening, deterministic, readable by `tern train --init`; a corpus with nothing usable is refused.
# usage: distill_corpus.sh TERN DEFAULT_MODEL SCRIPT TMPDIR
set -u
TERN=$1 MODEL=$2 SCRIPT=$3 TMP=$4/distill.$$
command -v python3 >/dev/null || { echo "SKIP: python3 not installed"; exit 77; }
mkdir -p "$TMP"
trap 'rm -rf "$TMP"' EXIT
pass=0 fail=0
ok() { pass=$((pass+1)); echo "ok: $1"; }
bad() { fail=$((fail+1)); echo "FAIL: $1"; }
cat >"$TMP/corpus.txt" <<'TXT'
And God said, Let the waters under the heaven be gathered together unto one place
And God called the dry land Earth; and the gathering together of the waters called he Seas
Now the serpent was more subtil than any beast of the field which the LORD God had made
And the LORD God planted a garden eastward in Eden; and there he put the man whom he had formed
short line
And Adam knew Eve his wife; and she conceived, and bare Cain, and said, I have gotten a man
TXT
run() { python3 "$SCRIPT" --tern "$TERN" -m "$MODEL" --corpus "$TMP/corpus.txt" --prompts 6 -n 12 --jobs 2 \
  --exclude "And God" -o "$1"; }
run "$TMP/a.txt" 2>"$TMP/a.err" || bad "distill_corpus.py exit $?: $(tail -2 "$TMP/a.err")"
run "$TMP/b.txt" 2>/dev/null
n=$(awk 'BEGIN{RS=""} END{print NR}' "$TMP/a.txt")
[ "$n" = 6 ] && ok "6 paragraphs" || bad "$n paragraphs, want 6"
grep -q "^And God" "$TMP/a.txt" && bad "--exclude: a paragraph opens with 'And God'" || ok "--exclude leaves out 'And God' lines"
cmp -s "$TMP/a.txt" "$TMP/b.txt" && ok "deterministic" || bad "two runs differ"
[ -e "$TMP/a.txt.tmp" ] && bad "temporary file left" || ok "no temporary file left"
# the first paragraph (greedy) is tern generate --temp 0 of its opening: 3..10 words of a line
p1=$(awk 'BEGIN{RS=""} NR==1{print; exit}' "$TMP/a.txt")
found=0
while IFS= read -r line; do
  set -- $line
  for k in 3 4 5 6 7 8 9 10; do
    [ $k -lt $# ] || break
    open=$(echo "$line" | cut -d' ' -f1-$k)
    case "$p1" in "$open"*) ;; *) continue ;; esac
    g=$("$TERN" generate -m "$MODEL" -p "$open" -n 12 -t 1 --temp 0 2>/dev/null)
    [ "$g" = "$p1" ] && { found=1; break 2; }
  done
done <"$TMP/corpus.txt"
[ $found = 1 ] && ok "paragraph 1 = greedy tern generate of its opening" || bad "paragraph 1 is no greedy continuation of a corpus opening: $p1"
"$TERN" train --init "$MODEL" --data "$TMP/a.txt" --steps 2 --batch 2 --ctx 32 -t 2 -o "$TMP/d.gguf" >/dev/null 2>"$TMP/t.err" \
  && [ -s "$TMP/d.gguf" ] && ok "tern train --init reads it" || bad "tern train --init: $(tail -2 "$TMP/t.err")"
printf 'too short\nalso short\n' >"$TMP/empty.txt"
python3 "$SCRIPT" --tern "$TERN" -m "$MODEL" --corpus "$TMP/empty.txt" -o "$TMP/e.txt" 2>"$TMP/e.err"
[ $? -ne 0 ] && grep -q "6 words or more" "$TMP/e.err" && [ ! -e "$TMP/e.txt" ] && ok "a corpus without usable lines is refused" \
  || bad "corpus without usable lines: $(cat "$TMP/e.err")"
echo "distill_corpus: $pass passed, $fail failed"
[ $fail = 0 ]
