#!/usr/bin/env python3
"""Distillation text for a draft model: the target's own continuations of openings of a corpus.

Sequence-level knowledge distillation (the draft learns to say what the target says): N lines of
the corpus (at least 6 words, none starting with an --exclude prefix: keep the prompts you will
benchmark out) are cut to their first 3..10 words, and the target continues each by -n tokens,
even-numbered ones greedily, odd ones sampled at temperature 0.8 (seed = the prompt's number),
with --jobs one-thread `tern generate` processes at once. Each prompt and its continuation is one
paragraph of the output, the format `tern train --data` reads. Fine-tune the draft on it with
`tern train --init draft.gguf --data OUT ...` (docs/speculative.md). Deterministic for given
arguments.
"""
import argparse
import concurrent.futures as cf
import os
import random
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tern", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "tern"))
    ap.add_argument("-m", dest="model", required=True, help="target model (GGUF)")
    ap.add_argument("--corpus", required=True, help="text whose lines give the prompts")
    ap.add_argument("-o", dest="out", required=True, help="output text (paragraphs)")
    ap.add_argument("--prompts", type=int, default=3200)
    ap.add_argument("-n", type=int, default=100, help="tokens generated per prompt")
    ap.add_argument("--exclude", action="append", default=[], help="leave out lines starting with this (repeatable)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    a = ap.parse_args()

    with open(a.corpus, encoding="utf-8") as f:
        lines = [l.strip() for l in f if len(l.split()) >= 6]
    lines = [l for l in lines if not l.startswith(tuple(a.exclude))]
    if not lines:
        sys.exit(f"distill_corpus: no line of {a.corpus} has 6 words or more (after --exclude)")
    rng = random.Random(a.seed)
    jobs = []
    for i in range(a.prompts):
        w = rng.choice(lines).split()
        jobs.append((" ".join(w[: rng.randint(3, min(10, len(w) - 1))]), i))

    def run(job):
        prompt, i = job
        r = subprocess.run([a.tern, "generate", "-m", a.model, "-p", prompt, "-n", str(a.n), "-t", "1",
                            "--temp", "0" if i % 2 == 0 else "0.8", "-s", str(i)], capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"distill_corpus: tern generate failed on prompt {i}: {r.stderr.strip()[-400:]}")
        return r.stdout.strip().replace("\n\n", "\n")

    tmp = a.out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f, cf.ThreadPoolExecutor(a.jobs) as ex:
        for k, text in enumerate(ex.map(run, jobs)):
            if text:
                f.write(text + "\n\n")
            if (k + 1) % 200 == 0 or k + 1 == len(jobs):
                print(f"distill_corpus: {k + 1}/{len(jobs)} prompts", file=sys.stderr, flush=True)
    os.replace(tmp, a.out)


if __name__ == "__main__":
    main()
