"""BERT's weight initialisation, which most families start from (transformers' `_init_weights`).

    Linear      W ~ N(0, std^2), b = 0
    Embedding   E ~ N(0, std^2), the padding row (when there is one) 0
    LayerNorm   gamma = 1, beta = 0

std is the config's `initializer_range` (0.02 for BERT, GPT-2 and XLNet). Families add their own rules after it
(GPT-2's scaled residual projections, XLNet's relative-attention parameters).
"""

from __future__ import annotations

from torch import nn


def normal_init(module: nn.Module, std: float) -> None:
    """Initialise one module as above (meant for `model.apply`); any other kind of module is left as it is."""
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, std=std)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, std=std)
        if module.padding_idx is not None:
            nn.init.zeros_(module.weight[module.padding_idx])
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
