#!/usr/bin/env bash
# loadgen_test.sh TERN MODEL TMP — `tern loadgen` against tern serve: JSON report sanity at a light
# load; under overload with --ttft-slo the server refuses early (429, reason "slo") and the
# requests it accepts keep their TTFT objective.
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
