"""`ctxrep serve`: an embedding server over the Featurizer (FastAPI + uvicorn; the optional extra `ctxrep[serve]`).

Endpoints:
  POST /v1/embeddings        OpenAI's schema: {"model", "input": str | [str], "encoding_format": "float"|"base64"}
                             -> {"object": "list", "data": [{"object": "embedding", "index", "embedding"}], "model",
                             "usage": {"prompt_tokens", "total_tokens"}}; the official `openai` client works with
                             base_url="http://127.0.0.1:8080/v1".
  POST /embed                text-embeddings-inference's schema: {"inputs": str | [str], "normalize": true} -> [[...]]
  POST /v1/word-embeddings   ctxrep's own: {"input", "layers": -1 | [..] | "all" | "mix", "pooling", "encoding_format"}
                             -> {"data": [{"index", "words", "embeddings", "shape"}], "model", "usage"}
  GET  /health               {"status": "ok", "model", "dim"}  (no key needed)
  GET  /metrics              Prometheus text format

The server's own logic is queueing and batching; every vector comes from `Featurizer.embed_sentences` /
`embed_words` (texts longer than the model's window are windowed as the Featurizer does, never truncated).
Concurrent requests wait in one queue; a batcher task takes the requests with the same options, in arrival order,
up to a token budget (or waits at most `max_wait_ms` for more), and runs them as one Featurizer call on one
inference thread. A full queue answers 503 with Retry-After; a request over the limits 413 naming the limit;
malformed JSON or wrong types 422 with a one-line reason; with an API key, a request without it 401.
No endpoint reads or writes a file named in a request: the model is fixed when the server starts.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import hmac
import os
import threading
import time
from collections import defaultdict, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

from ctxrep.util.arrays import normalize_rows

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
    api_key: str | None = None
    retry_after_s: int = 1


class QueueFull(Exception):
    pass


@dataclass
class _Item:
    kind: str  # "sentences" or "words"
    key: tuple  # the options that must agree for items to share a Featurizer call
    texts: list[list[str]]
    tokens: int
    future: asyncio.Future
    arrived: float = field(default_factory=time.monotonic)


class Metrics:
    """Counters and sums, written in Prometheus' text format."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: dict[tuple[str, int], int] = defaultdict(int)
        self.latency_sum: dict[str, float] = defaultdict(float)
        self.latency_count: dict[str, int] = defaultdict(int)
        self.texts = 0
        self.tokens = 0
        self.batches = 0
        self.batch_texts = 0
        self.inference_seconds = 0.0
        self.queued_texts = 0

    def request(self, endpoint: str, status: int, seconds: float) -> None:
        with self.lock:
            self.requests[(endpoint, status)] += 1
            self.latency_sum[endpoint] += seconds
            self.latency_count[endpoint] += 1

    def render(self, model: str) -> str:
        lines = [
            "# HELP ctxrep_requests_total HTTP requests by endpoint and status code.",
            "# TYPE ctxrep_requests_total counter",
        ]
        with self.lock:
            for (endpoint, status), n in sorted(self.requests.items()):
                lines.append(f'ctxrep_requests_total{{endpoint="{endpoint}",status="{status}"}} {n}')
            lines += [
                "# HELP ctxrep_request_seconds Time from a request's arrival to its answer.",
                "# TYPE ctxrep_request_seconds summary",
            ]
            for endpoint in sorted(self.latency_count):
                lines.append(f'ctxrep_request_seconds_sum{{endpoint="{endpoint}"}} {self.latency_sum[endpoint]:.6f}')
                lines.append(f'ctxrep_request_seconds_count{{endpoint="{endpoint}"}} {self.latency_count[endpoint]}')
            for name, kind, value, text in (
                ("ctxrep_texts_total", "counter", self.texts, "Texts embedded."),
                ("ctxrep_tokens_total", "counter", self.tokens, "Subword tokens of the texts embedded."),
                ("ctxrep_batches_total", "counter", self.batches, "Featurizer calls (merged batches)."),
                ("ctxrep_batch_texts_total", "counter", self.batch_texts, "Texts in those calls (mean = /batches)."),
                ("ctxrep_inference_seconds_total", "counter", self.inference_seconds, "Time in Featurizer calls."),
                ("ctxrep_queue_texts", "gauge", self.queued_texts, "Texts waiting for the model."),
            ):
                lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", f"{name} {value}"]
        lines += ["# HELP ctxrep_model_info The served model.", "# TYPE ctxrep_model_info gauge"]
        lines.append(f'ctxrep_model_info{{model="{model}"}} 1')
        return "\n".join(lines) + "\n"


class EmbeddingService:
    """The model, the queue and the batcher: what the HTTP handlers call."""

    def __init__(self, featurizer, name: str, config: ServeConfig | None = None, normalize: bool = False) -> None:
        if featurizer.normalize:
            raise ValueError(
                "give the service a Featurizer with normalize=False and EmbeddingService(normalize=True): /embed "
                "normalizes per request"
            )
        self.fz = featurizer
        self.name = name
        self.normalize = normalize  # /v1/embeddings returns unit-length vectors (--normalize)
        self.config = config or ServeConfig()
        self.metrics = Metrics()
        self.queue: deque[_Item] = deque()
        self.queued_texts = 0
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ctxrep-inference")
        self.views: dict[tuple, Any] = {}
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._stopping = False

    @property
    def dim(self) -> int:
        return self.fz.sentence_dim

    # ---- lifecycle --------------------------------------------------------------------------------------------

    async def start(self) -> None:
        self._wakeup = asyncio.Event()
        self._stopping = False
        self._task = asyncio.create_task(self._batcher())

    async def stop(self) -> None:
        """Finish what is queued, then stop the batcher (the server has stopped taking requests)."""
        self._stopping = True
        if self._wakeup is not None:
            self._wakeup.set()
        if self._task is not None:
            await self._task
        self.executor.shutdown(wait=True)

    # ---- submitting -------------------------------------------------------------------------------------------

    async def submit(self, kind: str, key: tuple, texts: list[list[str]]) -> Any:
        if self.queued_texts + len(texts) > self.config.max_queue_texts:
            raise QueueFull
        loop = asyncio.get_running_loop()
        tokens = sum(len(w) for w in texts) + 2 * len(texts)
        item = _Item(kind, key, texts, tokens, loop.create_future())
        self.queue.append(item)
        self.queued_texts += len(texts)
        self.metrics.queued_texts = self.queued_texts
        self._wakeup.set()
        return await item.future

    async def _batcher(self) -> None:
        loop = asyncio.get_running_loop()
        wait = self.config.max_wait_ms / 1000
        while True:
            if not self.queue:
                if self._stopping:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            first = self.queue[0]
            # wait (at most `wait` after the first request arrived) while the batch is below the budget
            while not self._stopping:
                pending = sum(i.tokens for i in self.queue if i.kind == first.kind and i.key == first.key)
                left = first.arrived + wait - time.monotonic()
                if pending >= self.config.max_batch_tokens or left <= 0:
                    break
                self._wakeup.clear()
                try:
                    await asyncio.wait_for(self._wakeup.wait(), timeout=left)
                except TimeoutError:
                    break
            batch, rest, tokens = [], deque(), 0
            for item in self.queue:
                same = item.kind == first.kind and item.key == first.key
                if same and (not batch or tokens + item.tokens <= self.config.max_batch_tokens):
                    batch.append(item)
                    tokens += item.tokens
                else:
                    rest.append(item)
            self.queue = rest
            texts = [t for item in batch for t in item.texts]
            self.queued_texts -= len(texts)
            self.metrics.queued_texts = self.queued_texts
            start = time.perf_counter()
            try:
                results, counts = await loop.run_in_executor(self.executor, self._run, first.kind, first.key, texts)
            except Exception as e:  # the Featurizer refused the batch
                if len(batch) == 1:
                    if not batch[0].future.done():
                        batch[0].future.set_exception(e)
                    continue
                # several requests were merged: run each alone, so that only the one it refused gets the reason
                for item in batch:
                    try:
                        result = await loop.run_in_executor(self.executor, self._run, first.kind, first.key, item.texts)
                    except Exception as refused:
                        if not item.future.done():
                            item.future.set_exception(refused)
                    else:
                        if not item.future.done():
                            item.future.set_result(result)
                continue
            seconds = time.perf_counter() - start
            with self.metrics.lock:
                self.metrics.batches += 1
                self.metrics.batch_texts += len(texts)
                self.metrics.texts += len(texts)
                self.metrics.tokens += int(sum(counts))
                self.metrics.inference_seconds += seconds
            at = 0
            for item in batch:
                n = len(item.texts)
                if not item.future.done():  # a client that went away leaves a cancelled future
                    item.future.set_result((results[at : at + n], counts[at : at + n]))
                at += n

    # ---- on the inference thread ------------------------------------------------------------------------------

    def view(self, key: tuple):
        """The Featurizer for word requests with these (layers, pooling), sharing the model (nothing reloaded)."""
        if key not in self.views:
            layers, pooling = key
            view = self.fz.with_layers(list(layers) if isinstance(layers, tuple) else layers)
            if pooling != view.pooling:
                view = copy.copy(view)
                view.pooling = pooling
            self.views[key] = view
        return self.views[key]

    def _run(self, kind: str, key: tuple, texts: list[list[str]]):
        counts = self.token_counts(texts)
        if kind == "sentences":
            vectors = self.fz.embed_sentences(texts)
            return vectors, counts
        return self.view(key).embed_words(texts), counts

    def token_counts(self, texts: list[list[str]]) -> list[int]:
        """Subword pieces per text (OpenAI's `usage`), without special tokens; words for a word-level model."""
        if self.fz.tokenizer.word_level:
            return [len(t) for t in texts]
        return [len(p.tokens) for p in self.fz.tokenizer.encode_words(texts)]


# ---- the HTTP layer -------------------------------------------------------------------------------------------


class OpenAIRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    input: str | list[str]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None


class TEIRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    inputs: str | list[str]
    normalize: bool = True
    truncate: bool = False


class WordRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    input: str | list[str] | list[list[str]]
    model: str | None = None
    layers: int | list[int] | Literal["all", "mix"] = -1
    pooling: Literal["first", "last", "mean", "first_last"] | None = None  # None: the server's pooling
    encoding_format: Literal["float", "base64"] = "float"


class RequestError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", headers=None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.headers = status, message, kind, headers or {}


def _body_too_large(limit: int):
    """The error a body over `limit` bytes raises while it is read: an HTTPException, which FastAPI's body parsing
    passes on (any other exception there becomes a 400), answered by `build_app`'s handler."""
    from starlette.exceptions import HTTPException

    class BodyTooLarge(HTTPException):
        pass

    return BodyTooLarge(413, f"request body over the limit of {limit:,} bytes")


class _BodyLimit:
    """ASGI middleware: counts the body's bytes as they arrive (a chunked upload has no Content-Length) and stops
    reading past the limit."""

    def __init__(self, app, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        received = 0

        async def limited():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise _body_too_large(self.limit)
            return message

        await self.app(scope, limited, send)


_EXPECTED = {
    "input": "a string or a list of strings",
    "inputs": "a string or a list of strings",
    "layers": "an integer, a list of integers, 'all' or 'mix'",
}


def _validation_message(errors: list[dict]) -> str:
    """pydantic's errors as one line: the field, and what it should be (one reason for a union's several)."""
    if not errors:
        return "invalid request"
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    field = loc[0] if loc else "body"
    same_field = [e for e in errors if [str(p) for p in e.get("loc", ()) if p != "body"][:1] == loc[:1]]
    if len(same_field) > 1 or field in _EXPECTED and len(loc) > 1:  # a union: every alternative failed
        got = type(first.get("input")).__name__.replace("NoneType", "null")
        return f"{field}: expected {_EXPECTED.get(field, 'another type')}, got {got}"
    return f"{'.'.join(loc) or 'body'}: {first['msg']}".replace("\n", " ")


def _encode(vector: np.ndarray, encoding_format: str) -> list | str:
    if encoding_format == "base64":  # OpenAI's: the little-endian float32 bytes, base64
        return base64.b64encode(np.ascontiguousarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return vector.astype(np.float32).tolist()


def build_app(service: EmbeddingService):
    """The FastAPI application serving `service`."""
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, PlainTextResponse

    config = service.config

    async def lifespan(app):
        await service.start()
        yield
        await service.stop()

    app = FastAPI(title="ctxrep embedding server", lifespan=lifespan, docs_url=None, redoc_url=None)

    def error_body(path: str, status: int, message: str, kind: str) -> dict:
        if path == "/embed":  # text-embeddings-inference's error shape
            return {"error": message, "error_type": kind}
        return {"error": {"message": message, "type": kind, "param": None, "code": status}}

    app.add_middleware(_BodyLimit, limit=config.max_body_bytes)

    @app.exception_handler(413)
    async def too_large(request: Request, exc):
        message = getattr(exc, "detail", None) or "request body too large"
        return JSONResponse(error_body(request.url.path, 413, message, "request_too_large"), status_code=413)

    @app.exception_handler(RequestError)
    async def request_error(request: Request, exc: RequestError):
        body = error_body(request.url.path, exc.status, exc.message, exc.kind)
        return JSONResponse(body, status_code=exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError):
        errors = exc.errors()
        first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
        if first.get("type") == "json_invalid":
            message = f"malformed JSON: {first.get('ctx', {}).get('error', first['msg'])}"
        else:
            message = _validation_message(errors)
        return JSONResponse(error_body(request.url.path, 422, message, "invalid_request_error"), status_code=422)

    @app.middleware("http")
    async def guard(request: Request, call_next):
        start = time.perf_counter()
        path = request.url.path
        response = None
        if config.api_key is not None and path != "/health":
            header = request.headers.get("authorization", "")
            scheme, _, token = header.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), config.api_key.encode()):
                message = "missing or wrong API key: send it as 'Authorization: Bearer KEY'"
                response = JSONResponse(error_body(path, 401, message, "authentication_error"), status_code=401)
                response.headers["WWW-Authenticate"] = "Bearer"
        length = request.headers.get("content-length")
        if response is None and length is not None and length.isdigit() and int(length) > config.max_body_bytes:
            message = f"request body of {int(length):,} bytes is over the limit of {config.max_body_bytes:,} bytes"
            response = JSONResponse(error_body(path, 413, message, "request_too_large"), status_code=413)
        if response is None:
            response = await call_next(request)
        service.metrics.request(path, response.status_code, time.perf_counter() - start)
        return response

    def check_model(model: str | None) -> None:
        if model is not None and model != service.name:
            raise RequestError(
                404, f"model {model!r} is not served here; this server serves {service.name!r}", "model_not_found"
            )

    def texts_of(value, field_name: str) -> list[list[str]]:
        items = [value] if isinstance(value, str) else list(value)
        if not items:
            raise RequestError(422, f"{field_name}: an empty list; send at least one text")
        if len(items) > config.max_texts:
            raise RequestError(
                413,
                f"{field_name}: {len(items):,} texts; the limit is {config.max_texts:,} per request",
                "request_too_large",
            )
        out = []
        for i, item in enumerate(items):
            chars = len(item) if isinstance(item, str) else sum(len(w) + 1 for w in item)
            if chars > config.max_text_chars:
                raise RequestError(
                    413,
                    f"{field_name}[{i}]: {chars:,} characters; the limit is {config.max_text_chars:,} per text",
                    "request_too_large",
                )
            words = item.split() if isinstance(item, str) else list(item)
            if not words or any(not w or w.isspace() for w in words):
                raise RequestError(422, f"{field_name}[{i}]: an empty text or an empty word; send some text")
            out.append(words)
        return out

    async def embed(kind: str, key: tuple, texts: list[list[str]]):
        try:
            return await service.submit(kind, key, texts)
        except QueueFull:
            raise RequestError(
                503,
                f"the server is busy ({service.queued_texts:,} texts queued, limit {config.max_queue_texts:,}); retry",
                "server_busy",
                headers={"Retry-After": str(config.retry_after_s)},
            ) from None
        except (ValueError, TypeError) as e:  # the Featurizer refused a text
            raise RequestError(422, str(e).splitlines()[0]) from None

    @app.post("/v1/embeddings")
    async def openai_embeddings(body: OpenAIRequest):
        check_model(body.model)
        if body.dimensions is not None and body.dimensions != service.dim:
            raise RequestError(
                422, f"dimensions: this model's vectors have {service.dim} dimensions, not {body.dimensions}"
            )
        texts = texts_of(body.input, "input")
        vectors, counts = await embed("sentences", (), texts)
        vectors = normalize_rows(vectors) if service.normalize else vectors
        tokens = int(sum(counts))
        data = [
            {"object": "embedding", "index": i, "embedding": _encode(v, body.encoding_format)}
            for i, v in enumerate(vectors)
        ]
        return {
            "object": "list",
            "data": data,
            "model": service.name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

    @app.post("/embed")
    async def tei_embed(body: TEIRequest):
        texts = texts_of(body.inputs, "inputs")
        vectors, _ = await embed("sentences", (), texts)
        vectors = normalize_rows(vectors) if body.normalize else vectors
        return [v.tolist() for v in vectors]

    @app.post("/v1/word-embeddings")
    async def word_embeddings(body: WordRequest):
        check_model(body.model)
        body.pooling = body.pooling or service.fz.pooling
        layers = tuple(body.layers) if isinstance(body.layers, list) else body.layers  # hashable: a batch key
        try:
            service.view((layers, body.pooling))
        except ValueError as e:
            raise RequestError(422, f"layers: {e}") from None
        texts = texts_of(body.input, "input")
        arrays, counts = await embed("words", (layers, body.pooling), texts)
        tokens = int(sum(counts))
        data = [
            {"index": i, "words": words, "shape": list(a.shape), "embeddings": _encode(a, body.encoding_format)}
            for i, (words, a) in enumerate(zip(texts, arrays))
        ]
        return {
            "object": "list",
            "data": data,
            "model": service.name,
            "layers": body.layers,
            "pooling": body.pooling,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": service.name, "dim": service.dim, "queued_texts": service.queued_texts}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(service.metrics.render(service.name), media_type="text/plain; version=0.0.4")

    return app


def make_service(
    model: str,
    *,
    layers: int | list[int] | str = -1,
    pooling: str = "mean",
    sentence_pooling: str = "auto",
    normalize: bool = False,
    device: str | None = None,
    precision: str = "fp32",
    backend: str = "torch",
    threads: int | None = None,
    batch_tokens: int | None = None,
    config: ServeConfig | None = None,
) -> EmbeddingService:
    """Load the model once and wrap it for serving. sentence_pooling="auto": the folder's own pooling where it has a
    sentence-transformers modules.json, else the mean of the word vectors."""
    from ctxrep.featurize import Featurizer
    from ctxrep.models.loading import load_encoder

    fz = Featurizer(
        load_encoder(model),
        layers=layers,
        pooling=pooling,
        sentence_pooling=sentence_pooling,
        device=device,
        precision=precision,
        backend=backend,
        num_threads=threads,
        batch_tokens=batch_tokens,
    )
    return EmbeddingService(fz, str(model), config, normalize=normalize)


def api_key_from(value: str | None) -> str | None:
    """--api-key, else the CTXREP_API_KEY environment variable; an empty key is refused."""
    key = value if value is not None else os.environ.get(API_KEY_ENV)
    if key is not None and not key.strip():
        raise ValueError(f"the API key is empty; give a non-empty --api-key or unset {API_KEY_ENV}")
    return key
