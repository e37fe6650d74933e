#!/usr/bin/env python3
"""kvq_test.py TERN TMP — a quantized KV cache (-ctk / -ctv q8_0, q4_0, tq3, tq4) through the command line:
  - tern serve with the cache type (paged blocks, 4 concurrent requests, prompts in several prefill
    chunks, then the same prompts again as prefix-cache hits) gives the greedy text of
    `tern generate --temp 0` with the same cache type one prompt at a time (its contiguous cache:
    an independent path), on the tiny qwen3 (head size 32) and gemma3 (sliding-window pool) models;
    Rotated halves (--kv-rotate auto, kv; none) likewise;
  - the KV memory line of generate and serve names the types (and the rotated halves), with the bytes
    of the q8_0 / q4_0 rows;
  - bad values of -ctk / --cache-type-k / -ctv / --cache-type-v / --kv-rotate in generate, chat, bench, perplexity
    and serve exit 64 naming the flag; a model whose head size is not a multiple of 32 (the tiny
    llama's 16) is refused with a message saying so; tern bench runs with the flags;
  - per-channel K (-ctk tqc2..4): generate, bench and perplexity run, its K rows 4 b + 8 bytes per 32
    values; a long prompt through --prompt-cache twice gives the same text, the second run loading
    its blocks (and with the lossy `balanced` quality, which re-quantizes whole groups, runs and loads); -ctv tqc3 exits 64 in all five commands, and a sliding-window model (gemma3) is
    refused naming it; serve with tqc3 / q8_0 and tqc2 / tq4 equals generate as above."""
import os, re, shutil, subprocess, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_lib import Server, check, complete_all, finish

tern, tmp = sys.argv[1:3]
os.makedirs(tmp, exist_ok=True)
N = 16
BASE = "the little dog ran to the park and saw a big red ball under the old tree "
PROMPTS = [BASE + "then it", BASE + "and the cat", "zebra stripes are black and white and", "a b c d e f g h i j k l m n o p",
           "hello", BASE + BASE[:20], "once upon a time in a land far away there lived a", BASE[:40]]


def run(args, timeout=120):
    return subprocess.run([tern, *args], capture_output=True, timeout=timeout)


def generate(model, p, ctk, ctv, rot):
    r = run(["generate", "-m", model, "-p", p, "-n", str(N), "--temp", "0", "-t", "1", "-b", "16", "--ignore-eos",
             "--no-display-prompt", "-ctk", ctk, "-ctv", ctv, "--kv-rotate", rot])
    assert r.returncode == 0, r.stderr
    assert r.stdout.endswith(b"\n")
    return r.stdout[:-1].decode("utf-8", "replace"), r.stderr.decode()


def serve_vs_generate(arch, model, ctk, ctv, rot, types):
    ref, err = {}, ""
    for p in PROMPTS:
        ref[p], err = generate(model, p, ctk, ctv, rot)
    check(types in err, f"{arch} {ctk}/{ctv} {rot}: generate reports the cache types ({err.strip().splitlines()[0]})")
    name = f"{arch}-{ctk}-{ctv}-{rot}"
    srv = Server(tern, model, os.path.join(tmp, name), "-np", "4", "-b", "16", "-c", "1024", "--metrics",
                 "-ctk", ctk, "--cache-type-v", ctv, "--kv-rotate", rot)
    try:
        for rnd in ("cold", "prefix-cached"):
            bad = 0
            for start in range(0, len(PROMPTS), 4):
                group = PROMPTS[start:start + 4]
                for p, r in zip(group, complete_all(srv.url, group, N)):
                    if r != ref[p]:
                        bad += 1
                        print(f"  {name} {rnd}: {p!r}: serve {r!r} != generate {ref[p]!r}")
            check(bad == 0, f"{name} {rnd}: {len(PROMPTS)} prompts, 4 at a time, equal tern generate -ctk {ctk} -ctv {ctv} --kv-rotate {rot}")
        srv.end_clean()
    finally:
        if srv.proc.poll() is None:
            srv.kill()
    log = open(os.path.join(tmp, name, "serve.log")).read()
    check(f"({types})" in log, f"{name}: serve reports the cache types")


for arch in ("qwen3", "gemma3"):
    model = os.path.join(tmp, f"{arch}.gguf")
    subprocess.run([tern, "synth", "-o", model, "--arch", arch, "--preset", "tiny", "--type", "q8_0"], check=True,
                   capture_output=True, timeout=120)
    # auto rotates a quantized K; kv both halves; none neither
    for ct, rot in (("q8_0", "auto"), ("q4_0", "auto"), ("q4_0", "kv"), ("q4_0", "none"), ("tq3", "auto"), ("tq4", "kv")):
        types = {"auto": f"K {ct} rotated, V {ct}", "kv": f"K {ct} rotated, V {ct} rotated", "none": f"K {ct}, V {ct}"}[rot]
        serve_vs_generate(arch, model, ct, ct, rot, types)
# per-channel K (a window per sequence in serve; auto leaves it unrotated); prompts of 1..3 groups
serve_vs_generate("qwen3", os.path.join(tmp, "qwen3.gguf"), "tqc3", "q8_0", "auto", "K tqc3, V q8_0")
serve_vs_generate("qwen3", os.path.join(tmp, "qwen3.gguf"), "tqc2", "tq4", "auto", "K tqc2, V tq4")

# KV bytes (-c 32768, ~16 MiB in f16, printed to 0.1 MiB): f16 rows 2 bytes a value, q8_0 34 bytes per 32, q4_0 18 per 32
model = os.path.join(tmp, "qwen3.gguf")
mib = {}
for ct in ("f16", "q8_0", "q4_0", "tq2"):
    r = run(["generate", "-m", model, "-p", "hi", "-n", "1", "-c", "32768", "-t", "1", "-ctk", ct, "-ctv", ct])
    m = re.search(r"KV ([0-9.]+) MiB", r.stderr.decode())
    mib[ct] = float(m.group(1)) if m else -1
check(abs(mib["q8_0"] / mib["f16"] - 34 / 64) < 0.02 and abs(mib["q4_0"] / mib["f16"] - 18 / 64) < 0.02
      and abs(mib["tq2"] / mib["f16"] - 12 / 64) < 0.02,
      f"KV MiB f16 {mib['f16']}, q8_0 {mib['q8_0']} (34/64 of f16), q4_0 {mib['q4_0']} (18/64), tq2 {mib['tq2']} (12/64)")

# bad values exit 64 naming the flag
data = os.path.join(tmp, "text.txt")
open(data, "w").write(" ".join(PROMPTS) * 20)
for cmd in (["generate", "-m", model, "-p", "hi"], ["chat", "-m", model], ["bench", "-m", model, "-p", "8", "-n", "2"],
            ["perplexity", "-m", model, "-f", data], ["serve", "-m", model, "--port", "0"]):
    for flag, val in (("-ctk", "q4_1"), ("--cache-type-v", "f32"), ("-ctv", None), ("--kv-rotate", "q"), ("--kv-rotate", None)):
        r = run(cmd + ([flag, val] if val else [flag]), timeout=30)
        e = r.stderr.decode()
        check(r.returncode == 64 and flag in e, f"{cmd[0]} {flag} {val}: exit {r.returncode}, '{e.strip().splitlines()[-1] if e.strip() else ''}'")
r = run(["bench", "-m", model, "-p", "8", "-n", "4", "-r", "1", "-t", "1", "-ctk", "q8_0", "-ctv", "q4_0", "--no-roofline"])
check(r.returncode == 0, f"bench -ctk q8_0 -ctv q4_0 runs (exit {r.returncode})")
# head size 16 (the tiny llama): refused with a message naming it; f16 works
odd = os.path.join(tmp, "llama16.gguf")
subprocess.run([tern, "synth", "-o", odd, "--preset", "tiny", "--type", "q8_0"], check=True, capture_output=True, timeout=120)
r = run(["generate", "-m", odd, "-p", "hi", "-n", "2", "-ctk", "q8_0"])
e = r.stderr.decode()
check(r.returncode != 0 and "multiple of 32" in e and "16" in e,
      f"head size 16 with -ctk q8_0: exit {r.returncode}, '{e.strip().splitlines()[-1] if e.strip() else ''}'")
check(run(["generate", "-m", odd, "-p", "hi", "-n", "2", "-ctk", "f16"]).returncode == 0, "head size 16 with -ctk f16 runs")

# per-channel K
r = run(["generate", "-m", model, "-p", "hi", "-n", "1", "-c", "32768", "-t", "1", "-ctk", "tqc3"])
m = re.search(r"KV ([0-9.]+) MiB", r.stderr.decode())
got = float(m.group(1)) if m else -1
check(r.returncode == 0 and abs(got / mib["f16"] - (20 / 64 + 1) / 2) < 0.02, f"-ctk tqc3: KV {got} MiB, (20/64 + 1) / 2 of f16's {mib['f16']}")
for cmd in (["bench", "-m", model, "-p", "40", "-n", "20", "-r", "1", "-t", "2", "--no-roofline", "-ctk", "tqc2"],
            ["perplexity", "-m", model, "-f", data, "-c", "64", "--chunks", "2", "-ctk", "tqc4", "-ctv", "q8_0"]):
    r = run(cmd)
    check(r.returncode == 0, f"{cmd[0]} {' '.join(cmd[-4:])} runs (exit {r.returncode})")
pc = os.path.join(tmp, "pc-tqc")
shutil.rmtree(pc, ignore_errors=True)
outs = []
for i in range(2):
    r = run(["generate", "-m", model, "-p", " ".join(PROMPTS), "-n", "12", "-c", "1024", "--temp", "0", "-t", "2", "-ctk", "tqc3",
             "--ignore-eos", "--prompt-cache", pc])
    e = r.stderr.decode()
    loaded = re.search(r"prompt cache: (\d+) blocks loaded", e)
    outs.append((r.returncode, r.stdout, int(loaded.group(1)) if loaded else -1))
check(outs[0][0] == 0 and outs[0][1] == outs[1][1] and outs[0][2] == 0 and outs[1][2] > 0,
      f"-ctk tqc3 --prompt-cache: the second run loads {outs[1][2]} blocks and writes the same text")
# a lossy disk quality re-quantizes a whole block (one per-channel group) from what it decodes
for i in range(2):
    r = run(["generate", "-m", model, "-p", " ".join(PROMPTS), "-n", "12", "-c", "1024", "--temp", "0", "-t", "2", "-ctk", "tqc3",
             "--ignore-eos", "--prompt-cache", pc, "--prompt-cache-quality", "balanced"])
    loaded = re.search(r"prompt cache: (\d+) blocks loaded", r.stderr.decode())
    n = int(loaded.group(1)) if loaded else -1
    check(r.returncode == 0 and len(r.stdout) > 0 and (i == 0 or n > 0),
          f"-ctk tqc3 --prompt-cache-quality balanced run {i + 1}: exit {r.returncode}, {n} blocks loaded")
for cmd in (["generate", "-m", model, "-p", "hi"], ["chat", "-m", model], ["bench", "-m", model, "-p", "8", "-n", "2"],
            ["perplexity", "-m", model, "-f", data], ["serve", "-m", model, "--port", "0"]):
    r = run(cmd + ["-ctv", "tqc3"], timeout=30)
    e = r.stderr.decode()
    check(r.returncode == 64 and "for K only" in e, f"{cmd[0]} -ctv tqc3: exit {r.returncode}, '{e.strip().splitlines()[-1] if e.strip() else ''}'")
r = run(["generate", "-m", os.path.join(tmp, "gemma3.gguf"), "-p", "hi", "-n", "2", "-ctk", "tqc3"])
e = r.stderr.decode()
check(r.returncode != 0 and "sliding-window" in e, f"gemma3 -ctk tqc3: exit {r.returncode}, '{e.strip().splitlines()[-1] if e.strip() else ''}'")
finish()
