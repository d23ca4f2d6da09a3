"""The featurizer's postprocess step: what one call collects from the encoder's batches, chosen from explicit tables.

WORD_POOLERS      pooling= name -> how a word's pieces become one vector (first, last, mean, first_last)
SENTENCE_POOLERS  sentence_pooling= name -> how a text becomes one vector (mean of words, cls, the folder's own,
                  the last token)
readouts          WordVectors, ClassTokens, FolderPooled, TokenStateRows: one call's accumulator each; `consume`
                  takes one batch's (layers, batch, seq, hidden) states, `result()` gives the chunk's answer and
                  `join` puts a call's chunks together in order
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch

from ctxrep.models.sentence_transformers import SentencePooling, TokenPooler, prompt_positions, read_sentence_pooling
from ctxrep.util.arrays import normalize_rows

if TYPE_CHECKING:
    from ctxrep.featurize.featurizer import Featurizer
    from ctxrep.featurize.rows import PreparedRows


# ---- words: a word's pieces -> one vector ------------------------------------------------------------------------


class WordPooler:
    """How a word's subword pieces become one vector; `width`: the vector's width in hidden sizes."""

    width = 1

    def pool(self, flat: torch.Tensor, firsts: np.ndarray, lasts: np.ndarray) -> np.ndarray:
        """flat: (batch * seq, layers, hidden) states; firsts / lasts: (words,) each word's first and last piece's
        row in `flat` -> (words, layers, width x hidden)."""
        raise NotImplementedError


class FirstPiece(WordPooler):
    def pool(self, flat, firsts, lasts):
        return flat[firsts].numpy()


class LastPiece(WordPooler):
    def pool(self, flat, firsts, lasts):
        return flat[lasts].numpy()


class FirstAndLastPiece(WordPooler):
    """The first and the last piece concatenated."""

    width = 2

    def pool(self, flat, firsts, lasts):
        return torch.cat([flat[firsts], flat[lasts]], dim=-1).numpy()


class MeanOfPieces(WordPooler):
    def pool(self, flat, firsts, lasts):
        # a word's pieces are consecutive rows once gathered: one reduceat sums each word's run
        counts = lasts - firsts + 1  # (K,)
        runs = np.cumsum(counts) - counts  # each word's first row in the gathered pieces
        pieces = np.arange(counts.sum()) - np.repeat(runs, counts) + np.repeat(firsts, counts)  # rows in `flat`
        sums = np.add.reduceat(flat.numpy()[pieces], runs, axis=0)  # (K, layers, hidden)
        return sums / counts[:, None, None].astype(np.float32)


WORD_POOLERS: dict[str, WordPooler] = {
    "first": FirstPiece(),
    "last": LastPiece(),
    "mean": MeanOfPieces(),
    "first_last": FirstAndLastPiece(),
}
POOLINGS = tuple(WORD_POOLERS)


# ---- readouts: one call's accumulators ---------------------------------------------------------------------------


class TokenStates(NamedTuple):
    """One text's tokens and their hidden states (`Featurizer.embed_tokens`)."""

    ids: np.ndarray  # (n_tokens,) int64, special tokens included
    states: np.ndarray  # (n_tokens, hidden) float32, or (n_tokens, n_layers, hidden)


class Readout:
    """What one call collects from its batches. `needs_words`: the texts are split into words and run in word
    windows (every word gets a vector); otherwise a string that fits one window is tokenized whole.
    `one_sequence`: a long text's special tokens count as one sequence's (`rows.weighted_windows`)."""

    needs_words = False
    one_sequence = False

    def __init__(self, fz: Featurizer, prepared: PreparedRows, left_out: str = "") -> None:
        self.fz, self.prepared = fz, prepared
        self.n_layers = 1 if fz.single_layer else len(fz.layer_indices)

    def consume(self, selected: torch.Tensor, batch_rows: np.ndarray, weights: np.ndarray | None) -> None:
        raise NotImplementedError

    def result(self):
        raise NotImplementedError

    @classmethod
    def empty(cls, fz: Featurizer):
        """The result of a call with no text: (0, layers, hidden) float32 (0 texts of the pooled vectors)."""
        layers = 1 if fz.single_layer else len(fz.layer_indices)
        return np.zeros((0, layers, fz.model.hidden_size), dtype=np.float32)

    @staticmethod
    def join(results: list):
        """The chunks' results of one call, in order: one array of texts."""
        return results[0] if len(results) == 1 else np.concatenate(results)


class WordVectors(Readout):
    """Every word's vector, pooled into one preallocated array of the chunk (a view per text)."""

    needs_words = True

    def __init__(self, fz, prepared, left_out=""):
        super().__init__(fz, prepared)
        self.counts = prepared.word_counts
        self.out = np.zeros((int(self.counts.sum()), self.n_layers, fz.dim), dtype=np.float32)  # every word
        self.pooler = WORD_POOLERS[fz.pooling]

    def consume(self, selected, batch_rows, weights):
        n_layers, b, t, h = selected.shape
        position, slot, first, end = self.prepared.rows.batch_words(batch_rows)  # one entry per word
        if not len(slot):
            return
        flat = selected.permute(1, 2, 0, 3).reshape(b * t, n_layers, h)  # (batch*seq, layers, hidden)
        firsts, lasts = position * t + first, position * t + end - 1  # rows of each word's first and last piece
        self.out[slot] = self.pooler.pool(flat, firsts, lasts)

    def result(self):
        return np.split(self.out, np.cumsum(self.counts)[:-1])  # one view per text

    @staticmethod
    def join(results):
        return [w for chunk in results for w in chunk]

    @classmethod
    def empty(cls, fz):
        return []


class ClassTokens(Readout):
    """Each text's classification token (for a text in several windows, the mean over its windows)."""

    def __init__(self, fz, prepared, left_out=""):
        super().__init__(fz, prepared)
        self.sums = np.zeros((prepared.num_texts, self.n_layers, fz.model.hidden_size), dtype=np.float32)
        self.counts = np.zeros(prepared.num_texts, dtype=np.int64)

    def consume(self, selected, batch_rows, weights):
        rows = self.prepared.rows
        at_cls = selected[:, torch.arange(len(batch_rows)), torch.from_numpy(rows.cls_position[batch_rows])]
        np.add.at(self.sums, rows.text[batch_rows], at_cls.transpose(0, 1).numpy())  # (batch, layers, hidden)
        np.add.at(self.counts, rows.text[batch_rows], 1)

    def result(self):
        return (self.sums / self.counts[:, None, None]).astype(
            np.float32
        )  # float32 as every vector (not int's float64)


class FolderPooled(Readout):
    """The folder's own pooling (`TokenPooler`) over every token's weighted state. `left_out`: a prompt whose
    positions (with the leading special tokens) weigh 0 in each text's first row (include_prompt false)."""

    def __init__(self, fz, prepared, left_out=""):
        super().__init__(fz, prepared)
        rows = prepared.rows
        self.pooler = TokenPooler(fz.model_pooling, prepared.num_texts, self.n_layers, fz.model.hidden_size)
        if left_out:  # rows are made in each text's window order: its first row holds the prompt
            skip, starts = prompt_positions(fz.tokenizer, left_out), rows.starts
            for first in np.unique(rows.text, return_index=True)[1]:
                rows.weights[starts[first] : starts[first] + min(skip, rows.lengths[first])] = 0.0

    def consume(self, selected, batch_rows, weights):
        rows = self.prepared.rows
        # row numbers: last-token pooling reads a text's last window
        self.pooler.add(selected, rows.text[batch_rows], weights, rows.cls_position[batch_rows], batch_rows)

    def result(self):
        return self.pooler.result()  # (texts, layers, width)


class TokenStateRows(Readout):
    """Every token's state per text (`TokenStates`): a long text as one sequence, each piece from the window
    that owns its word, the first window's leading and the last window's trailing special tokens."""

    one_sequence = True

    @classmethod
    def empty(cls, fz):
        return []

    def __init__(self, fz, prepared, left_out=""):
        super().__init__(fz, prepared)
        self.parts: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(prepared.rows)  # (ids, states) per row

    def consume(self, selected, batch_rows, weights):
        rows, single = self.prepared.rows, self.fz.single_layer
        states = selected.transpose(0, 1).transpose(1, 2).numpy()  # (batch, seq, layers, hidden)
        for r, row in enumerate(batch_rows):
            keep = np.flatnonzero(weights[r] > 0)
            ids = rows.ids[rows.starts[row] : rows.starts[row] + rows.lengths[row]][keep]
            kept = states[r, keep]
            self.parts[row] = (ids, kept[:, 0] if single else kept)

    def result(self):
        parts = self.parts
        per_text: list[list[int]] = [[] for _ in range(self.prepared.num_texts)]
        for row, t in enumerate(self.prepared.rows.text.tolist()):  # rows are made in each text's window order
            per_text[t].append(row)
        return [
            TokenStates(*parts[r[0]]) if len(r) == 1 else TokenStates(*map(np.concatenate, zip(*(parts[k] for k in r))))
            for r in per_text
        ]

    join = WordVectors.join


# ---- sentences: a text -> one vector -----------------------------------------------------------------------------


class SentencePooler:
    """How a text becomes one vector (sentence_pooling=): the readout that runs over its rows, the vector's width,
    and whether token ids alone (`embed_ids`: no words) can be pooled so."""

    readout: type[Readout]
    pools_token_ids = True

    def check(self, fz: Featurizer) -> None:
        """Refuse a model this pooling cannot read (at construction)."""

    def folder_pooling(self, fz: Featurizer) -> SentencePooling | None:
        """The token pooling (`models.sentence_transformers`) this pooler applies through `FolderPooled` (the folder's
        declared one, or one of its own), or None."""
        return None

    def width(self, fz: Featurizer) -> int:
        raise NotImplementedError

    def left_out(self, fz: Featurizer, prompt: str) -> str:
        """The prompt whose positions the pooling leaves out ("" none)."""
        return ""

    def finish(self, fz: Featurizer, out) -> np.ndarray:
        """The readout's result -> (texts, layers, width)."""
        return out


class MeanOfWords(SentencePooler):
    """The mean of the text's word vectors."""

    readout = WordVectors
    pools_token_ids = False

    def width(self, fz):
        return fz.dim

    def finish(self, fz, out):
        if not out:
            return np.zeros((0, 1 if fz.single_layer else len(fz.layer_indices), fz.dim), np.float32)
        return np.stack([w.mean(axis=0) for w in out])


class ClassToken(SentencePooler):
    """The classification token."""

    readout = ClassTokens

    def check(self, fz):
        if fz.model.word_level:
            raise ValueError(f"{fz.model.family} has no classification token: use sentence_pooling='mean'")

    def width(self, fz):
        return fz.model.hidden_size


class FolderPooling(SentencePooler):
    """What a sentence-transformers folder's modules.json says (its Pooling config, then Normalize)."""

    readout = FolderPooled

    def folder_pooling(self, fz):
        return read_sentence_pooling(fz.source.folder)  # read (or refused) once, at construction

    def width(self, fz):
        return fz.model_pooling.width

    def left_out(self, fz, prompt):
        return prompt if fz.model_pooling is not None and not fz.model_pooling.include_prompt else ""


class LastToken(FolderPooling):
    """The text's last token (special tokens included: a decoder's appended end-of-text token where its tokenizer
    adds one), from its last window: what a causal decoder's embedding reads, since only its last token has seen the
    whole text (Qwen3-Embedding, e5-mistral; sentence-transformers' Pooling pooling_mode_lasttoken)."""

    def folder_pooling(self, fz):
        return SentencePooling(("lasttoken",), normalize=False, dim=fz.model.hidden_size)

    def left_out(self, fz, prompt):
        return ""


SENTENCE_POOLERS: dict[str, SentencePooler] = {
    "mean": MeanOfWords(),
    "cls": ClassToken(),
    "model": FolderPooling(),
    "lasttoken": LastToken(),
}


def pool_rows(fz: Featurizer, prepared: PreparedRows, readout: type[Readout], left_out: str = ""):
    """Run one chunk's rows through the encoder and collect them with `readout`."""
    collector = readout(fz, prepared, left_out)
    fz.run_rows(prepared.rows, collector.consume)
    return collector.result()


def truncated(out: np.ndarray, dimensions: int) -> np.ndarray:
    """The first `dimensions` coordinates of each sentence vector, then L2-normalised (Matryoshka)."""
    if isinstance(dimensions, bool) or not isinstance(dimensions, (int, np.integer)) or dimensions < 1:
        raise ValueError(f"dimensions must be a positive integer, got {dimensions!r}")
    if dimensions > out.shape[-1]:
        raise ValueError(
            f"dimensions={dimensions} is more than this model's {out.shape[-1]}-wide sentence vectors; "
            f"give at most {out.shape[-1]}"
        )
    return normalize_rows(out[..., :dimensions])  # truncate, then unit length again
