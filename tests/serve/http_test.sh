#!/usr/bin/env bash
# http_test.sh TERN MODEL TMP — tern serve driven with curl: endpoints, SSE framing, OpenAI-shaped
# errors and limits (robustness.md §4.2), auth, 429 + Retry-After, disconnect cancel, SIGTERM drain.
. "$(dirname "$0")/lib.sh"
J() { python3 -c "import json,sys; d=json.load(open('$TMP/body')); print($1)"; }

# ---- 1. a plain server with a key and metrics -------------------------------------------------
start_server -np 4 --api-key sekrit --metrics --max-queue 8
H=(-H 'Authorization: Bearer sekrit')
expect 200 "GET /health (no key needed)" "$U/health"
[ "$(cat "$TMP/body")" = '{"status":"ok"}' ] && ok "health body" || bad "health body $(cat "$TMP/body")"
expect 200 "GET /v1/models" "${H[@]}" "$U/v1/models"
[ "$(J 'd["data"][0]["id"]')" = "$(basename "$MODEL" .gguf)" ] && ok "model id = file stem" || bad "model id"
expect 200 "completion" "${H[@]}" "$U/v1/completions" -d '{"prompt":"once upon a time","max_tokens":8,"temperature":0}'
[ "$(J 'd["object"]+" "+str(d["usage"]["completion_tokens"])+" "+d["choices"][0]["finish_reason"]')" = "text_completion 8 length" ] \
    && ok "completion shape" || bad "completion shape $(cat "$TMP/body")"
expect 200 "chat completion" "${H[@]}" "$U/v1/chat/completions" -d '{"model":"x","messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi"}]}],"max_tokens":5}'
[ "$(J 'd["object"]+" "+d["choices"][0]["message"]["role"]+" "+d["id"][:9]')" = "chat.completion assistant chatcmpl-" ] \
    && ok "chat shape" || bad "chat shape $(cat "$TMP/body")"
# SSE
curl -sS -m 30 -D "$TMP/hdr" -o "$TMP/sse" "${H[@]}" "$U/v1/chat/completions" \
    -d '{"messages":[{"role":"user","content":"hello"}],"max_tokens":6,"stream":true,"stream_options":{"include_usage":true}}'
python3 - "$TMP/sse" "$TMP/hdr" <<'PY' && ok "SSE framing, same id, usage chunk, [DONE]" || bad "SSE framing"
import json, sys
raw = open(sys.argv[1]).read(); hdr = open(sys.argv[2]).read().lower()
assert "content-type: text/event-stream" in hdr, hdr
events = [e for e in raw.split("\n\n") if e.strip()]
assert events[-1] == "data: [DONE]", events[-1]
chunks = [json.loads(e[len("data: "):]) for e in events[:-1]]
ids = {c["id"] for c in chunks}; assert len(ids) == 1, ids
assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
fin = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
assert len(fin) == 1 and fin[0]["choices"][0]["finish_reason"] == "length"
assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6, chunks[-1]
PY
curl -sS -m 30 -o "$TMP/sse2" "${H[@]}" "$U/v1/completions" -d '{"prompt":"abc","max_tokens":4,"stream":true}'
python3 - "$TMP/sse2" <<'PY' && ok "completion SSE" || bad "completion SSE"
import json, sys
ev = [e for e in open(sys.argv[1]).read().split("\n\n") if e.strip()]
assert ev[-1] == "data: [DONE]"
cs = [json.loads(e[6:]) for e in ev[:-1]]
assert all(c["object"] == "text_completion" for c in cs) and cs[-1]["choices"][0]["finish_reason"] == "length"
PY
# tokenize / detokenize
expect 200 "tokenize" "${H[@]}" "$U/tokenize" -d '{"content":"hello world","with_pieces":true}'
expect 200 "tokenize (vLLM shape)" "${H[@]}" "$U/tokenize" -d '{"prompt":"hello world"}'
[ "$(J 'd["count"]==len(d["tokens"]) and d["max_model_len"]>0')" = True ] && ok "tokenize reply" || bad "tokenize reply"
TOKS=$(J 'd["tokens"]')
expect 200 "detokenize" "${H[@]}" "$U/detokenize" -d "{\"tokens\":$TOKS}"
[ "$(J 'd["content"]==d["prompt"]')" = True ] && ok "detokenize reply" || bad "detokenize reply"

# ---- 2. hostile requests (robustness.md §4.2): the right status, and the server stays up ------
P="$U/v1/completions"; C="$U/v1/chat/completions"
expect 400 "H1 not JSON" "${H[@]}" "$P" -d 'not json'
expect 400 "H1 truncated JSON" "${H[@]}" "$P" -d '{"prompt":"x"'
python3 -c 'print("["*10000 + "]"*10000)' > "$TMP/deep.json"
expect 400 "H1 depth 10000" "${H[@]}" "$P" --data-binary @"$TMP/deep.json"
expect 400 "H1 duplicate keys" "${H[@]}" "$P" -d '{"prompt":"x","prompt":"y"}'
expect 400 "H2 messages string" "${H[@]}" "$C" -d '{"messages":"hi"}'
expect 400 "H2 max_tokens string" "${H[@]}" "$P" -d '{"prompt":"x","max_tokens":"10"}'
[ "$(J 'd["error"]["param"]')" = max_tokens ] && ok "H2 names the field" || bad "H2 param"
expect 400 "H2 temperature []" "${H[@]}" "$P" -d '{"prompt":"x","temperature":[]}'
expect 400 "H2 stream yes" "${H[@]}" "$P" -d '{"prompt":"x","stream":"yes"}'
expect 400 "H3 max_tokens -1" "${H[@]}" "$P" -d '{"prompt":"x","max_tokens":-1}'
expect 400 "H3 max_tokens 2^63" "${H[@]}" "$P" -d '{"prompt":"x","max_tokens":9223372036854775808}'
expect 400 "H3 max_tokens 1e400" "${H[@]}" "$P" -d '{"prompt":"x","max_tokens":1e400}'
expect 400 "H3 temperature -1" "${H[@]}" "$P" -d '{"prompt":"x","temperature":-1}'
expect 400 "H3 temperature 1e999" "${H[@]}" "$P" -d '{"prompt":"x","temperature":1e999}'
expect 400 "H3 top_p 2" "${H[@]}" "$P" -d '{"prompt":"x","top_p":2}'
expect 400 "H3 top_k -5" "${H[@]}" "$P" -d '{"prompt":"x","top_k":-5}'
expect 400 "H3 n 0" "${H[@]}" "$P" -d '{"prompt":"x","n":0}'
expect 400 "H3 n 10^6" "${H[@]}" "$P" -d '{"prompt":"x","n":1000000}'
expect 400 "H3 seed -1" "${H[@]}" "$P" -d '{"prompt":"x","seed":-1}'
expect 400 "H3 seed 2^64" "${H[@]}" "$P" -d '{"prompt":"x","seed":18446744073709551616}'
expect 400 "H4 top_logprobs 10^6" "${H[@]}" "$C" -d '{"messages":[{"role":"user","content":"x"}],"top_logprobs":1000000}'
expect 400 "H4 n_probs -1" "${H[@]}" "$P" -d '{"prompt":"x","n_probs":-1}'
expect 400 "H5 logit_bias id >= n_vocab" "${H[@]}" "$P" -d '{"prompt":"x","logit_bias":{"99999999":1}}'
expect 400 "H5 logit_bias negative id" "${H[@]}" "$P" -d '{"prompt":"x","logit_bias":{"-1":1}}'
expect 400 "H5 logit_bias 1e30" "${H[@]}" "$P" -d '{"prompt":"x","logit_bias":{"5":1e30}}'
python3 -c 'import json; print(json.dumps({"prompt":"x","logit_bias":{str(i%500):1 for i in range(0,1)} | {str(100000+i):1 for i in range(5000)}}))' > "$TMP/lb.json"
expect 400 "H5 logit_bias 5000 entries" "${H[@]}" "$P" --data-binary @"$TMP/lb.json"
expect 200 "H5 logit_bias ok" "${H[@]}" "$P" -d '{"prompt":"x","max_tokens":2,"logit_bias":{"5":-100,"6":100}}'
python3 -c 'import json; print(json.dumps({"prompt":"x","stop":["s"]*10000}))' > "$TMP/stop.json"
expect 400 "H6 10000 stop strings" "${H[@]}" "$P" --data-binary @"$TMP/stop.json"
python3 -c 'import json; print(json.dumps({"prompt":"x","stop":"s"*1000000}))' > "$TMP/stop1.json"
expect 400 "H6 1 MB stop string" "${H[@]}" "$P" --data-binary @"$TMP/stop1.json"
expect 200 "H6 empty stop ignored" "${H[@]}" "$P" -d '{"prompt":"x","max_tokens":2,"stop":""}'
python3 -c 'import json; print(json.dumps({"prompt":"a "*3000}))' > "$TMP/long.json"
expect 400 "H7 prompt > n_ctx" "${H[@]}" "$P" --data-binary @"$TMP/long.json"
[ "$(J 'd["error"]["type"]')" = exceed_context_size_error ] && ok "H7 exceed_context_size_error" || bad "H7 type"
head -c 100000000 /dev/zero | tr '\0' 'a' > "$TMP/huge.txt"
expect 413 "H7 100 MB body" "${H[@]}" "$P" --data-binary @"$TMP/huge.txt"
rm -f "$TMP/huge.txt"
expect 400 "H8 token id >= n_vocab" "${H[@]}" "$P" -d '{"prompt":[1,2,99999999]}'
expect 400 "H8 negative token" "${H[@]}" "$P" -d '{"prompt":[1,-2]}'
expect 400 "H8 mixed types" "${H[@]}" "$P" -d '{"prompt":[1,"a"]}'
expect 200 "H9 NUL bytes in content" "${H[@]}" "$P" -d '{"prompt":"a\u0000b","max_tokens":2}'
expect 200 "H9 NUL bytes in chat content" "${H[@]}" "$C" -d '{"messages":[{"role":"user","content":"a\u0000b"}],"max_tokens":2}'
expect 400 "H9 lone surrogate (jansson refuses it)" "${H[@]}" "$P" -d '{"prompt":"a\ud800c","max_tokens":2}'
printf '{"prompt":"\xff\xfe abc","max_tokens":2}' > "$TMP/bad-utf8.json"
expect 400 "H9 raw invalid UTF-8 bytes in JSON" "${H[@]}" "$P" --data-binary @"$TMP/bad-utf8.json"
expect 400 "H10 messages empty" "${H[@]}" "$C" -d '{"messages":[]}'
expect 400 "H10 role evil" "${H[@]}" "$C" -d '{"messages":[{"role":"evil","content":"x"}]}'
expect 400 "H10 image part" "${H[@]}" "$C" -d '{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}'
python3 -c 'import json; print(json.dumps({"messages":[{"role":"user","content":"x"}]*100000}))' > "$TMP/many.json"
expect 400 "H10 100k messages" "${H[@]}" "$C" --data-binary @"$TMP/many.json"
expect 200 "H11 unknown model accepted (documented)" "${H[@]}" "$P" -d '{"model":"gpt-9","prompt":"x","max_tokens":1}'
python3 - "$PORT" <<'PY' && ok "H12 1 MB header, 10000 headers, 10 MB URL refused" || bad "H12"
import socket, sys
port = int(sys.argv[1])
def send(req):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        s.sendall(req)
    except OSError:
        pass  # server closed early: fine
    try:
        data = s.recv(4096)
    except OSError:
        data = b""
    s.close()
    return data
for req in [b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 1000000 + b"\r\n\r\n",
            b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-H%d: 1\r\n" % i for i in range(10000)) + b"\r\n",
            b"GET /" + b"a" * 10000000 + b" HTTP/1.1\r\nHost: x\r\n\r\n"]:
    d = send(req)
    assert d == b"" or d.startswith(b"HTTP/1.1 4"), d[:80]
PY
alive "H12"
python3 - "$PORT" <<'PY' && ok "H14 raw HTTP abuse answered or closed" || bad "H14 raw"
import socket, sys
port = int(sys.argv[1])
cases = [b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
         b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
         b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
         b"GET /health\r\n\r\n",
         b"GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n"]
for c in cases:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(c)
    try:
        data = s.recv(65536)
    except socket.timeout:
        data = b""
    s.close()
    assert not data.startswith(b"HTTP/1.1 5"), data[:100]
PY
alive "H14"
expect 401 "H15 no key" "$U/v1/models"
expect 401 "H15 wrong key" -H 'Authorization: Bearer nope' "$U/v1/models"
expect 401 "H15 lower-case bearer" -H 'Authorization: bearer sekrit' "$U/v1/models"
expect 401 "H15 key in query string" "$U/v1/models?api_key=sekrit"
expect 401 "H15 completions without key" "$P" -d '{"prompt":"x"}'
expect 401 "H15 metrics without key" "$U/metrics"
expect 200 "H15 X-Api-Key" -H 'X-Api-Key: sekrit' "$U/v1/models"
expect 405 "H17 GET completions" "${H[@]}" "$C"
expect 405 "H17 DELETE health" -X DELETE "$U/health"
expect 405 "H17 OPTIONS" -X OPTIONS "${H[@]}" "$C"
expect 404 "unknown route" "${H[@]}" "$U/v1/nope"
python3 -c 'import json; print(json.dumps({"tokens":list(range(100))*1000}))' > "$TMP/detok.json"
expect 400 "H18 detokenize 100k ids" "${H[@]}" "$U/detokenize" --data-binary @"$TMP/detok.json"
expect 400 "H18 detokenize id >= n_vocab" "${H[@]}" "$U/detokenize" -d '{"tokens":[1,99999999]}'
expect 200 "metrics" "${H[@]}" "$U/metrics"
grep -q '^tern_requests_rejected_total{reason="invalid"} [1-9]' "$TMP/body" && ok "metrics count invalid requests" || bad "metrics invalid"
grep -q '^tern_kv_cache_usage_ratio 0' "$TMP/body" && ok "KV usage back to 0 when idle" || bad "kv usage: $(grep kv_cache_usage "$TMP/body")"
alive "the hostile requests"
stop_server
[ "$SRV_RC" = 0 ] && ok "SIGTERM on an idle server exits 0" || bad "exit code $SRV_RC"

# ---- 3. prefix cache: a shared system prompt is computed once; slowloris ---------------------------
start_server -np 2 --metrics --timeout 2
python3 - "$PORT" <<'PY' && ok "H13 slowloris headers / stalled body closed at the timeout" || bad "H13"
import socket, sys, time
port = int(sys.argv[1])
for first in [b"GET /health HTTP/1.1\r\nHo", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\n{"]:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(first)
    t0 = time.time()
    try:
        while s.recv(4096):
            pass
    except OSError:
        pass
    dt = time.time() - t0
    s.close()
    assert dt < 8, dt
PY
SYS="you are a helpful and brief assistant."
for q in one two three; do
    expect 200 "chat with shared system prompt ($q)" "$U/v1/chat/completions" -d "{\"messages\":[{\"role\":\"system\",\"content\":\"$SYS\"},{\"role\":\"user\",\"content\":\"$q\"}],\"max_tokens\":2}"
done
C3=$(J 'd["usage"]["prompt_tokens_details"]["cached_tokens"]')
[ "$C3" -ge 32 ] && ok "prefix cache hit: $C3 cached prompt tokens" || bad "prefix cache: cached=$C3"
stop_server

# ---- 4. bounded queue: 429 + Retry-After; disconnect cancels; SIGTERM drains ----------------------
start_server -np 1 --max-queue 1 --metrics --debug-step-delay 20
LONG='{"prompt":"x","max_tokens":60,"ignore_eos":true}'
CPIDS=()
for i in 1 2 3 4 5 6; do
    curl -sS -m 60 -D "$TMP/h$i" -o "$TMP/b$i" -w '%{http_code}' "$U/v1/completions" -d "$LONG" > "$TMP/c$i" 2>/dev/null &
    CPIDS+=($!)
    sleep 0.05
done
wait "${CPIDS[@]}"
codes=$(cat "$TMP"/c[1-6] | tr -d '\n' | fold -w3 | sort | uniq -c | tr -s ' ' | tr '\n' ';')
n200=$(cat "$TMP"/c[1-6] | fold -w3 | grep -c 200); n429=$(cat "$TMP"/c[1-6] | fold -w3 | grep -c 429)
[ "$n200" -ge 2 ] && [ "$n429" -ge 1 ] && [ $((n200 + n429)) = 6 ] && ok "bounded queue: $codes" || bad "queue codes: $codes"
grep -il '^retry-after: [0-9]' "$TMP"/h[1-6] > /dev/null && ok "429 carries Retry-After" || bad "no Retry-After"
grep -l '"rate_limit_error"' "$TMP"/b[1-6] > /dev/null && ok "429 is rate_limit_error JSON" || bad "429 body"
# disconnect mid-stream: the sequence is freed within a step
curl -sS -m 1 -o /dev/null -N "$U/v1/completions" -d '{"prompt":"x","max_tokens":100,"ignore_eos":true,"stream":true}' 2>/dev/null
# and disconnect of a non-streaming request
curl -sS -m 1 -o /dev/null "$U/v1/completions" -d '{"prompt":"x","max_tokens":100,"ignore_eos":true}' 2>/dev/null
sleep 0.5
curl -sS -m 10 -o "$TMP/body" "$U/metrics"
grep -q '^tern_requests_cancelled_total 2' "$TMP/body" && grep -q '^tern_requests_running 0' "$TMP/body" \
    && ok "client disconnects cancel (streaming and not)" || bad "cancel: $(grep -E 'cancelled_total|requests_running' "$TMP/body" | tr '\n' ' ')"
# SIGTERM while a request runs: it finishes, then exit 0
curl -sS -m 30 -o "$TMP/drain" -w '%{http_code}' "$U/v1/completions" -d '{"prompt":"x","max_tokens":40,"ignore_eos":true}' > "$TMP/drain.code" 2>/dev/null &
CP=$!
sleep 0.3
kill -TERM "$SRV_PID"
sleep 0.2
code=$(curl -sS -m 5 -o /dev/null -w '%{http_code}' "$U/health" 2>/dev/null)
case $code in 000|503) ok "no new work while draining ($code)";; *) bad "health while draining: $code";; esac
wait $CP
[ "$(cat "$TMP/drain.code")" = 200 ] && grep -q '"finish_reason":"length"' "$TMP/drain" && ok "in-flight request finished during drain" \
    || bad "drain: $(cat "$TMP/drain.code") $(head -c 200 "$TMP/drain")"
for _ in $(seq 1 100); do kill -0 "$SRV_PID" 2>/dev/null || break; sleep 0.1; done
wait "$SRV_PID"; rc=$?; SRV_PID=""
[ "$rc" = 0 ] && ok "SIGTERM drain exits 0" || bad "drain exit $rc"
finish
