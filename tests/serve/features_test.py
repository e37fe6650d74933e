#!/usr/bin/env python3
"""features_test.py TERN MODEL TMP — n > 1, logprobs and presence / frequency penalties through
HTTP, in OpenAI's shapes, streaming and not:
  - n choices carry index 0..n-1, usage counts every choice; greedy choices are equal; a seed makes
    a request reproducible and the stream agrees with the non-streamed answer;
  - chat logprobs.content[] = {token, logprob, bytes, top_logprobs[]}, completions logprobs =
    {tokens, token_logprobs, top_logprobs, text_offset}; one entry per completion token; values
    <= 0; sum of top probabilities <= 1; under greedy the sampled token is the most likely one;
  - a large presence / frequency penalty makes greedy output stop repeating tokens; 0 changes
    nothing; out-of-range values are 400."""
import math, os, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_lib import Server, bad, check, finish, ok

tern, model, tmp = sys.argv[1:4]
CHAT, COMPL = "/v1/chat/completions", "/v1/completions"
MSG = [{"role": "user", "content": "tell me a story"}]


def chat_lp_ok(lp, k, greedy):
    """chat logprobs.content entries: shape and invariants; returns the tokens' byte tuples."""
    toks = []
    for e in lp["content"]:
        assert set(e) == {"token", "logprob", "bytes", "top_logprobs"}, e
        assert isinstance(e["token"], str) and all(isinstance(b, int) and 0 <= b < 256 for b in e["bytes"]), e
        assert e["logprob"] <= 0 and len(e["top_logprobs"]) == k, e
        tops = [t["logprob"] for t in e["top_logprobs"]]
        assert tops == sorted(tops, reverse=True) and all(t <= 0 for t in tops), tops
        assert sum(math.exp(t) for t in tops) <= 1 + 1e-6, tops
        if greedy and k:
            assert e["logprob"] == tops[0] and e["bytes"] == e["top_logprobs"][0]["bytes"], e
        toks.append(tuple(e["bytes"]))
    return toks


def legacy_lp_ok(lp, k, greedy, n_tokens):
    keys = ("tokens", "token_logprobs", "top_logprobs", "text_offset")
    assert set(lp) == set(keys) and all(len(lp[x]) == n_tokens for x in keys), lp
    assert lp["text_offset"] == sorted(lp["text_offset"]) and lp["text_offset"][0] == 0, lp["text_offset"]
    for tok, l, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        assert l <= 0 and 1 <= len(top) <= k + 1 and tok in top, (tok, l, top)
        assert sum(math.exp(v) for v in top.values()) <= 1 + 1e-6, top
        if greedy:
            assert l == max(top.values()), (tok, l, top)


with Server(tern, model, tmp, "-np", "4", "--metrics") as srv:
    # ---- n > 1, greedy, non-streaming ----
    st, d = srv.post(COMPL, {"prompt": "once upon a time", "n": 3, "max_tokens": 6, "temperature": 0, "ignore_eos": True,
                             "logprobs": 3})
    ch = d["choices"] if st == 200 else []
    check(st == 200 and [c["index"] for c in ch] == [0, 1, 2] and len({c["text"] for c in ch}) == 1
          and d["usage"]["completion_tokens"] == 18, f"completions n=3 greedy: 3 equal choices, usage 18 ({st})")
    try:
        for c in ch:
            legacy_lp_ok(c["logprobs"], 3, True, 6)
        ok("completions logprobs: shape, <= 0, sum <= 1, sampled = most likely under greedy")
    except AssertionError as e:
        bad(f"completions logprobs: {e}")

    st, d = srv.post(CHAT, {"messages": MSG, "n": 2, "max_tokens": 5, "temperature": 0, "ignore_eos": True,
                            "logprobs": True, "top_logprobs": 4})
    try:
        assert st == 200, (st, d)
        n_lp = 0
        for i, c in enumerate(d["choices"]):
            assert c["index"] == i and c["message"]["role"] == "assistant", c
            n_lp += len(chat_lp_ok(c["logprobs"], 4, True))
        assert n_lp == d["usage"]["completion_tokens"] == 10, (n_lp, d["usage"])
        ok("chat n=2 logprobs: content[] shape, one entry per completion token, sampled = top 1 under greedy")
    except AssertionError as e:
        bad(f"chat logprobs: {e}")
    st, d = srv.post(CHAT, {"messages": MSG, "max_tokens": 3, "logprobs": True})
    check(st == 200 and all(e["top_logprobs"] == [] for e in d["choices"][0]["logprobs"]["content"]),
          "chat logprobs without top_logprobs: empty top lists")
    st, d = srv.post(CHAT, {"messages": MSG, "max_tokens": 3})
    check(st == 200 and d["choices"][0]["logprobs"] is None, "no logprobs asked: \"logprobs\": null")

    # ---- seeded sampling: reproducible, and the stream says the same ----
    body = {"messages": MSG, "n": 3, "max_tokens": 8, "temperature": 1, "seed": 11, "ignore_eos": True,
            "logprobs": True, "top_logprobs": 2}
    st1, d1 = srv.post(CHAT, body)
    st2, d2 = srv.post(CHAT, body)
    texts = [c["message"]["content"] for c in d1["choices"]] if st1 == 200 else []
    check(st1 == st2 == 200 and d1["choices"] == d2["choices"], "seeded n=3: the same choices twice")
    check(len(set(texts)) > 1, f"seeded n=3 at temperature 1: choices differ ({len(set(texts))} distinct)")
    st, d = srv.post(CHAT, {**body, "n": 1})
    check(st == 200 and d["choices"][0]["message"]["content"] == texts[0], "choice 0 of n=3 == the n=1 answer with that seed")
    st, evs, done = srv.stream(CHAT, {**body, "stream": True, "stream_options": {"include_usage": True}})
    try:
        assert st == 200 and done, (st, evs)
        got, lps, fins = {}, {}, {}
        ids = {e["id"] for e in evs}
        assert len(ids) == 1, ids
        for e in evs[:-1]:
            assert e["usage"] is None and len(e["choices"]) == 1, e
            c = e["choices"][0]
            got[c["index"]] = got.get(c["index"], "") + c["delta"].get("content", "")
            if c["logprobs"]:
                lps.setdefault(c["index"], []).extend(c["logprobs"]["content"])
            if c["finish_reason"]:
                fins[c["index"]] = fins.get(c["index"], 0) + 1
        assert [got[i] for i in range(3)] == texts, (got, texts)
        assert fins == {0: 1, 1: 1, 2: 1}, fins
        assert [lps[i] for i in range(3)] == [c["logprobs"]["content"] for c in d1["choices"]], "stream logprobs differ"
        u = evs[-1]
        assert u["choices"] == [] and u["usage"]["completion_tokens"] == 24 == sum(len(v) for v in lps.values()), u
        ok("chat stream n=3: chunks carry the index, text and logprobs equal the non-streamed answer, usage 24")
    except (AssertionError, KeyError) as e:
        bad(f"chat stream n=3: {e}")
    cbody = {"prompt": "the cat", "n": 2, "max_tokens": 7, "temperature": 0.8, "seed": 3, "logprobs": 2, "ignore_eos": True}
    st, d = srv.post(COMPL, cbody)
    st2, evs, done = srv.stream(COMPL, {**cbody, "stream": True})
    try:
        assert st == st2 == 200 and done, (st, st2)
        got, toks = {}, {}
        for e in evs:
            c = e["choices"][0]
            got[c["index"]] = got.get(c["index"], "") + c["text"]
            if c["logprobs"]:
                toks.setdefault(c["index"], []).extend(c["logprobs"]["tokens"])
        for c in d["choices"]:
            legacy_lp_ok(c["logprobs"], 2, False, 7)
            assert got[c["index"]] == c["text"] and toks[c["index"]] == c["logprobs"]["tokens"], (got, c)
        ok("completions stream n=2 with logprobs == non-streamed answer")
    except (AssertionError, KeyError) as e:
        bad(f"completions stream n=2: {e}")

    # ---- presence / frequency penalties ----
    def greedy_tokens(extra):
        st, d = srv.post(CHAT, {"messages": MSG, "max_tokens": 40, "temperature": 0, "ignore_eos": True,
                                "logprobs": True, **extra})
        assert st == 200, d
        return chat_lp_ok(d["choices"][0]["logprobs"], 0, True)
    base = greedy_tokens({})
    check(len(set(base)) < len(base), f"greedy repeats tokens without penalties ({len(set(base))} distinct of {len(base)})")
    check(greedy_tokens({"presence_penalty": 0, "frequency_penalty": 0}) == base, "penalties 0: output unchanged")
    for k in ("presence_penalty", "frequency_penalty"):
        t = greedy_tokens({k: 2})
        check(len(set(t)) == len(t) == 40, f"{k} 2: no token repeats ({len(set(t))} distinct of {len(t)})")

    # ---- limits ----
    for path, b, param in [(COMPL, {"prompt": "x", "n": 17}, "n"), (COMPL, {"prompt": "x", "logprobs": 6}, "logprobs"),
                           (CHAT, {"messages": MSG, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
                           (CHAT, {"messages": MSG, "top_logprobs": 3}, "top_logprobs"),
                           (CHAT, {"messages": MSG, "presence_penalty": 2.01}, "presence_penalty"),
                           (COMPL, {"prompt": "x", "frequency_penalty": "1"}, "frequency_penalty")]:
        st, d = srv.post(path, b)
        check(st == 400 and d["error"]["param"] == param, f"400 naming '{param}' for {b}")
    srv.end_clean()
finish()
