"""What `ctxrep serve --model FOLDER` serves, by what the folder is: two explicit tables.

FOLDER_KINDS  folder kind -> what it answers; the first row whose test the folder passes is what it is (read from
              its files, never from its name), `--model-kind` names a row instead:

    reranker            a ctxrep fine-tuned pair model, a cross-encoder (*ForSequenceClassification, one label) or
                        an LLM reranker (...ForCausalLM, no sentence-embedding pipeline)    -> rerank
    sparse              a sentence-transformers SparseEncoder folder (SPLADE)               -> sparse vectors
    bge-m3              a dense model with BGE-M3's sparse_linear.pt beside it              -> embeddings, sparse
    sentence-embedding  any other model folder or name                                     -> embeddings

ROUTES        what an answer is served at, and what a server that lacks it needs:

    embeddings      /v1/embeddings, /embed, /v1/word-embeddings
    rerank          /rerank, /v1/rerank                            (as text-embeddings-inference serves a reranker)
    sparse vectors  /embed_sparse

A route whose answer the server does not hold answers 404 in its own schema, naming what the server holds and the
folder kind the route needs. `--reranker` and `--sparse-model` add a reranker / sparse encoder beside `--model`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from ctxrep.models.loading import resolve
from ctxrep.rerank import reranker_kind
from ctxrep.rerank.pair_model import is_estimator_folder
from ctxrep.vectors.sparse import SPARSE_LINEAR_FILE, is_sparse_folder


class Answer(Enum):
    """What a loaded model answers."""

    EMBEDDINGS = "embeddings"
    RERANK = "rerank"
    SPARSE = "sparse vectors"


@dataclass(frozen=True)
class Routes:
    """The routes of one answer: their paths, how the start line shows them, and what a server without it needs."""

    paths: tuple[str, ...]
    shown: str
    needs: str


ROUTES: dict[Answer, Routes] = {
    Answer.EMBEDDINGS: Routes(
        ("/v1/embeddings", "/embed", "/v1/word-embeddings"),
        "/v1/embeddings (OpenAI), /embed (TEI), /v1/word-embeddings",
        "embeddings need a sentence-embedding folder: start ctxrep serve with --model MODEL",
    ),
    Answer.RERANK: Routes(
        ("/rerank", "/v1/rerank"),
        "/rerank (TEI), /v1/rerank (Cohere, Jina)",
        "rerank needs a reranker folder (a cross-encoder, an LLM reranker or a pair model `ctxrep finetune` trained): "
        "start ctxrep serve with --reranker MODEL, or --model MODEL of such a folder",
    ),
    Answer.SPARSE: Routes(
        ("/embed_sparse",),
        "/embed_sparse (TEI)",
        "sparse vectors need a SPLADE or BGE-M3 folder: start ctxrep serve with --sparse-model MODEL, or --model MODEL "
        "of a SPLADE folder",
    ),
}


@dataclass(frozen=True)
class FolderKind:
    """One kind of model folder: its name (--model-kind), what it is in words, whether a folder is one, and what
    the server answers with it."""

    name: str
    what: str
    holds: Callable[[Path], bool]
    answers: tuple[Answer, ...]


def _is_reranker(folder: Path) -> bool:
    return reranker_kind(folder) is not None


def _has_sparse_linear(folder: Path) -> bool:
    return (folder / SPARSE_LINEAR_FILE).is_file()


def _any_model(folder: Path) -> bool:
    return True


FOLDER_KINDS: tuple[FolderKind, ...] = (
    FolderKind("reranker", "a reranker", _is_reranker, (Answer.RERANK,)),
    FolderKind("sparse", "a sparse encoder (SPLADE)", is_sparse_folder, (Answer.SPARSE,)),
    FolderKind("bge-m3", "a dense and sparse encoder (BGE-M3)", _has_sparse_linear, (Answer.EMBEDDINGS, Answer.SPARSE)),
    FolderKind("sentence-embedding", "a sentence-embedding model", _any_model, (Answer.EMBEDDINGS,)),
)
KIND_NAMES: tuple[str, ...] = tuple(k.name for k in FOLDER_KINDS)

# what each part of a server is, in words (EmbeddingService.missing)
HOLDS = {
    Answer.EMBEDDINGS: "a sentence-embedding model",
    Answer.RERANK: "a reranker",
    Answer.SPARSE: "a sparse encoder",
}


def folder_kind(model: str | os.PathLike, kind: str | None = None) -> FolderKind:
    """The row of FOLDER_KINDS `model` (a folder or a name ctxrep.load_encoder resolves) is: the first whose test its
    folder passes, or the row named `kind` (--model-kind)."""
    if kind is not None:
        rows = {k.name: k for k in FOLDER_KINDS}
        if kind not in rows:
            raise ValueError(f"model kind {kind!r} is not one of {', '.join(KIND_NAMES)}")
        return rows[kind]
    folder = Path(model) if is_estimator_folder(model) else resolve(model).folder
    return next(k for k in FOLDER_KINDS if k.holds(folder))


__all__ = ["Answer", "ROUTES", "Routes", "FOLDER_KINDS", "FolderKind", "KIND_NAMES", "HOLDS", "folder_kind"]
