"""Stanford Sentiment Treebank in its PTB-tree release: one labelled, binarized tree per line.

    (3 (2 It) (4 (4 (2 's) (4 good)) (2 .)))

A leaf may hold more than one word: the treebank has "(2 8 1\\/2)" (the film 8 1/2).

Every node carries a sentiment label: 0 very negative, 1 negative, 2 neutral, 3 positive,
4 very positive. `read_sst` turns a file into texts and labels, either one per sentence (the root)
or one per phrase (every node, leaves included), with 5, 3 or 2 classes:
  classes=5  the labels as they are;
  classes=3  0-1 -> 0 negative, 2 -> 1 neutral, 3-4 -> 2 positive;
  classes=2  0-1 -> 0 negative, 3-4 -> 1 positive, neutral (2) dropped -- SST-2.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ctxrep.data.conll import iter_utf8_lines

logger = logging.getLogger(__name__)

_TOKEN = re.compile(r"\(|\)|[^\s()]+")


@dataclass
class SSTTree:
    label: int  # 0-4
    children: list[SSTTree] = field(default_factory=list)
    words: list[str] = field(default_factory=list)  # leaves only; nearly always one word

    def subtrees(self) -> Iterator[SSTTree]:
        """This node and every node below it, parents before children, left to right."""
        stack = [self]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(node.children))

    def leaves(self) -> list[str]:
        return [word for node in self.subtrees() for word in node.words]

    @property
    def text(self) -> str:
        return " ".join(self.leaves())


def parse_sst_tree(text: str) -> SSTTree:
    """Parse one tree like "(3 (2 It) (2 works))". Errors say which character column is wrong."""
    stack: list[SSTTree] = []  # the open nodes, outermost first
    root = None
    expect_label = False
    for match in _TOKEN.finditer(text):
        token, column = match.group(), match.start() + 1
        if root is not None:
            raise ValueError(f"column {column}: text {token!r} after the tree's final ')'")
        if expect_label:
            if token not in ("0", "1", "2", "3", "4"):
                raise ValueError(f"column {column}: expected a label 0-4 after '(', found {token!r}")
            stack.append(SSTTree(int(token)))
            expect_label = False
        elif token == "(":
            if stack and stack[-1].words:
                raise ValueError(f"column {column}: a node with words cannot also have subtrees")
            expect_label = True
        elif token == ")":
            if not stack:
                raise ValueError(f"column {column}: ')' without a matching '('")
            node = stack.pop()
            if not node.words and not node.children:
                raise ValueError(f"column {column}: node with a label but no word or subtrees")
            if stack:
                stack[-1].children.append(node)
            else:
                root = node
        else:
            if not stack:
                raise ValueError(f"column {column}: word {token!r} outside any '(...)'")
            if stack[-1].children:
                raise ValueError(
                    f"column {column}: word {token!r} in a node that already has subtrees; "
                    "words go in leaves like '(2 word)'"
                )
            stack[-1].words.append(token)
    if expect_label or stack:
        raise ValueError(f"column {len(text.rstrip()) + 1}: the tree is missing ')' at the end")
    if root is None:
        raise ValueError("column 1: no tree on this line")
    return root


def iter_sst_trees(lines: Iterable[str], source: str = "<input>") -> Iterator[SSTTree]:
    """Stream the trees of an SST file, one per non-blank line; errors name source and line."""
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            yield parse_sst_tree(line)
        except ValueError as e:
            raise ValueError(
                f"{source}:{number}: {e}; each line must hold one tree like '(3 (2 It) (3 works))'"
            ) from None


def sst_label(label: int, classes: int) -> int | None:
    """Map a 0-4 SST label to `classes` (5, 3 or 2) classes; None means "dropped" (neutral for 2)."""
    if classes == 5:
        return label
    if classes == 3:
        return 0 if label < 2 else 1 if label == 2 else 2
    if classes == 2:
        return None if label == 2 else int(label > 2)
    raise ValueError(f"classes must be 5, 3 or 2, got {classes!r}")


@dataclass
class SSTData:
    texts: list[str]  # words joined by single spaces, as tokenized in the treebank
    labels: list[int]


def read_sst(path: str | Path, classes: int = 5, phrases: bool = False, dedup: bool = False) -> SSTData:
    """Texts and labels from an SST tree file.

    phrases=False gives one example per sentence (the root's label); phrases=True one per node.
    dedup=True keeps only the first example of each distinct text.
    """
    sst_label(2, classes)  # check `classes` before reading the file
    data = SSTData([], [])
    seen: set[str] = set()
    n_trees = 0
    lines = (text for _, text in iter_utf8_lines(path))
    for tree in iter_sst_trees(lines, str(path)):
        n_trees += 1
        for node in tree.subtrees() if phrases else [tree]:
            label = sst_label(node.label, classes)
            if label is None:
                continue
            text = node.text
            if dedup:
                if text in seen:
                    continue
                seen.add(text)
            data.texts.append(text)
            data.labels.append(label)
    logger.info("%s: %d trees -> %d examples", path, n_trees, len(data.texts))
    return data
