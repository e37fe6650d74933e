#!/usr/bin/env python3
"""soak_test.py TERN MODEL TMP [ROUNDS] — a short soak of tern serve with disconnects
(robustness.md §4.5 L4, §3.1 "RSS flat after warm-up", §4.2 H20).

Every round drives a mix of requests against a 4-slot server:
  - saturation: 4 long streams fill every slot; 3 requests queue behind them and their clients
    disconnect while queued; 2 of the streams are dropped mid-stream (after their first tokens),
    the other 2 read to the end;
  - a pool of 6 clients runs normal completions (n 1..3, logprobs, penalties, stop strings), chat
    completions (streaming with usage, and not), requests whose connection is reset right after the
    body was sent, invalid requests (400), tokenize and metrics scrapes.
After each round the server must go idle: /health ok, nothing running or waiting, no KV block held
or reserved (tern_kv_blocks_used / tern_kv_blocks_reserved 0). Then its RSS (/proc/PID/status
VmRSS) and open descriptors are sampled.

Asserted at the end:
  - memory flat after warm-up: the smallest RSS of the last 3 rounds exceeds the largest RSS of
    rounds 1-3 (round 0 is warm-up: malloc arenas and cached stacks of connection threads, prefix
    cache, first-touch pages) by at most max(1 MiB, 2 %). The server runs with MALLOC_ARENA_MAX=2;
    seen without a leak: +12..+32 KiB, plus an occasional one-off step of ~300 KiB (a new peak of
    concurrent connection threads), which the minimum over the last rounds absorbs. A round is ~360
    requests and the two windows are >= 6 rounds apart, so a leak of ~500 bytes on every request
    fails it; checked by hand: leaking 1 KiB per completion request gave +2236 KiB, leaking the
    request object of non-streamed answers +1704 KiB. Under ASan the RSS is not judged (its
    allocator keeps per-thread state for every connection thread); the server's clean exit under
    LeakSanitizer is checked instead;
  - descriptors flat: no more open fds than after round 1 (+2 of slack for a connection closing);
  - /metrics consistent with what the clients saw: tern_request_success_total == answers the
    clients read completely; every mid-stream drop is counted in tern_requests_cancelled_total,
    which is at most the number of requests the clients abandoned; no failed request, no 429.
"""
import json, os, random, socket, struct, sys, threading, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_lib import Server, bad, check, finish, ok

tern, model, tmp = sys.argv[1:4]
ROUNDS = int(sys.argv[4]) if len(sys.argv) > 4 else 12
PASSES = 3  # saturation + 112 mixed requests, per round
CHAT, COMPL = "/v1/chat/completions", "/v1/completions"
WORDS = "the cat sat on a mat while old kings spoke of time and rain in quiet towns".split()


class Tally:
    def __init__(self):
        self.mu = threading.Lock()
        self.complete = 0      # answers read to their end (non-stream 200, or stream up to [DONE])
        self.dropped = 0       # streams dropped mid-stream after their first tokens: certainly cancelled
        self.abandoned = 0     # all requests the client gave up on (dropped, queued, reset)
        self.invalid = 0
        self.errors = []

    def add(self, **kw):
        with self.mu:
            for k, v in kw.items():
                setattr(self, k, getattr(self, k) + v)

    def error(self, msg):
        with self.mu:
            self.errors.append(msg)


T = Tally()


def raw_post(port, path, body):
    """A socket with a POST sent (keep-alive off)."""
    data = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
              b"Content-Length: %d\r\n\r\n" % (path.encode(), len(data)) + data)
    return s


def reset(s):
    """Close with RST (SO_LINGER 0), as a crashed client would."""
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


def read_until(s, marker, limit=1 << 20):
    buf = b""
    while marker not in buf and len(buf) < limit:
        k = s.recv(65536)
        if not k:
            break
        buf += k
    return buf


def prompt(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


def long_stream(srv, rng):
    return raw_post(srv.port, COMPL, {"prompt": prompt(rng, 6), "max_tokens": 100, "ignore_eos": True, "stream": True,
                                      "temperature": 0.7})


def saturate(srv, rng):
    """4 long streams hold every slot; 3 requests queue and leave; 2 streams leave mid-way."""
    streams = [long_stream(srv, rng) for _ in range(4)]
    for s in streams:  # every slot is busy once each stream has sent a token
        if b"data: " not in read_until(s, b"data: "):
            T.error("saturation stream sent no data")
    queued = [raw_post(srv.port, CHAT if i % 2 else COMPL,
                       {"messages": [{"role": "user", "content": prompt(rng, 4)}], "prompt": prompt(rng, 4),
                        "max_tokens": 50, "ignore_eos": True, "n": 1 + i % 2}) for i in range(3)]
    time.sleep(0.06)  # they reach the queue (4 slots busy)
    for s in queued:
        s.close() if rng.random() < 0.5 else reset(s)
    for s in streams[:2]:
        reset(s)
    for s in streams[2:]:
        buf = read_until(s, b"\r\n0\r\n\r\n")  # the last chunk of the chunked response
        s.close()
        if buf.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n"):
            T.add(complete=1)
        else:
            T.error(f"saturation stream did not finish: {buf[-200:]!r}")
    T.add(dropped=2, abandoned=5)


def one_request(srv, rng, k):
    kind = k % 8
    try:
        if kind in (0, 1):  # completions with n, logprobs, penalties, stop
            n = 1 + k % 3
            st, d = srv.post(COMPL, {"prompt": prompt(rng, 3 + k % 9), "max_tokens": 8 + k % 8, "n": n, "logprobs": k % 3,
                                     "presence_penalty": 0.5 * (k % 3), "stop": ["zz", "q"], "temperature": 0.8})
            good = st == 200 and len(d["choices"]) == n
        elif kind in (2, 3):  # chat, streaming with usage or not
            body = {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": prompt(rng, 5)}],
                    "max_tokens": 6 + k % 10, "n": 1 + k % 2, "logprobs": bool(k % 2), "top_logprobs": k % 2 * 3}
            if kind == 3:
                st, evs, done = srv.stream(CHAT, {**body, "stream": True, "stream_options": {"include_usage": True}})
                good = st == 200 and done and evs[-1]["usage"]["completion_tokens"] > 0
            else:
                st, d = srv.post(CHAT, body)
                good = st == 200 and d["usage"]["completion_tokens"] > 0
        elif kind == 4:  # body sent, then the connection is reset
            s = raw_post(srv.port, COMPL, {"prompt": prompt(rng, 4), "max_tokens": 80, "ignore_eos": True})
            time.sleep(rng.random() * 0.01)
            reset(s)
            T.add(abandoned=1)
            return
        elif kind == 5:  # invalid
            st, d = srv.post(CHAT, {"messages": "hi"} if k % 2 else {"messages": [{"role": "user", "content": "x"}], "n": 99})
            if st != 400:
                T.error(f"invalid request got {st}")
            T.add(invalid=1)
            return
        elif kind == 6:
            st, d = srv.post("/tokenize", {"content": prompt(rng, 8), "with_pieces": True})
            if st != 200:
                T.error(f"tokenize {st}")
            return
        else:
            srv.metrics()
            return
        if good:
            T.add(complete=1)
        else:
            T.error(f"request kind {kind}: {st}")
    except (OSError, ValueError, KeyError) as e:
        T.error(f"request kind {kind}: {e!r}")


def mixed(srv, rng, n_requests, n_clients=6):
    todo = list(range(n_requests))
    rng.shuffle(todo)
    lock = threading.Lock()

    def client(seed):
        r = random.Random(seed)
        while True:
            with lock:
                if not todo:
                    return
                k = todo.pop()
            one_request(srv, r, k)

    ths = [threading.Thread(target=client, args=(rng.random(),)) for _ in range(n_clients)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()


rng = random.Random(1234)
# MALLOC_ARENA_MAX=2: RSS then reflects the server's memory, not how many of glibc's 8 x cores malloc
# arenas a round's peak of connection threads happened to touch (+68..+464 KiB of steps without it).
# Under ASan: a small quarantine, or the server's RSS climbs to ASan's 256 MiB default.
env = {**os.environ, "MALLOC_ARENA_MAX": "2",
       "ASAN_OPTIONS": os.environ.get("ASAN_OPTIONS", "detect_leaks=1") + ":quarantine_size_mb=32"}
with Server(tern, model, tmp, "-np", "4", "--max-queue", "64", "--metrics", "--debug-step-delay", "1", env=env) as srv:
    rss, fds = [], []
    t0 = time.time()
    for rnd in range(ROUNDS):
        for _ in range(PASSES):
            saturate(srv, rng)
            mixed(srv, rng, 112)
        m = srv.wait_idle()
        idle = (m["tern_requests_running"] == 0 and m["tern_requests_waiting"] == 0 and m["tern_kv_blocks_used"] == 0
                and m["tern_kv_blocks_reserved"] == 0)
        if not idle or srv.health() != 200:
            bad(f"round {rnd}: not idle/healthy: running {m['tern_requests_running']} waiting {m['tern_requests_waiting']} "
                f"kv used {m['tern_kv_blocks_used']} reserved {m['tern_kv_blocks_reserved']}")
        time.sleep(0.2)  # connection threads exit
        rss.append(srv.rss_kib())
        fds.append(srv.n_fds())
        print(f"round {rnd}: RSS {rss[-1]} KiB, {fds[-1]} fds, {T.complete} complete, {T.abandoned} abandoned, "
              f"{time.time() - t0:.1f} s", flush=True)
    m = srv.metrics()
    success = m['tern_request_success_total{finished_reason="stop"}'] + m['tern_request_success_total{finished_reason="length"}']
    cancelled = m["tern_requests_cancelled_total"]
    check(not T.errors, f"every request answered as expected ({len(T.errors)} wrong: {T.errors[:3]})")
    check(success == T.complete, f"tern_request_success_total {success:.0f} == answers read completely {T.complete}")
    check(T.dropped <= cancelled <= T.abandoned,
          f"cancellations: {T.dropped} dropped mid-stream <= tern_requests_cancelled_total {cancelled:.0f} <= {T.abandoned} abandoned")
    check(m["tern_requests_failed_total"] == 0 and m['tern_requests_rejected_total{reason="queue_full"}'] == 0,
          "no failed request, no 429")
    check(m['tern_requests_rejected_total{reason="invalid"}'] == T.invalid, f"{T.invalid} invalid requests counted")
    base, last = max(rss[1:4]), min(rss[-3:])  # a leak grows every round; a one-off step does not
    margin = max(1024, base // 50)
    msg = (f"RSS flat after warm-up: rounds 1-3 max {base} KiB, last 3 min {last} KiB (+{last - base} KiB, bound {margin} KiB); "
           f"per round {rss}")
    if srv.sanitized():  # ASan keeps allocator and thread state per connection thread: RSS creeps without a leak
        ok("ASan build: RSS not judged (LeakSanitizer checks at exit); " + msg)
    else:
        check(last - base <= margin, msg)
    check(max(fds[1:]) <= fds[1] + 2, f"open descriptors flat: {fds}")
    rc = srv.stop()
    check(rc == 0, f"SIGTERM exit {rc}")
finish()
