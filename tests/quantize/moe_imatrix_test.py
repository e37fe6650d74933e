#!/usr/bin/env python3
"""tern imatrix on a mixture-of-experts file, and tern quantize --imatrix using it.

Synthesizes a tiny qwen3moe (f32, 8 experts, top 2), runs `tern imatrix -c 64 --chunks 3` on a
text and reads the imatrix GGUF here (tests/common/tern_testlib.py, not tern's reader):
  - each *_exps tensor has in_sum2 [ne0][n_expert] and counts [1][n_expert] (llama-imatrix's
    layout for expert tensors); gate, up and down of a layer have the same counts;
  - every layer's counts sum to top_k x 3 x 64 (each token routed to top_k experts) and equal
    the per-expert usage counted by the context's routing counters (printed by tern imatrix);
  - an expert with count 0 has all-zero sums, one with rows has positive sums;
  - the router (ffn_gate_inp, a dense weight read by every token) counts 3 x 64 rows, and the
    experts' gate sums over all experts equal top_k x the router's sums (the same normed rows,
    each token top_k times), within float rounding;
  - tern quantize --imatrix q4_0 accepts the file, and its expert tensors differ from those of
    tern quantize without it (the per-expert importances are used).

usage: moe_imatrix_test.py TERN TEXT TMPDIR
"""
import os
import re
import shutil
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from tern_testlib import read_gguf, run_tern  # noqa: E402

TERN, TEXT, TMP = sys.argv[1], sys.argv[2], os.path.join(sys.argv[3], "moe_imatrix.%d" % os.getpid())
C, CHUNKS = 64, 3
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAIL: " + what)


def run(args):
    return run_tern(TERN, args)[1]


def floats(buf, n):
    return list(struct.unpack_from("<%df" % n, buf, 0))


def main():
    model = os.path.join(TMP, "moe.gguf")
    run(["synth", "--arch", "qwen3moe", "--preset", "tiny", "--type", "f32", "-o", model])
    mkv, mtensors = read_gguf(model)
    ne, k, nl = mkv["qwen3moe.expert_count"], mkv["qwen3moe.expert_used_count"], mkv["qwen3moe.block_count"]
    imat = os.path.join(TMP, "imatrix.gguf")
    err = run(["imatrix", "-m", model, "-f", TEXT, "-c", str(C), "--chunks", str(CHUNKS), "-o", imat, "-t", "2", "--no-ppl"])
    usage = {int(m.group(1)): [int(v) for v in m.group(2).split()] for m in re.finditer(r"expert usage blk\.(\d+):([ \d]+)", err)}
    check(sorted(usage) == list(range(nl)), "tern imatrix printed the usage of every layer")
    kv, tensors, data = read_gguf(imat, with_data=True)
    shapes = {n: s for n, s, _ in tensors}
    tokens = C * CHUNKS
    for il in range(nl):
        cnt = {}
        for w, ne0 in (("gate", 64), ("up", 64), ("down", 128)):
            name = "blk.%d.ffn_%s_exps.weight" % (il, w)
            src = [s for n, s, _ in mtensors if n == name][0]
            check(shapes.get(name + ".in_sum2") == [src[0], ne], "%s.in_sum2 is [%d][%d]: %s" % (name, src[0], ne, shapes.get(name + ".in_sum2")))
            check(shapes.get(name + ".counts") == [1, ne], "%s.counts is [1][%d]: %s" % (name, ne, shapes.get(name + ".counts")))
            if name + ".counts" not in data:
                continue
            cnt[w] = [round(v) for v in floats(data[name + ".counts"], ne)]
            sums = floats(data[name + ".in_sum2"], src[0] * ne)
            for e in range(ne):
                es = sums[e * src[0]:(e + 1) * src[0]]
                check((cnt[w][e] == 0) == all(v == 0 for v in es) and all(v >= 0 for v in es),
                      "%s expert %d: count %d and its sums agree" % (name, e, cnt[w][e]))
            if w == "gate":
                gate_sums = sums
        if len(cnt) < 3:
            continue
        check(cnt["gate"] == cnt["up"] == cnt["down"], "blk.%d: gate/up/down counts equal" % il)
        check(sum(cnt["gate"]) == k * tokens, "blk.%d: counts sum %d, top_k x tokens %d" % (il, sum(cnt["gate"]), k * tokens))
        check(cnt["gate"] == usage.get(il), "blk.%d: counts %s, routing counters %s" % (il, cnt["gate"], usage.get(il)))
        router = "blk.%d.ffn_gate_inp.weight" % il
        check(router + ".counts" in data and round(floats(data[router + ".counts"], 1)[0]) == tokens, "%s counts %d rows" % (router, tokens))
        if router + ".in_sum2" in data:
            d = shapes[router + ".in_sum2"][0]
            rs = floats(data[router + ".in_sum2"], d)
            for j in range(d):
                tot = sum(gate_sums[e * d + j] for e in range(ne))
                check(abs(tot - k * rs[j]) <= 1e-4 * k * rs[j] + 1e-6, "blk.%d col %d: experts' gate sums %g, top_k x router's %g" % (il, j, tot, k * rs[j]))
    # tern quantize uses it: the expert tensors change
    qa, qb = os.path.join(TMP, "with.gguf"), os.path.join(TMP, "without.gguf")
    run(["quantize", "--imatrix", imat, model, qa, "q4_0"])
    run(["quantize", model, qb, "q4_0"])
    _, ta, da = read_gguf(qa, with_data=True)
    _, tb, db = read_gguf(qb, with_data=True)
    size = {n: s[0] * s[1] * s[2] // 32 * 18 for n, s, t in ta if n.endswith("_exps.weight") and t == 2}
    check(len(size) == 3 * nl, "q4_0 expert tensors: %d" % len(size))
    for n, b in size.items():
        check(da[n][:b] != db[n][:b], "%s: quantized with the imatrix differs from without" % n)


shutil.rmtree(TMP, ignore_errors=True)
os.makedirs(TMP)
try:
    main()
finally:
    shutil.rmtree(TMP, ignore_errors=True)
if failures:
    print("%d check(s) failed" % len(failures))
    sys.exit(1)
print("moe_imatrix_test: all checks passed")
