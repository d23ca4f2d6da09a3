"""Task models on top of contextual representations: fine-tuned or on frozen features.

    from ctxrep.tasks import SequenceClassifier, SequenceRegressor, TokenTagger, SpanExtractor

scikit-learn-style estimators (fit / predict / score, get_params / set_params) on one base class
(`ctxrep.tasks.base.TaskEstimator`) built from parts: the network (tasks/network.py), the training loop
(tasks/loop.py, AdamW from ctxrep.train.optim) and the frozen-feature cache (tasks/features.py);
`experiment` reads a data set, trains, evaluates and writes a report.
"""

from ctxrep.tasks.classifier import SequenceClassifier
from ctxrep.tasks.experiment import experiment
from ctxrep.tasks.regressor import SequenceRegressor
from ctxrep.tasks.span import SpanExtractor
from ctxrep.tasks.tagger import TokenTagger

__all__ = ["SequenceClassifier", "SequenceRegressor", "TokenTagger", "SpanExtractor", "experiment"]
