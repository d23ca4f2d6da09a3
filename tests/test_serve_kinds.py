"""Serve a folder by what it is (issue 40, item 6): `ctxrep serve --model FOLDER` of a reranker serves /rerank and
/v1/rerank (as text-embeddings-inference does), of a SPLADE folder /embed_sparse, of BGE-M3 both embeddings and sparse
vectors; a route the loaded model cannot answer says, in its own schema, which folder kind it needs. The table of
folder kinds (serve/kinds.py) on small folders, and real servers on 127.0.0.1."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
import transformers
from _serve_helpers import ServeProcess, ServerThread, tiny_cross_encoder, tiny_splade

from ctxrep import Featurizer
from ctxrep.models.sentence_transformers import Module, write_modules
from ctxrep.rerank import CrossEncoderReranker
from ctxrep.serve.app import build_app
from ctxrep.serve.kinds import FOLDER_KINDS, KIND_NAMES, ROUTES, Answer, folder_kind
from ctxrep.serve.service import EmbeddingService, ServeConfig, make_service
from ctxrep.vectors.sparse import SparseEncoder

QUERY = "where did the fox jump ?"
DOCS = ["The quick brown fox jumps over the lazy dog .", "A crane lifted the steel beam .", "dog"]


def _folder(path: Path, config: dict, files: dict | None = None) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    for name, content in (files or {}).items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(json.dumps(content))
    return path


def _st_splade(folder: Path, tokenizer_from: Path) -> Path:
    """A sentence-transformers SparseEncoder folder: the tiny SPLADE's weights, modules.json (MLMTransformer +
    SpladePooling) and its settings, as sentence-transformers' save writes them."""
    tiny_splade(folder, tokenizer_from)
    modules = [
        Module("sentence_transformers.sparse_encoder.modules.MLMTransformer", ""),
        Module(
            "sentence_transformers.sparse_encoder.modules.SpladePooling", "1_SpladePooling", {"pooling_strategy": "max"}
        ),
    ]
    write_modules(folder, modules, {"model_type": "SparseEncoder", "prompts": {}})
    return folder


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory, minilm_path) -> Path:
    return tiny_cross_encoder(tmp_path_factory.mktemp("ce"), minilm_path)


@pytest.fixture(scope="module")
def splade(tmp_path_factory, minilm_path) -> Path:
    return _st_splade(tmp_path_factory.mktemp("st-splade") / "splade", minilm_path)


# ---- the table -------------------------------------------------------------------------------------------------

BERT_CE = {"model_type": "bert", "architectures": ["BertForSequenceClassification"], "id2label": {"0": "LABEL_0"}}
QWEN = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}


@pytest.mark.parametrize(
    "config, files, kind",
    [
        (BERT_CE, {}, "reranker"),  # a cross-encoder: one label
        (BERT_CE | {"id2label": {"0": "neg", "1": "neu", "2": "pos"}}, {}, "sentence-embedding"),  # a classifier
        (QWEN, {}, "reranker"),  # an LLM reranker (Qwen3-Reranker's layout)
        (QWEN, {"modules.json": [{"type": "sentence_transformers.models.Pooling", "path": "1_Pooling"}]},
         "sentence-embedding"),  # Qwen3-Embedding: a causal LM folder with a pooling pipeline
        (QWEN, {"config_sentence_transformers.json": {"model_type": "SentenceTransformer"}}, "sentence-embedding"),
        ({"estimator": "SequenceRegressor", "params": {}}, {}, "reranker"),  # `ctxrep finetune`'s OUT/model
        ({"model_type": "bert", "architectures": ["BertForMaskedLM"]}, {}, "sentence-embedding"),  # BERT itself
        ({"model_type": "bert", "architectures": ["BertForMaskedLM"]},
         {"config_sentence_transformers.json": {"model_type": "SparseEncoder"}}, "sparse"),
        ({"model_type": "xlm-roberta", "architectures": ["XLMRobertaModel"]}, {"sparse_linear.pt": {}}, "bge-m3"),
        ({"model_type": "bert"}, {}, "sentence-embedding"),
    ],
)  # fmt: skip
def test_a_folder_is_the_first_kind_it_holds(tmp_path, config, files, kind):
    assert folder_kind(_folder(tmp_path / "m", config, files)).name == kind


def test_the_tables_name_every_kind_and_route():
    assert KIND_NAMES == ("reranker", "sparse", "bge-m3", "sentence-embedding")
    assert FOLDER_KINDS[-1].holds(Path("/nowhere"))  # the last row takes any model
    assert {p for r in ROUTES.values() for p in r.paths} == {
        "/v1/embeddings", "/embed", "/v1/word-embeddings", "/rerank", "/v1/rerank", "/embed_sparse"
    }  # fmt: skip
    assert set(ROUTES) == set(Answer)
    from ctxrep.cli.serve import serve

    choices = next(p for p in serve.params if p.name == "model_kind").type.choices
    assert tuple(choices) == ("auto", *KIND_NAMES)  # the CLI's list (no torch at --help) is the table's
    with pytest.raises(ValueError, match="model kind 'splade' is not one of reranker, sparse, bge-m3"):
        folder_kind("minilm", "splade")


def test_options_that_do_not_fit_the_folder_are_refused(cross_encoder, tiny_models):
    with pytest.raises(ValueError, match=r"--layers, --normalize: the model .* is a reranker, which serves rerank and"):
        make_service(str(cross_encoder), layers=0, normalize=True)
    with pytest.raises(ValueError, match=r"--backend: the model .* is a reranker, which serves rerank and does not"):
        make_service(str(cross_encoder), backend="onnxruntime")
    with pytest.raises(ValueError, match=r"--reranker .*: the model .* is a reranker already, which serves rerank"):
        make_service(str(cross_encoder), reranker=str(cross_encoder))
    with pytest.raises(ValueError, match="architectures says BertModel, which is not a cross-encoder"):
        make_service(str(tiny_models["bert"]), model_kind="reranker")
    with pytest.raises(ValueError, match="give the service something to serve"):
        EmbeddingService(None, "nothing")


# ---- real servers ----------------------------------------------------------------------------------------------


def test_serve_a_cross_encoder_folder_as_tei_does(cross_encoder):
    """`ctxrep serve --model CROSS_ENCODER` as a process: /rerank and /v1/rerank answer, the embedding and sparse
    routes answer 404 in their own schemas naming the folder kind they need."""
    held = f"this server holds a reranker ({cross_encoder})"
    with ServeProcess(["--model", str(cross_encoder), "--threads", "1"]) as server:
        tei = httpx.post(f"{server.url}/rerank", json={"query": QUERY, "texts": DOCS}, timeout=60)
        cohere = httpx.post(f"{server.url}/v1/rerank", json={"query": QUERY, "documents": DOCS}, timeout=60)
        openai = httpx.post(f"{server.url}/v1/embeddings", json={"input": "a fox"}, timeout=60)
        embed = httpx.post(f"{server.url}/embed", json={"inputs": "a fox"}, timeout=60)
        words = httpx.post(f"{server.url}/v1/word-embeddings", json={"input": "a fox"}, timeout=60)
        sparse = httpx.post(f"{server.url}/embed_sparse", json={"inputs": "a fox"}, timeout=60)
        health = httpx.get(f"{server.url}/health", timeout=60).json()
        models = httpx.get(f"{server.url}/v1/models", timeout=60).json()["data"]
    expected = CrossEncoderReranker(cross_encoder).rerank(QUERY, DOCS)
    assert tei.status_code == cohere.status_code == 200, (tei.text, cohere.text)
    assert [x["index"] for x in tei.json()] == expected.ids
    assert [x["score"] for x in tei.json()] == pytest.approx(expected.scores.tolist(), abs=1e-5)
    assert [x["index"] for x in cohere.json()["results"]] == expected.ids and cohere.json()["model"] == str(
        cross_encoder
    )
    need = "embeddings need a sentence-embedding folder: start ctxrep serve with --model MODEL"
    assert openai.status_code == 404 and openai.json()["error"]["message"] == f"{held}; {need}"  # OpenAI's schema
    assert embed.status_code == 404 and embed.json() == {"error": f"{held}; {need}", "error_type": "Validation"}
    assert words.status_code == 404 and words.json()["error"]["message"] == f"{held}; {need}"
    assert sparse.status_code == 404 and sparse.json()["error"].startswith(f"{held}; sparse vectors need a SPLADE")
    assert health == {"status": "ok", "model": str(cross_encoder), "dim": None, "queued_texts": 0}
    assert [m["id"] for m in models] == [str(cross_encoder)]
    started = [line for line in server.stderr.splitlines() if line.startswith("serving ")]
    assert len(started) == 1 and "(no sentence vectors)" in started[0], server.stderr
    assert f"POST {cross_encoder} at /rerank (TEI), /v1/rerank (Cohere, Jina); GET" in started[0]


def test_serve_a_splade_folder_at_embed_sparse(splade, tiny_models):
    service = make_service(str(splade), config=ServeConfig(max_texts=8))
    assert service.fz is None and service.reranker is None and service.sparse is not None
    texts = ["A man is playing a guitar .", "guitar guitar"]
    with ServerThread(build_app(service)) as s:
        sparse = httpx.post(f"{s.url}/embed_sparse", json={"inputs": texts}, timeout=60)
        rerank = httpx.post(f"{s.url}/v1/rerank", json={"query": QUERY, "documents": DOCS}, timeout=60)
        embed = httpx.post(f"{s.url}/embed", json={"inputs": "a"}, timeout=60)
    assert sparse.status_code == 200, sparse.text
    for got, want in zip(sparse.json(), SparseEncoder(splade).embed_sparse(texts)):
        assert [x["index"] for x in got] == want.indices
        assert [x["value"] for x in got] == pytest.approx(want.values, abs=1e-6)
    held = f"this server holds a sparse encoder ({splade})"
    assert rerank.status_code == 404 and rerank.json()["message"].startswith(f"{held}; rerank needs a reranker folder")
    assert embed.status_code == 404 and embed.json()["error"].startswith(f"{held}; embeddings need")


def test_serve_bge_m3_answers_embeddings_and_sparse_vectors(tmp_path, minilm_path):
    folder = tiny_splade(tmp_path / "m3", minilm_path)  # a dense model with BGE-M3's sparse head beside it
    torch.manual_seed(3)
    torch.save(torch.nn.Linear(32, 1).state_dict(), folder / "sparse_linear.pt")
    assert folder_kind(folder).name == "bge-m3"
    service = make_service(str(folder), config=ServeConfig(max_texts=8))
    assert service.sparse.featurizer.model is service.fz.model  # one model in memory for both
    with ServerThread(build_app(service)) as s:
        dense = httpx.post(f"{s.url}/v1/embeddings", json={"input": ["a fox", "a dog"]}, timeout=60)
        sparse = httpx.post(f"{s.url}/embed_sparse", json={"inputs": ["a fox"]}, timeout=60)
    assert dense.status_code == sparse.status_code == 200, (dense.text, sparse.text)
    vectors = Featurizer(folder).embed_sentences(["a fox", "a dog"])
    np.testing.assert_allclose([d["embedding"] for d in dense.json()["data"]], vectors, atol=1e-5)
    want = SparseEncoder(folder).embed_sparse(["a fox"])[0]
    assert [x["index"] for x in sparse.json()[0]] == want.indices


def test_model_kind_serves_a_reranker_folders_embeddings_when_asked(cross_encoder):
    """--model-kind sentence-embedding: the old behaviour on purpose (the cross-encoder's encoder, mean-pooled)."""
    service = make_service(str(cross_encoder), model_kind="sentence-embedding")
    assert service.reranker is None and service.fz is not None
    with ServerThread(build_app(service)) as s:
        r = httpx.post(f"{s.url}/v1/embeddings", json={"input": "a fox"}, timeout=60)
        rerank = httpx.post(f"{s.url}/rerank", json={"query": QUERY, "texts": DOCS}, timeout=60)
    assert r.status_code == 200 and len(r.json()["data"][0]["embedding"]) == 32
    assert rerank.status_code == 404


def test_a_classifier_with_several_labels_is_served_for_embeddings(tmp_path, minilm_path):
    torch.manual_seed(2)
    config = transformers.BertConfig(
        vocab_size=30522, max_position_embeddings=64, num_labels=3, hidden_size=32, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=64,
    )  # fmt: skip
    transformers.BertForSequenceClassification(config).save_pretrained(tmp_path / "nli")
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt"):
        shutil.copy(minilm_path / name, tmp_path / "nli" / name)
    assert folder_kind(tmp_path / "nli").name == "sentence-embedding"  # several labels: no relevance score
