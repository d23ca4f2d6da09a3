"""ctxrep.util.progress: a bar on a terminal, plain lines otherwise."""

from __future__ import annotations

import io

import pytest
from tqdm.auto import tqdm

from ctxrep.util.progress import LineProgress, format_duration, progress


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_lines_when_not_a_terminal(monkeypatch):
    clock = iter(range(0, 1000, 5))  # every call to the clock moves 5 s on
    monkeypatch.setattr("ctxrep.util.progress.time.monotonic", lambda: float(next(clock)))
    out = io.StringIO()
    with progress(total=100, desc="embed", unit="texts", file=out, interval=10) as bar:
        assert isinstance(bar, LineProgress)
        for _ in range(4):
            bar.update(25)
    lines = out.getvalue().splitlines()
    assert lines, "a log gets lines"
    assert "\r" not in out.getvalue()
    assert lines[-1].startswith("embed: 100/100 texts (100%)")
    assert "elapsed" in lines[-1] and "left" not in lines[-1]
    assert any("left" in line for line in lines[:-1]), lines


def test_iterates_and_closes_once():
    out = io.StringIO()
    assert list(progress(range(3), desc="x", file=out)) == [0, 1, 2]
    assert out.getvalue().count("\n") == 1 and "3/3 it (100%)" in out.getvalue()


def test_disabled_prints_nothing():
    out = io.StringIO()
    with progress(total=5, file=out, enabled=False) as bar:
        bar.update(5)
        bar.write("hello")
    assert out.getvalue() == ""


def test_terminal_gets_tqdm():
    bar = progress(total=3, file=FakeTerminal())
    assert isinstance(bar, tqdm)
    bar.close()


@pytest.mark.parametrize(("seconds", "text"), [(0, "0:00:00"), (97.9, "0:01:37"), (3 * 3600 + 5, "3:00:05")])
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


def test_unit_scale_and_unknown_total():
    bar = LineProgress(desc="read", unit="B", unit_scale=True, file=io.StringIO())
    bar.update(1_500_000)
    assert bar.line().startswith("read: 1.5M B")


def test_a_resumed_count_starts_at_initial_and_rates_only_this_run(monkeypatch):
    clock = iter([0.0, 0.0, 10.0, 10.0, 10.0])
    monkeypatch.setattr("ctxrep.util.progress.time.monotonic", lambda: next(clock))
    bar = progress(total=100, initial=40, desc="train", unit="steps", file=io.StringIO(), dynamic_ncols=True)
    assert isinstance(bar, LineProgress)  # tqdm-only options are for the terminal bar
    bar.update(20)
    # 20 steps in 10 s: 2 steps/s, 40 left -> 20 s
    assert bar.line() == "train: 60/100 steps (60%), 2 steps/s, 0:00:10 elapsed, ~0:00:20 left"


def test_a_count_of_seconds_can_leave_out_the_rate():
    bar = LineProgress(total=60, unit="s", rate=False, file=io.StringIO())
    bar.update(30)
    assert "s/s" not in bar.line() and bar.line().startswith("30/60 s (50%)")


def test_terminal_bar_takes_tqdm_options():
    bar = progress(total=3, initial=1, file=FakeTerminal(), bar_format="{desc}: {n}/{total}", desc="train")
    assert isinstance(bar, tqdm) and bar.n == 1
    bar.close()
