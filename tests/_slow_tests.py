"""The slow tier: tests/slow_tests.txt lists the tests that `make test-fast` leaves out (conftest.py marks each
with `slow`; `make test` runs everything).

The list is measured, not guessed: run the whole suite with durations and write every test (each case of a
parametrized one) whose setup + call + teardown took longer than the threshold:

    .venv/bin/python -m pytest -q -n 2 --dist loadfile --durations=0 tests > durations.log
    .venv/bin/python tests/_slow_tests.py durations.log 1.0      # seconds on a quiet 2-core machine

A test missing from the list runs in both tiers (only making the fast one slower); a listed test that no longer
exists fails tests/test_isa_list.py, as a stale isa_tests.txt line does.
"""

from __future__ import annotations

import collections
import re
import sys
from pathlib import Path

LISTING = Path(__file__).with_name("slow_tests.txt")
ROW = re.compile(r"\s*([\d.]+)s (setup|call|teardown)\s+(\S+)")


def slow_tests(report: str, threshold: float) -> list[str]:
    """The node id of every test whose phases took more than `threshold` seconds in a durations report."""
    seconds: collections.Counter = collections.Counter()
    for line in report.splitlines():
        row = ROW.match(line)
        if row:
            seconds[row.group(3)] += float(row.group(1))
    return sorted(test for test, spent in seconds.items() if spent > threshold)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python tests/_slow_tests.py DURATIONS_LOG SECONDS")
    tests = slow_tests(Path(sys.argv[1]).read_text(), float(sys.argv[2]))
    header = (
        "# The slow tier (`make test-fast` leaves these out; `make test` runs them): measured by tests/_slow_tests.py,\n"
        f"# every test over {sys.argv[2]} s. One pytest node id a line.\n"
    )
    LISTING.write_text(header + "".join(t + "\n" for t in tests))
    print(f"{LISTING}: {len(tests)} tests")
