"""tern_testlib.py — helpers of the python tests: a small GGUF reader (independent of tern's C
reader: metadata, tensor infos and the bytes of each tensor's data) and running tern."""
import struct
import subprocess


def run_tern(tern, args):
    """tern's (stdout, stderr); a nonzero exit ends the test with its stderr."""
    p = subprocess.run([tern] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600)
    if p.returncode != 0:
        raise SystemExit("FAIL: tern %s exited %d: %s" % (" ".join(args), p.returncode, p.stderr[-2000:]))
    return p.stdout, p.stderr


def read_gguf(path, with_data=False):
    """Returns (kv dict, [(name, shape, type)]), and with_data a dict name -> bytes from the
    tensor's offset to the end of the file (the caller knows its size)."""
    with open(path, "rb") as f:
        data = f.read()
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from("<" + fmt, data, pos)
        pos += struct.calcsize("<" + fmt)
        return v[0]

    def string():
        nonlocal pos
        n = take("Q")
        s = data[pos:pos + n].decode("utf-8", "replace")
        pos += n
        return s

    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            et, n = take("I"), take("Q")
            return [value(et) for _ in range(n)]
        return take(scalar[t])

    assert data[:4] == b"GGUF", path
    pos = 4
    take("I")
    n_tensors, n_kv = take("Q"), take("Q")
    kv = {}
    for _ in range(n_kv):
        k = string()
        kv[k] = value(take("I"))
    tensors, offs = [], {}
    for _ in range(n_tensors):
        name = string()
        nd = take("I")
        shape = [take("Q") for _ in range(nd)]
        t = take("I")
        offs[name] = take("Q")
        tensors.append((name, shape, t))
    if not with_data:
        return kv, tensors
    align = kv.get("general.alignment", 32)
    base = (pos + align - 1) // align * align
    return kv, tensors, {n: data[base + o:] for n, o in offs.items()}
