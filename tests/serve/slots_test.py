#!/usr/bin/env python3
"""slots_test.py TERN TINY TMP — llama-server's slot API in tern serve (--slot-save-path DIR):
  - GET /slots lists --parallel slots (id, n_ctx, is_processing, the tokens held: compared with
    /tokenize of the prompt);
  - save -> erase -> restore: after the erase the prompt is recomputed (cached_tokens 0), after the
    restore the next completion reports the file's whole blocks of the prompt as cached
    (min(n_restored, 16 * floor((n_prompt - 1) / 16)), computed here) and its greedy text equals
    `tern generate --temp 0` without any cache (an independent path); n_written / n_read equal the
    file's size on disk (timings.cache_n / prompt_n agree); a prompt extending every restored
    token reuses all of them and equals the same prompt recomputed after erasing every slot; a
    new server (another process) restores the file with the same result; the same with a q8_0 KV
    cache and a q4_0 one on a tiny qwen3;
  - refusals, each with its status and a message naming the problem, the server serving the same
    text afterwards: bad file names (400), no such file (404), a bit-flipped and a truncated file
    (400 naming the CRC / size), another model's file (400 "another model"), a q8_0-cache file on
    an f16 server and a rotated q8_0 one on an unrotated q8_0 server (400 naming the types), a bad slot id or action (400), actions on a busy slot
    (409), a server without --slot-save-path (501, as llama-server)."""
import json, os, shutil, subprocess, sys, threading, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_lib import Server, check, finish

tern, tiny, tmp = sys.argv[1:4]
shutil.rmtree(tmp, ignore_errors=True)
os.makedirs(tmp)
N = 12
PROMPT = "the little dog ran to the park and saw a big red ball under the old tree"  # ~80 tokens of 128


def run(args, timeout=180):
    return subprocess.run([tern, *args], capture_output=True, timeout=timeout)


def generate(model, prompt, *extra):
    r = run(["generate", "-m", model, "-p", prompt, "-n", str(N), "--temp", "0", "-t", "1", "--ignore-eos",
             "--no-display-prompt", *extra])
    assert r.returncode == 0, r.stderr
    return r.stdout[:-1].decode("utf-8", "replace")


def ask(srv, prompt=PROMPT, max_tokens=N):
    st, body = srv.post("/v1/completions", {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True})
    check(st == 200, f"completion status {st}")
    cached = body["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)
    tm = body.get("timings", {})
    check(tm.get("cache_n") == cached and tm.get("prompt_n") == body["usage"]["prompt_tokens"] - cached,
          f"timings: cache_n {tm.get('cache_n')}, prompt_n {tm.get('prompt_n')} computed")
    return body["choices"][0]["text"], cached


def slots(srv, query=""):
    st, raw, _ = srv.request("GET", "/slots" + query)
    return st, json.loads(raw)


def act(srv, sid, action, filename=None, raw_body=None):
    body = raw_body if raw_body is not None else ({} if filename is None else {"filename": filename})
    return srv.post(f"/slots/{sid}?action={action}", body)


def err_msg(body):
    return body.get("error", {}).get("message", "") if isinstance(body, dict) else str(body)


def refused(res, status, words, what):
    st, body = res
    msg = err_msg(body)
    check(st == status and all(w in msg for w in words), f"{what}: {st} {msg!r}")


def save_erase_restore(srv, ref, n_prompt, what, fname):
    """The full cycle on slot 0 after one request; returns the saved file's path."""
    text, cached = ask(srv)
    check(text == ref and cached == 0, f"{what}: first answer equals tern generate, nothing cached ({cached})")
    st, sl = slots(srv)
    held = [s for s in sl if s["n_tokens"] > 0]
    check(st == 200 and len(held) == 1 and held[0]["tokens"][:n_prompt] == toks and not held[0]["is_processing"],
          f"{what}: GET /slots: one idle slot holds the prompt's {n_prompt} tokens (+ generated: {held[0]['n_tokens'] if held else 0})")
    sid, n_held = held[0]["id"], held[0]["n_tokens"]
    st, sv = act(srv, sid, "save", fname)
    path = os.path.join(srv.slot_dir, fname)
    check(st == 200 and sv["id_slot"] == sid and sv["filename"] == fname and sv["n_saved"] == n_held // 16 * 16
          and sv["n_written"] == os.path.getsize(path) and sv["timings"]["save_ms"] >= 0,
          f"{what}: save: {sv}, {n_held // 16 * 16} tokens expected, file {os.path.getsize(path) if os.path.exists(path) else -1} bytes")
    st, er = act(srv, sid, "erase")
    check(st == 200 and er == {"id_slot": sid, "n_erased": n_held}, f"{what}: erase: {er}")
    text, cached = ask(srv)
    check(text == ref and cached == 0, f"{what}: after the erase the prompt is recomputed ({cached} cached), same text")
    for s in slots(srv)[1]:  # forget that request's blocks too: the restore alone must bring them back
        act(srv, s["id"], "erase")
    st, rs = act(srv, 0, "restore", fname)
    check(st == 200 and rs["id_slot"] == 0 and rs["filename"] == fname and rs["n_restored"] == sv["n_saved"]
          and rs["n_read"] == os.path.getsize(path) and rs["timings"]["restore_ms"] >= 0, f"{what}: restore: {rs}")
    st, sl = slots(srv)
    check(sl[0]["n_tokens"] == rs["n_restored"] and sl[0]["tokens"] == held[0]["tokens"][:rs["n_restored"]],
          f"{what}: GET /slots: slot 0 holds the file's {rs['n_restored']} tokens")
    text, cached = ask(srv)
    want = min(rs["n_restored"], (n_prompt - 1) // 16 * 16)
    check(text == ref and cached == want and want > 0,
          f"{what}: after the restore: same text as tern generate, {cached} prompt tokens cached (expected {want})")
    # a prompt that extends every restored token (the conversation goes on): all of them are reused,
    # and the text equals the same prompt computed from scratch once every slot is erased
    ext = held[0]["tokens"][:rs["n_restored"]] + toks[1:9]
    text1, cached1 = ask(srv, ext)
    for s in slots(srv)[1]:
        act(srv, s["id"], "erase")
    text2, cached2 = ask(srv, ext)
    check(cached1 == rs["n_restored"] and cached2 == 0 and text1 == text2,
          f"{what}: a prompt extending the restored tokens reuses all {cached1} of them, same text as recomputed ({cached2} cached)")
    return path


probe = run(["generate", "-m", tiny, "-p", "x", "-n", "1", "--prompt-cache", os.path.join(tmp, "probe")])
if probe.returncode == 64 and b"without libzstd" in probe.stderr:
    print("SKIP: this tern was built without libzstd (slot files are zstd-compressed)")
    sys.exit(77)

# ---- the tiny model (f16 KV) ----------------------------------------------------------------------
ref = generate(tiny, PROMPT)
dirA = os.path.join(tmp, "slotsA")
with Server(tern, tiny, os.path.join(tmp, "a"), "-np", "2", "--metrics", "--slot-save-path", dirA) as srv:
    srv.slot_dir = dirA
    st, tk = srv.post("/tokenize", {"prompt": PROMPT})
    toks = tk["tokens"]
    n_prompt = len(toks)
    check(40 < n_prompt < 100, f"the prompt is {n_prompt} tokens (several blocks)")
    st, sl = slots(srv)
    check(st == 200 and [s["id"] for s in sl] == [0, 1] and all(not s["is_processing"] and s["n_tokens"] == 0 and s["n_ctx"] > 0 for s in sl),
          f"GET /slots: 2 idle empty slots ({[(s['id'], s['n_ctx'], s['n_tokens']) for s in sl]})")
    path = save_erase_restore(srv, ref, n_prompt, "f16", "a.bin")

    # refusals; the server keeps serving
    for name in ("../a.bin", "x/a.bin", "..", "", ".hidden", "a\\b"):
        refused(act(srv, 0, "restore", name), 400, ["Invalid filename"], f"file name {name!r}")
    refused(act(srv, 0, "save", raw_body={"file": "a.bin"}), 400, ["filename"], "no filename")
    refused(act(srv, 0, "save", raw_body={"filename": 7}), 400, ["filename"], "a number as filename")
    refused(act(srv, 0, "restore", "missing.bin"), 404, ["missing.bin", "no such file"], "no such file")
    refused(act(srv, 5, "erase"), 400, ["Invalid slot ID"], "slot 5 of 2")
    refused(srv.post("/slots/x?action=erase", {}), 400, ["Invalid slot ID"], "slot id 'x'")
    refused(act(srv, 0, "bogus"), 400, ["Invalid action"], "action bogus")
    st, _, _ = srv.request("GET", "/slots/0?action=erase")
    check(st == 405, f"GET on /slots/0: {st}")
    data = open(path, "rb").read()
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x10
    open(os.path.join(dirA, "flip.bin"), "wb").write(flipped)
    refused(act(srv, 0, "restore", "flip.bin"), 400, ["CRC"], "a bit-flipped file")
    open(os.path.join(dirA, "trunc.bin"), "wb").write(data[:len(data) - 100])
    refused(act(srv, 0, "restore", "trunc.bin"), 400, ["truncated"], "a truncated file")
    open(os.path.join(dirA, "short.bin"), "wb").write(data[:10])
    refused(act(srv, 0, "restore", "short.bin"), 400, ["size"], "a 10-byte file")
    open(os.path.join(dirA, "junk.bin"), "wb").write(b"\0" * 4096)
    refused(act(srv, 0, "restore", "junk.bin"), 400, ["magic"], "a file of zeros")

    other = os.path.join(tmp, "other.gguf")
    subprocess.run([tern, "synth", "-o", other, "--preset", "tiny", "--type", "q4_0"], check=True, capture_output=True, timeout=120)
    dirB = os.path.join(tmp, "slotsB")
    with Server(tern, other, os.path.join(tmp, "b"), "-np", "1", "--slot-save-path", dirB) as srvb:
        ask(srvb)
        st, sv = act(srvb, 0, "save", "other.bin")
        check(st == 200 and sv["n_saved"] > 0, f"another model saves its slot ({sv})")
        srvb.stop()
    shutil.copy(os.path.join(dirB, "other.bin"), os.path.join(dirA, "other.bin"))
    refused(act(srv, 0, "restore", "other.bin"), 400, ["another model"], "another model's file")
    text, cached = ask(srv)
    check(text == ref, f"after the refusals: the same text ({cached} cached)")
    srv.end_clean()

# ---- a busy slot (one slot, slow steps); no --slot-save-path ----------------------------------------
dirC = os.path.join(tmp, "slotsC")
with Server(tern, tiny, os.path.join(tmp, "c"), "-np", "1", "--debug-step-delay", "25", "--metrics", "--slot-save-path", dirC) as srv:
    shutil.copy(path, os.path.join(dirC, "a.bin"))
    st, rs = act(srv, 0, "restore", "a.bin")  # another process than the one that saved it
    text, cached = ask(srv)
    check(st == 200 and text == ref and cached == min(rs["n_restored"], (n_prompt - 1) // 16 * 16) > 0,
          f"a new server restores the file: {cached} tokens cached, the text of tern generate")
    act(srv, 0, "erase")
    out = {}
    th = threading.Thread(target=lambda: out.update(r=ask(srv, max_tokens=80)))
    th.start()
    t0 = time.time()
    while time.time() - t0 < 30 and not slots(srv)[1][0]["is_processing"]:
        time.sleep(0.01)
    st, sl = slots(srv, "?fail_on_no_slot=1")
    check(st == 503, f"GET /slots?fail_on_no_slot=1 with the only slot busy: {st}")
    for a in ("restore", "save", "erase"):
        refused(act(srv, 0, a, "a.bin"), 409, ["slot 0 is processing"], f"{a} on a busy slot")
    th.join()
    check(out.get("r") is not None, "the running request finished")
    st, rs = act(srv, 0, "restore", "a.bin")
    check(st == 200 and rs["n_restored"] > 0, f"restore once the slot is idle ({rs})")
    text, cached = ask(srv)
    check(text == ref and cached > 0, f"then the same text with {cached} tokens cached")
    srv.end_clean()
with Server(tern, tiny, os.path.join(tmp, "d"), "-np", "1") as srv:
    for a in ("save", "restore", "erase"):
        refused(act(srv, 0, a, "a.bin"), 501, ["--slot-save-path"], f"{a} without --slot-save-path")
    st, sl = slots(srv)
    check(st == 200 and len(sl) == 1, "GET /slots works without --slot-save-path")
    check(ask(srv)[0] == ref, "and the server serves")

# ---- a q8_0 KV cache (tiny qwen3: head size 32) -----------------------------------------------------
qwen = os.path.join(tmp, "qwen3.gguf")
subprocess.run([tern, "synth", "-o", qwen, "--arch", "qwen3", "--preset", "tiny", "--type", "q8_0"], check=True,
               capture_output=True, timeout=120)
for ct in ("q8_0", "q4_0"):
    refq = generate(qwen, PROMPT, "-ctk", ct, "-ctv", ct)
    dirE = os.path.join(tmp, "slotsE-" + ct)
    with Server(tern, qwen, os.path.join(tmp, "e-" + ct), "-np", "2", "--metrics", "-ctk", ct, "-ctv", ct, "--slot-save-path", dirE) as srv:
        srv.slot_dir = dirE
        st, tk = srv.post("/tokenize", {"prompt": PROMPT})
        toks = tk["tokens"]
        pq = save_erase_restore(srv, refq, len(toks), f"{ct} KV", "q.bin")
        if ct == "q8_0":
            pathq = pq
        srv.end_clean()
dirF = os.path.join(tmp, "slotsF")
with Server(tern, qwen, os.path.join(tmp, "f"), "-np", "1", "--slot-save-path", dirF) as srv:
    shutil.copy(pathq, os.path.join(dirF, "q.bin"))
    refused(act(srv, 0, "restore", "q.bin"), 400, ["q8_0", "f16"], "a q8_0-cache file on an f16-cache server")
    check(ask(srv)[0] == generate(qwen, PROMPT), "that server serves")
# the q8_0 file's keys are rotated (--kv-rotate auto): a q8_0 server that does not rotate refuses it
dirG = os.path.join(tmp, "slotsG")
with Server(tern, qwen, os.path.join(tmp, "g"), "-np", "1", "-ctk", "q8_0", "-ctv", "q8_0", "--kv-rotate", "none",
            "--slot-save-path", dirG) as srv:
    shutil.copy(pathq, os.path.join(dirG, "q.bin"))
    refused(act(srv, 0, "restore", "q.bin"), 400, ["q8_0 rotated", "q8_0/q8_0"], "a rotated q8_0 file on an unrotated q8_0 server")
r = run(["serve", "-m", tiny, "--slot-save-path", os.path.join(tmp, "a", "serve.log")])
check(r.returncode == 64 and b"not a directory" in r.stderr, f"--slot-save-path on a file: exit {r.returncode}")
finish()
