#!/usr/bin/env python
"""Start-up of the one-query tools and of the server (issue 42's targets), each against the model load alone.

- `ctxrep search --index IX --query Q` and `ctxrep rerank --model CE --query Q --documents D`: wall time of the
  command, against a Python process that loads the same model and answers the same one query (its imports, the
  load, the query: what the command cannot avoid). Target: at most 1.3x.
- `ctxrep serve`: the first one-sentence request once /health answers, against the median of the next ones (warm).
  Target: at most 2x.

Each measurement runs --repeats times, the command and its reference interleaved (the machine's load moves both
alike); medians are reported. The index (--documents SST sentences) and a cross-encoder folder of the model's own
weights under a random one-label head (a reranker of that cost) are built once in a temporary folder.

Run:  .venv/bin/python benchmarks/startup.py                  # minilm, 5 repeats
      .venv/bin/python benchmarks/startup.py --repeats 1      # smoke test (not a result)
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import DEFAULT_DATA, cpu_model, cross_encoder_folder, free_port, load_corpus, start_server, stop_server

CLI = [sys.executable, "-c", "from ctxrep.cli import main; main()"]
TOOL_TARGET, FIRST_TARGET = 1.3, 2.0

LOAD_AND_SEARCH = """
import sys
from ctxrep.vectors.index import SentenceIndex
ix = SentenceIndex.load(sys.argv[1])
ix.search([sys.argv[2]], k=10)
"""
LOAD_AND_RERANK = """
import sys
from ctxrep.rerank import load_reranker
documents = [line for line in open(sys.argv[3], encoding="utf-8").read().splitlines() if line.strip()]
load_reranker(sys.argv[1]).rerank(sys.argv[2], documents)
"""


def wall(command: list[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"error: {' '.join(command[:6])} ... exited {done.returncode}: {done.stderr[-2000:]}")
    return seconds


def interleaved(pairs: dict[str, tuple[list[str], list[str]]], repeats: int) -> dict[str, tuple[float, float]]:
    """name -> (median seconds of the command, median of its reference), run one after the other, repeats times."""
    times = {name: ([], []) for name in pairs}
    for _ in range(repeats):
        for name, (command, reference) in pairs.items():
            times[name][0].append(wall(command))
            times[name][1].append(wall(reference))
    return {name: (statistics.median(a), statistics.median(b)) for name, (a, b) in times.items()}


def first_request(model: str, threads: int, repeats: int, sentence: str) -> list[tuple[float, float]]:
    """(first request's seconds after /health, median of the next 20) for `repeats` fresh servers."""
    import httpx

    out = []
    for _ in range(repeats):
        port = free_port()
        command = [*CLI, "serve", "--model", model, "--port", str(port), "--threads", str(threads)]
        base = f"http://127.0.0.1:{port}"
        server = start_server(command, f"{base}/health")
        try:
            with httpx.Client(base_url=base, timeout=120) as client:
                body = {"input": [sentence]}
                start = time.perf_counter()
                assert client.post("/v1/embeddings", json=body).status_code == 200
                first = time.perf_counter() - start
                warm = []
                for _ in range(20):
                    start = time.perf_counter()
                    assert client.post("/v1/embeddings", json=body).status_code == 200
                    warm.append(time.perf_counter() - start)
            out.append((first, statistics.median(warm)))
        finally:
            stop_server(server)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="minilm")
    p.add_argument("--documents", type=int, default=1000, help="SST sentences indexed (and reranked: the first 50)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2, help="the server's torch threads")
    p.add_argument("--data", type=Path, default=DEFAULT_DATA)
    args = p.parse_args()
    sentences = [" ".join(s) for s in load_corpus(args.data, "sst", args.documents)]
    query = "a moving portrait of a family in crisis"
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="ctxrep-startup-bench-"))
    try:
        (work / "docs.txt").write_text("\n".join(sentences) + "\n")
        (work / "rerank.txt").write_text("\n".join(sentences[:50]) + "\n")
        index = work / "ix"
        subprocess.run(
            [*CLI, "index", "build", "--input", str(work / "docs.txt"), "--model", args.model, "--out", str(index)],
            check=True,
            capture_output=True,
        )
        reranker = cross_encoder_folder(args.model, work / "ce")
        pairs = {
            "ctxrep search --query": (
                [*CLI, "search", "--index", str(index), "--query", query, "-k", "10"],
                [sys.executable, "-c", LOAD_AND_SEARCH, str(index), query],
            ),
            "ctxrep rerank --query": (
                [*CLI, "rerank", "--model", str(reranker), "--query", query, "--documents", str(work / "rerank.txt")],
                [sys.executable, "-c", LOAD_AND_RERANK, str(reranker), query, str(work / "rerank.txt")],
            ),
        }
        tools = interleaved(pairs, args.repeats)
        served = first_request(args.model, args.threads, args.repeats, query)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nmodel {args.model}, medians of {args.repeats} interleaved runs")
    print("| command | seconds | model load + one query in Python, seconds | ratio | target |")
    print("|---|---|---|---|---|")
    met = True
    for name, (command, reference) in tools.items():
        met &= command / reference <= TOOL_TARGET
        print(f"| {name} | {command:.2f} | {reference:.2f} | {command / reference:.2f} | <= {TOOL_TARGET} |")
    first = statistics.median(f for f, _ in served)
    warm = statistics.median(w for _, w in served)
    met &= first / warm <= FIRST_TARGET
    print(
        f"\nctxrep serve ({args.threads} threads): first request after /health {1000 * first:.0f} ms, warm "
        f"{1000 * warm:.0f} ms: {first / warm:.2f}x (target <= {FIRST_TARGET})"
    )
    print(f"targets: {'met' if met else 'missed'}")


if __name__ == "__main__":
    main()
