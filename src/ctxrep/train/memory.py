"""What a training run needs in memory, estimated before its first step, so that a setting that cannot fit says so
instead of failing mid-run (the Trainer), and the table of docs/scale.md (benchmarks/memory_table.py).

    need = MemoryEstimate.of(objective, tokens=8 * 256, bf16=True, world_size=4)
    need.total, need.describe()

Per process, in bytes:
    weights      every parameter in its dtype (1 / N of each under FSDP with N processes)
    gradients    each trainable parameter's gradient, in its dtype (1 / N under FSDP)
    optimizer    AdamW's two moments of each trainable parameter, float32 (1 / N under FSDP)
    activations  what backward keeps, per token of the micro-batch's padded grid on this process, summed over the
                 encoders that train: Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
                 Models", eq. 2) give 34 h bytes per token per layer at 16 bits when attention's s x s scores are not
                 kept (flash / memory-efficient attention: scaled_dot_product_attention's kernels), 68 h at 32 bits;
                 with activation checkpointing each layer keeps only its input (2 h or 4 h bytes) and one layer at a
                 time runs whole in backward. An encoder whose every weight is frozen (a teacher) keeps none.

The numbers come from the model's parameters (their count and dtype) and the encoder interface (hidden_size,
num_layers, is_gradient_checkpointing): a model built on the meta device from its config.json gives them without any
weight (benchmarks/memory_table.py). It is an estimate: the allocator's slack, a LM head's vocabulary-wide logits
and temporary buffers come on top; `PeakMemory` (util/memory.py) measures what a run really took.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ctxrep.models.encoder import Encoder
from ctxrep.util.memory import format_bytes

ADAM_STATES = 2  # exp_avg and exp_avg_sq
KORTHIKANTI_BYTES = 34  # activation bytes per token per layer per hidden unit at 16-bit activations (no s x s term)


@dataclass(frozen=True)
class MemoryEstimate:
    weights: int
    gradients: int
    optimizer: int
    activations: int

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.activations

    def describe(self) -> str:
        return (
            f"weights {format_bytes(self.weights)} + gradients {format_bytes(self.gradients)} + AdamW states "
            f"{format_bytes(self.optimizer)} + activations {format_bytes(self.activations)} = "
            f"{format_bytes(self.total)}"
        )

    @classmethod
    def of(
        cls,
        module: nn.Module,
        tokens: int,
        bf16: bool = False,
        world_size: int = 1,
        sharded: bool = False,
        checkpointing: bool | None = None,
    ) -> MemoryEstimate:
        """The estimate for training `module` on micro-batches of `tokens` tokens (padded grid) per process.
        `sharded`: FSDP over `world_size` processes; `checkpointing` None: as each encoder is set
        (is_gradient_checkpointing)."""
        params = {id(p): p for p in module.parameters()}.values()
        weights = sum(p.numel() * p.element_size() for p in params)
        trainable = [p for p in params if p.requires_grad]
        gradients = sum(p.numel() * p.element_size() for p in trainable)
        optimizer = sum(p.numel() for p in trainable) * ADAM_STATES * 4
        share = world_size if sharded else 1
        activations = sum(
            activation_bytes(e, tokens, bf16, e.is_gradient_checkpointing if checkpointing is None else checkpointing)
            for e in encoders_of(module)
            if any(p.requires_grad for p in e.parameters())
        )
        return cls(weights // share, gradients // share, optimizer // share, activations)


def activation_bytes(encoder: Encoder, tokens: int, bf16: bool, checkpointing: bool) -> int:
    """Activations kept for backward by `encoder` over `tokens` tokens (see the module docstring)."""
    h, layers = encoder.hidden_size, encoder.num_layers
    unit = 1 if bf16 else 2  # 16-bit activations are Korthikanti's unit; float32 ones take twice as much
    per_layer = KORTHIKANTI_BYTES * h * unit
    if checkpointing:
        return tokens * (layers * 2 * h * unit + per_layer)
    return tokens * layers * per_layer


def encoders_of(module: nn.Module) -> list[Encoder]:
    """The encoders inside `module` (itself included), outermost first; an encoder inside another is left out."""
    found: list[Encoder] = []
    for m in module.modules():
        if isinstance(m, Encoder) and not any(m in set(e.modules()) for e in found):
            found.append(m)
    return found


def available(device: torch.device) -> int | None:
    """Bytes free for new allocations on `device` now: the GPU's free memory, or the machine's (and cgroup's)
    available memory on a CPU; None where unknown."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    if device.type == "cpu":
        from ctxrep.models.shards import available_memory

        return available_memory()
    return None
