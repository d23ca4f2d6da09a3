"""The featurizer's preprocess step: checked texts -> encoder rows (`text.inputs.Rows`), one builder per input kind.

    word_rows       word lists, alone or paired: word windows, and the words each row pools (word vectors)
    sentence_rows   texts for vectors that need no word alignment (the folder's pooling, cls, every token's state)
    token_id_rows   texts given as token ids (`Featurizer.embed_ids`)
    weighted_windows  the windows of a long text and one weight per position (which window answers for it)

A text that fits one window becomes its row with array operations (`Rows.single_texts`); the others are cut into
windows on word boundaries by the featurizer's `WindowPlan`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from ctxrep.text.inputs import Rows, Text, WindowPlan, split_windows, words_of
from ctxrep.text.tokenizer import WordPieces


@dataclass
class Alignment:
    """How one text was split: its words, its subword pieces, and each piece's word index."""

    words: list[str]
    tokens: list[str]
    word_ids: list[int | None]  # None: a bare word-start marker that no word's vector reads (pooling_spans)


@dataclass
class PreparedRows:
    """One chunk of a call, tokenized: its rows, its number of texts, and for word vectors each text's word count."""

    rows: Rows
    num_texts: int
    word_counts: np.ndarray | None = None
    cut: list[int] = field(default_factory=list)  # texts a window cuts (a word longer than a window)


def word_rows(tokenizer, plan: WindowPlan, words_a: list[list[str]], words_b: list[list[str]] | None) -> PreparedRows:
    """The rows of checked word lists (`words_of`), each text's alone or paired with words_b's, with the words
    each row pools and each text's word count: what word vectors (and pairs) need."""
    n = len(words_a)
    if tokenizer.word_level:
        tokenizer.reset()  # number only this call's words: memory stays bounded over a corpus
    if words_b is None:
        counts = np.fromiter(map(len, words_a), np.int64, count=n)
    else:
        counts = np.fromiter((len(a) + len(b) for a, b in zip(words_a, words_b)), np.int64, count=n)
    slots = np.cumsum(counts) - counts  # each text's first word in the call's output
    cut: list[int] = []
    if words_b is None and not tokenizer.word_level:
        rows, cut = single_text_word_rows(tokenizer, plan, words_a, slots)
    elif words_b is None:
        pieces = tokenizer.encode_words(words_a)
        windows = [w for i, p in enumerate(pieces) for w in plan.single(i, p)]
        rows = Rows.from_records(windows, word_slots=slots)
    else:
        pieces = tokenizer.encode_words(words_a + words_b)
        windows = [plan.pair(i, pieces[i], pieces[n + i]) for i in range(n)]
        rows = Rows.from_records(windows, word_slots=slots)
    rows.weights = np.ones(len(rows.ids), np.float32)  # a pair is one window; word pooling reads no weights
    return PreparedRows(rows, n, counts, cut)


def single_text_word_rows(
    tokenizer, plan: WindowPlan, words: list[list[str]], slots: np.ndarray
) -> tuple[Rows, list[int]]:
    """Rows and word spans of single texts: a text that fits one window (every word with a piece) straight from
    the tokenizer's flat arrays, the others (long texts, a word without pieces) through `WindowPlan.single`;
    and the texts a window cuts (`WindowPlan.cuts`)."""
    ids, word_ids, lengths = tokenizer.encode_words_flat(words)
    n = len(words)
    text_of = np.repeat(np.arange(n), lengths)  # (pieces,) each piece's text
    starts = np.cumsum(lengths) - lengths
    first_piece = np.ones(len(ids), bool)  # a word's first piece: the text's first, or a new word index
    first_piece[1:] = word_ids[1:] != word_ids[:-1]
    first_piece[starts[lengths > 0]] = True
    covered = np.bincount(text_of[first_piece], minlength=n)  # words with pieces, per text
    counts = np.fromiter(map(len, words), np.int64, count=n)
    fits = (covered == counts) & (lengths <= plan.window_size)
    parts, cut = [], []
    if fits.any():
        keep = fits[text_of]
        ids_k, word_ids_k, lengths_k = ids[keep], word_ids[keep], lengths[fits]
        texts = np.flatnonzero(fits)
        rows = Rows.single_texts(tokenizer.template, ids_k, lengths_k, texts)
        firsts = np.flatnonzero(first_piece[keep])  # (K,) every word's first piece, in the kept arrays
        ends = np.append(firsts[1:], len(ids_k))  # the next word's first piece (texts start with a word)
        row = np.repeat(np.arange(len(texts)), lengths_k)[firsts]  # (K,) each word's row
        # a bare word-start marker ("▁", "Ġ") before the word's other pieces is not pooled: WordPieces.pooling_spans'
        # rule, on whole arrays
        bare = np.isin(ids_k[firsts], tokenizer.word_start_ids) & (ends - firsts > 1)
        at = len(tokenizer.template.prefix) - (np.cumsum(lengths_k) - lengths_k)[row]  # piece -> position
        slot = slots[texts[row]] + word_ids_k[firsts]
        rows.words = np.stack([row, slot, firsts + bare + at, ends + at], axis=1)
        parts.append(rows)
    if not fits.all():
        rest = np.flatnonzero(~fits)
        pieces = tokenizer.encode_words([words[i] for i in rest])  # repairs a word without pieces
        windows = [w for i, p in zip(rest.tolist(), pieces) for w in plan.single(i, p)]  # the chunk's numbers
        parts.append(Rows.from_records(windows, word_slots=slots))
        cut = [int(rest[i]) for i, p in enumerate(pieces) if plan.cuts(p)]
    return (Rows.concat(parts) if len(parts) > 1 else parts[0]), cut


def sentence_rows(tokenizer, plan: WindowPlan, texts: list[Text], one_sequence: bool) -> PreparedRows:
    """The rows of checked texts for vectors that need no word alignment (the folder's pooling, the
    classification token, every token's state). A string that fits one window is tokenized whole, as
    sentence-transformers tokenizes it, and its row assembled with array operations; word lists, long
    texts (windows on word boundaries, `weighted_windows`) and ELMo go through the words."""
    n = len(texts)
    if tokenizer.word_level:
        strings = np.zeros(n, bool)
    else:
        strings = np.fromiter(map(isinstance, texts, itertools.repeat(str)), bool, count=n)
    fast, slow = np.flatnonzero(strings), np.flatnonzero(~strings)
    parts, cut = [], []
    if len(fast):
        ids, lengths = tokenizer.encode_texts(texts if len(fast) == n else [texts[i] for i in fast.tolist()])
        fits = (lengths > 0) & (lengths <= plan.window_size)
        keep = np.repeat(fits, lengths)
        rows = Rows.single_texts(tokenizer.template, ids[keep], lengths[fits], fast[fits])
        rows.weights = np.ones(len(rows.ids), np.float32)  # one window: every position counts once
        parts.append(rows)
        slow = np.union1d(slow, fast[~fits])  # long texts and those that give no ids whole, in order
    if len(slow):
        numbers = slow.tolist()
        pieces = tokenizer.encode_words([words_of(texts[i], i) for i in numbers])
        windows, weights, cut = weighted_windows(tokenizer, plan, pieces, one_sequence, numbers)
        parts.append(Rows.from_records(windows, weights))
    return PreparedRows(Rows.concat(parts) if len(parts) > 1 else parts[0], n, cut=cut)


def token_id_rows(tokenizer, plan: WindowPlan, ids: list) -> PreparedRows:
    """The rows of texts given as token ids (this tokenizer's, no special tokens), each checked: a sequence that
    fits one window as it is, a longer one in windows with every token as its own word."""
    seqs = [np.asarray(x, dtype=np.int64).reshape(-1) for x in ids]
    vocab = tokenizer.vocab_size
    for i, seq in enumerate(seqs):
        if not len(seq) or seq.min() < 0 or seq.max() >= vocab:
            raise ValueError(f"ids {i}: expected 1 or more token ids in 0..{vocab - 1}, got {seq[:8].tolist()}...")
    lengths = np.fromiter(map(len, seqs), np.int64, count=len(seqs))
    fits = lengths <= plan.window_size
    parts = []
    if fits.any():
        flat = np.concatenate([s for s, f in zip(seqs, fits) if f])
        rows = Rows.single_texts(tokenizer.template, flat, lengths[fits], np.flatnonzero(fits))
        rows.weights = np.ones(len(rows.ids), np.float32)
        parts.append(rows)
    if not fits.all():
        long = np.flatnonzero(~fits).tolist()
        pieces = [
            WordPieces(seqs[i].tolist(), list(range(len(seqs[i]))), [""] * len(seqs[i]), len(seqs[i])) for i in long
        ]
        windows, weights, _ = weighted_windows(tokenizer, plan, pieces, False, long)
        parts.append(Rows.from_records(windows, weights))
    return PreparedRows(Rows.concat(parts) if len(parts) > 1 else parts[0], len(seqs))


def weighted_windows(
    tokenizer, plan: WindowPlan, texts_pieces: list[WordPieces], one_sequence: bool, numbers: list[int]
):
    """The windows of tokenized texts (as `word_rows` cuts them) and one weight per position of each window: 1 for
    a piece of a word the window owns, 0 for the other pieces (another window answers for them); a special token
    weighs 1 / (the text's number of windows), or with `one_sequence` 1 in the first window's leading and the last
    window's trailing specials, else 0 (the text's tokens as one long sequence). One window: every position weighs
    1. `numbers`: each text's number (the windows' .text); also the text numbers a window cuts (`WindowPlan.cuts`)."""
    offset = tokenizer.build_inputs([])[2]  # special tokens before the text's first piece
    windows, weights, cut = [], [], []
    for i, pieces in zip(numbers, texts_pieces):
        rows = plan.single(i, pieces)
        if len(rows) > 1 and plan.cuts(pieces):
            cut.append(i)
        if len(rows) == 1:  # one window (the common case): every position weighs 1, no second cut needed
            windows.append(rows[0])
            weights.append(np.ones(len(rows[0]), dtype=np.float32))
            continue
        spans = pieces.spans()
        # the same cut, with its piece ranges: split_windows is what plan.single windows by
        cuts = split_windows(spans, plan.window_size, plan.stride)
        assert len(cuts) == len(rows)
        for k, (row, (p0, p1, owned)) in enumerate(zip(rows, cuts)):
            if one_sequence:
                w = np.zeros(len(row), dtype=np.float32)
                w[: offset if k == 0 else 0] = 1.0
                if k == len(rows) - 1:
                    w[offset + p1 - p0 :] = 1.0
            else:
                w = np.full(len(row), 1.0 / len(rows), dtype=np.float32)  # (seq,) special tokens: shared
            w[offset : offset + p1 - p0] = 0.0
            for word in owned:
                s, e = spans[word]
                w[offset + s - p0 : offset + min(e, p1) - p0] = 1.0
            windows.append(row)
            weights.append(w)
    return windows, weights, cut
