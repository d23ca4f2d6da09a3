"""One shard of an embedding run: the rows the job's output variant gives for a group of records (`embed_shard`),
written (`write_shard`) with the texts a window cut (`with_cut`, `cut_summary`)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from ctxrep.embed.codes import OutputCodes
from ctxrep.embed.outputs import OutputVectors, vectors_of
from ctxrep.embed.records import Record
from ctxrep.vectors.store import write_arrays


def embed_shard(
    fz, records: list[Record], first_text: int, vectors: OutputVectors | str, options: dict | None = None
) -> tuple[Any, list[tuple]]:
    """The rows `vectors` (the job's output variant) gives for `records`, and one index entry (text, line, word
    position, word) per row. (`vectors` as "word" / "sentence" with embed_sentences' `options`: deprecated.)"""
    vectors = _variant(vectors, options)
    rows, index = vectors.rows(fz, records, first_text)
    assert len(index) == rows.shape[0], "one index line per vector row"
    return rows, index


def write_shard(
    fz,
    records: list[Record],
    k: int,
    first_text: int,
    vectors: OutputVectors | str,
    storage: str,
    out: Path,
    options: dict | None = None,
    codes: OutputCodes | None = None,
) -> dict:
    """Embed shard `k` as `vectors` says and write it (`write_arrays`), as `codes` says (--output-precision: float32
    or the codes of quantize_embeddings); returns its manifest entry, with the texts the Featurizer cut
    (`with_cut`). (`options`: only beside a deprecated level string, see `embed_shard`.)"""
    rows, index = embed_shard(fz, records, first_text, _variant(vectors, options))
    if codes is not None:
        rows = codes.encode(rows, k)
    cut = [first_text + i for i in getattr(fz, "cut_texts", [])]  # a SparseEncoder keeps no record: none
    return with_cut(write_arrays(rows, index, k, len(records), storage, out), cut, records, first_text)


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
    """Deprecated (gone in 0.3): the job's output variant answers, `vectors.row_shape(fz)`."""
    warnings.warn(
        "vector_row_shape(fz, level, dimensions) is deprecated: ask the output variant, "
        "WordVectors().row_shape(fz) / SentenceVectors(dimensions=N).row_shape(fz); removed in 0.3",
        DeprecationWarning,
        stacklevel=2,
    )
    return _variant(level, {"dimensions": dimensions} if dimensions is not None else None, stacklevel=None).row_shape(
        fz
    )


def _variant(vectors: OutputVectors | str, options: dict | None, stacklevel: int | None = 3) -> OutputVectors:
    """`vectors`, or the variant an old level string ("word", "sentence") and embed_sentences options give (with a
    DeprecationWarning unless `stacklevel` is None)."""
    if not isinstance(vectors, str):
        if options:
            raise TypeError("options go with a level string; an output variant holds its own")
        return vectors
    if stacklevel is not None:
        warnings.warn(
            f"a level string ({vectors!r}) with embed_sentences options is deprecated: pass the output variant, "
            "WordVectors() / SentenceVectors(...) (ctxrep.embed.outputs); removed in 0.3",
            DeprecationWarning,
            stacklevel=stacklevel,
        )
    return vectors_of(vectors, "dense", options)
