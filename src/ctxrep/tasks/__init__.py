"""Task models on top of contextual representations: fine-tuned or on frozen features.

    from ctxrep.tasks import SequenceClassifier, TokenTagger, SpanExtractor

scikit-learn-style estimators (fit / predict / score, get_params / set_params) sharing one training loop
(`ctxrep.tasks.base.TaskEstimator`); `experiment` reads a data set, trains, evaluates and writes a report.
"""

from ctxrep.tasks.classifier import SequenceClassifier
from ctxrep.tasks.experiment import experiment
from ctxrep.tasks.span import SpanExtractor
from ctxrep.tasks.tagger import TokenTagger

__all__ = ["SequenceClassifier", "TokenTagger", "SpanExtractor", "experiment"]
