"""`ctxrep serve --reranker MODEL --sparse-model MODEL` as a process: it starts, names its routes, and answers a
rerank request (saying which document it cut) and a sparse request."""

from __future__ import annotations

import httpx
from _serve_helpers import ServeProcess, tiny_cross_encoder, tiny_splade

QUERY = "where did the fox jump ?"
LONG = " ".join(["the fox jumped over the lazy dog again"] * 20)  # past the tiny cross-encoder's 64 positions


def test_serve_with_a_reranker_and_a_sparse_model_answers(tmp_path, tiny_models, minilm_path):
    reranker = tiny_cross_encoder(tmp_path / "ce", minilm_path)
    splade = tiny_splade(tmp_path / "splade", minilm_path)
    args = ["--model", str(tiny_models["bert"]), "--reranker", str(reranker), "--sparse-model", str(splade)]
    with ServeProcess([*args, "--threads", "1"]) as server:
        documents = ["the fox jumped over the dog", LONG, "a crane lifted a beam"]
        rerank = httpx.post(f"{server.url}/v1/rerank", json={"query": QUERY, "documents": documents}, timeout=60)
        sparse = httpx.post(f"{server.url}/embed_sparse", json={"inputs": "a fox"}, timeout=60)
    assert rerank.status_code == 200, rerank.text
    assert sorted(r["index"] for r in rerank.json()["results"]) == [0, 1, 2]
    assert rerank.json()["model"] == str(reranker) and rerank.json()["cut"] == {"count": 1, "indices": [1]}
    assert sparse.status_code == 200 and len(sparse.json()) == 1 and len(sparse.json()[0]) > 0, sparse.text
    started = [line for line in server.stderr.splitlines() if line.startswith("serving ")]
    assert len(started) == 1, server.stderr
    assert f"{reranker} at /rerank (TEI), /v1/rerank" in started[0] and f"{splade} at /embed_sparse" in started[0]
