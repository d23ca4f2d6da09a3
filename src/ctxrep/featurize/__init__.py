"""Contextual word and sentence vectors from any layer (or mix of layers) of an encoder: `Featurizer`.

Pipeline for a list of texts:
  1. split into words (whitespace for strings; word lists are taken as given) and into subword pieces,
     keeping each piece's word index (`word_ids`);
  2. cut texts longer than the model's positions into overlapping windows on word boundaries; every word
     is assigned to the one window where it has the most context on its poorer side;
  3. sort all windows by length and run them in batches under a token budget;
  4. pool each word's pieces (first / last / mean / first_last) from the chosen layers, in input order.

The package's rooms (featurizer.py: the front class; settings, rows, pipeline, pooling, chunks; spec: the
torch-free FeaturizerSpec). Importing the package is cheap: its names load on first use, so that
`ctxrep.featurize.spec` is read without torch.
"""

from __future__ import annotations

import importlib

# name -> the module of this package that defines it
_HOMES = {
    "Featurizer": "featurizer",
    "Alignment": "rows",
    "TokenStates": "pooling",
    "POOLINGS": "pooling",
    "OVERLAP_CHUNK_TEXTS": "pipeline",
    "Chunks": "chunks",
    "sentence_spans": "chunks",
    "auto_sentence_pooling": "settings",
    "load_dtype": "settings",
    "precision_of": "settings",
    "DEFAULT_SENTENCE_POOLING": "spec",
    "SENTENCE_POOLINGS": "spec",
    "FeaturizerSpec": "spec",
    "SpecMismatch": "spec",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'ctxrep.featurize' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"ctxrep.featurize.{_HOMES[name]}"), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))
