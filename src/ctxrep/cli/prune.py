"""`ctxrep prune`: remove the least important attention heads of a fine-tuned estimator's encoder.

The workflow is the library's `ctxrep.compress.prune.prune_estimator`; this command reads the task files, loads the
saved estimator and prints each step.

--out DIR holds:
  config.json, model.safetensors, tokenizer files   the pruned encoder (config.pruned_heads): ctxrep.load_model(DIR)
  estimator/        the pruned task model (<Class>.load; its `model` parameter is DIR)
  importance.png    head importance of the model as given (Michel et al. 2019), layers x heads
  curve.png         with --curve: dev score against the fraction of heads pruned
  prune.json        the steps (importance, heads removed), parameter counts, scores
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from ctxrep.cli.common import user_errors
from ctxrep.tasks.experiment import TASKS


def _estimator_folder(path: Path) -> Path:
    """A folder written by an estimator's save: DIR itself, or DIR/model as `ctxrep finetune --out DIR` writes it."""
    for folder in (path, path / "model"):
        file = folder / "config.json"
        if file.is_file() and "estimator" in json.loads(file.read_text()):
            return folder
    raise FileNotFoundError(
        f"{path}: not a saved task model (no config.json naming an estimator here or in {path / 'model'}); give the "
        "--out folder of `ctxrep finetune`"
    )


def load_estimator(path: Path, task: str):
    """The estimator saved in PATH (or PATH/model) as `ctxrep finetune --out` wrote it, and its folder; refused in
    one line when its estimator class is not --task's (prune and distill --task read it)."""
    from ctxrep.tasks.experiment import make_estimator

    folder = _estimator_folder(path)
    saved = json.loads((folder / "config.json").read_text())["estimator"]
    cls = type(make_estimator(task))
    if saved != cls.__name__:
        raise ValueError(
            f"{folder} holds a {saved}, but --task {task} is a {cls.__name__} task; give the matching --task"
        )
    return cls.load(folder), folder


@click.command("prune")
@click.option(
    "--model",
    "model_dir",
    type=click.Path(file_okay=False, exists=True),
    required=True,
    help="A fine-tuned task model: the --out folder of `ctxrep finetune` (or its model/ folder).",
)
@click.option("--task", type=click.Choice(TASKS), required=True, help="Data set format and task (as in finetune).")
@click.option(
    "--train",
    "train",
    type=click.Path(dir_okay=False),
    required=True,
    help="Training file: head importance is computed on a held-out slice of it.",
)
@click.option("--fraction", type=float, required=True, help="Share of all attention heads to remove, in [0, 1).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True, help="Output folder.")
@click.option(
    "--steps",
    type=int,
    default=1,
    show_default=True,
    help="Prune in this many steps, recomputing importance after each.",
)
@click.option(
    "--dev",
    "dev",
    type=click.Path(dir_okay=False),
    default=None,
    help="Development file: scored before and after pruning (and at each step with --curve).",
)
@click.option("--curve", is_flag=True, help="Write curve.png: dev score against the fraction pruned (needs --dev).")
@click.option(
    "--finetune-epochs",
    type=int,
    default=0,
    show_default=True,
    help="Fine-tune the pruned model this many epochs on the rest of the training data.",
)
@click.option(
    "--importance-fraction",
    type=float,
    default=0.1,
    show_default=True,
    help="Share of the training data held out to compute head importance on.",
)
@click.option("--batch-size", type=int, default=32, show_default=True, help="Batch size for head importance.")
@click.option("--limit", type=int, default=None, help="Use only the first N train and dev examples.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the held-out slice.")
@user_errors
def prune(
    model_dir,
    task,
    train,
    fraction,
    out_dir,
    steps,
    dev,
    curve,
    finetune_epochs,
    importance_fraction,
    batch_size,
    limit,
    seed,
) -> None:
    """Prune the least important attention heads (Michel et al. 2019) of a fine-tuned model; save it to --out."""
    from ctxrep.compress.prune import prune_estimator, pruned_heads
    from ctxrep.tasks.experiment import read_task

    if curve and dev is None:
        raise ValueError(
            "--curve scores every pruning step on held-out data: give --dev (importance uses --train only)"
        )
    if not 0 < importance_fraction < 1:
        raise ValueError(f"--importance-fraction must be in (0, 1), got {importance_fraction}")
    if finetune_epochs < 0 or batch_size < 1:
        raise ValueError("--finetune-epochs must be >= 0 and --batch-size >= 1")
    out = Path(out_dir)
    estimator, source = load_estimator(Path(model_dir), task)
    if out.resolve() in (source.resolve(), Path(model_dir).resolve()):
        raise ValueError(f"--out {out} is the folder of the model being pruned; give a new folder")
    data = read_task(task, train, limit)
    dev_data = read_task(task, dev, limit) if dev is not None else None

    def after_step(record, dev_score) -> None:
        click.echo(f"step {record.step}: removed {_heads(record.heads)} (fraction {record.fraction:.3f})")
        if dev_score is not None:
            click.echo(f"  dev score {dev_score:.4f}")

    report = prune_estimator(
        estimator,
        data.X,
        data.y,
        fraction,
        out,
        steps=steps,
        dev=(dev_data.X, dev_data.y) if dev_data is not None else None,
        curve=curve,
        finetune_epochs=finetune_epochs,
        importance_fraction=importance_fraction,
        batch_size=batch_size,
        seed=seed,
        score_name=f"dev score ({task})",
        about={"model": str(source), "task": task},
        after_step=after_step,
    )
    encoder = estimator.model_.representation.encoder
    summary = (
        f"pruned {sum(len(v) for v in pruned_heads(encoder).values())} of "
        f"{encoder.num_layers * encoder.num_heads} heads (fraction {report['fraction_pruned']:.3f}); "
        f"parameters {report['parameters_before']:,} -> {report['parameters_after']:,}"
    )
    if dev_data is not None:
        summary += f"; dev score {report['dev_score_before']:.4f} -> {report['dev_score_after']:.4f}"
    click.echo(f"{summary}; wrote {out}")


def _heads(heads: dict[int, list[int]]) -> str:
    return ", ".join(f"layer {layer}: {' '.join(map(str, hs))}" for layer, hs in heads.items()) or "nothing"
