"""Task models on top of contextual representations: fine-tuned or on frozen features.

    from ctxrep.tasks import SequenceClassifier, SequenceRegressor, TokenTagger, SpanExtractor
    from ctxrep.tasks import WordInContextClassifier, load   # load: any saved estimator (OUT/model)
    from ctxrep.tasks import SentenceEncoder                  # a bi-encoder, saved as a sentence-transformers folder

scikit-learn-style estimators (fit / predict / score, get_params / set_params) on one base class
(`ctxrep.tasks.base.TaskEstimator`) built from parts: the network (tasks/network.py), the training loop
(tasks/loop.py, AdamW from ctxrep.train.optim) and the frozen-feature cache (tasks/features.py);
`experiment` reads a data set, trains, evaluates and writes a report.
"""

from ctxrep.tasks.classifier import SequenceClassifier
from ctxrep.tasks.experiment import experiment
from ctxrep.tasks.regressor import SequenceRegressor
from ctxrep.tasks.sentence_encoder import SentenceEncoder
from ctxrep.tasks.span import SpanExtractor
from ctxrep.tasks.tagger import TokenTagger
from ctxrep.tasks.wic import WordInContextClassifier

ESTIMATORS = {
    cls.__name__: cls
    for cls in (SequenceClassifier, SequenceRegressor, WordInContextClassifier, TokenTagger, SpanExtractor)
}


def load(path, device: str | None = None):
    """A saved estimator of any kind (the class named in its config.json), e.g. `ctxrep finetune`'s OUT/model;
    `device` overrides the one it was saved with."""
    import json
    from pathlib import Path

    config = Path(path) / "config.json"
    if not config.is_file():
        raise FileNotFoundError(f"{path}: no config.json; expected a folder written by an estimator's save (OUT/model)")
    name = json.loads(config.read_text()).get("estimator")
    if name not in ESTIMATORS:
        raise ValueError(f"{config}: estimator {name!r} is not one of {', '.join(ESTIMATORS)}")
    return ESTIMATORS[name].load(path, device=device)


__all__ = [
    "SequenceClassifier",
    "SequenceRegressor",
    "SentenceEncoder",
    "WordInContextClassifier",
    "TokenTagger",
    "SpanExtractor",
    "experiment",
    "load",
]
