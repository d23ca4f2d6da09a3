"""`ctxrep embed`'s progress from the first second (issue 42, item 4): a first line at once, a total that never
changes (a text file's texts counted first; unknown for JSONL until the input is read), the texts read, how far the
shard being embedded is; the default shard size (500 texts, or the folder's own when it resumes one)."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

import ctxrep.embed.corpus as corpus_module
from ctxrep.cli import main
from ctxrep.util.progress import progress

TEXTS = [f"line {i} : the bank {'raised ' * (i % 4)}its rates again ." for i in range(30)]


@pytest.fixture
def every_line(monkeypatch):
    """The progress of a log (no terminal), printing at every update instead of every 10 s."""
    monkeypatch.setattr(corpus_module, "progress", lambda **kw: progress(**kw, interval=0.0))


def embed(model, src, out, *args):
    return CliRunner().invoke(main, ["embed", "--model", model, "--input", str(src), "--out", str(out), *args])


def test_the_first_line_comes_at_once_and_the_total_of_a_text_file_never_changes(tiny_models, tmp_path, every_line):
    src = tmp_path / "in.txt"
    src.write_text("\n".join(TEXTS[:15]) + "\n\n" + "\n".join(TEXTS[15:]) + "\n")  # an empty line: not a text
    result = embed(str(tiny_models["bert"]), src, tmp_path / "out", "--shard-size", "10", "--skip-empty")
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("embed: ")]
    assert lines[0].startswith("embed: 0/30 texts (0%)"), lines  # before the model loads, with the total
    assert all("/30 texts" in line for line in lines), lines  # counted first: it never changes
    first_written = next(i for i, line in enumerate(lines) if "1 shard written" in line)
    within = [line for line in lines[:first_written] if re.search(r"shard 0: \d+% of its tokens", line)]
    assert within and "10 texts read" in within[0], lines  # the first shard's batches, before it is written
    assert lines[-1].startswith("embed: 30/30 texts (100%)") and "30 texts read, 3 shards written" in lines[-1]


def test_a_jsonl_total_is_unknown_until_the_input_is_read(tiny_models, tmp_path, every_line):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    result = embed(str(tiny_models["bert"]), src, tmp_path / "out", "--shard-size", "10")
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("embed: ")]
    assert lines[0].startswith("embed: 0 texts,"), lines  # no estimate that changes as bytes are read
    assert all("/" not in line.split(",")[0] for line in lines[:-1]), lines
    assert lines[-1].startswith("embed: 30/30 texts (100%)"), lines


def test_the_default_shard_size_is_500_or_the_folders_own(tiny_models, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("\n".join(TEXTS) + "\n")
    model = str(tiny_models["bert"])
    assert embed(model, src, tmp_path / "new").exit_code == 0
    assert json.loads((tmp_path / "new" / "manifest.json").read_text())["settings"]["shard_size"] == 500
    assert embed(model, src, tmp_path / "old", "--shard-size", "7").exit_code == 0
    again = embed(model, src, tmp_path / "old")  # the same folder without --shard-size: its own 7, not 500
    assert again.exit_code == 0, again.output
    assert json.loads((tmp_path / "old" / "manifest.json").read_text())["settings"]["shard_size"] == 7
