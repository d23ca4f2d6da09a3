"""Task models on top of contextual representations: fine-tuned or on frozen features.

    from ctxrep.tasks import SequenceClassifier, SequenceRegressor, TokenTagger, SpanExtractor
    from ctxrep.tasks import WordInContextClassifier, load   # load: any saved estimator (OUT/model)
    from ctxrep.tasks import SentenceEncoder                  # a bi-encoder, saved as a sentence-transformers folder
    from ctxrep.tasks import SparseSentenceEncoder            # SPLADE training, saved as a SparseEncoder folder

scikit-learn-style estimators (fit / predict / score, get_params / set_params) on one base class
(`ctxrep.tasks.base.TaskEstimator`) built from parts: the network (tasks/network.py), the one training loop
(ctxrep.train.trainer) and the frozen-feature cache (tasks/features.py);
`experiment` reads a data set, trains, evaluates and writes a report.
"""

from __future__ import annotations

import importlib

from ctxrep.tasks.experiment import experiment  # light: the kinds table and the reports import no torch

# name -> module; each imported on first use, so `import ctxrep.tasks.kinds` (the CLI's --help) loads no torch
_EXPORTS = {
    "SequenceClassifier": "classifier",
    "SequenceRegressor": "regressor",
    "SentenceEncoder": "sentence_encoder",
    "SparseSentenceEncoder": "sparse_encoder",
    "SpanExtractor": "span",
    "TokenTagger": "tagger",
    "WordInContextClassifier": "wic",
}
ESTIMATOR_NAMES = ("SequenceClassifier", "SequenceRegressor", "WordInContextClassifier", "TokenTagger", "SpanExtractor")


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f"ctxrep.tasks.{_EXPORTS[name]}"), name)
        globals()[name] = value
        return value
    if name == "ESTIMATORS":
        return {n: __getattr__(n) for n in ESTIMATOR_NAMES}
    raise AttributeError(f"module 'ctxrep.tasks' has no attribute {name!r}")


def load(path, device: str | None = None):
    """A saved estimator of any kind (the class named in its config.json), e.g. `ctxrep finetune`'s OUT/model;
    `device` overrides the one it was saved with."""
    import json
    from pathlib import Path

    config = Path(path) / "config.json"
    if not config.is_file():
        raise FileNotFoundError(f"{path}: no config.json; expected a folder written by an estimator's save (OUT/model)")
    name = json.loads(config.read_text()).get("estimator")
    if name not in ESTIMATOR_NAMES:
        raise ValueError(f"{config}: estimator {name!r} is not one of {', '.join(ESTIMATOR_NAMES)}")
    return __getattr__(name).load(path, device=device)


__all__ = [
    "SequenceClassifier",
    "SequenceRegressor",
    "SentenceEncoder",
    "SparseSentenceEncoder",
    "WordInContextClassifier",
    "TokenTagger",
    "SpanExtractor",
    "experiment",
    "load",
]
