"""Files of sentence examples (ctxrep.tasks.SentenceEncoder, `ctxrep train-sentence-encoder`,
`ctxrep evaluate-sentence-encoder`).

    data = read_sentence_examples("pairs.tsv", ["anchor", "positive"])                      # mnrl: tuples, no score
    data = read_sentence_examples("sts.csv", ["s1", "s2"], score_column="score")            # cosine / cosent
    data = read_sentence_examples("wiki.txt", ["text"], format="text")                      # simcse: one text per line
    data = read_sentence_examples("sts-train.csv", format="sts")                             # STS benchmark / STS-B / SICK
    data = read_scored_pairs("sts-dev.csv")                   # scored pairs in any layout: --dev, evaluation

Formats: csv, tsv, jsonl (ctxrep.data.table: a header row or JSON fields, columns by name or by number counted from
1 under the header rule, gzip read as is), text (one text per line) and sts (ctxrep.data.sts.read_sts's layouts).
X holds one tuple of texts per example (a 1-tuple for text), y the scores (or None), lines the 1-based line of each
example, `unread` the file's columns that no option reads (so that a file of pairs is never read as single texts
without saying so). Without `columns`, a file read by name takes "text", and "text_pair" as well where it has one. A
missing column, an empty text or a score that is not a number stops with `FILE:LINE: what is wrong` naming the option
to change.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from ctxrep.data.table import (
    TaskData,
    detect_format,
    field_of,
    numbered_lines,
    numeric_score,
    table_rows,
    text_of,
)

FORMATS = ("csv", "tsv", "jsonl", "text", "sts")
OPTIONS = ("--text-column", "--text-pair-column", "--negative-column")


@dataclass
class SentenceData(TaskData):
    unread: list[str] = field(default_factory=list)  # columns of the file that no option reads


def _format_of(path: Path, format: str | None) -> str:
    if format is not None:
        if format not in FORMATS:
            raise ValueError(f"unknown format {format!r}; use one of {', '.join(FORMATS)} (--format)")
        return format
    name = path.name.lower().removesuffix(".gz")
    return detect_format(path, None) if Path(name).suffix in (".csv", ".tsv", ".tab", ".jsonl", ".ndjson") else "text"


def _first_line(path: Path) -> str:
    return next(iter(numbered_lines(path)), (0, ""))[1]


def read_sentence_examples(
    path: str | Path,
    columns: list[str | int] | None = None,
    score_column: str | int | None = None,
    format: str | None = None,
    header: bool | None = None,
    limit: int | None = None,
) -> SentenceData:
    """Examples for a sentence encoder; see the module docstring. `columns`: the text columns in order (anchor,
    positive, negative), named by --text-column, --text-pair-column and --negative-column (None: "text", and
    "text_pair" where the file has it). `header`: the header rule (--header / --no-header); `limit`: the first N."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    format = _format_of(path, format)
    if format == "sts":
        return _sts_examples(path, limit)
    data = SentenceData([], [], [], str(path))
    if format == "text":
        if score_column is not None or (columns and len(columns) > 1):
            raise ValueError(
                f"{path}: a plain text file holds one text per line; pairs and scores need csv, tsv or jsonl"
            )
        for line, raw in numbered_lines(path):
            if limit is not None and len(data.X) >= limit:
                break
            text = raw.rstrip("\r\n")
            if not text.strip():
                raise ValueError(f"{path}:{line}: empty line; give one text per line (remove the blank line)")
            data.X.append((text,))
            data.lines.append(line)
        data.y = None
        return _nonempty(data)
    defaults = columns is None
    columns = list(columns or ["text"])
    if len(columns) > len(OPTIONS):
        raise ValueError(f"at most {len(OPTIONS)} text columns (anchor, positive, negative), got {len(columns)}")
    specs = dict(zip(OPTIONS, columns)) | {"--score-column": score_column}
    header_columns, rows = table_rows(path, format, header, specs)
    for line, row in rows:
        if not data.X:  # the first record says which columns the file has
            if defaults and "text_pair" in _names(row, header_columns):
                columns.append("text_pair")
            data.unread = _unread(row, header_columns, [*zip(columns, OPTIONS), (score_column, "--score-column")])
        if limit is not None and len(data.X) >= limit:
            break
        texts = tuple(
            text_of(path, line, field_of(path, line, row, header_columns, spec, option), option, spec)
            for spec, option in zip(columns, OPTIONS)
        )
        data.X.append(texts)
        data.lines.append(line)
        if score_column is not None:
            value = field_of(path, line, row, header_columns, score_column, "--score-column")
            data.y.append(_score(path, line, value, score_column))
    if score_column is None:
        data.y = None
    return _nonempty(data)


def _names(row, columns) -> list[str]:
    """The names of a file's columns: the header's, a JSON record's fields, or their numbers (--no-header)."""
    if columns is None:
        return [str(k) for k in row]
    return list(columns.header) if columns.header is not None else [str(i + 1) for i in range(columns.width)]


def _unread(row, columns, specs: list[tuple]) -> list[str]:
    """The file's columns that none of `specs` ((spec, option) pairs) reads, by name (or number without header)."""
    names = _names(row, columns)
    if columns is None:
        read = {str(spec) for spec, _ in specs if spec is not None}
        return [n for n in names if n not in read]
    read = {columns.index(spec, option) for spec, option in specs if spec is not None}
    return [n for i, n in enumerate(names) if i not in read]


def read_scored_pairs(
    path: str | Path,
    columns: list[str | int] | None = None,
    score_column: str | int | None = None,
    format: str | None = None,
    header: bool | None = None,
    limit: int | None = None,
) -> SentenceData:
    """Scored pairs in any layout: the STS benchmark, GLUE STS-B or SICK (told apart by the first line, whatever the
    file's name), or CSV / TSV / JSONL with two text columns (`columns`, default text and text_pair) and a score
    column (default score): what --dev and `ctxrep evaluate-sentence-encoder` read."""
    from ctxrep.data.sts import sniff_layout

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    if format == "sts" or (format is None and sniff_layout(_first_line(path)) is not None):
        return _sts_examples(path, limit)
    if _format_of(path, format) == "text":
        raise ValueError(
            f"{path}: scored pairs are read from the STS benchmark / STS-B / SICK layouts or from CSV, TSV or JSONL "
            "with two text columns and a score column; give --format (csv, tsv, jsonl or sts)"
        )
    pair = list(columns or ["text", "text_pair"])[:2]
    if len(pair) < 2:
        pair.append("text_pair")
    return read_sentence_examples(path, pair, score_column or "score", format, header, limit)


def _sts_examples(path: Path, limit: int | None) -> SentenceData:
    from ctxrep.data.sts import read_sts

    pairs = read_sts(path)[:limit]
    return SentenceData(
        [(p.text_a, p.text_b) for p in pairs], [p.score for p in pairs], [p.line for p in pairs], str(path)
    )


def _nonempty(data: SentenceData) -> SentenceData:
    if not data.X:
        raise ValueError(f"{data.source}: no examples in the file; is it the right file (and --format)?")
    return data


def _score(path: Path, line: int, value, column) -> float:
    score = numeric_score(value)
    if not math.isfinite(score):
        raise ValueError(
            f"{path}:{line}: the score column {column!r} (--score-column) holds {value!r}, which is not a number; "
            "every pair needs a numeric similarity score"
        )
    return score


__all__ = ["FORMATS", "SentenceData", "read_scored_pairs", "read_sentence_examples"]
