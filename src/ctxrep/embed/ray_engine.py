"""Embedding on a Ray cluster with Ray Data (the optional extra `ctxrep[ray]`).

Two ways in:

1. `RayEmbedder`, a callable class for `ray.data.Dataset.map_batches`: each actor loads the model once and turns a
   batch of texts into Arrow columns (sentence vectors, or per-word vectors with their words), with every Featurizer
   option. Use it in your own pipeline:

       import ray
       from ctxrep.embed.ray_engine import RayEmbedder
       ds = ray.data.read_parquet("s3://bucket/texts/")
       ds = ds.map_batches(RayEmbedder, fn_constructor_kwargs={"model": "minilm", "level": "sentence"},
                           batch_format="pyarrow", batch_size=256, concurrency=8, num_gpus=1)
       ds.write_parquet("s3://bucket/vectors/")

2. `ctxrep embed --engine ray [--ray-address ADDR]` (`embed_with_ray`): ctxrep reads the input (text, JSONL, CSV,
   TSV, CoNLL, Parquet) on the driver, cuts it into the shards one process would write, hands them to Ray Data as
   Arrow blocks (words, text number, line), and writes the vectors that come back, in input order, as ctxrep's
   shards: the same folder, index and manifest as `ctxrep embed` without Ray (`ctxrep.load_vectors` reads it), and
   resumable the same way. Ray restarts an actor that dies and retries its batch; the driver checks that every text
   comes back exactly once, in order, before it writes a shard.

Columns `RayEmbedder` adds (float32):
  level="sentence": `vector`   fixed_size_list<float, dim>           (or <<float, dim>, layers> for several layers)
  level="word":     `words`    list<string>, and
                    `vectors`  list<fixed_size_list<float, dim>>     one entry per word (a layer axis likewise)
  both:             `cut`      bool: a window cut the text (a word longer than a whole window kept its first pieces)

Ray's own output (its core's log lines, Ray Data's progress logs) goes to a file, OUT/ray.log by default
(`ray_log`), unless `ray_verbose`; ctxrep's own lines stay on the terminal.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ctxrep.embed.corpus import open_records
from ctxrep.embed.job import EmbedJob, EmbedSummary, choose_precision
from ctxrep.embed.outputs import VARIANTS, SentenceVectors, WordVectors, vectors_of
from ctxrep.embed.records import Record, shards_of, to_stderr
from ctxrep.embed.run import open_run
from ctxrep.embed.shards import with_cut
from ctxrep.featurize.spec import DEFAULT_SENTENCE_POOLING
from ctxrep.util.network import why_unreachable
from ctxrep.vectors.store import write_arrays

# Shards the driver holds and sends through the actor pool at a time (64 x 2,000 texts by default): a corpus of any
# size streams through in runs of this many, each its own Ray Data execution.
SHARDS_PER_RUN = 64


def _require_ray():
    try:
        import ray  # noqa: F401
        import ray.data  # noqa: F401
    except ImportError:
        raise ValueError(
            "--engine ray needs Ray Data: pip install 'ctxrep[ray]' (or pip install 'ray[data]')"
        ) from None
    return sys.modules["ray"]


def unreachable(address: str, timeout: float = 5.0) -> str | None:
    """Why no TCP connection opens to `address`'s host:port ("host:6379", "ray://host:10001") within `timeout`
    seconds, or None (it opens, or the address names no port: "auto"). Ray itself retries an unreachable address
    for minutes, printing a warning every few seconds."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return None
    return why_unreachable(host, int(port), timeout)


def _fixed_lists(values: np.ndarray):
    """A float32 array (n, *shape) as an Arrow array of n nested fixed-size lists (innermost: the last axis)."""
    import pyarrow as pa

    values = np.ascontiguousarray(values, dtype=np.float32)
    array = pa.array(values.reshape(-1))
    for size in reversed(values.shape[1:]):
        array = pa.FixedSizeListArray.from_arrays(array, size)
    return array


def arrow_to_numpy(column, row_shape: tuple[int, ...]) -> np.ndarray:
    """The inverse of `_fixed_lists` for a (chunked) column of nested fixed-size lists: (n, *row_shape) float32."""
    import pyarrow as pa

    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    flat = column
    for _ in row_shape:
        flat = flat.flatten()
    return np.asarray(flat.to_numpy(zero_copy_only=False), dtype=np.float32).reshape(len(column), *row_shape)


class RayEmbedder:
    """A callable class for `Dataset.map_batches(RayEmbedder, fn_constructor_kwargs={...}, batch_format="pyarrow")`.

    The model is loaded once, when Ray starts the actor. Each call embeds the batch's `text_column` (strings, split
    on whitespace, or lists of words) and returns the batch with the vector columns added (module docstring).
    Options are the Featurizer's (model, layers, pooling, sentence_pooling, normalize, stride, max_length,
    batch_tokens, precision, backend, compile) plus `level` ("sentence" or "word"), `threads` (torch threads) and
    `device` (default: "cuda" when Ray gave the actor a GPU, `num_gpus=1`, else the CPU); sentence vectors also
    take embed_sentences' `dimensions`, `prompt` and `prompt_name`.
    """

    def __init__(
        self,
        model: str = "minilm",
        *,
        level: str = "sentence",
        text_column: str = "text",
        layers: int | list[int] | str = -1,
        pooling: str = "mean",
        sentence_pooling: str = DEFAULT_SENTENCE_POOLING,
        normalize: bool = False,
        stride: int | None = None,
        max_length: int | None = None,
        batch_tokens: int | None = None,
        threads: int | None = None,
        device: str | None = None,
        precision: str | None = None,
        backend: str = "torch",
        compile: bool | str = "auto",
        dimensions: int | None = None,
        prompt: str | None = None,
        prompt_name: str | None = None,
    ) -> None:
        from ctxrep.featurize import Featurizer

        if level not in ARROW_LAYOUTS:
            raise ValueError(f"level must be 'sentence' or 'word', got {level!r}")
        options = {"layers": layers, "pooling": pooling, "sentence_pooling": sentence_pooling,
                   "dimensions": dimensions, "prompt": prompt, "prompt_name": prompt_name}  # fmt: skip
        unread = VARIANTS[level, "dense"].unread  # word vectors: the sentence pooling, taken and never read
        self.vectors = vectors_of(
            level, "dense", {k: v for k, v in options.items() if v is not None and k not in unread}
        )
        self.sentence_options = self.vectors.embed_options()
        self.layout = ARROW_LAYOUTS[level]
        if device is None:
            device = "cuda" if _actor_has_gpu() else None
        kwargs: dict[str, Any] = {}
        if normalize:
            kwargs["normalize"] = True
        self.featurizer = Featurizer(
            model,
            **self.vectors.featurizer_options(),
            stride=stride,
            max_length=max_length,
            batch_tokens=batch_tokens,
            num_threads=threads,
            compile=compile,
            device=device,
            precision=precision,
            backend=backend,
            **kwargs,
        )
        self.level = level
        self.text_column = text_column
        self.featurizer.prompts.resolve(prompt, prompt_name)  # an unknown prompt name: refused here, once
        self.vectors.encoder(self.featurizer, model)  # dimensions wider than the model's: refused here, once
        self.row_shape = self.vectors.row_shape(self.featurizer)

    def words_of(self, table) -> list[list[str]]:
        if self.text_column not in table.column_names:
            raise ValueError(
                f"the batch has no column {self.text_column!r} (columns: {', '.join(table.column_names)}); "
                "pass text_column=..."
            )
        return [t.split() if isinstance(t, str) else list(t) for t in table.column(self.text_column).to_pylist()]

    def __call__(self, table):
        """pyarrow.Table in, the same table with the vector columns appended out (a dict of numpy arrays or a pandas
        DataFrame is turned into a table first)."""
        import pyarrow as pa

        if not isinstance(table, pa.Table):
            table = pa.Table.from_pandas(table) if hasattr(table, "to_numpy") else pa.table(table)
        words = self.words_of(table)
        added = (*self.layout.columns, "cut")
        table = table.drop_columns([c for c in added if c in table.column_names])  # replaced, not doubled
        fz = self.featurizer
        fz.cut_texts = []
        rows = np.zeros((0, *self.row_shape), np.float32)
        if words:  # the rows one process writes: the output variant's
            rows, _ = self.vectors.rows(fz, [Record(w, 0) for w in words], 0)
        for name, column in self.layout.to_arrow(rows, words).items():
            table = table.append_column(name, column)
        cut = np.zeros(len(words), bool)
        cut[list(fz.cut_texts)] = True
        return table.append_column("cut", pa.array(cut))


def _actor_has_gpu() -> bool:
    try:
        import ray

        return ray.is_initialized() and bool(ray.get_gpu_ids())
    except Exception:  # outside a Ray worker
        return False


def _shard_table(first: int, records: list[Record]):
    import pyarrow as pa

    return pa.table(
        {
            "text_id": pa.array(range(first, first + len(records)), pa.int64()),
            "line": pa.array([r.line for r in records], pa.int64()),
            "text": pa.array([r.words for r in records], pa.list_(pa.string())),
        }
    )


def embed_with_ray(
    job: EmbedJob,
    *,
    address: str | None = None,
    actors: int | None = None,
    cpus_per_actor: float = 1,
    gpus_per_actor: float = 0,
    batch_size: int | None = None,
    embedder: type = RayEmbedder,
    show_progress: bool = True,
    log: Callable[[str], None] = to_stderr,
    ray_log: str | os.PathLike | None = None,
    ray_verbose: bool = False,
) -> EmbedSummary:
    """`ctxrep embed --engine ray`: the folder `embed_corpus` writes, embedded by a pool of Ray actors.

    address: a running cluster ("auto", "ray://host:10001", "host:6379"); None starts a local Ray (or uses the one
    this process already started). actors: the pool size (default: as many as the cluster's CPUs, or GPUs when
    gpus_per_actor > 0, allow). `embedder`: the map_batches class (RayEmbedder; a subclass to change what it does).
    ray_log: the file Ray's own output is appended to (default OUT/ray.log); ray_verbose: leave it on the terminal.
    batch_size: texts per actor call; None (the default): one whole shard per call, the texts one process gives the
    Featurizer in one call, so the batches, and with the same torch threads the vectors, are the same bytes
    (docs/scale.md).
    """
    local_only = job.vectors.local_only()
    if local_only is not None:  # chunks, codes, sparse vectors: RayEmbedder returns one dense float row per text
        raise ValueError(
            f"{local_only} is written by --engine local (--workers / --devices); leave it out with --engine ray"
        )
    ray = _require_ray()
    job.vectors.check_prompt(job.model)  # an unknown --prompt-name: before Ray starts
    job = choose_precision(job, "cuda" if gpus_per_actor > 0 else None, log)  # the actors' device
    # the spec the manifest records (and a resumed folder must match), from the model loaded once here; --dimensions
    # wider than the model is refused here too, in one line, not as an actor's traceback
    fz = job.featurizer("cpu", job.threads)
    spec = job.vectors.spec(fz)
    run = open_run(job, log, asked=spec)
    if isinstance(run, EmbedSummary):
        return run
    run.set_row_shape(job.vectors.row_shape(fz))  # a store's table is made (or checked) with its width here
    run.check(spec)
    log_file = None if ray_verbose else Path(ray_log) if ray_log is not None else run.out / "ray.log"
    with _ray_output_to(log_file):
        return _embed_with_ray(ray, job, run, address, actors, cpus_per_actor, gpus_per_actor, batch_size, embedder,
                               show_progress, log, log_file)  # fmt: skip


@contextlib.contextmanager
def _ray_output_to(path: Path | None):
    """Ray's own output into `path` (appended): what is written to this process's file descriptors 1 and 2 (Ray's
    core, the processes it starts, its loggers bound to the streams it found) goes to the file, while sys.stdout and
    sys.stderr (ctxrep's lines and progress) are pointed at the terminal they were. None: everything stays."""
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    streams = {1: "stdout", 2: "stderr"}
    for name in streams.values():
        getattr(sys, name).flush()
    saved = {fd: os.dup(fd) for fd in streams}
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
    swapped = {}
    for fd, name in streams.items():
        stream = getattr(sys, name)
        with contextlib.suppress(AttributeError, OSError, ValueError):  # a captured stream (no fileno) stays
            if stream.fileno() == fd:
                swapped[name] = stream
                encoding, errors = stream.encoding, stream.errors
                setattr(sys, name, open(os.dup(saved[fd]), "w", buffering=1, encoding=encoding, errors=errors))
        os.dup2(target, fd)
    os.close(target)
    try:
        yield
    finally:
        for fd, name in streams.items():
            getattr(sys, name).flush()
            if name in swapped:
                getattr(sys, name).close()
                setattr(sys, name, swapped[name])
            os.dup2(saved[fd], fd)
            os.close(saved[fd])


def _start_ray(ray, address: str | None, quiet: bool) -> None:
    """Start a local Ray, or join the cluster at `address`, unless Ray is up already; a cluster that cannot be
    joined is one ValueError line. `quiet`: Ray's own output goes to its log, not the terminal."""
    if not ray.is_initialized():
        settings = {}  # --ray-verbose: Ray's own defaults (its workers' output and INFO lines on the terminal)
        if quiet:
            os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "error")  # Ray's C++ warnings (retries, auth)
            settings = {"log_to_driver": False, "logging_level": logging.ERROR}
        if address is None:  # a local Ray for this run only
            ray.init(include_dashboard=False, **settings)
        else:
            why = unreachable(address)
            if why:
                raise ValueError(
                    f"cannot reach the Ray cluster at {address}: {why}; start one with `ray start --head` "
                    "or check --ray-address"
                )
            try:
                ray.init(address=address, **settings)
            except (ConnectionError, RuntimeError) as e:
                cause = e.__cause__ or e
                hint = ""
                if "auth" in str(cause).lower():
                    hint = (
                        " (the cluster wants Ray's token: set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN, or run on a node"
                    )
                    hint += " of the cluster with --ray-address auto)"
                first = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
                raise ValueError(
                    f"cannot join the Ray cluster at {address}: {first}{hint}; start one with `ray start --head` "
                    "or check --ray-address"
                ) from None


def _actor_count(ray, actors: int | None, cpus_per_actor: float, gpus_per_actor: float) -> int:
    """`actors`, or as many as the cluster's GPUs (or CPUs) hold."""
    if actors is None:
        resources = ray.cluster_resources()
        if gpus_per_actor > 0:
            actors = max(1, int(resources.get("GPU", 0) // gpus_per_actor))
        else:
            actors = max(1, int(resources.get("CPU", 1) // cpus_per_actor))
    return actors


def _actor_options(job, cpus_per_actor: float) -> dict:
    """The keyword arguments each Ray actor's embedder is built with (map_batches' fn_constructor_kwargs)."""
    threads = job.threads or max(1, int(cpus_per_actor))
    options = {
        "model": job.model,
        "level": job.vectors.level,
        "text_column": "text",
        **job.vectors.featurizer_options(),
        "batch_tokens": job.batch_tokens,
        "threads": threads,
        "precision": "int8" if job.quantize == "int8" else job.precision,
        "backend": job.backend,
        "compile": job.compile,
        **job.vectors.embed_options(),
    }
    if job.device is not None:
        options["device"] = job.device
    return options


def _embed_with_ray(
    ray, job, run, address, actors, cpus_per_actor, gpus_per_actor, batch_size, embedder, show_progress, log, log_file
) -> EmbedSummary:
    """embed_with_ray once its checks are done (Ray's output in `log_file`, or None: on the terminal)."""
    quiet = log_file is not None
    _start_ray(ray, address, quiet)
    if log_file is not None:  # said once Ray is up: a cluster that cannot be joined is the one line
        log(f"Ray's own output: {log_file}")
    actors = _actor_count(ray, actors, cpus_per_actor, gpus_per_actor)
    options = _actor_options(job, cpus_per_actor)

    # The driver reads the input lazily and cuts the shards one process would write (the shards done already are
    # skipped); SHARDS_PER_RUN of them at a time go through the actor pool, so the driver never holds the corpus.
    from ray.data import DataContext

    context = DataContext.get_current()
    context.execution_options.preserve_order = True  # rows come back in input order
    if quiet:  # Ray Data's progress bars (or their log lines) would be drawn beside ctxrep's own
        context.enable_progress_bars = False
    run.say_resuming()
    bar, stream, records = open_records(job, show_progress, log, done=run.texts_done, desc="embed (ray)")
    run.bar = bar  # counts the texts of each shard recorded

    def embed_group(group: list[tuple[int, int, list[Record]]]) -> None:
        expected = {k: (first, len(records)) for k, first, records in group}  # shard -> (first text, texts)
        by_shard = {k: records for k, _, records in group}
        texts = sum(n for _, n in expected.values())
        log(
            f"embedding {texts:,} texts in {len(group)} shards with {actors} Ray actors "
            f"({cpus_per_actor} CPU{f', {gpus_per_actor} GPU' if gpus_per_actor else ''} each)"
        )
        ds = ray.data.from_arrow([_shard_table(first, records) for _, first, records in group]).map_batches(
            embedder,
            fn_constructor_kwargs=options,
            batch_format="pyarrow",
            batch_size=batch_size,
            compute=ray.data.ActorPoolStrategy(size=actors),
            num_cpus=cpus_per_actor,
            num_gpus=gpus_per_actor or None,
        )
        for k, rows in _shards_back(ds.iter_batches(batch_format="pyarrow", batch_size=None), expected):
            vectors, index, row_shape, cut = _shard_arrays(rows, ARROW_LAYOUTS[job.vectors.level])
            if not run.writes_in_workers:  # a store: the run writes the rows, in order
                run.write_rows(k, vectors, index, by_shard[k], expected[k][0], cut)
                continue
            entry = write_arrays(vectors, index, k, expected[k][1], job.out.storage, run.out)
            run.record(k, with_cut(entry, cut, by_shard[k], expected[k][0]), row_shape)

    try:
        group = []
        for k, first, shard_records in shards_of(records, job.out.shard_size):
            run.seen = k + 1
            if k in run.done:
                continue
            group.append((k, first, shard_records))
            if len(group) == SHARDS_PER_RUN:
                embed_group(group)
                group = []
        if group:
            embed_group(group)
    except BaseException:
        bar.disable = True
        if hasattr(run, "abort"):  # a store run: its writer thread stops, what is written stays
            run.abort()
        raise
    finally:
        bar.close()
        if stream is not None:
            stream.close()
    return run.finish()


def _shards_back(batches: Iterator, expected: dict[int, tuple[int, int]]) -> Iterator[tuple[int, list]]:
    """Regroup the embedded rows (in input order) into the shards they came from; every text exactly once."""
    import pyarrow as pa

    order = sorted(expected)
    pending: list = []
    have = 0
    position = 0  # index into order
    for batch in batches:
        if batch.num_rows == 0:
            continue
        start = 0
        while start < batch.num_rows:
            if position >= len(order):
                raise RuntimeError("Ray returned more rows than the input holds: a batch came back twice")
            k = order[position]
            first, texts = expected[k]
            take = min(texts - have, batch.num_rows - start)
            piece = batch.slice(start, take)
            ids = piece.column("text_id").to_numpy()
            if not np.array_equal(ids, np.arange(first + have, first + have + take)):
                raise RuntimeError(
                    f"shard {k}: texts came back out of order or twice (got {ids[:5].tolist()}..., expected from "
                    f"{first + have}); nothing of this shard was written"
                )
            pending.append(piece)
            have += take
            start += take
            if have == texts:
                yield k, pa.concat_tables(pending).to_batches()
                pending, have, position = [], 0, position + 1
    if position != len(order):
        raise RuntimeError(f"Ray returned {position} of {len(order)} shards: texts were lost; run the command again")


def _shard_arrays(batches: list, layout: ArrowLayout) -> tuple[np.ndarray, list[tuple], tuple[int, ...], list[int]]:
    """A shard's vectors, index entries, row shape and cut texts (numbers) from the Arrow rows RayEmbedder
    returned (in `layout`)."""
    import pyarrow as pa

    table = pa.Table.from_batches(batches)
    text_ids = table.column("text_id").to_pylist()
    lines = table.column("line").to_pylist()
    cut = []
    if "cut" in table.column_names:  # an embedder subclass may leave it out
        cut = [t for t, c in zip(text_ids, table.column("cut").to_pylist()) if c]
    vectors, index, row_shape = layout.from_arrow(table, text_ids, lines)
    return vectors, index, row_shape, cut


def _sentence_columns(rows: np.ndarray, words: list[list[str]]) -> dict:
    return {"vector": _fixed_lists(rows)}


def _sentence_rows(table, text_ids: list[int], lines: list[int]) -> tuple[np.ndarray, list[tuple], tuple[int, ...]]:
    column = table.column("vector").combine_chunks()
    row_shape = _nested_shape(column.type)
    return arrow_to_numpy(column, row_shape), [(t, line, -1, "") for t, line in zip(text_ids, lines)], row_shape


def _word_columns(rows: np.ndarray, words: list[list[str]]) -> dict:
    import pyarrow as pa

    offsets = pa.array(np.concatenate([[0], np.cumsum([len(w) for w in words])]).astype(np.int32))
    return {
        "words": pa.array(words, type=pa.list_(pa.string())),
        "vectors": pa.ListArray.from_arrays(offsets, _fixed_lists(rows)),
    }


def _word_rows(table, text_ids: list[int], lines: list[int]) -> tuple[np.ndarray, list[tuple], tuple[int, ...]]:
    column = table.column("vectors").combine_chunks()
    row_shape = _nested_shape(column.type.value_type)
    words = table.column("words").to_pylist()
    index = [(t, line, w, word) for t, line, ws in zip(text_ids, lines, words) for w, word in enumerate(ws)]
    return arrow_to_numpy(column.flatten(), row_shape), index, row_shape


@dataclass(frozen=True)
class ArrowLayout:
    """How RayEmbedder hands one kind of rows back to the driver: the columns it adds (`to_arrow`: the output
    variant's rows and the batch's words -> columns) and how the driver reads them (`from_arrow`: table, text
    numbers, lines -> vectors, index entries, row shape)."""

    columns: tuple[str, ...]
    to_arrow: Callable[[np.ndarray, list[list[str]]], dict]
    from_arrow: Callable[[Any, list[int], list[int]], tuple[np.ndarray, list[tuple], tuple[int, ...]]]


# RayEmbedder's `level`: the layout of its columns (the module docstring); the output variants it writes
ARROW_LAYOUTS = {
    SentenceVectors.level: ArrowLayout(("vector",), _sentence_columns, _sentence_rows),
    WordVectors.level: ArrowLayout(("words", "vectors"), _word_columns, _word_rows),
}


def _nested_shape(arrow_type) -> tuple[int, ...]:
    import pyarrow as pa

    shape = []
    while pa.types.is_fixed_size_list(arrow_type):
        shape.append(arrow_type.list_size)
        arrow_type = arrow_type.value_type
    return tuple(shape)


__all__ = ["RayEmbedder", "embed_with_ray", "arrow_to_numpy"]
