"""THE answer to "the best items for a query": `Hits`, whatever asked it.

Every index's `search` (SentenceIndex, SparseIndex, LateInteractionIndex, BinaryIndex) and every reranker's
`rerank` (cross-encoders, LLM rerankers, ctxrep's fine-tuned pair models) answers with Hits, as
sentence-transformers' `util.semantic_search` and `CrossEncoder.rank` answer with one dict shape whatever the model:

    ids      what the items are called: an index's ids (0-based row numbers unless given), a rerank's positions
             of the documents in the list it was given
    texts    the items' texts (None where an index stores none), a rerank's documents
    scores   (k,) float32, best first
    rows     (k,) int64 the items' rows: in the index, or the documents' positions (a store's search, ctxrep.stores:
             the rows' input lines)

One query gives one Hits; a list of queries (or a 2-D batch of vectors, even of one row) a list of Hits, one per
query in order. Iterating a Hits gives (id, text, score) triples, best first.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Hits", "check_rerank_args", "ranked_hits"]


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


# ---- the rerank answer: every pair scorer's (rerank/, the estimators fitted on pairs) -------------------------


def check_rerank_args(query: str, documents: Sequence[str], top_n: int | None) -> list[str]:
    """The documents as a list, or a one-line error: a query string, a non-empty list of non-empty strings, and
    top_n None or >= 1."""
    if not isinstance(query, str) or not query.strip():
        raise ValueError(f"query must be a non-empty string, got {query!r}")
    if isinstance(documents, str):
        raise TypeError("documents must be a list of strings, got a single string; wrap it in a list: [document]")
    documents = list(documents)
    if not documents:
        raise ValueError("documents is empty; give at least one document to rerank")
    for i, d in enumerate(documents):
        if not isinstance(d, str):
            raise TypeError(f"document {i}: expected a string, got {type(d).__name__}")
        if not d.strip():
            raise ValueError(f"document {i} is empty; remove it or give it some text")
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1):
        raise ValueError(f"top_n must be a positive integer or None, got {top_n!r}")
    return documents


def ranked_hits(scores, documents: Sequence[str], top_n: int | None = None) -> Hits:
    """The rerank answer: the `top_n` best documents (all when None) by `scores` (one per document, in their order),
    best first, ties in the documents' order; ids and rows are the documents' positions."""
    scores = np.asarray(scores, dtype=np.float32)
    order = np.argsort(-scores.astype(np.float64), kind="stable")[:top_n]
    return _RerankHits(order.tolist(), [documents[i] for i in order.tolist()], scores[order], order.astype(np.int64))


class _RerankHits(Hits):
    """A rerank's Hits. Until 0.3 it also reads as the list of (index, score) pairs rerank returned before
    (iterating, indexing, comparing with a list), with a DeprecationWarning; then it iterates as every Hits:
    (id, text, score) triples."""

    def _pairs(self) -> list[tuple[int, float]]:
        warnings.warn(
            "rerank answers with Hits (ids, texts, scores, rows), as every reranker and index; reading it as a list "
            "of (index, score) pairs goes in 0.3: use zip(hits.ids, hits.scores)",
            DeprecationWarning,
            stacklevel=3,
        )
        return list(zip(self.ids, self.scores.tolist()))

    def __iter__(self):
        return iter(self._pairs())

    def __getitem__(self, item):
        return self._pairs()[item]

    def __eq__(self, other):
        if isinstance(other, (list, tuple)):
            return self._pairs() == list(other)
        return NotImplemented

    __hash__ = None
