#!/usr/bin/env bash
# Writes the training text of tern's default model: the King James Bible from Debian's
# bible-kjv package (public domain), verse labels stripped, one verse per line, a blank line
# between chapters (so each chapter is one training paragraph starting with <s>).
# usage: scripts/make-kjv-corpus.sh OUT.txt
set -euo pipefail
out=${1:?usage: $0 OUT.txt}
command -v bible >/dev/null || { echo "needs the bible-kjv package (apt-get install bible-kjv)" >&2; exit 66; }
bible -f Gen1:1-Rev22:21 | LC_ALL=C awk '
  match($0, /^[0-9]?[A-Za-z]+[0-9]+:[0-9]+ /) {
    label = substr($0, 1, RLENGTH - 1); text = substr($0, RLENGTH + 1)
    split(label, p, ":"); chap = p[1]
    if (NR > 1 && chap != last) printf "\n"
    last = chap; print text; next }
  { print }' > "$out.tmp"
mv "$out.tmp" "$out"
