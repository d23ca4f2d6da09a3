"""ctxrep.embed.corpus, the library behind `ctxrep embed`: the rough edges a new user hit (progress without a
terminal, the row shape of --layers all, the model named as typed, load_vectors' API), several workers giving the
one-process folder, and a worker killed with SIGKILL followed by a rerun."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import ctxrep
from ctxrep.cli import main
from ctxrep.embed.corpus import (
    EmbedJob,
    SentenceVectors,
    ShardFolder,
    describe_row_shape,
    embed_corpus,
    load_shards,
)

TEXTS = [f"sentence number {i} says the crane {'lifted ' * (i % 4)}the beam ." for i in range(11)]


@pytest.fixture()
def corpus(tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("\n".join(TEXTS) + "\n")
    return src


def test_progress_lines_when_stderr_is_not_a_terminal(corpus, tmp_path):
    result = CliRunner().invoke(
        main, ["embed", "--input", str(corpus), "--out", str(tmp_path / "o"), "--shard-size", "4"]
    )
    assert result.exit_code == 0, result.output
    lines = result.stderr.strip().splitlines()
    # CliRunner's stderr is no terminal: plain progress lines, the last one at 100%, counting texts (not bytes)
    assert lines and lines[-1].startswith("embed: 11/11 texts (100%), "), result.stderr
    assert lines[-1].endswith(", 11 texts read, 3 shards written") and " B" not in lines[-1]
    assert lines[0].startswith("embed: 0/11 texts (0%)")  # the first line at once, its total counted first
    assert "\r" not in result.stderr


def test_layers_all_reports_layers_and_width_and_names_the_model_as_typed(corpus, tmp_path):
    out = tmp_path / "o"
    result = CliRunner().invoke(main, ["embed", "--input", str(corpus), "--out", str(out), "--layers", "all"])
    assert result.exit_code == 0, result.output
    words = sum(len(t.split()) for t in TEXTS)
    assert result.stdout.strip() == f"wrote {words} word vectors (7 layers x 384 wide) of minilm for 11 texts to {out}"
    assert "ctxrep_models" not in result.output and "site-packages" not in result.output
    vectors = ctxrep.load_vectors(out)
    assert vectors.row_shape == (7, 384) and vectors.array.shape == (words, 7, 384)
    assert "model='minilm'" in repr(vectors) and "row_shape=7x384" in repr(vectors)
    assert describe_row_shape((384,)) == "384 wide"


def test_load_vectors_array_is_a_property_and_the_help_is_real(corpus, tmp_path):
    embed_corpus(EmbedJob(str(corpus), str(tmp_path / "o"), vectors=SentenceVectors()), show_progress=False)
    vectors = ctxrep.load_vectors(tmp_path / "o")
    assert isinstance(vectors.array, np.ndarray) and vectors.array.shape == (11, 384)
    np.testing.assert_array_equal(vectors.array[3], vectors[3])
    doc = ctxrep.load_vectors.__doc__
    for member in ("vectors[i]", "row_shape", "words(i)", "line(i)", "index()", "vectors.array", "settings"):
        assert member in doc
    assert "see the module docstring" not in doc


def test_library_call_matches_the_featurizer(corpus, tmp_path):
    summary = embed_corpus(EmbedJob(str(corpus), ShardFolder(str(tmp_path / "o"), shard_size=4)), show_progress=False)
    assert (summary.texts, summary.shards, summary.row_shape) == (11, 3, (384,))
    vectors, index = load_shards(tmp_path / "o")
    expected = ctxrep.Featurizer("minilm").embed_words(TEXTS)
    np.testing.assert_allclose(vectors, np.concatenate(expected), atol=1e-5)
    assert [r["text"] for r in index if r["word"] == 0] == list(range(11))


def _same_folder(a: Path, b: Path, atol: float = 1e-6) -> None:
    """Two embed folders hold the same shards (boundaries, rows, index files byte for byte) and vectors."""
    ma, mb = (json.loads((d / "manifest.json").read_text()) for d in (a, b))
    assert ma["complete"] and mb["complete"]
    strip = ("sha256_16",)  # the bytes of the vectors may differ in the last bit between thread layouts
    assert [{k: v for k, v in s.items() if k not in strip} for s in ma["shards"]] == [
        {k: v for k, v in s.items() if k not in strip} for s in mb["shards"]
    ]
    assert (ma["texts"], ma["rows"], ma["row_shape"]) == (mb["texts"], mb["rows"], mb["row_shape"])
    for s in ma["shards"]:
        assert (a / s["index"]).read_bytes() == (b / s["index"]).read_bytes()
    va, ia = load_shards(a)
    vb, ib = load_shards(b)
    assert ia == ib
    np.testing.assert_allclose(va, vb, atol=atol, rtol=0)
    assert sorted(p.name for p in a.iterdir()) == sorted(p.name for p in b.iterdir())  # no .tmp left behind


def test_two_workers_write_the_one_process_folder(corpus, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    embed_corpus(EmbedJob(str(corpus), ShardFolder(str(one), shard_size=3), threads=1), show_progress=False)
    logs = []
    summary = embed_corpus(
        EmbedJob(str(corpus), ShardFolder(str(two), shard_size=3), threads=2),
        workers=2,
        show_progress=False,
        log=logs.append,
    )
    assert "embedding with 2 worker processes (cpu x 1 threads, cpu x 1 threads)" in logs
    assert summary.shards == 4 and summary.texts == 11
    _same_folder(one, two)


def _children(pid: int) -> list[int]:
    tasks = Path(f"/proc/{pid}/task")
    kids = []
    for task in tasks.iterdir():
        kids += [int(c) for c in (task / "children").read_text().split()]
    return kids


def _embed_workers(pid: int) -> list[int]:
    """The worker processes of the `ctxrep embed` with this pid (multiprocessing's spawned children, not its
    resource tracker)."""
    found = []
    for child in _children(pid):
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except FileNotFoundError:
            continue
        if "spawn_main" in cmdline:
            found.append(child)
    return found


def test_a_worker_killed_with_sigkill_then_the_same_command_again_gives_the_full_folder(tmp_path):
    """A worker SIGKILLed: the run stops, naming it; then the driver SIGKILLed in the rerun: its workers die with
    it; the third run finishes, and the folder equals one process's."""
    src = tmp_path / "in.txt"
    texts = [f"text {i} : {' '.join(TEXTS[i % len(TEXTS)].split()[: 3 + i % 9])}" for i in range(240)]
    src.write_text("\n".join(texts) + "\n")
    out, reference = tmp_path / "killed", tmp_path / "reference"
    command = [
        sys.executable,
        "-c",
        "from ctxrep.cli import main; main()",
        "embed",
        "--input",
        str(src),
        "--out",
        str(out),
    ]
    command += ["--shard-size", "4", "--workers", "2", "--threads", "2"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    manifest = out / "manifest.json"
    deadline = time.monotonic() + 120
    victim = None
    while time.monotonic() < deadline and first.poll() is None:
        workers = _embed_workers(first.pid)
        if manifest.is_file() and len(json.loads(manifest.read_text())["shards"]) >= 2 and len(workers) == 2:
            victim = workers[1]
            os.kill(victim, signal.SIGKILL)
            break
        time.sleep(0.05)
    _, stderr = first.communicate(timeout=120)
    assert victim is not None, f"the run ended before a worker could be killed: {stderr}"
    assert first.returncode == 1, stderr
    assert f"(pid {victim}) was killed by signal 9" in stderr and "run the same command again to finish" in stderr
    kept = json.loads(manifest.read_text())
    assert not kept["complete"] and 2 <= len(kept["shards"]) < 60

    # the driver killed too: its workers die with it (nothing keeps writing beside the next run)
    second = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline, orphans = time.monotonic() + 120, []
    while time.monotonic() < deadline and second.poll() is None:
        workers = _embed_workers(second.pid)
        if len(json.loads(manifest.read_text())["shards"]) > len(kept["shards"]) and len(workers) == 2:
            orphans = workers
            os.kill(second.pid, signal.SIGKILL)
            break
        time.sleep(0.05)
    second.communicate(timeout=60)
    assert orphans, "the second run ended before its driver could be killed"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() for pid in orphans):
        time.sleep(0.1)
    alive = [pid for pid in orphans if Path(f"/proc/{pid}/status").exists()]
    alive = [pid for pid in alive if "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()]
    assert not alive, f"workers {alive} outlived their killed driver"
    kept = json.loads(manifest.read_text())

    third = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert third.returncode == 0, third.stderr
    assert f"resuming after {sum(s['texts'] for s in kept['shards'])} texts" in third.stderr
    embed_corpus(EmbedJob(str(src), ShardFolder(str(reference), shard_size=4), threads=1), show_progress=False)
    _same_folder(out, reference)
    index = ctxrep.load_vectors(out).index()
    assert sorted(set(index.text.tolist())) == list(range(240))  # every text once: none lost, none twice
    assert len(index) == sum(len(t.split()) for t in texts)


def test_parquet_input_lines_are_rows(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": [1, 2, 3], "body": [TEXTS[0], None, TEXTS[2]]}), src)
    out = tmp_path / "o"
    args = ["embed", "--input", str(src), "--out", str(out), "--format", "parquet", "--text-column", "body"]
    result = CliRunner().invoke(main, [*args, "--skip-empty", "--level", "sentence"])
    assert result.exit_code == 0, result.output
    vectors = ctxrep.load_vectors(out)
    assert len(vectors) == 2 and [vectors.line(i) for i in range(2)] == [1, 3]
    np.testing.assert_allclose(
        vectors.array, ctxrep.Featurizer("minilm").embed_sentences([TEXTS[0], TEXTS[2]]), atol=1e-5
    )
    bad = CliRunner().invoke(main, [*args[:-1], "text", "--level", "sentence", "--out", str(tmp_path / "b")])
    assert bad.exit_code == 1 and "no column 'text' (columns: id, body); choose it with --text-column" in bad.output
    # without --format: a Parquet file is said to be one (its name is no format data.table's detect_format reads)
    bad = CliRunner().invoke(main, ["embed", "--input", str(src), "--out", str(tmp_path / "c")])
    assert (
        bad.exit_code == 1 and "in.parquet: a Parquet file (PAR1 magic), not text; pass --format parquet" in bad.output
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["--devices", "cuda:0,cuda:0"], "names a device twice"),
        (["--devices", " , "], "give device names separated by commas"),
        (["--devices", "cuda:0", "--workers", "2"], "give --devices (one process per device) or --workers"),
        (["--workers", "0"], "--workers must be at least 1, got 0"),
        (["--ray-address", "auto"], "--ray-address and --ray-gpus apply to --engine ray"),
        (["--engine", "ray", "--devices", "cuda:0"], "give --ray-gpus 1 instead of --devices"),
    ],
)
def test_bad_process_options_give_one_line_errors(corpus, tmp_path, args, message):
    result = CliRunner().invoke(main, ["embed", "--input", str(corpus), "--out", str(tmp_path / "o"), *args])
    assert result.exit_code == 1 and message in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1


def test_devices_all_without_a_gpu_says_what_to_use(monkeypatch):
    import torch

    from ctxrep.embed.corpus import expand_devices

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(ValueError, match="no CUDA device is visible; use --workers N"):
        expand_devices("all")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    assert expand_devices("all") == ["cuda:0", "cuda:1", "cuda:2"]


def test_workers_from_a_script_without_a_main_guard(corpus, tmp_path):
    """Spawned workers do not re-run the caller's script (which would start the whole job again in each)."""
    script = tmp_path / "job.py"
    script.write_text(
        "from ctxrep.embed.corpus import EmbedJob, ShardFolder, embed_corpus\n"
        f"s = embed_corpus(EmbedJob({str(corpus)!r}, ShardFolder({str(tmp_path / 'o')!r}, 3), threads=2), workers=2)\n"
        "print('done', s.texts, s.shards)\n"
    )
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "done 11 4" and result.stderr.count("embedding with 2 worker processes") == 1
