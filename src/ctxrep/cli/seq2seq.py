"""`ctxrep seq2seq`: fine-tune any encoder-decoder (BART, T5, Marian) on a (source, target) file, and generate.

ctxrep seq2seq train --model facebook/bart-base --train train.csv --valid dev.csv --source-column article \\
    --target-column summary --out runs/sum
ctxrep seq2seq generate --model runs/sum --input articles.txt --beam 4
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ctxrep.cli.common import exit_if_interrupted, user_errors


@click.group("seq2seq")
def seq2seq() -> None:
    """Encoder-decoders (BART, T5, Marian): fine-tune on your (source, target) files, generate."""


@seq2seq.command("train")
@click.option("--model", required=True, help="An encoder-decoder folder or Hub name (BART, mBART, T5, mT5, Marian).")
@click.option("--train", "train_file", type=click.Path(), required=True, help="CSV, TSV or JSONL of (source, target).")
@click.option(
    "--valid", "valid_file", type=click.Path(), default=None, help="Validation file: loss, ROUGE, BLEU, chrF."
)
@click.option(
    "--source-column",
    default="source",
    show_default=True,
    help="Header name or number from 1 (-1: last); JSONL: field.",
)
@click.option(
    "--target-column",
    default="target",
    show_default=True,
    help="Header name or number from 1 (-1: last); JSONL: field.",
)
@click.option("--format", "format_", type=click.Choice(["csv", "tsv", "jsonl"]), default=None)
@click.option("--header/--no-header", default=None, help="Whether the first row names the columns.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True, help="Run and model folder.")
@click.option("--max-steps", type=int, default=1000, show_default=True)
@click.option("--lr", type=float, default=5e-5, show_default=True)
@click.option("--batch-tokens", type=int, default=4096, show_default=True, help="Rows x longest side per step.")
@click.option("--warmup-steps", type=int, default=0, show_default=True)
@click.option("--label-smoothing", type=float, default=0.1, show_default=True)
@click.option("--eval-every", type=int, default=0, show_default=True, help="Steps between evaluations; 0: at the end.")
@click.option("--eval-sentences", type=int, default=200, show_default=True, help="Validation pairs generated.")
@click.option("--beam", type=int, default=1, show_default=True, help="Beam of the evaluation's search; 1 = greedy.")
@click.option("--skip-long", is_flag=True, help="Leave out pairs longer than the model's positions.")
@click.option("--resume", is_flag=True, help="Continue the run saved in --out.")
@click.option("--progress/--no-progress", default=None)
@user_errors
def train(
    model,
    train_file,
    valid_file,
    source_column,
    target_column,
    format_,
    header,
    out_dir,
    max_steps,
    lr,
    batch_tokens,
    warmup_steps,
    label_smoothing,
    eval_every,
    eval_sentences,
    beam,
    skip_long,
    resume,
    progress,
) -> None:
    """Fine-tune --model on --train into --out; print the validation report (ROUGE, BLEU, chrF)."""
    from ctxrep.translate.seq2seq import finetune_seq2seq

    metrics = finetune_seq2seq(
        model,
        train_file,
        out_dir,
        valid_file,
        source_column,
        target_column,
        format_,
        header,
        max_steps,
        lr,
        batch_tokens,
        warmup_steps,
        label_smoothing,
        eval_every,
        eval_sentences,
        beam,
        skip_long,
        resume=resume,
        progress=progress,
    )
    exit_if_interrupted(metrics, "ctxrep seq2seq train")
    shown = ", ".join(
        f"{name} {metrics[key]:.2f}"
        for key, name in (
            ("eval_loss", "valid loss"),
            ("eval_rouge1", "ROUGE-1"),
            ("eval_rouge2", "ROUGE-2"),
            ("eval_rougeL", "ROUGE-L"),
            ("eval_bleu", "BLEU"),
            ("eval_chrf", "chrF"),
        )
        if key in metrics
    )
    loss = f"loss {metrics['loss']:.4f}" if "loss" in metrics else "no new steps"
    click.echo(f"step {metrics['step']}: {loss}{'; ' + shown if shown else ''}; wrote {out_dir}")


@seq2seq.command("generate")
@click.option("--model", required=True, help="An encoder-decoder folder or Hub name.")
@click.option(
    "--input", "input_file", type=click.Path(), default=None, help="Source texts, one a line; stdin if omitted."
)
@click.option("--out", "out_file", type=click.Path(dir_okay=False), default=None, help="Outputs; stdout if omitted.")
@click.option("--beam", type=int, default=1, show_default=True, help="Beam size; 1 = greedy.")
@click.option("--n-best", type=int, default=1, show_default=True, help="Above 1: 'LINE ||| TEXT ||| SCORE' lines.")
@click.option("--length-penalty", type=float, default=1.0, show_default=True, help="score / |Y|^alpha (transformers').")
@click.option("--max-len-a", type=float, default=1.2, show_default=True)
@click.option("--max-len-b", type=int, default=10, show_default=True)
@user_errors
def generate(model, input_file, out_file, beam, n_best, length_penalty, max_len_a, max_len_b) -> None:
    """Generate from each line of --input (or stdin) with --model's search, to --out (or stdout); an empty line
    gives an empty line."""
    from ctxrep.translate.data import decode_lines, read_lines
    from ctxrep.translate.seq2seq import generate as run

    if beam < 1 or not 1 <= n_best <= beam:
        raise ValueError(f"--beam {beam} --n-best {n_best}: need 1 <= n-best <= beam")
    lines = read_lines(input_file) if input_file else decode_lines(sys.stdin.buffer.read(), "<stdin>")
    todo = [i for i, line in enumerate(lines) if line.strip()]
    found = run(
        model,
        [lines[i].strip() for i in todo],
        beam=beam,
        n_best=n_best,
        length_penalty=length_penalty,
        max_len_a=max_len_a,
        max_len_b=max_len_b,
    )
    outputs: list = [[] if n_best > 1 else "" for _ in lines]
    for i, f in zip(todo, found):
        outputs[i] = f
    if n_best == 1:
        body = "".join(f"{text}\n" for text in outputs)
    else:
        body = "".join(f"{n} ||| {t} ||| {s:.4f}\n" for n, hyps in enumerate(outputs) for t, s in hyps)
    if out_file:
        Path(out_file).write_text(body, encoding="utf-8")
    else:
        sys.stdout.write(body)
