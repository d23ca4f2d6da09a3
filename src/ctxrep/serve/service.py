"""The server's backend: what it holds (a Featurizer and its views for other layers and poolings, a reranker, a
sparse encoder: serve/kinds.py says which a folder gives) behind the batcher.

Every vector comes from `Featurizer.embed_sentences` / `embed_words`; texts longer than the model's window are
windowed as the Featurizer does, never truncated (`windowed` says which were). Every call also returns which texts
were cut (`cut_flags`: a word longer than a window; a rerank pair longer than the reranker's max length, cut as
sentence-transformers cuts it), so that every route can say so. Every call, rerank calls included,
runs in the batcher's steps (`stepping`: batches of the step's token budget, the model passed on between two of
them); a reranker that predicts a call whole (a pair model `ctxrep finetune` trained) is given its documents a step
at a time (`Rerank.run`).

Before the server answers /health, `warm_up` runs each model it holds over the shapes it will serve (one short text,
a step of short texts, one window-long text; a rerank of a few documents) twice: the first request is then as fast as
any, and the second pass gives the batcher its first measure of each model's throughput (the steps' size).
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import os
import time
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ctxrep.models.sentence_transformers import with_prompt
from ctxrep.serve.batcher import Batcher, Step
from ctxrep.serve.kinds import HOLDS, ROUTES, Answer, folder_kind
from ctxrep.serve.metrics import Metrics

API_KEY_ENV = "CTXREP_API_KEY"


@dataclass
class ServeConfig:
    """How the server batches and what it accepts."""

    max_batch_tokens: int = 16384  # words+pieces estimate of one merged Featurizer call (it batches inside again)
    max_wait_ms: float = 5.0  # how long the first request of a batch waits for others
    max_queue_texts: int = 4096  # texts waiting; beyond: 503 + Retry-After
    max_texts: int = 2048  # texts per request; beyond: 413
    max_text_chars: int = 200_000  # characters per text; beyond: 413 (longer texts than the window are windowed)
    max_body_bytes: int = 32 * 1024 * 1024  # request body; beyond: 413
    max_active_calls: int = 32  # model calls in progress at once (they take turns batch by batch)
    step_ms: float = 50.0  # how long one step of a call (one batch) should take: what a short request waits at most
    api_key: str | None = None
    retry_after_s: int = 1
    graceful_shutdown_s: float = 30.0  # on SIGINT / SIGTERM, how long requests in flight may run on; then: 503

    def __post_init__(self) -> None:
        if self.max_texts > self.max_queue_texts:
            raise ValueError(
                f"max_texts ({self.max_texts:,} texts a request) is more than max_queue_texts "
                f"({self.max_queue_texts:,} texts waiting), so a request that large could never be queued: raise "
                "--max-queue (ServeConfig.max_queue_texts) or lower --max-texts"
            )
        if not self.step_ms > 0:
            raise ValueError(f"--step-ms (ServeConfig.step_ms) must be more than 0, got {self.step_ms:g}")


Text = str | list[str]  # a text as a request sends it: a string, or its words


def pieces(tokenizer, texts: list[Text]) -> list[int]:
    """Subword pieces per text (OpenAI's `usage`), without special tokens; words for a word-level model."""
    words = [t.split() if isinstance(t, str) else t for t in texts]
    if tokenizer.word_level:
        return [len(w) for w in words]
    return [len(p.tokens) for p in tokenizer.encode_words(words)]


def cut_flags(runner, texts: list[Text]) -> list[bool]:
    """Whether the call `runner` just made cut each text: its `cut_texts` (a Featurizer's: a word longer than a
    window; a reranker's: a pair longer than its max length)."""
    cut = set(runner.cut_texts)
    return [i in cut for i in range(len(texts))]


def stepping(runner, step: Step | None):
    """`runner` (a Featurizer or a reranker: both run batches of `batch_tokens` and call `between_batches(drain)`
    after each), or, when `step` is given, a copy of it whose batches are the step's size and that calls the step's
    hook: the batcher's turns pass the model on there."""
    if step is None:
        return runner
    runner = copy.copy(runner)
    runner.between_batches = step.between_batches
    runner.batch_tokens = step.budget(runner.batch_tokens)
    return runner


# ---- what one model call computes: the key that requests must share to be merged, and how it runs ---------------


@dataclass(frozen=True)
class Sentences:
    """Featurizer.embed_sentences with a prompt: given, or the folder's by name, or its default (none given)."""

    answer: ClassVar[Answer] = Answer.EMBEDDINGS  # the model it runs (the batcher sizes its steps by it)
    prompt: str | None = None
    prompt_name: str | None = None

    def run(self, service: EmbeddingService, texts: list[Text], step: Step | None):
        fz = service.featurizer(SENTENCES, step)
        vectors = fz.embed_sentences(texts, prompt=self.prompt, prompt_name=self.prompt_name)
        read = with_prompt(fz.prompts.resolve(self.prompt, self.prompt_name), texts)  # what the model read
        return vectors, pieces(fz.tokenizer, read), cut_flags(fz, texts)


@dataclass(frozen=True)
class Words:
    """Featurizer.embed_words at these layers and this pooling."""

    answer: ClassVar[Answer] = Answer.EMBEDDINGS
    layers: int | tuple[int, ...] | str
    pooling: str

    def run(self, service: EmbeddingService, texts: list[Text], step: Step | None):
        fz = service.featurizer(self, step)
        vectors = fz.embed_words(texts)
        return vectors, pieces(fz.tokenizer, texts), cut_flags(fz, texts)


@dataclass(frozen=True)
class Rerank:
    """One rerank request: reranker.rerank(query, documents, top_n, prompt, prompt_name) -> Hits best first (ids =
    the documents' positions); `request` keeps every request its own call (each has its own query and top_n)."""

    answer: ClassVar[Answer] = Answer.RERANK
    request: int
    query: str
    top_n: int | None = None
    prompt: str | None = None
    prompt_name: str | None = None

    def run(self, service: EmbeddingService, documents: list[str], step: Step | None):
        counts = pieces(service.reranker.tokenizer, [f"{self.query} {d}" for d in documents])
        if step is not None and service.reranker.batch_tokens is None:  # it predicts a call whole: a step at a time
            ranked, cut = self._in_steps(service.reranker, documents, counts, step)
            return ranked, counts, cut
        reranker = stepping(service.reranker, step)  # its batches take turns with other calls' batches
        ranked = reranker.rerank(self.query, documents, self.top_n, self.prompt, self.prompt_name)
        return ranked, counts, cut_flags(reranker, documents)  # a cut pair is its document's index

    def _in_steps(self, reranker, documents: list[str], counts: list[int], step: Step):
        """The rerank of a reranker without batches of its own (`batch_tokens` None): its `predict` over the
        documents in input order, a step's tokens at a time, the model passed on between two steps; the same scores
        as one call (a pair's score is its own)."""
        from ctxrep.vectors.hits import check_rerank_args, ranked_hits

        reranker.check_reranks()
        documents = check_rerank_args(self.query, documents, self.top_n)
        ends = np.flatnonzero(np.diff(np.cumsum(counts) // max(1, step.tokens), prepend=0)) + 1
        bounds = [0, *sorted(set(ends.tolist()) - {0, len(documents)}), len(documents)]
        scores, cut = [], []
        for at, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
            pairs = [(self.query, d) for d in documents[start:end]]
            scores.append(reranker.predict(pairs, self.prompt, self.prompt_name))
            cut += [start + i for i in reranker.cut_texts]
            if at < len(bounds) - 2:
                step.between_batches(lambda: None)  # nothing in flight: every step is scored
        hits = ranked_hits(np.concatenate(scores), documents, self.top_n)
        flags = set(cut)
        return hits, [i in flags for i in range(len(documents))]


# SparseEncoder.embed_sentences' batch_texts: a call of at most this many texts is one Featurizer call, so the
# Featurizer's `cut_texts` after it are that call's (the SparseEncoder keeps no record of its own).
SPARSE_CALL_TEXTS = 256


@dataclass(frozen=True)
class Sparse:
    """SparseEncoder.embed_sparse with a prompt (given, or the folder's by name, or its default: none given): one
    SparseVector per text (TEI's /embed_sparse), and the texts its Featurizer cut, read after each call of at most
    SPARSE_CALL_TEXTS texts."""

    answer: ClassVar[Answer] = Answer.SPARSE
    prompt: str | None = None
    prompt_name: str | None = None

    def run(self, service: EmbeddingService, texts: list[Text], step: Step | None):
        encoder = service.sparse
        if step is not None:  # a copy whose Featurizer runs the step's batches and passes the model on between them
            encoder = copy.copy(encoder)
            encoder.featurizer = stepping(encoder.featurizer, step)
        vectors, cut = [], []
        for start in range(0, len(texts), SPARSE_CALL_TEXTS):
            part = texts[start : start + SPARSE_CALL_TEXTS]
            vectors += encoder.embed_sparse(part, prompt=self.prompt, prompt_name=self.prompt_name)
            cut += cut_flags(encoder.featurizer, part)
        read = with_prompt(encoder.prompts.resolve(self.prompt, self.prompt_name), texts)  # what the model read
        return vectors, pieces(encoder.featurizer.tokenizer, read), cut


SENTENCES = Sentences()


class EmbeddingService:
    """What the server holds, the queue and the batcher: what the HTTP handlers call.

    featurizer: the Featurizer of the embedding routes, or None (a server of a reranker or a sparse encoder alone);
    reranker: a ctxrep.rerank reranker for /rerank and /v1/rerank, or None; sparse: a SparseEncoder for
    /embed_sparse, or None. At least one. name: what /v1/models, /health and the embedding routes call the model;
    reranker_name / sparse_name: the reranker's and the sparse encoder's (default: name).
    normalize: /v1/embeddings returns unit-length vectors (--normalize); a folder whose modules.json ends in
    Normalize is served unit-length there too. /embed follows each request's own `normalize`.
    """

    def __init__(
        self,
        featurizer,
        name: str,
        config: ServeConfig | None = None,
        normalize: bool = False,
        reranker=None,
        reranker_name: str | None = None,
        sparse=None,
        sparse_name: str | None = None,
    ) -> None:
        if featurizer is None and reranker is None and sparse is None:
            raise ValueError("give the service something to serve: a Featurizer, a reranker or a sparse encoder")
        self.folder_normalizes = False
        if featurizer is not None:
            if featurizer.normalize:
                raise ValueError(
                    "give the service a Featurizer with normalize=False and EmbeddingService(normalize=True): /embed "
                    "normalizes per request"
                )
            pooling = featurizer.model_pooling
            self.folder_normalizes = pooling is not None and pooling.normalize
            if self.folder_normalizes:  # the raw vectors, normalised here when a request asks (so /embed can say no)
                featurizer = copy.copy(featurizer)
                featurizer.model_pooling = dataclasses.replace(pooling, normalize=False)
        self.fz = featurizer
        self.name = name
        self.normalize = normalize or self.folder_normalizes
        self.config = config or ServeConfig()
        self.metrics = Metrics()
        self.views: dict[Any, Any] = {SENTENCES: featurizer} if featurizer is not None else {}
        self.reranker = reranker  # a ctxrep.rerank reranker for /rerank and /v1/rerank, or None
        self.reranker_name = (reranker_name or name) if reranker is not None else reranker_name
        self.sparse = sparse  # a ctxrep.vectors.sparse.SparseEncoder for /embed_sparse, or None
        self.sparse_name = (sparse_name or name) if sparse is not None else sparse_name
        self._requests = itertools.count()
        c = self.config
        self.batcher = Batcher(
            self._run,
            max_batch_tokens=c.max_batch_tokens,
            max_wait_ms=c.max_wait_ms,
            max_queue_texts=c.max_queue_texts,
            max_active_calls=c.max_active_calls,
            # ELMo numbers its words per call: calls run whole
            interleave=featurizer is None or not featurizer.tokenizer.word_level,
            metrics=self.metrics,
            step_ms=c.step_ms,
            budgets=self.batch_budget,
        )
        self.warmed: WarmUp | None = None  # what warm_up ran, once it has

    @property
    def dim(self) -> int | None:
        """The sentence vectors' width (None without a Featurizer)."""
        return None if self.fz is None else self.fz.sentence_dim

    def parts(self) -> dict[Answer, tuple[str, object]]:
        """What the server holds, by what it answers: (name, the object answering)."""
        held = {Answer.EMBEDDINGS: (self.name, self.fz), Answer.RERANK: (self.reranker_name, self.reranker)}
        held[Answer.SPARSE] = (self.sparse_name, self.sparse)
        return {answer: part for answer, part in held.items() if part[1] is not None}

    def missing(self, answer: Answer) -> str | None:
        """None when the server answers `answer`; else the one line a route that needs it answers: what the server
        holds, and the folder kind the route needs (serve/kinds.py)."""
        parts = self.parts()
        if answer in parts:
            return None
        held = " and ".join(f"{HOLDS[a]} ({name})" for a, (name, _) in parts.items())
        return f"this server holds {held}; {ROUTES[answer].needs}"

    def batch_budget(self, answer: Answer) -> int:
        """The batch budget (tokens) of the model that gives `answer`: its own batch_tokens (a reranker that
        predicts a call whole: the budget of an estimator's prediction batch)."""
        from ctxrep.tasks.inference import PREDICT_TOKENS

        runner = {Answer.EMBEDDINGS: self.fz, Answer.RERANK: self.reranker}.get(answer)
        if answer is Answer.SPARSE:
            runner = self.sparse.featurizer
        return getattr(runner, "batch_tokens", None) or PREDICT_TOKENS

    @property
    def queued_texts(self) -> int:
        return self.batcher.queued_texts

    async def start(self, warm_up: bool = True) -> None:
        """Start the batcher, then (warm_up) run each held model over the shapes it will serve (`warm_up`)."""
        await self.batcher.start()
        if warm_up:
            self.warmed = await self.warm_up()

    async def warm_up(self) -> WarmUp:
        """Run each model the server holds over the shapes it will serve, twice, through the batcher (so the second
        pass is the first measure of each model's throughput, which sizes the steps): one short text, a step of
        short texts, one text a window long; a rerank of a few documents. Returns what ran and how long it took."""
        started = time.perf_counter()
        shapes: list[str] = []
        word = "warm"  # one piece in every vocabulary ctxrep serves
        many = min(32, self.config.max_texts)  # texts of a request the server takes
        for answer, (_, runner) in self.parts().items():
            if answer is Answer.RERANK:
                calls = {f"a rerank of {min(8, many)} documents": [f"{word} document {i}" for i in range(min(8, many))]}
            else:
                fz = getattr(runner, "featurizer", runner)  # a SparseEncoder runs its Featurizer
                window = min(fz.max_length, 512) - 4  # a window's pieces (without the special tokens), at most 512
                calls = {
                    "one short text": [f"{word} up"],
                    "a step of short texts": [f"{word} up number {i} of the server" for i in range(many)],
                    f"one text of {window} words": [" ".join([word] * window)],
                }
            for _ in range(2):
                for name, items in calls.items():
                    await self.embed(self._warm_key(answer, word), items)
                    if name not in shapes:
                        shapes.append(name)
        return WarmUp(time.perf_counter() - started, tuple(shapes))

    def _warm_key(self, answer: Answer, query: str):
        keys = {
            Answer.EMBEDDINGS: lambda: SENTENCES,
            Answer.SPARSE: lambda: Sparse(),
            Answer.RERANK: lambda: self.rerank_key(query, None, None, None),
        }
        return keys[answer]()

    async def stop(self) -> None:
        await self.batcher.stop()

    async def embed(self, key, texts: list[Text]) -> tuple:
        """(one result per text, token counts[, cut flags]) for `key`'s kind of call; QueueFull, or the library's
        ValueError / TypeError refusing a text."""
        tokens = sum(len(t.split()) if isinstance(t, str) else len(t) for t in texts) + 2 * len(texts)
        return await self.batcher.submit(key, texts, tokens)

    def sentences_key(self, prompt: str | None = None, prompt_name: str | None = None) -> Sentences:
        """The key of sentence requests with this prompt; the folder's prompts' ValueError / TypeError for a bad one
        (an unknown name, both given), before anything queues."""
        self.fz.prompts.resolve(prompt, prompt_name)
        return Sentences(prompt, prompt_name)

    def sparse_key(self, prompt: str | None = None, prompt_name: str | None = None) -> Sparse:
        """The key of /embed_sparse requests with this prompt; the sparse folder's prompts' ValueError / TypeError for
        a bad one, before anything queues (the sparse model must be loaded)."""
        self.sparse.prompts.resolve(prompt, prompt_name)
        return Sparse(prompt, prompt_name)

    def rerank_key(self, query: str, top_n: int | None, prompt: str | None, prompt_name: str | None) -> Rerank:
        return Rerank(next(self._requests), query, top_n, prompt, prompt_name)

    def view(self, key: Words):
        """The Featurizer for `key`, sharing the model (nothing reloaded); a ValueError names a bad option."""
        if key not in self.views:
            layers = list(key.layers) if isinstance(key.layers, tuple) else key.layers
            view = self.fz.with_layers(layers)
            if key.pooling != view.pooling:
                view = copy.copy(view)
                view.pooling = key.pooling
            self.views[key] = view
        return self.views[key]

    def windowed(self, counts: list[int], featurizer=None) -> list[int]:
        """Indices of the texts longer than one window of `featurizer` (default: the served one), of `counts` pieces
        each: windowed here, cut elsewhere."""
        window = (featurizer or self.fz).plan.window_size
        return [i for i, n in enumerate(counts) if n > window]

    # ---- on a worker thread, holding the model's turn ---------------------------------------------------------

    def featurizer(self, key, step: Step | None):
        """The Featurizer for `key`, on a copy that runs the step's batches when given (`stepping`)."""
        return stepping(self.view(key), step)

    def _run(self, key, texts: list[Text], step: Step | None):
        return key.run(self, texts, step)


@dataclass(frozen=True)
class WarmUp:
    """What `EmbeddingService.warm_up` ran: its seconds and the shapes (each twice, for every model held)."""

    seconds: float
    shapes: tuple[str, ...]

    def describe(self) -> str:
        return f"warmed up in {self.seconds:.1f} s ({', '.join(self.shapes)}; each twice)"


def make_service(
    model: str,
    *,
    layers: int | list[int] | str = -1,
    pooling: str = "mean",
    sentence_pooling: str = "auto",
    normalize: bool = False,
    device: str | None = None,
    precision: str | None = None,
    backend: str = "torch",
    threads: int | None = None,
    batch_tokens: int | None = None,
    config: ServeConfig | None = None,
    reranker: str | None = None,
    sparse_model: str | None = None,
    model_kind: str | None = None,
) -> EmbeddingService:
    """Load the model once and wrap it for serving, by what its folder is (serve/kinds.py's FOLDER_KINDS, or the
    row `model_kind` names): a sentence-embedding model serves the embedding routes, a reranker folder (a
    cross-encoder, an LLM reranker, a pair model `ctxrep finetune` trained) /rerank and /v1/rerank, a SPLADE folder
    /embed_sparse, BGE-M3 the embedding routes and /embed_sparse. sentence_pooling="auto": the folder's own pooling
    where it has a sentence-transformers modules.json, else the mean of the word vectors. reranker: a reranker folder
    or name (`ctxrep.rerank.load_reranker`) served beside the model at /rerank and /v1/rerank. sparse_model: a SPLADE
    or BGE-M3 folder or name (`ctxrep.vectors.sparse.SparseEncoder`) for /embed_sparse."""
    from ctxrep.featurize import Featurizer

    kind = folder_kind(model, model_kind)
    for flag, given, answer in (
        ("--reranker", reranker, Answer.RERANK),
        ("--sparse-model", sparse_model, Answer.SPARSE),
    ):
        if given is not None and answer in kind.answers:
            raise ValueError(
                f"{flag} {given}: the model {model} is {kind.what} already, which serves {answer.value}; give one"
            )
    given = {  # an option given, and what reads it
        "--layers": (layers != -1, (Answer.EMBEDDINGS,)),
        "--sentence-pooling": (sentence_pooling != "auto", (Answer.EMBEDDINGS,)),
        "--normalize": (normalize, (Answer.EMBEDDINGS,)),
        "--precision": (precision is not None, (Answer.EMBEDDINGS, Answer.SPARSE)),
        "--backend": (backend != "torch", (Answer.EMBEDDINGS, Answer.SPARSE)),
    }
    unread = [flag for flag, (on, readers) in given.items() if on and not set(readers) & set(kind.answers)]
    if unread:
        raise ValueError(
            f"{', '.join(unread)}: the model {model} is {kind.what}, which serves "
            f"{' and '.join(a.value for a in kind.answers)} and does not read {'it' if len(unread) == 1 else 'them'}; "
            "leave them out"
        )
    if Answer.EMBEDDINGS not in kind.answers:
        if threads is not None:
            import torch

            torch.set_num_threads(threads)
    fz = None
    if Answer.EMBEDDINGS in kind.answers:
        fz = Featurizer(  # by name: the precision decides the dtype the weights load in (precision=None: as saved)
            model,
            layers=layers,
            pooling=pooling,
            sentence_pooling=sentence_pooling,
            device=device,
            precision=precision,
            backend=backend,
            num_threads=threads,
            batch_tokens=batch_tokens,
        )
    reranker = model if Answer.RERANK in kind.answers else reranker
    loaded_reranker = None
    if reranker is not None:
        from ctxrep.rerank import load_reranker

        loaded_reranker = load_reranker(reranker, device=device)
    sparse_model = model if Answer.SPARSE in kind.answers else sparse_model
    sparse = None
    if sparse_model is not None:
        from ctxrep.vectors.sparse import SparseEncoder

        if sparse_model is model and fz is not None:  # BGE-M3: the sparse head reads the served model's states
            sparse = SparseEncoder(fz)
        else:
            sparse = SparseEncoder(sparse_model, device=device, precision=precision, backend=backend)
    return EmbeddingService(
        fz,
        str(model),
        config,
        normalize=normalize,
        reranker=loaded_reranker,
        reranker_name=reranker and str(reranker),
        sparse=sparse,
        sparse_name=sparse_model and str(sparse_model),
    )


def api_key_from(value: str | None) -> str | None:
    """--api-key, else the CTXREP_API_KEY environment variable; an empty key is refused."""
    key = value if value is not None else os.environ.get(API_KEY_ENV)
    if key is not None and not key.strip():
        raise ValueError(f"the API key is empty; give a non-empty --api-key or unset {API_KEY_ENV}")
    return key
