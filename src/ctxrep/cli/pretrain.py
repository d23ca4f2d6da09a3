"""`ctxrep pretrain`: train a tokenizer, pack a corpus and pretrain one objective into a model folder."""

from __future__ import annotations

import click

from ctxrep.cli.big_models import big_model_options, join_processes, pop_lora
from ctxrep.cli.common import exit_if_interrupted, user_errors
from ctxrep.objectives.names import OBJECTIVES  # torch-free: --help lists them
from ctxrep.train.precision import DEFAULT_PRECISION, PRECISIONS


@click.command("pretrain", context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.option("--objective", type=click.Choice(OBJECTIVES), required=True, help="Pretraining objective.")
@click.option(
    "--config",
    "config_name",
    default="small",
    show_default=True,
    help="A shipped config (tiny, small, bert-base, roberta-base, electra-small, distill) or a TOML file.",
)
@click.option("--corpus", type=click.Path(), required=True, help="A .txt file or a folder of .txt files.")
@click.option(
    "--out", "out_dir", type=click.Path(file_okay=False), required=True, help="Run folder; becomes the model folder."
)
@click.option("--max-steps", type=int, default=None, help="Optimizer steps (overrides [trainer] max_steps).")
@click.option("--resume", is_flag=True, help="Continue the run saved in --out.")
@click.option(
    "--tokenizer",
    type=click.Path(),
    default=None,
    help="Use this tokenizer.json (or its folder) instead of training one.",
)
@click.option(
    "--precision",
    type=click.Choice(PRECISIONS),
    default=None,
    help="fp32; bf16: bfloat16 autocast ([trainer] bf16; weights and optimizer stay float32); auto: bf16 where the "
    "CPU has avx512_bf16 or AMX, or on a GPU with bf16, else fp32 (--resume keeps the saved run's choice). "
    f"[default: {DEFAULT_PRECISION}, or [trainer] bf16 where the config sets it]",
)
@click.option("--progress/--no-progress", default=True, show_default=True)
@big_model_options
@click.pass_context
@user_errors
def pretrain(
    ctx,
    objective,
    config_name,
    corpus,
    out_dir,
    max_steps,
    resume,
    tokenizer,
    precision,
    progress,
    gradient_checkpointing,
    fsdp,
    **lora_options,
) -> None:
    """Pretrain --objective on --corpus with --config into --out.

    Any config field that --objective reads can be overridden as --section.field VALUE (e.g. --trainer.lr
    5e-4), or --field VALUE when only one section has it. [tokenizer], [data] and [trainer] mean the same for
    every objective; [encoder] (Transformers), [elmo] (bilm), [distill] (distill: --distill.teacher DIR, or use
    `ctxrep distill`) and [objective] hold settings of particular ones.

    Ctrl-C finishes the current step, saves a checkpoint in --out and exits with status 130; the same command with
    --resume continues from it (a second Ctrl-C stops at once, without saving).

    --gradient-checkpointing and --fsdp set [trainer] gradient_checkpointing and fsdp. --lora trains LoRA adapters on
    the objective's encoders (heads in full) and saves the model with them merged in.
    """
    from ctxrep.train import distributed
    from ctxrep.train.config import parse_overrides
    from ctxrep.train.precision import describe
    from ctxrep.train.pretrain import choose_precision
    from ctxrep.train.pretrain import pretrain as run_pretraining
    from ctxrep.train.pretrain_config import load_config

    overrides = parse_overrides(ctx.args)
    if precision is not None and any(key.replace("-", "_").split(".")[-1] == "bf16" for key, _ in overrides):
        raise click.UsageError("--precision and --trainer.bf16 both set the precision: give only one of them")
    lora = pop_lora(lora_options)
    if gradient_checkpointing:
        overrides.append(("trainer.gradient_checkpointing", "true"))
    if fsdp:
        overrides.append(("trainer.fsdp", "true"))
    dist = join_processes(fsdp)  # first: under torchrun every process joins before any work
    try:
        config = load_config(config_name, overrides, objective)
        if precision is None:  # the config's [trainer] bf16 where it sets it (file or --trainer.bf16), else the default
            set_by_config = "bf16" in config.raw.get("trainer", {})
            precision = ("bf16" if config.trainer.bf16 else "fp32") if set_by_config else DEFAULT_PRECISION
        chosen = choose_precision(config, precision, out_dir, resume)
        if dist.is_main:
            click.echo(describe(chosen, precision))
        metrics = run_pretraining(objective, config, corpus, out_dir, max_steps, resume, tokenizer, progress, lora)
    finally:
        distributed.shutdown()
    exit_if_interrupted(metrics, "ctxrep pretrain", echo=dist.is_main)
    if dist.is_main:
        loss = f"loss {metrics['loss']:.4f}" if "loss" in metrics else "no new steps"
        held_out = f", eval loss {metrics['eval_loss']:.4f}" if "eval_loss" in metrics else ""
        click.echo(f"step {metrics['step']}: {loss}{held_out}; wrote {out_dir}")
