"""The one input layer between texts and an encoder: words, windows, records, padding, batches.

The featurizer, the estimators and the attention tool all build their encoder inputs here:

  words_of(text, i)            a text (string: split on whitespace; list: taken as given) -> its words, or an
                               error naming text i
  WindowPlan(tokenizer, max_length, stride)
      .single(text, pieces)    -> EncoderInput records: a text cut into windows on word boundaries; every word
                               is owned by the window where it has the most context on its poorer side
      .pair(text, a, b)        -> one EncoderInput ([CLS] A [SEP] B [SEP]) or an error if it does not fit
      .truncated(a, b)         -> one EncoderInput cut to fit (longer text first), for sequence classification
  collate(records, tokenizer)  -> input_ids, token_type_ids, attention_mask (batch, longest), and char_ids for a
                               word-level tokenizer (ELMo): what `Encoder.encode` reads
  Rows                         the same rows as flat arrays (every row's ids end to end): built once per call
                               (`from_records`, or `single_texts` straight from token ids), then `collate(rows)`
                               pads any subset of them with whole-array operations, no Python loop per row
  token_budget_batches(lengths, budget)  batch sizes over length-sorted records: rows x longest <= budget
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

Text = str | Sequence[str]


@dataclass
class EncoderInput:
    """One encoder input row: a window of one text (or a whole pair) and the words it is responsible for.

    words: (word index in the text's output, first piece position, last piece position + 1), positions within
    input_ids; cls_position: where the classification token sits (0, or the last position for XLNet/GPT-2/ELMo).
    """

    text: int
    input_ids: list[int]
    token_type_ids: list[int]
    cls_position: int
    words: list[tuple[int, int, int]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.input_ids)


def words_of(text: Text, index: int) -> list[str]:
    """The words of one text; errors name the text (and word) index."""
    if isinstance(text, str):
        words = text.split()
    elif isinstance(text, Sequence):
        words = list(text)
        try:
            every_word_has_text = all(map(str.strip, words))  # one C loop: a non-string word raises TypeError
        except TypeError:
            raise TypeError(
                f"text {index}: expected a string or a list of word strings, got a list holding "
                f"{type(next(w for w in words if not isinstance(w, str))).__name__}"
            ) from None
        if not every_word_has_text:
            j = next(j for j, w in enumerate(words) if not w.strip())
            raise ValueError(f"text {index}: word {j} is empty or whitespace; remove it from the word list")
    else:
        raise TypeError(f"text {index}: expected a string or a list of word strings, got {type(text).__name__}")
    if not words:
        raise ValueError(f"text {index} is empty (no words); remove it or give it some text")
    return words


def check_text(text: Text, index: int) -> None:
    """Refuse what `words_of` refuses, without splitting a string (a string only has to hold a word)."""
    if isinstance(text, str):
        if not text or text.isspace():
            raise ValueError(f"text {index} is empty (no words); remove it or give it some text")
    else:
        words_of(text, index)


def check_texts(texts: Sequence[Text]) -> None:
    """`check_text` of every text, in one pass over the strings (a call per text only for word lists and
    empty or blank strings, which it then refuses by index)."""
    for i in [i for i, t in enumerate(texts) if not isinstance(t, str) or not t or t.isspace()]:
        check_text(texts[i], i)


def as_list(texts) -> list:
    if isinstance(texts, str):
        raise TypeError("expected a list of texts, got a single string; wrap it in a list: [text]")
    return list(texts)


class WindowPlan:
    """How texts become windows for one tokenizer and window limit (max_length pieces, special tokens included)."""

    def __init__(self, tokenizer, max_length: int, stride: int | None = None) -> None:
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.window_size = max_length - tokenizer.template.num_special(pair=False)
        if self.window_size < 2:
            raise ValueError(f"max_length={max_length} leaves no room for text between the special tokens")
        self.stride = stride if stride is not None else max(1, self.window_size // 2)
        if not 1 <= self.stride <= self.window_size:
            raise ValueError(f"stride must be between 1 and the window size {self.window_size}, got {stride}")

    def cls_position(self, length: int) -> int:
        return self.tokenizer.template.cls_index % length

    def single(self, text: int, pieces) -> list[EncoderInput]:
        """Windows of at most window_size pieces, starting on word boundaries, about `stride` pieces apart. A
        word longer than a whole window is pooled from its first window_size pieces (with a warning)."""
        import warnings

        spans = pieces.spans()
        if not spans or spans[-1][1] <= self.window_size:  # the common case: the text is one window
            ids, types, offset = self.tokenizer.build_inputs(pieces.ids)
            words = [(w, offset + s, offset + e) for w, (s, e) in enumerate(pieces.pooling_spans())]
            return [EncoderInput(text, ids, types, self.cls_position(len(ids)), words)]
        for w, (s, e) in enumerate(spans):
            if e - s > self.window_size:
                warnings.warn(
                    f"text {text}: word {w} has {e - s} subword pieces, more than a window ({self.window_size}); "
                    f"its vector is pooled from the first {self.window_size} pieces",
                    stacklevel=3,
                )
        pool = pieces.pooling_spans()
        windows = []
        for p0, p1, owned in split_windows(spans, self.window_size, self.stride):
            ids, types, offset = self.tokenizer.build_inputs(pieces.ids[p0:p1])
            words = [(w, offset + pool[w][0] - p0, offset + min(pool[w][1], p1) - p0) for w in owned]
            windows.append(EncoderInput(text, ids, types, self.cls_position(len(ids)), words))
        return windows

    def cuts(self, pieces) -> bool:
        """Whether `single` cuts this text: a word longer than a whole window keeps only its first window_size
        pieces. Windows themselves cut nothing (every piece is in a window)."""
        return any(e - s > self.window_size for s, e in pieces.spans())

    def pair(self, text: int, a, b) -> EncoderInput:
        """[CLS] A [SEP] B [SEP] as one window (A's words, then B's); pairs are not windowed."""
        ids, types, offset = self.tokenizer.build_inputs(a.ids, b.ids)
        if len(ids) > self.max_length:
            raise ValueError(
                f"pair {text} is {len(ids)} tokens long, more than the model's {self.max_length}; sentence pairs are "
                "not windowed: shorten the texts or embed them separately"
            )
        offset_b = offset + len(a.ids) + len(self.tokenizer.template.middle)
        words = [(w, offset + s, offset + e) for w, (s, e) in enumerate(a.pooling_spans())]
        words += [(a.num_words + w, offset_b + s, offset_b + e) for w, (s, e) in enumerate(b.pooling_spans())]
        return EncoderInput(text, ids, types, self.cls_position(len(ids)), words)

    def truncated(self, text: int, a, b=None) -> EncoderInput:
        """One window cut to fit: a single text keeps its first pieces; a pair loses pieces from the end of the
        longer text first, one at a time (transformers' "longest_first"). No word spans."""
        room = self.max_length - self.tokenizer.template.num_special(pair=b is not None)
        if room < 2:
            raise ValueError(f"max_length={self.max_length} leaves no room for text between the special tokens")
        ids_a, ids_b = list(a.ids), (list(b.ids) if b is not None else None)
        if ids_b is None:
            ids_a = ids_a[:room]
        else:
            while len(ids_a) + len(ids_b) > room:
                (ids_a if len(ids_a) >= len(ids_b) else ids_b).pop()
        ids, types, _ = self.tokenizer.build_inputs(ids_a, ids_b)
        return EncoderInput(text, ids, types, self.cls_position(len(ids)))


def collate(records: Sequence, tokenizer) -> dict[str, torch.Tensor]:
    """Right-pad records with .input_ids and .token_type_ids: input_ids, token_type_ids, attention_mask
    (batch, longest); for a word-level tokenizer (ELMo) also char_ids (batch, longest, max_characters)."""
    return Rows.from_records(records).collate(np.arange(len(records)), tokenizer)[0]


@dataclass
class Rows:
    """Encoder rows (windows or whole texts) as flat arrays: row r's ids are ids[starts[r] : starts[r] + lengths[r]].

    weights: one per position, end to end like ids (sentence_pooling="model": 0 for a position another window
    answers for), or None. words: the words each row pools, (K, 4) int64 sorted by row: the row, the word's slot in
    the call's output, its first piece's position in the row, its last piece's position + 1; or None."""

    ids: np.ndarray  # (positions,) int64
    types: np.ndarray  # (positions,) int64
    lengths: np.ndarray  # (rows,) int64
    text: np.ndarray  # (rows,) the text each row belongs to
    cls_position: np.ndarray  # (rows,)
    weights: np.ndarray | None = None  # (positions,) float32
    words: np.ndarray | None = None  # (K, 4) int64: row, slot, first, end

    def __len__(self) -> int:
        return len(self.lengths)

    @functools.cached_property
    def starts(self) -> np.ndarray:
        """(rows,) each row's first position in ids; computed once (collate reads it for every batch)."""
        return np.cumsum(self.lengths) - self.lengths

    @classmethod
    def from_records(
        cls, records: Sequence, weights: Sequence[np.ndarray] | None = None, word_slots: np.ndarray | None = None
    ) -> Rows:
        """The rows of EncoderInput-like records (.input_ids, .token_type_ids, .text, .cls_position); with
        `word_slots` (the output slot of each text's first word) also their .words, word w of text t in slot
        word_slots[t] + w."""
        lengths = np.fromiter(map(len, (r.input_ids for r in records)), np.int64, count=len(records))
        total = int(lengths.sum())
        ids = np.fromiter(itertools.chain.from_iterable(r.input_ids for r in records), np.int64, count=total)
        types = np.fromiter(itertools.chain.from_iterable(r.token_type_ids for r in records), np.int64, count=total)
        text = np.fromiter((r.text for r in records), np.int64, count=len(records))
        cls_position = np.fromiter((r.cls_position for r in records), np.int64, count=len(records))
        flat_weights = np.concatenate(weights).astype(np.float32) if weights is not None and len(weights) else None
        words = None
        if word_slots is not None:
            spans = [(r, word_slots[rec.text] + w, s, e) for r, rec in enumerate(records) for w, s, e in rec.words]
            words = np.array(spans, np.int64).reshape(-1, 4)
        return cls(ids, types, lengths, text, cls_position, flat_weights, words)

    @classmethod
    def single_texts(cls, template, ids: np.ndarray, lengths: np.ndarray, text: np.ndarray) -> Rows:
        """One row per text from its pieces (no special tokens; `ids` end to end, `lengths` per text): the
        template's special tokens added around each, as `SpecialTemplate.build_inputs` adds them."""
        prefix, suffix = np.asarray(template.prefix, np.int64), np.asarray(template.single_suffix, np.int64)
        row_lengths = lengths + len(prefix) + len(suffix)
        n, total = len(lengths), int(row_lengths.sum())
        starts = np.cumsum(row_lengths) - row_lengths
        out_ids = np.empty(total, np.int64)
        out_types = np.full(total, template.type_a, np.int64)
        inside = np.ones(total, bool)  # positions that hold the text's pieces
        for k in range(len(prefix)):
            out_ids[starts + k] = prefix[k]
            out_types[starts + k] = template.prefix_types[k]
            inside[starts + k] = False
        ends = starts + row_lengths
        for k in range(len(suffix)):
            at = ends - len(suffix) + k
            out_ids[at] = suffix[k]
            out_types[at] = template.single_suffix_types[k]
            inside[at] = False
        out_ids[inside] = ids
        cls_position = np.full(n, 0, np.int64) if template.cls_index == 0 else row_lengths + template.cls_index
        return cls(out_ids, out_types, row_lengths, np.asarray(text, np.int64), cls_position)

    @classmethod
    def concat(cls, parts: Sequence[Rows]) -> Rows:
        """The rows of `parts`, one after another; weights and words where every part has them."""
        weights = [p.weights for p in parts]
        words = None
        if all(p.words is not None for p in parts):
            first_rows = np.cumsum([0] + [len(p) for p in parts[:-1]])
            words = np.concatenate([p.words + np.array([r0, 0, 0, 0]) for p, r0 in zip(parts, first_rows)])
        return cls(
            np.concatenate([p.ids for p in parts]),
            np.concatenate([p.types for p in parts]),
            np.concatenate([p.lengths for p in parts]),
            np.concatenate([p.text for p in parts]),
            np.concatenate([p.cls_position for p in parts]),
            None if any(w is None for w in weights) else np.concatenate(weights),
            words,
        )

    def batch_words(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The words of the rows `rows` (a batch, in its order): each word's row in the batch, its output slot, its
        first piece's position and its last piece's position + 1 (arrays of one entry per word)."""
        counts = np.bincount(self.words[:, 0], minlength=len(self))[rows]  # (batch,) words per row
        first = np.searchsorted(self.words[:, 0], rows)  # each row's first entry in the table
        entries = np.repeat(first - (np.cumsum(counts) - counts), counts) + np.arange(counts.sum())
        table = self.words[entries]
        return np.repeat(np.arange(len(rows)), counts), table[:, 1], table[:, 2], table[:, 3]

    def collate(self, rows: np.ndarray, tokenizer) -> tuple[dict[str, torch.Tensor], np.ndarray | None]:
        """The rows `rows` (indices, in batch order) right-padded, as `collate` gives them, and their weights
        (batch, longest) with 0 at padding (None without weights)."""
        lengths = self.lengths[rows]  # (batch,)
        longest = int(lengths.max())
        positions = np.repeat(self.starts[rows] - (np.cumsum(lengths) - lengths), lengths) + np.arange(lengths.sum())
        mask = np.arange(longest)[None, :] < lengths[:, None]  # (batch, longest); row-major order = ids' order
        input_ids = np.full(mask.shape, tokenizer.pad_token_id, np.int64)
        input_ids[mask] = self.ids[positions]
        token_type_ids = np.zeros(mask.shape, np.int64)
        token_type_ids[mask] = self.types[positions]
        batch = {
            "input_ids": torch.from_numpy(input_ids),
            "token_type_ids": torch.from_numpy(token_type_ids),
            "attention_mask": torch.from_numpy(mask.astype(np.int64)),
        }
        if tokenizer.word_level:  # each id is a word the tokenizer has numbered; look up its characters
            batch["char_ids"] = tokenizer.char_table()[batch["input_ids"]]
        weights = None
        if self.weights is not None:
            weights = np.zeros(mask.shape, np.float32)
            weights[mask] = self.weights[positions]
        return batch, weights


def window_words(spans: list[tuple[int, int]], window: int, stride: int) -> list[tuple[int, int]]:
    """(first word, last word + 1) of each window: as many whole words as fit in `window` pieces; the next
    window starts at the first word at least `stride` pieces further on (never past the previous window's end,
    so no word is left out), until a window reaches the last word."""
    out = []
    first = 0
    while True:
        end = first + 1
        while end < len(spans) and spans[end][1] - spans[first][0] <= window:
            end += 1
        out.append((first, end))
        if end == len(spans):
            return out
        nxt = first + 1
        while nxt < end and spans[nxt][0] < spans[first][0] + stride:
            nxt += 1
        first = nxt


def split_windows(spans: list[tuple[int, int]], size: int, stride: int) -> list[tuple[int, int, list[int]]]:
    """(first piece, last piece + 1, the words it owns) of each window over one text (see window_words). Each word
    is owned by the window where min(left context, right context) is largest. A word longer than a whole window
    is cut to the window's `size` pieces."""
    bounds = [
        (w0, w1, spans[w0][0], min(spans[w1 - 1][1], spans[w0][0] + size))
        for w0, w1 in window_words(spans, size, stride)
    ]
    owner, best = [-1] * len(spans), [-1] * len(spans)
    for k, (w0, w1, p0, p1) in enumerate(bounds):
        for w in range(w0, w1):
            context = min(spans[w][0] - p0, p1 - spans[w][1])
            if context > best[w]:
                best[w], owner[w] = context, k
    return [(p0, p1, [w for w in range(w0, w1) if owner[w] == k]) for k, (w0, w1, p0, p1) in enumerate(bounds)]


def token_budget_batches(lengths: Sequence[int], budget: int) -> list[int]:
    """Sizes of consecutive batches over length-sorted sequences so that size x longest <= budget (a sequence longer
    than the budget is a batch alone). Ascending lengths (every caller's) take one array search per batch, no Python
    step per sequence; other orders the same greedy cut one sequence at a time."""
    lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
    if np.all(lengths[1:] >= lengths[:-1]):
        return _ascending_batches(lengths, budget)
    sizes, size, longest = [], 0, 0
    for n in lengths.tolist():
        if size and max(longest, n) * (size + 1) > budget:
            sizes.append(size)
            size, longest = 0, 0
        size += 1
        longest = max(longest, n)
    if size:
        sizes.append(size)
    return sizes


def _ascending_batches(lengths: np.ndarray, budget: int) -> list[int]:
    """token_budget_batches over ascending lengths: a batch from row i holds the rows k of i, i+1, ... while
    (k - i + 1) x lengths[k] <= budget (the last row is the longest): a prefix of the rows from i, at most
    budget // lengths[i] of them."""
    sizes, start = [], 0
    while start < len(lengths):
        shortest = int(lengths[start])
        room = max(1, budget // shortest) if shortest else len(lengths)  # no batch from here holds more rows
        window = lengths[start : start + room]
        fits = np.arange(1, len(window) + 1) * window <= budget  # True, then False
        size = max(1, int(fits.sum()))
        sizes.append(size)
        start += size
    return sizes
