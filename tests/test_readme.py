"""The README is the front door: its first lines are the two set-up commands CI runs (`make demo`, `make test`), it
fits one screen plus links, its links lead to files that exist, and its Python prints what its comments say
(tests/test_docs_examples.py runs every block of it as well)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _text() -> str:
    return README.read_text(encoding="utf-8")


def _block(text: str, lang: str, after: str | None = None) -> str:
    start = text.index(after) if after else 0
    found = re.search(rf"^```{lang}\n(.*?)^```", text[start:], re.M | re.S)
    assert found, f"no ```{lang} block" + (f" after {after!r}" if after else "")
    return found.group(1)


def test_the_first_lines_are_the_two_make_commands_that_ci_runs():
    lines = [line for line in _text().splitlines()[1:] if line.strip()]
    assert [line.split("#")[0].strip() for line in lines[:2]] == ["make demo", "make test"]
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^demo:", makefile, re.M) and re.search(r"^test:", makefile, re.M)
    assert "make test" in (ROOT / ".ci" / "run").read_text()  # the README's test command is CI's


def test_one_screen_five_lines_of_python_five_commands_a_link_per_job():
    text = _text()
    assert len(text.splitlines()) <= 50
    assert len(_block(text, "python").strip().splitlines()) == 5
    commands = [line for line in _block(text, "sh").splitlines() if line.startswith("ctxrep ")]
    assert len(commands) == 5
    jobs = ("featurize", "analyse", "finetune", "sentence-encoders", "retrieval", "scale", "pretrain", "translate")
    for job in (*jobs, "compress"):
        assert f"(docs/{job}.md)" in text, f"README: no link to docs/{job}.md"


def test_every_link_leads_to_a_file():
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", _text())
    assert links
    missing = [link for link in links if not link.startswith("http") and not (ROOT / link).exists()]
    assert not missing, f"README links to files that do not exist: {missing}"


def _close(claim: str, got: str) -> bool:
    """The numbers a comment promises, in order, each within half a unit of its last decimal."""
    want, have = NUMBER.findall(claim), NUMBER.findall(got)
    if len(want) != len(have):
        return False
    for w, h in zip(want, have):
        decimals = len(w.split(".")[1]) if "." in w else 0
        if abs(float(w) - float(h)) > 0.5 * 10**-decimals + 1e-12:
            return False
    return True


def test_python_prints_what_its_comments_say():
    code = _block(_text(), "python")
    promised = [line.split("#", 1)[1].split(":")[0] for line in code.splitlines() if line.startswith("print(")]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(README), "exec"), {"__name__": "readme"})  # noqa: S102 - the README's own example
    printed = out.getvalue().splitlines()
    assert len(printed) == len(promised) == 3, printed
    for claim, got in zip(promised, printed):
        assert _close(claim, got), f"README says {claim.strip()!r}, the code printed {got!r}"


def test_the_featurize_pages_hidden_states_are_asked_for():
    """hidden_states is None unless output_hidden_states=True: docs/featurize.md asks wherever it reads them, and its
    top-layer vectors are those hidden states."""
    page = (ROOT / "docs" / "featurize.md").read_text(encoding="utf-8")
    first = _block(page, "python")
    code = _block(page, "python", after="The encoder itself")
    assert ".hidden_states" in code and "output_hidden_states=True" in code
    ns: dict = {"__name__": "featurize_page"}
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(first + code, "docs/featurize.md", "exec"), ns)  # noqa: S102
    model, out = ns["model"], ns["out"]
    assert len(out.hidden_states) == model.num_layers + 1
    torch.testing.assert_close(out.hidden_states[-1], out.last_hidden_state)
    ids = out.last_hidden_state.new_zeros(1, 4, dtype=torch.long) + 1000
    assert model(ids, attention_mask=torch.ones_like(ids)).hidden_states is None  # not asked: none
    words = ["A", "crane", "caught", "a", "fish", "."]  # one piece a word
    assert ns["ids"] == ns["encoder"].tokenizer.backend.encode(" ".join(words)).ids, "the page's sentence changed"
    top = ns["top"].embed_words([words])[0]
    np.testing.assert_allclose(top, out.last_hidden_state[0, 1:-1].detach().numpy(), atol=1e-5)
