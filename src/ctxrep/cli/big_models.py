"""Options the training commands share for big models (finetune, train-sentence-encoder, pretrain): LoRA adapters,
activation checkpointing, FSDP; and `ctxrep merge`, an adapter folded into a plain model folder.

    ctxrep finetune --task classify ... --lora                      # rank 16, alpha 32, dropout 0.05, every projection
    ctxrep train-sentence-encoder ... --lora --lora-rank 8 --lora-targets query,value --gradient-checkpointing
    torchrun --nproc_per_node 4 -m ctxrep pretrain ... --fsdp
    ctxrep merge runs/sts-lora --out runs/sts-merged                # then: ctxrep serve --model runs/sts-merged
"""

from __future__ import annotations

import functools

import click

from ctxrep.cli.common import user_errors

# models/adapters.py's LoRA defaults, written out so that `--help` imports no torch (tests/test_adapters.py keeps
# them equal)
LORA_RANK, LORA_ALPHA, LORA_DROPOUT = 16, 32.0, 0.05
LORA_OPTIONS = ("lora", "lora_rank", "lora_alpha", "lora_dropout", "lora_targets")


def big_model_options(command):
    """--lora, --lora-rank, --lora-alpha, --lora-dropout, --lora-targets, --gradient-checkpointing and --fsdp."""
    options = [
        click.option(
            "--lora",
            is_flag=True,
            help="Train LoRA adapters (peft) on the model's attention and MLP projections instead of every weight; "
            "the output holds the adapter in peft's format (`ctxrep merge` makes a plain folder of it).",
        ),
        click.option("--lora-rank", type=click.IntRange(min=1), default=None, help=f"LoRA's r. [default: {LORA_RANK}]"),
        click.option(
            "--lora-alpha", type=float, default=None, help=f"LoRA's alpha (scale alpha / r). [default: {LORA_ALPHA:g}]"
        ),
        click.option(
            "--lora-dropout", type=float, default=None, help=f"On the adapters' input. [default: {LORA_DROPOUT}]"
        ),
        click.option(
            "--lora-targets",
            default=None,
            help="Comma-separated module names (suffixes, ctxrep's names: e.g. query,value or self_attn.q_proj) to "
            "adapt. [default: the family's attention and MLP projections]",
        ),
        click.option(
            "--gradient-checkpointing",
            is_flag=True,
            help="Keep only each layer's input and recompute the layer in backward: far less activation memory for "
            "about a third more compute.",
        ),
        click.option(
            "--fsdp",
            is_flag=True,
            help="Under torchrun (torchrun --nproc_per_node N -m ctxrep ...): shard weights, gradients and AdamW "
            "states between the processes (FSDP2) instead of replicating them.",
        ),
    ]
    return functools.reduce(lambda f, option: option(f), reversed(options), command)


def lora_of(lora: bool, lora_rank, lora_alpha, lora_dropout, lora_targets):
    """The LoRA settings the options ask for (any --lora-* option turns LoRA on), or None."""
    given = {"rank": lora_rank, "alpha": lora_alpha, "dropout": lora_dropout}
    if not lora and all(v is None for v in given.values()) and lora_targets is None:
        return None
    from ctxrep.models.adapters import LoRA

    settings = {k: v for k, v in given.items() if v is not None}
    if lora_targets is not None:
        settings["targets"] = tuple(t.strip() for t in lora_targets.split(",") if t.strip())
    return LoRA(**settings)


def pop_lora(options: dict):
    """The LoRA settings of a command's options, taken out of them."""
    return lora_of(*(options.pop(name) for name in LORA_OPTIONS))


def join_processes(fsdp: bool):
    """The process group under torchrun (ctxrep.train.distributed.init_distributed); --fsdp without torchrun is
    refused in one line."""
    import os

    from ctxrep.train import distributed

    if fsdp and int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        raise ValueError(
            "--fsdp shards training between the processes torchrun starts: launch with "
            "torchrun --nproc_per_node N -m ctxrep ... (N > 1), or leave --fsdp off"
        )
    return distributed.init_distributed()


@click.command("merge")
@click.argument("adapter", type=click.Path(file_okay=False, exists=True))
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="The merged model's folder.")
@user_errors
def merge(adapter, out_dir) -> None:
    """Merge the LoRA adapter in ADAPTER (peft's adapter_config.json + adapter_model.safetensors, from ctxrep, peft or
    sentence-transformers) into its base model and write a plain folder to --out: the base's files with the adapted
    weights, plus ADAPTER's own (a sentence-transformers folder's modules and tokenizer)."""
    from ctxrep.models.merge import merge_folder

    out = merge_folder(adapter, out_dir)
    click.echo(f"merged {adapter} into its base model; wrote {out}")


COMMANDS = (merge,)
