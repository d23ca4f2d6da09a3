"""Long commands with their output in a file (no terminal): plain lines, no carriage-return bars, a bounded count.

`ctxrep mt train` is checked in test_mt_cli.py and the Trainer in test_trainer.py; here `ctxrep index build` (the
Featurizer's progress) and the downloads (a Hub model, an ELMo model), served by test_hub.py's local server.
"""

from __future__ import annotations

import os
import subprocess
import sys

from test_hub import _published, _sha, _tiny_elmo, bert_files, hub_env, server  # noqa: F401  (fixtures)

from ctxrep.models import hub


def _plain(text: str, most: int) -> list[str]:
    assert "\r" not in text and "\x1b" not in text, repr(text[:500])
    lines = text.splitlines()
    assert len(lines) <= most, text
    return lines


def test_index_build_with_its_output_in_a_file_writes_plain_lines(tiny_models, tmp_path):
    (tmp_path / "texts.txt").write_text("".join(f"sentence number {i} of the file\n" for i in range(40)))
    log = tmp_path / "build.log"
    args = [
        "index",
        "build",
        "--input",
        tmp_path / "texts.txt",
        "--model",
        tiny_models["bert"],
        "--out",
        tmp_path / "ix",
    ]
    with log.open("w") as out:
        done = subprocess.run(
            [sys.executable, "-c", "from ctxrep.cli import main; main()", *map(str, args)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            timeout=300,
        )
    text = log.read_text()
    assert done.returncode == 0, text
    lines = _plain(text, 10)
    assert any(line.startswith("embed: ") and "tok (100%)" in line for line in lines), text


def test_hub_download_in_a_log_is_one_plain_line(server, bert_files, capsys):  # noqa: F811
    server({"org/tiny-bert": {"refs": {"main": _sha(1)}, "commits": {_sha(1): bert_files}}})
    hub.hub_folder("org/tiny-bert", progress=True)  # capsys: stderr is no terminal
    err = capsys.readouterr().err
    (line,) = _plain(err, 1)
    assert line.startswith("hub model 'org/tiny-bert': fetching 5 files into "), line


def test_elmo_download_in_a_log_is_plain_lines(server, tmp_path, monkeypatch, capsys):  # noqa: F811
    s = server(static=_published(_tiny_elmo(tmp_path / "src"), "small"))
    monkeypatch.setenv("CTXREP_ELMO_BASE_URL", s.url + "/elmo/")
    hub.elmo_download("elmo:small", progress=True)
    lines = _plain(capsys.readouterr().err, 4)
    assert lines and all("B (100%)" in line or " B," in line for line in lines), lines
