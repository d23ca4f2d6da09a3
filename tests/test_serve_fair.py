"""The server's fairness: a long request (many texts to embed, or many documents to rerank) runs in token-budget
steps and a short request that arrives meanwhile is answered between two of them (`serve.batcher.Turns`), with the
same vectors and scores as the Featurizer and the reranker alone."""

from __future__ import annotations

import asyncio
import threading

import httpx
import numpy as np
import pytest
from _serve_helpers import ServerThread, tiny_cross_encoder, wait_for

from ctxrep import Featurizer
from ctxrep.rerank import CrossEncoderReranker
from ctxrep.serve.app import build_app
from ctxrep.serve.batcher import Turns
from ctxrep.serve.service import EmbeddingService, Rerank, Sentences

LONG = " ".join(f"word{i % 97} and more" for i in range(400))  # about 1,600 pieces: 6 windows of MiniLM
SHORTS = ["two words", "a third one", "and the fourth sentence"]


@pytest.fixture(scope="module")
def fz():
    return Featurizer("minilm", batch_tokens=512)  # one window per batch: the long text takes many steps


def test_short_requests_are_answered_between_the_steps_of_a_long_one(fz, monkeypatch):
    """Three short requests sent while a long one holds the model: they merge into one call (they arrive while it waits
    for its first turn), which runs between two steps of the long call."""
    service = EmbeddingService(fz, "minilm")
    turns = service.batcher.turns
    between = turns.between_batches
    long_started = threading.Event()

    def gated(call, drain):  # the long call's first step waits until the short requests are in line for the model
        if not long_started.is_set():
            long_started.set()
            wait_for(lambda: turns.waiting > 0 and service.queued_texts == len(SHORTS), "the short requests")
        between(call, drain)

    monkeypatch.setattr(turns, "between_batches", gated)
    finished = []
    with ServerThread(build_app(service)) as s:

        async def go():
            async with httpx.AsyncClient(base_url=s.url, timeout=120) as client:

                async def post(name, text):
                    r = await client.post("/v1/embeddings", json={"input": [text]})
                    finished.append(name)
                    return r

                long = asyncio.create_task(post("long", LONG))
                await asyncio.to_thread(long_started.wait, 60)  # the long call holds the model
                shorts = await asyncio.gather(*(post("short", text) for text in SHORTS))
                return await long, shorts

        long, shorts = asyncio.run(go())
    assert finished == ["short"] * len(SHORTS) + ["long"]
    steps = list(turns.steps)
    long_call = steps[0]
    short_calls = {c for c in steps if c != long_call}
    assert len(short_calls) == 1, steps  # the three requests were one call
    at = steps.index(short_calls.pop())
    assert long_call in steps[:at] and long_call in steps[at + 1 :], steps  # it ran between two long steps
    assert steps.count(long_call) == len(fz.plan.single(0, fz.tokenizer.encode_words([LONG.split()])[0]))
    assert long.json()["windowed"] == {"count": 1, "indices": [0]}
    np.testing.assert_allclose(long.json()["data"][0]["embedding"], fz.embed_sentences([LONG])[0], atol=1e-5)
    got = [r.json()["data"][0]["embedding"] for r in shorts]
    np.testing.assert_allclose(got, fz.embed_sentences(SHORTS), atol=1e-5)


@pytest.mark.parametrize("documents", [12, 40])
def test_a_short_request_waits_one_step_of_a_long_rerank_request(fz, tmp_path, minilm_path, monkeypatch, documents):
    """A rerank request of many documents (one pair per batch: `documents` steps) holds the model when a short
    embedding request arrives: the short one runs after its first step, whatever the number of documents, and the
    scores are the reranker's own."""
    reranker = CrossEncoderReranker(tiny_cross_encoder(tmp_path / "ce", minilm_path), batch_tokens=64)
    service = EmbeddingService(fz, "minilm", reranker=reranker, reranker_name="ce")
    turns = service.batcher.turns
    query = "which crane lifted the beam"
    texts = [f"document {i} about a crane that lifted {i} beams " * 8 for i in range(documents)]  # cut to 64 tokens
    first_batch = threading.Event()
    encode = reranker.model.encode

    def gated(*args, **kwargs):  # the rerank call's first batch waits until the short request is in line
        if not first_batch.is_set():
            first_batch.set()
            wait_for(lambda: turns.waiting > 0, "the short request")
        return encode(*args, **kwargs)

    monkeypatch.setattr(reranker.model, "encode", gated)
    run, done = service.batcher.run, []

    def recorded(key, items, between_batches):  # which call's model work ended first (on the worker threads)
        parts = run(key, items, between_batches)
        done.append(type(key).__name__)
        return parts

    monkeypatch.setattr(service.batcher, "run", recorded)
    with ServerThread(build_app(service)) as s:

        async def go():
            async with httpx.AsyncClient(base_url=s.url, timeout=120) as client:
                long = asyncio.create_task(client.post("/v1/rerank", json={"query": query, "documents": texts}))
                await asyncio.to_thread(first_batch.wait, 60)  # the rerank call holds the model
                short = await client.post("/v1/embeddings", json={"input": SHORTS[:1]})
                return await long, short

        long, short = asyncio.run(go())
    assert done == [Sentences.__name__, Rerank.__name__], done
    steps = list(turns.steps)
    rerank_call, short_call = steps[0], steps[1]
    assert short_call != rerank_call and steps.count(short_call) == 1, steps
    assert steps.count(rerank_call) == documents and steps[2:] == [rerank_call] * (documents - 1), steps
    assert long.status_code == 200 and short.status_code == 200
    ranked = [(r["index"], r["relevance_score"]) for r in long.json()["results"]]
    alone = reranker.rerank(query, texts)  # the same batches as the reranker alone: the same scores
    assert ranked == list(zip(alone.ids, alone.scores.tolist()))
    np.testing.assert_allclose(short.json()["data"][0]["embedding"], fz.embed_sentences(SHORTS[:1])[0], atol=1e-5)


def test_turns_hand_the_model_round_robin_between_batches():
    turns, order, drained = Turns(), [], []
    turns.take(1)  # call 1 holds the model; calls 2 and 3 queue behind it
    threads = [threading.Thread(target=lambda c=c: (turns.take(c), order.append(c), turns.release())) for c in (2, 3)]
    for queued, t in enumerate(threads, start=1):  # 2 joins the line first, then 3
        t.start()
        wait_for(lambda queued=queued: turns.waiting == queued, "a call to queue")
    order.append(1)
    turns.between_batches(1, lambda: drained.append(1))  # hands over to 2, then 3, and takes the model back
    order.append(1)
    turns.release()
    for t in threads:
        t.join(timeout=30)
    assert order == [1, 2, 3, 1] and drained == [1]
    turns.take(4)
    turns.between_batches(4, lambda: drained.append(4))  # nobody in line: goes on without draining
    turns.release()
    assert drained == [1] and list(turns.steps) == [1, 4]


def test_a_call_of_n_requests_keeps_the_model_for_n_batches():
    turns, order = Turns(), []
    turns.take(1)
    turns.grant(3)  # three merged requests: three batches a turn
    other = threading.Thread(target=lambda: (turns.take(2), order.append(2), turns.release()))
    other.start()
    wait_for(lambda: turns.waiting == 1, "call 2 to queue")
    for _ in range(3):
        order.append(1)
        turns.between_batches(1, lambda: None)  # the third hands the model to call 2
    order.append(1)
    turns.release()
    other.join(timeout=30)
    assert order == [1, 1, 1, 2, 1]


def test_elmo_calls_run_whole_and_answer_as_the_featurizer(elmo_dir):
    """ELMo numbers its words per call, so its calls never interleave; concurrent requests still get their rows."""
    elmo = Featurizer(elmo_dir, sentence_pooling="mean")
    service = EmbeddingService(elmo, "elmo")
    assert not service.batcher.interleave
    texts = [f"the fox {i} jumps over {' dog' * i}" for i in range(1, 9)]
    with ServerThread(build_app(service)) as s:

        async def go():
            async with httpx.AsyncClient(base_url=s.url, timeout=120) as client:
                requests = [client.post("/v1/word-embeddings", json={"input": [t]}) for t in texts]
                return await asyncio.gather(*requests, client.post("/v1/embeddings", json={"input": texts}))

        *words, sentences = asyncio.run(go())
    for r, expected in zip(words, elmo.embed_words(texts)):
        np.testing.assert_allclose(r.json()["data"][0]["embeddings"], expected, atol=1e-5)
    np.testing.assert_allclose(
        [d["embedding"] for d in sentences.json()["data"]], elmo.embed_sentences(texts), atol=1e-5
    )
