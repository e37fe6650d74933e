#!/usr/bin/env python3
"""pcache_serve_test.py TERN MODEL TMP — tern serve --prompt-cache DIR: a prompt computed by one
server is stored on disk; a restarted server (empty prefix cache in memory) loads its blocks
(usage.prompt_tokens_details.cached_tokens) and answers the same greedy text as `tern generate`
without any cache; a damaged block file is skipped (warning in the log) with the same text. The
same with a quantized cache (-ctk q8_0 -ctv q4_0): tern generate's text with those types, its own
files. With a draft model: blocks load from disk, the draft computes its own KV for them. Stores run
on a writer thread: a slow disk does not hold up the answer, and the exit writes what is queued."""
import glob, json, os, shutil, subprocess, sys, time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "serve"))
from serve_lib import Server, check, finish

tern, model, tmp = sys.argv[1:4]
# the load decision compares a block's load time with prefill's: timings on a busy test machine are
# noise, so the servers here are told prefill is slow (1 token/s: always load) except where the
# decision itself is tested
os.environ["TERN_PCACHE_PREFILL_TOK_S"] = "1"
shutil.rmtree(tmp, ignore_errors=True)
os.makedirs(tmp)
cache = os.path.join(tmp, "cache")
N = 16
PROMPT = ("Once upon a time there was a little girl named Lily. She loved to play outside in the park with her "
          "friends. One day she saw a big red ball under a tree and she wanted to play with it.")

probe = subprocess.run([tern, "generate", "-m", model, "-p", "x", "-n", "1", "--prompt-cache", os.path.join(tmp, "probe")],
                       capture_output=True, timeout=120)
if probe.returncode == 64 and b"without libzstd" in probe.stderr:
    print("SKIP: this tern was built without libzstd (no prompt cache)")
    sys.exit(77)
ref = subprocess.run([tern, "generate", "-m", model, "-p", PROMPT, "-n", str(N), "--temp", "0", "-t", "1", "--ignore-eos",
                      "--no-display-prompt"], capture_output=True, timeout=120, check=True).stdout.decode()[:-1]


def pc_metrics(srv, want_stored=None):
    """The tern_prompt_cache_* counters; waits (up to 20 s) for the writer to reach want_stored."""
    t0 = time.time()
    while True:
        m = {k[len("tern_prompt_cache_"):]: v for k, v in srv.metrics().items() if k.startswith("tern_prompt_cache_")}
        if want_stored is None or m.get("blocks_stored_total", 0) >= want_stored or time.time() - t0 > 20:
            return m
        time.sleep(0.05)


def ask(srv):
    st, body = srv.post("/v1/completions", {"prompt": PROMPT, "max_tokens": N, "temperature": 0, "ignore_eos": True})
    check(st == 200, f"status {st}")
    return body["choices"][0]["text"], body["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)


with Server(tern, model, os.path.join(tmp, "s1"), "--prompt-cache", cache, "--metrics") as srv:
    text, cached = ask(srv)
    check(text == ref, f"first server: text equals tern generate's ({text!r} vs {ref!r})")
    check(cached == 0, f"first server: nothing cached ({cached})")
    m = pc_metrics(srv, 2)
    check(m.get("blocks_loaded_total") == 0 and m.get("blocks_stored_total", 0) >= 2 and m.get("bytes_stored_total", 0) > 0
          and m.get("blocks_dropped_total") == 0 and m.get("store_off") == 0, f"first server: /metrics counts the stores ({m})")
    srv.end_clean()
files = glob.glob(os.path.join(cache, "*", "*.tpc"))
check(len(files) >= 2, f"{len(files)} block files stored")
with Server(tern, model, os.path.join(tmp, "s2"), "--prompt-cache", cache, "--metrics") as srv:
    text, cached = ask(srv)
    check(text == ref, "restarted server: same text")
    check(cached == 16 * len(files), f"restarted server: {cached} prompt tokens from the disk cache ({len(files)} blocks)")
    m = pc_metrics(srv)
    check(m.get("blocks_loaded_total") == len(files) and m.get("blocks_stored_total") == 0 and m.get("blocks_skipped_total") == 0
          and m.get("bytes_loaded_total") == sum(os.path.getsize(f) for f in files),
          f"restarted server: /metrics counts {len(files)} loads and their bytes ({m})")
    srv.end_clean()
# the cost model: told prefill is very fast, a restarted server loads the first block (its load time
# measured) and recomputes the rest
with Server(tern, model, os.path.join(tmp, "s2b"), "--prompt-cache", cache, "--metrics",
            env={**os.environ, "TERN_PCACHE_PREFILL_TOK_S": "1e12"}) as srv:
    text, cached = ask(srv)
    check(text == ref, "prefill said faster than loading: same text")
    m = pc_metrics(srv)
    check(cached == 16 and m.get("blocks_loaded_total") == 1 and m.get("loads_declined_total") == 1,
          f"prefill said faster than loading: the first block loaded, the rest recomputed ({cached} tokens cached, {m})")
    srv.end_clean()
# damage every block file: all skipped, recomputed, same text
for f in files:
    with open(f, "r+b") as fh:
        fh.seek(150)
        b = fh.read(1)
        fh.seek(150)
        fh.write(bytes([b[0] ^ 0x40]))
with Server(tern, model, os.path.join(tmp, "s3"), "--prompt-cache", cache, "--metrics") as srv:
    text, cached = ask(srv)
    check(text == ref, "damaged files: same text")
    check(cached == 0, f"damaged files: nothing loaded ({cached})")
    m = pc_metrics(srv)
    check(m.get("blocks_skipped_total", 0) >= 1 and m.get("blocks_loaded_total") == 0, f"damaged files: /metrics counts the skip ({m})")
    srv.end_clean()
    log = open(srv.log_path).read()
check("warning: prompt cache: skipping" in log, "damaged files: a warning in the log")
# a quantized in-memory cache: stored by one server, loaded by a restarted one, same text as
# tern generate with the same types
qcache = os.path.join(tmp, "qcache")
qargs = ["-ctk", "q8_0", "-ctv", "q4_0"]
refq = subprocess.run([tern, "generate", "-m", model, "-p", PROMPT, "-n", str(N), "--temp", "0", "-t", "1", "--ignore-eos",
                       "--no-display-prompt"] + qargs, capture_output=True, timeout=120, check=True).stdout.decode()[:-1]
with Server(tern, model, os.path.join(tmp, "q1"), "--prompt-cache", qcache, "--metrics", *qargs) as srv:
    text, cached = ask(srv)
    check(text == refq, f"-ctk q8_0 -ctv q4_0 first server: text equals tern generate's ({text!r} vs {refq!r})")
    srv.end_clean()
qfiles = glob.glob(os.path.join(qcache, "*-q8_0r-q4_0-*", "*.tpc"))
check(len(qfiles) >= 2, f"-ctk q8_0 -ctv q4_0: {len(qfiles)} block files stored in a q8_0r-q4_0 subdirectory")
with Server(tern, model, os.path.join(tmp, "q2"), "--prompt-cache", qcache, "--metrics", *qargs) as srv:
    text, cached = ask(srv)
    check(text == refq, "-ctk q8_0 -ctv q4_0 restarted server: same text")
    check(cached == 16 * len(qfiles), f"-ctk q8_0 -ctv q4_0 restarted server: {cached} prompt tokens from the disk cache")
    srv.end_clean()
# stores happen on the cache's writer thread: with every file write paused 2 s half-way
# (TERN_PCACHE_TEST_PAUSE_MS), the answer comes back while the files are still being written (the
# engine thread does not wait for them), and SIGTERM writes the queued blocks before the exit
wcache = os.path.join(tmp, "wcache")
with Server(tern, model, os.path.join(tmp, "w1"), "--prompt-cache", wcache, "--metrics",
            env={**os.environ, "TERN_PCACHE_TEST_PAUSE_MS": "2000"}) as srv:
    text, cached = ask(srv)
    early = len(glob.glob(os.path.join(wcache, "*", "*.tpc")))
    check(text == ref, "slow disk: text equals tern generate's")
    check(early < len(files), f"slow disk: answered with {early} of {len(files)} block files written (the writer is behind)")
    srv.end_clean()
late = len(glob.glob(os.path.join(wcache, "*", "*.tpc")))
check(late == len(files), f"slow disk: {late} block files written by the exit ({len(files)} expected)")
check(not glob.glob(os.path.join(wcache, "*", "*.tmp.*")), "slow disk: no temporary file left")
# the control: stores on the engine thread (TERN_PCACHE_WRITER=0) — the answer waits for them
wcache0 = os.path.join(tmp, "wcache0")
with Server(tern, model, os.path.join(tmp, "w0"), "--prompt-cache", wcache0, "--metrics",
            env={**os.environ, "TERN_PCACHE_TEST_PAUSE_MS": "2000", "TERN_PCACHE_WRITER": "0"}) as srv:
    text, cached = ask(srv)
    early = len(glob.glob(os.path.join(wcache0, "*", "*.tpc")))
    check(text == ref and early == len(files), f"slow disk, no writer thread: answered after all {early} block files were written")
    srv.end_clean()

# a draft model (--draft, here the model itself, 4 drafts a step): the restarted server loads the
# blocks from disk as without one, and the draft model computes its own KV for them (the files hold
# the target's only): the same text, and the drafts as good as the first server's (a draft reading
# a cache it never filled would be wrong nearly every time)
dcache = os.path.join(tmp, "dcache")
dargs = ["--draft", model, "--spec-fixed", "4"]
ratio = []
for i, name in enumerate(("d1", "d2")):
    with Server(tern, model, os.path.join(tmp, name), "--prompt-cache", dcache, "--metrics", *dargs) as srv:
        text, cached = ask(srv)
        dfiles = glob.glob(os.path.join(dcache, "*", "*.tpc"))
        check(text == ref, f"--draft, {'restarted' if i else 'first'} server: text equals tern generate's ({text!r} vs {ref!r})")
        check(cached == (16 * len(dfiles) if i else 0) and (not i or cached > 0),
              f"--draft, {'restarted' if i else 'first'} server: {cached} prompt tokens from the disk cache ({len(dfiles)} blocks)")
        m = srv.wait_idle()
        d, a = m["tern_spec_drafted_total"], m["tern_spec_accepted_total"]
        check(d > 0, f"--draft, {name}: {int(d)} tokens drafted")
        ratio.append(a / d if d else 0.0)
        srv.end_clean()
check(ratio[0] >= 0.75 and ratio[1] >= ratio[0] - 0.1,
      f"--draft: acceptance after loading from disk {ratio[1]:.3f}, first server {ratio[0]:.3f} (>= 0.75, within 0.1)")
finish()
