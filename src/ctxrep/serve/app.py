"""`ctxrep serve`'s routes (FastAPI): each parses its request, calls the service, and answers in its API's schema.

Routes:
  POST /v1/embeddings        OpenAI's schema: {"model", "input": str | [str], "encoding_format": "float"|"base64",
                             "dimensions": the first N coordinates, unit length (vectors.quantize.truncate)}
                             -> {"object": "list", "data": [{"object": "embedding", "index", "embedding"}], "model",
                             "usage": {"prompt_tokens", "total_tokens"}, "windowed", "cut"}; the official `openai` client works
                             with base_url="http://127.0.0.1:8080/v1".
  GET  /v1/models            OpenAI's model list (the one served model); GET /v1/models/{id} that model
  POST /embed                text-embeddings-inference's schema: {"inputs": str | [str], "normalize": true,
                             "prompt_name", "dimensions": the first N coordinates (unit length when normalize)}
                             -> [[...]]
  /v1/embeddings and /embed take "prompt" (text before each input) or "prompt_name" (the folder's prompts); none: the
  folder's default prompt, as sentence-transformers' encode (Featurizer.embed_sentences(prompt=, prompt_name=)).
  POST /embed_sparse         text-embeddings-inference's: {"inputs", "prompt_name", "prompt"} -> [[{"index", "value"}]]
                             per text (a SPLADE --model, BGE-M3, or --sparse-model MODEL:
                             `ctxrep.vectors.sparse.SparseEncoder`; prompts as /embed's, from the sparse model's folder)
  POST /rerank               text-embeddings-inference's: {"query", "texts", "return_text"} -> [{"index", "score"}]
                             best first (a reranker --model, or --reranker MODEL: a cross-encoder, an LLM reranker or
                             a pair model `ctxrep finetune` trained)
  POST /v1/rerank            Cohere's and Jina's: {"query", "documents": [str | {"text"}], "top_n",
                             "return_documents"} -> {"id", "model", "results": [{"index", "relevance_score",
                             "document"}], "usage", "cut"} (as /rerank); both take "prompt" / "prompt_name"; the
                             indices count the request's documents from 0 (the reranker's Hits.ids)
  POST /v1/word-embeddings   ctxrep's own: {"input", "layers": -1 | [..] | "all" | "mix", "pooling", "encoding_format"}
                             -> {"data": [{"index", "words", "embeddings", "shape"}], "model", "usage", "windowed", "cut"}
  GET  /health               {"status": "ok", "model", "dim"}  (no key needed)
  GET  /metrics              Prometheus text format

`windowed` ({"count", "indices"}) names the texts longer than the model's window: ctxrep windows them where other
servers cut them; `cut` the texts the Featurizer did cut (a word longer than a whole window keeps its first pieces,
`Featurizer.cut_texts`). A reranker reads a (query, document) pair in one window and cuts a longer one as
sentence-transformers does: /v1/rerank's `cut` names those documents (by their index in the request; the reranker's
`cut_texts`). TEI's routes answer bare lists, so they carry these in headers (x-windowed-count, x-windowed-indices,
x-cut-count, x-cut-indices; /rerank: the cut ones only).
Which routes answer follows what the server holds (serve/kinds.py: the folder kinds and their routes); a route the
loaded models cannot answer is a 404 naming what the server holds and the folder kind the route needs.
Errors come in each route's own schema (`ctxrep.serve.errors`): a full queue 503 with Retry-After, a request over
the limits 413 naming the limit, malformed JSON or wrong types 422 with a one-line reason, a body that is not JSON
415, a wrong method 405, an unknown path 404, with an API key a request without it 401.
No route reads or writes a file named in a request: the model is fixed when the server starts.
"""

from __future__ import annotations

import base64
import hmac
import logging
import time
import uuid
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

from ctxrep.rerank.ranking import check_rerank_args
from ctxrep.serve.batcher import QueueFull
from ctxrep.serve.errors import BODY_OPTION, BodyLimit, RequestError, error_body, validation_message
from ctxrep.serve.kinds import Answer
from ctxrep.serve.service import EmbeddingService, Text, Words
from ctxrep.util.arrays import normalize_rows
from ctxrep.vectors.quantize import truncate

ACCESS_LOG = logging.getLogger("ctxrep.serve.access")  # one line per request, when a handler is attached

# ---- request bodies -------------------------------------------------------------------------------------------


class OpenAIRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    input: str | list[str]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None
    prompt: str | None = None  # ctxrep's: text before each input (the openai client sends it in extra_body)
    prompt_name: str | None = None  # ctxrep's: one of the folder's prompts (config_sentence_transformers.json)


class TEIRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    inputs: str | list[str]
    normalize: bool = True
    truncate: bool = False
    dimensions: int | None = None
    prompt_name: str | None = None
    prompt: str | None = None


class WordRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    input: str | list[str] | list[list[str]]
    model: str | None = None
    layers: int | list[int] | Literal["all", "mix"] = -1
    pooling: Literal["first", "last", "mean", "first_last"] | None = None  # None: the server's pooling
    encoding_format: Literal["float", "base64"] = "float"


class TEISparseRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    inputs: str | list[str]
    truncate: bool = False
    prompt_name: str | None = None
    prompt: str | None = None


class TEIRerankRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    query: str
    texts: list[str]
    raw_scores: bool = False
    return_text: bool = False
    truncate: bool = False
    prompt: str | None = None
    prompt_name: str | None = None


class RerankDocument(BaseModel):
    model_config = ConfigDict(extra="ignore")
    text: str


class RerankRequest(BaseModel):  # Cohere's and Jina's
    model_config = ConfigDict(extra="ignore")
    query: str
    documents: list[str | RerankDocument]
    model: str | None = None
    top_n: int | None = None
    return_documents: bool = False
    prompt: str | None = None
    prompt_name: str | None = None


def encode(vector: np.ndarray, encoding_format: str) -> list | str:
    if encoding_format == "base64":  # OpenAI's: the little-endian float32 bytes, base64
        return base64.b64encode(np.ascontiguousarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return vector.astype(np.float32).tolist()


def _is_unicode(text: str | list[str]) -> bool:
    """False for a string holding a lone surrogate (JSON's "\\ud800" escape parses into one; UTF-8 cannot hold it)."""
    try:
        for part in [text] if isinstance(text, str) else text:
            part.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _words(text: Text) -> list[str]:
    return text.split() if isinstance(text, str) else list(text)


# ---- what every route shares ----------------------------------------------------------------------------------


class Handlers:
    """The checks and the call to the service that every route makes."""

    def __init__(self, service: EmbeddingService) -> None:
        self.service = service
        self.config = service.config

    def require(self, answer: Answer) -> None:
        """A 404 naming what the server holds and the folder kind the route needs, when it cannot answer it."""
        message = self.service.missing(answer)
        if message is not None:
            raise RequestError(404, message, "model_not_found")

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.service.name:
            raise RequestError(
                404, f"model {model!r} is not served here; this server serves {self.service.name!r}", "model_not_found"
            )

    def texts_of(self, value: str | list, field_name: str) -> list[Text]:
        """The request's texts (strings, or word lists), checked against the limits."""
        config = self.config
        items = [value] if isinstance(value, str) else list(value)
        if not items:
            raise RequestError(422, f"{field_name}: an empty list; send at least one text")
        if len(items) > config.max_texts:
            raise RequestError(
                413,
                f"{field_name}: {len(items):,} texts; the limit is {config.max_texts:,} per request "
                "(--max-texts, ServeConfig.max_texts)",
                "request_too_large",
            )
        out = []
        for i, item in enumerate(items):
            where = field_name if isinstance(value, str) else f"{field_name}[{i}]"  # a lone string: no index
            chars = len(item) if isinstance(item, str) else sum(len(w) + 1 for w in item)
            if chars > config.max_text_chars:
                raise RequestError(
                    413,
                    f"{where}: {chars:,} characters; the limit is {config.max_text_chars:,} per text "
                    "(--max-text-chars, ServeConfig.max_text_chars)",
                    "request_too_large",
                )
            if not _is_unicode(item):
                raise RequestError(422, f"{where}: not valid Unicode (a lone surrogate escape); send UTF-8 text")
            words = item.split() if isinstance(item, str) else list(item)
            if not words or any(not w or w.isspace() for w in words):
                raise RequestError(422, f"{where}: an empty text or an empty word; send some text")
            out.append(item)
        return out

    async def embed(self, key, texts: list[Text]):
        """(vectors, token counts) from the service, its refusals as RequestErrors."""
        try:
            return await self.service.embed(key, texts)
        except QueueFull:
            raise RequestError(
                503,
                f"the server is busy ({self.service.queued_texts:,} texts queued, limit "
                f"{self.config.max_queue_texts:,}: --max-queue, ServeConfig.max_queue_texts); retry",
                "server_busy",
                headers={"Retry-After": str(self.config.retry_after_s)},
            ) from None
        except (ValueError, TypeError) as e:  # the Featurizer refused a text
            raise RequestError(422, str(e).splitlines()[0]) from None

    def check_dimensions(self, dimensions: int | None) -> None:
        """A request's `dimensions` checked before the model runs: one layer served, at most the vectors' width."""
        if dimensions is None:
            return
        if not self.service.fz.single_layer:
            raise RequestError(422, "dimensions: this server returns several layers per text; ask without it")
        try:  # the library's own check, on a row of zeros
            truncate(np.zeros((1, self.service.dim), np.float32), dimensions)
        except ValueError as e:
            raise RequestError(422, f"dimensions: {e}") from None

    def sentences_key(self, prompt: str | None, prompt_name: str | None):
        try:
            return self.service.sentences_key(prompt, prompt_name)
        except (ValueError, TypeError) as e:
            raise RequestError(422, str(e).splitlines()[0]) from None

    def sparse_key(self, prompt: str | None, prompt_name: str | None):
        try:
            return self.service.sparse_key(prompt, prompt_name)
        except (ValueError, TypeError) as e:
            raise RequestError(422, str(e).splitlines()[0]) from None

    async def rerank(
        self, query: str, documents: list[str], field_name: str, top_n=None, prompt=None, prompt_name=None
    ):
        """(Hits best first: ids = the documents' positions, total tokens, {"cut": the documents cut to fit}) from
        the service's reranker; refusals as RequestErrors."""
        self.require(Answer.RERANK)
        reranker = self.service.reranker
        self.texts_of(query, "query")
        documents = self.texts_of(documents, field_name)
        try:  # the library's own checks, before the request waits for the model
            check_rerank_args(query, documents, top_n)
            reranker.prompts.resolve(prompt, prompt_name)
        except (ValueError, TypeError) as e:
            raise RequestError(422, str(e).splitlines()[0]) from None
        key = self.service.rerank_key(query, top_n, prompt, prompt_name)
        ranked, counts, cut = await self.embed(key, documents)
        return ranked, int(sum(counts)), {"cut": flagged(cut)}

    def long_texts(self, counts: list[int], cut: list[bool], featurizer=None) -> dict:
        """{"windowed": texts longer than one window (windowed here, cut by servers that truncate), "cut": texts the
        Featurizer cut (a word longer than a whole window keeps its first pieces)}, each {"count", "indices"}."""
        windowed = self.service.windowed(counts, featurizer)
        return {"windowed": {"count": len(windowed), "indices": windowed}, "cut": flagged(cut)}


def flagged(flags: list[bool]) -> dict:
    """{"count", "indices"} of the texts whose flag is set."""
    indices = [i for i, flag in enumerate(flags) if flag]
    return {"count": len(indices), "indices": indices}


def long_text_headers(report: dict) -> dict[str, str]:
    """TEI's answers are bare lists: the long texts' report goes in headers (x-windowed-count, x-windowed-indices,
    x-cut-count, x-cut-indices; the indices only when there are some)."""
    headers = {}
    for name, part in report.items():
        headers[f"x-{name}-count"] = str(part["count"])
        if part["indices"]:
            headers[f"x-{name}-indices"] = ",".join(map(str, part["indices"]))
    return headers


# ---- the routes, by API ---------------------------------------------------------------------------------------


def openai_routes(app, h: Handlers, started: int) -> None:
    service = h.service

    @app.post("/v1/embeddings")
    async def openai_embeddings(body: OpenAIRequest):
        h.require(Answer.EMBEDDINGS)
        h.check_model(body.model)
        h.check_dimensions(body.dimensions)
        key = h.sentences_key(body.prompt, body.prompt_name)
        texts = h.texts_of(body.input, "input")
        vectors, counts, cut = await h.embed(key, texts)
        if body.dimensions is not None:  # OpenAI's: the first `dimensions` coordinates, unit length
            vectors = truncate(vectors, body.dimensions)
        elif service.normalize:
            vectors = normalize_rows(vectors)
        tokens = int(sum(counts))
        data = [
            {"object": "embedding", "index": i, "embedding": encode(v, body.encoding_format)}
            for i, v in enumerate(vectors)
        ]
        return {
            "object": "list",
            "data": data,
            "model": service.name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        } | h.long_texts(counts, cut)

    names = [name for name, _ in service.parts().values()]
    models = {name: {"id": name, "object": "model", "created": started, "owned_by": "ctxrep"} for name in names}

    @app.get("/v1/models")
    async def list_models():
        return {"object": "list", "data": list(models.values())}

    @app.get("/v1/models/{model_id:path}")
    async def one_model(model_id: str):
        if model_id not in models:
            raise RequestError(
                404, f"model {model_id!r} is not served here; this server serves {', '.join(map(repr, models))}",
                "model_not_found",
            )  # fmt: skip
        return models[model_id]

    @app.post("/v1/rerank")
    async def rerank(body: RerankRequest):
        if body.model is not None and body.model != service.reranker_name and service.reranker is not None:
            raise RequestError(
                404, f"model {body.model!r} is not served here; the reranker is {service.reranker_name!r}",
                "model_not_found",
            )  # fmt: skip
        documents = [d if isinstance(d, str) else d.text for d in body.documents]
        ranked, tokens, cut = await h.rerank(
            body.query, documents, "documents", body.top_n, body.prompt, body.prompt_name
        )
        results = [
            {"index": i, "relevance_score": score} | ({"document": {"text": text}} if body.return_documents else {})
            for i, text, score in zip(ranked.ids, ranked.texts, ranked.scores.tolist())
        ]
        return {
            "id": uuid.uuid4().hex,
            "model": service.reranker_name,
            "results": results,
            "usage": {"total_tokens": tokens},
        } | cut


def tei_routes(app, h: Handlers) -> None:
    from fastapi.responses import JSONResponse

    @app.post("/embed")
    async def tei_embed(body: TEIRequest):
        h.require(Answer.EMBEDDINGS)
        h.check_dimensions(body.dimensions)
        key = h.sentences_key(body.prompt, body.prompt_name)
        texts = h.texts_of(body.inputs, "inputs")
        vectors, counts, cut = await h.embed(key, texts)
        if body.dimensions is not None:  # TEI's: the first `dimensions` coordinates, then normalised when asked
            vectors = truncate(vectors, body.dimensions, normalize=body.normalize)
        elif body.normalize:
            vectors = normalize_rows(vectors)
        return JSONResponse([v.tolist() for v in vectors], headers=long_text_headers(h.long_texts(counts, cut)))

    @app.post("/embed_sparse")
    async def tei_embed_sparse(body: TEISparseRequest):
        h.require(Answer.SPARSE)
        sparse = h.service.sparse
        key = h.sparse_key(body.prompt, body.prompt_name)
        texts = h.texts_of(body.inputs, "inputs")
        vectors, counts, cut = await h.embed(key, texts)
        report = h.long_texts(counts, cut, featurizer=sparse.featurizer)
        return JSONResponse([v.to_tei() for v in vectors], headers=long_text_headers(report))

    @app.post("/rerank")
    async def tei_rerank(body: TEIRerankRequest):
        if body.raw_scores:
            raise RequestError(
                422,
                "raw_scores: this server answers the reranker's scores after its activation; raw ones are not served",
            )
        ranked, _, cut = await h.rerank(body.query, body.texts, "texts", None, body.prompt, body.prompt_name)
        answer = [
            {"index": i, "score": score} | ({"text": text} if body.return_text else {})
            for i, text, score in zip(ranked.ids, ranked.texts, ranked.scores.tolist())
        ]
        return JSONResponse(answer, headers=long_text_headers(cut))


def ctxrep_routes(app, h: Handlers) -> None:
    service = h.service

    @app.post("/v1/word-embeddings")
    async def word_embeddings(body: WordRequest):
        h.require(Answer.EMBEDDINGS)
        h.check_model(body.model)
        pooling = body.pooling or service.fz.pooling
        layers = tuple(body.layers) if isinstance(body.layers, list) else body.layers  # hashable: a batch key
        key = Words(layers, pooling)
        try:
            service.view(key)
        except ValueError as e:
            raise RequestError(422, f"layers: {e}") from None
        texts = h.texts_of(body.input, "input")
        arrays, counts, cut = await h.embed(key, texts)
        tokens = int(sum(counts))
        data = [
            {"index": i, "words": _words(text), "shape": list(a.shape), "embeddings": encode(a, body.encoding_format)}
            for i, (text, a) in enumerate(zip(texts, arrays))
        ]
        return {
            "object": "list",
            "data": data,
            "model": service.name,
            "layers": body.layers,
            "pooling": pooling,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        } | h.long_texts(counts, cut)


def operations_routes(app, service: EmbeddingService) -> None:
    from fastapi.responses import PlainTextResponse

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": service.name, "dim": service.dim, "queued_texts": service.queued_texts}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(service.metrics.render(service.name), media_type="text/plain; version=0.0.4")


# ---- errors, keys and limits for every route ------------------------------------------------------------------


def error_handlers(app) -> None:
    """Every error in the schema of the path it was sent to: FastAPI's own (404, 405, 422) included."""
    from fastapi import Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException

    def answer(request: Request, status: int, message: str, kind: str, headers=None) -> JSONResponse:
        return JSONResponse(error_body(request.url.path, status, message, kind), status_code=status, headers=headers)

    @app.exception_handler(RequestError)
    async def request_error(request: Request, exc: RequestError):
        return answer(request, exc.status, exc.message, exc.kind, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError):
        return answer(request, 422, validation_message(exc.errors()), "invalid_request_error")

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):
        where = f"{request.method} {request.url.path}"
        allowed = {k.lower(): v for k, v in (exc.headers or {}).items()}.get("allow", "another method")
        messages = {
            400: f"{where}: the body is not JSON text in UTF-8",
            404: f"{where}: no such route; see the routes in `ctxrep serve --help`",
            405: f"{where}: method not allowed; use {allowed}",
        }
        kinds = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}
        message = messages.get(exc.status_code, str(exc.detail))
        return answer(
            request, exc.status_code, message, kinds.get(exc.status_code, "invalid_request_error"), exc.headers
        )

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception):
        message = f"internal error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return answer(request, 500, message, "server_error")


JSON_TYPES = ("application/json",)


def guard(app, service: EmbeddingService) -> None:
    """The API key, the body's size and type before a route runs; metrics and the access log after it."""
    from fastapi import Request
    from fastapi.responses import JSONResponse

    config = service.config

    def refuse(path: str, status: int, message: str, kind: str) -> JSONResponse:
        return JSONResponse(error_body(path, status, message, kind), status_code=status)

    @app.middleware("http")
    async def check(request: Request, call_next):
        start = time.perf_counter()
        path = request.url.path
        response = None
        if config.api_key is not None and path != "/health":
            header = request.headers.get("authorization", "")
            scheme, _, token = header.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), config.api_key.encode()):
                message = "missing or wrong API key: send it as 'Authorization: Bearer KEY'"
                response = refuse(path, 401, message, "authentication_error")
                response.headers["WWW-Authenticate"] = "Bearer"
        length = request.headers.get("content-length")
        if response is None and length is not None and length.isdigit() and int(length) > config.max_body_bytes:
            message = (
                f"request body of {int(length):,} bytes is over the limit of {config.max_body_bytes:,} bytes "
                f"({BODY_OPTION})"
            )
            response = refuse(path, 413, message, "request_too_large")
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if response is None and request.method == "POST" and content_type and content_type not in JSON_TYPES:
            message = f"a body of type {content_type!r}: send JSON with 'Content-Type: application/json'"
            response = refuse(path, 415, message, "invalid_request_error")
        if response is None:
            response = await call_next(request)
        seconds = time.perf_counter() - start
        service.metrics.request(path, response.status_code, seconds)
        if ACCESS_LOG.isEnabledFor(logging.INFO):
            client = f"{request.client.host}:{request.client.port}" if request.client else "-"
            ACCESS_LOG.info('%s "%s %s" %d %.1f ms', client, request.method, path, response.status_code, 1000 * seconds)
        return response


def build_app(service: EmbeddingService):
    """The FastAPI application serving `service`: its routes, error handlers and guard."""
    from fastapi import FastAPI

    async def lifespan(app):
        await service.start()
        yield
        await service.stop()

    app = FastAPI(title="ctxrep embedding server", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.add_middleware(BodyLimit, limit=service.config.max_body_bytes)
    error_handlers(app)
    guard(app, service)
    handlers = Handlers(service)
    openai_routes(app, handlers, started=int(time.time()))
    tei_routes(app, handlers)
    ctxrep_routes(app, handlers)
    operations_routes(app, service)
    return app
