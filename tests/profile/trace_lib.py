"""What the tern profile tests share: check() collecting failures, running tern, and the spans of
a Chrome/Perfetto trace rebuilt from its B/E events with the json module only (the nesting checks
run while rebuilding)."""
import subprocess

TERN = None  # set by the test
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAIL:", what)


def run(*args, timeout=300):
    p = subprocess.run([TERN, *args], capture_output=True, timeout=timeout)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def spans_of(events):
    """Per tid, completed spans (name, cat, t0, t1, depth, self, args, children) from B/E events in file order."""
    per_tid, ok = {}, True
    stacks = {}
    last_ts = {}
    for e in events:
        if e["ph"] not in "BE":
            continue
        tid, ts = e["tid"], float(e["ts"])
        if ts + 1e-9 < last_ts.get(tid, -1.0):
            check(False, "tid %d: timestamps go back at %s %.3f" % (tid, e["name"], ts))
        last_ts[tid] = ts
        st = stacks.setdefault(tid, [])
        if e["ph"] == "B":
            st.append({"name": e["name"], "cat": e["cat"], "t0": ts, "args": e.get("args", {}), "children": [], "depth": len(st)})
        else:
            if not st:
                check(False, "tid %d: E '%s' at %.3f without a B" % (tid, e["name"], ts))
                ok = False
                continue
            s = st.pop()
            if s["name"] != e["name"]:
                check(False, "tid %d: E '%s' closes B '%s'" % (tid, e["name"], s["name"]))
            s["t1"] = ts
            s["eargs"] = e.get("args", {})
            s["self"] = (s["t1"] - s["t0"]) - sum(c["t1"] - c["t0"] for c in s["children"])
            for c in s["children"]:  # nested: inside the parent, siblings in order without overlap
                check(s["t0"] - 1e-9 <= c["t0"] and c["t1"] <= s["t1"] + 1e-9, "tid %d: %s sticks out of %s" % (tid, c["name"], s["name"]))
            for a, b in zip(s["children"], s["children"][1:]):
                check(a["t1"] <= b["t0"] + 1e-9, "tid %d: %s and %s overlap" % (tid, a["name"], b["name"]))
            if st:
                st[-1]["children"].append(s)
            per_tid.setdefault(tid, []).append(s)
    for tid, st in stacks.items():
        check(not st, "tid %d: %d spans never end (%s)" % (tid, len(st), ", ".join(s["name"] for s in st)))
    return per_tid


def check_kinds(per_tid, summ):
    """The summary's self time per op kind = the self times recomputed from the events (within 1%)."""
    mine = {}
    for sp in per_tid.values():
        for s in sp:
            mine[s["cat"]] = mine.get(s["cat"], 0.0) + s["self"]
    for cat, v in mine.items():
        got = summ["kinds"].get(cat, {}).get("self_ms", -1) * 1e3
        check(abs(got - v) <= max(0.01 * v, 0.002), "summary self time of %s: %.3f us, trace says %.3f us" % (cat, got, v))
    check(set(summ["kinds"]) == set(mine), "summary kinds = trace kinds")
