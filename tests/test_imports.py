"""What importing costs and who may import what, beyond the layer order of test_layers.py.

- `ctxrep --help` and every command's `--help` import no torch, scipy or other heavy library: each cli/ module
  imports them inside its command functions (a fresh interpreter builds the help, then lists sys.modules; not a
  timing). Choice lists the CLI writes out for that reason equal the library tables they copy.
- No module imports another module's private name (`from ctxrep.x import _name`), nor a private module of another
  package (`ctxrep.analysis._common` outside ctxrep/analysis/): a helper two modules share is public, with a
  docstring, or lives where both can reach it. Benchmarks import the library, never each other.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "scipy", "sklearn", "pandas", "transformers", "tokenizers", "safetensors", "onnxruntime", "openvino")

DRIVER = """
import json, sys
from ctxrep.cli import main
try:
    main({args!r}, standalone_mode=False)
except SystemExit:
    pass
print("\\nMODULES " + json.dumps(sorted(sys.modules)))
"""


def _help(*args: str) -> tuple[str, set[str]]:
    """(help text, top-level names of the modules loaded) of `ctxrep ARGS` in a fresh interpreter."""
    done = subprocess.run(
        [sys.executable, "-c", DRIVER.format(args=list(args))], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    text, _, modules = done.stdout.rpartition("\nMODULES ")
    return text, {name.split(".")[0] for name in json.loads(modules)}


@pytest.mark.parametrize(
    ("args", "shown"),
    [(("--help",), "train-sentence-encoder"), (("embed", "--help"), "--sentence-pooling")],
)
def test_help_imports_no_heavy_library(args, shown):
    text, loaded = _help(*args)
    assert shown in text, text
    assert sorted(loaded & set(HEAVY)) == []


EVERY_HELP = """
import json, sys
import click
from ctxrep.cli import main

heavy, seen = {heavy!r}, {{}}
ctx = click.Context(main)
for name, command in main.commands.items():
    commands = [(name, command)]
    if isinstance(command, click.Group):
        commands += [(name + " " + sub, c) for sub, c in command.commands.items()]
    for words, _ in commands:
        try:
            main(words.split() + ["--help"], standalone_mode=False)
        except SystemExit:
            pass
        for module in heavy:
            if module in sys.modules and module not in seen:
                seen[module] = words
print(json.dumps(seen))
"""


def test_every_commands_help_imports_no_heavy_library():
    done = subprocess.run(
        [sys.executable, "-c", EVERY_HELP.format(heavy=HEAVY)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    first_loaded_by = json.loads(done.stdout.splitlines()[-1])
    assert first_loaded_by == {}, f"--help of these commands imported a heavy library: {first_loaded_by}"


def test_choice_lists_written_out_for_help_equal_the_library_tables():
    from ctxrep.cli import pretrain, sentence_encoder
    from ctxrep.objectives.recipes import RECIPES
    from ctxrep.tasks import sentence_encoder as estimator

    assert pretrain.OBJECTIVES == tuple(RECIPES)  # objectives/names.py, checked by recipes.py at import too
    assert (sentence_encoder.LOSSES, sentence_encoder.POOLINGS) == (estimator.LOSSES, estimator.POOLINGS)


def test_top_level_help_does_not_even_import_numpy():
    _, loaded = _help("--help")
    assert "numpy" not in loaded and "tqdm" not in loaded


def private_imports(folder: Path, root: Path = ROOT) -> list[str]:
    """`file:line: from M import _x` (file relative to `root`) for every import of a private ctxrep name."""
    found = []
    for file in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ctxrep"):
                private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
                if private:
                    found.append(
                        f"{file.relative_to(root)}:{node.lineno}: from {node.module} import {', '.join(private)}"
                    )
    return found


def test_no_module_imports_another_modules_private_names():
    assert private_imports(ROOT / "src") == []
    assert private_imports(ROOT / "benchmarks") == []


def private_modules(folder: Path, root: Path = ROOT) -> list[str]:
    """`file:line: M` for every import of a ctxrep module whose path has a private part (`ctxrep.a._b`) from outside
    the package that holds it (`folder` is the src/ folder: file paths name their package)."""
    found = []
    for file in sorted(folder.rglob("*.py")):
        package = ".".join(file.relative_to(folder).with_suffix("").parts[:-1])
        for node in ast.walk(ast.parse(file.read_text())):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            for module in modules:
                parts = module.split(".")
                private = [i for i, part in enumerate(parts) if part.startswith("_") and not part.startswith("__")]
                if parts[0] != "ctxrep" or not private:
                    continue
                owner = ".".join(parts[: private[0]])
                if package != owner and not package.startswith(owner + "."):
                    found.append(f"{file.relative_to(root)}:{node.lineno}: {module}")
    return found


def test_no_module_imports_a_private_module_of_another_package():
    assert private_modules(ROOT / "src") == []


def test_the_private_module_check_sees_one(tmp_path):
    for package in ("ctxrep/a", "ctxrep/b"):
        (tmp_path / package).mkdir(parents=True, exist_ok=True)
    (tmp_path / "ctxrep/a/m.py").write_text("from ctxrep.a._x import f\n")  # its own package's: allowed
    (tmp_path / "ctxrep/b/m.py").write_text("def g():\n    from ctxrep.a._x import f\n")
    assert private_modules(tmp_path, root=tmp_path) == ["ctxrep/b/m.py:2: ctxrep.a._x"]


def test_the_private_import_check_sees_one(tmp_path):
    (tmp_path / "m.py").write_text("def f():\n    from ctxrep.x import _hidden, shown\n")
    assert private_imports(tmp_path, root=tmp_path) == ["m.py:2: from ctxrep.x import _hidden"]


def test_benchmarks_do_not_import_each_other():
    names = {p.stem for p in (ROOT / "benchmarks").glob("*.py")}
    crossing = []
    for file in sorted((ROOT / "benchmarks").glob("*.py")):
        text = file.read_text()
        for node in ast.walk(ast.parse(text)):
            modules = []
            if isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            crossing += [f"{file.name}:{node.lineno}: {m}" for m in modules if m.split(".")[0] in names - {"_common"}]
    assert crossing == [], "a benchmark imports the library (or benchmarks/_common.py), not another benchmark"


def test_benchmarks_reach_neither_the_tests_nor_sys_path():
    """A script's own folder is on sys.path when it runs (`python benchmarks/x.py`), so _common needs no
    sys.path.insert; the tests' helpers (tests/_decoders.py, ...) are not the benchmarks' to import."""
    helpers = {p.stem for p in (ROOT / "tests").glob("*.py")}
    found = []
    for file in sorted((ROOT / "benchmarks").glob("*.py")):
        tree = ast.parse(file.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found += [f"{file.name}:{node.lineno}: {a.name}" for a in node.names if a.name in helpers]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "") in helpers:
                found.append(f"{file.name}:{node.lineno}: {node.module}")
            elif isinstance(node, ast.Attribute) and node.attr in ("insert", "append"):
                if ast.unparse(node.value) == "sys.path":
                    found.append(f"{file.name}:{node.lineno}: sys.path.{node.attr}")
    assert found == []
