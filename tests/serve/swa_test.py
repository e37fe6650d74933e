#!/usr/bin/env python3
"""swa_test.py TERN TMP — tern serve on models with sliding-window layers (Gemma 3: 5 local : 1
global, Gemma 2: alternating), whose local layers keep only each sequence's window in a block
pool of their own. Tiny synthetic models with a 4-position window, so windows slide past many
blocks. Checks, for each family:
  - greedy text of concurrent requests (long prompts in several prefill chunks, then decoding)
    equals `tern generate --temp 0` one at a time (its contiguous cache: an independent path);
  - the same prompts again: prefix-cache hits (they need the window blocks before the hit's end)
    give the same text; prompts sharing a long prefix with different endings, too;
  - the pool is smaller than the global one, and idle means no window block held;
  - --swa-full (every position in the global pool) gives the same text again.
The mixture-of-experts families (qwen3moe, olmoe: routed rows grouped by expert in every batch)
get the first two checks too: a request's tokens do not depend on what else is in its batch."""
import json, os, re, subprocess, sys, threading, urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_lib import Server, check, finish, ok

tern, tmp = sys.argv[1:3]
os.makedirs(tmp, exist_ok=True)
N = 20
BASE = "the little dog ran to the park and saw a big red ball under the old tree "
PROMPTS = [BASE + "then it", BASE + "and the cat", "zebra stripes are black and white and", "a b c d e f g h i j k l m n o p",
           BASE[:40], "hello", BASE + BASE[:20], "once upon a time in a land far away there lived a"]


def generate(model, p):
    # -b 16 as the server's: batches under 64 rows sum attention in f16, larger ones in f32
    out = subprocess.run([tern, "generate", "-m", model, "-p", p, "-n", str(N), "--temp", "0", "-t", "1", "-b", "16",
                          "--ignore-eos", "--no-display-prompt"], capture_output=True, timeout=120, check=True).stdout
    assert out.endswith(b"\n")
    return out[:-1].decode("utf-8", "replace")


def complete(url, p, res, i):
    body = json.dumps({"prompt": p, "max_tokens": N, "temperature": 0, "ignore_eos": True}).encode()
    req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
    res[i] = json.load(urllib.request.urlopen(req, timeout=120))["choices"][0]["text"]


def batch(srv, prompts):
    res = [None] * len(prompts)
    ths = [threading.Thread(target=complete, args=(srv.url, p, res, i)) for i, p in enumerate(prompts)]
    for t in ths: t.start()
    for t in ths: t.join()
    return res


for arch in ("gemma3", "gemma2", "qwen3moe", "olmoe"):
    swa = arch.startswith("gemma")
    model = os.path.join(tmp, f"{arch}.gguf")
    subprocess.run([tern, "synth", "-o", model, "--arch", arch, "--preset", "tiny", "--type", "q8_0"], check=True,
                   capture_output=True, timeout=120)
    ref = {p: generate(model, p) for p in PROMPTS}
    # -b 16: prompts take several prefill chunks; -c: room for every sequence in the global pool
    srv = Server(tern, model, os.path.join(tmp, arch), "-np", "4", "-b", "16", "-c", "1024", "--metrics",
                 "--debug-step-delay", "1")
    try:
        m0 = srv.metrics()
        if swa: check(0 < m0.get("tern_kv_swa_cache_blocks", 0) < m0["tern_kv_cache_blocks"],
              f"{arch}: window pool of {m0.get('tern_kv_swa_cache_blocks')} blocks < global {m0['tern_kv_cache_blocks']}")
        for rnd in ("cold", "prefix-cached"):
            bad = 0
            for start in range(0, len(PROMPTS), 4):
                group = PROMPTS[start:start + 4]
                for p, r in zip(group, batch(srv, group)):
                    if r != ref[p]:
                        bad += 1
                        print(f"  {arch} {rnd}: {p!r}: serve {r!r} != generate {ref[p]!r}")
            check(bad == 0, f"{arch} {rnd}: {len(PROMPTS)} prompts, 4 at a time, equal tern generate")
        m = srv.wait_idle()
        check(m["tern_prompt_tokens_cached_total"] > 0, f"{arch}: prefix cache hits ({int(m['tern_prompt_tokens_cached_total'])} tokens)")
        check(m.get("tern_kv_swa_blocks_used", 0) == 0, f"{arch}: idle: no window block held")
        srv.end_clean()
    finally:
        if srv.proc.poll() is None:
            srv.kill()
    if not swa:
        continue
    log = open(os.path.join(tmp, arch, "serve.log")).read()
    kv = re.search(r"KV cache ([\d.]+) MiB", log)
    srv = Server(tern, model, os.path.join(tmp, arch + "-full"), "-np", "4", "-b", "16", "-c", "1024", "--metrics", "--swa-full")
    try:
        res = batch(srv, PROMPTS[:4])
        check(res == [ref[p] for p in PROMPTS[:4]], f"{arch} --swa-full: equal tern generate")
        check("tern_kv_swa_cache_blocks" not in srv.metrics(), f"{arch} --swa-full: no window pool")
        srv.end_clean()
    finally:
        if srv.proc.poll() is None:
            srv.kill()
    kv_full = re.search(r"KV cache ([\d.]+) MiB", open(os.path.join(tmp, arch + "-full", "serve.log")).read())
    check(kv and kv_full and float(kv.group(1)) < float(kv_full.group(1)),
          f"{arch}: KV {kv and kv.group(1)} MiB with window blocks < {kv_full and kv_full.group(1)} MiB with --swa-full")
finish()
