"""Embed a corpus into shards of word or sentence vectors: the library behind `ctxrep embed`.

    from ctxrep.embed.corpus import EmbedJob, embed_corpus
    summary = embed_corpus(EmbedJob("corpus.txt", "out/", model="minilm", level="sentence"), workers=2)

Output folder (read it back with `ctxrep.load_vectors`):
  manifest.json            what was asked (model, layers, pooling, input) and the finished shards
  shard-00000.safetensors  (or .npy)  `vectors`: (rows, dim) or (rows, n_layers, dim), float32
  index-00000.tsv          one line per row: row, text (0-based record number), line (1-based input line), word, token

Input: one text per line (text), JSON Lines (jsonl: `text_field` names the field), CSV / TSV (csv, tsv: read by
ctxrep.data.table; `text_field` is a header name or a column number counted from 1, -1 the last; `header` says
whether the first row names the columns, needed when the column is a number), CoNLL token columns (conll), or
Parquet (parquet: `text_field` names the column; a record's "line" is its 1-based row); a gzip-compressed text input
is read as is.

Shards: shard k holds the texts k x shard_size .. (k + 1) x shard_size - 1, whatever runs it, so the folder is the
same for one process, `workers=N` CPU processes or one process per GPU (`devices=["cuda:0", "cuda:1"]`). Records
are parsed lazily, a shard at a time: memory stays bounded. A shard is written to temporary names and renamed when
complete, then the manifest (written only by the process that reads the input) lists it; an interrupted run (Ctrl-C,
`kill -9` of the main process or of any worker) resumes when run again with the same settings: the shards the
manifest lists are kept, the others are embedded (again) and renamed over whatever a killed worker left.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import queue
import re
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ctxrep.util.files import utf8_lines
from ctxrep.util.progress import progress
from ctxrep.vectors.spec import DEFAULT_SENTENCE_POOLING, FeaturizerSpec, layers_text, parse_layers
from ctxrep.vectors.store import MANIFEST, read_manifest, write_arrays, write_manifest

FORMATS = ("text", "jsonl", "csv", "tsv", "conll", "parquet")
DEFAULT_TEXT_COLUMN = "text"


def to_stderr(message: str) -> None:
    """The default `log` / `warn` of an embedding run: one flushed line on stderr."""
    print(message, file=sys.stderr, flush=True)


# ---- reading the input ----------------------------------------------------------------------------------------


@dataclass
class Record:
    """One input text: its words and the 1-based line where it starts (the row, for Parquet)."""

    words: list[str]
    line: int


def _lines(stream, source: str) -> Iterator[tuple[int, str]]:
    return utf8_lines(stream, source)


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

        for sentence in iter_conll((text for _, text in _lines(stream, source)), source=source):
            yield Record(sentence.words, sentence.line)
        return
    if fmt in ("csv", "tsv", "jsonl"):
        yield from _table_records(stream, source, fmt, text_field, skip_empty, header)
        return
    if fmt == "parquet":  # a seekable file, not a stream of lines
        yield from _parquet_records(getattr(stream, "name", stream), source, text_field, skip_empty)
        return
    sniffed = False
    for n, text in _lines(stream, source):
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


def _parquet_records(file, source: str, column: str, skip_empty: bool) -> Iterator[Record]:
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


_GZIP_MAGIC = b"\x1f\x8b"


def open_input(input_path: str):
    """The input as a binary stream of lines; gzip-compressed input (known by its magic bytes) is decompressed."""
    if input_path == "-":
        stdin = sys.stdin.buffer if hasattr(sys.stdin.buffer, "peek") else io.BufferedReader(sys.stdin.buffer)
        return gzip.GzipFile(fileobj=stdin, mode="rb") if stdin.peek(2)[:2] == _GZIP_MAGIC else stdin
    with open(input_path, "rb") as f:
        compressed = f.read(2) == _GZIP_MAGIC
    return gzip.open(input_path, "rb") if compressed else open(input_path, "rb")


# ---- the job ----------------------------------------------------------------------------------------------------


@dataclass
class EmbedJob:
    """What to embed and how. Everything but the performance knobs (batch_tokens, threads, compile, device) is
    recorded in the manifest: a resumed run must ask for the same vectors."""

    input_path: str
    out_dir: str
    model: str = "minilm"
    fmt: str = "text"
    text_field: str = DEFAULT_TEXT_COLUMN
    header: bool | None = None  # csv / tsv: whether the first row names the columns (ctxrep.data.table's rule)
    level: str = "word"  # "word" or "sentence"
    layers: int | list[int] | str = -1
    pooling: str = "mean"
    sentence_pooling: str = DEFAULT_SENTENCE_POOLING
    shard_size: int = 2000
    storage: str = "safetensors"
    skip_empty: bool = False
    batch_tokens: int | None = None  # None: the Featurizer's default for the device
    threads: int | None = None
    quantize: str | None = None
    compile: bool | str = "auto"
    device: str | None = None
    precision: str | None = None  # None: the model's own dtype (a given "fp32" loads a bf16 checkpoint as float32)
    backend: str = "torch"
    output: str = "dense"  # "sparse": SPLADE vectors over the vocabulary (ctxrep.vectors.sparse), sentence level
    dimensions: int | None = None  # sentence vectors: the first N coordinates, renormalised (Matryoshka)
    prompt: str | None = None  # sentence vectors: text put before every text
    prompt_name: str | None = None  # sentence vectors: the model folder's prompt of that name
    extra_settings: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.shard_size < 1:
            raise ValueError(f"--shard-size must be at least 1, got {self.shard_size}")
        if self.level not in ("word", "sentence"):
            raise ValueError(f"level must be 'word' or 'sentence', got {self.level!r}")
        if self.storage not in ("safetensors", "npy"):
            raise ValueError(f"storage must be 'safetensors' or 'npy', got {self.storage!r}")
        if self.fmt not in FORMATS:
            raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {self.fmt!r}")
        if isinstance(self.layers, str) and self.layers not in ("all", "mix"):
            self.layers = parse_layers(self.layers)
        if self.output not in ("dense", "sparse"):
            raise ValueError(f"output must be 'dense' or 'sparse', got {self.output!r}")
        if self.output == "sparse" and (self.level != "sentence" or self.storage != "safetensors" or self.layers != -1):
            raise ValueError(
                "--output sparse writes one sparse vector per text from the last layer: use --level sentence, "
                "safetensors storage and the default --layers"
            )
        self._check_sentence_options()
        if self.header is not None and self.fmt not in ("csv", "tsv"):
            raise ValueError(f"--header / --no-header apply to --format csv or tsv, not {self.fmt}")
        if self.fmt in ("csv", "tsv"):  # a numbered column without --header / --no-header: refused before any work
            from ctxrep.data.table import decide_header

            decide_header(Path(self.source), self.fmt, self.header, {"--text-column": self.text_field})
        if self.fmt == "parquet" and self.input_path == "-":
            raise ValueError("--format parquet reads a file, not standard input; give --input FILE")

    def _check_sentence_options(self) -> None:
        given = [
            flag
            for flag, value in (
                ("--dimensions", self.dimensions),
                ("--prompt", self.prompt),
                ("--prompt-name", self.prompt_name),
            )
            if value is not None
        ]
        if not given:
            return
        if self.level != "sentence" or self.output != "dense":
            raise ValueError(
                f"{' / '.join(given)} apply to dense sentence vectors: add --level sentence"
                + (" and leave out --output sparse" if self.output != "dense" else "")
            )
        if self.prompt is not None and self.prompt_name is not None:
            raise ValueError("give --prompt (a text) or --prompt-name (a prompt the model folder declares), not both")
        if self.dimensions is not None and (
            isinstance(self.dimensions, bool) or not isinstance(self.dimensions, int) or self.dimensions < 1
        ):
            raise ValueError(f"--dimensions must be a positive integer, got {self.dimensions!r}")

    @property
    def source(self) -> str:
        return "<stdin>" if self.input_path == "-" else self.input_path

    def sentence_options(self) -> dict:
        """The keyword arguments of `embed_sentences` this job adds (dimensions, prompt, prompt_name), those given."""
        options = {"dimensions": self.dimensions, "prompt": self.prompt, "prompt_name": self.prompt_name}
        return {k: v for k, v in options.items() if v is not None}

    def check_prompt(self) -> None:
        """An unknown --prompt-name is a one-line ValueError naming the prompts the model folder declares, read
        from the folder without loading its weights."""
        if self.prompt_name is None:
            return
        from ctxrep.models.loading import resolve
        from ctxrep.models.sentence_transformers import read_prompts

        try:
            read_prompts(resolve(self.model).folder).resolve(None, self.prompt_name)
        except ValueError as e:
            raise ValueError(f"--prompt-name: {e}") from None

    def spec_of(self, fz) -> FeaturizerSpec:
        """The FeaturizerSpec of what this job writes with `fz`: the Featurizer's, with the dimensions and the
        prompt text (resolved from its name, or the folder's default prompt; None without one) of sentence vectors."""
        spec = FeaturizerSpec.of(fz)
        if self.level != "sentence" or self.output != "dense":
            return spec
        prompt = fz.prompts.resolve(self.prompt, self.prompt_name) or None  # None: no prompt, as a plain run
        return replace(spec, dimensions=self.dimensions, prompt=prompt)

    def settings(self) -> dict:
        """The manifest's `settings`: what decides the vectors and the shard layout."""
        settings = {
            "model": self.model,
            "format": self.fmt,
            "text_field": self.text_field,
            "level": self.level,
            "layers": layers_text(self.layers),
            "pooling": self.pooling,
            "sentence_pooling": self.sentence_pooling,
            "shard_size": self.shard_size,
            "storage": self.storage,
            "skip_empty": self.skip_empty,
            **_fingerprint(self.input_path),
        }
        if self.header is not None:  # decides which rows are texts
            settings["header"] = self.header
        if self.quantize is not None:  # changes the vectors: a resumed run must use the same setting
            settings["quantize"] = self.quantize
        if self.precision not in ("fp32", None):
            settings["precision"] = self.precision
        if self.backend not in ("torch", None):
            settings["backend"] = self.backend
        if self.output != "dense":
            settings["output"] = self.output
        for name, value in self.sentence_options().items():  # each decides the vectors
            settings[name] = value
        settings.update(self.extra_settings)
        return settings

    def featurizer(self, device: str | None = None, threads: int | None = None):
        """The Featurizer this job embeds with (on `device`, with `threads` torch threads, when given); for
        output="sparse" the SparseEncoder over it."""
        from ctxrep.featurize import Featurizer

        kwargs: dict[str, Any] = {}
        device = device if device is not None else self.device
        # the runtime options (device, precision, backend) are passed only when asked for, so that a Featurizer
        # without them still serves the default run
        if device not in (None, "cpu"):
            kwargs["device"] = device
        precision = "int8" if self.quantize == "int8" else self.precision  # the old quantize="int8" spelling
        if precision is not None:
            kwargs["precision"] = precision
        if self.backend != "torch":
            kwargs["backend"] = self.backend
        fz = Featurizer(
            self.model,
            layers=self.layers,
            pooling=self.pooling,
            sentence_pooling="mean" if self.output == "sparse" else self.sentence_pooling,  # sparse: unread
            batch_tokens=self.batch_tokens,
            num_threads=threads if threads is not None else self.threads,
            compile=self.compile,
            **kwargs,
        )
        if self.output == "sparse":  # the same interface: embed_sentences gives a (texts, vocabulary) csr_matrix
            from ctxrep.vectors.sparse import SparseEncoder

            return SparseEncoder(fz)
        self.check_width(fz)
        return fz

    def check_width(self, fz) -> None:
        """--dimensions wider than the model's sentence vectors: a one-line ValueError before any text runs."""
        if self.dimensions is not None and self.dimensions > fz.sentence_dim:
            raise ValueError(
                f"--dimensions {self.dimensions} is more than {self.model}'s {fz.sentence_dim}-wide sentence vectors "
                f"(--sentence-pooling {fz.sentence_pooling}); give at most {fz.sentence_dim}"
            )


@dataclass
class EmbedSummary:
    """What a run left in its folder."""

    out: Path
    model: str
    level: str
    texts: int
    rows: int
    row_shape: tuple[int, ...]  # the shape of one row: (dim,) or (layers, dim)
    shards: int
    resumed_shards: int = 0
    already_complete: bool = False

    def describe(self) -> str:
        """One line for the user, e.g. "wrote 7 word vectors (7 layers x 384) of minilm for 2 texts to out"."""
        if self.already_complete:
            return f"{self.out}: already complete ({self.texts} texts, {self.rows} rows); nothing to do"
        return (
            f"wrote {self.rows} {self.level} vectors ({describe_row_shape(self.row_shape)}) of {self.model} "
            f"for {self.texts} texts to {self.out}"
        )


def describe_row_shape(row_shape: tuple[int, ...] | list[int]) -> str:
    """(384,) -> "384 wide"; (7, 384) -> "7 layers x 384 wide"."""
    if len(row_shape) == 1:
        return f"{row_shape[0]} wide"
    return f"{row_shape[0]} layers x {row_shape[1]} wide"


def _fingerprint(path: str) -> dict:
    if path == "-":
        return {"input": "-"}
    st = os.stat(path)
    return {"input": str(Path(path).resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


# ---- one shard --------------------------------------------------------------------------------------------------


def embed_shard(
    fz, records: list[Record], first_text: int, level: str, options: dict | None = None
) -> tuple[np.ndarray, list[tuple]]:
    """The vectors of `records` and one index entry (text, line, word position, word) per vector row. `options`:
    keyword arguments of embed_sentences (dimensions, prompt, prompt_name; `EmbedJob.sentence_options`)."""
    words = [r.words for r in records]
    if level == "word":
        per_text = fz.embed_words(words)
        width = fz.dim
        if per_text:
            vectors = np.concatenate(per_text)
        else:
            vectors = np.zeros((0, width) if fz.single_layer else (0, len(fz.layer_indices), width), np.float32)
        index = [(first_text + t, r.line, w, word) for t, r in enumerate(records) for w, word in enumerate(r.words)]
    else:
        vectors = fz.embed_sentences(words, **(options or {}))
        index = [(first_text + t, r.line, -1, "") for t, r in enumerate(records)]
    assert len(index) == vectors.shape[0], "one index line per vector row"
    return vectors, index


def write_shard(
    fz,
    records: list[Record],
    k: int,
    first_text: int,
    level: str,
    storage: str,
    out: Path,
    options: dict | None = None,
) -> dict:
    """Embed shard `k` and write it (`write_arrays`); returns its manifest entry, with the texts the Featurizer cut
    (`with_cut`)."""
    vectors, index = embed_shard(fz, records, first_text, level, options)
    cut = [first_text + i for i in getattr(fz, "cut_texts", [])]  # a SparseEncoder keeps no record: none
    return with_cut(write_arrays(vectors, index, k, len(records), storage, out), cut, records, first_text)


def with_cut(entry: dict, cut: list[int], records: list[Record], first_text: int) -> dict:
    """A shard's manifest entry with the texts a window cut (a word longer than a whole window keeps its first
    pieces): `cut_texts` (text numbers, as the index files number them) and `cut_lines` (their input lines), when
    there are any."""
    if cut:
        entry = {**entry, "cut_texts": list(cut), "cut_lines": [records[t - first_text].line for t in cut]}
    return entry


def cut_summary(shards: list[dict]) -> dict:
    """The manifest's `cut`: how many texts the Featurizer cut in all shards, their text numbers and lines."""
    texts = [t for s in shards for t in s.get("cut_texts", [])]
    lines = [n for s in shards for n in s.get("cut_lines", [])]
    return {"count": len(texts), "texts": texts, "lines": lines}


def _shard_number(entry: dict) -> int:
    return int(entry["file"].split("-")[1].split(".")[0])


# ---- the run ----------------------------------------------------------------------------------------------------


class WorkerDied(ValueError):
    """A worker process ended without finishing its shards (killed, out of memory, crashed). A ValueError, as the
    other errors the user acts on: the message says what to run."""


def embed_corpus(
    job: EmbedJob,
    *,
    workers: int = 1,
    devices: list[str] | None = None,
    show_progress: bool = True,
    log: Callable[[str], None] = to_stderr,
) -> EmbedSummary:
    """Embed `job.input_path` into shards in `job.out_dir` (see the module docstring); resumes an unfinished run.

    workers: CPU processes, each with an equal share of the cores (`job.threads`, or all cores, divided by workers).
    devices: one process per device, e.g. ["cuda:0", "cuda:1"]; overrides `workers`. One worker (the default) runs
    in this process. Every worker embeds whole shards; the folder is the same as one process's.
    """
    placements = _placements(job, workers, devices)  # bad options fail before the folder is touched
    job.check_prompt()  # an unknown --prompt-name: before any model loads
    job = choose_precision(job, placements[0][0], log)
    run = open_run(job, log)
    if isinstance(run, EmbedSummary):
        return run
    bar, stream, records = open_records(job, show_progress, log)
    run.bar = bar
    try:
        run.say_resuming()
        shards = shards_of(records, job.shard_size)
        if len(placements) == 1:
            run.in_process(shards, *placements[0])
        else:
            run.in_workers(shards, placements)
    except BaseException:
        bar.disable = True  # the error message is the last word, not a progress line
        raise
    finally:
        bar.close()
        if stream is not None:
            stream.close()
    return run.finish()


def choose_precision(job: EmbedJob, device: str | None, log: Callable[[str], None] = to_stderr) -> EmbedJob:
    """`job` with precision "auto" replaced by the precision it chooses on `device` (the Featurizer's rule,
    `runtime.hardware.auto_precision`), so that the manifest records what ran; says the choice in one line, and one
    more where the precision runs slower than float32 on this hardware (`hardware.slower_than_fp32`)."""
    import torch

    from ctxrep.runtime import hardware, parse_device, runtime_class

    where = parse_device(device) or torch.device("cpu")
    chosen = job.precision
    if job.precision == "auto":
        chosen = hardware.auto_precision(where, runtime_class(job.backend).precisions)
        why = "native bfloat16 on this device" if chosen == "bf16" else "no native bfloat16 on this device"
        log(f"precision: {chosen} (auto: {why})")
    slow = hardware.slower_than_fp32(where, job.backend, chosen)
    if slow:
        log(f"note: {slow}")
    return replace(job, precision=chosen) if chosen != job.precision else job


def open_records(job: EmbedJob, show_progress: bool = True, log: Callable[[str], None] = to_stderr):
    """(progress display, the stream to close or None, the lazy records) of the job's input. The progress counts the
    bytes read (rows for Parquet)."""
    if job.fmt == "parquet":
        rows = _parquet_rows(job.input_path)
        bar = progress(total=rows, unit="rows", desc="embed", enabled=show_progress)
        with open(job.input_path, "rb") as f:
            if f.read(4) != b"PAR1":
                raise ValueError(f"{job.source}: not a Parquet file (no PAR1 magic); check --format")
        return (
            bar,
            None,
            _counting_records(_parquet_records(job.input_path, job.source, job.text_field, job.skip_empty), bar),
        )
    stream = open_input(job.input_path)
    total = None
    if job.input_path != "-" and not isinstance(stream, gzip.GzipFile):
        total = os.path.getsize(job.input_path)
    bar = progress(total=total, unit="B", unit_scale=True, desc="embed", enabled=show_progress)
    records = read_records(_counting(stream, bar), job.source, job.fmt, job.text_field, job.skip_empty, log, job.header)
    return bar, (stream if job.input_path != "-" else None), records


def _parquet_rows(path: str) -> int | None:
    try:
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows
    except Exception:  # reported with its line by _parquet_records
        return None


def _counting_records(records: Iterator[Record], bar) -> Iterator[Record]:
    last = 0
    for record in records:
        bar.update(record.line - last)
        last = record.line
        yield record


def open_run(job: EmbedJob, log: Callable[[str], None] = to_stderr) -> _Run | EmbedSummary:
    """The bookkeeping of a run into `job.out_dir`: the shards an earlier run with the same settings completed (a
    different run's folder is refused), or the summary of a complete folder."""
    out = Path(job.out_dir)
    settings = job.settings()
    manifest_file = out / MANIFEST
    done: dict[int, dict] = {}
    spec = None  # what the shards already written hold (a resumed run must add the same)
    manifest = read_manifest(out)
    if manifest is not None:
        if manifest["settings"] != settings:
            keys = set(settings) | set(manifest["settings"])
            changed = sorted(k for k in keys if manifest["settings"].get(k) != settings.get(k))
            raise ValueError(
                f"{out} holds the output of a different run (differs in: {', '.join(changed)}); "
                "use another --out directory or delete this one"
            )
        if manifest.get("complete"):
            return EmbedSummary(
                out,
                job.model,
                job.level,
                manifest["texts"],
                manifest["rows"],
                tuple(manifest.get("row_shape") or [manifest["dim"]]),
                len(manifest["shards"]),
                already_complete=True,
            )
        done = {_shard_number(s): s for s in manifest["shards"]}
        spec = FeaturizerSpec.from_dict(manifest["spec"], str(manifest_file)) if "spec" in manifest else None
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("*.tmp"):  # what a killed run left half-written (the manifest's own .tmp included)
        stale.unlink(missing_ok=True)
    return _Run(job, out, manifest_file, settings, done, log, spec)


def _placements(job: EmbedJob, workers: int, devices: list[str] | None) -> list[tuple[str | None, int | None]]:
    """(device, torch threads) for each worker."""
    if devices:
        return [(d, job.threads) for d in devices]
    if workers < 1:
        raise ValueError(f"--workers must be at least 1, got {workers}")
    if workers == 1:
        return [(job.device, job.threads)]
    cores = job.threads or os.cpu_count() or 1
    return [(job.device, max(1, cores // workers))] * workers


def expand_devices(value: str) -> list[str]:
    """--devices "cuda:0,cuda:1" or "all" (every visible GPU) as a list of device names."""
    if value.strip() == "all":
        import torch

        n = torch.cuda.device_count()
        if n == 0:
            raise ValueError("--devices all: no CUDA device is visible; use --workers N to run N CPU processes")
        return [f"cuda:{i}" for i in range(n)]
    devices = [d.strip() for d in value.split(",") if d.strip()]
    if not devices:
        raise ValueError(f"--devices {value!r}: give device names separated by commas (cuda:0,cuda:1) or 'all'")
    if len(set(devices)) != len(devices):
        raise ValueError(f"--devices {value!r} names a device twice; use --workers for several CPU processes")
    return devices


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


def _counting(stream, bar) -> Iterator[bytes]:
    for raw in stream:
        bar.update(len(raw))
        yield raw


class _Run:
    """The manifest's bookkeeping for one run (only the process that reads the input writes it)."""

    def __init__(
        self, job: EmbedJob, out: Path, manifest_file: Path, settings: dict, done: dict, log, spec=None
    ) -> None:
        self.job, self.out, self.manifest_file, self.settings, self.log = job, out, manifest_file, settings, log
        self.spec: FeaturizerSpec | None = spec
        self.done = dict(done)
        self.resumed = len(done)
        self.seen = 0  # shards in the input
        self.texts = 0
        self.row_shape: tuple[int, ...] | None = None
        self.bar = None

    def say_resuming(self) -> None:
        if self.done:
            kept = sum(s["texts"] for s in self.done.values())
            self.log(f"resuming after {kept} texts in {len(self.done)} complete shards")

    def record(self, k: int, entry: dict, row_shape: tuple[int, ...], spec: FeaturizerSpec | None = None) -> None:
        if spec is not None:
            if self.spec is not None and spec != self.spec:  # e.g. the Hub model changed between runs
                self.spec.check(spec, str(self.out), "use another --out folder, or delete this one")
            self.spec = spec
        self.done[k] = entry
        self.row_shape = tuple(row_shape)
        self._write(complete=False)
        if self.bar is not None:
            self.bar.set_postfix_str(
                f"{sum(s['texts'] for s in self.done.values()):,} texts in {len(self.done)} shards"
            )

    def _write(self, complete: bool) -> None:
        shards = [self.done[k] for k in sorted(self.done)]
        extra = {"cut": cut_summary(shards)}
        write_manifest(self.out, self.settings, shards, self.row_shape, complete, self.spec, extra)

    def in_process(self, shards, device: str | None, threads: int | None) -> None:
        job = self.job
        fz = job.featurizer(device, threads)
        self.row_shape = vector_row_shape(fz, job.level, job.dimensions)
        spec = job.spec_of(fz)
        options = job.sentence_options()
        for k, first, records in shards:
            self.seen = k + 1
            if k in self.done:
                continue
            entry = write_shard(fz, records, k, first, job.level, job.storage, self.out, options)
            self.record(k, entry, self.row_shape, spec)

    def in_workers(self, shards, placements: list[tuple[str | None, int | None]]) -> None:
        import torch.multiprocessing as mp

        ctx = mp.get_context("spawn")  # a fresh interpreter: no forked torch thread pools or CUDA state
        tasks = ctx.Queue(maxsize=len(placements))  # bounded: at most one shard waits per worker
        results = ctx.Queue()
        procs = [
            ctx.Process(
                target=_worker, args=(self.job, device, threads, tasks, results, i), daemon=True, name=f"embed-{i}"
            )
            for i, (device, threads) in enumerate(placements)
        ]
        with _main_not_reimported():
            for p in procs:
                p.start()
        where = ", ".join(f"{d or 'cpu'} x {t or 'default'} threads" for d, t in placements)
        self.log(f"embedding with {len(procs)} worker processes ({where})")
        pending: dict[int, int] = {}  # shard -> worker (once known)
        finished = False
        try:
            for k, first, records in shards:
                self.seen = k + 1
                if k in self.done:
                    continue
                pending[k] = -1
                while True:
                    try:
                        tasks.put((k, first, records), timeout=0.2)
                        break
                    except queue.Full:
                        self._collect(results, procs, pending, wait=0.0)
                self._collect(results, procs, pending, wait=0.0)
            for _ in procs:
                while True:
                    try:
                        tasks.put(None, timeout=0.2)
                        break
                    except queue.Full:
                        self._collect(results, procs, pending, wait=0.0)
            while pending:
                self._collect(results, procs, pending, wait=0.5)
            for p in procs:
                p.join(timeout=30)
            finished = True
        finally:
            if not finished:
                for p in procs:
                    if p.is_alive():
                        p.terminate()
                for p in procs:
                    p.join(timeout=10)
            tasks.cancel_join_thread()
            results.cancel_join_thread()

    def _collect(self, results, procs, pending: dict[int, int], wait: float) -> None:
        """Take the workers' reports; a worker's error or death stops the run (the manifest keeps what is done)."""
        deadline = time.monotonic() + wait
        while True:
            try:
                kind, k, worker, payload = results.get(timeout=max(0.0, deadline - time.monotonic()) or 0.01)
            except queue.Empty:
                break
            if kind == "started":
                pending[k] = worker
            elif kind == "done":
                entry, row_shape, spec = payload
                pending.pop(k, None)
                self.record(k, entry, row_shape, FeaturizerSpec.from_dict(spec))
            elif kind == "error":
                where = f" while embedding shard {k}" if k >= 0 else ""
                raise ValueError(f"worker {worker}{where}: {payload}")
        for i, p in enumerate(procs):
            if p.exitcode is not None and p.exitcode != 0:
                lost = sorted(k for k, w in pending.items() if w == i)
                how = f"was killed by signal {-p.exitcode}" if p.exitcode < 0 else f"exited with status {p.exitcode}"
                raise WorkerDied(
                    f"worker {i} (pid {p.pid}) {how}"
                    + (f" while embedding shard {', '.join(map(str, lost))}" if lost else "")
                    + f"; the {len(self.done)} complete shards are kept: run the same command again to finish"
                )

    def finish(self) -> EmbedSummary:
        texts = sum(s["texts"] for s in self.done.values())
        if self.seen == 0:
            empty = "all its texts were empty and skipped" if self.job.skip_empty else "it holds no texts"
            self.log(f"warning: {self.job.source}: nothing to embed: {empty}; check the input file and --format")
        if self.row_shape is None:  # nothing embedded in this run: every shard was already done, or no input
            self.row_shape = tuple(self._row_shape_without_model())
        missing = [k for k in range(self.seen) if k not in self.done]
        if missing:  # cannot happen unless a worker lost a shard silently: never mark such a run complete
            raise WorkerDied(f"shards {missing} were not written; run the same command again to finish")
        self._write(complete=True)
        cut = cut_summary(list(self.done.values()))["count"]
        if cut:
            self.log(
                f"note: {cut} text{'s' if cut != 1 else ''} cut: a word longer than a whole window of {self.job.model} "
                f'keeps its first pieces; their text numbers and lines are in {self.manifest_file}\'s "cut"'
            )
        rows = sum(s["rows"] for s in self.done.values())
        return EmbedSummary(
            self.out, self.job.model, self.job.level, texts, rows, self.row_shape, len(self.done), self.resumed
        )

    def _row_shape_without_model(self) -> tuple[int, ...]:
        old = read_manifest(self.out)
        if old is not None:
            if old.get("row_shape"):
                return tuple(old["row_shape"])
        return vector_row_shape(self.job.featurizer(), self.job.level, self.job.dimensions)


def vector_row_shape(fz, level: str, dimensions: int | None = None) -> tuple[int, ...]:
    """The shape of one vector row: (dim,) for one layer or a mix, (layers, dim) for several layers; dim is
    `dimensions` where sentence vectors are truncated."""
    dim = fz.sentence_dim if level == "sentence" else fz.dim
    dim = dimensions if dimensions is not None and level == "sentence" else dim
    return (dim,) if fz.single_layer else (len(fz.layer_indices), dim)


@contextlib.contextmanager
def _main_not_reimported():
    """Start spawned workers without re-running the caller's script in them: a spawned child imports the parent's
    __main__ (by name or path) unless it has neither, and a script without an `if __name__ == "__main__":` guard
    would start the whole job again in every worker. The workers need nothing from __main__ (their target and
    arguments live in ctxrep), so __spec__ and __file__ are hidden while they start."""
    main = sys.modules.get("__main__")
    saved = {k: main.__dict__[k] for k in ("__spec__", "__file__") if main is not None and k in main.__dict__}
    try:
        if main is not None:
            main.__dict__.pop("__file__", None)
            main.__dict__["__spec__"] = None
        yield
    finally:
        if main is not None:
            main.__dict__.pop("__spec__", None)
            main.__dict__.update(saved)


def _die_with_parent() -> None:
    """Linux: this process gets SIGKILL when the process that started it dies (even by kill -9), so no orphan
    keeps writing shards beside a rerun."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _worker(job: EmbedJob, device, threads, tasks, results, worker: int) -> None:
    """A worker process: load the model once, then embed whole shards until told to stop (None)."""
    _die_with_parent()
    try:
        fz = job.featurizer(device, threads)
        row_shape = vector_row_shape(fz, job.level, job.dimensions)
        spec = job.spec_of(fz).to_dict()
    except Exception as e:
        results.put(("error", -1, worker, f"{type(e).__name__}: {e}"))
        return
    out = Path(job.out_dir)
    while True:
        task = tasks.get()
        if task is None:
            return
        k, first, records = task
        results.put(("started", k, worker, None))
        try:
            entry = write_shard(fz, records, k, first, job.level, job.storage, out, job.sentence_options())
        except Exception as e:
            results.put(("error", k, worker, f"{type(e).__name__}: {e}"))
            return
        results.put(("done", k, worker, (entry, row_shape, spec)))


# ---- reading back (tests and small scripts; ctxrep.load_vectors maps the shards instead) --------------------------


def load_shards(out_dir: str | os.PathLike) -> tuple[np.ndarray, list[dict]]:
    """All vectors and index rows (as dicts) of an `ctxrep embed` output folder, in memory, through
    `ctxrep.load_vectors` (the reader for users: it maps the shards instead); for tests and small outputs."""
    from ctxrep.vectors.store import load_vectors

    vectors = load_vectors(out_dir)
    index = vectors.index()
    rows = [
        {"text": int(t), "line": int(line), "word": int(w), "token": token}
        for t, line, w, token in zip(index.text, index.line, index.word, index.token)
    ]
    return vectors.array, rows


__all__ = [
    "EmbedJob",
    "EmbedSummary",
    "Record",
    "WorkerDied",
    "embed_corpus",
    "cut_summary",
    "embed_shard",
    "expand_devices",
    "load_shards",
    "open_input",
    "read_records",
    "write_shard",
]
