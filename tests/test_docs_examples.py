"""Every ```python and ```sh block of README.md and docs/ runs, page by page, as a reader would run them in order
(docs/examples.md states the rules this file applies):

- each page runs in a fresh folder holding small stand-in input files under the names the pages use
  (tests/_docs_workspace.py), with a Hugging Face cache in which every Hub name a page uses is a tiny random folder of
  the same layout, offline (HF_HUB_OFFLINE=1): a name without a stand-in fails its block;
- a page's Python blocks share one namespace, top to bottom; a shell block's lines are `ctxrep` commands, run
  in this process through click (one process for the whole page: no interpreter start per command), and `curl`;
- `ctxrep serve` starts the server as a process for the rest of the page, on a free port that replaces the page's
  8080 in the blocks after it;
- a run that takes minutes as written gets one documented small override (SMALL_OVERRIDES): a few optimizer steps;
- a DeprecationWarning from ctxrep fails the block: the pages show the names that stay.

A block in another language (```text for output and layouts, ```toml, ```json) is not code; any other fence,
or a fence without a language, fails test_every_block_is_classified.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests._docs_workspace import hub_cache, write_inputs
from tests._serve_helpers import free_port, wait_for

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
RUN = ("python", "sh")
NOT_CODE = ("text", "toml", "json")
FENCE = re.compile(r"^(?P<indent>[ ]*)```(?P<lang>[^\s`]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ ]*$", re.M | re.S)
SERVE_PORT = "8080"  # the port the pages' `ctxrep serve` lines name

# Commands that take minutes as written: what the tests add (each a documented override, docs/examples.md).
SMALL_OVERRIDES = {
    ("pretrain",): ["--max-steps", "2"],
    ("mt", "train"): ["--max-steps", "2"],
    ("seq2seq", "train"): ["--max-steps", "2"],
    ("distill",): ["--max-steps", "2"],  # with --corpus; a --task distillation takes --max-epochs
}


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    code: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    text = page.read_text(encoding="utf-8")
    found = []
    for m in FENCE.finditer(text):
        body = "\n".join(line[len(m["indent"]) :] for line in m["body"].splitlines())
        found.append(Block(page, text.count("\n", 0, m.start()) + 1, m["lang"], body + "\n"))
    return found


def runnable_pages() -> list[Path]:
    return [p for p in PAGES if any(b.lang in RUN for b in blocks(p))]


def test_every_block_is_classified():
    """A fence is code that runs (python, sh) or says what it is (text, toml, json): nothing is left out unnamed."""
    odd = [f"{b.where}: ```{b.lang}" for p in PAGES for b in blocks(p) if b.lang not in RUN + NOT_CODE]
    assert not odd, "fences the tests neither run nor know as text: " + ", ".join(odd)
    assert sum(b.lang in RUN for p in PAGES for b in blocks(p)) >= 40  # the pages hold the examples


# ---- running a page ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hub(tmp_path_factory, minilm_path) -> Path:
    return hub_cache(tmp_path_factory.mktemp("hub"), minilm_path)


class Server:
    """`ctxrep serve ARGS` as a process on a free port, ready once /health answers."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.port = free_port()
        args = list(args)
        if "--port" in args:
            args[args.index("--port") + 1] = str(self.port)
        else:
            args += ["--port", str(self.port)]
        command = [sys.executable, "-c", "from ctxrep.cli import main; main()", "serve", *args]
        self.proc = subprocess.Popen(command, env=os.environ | env, stderr=subprocess.PIPE, text=True)
        wait_for(self._ready, "ctxrep serve to answer /health", 120)

    def _ready(self) -> bool:
        import httpx

        if self.proc.poll() is not None:
            raise AssertionError(f"ctxrep serve ended with status {self.proc.returncode}: {self.proc.stderr.read()}")
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.communicate(timeout=60)


class Page:
    """One page's run: its namespace, its server, where it is."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.namespace: dict = {"__name__": "docs_example"}
        self.server: Server | None = None

    def with_port(self, code: str) -> str:
        return code if self.server is None else code.replace(f":{SERVE_PORT}", f":{self.server.port}")

    def python(self, block: Block) -> None:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(self.with_port(block.code), block.where, "exec"), self.namespace)  # noqa: S102

    def sh(self, block: Block) -> None:
        for command in shell_commands(self.with_port(block.code)):
            env = {}
            while command and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", command[0]):
                key, value = command.pop(0).split("=", 1)
                env[key] = value
            program, args = command[0], command[1:]
            if program == "ctxrep":
                self.ctxrep(block, args, env)
            elif program == "curl":
                run = subprocess.run(command + ["--fail-with-body"], capture_output=True, text=True, timeout=60)
                assert run.returncode == 0, f"{block.where}: {shlex.join(command)} -> {run.stdout}{run.stderr}"
            else:
                raise AssertionError(f"{block.where}: {program}: the pages' shell blocks run ctxrep and curl only")

    def ctxrep(self, block: Block, args: list[str], env: dict[str, str]) -> None:
        from ctxrep.cli import main

        if args[:1] == ["serve"]:
            if self.server is not None:
                self.server.stop()
            self.server = Server(args[1:], env)
            return
        for prefix, extra in SMALL_OVERRIDES.items():
            if tuple(args[: len(prefix)]) == prefix and "--max-steps" not in args and "--task" not in args:
                args = args + extra
        result = CliRunner().invoke(main, args, env=env, catch_exceptions=True)
        if result.exit_code != 0:
            raise AssertionError(
                f"{block.where}: ctxrep {shlex.join(args)} exited {result.exit_code}:\n{result.output[-3000:]}"
            ) from result.exception

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
        ray = sys.modules.get("ray")
        if ray is not None and ray.is_initialized():  # a page's local Ray ends with the page
            ray.shutdown()


def shell_commands(code: str) -> list[list[str]]:
    """The commands of a shell block: continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", code)
    return [words for line in joined.splitlines() if (words := shlex.split(line, comments=True))]


def _deprecations(caught: list[warnings.WarningMessage]) -> list[str]:
    src = str(ROOT / "src" / "ctxrep")
    return [
        f"{w.filename}:{w.lineno}: {w.message}"
        for w in caught
        if issubclass(w.category, DeprecationWarning) and (w.filename.startswith(src) or ".md:" in w.filename)
    ]


@pytest.mark.parametrize("page", runnable_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_page_examples_run(page, hub, tmp_path, monkeypatch):
    work = write_inputs(tmp_path / "work")
    monkeypatch.chdir(work)
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("CTXREP_CACHE", str(tmp_path / "cache"))
    run = Page(work)
    try:
        for block in blocks(page):
            if block.lang not in RUN:
                continue
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                getattr(run, block.lang)(block)
            deprecated = _deprecations(caught)
            assert not deprecated, f"{block.where}: the example uses names that are going: {deprecated}"
    finally:
        run.close()
