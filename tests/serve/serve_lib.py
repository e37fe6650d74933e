"""serve_lib.py — helpers for the Python integration tests of tern serve (the bash ones use lib.sh):
start a server on a free loopback port (--port 0; the port is read from its log), JSON and SSE
requests, /metrics parsing, the server's RSS and open descriptors, and a pass/fail tally.
The server is always stopped (SIGTERM, then SIGKILL) when the test ends."""
import http.client, json, os, re, signal, subprocess, sys, time

FAILS = 0


def ok(msg):
    print("ok: " + msg, flush=True)


def bad(msg):
    global FAILS
    FAILS += 1
    print("FAIL: " + msg, flush=True)


def check(cond, msg):
    (ok if cond else bad)(msg)
    return cond


def finish():
    print("all passed" if not FAILS else f"{FAILS} failure(s)")
    sys.exit(1 if FAILS else 0)


def complete_all(url, prompts, max_tokens):
    """Greedy /v1/completions texts of prompts, all requests sent at once (one thread each)."""
    import threading, urllib.request
    res = [None] * len(prompts)

    def one(i, p):
        body = json.dumps({"prompt": p, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}).encode()
        req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
        res[i] = json.load(urllib.request.urlopen(req, timeout=120))["choices"][0]["text"]

    ths = [threading.Thread(target=one, args=(i, p)) for i, p in enumerate(prompts)]
    for t in ths: t.start()
    for t in ths: t.join()
    return res


class Server:
    def __init__(self, tern, model, tmp, *args, env=None):
        os.makedirs(tmp, exist_ok=True)
        self.log_path = os.path.join(tmp, "serve.log")
        self.log = open(self.log_path, "w+")
        # TERN_SERVE_ARGS: extra flags for every server (scripts/gpu-check.sh: --device cuda)
        extra = os.environ.get("TERN_SERVE_ARGS", "").split()
        self.proc = subprocess.Popen([tern, "serve", "-m", model, "--port", "0", "-t", "1", *extra, *args],
                                     stdout=self.log, stderr=self.log, env=env)
        self.port = None
        for _ in range(600):
            self.log.seek(0)
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", self.log.read())
            if m:
                self.port = int(m.group(1))
                break
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        if not self.port:
            self.log.seek(0)
            print("FAIL: server did not start\n" + self.log.read())
            self.kill()
            sys.exit(1)
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            self.kill()

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def stop(self, timeout=30):
        """SIGTERM; returns the exit code (-9 if it had to be killed)."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return -9

    # ---- requests ----
    def request(self, method, path, body=None, headers=None, timeout=60):
        """(status, body bytes, headers) of one request on a fresh connection."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
            h = {"Content-Type": "application/json", **(headers or {})}
            c.request(method, path, data, h)
            r = c.getresponse()
            return r.status, r.read(), dict(r.getheaders())
        finally:
            c.close()

    def post(self, path, body, headers=None, timeout=60):
        """(status, parsed JSON or raw bytes)."""
        st, raw, _ = self.request("POST", path, body, headers, timeout)
        try:
            return st, json.loads(raw)
        except ValueError:
            return st, raw

    def stream(self, path, body, headers=None, timeout=60):
        """(status, [events as parsed JSON], done) for an SSE request read to its end."""
        st, raw, _ = self.request("POST", path, body, headers, timeout)
        if st != 200:
            return st, raw, False
        events = [e for e in raw.decode().split("\n\n") if e.strip() and not e.startswith(":")]
        done = bool(events) and events[-1] == "data: [DONE]"
        return st, [json.loads(e[6:]) for e in events if e != "data: [DONE]"], done

    def metrics(self, headers=None):
        st, raw, _ = self.request("GET", "/metrics", headers=headers)
        assert st == 200, st
        out = {}
        for line in raw.decode().splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out

    def health(self):
        try:
            return self.request("GET", "/health", timeout=10)[0]
        except OSError:
            return 0

    def wait_idle(self, timeout=10):
        """Waits until nothing runs or waits and no KV block is held; returns the last metrics."""
        t0 = time.time()
        while True:
            m = self.metrics()
            if (m["tern_requests_running"] == 0 and m["tern_requests_waiting"] == 0 and m["tern_kv_blocks_used"] == 0
                    and m["tern_kv_blocks_reserved"] == 0) or time.time() - t0 > timeout:
                return m
            time.sleep(0.02)

    def end_clean(self):
        """Checks that the server is idle with no KV block held and no failed request, then that
        SIGTERM stops it with exit 0 (the closing checks of a feature test)."""
        m = self.wait_idle()
        check(m["tern_kv_blocks_used"] == 0 and m["tern_kv_blocks_reserved"] == 0 and m["tern_requests_failed_total"] == 0,
              "idle: no KV block held, no failed request")
        rc = self.stop()
        check(rc == 0, f"SIGTERM exit {rc}")

    # ---- the process ----
    def rss_kib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            return int(re.search(r"^VmRSS:\s+(\d+) kB", f.read(), re.M).group(1))

    def sanitized(self):
        """True when the server runs under AddressSanitizer (its allocator's RSS says nothing about leaks;
        LeakSanitizer at exit does)."""
        with open(f"/proc/{self.proc.pid}/maps") as f:
            return "libasan" in f.read()

    def n_fds(self):
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))
