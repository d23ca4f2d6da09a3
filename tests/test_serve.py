"""`ctxrep serve`: OpenAI's /v1/embeddings through the official `openai` client, text-embeddings-inference's /embed
and /v1/word-embeddings through httpx, against the Featurizer's vectors; dynamic batching; every bad request's
status code and message; the API key; a graceful shutdown answering the request in flight."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import pytest
from _serve_helpers import ServerThread
from openai import AuthenticationError, NotFoundError, OpenAI, UnprocessableEntityError

from ctxrep import Featurizer
from ctxrep.serve.app import build_app
from ctxrep.serve.service import EmbeddingService, ServeConfig
from ctxrep.util.arrays import normalize_rows
from ctxrep.vectors.quantize import truncate

TEXTS = ["The vase broke .", "Dawn broke over the hills .", "A crane lifted the beam", "We broke even ."]
LONG = " ".join(f"word{i % 50} and" for i in range(400))  # over 512 pieces: windowed


@pytest.fixture(scope="module")
def fz():
    return Featurizer("minilm", sentence_pooling="mean")  # raw vectors (the folder itself ends in Normalize)


@pytest.fixture(scope="module")
def server(fz):
    config = ServeConfig(max_texts=8, max_text_chars=5000, max_body_bytes=20_000)
    with ServerThread(build_app(EmbeddingService(fz, "minilm", config))) as s:
        yield s


def test_openai_client_unchanged_float_and_base64(server, fz):
    client = OpenAI(base_url=f"{server.url}/v1", api_key="not-checked")
    expected = fz.embed_sentences(TEXTS)
    for encoding in ("float", "base64", None):  # None: the client asks for base64 and decodes it itself
        kwargs = {"encoding_format": encoding} if encoding else {}
        response = client.embeddings.create(model="minilm", input=TEXTS, **kwargs)
        if encoding == "base64":  # asked for explicitly, the client hands the strings over as they came
            got = np.stack([np.frombuffer(base64.b64decode(d.embedding), "<f4") for d in response.data])
        else:
            got = np.array([d.embedding for d in response.data], dtype=np.float32)
        np.testing.assert_allclose(got, expected, atol=1e-5)
        assert [d.index for d in response.data] == [0, 1, 2, 3] and response.model == "minilm"
        tokens = sum(len(p.tokens) for p in fz.tokenizer.encode_words([t.split() for t in TEXTS]))
        assert response.usage.prompt_tokens == response.usage.total_tokens == tokens
    one = client.embeddings.create(model="minilm", input=LONG)  # a single string, longer than the window
    np.testing.assert_allclose(one.data[0].embedding, fz.embed_sentences([LONG])[0], atol=1e-5)


def test_tei_embed_and_word_embeddings(server, fz):
    r = httpx.post(f"{server.url}/embed", json={"inputs": TEXTS})
    assert r.status_code == 200
    np.testing.assert_allclose(np.array(r.json()), normalize_rows(fz.embed_sentences(TEXTS)), atol=1e-5)
    raw = httpx.post(f"{server.url}/embed", json={"inputs": TEXTS[0], "normalize": False}).json()
    np.testing.assert_allclose(raw[0], fz.embed_sentences(TEXTS[:1])[0], atol=1e-5)

    r = httpx.post(f"{server.url}/v1/word-embeddings", json={"input": TEXTS, "layers": [0, -1], "pooling": "first"})
    assert r.status_code == 200, r.text
    view = Featurizer("minilm", layers=[0, -1], pooling="first")
    for item, words, expected in zip(r.json()["data"], TEXTS, view.embed_words(TEXTS)):
        assert item["words"] == words.split() and item["shape"] == [len(words.split()), 2, 384]
        np.testing.assert_allclose(np.array(item["embeddings"]), expected, atol=1e-5)
    r = httpx.post(
        f"{server.url}/v1/word-embeddings", json={"input": [["pre", "split"]], "encoding_format": "base64"}
    ).json()
    got = np.frombuffer(base64.b64decode(r["data"][0]["embeddings"]), "<f4").reshape(r["data"][0]["shape"])
    np.testing.assert_allclose(got, fz.embed_words([["pre", "split"]])[0], atol=1e-5)


def test_concurrent_requests_are_merged_and_each_gets_its_own_rows(server, fz):
    texts = [f"request {i} : {TEXTS[i % 4]}" for i in range(24)]
    expected = fz.embed_sentences(texts)
    before = _metric(server, "ctxrep_batches_total")

    async def go():
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            return await asyncio.gather(*(client.post("/v1/embeddings", json={"input": [t]}) for t in texts))

    responses = asyncio.run(go())
    assert all(r.status_code == 200 for r in responses)
    got = np.array([r.json()["data"][0]["embedding"] for r in responses], dtype=np.float32)
    np.testing.assert_allclose(got, expected, atol=1e-5)
    batches = _metric(server, "ctxrep_batches_total") - before
    assert 1 <= batches < len(texts), f"{batches} batches for {len(texts)} concurrent requests: nothing was merged"


def _metric(server, name: str) -> float:
    text = httpx.get(f"{server.url}/metrics").text
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name + " ")))


@pytest.mark.parametrize(
    "path, body, status, message",
    [
        ("/v1/embeddings", b'{"input": ["a",', 422, "malformed JSON"),
        ("/v1/embeddings", {"input": 5}, 422, "input: "),
        ("/v1/embeddings", {"input": [[101, 102]]}, 422, "input"),
        ("/v1/embeddings", {"input": []}, 422, "input: an empty list; send at least one text"),
        ("/v1/embeddings", {"input": ["ok", "  "]}, 422, "input[1]: an empty text"),
        ("/v1/embeddings", {"input": ["a"] * 9}, 413, "input: 9 texts; the limit is 8 per request (--max-texts"),
        (
            "/v1/embeddings",
            {"input": ["a " * 3000]},
            413,
            "input[0]: 6,000 characters; the limit is 5,000 per text (--max-text-chars",
        ),
        ("/v1/embeddings", {"input": ["ab " * 7000]}, 413, "over the limit of 20,000 bytes (--max-body-bytes"),
        ("/v1/embeddings", {"input": "a", "model": "gpt-4"}, 404, "model 'gpt-4' is not served here"),
        ("/v1/embeddings", {"input": "a", "encoding_format": "int8"}, 422, "encoding_format: "),
        ("/v1/embeddings", {"input": "a", "dimensions": 500}, 422, "dimensions=500 is more than the vectors' 384"),
        ("/v1/embeddings", {"input": "a", "dimensions": 0}, 422, "dimensions must be a positive integer"),
        ("/v1/word-embeddings", {"input": "a b", "layers": 99}, 422, "layers: layer 99 is out of range"),
        ("/v1/word-embeddings", {"input": "a b", "pooling": "max"}, 422, "pooling: "),
        ("/embed", {"inputs": None}, 422, "inputs: "),
    ],
)
def test_bad_requests_get_their_status_and_a_one_line_reason(server, path, body, status, message):
    if isinstance(body, bytes):
        r = httpx.post(server.url + path, content=body, headers={"content-type": "application/json"})
    else:
        r = httpx.post(server.url + path, json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    text = error if isinstance(error, str) else error["message"]
    assert message in text and "\n" not in text, text


def test_a_chunked_body_over_the_limit_is_413(server):
    def chunks():  # no Content-Length: the limit is counted as the body arrives
        yield b'{"input": ["'
        for _ in range(30):
            yield b"word " * 200
        yield b'"]}'

    r = httpx.post(f"{server.url}/v1/embeddings", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and "over the limit of 20,000 bytes (--max-body-bytes" in r.json()["error"]["message"]


def test_full_queue_answers_503_with_retry_after(fz):
    service = EmbeddingService(fz, "minilm", ServeConfig(max_queue_texts=3, max_texts=3, retry_after_s=3))
    with ServerThread(build_app(service)) as s:
        service.batcher.queued_texts = 2  # two texts of other requests waiting
        r = httpx.post(f"{s.url}/v1/embeddings", json={"input": TEXTS[:2]})
        assert r.status_code == 503 and r.headers["retry-after"] == "3"
        assert "the server is busy (2 texts queued, limit 3: --max-queue" in r.json()["error"]["message"]
        service.batcher.queued_texts = 0
        assert httpx.post(f"{s.url}/v1/embeddings", json={"input": TEXTS[:3]}).status_code == 200


def test_a_normalizing_server_still_answers_embed_normalize_false(fz):
    """--normalize makes /v1/embeddings unit-length; TEI's /embed follows each request's own "normalize" field."""
    with ServerThread(build_app(EmbeddingService(fz, "minilm", normalize=True))) as s:
        openai_style = np.array(
            [d["embedding"] for d in httpx.post(f"{s.url}/v1/embeddings", json={"input": TEXTS}).json()["data"]]
        )
        np.testing.assert_allclose(openai_style, normalize_rows(fz.embed_sentences(TEXTS)), atol=1e-5)
        raw = httpx.post(f"{s.url}/embed", json={"inputs": TEXTS[:1], "normalize": False}).json()
        np.testing.assert_allclose(raw[0], fz.embed_sentences(TEXTS[:1])[0], atol=1e-5)
        assert abs(np.linalg.norm(raw[0]) - 1) > 0.01  # MiniLM's raw mean-pooled vectors are not unit length
    with pytest.raises(ValueError, match="normalize=False"):
        EmbeddingService(Featurizer("minilm", normalize=True), "minilm")


def test_a_refused_text_fails_its_own_request_not_the_ones_batched_with_it(fz, monkeypatch):
    service = EmbeddingService(fz, "minilm", ServeConfig(max_wait_ms=500))  # both requests land in one batch
    run = service.batcher.run
    calls = []

    def refuse_poison(key, texts, between_batches):
        calls.append(len(texts))
        if any("POISON" in t for t in texts):  # the texts as sent: strings
            raise ValueError("text 'POISON': refused")
        return run(key, texts, between_batches)

    with ServerThread(build_app(service)) as s:
        monkeypatch.setattr(service.batcher, "run", refuse_poison)  # after the warm-up's calls

        async def both():
            async with httpx.AsyncClient() as client:
                good = client.post(f"{s.url}/v1/embeddings", json={"input": TEXTS[:2]})
                bad = client.post(f"{s.url}/v1/embeddings", json={"input": ["a POISON text"]})
                return await asyncio.gather(good, bad)

        good, bad = asyncio.run(both())
    assert sorted(calls[1:]) == [1, 2] and calls[0] == 3  # the merged call was refused, then each ran alone
    assert good.status_code == 200 and len(good.json()["data"]) == 2
    assert bad.status_code == 422 and "POISON" in bad.json()["error"]["message"]


def test_api_key_required_as_bearer_token(fz):
    service = EmbeddingService(fz, "minilm", ServeConfig(api_key="s3cret"))
    with ServerThread(build_app(service)) as s:
        assert httpx.get(f"{s.url}/health").status_code == 200  # the probe needs no key
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            r = httpx.post(f"{s.url}/v1/embeddings", json={"input": "a"}, headers=headers)
            assert r.status_code == 401 and "API key" in r.json()["error"]["message"]
        assert httpx.get(f"{s.url}/metrics").status_code == 401
        with pytest.raises(AuthenticationError):
            OpenAI(base_url=f"{s.url}/v1", api_key="wrong").embeddings.create(model="minilm", input="a")
        ok = OpenAI(base_url=f"{s.url}/v1", api_key="s3cret").embeddings.create(model="minilm", input="a")
        assert len(ok.data[0].embedding) == 384


def test_health_and_metrics(server):
    health = httpx.get(f"{server.url}/health").json()
    assert health["status"] == "ok" and health["model"] == "minilm" and health["dim"] == 384
    httpx.post(f"{server.url}/v1/embeddings", json={"input": "a b"})
    text = httpx.get(f"{server.url}/metrics").text
    assert 'ctxrep_requests_total{endpoint="/v1/embeddings",status="200"}' in text
    assert "# TYPE ctxrep_request_seconds summary" in text and "ctxrep_queue_texts 0" in text


def test_cli_listens_on_localhost_and_shuts_down_gracefully(tmp_path):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    log = tmp_path / "access.log"
    command = [sys.executable, "-c", "from ctxrep.cli import main; main()", "serve", "--port", str(port)]
    command += ["--access-log", str(log)]
    env = {**os.environ, "CTXREP_API_KEY": "k"}
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        texts = [f"{TEXTS[i % 4]} number {i}" for i in range(400)]
        result = {}

        def call():
            result["r"] = httpx.post(
                f"{url}/v1/embeddings", json={"input": texts}, headers={"Authorization": "Bearer k"}, timeout=60
            )

        assert httpx.post(f"{url}/v1/embeddings", json={"input": "a"}).status_code == 401  # the env var's key
        thread = threading.Thread(target=call)
        thread.start()
        time.sleep(0.2)  # the request is read and being embedded (400 texts: about a second on two cores)
        proc.send_signal(signal.SIGTERM)  # while the request is in flight
        thread.join(timeout=60)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert result["r"].status_code == 200 and len(result["r"].json()["data"]) == 400
    # uvicorn finishes the request in flight, shuts down, then re-raises the SIGTERM it caught (exit status -15)
    assert proc.returncode in (0, -signal.SIGTERM) and "Traceback" not in stderr, stderr
    assert f"on http://127.0.0.1:{port} with an API key" in stderr
    listening = json.dumps(stderr)
    assert "0.0.0.0" not in listening
    lines = log.read_text().splitlines()  # one line per request: client, method and path, status, milliseconds
    assert any('"POST /v1/embeddings" 401' in line for line in lines), lines
    assert any('"POST /v1/embeddings" 200' in line and line.endswith(" ms") for line in lines), lines


def test_v1_models_through_the_openai_client(server):
    client = OpenAI(base_url=f"{server.url}/v1", api_key="not-checked")
    models = client.models.list()
    assert [m.id for m in models.data] == ["minilm"] and models.data[0].owned_by == "ctxrep"
    assert client.models.retrieve("minilm").id == "minilm"
    with pytest.raises(NotFoundError, match="model 'gpt-4' is not served here"):
        client.models.retrieve("gpt-4")


JSON = {"content-type": "application/json"}


@pytest.mark.parametrize(
    "method, path, kwargs, status, message",
    [
        ("GET", "/v1/embeddings", {}, 405, "GET /v1/embeddings: method not allowed; use POST"),
        ("PUT", "/embed", {"json": {"inputs": "a"}}, 405, "PUT /embed: method not allowed; use POST"),
        ("POST", "/v1/nothing", {"json": {}}, 404, "POST /v1/nothing: no such route"),
        ("POST", "/v1/embeddings", {"data": {"input": "a b"}}, 415, "'application/x-www-form-urlencoded': send JSON"),
        ("POST", "/embed", {"files": {"inputs": b"a b"}}, 415, "'multipart/form-data': send JSON"),
        ("POST", "/v1/embeddings", {"json": ["a"]}, 422, "body: expected a JSON object"),
        ("POST", "/embed", {"json": {"inputs": []}}, 422, "inputs: an empty list"),
        (
            "POST",
            "/v1/embeddings",
            {"content": b'{"input": "\xff"}', "headers": JSON},
            400,
            "the body is not JSON text in UTF-8",
        ),
        ("POST", "/v1/embeddings", {"content": b""}, 422, "the body is empty; send a JSON object"),
        (
            "POST",
            "/embed",
            {"content": b'{"inputs": "a \\ud800"}', "headers": JSON},
            422,
            "inputs: not valid Unicode",
        ),
    ],
)
def test_every_error_comes_in_the_routes_own_schema(server, method, path, kwargs, status, message):
    r = httpx.request(method, server.url + path, **kwargs)
    assert r.status_code == status, r.text
    body = r.json()
    if path == "/embed":  # text-embeddings-inference's {"error", "error_type"}
        assert set(body) == {"error", "error_type"} and body["error_type"] == "Validation"
        assert message in body["error"], body
    else:  # OpenAI's {"error": {"message", "type", "param", "code"}}
        assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
        assert message in body["error"]["message"] and body["error"]["code"] == status, body


def test_texts_longer_than_the_window_are_reported_as_windowed(server, fz):
    r = httpx.post(f"{server.url}/v1/embeddings", json={"input": ["short one", LONG, "another"]}).json()
    assert r["windowed"] == {"count": 1, "indices": [1]}
    np.testing.assert_allclose(r["data"][1]["embedding"], fz.embed_sentences([LONG])[0], atol=1e-5)
    tei = httpx.post(f"{server.url}/embed", json={"inputs": [LONG, "short"]})
    assert tei.headers["x-windowed-count"] == "1" and tei.headers["x-windowed-indices"] == "0"
    words = httpx.post(f"{server.url}/v1/word-embeddings", json={"input": "a b"}).json()
    assert words["windowed"] == {"count": 0, "indices": []}


def test_embed_normalize_false_for_a_folder_that_normalizes():
    """MiniLM's folder ends in Normalize: /v1/embeddings and /embed's default are unit-length as the folder says,
    /embed with normalize false returns the pooled vectors before Normalize."""
    folder_fz = Featurizer("minilm", sentence_pooling="model")
    assert folder_fz.model_pooling.normalize
    expected = folder_fz.embed_sentences(TEXTS)  # the folder's own, unit-length
    with ServerThread(build_app(EmbeddingService(folder_fz, "minilm"))) as s:
        openai_style = [
            d["embedding"] for d in httpx.post(f"{s.url}/v1/embeddings", json={"input": TEXTS}).json()["data"]
        ]
        default = httpx.post(f"{s.url}/embed", json={"inputs": TEXTS}).json()
        raw = np.array(httpx.post(f"{s.url}/embed", json={"inputs": TEXTS, "normalize": False}).json())
    np.testing.assert_allclose(openai_style, expected, atol=1e-5)
    np.testing.assert_allclose(default, expected, atol=1e-5)
    assert np.all(np.abs(np.linalg.norm(raw, axis=1) - 1) > 0.01)  # not unit length ...
    np.testing.assert_allclose(normalize_rows(raw), expected, atol=1e-5)  # ... and the same direction
    assert folder_fz.model_pooling.normalize  # the caller's Featurizer is left as it was


def test_a_taken_port_is_one_line_before_the_model_loads():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        command = [sys.executable, "-c", "from ctxrep.cli import main; main()", "serve", "--port", str(port)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"error: cannot listen on 127.0.0.1:{port}: the port is taken by another program; choose another --port"
    )


def test_openai_dimensions_truncate_then_normalise_float_and_base64(server, fz):
    client = OpenAI(base_url=f"{server.url}/v1", api_key="not-checked")
    expected = truncate(fz.embed_sentences(TEXTS), 64)  # the library's truncation: first 64, unit length
    got = client.embeddings.create(model="minilm", input=TEXTS, dimensions=64, encoding_format="float")
    np.testing.assert_allclose([d.embedding for d in got.data], expected, atol=1e-5)
    packed = client.embeddings.create(model="minilm", input=TEXTS, dimensions=64, encoding_format="base64")
    decoded = np.stack([np.frombuffer(base64.b64decode(d.embedding), "<f4") for d in packed.data])
    np.testing.assert_allclose(decoded, expected, atol=1e-5)
    assert np.allclose(np.linalg.norm(decoded, axis=1), 1, atol=1e-5)
    with pytest.raises(UnprocessableEntityError, match="give at most 384"):
        client.embeddings.create(model="minilm", input=TEXTS, dimensions=1000)
