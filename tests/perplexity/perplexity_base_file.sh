#!/bin/bash
# tern perplexity's KL-divergence base file, on the default model (no shared folder needed):
# written atomically and refused over an input; read back only when its header and length agree
# (truncated, over-long, inconsistent headers, out-of-vocabulary tokens: exit 65 naming the file,
# never a crash); a one-chunk base works; a write error (/dev/full) is exit 74 and the device stays.
# usage: perplexity_base_file.sh TERN MODEL TMPDIR
set -u
TERN=$1 MODEL=$2 T=$3/ppl-base.$$
mkdir -p "$T"
trap 'rm -rf "$T"' EXIT
fail=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; sed 's/^/  stderr: /' "$T/err" | tail -3; fail=1; }
for i in $(seq 60); do echo "The quick brown fox jumps over the lazy dog while the cat sleeps by the warm fire."; done > "$T/text.txt"
PPL() { "$TERN" perplexity -m "$MODEL" "$@" -t 2 >"$T/out" 2>"$T/err"; }

PPL -f "$T/text.txt" -c 64 --kl-divergence-base "$T/base.kld"; rc=$?
[ $rc -eq 0 ] && [ -s "$T/base.kld" ] && [ -z "$(ls "$T" | grep 'base.kld.tmp')" ] && ok "base written, no temp left" || bad "base write exit $rc"
PPL --kl-divergence --kl-divergence-base "$T/base.kld"; rc=$?
# against its own (f16-rounded) logits: KLD ~ 0 (the top token may flip on f16 ties)
[ $rc -eq 0 ] && awk '/Mean KLD/{exit !($3 < 1e-4)}' "$T/out" && awk '/Same top token/{exit !($4 + 0 > 99)}' "$T/out" && ok "self comparison" || bad "self comparison exit $rc"

# the header's sizes: n_ctx at 8, n_vocab 12, n_chunk 16, n_tokens 20; tokens from 24
python3 - "$T" <<'PY'
import struct, sys
d = sys.argv[1]; b = open(d + "/base.kld", "rb").read()
open(d + "/trunc.kld", "wb").write(b[:100])
open(d + "/trunc2.kld", "wb").write(b[:len(b) // 2])
open(d + "/long.kld", "wb").write(b + b"xx")
def patch(name, off, fmt, v):
    c = bytearray(b); struct.pack_into(fmt, c, off, v); open(d + "/" + name, "wb").write(c)
patch("chunks.kld", 16, "<I", 1000)        # more chunks than the tokens hold
patch("ctx0.kld", 8, "<I", 0)
patch("ctxhuge.kld", 8, "<I", 0xFFFFFFFF)
patch("ntok.kld", 20, "<I", 0xFFFFFFF0)   # a huge token count
patch("tok.kld", 24 + 4 * 5, "<i", 999999)
patch("negtok.kld", 24 + 4 * 7, "<i", -3)
patch("vocab.kld", 12, "<I", 7)
open(d + "/magic.kld", "wb").write(b"NOTAKLD!" + b[8:])
PY
for f in trunc trunc2 long chunks ctx0 ctxhuge ntok tok negtok vocab magic; do
  PPL --kl-divergence --kl-divergence-base "$T/$f.kld"; rc=$?
  [ $rc -eq 65 ] && grep -q "tern: error: '.*$f.kld'" "$T/err" && ok "$f.kld -> 65 naming the file" || bad "$f.kld exit $rc"
done
PPL --kl-divergence --kl-divergence-base "$T/none.kld"; rc=$?
[ $rc -eq 66 ] && grep -q "none.kld" "$T/err" && ok "missing base -> 66" || bad "missing base exit $rc"

# one chunk: the base is valid and readable (the 2 x n_ctx text rule applies to text, not bases)
PPL -f "$T/text.txt" -c 64 --chunks 1 --kl-divergence-base "$T/one.kld" && PPL --kl-divergence --kl-divergence-base "$T/one.kld"; rc=$?
[ $rc -eq 0 ] && grep -q "Mean KLD" "$T/out" && ok "one-chunk base" || bad "one-chunk base exit $rc"

# never over an input of the run
cp "$MODEL" "$T/m.gguf"
"$TERN" perplexity -m "$T/m.gguf" -f "$T/text.txt" -c 64 --kl-divergence-base "$T/m.gguf" >/dev/null 2>"$T/err"; rc=$?
[ $rc -eq 64 ] && cmp -s "$MODEL" "$T/m.gguf" && ok "base over the model refused, model intact" || bad "base over model exit $rc"
cp "$T/text.txt" "$T/t2.txt"
PPL -f "$T/t2.txt" -c 64 --kl-divergence-base "$T/t2.txt"; rc=$?
[ $rc -eq 64 ] && cmp -s "$T/text.txt" "$T/t2.txt" && ok "base over the text refused" || bad "base over text exit $rc"

# an existing base survives a failed rewrite (here: a text too short for one chunk)
cp "$T/base.kld" "$T/keep.kld"
echo "too short" > "$T/short.txt"
PPL -f "$T/short.txt" -c 64 --kl-divergence-base "$T/keep.kld"; rc=$?
[ $rc -eq 65 ] && cmp -s "$T/base.kld" "$T/keep.kld" && ok "failed run leaves the old base" || bad "old base exit $rc"

# a device as the base: written in place (the node stays), a write error is 74
if [ -c /dev/full ]; then
  PPL -f "$T/text.txt" -c 64 --kl-divergence-base /dev/full; rc=$?
  [ $rc -eq 74 ] && [ -c /dev/full ] && grep -q "No space left" "$T/err" && ok "/dev/full -> 74, still a device" || bad "/dev/full exit $rc"
fi
exit $fail
