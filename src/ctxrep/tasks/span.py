"""SpanExtractor: SQuAD-style extractive question answering (Devlin et al. 2019, sec. 4.2).

Fine-tuning: the input is [CLS] question [SEP] context-window [SEP]; a linear layer gives a start and an end
logit per piece; a context longer than the model's positions is cut into windows that advance `doc_stride`
pieces; the answer is the best (start <= end, at most max_answer_length pieces) span over all windows, by
start + end logit, mapped back to character offsets in the context through the tokenizer's offsets.
A window that does not contain the whole answer is trained to point at the classification token.

Frozen: the same over whitespace words instead of pieces: each (question, context window) pair is featurized
with ctxrep.Featurizer (all layers, cached), a ScalarMix (and a BiLSTM unless frozen_head="linear") feeds the
start/end layer; windows without the answer are not trained on.

`score` is SQuAD's token F1 (the official script's normalisation: lower case, no punctuation, no articles
a/an/the, single spaces), each prediction against its best-matching gold answer; `evaluate` also gives
exact match.
"""

from __future__ import annotations

import collections
import re
import string
from dataclasses import KW_ONLY, dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ctxrep.tasks.base import Call, TaskEstimator
from ctxrep.tasks.modes import units_of
from ctxrep.tasks.network import Representation
from ctxrep.text.inputs import EncoderInput, window_words


@dataclass
class SpanWindow:
    """One (question, context window) row: its encoder input (finetune) or frozen features, where the context
    starts in the row, each context unit's character span, and the start / end targets."""

    example: int
    input: EncoderInput | None
    features: np.ndarray | None
    context_start: int  # position of the window's first context unit in the row
    spans: list[tuple[int, int]]  # character (start, end) of each context unit in the window
    cls_position: int  # the target when the answer is not in the window; -1: none (frozen)
    start: int  # target positions (cls_position when the answer is not in the window; -1 = not trained)
    end: int


class SpanHead(nn.Module):
    """Start and end logits per unit; units outside the context (except the CLS target) are masked out."""

    def __init__(self, in_dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(in_dim, 2)

    def forward(self, states: torch.Tensor, batch: dict) -> torch.Tensor:
        logits = self.linear(states)  # (batch, units, 2)
        return logits.masked_fill(~batch["allowed"].unsqueeze(-1), -1e4)


# ---- SQuAD's answer normalisation and metrics ----------------------------------------------------------------


def normalize_answer(s: str) -> str:
    """Lower case, drop punctuation and the articles a/an/the, squeeze whitespace (SQuAD v1.1 script)."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1(prediction: str, gold: str) -> float:
    p, g = normalize_answer(prediction).split(), normalize_answer(gold).split()
    common = collections.Counter(p) & collections.Counter(g)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)


def _answers(item, index: int) -> list[tuple[str, int | None]]:
    """(text, character start) of each gold answer of one example, whatever form it was given in."""
    if isinstance(item, str):
        return [(item, None)]
    if isinstance(item, dict):
        return [(item["text"], item.get("answer_start"))]
    if hasattr(item, "text") and hasattr(item, "start"):  # ctxrep.data.squad.SquadAnswer
        return [(item.text, item.start)]
    if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str) and isinstance(item[1], int):
        return [(item[0], item[1])]
    if isinstance(item, (list, tuple)) and item:
        return [a for sub in item for a in _answers(sub, index)]
    raise ValueError(
        f"example {index}: cannot read the answer {item!r}; give (text, answer_start), "
        "{'text': ..., 'answer_start': ...}, a SquadAnswer, or a list of these"
    )


@dataclass(eq=False, repr=False)
class SpanExtractor(TaskEstimator):
    """Extract answers: X is a list of (question, context) pairs; y one answer (or list of answers) per pair,
    each (text, answer_start) / {"text", "answer_start"} / SquadAnswer. Training uses each example's first answer.

    doc_stride: how many context pieces (words when frozen) a window advances.
    max_answer_length: longest answer in pieces (words when frozen). max_query_length: question pieces kept.
    """

    doc_stride: int = 128
    max_answer_length: int = 30
    max_query_length: int = 64
    _: KW_ONLY
    max_epochs: int = 2  # TaskParams' field, with this estimator's default

    # ---- data -------------------------------------------------------------------------------------

    def _check_params(self) -> None:
        for name in ("doc_stride", "max_answer_length", "max_query_length"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")

    @staticmethod
    def _check_X(X) -> list[tuple[str, str]]:
        if isinstance(X, str):
            raise TypeError("X must be a list of (question, context) pairs, got a single string")
        X = list(X)
        for i, x in enumerate(X):
            if isinstance(x, str):
                raise ValueError(
                    f"example {i} is a single text; SpanExtractor needs (question, context) pairs: "
                    "give X as [(question, context), ...]"
                )
            if not (isinstance(x, (tuple, list)) and len(x) == 2 and all(isinstance(t, str) for t in x)):
                raise ValueError(f"example {i}: expected a (question, context) pair of strings")
            if not x[0].split() or not x[1].split():
                raise ValueError(f"example {i}: the question and the context must both contain words")
        return [(q, c) for q, c in X]

    def _check_X_y(self, X, y, fitting: bool):
        X = self._check_X(X)
        y = list(y)
        if len(y) != len(X):
            raise ValueError(f"X has {len(X)} examples but y has {len(y)} answers; give one answer per example")
        answers = [_answers(item, i) for i, item in enumerate(y)]
        for i, ((_, context), gold) in enumerate(zip(X, answers)):
            if not gold:
                raise ValueError(f"example {i} has no answer")
            text, start = gold[0]
            if fitting and (start is None or context[start : start + len(text)] != text):
                raise ValueError(
                    f"example {i}: the answer {text!r} is not at character {start} of the context; "
                    "training needs (text, answer_start) with context[answer_start:][:len(text)] == text"
                )
        return X, answers

    def _learn_targets(self, y) -> None:
        pass

    def _piece_records(self, X, y, call: Call) -> list[SpanWindow]:
        tok = call.tokenizer
        out = []
        for i, (question, context) in enumerate(X):
            q_ids = self._encode(question, tok)[0][: self.max_query_length]
            ids, offsets = self._encode(context, tok)
            room = call.max_length - len(q_ids) - tok.template.num_special(pair=True)
            if room < 1:
                raise ValueError(f"example {i}: the question leaves no room for the context; lower max_query_length")
            stride = min(self.doc_stride, room)
            answer = y[i][0] if y is not None else None
            starts = list(range(0, max(1, len(ids) - room + stride), stride)) if len(ids) > room else [0]
            for c0 in starts:
                c1 = min(c0 + room, len(ids))
                input_ids, types, offset = tok.build_inputs(q_ids, ids[c0:c1])
                first = offset + len(q_ids) + len(tok.template.middle)
                cls = tok.template.cls_index % len(input_ids)
                start = end = cls
                if answer is not None:
                    a0, a1 = answer[1], answer[1] + len(answer[0])
                    inside = [k for k in range(c0, c1) if offsets[k][1] > a0 and offsets[k][0] < a1]
                    if inside and offsets[inside[0]][0] <= a0 and offsets[inside[-1]][1] >= a1:
                        start, end = first + inside[0] - c0, first + inside[-1] - c0
                window = EncoderInput(i, input_ids, types, cls)
                out.append(SpanWindow(i, window, None, first, offsets[c0:c1], cls, start, end))
                if c1 == len(ids):
                    break
        return out

    def _encode(self, text: str, tok) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids of a text and each token's (start, end) characters; a word-level tokenizer's tokens are the
        whitespace words."""
        if tok.word_level:
            found = [(m.start(), m.end()) for m in re.finditer(r"\S+", text)]
            return tok.encode_words([[text[s:e] for s, e in found]])[0].ids, found
        enc = tok.backend.encode(text, add_special_tokens=False)
        return list(enc.ids), list(enc.offsets)

    def _feature_records(self, X, y, call: Call) -> list[SpanWindow]:
        """(question, context window) word pairs whose pieces fit the encoder: windows of whole context words."""
        tok = call.tokenizer
        questions, contexts, spans = [], [], []
        for question, context in X:
            questions.append(question.split())
            found = [(m.start(), m.end()) for m in re.finditer(r"\S+", context)]
            spans.append(found)
            contexts.append([context[s:e] for s, e in found])
        pair_q, pair_c, meta = [], [], []
        for i in range(len(X)):
            q = questions[i]
            q_pieces, c_pieces = tok.encode_words([q, contexts[i]])
            room = call.max_length - len(q_pieces.ids) - tok.template.num_special(pair=True)
            if room < 2:
                raise ValueError(f"example {i}: the question leaves no room for the context; shorten the question")
            for w0, w1 in window_words(c_pieces.spans(), room, min(self.doc_stride, room)):
                start = end = -1
                if y is not None and y[i][0][1] is not None:
                    a0, a1 = y[i][0][1], y[i][0][1] + len(y[i][0][0])
                    inside = [k for k, (s, e) in enumerate(spans[i]) if e > a0 and s < a1]  # the answer's words
                    if inside and w0 <= inside[0] and inside[-1] < w1:
                        start, end = len(q) + inside[0] - w0, len(q) + inside[-1] - w0
                pair_q.append(q)
                pair_c.append(contexts[i][w0:w1])
                meta.append((i, spans[i][w0:w1], start, end))
        store = call.features(pair_q, pair_c)
        out = []
        for k, (i, window_spans, start, end) in enumerate(meta):
            out.append(SpanWindow(i, None, store[k], len(pair_q[k]), window_spans, -1, start, end))
        return out

    def _collate(self, windows: list[SpanWindow], call: Call) -> dict[str, torch.Tensor]:
        batch = call.mode.units(windows, call)  # pieces or frozen features, padded to the longest row
        allowed = torch.zeros((len(windows), max(units_of(w) for w in windows)), dtype=torch.bool)
        for r, w in enumerate(windows):
            allowed[r, w.context_start : w.context_start + len(w.spans)] = True
            if w.cls_position >= 0:
                allowed[r, w.cls_position] = True
        batch["allowed"] = allowed
        batch["start"] = torch.tensor([w.start for w in windows])
        batch["end"] = torch.tensor([w.end for w in windows])
        return batch

    # ---- head -------------------------------------------------------------------------------------

    def _make_head(self, rep: Representation) -> nn.Module:
        return SpanHead(rep.out_dim)

    def _head_loss(self, logits: torch.Tensor, batch: dict) -> torch.Tensor:
        start, end = batch["start"], batch["end"]
        keep = start >= 0  # frozen windows without the answer carry no loss
        if not bool(keep.any()):
            return logits.sum() * 0.0
        loss_start = F.cross_entropy(logits[keep, :, 0], start[keep])
        loss_end = F.cross_entropy(logits[keep, :, 1], end[keep])
        return (loss_start + loss_end) / 2

    # ---- prediction -------------------------------------------------------------------------------

    def predict(self, X, *, device: str | torch.device | None = None, precision: str | None = None) -> list[str]:
        """The answer text of each (question, context) pair (a substring of the context); device / precision: for
        this call, see `using`."""
        return super().predict(X, device=device, precision=precision)

    def predict_offsets(
        self, X, *, device: str | torch.device | None = None, precision: str | None = None
    ) -> list[tuple[int, int]]:
        """Character (start, end) of each predicted answer in its context."""
        self._check_fitted()
        X = self._check_X(X)
        if not X:
            return []
        call = self._call()
        windows = self._examples(X, None, call)
        with self.using(device, precision):
            return self._offsets(X, windows, self._forward_all(windows, call))

    def _offsets(self, X, windows: list[SpanWindow], outputs: list) -> list[tuple[int, int]]:
        best: list[tuple[float, int, int]] = [(-np.inf, 0, 0)] * len(X)
        for w, logits in zip(windows, outputs):
            n = len(w.spans)
            if n == 0:
                continue
            s_logits = logits[w.context_start : w.context_start + n, 0]
            e_logits = logits[w.context_start : w.context_start + n, 1]
            scores = s_logits[:, None] + e_logits[None, :]  # (start, end)
            valid = torch.ones(n, n, dtype=torch.bool).triu().tril(self.max_answer_length - 1)
            scores = scores.masked_fill(~valid, -np.inf)
            flat = int(scores.argmax())
            s, e = divmod(flat, n)
            value = float(scores[s, e])
            if value > best[w.example][0]:
                best[w.example] = (value, w.spans[s][0], w.spans[e][1])
        return [_strip_space(context, s, e) for (_, context), (_, s, e) in zip(X, best)]

    def _decode(self, X, windows, outputs) -> list[str]:
        return [context[s:e] for (_, context), (s, e) in zip(X, self._offsets(X, windows, outputs))]

    def evaluate(self, X, y) -> dict:
        """{"exact_match", "f1"} in [0, 1], each prediction against its best gold answer (SQuAD v1.1)."""
        self._check_fitted()
        X, answers = self._check_X_y(X, y, fitting=False)
        return self._evaluate(answers, self._predict_checked(X) if X else [])

    @staticmethod
    def _evaluate(answers, predictions: list[str]) -> dict:
        em = [max(exact_match(p, g) for g, _ in gold) for p, gold in zip(predictions, answers)]
        f = [max(f1(p, g) for g, _ in gold) for p, gold in zip(predictions, answers)]
        return {"exact_match": float(np.mean(em)) if em else 0.0, "f1": float(np.mean(f)) if f else 0.0}

    def _score(self, X, answers, predictions) -> float:
        return self._evaluate(answers, predictions)["f1"]

    def score(self, X, y, *, device: str | torch.device | None = None, precision: str | None = None) -> float:
        """SQuAD token F1."""
        return super().score(X, y, device=device, precision=precision)


def _strip_space(text: str, start: int, end: int) -> tuple[int, int]:
    """Narrow (start, end) to exclude surrounding whitespace (byte-level BPE offsets include a word's space)."""
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


__all__ = ["SpanExtractor", "normalize_answer", "exact_match", "f1"]
