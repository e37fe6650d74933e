#!/usr/bin/env python3
"""tern bench on mixture-of-experts files: the tg roofline from the bytes a token actually reads,
and the expert usage. No timing is asserted.

Synthesizes tiny qwen3moe (f32 and q8_0), olmoe (q8_0) and a dense llama file, runs
`tern bench -p 16 -n 8 -r 1 -o json --no-roofline` on each and checks against numbers computed
here from the file alone (its own GGUF reader: tensor shapes and types, block sizes per type,
expert_count / expert_used_count):
  - bytes_per_token_all = every tensor's bytes less the token embedding (untied output);
  - bytes_per_token (the active bytes) = that less the *_exps tensors' bytes plus top_k / n_expert
    of them, < bytes_per_token_all; the static and measured figures both equal it (one decoded
    token runs exactly top_k distinct experts per layer);
  - expert usage: every layer's counts sum to top_k x the tokens of the bench's passes, computed
    here from the flags: (r + 1) x p (prompt, warm-up included) + (r + 1) x (1 + n) (tg: the
    first token, then n); min/max share and never_used agree with the counts;
  - pp's GOP/s = 2 x the matrix parameters a token is routed through x its t/s;
  - `tern info`'s active parameters equal those computed from the shapes;
  - a dense file reports no expert fields and its bytes_per_token is every weight but the embedding;
  - the markdown output names the active and total MiB and the usage line.

usage: moe_bench_test.py TERN TMPDIR
"""
import json
import os
import re
import shutil
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from tern_testlib import read_gguf, run_tern  # noqa: E402

TERN, TMP = sys.argv[1], os.path.join(sys.argv[2], "moe_bench.%d" % os.getpid())
P, N, R = 16, 8, 1
failures = []

# ggml type -> (bytes per block, elements per block), the types tern synth writes here
TYPES = {0: (4, 1), 1: (2, 1), 8: (34, 32), 30: (2, 1)}


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAIL: " + what)


def nbytes(shape, t):
    n = 1
    for d in shape:
        n *= d
    size, blk = TYPES[t]
    assert n % blk == 0
    return n // blk * size


def expected(path):
    kv, tensors = read_gguf(path)
    arch = kv["general.architecture"]
    ne, k = kv.get(arch + ".expert_count", 0), kv.get(arch + ".expert_used_count", 0)
    total = sum(nbytes(s, t) for _, s, t in tensors)
    names = {n: (s, t) for n, s, t in tensors}
    embd = nbytes(*names["token_embd.weight"])
    all_bytes = total - (embd if "output.weight" in names else 0)
    exps = sum(nbytes(s, t) for n, s, t in tensors if n.endswith("_exps.weight"))
    exps_params = sum(s[0] * s[1] * s[2] for n, s, t in tensors if n.endswith("_exps.weight"))
    params = sum(s[0] * (s[1] if len(s) > 1 else 1) * (s[2] if len(s) > 2 else 1) for _, s, _ in tensors)
    active = all_bytes - exps + (exps * k // ne if ne else 0)
    active_params = params - exps_params + (exps_params * k // ne if ne else 0)
    embd_params = names["token_embd.weight"][0][0] * names["token_embd.weight"][0][1]
    mat_params = active_params - (embd_params if "output.weight" in names else 0)
    return dict(mat_params=mat_params, ne=ne, k=k, n_layer=kv[arch + ".block_count"], all=all_bytes, exps=exps, active=active,
                active_params=active_params)


def run(args):
    return run_tern(TERN, args)[0]


def moe_case(label, synth_args):
    path = os.path.join(TMP, label + ".gguf")
    run(["synth", "-o", path] + synth_args)
    E = expected(path)
    check(E["ne"] > 0 and E["exps"] > 0, "%s: the file has experts" % label)
    rows = json.loads(run(["bench", "-m", path, "-p", str(P), "-n", str(N), "-r", str(R), "-o", "json", "--no-roofline", "-t", "2"]))
    check(len(rows) == 2, "%s: a pp and a tg row" % label)
    tokens = (R + 1) * P + (R + 1) * (1 + N)
    for row in rows:
        tag = "%s %s" % (label, "tg" if row["n_gen"] else "pp")
        check(row["n_expert"] == E["ne"] and row["n_expert_used"] == E["k"], "%s: n_expert/used %d/%d, file %d/%d" % (
            tag, row["n_expert"], row["n_expert_used"], E["ne"], E["k"]))
        check(row["bytes_per_token_all"] == E["all"], "%s: bytes_per_token_all %d, file %d" % (tag, row["bytes_per_token_all"], E["all"]))
        check(row["expert_bytes"] == E["exps"], "%s: expert_bytes %d, file %d" % (tag, row["expert_bytes"], E["exps"]))
        check(row["bytes_per_token"] == E["active"], "%s: bytes_per_token %d, active from the file %d" % (tag, row["bytes_per_token"], E["active"]))
        check(row["bytes_per_token_active_static"] == E["active"], "%s: static active %d != %d" % (tag, row["bytes_per_token_active_static"], E["active"]))
        check(row["bytes_per_token_active_measured"] == E["active"], "%s: measured active %d != %d" % (tag, row["bytes_per_token_active_measured"], E["active"]))
        check(row["bytes_per_token"] < row["bytes_per_token_all"], "%s: active < all" % tag)
        if not row["n_gen"]:  # pp: 2 ops per parameter a token is routed through (not every expert's)
            want = 2.0 * E["mat_params"] * row["avg_ts"] / 1e9
            check(abs(row["gops"] - want) <= 1e-3 + 1e-6 * want, "%s: gops %g, 2 x active matrix params x t/s = %g" % (tag, row["gops"], want))
        if row["n_gen"]:
            check(abs(row["gbs"] - row["bytes_per_token"] * row["avg_ts"] / 1e9) <= 1e-3 + 1e-6 * row["gbs"],
                  "%s: gbs %g is not active bytes x t/s" % (tag, row["gbs"]))
        u = row.get("expert_usage")
        check(u is not None, "%s: expert_usage present" % tag)
        if u is None:
            continue
        check(u["tokens"] == tokens, "%s: usage tokens %d, expected %d from the flags" % (tag, u["tokens"], tokens))
        per = u["per_layer"]
        check(len(per) == E["n_layer"] and all(len(l) == E["ne"] for l in per), "%s: per_layer is n_layer x n_expert" % tag)
        for il, l in enumerate(per):
            check(sum(l) == E["k"] * tokens, "%s: layer %d counts sum %d, expected top_k x tokens = %d" % (tag, il, sum(l), E["k"] * tokens))
        flat = [c for l in per for c in l]
        check(u["routed_rows"] == E["n_layer"] * E["k"] * tokens, "%s: routed_rows %d" % (tag, u["routed_rows"]))
        check(u["never_used"] == sum(1 for c in flat if c == 0), "%s: never_used %d" % (tag, u["never_used"]))
        check(abs(u["min_share"] - min(flat) / (E["k"] * tokens)) < 1e-6 and abs(u["max_share"] - max(flat) / (E["k"] * tokens)) < 1e-6,
              "%s: min/max share %g/%g" % (tag, u["min_share"], u["max_share"]))
    info = run(["info", path]) if label.startswith("qwen3moe-f32") else None
    if info is not None:
        m = re.search(r"active per token ([0-9.e+]+) M", info)
        check(m is not None, "tern info prints active parameters")
        if m:
            got = float(m.group(1)) * 1e6
            check(abs(got - E["active_params"]) <= 5e-4 * E["active_params"], "tern info active %g M, from the file %g M" % (
                got / 1e6, E["active_params"] / 1e6))
    md = run(["bench", "-m", path, "-p", "0", "-n", "4", "-r", "1", "--no-roofline", "-t", "1"])
    mib = "%.2f MiB of the %.2f MiB" % (E["active"] / 1048576.0, E["all"] / 1048576.0)
    check(mib in md, "%s md: '%s' in the experts line" % (label, mib))
    check(re.search(r"expert usage over the bench's %d tokens" % (2 * (1 + 4)), md) is not None, "%s md: the usage line" % label)


def dense_case():
    path = os.path.join(TMP, "dense.gguf")
    run(["synth", "-o", path, "--preset", "tiny", "--type", "q8_0"])
    E = expected(path)
    rows = json.loads(run(["bench", "-m", path, "-p", "8", "-n", "4", "-r", "1", "-o", "json", "--no-roofline", "-t", "1"]))
    for row in rows:
        check("n_expert" not in row and "expert_usage" not in row, "dense: no expert fields")
        check(row["bytes_per_token"] == E["all"], "dense: bytes_per_token %d, file %d" % (row["bytes_per_token"], E["all"]))


shutil.rmtree(TMP, ignore_errors=True)
os.makedirs(TMP)
try:
    moe_case("qwen3moe-f32", ["--arch", "qwen3moe", "--preset", "tiny", "--type", "f32"])
    moe_case("qwen3moe-q8_0", ["--arch", "qwen3moe", "--preset", "tiny", "--type", "q8_0"])
    moe_case("olmoe-q8_0", ["--arch", "olmoe", "--preset", "tiny", "--type", "q8_0"])
    moe_case("mixtral-q8_0", ["--arch", "llama", "--preset", "tiny", "--experts", "8", "--top-k", "2", "--type", "q8_0"])
    dense_case()
finally:
    shutil.rmtree(TMP, ignore_errors=True)
if failures:
    print("%d failure(s)" % len(failures))
    sys.exit(1)
print("moe_bench_test: all checks passed")
