"""ctxrep's own fine-tuned pair models as rerankers: a folder that `ctxrep finetune` (or an estimator's `save`) wrote
for a SequenceRegressor or SequenceClassifier fitted on (text_a, text_b) pairs (`--task stsb`, `sick-r`, `regress`,
`pair`, `glue-pair`) scores (query, document) pairs as a cross-encoder does.

    reranker = PairModelReranker("runs/stsb/model")       # or ctxrep.rerank.load_reranker("runs/stsb/model")
    reranker.rerank(query, documents, top_n=3)           # Hits, as every reranker
    reranker.predict(pairs)                              # = the estimator's pair_scores: the regressor's predict, the
                                                         #   classifier's probability of its last class

The scores are the estimator's own (`pair_scores`); the reranker adds what the front ends read of every reranker:
the tokenizer, max_length, prompts (a saved estimator declares none: `prompt` text goes before the query) and, after
each call, the pairs cut to fit (`cut_texts`, `cut_pieces`): a fine-tuned model reads a pair in one window of
max_length pieces and cuts the longer text first, as it did in training; on frozen features nothing is cut.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ctxrep.models.folders import CheckpointError
from ctxrep.models.sentence_transformers import Prompts
from ctxrep.rerank.ranking import BetweenBatches, Reranker

ESTIMATOR_KEY = "estimator"  # config.json of a saved ctxrep estimator names its class here (ctxrep.tasks.load)


def is_estimator_folder(folder: str | os.PathLike) -> bool:
    """Whether `folder` holds a saved ctxrep task estimator: a config.json that names its estimator class (what
    ctxrep.tasks.load reads), not a Hugging Face model's."""
    config = Path(folder) / "config.json"
    try:
        return isinstance(json.loads(config.read_text()).get(ESTIMATOR_KEY), str)
    except (OSError, ValueError, AttributeError):
        return False


class PairModelReranker(Reranker):
    """A fine-tuned ctxrep pair model (see the module docstring) behind the rerankers' interface.

    model: a folder written by a SequenceRegressor / SequenceClassifier's save (`ctxrep finetune`'s OUT/model), or a
    fitted estimator. device: where it predicts (None: the saved one). Any other estimator, or one fitted on single
    texts, is a one-line CheckpointError naming it.
    """

    # The estimator predicts a call whole: the server's turns (ctxrep serve) do not reach inside it.
    between_batches: BetweenBatches | None = None

    def __init__(self, model, device: str | None = None) -> None:
        from ctxrep.tasks import load
        from ctxrep.tasks.classifier import SequenceTask

        if isinstance(model, (str, os.PathLike)):
            folder = Path(model)
            if not is_estimator_folder(folder):
                raise CheckpointError(
                    f"{folder}: not a saved ctxrep estimator (its config.json names no {ESTIMATOR_KEY!r}); a fine-tuned "
                    "pair model is the OUT/model folder of `ctxrep finetune --task stsb|sick-r|regress|pair|glue-pair`"
                )
            estimator = load(folder, device=device)
        else:
            folder, estimator = None, model
        where = str(folder) if folder is not None else f"this {type(estimator).__name__}"
        if not isinstance(estimator, SequenceTask):
            raise CheckpointError(
                f"{where}: holds a {type(estimator).__name__}, which does not score (query, document) pairs; a "
                "reranker is a SequenceRegressor or SequenceClassifier fitted on (text_a, text_b) pairs"
            )
        try:
            estimator.check_reranks()
        except ValueError as e:
            raise CheckpointError(f"{where}: {e}") from None
        if device is not None and folder is None:
            estimator.set_params(device=device)
        self.estimator, self.folder = estimator, folder
        loaded = estimator.backbone_
        self.tokenizer = loaded.tokenizer
        limit = loaded.model.max_tokens
        self.max_length = min(estimator.max_length or limit, limit)
        self.prompts = Prompts({}, where=where)
        self.cut_texts: list[int] = []  # the pairs of the last call cut to fit max_length, by index in that call
        self.cut_pieces: list[int] = []  # the pieces each of them lost

    def predict(
        self, pairs: Sequence[tuple[str, str]], prompt: str | None = None, prompt_name: str | None = None
    ) -> np.ndarray:
        """The estimator's score of each (query, document) pair (`pair_scores`), in their order; `prompt` goes
        before each query."""
        prefix = self.prompts.resolve(prompt, prompt_name)
        pairs = list(pairs)
        for i, pair in enumerate(pairs):
            if not (isinstance(pair, (tuple, list)) and len(pair) == 2 and all(isinstance(t, str) for t in pair)):
                raise TypeError(f"pair {i}: expected a (query, document) pair of strings")
        pairs = [(prefix + q, d) for q, d in pairs]
        self.cut_texts, self.cut_pieces = self._cuts(pairs)
        if not pairs:
            return np.zeros(0, np.float32)
        return np.asarray(self.estimator.pair_scores(pairs), dtype=np.float32)

    def _cuts(self, pairs: list[tuple[str, str]]) -> tuple[list[int], list[int]]:
        """(pairs cut, pieces each lost): a fine-tuned encoder reads a pair's words in one window of max_length
        pieces with its special tokens (WindowPlan.truncated); frozen features window the text, cutting nothing."""
        from ctxrep.tasks.modes import mode_of

        if not pairs or not mode_of(self.estimator.mode).trains_encoder:
            return [], []
        specials = self.tokenizer.template.num_special(pair=True)
        words = [t.split() for pair in pairs for t in pair]
        if self.tokenizer.word_level:  # one piece a word (ELMo), counted without numbering them in its table
            sizes = [len(w) for w in words]
        else:
            sizes = [len(p.ids) for p in self.tokenizer.encode_words(words)]
        lengths = [a + b + specials for a, b in zip(sizes[0::2], sizes[1::2])]
        cut = [i for i, n in enumerate(lengths) if n > self.max_length]
        return cut, [lengths[i] - self.max_length for i in cut]


__all__ = ["PairModelReranker", "is_estimator_folder"]
