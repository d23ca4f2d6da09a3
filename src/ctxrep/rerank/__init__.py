"""Rerankers: score (query, document) pairs and order documents by relevance.

load_reranker(name)                    a CrossEncoderReranker (sequence-classification folders) or an
                                       LLMReranker (causal LMs scored by their yes/no token logits), by the
                                       folder's config.json architectures[0]
reranker.rerank(query, documents, top_n=None, prompt=None, prompt_name=None) -> [(index, score)], best first
reranker.predict(pairs)                the scores of (query, document) pairs, in their order
reranker.cut_texts, .cut_pieces        after each call: the pairs cut to fit max_length (indices in that call)
                                       and how many pieces each lost (a reranker cuts, it does not window)
"""

from __future__ import annotations

import os

from ctxrep.models.loading import load_encoder
from ctxrep.rerank.cross_encoder import CrossEncoderReranker, architecture_of
from ctxrep.rerank.llm import QWEN3_RERANKER, LLMReranker, YesNoTemplate
from ctxrep.rerank.ranking import check_rerank_args, rerank_hits, top_scores

__all__ = [
    "CrossEncoderReranker",
    "LLMReranker",
    "QWEN3_RERANKER",
    "YesNoTemplate",
    "load_reranker",
    "check_rerank_args",
    "top_scores",
    "rerank_hits",
]


def load_reranker(model: str | os.PathLike, **kwargs) -> CrossEncoderReranker | LLMReranker:
    """The reranker for `model`'s folder: an LLMReranker when its config.json's architectures[0] is a
    ...ForCausalLM (as sentence-transformers' CrossEncoder decides), else a CrossEncoderReranker. Keyword arguments
    go to the reranker's constructor."""
    loaded = load_encoder(model)
    causal = architecture_of(loaded.folder).endswith("ForCausalLM")
    return (LLMReranker if causal else CrossEncoderReranker)(loaded, **kwargs)
