"""Frozen features vs fine-tuning (Peters, Ruder & Smith 2019) with the default MiniLM on the shared data (--data).

    SST-2 (binary, sentence level) dev accuracy      target fine-tuned >= 0.88
    CoNLL-2003 eng.testa entity F1 (conlleval)       target fine-tuned >= 0.88

Each run goes through ctxrep.tasks.experiment (read, train, evaluate on dev, save) and is timed.
Full run (about an hour per fine-tuning run on 2 CPU cores):

    python benchmarks/finetune.py --markdown-out benchmarks/finetune.md

Quick check:  python benchmarks/finetune.py --limit 200 --epochs 1

The CRF output layer (TokenTagger(crf=True); Ma & Hovy 2016, TagLM) on CoNLL-2003, same encoder and settings with
and without it, frozen and fine-tuned (4 runs; the table then gives the CRF's gain in entity F1 per mode):

    python benchmarks/finetune.py --task conll2003 --crf both --markdown-out benchmarks/finetune-crf.md

`--crf` alone runs the CRF taggers only; `--crf no` (the default) none.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import time
from pathlib import Path

from _common import DEFAULT_DATA

FILES = {  # task: (train, dev) under the data folder
    "sst2": ("sst/train.txt", "sst/dev.txt"),
    "conll2003": ("conll2003/eng.train", "conll2003/eng.testa"),
}
# Chosen to reach the targets: MiniLM (6 layers, 384 wide) fine-tunes best near lr 1e-4; 10% linear warm-up.
SETTINGS = {
    ("sst2", "finetune"): dict(max_epochs=3, lr=1e-4, batch_size=32, max_length=128, pooling="cls"),
    ("sst2", "frozen"): dict(max_epochs=10, lr=1e-3, batch_size=32, pooling="concat"),
    ("conll2003", "finetune"): dict(max_epochs=4, lr=1e-4, batch_size=32, max_length=128, word_pooling="first"),
    ("conll2003", "frozen"): dict(max_epochs=10, lr=1e-3, batch_size=32, word_pooling="first"),
}
TARGETS = {("sst2", "finetune"): 0.88, ("conll2003", "finetune"): 0.88}


def _literal(value: str):
    """'5e-5' -> 5e-05, '4' -> 4, 'true' -> True, anything else stays a string."""
    for convert in (int, float):
        try:
            return convert(value)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(value.lower(), value)


def crf_gains(rows: list[tuple]) -> list[str]:
    """One line per (task, mode) that ran with and without the CRF: its entity F1 gain."""
    scores = {(task, mode, params.get("crf", False)): score for task, mode, _, score, _, _, params in rows}
    lines = []
    for (task, mode, crf), score in scores.items():
        if crf and (task, mode, False) in scores:
            base = scores[(task, mode, False)]
            gain = 100 * (score - base)
            lines.append(f"{task} {mode}: CRF {score:.4f} vs softmax {base:.4f} ({gain:+.2f} F1 points)")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", choices=["sst2", "conll2003", "all"], default="all")
    parser.add_argument("--mode", choices=["finetune", "frozen", "all"], default="all")
    parser.add_argument("--epochs", type=int, default=None, help="Override the number of epochs of every run.")
    parser.add_argument("--limit", type=int, default=None, help="Use only the first N train and dev examples.")
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the shared data folder (sst/, conll2003/)")
    parser.add_argument("--out", default=None, help="Folder for the runs' outputs (default: a temporary folder).")
    parser.add_argument("--cache-dir", default=None, help="Frozen-feature cache folder.")
    parser.add_argument("--markdown-out", default=None, help="Write the result table as Markdown here.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--train-phrases",
        action="store_true",
        help="SST: train on every labelled phrase (GLUE's SST-2 training set), score on sentences.",
    )
    parser.add_argument(
        "--crf",
        nargs="?",
        const="yes",
        default="no",
        choices=["no", "yes", "both"],
        help="CoNLL-2003: a CRF output layer (--crf), none (no), or runs with and without it (both).",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Override one estimator setting of every run, e.g. --set lr=5e-5 --set pooling=mean.",
    )
    args = parser.parse_args(argv)

    import torch

    from ctxrep.tasks.experiment import experiment

    tasks = ["sst2", "conll2003"] if args.task == "all" else [args.task]
    modes = ["finetune", "frozen"] if args.mode == "all" else [args.mode]
    out_root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="ctxrep-finetune-bench-"))
    rows = []
    runs = []
    for task in tasks:
        for mode in modes:
            crfs = {"no": [False], "yes": [True], "both": [False, True]}[args.crf] if task == "conll2003" else [False]
            runs += [(task, mode, crf) for crf in crfs]
    for task, mode, crf in runs:
        params = dict(SETTINGS[(task, mode)]) | ({"crf": True} if crf else {})
        if args.epochs is not None:
            params["max_epochs"] = args.epochs
        for item in args.set:
            key, _, value = item.partition("=")
            params[key] = _literal(value)
        train, dev = (args.data / name for name in FILES[task])
        if not train.is_file():
            sys.exit(f"error: {train} is missing: pass the shared data folder with --data")
        phrases = args.train_phrases and task == "sst2"
        print(f"== {task} {mode} {params}" + (" (trained on all phrases)" if phrases else ""), flush=True)
        started = time.perf_counter()
        name = f"{task}-{mode}" + ("-crf" if crf else "")
        metrics = experiment(
            task=task,
            train=train,
            dev=dev,
            model=args.model,
            mode=mode,
            out_dir=out_root / name,
            limit=args.limit,
            random_state=args.seed,
            cache_dir=args.cache_dir,
            progress=True,
            train_phrases=phrases,
            **params,
        )
        if phrases:
            params = params | {"train": "all phrases"}
        seconds = time.perf_counter() - started
        rows.append((task, mode, metrics["score_name"], metrics["score"], TARGETS.get((task, mode)), seconds, params))

    header = "| task | mode | dev metric | score | target | wall clock | settings |\n|---|---|---|---|---|---|---|"
    lines = [header]
    for task, mode, name, score, target, seconds, params in rows:
        target_text = f">= {target:.2f} ({'met' if score >= target else 'missed'})" if target else "-"
        settings = ", ".join(f"{k}={v}" for k, v in params.items())
        lines.append(
            f"| {task} | {mode} | {name} | {score:.4f} | {target_text} | {seconds / 60:.1f} min | {settings} |"
        )
    table = "\n".join(lines)
    gains = crf_gains(rows)
    if gains:
        table += "\n\n" + "\n".join(f"- {line}" for line in gains)
    print(table)
    if args.markdown_out:
        command = "python " + " ".join(
            shlex.quote(a) for a in [sys.argv[0], *(argv if argv is not None else sys.argv[1:])]
        )
        text = (
            "# Frozen features vs fine-tuning (MiniLM)\n\n"
            f"Command: `{command}`\n\n"
            f"Model: {args.model}; limit: {args.limit or 'full data'}; seed {args.seed}; "
            f"torch threads: {torch.get_num_threads()}.\n\n{table}\n"
        )
        Path(args.markdown_out).write_text(text)
        print(f"wrote {args.markdown_out}")


if __name__ == "__main__":
    main()
