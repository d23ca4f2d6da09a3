"""Errors in each route's own schema: OpenAI's for /v1/..., text-embeddings-inference's for its routes, Cohere's for
/v1/rerank. Whatever goes wrong (a bad body, a wrong method, an unknown path, an over-long body, a full queue) is
answered in the schema of the path it was sent to."""

from __future__ import annotations

from collections.abc import Callable

BODY_OPTION = "--max-body-bytes, ServeConfig.max_body_bytes"  # what a 413 for an over-long body names


class RequestError(Exception):
    """A request the server refuses: its status, a one-line reason, OpenAI's error type."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", headers=None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.headers = status, message, kind, headers or {}


def openai_error(status: int, message: str, kind: str) -> dict:
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


# text-embeddings-inference's ErrorType by status code (its variants: Unhealthy, Backend, Overloaded, Validation,
# Tokenizer, Empty); an authentication or routing failure has none there and answers as a validation error.
TEI_ERROR_TYPES = {503: "Overloaded", 500: "Backend"}


def tei_error(status: int, message: str, kind: str) -> dict:
    return {"error": message, "error_type": TEI_ERROR_TYPES.get(status, "Validation")}


def cohere_error(status: int, message: str, kind: str) -> dict:
    return {"message": message}


ErrorShape = Callable[[int, str, str], dict]
ERROR_SHAPES: dict[str, ErrorShape] = {
    "/embed": tei_error,
    "/embed_sparse": tei_error,
    "/rerank": tei_error,
    "/v1/rerank": cohere_error,
}


def error_body(path: str, status: int, message: str, kind: str) -> dict:
    """The error body of `path`'s schema (OpenAI's for every path not in ERROR_SHAPES)."""
    return ERROR_SHAPES.get(path.rstrip("/") or "/", openai_error)(status, message, kind)


def error_message(body: dict) -> str:
    """The one-line reason inside any of the shapes above (for clients and tests)."""
    error = body.get("error", body.get("message"))
    return error["message"] if isinstance(error, dict) else error


EXPECTED = {
    "input": "a string or a list of strings",
    "inputs": "a string or a list of strings",
    "layers": "an integer, a list of integers, 'all' or 'mix'",
}


def validation_message(errors: list[dict]) -> str:
    """pydantic's errors as one line: the field, and what it should be (one reason for a union's several)."""
    if not errors:
        return "invalid request"
    first = errors[0]
    if first.get("type") == "json_invalid":
        return f"malformed JSON: {first.get('ctx', {}).get('error', first.get('msg', ''))}"
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    if not loc and first.get("type") == "missing":
        return "the body is empty; send a JSON object"
    field = loc[0] if loc else "body"
    same_field = [e for e in errors if [str(p) for p in e.get("loc", ()) if p != "body"][:1] == loc[:1]]
    if len(same_field) > 1 or field in EXPECTED and len(loc) > 1:  # a union: every alternative failed
        got = type(first.get("input")).__name__.replace("NoneType", "null")
        return f"{field}: expected {EXPECTED.get(field, 'another type')}, got {got}"
    if not loc and first.get("type") in ("model_attributes_type", "dict_type"):
        return "body: expected a JSON object"
    return f"{'.'.join(loc) or 'body'}: {first.get('msg', 'invalid')}".replace("\n", " ")


def body_too_large(limit: int):
    """The error a body over `limit` bytes raises while it is read: an HTTPException, which FastAPI's body parsing
    passes on (any other exception there becomes a 400), answered by the app's handler."""
    from starlette.exceptions import HTTPException

    return HTTPException(413, f"request body over the limit of {limit:,} bytes ({BODY_OPTION})")


class BodyLimit:
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
                    raise body_too_large(self.limit)
            return message

        await self.app(scope, limited, send)
