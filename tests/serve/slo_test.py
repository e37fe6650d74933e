#!/usr/bin/env python3
"""slo_test.py TERN MODEL TMP — refusals under a TTFT objective, over HTTP: one slot, steps slowed
to >= 5 ms, two streams of 150 tokens at once with a 300 ms TTFT objective. The second cannot get
its first token in time (it waits for the first's 150 steps): it must get a real 429 (status
line, Retry-After, rate_limit_error body), not a 200 stream that fails later, whether the
engine refuses it on arrival or, once the measured step times show it late, from the queue
(streams send their status line only when the request starts). The first completes; a lone
request afterwards is served."""
import json, os, sys, threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_lib import Server, check, finish

tern, model, tmp = sys.argv[1:4]
COMPL = "/v1/completions"
BODY = {"prompt": "once", "max_tokens": 150, "ignore_eos": True, "temperature": 0, "stream": True}

with Server(tern, model, tmp, "-np", "1", "--ttft-slo", "300", "--debug-step-delay", "5", "--metrics") as srv:
    res = [None, None]

    def go(i):
        res[i] = srv.request("POST", COMPL, BODY)

    ts = [threading.Thread(target=go, args=(i,)) for i in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    sts = sorted(r[0] for r in res)
    check(sts == [200, 429], f"two 150-token streams on one slot, TTFT objective 300 ms: one 200, one 429 ({sts})")
    for st, raw, hdr in res:
        if st == 200:
            body = raw.decode()
            check(body.rstrip().endswith("data: [DONE]") and '"finish_reason":"length"' in body, "the admitted stream completes")
        elif st == 429:
            err = json.loads(raw).get("error", {})
            retry = {k.lower(): v for k, v in hdr.items()}.get("retry-after", "0")
            check(err.get("type") == "rate_limit_error" and "objective" in err.get("message", "") and int(retry) >= 1,
                  f"the refused one: 429 rate_limit_error naming the objective, Retry-After {retry}")
    m = srv.wait_idle()
    slo, late = (m['tern_requests_rejected_total{reason="%s"}' % k] for k in ("slo", "deadline"))
    check(slo + late == 1 and m["tern_requests_failed_total"] == 0,
          f"counted as refused (on arrival {slo:.0f}, from the queue {late:.0f}), not failed")
    st, raw, _ = srv.request("POST", COMPL, {**BODY, "max_tokens": 8})
    check(st == 200 and raw.decode().rstrip().endswith("data: [DONE]"), f"a lone request afterwards is served ({st})")
    srv.end_clean()
finish()
