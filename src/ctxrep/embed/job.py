"""An embedding job: what to read (`EmbedInput`), where the shards go (`ShardFolder`), what to write (one output
variant: `WordVectors`, `SentenceVectors`, `SparseVectors`, ctxrep.embed.outputs) and with which model (`EmbedJob`);
what the run left (`EmbedSummary`).

    job = EmbedJob("corpus.csv", "out/", vectors=SentenceVectors(dimensions=256), model="minilm")
    job = EmbedJob(EmbedInput("-", format="jsonl", text_column="body"), ShardFolder("out/", shard_size=500))
    job.settings()       # the manifest's record of the input and the shard layout
    job.featurizer()     # what it embeds with: the Featurizer (or the SparseEncoder over it)

The flat keywords of the EmbedJob before issue 40 (`EmbedJob(path, out, level="sentence", shard_size=500,
dimensions=256, ...)`) still work until 0.3, with a DeprecationWarning, and so do reads of the old attributes.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ctxrep.embed.outputs import (
    STORAGES,
    VARIANTS,
    OutputVectors,
    SparseVectors,
    WordVectors,
    vectors_of,
)
from ctxrep.embed.records import DEFAULT_TEXT_COLUMN, FORMATS, to_stderr
from ctxrep.featurize.spec import DEFAULT_SENTENCE_POOLING, parse_layers

COLUMN_FORMATS = ("jsonl", "csv", "tsv", "parquet")  # the formats whose texts are in a named or numbered column


@dataclass
class EmbedInput:
    """What to read: `path` (or "-", standard input) in `format` (text, jsonl, csv, tsv, conll, parquet; None: from
    the file name as ctxrep.data.table.detect_format reads it, .csv / .tsv / .jsonl / .conll with or without .gz,
    else text), its texts in `text_column` (jsonl, csv, tsv, parquet: a name, or a number counted from 1),
    `header`: whether a CSV / TSV file's first row names the columns (None: ctxrep.data.table's rule), `skip_empty`:
    skip empty texts instead of stopping, `allow_empty`: an input with no text to embed writes an empty folder
    (with a warning) instead of stopping with an error, as every ctxrep command stops on an empty input."""

    path: str
    format: str | None = None
    text_column: str = DEFAULT_TEXT_COLUMN
    header: bool | None = None
    skip_empty: bool = False
    allow_empty: bool = False

    def __post_init__(self) -> None:
        from ctxrep.data.table import decide_header, detect_format

        self.path = os.fspath(self.path)
        if self.format is None:  # the file name's, as index build and finetune read it; standard input: text
            self.format = detect_format(self.path, None, default="text")
        if self.format not in FORMATS:
            raise ValueError(f"--format must be one of {', '.join(FORMATS)}, got {self.format!r}")
        if self.text_column != DEFAULT_TEXT_COLUMN and self.format not in COLUMN_FORMATS:
            raise ValueError(
                f"--text-column applies to --format {', '.join(COLUMN_FORMATS[:-1])} or {COLUMN_FORMATS[-1]}, not "
                f"{self.format}; add --format"
            )
        if self.header is not None and self.format not in ("csv", "tsv"):
            raise ValueError(f"--header / --no-header apply to --format csv or tsv, not {self.format}")
        if self.format in ("csv", "tsv"):  # a numbered column without --header / --no-header: refused before any work
            decide_header(Path(self.source), self.format, self.header, {"--text-column": self.text_column})
        if self.format == "parquet" and self.path == "-":
            raise ValueError("--format parquet reads a file, not standard input; give --input FILE")

    @property
    def source(self) -> str:
        """The input's name in messages: the path, or <stdin>."""
        return "<stdin>" if self.path == "-" else self.path


@dataclass
class ShardFolder:
    """Where the shards go: the folder `path`, `shard_size` texts a shard, each a `storage` file: the shard format,
    safetensors or npy (`ctxrep embed --shard-format`)."""

    path: str
    shard_size: int = 2000
    storage: str = "safetensors"

    def __post_init__(self) -> None:
        self.path = os.fspath(self.path)
        if isinstance(self.shard_size, bool) or not isinstance(self.shard_size, int) or self.shard_size < 1:
            raise ValueError(f"--shard-size must be at least 1, got {self.shard_size}")
        if self.storage not in STORAGES:
            raise ValueError(f"--shard-format must be one of {', '.join(STORAGES)}, got {self.storage!r}")


COMMIT_ROWS = 20_000  # rows gathered into one store write (and one resume point)


@dataclass
class StoreTable:
    """Where a job's vectors go instead of a shard folder: the table at `uri` (ctxrep.stores: lancedb:DIR/TABLE,
    postgresql://.../DB?table=T, qdrant://HOST:PORT/C or qdrant:DIR/C, chroma:DIR/C); `shard_size` texts a shard
    (the unit of embedding and resuming, as in a folder); `with_text`: keep each text beside its vectors;
    `commit_rows`: rows gathered into one write. The address is parsed here: an unknown scheme is refused at once."""

    uri: str
    shard_size: int = 2000
    with_text: bool = True
    commit_rows: int = COMMIT_ROWS

    def __post_init__(self) -> None:
        from ctxrep.stores import parse

        parse(self.uri)
        if isinstance(self.shard_size, bool) or not isinstance(self.shard_size, int) or self.shard_size < 1:
            raise ValueError(f"--shard-size must be at least 1, got {self.shard_size}")
        if self.commit_rows < 1:
            raise ValueError(f"commit_rows must be at least 1, got {self.commit_rows}")

    @property
    def path(self) -> str:
        """The address as messages show it (credentials replaced by ***)."""
        from ctxrep.stores import parse

        return parse(self.uri).shown

    def __repr__(self) -> str:  # never the credentials
        return (
            f"StoreTable({self.path!r}, shard_size={self.shard_size}, with_text={self.with_text}, "
            f"commit_rows={self.commit_rows})"
        )


@dataclass(init=False)
class EmbedJob:
    """What to embed and how. Everything but the performance knobs (batch_tokens, threads, compile, device) is
    recorded in the manifest (the input and the layout in `settings()`, the vectors in `vectors.spec(featurizer)`):
    a resumed run must ask for the same.

    input / out: an EmbedInput / ShardFolder (or a StoreTable: the vectors go to a store's table), or a path for one
    with the defaults. vectors: what is written (default
    WordVectors()). model: a packaged name, a folder or a Hub name; device, precision (None: the model's own dtype;
    "fp32" loads a bf16 checkpoint as float32; "auto"), backend: how it runs; quantize="int8": the old spelling of
    precision="int8"."""

    input: EmbedInput
    out: ShardFolder | StoreTable
    vectors: OutputVectors
    model: str
    batch_tokens: int | None  # None: the Featurizer's default for the device
    threads: int | None
    compile: bool | str
    device: str | None
    precision: str | None
    backend: str
    quantize: str | None
    extra_settings: dict = field(default_factory=dict)

    def __init__(
        self,
        input: EmbedInput | str | os.PathLike | None = None,
        out: ShardFolder | StoreTable | str | os.PathLike | None = None,
        *,
        vectors: OutputVectors | None = None,
        model: str = "minilm",
        batch_tokens: int | None = None,
        threads: int | None = None,
        compile: bool | str = "auto",
        device: str | None = None,
        precision: str | None = None,
        backend: str = "torch",
        quantize: str | None = None,
        extra_settings: dict | None = None,
        **flat: Any,
    ) -> None:
        if flat:  # the keywords of the flat EmbedJob before issue 40
            input, out, vectors = _from_flat(input, out, vectors, flat)
        if input is None or out is None:
            raise TypeError("EmbedJob needs an input and an output folder: EmbedJob(input, out, ...)")
        self.input = input if isinstance(input, EmbedInput) else EmbedInput(input)
        self.out = out if isinstance(out, (ShardFolder, StoreTable)) else ShardFolder(out)
        self.vectors = WordVectors() if vectors is None else vectors
        if not isinstance(self.vectors, tuple(VARIANTS.values())):
            raise TypeError(
                f"vectors must be WordVectors, SentenceVectors or SparseVectors, got {type(self.vectors).__name__}"
            )
        self.model, self.batch_tokens, self.threads, self.compile = model, batch_tokens, threads, compile
        self.device, self.precision, self.backend, self.quantize = device, precision, backend, quantize
        self.extra_settings = dict(extra_settings or {})
        if isinstance(self.out, ShardFolder) and self.out.storage not in self.vectors.storages:
            raise ValueError(
                f"{self.vectors.flag} writes {' or '.join(self.vectors.storages)} shards: leave out --shard-format "
                f"{self.out.storage}"
            )

    def __getattr__(self, name: str) -> Any:
        """The attributes of the flat EmbedJob (job.level, job.shard_size, ...): deprecated, gone in 0.3."""
        read = _FLAT_READS.get(name)
        if read is None or name.startswith("__"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        new, get = read
        warnings.warn(
            f"EmbedJob.{name} is deprecated: read job.{new}; removed in 0.3", DeprecationWarning, stacklevel=2
        )
        return get(self)

    def settings(self) -> dict:
        """The manifest's `settings`: what decides which texts are read and how the shards are laid out (the input
        and its fingerprint, format, column, header, level, shard size, storage; chunks and the output precision,
        which decide what a row is and how it is stored). What decides the vectors themselves (model, layers,
        pooling, precision, ...) is the manifest's `spec` (`vectors.spec`), recorded once, not here."""
        settings = {
            "format": self.input.format,
            "text_field": self.input.text_column,
            "level": self.vectors.level,
            "shard_size": self.out.shard_size,
            "skip_empty": self.input.skip_empty,
            **_fingerprint(self.input.path),
        }
        if isinstance(self.out, ShardFolder):  # the shard files' format (a store has its own)
            settings["storage"] = self.out.storage
        if self.input.header is not None:  # decides which rows are texts
            settings["header"] = self.input.header
        settings.update(self.vectors.settings())
        settings.update(self.extra_settings)
        return settings

    def featurizer(self, device: str | None = None, threads: int | None = None):
        """What this job embeds with (on `device`, with `threads` torch threads, when given): the Featurizer with the
        options of `vectors`, or what they build over it (`vectors.encoder`: SparseVectors' SparseEncoder)."""
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
            **self.vectors.featurizer_options(),
            batch_tokens=self.batch_tokens,
            num_threads=threads if threads is not None else self.threads,
            compile=self.compile,
            **kwargs,
        )
        return self.vectors.encoder(fz, self.model)


# ---- the flat EmbedJob before issue 40 (deprecated, removed in 0.3) -------------------------------------------------

# its keywords: where each lives now (the vector options with their old defaults)
_FLAT_INPUT = {"input_path": "path", "fmt": "format", "text_field": "text_column", "header": "header",
               "skip_empty": "skip_empty"}  # fmt: skip
_FLAT_OUT = {"out_dir": "path", "shard_size": "shard_size", "storage": "storage"}
_FLAT_VECTORS = {"level": "word", "output": "dense", "layers": -1, "pooling": "mean",
                 "sentence_pooling": DEFAULT_SENTENCE_POOLING, "dimensions": None, "prompt": None, "prompt_name": None,
                 "output_precision": "float32", "calibration": None, "chunks": None, "late_chunking": True}  # fmt: skip


def _from_flat(input, out, vectors, flat: dict) -> tuple:
    """(input, out, vectors) of the flat keywords, with a DeprecationWarning naming the new spelling."""
    unknown = sorted(set(flat) - set(_FLAT_INPUT) - set(_FLAT_OUT) - set(_FLAT_VECTORS))
    if unknown:
        raise TypeError(f"EmbedJob() got an unexpected keyword argument {unknown[0]!r}")
    warnings.warn(
        f"EmbedJob({', '.join(f'{k}=' for k in flat)}) is deprecated: give EmbedJob(EmbedInput(path, format=, "
        "text_column=, header=, skip_empty=), ShardFolder(path, shard_size=, storage=), vectors=WordVectors(...) | "
        "SentenceVectors(...) | SparseVectors(), model=...) (ctxrep.embed.corpus); the flat keywords go in 0.3",
        DeprecationWarning,
        stacklevel=3,
    )
    input = _group(input, EmbedInput, _FLAT_INPUT, flat)
    out = _group(out, ShardFolder, _FLAT_OUT, flat)
    given = {k: flat[k] for k in _FLAT_VECTORS if k in flat}
    if given and vectors is not None:
        raise TypeError(f"give {', '.join(given)} in `vectors`, not beside it")
    if vectors is None:
        level, output = given.pop("level", "word"), given.pop("output", "dense")
        if isinstance(given.get("layers"), str) and given["layers"] not in ("all", "mix"):
            given["layers"] = parse_layers(given["layers"])
        unread = getattr(VARIANTS.get((level, output)), "unread", ())  # what the flat job took and did not read
        options = {k: v for k, v in given.items() if v != _FLAT_VECTORS[k] and k not in unread}
        vectors = vectors_of(level, output, options)
    return input, out, vectors


def _group(value, cls, names: dict[str, str], flat: dict):
    """`value` (a `cls`, a path or None) with the flat keywords `names` lists filled in."""
    given = {new: flat[old] for old, new in names.items() if old in flat}
    if not given:
        return value
    if isinstance(value, cls) or ("path" in given and value is not None):
        raise TypeError(
            f"give {', '.join(k for k in names if k in flat)} in one place: {cls.__name__}(...) or keywords"
        )
    given.setdefault("path", value)
    return cls(**given)


def _vector_option(name: str, default: Any) -> tuple[str, Callable]:
    return f"vectors.{name}", lambda job: getattr(job.vectors, name, default)


# its attributes: (the new name, how to read it)
_FLAT_READS: dict[str, tuple[str, Callable[[EmbedJob], Any]]] = {
    **{old: (f"input.{new}", lambda job, new=new: getattr(job.input, new)) for old, new in _FLAT_INPUT.items()},
    **{old: (f"out.{new}", lambda job, new=new: getattr(job.out, new)) for old, new in _FLAT_OUT.items()},
    "source": ("input.source", lambda job: job.input.source),
    "level": ("vectors.level", lambda job: job.vectors.level),
    "output": ("vectors (SparseVectors)", lambda job: "sparse" if isinstance(job.vectors, SparseVectors) else "dense"),
    **{k: _vector_option(k, d) for k, d in _FLAT_VECTORS.items() if k not in ("level", "output")},
}


@dataclass
class EmbedSummary:
    """What a run left in its folder."""

    out: Path | str  # the folder, or the store's address (credentials hidden)
    model: str
    level: str
    texts: int
    rows: int
    row_shape: tuple[int, ...]  # the shape of one row: (dim,) or (layers, dim)
    shards: int
    resumed_shards: int = 0
    already_complete: bool = False
    precision: str = "float32"  # --output-precision: what the rows hold
    dim: int | None = None  # the vectors' width where rows are stored narrower (binary codes)

    def describe(self) -> str:
        """One line for the user, e.g. "wrote 7 word vectors (7 layers x 384) of minilm for 2 texts to out"."""
        if self.already_complete:
            return f"{self.out}: already complete ({self.texts} texts, {self.rows} rows); nothing to do"
        shape = describe_row_shape(self.row_shape)
        if self.precision in ("binary", "ubinary"):
            shape = f"{self.dim} wide as {self.precision} codes, {self.row_shape[-1]} bytes a row"
        elif self.precision != "float32":
            shape += f" {self.precision} codes"
        return f"wrote {self.rows} {self.level} vectors ({shape}) of {self.model} for {self.texts} texts to {self.out}"


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
