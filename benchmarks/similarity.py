"""STS evaluation of sentence vectors (SentEval / MTEB: cosine of the two vectors against the gold score, Spearman
x 100) with the packaged MiniLM, zero-shot and as a bi-encoder fine-tuned on the task's training pairs.

Rows (issue 26's targets):
  zero-shot  STS-B dev and SICK trial: the folder's own pooling (sentence_pooling="model": mean over every token,
             then L2 normalisation, as sentence-transformers) and ctxrep's default (mean of the word vectors)
  finetune   ctxrep.tasks.SentenceEncoder trained on STS-B train (scored on STS-B dev) and on SICK train (scored
             on SICK trial); the STS benchmark's readme asks that STS-B systems not be trained on SICK, so each
             model sees only its own task's training pairs

    .venv/bin/python benchmarks/similarity.py --rows zero-shot
    .venv/bin/python benchmarks/similarity.py --rows finetune --device cuda
    .venv/bin/python benchmarks/similarity.py --rows zero-shot,finetune --limit 64 --epochs 1   # a smoke test

Needs ../shared/data (stsb/, sick/). Prints one line per row and writes them as JSON with --json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from _common import cpu_model

import ctxrep
from ctxrep.data.sts import read_sts
from ctxrep.tasks.sentence_encoder import SentenceEncoder
from ctxrep.vectors.similarity import sts_evaluate

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
TASKS = {  # name: (train file, evaluation file, evaluation split's name)
    "STS-B": ("stsb/sts-train.csv", "stsb/sts-dev.csv", "dev"),
    "SICK-R": ("sick/SICK_train.txt", "sick/SICK_trial.txt", "trial"),
}
TARGETS = {("STS-B", "zero-shot model pooling"): 86.72, ("STS-B", "zero-shot mean of words"): 85.87}
FINETUNE_TARGET = {"STS-B": 89.7}


def load(path: Path, limit: int | None) -> tuple[list[tuple[str, str]], list[float]]:
    pairs = read_sts(path)[:limit]
    return [(p.text_a, p.text_b) for p in pairs], [p.score for p in pairs]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--rows", default="zero-shot,finetune", help="comma-separated: zero-shot, finetune")
    ap.add_argument("--tasks", default="STS-B,SICK-R")
    ap.add_argument("--limit", type=int, default=None, help="only the first N pairs of every file (smoke test)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--loss", default="cosent", choices=["cosine", "cosent"])
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--warmup", type=float, default=0.1)
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--save", type=Path, default=None, help="save each fine-tuned model under this folder")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    rows = set(args.rows.split(","))
    results = []
    where = {
        "device": args.device,
        "cpu": cpu_model(),
        "gpu": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else None,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }
    print(f"# {where}")

    def record(task: str, row: str, split: str, scores: dict, seconds: float, **extra) -> None:
        target = TARGETS.get((task, row)) or (FINETUNE_TARGET.get(task) if row.startswith("fine-tuned") else None)
        target = None if args.limit is not None else target  # the targets are for the whole files
        met = (
            None
            if target is None
            else (abs(scores["spearman"] - target) <= 0.005 if row.startswith("zero") else scores["spearman"] >= target)
        )
        results.append(
            {
                "task": task,
                "row": row,
                "split": split,
                **scores,
                "seconds": seconds,
                "target": target,
                "met": met,
                **extra,
            }
        )
        note = (
            ""
            if target is None
            else f"  (target {'=' if row.startswith('zero') else '>='} {target}: {'met' if met else 'MISSED'})"
        )
        print(
            f"{task:7s} {split:5s} {row:40s} Spearman {scores['spearman']:6.2f}  Pearson {scores['pearson']:6.2f}  n={scores['pairs']}  {seconds:7.1f}s{note}",
            flush=True,
        )

    for task in args.tasks.split(","):
        train_file, eval_file, split = TASKS[task]
        dev_pairs, dev_scores = load(args.data / eval_file, args.limit)
        a, b = [p[0] for p in dev_pairs], [p[1] for p in dev_pairs]
        if "zero-shot" in rows:
            for row, pooling in (("zero-shot model pooling", "model"), ("zero-shot mean of words", "mean")):
                start = time.perf_counter()
                kwargs = {"device": args.device} if args.device != "cpu" else {}
                fz = ctxrep.Featurizer(args.model, sentence_pooling=pooling, **kwargs)
                record(task, row, split, sts_evaluate(fz, a, b, dev_scores), time.perf_counter() - start)
        if "finetune" in rows:
            train_pairs, train_scores = load(args.data / train_file, args.limit)
            enc = SentenceEncoder(
                args.model,
                loss=args.loss,
                max_epochs=args.epochs,
                batch_size=args.batch_size,
                lr=args.lr,
                warmup_fraction=args.warmup,
                max_length=args.max_length,
                random_state=args.seed,
                device=args.device,
            )
            start = time.perf_counter()
            enc.fit(train_pairs, train_scores, eval_set=(dev_pairs, dev_scores))
            seconds = time.perf_counter() - start
            row = f"fine-tuned bi-encoder ({args.loss}, {args.epochs} ep)"
            epochs = [round(h["dev_spearman"], 2) for h in enc.history_]
            record(
                task,
                row,
                split,
                enc.evaluate(dev_pairs, dev_scores),
                seconds,
                train_pairs=len(train_pairs),
                dev_by_epoch=epochs,
            )
            print(f"        dev Spearman after each epoch: {epochs}", flush=True)
            if args.save is not None:
                enc.save(args.save / task)
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "settings": vars(args) | {"data": str(args.data), "save": str(args.save), "json": str(args.json)},
                    "where": where,
                    "results": results,
                },
                indent=2,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
