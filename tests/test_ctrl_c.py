"""A real Ctrl-C (SIGINT) ends cleanly: in this pytest process with ONNX Runtime and OpenVINO loaded and running
beside torch (the Trainer finishes its step, saves and returns; a resumed run equals an uninterrupted one), and for
`ctxrep embed` at seeded random moments (exit status 130, one line, no traceback; the complete shards are kept, no
half-written file is taken for complete, and the same command resumes to the folder of an uninterrupted run)."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from ctxrep import Featurizer
from ctxrep.embed.corpus import EmbedJob, embed_corpus, load_shards

CTXREP = str(Path(sys.executable).with_name("ctxrep"))


@pytest.fixture(scope="module")
def runtimes_loaded(tiny_models):
    """ONNX Runtime and OpenVINO imported and run in this process, as the full suite leaves them."""
    folder = str(tiny_models["bert"])
    for backend in ("onnxruntime", "openvino"):
        vectors = Featurizer(folder, backend=backend).embed_words([["a", "bank"]])
        assert vectors[0].shape[0] == 2
    return folder


def test_trainer_ctrl_c_with_every_runtime_loaded(runtimes_loaded, tmp_path):
    import test_trainer

    test_trainer._ctrl_c_finishes_the_step_saves_and_returns(tmp_path / "a")
    test_trainer._interrupted_and_resumed_run_equals_an_uninterrupted_one(tmp_path / "b")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ctrl-c") / "text.txt"
    path.write_text("".join(f"line {i} : the bank {'raised ' * (i % 4)}its rates again .\n" for i in range(8000)))
    return path


@pytest.mark.parametrize("seed", [1, 2])
def test_embed_ctrl_c_exits_130_keeps_complete_shards_and_resumes(seed, corpus, tiny_models, tmp_path):
    model, out = str(tiny_models["bert"]), tmp_path / "out"
    args = [CTXREP, "embed", "--model", model, "--input", str(corpus), "--out", str(out), "--shard-size", "50"]
    proc = subprocess.Popen(
        [*args, "--threads", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # a test runner may ignore SIGINT
    )
    deadline = time.monotonic() + 120
    while not (out / "shard-00000.safetensors").exists():  # embedding has started
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    time.sleep(random.Random(seed).uniform(0.0, 0.5))  # a seeded moment during the run
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and stderr.rstrip().endswith("interrupted (Ctrl-C)"), stderr

    manifest = json.loads((out / "manifest.json").read_text())
    assert not manifest["complete"] and manifest["shards"]  # stopped part-way, after some shards
    assert all((out / s["file"]).is_file() and (out / s["index"]).is_file() for s in manifest["shards"])
    done = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "resuming after" in done.stderr, done.stderr
    assert not list(out.glob("*.tmp"))

    whole = tmp_path / "whole"
    embed_corpus(EmbedJob(str(corpus), str(whole), model=model, shard_size=50, threads=1), show_progress=False)
    (a, rows_a), (b, rows_b) = load_shards(out), load_shards(whole)
    assert rows_a == rows_b
    np.testing.assert_array_equal(a, b)
