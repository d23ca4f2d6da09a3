"""What fine-tuning each model size needs per GPU (docs/scale.md's table), computed from the models' config.json by
ctxrep.train.memory (the Trainer's own estimate before the first step): the model built on the meta device (no
weight is read or made), its parameters counted, AdamW's states and the activations per token added for
bf16 autocast over float32 master weights, a micro-batch of 8 x 512 tokens per GPU, 1 / 2 / 4 / 8 GPUs with FSDP
(weights, gradients and AdamW states sharded; activations per GPU), against cards of 24 and 80 GB.

    python benchmarks/memory_table.py            # prints the Markdown table docs/scale.md shows
    python benchmarks/memory_table.py --config path/to/config.json --tokens 2048   # any model folder's config

tests/test_big_model_training.py checks that docs/scale.md holds this script's table.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from ctxrep.models.adapters import LoRA, add_lora
from ctxrep.models.loading import FAMILIES
from ctxrep.train.memory import MemoryEstimate

GIB = 2**30
CARDS = (24, 80)  # GB of the cards the table marks
GPUS = (1, 2, 4, 8)
TOKENS = 8 * 512  # per GPU per micro-batch

# config.json of each model, as the Hub ships it (the keys the families read)
BERT_BASE = {
    "model_type": "bert",
    "vocab_size": 30522,
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
}
QWEN3 = {"model_type": "qwen3", "head_dim": 128, "num_key_value_heads": 8, "max_position_embeddings": 40960}
MODELS = {
    "bert-base (BAAI/bge-base-en-v1.5)": BERT_BASE,
    "Qwen/Qwen3-Embedding-0.6B": QWEN3
    | {
        "vocab_size": 151669,
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "tie_word_embeddings": True,
    },
    "Qwen/Qwen3-Embedding-4B": QWEN3
    | {
        "vocab_size": 151665,
        "hidden_size": 2560,
        "intermediate_size": 9728,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "tie_word_embeddings": True,
    },
    "Qwen/Qwen3-Embedding-8B": QWEN3
    | {
        "vocab_size": 151665,
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "tie_word_embeddings": False,
    },
}
SETTINGS = {  # name -> (LoRA or None, activation checkpointing); the LoRA rows: LoRA()'s defaults
    "full": (None, False),
    "full + checkpointing": (None, True),
    "LoRA r=16": (LoRA(), False),
    "LoRA r=16 + checkpointing": (LoRA(), True),
}


def build(config: dict) -> torch.nn.Module:
    """The family's model of `config` on the meta device (float32 parameters, no storage)."""
    family = FAMILIES[config["model_type"]]
    if hasattr(family, "config_from_json"):
        parsed = family.config_from_json(config, "config.json")
    else:
        parsed = family.config_class.from_hf_dict(config)
    with torch.device("meta"):
        return family(parsed)


def estimates(config: dict, tokens: int = TOKENS) -> dict[tuple[str, int], MemoryEstimate]:
    """(setting, GPUs) -> the estimate per GPU."""
    plain, adapted = build(config), add_lora(build(config), LoRA())
    out = {}
    for name, (lora, checkpointing) in SETTINGS.items():
        model = plain if lora is None else adapted
        for gpus in GPUS:
            out[name, gpus] = MemoryEstimate.of(
                model, tokens, bf16=True, world_size=gpus, sharded=gpus > 1, checkpointing=checkpointing
            )
    return out


def cell(estimate: MemoryEstimate) -> str:
    """GiB per GPU, and the smallest card of CARDS it fits ("-": none)."""
    gib = estimate.total / GIB
    fits = next((f"{card} GB" for card in CARDS if estimate.total <= card * 10**9), "-")
    return f"{gib:.1f} ({fits})"


def table(models: dict[str, dict] = MODELS, tokens: int = TOKENS) -> str:
    """The Markdown table: one row per model and setting, one column per number of GPUs."""
    lines = [
        "| model (parameters) | training | " + " | ".join(f"{g} GPU{'s' if g > 1 else ''}" for g in GPUS) + " |",
        "|---|---|" + "---|" * len(GPUS),
    ]
    for label, config in models.items():
        found = estimates(config, tokens)
        params = found["full", 1].weights / 4  # float32
        for name in SETTINGS:
            row = [f"{label} ({params / 1e9:.2f}B)", name, *(cell(found[name, g]) for g in GPUS)]
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, help="a model's config.json (default: the models of docs/scale.md)")
    parser.add_argument("--tokens", type=int, default=TOKENS, help="tokens per GPU per micro-batch (padded grid)")
    args = parser.parse_args()
    models = MODELS if args.config is None else {args.config.parent.name: json.loads(args.config.read_text())}
    print(table(models, args.tokens))


if __name__ == "__main__":
    main()
