"""Deliberate copies stay equal to their originals (transformers' "# Copied from" check), and no other code is
written twice between model files.

A family file keeps its forward pass readable top to bottom, so a few blocks are copied on purpose rather than
imported. Each copy carries a marker on the line above its `class` / `def`:

    # Copied from ctxrep.models.bert.SelfAttention.prune
    # Copied from ctxrep.models.bert.EncoderLayer.__init__ with BertConfig->MPNetConfig

The source of the marked definition must equal the original's (read with `ast`, nothing imported), after the
replacements `with A->B, C->D` are made in the original's text. Indentation is compared after dedenting, so a
method may copy a method of another class.

Any other run of the same code in two places of src/ctxrep/models/ (or between a model file and src/ctxrep/modules/)
is a defect: share it in modules/ (plumbing) or mark the copy (`unmarked_duplicates` says what counts).
"""

from __future__ import annotations

import ast
import difflib
import io
import re
import textwrap
import tokenize
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


def _first_line(node: ast.AST) -> int:
    return min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])


def _marked(tree: ast.Module, line: int, where: str) -> ast.AST:
    """The class or def right below a marker at `line`."""
    below = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and _first_line(n) > line
    ]
    assert below, f"{where}: no class or def below the marker"
    return min(below, key=_first_line)


def copy_source(copy: Copy) -> str:
    """Source of the definition right below the marker (further marker or comment lines may sit between)."""
    text = copy.file.read_text()
    node = _marked(ast.parse(text), copy.line, f"{copy.file}:{copy.line}")
    between = text.splitlines()[copy.line : _first_line(node) - 1]
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
    assert len(copies) >= 6, "the markers were lost: src/ holds deliberate copies that carry them"
    assert {c.target.rsplit(".", 1)[-1] for c in copies} >= {"prune", "attend", "project_qkv", "config_from_hf"}
    assert mismatches(SRC) == []


def test_every_copy_note_is_a_marker_the_check_reads():
    """A note that says "Copied from" in another form would go unchecked."""
    loose = [
        f"{file.relative_to(SRC)}:{i}: {text.strip()}"
        for file in sorted(SRC.rglob("*.py"))
        for i, text in enumerate(file.read_text().splitlines(), start=1)
        if re.search(r"#\s*copied from", text, re.IGNORECASE) and not MARKER.match(text)
    ]
    assert loose == [], "write each as `# Copied from package.module.Name[ with A->B]` on its own line above the def"


# ---- duplicates that are neither shared nor marked ------------------------------------------------------------

MIN_RUN = 8  # lines; a shorter run of the same lines is left to `duplicates` (a place to look, not a defect)
# Lines that hold only these tokens are data or prose (a docstring, an entry of a checkpoint-name table, a closing
# bracket), never the logic written twice.
_DATA_TOKENS = {tokenize.STRING, tokenize.OP}


def logic_lines(file: Path) -> list[tuple[int, str]]:
    """(line number, normalised text) of every line of `file` that counts towards a duplicate.

    Normalised: the line's tokens joined by one space (identifiers, strings and numbers kept; whitespace and comments
    dropped). Left out: blank and comment lines, lines of only strings and brackets (docstrings, name tables),
    imports, the signature of each def (the arguments of the encoder interface, which every family repeats by design),
    a class's annotated fields (a config dataclass lists its checkpoint's config.json keys: `hidden_size: int = 768`
    in many families is data, not logic), and every line of a `# Copied from` block, which the check above keeps
    equal to its original."""
    text = file.read_text()
    tree = ast.parse(text)
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            skip.update(range(node.lineno, node.end_lineno + 1))
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            skip.update(range(node.lineno, node.body[0].lineno))
        elif isinstance(node, ast.ClassDef):
            for field in node.body:
                if isinstance(field, ast.AnnAssign):
                    skip.update(range(field.lineno, field.end_lineno + 1))
    for i, line in enumerate(text.splitlines(), start=1):
        if MARKER.match(line):
            skip.update(range(i, _marked(tree, i, f"{file}:{i}").end_lineno + 1))
    tokens: dict[int, list[tokenize.TokenInfo]] = {}
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            tokens.setdefault(tok.start[0], []).append(tok)
    return [
        (line, " ".join(t.string for t in toks))
        for line, toks in sorted(tokens.items())
        if line not in skip and not all(t.type in _DATA_TOKENS or t.type == tokenize.ENDMARKER for t in toks)
    ]


def shared_runs(a: list[tuple[int, str]], b: list[tuple[int, str]], same: bool) -> list[tuple[int, int, int, int]]:
    """Each longest run of at least MIN_RUN consecutive equal lines of `a` and `b` (two files, or one file and
    itself when `same`: then two places that do not overlap), as (first and last line in a, first and last in b)."""
    where: dict[str, list[int]] = {}
    for i, (_, text) in enumerate(a):
        where.setdefault(text, []).append(i)
    runs = []
    for j, (_, text) in enumerate(b):
        for i in where.get(text, ()):
            if (same and i >= j) or (i > 0 and j > 0 and a[i - 1][1] == b[j - 1][1]):
                continue  # one place with itself, or inside a run already counted from its start
            n = 0
            while i + n < len(a) and j + n < len(b) and a[i + n][1] == b[j + n][1] and not (same and i + n >= j):
                n += 1
            if n >= MIN_RUN:
                runs.append((a[i][0], a[i + n - 1][0], b[j][0], b[j + n - 1][0]))
    return runs


def unmarked_duplicates(root: Path) -> list[str]:
    """Runs of at least MIN_RUN equal `logic_lines` in two places of `root`/models/*.py, or of a model file and a
    `root`/modules/*.py file, outside `# Copied from` blocks: one line each, `a.py:10-24 ~ b.py:40-54`. What is
    compared is the text after normalising (identifiers kept), so code of the same shape with other names, signatures,
    config fields, docstrings and name tables do not count; a run of a few lines (MIN_RUN) does not either."""
    models = sorted((root / "models").glob("*.py"))
    files = models + sorted((root / "modules").glob("*.py"))
    lines = {f: logic_lines(f) for f in files}
    found = []
    for x, a in enumerate(models):
        for b in files[x:]:
            for a0, a1, b0, b1 in shared_runs(lines[a], lines[b], a == b):
                found.append(f"{a.relative_to(root)}:{a0}-{a1} ~ {b.relative_to(root)}:{b0}-{b1}")
    return found


def test_model_files_share_or_mark_what_they_repeat():
    assert unmarked_duplicates(SRC / "ctxrep") == [], (
        "the same code stands in two model files: move plumbing to src/ctxrep/modules/ (a small function or module "
        "with its formula in the docstring), or keep the copy in the family file with a `# Copied from ...` marker"
    )


LAYER = """
class {cls}:
    def __init__(self, config: {config}) -> None:
        \"\"\"{doc}\"\"\"
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.output = nn.Linear(config.hidden_size, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)  # after the residual
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.activation = ACTIVATIONS[config.hidden_act]
        self.heads = config.num_attention_heads
"""


def _tree(tmp_path: Path, **files: str) -> Path:
    (tmp_path / "models").mkdir()
    (tmp_path / "modules").mkdir()
    for name, text in files.items():
        (tmp_path / name.replace(".", "/", 1)).with_suffix(".py").write_text(text)
    return tmp_path


def test_a_repeated_block_is_named_with_both_places(tmp_path):
    bert = LAYER.format(cls="BertLayer", config="BertConfig", doc="BERT's layer")
    other = "import torch\n\n" + LAYER.format(cls="OtherLayer", config="OtherConfig", doc="another family's")
    root = _tree(tmp_path, **{"models.bert": bert, "models.other": other})
    assert unmarked_duplicates(root) == ["models/bert.py:5-12 ~ models/other.py:7-14"]


def test_a_marked_copy_a_short_run_and_the_same_shape_are_not_duplicates(tmp_path):
    bert = LAYER.format(cls="BertLayer", config="BertConfig", doc="BERT's layer")
    marked = "# Copied from pkg.bert.BertLayer with Bert->Other\n" + LAYER.format(
        cls="OtherLayer", config="OtherConfig", doc="another family's"
    )
    short = LAYER.format(cls="ShortLayer", config="ShortConfig", doc="").replace(
        "        self.dropout = nn.Dropout(config.hidden_dropout_prob)\n", "        self.scale = 1.0\n"
    )
    renamed = LAYER.format(cls="RenamedLayer", config="C", doc="").replace("config.", "c.").replace("config:", "c:")
    fields = "@dataclass\nclass BertConfig:\n" + "".join(f"    f{i}: int = {i}\n" for i in range(12))
    root = _tree(
        tmp_path,
        **{
            "models.bert": bert + fields,
            "models.marked": marked,
            "models.short": short,
            "models.renamed": renamed,
            "models.fields": fields.replace("BertConfig", "OtherConfig"),
        },
    )
    assert unmarked_duplicates(root) == []


def test_a_module_copied_into_a_family_file_is_a_duplicate(tmp_path):
    layer = LAYER.format(cls="Layer", config="Config", doc="")
    root = _tree(tmp_path, **{"models.bert": layer, "modules.layer": layer})
    assert unmarked_duplicates(root) == ["models/bert.py:2-12 ~ modules/layer.py:2-12"]


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
