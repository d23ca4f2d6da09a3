"""Rerankers: score (query, document) pairs and order documents by relevance.

load_reranker(name)                    the reranker of a folder, by what it holds (RERANKERS, one row per kind):
                                       a ctxrep fine-tuned pair model (PairModelReranker), a cross-encoder
                                       (CrossEncoderReranker: a *ForSequenceClassification of one label) or an LLM
                                       reranker (LLMReranker: a ...ForCausalLM that is no sentence-embedding folder)
reranker.rerank(query, documents, top_n=None, prompt=None, prompt_name=None) -> Hits (ctxrep.vectors.hits): ids =
                                       the documents' positions, texts = the documents, scores best first; the same
                                       answer from every reranker (ranking.Reranker, their base) and every ctxrep
                                       estimator fitted on pairs
reranker.predict(pairs)                the scores of (query, document) pairs, in their order
reranker.cut_texts, .cut_pieces        after each call: the pairs cut to fit max_length (indices in that call)
                                       and how many pieces each lost (a reranker cuts, it does not window)
rerank_hits(reranker, query, hits, k)  retrieve-then-rerank: an index's Hits reranked, the index's ids kept
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ctxrep.models.folders import CheckpointError, read_config
from ctxrep.models.loading import resolve
from ctxrep.models.sentence_transformers import read_modules, read_settings
from ctxrep.rerank.cross_encoder import HEADS, CrossEncoderReranker, architecture_of
from ctxrep.rerank.llm import QWEN3_RERANKER, LLMReranker, YesNoTemplate
from ctxrep.rerank.pair_model import PairModelReranker, is_estimator_folder
from ctxrep.rerank.ranking import Reranker, check_rerank_args, ranked_hits, rerank_hits, top_scores

__all__ = [
    "CrossEncoderReranker",
    "LLMReranker",
    "PairModelReranker",
    "QWEN3_RERANKER",
    "RERANKERS",
    "Reranker",
    "RerankerKind",
    "YesNoTemplate",
    "load_reranker",
    "reranker_kind",
    "check_rerank_args",
    "ranked_hits",
    "top_scores",
    "rerank_hits",
]


def _architecture(folder: Path) -> str | None:
    """config.json's architectures[0], or None (no config.json, none named)."""
    try:
        return architecture_of(folder)
    except (CheckpointError, OSError, ValueError):
        return None


def _labels(folder: Path) -> int:
    """How many labels a sequence-classification folder's head has (config.json's id2label, else num_labels, else
    transformers' default of 2)."""
    config = read_config(folder)
    return len(config.get("id2label") or {}) or int(config.get("num_labels", 2))


def is_cross_encoder(folder: Path) -> bool:
    """A *ForSequenceClassification folder ctxrep reads (HEADS) with one label: one relevance score per pair, as
    text-embeddings-inference serves /rerank for (several labels are a classifier)."""
    return _architecture(folder) in HEADS and _labels(folder) == 1


def is_llm_reranker(folder: Path) -> bool:
    """A ...ForCausalLM folder (sentence-transformers' CrossEncoder rule) that is not a sentence-embedding folder
    (a sentence-transformers model_type "SentenceTransformer", or a Pooling module: e.g. Qwen3-Embedding)."""
    if not (_architecture(folder) or "").endswith("ForCausalLM"):
        return False
    try:
        embedding = read_settings(folder).get("model_type") == "SentenceTransformer" or any(
            m.kind == "Pooling" for m in read_modules(folder)
        )
    except CheckpointError:
        embedding = False
    return not embedding


@dataclass(frozen=True)
class RerankerKind:
    """One kind of reranker folder: what it is called, whether a folder holds one (read from its files, never from
    its name), and the class that loads it (the folder, then the keyword arguments of load_reranker)."""

    name: str
    holds: Callable[[Path], bool]
    load: Callable[..., object]


# Every kind of reranker folder; the first row a folder holds is what it is.
RERANKERS: tuple[RerankerKind, ...] = (
    RerankerKind("a fine-tuned ctxrep pair model", is_estimator_folder, PairModelReranker),
    RerankerKind("a cross-encoder", is_cross_encoder, CrossEncoderReranker),
    RerankerKind("an LLM reranker", is_llm_reranker, LLMReranker),
)


def reranker_kind(folder: str | os.PathLike) -> RerankerKind | None:
    """The row of RERANKERS that `folder` (a local folder) holds, or None when it is no reranker."""
    return next((row for row in RERANKERS if row.holds(Path(folder))), None)


def load_reranker(model: str | os.PathLike, **kwargs):
    """The reranker of `model` (a folder or a name ctxrep.load_encoder resolves), by the first row of RERANKERS its
    folder holds; a folder none holds is read as a cross-encoder, which names what it lacks in one line. Keyword
    arguments go to the reranker's constructor (a fine-tuned pair model takes `device` only)."""
    folder = Path(model) if is_estimator_folder(model) else resolve(model).folder
    row = reranker_kind(folder)
    return (row.load if row is not None else CrossEncoderReranker)(folder, **kwargs)
