"""Highway layers (Srivastava et al. 2015), as in ELMo's character encoder (Peters et al. 2018, sec. 3.1).

For each layer, with t the transform gate:

    t = sigmoid(W_t x + b_t)
    y = t * relu(W_h x + b_h) + (1 - t) * x

Weight-file convention (bilm-tf `model.py`, `high()`): the gate's weights are stored as `W_carry` / `b_carry`
and the transform as `W_transform` / `b_transform`, yet the "carry" gate multiplies the *transformed* input:
`carry_gate * relu(x W_transform + b_transform) + (1 - carry_gate) * x`. So bilm-tf's W_carry is our W_t and
loads without a sign change. (AllenNLP instead keeps a true carry gate 1 - t, which is why its loader negates
W_carry and b_carry.)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class HighwayLayer(nn.Module):
    """One highway layer: y = t * relu(transform(x)) + (1 - t) * x, t = sigmoid(gate(x))."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.transform = nn.Linear(dim, dim)  # W_h, b_h  (bilm-tf: W_transform, b_transform)
        self.gate = nn.Linear(dim, dim)  # W_t, b_t  (bilm-tf: W_carry, b_carry)
        # bilm-tf initialises the gate bias to -2: start close to the identity (mostly carry x through).
        nn.init.constant_(self.gate.bias, -2.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = torch.sigmoid(self.gate(x))
        return t * F.relu(self.transform(x)) + (1.0 - t) * x


class Highway(nn.Module):
    """`num_layers` highway layers of width `dim`, applied in order; num_layers=0 is the identity."""

    def __init__(self, dim: int, num_layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(HighwayLayer(dim) for _ in range(num_layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x
