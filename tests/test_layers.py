"""Every import runs down the layer order that docs/architecture.md states ("Import direction"), or stays in its layer.

The order is read from the documentation itself, so the two cannot drift apart. Each module of src/ctxrep is parsed
with `ast` (nothing is imported), and every `import` / `from ... import` in it, at the top or inside a function
(lazy imports count), is resolved to the module it loads and placed in a layer. Imports under
`if TYPE_CHECKING:` are left out: they never run.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "ctxrep"
DOCS = ROOT / "docs" / "architecture.md"


def read_layers(text: str) -> dict[str, tuple[int, str]]:
    """{module name: (rank, layer name)} from the first ```text block after "Import direction" in `text`."""
    start = text.index("Import direction")
    block = re.search(r"```text\n(.*?)```", text[start:], re.S)
    assert block, "docs/architecture.md: no ```text block with the layer order after 'Import direction'"
    layers = {}
    for line in block.group(1).splitlines():
        if not line.strip():
            continue
        rank, name, *modules = line.split()
        for module in modules:
            full = "ctxrep" if module == "ctxrep" else f"ctxrep.{module}"
            assert full not in layers, f"{module} is placed twice in the layer order"
            layers[full] = (int(rank), name)
    return layers


def module_name(path: Path, package: Path) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str, layers: dict[str, tuple[int, str]]) -> tuple[int, str] | None:
    """The layer of the longest name in `layers` that is `module` or a package holding it (`ctxrep` itself places
    only the package's __init__, not every module under it)."""
    parts = module.split(".")
    for n in range(len(parts), 1, -1):
        if ".".join(parts[:n]) in layers:
            return layers[".".join(parts[:n])]
    return layers.get(module) if module == "ctxrep" else None


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the import nodes inside `if TYPE_CHECKING:` blocks."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom)))
    return skip


def imports_of(source: str, module: str, is_package: bool, known: set[str]) -> list[tuple[int, str]]:
    """(line, module loaded) for every import of a ctxrep module in `source`; `known` holds every module name, so
    that `from ctxrep.runtime import fast` resolves to ctxrep.runtime.fast and `from ctxrep.models.bert import BertModel` to
    ctxrep.models.bert."""
    tree = ast.parse(source)
    skip = _type_checking_only(tree)
    found = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the module's package
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            targets = [f"{origin}.{a.name}" if f"{origin}.{a.name}" in known else origin for a in node.names]
        else:
            continue
        for target in targets:
            if target == "ctxrep" or target.startswith("ctxrep."):
                while target not in known and "." in target:  # `import ctxrep.models.bert.X` style: the module
                    target = target.rsplit(".", 1)[0]
                if (node.lineno, target) not in found:
                    found.append((node.lineno, target))
    return found


def upward_imports(package: Path, layers: dict[str, tuple[int, str]]) -> list[str]:
    """One line per import that runs up the order, and per module the order does not place."""
    files = sorted(package.rglob("*.py"))
    known = {module_name(p, package) for p in files}
    problems = []
    for path in files:
        module = module_name(path, package)
        own = layer_of(module, layers)
        if own is None:
            problems.append(f"{module}: not placed in the layer order (docs/architecture.md, 'Import direction')")
            continue
        for line, target in imports_of(path.read_text(encoding="utf-8"), module, path.name == "__init__.py", known):
            theirs = layer_of(target, layers)
            if theirs is not None and theirs[0] > own[0]:
                problems.append(
                    f"{path.relative_to(package.parent)}:{line}: {module} ({own[0]} {own[1]}) imports {target} "
                    f"({theirs[0]} {theirs[1]}), a higher layer"
                )
    return problems


def test_the_order_is_stated_and_places_every_layer_once():
    layers = read_layers(DOCS.read_text(encoding="utf-8"))
    ranks = sorted({rank for rank, _ in layers.values()})
    assert ranks == list(range(1, len(ranks) + 1)) and len(ranks) >= 10
    for name in ("ctxrep.models.encoder", "ctxrep.text", "ctxrep.models.loading", "ctxrep.compress", "ctxrep.cli"):
        assert name in layers, name
    assert layers["ctxrep.text"][0] < layers["ctxrep.models.loading"][0] < layers["ctxrep.objectives"][0]
    assert layers["ctxrep.models.student"][0] < layers["ctxrep.objectives"][0] < layers["ctxrep.compress"][0]


def test_every_import_runs_down_the_order():
    problems = upward_imports(PACKAGE, read_layers(DOCS.read_text(encoding="utf-8")))
    assert not problems, "\n".join(problems)


def test_the_check_sees_lazy_imports_and_unplaced_modules(tmp_path):
    """A package of three modules: a lazy import up the order inside a function is caught, an import down is
    not, a TYPE_CHECKING import is not, and a module missing from the order is named."""
    package = tmp_path / "ctxrep"
    (package / "low").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "low" / "__init__.py").write_text("")
    (package / "low" / "base.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from ctxrep.high import Thing\n"
        "def f():\n"
        "    from ctxrep import high\n"
        "    return high\n"
    )
    (package / "high.py").write_text("from ctxrep.low.base import f\nfrom .low import base\n")
    (package / "stray.py").write_text("")
    layers = read_layers("Import direction\n```text\n1 low low\n2 high high\n3 package ctxrep\n```\n")
    problems = upward_imports(package, layers)
    assert len(problems) == 2, problems
    assert "low/base.py:5: ctxrep.low.base (1 low) imports ctxrep.high (2 high)" in problems[0]
    assert problems[1].startswith("ctxrep.stray: not placed")


@pytest.mark.parametrize(
    "source, expected",
    [
        ("from ctxrep.models.bert import BertModel", "ctxrep.models.bert"),
        ("from ctxrep.runtime import fast", "ctxrep.runtime.fast"),
        ("from ctxrep.models import hub", "ctxrep.models.hub"),
        ("import ctxrep.models.loading", "ctxrep.models.loading"),
        ("from ctxrep.data import read_conll", "ctxrep.data"),
        ("from . import bert", "ctxrep.models.bert"),
    ],
)
def test_imports_resolve_to_the_module_they_load(source, expected):
    known = {
        "ctxrep",
        "ctxrep.runtime",
        "ctxrep.runtime.fast",
        "ctxrep.data",
        "ctxrep.models",
        "ctxrep.models.bert",
        "ctxrep.models.hub",
    }
    known |= {"ctxrep.models.loading", "ctxrep.models.student"}
    assert imports_of(source, "ctxrep.models.student", False, known) == [(1, expected)]


def import_circles(package: Path) -> list[list[str]]:
    """Every cycle of the module import graph (lazy imports included, TYPE_CHECKING left out), each as the list of
    modules around it; [] when the graph is a DAG. Within one layer imports are allowed, circles never are."""
    files = sorted(package.rglob("*.py"))
    known = {module_name(p, package) for p in files}
    graph = {}
    for path in files:
        module = module_name(path, package)
        graph[module] = {
            t for _, t in imports_of(path.read_text(encoding="utf-8"), module, path.name == "__init__.py", known)
        }
        graph[module] -= {module}
    circles, state, stack = [], {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                circles.append(stack[stack.index(target) :] + [target])
            elif target not in state:
                visit(target)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return circles


def test_no_import_circles():
    circles = import_circles(PACKAGE)
    assert not circles, "\n".join(" -> ".join(c) for c in circles)


def test_the_circle_check_sees_a_lazy_circle(tmp_path):
    package = tmp_path / "ctxrep"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from ctxrep import b\n")
    (package / "b.py").write_text("def f():\n    from ctxrep.a import x\n")
    (package / "c.py").write_text("from ctxrep import a\n")
    assert import_circles(package) == [["ctxrep.a", "ctxrep.b", "ctxrep.a"]]
