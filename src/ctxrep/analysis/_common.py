"""Helpers the analysis tools share: a featurizer over other layers, a random-init control, corpus files."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

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


def read_sentences(path: str | os.PathLike, max_sentences: int | None = None) -> list[list[str]]:
    """The word lists of a corpus: CoNLL-U (.conllu), CoNLL columns (.conll, eng.train, ...) or plain text
    (one whitespace-tokenized sentence per line, blank lines skipped)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such corpus file")
    if path.suffix == ".conllu":
        from ctxrep.data.conllu import read_conllu

        sentences = [s.words for s in read_conllu(path)]
    elif path.suffix in (".conll", ".train", ".testa", ".testb", ".bio", ".iob"):
        from ctxrep.data.conll import read_conll

        sentences = [s.words for s in read_conll(path)]
    else:
        from ctxrep.data.conll import iter_utf8_lines

        sentences = [line.split() for _, line in iter_utf8_lines(path) if line.strip()]
    if max_sentences is not None:
        sentences = sentences[:max_sentences]
    if not sentences:
        raise ValueError(f"{path}: the corpus is empty (no sentences)")
    return sentences
