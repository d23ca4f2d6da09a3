"""docs/tutorial.ipynb runs from top to bottom (nbclient, a fresh kernel, the notebook's own data) and is stored
without outputs."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parents[1] / "docs" / "tutorial.ipynb"
CELL_TIMEOUT_S = 300  # per cell; the whole notebook takes well under a minute on one thread


def test_the_notebook_is_stored_clean():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    dirty = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and (c.outputs or c.execution_count)]
    assert not dirty, f"{NOTEBOOK}: cells {dirty} hold outputs; clear them before committing (Kernel > Restart & Clear)"
    assert nb.metadata.kernelspec.name == "python3"
    sources = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert '"minilm"' in sources and "/work" not in sources and "shared/data" not in sources  # no outside data


@pytest.fixture
def this_python_kernel(tmp_path, monkeypatch):
    """A 'python3' kernel spec that runs this interpreter (not whatever python3 kernel the machine has)."""
    spec = tmp_path / "jupyter" / "kernels" / "python3"
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "Python 3", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    return "python3"


def _text(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


def test_the_notebook_runs(tmp_path, this_python_kernel):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    workdir = tmp_path / "run"
    workdir.mkdir()
    threads = os.environ.get("CTXREP_TEST_THREADS", "2")
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    client = NotebookClient(
        nb, timeout=CELL_TIMEOUT_S, kernel_name=this_python_kernel, resources={"metadata": {"path": str(workdir)}}
    )
    start = time.perf_counter()
    client.execute(env=env)  # raises CellExecutionError, naming the cell, if any cell fails
    took = time.perf_counter() - start

    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code)
    assert not [o for c in code for o in c.outputs if o.output_type == "error"]
    # the notebook wrote its own data where it ran, and drew the probe and the attention head
    assert {p.name for p in (workdir / "tutorial_data").iterdir()} >= {
        "senses.tsv",
        "reviews.tsv",
        "pos.txt",
        "probe.png",
        "attention.png",
    }
    images = [c for c in code if any("image/png" in o.get("data", {}) for o in c.outputs)]
    assert len(images) == 2
    # the claim of section 1: at the top layer, occurrences of different senses are further apart than same-sense ones
    sense_table = next(_text(c) for c in code if "mean cosine between occurrences" in _text(c))
    same = [float(m) for m in re.findall(r"same sense\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+([\d.]+)", sense_table)]
    different = [float(m) for m in re.findall(r"different senses\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+([\d.]+)", sense_table)]
    assert len(same) == len(different) == 3 and all(d < s for s, d in zip(same, different)), sense_table
    print(f"tutorial notebook: {took:.1f} s")
