"""Rerankers: score (query, document) pairs and order documents by relevance.

load_reranker(name)                    a CrossEncoderReranker (sequence-classification folders) or an
                                       LLMReranker (causal LMs scored by their yes/no token logits)
reranker.rerank(query, documents, top_n=None, prompt=None, prompt_name=None) -> [(index, score)], best first
reranker.predict(pairs)                the scores of (query, document) pairs, in their order
"""

from __future__ import annotations

import os

from ctxrep.rerank.cross_encoder import CrossEncoderReranker
from ctxrep.rerank.ranking import check_rerank_args, top_scores

__all__ = ["CrossEncoderReranker", "load_reranker", "check_rerank_args", "top_scores"]


def load_reranker(model: str | os.PathLike, **kwargs) -> CrossEncoderReranker:
    """The reranker for `model`'s folder, chosen by its config.json's architectures[0] (keyword arguments go to
    the reranker's constructor)."""
    return CrossEncoderReranker(model, **kwargs)
