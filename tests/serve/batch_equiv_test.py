#!/usr/bin/env python3
"""batch_equiv_test.py TERN MODEL TMP — the same prompts decoded by tern serve in batches of 1, 2,
4 and 8 concurrent requests give the same greedy text as `tern generate --temp 0` one at a time.
Also checks that batching really happened (tokens per engine step > 1 in /metrics)."""
import json, os, re, subprocess, sys, threading, urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_lib import Server

tern, model, tmp = sys.argv[1:4]
os.makedirs(tmp, exist_ok=True)
N = 24
PROMPTS = ["once upon a time", "the cat sat on", "hello world", "a b c d e f", "in the beginning",
           "zebra", "what is the answer to", "1 2 3 4 5 6 7"]

def generate(p):
    # TERN_SERVE_ARGS (device flags, e.g. --device cuda) apply to the reference run too
    extra = os.environ.get("TERN_SERVE_ARGS", "").split()
    out = subprocess.run([tern, "generate", "-m", model, "-p", p, "-n", str(N), "--temp", "0", "-t", "1",
                          "--ignore-eos", "--no-display-prompt", *extra], capture_output=True, timeout=120, check=True).stdout
    assert out.endswith(b"\n")
    return out[:-1].decode("utf-8", "replace")

ref = {p: generate(p) for p in PROMPTS}

srv = Server(tern, model, tmp, "-np", "8", "--metrics", "--debug-step-delay", "2")
fails = 0
try:
    url = srv.url

    def complete(p, res, i):
        body = json.dumps({"prompt": p, "max_tokens": N, "temperature": 0, "ignore_eos": True}).encode()
        req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
        res[i] = json.load(urllib.request.urlopen(req, timeout=120))["choices"][0]["text"]

    for bs in (1, 2, 4, 8):
        for start in range(0, len(PROMPTS), bs):
            group = PROMPTS[start:start + bs]
            res = [None] * len(group)
            ths = [threading.Thread(target=complete, args=(p, res, i)) for i, p in enumerate(group)]
            for t in ths: t.start()
            for t in ths: t.join()
            for p, r in zip(group, res):
                if r != ref[p]:
                    fails += 1
                    print(f"FAIL batch {bs}: {p!r}: serve {r!r} != generate {ref[p]!r}")
        print(f"ok: batch {bs}: {len(PROMPTS)} prompts match tern generate" if not fails else f"batch {bs} done")
    met = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    steps = int(re.search(r"^tern_engine_steps_total (\d+)", met, re.M).group(1))
    toks = int(re.search(r"^tern_iteration_tokens_total (\d+)", met, re.M).group(1))
    gen = int(re.search(r"^tern_generation_tokens_total (\d+)", met, re.M).group(1))
    print(f"ok: {steps} engine steps, {toks} batch tokens, {gen} generated tokens")
    # batch 8 decodes 8 sequences per step: far fewer steps than generated tokens
    if steps >= gen:
        fails += 1
        print("FAIL: no batching observed")
finally:
    rc = srv.stop()
    if rc != 0:
        fails += 1
        print(f"FAIL: server exit {rc}")
print("all passed" if not fails else f"{fails} failure(s)")
sys.exit(1 if fails else 0)
