"""What every pretraining objective's forward returns to the trainer."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class ObjectiveOutput:
    """`loss` is what the trainer back-propagates; `metrics` are logged as they are (floats, already detached).

    `num_tokens` is the number of real (non-pad) input tokens in the batch, for tokens/s.
    """

    loss: torch.Tensor
    num_tokens: int
    metrics: dict[str, float] = field(default_factory=dict)
