"""Cross-encoders and word-in-context with the packaged MiniLM (issue 26's targets), through ctxrep.tasks.experiment
(the code `ctxrep finetune` runs: read, train, evaluate on dev, save):

    stsb   SequenceRegressor on (sentence1, sentence2) pairs, STS benchmark train -> dev    target Pearson >= 0.85
    sick   the same row trained on SICK train, scored on SICK trial (SICK-R)             recorded
    wic    WordInContextClassifier, WiC train -> dev accuracy                            target >= 0.63

Full run (the data as ../shared/data lays it out: stsb/, sick/, wic/):

    python benchmarks/cross_encoder.py --data ../shared/data --markdown-out benchmarks/results/cross_encoder.md

Quick check on a tiny subset:  python benchmarks/cross_encoder.py --limit 64 --epochs 1
Settings can be overridden per run: --set stsb.lr=5e-5 --set wic.max_epochs=4. Each row prints the command-line
equivalent (`ctxrep finetune ...`) beside its scores, and the machine it ran on.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROWS = ("stsb", "sick", "wic")
# (task, train file, dev file) under --data
FILES = {
    "stsb": ("stsb", "stsb/sts-train.csv", "stsb/sts-dev.csv"),
    "sick": ("sick-r", "sick/SICK_train.txt", "sick/SICK_trial.txt"),
    "wic": ("wic", "wic/train/train.data.txt", "wic/dev/dev.data.txt"),
}
# MiniLM (6 layers, 384 wide) fine-tunes best near lr 1e-4 (benchmarks/finetune.py); 10% linear warm-up.
SETTINGS = {
    "stsb": dict(max_epochs=4, lr=1e-4, batch_size=16, max_length=128, pooling="cls"),
    "sick": dict(max_epochs=4, lr=1e-4, batch_size=16, max_length=128, pooling="cls"),
    "wic": dict(max_epochs=4, lr=1e-4, batch_size=16, max_length=128),  # 5e-5 gave 0.616, 3e-5 0.618 (RESULTS.md)
}
TARGETS = {"stsb": ("pearson", 0.85), "wic": ("accuracy", 0.63)}


def _literal(value: str):
    for convert in (int, float):
        try:
            return convert(value)
        except ValueError:
            pass
    return {"true": True, "false": False, "none": None}.get(value.lower(), value)


def machine() -> str:
    """The CPU model (and GPU when one is used), the core count and the load average when the run started."""
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg() if hasattr(os, "getloadavg") else ("?",)
    return f"{cpu}, {os.cpu_count()} cores, load average {load[0]:.2f}"


def command_line(row: str, settings: dict, data: Path, model: str, device: str, seed: int) -> str:
    task, train, dev = FILES[row]
    options = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in settings.items() if k not in ("pooling",))
    extra = f" --model {model}" if model != "minilm" else ""
    extra += f" --device {device}" if device != "cpu" else ""
    extra += f" --seed {seed}" if seed else ""
    return f"ctxrep finetune --task {task} --train {data / train} --dev {data / dev}{extra} {options} --out runs/{row}"


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="../shared/data", help="Folder holding stsb/, sick/ and wic/.")
    parser.add_argument("--rows", default=",".join(ROWS), help=f"Comma-separated rows to run ({', '.join(ROWS)}).")
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--epochs", type=int, default=None, help="Override the number of epochs of every run.")
    parser.add_argument("--limit", type=int, default=None, help="Use only the first N train and dev examples.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", action="append", default=[], help="ROW.PARAM=VALUE, e.g. stsb.lr=5e-5.")
    parser.add_argument("--out", default=None, help="Folder for the runs' outputs (default: a temporary folder).")
    parser.add_argument("--json-out", default=None, help="Append one JSON line per row here.")
    parser.add_argument("--markdown-out", default=None, help="Write the result table as Markdown here.")
    args = parser.parse_args(argv)

    from ctxrep.tasks.experiment import experiment

    data = Path(args.data)
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = sorted(set(rows) - set(ROWS))
    if unknown:
        parser.error(f"unknown rows {unknown}; choose from {', '.join(ROWS)}")
    overrides: dict[str, dict] = {}
    for item in args.set:
        key, _, value = item.partition("=")
        row, _, param = key.partition(".")
        if row not in ROWS or not param or not value:
            parser.error(f"--set {item!r}: expected ROW.PARAM=VALUE with ROW one of {', '.join(ROWS)}")
        overrides.setdefault(row, {})[param] = _literal(value)
    where = machine()
    print(f"machine: {where}", flush=True)
    out_root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="cross_encoder-"))
    results = []
    for row in rows:
        task, train, dev = FILES[row]
        settings = SETTINGS[row] | overrides.get(row, {})
        if args.epochs is not None:
            settings["max_epochs"] = args.epochs
        started = time.perf_counter()
        metrics = experiment(
            task=task,
            train=data / train,
            dev=data / dev,
            model=args.model,
            mode="finetune",
            out_dir=out_root / row,
            limit=args.limit,
            echo=lambda text: print(text, flush=True),
            random_state=args.seed,
            device=args.device,
            progress="lines",
            **settings,
        )
        seconds = time.perf_counter() - started
        result = {
            "row": row,
            "task": task,
            "train_examples": metrics["train_examples"],
            "dev_examples": metrics["dev_examples"],
            "settings": settings,
            "seed": args.seed,
            "seconds": round(seconds, 1),
            "machine": where,
            "device": args.device,
            "command": command_line(row, settings, data, args.model, args.device, args.seed),
        }
        for name in ("pearson", "spearman", "r2", "accuracy", "macro_f1"):
            if name in metrics:
                result[name] = metrics[name]
        if row in TARGETS:
            name, target = TARGETS[row]
            result["target"] = f"{name} >= {target}"
            result["met"] = bool(result[name] >= target)
        results.append(result)
        print(json.dumps(result), flush=True)
        if args.json_out:
            with open(args.json_out, "a") as f:
                f.write(json.dumps(result) + "\n")
    if args.markdown_out:
        lines = [
            "| row | train -> dev | Pearson | Spearman | accuracy | target | seconds |",
            "| --- | --- | ---: | ---: | ---: | --- | ---: |",
        ]
        for r in results:
            cells = [f"{r[k]:.4f}" if k in r else "" for k in ("pearson", "spearman", "accuracy")]
            met = "" if "met" not in r else f"{r['target']}: {'met' if r['met'] else 'missed'}"
            size = f"{r['train_examples']:,} -> {r['dev_examples']:,}"
            lines.append(f"| {r['row']} | {size} | {' | '.join(cells)} | {met} | {r['seconds']:.0f} |")
        lines.append(f"\nmachine: {where}; device: {args.device}")
        Path(args.markdown_out).write_text("\n".join(lines) + "\n")
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
