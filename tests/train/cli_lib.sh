# Shared by the train/finetune CLI tests (sourced after TMP is set): ok/bad report a check (bad
# sets fail=1); expect CODE REGEX -- cmd...: the command's exit code and a stderr line matching
# REGEX (stdout in $TMP/out, stderr in $TMP/err).
fail=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fail=1; }
expect() {
  local code=$1 re=$2; shift 3
  "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  if [ "$rc" -ne "$code" ]; then bad "$* -> exit $rc (want $code): $(tail -2 "$TMP/err")"; return; fi
  if ! grep -Eq -- "$re" "$TMP/err"; then bad "$* -> stderr lacks /$re/: $(tail -2 "$TMP/err")"; return; fi
  ok "exit $code /$re/: $(grep -E -- "$re" "$TMP/err" | head -1)"
}
