"""The issue-34 routes of `ctxrep serve` through httpx: TEI's /rerank and Cohere's / Jina's /v1/rerank over a tiny
random cross-encoder folder (the answers equal `ctxrep.rerank`'s, which tests/test_rerank.py holds to
sentence-transformers), prompts by name and by text, the texts each route cut, `dimensions` on TEI's /embed, and
their bad requests in each route's schema."""

from __future__ import annotations

import json
import shutil

import httpx
import numpy as np
import pytest
from _serve_helpers import ServerThread, tiny_cross_encoder, tiny_splade
from openai import OpenAI, UnprocessableEntityError

from ctxrep import Featurizer
from ctxrep.rerank import CrossEncoderReranker
from ctxrep.serve import service as service_module
from ctxrep.serve.app import build_app
from ctxrep.serve.service import EmbeddingService, ServeConfig
from ctxrep.vectors.sparse import SparseEncoder

QUERY = "where did the fox jump ?"
DOCS = [
    "The quick brown fox jumps over the lazy dog .",
    "A crane lifted the steel beam onto the roof .",
    "the fox jumped over the dog , twice , and then it ran away",
    "dog",
]


def pairs(hits) -> list[tuple[int, float]]:
    """(index, score) of a rerank's Hits, best first: what the routes answer."""
    return list(zip(hits.ids, hits.scores.tolist()))


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory, minilm_path):
    return tiny_cross_encoder(tmp_path_factory.mktemp("ce"), minilm_path)


@pytest.fixture(scope="module")
def server(cross_encoder, tiny_models):
    reranker = CrossEncoderReranker(cross_encoder)
    service = EmbeddingService(
        Featurizer(tiny_models["bert"]), "tiny", ServeConfig(max_texts=8), reranker=reranker, reranker_name="ce"
    )
    with ServerThread(build_app(service)) as s:
        yield s, reranker


def test_tei_rerank(server):
    s, reranker = server
    r = httpx.post(f"{s.url}/rerank", json={"query": QUERY, "texts": DOCS, "return_text": True})
    assert r.status_code == 200, r.text
    expected = reranker.rerank(QUERY, DOCS)
    assert [item["index"] for item in r.json()] == expected.ids
    assert [item["score"] for item in r.json()] == pytest.approx(expected.scores.tolist(), abs=1e-6)
    assert [item["text"] for item in r.json()] == expected.texts
    assert r.headers["x-cut-count"] == "0" and "x-cut-indices" not in r.headers  # nothing cut
    plain = httpx.post(f"{s.url}/rerank", json={"query": QUERY, "texts": DOCS, "prompt_name": "query"}).json()
    assert "text" not in plain[0]
    expected = reranker.rerank(QUERY, DOCS, prompt_name="query")
    assert [(item["index"], pytest.approx(item["score"], abs=1e-6)) for item in plain] == pairs(expected)


def test_cohere_and_jina_rerank(server):
    s, reranker = server
    documents = [DOCS[0], {"text": DOCS[1]}, DOCS[2], {"text": DOCS[3]}]  # strings or {"text"} objects
    body = {"model": "ce", "query": QUERY, "documents": documents, "top_n": 2, "return_documents": True}
    r = httpx.post(f"{s.url}/v1/rerank", json=body | {"prompt": "find : "})
    assert r.status_code == 200, r.text
    answer = r.json()
    expected = reranker.rerank(QUERY, DOCS, top_n=2, prompt="find : ")
    assert [(x["index"], pytest.approx(x["relevance_score"], abs=1e-6)) for x in answer["results"]] == pairs(expected)
    assert [x["document"]["text"] for x in answer["results"]] == expected.texts
    assert answer["model"] == "ce" and answer["usage"]["total_tokens"] > 0 and len(answer["id"]) == 32
    assert answer["cut"] == {"count": 0, "indices": []}
    bare = httpx.post(f"{s.url}/v1/rerank", json={"query": QUERY, "documents": DOCS}).json()["results"]
    assert len(bare) == len(DOCS) and "document" not in bare[0]
    models = httpx.get(f"{s.url}/v1/models").json()["data"]
    assert [m["id"] for m in models] == ["tiny", "ce"]


@pytest.mark.parametrize(
    "path, body, status, message",
    [
        ("/v1/rerank", {"query": QUERY, "documents": DOCS, "top_n": 0}, 422, "top_n must be a positive integer"),
        ("/v1/rerank", {"query": QUERY, "documents": []}, 422, "documents: an empty list"),
        ("/v1/rerank", {"query": QUERY, "documents": ["a", " "]}, 422, "documents[1]: an empty text"),
        ("/v1/rerank", {"query": " ", "documents": DOCS}, 422, "query: an empty text"),
        ("/v1/rerank", {"query": QUERY, "documents": DOCS, "prompt_name": "passage"}, 422, "unknown prompt name"),
        ("/v1/rerank", {"query": QUERY, "documents": DOCS, "model": "other"}, 404, "model 'other' is not served"),
        ("/v1/rerank", {"query": QUERY, "documents": [5]}, 422, "documents"),
        ("/v1/rerank", {"documents": DOCS}, 422, "query: Field required"),
        ("/rerank", {"query": QUERY, "texts": []}, 422, "texts: an empty list"),
        ("/rerank", {"query": QUERY, "texts": DOCS, "raw_scores": True}, 422, "raw_scores"),
        ("/rerank", {"query": QUERY, "texts": DOCS, "prompt_name": "passage"}, 422, "'query', 'web'"),
        (
            "/rerank",
            {"query": QUERY, "texts": ["a"] * 9},
            413,
            "texts: 9 texts; the limit is 8 per request (--max-texts",
        ),
    ],
)
def test_bad_rerank_requests_in_the_routes_schema(server, path, body, status, message):
    s, _ = server
    r = httpx.post(s.url + path, json=body)
    assert r.status_code == status, r.text
    if path == "/rerank":  # TEI's
        assert set(r.json()) == {"error", "error_type"} and message in r.json()["error"], r.json()
    else:  # Cohere's {"message"}
        assert set(r.json()) == {"message"} and message in r.json()["message"], r.json()
    assert "\n" not in json.dumps(r.json())


def test_rerank_routes_name_the_documents_they_cut(server):
    """A (query, document) pair past the cross-encoder's 64 positions is cut longest-first (as sentence-transformers
    cuts it): /v1/rerank's `cut` names those documents, TEI's /rerank says it in headers, as the embedding routes."""
    s, reranker = server
    long_doc = " ".join(["the fox jumped over the lazy dog again"] * 20)
    documents = [DOCS[0], long_doc, DOCS[1], long_doc]
    reranker.rerank(QUERY, documents)
    assert reranker.cut_texts == [1, 3]  # what the library says of this call
    cohere = httpx.post(f"{s.url}/v1/rerank", json={"query": QUERY, "documents": documents, "top_n": 1})
    tei = httpx.post(f"{s.url}/rerank", json={"query": QUERY, "texts": documents})
    assert cohere.status_code == tei.status_code == 200, (cohere.text, tei.text)
    assert cohere.json()["cut"] == {"count": 2, "indices": [1, 3]}  # every cut document, top_n or not
    assert tei.headers["x-cut-count"] == "2" and tei.headers["x-cut-indices"] == "1,3"
    assert [x["index"] for x in tei.json()] == reranker.rerank(QUERY, documents).ids


def test_rerank_without_a_reranker_is_404_in_the_routes_schema(tiny_models):
    with ServerThread(build_app(EmbeddingService(Featurizer(tiny_models["bert"]), "tiny"))) as s:
        cohere = httpx.post(f"{s.url}/v1/rerank", json={"query": QUERY, "documents": DOCS})
        tei = httpx.post(f"{s.url}/rerank", json={"query": QUERY, "texts": DOCS})
    assert cohere.status_code == tei.status_code == 404
    message = (
        "this server holds a sentence-embedding model (tiny); rerank needs a reranker folder (a cross-encoder, an LLM "
        "reranker or a pair model `ctxrep finetune` trained): start ctxrep serve with --reranker MODEL, or --model "
        "MODEL of such a folder"
    )
    assert cohere.json() == {"message": message}
    assert tei.json() == {"error": message, "error_type": "Validation"}


@pytest.fixture(scope="module")
def splade_folder(tmp_path_factory, minilm_path):
    return tiny_splade(tmp_path_factory.mktemp("splade"), minilm_path)


def test_tei_embed_sparse(splade_folder, tiny_models):
    encoder = SparseEncoder(splade_folder)
    long = " ".join(f"word{i % 30} fox" for i in range(40))  # over the tiny model's 64 positions: windowed
    texts = ["A man is playing a guitar .", "guitar guitar guitar", long]
    service = EmbeddingService(Featurizer(tiny_models["bert"]), "tiny", sparse=SparseEncoder(splade_folder))
    with ServerThread(build_app(service)) as s:
        r = httpx.post(f"{s.url}/embed_sparse", json={"inputs": texts}, timeout=120)
        one = httpx.post(f"{s.url}/embed_sparse", json={"inputs": texts[0]})
        bad = httpx.post(f"{s.url}/embed_sparse", json={"inputs": []})
    assert r.status_code == 200, r.text
    expected = encoder.embed_sparse(texts)
    assert len(r.json()) == len(texts)
    for got, want in zip(r.json(), expected):
        assert [x["index"] for x in got] == want.indices and len(want.indices) > 10
        assert [x["value"] for x in got] == pytest.approx(want.values, abs=1e-6)
    assert r.headers["x-windowed-count"] == "1" and r.headers["x-windowed-indices"] == "2"
    assert r.headers["x-cut-count"] == "0" and "x-cut-indices" not in r.headers
    assert [x["index"] for x in one.json()[0]] == expected[0].indices
    assert bad.status_code == 422 and bad.json() == {"error": bad.json()["error"], "error_type": "Validation"}
    assert "inputs: an empty list" in bad.json()["error"]


def test_embed_sparse_without_a_sparse_model_is_404(server):
    s, _ = server
    r = httpx.post(f"{s.url}/embed_sparse", json={"inputs": "a"})
    assert r.status_code == 404 and r.json()["error_type"] == "Validation"
    assert r.json()["error"] == (
        "this server holds a sentence-embedding model (tiny) and a reranker (ce); sparse vectors need a SPLADE or "
        "BGE-M3 folder: start ctxrep serve with --sparse-model MODEL, or --model MODEL of a SPLADE folder"
    )


def test_texts_a_window_cut_are_reported(tiny_models):
    """A word longer than a whole window (the tiny BERT's 64 positions) keeps its first pieces: `cut` says which
    text, beside `windowed`; TEI's /embed says it in headers."""
    fz = Featurizer(tiny_models["bert"], sentence_pooling="mean")
    texts = ["a short one", "an " + "x," * 45 + " word", " ".join(["fox"] * 100)]  # 90 pieces in one word
    fz.embed_sentences(texts)
    assert fz.cut_texts == [1]  # what the library says of this call
    with ServerThread(build_app(EmbeddingService(fz, "tiny"))) as s:
        openai_style = httpx.post(f"{s.url}/v1/embeddings", json={"input": texts}).json()
        tei = httpx.post(f"{s.url}/embed", json={"inputs": texts})
        words = httpx.post(f"{s.url}/v1/word-embeddings", json={"input": texts}).json()
    for answer in (openai_style, words):
        assert answer["cut"] == {"count": 1, "indices": [1]}
        assert answer["windowed"] == {"count": 2, "indices": [1, 2]}
    assert tei.headers["x-cut-count"] == "1" and tei.headers["x-cut-indices"] == "1"
    assert tei.headers["x-windowed-indices"] == "1,2"


def test_embed_sparse_names_the_texts_a_window_cut(splade_folder, monkeypatch):
    """A word longer than the tiny SPLADE model's whole window keeps its first pieces: /embed_sparse says which text
    in headers, as TEI's /embed does; in a request of several SparseEncoder calls (2 texts each here), by their index
    in the request."""
    monkeypatch.setattr(service_module, "SPARSE_CALL_TEXTS", 2)
    encoder = SparseEncoder(splade_folder)
    cut_word = "an " + "x," * 45 + " word"  # 90 pieces in one word
    texts = ["a short one", cut_word, "fox", "fox", "a dog", cut_word]
    with pytest.warns(UserWarning, match="more than a window"):
        encoder.embed_sparse(texts[:2])
    assert encoder.featurizer.cut_texts == [1]  # what the library says of these texts
    with ServerThread(build_app(EmbeddingService(Featurizer(splade_folder), "tiny", sparse=encoder))) as s:
        r = httpx.post(f"{s.url}/embed_sparse", json={"inputs": texts}, timeout=120)
    assert r.status_code == 200, r.text
    assert r.headers["x-cut-count"] == "2" and r.headers["x-cut-indices"] == "1,5"
    assert r.headers["x-windowed-indices"] == "1,5"
    assert [x["index"] for x in r.json()[5]] == encoder.embed_sparse(texts[5:])[0].indices


def test_tei_embed_takes_dimensions(tiny_models):
    """TEI's /embed `dimensions`: the first N coordinates, unit length when `normalize` (as /v1/embeddings); more than
    the model's width is a 422 in TEI's schema."""
    fz = Featurizer(tiny_models["bert"], sentence_pooling="mean")
    texts = ["a short one", "the fox jumped over the dog"]
    full = fz.embed_sentences(texts)
    with ServerThread(build_app(EmbeddingService(fz, "tiny"))) as s:
        unit = httpx.post(f"{s.url}/embed", json={"inputs": texts, "dimensions": 8})
        raw = httpx.post(f"{s.url}/embed", json={"inputs": texts, "dimensions": 8, "normalize": False})
        wide = httpx.post(f"{s.url}/embed", json={"inputs": texts, "dimensions": full.shape[1] + 1})
    assert unit.status_code == raw.status_code == 200, (unit.text, raw.text)
    head = full[:, :8]
    np.testing.assert_allclose(unit.json(), head / np.linalg.norm(head, axis=1, keepdims=True), atol=1e-5)
    np.testing.assert_allclose(raw.json(), head, atol=1e-5)
    assert wide.status_code == 422 and wide.json()["error_type"] == "Validation"
    assert wide.json()["error"].startswith(f"dimensions: dimensions={full.shape[1] + 1} is more than")


@pytest.fixture(scope="module")
def prompted(tiny_models, tmp_path_factory):
    """The tiny BERT with two declared prompts."""
    folder = tmp_path_factory.mktemp("prompted") / "bert"
    shutil.copytree(tiny_models["bert"], folder)
    prompts = {"prompts": {"query": "query : ", "doc": "passage : "}}
    (folder / "config_sentence_transformers.json").write_text(json.dumps(prompts))
    return Featurizer(folder, sentence_pooling="mean")


def test_prompts_per_request_through_the_openai_client_and_tei(prompted):
    texts = ["where is the fox ?", "the fox is in the woods"]
    with ServerThread(build_app(EmbeddingService(prompted, "tiny"))) as s:
        client = OpenAI(base_url=f"{s.url}/v1", api_key="not-checked")
        named = client.embeddings.create(model="tiny", input=texts, extra_body={"prompt_name": "query"})
        given = client.embeddings.create(model="tiny", input=texts, extra_body={"prompt": "find : "})
        plain = client.embeddings.create(model="tiny", input=texts)
        with pytest.raises(UnprocessableEntityError, match="unknown prompt name 'passage'.*'query', 'doc'"):
            client.embeddings.create(model="tiny", input=texts, extra_body={"prompt_name": "passage"})
        with pytest.raises(UnprocessableEntityError, match="give prompt or prompt_name, not both"):
            client.embeddings.create(model="tiny", input=texts, extra_body={"prompt": "a", "prompt_name": "doc"})
        tei = httpx.post(f"{s.url}/embed", json={"inputs": texts, "prompt_name": "doc", "normalize": False}).json()
        bad = httpx.post(f"{s.url}/embed", json={"inputs": texts, "prompt_name": "passage"})
    for answer, expected in (
        (named, prompted.embed_sentences(texts, prompt_name="query")),
        (given, prompted.embed_sentences(texts, prompt="find : ")),
        (plain, prompted.embed_sentences(texts)),
    ):
        np.testing.assert_allclose([d.embedding for d in answer.data], expected, atol=1e-5)
    np.testing.assert_allclose(tei, prompted.embed_sentences(texts, prompt_name="doc"), atol=1e-5)
    assert not np.allclose(tei, prompted.embed_sentences(texts), atol=1e-3)  # the prompt changed the vectors
    assert named.usage.prompt_tokens > plain.usage.prompt_tokens  # the prompt's tokens are read and counted
    assert bad.status_code == 422 and bad.json()["error_type"] == "Validation"
    assert "unknown prompt name 'passage'" in bad.json()["error"]


def test_embed_sparse_takes_a_prompt(splade_folder, tiny_models, tmp_path):
    """/embed_sparse takes "prompt" / "prompt_name" as TEI's /embed does (the sparse folder's prompts, else its
    default): the vectors SparseEncoder.embed_sparse gives with them; an unknown name or both given: 422 in TEI's
    error schema."""
    folder = tmp_path / "splade"
    shutil.copytree(splade_folder, folder)
    (folder / "config_sentence_transformers.json").write_text(
        json.dumps({"prompts": {"query": "query : ", "doc": "passage : "}})
    )
    encoder = SparseEncoder(folder)
    texts = ["A man is playing a guitar .", "guitar guitar guitar"]
    asked = {"named": {"prompt_name": "query"}, "given": {"prompt": "find : "}, "plain": {}}
    service = EmbeddingService(Featurizer(tiny_models["bert"]), "tiny", sparse=SparseEncoder(folder))
    with ServerThread(build_app(service)) as s:
        got = {
            k: httpx.post(f"{s.url}/embed_sparse", json={"inputs": texts, **v}, timeout=60) for k, v in asked.items()
        }
        bad = httpx.post(f"{s.url}/embed_sparse", json={"inputs": texts, "prompt_name": "passage"})
        both = httpx.post(f"{s.url}/embed_sparse", json={"inputs": texts, "prompt": "a", "prompt_name": "doc"})
    for kind, kwargs in asked.items():
        assert got[kind].status_code == 200, got[kind].text
        for answer, want in zip(got[kind].json(), encoder.embed_sparse(texts, **kwargs)):
            assert [x["index"] for x in answer] == want.indices
            assert [x["value"] for x in answer] == pytest.approx(want.values, abs=1e-6)
    assert got["named"].json() != got["plain"].json()  # the prompt changed the vectors
    assert bad.status_code == 422 and bad.json() == {"error": bad.json()["error"], "error_type": "Validation"}
    assert "unknown prompt name 'passage'" in bad.json()["error"] and "'query', 'doc'" in bad.json()["error"]
    assert both.status_code == 422 and "give prompt or prompt_name, not both" in both.json()["error"]
