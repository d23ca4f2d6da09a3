"""What the server's tests share: uvicorn serving an app on 127.0.0.1 in a background thread; `ctxrep serve` run as
a process; a tiny random cross-encoder folder; a tiny random SPLADE folder; waiting for a condition."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import torch
import transformers
import uvicorn


def tiny_splade(folder: Path, tokenizer_from: Path) -> Path:
    """A random BertForMaskedLM (a SPLADE model's layout) with `tokenizer_from`'s tokenizer; a bias that spreads the
    weights, so that many vocabulary ids are non-zero."""
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=30522, max_position_embeddings=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64,
    )  # fmt: skip
    model = transformers.BertForMaskedLM(config)
    with torch.no_grad():
        model.cls.predictions.bias.normal_(0.0, 1.0)
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt"):
        shutil.copy(tokenizer_from / name, folder / name)
    return folder


def tiny_cross_encoder(folder: Path, tokenizer_from: Path) -> Path:
    """A random BertForSequenceClassification (one label) with `tokenizer_from`'s tokenizer and two declared
    prompts ("query", "web")."""
    torch.manual_seed(1)
    config = transformers.BertConfig(
        vocab_size=30522, max_position_embeddings=64, num_labels=1, hidden_size=32, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=64,
    )  # fmt: skip
    transformers.BertForSequenceClassification(config).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt"):
        shutil.copy(tokenizer_from / name, folder / name)
    prompts = {"prompts": {"query": "query : ", "web": "search the web :"}}
    (folder / "config_sentence_transformers.json").write_text(json.dumps(prompts))
    return folder


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now (for a server process the test starts)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(condition, what: str, limit: float = 60.0) -> None:
    """Poll `condition` (a bound on a hang, not a timed assertion)."""
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"still waiting for {what} after {limit:.0f} s")
        time.sleep(0.005)


class ServerThread:
    """uvicorn serving `app` on 127.0.0.1 (a free port) in a background thread; or `server`, a uvicorn.Server made
    elsewhere (ctxrep.serve.server.make_server)."""

    def __init__(self, app=None, server: uvicorn.Server | None = None) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = server or uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        assert self.server.started
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


class ServeProcess:
    """`ctxrep serve ARGS --port P` (a free port) as a process, ready once its /health answers; stopped with SIGTERM
    on exit. After exit, `stderr` holds what it wrote there."""

    def __init__(self, args: list[str], limit: float = 120.0) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = [sys.executable, "-c", "from ctxrep.cli import main; main()", "serve", *args]
        self.command += ["--port", str(self.port)]
        self.limit = limit
        self.stderr = ""

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"ctxrep serve ended with status {self.proc.returncode}: {self.proc.stderr.read()}")
        try:
            return httpx.get(f"{self.url}/health", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    def __enter__(self) -> ServeProcess:
        self.proc = subprocess.Popen(self.command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            wait_for(self._ready, "ctxrep serve to answer /health", self.limit)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            _, self.stderr = self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, self.stderr = self.proc.communicate()
