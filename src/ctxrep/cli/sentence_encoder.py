"""`ctxrep train-sentence-encoder`: fine-tune a bi-encoder (ctxrep.tasks.SentenceEncoder) on a file and save it as a
sentence-transformers folder.

    ctxrep train-sentence-encoder --train sts-train.csv --format sts --dev sts-dev.csv --loss cosent --out runs/sts
    ctxrep train-sentence-encoder --train pairs.tsv --text-column question --text-pair-column answer --out runs/qa
    ctxrep train-sentence-encoder --train sentences.txt --loss simcse --out runs/simcse
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from ctxrep.cli.common import user_errors
from ctxrep.data.sentence_pairs import FORMATS
from ctxrep.tasks.sentence_encoder import LOSSES, POOLINGS


@click.command("train-sentence-encoder")
@click.option("--train", "train_path", required=True, help="Training file (pairs, triplets, scored pairs or texts).")
@click.option("--dev", "dev_path", default=None, help="Scored pairs to report STS Spearman on after every epoch.")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Folder to save the model in.")
@click.option("--model", default="minilm", show_default=True, help="Model name or folder to start from.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default=None, help="[default: from the file name]")
@click.option(
    "--loss",
    type=click.Choice(LOSSES),
    default=None,
    help="[default: cosent with scores, simcse for one column, else mnrl]",
)
@click.option("--text-column", default="text", show_default=True)
@click.option("--text-pair-column", default=None, help="The second text (positive) of each example.")
@click.option("--negative-column", default=None, help="A hard negative per example (mnrl).")
@click.option("--score-column", default=None, help="The similarity score of each pair (cosine, cosent).")
@click.option("--pooling", type=click.Choice(POOLINGS), default="model", show_default=True)
@click.option("--normalize/--no-normalize", default=None, help="[default: as the model folder says]")
@click.option("--epochs", default=1, show_default=True)
@click.option("--max-steps", type=int, default=None)
@click.option("--batch-size", default=32, show_default=True)
@click.option("--lr", default=2e-5, show_default=True)
@click.option("--scale", default=20.0, show_default=True, help="s of the mnrl / simcse / cosent losses.")
@click.option("--max-length", default=128, show_default=True, help="Pieces per text (longer ones are truncated).")
@click.option("--seed", default=0, show_default=True)
@click.option("--device", default="cpu", show_default=True)
@user_errors
def train_sentence_encoder(
    train_path,
    dev_path,
    out_dir,
    model,
    fmt,
    loss,
    text_column,
    text_pair_column,
    negative_column,
    score_column,
    pooling,
    normalize,
    epochs,
    max_steps,
    batch_size,
    lr,
    scale,
    max_length,
    seed,
    device,
) -> None:
    """Fine-tune a sentence encoder on TRAIN and save it to OUT (a sentence-transformers folder)."""
    from ctxrep.data.sentence_pairs import read_sentence_examples
    from ctxrep.tasks.sentence_encoder import SentenceEncoder

    columns = [c for c in (text_column, text_pair_column, negative_column) if c is not None]
    train = read_sentence_examples(train_path, columns, score_column, fmt)
    if loss is None:
        loss = "cosent" if train.y is not None else ("simcse" if len(train.X[0]) == 1 else "mnrl")
    eval_set = None
    if dev_path is not None:
        dev = read_sentence_examples(dev_path, columns[:2], score_column, fmt)
        if dev.y is None or len(dev.X[0]) != 2:
            raise ValueError(
                f"{dev_path}: --dev needs scored pairs (two text columns and --score-column, or --format sts)"
            )
        eval_set = (dev.X, dev.y)
    X = [x[0] for x in train.X] if loss == "simcse" else train.X
    enc = SentenceEncoder(
        model,
        loss=loss,
        pooling=pooling,
        normalize=normalize,
        scale=scale,
        max_length=max_length,
        max_epochs=epochs,
        max_steps=max_steps,
        batch_size=batch_size,
        lr=lr,
        random_state=seed,
        device=device,
        progress=True,
    )
    enc.fit(X, train.y, eval_set=eval_set)
    out = enc.save(out_dir)
    (Path(out) / "history.json").write_text(json.dumps(enc.history_, indent=2) + "\n")
    last = enc.history_[-1]
    dev_note = f", dev Spearman {last['dev_spearman']:.2f}" if "dev_spearman" in last else ""
    click.echo(f"trained on {len(X)} examples ({loss}, {last['steps']} steps{dev_note}); saved to {out}")
    click.echo(
        f"use it: ctxrep.Featurizer({str(out)!r}, sentence_pooling='model'), "
        f"SentenceEncoder.load({str(out)!r}), or sentence_transformers.SentenceTransformer({str(out)!r})"
    )
