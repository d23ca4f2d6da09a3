#!/usr/bin/env python
"""Load on `ctxrep serve` (and infinity-emb, if it is installed) against the Featurizer in-process, same texts.

The benchmark starts its own server on 127.0.0.1 (a free port) as a subprocess, and only ever sends requests to it:
  --clients concurrent clients (asyncio + httpx, one connection each), each sending a request of 1-32 SST sentences
  (drawn with a fixed seed) to POST /v1/embeddings (OpenAI's schema, encoding_format=base64, as the openai client
  sends it), waiting for the answer, and sending the next, for --duration seconds or --max-requests requests,
  whichever comes first; then the server is stopped (SIGTERM) and the script exits by itself.
Every answer is checked: status 200 and one vector of the right width per sentence sent ("nothing lost").
Reported: sentences/s, requests/s, p50 / p99 latency, errors; then the Featurizer in-process
(Featurizer.embed_sentences over the same sentences, in the same requests' groups merged 256 at a time, the same
threads) for the ratio server / in-process (target >= 0.8).

--infinity PATH/TO/infinity_emb: the same load against infinity-emb (`infinity_emb v2`, torch engine, CPU) on the
same model folder, at its OpenAI-compatible /embeddings. It needs its own virtualenv: infinity-emb 0.0.78 pins
numpy<2, transformers 4.57 and older click / uvicorn / huggingface_hub than ctxrep's.

--mixed: the fairness row instead (issue 33): the same server, first --clients clients (default 32) sending 1-32
SST sentences for --duration / 2 seconds, then the same clients plus one client sending 20,000-word texts (SST
sentences joined) for another --duration / 2; reported: the short requests' p50 / p99 in each phase, their ratio
(target: p99 with the long client within 2x of p99 without it), the long requests answered, and errors (every answer
checked: nothing lost). The long client stops sending at the end; its request in flight is answered and checked.

--mixed-rerank: the same row with one client sending big rerank requests instead (POST /v1/rerank, --rerank-documents
documents of --rerank-words words each, SST sentences joined), to a server started with --reranker: a cross-encoder
folder of the model's own encoder weights under a random one-label head, written to a temporary folder (the cost of a
real reranker of that size; its scores mean nothing here, and every answer is checked for one score per document).

--fairness: issue 42's targets, three workloads on one server (started with --max-texts and --max-queue large enough,
and --reranker as --mixed-rerank's): one request of --long-sentences (3,000) SST sentences, one of a --long-words
(20,000-word) text, one rerank of --rerank-documents (500) documents of --rerank-words (50) words. For each: one
client sending one-sentence requests one after another alone (p50 / p95), the long request alone (its mean time,
--long-repeats times), then both together (the short requests' p50 / p95 and the long request's time). Targets:
short p50 and p95 beside the long request at most 2x alone; the long request's time at most 1.1x "today's", measured
on a second server started with --step-ms 1e9 (steps of the model's own batch budget: the batches before steps were
measured in time), alone, in the same run.

Run:  .venv/bin/python benchmarks/serve.py                       # 64 clients, 60 s, 2 server threads
      .venv/bin/python benchmarks/serve.py --fairness            # issue 42: 3 workloads x (alone, beside), + today's
      .venv/bin/python benchmarks/serve.py --mixed               # 32 short clients + 1 long, 2 x 30 s
      .venv/bin/python benchmarks/serve.py --mixed-rerank        # 32 short clients + 1 sending 100-document reranks
      .venv/bin/python benchmarks/serve.py --duration 5 --clients 8 # smoke test (not a result)
The machine's cores are shared between the server and the clients (that is part of what is measured).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from _common import (  # the benchmarks' shared SST reader and server helpers
    DEFAULT_DATA,
    cpu_model,
    cross_encoder_folder,
    free_port,
    load_corpus,
    start_server,
    stop_server,
)

TARGET = 0.8
MIXED_TARGET = 2.0  # p99 of the short requests with the long client / without it
LONG_WORDS = 20_000
RERANK_DOCUMENTS, RERANK_WORDS = 100, 200  # --mixed-rerank: a request as long as the 20,000-word text


def requests_plan(sentences: list[list[str]], n: int, seed: int) -> list[list[str]]:
    """n requests of 1-32 sentences each (as strings), drawn with `seed`."""
    rng = random.Random(seed)
    return [[" ".join(rng.choice(sentences)) for _ in range(rng.randint(1, 32))] for _ in range(n)]


def long_text(sentences: list[list[str]], words: int) -> str:
    """SST sentences joined, cut at `words` words."""
    out: list[str] = []
    while len(out) < words:
        for sentence in sentences:
            out += sentence
            if len(out) >= words:
                break
    return " ".join(out[:words])


@dataclass
class LongRequest:
    """What the long client sends, request after request, and how its answer is checked (an error, or None)."""

    url: str
    body: dict
    check: Callable[[object], str | None]


def long_embedding(url: str, model: str, text: str, dim: int) -> LongRequest:
    def check(r) -> str | None:
        ok = r.status_code == 200 and len(r.json()["data"]) == 1
        if not ok or len(base64.b64decode(r.json()["data"][0]["embedding"])) != 4 * dim:
            return f"long request: {r.status_code}: {r.text[:200]}"
        return None

    return LongRequest(url, {"model": model, "input": [text], "encoding_format": "base64"}, check)


def long_rerank(url: str, query: str, documents: list[str]) -> LongRequest:
    def check(r) -> str | None:
        if r.status_code != 200 or sorted(x["index"] for x in r.json()["results"]) != list(range(len(documents))):
            return f"rerank request: {r.status_code}: {r.text[:200]}"
        return None

    return LongRequest(url, {"query": query, "documents": documents}, check)


async def load(
    url: str,
    model: str,
    plan: list[list[str]],
    clients: int,
    duration: float,
    dim: int,
    long: LongRequest | None = None,
    start_request: int = 0,
) -> dict:
    """`clients` clients sending the plan's requests (from `start_request`) for `duration` seconds; with `long`, one
    more client sending that request, one after another."""
    import httpx

    latencies: list[float] = []
    long_latencies: list[float] = []
    sent_sentences = 0
    errors: list[str] = []
    next_request = start_request
    stop_at = time.monotonic() + duration

    async def long_client() -> None:
        async with httpx.AsyncClient(timeout=600) as http:
            while time.monotonic() < stop_at:
                start = time.perf_counter()
                r = await http.post(long.url, json=long.body)
                long_latencies.append(time.perf_counter() - start)
                error = long.check(r)
                if error is not None:
                    errors.append(error)

    async def client() -> None:
        nonlocal next_request, sent_sentences
        async with httpx.AsyncClient(timeout=120) as http:
            while time.monotonic() < stop_at and next_request < len(plan):
                texts = plan[next_request]
                next_request += 1
                start = time.perf_counter()
                r = await http.post(url, json={"model": model, "input": texts, "encoding_format": "base64"})
                latencies.append(time.perf_counter() - start)
                if r.status_code != 200:
                    errors.append(f"{r.status_code}: {r.text[:200]}")
                    continue
                data = r.json()["data"]
                ok = len(data) == len(texts) and all(
                    len(base64.b64decode(d["embedding"])) == 4 * dim and d["index"] == i for i, d in enumerate(data)
                )
                if not ok:
                    errors.append(f"request of {len(texts)} texts answered with {len(data)} rows or a wrong width")
                    continue
                sent_sentences += len(texts)

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)), *([long_client()] if long else []))
    elapsed = time.perf_counter() - start
    lat = np.array(latencies) * 1000
    return {
        "requests": len(latencies),
        "sentences": sent_sentences,
        "seconds": elapsed,
        "sentences_per_s": sent_sentences / elapsed,
        "p50_ms": float(np.percentile(lat, 50)) if len(lat) else float("nan"),
        "p99_ms": float(np.percentile(lat, 99)) if len(lat) else float("nan"),
        "errors": errors,
        "plan_used": next_request,
        "long_requests": len(long_latencies),
        "long_mean_s": float(np.mean(long_latencies)) if long_latencies else float("nan"),
    }


def in_process(model: str, threads: int, plan: list[list[str]]) -> tuple[float, int]:
    """The Featurizer on the same sentences: (sentences/s, sentences)."""
    from ctxrep.serve.service import make_service

    fz = make_service(model, threads=threads).fz  # the server's own construction (its sentence pooling)
    texts = [t for request in plan for t in request]
    fz.embed_sentences(texts[:64])  # warm-up, as the server's first requests warm it
    start = time.perf_counter()
    for i in range(0, len(texts), 256):
        fz.embed_sentences(texts[i : i + 256])
    return len(texts) / (time.perf_counter() - start), len(texts)


def report(name: str, result: dict) -> str:
    lost = len(result["errors"])
    return (
        f"| {name} | {result['sentences_per_s']:.1f} | {result['requests'] / result['seconds']:.1f} | "
        f"{result['p50_ms']:.0f} | {result['p99_ms']:.0f} | {result['requests']:,} | {lost} |"
    )


def mixed(args, sentences: list[list[str]], plan: list[list[str]], base: str, dim: int) -> None:
    """The fairness row: short requests alone, then beside one client sending 20,000-word texts (or, with
    --mixed-rerank, rerank requests of --rerank-documents documents)."""
    url = f"{base}/v1/embeddings"
    half = args.duration / 2
    alone = asyncio.run(load(url, args.model, plan, args.clients, half, dim))
    if args.mixed_rerank:
        documents = [long_text(sentences[i * 7 :], args.rerank_words) for i in range(args.rerank_documents)]
        long = long_rerank(f"{base}/v1/rerank", " ".join(sentences[0]), documents)
        what = f"{args.rerank_documents} x {args.rerank_words}-word-document rerank"
    else:
        long = long_embedding(url, args.model, long_text(sentences, args.long_words), dim)
        what = f"{args.long_words:,}-word"
    beside = asyncio.run(load(url, args.model, plan, args.clients, half, dim, long, alone["plan_used"]))
    print()
    print(
        f"{args.clients} clients sending 1-32 SST sentences per request, {half:.0f} s alone, then {half:.0f} s beside "
        f"one client sending {what} requests; model {args.model}, {args.threads} threads"
    )
    print("| load | short p50 ms | short p99 ms | short requests | long requests | long mean s | errors |")
    print("|---|---|---|---|---|---|---|")
    for name, r in (("short only", alone), (f"short + one {what} client", beside)):
        print(
            f"| {name} | {r['p50_ms']:.0f} | {r['p99_ms']:.0f} | {r['requests']:,} | {r['long_requests']} | "
            f"{r['long_mean_s']:.1f} | {len(r['errors'])} |"
        )
    ratio = beside["p99_ms"] / alone["p99_ms"]
    print(f"\nshort p99 with the long client / without = {ratio:.2f} (target <= {MIXED_TARGET})")
    errors = alone["errors"] + beside["errors"]
    if errors:
        print(f"errors (first 3): {errors[:3]}")
        sys.exit(1)


# ---- --fairness: one-sentence requests beside one long request (issue 42) ------------------------------------------

FAIR_TARGET = 2.0  # short p50 / p95 beside a long request / alone
LONG_TARGET = 1.1  # the long request's time / today's (a server with --step-ms 1e9)


async def short_client(url: str, model: str, texts: list[str], stop: asyncio.Event, out: list[float], errors: list):
    """One client sending one-sentence requests one after another until `stop`; each latency into `out`."""
    import httpx

    async with httpx.AsyncClient(timeout=600) as http:
        i = 0
        while not stop.is_set():
            start = time.perf_counter()
            r = await http.post(url, json={"model": model, "input": [texts[i % len(texts)]]})
            out.append(time.perf_counter() - start)
            if r.status_code != 200:
                errors.append(f"short: {r.status_code}: {r.text[:200]}")
            i += 1


async def long_client(long: LongRequest, repeats: int, out: list[float], errors: list, stop: asyncio.Event | None):
    """The long request `repeats` times one after another (each time into `out`); sets `stop` when done."""
    import httpx

    async with httpx.AsyncClient(timeout=3600) as http:
        for _ in range(repeats):
            start = time.perf_counter()
            r = await http.post(long.url, json=long.body)
            out.append(time.perf_counter() - start)
            error = long.check(r)
            if error is not None:
                errors.append(error)
    if stop is not None:
        stop.set()


async def fairness_phase(base: str, model: str, shorts: list[str], long: LongRequest | None, seconds: float,
                         repeats: int) -> dict:  # fmt: skip
    """Short requests alone for `seconds` (long None), or beside `long` sent `repeats` times (short None: the long
    request alone)."""
    short_ms, long_s, errors, stop = [], [], [], asyncio.Event()
    tasks = []
    if shorts:
        tasks.append(short_client(f"{base}/v1/embeddings", model, shorts, stop, short_ms, errors))
    if long is not None:
        tasks.append(long_client(long, repeats, long_s, errors, stop))
    else:
        asyncio.get_running_loop().call_later(seconds, stop.set)
    await asyncio.gather(*tasks)
    lat = np.array(short_ms) * 1000
    return {
        "p50_ms": float(np.percentile(lat, 50)) if len(lat) else float("nan"),
        "p95_ms": float(np.percentile(lat, 95)) if len(lat) else float("nan"),
        "shorts": len(lat),
        "long_s": float(np.mean(long_s)) if long_s else float("nan"),
        "errors": errors,
    }


def fairness(args, sentences: list[list[str]]) -> None:
    """Issue 42's table: for each long workload, one-sentence requests alone and beside it; its time against
    today's (a server with --step-ms 1e9)."""
    import httpx

    work = Path(tempfile.mkdtemp(prefix="ctxrep-fair-bench-"))
    reranker = cross_encoder_folder(args.model, work / "cross-encoder")
    shorts = [" ".join(s) for s in sentences[:500]]
    rng = random.Random(args.seed)
    many = [" ".join(rng.choice(sentences)) for _ in range(args.long_sentences)]
    documents = [long_text(sentences[i * 7 :], args.rerank_words) for i in range(args.rerank_documents)]
    texts = max(args.long_sentences, args.rerank_documents) + 16

    def start(step_ms: float):
        port = free_port()
        command = [sys.executable, "-c", "from ctxrep.cli import main; main()", "serve", "--model", args.model]
        command += ["--host", "127.0.0.1", "--port", str(port), "--threads", str(args.threads), "--reranker"]
        command += [str(reranker), "--max-texts", str(texts), "--max-queue", str(2 * texts), "--step-ms", str(step_ms)]
        base = f"http://127.0.0.1:{port}"
        return start_server(command, f"{base}/health"), base

    def workloads(base: str, dim: int) -> dict[str, LongRequest]:
        url = f"{base}/v1/embeddings"
        many_request = LongRequest(url, {"model": args.model, "input": many, "encoding_format": "base64"}, _rows(dim))
        return {
            f"{args.long_sentences:,} short sentences in one request": many_request,
            f"one {args.long_words:,}-word text": long_embedding(
                url, args.model, long_text(sentences, args.long_words), dim
            ),
            f"a rerank of {args.rerank_documents} x {args.rerank_words}-word documents": long_rerank(
                f"{base}/v1/rerank", " ".join(sentences[0]), documents
            ),
        }

    rows, errors = [], []
    try:
        today, today_base = start(1e9)
        try:
            dim = httpx.get(f"{today_base}/health").json()["dim"]
            before = {
                name: asyncio.run(fairness_phase(today_base, args.model, [], long, 0, args.long_repeats))
                for name, long in workloads(today_base, dim).items()
            }
        finally:
            stop_server(today)
        server, base = start(args.step_ms)
        try:
            alone = asyncio.run(fairness_phase(base, args.model, shorts, None, args.short_seconds, 0))
            for name, long in workloads(base, dim).items():
                by_itself = asyncio.run(fairness_phase(base, args.model, [], long, 0, args.long_repeats))
                beside = asyncio.run(fairness_phase(base, args.model, shorts, long, 0, args.long_repeats))
                errors += by_itself["errors"] + beside["errors"] + before[name]["errors"]
                rows.append((name, beside, by_itself["long_s"], before[name]["long_s"]))
            errors += alone["errors"]
        finally:
            stop_server(server)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print()
    print(
        f"one client of one-sentence requests, alone ({alone['shorts']} requests in {args.short_seconds:.0f} s) and "
        f"beside each long request ({args.long_repeats} times); model {args.model}, {args.threads} threads, "
        f"--step-ms {args.step_ms:g}; 'today': a server with --step-ms 1e9 (steps of the model's own batch budget)"
    )
    print(f"short alone: p50 {alone['p50_ms']:.0f} ms, p95 {alone['p95_ms']:.0f} ms")
    print("| long request | short p50 ms (x alone) | short p95 ms (x alone) | long s alone | today s | x today |")
    print("|---|---|---|---|---|---|")
    met = True
    for name, beside, long_s, today_s in rows:
        p50, p95, slower = beside["p50_ms"] / alone["p50_ms"], beside["p95_ms"] / alone["p95_ms"], long_s / today_s
        met &= p50 <= FAIR_TARGET and p95 <= FAIR_TARGET and slower <= LONG_TARGET
        print(
            f"| {name} | {beside['p50_ms']:.0f} ({p50:.2f}x) | {beside['p95_ms']:.0f} ({p95:.2f}x) | {long_s:.2f} | "
            f"{today_s:.2f} | {slower:.2f}x |"
        )
    print(
        f"\ntargets: short p50 and p95 <= {FAIR_TARGET}x alone, the long request <= {LONG_TARGET}x today's: "
        f"{'met' if met else 'missed'}"
    )
    if errors:
        print(f"errors (first 3): {errors[:3]}")
        sys.exit(1)


def _rows(dim: int) -> Callable[[object], str | None]:
    def check(r) -> str | None:
        data = r.json().get("data", []) if r.status_code == 200 else []
        if r.status_code != 200 or any(len(base64.b64decode(d["embedding"])) != 4 * dim for d in data):
            return f"long request: {r.status_code}: {r.text[:200]}"
        return None

    return check


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="minilm")
    p.add_argument("--clients", type=int, default=None, help="concurrent clients (default 64; --mixed: 32)")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of load (default 60; --mixed: in two halves)")
    p.add_argument("--mixed", action="store_true", help="the fairness row: short requests beside 20,000-word ones")
    p.add_argument("--long-words", type=int, default=LONG_WORDS, help="--mixed: words of each long text")
    p.add_argument("--mixed-rerank", action="store_true", help="the fairness row beside big rerank requests")
    p.add_argument("--rerank-documents", type=int, default=RERANK_DOCUMENTS, help="--mixed-rerank: per request")
    p.add_argument("--rerank-words", type=int, default=RERANK_WORDS, help="--mixed-rerank: words per document")
    p.add_argument("--max-requests", type=int, default=20000, help="stop after this many requests")
    p.add_argument("--fairness", action="store_true", help="issue 42's three workloads: short beside long, + today's")
    p.add_argument("--long-sentences", type=int, default=3000, help="--fairness: sentences of the many-text request")
    p.add_argument("--long-repeats", type=int, default=3, help="--fairness: each long request this many times")
    p.add_argument("--short-seconds", type=float, default=20.0, help="--fairness: one-sentence requests alone")
    p.add_argument("--step-ms", type=float, default=50.0, help="--fairness: the server's --step-ms")
    p.add_argument("--threads", type=int, default=2, help="torch threads of the server and of the in-process run")
    p.add_argument("--data", type=Path, default=DEFAULT_DATA)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--infinity", default=None, help="the infinity_emb executable (its own venv): the same load against it"
    )
    args = p.parse_args()
    if args.fairness:  # its own servers; a rerank of 500 documents of 50 words unless given
        words = "--rerank-words" in sys.argv
        docs = "--rerank-documents" in sys.argv
        args.rerank_words, args.rerank_documents = (
            (args.rerank_words if words else 50),
            (args.rerank_documents if docs else 500),
        )
        print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f}", flush=True)
        return fairness(args, load_corpus(args.data, "sst", 4000))
    args.mixed = args.mixed or args.mixed_rerank
    args.clients = args.clients or (32 if args.mixed else 64)

    sentences = load_corpus(args.data, "sst", 4000)
    plan = requests_plan(sentences, args.max_requests, args.seed)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-c", "from ctxrep.cli import main; main()", "serve", "--model", args.model]
    command += ["--host", "127.0.0.1", "--port", str(port), "--threads", str(args.threads)]
    work = Path(tempfile.mkdtemp(prefix="ctxrep-serve-bench-"))
    if args.mixed_rerank:
        command += ["--reranker", str(cross_encoder_folder(args.model, work / "cross-encoder"))]
    env_key = os.environ.pop("CTXREP_API_KEY", None)  # the benchmark's own server runs without a key
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f}", flush=True)
    server = start_server(command, f"{base}/health")
    try:
        dim = __import__("httpx").get(f"{base}/health").json()["dim"]
        if args.mixed:
            return mixed(args, sentences, plan, base, dim)
        result = asyncio.run(load(f"{base}/v1/embeddings", args.model, plan, args.clients, args.duration, dim))
    finally:
        stop_server(server)
        shutil.rmtree(work, ignore_errors=True)
        if env_key is not None:
            os.environ["CTXREP_API_KEY"] = env_key
    used = plan[: result["plan_used"]]
    local_rate, local_n = in_process(args.model, args.threads, used)
    rows = [report("ctxrep serve", result)]
    if args.infinity:
        from ctxrep.models.loading import resolve

        folder = resolve(args.model).folder
        iport = free_port()
        icommand = [args.infinity, "v2", "--model-id", str(folder), "--served-model-name", args.model]
        icommand += ["--port", str(iport), "--host", "127.0.0.1", "--engine", "torch", "--device", "cpu"]
        icommand += ["--no-bettertransformer", "--no-vector-disk-cache", "--log-level", "warning"]
        iserver = start_server(icommand, f"http://127.0.0.1:{iport}/health")
        try:
            iresult = asyncio.run(
                load(f"http://127.0.0.1:{iport}/embeddings", str(folder), plan, args.clients, args.duration, dim)
            )
        finally:
            stop_server(iserver)
        rows.append(report("infinity-emb", iresult))
    print()
    print(
        f"{args.clients} clients, 1-32 SST sentences per request, {args.duration:.0f} s, model {args.model}, "
        f"{args.threads} threads"
    )
    print("| server | sentences/s | requests/s | p50 ms | p99 ms | requests | errors |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    ratio = result["sentences_per_s"] / local_rate
    print(
        f"\nFeaturizer in-process on the same {local_n:,} sentences: {local_rate:.1f} sentences/s; "
        f"ctxrep serve / in-process = {ratio:.2f} (target >= {TARGET})"
    )
    if result["errors"]:
        print(f"errors (first 3): {result['errors'][:3]}")
        sys.exit(1)


if __name__ == "__main__":
    main()
