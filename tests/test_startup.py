"""The one-query tools start in the time their model load takes (issue 42, item 3): `ctxrep search --query` and
`ctxrep rerank --query` load their model once and import nothing that their answer does not need (scipy.stats took
seconds to import for a search; asking whether a one-query call should be compiled imported Inductor, ~3 s);
benchmarks/startup.py measures the wall times against the model load alone."""

from __future__ import annotations

import subprocess
import sys

from _serve_helpers import tiny_cross_encoder
from click.testing import CliRunner

from ctxrep.cli import main

HEAVY = ("scipy.stats", "torch._inductor", "torch._dynamo", "transformers", "sentence_transformers", "sklearn")

RUN = """
import sys
import ctxrep.models.loading as loading

builds = []
build = loading._build
loading._build = lambda *a, **k: builds.append(a[0].name) or build(*a, **k)
from ctxrep.cli import main

for args in (sys.argv[1:8], sys.argv[8:]):
    try:
        main(args, standalone_mode=False)
    finally:
        sys.stdout.flush()
print("builds", builds)
print("heavy", [m for m in {heavy!r} if m in sys.modules])
"""


def test_search_and_rerank_load_once_and_import_nothing_heavy(tiny_models, minilm_path, tmp_path):
    docs = tmp_path / "docs.txt"
    docs.write_text("a cat sat on the mat\nthe dog ran home\nstocks fell today\n")
    model = str(tiny_models["bert"])
    built = CliRunner().invoke(
        main, ["index", "build", "--input", str(docs), "--model", model, "--out", str(tmp_path / "ix")]
    )
    assert built.exit_code == 0, built.output
    ce = tiny_cross_encoder(tmp_path / "ce", minilm_path)
    search = ["search", "--index", str(tmp_path / "ix"), "--query", "a cat", "-k", "2"]
    rerank = ["rerank", "--model", str(ce), "--query", "a cat", "--documents", str(docs)]
    done = subprocess.run(
        [sys.executable, "-c", RUN.format(heavy=HEAVY), *search, *rerank], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "query\trank\tscore\tid\ttext" and len([line for line in lines if line.startswith("0\t")]) == 5
    assert f"builds {[model, str(ce)]!r}" in lines, lines[-2:]  # each command's model, once
    assert "heavy []" in lines, lines[-1]
