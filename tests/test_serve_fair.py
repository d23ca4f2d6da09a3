"""The server's fairness: a long request (many texts to embed, or many documents to rerank) runs in steps sized by a
time target at the throughput the server measured (`serve.batcher.Pace`) and a short request that arrives meanwhile
is answered between two of them (`serve.batcher.Turns`), with the same vectors and scores as the Featurizer and the
reranker alone; the server warms up before it answers /health."""

from __future__ import annotations

import asyncio
import threading

import httpx
import numpy as np
import pytest
from _serve_helpers import ServerThread, tiny_cross_encoder, wait_for

from ctxrep import Featurizer
from ctxrep.rerank import CrossEncoderReranker
from ctxrep.rerank.ranking import Reranker
from ctxrep.serve.app import build_app
from ctxrep.serve.batcher import Pace, Step, Turns
from ctxrep.serve.kinds import Answer
from ctxrep.serve.service import SENTENCES, EmbeddingService, Rerank, Sentences, ServeConfig

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

    finished = []
    with ServerThread(build_app(service)) as s:
        monkeypatch.setattr(turns, "between_batches", gated)  # after the warm-up's calls
        turns.steps.clear()
        service.batcher.pace = Pace(0.05)  # nothing measured: steps of the Featurizer's own 512 tokens, a window each

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
    assert not short_calls and service.metrics.batches == 6 + 2, steps  # the three requests were one call (after
    # the warm-up's six), of one batch: no step between two
    assert steps[0] == long_call and long_call in steps[1:], steps  # it ran between two long steps
    windows = len(fz.plan.single(0, fz.tokenizer.encode_words([LONG.split()])[0]))
    assert steps.count(long_call) == windows - 1  # a step between two of its batches, none after the last
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

    run, done = service.batcher.run, []

    def recorded(key, items, step):  # which call's model work ended first (on the worker threads)
        parts = run(key, items, step)
        done.append(type(key).__name__)
        return parts

    with ServerThread(build_app(service)) as s:
        monkeypatch.setattr(reranker.model, "encode", gated)  # after the warm-up's calls
        monkeypatch.setattr(service.batcher, "run", recorded)
        turns.steps.clear()
        service.batcher.pace = Pace(0.05)  # nothing measured: steps of the reranker's own 64 tokens, a pair each

        async def go():
            async with httpx.AsyncClient(base_url=s.url, timeout=120) as client:
                long = asyncio.create_task(client.post("/v1/rerank", json={"query": query, "documents": texts}))
                await asyncio.to_thread(first_batch.wait, 60)  # the rerank call holds the model
                short = await client.post("/v1/embeddings", json={"input": SHORTS[:1]})
                return await long, short

        long, short = asyncio.run(go())
    assert done == [Sentences.__name__, Rerank.__name__], done  # the short one after the first rerank batch
    steps = list(turns.steps)
    assert steps == [steps[0]] * (documents - 1), steps  # the rerank's steps between its batches; the short call
    # of one batch has none (it ran at the first of them)
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


def test_pace_sizes_a_step_by_the_time_target_at_the_measured_throughput():
    pace = Pace(0.05)
    assert pace.rate("m") is None and pace.step_tokens("m", 2048) == 2048  # nothing measured: the model's own budget
    pace.observe("m", 10_000, 1.0)  # 10,000 tokens/s
    assert pace.step_tokens("m", 2048) == 500  # 50 ms of it
    assert pace.step_tokens("m", 300) == 300  # never more than the model's own batch budget
    pace.observe("m", 600, 0.07)  # a call of at least a step (8,571 tokens/s) weighs by its time: a little
    assert 9_000 < pace.rate("m") < 10_000
    before = pace.rate("m")
    for _ in range(500):  # one-sentence requests, each mostly the fixed cost of a call (1,000 tokens/s)
        pace.observe("m", 10, 0.01)
    assert pace.rate("m") == before  # smaller than a step: they do not shrink the steps of the next long call
    for _ in range(30):  # the model got slower (a longer text, another load on the machine): recent calls weigh most
        pace.observe("m", 2_000, 1.0)
    assert 2_000 <= pace.rate("m") < 2_100 and pace.step_tokens("m", 2048) == 100
    slow = Pace(0.05)
    slow.observe("m", 100, 1.0)
    assert slow.step_tokens("m", 2048) == Pace.FLOOR and slow.rate("other") is None


def test_a_request_of_many_short_texts_runs_in_steps_of_the_time_target(fz, monkeypatch):
    """Many short texts in one request (the issue's 3,000 sentences): its batches are the step's tokens (the time
    target at the measured throughput), not the Featurizer's 512-token budget, and a short request that arrives
    runs after the first of them."""
    service = EmbeddingService(fz, "minilm")
    turns = service.batcher.turns
    between = turns.between_batches
    long_started = threading.Event()
    texts = [f"sentence number {i} of the long request" for i in range(300)]  # about 10 tokens each
    finished = []

    def gated(call, drain):
        if not long_started.is_set():
            long_started.set()
            wait_for(lambda: turns.waiting > 0, "the short request")
        between(call, drain)

    with ServerThread(build_app(service)) as s:
        monkeypatch.setattr(turns, "between_batches", gated)  # after the warm-up's calls
        turns.steps.clear()
        pace = service.batcher.pace = Pace(0.05)
        pace.observe(Answer.EMBEDDINGS, 2_560, 1.0)  # 2,560 tokens/s: steps of 128 tokens

        async def go():
            async with httpx.AsyncClient(base_url=s.url, timeout=120) as client:

                async def post(name, body):
                    r = await client.post("/v1/embeddings", json=body)
                    finished.append(name)
                    return r

                long = asyncio.create_task(post("long", {"input": texts}))
                await asyncio.to_thread(long_started.wait, 60)
                short = await post("short", {"input": SHORTS[:1]})
                return await long, short

        long, short = asyncio.run(go())
    steps = list(turns.steps)
    assert len(set(steps)) == 1, steps  # the short call (one batch) ran at the long call's first step
    assert finished[0] == "short" and len(steps) >= 20, steps  # 300 texts x ~10 tokens in steps of 128 (512: 6)
    np.testing.assert_allclose([d["embedding"] for d in long.json()["data"]], fz.embed_sentences(texts), atol=1e-5)
    np.testing.assert_allclose(short.json()["data"][0]["embedding"], fz.embed_sentences(SHORTS[:1])[0], atol=1e-5)


class WholeCallReranker(Reranker):
    """A reranker that predicts a call whole (batch_tokens None, as a pair model `ctxrep finetune` trained): scores
    a document by its length, and cuts the documents holding "long"."""

    max_length = 32

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.calls, self.cut_texts = tokenizer, [], []

    def predict(self, pairs, prompt=None, prompt_name=None):
        self.calls.append(len(pairs))
        self.cut_texts = [i for i, (_, d) in enumerate(pairs) if "long" in d]
        return np.array([len(d) for _, d in pairs], dtype=np.float32)


def test_a_reranker_without_batches_of_its_own_is_given_a_big_rerank_a_step_at_a_time(fz):
    reranker = WholeCallReranker(fz.tokenizer)
    service = EmbeddingService(None, "pairs", reranker=reranker)
    documents = [("a long one " if i % 7 == 3 else "") + "document " * (i % 5 + 1) + str(i) for i in range(60)]
    handed = []
    step = Step(tokens=40, between_batches=lambda drain: handed.append(len(reranker.calls)))
    ranked, counts, cut = Rerank(0, "which document", top_n=10).run(service, documents, step)
    assert sum(reranker.calls) == len(documents) and len(reranker.calls) >= 10, reranker.calls  # ~40 tokens a step
    assert handed == list(range(1, len(reranker.calls)))  # the model passed on between two steps
    alone = WholeCallReranker(fz.tokenizer).rerank("which document", documents, top_n=10)
    assert ranked.ids == alone.ids and np.array_equal(ranked.scores, alone.scores)
    assert [i for i, c in enumerate(cut) if c] == [i for i in range(60) if i % 7 == 3]  # in the request's numbering
    assert len(counts) == len(documents)


def test_the_server_warms_up_before_it_answers_health(fz, tmp_path, minilm_path):
    """Each model the server holds runs the shapes it serves before /health answers (its listening socket opens
    after the warm-up): the first request is then a warm one, and the steps have a measured throughput."""
    reranker = CrossEncoderReranker(tiny_cross_encoder(tmp_path / "ce", minilm_path))
    service = EmbeddingService(fz, "minilm", reranker=reranker, reranker_name="ce")
    assert service.warmed is None
    with ServerThread(build_app(service)) as s:
        assert service.warmed is not None  # before the server accepted its first connection
        assert service.warmed.shapes == (
            "one short text", "a step of short texts", "one text of 508 words", "a rerank of 8 documents",
        )  # fmt: skip
        assert service.warmed.seconds > 0 and "warmed up in" in service.warmed.describe()
        for answer in (Answer.EMBEDDINGS, Answer.RERANK):
            assert service.batcher.pace.rate(answer) > 0
        assert service.metrics.batches == 8  # each shape twice, before any request
        assert httpx.get(f"{s.url}/health").status_code == 200


def test_a_short_request_arriving_with_a_long_one_is_not_merged_into_it(fz):
    """Requests merge into one call up to one step's tokens (`Batcher.merge_budget`): a short request that arrives
    within the merge wait of a long one (the issue's 9-30x waits) runs as its own call, answered before the long one
    ends, not at its end."""
    service = EmbeddingService(fz, "minilm", ServeConfig(max_wait_ms=300, max_texts=400))
    texts = [f"sentence number {i} of the long request" for i in range(300)]
    with ServerThread(build_app(service)) as s:
        pace = service.batcher.pace = Pace(0.05)
        pace.observe(Answer.EMBEDDINGS, 2_560, 1.0)  # steps of 128 tokens
        assert service.batcher.merge_budget(SENTENCES) == 128
        finished = []

        async def go():
            async with httpx.AsyncClient(base_url=s.url, timeout=120) as client:

                async def post(name, body):
                    r = await client.post("/v1/embeddings", json=body)
                    finished.append(name)
                    return r

                return await asyncio.gather(post("long", {"input": texts}), post("short", {"input": SHORTS[:1]}))

        long, short = asyncio.run(go())
    assert finished == ["short", "long"] and long.status_code == short.status_code == 200
    assert service.metrics.batches - 6 == 2  # two calls (after the warm-up's six)
