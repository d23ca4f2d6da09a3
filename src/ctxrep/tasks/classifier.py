"""SequenceClassifier: one label per text or per text pair, on top of a contextual encoder (SequenceTask holds
what it shares with ctxrep.tasks.regressor.SequenceRegressor: texts or pairs, records, batches, the pooling head,
`rerank` as a cross-encoder: the rerank API of every reranker, answering with Hits).

Heads (over the units of a text: pieces when fine-tuning, words on frozen features):
  cls     the classification token when fine-tuning; the final forward and backward states (forward at the last
          word, backward at the first) of the frozen BiLSTM, or of ELMo's biLM when fine-tuning ELMo
  mean    the mean over the text's units
  concat  ULMFiT's concat pooling [h_last; maxpool(h); meanpool(h)] (Howard & Ruder 2018, sec. 3.3), h_last being
          the classification token (fine-tuning) or the BiLSTM's final states (frozen)
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ctxrep.models.sentence_transformers import Prompts
from ctxrep.tasks.base import IGNORE, Call, TaskEstimator
from ctxrep.tasks.network import Representation
from ctxrep.text.inputs import EncoderInput, WindowPlan
from ctxrep.vectors.hits import Hits, check_rerank_args, ranked_hits

POOLINGS = ("cls", "mean", "concat")


@dataclass
class Example:
    """One text (or pair): its encoder input (finetune, cut to fit) or its words' frozen features, and its label."""

    input: EncoderInput | None = None
    features: np.ndarray | None = None
    label: int | float = IGNORE  # a class index (classifier) or a standardised score (regressor)


@dataclass
class _Ranking:
    """Deprecated (goes in 0.3) with `rank`: each candidate's score (in the candidates' order) and the candidate
    indices, best first. `rerank` answers with Hits."""

    scores: np.ndarray  # (n_candidates,) float
    order: np.ndarray  # (n_candidates,) or (top_k,) int indices into the candidates


_Ranking.__name__ = _Ranking.__qualname__ = "Ranking"


def __getattr__(name: str):
    if name == "Ranking":  # the deprecated import of `rank`'s result type
        warnings.warn(
            "ctxrep.tasks.classifier.Ranking goes in 0.3 with rank: rerank(query, documents, top_n) answers with Hits "
            "(ctxrep.vectors.hits), as every reranker",
            DeprecationWarning,
            stacklevel=2,
        )
        return _Ranking
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class PoolingHead(nn.Module):
    """Pool a text's unit vectors, then a linear layer to the class logits."""

    def __init__(self, in_dim: int, num_classes: int, pooling: str, bidirectional_states: bool) -> None:
        super().__init__()
        self.pooling = pooling
        self.bidirectional_states = bidirectional_states  # frozen BiLSTM: "last" = [fwd at end; bwd at start]
        self.linear = nn.Linear(in_dim * (3 if pooling == "concat" else 1), num_classes)

    def _last(self, states: torch.Tensor, batch: dict) -> torch.Tensor:
        if "cls_position" in batch:  # fine-tuning: the classification token
            return states[torch.arange(len(states)), batch["cls_position"]]
        mask = batch["mask"] if "mask" in batch else batch["attention_mask"]
        last = mask.sum(dim=1) - 1
        at_end = states[torch.arange(len(states)), last]  # (batch, dim)
        if not self.bidirectional_states:
            return at_end
        half = states.shape[-1] // 2
        return torch.cat([at_end[:, :half], states[:, 0, half:]], dim=-1)

    def forward(self, states: torch.Tensor, batch: dict) -> torch.Tensor:
        mask = (batch["attention_mask"] if "attention_mask" in batch else batch["mask"]).bool()
        m = mask.unsqueeze(-1).to(states.dtype)
        mean = (states * m).sum(dim=1) / m.sum(dim=1).clamp(min=1)
        if self.pooling == "mean":
            pooled = mean
        elif self.pooling == "cls":
            pooled = self._last(states, batch)
        else:
            maxpool = states.masked_fill(~mask.unsqueeze(-1), torch.finfo(states.dtype).min).max(dim=1).values
            pooled = torch.cat([self._last(states, batch), maxpool, mean], dim=-1)
        return self.linear(pooled)  # (batch, classes)


@dataclass(eq=False, repr=False)
class SequenceTask(TaskEstimator):
    """What the sequence estimators share: X is a list of texts or of (text_a, text_b) pairs, each split on
    whitespace into words; one target per example, read from the pooled units of the text (PoolingHead).
    SequenceClassifier and SequenceRegressor add their targets, head outputs and loss.

    pooling: "cls", "mean" or "concat" (see ctxrep.tasks.classifier).
    """

    pooling: str = "cls"

    # ---- data -------------------------------------------------------------------------------------

    def _check_params(self) -> None:
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {self.pooling!r}")
        if self.pooling == "cls" and not self._mode().final_states(self):  # frozen_head="linear"
            raise ValueError(
                "pooling='cls' on frozen features needs the BiLSTM's final states: use frozen_head='bilstm', "
                "or pooling='mean' / 'concat'"
            )

    @staticmethod
    def _is_pair(x) -> bool:
        return isinstance(x, (tuple, list)) and len(x) == 2 and all(isinstance(t, str) for t in x)

    def _check_X(self, X) -> list[tuple[list[str], list[str] | None]]:
        """(words of text_a, words of text_b or None) per example."""
        if isinstance(X, str):
            raise TypeError("X must be a list of texts (or of (text_a, text_b) pairs), got a single string")
        X = list(X)
        pair_flags = [self._is_pair(x) for x in X]
        for i, x in enumerate(X):
            if not pair_flags[i] and not isinstance(x, str):
                raise TypeError(f"example {i}: expected a string or a (text_a, text_b) pair, got {type(x).__name__}")
        if X and any(pair_flags) and not all(pair_flags):
            first_single = pair_flags.index(False)
            raise ValueError(
                f"X mixes single texts and pairs (example {first_single} is a single text, example "
                f"{pair_flags.index(True)} a pair); give all single texts or all (text_a, text_b) pairs"
            )
        pairs = bool(X) and all(pair_flags)
        if hasattr(self, "pairs_") and X and pairs != self.pairs_:
            trained, given = ("sentence pairs", "single texts") if self.pairs_ else ("single texts", "sentence pairs")
            raise ValueError(
                f"this {type(self).__name__} was trained on {trained} but X holds {given}; give X in the same form as at fit"
            )

        def words(text: str, i: int, which: str) -> list[str]:
            w = text.split()
            if not w:
                raise ValueError(f"example {i}: {which} is empty; every text needs at least one word")
            return w

        if pairs:
            return [(words(a, i, "text_a"), words(b, i, "text_b")) for i, (a, b) in enumerate(X)]
        return [(words(t, i, "the text"), None) for i, t in enumerate(X)]

    def _check_X_y(self, X, y, fitting: bool):
        if fitting and hasattr(self, "pairs_") and not self.warm_start:
            del self.pairs_  # a new fit may switch between single texts and pairs
        X = self._check_X(X)
        if fitting:
            self.pairs_ = bool(X) and X[0][1] is not None
        y = list(y)
        if len(y) != len(X):
            raise ValueError(f"X has {len(X)} examples but y has {len(y)} labels; give one label per example")
        return X, y

    def _labels(self, X, y) -> list:
        return self._encode_labels(y) if y is not None else [IGNORE] * len(X)

    def _feature_records(self, X, y, call: Call) -> list[Example]:
        labels = self._labels(X, y)
        pairs = bool(X) and X[0][1] is not None
        store = call.features([a for a, _ in X], [b for _, b in X] if pairs else None)
        return [Example(features=store[i], label=self._target(labels[i])) for i in range(len(X))]

    def _piece_records(self, X, y, call: Call) -> list[Example]:
        labels = self._labels(X, y)
        pairs = bool(X) and X[0][1] is not None
        plan = WindowPlan(call.tokenizer, call.max_length)
        pieces_a = call.tokenizer.encode_words([a for a, _ in X])
        pieces_b = call.tokenizer.encode_words([b for _, b in X]) if pairs else [None] * len(X)
        return [
            Example(plan.truncated(i, a, b), label=self._target(labels[i]))
            for i, (a, b) in enumerate(zip(pieces_a, pieces_b))
        ]

    def _collate(self, examples: list[Example], call: Call) -> dict[str, torch.Tensor]:
        batch = call.mode.units(examples, call)  # pieces (+ cls_position) or frozen features
        batch["labels"] = torch.tensor([e.label for e in examples])
        return batch

    def _state_to_json(self) -> dict:
        return super()._state_to_json() | {"pairs": self.pairs_}

    def _state_from_json(self, state: dict) -> None:
        super()._state_from_json(state)
        self.pairs_ = state["pairs"]

    def _target(self, value):
        """One encoded target as a Python number (an int class index, or a float score)."""
        return value.item() if hasattr(value, "item") else value

    # ---- reranking (a cross-encoder) ---------------------------------------------------------------

    def pair_scores(self, pairs) -> np.ndarray:
        """The relevance score of each (query, document) pair, in their order: the regressor's prediction, the
        classifier's probability of its last class, classes_[-1] (labels sort, so with labels 0/1 or False/True that is
        the positive one; see SequenceClassifier._pair_scores). What `rerank` orders by."""
        self.check_reranks()
        return self._pair_scores(list(pairs))

    def _pair_scores(self, pairs: list[tuple[str, str]]) -> np.ndarray:
        raise NotImplementedError

    def check_reranks(self) -> None:
        """A one-line ValueError when this model cannot score (query, document) pairs: not fitted, or fitted on
        single texts."""
        self._check_fitted()
        if not self.pairs_:
            raise ValueError(
                f"rerank scores (query, document) pairs, but this {type(self).__name__} was trained on single texts; "
                "train it on (text_a, text_b) pairs to use it as a cross-encoder"
            )

    def rerank(
        self,
        query: str,
        documents,
        top_n: int | None = None,
        prompt: str | None = None,
        prompt_name: str | None = None,
    ) -> Hits:
        """Use a model trained on (text_a, text_b) pairs as a cross-encoder reranker, with the rerank API of every
        ctxrep reranker: the `top_n` best documents (all when None) for `query` by `pair_scores`, highest first
        (ties keep the documents' order), as Hits (ids = the documents' positions, texts = the documents, scores).
        prompt: text put before the query; prompt_name: none is declared (a saved estimator has no prompts)."""
        self.check_reranks()
        documents = check_rerank_args(query, documents, top_n)
        prefix = Prompts({}, where=f"this {type(self).__name__}").resolve(prompt, prompt_name)
        return ranked_hits(self._pair_scores([(prefix + query, d) for d in documents]), documents, top_n)

    def rank(self, query: str, candidates, top_k: int | None = None) -> _Ranking:
        """Deprecated (goes in 0.3): rerank(query, documents, top_n) answers with Hits, as every reranker.
        Ranking(scores in candidate order, order = candidate indices best first, top_k of them when given)."""
        warnings.warn(
            f"{type(self).__name__}.rank(query, candidates, top_k) -> Ranking goes in 0.3: rerank(query, documents, "
            "top_n) answers with Hits (ids = the documents' positions, texts, scores best first), as every reranker",
            DeprecationWarning,
            stacklevel=2,
        )
        self.check_reranks()
        if not isinstance(query, str):
            raise TypeError(f"query must be a string, got {type(query).__name__}")
        if isinstance(candidates, str):
            raise TypeError("candidates must be a list of strings, got a single string")
        candidates = list(candidates)
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
            raise ValueError(f"top_k must be a positive integer or None, got {top_k!r}")
        scores = self._pair_scores([(query, c) for c in candidates]) if candidates else np.zeros(0, np.float32)
        order = np.argsort(-scores, kind="stable")  # ties keep the candidates' order
        return _Ranking(scores, order[:top_k] if top_k is not None else order)


class SequenceClassifier(SequenceTask):
    """Classify texts (X: list of strings) or text pairs (X: list of (text_a, text_b)); texts are split on
    whitespace into words. Fine-tuning truncates a text (the longer of a pair first) to max_length pieces.

    pooling: "cls", "mean" or "concat" (see the module docstring).
    """

    _estimator_type = "classifier"

    # ---- targets ----------------------------------------------------------------------------------

    def _learn_targets(self, y) -> None:
        refuse_continuous_labels(y)
        self.classes_ = np.unique(np.asarray(y))

    def _check_same_targets(self, y) -> None:
        self._encode_labels(y)

    def _encode_labels(self, y) -> np.ndarray:
        y = np.asarray(y)
        unseen = sorted(set(y.tolist()) - set(self.classes_.tolist()), key=str)
        if unseen:
            raise ValueError(
                f"labels {unseen} were not seen at fit time (known: {self.classes_.tolist()}); the classifier "
                "cannot predict them: refit with examples of every label"
            )
        return np.searchsorted(self.classes_, y)

    # ---- head -------------------------------------------------------------------------------------

    def _make_head(self, rep: Representation) -> nn.Module:
        return PoolingHead(rep.out_dim, len(self.classes_), self.pooling, rep.bidirectional_states)

    def _head_loss(self, logits: torch.Tensor, batch: dict) -> torch.Tensor:
        return F.cross_entropy(logits, batch["labels"])

    # ---- prediction -------------------------------------------------------------------------------

    def predict_proba(self, X, *, device: str | torch.device | None = None, precision: str | None = None) -> np.ndarray:
        """(n_examples, n_classes) class probabilities, columns in the order of classes_ (device / precision: for
        this call, see `using`)."""
        self._check_fitted()
        X = self._check_X(X)
        if not X:
            return np.zeros((0, len(self.classes_)), dtype=np.float32)
        call = self._call()
        records = self._examples(X, None, call)
        with self.using(device, precision):
            logits = torch.stack(self._forward_all(records, call))
        return logits.softmax(dim=-1).numpy()

    def _decode(self, X, examples, outputs) -> np.ndarray:
        if not outputs:
            return self.classes_[:0]
        return self.classes_[torch.stack(outputs).argmax(dim=-1).numpy()]

    def _pair_scores(self, pairs: list[tuple[str, str]]) -> np.ndarray:
        """The probability of the last class (classes_[-1]: 1, True, "similar", ... as sorted) for each pair."""
        return self.predict_proba(pairs)[:, -1].astype(np.float64)

    def _score(self, X, y, predicted) -> float:
        """Accuracy."""
        y = np.asarray(y)
        if len(predicted) != len(y):
            raise ValueError(f"X has {len(predicted)} examples but y has {len(y)} labels")
        return float(np.mean(predicted == y)) if len(y) else 0.0


def refuse_continuous_labels(y) -> None:
    """Scores such as 0.0-5.0 similarity given to a classifier would silently become one class per distinct value:
    numeric labels (or numeric strings) with a fractional value among at least 3 distinct ones stop here."""
    values = []
    for label in y:
        if isinstance(label, (bool, np.bool_)):
            return
        if isinstance(label, str):
            try:
                label = float(label)
            except ValueError:
                return
        elif not isinstance(label, (int, float, np.integer, np.floating)):
            return
        values.append(float(label))
    distinct = set(values)
    fractional = [v for v in distinct if np.isfinite(v) and not float(v).is_integer()]
    if fractional and len(distinct) >= 3:
        shown = ", ".join(f"{v:g}" for v in sorted(fractional)[:3])
        raise ValueError(
            f"the labels look like continuous scores ({len(distinct)} distinct values, e.g. {shown}): a classifier "
            "would treat each value as its own class; use ctxrep.SequenceRegressor (ctxrep finetune --task regress)"
        )


__all__ = ["SequenceClassifier", "SequenceTask", "PoolingHead", "POOLINGS"]
