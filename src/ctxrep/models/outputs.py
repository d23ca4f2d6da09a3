"""The output record every ctxrep encoder returns (the same field names as transformers)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class EncoderOutput:
    """`hidden_states[0]` is the embedding output, `hidden_states[i]` the output of layer i.

    `attentions[i]` is layer i+1's attention probabilities, (batch, heads, seq, seq).
    """

    last_hidden_state: torch.Tensor
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None
    pooler_output: torch.Tensor | None = None
