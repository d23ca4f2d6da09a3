"""The user's own task files: CSV, TSV, JSONL and CoNLL-style columns, plain or gzip-compressed.

    data = read_labelled_texts("train.csv", text_column="review", label_column="stars")   # classify
    data = read_labelled_texts("train.tsv", text_column="s1", text_pair_column="s2")          # pair
    data = read_tagged("train.conll", word_column=0, tag_column=-1)                      # tag
    data = read_questions("train.jsonl")                                                 # span (SQuAD-style)

Each returns `TaskData(X, y, lines, source)`: X and y in the form the ctxrep.tasks estimators take, and the
1-based line where each example starts, so that later checks (a dev label never seen in training) can name it.

Formats (`format=None` reads it from the name, ".gz" removed): .csv -> csv, .tsv / .tab -> tsv, .jsonl / .ndjson /
.json -> jsonl, anything else -> conll for `read_tagged` (CoNLL-2003's eng.train has no suffix).
  csv, tsv   one example per row, after a header row naming the columns. A column is a header name or a
             number counted from 1 (as `cut -f` counts; -1 is the last column). CSV follows RFC 4180 quoting (a
             quoted field may span lines); TSV is split on tabs only, with no quoting (as GLUE's files: a quote
             character is ordinary text).
  jsonl      one JSON object per line; a column is a field name. For `read_tagged` the word and tag fields hold
             lists of the same length (e.g. {"tokens": [...], "ner_tags": [...]}).
  conll      one word per line, columns (numbered from 1, -1 the last) separated by single spaces or tabs, a
             blank line between sentences;
             -DOCSTART- lines are skipped; a .conllu file's "#" comment lines and multiword / empty-node rows
             ("1-2", "1.1") are skipped too.
A file is gzip-compressed when it starts with gzip's magic bytes, whatever its name.

The header rule (`header`, --header / --no-header): a column given by name means the first row names the columns.
When every column is given by number, the first row could be a header or an example, so the reader refuses to
guess unless `header` says which (True: the first row names the columns; False: it is the first example). No row
is ever dropped without being read as the header.

Every error names the file and line and says what to change; the advice names `ctxrep finetune` options
(--text-column, ...), which are the keyword arguments of these readers with "-" for "_".
"""

from __future__ import annotations

import csv
import itertools
import json
import logging
import math
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctxrep.util.files import utf8_lines

logger = logging.getLogger(__name__)

FORMATS = ("csv", "tsv", "jsonl", "conll")
SUFFIXES = {
    ".csv": "csv",
    ".tsv": "tsv",
    ".tab": "tsv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".conll": "conll",
    ".conllu": "conll",
    ".iob": "conll",
    ".bio": "conll",
}
DOCSTART = "-DOCSTART-"


@dataclass
class TaskData:
    """Examples read from one file: X and y as the estimators take them, and each example's first line."""

    X: list
    y: list
    lines: list[int] = field(default_factory=list)
    source: str = "<input>"


def detect_format(path: str | Path, format: str | None, default: str | None = None) -> str:
    """`format` if given, else the one the file name says (".gz" removed), else `default`, else an error."""
    if format is not None:
        if format not in FORMATS:
            raise ValueError(f"unknown format {format!r}; use one of {', '.join(FORMATS)} (--format)")
        return format
    name = Path(path).name.lower().removesuffix(".gz")
    found = SUFFIXES.get(Path(name).suffix)
    if found is None and default is None:
        raise ValueError(
            f"{path}: cannot tell the format from the file name; give --format with one of {', '.join(FORMATS[:3])}"
        )
    return found or default


def numbered_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, text with its line ending) of a UTF-8 file, gunzipped when it starts with gzip's magic
    bytes: ctxrep.util.files.utf8_lines (a BOM dropped; invalid UTF-8 names the file, line and column)."""
    return utf8_lines(path, keep_ends=True)


# ---- rows of CSV / TSV / JSONL ----------------------------------------------------------------------------


class Columns:
    """The columns of one CSV / TSV file: header names (or none, with --no-header) and the number of fields every
    row has. A column spec is a name or a number counted from 1 (negative from the end: -1 is the last)."""

    def __init__(self, header: list[str] | None, width: int, source: str, line: int, format: str) -> None:
        self.header, self.width, self.source, self.line, self.format = header, width, source, line, format

    def index(self, spec: str | int, option: str) -> int:
        """The 0-based position of `spec`, or an error naming the option and the columns there are."""
        if is_number(spec):
            first = "the header" if self.header is not None else "the first row"
            return column_number(spec, self.width, option, f"{self.source}:{self.line}", first)
        if self.header is None:
            raise ValueError(
                f"{self.source}: {option} {spec!r} is a name, but with --no-header the columns have no names; give "
                f"its number (1 to {self.width})"
            )
        if spec not in self.header:
            tabs = self.format == "csv" and len(self.header) == 1 and "\t" in self.header[0]
            raise ValueError(
                f"{self.source}:{self.line}: no column {spec!r} in the header (columns: {', '.join(self.header)})"
                + (" (is the file tab-separated? give --format tsv)" if tabs else "")
                + f"; name the column with {option}"
            )
        return self.header.index(spec)


def is_number(spec: str | int | None) -> bool:
    """Whether a column spec is a number (an int, or text such as "2" or "-1" as the command line gives it)."""
    return isinstance(spec, int) or (isinstance(spec, str) and spec.lstrip("-").isdigit())


def column_number(spec: str | int, width: int, option: str, where: str, row: str = "the row") -> int:
    """The 0-based position of column number `spec` (1 = the first, -1 = the last) in a row of `width` fields."""
    n = int(spec)
    if n == 0:
        raise ValueError(f"{where}: {option} 0: columns are numbered from 1 (the first column is 1, the last -1)")
    if not -width <= n <= width:
        raise ValueError(
            f"{where}: {option} {n} is out of range: {row} has {width} column(s); give a number from 1 to {width} "
            "(or -1 for the last)"
        )
    return n - 1 if n > 0 else width + n


def decide_header(path: Path, format: str, header: bool | None, specs: dict[str, Any]) -> bool:
    """Whether the first row of a CSV / TSV file names the columns (see the module docstring's header rule).
    `specs`: option -> column spec of every column read (None: not read)."""
    given = {option: spec for option, spec in specs.items() if spec is not None}
    if format == "jsonl":
        if header is not None:
            raise ValueError(
                f"{path}: --header / --no-header are for CSV and TSV; a JSON Lines record names its fields"
            )
        return False
    if header is not None:
        return header
    if not given or any(not is_number(spec) for spec in given.values()):
        return True  # a column by name: the first row must name it
    shown = ", ".join(f"{option} {spec}" for option, spec in given.items())
    raise ValueError(
        f"{path}:1: the columns are given by number ({shown}), so the first row could be a header or an example; "
        "say which with --header (the first row names the columns) or --no-header (it is the first example)"
    )


def _rows(
    path: Path, format: str, lines: Iterable[tuple[int, str]] | None = None, blank: bool = False
) -> Iterator[tuple[int, Any]]:
    """(first line, row) per record: a list of fields (csv / tsv, header first) or a dict (jsonl). `lines`: the
    numbered lines with their endings (default: the file's); `blank`: yield a blank line as an empty row ([] or
    None) instead of passing over it."""
    numbered = numbered_lines(path) if lines is None else lines
    if format == "jsonl":
        for number, text in numbered:
            if not text.strip():
                if blank:
                    yield number, None
                continue
            try:
                record = json.loads(text)
            except json.JSONDecodeError as e:
                if text.strip() in ("{", "["):
                    raise ValueError(
                        f"{path}:{number}: this looks like one indented JSON document, not JSON Lines; write one JSON "
                        "object per line (a SQuAD JSON file: --task squad)"
                    ) from None
                raise ValueError(
                    f"{path}:{number}: invalid JSON at column {e.colno}: {e.msg}; each line must be one JSON object "
                    "(a CSV or TSV file needs --format csv or tsv)"
                ) from None
            if not isinstance(record, dict):
                raise ValueError(f"{path}:{number}: expected a JSON object {{...}}, found {type(record).__name__}")
            yield number, record
        return
    csv.field_size_limit(max(csv.field_size_limit(), 1 << 30))  # long documents in one field
    texts = (text for _, text in numbered)
    if format == "tsv":
        reader = csv.reader(texts, delimiter="\t", quoting=csv.QUOTE_NONE)
    else:
        reader = csv.reader(texts)
    start = 1
    try:
        for row in reader:
            if row or blank:  # [] is a blank line
                yield start, row
            start = reader.line_num + 1
    except csv.Error as e:
        raise ValueError(f"{path}:{reader.line_num}: {e}; check the quoting (or give --format tsv)") from None


def table_rows(
    path: Path,
    format: str,
    header: bool | None = True,
    specs: dict[str, Any] | None = None,
    lines: Iterable[tuple[int, str]] | None = None,
    blank: bool = False,
) -> tuple[Columns | None, Iterator[tuple[int, Any]]]:
    """The columns (None for JSONL) and the (line, row) pairs of a CSV, TSV or JSONL file, read lazily. `header`
    and `specs` (option -> column spec) decide whether the first row names the columns (decide_header). `lines`
    reads a stream instead of the file (numbered lines with their endings: utf8_lines(stream, name,
    keep_ends=True)), `path` then only names it; `blank` yields blank lines as empty rows (see _rows)."""
    header = decide_header(path, format, header, specs or {})
    rows = _rows(path, format, lines, blank)
    if format == "jsonl":
        return None, rows
    leading = []  # blank lines before the first row
    first = next(rows, None)
    while first is not None and not first[1]:
        leading.append(first)
        first = next(rows, None)
    if first is None:
        what = "a header row naming the columns, then examples" if header else "one example per row"
        raise ValueError(f"{path}: the file is empty; expected {what}")
    if header:
        names = [h.strip() for h in first[1]]
        return Columns(names, len(names), str(path), first[0], format), rows
    return Columns(None, len(first[1]), str(path), first[0], format), itertools.chain(leading, [first], rows)


def field_of(path: Path, line: int, row: Any, columns: Columns | None, spec: str | int, option: str) -> Any:
    """One value of a row: by header position (csv / tsv) or field name (jsonl)."""
    if columns is None:
        key = str(spec)
        if key not in row:
            raise ValueError(
                f"{path}:{line}: no field {key!r} in the JSON object (fields: {', '.join(map(str, row)) or 'none'}); "
                f"name the field with {option}"
            )
        return row[key]
    i = columns.index(spec, option)
    if len(row) != columns.width:
        first = "the header" if columns.header is not None else f"the first row (line {columns.line})"
        raise ValueError(
            f"{path}:{line}: {len(row)} field(s) but {first} has {columns.width}; "
            + ("quote fields that hold commas" if columns.format == "csv" else "a field holds a tab or one is missing")
        )
    return row[i]


def text_of(path: Path, line: int, value: Any, option: str, spec: str | int) -> str:
    """`value` as the text of one example, or a one-line error naming file:line and the column (`option`, `spec`)."""
    if not isinstance(value, str):
        raise ValueError(f"{path}:{line}: the {spec!r} column ({option}) should hold text, found {value!r}")
    if not value.split():
        raise ValueError(f"{path}:{line}: the {spec!r} column ({option}) is empty; every example needs some text")
    return value


def _label(path: Path, line: int, value: Any, spec: str | int) -> Any:
    if value is None or (isinstance(value, str) and not value.strip()) or isinstance(value, (dict, list)):
        raise ValueError(
            f"{path}:{line}: the label column {spec!r} (--label-column) is empty or not a single value ({value!r}); "
            "give every example a label, or remove it"
        )
    return value.strip() if isinstance(value, str) else value


def _check_label_types(data: TaskData, labels: Iterable[tuple[int, Any]]) -> None:
    """One type of label per file: 1 and "1" would be two classes."""
    kinds: dict[type, int] = {}
    for line, label in labels:
        kind = float if isinstance(label, (int, float)) and not isinstance(label, bool) else type(label)
        kinds.setdefault(kind, line)
    if len(kinds) > 1:
        (k1, l1), (k2, l2) = list(kinds.items())[:2]
        raise ValueError(
            f"{data.source}:{l2}: a {k2.__name__} label, but line {l1} has a {k1.__name__} one; write every label "
            "the same way (e.g. all as strings)"
        )


def _nonempty(data: TaskData, what: str) -> TaskData:
    if not data.X:
        raise ValueError(f"{data.source}: no {what} in the file; is it the right file (and --format)?")
    return data


# ---- classify / pair ---------------------------------------------------------------------------------


def read_labelled_texts(
    path: str | Path,
    text_column: str | int = "text",
    label_column: str | int | None = "label",
    text_pair_column: str | int | None = None,
    format: str | None = None,
    header: bool | None = None,
) -> TaskData:
    """Texts (or (text, text_pair) pairs with `text_pair_column`) and their labels from a CSV, TSV or JSONL file;
    `label_column=None` reads unlabelled input (y: None each), as `ctxrep predict` does. `header`: the header rule
    of the module docstring."""
    path = Path(path)
    format = detect_format(path, format)
    if format == "conll":
        raise ValueError(f"{path}: a CoNLL column file holds tagged words, not labelled texts; use --task tag")
    specs = {"--text-column": text_column, "--text-pair-column": text_pair_column, "--label-column": label_column}
    columns, rows = table_rows(path, format, header, specs)
    data = TaskData([], [], [], str(path))
    for line, row in rows:
        text = text_of(
            path, line, field_of(path, line, row, columns, text_column, "--text-column"), "--text-column", text_column
        )
        if text_pair_column is not None:
            pair = field_of(path, line, row, columns, text_pair_column, "--text-pair-column")
            text = (text, text_of(path, line, pair, "--text-pair-column", text_pair_column))
        label = None
        if label_column is not None:
            label = _label(path, line, field_of(path, line, row, columns, label_column, "--label-column"), label_column)
        data.X.append(text)
        data.y.append(label)
        data.lines.append(line)
    if label_column is not None:
        _check_label_types(data, zip(data.lines, data.y))
    logger.info("%s: %d examples, %d labels", path, len(data.X), len(set(map(str, data.y))))
    return _nonempty(data, "examples")


# ---- seq2seq: (source, target) texts ---------------------------------------------------------------------------


def read_source_target(
    path: str | Path,
    source_column: str | int = "source",
    target_column: str | int = "target",
    format: str | None = None,
    header: bool | None = None,
) -> TaskData:
    """(source text, target text) pairs from a CSV, TSV or JSONL file (summarisation, paraphrase, translation): X the
    sources, y the targets; a missing or empty target is a one-line error naming file:line and --target-column."""
    path = Path(path)
    format = detect_format(path, format)
    if format == "conll":
        raise ValueError(f"{path}: a CoNLL column file holds tagged words, not (source, target) texts")
    specs = {"--source-column": source_column, "--target-column": target_column}
    columns, rows = table_rows(path, format, header, specs)
    data = TaskData([], [], [], str(path))
    for line, row in rows:
        for spec, option, out in (
            (source_column, "--source-column", data.X),
            (target_column, "--target-column", data.y),
        ):
            out.append(text_of(path, line, field_of(path, line, row, columns, spec, option), option, spec))
        data.lines.append(line)
    logger.info("%s: %d (source, target) pairs", path, len(data.X))
    return _nonempty(data, "(source, target) pairs")


def numeric_score(value: Any) -> float:
    """A field read as a score: its float value, or NaN for anything that is not a finite number (text, a missing
    value, true/false); each reader names the file, line and column of a NaN in its own words."""
    try:
        return float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        return math.nan


def read_scored_texts(
    path: str | Path,
    text_column: str | int = "text",
    label_column: str | int = "label",
    text_pair_column: str | int | None = None,
    format: str | None = None,
    header: bool | None = None,
) -> TaskData:
    """Texts (or (text, text_pair) pairs) and a numeric score each (regression) from a CSV, TSV or JSONL file; a
    score that is not a number names its file and line."""
    data = read_labelled_texts(path, text_column, label_column, text_pair_column, format, header)
    scores = []
    for line, value in zip(data.lines, data.y):
        score = numeric_score(value)
        if not math.isfinite(score):
            raise ValueError(
                f"{path}:{line}: the score column {label_column!r} (--label-column) holds {value!r}, which is not a "
                "number; --task regress needs a numeric score per example (for class labels use --task classify)"
            )
        scores.append(score)
    data.y = scores
    return data


# ---- tag ------------------------------------------------------------------------------------------------


def read_tagged(
    path: str | Path,
    word_column: str | int = 1,
    tag_column: str | int | None = -1,
    format: str | None = None,
) -> TaskData:
    """Sentences (word lists) and their tags from a CoNLL-style column file (columns numbered from 1, negative
    from the end) or a JSONL file (word and tag fields holding lists). `tag_column=None` reads words only (y: None
    each), as `ctxrep predict` does."""
    unlabelled = tag_column is None
    if unlabelled:
        tag_column = word_column
    path = Path(path)
    format = detect_format(path, format, default="conll")
    if format in ("csv", "tsv"):
        raise ValueError(
            f"{path}: --task tag reads CoNLL-style column files (one word per line) or JSONL with word and tag "
            "lists; give --format conll or jsonl"
        )
    data = TaskData([], [], [], str(path))
    if format == "jsonl":
        for line, row in _rows(path, "jsonl"):
            words = field_of(path, line, row, None, word_column, "--word-column")
            tags = field_of(path, line, row, None, tag_column, "--tag-column")
            for what, value, option in (("words", words, "--word-column"), ("tags", tags, "--tag-column")):
                if not isinstance(value, list) or not value:
                    raise ValueError(
                        f"{path}:{line}: the {what} field ({option}) should be a non-empty list, found {value!r}"
                    )
            if len(words) != len(tags):
                raise ValueError(f"{path}:{line}: {len(words)} words but {len(tags)} tags; give one tag per word")
            bad = [w for w in words if not isinstance(w, str) or not w.strip() or len(w.split()) != 1]
            if bad:
                raise ValueError(f"{path}:{line}: word {bad[0]!r} is not one non-empty word; split or remove it")
            data.X.append(words)
            data.y.append(tags)
            data.lines.append(line)
    else:
        for sentence in _conll_sentences(
            path, _column_index(path, word_column, "--word-column"), _column_index(path, tag_column, "--tag-column")
        ):
            data.X.append(sentence[0])
            data.y.append(sentence[1])
            data.lines.append(sentence[2])
    if unlabelled:
        data.y = [None] * len(data.X)
    else:
        _check_label_types(data, ((line, t) for line, tags in zip(data.lines, data.y) for t in tags))
    logger.info("%s: %d sentences, %d words", path, len(data.X), sum(len(x) for x in data.X))
    return _nonempty(data, "sentences")


def _column_index(path: Path, spec: str | int, option: str) -> int:
    """A CoNLL column number as given (1 = the first, -1 = the last); checked against each row's width."""
    if is_number(spec) and int(spec) != 0:
        return int(spec)
    if is_number(spec):
        raise ValueError(f"{path}: {option} 0: columns are numbered from 1 (the first column is 1, the last -1)")
    raise ValueError(
        f"{path}: {option} {spec!r} is a name, but a CoNLL-style file has no header: give a column number (1 is "
        "the first, -1 the last)"
    )


def _conll_sentences(path: Path, word: int, tag: int) -> Iterator[tuple[list[str], list[str], int]]:
    conllu = path.name.lower().removesuffix(".gz").endswith(".conllu")
    words: list[str] = []
    tags: list[str] = []
    start = 0
    for number, text in numbered_lines(path):
        text = text.rstrip("\r\n")
        if conllu and text.startswith("#"):
            continue
        fields = text.rstrip().split("\t") if "\t" in text else text.split()
        if not fields or fields[0] == DOCSTART:
            if words:
                yield words, tags, start
                words, tags = [], []
            continue
        if conllu and ("-" in fields[0] or "." in fields[0]):  # multiword token / empty node rows
            continue
        for option, n in (("--word-column", word), ("--tag-column", tag)):
            if not -len(fields) <= n <= len(fields):
                raise ValueError(
                    f"{path}:{number}: the row has {len(fields)} column(s) but {option} is {n}; give a number from 1 "
                    f"to {len(fields)} or -1 to {-len(fields)} (or check the separators: single spaces or tabs)"
                )
        if not words:
            start = number
        words.append(fields[word - 1 if word > 0 else word])
        tags.append(fields[tag - 1 if tag > 0 else tag])
    if words:
        yield words, tags, start


# ---- span -----------------------------------------------------------------------------------------------


def read_questions(
    path: str | Path,
    question_column: str = "question",
    context_column: str = "context",
    answers_column: str | None = "answers",
    format: str | None = None,
) -> TaskData:
    """SQuAD-style JSONL: one question per line with its context and answers as text plus character start, either
    {"text": [...], "answer_start": [...]} (Hugging Face datasets), a list of {"text", "answer_start"} objects, or
    one such object. X: (question, context) pairs; y: a list of (text, start) answers per question. Questions
    without answers (SQuAD 2.0's unanswerable ones) are left out, with a warning. `answers_column=None` reads the
    questions alone (y: None each), as `ctxrep predict` does."""
    path = Path(path)
    format = detect_format(path, format, default="jsonl")
    if format != "jsonl":
        raise ValueError(
            f"{path}: --task span reads JSONL, one question per line with {question_column!r}, {context_column!r} "
            f"and {answers_column!r} fields (a SQuAD JSON document: use --task squad)"
        )
    data = TaskData([], [], [], str(path))
    skipped = 0
    for line, row in _rows(path, "jsonl"):
        if "data" in row and "version" in row:
            raise ValueError(f"{path}:{line}: this is a SQuAD JSON document, not JSONL; read it with --task squad")
        question = text_of(
            path,
            line,
            field_of(path, line, row, None, question_column, "--question-column"),
            "--question-column",
            question_column,
        )
        context = text_of(
            path,
            line,
            field_of(path, line, row, None, context_column, "--context-column"),
            "--context-column",
            context_column,
        )
        if answers_column is None:
            data.X.append((question, context))
            data.y.append(None)
            data.lines.append(line)
            continue
        answers = _answers(path, line, field_of(path, line, row, None, answers_column, "--answers-column"), context)
        if not answers:
            skipped += 1
            continue
        data.X.append((question, context))
        data.y.append(answers)
        data.lines.append(line)
    if skipped:
        warnings.warn(
            f"{path}: left out {skipped} question(s) without answers; span extraction trains and scores "
            "answerable questions",
            stacklevel=2,
        )
    return _nonempty(data, "answerable questions")


def _answers(path: Path, line: int, value: Any, context: str) -> list[tuple[str, int]]:
    how = (
        'answers are {"text": [...], "answer_start": [...]}, a list of {"text": ..., "answer_start": ...} '
        "objects, or one such object (--answers-column names the field)"
    )
    if isinstance(value, dict) and isinstance(value.get("text"), list):
        texts, starts = value["text"], value.get("answer_start")
        if not isinstance(starts, list) or len(starts) != len(texts):
            raise ValueError(f"{path}:{line}: answers has {len(texts)} text(s) but answer_start is {starts!r}; {how}")
        pairs = list(zip(texts, starts))
    elif isinstance(value, dict):
        pairs = [(value.get("text"), value.get("answer_start"))]
    elif isinstance(value, list) and all(isinstance(a, dict) for a in value):
        pairs = [(a.get("text"), a.get("answer_start")) for a in value]
    else:
        raise ValueError(f"{path}:{line}: cannot read the answers {value!r}; {how}")
    out = []
    for n, (text, start) in enumerate(pairs, start=1):
        if not isinstance(text, str) or not text or isinstance(start, bool) or not isinstance(start, int):
            raise ValueError(
                f"{path}:{line}: answer {n} needs a non-empty text and an integer answer_start, "
                f"found {text!r} at {start!r}; {how}"
            )
        found = context[start : start + len(text)]
        if found != text:
            raise ValueError(
                f"{path}:{line}: answer {n} is {text!r} but the context at character {start} reads {found!r}; "
                "fix answer_start (a 0-based character offset into the context) or the text"
            )
        out.append((text, start))
    return out


__all__ = [
    "FORMATS",
    "Columns",
    "TaskData",
    "column_number",
    "decide_header",
    "detect_format",
    "numbered_lines",
    "read_labelled_texts",
    "read_questions",
    "read_scored_texts",
    "read_tagged",
]
