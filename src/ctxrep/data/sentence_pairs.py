"""Training files of a sentence encoder (ctxrep.tasks.SentenceEncoder, `ctxrep train-sentence-encoder`).

    data = read_sentence_examples("pairs.tsv", ["anchor", "positive"])                      # mnrl: tuples, no score
    data = read_sentence_examples("sts.csv", ["s1", "s2"], score_column="score")            # cosine / cosent
    data = read_sentence_examples("wiki.txt", ["text"], format="text")                      # simcse: one text per line
    data = read_sentence_examples("sts-train.csv", format="sts")                             # STS benchmark / STS-B / SICK

Formats: csv, tsv, jsonl (ctxrep.data.table: a header row or JSON fields, gzip read as is), text (one text per
line) and sts (ctxrep.data.sts.read_sts's layouts). X holds one tuple of texts per example (a 1-tuple for text),
y the scores (or None), lines the 1-based line of each example. A missing column, an empty text or a score that is
not a number stops with `FILE:LINE: what is wrong` naming the option to change.
"""

from __future__ import annotations

import math
from pathlib import Path

from ctxrep.data.table import TaskData, detect_format, field_of, numbered_lines, numeric_score, table_rows, text_of

FORMATS = ("csv", "tsv", "jsonl", "text", "sts")
OPTIONS = ("--text-column", "--text-pair-column", "--negative-column")


def read_sentence_examples(
    path: str | Path,
    columns: list[str | int] | None = None,
    score_column: str | int | None = None,
    format: str | None = None,
) -> TaskData:
    """Examples for a sentence encoder; see the module docstring. `columns`: the text columns in order (anchor,
    positive, negative), named by --text-column, --text-pair-column and --negative-column."""
    path = Path(path)
    if format is not None and format not in FORMATS:
        raise ValueError(f"unknown format {format!r}; use one of {', '.join(FORMATS)} (--format)")
    if format == "sts":
        from ctxrep.data.sts import read_sts

        pairs = read_sts(path)
        return TaskData(
            [(p.text_a, p.text_b) for p in pairs], [p.score for p in pairs], [p.line for p in pairs], str(path)
        )
    if format is None:
        name = path.name.lower().removesuffix(".gz")
        format = (
            detect_format(path, None) if Path(name).suffix in (".csv", ".tsv", ".tab", ".jsonl", ".ndjson") else "text"
        )
    data = TaskData([], [], [], str(path))
    if format == "text":
        if score_column is not None or (columns and len(columns) > 1):
            raise ValueError(
                f"{path}: a plain text file holds one text per line; pairs and scores need csv, tsv or jsonl"
            )
        for line, raw in numbered_lines(path):
            text = raw.rstrip("\r\n")
            if not text.strip():
                raise ValueError(f"{path}:{line}: empty line; give one text per line (remove the blank line)")
            data.X.append((text,))
            data.lines.append(line)
        data.y = None
    else:
        columns = list(columns or ["text"])
        if len(columns) > len(OPTIONS):
            raise ValueError(f"at most {len(OPTIONS)} text columns (anchor, positive, negative), got {len(columns)}")
        header, rows = table_rows(path, format)
        for line, row in rows:
            texts = tuple(
                text_of(path, line, field_of(path, line, row, header, spec, option), option, spec)
                for spec, option in zip(columns, OPTIONS)
            )
            data.X.append(texts)
            data.lines.append(line)
            if score_column is not None:
                value = field_of(path, line, row, header, score_column, "--score-column")
                data.y.append(_score(path, line, value, score_column))
        if score_column is None:
            data.y = None
    if not data.X:
        raise ValueError(f"{path}: no examples in the file; is it the right file (and --format)?")
    return data


def _score(path: Path, line: int, value, column) -> float:
    score = numeric_score(value)
    if not math.isfinite(score):
        raise ValueError(
            f"{path}:{line}: the score column {column!r} (--score-column) holds {value!r}, which is not a number; "
            "every pair needs a numeric similarity score"
        )
    return score
