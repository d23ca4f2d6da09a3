#!/usr/bin/env python
"""One-text latency: `Featurizer.embed_sentences([text])` against sentence-transformers' `encode([text])` on the same
model folder, measured interleaved in one run (issue 42's target: ctxrep at or below sentence-transformers).

Both load the model once and warm up on a few texts first; then, for --repeats rounds, every SST sentence of the
sample is embedded alone by one and then by the other (the order alternating per round), and the per-call times
are collected. Reported: median and p95 milliseconds of each, and their ratio (ctxrep / sentence-transformers;
target <= 1.0). Same threads for both (--threads); the vectors are compared too (max abs difference).

Run:  .venv/bin/python benchmarks/one_text.py                  # minilm, 200 sentences x 3 rounds
      .venv/bin/python benchmarks/one_text.py --texts 20 --repeats 1   # smoke test (not a result)
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
from _common import DEFAULT_DATA, cpu_model, load_corpus


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="minilm")
    p.add_argument("--texts", type=int, default=200)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--data", type=Path, default=DEFAULT_DATA)
    args = p.parse_args()

    import torch
    from sentence_transformers import SentenceTransformer

    from ctxrep import Featurizer
    from ctxrep.models.loading import resolve

    torch.set_num_threads(args.threads)
    texts = [" ".join(s) for s in load_corpus(args.data, "sst", args.texts)]
    fz = Featurizer(args.model, num_threads=args.threads)  # sentence_pooling auto: the folder's own, as ST
    st = SentenceTransformer(str(resolve(args.model).folder), device="cpu")
    runners = {
        "ctxrep": lambda t: fz.embed_sentences([t])[0],
        "sentence-transformers": lambda t: st.encode([t], convert_to_numpy=True)[0],
    }
    for run in runners.values():  # warm-up: the first calls build what later ones reuse
        for t in texts[:10]:
            run(t)
    times: dict[str, list[float]] = {name: [] for name in runners}
    worst = 0.0
    for r in range(args.repeats):
        order = list(runners) if r % 2 == 0 else list(reversed(runners))
        for t in texts:
            got = {}
            for name in order:
                start = time.perf_counter()
                got[name] = runners[name](t)
                times[name].append(time.perf_counter() - start)
            worst = max(worst, float(np.abs(got["ctxrep"] - got["sentence-transformers"]).max()))
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f}")
    print(
        f"\n{args.model}, {args.texts} SST sentences x {args.repeats} rounds, one text a call, {args.threads} threads"
    )
    print("| library | median ms | p95 ms |")
    print("|---|---|---|")
    for name, seconds in times.items():
        ms = 1000 * np.array(seconds)
        print(f"| {name} | {np.median(ms):.1f} | {np.percentile(ms, 95):.1f} |")
    ratio = np.median(times["ctxrep"]) / np.median(times["sentence-transformers"])
    print(f"\nctxrep / sentence-transformers (medians) = {ratio:.2f} (target <= 1.0); vectors max |diff| {worst:.1e}")


if __name__ == "__main__":
    main()
