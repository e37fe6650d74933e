# corpus.sh — sourced by the training shell tests: test_corpus FILE writes the small deterministic
# corpus they train on (2500 lines, a blank line every 10: 250 paragraphs).
test_corpus() {
  local i
  for i in $(seq 1 2500); do
    echo "And the $((i % 7)) men went up to the city of $((i % 13)), and they saw $((i % 5)) sheep by the water."
    [ $((i % 10)) -eq 0 ] && echo
  done >"$1"
}
