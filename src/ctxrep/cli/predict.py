"""`ctxrep predict`: apply a model that `ctxrep finetune` trained to a file (ctxrep.tasks.predict)."""

from __future__ import annotations

import click

from ctxrep.cli.common import user_errors
from ctxrep.cli.finetune import COLUMN_RULE, HEADER_HELP
from ctxrep.tasks.kinds import COLUMN_SETTINGS, KINDS, NAMES

# the labels of training files, which prediction input never reads (a kind's reader drops them when unlabelled)
LABEL_SETTINGS = ("label_column", "tag_column", "answers_column")
# the column settings some kind reads its prediction input with (tasks/kinds.py's rows), labels left out: one
# --option each below
COLUMN_OPTIONS = tuple(
    name
    for name in COLUMN_SETTINGS
    if name not in LABEL_SETTINGS and any(name in row.predict_columns() for row in KINDS.values())
)


@click.command("predict")
@click.option(
    "--model",
    "model_dir",
    type=click.Path(file_okay=False),
    required=True,
    help="A saved estimator: `ctxrep finetune`'s OUT/model (or a folder an estimator's save wrote).",
)
@click.option(
    "--input",
    "input_path",
    type=click.Path(dir_okay=False),
    required=True,
    help="Examples to predict: the texts alone (a label or score column may be there; it is not read). An STS "
    "model (stsb, sick-r) takes the benchmark's layout or a file of two texts per row.",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False),
    required=True,
    help="Predictions: .csv, .tsv or .jsonl (tags: CoNLL columns for any other name).",
)
@click.option(
    "--task",
    type=click.Choice(NAMES),
    default=None,
    help="How to read --input (default: the task the model was trained on, from MODEL/task.json).",
)
@click.option("--format", type=click.Choice(["csv", "tsv", "jsonl", "conll"]), default=None, help="--input's format.")
@click.option("--header/--no-header", default=None, help=HEADER_HELP)
@click.option("--device", default=None, help="Where to predict: cpu, cuda, cuda:1 (default: as saved, usually cpu).")
@click.option("--text-column", default=None, help=f"The text column, {COLUMN_RULE} (default: as at training).")
@click.option("--text-pair-column", default=None, help="The second text's column (default: as at training).")
@click.option("--word-column", default=None, help="tag: the word column, counted from 1 (default: as at training).")
@click.option("--question-column", default=None, help="span: the question field (default: as at training).")
@click.option("--context-column", default=None, help="span: the context field (default: as at training).")
@user_errors
def predict(model_dir, input_path, out, task, device, **options) -> None:
    """Predict every example of --input with a fine-tuned model; write one row per example to --out."""
    from ctxrep.tasks.predict import predict_file

    columns = {name: options.pop(name) for name in COLUMN_OPTIONS}
    result = predict_file(model_dir, input_path, out, task=task, columns=columns, echo=click.echo, device=device)
    click.echo(f"wrote {result.examples:,} predictions ({result.task}) to {result.out}")
