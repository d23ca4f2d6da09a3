#!/usr/bin/env python
"""Peak memory of `ctxrep embed --level sentence` on a million-sentence corpus: this checkout against d6c1d1b.

Issue 32's memory target: the look-ahead holds a bounded number of batches, and the peak resident memory of
`ctxrep embed` on a million sentences stays within 10% of the commit before the session's work (d6c1d1b).

  corpus    --sentences SST training sentences drawn with replacement (random seed 0) from every tree of
            <data>/sst/train.txt (the file is ordered by label: never its first N), the leaves joined by spaces,
            one per line, in a temporary folder
  encoder   a BERT of 1 layer, 32 wide (2 heads, 64 intermediate), random weights (seed 0), MiniLM's vocabulary and
            tokenizer, saved as a sentence-transformers folder (mean pooling, Normalize): compute is ~0, so the run
            measures the host pipeline's memory and fits minutes
  run       `ctxrep embed --level sentence --sentence-pooling model --threads T --no-compile` into a temporary
            folder, each tree in its own fresh process (PYTHONPATH = that tree's src, this venv's Python): the old
            tree from a `git worktree add --detach` of --old-commit in a temporary folder (removed at the end)
  measured  peak RSS of the process (os.wait4's ru_maxrss, which covers the process and any it waited for) and the
            wall time of the whole process (import, model load, embedding, shard writing); the RSS is also sampled
            from /proc every 0.1 s: a peak well above the highest sample of the run's first half means memory grows
            with the corpus (a look-ahead or output that is not bounded)

Both outputs are read back with this checkout's `ctxrep.load_vectors`: same row count, max |difference| < 1e-4
(else exit 1). --compile-default drops --no-compile (each tree's own default then decides).

Cost: d6c1d1b's process spends about 2 ms of CPU per sentence, this checkout's (at 0aee769) about 0.6 ms, plus
~3-5 s of start-up each (measured on the loaded shared 2-core machine): the full million takes roughly half an hour
on 2 quiet cores (25-45 min); 150,000 sentences take 4-7 min.

Run:  .venv/bin/python benchmarks/embed_memory.py                       # 1,000,000 sentences, ~25-45 min
      .venv/bin/python benchmarks/embed_memory.py --sentences 150000    # ~4-7 min
      .venv/bin/python benchmarks/embed_memory.py --sentences 20000     # quick trial (not a benchmark result)
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from _common import DEFAULT_DATA, read_sst, report, tiny_folder

REPO = Path(__file__).resolve().parents[1]
OLD_COMMIT = "d6c1d1b"
TARGET = 1.10  # peak RSS of this checkout / the old commit's
TOLERANCE = 1e-4
SEED = 0
POLL = 0.1  # seconds between RSS samples
# Imports the tree's ctxrep (checking that it is the one on PYTHONPATH) and runs its CLI with the given arguments.
CHILD = (
    "import sys, ctxrep\n"
    "if not ctxrep.__file__.startswith(sys.argv[1]):\n"
    "    sys.exit(f'error: imported {ctxrep.__file__}, not the tree under {sys.argv[1]}')\n"
    "from ctxrep.cli import main\n"
    "main(sys.argv[2:], prog_name='ctxrep')\n"
)


def write_corpus(data: Path, n: int, path: Path) -> tuple[int, int]:
    """n SST training sentences drawn with replacement (seed SEED) from every tree, one per line, into path;
    returns (trees in the file, characters written)."""
    sst = data / "sst" / "train.txt"
    if not sst.is_file():
        sys.exit(
            f"error: {sst} is missing. The benchmark samples sentences from the shared data folder beside the "
            "checkout (../shared/data); pass its location with --data DIR."
        )
    trees = [" ".join(words) for words in read_sst(sst) if words]  # every tree
    rng = random.Random(SEED)
    chars = 0
    with path.open("w", encoding="utf-8") as f:
        for k in range(0, n, 100_000):
            chunk = "\n".join(rng.choices(trees, k=min(100_000, n - k))) + "\n"
            chars += len(chunk)
            f.write(chunk)
    return len(trees), chars


def run_embed(src: Path, folder: Path, corpus: Path, out: Path, args: argparse.Namespace) -> dict:
    """One `ctxrep embed` process of the tree whose package is under src: its peak RSS (bytes) and wall seconds."""
    cli = ["embed", "--model", str(folder), "--input", str(corpus), "--out", str(out), "--level", "sentence"]
    cli += ["--sentence-pooling", "model", "--threads", str(args.threads)]
    if not args.compile_default:
        cli.append("--no-compile")
    threads = str(args.threads)
    env = dict(os.environ, PYTHONPATH=str(src), OMP_NUM_THREADS=threads, RAYON_NUM_THREADS=threads)
    log = out.with_suffix(".log")
    with log.open("w") as stderr:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(src), *cli], env=env, stdout=stderr, stderr=stderr, cwd=out.parent
        )
        samples = []  # (seconds, RSS bytes) every POLL seconds, to see whether memory grows as the corpus goes by
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)  # this child's own rusage, not RUSAGE_CHILDREN's
            if pid:
                break
            samples.append((time.perf_counter() - t0, rss_of(proc.pid)))
            time.sleep(POLL)
        seconds = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:]
        sys.exit(f"error: ctxrep embed of {src} exited with status {proc.returncode}; its output ends:\n{tail}")
    half = [rss for t, rss in samples if t <= seconds / 2]
    # ru_maxrss is in KiB on Linux; the first half's highest sample against the peak shows growth over the run
    return {"peak": usage.ru_maxrss * 1024, "seconds": seconds, "first_half": max(half, default=0)}


def rss_of(pid: int) -> int:
    """The resident set of process pid in bytes (0 once it has gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the shared data folder (sst/train.txt)")
    p.add_argument("--sentences", type=int, default=1_000_000, help="corpus size (default: 1,000,000)")
    p.add_argument("--threads", type=int, default=2, help="torch and tokenizer threads of each run (default: 2)")
    p.add_argument("--old-commit", default=OLD_COMMIT, help=f"the commit to compare with (default: {OLD_COMMIT})")
    p.add_argument("--compile-default", action="store_true", help="leave out --no-compile: each tree's default")
    p.add_argument("--markdown-out", type=Path)
    args = p.parse_args(argv)
    if args.sentences < 1:
        p.error(f"--sentences must be at least 1, got {args.sentences}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    import numpy as np

    import ctxrep
    from ctxrep.runtime.hardware import cpu_description

    with tempfile.TemporaryDirectory(prefix="embed_memory_") as tmp_name:
        tmp = Path(tmp_name)
        corpus = tmp / "corpus.txt"
        trees, chars = write_corpus(args.data, args.sentences, corpus)
        folder = tiny_folder(tmp / "tiny", SEED)
        old_tree = tmp / "old"
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "add", "--quiet", "--detach", str(old_tree), args.old_commit],
            check=True,
        )
        try:
            commit = subprocess.run(
                ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
            ).stdout.strip()
            load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
            trees_run = {
                f"{args.old_commit} (before issue 32)": old_tree / "src",
                f"this checkout ({commit})": REPO / "src",
            }
            results, outputs = {}, {}
            for name, src in trees_run.items():
                out = tmp / f"out-{len(results)}"
                results[name] = run_embed(src, folder, corpus, out, args)
                outputs[name] = out
            load_after = " ".join(f"{x:.2f}" for x in os.getloadavg())
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(old_tree)], check=False)
        arrays = [ctxrep.load_vectors(out).array for out in outputs.values()]

    old, new = results.values()
    ratio = new["peak"] / old["peak"]
    mib = 2**20
    lines = [
        f"| `ctxrep embed --level sentence`, tiny encoder, {args.sentences:,} SST sentences ({chars / mib:,.1f} MiB "
        f"of text), {args.threads} threads | peak RSS (MiB) | highest RSS in the run's first half (MiB) | wall (s) "
        "| sentences/s |",
        "| --- | ---: | ---: | ---: | ---: |",
        *(
            f"| {name} | {r['peak'] / mib:,.0f} | {r['first_half'] / mib:,.0f} | {r['seconds']:,.1f} "
            f"| {args.sentences / r['seconds']:,.0f} |"
            for name, r in results.items()
        ),
        "",
        f"- peak RSS, this checkout / {args.old_commit}: {ratio:.3f}x (target <= {TARGET:.2f}x: "
        f"{'met' if ratio <= TARGET else 'missed'}); wall time {new['seconds'] / old['seconds']:.2f}x",
    ]
    failed = []
    if arrays[0].shape != arrays[1].shape or arrays[0].shape[0] != args.sentences:
        failed.append(f"output shapes differ: {arrays[0].shape} vs {arrays[1].shape} for {args.sentences} sentences")
    else:
        diff = float(np.abs(arrays[0] - arrays[1]).max())
        lines.append(f"- outputs: {arrays[0].shape[0]:,} vectors each, max |difference| {diff:.1e}")
        if not diff < TOLERANCE:
            failed.append(f"max |difference| between the two outputs {diff:.3g} >= {TOLERANCE:g}")
    lines += [
        f"- corpus: drawn with replacement (seed {SEED}) from the {trees:,} trees of SST train; "
        f"--compile {'default' if args.compile_default else 'off (--no-compile)'}",
        f"- CPU: {cpu_description()}; python {platform.python_version()}; load average before {load_before}, "
        f"after {load_after}",
    ]
    text = "\n".join(lines)
    return report(text, args.markdown_out, failed)


if __name__ == "__main__":
    sys.exit(main())
