"""Reading an embedding job's input: one `Record` (a text's words and its line) at a time, lazily.

Formats: one text per line (text), JSON Lines (jsonl: `text_field` names the field), CSV / TSV (csv, tsv),
CoNLL token columns (conll), Parquet (parquet: `text_field` names the column; a record's "line" is its 1-based
row). CSV, TSV and JSONL are read by ctxrep.data.table (its column rule: a header name or a number counted from 1,
-1 the last; its header rule), plain text by ctxrep.util.files.utf8_lines, CoNLL by ctxrep.data.conll; a gzip-
compressed text input is read as is. `shards_of` cuts the records into the shards an embedding run writes.
"""

from __future__ import annotations

import gzip
import io
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ctxrep.util.files import GZIP_MAGIC, utf8_lines

FORMATS = ("text", "jsonl", "csv", "tsv", "conll", "parquet")
DEFAULT_TEXT_COLUMN = "text"


def to_stderr(message: str) -> None:
    """The default `log` / `warn` of an embedding run: one flushed line on stderr."""
    print(message, file=sys.stderr, flush=True)


@dataclass
class Record:
    """One input text: its words and the 1-based line where it starts (the row, for Parquet)."""

    words: list[str]
    line: int


def _words_of_value(value: Any, source: str, n: int, field_name: str) -> list[str]:
    words = value.split() if isinstance(value, str) else value
    if hasattr(words, "tolist"):  # a numpy / Arrow list from Parquet
        words = words.tolist()
    if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
        raise ValueError(f"{source}:{n}: field {field_name!r} must be a string or a list of strings")
    return words


def read_records(
    stream,
    source: str,
    fmt: str,
    text_field: str,
    skip_empty: bool,
    warn: Callable[[str], None] = to_stderr,
    header: bool | None = None,
) -> Iterator[Record]:
    """Parse a binary stream into records; bad lines raise ValueError naming source:line and the fix.

    `text_field` is the JSONL field, or the CSV/TSV column: a header name, or a number counted from 1 (-1: the
    last). CSV, TSV and JSONL are read by ctxrep.data.table, with its column rule and header rule (`header`: whether
    the first row names the columns; None: yes when the column is a name, refused when it is a number).
    `warn` receives advice that does not stop the run (plain text that looks like JSON Lines or CSV).
    """
    if fmt == "conll":
        from ctxrep.data.conll import iter_conll

        for sentence in iter_conll((text for _, text in utf8_lines(stream, source)), source=source):
            yield Record(sentence.words, sentence.line)
        return
    if fmt in ("csv", "tsv", "jsonl"):
        yield from _table_records(stream, source, fmt, text_field, skip_empty, header)
        return
    if fmt == "parquet":  # a seekable file, not a stream of lines
        yield from parquet_records(getattr(stream, "name", stream), source, text_field, skip_empty)
        return
    sniffed = False
    for n, text in utf8_lines(stream, source):
        if not sniffed and text.strip():
            sniffed = True
            advice = _looks_structured(text)
            if advice:
                warn(f"warning: {source}:{n}: {advice}; reading it as plain text, one text per line")
        words = text.split()
        if not words:
            if skip_empty:
                continue
            raise ValueError(
                f"{source}:{n}: empty or whitespace-only text; remove it, or pass --skip-empty to skip such lines "
                "(the index keeps the true line numbers)"
            )
        yield Record(words, n)


_HEADER_FIELD = re.compile(r'^"?[\w.\-]+"?$')  # a column name: no spaces, no sentence punctuation


def _looks_structured(first_line: str) -> str | None:
    """Advice when the first non-empty line of a plain-text input looks like JSON Lines, or a CSV/TSV header."""
    if first_line.lstrip().startswith('{"'):
        return "this looks like JSON Lines; to read it as such pass --format jsonl --text-column FIELD"
    for sep, fmt in (("\t", "tsv"), (",", "csv")):
        fields = first_line.strip().split(sep)
        if len(fields) > 1 and all(_HEADER_FIELD.match(f.strip()) for f in fields):
            names = ", ".join(f.strip().strip('"') for f in fields[:6])
            return (
                f"this looks like a {fmt.upper()} header ({names}); to read it as such pass --format {fmt} "
                "--text-column COLUMN"
            )
    return None


def _table_records(
    stream, source: str, fmt: str, column: str, skip_empty: bool, header: bool | None
) -> Iterator[Record]:
    """CSV / TSV / JSONL rows through ctxrep.data.table (streamed: one row at a time); a CSV record may span lines
    inside quotes and is numbered by its first line. A blank line, or a row whose text is empty, stops the run
    unless `skip_empty`."""
    from ctxrep.data.table import field_of, table_rows

    path = Path(source)
    lines = utf8_lines(stream, source, keep_ends=True)
    columns, rows = table_rows(path, fmt, header, {"--text-column": column}, lines=lines, blank=True)
    k = columns.index(column, "--text-column") if columns is not None else None  # the CSV / TSV column, once
    width = columns.width if columns is not None else None
    for n, row in rows:
        if not row:
            if skip_empty:
                continue
            raise ValueError(f"{source}:{n}: empty line; remove it, or pass --skip-empty to skip such lines")
        if len(row) == width:
            value = row[k]
        else:  # a JSONL field by name, or field_of's error for a row of another width
            value = field_of(path, n, row, columns, column, "--text-column")
        words = value.split() if isinstance(value, str) else _words_of_value(value, source, n, column)
        if not words:
            if skip_empty:
                continue
            raise ValueError(
                f"{source}:{n}: empty text in column {column!r}; remove the row, or pass --skip-empty to skip such "
                "rows (the index keeps the true line numbers)"
            )
        yield Record(words, n)


def parquet_records(file, source: str, column: str, skip_empty: bool) -> Iterator[Record]:
    """A Parquet file's `column` (a name, or a number counted from 1: strings or lists of strings), read a row group
    at a time; line = 1-based row."""
    from ctxrep.data.table import column_number, is_number

    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError("reading Parquet needs pyarrow: pip install 'ctxrep[ray]' (or pyarrow)") from None
    try:
        parquet = pq.ParquetFile(file)
    except Exception as e:  # pyarrow raises its own ArrowInvalid
        raise ValueError(f"{source}: not a readable Parquet file ({e})") from None
    names = parquet.schema_arrow.names
    if column not in names and is_number(column):  # the table rule: counted from 1, -1 the last
        column = names[column_number(column, len(names), "--text-column", source, "the file")]
    if column not in names:
        raise ValueError(
            f"{source}: no column {column!r} (columns: {', '.join(names[:10])}); choose it with --text-column"
        )
    n = 0
    for batch in parquet.iter_batches(columns=[column], batch_size=4096):
        for value in batch.column(0).to_pylist():
            n += 1
            words = [] if value is None else _words_of_value(value, source, n, column)
            if not words:
                if skip_empty:
                    continue
                raise ValueError(f"{source}:{n}: empty text in row {n}; pass --skip-empty to skip such rows")
            yield Record(words, n)


def open_input(input_path: str):
    """The input as a binary stream of lines; gzip-compressed input (known by its magic bytes) is decompressed."""
    if input_path == "-":
        stdin = sys.stdin.buffer if hasattr(sys.stdin.buffer, "peek") else io.BufferedReader(sys.stdin.buffer)
        return gzip.GzipFile(fileobj=stdin, mode="rb") if stdin.peek(2)[:2] == GZIP_MAGIC else stdin
    with open(input_path, "rb") as f:
        compressed = f.read(2) == GZIP_MAGIC
    return gzip.open(input_path, "rb") if compressed else open(input_path, "rb")


def parquet_rows(path: str) -> int | None:
    """The number of rows of a Parquet file (from its footer), or None when it cannot be read here."""
    try:
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows
    except Exception:  # reported with its line by parquet_records
        return None


def shards_of(records: Iterator[Record], shard_size: int) -> Iterator[tuple[int, int, list[Record]]]:
    """(shard number, first text, records) for consecutive groups of `shard_size` records, read lazily."""
    batch: list[Record] = []
    k = first = 0
    for record in records:
        batch.append(record)
        if len(batch) == shard_size:
            yield k, first, batch
            k, first, batch = k + 1, first + len(batch), []
    if batch:
        yield k, first, batch
