#!/usr/bin/env python3
"""fault_test.py TERN MODEL TMP — allocation failures while serving (robustness.md §4.4 F1).
The server runs with --debug-fail-alloc, which honours `X-Tern-Fail-Alloc: N[,persistent]`: the
N-th allocation through tern's allocator (the server's own and jansson's) after the request
arrives fails. For every N in a sweep over each kind of request, the answer must be a complete
200 or an OpenAI-shaped 500 `server_error` (streams: a final error event), never a crash, a hang
or a malformed body; the server keeps serving, releases every KV block, and exits 0 on SIGTERM
(in the ASan build LeakSanitizer then also proves nothing leaked). A second signal during the
drain (requests still running) cancels them and exits 130 at once, LeakSanitizer clean as well."""
import json
import signal, threading, time, os, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_lib import Server, bad, check, finish

tern, model, tmp = sys.argv[1:4]
CHAT, COMPL = "/v1/chat/completions", "/v1/completions"
MSG = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
CASES = [  # name, method, path, body
    ("chat stream n=2 logprobs", "POST", CHAT,
     {"messages": MSG, "n": 2, "max_tokens": 2, "stream": True, "logprobs": True, "top_logprobs": 1,
      "stream_options": {"include_usage": True}, "stop": ["zz"]}),
    ("completion n=2 logprobs", "POST", COMPL, {"prompt": "once upon a time", "n": 2, "max_tokens": 2, "logprobs": 1}),
    ("chat", "POST", CHAT, {"messages": MSG, "max_tokens": 2, "logit_bias": {"5": -100}, "presence_penalty": 1}),
    ("tokenize", "POST", "/tokenize", {"content": "hello world", "with_pieces": True}),
    ("tokenize chat", "POST", "/tokenize", {"messages": MSG}),
    ("detokenize", "POST", "/detokenize", {"tokens": [1, 50, 100, 200]}),
    ("metrics", "GET", "/metrics", None),
]
MAX_N = 3000  # more allocations than any of these requests makes
CLEAN_RUN = 12  # this many complete answers in a row after the last failure: every allocation was failed once


def verdict(path, body, st, raw):
    """'ok', 'oom' or a description of what is wrong."""
    try:
        return verdict1(path, body, st, raw)
    except (ValueError, KeyError, TypeError, IndexError) as e:
        return f"malformed answer ({e}): {raw[:600]!r}"


def verdict1(path, body, st, raw):
    if st == 500:
        try:
            e = json.loads(raw)["error"]
            return "oom" if e["type"] == "server_error" and e["code"] == 500 else f"500 body {raw[:200]!r}"
        except (ValueError, KeyError, TypeError):
            return f"500 body {raw[:200]!r}"
    if st != 200:
        return f"status {st}: {raw[:200]!r}"
    if path == "/metrics":
        return "ok" if b"tern_requests_running" in raw and raw.endswith(b"\n") else "metrics truncated"
    if body.get("stream"):
        events = [e for e in raw.decode().split("\n\n") if e.strip() and not e.startswith(":")]
        if events and events[-1] == "data: [DONE]":
            n = sum(1 for e in events[:-1] if json.loads(e[6:]).get("choices") and json.loads(e[6:])["choices"][0]["finish_reason"])
            return "ok" if n == body["n"] else f"stream ended with {n} finished choices"
        try:
            e = json.loads(events[-1][6:])["error"]
            return "oom" if e["code"] == 500 else f"stream error {e}"
        except (IndexError, ValueError, KeyError):
            return f"stream cut short: {raw[-200:]!r}"
    try:
        d = json.loads(raw)
    except ValueError:
        return f"200 with a bad body {raw[:200]!r}"
    if "choices" in body or path in (CHAT, COMPL):
        good = len(d["choices"]) == body.get("n", 1) and all(c["finish_reason"] for c in d["choices"])
        return "ok" if good else f"incomplete answer {d}"
    if path == "/tokenize":
        return "ok" if d["count"] == len(d["tokens"]) > 0 else f"tokenize {d}"
    return "ok" if "content" in d else f"detokenize {d}"


with Server(tern, model, tmp, "-np", "2", "--metrics", "--debug-fail-alloc") as srv:
    for name, method, path, body in CASES:
        n_ok = n_oom = run = 0
        wrong = []
        for n in range(1, MAX_N + 1):
            try:
                st, raw, _ = srv.request(method, path, body, {"X-Tern-Fail-Alloc": str(n)}, timeout=30)
                v = verdict(path, body or {}, st, raw)
            except OSError as e:
                v = f"connection: {e}"
            if v == "ok":
                n_ok += 1
                run += 1
            elif v == "oom":
                n_oom += 1
                run = 0
            else:
                wrong.append(f"N={n}: {v}")
                run = 0
            if n % 50 == 0 and srv.health() != 200:
                wrong.append(f"N={n}: /health failed")
                break
            if run == CLEAN_RUN:
                break
        check(not wrong and n_oom > 0 and run == CLEAN_RUN,
              f"{name}: allocations 1..{n} failed in turn -> {n_oom} clean 500s, {n_ok} complete answers"
              + (f"; wrong: {wrong[:3]}" if wrong else ""))
    # persistent failure from the N-th allocation on, then recovery
    body = CASES[0][3]
    wrong = []
    for n in (1, 3, 10, 40, 120):
        try:
            st, raw, _ = srv.request("POST", CHAT, body, {"X-Tern-Fail-Alloc": f"{n},persistent"}, timeout=30)
            v = verdict(CHAT, body, st, raw)
        except OSError as e:
            v = f"connection: {e}"
        if v not in ("ok", "oom"):
            wrong.append(f"N={n}: {v}")
    # the injected failure lasts until the server closes that request (libmicrohttpd's completion
    # callback), which can come just after the client has read the whole answer: a request sent in
    # that window may still fail (cleanly, 500); service must resume within a few seconds
    for _ in range(100):
        st, d = srv.post(CHAT, {"messages": MSG, "n": 2, "max_tokens": 4})
        if st != 500:
            break
        time.sleep(0.05)
    check(not wrong and st == 200 and len(d["choices"]) == 2, f"persistent failures answered cleanly, then service resumes ({wrong[:2]})")
    m = srv.wait_idle()
    check(m["tern_requests_running"] == 0 and m["tern_kv_blocks_used"] == 0 and m["tern_kv_blocks_reserved"] == 0,
          f"idle afterwards: nothing running, no KV block held (failed requests counted: {m['tern_requests_failed_total']:.0f})")
    rc = srv.stop()
    check(rc == 0, f"SIGTERM exit {rc} (LeakSanitizer clean in the ASan build)")
    if rc != 0:
        srv.log.seek(0)
        print(srv.log.read()[-3000:])

# SIGTERM, then SIGINT once the drain has begun, while 16 clients keep the engine busy: every request
# cancelled, exit 130 (the library returns it; the process is not cut short, so LeakSanitizer runs).
# Where the drain ends before the second signal is read (an idle moment between requests) the exit is
# a clean 0: tried again, up to 3 servers.
outcomes = []
for attempt in range(3):
    with Server(tern, model, os.path.join(tmp, f"second{attempt}"), "-np", "4") as s2:
        stop = threading.Event()

        def client():
            while not stop.is_set():
                try:
                    s2.post(COMPL, {"prompt": "hi", "max_tokens": 100, "ignore_eos": True}, timeout=10)
                except OSError:
                    pass
        ths = [threading.Thread(target=client) for _ in range(16)]
        for t in ths:
            t.start()
        time.sleep(0.5)
        s2.proc.send_signal(signal.SIGTERM)
        log = ""
        for _ in range(200):
            s2.log.seek(0)
            log = s2.log.read()
            if "draining" in log:
                break
            time.sleep(0.005)
        s2.proc.send_signal(signal.SIGINT)
        try:
            rc2 = s2.proc.wait(timeout=30)
        except Exception:
            rc2 = None
        stop.set()
        for t in ths:
            t.join()
        s2.log.seek(0)
        log = s2.log.read()
        outcomes.append(rc2)
        if rc2 != 0:
            break
check(outcomes[-1] == 130 and all(r == 0 for r in outcomes[:-1]) and "second signal: cancelling" in log
      and "cancelled; bye" in log, f"a second signal during the drain: exit {outcomes} (130: every request cancelled)")
if outcomes[-1] != 130:
    print(log[-3000:])
finish()
