"""`ctxrep embed`: stream texts from a file (or stdin) into shards of word or sentence vectors.

Output directory:
  manifest.json          what was asked (model, layers, pooling, input) and the finished shards
  shard-00000.safetensors  (or .npy)  `vectors`: (rows, dim) or (rows, n_layers, dim), float32
  index-00000.tsv        one line per row: row, text (0-based record number), line (1-based input line), word, token

Input: one text per line (text), JSON Lines (jsonl), CSV / TSV with a header line (csv, tsv: the text is in the
column named by --text-column), or CoNLL token columns (conll); a gzip-compressed input is read as is.

Memory stays bounded: texts are read and embedded `--shard-size` at a time. A shard is written to a temporary
name and renamed when complete, and the manifest is rewritten after it, so an interrupted run resumes after the
last complete shard when run again with the same arguments.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import json
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import click
import numpy as np
from tqdm.auto import tqdm

from ctxrep.cli.common import user_errors

FORMATS = ("text", "jsonl", "csv", "tsv", "conll")
DEFAULT_TEXT_COLUMN = "text"


@dataclass
class Record:
    """One input text: its words and the 1-based line where it starts."""

    words: list[str]
    line: int


def _decode(raw: bytes, source: str, line: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(
            f"{source}:{line}: invalid UTF-8 at byte {e.start} of the line; convert the file to UTF-8 "
            "(e.g. iconv -f latin1 -t utf-8 FILE)"
        ) from None


def _lines(stream, source: str) -> Iterator[tuple[int, str]]:
    for n, raw in enumerate(stream, start=1):
        yield n, _decode(raw, source, n).rstrip("\r\n").lstrip("\ufeff" if n == 1 else "")


def read_records(stream, source: str, fmt: str, text_field: str, skip_empty: bool) -> Iterator[Record]:
    """Parse a binary stream into records; bad lines raise ValueError naming source:line and the fix.

    `text_field` is the JSONL field or the CSV/TSV header column (a name, or a 1-based column number) of the text.
    """
    if fmt == "conll":
        from ctxrep.data.conll import iter_conll

        for sentence in iter_conll((text for _, text in _lines(stream, source)), source=source):
            yield Record(sentence.words, sentence.line)
        return
    if fmt in ("csv", "tsv"):
        yield from _table_records(stream, source, fmt, text_field, skip_empty)
        return
    sniffed = fmt != "text"
    for n, text in _lines(stream, source):
        if not sniffed and text.strip():
            sniffed = True
            advice = _looks_structured(text)
            if advice:
                click.echo(f"warning: {source}:{n}: {advice}; reading it as plain text, one text per line", err=True)
        if fmt == "jsonl":
            if not text.strip() and skip_empty:
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as e:
                raise ValueError(f"{source}:{n}: not valid JSON ({e.msg}); each line must be one JSON object") from None
            if not isinstance(obj, dict) or text_field not in obj:
                raise ValueError(f"{source}:{n}: no {text_field!r} field; choose the field with --text-column")
            value = obj[text_field]
            words = value.split() if isinstance(value, str) else value
            if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
                raise ValueError(f"{source}:{n}: field {text_field!r} must be a string or a list of strings")
        else:
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


def _decoded_lines(stream, source: str) -> Iterator[str]:
    """Decoded lines with their line endings (the csv module needs them inside quoted fields)."""
    for n, raw in enumerate(stream, start=1):
        text = _decode(raw, source, n)
        yield text.lstrip("\ufeff") if n == 1 else text


def _table_records(stream, source: str, fmt: str, column: str, skip_empty: bool) -> Iterator[Record]:
    """CSV / TSV with a header line; a record may span lines inside quotes and is numbered by its first line."""
    csv.field_size_limit(max(csv.field_size_limit(), 1 << 30))  # long documents in one field
    reader = csv.reader(_decoded_lines(stream, source), delimiter="\t" if fmt == "tsv" else ",")
    try:
        header = next(reader, None)
        if header is None:
            return
        if column in header:
            k = header.index(column)
        elif column.isdigit() and 1 <= int(column) <= len(header):
            k = int(column) - 1
        else:
            shown = ", ".join(repr(h) for h in header[:10]) + (", ..." if len(header) > 10 else "")
            hint = " (is the file tab-separated? pass --format tsv)" if fmt == "csv" and len(header) == 1 else ""
            raise ValueError(
                f"{source}:1: no column {column!r} in the header ({shown}){hint}; choose the column with "
                "--text-column NAME (or a 1-based number)"
            )
        end = reader.line_num
        for row in reader:
            n, end = end + 1, reader.line_num
            if not row:  # a blank line
                if skip_empty:
                    continue
                raise ValueError(f"{source}:{n}: empty line; remove it, or pass --skip-empty to skip such lines")
            if k >= len(row):
                raise ValueError(
                    f"{source}:{n}: {len(row)} field(s), but the text column {header[k]!r} is field {k + 1}; "
                    f"check the separator ({'tab' if fmt == 'tsv' else 'comma'}) and the quoting of this line"
                )
            words = row[k].split()
            if not words:
                if skip_empty:
                    continue
                raise ValueError(
                    f"{source}:{n}: empty text in column {header[k]!r}; remove the row, or pass --skip-empty to skip "
                    "such rows (the index keeps the true line numbers)"
                )
            yield Record(words, n)
    except csv.Error as e:
        raise ValueError(f"{source}:{reader.line_num}: malformed {fmt.upper()} ({e}); check the quoting") from None


def open_input(input_path: str):
    """The input as a binary stream of lines; gzip-compressed input (known by its magic bytes) is decompressed."""
    if input_path == "-":
        stdin = sys.stdin.buffer if hasattr(sys.stdin.buffer, "peek") else io.BufferedReader(sys.stdin.buffer)
        return gzip.GzipFile(fileobj=stdin, mode="rb") if stdin.peek(2)[:2] == _GZIP_MAGIC else stdin
    with open(input_path, "rb") as f:
        compressed = f.read(2) == _GZIP_MAGIC
    return gzip.open(input_path, "rb") if compressed else open(input_path, "rb")


_GZIP_MAGIC = b"\x1f\x8b"


def parse_layers(value: str) -> int | list[int] | str:
    if value in ("all", "mix"):
        return value
    try:
        parts = [int(p) for p in value.split(",")]
    except ValueError:
        raise click.BadParameter(f"{value!r}: give a layer index, a comma-separated list, 'all' or 'mix'") from None
    return parts[0] if len(parts) == 1 else parts


def _fingerprint(path: str) -> dict:
    if path == "-":
        return {"input": "-"}
    st = os.stat(path)
    return {"input": str(Path(path).resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _write_json_atomic(file: Path, obj: dict) -> None:
    tmp = file.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, file)


@click.command()
@click.option("--model", default="minilm", show_default=True, help="Packaged model name or model folder.")
@click.option("--input", "input_path", required=True, help="Input file, or - for standard input.")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Output directory.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    default="text",
    show_default=True,
    help="text: one text per line; jsonl: one JSON object per line; csv/tsv: a header line, then one row "
    "per text; conll: token columns, blank-line separated. A .gz input is decompressed.",
)
@click.option(
    "--text-column",
    "--text-field",
    "text_column",
    default=None,
    help="The JSONL field, or the CSV/TSV column (header name or 1-based number), holding the text [default: text].",
)
@click.option("--level", type=click.Choice(["word", "sentence"]), default="word", show_default=True)
@click.option("--layers", default="-1", show_default=True, help="Layer index, comma-separated list, 'all' or 'mix'.")
@click.option(
    "--pooling",
    type=click.Choice(["first", "last", "mean", "first_last"]),
    default="mean",
    show_default=True,
    help="How a word's subword pieces become one vector.",
)
@click.option(
    "--sentence-pooling",
    type=click.Choice(["mean", "cls", "model"]),
    default="mean",
    show_default=True,
    help="--level sentence: mean of the word vectors, the classification token, or the model folder's own "
    "pooling (a sentence-transformers folder: modules.json).",
)
@click.option("--shard-size", default=2000, show_default=True, help="Texts per shard.")
@click.option("--storage", type=click.Choice(["safetensors", "npy"]), default="safetensors", show_default=True)
@click.option("--skip-empty", is_flag=True, help="Skip empty lines instead of stopping with an error.")
@click.option("--batch-tokens", default=2048, show_default=True, help="Token budget of one encoder batch.")
@click.option("--threads", type=int, default=None, help="Torch threads (default: torch's choice).")
@click.option(
    "--quantize",
    type=click.Choice(["int8"]),
    default=None,
    help="int8 linear layers (per-channel weights, calibrated activations): faster on CPU, vectors at a "
    "mean cosine of about 0.99 to float32. Transformer models only.",
)
@click.option(
    "--compile/--no-compile",
    "compile_",
    default=None,
    help="torch.compile the encoder (default: only when a shard is large enough to repay the compilation).",
)
@user_errors
def embed(
    model,
    input_path,
    out_dir,
    fmt,
    text_column,
    level,
    layers,
    pooling,
    sentence_pooling,
    shard_size,
    storage,
    skip_empty,
    batch_tokens,
    threads,
    quantize,
    compile_,
) -> None:
    """Write word- or sentence-level vectors of every text in INPUT to shards in OUT."""
    from ctxrep.featurize import Featurizer

    if shard_size < 1:
        raise ValueError(f"--shard-size must be at least 1, got {shard_size}")
    if text_column is not None and fmt not in ("jsonl", "csv", "tsv"):
        raise ValueError(f"--text-column applies to --format jsonl, csv or tsv, not {fmt}; add --format")
    text_field = text_column or DEFAULT_TEXT_COLUMN
    out = Path(out_dir)
    settings = {
        "model": model,
        "format": fmt,
        "text_field": text_field,
        "level": level,
        "layers": layers,
        "pooling": pooling,
        "sentence_pooling": sentence_pooling,
        "shard_size": shard_size,
        "storage": storage,
        "skip_empty": skip_empty,
        **_fingerprint(input_path),
    }
    if quantize is not None:  # changes the vectors: a resumed run must use the same setting
        settings["quantize"] = quantize
    manifest_file = out / "manifest.json"
    shards: list[dict] = []
    if manifest_file.is_file():
        manifest = json.loads(manifest_file.read_text())
        if manifest["settings"] != settings:
            keys = set(settings) | set(manifest["settings"])
            changed = sorted(k for k in keys if manifest["settings"].get(k) != settings.get(k))
            raise ValueError(
                f"{out} holds the output of a different run (differs in: {', '.join(changed)}); "
                "use another --out directory or delete this one"
            )
        if manifest.get("complete"):
            click.echo(f"{out}: already complete ({manifest['texts']} texts, {manifest['rows']} rows); nothing to do")
            return
        shards = manifest["shards"]
    out.mkdir(parents=True, exist_ok=True)
    done_texts = sum(s["texts"] for s in shards)

    fz = Featurizer(
        model,
        layers=parse_layers(layers),
        pooling=pooling,
        sentence_pooling=sentence_pooling,
        batch_tokens=batch_tokens,
        num_threads=threads,
        quantize=quantize,
        compile="auto" if compile_ is None else compile_,
    )
    dim = fz.sentence_dim if level == "sentence" else fz.dim
    manifest = {"settings": settings, "dim": dim, "shards": shards, "complete": False}
    source = "<stdin>" if input_path == "-" else input_path
    stream = open_input(input_path)
    total = None if input_path == "-" or isinstance(stream, gzip.GzipFile) else os.path.getsize(input_path)
    bar = tqdm(total=total, unit="B", unit_scale=True, desc="embed", disable=None)
    try:
        records = read_records(_counting(stream, bar), source, fmt, text_field, skip_empty)
        if done_texts:
            click.echo(f"resuming after {done_texts} texts in {len(shards)} complete shards", err=True)
            for _ in zip(range(done_texts), records):
                pass
        batch: list[Record] = []
        for record in records:
            batch.append(record)
            if len(batch) == shard_size:
                _write_shard(fz, batch, done_texts, level, storage, out, shards, manifest, manifest_file)
                done_texts += len(batch)
                batch = []
        if batch:
            _write_shard(fz, batch, done_texts, level, storage, out, shards, manifest, manifest_file)
            done_texts += len(batch)
    finally:
        bar.close()
        if input_path != "-":
            stream.close()
    if done_texts == 0:
        empty = "all its texts were empty and skipped" if skip_empty else "it holds no texts"
        click.echo(f"warning: {source}: nothing to embed: {empty}; check the input file and --format", err=True)
    manifest.update(complete=True, texts=done_texts, rows=sum(s["rows"] for s in shards))
    _write_json_atomic(manifest_file, manifest)
    click.echo(f"wrote {manifest['rows']} {level} vectors ({dim} wide) for {done_texts} texts to {out}")


def _counting(stream, bar) -> Iterator[bytes]:
    for raw in stream:
        bar.update(len(raw))
        yield raw


def _write_shard(
    fz,
    batch: list[Record],
    first_text: int,
    level: str,
    storage: str,
    out: Path,
    shards: list[dict],
    manifest: dict,
    manifest_file: Path,
) -> None:
    k = len(shards)
    words = [r.words for r in batch]
    if level == "word":
        per_text = fz.embed_words(words)
        vectors = np.concatenate(per_text) if per_text else np.zeros((0, fz.dim), np.float32)
        index = [(first_text + t, r.line, w, word) for t, r in enumerate(batch) for w, word in enumerate(r.words)]
    else:
        vectors = fz.embed_sentences(words)
        index = [(first_text + t, r.line, -1, "") for t, r in enumerate(batch)]
    assert len(index) == len(vectors), "one index line per vector row"
    name = f"shard-{k:05d}.{storage}"
    tmp = out / (name + ".tmp")
    if storage == "safetensors":
        from safetensors.numpy import save_file

        from ctxrep.files import apply_umask

        save_file({"vectors": np.ascontiguousarray(vectors)}, str(tmp))
        apply_umask(tmp)  # safetensors writes 0600 whatever the umask
    else:
        with open(tmp, "wb") as f:
            np.save(f, vectors)
    index_name = f"index-{k:05d}.tsv"
    index_tmp = out / (index_name + ".tmp")
    with open(index_tmp, "w", encoding="utf-8") as f:
        f.write("row\ttext\tline\tword\ttoken\n")
        for row, (text, line, w, word) in enumerate(index):
            f.write(f"{row}\t{text}\t{line}\t{w}\t{word}\n")
    os.replace(tmp, out / name)
    os.replace(index_tmp, out / index_name)
    digest = hashlib.sha256((out / name).read_bytes()).hexdigest()[:16]
    shards.append(
        {
            "file": name,
            "index": index_name,
            "texts": len(batch),
            "rows": len(index),
            "first_line": batch[0].line,
            "sha256_16": digest,
        }
    )
    _write_json_atomic(manifest_file, manifest)


def load_shards(out_dir: str | os.PathLike) -> tuple[np.ndarray, list[dict]]:
    """Read back all vectors and index rows of an `ctxrep embed` output directory (for tests and users)."""
    out = Path(out_dir)
    manifest = json.loads((out / "manifest.json").read_text())
    vectors, index = [], []
    for shard in manifest["shards"]:
        file = out / shard["file"]
        if file.suffix == ".safetensors":
            from safetensors.numpy import load_file

            vectors.append(load_file(str(file))["vectors"])
        else:
            vectors.append(np.load(file))
        with open(out / shard["index"], encoding="utf-8") as f:
            header = f.readline().rstrip("\n").split("\t")
            for line in f:
                values = line.rstrip("\n").split("\t")
                row = dict(zip(header, values))
                index.append(
                    {
                        "text": int(row["text"]),
                        "line": int(row["line"]),
                        "word": int(row["word"]),
                        "token": row["token"],
                    }
                )
    return (np.concatenate(vectors) if vectors else np.zeros((0, manifest["dim"]), np.float32)), index
