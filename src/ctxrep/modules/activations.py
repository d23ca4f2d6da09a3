"""The activation functions of every family, by the names transformers' config.json files give them.

One table for all families (transformers' `ACT2FN` idea): a config key such as BERT's `hidden_act`, GPT-2's
`activation_function` or XLNet's `ff_activation` names a row here.

    gelu               x Phi(x), the exact form (Hendrycks & Gimpel 2016)
    gelu_new           0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), the tanh form (GPT-2, ALBERT, T5's gated-gelu)
    gelu_pytorch_tanh  the same tanh form, under the name newer checkpoints use
    relu, silu / swish (x sigmoid(x)), tanh
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GELU's tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    return F.gelu(x, approximate="tanh")


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,
    "gelu_new": gelu_tanh,
    "gelu_pytorch_tanh": gelu_tanh,
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
    "tanh": torch.tanh,
}


def check_activation(key: str, name: str) -> None:
    """Refuse an activation name the table lacks, naming the config key that holds it and the names it knows."""
    if name not in ACTIVATIONS:
        raise ValueError(f"{key} {name!r} is not supported; use one of {sorted(ACTIVATIONS)}")
