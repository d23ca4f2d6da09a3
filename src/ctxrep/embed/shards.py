"""One shard of an embedding run: embed a group of records and write it (`write_shard`), with the texts a window
cut (`with_cut`, `cut_summary`); `vector_row_shape`, the shape of one of its rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ctxrep.embed.codes import OutputCodes
from ctxrep.embed.records import Record
from ctxrep.vectors.store import write_arrays


def embed_shard(
    fz, records: list[Record], first_text: int, level: str, options: dict | None = None
) -> tuple[np.ndarray, list[tuple]]:
    """The vectors of `records` and one index entry (text, line, word position, word) per vector row. `options`:
    keyword arguments of embed_sentences (dimensions, prompt, prompt_name, chunks, late_chunking;
    `EmbedJob.sentence_options`); with chunks, a row per chunk, its number in the text in the word column."""
    words = [r.words for r in records]
    if level == "word":
        per_text = fz.embed_words(words)
        width = fz.dim
        if per_text:
            vectors = np.concatenate(per_text)
        else:
            vectors = np.zeros((0, width) if fz.single_layer else (0, len(fz.layer_indices), width), np.float32)
        index = [(first_text + t, r.line, w, word) for t, r in enumerate(records) for w, word in enumerate(r.words)]
    elif (options or {}).get("chunks") is not None:  # one row per chunk; the index's word column numbers them
        chunks = options["chunks"]
        texts = [" ".join(w) for w in words] if chunks == "sentences" else words  # sentences are cut in strings
        per_text = fz.embed_sentences(texts, **options)
        vectors = np.concatenate(per_text) if per_text else np.zeros((0, *vector_row_shape(fz, level)), np.float32)
        index = [(first_text + t, r.line, c, "") for t, r in enumerate(records) for c in range(len(per_text[t]))]
    else:
        vectors = fz.embed_sentences(words, **(options or {}))
        index = [(first_text + t, r.line, -1, "") for t, r in enumerate(records)]
    assert len(index) == vectors.shape[0], "one index line per vector row"
    return vectors, index


def write_shard(
    fz,
    records: list[Record],
    k: int,
    first_text: int,
    level: str,
    storage: str,
    out: Path,
    options: dict | None = None,
    codes: OutputCodes | None = None,
) -> dict:
    """Embed shard `k` and write it (`write_arrays`), as `codes` says (--output-precision: float32 or the codes of
    quantize_embeddings); returns its manifest entry, with the texts the Featurizer cut (`with_cut`)."""
    vectors, index = embed_shard(fz, records, first_text, level, options)
    if codes is not None:
        vectors = codes.encode(vectors, k)
    cut = [first_text + i for i in getattr(fz, "cut_texts", [])]  # a SparseEncoder keeps no record: none
    return with_cut(write_arrays(vectors, index, k, len(records), storage, out), cut, records, first_text)


def with_cut(entry: dict, cut: list[int], records: list[Record], first_text: int) -> dict:
    """A shard's manifest entry with the texts a window cut (a word longer than a whole window keeps its first
    pieces): `cut_texts` (text numbers, as the index files number them) and `cut_lines` (their input lines), when
    there are any."""
    if cut:
        entry = {**entry, "cut_texts": list(cut), "cut_lines": [records[t - first_text].line for t in cut]}
    return entry


def cut_summary(shards: list[dict]) -> dict:
    """The manifest's `cut`: how many texts the Featurizer cut in all shards, their text numbers and lines."""
    texts = [t for s in shards for t in s.get("cut_texts", [])]
    lines = [n for s in shards for n in s.get("cut_lines", [])]
    return {"count": len(texts), "texts": texts, "lines": lines}


def vector_row_shape(fz, level: str, dimensions: int | None = None) -> tuple[int, ...]:
    """The shape of one vector row: (dim,) for one layer or a mix, (layers, dim) for several layers; dim is
    `dimensions` where sentence vectors are truncated. (Binary codes are stored narrower: `OutputCodes.row_shape`.)"""
    dim = fz.sentence_dim if level == "sentence" else fz.dim
    dim = dimensions if dimensions is not None and level == "sentence" else dim
    return (dim,) if fz.single_layer else (len(fz.layer_indices), dim)
