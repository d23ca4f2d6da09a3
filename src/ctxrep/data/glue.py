"""GLUE-style TSV files: a header row naming the columns, then one example per line.

The caller names the columns to read, e.g. SST-2 `text_a="sentence"`, MNLI `text_a="sentence1",
text_b="sentence2", label="gold_label"`, QQP `text_a="question1", text_b="question2",
label="is_duplicate"`. Fields are split on tabs only: GLUE files are not CSV-quoted, and a quote
character is ordinary text (a CSV reader with quoting on silently merges lines of MNLI).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ctxrep.data.conll import iter_utf8_lines

logger = logging.getLogger(__name__)


@dataclass
class GlueExample:
    text_a: str
    text_b: str | None  # None for single-sentence tasks
    label: str | None  # as written in the file; None when no label column was asked for
    line: int  # 1-based line number in the file


def iter_glue_tsv(
    lines: Iterable[str],
    text_a: str,
    text_b: str | None = None,
    label: str | None = "label",
    source: str = "<input>",
) -> Iterator[GlueExample]:
    """Stream examples; `text_a`, `text_b` and `label` are header names (pass None to skip one)."""
    rows = iter(enumerate(lines, start=1))
    first = next(rows, None)
    if first is None:
        raise ValueError(f"{source}: the file is empty; expected a header row naming the columns")
    header = first[1].rstrip("\r\n").removeprefix("\ufeff").split("\t")
    wanted = [name for name in (text_a, text_b, label) if name is not None]
    missing = [name for name in wanted if name not in header]
    if missing:
        raise ValueError(
            f"{source}:1: the header has no column {', '.join(map(repr, missing))}; its columns "
            f"are {header}; pass the names as they appear in the header"
        )
    a = header.index(text_a)
    b = header.index(text_b) if text_b is not None else None
    y = header.index(label) if label is not None else None
    for number, text in rows:
        fields = text.rstrip("\r\n").split("\t")
        if len(fields) != len(header):
            raise ValueError(
                f"{source}:{number}: found {len(fields)} tab-separated fields but the header has "
                f"{len(header)}; fix the row (a tab or line break inside a text field?)"
            )
        yield GlueExample(
            text_a=fields[a],
            text_b=fields[b] if b is not None else None,
            label=fields[y] if y is not None else None,
            line=number,
        )


def read_glue_tsv(
    path: str | Path, text_a: str, text_b: str | None = None, label: str | None = "label"
) -> list[GlueExample]:
    """Read a whole GLUE-style TSV file (UTF-8) into memory."""
    lines = (text for _, text in iter_utf8_lines(path))
    examples = list(iter_glue_tsv(lines, text_a, text_b, label, source=str(path)))
    logger.info("%s: %d examples", path, len(examples))
    return examples
