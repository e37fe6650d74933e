#!/usr/bin/env python3
"""tern profile on a mixture-of-experts model: the expert FFN is annotated op by op.

Makes a tiny qwen3moe model (tern synth, Q8_0 experts), runs `tern profile -- generate` on 2
threads and checks, from the trace parsed with the json module and the model's shapes read from
the GGUF file by tests/common's own reader: every layer holds the router matmul (ffn_gate_inp),
the routing (moe_route), the expert matmuls (ffn_gate_up_exps, ffn_down_exps) and the weighted
sum (moe_combine) in that order; in each one-token pass the threads' rows add up to the experts'
rows times the experts a token uses, and the bytes they report to exactly those experts' rows
(one token reads k experts, no more); the route spans carry tokens, experts and k; the spans under
each layer cover it (what is left as the layer's own time is loop overhead, under a quarter of
it summed over the run); and the summary's self time per kind equals the trace's.

usage: profile_moe_test.py TERN TMPDIR
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import trace_lib  # noqa: E402
from tern_testlib import read_gguf  # noqa: E402

TERN, TMP = sys.argv[1], os.path.join(sys.argv[2], "profile_moe.%d" % os.getpid())
trace_lib.TERN = TERN
check, run, spans_of = trace_lib.check, trace_lib.run, trace_lib.spans_of
# ggml types this test reads: id -> (block elements, block bytes)
BLOCK = {0: (1, 4), 1: (1, 2), 8: (32, 34)}


def row_bytes(t, k):
    be, bb = BLOCK[t]
    return k // be * bb


def main():
    os.makedirs(TMP, exist_ok=True)
    model = os.path.join(TMP, "moe.gguf")
    rc, out, err = run("synth", "--arch", "qwen3moe", "--preset", "tiny", "--type", "q8_0", "--seed", "5", "-o", model)
    check(rc == 0, "synth qwen3moe tiny: %s" % err[-300:])
    if rc:
        return
    kv, tensors = read_gguf(model)
    d, ne = kv["qwen3moe.embedding_length"], kv["qwen3moe.expert_count"]
    k, ff = kv["qwen3moe.expert_used_count"], kv["qwen3moe.expert_feed_forward_length"]
    ty = {name: t for name, _, t in tensors}
    tg, tu, td, tr = (ty["blk.0.ffn_%s.weight" % n] for n in ("gate_exps", "up_exps", "down_exps", "gate_inp"))
    check(all(t in BLOCK for t in (tg, tu, td, tr)), "the expert and router types are ones this test sizes (%s)" % [tg, tu, td, tr])
    trace = os.path.join(TMP, "t.json")
    rc, out, err = run("profile", "-o", trace, "--no-roofline", "--", "generate", "-m", model, "-p", "the quick brown fox",
                       "-n", "6", "-t", "2", "--temp", "0")
    check(rc == 0, "profile generate exits 0 (got %d): %s" % (rc, err[-400:]))
    if rc:
        return
    with open(trace) as f:
        doc = json.load(f)
    per_tid = spans_of(doc["traceEvents"])
    order = ["ffn_gate_inp", "moe_route", "ffn_gate_up_exps", "ffn_down_exps", "moe_combine"]
    # passes[i] = [(tokens, [layer spans of thread a], ...)]: the i-th forward of every pool thread
    fwd = {tid: [s for s in sp if s["cat"] == "forward"] for tid, sp in per_tid.items()}
    fwd = {tid: f for tid, f in fwd.items() if f}
    check(len(fwd) == 2, "2 threads run forward passes (%d)" % len(fwd))
    n_pass = min(len(f) for f in fwd.values())
    check(n_pass >= 6, "a prefill and the decode passes (%d)" % n_pass)
    lay_tot = lay_self = 0.0
    one_token = 0
    for i in range(n_pass):
        toks = {f[i]["args"]["rows"] for f in fwd.values()}
        check(len(toks) == 1, "pass %d: the threads agree on its tokens (%s)" % (i, toks))
        n = toks.pop()
        layers = [[c for c in f[i]["children"] if c["cat"] == "layer"] for f in fwd.values()]
        for il in range(len(layers[0])):
            ops = {name: [] for name in order}
            for lt in layers:
                L = lt[il]
                lay_tot += L["t1"] - L["t0"]
                lay_self += L["self"]
                names = [c["name"] for c in L["children"] if c["name"] in ops]
                check(names == order, "pass %d layer %d: the expert FFN's spans in order (%s)" % (i, il, names))
                for c in L["children"]:
                    if c["name"] in ops:
                        ops[c["name"]].append(c)
            for r in ops["moe_route"] + ops["moe_combine"]:
                check((r["cat"], r["args"].get("tokens"), r["args"].get("experts"), r["args"].get("used")) == ("route", n, ne, k),
                      "pass %d layer %d: %s args (tokens, experts, used) = (%d, %d, %d): %s" % (i, il, r["name"], n, ne, k, r["args"]))
            shapes = {"ffn_gate_inp": (ne, d, ne, ne * row_bytes(tr, d)),
                      "ffn_gate_up_exps": (2 * ff, d, 2 * ff * k, k * ff * (row_bytes(tg, d) + row_bytes(tu, d))),
                      "ffn_down_exps": (d, ff, d * k, k * d * row_bytes(td, ff))}
            for name, (m, kk, rows, nbytes) in shapes.items():
                sp = ops[name]
                check(all((s["args"]["m"], s["args"]["k"], s["args"]["n"]) == (m, kk, n) for s in sp),
                      "pass %d layer %d: %s shape (m, k, n) = (%d, %d, %d)" % (i, il, name, m, kk, n))
                got_rows = sum(s["eargs"]["rows"] for s in sp)
                got_bytes = sum(s["eargs"]["bytes"] for s in sp)
                check(got_rows == rows, "pass %d layer %d: %s rows over the threads %d == %d" % (i, il, name, got_rows, rows))
                if n == 1 or name == "ffn_gate_inp":  # one token reads exactly its k experts
                    check(got_bytes == nbytes, "pass %d layer %d: %s bytes %d == %d" % (i, il, name, got_bytes, nbytes))
                else:  # a batch reads between k and all ne experts
                    check(nbytes <= got_bytes <= nbytes * ne // k,
                          "pass %d layer %d: %s bytes %d in [%d, %d]" % (i, il, name, got_bytes, nbytes, nbytes * ne // k))
        one_token += n == 1
    check(one_token >= 5, "one-token passes checked (%d)" % one_token)
    check(lay_tot > 0 and lay_self <= 0.25 * lay_tot,
          "the ops under each layer cover it: layer self time %.1f of %.1f us" % (lay_self, lay_tot))
    trace_lib.check_kinds(per_tid, doc["tern_profile"])


main()
if trace_lib.failures:
    print("%d check(s) failed" % len(trace_lib.failures))
    sys.exit(1)
print("ok")
