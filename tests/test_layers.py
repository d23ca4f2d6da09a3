"""The floor plan: every folder of src/ctxrep (and every top-level module) sits on exactly one floor of the order that
docs/architecture.md states ("Import direction"); every import runs down the floors or stays on its floor, and no
imports go round in a circle, with no exceptions.

The order is read from the documentation itself, so the two cannot drift apart. Each module of src/ctxrep is parsed
with `ast` (nothing is imported), and every `import` / `from ... import` in it, at the top or inside a function
(lazy imports count), is resolved to the module it loads and placed on its folder's floor. Imports under
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


def read_floors(text: str) -> dict[str, tuple[int, str]]:
    """{folder or top-level module: (floor, floor name)} from the first ```text block after "Import direction" in
    `text`: one line per floor, "RANK NAME ROOM ROOM ...", each room a folder or top-level module of ctxrep
    (`ctxrep` itself: the package's __init__), never a module inside a folder."""
    start = text.index("Import direction")
    block = re.search(r"```text\n(.*?)```", text[start:], re.S)
    assert block, "docs/architecture.md: no ```text block with the floor order after 'Import direction'"
    floors = {}
    for line in block.group(1).splitlines():
        if not line.strip():
            continue
        rank, name, *rooms = line.split()
        for room in rooms:
            assert "." not in room, f"{room}: a floor holds whole folders (or top-level modules), not a module of one"
            assert room not in floors, f"{room} is placed on two floors"
            floors[room] = (int(rank), name)
    return floors


def module_name(path: Path, package: Path) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def room_of(module: str) -> str:
    """The folder (or top-level module) holding `module`: ctxrep.models.bert -> models; ctxrep -> ctxrep."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


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


def import_graph(package: Path) -> tuple[dict[str, list[tuple[int, str]]], dict[str, Path]]:
    """({module: [(line, module it imports)]}, {module: its file}) over every module of `package`."""
    files = {module_name(p, package): p for p in sorted(package.rglob("*.py"))}
    known = set(files)
    graph = {
        m: [(line, t) for line, t in imports_of(p.read_text(encoding="utf-8"), m, p.name == "__init__.py", known)]
        for m, p in files.items()
    }
    return graph, files


def upward_imports(package: Path, floors: dict[str, tuple[int, str]]) -> list[str]:
    """One line per import that runs up the floors, per folder or top-level module the order does not place, and
    per room the order names that does not exist."""
    graph, files = import_graph(package)
    problems = []
    rooms = {room_of(m) for m in graph}
    problems += [
        f"{room}: placed in the order, but ctxrep has no such folder or module" for room in floors.keys() - rooms
    ]
    for room in sorted(rooms - floors.keys()):
        problems.append(f"{room}: not placed on a floor (docs/architecture.md, 'Import direction')")
    for module, imports in graph.items():
        own = floors.get(room_of(module))
        for line, target in imports:
            theirs = floors.get(room_of(target))
            if own is not None and theirs is not None and theirs[0] > own[0]:
                problems.append(
                    f"{files[module].relative_to(package.parent)}:{line}: {module} (floor {own[0]} {own[1]}) imports "
                    f"{target} (floor {theirs[0]} {theirs[1]}), a higher floor"
                )
    return problems


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle a depth-first walk of `graph` finds, each as the nodes around it (the first repeated at the
    end); [] when the graph is a DAG."""
    found, state, stack = [], {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                found.append(stack[stack.index(target) :] + [target])
            elif target not in state:
                visit(target)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


def import_circles(package: Path) -> list[list[str]]:
    """Every circle of modules that import each other (lazy imports included, TYPE_CHECKING left out), on one floor
    or across floors."""
    graph, _ = import_graph(package)
    return cycles({m: {t for _, t in imports} - {m} for m, imports in graph.items()})


def folder_circles(package: Path) -> list[list[str]]:
    """Every circle of folders (or top-level modules) that import each other: across floors an upward import
    already shows one; this finds those among rooms of one floor."""
    graph, _ = import_graph(package)
    rooms: dict[str, set[str]] = {}
    for module, imports in graph.items():
        rooms.setdefault(room_of(module), set()).update(room_of(t) for _, t in imports)
    return cycles({room: targets - {room} for room, targets in rooms.items()})


# ---- the project ---------------------------------------------------------------------------------------------------


def test_the_order_is_stated_and_places_every_folder_on_one_floor():
    floors = read_floors(DOCS.read_text(encoding="utf-8"))
    ranks = sorted({rank for rank, _ in floors.values()})
    assert ranks == list(range(1, len(ranks) + 1)) and len(ranks) >= 10
    floor = {room: rank for room, (rank, _) in floors.items()}
    # text before the model; the families below what loads them for a featurizer; the featurizer (and its spec)
    # below the vectors that record it; models/student below the objectives and compression that distil
    assert floor["text"] < floor["data"] < floor["models"] < floor["featurize"] < floor["vectors"] < floor["embed"]
    assert floor["models"] < floor["objectives"] < floor["train"] < floor["tasks"] < floor["compress"] < floor["cli"]
    assert floor["ctxrep"] == max(ranks)


def test_every_import_runs_down_the_floors():
    problems = upward_imports(PACKAGE, read_floors(DOCS.read_text(encoding="utf-8")))
    assert not problems, "\n".join(problems)


def test_no_import_circles():
    circles = import_circles(PACKAGE) + folder_circles(PACKAGE)
    assert not circles, "\n".join(" -> ".join(c) for c in circles)


# ---- the checks themselves -----------------------------------------------------------------------------------------


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    package = tmp_path / "ctxrep"
    for name, text in {"__init__.py": "", **files}.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    return package


ORDER = "Import direction\n```text\n1 low low\n2 high high other\n3 package ctxrep\n```\n"


def test_the_check_sees_an_upward_import_lazy_or_not(tmp_path):
    """A lazy import up a floor inside a function is caught, as is one at the top; an import down is not, nor one
    on the same floor, nor a TYPE_CHECKING import."""
    package = _package(
        tmp_path,
        {
            "low/__init__.py": "",
            "low/base.py": "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n"
            "    from ctxrep.high import Thing\n"
            "def f():\n"
            "    from ctxrep import high\n"
            "    return high\n",
            "low/deep.py": "import ctxrep.other.thing\n",
            "high.py": "from ctxrep.low.base import f\nfrom .low import base\nfrom ctxrep import other\n",
            "other/__init__.py": "",
            "other/thing.py": "",
        },
    )
    problems = upward_imports(package, read_floors(ORDER))
    assert len(problems) == 2, problems
    assert (
        "low/base.py:5: ctxrep.low.base (floor 1 low) imports ctxrep.high (floor 2 high), a higher floor" in problems[0]
    )
    assert "low/deep.py:1: ctxrep.low.deep (floor 1 low) imports ctxrep.other.thing (floor 2 high)" in problems[1]
    (package / "low" / "base.py").write_text("def f():\n    return 1\n")  # the planted import taken out
    (package / "low" / "deep.py").write_text("")
    assert upward_imports(package, read_floors(ORDER)) == []


def test_the_check_names_unplaced_and_unknown_rooms(tmp_path):
    package = _package(tmp_path, {"low/__init__.py": "", "high.py": "", "other.py": "", "stray.py": ""})
    problems = upward_imports(package, read_floors(ORDER.replace("1 low low", "1 low low gone")))
    assert problems == [
        "gone: placed in the order, but ctxrep has no such folder or module",
        "stray: not placed on a floor (docs/architecture.md, 'Import direction')",
    ]


def test_a_module_cannot_be_placed_apart_from_its_folder():
    with pytest.raises(AssertionError, match="models.loading: a floor holds whole folders"):
        read_floors("Import direction\n```text\n1 base models\n2 loading models.loading\n```\n")
    with pytest.raises(AssertionError, match="models is placed on two floors"):
        read_floors("Import direction\n```text\n1 base models\n2 top models\n```\n")


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


def test_the_circle_check_sees_a_lazy_circle_on_one_floor(tmp_path):
    package = _package(
        tmp_path,
        {
            "a.py": "from ctxrep import b\n",
            "b.py": "def f():\n    from ctxrep.a import x\n",
            "c.py": "from ctxrep import a\n",
        },
    )
    assert import_circles(package) == [["ctxrep.a", "ctxrep.b", "ctxrep.a"]]
    assert folder_circles(package) == [["a", "b", "a"]]
    (package / "b.py").write_text("def f():\n    return 1\n")
    assert import_circles(package) == [] and folder_circles(package) == []


def test_the_circle_check_sees_folders_that_import_each_other(tmp_path):
    """No two modules import each other, yet the folders do: tasks/x -> rerank/y, rerank/z -> tasks/w."""
    package = _package(
        tmp_path,
        {
            "tasks/__init__.py": "",
            "tasks/x.py": "from ctxrep.rerank import y\n",
            "tasks/w.py": "",
            "rerank/__init__.py": "",
            "rerank/y.py": "",
            "rerank/z.py": "def g():\n    from ctxrep.tasks import w\n",
        },
    )
    assert import_circles(package) == []
    assert folder_circles(package) == [["rerank", "tasks", "rerank"]]
