#!/usr/bin/env bash
# loadgen_test.sh TERN MODEL TMP — `tern loadgen` against tern serve: JSON report sanity at a light
# load; under overload with --ttft-slo the server refuses early (429, reason "slo") and the
# requests it accepts keep their TTFT objective; the closed loop (--concurrency N --requests M) sends
# exactly M requests, none dropped or refused by a server with N slots; either flag alone is a usage error.
. "$(dirname "$0")/lib.sh"
start_server -np 2 --max-queue 4 --metrics --debug-step-delay 5
"$TERN" loadgen --url "$U" --rate 5 --duration 2 --prompt-len 4-8 --output-len 8 --ttft-slo 1000 --tpot-slo 100 -o json > "$TMP/light.json" \
    || bad "loadgen exit $?"
python3 - "$TMP/light.json" <<'PY' && ok "light load: all complete, percentiles and goodput reported" || bad "light load: $(cat "$TMP/light.json")"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["sent"] > 0 and d["completed"] == d["sent"], d
assert d["output_tokens"] == 8 * d["completed"], d
assert 0 < d["ttft_ms"]["p50"] <= d["ttft_ms"]["p90"] <= d["ttft_ms"]["p99"], d
assert d["tpot_ms"]["p50"] > 0 and d["goodput_req_s"] > 0, d
PY
# closed loop: 2 clients, 7 requests on the 2 slots above
"$TERN" loadgen --url "$U" --concurrency 2 --requests 7 --prompt-len 4-8 --output-len 8 -o json > "$TMP/closed.json" \
    || bad "loadgen closed loop exit $?"
python3 - "$TMP/closed.json" <<'PY' && ok "closed loop: M requests sent and completed, none dropped" || bad "closed loop: $(cat "$TMP/closed.json")"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["concurrency"] == 2 and d["sent"] == 7 and d["completed"] == 7, d
assert d["rejected_429"] == 0 and d["dropped_client"] == 0 and d["output_tokens"] == 56, d
PY
for a in "--concurrency 2" "--requests 5" "--concurrency 0 --requests 5"; do
    # shellcheck disable=SC2086
    "$TERN" loadgen --url "$U" $a >/dev/null 2>"$TMP/lg.err"; rc=$?
    [ $rc = 64 ] && ok "loadgen $a: usage error" || bad "loadgen $a: exit $rc $(cat "$TMP/lg.err")"
done
stop_server
# overload: 1 slot, 20 steps of ~5 ms per request => ~100 ms each; 40 req/s offered; TTFT SLO 300 ms
start_server -np 1 --max-queue 64 --metrics --debug-step-delay 5 --ttft-slo 300
"$TERN" loadgen --url "$U" --rate 40 --duration 2 --prompt-len 4 --output-len 20 --ttft-slo 300 --tpot-slo 1000 -o json > "$TMP/over.json" \
    || bad "loadgen exit $?"
curl -sS -m 10 -o "$TMP/metrics" "$U/metrics"
python3 - "$TMP/over.json" "$TMP/metrics" <<'PY' && ok "overload: early 429s (slo) and accepted requests mostly within TTFT" || bad "overload: $(cat "$TMP/over.json")"
import json, re, sys
d = json.load(open(sys.argv[1])); m = open(sys.argv[2]).read()
slo = int(re.search(r'tern_requests_rejected_total\{reason="slo"\} (\d+)', m).group(1))
print(f"sent {d['sent']} completed {d['completed']} 429 {d['rejected_429']} slo-rejected {slo} goodput {d['goodput_req_s']:.2f} req/s ttft p90 {d['ttft_ms']['p90']:.0f} ms")
assert d["rejected_429"] > 0 and slo > 0 and d["completed"] > 0, d
assert d["rejected_429"] + d["completed"] == d["sent"], d
assert d["ttft_ms"]["p50"] <= 300, d
PY
stop_server
finish
