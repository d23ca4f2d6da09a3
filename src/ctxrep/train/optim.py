"""The one AdamW builder, for the pretraining Trainer and the task estimators alike.

One no-decay rule: a parameter with fewer than two dimensions (biases, LayerNorm weights, ScalarMix scalars and
gamma) gets no weight decay; every matrix (>= 2-D) does. Parameters frozen when the optimizer is built
(requires_grad False) are in no group; every other parameter is in exactly one (asserted, as in minGPT). Tied
parameters are listed once.

Discriminative fine-tuning (ULMFiT, Howard & Ruder 2018, sec. 3.2): `depth` gives each parameter a depth
(0 = embeddings, L = the top layer) and `lr_at_depth` each depth its learning rate, e.g.
`discriminative(lr, factor, top)`: lr / factor^(top - d). Groups are ordered by depth, decay before no decay.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import nn


def no_decay(param: torch.Tensor) -> bool:
    """The one no-decay rule: vectors and scalars (biases, norm weights, mixing weights) are not decayed."""
    return param.ndim < 2


def discriminative(lr: float, factor: float, top: int) -> Callable[[int], float]:
    """lr / factor^(top - depth): the top layer (and the head, at depth `top`) trains at lr."""
    return lambda depth: lr / factor ** (top - depth)


def param_groups(
    module: nn.Module,
    weight_decay: float,
    depth: Mapping[str, int] | None = None,
    default_depth: int = 0,
    lr_at_depth: Callable[[int], float] | None = None,
) -> list[dict]:
    """AdamW parameter groups over the trainable parameters of `module`, keyed by (depth, no decay).

    depth: parameter name (as in module.named_parameters()) -> depth; a name it lacks gets `default_depth`.
    lr_at_depth: the learning rate of each depth's groups (None: the optimizer's lr). Each group carries
    "weight_decay", "depth" and, with lr_at_depth, "lr". Empty groups are left out.
    """
    depth = depth or {}
    buckets: dict[tuple[int, bool], list[nn.Parameter]] = {}
    for name, p in module.named_parameters():  # tied parameters come once
        if p.requires_grad:
            buckets.setdefault((depth.get(name, default_depth), no_decay(p)), []).append(p)
    groups = []
    for (d, skip_decay), params in sorted(buckets.items()):
        group = {"params": params, "weight_decay": 0.0 if skip_decay else weight_decay, "depth": d}
        if lr_at_depth is not None:
            group["lr"] = lr_at_depth(d)
        groups.append(group)
    grouped = [id(p) for g in groups for p in g["params"]]
    trainable = {id(p) for p in module.parameters() if p.requires_grad}
    assert len(grouped) == len(set(grouped)), "a parameter is in two optimizer groups"
    assert set(grouped) == trainable, "a trainable parameter is in no optimizer group"
    return groups


def adamw(
    module: nn.Module,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    depth: Mapping[str, int] | None = None,
    default_depth: int = 0,
    lr_at_depth: Callable[[int], float] | None = None,
) -> torch.optim.AdamW:
    """torch.optim.AdamW over `param_groups(...)`."""
    groups = param_groups(module, weight_decay, depth, default_depth, lr_at_depth)
    return torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), eps=eps)
