#!/usr/bin/env python3
"""spec_peer.py — speculative decoding, tern against llama.cpp on the same files, alternating.

    bench/spec_peer.py --llama-bin DIR -m TARGET.gguf (--draft DRAFT.gguf | --ngram) -f PROMPT.txt
                       [-n 48] [-t 2] [--draft-max 4] [--rounds 3] [--tern build/tern] [-o out.json]

Each round runs, one after the other:
  tern bench -m TARGET --draft DRAFT | --spec ngram --spec-prompt PROMPT -n N -t T -o json
      (greedy; tokens/s without and with speculation, alternating inside, acceptance, same tokens)
  llama-speculative -m TARGET -md DRAFT | llama-speculative-simple -m TARGET --spec-type ngram-simple,
      -f PROMPT -n N --temp 0 -t T  (their "decoded ... t/s", n_drafted, n_accept)
  llama-speculative-simple -m TARGET --spec-type ngram-map-k --spec-ngram-map-k-min-hits 65535 ...
      (no draft ever qualifies: llama.cpp's plain decode of the same prompt, timed the same way)
and prints the best of the rounds per number as a markdown table: tokens/s plain and speculative,
the speedup of each engine over its own plain decode, drafts accepted, and tern / llama.cpp.
The llama.cpp binaries are built by the user outside this repository; nothing of them is kept here.
Run it on a quiet machine: timings on a shared one are noise.
"""
import argparse, json, os, re, subprocess, sys


def die(msg, code=64):
    print(f"spec_peer: {msg}", file=sys.stderr)
    sys.exit(code)


def run(cmd, timeout=600):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        die(f"{' '.join(cmd)} failed (exit {p.returncode}):\n{p.stderr[-2000:]}", 70)
    return p


def peer_run(binary, spec_args, a):
    """(decode t/s, share of drafts accepted, drafts) of one llama.cpp run."""
    # llama.cpp 3f545bec's asynchronous log sometimes drops the closing statistics lines of
    # these examples (exit 0, the text printed): run again until they are there
    for _ in range(10):
        p = run([binary, "-m", a.model, *spec_args, "-f", a.prompt, "-n", str(a.n), "--temp", "0", "-t", str(a.t),
                 "-tb", str(a.t)])
        txt = p.stdout + p.stderr
        m = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s", txt)
        md = re.search(r"n_drafted\s*=\s*(\d+)", txt)
        ma = re.search(r"n_accept\s*=\s*(\d+)", txt)
        if m and md and ma:
            nd = int(md.group(1))
            return float(m.group(3)), int(ma.group(1)) / nd if nd else 0.0, nd
    die(f"no 'decoded ... t/s' and n_drafted/n_accept lines from {binary} in 10 runs:\n{txt[-1500:]}", 70)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-bin", required=True, help="llama.cpp build/bin directory")
    ap.add_argument("-m", dest="model", required=True)
    ap.add_argument("--draft")
    ap.add_argument("--ngram", action="store_true")
    ap.add_argument("-f", dest="prompt", required=True)
    ap.add_argument("-n", type=int, default=48)
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("--draft-max", type=int, default=4)
    ap.add_argument("--ngram-n", type=int, default=3, help="n-gram lookup length (tern --spec-ngram)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tern", default=os.path.join(os.path.dirname(__file__), "..", "build", "tern"))
    ap.add_argument("-o", dest="out")
    a = ap.parse_args()
    if bool(a.draft) == a.ngram:
        die("give one of --draft FILE or --ngram")
    for f in [a.model, a.prompt] + ([a.draft] if a.draft else []):
        if not os.path.isfile(f):
            die(f"no file '{f}'", 66)
    spec_bin = os.path.join(a.llama_bin, "llama-speculative" if a.draft else "llama-speculative-simple")
    for b in (spec_bin, os.path.join(a.llama_bin, "llama-speculative-simple"), a.tern):
        if not os.access(b, os.X_OK):
            die(f"'{b}' is not an executable", 66)
    if a.rounds < 1 or a.n < 1 or a.t < 1 or a.draft_max < 1:
        die("--rounds, -n, -t and --draft-max must be >= 1")

    tern_spec = ["--draft", a.draft] if a.draft else ["--spec", "ngram", "--spec-ngram", str(a.ngram_n)]
    peer_spec = (["-md", a.draft, "--spec-draft-n-max", str(a.draft_max), "-td", str(a.t)]
                 if a.draft else ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(a.ngram_n),
                                  "--spec-ngram-simple-size-m", str(a.draft_max)])
    best = {}

    def keep(k, v):
        best[k] = max(best.get(k, 0.0), v)

    rows = []
    for r in range(a.rounds):
        p = run([a.tern, "bench", "-m", a.model, *tern_spec, "--draft-max", str(a.draft_max), "--spec-prompt", a.prompt,
                 "-n", str(a.n), "-r", "3", "-t", str(a.t), "-o", "json"])
        tj = json.loads(p.stdout)[0]
        np_ = tj["n_prompt"]
        peer_spec_ts, peer_acc, _ = peer_run(spec_bin, peer_spec, a)
        peer_plain, _, nd = peer_run(os.path.join(a.llama_bin, "llama-speculative-simple"),
                                     ["--spec-type", "ngram-map-k", "--spec-ngram-map-k-min-hits", "65535"], a)
        if nd:
            die(f"llama.cpp's plain run drafted {nd} tokens", 70)
        row = {"round": r + 1, "n_prompt": np_, "tern_plain": tj["plain_ts"], "tern_spec": tj["spec_ts"],
               "tern_accept": tj["acceptance"], "tern_per_pass": tj["tokens_per_pass"], "same_tokens": tj["same_tokens"],
               "peer_plain": peer_plain, "peer_spec": peer_spec_ts, "peer_accept": peer_acc}
        rows.append(row)
        print(f"spec_peer: round {r + 1}: tern {row['tern_plain']:.1f} -> {row['tern_spec']:.1f} t/s "
              f"({row['tern_accept'] * 100:.0f}% kept), llama.cpp {peer_plain:.1f} -> {peer_spec_ts:.1f} t/s "
              f"({peer_acc * 100:.0f}% kept)", file=sys.stderr)
        for k in ("tern_plain", "tern_spec", "peer_plain", "peer_spec"):
            keep(k, row[k])
        # the speedup of a round is spec / plain measured within that round
        keep("tern_speedup", row["tern_spec"] / row["tern_plain"])
        keep("peer_speedup", row["peer_spec"] / row["peer_plain"])

    how = f"draft {os.path.basename(a.draft)}" if a.draft else f"n-gram (lookup {a.ngram_n})"
    acc_t = sum(x["tern_accept"] for x in rows) / len(rows)
    acc_p = sum(x["peer_accept"] for x in rows) / len(rows)
    print(f"\n{os.path.basename(a.model)}, {how}, at most {a.draft_max} drafts, {rows[0]['n_prompt']}-token prompt, "
          f"{a.n} tokens greedy, {a.t} threads; best of {a.rounds} rounds (speedup: best of the per-round ratios)\n")
    print("| engine | plain t/s | speculative t/s | speedup | drafts kept |")
    print("|---|---:|---:|---:|---:|")
    print(f"| tern | {best['tern_plain']:.1f} | {best['tern_spec']:.1f} | {best['tern_speedup']:.2f}x | {acc_t * 100:.1f}% |")
    print(f"| llama.cpp | {best['peer_plain']:.1f} | {best['peer_spec']:.1f} | {best['peer_speedup']:.2f}x | {acc_p * 100:.1f}% |")
    print(f"| tern / llama.cpp | {best['tern_plain'] / best['peer_plain']:.2f}x | {best['tern_spec'] / best['peer_spec']:.2f}x | | |")
    if not all(x["same_tokens"] for x in rows):
        print("\nwarning: tern's speculative run gave other tokens than its plain run in some round", file=sys.stderr)
    if a.out:
        with open(a.out + ".tmp", "w") as f:
            json.dump({"rows": rows, "best": best}, f, indent=1)
        os.replace(a.out + ".tmp", a.out)


if __name__ == "__main__":
    main()
