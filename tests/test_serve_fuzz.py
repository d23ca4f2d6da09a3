"""Hypothesis fuzzing of every route's request body against a real server (tiny random BERT, cross-encoder and
SPLADE models): no 500, every bad body a 4xx in the route's own error schema with a one-line reason, and every good
one answered row for row."""

from __future__ import annotations

import json

import httpx
import pytest
from _serve_helpers import ServerThread, tiny_cross_encoder, tiny_splade
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ctxrep import Featurizer
from ctxrep.rerank import CrossEncoderReranker
from ctxrep.serve.app import build_app
from ctxrep.serve.service import EmbeddingService, ServeConfig
from ctxrep.vectors.sparse import SparseEncoder

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=8,
)
texts = st.text(max_size=30) | st.text(alphabet=" \t\n\u00a0\u2028abc\u00e9\u4e2d\U0001f600\x00\ud800", max_size=20)
inputs = texts | st.lists(texts, max_size=4) | st.lists(st.lists(texts, max_size=3), max_size=3) | json_values

# each route: the fields its body may carry, with values near and far from what it accepts
ROUTES = {
    "/v1/embeddings": {
        "input": inputs,
        "model": st.sampled_from(["tiny", "other"]) | json_values,
        "encoding_format": st.sampled_from(["float", "base64", "int8"]) | json_values,
        "dimensions": st.integers(-2, 100) | json_values,
        "user": json_values,
        "prompt": texts | json_values,
        "prompt_name": st.sampled_from(["query", "doc"]) | json_values,
    },
    "/embed": {
        "inputs": inputs,
        "normalize": st.booleans() | json_values,
        "truncate": json_values,
        "prompt_name": st.sampled_from(["query", "doc"]) | json_values,
    },
    "/embed_sparse": {"inputs": inputs, "truncate": json_values, "prompt_name": st.sampled_from(["query"])},
    "/v1/word-embeddings": {
        "input": inputs,
        "model": st.sampled_from(["tiny", "other"]),
        "layers": st.integers(-5, 5) | st.lists(st.integers(-5, 5), max_size=3) | st.sampled_from(["all", "mix", "x"]),
        "pooling": st.sampled_from(["first", "last", "mean", "first_last", "max"]) | json_values,
        "encoding_format": st.sampled_from(["float", "base64"]) | json_values,
    },
    "/rerank": {
        "query": texts | json_values,
        "texts": inputs,
        "raw_scores": st.booleans() | json_values,
        "return_text": st.booleans() | json_values,
        "prompt": texts | json_values,
        "prompt_name": st.sampled_from(["query", "web", "passage"]) | json_values,
    },
    "/v1/rerank": {
        "query": texts | json_values,
        "documents": inputs | st.lists(st.fixed_dictionaries({"text": texts}), max_size=3),
        "model": st.sampled_from(["ce", "other"]) | json_values,
        "top_n": st.integers(-2, 6) | json_values,
        "return_documents": st.booleans() | json_values,
        "prompt_name": st.sampled_from(["query", "web", "passage"]) | json_values,
    },
}


# bodies the route should accept: a few words per text, any characters but whitespace in them
words = st.text(st.characters(blacklist_categories=["Cs", "Z", "Cc"]), min_size=1, max_size=8)
good_texts = st.lists(words, min_size=1, max_size=6).map(" ".join)
GOOD = {
    "/v1/embeddings": {"input": good_texts | st.lists(good_texts, min_size=1, max_size=8)},
    "/embed": {"inputs": good_texts | st.lists(good_texts, min_size=1, max_size=8)},
    "/embed_sparse": {"inputs": good_texts | st.lists(good_texts, min_size=1, max_size=8)},
    "/v1/word-embeddings": {"input": st.lists(st.lists(words, min_size=1, max_size=5), min_size=1, max_size=4)},
    "/rerank": {"query": good_texts, "texts": st.lists(good_texts, min_size=1, max_size=8)},
    "/v1/rerank": {
        "query": good_texts,
        "documents": st.lists(good_texts, min_size=1, max_size=8),
        "top_n": st.none() | st.integers(1, 10),
    },
}


def bodies(path: str) -> st.SearchStrategy:
    good = st.fixed_dictionaries(GOOD[path]).map(json.dumps)
    shaped = st.fixed_dictionaries({}, optional=ROUTES[path]).map(json.dumps)
    return good | shaped | json_values.map(json.dumps) | st.binary(max_size=40)


@pytest.fixture(scope="module")
def server(tiny_models, tmp_path_factory, minilm_path):
    fz = Featurizer(tiny_models["bert"])
    reranker = CrossEncoderReranker(tiny_cross_encoder(tmp_path_factory.mktemp("ce"), minilm_path))
    config = ServeConfig(max_texts=8, max_text_chars=400, max_body_bytes=4000)
    sparse = SparseEncoder(tiny_splade(tmp_path_factory.mktemp("splade"), minilm_path))
    service = EmbeddingService(fz, "tiny", config, reranker=reranker, reranker_name="ce", sparse=sparse)
    with ServerThread(build_app(service)) as s, httpx.Client(base_url=s.url) as client:
        yield client


def rows_sent(value) -> int:
    return 1 if isinstance(value, str) else len(value)


# each route's answer to an accepted body: its rows (to count against the rows sent)
ROWS_OUT = {
    "/v1/embeddings": lambda body, answer: (
        [d["index"] for d in answer["data"]],
        list(range(rows_sent(body["input"]))),
    ),
    "/v1/word-embeddings": lambda body, answer: (
        [d["index"] for d in answer["data"]],
        list(range(rows_sent(body["input"]))),
    ),
    "/embed": lambda body, answer: (len(answer), rows_sent(body["inputs"])),
    "/embed_sparse": lambda body, answer: (len(answer), rows_sent(body["inputs"])),
    "/rerank": lambda body, answer: (sorted(x["index"] for x in answer), list(range(len(body["texts"])))),
    "/v1/rerank": lambda body, answer: (
        len(answer["results"]),
        min(len(body["documents"]), body.get("top_n") or len(body["documents"])),
    ),
}


def error_message(path: str, status: int, answer: dict) -> str:
    """The reason in the route's schema (TEI's, Cohere's or OpenAI's), after checking the schema."""
    if path in ("/embed", "/embed_sparse", "/rerank"):
        assert set(answer) == {"error", "error_type"}, answer
        return answer["error"]
    if path == "/v1/rerank":
        assert set(answer) == {"message"}, answer
        return answer["message"]
    assert set(answer) == {"error"} and answer["error"]["code"] == status, answer
    return answer["error"]["message"]


def check(client: httpx.Client, path: str, content: bytes | str) -> None:
    r = client.post(path, content=content, headers={"content-type": "application/json"})
    event(f"status {r.status_code}")
    assert r.status_code < 500, (path, content, r.status_code, r.text)
    answer = r.json()
    if r.status_code == 200:  # rows in = rows out
        got, sent = ROWS_OUT[path](json.loads(content), answer)
        assert got == sent, (content, answer)
        return
    assert 400 <= r.status_code < 500
    message = error_message(path, r.status_code, answer)
    assert message and "\n" not in message, message


@pytest.mark.parametrize("path", sorted(ROUTES))
@SETTINGS
@given(data=st.data())
def test_no_body_gets_a_500_and_every_refusal_is_in_the_routes_schema(server, path, data):
    check(server, path, data.draw(bodies(path)))
