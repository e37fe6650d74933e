#!/usr/bin/env python3
"""pcache_ttft.py TERN MODEL TEXT TMP [TOKENS=2000] [THREADS=2] [REPS=3] [QUALITY=lossless]

Time to first token of a TOKENS-token prompt (the start of TEXT, cut to that many tokens with
`tern tokenize`), recomputed vs restored from the disk prompt cache (--prompt-cache), in
`tern generate` (stderr's "prompt N tokens in X ms": the prompt's processing, cache load
included, up to the first token's logits) and in `tern serve` after a restart (the completion
response's timings.prompt_ms, and the request's wall time to a one-token answer). Each figure is
the best of REPS runs (a shared machine: the minimum is the least disturbed run); every serve run
is a fresh server (its in-memory prefix cache empty). Prints each run as it ends, then a markdown
table. Not a test."""
import http.client, json, os, re, shutil, subprocess, sys, time

tern, model, text_path, tmp = sys.argv[1:5]
want = int(sys.argv[5]) if len(sys.argv) > 5 else 2000
threads = sys.argv[6] if len(sys.argv) > 6 else "2"
reps = int(sys.argv[7]) if len(sys.argv) > 7 else 3
quality = sys.argv[8] if len(sys.argv) > 8 else "lossless"
shutil.rmtree(tmp, ignore_errors=True)
os.makedirs(tmp)
text = open(text_path, encoding="utf-8", errors="replace").read()


def n_tokens(s):
    out = subprocess.run([tern, "tokenize", "-m", model, "-p", s, "--ids"], capture_output=True, check=True, timeout=300).stdout
    return len(re.findall(rb"-?\d+", out))


cut = min(len(text), want * 5)  # a prefix of the text with close to (at most) `want` tokens
for _ in range(6):
    n = n_tokens(text[:cut])
    if want * 0.98 <= n <= want: break
    cut = int(cut * (want * 0.99) / n)
prompt = text[:cut]
n_prompt = n_tokens(prompt)
pfile = os.path.join(tmp, "prompt.txt")
open(pfile, "w").write(prompt)
ctx = str(n_prompt + 64)


def generate(cache):
    args = [tern, "generate", "-m", model, "-f", pfile, "-n", "1", "--temp", "0", "-t", threads, "-c", ctx, "--no-display-prompt"]
    if cache: args += ["--prompt-cache", cache, "--prompt-cache-quality", quality]
    r = subprocess.run(args, capture_output=True, timeout=1800)
    err = r.stderr.decode()
    m = re.search(r"prompt (\d+) tokens in (\d+) ms", err)
    if r.returncode or not m: sys.exit(f"pcache_ttft: generate failed ({r.returncode}):\n{err}")
    loaded = re.search(r"prompt cache: (\d+) blocks loaded \((\d+) tokens", err)
    print(f"  generate{' (cache)' if cache else ''}: prompt {m.group(1)} tokens in {m.group(2)} ms, loaded {loaded.group(2) if loaded else 0}", flush=True)
    return float(m.group(2)), int(loaded.group(2)) if loaded else 0


def serve_once(cache, k):
    """A fresh server (port 0, read from its log; up to 10 minutes to start on a busy machine), one
    request of the prompt with a one-token answer, then SIGTERM."""
    extra = ["-c", ctx, "-np", "1"] + (["--prompt-cache", cache, "--prompt-cache-quality", quality] if cache else [])
    log_path = os.path.join(tmp, f"serve-{k}.log")
    with open(log_path, "w+") as log:
        proc = subprocess.Popen([tern, "serve", "-m", model, "--port", "0", "-t", threads, *extra], stdout=log, stderr=log)
        try:
            port = None
            for _ in range(6000):
                log.seek(0)
                m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", log.read())
                if m: port = int(m.group(1)); break
                if proc.poll() is not None: break
                time.sleep(0.1)
            if not port: sys.exit(f"pcache_ttft: server did not start:\n{open(log_path).read()}")
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=1800)
            t0 = time.time()
            c.request("POST", "/v1/completions", json.dumps({"prompt": prompt, "max_tokens": 1, "temperature": 0}),
                      {"Content-Type": "application/json"})
            r = c.getresponse()
            body = json.loads(r.read())
            wall = (time.time() - t0) * 1e3
            if r.status != 200: sys.exit(f"pcache_ttft: serve answered {r.status}: {body}")
            cached = body["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)
            print(f"  serve {k}: prompt_ms {body['timings']['prompt_ms']:.0f}, wall {wall:.0f} ms, cached {cached}", flush=True)
            return body["timings"]["prompt_ms"], wall, cached
        finally:
            proc.terminate()
            try: proc.wait(timeout=60)
            except subprocess.TimeoutExpired: proc.kill(), proc.wait()


gcache, scache = os.path.join(tmp, "gcache"), os.path.join(tmp, "scache")
rows = []
g_re = min(generate(None)[0] for _ in range(reps))
generate(gcache)  # stores the prompt's blocks
warm = [generate(gcache) for _ in range(reps)]
g_ld = min(w[0] for w in warm)
rows.append(("tern generate", g_re, g_ld, warm[0][1]))
s_re = [serve_once(None, f"r{i}") for i in range(reps)]
serve_once(scache, "store")  # a server computes and stores the prompt, then stops
s_ld = [serve_once(scache, f"l{i}") for i in range(reps)]  # each a restarted server
rows.append(("tern serve, restarted: timings.prompt_ms", min(r[0] for r in s_re), min(r[0] for r in s_ld), s_ld[0][2]))
rows.append(("tern serve, restarted: request wall time", min(r[1] for r in s_re), min(r[1] for r in s_ld), s_ld[0][2]))
print(f"{model}: {n_prompt}-token prompt, {threads} threads, quality {quality}, best of {reps}")
print("| where | recomputed (ms) | from the disk cache (ms) | tokens loaded | speedup |\n|---|---:|---:|---:|---:|")
for name, a, b, n in rows:
    print(f"| {name} | {a:.0f} | {b:.0f} | {n} | {a / b:.1f}x |")
