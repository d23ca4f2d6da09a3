"""Deliberate copies stay equal to their originals (transformers' "# Copied from" check).

A family file keeps its forward pass readable top to bottom, so a few blocks are copied on purpose rather than
imported. Each copy carries a marker on the line above its `class` / `def`:

    # Copied from ctxrep.models.bert.SelfAttention.prune
    # Copied from ctxrep.models.bert.EncoderLayer.__init__ with BertConfig->MPNetConfig

The source of the marked definition must equal the original's (read with `ast`, nothing imported), after the
replacements `with A->B, C->D` are made in the original's text. Indentation is compared after dedenting, so a
method may copy a method of another class.
"""

from __future__ import annotations

import ast
import difflib
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"

MARKER = re.compile(r"^\s*# Copied from (?P<target>[\w.]+)(?: with (?P<renames>.+?))?\s*$")


@dataclass
class Copy:
    file: Path
    line: int  # 1-based line of the marker
    target: str  # dotted: package.module.Name[.member]
    renames: list[tuple[str, str]]


def find_copies(src: Path) -> list[Copy]:
    """Every marker under `src` (a folder holding packages); a malformed `with` clause fails here."""
    copies = []
    for file in sorted(src.rglob("*.py")):
        for i, text in enumerate(file.read_text().splitlines(), start=1):
            m = MARKER.match(text)
            if not m:
                continue
            renames = []
            for pair in (m["renames"] or "").split(","):
                if not pair.strip():
                    continue
                old, sep, new = pair.strip().partition("->")
                assert sep and old and new, f"{file}:{i}: a rename reads OLD->NEW, got {pair.strip()!r}"
                renames.append((old, new))
            copies.append(Copy(file, i, m["target"], renames))
    return copies


def _definition(tree: ast.Module, path: list[str]) -> ast.AST | None:
    """The class / function at `path` (Name, or Class.method, ...) in a parsed module."""
    body, node = tree.body, None
    for name in path:
        node = next(
            (
                n
                for n in body
                if isinstance(n, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and n.name == name
            ),
            None,
        )
        if node is None:
            return None
        body = node.body
    return node


def _source(text: str, node: ast.AST) -> str:
    """The definition's lines (decorators included), dedented."""
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    lines = text.splitlines()[first - 1 : node.end_lineno]
    return textwrap.dedent("\n".join(lines))


def original_source(target: str, src: Path) -> str:
    """Source of a dotted target: the longest module prefix that is a file under `src`, then names inside it."""
    parts = target.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        file = src.joinpath(*parts[:cut]).with_suffix(".py")
        if file.is_file():
            text = file.read_text()
            node = _definition(ast.parse(text), parts[cut:])
            assert node is not None, f"{target}: {'.'.join(parts[cut:])} is not defined in {file}"
            return _source(text, node)
    raise AssertionError(f"{target}: no module of it found under {src}")


def copy_source(copy: Copy) -> str:
    """Source of the definition right below the marker (further marker or comment lines may sit between)."""
    text = copy.file.read_text()
    tree = ast.parse(text)
    below = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and min([n.lineno] + [d.lineno for d in n.decorator_list]) > copy.line
    ]
    assert below, f"{copy.file}:{copy.line}: no class or def below the marker"
    node = min(below, key=lambda n: min([n.lineno] + [d.lineno for d in n.decorator_list]))
    between = text.splitlines()[copy.line : min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1]
    assert all(not s.strip() or s.strip().startswith("#") for s in between), (
        f"{copy.file}:{copy.line}: the marker must stand right above the class or def it marks"
    )
    return _source(text, node)


def mismatches(src: Path) -> list[str]:
    """One message per copy that differs from its original (after the renames), with a diff."""
    out = []
    for copy in find_copies(src):
        want = original_source(copy.target, src)
        for old, new in copy.renames:
            want = want.replace(old, new)
        got = copy_source(copy)
        if got != want:
            diff = "\n".join(difflib.unified_diff(want.splitlines(), got.splitlines(), "original", "copy", lineterm=""))
            out.append(
                f"{copy.file.relative_to(src)}:{copy.line}: differs from {copy.target}; change both together, or "
                f"drop the marker if the copy is meant to differ\n{diff}"
            )
    return out


def test_every_marked_copy_equals_its_original():
    copies = find_copies(SRC)
    assert len(copies) >= 3, "the markers were lost: src/ holds deliberate copies that carry them"
    assert mismatches(SRC) == []


def _package(tmp_path: Path, original: str, copy: str) -> Path:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "a.py").write_text(original)
    (pkg / "b.py").write_text(copy)
    return tmp_path


ORIGINAL = '''
class BertLayer:
    def prune(self, heads):
        """Drop heads of BertLayer."""
        return [h for h in heads if h]  # keep the rest
'''


def test_a_copy_with_renames_passes(tmp_path):
    copy = '''
class Other:
    # Copied from pkg.a.BertLayer.prune with Bert->MPNet
    def prune(self, heads):
        """Drop heads of MPNetLayer."""
        return [h for h in heads if h]  # keep the rest
'''
    assert mismatches(_package(tmp_path, ORIGINAL, copy)) == []


def test_a_copy_that_drifted_is_named_with_a_diff(tmp_path):
    copy = '''
# Copied from pkg.a.BertLayer with Bert->MPNet
class MPNetLayer:
    def prune(self, heads):
        """Drop heads of MPNetLayer."""
        return [h for h in heads if h > 0]  # keep the rest
'''
    (problem,) = mismatches(_package(tmp_path, ORIGINAL, copy))
    assert problem.startswith("pkg/b.py:2: differs from pkg.a.BertLayer; change both together")
    assert "-        return [h for h in heads if h]  # keep the rest" in problem
    assert "+        return [h for h in heads if h > 0]  # keep the rest" in problem


def test_a_marker_naming_nothing_is_refused(tmp_path):
    copy = """
# Copied from pkg.a.BertLayer.forward
def forward(x):
    return x
"""
    with pytest.raises(AssertionError, match=r"pkg.a.BertLayer.forward: BertLayer.forward is not defined in .*a.py"):
        mismatches(_package(tmp_path, ORIGINAL, copy))
