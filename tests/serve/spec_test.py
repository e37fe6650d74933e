#!/usr/bin/env python3
"""spec_test.py TERN MODEL TMP — tern serve --spec ngram and --draft MODEL give the text it gives
without speculation:
  - greedy: every prompt (some copy-heavy, so drafts are accepted) equals `tern generate --temp 0`
    one at a time, sent alone and 4 / 8 at once, streamed and not, with the adaptive length and
    with fixed lengths (--spec-fixed 4, --draft-max 8 --draft-min 8); with a draft model: the
    model itself (every draft kept) and its q4_0 requantization (some rejected); --draft-p-min on
    the default model (the same text, fewer drafts than without it);
  - max_tokens and stop strings landing inside an accepted run: the text is the reference's
    prefix (up to the stop string / of max_tokens tokens);
  - seeded sampling (temperature, top_p), penalties, logit_bias and logprobs: the same answer as a
    server without --spec (the sampler sees the rows in order, as one-token decoding);
  - /metrics: drafted >= accepted > 0, acceptance ratio = accepted / drafted, a length histogram
    whose count is the decoding rows; no KV block held at the end, clean exit;
  - bad flags exit 64 with one message; a missing draft model 66, one of another vocabulary 65."""
import os, re, subprocess, sys, threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_lib import Server, bad, check, finish, ok

tern, model, tmp = sys.argv[1:4]
N = 40
# at most 16 tokens (bytes here) each: a prompt that hits the prefix cache is prefilled in other
# chunks than `tern generate` does, which may round differently (with or without --spec)
PROMPTS = ["once upon a time", "a b c d e f", "ab ab ab ab ab", "1 2 1 2 1 2 1", "xyzxyzxyzxyz", "zebra",
           "hello hello", "what is it"]
# longer copy-heavy prompts: compared with a server without --spec given the same requests in
# the same order (so both find the same prefix-cache blocks)
LONG = ["the cat sat on the mat. the cat sat on the mat. the cat sat on",
        "1 2 3 4 5 6 7 8 1 2 3 4 5 6 7 8 1 2 3 4 5 6 7 8 1 2 3"]
COMPL = "/v1/completions"
EXTRA = os.environ.get("TERN_SERVE_ARGS", "").split()


def generate(p, n):
    out = subprocess.run([tern, "generate", "-m", model, "-p", p, "-n", str(n), "--temp", "0", "-t", "1", "--ignore-eos",
                          "--no-display-prompt", *EXTRA], capture_output=True, timeout=120, check=True).stdout
    assert out.endswith(b"\n")
    return out[:-1].decode("utf-8", "replace")


# bad flags: one message, exit 64
for args, what in ((["--spec", "bogus"], "--spec"), (["--draft-max", "4"], "need --spec ngram or --draft"),
                   (["--spec", "ngram", "--draft-max", "0"], "--draft-max"),
                   (["--spec", "ngram", "--draft-min", "5", "--draft-max", "3"], "--draft-min"),
                   (["--spec", "ngram", "--spec-fixed", "4", "--draft-max", "6"], "contradicts"),
                   (["--spec", "ngram", "--draft-p-min", "0.5"], "--draft-p-min needs --draft"),
                   (["--draft", model, "--draft-p-min", "1.5"], "not a probability")):
    r = subprocess.run([tern, "serve", "-m", model, "--port", "0", *args], capture_output=True, timeout=60)
    check(r.returncode == 64 and what.encode() in r.stderr, f"serve {' '.join(args)}: exit {r.returncode}, says {what!r}")

# draft models: the model requantized to q4_0 (same vocabulary, other weights); a small synthetic
# model with 4096 tokens (another vocabulary)
os.makedirs(tmp, exist_ok=True)
DRAFT_Q4, OTHER_VOCAB = os.path.join(tmp, "draft-q4_0.gguf"), os.path.join(tmp, "other-vocab.gguf")
subprocess.run([tern, "quantize", "--allow-requantize", model, DRAFT_Q4, "q4_0"], check=True, capture_output=True, timeout=120)
subprocess.run([tern, "synth", "-o", OTHER_VOCAB, "--preset", "small", "--type", "q4_0"], check=True, capture_output=True, timeout=300)
for args, rc, what in ((["--spec", "ngram", "--draft", model], 64, "choose one"),
                       (["--draft", os.path.join(tmp, "missing.gguf")], 66, "draft model"),
                       (["--draft", OTHER_VOCAB], 65, "vocabulary")):
    r = subprocess.run([tern, "serve", "-m", model, "--port", "0", *args], capture_output=True, timeout=60)
    check(r.returncode == rc and what.encode() in r.stderr, f"serve {' '.join(args[:2])}: exit {r.returncode}, says {what!r}")

ref = {p: generate(p, N) for p in PROMPTS}
ref_short = {(p, n): generate(p, n) for p in PROMPTS[1:5] for n in (3, 7, 13)}


def body(p, **kw):
    return {"prompt": p, "max_tokens": N, "temperature": 0, "ignore_eos": True, **kw}


def complete(srv, b):
    st, js = srv.post(COMPL, b, timeout=120)
    assert st == 200, (st, js)
    return js


def text_of(srv, b, stream):
    if not stream:
        return complete(srv, b)["choices"][0]["text"]
    st, ev, done = srv.stream(COMPL, {**b, "stream": True}, timeout=120)
    assert st == 200 and done, (st, ev)
    return "".join(e["choices"][0]["text"] for e in ev if e.get("choices"))


def concurrent(srv, prompts, stream):
    res = [None] * len(prompts)

    def run(i, p):
        try:
            res[i] = text_of(srv, body(p), stream)
        except Exception as ex:  # reported as a mismatch below
            res[i] = f"<error {ex}>"
    ths = [threading.Thread(target=run, args=(i, p)) for i, p in enumerate(prompts)]
    for t in ths: t.start()
    for t in ths: t.join()
    return res


def greedy_checks(srv, name):
    for bs in (1, 4, 8):
        for stream in (False, True):
            fails = 0
            for start in range(0, len(PROMPTS), bs):
                group = PROMPTS[start:start + bs]
                for p, r in zip(group, concurrent(srv, group, stream)):
                    if r != ref[p]:
                        fails += 1
                        bad(f"{name} batch {bs} stream {stream}: {p!r}: {r!r} != generate {ref[p]!r}")
            if not fails:
                ok(f"{name}: batch {bs}, stream {stream}: {len(PROMPTS)} prompts equal tern generate --temp 0")
    # max_tokens inside a run: the first n tokens' text
    fails = 0
    for (p, n), want in ref_short.items():
        for stream in (False, True):
            got = text_of(srv, body(p, max_tokens=n), stream)
            if got != want:
                fails += 1
                bad(f"{name} max_tokens {n} stream {stream}: {p!r}: {got!r} != {want!r}")
    if not fails:
        ok(f"{name}: max_tokens 3 / 7 / 13 give the reference's first tokens")
    # stop strings: cut where the reference first has them
    fails = n_stop = 0
    for p in PROMPTS:
        full = ref[p]
        for at in (5, 17, 30):
            stop = full[at:at + 3]
            # the text may hold U+FFFD for bytes that are not UTF-8: the server matches stop
            # strings on the bytes, so only ASCII ones compare
            if len(stop) < 3 or not stop.strip() or not stop.isascii():
                continue
            want = full[:full.index(stop)]
            for stream in (False, True):
                n_stop += 1
                got = text_of(srv, body(p, stop=[stop]), stream)
                if got != want:
                    fails += 1
                    bad(f"{name} stop {stop!r} stream {stream}: {p!r}: {got!r} != {want!r}")
    if not fails:
        ok(f"{name}: {n_stop} stop-string requests end where the reference has the stop string")


def sampled(srv):
    """answers that depend on the sampler, penalties, bias and logprobs (compared across servers)"""
    out = []
    for p in LONG:  # twice: the second finds the prompt in the prefix cache
        out += [complete(srv, body(p))["choices"][0]["text"] for _ in range(2)]
    for i, p in enumerate(PROMPTS + LONG):
        js = complete(srv, {"prompt": p, "max_tokens": 30, "temperature": 0.8, "top_p": 0.95, "seed": 1000 + i})
        out.append(js["choices"][0]["text"])
        js = complete(srv, body(p, frequency_penalty=0.5, presence_penalty=0.3, logit_bias={"5": -3}))
        out.append(js["choices"][0]["text"])
        js = complete(srv, body(p, max_tokens=16, logprobs=2))
        lp = js["choices"][0]["logprobs"]
        out.append((js["choices"][0]["text"], lp["tokens"], [round(x, 4) for x in lp["token_logprobs"]]))
    return out


# -b 32: a step of 64 rows or more sums attention in f32 (TN_ATTN_F32_ROWS), so 8 prompts
# prefilled together round differently from `tern generate`'s one-prompt prefill, with or without
# --spec (no --spec, default -b 512: 3 of 48 texts differed); speculation itself never takes a
# step across 64 rows (tn_spec_cfg.rows_cap, test_serve_sched)
B32 = ["-b", "32"]
plain = Server(tern, model, os.path.join(tmp, "plain"), "-np", "8", *B32)
try:
    want_sampled = sampled(plain)
finally:
    check(plain.stop() == 0, "server without --spec: clean exit")

for name, args in (("adaptive", ["--spec", "ngram"]), ("fixed 4", ["--spec", "ngram", "--spec-fixed", "4"]),
                   ("draft-min = draft-max = 8", ["--spec", "ngram", "--draft-max", "8", "--draft-min", "8"]),
                   ("draft self", ["--draft", model]), ("draft-q4_0 fixed 4", ["--draft", DRAFT_Q4, "--spec-fixed", "4"])):
    # the step pause makes a step's rows nearly free in the cost model, so the adaptive length speculates
    srv = Server(tern, model, os.path.join(tmp, name.replace(" ", "_")), "-np", "8", "--metrics", "--debug-step-delay", "1", *B32, *args)
    try:
        greedy_checks(srv, name)
        got = sampled(srv)
        diff = [i for i, (a, b) in enumerate(zip(got, want_sampled)) if a != b]
        check(not diff, f"{name}: seeded sampling, penalties + logit_bias, logprobs equal the server without --spec"
              + (f" (differ: {diff[:4]}: {got[diff[0]]!r} vs {want_sampled[diff[0]]!r})" if diff else ""))
        m = srv.wait_idle()
        d, a = m["tern_spec_drafted_total"], m["tern_spec_accepted_total"]
        check(0 < a <= d, f"{name}: {int(a)} of {int(d)} drafted tokens accepted")
        check(abs(m["tern_spec_acceptance_ratio"] - a / d) < 1e-5, f"{name}: acceptance ratio gauge = accepted / drafted")
        cnt, s = m["tern_spec_length_count"], m["tern_spec_length_sum"]
        check(s == d and m['tern_spec_length_bucket{le="+Inf"}'] == cnt and cnt > 0,
              f"{name}: length histogram: sum {int(s)} = drafted, {int(cnt)} decoding rows")
        le = [m[f'tern_spec_length_bucket{{le="{b}"}}'] for b in (0, 1, 2, 4, 8, 16, 32)]
        check(le == sorted(le) and le[-1] == cnt, f"{name}: length buckets cumulative")
        gen, steps = m["tern_generation_tokens_total"], m["tern_engine_steps_total"]
        check(gen > 0 and steps > 0, f"{name}: {int(gen)} tokens in {int(steps)} steps")
        srv.end_clean()
    finally:
        if srv.proc.poll() is None:
            srv.kill()

# --draft-p-min on the shipped default model (a trained one: the tiny random model is never sure of
# a token), drafting with itself: the same greedy text, fewer tokens drafted than without it, some
DEFAULT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "models", "tern-default.gguf")
KJV = "And God said, Let there be light: and there was light. And God saw the light"
want = subprocess.run([tern, "generate", "-m", DEFAULT, "-p", KJV, "-n", "48", "--temp", "0", "-t", "1", "--ignore-eos",
                       "--no-display-prompt"], capture_output=True, timeout=120, check=True).stdout.decode()[:-1]
drafted = []
for pmin in ("0", "0.3"):
    srv = Server(tern, DEFAULT, os.path.join(tmp, "pmin" + pmin), "--metrics", "--draft", DEFAULT, "--spec-fixed", "4",
                 "--draft-p-min", pmin)
    try:
        st, js = srv.post("/v1/completions", {"prompt": KJV, "max_tokens": 48, "temperature": 0, "ignore_eos": True})
        check(st == 200 and js["choices"][0]["text"] == want, f"--draft-p-min {pmin}: greedy text equals tern generate's")
        m = srv.wait_idle()
        drafted.append(m["tern_spec_drafted_total"])
        srv.end_clean()
    finally:
        if srv.proc.poll() is None:
            srv.kill()
check(0 < drafted[1] < drafted[0], f"--draft-p-min 0.3: {int(drafted[1])} tokens drafted, {int(drafted[0])} without it")

# without --spec the metrics carry no speculation series
srv = Server(tern, model, os.path.join(tmp, "nospec"), "--metrics")
try:
    check(not any(k.startswith("tern_spec_") for k in srv.metrics()), "without --spec: no tern_spec_* series")
finally:
    srv.stop()
finish()
