"""ScalarMix: a softmax-weighted sum of layers (Peters et al. 2018, eq. 1).

    mix = gamma * sum_j softmax(s)_j * h_j

with optional per-layer layer normalisation of h_j over the non-masked positions, as in ELMo.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


class ScalarMix(nn.Module):
    """Mix `num_layers` same-shaped tensors with softmax-normalised scalar weights and a scale gamma.

    `initial_scalar_parameters` are the unnormalised s_j (all zeros = the plain average).
    `trainable=False` makes a fixed mix (the weights are buffers, not parameters).
    """

    def __init__(
        self,
        num_layers: int,
        initial_scalar_parameters: Sequence[float] | None = None,
        gamma: float = 1.0,
        trainable: bool = True,
        do_layer_norm: bool = False,
    ) -> None:
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"ScalarMix needs at least one layer, got num_layers={num_layers}")
        if initial_scalar_parameters is None:
            initial_scalar_parameters = [0.0] * num_layers
        if len(initial_scalar_parameters) != num_layers:
            raise ValueError(f"ScalarMix got {len(initial_scalar_parameters)} initial weights for {num_layers} layers")
        self.num_layers = num_layers
        self.do_layer_norm = do_layer_norm
        scalars = torch.tensor([float(s) for s in initial_scalar_parameters])
        gamma_t = torch.tensor([float(gamma)])
        if trainable:
            self.scalar_parameters = nn.Parameter(scalars)
            self.gamma = nn.Parameter(gamma_t)
        else:
            self.register_buffer("scalar_parameters", scalars)
            self.register_buffer("gamma", gamma_t)

    @classmethod
    def from_weights(cls, weights: Sequence[float], gamma: float = 1.0) -> ScalarMix:
        """A fixed mix whose normalised weights are `weights` (they must be positive; they are renormalised)."""
        w = torch.tensor([float(x) for x in weights])
        if (w <= 0).any():
            raise ValueError(f"mix weights must be positive, got {list(weights)}")
        return cls(len(weights), torch.log(w / w.sum()).tolist(), gamma=gamma, trainable=False)

    @property
    def weights(self) -> torch.Tensor:
        """The normalised layer weights softmax(s)."""
        return torch.softmax(self.scalar_parameters, dim=0)

    def forward(self, layers: Sequence[torch.Tensor] | torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """`layers`: a sequence of (..., dim) tensors or one stacked (num_layers, ..., dim) tensor.

        `mask` (..., ) marks real positions; it is only used by the layer norm.
        """
        if isinstance(layers, torch.Tensor):
            layers = list(layers.unbind(0))
        if len(layers) != self.num_layers:
            raise ValueError(f"ScalarMix was built for {self.num_layers} layers but got {len(layers)}")
        weights = self.weights
        out = torch.zeros_like(layers[0])
        for w, h in zip(weights, layers):
            if self.do_layer_norm:
                h = _masked_layer_norm(h, mask)
            out = out + w * h
        return self.gamma * out


def _masked_layer_norm(h: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Normalise h by the mean and variance of all its real (masked-in) values, as AllenNLP's ScalarMix."""
    if mask is None:
        mask = torch.ones(h.shape[:-1], dtype=torch.bool, device=h.device)
    m = mask.unsqueeze(-1).to(h.dtype)
    n = m.sum() * h.shape[-1]
    mean = (h * m).sum() / n
    var = (((h - mean) * m) ** 2).sum() / n
    return (h - mean) / torch.sqrt(var + 1e-12)
