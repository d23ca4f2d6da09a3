#!/usr/bin/env python
"""Smaller encoders, measured in one run (issue 16): what distillation, head pruning and int8 cost and buy.

Rows (each for SST-2 and for CoNLL-2003, from ../shared/data):
  teacher       MiniLM-L6 (minilm, 6 x 384) fine-tuned on a random sample of the training set
  student-3L    a 3-layer student distilled task-specifically from the teacher (compress/distill_task.py:
                teacher layers [0, 2, 5] copied, KL at T = 2 scaled by T^2 mixed with the hard labels, alpha 0.5)
  pruned-30%    the teacher with 30% / 50% of its attention heads removed (compress/prune.py: Michel et al.'s
  pruned-50%    importance on a held-out slice of the training data, 2 steps; --prune-finetune-epochs N adds
                rows "pruned-30% + N ep" / "pruned-50% + N ep": the same pruned models retrained N epochs on the
                training sample without the held-out slice)
  int8 teacher  the same models predicting with quantize="int8" (ctxrep.runtime.fast.quantize_int8, SmoothQuant-calibrated;
  int8 student  --int8 adds these rows)

Columns:
  parameters    of the encoder (the task heads add a few hundred to a few thousand)
  file size     the SST-2 task model's model.safetensors; int8 rows: computed from the int8 weights (one byte per
                weight of the int8 linear layers, float32 per-channel scales, biases and everything else)
  tokens/s      featurization throughput of the SST-2 model's encoder on benchmarks/featurize.py's work: its corpus
                reader (SST training sentences, already split into words), ctxrep.Featurizer(layers=-1,
                pooling="mean"), one warm-up, round-robin over the rows, best of --repeats; tokens = real subword
                tokens with [CLS]/[SEP], counted once with the tokenizer (every row has the teacher's tokenizer)
  SST-2 acc     dev accuracy (sst/dev.txt, neutral sentences dropped as GLUE does: 872)
  CoNLL F1      dev entity F1, conlleval semantics (conll2003/eng.testa: 3,250 sentences)

Training sets are random samples (sst/train.txt is ordered by label: never its first N) of --sst-train and
--conll-train examples, printed at the start. The defaults are sized so that a full run takes about an hour on 2
CPU cores; --limit N caps every training and dev set at N examples (a dry run, not a result).

Run:  .venv/bin/python benchmarks/compress.py                                  # full run, ~1 hour on 2 cores
      .venv/bin/python benchmarks/compress.py --limit 40 --epochs 1 --sentences 100 --repeats 1   # dry run
Writes --out (benchmarks/results/compress): compress.md (the table and the checks), compress.json, compress.png
(accuracy against tokens/s), and the models (teacher/, student/, pruned-*/ per task).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch
from _common import (  # the corpus reader, the table
    fmt_table,
    load_corpus,
)

from ctxrep.compress import prune as P
from ctxrep.compress.distill_task import (
    distill_estimator,
    export_encoder,
    save_distilled,
)
from ctxrep.featurize import Featurizer
from ctxrep.tasks.experiment import make_estimator, read_task

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
TASKS = {"sst2": ("sst/train.txt", "sst/dev.txt"), "conll2003": ("conll2003/eng.train", "conll2003/eng.testa")}
TARGET_STUDENT_ACCURACY = 0.97  # of the teacher's SST-2 accuracy
TARGET_STUDENT_SPEED = 1.8  # x the teacher's tokens/s
TARGET_PRUNED_DROP = 1.5  # SST-2 accuracy points at 50% of heads pruned


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the shared data folder")
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "compress")
    p.add_argument("--sst-train", type=int, default=4000, help="SST-2 training sentences (random sample)")
    p.add_argument("--conll-train", type=int, default=3000, help="CoNLL-2003 training sentences (random sample)")
    p.add_argument("--epochs", type=int, default=2, help="epochs of fine-tuning the teacher and of distillation")
    p.add_argument("--lr", type=float, default=5e-5, help="the teacher's peak learning rate")
    p.add_argument("--student-lr", type=float, default=1e-4, help="the student's peak learning rate")
    p.add_argument("--student-layers", type=int, default=3)
    p.add_argument("--temperature", type=float, default=2.0)
    p.add_argument("--alpha", type=float, default=0.5)
    p.add_argument("--prune-finetune-epochs", type=int, default=0, help="retrain each pruned model this long")
    p.add_argument("--importance-examples", type=int, default=256, help="held-out training examples for importance")
    p.add_argument("--int8", action="store_true", help="add the int8 rows (needs ctxrep.runtime.fast)")
    p.add_argument("--sentences", type=int, default=2000, help="sentences featurized for tokens/s")
    p.add_argument("--repeats", type=int, default=3, help="timed featurization runs per row (best kept)")
    p.add_argument("--limit", type=int, default=None, help="cap every training and dev set at N (a dry run)")
    p.add_argument("--tasks", nargs="+", choices=list(TASKS), default=list(TASKS))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.limit is not None and args.limit < 2:
        p.error("--limit must be at least 2")
    for name in ("sst_train", "conll_train", "epochs", "sentences", "repeats", "threads", "importance_examples"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def sample(data, n: int | None, rng: np.random.Generator):
    """n examples drawn at random (all when n is None or larger), in file order."""
    if n is None or n >= len(data.X):
        return data
    keep = np.sort(rng.permutation(len(data.X))[:n])
    return type(data)([data.X[i] for i in keep], [data.y[i] for i in keep])


def int8_copy(estimator):
    """The estimator predicting with quantize="int8" (a shallow copy; the original is left as it was), and the
    computed size in bytes of its int8 network's weights."""
    from ctxrep.runtime import fast

    q = copy.copy(estimator).set_params(quantize="int8")
    network = q._prediction_network(num_tokens=0)  # the int8 copy that its predict and score use
    size = sum(t.numel() * t.element_size() for t in network.state_dict().values())
    for module in network.modules():
        if isinstance(module, fast.Int8Linear):
            size += module.in_features * module.out_features + 8 * module.out_features  # int8 W, scales, bias
    return q, size


def featurizer_for(folder: Path, threads: int, int8: bool) -> Featurizer:
    # compile=False: the same eager code for every row (compiling costs 10-90 s per model)
    return Featurizer(
        str(folder), layers=-1, pooling="mean", num_threads=threads, compile=False, quantize="int8" if int8 else None
    )


def tokens_per_second(featurizers: dict[str, Featurizer], sentences: list[list[str]], repeats: int) -> dict:
    """Round-robin over the rows, best of `repeats` (benchmarks/featurize.py's timing)."""
    any_featurizer = next(iter(featurizers.values()))
    special = any_featurizer.tokenizer.template.num_special(pair=False)
    tokens = sum(len(a.tokens) + special for a in any_featurizer.tokenize(sentences))
    for f in featurizers.values():
        f.embed_words(sentences[:32])  # warm-up (int8 calibration, prepacking)
    best = {name: float("inf") for name in featurizers}
    for _ in range(repeats):
        for name, f in featurizers.items():
            gc.collect()
            t0 = time.perf_counter()
            f.embed_words(sentences)
            best[name] = min(best[name], time.perf_counter() - t0)
    return {name: tokens / seconds for name, seconds in best.items()} | {"_tokens": tokens}


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    sizes = {"sst2": args.sst_train, "conll2003": args.conll_train}
    why_no_int8 = None if args.int8 else "not asked for (--int8)"
    args.out.mkdir(parents=True, exist_ok=True)

    data = {}
    for task in args.tasks:
        train_file, dev_file = (args.data / rel for rel in TASKS[task])
        train_n = min(sizes[task], args.limit) if args.limit else sizes[task]
        data[task] = (
            sample(read_task(task, train_file), train_n, rng),
            sample(read_task(task, dev_file), args.limit, rng),
        )
        print(
            f"{task}: {len(data[task][0].X):,} training examples (random sample of {train_file.name}), "
            f"{len(data[task][1].X):,} dev examples; {args.epochs} epochs",
            flush=True,
        )

    rows: dict[str, dict] = {}  # row -> {"parameters", "file_size", "folder" (SST-2 encoder), task: score}
    seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def clock(label: str):
        t0 = time.perf_counter()
        yield
        seconds[label] = time.perf_counter() - t0
        print(f"  {label}: {seconds[label]:.0f} s", flush=True)

    for task in args.tasks:
        train, dev = data[task]
        out = args.out / task
        print(f"{task}:", flush=True)
        teacher = make_estimator(
            task, model="minilm", max_epochs=args.epochs, batch_size=32, lr=args.lr, random_state=args.seed
        )
        with clock(f"{task} teacher fit"):
            teacher.fit(train.X, train.y)
        teacher.save(out / "teacher" / "model")
        export_encoder(teacher, out / "teacher" / "encoder")
        models = {"teacher": (teacher, out / "teacher")}

        with clock(f"{task} distillation"):
            student = distill_estimator(
                teacher,
                train.X,
                train.y,
                student_layers=args.student_layers,
                temperature=args.temperature,
                alpha=args.alpha,
                encoder_dir=out / "student" / "encoder",
                lr=args.student_lr,
            )
        save_distilled(student, out / "student")
        models[f"student-{args.student_layers}L"] = (student, out / "student")

        held = np.sort(rng.permutation(len(train.X))[: min(args.importance_examples, max(1, len(train.X) // 10))])
        rest = np.setdiff1d(np.arange(len(train.X)), held)
        X_held, y_held = [train.X[i] for i in held], [train.y[i] for i in held]
        for fraction in (0.3, 0.5):
            name = f"pruned-{fraction:.0%}"
            pruned = type(teacher).load(out / "teacher" / "model")
            task_loss = P.estimator_loss(pruned, X_held, y_held)
            with clock(f"{task} {name}"):
                batches, loss_fn = task_loss.batches, task_loss.loss_fn
                P.prune_iteratively(
                    task_loss.encoder, lambda enc, b=batches, f=loss_fn: P.head_importance(enc, b, f), fraction, steps=2
                )
            save_distilled(pruned, out / name)  # encoder/ (config.pruned_heads) + model/
            models[name] = (copy.deepcopy(pruned), out / name)
            if args.prune_finetune_epochs:  # a further row: the same pruned model retrained (the rest of train)
                pruned.set_params(warm_start=True, max_epochs=args.prune_finetune_epochs)
                with clock(f"{task} {name} fine-tuning"):
                    pruned.fit([train.X[i] for i in rest], [train.y[i] for i in rest])
                pruned.set_params(warm_start=False, max_epochs=args.epochs)
                save_distilled(pruned, out / f"{name}-retrained")
                models[f"{name} + {args.prune_finetune_epochs} ep"] = (pruned, out / f"{name}-retrained")

        for name, (est, folder) in list(models.items()):
            row = rows.setdefault(name, {})
            with clock(f"{task} {name} dev score"):
                row[task] = float(est.score(dev.X, dev.y))
            if task == "sst2" or "parameters" not in row:
                row["parameters"] = P.parameter_count(est.model_.representation.encoder)
                model_file = folder / "model" / "model.safetensors"
                row["file_size"] = model_file.stat().st_size
                row["folder"] = str((folder / "encoder") if (folder / "encoder").is_dir() else folder)
            if why_no_int8 is None and name in ("teacher", f"student-{args.student_layers}L"):
                q, size = int8_copy(est)
                q_row = rows.setdefault(f"int8 {name}", {})
                with clock(f"{task} int8 {name} dev score"):
                    q_row[task] = float(q.score(dev.X, dev.y))
                if task == "sst2" or "parameters" not in q_row:
                    q_row |= {"parameters": row["parameters"], "file_size": size, "folder": row["folder"], "int8": True}
        models.clear()
        gc.collect()

    print("featurization:", flush=True)
    sentences = load_corpus(args.data, "sst", args.sentences)
    featurizers = {
        name: featurizer_for(Path(row["folder"]), args.threads, row.get("int8", False)) for name, row in rows.items()
    }
    with clock("tokens/s"):
        speed = tokens_per_second(featurizers, sentences, args.repeats)
    for name, row in rows.items():
        row["tokens_per_s"] = speed[name]

    report(args, rows, data, speed["_tokens"], len(sentences), why_no_int8, seconds, time.perf_counter() - started)
    return 0


def report(args, rows, data, tokens, n_sentences, why_no_int8, seconds, total) -> None:
    teacher = rows["teacher"]
    student = rows.get(f"student-{args.student_layers}L", {})
    header = ["model", "parameters", "file size (MB)", "tokens/s", "vs teacher", "SST-2 dev acc", "CoNLL-2003 dev F1"]
    table = [
        [
            name,
            f"{r['parameters']:,}",
            f"{r['file_size'] / 1e6:.1f}",
            f"{r['tokens_per_s']:,.0f}",
            f"{r['tokens_per_s'] / teacher['tokens_per_s']:.2f}x",
            f"{100 * r['sst2']:.2f}" if "sst2" in r else "-",
            f"{100 * r['conll2003']:.2f}" if "conll2003" in r else "-",
        ]
        for name, r in rows.items()
    ]
    checks = []
    if "sst2" in teacher and "sst2" in student:
        ratio = student["sst2"] / teacher["sst2"]
        checks.append(
            [
                "student SST-2 accuracy / teacher's",
                f"{ratio:.3f}",
                f">= {TARGET_STUDENT_ACCURACY}",
                "PASS" if ratio >= TARGET_STUDENT_ACCURACY else "FAIL",
            ]
        )
    if student:
        ratio = student["tokens_per_s"] / teacher["tokens_per_s"]
        checks.append(
            [
                "student tokens/s / teacher's",
                f"{ratio:.2f}x",
                f">= {TARGET_STUDENT_SPEED}x",
                "PASS" if ratio >= TARGET_STUDENT_SPEED else "FAIL",
            ]
        )
    for name in [n for n in rows if n.startswith("pruned-50%")]:  # as pruned, and retrained when asked for
        half = rows[name]
        if "sst2" in half and "sst2" in teacher:
            drop = 100 * (teacher["sst2"] - half["sst2"])
            checks.append(
                [
                    f"{name} SST-2 accuracy lost (points)",
                    f"{drop:.2f}",
                    f"<= {TARGET_PRUNED_DROP}",
                    "PASS" if drop <= TARGET_PRUNED_DROP else "FAIL",
                ]
            )
        ratio = half["tokens_per_s"] / teacher["tokens_per_s"]
        checks.append([f"{name} tokens/s / teacher's", f"{ratio:.2f}x", "> 1", "PASS" if ratio > 1 else "FAIL"])
    sizes = ", ".join(f"{task} {len(train.X):,} train / {len(dev.X):,} dev" for task, (train, dev) in data.items())
    notes = [
        (
            f"torch {torch.__version__}, {args.threads} threads, {platform.processor() or platform.machine()}; "
            f"{sizes}; {args.epochs} epochs; featurization: {n_sentences:,} SST sentences, {tokens:,} tokens, "
            f"best of {args.repeats}; whole run {total / 60:.1f} min"
        ),
        f"int8 rows: {'included' if why_no_int8 is None else 'skipped: ' + why_no_int8}",
    ]
    if args.limit:
        notes.append(f"--limit {args.limit}: a dry run, not a result")
    text = "\n".join(
        [
            fmt_table(header, table, True),
            "",
            fmt_table(["check", "measured", "target", "result"], checks, True),
            "",
            *notes,
        ]
    )
    print(text)
    (args.out / "compress.md").write_text(text + "\n")
    (args.out / "compress.json").write_text(
        json.dumps(
            {"rows": rows, "checks": checks, "seconds": seconds, "notes": notes, "args": vars(args)},
            indent=2,
            default=str,
        )
        + "\n"
    )
    plot(rows, args.out / "compress.png")
    print(f"wrote {args.out / 'compress.md'}, compress.json, compress.png")


def plot(rows: dict, path: Path) -> None:
    """Dev score against featurization tokens/s, one panel per task, one labelled point per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = [
        (t, label)
        for t, label in (("sst2", "SST-2 dev accuracy (%)"), ("conll2003", "CoNLL-2003 dev F1 (%)"))
        if any(t in r for r in rows.values())
    ]
    fig, axes = plt.subplots(1, len(tasks), figsize=(5.5 * len(tasks), 4), squeeze=False)
    for ax, (task, label) in zip(axes[0], tasks):
        for name, r in rows.items():
            if task in r:
                ax.scatter(r["tokens_per_s"], 100 * r[task], marker="s" if r.get("int8") else "o")
                ax.annotate(
                    name, (r["tokens_per_s"], 100 * r[task]), textcoords="offset points", xytext=(4, 4), fontsize=8
                )
        ax.set_xlabel("featurization tokens/s")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    fig.suptitle("MiniLM-L6 compressed: accuracy against speed", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
