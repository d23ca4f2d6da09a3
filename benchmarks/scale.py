#!/usr/bin/env python
"""`ctxrep embed` on one corpus three ways: one process, `--workers N` processes, and `--engine ray` (N actors).

The corpus: the first --texts SST train sentences, one per line, in a temporary file. Each run writes word vectors
of MiniLM's last layer into its own folder (shards of --shard-size texts), through the same library calls the CLI
makes (ctxrep.embed.corpus.embed_corpus, ctxrep.embed.ray_engine.embed_with_ray). Timed: the whole call, from reading the
input to the complete manifest (model loading and process / Ray start-up included: that is the overhead a user
pays), and separately the start-up alone (the same call on a 1-text corpus). The folders must hold the same rows,
index and vectors (max |difference| < 1e-5), or the script exits with 1.

Run:  .venv/bin/python benchmarks/scale.py                    # 4,000 sentences, 2 workers / actors
      .venv/bin/python benchmarks/scale.py --texts 200        # smoke test (not a result)
Stops by itself; the Ray cluster is a local one that the script starts (num_cpus = --workers) and shuts down.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import DEFAULT_DATA, cpu_model, load_corpus

from ctxrep.embed.corpus import EmbedJob, ShardFolder, embed_corpus, load_shards


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--texts", type=int, default=4000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--shard-size", type=int, default=250)
    p.add_argument("--threads", type=int, default=2, help="cores for the one-process run; split among the workers")
    p.add_argument("--data", type=Path, default=DEFAULT_DATA)
    p.add_argument("--no-ray", action="store_true", help="skip the Ray engine")
    args = p.parse_args()

    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f}", flush=True)
    sentences = load_corpus(args.data, "sst", args.texts)
    work = Path(tempfile.mkdtemp(prefix="ctxrep-scale-"))
    try:
        corpus, tiny = work / "corpus.txt", work / "one.txt"
        corpus.write_text("\n".join(" ".join(s) for s in sentences) + "\n")
        tiny.write_text(" ".join(sentences[0]) + "\n")
        words = sum(len(s) for s in sentences)

        def job(src: Path, name: str, threads: int) -> EmbedJob:
            out = work / name
            shutil.rmtree(out, ignore_errors=True)
            return EmbedJob(str(src), ShardFolder(str(out), args.shard_size), threads=threads)

        quiet = {"show_progress": False, "log": lambda m: None}
        runs = {
            "one process": lambda src, name: embed_corpus(job(src, name, args.threads), **quiet),
            f"--workers {args.workers}": lambda src, name: embed_corpus(
                job(src, name, args.threads), workers=args.workers, **quiet
            ),
        }
        if not args.no_ray:
            import ray

            from ctxrep.embed.ray_engine import embed_with_ray

            ray_start = timed(lambda: ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=False))
            threads_per_actor = max(1, args.threads // args.workers)
            runs[f"--engine ray ({args.workers} actors)"] = lambda src, name: embed_with_ray(
                job(src, name, threads_per_actor), actors=args.workers, **quiet
            )
        results = {}
        for name, run in runs.items():
            folder = name.split()[0].strip("-") + "-" + str(len(results))
            startup = timed(lambda run=run, folder=folder: run(tiny, folder + "-tiny"))
            total = timed(lambda run=run, folder=folder: run(corpus, folder))
            results[name] = (total, startup, work / folder)
        reference_vectors, reference_index = load_shards(results["one process"][2])
        ok = True
        print(
            f"\n{args.texts:,} SST sentences ({words:,} words), word vectors of minilm's last layer, shards of "
            f"{args.shard_size}; {args.threads} cores"
        )
        print("| run | seconds | sentences/s | vs one process | start-up s (1-text corpus) | same vectors |")
        print("|---|---|---|---|---|---|")
        one = results["one process"][0]
        for name, (total, startup, folder) in results.items():
            vectors, index = load_shards(folder)
            diff = float(np.abs(vectors - reference_vectors).max()) if vectors.shape == reference_vectors.shape else 1
            same = index == reference_index and diff < 1e-5
            ok &= same
            print(
                f"| {name} | {total:.1f} | {args.texts / total:.1f} | {one / total:.2f}x | {startup:.1f} | "
                f"{'yes' if same else 'NO'} (max diff {diff:.1e}) |"
            )
        if not args.no_ray:
            print(f"\nray.init (local, {args.workers} CPUs): {ray_start:.1f} s, not in the times above")
            ray.shutdown()
        if not ok:
            sys.exit("error: the folders differ")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
