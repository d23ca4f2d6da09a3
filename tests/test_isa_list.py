"""tests/isa_tests.txt (the numerics tests `make test-isa` runs under each instruction-set level) and
tests/slow_tests.txt (those `make test-fast` leaves out) name tests that exist: a renamed test would otherwise make
every level fail with "not found" (and only in CI's second step), or silently join the fast tier."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def missing_entries(listing: Path, root: Path = ROOT) -> list[str]:
    """The lines of `listing` whose file, or whose test function in that file, does not exist."""
    missing = []
    for line in listing.read_text().splitlines():
        entry = line.strip()
        if not entry or entry.startswith("#"):
            continue
        file, _, test = entry.partition("::")
        path = root / file
        if not path.is_file():
            missing.append(entry)
            continue
        if test:
            names = {n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef)}
            if test.split("[")[0] not in names:
                missing.append(entry)
    return missing


def test_every_listed_numerics_test_exists():
    assert missing_entries(ROOT / "tests" / "isa_tests.txt") == []


def test_a_renamed_test_is_found(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text("def test_kept():\n    pass\n")
    listing = tmp_path / "list.txt"
    listing.write_text("# comment\ntests/test_x.py::test_kept\ntests/test_x.py::test_gone\ntests/test_y.py\n")
    assert missing_entries(listing, tmp_path) == ["tests/test_x.py::test_gone", "tests/test_y.py"]


def test_every_listed_slow_test_exists():
    """tests/slow_tests.txt (the tests `make test-fast` leaves out) names tests that exist."""
    assert missing_entries(ROOT / "tests" / "slow_tests.txt") == []


def test_the_slow_tier_is_read_off_a_durations_report_and_marked(request):
    """_slow_tests.py lists the tests over the threshold (setup + call + teardown, each parametrized case apart), and
    conftest.py marks every listed test of this session `slow` (so -m "not slow" deselects it)."""
    from _slow_tests import LISTING, slow_tests

    report = (
        "12.00s call     tests/test_a.py::test_long[x]\n0.60s setup    tests/test_a.py::test_short\n"
        "0.50s call     tests/test_a.py::test_short\n0.90s call     tests/test_a.py::test_long[y]\n"
    )
    assert slow_tests(report, 1.0) == ["tests/test_a.py::test_long[x]", "tests/test_a.py::test_short"]
    listed = {line for line in LISTING.read_text().splitlines() if line and not line.startswith("#")}
    for item in request.session.items:
        assert (item.get_closest_marker("slow") is not None) == (item.nodeid in listed), item.nodeid
