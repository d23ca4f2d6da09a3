"""`ctxrep mt`: train a translation model on parallel files, translate a file or stdin, score with sacreBLEU.

ctxrep mt train --config multi30k --src train.en --tgt train.de --valid-src val.en --valid-tgt val.de --out runs/en-de
ctxrep mt translate --model runs/en-de --input val.en --out hyp.de --beam 5
ctxrep mt score --hyp hyp.de --ref val.de
ctxrep mt attention --model runs/en-de --source "A man is sleeping ." --out align.png
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ctxrep.cli.common import exit_if_interrupted, user_errors
from ctxrep.cli.runtime_options import runtime_options


@click.group("mt")
def mt() -> None:
    """Machine translation: train, translate, score."""


@mt.command("train", context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.option(
    "--config",
    "config_name",
    default="multi30k",
    show_default=True,
    help="A shipped config (tiny, multi30k-10min, multi30k, base) or a TOML file.",
)
@click.option("--src", type=click.Path(), required=True, help="Training source sentences, one per line.")
@click.option("--tgt", type=click.Path(), required=True, help="Training target sentences, aligned with --src.")
@click.option("--valid-src", type=click.Path(), default=None, help="Validation source sentences.")
@click.option("--valid-tgt", type=click.Path(), default=None, help="Validation target sentences.")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    required=True,
    help="Run folder; becomes the model folder (Marian format + tokenizer.json).",
)
@click.option("--max-steps", type=int, default=None, help="Optimizer steps (overrides [trainer] max_steps).")
@click.option("--resume", is_flag=True, help="Continue the run saved in --out.")
@click.option("--skip-long", is_flag=True, help="Leave out training pairs longer than the model's positions.")
@click.option(
    "--progress/--no-progress", default=True, show_default=True, help="The training progress (as pretrain's)."
)
@click.pass_context
@user_errors
def train(ctx, config_name, src, tgt, valid_src, valid_tgt, out_dir, max_steps, resume, skip_long, progress) -> None:
    """Train a translation model from --src to --tgt into --out.

    Any config field can be overridden as --section.field VALUE (e.g. --trainer.lr 2.0), or --field VALUE
    when only one section has it.

    Ctrl-C finishes the current step, saves a checkpoint in --out and exits with status 130; the same command with
    --resume continues from it (a second Ctrl-C stops at once, without saving).
    """
    from ctxrep.train import distributed
    from ctxrep.train.config import parse_overrides
    from ctxrep.translate.train import load_config, train_mt

    dist = distributed.init_distributed()  # first: under torchrun every process joins before any work
    try:
        config = load_config(config_name, parse_overrides(ctx.args))
        if skip_long:
            config.data.skip_long = True
        metrics = train_mt(config, src, tgt, valid_src, valid_tgt, out_dir, max_steps, resume, progress)
    finally:
        distributed.shutdown()
    exit_if_interrupted(metrics, "ctxrep mt train", echo=dist.is_main)
    if dist.is_main:
        loss = f"loss {metrics['loss']:.4f}" if "loss" in metrics else "no new steps"
        held_out = "".join(
            f", {name} {metrics[key]:.2f}"
            for key, name in (("eval_loss", "valid loss"), ("eval_bleu", "valid BLEU"))
            if key in metrics
        )
        click.echo(f"step {metrics['step']}: {loss}{held_out}; wrote {out_dir}")


@mt.command("translate")
@click.option("--model", "model_dir", type=click.Path(), required=True, help="A Marian-format model folder.")
@click.option("--input", "input_file", type=click.Path(), default=None, help="Source sentences; stdin when omitted.")
@click.option(
    "--out",
    "out_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Translations, one line per input line; stdout when omitted.",
)
@click.option("--beam", type=int, default=5, show_default=True, help="Beam size; 1 = greedy.")
@click.option(
    "--n-best",
    type=int,
    default=1,
    show_default=True,
    help="Hypotheses per sentence; above 1 each line is 'LINE ||| TEXT ||| SCORE' (Moses' n-best format).",
)
@click.option(
    "--length-penalty",
    type=float,
    default=2.0,  # = ctxrep.translate.search.DEFAULT_LENGTH_PENALTY (tests/test_search.py checks)
    show_default=True,
    help="alpha of the length penalty (0 = none): hypotheses score log P / lp(|Y|); 2.0 with gnmt writes the "
    "references' lengths on Multi30k (the Transformer paper's 0.6 wrote 12% too short).",
)
@click.option(
    "--penalty",
    type=click.Choice(["gnmt", "hf"]),
    default="gnmt",
    show_default=True,
    help="lp(|Y|) = ((5 + |Y|) / 6)^alpha (GNMT, the Transformer paper's) or |Y|^alpha (transformers').",
)
@click.option(
    "--max-len-a",
    type=float,
    default=1.2,
    show_default=True,
    help="Translations stop at max-len-a x source tokens + max-len-b.",
)
@click.option("--max-len-b", type=int, default=10, show_default=True)
@click.option(
    "--skip-long",
    is_flag=True,
    help="Write an empty line for sentences longer than the model's positions instead of stopping.",
)
@click.option("--batch-tokens", type=int, default=4096, show_default=True, help="Source tokens per batch.")
@click.option(
    "--progress/--no-progress",
    default=None,
    help="A progress bar on stderr (default: only when stderr is a terminal, as `ctxrep embed`).",
)
@runtime_options(precisions=("fp32", "bf16", "fp16", "int8", "auto"), backends=("torch",))
@user_errors
def translate(
    model_dir,
    input_file,
    out_file,
    beam,
    n_best,
    length_penalty,
    penalty,
    max_len_a,
    max_len_b,
    skip_long,
    batch_tokens,
    progress,
    device,
    precision,
    backend,
) -> None:
    """Translate --input (or stdin) with the model in --model, to --out (or stdout). --precision bf16 / fp16 runs a
    copy of the weights cast to that type; int8 (CPU) runs every linear layer and the output projection in int8."""
    from ctxrep.translate.data import decode_lines, read_lines
    from ctxrep.translate.search import translate_n_best
    from ctxrep.translate.train import load_translator
    from ctxrep.util.progress import progress as show_progress

    if beam < 1 or n_best < 1 or n_best > beam:
        raise ValueError(f"--beam {beam} --n-best {n_best}: need 1 <= n-best <= beam")
    lines = read_lines(input_file) if input_file else decode_lines(sys.stdin.buffer.read(), "<stdin>")
    where = input_file or "<stdin>"
    model, tokenizer = load_translator(model_dir)
    model = _placed(model, device, precision)
    limit = model.max_tokens
    todo, skipped = _lines_to_translate(lines, tokenizer.encode_source(lines), limit, where, skip_long)
    outputs: list[list[tuple[str, float]]] = [[] for _ in lines]
    # On a terminal only, unless --progress / --no-progress decide (a bar there, plain lines in a log). Never on
    # stdout, which carries the translations.
    enabled = sys.stderr.isatty() if progress is None else progress
    with show_progress(total=len(todo), enabled=enabled, desc="translate", unit="sent", file=sys.stderr) as bar:
        results = translate_n_best(
            model,
            tokenizer,
            [lines[i].strip() for i in todo],
            beam=beam,
            n_best=n_best,
            batch_tokens=batch_tokens,
            length_penalty=length_penalty,
            penalty=penalty,
            max_len_a=max_len_a,
            max_len_b=max_len_b,
            progress=bar.update,
        )
    for i, hyps in zip(todo, results):
        outputs[i] = hyps
    body = _output_text(outputs, n_best)
    if out_file:
        Path(out_file).write_text(body, encoding="utf-8")
    else:
        sys.stdout.write(body)
        sys.stdout.flush()
    if skipped:
        click.echo(
            f"skipped {len(skipped)} line(s) longer than {limit} tokens (the first at {where}:{skipped[0]}); "
            "their output lines are empty",
            err=True,
        )


def _lines_to_translate(lines, ids_per_line, limit: int, where: str, skip_long: bool) -> tuple[list[int], list[int]]:
    """The indexes of the lines to translate, and the (1-based) numbers of those skipped as too long; a line too
    long without --skip-long is a one-line error. Empty lines are in neither: their output is an empty line."""
    todo, skipped = [], []
    for number, (line, ids) in enumerate(zip(lines, ids_per_line), start=1):
        if not line.strip():
            continue  # an empty line translates to an empty line
        if len(ids) > limit:
            if not skip_long:
                raise ValueError(
                    f"{where}:{number}: {len(ids)} tokens (with </s>), more than the model's {limit} positions; "
                    "split the sentence, or pass --skip-long to write an empty line for it"
                )
            skipped.append(number)
            continue
        todo.append(number - 1)
    return todo, skipped


def _output_text(outputs: list[list[tuple[str, float]]], n_best: int) -> str:
    """One translation a line, or with n_best > 1 Moses' 'LINE ||| TEXT ||| SCORE' lines."""
    text = []
    for number, hyps in enumerate(outputs):
        if n_best == 1:
            text.append(hyps[0][0] if hyps else "")
        else:
            text.extend(f"{number} ||| {h} ||| {s:.4f}" for h, s in hyps)
    return "".join(t + "\n" for t in text)


@mt.command("score")
@click.option("--hyp", type=click.Path(), required=True, help="Detokenized translations, one per line.")
@click.option("--ref", type=click.Path(), required=True, help="Detokenized references, aligned with --hyp.")
@user_errors
def score(hyp, ref) -> None:
    """Print sacreBLEU's BLEU and chrF of --hyp against --ref, with their signatures."""
    from ctxrep.translate.score import score_files

    click.echo(score_files(hyp, ref).format())


@mt.command("attention")
@click.option("--model", "model_dir", type=click.Path(), required=True, help="A Marian-format model folder.")
@click.option("--source", required=True, help="The source sentence.")
@click.option(
    "--target", default=None, help="A translation to teacher-force; the model's greedy translation when omitted."
)
@click.option(
    "--out",
    "out_file",
    type=click.Path(dir_okay=False),
    required=True,
    help="FILE.png (the heatmap) or FILE.html (an offline page with the heatmap and the numbers).",
)
@click.option(
    "--layer", type=int, default=-1, show_default=True, help="Decoder layer, 0-based; negative counts from the last."
)
@click.option("--head", type=int, default=None, help="One attention head; the mean over the heads when omitted.")
@user_errors
def attention(model_dir, source, target, out_file, layer, head) -> None:
    """Write the decoder's cross-attention over the source words (an alignment heatmap) to --out."""
    from ctxrep.translate.attention import write_attention

    alignment = write_attention(model_dir, source, out_file, target=target, layer=layer, head=head)
    click.echo(
        f"wrote {out_file}: {len(alignment.target_words)} target x {len(alignment.source_words)} source words, "
        f"{alignment.describe()}"
    )


def _placed(model, device: str | None, precision: str | None):
    """The translator on `device` (default: the CPU) at `precision`: fp32 as loaded, bf16 / fp16 with its weights
    cast, int8: `quantize_translator`'s int8 linear layers (CPU only), auto: bf16 where the hardware multiplies it
    natively (`ctxrep.runtime.hardware.auto_precision`)."""
    import torch

    from ctxrep import runtime

    target = runtime.parse_device(device) or torch.device("cpu")
    if precision == "auto":
        precision = runtime.hardware.auto_precision(target, ("fp32", "bf16", "fp16"))
    if precision == "int8":
        from ctxrep.translate.search import quantize_translator

        if target.type != "cpu":
            raise ValueError(f"--precision int8 decodes on the CPU only, not {target}; use bf16 or fp16 on a GPU")
        return quantize_translator(model)
    model = model.to(target)
    if precision not in (None, "fp32"):
        model = model.to({"bf16": torch.bfloat16, "fp16": torch.float16}[precision])
    return model
