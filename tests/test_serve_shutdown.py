"""`ctxrep serve`'s shutdown past its graceful wait: the requests still running are cut with one log line naming
them (no traceback), each client gets a 503 in its route's schema, and their model calls stop at their next step."""

from __future__ import annotations

import asyncio
import logging
import threading

import httpx
import pytest
from _serve_helpers import ServerThread, free_port, tiny_cross_encoder, wait_for

from ctxrep import Featurizer
from ctxrep.rerank import CrossEncoderReranker
from ctxrep.serve.errors import error_message
from ctxrep.serve.server import SERVER_LOG, make_server
from ctxrep.serve.service import EmbeddingService, ServeConfig

WAIT_S = 0.5


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def served(tmp_path, minilm_path):
    """A server whose graceful-shutdown wait is WAIT_S, with a reranker of one pair per batch; its log's records."""
    reranker = CrossEncoderReranker(tiny_cross_encoder(tmp_path / "ce", minilm_path), batch_tokens=64)
    config = ServeConfig(graceful_shutdown_s=WAIT_S)
    service = EmbeddingService(Featurizer("minilm"), "minilm", config, reranker=reranker, reranker_name="ce")
    server = make_server(service)
    log = Records()
    SERVER_LOG.addHandler(log)  # after make_server: uvicorn's Config sets its loggers up anew
    yield service, server, log.records
    SERVER_LOG.removeHandler(log)


def test_requests_past_the_graceful_wait_are_cut_with_one_line(served, monkeypatch):
    """A rerank request holds the model and an embedding request waits in line when the server is told to stop; the
    rerank's first step lasts until both are cut. Both clients get a 503, one line names both, and neither model
    call runs another batch."""
    service, server, records = served
    turns = service.batcher.turns
    between, first_step = turns.between_batches, threading.Event()

    def held(call, drain):  # the rerank call's first step outlasts the graceful wait: it ends once both are cut
        if not first_step.is_set():
            first_step.set()
            wait_for(lambda: server.cutoff.stopping and not server.cutoff.in_flight, "the requests to be cut")
        between(call, drain)

    documents = [f"document {i} about a crane that lifted {i} beams " * 8 for i in range(12)]  # 12 steps
    with ServerThread(server=server) as s:
        monkeypatch.setattr(turns, "between_batches", held)  # after the warm-up's calls
        turns.steps.clear()

        async def go():
            async with httpx.AsyncClient(base_url=s.url, timeout=120) as client:
                rerank = asyncio.create_task(
                    client.post("/v1/rerank", json={"query": "a crane", "documents": documents})
                )
                await asyncio.to_thread(first_step.wait, 60)  # the rerank call holds the model
                embed = asyncio.create_task(client.post("/v1/embeddings", json={"input": ["two words"]}))
                await asyncio.to_thread(wait_for, lambda: turns.waiting == 1, "the embedding call in line")
                server.should_exit = True
                return await rerank, await embed

        rerank, embed = asyncio.run(go())
    for r, body_keys in ((rerank, {"message"}), (embed, {"error"})):  # Cohere's error schema, OpenAI's
        assert r.status_code == 503 and set(r.json()) == body_keys, r.text
        message = error_message(r.json())
        assert message.startswith("the server is shutting down and this request was still running after its "), message
        assert f"{WAIT_S:g} s graceful-shutdown wait, so it was cut; send it again" in message
    assert all(r.exc_info is None for r in records), [r.getMessage() for r in records]  # no traceback
    errors = [r.getMessage() for r in records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, errors  # uvicorn's own "Cancel 2 running task(s)" line is replaced by this one
    assert errors[0].startswith(f"shutting down: the {WAIT_S:g} s graceful-shutdown wait ran out; cut 2 requests")
    assert "POST /v1/rerank from 127.0.0.1:" in errors[0] and "POST /v1/embeddings from 127.0.0.1:" in errors[0]
    assert errors[0].count("answered 503") == 2, errors[0]
    said = [r.getMessage() for r in records if r.getMessage().startswith("shutting down: finishing")]
    assert said == [f"shutting down: finishing 2 requests in flight, for at most {WAIT_S:g} s (--graceful-shutdown-s)"
                    "; those still running then get a 503"], said  # fmt: skip
    assert len(turns.steps) == 1, list(turns.steps)  # one rerank batch of 12; the embedding call ran none


def test_the_cli_cuts_a_request_past_graceful_shutdown_s_with_one_line_and_exits_130(tiny_models):
    """`ctxrep serve --graceful-shutdown-s 0.5` under a real Ctrl-C while a long request runs: the client gets a
    503 in OpenAI's schema, stderr names the cut request in one line (no traceback), the exit status is 130."""
    import time

    from test_ctrl_c import CTXREP, _interrupt

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [CTXREP, "serve", "--model", str(tiny_models["bert"]), "--port", str(port), "--threads", "1"]
    command += ["--graceful-shutdown-s", "0.5", "--max-batch-tokens", "64", "--max-texts", "4000"]
    texts = [f"line {i} : " + "the bank raised its rates again . " * 20 for i in range(4000)]  # many steps
    answer = {}

    def long_request_running() -> bool:
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code != 200:
                return False
        except httpx.TransportError:
            return False
        call = lambda: answer.update(r=httpx.post(f"{url}/v1/embeddings", json={"input": texts}, timeout=120))  # noqa: E731
        answer["thread"] = threading.Thread(target=call)
        answer["thread"].start()
        time.sleep(1.0)  # read and running
        return True

    done = _interrupt(command, long_request_running, seed=7)
    answer["thread"].join(timeout=60)
    assert done.returncode == 130, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr
    cut = [line for line in done.stderr.splitlines() if "graceful-shutdown wait ran out" in line]
    assert len(cut) == 1 and "POST /v1/embeddings" in cut[0], (done.stderr, answer["r"].text)
    assert "shutting down: finishing 1 request in flight, for at most 0.5 s (--graceful-shutdown-s)" in done.stderr
    assert answer["r"].status_code == 503 and "graceful-shutdown wait" in answer["r"].json()["error"]["message"]


def test_a_request_limit_above_the_queue_limit_is_refused_at_start():
    with pytest.raises(ValueError, match=r"max_texts \(20,000 .* could never be queued: raise --max-queue"):
        ServeConfig(max_texts=20_000, max_queue_texts=4096)
