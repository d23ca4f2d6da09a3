"""WordInContextClassifier: is a target word used in the same sense in two texts? (WiC, Pilehvar & Camacho-Collados
2019.) A plain pair classifier cannot be told which word is the target; this one reads the target's contextual
vector from each text.

X: (text_a, text_b) pairs whose texts mark the target word as `ctxrep neighbors query` reads it
("He sat on the [[bank]] .", or "SENTENCE<TAB>WORD_INDEX"), or ((text_or_words_a, index_a), (text_or_words_b,
index_b)) with 0-based word indices (WiC's own files: ctxrep.data.read_wic).

Representation (the WiC baselines' features): u, v = the target word's vector in text a and in text b (the mean of
its pieces; words on frozen features), and the head reads
    finetune  [h_cls; u; v; u * v; |u - v|] -> linear -> class logits, the pair encoded as one input
              ([CLS] a [SEP] b [SEP]) so that each text's target attends to the other text
    frozen    [u; v; u * v; |u - v|] from the ScalarMix over all layers (and the BiLSTM, frozen_head="bilstm")
              over the pair's words
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass

import numpy as np
import torch
from torch import nn

from ctxrep.tasks.base import IGNORE, Call
from ctxrep.tasks.classifier import SequenceClassifier
from ctxrep.tasks.modes import units_of
from ctxrep.tasks.network import Representation
from ctxrep.text.inputs import EncoderInput, WindowPlan

MARK_EXAMPLE = "He sat on the [[bank]] of the river ."


@dataclass
class TargetPair:
    """One pair: its encoder input (finetune) or its words' frozen features (text a's words, then b's), where the
    two targets' units are, and the label."""

    input: EncoderInput | None = None
    features: np.ndarray | None = None
    target_a: tuple[int, int] = (0, 0)  # (first unit, last unit + 1): pieces (finetune) or words (frozen)
    target_b: tuple[int, int] = (0, 0)
    label: int = IGNORE


def parse_target(text, source: str, which: str = "the text") -> tuple[list[str], int]:
    """(words, target index) of one text: a string with one word marked [[word]] (or "SENTENCE<TAB>WORD_INDEX"), or
    a (text or word list, index) pair. Errors start with `source` ("FILE:LINE" or "example N")."""
    from ctxrep.analysis.neighbors import QUERY_MARK, parse_query

    if isinstance(text, str):
        if "\t" not in text and sum(QUERY_MARK[0] in w and w.endswith(QUERY_MARK[1]) for w in text.split()) == 0:
            raise ValueError(
                f"{source}: {which} has no target word marked [[like this]]; mark the target word in each text, "
                f"e.g. {MARK_EXAMPLE!r}"
            )
        try:
            query = parse_query(text, source)
        except ValueError as e:
            raise ValueError(f"{e} ({which})") from None
        return query.words, query.word
    if isinstance(text, (tuple, list)) and len(text) == 2 and isinstance(text[1], (int, np.integer)):
        words = text[0].split() if isinstance(text[0], str) else list(text[0])
        if not words or not all(isinstance(w, str) and w.strip() for w in words):
            raise ValueError(f"{source}: {which} is empty or holds a non-word; give a text and a word index")
        index = int(text[1])
        if not 0 <= index < len(words):
            raise ValueError(
                f"{source}: {which}'s target index {index} is outside its {len(words)} words (0..{len(words) - 1})"
            )
        return words, index
    raise TypeError(
        f"{source}: {which} must be a string with its target marked [[word]], or a (text, word index) pair; "
        f"got {type(text).__name__}"
    )


class TargetPairHead(nn.Module):
    """[h_cls;] u; v; u * v; |u - v| -> linear, with u and v the mean of each target's units."""

    def __init__(self, in_dim: int, num_classes: int, with_cls: bool) -> None:
        super().__init__()
        self.with_cls = with_cls
        self.linear = nn.Linear(in_dim * (5 if with_cls else 4), num_classes)

    def forward(self, states: torch.Tensor, batch: dict) -> torch.Tensor:
        u = torch.bmm(batch["pool_a"].unsqueeze(1).to(states.dtype), states).squeeze(1)  # (batch, dim)
        v = torch.bmm(batch["pool_b"].unsqueeze(1).to(states.dtype), states).squeeze(1)
        parts = [u, v, u * v, (u - v).abs()]
        if self.with_cls:
            parts.insert(0, states[torch.arange(len(states)), batch["cls_position"]])
        return self.linear(torch.cat(parts, dim=-1))  # (batch, classes)


@dataclass(eq=False, repr=False)
class WordInContextClassifier(SequenceClassifier):
    """Classify (text_a, text_b) pairs by the sense of a marked target word in each (WiC: same sense or not).

    X: see the module docstring; y: labels (WiC: "T" / "F" or True / False). `predict_proba`, `score` (accuracy),
    save / load and the parameters are SequenceClassifier's; `pooling` is not used (the head reads the targets).

    symmetric: WiC does not depend on the order of the two texts; True trains on every pair in both orders (a, b)
        and (b, a) (twice the training work) and predicts the mean of the two orders' logits, so that (a, b) and
        (b, a) get the same answer. Off by default: benchmarks/RESULTS.md's WiC rows were run without it.
    """

    _: KW_ONLY
    symmetric: bool = False

    # ---- data -------------------------------------------------------------------------------------

    def _check_params(self) -> None:
        pass  # the head reads the two targets, whatever `pooling` says

    def _check_X(self, X) -> list[tuple[list[str], int, list[str], int]]:
        """(words_a, target_a, words_b, target_b) per example."""
        if isinstance(X, str):
            raise TypeError("X must be a list of (text_a, text_b) pairs, got a single string")
        out = []
        for i, x in enumerate(X):
            if not (isinstance(x, (tuple, list)) and len(x) == 2):
                raise TypeError(
                    f"example {i}: expected a (text_a, text_b) pair, each text with its target word marked "
                    f"[[word]], got {type(x).__name__}"
                )
            words_a, target_a = parse_target(x[0], f"example {i}", "text_a")
            words_b, target_b = parse_target(x[1], f"example {i}", "text_b")
            out.append((words_a, target_a, words_b, target_b))
        return out

    def _check_X_y(self, X, y, fitting: bool):
        X = self._check_X(X)
        if fitting:
            self.pairs_ = True
        y = list(y)
        if len(y) != len(X):
            raise ValueError(f"X has {len(X)} examples but y has {len(y)} labels; give one label per example")
        return X, y

    def _examples(self, X, y, call: Call) -> list[TargetPair]:
        """One record per pair; with `symmetric`, then one per swapped pair (b, a): training learns both orders,
        prediction averages them (_fold)."""
        if self.symmetric:
            swapped = [(b, ib, a, ia) for a, ia, b, ib in X]
            return super()._examples(X, y, call) + super()._examples(swapped, y, call)
        return super()._examples(X, y, call)

    def _fold(self, outputs: list) -> list:
        """One output per example: the mean of the two orders' logits when `symmetric`."""
        if not self.symmetric:
            return outputs
        n = len(outputs) // 2
        return [(outputs[i] + outputs[n + i]) / 2 for i in range(n)]

    def _decode(self, X, records, outputs):
        return super()._decode(X, records, self._fold(outputs))

    def predict_proba(self, X) -> np.ndarray:
        """(n_examples, n_classes) class probabilities, columns in the order of classes_."""
        self._check_fitted()
        X = self._check_X(X)
        if not X:
            return np.zeros((0, len(self.classes_)), dtype=np.float32)
        call = self._call()
        logits = torch.stack(self._fold(self._forward_all(self._examples(X, None, call), call)))
        return logits.softmax(dim=-1).numpy()

    def _feature_records(self, X, y, call: Call) -> list[TargetPair]:
        labels = self._labels(X, y)
        store = call.features([a for a, _, _, _ in X], [b for _, _, b, _ in X])
        return [
            TargetPair(
                features=store[i],
                target_a=(ia, ia + 1),
                target_b=(len(a) + ib, len(a) + ib + 1),
                label=int(labels[i]),
            )
            for i, (a, ia, b, ib) in enumerate(X)
        ]

    def _piece_records(self, X, y, call: Call) -> list[TargetPair]:
        labels = self._labels(X, y)
        plan = WindowPlan(call.tokenizer, call.max_length)
        pieces_a = call.tokenizer.encode_words([a for a, _, _, _ in X])
        pieces_b = call.tokenizer.encode_words([b for _, _, b, _ in X])
        out = []
        for i, ((a, ia, _, ib), pa, pb) in enumerate(zip(X, pieces_a, pieces_b)):
            window = plan.pair(i, pa, pb)  # one window; too long a pair is an error naming it
            spans = {w: (s, e) for w, s, e in window.words}
            out.append(TargetPair(window, None, spans[ia], spans[len(a) + ib], int(labels[i])))
        return out

    def _collate(self, records: list[TargetPair], call: Call) -> dict[str, torch.Tensor]:
        batch = call.mode.units(records, call)  # pieces (+ cls_position) or frozen features
        n_units = max(units_of(r) for r in records)
        for key, field in (("pool_a", "target_a"), ("pool_b", "target_b")):
            pool = torch.zeros((len(records), n_units))  # (batch, units): 1 / k over the target's k units
            for row, r in enumerate(records):
                start, end = getattr(r, field)
                pool[row, start:end] = 1.0 / (end - start)
            batch[key] = pool
        batch["labels"] = torch.tensor([r.label for r in records])
        return batch

    # ---- head -------------------------------------------------------------------------------------

    def _make_head(self, rep: Representation) -> nn.Module:
        return TargetPairHead(rep.out_dim, len(self.classes_), rep.has_cls)

    def check_reranks(self) -> None:
        """Always a one-line ValueError: WiC's pairs are two uses of one word, not (query, document) pairs."""
        raise ValueError(
            "WordInContextClassifier compares a target word across two texts; to rerank texts for a query use "
            "SequenceRegressor or SequenceClassifier trained on pairs"
        )


__all__ = ["WordInContextClassifier", "TargetPairHead", "parse_target"]
