"""`ctxrep finetune`: train a task model on a data set, evaluate it on dev, save model, metrics and plots.

--task is a row of ctxrep.tasks.kinds' table: a benchmark data set in its own format (sst2, sst5, conll2003, upos,
glue-pair, squad, stsb, sick-r) or what to do with the user's own files (classify, pair, regress, tag, span, wic:
ctxrep.data.table reads CSV / TSV / JSONL / CoNLL columns, gzip-compressed or not, with the column options below; wic
also reads WiC's own files). The row answers everything task-specific: which options apply, the default settings,
and the Python example printed at the end (how to apply the model with `ctxrep predict` and load it in Python).
"""

from __future__ import annotations

import click

from ctxrep.cli.big_models import big_model_options, join_processes, pop_lora
from ctxrep.cli.common import user_errors
from ctxrep.data.tags import TAG_SCHEMES
from ctxrep.tasks.kinds import COLUMN_SETTINGS, KINDS, NAMES, kind
from ctxrep.train.precision import DEFAULT_PRECISION, PRECISIONS, describe, resolve_precision

COLUMN_RULE = "a header name or a column number counted from 1 (-1: the last); JSONL: a field name"
HEADER_HELP = (
    "CSV / TSV: whether the first row names the columns. Needed only when every column is given by number (the "
    "first row could then be an example); a column given by name means --header."
)


def _task_help() -> str:
    return "; ".join(f"{k.name}: {k.reads}" for k in KINDS.values()) + "."


@click.command("finetune")
@click.option("--task", type=click.Choice(NAMES), required=True, help=_task_help())
@click.option(
    "--train",
    "train",
    type=click.Path(dir_okay=False),
    required=True,
    help="Training file (gzip-compressed read as is).",
)
@click.option("--dev", "dev", type=click.Path(dir_okay=False), required=True, help="Development file.")
@click.option(
    "--format",
    type=click.Choice(["csv", "tsv", "jsonl", "conll"]),
    default=None,
    help="Your files' format (default: from the name: .csv, .tsv, .jsonl; tag: CoNLL columns).",
)
@click.option("--header/--no-header", default=None, help=HEADER_HELP)
@click.option(
    "--text-column",
    default=None,
    help=f"classify / pair / regress / wic: the text column, {COLUMN_RULE}. [default: text]",
)
@click.option(
    "--text-pair-column",
    default=None,
    help="pair / wic: the second text's column [default: text_pair]; regress: give it for text pairs.",
)
@click.option(
    "--label-column",
    default=None,
    help="classify / pair / wic: the label column; regress: the score column. [default: label]",
)
@click.option(
    "--word-column",
    default=None,
    help="tag: the word column, a number counted from 1 (-1: the last; JSONL: a field holding a list). [default: 1]",
)
@click.option("--tag-column", default=None, help="tag: the tag column. [default: -1, the last]")
@click.option("--question-column", default=None, help="span: the question field. [default: question]")
@click.option("--context-column", default=None, help="span: the context field. [default: context]")
@click.option(
    "--answers-column",
    default=None,
    help='span: the answers field ({"text": [...], "answer_start": [...]}). [default: answers]',
)
@click.option("--model", default="minilm", show_default=True, help="Encoder name or folder.")
@click.option(
    "--device",
    default="cpu",
    show_default=True,
    help="Where to train and predict: cpu, cuda, cuda:1 (the estimators' `device`).",
)
@click.option(
    "--precision",
    type=click.Choice(PRECISIONS),
    default=DEFAULT_PRECISION,
    show_default=True,
    help="fp32; bf16: bfloat16 autocast for training and prediction (weights and optimizer stay float32); auto: "
    "bf16 where the CPU has avx512_bf16 or AMX, or on a GPU with bf16, else fp32 (saved in metrics.json and the "
    "model's parameters).",
)
@click.option("--mode", type=click.Choice(["finetune", "frozen"]), default="finetune", show_default=True)
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True, help="Output folder.")
@click.option(
    "--max-epochs",
    type=int,
    default=None,
    help="Passes over the training data [default: the task's measured recipe when fine-tuning (4 for regress, stsb, "
    "sick-r, wic), else 3].",
)
@click.option(
    "--max-steps",
    type=int,
    default=None,
    help="Stop after this many optimizer steps (the schedule is laid out over them; --max-epochs is then ignored).",
)
@click.option(
    "--batch-size",
    type=int,
    default=None,
    help="[default: 16 for regress, stsb, sick-r, wic when fine-tuning, else 32]",
)
@click.option(
    "--lr",
    type=float,
    default=None,
    help="Peak learning rate [default: fine-tuning 1e-4 (the measured best for MiniLM; span: 5e-5), frozen 1e-3].",
)
@click.option("--warmup-fraction", type=float, default=0.1, show_default=True, help="Share of steps of warm-up.")
@click.option("--max-length", type=int, default=None, help="Longest input in pieces (default: the model's).")
@click.option("--limit", type=int, default=None, help="Use only the first N train and dev examples.")
@click.option("--crf", is_flag=True, help="Tagging: a CRF output layer with Viterbi decoding.")
@click.option(
    "--tag-scheme",
    type=click.Choice(TAG_SCHEMES),
    default=None,
    help="Tagging: entity scoring scheme (default: auto; conll2003: iob1; upos: none).",
)
@click.option(
    "--keep",
    type=click.Choice(["best", "last"]),
    default="best",
    show_default=True,
    help="Which epoch's weights are saved and reported: the one with the best dev score (with --early-stopping: the "
    "best validation score), or the last one. The run says which epoch it kept.",
)
@click.option("--early-stopping", is_flag=True, help="Hold out --validation-fraction and stop when it stalls.")
@click.option("--validation-fraction", type=float, default=0.1, show_default=True)
@click.option("--slanted-triangular", is_flag=True, help="ULMFiT's slanted triangular schedule.")
@click.option("--discriminative-lr", is_flag=True, help="Layer l gets lr / 2.6^(L - l).")
@click.option("--gradual-unfreezing", is_flag=True, help="Unfreeze one encoder layer per epoch from the top.")
@click.option("--cache-dir", default=None, help="Frozen-feature cache (default ~/.cache/ctxrep/features).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--progress/--no-progress",
    default=True,
    show_default=True,
    help="A progress bar on a terminal (plain lines in a log); --no-progress: plain progress lines every ~10 s.",
)
@click.option(
    "--train-phrases",
    is_flag=True,
    help="SST: train on every labelled phrase of the trees (GLUE's SST-2 training set).",
)
@big_model_options
@user_errors
def finetune(
    task, train, dev, out_dir, limit, train_phrases, crf, tag_scheme, seed, progress, precision, **options
) -> None:
    """Train on --train, report on --dev, save to --out (model/, metrics.json, report.txt, PNG plots).

    Ctrl-C stops at once with exit status 130; a run stopped before its end writes no model/ or metrics.json
    (fine-tuning keeps no checkpoint: run the command again)."""
    from ctxrep.tasks.experiment import experiment

    row = kind(task)
    columns = {name: options.pop(name) for name in COLUMN_SETTINGS}  # the task's row says which it reads
    tagger_options = {}
    if crf or tag_scheme is not None:
        if not {"crf", "tag_scheme"} <= row.options:
            users = "|".join(k.name for k in KINDS.values() if "crf" in k.options)
            raise click.UsageError(f"--crf and --tag-scheme are for tagging (--task {users}), not --task {task}")
        tagger_options = {"crf": crf} | ({"tag_scheme": tag_scheme} if tag_scheme is not None else {})
    chosen = resolve_precision(precision, options["device"])  # auto: from the hardware's description
    note = [describe(chosen, precision)]
    options["lora"] = pop_lora(options)
    dist = join_processes(options["fsdp"])

    def echo(text: str) -> None:  # the precision line comes with experiment's first, after its checks of the data
        while note:
            click.echo(note.pop())
        click.echo(text)

    if not dist.is_main:  # under torchrun rank 0 reports and writes the folder; the others train beside it
        import tempfile

        out_dir, echo, progress = tempfile.mkdtemp(prefix="ctxrep-rank"), lambda text: None, False
    metrics = experiment(
        task=task,
        train=train,
        dev=dev,
        out_dir=out_dir,
        limit=limit,
        echo=echo,
        train_phrases=train_phrases,
        columns=columns,
        random_state=seed,
        progress=True if progress else "lines",
        bf16=chosen == "bf16",
        **options,
        **tagger_options,
    )
    from ctxrep.train import distributed

    distributed.shutdown()
    if not dist.is_main:
        return
    click.echo(f"dev {metrics['score_name']} {metrics['score']:.4f}; wrote {out_dir}")
    click.echo(how_to_use(task, out_dir, metrics["estimator"]))


def how_to_use(task: str, out_dir, estimator: str) -> str:
    """The lines `ctxrep finetune` ends with: how to predict from the CLI and how to load the model in Python."""
    model = f"{out_dir}/model"
    return "\n".join(
        [
            "use it:",
            f"  ctxrep predict --model {model} --input FILE --out preds.csv   # FILE: the texts, read as --task {task}"
            " reads them (labels optional)",
            f"  python: from ctxrep.tasks import {estimator}",
            f"          model = {estimator}.load({model!r})          # or ctxrep.tasks.load({model!r})",
            f"          model.predict({kind(task).example})",
        ]
    )
