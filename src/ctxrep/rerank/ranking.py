"""What every pair scorer shares: the checks of a rerank call, its batches and its answer.

Every reranker (CrossEncoderReranker, LLMReranker, PairModelReranker) and every ctxrep estimator fitted on pairs
answers `rerank(query, documents, top_n=None, prompt=None, prompt_name=None)` with one `Hits`
(ctxrep.vectors.hits): ids = the documents' positions in the list given (0-based), texts = the documents, scores
best first (ties keep the documents' order), rows = the positions again. `ranked_hits` makes it from the scores.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from ctxrep.text.inputs import token_budget_batches
from ctxrep.vectors.hits import Hits, check_rerank_args, ranked_hits  # noqa: F401  (their old home)

# A reranker's `between_batches`: None, or a function called between two batches with one argument, `drain` (as the
# Featurizer's hook; a reranker's batch is scored on the CPU before the hook runs, so drain has nothing to do). ctxrep
# serve sets it on a copy of the reranker to let other requests use the model between two batches of a long one.
BetweenBatches = Callable[[Callable[[], None]], None]


class Reranker:
    """What every reranker shares (CrossEncoderReranker, LLMReranker, PairModelReranker): `rerank` over its own
    `predict(pairs, prompt, prompt_name)` (scores of (query, document) pairs in their order), and the attributes
    the front ends read: `cut_texts` / `cut_pieces` after each call, `max_length`, `prompts`, `tokenizer`,
    `batch_tokens` (the token budget of its batches; None: it predicts a call whole, and ctxrep serve hands it a
    long call's documents a step at a time) and `between_batches` (None, or a function called between two batches:
    ctxrep serve's turns; set it on a copy)."""

    batch_tokens: int | None = None
    between_batches: BetweenBatches | None = None

    def predict(self, pairs, prompt: str | None = None, prompt_name: str | None = None) -> np.ndarray:
        raise NotImplementedError

    def check_reranks(self) -> None:
        """A one-line ValueError when this model cannot rerank (as the estimators' check_reranks); none here."""

    def rerank(
        self,
        query: str,
        documents: Sequence[str],
        top_n: int | None = None,
        prompt: str | None = None,
        prompt_name: str | None = None,
    ) -> Hits:
        """The `top_n` best documents (all when None) for `query`, highest score first, ties in the documents'
        order, as Hits: ids = the documents' positions, texts = the documents, scores (`ranked_hits`). The
        server's /rerank and /v1/rerank answer with this."""
        self.check_reranks()
        documents = check_rerank_args(query, documents, top_n)
        return ranked_hits(self.predict([(query, d) for d in documents], prompt, prompt_name), documents, top_n)


def length_batches(
    lengths: Sequence[int], budget: int, between_batches: BetweenBatches | None = None
) -> Iterator[list[int]]:
    """Row indices of each batch: the rows sorted by length (stable), in batches of rows x longest <= `budget`
    (`token_budget_batches`); `between_batches(drain)`, when given, runs between two batches (after one is scored,
    before the next; not after the last: the call then ends and passes the model on)."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    start = 0
    for size in token_budget_batches([lengths[r] for r in order], budget):
        yield order[start : start + size]
        start += size
        if between_batches is not None and start < len(order):  # between two batches, not after the last
            between_batches(_nothing_in_flight)


def _nothing_in_flight() -> None:
    """A reranker's `drain`: every batch it ran is already scored."""


def top_scores(scores: np.ndarray, top_n: int | None) -> list[tuple[int, float]]:
    """Deprecated (goes in 0.3): (index, score) of the top_n highest scores, best first; `ranked_hits` gives the
    rerank answer, Hits."""
    warnings.warn(
        "ctxrep.rerank.top_scores goes in 0.3: ranked_hits(scores, documents, top_n) gives the rerank answer (Hits)",
        DeprecationWarning,
        stacklevel=2,
    )
    order = np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")
    return [(int(i), float(scores[i])) for i in order[:top_n]]


def rerank_hits(
    reranker, query: str, hits: Hits, k: int | None = None, prompt: str | None = None, prompt_name: str | None = None
) -> Hits:
    """Retrieve-then-rerank: the `k` best of an index's `hits` (texts stored) for `query` by `reranker.rerank`
    (any pair scorer), as Hits of the index's ids and rows whose scores are the reranker's. After it,
    `reranker.cut_texts` are the positions in `hits` (as given) of the documents cut to fit:
    `[hits.ids[i] for i in reranker.cut_texts]`."""
    if any(t is None for t in hits.texts):
        raise ValueError("the index stores no texts to rerank; build it from the texts (ctxrep index build --input)")
    if len(hits) == 0:
        reranker.cut_texts, reranker.cut_pieces = [], []  # this call cut nothing
        return hits
    ranked = reranker.rerank(query, list(hits.texts), top_n=k, prompt=prompt, prompt_name=prompt_name)
    order = ranked.rows.tolist()  # positions in `hits`
    return Hits(
        [hits.ids[i] for i in order],
        [hits.texts[i] for i in order],
        np.asarray(ranked.scores, dtype=np.float32),
        np.asarray(hits.rows)[order],
    )
