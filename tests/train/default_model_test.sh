#!/usr/bin/env bash
# default_model_test.sh TERN SRC TMP — runs the default-model recipe (scripts/train-default-model.sh,
# the exact command in models/README.md) for 3 steps and checks the output loads and generates;
# also checks the shipped models/tern-default.gguf runs with `tern generate` and no -m.
set -u
TERN=$1 SRC=$2 TMP=$3/default-model.$$
command -v bible >/dev/null || { echo "bible-kjv not installed: skipped"; exit 77; }
mkdir -p "$TMP"; trap 'rm -rf "$TMP"' EXIT
"$SRC/scripts/train-default-model.sh" "$TERN" "$TMP/short.gguf" 3 "$TMP/work" 2>"$TMP/err" || { tail -5 "$TMP/err"; exit 1; }
grep -E "^step 3/3" "$TMP/err" || { echo "no progress line"; exit 1; }
"$TERN" generate -m "$TMP/short.gguf" -p "In the beginning" -n 8 -s 1 >/dev/null 2>"$TMP/gerr" || { tail -2 "$TMP/gerr"; exit 1; }
if [ -f "$SRC/models/tern-default.gguf" ]; then
  out=$(TERN_DEFAULT_MODEL= "$TERN" generate -p "In the beginning God" -n 24 --temp 0 -s 1 2>"$TMP/gerr") || { tail -2 "$TMP/gerr"; exit 1; }
  echo "default model: $out"
  echo "$out" | grep -Eqi "the|and|of|lord|god" || { echo "default model output not recognisable"; exit 1; }
fi
echo ok
