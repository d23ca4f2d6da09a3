"""A real Ctrl-C (SIGINT) ends cleanly: exit status 130, one line, no traceback, nothing half-written taken for complete.

- In this pytest process, with ONNX Runtime and OpenVINO loaded and run beside torch: the Trainer finishes its step,
  saves and returns (a resumed run equals an uninterrupted one), and `ctxrep pretrain` exits 130 through SystemExit.
- `ctxrep embed` at seeded moments: the complete shards are kept and the same command resumes to the folder of an
  uninterrupted run.
- `ctxrep pretrain` / `mt train` stopped in training: a checkpoint and one line naming it; --resume continues from
  the next step. A second Ctrl-C quits without saving; Ctrl-C while preparing (tokenizer, packing): the same
  command runs again.
- `ctxrep finetune`: stops at once and leaves no model/ or metrics.json behind.
- `ctxrep serve`: answers the request in flight, closes the port.
- `ctxrep embed --engine ray`: as embed, the driver stopped while Ray's actors embed (one moment: Ray starts twice).
- `ctxrep train-sentence-encoder` / `distill --task`: stop at once and leave no model (the distilled student trains
  in a temporary folder); a Ctrl-C during the final save waits for it, so the folder written is whole.

benchmarks/ctrl_c.py sends the same signal at 10 random moments of each of these commands.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from _serve_helpers import free_port

from ctxrep import Featurizer
from ctxrep.embed.corpus import load_shards

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

    test_trainer.test_ctrl_c_finishes_the_step_saves_and_returns(tmp_path / "a")
    test_trainer.test_interrupted_and_resumed_run_equals_an_uninterrupted_one(tmp_path / "b")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ctrl-c") / "text.txt"
    path.write_text("".join(f"line {i} : the bank {'raised ' * (i % 4)}its rates again .\n" for i in range(8000)))
    return path


@pytest.mark.parametrize("seed", [1, 2])
def test_embed_ctrl_c_exits_130_keeps_complete_shards_and_resumes(seed, corpus, tiny_models, tmp_path):
    model, out = str(tiny_models["bert"]), tmp_path / "out"
    args = [CTXREP, "embed", "--model", model, "--input", str(corpus), "--shard-size", "50", "--threads", "1"]
    proc = subprocess.Popen(
        [*args, "--out", str(out)],
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
    kept, shards = sum(s["texts"] for s in manifest["shards"]), len(manifest["shards"])
    said = f"Ctrl-C: kept {kept:,} texts in {shards} complete shard{'' if shards == 1 else 's'} in {out}; the same "
    assert said + "command resumes after them\n" in stderr, stderr  # what was kept, and how to go on
    done = subprocess.run([*args, "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "resuming after" in done.stderr, done.stderr
    assert not list(out.glob("*.tmp"))

    whole = tmp_path / "whole"
    whole_run = subprocess.run([*args, "--out", str(whole)], capture_output=True, text=True, timeout=300)
    assert whole_run.returncode == 0, whole_run.stderr  # the same command uninterrupted, in a fresh process too
    (a, rows_a), (b, rows_b) = load_shards(out), load_shards(whole)
    assert rows_a == rows_b
    np.testing.assert_array_equal(a, b)


def _interrupt(command: list[str], started, seed: int, again_after: float | None = None) -> subprocess.CompletedProcess:
    """Run `command`, wait until `started()` (bounded), send one real SIGINT at a seeded moment after it (and a
    second one `again_after` seconds later), and
    return the finished process (stdout, stderr, returncode); every wait is bounded."""
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # a test runner may ignore SIGINT
    )
    deadline = time.monotonic() + 180
    while not started():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(proc.communicate())
        time.sleep(0.05)
    time.sleep(random.Random(seed).uniform(0.0, 0.3))
    proc.send_signal(signal.SIGINT)
    signalled_at = time.monotonic()
    if again_after is not None:
        time.sleep(again_after)
        proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    done = subprocess.CompletedProcess(command, proc.returncode, stdout, stderr)
    done.signalled_at = signalled_at
    return done


def _logged_steps(out: Path) -> list[int]:
    log = out / "log.jsonl"
    lines = log.read_text().splitlines() if log.is_file() else []
    return [json.loads(line)["step"] for line in lines if line.strip() and "loss" in json.loads(line)]


def _check_interrupted_run(done: subprocess.CompletedProcess, out: Path, command: str) -> int:
    """Exit 130, no traceback, the last line names the checkpoint and --resume; returns the step it stopped at."""
    assert done.returncode == 130, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    last = done.stderr.rstrip().splitlines()[-1]
    match = re.fullmatch(
        rf"interrupted \(Ctrl-C\) at step (\d+); checkpoint saved in (.+); continue with the "
        rf"same `{command}` command plus --resume",
        last,
    )
    assert match, done.stderr[-3000:]
    assert Path(match.group(2)) == out / "checkpoint" and (out / "checkpoint").is_dir()
    step = int(match.group(1))
    assert step >= 1 and _logged_steps(out)[-1] == step  # the log ends at the saved step
    return step


@pytest.mark.parametrize("seed", [1, 2])
def test_pretrain_ctrl_c_exits_130_saves_and_resumes(seed, tmp_path):
    from conftest import write_corpus

    corpus, out = write_corpus(tmp_path / "text"), tmp_path / "run"
    args = [CTXREP, "pretrain", "--objective", "mlm", "--config", "tiny", "--corpus", str(corpus), "--out", str(out)]
    done = _interrupt(
        [*args, "--max-steps", "100000", "--no-progress", "--precision", "fp32"], lambda: bool(_logged_steps(out)), seed
    )
    step = _check_interrupted_run(done, out, "ctxrep pretrain")

    rerun = subprocess.run(
        [*args, "--max-steps", str(step + 2), "--no-progress", "--precision", "fp32", "--resume"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"step {step + 2}: loss" in rerun.stdout
    assert _logged_steps(out)[-1] == step + 2 and (out / "model.safetensors").is_file()


def test_mt_train_ctrl_c_exits_130_saves_and_resumes(tmp_path):
    from _mt_text import write_parallel

    src, tgt = write_parallel(tmp_path, "train", 200)
    out = tmp_path / "run"
    args = [CTXREP, "mt", "train", "--config", "tiny", "--src", str(src), "--tgt", str(tgt), "--out", str(out)]
    done = _interrupt([*args, "--max-steps", "100000"], lambda: bool(_logged_steps(out)), 3)
    step = _check_interrupted_run(done, out, "ctxrep mt train")

    rerun = subprocess.run(
        [*args, "--max-steps", str(step + 2), "--resume"], capture_output=True, text=True, timeout=300
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"step {step + 2}: loss" in rerun.stdout
    assert _logged_steps(out)[-1] == step + 2 and (out / "model.safetensors").is_file()


def test_serve_ctrl_c_answers_the_request_in_flight_and_exits_130(tiny_models):
    import httpx

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [CTXREP, "serve", "--model", str(tiny_models["bert"]), "--port", str(port), "--threads", "1"]

    def healthy() -> bool:
        try:
            return httpx.get(f"{url}/health", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    answer = {}

    def request_in_flight() -> bool:  # started: the server answers, and a large request is being embedded
        if not healthy():
            return False
        texts = [f"line {i} : " + "the bank raised its rates again . " * 20 for i in range(2000)]

        def call() -> None:
            answer["r"] = httpx.post(f"{url}/v1/embeddings", json={"input": texts}, timeout=120)
            answer["at"] = time.monotonic()

        thread = threading.Thread(target=call)
        thread.start()
        answer["thread"] = thread
        time.sleep(0.2)  # the request is read and being embedded
        return True

    done = _interrupt(command, request_in_flight, seed=4)
    answer["thread"].join(timeout=120)
    assert done.returncode == 130, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and done.stderr.rstrip().endswith("interrupted (Ctrl-C)"), done.stderr
    assert answer["r"].status_code == 200 and len(answer["r"].json()["data"]) == 2000
    assert answer["at"] > done.signalled_at, answer["at"] - done.signalled_at  # in flight when Ctrl-C came
    assert not healthy()  # the port is closed


@pytest.mark.parametrize("seed", [5, 6])
def test_finetune_ctrl_c_exits_130_and_leaves_no_model(seed, tiny_models, tmp_path):
    rows = [("a good fine day", "pos"), ("a bad sad day", "neg")]
    data = tmp_path / "train.csv"
    data.write_text("text,label\n" + "".join(f"{rows[i % 2][0]} number {i},{rows[i % 2][1]}\n" for i in range(400)))
    out = tmp_path / "out"
    args = [CTXREP, "finetune", "--task", "classify", "--train", str(data), "--dev", str(data)]
    args += ["--model", str(tiny_models["bert"]), "--out", str(out), "--no-progress"]

    def training() -> bool:  # experiment makes --out right before fit
        if out.is_dir():
            time.sleep(1.0)
            return True
        return False

    done = _interrupt([*args, "--max-epochs", "1000"], training, seed)
    assert done.returncode == 130, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and done.stderr.rstrip().endswith("interrupted (Ctrl-C)"), done.stderr
    assert "training SequenceClassifier" in done.stdout and "dev accuracy" not in done.stdout  # stopped in fit
    assert not (out / "model").exists() and not (out / "metrics.json").exists()

    rerun = subprocess.run([*args, "--max-epochs", "1"], capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert (out / "model" / "config.json").is_file() and (out / "metrics.json").is_file()
    assert json.loads((out / "model" / "task.json").read_text())["task"] == "classify"
    assert not (out / "model.partial").exists()  # saved beside, then renamed whole


def test_pretrain_cli_ctrl_c_in_this_process_with_every_runtime_loaded(runtimes_loaded, tmp_path, capsys):
    """The same SIGINT as above, sent to this pytest process (ONNX Runtime and OpenVINO loaded beside torch) while
    `ctxrep pretrain` runs here: exit status 130 through SystemExit, one line, and --resume continues."""
    from conftest import write_corpus

    from ctxrep.cli import main

    corpus, out = write_corpus(tmp_path / "text"), tmp_path / "run"
    args = ["pretrain", "--objective", "mlm", "--config", "tiny", "--corpus", str(corpus), "--out", str(out)]
    args += ["--no-progress", "--precision", "fp32", "--trainer.warmup_steps", "1"]

    def interrupt_when_training() -> None:
        deadline = time.monotonic() + 120
        while not _logged_steps(out) and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)  # handled in the main thread, by the Trainer's handler

    thread = threading.Thread(target=interrupt_when_training, daemon=True)
    thread.start()
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(SystemExit) as stopped:
        main([*args, "--max-steps", "100000"])
    thread.join(timeout=5)
    assert signal.getsignal(signal.SIGINT) is before  # this process goes on with its own handler
    assert stopped.value.code == 130
    step = _check_interrupted_run(
        subprocess.CompletedProcess(args, 130, "", capsys.readouterr().err), out, "ctxrep pretrain"
    )
    with pytest.raises(SystemExit) as finished:
        main([*args, "--max-steps", str(step + 1), "--resume"])
    assert finished.value.code == 0 and _logged_steps(out)[-1] == step + 1


@pytest.mark.parametrize("again_after", [0.01, 0.2])
def test_pretrain_second_ctrl_c_stops_at_once_and_the_run_folder_stays_usable(again_after, tmp_path):
    """A second Ctrl-C quits without saving: exit 130, no traceback; a checkpoint, if one was complete before it,
    resumes, and a folder without one reruns from the start (never a half-written checkpoint)."""
    from conftest import write_corpus

    corpus, out = write_corpus(tmp_path / "text"), tmp_path / "run"
    args = [CTXREP, "pretrain", "--objective", "mlm", "--config", "tiny", "--corpus", str(corpus), "--out", str(out)]
    args += ["--no-progress", "--precision", "fp32"]
    done = _interrupt([*args, "--max-steps", "100000"], lambda: bool(_logged_steps(out)), 7, again_after)
    # a second SIGINT that lands while the interpreter is already exiting kills it by the signal (-2): a shell
    # reports that as 130 too
    assert done.returncode in (130, -signal.SIGINT) and "Traceback" not in done.stderr, done.stderr[-3000:]
    last = done.stderr.rstrip().splitlines()[-1]
    assert last == "interrupted (Ctrl-C)" or last.startswith("interrupted (Ctrl-C) at step "), done.stderr

    resumed = subprocess.run([*args, "--max-steps", "100", "--resume"], capture_output=True, text=True, timeout=300)
    if (out / "checkpoint").is_dir():
        assert resumed.returncode == 0 and "step 100: loss" in resumed.stdout, resumed.stderr[-3000:]
    else:
        assert resumed.returncode == 1 and "nothing to resume" in resumed.stderr, resumed.stderr
        fresh = subprocess.run([*args, "--max-steps", "3"], capture_output=True, text=True, timeout=300)
        assert fresh.returncode == 0 and "step 3: loss" in fresh.stdout, fresh.stderr[-3000:]


@pytest.mark.parametrize("seed", [11, 12])
def test_pretrain_ctrl_c_while_preparing_exits_130_and_the_same_command_runs_again(seed, tmp_path):
    """Ctrl-C at a seeded moment of the first second (tokenizer training, corpus packing, first steps): exit 130,
    no traceback; the same command then finishes (with --resume where a checkpoint was saved), so no half-written
    tokenizer or packed corpus is taken for complete."""
    from conftest import write_corpus

    corpus, out = write_corpus(tmp_path / "text"), tmp_path / "run"
    args = [CTXREP, "pretrain", "--objective", "mlm", "--config", "tiny", "--corpus", str(corpus), "--out", str(out)]
    args += ["--no-progress", "--precision", "fp32"]
    delay = random.Random(seed).uniform(0.0, 1.0)
    done = _interrupt([*args, "--max-steps", "100000"], lambda: out.is_dir() and time.sleep(delay) is None, seed)
    assert done.returncode == 130 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.rstrip().splitlines()[-1].startswith("interrupted (Ctrl-C)"), done.stderr

    if (out / "checkpoint").is_dir():  # stopped in training: the checkpoint's line, and --resume continues
        last, resume = _check_interrupted_run(done, out, "ctxrep pretrain") + 2, ["--resume"]
    else:
        last, resume = 5, []
    again = subprocess.run([*args, "--max-steps", str(last), *resume], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and f"step {last}: loss" in again.stdout, again.stderr[-3000:]
    assert _logged_steps(out)[-1] == last


def _embed_args(model: Path, corpus: Path, *options: str) -> list[str]:
    return [CTXREP, "embed", "--model", str(model), "--input", str(corpus), "--shard-size", "50", *options]


def test_embed_engine_ray_ctrl_c_exits_130_keeps_complete_shards_and_resumes(corpus, tiny_models, tmp_path):
    """One moment (a local Ray starts twice, ~20 s each): Ctrl-C once shards are written ends the driver with 130,
    the manifest lists only complete shards, and the same command resumes to what one process writes."""
    pytest.importorskip("ray")
    out, text = tmp_path / "ray", tmp_path / "text.txt"
    text.write_text("".join(corpus.read_text().splitlines(keepends=True)[:2000]))  # 40 shards: Ray's start dominates
    args = _embed_args(tiny_models["bert"], text, "--threads", "1", "--engine", "ray", "--workers", "1")
    done = _interrupt([*args, "--out", str(out)], lambda: (out / "shard-00000.safetensors").exists(), 8)
    assert done.returncode == 130, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and done.stderr.rstrip().endswith("interrupted (Ctrl-C)"), done.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert not manifest["complete"] and manifest["shards"]
    assert all((out / s["file"]).is_file() and (out / s["index"]).is_file() for s in manifest["shards"])

    resumed = subprocess.run([*args, "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0 and "resuming after" in resumed.stderr, resumed.stderr[-3000:]
    one = tmp_path / "one"
    whole = subprocess.run(
        [*_embed_args(tiny_models["bert"], text, "--threads", "1"), "--out", str(one)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert whole.returncode == 0, whole.stderr[-3000:]
    (a, rows_a), (b, rows_b) = load_shards(out), load_shards(one)
    assert rows_a == rows_b
    np.testing.assert_array_equal(a, b)


def _seconds_after_start(delay: float):
    """A `started` for _interrupt: true `delay` seconds after its first call (the command's start)."""
    start = []

    def started() -> bool:
        start.append(time.monotonic())
        return time.monotonic() - start[0] >= delay

    return started


def _check_stopped_at_once(done: subprocess.CompletedProcess) -> None:
    assert done.returncode == 130, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and done.stderr.rstrip().endswith("interrupted (Ctrl-C)"), done.stderr


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("pairs") / "pairs.csv"
    path.write_text(
        "text,text_pair\n" + "".join(f"the bank {i} raised rates,bank {i} rates went up\n" for i in range(64))
    )
    return path


@pytest.mark.parametrize("seed", [13, 14])
def test_train_sentence_encoder_ctrl_c_exits_130_and_leaves_no_model(seed, pairs, tiny_models, tmp_path):
    """Ctrl-C at a seeded moment of the first seconds (imports, reading, training that would go on for minutes):
    exit 130, no traceback, no model folder; the same command then trains and saves."""
    out = tmp_path / "encoder"
    args = [CTXREP, "train-sentence-encoder", "--train", str(pairs), "--model", str(tiny_models["bert"])]
    args += ["--out", str(out), "--batch-size", "8"]
    delay = random.Random(seed).uniform(1.0, 6.0)
    _check_stopped_at_once(_interrupt([*args, "--epochs", "100000"], _seconds_after_start(delay), seed))
    assert not out.exists()

    again = subprocess.run([*args, "--max-steps", "2"], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (out / "history.json").is_file() and (out / "ctxrep_sentence_encoder.json").is_file()


def _send_ctrl_c_after(func):
    """`func`, then a real SIGINT to this process: a Ctrl-C that lands in the middle of a save."""

    def wrapped(*args, **kwargs):
        result = func(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGINT)
        return result

    return wrapped


def test_train_sentence_encoder_ctrl_c_while_saving_finishes_the_save(
    pairs, tiny_models, tmp_path, monkeypatch, capsys
):
    """Ctrl-C after the weights are written and before the rest of the folder: the save finishes, then exit 130,
    and the folder loads (without the wait it lacked its sentence-transformers files and history.json)."""
    from ctxrep.cli import main
    from ctxrep.tasks.sentence_encoder import SentenceEncoder

    monkeypatch.setattr(SentenceEncoder, "_save_weights", _send_ctrl_c_after(SentenceEncoder._save_weights))
    out = tmp_path / "encoder"
    with pytest.raises(SystemExit) as stopped:
        main(["train-sentence-encoder", "--train", str(pairs), "--model", str(tiny_models["bert"]), "--out", str(out)])
    assert stopped.value.code == 130
    assert (out / "history.json").is_file() and (out / "modules.json").is_file()
    assert SentenceEncoder.load(out).encode(["a bank"]).shape == (1, 32)
    err = capsys.readouterr().err
    assert "Ctrl-C: finishing saving the model, then stopping" in err and err.rstrip().endswith("interrupted (Ctrl-C)")


@pytest.fixture(scope="module")
def teacher(tiny_models, tmp_path_factory) -> Path:
    """A SequenceClassifier fine-tuned from the tiny BERT, saved as `ctxrep finetune` saves its model/."""
    from ctxrep.tasks import SequenceClassifier

    clf = SequenceClassifier(model=str(tiny_models["bert"]), max_epochs=1, batch_size=4, random_state=0, progress=False)
    folder = tmp_path_factory.mktemp("teacher")
    clf.fit(["good great", "bad awful", "nice fine", "poor sad"], [1, 0, 1, 0]).save(folder / "model")
    return folder


@pytest.fixture(scope="module")
def sst(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("sst") / "sst.txt"
    path.write_text("(4 (3 good) (4 great))\n(0 (0 bad) (1 awful))\n(3 (3 nice) (2 fine))\n(1 (1 poor) (0 sad))\n" * 10)
    return path


def _distill_args(teacher: Path, sst: Path) -> list[str]:
    return ["distill", "--teacher", str(teacher), "--task", "sst2", "--train", str(sst), "--dev", str(sst)]


@pytest.mark.parametrize("seed", [15, 16])
def test_distill_task_ctrl_c_exits_130_and_leaves_no_student(seed, teacher, sst, tmp_path):
    """Ctrl-C at a seeded moment of the first seconds: exit 130, no traceback, and --out holds no student (the
    untrained one it started from trains in a temporary folder); the same command then writes the whole student."""
    out = tmp_path / "student"
    args = [CTXREP, *_distill_args(teacher, sst), "--student-layers", "1", "--out", str(out), "--no-progress"]
    delay = random.Random(seed).uniform(1.0, 6.0)
    _check_stopped_at_once(_interrupt([*args, "--max-epochs", "100000"], _seconds_after_start(delay), seed))
    assert not out.exists() or not any(out.iterdir()), list(out.iterdir())

    again = subprocess.run([*args, "--max-epochs", "1"], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert {p.name for p in out.iterdir()} == {"encoder", "model", "distill.json"}


def test_distill_task_ctrl_c_while_saving_finishes_the_save(teacher, sst, tmp_path, monkeypatch, capsys):
    """Ctrl-C after the student's encoder is written and before its task model and distill.json: the save
    finishes, then exit 130, and the student loads with the dev score distill.json gives."""
    import ctxrep.compress.distill_task as distill_task
    from ctxrep.cli import main
    from ctxrep.tasks import SequenceClassifier
    from ctxrep.tasks.experiment import read_task

    monkeypatch.setattr(distill_task, "export_encoder", _send_ctrl_c_after(distill_task.export_encoder))
    out = tmp_path / "student"
    with pytest.raises(SystemExit) as stopped:
        main([*_distill_args(teacher, sst), "--student-layers", "1", "--max-epochs", "1", "--out", str(out)])
    assert stopped.value.code == 130
    report = json.loads((out / "distill.json").read_text())
    dev = read_task("sst2", sst)
    assert SequenceClassifier.load(out / "model").score(dev.X, dev.y) == report["student_dev_score"]
    err = capsys.readouterr().err
    assert "Ctrl-C: finishing saving the student, then stopping" in err
    assert err.rstrip().endswith("interrupted (Ctrl-C)")


def test_ctrl_c_while_the_cli_loads_exits_130_without_a_traceback():
    """A real SIGINT while `ctxrep` imports its commands' modules (sent by an import hook, so the moment is exact):
    status 130 and one line, as at any later moment (it printed an import traceback)."""
    code = (
        "import os, signal, sys\n"
        "class CtrlC:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'ctxrep.cli.distill':\n"
        "            os.kill(os.getpid(), signal.SIGINT)\n"
        "sys.meta_path.insert(0, CtrlC())\n"
        "from ctxrep.cli import main\n"
        "main()\n"
    )
    done = subprocess.run([sys.executable, "-c", code, "embed", "--help"], capture_output=True, text=True, timeout=60)
    _check_stopped_at_once(done)
