"""Helpers the analysis tools share: a featurizer over other layers, a random-init control, the model's name.

The corpus reader the tools and `ctxrep attention` / `neighbors index` share is public: analysis/corpus.py.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from ctxrep.featurize import Featurizer


def with_layers(fz: Featurizer, layers: int | Sequence[int] | str) -> Featurizer:
    """A copy of `fz` (same model and tokenizer, nothing reloaded) that returns other layers."""
    return fz.with_layers(layers)


def random_control(fz: Featurizer, seed: int = 0) -> Featurizer:
    """The same featurizer over a randomly initialised model of the same shape (the probing control); the
    family's own constructor rebuilds it from its config, the one place a tool hands a config back unread."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return fz.with_model(type(fz.model)(fz.model.config).eval())


def as_featurizer(model: str | os.PathLike | Featurizer) -> Featurizer:
    return model if isinstance(model, Featurizer) else Featurizer(model, layers="all")


def model_name(fz: Featurizer) -> str:
    """The model as the user named it (`minilm`, `bert-base-cased`, a folder path), not the folder it resolved to."""
    return str(fz.source.name)
