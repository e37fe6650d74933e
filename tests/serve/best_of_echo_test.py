#!/usr/bin/env python3
"""best_of_echo_test.py TERN MODEL TMP — /v1/completions `best_of` and `echo` through HTTP:
  - best_of generates best_of candidates (the same ones n = best_of gives with that seed) and
    returns the n with the highest mean token logprob, best first, index 0..n-1; usage counts
    every candidate; best_of < n, > 16, or > n with stream are 400;
  - echo puts the prompt's text before the output; with logprobs the prompt's tokens come first
    (the first with null logprob and top_logprobs, as OpenAI does), each prompt logprob equals
    the logprob the model gives that token when generating after the same prefix, the output's
    entries are the ones without echo with text_offset moved past the prompt; streamed, the
    prompt is each choice's first chunk; a prompt already in the prefix cache still gets all of
    its logprobs."""
import os, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_lib import Server, bad, check, finish, ok

tern, model, tmp = sys.argv[1:4]
COMPL = "/v1/completions"


def mean(lps):
    return sum(lps) / len(lps)


def stream_text_and_lp(evs):
    """Per choice index: concatenated text and legacy logprob lists of a completions stream."""
    text, lp = {}, {}
    for e in evs:
        c = e["choices"][0]
        i = c["index"]
        text[i] = text.get(i, "") + c["text"]
        if c["logprobs"]:
            d = lp.setdefault(i, {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []})
            for k in d:
                d[k].extend(c["logprobs"][k])
    return text, lp


with Server(tern, model, tmp, "-np", "4", "--metrics") as srv:
    # ---- best_of ----
    body = {"prompt": "the cat sat", "max_tokens": 6, "temperature": 1, "seed": 7, "ignore_eos": True}
    st, cand = srv.post(COMPL, {**body, "n": 4, "logprobs": 0})
    try:
        assert st == 200 and len(cand["choices"]) == 4, (st, cand)
        scores = [mean(c["logprobs"]["token_logprobs"]) for c in cand["choices"]]
        texts = [c["text"] for c in cand["choices"]]
        assert len(set(texts)) > 1, texts  # at temperature 1 the candidates differ: the pick matters
        rank = sorted(range(4), key=lambda i: (-scores[i], i))
        assert rank[0] != 0 and rank[:2] != [0, 1], rank  # else returning the first candidates would pass: change the seed
        st, d = srv.post(COMPL, {**body, "best_of": 4})
        assert st == 200 and len(d["choices"]) == 1, (st, d)
        c = d["choices"][0]
        assert c["index"] == 0 and c["text"] == texts[rank[0]] and c["logprobs"] is None, (c, texts, scores)
        assert d["usage"]["completion_tokens"] == 24, d["usage"]
        ok(f"best_of 4: the candidate with the highest mean logprob ({scores[rank[0]]:.3f}), usage counts all 4")
        st, d = srv.post(COMPL, {**body, "best_of": 4, "n": 2, "logprobs": 1})
        assert st == 200 and [c["index"] for c in d["choices"]] == [0, 1], (st, d)
        for k, c in enumerate(d["choices"]):
            ref = cand["choices"][rank[k]]
            assert c["text"] == ref["text"], (k, c["text"], ref["text"])
            assert c["logprobs"]["token_logprobs"] == ref["logprobs"]["token_logprobs"], k
            assert c["logprobs"]["tokens"] == ref["logprobs"]["tokens"], k
        ok("best_of 4, n 2: the two best, best first, index 0 and 1, with their logprobs")
        st, one = srv.post(COMPL, {**body, "best_of": 1})
        st2, plain = srv.post(COMPL, body)
        assert st == st2 == 200 and one["choices"] == plain["choices"], (one, plain)
        ok("best_of 1 == no best_of")
    except (AssertionError, KeyError, TypeError) as e:
        bad(f"best_of: {e}")
    st, evs, done = srv.stream(COMPL, {**body, "n": 2, "best_of": 2, "stream": True})
    st2, d = srv.post(COMPL, {**body, "n": 2})
    text, _ = stream_text_and_lp(evs) if st == 200 else ({}, {})
    check(st == st2 == 200 and done and [text.get(i) for i in range(2)] == [c["text"] for c in d["choices"]],
          "best_of == n streams like n")
    for b in [{"best_of": 2, "n": 3}, {"best_of": 17}, {"best_of": 3, "stream": True}, {"best_of": 2.5}, {"best_of": 0}]:
        st, d = srv.post(COMPL, {"prompt": "x", "max_tokens": 2, **b})
        check(st == 400 and d["error"]["param"] == "best_of", f"400 naming 'best_of' for {b}")

    # ---- echo ----
    prompt = "once upon a time there was a little cat who lived in a big house"
    gbody = {"prompt": prompt, "max_tokens": 5, "temperature": 0, "ignore_eos": True}
    st, plain = srv.post(COMPL, {**gbody, "logprobs": 2})
    st2, echo = srv.post(COMPL, {**gbody, "echo": True})
    check(st == st2 == 200 and echo["choices"][0]["text"] == prompt + plain["choices"][0]["text"]
          and echo["choices"][0]["logprobs"] is None
          and [echo["usage"][k] for k in ("prompt_tokens", "completion_tokens")] == [plain["usage"][k] for k in ("prompt_tokens", "completion_tokens")],
          "echo: the prompt's text, then the output; usage unchanged")
    st, tk = srv.post("/tokenize", {"content": prompt, "add_special": True})
    ids = tk.get("tokens", []) if st == 200 else []
    st, d = srv.post(COMPL, {**gbody, "echo": True, "logprobs": 2})
    try:
        assert st == 200 and len(ids) > 32, (st, len(ids))
        c, pl = d["choices"][0], plain["choices"][0]["logprobs"]
        lp = c["logprobs"]
        n = len(ids)
        assert len(lp["tokens"]) == n + 5 and all(len(lp[k]) == n + 5 for k in lp), {k: len(v) for k, v in lp.items()}
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None, lp["token_logprobs"][:2]
        assert all(x <= 0 for x in lp["token_logprobs"][1:]), lp["token_logprobs"]
        for top, tok in zip(lp["top_logprobs"][1:n], lp["tokens"][1:n]):  # (keys are texts: ids may share one)
            assert tok in top and 1 <= len(top) <= 3 and all(v <= 0 for v in top.values()), (tok, top)
        # (the same tokens; logprobs within rounding: the prompt ran in other chunks, 64 logit rows at most)
        assert lp["tokens"][n:] == pl["tokens"], (lp["tokens"][n:], pl["tokens"])
        assert all(abs(a - b) < 5e-3 for a, b in zip(lp["token_logprobs"][n:], pl["token_logprobs"])), "output logprobs differ"
        assert lp["text_offset"][n:] == [o + len(prompt) for o in pl["text_offset"]], (lp["text_offset"][n:], pl["text_offset"])
        offs = lp["text_offset"][:n]
        assert offs == sorted(offs) and offs[0] == 0 and offs[-1] < len(prompt), offs
        # each piece sits where its offset says (the SentencePiece leading space is dropped)
        for tok, o in zip(lp["tokens"][2:n], offs[2:]):
            assert c["text"][o:o + len(tok)] == tok, (tok, o, c["text"][o:o + len(tok) + 3])
        ok(f"echo + logprobs: {n} prompt entries (first null), output entries as without echo, offsets past the prompt")
        # the prompt's logprobs are the model's: generating after ids[:i], the logprob of ids[i]
        for i in (1, 7, n - 1):
            st, g = srv.post(COMPL, {"prompt": ids[:i], "max_tokens": 1, "logprobs": 0, "logit_bias": {str(ids[i]): 100}})
            assert st == 200, g
            want = g["choices"][0]["logprobs"]["token_logprobs"][0]
            assert abs(want - lp["token_logprobs"][i]) < 2e-3, (i, want, lp["token_logprobs"][i])
        ok("echo prompt logprobs == the logprob of that token when generated after the same prefix")
        # again: the prompt's blocks are in the prefix cache now; its logprobs must all be computed
        st, d2 = srv.post(COMPL, {**gbody, "echo": True, "logprobs": 2})
        assert st == 200 and d2["choices"][0]["logprobs"] == lp, "second echo differs"
        ok("echo + logprobs of a cached prompt: the same logprobs")
        # streamed: each choice's first chunk is the prompt with its logprobs
        st, evs, done = srv.stream(COMPL, {**gbody, "echo": True, "logprobs": 2, "n": 2, "stream": True})
        assert st == 200 and done, st
        firsts = {}
        for e in evs:
            firsts.setdefault(e["choices"][0]["index"], e["choices"][0])
        assert sorted(firsts) == [0, 1], firsts.keys()
        for f in firsts.values():
            assert f["text"] == prompt and f["logprobs"]["tokens"] == lp["tokens"][:n], f
        text, slp = stream_text_and_lp(evs)
        for i in range(2):
            assert text[i] == c["text"] and slp[i] == lp, (i, text[i])
        ok("echo stream n=2: the prompt chunk first, text and logprobs == the non-streamed answer")
    except (AssertionError, KeyError, TypeError) as e:
        bad(f"echo + logprobs: {e}")
    st, d = srv.post(COMPL, {"prompt": ids[:6], "max_tokens": 2, "temperature": 0, "echo": True})
    st2, t = srv.post("/detokenize", {"tokens": ids[:6]})
    check(st == st2 == 200 and d["choices"][0]["text"].startswith(t["content"]), "echo of token ids: the detokenized prompt")
    st, d = srv.post(COMPL, {**gbody, "echo": True, "best_of": 2, "temperature": 1, "seed": 1})
    check(st == 200 and d["choices"][0]["text"].startswith(prompt), "echo with best_of")
    st, d = srv.post(COMPL, {"prompt": "x", "echo": 1})
    check(st == 400 and d["error"]["param"] == "echo", "400 naming 'echo' for a non-boolean")
    srv.end_clean()
finish()
