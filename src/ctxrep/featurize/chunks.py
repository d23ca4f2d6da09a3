"""Chunks of a text, one vector each (`Featurizer.embed_sentences(chunks=...)`).

    late_chunks(fz, texts, chunks)   the whole text encoded first (`embed_tokens`), each chunk the mean of its
                                     tokens' states (late chunking)
    plain_chunks(fz, texts, chunks)  each chunk's text cut out and embedded alone (Jina's "naive chunking")

chunks: "sentences" (`sentence_spans`), an int N (consecutive chunks of N tokens), or per text a list of (start, end)
character spans (a token belongs to the span its first character falls in).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ctxrep.text.inputs import Text, as_list, words_of
from ctxrep.util.arrays import normalize_rows

if TYPE_CHECKING:
    from ctxrep.featurize.featurizer import Featurizer

Chunks = str | int | Sequence[Sequence[tuple[int, int]]]
_SENTENCE_END = re.compile(r"[.!?]+(?=\s|$)")


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) character spans of the sentences of `text`: cut after ".", "!" or "?" (runs of them) followed
    by white space or the end; white space between sentences belongs to none."""
    spans, start = [], 0
    for m in _SENTENCE_END.finditer(text):
        spans.append((start, m.end()))
        start = m.end()
    spans.append((start, len(text)))
    out = []
    for a, b in spans:  # trim the white space around each, drop the empty ones
        while a < b and text[a].isspace():
            a += 1
        while b > a and text[b - 1].isspace():
            b -= 1
        if a < b:
            out.append((a, b))
    return out


def _token_range(starts: np.ndarray, span, text: int, chunk: int) -> tuple[int, int]:
    """The tokens whose first character lies in the character span [start, end), or an error naming the chunk."""
    try:
        start, end = (int(x) for x in span)
    except (TypeError, ValueError):
        raise ValueError(f"text {text}: chunk {chunk} must be a (start, end) character span, got {span!r}") from None
    a, b = int(np.searchsorted(starts, start)), int(np.searchsorted(starts, end))
    if not 0 <= start < end or a >= b:
        raise ValueError(f"text {text}: chunk {chunk} ({start}, {end}) holds no token; give spans that cover text")
    return a, b


def check_chunks(tokenizer, texts: list[Text], chunks: Chunks) -> dict[int, np.ndarray]:
    """Refuse a bad chunks= argument; each text's tokens' first characters where chunks go by characters."""
    if tokenizer.word_level:
        raise ValueError(
            "chunks= needs a subword tokenizer (chunks are cut by the tokens' characters), and this model reads "
            "whole words (ELMo): embed each chunk as a text of its own instead"
        )
    if isinstance(chunks, str) and chunks != "sentences":
        raise ValueError(f"chunks must be 'sentences', a number of tokens or per-text spans, got {chunks!r}")
    if isinstance(chunks, bool) or (isinstance(chunks, int) and chunks < 1):
        raise ValueError(f"chunks as a number of tokens must be at least 1, got {chunks!r}")
    per_text_spans = not isinstance(chunks, (str, int))
    if per_text_spans and len(chunks) != len(texts):
        raise ValueError(f"got {len(texts)} texts but chunk spans for {len(chunks)}; give one list of spans per text")
    by_characters = [i for i, t in enumerate(texts) if not isinstance(chunks, int)]
    for i in by_characters:
        if not isinstance(texts[i], str):
            raise ValueError(f"text {i}: chunks by characters (spans, sentences) need a string, not a word list")
    return dict(zip(by_characters, tokenizer.char_offsets([texts[i] for i in by_characters])))


def chunk_ranges(text: Text, i: int, chunks: Chunks, n_pieces: int, starts: np.ndarray | None):
    """Text i's chunks as (token ranges, character spans or None for N tokens) over its n_pieces tokens."""
    if isinstance(chunks, int):
        return [(k, min(k + chunks, n_pieces)) for k in range(0, n_pieces, chunks)], None
    spans = sentence_spans(text) if chunks == "sentences" else chunks[i]
    return [_token_range(starts, span, i, k) for k, span in enumerate(spans)], spans


def late_chunks(fz: Featurizer, texts: Sequence[Text], chunks: Chunks) -> list[np.ndarray]:
    """embed_sentences(texts, chunks=...): the chunks' token ranges, then the means of embed_tokens' states."""
    texts = as_list(texts)
    offsets = check_chunks(fz.tokenizer, texts, chunks)
    tokens = fz.embed_tokens(texts)
    before = len(fz.tokenizer.template.prefix)  # special tokens before the text's first piece
    after = len(fz.tokenizer.template.single_suffix)
    normalize = fz.normalize or (fz.model_pooling is not None and fz.model_pooling.normalize)
    out = []
    for i, (_, states) in enumerate(tokens):
        pieces = states[before : len(states) - after]  # (pieces, ...) the text's tokens, no special tokens
        if i in offsets and len(offsets[i]) != len(pieces):
            raise ValueError(
                f"text {i}: its {len(pieces)} tokens in windows differ from its {len(offsets[i])} tokens whole; "
                "chunk it by a number of tokens instead"
            )
        ranges, _ = chunk_ranges(texts[i], i, chunks, len(pieces), offsets.get(i))
        vectors = np.stack([pieces[a:b].mean(axis=0) for a, b in ranges])  # (chunks, ...)
        out.append(normalize_rows(vectors) if normalize else vectors)
    return out


def plain_chunks(
    fz: Featurizer,
    texts: Sequence[Text],
    chunks: Chunks,
    prompt: str | None,
    prompt_name: str | None,
    dimensions: int | None,
) -> list[np.ndarray]:
    """embed_sentences(texts, chunks=..., late_chunking=False): the same chunks cut out of each text, then all
    of them embedded alone in one embed_sentences call."""
    texts = as_list(texts)
    offsets = check_chunks(fz.tokenizer, texts, chunks)
    if not texts:
        return []
    word_ids: dict[int, np.ndarray] = {}  # N tokens of a word list: each piece's word
    if isinstance(chunks, int):  # N tokens: the tokens' characters (strings) or words (word lists)
        strings = [i for i, t in enumerate(texts) if isinstance(t, str)]
        offsets = dict(zip(strings, fz.tokenizer.char_offsets([texts[i] for i in strings])))
        lists = [i for i, t in enumerate(texts) if not isinstance(t, str)]
        encoded = fz.tokenizer.encode_words([words_of(texts[i], i) for i in lists])
        word_ids = {i: np.asarray(p.word_ids, np.int64) for i, p in zip(lists, encoded)}
    pieces: list[Text] = []
    counts = []
    for i, text in enumerate(texts):
        n = len(offsets[i]) if i in offsets else len(word_ids[i])
        ranges, spans = chunk_ranges(text, i, chunks, n, offsets.get(i))
        if spans is not None:
            cut = [text[int(a) : int(b)] for a, b in spans]
        elif i in offsets:
            bounds = [*offsets[i].tolist(), len(text)]
            cut = [text[bounds[a] : bounds[b]].strip() for a, b in ranges]
        else:  # a word goes with the chunk its first piece falls in
            firsts = np.searchsorted(word_ids[i], np.arange(len(text)))
            cut = [[text[w] for w in np.flatnonzero((firsts >= a) & (firsts < b))] for a, b in ranges]
        for k, chunk in enumerate(cut):
            if not (chunk.strip() if isinstance(chunk, str) else chunk):
                raise ValueError(
                    f"text {i}: chunk {k} of {chunks} tokens starts inside one word and holds none of its own; "
                    "give more tokens per chunk, or late_chunking=True"
                )
        pieces.extend(cut)
        counts.append(len(cut))
    vectors = fz.embed_sentences(pieces, prompt=prompt, prompt_name=prompt_name, dimensions=dimensions)
    return np.split(vectors, np.cumsum(counts)[:-1])
