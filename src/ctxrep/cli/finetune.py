"""`ctxrep finetune`: train a task model on a data set, evaluate it on dev, save model, metrics and plots."""

from __future__ import annotations

import click

from ctxrep.cli.common import user_errors
from ctxrep.tasks.experiment import TASKS


@click.command("finetune")
@click.option("--task", type=click.Choice(TASKS), required=True, help="Data set format and task.")
@click.option("--train", "train", type=click.Path(dir_okay=False), required=True, help="Training file.")
@click.option("--dev", "dev", type=click.Path(dir_okay=False), required=True, help="Development file.")
@click.option("--model", default="minilm", show_default=True, help="Encoder name or folder.")
@click.option("--mode", type=click.Choice(["finetune", "frozen"]), default="finetune", show_default=True)
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True, help="Output folder.")
@click.option("--max-epochs", type=int, default=3, show_default=True)
@click.option("--batch-size", type=int, default=32, show_default=True)
@click.option("--lr", type=float, default=None, help="Peak learning rate (default 5e-5 finetune, 1e-3 frozen).")
@click.option("--max-length", type=int, default=None, help="Longest input in pieces (default: the model's).")
@click.option("--limit", type=int, default=None, help="Use only the first N train and dev examples.")
@click.option("--early-stopping", is_flag=True, help="Hold out --validation-fraction and stop when it stalls.")
@click.option("--validation-fraction", type=float, default=0.1, show_default=True)
@click.option("--slanted-triangular", is_flag=True, help="ULMFiT's slanted triangular schedule.")
@click.option("--discriminative-lr", is_flag=True, help="Layer l gets lr / 2.6^(L - l).")
@click.option("--gradual-unfreezing", is_flag=True, help="Unfreeze one encoder layer per epoch from the top.")
@click.option("--cache-dir", default=None, help="Frozen-feature cache (default ~/.cache/ctxrep/features).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--progress/--no-progress", default=True, show_default=True)
@click.option("--train-phrases", is_flag=True,
              help="SST: train on every labelled phrase of the trees (GLUE's SST-2 training set).")  # fmt: skip
@user_errors
def finetune(task, train, dev, model, mode, out_dir, max_epochs, batch_size, lr, max_length, limit, early_stopping,
             validation_fraction, slanted_triangular, discriminative_lr, gradual_unfreezing, cache_dir, seed,
             progress, train_phrases) -> None:  # fmt: skip
    """Train on --train, report on --dev, save to --out (model/, metrics.json, report.txt, PNG plots)."""
    from ctxrep.tasks.experiment import experiment

    metrics = experiment(
        task=task, train=train, dev=dev, model=model, mode=mode, out_dir=out_dir, limit=limit, echo=click.echo,
        max_epochs=max_epochs, batch_size=batch_size, lr=lr, max_length=max_length, early_stopping=early_stopping,
        validation_fraction=validation_fraction, slanted_triangular=slanted_triangular,
        discriminative_lr=discriminative_lr, gradual_unfreezing=gradual_unfreezing, cache_dir=cache_dir,
        random_state=seed, progress=progress, train_phrases=train_phrases,
    )  # fmt: skip
    click.echo(f"dev {metrics['score_name']} {metrics['score']:.4f}; wrote {out_dir}")
