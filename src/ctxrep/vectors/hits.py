"""THE answer to "the best items for a query": `Hits`, whatever asked it.

Every index's `search` (SentenceIndex, SparseIndex, LateInteractionIndex, BinaryIndex) and every reranker's
`rerank` (cross-encoders, LLM rerankers, ctxrep's fine-tuned pair models) answers with Hits, as
sentence-transformers' `util.semantic_search` and `CrossEncoder.rank` answer with one dict shape whatever the model:

    ids      what the items are called: an index's ids (0-based row numbers unless given), a rerank's positions
             of the documents in the list it was given
    texts    the items' texts (None where an index stores none), a rerank's documents
    scores   (k,) float32, best first
    rows     (k,) int64 the items' rows: in the index, or the documents' positions

One query gives one Hits; a list of queries (or a 2-D batch of vectors, even of one row) a list of Hits, one per
query in order. Iterating a Hits gives (id, text, score) triples, best first.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

__all__ = ["Hits"]


@dataclass
class Hits:
    """The k best items of one query, best first (see the module docstring)."""

    ids: list
    texts: list[str | None]
    scores: np.ndarray  # (k,) float32
    rows: np.ndarray  # (k,) int64

    def __len__(self) -> int:
        return len(self.ids)

    def __iter__(self) -> Iterator[tuple]:
        return iter(zip(self.ids, self.texts, self.scores.tolist()))

    @classmethod
    def empty(cls) -> Hits:
        """No item (a search of an empty index)."""
        return cls([], [], np.zeros(0, np.float32), np.zeros(0, np.int64))

    @classmethod
    def from_rows(cls, rows, scores, ids: list, texts: list) -> Hits:
        """The items at `rows` (best first) of an index whose items are `ids` and `texts`, with their `scores`."""
        rows = np.asarray(rows, dtype=np.int64)
        return cls(
            [ids[r] for r in rows.tolist()], [texts[r] for r in rows.tolist()], np.asarray(scores, np.float32), rows
        )
