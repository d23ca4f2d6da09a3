"""Data parallelism: 2 CPU processes under torchrun (gloo) end with the parameters of one process."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from ctxrep.train.distributed import Distributed, current, init_distributed, wrap

WORKER = Path(__file__).with_name("_ddp_worker.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_shard_takes_every_world_size_th_row():
    batch = {"input_ids": np.arange(12).reshape(6, 2), "label": np.arange(6)}
    shard = Distributed(rank=1, world_size=3).shard(batch)
    assert shard["input_ids"].tolist() == [[2, 3], [8, 9]] and shard["label"].tolist() == [1, 4]
    assert Distributed().shard(batch) is batch
    with pytest.raises(ValueError, match="has 6 rows, which 4 processes cannot share evenly"):
        Distributed(rank=0, world_size=4).shard(batch)


def test_single_process_without_torchrun(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    ctx = init_distributed()
    assert (ctx.rank, ctx.world_size, ctx.is_main, ctx.enabled) == (0, 1, True, False)
    assert current() == ctx and ctx.all_sum([1.0, 2.0]) == [1.0, 2.0]
    module = torch.nn.Linear(2, 2)
    assert wrap(module, ctx) is module


def test_incomplete_torchrun_environment_is_refused(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(ValueError, match="WORLD_SIZE=2 is set but MASTER_ADDR is not; launch .* with torchrun"):
        init_distributed()


def torchrun(script: Path, *args, timeout: int = 240) -> None:
    """Run `script` with `args` under torchrun, 2 CPU processes of one thread; the test fails on a non-zero exit
    (with the end of stderr) or after `timeout` seconds."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2"]
    command += ["--master_addr", "127.0.0.1", "--master_port", str(free_port()), str(script), *map(str, args)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    # its own process group, so that a hung run can be killed whole (torchrun and both workers)
    proc = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        _, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"torchrun with 2 processes did not finish within {timeout} s")
    assert proc.returncode == 0, stderr[-3000:]


def test_two_processes_equal_one_process_on_the_global_batch(tmp_path):
    from _ddp_worker import train

    torchrun(WORKER, tmp_path / "ddp")

    single, expected, rows = train(tmp_path / "single")
    result = json.loads((tmp_path / "ddp" / "result.json").read_text())
    assert result["world_size"] == 2 and result["step"] == 3
    got = load_file(tmp_path / "ddp" / "params.safetensors")
    for name, value in got.items():
        torch.testing.assert_close(value, expected[name], atol=1e-6, rtol=0)
    # each process trained on its half of every global micro-batch: rows r::2
    rank_rows = [json.loads((tmp_path / "ddp" / f"rows-rank{r}.json").read_text()) for r in (0, 1)]
    assert rank_rows[0] == rows[0::2] and rank_rows[1] == rows[1::2] and len(rows) == 3 * 8
    # rank 0 logs the loss of the global batch (mean over ranks), one record per step
    ddp_log = [json.loads(line) for line in (tmp_path / "ddp" / "log.jsonl").read_text().splitlines()]
    one_log = [json.loads(line) for line in (tmp_path / "single" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in ddp_log] == [1, 2, 3]
    assert [r["loss"] for r in ddp_log] == pytest.approx([r["loss"] for r in one_log], abs=1e-6)
    assert [r["lr"] for r in ddp_log] == [r["lr"] for r in one_log]
    checkpoint = tmp_path / "ddp" / "checkpoint"
    assert {p.name for p in checkpoint.iterdir()} == {
        "model.safetensors",
        "optimizer.pt",
        "rng-rank0.pt",
        "rng-rank1.pt",
        "trainer_state.json",
    }


def test_a_failure_on_rank_0_while_preparing_stops_every_rank(tmp_path):
    """Rank 0 prepares the data while the others wait; when it fails they must stop too, not wait forever."""
    script = tmp_path / "prepare.py"
    script.write_text(
        "import sys\n"
        "from pathlib import Path\n"
        "from ctxrep.train import distributed\n"
        "ctx = distributed.init_distributed()\n"
        "lines = []\n"
        "def prepare():\n"
        "    raise ValueError('the corpus is empty')\n"
        "try:\n"
        "    ctx.main_first(prepare, lambda: 'loaded')\n"
        "except Exception as err:\n"
        "    lines.append(f'{type(err).__name__}: {err}')\n"
        "lines.append('passes: ' + ctx.main_first(lambda: 'prepared', lambda: 'loaded'))\n"
        "Path(sys.argv[1], f'rank{ctx.rank}.txt').write_text('\\n'.join(lines))\n"
        "distributed.shutdown()\n"
    )
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--nproc_per_node",
        "2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(free_port()),
        str(script),
        str(tmp_path),
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "rank0.txt").read_text().splitlines() == ["ValueError: the corpus is empty", "passes: prepared"]
    assert (tmp_path / "rank1.txt").read_text().splitlines() == [
        "RuntimeError: rank 0 failed while preparing the data, so rank 1 stops too: ValueError: the corpus is empty",
        "passes: loaded",
    ]
