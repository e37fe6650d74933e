#!/usr/bin/env python3
"""dist_compare.py A.gguf B.gguf TOL [--differ] — compares two f32 GGUFs written by `tern train`
and their <out>.loss.csv training losses, with tern_testlib's GGUF reader (independent of tern's).

Prints the largest absolute weight and loss differences. Exit 0 when every weight and every
training loss agree within TOL (absolute) — or, with --differ, when some weight differs by more
than TOL (the negative control: a run that should not match does not; the runs may then have
logged different numbers of steps)."""
import csv
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from tern_testlib import read_gguf  # noqa: E402


def weights(path):
    kv, tensors, data = read_gguf(path, with_data=True)
    out = {}
    for name, shape, t in tensors:
        if t != 0:
            raise SystemExit("FAIL: %s: tensor %s is of type %d, not f32" % (path, name, t))
        n = 1
        for d in shape:
            n *= d
        out[name] = struct.unpack_from("<%df" % n, data[name])
    return out


def losses(path):
    stem = path[:-5] if path.endswith(".gguf") else path
    with open(stem + ".loss.csv") as f:
        return [float(r["loss"]) for r in csv.DictReader(f)]


def main():
    a, b, tol = sys.argv[1], sys.argv[2], float(sys.argv[3])
    differ = "--differ" in sys.argv[4:]
    wa, wb = weights(a), weights(b)
    if sorted(wa) != sorted(wb):
        raise SystemExit("FAIL: tensor names differ")
    dw, where = 0.0, ""
    for name in wa:
        if len(wa[name]) != len(wb[name]):
            raise SystemExit("FAIL: %s: sizes differ" % name)
        for x, y in zip(wa[name], wb[name]):
            if abs(x - y) > dw:
                dw, where = abs(x - y), name
    la, lb = losses(a), losses(b)
    if len(la) != len(lb) and not differ:
        raise SystemExit("FAIL: %d vs %d logged steps" % (len(la), len(lb)))
    dl = max(abs(x - y) for x, y in zip(la, lb))  # over the common steps
    print("max |weight diff| %.3g (%s), max |loss diff| %.3g over %d steps, tolerance %g" % (dw, where, dl, len(la), tol))
    if differ:
        sys.exit(0 if dw > tol else 1)
    sys.exit(0 if dw <= tol and dl <= tol else 1)


if __name__ == "__main__":
    main()
