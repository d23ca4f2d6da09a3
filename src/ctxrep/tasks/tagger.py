"""TokenTagger: one label per word (NER, POS), predicted from each word's first or mean subword piece.

A sentence with more pieces than the model's positions is cut into overlapping windows on word boundaries
(the same rule as ctxrep.Featurizer: each word is predicted from the window where it has the most context
on its poorer side); nothing is truncated. On frozen features the Featurizer does this windowing itself.

`score` is entity-level F1 with conlleval semantics (ctxrep.data.tags) when the labels are an entity tag
scheme (BIO / IOB1 / IOBES), and token accuracy otherwise.

Output layer: a softmax per word (cross-entropy), or with `crf=True` a linear-chain CRF over the head's
per-word scores (the BiLSTM-CNN-CRF of Ma & Hovy 2016, sec. 2.3; Peters et al. 2017's TagLM): the loss is the
CRF's negative log-likelihood -log p(y | E) (ctxrep.modules.crf), summed over sentences and divided by the number
of words so that it is on the scale of the per-word cross-entropy (the same lr works for both), and `predict`
returns the Viterbi path. A long sentence trains on each window's words as its own chain; at prediction each word's
scores come from the window that predicts it, and Viterbi runs over the whole sentence, so transitions across
window boundaries are scored too.
"""

from __future__ import annotations

import re
from dataclasses import KW_ONLY, dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ctxrep.data.tags import TAG_SCHEMES, entity_scores
from ctxrep.modules.crf import CRF
from ctxrep.tasks.base import IGNORE, Call, TaskEstimator
from ctxrep.tasks.network import Representation
from ctxrep.text.inputs import EncoderInput, WindowPlan

_ENTITY_TAG = re.compile(r"^(O|[BIES]-.+)$")


@dataclass
class TaggedWindow:
    """One window of a sentence: its encoder input, whose .words are the words it predicts (finetune), or the
    whole sentence's frozen features; and one label per predicted word."""

    sentence: int
    input: EncoderInput | None = None
    features: np.ndarray | None = None
    labels: list[int] = field(default_factory=list)


class WordHead(nn.Module):
    """Pool each word's pieces (a (batch, words, pieces) weight matrix from the batch), then a linear layer to
    one score per label (the softmax's logits, or the CRF's emissions when `crf` is set)."""

    def __init__(self, in_dim: int, num_labels: int, crf: bool = False) -> None:
        super().__init__()
        self.linear = nn.Linear(in_dim, num_labels)
        self.crf = CRF(num_labels) if crf else None

    def forward(self, states: torch.Tensor, batch: dict) -> torch.Tensor:
        if "pool" in batch:
            states = batch["pool"] @ states  # (batch, words, hidden)
        return self.linear(states)  # (batch, words, labels)


@dataclass(eq=False, repr=False)
class TokenTagger(TaskEstimator):
    """Tag words: X is a list of word lists, y a list of label lists of the same lengths.

    word_pooling: "first" or "mean" subword piece of each word (also the Featurizer pooling when frozen).
    tag_scheme: "auto" (entity scoring when every label is O or B-/I-/E-/S-TYPE), "iob1", "bio", "iobes"
        (entity scoring; labels are checked against the scheme) or "none" (token accuracy).
    stride: pieces a window advances for long sentences (default: half a window).
    crf: a linear-chain CRF output layer (trained by its negative log-likelihood, decoded by Viterbi) instead of
        a softmax per word; see the module docstring.
    crf_lr: learning rate of the CRF's transition, start and end scores (default: 1e-2, or lr when larger). They
        are few and start near zero: at a fine-tuning lr such as 5e-5 they would barely move in a whole run.
    """

    word_pooling: str = "first"
    tag_scheme: str = "auto"
    _: KW_ONLY
    stride: int | None = None
    crf: bool = False
    crf_lr: float | None = None

    # ---- data -------------------------------------------------------------------------------------

    def _check_params(self) -> None:
        if self.word_pooling not in ("first", "mean"):
            raise ValueError(f"word_pooling must be 'first' or 'mean', got {self.word_pooling!r}")
        if self.tag_scheme not in TAG_SCHEMES:
            raise ValueError(f"tag_scheme must be one of {TAG_SCHEMES}, got {self.tag_scheme!r}")
        if not isinstance(self.crf, (bool, np.bool_)):
            raise ValueError(f"crf must be True or False, got {self.crf!r}")
        if self.crf_lr is not None and not self.crf_lr > 0:
            raise ValueError(f"crf_lr must be positive (or None: 1e-2, or lr when larger), got {self.crf_lr!r}")

    def _own_lr(self) -> tuple[str, float] | None:
        if not self.crf:
            return None
        return "head.crf.", self.crf_lr if self.crf_lr is not None else max(self._lr(), 1e-2)

    def _frozen_pooling(self) -> str:
        return self.word_pooling

    @staticmethod
    def _check_X(X) -> list[list[str]]:
        if isinstance(X, str):
            raise TypeError("X must be a list of word lists, got a single string")
        X = list(X)
        for i, words in enumerate(X):
            if isinstance(words, str):
                raise TypeError(
                    f"sentence {i} is a string; TokenTagger takes pre-split words: give a list of word lists "
                    f"(e.g. {words.split()[:3]!r})"
                )
            if not all(isinstance(w, str) and w and not w.isspace() for w in words):
                raise ValueError(f"sentence {i}: every word must be a non-empty string")
            if len(words) == 0:
                raise ValueError(f"sentence {i} has no words; remove it")
        return [list(w) for w in X]

    def _check_X_y(self, X, y, fitting: bool):
        X = self._check_X(X)
        y = [list(labels) for labels in y]
        if len(y) != len(X):
            raise ValueError(f"X has {len(X)} sentences but y has {len(y)} label lists; give one per sentence")
        for i, (words, labels) in enumerate(zip(X, y)):
            if len(words) != len(labels):
                raise ValueError(
                    f"sentence {i}: {len(words)} words but {len(labels)} labels; give exactly one label per word"
                )
        return X, y

    def _learn_targets(self, y) -> None:
        self.classes_ = np.array(sorted({label for labels in y for label in labels}))
        scheme = self.tag_scheme
        entity_like = all(_ENTITY_TAG.match(str(c)) for c in self.classes_) and any(c != "O" for c in self.classes_)
        if scheme == "auto":
            self.entity_scoring_ = entity_like
        elif scheme == "none":
            self.entity_scoring_ = False
        else:
            allowed = "BIES" if scheme == "iobes" else "BI"
            bad = [c for c in self.classes_ if not re.match(rf"^(O|[{allowed}]-.+)$", str(c))]
            if bad:
                raise ValueError(
                    f"tag_scheme={scheme!r} but labels {bad[:5]} are not O or {', '.join(allowed)}- tags; "
                    "fix the labels or pass tag_scheme='auto' / 'none'"
                )
            self.entity_scoring_ = True

    def _check_same_targets(self, y) -> None:
        self._encode_labels(y)

    def _encode_labels(self, y) -> list[list[int]]:
        index = {label: i for i, label in enumerate(self.classes_.tolist())}
        out = []
        for i, labels in enumerate(y):
            unseen = sorted({str(label) for label in labels if label not in index})
            if unseen:
                raise ValueError(
                    f"sentence {i}: labels {unseen} were not seen at fit time (known: {self.classes_.tolist()}); "
                    "refit with examples of every label"
                )
            out.append([index[label] for label in labels])
        return out

    def _labels(self, X, y) -> list[list[int]]:
        return self._encode_labels(y) if y is not None else [[IGNORE] * len(words) for words in X]

    def _feature_records(self, X, y, call: Call) -> list[TaggedWindow]:
        labels = self._labels(X, y)
        store = call.features(X)  # whole sentences: the Featurizer windows long ones itself
        return [TaggedWindow(i, features=store[i], labels=labels[i]) for i in range(len(X))]

    def _piece_records(self, X, y, call: Call) -> list[TaggedWindow]:
        labels = self._labels(X, y)
        plan = WindowPlan(call.tokenizer, call.max_length, self.stride)
        out = []
        for i, pieces in enumerate(call.tokenizer.encode_words(X)):
            for window in plan.single(i, pieces):
                out.append(TaggedWindow(i, input=window, labels=[labels[i][w] for w, _, _ in window.words]))
        return out

    def _collate(self, windows: list[TaggedWindow], call: Call) -> dict[str, torch.Tensor]:
        batch = call.mode.units(windows, call, word_pooling=self.word_pooling)  # one vector per word
        n = max(1, max(len(w.labels) for w in windows))  # words of the longest row: the logits' second dimension
        labels = torch.full((len(windows), n), IGNORE, dtype=torch.long)
        for r, w in enumerate(windows):
            labels[r, : len(w.labels)] = torch.tensor(w.labels, dtype=torch.long)
        batch["labels"] = labels
        return batch

    # ---- head -------------------------------------------------------------------------------------

    def _make_head(self, rep: Representation) -> nn.Module:
        return WordHead(rep.out_dim, len(self.classes_), crf=bool(self.crf))

    def _head_loss(self, logits: torch.Tensor, batch: dict) -> torch.Tensor:
        labels = batch["labels"]
        if not self.crf:
            return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE)
        mask = labels != IGNORE  # (batch, words): each row's labelled words, a prefix
        rows = mask[:, 0]  # a window with no labelled word adds nothing
        crf: CRF = self.model_.head.crf
        emissions, tags, mask = logits[rows], labels[rows].clamp(min=0), mask[rows]
        nll = crf.log_partition(emissions, mask) - crf.score(emissions, tags, mask)  # (rows,) -log p(y | E)
        return nll.sum() / mask.sum().clamp(min=1)  # per word, on the cross-entropy's scale

    def _split_outputs(self, logits, windows) -> list:
        n = [len(w.input.words) if w.input is not None else len(w.features) for w in windows]
        return [logits[r, : n[r]] for r in range(len(windows))]

    def _state_to_json(self) -> dict:
        return super()._state_to_json() | {"entity_scoring": self.entity_scoring_}

    def _state_from_json(self, state: dict) -> None:
        super()._state_from_json(state)
        self.entity_scoring_ = state["entity_scoring"]

    # ---- prediction -------------------------------------------------------------------------------

    def predict(self, X, *, device: str | torch.device | None = None, precision: str | None = None) -> list[list[str]]:
        """One label list per sentence (device / precision: for this call, see `using`)."""
        return super().predict(X, device=device, precision=precision)

    def _decode(self, X, windows, outputs) -> list[list[str]]:
        """Each word's scores come from the window that predicts it; then argmax per word, or Viterbi over the
        whole sentence (crf)."""
        scores = [torch.zeros((len(words), len(self.classes_))) for words in X]  # (words, labels) per sentence
        for w, logits in zip(windows, outputs):
            positions = [word for word, _, _ in w.input.words] if w.input is not None else range(len(logits))
            scores[w.sentence][list(positions)] = logits.float()
        if self.crf:
            best = []
            for start in range(0, len(scores), self.batch_size):
                part = scores[start : start + self.batch_size]
                emissions = nn.utils.rnn.pad_sequence(part, batch_first=True)  # (batch, words, labels)
                lengths = torch.tensor([len(e) for e in part])
                mask = torch.arange(emissions.shape[1]) < lengths.unsqueeze(1)  # (batch, words)
                crf = self.model_.head.crf
                device = crf.transitions.device
                best += crf.decode(emissions.to(device), mask.to(device))
        else:
            best = [e.argmax(dim=-1).tolist() for e in scores]
        return [[self.classes_[label].item() for label in path] for path in best]

    def evaluate(self, X, y) -> dict:
        """Entity-level P/R/F1 overall and per type (entity scoring), or token accuracy."""
        self._check_fitted()
        X, y = self._check_X_y(X, y, fitting=False)
        self._encode_labels(y)
        return self._evaluate(y, self._predict_checked(X) if X else [])

    def _evaluate(self, y, predicted) -> dict:
        correct = sum(p == g for ps, gs in zip(predicted, y) for p, g in zip(ps, gs))
        total = sum(len(gs) for gs in y)
        result = {"token_accuracy": correct / total if total else 0.0}
        if self.entity_scoring_:
            scores = entity_scores(y, predicted)
            result |= {"precision": scores.overall.precision, "recall": scores.overall.recall, "f1": scores.overall.f1}
            result["by_type"] = {
                t: {"precision": s.precision, "recall": s.recall, "f1": s.f1, "support": s.gold}
                for t, s in scores.by_type.items()
            }
        return result

    def _score(self, X, y, predicted) -> float:
        """Entity-level F1 (conlleval semantics) for entity tag schemes, else token accuracy."""
        result = self._evaluate(y, predicted)
        return result["f1"] if self.entity_scoring_ else result["token_accuracy"]

    def score(self, X, y, *, device: str | torch.device | None = None, precision: str | None = None) -> float:
        """Entity-level F1 (conlleval semantics) for entity tag schemes, else token accuracy."""
        return super().score(X, y, device=device, precision=precision)


__all__ = ["TokenTagger", "TAG_SCHEMES"]
