"""RMSNorm (Zhang & Sennrich 2019): x / sqrt(mean(x^2) + eps), times a learned gain, over the last dimension.

    Llama, Qwen, Mistral:  w * (x / rms(x)), normalised in float32, cast back to x's type before the gain
    Gemma (unit_offset):    (1 + w) * (x / rms(x)), the gain applied in float32 and then cast (w starts at 0)

The two orders differ only in bfloat16 / float16 rounding; each follows its checkpoints' reference code.
"""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    """Root-mean-square norm with gain `weight` (dim,); `unit_offset` scales by 1 + weight (Gemma)."""

    def __init__(self, dim: int, eps: float = 1e-6, unit_offset: bool = False) -> None:
        super().__init__()
        self.eps = eps
        self.unit_offset = unit_offset
        self.weight = nn.Parameter(torch.zeros(dim) if unit_offset else torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.unit_offset:
            return (h * (1.0 + self.weight.float())).type_as(x)
        return self.weight * h.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}, unit_offset={self.unit_offset}"
