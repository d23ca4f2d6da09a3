"""The gated feed-forward of Llama-style decoders (Shazeer 2020, "GLU Variants Improve Transformer"):

    FFN(x) = W_down (act(W_gate x) * (W_up x))

SwiGLU with act = SiLU (Llama, Qwen, Mistral), GeGLU with act = GELU's tanh form (Gemma). Parameter names are the
checkpoints' own: gate_proj, up_proj, down_proj.
"""

from __future__ import annotations

import torch
from torch import nn

from ctxrep.modules.activations import ACTIVATIONS


class GatedMLP(nn.Module):
    def __init__(self, hidden: int, inner: int, activation: str, bias: bool = False) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inner, bias=bias)
        self.up_proj = nn.Linear(hidden, inner, bias=bias)
        self.down_proj = nn.Linear(inner, hidden, bias=bias)
        self.act = ACTIVATIONS[activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))
