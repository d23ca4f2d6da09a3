"""The README's "Python quick start" runs as written (on the packaged MiniLM) and prints what its comments say."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import numpy as np
import pytest
import torch

README = Path(__file__).resolve().parent.parent / "README.md"


def python_quick_start() -> str:
    """The first ```python block after the README's "## Python quick start" heading."""
    text = README.read_text(encoding="utf-8")
    found = re.search(r"^## Python quick start\n(?:(?!^## ).)*?^```python\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
    assert found, f"{README}: no ```python block under '## Python quick start'; the test reads the quick start there"
    return found.group(1)


def run_code(code: str) -> tuple[dict, list[str]]:
    namespace: dict = {"__name__": "readme"}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(README), "exec"), namespace)  # noqa: S102 - the README's own example
    return namespace, out.getvalue().splitlines()


NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


@pytest.fixture(scope="module")
def quick_start() -> tuple[str, dict, list[str]]:
    """The block's code, its namespace after running, and what it printed (run once for the module)."""
    code = python_quick_start()
    return (code, *run_code(code))


def test_python_quick_start_runs_and_prints_what_its_comments_say(quick_start):
    code, ns, printed = quick_start
    assert "ctxrep.Featurizer(" in code and "print(" in code
    promised = [line.split("#", 1)[1] for line in code.splitlines() if line.startswith("print(") and "#" in line]
    assert len(printed) == len(promised), f"one output line per commented print() expected: {printed}"
    for claim, got in zip(promised, printed):
        # "(6 words, 7 layers incl. embeddings, 384)" promises the numbers 6, 7, 384 in that order
        assert NUMBER.findall(claim) == NUMBER.findall(got), f"README says {claim.strip()!r}, the code printed {got!r}"
    assert ns["sentences"].shape == (2, 384)  # its comment: (2, 384)


def test_quick_start_hidden_states_are_asked_for(quick_start):
    """hidden_states is None unless output_hidden_states=True: the README must ask wherever it reads them."""
    code, ns, _ = quick_start
    assert ".hidden_states" in code and "output_hidden_states=True" in code
    model, out = ns["model"], ns["out"]
    assert len(out.hidden_states) == model.num_layers + 1
    torch.testing.assert_close(out.hidden_states[-1], out.last_hidden_state)
    ids = out.last_hidden_state.new_zeros(1, 4, dtype=torch.long) + 1000
    assert model(ids, attention_mask=torch.ones_like(ids)).hidden_states is None  # not asked: none
    # the featurizer's top-layer vectors are these hidden states ("A crane caught a fish ." is one piece a word)
    words = ["A", "crane", "caught", "a", "fish", "."]
    assert ns["ids"] == ns["encoder"].tokenizer.backend.encode(" ".join(words)).ids, "README's sentence changed"
    top = ns["top"].embed_words([words])[0]
    np.testing.assert_allclose(top, out.last_hidden_state[0, 1:-1].detach().numpy(), atol=1e-5)
