"""`ctxrep train-sentence-encoder`: fine-tune a bi-encoder (ctxrep.tasks.SentenceEncoder) on a file and save it as a
sentence-transformers folder; `ctxrep evaluate-sentence-encoder`: STS Spearman / Pearson of a saved one on a file.

    ctxrep train-sentence-encoder --train sts-train.csv --format sts --dev sts-dev.csv --loss cosent --out runs/sts
    ctxrep train-sentence-encoder --train pairs.tsv --text-column question --text-pair-column answer --out runs/qa
    ctxrep train-sentence-encoder --train sentences.txt --loss simcse --out runs/simcse
    ctxrep train-sentence-encoder --sparse --model naver/splade-v3 --train pairs.tsv --out runs/splade
    ctxrep evaluate-sentence-encoder runs/sts --data sts-test.csv
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from ctxrep.cli.big_models import big_model_options, join_processes, pop_lora
from ctxrep.cli.common import ctrl_c_waits, user_errors
from ctxrep.cli.finetune import HEADER_HELP
from ctxrep.data.sentence_pairs import FORMATS

COLUMN = "a header name or a column number counted from 1 (-1: the last); JSONL: a field name"
SCORED_LAYOUTS = (
    "the STS benchmark / GLUE STS-B / SICK layouts (recognised from the first line, whatever the name), or CSV / TSV "
    "/ JSONL with the text columns and --score-column (default: text, text_pair, score)"
)


# tasks/sentence_encoder.py's LOSSES and POOLINGS, written out so that `--help` imports no torch
# (tests/test_imports.py keeps them equal).
LOSSES = ("mnrl", "simcse", "cosine", "cosent")
POOLINGS = ("model", "mean", "cls")


@click.command("train-sentence-encoder")
@click.option("--train", "train_path", required=True, help="Training file (pairs, triplets, scored pairs or texts).")
@click.option(
    "--dev",
    "dev_path",
    default=None,
    help=f"Scored pairs to report STS Spearman on after every epoch: {SCORED_LAYOUTS}.",
)
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Folder to save the model in.")
@click.option(
    "--model",
    default=None,
    help="Model name or folder to start from. [default: minilm; with --sparse google-bert/bert-base-uncased]",
)
@click.option(
    "--sparse",
    is_flag=True,
    help="Train SPLADE sparse vectors (ctxrep.tasks.SparseSentenceEncoder: the MLM head of a *ForMaskedLM folder, "
    "mnrl with dot products plus FLOPS regularisation) and save a sentence-transformers SparseEncoder folder.",
)
@click.option(
    "--query-regularizer-weight", type=float, default=5e-5, show_default=True, help="--sparse: FLOPS weight, queries."
)
@click.option(
    "--document-regularizer-weight",
    type=float,
    default=3e-5,
    show_default=True,
    help="--sparse: FLOPS weight, documents (positives and hard negatives).",
)
@click.option("--format", "fmt", type=click.Choice(FORMATS), default=None, help="[default: from the file name]")
@click.option("--header/--no-header", default=None, help=HEADER_HELP)
@click.option(
    "--loss",
    type=click.Choice(LOSSES),
    default=None,
    help="[default: cosent with scores, mnrl for pairs or triplets, simcse for a file of single texts; a file with "
    "columns that are not read needs --loss simcse to train on one column]",
)
@click.option("--text-column", default=None, help=f"The (first) text: {COLUMN}. [default: text]")
@click.option(
    "--text-pair-column",
    default=None,
    help="The second text (positive) of each example. [default: text_pair where the file has it]",
)
@click.option("--negative-column", default=None, help="A hard negative per example (mnrl).")
@click.option("--score-column", default=None, help="The similarity score of each pair (cosine, cosent).")
@click.option("--limit", type=int, default=None, help="Use only the first N training (and dev) examples.")
@click.option("--pooling", type=click.Choice(POOLINGS), default="model", show_default=True)
@click.option("--normalize/--no-normalize", default=None, help="[default: as the model folder says]")
@click.option("--epochs", default=1, show_default=True)
@click.option("--max-steps", type=int, default=None)
@click.option("--batch-size", default=32, show_default=True)
@click.option(
    "--mini-batch-size",
    type=click.IntRange(min=1),
    default=None,
    help="Cached in-batch negatives (GradCache): embed each batch N texts at a time, so a large --batch-size runs "
    "in the activation memory of N texts.",
)
@click.option("--lr", default=2e-5, show_default=True)
@click.option(
    "--scale", type=float, default=None, help="s of the mnrl / simcse / cosent losses. [default: 20; 1 with --sparse]"
)
@click.option("--max-length", default=128, show_default=True, help="Pieces per text (longer ones are truncated).")
@click.option("--seed", default=0, show_default=True)
@click.option("--device", default="cpu", show_default=True)
@big_model_options
@user_errors
def train_sentence_encoder(
    train_path,
    dev_path,
    out_dir,
    model,
    sparse,
    query_regularizer_weight,
    document_regularizer_weight,
    fmt,
    header,
    loss,
    text_column,
    text_pair_column,
    negative_column,
    score_column,
    limit,
    pooling,
    normalize,
    epochs,
    max_steps,
    batch_size,
    mini_batch_size,
    lr,
    scale,
    max_length,
    seed,
    device,
    gradient_checkpointing,
    fsdp,
    **lora_options,
) -> None:
    """Fine-tune a sentence encoder on TRAIN and save it to OUT (a sentence-transformers folder; with --lora the
    adapter over the base model, which sentence-transformers loads and `ctxrep merge` makes a plain folder of)."""
    from ctxrep.data.sentence_pairs import read_scored_pairs, read_sentence_examples
    from ctxrep.tasks.sentence_encoder import choose_loss

    if sparse and (pooling != "model" or normalize is not None):
        raise click.UsageError("--pooling and --normalize set dense vectors; --sparse pools SPLADE's max over tokens")
    columns = _named_columns(text_column, text_pair_column, negative_column)
    train = read_sentence_examples(train_path, columns, score_column, fmt, header, limit)
    loss = choose_loss(loss, train)
    eval_set = None
    if dev_path is not None:
        pair = columns[:2] if columns and len(columns) >= 2 else None
        dev = read_scored_pairs(dev_path, pair, score_column, None, header, limit)
        eval_set = (dev.X, dev.y)
    X = [x[0] for x in train.X] if loss == "simcse" else train.X
    settings = dict(
        loss=loss,
        max_length=max_length,
        max_epochs=epochs,
        max_steps=max_steps,
        batch_size=batch_size,
        mini_batch_size=mini_batch_size,
        lr=lr,
        random_state=seed,
        device=device,
        progress=True,
        lora=pop_lora(lora_options),
        gradient_checkpointing=gradient_checkpointing,
        fsdp=fsdp,
    )
    dist = join_processes(fsdp)
    settings |= {"model": model} if model is not None else {}
    settings |= {"scale": scale} if scale is not None else {}
    if sparse:
        from ctxrep.tasks.sparse_encoder import SparseSentenceEncoder

        settings |= dict(
            query_regularizer_weight=query_regularizer_weight, document_regularizer_weight=document_regularizer_weight
        )
        enc = SparseSentenceEncoder(**settings)
    else:
        from ctxrep.tasks.sentence_encoder import SentenceEncoder

        enc = SentenceEncoder(pooling=pooling, normalize=normalize, **settings)
    enc.fit(X, train.y, eval_set=eval_set)
    from ctxrep.train import distributed

    distributed.shutdown()
    if not dist.is_main:  # under torchrun rank 0 writes the folder
        return
    with ctrl_c_waits("saving the model"):  # history.json, written last, marks a complete folder
        out = enc.save(out_dir)
        (Path(out) / "history.json").write_text(json.dumps(enc.history_, indent=2) + "\n")
    _report_trained(enc, out, len(X), loss, sparse)


def _named_columns(text_column, text_pair_column, negative_column) -> list[str] | None:
    """The columns to read in order (text, pair, negative); None where no option names one: text, and text_pair
    where the file has it."""
    if negative_column is not None and text_pair_column is None:
        raise click.UsageError("--negative-column needs --text-pair-column (mnrl triplets: anchor, positive, negative)")
    named = (text_column, text_pair_column, negative_column)
    if all(c is None for c in named):
        return None
    return [text_column or "text", *(c for c in named[1:] if c is not None)]


def _report_trained(enc, out, n_examples: int, loss: str, sparse: bool) -> None:
    """The closing lines: what was trained, where it is, and how to use it."""
    last = enc.history_[-1]
    dev_note = f", dev Spearman {last['dev_spearman']:.2f}" if "dev_spearman" in last else ""
    click.echo(f"trained on {n_examples} examples ({loss}, {last['steps']} steps{dev_note}); saved to {out}")
    if sparse:
        click.echo(
            f"use it: ctxrep.vectors.sparse.SparseEncoder({str(out)!r}), SparseSentenceEncoder.load({str(out)!r}), "
            f"or sentence_transformers.SparseEncoder({str(out)!r})"
        )
        return
    click.echo(
        f"use it: ctxrep evaluate-sentence-encoder {out} --data FILE, ctxrep.Featurizer({str(out)!r}, "
        f"sentence_pooling='model'), SentenceEncoder.load({str(out)!r}), or "
        f"sentence_transformers.SentenceTransformer({str(out)!r})"
    )


@click.command("evaluate-sentence-encoder")
@click.argument("model", type=click.Path(file_okay=False, exists=True))
@click.option("--data", "data_path", required=True, help=f"Scored pairs: {SCORED_LAYOUTS}.")
@click.option(
    "--format", "fmt", type=click.Choice(["csv", "tsv", "jsonl", "sts"]), default=None, help="[default: detected]"
)
@click.option("--header/--no-header", default=None, help=HEADER_HELP)
@click.option("--text-column", default=None, help=f"The first text: {COLUMN}. [default: text]")
@click.option("--text-pair-column", default=None, help="The second text. [default: text_pair]")
@click.option("--score-column", default=None, help="The gold similarity score. [default: score]")
@click.option("--limit", type=int, default=None, help="Use only the first N pairs.")
@click.option("--device", default="cpu", show_default=True)
@user_errors
def evaluate_sentence_encoder(
    model, data_path, fmt, header, text_column, text_pair_column, score_column, limit, device
) -> None:
    """STS evaluation of a saved sentence encoder MODEL (a sentence-transformers folder): the cosine of each pair's
    two sentence vectors against the gold score, Spearman and Pearson x 100 (as SentEval and MTEB)."""
    from ctxrep.tasks.sentence_encoder import evaluate_file

    columns = [text_column or "text", text_pair_column or "text_pair"] if text_column or text_pair_column else None
    result = evaluate_file(
        model, data_path, device, columns=columns, score_column=score_column, format=fmt, header=header, limit=limit
    )
    click.echo(
        f"{data_path}: Spearman {result['spearman']:.2f}, Pearson {result['pearson']:.2f} ({result['pairs']:,} pairs)"
    )


COMMANDS = (train_sentence_encoder, evaluate_sentence_encoder)
