"""What every pretraining objective's forward returns to the trainer."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class ObjectiveOutput:
    """`loss` is what the trainer back-propagates; `metrics` are logged as they are (floats, already detached).

    `num_tokens` is the number of real (non-pad) input tokens in the batch, for tokens/s.
    `nll` is the mean negative log-likelihood of the predicted tokens, for objectives whose loss contains one
    (language models, the MLM part of BERT's loss); the trainer reports held-out perplexity as exp(nll). It is
    None where no token likelihood exists (ELECTRA's replaced-token detection, distillation).
    """

    loss: torch.Tensor
    num_tokens: int
    metrics: dict[str, float] = field(default_factory=dict)
    nll: float | None = None
