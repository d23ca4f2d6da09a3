"""The output record every ctxrep encoder returns (the same field names as transformers)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Self

import torch

from ctxrep.modules.unpadding import Unpadding


@dataclass
class EncoderOutput:
    """`hidden_states[0]` is the embedding output, `hidden_states[i]` the output of layer i.

    `attentions[i]` is layer i+1's attention probabilities, (batch, heads, seq, seq). `cross_attentions[j]`: an
    encoder-decoder's decoder layer j+1 over the encoded text, (batch, heads, seq, src) (models/seq2seq.py); else None.
    """

    last_hidden_state: torch.Tensor
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None
    pooler_output: torch.Tensor | None = None
    cross_attentions: tuple[torch.Tensor, ...] | None = None

    @classmethod
    def of_layers(
        cls,
        hidden_states: list[torch.Tensor],
        attentions: list[torch.Tensor | None],
        output_hidden_states: bool,
        output_attentions: bool,
        unpadding: Unpadding | None = None,
    ) -> Self:
        """A forward's output from what its layers gave: `hidden_states` (the embedding output, then each layer's
        output, the last one the output of the model) and `attentions` (each layer's probabilities, or None), kept
        when asked for. A batch that ran unpadded has its states back on the (batch, seq) grid, 0 at padding: all of
        them when returned, else only the last (modules/unpadding.py). A subclass builds its own type (fields it adds
        keep their defaults)."""
        if unpadding is not None:
            hidden_states = unpadding.pad_states(hidden_states, output_hidden_states)
        return cls(
            last_hidden_state=hidden_states[-1],
            hidden_states=tuple(hidden_states) if output_hidden_states else None,
            attentions=tuple(attentions) if output_attentions else None,
        )
