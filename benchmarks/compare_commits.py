#!/usr/bin/env python
"""ctxrep against an earlier ctxrep, side by side in one run: featurization, fine-tuning and pretraining throughput.

For a refactor that must not cost speed ("within 5% of the previous commit"). Each measurement runs in a fresh
subprocess with PYTHONPATH pointing at one source tree; the trees alternate (old, new, old, new, ...) and the best
of --repeats is kept for each, so drift on a shared machine hits both alike.

  featurize  Featurizer("minilm", layers=-1, pooling="mean").embed_words on N SST training sentences spread evenly
             over the file (it is ordered by label), model loading excluded, one warm-up call; tokens/s
  finetune   SequenceClassifier("minilm", pooling="mean") fitted on 640 of those sentences (their 5-class labels),
             batch 32 for --finetune-steps (40) optimizer steps after a 2-step fit that warms the process up; steps/s of
             the timed fit (loading and tokenizing included, as a user's fit)
  pretrain   benchmarks/pretrain_throughput.py's ctxrep worker (MaskedLMObjective, `small` shape, batch 32 x 128,
             AdamW, clipping), each tree running its own copy of the script; tokens/s
  short      the short job of issue 14: a fresh process that imports ctxrep, loads minilm and embeds the first 100
             SST sentences (nothing warmed up, nothing cached by the process); sentences per wall-clock second of
             the whole process, start to exit

Run:  git worktree add --detach /tmp/oldtree COMMIT
      .venv/bin/python benchmarks/compare_commits.py --old /tmp/oldtree --repeats 3
      git worktree remove /tmp/oldtree
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
DEFAULT_DATA = HERE.parent / "shared" / "data"

FEATURIZE = r"""
import json, re, sys, time, torch
torch.set_num_threads(int(sys.argv[3]))
from ctxrep.featurize import Featurizer
leaf = re.compile(r"\(\d+ ([^()]+)\)")
lines = [line for line in open(sys.argv[1], encoding="utf-8") if line.strip()]
step = max(len(lines) // int(sys.argv[2]), 1)  # spread over the file: it is ordered by label
sentences = [leaf.findall(line) for line in lines[::step][: int(sys.argv[2])]]
fz = Featurizer("minilm", layers=-1, pooling="mean")
fz.embed_words(sentences[:64])
t = time.perf_counter()
out = fz.embed_words(sentences)
seconds = time.perf_counter() - t
tokens = sum(len(a.tokens) for a in fz.tokenize(sentences)) + 2 * len(sentences)
import numpy as np
print(json.dumps({"tokens_per_s": tokens / seconds, "checksum": float(np.sum([o.sum() for o in out]))}))
"""

FINETUNE = r"""
import json, re, sys, time, torch
torch.set_num_threads(int(sys.argv[3]))
from ctxrep.tasks.classifier import SequenceClassifier
leaf = re.compile(r"\(\d+ ([^()]+)\)")
lines = [line for line in open(sys.argv[1], encoding="utf-8") if line.strip()]
step = max(len(lines) // 640, 1)
picked = lines[::step][:640]
texts, labels = [" ".join(leaf.findall(line)) for line in picked], [int(line[1]) for line in picked]
SequenceClassifier("minilm", pooling="mean", max_steps=2, random_state=0).fit(texts[:64], labels[:64])
t = time.perf_counter()
est = SequenceClassifier("minilm", pooling="mean", batch_size=32, max_steps=int(sys.argv[2]), random_state=0)
est.fit(texts, labels)
print(json.dumps({"steps_per_s": int(sys.argv[2]) / (time.perf_counter() - t)}))
"""


def run_short(tree: Path, sst: Path, threads: int) -> float:
    """Sentences per second of a whole fresh process: import, load, embed 100 sentences, exit."""
    import time

    env = dict(os.environ, PYTHONPATH=str(tree / "src"), OMP_NUM_THREADS=str(threads))
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", FEATURIZE.replace("fz.embed_words(sentences[:64])", ""), str(sst), "100", str(threads)],
        env=env,
        capture_output=True,
        text=True,
        cwd=tree,
    )
    seconds = time.perf_counter() - start
    if out.returncode:
        raise SystemExit(f"{tree}: the short job failed:\n{out.stderr[-2000:]}")
    return 100 / seconds


def run(tree: Path, args: list[str], threads: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree / "src"), OMP_NUM_THREADS=str(threads))
    out = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, cwd=tree)
    if out.returncode:
        raise SystemExit(f"{tree}: {' '.join(args[:2])} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--old", type=Path, required=True, help="the earlier source tree (a git worktree)")
    p.add_argument("--new", type=Path, default=HERE, help="the tree to compare (default: this checkout)")
    p.add_argument("--data", type=Path, default=DEFAULT_DATA)
    p.add_argument("--sentences", type=int, default=4000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=20, help="timed MLM steps per pretraining run")
    p.add_argument("--finetune-steps", type=int, default=40, help="timed optimizer steps per fine-tuning run")
    p.add_argument("--work", default="featurize,finetune,pretrain", help="which measurements, comma-separated")
    args = p.parse_args()
    works = args.work.split(",")
    sst = args.data / "sst" / "train.txt"
    if not sst.is_file():
        raise SystemExit(f"{sst}: not found; pass --data (the shared data folder)")
    trees = {"old": args.old.resolve(), "new": args.new.resolve()}
    best: dict[tuple[str, str], float] = {}
    runs: dict[tuple[str, str], list[float]] = {}
    checksums: dict[str, float] = {}
    for r in range(args.repeats):
        for name, tree in trees.items():
            measured = {}
            if "featurize" in works:
                f = run(tree, ["-c", FEATURIZE, str(sst), str(args.sentences), str(args.threads)], args.threads)
                checksums[name] = f["checksum"]
                measured["featurize"] = f["tokens_per_s"]
            if "finetune" in works:
                m = run(tree, ["-c", FINETUNE, str(sst), str(args.finetune_steps), str(args.threads)], args.threads)
                measured["finetune"] = m["steps_per_s"]
            if "pretrain" in works:
                m = run(
                    tree,
                    [
                        "benchmarks/pretrain_throughput.py",
                        "--worker",
                        "ctxrep",
                        "--malloc",
                        "tuned",
                        "--steps",
                        str(args.steps),
                        "--warmup",
                        "3",
                        "--threads",
                        str(args.threads),
                    ],
                    args.threads,
                )
                measured["pretrain"] = m["tokens_per_s"]
            if "short" in works:
                measured["short"] = run_short(tree, sst, args.threads)
            for work, value in measured.items():
                best[(work, name)] = max(best.get((work, name), 0.0), value)
                runs.setdefault((work, name), []).append(value)
            print(f"repeat {r + 1} {name}: " + ", ".join(f"{w} {v:.4g}/s" for w, v in measured.items()), flush=True)
    lines = [
        f"ctxrep {trees['new'].name} vs {trees['old']} ({args.threads} threads, best of {args.repeats}, alternating)",
        "",
        "| work | old per second (best) | new per second (best) | new / old (best) | new / old (median) |",
        "|---|---:|---:|---:|---:|",
    ]
    for work in works:
        old, new = best[(work, "old")], best[(work, "new")]
        median = statistics.median(runs[(work, "new")]) / statistics.median(runs[(work, "old")])
        lines.append(f"| {work} | {old:.4g} | {new:.4g} | {new / old:.3f} | {median:.3f} |")
    if checksums:
        lines.append("")
        lines.append(f"featurize checksum (sum of all vectors): old {checksums['old']:.4f}, new {checksums['new']:.4f}")
    print("\n" + "\n".join(lines))


if __name__ == "__main__":
    main()
