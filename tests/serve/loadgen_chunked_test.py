"""loadgen_chunked_test.py TERN TMP — `tern loadgen` against a stand-in OpenAI server that answers
the way llama-server does: HTTP/1.1 with `Transfer-Encoding: chunked` (even to an HTTP/1.0
request), keep-alive, chunk boundaries that split SSE events and JSON mid-way, and CRLF event
separators on some requests. Every request streams a known number of text chunks and a usage
chunk; loadgen must count every request as completed, every output token, and TTFT/TPOT from the
server's known pacing. A parser that reads chunk-size lines as data (the bug this guards) finds no
`data:` events and reports the requests as failed."""
import json, os, random, subprocess, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.dirname(__file__))
from serve_lib import check, finish  # noqa: E402

TERN, TMP = sys.argv[1], sys.argv[2]
os.makedirs(TMP, exist_ok=True)
N_OUT = 7          # text chunks per request
GAP = 0.02         # seconds between text chunks
seen = {"requests": 0, "bad_body": 0, "prompts": []}
lock = threading.Lock()


class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        try:
            body = json.loads(self.rfile.read(n))
            good = body.get("stream") is True and isinstance(body.get("prompt"), str) and body.get("max_tokens") == N_OUT
        except ValueError:
            good = False
        with lock:
            seen["requests"] += 1
            if good:
                seen["prompts"].append(body["prompt"])
            if not good:
                seen["bad_body"] += 1
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Keep-Alive", "timeout=5, max=100")
        self.end_headers()
        sep = "\r\n\r\n" if random.random() < 0.5 else "\n\n"
        events = [": ping"]
        for i in range(N_OUT):
            events.append("data: " + json.dumps({"choices": [{"index": 0, "text": f" w{i}", "finish_reason": None}]}))
        events.append("data: " + json.dumps({"choices": [{"index": 0, "text": "", "finish_reason": "length"}],
                                             "usage": {"prompt_tokens": 5, "completion_tokens": N_OUT, "total_tokens": 5 + N_OUT}}))
        events.append("data: [DONE]")
        for k, ev in enumerate(events):
            data = (ev + sep).encode()
            # split each event into 1..3 HTTP chunks at random points (mid-JSON, mid-separator)
            cuts = sorted(random.sample(range(1, len(data)), min(2, len(data) - 1)))[: random.randint(0, 2)]
            parts, prev = [], 0
            for c in cuts + [len(data)]:
                parts.append(data[prev:c])
                prev = c
            for p in parts:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(p), p))
            self.wfile.flush()
            if 1 <= k <= N_OUT:
                time.sleep(GAP)
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
threading.Thread(target=srv.serve_forever, daemon=True).start()
url = f"http://127.0.0.1:{srv.server_address[1]}"
p = subprocess.run([TERN, "loadgen", "--url", url, "--rate", "20", "--duration", "1.5", "--prompt-len", "5",
                    "--output-len", str(N_OUT), "--ttft-slo", "5000", "--tpot-slo", "1000", "-o", "json"],
                   capture_output=True, text=True, timeout=120)
srv.shutdown()
srv2 = ThreadingHTTPServer(("127.0.0.1", 0), H)
threading.Thread(target=srv2.serve_forever, daemon=True).start()


def url_prompts():
    return f"http://127.0.0.1:{srv2.server_address[1]}"


check(p.returncode == 0, f"loadgen exit 0 (got {p.returncode}: {p.stderr.strip()[:200]})")
try:
    r = json.loads(p.stdout)
except ValueError:
    r = {}
    check(False, "loadgen -o json printed JSON")
sent = r.get("sent", 0)
check(sent >= 5, f"loadgen sent several requests ({sent})")
check(seen["requests"] == sent and seen["bad_body"] == 0, f"server saw {seen['requests']} well-formed streaming requests = sent")
check(r.get("completed") == sent and r.get("failed") == 0, f"every request completed ({r.get('completed')} of {sent}, failed {r.get('failed')})")
check(r.get("output_tokens") == N_OUT * sent, f"output tokens from the usage chunks: {r.get('output_tokens')} = {N_OUT} x {sent}")
check(r.get("prompt_tokens") == 5 * sent, f"prompt tokens from the usage chunks: {r.get('prompt_tokens')}")
tpot = r.get("tpot_ms", {}).get("p50", 0)
check(GAP * 1e3 * 0.9 <= tpot < GAP * 1e3 * 20, f"TPOT p50 {tpot:.1f} ms reflects the server's {GAP * 1e3:.0f} ms pacing")
check(abs(r.get("slo_attainment", 0) - 1.0) < 1e-9, "all requests within the loose SLOs")

# --prompts FILE: each request's prompt is one non-empty line of the file, verbatim (quotes, UTF-8)
lines = ['In the beginning God created the heaven and the earth.', 'He said "repeat it": caf\u00e9 \u2014 na\u00efve', 'x']
pf = os.path.join(TMP, "prompts.txt")
with open(pf, "w", encoding="utf-8") as f:
    f.write(lines[0] + "\r\n\n" + lines[1] + "\n\n\n" + lines[2])  # CRLF, empty lines, no final newline
seen["prompts"].clear()
p = subprocess.run([TERN, "loadgen", "--url", url_prompts(), "--rate", "30", "--duration", "1", "--prompts", pf,
                    "--output-len", str(N_OUT), "-o", "json"], capture_output=True, text=True, timeout=120)
srv2.shutdown()
check(p.returncode == 0, f"loadgen --prompts exit 0 (got {p.returncode}: {p.stderr.strip()[:200]})")
got = list(seen["prompts"])
check(len(got) >= 5 and all(g in lines for g in got), f"every prompt sent is a line of the file ({len(got)} sent)")
check(len(set(got)) >= 2, f"prompts are drawn from several lines ({sorted(set(got))})")
bad = os.path.join(TMP, "bad.txt")
with open(bad, "wb") as f:
    f.write(b"ok\n\xff\xfe\n")
p = subprocess.run([TERN, "loadgen", "--url", url, "--prompts", bad], capture_output=True, text=True, timeout=60)
check(p.returncode == 64 and "line 2" in p.stderr, f"a line that is not UTF-8 is refused, naming it (exit {p.returncode}: {p.stderr.strip()})")
p = subprocess.run([TERN, "loadgen", "--url", url, "--prompts", os.path.join(TMP, "absent.txt")], capture_output=True, text=True, timeout=60)
check(p.returncode == 66, f"a missing --prompts file: exit 66 (got {p.returncode})")
finish()
